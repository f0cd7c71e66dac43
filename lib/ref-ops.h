/*
 * ref-ops.h - the plain-C reference for every operator of the DiffusionGemma
 * forward pass.  fp32 activations; weights read from checkpoint memory in
 * their stored dtype (BF16, F16, F32).  These are the CPU backend's ops and
 * the oracle each CUDA kernel is tested against.
 *
 * Letters: T tokens (rows), H hidden, nh/nkv query/KV heads, hd head size,
 * E experts, K experts per token.  Row-major throughout.
 */
#ifndef DG_REF_OPS_H
#define DG_REF_OPS_H

#include <math.h>
#include <stdint.h>

#include "lib/model-config.h"
#include "lib/model-weights.h"

/* RMSNorm, Gemma style (plain weight, not 1 + w), per row of dim values:
 *     y = x * (mean(x^2) + eps)^(-1/2) * w        (w == NULL: no scale)
 * Computed in fp32 with a double accumulator for the mean.  y may be x. */
void dg_ref_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int dim, float eps);

/* gelu with the tanh approximation:
 *     gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static inline float dg_gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* The gated MLP's middle over n values: out[i] = gelu_tanh(gate[i]) * up[i].
 * out may be gate. */
void dg_ref_gelu_mul(float *out, const float *gate, const float *up, int64_t n);

/* Logit soft-cap in place: z = cap * tanh(z / cap).  cap <= 0: no-op. */
void dg_ref_softcap(float *z, int64_t n, float cap);

/* Rows gathered from anywhere (the oracle of dg_cuda_rows_gather_e):
 * y[t, :] = src[t][0 .. dim), or zeros where src[t] is NULL. */
void dg_ref_rows_gather(float *y, const float *const *src, int64_t T, int dim);

/* Embedding gather and scale over the vocabulary rows [v0, v0 + E->rows)
 * one rank holds (E: those rows, E->cols = hidden):
 *     x[t, :] = E[ids[t] - v0, :] * scale    if the id is one of them
 *     x[t, :] = 0                            otherwise
 * so the sum over ranks is the embedding. */
void dg_ref_embed(float *x, const int32_t *ids, int64_t T, const struct dg_weight *E, int64_t v0,
                  float scale);

/* RoPE inverse frequencies for one layer kind, hd/2 entries (model.md §3.1.3):
 *   default:      f_i = theta^(-2i/hd)                              i < hd/2
 *   proportional: f_i = theta^(-2i/hd) / factor  for i < r, 0 for i >= r,
 *                 with r = floor(partial_rotary_factor * hd / 2)
 * computed in fp32 the way transformers does. */
void dg_rope_inv_freq(const struct dg_rope_config *rope, int hd, float *inv_freq);

/* Rotate n_heads vectors of hd values in place at position pos
 * (NeoX / rotate-half pairing, angle_i = pos * f_i):
 *   x'[i]      = x[i] cos - x[i + hd/2] sin
 *   x'[i+hd/2] = x[i + hd/2] cos + x[i] sin          for i < hd/2
 * Pairs with f_i = 0 are left exactly as they are. */
void dg_ref_rope(float *x, int n_heads, int hd, const float *inv_freq, int64_t pos);

/* y[t, j] = sum_i x[t, i] * W[j, i] for t < T, j < w->rows, i < w->cols
 * (y = x W^T, nn.Linear); W's rows lie w->stride elements apart (0: cols);
 * an F8_E4M3 W is dequantized row by row (e4m3 value times the row's
 * scale).  row_buf: scratch of w->cols floats. */
void dg_ref_matmul(float *y, const float *x, int64_t T, const struct dg_weight *w, float *row_buf);

/* The same accumulated in double, into double: the form whose partial
 * sums over column slices (tensor-parallel ranks) add up to the whole
 * product up to double rounding, so the float result hardly ever depends
 * on how the columns were split. */
