/* rmsnorm.cu - RMSNorm and RMSNorm + residual add (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-lt.h"
#include "kernels/rows.cuh"

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

/* The norms that follow an add (dg_cuda_rmsnorm_add_norms_e): up to
 * three outputs and their weights. */
#define NORM_OUTS 3
struct norm_outs {
    __nv_bfloat16 *y[NORM_OUTS];
    const __nv_bfloat16 *w[NORM_OUTS];
};

/* The same for bf16 rows held in registers: TPR threads a row (32: four
 * rows a block of 128; 128: one), each thread holding the row's pieces of
 * eight elements c TPR + i (i its index in the row, c < RC), all loaded
 * before any is used (one memory latency a row; dim a multiple of 8 of
 * at most RC TPR 8, rows aligned: dg_rows_by8).  The row is read once.
 * Sums as rows.cuh orders them; with TPR 32 that is the order the warp
 * kernel this replaced used, bit for bit.  NOUT > 0 (ADD only): then, as
 * dg_cuda_rmsnorm_e on the updated resid (its bf16 values) would,
 *   r2 = (sum_i resid_i^2 / dim + eps)^(-1/2),  out_j,i = bf16(resid_i r2 w_j,i)
 * for j < NOUT (w_j NULL: no weight).  SCALED (ADD only): x is instead
 * the scaling pass of an FP8 product's unscaled sums (fp8-lt.h):
 *   x_i = bf16(S[row, i] sa[row] sw[i])
 * the value that pass would have stored, so the same bits as it and this
 * kernel after it. */
struct scaled_in {
    const float *S, *sa, *sw;
};

template <bool ADD, int NOUT, int TPR, int RC, bool SCALED = false>
__global__ static void __launch_bounds__(128)
    rmsnorm_rows_kernel(__nv_bfloat16 *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                        int64_t rows, int dim, float eps, float scale, struct norm_outs outs,
                        struct scaled_in sc)
{
    __shared__ float sh[8];
    const int64_t row = (int64_t)blockIdx.x * (128 / TPR) + threadIdx.x / TPR;
    const int i = (int)(threadIdx.x % TPR);
    dg_raw8<__nv_bfloat16> xr[RC], wr[RC], yr[RC], wo[NOUT > 0 ? NOUT : 1][RC];
    dg_raw8<float> sr[SCALED ? RC : 1], cr[SCALED ? RC : 1];
    float ss = 0.0f, s2 = 0.0f, r;
    if (row >= rows) /* (TPR 128: the whole block) */
        return;
    const __nv_bfloat16 *xp = x + row * dim;
    __nv_bfloat16 *yp = y + row * dim;
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * TPR + i) * 8;
        if (off < dim) {
            if (SCALED) {
                dg_load_raw8(&sr[c], sc.S + row * dim + off);
                dg_load_raw8(&cr[c], sc.sw + off);
            } else {
                dg_load_raw8(&xr[c], xp + off);
            }
            if (w)
                dg_load_raw8(&wr[c], w + off);
            if (ADD)
                dg_load_raw8(&yr[c], yp + off);
#pragma unroll
            for (int j = 0; j < NOUT; j++)
                if (outs.w[j])
                    dg_load_raw8(&wo[j][c], outs.w[j] + off);
        }
    }
    if (SCALED) {
        /* the scaling pass's values: (S sa) sw, rounded to bf16 */
        const float a = sc.sa[row];
#pragma unroll
        for (int c = 0; c < RC; c++)
            if ((c * TPR + i) * 8 < dim) {
                float v[8], cw[8];
                dg_unpack8(sr[c], v);
                dg_unpack8(cr[c], cw);
                for (int u = 0; u < 8; u++)
                    v[u] = v[u] * a * cw[u];
                dg_pack8(&xr[c], v);
            }
    }
