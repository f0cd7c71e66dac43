/*
 * fp8-lt.h - the single-group W8A8 product through cuBLASLt's FP8 matmul,
 * which runs on Hopper's FP8 tensor-core path (wgmma) that fp8-gemm.cu's
 * mma.sync kernel does not reach.  The weights carry an fp32 scale per
 * output row and the activations one per token:
 *
 *   Y[t, n] (+)= sa[t] * sw[n] * sum_k qa[t, k] * qw[n, k]
 *
 * the same product as dg_cuda_fp8_gemm_acc with one group (fp8-gemm.h),
 * accumulated in fp32 and rounded once to Y's type.  cuBLASLt applies the
 * scales itself where it offers its "outer vector" scale modes; else the
 * product goes through FP8 with unit scales into an fp32 scratch and a
 * scaling pass (fp8-lt.cu).  Where cuBLASLt offers neither for a shape,
 * the call says DG_E_UNSUPPORTED and the caller uses fp8-gemm.cu's kernel.
 */
#ifndef DG_FP8_LT_H
#define DG_FP8_LT_H

#include <stdint.h>

#include "kernels/devmem.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dg_fp8_lt;

/* flags for dg_fp8_lt_create: never the outer-vector modes (to test the
 * unit-scale way where both exist) */
#define DG_FP8_LT_UNIT_SCALES 1u

/* A cuBLASLt handle on GPU dev issuing on stream, with a workspace and a
 * 64 MB scratch of its own (no call allocates, so calls can be captured
 * in CUDA graphs).  Errors: DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS. */
int dg_fp8_lt_create(int dev, dg_stream_t stream, unsigned flags, struct dg_fp8_lt **out,
                     struct dg_error *err);
void dg_fp8_lt_destroy(struct dg_fp8_lt *lt);

/* Y [T, N] (row-major, fp32 when y_f32 else bf16) = or += (accumulate) the
 * product above; qa [T, K] and qw [N, K] E4M3 bytes (row-major, 16-byte
 * aligned), sa [T] and sw [N] fp32, all on the device.  K must be a
 * multiple of 16 and N of 8.  The first call for a shape picks cuBLASLt's
 * algorithm and keeps it (a few dozen shapes are kept; a replaced one is
 * picked again when it comes back).  Errors: DG_E_INVAL (shapes),
 * DG_E_UNSUPPORTED (no algorithm: use dg_cuda_fp8_gemm_acc), DG_E_CUBLAS. */
int dg_fp8_lt_gemm(struct dg_fp8_lt *lt, void *y, int y_f32, int accumulate, const uint8_t *qa,
                   const float *sa, const uint8_t *qw, const float *sw, int64_t T, int64_t N,
                   int64_t K, struct dg_error *err);

/* The unit-scale product alone, S [T, N] fp32 = qa qw^T (the sums
 * dg_fp8_lt_gemm scales), for a caller that applies the scales itself as
 * its scaling pass does: Y[t, n] = round(S[t, n] * sa[t] * sw[n]), the
 * products in that order.  *S is the handle's scratch (row-major, rows of
 * N), valid until the next call on lt.  Only where cuBLASLt has a
 * unit-scale algorithm for the shape whose T rows fit the scratch in one
 * chunk (whatever way dg_fp8_lt_gemm takes for it); else DG_E_UNSUPPORTED
 * with nothing queued (then dg_fp8_lt_gemm).  Errors: DG_E_INVAL (shapes,
 * T at least 1), DG_E_UNSUPPORTED, DG_E_CUBLAS. */
int dg_fp8_lt_product(struct dg_fp8_lt *lt, const uint8_t *qa, const uint8_t *qw, int64_t T,
                      int64_t N, int64_t K, const float **S, struct dg_error *err);

/* The scaling pass's values of such sums on their own: y [T, N] bf16
 * (packed) = bf16(S[t ld + n] * sa[t] * sw[n]), the products in that
 * order, on stream (for a pass that reads S where its shape does not let
 * it scale S itself).  T at most 65,535.  Errors: DG_E_INVAL, DG_E_CUDA. */
int dg_fp8_lt_scale_rows(void *y, const float *S, int64_t ld, const float *sa, const float *sw,
                         int64_t T, int64_t N, dg_stream_t stream, int dev,
                         struct dg_error *err);

/* How the shape's calls go: "outer-vector scales", "unit scales and a
 * scaling pass", "none" (DG_E_UNSUPPORTED) or "not tried" (no call yet, or
 * its plan was replaced).  A static string. */
const char *dg_fp8_lt_mode(struct dg_fp8_lt *lt, int64_t T, int64_t N, int64_t K, int y_f32,
                           int accumulate);

#ifdef __cplusplus
}
#endif

#endif
