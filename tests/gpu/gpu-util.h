/*
 * gpu-util.h - what the GPU tests share: a seeded generator, random bf16
 * data with its float values, uploads, and the start of main() (exit 77
 * where there is no GPU, else GPU 0 selected).
 */
#ifndef DG_TEST_GPU_UTIL_H
#define DG_TEST_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

/* The generator (a 64-bit LCG, high bits): seed, next 48 bits, a float
 * uniform on [-1, 1). */
void gt_seed(uint64_t seed);
uint64_t gt_next(void);
float gt_uniform(void);

/* n random bf16 values in [-amp, amp): their bits in *h, their floats in
 * *f (both malloc'd).  0, or -1 when out of memory. */
int gt_rand_bf16(size_t n, float amp, uint16_t **h, float **f);

/* A device copy of bytes of host memory (at least 1 byte allocated); NULL
 * with err set on failure. */
void *gt_upload(const void *h, size_t bytes, struct dg_error *err);

/* The start of a GPU test's main: prints "skip PROG: ..." and returns 77
 * where there is no GPU, "not ok PROG/setup" and 1 when GPU 0 cannot be
 * selected, else 0. */
int gt_setup(const char *prog);

#endif
