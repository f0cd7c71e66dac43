/*
 * Description: every allocation, in turn, fails while the daemon reads what
 * comes from outside: a full configuration file (libyaml and the loader),
 * request lines of every op and prompt form (the JSON reader, the settings,
 * the chat format and the tokenizer, tokenized in the parse and left for
 * dproto_tokenize), tokenizers loaded (with a tokenizer_config.json), the
 * embedded model's checkpoint opened (config, generation config,
 * safetensors header), a shard index, a safetensors file and a whole
 * checkpoint directory written (as dgemma-eval quantize and mkmodel write
 * them: config.json, generation_config.json, the shards and their
 * index), JSON texts, and event lines formatted.  Each failure must end as documented (DG_E_NOMEM with the
 * configuration unchanged or nothing made; an "internal" refusal naming
 * memory; NULL, or an error line that is still JSON), and with nothing left
 * allocated: the ASan build's LeakSanitizer checks that at exit, and sees
 * any bad access on the way.
 * The allocator is this file's: the link wraps malloc, calloc, realloc,
 * strdup, strndup and posix_memalign (Makefile), so jansson's, libyaml's
 * and the project's own allocations all count.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/protocol.h"
#include "lib/checkpoint.h"
#include "lib/daemon-config.h"
#include "lib/json-util.h"
#include "lib/model-config.h"
#include "lib/model-synth.h"
#include "lib/safetensors-write.h"
#include "lib/st-index.h"
#include "tests/fault/alloc-wrap.h"
#include "tests/harness.h"
#include "tests/unit/proto-ctx.h"

/* ---- the wrapped allocator ---------------------------------------------------- */

static long calls, fail_at = -1; /* the call that fails (counted from 0), -1: none */

static int fails(void)
{
    return calls++ == fail_at;
}

void *__wrap_malloc(size_t n)
{
    return fails() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return fails() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return n && fails() ? NULL : __real_realloc(p, n); /* (realloc to 0 frees) */
}

char *__wrap_strdup(const char *s)
{
    return fails() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    return fails() ? NULL : __real_strndup(s, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    return fails() ? 12 /* ENOMEM */ : __real_posix_memalign(p, align, n);
}

/* Start counting; with k >= 0 the k-th call from now fails. */
static void arm(long k)
{
    calls = 0;
    fail_at = k;
}

/* Stop failing; the calls made since arm(). */
static long disarm(void)
{
    fail_at = -1;
    return calls;
}

/* ---- configuration ------------------------------------------------------------ */

static const char CONFIG[] =
    "# a configuration with every kind of value\n"
    "backend: cpu\n"
    "devices:\n"
    "  - 0\n"
    "  - 1\n"
    "tp: 2\n"
    "max_batch: 4\n"
    "socket: '/tmp/a socket with a long name that grows a buffer past sixty-four bytes'\n"
    "socket_mode: 0660\n"
    "socket_group: \"dgemma \\u00e9\"\n"
    "allow_uids: [1000, 1001, 1002]\n"
    "allow_root: false\n"
    "shutdown_grace: 2.5\n"
    "log_level: debug\n";

static int case_config(void)
{
    struct dg_config want, c, fresh;
    struct dg_error err = {0};
    long total;

    dg_config_defaults(&want);
    arm(-1);
    CHECK_OK(dg_config_load_text(&want, CONFIG, sizeof CONFIG - 1, "t.yaml", &err), &err);
    total = disarm();
    CHECK(total > 10);
    dg_config_defaults(&fresh);
    for (long k = 0; k < total; k++) {
        int rc;
        dg_config_defaults(&c);
        arm(k);
        rc = dg_config_load_text(&c, CONFIG, sizeof CONFIG - 1, "t.yaml", &err);
        disarm();
        CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM, "allocation %ld of %ld: rc %d: %s",
               k, total, rc, err.msg);
        CHECKF(!memcmp(&c, &fresh, sizeof c), "allocation %ld: the configuration changed", k);
    }
    return 0;
}

/* ---- request lines ------------------------------------------------------------ */

static struct test_proto P;

