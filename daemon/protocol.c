/* protocol.c - request lines in, event lines out (see protocol.h). */
#include "daemon/protocol.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "lib/chat-json.h"
#include "lib/json-util.h"
#include "lib/utf8.h"

/* ---- parsing -------------------------------------------------------------- */

static int fail(struct dproto_error *perr, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct dproto_error *perr, const char *code, const char *fmt, ...)
{
    va_list ap;
    perr->code = code;
    va_start(ap, fmt);
    vsnprintf(perr->message, sizeof perr->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* keys a generate request may carry besides the settings */
static const char *const GENERATE_KEYS[] = {"v", "op", "tag", "prompt", "messages", "prompt_ids",
                                            "stream", "enable_thinking", "batch",
                                            "parse_special"};

static int is_generate_key(const char *k)
{
    for (size_t i = 0; i < sizeof GENERATE_KEYS / sizeof GENERATE_KEYS[0]; i++)
        if (!strcmp(k, GENERATE_KEYS[i]))
            return 1;
    return 0;
}

/* Only the keys in allowed[]: anything else is an unknown field. */
static int only_keys(const json_t *root, const char *const *allowed, size_t n,
                     struct dproto_error *perr)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        size_t i = 0;
        while (i < n && strcmp(key, allowed[i]))
            i++;
        if (i == n)
            return fail(perr, "bad_request", "%.64s: unknown field", key);
    }
    return 0;
}

static int parse_prompt_ids(const json_t *list, const struct dproto_ctx *ctx,
                            struct dproto_request *req, struct dproto_error *perr)
{
    const json_t *v;
    size_t i, n = json_array_size(list);
    if (!json_is_array(list))
        return fail(perr, "bad_request", "prompt_ids: expected a list of integers, got %s",
                    dg_json_type_name(list));
    if (n > ctx->max_prompt_tokens)
        return fail(perr, "too_large", "prompt_ids: %zu tokens; at most %zu", n,
                    ctx->max_prompt_tokens);
    req->ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!req->ids)
        return fail(perr, "internal", "out of memory");
    json_array_foreach(list, i, v) {
        json_int_t x;
        if (!json_is_integer(v))
            return fail(perr, "bad_request", "prompt_ids[%zu]: expected an integer, got %s", i,
                        dg_json_type_name(v));
        x = json_integer_value(v);
        if (x < 0 || x >= ctx->cfg->vocab_size)
            return fail(perr, "bad_request", "prompt_ids[%zu]: %lld is outside the vocabulary "
                        "[0, %lld)", i, (long long)x, (long long)ctx->cfg->vocab_size);
        req->ids[i] = (int32_t)x;
    }
    req->n_ids = n;
    return 0;
}

/* Text or chat messages through the tokenizer.  Unless req->parse_special,
 * the prompt's text and the messages' contents match no added token: only
 * the chat format's own markers are control tokens. */
static int tokenize(const json_t *prompt, const json_t *messages, const struct dproto_ctx *ctx,
                    struct dproto_request *req, struct dproto_error *perr)
{
    struct dg_ids ids = {0};
    struct dg_buf text = {0};
    struct dg_error err = {0};
    int rc;

    if (!ctx->tok)
        return fail(perr, "bad_request", "this model has no tokenizer: send prompt_ids");
    if (prompt) {
        const int plain = req->parse_special ? 0 : DG_TOK_ADDED_AS_TEXT;
        rc = dg_tokenizer_encode(ctx->tok, json_string_value(prompt), json_string_length(prompt),
                                 DG_TOK_ADD_SPECIAL | plain, &ids, &err);
    } else {
        rc = dg_chat_encode_json(ctx->tok, messages, 1, req->thinking, req->parse_special, &text,
                                 &ids, &err);
    }
    dg_buf_free(&text);
    if (rc < 0) {
        dg_ids_free(&ids);
        return fail(perr, rc == -DG_E_NOMEM ? "internal" : "bad_request", "%s", err.msg);
    }
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] >= ctx->cfg->vocab_size) {
            dg_ids_free(&ids);
            return fail(perr, "bad_request", "the prompt holds token %d, outside the model's "
                        "vocabulary of %lld", ids.v[i], (long long)ctx->cfg->vocab_size);
        }
    if (ids.n > ctx->max_prompt_tokens) {
        size_t n = ids.n;
        dg_ids_free(&ids);
        return fail(perr, "too_large", "the prompt is %zu tokens; at most %zu", n,
                    ctx->max_prompt_tokens);
    }
    req->ids = ids.v;
    req->n_ids = ids.n;
    return 0;
}

