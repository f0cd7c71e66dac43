/* batch-input.c - the pure parsing steps of `dgemma-client batch` (see
 * batch-input.h): the output file's keys, the input's lines, an item's
 * request. */
#include "client/batch-input.h"
#include "lib/json-util.h"
#include "lib/utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int batch_output_scan(const char *buf, size_t len, json_t *seen, int *failed_before,
                      size_t *keep_out)
{
    /* (byte-exact: a NUL in the file ends neither a line nor the file) */
    const char *end = len ? memrchr(buf, '\n', len) : NULL;
    const size_t keep = end ? (size_t)(end - buf) + 1 : 0;

    *keep_out = keep;
    for (size_t p = 0; p < keep;) {
        const char *nl = memchr(buf + p, '\n', keep - p);
        struct dg_error je = {0};
        /* (a result's text can hold a NUL, written as \u0000) */
        json_t *r = dg_json_loadb(buf + p, (size_t)(nl - (buf + p)), JSON_ALLOW_NUL, "output",
                                  &je);
        int nomem = !r && je.code == DG_E_NOMEM;
        if (json_is_object(r)) {
            json_t *id = json_object_get(r, "id"), *ln = json_object_get(r, "line");
            char key[64], *k = NULL;
            int is_key = 1;
            if (id) {
                k = dg_json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
            } else if (json_is_integer(ln)) {
                snprintf(key, sizeof key, "line:%lld", (long long)json_integer_value(ln));
                k = strdup(key);
            } else {
                is_key = 0;
            }
            if (is_key && !k) {
                nomem = 1;
            } else if (k && !json_object_get(seen, k)) {
                const int failed = json_object_get(r, "error") != NULL;
                if (json_object_set_new(seen, k, json_boolean(!failed)) != 0)
                    nomem = 1;
                *failed_before += failed;
            }
            free(k);
        }
        json_decref(r);
        if (nomem) /* (a result not seen would be run again: a second result) */
            return -1;
        p = (size_t)(nl - buf) + 1;
    }
    return 0;
}

/* Make s valid UTF-8 in place, each byte that is not shown as '?' (a
 * message that quotes the input, or cuts an id, can hold a torn
 * character, and a result line must be valid JSON text). */
static void utf8_scrub(char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = dg_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (k == 0) {
            s[i++] = '?';
        } else {
            i += k;
        }
    }
}

/* Whether line[0 .. n) holds nothing but spaces, tabs and CRs (an editor's
 * indentation or a Windows line end on an empty line: no request, like an
 * empty line; JSON's own whitespace besides the newline). */
static int is_blank(const char *line, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
            return 0;
    return 1;
}

int batch_input_init(struct batch_input *in, const json_t *seen)
{
    in->seen = seen;
    in->first_line = json_object();
    return in->first_line ? 0 : -1;
}

void batch_input_free(struct batch_input *in)
{
    json_decref(in->first_line);
    in->first_line = NULL;
}

int batch_input_line(struct batch_input *in, const char *line, size_t n, int ln,
                     struct batch_line *out)
{
    struct dg_error je = {0};
    json_t *obj, *id;
    char key[64], *k;

    memset(out, 0, sizeof *out);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    if (is_blank(line, n))
        return 0; /* BATCH_LINE_BLANK */
    snprintf(key, sizeof key, "line:%d", ln);
    obj = dg_json_loadb(line, n, JSON_REJECT_DUPLICATES, "the line", &je);
    if (!obj && je.code == DG_E_NOMEM)
        return -1;
    id = json_is_object(obj) ? json_object_get(obj, "id") : NULL;
    if (!obj || !json_is_object(obj) || !(json_is_string(id) || json_is_integer(id))) {
        if (json_object_get(in->seen, key)) {
            out->kind = BATCH_LINE_DONE; /* its result is there already */
            out->failed = json_is_false(json_object_get(in->seen, key));
        } else {
            out->kind = BATCH_LINE_BAD;
            out->code = "bad_line";
            if (!obj)
                /* (made with what "the line", which stays: plain words) */
                dg_json_error_at_column(out->msg, sizeof out->msg, je.msg, NULL);
            else
                snprintf(out->msg, sizeof out->msg, "%s",
                         json_is_object(obj) ? "no \"id\" (a string or an integer)"
                                             : "not a JSON object");
            utf8_scrub(out->msg);
        }
        json_decref(obj);
        return 0;
    }
    k = dg_json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!k) {
        json_decref(obj);
        return -1;
    }
    if (json_object_get(in->first_line, k)) {
        if (json_object_get(in->seen, key)) {
            out->kind = BATCH_LINE_DONE;
            out->failed = json_is_false(json_object_get(in->seen, key));
        } else {
            out->kind = BATCH_LINE_BAD;
            out->code = "duplicate_id";
            snprintf(out->msg, sizeof out->msg, "id %.200s is already on line %lld", k,
                     (long long)json_integer_value(json_object_get(in->first_line, k)));
            utf8_scrub(out->msg);
        }
        free(k);
        json_decref(obj);
        return 0;
    }
    /* (unrecorded, a later line with this id would not be refused) */
    if (json_object_set_new(in->first_line, k, json_integer(ln)) != 0) {
        free(k);
        json_decref(obj);
        return -1;
    }
    if (json_object_get(in->seen, k)) {
        out->kind = BATCH_LINE_DONE; /* finished by an earlier run */
        out->failed = json_is_false(json_object_get(in->seen, k));
        free(k);
        json_decref(obj);
        return 0;
    }
    out->kind = BATCH_LINE_ITEM;
    out->obj = obj;
    out->key = k;
    return 0;
}

