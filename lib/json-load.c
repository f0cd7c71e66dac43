/*
 * json-load.c - a JSON text to a jansson value: read by this project's own
 * validating cursor (json-scan.c), built with jansson's constructors.
 *
 * Why not json_loadb: jansson 2.14's lexer keeps each token's text in a
 * buffer that grows as it reads, ignores a failed growth (the byte is just
 * not kept), and then decodes a string token a second time from that
 * buffer, trusting it to end in a quote.  When the allocation that would
 * have kept the closing quote fails, the second pass runs past the buffer
 * and writes past its own output: one failed malloc corrupts the heap
 * (docs/reliability.md).  Here every failed allocation is an error and
 * nothing is read twice.
 *
 * Accepted as jansson accepts by default: RFC 8259 text, strict UTF-8,
 * integers in an int64 (else a range error), reals by strtod in the C
 * locale (an overflow is a range error, an underflow rounds), a later
 * duplicate key replaces the earlier one unless JSON_REJECT_DUPLICATES.
 * Differences: nesting deeper than DG_JSCAN_MAX_DEPTH (64) is refused
 * (jansson: 2048); a raw NUL byte in the text is always refused (jansson
 * skips one that follows a number or a literal, anywhere: "[1\0]" is [1]
 * to it, " null\0" null); where a text has two faults, the first in
 * reading order is named (jansson reads a token before it checks where it
 * stands); and the error texts are this project's own words.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l */
#endif
#include <locale.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-scan.h"
#include "lib/json-util.h"

/* The flags this reader knows; any other is refused (DG_E_INVAL). */
#define KNOWN_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

struct loader {
    struct dg_jscan s;
    size_t flags;
    const char *what;
    struct dg_error *err;
};

static int nomem(struct loader *L)
{
    return dg_error_set(L->err, DG_E_NOMEM, "%s: out of memory parsing JSON", L->what);
}

/* The C locale for strtod_l, made once (newlocale may fail: then NULL and
 * the caller reports it as out of memory; a later call tries again). */
static locale_t c_locale(void)
{
    static _Atomic(locale_t) made;
    locale_t l = atomic_load(&made), fresh, none = (locale_t)0;
    if (l)
        return l;
    if (!(fresh = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0)))
        return (locale_t)0;
    if (atomic_compare_exchange_strong(&made, &none, fresh))
        return fresh;
    freelocale(fresh); /* another thread's won */
    return none;
}

/* A number at the cursor.  Integers (no fraction, no exponent) must fit an
 * int64; reals must be finite after rounding.  Either failure is
 * DG_E_RANGE, as the text is valid JSON. */
static json_t *load_number(struct loader *L)
{
    const char *at, *q;
    size_t n, line, col;
    int integral = 1;
    json_t *v;

    if (dg_jscan_span(&L->s, &at, &n) < 0)
        return NULL;
    for (q = at; q < at + n; q++)
        if (*q == '.' || *q == 'e' || *q == 'E')
            integral = 0;
    if (integral) {
        const int neg = *at == '-';
        const unsigned long long limit = neg ? (unsigned long long)INT64_MAX + 1 : INT64_MAX;
        unsigned long long u = 0;
        for (q = at + neg; q < at + n; q++) {
            unsigned d = (unsigned)(*q - '0');
            if (u > (limit - d) / 10)
                goto range;
            u = u * 10 + d;
        }
        /* (-2^63 has no positive counterpart: made from -(2^63 - 1) - 1) */
        v = json_integer(!neg ? (json_int_t)u
                         : u > (unsigned long long)INT64_MAX ? -(json_int_t)(u - 1) - 1
                                                             : -(json_int_t)u);
    } else {
        char small[64], *copy = n < sizeof small ? small : malloc(n + 1);
        locale_t loc = c_locale();
        double x;
        if (!copy || !loc) {
            if (copy != small)
                free(copy);
            nomem(L);
            return NULL;
        }
        memcpy(copy, at, n);
        copy[n] = '\0';
        x = strtod_l(copy, NULL, loc); /* (the syntax is checked: it reads it all) */
        if (copy != small)
            free(copy);
        if (isinf(x))
            goto range;
        v = json_real(x);
    }
    if (!v)
        nomem(L);
    return v;
range:
    dg_jscan_where(&L->s, at, &line, &col);
    dg_error_set(L->err, DG_E_RANGE, "%s: a number out of range at line %zu column %zu: %.*s",
                 L->what, line, col, (int)(n < 40 ? n : 40), at);
    return NULL;
}

/* Refuse the string just read (in s.buf) if it holds a NUL where none is
 * taken: a key always, a value unless JSON_ALLOW_NUL.  at: where it began. */
