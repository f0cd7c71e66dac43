/* model-config.c - see model-config.h. */
#include "lib/model-config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-util.h"
#include "lib/quant-config.h"
#include "lib/log.h"

/* Bounds that keep every later size computation far from overflow. */
#define MAX_VOCAB 16777216LL
#define MAX_HIDDEN 65536
#define MAX_WIDTH (1 << 20)
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 4096
#define MAX_EXPERTS 4096
#define MAX_CANVAS 65536
#define MAX_POSITIONS (1LL << 31)

static int get_i(const json_t *o, const char *k, long long lo, long long hi, const char *ctx,
                 int *dst, struct dg_error *err)
{
    long long v;
    int rc = dg_json_get_int(o, k, lo, hi, DG_JSON_OPTIONAL, ctx, &v, err);
    if (rc > 0)
        *dst = (int)v;
    return rc;
}

static int get_req_i(const json_t *o, const char *k, long long lo, long long hi, const char *ctx,
                     int *dst, struct dg_error *err)
{
    long long v;
    int rc = dg_json_get_int(o, k, lo, hi, DG_JSON_REQUIRED, ctx, &v, err);
    if (rc > 0)
        *dst = (int)v;
    return rc;
}

static int parse_rope(const json_t *rp, const char *type, const char *ctx,
                      struct dg_rope_config *r, struct dg_error *err)
{
    json_t *o;
    const char *kind = "default";
    char sub[512];
    int rc;

    rc = dg_json_get_object(rp, type, DG_JSON_OPTIONAL, ctx, &o, err);
    if (rc <= 0)
        return rc; /* absent: keep the default set by the caller */
    snprintf(sub, sizeof sub, "%s%s.", ctx, type);
    if ((rc = dg_json_get_string(o, "rope_type", DG_JSON_OPTIONAL, sub, &kind, err)) < 0)
        return rc;
    if (strcmp(kind, "default") == 0)
        r->kind = DG_ROPE_DEFAULT;
    else if (strcmp(kind, "proportional") == 0)
        r->kind = DG_ROPE_PROPORTIONAL;
    else
        return dg_error_set(err, DG_E_UNSUPPORTED, "%srope_type: '%.64s' is not supported "
                            "(default, proportional)", sub, kind);
    r->theta = 10000.0;
    r->partial_rotary_factor = 1.0;
    r->factor = 1.0;
    if ((rc = dg_json_get_real(o, "rope_theta", 1e-9, 1e300, DG_JSON_OPTIONAL, sub, &r->theta,
                               err)) < 0)
        return rc;
    if ((rc = dg_json_get_real(o, "partial_rotary_factor", 1e-9, 1.0, DG_JSON_OPTIONAL, sub,
                               &r->partial_rotary_factor, err)) < 0)
        return rc;
    if ((rc = dg_json_get_real(o, "factor", 1e-9, 1e9, DG_JSON_OPTIONAL, sub, &r->factor, err)) < 0)
        return rc;
    return 0;
}

/* per_layer_config: {"<layer>": {"head_dim": n, "num_key_value_heads": n}}.
 * Fills per-layer overrides (0 = none). */
static int parse_per_layer(const json_t *plc, const char *ctx, int num_layers, int *hd, int *kv,
                           struct dg_error *err)
{
    const char *key;
    json_t *v;

    json_object_foreach((json_t *)plc, key, v) {
        char *end;
        long idx = strtol(key, &end, 10);
        const char *k2;
        json_t *x;
        char sub[512];

        if (key[0] < '0' || key[0] > '9' || *end || idx < 0 || idx >= num_layers)
            return dg_error_set(err, DG_E_CONFIG,
                                "%sper_layer_config: key '%.32s' is not a layer index in [0, %d)",
                                ctx, key, num_layers);
        if (!json_is_object(v))
            return dg_error_set(err, DG_E_CONFIG, "%sper_layer_config.%s: expected an object, got %s",
                                ctx, key, dg_json_type_name(v));
        snprintf(sub, sizeof sub, "%sper_layer_config.%s.", ctx, key);
        json_object_foreach(v, k2, x) {
            if (strcmp(k2, "head_dim") && strcmp(k2, "num_key_value_heads"))
                return dg_error_set(err, DG_E_UNSUPPORTED,
                                    "%s%.64s: per-layer override not supported (head_dim, "
                                    "num_key_value_heads)", sub, k2);
        }
        int rc;
        if ((rc = get_i(v, "head_dim", 2, MAX_HEAD_DIM, sub, &hd[idx], err)) < 0 ||
            (rc = get_i(v, "num_key_value_heads", 1, MAX_HEADS, sub, &kv[idx], err)) < 0)
            return rc;
    }
    return 0;
}

