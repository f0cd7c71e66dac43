/* engine.c - the generation engine (see engine.h). */
#include "lib/engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/canvas-run.h"
#include "lib/sampler.h"
#include "lib/text-out.h"

enum phase { PH_FREE = 0, PH_PREFILL, PH_DENOISE };

struct request {
    enum phase phase;
    uint64_t id;
    void *user;
    int cancel;
    struct dg_gen_settings s;
    int32_t *prompt;
    int64_t n_prompt, prefilled;
    struct dg_canvas_run run;
    int32_t *sample, *argmax;   /* [CL] the current step's outputs */
    float *entropy;             /* [CL] */
    int32_t *commit;            /* [CL] the finished canvas the next denoise item appends */
    int commit_pending;         /* 1: commit is not in the slot's cache yet */
    /* (in PH_DENOISE with prefilled < n_prompt, the prompt's last part is
     * what the next denoise item appends: prompt_tail) */
    struct dg_canvas_stats *cstats;
    int max_canvases, canvases;
    int64_t emitted, steps;
    int has_text;
    struct dg_text_out text;
    double t_submit, t_prefill, t_first, t_canvas;
};

struct dg_engine {
    struct dg_backend *b;
    const struct dg_model_config *cfg;
    struct dg_engine_config ec;
    const struct dg_tokenizer *tok;
    dg_event_fn fn;
    void *ctx;
    uint64_t next_id;
    int active;
    struct request *req;        /* [max_batch]; index = backend slot */
    /* per-step batches */
    struct dg_encode_item *enc;
    int *enc_req;
    struct dg_denoise_item *den;
    int *den_req;
    int *cond;
    struct dg_buf textbuf;
};

