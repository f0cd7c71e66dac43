/*
 * Fuzz target: the JSON reader every outside text goes through
 * (lib/json-load.c), against jansson's parser as the reference.  The first
 * byte picks the flags (bit 0 JSON_REJECT_DUPLICATES, bit 1 JSON_ALLOW_NUL,
 * bit 2 JSON_DECODE_ANY), the rest is the text.  Property: the same verdict
 * as jansson and, when both take it, equal values; a range error only where
 * jansson reports a numeric overflow or bad UTF-8 right after the number
 * (it decodes the character that ends a number before reading the number);
 * no refusal but a format or a range error.  The differences allowed, where
 * only this reader refuses: nesting deeper than 64, and a raw NUL byte in
 * the text (jansson skips one that follows a number or a literal:
 * "[1\0]" is [1] to it, " null\0" null).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_error err = {0};
    json_error_t je;
    size_t flags = 0;
    const char *text;
    json_t *ours, *ref;

    if (size < 1)
        return 0;
    flags |= data[0] & 1 ? JSON_REJECT_DUPLICATES : 0;
    flags |= data[0] & 2 ? JSON_ALLOW_NUL : 0;
    flags |= data[0] & 4 ? JSON_DECODE_ANY : 0;
    text = (const char *)data + 1;
    ours = dg_json_loadb(text, size - 1, flags, "fuzz", &err);
    ref = json_loadb(text, size - 1, flags, &je);
    if (!ours && err.code != DG_E_FORMAT && err.code != DG_E_RANGE)
        abort();
    if (!ours && ref &&
        (strstr(err.msg, "nesting deeper than") || memchr(text, '\0', size - 1)))
        ; /* allowed (above) */
    else if (!!ours != !!ref)
        abort();
    else if (ours && !json_equal(ours, ref))
        abort();
    else if (!ours && err.code == DG_E_RANGE &&
             json_error_code(&je) != json_error_numeric_overflow &&
             json_error_code(&je) != json_error_invalid_utf8)
        abort();
    json_decref(ours);
    json_decref(ref);
    return 0;
}
