/*
 * Description: the attention kernel against dg_ref_attention on fresh
 * random inputs: encoder mode (causal; causal within a sliding window),
 * decoder mode (a canvas against prefix keys and itself, no mask), head
 * sizes 6, 64, 256 and 512, grouped-query attention (1, 2, 4, 8 query
 * heads per KV head), keys not a multiple of the warps, a query that sees
 * no key (zeros), no keys at all.  Outputs poisoned (NaN) before the
 * launch and guard words after them checked; bf16 bound
 * ||out - ref|| / ||ref|| <= 1e-2, never a NaN.  Exit 77 where there is
 * no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 256
#define GUARD_WORD 0x5a5au

/* n random bf16 values (bits in h, floats in f) */
static void fill(uint16_t *h, float *f, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = dg_f32_to_bf16(gt_uniform() * amp);
        f[i] = dg_bf16_to_f32(h[i]);
    }
}

struct shape {
    const char *what;
    int64_t Tq, Tk;
    int nh, nkv, hd, mask, window;
    int64_t q0, k0;     /* first positions: query t at q0 + t, key j at k0 + j */
};

static int one(const struct shape *s)
{
    const size_t nq = (size_t)s->Tq * s->nh * s->hd, nk = (size_t)s->Tk * s->nkv * s->hd;
    struct dg_error err = {0};
    uint16_t *hq = malloc(nq * 2 + 2), *hk = malloc(nk * 2 + 2), *hv = malloc(nk * 2 + 2);
    uint16_t *ho = malloc((nq + GUARD) * 2);
    float *fq = malloc(nq * 4 + 4), *fk = malloc(nk * 4 + 4), *fv = malloc(nk * 4 + 4);
    float *ref = malloc(nq * 4 + 4), *scores = malloc((size_t)(s->Tk + 1) * 4);
    int64_t *qp = malloc((size_t)s->Tq * 8), *kp = malloc((size_t)(s->Tk + 1) * 8);
    void *dq, *dk, *dv, *dqp, *dkp, *dout = NULL;
    double num = 0, den = 0;

    CHECK(hq && hk && hv && ho && fq && fk && fv && ref && scores && qp && kp);
    fill(hq, fq, nq, 1.0f);
    fill(hk, fk, nk, 1.0f);
    fill(hv, fv, nk, 2.0f);
    for (int64_t t = 0; t < s->Tq; t++)
        qp[t] = s->q0 + t;
    for (int64_t j = 0; j < s->Tk; j++)
        kp[j] = s->k0 + j;
    dg_ref_attention(ref, fq, qp, s->Tq, fk, fv, kp, s->Tk, s->nh, s->nkv, s->hd,
                     (enum dg_attn_mask)s->mask, s->window, scores);
    dq = gt_upload(hq, nq * 2, &err);
    dk = gt_upload(hk, nk * 2, &err);
    dv = gt_upload(hv, nk * 2, &err);
    dqp = gt_upload(qp, (size_t)s->Tq * 8, &err);
    dkp = gt_upload(kp, (size_t)s->Tk * 8, &err);
    for (int i = 0; i < GUARD; i++)
        ho[nq + (size_t)i] = GUARD_WORD;
    CHECKF(dq && dk && dv && dqp && dkp && dg_cuda_alloc(&dout, (nq + GUARD) * 2, 0, &err) == 0 &&
               dg_cuda_memset(dout, 0xff, nq * 2, 0, &err) == 0 &&
               dg_cuda_upload((uint16_t *)dout + nq, ho + nq, GUARD * 2, 0, &err) == 0,
           "%s", err.msg);
    CHECK_OK(dg_cuda_attention(dout, dq, dqp, s->Tq, dk, dv, dkp, s->Tk, s->nh, s->nkv, s->hd,
                               s->mask, s->window, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(ho, dout, (nq + GUARD) * 2, 0, &err), &err);
    for (int i = 0; i < GUARD; i++)
        CHECKF(ho[nq + (size_t)i] == GUARD_WORD, "%s: guard word %d changed", s->what, i);
    for (size_t i = 0; i < nq; i++) {
        const double o = dg_bf16_to_f32(ho[i]);
        CHECKF(!isnan(o), "%s: NaN at %zu", s->what, i);
        num += (o - ref[i]) * (o - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) {
        printf("# attention %s: all zeros, as the reference (%s)\n", s->what,
               num == 0 ? "equal" : "DIFFERENT");
        CHECK(num == 0);
    } else {
        printf("# attention %s: relative error %.2e\n", s->what, sqrt(num / den));
        CHECKF(sqrt(num / den) <= 1e-2, "%s: %.3e", s->what, sqrt(num / den));
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

static int attention(void)
{
    static const struct shape shapes[] = {
        {"encoder causal, 40 tokens, 8 heads / 2 KV, hd 256", 40, 40, 8, 2, 256, 1, 0, 0, 0},
        {"encoder window 12, 50 tokens, 16 / 8, hd 256", 50, 50, 16, 8, 256, 2, 12, 0, 0},
        {"encoder causal, prompt chunk at 300, 33 tokens against 333 keys, 4 / 4, hd 64", 33,
         333, 4, 4, 64, 1, 0, 300, 0},
        {"decoder, canvas 32 against 100 keys, 16 / 2, hd 512", 32, 100, 16, 2, 512, 0, 0, 68,
         0},
        {"decoder, canvas 16 against 7 keys, 2 / 1, hd 6", 16, 7, 2, 1, 6, 0, 0, 0, 0},
        {"window 5, queries at 1000 against keys 0..19 (none visible)", 4, 20, 2, 1, 64, 2, 5,
         1000, 0},
        {"no keys", 3, 0, 2, 2, 64, 0, 0, 0, 0},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (one(&shapes[k]))
            return 1;
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
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-attention");
    if (rc)
        return rc;
    gt_seed(0x6a09e667f3bcc909ull);
    TEST_CASE(attention);
    TEST_CASE(refusals);
    return test_finish();
}
