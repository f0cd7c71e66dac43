/*
 * philox.h - the counter-based random numbers every sampling decision draws
 * from: Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as
 * easy as 1, 2, 3"), and the project's fixed layout of its counter.
 *
 * A draw is a pure function of (seed, canvas, step, position, vocab id or
 * purpose): no generator state, so the same request gives the same tokens
 * whatever else is in its batch, on whichever backend or GPU, at any
 * tensor-parallel degree (the rank that owns vocab id v draws v's noise).
 *
 *   key     = (seed & 0xffffffff, seed >> 32)
 *   counter = (c0, position, step | purpose << 16, canvas)
 *     purpose DG_RAND_GUMBEL:  c0 = v / 4; lane v % 4 of the output is v's
 *                              uniform, so one block serves 4 vocab ids
 *     purpose DG_RAND_INIT:    c0 = 0, step = 0: the canvas's initial ids
 *     purpose DG_RAND_RENOISE: c0 = 0: fresh ids for rejected positions
 *                              after step `step`
 * step is 0-based within the canvas, position 0-based within the canvas,
 * canvas 0-based within the request.  Steps must stay below 65536.
 *
 * The same code compiles for the GPU (kernels include this header), so the
 * CPU and CUDA streams are the same bits.
 */
#ifndef DG_PHILOX_H
#define DG_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DG_HD __host__ __device__ __forceinline__
#else
#define DG_HD static inline
#endif

enum dg_rand_purpose { DG_RAND_GUMBEL = 0, DG_RAND_INIT = 1, DG_RAND_RENOISE = 2 };

#define DG_PHILOX_M0 0xD2511F53u
#define DG_PHILOX_M1 0xCD9E8D57u
#define DG_PHILOX_W0 0x9E3779B9u
#define DG_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(ctr, key): ten rounds of
 *   (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
 * with the key bumped by (W0, W1) between rounds.  The GPU takes each
 * product's halves in 32-bit multiplies (__umulhi and the wrapping low
 * product): the same bits, without the 64-bit arithmetic the compiler
 * otherwise makes of the unrolled rounds. */
DG_HD void dg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
#ifdef __CUDA_ARCH__
        const uint32_t h0 = __umulhi(DG_PHILOX_M0, c0), l0 = DG_PHILOX_M0 * c0;
        const uint32_t h1 = __umulhi(DG_PHILOX_M1, c2), l1 = DG_PHILOX_M1 * c2;
#else
        const uint64_t p0 = (uint64_t)DG_PHILOX_M0 * c0, p1 = (uint64_t)DG_PHILOX_M1 * c2;
        const uint32_t h0 = (uint32_t)(p0 >> 32), l0 = (uint32_t)p0;
        const uint32_t h1 = (uint32_t)(p1 >> 32), l1 = (uint32_t)p1;
#endif
        const uint32_t n0 = h1 ^ c1 ^ k0, n1 = l1;
        const uint32_t n2 = h0 ^ c3 ^ k1, n3 = l0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += DG_PHILOX_W0;
        k1 += DG_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The block for (seed; c0, position, step, purpose, canvas). */
DG_HD void dg_rand_block(uint64_t seed, uint32_t c0, uint32_t position, uint32_t step,
                         uint32_t purpose, uint32_t canvas, uint32_t out[4])
{
    const uint32_t ctr[4] = {c0, position, (step & 0xffffu) | (purpose << 16), canvas};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    dg_philox4x32_10(ctr, key, out);
}

/* 32 random bits -> a float uniform on the open interval (0, 1):
 * (top 23 bits + 1/2) / 2^23, exactly representable, never 0 or 1 (24 bits
 * would round the largest value up to 1.0). */
DG_HD float dg_rand_unit(uint32_t bits)
{
    return ((float)(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

/* Standard Gumbel noise from a uniform u in (0, 1): -log(-log u). */
DG_HD float dg_gumbel(float u)
{
    return -logf(-logf(u));
}

/* 64 random bits (hi:lo) -> an integer uniform on [0, n): floor(x n / 2^64),
 * bias below n / 2^64. */
DG_HD uint32_t dg_rand_below(uint32_t hi, uint32_t lo, uint32_t n)
{
    const uint64_t lo_n = (uint64_t)lo * n, hi_n = (uint64_t)hi * n;
    return (uint32_t)((hi_n + (lo_n >> 32)) >> 32);
}

/* The Gumbel noise of vocab id v at (seed, canvas, step, position). */
DG_HD float dg_rand_gumbel(uint64_t seed, uint32_t canvas, uint32_t step, uint32_t position,
                           uint32_t v)
{
    uint32_t b[4];
    dg_rand_block(seed, v >> 2, position, step, DG_RAND_GUMBEL, canvas, b);
    return dg_gumbel(dg_rand_unit(b[v & 3]));
}

/* A token id uniform on [0, vocab) for (seed, canvas, step, position,
 * purpose INIT or RENOISE). */
DG_HD int32_t dg_rand_token(uint64_t seed, uint32_t canvas, uint32_t step, uint32_t position,
                            uint32_t purpose, uint32_t vocab)
{
    uint32_t b[4];
    dg_rand_block(seed, 0, position, step, purpose, canvas, b);
    return (int32_t)dg_rand_below(b[0], b[1], vocab);
}

#endif
