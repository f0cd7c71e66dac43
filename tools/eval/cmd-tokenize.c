/* cmd-tokenize.c - `dgemma-eval tokenize`: JSON lines in, JSON lines out,
 * through the C tokenizer and chat formatter (the oracle's I/O format). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/chat-json.h"
#include "lib/fileio.h"
#include "lib/json-util.h"
#include "lib/tokenizer.h"
#include "tools/eval/eval.h"

#define LINE_MAX_BYTES (64u << 20)

static const char usage[] =
    "usage: dgemma-eval tokenize --tokenizer FILE [--config FILE]\n"
    "Read JSON lines on standard input, one object each:\n"
    "  {\"text\": \"...\", \"add_special_tokens\": false}\n"
    "  {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...],\n"
    "   \"add_generation_prompt\": true, \"enable_thinking\": false}\n"
    "and write one JSON line each: \"ids\", \"decoded\" (special tokens kept),\n"
    "\"decoded_skip_special\", and for messages the rendered prompt as \"text\".\n"
    "Either may carry \"parse_special\": false: its text, or the messages'\n"
    "contents, then match no added token (dgemmad's parse_special).\n"
    "A line that cannot be processed gets {\"line\": N, \"error\": \"...\"}\n"
    "and the rest continue.  --config defaults to tokenizer_config.json beside\n"
    "the tokenizer.  Exit status 0 if every line succeeded, 1 otherwise.\n";

static void print_error(size_t line, const char *msg)
{
    json_t *o = json_pack("{s:I,s:s}", "line", (json_int_t)line, "error", msg);
    char *s = dg_json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    else /* (the line's result still comes, in words that need no memory) */
        printf("{\"line\":%zu,\"error\":\"out of memory\"}\n", line);
    free(s);
    json_decref(o);
}

