/*
 * Description: the mixture-of-experts kernel (sort the picks by expert,
 * gather, two cuBLAS GEMMs per expert with the gated gelu between, sum each
 * token's picks in order) against dg_ref_moe on fresh random tokens,
 * router picks and weights: top-2 of 8 and top-8 of 128 experts, a rank's
 * slice of the experts (picks outside it contribute nothing), every pick on
 * one expert, no pick in the slice (zeros).  Output poisoned before, guard
 * words after; bound ||out - ref|| / ||ref|| <= 1e-2 (bf16 intermediates),
 * never a NaN.  Exit 77 where there is no GPU.
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

#define GUARD 64
#define GUARD_F 12345.5f

struct shape {
    const char *what;
    int64_t T;
    int H, I, E, K, e0, n_exp;
    int one_expert;     /* every pick on expert e0 (K = 1) */
};

static int one(struct dg_blas *blas, const struct shape *s)
{
    const int64_t T = s->T;
    const int H = s->H, I = s->I, K = s->K, n_exp = s->n_exp;
    const size_t ngu = (size_t)n_exp * 2 * I * H, ndn = (size_t)n_exp * H * I;
    struct dg_error err = {0};
    uint16_t *hx = malloc((size_t)(T * H) * 2), *hgu = malloc(ngu * 2), *hdn = malloc(ndn * 2);
    float *fx = malloc((size_t)(T * H) * 4), *fgu = malloc(ngu * 4), *fdn = malloc(ndn * 4);
    float *w = malloc((size_t)(T * K) * 4), *ref = malloc((size_t)(T * H) * 4);
    float *got = malloc(((size_t)(T * H) + GUARD) * 4);
    int32_t *idx = malloc((size_t)(T * K) * 4);
    struct dg_weight *wgu = calloc((size_t)n_exp, sizeof *wgu), *wdn = calloc((size_t)n_exp, sizeof *wdn);
    void *dx, *dgu, *ddn, *didx, *dw, *dout = NULL, *scratch = NULL;
    double num = 0, den = 0;

    CHECK(hx && hgu && hdn && fx && fgu && fdn && w && ref && got && idx && wgu && wdn);
    for (size_t i = 0; i < (size_t)(T * H); i++) {
        hx[i] = dg_f32_to_bf16(gt_uniform());
        fx[i] = dg_bf16_to_f32(hx[i]);
    }
    for (size_t i = 0; i < ngu; i++) {
        hgu[i] = dg_f32_to_bf16(gt_uniform() * 0.06f);
        fgu[i] = dg_bf16_to_f32(hgu[i]);
    }
    for (size_t i = 0; i < ndn; i++) {
        hdn[i] = dg_f32_to_bf16(gt_uniform() * 0.06f);
        fdn[i] = dg_bf16_to_f32(hdn[i]);
    }
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do { /* K distinct experts per token */
                e = s->one_expert ? s->e0 : (int)(gt_next() % (uint64_t)s->E);
                dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= idx[t * K + j] == e;
            } while (dup && !s->one_expert);
            idx[t * K + k] = e;
            w[t * K + k] = 0.1f + (gt_uniform() + 1.0f) * 0.4f;
        }
    for (int e = 0; e < n_exp; e++) {
        wgu[e] = (struct dg_weight){hgu + (size_t)e * 2 * I * H, DG_DTYPE_BF16, 2 * (int64_t)I, H,
                                    H, "gate_up"};
        wdn[e] = (struct dg_weight){hdn + (size_t)e * H * I, DG_DTYPE_BF16, H, I, I, "down"};
    }
    CHECK(dg_ref_moe(ref, fx, T, H, idx, w, K, s->e0, n_exp, I, wgu, wdn) == 0);

    dx = gt_upload(hx, (size_t)(T * H) * 2, &err);
    dgu = gt_upload(hgu, ngu * 2, &err);
    ddn = gt_upload(hdn, ndn * 2, &err);
    didx = gt_upload(idx, (size_t)(T * K) * 4, &err);
    dw = gt_upload(w, (size_t)(T * K) * 4, &err);
    for (int i = 0; i < GUARD; i++)
        got[(size_t)(T * H) + (size_t)i] = GUARD_F;
    CHECKF(dx && dgu && ddn && didx && dw &&
               dg_cuda_alloc(&dout, ((size_t)(T * H) + GUARD) * 4, 0, &err) == 0 &&
               dg_cuda_memset(dout, 0xff, (size_t)(T * H) * 4, 0, &err) == 0 &&
               dg_cuda_upload((float *)dout + T * H, got + T * H, GUARD * 4, 0, &err) == 0 &&
               dg_cuda_alloc(&scratch, dg_cuda_moe_scratch(T, K, H, I, n_exp), 0, &err) == 0,
           "%s", err.msg);
    CHECK_OK(dg_cuda_moe(blas, dout, dx, T, H, didx, dw, K, s->e0, n_exp, I, dgu, ddn, scratch,
                         NULL, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(got, dout, ((size_t)(T * H) + GUARD) * 4, 0, &err), &err);
    for (int i = 0; i < GUARD; i++)
        CHECKF(got[(size_t)(T * H) + (size_t)i] == GUARD_F, "%s: guard %d changed", s->what, i);
    for (size_t i = 0; i < (size_t)(T * H); i++) {
        CHECKF(!isnan(got[i]), "%s: NaN at %zu", s->what, i);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) {
        printf("# moe %s: all zeros, as the reference\n", s->what);
        CHECK(num == 0);
    } else {
        printf("# moe %s: relative error %.2e\n", s->what, sqrt(num / den));
        CHECKF(sqrt(num / den) <= 1e-2, "%s: %.3e", s->what, sqrt(num / den));
    }
    dg_cuda_free(dx);
    dg_cuda_free(dgu);
    dg_cuda_free(ddn);
    dg_cuda_free(didx);
    dg_cuda_free(dw);
    dg_cuda_free(dout);
    dg_cuda_free(scratch);
    free(hx);
    free(hgu);
    free(hdn);
    free(fx);
    free(fgu);
    free(fdn);
    free(w);
    free(ref);
    free(got);
    free(idx);
    free(wgu);
    free(wdn);
    return 0;
}

static int moe(void)
{
    static const struct shape shapes[] = {
        {"37 tokens, top-2 of 8, all experts, H 256, I 64", 37, 256, 64, 8, 2, 0, 8, 0},
        {"200 tokens, top-8 of 128, experts 32..63, H 512, I 176", 200, 512, 176, 128, 8, 32, 32,
         0},
        {"1 token, top-8 of 16, all, H 2816, I 704", 1, 2816, 704, 16, 8, 0, 16, 0},
        {"50 tokens, every pick on expert 3, H 128, I 96", 50, 128, 96, 8, 1, 3, 2, 1},
        {"9 tokens, top-2 of 8, slice 6..7 given picks only below", 9, 64, 32, 6, 2, 6, 2, 0},
    };
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (one(blas, &shapes[k])) {
            dg_blas_destroy(blas);
            return 1;
        }
    CHECK(dg_cuda_moe(blas, NULL, NULL, 3, 0, NULL, NULL, 2, 0, 4, 8, NULL, NULL, NULL, NULL,
                      &err) == -DG_E_INVAL);
    dg_blas_destroy(blas);
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-moe");
    if (rc)
        return rc;
    gt_seed(0x3c6ef372fe94f82bull);
    TEST_CASE(moe);
    return test_finish();
}
