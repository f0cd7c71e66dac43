/* head-norm-rope.cu - the attention's per-head norms and RoPE of q, k
 * and v in one pass (see ops.h; reference: dg_ref_rmsnorm then
 * dg_ref_rope, composed).
 *
 * One warp a head row of hd values (four a block of 128 threads): rows
 * [0, T nh) are q's, then T nkv of k, then T nkv of v, each read from its
 * source's row stride and written packed (k and v also into the cache
 * row of the token's position, where a table is given).  Lane l holds the
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
 * hd/512), so hd is a power of two from 16 to 1024.
 *
 * The scaled form (dg_cuda_head_norm_rope_scaled) reads the unscaled sums
 * of an FP8 product instead (fp8-lt.h's dg_fp8_lt_product): its x_i is
 *   x_i = bf16(S[t, c_i] sa[t] sw[c_i])    (c_i: the value's column)
 * the value fp8-lt.cu's scaling pass would have stored, so the same
 * bits as that pass and the plain form after it. */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-lt.h"
#include "kernels/rows.cuh"

#define HNR_RC 4 /* pieces of eight a lane holds at most: hd <= 4 x 32 x 8 */

/* q, k or v: head row (t, h) read at src + t ld + h hd, written at dst +
 * (t heads + h) hd; cache: 0, or 1 (k) / 2 (v): also into the token's
 * sequence's cache */
struct hnr_part {
    const __nv_bfloat16 *src;
    __nv_bfloat16 *dst;
    const __nv_bfloat16 *w;
    int64_t ld;
    int heads, rope, cache;
    const float *fsrc, *sw; /* SCALED: the sums (instead of src) and their column scales */
};

template <int RC, bool SCALED>
__global__ static void __launch_bounds__(128)
    head_norm_rope_kernel(struct hnr_part pq, struct hnr_part pk, struct hnr_part pv,
                          const int64_t *pos, int64_t T, int hd, const float *inv_freq,
                          float eps, const struct dg_attn_seq *seqs, const int32_t *q_seq,
                          const float *sa)
{
    const int64_t r0 = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, half = hd / 2, hc = hd / 16;
    const int64_t nq = T * pq.heads, nk = T * pk.heads;
    dg_raw8<__nv_bfloat16> xr[RC], wr[RC];
    dg_raw8<float> fr[RC], sr[SCALED ? RC : 1], cr[SCALED ? RC : 1];
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
    const int64_t t = row / pt.heads, h = row % pt.heads;
    if (pt.rope)
        p = (float)pos[t];
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * 32 + lane) * 8;
        if (off < hd) {
            if (SCALED) {
                dg_load_raw8(&sr[c], pt.fsrc + t * pt.ld + h * hd + off);
                dg_load_raw8(&cr[c], pt.sw + h * hd + off);
            } else {
                dg_load_raw8(&xr[c], pt.src + t * pt.ld + h * hd + off);
            }
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
        if (SCALED) {
            /* the scaling pass's value: (S sa) sw, rounded to bf16 */
            const float a = sa[t];
            float cw[8];
            dg_unpack8(sr[c], y[c]);
            dg_unpack8(cr[c], cw);
            for (int u = 0; u < 8; u++)
                y[c][u] = __bfloat162float(__float2bfloat16_rn(y[c][u] * a * cw[u]));
        } else {
            dg_unpack8(xr[c], y[c]);
        }
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
    __nv_bfloat16 *cache = NULL;
    if (pt.cache && seqs) {
        /* the cache row of the token's position: nkv heads of hd */
        const struct dg_attn_seq *sq = &seqs[q_seq[t]];
        cache = (__nv_bfloat16 *)(pt.cache == 1 ? sq->k : sq->v) +
                (pos[t] * pt.heads + h) * hd;
    }
#pragma unroll
    for (int c = 0; c < RC; c++) {
        const int off = (c * 32 + lane) * 8;
        if (off < hd) {
            dg_st8(pt.dst + row * hd + off, y[c]);
            if (cache)
                dg_st8(cache + off, y[c]);
        }
    }
}

/* Whether the one-pass kernel takes this shape: bf16, hd a power of two
 * in [16, 1024], every row and the frequencies 16-byte aligned. */
static bool hnr_fits(enum dg_elt e, int hd, int64_t ld_q, int64_t ld_kv, const void *q,
                     const void *k, const void *v, const void *qsrc, const void *ksrc,
                     const void *vsrc, const void *wq, const void *wk, const float *inv_freq)
{
    return e == DG_ELT_BF16 && hd >= 16 && hd <= HNR_RC * 32 * 8 && (hd & (hd - 1)) == 0 &&
           ld_q % 8 == 0 && ld_kv % 8 == 0 && dg_rows_by8(hd, 2, q, k, v, qsrc) &&
           dg_rows_by8(hd, 2, ksrc, vsrc, wq, wk) && dg_rows_by8(hd, 4, inv_freq);
}

