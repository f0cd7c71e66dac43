/*
 * model-weights.h - the engine's view of a DiffusionGemma text stack, and
 * the catalogue of checkpoint tensors that fills it.
 *
 * One text stack serves both modes (model.md §2.2): every weight is read
 * from model.decoder.*; the two layer_scalar copies are kept apart
 * (encoder copy from model.encoder.language_model.layers.L.layer_scalar,
 * decoder copy from model.decoder.layers.L.layer_scalar).  Experts come
 * either as packed banks (experts.gate_up_proj [E, 2I, H], experts.down_proj
 * [E, H, I]) or per expert (experts.<e>.{gate,up,down}_proj.weight); either
 * way the engine sees one 2-D view per expert and projection.  Vision
 * tensors (model.encoder.vision_tower.*, model.encoder.embed_vision.*) are
 * skipped; anything else unexpected is an error.
 *
 * Weights are views into the checkpoint's mappings: a dg_model borrows the
 * dg_checkpoint it was bound from, which must outlive it.
 */
#ifndef DG_MODEL_WEIGHTS_H
#define DG_MODEL_WEIGHTS_H

#include <stdint.h>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/model-config.h"

struct dg_checkpoint;

/* A row-major matrix [rows, cols] (vectors: rows = 1) in checkpoint memory;
 * rows lie stride elements apart (0: cols; a column slice has more).  An
 * F8_E4M3 matrix has a scale per row (its output channel): row j is
 * e4m3(data[j, :]) * scale[j], scale of scale_dtype (BF16, F16, F32). */
struct dg_weight {
    const void *data;    /* NULL when the tensor does not exist (v_proj of full layers) */
    enum dg_dtype dtype;
    int64_t rows, cols;
    int64_t stride;
    const char *name;    /* checkpoint tensor name (owned by the checkpoint) */
    const void *scale;   /* F8_E4M3: [rows] scales, else NULL */
    enum dg_dtype scale_dtype;
};

/* Views of rows [r0, r1) and of columns [c0, c1) of w. */
static inline struct dg_weight dg_weight_rows(const struct dg_weight *w, int64_t r0, int64_t r1)
{
    struct dg_weight v = *w;
    const int64_t stride = w->stride ? w->stride : w->cols;
    v.data = w->data ? (const unsigned char *)w->data +
                           (size_t)(r0 * stride) * dg_dtype_size(w->dtype)
                     : NULL;
    v.scale = w->scale ? (const unsigned char *)w->scale +
                             (size_t)r0 * dg_dtype_size(w->scale_dtype)
                       : NULL;
    v.rows = r1 - r0;
    v.stride = stride;
    return v;
}

static inline struct dg_weight dg_weight_cols(const struct dg_weight *w, int64_t c0, int64_t c1)
{
    struct dg_weight v = *w;
    v.data = w->data ? (const unsigned char *)w->data + (size_t)c0 * dg_dtype_size(w->dtype)
                     : NULL;
    v.cols = c1 - c0;
    v.stride = w->stride ? w->stride : w->cols;
    return v;
}

struct dg_layer_weights {
    struct dg_weight input_norm;      /* [H] */
    struct dg_weight q_proj;          /* [nh*hd, H] */
    struct dg_weight k_proj;          /* [nkv*hd, H] */
    struct dg_weight v_proj;          /* [nkv*hd, H]; absent on full layers (V = raw K) */
    struct dg_weight o_proj;          /* [H, nh*hd] */
    struct dg_weight q_norm, k_norm;  /* [hd] */
    struct dg_weight post_attn_norm;  /* [H] */
    struct dg_weight pre_ffn_norm;    /* [H]  dense MLP pre-norm */
    struct dg_weight mlp_gate, mlp_up;/* [I, H] */
    struct dg_weight mlp_down;        /* [H, I] */
    struct dg_weight post_ffn_norm_1; /* [H]  dense MLP post-norm */
    struct dg_weight router_proj;     /* [E, H] */
    struct dg_weight router_scale;    /* [H] */
    struct dg_weight router_expert_scale; /* [E] */
    struct dg_weight pre_ffn_norm_2;  /* [H]  MoE pre-norm */
    struct dg_weight post_ffn_norm_2; /* [H]  MoE post-norm */
    struct dg_weight post_ffn_norm;   /* [H]  norm of dense + MoE */
    struct dg_weight *expert_gate;    /* [E] views, each [Im, H] */
    struct dg_weight *expert_up;      /* [E] views, each [Im, H] */
    struct dg_weight *expert_down;    /* [E] views, each [H, Im] */
    int experts_packed;               /* 1: packed banks; 0: per-expert tensors */
    float scalar_encoder, scalar_decoder;
};

