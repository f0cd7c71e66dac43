/*
 * Fuzz target: loading tokenizer.json from arbitrary bytes.  An accepted
 * file must then encode and decode a fixed text without failing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_tokenizer *t;
    struct dg_error err;
    struct dg_ids ids = {0};
    struct dg_buf out = {0};
    static const char text[] = "the cat, x--y. 2026! \xe2\x96\x81 \xf0\x9f\x98\x80";
    const int32_t probe[] = {0, 1, 2, 3, 4, 5, 255, 256, 1000, -1};

    if (dg_tokenizer_load_text((const char *)data, size, "fuzz", &t, &err) != 0)
        return 0;
    /* encode may refuse a character (no unk, no byte fallback); it must not crash */
    (void)dg_tokenizer_encode(t, text, sizeof text - 1, DG_TOK_ADD_SPECIAL, &ids, &err);
    if (dg_tokenizer_decode(t, ids.v, ids.n, 0, &out, &err) != 0 ||
        dg_tokenizer_decode(t, probe, 10, 1, &out, &err) != 0)
        abort();
    dg_ids_free(&ids);
    dg_buf_free(&out);
    dg_tokenizer_free(t);
    return 0;
}
