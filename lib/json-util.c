/* json-util.c - see json-util.h. */
#include "lib/json-util.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"

/* Set when an allocation made by jansson fails on this thread.  jansson's
 * dump ignores some of its failed allocations (an object key cut short),
 * so a dump during which one failed is not trusted.  (Its parser is not
 * used at all: json-load.c says why.) */
static _Thread_local int alloc_failed;

static void *json_alloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        alloc_failed = 1;
    return p;
}

/* The same malloc and free, only watched: installed before main, so before
 * any thread can be inside jansson. */
__attribute__((constructor)) static void install_alloc(void)
{
    json_set_alloc_funcs(json_alloc, free);
}

char *dg_json_dumps(const json_t *v, size_t flags)
{
    const int before = alloc_failed; /* (a watch in progress keeps its mark) */
    char *s;
    alloc_failed = 0;
    s = json_dumps(v, flags);
    if (s && alloc_failed) {
        free(s);
        s = NULL;
    }
    alloc_failed |= before;
    return s;
}

void dg_json_alloc_watch(void)
{
    alloc_failed = 0;
}

int dg_json_alloc_failed(void)
{
    return alloc_failed;
}

char *dg_json_dumps_watched(const json_t *v, size_t flags)
{
    char *s = dg_json_dumps(v, flags);
    if (s && alloc_failed) {
        free(s);
        s = NULL;
    }
    return s;
}

json_t *dg_json_text(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strlen(s);
    size_t i = dg_utf8_valid_prefix(u, n), o;
    char *buf;
    json_t *j;
    if (i == n)
        return json_stringn(s, n);
    /* at most 3 bytes out for each byte in */
    if (n > (SIZE_MAX - 1) / 3 || !(buf = malloc(3 * n + 1)))
        return NULL;
    memcpy(buf, s, i);
    o = i;
    while (i < n) {
        uint32_t cp;
        size_t l = dg_utf8_decode(u + i, n - i, &cp);
        if (l) {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

json_t *dg_json_number(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

int dg_json_parse_status(const struct dg_error *err)
{
    return err ? -(int)err->code : -DG_E_FORMAT;
}

void dg_json_error_at_column(char *dst, size_t cap, const char *msg, const char *what)
{
    static const char line1[] = " at line 1 column ";
    const char *p = strstr(msg, line1);
    size_t skip = what ? strlen(what) : 0;

    if (!p) {
        snprintf(dst, cap, "%s", msg);
        return;
    }
    if (!what || strncmp(msg, what, skip) || strncmp(msg + skip, ": ", 2) ||
        msg + skip + 2 > p)
        skip = 0;
    else
        skip += 2;
    snprintf(dst, cap, "%.*s at column %s", (int)(p - msg - skip), msg + skip,
             p + sizeof line1 - 1);
}

const char *dg_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

/* Fetch key; 0 = absent/null (error if required), 1 = present. */
static int lookup(const json_t *obj, const char *key, enum dg_json_need need, const char *ctx,
                  json_t **v, struct dg_error *err)
{
    *v = json_object_get(obj, key);
    if (!*v || json_is_null(*v)) {
        if (need == DG_JSON_REQUIRED)
            return dg_error_set(err, DG_E_CONFIG, "%s%s: required key is missing", ctx, key);
        return 0;
    }
    return 1;
}

static int wrong_type(const char *ctx, const char *key, const char *want, const json_t *v,
                      struct dg_error *err)
{
    return dg_error_set(err, DG_E_CONFIG, "%s%s: expected %s, got %s", ctx, key, want,
                        dg_json_type_name(v));
}

int dg_json_get_int(const json_t *obj, const char *key, long long lo, long long hi,
                    enum dg_json_need need, const char *ctx, long long *out,
                    struct dg_error *err)
{
    json_t *v;
    long long x;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (!json_is_integer(v))
        return wrong_type(ctx, key, "an integer", v, err);
    x = json_integer_value(v);
    if (x < lo || x > hi)
        return dg_error_set(err, DG_E_CONFIG, "%s%s: %lld is out of range [%lld, %lld]", ctx,
                            key, x, lo, hi);
    *out = x;
    return 1;
}

int dg_json_get_real(const json_t *obj, const char *key, double lo, double hi,
                     enum dg_json_need need, const char *ctx, double *out,
                     struct dg_error *err)
{
    json_t *v;
    double x;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (!json_is_number(v))
        return wrong_type(ctx, key, "a number", v, err);
    x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return dg_error_set(err, DG_E_CONFIG, "%s%s: %g is out of range [%g, %g]", ctx, key, x,
                            lo, hi);
    *out = x;
    return 1;
}

int dg_json_get_bool(const json_t *obj, const char *key, enum dg_json_need need,
                     const char *ctx, int *out, struct dg_error *err)
{
    json_t *v;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (!json_is_boolean(v))
        return wrong_type(ctx, key, "a boolean", v, err);
    *out = json_is_true(v);
    return 1;
}

int dg_json_get_string(const json_t *obj, const char *key, enum dg_json_need need,
                       const char *ctx, const char **out, struct dg_error *err)
{
    json_t *v;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (!json_is_string(v))
        return wrong_type(ctx, key, "a string", v, err);
    *out = json_string_value(v);
    return 1;
}

int dg_json_get_object(const json_t *obj, const char *key, enum dg_json_need need,
                       const char *ctx, json_t **out, struct dg_error *err)
{
    json_t *v;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (!json_is_object(v))
        return wrong_type(ctx, key, "an object", v, err);
    *out = v;
    return 1;
}

int dg_json_get_int_list(const json_t *obj, const char *key, long long lo, long long hi,
                         enum dg_json_need need, const char *ctx, long long *out, int cap,
                         int *n, struct dg_error *err)
{
    json_t *v, *item;
    size_t i;
    int rc = lookup(obj, key, need, ctx, &v, err);

    if (rc <= 0)
        return rc;
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < lo || x > hi)
            return dg_error_set(err, DG_E_CONFIG, "%s%s: %lld is out of range [%lld, %lld]",
                                ctx, key, x, lo, hi);
        if (cap < 1)
            return dg_error_set(err, DG_E_CONFIG, "%s%s: no room for values", ctx, key);
        out[0] = x;
        *n = 1;
        return 1;
    }
    if (!json_is_array(v))
        return wrong_type(ctx, key, "an integer or a list of integers", v, err);
    if (json_array_size(v) > (size_t)cap)
        return dg_error_set(err, DG_E_CONFIG, "%s%s: %zu values, at most %d allowed", ctx, key,
                            json_array_size(v), cap);
    json_array_foreach(v, i, item) {
        long long x;
        if (!json_is_integer(item))
            return dg_error_set(err, DG_E_CONFIG, "%s%s[%zu]: expected an integer, got %s", ctx,
                                key, i, dg_json_type_name(item));
        x = json_integer_value(item);
        if (x < lo || x > hi)
            return dg_error_set(err, DG_E_CONFIG, "%s%s[%zu]: %lld is out of range [%lld, %lld]",
                                ctx, key, i, x, lo, hi);
        out[i] = x;
    }
    *n = (int)json_array_size(v);
    return 1;
}
