/*
 * Description: the FP8 kernels (kernels/fp8-gemm.cu) against their plain-C
 * references on fresh random inputs.  Quantize: bf16 and fp32 rows (64,
 * 704, 2816 and 130 wide; a row of zeros, a row holding a NaN, values past
 * 448 times the scale's reach) to exactly dg_fp8_quantize_rows's bytes and
 * scales; the same for listed rows only (quantize_at) and for the experts'
 * picks read from their tokens' rows (quantize_picks).  Product: one group
 * of all rows (1 x 64 x 64, 37 x 128 x 2816, 5 x 2112 x 704, 64 x 1024 x
 * 2816) and eight groups with 0, 1, 17, 33, 64, 150 (two passes of 128), 3
 * and 16 rows at offsets with gaps between, against dg_ref_fp8_linear (the
 * sum in double): fp32 output within 1e-5 relative, bf16 output within
 * 8e-3; rows in the gaps left as poisoned, guard bytes after every output;
 * shapes that do not fit refused; the same cases again with each of the
 * kernel's configurations (K step and pipeline depth).  The same product
 * through cuBLASLt (kernels/fp8-lt.h) at the projections' shapes, both
 * ways it can apply the scales, to the same bounds.  Both of the experts'
 * products in one launch (Hopper) against the three launches it replaces,
 * to the byte (experts_one_launch).  Exit 77 where there is no GPU.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/fp8-wgmma.h"
#include "kernels/fp8-lt.h"
#include "lib/dtype.h"
#include "lib/fp8.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD_BYTES 512
#define GUARD_BYTE 0x5a

static int guard_intact(const unsigned char *h, size_t bytes)
{
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (h[bytes + i] != GUARD_BYTE)
            return 0;
    return 1;
}

/* ---- quantize ------------------------------------------------------------- */

