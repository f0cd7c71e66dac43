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

/* MoE router (reference: dg_ref_router_topk), one token per warp: from its
 * E fp32 logits, p = softmax(logits); the K largest p (ties: lower index
 * first), w_j = p_j / sum_topK p * per_expert_scale[e_j].  idx, w: [T, K]
 * in decreasing p.  1 <= K <= 32, K <= E. */
int dg_cuda_router_topk(int32_t *idx, float *w, const float *logits, int64_t T, int E, int K,
                        const float *per_expert_scale, dg_stream_t stream, int dev,
                        struct dg_error *err);

/* The gated MLP's middle (reference: dg_ref_gelu_mul), over rows of n:
 *     out[r, i] = gelu_tanh(gate[r, i]) * up[r, i]
 * each matrix with its own row stride (in elements), so gate and up may be
 * the two halves of one fused projection.  out may be gate. */
int dg_cuda_gelu_mul(uint16_t *out, int64_t ld_out, const uint16_t *gate, int64_t ld_gate,
                     const uint16_t *up, int64_t ld_up, int64_t rows, int n, dg_stream_t stream,
                     int dev, struct dg_error *err);

/* cuBLAS on one GPU: a handle bound to a stream. */
struct dg_blas;
int dg_blas_create(int dev, dg_stream_t stream, struct dg_blas **out, struct dg_error *err);
void dg_blas_destroy(struct dg_blas *b);
/* The GPU b was created on. */
int dg_blas_device(const struct dg_blas *b);

/* y = x W^T (nn.Linear; reference: dg_ref_matmul): x [T, K] bf16 with row
 * stride K, W [N, K] bf16 with row stride ldw >= K (a slice of a larger
 * matrix), y [T, N] with row stride N, bf16 (y_f32 0) or fp32 (y_f32 1);
 * products accumulated in fp32.  T, N, K >= 1. */
int dg_blas_linear(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                   const uint16_t *W, int64_t N, int64_t K, int64_t ldw, struct dg_error *err);

struct dg_row_stats;
struct dg_rand_site;

/* The sampler's statistics of rows of logits over this rank's vocabulary
 * slice (reference: dg_ref_softcap, then dg_row_stats_slice over the row):
 * z [rows, n] fp32 holds vocab ids v0 .. v0+n-1; first the soft-cap in
 * place (z = cap tanh(z / cap); cap <= 0: none), then per row r, with
 * temperature T[r] and threshold tau[r] (ids with z >= tau kept):
 *   l = z / T;  M = max l;  S = sum exp(l - M);  D = sum exp(l - M)(l - M);
 *   argmax and, when sites is not NULL, the Gumbel-max sample with noise
 *   g_v from Philox at sites[r] (the CPU's bits); non-finite raw logits
 *   counted and skipped.
 * One pass over the logits: chunks of the row reduce online (M, S, D
 * rescaled when M grows), then the chunks fold in order as
 * dg_row_stats_combine does.  out: rows records on the device; scratch:
 * dg_cuda_row_stats_scratch(rows, n) bytes. */
size_t dg_cuda_row_stats_scratch(int64_t rows, int64_t n);
int dg_cuda_row_stats(struct dg_row_stats *out, float *z, int64_t rows, int64_t n, int64_t v0,
                      float cap, const float *T, const float *tau,
                      const struct dg_rand_site *sites, void *scratch, dg_stream_t stream,
                      int dev, struct dg_error *err);

/* The statistics of whole rows from those of their slices, on the device
 * (reference: dg_row_stats_combine, as dg_row_stats_allgather folds):
 * parts [n_parts, rows] records, part q of row r at parts[q * rows + r]
 * (what an all-gather of every rank's records leaves); out[r] = part 0
 * folded with parts 1, 2, ... in order.  out may not overlap parts. */
int dg_cuda_row_stats_fold(struct dg_row_stats *out, const struct dg_row_stats *parts,
                           int64_t rows, int n_parts, dg_stream_t stream, int dev,
                           struct dg_error *err);
