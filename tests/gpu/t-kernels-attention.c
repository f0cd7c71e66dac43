/*
 * Description: the attention kernel against dg_ref_attention on fresh
 * random inputs: encoder mode (causal; causal within a sliding window),
 * decoder mode (a canvas against prefix keys and itself, no mask), head
 * sizes 6, 64, 256 and 512, grouped-query attention (1, 2, 4, 8 query
 * heads per KV head), keys not a multiple of the warps, a query that sees
 * no key (zeros), no keys at all; each with bf16 q, k, v and out, then
 * with fp32 ones (dg_cuda_attention_e, fresh fp32 inputs).  Outputs
 * poisoned (0xff bytes: NaN) before the launch and guard bytes after them
 * checked; bound ||out - ref|| / ||ref|| <= 1e-2 for bf16, 1e-5 for fp32,
 * never a NaN; element types other than bf16 and fp32 refused.  Batched:
 * four sequences with caches of 0 .. 120 rows, their new tokens appended
 * (dg_cuda_kv_append_e) and attending (dg_cuda_attention_batch_e) in one
 * launch each, and three pad tokens of a sequence with no keys after
 * them, encoder (causal, window 5) and decoder (all keys, a window's
 * rows), bf16 at 8/2 heads of 64, 16/8 of 256, 16/2 of 512, 4/4 of 128
 * (the tensor-core kernel: row tiles that straddle sequences) and 6/3 of
 * 48, fp32 at 8/2 of 64 and 6/3 of 48: the caches equal to
 * dg_ref_kv_append's exactly, the outputs against dg_ref_attention per
 * sequence, the pads' outputs exactly zero, guard bytes after the output
 * and every cache; bf16 again with a work space, the keys split over more
 * blocks and folded (the output poisoned again, guard bytes after the
 * work space); bf16 at the tensor-core head sizes once more in each form
 * of its S = Q K^T (mma.sync, and wgmma where the device has it, else
 * refused; wgmma's warp-specialised form, which head size 256 takes),
 * whole and split, against the same reference.  Exit 77 where
 * there is no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention-tc.h"
#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD_BYTES 512
#define GUARD_BYTE 0x5a

/* n random bf16 values (bits in h, floats in f) */
static void fill(uint16_t *h, float *f, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = dg_f32_to_bf16(gt_uniform() * amp);
        f[i] = dg_bf16_to_f32(h[i]);
    }
}

/* n random fp32 values in [-amp, amp) */
static void fill_f32(float *f, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++)
        f[i] = gt_uniform() * amp;
}

/* The first guard byte after bytes of h that changed, or -1. */
static long guard_changed(const unsigned char *h, size_t bytes)
{
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (h[bytes + i] != GUARD_BYTE)
            return (long)i;
    return -1;
}

struct shape {
    const char *what;
    int64_t Tq, Tk;
    int nh, nkv, hd, mask, window;
    int64_t q0, k0;     /* first positions: query t at q0 + t, key j at k0 + j */
};

/* One shape with q, k, v and out of element type e: bf16 (dg_cuda_attention,
 * bound 1e-2) or fp32 (dg_cuda_attention_e, bound 1e-5), against the
 * reference on the same values. */
