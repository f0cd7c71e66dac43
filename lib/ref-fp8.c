/* ref-fp8.c - E4M3 rounding, per-row FP8 quantization and the W8A8 linear
 * reference (see fp8.h for the format and the math). */
#include "lib/fp8.h"

uint8_t dg_f32_to_e4m3(float f)
{
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    int ex;
    float q;

    if (isnan(f))
        return sign | 0x7f;
    if (a >= DG_E4M3_MAX)
        return sign | 0x7e;
    if (a < 0x1p-6f) {
        /* subnormal steps of 2^-9 (exact scaling); 8 steps is the smallest
         * normal, whose code is 0x08 too */
        q = nearbyintf(a * 512.0f);
        return sign | (uint8_t)q;
    }
    (void)frexpf(a, &ex); /* a in [2^(ex-1), 2^ex) */
    /* the mantissa with its leading 1 as 8..16, rounded to nearest even */
    q = nearbyintf(ldexpf(a, 4 - ex));
    if (q == 16.0f) {
        q = 8.0f;
        ex++;
    }
    /* biased exponent ex - 1 + 7 is at most 15 here, and 0x7f cannot come
     * out: a < 448 rounds to at most 448 (0x7e) */
    return sign | (uint8_t)(((ex + 6) << 3) | ((int)q - 8));
}

/* A row's scale: max |x| / 448 but at least FLT_MIN (a row of tiny values
 * would have a scale of 0 else, and its codes be NaN), 1 for a row of
 * zeros, NaN if any is NaN. */
static float row_scale(const float *xr, size_t cols)
{
    float amax = 0;
    for (size_t i = 0; i < cols; i++) {
        const float a = fabsf(xr[i]);
        if (isnan(a))
            return NAN;
        if (a > amax)
            amax = a;
    }
    return amax > 0 ? fmaxf(amax / DG_E4M3_MAX, FLT_MIN) : 1.0f;
}

void dg_fp8_quantize_rows(const float *x, size_t rows, size_t cols, size_t ld, uint8_t *q,
                          float *scale)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld;
        const float s = row_scale(xr, cols);
        scale[r] = s;
        for (size_t i = 0; i < cols; i++)
            q[r * cols + i] = dg_f32_to_e4m3(xr[i] / s);
    }
}

void dg_fp8_fake_quant_rows(float *y, const float *x, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        const float s = row_scale(xr, cols);
        for (size_t i = 0; i < cols; i++)
            yr[i] = dg_e4m3_to_f32(dg_f32_to_e4m3(xr[i] / s)) * s;
    }
}

void dg_ref_fp8_linear(float *y, const uint8_t *qa, const float *sa, const uint8_t *qw,
                       const float *sw, size_t T, size_t N, size_t K)
{
    /* the 256 codes' values, decoded once a call (dg_e4m3_to_f32 per
     * element made this loop 30 ns a product; the values are the same) */
    float val[256];
    for (int b = 0; b < 256; b++)
        val[b] = dg_e4m3_to_f32((uint8_t)b);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < N; n++) {
            const uint8_t *a = qa + t * K, *w = qw + n * K;
            double acc = 0;
            for (size_t k = 0; k < K; k++)
                acc += (double)val[a[k]] * val[w[k]];
            y[t * N + n] = (float)((double)sa[t] * sw[n] * acc);
        }
}
