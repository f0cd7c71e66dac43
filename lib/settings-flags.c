/* settings-flags.c - the generation settings' command-line flags into a
 * JSON settings object (settings-flags.h). */
#include "lib/settings-flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"

/* flag -> key, and how its value reads: i integer, r real, s string list,
 * n integer list */
static const struct {
    const char *flag, *key;
    char kind;
} FLAGS[] = {
    {"--max-tokens", "max_tokens", 'i'},
    {"--seed", "seed", 'i'},
    {"--canvas-length", "canvas_length", 'i'},
    {"--max-denoising-steps", "max_denoising_steps", 'i'},
    {"--entropy-bound", "entropy_bound", 'r'},
    {"--confidence-threshold", "confidence_threshold", 'r'},
    {"--stability-threshold", "stability_threshold", 'i'},
    {"--t-min", "t_min", 'r'},
    {"--t-max", "t_max", 'r'},
    {"--top-k", "top_k", 'i'},
    {"--top-p", "top_p", 'r'},
    {"--stop", "stop", 's'},
    {"--stop-id", "stop_token_ids", 'n'},
};

static int flag_index(const char *flag)
{
    for (size_t k = 0; k < sizeof FLAGS / sizeof FLAGS[0]; k++)
        if (!strcmp(flag, FLAGS[k].flag))
            return (int)k;
    return -1;
}

const char *dg_settings_flag_key(const char *flag)
{
    const int k = flag_index(flag);
    return k < 0 ? NULL : FLAGS[k].key;
}

/* val as flag's kind into *out (a new reference): 0, or -DG_E_INVAL,
 * -DG_E_NOMEM */
static int flag_value(const char *flag, char kind, const char *val, json_t **out,
                      struct dg_error *err)
{
    char *end;
    json_t *v;
    if (kind == 'i' || kind == 'n') {
        long long x;
        errno = 0;
        x = strtoll(val, &end, 10);
        if (end == val || *end)
            return dg_error_set(err, DG_E_INVAL, "%s: '%s' is not an integer", flag, val);
        if (errno == ERANGE)
            return dg_error_set(err, DG_E_INVAL, "%s: '%s' is out of range", flag, val);
        v = json_integer(x);
    } else if (kind == 'r') {
        double x = strtod(val, &end);
        if (end == val || *end)
            return dg_error_set(err, DG_E_INVAL, "%s: '%s' is not a number", flag, val);
        /* (JSON holds no infinity or NaN: the setting would be lost) */
        if (!isfinite(x))
            return dg_error_set(err, DG_E_INVAL, "%s: '%s' is not a finite number", flag, val);
        v = json_real(x);
    } else {
        const size_t n = strlen(val);
        if (dg_utf8_valid_prefix((const unsigned char *)val, n) != n)
            return dg_error_set(err, DG_E_INVAL, "%s: not valid UTF-8", flag);
        v = json_stringn(val, n);
    }
    if (!(*out = v))
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    return 0;
}

int dg_settings_flag_set(json_t *settings, const char *flag, const char *val,
                         struct dg_error *err)
{
    const int k = flag_index(flag);
    json_t *v = NULL, *had, *list;
    int rc;
    if (k < 0)
        return dg_error_set(err, DG_E_INVAL, "%s is not a settings flag", flag);
    if ((rc = flag_value(flag, FLAGS[k].kind, val, &v, err)) < 0)
        return rc;
    if (FLAGS[k].kind != 's' && FLAGS[k].kind != 'n') {
        if (json_object_set_new(settings, FLAGS[k].key, v) != 0)
            return dg_error_set(err, DG_E_NOMEM, "out of memory");
        return 0;
    }
    had = json_object_get(settings, FLAGS[k].key);
    if (json_is_array(had)) {
        if (json_array_append_new(had, v) != 0)
            return dg_error_set(err, DG_E_NOMEM, "out of memory");
        return 0;
    }
    /* a single value (from a settings object) starts the list (jansson's
     * _new calls take their value's reference, on failure too) */
    if (!(list = json_array())) {
        json_decref(v);
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    }
    if (had && json_array_append(list, had) != 0) {
        json_decref(v);
        json_decref(list);
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    }
    if (json_array_append_new(list, v) != 0) {
        json_decref(list);
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    }
    if (json_object_set_new(settings, FLAGS[k].key, list) != 0)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    return 0;
}