static int quantize_one(enum dg_elt e, int64_t rows, int cols)
{
    const size_t n = (size_t)(rows * cols), es = (size_t)dg_elt_size(e);
    struct dg_error err = {0};
    void *hx = NULL;
    float *fx = NULL, *sref = malloc(sizeof(float) * (size_t)rows);
    uint8_t *qref = malloc(n), *hq = malloc(n + GUARD_BYTES);
    float *hs = malloc(sizeof(float) * (size_t)rows + GUARD_BYTES);
    void *dx, *dq, *ds;
    CHECK(sref && qref && hq && hs && gt_rand_elts(e, n, 3.0f, &hx, &fx) == 0);
    /* row 0 zeros; row 1 a NaN; row 2 one large value among small ones;
     * row 3 values so small that max / 448 is below FLT_MIN (the scale
     * held there; normal numbers in bf16 too, whose conversion flushes
     * subnormals) */
    for (int k = 0; k < cols; k++) {
        fx[k] = 0.0f;
        if (rows > 2)
            fx[2 * cols + k] = k == cols / 2 ? 5000.0f : fx[2 * cols + k] * 1e-3f;
        if (rows > 3)
            fx[3 * cols + k] *= 1e-37f;
    }
    if (rows > 1)
        fx[cols + cols / 3] = NAN;
    for (size_t i = 0; i < n; i++) {
        if (e == DG_ELT_F32) {
            memcpy((unsigned char *)hx + 4 * i, &fx[i], 4);
        } else {
            const uint16_t h = dg_f32_to_bf16(fx[i]);
            fx[i] = dg_bf16_to_f32(h);
            memcpy((unsigned char *)hx + 2 * i, &h, 2);
        }
    }
    dg_fp8_quantize_rows(fx, (size_t)rows, (size_t)cols, (size_t)cols, qref, sref);
    dx = gt_upload(hx, n * es, &err);
    dq = gt_out_alloc(n, GUARD_BYTES, GUARD_BYTE, &err);
    ds = gt_out_alloc(sizeof(float) * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
    CHECK(dx && dq && ds);
    CHECK_OK(dg_cuda_fp8_quantize_rows(e, dq, ds, dx, rows, cols, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(hq, dq, n + GUARD_BYTES, 0, &err), &err);
    CHECK_OK(dg_cuda_download(hs, ds, sizeof(float) * (size_t)rows + GUARD_BYTES, 0, &err), &err);
    CHECK(guard_intact(hq, n) && guard_intact((unsigned char *)hs, sizeof(float) * (size_t)rows));
    for (int64_t r = 0; r < rows; r++) {
        CHECKF(hs[r] == sref[r] || (isnan(hs[r]) && isnan(sref[r])), "row %lld: scale %g, want %g",
               (long long)r, (double)hs[r], (double)sref[r]);
        for (int k = 0; k < cols; k++) {
            const size_t i = (size_t)(r * cols + k);
            const int nan_both = isnan(dg_e4m3_to_f32(hq[i])) && isnan(dg_e4m3_to_f32(qref[i]));
            CHECKF(hq[i] == qref[i] || nan_both, "row %lld col %d: 0x%02x, want 0x%02x",
                   (long long)r, k, hq[i], qref[i]);
        }
    }
    if (rows > 3)
        CHECKF(sref[3] == FLT_MIN, "row 3: scale %g, want FLT_MIN", (double)sref[3]);
    printf("# quantize %s %lld x %d: every byte and scale equal to the reference\n",
           e == DG_ELT_F32 ? "fp32" : "bf16", (long long)rows, cols);
    dg_cuda_free(dx), dg_cuda_free(dq), dg_cuda_free(ds);
    free(hx), free(fx), free(sref), free(qref), free(hq), free(hs);
    return 0;
}

static int quantize(void)
{
    /* 130 and 8200 columns: the warp-a-row kernel; the others a block a row */
    static const int shapes[][2] = {{3, 64}, {9, 704}, {33, 2816}, {300, 130}, {5, 8192},
                                    {4, 8200}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int e = 0; e < 2; e++)
            CHECK(quantize_one((enum dg_elt)e, shapes[i][0], shapes[i][1]) == 0);
    return 0;
}

/* The rows of a quantization to listed rows (hq, hs: rows of cols bytes
 * and their scales, downloaded with the guard bytes after each): row r
 * with src[r] >= 0 holds the bytes and the scale of row src[r] of want
 * and ws, the others keep their poison (0xff) untouched; the guard bytes
 * intact.  what names the call in the messages. */
static int listed_rows_check(const uint8_t *hq, const float *hs, int64_t rows, int cols,
                             const int64_t *src, const uint8_t *want, const float *ws,
                             const char *what)
{
    CHECK(guard_intact(hq, (size_t)(rows * cols)) &&
          guard_intact((const unsigned char *)hs, sizeof(float) * (size_t)rows));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = src[r];
        const uint8_t *got = hq + r * cols;
        uint32_t sbits;
        memcpy(&sbits, &hs[r], 4);
        if (t < 0) {
            CHECKF(sbits == 0xffffffffu, "%s: row %lld not listed: scale written", what,
                   (long long)r);
            for (int k = 0; k < cols; k++)
                CHECKF(got[k] == 0xff, "%s: row %lld not listed: byte %d written", what,
                       (long long)r, k);
            continue;
        }
        CHECKF(memcmp(&hs[r], &ws[t], 4) == 0 && memcmp(got, want + t * cols, (size_t)cols) == 0,
               "%s: row %lld (of row %lld): scale %g against %g, or its bytes differ", what,
               (long long)r, (long long)t, (double)hs[r], (double)ws[t]);
    }
    return 0;
}

/* dg_cuda_fp8_quantize_rows_at over a shuffled subset of rows (and -1
 * entries): listed rows get the bytes and scale of dg_cuda_fp8_quantize_rows
 * over the same input (plain), or over dg_cuda_gelu_mul_e's output (gelu);
 * rows not listed keep their poison. */
static int quantize_at_one(enum dg_elt e, int64_t rows, int cols, int gelu)
{
    const int64_t w = gelu ? 2 * (int64_t)cols : cols, n = rows / 2 + 2;
    const size_t es = (size_t)dg_elt_size(e), nq = (size_t)(rows * cols);
    struct dg_error err = {0};
    void *hx = NULL, *dx, *dh = NULL, *dq, *ds, *dq2, *ds2, *dat;
    float *fx = NULL;
    int32_t *at = malloc(sizeof(int32_t) * (size_t)n);
    int64_t *src = malloc(sizeof(int64_t) * (size_t)rows); /* r where listed, else -1 */
    uint8_t *hq = malloc(nq + GUARD_BYTES), *hq2 = malloc(nq);
    float *hs = malloc(sizeof(float) * (size_t)rows + GUARD_BYTES);
    float *hs2 = malloc(sizeof(float) * (size_t)rows);
    CHECK(at && src && hq && hq2 && hs && hs2 &&
          gt_rand_elts(e, (size_t)(rows * w), 3.0f, &hx, &fx) == 0);
    for (int64_t r = 0; r < rows; r++)
        src[r] = -1;
    for (int64_t i = 0; i < n; i++) {
        at[i] = i % 7 == 3 ? -1 : (int32_t)(gt_next() % (uint64_t)rows);
        if (at[i] >= 0 && src[at[i]] >= 0)
            at[i] = -1; /* each row at most once */
        if (at[i] >= 0)
            src[at[i]] = at[i];
    }
    dx = gt_upload(hx, (size_t)(rows * w) * es, &err);
    dat = gt_upload(at, sizeof(int32_t) * (size_t)n, &err);
    dq = gt_out_alloc(nq, GUARD_BYTES, GUARD_BYTE, &err);
    ds = gt_out_alloc(sizeof(float) * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
    dq2 = gt_out_alloc(nq, 0, 0, &err);
    ds2 = gt_out_alloc(sizeof(float) * (size_t)rows, 0, 0, &err);
    CHECKF(dx && dat && dq && ds && dq2 && ds2, "%s", err.msg);
    CHECK(dg_cuda_fp8_quantize_rows_at_fits(cols, dx, dq));
    /* the two-pass way over every row */
    if (gelu) {
        CHECK_OK(dg_cuda_alloc(&dh, (size_t)(rows * cols) * es, 0, &err), &err);
        CHECK_OK(dg_cuda_gelu_mul_e(e, dh, cols, dx, w, (unsigned char *)dx + (size_t)cols * es,
                                    w, rows, cols, NULL, 0, &err),
                 &err);
    }
    CHECK_OK(dg_cuda_fp8_quantize_rows(e, dq2, ds2, gelu ? dh : dx, rows, cols, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_fp8_quantize_rows_at(e, dq, ds, dx, dat, n, cols, gelu, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(hq, dq, nq + GUARD_BYTES, 0, &err), &err);
    CHECK_OK(dg_cuda_download(hs, ds, sizeof(float) * (size_t)rows + GUARD_BYTES, 0, &err), &err);
    CHECK_OK(dg_cuda_download(hq2, dq2, nq, 0, &err), &err);
    CHECK_OK(dg_cuda_download(hs2, ds2, sizeof(float) * (size_t)rows, 0, &err), &err);
    CHECK(listed_rows_check(hq, hs, rows, cols, src, hq2, hs2, "quantize at rows") == 0);
    printf("# quantize at rows %s %lld of %lld x %d%s: every listed row's bytes and scale equal "
           "to the %s, the others untouched\n", e == DG_ELT_F32 ? "fp32" : "bf16",
           (long long)n, (long long)rows, cols, gelu ? ", gelu" : "",
           gelu ? "gelu pass and quantization" : "quantization");
    dg_cuda_free(dx), dg_cuda_free(dat), dg_cuda_free(dq), dg_cuda_free(ds), dg_cuda_free(dq2);
    dg_cuda_free(ds2), dg_cuda_free(dh);
    free(hx), free(fx), free(at), free(src), free(hq), free(hq2), free(hs), free(hs2);
    return 0;
}

static int quantize_at(void)
{
    static const int shapes[][2] = {{7, 64}, {40, 704}, {19, 2816}, {3, 8192}};
    struct dg_error err = {0};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int e = 0; e < 2; e++)
            for (int gelu = 0; gelu < 2; gelu++)
                CHECK(quantize_at_one((enum dg_elt)e, shapes[i][0], shapes[i][1], gelu) == 0);
    /* columns it does not take: refused, nothing queued */
    CHECK(!dg_cuda_fp8_quantize_rows_at_fits(130, (void *)(uintptr_t)256, (void *)(uintptr_t)256));
    CHECK(!dg_cuda_fp8_quantize_rows_at_fits(8200, (void *)(uintptr_t)256, (void *)(uintptr_t)256));
    CHECK(!dg_cuda_fp8_quantize_rows_at_fits(64, (void *)(uintptr_t)8, (void *)(uintptr_t)256));
    CHECK_FAILS(dg_cuda_fp8_quantize_rows_at(DG_ELT_BF16, NULL, NULL, (void *)(uintptr_t)256,
                                             (const int32_t *)(uintptr_t)256, 4, 130, 0, NULL, 0,
                                             &err),
                &err, DG_E_UNSUPPORTED, "columns");
    return 0;
}

/* The experts' picks quantized from their tokens' rows: T tokens of cols
 * values, K picks each, pick p's slot a random distinct row of a q of
 * T K + 5 rows or -1 (another rank's expert); every slot's bytes and
 * scale those dg_fp8_quantize_rows gives the pick's token row, every other
 * row untouched, guard bytes intact. */
static int quantize_picks_one(enum dg_elt e, int64_t T, int K, int cols)
{
    const int64_t picks = T * K, rows = picks + 5;
    const size_t es = (size_t)dg_elt_size(e), nq = (size_t)(rows * cols);
    struct dg_error err = {0};
    void *hx = NULL, *dx, *dq, *ds, *dslot;
    float *fx = NULL;
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)picks);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)rows), *token_of = malloc(sizeof(int64_t) *
                                                                             (size_t)rows);
    uint8_t *hq = malloc(nq + GUARD_BYTES), *want = malloc((size_t)(T * cols));
    float *hs = malloc(sizeof(float) * (size_t)rows + GUARD_BYTES);
    float *ws = malloc(sizeof(float) * (size_t)T);
    CHECK(slot && perm && token_of && hq && want && hs && ws &&
          gt_rand_elts(e, (size_t)(T * cols), 3.0f, &hx, &fx) == 0);
    for (int64_t r = 0; r < rows; r++)
        perm[r] = r, token_of[r] = -1;
    for (int64_t r = rows - 1; r > 0; r--) { /* Fisher-Yates */
        const int64_t j = (int64_t)(gt_next() % (uint64_t)(r + 1)), t = perm[r];
        perm[r] = perm[j], perm[j] = t;
    }
    for (int64_t p = 0; p < picks; p++) {
        slot[p] = p % 5 == 2 ? -1 : (int32_t)perm[p];
        if (slot[p] >= 0)
            token_of[slot[p]] = p / K;
    }
    dg_fp8_quantize_rows(fx, (size_t)T, (size_t)cols, (size_t)cols, want, ws);
    dx = gt_upload(hx, (size_t)(T * cols) * es, &err);
    dslot = gt_upload(slot, sizeof(int32_t) * (size_t)picks, &err);
    dq = gt_out_alloc(nq, GUARD_BYTES, GUARD_BYTE, &err);
    ds = gt_out_alloc(sizeof(float) * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
    CHECKF(dx && dslot && dq && ds, "%s", err.msg);
    CHECK_OK(dg_cuda_fp8_quantize_picks(e, dq, ds, dx, dslot, picks, K, cols, NULL, 0, &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(hq, dq, nq + GUARD_BYTES, 0, &err), &err);
    CHECK_OK(dg_cuda_download(hs, ds, sizeof(float) * (size_t)rows + GUARD_BYTES, 0, &err), &err);
    CHECK(listed_rows_check(hq, hs, rows, cols, token_of, want, ws, "quantize picks") == 0);
    printf("# quantize picks %s, %lld tokens x top-%d, %d columns: every slot's bytes and scale "
           "the reference's for its token, the other rows untouched\n",
           e == DG_ELT_F32 ? "fp32" : "bf16", (long long)T, K, cols);
    dg_cuda_free(dx), dg_cuda_free(dslot), dg_cuda_free(dq), dg_cuda_free(ds);
    free(hx), free(fx), free(slot), free(perm), free(token_of), free(hq), free(want), free(hs);
    free(ws);
    return 0;
}

static int quantize_picks(void)
{
    static const struct {
        int64_t T;
        int K, cols;
    } shapes[] = {{1, 8, 2816}, {37, 8, 2816}, {9, 2, 64}, {20, 3, 704}, {2, 1, 8192}};
    struct dg_error err = {0};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int e = 0; e < 2; e++)
            CHECK(quantize_picks_one((enum dg_elt)e, shapes[i].T, shapes[i].K,
                                     shapes[i].cols) == 0);
    CHECK_FAILS(dg_cuda_fp8_quantize_picks(DG_ELT_BF16, NULL, NULL, (void *)(uintptr_t)256,
                                           (const int32_t *)(uintptr_t)256, 4, 2, 130, NULL, 0,
                                           &err),
                &err, DG_E_UNSUPPORTED, "columns");
    CHECK_FAILS(dg_cuda_fp8_quantize_picks(DG_ELT_BF16, NULL, NULL, (void *)(uintptr_t)256,
                                           (const int32_t *)(uintptr_t)256, 4, 0, 64, NULL, 0,
                                           &err),
                &err, DG_E_INVAL, "top-0");
    CHECK_FAILS(dg_cuda_fp8_quantize_picks(DG_ELT_BF16, NULL, NULL, (void *)(uintptr_t)256,
                                           (const int32_t *)(uintptr_t)256, 5, 2, 64, NULL, 0,
                                           &err),
                &err, DG_E_INVAL, "K picks a token");
    return 0;
}

