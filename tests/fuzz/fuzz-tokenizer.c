/*
 * Fuzz target: encode and decode through three tokenizers with different
 * pipelines (the synthetic Gemma-layout one dgemma generates, and the two
 * feature tokenizers of tests/fixtures/tokenizer).  The first byte picks
 * the tokenizer and the flags; the rest is the input.  Properties:
 *   - valid UTF-8 text encodes, and decoding gives the text back (with
 *     U+2581 read as a space for the Gemma-layout tokenizer) when every
 *     character is in its vocabulary or byte fallback;
 *   - any input read as ids decodes, and the streamed decode (random
 *     chunks) equals the whole decode and never ends inside a character.
 * DG_SOURCE_DIR names the repository (for the fixtures); default ".".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/tokenizer-synth.h"
#include "lib/tokenizer.h"
#include "lib/utf8.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct dg_tokenizer *tok[3];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *src = getenv("DG_SOURCE_DIR");
    char dir[] = "/tmp/dgemma-fuzz-tok-XXXXXX", path[1024];
    struct dg_error err;

    (void)argc;
    (void)argv;
    if (!mkdtemp(dir) || dg_tokenizer_synth_write(dir, 512, &err) != 0)
        abort();
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (dg_tokenizer_load(path, NULL, &tok[0], &err) != 0)
        abort();
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
    for (int i = 1; i < 3; i++) {
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/feat-%c.json",
                 src && *src ? src : ".", 'a' + i - 1);
        if (dg_tokenizer_load(path, NULL, &tok[i], &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_tokenizer *t;
    struct dg_error err;
    struct dg_ids ids = {0};
    struct dg_buf whole = {0}, streamed = {0};
    struct dg_tok_stream st;
    int flags, skip;
    size_t n_ids, at = 0;
    int32_t *raw;

    if (size < 1)
        return 0;
    t = tok[data[0] % 3];
    flags = (data[0] >> 2) & 3;
    skip = (data[0] >> 4) & 1;
    data++;
    size--;

    /* text */
    if (dg_tokenizer_encode(t, (const char *)data, size, flags, &ids, &err) == 0) {
        if (dg_utf8_valid_prefix(data, size) != size)
            abort(); /* accepted invalid UTF-8 */
        if (dg_tokenizer_decode(t, ids.v, ids.n, 0, &whole, &err) != 0)
            abort();
        if (t == tok[0] && !(flags & DG_TOK_ADD_SPECIAL)) {
            /* byte fallback covers everything: the text comes back, ▁ as a space */
            size_t o = 0;
            for (size_t i = 0; i < size;) {
                if (i + 3 <= size && !memcmp(data + i, "\xe2\x96\x81", 3)) {
                    if (o >= whole.n || whole.s[o] != ' ')
                        abort();
                    o++;
                    i += 3;
                } else {
                    if (o >= whole.n || whole.s[o] != (char)data[i])
                        abort();
                    o++;
                    i++;
                }
            }
            if (o != whole.n)
                abort();
        }
    } else if (dg_utf8_valid_prefix(data, size) == size && t == tok[0]) {
        abort(); /* valid text refused by a byte-fallback tokenizer */
    }
    dg_ids_free(&ids);
    dg_buf_free(&whole);

    /* the same bytes as ids: whole decode vs streamed decode */
    n_ids = size / 2;
    raw = malloc((n_ids ? n_ids : 1) * sizeof *raw);
    for (size_t i = 0; i < n_ids; i++) /* 16-bit ids: most land in the vocabulary */
        raw[i] = (int32_t)(data[2 * i] | data[2 * i + 1] << 8) % 700 - 50;
    if (dg_tokenizer_decode(t, raw, n_ids, skip, &whole, &err) != 0)
        abort();
    if (dg_tok_stream_init(&st, t, skip, &err) != 0)
        abort();
    while (at < n_ids) {
        size_t k = 1 + (size_t)(raw[at] & 3), before = streamed.n;
        if (k > n_ids - at)
            k = n_ids - at;
        if (dg_tok_stream_push(&st, raw + at, k, &streamed, &err) != 0)
            abort();
        if (streamed.n > before &&
            dg_utf8_valid_prefix((const unsigned char *)streamed.s + before,
                                 streamed.n - before) != streamed.n - before)
            abort();
        at += k;
    }
    if (dg_tok_stream_finish(&st, &streamed, &err) != 0)
        abort();
    if (streamed.n != whole.n || (whole.n && memcmp(streamed.s, whole.s, whole.n)))
        abort();
    dg_tok_stream_free(&st);
    dg_buf_free(&whole);
    dg_buf_free(&streamed);
    free(raw);
    return 0;
}
