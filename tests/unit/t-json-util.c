/*
 * Description: typed JSON getters: present/absent/null, wrong types, bounds,
 * required keys, integer-or-list values, and parse errors that name the
 * source, line and column (duplicate keys and trailing garbage rejected).
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "lib/json-util.h"
#include "tests/harness.h"

static json_t *parse(const char *s)
{
    struct dg_error err;
    return dg_json_parse(s, strlen(s), "t.json", &err);
}

static int case_parse_errors(void)
{
    struct dg_error err = {0};
    const char *bad[] = {"{\"a\": 1", "{\"a\": 1, \"a\": 2}", "{} x", ""};
    /* valid JSON, numbers past an int64 or a double: out of range */
    const char *big[] = {"{\"a\": 1e999}", "{\"a\": 99999999999999999999}", "[-1e400]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *v;
        dg_error_clear(&err);
        v = dg_json_parse(bad[i], strlen(bad[i]), "t.json", &err);
        CHECKF(!v, "accepted %s", bad[i]);
        CHECKF(err.code == DG_E_FORMAT && strstr(err.msg, "t.json: malformed JSON at line 1"),
               "%s: %s", bad[i], err.msg);
    }
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        dg_error_clear(&err);
        CHECKF(!dg_json_parse(big[i], strlen(big[i]), "t.json", &err), "accepted %s", big[i]);
        CHECKF(err.code == DG_E_RANGE && strstr(err.msg, "t.json: a number out of range at line 1"),
               "%s: %s", big[i], err.msg);
    }
    {
        json_t *v = parse("{\"a\": 1, \"a\": 2}");
        CHECK(!v);
        dg_json_parse("{\"a\": 1, \"a\": 2}", 16, "t.json", &err);
        CHECK(strstr(err.msg, "duplicate"));
    }
    {
        const char nul[] = "{\"a\": \"x\\u0000y\"}";
        CHECK(!dg_json_parse(nul, strlen(nul), "t.json", &err)); /* NUL in a string */
        CHECKF(strstr(err.msg, "t.json: a string holds \\u0000 (a NUL character)") &&
                   !strstr(err.msg, "JSON_ALLOW_NUL"), "%s", err.msg);
    }
    return 0;
}

static int case_int_getter(void)
{
    struct dg_error err = {0};
    json_t *o = parse("{\"n\": 5, \"s\": \"5\", \"r\": 5.0, \"z\": null, \"big\": 1000}");
    long long v = -1;

    CHECK(o);
    CHECK(dg_json_get_int(o, "n", 0, 10, DG_JSON_REQUIRED, "f: ", &v, &err) == 1 && v == 5);
    v = -1;
    CHECK(dg_json_get_int(o, "absent", 0, 10, DG_JSON_OPTIONAL, "f: ", &v, &err) == 0 && v == -1);
    CHECK(dg_json_get_int(o, "z", 0, 10, DG_JSON_OPTIONAL, "f: ", &v, &err) == 0 && v == -1);
    CHECK_FAILS(dg_json_get_int(o, "absent", 0, 10, DG_JSON_REQUIRED, "f: x.", &v, &err), &err,
                DG_E_CONFIG, "f: x.absent: required key is missing");
    CHECK_FAILS(dg_json_get_int(o, "s", 0, 10, DG_JSON_OPTIONAL, "f: ", &v, &err), &err,
                DG_E_CONFIG, "f: s: expected an integer, got a string");
    CHECK_FAILS(dg_json_get_int(o, "r", 0, 10, DG_JSON_OPTIONAL, "f: ", &v, &err), &err,
                DG_E_CONFIG, "expected an integer, got a real number");
    CHECK_FAILS(dg_json_get_int(o, "big", 0, 10, DG_JSON_OPTIONAL, "f: ", &v, &err), &err,
                DG_E_CONFIG, "f: big: 1000 is out of range [0, 10]");
    json_decref(o);
    return 0;
}

static int case_real_bool_string_object(void)
{
    struct dg_error err = {0};
    json_t *o = parse("{\"r\": 0.5, \"i\": 2, \"b\": true, \"s\": \"hi\", \"o\": {}, \"neg\": -1.5}");
    double d;
    int b;
    const char *s;
    json_t *sub;

    CHECK(o);
    CHECK(dg_json_get_real(o, "r", 0, 1, DG_JSON_REQUIRED, "", &d, &err) == 1 && d == 0.5);
    CHECK(dg_json_get_real(o, "i", 0, 3, DG_JSON_REQUIRED, "", &d, &err) == 1 && d == 2.0);
    CHECK_FAILS(dg_json_get_real(o, "neg", 0, 1, DG_JSON_REQUIRED, "c: ", &d, &err), &err,
                DG_E_CONFIG, "c: neg: -1.5 is out of range");
    CHECK_FAILS(dg_json_get_real(o, "s", 0, 1, DG_JSON_REQUIRED, "c: ", &d, &err), &err,
                DG_E_CONFIG, "expected a number, got a string");
    CHECK(dg_json_get_bool(o, "b", DG_JSON_REQUIRED, "", &b, &err) == 1 && b == 1);
    CHECK_FAILS(dg_json_get_bool(o, "i", DG_JSON_REQUIRED, "c: ", &b, &err), &err, DG_E_CONFIG,
                "expected a boolean, got an integer");
    CHECK(dg_json_get_string(o, "s", DG_JSON_REQUIRED, "", &s, &err) == 1 && !strcmp(s, "hi"));
    CHECK_FAILS(dg_json_get_string(o, "o", DG_JSON_REQUIRED, "c: ", &s, &err), &err, DG_E_CONFIG,
                "expected a string, got an object");
    CHECK(dg_json_get_object(o, "o", DG_JSON_REQUIRED, "", &sub, &err) == 1 && json_is_object(sub));
    CHECK_FAILS(dg_json_get_object(o, "s", DG_JSON_REQUIRED, "c: ", &sub, &err), &err, DG_E_CONFIG,
                "expected an object, got a string");
    json_decref(o);
    return 0;
}

