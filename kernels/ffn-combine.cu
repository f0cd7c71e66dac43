/* ffn-combine.cu - the end of a layer's feed-forward block (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/rows.cuh"

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

/* The same for bf16 x with the rows held in registers: TPR threads a row
 * (32: four rows a block of 128; 128: one), each holding the row's pieces
 * of eight values c TPR + i (i its index in the row, c < RC), every load
 * issued before any is used (one memory latency a row instead of one per
 * piece and pass; dim a multiple of 8 of at most RC TPR 8, rows aligned:
 * dg_rows_by8).  s is computed twice from the registers, for its sum and
 * for the store.  Sums as rows.cuh orders them; with TPR 32 that is the
 * order of the warp kernel this replaced, bit for bit. */
template <int TPR, int RC>
__global__ static void __launch_bounds__(128)
    ffn_combine_rows_kernel(__nv_bfloat16 *x, const float *dense, const float *moe,
                            const __nv_bfloat16 *w1, const __nv_bfloat16 *w2,
                            const __nv_bfloat16 *w, int64_t rows, int dim, float eps,
                            float scale)
{
    __shared__ float sh[8];
    const int64_t row = (int64_t)blockIdx.x * (128 / TPR) + threadIdx.x / TPR;
    const int i = (int)(threadIdx.x % TPR);
    dg_raw8<float> dr[RC], mr[RC];
    dg_raw8<__nv_bfloat16> w1r[RC], w2r[RC], wr[RC], xr[RC];
    float sd = 0.0f, sm = 0.0f, ss = 0.0f, rd, rm, rs;
    float2 t;
    if (row >= rows) /* (TPR 128: the whole block) */
        return;
    __nv_bfloat16 *xp = x + row * dim;
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * TPR + i) * 8;
        if (off < dim) {
            dg_load_raw8(&dr[c], dense + row * dim + off);
            dg_load_raw8(&mr[c], moe + row * dim + off);
            if (w1)
                dg_load_raw8(&w1r[c], w1 + off);
            if (w2)
                dg_load_raw8(&w2r[c], w2 + off);
            if (w)
                dg_load_raw8(&wr[c], w + off);
            dg_load_raw8(&xr[c], xp + off);
        }
    }
#pragma unroll
    for (int c = 0; c < RC; c++)
        if ((c * TPR + i) * 8 < dim) {
            float d[8], m[8];
            dg_unpack8(dr[c], d);
            dg_unpack8(mr[c], m);
            for (int u = 0; u < 8; u++) {
                sd += d[u] * d[u];
                sm += m[u] * m[u];
            }
        }
    t = dg_row_sum2<TPR>(sd, sm, sh);
    rd = rsqrtf(t.x / (float)dim + eps);
    rm = rsqrtf(t.y / (float)dim + eps);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            rs = rsqrtf(dg_row_sum<TPR>(ss, sh) / (float)dim + eps);
#pragma unroll
        for (int c = 0; c < RC; c++) {
            const int off = (c * TPR + i) * 8;
            if (off >= dim)
                continue;
            float d[8], m[8], a[8], b[8], cw[8], xv[8];
            dg_unpack8(dr[c], d);
            dg_unpack8(mr[c], m);
            if (w1)
                dg_unpack8(w1r[c], a);
            if (w2)
                dg_unpack8(w2r[c], b);
            for (int u = 0; u < 8; u++)
                d[u] = d[u] * rd * (w1 ? a[u] : 1.0f) + m[u] * rm * (w2 ? b[u] : 1.0f);
            if (pass == 0) {
                for (int u = 0; u < 8; u++)
                    ss += d[u] * d[u];
                continue;
            }
            if (w)
                dg_unpack8(wr[c], cw);
            dg_unpack8(xr[c], xv);
            for (int u = 0; u < 8; u++) {
                float v = d[u] * rs;
                if (w)
                    v *= cw[u];
                xv[u] = (xv[u] + v) * scale;
            }
            dg_st8(xp + off, xv);
        }
    }
}

/* pieces of eight a thread holds at most: rows of up to 4 x 128 x 8 values */
#define COMBINE_RC 4

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
    if (e == DG_ELT_BF16 && dim <= COMBINE_RC * 128 * 8 && dg_rows_by8(dim, 2, x, w1, w2, w) &&
        dg_rows_by8(dim, 4, dense, moe)) {
        __nv_bfloat16 *xx = (__nv_bfloat16 *)x;
        const __nv_bfloat16 *a = (const __nv_bfloat16 *)w1, *b = (const __nv_bfloat16 *)w2,
                            *c = (const __nv_bfloat16 *)w;
        if (dim <= COMBINE_RC * 32 * 8)
            ffn_combine_rows_kernel<32, COMBINE_RC>
                <<<(unsigned)((rows + 3) / 4), 128, 0, (cudaStream_t)stream>>>(
                    xx, dense, moe, a, b, c, rows, dim, eps, scale);
        else
            ffn_combine_rows_kernel<128, COMBINE_RC><<<(unsigned)rows, 128, 0,
                                                       (cudaStream_t)stream>>>(
                xx, dense, moe, a, b, c, rows, dim, eps, scale);
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
