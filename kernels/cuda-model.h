/*
 * cuda-model.h - a DiffusionGemma text stack's weights on one GPU, in one
 * device allocation, all of one element type (kernels/ops.h): bf16 (the
 * serving form) or fp32 (an fp32 checkpoint at the CPU reference's
 * precision).  Uploaded from a bound checkpoint (converting as needed) or,
 * bf16 only, made up on the GPU from a config alone (random matrices
 * N(0, 0.02), norm weights and layer scalars 1), so the full 26B-A4B
 * shapes can run without a 50 GB file.
 *
 * Layout (row-major, the forward pass's operands as they are used):
 *   embed [V, H]                (token embedding and LM head)
 *   per layer: q_proj [nh*hd, H], k_proj [nkv*hd, H], v_proj (sliding
 *   layers) [nkv*hd, H], o_proj [H, nh*hd], mlp_gu [2I, H] (gate rows then
 *   up rows), mlp_down [H, I], router_proj [E, H], expert banks
 *   exp_gu [E, 2Im, H] and exp_down [E, H, Im]; norm vectors bf16; the
 *   router's per-expert scale fp32 [E]
 *   self-conditioning: sc_gu [2S, H], sc_down [H, S]
 *   RoPE inverse frequencies fp32 for both layer kinds
 * Layer scalars stay on the host.
 *
 * FP8 (W8A8, the FP8-dynamic layout): the projections and the expert banks
 * (q, k, v, o, the dense MLP, the experts, the self-conditioning MLP) are
 * E4M3 bytes with an fp32 scale per row held (the *_s vectors, in the
 * order the rows are held), activations quantized per token as they are
 * used; embedding, norms and router stay bf16.  A matrix whose *_s is NULL
 * is bf16.  From a checkpoint a matrix is FP8 where its tensors are
 * F8_E4M3; random weights are FP8 throughout when asked for (each row
 * drawn as the bf16 model's, then quantized).
 *
 * As rank r of a tensor-parallel plan each of those holds only its slice
 * (the fields below say which), laid out the same way: embed [nv, H],
 * q_proj [nq*hd, H], k/v_proj [nkv*hd, H] (the KV heads its query heads
 * read), o_proj [H, nq*hd], mlp_gu [2w, H] (its gate rows, then its up
 * rows), mlp_down [H, w], exp_gu [n_exp, 2w', H], exp_down [n_exp, H, w'];
 * norms, router and the self-conditioning MLP whole.  Random weights are
 * the whole model's values at the slice's places (dg_cuda_fill_normal_rect),
 * so any split of a seed computes the same model.
 */
#ifndef DG_KERNELS_CUDA_MODEL_H
#define DG_KERNELS_CUDA_MODEL_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"
#include "lib/model-config.h"
#include "lib/model-weights.h"
#include "lib/tp-plan.h"

struct dg_cuda_layer {
    int hd, sliding;
    int kv0, nkv;               /* KV heads kv0 .. kv0+nkv-1 held here */
    /* elements of the model's type */
    void *input_norm, *q_norm, *k_norm, *post_attn_norm;
    void *pre_ffn_norm, *post_ffn_norm_1, *router_scale, *pre_ffn_norm_2;
    void *post_ffn_norm_2, *post_ffn_norm;
    float *router_expert_scale;
    void *q_proj, *k_proj, *v_proj, *o_proj;      /* v_proj NULL on full layers */
    void *mlp_gu, *mlp_down, *router_proj;
    void *exp_gu, *exp_down;
    /* FP8: each matrix's row scales (NULL: that matrix is bf16) */
    float *q_proj_s, *k_proj_s, *v_proj_s, *o_proj_s, *mlp_gu_s, *mlp_down_s;
    float *exp_gu_s, *exp_down_s;
    const float *inv_freq;                         /* the layer kind's table */
    float scalar_encoder, scalar_decoder;
};

