/*
 * Description: config.json and generation_config.json parsing.  The
 * released 26B-A4B config (flat global fields) and a config saved by
 * transformers 5.17 (per_layer_config form, null generation fields) both
 * load; transformers' defaults fill absent fields; each out-of-range,
 * inconsistent or unsupported value is refused with an error naming the
 * file and key; serialising and re-parsing gives the same config.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "lib/log.h"
#include "lib/model-config.h"
#include "tests/harness.h"

#define RELEASED "tests/fixtures/released-26b-config.json"
#define RELEASED_GEN "tests/fixtures/released-26b-generation_config.json"
#define HF_TINY "tests/fixtures/hf-5.17-tiny/config.json"
#define HF_TINY_GEN "tests/fixtures/hf-5.17-tiny/generation_config.json"

static int parse_file(const char *path, struct dg_model_config *c, struct dg_error *err)
{
    char *buf;
    size_t len;
    int rc = dg_file_read(path, 1 << 20, &buf, &len, err);
    if (rc)
        return rc;
    rc = dg_model_config_parse(buf, len, path, c, err);
    free(buf);
    return rc;
}

/* Load a fixture, set (or with value == NULL delete) the key at a dotted
 * path such as "text_config.top_k_experts", and parse the result as
 * "c.json".  Steals value. */
static int parse_edited(const char *fixture, const char *dotted, json_t *value,
                        struct dg_model_config *c, struct dg_error *err)
{
    json_error_t je;
    json_t *root = json_load_file(fixture, 0, &je), *obj;
    char path[256], *key, *dot;
    char *text;
    int rc;

    if (!root) {
        json_decref(value);
        return dg_error_set(err, DG_E_IO, "cannot load fixture %s: %s", fixture, je.text);
    }
    snprintf(path, sizeof path, "%s", dotted);
    obj = root;
    key = path;
    while ((dot = strchr(key, '.'))) {
        *dot = '\0';
        obj = json_object_get(obj, key);
        key = dot + 1;
    }
    if (value)
        json_object_set_new(obj, key, value);
    else
        json_object_del(obj, key);
    text = json_dumps(root, 0);
    json_decref(root);
    rc = dg_model_config_parse(text, strlen(text), "c.json", c, err);
    free(text);
    return rc;
}

static int case_released_config(void)
{
    struct dg_model_config c, want;
    struct dg_error err = {0};

    CHECK_OK(parse_file(RELEASED, &c, &err), &err);
    dg_model_config_26b(&want);
    CHECK(c.vocab_size == 262144 && c.hidden_size == 2816 && c.intermediate_size == 2112);
    CHECK(c.num_layers == 30 && c.num_heads == 16 && c.num_kv_heads == 8 && c.head_dim == 256);
    CHECK(c.global_head_dim == 512 && c.num_global_kv_heads == 2 && c.sliding_window == 1024);
    CHECK(c.num_experts == 128 && c.top_k_experts == 8 && c.moe_intermediate_size == 704);
    CHECK(c.canvas_length == 256 && c.self_conditioning_size == 2112);
    CHECK(c.final_logit_softcapping == 30.0 && c.rms_norm_eps == 1e-6);
    CHECK(c.rope_full.kind == DG_ROPE_PROPORTIONAL && c.rope_full.partial_rotary_factor == 0.25 &&
          c.rope_full.theta == 1e6 && c.rope_sliding.kind == DG_ROPE_DEFAULT &&
          c.rope_sliding.theta == 10000.0);
    CHECK(c.n_eos == 3 && c.eos_ids[0] == 1 && c.eos_ids[1] == 106 && c.eos_ids[2] == 50);
    for (int l = 0; l < 30; l++)
        CHECKF(c.layer_kind[l] == ((l % 6 == 5) ? DG_LAYER_FULL : DG_LAYER_SLIDING), "layer %d", l);
    /* the built-in 26b preset says the same */
    CHECK(memcmp(c.layer_kind, want.layer_kind, sizeof c.layer_kind) == 0);
    CHECK(want.vocab_size == c.vocab_size && want.global_head_dim == c.global_head_dim &&
          want.num_global_kv_heads == c.num_global_kv_heads && want.n_eos == c.n_eos);
    CHECK(dg_layer_head_dim(&c, 5) == 512 && dg_layer_kv_heads(&c, 5) == 2 &&
          dg_layer_head_dim(&c, 4) == 256 && dg_layer_kv_heads(&c, 4) == 8);
    return 0;
}