static const char *const LINES[] = {
    "{\"v\":1,\"op\":\"status\",\"tag\":\"s\"}",
    "{\"v\":1,\"op\":\"cancel\",\"id\":3}",
    "{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":64,\"cq_entries\":32}",
    "{\"v\":1,\"op\":\"generate\",\"prompt\":\"the cat sat on the mat\",\"max_tokens\":16,"
    "\"seed\":3,\"tag\":\"a\"}",
    "{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2,10,11,12],\"top_k\":5,\"top_p\":0.9,"
    "\"stop\":[\"x\"],\"stop_token_ids\":[7]}",
    "{\"v\":1,\"op\":\"generate\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"a cat \\u00e9 \\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"the mat\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"on\"},"
    "{\"type\":\"text\",\"text\":\" and on\"}]}],\"enable_thinking\":true,\"stream\":false,"
    "\"stop\":[\"The end\",\"\\n\\n\"],\"t_max\":0.5,\"tag\":\"a longer tag for the story\","
    "\"parse_special\":false}",
};

/* Parse line (tokenizing in the parse, or leaving the text for
 * dproto_tokenize); 0 with *r, or -1 with *e. */
static int parse(const char *line, size_t defer, struct dproto_request *r,
                 struct dproto_error *e)
{
    struct dproto_ctx ctx = P.ctx;
    ctx.defer_text_bytes = defer;
    if (dproto_parse(line, strlen(line), &ctx, r, e) < 0)
        return -1;
    return dproto_tokenize(&ctx, r, e);
}

static int case_requests(void)
{
    if (test_proto_setup(&P, 4096))
        return 1;
    for (size_t i = 0; i < sizeof LINES / sizeof LINES[0]; i++) {
        for (size_t defer = 0; defer < 2; defer++) {
            struct dproto_request r;
            struct dproto_error e;
            long total;
            arm(-1);
            CHECKF(parse(LINES[i], defer, &r, &e) == 0, "line %zu: %s: %s", i, e.code,
                   e.message);
            total = disarm();
            dproto_request_free(&r);
            for (long k = 0; k < total; k++) {
                int rc;
                arm(k);
                rc = parse(LINES[i], defer, &r, &e);
                disarm();
                if (rc == 0)
                    dproto_request_free(&r);
                CHECKF(rc < 0 && !strcmp(e.code, "internal") && strstr(e.message, "memory"),
                       "line %zu (defer %zu), allocation %ld of %ld: %s %s: %s", i, defer, k,
                       total, rc == 0 ? "accepted" : "refused", rc == 0 ? "" : e.code,
                       rc == 0 ? "" : e.message);
            }
        }
    }
    dg_tokenizer_free(P.tok);
    P.tok = NULL;
    return 0;
}

/* Tokenizers loaded as dgemmad loads one at start: the one the request
 * lines used (written by test_proto_setup), and the embedded default
 * model's with its tokenizer_config.json. */
static int case_tokenizer(void)
{
    char synth[600];
    const char *const paths[2][2] = {{synth, NULL},
                                     {"model/default/tokenizer.json",
                                      "model/default/tokenizer_config.json"}};

    snprintf(synth, sizeof synth, "%s/tokenizer.json", test_tmpdir());
    for (int i = 0; i < 2; i++) {
        struct dg_tokenizer *t = NULL;
        struct dg_error err = {0};
        long total;
        arm(-1);
        CHECK_OK(dg_tokenizer_load(paths[i][0], paths[i][1], &t, &err), &err);
        total = disarm();
        dg_tokenizer_free(t);
        for (long k = 0; k < total; k++) {
            int rc;
            t = NULL;
            arm(k);
            rc = dg_tokenizer_load(paths[i][0], paths[i][1], &t, &err);
            disarm();
            CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM && !t,
                   "%s, allocation %ld of %ld: rc %d: %s", paths[i][0], k, total, rc, err.msg);
        }
    }
    return 0;
}

/* A sharded checkpoint's model.safetensors.index.json. */
static int case_index(void)
{
    static const char text[] =
        "{\"metadata\": {\"total_size\": 123456789},\n"
        " \"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\",\n"
        "  \"model.layers.0.mlp.down_proj.weight\": \"model-00002-of-00002.safetensors\",\n"
        "  \"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}";
    struct dg_index idx;
    struct dg_error err = {0};
    long total;

    arm(-1);
    CHECK_OK(dg_index_parse(text, sizeof text - 1, "i.json", &idx, &err), &err);
    total = disarm();
    CHECK(idx.n_shards == 2);
    dg_index_free(&idx);
    for (long k = 0; k < total; k++) {
        int rc;
        arm(k);
        rc = dg_index_parse(text, sizeof text - 1, "i.json", &idx, &err);
        disarm();
        CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM && idx.n_shards == 0,
               "allocation %ld of %ld: rc %d: %s", k, total, rc, err.msg);
    }
    return 0;
}

