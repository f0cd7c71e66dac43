/* ref-attention.c - masked grouped-query attention reference; see ref-ops.h. */
#include "lib/ref-ops.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/san-range.h"

void dg_ref_attention(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                      const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                      int nh, int nkv, int hd, enum dg_attn_mask mask, int window,
                      float *scores)
{
    dg_ref_attention_heads(out, q, q_pos, Tq, k, v, k_pos, Tk, nh, 0, nkv, 0, nh / nkv, hd, mask,
                           window, scores);
}

/* Whether positions pos[0..n-1] never decrease (a cache read in order and
 * the new tokens after it: then the keys a causal or windowed query sees
 * are one run, found by visible_run). */
DG_SAN_RANGE_CHECKED static int ascending(const int64_t *pos, int64_t n)
{
    for (int64_t j = 1; j < n; j++)
        if (pos[j] < pos[j - 1])
            return 0;
    return 1;
}

/* The keys [*lo, *hi) that can be visible to a query at position q under
 * mask over ascending positions k_pos (every key outside the run is
 * invisible; inside, dg_mask_visible still decides), by bisection. */
DG_SAN_RANGE_CHECKED static void visible_run(const int64_t *k_pos, int64_t Tk,
                                             enum dg_attn_mask mask, int window, int64_t q,
                                             int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = Tk;
    *lo = 0, *hi = Tk;
    if (mask == DG_MASK_NONE)
        return;
    while (a < b) { /* the first key past q */
        const int64_t m = a + (b - a) / 2;
        if (k_pos[m] <= q)
            a = m + 1;
        else
            b = m;
    }
    *hi = a;
    if (mask != DG_MASK_CAUSAL_WINDOW)
        return;
    a = 0, b = *hi;
    while (a < b) { /* the first key inside the window */
        const int64_t m = a + (b - a) / 2;
        if (k_pos[m] <= q - window)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
}

/* q . k over hd values, summed in the order i = 0, 1, ... */
DG_SAN_RANGE_CHECKED static float dot1(const float *q, const float *k, int hd)
{
    float s = 0;
    for (int i = 0; i < hd; i++)
        s += q[i] * k[i];
    return s;
}

/* s[u] = q . k_u for four keys k_u (rows kdim apart) over hd values: each
 * sum in the order i = 0, 1, ..., its own chain, so the four run side by
 * side and each equals the one-key loop's bits. */
DG_SAN_RANGE_CHECKED static void dot4(float s[4], const float *q, const float *k, int64_t kdim,
                                      int hd)
{
    float a = 0, b = 0, c = 0, d = 0;
    for (int i = 0; i < hd; i++) {
        a += q[i] * k[i];
        b += q[i] * k[kdim + i];
        c += q[i] * k[2 * kdim + i];
        d += q[i] * k[3 * kdim + i];
    }
    s[0] = a, s[1] = b, s[2] = c, s[3] = d;
}

/* o[i] += p[u] v_u[i] for four values rows v_u (kdim apart), u in order:
 * for each i the adds of the one-key loop, in its order (o[i] is held in
 * a float between them, as memory held it), so the same bits. */
DG_SAN_RANGE_CHECKED static void axpy4(float *restrict o, const float p[4],
                                       const float *restrict v, int64_t kdim, int hd)
{
    const float *restrict v1 = v + kdim, *restrict v2 = v + 2 * kdim, *restrict v3 = v + 3 * kdim;
    int i = 0;
    /* four i at a time, written out (the compiler packs such lanes) */
    for (; i + 4 <= hd; i += 4) {
        float x0 = o[i], x1 = o[i + 1], x2 = o[i + 2], x3 = o[i + 3];
        x0 += p[0] * v[i], x1 += p[0] * v[i + 1], x2 += p[0] * v[i + 2], x3 += p[0] * v[i + 3];
        x0 += p[1] * v1[i], x1 += p[1] * v1[i + 1], x2 += p[1] * v1[i + 2], x3 += p[1] * v1[i + 3];
        x0 += p[2] * v2[i], x1 += p[2] * v2[i + 1], x2 += p[2] * v2[i + 2], x3 += p[2] * v2[i + 3];
        x0 += p[3] * v3[i], x1 += p[3] * v3[i + 1], x2 += p[3] * v3[i + 2], x3 += p[3] * v3[i + 3];
        o[i] = x0, o[i + 1] = x1, o[i + 2] = x2, o[i + 3] = x3;
    }
    for (; i < hd; i++) {
        float x = o[i];
        x += p[0] * v[i];
        x += p[1] * v1[i];
        x += p[2] * v2[i];
        x += p[3] * v3[i];
        o[i] = x;
    }
}

/* sc[h][j + u] = q_h . k_{j+u} for four heads h (qT: their queries
 * interleaved, qT[4 i + h] = q_h[i]) and four keys u (rows kdim apart from
 * k): sixteen sums, each in the order i = 0, 1, ... (the one-key loop's
 * bits), the four heads of a key side by side. */
DG_SAN_RANGE_CHECKED static void dot4x4(float *const sc[4], int64_t j, const float *qT,
                                        const float *k, int64_t kdim, int hd)
{
    /* (written out, so the sixteen sums stay in registers: a key's four
     * heads pack into one vector) */
    float a0[4] = {0}, a1[4] = {0}, a2[4] = {0}, a3[4] = {0};
    const float *k1 = k + kdim, *k2 = k + 2 * kdim, *k3 = k + 3 * kdim;
    for (int i = 0; i < hd; i++) {
        const float *qi = qT + 4 * i;
        const float x0 = k[i], x1 = k1[i], x2 = k2[i], x3 = k3[i];
        a0[0] += qi[0] * x0, a0[1] += qi[1] * x0, a0[2] += qi[2] * x0, a0[3] += qi[3] * x0;
        a1[0] += qi[0] * x1, a1[1] += qi[1] * x1, a1[2] += qi[2] * x1, a1[3] += qi[3] * x1;
        a2[0] += qi[0] * x2, a2[1] += qi[1] * x2, a2[2] += qi[2] * x2, a2[3] += qi[3] * x2;
        a3[0] += qi[0] * x3, a3[1] += qi[1] * x3, a3[2] += qi[2] * x3, a3[3] += qi[3] * x3;
    }
    for (int h = 0; h < 4; h++) {
        sc[h][j] = a0[h];
        sc[h][j + 1] = a1[h];
        sc[h][j + 2] = a2[h];
        sc[h][j + 3] = a3[h];
    }
}

/* The end of one head's attention, its scores s_j (or -inf: not visible)
 * over keys [lo, hi) in sc and their largest mx:
 *   o = sum_j softmax(s)_j v_j   (v: the head's values, rows kdim apart),
 * zeros where no key is visible (any 0).  The weights' sum in double, in
 * key order; weights that are 0 add nothing. */
DG_SAN_RANGE_CHECKED static void softmax_values(float *o, float *sc, int64_t lo, int64_t hi,
                                                float mx, int any, const float *v, int64_t kdim,
                                                int hd)
{
    double sum = 0;
    memset(o, 0, sizeof *o * (size_t)hd);
    if (!any)
        return;
    for (int64_t j = lo; j < hi; j++) {
        sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mx);
        sum += sc[j];
    }
    for (int64_t j = lo; j < hi;) {
        const float *vv = v + j * kdim;
        float p4[4];
        int n = 0;
        if (j + 4 <= hi)
            for (n = 0; n < 4; n++)
                if ((p4[n] = (float)(sc[j + n] / sum)) == 0.0f)
                    break;
        if (n == 4) {
            axpy4(o, p4, vv, kdim, hd);
            j += 4;
            continue;
        }
        p4[0] = (float)(sc[j] / sum);
        if (p4[0] != 0.0f)
            for (int i = 0; i < hd; i++)
                o[i] += p4[0] * vv[i];
        j++;
    }
}

