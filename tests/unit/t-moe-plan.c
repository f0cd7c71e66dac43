/*
 * Description: the experts' stage's plan (lib/moe-plan.h) against its
 * definitions: the tile rows the smallest power of two from 16 to 128 that
 * covers mean + 4 sqrt(mean); the tile bound holding for routings that
 * put every pick on the rank's experts in the runs that need the most
 * tiles; the batched tiles covering simulated even routings (top-K of the
 * model's experts, uniformly drawn) of a rank holding all, half or a
 * quarter of the experts, and exceeding what those need by no more than
 * the plan's margin (not by the other ranks' share); the split of a
 * tile's passes over blocks covering the fullest expert; refused shapes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/moe-plan.h"
#include "tests/harness.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

/* the definition of ts, checked rather than computed: a power of two in
 * 16 .. 128, at or above want unless 128, and its half below want unless 16 */
static int ts_ok(int ts, double mean)
{
    const double want = mean + 4.0 * sqrt(mean);
    if (ts != 16 && ts != 32 && ts != 64 && ts != 128)
        return 0;
    if (ts < 128 && ts < want)
        return 0;
    return ts == 16 || ts / 2 < want;
}

static int64_t tiles_of(const int32_t *counts, int n, int ts)
{
    int64_t t = 0;
    for (int j = 0; j < n; j++)
        t += (counts[j] + ts - 1) / ts;
    return t;
}

/* counts of the rank's experts e0 .. e0 + n_exp - 1 for T tokens each
 * picking K distinct experts of n_all uniformly */
static void even_routing(int32_t *counts, int64_t T, int K, int e0, int n_exp, int n_all)
{
    memset(counts, 0, sizeof(int32_t) * (size_t)n_exp);
    for (int64_t t = 0; t < T; t++) {
        int picked[16];
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(test_xorshift(&rng) % (uint64_t)n_all);
                dup = 0;
                for (int i = 0; i < k; i++)
                    dup |= picked[i] == e;
            } while (dup);
            picked[k] = e;
            if (e >= e0 && e < e0 + n_exp)
                counts[e - e0]++;
        }
    }
}

static int case_tp1_shapes(void)
{
    /* the model's 128 experts, top-8, at batches of 1 .. 32 canvases of
     * 256 and odd token counts */
    static const int64_t Ts[] = {1, 7, 37, 256, 512, 1024, 4096, 8192};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        struct dg_moe_plan p;
        struct dg_error err = {0};
        const int64_t picks = Ts[i] * 8;
        CHECK_OK(dg_moe_plan_make(Ts[i], 8, 128, 128, &p, &err), &err);
        CHECKF(ts_ok(p.ts, picks / 128.0), "T %lld: ts %d", (long long)Ts[i], p.ts);
        CHECK(p.expect == picks);
        CHECK(p.tiles == (picks + p.ts - 1) / p.ts + 128);
        CHECK(p.batched <= p.tiles && p.batched >= (picks + p.ts - 1) / p.ts);
        CHECKF(p.hint == (int)((picks + 127) / 128), "T %lld: hint %d", (long long)Ts[i],
               p.hint);
    }
    return 0;
}

/* Every pick on the rank's experts, in the runs needing the most tiles:
 * each expert's count one past a multiple of ts where the picks allow it.
 * The tile bound must hold; the layout sized by it must hold the rows. */
static int case_bound_holds_for_any_routing(void)
{
    static const struct {
        int64_t T;
        int K, n_exp, n_all;
    } shapes[] = {{256, 8, 128, 128}, {256, 8, 64, 128}, {4096, 8, 64, 128}, {8192, 8, 32, 128},
                  {37, 2, 3, 8},      {1024, 8, 32, 64}, {1, 8, 16, 16},     {50, 1, 2, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        struct dg_moe_plan p;
        struct dg_error err = {0};
        const int n = shapes[s].n_exp;
        int32_t *c = calloc((size_t)n, sizeof *c);
        int64_t left = shapes[s].T * shapes[s].K;
        CHECK(c);
        CHECK_OK(dg_moe_plan_make(shapes[s].T, shapes[s].K, n, shapes[s].n_all, &p, &err), &err);
        /* worst case: one row past a tile boundary for as many experts as
         * the picks can feed, the rest on the last */
        for (int j = 0; j < n && left > 0; j++) {
            const int64_t want = (j + 1 < n ? (int64_t)p.ts + 1 : left);
            c[j] = (int32_t)(want < left ? want : left);
            left -= c[j];
        }
        c[n - 1] += (int32_t)left;
        CHECKF(tiles_of(c, n, p.ts) <= p.tiles, "shape %zu: %lld tiles past the bound %lld", s,
               (long long)tiles_of(c, n, p.ts), (long long)p.tiles);
        /* all on one expert */
        memset(c, 0, sizeof(int32_t) * (size_t)n);
        c[0] = (int32_t)(shapes[s].T * shapes[s].K);
        CHECK(tiles_of(c, n, p.ts) <= p.tiles);
        free(c);
    }
    return 0;
}

/* A rank of 1, 2 and 4 holding its share of the model's 128 experts
 * (top-8) at batches of 1, 4, 16 and 32 canvases of 256 tokens: over
 * even routings the tiles needed stay within the batched count (the rest
 * would go to the one launch), and the batched count exceeds the mean
 * need by about the margin, 2 sqrt(n_exp) tiles, never by the other
 * ranks' share of the picks; the hint is the mean rows an expert. */
static int case_batched_fits_even_routing(void)
{
    static const int ranks[] = {1, 2, 4};
    static const int64_t Ts[] = {256, 1024, 4096, 8192};
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            const int n_exp = 128 / ranks[r], e0 = 128 - n_exp; /* the last rank's */
            const int trials = 20;
            struct dg_moe_plan p;
            struct dg_error err = {0};
            int32_t c[128];
            double need = 0, rows = 0;
            int over = 0;
            CHECK_OK(dg_moe_plan_make(Ts[i], 8, n_exp, 128, &p, &err), &err);
            for (int t = 0; t < trials; t++) {
                int64_t got;
                even_routing(c, Ts[i], 8, e0, n_exp, 128);
                got = tiles_of(c, n_exp, p.ts);
                over += got > p.batched;
                need += (double)got / trials;
                for (int j = 0; j < n_exp; j++)
                    rows += (double)c[j] / trials / n_exp;
            }
            printf("# tp %d, %lld tokens: ts %d, batched %lld, tiles needed %.1f on average, "
                   "bound %lld; hint %d, rows an expert %.1f\n",
                   ranks[r], (long long)Ts[i], p.ts, (long long)p.batched, need,
                   (long long)p.tiles, p.hint, rows);
            CHECKF(over == 0, "tp %d, T %lld: %d of %d routings past the batched %lld tiles",
                   ranks[r], (long long)Ts[i], over, trials, (long long)p.batched);
            CHECKF(p.batched - need <= 3.0 * sqrt((double)n_exp) + 2.0,
                   "tp %d, T %lld: batched %lld tiles where %.1f are needed", ranks[r],
                   (long long)Ts[i], (long long)p.batched, need);
            CHECKF(fabs(p.hint - rows) <= 1.0, "tp %d, T %lld: hint %d, %.2f rows an expert",
                   ranks[r], (long long)Ts[i], p.hint, rows);
            CHECKF(ts_ok(p.ts, Ts[i] * 8 / 128.0), "tp %d, T %lld: ts %d", ranks[r],
                   (long long)Ts[i], p.ts);
        }
    return 0;
}

