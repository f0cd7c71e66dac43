/*
 * Description: dtype names and sizes; bf16 and f16 conversions against
 * references computed independently in double precision, over every 16-bit
 * pattern and over random floats.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "lib/dtype.h"
#include "tests/harness.h"

static int case_names_round_trip(void)
{
    for (int t = 1; t < DG_DTYPE_COUNT; t++) {
        const char *n = dg_dtype_name((enum dg_dtype)t);
        CHECKF(dg_dtype_parse(n) == (enum dg_dtype)t, "%s does not parse back", n);
        CHECKF(dg_dtype_size((enum dg_dtype)t) > 0, "%s has size 0", n);
    }
    CHECK(dg_dtype_parse("bf16") == DG_DTYPE_INVALID);   /* case matters */
    CHECK(dg_dtype_parse("F128") == DG_DTYPE_INVALID);
    CHECK(dg_dtype_parse("") == DG_DTYPE_INVALID);
    CHECK(dg_dtype_size(DG_DTYPE_BF16) == 2 && dg_dtype_size(DG_DTYPE_F32) == 4 &&
          dg_dtype_size(DG_DTYPE_F8_E4M3) == 1 && dg_dtype_size(DG_DTYPE_I64) == 8);
    CHECK(dg_dtype_size(DG_DTYPE_INVALID) == 0 && dg_dtype_size((enum dg_dtype)999) == 0);
    CHECK(dg_dtype_is_float_weight(DG_DTYPE_BF16) && dg_dtype_is_float_weight(DG_DTYPE_F32) &&
          dg_dtype_is_float_weight(DG_DTYPE_F16) && !dg_dtype_is_float_weight(DG_DTYPE_I32) &&
          !dg_dtype_is_float_weight(DG_DTYPE_F8_E4M3));
    return 0;
}

/* reference: the value of a bf16 pattern, from its fields */
static double bf16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
    double v;
    if (exp == 0xff)
        return man ? NAN : (sign ? -INFINITY : INFINITY);
    v = exp ? ldexp(128 + man, exp - 127 - 7) : ldexp(man, -126 - 7);
    return sign ? -v : v;
}

static double f16_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        return man ? NAN : (sign ? -INFINITY : INFINITY);
    v = exp ? ldexp(1024 + man, exp - 15 - 10) : ldexp(man, -14 - 10);
    return sign ? -v : v;
}

static int case_bf16_every_pattern(void)
{
    for (uint32_t p = 0; p < 65536; p++) {
        double want = bf16_value((uint16_t)p);
        float got = dg_bf16_to_f32((uint16_t)p);
        if (isnan(want)) {
            CHECKF(isnan(got), "pattern %04x should be NaN", p);
            CHECKF(isnan(dg_bf16_to_f32(dg_f32_to_bf16(got))), "NaN %04x lost", p);
            continue;
        }
        CHECKF((double)got == want && !signbit(got) == !signbit(want), "pattern %04x: %g vs %g", p,
               (double)got, want);
        CHECKF(dg_f32_to_bf16(got) == p, "pattern %04x does not round-trip", p);
    }
    return 0;
}

/* round-to-nearest-even to bf16, by comparing the two neighbours in double */
static uint16_t bf16_rne_ref(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dl = fabs(bf16_value(lo) - (double)f), dh = fabs(bf16_value(hi) - (double)f);
    if (isinf(bf16_value(hi)) && !isinf((double)f)) {
        /* overflow boundary: RNE rounds to inf past the halfway point */
        double max = bf16_value(0x7f7f), half = ldexp(1.0, 127) * (2.0 - ldexp(1.0, -8));
        if (fabs((double)f) >= half && fabs((double)f) > max)
            return hi;
        return lo;
    }
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1) ? hi : lo;
}

static int case_f32_to_bf16_rounding(void)
{
    uint64_t s = 0x1234567;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u;
        float f;
        test_xorshift(&s);
        u = (uint32_t)(s >> 32);
        if (i % 3 == 0) /* many exact halfway cases */
            u = (u & 0xffff0000u) | 0x8000u;
        memcpy(&f, &u, 4);
        if (isnan(f) || isinf(f))
            continue;
        CHECKF(dg_f32_to_bf16(f) == bf16_rne_ref(f), "%a rounds to %04x, want %04x", (double)f,
               dg_f32_to_bf16(f), bf16_rne_ref(f));
    }
    return 0;
}

