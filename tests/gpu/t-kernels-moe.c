/*
 * Description: the mixture-of-experts kernel (sort the picks by expert,
 * gather, two cuBLAS GEMMs per expert with the gated gelu between, sum each
 * token's picks in order) against dg_ref_moe on fresh random tokens,
 * router picks and weights: top-2 of 8 and top-8 of 128 experts, a rank's
 * slice of the experts (picks outside it contribute nothing), every pick on
 * one expert, no pick in the slice (zeros), and the model's shapes (top-8
 * of 128, H 2816, I 704) where the bf16 products take the grouped GEMM of
 * moe-gemm.cu, with a group longer than its 128-row pass, past 128 rows
 * an expert (the batched GEMMs) with random picks and with runs of 257
 * rows whose last tiles lie past the batched GEMMs' fixed count (on
 * Hopper with bf16 those rows go through the one launch), and rows of
 * H 100 and 70 (not a multiple of 16 bytes: the gather that copies
 * element by element).  Every shape with bf16
 * elements (dg_cuda_moe), then with fp32 ones (dg_cuda_moe_e: fp32 tokens,
 * weights and intermediates; the reference reading fp32 weights).  Output
 * poisoned before, guard words after; bound ||out - ref|| / ||ref|| <=
 * 1e-2 with bf16 elements (bf16 intermediates), 1e-5 with fp32 ones, never
 * a NaN.  Every shape again with bf16 elements and partial sums (the
 * experts split along their width: dg_cuda_moe_e, partial 1), whose
 * outputs must stay fp32 in the scratch (some not bf16 values, out their
 * sum within 1e-6).  An unknown element type refused before anything is
 * written.
 * The grouped GEMM alone in each of its configurations (K step, pipeline
 * depth, warp grid) against dg_ref_matmul_f64 per group, at means of 16,
 * 35 and 85 rows a group (passes of 2, 4 and 8 m-tiles), fp32 outputs
 * equal to configuration 0's to the bit where the configuration adds in
 * its order (all but the wgmma one: dg_cuda_grouped_gemm_config_exact)
 * (grouped_configs).
 * The gated form (the gelu in the first product's epilogue) against the
 * separate GEMM and gelu, to the bit, and dg_ref_expert_hidden
 * (grouped_gelu).
 * Both products in one launch (Hopper) against the two launches, to the
 * bit (experts_one_launch).
 * The routing stages (counts, tile schedule, slots, gather, the rows past
 * the batched GEMMs' tiles) and the ordered sum on their own against
 * dg_ref_moe_route, dg_ref_moe_overflow and dg_ref_moe_combine
 * (route_combine).
 * Exit 77 where there is no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/moe-gemm.h"
#include "kernels/moe-wgmma.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 64
#define GUARD_F 12345.5f
#define BOUND 1e-2     /* bf16 elements */
#define BOUND_F32 1e-5 /* fp32 elements */

struct shape {
    const char *what;
    int64_t T;
    int H, I, E, K, e0, n_exp;
    int one_expert;     /* every pick on expert e0 (K = 1) */
    int runs_257;       /* the picks of craft_picks (K distinct experts a token) */
};

/* n fp32 values of 0xff bytes (NaN) on the device and GUARD words of
 * GUARD_F after them */
static void *out_buf(size_t n, struct dg_error *err)
{
    float guard[GUARD];
    void *d = NULL;
    for (int i = 0; i < GUARD; i++)
        guard[i] = GUARD_F;
    if (dg_cuda_alloc(&d, (n + GUARD) * 4, 0, err) < 0)
        return NULL;
    if (dg_cuda_memset(d, 0xff, n * 4, 0, err) < 0 ||
        dg_cuda_upload((float *)d + n, guard, sizeof guard, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

/* The model's experts for a shape whose picks are drawn from its first E:
 * E, or e0 + n_exp where the rank's slice lies past them (a slice no pick
 * reaches). */
static int n_all_of(int E, int e0, int n_exp)
{
    return e0 + n_exp > E ? e0 + n_exp : E;
}

/* Router picks for T tokens: K distinct experts of E per token, or every
 * pick on expert one (K = 1), into idx [T, K]. */
static void draw_picks(int32_t *idx, int64_t T, int K, int E, int one)
{
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = one >= 0 ? one : (int)(gt_next() % (uint64_t)E);
                dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= idx[t * K + j] == e;
            } while (dup && one < 0);
            idx[t * K + k] = e;
        }
}

/* Picks for T tokens, top-K of the n_exp experts e0 ..: every expert but
 * the last 257 (two tiles of 128 and one row), the last the rest, so that
 * at T 1024, K 8 and 32 experts the runs need 95 tiles of 128 where the
 * batched GEMMs run 92 (moe.cu's bound: 64 + 16 + 12): expert 30's last
 * row and expert 31's 225 go to the one launch.  The sorted list of picks
 * goes round the tokens (pick i to token i mod T), so no token gets an
 * expert twice while no run is longer than T.  0, or -1 when the shape
 * cannot hold it. */
static int craft_picks(int32_t *idx, int64_t T, int K, int e0, int n_exp)
{
    const int64_t picks = T * K, rest = picks - (int64_t)(n_exp - 1) * 257;
    int64_t i = 0;
    if (rest < 1 || rest > T || 257 > T)
        return -1;
    for (int j = 0; j < n_exp; j++)
        for (int64_t c = 0; c < (j + 1 < n_exp ? 257 : rest); c++, i++)
            idx[(i % T) * K + i / T] = e0 + j;
    return 0;
}

/* The outputs of a call with partial sums (dg_cuda_moe_e, partial 1) as
 * they lie in its scratch: fp32 rows (view's ys, by view's slot_of), from
 * which dg_ref_moe_combine gives the call's out got [T, H] within 1e-6,
 * and not all of them bf16 values (the low 16 bits of some set: they were
 * not rounded to bf16).  0 or 1. */
static int ys_kept_f32(const struct shape *s, const struct dg_moe_route_view *v, const float *w,
                       const float *got)
{
    const int64_t T = s->T, picks = T * s->K, n = v->rows * s->H;
    float *ys = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)(T * s->H));
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)picks);
    struct dg_error err = {0};
    int64_t unrounded = 0, used = 0;
    double worst = 0;

    CHECK(ys && ref && slot);
    CHECK_OK(dg_cuda_download(ys, v->ys, sizeof(float) * (size_t)n, 0, &err), &err);
    CHECK_OK(dg_cuda_download(slot, v->slot_of, sizeof(int32_t) * (size_t)picks, 0, &err), &err);
    dg_ref_moe_combine(ref, ys, slot, w, T, s->K, s->H);
    for (int64_t p = 0; p < picks; p++) {
        used += slot[p] >= 0;
        for (int i = 0; slot[p] >= 0 && i < s->H; i++) {
            uint32_t u;
            memcpy(&u, &ys[(int64_t)slot[p] * s->H + i], 4);
            unrounded += (u & 0xffffu) != 0;
        }
    }
    for (int64_t i = 0; i < T * s->H; i++) {
        const double d = fabs((double)got[i] - ref[i]) / (1.0 + fabs(ref[i]));
        worst = d > worst ? d : worst;
    }
    printf("# moe partial %s: %lld outputs not bf16 values; out within %.1e of their sum\n",
           s->what, (long long)unrounded, worst);
    CHECKF(worst <= 1e-6, "moe partial %s: out %.3e from the sum of the fp32 outputs", s->what,
           worst);
    CHECKF(unrounded > 0 || used == 0, "moe partial %s: every output a bf16 value", s->what);
    free(ys), free(ref), free(slot);
    return 0;
}

/* bf16 elements: dg_cuda_moe and its scratch; fp32: the _e forms;
 * partial (bf16 elements): dg_cuda_moe_e with partial sums, whose outputs
 * stay fp32 (ys_kept_f32) */