static int parse_layer_types(const json_t *text, const char *ctx, struct dg_model_config *c,
                             struct dg_error *err)
{
    json_t *lt = json_object_get(text, "layer_types"), *x;
    size_t i;

    if (!lt || json_is_null(lt)) {
        for (int l = 0; l < c->num_layers; l++) /* transformers' default: 5 sliding, 1 full */
            c->layer_kind[l] = (l + 1) % 6 ? DG_LAYER_SLIDING : DG_LAYER_FULL;
    } else {
        if (!json_is_array(lt))
            return dg_error_set(err, DG_E_CONFIG, "%slayer_types: expected an array, got %s", ctx,
                                dg_json_type_name(lt));
        if (json_array_size(lt) != (size_t)c->num_layers)
            return dg_error_set(err, DG_E_CONFIG,
                                "%slayer_types: %zu entries but num_hidden_layers is %d", ctx,
                                json_array_size(lt), c->num_layers);
        json_array_foreach(lt, i, x) {
            const char *s = json_is_string(x) ? json_string_value(x) : "";
            if (strcmp(s, "sliding_attention") == 0)
                c->layer_kind[i] = DG_LAYER_SLIDING;
            else if (strcmp(s, "full_attention") == 0)
                c->layer_kind[i] = DG_LAYER_FULL;
            else
                return dg_error_set(err, DG_E_CONFIG,
                                    "%slayer_types[%zu]: expected \"sliding_attention\" or "
                                    "\"full_attention\"", ctx, i);
        }
    }
    if (c->layer_kind[c->num_layers - 1] != DG_LAYER_FULL) {
        /* transformers forces this (with a warning); do the same for parity */
        dg_log(DG_LOG_WARN, "%slayer_types: last layer must be full_attention; forcing it, as "
               "transformers does", ctx);
        c->layer_kind[c->num_layers - 1] = DG_LAYER_FULL;
    }
    return 0;
}

/* Resolve the global layers' head_dim and KV heads from the flat fields
 * and/or per_layer_config; reject disagreement and mixed shapes. */
static int resolve_global_shape(const json_t *text, const char *ctx, struct dg_model_config *c,
                                struct dg_error *err)
{
    int flat_hd = 0, flat_kv = 0, rc;
    int hd[DG_MAX_LAYERS] = {0}, kv[DG_MAX_LAYERS] = {0};
    json_t *plc = NULL;
    int have_full_hd = 0, full_hd = 0, full_kv = 0, first = -1;

    if ((rc = get_i(text, "global_head_dim", 2, MAX_HEAD_DIM, ctx, &flat_hd, err)) < 0 ||
        (rc = get_i(text, "num_global_key_value_heads", 1, MAX_HEADS, ctx, &flat_kv, err)) < 0 ||
        (rc = dg_json_get_object(text, "per_layer_config", DG_JSON_OPTIONAL, ctx, &plc, err)) < 0)
        return rc;

    if (!plc) {
        c->global_head_dim = flat_hd ? flat_hd : 512; /* transformers' default */
        c->num_global_kv_heads = flat_kv ? flat_kv : c->num_kv_heads;
        return 0;
    }
    if ((rc = parse_per_layer(plc, ctx, c->num_layers, hd, kv, err)) < 0)
        return rc;
    for (int l = 0; l < c->num_layers; l++) {
        int h = hd[l] ? hd[l] : c->head_dim, k = kv[l] ? kv[l] : c->num_kv_heads;
        if (c->layer_kind[l] == DG_LAYER_SLIDING) {
            if (h != c->head_dim || k != c->num_kv_heads)
                return dg_error_set(err, DG_E_UNSUPPORTED,
                                    "%sper_layer_config.%d: overrides a sliding layer's shape; "
                                    "all sliding layers must share head_dim and "
                                    "num_key_value_heads", ctx, l);
            continue;
        }
        if (!have_full_hd) {
            have_full_hd = 1;
            full_hd = h;
            full_kv = k;
            first = l;
        } else if (h != full_hd || k != full_kv) {
            return dg_error_set(err, DG_E_UNSUPPORTED,
                                "%sper_layer_config: full layers %d and %d differ in shape "
                                "(head_dim %d vs %d, kv heads %d vs %d)", ctx, first, l, full_hd,
                                h, full_kv, k);
        }
    }
    if (flat_hd && flat_hd != full_hd)
        return dg_error_set(err, DG_E_CONFIG,
                            "%sglobal_head_dim is %d but per_layer_config gives full layers "
                            "head_dim %d", ctx, flat_hd, full_hd);
    if (flat_kv && flat_kv != full_kv)
        return dg_error_set(err, DG_E_CONFIG,
                            "%snum_global_key_value_heads is %d but per_layer_config gives full "
                            "layers %d KV heads", ctx, flat_kv, full_kv);
    c->global_head_dim = full_hd;
    c->num_global_kv_heads = full_kv;
    return 0;
}

