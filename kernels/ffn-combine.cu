/* ffn-combine.cu - the end of a layer's feed-forward block (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-gemm.h"
#include "kernels/fp8-quant.cuh"
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

/* The next RMSNorm of the updated x (dg_cuda_ffn_combine_norm_e): its
 * output y, weight w (NULL: none), and with q the output's rows quantized
 * (E4M3 bytes, a scale a row). */
struct next_norm {
    __nv_bfloat16 *y;
    const __nv_bfloat16 *w;
    uint8_t *q;
    float *qs;
};

/* The same for bf16 x with the rows held in registers: TPR threads a row
 * (32: four rows a block of 128; 128: one), each holding the row's pieces
 * of eight values c TPR + i (i its index in the row, c < RC), every load
 * issued before any is used (one memory latency a row instead of one per
 * piece and pass; dim a multiple of 8 of at most RC TPR 8, rows aligned:
 * dg_rows_by8).  s is computed twice from the registers, for its sum and
 * for the store.  Sums as rows.cuh orders them; with TPR 32 that is the
 * order of the warp kernel this replaced, bit for bit.  NEXT 1: then, from
 * the stored (bf16) x', as rmsnorm.cu's register kernel would with the
 * same TPR (so the same bits):
 *   r' = (sum_i x'_i^2 / dim + eps)^(-1/2),  y_i = bf16(x'_i r' wy_i)
 * NEXT 2: and y's row quantized as fp8-gemm.cu's quantization of y would
 * (fp8-quant.cuh: s = max_i |y_i| / 448, q_i = e4m3(y_i / s)). */
template <int TPR, int RC, int NEXT>
__global__ static void __launch_bounds__(128)
    ffn_combine_rows_kernel(__nv_bfloat16 *x, const float *dense, const float *moe,
                            const __nv_bfloat16 *w1, const __nv_bfloat16 *w2,
                            const __nv_bfloat16 *w, int64_t rows, int dim, float eps,
                            float scale, struct next_norm nx)
{
    __shared__ float sh[8];
    const int64_t row = (int64_t)blockIdx.x * (128 / TPR) + threadIdx.x / TPR;
    const int i = (int)(threadIdx.x % TPR);
    dg_raw8<float> dr[RC], mr[RC];
    dg_raw8<__nv_bfloat16> w1r[RC], w2r[RC], wr[RC], xr[RC], wn[NEXT > 0 ? RC : 1];
    float sd = 0.0f, sm = 0.0f, ss = 0.0f, s2 = 0.0f, rd, rm, rs;
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
            if (NEXT > 0 && nx.w)
                dg_load_raw8(&wn[c], nx.w + off);
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
            if (NEXT > 0) {
                /* the stored values, for the norm after */
                dg_pack8(&xr[c], xv);
                dg_unpack8(xr[c], xv);
                for (int u = 0; u < 8; u++)
                    s2 += xv[u] * xv[u];
            }
        }
    }
    if (NEXT == 0)
        return;
    {
        const float r2 = rsqrtf(dg_row_sum<TPR>(s2, sh) / (float)dim + eps);
        float amax = 0.0f;
        int nan = 0;
#pragma unroll
        for (int c = 0; c < RC; c++) {
            const int off = (c * TPR + i) * 8;
            if (off >= dim)
                continue;
            float v[8], wv[8];
            dg_unpack8(xr[c], v);
            if (nx.w)
                dg_unpack8(wn[c], wv);
            for (int u = 0; u < 8; u++) {
                v[u] *= r2;
                if (nx.w)
                    v[u] *= wv[u];
            }
            dg_st8(nx.y + row * dim + off, v);
            if (NEXT == 2) {
                /* y as stored, for its quantization */
                dg_pack8(&xr[c], v);
                dg_unpack8(xr[c], v);
                for (int u = 0; u < 8; u++) {
                    const float a = fabsf(v[u]);
                    nan |= isnan(a);
                    amax = fmaxf(amax, a);
                }
            }
        }
        if (NEXT < 2)
            return;
        dg_row_max_nan<TPR>(amax, nan, sh);
        const float sc = dg_fp8_row_scale(amax, nan);
        if (i == 0)
            nx.qs[row] = sc;
#pragma unroll
        for (int c = 0; c < RC; c++) {
            const int off = (c * TPR + i) * 8;
            if (off < dim) {
                float v[8];
                dg_unpack8(xr[c], v);
                *(uint2 *)(nx.q + row * dim + off) = dg_fp8_piece(v, sc);
            }
        }
    }
}

/* pieces of eight a thread holds at most: rows of up to 4 x 128 x 8 values */
#define COMBINE_RC 4

/* The register kernel for these rows, with NEXT as nx says (y NULL: 0; q
 * NULL: 1; else 2). */