/* The embedded default model's checkpoint opened (config, generation
 * config, safetensors header), as dgemmad opens one at start. */
static int case_checkpoint(void)
{
    struct dg_checkpoint ck;
    struct dg_error err = {0};
    long total;

    arm(-1);
    CHECK_OK(dg_checkpoint_open("model/default", &ck, &err), &err);
    total = disarm();
    dg_checkpoint_close(&ck);
    for (long k = 0; k < total; k++) {
        int rc;
        arm(k);
        rc = dg_checkpoint_open("model/default", &ck, &err);
        disarm();
        if (rc == 0)
            dg_checkpoint_close(&ck);
        CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM && ck.n_tensors == 0 && !ck.dir,
               "allocation %ld of %ld: rc %d: %s", k, total, rc, err.msg);
    }
    return 0;
}

/* ---- a safetensors file written ------------------------------------------------ */

static int fill_bytes(void *userdata, size_t index, void *buf, size_t nbytes,
                      struct dg_error *err)
{
    (void)userdata;
    (void)err;
    for (size_t i = 0; i < nbytes; i++)
        ((unsigned char *)buf)[i] = (unsigned char)(index * 31 + i);
    return 0;
}

/* dg_st_write, as dgemma-eval quantize and mkmodel write checkpoints:
 * each failure is DG_E_NOMEM with no file at the path and no .tmp (never
 * a file whose header lost a dimension or a key). */
static int case_st_write(void)
{
    static const struct dg_st_out_tensor T[] = {
        {"model.layers.0.mlp.down_proj.weight", DG_DTYPE_BF16, 2, {4, 3}},
        {"model.norm.weight", DG_DTYPE_F32, 1, {5}},
        {"model.layers.0.mlp.down_proj.weight_scale", DG_DTYPE_F8_E4M3, 3, {2, 2, 2}},
    };
    const char *path = test_path("w.safetensors"), *tmp = test_path("w.safetensors.tmp");
    struct dg_error err = {0};
    long total;

    arm(-1);
    CHECK_OK(dg_st_write(path, T, 3, fill_bytes, NULL, &err), &err);
    total = disarm();
    CHECK(total > 10);
    for (long k = 0; k < total; k++) {
        int rc;
        unlink(path);
        arm(k);
        rc = dg_st_write(path, T, 3, fill_bytes, NULL, &err);
        disarm();
        CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM && strstr(err.msg, "out of memory"),
               "allocation %ld of %ld: rc %d: %s", k, total, rc, err.msg);
        CHECKF(access(path, F_OK) != 0 && access(tmp, F_OK) != 0,
               "allocation %ld: a file was left", k);
    }
    return 0;
}

/* A checkpoint directory written as dgemma-eval mkmodel writes one (the
 * tiny preset, two shards and an index, config.json in both of its forms,
 * an FP8 one with its quantization_config): each failure is DG_E_NOMEM,
 * never a success with a file that lost a key. */
static int case_model_write(void)
{
    const char *dir = test_path("model");
    struct dg_model_config cfg;
    struct dg_synth_options opts;
    struct dg_synth_plan plan = {0};
    struct dg_error err = {0};

    CHECK_OK(dg_model_config_preset("tiny", &cfg, &err), &err);
    dg_synth_options_default(&opts);
    opts.n_shards = 2;
    CHECK_OK(dg_synth_plan_build(&cfg, &opts, &plan, &err), &err);
    for (int form = 0; form < 2; form++) {
        long total;
        opts.per_layer_config_form = form;
        arm(-1);
        CHECK_OK(dg_synth_write(dir, &cfg, NULL, &plan, &opts, &err), &err);
        total = disarm();
        CHECK(total > 10);
        for (long k = 0; k < total; k++) {
            int rc;
            arm(k);
            rc = dg_synth_write(dir, &cfg, NULL, &plan, &opts, &err);
            disarm();
            CHECKF(rc == -DG_E_NOMEM && err.code == DG_E_NOMEM,
                   "form %d, allocation %ld of %ld: rc %d: %s", form, k, total, rc, err.msg);
        }
    }
    dg_synth_plan_free(&plan);
    /* config.json alone, for an FP8 checkpoint (dgemma-eval quantize) */
    cfg.fp8 = 1;
    {
        char *text;
        long total;
        arm(-1);
        text = dg_model_config_to_json(&cfg, 0);
        total = disarm();
        CHECK(text && strstr(text, "quantization_config"));
        free(text);
        for (long k = 0; k < total; k++) {
            arm(k);
            text = dg_model_config_to_json(&cfg, 0);
            disarm();
            CHECKF(!text, "FP8 config.json, allocation %ld of %ld: made anyway", k, total);
        }
    }
    return 0;
}

