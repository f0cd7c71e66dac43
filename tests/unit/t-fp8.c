/*
 * t-fp8.c - FP8 E4M3 (lib/fp8.h): the decoder against the format's
 * published anchor values and its ordering, the encoder against a brute
 * force over all 254 finite values (nearest, ties to the even mantissa,
 * saturating, NaN kept), per-row quantization within the stated error
 * bound, and the W8A8 linear reference against a double product of the
 * dequantized operands at several shapes.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fp8.h"
#include "tests/harness.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next32(void)
{
    return (uint32_t)(test_xorshift(&rng) >> 16);
}

/* uniform in [-1, 1) times 2^e for e in [lo, hi] */
static float rand_wide(int lo, int hi)
{
    const float u = (float)(next32() % 2000001u) / 1000000.0f - 1.0f;
    return ldexpf(u, lo + (int)(next32() % (uint32_t)(hi - lo + 1)));
}

static int decode_anchors(void)
{
    /* values from the OCP 8-bit floating point specification (E4M3) */
    static const struct {
        uint8_t b;
        float v;
    } anchors[] = {{0x00, 0.0f},        {0x01, 0x1p-9f},  {0x07, 7 * 0x1p-9f},
                   {0x08, 0x1p-6f},     {0x38, 1.0f},     {0x39, 1.125f},
                   {0x40, 2.0f},        {0x7e, 448.0f},   {0x77, 240.0f},
                   {0xb8, -1.0f},       {0xfe, -448.0f},  {0x80, -0.0f}};
    for (size_t i = 0; i < sizeof anchors / sizeof anchors[0]; i++) {
        const float v = dg_e4m3_to_f32(anchors[i].b);
        CHECKF(v == anchors[i].v && signbit(v) == signbit(anchors[i].v), "0x%02x: %g, want %g",
               anchors[i].b, v, anchors[i].v);
    }
    CHECK(isnan(dg_e4m3_to_f32(0x7f)) && isnan(dg_e4m3_to_f32(0xff)));
    /* the positive codes are strictly increasing, the negative ones mirror them */
    for (int b = 1; b < 0x7f; b++)
        CHECKF(dg_e4m3_to_f32((uint8_t)b) > dg_e4m3_to_f32((uint8_t)(b - 1)), "code %d", b);
    for (int b = 0; b < 0x7f; b++)
        CHECK(dg_e4m3_to_f32((uint8_t)(b | 0x80)) == -dg_e4m3_to_f32((uint8_t)b));
    return 0;
}

/* The brute-force rounding: the finite code nearest to f, ties to the
 * even code (the even mantissa), beyond 448 saturated. */
static uint8_t nearest(float f)
{
    const double a = fabs((double)f);
    int best = 0;
    double bd = INFINITY;
    if (a >= 448)
        return (uint8_t)((signbit(f) ? 0x80 : 0) | 0x7e);
    for (int b = 0; b < 0x7f; b++) {
        const double d = fabs((double)dg_e4m3_to_f32((uint8_t)b) - a);
        if (d < bd || (d == bd && (b & 1) == 0)) {
            bd = d;
            best = b;
        }
    }
    return (uint8_t)((signbit(f) ? 0x80 : 0) | best);
}

static int encode_brute_force(void)
{
    /* every finite code round-trips */
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f)
            CHECKF(dg_f32_to_e4m3(dg_e4m3_to_f32((uint8_t)b)) == b, "code 0x%02x", b);
    /* midpoints between neighbours go to the even one, a hair off them to the nearer */
    for (int b = 0; b < 0x7e; b++) {
        const float lo = dg_e4m3_to_f32((uint8_t)b), hi = dg_e4m3_to_f32((uint8_t)(b + 1));
        const float mid = (float)(((double)lo + hi) / 2);
        CHECKF(dg_f32_to_e4m3(mid) == ((b & 1) ? b + 1 : b), "midpoint of 0x%02x", b);
        CHECK(dg_f32_to_e4m3(nextafterf(mid, 0)) == b);
        CHECK(dg_f32_to_e4m3(nextafterf(mid, 1000)) == b + 1);
    }
    /* random values over the whole range and past it */
    for (int i = 0; i < 200000; i++) {
        const float f = rand_wide(-14, 10);
        CHECKF(dg_f32_to_e4m3(f) == nearest(f), "%.9g: 0x%02x, want 0x%02x", f,
               dg_f32_to_e4m3(f), nearest(f));
    }
    CHECK(dg_f32_to_e4m3(INFINITY) == 0x7e && dg_f32_to_e4m3(-INFINITY) == 0xfe);
    CHECK(dg_f32_to_e4m3(1e30f) == 0x7e && dg_f32_to_e4m3(-449.0f) == 0xfe);
    CHECK((dg_f32_to_e4m3(NAN) & 0x7f) == 0x7f);
    CHECK(dg_f32_to_e4m3(1e-30f) == 0x00 && dg_f32_to_e4m3(-1e-30f) == 0x80);
    return 0;
}