/* ---- the product ------------------------------------------------------------ */

/* quantized random operands: qa [rows, K] with sa, qw [groups, N, K] with sw */
struct operands {
    uint8_t *qa, *qw;
    float *sa, *sw;
};

static int make_operands(struct operands *o, int64_t rows, int groups, int64_t N, int64_t K)
{
    float *x = malloc(sizeof(float) * (size_t)(rows * K));
    float *w = malloc(sizeof(float) * (size_t)(groups * N * K));
    o->qa = malloc((size_t)(rows * K) + 1);
    o->qw = malloc((size_t)(groups * N * K));
    o->sa = malloc(sizeof(float) * (size_t)rows + 4);
    o->sw = malloc(sizeof(float) * (size_t)(groups * N));
    if (!x || !w || !o->qa || !o->qw || !o->sa || !o->sw)
        return -1;
    for (int64_t i = 0; i < rows * K; i++)
        x[i] = gt_uniform() * (i % 7 == 0 ? 6.0f : 1.0f);
    for (int64_t i = 0; i < groups * N * K; i++)
        w[i] = gt_uniform() * 0.05f;
    dg_fp8_quantize_rows(x, (size_t)rows, (size_t)K, (size_t)K, o->qa, o->sa);
    dg_fp8_quantize_rows(w, (size_t)(groups * N), (size_t)K, (size_t)K, o->qw, o->sw);
    free(x);
    free(w);
    return 0;
}

static void free_operands(struct operands *o)
{
    free(o->qa), free(o->qw), free(o->sa), free(o->sw);
}

/* cuBLASLt's fp32 outputs against the double-sum oracle.  Hopper's FP8
 * MMA adds into an accumulator of about 13 fraction bits, not fp32's 23
 * (measured, not documented: the DeepSeek-V3 report puts it near 14 on
 * H800), and cuBLASLt moves its partial sums into fp32 between MMAs of K
 * 32.  With random signs the rounding errors of K / 32 such additions
 * grow as a random walk: relative error about sqrt(K / 32) * 2^-13,
 * 1.1e-3 at K 2,816, against 1.4e-4 seen (run 58).  The own wgmma kernel
 * (fp8-wgmma.cu: configuration 6, the default where it fits) meets the
 * same accumulator, moving its sums into fp32 every K 128, and takes the
 * same bound (run 85: 1.3e-4 at K 64 already, one step's sum; run 86,
 * with the moves: at most 1.4e-4 at K 2,816).  The own
 * mma.sync kernel, which accumulates in fp32, keeps 1e-5; a scale applied
 * wrongly is off by O(1) either way. */
#define LT_F32_BOUND 1e-3

/* Whether row r of rows is one the oracle checks at row_step (see
 * product_by): every row_step-th and the last. */
static int sampled(int64_t r, int64_t rows, int64_t row_step)
{
    return row_step <= 1 || r % row_step == 0 || r == rows - 1;
}

/* fp8-gemm.cu's kernel: its default (the public calls) while g_config is
 * -1, else that configuration (dg_cuda_fp8_gemm_config) */
static int g_config = -1;

/* One call: groups (offsets/counts on the host, NULL: one group of all
 * rows) against the oracle; y_f32 or bf16 out; rows of no group must stay
 * poisoned.  acc: Y starts as random values (base) and the call adds to
 * them (dg_cuda_fp8_gemm_acc): the oracle is base + product, and rows of
 * no group must keep their base.  row_step > 1 (one group only): the
 * oracle, a serial double sum, is computed for every row_step-th row and
 * the last, and the error is measured on those; every row is still checked
 * for NaN, and the guard bytes as always. */