void dg_ref_matmul_f64(double *y, const float *x, int64_t T, const struct dg_weight *w,
                       float *row_buf);

/* Which keys a query sees (model.md §4.3), by absolute position q, k:
 *   DG_MASK_NONE           every key (decoder mode: the caller passes only
 *                          the keys the layer keeps: the cached window and
 *                          the whole canvas)
 *   DG_MASK_CAUSAL         k <= q                       (encoder, full layers)
 *   DG_MASK_CAUSAL_WINDOW  k <= q and k > q - window    (encoder, sliding layers) */
enum dg_attn_mask { DG_MASK_NONE = 0, DG_MASK_CAUSAL = 1, DG_MASK_CAUSAL_WINDOW = 2 };

static inline int dg_mask_visible(enum dg_attn_mask mask, int64_t q, int64_t k, int window)
{
    switch (mask) {
    case DG_MASK_NONE: return 1;
    case DG_MASK_CAUSAL: return k <= q;
    case DG_MASK_CAUSAL_WINDOW: return k <= q && k > q - window;
    }
    return 0;
}

/* Grouped-query attention with scale 1 (the q/k norms stand in for 1/sqrt(hd)):
 *   for query t, head h, g = nh / nkv, kv head c = h / g:
 *     s_j = q[t,h] . k[j,c]          over the keys j visible to q_pos[t]
 *     out[t,h] = sum_j softmax(s)_j v[j,c]
 * q, out: [Tq, nh*hd]; k, v: [Tk, nkv*hd]; positions give the mask.  A
 * query that sees no key gets zeros.  scores: scratch of Tk floats. */
void dg_ref_attention(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                      const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                      int nh, int nkv, int hd, enum dg_attn_mask mask, int window,
                      float *scores);

/* New keys and values into their sequences' caches (the oracle of
 * dg_cuda_kv_append_e): for each token t and i < row,
 *     k_caches[q_seq[t]][q_pos[t] * row + i] = k_new[t * row + i]
 * and the same for v (a cache's row r holds position r). */
void dg_ref_kv_append(float *const *k_caches, float *const *v_caches, const int32_t *q_seq,
                      const int64_t *q_pos, const float *k_new, const float *v_new, int64_t Tq,
                      int64_t row);

/* The same over a slice of the heads (one tensor-parallel rank): nq query
 * heads, global ids q_base.., and nkv KV heads, global ids kv_base..; query
 * head q_base + j reads KV head (q_base + j) / group (group = the model's
 * query heads per KV head), which must lie in the slice. */
void dg_ref_attention_heads(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                            const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                            int nq, int q_base, int nkv, int kv_base, int group, int hd,
                            enum dg_attn_mask mask, int window, float *scores);

/* Router decision for one token (model.md §3.3 step 9) from its E logits:
 *   p = softmax(logits) (fp32); the K largest p (ties: lower index first),
 *   w_j = p_j / sum_topK p * per_expert_scale[e_j].
 * idx, w: K entries each, in decreasing p. */
void dg_ref_router_topk(int *idx, float *w, const float *logits, int E, int K,
                        const float *per_expert_scale);

/* One expert's hidden activations over T rows x ([T, H]) (the oracle of
 * dg_cuda_grouped_gemm_gelu for one group):
 *   out[t, i] = gelu_tanh(x_t gate_i) * (x_t up_i)     i < I, fp32
 * gate_up: the expert's [2I, H] (gate rows, then up rows); u: I floats of
 * scratch, row: H floats (dg_ref_matmul's). */
void dg_ref_expert_hidden(float *out, const float *x, int64_t T, int H, int I,
                          const struct dg_weight *gate_up, float *u, float *row);

