/*
 * bench-util.h - what the GPU benchmarks share: a monotonic clock in
 * milliseconds, the median of a sample (sorted in place; NaN for none),
 * the xorshift ids they feed the model (and distinct ones, as a router's
 * top-k), and random E4M3 bytes.
 */
#ifndef DG_BENCH_UTIL_H
#define DG_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline int bench_cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double bench_median(double *v, int n)
{
    if (n < 1)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* a pseudo-random id in [0, V) from the state *s (xorshift64) */
static inline int32_t bench_rand_id(uint64_t *s, int64_t V)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (int32_t)(*s % (uint64_t)V);
}

/* k distinct ids of [0, V) from *s into out, uniformly (k <= V): a
 * token's top-k experts under even routing */
static inline void bench_distinct_ids(uint64_t *s, int32_t *out, int k, int64_t V)
{
    for (int i = 0; i < k; i++) {
        int dup;
        do {
            out[i] = bench_rand_id(s, V);
            dup = 0;
            for (int j = 0; j < i; j++)
                dup |= out[j] == out[i];
        } while (dup);
    }
}

/* n random bytes from *s that are finite E4M3 numbers (not 0x7f / 0xff) */
static inline void bench_fill_e4m3(uint64_t *s, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)bench_rand_id(s, 256);
        p[i] = (b & 0x7f) == 0x7f ? 0x38 : b;
    }
}

#endif
