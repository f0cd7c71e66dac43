/*
 * Description: dg_cuda_fill_normal (random bf16 weights: Box-Muller over
 * Philox4x32-10) against its plain-C reference dg_ref_fill_normal, bit by
 * bit up to the last ulp of logf/cosf/sinf.  At several n (odd ones, one
 * above a grid's worth of pairs) and several (seed, tensor, mean, std),
 * std = 0 and a tensor id near 2^32 among them: every output is poisoned
 * (0xff bytes, a bf16 NaN) before the launch and followed by guard words
 * that must come back untouched; no element may differ from the reference
 * by more than 1 bf16 ulp, and at most 1e-3 of them (at least 1 allowed per
 * fill, none at std = 0) may differ at all.  Then: the sample mean and std
 * of 3e6 N(0, 0.02) values within 1% of std; element i independent of n;
 * other tensors and other seeds (its high word too) giving other streams;
 * indices past 2^33 (the counter's high word; skipped without 17 GiB free);
 * refusals.  dg_cuda_fill_normal_rect (a rows x cols slice at row stride
 * ld from element first) at several shapes, against dg_ref_fill_normal_rect
 * by the same rules and bit for bit against the matching elements of the
 * whole tensor's dg_cuda_fill_normal; its refusals.  The measured counts
 * are printed ("# ...").  Exit 77 where there is no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 256        /* bf16 words after every output */
#define GUARD_WORD 0xa5a5u
#define POISON_BYTE 0xff /* 0xffff: a bf16 NaN */

static const int64_t SIZES[] = {1, 2, 7, 1000, 65537, 3000001};

static const struct {
    uint64_t seed;
    uint32_t tensor;
    float mean, std;
} PARAMS[] = {
    {0, 0, 0.0f, 0.02f},
    {0x0123456789abcdefull, 0xfffffffeu, 1.0f, 0.5f},
    {42, 7, -0.25f, 0.0f},
    {0xfedcba9876543210ull, 3, 0.0f, 1.0f},
    {1, 0x80000001u, -3.0f, 100.0f},
};

static int is_nan(uint16_t b)
{
    return (b & 0x7fffu) > 0x7f80u;
}

/* bf16 bits -> a line ordered like the values (+0 and -0 both 0), so the
 * distance is the number of ulps between two values. */
static long ordered(uint16_t b)
{
    return b & 0x8000u ? -(long)(b & 0x7fffu) : (long)b;
}

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

/* Wait, bring back n words and the guard into h (n + GUARD words); 0, or -1
 * (a copy failed, a guard word changed) with the reason printed. */
static int fetch(uint16_t *h, const uint16_t *d, size_t n, const char *what)
{
    struct dg_error err = {0};
    if (dg_cuda_sync(0, &err) < 0 || dg_cuda_download(h, d, (n + GUARD) * 2, 0, &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        return -1;
    }
    for (size_t i = 0; i < GUARD; i++)
        if (h[n + i] != GUARD_WORD) {
            printf("# %s: guard word %zu after the output changed\n", what, i);
            return -1;
        }
    return 0;
}

struct diff {
    size_t differ, nan;
    long max_ulp;
    size_t first; /* the first differing index (valid when differ > 0) */
};

/* (a difference within abs_tol, the fp32 rounding of mean + std N where it
 * cancels towards 0, does not count towards max_ulp) */
static struct diff compare(const uint16_t *got, const uint16_t *ref, size_t n, float abs_tol)
{
    struct diff d = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        long u;
        if (is_nan(got[i]) || is_nan(ref[i])) {
            d.nan++;
            continue;
        }
        if (got[i] == ref[i])
            continue;
        if (!d.differ)
            d.first = i;
        d.differ++;
        u = labs(ordered(got[i]) - ordered(ref[i]));
        if (fabsf(dg_bf16_to_f32(got[i]) - dg_bf16_to_f32(ref[i])) <= abs_tol)
            u = 1;
        if (u > d.max_ulp)
            d.max_ulp = u;
    }
    return d;
}

/* Fill n on the GPU (into a fresh poisoned, guarded buffer) and bring it
 * back into h (n + GUARD words). */
