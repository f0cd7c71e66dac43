/*
 * Fuzz target: `dgemma-client batch`'s files (client/batch-input.c), the
 * input read as JSON lines and the same bytes read as an output file being
 * resumed.  Properties:
 *  - the output scan keeps exactly the complete lines, and its keys are
 *    exactly those of the result lines in them (none marked done that is
 *    not there, none missed), with the error results counted;
 *  - on a fresh input every non-blank line (blank: only spaces, tabs and
 *    line ends) is an item with a unique non-empty key (its id's JSON) or
 *    a bad line with a stable code and a message, whose result names its
 *    line number (a duplicate's message
 *    the earlier line); each item's request is refused with a reason, or
 *    is one the daemon's parser accepts in form: a generate with exactly
 *    one prompt, not streaming, a batch job's, carrying the item's tag
 *    (and a refusal by the daemon still carries that tag);
 *  - resuming against the same bytes as output runs no item already in it;
 *  - once every line has its result, a re-run finds nothing left to do.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/batch-input.h"
#include "daemon/protocol.h"
#include "tests/fuzz/fuzz-proto-ctx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct dproto_ctx *ctx; /* fuzz-proto-ctx.h's */
static json_t *flags; /* the settings flags every item gets */

static void setup(void)
{
    ctx = &fuzz_proto_ctx()->ctx;
    flags = json_pack("{s:i,s:f}", "max_tokens", 16, "top_p", 0.9);
    if (!flags)
        abort();
}

/* Containers nested in v, v included (0 for a scalar). */
static int nesting(const json_t *v)
{
    int most = 0, d;
    if (json_is_object(v)) {
        const char *key;
        json_t *m;
        json_object_foreach((json_t *)v, key, m)
            if ((d = nesting(m)) > most)
                most = d;
        return most + 1;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if ((d = nesting(json_array_get(v, i))) > most)
                most = d;
        return most + 1;
    }
    return 0;
}

/* The result key of one output line (as the spec says, independently of
 * batch_output_scan), or NULL; *is_error set.  A result's text can hold a
 * NUL (written \u0000): that line is still a result.  jansson's parser is
 * the reference, less what the project's reader refuses by rule
 * (lib/json-load.c): a raw NUL byte anywhere (jansson skips one after a
 * number or a literal) and nesting deeper than 64; such a line is no
 * result. */
static char *result_key(const char *line, size_t n, int *is_error)
{
    json_t *r = memchr(line, '\0', n) ? NULL : json_loadb(line, n, JSON_ALLOW_NUL, NULL), *id, *ln;
    char *k = NULL;
    *is_error = 0;
    if (nesting(r) > 64) {
        json_decref(r);
        return NULL;
    }
    if (json_is_object(r)) {
        id = json_object_get(r, "id");
        ln = json_object_get(r, "line");
        if (id) {
            k = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        } else if (json_is_integer(ln)) {
            char b[64];
            snprintf(b, sizeof b, "line:%lld", (long long)json_integer_value(ln));
            k = strdup(b);
        }
        *is_error = json_object_get(r, "error") != NULL;
    }
    json_decref(r);
    return k;
}

/* Scan buf as an output file and check it against the spec; the keys. */
static json_t *scan_checked(const char *buf, size_t len, int *failed_before)
{
    json_t *seen = json_object(), *expect = json_object();
    const char *last = len ? memrchr(buf, '\n', len) : NULL;
    size_t keep, want = last ? (size_t)(last - buf) + 1 : 0;
    int fb = 0, want_fb = 0;
    const char *k;
    json_t *v;

    if (!seen || !expect)
        abort();
    if (batch_output_scan(buf, len, seen, &fb, &keep) != 0)
        abort(); /* (no allocation fails here) */
    if (keep != want)
        abort(); /* a complete line cut, or a torn one kept */
    for (size_t p = 0; p < keep;) {
        const char *nl = memchr(buf + p, '\n', keep - p);
        int err;
        char *key = result_key(buf + p, (size_t)(nl - (buf + p)), &err);
        if (key && !json_object_get(expect, key)) {
            json_object_set_new(expect, key, json_boolean(!err));
            want_fb += err;
        }
        free(key);
        p = (size_t)(nl - buf) + 1;
    }
    json_object_foreach(seen, k, v)
        if (!json_object_get(expect, k) || !json_equal(v, json_object_get(expect, k)))
            abort(); /* marked done, but no result line has it (or not as it is) */
    if (json_object_size(seen) != json_object_size(expect) || fb != want_fb)
        abort();
    json_decref(expect);
    *failed_before = fb;
    return seen;
}