static int one(struct dg_blas *blas, const struct shape *s, enum dg_elt elt, int partial)
{
    const int64_t T = s->T;
    const int H = s->H, I = s->I, K = s->K, n_exp = s->n_exp;
    const int n_all = n_all_of(s->E, s->e0, n_exp);
    const size_t ngu = (size_t)n_exp * 2 * I * H, ndn = (size_t)n_exp * H * I;
    const int f32 = elt == DG_ELT_F32;
    const size_t esz = (size_t)dg_elt_size(elt);
    const char *tn = f32 ? " f32" : partial ? " partial" : "";
    struct dg_error err = {0};
    void *hx = NULL, *hgu = NULL, *hdn = NULL;
    float *fx = NULL, *fgu = NULL, *fdn = NULL;
    float *w = malloc((size_t)(T * K) * 4), *ref = malloc((size_t)(T * H) * 4);
    float *got = malloc(((size_t)(T * H) + GUARD) * 4);
    int32_t *idx = malloc((size_t)(T * K) * 4);
    struct dg_weight *wgu = calloc((size_t)n_exp, sizeof *wgu), *wdn = calloc((size_t)n_exp, sizeof *wdn);
    void *dx, *dgu, *ddn, *didx, *dw, *dout = NULL, *scratch = NULL;
    struct dg_moe_route_view view;
    double num = 0, den = 0;

    CHECK(w && ref && got && idx && wgu && wdn &&
          gt_rand_elts(elt, (size_t)(T * H), 1.0f, &hx, &fx) == 0 &&
          gt_rand_elts(elt, ngu, 0.06f, &hgu, &fgu) == 0 &&
          gt_rand_elts(elt, ndn, 0.06f, &hdn, &fdn) == 0);
    if (s->runs_257)
        CHECK(craft_picks(idx, T, K, s->e0, n_exp) == 0);
    else
        draw_picks(idx, T, K, s->E, s->one_expert ? s->e0 : -1);
    for (int64_t p = 0; p < T * K; p++)
        w[p] = 0.1f + (gt_uniform() + 1.0f) * 0.4f;
    for (int j = 0; j < n_exp; j++) {
        const enum dg_dtype dt = f32 ? DG_DTYPE_F32 : DG_DTYPE_BF16;
        wgu[j] = (struct dg_weight){.data = (const unsigned char *)hgu +
                                            (size_t)j * 2 * I * H * esz,
                                    .dtype = dt, .rows = 2 * (int64_t)I, .cols = H, .stride = H,
                                    .name = "gate_up"};
        wdn[j] = (struct dg_weight){.data = (const unsigned char *)hdn + (size_t)j * H * I * esz,
                                    .dtype = dt, .rows = H, .cols = I, .stride = I,
                                    .name = "down"};
    }
    CHECK(dg_ref_moe(ref, fx, T, H, idx, w, K, s->e0, n_exp, I, wgu, wdn) == 0);

    dx = gt_upload(hx, (size_t)(T * H) * esz, &err);
    dgu = gt_upload(hgu, ngu * esz, &err);
    ddn = gt_upload(hdn, ndn * esz, &err);
    didx = gt_upload(idx, (size_t)(T * K) * 4, &err);
    dw = gt_upload(w, (size_t)(T * K) * 4, &err);
    CHECKF(dx && dgu && ddn && didx && dw && (dout = out_buf((size_t)(T * H), &err)) &&
               dg_cuda_alloc(&scratch,
                             f32 ? dg_cuda_moe_scratch_e(elt, T, K, H, I, n_exp, n_all)
                                 : dg_cuda_moe_scratch(T, K, H, I, n_exp, n_all),
                             0, &err) == 0,
           "%s", err.msg);
    if (s->runs_257 && !f32 && dg_cuda_experts_wgmma_fits(0, I, H)) {
        /* (the routing alone first: rows are past the batched GEMMs' tiles) */
        struct dg_moe_route_view v;
        int32_t *ov = malloc(sizeof(int32_t) * (size_t)n_exp);
        int64_t past = 0;
        CHECK(ov);
        CHECK_OK(dg_cuda_moe_route_e(elt, dx, T, H, didx, K, s->e0, n_exp, n_all, I, dgu, ddn,
                                     scratch, &v, NULL, 0, &err),
                 &err);
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        CHECK_OK(dg_cuda_download(ov, v.ov_counts, sizeof(int32_t) * (size_t)n_exp, 0, &err),
                 &err);
        for (int j = 0; j < n_exp; j++)
            past += ov[j];
        printf("# moe %s: %lld rows past the batched GEMMs' %lld tiles\n", s->what,
               (long long)past, (long long)v.batched);
        CHECKF(past > 0 && v.batched < v.tiles, "moe %s: no rows past %lld of %lld tiles",
               s->what, (long long)v.batched, (long long)v.tiles);
        free(ov);
    }
    if (partial) {
        /* (where the outputs lie: the routing's view of the same scratch) */
        CHECK_OK(dg_cuda_moe_route_e(elt, dx, T, H, didx, K, s->e0, n_exp, n_all, I, dgu, ddn,
                                     scratch, &view, NULL, 0, &err),
                 &err);
        CHECK_OK(dg_cuda_moe_e(blas, elt, dout, dx, T, H, didx, dw, K, s->e0, n_exp, n_all, I,
                               dgu, ddn, 1, scratch, NULL, &err),
                 &err);
    } else if (f32)
        CHECK_OK(dg_cuda_moe_e(blas, elt, dout, dx, T, H, didx, dw, K, s->e0, n_exp, n_all, I,
                               dgu, ddn, 0, scratch, NULL, &err),
                 &err);
    else
        CHECK_OK(dg_cuda_moe(blas, dout, dx, T, H, didx, dw, K, s->e0, n_exp, n_all, I, dgu, ddn,
                             scratch, NULL, &err),
                 &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(got, dout, ((size_t)(T * H) + GUARD) * 4, 0, &err), &err);
    for (int i = 0; i < GUARD; i++)
        CHECKF(got[(size_t)(T * H) + (size_t)i] == GUARD_F, "moe%s %s: guard %d changed", tn,
               s->what, i);
    for (size_t i = 0; i < (size_t)(T * H); i++) {
        CHECKF(!isnan(got[i]), "moe%s %s: NaN at %zu", tn, s->what, i);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    if (den == 0) {
        printf("# moe%s %s: all zeros, as the reference\n", tn, s->what);
        CHECK(num == 0);
    } else {
        const double r = sqrt(num / den);
        printf("# moe%s %s: relative error %.2e\n", tn, s->what, r);
        CHECKF(r <= (f32 ? BOUND_F32 : BOUND), "moe%s %s: %.3e", tn, s->what, r);
    }
    if (partial && ys_kept_f32(s, &view, w, got))
        return 1;
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
        {"37 tokens, top-2 of 8, all experts, H 256, I 64", 37, 256, 64, 8, 2, 0, 8, 0, 0},
        {"200 tokens, top-8 of 128, experts 32..63, H 512, I 176", 200, 512, 176, 128, 8, 32, 32,
         0, 0},
        {"1 token, top-8 of 16, all, H 2816, I 704", 1, 2816, 704, 16, 8, 0, 16, 0, 0},
        {"50 tokens, every pick on expert 3, H 128, I 96", 50, 128, 96, 8, 1, 3, 2, 1, 0},
        {"9 tokens, top-2 of 8, slice 6..7 given picks only below", 9, 64, 32, 6, 2, 6, 2, 0, 0},
        /* the model's shapes with a canvas' worth of rows an expert (the
         * grouped GEMM of moe-gemm.cu), and a group past one pass */
        {"64 tokens, top-8 of 128, all, H 2816, I 704", 64, 2816, 704, 128, 8, 0, 128, 0, 0},
        {"150 tokens, every pick on expert 0 of 2, H 256, I 64", 150, 256, 64, 2, 1, 0, 2, 1, 0},
        /* past 128 rows an expert: the batched GEMMs (bf16 as fp32), and
         * on Hopper with bf16 the rows of the tiles past their fixed
         * count through the one launch (none, then 226) */
        {"1024 tokens, top-8 of 32, H 256, I 128", 1024, 256, 128, 32, 8, 0, 32, 0, 0},
        {"1024 tokens, top-8 of 32, runs of 257 rows, H 256, I 128", 1024, 256, 128, 32, 8, 0,
         32, 0, 1},
        /* a rank holding half the experts (planned for half the picks)
         * and given all of them: 35 tiles past the batched GEMMs' 60 */
        {"1024 tokens, top-8, experts 32..63 of 64 given every pick, runs of 257 rows, H 256, "
         "I 128", 1024, 256, 128, 64, 8, 32, 32, 0, 1},
        /* rows that are not a multiple of 16 bytes: the element-wise gather
         * (H 100 in bf16, H 70 in both) */
        {"21 tokens, top-2 of 8, all, H 100, I 48", 21, 100, 48, 8, 2, 0, 8, 0, 0},
        {"13 tokens, top-2 of 4, all, H 70, I 40", 13, 70, 40, 4, 2, 0, 4, 0, 0},
    };
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (int f = 0; f < 3; f++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            if (one(blas, &shapes[k], f == 1 ? DG_ELT_F32 : DG_ELT_BF16, f == 2)) {
                dg_blas_destroy(blas);
                return 1;
            }
    CHECK(dg_cuda_moe(blas, NULL, NULL, 3, 0, NULL, NULL, 2, 0, 4, 4, 8, NULL, NULL, NULL,
                      NULL, &err) == -DG_E_INVAL);
    /* a slice past the model's experts, or of more than it has */
    CHECK_FAILS(dg_cuda_moe(blas, NULL, NULL, 3, 64, NULL, NULL, 2, 6, 4, 8, 8, NULL, NULL,
                            NULL, NULL, &err),
                &err, DG_E_INVAL, "experts 6 .. 9 of 8");
    CHECK_FAILS(dg_cuda_moe(blas, NULL, NULL, 3, 64, NULL, NULL, 2, 0, 8, 4, 8, NULL, NULL,
                            NULL, NULL, &err),
                &err, DG_E_INVAL, "experts 0 .. 7 of 4");
    /* (the fp32 form keeps the checks; no tokens: nothing to do) */
    CHECK(dg_cuda_moe_e(blas, DG_ELT_F32, NULL, NULL, 3, 0, NULL, NULL, 2, 0, 4, 4, 8, NULL,
                        NULL, 0, NULL, NULL, &err) == -DG_E_INVAL);
    CHECK(dg_cuda_moe_e(blas, DG_ELT_F32, NULL, NULL, 0, 8, NULL, NULL, 2, 0, 4, 4, 8, NULL,
                        NULL, 0, NULL, NULL, &err) == 0);
    /* the scratch: the bf16 name is the bf16 size; fp32 elements need more;
     * a shape the calls refuse: none */
    CHECK(dg_cuda_moe_scratch_e(DG_ELT_BF16, 37, 2, 256, 64, 8, 8) ==
          dg_cuda_moe_scratch(37, 2, 256, 64, 8, 8));
    CHECK(dg_cuda_moe_scratch_e(DG_ELT_F32, 37, 2, 256, 64, 8, 8) >
          dg_cuda_moe_scratch(37, 2, 256, 64, 8, 8));
    CHECK(dg_cuda_moe_scratch(37, 2, 256, 64, 8, 4) == 0);
    dg_blas_destroy(blas);
    return 0;
}

/* An element type other than the two: refused (DG_E_INVAL, "element type")
 * by a call otherwise valid, over real buffers (3 tokens, top-2 of 4
 * experts, H 8, I 4, fp32-sized), the output left as it was. */
static int elt_refused(void)
{
    enum { T = 3, K = 2, H = 8, I = 4, NE = 4 };
    const enum dg_elt bad = (enum dg_elt)7;
    static const int32_t idx[T * K] = {0, 1, 2, 3, 1, 2};
    static const float w[T * K] = {0.5f, 0.5f, 0.25f, 0.75f, 1.0f, 0.0f};
    float x[T * H], wgu[NE * 2 * I * H], wdn[NE * H * I], got[T * H + GUARD];
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    void *dx, *didx, *dw, *dgu, *ddn, *dout, *scratch = NULL;
    for (int i = 0; i < T * H; i++)
        x[i] = gt_uniform();
    for (int i = 0; i < NE * 2 * I * H; i++)
        wgu[i] = gt_uniform() * 0.06f;
    for (int i = 0; i < NE * H * I; i++)
        wdn[i] = gt_uniform() * 0.06f;
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    dx = gt_upload(x, sizeof x, &err);
    didx = gt_upload(idx, sizeof idx, &err);
    dw = gt_upload(w, sizeof w, &err);
    dgu = gt_upload(wgu, sizeof wgu, &err);
    ddn = gt_upload(wdn, sizeof wdn, &err);
    dout = out_buf(T * H, &err);
    CHECKF(dx && didx && dw && dgu && ddn && dout &&
               dg_cuda_alloc(&scratch, dg_cuda_moe_scratch_e(DG_ELT_F32, T, K, H, I, NE, NE), 0,
                             &err) == 0,
           "%s", err.msg);
    CHECK_FAILS(dg_cuda_moe_e(blas, bad, dout, dx, T, H, didx, dw, K, 0, NE, NE, I, dgu, ddn,
                              0, scratch, NULL, &err),
                &err, DG_E_INVAL, "element type");
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(got, dout, sizeof got, 0, &err), &err);
    for (int i = 0; i < T * H + GUARD; i++) {
        uint32_t bits;
        memcpy(&bits, &got[i], 4);
        CHECKF(i < T * H ? bits == 0xffffffffu : got[i] == GUARD_F,
               "refused call wrote word %d of its output", i);
    }
    dg_cuda_free(dx);
    dg_cuda_free(didx);
    dg_cuda_free(dw);
    dg_cuda_free(dgu);
    dg_cuda_free(ddn);
    dg_cuda_free(dout);
    dg_cuda_free(scratch);
    dg_blas_destroy(blas);
    return 0;
}

