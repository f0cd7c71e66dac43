/*
 * moe-wgmma.h - the experts' grouped GEMM on Hopper's warpgroup products
 * (moe-wgmma.cu): dg_cuda_grouped_gemm's function (gated = 0; Y rows of
 * N) or dg_cuda_grouped_gemm_gelu's (gated = 1: W_j = [gate_j; up_j], N =
 * 2I, Y rows of I), which moe-gemm.cu's calls take where it fits, and
 * its configuration 6.  rows_hint picks the rows a pass (32, 64 or 128).
 * Errors: DG_E_INVAL (shapes, or a device it does not fit), DG_E_CUDA.
 */
#ifndef DG_KERNELS_MOE_WGMMA_H
#define DG_KERNELS_MOE_WGMMA_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether device dev runs the kernel (compute capability 9.0: wgmma is
 * sm_90a's) and [N, K] weights fit it (N a multiple of 128, K of 64). */
int dg_cuda_grouped_wgmma_fits(int dev, int64_t N, int64_t K);

int dg_cuda_grouped_wgmma(void *Y, int y_f32, int gated, const void *X, const void *W,
                          const int32_t *offsets, const int32_t *counts, int groups, int64_t N,
                          int64_t K, int rows_hint, dg_stream_t stream, int dev,
                          struct dg_error *err);

/* Both of the experts' products in one launch: hh = the gated product
 * of xs and W_gu ([2I, H] a group: dg_cuda_grouped_wgmma's gated = 1, bf16
 * hh rows of I), then ys = hh W_down^T (rows of H, fp32 where ys_f32 else
 * bf16; [H, I] a group), the same bits as those two calls.  An expert's
 * down tiles start as soon as its own gated tiles are stored, so the first
 * product's last wave shares the GPU with the second's first.  sync: 1 +
 * groups int32 in device memory, all zero when the launch starts (the
 * routing kernel zeroes them: dg_cuda_moe_route_e's view names them), left
 * nonzero.  rows_hint (the mean rows a group) picks the rows a pass and
 * how many blocks share a weight tile's passes (lib/moe-plan.h's
 * dg_moe_plan_split; the same bits whatever it is).
 * active: NULL, or a word in device memory read as the launch runs: 0 and
 * every block returns at once (nothing written, sync untouched; the routing
 * sets such a word when it leaves the launch no rows).
 * Fits where both products fit dg_cuda_grouped_wgmma_fits. */
int dg_cuda_experts_wgmma_fits(int dev, int64_t I, int64_t H);

int dg_cuda_experts_wgmma(void *hh, void *ys, int ys_f32, const void *xs, const void *W_gu,
                          const void *W_down, const int32_t *offsets, const int32_t *counts,
                          int32_t *sync, const int32_t *active, int groups, int64_t I, int64_t H,
                          int rows_hint, dg_stream_t stream, int dev, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
