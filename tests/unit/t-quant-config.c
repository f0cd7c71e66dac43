/*
 * t-quant-config.c - config.json's quantization_config (lib/quant-config.h):
 * the compressed-tensors FP8 W8A8 form and its weights-only variant are
 * read; what dgemma writes (dg_quant_config_json, and config.json through
 * dg_model_config_to_json) reads back the same; every scheme it does not
 * run is refused with the key named (method, format, status, bit width,
 * type, strategies, groups, dynamic weights, static activations, output
 * or KV-cache quantization, several groups, malformed values).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/model-config.h"
#include "lib/quant-config.h"
#include "tests/harness.h"

/* The published FP8-dynamic form (model.md §2.4). */
static const char w8a8[] =
    "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\","
    " \"quantization_status\": \"compressed\", \"kv_cache_scheme\": null,"
    " \"global_compression_ratio\": null, \"ignore\": [\"lm_head\"],"
    " \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"],"
    "  \"weights\": {\"type\": \"float\", \"num_bits\": 8, \"strategy\": \"channel\","
    "   \"symmetric\": true, \"dynamic\": false, \"group_size\": null, \"observer\": \"minmax\"},"
    "  \"input_activations\": {\"type\": \"float\", \"num_bits\": 8, \"strategy\": \"token\","
    "   \"symmetric\": true, \"dynamic\": true},"
    "  \"output_activations\": null}}}";

static json_t *load(const char *text)
{
    return json_loads(text, 0, NULL);
}

static int parse_text(const char *text, struct dg_quant_config *q, struct dg_error *err)
{
    json_t *j = load(text);
    int rc;
    if (!j)
        return -1000;
    rc = dg_quant_config_parse(j, "config.json: ", q, err);
    json_decref(j);
    return rc;
}

static int accepts(void)
{
    struct dg_quant_config q;
    struct dg_error err = {0};
    json_t *j;
    CHECK_OK(parse_text(w8a8, &q, &err), &err);
    CHECK(q.fp8 == 1 && q.act_per_token == 1);
    /* weights only: no activation scheme */
    j = load(w8a8);
    CHECK(j);
    json_object_set_new(json_object_get(json_object_get(j, "config_groups"), "group_0"),
                        "input_activations", json_null());
    CHECK_OK(dg_quant_config_parse(j, "", &q, &err), &err);
    CHECK(q.fp8 == 1 && q.act_per_token == 0);
    json_object_del(json_object_get(json_object_get(j, "config_groups"), "group_0"),
                    "input_activations");
    CHECK_OK(dg_quant_config_parse(j, "", &q, &err), &err);
    CHECK(q.fp8 == 1 && q.act_per_token == 0);
    json_decref(j);
    return 0;
}

static int round_trip(void)
{
    static const char *const ign[] = {"lm_head", "model.decoder.layers.0.router.proj"};
    for (int a = 0; a < 2; a++) {
        const struct dg_quant_config in = {1, a};
        struct dg_quant_config out;
        struct dg_error err = {0};
        json_t *j = dg_quant_config_json(&in, ign, 2);
        CHECK(j && json_array_size(json_object_get(j, "ignore")) == 2);
        CHECK_OK(dg_quant_config_parse(j, "", &out, &err), &err);
        CHECK(out.fp8 == 1 && out.act_per_token == a);
        json_decref(j);
    }
    {
        const struct dg_quant_config none = {0, 0};
        CHECK(dg_quant_config_json(&none, NULL, 0) == NULL);
    }
    /* through config.json: the tiny preset made FP8, written and read back */
    {
        struct dg_model_config c, back;
        struct dg_error err = {0};
        char *text;
        CHECK_OK(dg_model_config_preset("tiny", &c, &err), &err);
        c.fp8 = 1;
        c.fp8_act_per_token = 1;
        text = dg_model_config_to_json(&c, 0);
        CHECK(text && strstr(text, "\"quantization_config\"") &&
              strstr(text, "model.decoder.layers.1.router.proj"));
        CHECK_OK(dg_model_config_parse(text, strlen(text), "config.json", &back, &err), &err);
        CHECK(back.fp8 == 1 && back.fp8_act_per_token == 1);
        free(text);
        c.fp8 = 0;
        text = dg_model_config_to_json(&c, 0);
        CHECK(text && !strstr(text, "quantization_config"));
        CHECK_OK(dg_model_config_parse(text, strlen(text), "config.json", &back, &err), &err);
        CHECK(back.fp8 == 0 && back.fp8_act_per_token == 0);
        free(text);
    }
    return 0;
}

/* w8a8 with one value replaced: path is "key" at the top, or
 * "w.key" / "a.key" inside the group's weights / input_activations, or
 * "g.key" in the group; value is JSON text (NULL: delete the key). */