/* The probabilities of rows of (soft-capped) logits over this rank's slice
 * (reference: dg_row_probs), from the rows' combined statistics all[r]:
 *   p[r, i] = exp(z[r, i] / T[r] - M) / S   for kept ids (finite, z >= tau[r])
 *   p[r, i] = 0                             otherwise
 * written as bf16 (the operand of the self-conditioning product P . E). */
int dg_cuda_row_probs(uint16_t *p, const float *z, int64_t rows, int64_t n, const float *T,
                      const float *tau, const struct dg_row_stats *all, dg_stream_t stream,
                      int dev, struct dg_error *err);

/* y = x W: x [T, K] bf16 (row stride K), W [K, N] bf16 with row stride
 * ldw >= N, y [T, N] (row stride N) bf16 or fp32; fp32 accumulation.  The
 * self-conditioning product P . E over a vocabulary slice is this with
 * K = the slice's ids and W = its embedding rows. */
int dg_blas_matmul(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                   const uint16_t *W, int64_t K, int64_t N, int64_t ldw, struct dg_error *err);

/* The general form behind both: y = alpha x op(W) + beta y, with W [N, K]
 * (w_kn 0: op(W) = W^T, as dg_blas_linear) or [K, N] (w_kn 1: as
 * dg_blas_matmul), row stride ldw; alpha and beta applied in fp32 (beta
 * reads y in its own type: beta 1 adds the product to y). */
int dg_blas_gemm(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                 const uint16_t *W, int w_kn, int64_t N, int64_t K, int64_t ldw, float alpha,
                 float beta, struct dg_error *err);

/* Grouped-query attention with scale 1 (reference: dg_ref_attention): for
 * query t, head h, KV head c = h / (nh / nkv),
 *   s_j = q[t,h] . k[j,c] over the keys j visible to q_pos[t] (mask
 *   0 none, 1 causal, 2 causal within window: lib/ref-ops.h's
 *   dg_mask_visible on the absolute positions q_pos, k_pos),
 *   out[t,h] = sum_j softmax(s)_j v[j,c]        (no visible key: zeros)
 * q, out: [Tq, nh * hd] bf16; k, v: [Tk, nkv * hd] bf16; positions int64
 * on the device; hd even, at most 512.  Flash-decoding style: each warp
 * keeps an online softmax (running max, sum, output accumulator in fp32
 * registers) over its share of the keys, the warps combine at the end;
 * no score matrix is written to memory.  A first, unoptimised version:
 * one block of 4 warps per (query, head). */
int dg_cuda_attention(uint16_t *out, const uint16_t *q, const int64_t *q_pos, int64_t Tq,
                      const uint16_t *k, const uint16_t *v, const int64_t *k_pos, int64_t Tk,
                      int nh, int nkv, int hd, int mask, int window, dg_stream_t stream, int dev,
                      struct dg_error *err);

/* The experts e0 .. e0+n_exp-1 over T tokens (reference: dg_ref_moe):
 *   out[t] = sum_k w[t,k] down_e(gelu_tanh(gate_e x_t) * up_e x_t),  e = idx[t,k] - e0
 * for the picks in this rank's range.  x [T, H] bf16; idx, w [T, K] on the
 * device; W_gu [n_exp, 2I, H] bf16 (gate rows, then up rows), W_down
 * [n_exp, H, I] bf16; out [T, H] fp32.  The routed rows are sorted by
 * expert and gathered into runs padded to whole tiles of ts rows (ts from
 * the shapes: 16 .. 128), each tile goes through two GEMMs with its
 * expert's weights and the gated gelu between them (intermediates bf16,
 * fp32 accumulation; two batched cuBLAS calls over a tile schedule built
 * on the device, whose fixed count covers the tiles routing needs all but
 * never: on Hopper the rows of the tiles past it, if any, go through the
 * one-launch kernel of moe-wgmma.h), and each token sums its picks in k order
 * (deterministic, in fp32).  Each pick's output down_e(...) is stored in
 * the element type first (bf16: rounded once, as a bf16 product stores
 * it; half fp32's bytes to write and read again), but in fp32 where
 * `partial` says the experts are split along their width over ranks (each
 * rank's outputs are then partial sums, added by an all-reduce).  Nothing
 * waits for the device: the launches depend on the shapes only, so the
 * sequence can be captured in a CUDA graph.
 * n_exp <= 1024, of the model's n_all experts (e0 + n_exp <= n_all):
 * n_exp < n_all where the experts are split across ranks, and the tiles
 * are planned for the rank's share of the picks under even routing
 * (lib/moe-plan.h; any routing is computed, the plan only sizes the
 * launches).  b must be bound to stream.  scratch: dg_cuda_moe_scratch
 * bytes (for the same n_exp and n_all). */