static int case_transformers_5_17_saved_config(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_OK(parse_file(HF_TINY, &c, &err), &err);
    CHECK(c.vocab_size == 1001 && c.hidden_size == 64 && c.num_layers == 3);
    CHECK(c.head_dim == 16 && c.num_kv_heads == 2);
    CHECK(c.global_head_dim == 32 && c.num_global_kv_heads == 1); /* from per_layer_config */
    CHECK(c.layer_kind[2] == DG_LAYER_FULL && c.layer_kind[0] == DG_LAYER_SLIDING);
    CHECK(c.canvas_length == 16 && c.sliding_window == 8);
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 1);
    return 0;
}

static int case_both_global_forms_must_agree(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_OK(parse_edited(HF_TINY, "text_config.global_head_dim", json_integer(32), &c, &err), &err);
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.global_head_dim", json_integer(512), &c, &err),
                &err, DG_E_CONFIG,
                "c.json: text_config.global_head_dim is 512 but per_layer_config gives full "
                "layers head_dim 32");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.num_global_key_value_heads", json_integer(2),
                             &c, &err), &err, DG_E_CONFIG,
                "num_global_key_value_heads is 2 but per_layer_config gives full layers 1 KV heads");
    return 0;
}

static int case_per_layer_config_errors(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_FAILS(parse_edited(HF_TINY, "text_config.per_layer_config.0",
                             json_pack("{s:i}", "head_dim", 32), &c, &err), &err, DG_E_UNSUPPORTED,
                "per_layer_config.0: overrides a sliding layer's shape");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.per_layer_config.7",
                             json_pack("{s:i}", "head_dim", 32), &c, &err), &err, DG_E_CONFIG,
                "per_layer_config: key '7' is not a layer index in [0, 3)");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.per_layer_config.x",
                             json_pack("{s:i}", "head_dim", 32), &c, &err), &err, DG_E_CONFIG,
                "key 'x' is not a layer index");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.per_layer_config.2",
                             json_pack("{s:i}", "sliding_window", 4), &c, &err), &err,
                DG_E_UNSUPPORTED, "per_layer_config.2.sliding_window: per-layer override not supported");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.per_layer_config.2", json_string("x"), &c, &err),
                &err, DG_E_CONFIG, "per_layer_config.2: expected an object, got a string");
    return 0;
}

static int case_full_layers_must_share_a_shape(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};
    json_t *plc = json_pack("{s:{s:i,s:i},s:{s:i,s:i}}", "5", "head_dim", 512,
                            "num_key_value_heads", 2, "11", "head_dim", 256,
                            "num_key_value_heads", 2);

    CHECK_FAILS(parse_edited(RELEASED, "text_config.per_layer_config", plc, &c, &err), &err,
                DG_E_UNSUPPORTED, "full layers 5 and 11 differ in shape");
    return 0;
}

static int case_transformers_defaults(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};
    const char *minimal = "{\"model_type\": \"diffusion_gemma\", \"text_config\": "
                          "{\"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 8}}";

    CHECK_OK(dg_model_config_parse(minimal, strlen(minimal), "m.json", &c, &err), &err);
    /* DiffusionGemmaTextConfig's class defaults */
    CHECK(c.vocab_size == 262144 && c.hidden_size == 2304 && c.intermediate_size == 9216);
    CHECK(c.num_layers == 30 && c.num_heads == 8 && c.num_kv_heads == 4 && c.head_dim == 256);
    CHECK(c.sliding_window == 512 && c.max_position_embeddings == 131072);
    CHECK(c.global_head_dim == 512 && c.num_global_kv_heads == 4); /* kv falls back */
    CHECK(c.canvas_length == 256 && c.final_logit_softcapping == 30.0);
    CHECK(c.layer_kind[5] == DG_LAYER_FULL && c.layer_kind[4] == DG_LAYER_SLIDING &&
          c.layer_kind[29] == DG_LAYER_FULL);
    CHECK(c.rope_full.kind == DG_ROPE_PROPORTIONAL && c.rope_full.partial_rotary_factor == 0.25);
    return 0;
}

static int n_warn;
static char warn_line[1024];
static void warn_sink(void *ud, enum dg_log_level lv, const char *line)
{
    (void)ud;
    if (lv == DG_LOG_WARN) {
        n_warn++;
        snprintf(warn_line, sizeof warn_line, "%s", line);
    }
}