/* Bytes of text a prompt or a list of messages holds: the messages'
 * contents, a string or a list of parts (their "text" strings; anything
 * else counts 0: the render refuses it). */
static size_t text_bytes(const json_t *prompt, const json_t *messages)
{
    size_t n = 0, i, k;
    const json_t *m, *part;
    if (prompt)
        return json_string_length(prompt);
    json_array_foreach(messages, i, m) {
        const json_t *content = json_object_get(m, "content");
        n += json_string_length(content);
        json_array_foreach(content, k, part)
            n += json_string_length(json_object_get(part, "text"));
    }
    return n;
}

static int parse_generate(json_t *root, const struct dproto_ctx *ctx, struct dproto_request *req,
                          struct dproto_error *perr)
{
    json_t *prompt = json_object_get(root, "prompt"), *messages = json_object_get(root, "messages");
    json_t *ids = json_object_get(root, "prompt_ids"), *stream = json_object_get(root, "stream");
    json_t *thinking = json_object_get(root, "enable_thinking"), *settings, *v;
    json_t *batch = json_object_get(root, "batch");
    json_t *special = json_object_get(root, "parse_special");
    struct dg_error err = {0};
    const char *key;
    int rc;

    if (!!prompt + !!messages + !!ids != 1)
        return fail(perr, "bad_request", "generate: need exactly one of prompt, messages, "
                    "prompt_ids");
    if (prompt && !json_is_string(prompt))
        return fail(perr, "bad_request", "prompt: expected a string, got %s",
                    dg_json_type_name(prompt));
    if (stream && !json_is_boolean(stream))
        return fail(perr, "bad_request", "stream: expected true or false, got %s",
                    dg_json_type_name(stream));
    if (thinking && (!json_is_boolean(thinking) || !messages))
        return fail(perr, "bad_request", "enable_thinking: a boolean, with messages only");
    if (batch && !json_is_boolean(batch))
        return fail(perr, "bad_request", "batch: expected true or false, got %s",
                    dg_json_type_name(batch));
    if (special && (!json_is_boolean(special) || ids))
        return fail(perr, "bad_request", "parse_special: a boolean, with prompt or messages only");
    req->stream = stream ? json_is_true(stream) : 1;
    req->batch = json_is_true(batch);
    req->thinking = json_is_true(thinking);
    req->parse_special = special ? json_is_true(special) : !ctx->plain_text;
    /* the settings: every other key */
    settings = json_object();
    if (!settings)
        return fail(perr, "internal", "out of memory");
    json_object_foreach(root, key, v)
        if (!is_generate_key(key) && json_object_set(settings, key, v) != 0) {
            json_decref(settings);
            return fail(perr, "internal", "out of memory");
        }
    req->settings = *ctx->defaults;
    rc = dg_gen_settings_apply_json(&req->settings, settings, ctx->cfg, ctx->limits, "", &err);
    json_decref(settings);
    if (rc < 0)
        return fail(perr, "bad_request", "%s", err.msg);
    if (!req->settings.seed_set) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            return fail(perr, "internal", "no random seed available; pass \"seed\"");
        req->settings.seed = r & (uint64_t)INT64_MAX;
        req->settings.seed_set = 1;
    }
    if (ids) {
        req->prompt_kind = DPROTO_PROMPT_IDS;
        rc = parse_prompt_ids(ids, ctx, req, perr);
    } else {
        req->prompt_kind = prompt ? DPROTO_PROMPT_TEXT : DPROTO_PROMPT_MESSAGES;
        if (ctx->tok && ctx->defer_text_bytes > 0 &&
            text_bytes(prompt, messages) >= ctx->defer_text_bytes) {
            /* left for dproto_tokenize */
            req->text = json_incref(prompt ? prompt : messages);
            return 0;
        }
        rc = tokenize(prompt, messages, ctx, req, perr);
    }
    if (rc == 0 && req->n_ids == 0)
        rc = fail(perr, "bad_request", "the prompt is empty");
    return rc;
}

