/*
 * ids-text.h - token id lists as text: whitespace-separated decimal
 * integers (the format of dgemma-eval's --prompt-ids and the golden
 * fixtures' *.ids files).
 */
#ifndef DG_IDS_TEXT_H
#define DG_IDS_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

/* Parse len bytes of text into a fresh array (*ids, free() it) of *n ids,
 * each in [0, vocab).  what names the source.  Errors (DG_E_FORMAT): a
 * token that is not a decimal integer (line and column named), an id out
 * of range, no ids at all; DG_E_NOMEM. */
int dg_ids_parse(const char *text, size_t len, int64_t vocab, const char *what, int32_t **ids,
                 size_t *n, struct dg_error *err);

#endif
