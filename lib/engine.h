/*
 * engine.h - the generation engine: requests in, canvases and text out,
 * over any backend (backend.h).  Generation semantics are Hugging Face's
 * (model.md §6); serving behaviour is a server's (design.md §3.2):
 *
 *   prefill    the prompt, in chunks of prefill_chunk tokens (encoder);
 *              its last part, when it is at most one canvas and one chunk
 *              long (a whole prompt that short: all of it), is appended by
 *              the first denoising step instead, in the same backend call
 *              (backend.h: a denoise item's append), unless prompt_apart
 *   canvas b   a random canvas denoised step by step (canvas-run.h) until
 *              stable and confident or the step cap; the argmax canvas is
 *              the result
 *   emit       its tokens up to the first stop id (the stop id excluded),
 *              the max_tokens budget, or a stop string in the text; a
 *              CANVAS event carries them
 *   commit     if generation continues: canvas b + 1 starts at once, and
 *              its first denoising step appends the whole argmax canvas b
 *              to the cache first (backend.h: a denoise item's append),
 *              in the same backend call
 *   done       finish reason stop / length / cancelled / error, with the
 *              request's statistics, in a DONE event
 *
 * One dg_engine_step() advances every request in flight by one pass (a
 * prompt chunk, or a denoising step: the first of canvas 0 with the
 * prompt's last part, the first of canvas b + 1 with the commit of canvas
 * b), whatever phase each is in, as one encode batch and one denoise
 * batch.  Every random draw is keyed by (seed, canvas, step,
 * position, ...), so a request's output does not depend on what else is in
 * the batch or in which order requests came.
 *
 * Events are delivered synchronously from dg_engine_step(); the pointers in
 * an event are valid only during the callback.  Memory per request is
 * bounded at submission: the backend slot (KV for prompt + canvases), O(CL)
 * canvas state (the pending commit's CL ids included), the prompt copy and
 * per-canvas statistics.
 */
#ifndef DG_ENGINE_H
#define DG_ENGINE_H

#include <stdint.h>

#include "lib/backend.h"
#include "lib/error.h"
#include "lib/gen-settings.h"
#include "lib/tokenizer.h"

enum dg_finish {
    DG_FINISH_NONE = 0,
    DG_FINISH_STOP,      /* a stop id or stop string */
    DG_FINISH_LENGTH,    /* max_tokens emitted */
    DG_FINISH_CANCELLED, /* dg_engine_cancel */
    DG_FINISH_ERROR,     /* the backend failed, or the model produced non-finite logits */
};

/* "stop", "length", "cancelled", "error" ("none" for DG_FINISH_NONE). */
const char *dg_finish_name(enum dg_finish f);

struct dg_canvas_stats {
    int index;
    int steps;               /* decoder passes */
    int converged;           /* 1: stable and confident; 0: stopped by the step cap */
    int tokens;              /* tokens this canvas emitted */
    double ms;               /* first denoising step to the canvas's result; that
                                first step also appends the prompt's last part
                                (canvas 0, see the top) or commits the canvas
                                before (canvas 1 on; backend.h: append), so
                                its time is counted here */
    float mean_entropy;      /* mean entropy of the last step (nats) */
};

struct dg_request_stats {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int canvases;
    int64_t decoder_steps;
    double ms_prefill;       /* submission to the end of the prompt's encoder passes
                                (to the first denoising step, which appends the
                                prompt's last part where it does) */
    double ms_first_canvas;  /* submission to the first CANVAS event (0: none yet) */
    double ms_total;         /* submission to DONE */
    double tokens_per_s;     /* completion tokens / seconds after prefill (0
                                without one) */
    double tokens_per_step;  /* completion tokens / decoder steps */
    int prefilled;           /* 1: the prompt's encoder passes ended (ms_prefill and
                                tokens_per_s are measured, even where the clock
                                read them as 0); 0: it ended before them */
    const struct dg_canvas_stats *canvas; /* [canvases] */
};

