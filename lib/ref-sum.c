/* ref-sum.c - a sum of 32-bit words, the oracle of dg_cuda_l2_read (see
 * ref-ops.h and kernels/ops.h):
 *     S = times * (w[0] + w[1] + ... + w[n - 1])   (mod 2^32)
 * in unsigned arithmetic, whose wrap-around is the modulus, so any order of
 * the terms gives the same S. */
#include <stdint.h>

#include "lib/ref-ops.h"

uint32_t dg_ref_word_sum(const uint32_t *w, int64_t n, uint32_t times)
{
    uint32_t s = 0;
    for (int64_t i = 0; i < n; i++)
        s += w[i];
    return s * times;
}
