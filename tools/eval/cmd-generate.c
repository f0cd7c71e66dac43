/* cmd-generate.c - `dgemma-eval generate`: offline generation with the
 * serving engine on the CPU backend. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "lib/chat-json.h"
#include "lib/checkpoint.h"
#include "lib/cpu-backend.h"
#include "lib/engine.h"
#include "lib/fileio.h"
#include "lib/gen-settings.h"
#include "lib/json-util.h"
#include "lib/model-weights.h"
#include "lib/settings-flags.h"
#include "lib/tokenizer.h"
#include "tools/eval/eval.h"

#define MESSAGES_FILE_MAX (64u << 20)

static const char usage[] =
    "usage: dgemma-eval generate --model DIR\n"
    "                            (--prompt TEXT | --messages FILE | --prompt-ids FILE)\n"
    "                            [--settings JSON] [--canvas-length N]\n"
    "                            [--max-denoising-steps N] [--entropy-bound X]\n"
    "                            [--confidence-threshold X] [--stability-threshold N]\n"
    "                            [--t-min X] [--t-max X] [--top-k N] [--top-p X]\n"
    "                            [--seed N] [--max-tokens N] [--stop-id N]...\n"
    "                            [--stop TEXT]... [--thinking] [--no-parse-special]\n"
    "                            [--tp T] [--experts across|width] [--json]\n"
    "Generate on the CPU backend with the serving engine.  --prompt is raw text\n"
    "(a <bos> is prepended); --messages is a JSON list of {\"role\", \"content\"}\n"
    "rendered with the model's chat format and a generation prompt (--thinking\n"
    "turns the thought channel on); --prompt-ids holds whitespace-separated ids.\n"
    "--no-parse-special encodes the prompt's text, or the messages' contents, as\n"
    "plain text: a typed control token's spelling is not that token.\n"
    "Settings default to the checkpoint's generation_config.json; --settings\n"
    "takes a JSON object of them (the daemon's names), and the flags override it.\n"
    "Without --seed a random seed is used and reported.  Text is written to\n"
    "standard output as each canvas finishes and a summary to standard error;\n"
    "--json writes one JSON object with ids, text, statistics and settings instead.\n"
    "--tp T runs T tensor-parallel rank threads (the same tokens for a seed).\n";

struct result {
    int json;
    int have_text;
    struct dg_ids ids;
    struct dg_buf text;
    json_t *canvases;
    enum dg_finish finish;
    int32_t stop_id;
    char stop_string[DG_STOP_STRING_MAX + 1];
    struct dg_request_stats stats;
    char error[DG_ERROR_MSG_MAX];
    int oom;
};

static void on_event(void *ctx, const struct dg_gen_event *ev)
{
    struct result *res = ctx;

    if (ev->kind == DG_EVENT_CANVAS) {
        if (ev->n_ids > 0 && dg_ids_append(&res->ids, ev->ids, (size_t)ev->n_ids) < 0) {
            res->oom = 1;
            return;
        }
        if (ev->text && dg_buf_append(&res->text, ev->text, ev->text_len) < 0)
            res->oom = 1;
        if (!res->json) {
            if (ev->text)
                fwrite(ev->text, 1, ev->text_len, stdout);
            else
                for (int i = 0; i < ev->n_ids; i++)
                    printf("%s%d", res->ids.n - (size_t)ev->n_ids + (size_t)i ? " " : "",
                           ev->ids[i]);
            fflush(stdout);
        }
        return;
    }
    res->finish = ev->finish;
    res->stop_id = ev->stop_id;
    if (ev->stop_string)
        snprintf(res->stop_string, sizeof res->stop_string, "%s", ev->stop_string);
    if (ev->error)
        snprintf(res->error, sizeof res->error, "%s", ev->error);
    res->stats = *ev->stats;
    for (int i = 0; i < ev->stats->canvases; i++) {
        const struct dg_canvas_stats *c = &ev->stats->canvas[i];
        json_t *o = json_pack("{s:i,s:i,s:b,s:i,s:f,s:f}", "index", c->index, "steps", c->steps,
                              "converged", c->converged, "tokens", c->tokens, "ms", c->ms,
                              "mean_entropy", (double)c->mean_entropy);
        if (!o || json_array_append_new(res->canvases, o))
            res->oom = 1;
    }
    res->stats.canvas = NULL;
}

/* Build the prompt ids from one of the three sources; unless
 * parse_special, the text's (or the messages' contents') spellings of
 * control tokens are plain text (the chat format's own markers stay
 * tokens). */
