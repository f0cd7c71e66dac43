/* quant-config.c - compressed-tensors FP8 quantization_config (see
 * quant-config.h). */
#include "lib/quant-config.h"

#include <string.h>

#include "lib/json-util.h"

/* obj[key] must be the string want (absent allowed when !required). */
static int want_string(const json_t *obj, const char *key, const char *want, int required,
                       const char *ctx, struct dg_error *err)
{
    const char *s = NULL;
    int rc = dg_json_get_string(obj, key, required ? DG_JSON_REQUIRED : DG_JSON_OPTIONAL, ctx,
                                &s, err);
    if (rc <= 0)
        return rc;
    if (strcmp(s, want) != 0)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%s%s: '%.64s' is not supported (%s only)",
                            ctx, key, s, want);
    return 0;
}

static int want_bool(const json_t *obj, const char *key, int want, const char *ctx,
                     struct dg_error *err)
{
    int v = want, rc = dg_json_get_bool(obj, key, DG_JSON_OPTIONAL, ctx, &v, err);
    if (rc < 0)
        return rc;
    if (v != want)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%s%s: %s is not supported", ctx, key,
                            v ? "true" : "false");
    return 0;
}

/* One quantization scheme: type float, 8 bits, symmetric, the strategy
 * and dynamic flag given, no group size. */
static int want_scheme(const json_t *s, const char *ctx, const char *strategy, int dynamic,
                       struct dg_error *err)
{
    long long bits = 0;
    int rc;
    const json_t *g;
    if (!json_is_object(s))
        return dg_error_set(err, DG_E_CONFIG, "%sexpected an object, got %s", ctx,
                            dg_json_type_name(s));
    if ((rc = want_string(s, "type", "float", 1, ctx, err)) < 0 ||
        (rc = dg_json_get_int(s, "num_bits", 1, 64, DG_JSON_REQUIRED, ctx, &bits, err)) < 0 ||
        (rc = want_string(s, "strategy", strategy, 1, ctx, err)) < 0 ||
        (rc = want_bool(s, "symmetric", 1, ctx, err)) < 0 ||
        (rc = want_bool(s, "dynamic", dynamic, ctx, err)) < 0)
        return rc;
    if (bits != 8)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%snum_bits: %lld is not supported (8 only)",
                            ctx, bits);
    g = json_object_get(s, "group_size");
    if (g && !json_is_null(g))
        return dg_error_set(err, DG_E_UNSUPPORTED, "%sgroup_size: groups are not supported "
                            "(per channel only)", ctx);
    return 0;
}

int dg_quant_config_parse(const json_t *qc, const char *ctx, struct dg_quant_config *q,
                          struct dg_error *err)
{
    char c2[640], c3[768];
    const json_t *groups, *grp = NULL, *w, *a, *o, *kv;
    const char *gname = NULL;
    json_t *v;
    int rc;

    memset(q, 0, sizeof *q);
    snprintf(c2, sizeof c2, "%squantization_config.", ctx);
    if (!json_is_object(qc))
        return dg_error_set(err, DG_E_CONFIG, "%squantization_config: expected an object, got %s",
                            ctx, dg_json_type_name(qc));
    if ((rc = want_string(qc, "quant_method", "compressed-tensors", 1, c2, err)) < 0 ||
        (rc = want_string(qc, "format", "float-quantized", 1, c2, err)) < 0 ||
        (rc = want_string(qc, "quantization_status", "compressed", 0, c2, err)) < 0)
        return rc;
    kv = json_object_get(qc, "kv_cache_scheme");
    if (kv && !json_is_null(kv))
        return dg_error_set(err, DG_E_UNSUPPORTED, "%skv_cache_scheme: a quantized KV cache is "
                            "not supported", c2);
    groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%sconfig_groups: exactly one group is "
                            "supported (%s)", c2,
                            json_is_object(groups) ? "several or none given" : "not an object");
    {
        const char *k;
        json_object_foreach((json_t *)groups, k, v) {
            gname = k; /* (the loop leaves k NULL) */
            grp = v;
        }
    }
    snprintf(c3, sizeof c3, "%sconfig_groups.%.64s.", c2, gname);
    if (!json_is_object(grp))
        return dg_error_set(err, DG_E_CONFIG, "%s: expected an object, got %s", c3,
                            dg_json_type_name(grp));
    w = json_object_get(grp, "weights");
    a = json_object_get(grp, "input_activations");
    o = json_object_get(grp, "output_activations");
    if (!w)
        return dg_error_set(err, DG_E_CONFIG, "%sweights: missing", c3);
    if (o && !json_is_null(o))
        return dg_error_set(err, DG_E_UNSUPPORTED, "%soutput_activations: not supported", c3);
    {
        char cw[896];
        snprintf(cw, sizeof cw, "%sweights.", c3);
        if ((rc = want_scheme(w, cw, "channel", 0, err)) < 0)
            return rc;
        if (a && !json_is_null(a)) {
            snprintf(cw, sizeof cw, "%sinput_activations.", c3);
            if ((rc = want_scheme(a, cw, "token", 1, err)) < 0)
                return rc;
            q->act_per_token = 1;
        }
    }
    q->fp8 = 1;
    return 0;
}

json_t *dg_quant_config_json(const struct dg_quant_config *q, const char *const *ignore, int n)
{
    json_t *root, *ign;
    if (!q->fp8)
        return NULL;
    root = json_pack("{s:s, s:s, s:s, s:n, s:{s:{s:[s], s:{s:s, s:i, s:s, s:b, s:b, s:n}, "
                     "s:n}}}",
                     "quant_method", "compressed-tensors", "format", "float-quantized",
                     "quantization_status", "compressed", "kv_cache_scheme", "config_groups",
                     "group_0", "targets", "Linear", "weights", "type", "float", "num_bits", 8,
                     "strategy", "channel", "symmetric", 1, "dynamic", 0, "group_size",
                     "output_activations");
    ign = json_array();
    if (!root || !ign)
        goto fail;
    if (q->act_per_token) {
        json_t *a = json_pack("{s:s, s:i, s:s, s:b, s:b}", "type", "float", "num_bits", 8,
                              "strategy", "token", "symmetric", 1, "dynamic", 1);
        json_t *g = json_object_get(json_object_get(root, "config_groups"), "group_0");
        if (!a || json_object_set_new(g, "input_activations", a) < 0)
            goto fail;
    } else {
        json_t *g = json_object_get(json_object_get(root, "config_groups"), "group_0");
        if (json_object_set_new(g, "input_activations", json_null()) < 0)
            goto fail;
    }
    for (int i = 0; i < n; i++)
        if (json_array_append_new(ign, json_string(ignore[i])) < 0)
            goto fail;
    if (json_object_set_new(root, "ignore", ign) < 0) {
        ign = NULL;
        goto fail;
    }
    return root;
fail:
    json_decref(root);
    json_decref(ign);
    return NULL;
}
