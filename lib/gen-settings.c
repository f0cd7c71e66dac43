/* gen-settings.c - per-request generation settings: defaults, JSON, checks. */
#include "lib/gen-settings.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lib/json-util.h"
#include "lib/sampler.h"
#include "lib/utf8.h"

/* The lowest temperature a step may take.  The sampler divides the logits
 * by it in fp32: below about 3e-38 the largest ones overflow to infinity
 * (the argmax becomes the first of them, the sums NaN); from 1e-30 on,
 * logits up to 1.7e8 in magnitude (Gemma's soft-cap holds them within 30)
 * and their differences stay finite. */
#define TEMPERATURE_MIN 1e-30f

void dg_gen_limits_default(struct dg_gen_limits *l)
{
    l->max_canvas_length = 1024;
    l->max_denoising_steps = 1024;
    l->max_tokens = 1 << 20;
}

static void add_stop_id(struct dg_gen_settings *s, int id)
{
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id)
            return;
    if (s->n_stop_ids < DG_MAX_STOP_IDS)
        s->stop_ids[s->n_stop_ids++] = id;
}

void dg_gen_settings_defaults(struct dg_gen_settings *s, const struct dg_model_config *cfg,
                              const struct dg_generation_config *gen)
{
    memset(s, 0, sizeof *s);
    s->canvas_length = cfg->canvas_length;
    s->max_denoising_steps = gen->max_denoising_steps;
    s->entropy_bound = gen->entropy_bound;
    s->confidence_threshold = gen->confidence_threshold;
    s->stability_threshold = gen->stability_threshold;
    s->t_min = gen->t_min;
    s->t_max = gen->t_max;
    s->top_k = 0;
    s->top_p = 1.0;
    s->max_tokens = gen->max_new_tokens;
    if (gen->n_eos > 0)
        for (int i = 0; i < gen->n_eos; i++)
            add_stop_id(s, gen->eos_ids[i]);
    else
        for (int i = 0; i < cfg->n_eos; i++)
            add_stop_id(s, cfg->eos_ids[i]);
}

int dg_gen_settings_is_stop_id(const struct dg_gen_settings *s, int32_t id)
{
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id)
            return 1;
    return 0;
}

