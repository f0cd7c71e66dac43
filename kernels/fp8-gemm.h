/*
 * fp8-gemm.h - W8A8 on the tensor cores: activations quantized per row
 * (token) to E4M3, and the product of E4M3 rows with E4M3 weights that
 * carry a scale per output channel, fp32 accumulation (lib/fp8.h says the
 * format and the quantization; lib/ref-fp8.c holds the references).  The
 * product takes groups of rows as the experts' grouped GEMM does
 * (moe-gemm.h): group j's rows against weights j; or one group of all
 * rows (a projection).
 */
#ifndef DG_KERNELS_FP8_GEMM_H
#define DG_KERNELS_FP8_GEMM_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For r < rows: scale[r] = max|x[r, :]| / 448 (1 for zeros, NaN with a
 * NaN), q[r, k] = e4m3(x[r, k] / scale[r]) (nearest even, saturating);
 * x of type e, rows of cols packed, q rows of cols bytes.  The same bytes
 * and scales as dg_fp8_quantize_rows.  Errors: DG_E_INVAL, DG_E_CUDA. */
int dg_cuda_fp8_quantize_rows(enum dg_elt e, uint8_t *q, float *scale, const void *x,
                              int64_t rows, int cols, dg_stream_t stream, int dev,
                              struct dg_error *err);

/* The same for the rows rows_at[0 .. n) of x only (negative entries
 * skipped), each into q and scale at its own row index; with gelu, x's
 * rows are [gate | up] (2 cols elements) and the values quantized are
 * gelu_tanh(gate) * up rounded to e, the bytes that dg_cuda_gelu_mul_e
 * and dg_cuda_fp8_quantize_rows give.  Errors: DG_E_INVAL; DG_E_UNSUPPORTED
 * where cols is not a multiple of 8 up to 8,192 or x is not 16-byte
 * aligned (nothing queued); DG_E_CUDA. */
int dg_cuda_fp8_quantize_rows_at(enum dg_elt e, uint8_t *q, float *scale, const void *x,
                                 const int32_t *rows_at, int64_t n, int cols, int gelu,
                                 dg_stream_t stream, int dev, struct dg_error *err);

/* The experts' picks quantized straight from their tokens' rows: for p <
 * picks with slot_of[p] >= 0, row slot_of[p] of q and scale from x's row
 * p / K (the bytes and scale dg_cuda_fp8_quantize_rows gives that row),
 * so no gathered copy of the rows is needed; each token's row is
 * quantized once for its K picks (picks a multiple of K, else
 * DG_E_INVAL).  Errors and fit: as dg_cuda_fp8_quantize_rows_at. */
int dg_cuda_fp8_quantize_picks(enum dg_elt e, uint8_t *q, float *scale, const void *x,
                               const int32_t *slot_of, int64_t picks, int K, int cols,
                               dg_stream_t stream, int dev, struct dg_error *err);

/* Whether dg_cuda_fp8_quantize_rows_at (and _picks) takes rows of cols
 * columns from x into q. */
int dg_cuda_fp8_quantize_rows_at_fits(int cols, const void *x, const void *q);

/* Whether [N, K] weights have a kernel: N a multiple of 64, K of 16. */
int dg_cuda_fp8_gemm_fits(int64_t N, int64_t K);

/* Y[r, n] = sa[r] * sw_j[n] * sum_k qa[r, k] * qw_j[n, k] for group j's
 * rows r (device offsets and counts, groups of them), qw_j = qw + j N K
 * bytes, sw_j = sw + j N; with offsets and counts NULL, one group of rows
 * 0 .. rows-1.  qa rows of K bytes, Y rows of N, fp32 when y_f32 else
 * bf16; rows outside every group are not written.  rows_hint, the rows a
 * group is expected to have, picks the rows per pass (32, 64 or 128).
 * Errors: DG_E_INVAL (shapes that do not fit), DG_E_CUDA. */
int dg_cuda_fp8_gemm(void *Y, int y_f32, const uint8_t *qa, const float *sa, const uint8_t *qw,
                     const float *sw, const int32_t *offsets, const int32_t *counts, int groups,
                     int64_t rows, int64_t N, int64_t K, int rows_hint, dg_stream_t stream,
                     int dev, struct dg_error *err);

/* The same, adding the product to Y when accumulate (Y = Y + product,
 * rounded once to Y's type): the residual add of a projection. */
int dg_cuda_fp8_gemm_acc(void *Y, int y_f32, int accumulate, const uint8_t *qa, const float *sa,
                         const uint8_t *qw, const float *sw, const int32_t *offsets,
                         const int32_t *counts, int groups, int64_t rows, int64_t N, int64_t K,
                         int rows_hint, dg_stream_t stream, int dev, struct dg_error *err);

/* The kernel's configurations (K step and pipeline depth), for the
 * benchmark that compares them (bench/gpu/bench-moe-gemm.c) and the tests
 * that check each: how many there are, and configuration i's name (NULL
 * past the last). */
int dg_cuda_fp8_gemm_configs(void);
const char *dg_cuda_fp8_gemm_config_name(int config);

/* Whether configuration config adds its products in fp32 as the mma.sync
 * kernels do (within the own kernels' bound of the oracle, and equal to
 * configuration 0's outputs); the wgmma configuration (fp8-wgmma.h) sums
 * in Hopper's FP8 accumulator between its fp32 additions. */
int dg_cuda_fp8_gemm_config_exact(int config);

/* The mma.sync configuration for groups of about rows_hint rows and K
 * bytes a row: 1 (K steps of 128 bytes) for at most 16 rows and K of
 * 2,048 or more, where the weight stream sets the time and fewer, longer
 * steps keep more bytes in flight; 0 otherwise (measured: fp8-gemm.cu). */
int dg_cuda_fp8_gemm_default_config(int rows_hint, int64_t K);

/* The configuration dg_cuda_fp8_gemm and dg_cuda_fp8_gemm_acc use on
 * device dev for [N, K] weights: 6, Hopper's warpgroup products
 * (fp8-wgmma.h), where they fit; else dg_cuda_fp8_gemm_default_config's. */
int dg_cuda_fp8_gemm_pick(int dev, int rows_hint, int64_t N, int64_t K);

/* dg_cuda_fp8_gemm_acc with configuration config.  Errors: as that, and
 * DG_E_INVAL for a configuration that does not exist. */
int dg_cuda_fp8_gemm_config(int config, void *Y, int y_f32, int accumulate, const uint8_t *qa,
                            const float *sa, const uint8_t *qw, const float *sw,
                            const int32_t *offsets, const int32_t *counts, int groups,
                            int64_t rows, int64_t N, int64_t K, int rows_hint,
                            dg_stream_t stream, int dev, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