#pragma unroll
    for (int c = 0; c < RC; c++)
        if ((c * TPR + i) * 8 < dim) {
            float v[8];
            dg_unpack8(xr[c], v);
            for (int u = 0; u < 8; u++)
                ss += v[u] * v[u];
        }
    r = rsqrtf(dg_row_sum<TPR>(ss, sh) / (float)dim + eps);
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * TPR + i) * 8;
        if (off < dim) {
            float v[8], wv[8], yv[8];
            dg_unpack8(xr[c], v);
            if (w)
                dg_unpack8(wr[c], wv);
            if (ADD)
                dg_unpack8(yr[c], yv);
            for (int u = 0; u < 8; u++) {
                v[u] *= r;
                if (w)
                    v[u] *= wv[u];
                if (ADD)
                    v[u] = yv[u] + v[u] * scale;
            }
            dg_st8(yp + off, v);
            if (NOUT > 0) {
                /* the stored values, for the norms after */
                __nv_bfloat162 *h = (__nv_bfloat162 *)&xr[c].u;
                for (int u = 0; u < 4; u++) {
                    h[u] = __floats2bfloat162_rn(v[2 * u], v[2 * u + 1]);
                    const float2 f = __bfloat1622float2(h[u]);
                    s2 += f.x * f.x;
                    s2 += f.y * f.y;
                }
            }
        }
    }
    if (NOUT == 0)
        return;
    r = rsqrtf(dg_row_sum<TPR>(s2, sh) / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < NOUT; j++)
#pragma unroll
        for (int c = 0; c < RC; c++) {
            const int off = (c * TPR + i) * 8;
            if (off < dim) {
                float v[8], wv[8];
                dg_unpack8(xr[c], v);
                if (outs.w[j])
                    dg_unpack8(wo[j][c], wv);
                for (int u = 0; u < 8; u++) {
                    v[u] *= r;
                    if (outs.w[j])
                        v[u] *= wv[u];
                }
                dg_st8(outs.y[j] + row * dim + off, v);
            }
        }
}

/* Pieces of eight a thread holds at most, and the widest row the register
 * kernels take (TPR 128). */
#define NORM_RC 4
#define NORM_ROWS_MAX (NORM_RC * 128 * 8)

/* Launch the register kernel for these rows (bf16, aligned, dim <= NORM_ROWS_MAX). */
template <bool ADD, int NOUT, bool SCALED = false>
static void rows_launch(__nv_bfloat16 *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                        int64_t rows, int dim, float eps, float scale,
                        const struct norm_outs &outs, cudaStream_t st,
                        const struct scaled_in &sc = {NULL, NULL, NULL})
{
    if (dim <= NORM_RC * 32 * 8)
        rmsnorm_rows_kernel<ADD, NOUT, 32, NORM_RC, SCALED>
            <<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(y, x, w, rows, dim, eps, scale, outs,
                                                         sc);
    else
        rmsnorm_rows_kernel<ADD, NOUT, 128, NORM_RC, SCALED>
            <<<(unsigned)rows, 128, 0, st>>>(y, x, w, rows, dim, eps, scale, outs, sc);
}

/* Whether the register kernels take these rows. */
static bool rows_fit(enum dg_elt e, int dim, const void *y, const void *x, const void *w)
{
    return e == DG_ELT_BF16 && dim <= NORM_ROWS_MAX && dg_rows_by8(dim, 2, y, x, w);
}

