/* json-scan.c - see json-scan.h. */
#include "lib/json-scan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"

void dg_jscan_init(struct dg_jscan *s, const char *text, size_t n, const char *what,
                   struct dg_error *err)
{
    memset(s, 0, sizeof *s);
    s->base = s->p = text;
    s->end = text + n;
    s->what = what;
    s->err = err;
}

void dg_jscan_free(struct dg_jscan *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

void dg_jscan_where(const struct dg_jscan *s, const char *at, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (const char *q = s->base; q < at && q < s->end; q++) {
        if (*q == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

int dg_jscan_fail(struct dg_jscan *s, const char *fmt, ...)
{
    char msg[512];
    size_t line, col;
    va_list ap;

    dg_jscan_where(s, s->p, &line, &col);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->prose)
        return dg_error_set(s->err, DG_E_FORMAT, "%s: malformed JSON at line %zu column %zu: %s",
                            s->what, line, col, msg);
    return dg_error_set(s->err, DG_E_FORMAT, "%s:%zu:%zu: %s", s->what, line, col, msg);
}

static void ws(struct dg_jscan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\t' || *s->p == '\r'))
        s->p++;
}

char dg_jscan_peek(struct dg_jscan *s)
{
    char c;
    ws(s);
    if (s->p >= s->end)
        return 0;
    c = *s->p;
    if (c == '-' || (c >= '0' && c <= '9'))
        return '0';
    return c;
}

static int put(struct dg_jscan *s, const char *src, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        char *b;
        while (cap < s->len + n + 1)
            cap *= 2;
        b = realloc(s->buf, cap);
        if (!b)
            return dg_error_set(s->err, DG_E_NOMEM, "%s: out of memory", s->what);
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, src, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return 0;
}

static int hex4(struct dg_jscan *s, unsigned *v)
{
    *v = 0;
    if (s->end - s->p < 4)
        return dg_jscan_fail(s, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        char c = s->p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d == 16)
            return dg_jscan_fail(s, "bad \\u escape");
        *v = *v * 16 + d;
    }
    s->p += 4;
    return 0;
}

int dg_jscan_string(struct dg_jscan *s)
{
    int rc;

    s->len = 0;
    if ((rc = put(s, "", 0)) < 0)
        return rc;
    ws(s);
    if (s->p >= s->end || *s->p != '"')
        return dg_jscan_fail(s, "expected a string");
    s->p++;
    for (;;) {
        const char *run = s->p;
        unsigned char c;
        while (s->p < s->end && (unsigned char)*s->p >= 0x20 && *s->p != '"' && *s->p != '\\' &&
               (unsigned char)*s->p < 0x80)
            s->p++;
        if (s->p > run && (rc = put(s, run, (size_t)(s->p - run))) < 0)
            return rc;
        if (s->p >= s->end)
            return dg_jscan_fail(s, "unterminated string");
        c = (unsigned char)*s->p;
        if (c == '"') {
            s->p++;
            return 0;
        }
        if (c < 0x20)
            return dg_jscan_fail(s, "raw control character 0x%02x in a string", c);
        if (c >= 0x80) {
            uint32_t cp;
            size_t l = dg_utf8_decode((const unsigned char *)s->p, (size_t)(s->end - s->p), &cp);
            if (!l)
                return dg_jscan_fail(s, "invalid UTF-8 in a string");
            if ((rc = put(s, s->p, l)) < 0)
                return rc;
            s->p += l;
            continue;
        }
        /* backslash escape */
        s->p++;
        if (s->p >= s->end)
            return dg_jscan_fail(s, "unterminated escape");
        c = (unsigned char)*s->p++;
        {
            char one;
            switch (c) {
            case '"': one = '"'; break;
            case '\\': one = '\\'; break;
            case '/': one = '/'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'n': one = '\n'; break;
            case 'r': one = '\r'; break;
            case 't': one = '\t'; break;
            case 'u': {
                unsigned u, lo;
                unsigned char out[4];
                size_t l;
                if ((rc = hex4(s, &u)) < 0)
                    return rc;
                if (u >= 0xdc00 && u <= 0xdfff)
                    return dg_jscan_fail(s, "lone low surrogate \\u%04x", u);
                if (u >= 0xd800 && u <= 0xdbff) {
                    if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u')
                        return dg_jscan_fail(s, "lone high surrogate \\u%04x", u);
                    s->p += 2;
                    if ((rc = hex4(s, &lo)) < 0)
                        return rc;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return dg_jscan_fail(s, "high surrogate \\u%04x without a low one", u);
                    u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                }
                l = dg_utf8_encode(u, out);
                if ((rc = put(s, (const char *)out, l)) < 0)
                    return rc;
                continue;
            }
            default:
                return dg_jscan_fail(s, "bad escape \\%c", c >= 0x20 && c < 0x7f ? c : '?');
            }
            if ((rc = put(s, &one, 1)) < 0)
                return rc;
        }
    }
}

int dg_jscan_int(struct dg_jscan *s, long long lo, long long hi, long long *out)
{
    long long v = 0;
    int neg = 0, digits = 0;
    const char *start;

    ws(s);
    start = s->p;
    if (s->p < s->end && *s->p == '-') {
        neg = 1;
        s->p++;
    }
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        int d = *s->p - '0';
        if (digits == 1 && v == 0)
            return dg_jscan_fail(s, "leading zero in a number");
        if (v > (9223372036854775807LL - d) / 10)
            return dg_jscan_fail(s, "integer overflow");
        v = v * 10 + d;
        digits++;
        s->p++;
    }
    if (!digits) {
        s->p = start;
        return dg_jscan_fail(s, "expected an integer");
    }
    if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E'))
        return dg_jscan_fail(s, "expected an integer, got a real number");
    if (neg)
        v = -v;
    if (v < lo || v > hi)
        return dg_jscan_fail(s, "%lld is out of range [%lld, %lld]", v, lo, hi);
    *out = v;
    return 0;
}

static int skip_number(struct dg_jscan *s)
{
    const char *start = s->p;
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return dg_jscan_fail(s, "bad number");
    if (*s->p == '0')
        s->p++;
    else
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9')
            return dg_jscan_fail(s, "bad number");
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9')
            return dg_jscan_fail(s, "bad number");
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    }
    (void)start;
    return 0;
}

