/*
 * Description: streaming text with stop strings, on the synthetic Gemma-
 * layout tokenizer.  Without stop strings the streamed text equals a
 * one-shot decode (special tokens skipped) however the ids are split; a
 * stop string is cut out with everything after it, also when it spans
 * several tokens and pushes, the earliest of several wins, the id that
 * completed it is reported, and text that only might start a stop string
 * is held back until it cannot, then released.
 */
#include <string.h>

#include "lib/gen-settings.h"
#include "lib/text-out.h"
#include "lib/tokenizer-synth.h"
#include "tests/harness.h"

static struct dg_tokenizer *tok;

static int setup(void)
{
    struct dg_error err = {0};
    char path[600];
    const char *dir = test_tmpdir();
    CHECK_OK(dg_tokenizer_synth_write(dir, 512, &err), &err);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_OK(dg_tokenizer_load(path, NULL, &tok, &err), &err);
    return 0;
}

static int encode(const char *text, struct dg_ids *ids)
{
    struct dg_error err = {0};
    ids->n = 0;
    return dg_tokenizer_encode(tok, text, strlen(text), 0, ids, &err);
}

/* Push ids in chunks of `chunk`; collect the text; return ids consumed. */
static size_t stream(const struct dg_gen_settings *s, const struct dg_ids *ids, size_t chunk,
                     struct dg_buf *out, int *stopped, int finish)
{
    struct dg_text_out to;
    struct dg_error err = {0};
    size_t total = 0;
    out->n = 0;
    *stopped = 0;
    if (dg_text_out_init(&to, tok, s, &err) < 0)
        return (size_t)-1;
    for (size_t i = 0; i < ids->n && !*stopped; i += chunk) {
        size_t n = ids->n - i < chunk ? ids->n - i : chunk, used;
        if (dg_text_out_push(&to, ids->v + i, n, out, &used, stopped, &err) < 0)
            return (size_t)-1;
        total += used;
    }
    if (finish && dg_text_out_finish(&to, out, &err) < 0)
        return (size_t)-1;
    dg_text_out_free(&to);
    return total;
}

static int no_stop_strings(void)
{
    struct dg_gen_settings s;
    struct dg_ids ids = {0};
    struct dg_buf ref = {0}, out = {0};
    struct dg_error err = {0};
    int stopped;
    const char *text;

    CHECK(tok);
    text = "Hello, world! caf\xc3\xa9 \xe2\x82\xac 100 \xf0\x9f\x99\x82 done.";

    memset(&s, 0, sizeof s);
    CHECK(encode(text, &ids) == 0);
    ids.v[ids.n++] = 1; /* <eos>: special, skipped */
    CHECK_OK(dg_tokenizer_decode(tok, ids.v, ids.n, 1, &ref, &err), &err);
    CHECK(ref.n == strlen(text) && !memcmp(ref.s, text, ref.n));
    for (size_t chunk = 1; chunk <= ids.n; chunk += 3) {
        CHECK(stream(&s, &ids, chunk, &out, &stopped, 1) == ids.n && !stopped);
        CHECKF(out.n == ref.n && !memcmp(out.s, ref.s, ref.n), "chunk %zu", chunk);
    }
    dg_ids_free(&ids);
    dg_buf_free(&ref);
    dg_buf_free(&out);
    return 0;
}

static int stop_strings(void)
{
    struct dg_gen_settings s;
    struct dg_ids ids = {0};
    struct dg_buf out = {0}, prefix = {0};
    struct dg_error err = {0};
    int stopped;
    size_t used;
    const char *text = "alpha beta gamma END delta END epsilon";

    CHECK(tok);
    memset(&s, 0, sizeof s);
    strcpy(s.stop_strings[0], "END");
    strcpy(s.stop_strings[1], "gamma E");
    s.n_stop_strings = 1;
    CHECK(encode(text, &ids) == 0);
    for (size_t chunk = 1; chunk <= ids.n; chunk++) {
        used = stream(&s, &ids, chunk, &out, &stopped, 1);
        CHECKF(stopped && out.n == 17 && !memcmp(out.s, "alpha beta gamma ", 17),
               "chunk %zu: '%.*s'", chunk, (int)out.n, out.s);
        /* the ids consumed decode to text that contains the stop string */
        prefix.n = 0;
        CHECK_OK(dg_tokenizer_decode(tok, ids.v, used, 1, &prefix, &err), &err);
        CHECK(memmem(prefix.s, prefix.n, "END", 3));
        if (used > 1) {
            prefix.n = 0;
            CHECK_OK(dg_tokenizer_decode(tok, ids.v, used - 1, 1, &prefix, &err), &err);
            CHECK(!memmem(prefix.s, prefix.n, "END", 3));
        }
    }
    /* the earliest of two */
    s.n_stop_strings = 2;
    stream(&s, &ids, 2, &out, &stopped, 1);
    CHECK(stopped && out.n == 11 && !memcmp(out.s, "alpha beta ", 11));
    /* held back while it might be a stop string, released when not */
    memset(&s, 0, sizeof s);
    strcpy(s.stop_strings[0], "gamma X");
    s.n_stop_strings = 1;
    CHECK(encode("alpha gamma", &ids) == 0);
    CHECK(stream(&s, &ids, 1, &out, &stopped, 0) == ids.n && !stopped);
    CHECKF(out.n == 6 && !memcmp(out.s, "alpha ", 6), "held: '%.*s'", (int)out.n, out.s);
    CHECK(stream(&s, &ids, 1, &out, &stopped, 1) == ids.n && !stopped);
    CHECK(out.n == 11 && !memcmp(out.s, "alpha gamma", 11));
    CHECK(encode("alpha gamma Y", &ids) == 0);
    CHECK(stream(&s, &ids, 1, &out, &stopped, 0) == ids.n && !stopped);
    CHECK(out.n == 13);
    /* a stop string at the very start: nothing comes out */
    CHECK(encode("gamma X and more", &ids) == 0);
    stream(&s, &ids, 4, &out, &stopped, 1);
    CHECK(stopped && out.n == 0);
    dg_ids_free(&ids);
    dg_buf_free(&out);
    dg_buf_free(&prefix);
    return 0;
}

int main(void)
{
    TEST_CASE(setup);
    TEST_CASE(no_stop_strings);
    TEST_CASE(stop_strings);
    dg_tokenizer_free(tok);
    return test_finish();
}