/* dst [T, heads hd] <- the rows of src (row stride ld elements) where
 * they are not there already */
static int gather_heads(enum dg_elt e, void *dst, const void *src, int64_t ld, int64_t T,
                        int heads, int hd, cudaStream_t st, int dev, struct dg_error *err)
{
    const size_t es = (size_t)dg_elt_size(e), w = (size_t)heads * (size_t)hd * es;
    int rc = 0;
    if (dst == src && (size_t)ld * es == w)
        return 0;
    DG_CUDA_CHECK(cudaMemcpy2DAsync(dst, w, src, (size_t)ld * es, w, (size_t)T,
                                    cudaMemcpyDeviceToDevice, st));
out:
    return rc;
}

/* the validation both forms share; DG_E_INVAL naming what is wrong */
static int hnr_check(enum dg_elt e, const void *q, const void *qsrc, int64_t ld_q,
                     int64_t ld_kv, int64_t T, int nh, int nkv, int hd,
                     const struct dg_attn_seq *seqs, const int32_t *q_seq, int dev,
                     struct dg_error *err)
{
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: head_norm_rope: element type %d", dev,
                            (int)e);
    if (T > 0 && (hd < 2 || hd % 2 || nh < 1 || nkv < 1 || nh > 65535 || nkv > 65535 ||
                  T > 0x7fffffff / (nh + 2 * nkv) || ld_q < (int64_t)nh * hd ||
                  ld_kv < (int64_t)nkv * hd || (seqs && !q_seq) ||
                  (qsrc == q && ld_q != (int64_t)nh * hd)))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: head_norm_rope: %lld tokens, %d + 2 x %d "
                            "heads of %d, rows %lld and %lld apart%s", dev, (long long)T, nh,
                            nkv, hd, (long long)ld_q, (long long)ld_kv,
                            seqs && !q_seq ? ", a cache without the tokens' sequences"
                            : qsrc == q && ld_q != (int64_t)nh * hd ? ", q in place strided"
                                                                     : "");
    return 0;
}

/* the one pass over q, k and v's rows (hnr_fits's shapes) */
template <bool SCALED>
static void hnr_launch(const struct hnr_part &pq, const struct hnr_part &pk,
                       const struct hnr_part &pv, const int64_t *pos, int64_t T, int nh, int nkv,
                       int hd, const float *inv_freq, float eps, const struct dg_attn_seq *seqs,
                       const int32_t *q_seq, const float *sa, cudaStream_t st)
{
    const int64_t rows = T * (nh + 2 * (int64_t)nkv);
    const unsigned blocks = (unsigned)((rows + 3) / 4);
    /* pieces a lane holds: hd / 256, at least one */
    if (hd <= 256)
        head_norm_rope_kernel<1, SCALED><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq,
                                                                  eps, seqs, q_seq, sa);
    else if (hd == 512)
        head_norm_rope_kernel<2, SCALED><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq,
                                                                  eps, seqs, q_seq, sa);
    else
        head_norm_rope_kernel<4, SCALED><<<blocks, 128, 0, st>>>(pq, pk, pv, pos, T, hd, inv_freq,
                                                                  eps, seqs, q_seq, sa);
}

/* the separate kernels on q, k and v in place (their rows already there) */
static int hnr_in_place(enum dg_elt e, void *q, void *k, void *v, const int64_t *pos, int64_t T,
                        int nh, int nkv, int hd, const void *wq, const void *wk,
                        const float *inv_freq, float eps, const struct dg_attn_seq *seqs,
                        const int32_t *q_seq, dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc;
    if ((rc = dg_cuda_rmsnorm_e(e, q, q, wq, T * nh, hd, eps, stream, dev, err)) < 0 ||
        (rc = dg_cuda_rmsnorm_e(e, k, k, wk, T * nkv, hd, eps, stream, dev, err)) < 0 ||
        (rc = dg_cuda_rmsnorm_e(e, v, v, NULL, T * nkv, hd, eps, stream, dev, err)) < 0 ||
        (rc = dg_cuda_rope_e(e, q, pos, T, nh, hd, inv_freq, stream, dev, err)) < 0 ||
        (rc = dg_cuda_rope_e(e, k, pos, T, nkv, hd, inv_freq, stream, dev, err)) < 0)
        return rc;
    return seqs ? dg_cuda_kv_append_e(e, seqs, q_seq, pos, k, v, T, (int64_t)nkv * hd, stream,
                                      dev, err)
                : 0;
}