static int parse_text(const json_t *text, const char *ctx, struct dg_model_config *c,
                      struct dg_error *err)
{
    long long v64;
    int rc, flag;
    const char *s;
    json_t *rp = NULL, *jv;
    long long eos[DG_MAX_EOS];
    int n_eos = 0;

    /* transformers' DiffusionGemmaTextConfig class defaults */
    c->vocab_size = 262144;
    c->hidden_size = 2304;
    c->intermediate_size = 9216;
    c->num_layers = 30;
    c->num_heads = 8;
    c->num_kv_heads = 4;
    c->head_dim = 256;
    c->sliding_window = 512;
    c->max_position_embeddings = 131072;
    c->rms_norm_eps = 1e-6;
    c->final_logit_softcapping = 30.0;
    c->pad_token_id = 0;
    c->bos_token_id = 2;
    c->eos_ids[0] = 1;
    c->n_eos = 1;
    c->rope_sliding = (struct dg_rope_config){DG_ROPE_DEFAULT, 10000.0, 1.0, 1.0};
    c->rope_full = (struct dg_rope_config){DG_ROPE_PROPORTIONAL, 1e6, 0.25, 1.0};

    if ((rc = dg_json_get_int(text, "vocab_size", 1, MAX_VOCAB, DG_JSON_OPTIONAL, ctx, &v64, err)) < 0)
        return rc;
    if (rc > 0)
        c->vocab_size = v64;
    if ((rc = get_i(text, "hidden_size", 1, MAX_HIDDEN, ctx, &c->hidden_size, err)) < 0 ||
        (rc = get_i(text, "intermediate_size", 1, MAX_WIDTH, ctx, &c->intermediate_size, err)) < 0 ||
        (rc = get_i(text, "num_hidden_layers", 1, DG_MAX_LAYERS, ctx, &c->num_layers, err)) < 0 ||
        (rc = get_i(text, "num_attention_heads", 1, MAX_HEADS, ctx, &c->num_heads, err)) < 0 ||
        (rc = get_i(text, "num_key_value_heads", 1, MAX_HEADS, ctx, &c->num_kv_heads, err)) < 0 ||
        (rc = get_i(text, "head_dim", 2, MAX_HEAD_DIM, ctx, &c->head_dim, err)) < 0 ||
        (rc = get_i(text, "sliding_window", 1, 1 << 30, ctx, &c->sliding_window, err)) < 0)
        return rc;
    if ((rc = dg_json_get_int(text, "max_position_embeddings", 1, MAX_POSITIONS, DG_JSON_OPTIONAL,
                              ctx, &v64, err)) < 0)
        return rc;
    if (rc > 0)
        c->max_position_embeddings = v64;
    if ((rc = dg_json_get_real(text, "rms_norm_eps", 1e-30, 1.0, DG_JSON_OPTIONAL, ctx,
                               &c->rms_norm_eps, err)) < 0)
        return rc;
    jv = json_object_get(text, "final_logit_softcapping");
    if (jv && json_is_null(jv))
        c->final_logit_softcapping = 0.0; /* explicit null: no softcap */
    else if ((rc = dg_json_get_real(text, "final_logit_softcapping", 1e-6, 1e6, DG_JSON_OPTIONAL,
                                    ctx, &c->final_logit_softcapping, err)) < 0)
        return rc;

    /* the MoE fields default to None in transformers: required here */
    if ((rc = get_req_i(text, "num_experts", 1, MAX_EXPERTS, ctx, &c->num_experts, err)) < 0 ||
        (rc = get_req_i(text, "top_k_experts", 1, MAX_EXPERTS, ctx, &c->top_k_experts, err)) < 0 ||
        (rc = get_req_i(text, "moe_intermediate_size", 1, MAX_WIDTH, ctx,
                        &c->moe_intermediate_size, err)) < 0)
        return rc;

