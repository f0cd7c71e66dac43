/*
 * protocol.h - dgemmad's socket protocol, version 1: newline-delimited JSON
 * (one object per line, UTF-8), documented in dgemmad(8).
 *
 * Requests ("v" must be 1; "tag" is any string of up to 128 bytes the
 * client chooses, echoed in every event about the request):
 *
 *   {"v":1, "op":"generate", "prompt":"text"          (a <bos> is prepended)
 *                          | "messages":[{"role","content"}...]  (chat format,
 *                                           generation prompt; "enable_thinking")
 *                          | "prompt_ids":[ids...],
 *    "parse_special":true|false (with prompt or messages: false encodes their
 *    text as plain text, matching no added token such as a turn marker),
 *    "stream":true|false, "tag":"...", "batch":true|false (a batch job's
 *    request, recorded as such in the metrics), and any generation setting at the top
 *    level: canvas_length, max_denoising_steps, entropy_bound,
 *    confidence_threshold, stability_threshold, t_min, t_max, top_k, top_p,
 *    seed, max_tokens, stop_token_ids, stop}
 *   {"v":1, "op":"cancel", "id":N}
 *   {"v":1, "op":"status"}
 *   {"v":1, "op":"shm_attach", "sq_entries":n, "cq_entries":n, "in_bytes":n,
 *    "out_bytes":n}  (sizes optional; the answer carries descriptors:
 *                     lib/shm-layout.h)
 *
 * Events (one line each; "id" is the daemon's request id):
 *
 *   accepted  {"v":1,"event":"accepted","id":N,"tag":..,"prompt_tokens":..,
 *              "seed":..,"settings":{...}}
 *   canvas    {"v":1,"event":"canvas","id":N,"tag":..,"index":i,"text":"delta",
 *              "ids":[...],"tokens":n,"steps":s,"ms":t,"mean_entropy":h}
 *              (streaming requests only)
 *   done      {"v":1,"event":"done","id":N,"tag":..,"finish_reason":"stop"|
 *              "length"|"cancelled"|"error","usage":{"prompt_tokens",
 *              "completion_tokens"},"canvases":n,"steps_per_canvas":[...],
 *              "decoder_steps":n,"tokens_per_step":x,"tokens_per_s":x,
 *              "ms_first_canvas":x,"ms_total":x[,"stop_id"|"stop"]
 *              [,"text","ids" when not streaming][,"error":{code,message}]}
 *   cancelling {"v":1,"event":"cancelling","id":N}  (to the client that
 *              asked; the request's done follows on its own connection)
 *   error     {"v":1,"event":"error","id":N|null,"tag":..,"code":"...",
 *              "message":"..."}   (a request that was not accepted, or a
 *              protocol problem; the connection stays usable)
 *   status    {"v":1,"event":"status",...}
 *   shm_attached {"v":1,"event":"shm_attached","version":1,"size":..,
 *              "sq_entries":..,"cq_entries":..,"in_bytes":..,"out_bytes":..}
 *              (with the memfd and two eventfds as SCM_RIGHTS)
 *
 * Error codes are stable: bad_json, bad_request, unknown_op, bad_version,
 * too_large, busy, not_found, shutting_down, internal.
 */
#ifndef DG_DAEMON_PROTOCOL_H
#define DG_DAEMON_PROTOCOL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/engine.h"
#include "lib/gen-settings.h"
#include "lib/model-config.h"
#include "lib/tokenizer.h"

#define DPROTO_VERSION 1
#define DPROTO_TAG_MAX 128

enum dproto_op { DPROTO_GENERATE = 1, DPROTO_CANCEL, DPROTO_STATUS, DPROTO_SHM_ATTACH };

enum dproto_prompt { DPROTO_PROMPT_TEXT = 1, DPROTO_PROMPT_MESSAGES, DPROTO_PROMPT_IDS };

/* What a request line needs to be checked against. */
struct dproto_ctx {
    const struct dg_model_config *cfg;
    const struct dg_gen_settings *defaults;  /* the checkpoint's, with the daemon's defaults */
    const struct dg_gen_limits *limits;
    const struct dg_tokenizer *tok;          /* NULL: only prompt_ids are accepted */
    size_t max_prompt_tokens;
    size_t defer_text_bytes;  /* a prompt or messages with at least this many bytes of text
                               * is left for dproto_tokenize (0: tokenized by the parse) */
    int plain_text;           /* a request without "parse_special" takes it as false */
};