template <int TPR>
static void rows_launch(__nv_bfloat16 *x, const float *dense, const float *moe,
                        const __nv_bfloat16 *w1, const __nv_bfloat16 *w2,
                        const __nv_bfloat16 *w, int64_t rows, int dim, float eps, float scale,
                        const struct next_norm &nx, cudaStream_t st)
{
    const unsigned blocks = (unsigned)((rows + 128 / TPR - 1) / (128 / TPR));
    if (!nx.y)
        ffn_combine_rows_kernel<TPR, COMBINE_RC, 0>
            <<<blocks, 128, 0, st>>>(x, dense, moe, w1, w2, w, rows, dim, eps, scale, nx);
    else if (!nx.q)
        ffn_combine_rows_kernel<TPR, COMBINE_RC, 1>
            <<<blocks, 128, 0, st>>>(x, dense, moe, w1, w2, w, rows, dim, eps, scale, nx);
    else
        ffn_combine_rows_kernel<TPR, COMBINE_RC, 2>
            <<<blocks, 128, 0, st>>>(x, dense, moe, w1, w2, w, rows, dim, eps, scale, nx);
}

/* Whether the register kernel takes these rows (and nx's outputs). */
static bool rows_fit(enum dg_elt e, int dim, const void *x, const float *dense,
                     const float *moe, const void *w1, const void *w2, const void *w,
                     const struct next_norm &nx)
{
    return e == DG_ELT_BF16 && dim <= COMBINE_RC * 128 * 8 && dg_rows_by8(dim, 2, x, w1, w2, w) &&
           dg_rows_by8(dim, 4, dense, moe) && (!nx.y || dg_rows_by8(dim, 2, nx.y, nx.w)) &&
           (!nx.q || dg_rows_by8(dim, 1, nx.q));
}

/* dg_cuda_ffn_combine_e and dg_cuda_ffn_combine_norm_e (nx.y NULL: no norm) */
static int combine(enum dg_elt e, void *x, const float *dense, const float *moe, const void *w1,
                   const void *w2, const void *w, int64_t rows, int dim, float eps, float scale,
                   const struct next_norm &nx, dg_stream_t stream, int dev,
                   struct dg_error *err)
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
    if (nx.y && (nx.y == x || (nx.q && !nx.qs)))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: ffn_combine: %s", dev,
                            nx.y == x ? "the norm's output is the residual"
                                      : "quantized bytes without their scales");
    if (rows_fit(e, dim, x, dense, moe, w1, w2, w, nx)) {
        __nv_bfloat16 *xx = (__nv_bfloat16 *)x;
        const __nv_bfloat16 *a = (const __nv_bfloat16 *)w1, *b = (const __nv_bfloat16 *)w2,
                            *c = (const __nv_bfloat16 *)w;
        if (dim <= COMBINE_RC * 32 * 8)
            rows_launch<32>(xx, dense, moe, a, b, c, rows, dim, eps, scale, nx,
                            (cudaStream_t)stream);
        else
            rows_launch<128>(xx, dense, moe, a, b, c, rows, dim, eps, scale, nx,
                             (cudaStream_t)stream);
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
    /* the norm and its quantization as separate passes */
    if (nx.y)
        rc = dg_cuda_rmsnorm_e(e, nx.y, x, nx.w, rows, dim, eps, stream, dev, err);
    if (rc == 0 && nx.q)
        rc = dg_cuda_fp8_quantize_rows(e, nx.q, nx.qs, nx.y, rows, dim, stream, dev, err);
out:
    return rc;
}

extern "C" int dg_cuda_ffn_combine_e(enum dg_elt e, void *x, const float *dense,
                                     const float *moe, const void *w1, const void *w2,
                                     const void *w, int64_t rows, int dim, float eps, float scale,
                                     dg_stream_t stream, int dev, struct dg_error *err)
{
    const struct next_norm none = {NULL, NULL, NULL, NULL};
    return combine(e, x, dense, moe, w1, w2, w, rows, dim, eps, scale, none, stream, dev, err);
}

extern "C" int dg_cuda_ffn_combine_norm_e(enum dg_elt e, void *x, const float *dense,
                                          const float *moe, const void *w1, const void *w2,
                                          const void *w, int64_t rows, int dim, float eps,
                                          float scale, void *y, const void *wy, uint8_t *q,
                                          float *qs, dg_stream_t stream, int dev,
                                          struct dg_error *err)
{
    const struct next_norm nx = {(__nv_bfloat16 *)y, (const __nv_bfloat16 *)wy, q, qs};
    if (!y)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: ffn_combine: no output for the norm", dev);
    return combine(e, x, dense, moe, w1, w2, w, rows, dim, eps, scale, nx, stream, dev, err);
}

extern "C" int dg_cuda_ffn_combine(uint16_t *x, const float *dense, const float *moe,
                                   const uint16_t *w1, const uint16_t *w2, const uint16_t *w,
                                   int64_t rows, int dim, float eps, float scale,
                                   dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_ffn_combine_e(DG_ELT_BF16, x, dense, moe, w1, w2, w, rows, dim, eps, scale,
                                 stream, dev, err);
}