/* The request of the index-th item: refused with a reason, or a generate
 * the daemon's parser takes in form, carrying the item's tag. */
static void check_request(const json_t *obj, size_t index)
{
    static const char *const KEYS[] = {"prompt", "messages", "prompt_ids"};
    enum batch_prompt kind;
    json_t *prompt, *extra, *body, *t;
    const char *why;
    char tag[32];
    struct dproto_request r;
    struct dproto_error e;
    int rc = batch_request_parts(obj, flags, index, &kind, &prompt, &extra, &why);

    if (rc == 1) {
        if (!why || !why[0] || prompt || extra)
            abort();
        return;
    }
    if (rc != 0 || kind < BATCH_PROMPT_TEXT || kind > BATCH_PROMPT_IDS || !prompt || !extra)
        abort();
    snprintf(tag, sizeof tag, "b%zu", index);
    t = json_object_get(extra, "tag");
    if (!json_is_string(t) || strcmp(json_string_value(t), tag) ||
        !json_is_false(json_object_get(extra, "stream")) ||
        !json_is_true(json_object_get(extra, "batch")) || json_object_get(extra, "id") ||
        json_object_get(extra, "v") || json_object_get(extra, "op"))
        abort();
    /* the request as libdgemma makes it: the prompt's constructor, then set_json(extra) */
    body = json_pack("{s:i,s:s,s:O}", "v", 1, "op", "generate", KEYS[kind - 1], prompt);
    if (!body || json_object_update(body, extra) != 0)
        abort();
    if (!!json_object_get(body, "prompt") + !!json_object_get(body, "messages") +
            !!json_object_get(body, "prompt_ids") != 1)
        abort();
    if (dproto_parse_json(body, ctx, &r, &e) < 0) {
        /* refused for what it asks, never for its form; the error still routes */
        if (!strcmp(e.code, "bad_json") || !strcmp(e.code, "bad_version") ||
            !strcmp(e.code, "unknown_op") || e.op != DPROTO_GENERATE || !e.has_tag ||
            strcmp(e.tag, tag) || r.ids)
            abort();
    } else {
        if (r.op != DPROTO_GENERATE || !r.has_tag || strcmp(r.tag, tag) || r.stream || !r.batch ||
            (int)r.prompt_kind != (int)kind)
            abort();
        dproto_request_free(&r);
    }
    json_decref(body);
    json_decref(prompt);
    json_decref(extra);
}

/* The line a duplicate_id message names (its last "is already on line N":
 * the id it quotes may hold the words too). */
static long earlier_line(const char *msg)
{
    static const char w[] = "is already on line ";
    const char *p = NULL;
    for (const char *q = msg; (q = strstr(q, w)) != NULL; q++)
        p = q;
    return p ? strtol(p + strlen(w), NULL, 10) : -1;
}

/* Read buf as the input against seen (NULL: a fresh run), checking each
 * line; with results non-NULL, append the result line each would get. */