/* The experts e0 .. e0+n_exp-1 (one rank's) over T tokens routed by idx,
 * w ([T, K], dg_ref_router_topk's output):
 *   out[t] = sum_k w[t,k] down_e(gelu_tanh(gate_e x_t) * up_e x_t),  e = idx[t,k]
 * over the k whose expert is in the range (the others are another rank's;
 * out sums to the layer's MoE output across ranks).  gate_up[j]: expert
 * e0 + j's [2I, H] (gate rows, then up rows), down[j]: its [H, I].
 * Returns 0, or -1 when out of memory. */
int dg_ref_moe(float *out, const float *x, int64_t T, int H, const int32_t *idx, const float *w,
               int K, int e0, int n_exp, int I, const struct dg_weight *gate_up,
               const struct dg_weight *down);

/* The routing of picks idx [picks] over experts e0 .. e0+n_exp-1 as
 * dg_cuda_moe_route_e lays it out, in tiles of ts rows:
 *   counts[j]  = picks with idx[p] = e0 + j,
 *   offsets[j] = sum_{i<j} ceil(counts[i] / ts) ts, offsets[n_exp] the total,
 *   slot_of[p] = offsets[j] + (picks of expert e0 + j before p), -1 outside
 *                the range (the GPU may order a run otherwise). */
void dg_ref_moe_route(int32_t *counts, int32_t *offsets, int32_t *slot_of, const int32_t *idx,
                      int64_t picks, int e0, int n_exp, int ts);

/* The rows of dg_ref_moe_route's runs from row rb on, expert by expert
 * (the part past the batched GEMMs' tiles that dg_cuda_moe_e's one launch
 * takes):
 *   ov_offsets[j] = max(offsets[j], rb),
 *   ov_counts[j]  = max(0, offsets[j] + counts[j] - ov_offsets[j]).
 * Returns the sum of ov_counts. */
int64_t dg_ref_moe_overflow(int32_t *ov_offsets, int32_t *ov_counts, const int32_t *counts,
                            const int32_t *offsets, int n_exp, int64_t rb);

/* out[t, i] = sum over k < K, in k order, of w[t, k] ys[slot_of[t K + k], i],
 * slots below 0 skipped (fp32 sums); out [T, H], ys rows of H. */
void dg_ref_moe_combine(float *out, const float *ys, const int32_t *slot_of, const float *w,
                        int64_t T, int K, int H);

/* Softmax of n values in place (max-subtracted, fp32 exp, double sum). */
void dg_ref_softmax(float *x, int64_t n);

/* The end of a layer's feed-forward block over rows of dim values (the
 * CPU forward's steps, in one call; the oracle of dg_cuda_ffn_combine):
 *     s = rmsnorm(dense; w1) + rmsnorm(moe; w2)
 *     x = (x + rmsnorm(s; w)) * scale
 * dense and moe are overwritten with their norms. */
void dg_ref_ffn_combine(float *x, float *dense, float *moe, const float *w1, const float *w2,
                        const float *w, int64_t rows, int dim, float eps, float scale);

/* Random weights (the oracle of dg_cuda_fill_normal; see kernels/ops.h for
 * the stream): y[i] = bf16 bits of mean + std * N(seed, tensor, i). */
void dg_ref_fill_normal(uint16_t *y, int64_t n, uint64_t seed, uint32_t tensor, float mean,
                        float std);

/* A rectangular slice of the same stream (the oracle of
 * dg_cuda_fill_normal_rect): for r < rows, c < cols,
 *     y[r * cols + c] = element (first + r * ld + c) of dg_ref_fill_normal's
 * stream of (seed, tensor), exactly.  No checks: rows or cols <= 0 writes
 * nothing. */
void dg_ref_fill_normal_rect(uint16_t *y, int64_t rows, int64_t cols, int64_t ld, int64_t first,
                             uint64_t seed, uint32_t tensor, float mean, float std);

/* The sum of n 32-bit words, times times, mod 2^32 (the oracle of
 * dg_cuda_l2_read, whose blocks' sums add up to it over `times` passes). */
uint32_t dg_ref_word_sum(const uint32_t *w, int64_t n, uint32_t times);

#endif
