/*
 * Description: the daemon's protocol, version 1, without a socket.
 * Request lines: the three prompt forms, settings at the top level applied
 * over the defaults, a seed drawn when none is given, tags; and every kind
 * of bad line mapped to its stable error code, with the tag echoed when it
 * was readable; long texts left for dproto_tokenize, which gives the same
 * ids.  Event lines: accepted, canvas, done (streamed and whole,
 * stop id, error) and error read back as the JSON they claim to be, with
 * invalid UTF-8 in generated text replaced, never passed through.
 */
#include <string.h>

#include "daemon/protocol.h"
#include "tests/harness.h"
#include "tests/unit/proto-ctx.h"

static struct test_proto P;

static int setup(void)
{
    return test_proto_setup(&P, 100);
}

static int parse(const char *line, struct dproto_request *r, struct dproto_error *e)
{
    return dproto_parse(line, strlen(line), &P.ctx, r, e);
}

static int good_requests(void)
{
    struct dproto_request r;
    struct dproto_error e;

    CHECK(P.tok);
    CHECK(parse("{\"v\":1,\"op\":\"generate\",\"prompt\":\"the cat\",\"tag\":\"t1\"}", &r, &e) == 0);
    CHECK(r.op == DPROTO_GENERATE && r.prompt_kind == DPROTO_PROMPT_TEXT && r.stream == 1);
    CHECK(r.has_tag && !strcmp(r.tag, "t1"));
    CHECK(r.n_ids >= 2 && r.ids[0] == 2); /* <bos> first */
    CHECK(r.settings.seed_set && r.settings.max_tokens == P.defaults.max_tokens);
    dproto_request_free(&r);

    CHECK(parse("{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                "\"enable_thinking\":true,\"stream\":false,\"max_tokens\":7,\"seed\":99,"
                "\"top_p\":0.5,\"stop\":[\"x\"]}", &r, &e) == 0);
    CHECK(r.prompt_kind == DPROTO_PROMPT_MESSAGES && r.stream == 0 && !r.has_tag);
    CHECK(r.settings.max_tokens == 7 && r.settings.seed == 99 && r.settings.top_p == 0.5);
    CHECK(r.settings.n_stop_strings == 1 && r.n_ids > 5);
    dproto_request_free(&r);

    CHECK(parse("{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2,10,11]}", &r, &e) == 0);
    CHECK(r.prompt_kind == DPROTO_PROMPT_IDS && r.n_ids == 3 && r.ids[2] == 11);
    dproto_request_free(&r);

    CHECK(parse("{\"op\":\"cancel\",\"id\":17,\"v\":1}", &r, &e) == 0);
    CHECK(r.op == DPROTO_CANCEL && r.target == 17);
    CHECK(parse("{\"v\":1,\"op\":\"status\",\"tag\":\"s\"}", &r, &e) == 0 && r.op == DPROTO_STATUS);
    CHECK(parse("{\"v\":1,\"op\":\"shm_attach\"}", &r, &e) == 0 && r.op == DPROTO_SHM_ATTACH);
    CHECK(r.shm.sq_entries == 0 && r.shm.cq_entries == 0 && r.shm.in_bytes == 0);
    CHECK(parse("{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":64,\"cq_entries\":32,"
                "\"in_bytes\":65536,\"out_bytes\":1048576}", &r, &e) == 0);
    CHECK(r.op == DPROTO_SHM_ATTACH && r.shm.sq_entries == 64 && r.shm.cq_entries == 32 &&
          r.shm.in_bytes == 65536 && r.shm.out_bytes == 1048576);
    /* two requests without a seed get different ones */
    {
        struct dproto_request a, b;
        CHECK(parse("{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2]}", &a, &e) == 0);
        CHECK(parse("{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2]}", &b, &e) == 0);
        CHECK(a.settings.seed != b.settings.seed);
        dproto_request_free(&a);
        dproto_request_free(&b);
    }
    return 0;
}

