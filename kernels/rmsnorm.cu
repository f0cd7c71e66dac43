/* rmsnorm.cu - RMSNorm and RMSNorm + residual add (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

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
 * With fp32 elements (T = float) the same arithmetic, without the rounding.
 * The row is read twice (the second read hits L1/L2 for rows of a few KiB). */
template <bool ADD, typename T>
__global__ static void rmsnorm_kernel(T *y, const T *x, const T *w, int dim, float eps,
                                      float scale)
{
    __shared__ float shared[32];
    const T *xr = x + (int64_t)blockIdx.x * dim;
    T *yr = y + (int64_t)blockIdx.x * dim;
    float ss = 0.0f, r;

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = dg_ld(xr + i);
        ss += v * v;
    }
    r = rsqrtf(block_sum(ss, shared) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = dg_ld(xr + i) * r;
        if (w)
            v *= dg_ld(w + i);
        if (ADD)
            v = dg_ld(yr + i) + v * scale;
        dg_st(yr + i, v);
    }
}

/* The same, one warp per row and eight elements a load (dim a multiple
 * of 8, rows aligned: dg_rows_by8); rows per block of 128 threads: 4.  The
 * sum of squares is the warp's, in another order than the block's, so
 * fp32 elements (the path held to the CPU's results) keep the block
 * kernel. */
template <bool ADD, typename T>
__global__ static void rmsnorm_warp_kernel(T *y, const T *x, const T *w, int64_t rows, int dim,
                                           float eps, float scale)
{
    const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const T *xr = x + row * dim;
    T *yr = y + row * dim;
    float ss = 0.0f, r;
    if (row >= rows)
        return;
    for (int i = lane * 8; i < dim; i += 256) {
        float v[8];
        dg_ld8(xr + i, v);
        for (int u = 0; u < 8; u++)
            ss += v[u] * v[u];
    }
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    r = rsqrtf(ss / (float)dim + eps);
    for (int i = lane * 8; i < dim; i += 256) {
        float v[8], wv[8], yv[8];
        dg_ld8(xr + i, v);
        if (w)
            dg_ld8(w + i, wv);
        if (ADD)
            dg_ld8(yr + i, yv);
        for (int u = 0; u < 8; u++) {
            v[u] *= r;
            if (w)
                v[u] *= wv[u];
            if (ADD)
                v[u] = yv[u] + v[u] * scale;
        }
        dg_st8(yr + i, v);
    }
}

template <bool ADD>
static void rmsnorm_launch(enum dg_elt e, void *y, const void *x, const void *w, int64_t rows,
                           int dim, float eps, float scale, dg_stream_t stream)
{
    const unsigned wblocks = (unsigned)((rows + 3) / 4);
    if (e == DG_ELT_BF16 && dg_rows_by8(dim, 2, y, x, w)) {
        rmsnorm_warp_kernel<ADD, __nv_bfloat16><<<wblocks, 128, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, rows, dim,
            eps, scale);
        return;
    }
    if (e == DG_ELT_F32)
        rmsnorm_kernel<ADD, float><<<(unsigned)rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(
            (float *)y, (const float *)x, (const float *)w, dim, eps, scale);
    else
        rmsnorm_kernel<ADD, __nv_bfloat16>
            <<<(unsigned)rows, NORM_THREADS, 0, (cudaStream_t)stream>>>(
                (__nv_bfloat16 *)y, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, dim,
                eps, scale);
}

extern "C" int dg_cuda_rmsnorm_e(enum dg_elt e, void *y, const void *x, const void *w,
                                 int64_t rows, int dim, float eps, dg_stream_t stream, int dev,
                                 struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm: element type %d", dev, (int)e);
    if (rows <= 0)
        return 0;
    if (dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm: %lld rows of %d", dev,
                            (long long)rows, dim);
    rmsnorm_launch<false>(e, y, x, w, rows, dim, eps, 1.0f, stream);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_rmsnorm(uint16_t *y, const uint16_t *x, const uint16_t *w, int64_t rows,
                               int dim, float eps, dg_stream_t stream, int dev,
                               struct dg_error *err)
{
    return dg_cuda_rmsnorm_e(DG_ELT_BF16, y, x, w, rows, dim, eps, stream, dev, err);
}

extern "C" int dg_cuda_rmsnorm_add_e(enum dg_elt e, void *resid, const void *x, const void *w,
                                     int64_t rows, int dim, float eps, float scale,
                                     dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add: element type %d", dev,
                            (int)e);
    if (rows <= 0)
        return 0;
    if (dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add: %lld rows of %d", dev,
                            (long long)rows, dim);
    rmsnorm_launch<true>(e, resid, x, w, rows, dim, eps, scale, stream);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_rmsnorm_add(uint16_t *resid, const uint16_t *x, const uint16_t *w,
                                   int64_t rows, int dim, float eps, float scale,
                                   dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_rmsnorm_add_e(DG_ELT_BF16, resid, x, w, rows, dim, eps, scale, stream, dev,
                                 err);
}