    if ((rc = dg_json_get_string(text, "hidden_activation", DG_JSON_OPTIONAL, ctx, &s, err)) < 0)
        return rc;
    if (rc > 0 && strcmp(s, "gelu_pytorch_tanh") != 0)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "%shidden_activation: '%.64s' is not supported (gelu_pytorch_tanh)",
                            ctx, s);
    flag = 0;
    if ((rc = dg_json_get_bool(text, "attention_bias", DG_JSON_OPTIONAL, ctx, &flag, err)) < 0)
        return rc;
    if (flag)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%sattention_bias: true is not supported", ctx);
    flag = 1;
    if ((rc = dg_json_get_bool(text, "tie_word_embeddings", DG_JSON_OPTIONAL, ctx, &flag, err)) < 0)
        return rc;
    if (!flag)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "%stie_word_embeddings: false is not supported (the LM head is the "
                            "embedding)", ctx);
    if ((rc = dg_json_get_string(text, "use_bidirectional_attention", DG_JSON_OPTIONAL, ctx, &s,
                                 err)) < 0)
        return rc;
    if (rc > 0 && strcmp(s, "vision") != 0)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "%suse_bidirectional_attention: '%.32s' is not supported (null or "
                            "\"vision\")", ctx, s);

    if ((rc = get_i(text, "pad_token_id", 0, MAX_VOCAB, ctx, &c->pad_token_id, err)) < 0 ||
        (rc = get_i(text, "bos_token_id", 0, MAX_VOCAB, ctx, &c->bos_token_id, err)) < 0)
        return rc;
    if ((rc = dg_json_get_int_list(text, "eos_token_id", 0, MAX_VOCAB, DG_JSON_OPTIONAL, ctx, eos,
                                   DG_MAX_EOS, &n_eos, err)) < 0)
        return rc;
    if (rc > 0) {
        for (int i = 0; i < n_eos; i++)
            c->eos_ids[i] = (int)eos[i];
        c->n_eos = n_eos;
    }

    if ((rc = parse_layer_types(text, ctx, c, err)) < 0)
        return rc;
    if ((rc = dg_json_get_object(text, "rope_parameters", DG_JSON_OPTIONAL, ctx, &rp, err)) < 0)
        return rc;
    if (rp) {
        char sub[512];
        snprintf(sub, sizeof sub, "%srope_parameters.", ctx);
        if ((rc = parse_rope(rp, "sliding_attention", sub, &c->rope_sliding, err)) < 0 ||
            (rc = parse_rope(rp, "full_attention", sub, &c->rope_full, err)) < 0)
            return rc;
    }
    return resolve_global_shape(text, ctx, c, err);
}

int dg_model_config_validate(const struct dg_model_config *c, const char *what,
                             struct dg_error *err)
{
    if (c->vocab_size < 1 || c->vocab_size > MAX_VOCAB || c->hidden_size < 1 ||
        c->hidden_size > MAX_HIDDEN || c->num_layers < 1 || c->num_layers > DG_MAX_LAYERS ||
        c->num_heads < 1 || c->num_heads > MAX_HEADS || c->intermediate_size < 1 ||
        c->moe_intermediate_size < 1 || c->self_conditioning_size < 1 || c->canvas_length < 1 ||
        c->canvas_length > MAX_CANVAS || c->sliding_window < 1 || c->max_position_embeddings < 1 ||
        !(c->rms_norm_eps > 0))
        return dg_error_set(err, DG_E_CONFIG, "%s: a size is zero, negative or out of range", what);
    if (c->num_kv_heads < 1 || c->num_heads % c->num_kv_heads)
        return dg_error_set(err, DG_E_CONFIG,
                            "%s: num_attention_heads (%d) is not a multiple of "
                            "num_key_value_heads (%d)", what, c->num_heads, c->num_kv_heads);
    if (c->num_global_kv_heads < 1 || c->num_heads % c->num_global_kv_heads)
        return dg_error_set(err, DG_E_CONFIG,
                            "%s: num_attention_heads (%d) is not a multiple of the full layers' "
                            "KV heads (%d)", what, c->num_heads, c->num_global_kv_heads);
    if (c->head_dim < 2 || c->head_dim % 2 || c->head_dim > MAX_HEAD_DIM)
        return dg_error_set(err, DG_E_CONFIG, "%s: head_dim %d must be even and in [2, %d]", what,
                            c->head_dim, MAX_HEAD_DIM);
    if (c->global_head_dim < 2 || c->global_head_dim % 2 || c->global_head_dim > MAX_HEAD_DIM)
        return dg_error_set(err, DG_E_CONFIG, "%s: global head_dim %d must be even and in [2, %d]",
                            what, c->global_head_dim, MAX_HEAD_DIM);
    if (c->num_experts < 1 || c->top_k_experts < 1 || c->top_k_experts > c->num_experts)
        return dg_error_set(err, DG_E_CONFIG,
                            "%s: top_k_experts (%d) must be in [1, num_experts (%d)]", what,
                            c->top_k_experts, c->num_experts);
    if (c->rope_sliding.kind != DG_ROPE_DEFAULT || c->rope_sliding.partial_rotary_factor != 1.0 ||
        c->rope_sliding.factor != 1.0)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "%s: sliding layers need rope_type default with full rotation", what);
    if (c->rope_full.kind == DG_ROPE_DEFAULT && c->rope_full.partial_rotary_factor != 1.0)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "%s: partial rotation on full layers needs rope_type proportional",
                            what);
    if (!(c->rope_sliding.theta > 0) || !(c->rope_full.theta > 0) || !(c->rope_full.factor > 0))
        return dg_error_set(err, DG_E_CONFIG, "%s: rope_theta and factor must be positive", what);
    if (c->pad_token_id >= c->vocab_size || c->bos_token_id >= c->vocab_size)
        return dg_error_set(err, DG_E_CONFIG, "%s: pad (%d) or bos (%d) id outside the vocabulary "
                            "of %lld", what, c->pad_token_id, c->bos_token_id,
                            (long long)c->vocab_size);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size)
            return dg_error_set(err, DG_E_CONFIG, "%s: eos id %d outside the vocabulary of %lld",
                                what, c->eos_ids[i], (long long)c->vocab_size);
    if (c->layer_kind[c->num_layers - 1] != DG_LAYER_FULL)
        return dg_error_set(err, DG_E_CONFIG, "%s: the last layer must be full_attention", what);
    for (int l = 0; l < c->num_layers; l++)
        if (c->layer_kind[l] != DG_LAYER_SLIDING && c->layer_kind[l] != DG_LAYER_FULL)
            return dg_error_set(err, DG_E_CONFIG, "%s: layer %d has no valid kind", what, l);
    return 0;
}