/* ---- JSON texts ---------------------------------------------------------------- */

static int case_json(void)
{
    static const char *const texts[] = {
        "{\"a\": [1, 2.5, -3e-2, true, null], \"a key longer than one hundred and twenty-eight "
        "bytes, which the reader copies to the heap rather than to its stack buffer, as this one "
        "is\": {\"b\": \"a string long enough to grow the scanner's buffer past its sixty-four "
        "bytes \\u00e9\"}}",
        "[[[[{\"x\": \"\\ud83d\\ude00\"}]]], 123456789.125]",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct dg_error err = {0};
        const size_t n = strlen(texts[i]);
        json_t *v;
        long total;
        arm(-1);
        v = dg_json_parse(texts[i], n, "t.json", &err);
        total = disarm();
        CHECKF(v, "%s", err.msg);
        json_decref(v);
        for (long k = 0; k < total; k++) {
            arm(k);
            v = dg_json_parse(texts[i], n, "t.json", &err);
            disarm();
            CHECKF(!v && err.code == DG_E_NOMEM, "text %zu, allocation %ld of %ld: %s", i, k,
                   total, v ? "a value" : err.msg);
        }
    }
    return 0;
}

/* ---- event lines --------------------------------------------------------------- */

/* Each allocation of make() failed in turn: NULL, except that an error
 * line may fall back to its plain form, which must still be JSON with the
 * event and code asked for. */
static int each_failure(const char *what, char *(*make)(size_t *len), const char *code)
{
    size_t len;
    long total;
    char *line;
    arm(-1);
    line = make(&len);
    total = disarm();
    CHECKF(line && len > 0 && line[len - 1] == '\n', "%s: no line", what);
    free(line);
    for (long k = 0; k < total; k++) {
        arm(k);
        line = make(&len);
        disarm();
        if (line && code) {
            json_t *j = json_loadb(line, len, 0, NULL);
            const int ok = j && !strcmp(json_string_value(json_object_get(j, "code")), code);
            json_decref(j);
            free(line);
            CHECKF(ok, "%s, allocation %ld of %ld: the plain error line is not right", what, k,
                   total);
        } else {
            free(line);
            CHECKF(!line, "%s, allocation %ld of %ld: a line despite the failure", what, k,
                   total);
        }
    }
    return 0;
}

static const struct dg_canvas_stats CANVAS = {2, 9, 1, 3, 12.5, 0.25f};

static char *make_canvas(size_t *len)
{
    struct dg_gen_event ev;
    test_canvas_event(&ev, &CANVAS, "ok \xff tail");
    return dproto_canvas(7, "tag", &ev, len);
}

static char *make_done(size_t *len)
{
    static const int32_t ids[3] = {40, 41, 42};
    struct dg_request_stats st;
    struct dg_gen_event ev;
    test_done_event(&ev, &st, &CANVAS);
    return dproto_done(7, "t", &ev, "abc", 3, 1, ids, 3, len);
}

static char *make_error(size_t *len)
{
    return dproto_error_line(9, "a tag", "bad_request", "max_tokens: 0 is out of range", len);
}

static int case_events(void)
{
    return each_failure("canvas", make_canvas, NULL) || each_failure("done", make_done, NULL) ||
           each_failure("error", make_error, "bad_request");
}

int main(void)
{
    TEST_CASE(case_config);
    TEST_CASE(case_requests);
    TEST_CASE(case_tokenizer);
    TEST_CASE(case_checkpoint);
    TEST_CASE(case_index);
    TEST_CASE(case_st_write);
    TEST_CASE(case_model_write);
    TEST_CASE(case_json);
    TEST_CASE(case_events);
    return test_finish();
}