static void read_checked(const char *buf, size_t len, const json_t *seen, json_t *results,
                         size_t *n_left)
{
    struct batch_input in;
    json_t *items = json_object(), *none = json_object();
    size_t index = 0;
    int ln = 0;

    if (!items || !none || batch_input_init(&in, seen ? seen : none) < 0)
        abort();
    *n_left = 0;
    for (size_t p = 0; p < len;) {
        const char *nl = memchr(buf + p, '\n', len - p);
        size_t n = nl ? (size_t)(nl - (buf + p)) + 1 : len - p, blank = 1;
        struct batch_line l;
        char lk[64];

        for (size_t i = 0; i < n; i++)
            blank &= buf[p + i] == '\n' || buf[p + i] == '\r' || buf[p + i] == ' ' ||
                     buf[p + i] == '\t';
        if (batch_input_line(&in, buf + p, n, ++ln, &l) < 0)
            abort();
        snprintf(lk, sizeof lk, "line:%d", ln);
        if ((l.kind == BATCH_LINE_BLANK) != blank)
            abort();
        if (l.kind == BATCH_LINE_ITEM) {
            json_t *id = json_object_get(l.obj, "id");
            char *k = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
            if (!json_is_object(l.obj) || !(json_is_string(id) || json_is_integer(id)) || !k ||
                strcmp(k, l.key) || !l.key[0] || json_object_get(items, l.key) ||
                (seen && json_object_get(seen, l.key)))
                abort(); /* no usable id, a key not its id's, a repeat, or already done */
            json_object_set_new(items, l.key, json_integer(ln));
            if (!seen)
                check_request(l.obj, index);
            index++;
            (*n_left)++;
            if (results) {
                json_t *res = json_pack("{s:O,s:s}", "id", id, "finish_reason", "length");
                if (!res)
                    abort();
                if (ln % 2)
                    json_object_set_new(res, "error", json_pack("{s:s}", "code", "x"));
                json_array_append_new(results, res);
            }
            free(k);
            free(l.key);
            json_decref(l.obj);
        } else if (l.kind == BATCH_LINE_BAD) {
            json_t *res = batch_line_error(ln, l.code ? l.code : "", l.msg);
            if (!l.code || (strcmp(l.code, "bad_line") && strcmp(l.code, "duplicate_id")) ||
                !l.msg[0] || !res || json_integer_value(json_object_get(res, "line")) != ln ||
                (seen && json_object_get(seen, lk)))
                abort();
            if (!strcmp(l.code, "duplicate_id")) {
                /* the line it names has an item of this id */
                long e = earlier_line(l.msg);
                if (e < 1 || e >= ln)
                    abort();
            }
            (*n_left)++;
            if (results)
                json_array_append(results, res);
            json_decref(res);
        } else if (l.kind == BATCH_LINE_DONE) {
            json_t *o = json_loadb(buf + p, n, JSON_REJECT_DUPLICATES,
                                   NULL);
            json_t *id = json_is_object(o) ? json_object_get(o, "id") : NULL;
            char *k = id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            const json_t *by_line = seen ? json_object_get(seen, lk) : NULL;
            const json_t *by_id = seen && k ? json_object_get(seen, k) : NULL;
            if (!by_line && !by_id)
                abort(); /* done, but its result is not in the output */
            if (!(by_line && l.failed == json_is_false(by_line)) &&
                !(by_id && l.failed == json_is_false(by_id)))
                abort(); /* failed, or not, unlike the result that made it done */
            free(k);
            json_decref(o);
        } else if (l.kind != BATCH_LINE_BLANK || l.obj || l.key) {
            abort();
        }
        p += n;
    }
    batch_input_free(&in);
    json_decref(items);
    json_decref(none);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    json_t *seen, *results;
    size_t left, out_len = 0;
    char *out = NULL;
    int fb;
    FILE *f;

    if (!ctx)
        setup();
    /* the bytes as an output file, then as the input resumed against it */
    seen = scan_checked(buf, size, &fb);
    read_checked(buf, size, seen, NULL, &left);
    json_decref(seen);
    /* a fresh run, its results written, and a re-run: nothing left */
    results = json_array();
    if (!results)
        abort();
    read_checked(buf, size, NULL, results, &left);
    if (json_array_size(results) != left || !(f = open_memstream(&out, &out_len)))
        abort();
    for (size_t i = 0; i < json_array_size(results); i++) {
        char *s = json_dumps(json_array_get(results, i), JSON_COMPACT);
        if (!s)
            abort();
        fprintf(f, "%s\n", s);
        free(s);
    }
    fclose(f);
    seen = scan_checked(out, out_len, &fb);
    read_checked(buf, size, seen, NULL, &left);
    if (left != 0)
        abort(); /* every line has its result, yet something is left to do */
    json_decref(seen);
    json_decref(results);
    free(out);
    return 0;
}