size_t dg_cuda_moe_scratch(int64_t T, int K, int H, int I, int n_exp, int n_all);
int dg_cuda_moe(struct dg_blas *b, float *out, const uint16_t *x, int64_t T, int H,
                const int32_t *idx, const float *w, int K, int e0, int n_exp, int n_all, int I,
                const uint16_t *W_gu, const uint16_t *W_down, void *scratch, dg_stream_t stream,
                struct dg_error *err);

/* The end of a layer's feed-forward block, per row of dim values
 * (reference: dg_ref_ffn_combine):
 *     s = rmsnorm(dense) * w1 + rmsnorm(moe) * w2
 *     x = (x + rmsnorm(s) * w) * scale
 * dense, moe: [rows, dim] fp32 (the dense MLP's and the experts' outputs);
 * x: [rows, dim] bf16, the residual stream, updated in place; w1, w2, w:
 * dim bf16 weights (post-feedforward norms 1, 2 and the outer one); scale:
 * the layer scalar.  Everything between the loads and the store of x is
 * fp32. */
int dg_cuda_ffn_combine(uint16_t *x, const float *dense, const float *moe, const uint16_t *w1,
                        const uint16_t *w2, const uint16_t *w, int64_t rows, int dim, float eps,
                        float scale, dg_stream_t stream, int dev, struct dg_error *err);

/* Random weights on the GPU (reference: dg_ref_fill_normal, bit for bit
 * up to the last ulp of logf/cosf): for i < n,
 *     y[i] = bf16(mean + std * N_i),   N_i standard normal by Box-Muller
 * from Philox4x32-10 with key (seed lo, seed hi) and counter (j lo, j hi,
 * tensor, 0), j = i / 2: u1, u2 from the block's first two words (dg_rand_unit), then
 *     N_{2j}   = sqrt(-2 log u1) cos(2 pi u2)
 *     N_{2j+1} = sqrt(-2 log u1) sin(2 pi u2)
 * so element i depends only on (seed, tensor, i).  std = 0: every element
 * is bf16(mean). */
int dg_cuda_fill_normal(uint16_t *y, int64_t n, uint64_t seed, uint32_t tensor, float mean,
                        float std, dg_stream_t stream, int dev, struct dg_error *err);

/* A rectangular slice of the same stream (a tensor-parallel rank filling
 * its part of a global tensor; reference: dg_ref_fill_normal_rect): for
 * r < rows, c < cols,
 *     y[r * cols + c] = element (first + r * ld + c) of the stream of
 *                       (seed, tensor) as dg_cuda_fill_normal defines it,
 * bit for bit (the same fp32 operations), so rows = 1, first = 0 is
 * dg_cuda_fill_normal of cols values.  The output is packed (row stride
 * cols); ld is the row stride in the global tensor.  rows * cols == 0 does
 * nothing; negative sizes or first, cols > ld with rows > 1, a last index
 * past INT64_MAX, a NULL y with work to do, a non-finite mean or std, or
 * std < 0 are refused (DG_E_INVAL). */