/* A parse failure: a stable code, a message, and what of the request was
 * understood before it failed (so the error event can name its tag). */
struct dproto_error {
    const char *code;
    char message[512];
    char tag[DPROTO_TAG_MAX + 1];
    int has_tag;
    enum dproto_op op;          /* 0: the line failed before its op was known */
    int batch;                  /* a generate that said "batch":true (its metrics source) */
};

struct dproto_request {
    enum dproto_op op;
    char tag[DPROTO_TAG_MAX + 1];
    int has_tag;
    /* generate */
    enum dproto_prompt prompt_kind;
    int stream;
    int batch;                  /* "batch": true, sent by batch jobs (metrics) */
    int32_t *ids;               /* the tokenized prompt (malloc'd) */
    size_t n_ids;
    json_t *text;               /* the prompt string or the messages, when the parse left
                                 * them for dproto_tokenize (a reference; NULL otherwise) */
    int thinking;               /* messages: "enable_thinking" */
    int parse_special;          /* "parse_special" (default !ctx->plain_text): text that
                                 * spells an added token is that token; 0: plain text */
    struct dg_gen_settings settings;
    /* cancel */
    uint64_t target;
    /* shm_attach: the sizes asked for (0: the daemon's default) */
    struct {
        uint32_t sq_entries, cq_entries;
        uint64_t in_bytes, out_bytes;
    } shm;
};

/* Parse and check one request line (without its newline) and, for
 * generate, tokenize its prompt.  Returns 0, or -1 with *perr filled.
 * On success the caller frees req with dproto_request_free. */
int dproto_parse(const char *line, size_t len, const struct dproto_ctx *ctx,
                 struct dproto_request *req, struct dproto_error *perr);

/* The same for a request already parsed into a JSON object (root is only
 * read; the caller keeps it). */
int dproto_parse_json(json_t *root, const struct dproto_ctx *ctx, struct dproto_request *req,
                      struct dproto_error *perr);

/* Tokenize what the parse left in req->text (ctx->defer_text_bytes; nothing
 * to do when req->text is NULL): ids and n_ids set, req->text released.
 * Runs on any thread, provided no other touches req or the JSON values it
 * holds meanwhile (the parse's root released before).  Returns 0, or -1
 * with *perr filled (code, message, op and tag) and req freed, as
 * dproto_parse leaves a request that fails. */
int dproto_tokenize(const struct dproto_ctx *ctx, struct dproto_request *req,
                    struct dproto_error *perr);

void dproto_request_free(struct dproto_request *req);

/* Event lines: malloc'd, newline-terminated, *len set; NULL on ENOMEM.
 * tag may be NULL. */
char *dproto_accepted(uint64_t id, const char *tag, size_t prompt_tokens,
                      const struct dg_gen_settings *s, size_t *len);
char *dproto_canvas(uint64_t id, const char *tag, const struct dg_gen_event *ev, size_t *len);
/* text/ids: the whole output for non-streaming requests (NULL otherwise). */
char *dproto_done(uint64_t id, const char *tag, const struct dg_gen_event *ev, const char *text,
                  size_t text_len, int have_text, const int32_t *ids, size_t n_ids, size_t *len);
/* id 0: the request has no id (it was never accepted).  When jansson runs
 * out of memory the line is formatted plainly (one small allocation). */
char *dproto_error_line(uint64_t id, const char *tag, const char *code, const char *message,
                        size_t *len);
/* A done line with finish_reason "error" and {"code", "message"} as its
 * "error", made with one allocation (no jansson): prepared in advance for
 * when the real done line cannot be formatted.  NULL on ENOMEM. */
char *dproto_done_error(uint64_t id, const char *tag, const char *code, const char *message,
                        size_t *len);
/* Any object as an event line: adds "v" and "event", steals obj. */
char *dproto_event_obj(const char *event, json_t *obj, size_t *len);

#endif