static json_t *variant(const char *path, const char *value)
{
    json_t *j = load(w8a8), *o = j, *v = value ? json_loads(value, JSON_DECODE_ANY, NULL) : NULL;
    json_t *g = json_object_get(json_object_get(j, "config_groups"), "group_0");
    const char *key = path;
    if (path[1] == '.') {
        o = path[0] == 'w' ? json_object_get(g, "weights")
            : path[0] == 'a' ? json_object_get(g, "input_activations") : g;
        key = path + 2;
    }
    if (value)
        json_object_set_new(o, key, v);
    else
        json_object_del(o, key);
    return j;
}

static int refusals(void)
{
    static const struct {
        const char *path, *value;
        enum dg_status want;
        const char *needle;
    } bad[] = {
        {"quant_method", "\"fp8\"", DG_E_UNSUPPORTED, "quant_method: 'fp8'"},
        {"quant_method", NULL, DG_E_CONFIG, "quant_method"},
        {"format", "\"pack-quantized\"", DG_E_UNSUPPORTED, "format: 'pack-quantized'"},
        {"quantization_status", "\"frozen\"", DG_E_UNSUPPORTED, "quantization_status"},
        {"kv_cache_scheme", "{\"num_bits\": 8}", DG_E_UNSUPPORTED, "kv_cache_scheme"},
        {"config_groups", "{}", DG_E_UNSUPPORTED, "exactly one group"},
        {"config_groups", "[]", DG_E_UNSUPPORTED, "not an object"},
        {"w.num_bits", "4", DG_E_UNSUPPORTED, "num_bits: 4"},
        {"w.type", "\"int\"", DG_E_UNSUPPORTED, "weights.type: 'int'"},
        {"w.strategy", "\"tensor\"", DG_E_UNSUPPORTED, "weights.strategy: 'tensor'"},
        {"w.strategy", "\"block\"", DG_E_UNSUPPORTED, "weights.strategy: 'block'"},
        {"w.symmetric", "false", DG_E_UNSUPPORTED, "symmetric: false"},
        {"w.dynamic", "true", DG_E_UNSUPPORTED, "weights.dynamic: true"},
        {"w.group_size", "128", DG_E_UNSUPPORTED, "group_size"},
        {"a.strategy", "\"tensor\"", DG_E_UNSUPPORTED, "input_activations.strategy: 'tensor'"},
        {"a.dynamic", "false", DG_E_UNSUPPORTED, "input_activations.dynamic: false"},
        {"a.num_bits", "\"8\"", DG_E_CONFIG, "num_bits"},
        {"g.weights", NULL, DG_E_CONFIG, "weights: missing"},
        {"g.weights", "[1]", DG_E_CONFIG, "expected an object"},
        {"g.output_activations", "{\"num_bits\": 8}", DG_E_UNSUPPORTED, "output_activations"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct dg_quant_config q;
        struct dg_error err = {0};
        json_t *j = variant(bad[i].path, bad[i].value);
        CHECK(j);
        CHECK_FAILS(dg_quant_config_parse(j, "config.json: ", &q, &err), &err, bad[i].want,
                    bad[i].needle);
        CHECK(strstr(err.msg, "config.json: quantization_config.") != NULL);
        json_decref(j);
    }
    {
        /* two groups; not an object at all */
        struct dg_quant_config q;
        struct dg_error err = {0};
        json_t *j = load(w8a8), *g = json_object_get(j, "config_groups");
        json_object_set(g, "group_1", json_object_get(g, "group_0"));
        CHECK_FAILS(dg_quant_config_parse(j, "", &q, &err), &err, DG_E_UNSUPPORTED,
                    "exactly one group");
        json_decref(j);
        j = json_string("fp8");
        CHECK_FAILS(dg_quant_config_parse(j, "", &q, &err), &err, DG_E_CONFIG,
                    "expected an object");
        json_decref(j);
    }
    return 0;
}

/* A config.json whose quantization_config is refused fails to parse as a
 * whole, with the message naming it. */
static int in_config(void)
{
    struct dg_model_config c, back;
    struct dg_error err = {0};
    char *text, *bad, *p;
    CHECK_OK(dg_model_config_preset("tiny", &c, &err), &err);
    c.fp8 = 1;
    text = dg_model_config_to_json(&c, 0);
    CHECK(text && (p = strstr(text, "\"channel\"")));
    bad = malloc(strlen(text) + 8);
    CHECK(bad);
    memcpy(bad, text, (size_t)(p - text));
    strcpy(bad + (p - text), "\"tensor\"");
    strcat(bad, p + strlen("\"channel\""));
    CHECK_FAILS(dg_model_config_parse(bad, strlen(bad), "config.json", &back, &err), &err,
                DG_E_UNSUPPORTED, "quantization_config.config_groups.group_0.weights.strategy");
    free(bad);
    free(text);
    return 0;
}

int main(void)
{
    TEST_CASE(accepts);
    TEST_CASE(round_trip);
    TEST_CASE(refusals);
    TEST_CASE(in_config);
    return test_finish();
}