static int case_int_list(void)
{
    struct dg_error err = {0};
    json_t *o = parse("{\"one\": 7, \"many\": [1, 106, 50], \"bad\": [1, \"x\"], "
                      "\"neg\": [1, -1], \"long\": [1,2,3,4,5]}");
    long long v[4];
    int n = 0;

    CHECK(o);
    CHECK(dg_json_get_int_list(o, "one", 0, 1000, DG_JSON_REQUIRED, "", v, 4, &n, &err) == 1);
    CHECK(n == 1 && v[0] == 7);
    CHECK(dg_json_get_int_list(o, "many", 0, 1000, DG_JSON_REQUIRED, "", v, 4, &n, &err) == 1);
    CHECK(n == 3 && v[0] == 1 && v[1] == 106 && v[2] == 50);
    CHECK_FAILS(dg_json_get_int_list(o, "bad", 0, 1000, DG_JSON_REQUIRED, "c: ", v, 4, &n, &err),
                &err, DG_E_CONFIG, "c: bad[1]: expected an integer, got a string");
    CHECK_FAILS(dg_json_get_int_list(o, "neg", 0, 1000, DG_JSON_REQUIRED, "c: ", v, 4, &n, &err),
                &err, DG_E_CONFIG, "c: neg[1]: -1 is out of range");
    CHECK_FAILS(dg_json_get_int_list(o, "long", 0, 1000, DG_JSON_REQUIRED, "c: ", v, 4, &n, &err),
                &err, DG_E_CONFIG, "5 values, at most 4 allowed");
    json_decref(o);
    return 0;
}

/* dg_json_dumps gives what json_dumps gives when memory is there. */
static int case_dumps(void)
{
    json_t *v = json_pack("{s:i,s:s,s:[i,f],s:{}}", "a", 1, "b\u00e9", "x\ny", "c", 2, 0.5, "d");
    char *s1, *s2;
    CHECK(v != NULL);
    s1 = dg_json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    s2 = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(s1 && s2 && !strcmp(s1, s2));
    free(s1);
    free(s2);
    json_decref(v);
    return 0;
}

/* dg_json_text against a byte-by-byte expectation built here: valid
 * UTF-8 kept as it is, each byte that starts no valid sequence replaced by
 * U+FFFD (overlong forms, surrogates, stray continuation bytes, a sequence
 * cut short); dg_json_number's null for what JSON cannot hold */
static int case_text_and_number(void)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"", ""},
        {"metrics.db", "metrics.db"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"a\xff" "b", "a\xef\xbf\xbd" "b"},
        {"\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},             /* overlong '/' */
        {"\xed\xa0\x80" "x", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "x"}, /* a surrogate */
        {"ok\xe2\x82", "ok\xef\xbf\xbd\xef\xbf\xbd"},             /* cut short */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = dg_json_text(cases[i].in);
        char *out;
        CHECK(j && json_is_string(j));
        CHECK(json_string_length(j) == strlen(cases[i].want));
        CHECK(!memcmp(json_string_value(j), cases[i].want, strlen(cases[i].want)));
        /* and jansson writes it */
        CHECK((out = json_dumps(j, JSON_ENCODE_ANY)) != NULL);
        free(out);
        json_decref(j);
    }
    {
        json_t *a = dg_json_number(1.5), *b = dg_json_number(INFINITY),
               *c = dg_json_number(-INFINITY), *d = dg_json_number(NAN);
        CHECK(a && json_is_real(a) && json_real_value(a) == 1.5);
        CHECK(b && json_is_null(b) && c && json_is_null(c) && d && json_is_null(d));
        json_decref(a);
        json_decref(b);
        json_decref(c);
        json_decref(d);
    }
    return 0;
}

/* The one-line form of a parse error: its position said as a column, the
 * source's name left out when asked. */
static int case_error_at_column(void)
{
    struct dg_error err = {0};
    char out[256];
    CHECK(!dg_json_parse("{\"a\": tru}", 11, "line", &err));
    dg_json_error_at_column(out, sizeof out, err.msg, "line");
    CHECKF(!strcmp(out, "malformed JSON at column 7: unexpected character"), "%s", out);
    dg_json_error_at_column(out, sizeof out, err.msg, NULL);
    CHECKF(!strcmp(out, "line: malformed JSON at column 7: unexpected character"), "%s", out);
    dg_json_error_at_column(out, sizeof out, err.msg, "other");
    CHECKF(!strcmp(out, "line: malformed JSON at column 7: unexpected character"), "%s", out);
    /* no position (or not on line 1): copied whole */
    dg_json_error_at_column(out, sizeof out, "line: out of memory parsing JSON", "line");
    CHECKF(!strcmp(out, "line: out of memory parsing JSON"), "%s", out);
    CHECK(!dg_json_parse("{\n\"a\": tru}", 12, "line", &err));
    dg_json_error_at_column(out, sizeof out, err.msg, "line");
    CHECKF(!strcmp(out, err.msg), "%s", out);
    return 0;
}

int main(void)
{
    TEST_CASE(case_parse_errors);
    TEST_CASE(case_int_getter);
    TEST_CASE(case_real_bool_string_object);
    TEST_CASE(case_int_list);
    TEST_CASE(case_dumps);
    TEST_CASE(case_text_and_number);
    TEST_CASE(case_error_at_column);
    return test_finish();
}
