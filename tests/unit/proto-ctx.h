/*
 * proto-ctx.h - the request parser's context the unit tests of the
 * daemon's protocol share (t-protocol, t-prep): the "small" preset's model
 * config, default generation settings and limits, and the synthetic
 * tokenizer of its vocabulary, written to the test's scratch directory.
 * Header-only, like tests/fuzz/fuzz-proto-ctx.h for the fuzz targets.
 */
#ifndef DG_TEST_PROTO_CTX_H
#define DG_TEST_PROTO_CTX_H

#include <stdio.h>
#include <string.h>

#include "daemon/protocol.h"
#include "lib/gen-settings.h"
#include "lib/model-config.h"
#include "lib/tokenizer-synth.h"
#include "lib/tokenizer.h"
#include "tests/harness.h"

struct test_proto {
    struct dg_model_config cfg;
    struct dg_generation_config gen;
    struct dg_gen_settings defaults;
    struct dg_gen_limits limits;
    struct dg_tokenizer *tok;  /* dg_tokenizer_free when done */
    struct dproto_ctx ctx;     /* points into the above */
};

/* Fill P, with max_prompt_tokens tokens a prompt at most: 0, or the
 * harness's failure (a check failed, and said so). */
static inline int test_proto_setup(struct test_proto *P, size_t max_prompt_tokens)
{
    struct dg_error err = {0};
    char path[600];
    CHECK(dg_model_config_preset("small", &P->cfg, NULL) == 0);
    dg_generation_config_defaults(&P->gen);
    dg_gen_limits_default(&P->limits);
    dg_gen_settings_defaults(&P->defaults, &P->cfg, &P->gen);
    CHECK_OK(dg_tokenizer_synth_write(test_tmpdir(), P->cfg.vocab_size, &err), &err);
    snprintf(path, sizeof path, "%s/tokenizer.json", test_tmpdir());
    CHECK_OK(dg_tokenizer_load(path, NULL, &P->tok, &err), &err);
    P->ctx.cfg = &P->cfg;
    P->ctx.defaults = &P->defaults;
    P->ctx.limits = &P->limits;
    P->ctx.tok = P->tok;
    P->ctx.max_prompt_tokens = max_prompt_tokens;
    return 0;
}

/* A canvas event: canvas *cs, the three ids {40, 41, 42}, text (its
 * length by strlen). */
static inline void test_canvas_event(struct dg_gen_event *ev, const struct dg_canvas_stats *cs,
                                     const char *text)
{
    static const int32_t ids[3] = {40, 41, 42};
    memset(ev, 0, sizeof *ev);
    ev->kind = DG_EVENT_CANVAS;
    ev->canvas = cs;
    ev->ids = ids;
    ev->n_ids = 3;
    ev->text = text;
    ev->text_len = strlen(text);
}

/* A done event, finished by stop id 1, with *st filled: 12 prompt tokens,
 * 3 completion tokens, one canvas (*cs) of 9 decoder steps. */
static inline void test_done_event(struct dg_gen_event *ev, struct dg_request_stats *st,
                                   const struct dg_canvas_stats *cs)
{
    memset(st, 0, sizeof *st);
    st->prompt_tokens = 12;
    st->completion_tokens = 3;
    st->canvases = 1;
    st->decoder_steps = 9;
    st->canvas = cs;
    memset(ev, 0, sizeof *ev);
    ev->kind = DG_EVENT_DONE;
    ev->finish = DG_FINISH_STOP;
    ev->stop_id = 1;
    ev->stats = st;
}

#endif