const char *dg_finish_name(enum dg_finish f)
{
    switch (f) {
    case DG_FINISH_STOP: return "stop";
    case DG_FINISH_LENGTH: return "length";
    case DG_FINISH_CANCELLED: return "cancelled";
    case DG_FINISH_ERROR: return "error";
    default: return "none";
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void dg_engine_config_default(struct dg_engine_config *ec, const struct dg_model_config *cfg)
{
    memset(ec, 0, sizeof *ec);
    ec->max_batch = 8;
    ec->prefill_chunk = 512;
    ec->max_context = cfg->max_position_embeddings;
    dg_gen_limits_default(&ec->limits);
}

int dg_engine_create(struct dg_backend *b, const struct dg_engine_config *ec,
                     const struct dg_tokenizer *tok, dg_event_fn fn, void *ctx,
                     struct dg_engine **out, struct dg_error *err)
{
    struct dg_engine *e;
    const int n = ec->max_batch;

    *out = NULL;
    if (n < 1 || n > b->max_slots || ec->prefill_chunk < 1 || ec->max_context < 2 ||
        ec->max_context > b->cfg->max_position_embeddings || !fn)
        return dg_error_set(err, DG_E_INVAL,
                            "engine: max_batch %d (backend has %d slots), prefill_chunk %d, "
                            "max_context %lld (model: %lld)",
                            n, b->max_slots, ec->prefill_chunk, (long long)ec->max_context,
                            (long long)b->cfg->max_position_embeddings);
    e = calloc(1, sizeof *e);
    if (!e)
        return dg_error_set(err, DG_E_NOMEM, "engine: out of memory");
    e->b = b;
    e->cfg = b->cfg;
    e->ec = *ec;
    e->tok = tok;
    e->fn = fn;
    e->ctx = ctx;
    e->next_id = 1;
    e->req = calloc((size_t)n, sizeof *e->req);
    e->enc = calloc((size_t)n, sizeof *e->enc);
    e->enc_req = calloc((size_t)n, sizeof *e->enc_req);
    e->den = calloc((size_t)n, sizeof *e->den);
    e->den_req = calloc((size_t)n, sizeof *e->den_req);
    e->cond = calloc((size_t)n, sizeof *e->cond);
    if (!e->req || !e->enc || !e->enc_req || !e->den || !e->den_req || !e->cond) {
        dg_engine_destroy(e);
        return dg_error_set(err, DG_E_NOMEM, "engine: out of memory");
    }
    *out = e;
    return 0;
}

static void release(struct dg_engine *e, int slot)
{
    struct request *r = &e->req[slot];
    if (r->phase == PH_FREE)
        return;
    e->b->ops->slot_close(e->b, slot);
    free(r->prompt);
    dg_canvas_run_free(&r->run);
    free(r->sample);
    free(r->argmax);
    free(r->entropy);
    free(r->commit);
    free(r->cstats);
    if (r->has_text)
        dg_text_out_free(&r->text);
    memset(r, 0, sizeof *r);
    e->active--;
}

void dg_engine_destroy(struct dg_engine *e)
{
    if (!e)
        return;
    if (e->req)
        for (int i = 0; i < e->ec.max_batch; i++)
            release(e, i);
    free(e->req);
    free(e->enc);
    free(e->enc_req);
    free(e->den);
    free(e->den_req);
    free(e->cond);
    dg_buf_free(&e->textbuf);
    free(e);
}

int dg_engine_active(const struct dg_engine *e)
{
    return e->active;
}

/* The canvases a request of settings s may take, and the positions its
 * slot must hold with a prompt of n_prompt: what the check below and the
 * submit's slot both use. */
static int64_t fit_positions(int64_t n_prompt, const struct dg_gen_settings *s,
                             int64_t *canvases)
{
    *canvases = s->canvas_length > 0
                    ? (s->max_tokens + s->canvas_length - 1) / s->canvas_length
                    : 0;
    return n_prompt + *canvases * s->canvas_length;
}

int dg_engine_check_fit(int64_t max_context, int64_t n_prompt, const struct dg_gen_settings *s,
                        struct dg_error *err)
{
    int64_t canvases;
    const int64_t positions = fit_positions(n_prompt, s, &canvases);
    if (positions > max_context)
        return dg_error_set(err, DG_E_RANGE,
                            "prompt of %lld tokens + %lld canvases of %d = %lld positions; the "
                            "limit is %lld (lower max_tokens or shorten the prompt)",
                            (long long)n_prompt, (long long)canvases, s->canvas_length,
                            (long long)positions, (long long)max_context);
    return 0;
}

int dg_engine_submit(struct dg_engine *e, const int32_t *prompt, int64_t n_prompt,
                     const struct dg_gen_settings *s, void *user, uint64_t *id,
                     struct dg_error *err)
{
    const struct dg_model_config *c = e->cfg;
    struct dg_canvas_params cp;
    struct request *r;
    int64_t canvases, positions;
    int slot = -1, rc;

    if ((rc = dg_gen_settings_validate(s, c, &e->ec.limits, err)) < 0)
        return rc;
    if (!s->seed_set)
        return dg_error_set(err, DG_E_INVAL, "seed: not set (the caller picks one)");
    if (s->n_stop_strings && !e->tok)
        return dg_error_set(err, DG_E_INVAL, "stop: stop strings need a tokenizer");
    if (n_prompt < 1)
        return dg_error_set(err, DG_E_INVAL, "prompt: empty; need at least one token");
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
            return dg_error_set(err, DG_E_INVAL, "prompt: token %lld is id %d, outside [0, %lld)",
                                (long long)i, prompt[i], (long long)c->vocab_size);
    if ((rc = dg_engine_check_fit(e->ec.max_context, n_prompt, s, err)) < 0)
        return rc;
    positions = fit_positions(n_prompt, s, &canvases);
    for (int i = 0; i < e->ec.max_batch && slot < 0; i++)
        if (e->req[i].phase == PH_FREE)
            slot = i;
    if (slot < 0)
        return dg_error_set(err, DG_E_BUSY, "engine: all %d request slots are busy",
                            e->ec.max_batch);
    if ((rc = e->b->ops->slot_open(e->b, slot, positions, s->canvas_length, err)) < 0)
        return rc;
    r = &e->req[slot];
    memset(r, 0, sizeof *r);
    r->phase = PH_PREFILL;
    e->active++;
    r->s = *s;
    r->user = user;
    r->n_prompt = n_prompt;
    r->max_canvases = (int)canvases;
    memset(&cp, 0, sizeof cp);
    cp.canvas_length = s->canvas_length;
    cp.max_steps = s->max_denoising_steps;
    cp.entropy_bound = s->entropy_bound;
    cp.confidence_threshold = s->confidence_threshold;
    cp.stability_threshold = s->stability_threshold;
    cp.vocab_size = c->vocab_size;
    cp.seed = s->seed;
    r->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    r->sample = malloc(sizeof(int32_t) * (size_t)s->canvas_length);
    r->argmax = malloc(sizeof(int32_t) * (size_t)s->canvas_length);
    r->entropy = malloc(sizeof(float) * (size_t)s->canvas_length);
    r->commit = malloc(sizeof(int32_t) * (size_t)s->canvas_length);
    r->cstats = calloc((size_t)canvases, sizeof *r->cstats);
    if (!r->prompt || !r->sample || !r->argmax || !r->entropy || !r->commit || !r->cstats) {
        release(e, slot);
        return dg_error_set(err, DG_E_NOMEM, "engine: out of memory for a request");
    }
    if ((rc = dg_canvas_run_init(&r->run, &cp, err)) < 0) {
        release(e, slot);
        return rc;
    }
    if (e->tok) {
        /* the settings live in the request; text-out borrows them */
        if ((rc = dg_text_out_init(&r->text, e->tok, &r->s, err)) < 0) {
            release(e, slot);
            return rc;
        }
        r->has_text = 1;
    }
    memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->id = e->next_id++;
    r->t_submit = now_ms();
    *id = r->id;
    return 0;
}

int dg_engine_cancel(struct dg_engine *e, uint64_t id)
{
    for (int i = 0; i < e->ec.max_batch; i++)
        if (e->req[i].phase != PH_FREE && e->req[i].id == id) {
            e->req[i].cancel = 1;
            return 0;
        }
    return -DG_E_INVAL;
}

static void fill_stats(const struct request *r, struct dg_request_stats *st)
{
    const double t = now_ms();
    const double gen_ms = r->t_prefill > 0 ? t - r->t_prefill : 0;
    memset(st, 0, sizeof *st);
    st->prompt_tokens = r->n_prompt;
    st->completion_tokens = r->emitted;
    st->canvases = r->canvases;
    st->decoder_steps = r->steps;
    st->ms_prefill = r->t_prefill > 0 ? r->t_prefill - r->t_submit : 0;
    st->ms_first_canvas = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    st->ms_total = t - r->t_submit;
    st->tokens_per_s = gen_ms > 0 ? (double)r->emitted / (gen_ms / 1e3) : 0;
    st->tokens_per_step = r->steps > 0 ? (double)r->emitted / (double)r->steps : 0;
    st->prefilled = r->t_prefill > 0;
    st->canvas = r->cstats;
}

/* Send DONE and free the request. */
static void finish(struct dg_engine *e, int slot, enum dg_finish why, int32_t stop_id,
                   const char *stop_string, int code, const char *msg)
{
    struct request *r = &e->req[slot];
    struct dg_request_stats st;
    struct dg_gen_event ev;

    fill_stats(r, &st);
    memset(&ev, 0, sizeof ev);
    ev.kind = DG_EVENT_DONE;
    ev.id = r->id;
    ev.user = r->user;
    ev.finish = why;
    ev.stop_id = stop_id;
    ev.stop_string = stop_string;
    ev.stats = &st;
    ev.error_code = code;
    ev.error = msg;
    e->fn(e->ctx, &ev);
    release(e, slot);
}

static void fail(struct dg_engine *e, int slot, const struct dg_error *err)
{
    finish(e, slot, DG_FINISH_ERROR, -1, NULL, err->code, err->msg);
}

static void start_canvas(struct request *r)
{
    dg_canvas_run_start(&r->run, (uint32_t)r->canvases);
    r->t_canvas = 0;
}

/* The canvas is done: emit its tokens; end the request, or keep its
 * argmax canvas as the commit that the next canvas's first denoising step
 * appends (backend.h) and start that canvas. */
static void finish_canvas(struct dg_engine *e, int slot)
{
    struct request *r = &e->req[slot];
    const int CL = r->s.canvas_length;
    const int64_t budget = r->s.max_tokens - r->emitted;
    enum dg_finish why = DG_FINISH_NONE;
    int32_t stop_id = -1;
    const char *stop_string = NULL;
    struct dg_canvas_stats *cs = &r->cstats[r->canvases];
    struct dg_gen_event ev;
    struct dg_error err = {0};
    int cut = CL;

    for (int i = 0; i < CL; i++)
        if (dg_gen_settings_is_stop_id(&r->s, r->run.argmax[i])) {
            cut = i;
            stop_id = r->run.argmax[i];
            why = DG_FINISH_STOP;
            break;
        }
    if (cut >= budget) {
        cut = (int)budget;
        why = DG_FINISH_LENGTH;
        stop_id = -1;
    }
    e->textbuf.n = 0;
    if (r->has_text) {
        size_t used;
        int stopped, rc = dg_text_out_push(&r->text, r->run.argmax, (size_t)cut, &e->textbuf,
                                           &used, &stopped, &err);
        if (rc == 0 && stopped) {
            cut = (int)used;
            why = DG_FINISH_STOP;
            stop_id = -1;
            stop_string = r->s.stop_strings[r->text.matched];
        }
        if (rc == 0 && why != DG_FINISH_NONE)
            rc = dg_text_out_finish(&r->text, &e->textbuf, &err);
        if (rc < 0) {
            fail(e, slot, &err);
            return;
        }
    }
    cs->index = r->canvases;
    cs->steps = r->run.step;
    cs->converged = r->run.end == DG_CANVAS_CONVERGED;
    cs->tokens = cut;
    cs->ms = now_ms() - r->t_canvas;
    cs->mean_entropy = r->run.last_mean_entropy;
    r->canvases++;
    r->emitted += cut;
    if (r->t_first == 0)
        r->t_first = now_ms();
    memset(&ev, 0, sizeof ev);
    ev.kind = DG_EVENT_CANVAS;
    ev.id = r->id;
    ev.user = r->user;
    ev.canvas = cs;
    ev.ids = r->run.argmax;
    ev.n_ids = cut;
    ev.text = r->has_text ? (e->textbuf.s ? e->textbuf.s : "") : NULL;
    ev.text_len = e->textbuf.n;
    e->fn(e->ctx, &ev);
    if (why == DG_FINISH_NONE && r->emitted >= r->s.max_tokens)
        why = DG_FINISH_LENGTH;
    if (why != DG_FINISH_NONE) {
        finish(e, slot, why, stop_id, stop_string, 0, NULL);
        return;
    }
    /* before start_canvas: the start resets run.argmax */
    memcpy(r->commit, r->run.argmax, sizeof(int32_t) * (size_t)CL);
    r->commit_pending = 1;
    start_canvas(r);
}

/* Whether a batch call failed as backend.h says a refused batch does:
 * checked before anything ran (DG_E_INVAL, DG_E_RANGE), nothing changed.
 * Its items are then run one at a time, so that the refusal ends only the
 * request it is about and not the others batched with it. */
static int refused_unrun(const struct dg_error *err)
{
    return err->code == DG_E_INVAL || err->code == DG_E_RANGE;
}

/* A batch call on items first .. first + n - 1 of this step's list failed
 * with err (their requests' slots in req): a refusal of the whole batch
 * runs them again one at a time through one; anything else fails each. */
static void batch_failed(struct dg_engine *e, const struct dg_error *err, int first, int n,
                         const int *req, void (*one)(struct dg_engine *, int, int))
{
    for (int k = first; k < first + n; k++)
        if (n > 1 && refused_unrun(err))
            one(e, k, 1);
        else
            fail(e, req[k], err);
}

/* Whether the rest of r's prompt rides in its first denoising step (see
 * engine.h): at most one canvas and one chunk long. */
static int prompt_tail(const struct dg_engine *e, const struct request *r)
{
    const int64_t rest = r->n_prompt - r->prefilled;
    return !e->ec.prompt_apart && rest <= r->s.canvas_length && rest <= e->ec.prefill_chunk;
}

/* r's prompt is encoded, or its rest goes with the first denoising step:
 * canvas 0 starts. */
static void prompt_done(struct request *r)
{
    r->t_prefill = now_ms();
    r->phase = PH_DENOISE;
    start_canvas(r);
}

/* Encode items first .. first + n - 1 of this step's list (prompt chunks)
 * and move their requests on: the next chunk, or after the last the first
 * canvas. */
static void encode_items(struct dg_engine *e, int first, int n)
{
    struct dg_error err = {0};
    if (e->b->ops->encode(e->b, e->enc + first, n, &err) < 0) {
        batch_failed(e, &err, first, n, e->enc_req, encode_items);
        return;
    }
    for (int k = first; k < first + n; k++) {
        struct request *r = &e->req[e->enc_req[k]];
        r->prefilled += e->enc[k].n;
        if (r->prefilled == r->n_prompt)
            prompt_done(r);
    }
}

/* One denoising step for items first .. first + n - 1 of this step's list
 * (each first appending its request's pending commit or prompt tail, if it
 * carries one),
 * then the canvas loop's decision for each, and the self-conditioning of
 * those that go on (condition's indexes are into this call's items).  A
 * commit or a prompt tail is done only when the call succeeds: a refused
 * batch's items, run again one at a time, still carry theirs. */
static void denoise_items(struct dg_engine *e, int first, int n)
{
    struct dg_backend *b = e->b;
    struct dg_error err = {0};
    int n_cond = 0;

    if (b->ops->denoise(b, e->den + first, n, &err) < 0) {
        batch_failed(e, &err, first, n, e->den_req, denoise_items);
        return;
    }
    for (int k = first; k < first + n; k++) {
        const int slot = e->den_req[k];
        struct request *r = &e->req[slot];
        enum dg_canvas_end end;
        r->commit_pending = 0; /* (finish_canvas may set it again, for this canvas) */
        r->prefilled = r->n_prompt;
        r->steps++;
        if (e->den[k].nonfinite) {
            struct dg_error bad;
            dg_error_set(&bad, DG_E_INTERNAL,
                         "canvas %u step %u: the model produced non-finite logits at "
                         "%lld positions",
                         r->run.index, (unsigned)r->run.step, (long long)e->den[k].nonfinite);
            fail(e, slot, &bad);
            continue;
        }
        end = dg_canvas_run_step(&r->run, r->sample, r->argmax, r->entropy, NULL);
        if (end == DG_CANVAS_RUNNING)
            e->cond[n_cond++] = k - first;
        else
            finish_canvas(e, slot);
    }
    if (n_cond > 0 && b->ops->condition(b, e->cond, n_cond, &err) < 0)
        for (int i = 0; i < n_cond; i++)
            fail(e, e->den_req[first + e->cond[i]], &err);
}

int dg_engine_step(struct dg_engine *e)
{
    int n_enc = 0, n_den = 0;

    /* cancellations first: their DONE events, no more work */
    for (int i = 0; i < e->ec.max_batch; i++)
        if (e->req[i].phase != PH_FREE && e->req[i].cancel)
            finish(e, i, DG_FINISH_CANCELLED, -1, NULL, 0, NULL);

    /* gather this step's work */
    for (int i = 0; i < e->ec.max_batch; i++) {
        struct request *r = &e->req[i];
        if (r->phase == PH_PREFILL && prompt_tail(e, r))
            prompt_done(r); /* (and the rest is this step's append, below) */
        if (r->phase == PH_PREFILL) {
            int64_t n = r->n_prompt - r->prefilled;
            if (n > e->ec.prefill_chunk)
                n = e->ec.prefill_chunk;
            e->enc[n_enc] = (struct dg_encode_item){i, r->prompt + r->prefilled, n};
            e->enc_req[n_enc++] = i;
        } else if (r->phase == PH_DENOISE) {
            struct dg_denoise_item *it = &e->den[n_den];
            memset(it, 0, sizeof *it);
            it->slot = i;
            if (r->commit_pending) {
                it->append = r->commit;
                it->n_append = r->s.canvas_length;
            } else if (r->prefilled < r->n_prompt) {
                it->append = r->prompt + r->prefilled;
                it->n_append = r->n_prompt - r->prefilled;
            }
            it->canvas = r->run.canvas;
            it->cl = r->s.canvas_length;
            it->self_cond = !dg_canvas_run_first_step(&r->run);
            it->condition_ahead = !dg_canvas_run_last_step(&r->run);
            it->temperature = dg_temperature(r->s.t_min, r->s.t_max, r->s.max_denoising_steps,
                                             r->run.step);
            it->top_k = r->s.top_k;
            it->top_p = (float)r->s.top_p;
            it->seed = r->s.seed;
            it->canvas_index = r->run.index;
            it->step = (uint32_t)r->run.step;
            it->sample = r->sample;
            it->argmax = r->argmax;
            it->entropy = r->entropy;
            if (r->run.step == 0)
                r->t_canvas = now_ms();
            e->den_req[n_den++] = i;
        }
    }

    if (n_enc > 0)
        encode_items(e, 0, n_enc);

    if (n_den > 0)
        denoise_items(e, 0, n_den);
    return e->active;
}
