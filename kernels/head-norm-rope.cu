/* head-norm-rope.cu - the attention's per-head norms and RoPE of q, k
 * and v in one pass (see ops.h; reference: dg_ref_rmsnorm then
 * dg_ref_rope, composed).
 *
 * One warp a head row of hd values (four a block of 128 threads): rows
 * [0, T nh) are q's, then T nkv of k, then T nkv of v.  Lane l holds the
 * row's pieces of eight values c 32 + l (c < RC = max(1, hd / 256): the
 * fewest registers, so the most warps a multiprocessor), loaded before
 * any is used, then
 *   r = (sum_i x_i^2 / hd + eps)^(-1/2)        (the warp's sum, rows.cuh)
 *   y_i = round(x_i r w_i)                     (w NULL for v: no weight)
 * and for q and k the rotation of the rounded values at p = pos[t]:
 *   y'_i        = y_i cos(p f_i) - y_{i+hd/2} sin(p f_i)
 *   y'_{i+hd/2} = y_{i+hd/2} cos(p f_i) + y_i sin(p f_i)   (f_i = 0: untouched)
 * The partner of piece j, j + hd/16, is another lane's (hd <= 256: lane
 * l xor hd/16, the same c) or the same lane's (hd 512, 1024: c xor
 * hd/512), so hd is a power of two from 16 to 1024. */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/rows.cuh"

#define HNR_RC 4 /* pieces of eight a lane holds at most: hd <= 4 x 32 x 8 */

struct hnr_part {
    const __nv_bfloat16 *src;
    __nv_bfloat16 *dst;
    const __nv_bfloat16 *w;
    int heads, rope;
};

template <int RC>
__global__ static void __launch_bounds__(128)
    head_norm_rope_kernel(struct hnr_part pq, struct hnr_part pk, struct hnr_part pv,
                          const int64_t *pos, int64_t T, int hd, const float *inv_freq,
                          float eps)
{
    const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, half = hd / 2, hc = hd / 16;
    const int64_t nq = T * pq.heads, nk = T * pk.heads;
    dg_raw8<__nv_bfloat16> xr[RC], wr[RC];
    dg_raw8<float> fr[RC];
    float y[RC][8], ss = 0.0f, r, p = 0.0f;
    struct hnr_part pt;
    int64_t row;

    if (r0 >= nq + 2 * nk)
        return;
    if (r0 < nq) {
        pt = pq;
        row = r0;
    } else if (r0 < nq + nk) {
        pt = pk;
        row = r0 - nq;
    } else {
        pt = pv;
        row = r0 - nq - nk;
    }
    if (pt.rope)
        p = (float)pos[row / pt.heads];
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * 32 + lane) * 8;
        if (off < hd) {
            dg_load_raw8(&xr[c], pt.src + row * hd + off);
            if (pt.w)
                dg_load_raw8(&wr[c], pt.w + off);
            if (pt.rope)
                dg_load_raw8(&fr[c], inv_freq + (off < half ? off : off - half));
        }
    }
#pragma unroll
    for (int c = 0; c < RC; c++) {
        if ((c * 32 + lane) * 8 >= hd) {
            for (int u = 0; u < 8; u++)
                y[c][u] = 0.0f; /* (past the row: shuffled, never stored) */
            continue;
        }
        dg_unpack8(xr[c], y[c]);
        for (int u = 0; u < 8; u++)
            ss += y[c][u] * y[c][u];
    }
    r = rsqrtf(dg_row_sum<32>(ss, NULL) / (float)hd + eps);