enum dg_event_kind { DG_EVENT_CANVAS = 1, DG_EVENT_DONE = 2 };

struct dg_gen_event {
    enum dg_event_kind kind;
    uint64_t id;
    void *user;
    /* CANVAS: what this canvas added */
    const struct dg_canvas_stats *canvas;
    const int32_t *ids;
    int n_ids;
    const char *text;        /* NULL without a tokenizer */
    size_t text_len;
    /* DONE */
    enum dg_finish finish;
    int32_t stop_id;         /* the stop id that ended generation, or -1 */
    const char *stop_string; /* the stop string that ended it, or NULL */
    const struct dg_request_stats *stats;
    int error_code;          /* DG_FINISH_ERROR: a dg_status */
    const char *error;       /* DG_FINISH_ERROR: the message */
};

typedef void (*dg_event_fn)(void *ctx, const struct dg_gen_event *ev);

struct dg_engine_config {
    int max_batch;           /* requests in flight (= backend slots used) */
    int prefill_chunk;       /* prompt tokens per encoder pass */
    int prompt_apart;        /* 1: every prompt token in encoder passes; 0: the
                                last part of at most min(canvas_length,
                                prefill_chunk) tokens in the first denoising
                                step's call (see the top) */
    int64_t max_context;     /* prompt + generated positions per request */
    struct dg_gen_limits limits;
};

/* max_batch 8, prefill_chunk 512, prompt_apart 0, max_context = the model's
 * max_position_embeddings, dg_gen_limits_default. */
void dg_engine_config_default(struct dg_engine_config *ec, const struct dg_model_config *cfg);

struct dg_engine;

/* b (and tok, if not NULL) must outlive the engine.  With a tokenizer,
 * CANVAS events carry text and stop strings work; without one, stop
 * strings are rejected at submission.  Errors: DG_E_INVAL, DG_E_NOMEM. */
int dg_engine_create(struct dg_backend *b, const struct dg_engine_config *ec,
                     const struct dg_tokenizer *tok, dg_event_fn fn, void *ctx,
                     struct dg_engine **out, struct dg_error *err);

/* Drop every request (no events) and free the engine. */
void dg_engine_destroy(struct dg_engine *e);

/* Whether a request of n_prompt prompt tokens under settings s fits
 * max_context positions: the prompt plus its canvases, max_tokens rounded
 * up to whole canvases of canvas_length (the positions a request's
 * backend slot holds).  0, or DG_E_RANGE with a message that says what to
 * lower.  dg_engine_submit checks it; a front end that answers before the
 * engine sees the request checks it first. */
int dg_engine_check_fit(int64_t max_context, int64_t n_prompt, const struct dg_gen_settings *s,
                        struct dg_error *err);

/* Queue a request.  s must have a seed (seed_set).  *id identifies it in
 * events.  Errors: DG_E_INVAL (settings, an empty prompt, ids outside the
 * vocabulary, stop strings without a tokenizer), DG_E_RANGE (prompt +
 * canvases past max_context), DG_E_BUSY (max_batch requests in flight),
 * DG_E_NOMEM.  Nothing is kept on error. */
int dg_engine_submit(struct dg_engine *e, const int32_t *prompt, int64_t n_prompt,
                     const struct dg_gen_settings *s, void *user, uint64_t *id,
                     struct dg_error *err);

/* Ask a request to stop; its DONE event (cancelled) comes from the next
 * dg_engine_step.  Returns 0, or -DG_E_INVAL for an id not in flight. */
int dg_engine_cancel(struct dg_engine *e, uint64_t id);

/* One pass for every request in flight.  Returns the number still in
 * flight afterwards.  Backend failures end the affected requests with
 * DG_FINISH_ERROR events; they are not errors of this call. */
int dg_engine_step(struct dg_engine *e);

/* Requests in flight. */
int dg_engine_active(const struct dg_engine *e);

#endif