template <bool ADD>
static void rmsnorm_launch(enum dg_elt e, void *y, const void *x, const void *w, int64_t rows,
                           int dim, float eps, float scale, dg_stream_t stream)
{
    if (rows_fit(e, dim, y, x, w)) {
        const struct norm_outs none = {{NULL, NULL, NULL}, {NULL, NULL, NULL}};
        rows_launch<ADD, 0>((__nv_bfloat16 *)y, (const __nv_bfloat16 *)x,
                            (const __nv_bfloat16 *)w, rows, dim, eps, scale, none,
                            (cudaStream_t)stream);
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

/* the add with n_out norms after it (0 to NORM_OUTS), the register kernel */
template <bool SCALED>
static void add_launch(int n_out, __nv_bfloat16 *r, const __nv_bfloat16 *x,
                       const __nv_bfloat16 *w, int64_t rows, int dim, float eps, float scale,
                       const struct norm_outs &o, cudaStream_t st, const struct scaled_in &sc)
{
    if (n_out == 0)
        rows_launch<true, 0, SCALED>(r, x, w, rows, dim, eps, scale, o, st, sc);
    else if (n_out == 1)
        rows_launch<true, 1, SCALED>(r, x, w, rows, dim, eps, scale, o, st, sc);
    else if (n_out == 2)
        rows_launch<true, 2, SCALED>(r, x, w, rows, dim, eps, scale, o, st, sc);
    else
        rows_launch<true, 3, SCALED>(r, x, w, rows, dim, eps, scale, o, st, sc);
}

/* dg_cuda_rmsnorm_add_norms_e, and with sc.S the scaled form
 * (dg_cuda_rmsnorm_add_norms_scaled): x is then the bf16 buffer the
 * scaling pass's values go to where the one pass does not take the rows */
static int add_norms(enum dg_elt e, void *resid, const void *x, const struct scaled_in &sc,
                     const void *w, int64_t rows, int dim, float eps, float scale, int n_out,
                     void *const *y, const void *const *wy, dg_stream_t stream, int dev,
                     struct dg_error *err)
{
    int rc = 0;
    bool fit;
    if (n_out < 0 || n_out > NORM_OUTS || (n_out > 0 && (!y || !wy)))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: %d outputs (0 to %d)",
                            dev, n_out, NORM_OUTS);
    for (int j = 0; j < n_out; j++)
        if (!y[j] || y[j] == resid)
            return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: output %d is %s",
                                dev, j, y[j] ? "the residual" : "NULL");
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: element type %d", dev,
                            (int)e);
    if (sc.S && (!sc.sa || !sc.sw || !x || e != DG_ELT_BF16))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: scaled sums without "
                            "%s", dev, !sc.sa || !sc.sw ? "their scales" : "a bf16 buffer");
    if (rows <= 0)
        return 0;
    if (dim < 1 || rows > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: %lld rows of %d", dev,
                            (long long)rows, dim);
    fit = rows_fit(e, dim, resid, sc.S ? NULL : x, w) &&
          (!sc.S || dg_rows_by8(dim, 4, sc.S, sc.sw));
    for (int j = 0; j < n_out && fit; j++)
        fit = dg_rows_by8(dim, 2, y[j], wy[j]);
    if (!fit) {
        /* the separate kernels, one after another (the scaled sums first
         * through the scaling pass into x) */
        if (sc.S)
            rc = dg_fp8_lt_scale_rows((void *)x, sc.S, dim, sc.sa, sc.sw, rows, dim, stream, dev,
                                      err);
        if (rc == 0)
            rc = dg_cuda_rmsnorm_add_e(e, resid, x, w, rows, dim, eps, scale, stream, dev, err);
        for (int j = 0; j < n_out && rc == 0; j++)
            rc = dg_cuda_rmsnorm_e(e, y[j], resid, wy[j], rows, dim, eps, stream, dev, err);
        return rc;
    }
    {
        struct norm_outs o = {{NULL, NULL, NULL}, {NULL, NULL, NULL}};
        __nv_bfloat16 *r = (__nv_bfloat16 *)resid;
        const __nv_bfloat16 *xx = (const __nv_bfloat16 *)x, *ww = (const __nv_bfloat16 *)w;
        const cudaStream_t st = (cudaStream_t)stream;
        for (int j = 0; j < n_out; j++) {
            o.y[j] = (__nv_bfloat16 *)y[j];
            o.w[j] = (const __nv_bfloat16 *)wy[j];
        }
        if (sc.S)
            add_launch<true>(n_out, r, xx, ww, rows, dim, eps, scale, o, st, sc);
        else
            add_launch<false>(n_out, r, xx, ww, rows, dim, eps, scale, o, st, sc);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_rmsnorm_add_norms_e(enum dg_elt e, void *resid, const void *x,
                                           const void *w, int64_t rows, int dim, float eps,
                                           float scale, int n_out, void *const *y,
                                           const void *const *wy, dg_stream_t stream, int dev,
                                           struct dg_error *err)
{
    const struct scaled_in none = {NULL, NULL, NULL};
    return add_norms(e, resid, x, none, w, rows, dim, eps, scale, n_out, y, wy, stream, dev, err);
}

extern "C" int dg_cuda_rmsnorm_add_norms_scaled(void *resid, const float *S, const float *sa,
                                                const float *sw, void *xbuf, const void *w,
                                                int64_t rows, int dim, float eps, float scale,
                                                int n_out, void *const *y, const void *const *wy,
                                                dg_stream_t stream, int dev,
                                                struct dg_error *err)
{
    const struct scaled_in sc = {S, sa, sw};
    if (!S)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rmsnorm_add_norms: no scaled sums", dev);
    return add_norms(DG_ELT_BF16, resid, xbuf, sc, w, rows, dim, eps, scale, n_out, y, wy,
                     stream, dev, err);
}