#pragma unroll
    for (int c = 0; c < RC; c++) {
        float wv[8];
        if ((c * 32 + lane) * 8 >= hd)
            continue;
        if (pt.w)
            dg_unpack8(wr[c], wv);
        for (int u = 0; u < 8; u++) {
            float v = y[c][u] * r;
            if (pt.w)
                v *= wv[u];
            y[c][u] = __bfloat162float(__float2bfloat16(v));
        }
    }
    if (pt.rope) {
        float z[RC][8];
        /* the partners (every lane shuffles: the warp's rows are one row) */
#pragma unroll
        for (int c = 0; c < RC; c++)
            for (int u = 0; u < 8; u++) {
                if (RC == 1) /* hd <= 256: lane l xor hd / 16 */
                    z[c][u] = __shfl_xor_sync(0xffffffffu, y[c][u], hc);
                else /* hd 512, 1024: piece c xor hd / 512 */
                    z[c][u] = y[c ^ (RC / 2)][u];
            }
#pragma unroll
        for (int c = 0; c < RC; c++) {
            const int off = (c * 32 + lane) * 8;
            float f[8];
            if (off >= hd)
                continue;
            dg_unpack8(fr[c], f);
            for (int u = 0; u < 8; u++) {
                float s, co;
                if (f[u] == 0.0f)
                    continue;
                sincosf(p * f[u], &s, &co);
                if (off < half) /* y_i, its partner y_{i+hd/2} */
                    y[c][u] = y[c][u] * co - z[c][u] * s;
                else /* y_{i+hd/2}, its partner y_i */
                    y[c][u] = y[c][u] * co + z[c][u] * s;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * 32 + lane) * 8;
        if (off < hd)
            dg_st8(pt.dst + row * hd + off, y[c]);
    }
}

/* Whether the one-pass kernel takes this shape: bf16, hd a power of two
 * in [16, 1024], every row and the frequencies 16-byte aligned. */
static bool hnr_fits(enum dg_elt e, int hd, const void *q, const void *k, const void *kraw,
                     const void *v, const void *vraw, const void *wq, const void *wk,
                     const float *inv_freq)
{
    return e == DG_ELT_BF16 && hd >= 16 && hd <= HNR_RC * 32 * 8 && (hd & (hd - 1)) == 0 &&
           dg_rows_by8(hd, 2, q, k, kraw, v) && dg_rows_by8(hd, 2, vraw, wq, wk) &&
           dg_rows_by8(hd, 4, inv_freq);
}

extern "C" int dg_cuda_head_norm_rope_e(enum dg_elt e, void *q, void *k, const void *kraw,
                                        void *v, const void *vraw, const int64_t *pos,
                                        int64_t T, int nh, int nkv, int hd, const void *wq,
                                        const void *wk, const float *inv_freq, float eps,
                                        dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: head_norm_rope: element type %d", dev,
                            (int)e);
    if (T <= 0)
        return 0;
    if (hd < 2 || hd % 2 || nh < 1 || nkv < 1 || nh > 65535 || nkv > 65535 ||
        T > 0x7fffffff / (nh + 2 * nkv))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: head_norm_rope: %lld tokens, %d + 2 x %d "
                            "heads of %d", dev, (long long)T, nh, nkv, hd);
    if (!hnr_fits(e, hd, q, k, kraw, v, vraw, wq, wk, inv_freq)) {
        /* the separate kernels, one after another */
        if ((rc = dg_cuda_rmsnorm_e(e, q, q, wq, T * nh, hd, eps, stream, dev, err)) < 0 ||
            (rc = dg_cuda_rmsnorm_e(e, k, kraw, wk, T * nkv, hd, eps, stream, dev, err)) < 0 ||
            (rc = dg_cuda_rmsnorm_e(e, v, vraw, NULL, T * nkv, hd, eps, stream, dev, err)) < 0 ||
            (rc = dg_cuda_rope_e(e, q, pos, T, nh, hd, inv_freq, stream, dev, err)) < 0)
            return rc;
        return dg_cuda_rope_e(e, k, pos, T, nkv, hd, inv_freq, stream, dev, err);
    }
    {
        const struct hnr_part pq = {(const __nv_bfloat16 *)q, (__nv_bfloat16 *)q,
                                    (const __nv_bfloat16 *)wq, nh, 1};
        const struct hnr_part pk = {(const __nv_bfloat16 *)kraw, (__nv_bfloat16 *)k,
                                    (const __nv_bfloat16 *)wk, nkv, 1};
        const struct hnr_part pv = {(const __nv_bfloat16 *)vraw, (__nv_bfloat16 *)v, NULL, nkv,
                                    0};
        const int64_t rows = T * (nh + 2 * (int64_t)nkv);
        const unsigned blocks = (unsigned)((rows + 3) / 4);
        const cudaStream_t st = (cudaStream_t)stream;
        /* pieces a lane holds: hd / 256, at least one */
        if (hd <= 256)
            head_norm_rope_kernel<1><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq, eps);
        else if (hd == 512)
            head_norm_rope_kernel<2><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq, eps);
        else
            head_norm_rope_kernel<4><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq, eps);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}
