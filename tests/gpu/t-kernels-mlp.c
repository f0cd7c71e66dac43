/*
 * Description: the MLP kernels against their plain-C references on fresh
 * random inputs at several shapes (sizes that are not multiples of the
 * tiles among them): nn.Linear through cuBLAS (bf16 in, fp32 accumulate,
 * bf16 or fp32 out, weights a column slice of a wider matrix), the gated
 * middle gelu_tanh(gate) * up over the two halves of one fused
 * projection, and the MoE router's softmax and top-k (expert ids exactly,
 * weights within fp32 rounding).  The linear and gelu_mul cases run again
 * with fp32 elements (dg_blas_gemm_e, dg_cuda_gelu_mul_e) on the same
 * shapes, the references reading fp32 weights; dg_blas_gemm's alpha and
 * beta (y = alpha x W^T + beta y0, y = alpha x W + beta y0; beta 0 over a
 * poisoned y, which must not be read) with both element types and both
 * output types; an unknown element type refused before anything is
 * written.  Outputs poisoned before the launch, guard words after them
 * checked; bound ||out - ref|| / ||ref|| <= 1e-2 with bf16 elements, 1e-5
 * with fp32 ones, never a NaN; each shape's error printed ("# ...").
 * Exit 77 where there is no GPU.
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

#define GUARD_BYTES 1024
#define GUARD_BYTE 0xa5
#define POISON_BYTE 0xff /* bf16 and fp32 NaN */
#define BOUND 1e-2       /* bf16 elements */
#define BOUND_F32 1e-5   /* fp32 elements */