int dg_cuda_fill_normal_rect(uint16_t *y, int64_t rows, int64_t cols, int64_t ld,
                             int64_t first, uint64_t seed, uint32_t tensor, float mean,
                             float std, dg_stream_t stream, int dev, struct dg_error *err);

/* ---- element types ---------------------------------------------------------
 *
 * Every op above reads and writes bf16.  Each also exists for a chosen
 * element type e (the _e forms below; the bf16 names are those with
 * DG_ELT_BF16): buffers documented as bf16 then hold e's values (void *),
 * everything else (fp32 outputs, ids, positions, statistics) is unchanged.
 * fp32 elements serve fp32 checkpoints: the same plan computed at the CPU
 * reference's precision.  The maths and the fp32 arithmetic inside are the
 * same for both types; only loads and stores differ. */
enum dg_elt { DG_ELT_BF16 = 0, DG_ELT_F32 = 1 };

/* Bytes of one element. */
static inline int dg_elt_size(enum dg_elt e)
{
    return e == DG_ELT_F32 ? 4 : 2;
}

int dg_cuda_rmsnorm_e(enum dg_elt e, void *y, const void *x, const void *w, int64_t rows,
                      int dim, float eps, dg_stream_t stream, int dev, struct dg_error *err);
int dg_cuda_rmsnorm_add_e(enum dg_elt e, void *resid, const void *x, const void *w,
                          int64_t rows, int dim, float eps, float scale, dg_stream_t stream,
                          int dev, struct dg_error *err);
/* dg_cuda_rmsnorm_add_e, then n_out (0 to 3) RMSNorms of the updated
 * residual in the same pass, each exactly as dg_cuda_rmsnorm_e(e, y[j],
 * resid, wy[j], ...) after it would compute it (wy[j] NULL: no weight):
 * the norms that read the residual one after another (a layer's
 * feed-forward input norms) in one launch.  y[j] must not be resid or
 * overlap it.  Reference: dg_ref_rmsnorm, composed. */
int dg_cuda_rmsnorm_add_norms_e(enum dg_elt e, void *resid, const void *x, const void *w,
                                int64_t rows, int dim, float eps, float scale, int n_out,
                                void *const *y, const void *const *wy, dg_stream_t stream,
                                int dev, struct dg_error *err);
/* The same for bf16 with x the bf16 values of an FP8 product's unscaled
 * sums (fp8-lt.h's dg_fp8_lt_product): S [rows, dim] fp32 packed,
 *     x[r, i] = bf16(S[r, i] sa[r] sw[i])
 * (what dg_fp8_lt_gemm would have stored with row scales sa and column
 * scales sw), then as dg_cuda_rmsnorm_add_norms_e(resid, x, ...): the same
 * bits as the two calls.  xbuf [rows, dim] bf16: where x is written
 * first where the one pass does not take the rows (else untouched).
 * Errors: as that function's, and DG_E_INVAL for missing scales or
 * buffer. */
int dg_cuda_rmsnorm_add_norms_scaled(void *resid, const float *S, const float *sa,
                                     const float *sw, void *xbuf, const void *w, int64_t rows,
                                     int dim, float eps, float scale, int n_out, void *const *y,
                                     const void *const *wy, dg_stream_t stream, int dev,
                                     struct dg_error *err);
int dg_cuda_embed_e(enum dg_elt e, void *y, const int32_t *ids, int64_t T, const void *emb,
                    int64_t v0, int64_t n_rows, int dim, float scale, dg_stream_t stream, int dev,
                    struct dg_error *err);
int dg_cuda_rope_e(enum dg_elt e, void *x, const int64_t *pos, int64_t T, int n_heads, int hd,
                   const float *inv_freq, dg_stream_t stream, int dev, struct dg_error *err);
int dg_cuda_gelu_mul_e(enum dg_elt e, void *out, int64_t ld_out, const void *gate,
                       int64_t ld_gate, const void *up, int64_t ld_up, int64_t rows, int n,
                       dg_stream_t stream, int dev, struct dg_error *err);