static int product_by(struct dg_fp8_lt *lt, const char *what, int64_t rows, int groups,
                      const int32_t *offsets, const int32_t *counts, int64_t N, int64_t K,
                      int y_f32, int acc, int64_t row_step, int *unsupported)
{
    const size_t es = y_f32 ? 4 : 2, ybytes = (size_t)(rows * N) * es;
    struct operands o;
    struct dg_error err = {0};
    unsigned char *hy = malloc(ybytes + GUARD_BYTES);
    float *ref = malloc(sizeof(float) * (size_t)(rows * N) + 4);
    unsigned char *covered = calloc((size_t)rows + 1, 1);
    float *base = calloc((size_t)(rows * N) + 1, sizeof(float));
    void *dqa, *dsa, *dqw, *dsw, *dy, *doff = NULL, *dcnt = NULL;
    double num = 0, den = 0, rel;
    int hint = 0;
    /* whether the own kernel runs on wgmma (configuration 6, or the
     * default where it fits: dg_cuda_fp8_gemm_pick) */
    const int wgmma = !lt && (g_config >= 0 ? !dg_cuda_fp8_gemm_config_exact(g_config)
                                            : dg_cuda_fp8_wgmma_fits(0, N, K));
    CHECK(hy && ref && covered && base && make_operands(&o, rows, groups, N, K) == 0);
    dqa = gt_upload(o.qa, (size_t)(rows * K), &err);
    dsa = gt_upload(o.sa, sizeof(float) * (size_t)rows, &err);
    dqw = gt_upload(o.qw, (size_t)(groups * N * K), &err);
    dsw = gt_upload(o.sw, sizeof(float) * (size_t)(groups * N), &err);
    dy = gt_out_alloc(ybytes, GUARD_BYTES, GUARD_BYTE, &err);
    CHECK(dqa && dsa && dqw && dsw && dy);
    if (acc) {
        /* the starting Y, exact in the output type */
        for (int64_t i = 0; i < rows * N; i++) {
            const float v = gt_uniform() * 4.0f;
            base[i] = y_f32 ? v : dg_bf16_to_f32(dg_f32_to_bf16(v));
            if (y_f32)
                memcpy(hy + 4 * i, &base[i], 4);
            else {
                const uint16_t h = dg_f32_to_bf16(base[i]);
                memcpy(hy + 2 * i, &h, 2);
            }
        }
        CHECK_OK(dg_cuda_upload(dy, hy, ybytes, 0, &err), &err);
    }
    if (offsets) {
        int64_t total = 0;
        doff = gt_upload(offsets, sizeof(int32_t) * (size_t)groups, &err);
        dcnt = gt_upload(counts, sizeof(int32_t) * (size_t)groups, &err);
        CHECK(doff && dcnt);
        for (int j = 0; j < groups; j++)
            total += counts[j];
        hint = (int)(total / groups);
    } else {
        hint = (int)rows;
    }
    if (lt) {
        const int r = dg_fp8_lt_gemm(lt, dy, y_f32, acc, dqa, dsa, dqw, dsw, rows, N, K, &err);
        if (r == -DG_E_UNSUPPORTED) {
            printf("# %s: %s\n", what, err.msg);
            *unsupported = 1;
            goto done;
        }
        CHECK_OK(r, &err);
    } else if (g_config >= 0)
        CHECK_OK(dg_cuda_fp8_gemm_config(g_config, dy, y_f32, acc, dqa, dsa, dqw, dsw, doff, dcnt,
                                         groups, rows, N, K, hint, NULL, 0, &err), &err);
    else if (acc)
        CHECK_OK(dg_cuda_fp8_gemm_acc(dy, y_f32, 1, dqa, dsa, dqw, dsw, doff, dcnt, groups, rows,
                                      N, K, hint, NULL, 0, &err), &err);
    else
        CHECK_OK(dg_cuda_fp8_gemm(dy, y_f32, dqa, dsa, dqw, dsw, doff, dcnt, groups, rows, N, K,
                                  hint, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(hy, dy, ybytes + GUARD_BYTES, 0, &err), &err);
    CHECK(guard_intact(hy, ybytes));
    for (int j = 0; j < groups; j++) {
        const int64_t r0 = offsets ? offsets[j] : 0, n = offsets ? counts[j] : rows;
        for (int64_t r = r0; row_step > 1 && r < r0 + n; r++)
            if (sampled(r, rows, row_step))
                dg_ref_fp8_linear(ref + r * N, o.qa + r * K, o.sa + r,
                                  o.qw + (int64_t)j * N * K, o.sw + (int64_t)j * N, 1,
                                  (size_t)N, (size_t)K);
        if (n && row_step <= 1)
            dg_ref_fp8_linear(ref + r0 * N, o.qa + r0 * K, o.sa + r0, o.qw + (int64_t)j * N * K,
                              o.sw + (int64_t)j * N, (size_t)n, (size_t)N, (size_t)K);
        memset(covered + r0, 1, (size_t)n);
    }
    for (int64_t i = 0; acc && i < rows * N; i++)
        if (covered[i / N])
            ref[i] += base[i];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < N; c++) {
            const size_t i = (size_t)(r * N + c);
            float g;
            if (y_f32)
                memcpy(&g, hy + 4 * i, 4);
            else {
                uint16_t h;
                memcpy(&h, hy + 2 * i, 2);
                g = dg_bf16_to_f32(h);
            }
            if (!covered[r]) {
                CHECKF(acc ? g == base[i] : isnan(g), "%s: row %lld is in no group but was "
                       "written", what, (long long)r);
                continue;
            }
            CHECKF(!isnan(g), "%s: row %lld col %lld is NaN", what, (long long)r, (long long)c);
            if (!sampled(r, rows, row_step))
                continue;
            num += ((double)g - ref[i]) * ((double)g - ref[i]);
            den += (double)ref[i] * ref[i];
        }
    rel = den > 0 ? sqrt(num / den) : 0;
    printf("# fp8 GEMM%s%s%s %s, %s out%s: relative error %.2e", lt ? " (cuBLASLt)" : "",
           !lt && g_config >= 0 ? ", " : "",
           !lt && g_config >= 0 ? dg_cuda_fp8_gemm_config_name(g_config) : "", what,
           y_f32 ? "fp32" : "bf16", acc ? ", accumulating" : "", rel);
    if (row_step > 1)
        printf(" (every %lld-th row)", (long long)row_step);
    printf("\n");
    CHECK(rel <= (y_f32 ? (lt || wgmma ? LT_F32_BOUND : 1e-5) : 8e-3));
done:
    dg_cuda_free(dqa), dg_cuda_free(dsa), dg_cuda_free(dqw), dg_cuda_free(dsw), dg_cuda_free(dy);
    dg_cuda_free(doff), dg_cuda_free(dcnt);
    free_operands(&o);
    free(hy), free(ref), free(covered), free(base);
    return 0;
}