static int check_nul(struct loader *L, const char *at, int key)
{
    size_t line, col;
    if (!memchr(L->s.buf, '\0', L->s.len) || (!key && (L->flags & JSON_ALLOW_NUL)))
        return 0;
    dg_jscan_where(&L->s, at, &line, &col);
    return dg_error_set(L->err, DG_E_FORMAT,
                        "%s: a string holds \\u0000 (a NUL character), which is not taken%s, "
                        "at line %zu column %zu",
                        L->what, key ? " in a key" : "", line, col);
}

static json_t *load_value(struct loader *L);

static json_t *load_object(struct loader *L)
{
    json_t *o = json_object();
    int more;

    if (!o) {
        nomem(L);
        return NULL;
    }
    if (dg_jscan_object_begin(&L->s) < 0)
        goto fail;
    while ((more = dg_jscan_object_next(&L->s)) == 1) {
        /* the key is in s.buf until the value is read: keep a copy */
        char small[128], *key;
        json_t *v;
        if (check_nul(L, L->s.p, 1) < 0)
            goto fail;
        if ((L->flags & JSON_REJECT_DUPLICATES) && json_object_get(o, L->s.buf)) {
            dg_jscan_fail(&L->s, "duplicate object key \"%.60s\"", L->s.buf);
            goto fail;
        }
        key = L->s.len < sizeof small ? small : malloc(L->s.len + 1);
        if (!key) {
            nomem(L);
            goto fail;
        }
        memcpy(key, L->s.buf, L->s.len + 1);
        v = load_value(L);
        if (v && json_object_set_new_nocheck(o, key, v) < 0) {
            nomem(L); /* (set_new released v) */
            v = NULL;
        }
        if (key != small)
            free(key);
        if (!v)
            goto fail;
    }
    if (more < 0)
        goto fail;
    return o;
fail:
    json_decref(o);
    return NULL;
}

static json_t *load_array(struct loader *L)
{
    json_t *a = json_array();
    int more;

    if (!a) {
        nomem(L);
        return NULL;
    }
    if (dg_jscan_array_begin(&L->s) < 0)
        goto fail;
    while ((more = dg_jscan_array_next(&L->s)) == 1) {
        json_t *v = load_value(L);
        if (!v)
            goto fail;
        if (json_array_append_new(a, v) < 0) {
            nomem(L);
            goto fail;
        }
    }
    if (more < 0)
        goto fail;
    return a;
fail:
    json_decref(a);
    return NULL;
}

/* One value at the cursor (nesting bounded by the cursor's depth limit). */
static json_t *load_value(struct loader *L)
{
    const char *at;
    json_t *v;

    switch (dg_jscan_peek(&L->s)) {
    case '{':
        return load_object(L);
    case '[':
        return load_array(L);
    case '0':
        return load_number(L);
    case '"':
        at = L->s.p;
        if (dg_jscan_string(&L->s) < 0 || check_nul(L, at, 0) < 0)
            return NULL;
        if (!(v = json_stringn_nocheck(L->s.buf, L->s.len)))
            nomem(L);
        return v;
    case 't':
    case 'f':
    case 'n':
        at = L->s.p;
        if (dg_jscan_skip(&L->s) < 0)
            return NULL;
        return *at == 't' ? json_true() : *at == 'f' ? json_false() : json_null();
    case 0:
        dg_jscan_fail(&L->s, "unexpected end of input");
        return NULL;
    default:
        dg_jscan_fail(&L->s, "unexpected character");
        return NULL;
    }
}

json_t *dg_json_loadb(const char *buf, size_t len, size_t flags, const char *what,
                      struct dg_error *err)
{
    struct dg_error local = {0};
    struct loader L = {.flags = flags, .what = what, .err = err ? err : &local};
    json_t *v = NULL;
    char first;

    if (flags & ~(size_t)KNOWN_FLAGS) {
        dg_error_set(L.err, DG_E_INVAL, "%s: JSON flags %#zx not supported", what,
                     flags & ~(size_t)KNOWN_FLAGS);
        return NULL;
    }
    dg_jscan_init(&L.s, buf, len, what, L.err);
    L.s.prose = 1;
    first = dg_jscan_peek(&L.s);
    if (!(flags & JSON_DECODE_ANY) && first != '{' && first != '[')
        dg_jscan_fail(&L.s, first ? "expected an object or an array"
                                  : "no JSON value (empty input)");
    else if ((v = load_value(&L)) && dg_jscan_finish(&L.s) < 0) {
        json_decref(v);
        v = NULL;
    }
    if (!v && L.err->code == DG_E_NOMEM)
        nomem(&L); /* (the cursor's own words name no JSON) */
    dg_jscan_free(&L.s);
    return v;
}

json_t *dg_json_parse(const char *buf, size_t len, const char *what, struct dg_error *err)
{
    return dg_json_loadb(buf, len, JSON_REJECT_DUPLICATES, what, err);
}
