/*
 * fuzz-proto-ctx.h - the protocol parser's context the fuzz targets share
 * (fuzz-protocol, fuzz-shm-ring, fuzz-batch-input): the "small" preset's
 * model config, default generation settings and limits, and the synthetic
 * tokenizer of its vocabulary, written once to a scratch directory.
 * Header-only: each target is one translation unit.
 */
#ifndef DG_FUZZ_PROTO_CTX_H
#define DG_FUZZ_PROTO_CTX_H

#include <stdio.h>
#include <stdlib.h>

#include "daemon/protocol.h"
#include "lib/gen-settings.h"
#include "lib/model-config.h"
#include "lib/tokenizer-synth.h"
#include "lib/tokenizer.h"

struct fuzz_proto {
    struct dg_model_config cfg;
    struct dg_generation_config gen;
    struct dg_gen_settings defaults;
    struct dg_gen_limits limits;
    struct dg_tokenizer *tok;
    struct dproto_ctx ctx;     /* points into the above; max_prompt_tokens 4096 */
};

/* The shared context, made on the first call (aborts if it cannot be:
 * a fuzz target has nothing to test without it). */
static inline struct fuzz_proto *fuzz_proto_ctx(void)
{
    static struct fuzz_proto p;
    if (!p.tok) {
        char dir[] = "/tmp/dgemma-fuzz-XXXXXX", path[64];
        struct dg_error err;
        if (!mkdtemp(dir) || dg_model_config_preset("small", &p.cfg, &err) != 0 ||
            dg_tokenizer_synth_write(dir, p.cfg.vocab_size, &err) != 0)
            abort();
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (dg_tokenizer_load(path, NULL, &p.tok, &err) != 0)
            abort();
        dg_generation_config_defaults(&p.gen);
        dg_gen_limits_default(&p.limits);
        dg_gen_settings_defaults(&p.defaults, &p.cfg, &p.gen);
        p.ctx.cfg = &p.cfg;
        p.ctx.defaults = &p.defaults;
        p.ctx.limits = &p.limits;
        p.ctx.tok = p.tok;
        p.ctx.max_prompt_tokens = 4096;
    }
    return &p;
}

#endif
