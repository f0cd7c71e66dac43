/*
 * Description: the JSON reader (lib/json-load.c) against jansson's own
 * parser as the reference, on random documents written here (escapes,
 * surrogate pairs, raw UTF-8, int64 edges, reals, nesting, whitespace) and
 * on random byte mutations of them: the same verdict, equal values, a
 * range error only where jansson reports a numeric overflow.  Then every
 * allocation jansson makes for the reader failed in turn: each must give
 * NULL and DG_E_NOMEM, with no bad access in the ASan build (jansson's own
 * parser, given the first text there, writes past the heap when one of its
 * allocations fails: docs/reliability.md).  Then the flags, the depth limit
 * and the messages' line and column.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-util.h"
#include "tests/harness.h"
#include "tests/json-alloc.h"

#define DOC_MAX 16384

struct doc {
    char s[DOC_MAX];
    size_t n;
    int full; /* ran out of room: the document is not used */
};

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static unsigned pick(unsigned n)
{
    return (unsigned)(test_xorshift(&rng) % n);
}

static void put(struct doc *d, const char *s, size_t n)
{
    if (d->n + n >= DOC_MAX) {
        d->full = 1;
        return;
    }
    memcpy(d->s + d->n, s, n);
    d->n += n;
}

static void puts_(struct doc *d, const char *s)
{
    put(d, s, strlen(s));
}