struct route_shape {
    const char *what;
    int64_t T;
    int H, I, E, K, e0, n_exp;
    int one_expert;     /* every pick on expert e0 (K = 1) */
    enum dg_elt elt;
    int runs_257;       /* craft_picks */
};

/* One shape of route_combine: the routing stages' counts, offsets, tile
 * table, slots and gathered rows against dg_ref_moe_route and the token
 * rows; then combine over fresh random expert outputs against
 * dg_ref_moe_combine with the GPU's slots. */
static int route_one(const struct route_shape *s)
{
    const int64_t T = s->T, picks = T * s->K;
    const int H = s->H, I = s->I, K = s->K, n_exp = s->n_exp;
    const int n_all = n_all_of(s->E, s->e0, n_exp);
    const size_t esz = (size_t)dg_elt_size(s->elt);
    const size_t sbytes = dg_cuda_moe_scratch_e(s->elt, T, K, H, I, n_exp, n_all);
    struct dg_error err = {0};
    struct dg_moe_route_view v;
    void *hx = NULL;
    float *fx = NULL;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)picks);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)picks);
    int32_t *ref_slot = malloc(sizeof(int32_t) * (size_t)picks);
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)n_exp);
    int32_t *off = malloc(sizeof(int32_t) * (size_t)(n_exp + 1));
    int32_t *ref_cnt = malloc(sizeof(int32_t) * (size_t)n_exp);
    int32_t *ref_off = malloc(sizeof(int32_t) * (size_t)(n_exp + 1));
    unsigned char *sc_host = malloc(sbytes + GUARD), *taken;
    void *dx, *didx, *scratch, *dgu, *ddn;
    int64_t used;

    CHECK(idx && slot && ref_slot && cnt && off && ref_cnt && ref_off && sc_host &&
          gt_rand_elts(s->elt, (size_t)(T * H), 1.0f, &hx, &fx) == 0);
    if (s->runs_257)
        CHECK(craft_picks(idx, T, K, s->e0, n_exp) == 0);
    else
        draw_picks(idx, T, K, s->E, s->one_expert ? s->e0 : -1);
    /* the weights are only addressed (the tile table), never read here */
    dx = gt_upload(hx, (size_t)(T * H) * esz, &err);
    didx = gt_upload(idx, sizeof(int32_t) * (size_t)picks, &err);
    dgu = gt_out_alloc((size_t)n_exp * 2 * I * H * esz, 0, 0, &err);
    ddn = gt_out_alloc((size_t)n_exp * H * I * esz, 0, 0, &err);
    scratch = gt_out_alloc(sbytes, GUARD, 0x5a, &err);
    CHECKF(dx && didx && dgu && ddn && scratch, "%s", err.msg);
    CHECK_OK(dg_cuda_moe_route_e(s->elt, dx, T, H, didx, K, s->e0, n_exp, n_all, I, dgu, ddn,
                                 scratch,
                                 &v, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(sc_host, scratch, sbytes + GUARD, 0, &err), &err);
    for (int i = 0; i < GUARD; i++)
        CHECKF(sc_host[sbytes + (size_t)i] == 0x5a, "route %s: guard byte %d changed", s->what,
               i);
#define AT(ptr) (sc_host + ((const unsigned char *)(ptr) - (const unsigned char *)scratch))
    memcpy(cnt, AT(v.counts), sizeof(int32_t) * (size_t)n_exp);
    memcpy(off, AT(v.offsets), sizeof(int32_t) * (size_t)(n_exp + 1));
    memcpy(slot, AT(v.slot_of), sizeof(int32_t) * (size_t)picks);
    /* the one-launch experts' words, zeroed over the scratch's poison */
    CHECK((const unsigned char *)v.sync >= (const unsigned char *)scratch &&
          (const unsigned char *)(v.sync + 2 * n_exp + 1) <=
              (const unsigned char *)scratch + sbytes);
    for (int j = 0; j <= 2 * n_exp; j++) {
        int32_t w;
        memcpy(&w, AT(v.sync + j), sizeof w);
        CHECKF(w == 0, "route %s: sync word %d is %d, not 0", s->what, j, (int)w);
    }
    CHECKF(v.ts >= 16 && v.ts <= 128 && !(v.ts & (v.ts - 1)) && v.rows == v.tiles * v.ts,
           "route %s: tiles of %d rows, %lld tiles, %lld rows", s->what, v.ts,
           (long long)v.tiles, (long long)v.rows);
    dg_ref_moe_route(ref_cnt, ref_off, ref_slot, idx, picks, s->e0, n_exp, v.ts);
    CHECKF(!memcmp(cnt, ref_cnt, sizeof(int32_t) * (size_t)n_exp), "route %s: counts",
           s->what);
    CHECKF(!memcmp(off, ref_off, sizeof(int32_t) * (size_t)(n_exp + 1)), "route %s: offsets",
           s->what);
    CHECKF(off[n_exp] <= v.rows, "route %s: %d padded rows past the bound %lld", s->what,
           off[n_exp], (long long)v.rows);
    /* slots: in the pick's expert's run, each once; -1 exactly where the
     * reference has it; each slot's row of xs the pick's token row */
    taken = calloc((size_t)v.rows, 1);
    CHECK(taken);
    for (int64_t p = 0; p < picks; p++) {
        const int e = idx[p] - s->e0;
        if (ref_slot[p] < 0) {
            CHECKF(slot[p] == -1, "route %s: pick %lld of another rank's expert has slot %d",
                   s->what, (long long)p, slot[p]);
            continue;
        }
        CHECKF(slot[p] >= off[e] && slot[p] < off[e] + cnt[e] && !taken[slot[p]],
               "route %s: pick %lld (expert %d) in slot %d (run %d..%d)", s->what,
               (long long)p, e, slot[p], off[e], off[e] + cnt[e]);
        taken[slot[p]] = 1;
        CHECKF(!memcmp(AT(v.xs) + (size_t)slot[p] * H * esz,
                       (const unsigned char *)hx + (size_t)(p / K) * H * esz, (size_t)H * esz),
               "route %s: slot %d's row is not token %lld's", s->what, slot[p],
               (long long)(p / K));
    }
    free(taken);
    /* the tile table: each used tile its expert's rows and weights, the
     * rest on the dummies */
    used = off[n_exp] / v.ts;
    for (int64_t t = 0; t < v.tiles; t++) {
        void *const *P = (void *const *)AT(v.ptrs);
        const int64_t r = t * v.ts;
        const unsigned char *xs = v.xs, *gu = v.gu, *hh = v.hh, *ys = v.ys;
        const unsigned char *wgu = dgu, *wdn = ddn;
        const void *want[6];
        int j = 0;
        if (t < used) {
            while (j + 1 < n_exp && off[j + 1] <= r)
                j++;
            want[0] = xs + r * H * (int64_t)esz;
            want[1] = wgu + (int64_t)j * 2 * I * H * (int64_t)esz;
            want[2] = gu + r * 2 * I * (int64_t)esz;
            want[3] = hh + r * I * (int64_t)esz;
            want[4] = wdn + (int64_t)j * H * I * (int64_t)esz;
            want[5] = ys + r * H * (int64_t)esz;
        } else {
            want[0] = xs, want[1] = wgu, want[2] = v.dummy_gu;
            want[3] = hh, want[4] = wdn, want[5] = v.dummy_ys;
        }
        for (int a = 0; a < 6; a++)
            CHECKF(P[a * v.tiles + t] == want[a], "route %s: tile %lld of %lld (%lld used), "
                   "pointer %d", s->what, (long long)t, (long long)v.tiles, (long long)used, a);
    }
    /* the rows past the batched GEMMs' tiles, expert by expert: all of
     * them where batched is all the tiles (fp32; a GPU before Hopper) */
    {
        int32_t *ovo = malloc(sizeof(int32_t) * (size_t)n_exp);
        int32_t *ovc = malloc(sizeof(int32_t) * (size_t)n_exp);
        int32_t *ref_ovo = malloc(sizeof(int32_t) * (size_t)n_exp);
        int32_t *ref_ovc = malloc(sizeof(int32_t) * (size_t)n_exp);
        int64_t past = 0, ref_past;
        int32_t any;
        CHECK(ovo && ovc && ref_ovo && ref_ovc);
        CHECKF(v.batched >= 1 && v.batched <= v.tiles &&
                   (s->elt == DG_ELT_BF16 || v.batched == v.tiles),
               "route %s: %lld batched tiles of %lld", s->what, (long long)v.batched,
               (long long)v.tiles);
        memcpy(ovo, AT(v.ov_offsets), sizeof(int32_t) * (size_t)n_exp);
        memcpy(ovc, AT(v.ov_counts), sizeof(int32_t) * (size_t)n_exp);
        memcpy(&any, AT(v.ov_any), sizeof any);
        ref_past = dg_ref_moe_overflow(ref_ovo, ref_ovc, ref_cnt, ref_off, n_exp,
                                       v.batched * v.ts);
        CHECKF(!memcmp(ovo, ref_ovo, sizeof(int32_t) * (size_t)n_exp) &&
                   !memcmp(ovc, ref_ovc, sizeof(int32_t) * (size_t)n_exp),
               "route %s: the rows past %lld batched tiles", s->what, (long long)v.batched);
        CHECKF(any == (ref_past > 0), "route %s: ov_any %d with %lld rows past", s->what,
               (int)any, (long long)ref_past);
        for (int j = 0; j < n_exp; j++)
            past += ovc[j];
        CHECKF(!s->runs_257 || past > 0 || v.batched == v.tiles,
               "route %s: crafted runs, yet no row past %lld tiles", s->what,
               (long long)v.batched);
        printf("# route %s: %lld tiles for the batched GEMMs, %lld rows past them\n", s->what,
               (long long)v.batched, (long long)past);
        free(ovo), free(ovc), free(ref_ovo), free(ref_ovc);
    }
#undef AT
    /* combine over random expert outputs in the padded rows, by the GPU's
     * slots: fp32 outputs, then bf16 ones (the reference over their values) */
    for (int ys_f32 = 1; ys_f32 >= 0; ys_f32--) {
        float *ys = malloc(sizeof(float) * (size_t)(v.rows * H));
        uint16_t *ysb = malloc(sizeof(uint16_t) * (size_t)(v.rows * H));
        float *w = malloc(sizeof(float) * (size_t)picks);
        float *ref = malloc(sizeof(float) * (size_t)(T * H));
        float *got = malloc(sizeof(float) * (size_t)(T * H) + GUARD);
        void *dys, *dw, *dout;
        double worst = 0;
        CHECK(ys && ysb && w && ref && got);
        for (int64_t i = 0; i < v.rows * H; i++) {
            ys[i] = gt_uniform();
            ysb[i] = dg_f32_to_bf16(ys[i]);
            if (!ys_f32)
                ys[i] = dg_bf16_to_f32(ysb[i]);
        }
        for (int64_t p = 0; p < picks; p++)
            w[p] = 0.1f + (gt_uniform() + 1.0f) * 0.4f;
        dg_ref_moe_combine(ref, ys, slot, w, T, K, H);
        dys = ys_f32 ? gt_upload(ys, sizeof(float) * (size_t)(v.rows * H), &err)
                     : gt_upload(ysb, sizeof(uint16_t) * (size_t)(v.rows * H), &err);
        dw = gt_upload(w, sizeof(float) * (size_t)picks, &err);
        dout = gt_out_alloc(sizeof(float) * (size_t)(T * H), GUARD, 0x5a, &err);
        CHECKF(dys && dw && dout, "%s", err.msg);
        CHECK_OK(dg_cuda_moe_combine(dout, dys, ys_f32, v.slot_of, dw, T, K, H, NULL, 0, &err),
                 &err);
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        CHECK_OK(dg_cuda_download(got, dout, sizeof(float) * (size_t)(T * H) + GUARD, 0, &err),
                 &err);
        for (int i = 0; i < GUARD; i++)
            CHECKF(((unsigned char *)(got + T * H))[i] == 0x5a,
                   "combine %s: guard byte %d changed", s->what, i);
        for (int64_t i = 0; i < T * H; i++) {
            const double d = fabs((double)got[i] - ref[i]) / (1.0 + fabs(ref[i]));
            CHECKF(!isnan(got[i]), "combine %s: NaN at %lld", s->what, (long long)i);
            worst = d > worst ? d : worst;
        }
        printf("# route %s: %d-row tiles, %lld of %lld used; combine (%s outputs) within "
               "%.1e\n", s->what, v.ts, (long long)used, (long long)v.tiles,
               ys_f32 ? "fp32" : "bf16", worst);
        CHECKF(worst <= 1e-6, "combine %s (%s outputs): %.3e from the reference", s->what,
               ys_f32 ? "fp32" : "bf16", worst);
        dg_cuda_free(dys), dg_cuda_free(dw), dg_cuda_free(dout);
        free(ys), free(ysb), free(w), free(ref), free(got);
    }
    dg_cuda_free(dx), dg_cuda_free(didx), dg_cuda_free(dgu), dg_cuda_free(ddn);
    dg_cuda_free(scratch);
    free(hx), free(fx), free(idx), free(slot), free(ref_slot), free(cnt), free(off);
    free(ref_cnt), free(ref_off), free(sc_host);
    return 0;
}