/* fp8-gemm.cu's kernel */
static int product(const char *what, int64_t rows, int groups, const int32_t *offsets,
                   const int32_t *counts, int64_t N, int64_t K, int y_f32, int acc)
{
    int unsupported = 0;
    return product_by(NULL, what, rows, groups, offsets, counts, N, K, y_f32, acc, 1,
                      &unsupported);
}

static int gemm_one_group(void)
{
    /* (600 rows at N 128: one group's passes spread over grid.z; K 1056,
     * 352 and 48: a last step of 32 or 48 bytes, as a rank's share of the
     * 26B-A4B's widths at TP=2 has; 12 rows at K 2816: the default's K
     * steps of 128 bytes, dg_cuda_fp8_gemm_default_config) */
    static const int64_t shapes[][3] = {{1, 64, 64},      {37, 128, 2816}, {5, 2112, 704},
                                        {64, 1024, 2816}, {600, 128, 256}, {3, 2816, 1056},
                                        {40, 64, 352},    {9, 128, 48},    {12, 256, 2816}};
    CHECK(dg_cuda_fp8_gemm_default_config(12, 2816) == 1 &&
          dg_cuda_fp8_gemm_default_config(37, 2816) == 0 &&
          dg_cuda_fp8_gemm_default_config(12, 704) == 0);
    char what[96];
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int f = 0; f < 2; f++) {
            snprintf(what, sizeof what, "%lld x %lld x %lld", (long long)shapes[i][0],
                     (long long)shapes[i][1], (long long)shapes[i][2]);
            CHECK(product(what, shapes[i][0], 1, NULL, NULL, shapes[i][1], shapes[i][2], f,
                          0) == 0);
        }
    return 0;
}

static int gemm_groups(void)
{
    static const int32_t counts[8] = {0, 1, 17, 33, 64, 150, 3, 16};
    int32_t offsets[8];
    int64_t rows = 0;
    for (int j = 0; j < 8; j++) {
        rows += 5; /* a gap of 5 rows before each group: never written */
        offsets[j] = (int32_t)rows;
        rows += counts[j];
    }
    for (int f = 0; f < 2; f++)
        CHECK(product("8 groups (0-150 rows), N 128, K 704", rows + 3, 8, offsets, counts, 128,
                      704, f, 0) == 0);
    return 0;
}

/* Y += product: a projection's residual add (one group, and groups) */
static int gemm_accumulate(void)
{
    static const int32_t counts[3] = {7, 0, 40};
    static const int32_t offsets[3] = {2, 9, 12};
    for (int f = 0; f < 2; f++) {
        CHECK(product("37 x 128 x 2816", 37, 1, NULL, NULL, 128, 2816, f, 1) == 0);
        CHECK(product("3 groups, N 64, K 192", 55, 3, offsets, counts, 64, 192, f, 1) == 0);
    }
    return 0;
}

/* The kernel's other configurations (K step, pipeline depth: fp8-gemm.h)
 * through the same three cases, so that whichever the benchmark picks as
 * the default has passed them; and a configuration that does not exist is
 * refused. */
static int gemm_configs(void)
{
    struct dg_error err = {0};
    const int n = dg_cuda_fp8_gemm_configs();
    CHECK(n >= 1 && dg_cuda_fp8_gemm_config_name(0) && !dg_cuda_fp8_gemm_config_name(n));
    CHECK(dg_cuda_fp8_gemm_config_exact(0) && !dg_cuda_fp8_gemm_config_exact(n) &&
          !dg_cuda_fp8_gemm_config_exact(-1));
    for (g_config = 0; g_config < n; g_config++) {
        printf("# configuration %d: %s\n", g_config, dg_cuda_fp8_gemm_config_name(g_config));
        if (!dg_cuda_fp8_gemm_config_exact(g_config) && !dg_cuda_fp8_wgmma_fits(0, 64, 64)) {
            printf("# (not on this device: skipped)\n");
            continue;
        }
        CHECK(gemm_one_group() == 0);
        CHECK(gemm_groups() == 0);
        CHECK(gemm_accumulate() == 0);
    }
    g_config = -1;
    CHECK_FAILS(dg_cuda_fp8_gemm_config(n, NULL, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, 1, 4,
                                        64, 64, 4, NULL, 0, &err),
                &err, DG_E_INVAL, "no such configuration");
    return 0;
}

/* The oracle's row step for a [T x K] by [N x K] product: about 2^27
 * multiply-adds a call at most (the full projections' shapes, 16 calls
 * each, took the serial oracle past the runner's 300 s in run 56). */
static int64_t lt_row_step(int64_t T, int64_t N, int64_t K)
{
    const int64_t step = T * N * K >> 27;
    return step > 1 ? step : 1;
}

/* cuBLASLt's FP8 matmul with per-row and per-token scales (fp8-lt.h), one
 * group of all rows, against the same oracle and bounds, both ways it can
 * apply the scales (the outer-vector modes where cuBLASLt has them, then
 * forced unit scales and the scaling pass): the projections' shapes at
 * batch 1 (256 canvas rows: q, k and o of a sliding layer, o of a full
 * one, the dense MLP's gate and down), odd row counts, K of 48 and 1,056,
 * 2,100 rows of 8,192 (more than the 64 MB scratch holds: two chunks, the
 * second shorter), and the accumulating form; the large shapes' oracle
 * on a sample of rows (lt_row_step).  Each shape's way is listed; shapes
 * cuBLASLt has no algorithm for are listed too, and the case is skipped if
 * it has none at all.  On compute capability 9.0 some shape must take the
 * outer-vector scales. */
static int lt_gemm(void)
{
    static const int64_t shapes[][3] = {
        {256, 4096, 2816}, {256, 2048, 2816}, {256, 2816, 4096}, {256, 2816, 8192},
        {256, 2112, 2816}, {256, 2816, 2112}, {1, 64, 64},       {37, 128, 2816},
        {600, 128, 256},   {3, 2816, 1056},   {9, 128, 48},      {2100, 8192, 64},
        {66000, 64, 32}}; /* the last: more rows than a grid's y (the one-a-thread pass) */
    struct dg_error err = {0};
    int tried = 0, none = 0, outer = 0;
    char what[96];
    for (unsigned flags = 0; flags <= DG_FP8_LT_UNIT_SCALES; flags += DG_FP8_LT_UNIT_SCALES) {
        struct dg_fp8_lt *lt = NULL;
        CHECK_OK(dg_fp8_lt_create(0, NULL, flags, &lt, &err), &err);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int f = 0; f < 2; f++)
                for (int acc = 0; acc < 2; acc++) {
                    const int64_t *sh = shapes[i];
                    int unsupported = 0;
                    if (acc && i % 3)
                        continue; /* accumulating: every third shape */
                    if (sh[0] * sh[1] > ((int64_t)16 << 20) && (acc || !f))
                        continue; /* the two-chunk shape: fp32, once */
                    snprintf(what, sizeof what, "%lld x %lld x %lld", (long long)sh[0],
                             (long long)sh[1], (long long)sh[2]);
                    CHECK(product_by(lt, what, sh[0], 1, NULL, NULL, sh[1], sh[2], f, acc,
                                     lt_row_step(sh[0], sh[1], sh[2]), &unsupported) == 0);
                    printf("# %s%s: %s\n", what, flags ? " (unit scales forced)" : "",
                           dg_fp8_lt_mode(lt, sh[0], sh[1], sh[2], f, acc));
                    outer += !strcmp(dg_fp8_lt_mode(lt, sh[0], sh[1], sh[2], f, acc),
                                     "outer-vector scales");
                    tried++;
                    none += unsupported;
                }
        /* refusals of its own */
        CHECK_FAILS(dg_fp8_lt_gemm(lt, NULL, 1, 0, NULL, NULL, NULL, NULL, 4, 64, 40, &err),
                    &err, DG_E_INVAL, "K a multiple of 16");
        CHECK_FAILS(dg_fp8_lt_gemm(lt, NULL, 1, 0, NULL, NULL, NULL, NULL, 4, 60, 64, &err),
                    &err, DG_E_INVAL, "N of 8");
        CHECK(dg_fp8_lt_gemm(lt, NULL, 1, 0, NULL, NULL, NULL, NULL, 0, 64, 64, &err) == 0);
        CHECK(strcmp(dg_fp8_lt_mode(lt, 5, 64, 64, 1, 0), "not tried") == 0);
        dg_fp8_lt_destroy(lt);
    }
    printf("# cuBLASLt: %d of %d calls had an algorithm, %d with the outer-vector scales\n",
           tried - none, tried, outer);
    if (none == tried)
        return test_skip("cuBLASLt has no FP8 algorithm on this GPU");
    /* cuBLASLt 13.1 offers them on compute capability 9.0 (run 251): none
     * there means the plan asks for them wrongly, as it did until then */
    CHECKF(outer > 0 || !dg_cuda_fp8_wgmma_fits(0, 64, 64),
           "no shape took the outer-vector scales on a GPU that has them");
    return 0;
}