static int one(const struct shape *s, enum dg_elt e)
{
    const size_t nq = (size_t)s->Tq * s->nh * s->hd, nk = (size_t)s->Tk * s->nkv * s->hd;
    const size_t es = (size_t)dg_elt_size(e), ob = nq * es;
    const int f32 = e == DG_ELT_F32;
    const double bound = f32 ? 1e-5 : 1e-2;
    struct dg_error err = {0};
    unsigned char *hq = malloc(nq * es + 4), *hk = malloc(nk * es + 4), *hv = malloc(nk * es + 4);
    unsigned char *ho = malloc(ob + GUARD_BYTES);
    float *fq = malloc(nq * 4 + 4), *fk = malloc(nk * 4 + 4), *fv = malloc(nk * 4 + 4);
    float *ref = malloc(nq * 4 + 4), *scores = malloc((size_t)(s->Tk + 1) * 4);
    int64_t *qp = malloc((size_t)s->Tq * 8), *kp = malloc((size_t)(s->Tk + 1) * 8);
    void *dq, *dk, *dv, *dqp, *dkp, *dout;
    double num = 0, den = 0;
    long g;

    CHECK(hq && hk && hv && ho && fq && fk && fv && ref && scores && qp && kp);
    if (f32) {
        fill_f32(fq, nq, 1.0f);
        fill_f32(fk, nk, 1.0f);
        fill_f32(fv, nk, 2.0f);
        memcpy(hq, fq, nq * 4);
        memcpy(hk, fk, nk * 4);
        memcpy(hv, fv, nk * 4);
    } else {
        fill((uint16_t *)hq, fq, nq, 1.0f);
        fill((uint16_t *)hk, fk, nk, 1.0f);
        fill((uint16_t *)hv, fv, nk, 2.0f);
    }
    for (int64_t t = 0; t < s->Tq; t++)
        qp[t] = s->q0 + t;
    for (int64_t j = 0; j < s->Tk; j++)
        kp[j] = s->k0 + j;
    dg_ref_attention(ref, fq, qp, s->Tq, fk, fv, kp, s->Tk, s->nh, s->nkv, s->hd,
                     (enum dg_attn_mask)s->mask, s->window, scores);
    dq = gt_upload(hq, nq * es, &err);
    dk = gt_upload(hk, nk * es, &err);
    dv = gt_upload(hv, nk * es, &err);
    dqp = gt_upload(qp, (size_t)s->Tq * 8, &err);
    dkp = gt_upload(kp, (size_t)s->Tk * 8, &err);
    dout = gt_out_alloc(ob, GUARD_BYTES, GUARD_BYTE, &err);
    CHECKF(dq && dk && dv && dqp && dkp && dout, "%s", err.msg);
    if (f32)
        CHECK_OK(dg_cuda_attention_e(DG_ELT_F32, dout, dq, dqp, s->Tq, dk, dv, dkp, s->Tk, s->nh,
                                     s->nkv, s->hd, s->mask, s->window, NULL, 0, &err),
                 &err);
    else
        CHECK_OK(dg_cuda_attention(dout, dq, dqp, s->Tq, dk, dv, dkp, s->Tk, s->nh, s->nkv,
                                   s->hd, s->mask, s->window, NULL, 0, &err),
                 &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(ho, dout, ob + GUARD_BYTES, 0, &err), &err);
    g = guard_changed(ho, ob);
    CHECKF(g < 0, "%s%s: guard byte %ld changed", f32 ? "f32 " : "", s->what, g);
    for (size_t i = 0; i < nq; i++) {
        double o;
        if (f32) {
            float x;
            memcpy(&x, ho + i * 4, 4);
            o = x;
        } else {
            uint16_t x;
            memcpy(&x, ho + i * 2, 2);
            o = dg_bf16_to_f32(x);
        }
        CHECKF(!isnan(o), "%s%s: NaN at %zu", f32 ? "f32 " : "", s->what, i);
        num += (o - ref[i]) * (o - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) {
        printf("# attention %s%s: all zeros, as the reference (%s)\n", f32 ? "f32 " : "",
               s->what, num == 0 ? "equal" : "DIFFERENT");
        CHECK(num == 0);
    } else {
        printf("# attention %s%s: relative error %.2e\n", f32 ? "f32 " : "", s->what,
               sqrt(num / den));
        CHECKF(sqrt(num / den) <= bound, "%s%s: %.3e", f32 ? "f32 " : "", s->what,
               sqrt(num / den));
    }
    dg_cuda_free(dq);
    dg_cuda_free(dk);
    dg_cuda_free(dv);
    dg_cuda_free(dqp);
    dg_cuda_free(dkp);
    dg_cuda_free(dout);
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(fq);
    free(fk);
    free(fv);
    free(ref);
    free(scores);
    free(qp);
    free(kp);
    return 0;
}

static const struct shape shapes[] = {
    {"encoder causal, 40 tokens, 8 heads / 2 KV, hd 256", 40, 40, 8, 2, 256, 1, 0, 0, 0},
    {"encoder window 12, 50 tokens, 16 / 8, hd 256", 50, 50, 16, 8, 256, 2, 12, 0, 0},
    {"encoder causal, prompt chunk at 300, 33 tokens against 333 keys, 4 / 4, hd 64", 33, 333,
     4, 4, 64, 1, 0, 300, 0},
    {"decoder, canvas 32 against 100 keys, 16 / 2, hd 512", 32, 100, 16, 2, 512, 0, 0, 68, 0},
    {"decoder, canvas 16 against 7 keys, 2 / 1, hd 6", 16, 7, 2, 1, 6, 0, 0, 0, 0},
    {"window 5, queries at 1000 against keys 0..19 (none visible)", 4, 20, 2, 1, 64, 2, 5, 1000,
     0},
    {"no keys", 3, 0, 2, 2, 64, 0, 0, 0, 0},
};

static int attention(void)
{
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (one(&shapes[k], DG_ELT_BF16))
            return 1;
    return 0;
}

/* The same shapes with fp32 q, k, v and out (fresh fp32 inputs). */
static int attention_f32(void)
{
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (one(&shapes[k], DG_ELT_F32))
            return 1;
    return 0;
}

/* ---- many sequences in one launch ---------------------------------------------- */

/* n random values of element type e: the floats (already rounded to e) in
 * f, their bytes in the returned buffer (malloc'd). */
static void *rand_elts(enum dg_elt e, float *f, size_t n, float amp)
{
    unsigned char *b = malloc(n * (size_t)dg_elt_size(e) + 1);
    for (size_t i = 0; b && i < n; i++) {
        const float x = gt_uniform() * amp;
        if (e == DG_ELT_F32) {
            f[i] = x;
            memcpy(b + 4 * i, &x, 4);
        } else {
            const uint16_t h = dg_f32_to_bf16(x);
            f[i] = dg_bf16_to_f32(h);
            memcpy(b + 2 * i, &h, 2);
        }
    }
    return b;
}

/* element i of e's bytes b as a float */
static float elt_at(enum dg_elt e, const unsigned char *b, size_t i)
{
    if (e == DG_ELT_F32) {
        float x;
        memcpy(&x, b + 4 * i, 4);
        return x;
    } else {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        return dg_bf16_to_f32(h);
    }
}

#define NSEQ 4
#define PADS 3

/* Four sequences with caches of different lengths, their new tokens
 * appended (dg_cuda_kv_append_e) and attending (dg_cuda_attention_batch_e)
 * in one launch each, against dg_ref_kv_append and dg_ref_attention per
 * sequence: the caches exactly, the outputs within the bound; guard bytes
 * after the output and after every cache, a token row of the output
 * poisoned before. */
static int batch_one(enum dg_elt e, int mask, int window, int nh, int nkv, int hd)
{
    static const int64_t len[NSEQ] = {0, 37, 5, 120}, n[NSEQ] = {9, 16, 1, 33};
    const int64_t row = (int64_t)nkv * hd, qrow = (int64_t)nh * hd;
    const size_t es = (size_t)dg_elt_size(e);
    const double bound = e == DG_ELT_F32 ? 1e-5 : 1e-2;
    struct dg_error err = {0};
    float *hk[NSEQ], *hv[NSEQ], *fq, *fkn, *fvn, *ref, *scores;
    void *dk[NSEQ], *dv[NSEQ], *bq, *bkn, *bvn, *dq, *dkn, *dvn, *dout, *dseqs, *dqs, *dqp;
    struct dg_attn_seq seqs[NSEQ + 1];
    int32_t qs[256];
    int64_t qp[256], kpos[512], T = 0, Tp, q0[NSEQ];
    unsigned char *hout, *hcache;
    double num = 0, den = 0;

    for (int i = 0; i < NSEQ; i++) {
        q0[i] = T;
        for (int64_t j = 0; j < n[i]; j++, T++) {
            qs[T] = i;
            qp[T] = len[i] + j;
        }
    }
    /* PADS tokens of the dummy sequence (no keys) after them, as a
     * forward pass pads its batch: outputs of exact zeros */
    for (Tp = T; Tp < T + PADS; Tp++) {
        qs[Tp] = NSEQ;
        qp[Tp] = 0;
    }
    fq = malloc(sizeof(float) * (size_t)(T * qrow));
    fkn = malloc(sizeof(float) * (size_t)(T * row));
    fvn = malloc(sizeof(float) * (size_t)(T * row));
    ref = calloc((size_t)(Tp * qrow), sizeof(float));
    scores = malloc(sizeof(float) * 512);
    hout = malloc((size_t)(Tp * qrow) * es + GUARD_BYTES);
    hcache = malloc((size_t)(256 * row) * es + GUARD_BYTES);
    CHECK(fq && fkn && fvn && ref && scores && hout && hcache);
    bq = rand_elts(e, fq, (size_t)(T * qrow), 1.0f);
    CHECK(bq && (bq = realloc(bq, (size_t)(Tp * qrow) * es)));
    /* the pads' queries: zeros (their outputs are zeros whatever they are) */
    memset((unsigned char *)bq + (size_t)(T * qrow) * es, 0, (size_t)(PADS * qrow) * es);
    bkn = rand_elts(e, fkn, (size_t)(T * row), 1.0f);
    bvn = rand_elts(e, fvn, (size_t)(T * row), 1.0f);
    CHECK(bq && bkn && bvn);
    dq = gt_upload(bq, (size_t)(Tp * qrow) * es, &err);
    dkn = gt_upload(bkn, (size_t)(T * row) * es, &err);
    dvn = gt_upload(bvn, (size_t)(T * row) * es, &err);
    dqs = gt_upload(qs, sizeof(int32_t) * (size_t)Tp, &err);
    dqp = gt_upload(qp, sizeof(int64_t) * (size_t)Tp, &err);
    CHECK(dq && dkn && dvn && dqs && dqp);
    for (int i = 0; i < NSEQ; i++) {
        /* a cache of 256 rows: the old ones random, the rest poisoned */
        const size_t cells = (size_t)(256 * row);
        void *bk, *bv;
        hk[i] = malloc(sizeof(float) * cells);
        hv[i] = malloc(sizeof(float) * cells);
        CHECK(hk[i] && hv[i]);
        bk = rand_elts(e, hk[i], cells, 1.0f);
        bv = rand_elts(e, hv[i], cells, 1.0f);
        CHECK(bk && bv);
        memset((unsigned char *)bk + (size_t)(len[i] * row) * es, 0xff,
               (cells - (size_t)(len[i] * row)) * es);
        memset((unsigned char *)bv + (size_t)(len[i] * row) * es, 0xff,
               (cells - (size_t)(len[i] * row)) * es);
        dk[i] = gt_out_alloc(cells * es, GUARD_BYTES, GUARD_BYTE, &err);
        dv[i] = gt_out_alloc(cells * es, GUARD_BYTES, GUARD_BYTE, &err);
        CHECK(dk[i] && dv[i]);
        CHECK_OK(dg_cuda_upload(dk[i], bk, cells * es, 0, &err), &err);
        CHECK_OK(dg_cuda_upload(dv[i], bv, cells * es, 0, &err), &err);
        free(bk);
        free(bv);
        seqs[i].k = dk[i];
        seqs[i].v = dv[i];
        seqs[i].k_start = window > 0 && len[i] > window - 1 ? len[i] - (window - 1) : 0;
        seqs[i].k_len = len[i] + n[i] - seqs[i].k_start;
    }
    seqs[NSEQ] = (struct dg_attn_seq){dk[0], dv[0], 0, 0};
    dseqs = gt_upload(seqs, sizeof seqs, &err);
    dout = gt_out_alloc((size_t)(Tp * qrow) * es, GUARD_BYTES, GUARD_BYTE, &err);
    CHECK(dseqs && dout);
    CHECK_OK(dg_cuda_kv_append_e(e, dseqs, dqs, dqp, dkn, dvn, T, row, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_attention_batch_e(e, dout, dq, dqp, dqs, Tp, dseqs, nh, nkv, hd, mask,
                                       window, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    /* the reference: append, then each sequence against its own keys */
    dg_ref_kv_append(hk, hv, qs, qp, fkn, fvn, T, row);
    for (int i = 0; i < NSEQ; i++) {
        for (int64_t j = 0; j < seqs[i].k_len; j++)
            kpos[j] = seqs[i].k_start + j;
        dg_ref_attention(ref + q0[i] * qrow, fq + q0[i] * qrow, qp + q0[i], n[i],
                         hk[i] + seqs[i].k_start * row, hv[i] + seqs[i].k_start * row, kpos,
                         seqs[i].k_len, nh, nkv, hd, (enum dg_attn_mask)mask, window, scores);
    }
    for (int i = 0; i < NSEQ; i++) {
        const size_t cells = (size_t)(256 * row);
        for (int kv = 0; kv < 2; kv++) {
            const float *h = kv ? hv[i] : hk[i];
            CHECK_OK(dg_cuda_download(hcache, kv ? dv[i] : dk[i], cells * es + GUARD_BYTES, 0,
                                      &err), &err);
            CHECKF(guard_changed(hcache, cells * es) < 0, "sequence %d: guard after its cache", i);
            for (size_t c = 0; c < (size_t)((len[i] + n[i]) * row); c++)
                CHECKF(elt_at(e, hcache, c) == h[c], "sequence %d %s cache cell %zu: %g, want %g",
                       i, kv ? "v" : "k", c, (double)elt_at(e, hcache, c), (double)h[c]);
        }
    }
    CHECK_OK(dg_cuda_download(hout, dout, (size_t)(Tp * qrow) * es + GUARD_BYTES, 0, &err),
             &err);
    CHECK(guard_changed(hout, (size_t)(Tp * qrow) * es) < 0);
    for (size_t c = 0; c < (size_t)(Tp * qrow); c++) {
        const double g = elt_at(e, hout, c), d = g - ref[c];
        CHECKF(!isnan(g), "output %zu is NaN", c);
        CHECKF(c < (size_t)(T * qrow) || g == 0.0, "pad output %zu is %g, not 0", c, g);
        num += d * d;
        den += (double)ref[c] * ref[c];
    }
    printf("# batched attention, %s, %d heads over %d of %d, mask %d window %d, %lld queries of "
           "4 sequences + %d pads: relative error %.2e\n", e == DG_ELT_F32 ? "fp32" : "bf16", nh,
           nkv, hd, mask, window, (long long)T, PADS, sqrt(num / den));
    CHECK(sqrt(num / den) <= bound);
    /* again with the work space: the keys split over more blocks
     * (bf16), the output poisoned again first */
    {
        const size_t wsb = dg_cuda_attention_batch_ws_bytes(e, Tp, nh, nkv, hd);
        void *ws = NULL;
        if (wsb) {
            ws = gt_out_alloc(wsb, GUARD_BYTES, GUARD_BYTE, &err);
            CHECK(ws);
            CHECK_OK(dg_cuda_memset(dout, 0xff, (size_t)(Tp * qrow) * es, 0, &err), &err);
            CHECK_OK(dg_cuda_attention_batch_ws_e(e, dout, dq, dqp, dqs, Tp, dseqs, nh, nkv, hd,
                                                  mask, window, ws, wsb, NULL, 0, &err),
                     &err);
            CHECK_OK(dg_cuda_download(hout, dout, (size_t)(Tp * qrow) * es + GUARD_BYTES, 0,
                                      &err), &err);
            CHECK(guard_changed(hout, (size_t)(Tp * qrow) * es) < 0);
            {
                unsigned char *hws = malloc(wsb + GUARD_BYTES);
                CHECK(hws);
                CHECK_OK(dg_cuda_download(hws, ws, wsb + GUARD_BYTES, 0, &err), &err);
                CHECK(guard_changed(hws, wsb) < 0);
                free(hws);
            }
            num = den = 0;
            for (size_t c = 0; c < (size_t)(Tp * qrow); c++) {
                const double g = elt_at(e, hout, c), d = g - ref[c];
                CHECKF(!isnan(g), "output %zu is NaN (split keys)", c);
                CHECKF(c < (size_t)(T * qrow) || g == 0.0, "pad output %zu is %g, not 0", c, g);
                num += d * d;
                den += (double)ref[c] * ref[c];
            }
            printf("#   with the keys split (%zu bytes of work space): relative error %.2e\n",
                   wsb, sqrt(num / den));
            CHECK(sqrt(num / den) <= bound);
            dg_cuda_free(ws);
        }
    }
    /* bf16 at the tensor cores' head sizes: each form of S = Q K^T forced
     * (mma.sync; wgmma where the device has it, else refused), with and
     * without the keys split, the output poisoned again first */
    if (e == DG_ELT_BF16 && dg_cuda_attention_tc_fits(hd)) {
        const size_t wsb = dg_cuda_attention_tc_scratch(Tp, nh, nkv, hd);
        void *ws = wsb ? gt_out_alloc(wsb, GUARD_BYTES, GUARD_BYTE, &err) : NULL;
        CHECK(!wsb || ws);
        for (int form = DG_ATTN_TC_MMA; form <= DG_ATTN_TC_WS; form++)
            for (int split = 0; split < 2; split++) {
                int rc1;
                if (split && !wsb)
                    continue;
                CHECK_OK(dg_cuda_memset(dout, 0xff, (size_t)(Tp * qrow) * es, 0, &err), &err);
                rc1 = dg_cuda_attention_tc_form((enum dg_attn_tc_form)form, dout, dq, dqp, dqs,
                                                Tp, dseqs, nh, nkv, hd, mask, window,
                                                split ? ws : NULL, split ? wsb : 0, NULL, 0,
                                                &err);
                if (rc1 == -DG_E_UNSUPPORTED && form >= DG_ATTN_TC_WGMMA) {
                    printf("#   wgmma forms: refused on this device (%s)\n", err.msg);
                    break;
                }
                CHECK_OK(rc1, &err);
                CHECK_OK(dg_cuda_download(hout, dout, (size_t)(Tp * qrow) * es + GUARD_BYTES, 0,
                                          &err), &err);
                CHECK(guard_changed(hout, (size_t)(Tp * qrow) * es) < 0);
                num = den = 0;
                for (size_t c = 0; c < (size_t)(Tp * qrow); c++) {
                    const double g = elt_at(e, hout, c), d = g - ref[c];
                    CHECKF(!isnan(g), "output %zu is NaN (form %d, split %d)", c, form, split);
                    CHECKF(c < (size_t)(T * qrow) || g == 0.0, "pad output %zu is %g, not 0", c,
                           g);
                    num += d * d;
                    den += (double)ref[c] * ref[c];
                }
                printf("#   %s form%s: relative error %.2e\n",
                       form == DG_ATTN_TC_MMA     ? "mma.sync"
                       : form == DG_ATTN_TC_WGMMA ? "wgmma"
                                                  : "warp-specialised wgmma",
                       split ? ", keys split" : "", sqrt(num / den));
                CHECK(sqrt(num / den) <= bound);
            }
        dg_cuda_free(ws);
    }
    for (int i = 0; i < NSEQ; i++) {
        dg_cuda_free(dk[i]);
        dg_cuda_free(dv[i]);
        free(hk[i]);
        free(hv[i]);
    }
    dg_cuda_free(dq);
    dg_cuda_free(dkn);
    dg_cuda_free(dvn);
    dg_cuda_free(dqs);
    dg_cuda_free(dqp);
    dg_cuda_free(dseqs);
    dg_cuda_free(dout);
    free(bq);
    free(bkn);
    free(bvn);
    free(fq);
    free(fkn);
    free(fvn);
    free(ref);
    free(scores);
    free(hout);
    free(hcache);
    return 0;
}

static int batch(void)
{
    /* heads over KV heads of head size: bf16 at these sizes takes the
     * tensor-core kernel (attention-tc.cu), fp32 and hd 48 the other */
    static const int bshapes[][3] = {{8, 2, 64}, {16, 8, 256}, {16, 2, 512}, {4, 4, 128},
                                    {6, 3, 48}};
    for (size_t i = 0; i < sizeof bshapes / sizeof bshapes[0]; i++)
        for (int e = 0; e < 2; e++) {
            const int nh = bshapes[i][0], nkv = bshapes[i][1], hd = bshapes[i][2];
            if (e == DG_ELT_F32 && i > 0 && i < 4)
                continue; /* fp32 takes the same kernel at every size */
            CHECK(batch_one((enum dg_elt)e, 1, 0, nh, nkv, hd) == 0); /* encoder, full layer */
            CHECK(batch_one((enum dg_elt)e, 2, 5, nh, nkv, hd) == 0); /* encoder, window 5 */
            CHECK(batch_one((enum dg_elt)e, 0, 0, nh, nkv, hd) == 0); /* decoder, full layer */
            CHECK(batch_one((enum dg_elt)e, 0, 5, nh, nkv, hd) == 0); /* decoder, a window's rows */
        }
    return 0;
}

static int refusals(void)
{
    struct dg_error err = {0};
    CHECK(dg_cuda_attention(NULL, NULL, NULL, 2, NULL, NULL, NULL, 2, 4, 3, 64, 0, 0, NULL, 0,
                            &err) == -DG_E_INVAL); /* 4 heads over 3 */
    CHECK(dg_cuda_attention(NULL, NULL, NULL, 2, NULL, NULL, NULL, 2, 4, 2, 1024, 0, 0, NULL, 0,
                            &err) == -DG_E_INVAL); /* hd > 512 */
    CHECK(dg_cuda_attention(NULL, NULL, NULL, 2, NULL, NULL, NULL, 2, 4, 2, 64, 2, 0, NULL, 0,
                            &err) == -DG_E_INVAL); /* a window of 0 */
    CHECK(dg_cuda_attention_e(DG_ELT_F32, NULL, NULL, NULL, 2, NULL, NULL, NULL, 2, 4, 3, 64, 0,
                              0, NULL, 0, &err) == -DG_E_INVAL); /* 4 heads over 3, fp32 */
    CHECK_FAILS(dg_cuda_attention_e((enum dg_elt)7, NULL, NULL, NULL, 2, NULL, NULL, NULL, 2, 4,
                                    2, 64, 0, 0, NULL, 0, &err),
                &err, DG_E_INVAL, "element type 7");
    CHECK_FAILS(dg_cuda_attention_e((enum dg_elt)7, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, 4,
                                    2, 64, 0, 0, NULL, 0, &err),
                &err, DG_E_INVAL, "element type 7"); /* even with nothing to do */
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-attention");
    if (rc)
        return rc;
    gt_seed(0x6a09e667f3bcc909ull);
    TEST_CASE(attention);
    TEST_CASE(attention_f32);
    TEST_CASE(batch);
    TEST_CASE(refusals);
    return test_finish();
}