struct dg_cuda_model {
    struct dg_model_config cfg;
    int dev;
    /* this rank's part of a tensor-parallel plan (lib/tp-plan.h; the whole
     * model as rank 0 of 1): vocabulary rows v0 .. v0+nv of embed, query
     * heads q0 .. q0+nq-1 (q_proj rows, o_proj columns), dense MLP columns
     * mlp0 .. mlp0+mlp_w-1, experts e0 .. e0+n_exp-1 each of width
     * exp_w (columns exp0 .. of every expert's Im) */
    int rank, n_ranks;
    int64_t v0, nv;
    int q0, nq, mlp0, mlp_w, e0, n_exp, exp0, exp_w;
    enum dg_elt elt;             /* every weight's element type */
    float embed_scale;           /* sqrt(H) rounded to the checkpoint's dtype (bf16) */
    void *embed, *final_norm, *sc_pre_norm, *sc_gu, *sc_down;
    float *sc_gu_s, *sc_down_s;  /* FP8 row scales, or NULL */
    int fp8;                     /* some matrix is FP8 (activations quantized per token) */
    float *inv_freq_sliding, *inv_freq_full;
    struct dg_cuda_layer *layers;
    void *arena;                 /* behind every pointer above */
    uint64_t bytes;              /* the arena's size */
};

/* The model m (bound from a checkpoint) on GPU dev, which must be the
 * calling thread's current GPU, as elements of type elt.  Errors:
 * DG_E_INVAL, DG_E_NOMEM (host or device), DG_E_CUDA. */
int dg_cuda_model_upload(struct dg_cuda_model *cm, const struct dg_model *m, enum dg_elt elt,
                         int dev, struct dg_error *err);

/* Random weights for cfg on GPU dev, a function of seed alone (see the top
 * of this file).  Errors as dg_cuda_model_upload. */
int dg_cuda_model_random(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                         uint64_t seed, int dev, struct dg_error *err);

/* Random FP8 weights (fp8 non-zero: every projection and expert matrix
 * E4M3 with row scales, see the top of this file) or bf16 ones. */
int dg_cuda_model_random_q_rank(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                                uint64_t seed, int fp8, const struct dg_tp_plan *plan, int rank,
                                int dev, struct dg_error *err);

/* The unit in which the CUDA backend's tensor-parallel plan splits the
 * dense MLP's and the experts' widths (dg_tp_plan_build_aligned): the FP8
 * GEMM takes gate/up rows (twice a rank's width) in multiples of 64 and
 * down's columns (its width) in multiples of 16.  26B-A4B's dense MLP of
 * 2,112 at TP=4: 512, 544, 512, 544, where 528 each would not fit. */
#define DG_CUDA_WIDTH_ALIGN 32

/* Rank `rank` of plan only (plan NULL: the whole model, as above).  An FP8
 * checkpoint uploads as FP8 (elt must be bf16); it needs per-token
 * activation quantization (W8A8), and every FP8 matrix as held here must
 * fit the FP8 GEMM (rows a multiple of 64, columns of 16): else
 * DG_E_UNSUPPORTED. */
int dg_cuda_model_upload_rank(struct dg_cuda_model *cm, const struct dg_model *m,
                              enum dg_elt elt, const struct dg_tp_plan *plan, int rank, int dev,
                              struct dg_error *err);
int dg_cuda_model_random_rank(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                              uint64_t seed, const struct dg_tp_plan *plan, int rank, int dev,
                              struct dg_error *err);

/* Bytes the weights of cfg take on the GPU as elements of type elt (rank
 * `rank` of plan; plan NULL: the whole model). */
uint64_t dg_cuda_model_bytes(const struct dg_model_config *cfg, enum dg_elt elt);
uint64_t dg_cuda_model_bytes_rank(const struct dg_model_config *cfg, enum dg_elt elt,
                                  const struct dg_tp_plan *plan, int rank);

void dg_cuda_model_free(struct dg_cuda_model *cm);

#endif
