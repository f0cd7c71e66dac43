/*
 * Description: the row-wise kernels (RMSNorm, RMSNorm + residual add,
 * the add followed by up to three norms of the new residual, embedding
 * gather over a vocabulary slice, the gather of rows from anywhere
 * (exact: a copy), RoPE, the per-head norms and RoPE of q, k and v in one
 * pass, the feed-forward block's combine) against their plain-C
 * references on fresh random inputs at
 * several shapes (sizes that are not multiples of the block sizes among
 * them), each with bf16 and with fp32 elements (the _e forms).  Every
 * output buffer is poisoned (NaN) before the launch (in-place ones hold
 * their input) and followed by guard bytes that must come back untouched;
 * the bound on ||out - ref|| / ||ref|| is METHOD.md's 1e-2 for bf16 and
 * 1e-5 for fp32, never a NaN.  Each shape's error is printed ("# ...", the
 * fp32 runs marked "f32").  Exit 77 where there is no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/fp8.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 256                   /* elements after every output */
#define GUARD_BYTE 0xa5
#define POISON_BYTE 0xff            /* 0xffff, 0xffffffff: a bf16, an fp32 NaN */
#define BAD_ELT ((enum dg_elt)7)

/* The element types every case runs with. */
static const enum dg_elt ELTS[] = {DG_ELT_BF16, DG_ELT_F32};
#define N_ELTS (sizeof ELTS / sizeof ELTS[0])

/* The bound on the relative error, and the tag in the printed names. */
static double bound(enum dg_elt e)
{
    return e == DG_ELT_F32 ? 1e-5 : 1e-2;
}

static const char *tag(enum dg_elt e)
{
    return e == DG_ELT_F32 ? " f32" : "";
}

/* Element i of a host buffer of type e. */
static float elt_get(enum dg_elt e, const void *h, size_t i)
{
    return e == DG_ELT_F32 ? ((const float *)h)[i] : dg_bf16_to_f32(((const uint16_t *)h)[i]);
}

/* A device buffer of n elements of type e plus the guard, poisoned, guard
 * set; with init, the n elements then hold init's. */
