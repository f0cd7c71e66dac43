/*
 * fp8.h - FP8 E4M3 as compressed-tensors and torch.float8_e4m3fn store it,
 * and the W8A8 quantization the FP8-dynamic checkpoints use.
 *
 * E4M3 ("fn": finite, no infinities): 1 sign bit, 4 exponent bits (bias 7),
 * 3 mantissa bits.  Exponent field e in 1..15 with mantissa m is
 * (1 + m/8) * 2^(e-7); e = 0 is subnormal, m/8 * 2^-6; S.1111.111 is NaN
 * (0x7f, 0xff).  Largest finite 448 (0x7e), smallest normal 2^-6 (0x08),
 * smallest subnormal 2^-9 (0x01).
 *
 * Rounding: to nearest, ties to the even mantissa; magnitudes above 448
 * saturate to 448 (what quantizers do by clamping to the format's max
 * before the cast); NaN stays NaN.  Error of one rounding: at most half a
 * step, so for |x| >= 2^-6 the relative error is at most 2^-4 (step 2^-3
 * relative to the leading 1), and below it the absolute error is at most
 * 2^-10.
 *
 * Quantization (symmetric, per row): s = max|x_row| / 448, at least
 * FLT_MIN = 2^-126 so that a row of tiny values keeps a scale (1 for a row
 * of zeros), q = e4m3(x / s), x ~ q * s.  Weights are quantized per output
 * channel (a row of W [N, K]), activations per token (a row of X [T, K]) at
 * run time; a linear layer is then
 *     y[t, n] = sa[t] * sw[n] * sum_k q(X)[t, k] * q(W)[n, k]
 * with the products of two E4M3 values exact in fp32 and the sum in fp32.
 */
#ifndef DG_FP8_H
#define DG_FP8_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define DG_E4M3_MAX 448.0f

/* The value of an E4M3 byte (NaN for 0x7f and 0xff). */
static inline float dg_e4m3_to_f32(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7)
        return NAN;
    v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (b & 0x80) ? -v : v;
}

/* f rounded to E4M3 (see above: nearest, ties to even, saturating). */
uint8_t dg_f32_to_e4m3(float f);

/* Quantize rows x.. (rows of cols values, row stride ld floats) to q
 * (rows x cols bytes, packed) and scale (rows floats), per row as above.
 * Non-finite inputs: a NaN anywhere in a row makes its scale NaN. */
void dg_fp8_quantize_rows(const float *x, size_t rows, size_t cols, size_t ld, uint8_t *q,
                          float *scale);

/* y = each row of x quantized as dg_fp8_quantize_rows does and
 * dequantized (q * scale): what a per-token FP8 activation carries.  rows
 * of cols packed floats; y may be x. */
void dg_fp8_fake_quant_rows(float *y, const float *x, size_t rows, size_t cols);

/* The reference W8A8 linear layer: y[t, n] = sa[t] * sw[n] *
 * sum_k e4m3(qa[t, k]) * e4m3(qw[n, k]), qa [T, K] and qw [N, K] packed,
 * the sum in double (the oracle of FP8 GEMMs), y [T, N] fp32. */
void dg_ref_fp8_linear(float *y, const uint8_t *qa, const float *sa, const uint8_t *qw,
                       const float *sw, size_t T, size_t N, size_t K);

#endif
