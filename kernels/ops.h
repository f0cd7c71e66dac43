/*
 * ops.h - the CUDA kernels of the forward pass, callable from C.  One op (or
 * one fused group) per .cu file; each has its plain-C reference in lib/
 * (named in its comment) and is checked against it by tests/gpu/.
 *
 * Conventions.  Activations and weights are bf16 (raw uint16_t bits here,
 * __nv_bfloat16 inside the kernels); every reduction and every
 * transcendental is computed in fp32.  Row-major.  Every function launches
 * on `stream`, checks the launch, and returns 0 or a negative dg_status
 * with err naming the GPU `dev`; none synchronizes.  Pointers are device
 * pointers unless said otherwise.
 */
#ifndef DG_KERNELS_OPS_H
#define DG_KERNELS_OPS_H

#include <stdint.h>

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *dg_stream_t;

/* RMSNorm (reference: dg_ref_rmsnorm), per row of dim values:
 *     y = x * (mean(x^2) + eps)^(-1/2) * w        (w NULL: no scale)
 * y may be x.  rows >= 0, 1 <= dim. */
int dg_cuda_rmsnorm(uint16_t *y, const uint16_t *x, const uint16_t *w, int64_t rows, int dim,
                    float eps, dg_stream_t stream, int dev, struct dg_error *err);

/* RMSNorm of x added to the residual stream, in one pass:
 *     resid = resid + rmsnorm(x) * w * scale
 * (a post-attention or post-feedforward norm, then the residual add; scale
 * is the layer scalar, 1 where the layer has none). */
int dg_cuda_rmsnorm_add(uint16_t *resid, const uint16_t *x, const uint16_t *w, int64_t rows,
                        int dim, float eps, float scale, dg_stream_t stream, int dev,
                        struct dg_error *err);

/* Embedding gather and scale over a vocabulary slice (reference:
 * dg_ref_embed): for token t with id = ids[t],
 *     y[t, :] = emb[id - v0, :] * scale     if v0 <= id < v0 + n_rows
 *     y[t, :] = 0                           otherwise (another rank's row)
 * emb: [n_rows, dim] bf16; ids: T int32 on the device. */
int dg_cuda_embed(uint16_t *y, const int32_t *ids, int64_t T, const uint16_t *emb, int64_t v0,
                  int64_t n_rows, int dim, float scale, dg_stream_t stream, int dev,
                  struct dg_error *err);

/* RoPE in place (reference: dg_ref_rope) on x: [T, n_heads, hd] bf16, token
 * t at position pos[t] (int64 on the device), inv_freq: hd/2 fp32 on the
 * device (dg_rope_inv_freq; 0 leaves a pair as it is), NeoX pairing:
 *     x'[i] = x[i] cos - x[i+hd/2] sin,  x'[i+hd/2] = x[i+hd/2] cos + x[i] sin
 * with angle_i = float(pos) * inv_freq[i] in fp32.  hd even. */
int dg_cuda_rope(uint16_t *x, const int64_t *pos, int64_t T, int n_heads, int hd,
                 const float *inv_freq, dg_stream_t stream, int dev, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