/* The routing stages and the ordered sum of the experts (dg_cuda_moe_route_e,
 * dg_cuda_moe_combine) on their own, against dg_ref_moe_route and
 * dg_ref_moe_combine on fresh random picks: all experts, a rank's slice,
 * one token, every pick on one expert (runs of several tiles), no pick in
 * the slice (every tile on the dummies), rows of 16-byte multiples (the
 * 16-byte gather) and not (H 100 bf16, H 70 fp32: the element gather),
 * runs of 257 rows (rows past the batched GEMMs' tiles in bf16 on Hopper,
 * none in fp32);
 * scratch poisoned and guarded; combine within 1e-6 (fp32, k order; the
 * GPU may fuse the multiply-add).  Shapes the routing refuses: DG_E_INVAL. */
static int route_combine(void)
{
    static const struct route_shape shapes[] = {
        {"37 tokens, top-2 of 8, H 64 bf16", 37, 64, 32, 8, 2, 0, 8, 0, DG_ELT_BF16, 0},
        {"200 tokens, top-8 of 128, experts 32..63, H 512 bf16", 200, 512, 176, 128, 8, 32, 32,
         0, DG_ELT_BF16, 0},
        {"1 token, top-8 of 128, H 2816 bf16", 1, 2816, 704, 128, 8, 0, 128, 0, DG_ELT_BF16, 0},
        {"300 tokens, every pick on expert 3 of 3..4, H 128 fp32", 300, 128, 96, 8, 1, 3, 2, 1,
         DG_ELT_F32, 0},
        {"9 tokens, top-2 of 6, slice 6..7 (none picked), H 64 bf16", 9, 64, 32, 6, 2, 6, 2, 0,
         DG_ELT_BF16, 0},
        {"21 tokens, top-2 of 8, H 100 bf16", 21, 100, 48, 8, 2, 0, 8, 0, DG_ELT_BF16, 0},
        {"256 tokens, top-8 of 128, H 70 fp32", 256, 70, 40, 128, 8, 0, 128, 0, DG_ELT_F32, 0},
        /* past the batched GEMMs' fixed count (bf16 on Hopper) */
        {"1024 tokens, top-8 of 32, runs of 257 rows, H 256 bf16", 1024, 256, 128, 32, 8, 0, 32,
         0, DG_ELT_BF16, 1},
        {"1024 tokens, top-8 of 32, runs of 257 rows, H 256 fp32", 1024, 256, 128, 32, 8, 0, 32,
         0, DG_ELT_F32, 1},
        /* a rank's half of the experts given every pick */
        {"1024 tokens, top-8, experts 32..63 of 64 given every pick, H 256 bf16", 1024, 256, 128,
         64, 8, 32, 32, 0, DG_ELT_BF16, 1},
    };
    struct dg_moe_route_view v;
    struct dg_error err = {0};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (route_one(&shapes[k]))
            return 1;
    CHECK_FAILS(dg_cuda_moe_route_e(DG_ELT_BF16, NULL, 0, 64, NULL, 2, 0, 8, 8, 32, NULL, NULL,
                                    NULL, &v, NULL, 0, &err),
                &err, DG_E_INVAL, "routing of 0 tokens");
    CHECK_FAILS(dg_cuda_moe_route_e(DG_ELT_BF16, NULL, 3, 64, NULL, 2, 0, 1025, 1025, 32, NULL,
                                    NULL, NULL, &v, NULL, 0, &err),
                &err, DG_E_INVAL, "experts 0 .. 1024 of 1025");
    CHECK_FAILS(dg_cuda_moe_route_e(DG_ELT_BF16, NULL, 3, 64, NULL, 2, 4, 8, 8, 32, NULL, NULL,
                                    NULL, &v, NULL, 0, &err),
                &err, DG_E_INVAL, "experts 4 .. 11 of 8");
    CHECK_FAILS(dg_cuda_moe_route_e((enum dg_elt)7, NULL, 3, 64, NULL, 2, 0, 8, 8, 32, NULL, NULL,
                                    NULL, &v, NULL, 0, &err),
                &err, DG_E_INVAL, "element type");
    CHECK(dg_cuda_moe_combine(NULL, NULL, 1, NULL, NULL, 0, 2, 64, NULL, 0, &err) == 0);
    CHECK_FAILS(dg_cuda_moe_combine(NULL, NULL, 1, NULL, NULL, 3, 0, 64, NULL, 0, &err), &err,
                DG_E_INVAL, "top-0");
    return 0;
}