int dg_model_config_parse(const char *buf, size_t len, const char *what,
                          struct dg_model_config *cfg, struct dg_error *err)
{
    json_t *root, *text = NULL;
    const char *mt = NULL;
    char ctx[512], tctx[600];
    int rc;
    struct dg_model_config c;

    memset(&c, 0, sizeof c);
    root = dg_json_parse(buf, len, what, err);
    if (!root)
        return dg_json_parse_status(err);
    snprintf(ctx, sizeof ctx, "%s: ", what);
    if (!json_is_object(root)) {
        rc = dg_error_set(err, DG_E_CONFIG, "%s: expected a JSON object, got %s", what,
                          dg_json_type_name(root));
        goto out;
    }
    if ((rc = dg_json_get_string(root, "model_type", DG_JSON_REQUIRED, ctx, &mt, err)) < 0)
        goto out;
    c.canvas_length = 256;
    if (strcmp(mt, "diffusion_gemma") == 0) {
        long long eos[DG_MAX_EOS];
        int n_eos = 0, tie = 1;

        if ((rc = dg_json_get_object(root, "text_config", DG_JSON_REQUIRED, ctx, &text, err)) < 0)
            goto out;
        snprintf(tctx, sizeof tctx, "%stext_config.", ctx);
        if ((rc = dg_json_get_string(text, "model_type", DG_JSON_OPTIONAL, tctx, &mt, err)) < 0)
            goto out;
        if (rc > 0 && strcmp(mt, "diffusion_gemma_text") != 0) {
            rc = dg_error_set(err, DG_E_UNSUPPORTED,
                              "%smodel_type: '%.64s' is not diffusion_gemma_text", tctx, mt);
            goto out;
        }
        if ((rc = parse_text(text, tctx, &c, err)) < 0)
            goto out;
        if ((rc = get_i(root, "canvas_length", 1, MAX_CANVAS, ctx, &c.canvas_length, err)) < 0 ||
            (rc = dg_json_get_bool(root, "tie_word_embeddings", DG_JSON_OPTIONAL, ctx, &tie, err)) < 0)
            goto out;
        if (!tie) {
            rc = dg_error_set(err, DG_E_UNSUPPORTED,
                              "%stie_word_embeddings: false is not supported (the encoder and "
                              "decoder stacks share weights)", ctx);
            goto out;
        }
        /* the wrapper's eos list (e.g. [1, 106, 50]) takes precedence */
        if ((rc = dg_json_get_int_list(root, "eos_token_id", 0, MAX_VOCAB, DG_JSON_OPTIONAL, ctx,
                                       eos, DG_MAX_EOS, &n_eos, err)) < 0)
            goto out;
        if (rc > 0) {
            for (int i = 0; i < n_eos; i++)
                c.eos_ids[i] = (int)eos[i];
            c.n_eos = n_eos;
        }
        c.self_conditioning_size = c.intermediate_size;
        if ((rc = get_i(root, "self_conditioning_size", 1, MAX_WIDTH, ctx,
                        &c.self_conditioning_size, err)) < 0)
            goto out;
        {
            const json_t *qc = json_object_get(root, "quantization_config");
            struct dg_quant_config q;
            if (qc && !json_is_null(qc)) {
                if ((rc = dg_quant_config_parse(qc, ctx, &q, err)) < 0)
                    goto out;
                c.fp8 = q.fp8;
                c.fp8_act_per_token = q.act_per_token;
            }
        }
    } else if (strcmp(mt, "diffusion_gemma_text") == 0) {
        if ((rc = parse_text(root, ctx, &c, err)) < 0)
            goto out;
        c.self_conditioning_size = c.intermediate_size;
    } else {
        rc = dg_error_set(err, DG_E_UNSUPPORTED,
                          "%smodel_type: '%.64s' is not a DiffusionGemma model (diffusion_gemma)",
                          ctx, mt);
        goto out;
    }
    rc = dg_model_config_validate(&c, what, err);
    if (rc == 0)
        *cfg = c;
out:
    json_decref(root);
    return rc < 0 ? rc : 0;
}