/* The unit-scale product alone (dg_fp8_lt_product): where it has the
 * shape, its sums scaled on the host as the scaling pass scales them,
 * bf16((S sa) sw), are the bytes of dg_fp8_lt_gemm's bf16 output; where
 * it says DG_E_UNSUPPORTED, dg_fp8_lt_gemm does not take the shape the
 * unit-scale way in one chunk (its mode says so).  The q, k, v shapes of
 * the 26B-A4B (sliding and full) at 256 and 37 tokens, and a shape past
 * the scratch's one chunk. */
static int lt_product(void)
{
    static const int64_t shapes[][3] = {
        {256, 8192, 2816}, {256, 6144, 2816}, {37, 8192, 2816}, {1, 64, 64}, {2100, 8192, 64}};
    struct dg_error err = {0};
    struct dg_fp8_lt *lt = NULL;
    int had = 0;
    CHECK_OK(dg_fp8_lt_create(0, NULL, DG_FP8_LT_UNIT_SCALES, &lt, &err), &err);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t T = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
        struct operands o;
        void *dqa, *dsa, *dqw, *dsw, *dy;
        const float *S = NULL;
        uint16_t *y;
        float *hs;
        int64_t differ = 0;
        int rc;
        CHECK(make_operands(&o, T, 1, N, K) == 0);
        dqa = gt_upload(o.qa, (size_t)(T * K), &err);
        dsa = gt_upload(o.sa, sizeof(float) * (size_t)T, &err);
        dqw = gt_upload(o.qw, (size_t)(N * K), &err);
        dsw = gt_upload(o.sw, sizeof(float) * (size_t)N, &err);
        dy = gt_out_alloc(2 * (size_t)(T * N), GUARD_BYTES, GUARD_BYTE, &err);
        y = malloc(2 * (size_t)(T * N));
        hs = malloc(sizeof(float) * (size_t)(T * N));
        CHECKF(dqa && dsa && dqw && dsw && dy && y && hs, "%s", err.msg);
        rc = dg_fp8_lt_gemm(lt, dy, 0, 0, dqa, dsa, dqw, dsw, T, N, K, &err);
        CHECKF(rc == 0 || rc == -DG_E_UNSUPPORTED, "%s", err.msg);
        if (rc == 0)
            rc = dg_fp8_lt_product(lt, dqa, dqw, T, N, K, &S, &err);
        CHECKF(rc == 0 || rc == -DG_E_UNSUPPORTED, "%s", err.msg);
        printf("# FP8 product alone, %lld x %lld x %lld: %s (the product with its scales: %s)\n",
               (long long)T, (long long)N, (long long)K, rc == 0 ? "taken" : err.msg,
               dg_fp8_lt_mode(lt, T, N, K, 0, 0));
        if (rc == 0) {
            CHECK_OK(dg_cuda_sync(0, &err), &err);
            CHECK_OK(dg_cuda_download(hs, S, sizeof(float) * (size_t)(T * N), 0, &err), &err);
            CHECK_OK(dg_cuda_download(y, dy, 2 * (size_t)(T * N), 0, &err), &err);
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < N; n++)
                    differ += dg_f32_to_bf16(hs[t * N + n] * o.sa[t] * o.sw[n]) != y[t * N + n];
            printf("# ... %lld of %lld values apart from the product with its scales\n",
                   (long long)differ, (long long)(T * N));
            CHECK(differ == 0);
            had++;
        } else {
            CHECK(strcmp(dg_fp8_lt_mode(lt, T, N, K, 0, 0), "unit scales and a scaling pass") ||
                  T * N > ((int64_t)16 << 20));
        }
        free_operands(&o);
        dg_cuda_free(dqa), dg_cuda_free(dsa), dg_cuda_free(dqw), dg_cuda_free(dsw);
        dg_cuda_free(dy), free(y), free(hs);
    }
    CHECK_FAILS(dg_fp8_lt_product(lt, NULL, NULL, 0, 64, 64, NULL, &err), &err, DG_E_INVAL,
                "FP8 product");
    CHECK_FAILS(dg_fp8_lt_product(lt, NULL, NULL, 4, 60, 64, NULL, &err), &err, DG_E_INVAL,
                "N of 8");
    dg_fp8_lt_destroy(lt);
    if (!had)
        return test_skip("cuBLASLt took no shape the unit-scale way on this GPU");
    return 0;
}

/* ---- the experts' one launch ------------------------------------------------- */

/* n bytes of device memory d (plus its GUARD_BYTES) into a new host buffer */
static unsigned char *fetch(const void *d, size_t n)
{
    struct dg_error err = {0};
    unsigned char *h = malloc(n + GUARD_BYTES);
    if (h && dg_cuda_download(h, d, n + GUARD_BYTES, 0, &err) < 0) {
        free(h);
        return NULL;
    }
    return h;
}

/* rows [0, rows) of width w bytes of a and b: equal on the rows covered[r],
 * every byte 0xff (the poison) on the others; the guard bytes after a intact */
static int rows_equal(const unsigned char *a, const unsigned char *b, int64_t rows, size_t w,
                      const unsigned char *covered, const char *what, int64_t *differ)
{
    CHECKF(guard_intact(a, (size_t)rows * w), "%s: guard bytes overwritten", what);
    for (int64_t r = 0; r < rows; r++)
        for (size_t i = 0; i < w; i++) {
            const size_t at = (size_t)r * w + i;
            if (covered[r])
                *differ += a[at] != b[at];
            else
                CHECKF(a[at] == 0xff, "%s: row %lld is in no group but was written", what,
                       (long long)r);
        }
    return 0;
}