/* An optional non-negative integer key of shm_attach, at most max. */
static int attach_size(const json_t *root, const char *key, uint64_t max, uint64_t *out,
                       struct dproto_error *perr)
{
    const json_t *v = json_object_get(root, key);
    *out = 0;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > max)
        return fail(perr, "bad_request", "%s: expected an integer in [0, %llu]", key,
                    (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

int dproto_parse(const char *line, size_t len, const struct dproto_ctx *ctx,
                 struct dproto_request *req, struct dproto_error *perr)
{
    struct dg_error err = {0};
    json_t *root;
    int rc;

    memset(req, 0, sizeof *req);
    memset(perr, 0, sizeof *perr);
    root = dg_json_parse(line, len, "request", &err);
    if (!root) /* (a number too large is a value out of range, as dgemmad(8) says) */
        return fail(perr, err.code == DG_E_NOMEM    ? "internal"
                          : err.code == DG_E_RANGE ? "bad_request"
                                                   : "bad_json",
                    "%s", err.msg);
    rc = dproto_parse_json(root, ctx, req, perr);
    json_decref(root);
    return rc;
}

int dproto_parse_json(json_t *root, const struct dproto_ctx *ctx, struct dproto_request *req,
                      struct dproto_error *perr)
{
    json_t *v, *op, *tag;
    const char *ops;
    int rc = -1;

    memset(req, 0, sizeof *req);
    memset(perr, 0, sizeof *perr);
    if (!json_is_object(root)) {
        fail(perr, "bad_request", "a request is a JSON object, not %s", dg_json_type_name(root));
        goto out;
    }
    if ((tag = json_object_get(root, "tag")) != NULL) {
        if (!json_is_string(tag) || json_string_length(tag) > DPROTO_TAG_MAX ||
            strlen(json_string_value(tag)) != json_string_length(tag)) {
            fail(perr, "bad_request", "tag: expected a string of at most %d bytes",
                 DPROTO_TAG_MAX);
            goto out;
        }
        memcpy(req->tag, json_string_value(tag), json_string_length(tag) + 1);
        memcpy(perr->tag, req->tag, sizeof req->tag);
        req->has_tag = perr->has_tag = 1;
    }
    v = json_object_get(root, "v");
    if (!v) {
        fail(perr, "bad_request", "v: missing (the protocol version, %d)", DPROTO_VERSION);
        goto out;
    }
    if (!json_is_integer(v) || json_integer_value(v) != DPROTO_VERSION) {
        fail(perr, "bad_version", "v: this daemon speaks version %d", DPROTO_VERSION);
        goto out;
    }
    op = json_object_get(root, "op");
    if (!json_is_string(op)) {
        fail(perr, "bad_request", "op: missing or not a string");
        goto out;
    }
    ops = json_string_value(op);
    if (!strcmp(ops, "generate")) {
        req->op = perr->op = DPROTO_GENERATE;
        /* (known before the rest is checked, for a refusal's metrics row) */
        perr->batch = json_is_true(json_object_get(root, "batch"));
        rc = parse_generate(root, ctx, req, perr);
    } else if (!strcmp(ops, "cancel")) {
        static const char *const keys[] = {"v", "op", "tag", "id"};
        json_t *id = json_object_get(root, "id");
        req->op = DPROTO_CANCEL;
        if ((rc = only_keys(root, keys, 4, perr)) == 0) {
            if (!json_is_integer(id) || json_integer_value(id) < 1)
                rc = fail(perr, "bad_request", "id: expected the request's id, a positive "
                          "integer");
            else
                req->target = (uint64_t)json_integer_value(id);
        }
    } else if (!strcmp(ops, "status")) {
        static const char *const keys[] = {"v", "op", "tag"};
        req->op = DPROTO_STATUS;
        rc = only_keys(root, keys, 3, perr);
    } else if (!strcmp(ops, "shm_attach")) {
        static const char *const keys[] = {"v",          "op",       "tag",      "sq_entries",
                                           "cq_entries", "in_bytes", "out_bytes"};
        uint64_t x;
        req->op = DPROTO_SHM_ATTACH;
        if ((rc = only_keys(root, keys, 7, perr)) == 0 &&
            (rc = attach_size(root, "sq_entries", 1u << 30, &x, perr)) == 0) {
            req->shm.sq_entries = (uint32_t)x;
            if ((rc = attach_size(root, "cq_entries", 1u << 30, &x, perr)) == 0) {
                req->shm.cq_entries = (uint32_t)x;
                if ((rc = attach_size(root, "in_bytes", (uint64_t)1 << 40,
                                      &req->shm.in_bytes, perr)) == 0)
                    rc = attach_size(root, "out_bytes", (uint64_t)1 << 40, &req->shm.out_bytes,
                                     perr);
            }
        }
    } else {
        fail(perr, "unknown_op", "op: '%.64s' is not one of generate, cancel, status, "
             "shm_attach", ops);
    }
out:
    if (rc < 0)
        dproto_request_free(req);
    return rc;
}

int dproto_tokenize(const struct dproto_ctx *ctx, struct dproto_request *req,
                    struct dproto_error *perr)
{
    json_t *text = req->text;
    int rc;

    if (!text)
        return 0;
    memset(perr, 0, sizeof *perr);
    perr->op = req->op;
    perr->batch = req->batch;
    if (req->has_tag) {
        memcpy(perr->tag, req->tag, sizeof perr->tag);
        perr->has_tag = 1;
    }
    req->text = NULL;
    rc = json_is_string(text) ? tokenize(text, NULL, ctx, req, perr)
                              : tokenize(NULL, text, ctx, req, perr);
    json_decref(text);
    if (rc == 0 && req->n_ids == 0)
        rc = fail(perr, "bad_request", "the prompt is empty");
    if (rc < 0)
        dproto_request_free(req);
    return rc;
}

void dproto_request_free(struct dproto_request *req)
{
    free(req->ids);
    req->ids = NULL;
    req->n_ids = 0;
    json_decref(req->text);
    req->text = NULL;
}

/* ---- events ----------------------------------------------------------------- */

/* A JSON string of possibly invalid UTF-8: invalid bytes become U+FFFD. */
static json_t *string_of(const char *s, size_t n)
{
    json_t *j;
    struct dg_buf b = {0};
    size_t i = 0;

    if (dg_utf8_valid_prefix((const unsigned char *)s, n) == n)
        return json_stringn(s ? s : "", n);
    while (i < n) {
        const size_t ok = dg_utf8_valid_prefix((const unsigned char *)s + i, n - i);
        if (dg_buf_append(&b, s + i, ok) < 0 ||
            (i + ok < n && dg_buf_append(&b, "\xEF\xBF\xBD", 3) < 0)) {
            dg_buf_free(&b);
            return NULL;
        }
        i += ok + (i + ok < n);
    }
    j = json_stringn(b.s ? b.s : "", b.n);
    dg_buf_free(&b);
    return j;
}

static json_t *ids_array(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

char *dproto_event_obj(const char *event, json_t *obj, size_t *len)
{
    char *s, *line;
    size_t n;

    if (!obj)
        return NULL;
    /* "v" and "event" first: build a new object in that order */
    {
        json_t *o = json_pack("{s:i,s:s}", "v", DPROTO_VERSION, "event", event);
        if (!o || json_object_update(o, obj) != 0) {
            json_decref(o);
            json_decref(obj);
            return NULL;
        }
        json_decref(obj);
        s = dg_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
    }
    if (!s)
        return NULL;
    n = strlen(s);
    line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *len = n + 1;
    return line;
}

static json_t *head(uint64_t id, const char *tag)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (json_object_set_new(o, "id", id ? json_integer((json_int_t)id) : json_null()) != 0 ||
        (tag && json_object_set_new(o, "tag", json_string(tag)) != 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *dproto_accepted(uint64_t id, const char *tag, size_t prompt_tokens,
                      const struct dg_gen_settings *s, size_t *len)
{
    json_t *o = head(id, tag);
    if (!o || json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)prompt_tokens)) ||
        json_object_set_new(o, "seed", json_integer((json_int_t)s->seed)) ||
        json_object_set_new(o, "settings", dg_gen_settings_to_json(s))) {
        json_decref(o);
        return NULL;
    }
    return dproto_event_obj("accepted", o, len);
}

char *dproto_canvas(uint64_t id, const char *tag, const struct dg_gen_event *ev, size_t *len)
{
    json_t *o = head(id, tag);
    const struct dg_canvas_stats *c = ev->canvas;
    if (!o || json_object_set_new(o, "index", json_integer(c->index)) ||
        json_object_set_new(o, "text", ev->text ? string_of(ev->text, ev->text_len) : json_null()) ||
        json_object_set_new(o, "ids", ids_array(ev->ids, (size_t)ev->n_ids)) ||
        json_object_set_new(o, "tokens", json_integer(c->tokens)) ||
        json_object_set_new(o, "steps", json_integer(c->steps)) ||
        json_object_set_new(o, "converged", json_boolean(c->converged)) ||
        json_object_set_new(o, "ms", json_real(c->ms)) ||
        json_object_set_new(o, "mean_entropy", json_real(c->mean_entropy))) {
        json_decref(o);
        return NULL;
    }
    return dproto_event_obj("canvas", o, len);
}

char *dproto_done(uint64_t id, const char *tag, const struct dg_gen_event *ev, const char *text,
                  size_t text_len, int have_text, const int32_t *ids, size_t n_ids, size_t *len)
{
    const struct dg_request_stats *st = ev->stats;
    json_t *o = head(id, tag), *spc;
    int bad = !o;

    /* o owns everything from here: json_object_set_new consumes its value */
    bad = bad || json_object_set_new(o, "finish_reason", json_string(dg_finish_name(ev->finish))) ||
          json_object_set_new(o, "usage", json_pack("{s:I,s:I}", "prompt_tokens",
                                                   (json_int_t)st->prompt_tokens,
                                                   "completion_tokens",
                                                   (json_int_t)st->completion_tokens)) ||
          json_object_set_new(o, "canvases", json_integer(st->canvases)) ||
          json_object_set_new(o, "steps_per_canvas", json_array()) ||
          json_object_set_new(o, "decoder_steps", json_integer(st->decoder_steps)) ||
          json_object_set_new(o, "tokens_per_step", json_real(st->tokens_per_step)) ||
          json_object_set_new(o, "tokens_per_s", json_real(st->tokens_per_s)) ||
          json_object_set_new(o, "ms_first_canvas", json_real(st->ms_first_canvas)) ||
          json_object_set_new(o, "ms_total", json_real(st->ms_total));
    spc = bad ? NULL : json_object_get(o, "steps_per_canvas");
    for (int i = 0; !bad && i < st->canvases; i++)
        bad = json_array_append_new(spc, json_integer(st->canvas[i].steps)) != 0;
    if (!bad && ev->stop_id >= 0)
        bad = json_object_set_new(o, "stop_id", json_integer(ev->stop_id)) != 0;
    if (!bad && ev->stop_string)
        bad = json_object_set_new(o, "stop", json_string(ev->stop_string)) != 0;
    if (!bad && ev->finish == DG_FINISH_ERROR)
        bad = json_object_set_new(o, "error", json_pack("{s:s,s:s}", "code",
                                                        dg_status_name(ev->error_code),
                                                        "message", ev->error ? ev->error : ""));
    if (!bad && have_text)
        bad = json_object_set_new(o, "text", string_of(text, text_len)) != 0;
    if (!bad && ids)
        bad = json_object_set_new(o, "ids", ids_array(ids, n_ids)) != 0;
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return dproto_event_obj("done", o, len);
}

/* Append s to b[*n..cap) as the inside of a JSON string: quotes,
 * backslashes and control characters escaped, bytes that are not UTF-8 as
 * '?'; cut (at a character) where it does not fit, leaving 8 bytes free. */
static void put_json_text(char *b, size_t *n, size_t cap, const char *s)
{
    const size_t len = strlen(s);
    size_t i = 0;
    while (i < len && *n + 16 < cap) {
        const unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            b[(*n)++] = '\\';
            b[(*n)++] = (char)ch;
            i++;
        } else if (ch < 0x20) {
            *n += (size_t)snprintf(b + *n, cap - *n, "\\u%04x", ch);
            i++;
        } else if (ch < 0x80) {
            b[(*n)++] = (char)ch;
            i++;
        } else {
            size_t ok = dg_utf8_valid_prefix((const unsigned char *)s + i, len - i), take = 1;
            if (ok > 0) /* one whole character */
                while (take < ok && take < 4 &&
                       ((unsigned char)s[i + take] & 0xC0) == 0x80)
                    take++;
            if (ok == 0 || *n + take + 16 >= cap) {
                b[(*n)++] = '?';
                i++;
                continue;
            }
            memcpy(b + *n, s + i, take);
            *n += take;
            i += take;
        }
    }
}

/* A block of PLAIN_LINE_MAX bytes kept for the plain lines below, for when
 * malloc fails even for them: whoever takes it frees it like any line. */
#define PLAIN_LINE_MAX 1024
static _Atomic(char *) plain_reserve;

/* Put a block back into plain_reserve if it is empty (and malloc obliges). */
static void refill_reserve(void)
{
    char *r, *none = NULL;
    if (atomic_load(&plain_reserve))
        return;
    if ((r = malloc(PLAIN_LINE_MAX)) != NULL &&
        !atomic_compare_exchange_strong(&plain_reserve, &none, r))
        free(r);
}

/* An error line, or with as_done a done line with finish_reason "error",
 * formatted without jansson and with a single allocation (the reserved
 * block when malloc fails): what is sent when memory is short.  NULL only
 * when both fail. */
static char *plain_error_line(uint64_t id, const char *tag, const char *code,
                              const char *message, int as_done, size_t *len)
{
    char b[PLAIN_LINE_MAX], *line;
    size_t n = 0;
    n += (size_t)snprintf(b, sizeof b, "{\"v\":%d,\"event\":\"%s\",\"id\":", DPROTO_VERSION,
                          as_done ? "done" : "error");
    if (id)
        n += (size_t)snprintf(b + n, sizeof b - n, "%llu", (unsigned long long)id);
    else
        n += (size_t)snprintf(b + n, sizeof b - n, "null");
    if (tag) {
        n += (size_t)snprintf(b + n, sizeof b - n, ",\"tag\":\"");
        put_json_text(b, &n, sizeof b - 200, tag);
        b[n++] = '"';
    }
    n += (size_t)snprintf(b + n, sizeof b - n, as_done ? ",\"finish_reason\":\"error\","
                                                          "\"error\":{\"code\":\""
                                                        : ",\"code\":\"");
    put_json_text(b, &n, sizeof b - 64, code);
    n += (size_t)snprintf(b + n, sizeof b - n, "\",\"message\":\"");
    put_json_text(b, &n, sizeof b - 8, message);
    n += (size_t)snprintf(b + n, sizeof b - n, as_done ? "\"}}\n" : "\"}\n");
    if (!(line = malloc(n + 1)) && !(line = atomic_exchange(&plain_reserve, NULL)))
        return NULL;
    memcpy(line, b, n + 1);
    *len = n;
    refill_reserve();
    return line;
}

char *dproto_error_line(uint64_t id, const char *tag, const char *code, const char *message,
                        size_t *len)
{
    json_t *o = head(id, tag);
    char *line = NULL;
    if (o && !json_object_set_new(o, "code", json_string(code)) &&
        !json_object_set_new(o, "message", string_of(message, strlen(message))))
        line = dproto_event_obj("error", o, len);
    else
        json_decref(o);
    /* (out of memory in jansson: the plain form needs one small block) */
    if (line) {
        refill_reserve();
        return line;
    }
    return plain_error_line(id, tag, code, message, 0, len);
}

char *dproto_done_error(uint64_t id, const char *tag, const char *code, const char *message,
                        size_t *len)
{
    return plain_error_line(id, tag, code, message, 1, len);
}
