/*
 * gpu-util.h - what the GPU tests share: a seeded generator, random bf16
 * or fp32 data with its float values, uploads, poisoned and guarded
 * outputs, and the start of main() (exit 77 where there is no GPU, else
 * GPU 0 selected).
 */
#ifndef DG_TEST_GPU_UTIL_H
#define DG_TEST_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

/* The generator (a 64-bit LCG, high bits): seed, next 48 bits, a float
 * uniform on [-1, 1). */
void gt_seed(uint64_t seed);
uint64_t gt_next(void);
float gt_uniform(void);

/* n random bf16 values in [-amp, amp): their bits in *h, their floats in
 * *f (both malloc'd).  0, or -1 when out of memory. */
int gt_rand_bf16(size_t n, float amp, uint16_t **h, float **f);

/* n random values of element type e in [-amp, amp): the bytes to upload
 * in *h, the floats they hold in *f (both malloc'd; bf16: as
 * gt_rand_bf16).  0, or -1 when out of memory. */
int gt_rand_elts(enum dg_elt e, size_t n, float amp, void **h, float **f);

/* A device output of bytes poisoned with 0xff (NaN in bf16 and fp32)
 * followed by guard_bytes bytes of value guard; NULL with err set on
 * failure. */
void *gt_out_alloc(size_t bytes, size_t guard_bytes, unsigned char guard,
                   struct dg_error *err);

/* A device copy of bytes of host memory (at least 1 byte allocated); NULL
 * with err set on failure. */
void *gt_upload(const void *h, size_t bytes, struct dg_error *err);

/* The start of a GPU test's main: prints "skip PROG: ..." and returns 77
 * where there is no GPU, "not ok PROG/setup" and 1 when GPU 0 cannot be
 * selected, else 0. */
int gt_setup(const char *prog);

#endif