static int gpu_fill(uint16_t *h, int64_t n, uint64_t seed, uint32_t tensor, float mean,
                    float std, const char *what)
{
    struct dg_error err = {0};
    uint16_t *d = out_buf((size_t)n, &err);
    int rc;
    if (!d) {
        printf("# %s: %s\n", what, err.msg);
        return -1;
    }
    if (dg_cuda_fill_normal(d, n, seed, tensor, mean, std, NULL, 0, &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        dg_cuda_free(d);
        return -1;
    }
    rc = fetch(h, d, (size_t)n, what);
    dg_cuda_free(d);
    return rc;
}

/* Fill a rows x cols slice on the GPU (into a fresh poisoned, guarded
 * buffer) and bring it back into h (rows * cols + GUARD words). */
static int gpu_fill_rect(uint16_t *h, int64_t rows, int64_t cols, int64_t ld, int64_t first,
                         uint64_t seed, uint32_t tensor, float mean, float std,
                         const char *what)
{
    struct dg_error err = {0};
    const size_t n = (size_t)(rows * cols);
    uint16_t *d = out_buf(n, &err);
    int rc;
    if (!d) {
        printf("# %s: %s\n", what, err.msg);
        return -1;
    }
    if (dg_cuda_fill_normal_rect(d, rows, cols, ld, first, seed, tensor, mean, std, NULL, 0,
                                 &err) < 0) {
        printf("# %s: %s\n", what, err.msg);
        dg_cuda_free(d);
        return -1;
    }
    rc = fetch(h, d, n, what);
    dg_cuda_free(d);
    return rc;
}

/* ---- cases -------------------------------------------------------------------- */

static int matches_reference(void)
{
    size_t total = 0, total_differ = 0;
    for (size_t p = 0; p < sizeof PARAMS / sizeof PARAMS[0]; p++)
        for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++) {
            const int64_t n = SIZES[k];
            const uint64_t seed = PARAMS[p].seed;
            const uint32_t tensor = PARAMS[p].tensor;
            const float mean = PARAMS[p].mean, std = PARAMS[p].std;
            uint16_t *h = malloc(((size_t)n + GUARD) * 2), *ref = malloc((size_t)n * 2);
            size_t allowed;
            struct diff d;
            char what[160];
            snprintf(what, sizeof what, "fill %lld, seed %#llx, tensor %#x, N(%g, %g)",
                     (long long)n, (unsigned long long)seed, tensor, (double)mean,
                     (double)std);
            CHECK(h && ref);
            CHECKF(gpu_fill(h, n, seed, tensor, mean, std, what) == 0, "%s", what);
            dg_ref_fill_normal(ref, n, seed, tensor, mean, std);
            d = compare(h, ref, (size_t)n, 1e-5f * std);
            printf("# %s: %zu differ (max %ld ulp), %zu NaN\n", what, d.differ, d.max_ulp,
                   d.nan);
            allowed = std == 0.0f ? 0 : (size_t)n / 1000 > 1 ? (size_t)n / 1000 : 1;
            CHECKF(d.nan == 0, "%s: %zu NaN", what, d.nan);
            CHECKF(d.max_ulp <= 1, "%s: %ld ulp at [%zu]: %#06x, want %#06x", what, d.max_ulp,
                   d.first, h[d.first], ref[d.first]);
            CHECKF(d.differ <= allowed, "%s: %zu differ (first [%zu]: %#06x, want %#06x)",
                   what, d.differ, d.first, h[d.first], ref[d.first]);
            if (std == 0.0f)
                for (int64_t i = 0; i < n; i++)
                    CHECKF(ref[i] == dg_f32_to_bf16(mean), "%s: ref [%lld] %#06x", what,
                           (long long)i, ref[i]);
            total += (size_t)n;
            total_differ += d.differ;
            free(h);
            free(ref);
        }
    printf("# all fills: %zu of %zu elements differ from the reference (%.2e)\n", total_differ,
           total, (double)total_differ / (double)total);
    CHECKF((double)total_differ <= 1e-3 * (double)total, "%zu of %zu differ", total_differ,
           total);
    return 0;
}

/* 3e6 N(0, 0.02): sample mean and std within 1% of std. */
static int statistics(void)
{
    const int64_t n = 3000001;
    const float mean = 0.0f, std = 0.02f;
    uint16_t *h = malloc(((size_t)n + GUARD) * 2);
    double s = 0, ss = 0, m, sd;
    size_t within1 = 0;
    CHECK(h);
    CHECK(gpu_fill(h, n, 0x9e3779b97f4a7c15ull, 11, mean, std, "statistics") == 0);
    for (int64_t i = 0; i < n; i++) {
        const double v = dg_bf16_to_f32(h[i]);
        s += v;
        ss += v * v;
        within1 += fabs(v - mean) < std;
    }
    m = s / (double)n;
    sd = sqrt(ss / (double)n - m * m);
    printf("# %lld samples of N(%g, %g): mean %.3e, std %.5e (%+.3f%%), within 1 std %.4f\n",
           (long long)n, (double)mean, (double)std, m, sd, 100.0 * (sd - std) / std,
           (double)within1 / (double)n);
    CHECKF(fabs(m - mean) <= 0.01 * std, "mean %.3e", m);
    CHECKF(fabs(sd - std) <= 0.01 * std, "std %.5e", sd);
    /* (0.6827 for a normal; its standard error here is 2.7e-4) */
    CHECKF(fabs((double)within1 / (double)n - 0.6827) < 0.005, "within 1 std: %.4f",
           (double)within1 / (double)n);
    free(h);
    return 0;
}

