/*
 * text-out.h - a request's text as it is generated: streaming
 * detokenization (special tokens skipped) and stop strings.
 *
 * Ids go in one at a time; text comes out as soon as it can no longer be
 * the beginning of a stop string.  When a stop string appears, the text
 * before it is released, the stop string and everything after it are
 * dropped, and the id that completed it is reported, so the caller can cut
 * its token list there too.
 */
#ifndef DG_TEXT_OUT_H
#define DG_TEXT_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"
#include "lib/gen-settings.h"
#include "lib/tokenizer.h"

struct dg_text_out {
    struct dg_tok_stream st;
    const struct dg_gen_settings *settings; /* stop strings; borrowed */
    struct dg_buf pending;                  /* decoded, held back */
    struct dg_buf piece;                    /* one id's text */
    int stopped;
    int matched;                            /* index of the stop string found, -1 */
};

/* settings must outlive to.  Errors: DG_E_UNSUPPORTED (a tokenizer whose
 * decoder cannot stream), DG_E_NOMEM. */
int dg_text_out_init(struct dg_text_out *to, const struct dg_tokenizer *tok,
                     const struct dg_gen_settings *settings, struct dg_error *err);

/* Feed ids[0..n).  Releasable text is appended to out.  *consumed: how
 * many ids were taken (all of them, or up to and including the one that
 * completed a stop string, after which *stopped = 1 and later pushes take
 * nothing). */
int dg_text_out_push(struct dg_text_out *to, const int32_t *ids, size_t n, struct dg_buf *out,
                     size_t *consumed, int *stopped, struct dg_error *err);

/* The end of the request: release what is held back. */
int dg_text_out_finish(struct dg_text_out *to, struct dg_buf *out, struct dg_error *err);

void dg_text_out_free(struct dg_text_out *to);

#endif
