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

#ifdef __cplusplus
}
#endif

#endif