struct dg_model_stats {
    uint64_t n_tensors;                  /* text tensors bound */
    uint64_t params_total;               /* elements in bound text tensors */
    uint64_t params_embedding;
    uint64_t params_experts;
    uint64_t params_active;              /* per token: all but experts, + top_k/E of experts */
    uint64_t bytes_by_dtype[DG_DTYPE_COUNT];
    uint64_t ignored_tensors, ignored_bytes; /* vision tower etc. */
};

struct dg_model {
    struct dg_model_config cfg;
    struct dg_weight embed;           /* [V, H], also the LM head */
    struct dg_weight final_norm;      /* [H] */
    struct dg_weight sc_pre_norm;     /* [H] */
    struct dg_weight sc_gate, sc_up;  /* [S, H] */
    struct dg_weight sc_down;         /* [H, S] */
    struct dg_layer_weights *layers;  /* [num_layers] */
    struct dg_model_stats stats;
};

/* ---- the catalogue: every tensor a config implies ---------------------- */

enum dg_expert_layout { DG_EXPERTS_PACKED = 0, DG_EXPERTS_PER_EXPERT = 1 };

enum dg_cat_role {
    DG_CAT_PLAIN = 0,      /* bound directly into *dst */
    DG_CAT_BANK_GATE_UP,   /* packed [E, 2Im, H]: split into expert_gate/expert_up */
    DG_CAT_BANK_DOWN,      /* packed [E, H, Im]: split into expert_down */
    DG_CAT_SCALAR_ENC,     /* [1] read into scalar_encoder */
    DG_CAT_SCALAR_DEC,     /* [1] read into scalar_decoder */
};

struct dg_cat_entry {
    char name[128];
    int ndim;
    int64_t shape[3];
    enum dg_cat_role role;
    int layer;             /* -1 for globals */
    struct dg_weight *dst; /* PLAIN: where the view goes; NULL when building without a model */
};

struct dg_catalog {
    int n;
    struct dg_cat_entry *entries;
};

/* List the tensors cfg implies, in a stable order (globals, then layer by
 * layer), with layout[l] choosing each layer's expert form (NULL: all
 * packed).  With m != NULL, m->layers must be allocated and PLAIN entries
 * point into m.  Errors: DG_E_NOMEM. */
int dg_catalog_build(const struct dg_model_config *cfg, const enum dg_expert_layout *layout,
                     struct dg_model *m, struct dg_catalog *cat, struct dg_error *err);

void dg_catalog_free(struct dg_catalog *cat);

/* True for names a text engine skips (the vision tower and its projection). */
int dg_tensor_name_ignored(const char *name);

/* ---- binding ----------------------------------------------------------- */

/* Fill m from the checkpoint: every catalogue tensor must exist with a
 * float dtype (BF16, F16, F32) and exactly the catalogue's shape, and every
 * checkpoint tensor must be either catalogued or ignored.  Matrices other
 * than the embedding, stored per tensor (not in packed expert banks), may
 * be F8_E4M3 when config.json has an FP8 quantization_config
 * (quant-config.h): "<x>.weight" then needs "<x>.weight_scale" of shape
 * [rows, 1] or [rows], a float dtype, every value finite and >= 0.  Errors name the
 * file and tensor: DG_E_MISSING (with a hint when an unexpected tensor looks
 * like a misspelling of the missing one), DG_E_EXTRA, DG_E_SHAPE,
 * DG_E_DTYPE, DG_E_CONFIG (non-finite layer_scalar, mixed expert forms in
 * one layer), DG_E_NOMEM.  On failure m is left empty. */
int dg_model_bind(const struct dg_checkpoint *ck, struct dg_model *m, struct dg_error *err);

void dg_model_free(struct dg_model *m);

/* Whether any weight of m is FP8 (dtype F8_E4M3). */
int dg_model_has_fp8(const struct dg_model *m);

#endif
