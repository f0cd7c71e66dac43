/*
 * Description: Philox4x32-10 against Random123's published known-answer
 * vectors, and the draws built on it: uniform floats strictly inside (0, 1)
 * at the extremes of their input, Gumbel noise finite there, token ids in
 * range and uniform (chi-square), and streams that differ whenever any part
 * of the key (seed, canvas, step, position, purpose, vocab id) differs.
 */
#include <math.h>
#include <string.h>

#include "lib/philox.h"
#include "tests/harness.h"

static int known_answers(void)
{
    /* Random123 kat_vectors: philox4x32 10 rounds */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        dg_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            CHECKF(out[j] == kat[i].out[j], "vector %zu word %d: %08x, want %08x", i, j, out[j],
                   kat[i].out[j]);
    }
    return 0;
}

static int counter_layout(void)
{
    /* dg_rand_block is Philox of (c0, position, step | purpose << 16, canvas)
     * under key (seed lo, seed hi) */
    const uint64_t seed = 0x0123456789abcdefull;
    const uint32_t ctr[4] = {7, 11, 13u | (2u << 16), 17}, key[2] = {0x89abcdef, 0x01234567};
    uint32_t a[4], b[4];
    dg_philox4x32_10(ctr, key, a);
    dg_rand_block(seed, 7, 11, 13, 2, 17, b);
    CHECK(!memcmp(a, b, sizeof a));
    /* the Gumbel draw of vocab id v is lane v % 4 of block v / 4 */
    for (uint32_t v = 40; v < 48; v++) {
        uint32_t blk[4];
        dg_rand_block(seed, v / 4, 3, 5, DG_RAND_GUMBEL, 9, blk);
        CHECK(dg_rand_gumbel(seed, 9, 5, 3, v) == dg_gumbel(dg_rand_unit(blk[v % 4])));
    }
    return 0;
}

static int unit_interval(void)
{
    const float lo = dg_rand_unit(0), hi = dg_rand_unit(0xffffffffu);
    CHECKF(lo > 0.0f && lo < 1e-6f, "smallest uniform %g", (double)lo);
    CHECKF(hi < 1.0f && hi > 1.0f - 1e-6f, "largest uniform %.9g", (double)hi);
    CHECK(isfinite(dg_gumbel(lo)) && isfinite(dg_gumbel(hi)));
    CHECK(dg_gumbel(hi) > 10.0f && dg_gumbel(lo) < -2.0f);
    /* monotone in the bits */
    CHECK(dg_rand_unit(0x80000000u) > dg_rand_unit(0x7fffffffu));
    return 0;
}

static int below_range(void)
{
    CHECK(dg_rand_below(0xffffffffu, 0xffffffffu, 262144) == 262143);
    CHECK(dg_rand_below(0, 0, 262144) == 0);
    CHECK(dg_rand_below(0x80000000u, 0, 10) == 5);
    CHECK(dg_rand_below(0xffffffffu, 0xffffffffu, 1) == 0);
    return 0;
}

/* Pearson chi-square of counts against a uniform expectation. */
static double chi2_uniform(const long *count, int bins, long n)
{
    const double e = (double)n / bins;
    double x = 0;
    for (int i = 0; i < bins; i++)
        x += (count[i] - e) * (count[i] - e) / e;
    return x;
}

static int tokens_uniform(void)
{
    /* 13 ids, 130000 draws over positions and steps; chi-square with 12
     * degrees of freedom, critical value 32.91 at significance 0.001 */
    long count[13] = {0};
    long n = 0;
    double x;
    for (uint32_t step = 0; step < 100; step++)
        for (uint32_t pos = 0; pos < 1300; pos++) {
            const int32_t t = dg_rand_token(42, 3, step, pos, DG_RAND_RENOISE, 13);
            CHECK(t >= 0 && t < 13);
            count[t]++;
            n++;
        }
    x = chi2_uniform(count, 13, n);
    printf("# token ids: chi-square %.2f (12 dof, critical 32.91 at 0.001)\n", x);
    CHECK(x < 32.91);
    return 0;
}

static int unit_uniform(void)
{
    /* 20 bins of (0, 1), 200000 draws; 19 dof, critical 43.82 at 0.001 */
    long count[20] = {0};
    double x, mean = 0;
    for (uint32_t v = 0; v < 200000; v++) {
        uint32_t b[4];
        float u;
        dg_rand_block(7, v >> 2, 1, 2, DG_RAND_GUMBEL, 0, b);
        u = dg_rand_unit(b[v & 3]);
        count[(int)(u * 20)]++;
        mean += dg_gumbel(u);
    }
    x = chi2_uniform(count, 20, 200000);
    mean /= 200000;
    printf("# uniform: chi-square %.2f (19 dof, critical 43.82); Gumbel mean %.4f "
           "(Euler-Mascheroni 0.5772)\n", x, mean);
    CHECK(x < 43.82);
    CHECK(fabs(mean - 0.5772157) < 0.01); /* sd of the mean: 1.28 / sqrt(2e5) = 0.003 */
    return 0;
}

static int keys_separate_streams(void)
{
    const uint64_t seed = 99;
    const int32_t base = dg_rand_token(seed, 1, 2, 3, DG_RAND_INIT, 1u << 30);
    /* each variation of one key part gives a different id; a collision has
     * probability 2^-30 per pair */
    CHECK(dg_rand_token(seed + 1, 1, 2, 3, DG_RAND_INIT, 1u << 30) != base);
    CHECK(dg_rand_token(seed + (1ull << 32), 1, 2, 3, DG_RAND_INIT, 1u << 30) != base);
    CHECK(dg_rand_token(seed, 2, 2, 3, DG_RAND_INIT, 1u << 30) != base);
    CHECK(dg_rand_token(seed, 1, 3, 3, DG_RAND_INIT, 1u << 30) != base);
    CHECK(dg_rand_token(seed, 1, 2, 4, DG_RAND_INIT, 1u << 30) != base);
    CHECK(dg_rand_token(seed, 1, 2, 3, DG_RAND_RENOISE, 1u << 30) != base);
    CHECK(dg_rand_gumbel(seed, 1, 2, 3, 0) != dg_rand_gumbel(seed, 1, 2, 3, 1));
    CHECK(dg_rand_gumbel(seed, 1, 2, 3, 5) != dg_rand_gumbel(seed, 1, 2, 4, 5));
    /* and the same key gives the same draw */
    CHECK(dg_rand_token(seed, 1, 2, 3, DG_RAND_INIT, 1u << 30) == base);
    return 0;
}

int main(void)
{
    TEST_CASE(known_answers);
    TEST_CASE(counter_layout);
    TEST_CASE(unit_interval);
    TEST_CASE(below_range);
    TEST_CASE(tokens_uniform);
    TEST_CASE(unit_uniform);
    TEST_CASE(keys_separate_streams);
    return test_finish();
}
