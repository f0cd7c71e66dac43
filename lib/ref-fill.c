/* ref-fill.c - random normal weights, the oracle of dg_cuda_fill_normal (see
 * ref-ops.h and kernels/ops.h).
 *
 * Pair j = i / 2 of the output is one Philox4x32-10 block:
 *     key     = (seed lo, seed hi)
 *     counter = (j lo, j hi, tensor, 0)
 *     u1 = unit(out[0]), u2 = unit(out[1])       (dg_rand_unit: open (0, 1))
 *     r  = sqrtf(-2 logf(u1)),  t = 2 pi u2
 *     y[2j]   = bf16(mean + std * (r cosf(t)))
 *     y[2j+1] = bf16(mean + std * (r sinf(t)))
 * every operation one fp32 rounding, in this order (kernels/fill.cu does the
 * same with contraction off), bf16 by round to nearest even.  std == 0
 * writes bf16(mean) itself (mean + 0 * N would turn a -0 mean into +0).
 *
 * dg_ref_fill_normal_rect gives the elements first + r ld + c (r < rows,
 * c < cols) of the same stream, packed: each one its pair's even or odd
 * value, computed by the same function, so exactly the 1-D fill's. */
#include <math.h>
#include <stdint.h>

#include "lib/dtype.h"
#include "lib/philox.h"
#include "lib/ref-ops.h"

#define FILL_TWO_PI 6.28318530717958647692f

/* Pair j's two values, bf16 bits: b[0] = element 2j, b[1] = element 2j + 1
 * (the one place the maths is written; std == 0: bf16(mean) for both). */
static void fill_pair(uint16_t b[2], int64_t j, uint64_t seed, uint32_t tensor, float mean,
                      float std)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint64_t uj = (uint64_t)j;
    const uint32_t ctr[4] = {(uint32_t)uj, (uint32_t)(uj >> 32), tensor, 0};
    uint32_t out[4];
    float u1, u2, r, t, n0, n1;
    if (std == 0.0f) {
        b[0] = b[1] = dg_f32_to_bf16(mean);
        return;
    }
    dg_philox4x32_10(ctr, key, out);
    u1 = dg_rand_unit(out[0]);
    u2 = dg_rand_unit(out[1]);
    r = sqrtf(-2.0f * logf(u1));
    t = FILL_TWO_PI * u2;
    n0 = r * cosf(t);
    n1 = r * sinf(t);
    b[0] = dg_f32_to_bf16(mean + std * n0);
    b[1] = dg_f32_to_bf16(mean + std * n1);
}

/* Element i of the stream: its pair's even or odd value. */
static uint16_t fill_element(int64_t i, uint64_t seed, uint32_t tensor, float mean, float std)
{
    uint16_t b[2];
    fill_pair(b, i / 2, seed, tensor, mean, std);
    return b[i & 1];
}

void dg_ref_fill_normal(uint16_t *y, int64_t n, uint64_t seed, uint32_t tensor, float mean,
                        float std)
{
    for (int64_t j = 0; 2 * j < n; j++) {
        uint16_t b[2];
        fill_pair(b, j, seed, tensor, mean, std);
        y[2 * j] = b[0];
        if (2 * j + 1 < n)
            y[2 * j + 1] = b[1];
    }
}

void dg_ref_fill_normal_rect(uint16_t *y, int64_t rows, int64_t cols, int64_t ld, int64_t first,
                             uint64_t seed, uint32_t tensor, float mean, float std)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = fill_element(first + r * ld + c, seed, tensor, mean, std);
}