/* bytes of poisoned device memory and the guard after them */
static void *out_buf(size_t bytes, struct dg_error *err)
{
    unsigned char guard[GUARD_BYTES];
    void *d = NULL;
    memset(guard, GUARD_BYTE, sizeof guard);
    if (dg_cuda_alloc(&d, bytes + GUARD_BYTES, 0, err) < 0)
        return NULL;
    if (dg_cuda_memset(d, POISON_BYTE, bytes, 0, err) < 0 ||
        dg_cuda_upload((unsigned char *)d + bytes, guard, GUARD_BYTES, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* The same holding the bytes of h (a y that beta reads) instead of the
 * poison. */
static void *init_buf(const void *h, size_t bytes, struct dg_error *err)
{
    void *d = out_buf(bytes, err);
    if (d && dg_cuda_upload(d, h, bytes, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* The n values of d (bf16 or fp32) as floats, after checking the guard;
 * NULL (with a message) on failure. */
static float *fetch(const void *d, size_t n, int f32, const char *what)
{
    struct dg_error err = {0};
    const size_t bytes = n * (f32 ? 4 : 2);
    unsigned char *h = malloc(bytes + GUARD_BYTES);
    float *v = malloc(n * sizeof *v + 1);
    if (!h || !v || dg_cuda_sync(0, &err) < 0 ||
        dg_cuda_download(h, d, bytes + GUARD_BYTES, 0, &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        goto fail;
    }
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (h[bytes + i] != GUARD_BYTE) {
            printf("# %s: guard byte %zu after the output changed\n", what, i);
            goto fail;
        }
    for (size_t i = 0; i < n; i++) {
        if (f32)
            memcpy(&v[i], h + 4 * i, 4);
        else
            v[i] = dg_bf16_to_f32((uint16_t)(h[2 * i] | h[2 * i + 1] << 8));
        if (isnan(v[i])) {
            printf("# %s: NaN at %zu\n", what, i);
            goto fail;
        }
    }
    free(h);
    return v;
fail:
    free(h);
    free(v);
    return NULL;
}

static double rel_err(const float *o, const float *r, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)o[i] - r[i]) * ((double)o[i] - r[i]);
        den += (double)r[i] * r[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- cases -------------------------------------------------------------------------- */

/* y = x W^T: bf16 elements through dg_blas_linear, fp32 ones through
 * dg_blas_gemm_e (whose output is fp32 whatever y_f32 says). */
static int linear(void)
{
    static const struct {
        int64_t T, N, K, ldw;
    } shapes[] = {{1, 128, 2816, 2816}, {7, 33, 100, 100},  {129, 2112, 704, 704},
                  {64, 256, 2816, 5632}, {3, 1000, 5, 8},   {300, 77, 1408, 1408}};
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (int f = 0; f < 2; f++) {
        const enum dg_elt e = f ? DG_ELT_F32 : DG_ELT_BF16;
        const size_t esz = (size_t)dg_elt_size(e);
        const double bound = f ? BOUND_F32 : BOUND;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            const int64_t T = shapes[k].T, N = shapes[k].N, K = shapes[k].K, ld = shapes[k].ldw;
            void *hx, *hw;
            float *fx, *fw, *ref = malloc((size_t)(T * N) * sizeof *ref);
            float *row = malloc((size_t)K * 4);
            struct dg_weight W;
            void *dx, *dw;
            CHECK(ref && row && gt_rand_elts(e, (size_t)(T * K), 1.0f, &hx, &fx) == 0 &&
                  gt_rand_elts(e, (size_t)(N * ld), 0.05f, &hw, &fw) == 0);
            memset(&W, 0, sizeof W);
            W.data = hw;
            W.dtype = f ? DG_DTYPE_F32 : DG_DTYPE_BF16;
            W.rows = N;
            W.cols = K;
            W.stride = ld;
            dg_ref_matmul(ref, fx, T, &W, row);
            dx = gt_upload(hx, (size_t)(T * K) * esz, &err);
            dw = gt_upload(hw, (size_t)(N * ld) * esz, &err);
            CHECKF(dx && dw, "%s", err.msg);
            for (int y32 = 0; y32 < 2; y32++) {
                const int out_f32 = y32 || f;
                void *dy = out_buf((size_t)(T * N) * (out_f32 ? 4 : 2), &err);
                char what[160];
                float *o;
                double r;
                CHECKF(dy, "%s", err.msg);
                if (f)
                    CHECK_OK(dg_blas_gemm_e(blas, e, dy, y32, dx, T, dw, 0, N, K, ld, 1.0f, 0.0f,
                                            &err),
                             &err);
                else
                    CHECK_OK(dg_blas_linear(blas, dy, y32, dx, T, dw, N, K, ld, &err), &err);
                snprintf(what, sizeof what,
                         "linear%s [%lld x %lld] . [%lld x %lld (ld %lld)]^T -> %s%s",
                         f ? " f32" : "", (long long)T, (long long)K, (long long)N,
                         (long long)K, (long long)ld, out_f32 ? "fp32" : "bf16",
                         f ? (y32 ? " (y_f32 1)" : " (y_f32 0)") : "");
                o = fetch(dy, (size_t)(T * N), out_f32, what);
                CHECK(o);
                r = rel_err(o, ref, (size_t)(T * N));
                printf("# %s: relative error %.2e\n", what, r);
                CHECKF(r <= bound, "%s: %.3e", what, r);
                free(o);
                dg_cuda_free(dy);
            }
            dg_cuda_free(dx);
            dg_cuda_free(dw);
            free(hx);
            free(fx);
            free(hw);
            free(fw);
            free(ref);
            free(row);
        }
    }
    CHECK(dg_blas_linear(blas, NULL, 0, NULL, 0, NULL, 4, 4, 4, &err) == -DG_E_INVAL);
    CHECK(dg_blas_linear(blas, NULL, 0, NULL, 2, NULL, 4, 8, 4, &err) == -DG_E_INVAL);
    /* (the fp32 form keeps the checks: no rows; ldw below a row of W, either layout) */
    CHECK(dg_blas_gemm_e(blas, DG_ELT_F32, NULL, 0, NULL, 0, NULL, 0, 4, 4, 4, 1.0f, 0.0f,
                         &err) == -DG_E_INVAL);
    CHECK(dg_blas_gemm_e(blas, DG_ELT_F32, NULL, 1, NULL, 2, NULL, 0, 4, 8, 4, 1.0f, 0.0f,
                         &err) == -DG_E_INVAL);
    CHECK(dg_blas_gemm_e(blas, DG_ELT_F32, NULL, 1, NULL, 2, NULL, 1, 8, 4, 4, 1.0f, 0.0f,
                         &err) == -DG_E_INVAL);
    dg_blas_destroy(blas);
    return 0;
}

/* y = alpha x op(W) + beta y0, op(W) = W^T (w_kn 0, W [N, K]) or W (w_kn
 * 1, W [K, N]), W's rows padded; bf16 elements through dg_blas_gemm, fp32
 * ones through dg_blas_gemm_e; y bf16 (bf16 elements, y_f32 0) or fp32.
 * The reference: dg_ref_matmul over W (or, for w_kn 1, over its transpose
 * as an [N, K] weight), then alpha and beta in double. */
static int gemm_alpha_beta(void)
{
    static const struct {
        int64_t T, N, K, pad;
    } shapes[] = {{5, 33, 100, 0}, {129, 256, 704, 3}, {1, 1000, 64, 8}};
    static const float coef[][2] = {{1.5f, 0.75f}, {-0.5f, 1.0f}, {2.0f, 0.0f}};
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (int f = 0; f < 2; f++) {
        const enum dg_elt e = f ? DG_ELT_F32 : DG_ELT_BF16;
        const size_t esz = (size_t)dg_elt_size(e);
        const double bound = f ? BOUND_F32 : BOUND;
        for (int w_kn = 0; w_kn < 2; w_kn++)
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                const int64_t T = shapes[k].T, N = shapes[k].N, K = shapes[k].K;
                const int64_t ld = (w_kn ? N : K) + shapes[k].pad;
                const size_t nw = (size_t)((w_kn ? K : N) * ld), ny = (size_t)(T * N);
                void *hx, *hw, *dx, *dw;
                float *fx, *fw, *wt = malloc((size_t)(N * K) * sizeof *wt);
                float *prod = malloc(ny * sizeof *prod), *ref = malloc(ny * sizeof *ref);
                float *row = malloc((size_t)K * 4);
                struct dg_weight W;
                CHECK(wt && prod && ref && row &&
                      gt_rand_elts(e, (size_t)(T * K), 1.0f, &hx, &fx) == 0 &&
                      gt_rand_elts(e, nw, 0.05f, &hw, &fw) == 0);
                memset(&W, 0, sizeof W);
                W.dtype = DG_DTYPE_F32;
                W.rows = N;
                W.cols = K;
                if (w_kn) {
                    for (int64_t i = 0; i < K; i++)
                        for (int64_t j = 0; j < N; j++)
                            wt[j * K + i] = fw[i * ld + j];
                    W.data = wt;
                    W.stride = K;
                } else {
                    W.data = fw;
                    W.stride = ld;
                }
                dg_ref_matmul(prod, fx, T, &W, row);
                dx = gt_upload(hx, (size_t)(T * K) * esz, &err);
                dw = gt_upload(hw, nw * esz, &err);
                CHECKF(dx && dw, "%s", err.msg);
                for (int y32 = 0; y32 < 2; y32++)
                    for (size_t c = 0; c < sizeof coef / sizeof coef[0]; c++) {
                        const float alpha = coef[c][0], beta = coef[c][1];
                        const int out_f32 = y32 || f;
                        const size_t osz = out_f32 ? 4 : 2;
                        void *hy, *dy;
                        float *fy, *o;
                        char what[192];
                        double r;
                        /* y0 of y's type; beta 0: the poison (cuBLAS must not read y) */
                        CHECK(gt_rand_elts(out_f32 ? DG_ELT_F32 : DG_ELT_BF16, ny, 1.0f, &hy,
                                        &fy) == 0);
                        for (size_t i = 0; i < ny; i++)
                            ref[i] = (float)((double)alpha * prod[i] +
                                             (beta != 0.0f ? (double)beta * fy[i] : 0.0));
                        dy = beta != 0.0f ? init_buf(hy, ny * osz, &err)
                                          : out_buf(ny * osz, &err);
                        CHECKF(dy, "%s", err.msg);
                        if (f)
                            CHECK_OK(dg_blas_gemm_e(blas, e, dy, y32, dx, T, dw, w_kn, N, K, ld,
                                                    alpha, beta, &err),
                                     &err);
                        else
                            CHECK_OK(dg_blas_gemm(blas, dy, y32, dx, T, dw, w_kn, N, K, ld,
                                                  alpha, beta, &err),
                                     &err);
                        snprintf(what, sizeof what,
                                 "gemm %s %g [%lld x %lld] . %s[%lld x %lld (ld %lld)] + %g y "
                                 "-> %s", f ? "f32" : "bf16", (double)alpha, (long long)T,
                                 (long long)K, w_kn ? "" : "T", (long long)(w_kn ? K : N),
                                 (long long)(w_kn ? N : K), (long long)ld, (double)beta,
                                 out_f32 ? "fp32" : "bf16");
                        o = fetch(dy, ny, out_f32, what);
                        CHECK(o);
                        r = rel_err(o, ref, ny);
                        printf("# %s: relative error %.2e\n", what, r);
                        CHECKF(r <= bound, "%s: %.3e", what, r);
                        free(o);
                        free(hy);
                        free(fy);
                        dg_cuda_free(dy);
                    }
                dg_cuda_free(dx);
                dg_cuda_free(dw);
                free(hx);
                free(fx);
                free(hw);
                free(fw);
                free(wt);
                free(prod);
                free(ref);
                free(row);
            }
    }
    dg_blas_destroy(blas);
    return 0;
}

static int gelu_mul(void)
{
    static const struct {
        int64_t rows;
        int n;
    } shapes[] = {{1, 5}, {9, 704}, {128, 2112}, {33, 1000}};
    for (int f = 0; f < 2; f++) {
        const enum dg_elt e = f ? DG_ELT_F32 : DG_ELT_BF16;
        const size_t esz = (size_t)dg_elt_size(e);
        const double bound = f ? BOUND_F32 : BOUND;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            const int64_t R = shapes[k].rows;
            const int n = shapes[k].n;
            const size_t cells = (size_t)R * n;
            struct dg_error err = {0};
            void *hgu;
            float *fgu, *ref = malloc(cells * sizeof *ref);
            void *dgu, *dout;
            char what[96];
            float *o;
            double r;
            /* one fused projection per row: gate in [0, n), up in [n, 2n) */
            CHECK(ref && gt_rand_elts(e, cells * 2, 3.0f, &hgu, &fgu) == 0);
            for (int64_t i = 0; i < R; i++)
                dg_ref_gelu_mul(ref + i * n, fgu + i * 2 * n, fgu + i * 2 * n + n, n);
            dgu = gt_upload(hgu, cells * 2 * esz, &err);
            dout = out_buf(cells * esz, &err);
            CHECKF(dgu && dout, "%s", err.msg);
            if (f)
                CHECK_OK(dg_cuda_gelu_mul_e(e, dout, n, dgu, 2 * n,
                                            (const unsigned char *)dgu + (size_t)n * esz, 2 * n,
                                            R, n, NULL, 0, &err),
                         &err);
            else
                CHECK_OK(dg_cuda_gelu_mul(dout, n, dgu, 2 * n, (const uint16_t *)dgu + n, 2 * n,
                                          R, n, NULL, 0, &err),
                         &err);
            snprintf(what, sizeof what, "gelu_mul%s %lld x %d", f ? " f32" : "", (long long)R,
                     n);
            o = fetch(dout, cells, f, what);
            CHECK(o);
            r = rel_err(o, ref, cells);
            printf("# %s: relative error %.2e\n", what, r);
            CHECKF(r <= bound, "%s: %.3e", what, r);
            free(o);
            dg_cuda_free(dgu);
            dg_cuda_free(dout);
            free(hgu);
            free(fgu);
            free(ref);
        }
    }
    {
        struct dg_error err = {0};
        /* (the fp32 form keeps the checks: a row stride below n; no rows: nothing to do) */
        CHECK(dg_cuda_gelu_mul_e(DG_ELT_F32, NULL, 3, NULL, 8, NULL, 8, 2, 4, NULL, 0, &err) ==
              -DG_E_INVAL);
        CHECK(dg_cuda_gelu_mul_e(DG_ELT_F32, NULL, 4, NULL, 8, NULL, 8, 0, 4, NULL, 0, &err) ==
              0);
    }
    return 0;
}

/* An element type other than the two: refused (DG_E_INVAL, "element type")
 * by calls otherwise valid, over real buffers, which stay as they were. */
static int elt_refused(void)
{
    const enum dg_elt bad = (enum dg_elt)7;
    float in[64];
    unsigned char back[sizeof in + GUARD_BYTES];
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    void *dx, *dw, *dy;
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        in[i] = 0.5f;
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    dx = gt_upload(in, sizeof in, &err);
    dw = gt_upload(in, sizeof in, &err);
    dy = out_buf(sizeof in, &err);
    CHECKF(dx && dw && dy, "%s", err.msg);
    CHECK_FAILS(dg_cuda_gelu_mul_e(bad, dy, 4, dx, 8, (const float *)dx + 4, 8, 8, 4, NULL, 0,
                                   &err),
                &err, DG_E_INVAL, "element type");
    for (int w_kn = 0; w_kn < 2; w_kn++)
        for (int y32 = 0; y32 < 2; y32++)
            CHECK_FAILS(dg_blas_gemm_e(blas, bad, dy, y32, dx, 8, dw, w_kn, 8, 8, 8, 1.0f, 0.0f,
                                       &err),
                        &err, DG_E_INVAL, "element type");
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(back, dy, sizeof back, 0, &err), &err);
    for (size_t i = 0; i < sizeof back; i++)
        CHECKF(back[i] == (i < sizeof in ? POISON_BYTE : GUARD_BYTE),
               "refused call wrote byte %zu of its output", i);
    dg_cuda_free(dx);
    dg_cuda_free(dw);
    dg_cuda_free(dy);
    dg_blas_destroy(blas);
    return 0;
}

static int router(void)
{
    static const struct {
        int64_t T;
        int E, K;
    } shapes[] = {{1, 128, 8}, {37, 128, 8}, {256, 8, 2}, {5, 6, 3}, {100, 40, 1}, {3, 130, 32},
                  {9, 256, 8}, {4, 300, 8}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T;
        const int E = shapes[k].E, K = shapes[k].K;
        struct dg_error err = {0};
        float *logits = malloc((size_t)(T * E) * 4), *scale = malloc((size_t)E * 4);
        int *ridx = malloc((size_t)(T * K) * sizeof *ridx);
        float *rw = malloc((size_t)(T * K) * 4), *gw;
        int32_t *gidx = malloc((size_t)(T * K) * 4);
        void *dl, *ds, *didx, *dw;
        double worst = 0;
        CHECK(logits && scale && ridx && rw && gidx);
        for (int64_t i = 0; i < T * E; i++)
            logits[i] = gt_uniform() * 4.0f;
        for (int e = 0; e < E; e++)
            scale[e] = 0.5f + (gt_uniform() + 1.0f);
        for (int64_t t = 0; t < T; t++)
            dg_ref_router_topk(ridx + t * K, rw + t * K, logits + t * E, E, K, scale);
        dl = gt_upload(logits, (size_t)(T * E) * 4, &err);
        ds = gt_upload(scale, (size_t)E * 4, &err);
        didx = out_buf((size_t)(T * K) * 4, &err);
        dw = out_buf((size_t)(T * K) * 4, &err);
        CHECKF(dl && ds && didx && dw, "%s", err.msg);
        CHECK_OK(dg_cuda_router_topk(didx, dw, dl, T, E, K, ds, NULL, 0, &err), &err);
        gw = fetch(dw, (size_t)(T * K), 1, "router weights");
        CHECK(gw);
        {
            float *gi = fetch(didx, (size_t)(T * K), 1, "router ids"); /* (guard check) */
            CHECK(gi);
            free(gi);
        }
        CHECK(dg_cuda_download(gidx, didx, (size_t)(T * K) * 4, 0, &err) == 0);
        for (int64_t i = 0; i < T * K; i++) {
            const double d = fabs((double)gw[i] - rw[i]) / fabs((double)rw[i]);
            CHECKF(gidx[i] == ridx[i], "router %lld/%d/%d: token %lld pick %lld: expert %d, "
                   "reference %d", (long long)T, E, K, (long long)(i / K), (long long)(i % K),
                   gidx[i], ridx[i]);
            worst = d > worst ? d : worst;
        }
        printf("# router %lld tokens, top-%d of %d: ids equal, weights within %.1e\n",
               (long long)T, K, E, worst);
        CHECKF(worst <= 1e-5, "router weights off by %.2e", worst);
        free(gw);
        dg_cuda_free(dl);
        dg_cuda_free(ds);
        dg_cuda_free(didx);
        dg_cuda_free(dw);
        free(logits);
        free(scale);
        free(ridx);
        free(rw);
        free(gidx);
    }
    {
        struct dg_error err = {0};
        CHECK(dg_cuda_router_topk(NULL, NULL, NULL, 4, 8, 9, NULL, NULL, 0, &err) == -DG_E_INVAL);
        CHECK(dg_cuda_router_topk(NULL, NULL, NULL, 4, 64, 33, NULL, NULL, 0, &err) ==
              -DG_E_INVAL);
    }
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-mlp");
    if (rc)
        return rc;
    gt_seed(0x9b05688c2b3e6c1full);
    TEST_CASE(linear);
    TEST_CASE(gemm_alpha_beta);
    TEST_CASE(gelu_mul);
    TEST_CASE(router);
    TEST_CASE(elt_refused);
    return test_finish();
}