static int literal(struct dg_jscan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return dg_jscan_fail(s, "unexpected character");
    s->p += n;
    return 0;
}

static int skip_value(struct dg_jscan *s, int depth)
{
    char c = dg_jscan_peek(s);
    int rc;

    if (depth > DG_JSCAN_MAX_DEPTH)
        return dg_jscan_fail(s, "nesting deeper than %d", DG_JSCAN_MAX_DEPTH);
    switch (c) {
    case '"':
        return dg_jscan_string(s);
    case '0':
        return skip_number(s);
    case 't':
        return literal(s, "true");
    case 'f':
        return literal(s, "false");
    case 'n':
        return literal(s, "null");
    case '{':
    case '[': {
        const char close = c == '{' ? '}' : ']';
        int first = 1;
        s->p++;
        for (;;) {
            ws(s);
            if (s->p < s->end && *s->p == close && first) {
                s->p++;
                return 0;
            }
            if (!first) {
                if (s->p < s->end && *s->p == close) {
                    s->p++;
                    return 0;
                }
                if (s->p >= s->end || *s->p != ',')
                    return dg_jscan_fail(s, "expected ',' or '%c'", close);
                s->p++;
            }
            first = 0;
            if (c == '{') {
                if ((rc = dg_jscan_string(s)) < 0)
                    return rc;
                ws(s);
                if (s->p >= s->end || *s->p != ':')
                    return dg_jscan_fail(s, "expected ':'");
                s->p++;
            }
            if ((rc = skip_value(s, depth + 1)) < 0)
                return rc;
        }
    }
    case 0:
        return dg_jscan_fail(s, "unexpected end of input");
    default:
        return dg_jscan_fail(s, "unexpected character");
    }
}

int dg_jscan_skip(struct dg_jscan *s)
{
    return skip_value(s, s->depth);
}

int dg_jscan_span(struct dg_jscan *s, const char **start, size_t *len)
{
    int rc;
    ws(s);
    *start = s->p;
    rc = dg_jscan_skip(s);
    *len = (size_t)(s->p - *start);
    return rc;
}

static int open_container(struct dg_jscan *s, char open, const char *what)
{
    ws(s);
    if (s->p >= s->end || *s->p != open)
        return dg_jscan_fail(s, "expected %s", what);
    if (s->depth >= DG_JSCAN_MAX_DEPTH)
        return dg_jscan_fail(s, "nesting deeper than %d", DG_JSCAN_MAX_DEPTH);
    s->p++;
    s->first[++s->depth] = 1;
    return 0;
}

/* 1: an element follows; 0: the container closed; <0: error */
static int next_element(struct dg_jscan *s, char close)
{
    ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        s->depth--;
        return 0;
    }
    if (!s->first[s->depth]) {
        if (s->p >= s->end || *s->p != ',')
            return dg_jscan_fail(s, "expected ',' or '%c'", close);
        s->p++;
        ws(s);
    }
    s->first[s->depth] = 0;
    if (s->p >= s->end)
        return dg_jscan_fail(s, "unexpected end of input");
    return 1;
}

int dg_jscan_object_begin(struct dg_jscan *s)
{
    return open_container(s, '{', "an object");
}

int dg_jscan_object_next(struct dg_jscan *s)
{
    int rc = next_element(s, '}');
    if (rc <= 0)
        return rc;
    if ((rc = dg_jscan_string(s)) < 0)
        return rc;
    ws(s);
    if (s->p >= s->end || *s->p != ':')
        return dg_jscan_fail(s, "expected ':'");
    s->p++;
    return 1;
}

int dg_jscan_array_begin(struct dg_jscan *s)
{
    return open_container(s, '[', "an array");
}

int dg_jscan_array_next(struct dg_jscan *s)
{
    return next_element(s, ']');
}

int dg_jscan_finish(struct dg_jscan *s)
{
    ws(s);
    if (s->p != s->end)
        return dg_jscan_fail(s, "unexpected data after the JSON value");
    return 0;
}
