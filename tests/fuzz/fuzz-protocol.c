/*
 * Fuzz target: the daemon's request lines (what any local process may send
 * to the socket).  Properties: a line is either rejected with one of the
 * stable error codes and nothing allocated, or accepted with a prompt of
 * 1 .. max_prompt_tokens ids inside the vocabulary and settings that
 * validate.  The same line parsed with its text left for dproto_tokenize
 * (what dgemmad does with long prompts) ends the same way: the same error
 * code and message, or the same ids.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/protocol.h"
#include "tests/fuzz/fuzz-proto-ctx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const CODES[] = {"bad_json", "bad_request", "unknown_op", "bad_version",
                                    "too_large", "internal"};

/* The line parsed with every text left for dproto_tokenize, then
 * tokenized: 0 with *d as the parse alone gives it, or -1 with *e. */
static int parse_deferred(const uint8_t *data, size_t size, struct fuzz_proto *p,
                          struct dproto_request *d, struct dproto_error *e)
{
    struct dproto_ctx ctx = p->ctx;
    ctx.defer_text_bytes = 1;
    if (dproto_parse((const char *)data, size, &ctx, d, e) < 0)
        return -1;
    return dproto_tokenize(&ctx, d, e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_proto *p = fuzz_proto_ctx();
    struct dproto_request r, d;
    struct dproto_error e, de;
    const int rc = dproto_parse((const char *)data, size, &p->ctx, &r, &e);

    if (parse_deferred(data, size, p, &d, &de) != rc ||
        (rc < 0 && (strcmp(e.code, de.code) || strcmp(e.message, de.message))) ||
        (rc == 0 && (d.op != r.op || d.text || d.n_ids != r.n_ids ||
                     (r.n_ids && memcmp(d.ids, r.ids, r.n_ids * sizeof *r.ids)))))
        abort();
    if (rc == 0)
        dproto_request_free(&d);
    if (rc < 0) {
        size_t i = 0;
        while (i < sizeof CODES / sizeof CODES[0] && strcmp(e.code, CODES[i]))
            i++;
        if (i == sizeof CODES / sizeof CODES[0] || r.ids || !e.message[0])
            abort();
        return 0;
    }
    if (r.op == DPROTO_GENERATE) {
        if (r.n_ids < 1 || r.n_ids > p->ctx.max_prompt_tokens ||
            dg_gen_settings_validate(&r.settings, &p->cfg, &p->limits, NULL) != 0 ||
            !r.settings.seed_set)
            abort();
        for (size_t i = 0; i < r.n_ids; i++)
            if (r.ids[i] < 0 || r.ids[i] >= p->cfg.vocab_size)
                abort();
    }
    dproto_request_free(&r);
    return 0;
}