static int make_prompt(const char *text, const char *messages, const char *ids_path, int thinking,
                       int parse_special, const struct dg_tokenizer *tok, int64_t vocab,
                       int32_t **ids, size_t *n)
{
    struct dg_error err = {0};
    struct dg_ids out = {0};
    struct dg_buf rendered = {0};
    int rc;

    if (ids_path)
        return eval_read_ids(ids_path, vocab, ids, n);
    if (!tok) {
        eval_errorf("generate: the model directory has no tokenizer.json; use --prompt-ids");
        return 1;
    }
    if (messages) {
        char *buf = NULL;
        size_t len = 0;
        json_t *doc;
        if (dg_file_read(messages, MESSAGES_FILE_MAX, &buf, &len, &err) != 0) {
            eval_errorf("%s", err.msg);
            return 1;
        }
        doc = dg_json_parse(buf, len, messages, &err);
        free(buf);
        if (!doc) {
            eval_errorf("%s", err.msg);
            return 1;
        }
        rc = dg_chat_encode_json(tok, doc, 1, thinking, parse_special, &rendered, &out, &err);
        json_decref(doc);
        dg_buf_free(&rendered);
    } else {
        rc = dg_tokenizer_encode(tok, text, strlen(text),
                                 DG_TOK_ADD_SPECIAL | (parse_special ? 0 : DG_TOK_ADDED_AS_TEXT),
                                 &out, &err);
    }
    if (rc != 0) {
        eval_errorf("generate: prompt: %s", err.msg);
        dg_ids_free(&out);
        return 1;
    }
    for (size_t i = 0; i < out.n; i++)
        if (out.v[i] >= vocab) {
            eval_errorf("generate: prompt token %zu is id %d, outside the model's vocabulary of "
                        "%lld", i, out.v[i], (long long)vocab);
            dg_ids_free(&out);
            return 1;
        }
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* Set key in obj from a flag's text value. */
static void print_summary(const struct result *res, const struct dg_gen_settings *s)
{
    const struct dg_request_stats *st = &res->stats;
    fprintf(stderr, "dgemma-eval: generate: finish %s", dg_finish_name(res->finish));
    if (res->stop_id >= 0)
        fprintf(stderr, " (stop id %d)", res->stop_id);
    if (res->stop_string[0])
        fprintf(stderr, " (stop string)");
    if (res->finish == DG_FINISH_ERROR)
        fprintf(stderr, ": %s", res->error);
    fprintf(stderr, "; %lld prompt + %lld tokens in %d canvas%s, %lld step%s, %.2f tokens/step, "
            "%.1f tokens/s; seed %llu\n",
            (long long)st->prompt_tokens, (long long)st->completion_tokens, st->canvases,
            st->canvases == 1 ? "" : "es", (long long)st->decoder_steps,
            st->decoder_steps == 1 ? "" : "s", st->tokens_per_step, st->tokens_per_s,
            (unsigned long long)s->seed);
}

static int print_json(const struct result *res, const struct dg_gen_settings *s, const char *backend,
                      int tp)
{
    const struct dg_request_stats *st = &res->stats;
    json_t *ids, *o;
    char *out;

    /* (the set calls below are unchecked: the watch sees a failed
     * allocation in any, which would leave a key out of the line) */
    dg_json_alloc_watch();
    ids = json_array();

    for (size_t i = 0; ids && i < res->ids.n; i++)
        json_array_append_new(ids, json_integer(res->ids.v[i]));
    o = json_pack("{s:s,s:o,s:o*,s:s,s:I,s:I,s:i,s:I,s:f,s:f,s:f,s:f,s:f,s:O,s:o,s:s}",
                  "finish_reason", dg_finish_name(res->finish), "ids", ids,
                  "text", res->have_text ? json_stringn(res->text.s ? res->text.s : "",
                                                        res->text.n) : NULL,
                  "backend", backend,
                  "prompt_tokens", (json_int_t)st->prompt_tokens,
                  "completion_tokens", (json_int_t)st->completion_tokens,
                  "canvas_count", st->canvases,
                  "decoder_steps", (json_int_t)st->decoder_steps,
                  "tokens_per_step", st->tokens_per_step,
                  "tokens_per_s", st->tokens_per_s,
                  "ms_prefill", st->ms_prefill,
                  "ms_first_canvas", st->ms_first_canvas,
                  "ms_total", st->ms_total,
                  "canvases", res->canvases,
                  "settings", dg_gen_settings_to_json(s),
                  "error", res->error);
    if (!o) {
        eval_errorf("generate: out of memory");
        return 1;
    }
    json_object_set_new(o, "tp", json_integer(tp));
    if (res->stop_id >= 0)
        json_object_set_new(o, "stop_id", json_integer(res->stop_id));
    if (res->stop_string[0])
        json_object_set_new(o, "stop", json_string(res->stop_string));
    if (res->finish != DG_FINISH_ERROR)
        json_object_del(o, "error");
    out = dg_json_dumps_watched(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!out) {
        eval_errorf("generate: out of memory");
        return 1;
    }
    puts(out);
    free(out);
    return 0;
}

/* Whether a is one of the options that take a value: this command's own
 * or a settings flag (lib/settings-flags.h). */
static int takes_value(const char *a)
{
    static const char *const own[] = {"--model", "--prompt", "--messages", "--prompt-ids",
                                      "--settings", "--tp", "--experts"};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
        if (!strcmp(a, own[k]))
            return 1;
    return dg_settings_flag_key(a) != NULL;
}

int cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *messages = NULL, *ids_path = NULL;
    const char *settings_json = NULL;
    int json_out = 0, thinking = 0, parse_special = 1, sources, status = 1, tp = 1;
    enum dg_expert_split experts = DG_EXPERTS_ACROSS;
    struct dg_cpu_backend_options bo;
    json_t *flags = json_object();
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_backend *backend = NULL;
    struct dg_engine *engine = NULL;
    struct dg_engine_config ec;
    struct dg_gen_settings s;
    struct dg_tokenizer *tok = NULL;
    struct dg_error err = {0};
    struct result res;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    uint64_t id;

    memset(&res, 0, sizeof res);
    res.stop_id = -1;
    if (!flags)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            json_decref(flags);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json_out = 1;
            continue;
        }
        if (!strcmp(a, "--thinking")) {
            thinking = 1;
            continue;
        }
        if (!strcmp(a, "--no-parse-special")) {
            parse_special = 0;
            continue;
        }
        if (!takes_value(a)) {
            eval_errorf("generate: unknown option '%s'", a);
            fputs(usage, stderr);
            json_decref(flags);
            return 2;
        }
        if (!val) {
            eval_errorf("generate: %s needs a value", a);
            json_decref(flags);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model"))
            model = val;
        else if (!strcmp(a, "--prompt"))
            text = val;
        else if (!strcmp(a, "--messages"))
            messages = val;
        else if (!strcmp(a, "--prompt-ids"))
            ids_path = val;
        else if (!strcmp(a, "--settings"))
            settings_json = val;
        else if (!strcmp(a, "--tp")) {
            char *end;
            long t = strtol(val, &end, 10);
            if (end == val || *end || t < 1 || t > DG_TP_MAX) {
                eval_errorf("generate: --tp must be 1 .. %d, not '%s'", DG_TP_MAX, val);
                json_decref(flags);
                return 2;
            }
            tp = (int)t;
        } else if (!strcmp(a, "--experts")) {
            if (strcmp(val, "across") && strcmp(val, "width")) {
                eval_errorf("generate: --experts must be across or width, not '%s'", val);
                json_decref(flags);
                return 2;
            }
            experts = !strcmp(val, "width") ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS;
        }
        else {
            struct dg_error fe = {0};
            if (dg_settings_flag_set(flags, a, val, &fe) < 0) {
                eval_errorf("generate: %s", fe.msg);
                json_decref(flags);
                return fe.code == DG_E_NOMEM ? 1 : 2;
            }
        }
    }
    sources = !!text + !!messages + !!ids_path;
    if (!model || sources != 1) {
        eval_errorf("generate: need --model and exactly one of --prompt, --messages, "
                    "--prompt-ids");
        fputs(usage, stderr);
        json_decref(flags);
        return 2;
    }
    if (!parse_special && ids_path) {
        eval_errorf("generate: --no-parse-special applies to --prompt and --messages, not "
                    "--prompt-ids");
        json_decref(flags);
        return 2;
    }
    res.json = json_out;
    res.canvases = json_array();

    if (dg_model_load(model, &ck, &m, &err) != 0) {
        eval_errorf("%s [%s]", err.msg, dg_status_name(err.code));
        json_decref(flags);
        json_decref(res.canvases);
        return 1;
    }
    {
        char tpath[4096], cpath[4096];
        snprintf(tpath, sizeof tpath, "%s/tokenizer.json", model);
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", model);
        if (dg_file_exists(tpath) && dg_tokenizer_load(tpath, cpath, &tok, &err) != 0) {
            eval_errorf("%s", err.msg);
            goto out_model;
        }
    }
    res.have_text = tok != NULL;

    /* settings: the checkpoint's defaults, then --settings, then the flags */
    dg_engine_config_default(&ec, &m.cfg);
    ec.max_batch = 1;
    dg_gen_settings_defaults(&s, &m.cfg, &ck.generation);
    if (settings_json) {
        json_t *o = dg_json_parse(settings_json, strlen(settings_json), "--settings", &err);
        if (!o || dg_gen_settings_apply_json(&s, o, &m.cfg, &ec.limits, "--settings: ",
                                             &err) != 0) {
            eval_errorf("%s", err.msg);
            json_decref(o);
            goto out_model;
        }
        json_decref(o);
    }
    if (dg_gen_settings_apply_json(&s, flags, &m.cfg, &ec.limits, "", &err) != 0) {
        eval_errorf("generate: %s", err.msg);
        goto out_model;
    }
    if (!s.seed_set) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
            eval_errorf("generate: no random seed available; pass --seed");
            goto out_model;
        }
        s.seed = r & (uint64_t)INT64_MAX;
        s.seed_set = 1;
    }
    if (make_prompt(text, messages, ids_path, thinking, parse_special, tok, m.cfg.vocab_size,
                    &prompt, &n_prompt))
        goto out_model;

    memset(&bo, 0, sizeof bo);
    bo.n_ranks = tp;
    bo.experts = experts;
    bo.max_slots = 1;
    if (dg_cpu_backend_create(&m, &bo, &backend, &err) != 0 ||
        dg_engine_create(backend, &ec, tok, on_event, &res, &engine, &err) != 0 ||
        dg_engine_submit(engine, prompt, (int64_t)n_prompt, &s, NULL, &id, &err) != 0) {
        eval_errorf("generate: %s [%s]", err.msg, dg_status_name(err.code));
        goto out;
    }
    while (dg_engine_step(engine) > 0)
        ;
    if (res.oom) {
        eval_errorf("generate: out of memory collecting the output");
        goto out;
    }
    if (json_out) {
        if (print_json(&res, &s, backend->name, tp))
            goto out;
    } else {
        if (res.ids.n || res.text.n)
            putchar('\n');
        fflush(stdout);
        print_summary(&res, &s);
    }
    status = res.finish == DG_FINISH_ERROR ? 1 : 0;
out:
    dg_engine_destroy(engine);
    if (backend)
        backend->ops->destroy(backend);
out_model:
    free(prompt);
    dg_tokenizer_free(tok);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    dg_ids_free(&res.ids);
    dg_buf_free(&res.text);
    json_decref(res.canvases);
    json_decref(flags);
    return status;
}
