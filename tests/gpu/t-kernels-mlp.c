/*
 * Description: the MLP kernels against their plain-C references on fresh
 * random inputs at several shapes (sizes that are not multiples of the
 * tiles among them): nn.Linear through cuBLAS (bf16 in, fp32 accumulate,
 * bf16 or fp32 out, weights a column slice of a wider matrix), the gated
 * middle gelu_tanh(gate) * up over the two halves of one fused
 * projection, and the MoE router's softmax and top-k (expert ids exactly,
 * weights within fp32 rounding).  Outputs poisoned before the launch,
 * guard words after them checked; bf16 bound ||out - ref|| / ||ref|| <=
 * 1e-2, never a NaN; each shape's error printed ("# ...").  Exit 77 where
 * there is no GPU.
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
#define BOUND 1e-2

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

static int linear(void)
{
    static const struct {
        int64_t T, N, K, ldw;
    } shapes[] = {{1, 128, 2816, 2816}, {7, 33, 100, 100},  {129, 2112, 704, 704},
                  {64, 256, 2816, 5632}, {3, 1000, 5, 8},   {300, 77, 1408, 1408}};
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t T = shapes[k].T, N = shapes[k].N, K = shapes[k].K, ld = shapes[k].ldw;
        uint16_t *hx, *hw;
        float *fx, *fw, *ref = malloc((size_t)(T * N) * sizeof *ref), *row = malloc((size_t)K * 4);
        struct dg_weight W;
        void *dx, *dw;
        CHECK(ref && row && gt_rand_bf16((size_t)(T * K), 1.0f, &hx, &fx) == 0 &&
              gt_rand_bf16((size_t)(N * ld), 0.05f, &hw, &fw) == 0);
        memset(&W, 0, sizeof W);
        W.data = hw;
        W.dtype = DG_DTYPE_BF16;
        W.rows = N;
        W.cols = K;
        W.stride = ld;
        dg_ref_matmul(ref, fx, T, &W, row);
        dx = gt_upload(hx, (size_t)(T * K) * 2, &err);
        dw = gt_upload(hw, (size_t)(N * ld) * 2, &err);
        CHECKF(dx && dw, "%s", err.msg);
        for (int f32 = 0; f32 < 2; f32++) {
            void *dy = out_buf((size_t)(T * N) * (f32 ? 4 : 2), &err);
            char what[128];
            float *o;
            double e;
            CHECKF(dy, "%s", err.msg);
            CHECK_OK(dg_blas_linear(blas, dy, f32, dx, T, dw, N, K, ld, &err), &err);
            snprintf(what, sizeof what, "linear [%lld x %lld] . [%lld x %lld (ld %lld)]^T -> %s",
                     (long long)T, (long long)K, (long long)N, (long long)K, (long long)ld,
                     f32 ? "fp32" : "bf16");
            o = fetch(dy, (size_t)(T * N), f32, what);
            CHECK(o);
            e = rel_err(o, ref, (size_t)(T * N));
            printf("# %s: relative error %.2e\n", what, e);
            CHECKF(e <= BOUND, "%s: %.3e", what, e);
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
    CHECK(dg_blas_linear(blas, NULL, 0, NULL, 0, NULL, 4, 4, 4, &err) == -DG_E_INVAL);
    CHECK(dg_blas_linear(blas, NULL, 0, NULL, 2, NULL, 4, 8, 4, &err) == -DG_E_INVAL);
    dg_blas_destroy(blas);
    return 0;
}

static int gelu_mul(void)
{
    static const struct {
        int64_t rows;
        int n;
    } shapes[] = {{1, 5}, {9, 704}, {128, 2112}, {33, 1000}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t R = shapes[k].rows;
        const int n = shapes[k].n;
        const size_t cells = (size_t)R * n;
        struct dg_error err = {0};
        uint16_t *hgu;
        float *fgu, *ref = malloc(cells * sizeof *ref);
        void *dgu, *dout;
        char what[96];
        float *o;
        double e;
        /* one fused projection per row: gate in [0, n), up in [n, 2n) */
        CHECK(ref && gt_rand_bf16(cells * 2, 3.0f, &hgu, &fgu) == 0);
        for (int64_t r = 0; r < R; r++)
            dg_ref_gelu_mul(ref + r * n, fgu + r * 2 * n, fgu + r * 2 * n + n, n);
        dgu = gt_upload(hgu, cells * 4, &err);
        dout = out_buf(cells * 2, &err);
        CHECKF(dgu && dout, "%s", err.msg);
        CHECK_OK(dg_cuda_gelu_mul(dout, n, dgu, 2 * n, (const uint16_t *)dgu + n, 2 * n, R, n,
                                  NULL, 0, &err),
                 &err);
        snprintf(what, sizeof what, "gelu_mul %lld x %d", (long long)R, n);
        o = fetch(dout, cells, 0, what);
        CHECK(o);
        e = rel_err(o, ref, cells);
        printf("# %s: relative error %.2e\n", what, e);
        CHECKF(e <= BOUND, "%s: %.3e", what, e);
        free(o);
        dg_cuda_free(dgu);
        dg_cuda_free(dout);
        free(hgu);
        free(fgu);
        free(ref);
    }
    return 0;
}

static int router(void)
{
    static const struct {
        int64_t T;
        int E, K;
    } shapes[] = {{1, 128, 8}, {37, 128, 8}, {256, 8, 2}, {5, 6, 3}, {100, 40, 1}, {3, 130, 32}};
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
    TEST_CASE(gelu_mul);
    TEST_CASE(router);
    return test_finish();
}
