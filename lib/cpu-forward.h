/*
 * cpu-forward.h - the DiffusionGemma forward pass on the CPU: the engine's
 * reference backend (fp32 activations over BF16/F16/F32 weights).
 *
 * One text stack, two modes (model.md §3-5):
 *
 *   encoder  (prompt prefill, canvas commit): x = E[ids] * c; causal
 *            attention over the cache and the new tokens (sliding layers:
 *            keys k > q - W), encoder layer_scalar; writes K/V into the
 *            cache; returns the final-normed hidden states.
 *   decoder  (one denoising step over a canvas): x = rms(E[ids] * c +
 *            SC(soft)), soft = softmax(sc_logits) E c (SC = 0 on the first
 *            step); the canvas attends bidirectionally to the cached
 *            window (sliding: last W-1; full: all) and to itself; decoder
 *            layer_scalar; reads the cache, never writes it; returns
 *            softcapped logits [CL, V].
 *
 * Every layer: a = rms(x); attention (q/k per-head norms with weight,
 * RoPE on q and k, v per-head norm without weight; full layers take V from
 * the raw K projection); h = x + rms(o_proj); dense MLP and MoE both from
 * h (router on the un-normed h); x' = (h + rms(rms(mlp) + rms(moe))) * s.
 *
 * The embedding scale c is sqrt(H) rounded to the embedding's dtype (53.0
 * for bf16 H = 2816), as transformers computes it.
 */
#ifndef DG_CPU_FORWARD_H
#define DG_CPU_FORWARD_H

#include <stdint.h>

#include "lib/error.h"
#include "lib/kv-cache.h"
#include "lib/model-weights.h"

struct dg_cpu_layer {
    /* fp32 copies of the layer's vectors */
    float *input_norm, *q_norm, *k_norm, *post_attn_norm;
    float *pre_ffn_norm, *post_ffn_norm_1, *router_scale, *router_expert_scale;
    float *pre_ffn_norm_2, *post_ffn_norm_2, *post_ffn_norm;
    const float *inv_freq; /* the layer kind's RoPE table, hd/2 entries */
    int hd, nkv;
};

struct dg_cpu_model {
    const struct dg_model *m;
    float embed_scale;
    float *final_norm, *sc_pre_norm;
    float *inv_freq_sliding, *inv_freq_full;
    struct dg_cpu_layer *layers;
    float *pool;       /* one allocation behind every vector above */
};

/* Prepare m (which must outlive cm) for the CPU backend.  Errors: DG_E_NOMEM. */
int dg_cpu_model_init(struct dg_cpu_model *cm, const struct dg_model *m, struct dg_error *err);

void dg_cpu_model_free(struct dg_cpu_model *cm);

/* Encoder pass over T tokens at positions kv->length .. +T-1; appends them
 * to kv.  hidden (may be NULL): [T, H] final-normed hidden states.
 * Errors: DG_E_INVAL (T < 1, an id outside [0, V)), DG_E_RANGE (past the
 * cache's positions), DG_E_NOMEM.  On error kv is unchanged. */
int dg_cpu_encode(const struct dg_cpu_model *cm, struct dg_kv_cache *kv, const int32_t *ids,
                  int64_t T, float *hidden, struct dg_error *err);

/* Decoder pass over a canvas of CL tokens at positions kv->length .. +CL-1.
 * sc_logits: NULL (first step) or the previous step's processed logits
 * [CL, V].  logits: [CL, V] out.  Errors as dg_cpu_encode. */
int dg_cpu_decode(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                  const int32_t *canvas, int64_t CL, const float *sc_logits, float *logits,
                  struct dg_error *err);

/* Decoder pass with the self-conditioning input given as a soft embedding
 * soft [CL, H] (= (pi E) c for probabilities pi), or NULL for none. */
int dg_cpu_decode_soft(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                       const int32_t *canvas, int64_t CL, const float *soft, float *logits,
                       struct dg_error *err);

/* soft[t] = (sum_v probs[t, v] E[v]) c for CL rows of probabilities over the
 * vocabulary, accumulated in double.  Errors: DG_E_NOMEM. */
int dg_cpu_soft_embed(const struct dg_cpu_model *cm, const float *probs, int64_t CL, float *soft,
                      struct dg_error *err);

/* sqrt(H) rounded to dtype t (bf16: 53.0 for H = 2816). */
float dg_embed_scale(int hidden, enum dg_dtype t);

#endif