int dg_cuda_ffn_combine_e(enum dg_elt e, void *x, const float *dense, const float *moe,
                          const void *w1, const void *w2, const void *w, int64_t rows, int dim,
                          float eps, float scale, dg_stream_t stream, int dev,
                          struct dg_error *err);
/* dg_cuda_ffn_combine_e, then the next RMSNorm of the updated x in the
 * same pass, exactly as dg_cuda_rmsnorm_e(e, y, x, wy, ...) after it
 * would compute it (wy NULL: no weight): the next layer's input norm, or
 * the final one.  With q: y's rows quantized too, the bytes
 * and scales that dg_cuda_fp8_quantize_rows(e, q, qs, y, ...) gives (q
 * [rows, dim], qs [rows]).  y must not be x or overlap it.  Where the
 * rows do not fit the one pass, the same passes one after another.
 * References: dg_ref_ffn_combine, dg_ref_rmsnorm, dg_fp8_quantize_rows. */
int dg_cuda_ffn_combine_norm_e(enum dg_elt e, void *x, const float *dense, const float *moe,
                               const void *w1, const void *w2, const void *w, int64_t rows,
                               int dim, float eps, float scale, void *y, const void *wy,
                               uint8_t *q, float *qs, dg_stream_t stream, int dev,
                               struct dg_error *err);
int dg_cuda_attention_e(enum dg_elt e, void *out, const void *q, const int64_t *q_pos,
                        int64_t Tq, const void *k, const void *v, const int64_t *k_pos,
                        int64_t Tk, int nh, int nkv, int hd, int mask, int window,
                        dg_stream_t stream, int dev, struct dg_error *err);
int dg_cuda_row_probs_e(enum dg_elt e, void *p, const float *z, int64_t rows, int64_t n,
                        const float *T, const float *tau, const struct dg_row_stats *all,
                        dg_stream_t stream, int dev, struct dg_error *err);
/* x and W (and y when y_f32 is 0) of type e; fp32 elements go through
 * plain fp32 GEMM (no TF32). */
int dg_blas_gemm_e(struct dg_blas *b, enum dg_elt e, void *y, int y_f32, const void *x,
                   int64_t T, const void *W, int w_kn, int64_t N, int64_t K, int64_t ldw,
                   float alpha, float beta, struct dg_error *err);
/* Rows gathered from anywhere (reference: dg_ref_rows_gather): for t < T,
 *     y[t, :] = src[t][0 .. dim)    or zeros where src[t] is NULL
 * src: a device array of T device pointers to rows of e's elements (the
 * self-conditioning inputs of a batch's canvases, each in its slot). */
int dg_cuda_rows_gather_e(enum dg_elt e, void *y, const void *const *src, int64_t T, int dim,
                          dg_stream_t stream, int dev, struct dg_error *err);

/* One sequence of a batch for the batched attention and the KV append,
 * on the device: its cache (row r holds position r: nkv heads of hd
 * elements), and the rows its queries read. */
struct dg_attn_seq {
    void *k, *v;               /* the cache's row 0 */
    int64_t k_start, k_len;    /* keys read: rows k_start .. k_start+k_len-1 */
};

/* dg_cuda_attention_e for many sequences in one launch (reference:
 * dg_ref_attention per sequence): query row t belongs to sequence
 * q_seq[t] (device int32) and attends, at position q_pos[t], to that
 * sequence's keys, each at the position of its row.  seqs: a device
 * array.  Nothing about the sequences is read on the host, so a captured
 * launch serves any lengths. */
int dg_cuda_attention_batch_e(enum dg_elt e, void *out, const void *q, const int64_t *q_pos,
                              const int32_t *q_seq, int64_t Tq, const struct dg_attn_seq *seqs,
                              int nh, int nkv, int hd, int mask, int window, dg_stream_t stream,
                              int dev, struct dg_error *err);

