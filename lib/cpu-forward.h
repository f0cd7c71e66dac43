/*
 * cpu-forward.h - the DiffusionGemma forward pass on the CPU: the engine's
 * reference backend (fp32 activations over BF16/F16/F32 weights), whole or
 * as one rank of a tensor-parallel group (tp-plan.h).
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
 * As rank r of T (dg_cpu_model_init_rank), the model holds only its part of
 * the weights: vocabulary rows v0 .. v0+nv of the embedding / LM head,
 * query heads (and the KV heads they read), a slice of the dense MLP, its
 * experts (or a slice of every expert's width); norms, router and the
 * self-conditioning MLP are replicated.  Partial results meet in
 * all-reduces on its dg_coll: the token embedding (beside the
 * self-conditioning partial), the attention output, and the dense + MoE
 * outputs of every layer.  The partial products behind those sums
 * (o_proj, down projections, the expert mix, the soft embedding) are
 * accumulated and reduced in double, so the result is the same float
 * however the work is split (up to double rounding).  All ranks call the
 * same functions in the same order.  With one rank no collective runs.
 *
 * The embedding scale c is sqrt(H) rounded to the embedding's dtype (53.0
 * for bf16 H = 2816), as transformers computes it.
 */
#ifndef DG_CPU_FORWARD_H
#define DG_CPU_FORWARD_H

#include <stdint.h>

#include "lib/coll.h"
#include "lib/error.h"
#include "lib/kv-cache.h"
#include "lib/mem-ledger.h"
#include "lib/model-weights.h"
#include "lib/tp-plan.h"

struct dg_cpu_layer {
    /* fp32 copies of the layer's vectors (every rank) */
    float *input_norm, *q_norm, *k_norm, *post_attn_norm;
    float *pre_ffn_norm, *post_ffn_norm_1, *router_scale, *router_expert_scale;
    float *pre_ffn_norm_2, *post_ffn_norm_2, *post_ffn_norm;
    const float *inv_freq; /* the layer kind's RoPE table, hd/2 entries */
    int hd, nkv;           /* head size; the model's KV heads */
    /* this rank's part */
    int q0, nq;            /* query heads q0 .. q0+nq-1 */
    int kv0, nkv_local;    /* KV heads kv0 .. kv0+nkv_local-1 */
    int group;             /* query heads per KV head */
    struct dg_weight q_proj, k_proj, v_proj, o_proj;
    struct dg_weight mlp_gate, mlp_up, mlp_down;
    int e0, e1;            /* experts computed here */
    struct dg_weight *exp_gate, *exp_up, *exp_down; /* [E]; e0 .. e1-1 set */
};

struct dg_cpu_model {
    const struct dg_model *m;
    int rank, n_ranks;
    struct dg_coll *coll;          /* NULL with one rank */
    struct dg_mem_ledger *ledger;  /* optional accounting of this rank */
    int64_t v0, nv;                /* vocabulary rows of this rank */
    struct dg_weight embed;        /* those rows of the embedding / LM head */
    int mlp_width, expert_width;   /* dense MLP and expert widths here */
    float embed_scale;
    float *final_norm, *sc_pre_norm;
    float *inv_freq_sliding, *inv_freq_full;
    struct dg_cpu_layer *layers;
    int *kv_heads;                 /* [num_layers] KV heads this rank caches */
    struct dg_weight *views;       /* behind the expert view arrays */
    float *pool;                   /* behind every vector above */
    size_t pool_bytes;             /* its size, for the ledger */
};

/* Prepare m (which must outlive cm) for the CPU backend, whole (one rank).
 * Errors: DG_E_NOMEM. */
int dg_cpu_model_init(struct dg_cpu_model *cm, const struct dg_model *m, struct dg_error *err);

/* Prepare rank `rank` of plan, talking through coll (NULL if the plan has
 * one rank); ledger (may be NULL) receives its weight and buffer bytes.
 * Errors: DG_E_INVAL (rank or coll inconsistent with the plan), DG_E_NOMEM. */
int dg_cpu_model_init_rank(struct dg_cpu_model *cm, const struct dg_model *m,
                           const struct dg_tp_plan *plan, int rank, struct dg_coll *coll,
                           struct dg_mem_ledger *ledger, struct dg_error *err);

void dg_cpu_model_free(struct dg_cpu_model *cm);

/* An empty KV cache for this rank's heads, at most max_length positions. */
int dg_cpu_kv_init(const struct dg_cpu_model *cm, struct dg_kv_cache *kv, int64_t max_length,
                   struct dg_error *err);

/* Encoder pass over T tokens at positions kv->length .. +T-1; appends them
 * to kv.  hidden (may be NULL): [T, H] final-normed hidden states (every
 * rank gets them whole).  Errors: DG_E_INVAL (T < 1, an id outside
 * [0, V)), DG_E_RANGE (past the cache's positions), DG_E_NOMEM, and
 * collective failures.  On error kv is unchanged. */
int dg_cpu_encode(const struct dg_cpu_model *cm, struct dg_kv_cache *kv, const int32_t *ids,
                  int64_t T, float *hidden, struct dg_error *err);

/* Decoder pass over a canvas of CL tokens at positions kv->length ..
 * +CL-1, with the self-conditioning input as this rank's partial sum
 * soft [CL, H] of sum_v p_v E[v] (dg_cpu_soft_embed; the whole sum with one
 * rank), or NULL for none.
 * logits: [CL, nv] out, this rank's vocabulary columns.  Errors as
 * dg_cpu_encode. */
int dg_cpu_decode_soft(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                       const int32_t *canvas, int64_t CL, const double *soft, float *logits,
                       struct dg_error *err);

/* Decoder pass self-conditioned on processed logits: sc_logits (NULL: none)
 * holds this rank's columns of CL rows, row t at sc_logits + t *
 * sc_stride (sc_stride >= nv; with one rank, V and the whole rows).  The
 * softmax over the full rows is formed across ranks (a max and a sum
 * all-reduce of CL values).  logits as dg_cpu_decode_soft. */
int dg_cpu_decode(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                  const int32_t *canvas, int64_t CL, const float *sc_logits, int64_t sc_stride,
                  float *logits, struct dg_error *err);

/* This rank's part of the soft embedding, before the scale c:
 * acc[t] = sum_v probs[t, v] E[v0 + v] over its vocabulary rows, probs
 * [CL, nv], in double.  dg_cpu_decode_soft adds the ranks' parts (an
 * all-reduce in double) and multiplies by c: the soft embedding (pi E) c.
 * Errors: DG_E_NOMEM. */
int dg_cpu_soft_embed(const struct dg_cpu_model *cm, const float *probs, int64_t CL, double *acc,
                      struct dg_error *err);

/* sqrt(H) rounded to dtype t (bf16: 53.0 for H = 2816). */
float dg_embed_scale(int hidden, enum dg_dtype t);

#endif