/* Element i depends only on (seed, tensor, i): the first 1000 of a fill of
 * 65537 are those of a fill of 1000; the first 999 those of 1000 too (an odd
 * n cuts a pair). */
static int independent_of_n(void)
{
    const uint64_t seed = 0x5eed5eed12345678ull;
    const uint32_t tensor = 1234567;
    uint16_t *a = malloc((65537 + GUARD) * 2), *b = malloc((1000 + GUARD) * 2),
             *c = malloc((999 + GUARD) * 2);
    size_t ab = 0, bc = 0;
    CHECK(a && b && c);
    CHECK(gpu_fill(a, 65537, seed, tensor, 0.0f, 0.02f, "fill 65537") == 0);
    CHECK(gpu_fill(b, 1000, seed, tensor, 0.0f, 0.02f, "fill 1000") == 0);
    CHECK(gpu_fill(c, 999, seed, tensor, 0.0f, 0.02f, "fill 999") == 0);
    for (int i = 0; i < 1000; i++)
        ab += a[i] != b[i];
    for (int i = 0; i < 999; i++)
        bc += b[i] != c[i];
    printf("# first 1000 of fills of 65537 and 1000: %zu differ; first 999 of 1000 and 999: "
           "%zu differ\n",
           ab, bc);
    CHECK(ab == 0 && bc == 0);
    free(a);
    free(b);
    free(c);
    return 0;
}

/* Neighbouring tensors, and seeds differing in one bit of either word, give
 * other streams: few equal elements (two independent N(0, 1) agree in bf16
 * about 0.1% of the time). */
static int streams_differ(void)
{
    enum { N = 65537 };
    static const struct {
        uint64_t seed;
        uint32_t tensor;
    } other[] = {{7, 101}, {7, 99}, {7 ^ (1ull << 32), 100}, {6, 100}};
    uint16_t *a = malloc((N + GUARD) * 2), *b = malloc((N + GUARD) * 2);
    CHECK(a && b);
    CHECK(gpu_fill(a, N, 7, 100, 0.0f, 1.0f, "seed 7, tensor 100") == 0);
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++) {
        size_t same = 0;
        CHECK(gpu_fill(b, N, other[k].seed, other[k].tensor, 0.0f, 1.0f, "other") == 0);
        for (int i = 0; i < N; i++)
            same += a[i] == b[i];
        printf("# seed %#llx, tensor %u against seed 7, tensor 100: %zu of %d equal\n",
               (unsigned long long)other[k].seed, other[k].tensor, same, N);
        CHECKF(same < N / 100, "%zu equal", same);
    }
    free(a);
    free(b);
    return 0;
}

/* Indices past 2^33 (pairs past 2^32: the counter's high word is 1): the
 * last HEAD values written (no poison left, the guard intact) and unlike
 * the first HEAD (which they would repeat were the high word lost).  Needs
 * 16 GiB of device memory; skipped without.  Last of the cases: a failed
 * allocation leaves CUDA's last error set. */
static int past_2_33(void)
{
    enum { HEAD = 4096 };
    const int64_t n = ((int64_t)1 << 33) + HEAD;
    struct dg_error err = {0};
    uint16_t *head = malloc(HEAD * 2), *tail = malloc((HEAD + GUARD) * 2), *d;
    size_t same = 0, nan = 0;
    double s = 0, ss = 0, m, sd;
    CHECK(head && tail);
    d = out_buf((size_t)n, &err);
    if (!d) {
        printf("# fill of 2^33 + %d: %s\n", HEAD, err.msg);
        free(head);
        free(tail);
        return test_skip("no 16 GiB of device memory");
    }
    CHECK_OK(dg_cuda_fill_normal(d, n, 99, 5, 0.0f, 1.0f, NULL, 0, &err), &err);
    CHECK(dg_cuda_sync(0, &err) == 0 && dg_cuda_download(head, d, HEAD * 2, 0, &err) == 0);
    CHECK(fetch(tail, d + (n - HEAD), HEAD, "fill of 2^33 + 4096, tail") == 0);
    dg_cuda_free(d);
    for (int i = 0; i < HEAD; i++) {
        const double v = dg_bf16_to_f32(tail[i]);
        nan += is_nan(tail[i]) || is_nan(head[i]);
        same += head[i] == tail[i];
        s += v;
        ss += v * v;
    }
    m = s / HEAD;
    sd = sqrt(ss / HEAD - m * m);
    printf("# fill of 2^33 + %d: last %d: %zu NaN, %zu equal to the first %d, mean %.3f, std "
           "%.3f\n",
           HEAD, HEAD, nan, same, HEAD, m, sd);
    CHECK(nan == 0);
    CHECKF(same < HEAD / 100, "%zu equal", same);
    CHECKF(fabs(m) < 0.1 && fabs(sd - 1.0) < 0.1, "mean %.3f std %.3f", m, sd);
    free(head);
    free(tail);
    return 0;
}