/* The same with a work space (device, ws_bytes; may be NULL): with bf16
 * elements, a batch whose rows make too few blocks to fill the GPU has
 * its keys split over more, their partial results in ws
 * (kernels/attention-tc.h).  dg_cuda_attention_batch_ws_bytes: the bytes
 * that allow the split these shapes would take (0: none). */
int dg_cuda_attention_batch_ws_e(enum dg_elt e, void *out, const void *q, const int64_t *q_pos,
                                 const int32_t *q_seq, int64_t Tq,
                                 const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                                 int mask, int window, void *ws, size_t ws_bytes,
                                 dg_stream_t stream, int dev, struct dg_error *err);
size_t dg_cuda_attention_batch_ws_bytes(enum dg_elt e, int64_t Tq, int nh, int nkv, int hd);

/* Append new keys and values to their sequences' caches (reference:
 * dg_ref_kv_append): for each token t,
 *     seqs[q_seq[t]].k[q_pos[t] * row + i] = k_new[t * row + i]   (i < row)
 * and the same for v; row = nkv * hd elements. */
int dg_cuda_kv_append_e(enum dg_elt e, const struct dg_attn_seq *seqs, const int32_t *q_seq,
                        const int64_t *q_pos, const void *k_new, const void *v_new, int64_t Tq,
                        int64_t row, dg_stream_t stream, int dev, struct dg_error *err);

/* The attention's per-head preparation in one launch, for T tokens at
 * positions pos (references: dg_ref_rmsnorm, then dg_ref_rope, then the
 * append as dg_cuda_kv_append_e):
 *     q[t, h] = rope(rmsnorm(qsrc[t, h]) * wq, pos[t])   h < nh
 *     k[t, c] = rope(rmsnorm(ksrc[t, c]) * wk, pos[t])   c < nkv
 *     v[t, c] = rmsnorm(vsrc[t, c])                       (no weight, no rotation)
 * over head rows of hd values, and with seqs (not NULL: the layer's
 * table, q_seq each token's sequence) k[t] and v[t] also into the
 * token's sequence's cache at row pos[t].  Source row (t, h) is at
 * src + t ld + h hd (ld_q for q, ld_kv for k and v: the columns of one
 * projection's output, or of q, k and v side by side); q, k, v are
 * written packed ([T, heads, hd]); qsrc may be q with ld_q = nh hd (in
 * place), ksrc and vsrc the same rows.  Each norm's output is rounded to
 * the element type before it is rotated, as dg_cuda_rmsnorm_e then
 * dg_cuda_rope_e (which run, after the rows are copied to their outputs,
 * where the one-pass kernel does not take the shape: fp32, hd not a
 * power of two in [16, 1024], unaligned rows).  wq, wk NULL: no weight;
 * inv_freq: hd / 2 floats. */
int dg_cuda_head_norm_rope_e(enum dg_elt e, void *q, void *k, void *v, const void *qsrc,
                             int64_t ld_q, const void *ksrc, const void *vsrc, int64_t ld_kv,
                             const int64_t *pos, int64_t T, int nh, int nkv, int hd,
                             const void *wq, const void *wk, const float *inv_freq, float eps,
                             const struct dg_attn_seq *seqs, const int32_t *q_seq,
                             dg_stream_t stream, int dev, struct dg_error *err);
/* The same for bf16 q, k, v from the unscaled sums of an FP8 product
 * (fp8-lt.h's dg_fp8_lt_product): S [T, ld] fp32, q's columns from 0, k's
 * from kcol, v's from vcol (= kcol: v from k's columns, as vsrc = ksrc),
 * each value first
 *     x[t, c] = bf16(S[t, c] sa[t] sw[c])
 * (the bf16 product dg_fp8_lt_gemm would have stored with row scales sa
 * and column scales sw), then as dg_cuda_head_norm_rope_e with qsrc = x,
 * ksrc = x + kcol, vsrc = x + vcol, ld_q = ld_kv = ld: the same bits as
 * the two calls, without x.  Errors: DG_E_INVAL (as that function's, and
 * columns that overlap or pass ld). */