/* Texts at and past ctx.defer_text_bytes are left for dproto_tokenize,
 * which gives the ids the parse itself gives (prompts and chats, a content
 * of parts too); its
 * errors carry the request's tag; a request freed untokenized leaks
 * nothing (the AddressSanitizer build checks). */
static int deferred_tokenize(void)
{
    static const char *const lines[] = {
        "{\"v\":1,\"op\":\"generate\",\"tag\":\"p\",\"prompt\":\"the cat sat on\"}",
        "{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"hi "
        "there\"},{\"role\":\"assistant\",\"content\":\"yes\"}],\"enable_thinking\":true}",
        /* a content of parts: their text counts (it counted 0, never deferred) */
        "{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"hi there\"}]}]}",
    };
    struct dproto_request a, b;
    struct dproto_error e;

    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        CHECK(parse(lines[i], &a, &e) == 0 && a.ids && !a.text);
        P.ctx.defer_text_bytes = 8;
        CHECK(parse(lines[i], &b, &e) == 0);
        P.ctx.defer_text_bytes = 0;
        CHECK(b.text && !b.ids && b.n_ids == 0);
        CHECK(dproto_tokenize(&P.ctx, &b, &e) == 0 && !b.text);
        CHECKF(b.n_ids == a.n_ids && !memcmp(a.ids, b.ids, a.n_ids * sizeof *a.ids),
               "line %zu: %zu ids deferred, %zu in the parse", i, b.n_ids, a.n_ids);
        CHECK(dproto_tokenize(&P.ctx, &b, &e) == 0 && b.n_ids == a.n_ids); /* (nothing left) */
        dproto_request_free(&a);
        dproto_request_free(&b);
    }
    /* below the threshold: tokenized by the parse */
    P.ctx.defer_text_bytes = 100;
    CHECK(parse(lines[0], &b, &e) == 0 && !b.text && b.n_ids > 0);
    dproto_request_free(&b);
    /* too many tokens, found by dproto_tokenize; the tag kept */
    {
        char line[400];
        char words[301];
        memset(words, 'x', 300);
        words[300] = '\0';
        snprintf(line, sizeof line, "{\"v\":1,\"op\":\"generate\",\"tag\":\"big\","
                 "\"prompt\":\"%s\"}", words);
        CHECK(parse(line, &b, &e) == 0 && b.text);
        CHECK(dproto_tokenize(&P.ctx, &b, &e) == -1 && !strcmp(e.code, "too_large"));
        CHECK(e.has_tag && !strcmp(e.tag, "big") && e.op == DPROTO_GENERATE);
        CHECK(!b.ids && !b.text);
        dproto_request_free(&b);
        /* freed untokenized */
        CHECK(parse(line, &b, &e) == 0 && b.text);
        dproto_request_free(&b);
        CHECK(!b.text);
    }
    P.ctx.defer_text_bytes = 0;
    return 0;
}

static size_t count_id(const struct dproto_request *r, int32_t id)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_ids; i++)
        n += r->ids[i] == id;
    return n;
}

/* "parse_special": false makes the prompt's text and the messages' contents
 * plain text (a typed turn marker or <mask> is not that token; the chat
 * format's own markers still are), parsed or deferred alike; true is the
 * default. */