/* The split of a tile's passes: nz NT rows cover the fullest expert's
 * rows (mean + 4 sqrt(mean)) and nz - 1 do not, at most DG_MOE_SPLIT_MAX
 * and within 2^31 - 1 tickets; 1 where nothing needs a second pass. */
static int case_split(void)
{
    static const int hints[] = {1, 16, 17, 24, 64, 87, 90, 91, 128, 256, 512, 4096, 100000};
    static const int NTs[] = {32, 64, 128};
    for (size_t h = 0; h < sizeof hints / sizeof hints[0]; h++)
        for (size_t n = 0; n < sizeof NTs / sizeof NTs[0]; n++) {
            const int hint = hints[h], NT = NTs[n];
            const double most = hint + 4.0 * sqrt((double)hint);
            const int nz = dg_moe_plan_split(hint, NT, 8448);
            CHECKF(nz >= 1 && nz <= DG_MOE_SPLIT_MAX, "hint %d, NT %d: nz %d", hint, NT, nz);
            CHECKF(nz == DG_MOE_SPLIT_MAX || (double)nz * NT >= most,
                   "hint %d, NT %d: %d blocks of %d rows short of %.1f", hint, NT, nz, NT, most);
            CHECKF(nz == 1 || (double)(nz - 1) * NT < most, "hint %d, NT %d: %d blocks, one spare",
                   hint, NT, nz);
        }
    /* the batch sizes' hints on the FP8 kernel's passes: batch 1 one
     * block, batch 4 (64 rows an expert, passes of 64) two, batch 8 three */
    CHECK(dg_moe_plan_split(16, 32, 8448) == 1);
    CHECK(dg_moe_plan_split(64, 64, 4224) == 2);
    CHECK(dg_moe_plan_split(128, 64, 4224) == 3);
    /* tickets: tiles nz stays within int */
    CHECK((int64_t)dg_moe_plan_split(512, 32, 0x7fffffff / 10) * (0x7fffffff / 10) <=
          0x7fffffff);
    CHECK(dg_moe_plan_split(512, 32, 0x7fffffff) == 1);
    CHECK(dg_moe_plan_split(512, 0, 100) == 1 && dg_moe_plan_split(0, 32, 100) == 1 &&
          dg_moe_plan_split(-5, 32, 100) == 1 && dg_moe_plan_split(512, 32, 0) == 1);
    return 0;
}

static int case_refused(void)
{
    struct dg_moe_plan p;
    struct dg_error err = {0};
    CHECK_FAILS(dg_moe_plan_make(0, 8, 128, 128, &p, &err), &err, DG_E_INVAL, "0 tokens");
    CHECK_FAILS(dg_moe_plan_make(4, 0, 128, 128, &p, &err), &err, DG_E_INVAL, "top-0");
    CHECK_FAILS(dg_moe_plan_make(4, 8, 0, 128, &p, &err), &err, DG_E_INVAL, "0 of 128");
    CHECK_FAILS(dg_moe_plan_make(4, 8, 64, 32, &p, &err), &err, DG_E_INVAL, "64 of 32");
    CHECK_FAILS(dg_moe_plan_make(4, 8, 1025, 2048, &p, &err), &err, DG_E_INVAL, "1025 of 2048");
    CHECK_FAILS(dg_moe_plan_make((int64_t)1 << 28, 8, 128, 128, &p, &err), &err, DG_E_INVAL,
                "268435456 tokens");
    /* the largest accepted: T K = 2^31 - 1 */
    CHECK_OK(dg_moe_plan_make(0x7fffffff, 1, 1024, 1024, &p, &err), &err);
    CHECK(p.tiles > 0 && p.batched <= p.tiles && p.hint > 0);
    return 0;
}

int main(void)
{
    TEST_CASE(case_tp1_shapes);
    TEST_CASE(case_bound_holds_for_any_routing);
    TEST_CASE(case_batched_fits_even_routing);
    TEST_CASE(case_split);
    TEST_CASE(case_refused);
    return test_finish();
}