/* Both of the FP8 experts' products in one launch (dg_cuda_fp8_experts_wgmma,
 * Hopper only) against the three launches it replaces: dg_cuda_fp8_wgmma
 * into the bf16 [gate | up] rows, dg_cuda_fp8_quantize_rows_at with gelu
 * over the groups' rows, dg_cuda_fp8_wgmma into the fp32 outputs.  The
 * [gate | up] rows, the quantized hidden rows and their scales, and the
 * outputs the same bytes on every row of a group; rows in no group still
 * poisoned; guard bytes intact; with bf16 outputs, the bytes of the
 * third launch's bf16 ones.  Eight groups of 0, 1, 17, 33, 64, 150, 3
 * and 16 rows with gaps, I 64, at rows hints 16, 24, 85 and 150: H 256
 * (the one launch in passes of 32, then of 64 with two warpgroups a
 * block, each tile's passes split over 2 and 3 blocks at hints 85 and
 * 150) and H 192 (an odd multiple of 64: one warpgroup a block, passes of
 * 64 and 128; split over 3 blocks at hint 300); the 26B-A4B's experts (I
 * 704, H 2816) at 16 rows a group, at 64 to 130 (passes of 64, two
 * warpgroups) and at 0 to 300 with hint 256 (passes split over 4 blocks,
 * a group of 5 passes among them); each launch with its sync words
 * zeroed, twice on the same buffers.  Shapes it does not take and a NULL
 * sync refused. */