static int quantize_rows(void)
{
    static const size_t shapes[][2] = {{1, 1}, {3, 17}, {8, 2816}, {5, 704}, {2, 5000}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t rows = shapes[si][0], cols = shapes[si][1], ld = cols + 3;
        float *x = malloc(rows * ld * sizeof *x), *s = malloc((rows + 1) * sizeof *s);
        uint8_t *q = malloc(rows * cols + 16);
        CHECK(x && s && q);
        for (size_t i = 0; i < rows * ld; i++)
            x[i] = rand_wide(-12, 4);
        if (rows > 2)
            for (size_t i = 0; i < cols; i++)
                x[2 * ld + i] = 0; /* a row of zeros */
        if (rows > 3) /* a row whose max / 448 is 0 in fp32: the scale stays FLT_MIN */
            for (size_t i = 0; i < cols; i++)
                x[3 * ld + i] = (i % 2 ? -1e-43f : 1e-43f) * (float)(i % 3);
        memset(q, 0xa5, rows * cols + 16);
        s[rows] = 12345.0f; /* guard */
        dg_fp8_quantize_rows(x, rows, cols, ld, q, s);
        CHECK(s[rows] == 12345.0f);
        for (size_t i = rows * cols; i < rows * cols + 16; i++)
            CHECK(q[i] == 0xa5);
        for (size_t r = 0; r < rows; r++) {
            float amax = 0;
            int hit_max = 0;
            for (size_t i = 0; i < cols; i++)
                amax = fmaxf(amax, fabsf(x[r * ld + i]));
            CHECK(amax > 0 ? s[r] == fmaxf(amax / 448.0f, FLT_MIN) : s[r] == 1.0f);
            CHECK(s[r] >= FLT_MIN && isfinite(s[r]));
            for (size_t i = 0; i < cols; i++) {
                const float v = x[r * ld + i], back = dg_e4m3_to_f32(q[r * cols + i]) * s[r];
                /* the stated bound: 2^-4 relative at or above 2^-6 * s, 2^-10 * s below */
                const float bound = fabsf(v) >= 0x1p-6f * s[r] ? 0x1p-4f * fabsf(v)
                                                               : 0x1p-10f * s[r];
                CHECKF(fabsf(back - v) <= bound * 1.0001f, "row %zu col %zu: %g -> %g", r, i, v,
                       back);
                CHECK((q[r * cols + i] & 0x7f) != 0x7f); /* no NaN code */
                hit_max |= (q[r * cols + i] & 0x7f) == 0x7e;
            }
            /* the largest element takes the top code (but where the scale
             * is held at FLT_MIN) */
            CHECK(amax == 0 || amax / 448.0f < FLT_MIN || hit_max);
        }
        free(x);
        free(s);
        free(q);
    }
    return 0;
}

static int linear_reference(void)
{
    static const size_t shapes[][3] = {{1, 1, 1}, {1, 7, 2816}, {4, 33, 704}, {9, 5, 130}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *a = malloc(T * K * sizeof *a), *w = malloc(N * K * sizeof *w);
        float *sa = malloc(T * sizeof *sa), *sw = malloc(N * sizeof *sw);
        float *y = malloc((T * N + 4) * sizeof *y);
        uint8_t *qa = malloc(T * K), *qw = malloc(N * K);
        double num = 0, den = 0, num_q = 0;
        CHECK(a && w && sa && sw && y && qa && qw);
        for (size_t i = 0; i < T * K; i++)
            a[i] = rand_wide(-6, 3);
        for (size_t i = 0; i < N * K; i++)
            w[i] = rand_wide(-9, -2);
        dg_fp8_quantize_rows(a, T, K, K, qa, sa);
        dg_fp8_quantize_rows(w, N, K, K, qw, sw);
        for (size_t i = 0; i < T * N + 4; i++)
            y[i] = NAN; /* poisoned; the last 4 are guards */
        dg_ref_fp8_linear(y, qa, sa, qw, sw, T, N, K);
        for (size_t i = T * N; i < T * N + 4; i++)
            CHECK(isnan(y[i]));
        for (size_t t = 0; t < T; t++)
            for (size_t n = 0; n < N; n++) {
                double deq = 0, full = 0;
                for (size_t k = 0; k < K; k++) {
                    deq += ((double)dg_e4m3_to_f32(qa[t * K + k]) * sa[t]) *
                           ((double)dg_e4m3_to_f32(qw[n * K + k]) * sw[n]);
                    full += (double)a[t * K + k] * w[n * K + k];
                }
                CHECK(!isnan(y[t * N + n]));
                num += (y[t * N + n] - deq) * (y[t * N + n] - deq);
                num_q += (deq - full) * (deq - full);
                den += full * full;
            }
        /* the reference is the dequantized product (fp32 rounding only) ... */
        CHECKF(sqrt(num / den) < 1e-6, "shape %zu: %g", si, sqrt(num / den));
        /* ... and W8A8 stays within its quantization error of the exact product:
         * each operand within 2^-4 relative gives well under 2 * 2^-4 in norm */
        CHECKF(sqrt(num_q / den) < 0.125, "shape %zu: quantization error %g", si,
               sqrt(num_q / den));
        printf("# fp8 linear %zux%zux%zu: reference vs dequantized %.2e, vs unquantized %.2e\n",
               T, N, K, sqrt(num / den), sqrt(num_q / den));
        free(a);
        free(w);
        free(sa);
        free(sw);
        free(y);
        free(qa);
        free(qw);
    }
    return 0;
}

int main(void)
{
    TEST_CASE(decode_anchors);
    TEST_CASE(encode_brute_force);
    TEST_CASE(quantize_rows);
    TEST_CASE(linear_reference);
    return test_finish();
}