/* Eight groups of rows for the grouped GEMMs: group j is rows offsets[j]
 * .. offsets[j] + counts[j] - 1, with 5 rows in no group before each group
 * and 3 after the last; random bf16 rows X [rows, K] (amplitude 1) and
 * eight weights [N, K] (0.05) on the host (bits and floats) and on the
 * device, with the offsets and counts. */
struct groups {
    const int32_t *counts;
    int32_t offsets[8];
    int64_t rows, total, N, K;
    uint16_t *hx, *hw;
    float *fx, *fw;
    unsigned char *covered; /* [rows]: 1 where the row is in a group */
    void *dx, *dw, *doff, *dcnt;
};

static void groups_free(struct groups *g)
{
    dg_cuda_free(g->dx), dg_cuda_free(g->dw), dg_cuda_free(g->doff), dg_cuda_free(g->dcnt);
    free(g->hx), free(g->hw), free(g->fx), free(g->fw), free(g->covered);
    memset(g, 0, sizeof *g);
}

static int groups_make(struct groups *g, const int32_t counts[8], int64_t N, int64_t K)
{
    struct dg_error err = {0};
    memset(g, 0, sizeof *g);
    g->counts = counts, g->N = N, g->K = K;
    for (int j = 0; j < 8; j++) {
        g->rows += 5;
        g->offsets[j] = (int32_t)g->rows;
        g->rows += counts[j];
        g->total += counts[j];
    }
    g->rows += 3;
    CHECK(gt_rand_bf16((size_t)(g->rows * K), 1.0f, &g->hx, &g->fx) == 0 &&
          gt_rand_bf16((size_t)(8 * N * K), 0.05f, &g->hw, &g->fw) == 0);
    CHECK((g->covered = calloc((size_t)g->rows, 1)) != NULL);
    for (int j = 0; j < 8; j++)
        memset(g->covered + g->offsets[j], 1, (size_t)counts[j]);
    g->dx = gt_upload(g->hx, 2 * (size_t)(g->rows * K), &err);
    g->dw = gt_upload(g->hw, 2 * (size_t)(8 * N * K), &err);
    g->doff = gt_upload(g->offsets, sizeof g->offsets, &err);
    g->dcnt = gt_upload(counts, 8 * sizeof(int32_t), &err);
    CHECKF(g->dx && g->dw && g->doff && g->dcnt, "%s", err.msg);
    return 0;
}

/* Weight j of g as a dg_weight ([N, K] bf16). */
static struct dg_weight groups_weight(const struct groups *g, int j)
{
    const struct dg_weight w = {.data = g->hw + (size_t)j * g->N * g->K, .dtype = DG_DTYPE_BF16,
                                .rows = g->N, .cols = g->K, .stride = g->K};
    return w;
}