static int case_last_layer_forced_full(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};
    json_t *lt = json_array();
    int rc;

    for (int l = 0; l < 30; l++) /* the released pattern, but the last layer sliding */
        json_array_append_new(lt, json_string(l % 6 == 5 && l != 29 ? "full_attention"
                                                                     : "sliding_attention"));
    dg_log_set_sink(warn_sink, NULL, DG_LOG_WARN);
    n_warn = 0;
    rc = parse_edited(RELEASED, "text_config.layer_types", lt, &c, &err);
    dg_log_set_sink(NULL, NULL, DG_LOG_INFO);
    CHECK_OK(rc, &err);
    CHECK(c.layer_kind[29] == DG_LAYER_FULL && c.layer_kind[23] == DG_LAYER_FULL &&
          c.layer_kind[28] == DG_LAYER_SLIDING);
    CHECK(n_warn == 1 && strstr(warn_line, "last layer must be full_attention; forcing it"));
    return 0;
}

static int case_values_out_of_range(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_FAILS(parse_edited(RELEASED, "text_config.top_k_experts", json_integer(129), &c, &err),
                &err, DG_E_CONFIG, "top_k_experts (129) must be in [1, num_experts (128)]");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.num_key_value_heads", json_integer(3), &c, &err),
                &err, DG_E_CONFIG, "num_attention_heads (16) is not a multiple of num_key_value_heads (3)");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.num_global_key_value_heads", json_integer(5),
                             &c, &err), &err, DG_E_CONFIG,
                "num_attention_heads (16) is not a multiple of the full layers' KV heads (5)");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.hidden_size", json_integer(0), &c, &err), &err,
                DG_E_CONFIG, "c.json: text_config.hidden_size: 0 is out of range");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.hidden_size", json_string("2816"), &c, &err),
                &err, DG_E_CONFIG, "text_config.hidden_size: expected an integer, got a string");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.vocab_size", json_integer(-5), &c, &err), &err,
                DG_E_CONFIG, "vocab_size: -5 is out of range");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.head_dim", json_integer(255), &c, &err), &err,
                DG_E_CONFIG, "head_dim 255 must be even");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.num_hidden_layers", json_integer(31), &c, &err),
                &err, DG_E_CONFIG, "layer_types: 30 entries but num_hidden_layers is 31");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.layer_types",
                             json_pack("[s]", "chunked_attention"), &c, &err), &err, DG_E_CONFIG,
                "layer_types: 1 entries but num_hidden_layers is 30");
    CHECK_FAILS(parse_edited(HF_TINY, "text_config.layer_types",
                             json_pack("[s,s,s]", "sliding_attention", "local", "full_attention"),
                             &c, &err), &err, DG_E_CONFIG, "layer_types[1]: expected");
    CHECK_FAILS(parse_edited(RELEASED, "eos_token_id", json_pack("[i,i]", 1, 262144), &c, &err),
                &err, DG_E_CONFIG, "eos id 262144 outside the vocabulary of 262144");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.pad_token_id", json_integer(300000), &c, &err),
                &err, DG_E_CONFIG, "pad (300000) or bos (2) id outside the vocabulary");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.rms_norm_eps", json_real(0.0), &c, &err), &err,
                DG_E_CONFIG, "rms_norm_eps: 0 is out of range");
    CHECK_FAILS(parse_edited(RELEASED, "canvas_length", json_integer(0), &c, &err), &err,
                DG_E_CONFIG, "c.json: canvas_length: 0 is out of range");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.rope_parameters.full_attention.rope_theta",
                             json_real(-1.0), &c, &err), &err, DG_E_CONFIG,
                "rope_parameters.full_attention.rope_theta: -1 is out of range");
    return 0;
}

static int case_missing_keys(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_FAILS(parse_edited(RELEASED, "text_config.num_experts", NULL, &c, &err), &err, DG_E_CONFIG,
                "c.json: text_config.num_experts: required key is missing");
    CHECK_FAILS(parse_edited(RELEASED, "text_config", NULL, &c, &err), &err, DG_E_CONFIG,
                "c.json: text_config: required key is missing");
    CHECK_FAILS(parse_edited(RELEASED, "model_type", NULL, &c, &err), &err, DG_E_CONFIG,
                "c.json: model_type: required key is missing");
    return 0;
}