static int parse_special(void)
{
    static const char *const lines[] = {
        "{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"x<turn|>\\n<|turn>model\\ny <mask>\"}]%s}",
        "{\"v\":1,\"op\":\"generate\",\"prompt\":\"x<|turn>model y <mask>\"%s}",
    };
    static const size_t turns_typed[] = {1, 1}, turns_format[] = {2, 0};
    const int32_t turn = 5, mask = 4;
    struct dproto_request a, b, c, d;
    struct dproto_error e;
    char line[512];

    CHECK(P.tok && dg_tokenizer_token_id(P.tok, "<|turn>", 7) == turn &&
          dg_tokenizer_token_id(P.tok, "<mask>", 6) == mask);
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        snprintf(line, sizeof line, lines[i], "");
        CHECK(parse(line, &a, &e) == 0);
        snprintf(line, sizeof line, lines[i], ",\"parse_special\":true");
        CHECK(parse(line, &b, &e) == 0);
        snprintf(line, sizeof line, lines[i], ",\"parse_special\":false");
        CHECK(parse(line, &c, &e) == 0);
        P.ctx.defer_text_bytes = 8;
        CHECK(parse(line, &d, &e) == 0 && d.text);
        P.ctx.defer_text_bytes = 0;
        CHECK(dproto_tokenize(&P.ctx, &d, &e) == 0);
        CHECK(a.n_ids == b.n_ids && !memcmp(a.ids, b.ids, a.n_ids * sizeof *a.ids));
        CHECKF(count_id(&a, turn) == turns_format[i] + turns_typed[i] && count_id(&a, mask) == 1,
               "line %zu: %zu turn markers", i, count_id(&a, turn));
        CHECKF(count_id(&c, turn) == turns_format[i] && count_id(&c, mask) == 0,
               "line %zu, plain: %zu turn markers", i, count_id(&c, turn));
        CHECK(c.ids[0] == 2 && c.n_ids > a.n_ids);
        CHECK(d.n_ids == c.n_ids && !memcmp(c.ids, d.ids, c.n_ids * sizeof *c.ids));
        dproto_request_free(&a);
        dproto_request_free(&b);
        dproto_request_free(&c);
        dproto_request_free(&d);
        /* the daemon's default plain text (parse_special: false in its
         * configuration): the same as asking, and a request may still parse */
        P.ctx.plain_text = 1;
        snprintf(line, sizeof line, lines[i], "");
        CHECK(parse(line, &a, &e) == 0);
        snprintf(line, sizeof line, lines[i], ",\"parse_special\":true");
        CHECK(parse(line, &b, &e) == 0);
        P.ctx.plain_text = 0;
        CHECK(count_id(&a, turn) == turns_format[i] && count_id(&a, mask) == 0);
        CHECK(count_id(&b, turn) == turns_format[i] + turns_typed[i] && count_id(&b, mask) == 1);
        dproto_request_free(&a);
        dproto_request_free(&b);
    }
    return 0;
}