/* An output of g's rows, [rows, n] (fp32 when f, else bf16), downloaded
 * into got with its guard words: the guard words intact, the rows in no
 * group still poisoned (NaN), and in *rel ||got - ref|| / ||ref|| over the
 * groups' rows. */
static int groups_check_out(const struct groups *g, const float *got, const float *ref,
                            int64_t n, int f, const char *what, double *rel)
{
    double num = 0, den = 0;
    for (int i = 0; i < GUARD; i++)
        CHECKF(got[g->rows * n + i] == GUARD_F, "%s: guard word %d overwritten", what, i);
    for (int64_t r = 0; r < g->rows; r++)
        for (int64_t c = 0; c < n; c++) {
            const int64_t i = r * n + c;
            float v;
            if (f)
                v = got[i];
            else {
                uint16_t h;
                memcpy(&h, (const unsigned char *)got + 2 * i, 2);
                v = dg_bf16_to_f32(h);
            }
            if (!g->covered[r]) {
                CHECKF(isnan(v), "%s: row %lld is in no group but was written", what,
                       (long long)r);
                continue;
            }
            num += ((double)v - ref[i]) * ((double)v - ref[i]);
            den += (double)ref[i] * ref[i];
        }
    *rel = den > 0 ? sqrt(num / den) : INFINITY;
    return 0;
}

/* The grouped GEMM (moe-gemm.cu) alone, each of its configurations (K
 * step, pipeline depth), against dg_ref_matmul_f64 per group: eight groups of
 * 0, 1, 17, 33, 64, 150, 3 and 16 rows with gaps between (gap rows stay
 * poisoned), N 128 and K 704 (a K step of 128 ends half-way), then the
 * 26B-A4B's gate/up shape [1408 x 2816] at 16 rows an expert over 8
 * groups; fp32 out within BOUND_F32 relative, bf16 out within 8e-3; guard
 * words intact; every configuration's fp32 output equal to the bit to
 * configuration 0's (the sums run in the same order); a configuration
 * that does not exist refused.  (The reference sums in double.) */