/* Bad arguments are refused before a launch, with the GPU named; n = 0 is
 * not an error. */
static int refusals(void)
{
    struct dg_error err = {0};
    uint16_t *d = out_buf(8, &err);
    uint16_t h[8 + GUARD];
    CHECKF(d != NULL, "%s", err.msg);
    CHECK_FAILS(dg_cuda_fill_normal(d, -1, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err, DG_E_INVAL,
                "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal(NULL, 8, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err, DG_E_INVAL,
                "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal(d, 8, 0, 0, 0.0f, NAN, NULL, 0, &err), &err, DG_E_INVAL,
                "fill_normal");
    CHECK_FAILS(dg_cuda_fill_normal(d, 8, 0, 0, INFINITY, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal");
    CHECK_FAILS(dg_cuda_fill_normal(d, 8, 0, 0, 0.0f, -1.0f, NULL, 0, &err), &err, DG_E_INVAL,
                "fill_normal");
    CHECK_OK(dg_cuda_fill_normal(NULL, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_fill_normal(d, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err);
    /* nothing was written: the poison is still there */
    CHECK(fetch(h, d, 8, "refusals") == 0);
    for (int i = 0; i < 8; i++)
        CHECKF(h[i] == 0xffffu, "[%d] = %#06x", i, h[i]);
    dg_cuda_free(d);
    return 0;
}

/* Rectangular slices (a tensor-parallel rank's part of a global tensor):
 * dg_cuda_fill_normal_rect of (rows, cols, ld, first) against (a)
 * dg_ref_fill_normal_rect, by the same ulp rules as matches_reference, and
 * (b) bit for bit the elements first + r ld + c of dg_cuda_fill_normal of
 * the whole tensor.  Shapes: one row from 0 (the 1-D fill), one element,
 * one row with ld 0, cols == ld, odd first and odd ld, one column, a
 * column slice and a row slice of matrix x of a bank (first = x R C + ...),
 * and one past a grid's worth of outputs. */
static int rect_matches(void)
{
    static const struct {
        int64_t rows, cols, ld, first;
    } SHAPES[] = {
        {1, 65537, 65537, 0},
        {1, 1, 1, 0},
        {1, 1000, 0, 7},
        {7, 13, 13, 0},
        {5, 9, 21, 3},
        {6, 8, 30, 11},
        {40, 1, 17, 1},
        {48, 32, 96, 3 * 48 * 96 + 33}, /* columns 33..64 of matrix 3 of 48 x 96 */
        {16, 96, 96, 2 * 48 * 96 + 16 * 96}, /* rows 16..31 of matrix 2 */
        {1100, 1000, 1001, 12345},           /* 1.1e6 outputs: past 4096 x 256 */
    };
    size_t total = 0, total_differ = 0;
    for (size_t p = 0; p < sizeof PARAMS / sizeof PARAMS[0]; p++)
        for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++) {
            const int64_t R = SHAPES[k].rows, C = SHAPES[k].cols, ld = SHAPES[k].ld,
                          f = SHAPES[k].first;
            const int64_t n = R * C, whole_n = f + (R - 1) * ld + C + 1;
            const uint64_t seed = PARAMS[p].seed;
            const uint32_t tensor = PARAMS[p].tensor;
            const float mean = PARAMS[p].mean, std = PARAMS[p].std;
            uint16_t *h = malloc(((size_t)n + GUARD) * 2), *ref = malloc((size_t)n * 2),
                     *whole = malloc(((size_t)whole_n + GUARD) * 2);
            size_t allowed, bitwise = 0, first_bitwise = 0;
            struct diff d;
            char what[200];
            snprintf(what, sizeof what,
                     "rect %lld x %lld (ld %lld, first %lld), seed %#llx, tensor %#x, N(%g, %g)",
                     (long long)R, (long long)C, (long long)ld, (long long)f,
                     (unsigned long long)seed, tensor, (double)mean, (double)std);
            CHECK(h && ref && whole);
            CHECKF(gpu_fill_rect(h, R, C, ld, f, seed, tensor, mean, std, what) == 0, "%s",
                   what);
            CHECKF(gpu_fill(whole, whole_n, seed, tensor, mean, std, what) == 0, "%s", what);
            dg_ref_fill_normal_rect(ref, R, C, ld, f, seed, tensor, mean, std);
            /* (a) the reference */
            d = compare(h, ref, (size_t)n, 1e-5f * std);
            allowed = std == 0.0f ? 0 : (size_t)n / 1000 > 1 ? (size_t)n / 1000 : 1;
            CHECKF(d.nan == 0, "%s: %zu NaN", what, d.nan);
            CHECKF(d.max_ulp <= 1, "%s: %ld ulp at [%zu]: %#06x, want %#06x", what, d.max_ulp,
                   d.first, h[d.first], ref[d.first]);
            CHECKF(d.differ <= allowed, "%s: %zu differ (first [%zu]: %#06x, want %#06x)",
                   what, d.differ, d.first, h[d.first], ref[d.first]);
            /* (b) the 1-D fill of the whole tensor, bit for bit */
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    if (h[r * C + c] != whole[f + r * ld + c] && !bitwise++)
                        first_bitwise = (size_t)(r * C + c);
            printf("# %s: %zu differ from the reference (max %ld ulp), %zu from the 1-D fill\n",
                   what, d.differ, d.max_ulp, bitwise);
            CHECKF(bitwise == 0, "%s: %zu differ from the 1-D fill (first [%zu]: %#06x)", what,
                   bitwise, first_bitwise, h[first_bitwise]);
            total += (size_t)n;
            total_differ += d.differ;
            free(h);
            free(ref);
            free(whole);
        }
    printf("# all slices: %zu of %zu elements differ from the reference (%.2e)\n",
           total_differ, total, (double)total_differ / (double)total);
    CHECKF((double)total_differ <= 1e-3 * (double)total, "%zu of %zu differ", total_differ,
           total);
    return 0;
}

/* Bad slices are refused before a launch, with the GPU named; an empty one
 * is not an error. */
static int rect_refusals(void)
{
    struct dg_error err = {0};
    uint16_t *d = out_buf(8, &err);
    uint16_t h[8 + GUARD];
    CHECKF(d != NULL, "%s", err.msg);
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, -1, 4, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, -4, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, -4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal_rect");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, 4, -1, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal_rect");
    /* negative sizes are refused even when the slice would be empty */
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, -1, 0, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal_rect");
    /* rows overlapping: cols > ld with more than one row */
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, 3, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal_rect(NULL, 2, 4, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "GPU 0");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, 4, 0, 0, 0, 0.0f, NAN, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal_rect");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, 4, 0, 0, 0, INFINITY, 1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "fill_normal_rect");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 4, 4, 0, 0, 0, 0.0f, -1.0f, NULL, 0, &err), &err,
                DG_E_INVAL, "fill_normal_rect");
    /* a last index past INT64_MAX */
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 2, 1, INT64_MAX, 1, 0, 0, 0.0f, 1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "fill_normal_rect");
    CHECK_FAILS(dg_cuda_fill_normal_rect(d, 1, 2, 2, INT64_MAX, 0, 0, 0.0f, 1.0f, NULL, 0, &err),
                &err, DG_E_INVAL, "fill_normal_rect");
    CHECK_OK(dg_cuda_fill_normal_rect(NULL, 0, 4, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_fill_normal_rect(NULL, 4, 0, 4, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_fill_normal_rect(d, 0, 0, 0, 0, 0, 0, 0.0f, 1.0f, NULL, 0, &err), &err);
    /* nothing was written: the poison is still there */
    CHECK(fetch(h, d, 8, "rect refusals") == 0);
    for (int i = 0; i < 8; i++)
        CHECKF(h[i] == 0xffffu, "[%d] = %#06x", i, h[i]);
    dg_cuda_free(d);
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-fill");
    if (rc)
        return rc;
    TEST_CASE(matches_reference);
    TEST_CASE(statistics);
    TEST_CASE(independent_of_n);
    TEST_CASE(streams_differ);
    TEST_CASE(refusals);
    TEST_CASE(rect_matches);
    TEST_CASE(rect_refusals);
    TEST_CASE(past_2_33);
    return test_finish();
}