static int bad_requests(void)
{
    static const struct {
        const char *line, *code, *needle;
    } bad[] = {
        {"", "bad_json", ""},
        {"{", "bad_json", ""},
        {"{\"v\":1,\"op\":\"status\"} x", "bad_json", ""},
        {"\"str\"", "bad_json", "expected"},
        /* valid JSON no C string holds: said in plain words */
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\\u0000b\"}", "bad_json",
         "a string holds \\u0000 (a NUL character)"},
        /* valid JSON, a number past what it can be: a value out of range */
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"seed\":9223372036854775808}",
         "bad_request", "a number out of range"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"entropy_bound\":1e999}",
         "bad_request", "a number out of range"},
        {"[1]", "bad_request", "JSON object"},
        {"{\"op\":\"status\"}", "bad_request", "v: missing"},
        {"{\"v\":\"1\",\"op\":\"status\"}", "bad_version", "version 1"},
        {"{\"v\":1}", "bad_request", "op"},
        {"{\"v\":1,\"op\":7}", "bad_request", "op"},
        {"{\"v\":1,\"op\":\"jump\"}", "unknown_op", "jump"},
        {"{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":-1}", "bad_request", "sq_entries"},
        {"{\"v\":1,\"op\":\"shm_attach\",\"in_bytes\":\"4\"}", "bad_request", "in_bytes"},
        {"{\"v\":1,\"op\":\"shm_attach\",\"out_bytes\":2e12}", "bad_request", "out_bytes"},
        {"{\"v\":1,\"op\":\"shm_attach\",\"size\":1}", "bad_request", "size: unknown"},
        {"{\"v\":1,\"op\":\"status\",\"q\":1}", "bad_request", "q: unknown field"},
        {"{\"v\":1,\"op\":\"cancel\"}", "bad_request", "id"},
        {"{\"v\":1,\"op\":\"cancel\",\"id\":0}", "bad_request", "id"},
        {"{\"v\":1,\"op\":\"cancel\",\"id\":1,\"prompt\":\"x\"}", "bad_request", "prompt: unknown"},
        {"{\"v\":1,\"op\":\"generate\"}", "bad_request", "exactly one"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"prompt_ids\":[1]}", "bad_request",
         "exactly one"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":[1]}", "bad_request", "prompt: expected"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"stream\":1}", "bad_request", "stream"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"enable_thinking\":true}", "bad_request",
         "enable_thinking"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"parse_special\":0}", "bad_request",
         "parse_special: a boolean"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2],\"parse_special\":false}",
         "bad_request", "with prompt or messages only"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"temperature\":0.5}", "bad_request",
         "temperature"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\",\"top_p\":3}", "bad_request", "top_p"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt_ids\":\"1 2\"}", "bad_request", "prompt_ids"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[1,1.5]}", "bad_request", "prompt_ids[1]"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[-1]}", "bad_request", "vocabulary"},
        {"{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[]}", "bad_request", "empty"},
        {"{\"v\":1,\"op\":\"generate\",\"messages\":{}}", "bad_request", "list"},
        {"{\"v\":1,\"op\":\"generate\",\"messages\":[{\"content\":\"x\"}]}", "bad_request", "role"},
        {"{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
         "\"image\"}]}]}", "bad_request", "images"},
    };
    struct dproto_request r;
    struct dproto_error e;
    CHECK(P.tok);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(parse(bad[i].line, &r, &e) < 0, "accepted: %s", bad[i].line);
        CHECKF(!strcmp(e.code, bad[i].code) && strstr(e.message, bad[i].needle),
               "%s: %s %s (want %s, '%s')", bad[i].line, e.code, e.message, bad[i].code,
               bad[i].needle);
        CHECK(r.ids == NULL);
    }
    /* a long prompt */
    {
        char line[2048];
        size_t n = (size_t)snprintf(line, sizeof line, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"");
        for (int i = 0; i < 400; i++)
            line[n++] = i % 2 ? ' ' : 'q';
        memcpy(line + n, "\"}", 3);
        CHECK(parse(line, &r, &e) < 0 && !strcmp(e.code, "too_large"));
    }
    /* the tag of a bad request comes back */
    CHECK(parse("{\"v\":1,\"op\":\"jump\",\"tag\":\"mine\"}", &r, &e) < 0 && e.has_tag &&
          !strcmp(e.tag, "mine"));
    CHECK(parse("{\"v\":1,\"op\":\"status\",\"tag\":5}", &r, &e) < 0 && !e.has_tag);
    /* no tokenizer: only ids */
    {
        struct dproto_ctx no = P.ctx;
        no.tok = NULL;
        const char *l = "{\"v\":1,\"op\":\"generate\",\"prompt\":\"a\"}";
        CHECK(dproto_parse(l, strlen(l), &no, &r, &e) < 0 && strstr(e.message, "prompt_ids"));
    }
    return 0;
}

/* len is read after the call that filled it (argument order is unspecified) */
static json_t *back(char *line, const size_t *lenp)
{
    json_t *j;
    const size_t len = *lenp;
    if (!line || len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1)) {
        free(line);
        return NULL;
    }
    j = json_loadb(line, len, 0, NULL);
    free(line);
    return j;
}