extern "C" int dg_cuda_head_norm_rope_e(enum dg_elt e, void *q, void *k, void *v,
                                        const void *qsrc, int64_t ld_q, const void *ksrc,
                                        const void *vsrc, int64_t ld_kv, const int64_t *pos,
                                        int64_t T, int nh, int nkv, int hd, const void *wq,
                                        const void *wk, const float *inv_freq, float eps,
                                        const struct dg_attn_seq *seqs, const int32_t *q_seq,
                                        dg_stream_t stream, int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    int rc = 0;
    if ((rc = hnr_check(e, q, qsrc, ld_q, ld_kv, T, nh, nkv, hd, seqs, q_seq, dev, err)) < 0)
        return rc;
    if (T <= 0)
        return 0;
    if (!hnr_fits(e, hd, ld_q, ld_kv, q, k, v, qsrc, ksrc, vsrc, wq, wk, inv_freq)) {
        /* the rows where the outputs go, then the separate kernels in place */
        if ((rc = gather_heads(e, q, qsrc, ld_q, T, nh, hd, st, dev, err)) < 0 ||
            (rc = gather_heads(e, k, ksrc, ld_kv, T, nkv, hd, st, dev, err)) < 0 ||
            (rc = gather_heads(e, v, vsrc, ld_kv, T, nkv, hd, st, dev, err)) < 0)
            return rc;
        return hnr_in_place(e, q, k, v, pos, T, nh, nkv, hd, wq, wk, inv_freq, eps, seqs, q_seq,
                            stream, dev, err);
    }
    {
        const struct hnr_part pq = {(const __nv_bfloat16 *)qsrc, (__nv_bfloat16 *)q,
                                    (const __nv_bfloat16 *)wq, ld_q, nh, 1, 0, NULL, NULL};
        const struct hnr_part pk = {(const __nv_bfloat16 *)ksrc, (__nv_bfloat16 *)k,
                                    (const __nv_bfloat16 *)wk, ld_kv, nkv, 1, 1, NULL, NULL};
        const struct hnr_part pv = {(const __nv_bfloat16 *)vsrc, (__nv_bfloat16 *)v, NULL,
                                    ld_kv, nkv, 0, 2, NULL, NULL};
        hnr_launch<false>(pq, pk, pv, pos, T, nh, nkv, hd, inv_freq, eps, seqs, q_seq, NULL, st);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_head_norm_rope_scaled(void *q, void *k, void *v, const float *S,
                                             int64_t ld, int64_t kcol, int64_t vcol,
                                             const float *sa, const float *sw,
                                             const int64_t *pos, int64_t T, int nh, int nkv,
                                             int hd, const void *wq, const void *wk,
                                             const float *inv_freq, float eps,
                                             const struct dg_attn_seq *seqs,
                                             const int32_t *q_seq, dg_stream_t stream, int dev,
                                             struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    int rc = 0;
    if (!S || !sa || !sw || kcol < (int64_t)nh * hd || vcol < kcol ||
        (vcol > kcol && vcol < kcol + (int64_t)nkv * hd) || vcol + (int64_t)nkv * hd > ld)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: head_norm_rope: scaled sums of %lld "
                            "columns, k at %lld, v at %lld, for %d + 2 x %d heads of %d", dev,
                            (long long)ld, (long long)kcol, (long long)vcol, nh, nkv, hd);
    if ((rc = hnr_check(DG_ELT_BF16, q, NULL, ld, ld, T, nh, nkv, hd, seqs, q_seq, dev, err)) <
        0)
        return rc;
    if (T <= 0)
        return 0;
    /* (the sums and their scales fit where bf16 rows at those places would) */
    if (!hnr_fits(DG_ELT_BF16, hd, ld, ld, q, k, v, S, S + kcol, S + vcol, wq, wk, inv_freq) ||
        !dg_rows_by8(hd, 4, S, S + kcol, S + vcol, sw) || !dg_rows_by8(hd, 4, sw + kcol, sw + vcol)) {
        /* the scaled values where the outputs go, then the separate kernels in place */
        const struct {
            void *dst;
            int64_t col;
            int w;
        } part[3] = {{q, 0, nh * hd}, {k, kcol, nkv * hd}, {v, vcol, nkv * hd}};
        for (int i = 0; i < 3; i++)
            if ((rc = dg_fp8_lt_scale_rows(part[i].dst, S + part[i].col, ld, sa,
                                           sw + part[i].col, T, part[i].w, stream, dev, err)) < 0)
                return rc;
        return hnr_in_place(DG_ELT_BF16, q, k, v, pos, T, nh, nkv, hd, wq, wk, inv_freq, eps,
                            seqs, q_seq, stream, dev, err);
    }
    {
        const struct hnr_part pq = {NULL, (__nv_bfloat16 *)q, (const __nv_bfloat16 *)wq, ld, nh,
                                    1, 0, S, sw};
        const struct hnr_part pk = {NULL, (__nv_bfloat16 *)k, (const __nv_bfloat16 *)wk, ld, nkv,
                                    1, 1, S + kcol, sw + kcol};
        const struct hnr_part pv = {NULL, (__nv_bfloat16 *)v, NULL, ld, nkv, 0, 2, S + vcol,
                                    sw + vcol};
        hnr_launch<true>(pq, pk, pv, pos, T, nh, nkv, hd, inv_freq, eps, seqs, q_seq, sa, st);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}