int dg_cuda_head_norm_rope_scaled(void *q, void *k, void *v, const float *S, int64_t ld,
                                  int64_t kcol, int64_t vcol, const float *sa, const float *sw,
                                  const int64_t *pos, int64_t T, int nh, int nkv, int hd,
                                  const void *wq, const void *wk, const float *inv_freq, float eps,
                                  const struct dg_attn_seq *seqs, const int32_t *q_seq,
                                  dg_stream_t stream, int dev, struct dg_error *err);

/* Batched y_i = x_i W_i^T (nn.Linear) for i < count, as dg_blas_gemm_e
 * with w_kn 0, alpha 1, beta 0: x_i [m, K], W_i [N, K] with row stride
 * ldw, y_i [m, N] of type e or fp32 (y_f32); y, x and W are device arrays
 * of count device pointers, read when the GEMMs run (a kernel queued
 * before may write them: the expert GEMMs' schedule).  count 0: nothing. */
int dg_blas_gemm_batched_e(struct dg_blas *b, enum dg_elt e, void *const *y, int y_f32,
                           const void *const *x, int64_t m, const void *const *W, int64_t N,
                           int64_t K, int64_t ldw, int64_t count, struct dg_error *err);
/* x, W_gu, W_down and the intermediates of type e. */
size_t dg_cuda_moe_scratch_e(enum dg_elt e, int64_t T, int K, int H, int I, int n_exp,
                             int n_all);
/* FP8 experts (W8A8, fp8-gemm.h): W_gu [n_exp, 2I, H] and W_down
 * [n_exp, H, I] E4M3 bytes with fp32 scales per row, S_gu [n_exp * 2I] and
 * S_down [n_exp * H]; each expert's gathered rows, then the gelu output,
 * quantized per row; bf16 x; otherwise as dg_cuda_moe_e, with the scratch
 * dg_cuda_moe_scratch_q gives.  [2I, H] and [H, I] must fit the FP8 GEMM
 * (DG_E_INVAL). */
size_t dg_cuda_moe_scratch_q(int64_t T, int K, int H, int I, int n_exp, int n_all);
int dg_cuda_moe_q(struct dg_blas *b, float *out, const uint16_t *x, int64_t T, int H,
                  const int32_t *idx, const float *w, int K, int e0, int n_exp, int n_all, int I,
                  const uint8_t *W_gu, const float *S_gu, const uint8_t *W_down,
                  const float *S_down, int partial, void *scratch, dg_stream_t stream,
                  struct dg_error *err);
int dg_cuda_moe_e(struct dg_blas *b, enum dg_elt e, float *out, const void *x, int64_t T, int H,
                  const int32_t *idx, const float *w, int K, int e0, int n_exp, int n_all, int I,
                  const void *W_gu, const void *W_down, int partial, void *scratch,
                  dg_stream_t stream, struct dg_error *err);