int dg_gen_settings_validate(const struct dg_gen_settings *s, const struct dg_model_config *cfg,
                             const struct dg_gen_limits *lim, struct dg_error *err)
{
#define BAD(...) return dg_error_set(err, DG_E_INVAL, __VA_ARGS__)
    if (s->canvas_length < 1 || s->canvas_length > lim->max_canvas_length)
        BAD("canvas_length: %d is outside [1, %d]", s->canvas_length, lim->max_canvas_length);
    if (s->max_denoising_steps < 1 || s->max_denoising_steps > lim->max_denoising_steps)
        BAD("max_denoising_steps: %d is outside [1, %d]", s->max_denoising_steps,
            lim->max_denoising_steps);
    if (!(s->entropy_bound > 0) || !isfinite(s->entropy_bound))
        BAD("entropy_bound: must be a finite number > 0");
    if (!(s->confidence_threshold > 0) || !isfinite(s->confidence_threshold))
        BAD("confidence_threshold: must be a finite number > 0");
    /* (the canvas compares its mean entropy with the threshold in float32) */
    if (!((float)s->confidence_threshold > 0))
        BAD("confidence_threshold: %g is 0 in float32, where the comparison is made, and could "
            "never be met", s->confidence_threshold);
    if (s->stability_threshold < 0 || s->stability_threshold > 65535)
        BAD("stability_threshold: %d is outside [0, 65535]", s->stability_threshold);
    if (!(s->t_min >= 0) || !(s->t_max <= 100) || !(s->t_max > s->t_min))
        BAD("t_min %g, t_max %g: need 0 <= t_min < t_max <= 100", s->t_min, s->t_max);
    {
        /* the last step's (the schedule's lowest) */
        const int n = s->max_denoising_steps;
        const float T_last = dg_temperature(s->t_min, s->t_max, n, n - 1);
        if (!(T_last >= TEMPERATURE_MIN))
            BAD("t_min %g, t_max %g: the temperature of the last of %d steps, %g, is below %g, "
                "where the logits divided by it overflow; raise t_max or t_min", s->t_min,
                s->t_max, n, (double)T_last, (double)TEMPERATURE_MIN);
    }
    if (s->top_k < 0 || s->top_k > (1 << 30))
        BAD("top_k: %d is outside [0, 2^30] (0: no limit)", s->top_k);
    if (!(s->top_p > 0) || !(s->top_p <= 1))
        BAD("top_p: %g is outside (0, 1] (1: no limit)", s->top_p);
    /* (the filter takes top_p in float32: 0 there fails the denoising
     * batch, 1 is no filter) */
    if (!((float)s->top_p > 0))
        BAD("top_p: %g is 0 in float32, where the filter takes it", s->top_p);
    if (s->top_p < 1 && !((float)s->top_p < 1.0f))
        BAD("top_p: %.17g rounds to 1 in float32 (no filter): use 1, or at most 0.99999994",
            s->top_p);
    if (s->max_tokens < 1 || s->max_tokens > lim->max_tokens)
        BAD("max_tokens: %lld is outside [1, %lld]", (long long)s->max_tokens,
            (long long)lim->max_tokens);
    if (s->seed > (uint64_t)INT64_MAX)
        BAD("seed: must be at most 2^63-1");
    if (s->n_stop_ids < 0 || s->n_stop_ids > DG_MAX_STOP_IDS)
        BAD("stop_token_ids: at most %d ids with the model's own", DG_MAX_STOP_IDS);
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] < 0 || s->stop_ids[i] >= cfg->vocab_size)
            BAD("stop_token_ids: id %d is outside the vocabulary [0, %lld)", s->stop_ids[i],
                (long long)cfg->vocab_size);
    if (s->n_stop_strings < 0 || s->n_stop_strings > DG_MAX_STOP_STRINGS)
        BAD("stop: at most %d strings", DG_MAX_STOP_STRINGS);
    for (int i = 0; i < s->n_stop_strings; i++) {
        const size_t n = strnlen(s->stop_strings[i], DG_STOP_STRING_MAX + 1);
        if (n == 0 || n > DG_STOP_STRING_MAX)
            BAD("stop[%d]: must be 1 to %d bytes", i, DG_STOP_STRING_MAX);
        if (dg_utf8_valid_prefix((const unsigned char *)s->stop_strings[i], n) != n)
            BAD("stop[%d]: not valid UTF-8", i);
    }
    return 0;
#undef BAD
}

static const char *const KNOWN[] = {
    "canvas_length", "max_denoising_steps", "entropy_bound", "confidence_threshold",
    "stability_threshold", "t_min", "t_max", "top_k", "top_p", "seed", "max_tokens",
    "stop_token_ids", "stop",
};

static int get_int(const json_t *o, const char *key, long long lo, long long hi, const char *ctx,
                   long long *v, struct dg_error *err)
{
    return dg_json_get_int(o, key, lo, hi, DG_JSON_OPTIONAL, ctx, v, err);
}

static int parse_stop_strings(struct dg_gen_settings *t, const json_t *v, const char *ctx,
                              struct dg_error *err)
{
    const json_t *item;
    size_t i;