static int case_unsupported(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};

    CHECK_FAILS(parse_edited(RELEASED, "model_type", json_string("gemma4"), &c, &err), &err,
                DG_E_UNSUPPORTED, "model_type: 'gemma4' is not a DiffusionGemma model");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.model_type", json_string("gemma4_text"), &c,
                             &err), &err, DG_E_UNSUPPORTED, "is not diffusion_gemma_text");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.hidden_activation", json_string("gelu"), &c,
                             &err), &err, DG_E_UNSUPPORTED, "hidden_activation: 'gelu' is not supported");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.attention_bias", json_true(), &c, &err), &err,
                DG_E_UNSUPPORTED, "attention_bias: true is not supported");
    CHECK_FAILS(parse_edited(RELEASED, "tie_word_embeddings", json_false(), &c, &err), &err,
                DG_E_UNSUPPORTED, "tie_word_embeddings: false is not supported");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.use_bidirectional_attention", json_string("all"),
                             &c, &err), &err, DG_E_UNSUPPORTED, "use_bidirectional_attention: 'all'");
    CHECK_FAILS(parse_edited(RELEASED, "text_config.rope_parameters.full_attention.rope_type",
                             json_string("yarn"), &c, &err), &err, DG_E_UNSUPPORTED,
                "rope_parameters.full_attention.rope_type: 'yarn' is not supported");
    CHECK_FAILS(parse_edited(RELEASED,
                             "text_config.rope_parameters.sliding_attention.partial_rotary_factor",
                             json_real(0.5), &c, &err), &err, DG_E_UNSUPPORTED,
                "sliding layers need rope_type default with full rotation");
    return 0;
}

static int case_malformed(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};
    CHECK_FAILS(dg_model_config_parse("{\"model_type\": ", 15, "bad.json", &c, &err), &err,
                DG_E_FORMAT, "bad.json: malformed JSON at line 1");
    CHECK_FAILS(dg_model_config_parse("[]", 2, "arr.json", &c, &err), &err, DG_E_CONFIG,
                "arr.json: expected a JSON object, got an array");
    /* valid JSON with a number no double holds: the reader's range error */
    CHECK_FAILS(dg_model_config_parse("{\"hidden_size\": 1e999}", 22, "big.json", &c, &err), &err,
                DG_E_RANGE, "big.json: a number out of range at line 1");
    return 0;
}

static int same_config(const struct dg_model_config *a, const struct dg_model_config *b)
{
    return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->head_dim == b->head_dim &&
           a->num_kv_heads == b->num_kv_heads && a->global_head_dim == b->global_head_dim &&
           a->num_global_kv_heads == b->num_global_kv_heads &&
           a->sliding_window == b->sliding_window &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps &&
           a->final_logit_softcapping == b->final_logit_softcapping &&
           a->num_experts == b->num_experts && a->top_k_experts == b->top_k_experts &&
           a->moe_intermediate_size == b->moe_intermediate_size &&
           a->rope_sliding.kind == b->rope_sliding.kind &&
           a->rope_sliding.theta == b->rope_sliding.theta &&
           a->rope_full.kind == b->rope_full.kind && a->rope_full.theta == b->rope_full.theta &&
           a->rope_full.partial_rotary_factor == b->rope_full.partial_rotary_factor &&
           a->rope_full.factor == b->rope_full.factor &&
           !memcmp(a->layer_kind, b->layer_kind, sizeof a->layer_kind) &&
           a->pad_token_id == b->pad_token_id && a->bos_token_id == b->bos_token_id &&
           a->n_eos == b->n_eos && !memcmp(a->eos_ids, b->eos_ids, sizeof a->eos_ids) &&
           a->canvas_length == b->canvas_length &&
           a->self_conditioning_size == b->self_conditioning_size;
}

static int case_serialise_round_trip(void)
{
    const char *presets[] = {"26b", "tiny", "small"};
    struct dg_error err = {0};

    for (int p = 0; p < 3; p++) {
        for (int form = 0; form < 2; form++) {
            struct dg_model_config a, b;
            char *text;
            CHECK_OK(dg_model_config_preset(presets[p], &a, &err), &err);
            if (p == 1)
                a.self_conditioning_size = 40; /* exercise the optional wrapper field */
            CHECK_OK(dg_model_config_validate(&a, presets[p], &err), &err);
            text = dg_model_config_to_json(&a, form);
            CHECK(text);
            CHECK(strstr(text, form ? "per_layer_config" : "global_head_dim"));
            dg_error_clear(&err);
            if (dg_model_config_parse(text, strlen(text), "rt.json", &b, &err) != 0) {
                free(text);
                CHECKF(0, "%s form %d: %s", presets[p], form, err.msg);
            }
            free(text);
            CHECKF(same_config(&a, &b), "%s form %d does not round-trip", presets[p], form);
        }
    }
    CHECK_FAILS(dg_model_config_preset("huge", &(struct dg_model_config){0}, &err), &err,
                DG_E_INVAL, "unknown model preset 'huge'");
    return 0;
}

/* ---- generation_config.json -------------------------------------------- */

static int parse_gen_text(const char *text, struct dg_generation_config *g, struct dg_error *err)
{
    return dg_generation_config_parse(text, strlen(text), "g.json", g, err);
}