/* The experts' routing and their sum, the first and last stages of
 * dg_cuda_moe_e (which runs them itself), on their own for the tests
 * (reference: dg_ref_moe_route, dg_ref_moe_combine).
 *
 * dg_cuda_moe_route_e writes into scratch (dg_cuda_moe_scratch_e bytes for
 * e, T, K, H, I, n_exp, n_all) and fills view with where its pieces lie:
 *   counts[j]     = picks p < T K with idx[p] = e0 + j;
 *   offsets[j]    = sum_{i<j} ceil(counts[i] / ts) ts, offsets[n_exp] the
 *                   padded total (ts: the tile rows, 16 .. 128);
 *   slot_of[p]    in [offsets[j], offsets[j] + counts[j]) for a pick of
 *                 expert e0 + j, each slot taken once (the order within a
 *                 run is the atomics'), -1 for another rank's expert;
 *   xs[slot_of[p]] = x[p / K] (rows of H elements of type e);
 *   ptrs: six arrays of tiles pointers, A1 B1 C1 A2 B2 C2: tile t = r / ts
 *         of expert j's padded rows r reads xs + r H, W_gu + j 2I H and
 *         writes gu + r 2I (first GEMM), reads hh + r I, W_down + j H I and
 *         writes ys + r H (second; element offsets, ys of type e too);
 *         tiles from offsets[n_exp] / ts on read xs, W_gu, hh, W_down and
 *         write dummy_gu, dummy_ys;
 *   sync[0 .. 2 n_exp] = 0: the words of the experts' one launch
 *         (dg_cuda_experts_wgmma, dg_cuda_fp8_experts_wgmma);
 *   ov_offsets, ov_counts: the rows from rb = batched ts on, expert by
 *         expert (ov_offsets[j] = max(offsets[j], rb), ov_counts[j] =
 *         max(0, offsets[j] + counts[j] - ov_offsets[j])), which
 *         dg_cuda_moe_e runs through the one launch where the batched
 *         GEMMs stop at `batched` tiles (bf16 on Hopper, when its bound is
 *         below `tiles`; otherwise batched = tiles and every count 0);
 *         *ov_any = 1 where any count is not 0, else 0.
 * T >= 1; e bf16 or fp32; shapes as dg_cuda_moe_e (DG_E_INVAL).
 *
 * dg_cuda_moe_combine: out[t, i] = sum over k < K, in k order, of
 * w[t, k] ys[slot_of[t K + k], i], slots below 0 skipped, in fp32; out
 * [T, H], ys rows of H, fp32 where ys_f32, else bf16.  T 0: nothing. */
struct dg_moe_route_view {
    int ts;
    int64_t tiles, rows;                /* the tile bound; padded rows, tiles x ts */
    int32_t *counts, *offsets, *slot_of;
    void **ptrs;
    void *xs, *gu, *hh, *ys, *dummy_gu, *dummy_ys;
    int32_t *sync;                      /* 1 + 2 n_exp, zeroed (the experts' one launch) */
    int64_t batched;                    /* tiles the batched GEMMs run (<= tiles) */
    int32_t *ov_offsets, *ov_counts;    /* the rows past them, by expert */
    int32_t *ov_any;                    /* 1 if any, else 0 */
};
int dg_cuda_moe_route_e(enum dg_elt e, const void *x, int64_t T, int H, const int32_t *idx, int K,
                        int e0, int n_exp, int n_all, int I, const void *W_gu,
                        const void *W_down, void *scratch, struct dg_moe_route_view *view,
                        dg_stream_t stream, int dev, struct dg_error *err);
int dg_cuda_moe_combine(float *out, const void *ys, int ys_f32, const int32_t *slot_of,
                        const float *w, int64_t T, int K, int H, dg_stream_t stream, int dev,
                        struct dg_error *err);

/* A read of bytes [p, p + bytes), passes times over, for the L2's read
 * bandwidth (the harness's ceilings): blocks blocks of 256 threads, each
 * writing out[b], the sum mod 2^32 of the 32-bit words it read (every
 * pass's); the blocks' sum is passes * dg_ref_word_sum (lib/ref-ops.h) of
 * the buffer.  p and bytes multiples of 16, bytes > 0, passes >= 1,
 * blocks in [1, 2,097,120]; out holds blocks words. */
int dg_cuda_l2_read(const void *p, int64_t bytes, int passes, uint32_t *out, int blocks,
                    dg_stream_t stream, int dev, struct dg_error *err);

/* Bytes [p, p + bytes) of device memory fetched into the L2 for a kernel
 * that reads them later (launched on another stream, so the fetch runs
 * beside what the reader waits for): cp.async.bulk.prefetch on compute
 * capability 9.0, the lines marked evict-last so that lines read
 * normally meanwhile go first; below 9.0 a launch that does nothing.
 * Nothing is written.  p and bytes multiples of 16 (bytes 0: no launch). */
int dg_cuda_l2_prefetch(const void *p, int64_t bytes, dg_stream_t stream, int dev,
                        struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
