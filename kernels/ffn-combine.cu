/* ffn-combine.cu - the end of a layer's feed-forward block (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

#define COMBINE_THREADS 256

/* Sums of a and b over the block (every thread gets both).  shared: 64
 * floats. */
__device__ static float2 block_sum2(float a, float b, float *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (lane == 0) {
        shared[warp] = a;
        shared[32 + warp] = b;
    }
    __syncthreads();
    a = lane < (int)(blockDim.x >> 5) ? shared[lane] : 0.0f;
    b = lane < (int)(blockDim.x >> 5) ? shared[32 + lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    __syncthreads(); /* (shared may be reused by the caller) */
    return make_float2(a, b);
}

/* One block per row of dim values, all in fp32 (only x_i is bf16 on load
 * and store; a NULL weight is 1):
 *   rd  = (sum_i d_i^2 / dim + eps)^(-1/2),  rm likewise of m
 *   s_i = d_i * rd * w1_i + m_i * rm * w2_i
 *   rs  = (sum_i s_i^2 / dim + eps)^(-1/2)
 *   x_i = bf16((x_i + s_i * rs * w_i) * scale)
 * With fp32 elements (T = float: x and the weights) the same, unrounded.
 * s is not stored: the third pass recomputes it from d and m (the rows are
 * read three times; after the first they come from L1/L2).  dense and moe
 * are only read. */
template <typename T>
__global__ static void ffn_combine_kernel(T *x, const float *dense, const float *moe,
                                          const T *w1, const T *w2, const T *w, int dim,
                                          float eps, float scale)
{
    __shared__ float shared[64];
    const int64_t off = (int64_t)blockIdx.x * dim;
    const float *dr = dense + off, *mr = moe + off;
    T *xr = x + off;
    float sd = 0.0f, sm = 0.0f, ss = 0.0f, rd, rm, rs;
    float2 t;

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = dr[i], m = mr[i];
        sd += d * d;
        sm += m * m;
    }
    t = block_sum2(sd, sm, shared);
    rd = rsqrtf(t.x / (float)dim + eps);
    rm = rsqrtf(t.y / (float)dim + eps);

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float a = dr[i] * rd * (w1 ? dg_ld(w1 + i) : 1.0f);
        const float b = mr[i] * rm * (w2 ? dg_ld(w2 + i) : 1.0f);
        const float s = a + b;
        ss += s * s;
    }
    rs = rsqrtf(block_sum2(ss, 0.0f, shared).x / (float)dim + eps);

    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float a = dr[i] * rd * (w1 ? dg_ld(w1 + i) : 1.0f);
        const float b = mr[i] * rm * (w2 ? dg_ld(w2 + i) : 1.0f);
        float v = (a + b) * rs;
        if (w)
            v *= dg_ld(w + i);
        dg_st(xr + i, (dg_ld(xr + i) + v) * scale);
    }
}

/* The same, one warp per row and eight values a load (dg_rows_by8), 4
 * rows per block of 128 threads; sums in the warp's order (bf16 elements
 * only: fp32 keeps the block kernel's order, as rmsnorm.cu does). */
template <typename T>
__global__ static void ffn_combine_warp_kernel(T *x, const float *dense, const float *moe,
                                               const T *w1, const T *w2, const T *w,
                                               int64_t rows, int dim, float eps, float scale)
{
    const int64_t row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int64_t off = row * dim;
    const float *dr = dense + off, *mr = moe + off;
    T *xr = x + off;
    float sd = 0.0f, sm = 0.0f, ss = 0.0f, rd, rm, rs = 0.0f;
    if (row >= rows)
        return;
    for (int i = lane * 8; i < dim; i += 256) {
        float d[8], m[8];
        dg_ld8(dr + i, d);
        dg_ld8(mr + i, m);
        for (int u = 0; u < 8; u++) {
            sd += d[u] * d[u];
            sm += m[u] * m[u];
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        sd += __shfl_xor_sync(0xffffffffu, sd, o);
        sm += __shfl_xor_sync(0xffffffffu, sm, o);
    }
    rd = rsqrtf(sd / (float)dim + eps);
    rm = rsqrtf(sm / (float)dim + eps);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (int o = 16; o > 0; o >>= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            rs = rsqrtf(ss / (float)dim + eps);
        }
        for (int i = lane * 8; i < dim; i += 256) {
            float d[8], m[8], a[8], b[8], c[8], xv[8];
            dg_ld8(dr + i, d);
            dg_ld8(mr + i, m);
            if (w1)
                dg_ld8(w1 + i, a);
            if (w2)
                dg_ld8(w2 + i, b);
            for (int u = 0; u < 8; u++)
                d[u] = d[u] * rd * (w1 ? a[u] : 1.0f) + m[u] * rm * (w2 ? b[u] : 1.0f);
            if (pass == 0) {
                for (int u = 0; u < 8; u++)
                    ss += d[u] * d[u];
                continue;
            }
            if (w)
                dg_ld8(w + i, c);
            dg_ld8(xr + i, xv);
            for (int u = 0; u < 8; u++) {
                float v = d[u] * rs;
                if (w)
                    v *= c[u];
                xv[u] = (xv[u] + v) * scale;
            }
            dg_st8(xr + i, xv);
        }
    }
}

extern "C" int dg_cuda_ffn_combine_e(enum dg_elt e, void *x, const float *dense,
                                     const float *moe, const void *w1, const void *w2,
                                     const void *w, int64_t rows, int dim, float eps, float scale,
                                     dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: ffn_combine: element type %d", dev,
                            (int)e);
    if (rows == 0)
        return 0;
    if (rows < 0 || dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: ffn_combine: %lld rows of %d", dev,
                            (long long)rows, dim);
    if (e == DG_ELT_BF16 && dg_rows_by8(dim, 2, x, w1, w2, w) &&
        dg_rows_by8(dim, 4, dense, moe)) {
        ffn_combine_warp_kernel<__nv_bfloat16>
            <<<(unsigned)((rows + 3) / 4), 128, 0, (cudaStream_t)stream>>>(
                (__nv_bfloat16 *)x, dense, moe, (const __nv_bfloat16 *)w1,
                (const __nv_bfloat16 *)w2, (const __nv_bfloat16 *)w, rows, dim, eps, scale);
        DG_LAUNCH_CHECK();
        return 0;
    }
    if (e == DG_ELT_F32)
        ffn_combine_kernel<float><<<(unsigned)rows, COMBINE_THREADS, 0, (cudaStream_t)stream>>>(
            (float *)x, dense, moe, (const float *)w1, (const float *)w2, (const float *)w, dim,
            eps, scale);
    else
        ffn_combine_kernel<__nv_bfloat16>
            <<<(unsigned)rows, COMBINE_THREADS, 0, (cudaStream_t)stream>>>(
                (__nv_bfloat16 *)x, dense, moe, (const __nv_bfloat16 *)w1,
                (const __nv_bfloat16 *)w2, (const __nv_bfloat16 *)w, dim, eps, scale);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_ffn_combine(uint16_t *x, const float *dense, const float *moe,
                                   const uint16_t *w1, const uint16_t *w2, const uint16_t *w,
                                   int64_t rows, int dim, float eps, float scale,
                                   dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_ffn_combine_e(DG_ELT_BF16, x, dense, moe, w1, w2, w, rows, dim, eps, scale,
                                 stream, dev, err);
}