static int case_generation_released_and_nulls(void)
{
    struct dg_generation_config g;
    struct dg_error err = {0};
    char *buf;
    size_t len;

    CHECK_OK(dg_file_read(RELEASED_GEN, 1 << 20, &buf, &len, &err), &err);
    CHECK_OK(dg_generation_config_parse(buf, len, RELEASED_GEN, &g, &err), &err);
    free(buf);
    CHECK(g.max_new_tokens == 256 && g.max_denoising_steps == 48 && g.entropy_bound == 0.1);
    CHECK(g.t_max == 0.8 && g.t_min == 0.4 && g.stability_threshold == 1);
    CHECK(g.confidence_threshold == 0.005 && g.n_eos == 3 && g.eos_ids[1] == 106 &&
          g.pad_token_id == 0);

    /* transformers 5.17 saves nulls: every value falls back to its default */
    CHECK_OK(dg_file_read(HF_TINY_GEN, 1 << 20, &buf, &len, &err), &err);
    CHECK_OK(dg_generation_config_parse(buf, len, HF_TINY_GEN, &g, &err), &err);
    free(buf);
    CHECK(g.max_new_tokens == 256 && g.max_denoising_steps == 48 && g.entropy_bound == 0.1 &&
          g.t_max == 0.8 && g.t_min == 0.4 && g.stability_threshold == 1 &&
          g.confidence_threshold == 0.005 && g.n_eos == 0 && g.pad_token_id == -1);
    return 0;
}

static int case_generation_invalid(void)
{
    struct dg_generation_config g;
    struct dg_error err = {0};

    CHECK_FAILS(parse_gen_text("{\"t_min\": 0.8, \"t_max\": 0.8}", &g, &err), &err, DG_E_CONFIG,
                "t_max (0.8) must be greater than t_min (0.8)");
    CHECK_FAILS(parse_gen_text("{\"t_min\": -0.1}", &g, &err), &err, DG_E_CONFIG,
                "g.json: t_min: -0.1 is out of range");
    CHECK_FAILS(parse_gen_text("{\"max_denoising_steps\": 0}", &g, &err), &err, DG_E_CONFIG,
                "max_denoising_steps: 0 is out of range");
    CHECK_FAILS(parse_gen_text("{\"stability_threshold\": -1}", &g, &err), &err, DG_E_CONFIG,
                "stability_threshold: -1 is out of range");
    CHECK_FAILS(parse_gen_text("{\"stability_threshold\": 1.5}", &g, &err), &err, DG_E_CONFIG,
                "stability_threshold: expected an integer, got a real number");
    CHECK_FAILS(parse_gen_text("{\"confidence_threshold\": 0}", &g, &err), &err, DG_E_CONFIG,
                "confidence_threshold: 0 is out of range");
    CHECK_FAILS(parse_gen_text("{\"sampler_config\": {\"_cls_name\": \"TopKSampler\"}}", &g, &err),
                &err, DG_E_UNSUPPORTED, "g.json: sampler_config._cls_name: 'TopKSampler'");
    CHECK_FAILS(parse_gen_text("{\"sampler_config\": {\"entropy_bound\": -1}}", &g, &err), &err,
                DG_E_CONFIG, "sampler_config.entropy_bound: -1 is out of range");
    CHECK_FAILS(parse_gen_text("{\"max_new_tokens\": \"many\"}", &g, &err), &err, DG_E_CONFIG,
                "max_new_tokens: expected an integer");
    CHECK_FAILS(parse_gen_text("nope", &g, &err), &err, DG_E_FORMAT, "g.json: malformed JSON");
    CHECK_FAILS(parse_gen_text("{\"max_new_tokens\": 99999999999999999999}", &g, &err), &err,
                DG_E_RANGE, "g.json: a number out of range");
    return 0;
}

int main(void)
{
    TEST_CASE(case_released_config);
    TEST_CASE(case_transformers_5_17_saved_config);
    TEST_CASE(case_both_global_forms_must_agree);
    TEST_CASE(case_per_layer_config_errors);
    TEST_CASE(case_full_layers_must_share_a_shape);
    TEST_CASE(case_transformers_defaults);
    TEST_CASE(case_last_layer_forced_full);
    TEST_CASE(case_values_out_of_range);
    TEST_CASE(case_missing_keys);
    TEST_CASE(case_unsupported);
    TEST_CASE(case_malformed);
    TEST_CASE(case_serialise_round_trip);
    TEST_CASE(case_generation_released_and_nulls);
    TEST_CASE(case_generation_invalid);
    return test_finish();
}
