/*
 * json-scan.h - a forward-only JSON cursor over a buffer, for large
 * documents read once (tokenizer.json: an object of 262k strings and an
 * array of 515k pairs) where building a DOM would cost seconds and millions
 * of allocations.
 *
 * The cursor validates as it goes: RFC 8259 syntax, strict UTF-8 inside
 * strings, escapes (\uXXXX surrogate pairs combined, lone surrogates and
 * raw control characters refused), integers without overflow, a nesting
 * limit.  Errors carry the source name and line:column.  Values it does
 * not need can be skipped, or their raw span captured for another parser.
 */
#ifndef DG_JSON_SCAN_H
#define DG_JSON_SCAN_H

#include <stddef.h>

#include "lib/error.h"

#define DG_JSCAN_MAX_DEPTH 64

struct dg_jscan {
    const char *base, *p, *end;
    const char *what;         /* source name for messages */
    struct dg_error *err;
    char *buf;                /* decoded string of the last dg_jscan_string() */
    size_t len, cap;
    int depth;                /* objects/arrays opened by *_begin and not yet closed */
    int prose;                /* errors read "what: malformed JSON at line L column C:
                               * msg" (set after dg_jscan_init), not "what:L:C: msg" */
    unsigned char first[DG_JSCAN_MAX_DEPTH + 1]; /* no element read yet at this depth */
};

/* Start scanning text[0..n).  Strings are decoded into a buffer the
 * scanner owns (dg_jscan_free). */
void dg_jscan_init(struct dg_jscan *s, const char *text, size_t n, const char *what,
                   struct dg_error *err);
void dg_jscan_free(struct dg_jscan *s);

/* The 1-based line and column of at (a point in the text). */
void dg_jscan_where(const struct dg_jscan *s, const char *at, size_t *line, size_t *col);

/* Record a DG_E_FORMAT error at the cursor: "what:line:col: msg" (or the
 * prose form, see prose). */
int dg_jscan_fail(struct dg_jscan *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The type of the next value: one of { [ " t f n or '0' for a number;
 * 0 at the end of input.  Skips whitespace. */
char dg_jscan_peek(struct dg_jscan *s);

/* Read a string into s->buf / s->len (NUL-terminated; may contain NULs). */
int dg_jscan_string(struct dg_jscan *s);

/* Read an integer (no fraction or exponent) in [lo, hi]. */
int dg_jscan_int(struct dg_jscan *s, long long lo, long long hi, long long *out);

/* Skip one value of any type. */
int dg_jscan_skip(struct dg_jscan *s);

/* Skip one value and give its raw text span. */
int dg_jscan_span(struct dg_jscan *s, const char **start, size_t *len);

/* Objects: call dg_jscan_object_begin, then dg_jscan_object_next until it
 * returns 0; each 1 leaves the key in s->buf and the cursor at its value,
 * which the caller must consume (read or skip). */
int dg_jscan_object_begin(struct dg_jscan *s);
int dg_jscan_object_next(struct dg_jscan *s);

/* Arrays: likewise; each 1 leaves the cursor at the next element. */
int dg_jscan_array_begin(struct dg_jscan *s);
int dg_jscan_array_next(struct dg_jscan *s);

/* After the top-level value: only whitespace may follow. */
int dg_jscan_finish(struct dg_jscan *s);

#endif