void dg_model_config_26b(struct dg_model_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 262144;
    c->hidden_size = 2816;
    c->intermediate_size = 2112;
    c->num_layers = 30;
    c->num_heads = 16;
    c->head_dim = 256;
    c->num_kv_heads = 8;
    c->global_head_dim = 512;
    c->num_global_kv_heads = 2;
    c->sliding_window = 1024;
    c->max_position_embeddings = 262144;
    c->rms_norm_eps = 1e-6;
    c->final_logit_softcapping = 30.0;
    c->num_experts = 128;
    c->top_k_experts = 8;
    c->moe_intermediate_size = 704;
    c->rope_sliding = (struct dg_rope_config){DG_ROPE_DEFAULT, 10000.0, 1.0, 1.0};
    c->rope_full = (struct dg_rope_config){DG_ROPE_PROPORTIONAL, 1e6, 0.25, 1.0};
    for (int l = 0; l < c->num_layers; l++)
        c->layer_kind[l] = (l + 1) % 6 ? DG_LAYER_SLIDING : DG_LAYER_FULL;
    c->pad_token_id = 0;
    c->bos_token_id = 2;
    c->eos_ids[0] = 1;
    c->eos_ids[1] = 106;
    c->eos_ids[2] = 50;
    c->n_eos = 3;
    c->canvas_length = 256;
    c->self_conditioning_size = 2112;
}

/* A small preset's shape: the 26B-A4B's configuration with these fields
 * replaced (its layers sliding but for those listed full). */
struct small_preset {
    const char *name;
    int vocab, hidden, inter, sc, layers, full[2], n_full;
    int heads, kv_heads, head_dim, global_head_dim, global_kv_heads;
    int window, max_pos, experts, top_k, moe_inter;
    int eos[2], n_eos, canvas;
};

static const struct small_preset SMALL_PRESETS[] = {
    /* the embedded default: vocabulary 512 (room for the synthetic
     * tokenizer), five sliding layers and one full, canvas 32; eos <eos>
     * and the synthetic tokenizer's <turn|> */
    {"small", 512, 64, 128, 128, 6, {5}, 1, 4, 2, 16, 32, 1, 64, 8192, 8, 2, 32, {1, 6}, 2, 32},
    {"tiny", 131, 32, 48, 48, 3, {2}, 1, 4, 2, 8, 16, 1, 8, 4096, 4, 2, 16, {1}, 1, 16},
};

int dg_model_config_preset(const char *name, struct dg_model_config *c, struct dg_error *err)
{
    const struct small_preset *p = NULL;
    if (strcmp(name, "26b") == 0) {
        dg_model_config_26b(c);
        return 0;
    }
    for (size_t i = 0; i < sizeof SMALL_PRESETS / sizeof SMALL_PRESETS[0]; i++)
        if (strcmp(name, SMALL_PRESETS[i].name) == 0)
            p = &SMALL_PRESETS[i];
    if (!p)
        return dg_error_set(err, DG_E_INVAL, "unknown model preset '%s' (26b, small, tiny)",
                            name);
    dg_model_config_26b(c);
    c->vocab_size = p->vocab;
    c->hidden_size = p->hidden;
    c->intermediate_size = p->inter;
    c->self_conditioning_size = p->sc;
    c->num_layers = p->layers;
    memset(c->layer_kind, 0, sizeof c->layer_kind);
    for (int i = 0; i < p->n_full; i++)
        c->layer_kind[p->full[i]] = DG_LAYER_FULL;
    c->num_heads = p->heads;
    c->num_kv_heads = p->kv_heads;
    c->head_dim = p->head_dim;
    c->global_head_dim = p->global_head_dim;
    c->num_global_kv_heads = p->global_kv_heads;
    c->sliding_window = p->window;
    c->max_position_embeddings = p->max_pos;
    c->num_experts = p->experts;
    c->top_k_experts = p->top_k;
    c->moe_intermediate_size = p->moe_inter;
    memset(c->eos_ids, 0, sizeof c->eos_ids);
    c->n_eos = p->n_eos;
    for (int i = 0; i < p->n_eos; i++)
        c->eos_ids[i] = p->eos[i];
    c->canvas_length = p->canvas;
    return 0;
}