/* Process one input object; on failure write the reason to why. */
static int one_line(const struct dg_tokenizer *t, json_t *in, char *why, size_t why_len)
{
    json_t *text = json_object_get(in, "text"), *messages = json_object_get(in, "messages");
    json_t *special = json_object_get(in, "parse_special");
    json_t *out = NULL;
    struct dg_ids ids = {0};
    struct dg_buf prompt = {0}, dec = {0}, dec_skip = {0};
    struct dg_error err = {0};
    int rc = -1;
    char *line;

    if (!json_is_object(in)) {
        snprintf(why, why_len, "a line must be a JSON object");
        return -1;
    }
    if (!!text == !!messages || (text && !json_is_string(text)) ||
        (messages && !json_is_array(messages))) {
        snprintf(why, why_len, "need exactly one of \"text\" (a string) or \"messages\" (a list)");
        return -1;
    }
    if (special && !json_is_boolean(special)) {
        snprintf(why, why_len, "parse_special must be a boolean");
        return -1;
    }
    if (text) {
        json_t *as = json_object_get(in, "add_special_tokens");
        if (as && !json_is_boolean(as)) {
            snprintf(why, why_len, "add_special_tokens must be a boolean");
            return -1;
        }
        if (dg_tokenizer_encode(t, json_string_value(text), json_string_length(text),
                                (json_is_true(as) ? DG_TOK_ADD_SPECIAL : 0) |
                                    (json_is_false(special) ? DG_TOK_ADDED_AS_TEXT : 0),
                                &ids, &err)) {
            snprintf(why, why_len, "%s", err.msg);
            goto done;
        }
    } else {
        json_t *gen = json_object_get(in, "add_generation_prompt");
        json_t *think = json_object_get(in, "enable_thinking");
        if ((gen && !json_is_boolean(gen)) || (think && !json_is_boolean(think))) {
            snprintf(why, why_len, "add_generation_prompt and enable_thinking must be booleans");
            return -1;
        }
        if (dg_chat_encode_json(t, messages, json_is_true(gen), json_is_true(think),
                                !json_is_false(special), &prompt, &ids, &err)) {
            snprintf(why, why_len, "%s", err.msg);
            goto done;
        }
    }
    if (dg_tokenizer_decode(t, ids.v, ids.n, 0, &dec, &err) ||
        dg_tokenizer_decode(t, ids.v, ids.n, 1, &dec_skip, &err)) {
        snprintf(why, why_len, "%s", err.msg);
        goto done;
    }
    /* (the set calls below are unchecked: the watch sees a failed
     * allocation in any, which would leave a key out of the line) */
    dg_json_alloc_watch();
    out = json_object();
    if (messages)
        json_object_set_new(out, "text", json_stringn(prompt.s, prompt.n));
    {
        json_t *arr = json_array();
        for (size_t i = 0; i < ids.n; i++)
            json_array_append_new(arr, json_integer(ids.v[i]));
        json_object_set_new(out, "ids", arr);
    }
    json_object_set_new(out, "decoded", json_stringn(dec.s, dec.n));
    json_object_set_new(out, "decoded_skip_special", json_stringn(dec_skip.s, dec_skip.n));
    line = dg_json_dumps_watched(out, JSON_COMPACT);
    if (!line) {
        snprintf(why, why_len, "out of memory");
        goto done;
    }
    puts(line);
    free(line);
    rc = 0;
done:
    json_decref(out);
    dg_ids_free(&ids);
    dg_buf_free(&prompt);
    dg_buf_free(&dec);
    dg_buf_free(&dec_skip);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *tok_path = NULL, *cfg_path = NULL;
    char *cfg_default = NULL, *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    struct dg_tokenizer *t;
    struct dg_error err = {0};
    int failures = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            tok_path = argv[++i];
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            cfg_path = argv[++i];
        } else {
            eval_errorf("tokenize: unexpected argument '%s'", argv[i]);
            fputs(usage, stderr);
            return 2;
        }
    }
    if (!tok_path) {
        fputs(usage, stderr);
        return 2;
    }
    if (!cfg_path) {
        const char *slash = strrchr(tok_path, '/');
        size_t dir = slash ? (size_t)(slash - tok_path) : 0;
        cfg_default = malloc(dir + 32);
        if (!cfg_default) {
            eval_errorf("tokenize: out of memory");
            return 1;
        }
        memcpy(cfg_default, tok_path, dir);
        strcpy(cfg_default + dir, dir ? "/tokenizer_config.json" : "tokenizer_config.json");
        cfg_path = cfg_default;
    }
    if (dg_tokenizer_load(tok_path, cfg_path, &t, &err) != 0) {
        eval_errorf("%s [%s]", err.msg, dg_status_name(err.code));
        free(cfg_default);
        return 1;
    }
    while ((errno = 0, n = getline(&line, &cap, stdin)) >= 0) {
        struct dg_error je = {0};
        json_t *in;
        char why[1200];
        lineno++;
        if (n > 0 && line[n - 1] == '\n')
            line[--n] = '\0';
        if (n == 0)
            continue;
        if ((size_t)n > LINE_MAX_BYTES) {
            print_error(lineno, "line too long");
            failures++;
            continue;
        }
        in = dg_json_loadb(line, (size_t)n, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, "line", &je);
        if (!in) {
            /* (the result names the line itself) */
            dg_json_error_at_column(why, sizeof why, je.msg, "line");
            print_error(lineno, why);
            failures++;
            continue;
        }
        if (one_line(t, in, why, sizeof why) < 0) {
            print_error(lineno, why);
            failures++;
        }
        json_decref(in);
        fflush(stdout);
    }
    /* a read error, or no memory for a line (getline's ENOMEM leaves the
     * stream's error flag alone): not the end of the input */
    if (ferror(stdin) || errno == ENOMEM) {
        eval_errorf("tokenize: reading line %zu: %s", lineno + 1,
                    errno == ENOMEM ? "out of memory" : strerror(errno));
        failures++;
    }
    free(line);
    free(cfg_default);
    dg_tokenizer_free(t);
    return failures ? 1 : 0;
}