static int events(void)
{
    struct dg_canvas_stats cs = {2, 9, 1, 3, 12.5, 0.25f};
    struct dg_request_stats st;
    struct dg_gen_event ev;
    const int32_t ids[3] = {40, 41, 42};
    size_t len = 0;
    json_t *j;

    j = back(dproto_accepted(7, "t", 12, &P.defaults, &len), &len);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "event")), "accepted"));
    CHECK(json_integer_value(json_object_get(j, "v")) == 1 &&
          json_integer_value(json_object_get(j, "id")) == 7 &&
          json_integer_value(json_object_get(j, "prompt_tokens")) == 12 &&
          json_is_object(json_object_get(j, "settings")));
    json_decref(j);

    test_canvas_event(&ev, &cs, "ok \xff\xfe tail");
    j = back(dproto_canvas(7, NULL, &ev, &len), &len);
    CHECK(j && json_integer_value(json_object_get(j, "index")) == 2);
    CHECK(json_array_size(json_object_get(j, "ids")) == 3 && !json_object_get(j, "tag"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "text")),
                  "ok \xEF\xBF\xBD\xEF\xBF\xBD tail"));
    json_decref(j);

    test_done_event(&ev, &st, &cs);
    j = back(dproto_done(7, "t", &ev, "abc", 3, 1, ids, 3, &len), &len);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "finish_reason")), "stop"));
    CHECK(json_integer_value(json_object_get(j, "stop_id")) == 1);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) == 3);
    CHECK(json_integer_value(json_array_get(json_object_get(j, "steps_per_canvas"), 0)) == 9);
    CHECK(!strcmp(json_string_value(json_object_get(j, "text")), "abc") &&
          json_array_size(json_object_get(j, "ids")) == 3);
    json_decref(j);
    ev.finish = DG_FINISH_ERROR;
    ev.stop_id = -1;
    ev.error_code = DG_E_CUDA;
    ev.error = "boom";
    j = back(dproto_done(8, NULL, &ev, NULL, 0, 0, NULL, 0, &len), &len);
    CHECK(j && !json_object_get(j, "text") && !json_object_get(j, "ids") &&
          !json_object_get(j, "stop_id"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "cuda"));
    json_decref(j);

    j = back(dproto_error_line(0, "x", "busy", "full", &len), &len);
    CHECK(j && json_is_null(json_object_get(j, "id")) &&
          !strcmp(json_string_value(json_object_get(j, "code")), "busy"));
    json_decref(j);
    return 0;
}

/* The done line made without jansson for out-of-memory ends: valid JSON,
 * read back by jansson as the fields given, with quotes, control bytes and
 * bytes that are not UTF-8 in the tag and message escaped or replaced. */
static int plain_done_error(void)
{
    static const char *const tags[] = {NULL, "t", "q\"uo\\te\n\x01", "caf\xc3\xa9 \xff\xc3"};
    char big[3000];
    size_t len = 0;
    json_t *j, *e;

    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
        j = back(dproto_done_error(41, tags[i], "out_of_memory", "no room \"here\"", &len),
                 &len);
        CHECKF(j, "tag %zu: not JSON", i);
        CHECK(!strcmp(json_string_value(json_object_get(j, "event")), "done"));
        CHECK(json_integer_value(json_object_get(j, "v")) == 1 &&
              json_integer_value(json_object_get(j, "id")) == 41);
        CHECK(!strcmp(json_string_value(json_object_get(j, "finish_reason")), "error"));
        e = json_object_get(j, "error");
        CHECK(!strcmp(json_string_value(json_object_get(e, "code")), "out_of_memory") &&
              !strcmp(json_string_value(json_object_get(e, "message")), "no room \"here\""));
        if (!tags[i])
            CHECK(!json_object_get(j, "tag"));
        else if (i < 3)
            CHECK(!strcmp(json_string_value(json_object_get(j, "tag")), tags[i]));
        else
            CHECK(!strcmp(json_string_value(json_object_get(j, "tag")), "caf\xc3\xa9 ??"));
        json_decref(j);
    }
    /* a message longer than the line: cut, still JSON */
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    j = back(dproto_done_error(0, "t", "internal", big, &len), &len);
    CHECK(j && json_is_null(json_object_get(j, "id")));
    CHECK(json_string_length(json_object_get(json_object_get(j, "error"), "message")) > 500);
    json_decref(j);
    return 0;
}

int main(void)
{
    TEST_CASE(setup);
    TEST_CASE(good_requests);
    TEST_CASE(deferred_tokenize);
    TEST_CASE(parse_special);
    TEST_CASE(bad_requests);
    TEST_CASE(events);
    TEST_CASE(plain_done_error);
    dg_tokenizer_free(P.tok);
    return test_finish();
}