static void ws(struct doc *d)
{
    static const char *const w[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    puts_(d, w[pick(7)]);
}

/* A string token: plain ASCII, escapes, \u escapes (BMP and surrogate
 * pairs), raw 2-, 3- and 4-byte UTF-8; its length drawn so that some end
 * right at jansson's buffer sizes (16, 32, 64 bytes). */
static void gen_string(struct doc *d, int allow_nul)
{
    static const char *const esc[] = {"\\n", "\\\"", "\\\\", "\\/", "\\t", "\\b", "\\f",
                                      "\\r", "\\u00e9", "\\u20AC", "\\ud83d\\ude00"};
    static const char *const raw[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    unsigned n = pick(4) == 0 ? 14 + 16 * pick(4) : pick(20);
    put(d, "\"", 1);
    for (unsigned i = 0; i < n; i++) {
        unsigned k = pick(20);
        if (k < 13) {
            char c = (char)('a' + pick(26));
            put(d, &c, 1);
        } else if (k < 17) {
            puts_(d, esc[pick(sizeof esc / sizeof esc[0])]);
        } else if (k < 19) {
            puts_(d, raw[pick(3)]);
        } else if (allow_nul) {
            puts_(d, "\\u0000");
        }
    }
    put(d, "\"", 1);
}

static void gen_number(struct doc *d)
{
    static const char *const fixed[] = {
        "0", "-0", "9223372036854775807", "-9223372036854775808", "1.5", "-0.25",
        "1e10", "2E-3", "6.02e+23", "1e308", "4.9e-324", "1e-400", "0.1", "123456789.125"};
    char b[48];
    switch (pick(3)) {
    case 0:
        puts_(d, fixed[pick(sizeof fixed / sizeof fixed[0])]);
        break;
    case 1:
        snprintf(b, sizeof b, "%lld", (long long)(test_xorshift(&rng) >> pick(64)) *
                                          (pick(2) ? 1 : -1));
        puts_(d, b);
        break;
    default:
        snprintf(b, sizeof b, "%.*g", 1 + (int)pick(17),
                 (double)(int64_t)test_xorshift(&rng) / (double)(1ULL << pick(64)));
        puts_(d, b);
        break;
    }
}

static void gen_value(struct doc *d, int depth, int allow_nul)
{
    unsigned k = depth >= 6 ? 3 + pick(5) : pick(8);
    ws(d);
    if (k == 0 || k == 1) {
        unsigned n = pick(6);
        put(d, "{", 1);
        for (unsigned i = 0; i < n; i++) {
            char key[24];
            if (i)
                put(d, ",", 1);
            ws(d);
            if (pick(3) == 0) {
                gen_string(d, 0);
            } else {
                /* distinct keys, so duplicates come only from mutations */
                snprintf(key, sizeof key, "\"k%u_%u\"", (unsigned)depth, i);
                puts_(d, key);
            }
            ws(d);
            put(d, ":", 1);
            gen_value(d, depth + 1, allow_nul);
        }
        ws(d);
        put(d, "}", 1);
    } else if (k == 2) {
        unsigned n = pick(7);
        put(d, "[", 1);
        for (unsigned i = 0; i < n; i++) {
            if (i)
                put(d, ",", 1);
            gen_value(d, depth + 1, allow_nul);
        }
        ws(d);
        put(d, "]", 1);
    } else if (k == 3 || k == 4) {
        gen_string(d, allow_nul);
    } else if (k == 5) {
        gen_number(d);
    } else {
        static const char *const lit[] = {"true", "false", "null"};
        puts_(d, lit[pick(3)]);
    }
    ws(d);
}

/* A document whose top level is an object or an array. */
static void gen_doc(struct doc *d, int allow_nul)
{
    for (;;) {
        d->n = 0;
        d->full = 0;
        gen_value(d, 0, allow_nul);
        d->s[d->n] = '\0';
        if (!d->full && strchr("{[", d->s[strspn(d->s, " \t\r\n")]) &&
            d->s[strspn(d->s, " \t\r\n")] != '\0')
            return;
    }
}

/* One byte changed, removed or inserted, or the text cut short. */
static size_t mutate(char *s, size_t n)
{
    static const char alphabet[] = "{}[]\",:\\u0123456789eE.-+ \ntfnlrsa\x01\x7f";
    size_t at = n ? pick((unsigned)n) : 0;
    char c = pick(8) == 0 ? (char)(0x80 + pick(128)) : alphabet[pick(sizeof alphabet - 1)];
    switch (pick(4)) {
    case 0:
        if (n)
            s[at] = c;
        return n;
    case 1:
        if (!n)
            return n;
        memmove(s + at, s + at + 1, n - at - 1);
        return n - 1;
    case 2:
        if (n + 1 >= DOC_MAX)
            return n;
        memmove(s + at + 1, s + at, n - at);
        s[at] = c;
        return n + 1;
    default:
        return at;
    }
}

/* Both readers on one text: the same verdict, equal values, and a range
 * error only where jansson reports a numeric overflow, or bad UTF-8 right
 * after the number (jansson decodes the character that ends a number
 * before it reads the number).  Not the converse: jansson reads a token
 * before it looks at where it stands, so in "[1 2e999]" it reports the
 * overflow where this reader reports the missing comma. */
static int compare(const char *s, size_t n, size_t flags)
{
    struct dg_error err = {0};
    json_error_t je;
    json_t *ours = dg_json_loadb(s, n, flags, "t", &err);
    json_t *ref = json_loadb(s, n, flags, &je);
    int ok = 1;

    if (!!ours != !!ref)
        ok = test_fail(__FILE__, __LINE__, "verdicts differ on %.*s: ours %s (%s), jansson %s (%s)",
                       (int)(n < 300 ? n : 300), s, ours ? "took it" : "refused", err.msg,
                       ref ? "took it" : "refused", ref ? "" : je.text) == 0;
    else if (ours && !json_equal(ours, ref))
        ok = test_fail(__FILE__, __LINE__, "values differ on %.*s", (int)(n < 300 ? n : 300),
                       s) == 0;
    else if (!ours && err.code == DG_E_RANGE &&
             json_error_code(&je) != json_error_numeric_overflow &&
             json_error_code(&je) != json_error_invalid_utf8)
        ok = test_fail(__FILE__, __LINE__, "range verdicts differ on %.*s: ours %s, jansson %s",
                       (int)(n < 300 ? n : 300), s, err.msg, je.text) == 0;
    else if (!ours && err.code != DG_E_RANGE && err.code != DG_E_FORMAT)
        ok = test_fail(__FILE__, __LINE__, "refused with %s: %s", dg_status_name(err.code),
                       err.msg) == 0;
    json_decref(ours);
    json_decref(ref);
    return ok ? 0 : 1;
}

static int case_same_as_jansson(void)
{
    static struct doc d;
    static const size_t flags[] = {0, JSON_REJECT_DUPLICATES, JSON_ALLOW_NUL,
                                   JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL};
    int docs = getenv("DG_TEST_QUICK") ? 150 : 600;
    for (int i = 0; i < docs; i++) {
        size_t f = flags[i % 4];
        gen_doc(&d, (f & JSON_ALLOW_NUL) != 0);
        if (compare(d.s, d.n, f))
            return 1;
        for (int m = 0; m < 30; m++) {
            static char t[DOC_MAX];
            size_t n = d.n;
            memcpy(t, d.s, n);
            for (unsigned k = 1 + pick(3); k > 0; k--)
                n = mutate(t, n);
            if (compare(t, n, f))
                return 1;
        }
    }
    return 0;
}

/* ---- failed allocations ------------------------------------------------------ */

static int case_failed_allocations(void)
{
    /* the first key's closing quote lands on jansson's buffer boundary
     * (its 16th byte), where jansson's own parser writes past the heap */
    static const char *const texts[] = {
        "{\"abcdefghijklmn\": 1}",
        "{\"abcdefghijklmn\": \"abcdefghijklmnopqrstuvwxyz012\", \"x\": [1, 2.5, \"\\u00e9\"],"
        " \"y\": {\"z\": [true, false, null, {\"w\": -7}]}}",
        "[\"" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", {\"a\": {\"b\": {\"c\": [[[]]]}}}]",
    };
    int bad = 0;

    tj_alloc_hold();
    for (size_t i = 0; i < sizeof texts / sizeof texts[0] && !bad; i++) {
        const size_t n = strlen(texts[i]);
        struct dg_error err = {0};
        json_t *whole, *v;
        long total;
        tj_alloc_arm(-1, 0);
        whole = dg_json_parse(texts[i], n, "t", &err);
        total = tj_alloc_calls();
        if (!whole || total < 3) {
            bad = test_fail(__FILE__, __LINE__, "text %zu: %s, %ld allocations", i, err.msg,
                            total);
            break;
        }
        for (long fail_at = 0; fail_at < total && !bad; fail_at++) {
            tj_alloc_arm(fail_at, 0);
            dg_error_clear(&err);
            v = dg_json_parse(texts[i], n, "t", &err);
            if (v || err.code != DG_E_NOMEM || !strstr(err.msg, "t: out of memory parsing JSON"))
                bad = test_fail(__FILE__, __LINE__, "text %zu, allocation %ld failed: %s (%s)",
                                i, fail_at, v ? "a value" : "NULL", err.msg);
            json_decref(v);
        }
        json_decref(whole);
    }
    tj_alloc_release();
    return bad;
}

/* ---- flags, depth, messages ---------------------------------------------------- */

static int case_flags_and_depth(void)
{
    struct dg_error err = {0};
    char deep[200];
    json_t *v;
    int i;

    /* a scalar at the top: only with JSON_DECODE_ANY */
    CHECK(!dg_json_loadb(" 42 ", 4, 0, "t", &err) && err.code == DG_E_FORMAT);
    CHECKF(strstr(err.msg, "t: malformed JSON at line 1 column 2: expected an object or an array"),
           "%s", err.msg);
    v = dg_json_loadb(" 42 ", 4, JSON_DECODE_ANY, "t", &err);
    CHECK(v && json_integer_value(v) == 42);
    json_decref(v);
    CHECK(!dg_json_loadb("", 0, JSON_DECODE_ANY, "t", &err) && err.code == DG_E_FORMAT);
    /* a flag it does not know */
    CHECK(!dg_json_loadb("{}", 2, JSON_DISABLE_EOF_CHECK, "t", &err) && err.code == DG_E_INVAL);
    /* NUL: in a value only with JSON_ALLOW_NUL, in a key never */
    v = dg_json_loadb("[\"a\\u0000b\"]", 12, JSON_ALLOW_NUL, "t", &err);
    CHECK(v && json_string_length(json_array_get(v, 0)) == 3);
    json_decref(v);
    CHECK(!dg_json_loadb("{\"a\\u0000\": 1}", 14, JSON_ALLOW_NUL, "t", &err) &&
          err.code == DG_E_FORMAT && strstr(err.msg, "NUL character"));
    /* a later duplicate replaces the earlier one unless refused */
    v = dg_json_loadb("{\"a\": 1, \"a\": 2}", 16, 0, "t", &err);
    CHECK(v && json_integer_value(json_object_get(v, "a")) == 2);
    json_decref(v);
    /* 64 levels of nesting are taken, 65 are not */
    for (i = 0; i < 65; i++)
        deep[i] = '[', deep[130 - i - 1] = ']';
    v = dg_json_loadb(deep + 1, 128, 0, "t", &err);
    CHECKF(v, "%s", err.msg);
    json_decref(v);
    CHECK(!dg_json_loadb(deep, 130, 0, "t", &err) && err.code == DG_E_FORMAT &&
          strstr(err.msg, "nesting deeper than 64"));
    /* line and column: of the offending character */
    CHECK(!dg_json_loadb("{\n  \"a\": tru}", 13, 0, "t", &err));
    CHECKF(strstr(err.msg, "t: malformed JSON at line 2 column 8"), "%s", err.msg);
    CHECK(!dg_json_loadb("{\"a\":\n 1e999}", 13, 0, "t", &err) && err.code == DG_E_RANGE);
    CHECKF(strstr(err.msg, "t: a number out of range at line 2 column 2: 1e999"), "%s", err.msg);
    return 0;
}

int main(void)
{
    TEST_CASE(case_same_as_jansson);
    TEST_CASE(case_failed_allocations);
    TEST_CASE(case_flags_and_depth);
    return test_finish();
}