    if (json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0 || json_string_length(v) > DG_STOP_STRING_MAX ||
            strlen(json_string_value(v)) != json_string_length(v))
            return dg_error_set(err, DG_E_INVAL, "%sstop: must be 1 to %d bytes, no NUL", ctx,
                                DG_STOP_STRING_MAX);
        memcpy(t->stop_strings[0], json_string_value(v), json_string_length(v) + 1);
        t->n_stop_strings = 1;
        return 0;
    }
    if (!json_is_array(v))
        return dg_error_set(err, DG_E_INVAL, "%sstop: expected a string or a list of strings, "
                            "got %s", ctx, dg_json_type_name(v));
    if (json_array_size(v) > DG_MAX_STOP_STRINGS)
        return dg_error_set(err, DG_E_INVAL, "%sstop: %zu strings; at most %d", ctx,
                            json_array_size(v), DG_MAX_STOP_STRINGS);
    t->n_stop_strings = 0;
    json_array_foreach(v, i, item) {
        if (!json_is_string(item))
            return dg_error_set(err, DG_E_INVAL, "%sstop[%zu]: expected a string, got %s", ctx, i,
                                dg_json_type_name(item));
        if (json_string_length(item) == 0 || json_string_length(item) > DG_STOP_STRING_MAX ||
            strlen(json_string_value(item)) != json_string_length(item))
            return dg_error_set(err, DG_E_INVAL, "%sstop[%zu]: must be 1 to %d bytes, no NUL",
                                ctx, i, DG_STOP_STRING_MAX);
        memcpy(t->stop_strings[i], json_string_value(item), json_string_length(item) + 1);
        t->n_stop_strings++;
    }
    return 0;
}

