/* rmsnorm.cu - RMSNorm and RMSNorm + residual add (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"

#define NORM_THREADS 256

/* Sum of v over the block (every thread gets it).  shared: 32 floats. */
__device__ static float block_sum(float v, float *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* (shared may be reused by the caller) */
    return v;
}

/* One block per row.  r = (sum_i x_i^2 / dim + eps)^(-1/2) in fp32; then
 *   plain:  y_i = bf16(x_i * r * w_i)
 *   add:    resid_i = bf16(resid_i + x_i * r * w_i * scale)
 * The row is read twice (the second read hits L1/L2 for rows of a few KiB). */
template <bool ADD>
__global__ static void rmsnorm_kernel(__nv_bfloat16 *y, const __nv_bfloat16 *x,
                                      const __nv_bfloat16 *w, int dim, float eps, float scale)
{
    __shared__ float shared[32];
    const __nv_bfloat16 *xr = x + (int64_t)blockIdx.x * dim;
    __nv_bfloat16 *yr = y + (int64_t)blockIdx.x * dim;
    float ss = 0.0f, r;

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    r = rsqrtf(block_sum(ss, shared) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = __bfloat162float(xr[i]) * r;
        if (w)
            v *= __bfloat162float(w[i]);
        if (ADD)
            v = __bfloat162float(yr[i]) + v * scale;
        yr[i] = __float2bfloat16(v);
    }
}

extern "C" int dg_cuda_rmsnorm(uint16_t *y, const uint16_t *x, const uint16_t *w, int64_t rows,
                               int dim, float eps, dg_stream_t stream, int dev,
                               struct dg_error *err)
{
    int rc = 0;
    if (rows <= 0)
        return 0;
    if (dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm: %lld rows of %d", dev,
                            (long long)rows, dim);
    rmsnorm_kernel<false><<<(unsigned)rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, dim, eps, 1.0f);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_rmsnorm_add(uint16_t *resid, const uint16_t *x, const uint16_t *w,
                                   int64_t rows, int dim, float eps, float scale,
                                   dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (rows <= 0)
        return 0;
    if (dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add: %lld rows of %d", dev,
                            (long long)rows, dim);
    rmsnorm_kernel<true><<<(unsigned)rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)resid, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, dim, eps,
        scale);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
