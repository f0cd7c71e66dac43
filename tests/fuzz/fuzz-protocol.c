/*
 * Fuzz target: the daemon's request lines (what any local process may send
 * to the socket).  Properties: a line is either rejected with one of the
 * stable error codes and nothing allocated, or accepted with a prompt of
 * 1 .. max_prompt_tokens ids inside the vocabulary and settings that
 * validate.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/protocol.h"
#include "lib/tokenizer-synth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const CODES[] = {"bad_json", "bad_request", "unknown_op", "bad_version",
                                    "too_large", "internal"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct dg_model_config cfg;
    static struct dg_generation_config gen;
    static struct dg_gen_settings defaults;
    static struct dg_gen_limits limits;
    static struct dg_tokenizer *tok;
    static struct dproto_ctx ctx;
    struct dproto_request r;
    struct dproto_error e;

    if (!tok) {
        char dir[] = "/tmp/dgemma-fuzz-protocol-XXXXXX", path[64];
        struct dg_error err;
        if (!mkdtemp(dir) || dg_model_config_preset("small", &cfg, &err) != 0 ||
            dg_tokenizer_synth_write(dir, cfg.vocab_size, &err) != 0)
            abort();
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (dg_tokenizer_load(path, NULL, &tok, &err) != 0)
            abort();
        dg_generation_config_defaults(&gen);
        dg_gen_limits_default(&limits);
        dg_gen_settings_defaults(&defaults, &cfg, &gen);
        ctx.cfg = &cfg;
        ctx.defaults = &defaults;
        ctx.limits = &limits;
        ctx.tok = tok;
        ctx.max_prompt_tokens = 4096;
    }
    if (dproto_parse((const char *)data, size, &ctx, &r, &e) < 0) {
        size_t i = 0;
        while (i < sizeof CODES / sizeof CODES[0] && strcmp(e.code, CODES[i]))
            i++;
        if (i == sizeof CODES / sizeof CODES[0] || r.ids || !e.message[0])
            abort();
        return 0;
    }
    if (r.op == DPROTO_GENERATE) {
        if (r.n_ids < 1 || r.n_ids > ctx.max_prompt_tokens ||
            dg_gen_settings_validate(&r.settings, &cfg, &limits, NULL) != 0 || !r.settings.seed_set)
            abort();
        for (size_t i = 0; i < r.n_ids; i++)
            if (r.ids[i] < 0 || r.ids[i] >= cfg.vocab_size)
                abort();
    }
    dproto_request_free(&r);
    return 0;
}