static int experts_one_launch(void)
{
    static const int32_t counts_a[8] = {0, 1, 17, 33, 64, 150, 3, 16};
    static const int32_t counts_b[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const int32_t counts_d[8] = {96, 64, 80, 130, 72, 88, 65, 100};
    static const int32_t counts_e[8] = {256, 300, 0, 210, 280, 1, 260, 193};
    static const struct {
        const int32_t *counts;
        int64_t I, H;
        int hint;
    } shapes[10] = {{counts_a, 64, 256, 16},    {counts_a, 64, 256, 24},
                    {counts_a, 64, 256, 85},    {counts_a, 64, 256, 150},
                    {counts_a, 64, 192, 24},    {counts_a, 64, 192, 85},
                    {counts_a, 64, 192, 300},   {counts_b, 704, 2816, 16},
                    {counts_d, 704, 2816, 48},  {counts_e, 704, 2816, 256}};
    struct dg_error err = {0};
    if (!dg_cuda_fp8_experts_wgmma_fits(0, 64, 256)) {
        printf("# the FP8 experts' one launch: not on this device, skipped\n");
        return 0;
    }
    for (int si = 0; si < 10; si++) {
        const int64_t I = shapes[si].I, H = shapes[si].H;
        const int hint = shapes[si].hint;
        int32_t offsets[8], *at = NULL;
        int64_t rows = 0, n = 0, dg = 0, dq = 0, ds = 0, dy = 0;
        unsigned char *covered;
        struct operands up, dn;
        void *dqa, *dsa, *dwg, *dsg, *dwd, *dsd, *doff, *dcnt, *dat, *dsync;
        void *gu, *q2, *qs2, *ys, *gu_r, *q2_r, *qs2_r, *ys_r;
        unsigned char *h[8];
        for (int j = 0; j < 8; j++) {
            rows += 5;
            offsets[j] = (int32_t)rows;
            rows += shapes[si].counts[j];
        }
        rows += 3;
        covered = calloc((size_t)rows, 1);
        at = malloc(sizeof(int32_t) * (size_t)rows);
        CHECK(covered && at && make_operands(&up, rows, 8, 2 * I, H) == 0 &&
              make_operands(&dn, 1, 8, H, I) == 0);
        for (int j = 0; j < 8; j++)
            for (int32_t r = 0; r < shapes[si].counts[j]; r++) {
                covered[offsets[j] + r] = 1;
                at[n++] = offsets[j] + r;
            }
        dqa = gt_upload(up.qa, (size_t)(rows * H), &err);
        dsa = gt_upload(up.sa, sizeof(float) * (size_t)rows, &err);
        dwg = gt_upload(up.qw, (size_t)(8 * 2 * I * H), &err);
        dsg = gt_upload(up.sw, sizeof(float) * (size_t)(8 * 2 * I), &err);
        dwd = gt_upload(dn.qw, (size_t)(8 * H * I), &err);
        dsd = gt_upload(dn.sw, sizeof(float) * (size_t)(8 * H), &err);
        doff = gt_upload(offsets, sizeof offsets, &err);
        dcnt = gt_upload(shapes[si].counts, sizeof offsets, &err);
        dat = gt_upload(at, sizeof(int32_t) * (size_t)n, &err);
        CHECK_OK(dg_cuda_alloc(&dsync, sizeof(int32_t) * 17, 0, &err), &err);
        gu = gt_out_alloc((size_t)(rows * 2 * I) * 2, GUARD_BYTES, GUARD_BYTE, &err);
        q2 = gt_out_alloc((size_t)(rows * I), GUARD_BYTES, GUARD_BYTE, &err);
        qs2 = gt_out_alloc(sizeof(float) * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
        ys = gt_out_alloc(sizeof(float) * (size_t)(rows * H), GUARD_BYTES, GUARD_BYTE, &err);
        gu_r = gt_out_alloc((size_t)(rows * 2 * I) * 2, GUARD_BYTES, GUARD_BYTE, &err);
        q2_r = gt_out_alloc((size_t)(rows * I), GUARD_BYTES, GUARD_BYTE, &err);
        qs2_r = gt_out_alloc(sizeof(float) * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
        ys_r = gt_out_alloc(sizeof(float) * (size_t)(rows * H), GUARD_BYTES, GUARD_BYTE, &err);
        CHECKF(dqa && dsa && dwg && dsg && dwd && dsd && doff && dcnt && dat && gu && q2 && qs2 &&
                   ys && gu_r && q2_r && qs2_r && ys_r,
               "%s", err.msg);
        /* the three launches */
        CHECK_OK(dg_cuda_fp8_wgmma(gu_r, 0, 0, dqa, dsa, dwg, dsg, doff, dcnt, 8, rows, 2 * I, H,
                                   hint, NULL, 0, &err), &err);
        CHECK_OK(dg_cuda_fp8_quantize_rows_at(DG_ELT_BF16, q2_r, qs2_r, gu_r, dat, n, (int)I, 1,
                                              NULL, 0, &err), &err);
        CHECK_OK(dg_cuda_fp8_wgmma(ys_r, 1, 0, q2_r, qs2_r, dwd, dsd, doff, dcnt, 8, rows, H, I,
                                   hint, NULL, 0, &err), &err);
        for (int rep = 0; rep < 2; rep++) {
            CHECK_OK(dg_cuda_memset(dsync, 0, sizeof(int32_t) * 17, 0, &err), &err);
            CHECK_OK(dg_cuda_fp8_experts_wgmma(gu, q2, qs2, ys, 1, dqa, dsa, dwg, dsg, dwd, dsd,
                                               doff, dcnt, dsync, 8, I, H, hint, NULL, 0, &err),
                     &err);
        }
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        h[0] = fetch(gu, (size_t)(rows * 2 * I) * 2);
        h[1] = fetch(gu_r, (size_t)(rows * 2 * I) * 2);
        h[2] = fetch(q2, (size_t)(rows * I)), h[3] = fetch(q2_r, (size_t)(rows * I));
        h[4] = fetch(qs2, sizeof(float) * (size_t)rows);
        h[5] = fetch(qs2_r, sizeof(float) * (size_t)rows);
        h[6] = fetch(ys, sizeof(float) * (size_t)(rows * H));
        h[7] = fetch(ys_r, sizeof(float) * (size_t)(rows * H));
        for (int i = 0; i < 8; i++)
            CHECK(h[i]);
        if (rows_equal(h[0], h[1], rows, (size_t)(4 * I), covered, "gate/up rows", &dg) ||
            rows_equal(h[2], h[3], rows, (size_t)I, covered, "hidden rows", &dq) ||
            rows_equal(h[4], h[5], rows, sizeof(float), covered, "hidden scales", &ds) ||
            rows_equal(h[6], h[7], rows, sizeof(float) * (size_t)H, covered, "outputs", &dy))
            return 1;
        printf("# the FP8 experts' one launch, I %lld, H %lld, pass hint %d, %lld rows: bytes "
               "apart from the three launches: %lld of gate/up, %lld of the hidden rows, %lld of "
               "their scales, %lld of the outputs\n", (long long)I, (long long)H, hint,
               (long long)n, (long long)dg, (long long)dq, (long long)ds, (long long)dy);
        CHECK(dg == 0 && dq == 0 && ds == 0 && dy == 0);
        for (int i = 0; i < 8; i++)
            free(h[i]);
        {
            /* bf16 outputs against the third launch's bf16 ones (over
             * the same quantized hidden rows) */
            void *yb = gt_out_alloc((size_t)(rows * H) * 2, GUARD_BYTES, GUARD_BYTE, &err);
            void *yb_r = gt_out_alloc((size_t)(rows * H) * 2, GUARD_BYTES, GUARD_BYTE, &err);
            int64_t db = 0;
            CHECKF(yb && yb_r, "%s", err.msg);
            CHECK_OK(dg_cuda_fp8_wgmma(yb_r, 0, 0, q2_r, qs2_r, dwd, dsd, doff, dcnt, 8, rows, H,
                                       I, hint, NULL, 0, &err), &err);
            CHECK_OK(dg_cuda_memset(dsync, 0, sizeof(int32_t) * 17, 0, &err), &err);
            CHECK_OK(dg_cuda_fp8_experts_wgmma(gu, q2, qs2, yb, 0, dqa, dsa, dwg, dsg, dwd, dsd,
                                               doff, dcnt, dsync, 8, I, H, hint, NULL, 0, &err),
                     &err);
            CHECK_OK(dg_cuda_sync(0, &err), &err);
            h[0] = fetch(yb, (size_t)(rows * H) * 2), h[1] = fetch(yb_r, (size_t)(rows * H) * 2);
            CHECK(h[0] && h[1]);
            if (rows_equal(h[0], h[1], rows, (size_t)(2 * H), covered, "bf16 outputs", &db))
                return 1;
            printf("# the FP8 experts' one launch with bf16 outputs, I %lld, H %lld, pass hint "
                   "%d: %lld bytes apart from the third launch's\n", (long long)I, (long long)H,
                   hint, (long long)db);
            CHECK(db == 0);
            free(h[0]), free(h[1]);
            dg_cuda_free(yb), dg_cuda_free(yb_r);
        }
        dg_cuda_free(dqa), dg_cuda_free(dsa), dg_cuda_free(dwg), dg_cuda_free(dsg);
        dg_cuda_free(dwd), dg_cuda_free(dsd), dg_cuda_free(doff), dg_cuda_free(dcnt);
        dg_cuda_free(dat), dg_cuda_free(dsync), dg_cuda_free(gu), dg_cuda_free(q2);
        dg_cuda_free(qs2), dg_cuda_free(ys), dg_cuda_free(gu_r), dg_cuda_free(q2_r);
        dg_cuda_free(qs2_r), dg_cuda_free(ys_r);
        free_operands(&up), free_operands(&dn), free(covered), free(at);
    }
    CHECK(!dg_cuda_fp8_experts_wgmma_fits(0, 32, 256) &&
          !dg_cuda_fp8_experts_wgmma_fits(0, 1088, 256) &&
          !dg_cuda_fp8_experts_wgmma_fits(0, 64, 200));
    CHECK_FAILS(dg_cuda_fp8_experts_wgmma(NULL, NULL, NULL, NULL, 1, NULL, NULL, NULL, NULL,
                                          NULL, NULL, NULL, NULL, NULL, 8, 64, 256, 16, NULL, 0,
                                          &err),
                &err, DG_E_INVAL, "FP8 experts' wgmma");
    return 0;
}

static int refusals(void)
{
    struct dg_error err = {0};
    int32_t dummy[2] = {0, 0};
    CHECK(!dg_cuda_fp8_gemm_fits(100, 64) && !dg_cuda_fp8_gemm_fits(64, 100) &&
          !dg_cuda_fp8_gemm_fits(32, 64) && dg_cuda_fp8_gemm_fits(2112, 704) &&
          dg_cuda_fp8_gemm_fits(2816, 1056) && dg_cuda_fp8_gemm_fits(64, 48));
    CHECK_FAILS(dg_cuda_fp8_gemm(NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, 1, 4, 100, 64, 4,
                                 NULL, 0, &err), &err, DG_E_INVAL, "N a multiple of 64");
    CHECK_FAILS(dg_cuda_fp8_gemm(NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, 2, 4, 64, 64, 4,
                                 NULL, 0, &err), &err, DG_E_INVAL, "2 group(s)");
    CHECK_FAILS(dg_cuda_fp8_gemm(NULL, 1, NULL, NULL, NULL, NULL, dummy, NULL, 1, 4, 64, 64, 4,
                                 NULL, 0, &err), &err, DG_E_INVAL, "fp8 GEMM");
    CHECK_FAILS(dg_cuda_fp8_quantize_rows((enum dg_elt)7, NULL, NULL, NULL, 2, 8, NULL, 0, &err),
                &err, DG_E_INVAL, "element type 7");
    CHECK(dg_cuda_fp8_gemm(NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 64, 64, 4, NULL, 0,
                           &err) == 0); /* no rows: nothing to do */
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-fp8");
    if (rc)
        return rc;
    gt_seed(0x3c6ef372fe94f82bull);
    TEST_CASE(quantize);
    TEST_CASE(quantize_at);
    TEST_CASE(quantize_picks);
    TEST_CASE(gemm_one_group);
    TEST_CASE(gemm_groups);
    TEST_CASE(gemm_accumulate);
    TEST_CASE(gemm_configs);
    TEST_CASE(lt_gemm);
    TEST_CASE(lt_product);
    TEST_CASE(experts_one_launch);
    TEST_CASE(refusals);
    return test_finish();
}