static json_t *rope_json(const struct dg_rope_config *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "rope_type",
                        json_string(r->kind == DG_ROPE_PROPORTIONAL ? "proportional" : "default"));
    json_object_set_new(o, "rope_theta", json_real(r->theta));
    if (r->kind == DG_ROPE_PROPORTIONAL) {
        json_object_set_new(o, "partial_rotary_factor", json_real(r->partial_rotary_factor));
        if (r->factor != 1.0)
            json_object_set_new(o, "factor", json_real(r->factor));
    }
    return o;
}

char *dg_model_config_to_json(const struct dg_model_config *c, int per_layer_form)
{
    json_t *root, *t, *lt, *rp, *eos;
    char *s;

    /* (the calls below are not checked one by one: a failed allocation in
     * any of them leaves a key out, and the watch sees it) */
    dg_json_alloc_watch();
    root = json_object(), t = json_object(), lt = json_array(), rp = json_object();
    eos = json_array();

    for (int l = 0; l < c->num_layers; l++)
        json_array_append_new(lt, json_string(c->layer_kind[l] == DG_LAYER_FULL
                                                  ? "full_attention" : "sliding_attention"));
    json_object_set_new(rp, "full_attention", rope_json(&c->rope_full));
    json_object_set_new(rp, "sliding_attention", rope_json(&c->rope_sliding));
    for (int i = 0; i < c->n_eos; i++)
        json_array_append_new(eos, json_integer(c->eos_ids[i]));

    json_object_set_new(t, "model_type", json_string("diffusion_gemma_text"));
    json_object_set_new(t, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(t, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(t, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(t, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(t, "num_attention_heads", json_integer(c->num_heads));
    json_object_set_new(t, "num_key_value_heads", json_integer(c->num_kv_heads));
    json_object_set_new(t, "head_dim", json_integer(c->head_dim));
    if (per_layer_form) {
        json_t *plc = json_object();
        for (int l = 0; l < c->num_layers; l++) {
            char key[16];
            json_t *o;
            if (c->layer_kind[l] != DG_LAYER_FULL)
                continue;
            o = json_object();
            json_object_set_new(o, "head_dim", json_integer(c->global_head_dim));
            json_object_set_new(o, "num_key_value_heads", json_integer(c->num_global_kv_heads));
            snprintf(key, sizeof key, "%d", l);
            json_object_set_new(plc, key, o);
        }
        json_object_set_new(t, "per_layer_config", plc);
    } else {
        json_object_set_new(t, "global_head_dim", json_integer(c->global_head_dim));
        json_object_set_new(t, "num_global_key_value_heads", json_integer(c->num_global_kv_heads));
    }
    json_object_set_new(t, "layer_types", lt);
    json_object_set_new(t, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(t, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(t, "rms_norm_eps", json_real(c->rms_norm_eps));
    if (c->final_logit_softcapping > 0)
        json_object_set_new(t, "final_logit_softcapping", json_real(c->final_logit_softcapping));
    else
        json_object_set_new(t, "final_logit_softcapping", json_null());
    json_object_set_new(t, "num_experts", json_integer(c->num_experts));
    json_object_set_new(t, "top_k_experts", json_integer(c->top_k_experts));
    json_object_set_new(t, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
    json_object_set_new(t, "hidden_activation", json_string("gelu_pytorch_tanh"));
    json_object_set_new(t, "attention_bias", json_false());
    json_object_set_new(t, "tie_word_embeddings", json_true());
    json_object_set_new(t, "use_bidirectional_attention", json_string("vision"));
    json_object_set_new(t, "rope_parameters", rp);
    json_object_set_new(t, "pad_token_id", json_integer(c->pad_token_id));
    json_object_set_new(t, "bos_token_id", json_integer(c->bos_token_id));
    json_object_set_new(t, "eos_token_id", json_integer(c->n_eos ? c->eos_ids[0] : 1));

    json_object_set_new(root, "architectures",
                        json_pack("[s]", "DiffusionGemmaForBlockDiffusion"));
    json_object_set_new(root, "model_type", json_string("diffusion_gemma"));
    json_object_set_new(root, "canvas_length", json_integer(c->canvas_length));
    json_object_set_new(root, "tie_word_embeddings", json_true());
    json_object_set_new(root, "eos_token_id", eos);
    if (c->self_conditioning_size != c->intermediate_size)
        json_object_set_new(root, "self_conditioning_size",
                            json_integer(c->self_conditioning_size));
    json_object_set_new(root, "text_config", t);
    if (c->fp8) {
        /* the tensors left in bf16 that a Linear-targeting scheme would
         * otherwise cover: the LM head and the routers */
        const struct dg_quant_config q = {1, c->fp8_act_per_token};
        char names[DG_MAX_LAYERS][48];
        const char *ign[DG_MAX_LAYERS + 1];
        ign[0] = "lm_head";
        for (int l = 0; l < c->num_layers; l++) {
            snprintf(names[l], sizeof names[l], "model.decoder.layers.%d.router.proj", l);
            ign[l + 1] = names[l];
        }
        json_object_set_new(root, "quantization_config",
                            dg_quant_config_json(&q, ign, c->num_layers + 1));
    }
    s = dg_json_dumps_watched(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(root);
    return s;
}

void dg_generation_config_defaults(struct dg_generation_config *g)
{
    memset(g, 0, sizeof *g);
    g->max_new_tokens = 256;
    g->max_denoising_steps = 48;
    g->entropy_bound = 0.1;
    g->t_min = 0.4;
    g->t_max = 0.8;
    g->stability_threshold = 1;
    g->confidence_threshold = 0.005;
    g->n_eos = 0;
    g->pad_token_id = -1;
}

int dg_generation_config_parse(const char *buf, size_t len, const char *what,
                               struct dg_generation_config *out, struct dg_error *err)
{
    struct dg_generation_config g;
    json_t *root, *sc = NULL;
    char ctx[512], sctx[600];
    long long eos[DG_MAX_EOS];
    int n_eos = 0, rc;

    dg_generation_config_defaults(&g);
    root = dg_json_parse(buf, len, what, err);
    if (!root)
        return dg_json_parse_status(err);
    snprintf(ctx, sizeof ctx, "%s: ", what);
    if (!json_is_object(root)) {
        rc = dg_error_set(err, DG_E_CONFIG, "%s: expected a JSON object, got %s", what,
                          dg_json_type_name(root));
        goto out;
    }
    if ((rc = get_i(root, "max_new_tokens", 1, 1 << 30, ctx, &g.max_new_tokens, err)) < 0 ||
        (rc = get_i(root, "max_denoising_steps", 1, 1 << 20, ctx, &g.max_denoising_steps, err)) < 0 ||
        (rc = get_i(root, "stability_threshold", 0, 1 << 20, ctx, &g.stability_threshold, err)) < 0 ||
        (rc = dg_json_get_real(root, "t_min", 0.0, 1e6, DG_JSON_OPTIONAL, ctx, &g.t_min, err)) < 0 ||
        (rc = dg_json_get_real(root, "t_max", 0.0, 1e6, DG_JSON_OPTIONAL, ctx, &g.t_max, err)) < 0 ||
        (rc = dg_json_get_real(root, "confidence_threshold", 1e-300, 1e6, DG_JSON_OPTIONAL, ctx,
                               &g.confidence_threshold, err)) < 0 ||
        (rc = get_i(root, "pad_token_id", 0, MAX_VOCAB, ctx, &g.pad_token_id, err)) < 0)
        goto out;
    if ((rc = dg_json_get_int_list(root, "eos_token_id", 0, MAX_VOCAB, DG_JSON_OPTIONAL, ctx, eos,
                                   DG_MAX_EOS, &n_eos, err)) < 0)
        goto out;
    for (int i = 0; i < n_eos; i++)
        g.eos_ids[i] = (int)eos[i];
    g.n_eos = n_eos;
    if ((rc = dg_json_get_object(root, "sampler_config", DG_JSON_OPTIONAL, ctx, &sc, err)) < 0)
        goto out;
    if (sc) {
        const char *cls = NULL;
        snprintf(sctx, sizeof sctx, "%ssampler_config.", ctx);
        if ((rc = dg_json_get_string(sc, "_cls_name", DG_JSON_OPTIONAL, sctx, &cls, err)) < 0)
            goto out;
        if (cls && strcmp(cls, "EntropyBoundSamplerConfig") != 0) {
            rc = dg_error_set(err, DG_E_UNSUPPORTED,
                              "%s_cls_name: '%.64s' is not supported (EntropyBoundSamplerConfig)",
                              sctx, cls);
            goto out;
        }
        if ((rc = dg_json_get_real(sc, "entropy_bound", 1e-300, 1e6, DG_JSON_OPTIONAL, sctx,
                                   &g.entropy_bound, err)) < 0)
            goto out;
    }
    if (!(g.t_max > g.t_min)) {
        rc = dg_error_set(err, DG_E_CONFIG, "%st_max (%g) must be greater than t_min (%g)", ctx,
                          g.t_max, g.t_min);
        goto out;
    }
    rc = 0;
    *out = g;
out:
    json_decref(root);
    return rc < 0 ? rc : 0;
}