json_t *batch_line_error(int ln, const char *code, const char *msg)
{
    return json_pack("{s:i,s:{s:s,s:s}}", "line", ln, "error", "code", code, "message", msg);
}

/* The protocol's framing keys, set by the batch itself. */
static const struct {
    const char *key, *why;
} FRAMING[] = {
    {"v", "\"v\" is the batch's own (the protocol version): leave it out"},
    {"op", "\"op\" is the batch's own (always \"generate\"): leave it out"},
    {"tag", "\"tag\" is the batch's own (it routes the results): leave it out"},
    {"stream", "\"stream\" is the batch's own (results come whole): leave it out"},
};

/* *why for an item's prompt, or NULL when it is well-formed; *kind set. */
static const char *prompt_form(const json_t *obj, enum batch_prompt *kind)
{
    static const char ids_why[] = "\"prompt_ids\" must be a non-empty list of token ids";
    json_t *prompt = json_object_get(obj, "prompt"), *msgs = json_object_get(obj, "messages");
    json_t *ids = json_object_get(obj, "prompt_ids"), *x;
    size_t i;

    if (!!prompt + !!msgs + !!ids != 1)
        return "needs exactly one of \"prompt\", \"messages\", \"prompt_ids\"";
    if (prompt) {
        *kind = BATCH_PROMPT_TEXT;
        return json_is_string(prompt) ? NULL : "\"prompt\" must be a string";
    }
    if (msgs) {
        *kind = BATCH_PROMPT_MESSAGES; /* (the daemon checks the list) */
        return NULL;
    }
    *kind = BATCH_PROMPT_IDS;
    if (!json_is_array(ids) || json_array_size(ids) == 0)
        return ids_why;
    json_array_foreach(ids, i, x)
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return ids_why;
    return NULL;
}

int batch_request_parts(const json_t *obj, const json_t *settings, size_t index,
                        enum batch_prompt *kind, json_t **prompt, json_t **extra,
                        const char **why)
{
    static const char *const PROMPT_KEYS[] = {"prompt", "messages", "prompt_ids"};
    json_t *x = NULL, *p;
    char tag[32];

    *prompt = *extra = NULL;
    *why = prompt_form(obj, kind);
    for (size_t i = 0; !*why && i < sizeof FRAMING / sizeof FRAMING[0]; i++)
        if (json_object_get(obj, FRAMING[i].key))
            *why = FRAMING[i].why;
    if (*why)
        return 1;
    p = json_object_get(obj, PROMPT_KEYS[*kind - 1]);
    snprintf(tag, sizeof tag, "b%zu", index);
    if (!(x = json_object()) || (settings && json_object_update(x, (json_t *)settings) != 0) ||
        json_object_update(x, (json_t *)obj) != 0)
        goto nomem;
    json_object_del(x, "id");
    json_object_del(x, "prompt");
    json_object_del(x, "prompt_ids");
    /* (--no-parse-special is about text: a line of ids takes it only from
     * itself, where the daemon refuses it) */
    if (*kind == BATCH_PROMPT_IDS && !json_object_get(obj, "parse_special"))
        json_object_del(x, "parse_special");
    /* ("batch": so the daemon's metrics count it as a batch job's) */
    if (json_object_set_new(x, "batch", json_true()) != 0 ||
        json_object_set_new(x, "stream", json_false()) != 0 ||
        json_object_set_new(x, "tag", json_string(tag)) != 0)
        goto nomem;
    *prompt = json_incref(p);
    *extra = x;
    return 0;
nomem:
    json_decref(x);
    return -1;
}

/* The settings dg_gen_settings_validate weighs together: its message about
 * them starts "t_min X, t_max Y: ..." (the schedule's ends, and the
 * temperature of the last of max_denoising_steps steps). */
static const char *const SCHEDULE_KEYS[] = {"t_min", "t_max", "max_denoising_steps"};

const char *batch_flag_refused(const json_t *obj, const json_t *settings, const char *code,
                               const char *msg)
{
    char key[64];
    size_t n = 0;
    const char *k;
    json_t *v;

    if (!settings || !code || strcmp(code, "bad_request") || !msg)
        return NULL;
    while (n < sizeof key - 1 && ((msg[n] >= 'a' && msg[n] <= 'z') || msg[n] == '_')) {
        key[n] = msg[n];
        n++;
    }
    key[n] = '\0';
    if (n == 0)
        return NULL;
    if (msg[n] == ':' || msg[n] == '[') {
        /* one setting's own check ("top_p: ...", "stop[1]: ..."): the
         * flag's when the line leaves that setting to the flags */
        if (json_object_get(obj, key) || !json_object_get(settings, key))
            return NULL;
        json_object_foreach((json_t *)settings, k, v)
            if (!strcmp(k, key))
                return k;
        return NULL;
    }
    if (strcmp(key, "t_min") || msg[n] != ' ')
        return NULL;
    /* the schedule's check: the flags' when the line sets none of what it
     * weighs (a line's own t_max beside a flag's t_min is the line's) */
    for (size_t i = 0; i < sizeof SCHEDULE_KEYS / sizeof SCHEDULE_KEYS[0]; i++)
        if (json_object_get(obj, SCHEDULE_KEYS[i]))
            return NULL;
    json_object_foreach((json_t *)settings, k, v)
        for (size_t i = 0; i < sizeof SCHEDULE_KEYS / sizeof SCHEDULE_KEYS[0]; i++)
            if (!strcmp(k, SCHEDULE_KEYS[i]))
                return k;
    return NULL;
}
