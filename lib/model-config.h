/*
 * model-config.h - the DiffusionGemma configuration (config.json and
 * generation_config.json), parsed and validated.
 *
 * Accepted config.json forms (model.md §1, §11):
 *   - the wrapper, model_type "diffusion_gemma", with a text_config object
 *     (model_type "diffusion_gemma_text") and wrapper fields canvas_length,
 *     tie_word_embeddings, eos_token_id;
 *   - a bare text config, model_type "diffusion_gemma_text".
 * The global (full-attention) layers' shape comes either from the released
 * flat fields global_head_dim / num_global_key_value_heads or from
 * transformers 5.17's per_layer_config {"<layer>": {head_dim,
 * num_key_value_heads}}; both may be present only if they agree.  Absent
 * fields take Hugging Face's class defaults, so a config reads the way
 * transformers reads it.
 *
 * Engine restrictions (clear DG_E_UNSUPPORTED errors): gelu_pytorch_tanh
 * activation, no attention bias, tied embeddings, every sliding layer one
 * shape and every full layer one shape, RoPE types default (sliding) and
 * default/proportional (full), use_bidirectional_attention not "all".
 */
#ifndef DG_MODEL_CONFIG_H
#define DG_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

#define DG_MAX_LAYERS 256
#define DG_MAX_EOS 16

enum dg_layer_kind { DG_LAYER_SLIDING = 0, DG_LAYER_FULL = 1 };

enum dg_rope_kind { DG_ROPE_DEFAULT = 0, DG_ROPE_PROPORTIONAL = 1 };

struct dg_rope_config {
    enum dg_rope_kind kind;
    double theta;                 /* base wavelength */
    double partial_rotary_factor; /* proportional: fraction of head_dim that rotates */
    double factor;                /* proportional: inverse frequencies divided by this */
};

struct dg_model_config {
    /* text backbone */
    int64_t vocab_size;
    int hidden_size;
    int intermediate_size;        /* dense MLP width; also the self-conditioning MLP width */
    int num_layers;
    int num_heads;                /* query heads, every layer */
    int head_dim;                 /* sliding layers */
    int num_kv_heads;             /* sliding layers */
    int global_head_dim;          /* full layers */
    int num_global_kv_heads;      /* full layers */
    int sliding_window;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double final_logit_softcapping; /* 0 = none */
    int num_experts;
    int top_k_experts;
    int moe_intermediate_size;
    struct dg_rope_config rope_sliding, rope_full;
    unsigned char layer_kind[DG_MAX_LAYERS]; /* enum dg_layer_kind per layer */
    int pad_token_id, bos_token_id;
    int eos_ids[DG_MAX_EOS];
    int n_eos;
    /* wrapper */
    int canvas_length;
    int self_conditioning_size;   /* = intermediate_size unless the config says otherwise */
    /* quantization_config (lib/quant-config.h): FP8 E4M3 weights with
     * per-channel scales; activations quantized per token at run time */
    int fp8;
    int fp8_act_per_token;
};

struct dg_generation_config {
    int max_new_tokens;
    int max_denoising_steps;
    double entropy_bound;
    double t_min, t_max;
    int stability_threshold;
    double confidence_threshold;
    int eos_ids[DG_MAX_EOS];      /* stop ids; n_eos == 0 means "use the model config's" */
    int n_eos;
    int pad_token_id;             /* -1 when unset */
};

/* Parse and validate config.json text.  what names the file in errors.
 * Errors: DG_E_FORMAT (not JSON), DG_E_RANGE (a number past an int64 or a
 * double), DG_E_CONFIG (missing/mistyped/out-of-range values, inconsistent
 * shapes), DG_E_UNSUPPORTED, DG_E_NOMEM. */
int dg_model_config_parse(const char *buf, size_t len, const char *what,
                          struct dg_model_config *cfg, struct dg_error *err);

/* Check the invariants dg_model_config_parse enforces on a config built in
 * code (e.g. by a test or the random-weight mode). */
int dg_model_config_validate(const struct dg_model_config *cfg, const char *what,
                             struct dg_error *err);

/* The released google/diffusiongemma-26B-A4B-it configuration. */
void dg_model_config_26b(struct dg_model_config *cfg);

/* Named configurations: "26b" (the release); "small" (the embedded
 * default model: vocabulary 512, hidden 64, 5 sliding layers + 1 full,
 * window 64, 8 experts with top 2, canvas 32, stop ids <eos> and <turn|>
 * of the synthetic tokenizer); "tiny" (a few-KB model that still has every
 * feature: an odd vocabulary of 131, sliding window 8, two sliding layers
 * and one full layer with its own head shape, 4 experts with top 2, canvas
 * 16).  Returns 0, or -DG_E_INVAL for an unknown name. */
int dg_model_config_preset(const char *name, struct dg_model_config *cfg, struct dg_error *err);

/* Serialise as a transformers-compatible wrapper config.json.  With
 * per_layer_form != 0 the global layer shape is written the way
 * transformers 5.17 save_pretrained writes it (per_layer_config), else as
 * the released flat fields.  Returns a malloc'd string or NULL on ENOMEM. */
char *dg_model_config_to_json(const struct dg_model_config *cfg, int per_layer_form);

static inline int dg_layer_head_dim(const struct dg_model_config *c, int layer)
{
    return c->layer_kind[layer] == DG_LAYER_FULL ? c->global_head_dim : c->head_dim;
}

static inline int dg_layer_kv_heads(const struct dg_model_config *c, int layer)
{
    return c->layer_kind[layer] == DG_LAYER_FULL ? c->num_global_kv_heads : c->num_kv_heads;
}

/* Hugging Face's defaults for generation (used where the file is silent). */
void dg_generation_config_defaults(struct dg_generation_config *g);

/* Parse generation_config.json text over the defaults; null values keep
 * the default.  Validation follows transformers' rules (t_max > t_min >= 0,
 * entropy_bound > 0, confidence_threshold > 0, stability_threshold >= 0,
 * max_denoising_steps > 0).  Errors as dg_model_config_parse's. */
int dg_generation_config_parse(const char *buf, size_t len, const char *what,
                               struct dg_generation_config *g, struct dg_error *err);

#endif
