/*
 * Description: the row-wise kernels (RMSNorm, RMSNorm + residual add,
 * embedding gather over a vocabulary slice, RoPE, the feed-forward block's
 * combine) against their plain-C references on fresh random inputs at
 * several shapes (sizes that are not multiples of the block sizes among
 * them).  Every output buffer is poisoned (NaN) before the launch (in-place
 * ones hold their input) and followed by guard words that must come back
 * untouched; the bound is METHOD.md's for bf16:
 * ||out - ref|| / ||ref|| <= 1e-2, never a NaN.  Each shape's error is
 * printed ("# ...").  Exit 77 where there is no GPU.
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

#define GUARD 256                   /* bf16 words after every output */
#define GUARD_WORD 0xa5a5u
#define POISON_BYTE 0xff            /* 0xffff: a bf16 NaN */
#define BOUND 1e-2

/* A device buffer of n bf16 words plus the guard, poisoned, guard set. */
static uint16_t *out_buf(size_t n, struct dg_error *err)
{
    void *d = NULL;
    uint16_t guard[GUARD];
    for (int i = 0; i < GUARD; i++)
        guard[i] = GUARD_WORD;
    if (dg_cuda_alloc(&d, (n + GUARD) * 2, 0, err) < 0)
        return NULL;
    if (dg_cuda_memset(d, POISON_BYTE, n * 2, 0, err) < 0 ||
        dg_cuda_upload((uint16_t *)d + n, guard, sizeof guard, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* Bring back n words and the guard; compare with ref.  Returns the
 * relative error, or -1 (NaN, a guard word changed, a copy failed). */
static double compare(const uint16_t *d, size_t n, const float *ref, const char *what)
{
    struct dg_error err = {0};
    uint16_t *h = malloc((n + GUARD) * 2);
    double num = 0, den = 0;
    if (!h || dg_cuda_sync(0, &err) < 0 || dg_cuda_download(h, d, (n + GUARD) * 2, 0, &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        free(h);
        return -1;
    }
    for (size_t i = 0; i < GUARD; i++)
        if (h[n + i] != GUARD_WORD) {
            printf("# %s: guard word %zu after the output changed\n", what, i);
            free(h);
            return -1;
        }
    for (size_t i = 0; i < n; i++) {
        const double o = dg_bf16_to_f32(h[i]), r = ref[i];
        if (isnan(o)) {
            printf("# %s: NaN at %zu (poison left or computed)\n", what, i);
            free(h);
            return -1;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    free(h);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- cases -------------------------------------------------------------------- */

static const struct {
    int64_t rows;
    int dim;
} NORM_SHAPES[] = {{1, 5}, {7, 256}, {33, 1000}, {64, 2816}, {3, 5376}, {300, 257}};

static int rmsnorm(void)
{
    for (size_t k = 0; k < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; k++) {
        const int64_t R = NORM_SHAPES[k].rows;
        const int D = NORM_SHAPES[k].dim;
        const size_t n = (size_t)R * D;
        struct dg_error err = {0};
        uint16_t *hx, *hw, *dx, *dw, *dy;
        float *fx, *fw, *ref = malloc(n * sizeof *ref);
        char what[96];
        double e;
        CHECK(ref && gt_rand_bf16(n, 3.0f, &hx, &fx) == 0 && gt_rand_bf16((size_t)D, 1.5f, &hw, &fw) == 0);
        dx = gt_upload(hx, (n) * 2, &err);
        dw = gt_upload(hw, ((size_t)D) * 2, &err);
        dy = out_buf(n, &err);
        CHECKF(dx && dw && dy, "%s", err.msg);
        for (int scaled = 0; scaled < 2; scaled++) {
            dg_ref_rmsnorm(ref, fx, scaled ? fw : NULL, R, D, 1e-6f);
            CHECK_OK(dg_cuda_rmsnorm(dy, dx, scaled ? dw : NULL, R, D, 1e-6f, NULL, 0, &err),
                     &err);
            snprintf(what, sizeof what, "rmsnorm %lld x %d%s", (long long)R, D,
                     scaled ? "" : " (no weight)");
            e = compare(dy, n, ref, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e >= 0 && e <= BOUND, "%s: %.3e", what, e);
        }
        /* in place */
        dg_ref_rmsnorm(ref, fx, fw, R, D, 1e-6f);
        CHECK_OK(dg_cuda_rmsnorm(dx, dx, dw, R, D, 1e-6f, NULL, 0, &err), &err);
        {
            uint16_t *hy = malloc(n * 2);
            double num = 0, den = 0;
            CHECK(hy && dg_cuda_sync(0, &err) == 0 && dg_cuda_download(hy, dx, n * 2, 0, &err) == 0);
            for (size_t i = 0; i < n; i++) {
                const double d = dg_bf16_to_f32(hy[i]) - ref[i];
                num += d * d;
                den += (double)ref[i] * ref[i];
            }
            free(hy);
            CHECKF(sqrt(num / den) <= BOUND, "in place: %.3e", sqrt(num / den));
        }
        dg_cuda_free(dx);
        dg_cuda_free(dw);
        dg_cuda_free(dy);
        free(hx);
        free(fx);
        free(hw);
        free(fw);
        free(ref);
    }
    return 0;
}

static int rmsnorm_add(void)
{
    for (size_t k = 0; k < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; k++) {
        const int64_t R = NORM_SHAPES[k].rows;
        const int D = NORM_SHAPES[k].dim;
        const size_t n = (size_t)R * D;
        const float scale = 0.625f;
        struct dg_error err = {0};
        uint16_t *hx, *hw, *hr, *dx, *dw, *dr;
        float *fx, *fw, *fr, *ref = malloc(n * sizeof *ref);
        char what[96];
        double e;
        CHECK(ref && gt_rand_bf16(n, 3.0f, &hx, &fx) == 0 && gt_rand_bf16((size_t)D, 1.5f, &hw, &fw) == 0 &&
              gt_rand_bf16(n, 2.0f, &hr, &fr) == 0);
        dx = gt_upload(hx, (n) * 2, &err);
        dw = gt_upload(hw, ((size_t)D) * 2, &err);
        dr = out_buf(n, &err);
        CHECKF(dx && dw && dr && dg_cuda_upload(dr, hr, n * 2, 0, &err) == 0, "%s", err.msg);
        dg_ref_rmsnorm(ref, fx, fw, R, D, 1e-6f);
        for (size_t i = 0; i < n; i++)
            ref[i] = fr[i] + ref[i] * scale;
        CHECK_OK(dg_cuda_rmsnorm_add(dr, dx, dw, R, D, 1e-6f, scale, NULL, 0, &err), &err);
        snprintf(what, sizeof what, "rmsnorm_add %lld x %d", (long long)R, D);
        e = compare(dr, n, ref, what);
        printf("# %s: relative error %.2e\n", what, e);
        CHECKF(e >= 0 && e <= BOUND, "%s: %.3e", what, e);
        dg_cuda_free(dx);
        dg_cuda_free(dw);
        dg_cuda_free(dr);
        free(hx);
        free(fx);
        free(hw);
        free(fw);
        free(hr);
        free(fr);
        free(ref);
    }
    return 0;
}

static int embed(void)
{
    static const struct {
        int64_t T, v0, n_rows;
        int dim;
    } shapes[] = {{1, 0, 512, 5}, {17, 100, 300, 2816}, {129, 256, 256, 1000}, {40, 0, 263, 64}};
    const int64_t V = 600;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T, v0 = shapes[k].v0, nr = shapes[k].n_rows;
        const int D = shapes[k].dim;
        const size_t n = (size_t)T * D;
        const float scale = sqrtf((float)D);
        struct dg_error err = {0};
        struct dg_weight E;
        uint16_t *he, *de, *dy;
        float *fe, *ref = malloc(n * sizeof *ref);
        int32_t *ids = malloc((size_t)T * sizeof *ids);
        void *dids = NULL;
        char what[96];
        double e;
        CHECK(ref && ids && gt_rand_bf16((size_t)nr * D, 0.05f, &he, &fe) == 0);
        for (int64_t t = 0; t < T; t++)
            ids[t] = (int32_t)(gt_next() % (uint64_t)V);
        ids[0] = (int32_t)v0; /* the first row of the slice, */
        if (T > 1)
            ids[T - 1] = (int32_t)(v0 + nr - 1); /* its last, */
        if (T > 2)
            ids[1] = (int32_t)(v0 + nr); /* and the first one past it */
        memset(&E, 0, sizeof E);
        E.data = he;
        E.dtype = DG_DTYPE_BF16;
        E.rows = nr;
        E.cols = D;
        dg_ref_embed(ref, ids, T, &E, v0, scale);
        de = gt_upload(he, ((size_t)nr * D) * 2, &err);
        dy = out_buf(n, &err);
        CHECKF(de && dy && dg_cuda_alloc(&dids, (size_t)T * 4, 0, &err) == 0 &&
                   dg_cuda_upload(dids, ids, (size_t)T * 4, 0, &err) == 0,
               "%s", err.msg);
        CHECK_OK(dg_cuda_embed(dy, dids, T, de, v0, nr, D, scale, NULL, 0, &err), &err);
        snprintf(what, sizeof what, "embed %lld tokens, rows [%lld, %lld) of %d", (long long)T,
                 (long long)v0, (long long)(v0 + nr), D);
        e = compare(dy, n, ref, what);
        printf("# %s: relative error %.2e\n", what, e);
        CHECKF(e >= 0 && e <= BOUND, "%s: %.3e", what, e);
        dg_cuda_free(de);
        dg_cuda_free(dy);
        dg_cuda_free(dids);
        free(he);
        free(fe);
        free(ids);
        free(ref);
    }
    return 0;
}

static int rope(void)
{
    static const struct {
        int64_t T;
        int heads, hd, zero_from; /* inv_freq[i] = 0 for i >= zero_from (proportional RoPE) */
    } shapes[] = {{1, 1, 64, 32}, {9, 8, 256, 128}, {40, 16, 256, 64}, {5, 2, 512, 64},
                  {33, 3, 6, 3}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int nh = shapes[k].heads, hd = shapes[k].hd;
        const size_t n = (size_t)T * nh * hd;
        struct dg_error err = {0};
        uint16_t *hx, *dx;
        float *fx, *inv = malloc((size_t)hd / 2 * sizeof *inv);
        int64_t *pos = malloc((size_t)T * sizeof *pos);
        void *dpos = NULL, *dinv = NULL;
        char what[96];
        double e;
        CHECK(inv && pos && gt_rand_bf16(n, 2.0f, &hx, &fx) == 0);
        for (int i = 0; i < hd / 2; i++)
            inv[i] = i < shapes[k].zero_from ? powf(10000.0f, -2.0f * (float)i / (float)hd) : 0.0f;
        for (int64_t t = 0; t < T; t++)
            pos[t] = t == 0 ? 0 : (int64_t)((gt_uniform() + 1.0f) * 60000.0f) + t;
        for (int64_t t = 0; t < T; t++)
            dg_ref_rope(fx + (size_t)t * nh * hd, nh, hd, inv, pos[t]);
        dx = out_buf(n, &err);
        CHECKF(dx && dg_cuda_upload(dx, hx, n * 2, 0, &err) == 0 &&
                   dg_cuda_alloc(&dpos, (size_t)T * 8, 0, &err) == 0 &&
                   dg_cuda_upload(dpos, pos, (size_t)T * 8, 0, &err) == 0 &&
                   dg_cuda_alloc(&dinv, (size_t)hd / 2 * 4, 0, &err) == 0 &&
                   dg_cuda_upload(dinv, inv, (size_t)hd / 2 * 4, 0, &err) == 0,
               "%s", err.msg);
        CHECK_OK(dg_cuda_rope(dx, dpos, T, nh, hd, dinv, NULL, 0, &err), &err);
        snprintf(what, sizeof what, "rope %lld tokens x %d heads x %d", (long long)T, nh, hd);
        e = compare(dx, n, fx, what);
        printf("# %s: relative error %.2e\n", what, e);
        CHECKF(e >= 0 && e <= BOUND, "%s: %.3e", what, e);
        dg_cuda_free(dx);
        dg_cuda_free(dpos);
        dg_cuda_free(dinv);
        free(hx);
        free(fx);
        free(inv);
        free(pos);
    }
    return 0;
}

/* The end of the feed-forward block: fp32 dense and MoE rows, bf16 weights,
 * the bf16 residual x updated in place (uploaded into a guarded buffer);
 * dense and moe must come back unchanged. */
static int ffn_combine(void)
{
    static const struct {
        int64_t rows;
        int dim;
    } shapes[] = {{1, 48}, {7, 333}, {33, 2816}, {1, 1}, {3, 8192}, {130, 1000}, {5, 5376}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t R = shapes[k].rows;
        const int D = shapes[k].dim;
        const size_t n = (size_t)R * D;
        const float scale = 0.8125f, eps = 1e-6f;
        struct dg_error err = {0};
        uint16_t *hx, *hw1, *hw2, *hw, *dx, *dw1, *dw2, *dw;
        float *fx, *fw1, *fw2, *fw, *dd, *dm;
        float *fd = malloc(n * sizeof *fd), *fm = malloc(n * sizeof *fm);
        float *rd = malloc(n * sizeof *rd), *rm = malloc(n * sizeof *rm);
        float *back = malloc(n * sizeof *back);
        char what[96];
        double e;
        CHECK(fd && fm && rd && rm && back && gt_rand_bf16(n, 2.0f, &hx, &fx) == 0 &&
              gt_rand_bf16((size_t)D, 1.5f, &hw1, &fw1) == 0 &&
              gt_rand_bf16((size_t)D, 1.5f, &hw2, &fw2) == 0 &&
              gt_rand_bf16((size_t)D, 1.5f, &hw, &fw) == 0);
        /* full fp32 values, the two of different magnitudes */
        for (size_t i = 0; i < n; i++) {
            fd[i] = gt_uniform() * 40.0f;
            fm[i] = gt_uniform() * 0.03f;
        }
        memcpy(rd, fd, n * sizeof *fd);
        memcpy(rm, fm, n * sizeof *fm);
        dd = gt_upload(fd, n * sizeof *fd, &err);
        dm = gt_upload(fm, n * sizeof *fm, &err);
        dw1 = gt_upload(hw1, (size_t)D * 2, &err);
        dw2 = gt_upload(hw2, (size_t)D * 2, &err);
        dw = gt_upload(hw, (size_t)D * 2, &err);
        dx = out_buf(n, &err);
        CHECKF(dd && dm && dw1 && dw2 && dw && dx && dg_cuda_upload(dx, hx, n * 2, 0, &err) == 0,
               "%s", err.msg);
        dg_ref_ffn_combine(fx, rd, rm, fw1, fw2, fw, R, D, eps, scale);
        CHECK_OK(dg_cuda_ffn_combine(dx, dd, dm, dw1, dw2, dw, R, D, eps, scale, NULL, 0, &err),
                 &err);
        snprintf(what, sizeof what, "ffn_combine %lld x %d", (long long)R, D);
        e = compare(dx, n, fx, what);
        printf("# %s: relative error %.2e\n", what, e);
        CHECKF(e >= 0 && e <= BOUND, "%s: %.3e", what, e);
        CHECKF(dg_cuda_download(back, dd, n * sizeof *back, 0, &err) == 0 &&
                   memcmp(back, fd, n * sizeof *back) == 0 &&
                   dg_cuda_download(back, dm, n * sizeof *back, 0, &err) == 0 &&
                   memcmp(back, fm, n * sizeof *back) == 0,
               "%s: dense or moe changed %s", what, err.msg);
        dg_cuda_free(dd);
        dg_cuda_free(dm);
        dg_cuda_free(dw1);
        dg_cuda_free(dw2);
        dg_cuda_free(dw);
        dg_cuda_free(dx);
        free(hx);
        free(fx);
        free(hw1);
        free(fw1);
        free(hw2);
        free(fw2);
        free(hw);
        free(fw);
        free(fd);
        free(fm);
        free(rd);
        free(rm);
        free(back);
    }
    {
        struct dg_error err = {0};
        CHECK(dg_cuda_ffn_combine(NULL, NULL, NULL, NULL, NULL, NULL, 4, 0, 1e-6f, 1.0f, NULL, 0,
                                  &err) == -DG_E_INVAL);
        CHECK(strstr(err.msg, "GPU 0") != NULL);
        CHECK(dg_cuda_ffn_combine(NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-6f, 1.0f, NULL, 0,
                                  &err) == 0);
    }
    return 0;
}

/* Bad shapes are refused before a launch, with the GPU named. */
static int refusals(void)
{
    struct dg_error err = {0};
    CHECK(dg_cuda_rmsnorm(NULL, NULL, NULL, 4, 0, 1e-6f, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(strstr(err.msg, "GPU 0") != NULL);
    CHECK(dg_cuda_rope(NULL, NULL, 3, 2, 7, NULL, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(dg_cuda_embed(NULL, NULL, 3, NULL, 0, 10, 0, 1.0f, NULL, 0, &err) == -DG_E_INVAL);
    /* nothing to do is not an error */
    CHECK(dg_cuda_rmsnorm(NULL, NULL, NULL, 0, 8, 1e-6f, NULL, 0, &err) == 0);
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-rows");
    if (rc)
        return rc;
    gt_seed(0x853c49e6748fea9bull);
    TEST_CASE(rmsnorm);
    TEST_CASE(rmsnorm_add);
    TEST_CASE(embed);
    TEST_CASE(rope);
    TEST_CASE(ffn_combine);
    TEST_CASE(refusals);
    return test_finish();
}