static int apply(struct dg_gen_settings *s, const json_t *obj, const struct dg_model_config *cfg,
                 const struct dg_gen_limits *lim, const char *ctx, struct dg_error *err)
{
    struct dg_gen_settings t = *s;
    const char *key;
    const json_t *val;
    long long v;
    double d;
    int rc;

    if (!json_is_object(obj))
        return dg_error_set(err, DG_E_INVAL, "%ssettings: expected an object, got %s", ctx,
                            dg_json_type_name(obj));
    json_object_foreach((json_t *)obj, key, val) {
        size_t k = 0;
        while (k < sizeof KNOWN / sizeof KNOWN[0] && strcmp(key, KNOWN[k]) != 0)
            k++;
        if (k == sizeof KNOWN / sizeof KNOWN[0]) {
            if (!strcmp(key, "temperature"))
                return dg_error_set(err, DG_E_INVAL,
                                    "%stemperature: not a setting of diffusion sampling; the "
                                    "temperature falls from t_max to t_min over the steps",
                                    ctx);
            return dg_error_set(err, DG_E_INVAL, "%s%.64s: unknown setting", ctx, key);
        }
    }
#define INT_KEY(name, lo, hi, field)                                                       \
    do {                                                                                   \
        if ((rc = get_int(obj, name, lo, hi, ctx, &v, err)) < 0)                           \
            return rc;                                                                     \
        if (rc == 1)                                                                       \
            t.field = v;                                                                   \
    } while (0)
#define REAL_KEY(name, lo, hi, field)                                                      \
    do {                                                                                   \
        if ((rc = dg_json_get_real(obj, name, lo, hi, DG_JSON_OPTIONAL, ctx, &d, err)) < 0) \
            return rc;                                                                     \
        if (rc == 1)                                                                       \
            t.field = d;                                                                   \
    } while (0)
    INT_KEY("canvas_length", 1, lim->max_canvas_length, canvas_length);
    INT_KEY("max_denoising_steps", 1, lim->max_denoising_steps, max_denoising_steps);
    INT_KEY("stability_threshold", 0, 65535, stability_threshold);
    INT_KEY("top_k", 0, 1 << 30, top_k);
    INT_KEY("max_tokens", 1, lim->max_tokens, max_tokens);
    /* any finite number here; dg_gen_settings_validate names the range */
    REAL_KEY("entropy_bound", -1e300, 1e300, entropy_bound);
    REAL_KEY("confidence_threshold", -1e300, 1e300, confidence_threshold);
    REAL_KEY("t_min", -1e300, 1e300, t_min);
    REAL_KEY("t_max", -1e300, 1e300, t_max);
    REAL_KEY("top_p", -1e300, 1e300, top_p);
#undef INT_KEY
#undef REAL_KEY
    if ((rc = get_int(obj, "seed", 0, LLONG_MAX, ctx, &v, err)) < 0)
        return rc;
    if (rc == 1) {
        t.seed = (uint64_t)v;
        t.seed_set = 1;
    }
    {
        long long ids[DG_MAX_STOP_IDS];
        int n = 0;
        if ((rc = dg_json_get_int_list(obj, "stop_token_ids", 0, cfg->vocab_size - 1,
                                       DG_JSON_OPTIONAL, ctx, ids, DG_MAX_STOP_IDS, &n, err)) < 0)
            return rc;
        for (int i = 0; i < n; i++) {
            if (t.n_stop_ids == DG_MAX_STOP_IDS && !dg_gen_settings_is_stop_id(&t, (int)ids[i]))
                return dg_error_set(err, DG_E_INVAL,
                                    "%sstop_token_ids: at most %d ids with the model's own", ctx,
                                    DG_MAX_STOP_IDS);
            add_stop_id(&t, (int)ids[i]);
        }
    }
    if ((val = json_object_get(obj, "stop")) && (rc = parse_stop_strings(&t, val, ctx, err)) < 0)
        return rc;
    if ((rc = dg_gen_settings_validate(&t, cfg, lim, err)) < 0) {
        /* ctx carries its own separator ("request: ") */
        if (err && ctx && *ctx) {
            char msg[DG_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s%s", ctx, err->msg);
            memcpy(err->msg, msg, sizeof msg);
        }
        return rc;
    }
    *s = t;
    return 0;
}

int dg_gen_settings_apply_json(struct dg_gen_settings *s, const json_t *obj,
                               const struct dg_model_config *cfg,
                               const struct dg_gen_limits *lim, const char *ctx,
                               struct dg_error *err)
{
    /* the JSON getters report bad values as config errors; in a request
     * they are invalid arguments */
    int rc = apply(s, obj, cfg, lim, ctx, err);
    if (rc < 0 && rc != -DG_E_NOMEM) {
        if (err)
            err->code = DG_E_INVAL;
        rc = -DG_E_INVAL;
    }
    return rc;
}

json_t *dg_gen_settings_to_json(const struct dg_gen_settings *s)
{
    json_t *o = json_object(), *ids, *stops;
    int bad = !o || json_object_set_new(o, "stop_token_ids", json_array()) ||
              json_object_set_new(o, "stop", json_array());

    ids = bad ? NULL : json_object_get(o, "stop_token_ids");
    stops = bad ? NULL : json_object_get(o, "stop");
    for (int i = 0; !bad && i < s->n_stop_ids; i++)
        bad |= json_array_append_new(ids, json_integer(s->stop_ids[i])) != 0;
    for (int i = 0; !bad && i < s->n_stop_strings; i++)
        bad |= json_array_append_new(stops, json_string(s->stop_strings[i])) != 0;
    bad = bad || json_object_set_new(o, "canvas_length", json_integer(s->canvas_length)) ||
          json_object_set_new(o, "max_denoising_steps", json_integer(s->max_denoising_steps)) ||
          json_object_set_new(o, "entropy_bound", json_real(s->entropy_bound)) ||
          json_object_set_new(o, "confidence_threshold", json_real(s->confidence_threshold)) ||
          json_object_set_new(o, "stability_threshold", json_integer(s->stability_threshold)) ||
          json_object_set_new(o, "t_min", json_real(s->t_min)) ||
          json_object_set_new(o, "t_max", json_real(s->t_max)) ||
          json_object_set_new(o, "top_k", json_integer(s->top_k)) ||
          json_object_set_new(o, "top_p", json_real(s->top_p)) ||
          json_object_set_new(o, "seed", s->seed_set ? json_integer((json_int_t)s->seed)
                                                     : json_null()) ||
          json_object_set_new(o, "max_tokens", json_integer(s->max_tokens));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