static int case_f16_every_pattern(void)
{
    for (uint32_t p = 0; p < 65536; p++) {
        double want = f16_value((uint16_t)p);
        float got = dg_f16_to_f32((uint16_t)p);
        if (isnan(want)) {
            CHECKF(isnan(got), "pattern %04x should be NaN", p);
            continue;
        }
        CHECKF((double)got == want && !signbit(got) == !signbit(want), "pattern %04x: %a vs %a", p,
               (double)got, want);
    }
    return 0;
}

/* round-to-nearest-even to f16 by comparing neighbours in double */
static uint16_t f16_rne_ref(float f)
{
    double x = fabs((double)f), best_d = INFINITY;
    uint16_t best = 0;
    /* every non-negative finite half, then infinity */
    for (uint32_t p = 0; p <= 0x7c00; p++) {
        double v = p == 0x7c00 ? ldexp(1.0, 16) : f16_value((uint16_t)p); /* inf at 65536 */
        double d = fabs(v - x);
        if (d < best_d || (d == best_d && !(p & 1))) {
            best_d = d;
            best = (uint16_t)p;
        }
    }
    return (uint16_t)(best | (signbit(f) ? 0x8000 : 0));
}

static int case_f16_every_pattern_round_trips(void)
{
    for (uint32_t p = 0; p < 65536; p++) {
        float f = dg_f16_to_f32((uint16_t)p);
        if (isnan(f)) {
            CHECKF(isnan(dg_f16_to_f32(dg_f32_to_f16(f))), "NaN %04x lost", p);
            continue;
        }
        CHECKF(dg_f32_to_f16(f) == p, "pattern %04x does not round-trip: %04x", p,
               dg_f32_to_f16(f));
    }
    return 0;
}

static int case_f32_to_f16_rounding(void)
{
    uint64_t s = 0x9e3779b9;
    for (int i = 0; i < 3000; i++) {
        float f;
        uint32_t u;
        test_xorshift(&s);
        /* exponents around the half range: 2^-27 .. 2^17 */
        u = (uint32_t)(s >> 41) | ((uint32_t)(100 + (s >> 20) % 45) << 23) |
            ((uint32_t)(s >> 63) << 31);
        if (i % 4 == 0)
            u = (u & ~0x1fffu) | 0x1000u; /* halfway between two normal halves */
        memcpy(&f, &u, 4);
        CHECKF(dg_f32_to_f16(f) == f16_rne_ref(f), "%a -> %04x, want %04x", (double)f,
               dg_f32_to_f16(f), f16_rne_ref(f));
    }
    return 0;
}

static int case_load_f32(void)
{
    float f[3] = {1.5f, -2.25f, 3e-5f};
    uint16_t b[3], h[2] = {0x3c00, 0xc000}; /* f16 1.0, -2.0 */
    for (int i = 0; i < 3; i++)
        b[i] = dg_f32_to_bf16(f[i]);
    CHECK(dg_load_f32(f, DG_DTYPE_F32, 2) == 3e-5f);
    CHECK(dg_load_f32(b, DG_DTYPE_BF16, 1) == -2.25f);
    CHECK(dg_load_f32(h, DG_DTYPE_F16, 0) == 1.0f && dg_load_f32(h, DG_DTYPE_F16, 1) == -2.0f);
    CHECK(dg_load_f32(f, DG_DTYPE_I32, 0) == 0.0f);
    return 0;
}

int main(void)
{
    TEST_CASE(case_names_round_trip);
    TEST_CASE(case_bf16_every_pattern);
    TEST_CASE(case_f32_to_bf16_rounding);
    TEST_CASE(case_f16_every_pattern);
    TEST_CASE(case_f16_every_pattern_round_trips);
    TEST_CASE(case_f32_to_f16_rounding);
    TEST_CASE(case_load_f32);
    return test_finish();
}