/* Whether keys j .. j + 3 (below hi) are all visible to a query at qp
 * (over ascending positions inside the visible run, the ends decide). */
DG_SAN_RANGE_CHECKED static int visible4(const int64_t *k_pos, int64_t j, int64_t hi,
                                         int sorted, enum dg_attn_mask mask, int64_t qp,
                                         int window)
{
    return j + 4 <= hi && dg_mask_visible(mask, qp, k_pos[j], window) &&
           dg_mask_visible(mask, qp, k_pos[j + 3], window) &&
           (sorted || (dg_mask_visible(mask, qp, k_pos[j + 1], window) &&
                       dg_mask_visible(mask, qp, k_pos[j + 2], window)));
}

/* dg_ref_attention_heads without the sanitizers' checks of each access:
 * its caller declares the ranges (lib/san-range.h). */
DG_SAN_RANGE_CHECKED static void attention_heads(float *out, const float *q,
                                                 const int64_t *q_pos, int64_t Tq, const float *k,
                                                 const float *v, const int64_t *k_pos,
                                                 int64_t Tk, int nq, int q_base, int nkv,
                                                 int kv_base, int group, int hd,
                                                 enum dg_attn_mask mask, int window,
                                                 float *scores)
{
    const int64_t qdim = (int64_t)nq * hd, kdim = (int64_t)nkv * hd;
    const int sorted = ascending(k_pos, Tk);
    /* four heads on one kv head at a time where they exist: three more
     * score rows and the four queries interleaved (without them, one head
     * at a time: the same bits either way) */
    float *more = nq >= 4 && group >= 4 && Tk > 0
                      ? malloc(sizeof(float) * (size_t)(3 * Tk + 4 * (int64_t)hd))
                      : NULL;

    for (int64_t t = 0; t < Tq; t++) {
        const int64_t qp = q_pos[t];
        int64_t lo = 0, hi = Tk;
        /* (keys outside [lo, hi) are invisible: their weight would be an
         * exact 0, and the double sum gains nothing from them) */
        if (sorted)
            visible_run(k_pos, Tk, mask, window, qp, &lo, &hi);
        for (int h = 0; h < nq;) {
            const int c = (q_base + h) / group - kv_base;
            const float *kc = k + (int64_t)c * hd, *vc = v + (int64_t)c * hd;
            if (more && h + 4 <= nq && (q_base + h + 3) / group - kv_base == c) {
                float *sc[4] = {scores, more, more + Tk, more + 2 * Tk};
                float *qT = more + 3 * Tk, mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
                int any = 0;
                for (int u = 0; u < 4; u++)
                    for (int i = 0; i < hd; i++)
                        qT[4 * i + u] = q[t * qdim + (int64_t)(h + u) * hd + i];
                for (int64_t j = lo; j < hi;) {
                    int n = 4;
                    if (visible4(k_pos, j, hi, sorted, mask, qp, window))
                        dot4x4(sc, j, qT, kc + j * kdim, kdim, hd);
                    else if (!dg_mask_visible(mask, qp, k_pos[j], window)) {
                        for (int u = 0; u < 4; u++)
                            sc[u][j] = -INFINITY;
                        j++;
                        continue;
                    } else {
                        for (int u = 0; u < 4; u++)
                            sc[u][j] = dot1(q + t * qdim + (int64_t)(h + u) * hd, kc + j * kdim,
                                            hd);
                        n = 1;
                    }
                    for (int e = 0; e < n; e++, j++)
                        for (int u = 0; u < 4; u++)
                            if (sc[u][j] > mx[u])
                                mx[u] = sc[u][j];
                    any = 1;
                }
                for (int u = 0; u < 4; u++)
                    softmax_values(out + t * qdim + (int64_t)(h + u) * hd, sc[u], lo, hi, mx[u],
                                   any, vc, kdim, hd);
                h += 4;
                continue;
            }
            {
                const float *qv = q + t * qdim + (int64_t)h * hd;
                float mx = -INFINITY;
                int any = 0;
                for (int64_t j = lo; j < hi;) {
                    const float *kv = kc + j * kdim;
                    float s4[4];
                    int n = 1;
                    if (visible4(k_pos, j, hi, sorted, mask, qp, window)) {
                        dot4(s4, qv, kv, kdim, hd);
                        n = 4;
                    } else if (!dg_mask_visible(mask, qp, k_pos[j], window)) {
                        scores[j++] = -INFINITY;
                        continue;
                    } else
                        s4[0] = dot1(qv, kv, hd);
                    for (int u = 0; u < n; u++, j++) {
                        scores[j] = s4[u];
                        if (s4[u] > mx)
                            mx = s4[u];
                    }
                    any = 1;
                }
                softmax_values(out + t * qdim + (int64_t)h * hd, scores, lo, hi, mx, any, vc,
                               kdim, hd);
                h++;
            }
        }
    }
    free(more);
}

