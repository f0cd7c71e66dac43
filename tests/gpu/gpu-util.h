/*
 * gpu-util.h - what the GPU tests share: a seeded generator, random bf16
 * or fp32 data with its float values, uploads, poisoned and guarded
 * outputs, the start of main() (exit 77 where there is no GPU, else
 * GPU 0 selected), the relative error of logits, and four requests
 * through the engine on a backend with their outcomes compared.
 */
#ifndef DG_TEST_GPU_UTIL_H
#define DG_TEST_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "lib/backend.h"
#include "lib/checkpoint.h"
#include "lib/engine.h"
#include "lib/error.h"
#include "lib/model-weights.h"

/* The generator (a 64-bit LCG, high bits): seed, next 48 bits, a float
 * uniform on [-1, 1). */
void gt_seed(uint64_t seed);
uint64_t gt_next(void);
float gt_uniform(void);

/* n random token ids in [3, V) (past the special ids), drawn after
 * gt_seed(seed). */
void gt_rand_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed);

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

/* ||got - ref|| / ||ref|| over rows x cols (INFINITY if got holds a NaN
 * or an infinity), and in *agree the rows whose argmax is the same. */
double gt_rel_err(const float *got, const float *ref, int64_t rows, int64_t cols,
                  int64_t *agree);

/* ---- requests through the engine ------------------------------------------ */

#define GT_NREQ 4
#define GT_MAX_OUT 1024

struct gt_outcome {
    uint64_t id;
    int32_t ids[GT_MAX_OUT];
    int n, done;
    enum dg_finish finish;
};

struct gt_sink {
    struct gt_outcome out[GT_NREQ];
    int n;
};

/* The engine's event callback for a struct gt_sink (ctx): each request's
 * committed ids, and its finish. */
void gt_on_event(void *ctx, const struct dg_gen_event *ev);

/* Requests first .. first+n-1 (request r: plen[r] prompt ids drawn with
 * gt_seed(1000 + r), sampling seed 42 + r, max_tokens, at most steps
 * denoising steps a canvas) in one engine (max_batch GT_NREQ, prefill
 * chunks of 64, context 512) on backend b, which is destroyed at the end;
 * outcomes into sink.  0, or 1 with the failure printed (a request that
 * did not finish, or finished with an error, is one). */
int gt_generate(struct dg_backend *b, const struct dg_checkpoint *ck, const struct dg_model *m,
                const int *plen, int first, int n, int max_tokens, int steps,
                struct gt_sink *sink);

/* gt_generate with each request's settings passed through adjust (NULL:
 * as they are) before it is submitted. */
int gt_generate_with(struct dg_backend *b, const struct dg_checkpoint *ck,
                     const struct dg_model *m, const int *plen, int first, int n, int max_tokens,
                     int steps, void (*adjust)(struct dg_gen_settings *), struct gt_sink *sink);

/* Compare two sinks' first n outcomes, printing each request's verdict
 * (equal, or the first id that differs).  Returns the number that differ. */
int gt_compare(const char *what, const struct gt_sink *a, const struct gt_sink *b, int n);

#endif
