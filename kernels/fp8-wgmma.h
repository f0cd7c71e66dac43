/*
 * fp8-wgmma.h - fp8-gemm.h's W8A8 product (dg_cuda_fp8_gemm_config's
 * arguments but the configuration) on Hopper's warpgroup products
 * (fp8-wgmma.cu), fp8-gemm.cu's configuration 6.  rows_hint picks the rows
 * a pass (32, 64 or 128).  Errors: DG_E_INVAL (shapes, or a device it does
 * not fit), DG_E_CUDA.
 */
#ifndef DG_KERNELS_FP8_WGMMA_H
#define DG_KERNELS_FP8_WGMMA_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether device dev runs the kernel (compute capability 9.0) and [N, K]
 * weights fit it (N a multiple of 64, K of 16). */
int dg_cuda_fp8_wgmma_fits(int dev, int64_t N, int64_t K);

int dg_cuda_fp8_wgmma(void *Y, int y_f32, int accumulate, const uint8_t *qa, const float *sa,
                      const uint8_t *qw, const float *sw, const int32_t *offsets,
                      const int32_t *counts, int groups, int64_t rows, int64_t N, int64_t K,
                      int rows_hint, dg_stream_t stream, int dev, struct dg_error *err);

/* Both of the FP8 experts' products in one launch, as
 * dg_cuda_experts_wgmma (moe-wgmma.h) for bf16: gu = the product of q
 * (with qs) and W_gu (with S_gu; [2I, H] a group), bf16 rows of 2I; each
 * group's hidden rows gelu_tanh(gate) * up quantized into q2 (rows of I
 * bytes) and qs2; ys = the product of q2 and W_down (with S_down; [H, I]
 * a group), rows of H, fp32 where ys_f32 else bf16.  The bytes of
 * dg_cuda_fp8_wgmma into gu, dg_cuda_fp8_quantize_rows_at with gelu over
 * the groups' rows, and dg_cuda_fp8_wgmma into ys (of ys's type).  An
 * expert's down tiles start once its hidden rows are quantized.
 * rows_hint (the mean rows a group) picks the rows a pass and how many
 * blocks share a weight tile's passes (as many as the fullest group under
 * even routing needs; the same bytes whatever it is).  sync:
 * 1 + 2 groups int32 in device memory, all zero when the launch starts
 * (the routing kernel zeroes them), left nonzero.  Fits where both
 * products fit dg_cuda_fp8_wgmma_fits, I and H multiples of 64, I at most
 * 1,024. */
int dg_cuda_fp8_experts_wgmma_fits(int dev, int64_t I, int64_t H);

int dg_cuda_fp8_experts_wgmma(void *gu, uint8_t *q2, float *qs2, void *ys, int ys_f32,
                              const uint8_t *q, const float *qs, const uint8_t *W_gu,
                              const float *S_gu, const uint8_t *W_down, const float *S_down,
                              const int32_t *offsets, const int32_t *counts, int32_t *sync,
                              int groups, int64_t I, int64_t H, int rows_hint,
                              dg_stream_t stream, int dev, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