void dg_ref_attention_heads(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                            const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                            int nq, int q_base, int nkv, int kv_base, int group, int hd,
                            enum dg_attn_mask mask, int window, float *scores)
{
    /* every byte the loops may touch: the queries' rows, both position
     * lists, the scores, and the keys' and values' rows from the first
     * query head's KV head to the last one's (so a head outside the slice
     * is a range outside the block).  Not out: softmax_values clears each
     * of its rows with memset before it adds to it, a library call that
     * the sanitizers check whole. */
    if (Tq > 0 && nq > 0 && hd > 0) {
        dg_san_read(q, sizeof(float) * (size_t)Tq * (size_t)nq * (size_t)hd);
        dg_san_read(q_pos, sizeof *q_pos * (size_t)Tq);
    }
    if (Tq > 0 && nq > 0 && hd > 0 && Tk > 0) {
        const int64_t kdim = (int64_t)nkv * hd, c0 = q_base / group - kv_base,
                      c1 = (q_base + nq - 1) / group - kv_base;
        const size_t kspan = sizeof(float) * (size_t)((Tk - 1) * kdim + (c1 - c0 + 1) * hd);
        /* (in integers: the first row's start is before k where c0 < 0) */
        const intptr_t off = (intptr_t)(c0 * hd) * (intptr_t)sizeof(float);
        dg_san_read((const void *)((intptr_t)k + off), kspan);
        dg_san_read((const void *)((intptr_t)v + off), kspan);
        dg_san_write(scores, sizeof *scores * (size_t)Tk);
    }
    if (Tk > 0)
        dg_san_read(k_pos, sizeof *k_pos * (size_t)Tk);
    attention_heads(out, q, q_pos, Tq, k, v, k_pos, Tk, nq, q_base, nkv, kv_base, group, hd,
                    mask, window, scores);
}

void dg_ref_kv_append(float *const *k_caches, float *const *v_caches, const int32_t *q_seq,
                      const int64_t *q_pos, const float *k_new, const float *v_new, int64_t Tq,
                      int64_t row)
{
    for (int64_t t = 0; t < Tq; t++)
        for (int64_t i = 0; i < row; i++) {
            k_caches[q_seq[t]][q_pos[t] * row + i] = k_new[t * row + i];
            v_caches[q_seq[t]][q_pos[t] * row + i] = v_new[t * row + i];
        }
}
