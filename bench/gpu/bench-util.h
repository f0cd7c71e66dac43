/*
 * bench-util.h - what the GPU benchmarks share: a monotonic clock in
 * milliseconds, the median of a sample (sorted in place; NaN for none),
 * and the xorshift ids they feed the model.
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

#endif