static int grouped_configs(void)
{
    static const int32_t counts_a[8] = {0, 1, 17, 33, 64, 150, 3, 16};
    static const int32_t counts_b[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    /* (a mean of 85 rows: passes of 8 m-tiles, where the last
     * configuration's 2 x 2 warps apply; groups of 130 and 200 take two) */
    static const int32_t counts_c[8] = {130, 70, 200, 1, 0, 65, 128, 90};
    static const struct {
        const int32_t *counts;
        int64_t N, K;
    } shapes[3] = {{counts_a, 128, 704}, {counts_b, 1408, 2816}, {counts_c, 128, 256}};
    const int n_cfg = dg_cuda_grouped_gemm_configs();
    struct dg_error err = {0};
    CHECK(n_cfg >= 1 && dg_cuda_grouped_gemm_config_name(0) &&
          !dg_cuda_grouped_gemm_config_name(n_cfg));
    for (int si = 0; si < 3; si++) {
        const int64_t N = shapes[si].N, K = shapes[si].K;
        struct groups g;
        float *ref, *got, *first, *row_buf;
        if (groups_make(&g, shapes[si].counts, N, K))
            return 1;
        ref = calloc((size_t)(g.rows * N), sizeof(float));
        got = malloc(sizeof(float) * (size_t)(g.rows * N + GUARD));
        first = malloc(sizeof(float) * (size_t)(g.rows * N));
        row_buf = malloc(sizeof(float) * (size_t)K);
        CHECK(ref && got && first && row_buf);
        for (int j = 0; j < 8; j++) {
            const struct dg_weight w = groups_weight(&g, j);
            if (g.counts[j]) {
                double *d = malloc(sizeof(double) * (size_t)(g.counts[j] * N));
                CHECK(d);
                dg_ref_matmul_f64(d, g.fx + (int64_t)g.offsets[j] * K, g.counts[j], &w, row_buf);
                for (int64_t i = 0; i < g.counts[j] * N; i++)
                    ref[(int64_t)g.offsets[j] * N + i] = (float)d[i];
                free(d);
            }
        }
        for (int c = 0; c < n_cfg; c++)
            for (int f = 1; f >= 0; f--) {
                void *dy;
                double rel;
                if (!dg_cuda_grouped_gemm_config_exact(c) &&
                    !dg_cuda_grouped_wgmma_fits(0, N, K)) {
                    printf("# %s: not on this device, skipped\n",
                           dg_cuda_grouped_gemm_config_name(c));
                    break;
                }
                dy = out_buf((size_t)(g.rows * N), &err);
                CHECKF(dy, "%s", err.msg);
                CHECK_OK(dg_cuda_grouped_gemm_config(c, dy, f, g.dx, g.dw, g.doff, g.dcnt, 8, N,
                                                     K, (int)(g.total / 8), NULL, 0, &err),
                         &err);
                CHECK_OK(dg_cuda_sync(0, &err), &err);
                CHECK_OK(dg_cuda_download(got, dy, sizeof(float) * (size_t)(g.rows * N + GUARD),
                                          0, &err), &err);
                dg_cuda_free(dy);
                if (groups_check_out(&g, got, ref, N, f, dg_cuda_grouped_gemm_config_name(c),
                                     &rel))
                    return 1;
                printf("# grouped GEMM, %s, [%lld x %lld], %s out: relative error %.2e\n",
                       dg_cuda_grouped_gemm_config_name(c), (long long)N, (long long)K,
                       f ? "fp32" : "bf16", rel);
                CHECK(rel <= (f ? BOUND_F32 : 8e-3));
                if (f && c == 0)
                    memcpy(first, got, sizeof(float) * (size_t)(g.rows * N));
                else if (f && dg_cuda_grouped_gemm_config_exact(c))
                    CHECKF(!memcmp(first, got, sizeof(float) * (size_t)(g.rows * N)),
                           "%s: not the same bits as %s", dg_cuda_grouped_gemm_config_name(c),
                           dg_cuda_grouped_gemm_config_name(0));
            }
        CHECK_FAILS(dg_cuda_grouped_gemm_config(n_cfg, NULL, 1, g.dx, g.dw, g.doff, g.dcnt, 8, N,
                                                K, 16, NULL, 0, &err),
                    &err, DG_E_INVAL, "no such configuration");
        groups_free(&g);
        free(ref), free(got), free(first), free(row_buf);
    }
    return 0;
}

/* The gated grouped GEMM (dg_cuda_grouped_gemm_gelu: the experts' first
 * product with the gelu in its epilogue) against the separate way, the
 * grouped GEMM into [gate | up] then dg_cuda_gelu_mul_e: the same bits on
 * every row of a group; and against dg_ref_expert_hidden per group within
 * BOUND_F32 (fp32 out) or BOUND (bf16 out: g, u and the output rounded).
 * Groups of 0, 1, 17, 33, 64, 150, 3, 16 rows with gaps (gap rows stay
 * poisoned) at I 64, K 704; the 26B-A4B's experts (I 704, K 2816) at 16
 * rows a group; means of 85 rows (passes of 8 m-tiles) at I 96 (a
 * multiple of 32, not of 64, where the separate way does not fit and the
 * reference alone judges), K 256.  Guard words intact; I not a
 * multiple of 32 and K not of 64 refused. */
static int grouped_gelu(void)
{
    static const int32_t counts_a[8] = {0, 1, 17, 33, 64, 150, 3, 16};
    static const int32_t counts_b[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const int32_t counts_c[8] = {130, 70, 200, 1, 0, 65, 128, 90};
    static const struct {
        const int32_t *counts;
        int64_t I, K;
    } shapes[3] = {{counts_a, 64, 704}, {counts_b, 704, 2816}, {counts_c, 96, 256}};
    struct dg_error err = {0};
    for (int si = 0; si < 3; si++) {
        const int64_t I = shapes[si].I, K = shapes[si].K, N = 2 * I;
        /* (the separate way needs 2I a multiple of 128) */
        const int separate = dg_cuda_grouped_gemm_fits(N, K);
        struct groups g;
        float *ref, *got, *sep, *u, *row_buf;
        if (groups_make(&g, shapes[si].counts, N, K))
            return 1;
        ref = calloc((size_t)(g.rows * I), sizeof(float));
        got = malloc(sizeof(float) * (size_t)(g.rows * I + GUARD));
        sep = malloc(sizeof(float) * (size_t)(g.rows * I));
        u = malloc(sizeof(float) * (size_t)I);
        row_buf = malloc(sizeof(float) * (size_t)K);
        CHECK(ref && got && sep && u && row_buf);
        for (int j = 0; j < 8; j++) {
            const struct dg_weight w = groups_weight(&g, j);
            dg_ref_expert_hidden(ref + (int64_t)g.offsets[j] * I, g.fx + (int64_t)g.offsets[j] * K,
                                 g.counts[j], (int)K, (int)I, &w, u, row_buf);
        }
        CHECK(dg_cuda_grouped_gemm_gelu_fits(I, K));
        for (int f = 1; f >= 0; f--) {
            const enum dg_elt e = f ? DG_ELT_F32 : DG_ELT_BF16;
            const size_t esz = f ? 4 : 2;
            void *dy = out_buf((size_t)(g.rows * I), &err),
                 *dgu = out_buf((size_t)(g.rows * N), &err),
                 *dhh = out_buf((size_t)(g.rows * I), &err);
            double rel;
            int64_t differ = 0;
            CHECKF(dy && dgu && dhh, "%s", err.msg);
            CHECK_OK(dg_cuda_grouped_gemm_gelu(dy, f, g.dx, g.dw, g.doff, g.dcnt, 8, I, K,
                                               (int)(g.total / 8), NULL, 0, &err), &err);
            if (separate) {
                CHECK_OK(dg_cuda_grouped_gemm(dgu, f, g.dx, g.dw, g.doff, g.dcnt, 8, N, K,
                                              (int)(g.total / 8), NULL, 0, &err), &err);
                CHECK_OK(dg_cuda_gelu_mul_e(e, dhh, I, dgu, N, (unsigned char *)dgu + I * esz, N,
                                            g.rows, (int)I, NULL, 0, &err), &err);
            }
            CHECK_OK(dg_cuda_sync(0, &err), &err);
            CHECK_OK(dg_cuda_download(got, dy, sizeof(float) * (size_t)(g.rows * I + GUARD), 0,
                                      &err), &err);
            if (separate)
                CHECK_OK(dg_cuda_download(sep, dhh, esz * (size_t)(g.rows * I), 0, &err), &err);
            dg_cuda_free(dy), dg_cuda_free(dgu), dg_cuda_free(dhh);
            if (groups_check_out(&g, got, ref, I, f, "gated", &rel))
                return 1;
            for (int64_t i = 0; separate && i < g.rows * I; i++)
                differ += g.covered[i / I] && memcmp((const unsigned char *)got + esz * i,
                                                     (const unsigned char *)sep + esz * i, esz);
            printf("# grouped gated GEMM, [2 x %lld x %lld], %s out: relative error %.2e, ",
                   (long long)I, (long long)K, f ? "fp32" : "bf16", rel);
            if (separate)
                printf("%lld of %lld values apart from the separate way\n", (long long)differ,
                       (long long)(g.total * I));
            else
                printf("no separate way at this width\n");
            CHECK(rel <= (f ? BOUND_F32 : BOUND));
            CHECKF(differ == 0, "gated, I %lld, %s out: %lld values not the bits of the separate "
                   "GEMM and gelu", (long long)I, f ? "fp32" : "bf16", (long long)differ);
        }
        groups_free(&g);
        free(ref), free(got), free(sep), free(u), free(row_buf);
    }
    CHECK(!dg_cuda_grouped_gemm_gelu_fits(48, 256) && !dg_cuda_grouped_gemm_gelu_fits(64, 100));
    CHECK_FAILS(dg_cuda_grouped_gemm_gelu(NULL, 1, NULL, NULL, NULL, NULL, 8, 48, 256, 16, NULL,
                                          0, &err),
                &err, DG_E_INVAL, "grouped gated GEMM");
    CHECK_FAILS(dg_cuda_grouped_gemm_gelu(NULL, 1, NULL, NULL, NULL, NULL, 8, 64, 100, 16, NULL,
                                          0, &err),
                &err, DG_E_INVAL, "grouped gated GEMM");
    return 0;
}

/* The one launch of experts_one_launch's groups g (I, H, pass hint; down
 * weights dwd) with bf16 outputs, against dg_cuda_grouped_wgmma's bf16
 * output over the hidden rows dhh2 the two launches stored: the same
 * bytes on every row of a group, the rows in no group still poisoned,
 * guard words intact.  dsync: 9 words to zero first. */
static int experts_bf16_out(const struct groups *g, int64_t I, int64_t H, int hint,
                            const void *dwd, const void *dhh2, int32_t *dsync)
{
    struct dg_error err = {0};
    const size_t n = (size_t)(g->rows * H), nw = n / 2; /* bf16 values, in floats */
    void *dhh = out_buf((size_t)(g->rows * I), &err), *dys = out_buf(nw, &err);
    void *dys2 = out_buf(nw, &err);
    uint16_t *ys = malloc(2 * n + sizeof(float) * GUARD), *ys2 = malloc(2 * n);
    int64_t differ = 0;
    CHECKF(dhh && dys && dys2, "%s", err.msg);
    CHECK(ys && ys2 && H % 2 == 0);
    CHECK_OK(dg_cuda_grouped_wgmma(dys2, 0, 0, dhh2, dwd, g->doff, g->dcnt, 8, H, I, hint, NULL,
                                   0, &err), &err);
    CHECK_OK(dg_cuda_memset(dsync, 0, sizeof(int32_t) * 9, 0, &err), &err);
    CHECK_OK(dg_cuda_experts_wgmma(dhh, dys, 0, g->dx, g->dw, dwd, g->doff, g->dcnt, dsync, NULL,
                                   8, I, H, hint, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(ys, dys, 2 * n + sizeof(float) * GUARD, 0, &err), &err);
    CHECK_OK(dg_cuda_download(ys2, dys2, 2 * n, 0, &err), &err);
    for (int i = 0; i < GUARD; i++) {
        float f;
        memcpy(&f, (const unsigned char *)ys + 2 * n + sizeof(float) * (size_t)i, sizeof f);
        CHECKF(f == GUARD_F, "bf16 outputs: guard word %d overwritten", i);
    }
    for (int64_t r = 0; r < g->rows; r++)
        for (int64_t c = 0; c < H; c++) {
            const uint16_t a = ys[r * H + c];
            if (!g->covered[r])
                CHECKF(a == 0xffff, "bf16 outputs: row %lld is in no group but was written",
                       (long long)r);
            else
                differ += a != ys2[r * H + c];
        }
    printf("# the experts' one launch with bf16 outputs, I %lld, H %lld, pass hint %d: %lld of "
           "%lld outputs apart from the second launch's bf16 ones\n", (long long)I, (long long)H,
           hint, (long long)differ, (long long)(g->total * H));
    CHECK(differ == 0);
    dg_cuda_free(dhh), dg_cuda_free(dys), dg_cuda_free(dys2);
    free(ys), free(ys2);
    return 0;
}

/* Both of the experts' products in one launch (dg_cuda_experts_wgmma,
 * Hopper only) against the two launches it replaces
 * (dg_cuda_grouped_wgmma gated into bf16 hh, then plain into fp32 ys):
 * hh and ys the same bits on every row of a group, the rows in no group
 * still poisoned, guard words intact.  Groups of 0, 1, 17, 33, 64, 150, 3
 * and 16 rows with gaps at I 64, H 256, with a pass of 32, 64 and 128
 * rows (groups longer than a pass take several; from 64 rows a pass two
 * warpgroups a block), and the 26B-A4B's experts (I 704, H 2816) at 16
 * rows a group and at 64 to 130 (passes of 128); with hints whose split
 * (lib/moe-plan.h) puts a tile's passes on 2 and 3 blocks (the 150- and
 * 130-row groups' second pass on a block of its own; at 3 a block with
 * no pass in any group); each launch with its sync
 * words zeroed first, twice on the same buffers (the second launch's
 * tickets start again from zero), without an active word and with one of
 * 1; with one of 0 first, nothing written (outputs poisoned, sync words
 * 0); then with bf16 outputs against the second launch's bf16 ones (the
 * same bytes, rows in no group poisoned, guard words intact).  Shapes it
 * does not take and a NULL sync refused. */
static int experts_one_launch(void)
{
    static const int32_t counts_a[8] = {0, 1, 17, 33, 64, 150, 3, 16};
    static const int32_t counts_b[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const int32_t counts_d[8] = {96, 64, 80, 130, 72, 88, 65, 100};
    static const struct {
        const int32_t *counts;
        int64_t I, H;
        int hint;
    } shapes[8] = {{counts_a, 64, 256, 16},    {counts_a, 64, 256, 24},
                   {counts_a, 64, 256, 85},    {counts_b, 704, 2816, 16},
                   {counts_d, 704, 2816, 87},  {counts_a, 64, 256, 150},
                   {counts_a, 64, 256, 300},   {counts_d, 704, 2816, 128}};
    struct dg_error err = {0};
    if (!dg_cuda_experts_wgmma_fits(0, 64, 256)) {
        printf("# the experts' one launch: not on this device, skipped\n");
        CHECK_FAILS(dg_cuda_experts_wgmma(NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                          8, 64, 256, 16, NULL, 0, &err),
                    &err, DG_E_INVAL, "experts' wgmma");
        return 0;
    }
    for (int si = 0; si < 8; si++) {
        const int64_t I = shapes[si].I, H = shapes[si].H;
        const int hint = shapes[si].hint;
        struct groups g;
        uint16_t *hwd = NULL;
        float *fwd = NULL;
        void *dwd, *dsync, *dhh, *dys, *dhh2, *dys2;
        float *hh, *ys, *hh2, *ys2;
        int64_t differ_h = 0, differ_y = 0;
        if (groups_make(&g, shapes[si].counts, 2 * I, H))
            return 1;
        CHECK(gt_rand_bf16((size_t)(8 * H * I), 0.05f, &hwd, &fwd) == 0);
        dwd = gt_upload(hwd, 2 * (size_t)(8 * H * I), &err);
        CHECK_OK(dg_cuda_alloc(&dsync, sizeof(int32_t) * 11, 0, &err), &err);
        dhh = out_buf((size_t)(g.rows * I), &err), dys = out_buf((size_t)(g.rows * H), &err);
        dhh2 = out_buf((size_t)(g.rows * I), &err), dys2 = out_buf((size_t)(g.rows * H), &err);
        CHECKF(dwd && dhh && dys && dhh2 && dys2, "%s", err.msg);
        hh = malloc(sizeof(float) * (size_t)(g.rows * I + GUARD));
        ys = malloc(sizeof(float) * (size_t)(g.rows * H + GUARD));
        hh2 = malloc(sizeof(float) * (size_t)(g.rows * I + GUARD));
        ys2 = malloc(sizeof(float) * (size_t)(g.rows * H + GUARD));
        CHECK(hh && ys && hh2 && ys2);
        CHECK_OK(dg_cuda_grouped_wgmma(dhh2, 0, 1, g.dx, g.dw, g.doff, g.dcnt, 8, 2 * I, H, hint,
                                       NULL, 0, &err), &err);
        CHECK_OK(dg_cuda_grouped_wgmma(dys2, 1, 0, dhh2, dwd, g.doff, g.dcnt, 8, H, I, hint, NULL,
                                       0, &err), &err);
        /* the word after the 9 sync words 0: the launch does nothing */
        CHECK_OK(dg_cuda_memset(dsync, 0, sizeof(int32_t) * 11, 0, &err), &err);
        CHECK_OK(dg_cuda_experts_wgmma(dhh, dys, 1, g.dx, g.dw, dwd, g.doff, g.dcnt,
                                       (int32_t *)dsync, (const int32_t *)dsync + 9, 8, I, H,
                                       hint, NULL, 0, &err),
                 &err);
        {
            int32_t words[11];
            CHECK_OK(dg_cuda_sync(0, &err), &err);
            CHECK_OK(dg_cuda_download(hh, dhh, sizeof(float) * (size_t)(g.rows * I), 0, &err),
                     &err);
            CHECK_OK(dg_cuda_download(ys, dys, sizeof(float) * (size_t)(g.rows * H), 0, &err),
                     &err);
            CHECK_OK(dg_cuda_download(words, dsync, sizeof words, 0, &err), &err);
            for (int64_t i = 0; i < g.rows * I; i++)
                CHECKF(isnan(hh[i]), "active word 0: hh written at %lld", (long long)i);
            for (int64_t i = 0; i < g.rows * H; i++)
                CHECKF(isnan(ys[i]), "active word 0: ys written at %lld", (long long)i);
            for (int i = 0; i < 11; i++)
                CHECKF(words[i] == 0, "active word 0: sync word %d is %d", i, (int)words[i]);
        }
        /* then with no word, and with a word of 1 (the same launch) */
        for (int rep = 0; rep < 2; rep++) {
            const int32_t one = 1;
            CHECK_OK(dg_cuda_memset(dsync, 0, sizeof(int32_t) * 9, 0, &err), &err);
            CHECK_OK(dg_cuda_upload((int32_t *)dsync + 10, &one, sizeof one, 0, &err), &err);
            CHECK_OK(dg_cuda_experts_wgmma(dhh, dys, 1, g.dx, g.dw, dwd, g.doff, g.dcnt,
                                           (int32_t *)dsync,
                                           rep ? (const int32_t *)dsync + 10 : NULL, 8, I, H,
                                           hint, NULL, 0, &err),
                     &err);
        }
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        CHECK_OK(dg_cuda_download(hh, dhh, sizeof(float) * (size_t)(g.rows * I + GUARD), 0, &err),
                 &err);
        CHECK_OK(dg_cuda_download(ys, dys, sizeof(float) * (size_t)(g.rows * H + GUARD), 0, &err),
                 &err);
        CHECK_OK(dg_cuda_download(hh2, dhh2, sizeof(float) * (size_t)(g.rows * I + GUARD), 0,
                                  &err), &err);
        CHECK_OK(dg_cuda_download(ys2, dys2, sizeof(float) * (size_t)(g.rows * H + GUARD), 0,
                                  &err), &err);
        /* hh: bf16 rows of I (in a buffer sized for fp32: its guard words
         * after rows * I floats, its bf16 values in the first half) */
        for (int i = 0; i < GUARD; i++)
            CHECKF(hh[g.rows * I + i] == GUARD_F && ys[g.rows * H + i] == GUARD_F,
                   "guard word %d overwritten", i);
        for (int64_t r = 0; r < g.rows; r++) {
            const unsigned char *a = (const unsigned char *)hh + 2 * r * I,
                                *b = (const unsigned char *)hh2 + 2 * r * I;
            if (!g.covered[r]) {
                for (int64_t c = 0; c < I; c++)
                    CHECKF(a[2 * c] == 0xff && a[2 * c + 1] == 0xff,
                           "hh row %lld is in no group but was written", (long long)r);
                for (int64_t c = 0; c < H; c++)
                    CHECKF(isnan(ys[r * H + c]), "ys row %lld is in no group but was written",
                           (long long)r);
                continue;
            }
            for (int64_t c = 0; c < I; c++)
                differ_h += memcmp(a + 2 * c, b + 2 * c, 2) != 0;
            for (int64_t c = 0; c < H; c++)
                differ_y += memcmp(&ys[r * H + c], &ys2[r * H + c], 4) != 0 ||
                            isnan(ys[r * H + c]);
        }
        printf("# the experts' one launch, I %lld, H %lld, %d rows a group on average, pass hint "
               "%d: %lld of %lld hidden values and %lld of %lld outputs apart from the two "
               "launches\n", (long long)I, (long long)H, (int)(g.total / 8), hint,
               (long long)differ_h, (long long)(g.total * I), (long long)differ_y,
               (long long)(g.total * H));
        CHECK(differ_h == 0 && differ_y == 0);
        CHECK(experts_bf16_out(&g, I, H, hint, dwd, dhh2, (int32_t *)dsync) == 0);
        dg_cuda_free(dwd), dg_cuda_free(dsync), dg_cuda_free(dhh), dg_cuda_free(dys);
        dg_cuda_free(dhh2), dg_cuda_free(dys2);
        free(hwd), free(fwd), free(hh), free(ys), free(hh2), free(ys2);
        groups_free(&g);
    }
    CHECK(!dg_cuda_experts_wgmma_fits(0, 96, 256) && !dg_cuda_experts_wgmma_fits(0, 64, 200));
    CHECK_FAILS(dg_cuda_experts_wgmma(NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 8,
                                      96, 256, 16, NULL, 0, &err),
                &err, DG_E_INVAL, "experts' wgmma");
    CHECK_FAILS(dg_cuda_experts_wgmma(NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 8,
                                      64, 256, 16, NULL, 0, &err),
                &err, DG_E_INVAL, "experts' wgmma");
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-moe");
    if (rc)
        return rc;
    gt_seed(0x3c6ef372fe94f82bull);
    TEST_CASE(moe);
    TEST_CASE(elt_refused);
    TEST_CASE(route_combine);
    TEST_CASE(grouped_configs);
    TEST_CASE(grouped_gelu);
    TEST_CASE(experts_one_launch);
    return test_finish();
}
