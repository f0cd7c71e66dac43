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

#ifdef __cplusplus
}
#endif

#endif
