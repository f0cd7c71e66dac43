/*
 * moe-gemm.h - a grouped GEMM for the experts (moe.cu's two products when
 * an expert's rows are few): per group j, the rows offsets[j] ..
 * offsets[j] + counts[j] - 1 of X times W_j^T, each weight read once per
 * pass of up to 128 rows.  bf16 X and W, fp32 accumulate, Y bf16 or fp32.
 * Counts and offsets are read on the device, so a captured launch serves
 * any routing.
 */
#ifndef DG_KERNELS_MOE_GEMM_H
#define DG_KERNELS_MOE_GEMM_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether [N, K] weights have a kernel: N a multiple of 128, K of 64. */
int dg_cuda_grouped_gemm_fits(int64_t N, int64_t K);

/* For j < groups: Y[r, :] = X[r, :] W_j^T for the group's rows r (device
 * offsets, counts), W_j = W + j N K elements ([N, K] row-major); X rows
 * of K, Y rows of N (fp32 when y_f32, else bf16).  rows_hint, the rows a
 * group is expected to have, picks the rows per pass (64 or 128).
 * Errors: DG_E_INVAL (shapes that do not fit), DG_E_CUDA. */
int dg_cuda_grouped_gemm(void *Y, int y_f32, const void *X, const void *W, const int32_t *offsets,
                         const int32_t *counts, int groups, int64_t N, int64_t K, int rows_hint,
                         dg_stream_t stream, int dev, struct dg_error *err);

/* Whether gated weights [2I, K] have the gated kernel: I a multiple of 32,
 * K of 64. */
int dg_cuda_grouped_gemm_gelu_fits(int64_t I, int64_t K);

/* The gated MLP's first product and middle in one pass, for j < groups:
 *   Y[r, i] = gelu_tanh(g) u,  g = X[r, :] gate_j[i, :]^T, u = X[r, :] up_j[i, :]^T
 * for the group's rows r and i < I, W_j = W + j 2I K elements ([2I, K]:
 * the I gate rows, then the I up rows), g and u rounded as Y's type holds
 * them first (so Y has the bits dg_cuda_grouped_gemm into [gate | up]
 * followed by dg_cuda_gelu_mul_e gives), gelu in fp32; X rows of K, Y rows
 * of I (fp32 when y_f32, else bf16).  rows_hint: as dg_cuda_grouped_gemm.
 * The weights are read once per pass, and the [rows, 2I] intermediate is
 * never written.  Errors: DG_E_INVAL (shapes that do not fit), DG_E_CUDA. */
int dg_cuda_grouped_gemm_gelu(void *Y, int y_f32, const void *X, const void *W,
                              const int32_t *offsets, const int32_t *counts, int groups,
                              int64_t I, int64_t K, int rows_hint, dg_stream_t stream, int dev,
                              struct dg_error *err);

/* The kernel's configurations (K step, pipeline depth, warp grid), for the
 * benchmark that compares them (bench/gpu/bench-moe-gemm.c) and the test
 * that checks each: how many there are, and configuration i's name (NULL
 * past the last).  dg_cuda_grouped_gemm uses configuration 6, Hopper's
 * warpgroup products (moe-wgmma.h), where the device and shape fit it,
 * else configuration 4, the 2 x 2 warps (where a pass has 4 m-tiles or
 * more; configuration 0 below that); dg_cuda_grouped_gemm_gelu likewise
 * (wgmma where [2I, K] fits it), so the two forms take the same kernel
 * and keep their bits alike.  Configuration 0 is the one the others are
 * compared with, bit for bit where they add in its order
 * (dg_cuda_grouped_gemm_config_exact). */
int dg_cuda_grouped_gemm_configs(void);
const char *dg_cuda_grouped_gemm_config_name(int config);

/* Whether configuration config adds the same products in the same order
 * as configuration 0 (its outputs equal to the bit); the wgmma
 * configuration (moe-wgmma.h) does not. */
int dg_cuda_grouped_gemm_config_exact(int config);

/* dg_cuda_grouped_gemm with configuration config.  Errors: as that, and
 * DG_E_INVAL for a configuration that does not exist. */
int dg_cuda_grouped_gemm_config(int config, void *Y, int y_f32, const void *X, const void *W,
                                const int32_t *offsets, const int32_t *counts, int groups,
                                int64_t N, int64_t K, int rows_hint, dg_stream_t stream, int dev,
                                struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