static void *out_buf(enum dg_elt e, size_t n, const void *init, struct dg_error *err)
{
    const size_t sz = (size_t)dg_elt_size(e);
    void *d = NULL;
    if (dg_cuda_alloc(&d, (n + GUARD) * sz, 0, err) < 0)
        return NULL;
    if (dg_cuda_memset(d, POISON_BYTE, n * sz, 0, err) < 0 ||
        dg_cuda_memset((char *)d + n * sz, GUARD_BYTE, GUARD * sz, 0, err) < 0 ||
        (init && dg_cuda_upload(d, init, n * sz, 0, err) < 0)) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* Bring back n elements of type e and the guard; compare with ref.
 * Returns the relative error, or -1 (NaN, a guard byte changed, a copy
 * failed). */
static double compare(enum dg_elt e, const void *d, size_t n, const float *ref, const char *what)
{
    const size_t sz = (size_t)dg_elt_size(e);
    struct dg_error err = {0};
    unsigned char *h = malloc((n + GUARD) * sz);
    double num = 0, den = 0;
    if (!h || dg_cuda_sync(0, &err) < 0 ||
        dg_cuda_download(h, d, (n + GUARD) * sz, 0, &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        free(h);
        return -1;
    }
    for (size_t i = 0; i < GUARD * sz; i++)
        if (h[n * sz + i] != GUARD_BYTE) {
            printf("# %s: guard byte %zu after the output changed\n", what, i);
            free(h);
            return -1;
        }
    for (size_t i = 0; i < n; i++) {
        const double o = elt_get(e, h, i), r = ref[i];
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
} NORM_SHAPES[] = {{1, 5},     {7, 256},     {33, 1000}, {64, 2816},
                   {5, 1024},  {130, 4096},  {3, 5376},  {300, 257}};

static int rmsnorm(void)
{
    for (size_t k = 0; k < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const size_t sz = (size_t)dg_elt_size(el);
            const int64_t R = NORM_SHAPES[k].rows;
            const int D = NORM_SHAPES[k].dim;
            const size_t n = (size_t)R * D;
            struct dg_error err = {0};
            void *hx, *hw, *dx, *dw, *dy;
            float *fx, *fw, *ref = malloc(n * sizeof *ref);
            char what[96];
            double e;
            CHECK(ref && gt_rand_elts(el, n, 3.0f, &hx, &fx) == 0 &&
                  gt_rand_elts(el, (size_t)D, 1.5f, &hw, &fw) == 0);
            dx = out_buf(el, n, hx, &err);
            dw = gt_upload(hw, (size_t)D * sz, &err);
            dy = out_buf(el, n, NULL, &err);
            CHECKF(dx && dw && dy, "%s", err.msg);
            for (int scaled = 0; scaled < 2; scaled++) {
                dg_ref_rmsnorm(ref, fx, scaled ? fw : NULL, R, D, 1e-6f);
                CHECK_OK(dg_cuda_rmsnorm_e(el, dy, dx, scaled ? dw : NULL, R, D, 1e-6f, NULL, 0,
                                           &err),
                         &err);
                snprintf(what, sizeof what, "rmsnorm%s %lld x %d%s", tag(el), (long long)R, D,
                         scaled ? "" : " (no weight)");
                e = compare(el, dy, n, ref, what);
                printf("# %s: relative error %.2e\n", what, e);
                CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
            }
            /* in place */
            dg_ref_rmsnorm(ref, fx, fw, R, D, 1e-6f);
            CHECK_OK(dg_cuda_rmsnorm_e(el, dx, dx, dw, R, D, 1e-6f, NULL, 0, &err), &err);
            snprintf(what, sizeof what, "rmsnorm%s %lld x %d in place", tag(el), (long long)R,
                     D);
            e = compare(el, dx, n, ref, what);
            CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
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
    for (size_t k = 0; k < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const size_t sz = (size_t)dg_elt_size(el);
            const int64_t R = NORM_SHAPES[k].rows;
            const int D = NORM_SHAPES[k].dim;
            const size_t n = (size_t)R * D;
            const float scale = 0.625f;
            struct dg_error err = {0};
            void *hx, *hw, *hr, *dx, *dw, *dr;
            float *fx, *fw, *fr, *ref = malloc(n * sizeof *ref);
            char what[96];
            double e;
            CHECK(ref && gt_rand_elts(el, n, 3.0f, &hx, &fx) == 0 &&
                  gt_rand_elts(el, (size_t)D, 1.5f, &hw, &fw) == 0 &&
                  gt_rand_elts(el, n, 2.0f, &hr, &fr) == 0);
            dx = gt_upload(hx, n * sz, &err);
            dw = gt_upload(hw, (size_t)D * sz, &err);
            dr = out_buf(el, n, hr, &err);
            CHECKF(dx && dw && dr, "%s", err.msg);
            dg_ref_rmsnorm(ref, fx, fw, R, D, 1e-6f);
            for (size_t i = 0; i < n; i++)
                ref[i] = fr[i] + ref[i] * scale;
            CHECK_OK(dg_cuda_rmsnorm_add_e(el, dr, dx, dw, R, D, 1e-6f, scale, NULL, 0, &err),
                     &err);
            snprintf(what, sizeof what, "rmsnorm_add%s %lld x %d", tag(el), (long long)R, D);
            e = compare(el, dr, n, ref, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
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

/* bytes of n elements of type e on the device, equal to those at d2 */
static int same_bytes(enum dg_elt e, const void *d1, const void *d2, size_t n)
{
    const size_t bytes = n * (size_t)dg_elt_size(e);
    struct dg_error err = {0};
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    int same = a && b && dg_cuda_sync(0, &err) == 0 && dg_cuda_download(a, d1, bytes, 0, &err) == 0 &&
               dg_cuda_download(b, d2, bytes, 0, &err) == 0 && memcmp(a, b, bytes) == 0;
    free(a);
    free(b);
    return same;
}

/* The add followed by n_out norms of the new residual in one launch,
 * against the references composed (the residual rounded to the element
 * type before its norms, as it is stored) and, bit for bit, against the
 * separate kernels run one after another on a copy.  Output 1 has no
 * weight.  bf16 also in the scaled form (dg_cuda_rmsnorm_add_norms_scaled):
 * x then the scaling pass's values of random FP8 sums and scales, the
 * same checks on those values. */
static int rmsnorm_add_norms(void)
{
    for (size_t k = 0; k < sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++)
            for (int v = 0; v < 8; v++) {
                const int n_out = v / 2, scaled = v % 2; /* 0 to 3 outputs, two forms */
                if (scaled && ELTS[ei] != DG_ELT_BF16)
                    continue; /* (the scaled form: bf16 only) */
                const enum dg_elt el = ELTS[ei];
                const size_t sz = (size_t)dg_elt_size(el);
                const int64_t R = NORM_SHAPES[k].rows;
                const int D = NORM_SHAPES[k].dim;
                const size_t n = (size_t)R * D;
                const float scale = 0.8125f;
                struct dg_error err = {0};
                void *hx, *hw, *hr, *hwo[3], *dx, *dw, *dr, *dr2, *dwo[3] = {0}, *dy[3] = {0},
                                                                 *dy2[3] = {0};
                float *fx, *fw, *fr, *fwo[3], *res = malloc(n * sizeof *res),
                                               *ref = malloc(n * sizeof *ref);
                void *dS = NULL, *dsa = NULL, *dsw = NULL, *dxbuf = NULL;
                char what[112];
                double e;
                CHECK(res && ref && gt_rand_elts(el, n, 3.0f, &hx, &fx) == 0 &&
                      gt_rand_elts(el, (size_t)D, 1.5f, &hw, &fw) == 0 &&
                      gt_rand_elts(el, n, 2.0f, &hr, &fr) == 0);
                for (int j = 0; j < 3; j++)
                    CHECK(gt_rand_elts(el, (size_t)D, 1.5f, &hwo[j], &fwo[j]) == 0);
                if (scaled) {
                    /* an FP8 product's sums and scales; x the scaling pass's
                     * values of them, bf16((S sa) sw) */
                    float *hS = malloc(sizeof *hS * n), *hsa = malloc(sizeof *hsa * (size_t)R);
                    float *hsw = malloc(sizeof *hsw * (size_t)D);
                    CHECK(hS && hsa && hsw);
                    for (int64_t r = 0; r < R; r++)
                        hsa[r] = 0.5f + fabsf(gt_uniform());
                    for (int c = 0; c < D; c++)
                        hsw[c] = 0.25f + fabsf(gt_uniform());
                    for (size_t q = 0; q < n; q++) {
                        const uint16_t b =
                            dg_f32_to_bf16((hS[q] = 4.0f * gt_uniform()) * hsa[q / (size_t)D] *
                                           hsw[q % (size_t)D]);
                        ((uint16_t *)hx)[q] = b;
                        fx[q] = dg_bf16_to_f32(b);
                    }
                    dS = gt_upload(hS, sizeof *hS * n, &err);
                    dsa = gt_upload(hsa, sizeof *hsa * (size_t)R, &err);
                    dsw = gt_upload(hsw, sizeof *hsw * (size_t)D, &err);
                    dxbuf = out_buf(el, n, NULL, &err);
                    CHECKF(dS && dsa && dsw && dxbuf, "%s", err.msg);
                    free(hS), free(hsa), free(hsw);
                }
                dx = gt_upload(hx, n * sz, &err);
                dw = gt_upload(hw, (size_t)D * sz, &err);
                dr = out_buf(el, n, hr, &err);
                dr2 = out_buf(el, n, hr, &err);
                CHECKF(dx && dw && dr && dr2, "%s", err.msg);
                for (int j = 0; j < n_out; j++) {
                    dwo[j] = j == 1 ? NULL : gt_upload(hwo[j], (size_t)D * sz, &err);
                    dy[j] = out_buf(el, n, NULL, &err);
                    dy2[j] = out_buf(el, n, NULL, &err);
                    CHECKF((j == 1 || dwo[j]) && dy[j] && dy2[j], "%s", err.msg);
                }
                if (scaled)
                    CHECK_OK(dg_cuda_rmsnorm_add_norms_scaled(
                                 dr, dS, dsa, dsw, dxbuf, dw, R, D, 1e-6f, scale, n_out, dy,
                                 (const void *const *)dwo, NULL, 0, &err),
                             &err);
                else
                    CHECK_OK(dg_cuda_rmsnorm_add_norms_e(el, dr, dx, dw, R, D, 1e-6f, scale,
                                                         n_out, dy, (const void *const *)dwo,
                                                         NULL, 0, &err),
                             &err);
                /* the separate kernels on the copy */
                CHECK_OK(dg_cuda_rmsnorm_add_e(el, dr2, dx, dw, R, D, 1e-6f, scale, NULL, 0,
                                               &err),
                         &err);
                for (int j = 0; j < n_out; j++)
                    CHECK_OK(dg_cuda_rmsnorm_e(el, dy2[j], dr2, dwo[j], R, D, 1e-6f, NULL, 0,
                                               &err),
                             &err);
                /* the references: the residual as stored, then its norms */
                dg_ref_rmsnorm(res, fx, fw, R, D, 1e-6f);
                for (size_t i = 0; i < n; i++) {
                    res[i] = fr[i] + res[i] * scale;
                    if (el == DG_ELT_BF16)
                        res[i] = dg_bf16_to_f32(dg_f32_to_bf16(res[i]));
                }
                snprintf(what, sizeof what, "rmsnorm_add_norms%s%s %lld x %d, %d out: residual",
                         tag(el), scaled ? " (scaled sums)" : "", (long long)R, D, n_out);
                e = compare(el, dr, n, res, what);
                CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
                CHECKF(same_bytes(el, dr, dr2, n), "%s: not the separate kernel's bits", what);
                for (int j = 0; j < n_out; j++) {
                    dg_ref_rmsnorm(ref, res, j == 1 ? NULL : fwo[j], R, D, 1e-6f);
                    snprintf(what, sizeof what,
                             "rmsnorm_add_norms%s%s %lld x %d, %d out: norm %d", tag(el),
                             scaled ? " (scaled sums)" : "", (long long)R, D, n_out, j);
                    e = compare(el, dy[j], n, ref, what);
                    printf("# %s: relative error %.2e\n", what, e);
                    CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
                    CHECKF(same_bytes(el, dy[j], dy2[j], n), "%s: not the separate kernel's bits",
                           what);
                }
                for (int j = 0; j < 3; j++) {
                    dg_cuda_free(dwo[j]);
                    dg_cuda_free(dy[j]);
                    dg_cuda_free(dy2[j]);
                    free(hwo[j]);
                    free(fwo[j]);
                }
                dg_cuda_free(dx);
                dg_cuda_free(dw);
                dg_cuda_free(dS);
                dg_cuda_free(dsa);
                dg_cuda_free(dsw);
                dg_cuda_free(dxbuf);
                dg_cuda_free(dr);
                dg_cuda_free(dr2);
                free(hx);
                free(fx);
                free(hw);
                free(fw);
                free(hr);
                free(fr);
                free(res);
                free(ref);
            }
    {
        /* refused: more outputs than three, an output on the residual */
        struct dg_error err = {0};
        void *y[1] = {(void *)(uintptr_t)256};
        const void *w[1] = {NULL};
        CHECK_FAILS(dg_cuda_rmsnorm_add_norms_e(DG_ELT_BF16, NULL, NULL, NULL, 4, 8, 1e-6f, 1.0f,
                                                4, y, w, NULL, 0, &err),
                    &err, DG_E_INVAL, "outputs");
        CHECK_FAILS(dg_cuda_rmsnorm_add_norms_e(DG_ELT_BF16, y[0], NULL, NULL, 4, 8, 1e-6f, 1.0f,
                                                1, y, w, NULL, 0, &err),
                    &err, DG_E_INVAL, "the residual");
        /* scaled sums without their scales, without the buffer, or none */
        CHECK_FAILS(dg_cuda_rmsnorm_add_norms_scaled(NULL, (const float *)y[0], NULL, NULL, y[0],
                                                     NULL, 4, 8, 1e-6f, 1.0f, 0, NULL, NULL,
                                                     NULL, 0, &err),
                    &err, DG_E_INVAL, "their scales");
        CHECK_FAILS(dg_cuda_rmsnorm_add_norms_scaled(NULL, (const float *)y[0], (const float *)y[0],
                                                     (const float *)y[0], NULL, NULL, 4, 8, 1e-6f,
                                                     1.0f, 0, NULL, NULL, NULL, 0, &err),
                    &err, DG_E_INVAL, "a bf16 buffer");
        CHECK_FAILS(dg_cuda_rmsnorm_add_norms_scaled(NULL, NULL, NULL, NULL, NULL, NULL, 4, 8,
                                                     1e-6f, 1.0f, 0, NULL, NULL, NULL, 0, &err),
                    &err, DG_E_INVAL, "no scaled sums");
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
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const size_t sz = (size_t)dg_elt_size(el);
            const int64_t T = shapes[k].T, v0 = shapes[k].v0, nr = shapes[k].n_rows;
            const int D = shapes[k].dim;
            const size_t n = (size_t)T * D;
            const float scale = sqrtf((float)D);
            struct dg_error err = {0};
            struct dg_weight E;
            void *he, *de, *dy;
            float *fe, *ref = malloc(n * sizeof *ref);
            int32_t *ids = malloc((size_t)T * sizeof *ids);
            void *dids = NULL;
            char what[128];
            double e;
            CHECK(ref && ids && gt_rand_elts(el, (size_t)nr * D, 0.05f, &he, &fe) == 0);
            for (int64_t t = 0; t < T; t++)
                ids[t] = (int32_t)(gt_next() % (uint64_t)V);
            ids[0] = (int32_t)v0; /* the first row of the slice, */
            if (T > 1)
                ids[T - 1] = (int32_t)(v0 + nr - 1); /* its last, */
            if (T > 2)
                ids[1] = (int32_t)(v0 + nr); /* and the first one past it */
            memset(&E, 0, sizeof E);
            E.data = he;
            E.dtype = el == DG_ELT_F32 ? DG_DTYPE_F32 : DG_DTYPE_BF16;
            E.rows = nr;
            E.cols = D;
            dg_ref_embed(ref, ids, T, &E, v0, scale);
            de = gt_upload(he, (size_t)nr * D * sz, &err);
            dy = out_buf(el, n, NULL, &err);
            CHECKF(de && dy && dg_cuda_alloc(&dids, (size_t)T * 4, 0, &err) == 0 &&
                       dg_cuda_upload(dids, ids, (size_t)T * 4, 0, &err) == 0,
                   "%s", err.msg);
            CHECK_OK(dg_cuda_embed_e(el, dy, dids, T, de, v0, nr, D, scale, NULL, 0, &err), &err);
            snprintf(what, sizeof what, "embed%s %lld tokens, rows [%lld, %lld) of %d", tag(el),
                     (long long)T, (long long)v0, (long long)(v0 + nr), D);
            e = compare(el, dy, n, ref, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
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

/* Rows from several source buffers (every third row none: zeros),
 * gathered by dg_cuda_rows_gather_e against dg_ref_rows_gather: a copy,
 * so exactly equal. */
static int rows_gather(void)
{
    static const struct {
        int64_t T;
        int dim;
    } shapes[] = {{1, 5}, {37, 2816}, {300, 64}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const size_t sz = (size_t)dg_elt_size(el);
            const int64_t T = shapes[k].T, S = T + 3; /* source rows */
            const int D = shapes[k].dim;
            struct dg_error err = {0};
            void *hsrc, *dsrc, *dy, *dptr;
            float *fsrc, *ref = malloc(sizeof(float) * (size_t)(T * D));
            const float **hf = malloc(sizeof *hf * (size_t)T);
            void **hp = malloc(sizeof *hp * (size_t)T);
            char what[96];
            double e;
            CHECK(ref && hf && hp && gt_rand_elts(el, (size_t)(S * D), 1.0f, &hsrc, &fsrc) == 0);
            dsrc = gt_upload(hsrc, (size_t)(S * D) * sz, &err);
            CHECK(dsrc);
            for (int64_t t = 0; t < T; t++) {
                const int64_t r = (int64_t)(gt_next() % (uint64_t)S);
                hf[t] = t % 3 == 2 ? NULL : fsrc + r * D;
                hp[t] = t % 3 == 2 ? NULL : (unsigned char *)dsrc + (size_t)(r * D) * sz;
            }
            dg_ref_rows_gather(ref, hf, T, D);
            dptr = gt_upload(hp, sizeof *hp * (size_t)T, &err);
            dy = out_buf(el, (size_t)(T * D), NULL, &err);
            CHECKF(dptr && dy, "%s", err.msg);
            CHECK_OK(dg_cuda_rows_gather_e(el, dy, (const void *const *)dptr, T, D, NULL, 0, &err),
                     &err);
            snprintf(what, sizeof what, "rows_gather%s %lld rows of %d", tag(el), (long long)T, D);
            e = compare(el, dy, (size_t)(T * D), ref, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e == 0, "%s: %.3e (a copy must be exact)", what, e);
            dg_cuda_free(dsrc);
            dg_cuda_free(dptr);
            dg_cuda_free(dy);
            free(hsrc);
            free(fsrc);
            free(ref);
            free(hf);
            free(hp);
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
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const int64_t T = shapes[k].T;
            const int nh = shapes[k].heads, hd = shapes[k].hd;
            const size_t n = (size_t)T * nh * hd;
            struct dg_error err = {0};
            void *hx, *dx;
            float *fx, *inv = malloc((size_t)hd / 2 * sizeof *inv);
            int64_t *pos = malloc((size_t)T * sizeof *pos);
            void *dpos = NULL, *dinv = NULL;
            char what[96];
            double e;
            CHECK(inv && pos && gt_rand_elts(el, n, 2.0f, &hx, &fx) == 0);
            for (int i = 0; i < hd / 2; i++)
                inv[i] = i < shapes[k].zero_from ? powf(10000.0f, -2.0f * (float)i / (float)hd)
                                                 : 0.0f;
            for (int64_t t = 0; t < T; t++)
                pos[t] = t == 0 ? 0 : (int64_t)((gt_uniform() + 1.0f) * 60000.0f) + t;
            for (int64_t t = 0; t < T; t++)
                dg_ref_rope(fx + (size_t)t * nh * hd, nh, hd, inv, pos[t]);
            dx = out_buf(el, n, hx, &err);
            CHECKF(dx && dg_cuda_alloc(&dpos, (size_t)T * 8, 0, &err) == 0 &&
                       dg_cuda_upload(dpos, pos, (size_t)T * 8, 0, &err) == 0 &&
                       dg_cuda_alloc(&dinv, (size_t)hd / 2 * 4, 0, &err) == 0 &&
                       dg_cuda_upload(dinv, inv, (size_t)hd / 2 * 4, 0, &err) == 0,
                   "%s", err.msg);
            CHECK_OK(dg_cuda_rope_e(el, dx, dpos, T, nh, hd, dinv, NULL, 0, &err), &err);
            snprintf(what, sizeof what, "rope%s %lld tokens x %d heads x %d", tag(el),
                     (long long)T, nh, hd);
            e = compare(el, dx, n, fx, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
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

/* Rows [T, w] (row stride ld elements in the device copy) of type e:
 * host values h at column c0 of a device buffer of T ld elements. */
static int put_cols(enum dg_elt e, void *d, int64_t ld, int64_t c0, const void *h, int64_t T,
                    int64_t w, struct dg_error *err)
{
    const size_t sz = (size_t)dg_elt_size(e);
    for (int64_t t = 0; t < T; t++)
        if (dg_cuda_upload((char *)d + ((size_t)(t * ld + c0)) * sz,
                           (const char *)h + (size_t)(t * w) * sz, (size_t)w * sz, 0, err) < 0)
            return -1;
    return 0;
}

/* The attention's per-head norms and RoPE in one launch against the
 * references composed: q normed (weight) and rotated, k likewise, v
 * normed (no weight), each norm's output rounded to the element type
 * before its rotation (as it is stored between the separate kernels).
 * Sources three ways: one projection each (q in place, k and v in their own
 * buffers, or v = k where shared_kv: a full layer), side by side in one
 * [T, q | k (| v)] buffer, or (bf16) an FP8 product's unscaled fp32 sums
 * side by side with random row and column scales
 * (dg_cuda_head_norm_rope_scaled): its references on the bf16 values the
 * scaling pass gives, and its q, k and v the bits of the plain form on
 * those values.  k and v also go into two sequences' caches
 * (tokens alternating between them, each at its position), which must
 * hold exactly k's and v's rows there and their poison everywhere else.
 * Shapes the one-pass kernel does not take (hd 96, 2048; every fp32 run)
 * go through the copies and the separate kernels. */
static int head_norm_rope(void)
{
    static const struct {
        int64_t T;
        int nh, nkv, hd, zero_from, shared_kv;
    } shapes[] = {{1, 2, 1, 64, 32, 0},    {9, 16, 8, 256, 128, 0}, {5, 16, 2, 512, 64, 1},
                  {3, 4, 2, 1024, 512, 0}, {7, 4, 2, 128, 40, 1},   {4, 2, 1, 16, 8, 0},
                  {4, 2, 1, 96, 48, 0},    {2, 2, 1, 2048, 1024, 0}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++)
            for (int side = 0; side < 3; side++) {
                if (side == 2 && ELTS[ei] != DG_ELT_BF16)
                    continue; /* (the scaled form: bf16 only) */
                const enum dg_elt el = ELTS[ei];
                const size_t sz = (size_t)dg_elt_size(el);
                const int64_t T = shapes[k].T;
                const int nh = shapes[k].nh, nkv = shapes[k].nkv, hd = shapes[k].hd;
                const int shared = shapes[k].shared_kv;
                const int64_t qw = (int64_t)nh * hd, kw = (int64_t)nkv * hd;
                const int64_t ld = qw + kw + (shared ? 0 : kw); /* side by side */
                const size_t nq = (size_t)T * qw, nk = (size_t)T * kw;
                const float eps = 1e-6f;
                struct dg_error err = {0};
                void *hq, *hk, *hv, *hwq, *hwk, *dq, *dk, *dv, *dwq, *dwk;
                void *dsrc = NULL, *dkraw = NULL, *dvraw = NULL, *dpos = NULL, *dinv = NULL;
                void *dseq = NULL, *dtab = NULL, *cache[2][2] = {{0}};
                void *dsa = NULL, *dsw = NULL, *dsrc2 = NULL, *dq2 = NULL, *dk2 = NULL,
                     *dv2 = NULL;
                float *hs = NULL, *hsa = NULL, *hsw = NULL;
                const void *qsrc, *ksrc, *vsrc;
                float *fq, *fk, *fv, *fwq, *fwk, *rq = malloc(nq * 4), *rk = malloc(nk * 4),
                                                   *rv = malloc(nk * 4),
                                                   *inv = malloc((size_t)hd / 2 * 4);
                int64_t *pos = malloc((size_t)T * sizeof *pos), rows = 0;
                int32_t *seq = malloc((size_t)T * sizeof *seq);
                struct dg_attn_seq tab[2];
                char what[128];
                double e;
                CHECK(rq && rk && rv && inv && pos && seq &&
                      gt_rand_elts(el, nq, 2.0f, &hq, &fq) == 0 &&
                      gt_rand_elts(el, nk, 3.0f, &hk, &fk) == 0 &&
                      gt_rand_elts(el, nk, 1.0f, &hv, &fv) == 0 &&
                      gt_rand_elts(el, (size_t)hd, 1.5f, &hwq, &fwq) == 0 &&
                      gt_rand_elts(el, (size_t)hd, 1.5f, &hwk, &fwk) == 0);
                if (side == 2) {
                    /* the scaled form: sums, row and column scales, and the
                     * sources they make, bf16((S sa) sw), as the values the
                     * references and the two calls see */
                    uint16_t *bq = hq, *bk = hk, *bv = hv;
                    hs = malloc(sizeof *hs * (size_t)(T * ld));
                    hsa = malloc(sizeof *hsa * (size_t)T);
                    hsw = malloc(sizeof *hsw * (size_t)ld);
                    CHECK(hs && hsa && hsw);
                    for (int64_t t = 0; t < T; t++)
                        hsa[t] = 0.5f + fabsf(gt_uniform());
                    for (int64_t c = 0; c < ld; c++)
                        hsw[c] = 0.25f + fabsf(gt_uniform());
                    for (int64_t t = 0; t < T; t++)
                        for (int64_t c = 0; c < ld; c++) {
                            const float S = 6.0f * gt_uniform();
                            const uint16_t x = dg_f32_to_bf16(S * hsa[t] * hsw[c]);
                            hs[t * ld + c] = S;
                            if (c < qw)
                                bq[t * qw + c] = x, fq[t * qw + c] = dg_bf16_to_f32(x);
                            else if (c < qw + kw)
                                bk[t * kw + c - qw] = x, fk[t * kw + c - qw] = dg_bf16_to_f32(x);
                            else
                                bv[t * kw + c - qw - kw] = x,
                                fv[t * kw + c - qw - kw] = dg_bf16_to_f32(x);
                        }
                }
                for (int i = 0; i < hd / 2; i++)
                    inv[i] = i < shapes[k].zero_from
                                 ? powf(10000.0f, -2.0f * (float)i / (float)hd)
                                 : 0.0f;
                /* positions distinct and rising within each sequence */
                for (int64_t t = 0; t < T; t++) {
                    seq[t] = (int32_t)(t % 2);
                    pos[t] = 37 * t + (int64_t)(gt_next() % 37);
                    rows = pos[t] + 1 > rows ? pos[t] + 1 : rows;
                }
                /* the references */
                dg_ref_rmsnorm(rq, fq, fwq, T * nh, hd, eps);
                dg_ref_rmsnorm(rk, fk, fwk, T * nkv, hd, eps);
                dg_ref_rmsnorm(rv, shared ? fk : fv, NULL, T * nkv, hd, eps);
                if (el == DG_ELT_BF16) {
                    for (size_t i = 0; i < nq; i++)
                        rq[i] = dg_bf16_to_f32(dg_f32_to_bf16(rq[i]));
                    for (size_t i = 0; i < nk; i++)
                        rk[i] = dg_bf16_to_f32(dg_f32_to_bf16(rk[i]));
                }
                for (int64_t t = 0; t < T; t++) {
                    dg_ref_rope(rq + (size_t)t * qw, nh, hd, inv, pos[t]);
                    dg_ref_rope(rk + (size_t)t * kw, nkv, hd, inv, pos[t]);
                }
                /* the sources, the outputs, the caches */
                dk = out_buf(el, nk, NULL, &err);
                dv = out_buf(el, nk, NULL, &err);
                if (side == 2) {
                    /* the sums, and for the two calls the bf16 values side by side */
                    dq = out_buf(el, nq, NULL, &err);
                    dsrc = gt_upload(hs, sizeof *hs * (size_t)(T * ld), &err);
                    dsa = gt_upload(hsa, sizeof *hsa * (size_t)T, &err);
                    dsw = gt_upload(hsw, sizeof *hsw * (size_t)ld, &err);
                    dq2 = out_buf(el, nq, NULL, &err);
                    dk2 = out_buf(el, nk, NULL, &err);
                    dv2 = out_buf(el, nk, NULL, &err);
                    CHECKF(dsrc && dsa && dsw && dq2 && dk2 && dv2 &&
                               dg_cuda_alloc(&dsrc2, (size_t)(T * ld) * sz, 0, &err) == 0 &&
                               put_cols(el, dsrc2, ld, 0, hq, T, qw, &err) == 0 &&
                               put_cols(el, dsrc2, ld, qw, hk, T, kw, &err) == 0 &&
                               (shared || put_cols(el, dsrc2, ld, qw + kw, hv, T, kw, &err) == 0),
                           "%s", err.msg);
                    qsrc = dsrc2;
                    ksrc = (char *)dsrc2 + (size_t)qw * sz;
                    vsrc = shared ? ksrc : (char *)dsrc2 + (size_t)(qw + kw) * sz;
                } else if (side) {
                    dq = out_buf(el, nq, NULL, &err);
                    CHECKF(dg_cuda_alloc(&dsrc, (size_t)(T * ld) * sz, 0, &err) == 0 &&
                               put_cols(el, dsrc, ld, 0, hq, T, qw, &err) == 0 &&
                               put_cols(el, dsrc, ld, qw, hk, T, kw, &err) == 0 &&
                               (shared || put_cols(el, dsrc, ld, qw + kw, hv, T, kw, &err) == 0),
                           "%s", err.msg);
                    qsrc = dsrc;
                    ksrc = (char *)dsrc + (size_t)qw * sz;
                    vsrc = shared ? ksrc : (char *)dsrc + (size_t)(qw + kw) * sz;
                } else {
                    dq = out_buf(el, nq, hq, &err);
                    dkraw = gt_upload(hk, nk * sz, &err);
                    dvraw = shared ? dkraw : gt_upload(hv, nk * sz, &err);
                    qsrc = dq;
                    ksrc = dkraw;
                    vsrc = dvraw;
                }
                for (int si = 0; si < 2; si++) {
                    for (int kv = 0; kv < 2; kv++)
                        cache[si][kv] = out_buf(el, (size_t)(rows * kw), NULL, &err);
                    tab[si] = (struct dg_attn_seq){cache[si][0], cache[si][1], 0, rows};
                }
                dwq = gt_upload(hwq, (size_t)hd * sz, &err);
                dwk = gt_upload(hwk, (size_t)hd * sz, &err);
                dseq = gt_upload(seq, (size_t)T * 4, &err);
                dtab = gt_upload(tab, sizeof tab, &err);
                CHECKF(dq && qsrc && ksrc && vsrc && dk && dv && dwq && dwk && dseq && dtab &&
                           cache[0][0] && cache[0][1] && cache[1][0] && cache[1][1] &&
                           dg_cuda_alloc(&dpos, (size_t)T * 8, 0, &err) == 0 &&
                           dg_cuda_upload(dpos, pos, (size_t)T * 8, 0, &err) == 0 &&
                           dg_cuda_alloc(&dinv, (size_t)hd / 2 * 4, 0, &err) == 0 &&
                           dg_cuda_upload(dinv, inv, (size_t)hd / 2 * 4, 0, &err) == 0,
                       "%s", err.msg);
                if (side == 2) {
                    CHECK_OK(dg_cuda_head_norm_rope_scaled(
                                 dq, dk, dv, dsrc, ld, qw, shared ? qw : qw + kw, dsa, dsw, dpos,
                                 T, nh, nkv, hd, dwq, dwk, dinv, eps, dtab, dseq, NULL, 0, &err),
                             &err);
                    /* the two calls' second, on the scaling pass's values */
                    CHECK_OK(dg_cuda_head_norm_rope_e(el, dq2, dk2, dv2, qsrc, ld, ksrc, vsrc, ld,
                                                      dpos, T, nh, nkv, hd, dwq, dwk, dinv, eps,
                                                      NULL, NULL, NULL, 0, &err),
                             &err);
                } else {
                    CHECK_OK(dg_cuda_head_norm_rope_e(el, dq, dk, dv, qsrc, side ? ld : qw, ksrc,
                                                      vsrc, side ? ld : kw, dpos, T, nh, nkv, hd,
                                                      dwq, dwk, dinv, eps, dtab, dseq, NULL, 0,
                                                      &err),
                             &err);
                }
                snprintf(what, sizeof what,
                         "head_norm_rope%s %lld tokens, %d + 2 x %d heads of %d%s%s", tag(el),
                         (long long)T, nh, nkv, hd, shared ? ", v = k" : "",
                         side == 2 ? ", scaled sums" : side ? ", side by side" : "");
                if (side == 2)
                    CHECKF(same_bytes(el, dq, dq2, nq) && same_bytes(el, dk, dk2, nk) &&
                               same_bytes(el, dv, dv2, nk),
                           "%s: not the bits of the scaling pass and the plain form", what);
                e = compare(el, dq, nq, rq, what);
                printf("# %s: q %.2e", what, e);
                CHECKF(e >= 0 && e <= bound(el), "%s: q %.3e", what, e);
                e = compare(el, dk, nk, rk, what);
                printf(", k %.2e", e);
                CHECKF(e >= 0 && e <= bound(el), "%s: k %.3e", what, e);
                e = compare(el, dv, nk, rv, what);
                printf(", v %.2e\n", e);
                CHECKF(e >= 0 && e <= bound(el), "%s: v %.3e", what, e);
                {
                    /* the caches: k's and v's rows at the tokens' positions, poison
                     * elsewhere (a NaN bit pattern: 0xff bytes) */
                    const size_t rb = (size_t)kw * sz;
                    unsigned char *out[2], *c = malloc((size_t)rows * rb + GUARD * sz);
                    out[0] = malloc(nk * sz);
                    out[1] = malloc(nk * sz);
                    CHECK(c && out[0] && out[1] &&
                          dg_cuda_download(out[0], dk, nk * sz, 0, &err) == 0 &&
                          dg_cuda_download(out[1], dv, nk * sz, 0, &err) == 0);
                    for (int si = 0; si < 2; si++)
                        for (int kv = 0; kv < 2; kv++) {
                            CHECK(dg_cuda_download(c, cache[si][kv],
                                                   (size_t)rows * rb + GUARD * sz, 0,
                                                   &err) == 0);
                            for (int64_t r = 0; r < rows; r++) {
                                int64_t tok = -1;
                                for (int64_t t = 0; t < T; t++)
                                    if (seq[t] == si && pos[t] == r)
                                        tok = t;
                                if (tok >= 0)
                                    CHECKF(!memcmp(c + (size_t)r * rb,
                                                   out[kv] + (size_t)tok * rb, rb),
                                           "%s: cache %d %s row %lld is not token %lld's", what,
                                           si, kv ? "v" : "k", (long long)r, (long long)tok);
                                else
                                    for (size_t b = 0; b < rb; b++)
                                        CHECKF(c[(size_t)r * rb + b] == POISON_BYTE,
                                               "%s: cache %d %s row %lld written", what, si,
                                               kv ? "v" : "k", (long long)r);
                            }
                            for (size_t b = 0; b < GUARD * sz; b++)
                                CHECKF(c[(size_t)rows * rb + b] == GUARD_BYTE,
                                       "%s: cache %d %s: guard byte %zu changed", what, si,
                                       kv ? "v" : "k", b);
                        }
                    free(c);
                    free(out[0]);
                    free(out[1]);
                }
                dg_cuda_free(dq);
                dg_cuda_free(dsrc);
                dg_cuda_free(dsa);
                dg_cuda_free(dsw);
                dg_cuda_free(dsrc2);
                dg_cuda_free(dq2);
                dg_cuda_free(dk2);
                dg_cuda_free(dv2);
                free(hs);
                free(hsa);
                free(hsw);
                dg_cuda_free(dkraw);
                if (!shared)
                    dg_cuda_free(dvraw);
                dg_cuda_free(dk);
                dg_cuda_free(dv);
                dg_cuda_free(dwq);
                dg_cuda_free(dwk);
                dg_cuda_free(dpos);
                dg_cuda_free(dinv);
                dg_cuda_free(dseq);
                dg_cuda_free(dtab);
                for (int si = 0; si < 2; si++)
                    for (int kv = 0; kv < 2; kv++)
                        dg_cuda_free(cache[si][kv]);
                free(hq);
                free(hk);
                free(hv);
                free(hwq);
                free(hwk);
                free(fq);
                free(fk);
                free(fv);
                free(fwq);
                free(fwk);
                free(rq);
                free(rk);
                free(rv);
                free(inv);
                free(pos);
                free(seq);
            }
    {
        struct dg_error err = {0};
        void *p = (void *)(uintptr_t)256;
        CHECK_FAILS(dg_cuda_head_norm_rope_e(DG_ELT_BF16, p, p, p, p, 64, p, p, 64, NULL, 4, 0,
                                             1, 64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL, 0,
                                             &err),
                    &err, DG_E_INVAL, "heads");
        CHECK_FAILS(dg_cuda_head_norm_rope_e(DG_ELT_BF16, p, p, p, p, 126, p, p, 63, NULL, 4, 2,
                                             1, 63, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL, 0,
                                             &err),
                    &err, DG_E_INVAL, "heads");
        /* rows closer than a token's heads; q in place at another stride; a
         * cache without the tokens' sequences */
        CHECK_FAILS(dg_cuda_head_norm_rope_e(DG_ELT_BF16, p, p, p, NULL, 64, p, p, 64, NULL, 4,
                                             2, 1, 64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL,
                                             0, &err),
                    &err, DG_E_INVAL, "apart");
        CHECK_FAILS(dg_cuda_head_norm_rope_e(DG_ELT_BF16, p, p, p, p, 256, p, p, 64, NULL, 4, 2,
                                             1, 64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL, 0,
                                             &err),
                    &err, DG_E_INVAL, "in place");
        CHECK_FAILS(dg_cuda_head_norm_rope_e(DG_ELT_BF16, p, p, p, NULL, 128, p, p, 64, NULL, 4,
                                             2, 1, 64, NULL, NULL, NULL, 1e-6f, p, NULL, NULL, 0,
                                             &err),
                    &err, DG_E_INVAL, "sequences");
        CHECK_FAILS(dg_cuda_head_norm_rope_e(BAD_ELT, p, p, p, p, 128, p, p, 64, NULL, 4, 2, 1,
                                             64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL, 0,
                                             &err),
                    &err, DG_E_INVAL, "element type");
        /* scaled sums: v's columns over k's, past the row, no scales */
        CHECK_FAILS(dg_cuda_head_norm_rope_scaled(p, p, p, p, 256, 128, 160, p, p, NULL, 4, 2, 1,
                                                  64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL,
                                                  0, &err),
                    &err, DG_E_INVAL, "scaled sums");
        CHECK_FAILS(dg_cuda_head_norm_rope_scaled(p, p, p, p, 200, 128, 192, p, p, NULL, 4, 2, 1,
                                                  64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL,
                                                  0, &err),
                    &err, DG_E_INVAL, "scaled sums");
        CHECK_FAILS(dg_cuda_head_norm_rope_scaled(p, p, p, p, 256, 128, 192, NULL, p, NULL, 4, 2,
                                                  1, 64, NULL, NULL, NULL, 1e-6f, NULL, NULL, NULL,
                                                  0, &err),
                    &err, DG_E_INVAL, "scaled sums");
    }
    return 0;
}

/* The end of the feed-forward block: fp32 dense and MoE rows, weights of
 * the element type, the residual x of the element type updated in place
 * (uploaded into a guarded buffer); dense and moe must come back
 * unchanged. */
static const struct {
    int64_t rows;
    int dim;
} COMBINE_SHAPES[] = {{1, 48},    {7, 333},  {33, 2816}, {1, 1},   {3, 8192},
                      {130, 1000}, {5, 5376}, {9, 4096},  {4, 1024}, {256, 2816}};
#define N_COMBINE_SHAPES (sizeof COMBINE_SHAPES / sizeof COMBINE_SHAPES[0])

static int ffn_combine(void)
{
    for (size_t k = 0; k < N_COMBINE_SHAPES; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++) {
            const enum dg_elt el = ELTS[ei];
            const size_t sz = (size_t)dg_elt_size(el);
            const int64_t R = COMBINE_SHAPES[k].rows;
            const int D = COMBINE_SHAPES[k].dim;
            const size_t n = (size_t)R * D;
            const float scale = 0.8125f, eps = 1e-6f;
            struct dg_error err = {0};
            void *hx, *hw1, *hw2, *hw, *dx, *dw1, *dw2, *dw;
            float *fx, *fw1, *fw2, *fw, *dd, *dm;
            float *fd = malloc(n * sizeof *fd), *fm = malloc(n * sizeof *fm);
            float *rd = malloc(n * sizeof *rd), *rm = malloc(n * sizeof *rm);
            float *back = malloc(n * sizeof *back);
            char what[96];
            double e;
            CHECK(fd && fm && rd && rm && back && gt_rand_elts(el, n, 2.0f, &hx, &fx) == 0 &&
                  gt_rand_elts(el, (size_t)D, 1.5f, &hw1, &fw1) == 0 &&
                  gt_rand_elts(el, (size_t)D, 1.5f, &hw2, &fw2) == 0 &&
                  gt_rand_elts(el, (size_t)D, 1.5f, &hw, &fw) == 0);
            /* full fp32 values, the two of different magnitudes */
            for (size_t i = 0; i < n; i++) {
                fd[i] = gt_uniform() * 40.0f;
                fm[i] = gt_uniform() * 0.03f;
            }
            memcpy(rd, fd, n * sizeof *fd);
            memcpy(rm, fm, n * sizeof *fm);
            dd = gt_upload(fd, n * sizeof *fd, &err);
            dm = gt_upload(fm, n * sizeof *fm, &err);
            dw1 = gt_upload(hw1, (size_t)D * sz, &err);
            dw2 = gt_upload(hw2, (size_t)D * sz, &err);
            dw = gt_upload(hw, (size_t)D * sz, &err);
            dx = out_buf(el, n, hx, &err);
            CHECKF(dd && dm && dw1 && dw2 && dw && dx, "%s", err.msg);
            dg_ref_ffn_combine(fx, rd, rm, fw1, fw2, fw, R, D, eps, scale);
            CHECK_OK(dg_cuda_ffn_combine_e(el, dx, dd, dm, dw1, dw2, dw, R, D, eps, scale, NULL,
                                           0, &err),
                     &err);
            snprintf(what, sizeof what, "ffn_combine%s %lld x %d", tag(el), (long long)R, D);
            e = compare(el, dx, n, fx, what);
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
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
        CHECK(dg_cuda_ffn_combine_e(DG_ELT_F32, NULL, NULL, NULL, NULL, NULL, NULL, 4, 0, 1e-6f,
                                    1.0f, NULL, 0, &err) == -DG_E_INVAL);
    }
    return 0;
}

/* n bytes on the device and the guard after them, poisoned and set */
static void *byte_buf(size_t n, struct dg_error *err)
{
    void *d = NULL;
    if (dg_cuda_alloc(&d, n + GUARD, 0, err) < 0)
        return NULL;
    if (dg_cuda_memset(d, POISON_BYTE, n, 0, err) < 0 ||
        dg_cuda_memset((char *)d + n, GUARD_BYTE, GUARD, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* n bytes and the guard from the device into a new buffer (NULL: failed) */
static unsigned char *bytes_back(const void *d, size_t n)
{
    struct dg_error err = {0};
    unsigned char *h = malloc(n + GUARD);
    if (h && (dg_cuda_sync(0, &err) < 0 || dg_cuda_download(h, d, n + GUARD, 0, &err) < 0)) {
        printf("# %s\n", err.msg);
        free(h);
        return NULL;
    }
    return h;
}

/* The end of the feed-forward block with the next norm in the same pass
 * (mode 0: a weight; 1: none; 2: a weight and the norm's rows quantized):
 * x and y against the references (x rounded to the element type before
 * its norm, as it is stored), and x, y, the bytes and the scales, bit for
 * bit, against the separate kernels run one after another on a copy; the
 * bytes and scales also against the CPU's quantization of the y that
 * came back. */
static int ffn_combine_norm(void)
{
    for (size_t k = 0; k < N_COMBINE_SHAPES; k++)
        for (size_t ei = 0; ei < N_ELTS; ei++)
            for (int mode = 0; mode < 3; mode++) {
                const enum dg_elt el = ELTS[ei];
                const size_t sz = (size_t)dg_elt_size(el);
                const int64_t R = COMBINE_SHAPES[k].rows;
                const int D = COMBINE_SHAPES[k].dim;
                const size_t n = (size_t)R * D, sb = (size_t)R * sizeof(float);
                const float scale = 0.8125f, eps = 1e-6f;
                struct dg_error err = {0};
                void *hx, *hw[4], *dx, *dx2, *dy, *dy2, *dw[4], *dq = NULL, *dq2 = NULL,
                                                             *dqs = NULL, *dqs2 = NULL;
                float *fx, *fw[4], *dd, *dm;
                float *fd = malloc(n * sizeof *fd), *fm = malloc(n * sizeof *fm);
                float *ref = malloc(n * sizeof *ref), *yb = malloc(n * sizeof *yb);
                uint8_t *qc = malloc(n ? n : 1);
                float *sc = malloc(sb);
                char what[112];
                double e;
                CHECK(fd && fm && ref && yb && qc && sc &&
                      gt_rand_elts(el, n, 2.0f, &hx, &fx) == 0);
                for (int j = 0; j < 4; j++)
                    CHECK(gt_rand_elts(el, (size_t)D, 1.5f, &hw[j], &fw[j]) == 0);
                for (size_t i = 0; i < n; i++) {
                    fd[i] = gt_uniform() * 40.0f;
                    fm[i] = gt_uniform() * 0.03f;
                }
                dd = gt_upload(fd, n * sizeof *fd, &err);
                dm = gt_upload(fm, n * sizeof *fm, &err);
                for (int j = 0; j < 4; j++)
                    dw[j] = j == 3 && mode == 1 ? NULL : gt_upload(hw[j], (size_t)D * sz, &err);
                dx = out_buf(el, n, hx, &err);
                dx2 = out_buf(el, n, hx, &err);
                dy = out_buf(el, n, NULL, &err);
                dy2 = out_buf(el, n, NULL, &err);
                if (mode == 2) {
                    dq = byte_buf(n, &err);
                    dq2 = byte_buf(n, &err);
                    dqs = byte_buf(sb, &err);
                    dqs2 = byte_buf(sb, &err);
                }
                CHECKF(dd && dm && dw[0] && dw[1] && dw[2] && (mode == 1 || dw[3]) && dx &&
                           dx2 && dy && dy2 && (mode < 2 || (dq && dq2 && dqs && dqs2)),
                       "%s", err.msg);
                CHECK_OK(dg_cuda_ffn_combine_norm_e(el, dx, dd, dm, dw[0], dw[1], dw[2], R, D,
                                                    eps, scale, dy, dw[3], dq, dqs, NULL, 0,
                                                    &err),
                         &err);
                /* the separate kernels on the copy */
                CHECK_OK(dg_cuda_ffn_combine_e(el, dx2, dd, dm, dw[0], dw[1], dw[2], R, D, eps,
                                               scale, NULL, 0, &err),
                         &err);
                CHECK_OK(dg_cuda_rmsnorm_e(el, dy2, dx2, dw[3], R, D, eps, NULL, 0, &err), &err);
                if (mode == 2)
                    CHECK_OK(dg_cuda_fp8_quantize_rows(el, dq2, dqs2, dy2, R, D, NULL, 0, &err),
                             &err);
                /* the references */
                dg_ref_ffn_combine(fx, fd, fm, fw[0], fw[1], fw[2], R, D, eps, scale);
                if (el == DG_ELT_BF16)
                    for (size_t i = 0; i < n; i++)
                        fx[i] = dg_bf16_to_f32(dg_f32_to_bf16(fx[i]));
                dg_ref_rmsnorm(ref, fx, mode == 1 ? NULL : fw[3], R, D, eps);
                snprintf(what, sizeof what, "ffn_combine_norm%s %lld x %d, mode %d: x", tag(el),
                         (long long)R, D, mode);
                e = compare(el, dx, n, fx, what);
                CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
                CHECKF(same_bytes(el, dx, dx2, n), "%s: not the separate kernel's bits", what);
                snprintf(what, sizeof what, "ffn_combine_norm%s %lld x %d, mode %d: y", tag(el),
                         (long long)R, D, mode);
                e = compare(el, dy, n, ref, what);
                printf("# %s: relative error %.2e\n", what, e);
                CHECKF(e >= 0 && e <= bound(el), "%s: %.3e", what, e);
                CHECKF(same_bytes(el, dy, dy2, n), "%s: not the separate kernels' bits", what);
                if (mode == 2) {
                    unsigned char *q = bytes_back(dq, n), *q2 = bytes_back(dq2, n);
                    unsigned char *s1 = bytes_back(dqs, sb), *s2 = bytes_back(dqs2, sb);
                    unsigned char *hy = bytes_back(dy, n * sz);
                    CHECK(q && q2 && s1 && s2 && hy);
                    for (size_t i = 0; i < n; i++)
                        yb[i] = elt_get(el, hy, i);
                    dg_fp8_quantize_rows(yb, (size_t)R, (size_t)D, (size_t)D, qc, sc);
                    CHECKF(!memcmp(q, q2, n) && !memcmp(s1, s2, sb),
                           "%s: bytes or scales not the separate kernels'", what);
                    CHECKF(!memcmp(q, qc, n) && !memcmp(s1, sc, sb),
                           "%s: bytes or scales not the CPU's", what);
                    for (size_t i = 0; i < GUARD; i++)
                        CHECKF(q[n + i] == GUARD_BYTE && s1[sb + i] == GUARD_BYTE,
                               "%s: guard byte %zu after the bytes or scales changed", what, i);
                    free(q);
                    free(q2);
                    free(s1);
                    free(s2);
                    free(hy);
                }
                dg_cuda_free(dd);
                dg_cuda_free(dm);
                for (int j = 0; j < 4; j++) {
                    dg_cuda_free(dw[j]);
                    free(hw[j]);
                    free(fw[j]);
                }
                dg_cuda_free(dx);
                dg_cuda_free(dx2);
                dg_cuda_free(dy);
                dg_cuda_free(dy2);
                dg_cuda_free(dq);
                dg_cuda_free(dq2);
                dg_cuda_free(dqs);
                dg_cuda_free(dqs2);
                free(hx);
                free(fx);
                free(fd);
                free(fm);
                free(ref);
                free(yb);
                free(qc);
                free(sc);
            }
    {
        /* refused: no output, the output on the residual, bytes without scales */
        struct dg_error err = {0};
        void *p = (void *)(uintptr_t)256, *p2 = (void *)(uintptr_t)512;
        CHECK_FAILS(dg_cuda_ffn_combine_norm_e(DG_ELT_BF16, p, NULL, NULL, NULL, NULL, NULL, 4,
                                               8, 1e-6f, 1.0f, NULL, NULL, NULL, NULL, NULL, 0,
                                               &err),
                    &err, DG_E_INVAL, "no output");
        CHECK_FAILS(dg_cuda_ffn_combine_norm_e(DG_ELT_BF16, p, NULL, NULL, NULL, NULL, NULL, 4,
                                               8, 1e-6f, 1.0f, p, NULL, NULL, NULL, NULL, 0,
                                               &err),
                    &err, DG_E_INVAL, "residual");
        CHECK_FAILS(dg_cuda_ffn_combine_norm_e(DG_ELT_BF16, p, NULL, NULL, NULL, NULL, NULL, 4,
                                               8, 1e-6f, 1.0f, p2, NULL, p2, NULL, NULL, 0,
                                               &err),
                    &err, DG_E_INVAL, "scales");
    }
    return 0;
}

/* Bad shapes, and an element type that is neither bf16 nor fp32, are
 * refused before a launch, with the GPU named. */
static int refusals(void)
{
    struct dg_error err = {0};
    CHECK(dg_cuda_rmsnorm(NULL, NULL, NULL, 4, 0, 1e-6f, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(strstr(err.msg, "GPU 0") != NULL);
    CHECK(dg_cuda_rope(NULL, NULL, 3, 2, 7, NULL, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(dg_cuda_embed(NULL, NULL, 3, NULL, 0, 10, 0, 1.0f, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(dg_cuda_rmsnorm_e(DG_ELT_F32, NULL, NULL, NULL, 4, 0, 1e-6f, NULL, 0, &err) ==
          -DG_E_INVAL);
    CHECK(dg_cuda_rope_e(DG_ELT_F32, NULL, NULL, 3, 2, 7, NULL, NULL, 0, &err) == -DG_E_INVAL);
    /* nothing to do is not an error */
    CHECK(dg_cuda_rmsnorm(NULL, NULL, NULL, 0, 8, 1e-6f, NULL, 0, &err) == 0);
    CHECK(dg_cuda_rmsnorm_e(DG_ELT_F32, NULL, NULL, NULL, 0, 8, 1e-6f, NULL, 0, &err) == 0);

    /* e = 7, on otherwise valid shapes (nothing is launched) */
    CHECK_FAILS(dg_cuda_rmsnorm_e(BAD_ELT, NULL, NULL, NULL, 4, 8, 1e-6f, NULL, 0, &err), &err,
                DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_rmsnorm_add_e(BAD_ELT, NULL, NULL, NULL, 4, 8, 1e-6f, 1.0f, NULL, 0,
                                      &err),
                &err, DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_embed_e(BAD_ELT, NULL, NULL, 3, NULL, 0, 10, 8, 1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_rope_e(BAD_ELT, NULL, NULL, 3, 2, 8, NULL, NULL, 0, &err), &err,
                DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_ffn_combine_e(BAD_ELT, NULL, NULL, NULL, NULL, NULL, NULL, 4, 8, 1e-6f,
                                      1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "GPU 0");
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
    TEST_CASE(rmsnorm_add_norms);
    TEST_CASE(embed);
    TEST_CASE(rows_gather);
    TEST_CASE(rope);
    TEST_CASE(head_norm_rope);
    TEST_CASE(ffn_combine);
    TEST_CASE(ffn_combine_norm);
    TEST_CASE(refusals);
    return test_finish();
}
