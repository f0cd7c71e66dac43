/*
 * Description: the generation engine on the CPU backend with the "small"
 * preset (random weights) and its synthetic tokenizer, and on a scripted
 * backend whose argmax canvases are written by hand.  Same seed -> same
 * output alone, batched with other requests in any order and phase, and
 * whatever the prefill chunk; max_tokens never exceeded, also when not a
 * multiple of the canvas; a stop id in mid-canvas cuts there (excluded);
 * a stop string cuts the text before it; statistics add up; cancellation,
 * full slots, bad requests, a failing backend and non-finite logits each
 * end in a clear error or finish reason without disturbing other requests.
 * A finished canvas is committed by the next canvas's first denoising
 * step (backend.h: append) and by nothing else: exactly its argmax canvas,
 * never the last canvas, no encode of it; a batch refused for it is run
 * one item at a time with the append still carried.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/cpu-backend.h"
#include "lib/engine.h"
#include "lib/model-synth.h"
#include "lib/model-weights.h"
#include "lib/tokenizer-synth.h"
#include "tests/harness.h"

static struct dg_checkpoint ck;
static struct dg_model model;
static struct dg_tokenizer *tok;
static int ready;

static int setup(void)
{
    struct dg_model_config c;
    struct dg_synth_options o;
    struct dg_synth_plan p;
    struct dg_error err = {0};
    const char *dir = test_path("small");
    char tpath[600], cpath[600];

    dg_model_config_preset("small", &c, NULL);
    dg_synth_options_default(&o);
    o.seed = 5;
    CHECK_OK(dg_synth_plan_build(&c, &o, &p, &err), &err);
    CHECK_OK(dg_synth_write(dir, &c, NULL, &p, &o, &err), &err);
    dg_synth_plan_free(&p);
    CHECK_OK(dg_tokenizer_synth_write(dir, c.vocab_size, &err), &err);
    CHECK_OK(dg_model_load(dir, &ck, &model, &err), &err);
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    CHECK_OK(dg_tokenizer_load(tpath, cpath, &tok, &err), &err);
    ready = 1;
    return 0;
}

static int cpu_backend(int slots, struct dg_backend **b, struct dg_error *err)
{
    struct dg_cpu_backend_options o;
    memset(&o, 0, sizeof o);
    o.n_ranks = 1;
    o.max_slots = slots;
    return dg_cpu_backend_create(&model, &o, b, err);
}

/* ---- collecting events ---------------------------------------------------- */

#define MAX_REQ 8
#define MAX_OUT 4096

struct outcome {
    uint64_t id;
    int32_t ids[MAX_OUT];
    int n_ids;
    char text[MAX_OUT * 8];
    size_t text_len;
    int canvas_events;
    int canvas_tokens;         /* sum over CANVAS events' canvas->tokens */
    int steps_in_events;
    int done;
    enum dg_finish finish;
    int32_t stop_id;
    char stop_string[DG_STOP_STRING_MAX + 1];
    struct dg_request_stats stats;
    int canvas_steps_sum;
    int error_code;
    char error[DG_ERROR_MSG_MAX];
    int events_after_done;
};

struct sink {
    struct outcome out[MAX_REQ];
    int n;
};

static struct outcome *find(struct sink *s, uint64_t id)
{
    for (int i = 0; i < s->n; i++)
        if (s->out[i].id == id)
            return &s->out[i];
    return NULL;
}

static void on_event(void *ctx, const struct dg_gen_event *ev)
{
    struct sink *s = ctx;
    struct outcome *o = find(s, ev->id);
    if (!o)
        return;
    if (o->done)
        o->events_after_done++;
    if (ev->kind == DG_EVENT_CANVAS) {
        for (int i = 0; i < ev->n_ids && o->n_ids < MAX_OUT; i++)
            o->ids[o->n_ids++] = ev->ids[i];
        if (ev->text && o->text_len + ev->text_len < sizeof o->text) {
            memcpy(o->text + o->text_len, ev->text, ev->text_len);
            o->text_len += ev->text_len;
        }
        o->canvas_events++;
        o->canvas_tokens += ev->canvas->tokens;
        o->steps_in_events += ev->canvas->steps;
        return;
    }
    o->done = 1;
    o->finish = ev->finish;
    o->stop_id = ev->stop_id;
    if (ev->stop_string)
        snprintf(o->stop_string, sizeof o->stop_string, "%s", ev->stop_string);
    o->stats = *ev->stats;
    for (int i = 0; i < ev->stats->canvases; i++)
        o->canvas_steps_sum += ev->stats->canvas[i].steps;
    o->stats.canvas = NULL;
    o->error_code = ev->error_code;
    if (ev->error)
        snprintf(o->error, sizeof o->error, "%s", ev->error);
}

/* ---- helpers ------------------------------------------------------------- */

static void settings(struct dg_gen_settings *s, uint64_t seed, int64_t max_tokens)
{
    dg_gen_settings_defaults(s, &model.cfg, &ck.generation);
    s->seed = seed;
    s->seed_set = 1;
    s->max_tokens = max_tokens;
    s->max_denoising_steps = 6;
}

static void prompt_of(int32_t *p, int n, int salt)
{
    for (int i = 0; i < n; i++)
        p[i] = 10 + (int32_t)((i * 37 + salt * 101) % 400);
}

/* An engine of max_batch requests on a fresh CPU backend, prompts in
 * chunks of prefill_chunk (prompt_apart: the engine's). */
static int make_engine_apart(int max_batch, int prefill_chunk, int prompt_apart,
                             const struct dg_tokenizer *t, struct sink *sink,
                             struct dg_backend **b, struct dg_engine **e, struct dg_error *err)
{
    struct dg_engine_config ec;
    int rc;
    memset(sink, 0, sizeof *sink);
    dg_engine_config_default(&ec, &model.cfg);
    ec.max_batch = max_batch;
    ec.prefill_chunk = prefill_chunk;
    ec.prompt_apart = prompt_apart;
    if ((rc = cpu_backend(max_batch, b, err)) < 0)
        return rc;
    if ((rc = dg_engine_create(*b, &ec, t, on_event, sink, e, err)) < 0)
        (*b)->ops->destroy(*b);
    return rc;
}

static int make_engine(int max_batch, int prefill_chunk, const struct dg_tokenizer *t,
                       struct sink *sink, struct dg_backend **b, struct dg_engine **e,
                       struct dg_error *err)
{
    return make_engine_apart(max_batch, prefill_chunk, 0, t, sink, b, e, err);
}

static void drop_engine(struct dg_backend *b, struct dg_engine *e)
{
    dg_engine_destroy(e);
    b->ops->destroy(b);
}

static int submit(struct dg_engine *e, struct sink *sink, const int32_t *prompt, int n,
                  const struct dg_gen_settings *s, struct outcome **o, struct dg_error *err)
{
    uint64_t id;
    int rc = dg_engine_submit(e, prompt, n, s, NULL, &id, err);
    if (rc == 0) {
        memset(&sink->out[sink->n], 0, sizeof sink->out[sink->n]);
        sink->out[sink->n].id = id;
        *o = &sink->out[sink->n++];
    }
    return rc;
}

static void run_all(struct dg_engine *e)
{
    for (int guard = 0; guard < 100000 && dg_engine_step(e) > 0; guard++)
        ;
}

/* Generate one request alone (prompt_apart: the engine's); its outcome
 * copied to *out. */
static int alone_apart(const int32_t *prompt, int n, const struct dg_gen_settings *s, int chunk,
                       int prompt_apart, struct outcome *out)
{
    struct sink sink;
    struct dg_backend *b;
    struct dg_engine *e;
    struct dg_error err = {0};
    struct outcome *o;
    CHECK_OK(make_engine_apart(1, chunk, prompt_apart, tok, &sink, &b, &e, &err), &err);
    CHECK_OK(submit(e, &sink, prompt, n, s, &o, &err), &err);
    run_all(e);
    CHECK(o->done && dg_engine_active(e) == 0);
    *out = *o;
    drop_engine(b, e);
    return 0;
}

static int alone(const int32_t *prompt, int n, const struct dg_gen_settings *s, int chunk,
                 struct outcome *out)
{
    return alone_apart(prompt, n, s, chunk, 0, out);
}

static int same_output(const struct outcome *a, const struct outcome *b)
{
    return a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n_ids) &&
           a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len) &&
           a->finish == b->finish && a->stats.decoder_steps == b->stats.decoder_steps;
}

/* ---- cases ---------------------------------------------------------------- */

static int consistent(const struct outcome *o, const struct dg_gen_settings *s)
{
    CHECK(o->done && o->events_after_done == 0);
    CHECK(o->n_ids <= s->max_tokens);
    CHECK(o->stats.completion_tokens == o->n_ids && o->canvas_tokens == o->n_ids);
    CHECK(o->canvas_events == o->stats.canvases);
    CHECK(o->stats.decoder_steps == o->canvas_steps_sum);
    CHECK(o->steps_in_events == o->canvas_steps_sum);
    CHECK(o->stats.canvases >= 1 &&
          o->stats.decoder_steps <= (int64_t)o->stats.canvases * s->max_denoising_steps);
    for (int i = 0; i < o->n_ids; i++)
        CHECK(!dg_gen_settings_is_stop_id(s, o->ids[i]));
    return 0;
}

static int determinism_batched(void)
{
    static struct outcome ref, other, chunked;
    struct dg_gen_settings sa, sb, sc;
    int32_t pa[40], pb[11], pc[70];
    struct dg_error err = {0};

    CHECK(ready);
    prompt_of(pa, 40, 1);
    prompt_of(pb, 11, 2);
    prompt_of(pc, 70, 3);
    settings(&sa, 1001, 70);
    settings(&sb, 2002, 40);
    sb.canvas_length = 16;
    sb.top_k = 20;
    sb.entropy_bound = 2.0;
    settings(&sc, 3003, 33);
    sc.stability_threshold = 0;
    sc.confidence_threshold = 1e9; /* converges after one step */
    CHECK(alone(pa, 40, &sa, 512, &ref) == 0);
    CHECK(consistent(&ref, &sa) == 0);
    printf("# alone: %d tokens, %d canvases, %lld steps, finish %s\n", ref.n_ids,
           ref.stats.canvases, (long long)ref.stats.decoder_steps, dg_finish_name(ref.finish));
    /* the prefill chunk does not change the result, nor the prompt's last
     * part in the first step's pass (engine.h) rather than apart: prompts
     * of 1 to 40 ids, chunks of 7 and 512, canvases of the model's length
     * (sa) and of 16 */
    CHECK(alone(pa, 40, &sa, 7, &chunked) == 0);
    CHECK(same_output(&ref, &chunked));
    CHECK(alone_apart(pa, 40, &sa, 512, 1, &chunked) == 0);
    CHECK(same_output(&ref, &chunked));
    {
        static const int lengths[] = {1, 15, 16, 17, 33};
        static struct outcome fused, apart;
        struct dg_gen_settings s16 = sa;
        s16.canvas_length = 16;
        s16.max_tokens = 20;
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
            for (int chunk = 7; chunk <= 512; chunk += 505) {
                CHECK(alone_apart(pa, lengths[l], &s16, chunk, 0, &fused) == 0);
                CHECK(alone_apart(pa, lengths[l], &s16, chunk, 1, &apart) == 0);
                CHECKF(same_output(&fused, &apart) && consistent(&fused, &s16) == 0,
                       "prompt of %d in chunks of %d: its last part in the first step "
                       "differs from apart", lengths[l], chunk);
            }
    }
    CHECK(alone(pb, 11, &sb, 512, &other) == 0);

    for (int order = 0; order < 3; order++) {
        struct sink sink;
        struct dg_backend *b;
        struct dg_engine *e;
        struct outcome *oa = NULL, *ob = NULL, *oc = NULL;
        CHECK_OK(make_engine(4, 16, tok, &sink, &b, &e, &err), &err);
        if (order == 0) {
            /* A first, the others join while it is in flight */
            CHECK_OK(submit(e, &sink, pa, 40, &sa, &oa, &err), &err);
            dg_engine_step(e);
            dg_engine_step(e);
            dg_engine_step(e);
            CHECK_OK(submit(e, &sink, pb, 11, &sb, &ob, &err), &err);
            dg_engine_step(e);
            CHECK_OK(submit(e, &sink, pc, 70, &sc, &oc, &err), &err);
        } else if (order == 1) {
            /* A last */
            CHECK_OK(submit(e, &sink, pc, 70, &sc, &oc, &err), &err);
            CHECK_OK(submit(e, &sink, pb, 11, &sb, &ob, &err), &err);
            for (int k = 0; k < 9; k++)
                dg_engine_step(e);
            CHECK_OK(submit(e, &sink, pa, 40, &sa, &oa, &err), &err);
        } else {
            /* all at once, A in the middle */
            CHECK_OK(submit(e, &sink, pb, 11, &sb, &ob, &err), &err);
            CHECK_OK(submit(e, &sink, pa, 40, &sa, &oa, &err), &err);
            CHECK_OK(submit(e, &sink, pc, 70, &sc, &oc, &err), &err);
        }
        run_all(e);
        CHECKF(same_output(oa, &ref), "order %d: A differs from A alone", order);
        CHECKF(same_output(ob, &other), "order %d: B differs from B alone", order);
        CHECK(consistent(oa, &sa) == 0 && consistent(ob, &sb) == 0 && consistent(oc, &sc) == 0);
        CHECK(oc->stats.decoder_steps == oc->stats.canvases); /* one step per canvas */
        drop_engine(b, e);
    }
    {
        /* a different seed gives a different output */
        static struct outcome diff;
        sa.seed = 1002;
        CHECK(alone(pa, 40, &sa, 512, &diff) == 0);
        CHECK(!same_output(&diff, &ref));
    }
    return 0;
}

static int max_tokens_budget(void)
{
    static const int64_t budgets[] = {1, 5, 31, 32, 33, 45, 63, 64, 70};
    int32_t p[9];
    prompt_of(p, 9, 4);
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        static struct outcome o;
        struct dg_gen_settings s;
        settings(&s, 77, budgets[i]);
        s.stability_threshold = 0;
        s.confidence_threshold = 1e9;
        s.n_stop_ids = 0; /* nothing stops early: the budget alone ends it */
        CHECK(alone(p, 9, &s, 512, &o) == 0);
        CHECK(consistent(&o, &s) == 0);
        CHECKF(o.n_ids == budgets[i] && o.finish == DG_FINISH_LENGTH,
               "max_tokens %lld: %d tokens, finish %s", (long long)budgets[i], o.n_ids,
               dg_finish_name(o.finish));
        CHECK(o.stats.canvases == (int)((budgets[i] + 31) / 32));
    }
    return 0;
}

static int stop_id_mid_canvas(void)
{
    static struct outcome full, cut;
    struct dg_gen_settings s;
    int32_t p[12];
    int at = -1;

    prompt_of(p, 12, 5);
    settings(&s, 4242, 64);
    s.n_stop_ids = 0;
    CHECK(alone(p, 12, &s, 512, &full) == 0);
    CHECK(full.n_ids == 64);
    /* an id in the second canvas that does not occur before it */
    for (int i = 40; i < 60 && at < 0; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= full.ids[j] == full.ids[i];
        if (!seen)
            at = i;
    }
    CHECK(at > 32);
    s.stop_ids[s.n_stop_ids++] = full.ids[at];
    CHECK(alone(p, 12, &s, 512, &cut) == 0);
    CHECK(consistent(&cut, &s) == 0);
    CHECKF(cut.finish == DG_FINISH_STOP && cut.stop_id == full.ids[at] && cut.n_ids == at,
           "finish %s, stop id %d, %d tokens; want stop at %d", dg_finish_name(cut.finish),
           cut.stop_id, cut.n_ids, at);
    CHECK(!memcmp(cut.ids, full.ids, sizeof(int32_t) * (size_t)at));
    CHECK(cut.stats.canvases == 2);
    /* a stop id right at the start of a canvas: that canvas adds nothing */
    s.stop_ids[s.n_stop_ids - 1] = full.ids[32];
    {
        int seen = 0;
        for (int j = 0; j < 32; j++)
            seen |= full.ids[j] == full.ids[32];
        if (!seen) {
            CHECK(alone(p, 12, &s, 512, &cut) == 0);
            CHECK(cut.finish == DG_FINISH_STOP && cut.n_ids == 32 && cut.stats.canvases == 2);
        }
    }
    return 0;
}

static int stop_string_cuts_text(void)
{
    static struct outcome full, cut;
    struct dg_gen_settings s;
    int32_t p[8];
    char stop[16] = {0};
    const char *at;

    prompt_of(p, 8, 6);
    settings(&s, 99, 64);
    s.n_stop_ids = 0;
    CHECK(alone(p, 8, &s, 512, &full) == 0);
    /* two printable ASCII bytes from the middle of the text */
    for (size_t i = full.text_len / 2; i + 1 < full.text_len && !stop[0]; i++)
        if (full.text[i] > 32 && full.text[i] < 127 && full.text[i + 1] > 32 &&
            full.text[i + 1] < 127) {
            stop[0] = full.text[i];
            stop[1] = full.text[i + 1];
        }
    CHECKF(stop[0], "no ASCII pair in the generated text");
    at = memmem(full.text, full.text_len, stop, 2);
    CHECK(at);
    strcpy(s.stop_strings[0], stop);
    s.n_stop_strings = 1;
    CHECK(alone(p, 8, &s, 512, &cut) == 0);
    CHECK(consistent(&cut, &s) == 0);
    CHECKF(cut.finish == DG_FINISH_STOP && !strcmp(cut.stop_string, stop) && cut.stop_id == -1,
           "finish %s", dg_finish_name(cut.finish));
    CHECKF(cut.text_len == (size_t)(at - full.text) && !memcmp(cut.text, full.text, cut.text_len),
           "text cut at %zu, want %zu", cut.text_len, (size_t)(at - full.text));
    CHECK(cut.n_ids <= full.n_ids && !memcmp(cut.ids, full.ids, sizeof(int32_t) * cut.n_ids));
    return 0;
}

static int cancel_and_busy(void)
{
    struct sink sink;
    struct dg_backend *b;
    struct dg_engine *e;
    struct dg_error err = {0};
    struct dg_gen_settings s;
    struct outcome *o1, *o2, *o3, *o4;
    int32_t p[10];
    uint64_t id;

    prompt_of(p, 10, 7);
    settings(&s, 5, 200);
    CHECK_OK(make_engine(2, 512, tok, &sink, &b, &e, &err), &err);
    CHECK_OK(submit(e, &sink, p, 10, &s, &o1, &err), &err);
    CHECK_OK(submit(e, &sink, p, 10, &s, &o2, &err), &err);
    CHECK_FAILS(dg_engine_submit(e, p, 10, &s, NULL, &id, &err), &err, DG_E_BUSY, "busy");
    for (int k = 0; k < 4; k++)
        dg_engine_step(e);
    CHECK(dg_engine_cancel(e, o1->id) == 0);
    CHECK(dg_engine_cancel(e, 999999) == -DG_E_INVAL);
    CHECK(dg_engine_step(e) == 1);
    CHECK(o1->done && o1->finish == DG_FINISH_CANCELLED);
    /* the freed slot takes a new request; the other one is unaffected */
    CHECK_OK(submit(e, &sink, p, 10, &s, &o3, &err), &err);
    run_all(e);
    CHECK(o2->done && o3->done && same_output(o2, o3));
    CHECK(o2->finish != DG_FINISH_CANCELLED && o2->finish != DG_FINISH_ERROR);
    CHECK(dg_engine_cancel(e, o2->id) == -DG_E_INVAL); /* finished: no longer in flight */
    /* prefilled: set for those whose prompt was encoded (the metrics'
     * tokens/s is NULL for the rest), not for one cancelled before its
     * first step */
    CHECK(o1->stats.prefilled == 1 && o2->stats.prefilled == 1 && o3->stats.prefilled == 1);
    CHECK(o2->stats.tokens_per_s > 0);
    CHECK_OK(submit(e, &sink, p, 10, &s, &o4, &err), &err);
    CHECK(dg_engine_cancel(e, o4->id) == 0);
    CHECK(dg_engine_step(e) == 0);
    CHECKF(o4->done && o4->finish == DG_FINISH_CANCELLED && o4->stats.prefilled == 0 &&
               o4->stats.tokens_per_s == 0 && o4->stats.ms_prefill == 0,
           "done %d, finish %s, prefilled %d", o4->done, dg_finish_name(o4->finish),
           o4->stats.prefilled);
    drop_engine(b, e);
    return 0;
}

static int bad_requests(void)
{
    struct sink sink;
    struct dg_backend *b;
    struct dg_engine *e;
    struct dg_error err = {0};
    struct dg_gen_settings s;
    int32_t p[4] = {10, 11, 12, 13};
    int32_t bad[2] = {10, 512};
    uint64_t id;

    settings(&s, 1, 10);
    CHECK_OK(make_engine(2, 512, NULL, &sink, &b, &e, &err), &err);
    CHECK_FAILS(dg_engine_submit(e, p, 0, &s, NULL, &id, &err), &err, DG_E_INVAL, "empty");
    CHECK_FAILS(dg_engine_submit(e, bad, 2, &s, NULL, &id, &err), &err, DG_E_INVAL,
                "id 512, outside");
    s.max_tokens = 200000;
    CHECK_FAILS(dg_engine_submit(e, p, 4, &s, NULL, &id, &err), &err, DG_E_RANGE,
                "lower max_tokens");
    s.max_tokens = 10;
    s.seed_set = 0;
    CHECK_FAILS(dg_engine_submit(e, p, 4, &s, NULL, &id, &err), &err, DG_E_INVAL, "seed");
    s.seed_set = 1;
    strcpy(s.stop_strings[0], "x");
    s.n_stop_strings = 1;
    CHECK_FAILS(dg_engine_submit(e, p, 4, &s, NULL, &id, &err), &err, DG_E_INVAL, "tokenizer");
    s.n_stop_strings = 0;
    s.t_min = 0.9;
    CHECK_FAILS(dg_engine_submit(e, p, 4, &s, NULL, &id, &err), &err, DG_E_INVAL, "t_min");
    CHECK(dg_engine_active(e) == 0);
    drop_engine(b, e);
    return 0;
}

/* ---- a backend that fails on demand ---------------------------------------- */

struct faulty {
    struct dg_backend base;
    struct dg_backend *inner;
    int fail_denoise_at;      /* fail the n-th denoise call (1-based); 0: never */
    int nonfinite_slot;       /* report non-finite logits for this slot; -1: none */
    int refuse_encode_slot;   /* refuse (DG_E_RANGE, before running) any batch */
    int refuse_denoise_slot;  /* that holds this slot; -1: none */
    int refuse_batched_append; /* 1: refuse a denoise batch of 2+ items that appends */
    int calls, refusals;
};

/* the refusal backend.h allows: the whole batch, before anything runs */
static int f_refuses(struct faulty *f, int slot, const int *slots, int n, struct dg_error *err)
{
    for (int i = 0; slot >= 0 && i < n; i++)
        if (slots[i] == slot) {
            f->refusals++;
            return dg_error_set(err, DG_E_RANGE, "injected refusal of slot %d", slot);
        }
    return 0;
}

static int f_slot_open(struct dg_backend *b, int slot, int64_t n, int cl, struct dg_error *err)
{
    struct faulty *f = (struct faulty *)b;
    return f->inner->ops->slot_open(f->inner, slot, n, cl, err);
}
static void f_slot_close(struct dg_backend *b, int slot)
{
    struct faulty *f = (struct faulty *)b;
    f->inner->ops->slot_close(f->inner, slot);
}
static int64_t f_slot_length(const struct dg_backend *b, int slot)
{
    const struct faulty *f = (const struct faulty *)b;
    return f->inner->ops->slot_length(f->inner, slot);
}
static int f_encode(struct dg_backend *b, const struct dg_encode_item *it, int n,
                    struct dg_error *err)
{
    struct faulty *f = (struct faulty *)b;
    int slots[8];
    for (int i = 0; i < n && i < 8; i++)
        slots[i] = it[i].slot;
    if (f_refuses(f, f->refuse_encode_slot, slots, n < 8 ? n : 8, err) < 0)
        return -DG_E_RANGE;
    return f->inner->ops->encode(f->inner, it, n, err);
}
static int f_denoise(struct dg_backend *b, struct dg_denoise_item *it, int n, struct dg_error *err)
{
    struct faulty *f = (struct faulty *)b;
    int slots[8], rc;
    for (int i = 0; i < n && i < 8; i++)
        slots[i] = it[i].slot;
    if (f_refuses(f, f->refuse_denoise_slot, slots, n < 8 ? n : 8, err) < 0)
        return -DG_E_RANGE;
    for (int i = 0; f->refuse_batched_append && n > 1 && i < n; i++)
        if (it[i].n_append > 0) {
            f->refusals++;
            return dg_error_set(err, DG_E_RANGE, "injected refusal of a batched append");
        }
    if (++f->calls == f->fail_denoise_at)
        return dg_error_set(err, DG_E_CUDA, "injected device failure");
    rc = f->inner->ops->denoise(f->inner, it, n, err);
    for (int i = 0; rc == 0 && i < n; i++)
        if (it[i].slot == f->nonfinite_slot)
            it[i].nonfinite = 3;
    return rc;
}
static int f_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct faulty *f = (struct faulty *)b;
    return f->inner->ops->condition(f->inner, which, n, err);
}
static void f_destroy(struct dg_backend *b)
{
    (void)b;
}
static const struct dg_backend_ops faulty_ops = {f_slot_open, f_slot_close, f_slot_length,
                                                 f_encode, f_denoise, f_condition, f_destroy, NULL};

/* f around a fresh CPU backend of 2 slots (*inner), failing nowhere yet,
 * and an engine of max_batch 2 on it writing to sink (prompt_apart: the
 * engine's). */
static int faulty_engine(struct faulty *f, struct dg_backend **inner, struct sink *sink,
                         struct dg_engine **e, int prompt_apart)
{
    struct dg_engine_config ec;
    struct dg_error err = {0};
    memset(sink, 0, sizeof *sink);
    CHECK_OK(cpu_backend(2, inner, &err), &err);
    f->base = **inner;
    f->base.ops = &faulty_ops;
    f->inner = *inner;
    f->calls = f->refusals = 0;
    f->fail_denoise_at = 0;
    f->nonfinite_slot = -1;
    f->refuse_encode_slot = f->refuse_denoise_slot = -1;
    f->refuse_batched_append = 0;
    dg_engine_config_default(&ec, &model.cfg);
    ec.max_batch = 2;
    ec.prompt_apart = prompt_apart;
    CHECK_OK(dg_engine_create(&f->base, &ec, tok, on_event, sink, e, &err), &err);
    return 0;
}

static int backend_failures(void)
{
    struct sink sink;
    struct dg_backend *inner;
    struct dg_engine *e;
    struct dg_error err = {0};
    struct dg_gen_settings s;
    struct faulty f;
    struct outcome *o1, *o2;
    int32_t p[6];

    prompt_of(p, 6, 8);
    settings(&s, 3, 40);
    CHECK(faulty_engine(&f, &inner, &sink, &e, 0) == 0);
    f.fail_denoise_at = 3;
    CHECK_OK(submit(e, &sink, p, 6, &s, &o1, &err), &err);
    CHECK_OK(submit(e, &sink, p, 6, &s, &o2, &err), &err);
    run_all(e);
    /* both were in the failing batch */
    CHECK(o1->done && o1->finish == DG_FINISH_ERROR && o1->error_code == DG_E_CUDA &&
          strstr(o1->error, "injected"));
    CHECK(o2->done && o2->finish == DG_FINISH_ERROR);
    CHECK(inner->ops->slot_length(inner, 0) == -1 && inner->ops->slot_length(inner, 1) == -1);
    /* the engine goes on: a new request completes */
    f.fail_denoise_at = 0;
    sink.n = 0;
    CHECK_OK(submit(e, &sink, p, 6, &s, &o1, &err), &err);
    run_all(e);
    CHECK(o1->done && consistent(o1, &s) == 0);
    /* non-finite logits end only the affected request */
    f.nonfinite_slot = 1;
    sink.n = 0;
    CHECK_OK(submit(e, &sink, p, 6, &s, &o1, &err), &err);
    CHECK_OK(submit(e, &sink, p, 6, &s, &o2, &err), &err);
    run_all(e);
    CHECK(o1->done && o1->finish != DG_FINISH_ERROR);
    CHECK(o2->done && o2->finish == DG_FINISH_ERROR && strstr(o2->error, "non-finite"));
    dg_engine_destroy(e);
    inner->ops->destroy(inner);
    return 0;
}

/* A backend that refuses a whole batch for one of its items (backend.h:
 * checked before anything ran) ends only that item's request: the other
 * request of the batch, run alone by the engine, gives what it gives on an
 * engine of its own.  Once for a refused denoise (whose first batch also
 * appends both prompts), once for a refused encode (the prompt's
 * prefill, in a pass of its own). */
static int backend_refuses_one(void)
{
    static struct outcome ref;
    struct dg_gen_settings s;
    int32_t p[6], q[6];

    prompt_of(p, 6, 8);
    prompt_of(q, 6, 9);
    settings(&s, 3, 40);
    CHECK(alone(q, 6, &s, 64, &ref) == 0 && ref.done && ref.finish != DG_FINISH_ERROR);
    for (int which = 0; which < 2; which++) {
        struct sink sink;
        struct dg_backend *inner;
        struct dg_engine *e;
        struct dg_error err = {0};
        struct faulty f;
        struct outcome *o1, *o2;

        /* (a refused encode needs an encoder pass: prompts apart there;
         * the refused denoise batch carries both prompts' appends) */
        CHECK(faulty_engine(&f, &inner, &sink, &e, which == 0) == 0);
        /* the first request takes slot 0, the second slot 1 */
        f.refuse_encode_slot = which == 0 ? 0 : -1;
        f.refuse_denoise_slot = which == 1 ? 0 : -1;
        CHECK_OK(submit(e, &sink, p, 6, &s, &o1, &err), &err);
        CHECK_OK(submit(e, &sink, q, 6, &s, &o2, &err), &err);
        run_all(e);
        CHECK(f.refusals >= 2); /* the batch of two, then the item alone */
        CHECK(o1->done && o1->finish == DG_FINISH_ERROR && o1->error_code == DG_E_RANGE &&
              strstr(o1->error, "injected refusal of slot 0"));
        CHECK(o2->done && o2->finish != DG_FINISH_ERROR);
        CHECK(same_output(o2, &ref) && consistent(o2, &s) == 0);
        CHECK(inner->ops->slot_length(inner, 0) == -1 && inner->ops->slot_length(inner, 1) == -1);
        dg_engine_destroy(e);
        inner->ops->destroy(inner);
    }
    return 0;
}

/* Every batch of two that commits a canvas is refused: the engine runs its
 * items one at a time, each still appending its commit, and both requests
 * give exactly what they give alone (a commit dropped or appended twice
 * would change the cache and the tokens after it). */
static int refused_append_retried(void)
{
    static struct outcome ref_p, ref_q;
    struct dg_gen_settings s;
    struct sink sink;
    struct dg_backend *inner;
    struct dg_engine *e;
    struct dg_error err = {0};
    struct faulty f;
    struct outcome *o1, *o2;
    int32_t p[6], q[6];

    prompt_of(p, 6, 10);
    prompt_of(q, 6, 11);
    settings(&s, 31, 70); /* three canvases of 32: two commits each */
    s.n_stop_ids = 0;
    CHECK(alone(p, 6, &s, 64, &ref_p) == 0 && ref_p.stats.canvases == 3);
    CHECK(alone(q, 6, &s, 64, &ref_q) == 0 && ref_q.stats.canvases == 3);
    CHECK(faulty_engine(&f, &inner, &sink, &e, 0) == 0);
    f.refuse_batched_append = 1;
    CHECK_OK(submit(e, &sink, p, 6, &s, &o1, &err), &err);
    CHECK_OK(submit(e, &sink, q, 6, &s, &o2, &err), &err);
    run_all(e);
    CHECKF(f.refusals >= 1, "no batch of two appended (%d refusals)", f.refusals);
    CHECK(o1->done && o1->finish == DG_FINISH_LENGTH && o2->done && o2->finish == DG_FINISH_LENGTH);
    CHECK(same_output(o1, &ref_p) && same_output(o2, &ref_q));
    dg_engine_destroy(e);
    inner->ops->destroy(inner);
    return 0;
}

/* ---- a scripted backend: hand-built argmax canvases, no model ------------- */

#define SCRIPT_CL 8

#define SCRIPT_MAX_PROMPT 32

struct scripted {
    struct dg_backend base;
    struct dg_model_config cfg;
    int64_t length[4];
    int open[4];
    /* the requests' prompt and the engine's settings for it */
    int32_t prompt[SCRIPT_MAX_PROMPT];
    int n_prompt, chunk, prompt_apart;
    int encodes, commits_of_full_canvas;
    int bad_encodes;             /* encode items not the prompt's next ids */
    int32_t stop_at_canvas, stop_at_pos, stop_id; /* where the script puts a stop id */
    int refuse_batched_append;   /* 1: refuse a denoise batch of 2+ items that appends */
    /* what the denoise items carried */
    int canvas_starts;           /* items of step 0 of canvas 1, 2, ... */
    int appends;                 /* items with an append */
    int tails;                   /* ... of step 0 of canvas 0: the prompt's last part */
    int bad_appends;             /* ... not exactly the previous canvas at a canvas's start,
                                    nor the prompt's rest at the first canvas's */
    int bad_lengths;             /* items whose cache (after the append) is not the prompt
                                    and every canvas before theirs */
    int refusals, retried_appends; /* batches refused; appends in a batch of one after */
    int engine_steps;
    /* condition_ahead (backend.h): the requests' step cap; the last
     * denoise batch's marks; items marked, conditions asked, marks not
     * "before the step cap", conditions of unmarked items */
    int max_steps, hint[2];
    int hints, conditions, bad_hints, unhinted;
};

/* the argmax of position p of canvas c: 100 + 10 c + p, or the stop id */
static int32_t script_token(const struct scripted *sb, uint32_t c, int p)
{
    if ((int32_t)c == sb->stop_at_canvas && p == sb->stop_at_pos)
        return sb->stop_id;
    return 100 + 10 * (int32_t)c + p;
}

static int s_slot_open(struct dg_backend *b, int slot, int64_t n, int cl, struct dg_error *err)
{
    struct scripted *sb = (struct scripted *)b;
    (void)n;
    (void)cl;
    (void)err;
    sb->open[slot] = 1;
    sb->length[slot] = 0;
    return 0;
}
static void s_slot_close(struct dg_backend *b, int slot)
{
    ((struct scripted *)b)->open[slot] = 0;
}
static int64_t s_slot_length(const struct dg_backend *b, int slot)
{
    const struct scripted *sb = (const struct scripted *)b;
    return sb->open[slot] ? sb->length[slot] : -1;
}
/* The next n ids of the prompt in a slot whose cache holds `from` of them. */
static int script_prompt_next(const struct scripted *sb, int64_t from, const int32_t *ids,
                              int64_t n)
{
    if (!ids || n < 1 || from + n > sb->n_prompt)
        return 0;
    for (int64_t j = 0; j < n; j++)
        if (ids[j] != sb->prompt[from + j])
            return 0;
    return 1;
}

static int s_encode(struct dg_backend *b, const struct dg_encode_item *it, int n,
                    struct dg_error *err)
{
    struct scripted *sb = (struct scripted *)b;
    (void)err;
    for (int i = 0; i < n; i++) {
        if (it[i].n == SCRIPT_CL && it[i].ids[1] >= 100)
            sb->commits_of_full_canvas++;
        if (it[i].n > sb->chunk || !script_prompt_next(sb, sb->length[it[i].slot], it[i].ids,
                                                        it[i].n))
            sb->bad_encodes++;
        sb->length[it[i].slot] += it[i].n;
        sb->encodes++;
    }
    return 0;
}
/* An append is right when it is the whole argmax canvas of the canvas
 * before, carried by the first step of the next one; or, at the first
 * step of the first canvas, the prompt's rest: at most a canvas and a
 * chunk, and never where the prompt is to be encoded apart. */
static int script_append_ok(const struct scripted *sb, const struct dg_denoise_item *it,
                            int64_t length)
{
    if (it->step == 0 && it->canvas_index == 0)
        return !sb->prompt_apart && it->n_append <= SCRIPT_CL && it->n_append <= sb->chunk &&
               length + it->n_append == sb->n_prompt &&
               script_prompt_next(sb, length, it->append, it->n_append);
    if (it->step != 0 || it->n_append != SCRIPT_CL || !it->append)
        return 0;
    for (int p = 0; p < SCRIPT_CL; p++)
        if (it->append[p] != script_token(sb, it->canvas_index - 1, p))
            return 0;
    return 1;
}

static int s_denoise(struct dg_backend *b, struct dg_denoise_item *it, int n, struct dg_error *err)
{
    struct scripted *sb = (struct scripted *)b;
    for (int i = 0; sb->refuse_batched_append && n > 1 && i < n; i++)
        if (it[i].n_append > 0) {
            sb->refusals++;
            return dg_error_set(err, DG_E_RANGE, "injected refusal of a batched append");
        }
    for (int i = 0; i < n; i++) {
        const int64_t want = sb->n_prompt + (int64_t)it[i].canvas_index * SCRIPT_CL;
        sb->canvas_starts += it[i].step == 0 && it[i].canvas_index > 0;
        if (it[i].append || it[i].n_append) {
            sb->appends++;
            sb->tails += it[i].step == 0 && it[i].canvas_index == 0;
            sb->retried_appends += n == 1 && sb->refusals > 0;
            if (script_append_ok(sb, &it[i], sb->length[it[i].slot]))
                sb->length[it[i].slot] += it[i].n_append;
            else
                sb->bad_appends++;
        }
        sb->bad_lengths += sb->length[it[i].slot] != want;
        if (i < 2)
            sb->hint[i] = it[i].condition_ahead;
        sb->hints += it[i].condition_ahead;
        sb->bad_hints += it[i].condition_ahead != ((int)it[i].step + 1 < sb->max_steps);
        for (int p = 0; p < it[i].cl; p++) {
            it[i].argmax[p] = it[i].sample[p] = script_token(sb, it[i].canvas_index, p);
            it[i].entropy[p] = 0.0f; /* certain */
        }
        it[i].nonfinite = 0;
    }
    return 0;
}
static int s_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct scripted *sb = (struct scripted *)b;
    (void)err;
    for (int i = 0; i < n; i++) {
        sb->conditions++;
        sb->unhinted += which[i] < 0 || which[i] >= 2 || !sb->hint[which[i]];
    }
    return 0;
}
static void s_destroy(struct dg_backend *b)
{
    (void)b;
}
static const struct dg_backend_ops scripted_ops = {s_slot_open, s_slot_close, s_slot_length,
                                                   s_encode, s_denoise, s_condition, s_destroy, NULL};

/* The encoder items a request of sb's prompt takes by engine.h's rule:
 * chunks of sb->chunk while the rest is more than a canvas or a chunk
 * (with prompt_apart, until none is left); *tail: what is left for the
 * first denoising step. */
static int script_prompt_chunks(const struct scripted *sb, int *tail)
{
    int rest = sb->n_prompt, items = 0;
    while (rest > 0 && (sb->prompt_apart || rest > SCRIPT_CL || rest > sb->chunk)) {
        rest -= rest < sb->chunk ? rest : sb->chunk;
        items++;
    }
    *tail = rest;
    return items;
}

/* Run n_req (1 or 2) identical requests of sb's prompt on the scripted
 * backend, each outcome into out[]; sb's counters count this run. */
static int scripted_run_n(struct scripted *sb, int64_t max_tokens, int stability, int n_req,
                          struct outcome *out)
{
    struct sink sink;
    struct dg_engine *e;
    struct dg_engine_config ec;
    struct dg_error err = {0};
    struct dg_gen_settings s;
    struct outcome *o[2];
    int tail, chunks = script_prompt_chunks(sb, &tail);

    memset(&sink, 0, sizeof sink);
    sb->encodes = sb->commits_of_full_canvas = sb->bad_encodes = 0;
    sb->canvas_starts = sb->appends = sb->tails = sb->bad_appends = sb->bad_lengths = 0;
    sb->refusals = sb->retried_appends = sb->engine_steps = 0;
    sb->hints = sb->conditions = sb->bad_hints = sb->unhinted = 0;
    dg_engine_config_default(&ec, &sb->cfg);
    ec.max_batch = n_req;
    ec.prefill_chunk = sb->chunk;
    ec.prompt_apart = sb->prompt_apart;
    CHECK_OK(dg_engine_create(&sb->base, &ec, NULL, on_event, &sink, &e, &err), &err);
    dg_gen_settings_defaults(&s, &sb->cfg, &ck.generation);
    s.canvas_length = SCRIPT_CL;
    s.max_tokens = max_tokens;
    s.stability_threshold = stability;
    s.seed = 1;
    s.seed_set = 1;
    s.n_stop_ids = 1;
    s.stop_ids[0] = 1;
    sb->max_steps = s.max_denoising_steps;
    for (int k = 0; k < n_req; k++)
        CHECK_OK(submit(e, &sink, sb->prompt, sb->n_prompt, &s, &o[k], &err), &err);
    while (sb->engine_steps < 10000 && dg_engine_step(e) > 0)
        sb->engine_steps++;
    sb->engine_steps++;
    CHECK(dg_engine_active(e) == 0 && !sb->open[0] && !sb->open[1]);
    dg_engine_destroy(e);
    for (int k = 0; k < n_req; k++) {
        out[k] = *o[k];
        CHECK(consistent(&out[k], &s) == 0);
        CHECK(out[k].stats.prompt_tokens == sb->n_prompt);
    }
    /* the commits: carried by every canvas's first step but the first's,
     * each exactly the canvas before, by nothing else; never encoded; the
     * prompt: encoded in order in chunks, its rest (if any) carried by the
     * first canvas's first step */
    CHECKF(sb->bad_appends == 0 && sb->bad_lengths == 0 && sb->bad_encodes == 0,
           "%d appends neither the canvas before at a canvas's start nor the prompt's rest, "
           "%d caches not the prompt and the canvases before, %d encode items not the "
           "prompt's next chunk", sb->bad_appends, sb->bad_lengths, sb->bad_encodes);
    CHECKF(sb->tails == (tail > 0 ? n_req : 0), "%d prompt tails appended, want %d", sb->tails,
           tail > 0 ? n_req : 0);
    CHECKF(sb->appends == sb->canvas_starts + sb->tails,
           "%d appends, %d canvases started after the first, %d prompt tails", sb->appends,
           sb->canvas_starts, sb->tails);
    CHECKF(sb->encodes == n_req * chunks && sb->commits_of_full_canvas == 0,
           "%d encode items (want %d chunks a prompt), %d of them a canvas", sb->encodes, chunks,
           sb->commits_of_full_canvas);
    /* condition_ahead on every step before the cap and no other; no
     * condition of an item not so marked */
    CHECKF(sb->bad_hints == 0 && sb->unhinted == 0,
           "%d items marked condition_ahead at the step cap or not marked before it, %d "
           "conditions of unmarked items", sb->bad_hints, sb->unhinted);
    return 0;
}

static int scripted_run(struct scripted *sb, int64_t max_tokens, int stability,
                        struct outcome *out)
{
    return scripted_run_n(sb, max_tokens, stability, 1, out);
}

/* sb's requests' prompt: n ids 2, 3, ...; chunk and prompt_apart the
 * engine's */
static void script_prompt(struct scripted *sb, int n, int chunk, int apart)
{
    for (int i = 0; i < n; i++)
        sb->prompt[i] = 2 + i;
    sb->n_prompt = n;
    sb->chunk = chunk;
    sb->prompt_apart = apart;
}

/* A scripted backend of the small shapes, 4 slots, no stop id. */
static void scripted_init(struct scripted *sb)
{
    memset(sb, 0, sizeof *sb);
    dg_model_config_preset("small", &sb->cfg, NULL);
    sb->base.ops = &scripted_ops;
    sb->base.name = "scripted";
    sb->base.cfg = &sb->cfg;
    sb->base.max_slots = 4;
    sb->stop_at_canvas = -1;
    script_prompt(sb, 3, 512, 0);
}

static int scripted_canvases(void)
{
    static struct outcome o;
    struct scripted sb;

    scripted_init(&sb);

    for (int apart = 0; apart < 2; apart++) {
        /* the prompt of 3 in the first step's pass, or in a pass of its own */
        script_prompt(&sb, 3, 512, apart);
        /* zero entropy: confident; s = 1 needs the second identical step */
        CHECK(scripted_run(&sb, 13, 1, &o) == 0);
        CHECK(o.finish == DG_FINISH_LENGTH && o.n_ids == 13 && o.stats.canvases == 2);
        CHECK(o.stats.decoder_steps == 4);
        for (int i = 0; i < 13; i++)
            CHECK(o.ids[i] == script_token(&sb, (uint32_t)(i / SCRIPT_CL), i % SCRIPT_CL));
        /* the first canvas appended by the second's first step, the last
         * never; no pass of its own: 2 + 2 steps, and the prefill's pass
         * where the prompt is apart */
        CHECK(sb.canvas_starts == 1 && sb.appends == 1 + !apart && sb.tails == !apart);
        CHECK(sb.engine_steps == 4 + apart);
        /* s = 0: one step per canvas */
        CHECK(scripted_run(&sb, 16, 0, &o) == 0);
        CHECK(o.n_ids == 16 && o.stats.decoder_steps == 2 && o.finish == DG_FINISH_LENGTH);
        CHECK(sb.canvas_starts == 1 && sb.engine_steps == 2 + apart);
        /* five canvases: four commits */
        CHECK(scripted_run(&sb, 40, 1, &o) == 0);
        CHECK(o.n_ids == 40 && o.stats.canvases == 5 && sb.canvas_starts == 4);
        /* never stable: every canvas to its step cap, a condition after
         * each of its steps but the last, each one marked ahead */
        CHECK(scripted_run(&sb, 13, 65535, &o) == 0);
        CHECK(o.stats.canvases == 2 && sb.max_steps > 1 &&
              o.stats.decoder_steps == 2 * sb.max_steps);
        CHECKF(sb.hints == sb.conditions && sb.conditions == 2 * (sb.max_steps - 1),
               "%d items marked condition_ahead, %d conditions, want %d", sb.hints,
               sb.conditions, 2 * (sb.max_steps - 1));
        /* converging at a canvas's second step: marked, not conditioned */
        CHECK(scripted_run(&sb, 13, 1, &o) == 0);
        CHECK(sb.hints == 4 && sb.conditions == 2);
    }
    script_prompt(&sb, 3, 512, 0);

    /* a stop id at position 5 of the second canvas: 8 + 5 tokens, stop */
    sb.stop_at_canvas = 1;
    sb.stop_at_pos = 5;
    sb.stop_id = 1;
    CHECK(scripted_run(&sb, 100, 0, &o) == 0);
    CHECK(o.finish == DG_FINISH_STOP && o.stop_id == 1 && o.n_ids == 13);
    CHECK(sb.canvas_starts == 1);
    /* the same stop id beyond the budget: the budget ends it */
    CHECK(scripted_run(&sb, 11, 0, &o) == 0);
    CHECK(o.finish == DG_FINISH_LENGTH && o.n_ids == 11 && o.stop_id == -1);
    /* exactly at the budget's edge: the stop id is not emitted either way */
    CHECK(scripted_run(&sb, 13, 0, &o) == 0);
    CHECK(o.n_ids == 13 && o.finish == DG_FINISH_LENGTH);
    CHECK(scripted_run(&sb, 14, 0, &o) == 0);
    CHECK(o.n_ids == 13 && o.finish == DG_FINISH_STOP);
    /* a stop id first in the first canvas: nothing emitted */
    sb.stop_at_canvas = 0;
    sb.stop_at_pos = 0;
    CHECK(scripted_run(&sb, 100, 0, &o) == 0);
    CHECK(o.finish == DG_FINISH_STOP && o.n_ids == 0 && o.stats.canvases == 1 &&
          o.canvas_events == 1);
    CHECK(sb.canvas_starts == 0 && sb.appends == 1 && sb.encodes == 0);
    return 0;
}

/* Prompts of 1 to 30 ids in chunks of 1, 3, 7 and 512, each with its last
 * part in the first step's pass and apart: the script checks every encode
 * item and append (scripted_run_n), here the passes they take; the
 * outputs are the same either way. */
static int scripted_prompt_parts(void)
{
    static struct outcome o, ref;
    static const int lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 30};
    static const int chunks[] = {1, 3, 7, 512};
    struct scripted sb;
    int tail, n_enc;

    scripted_init(&sb);
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            script_prompt(&sb, lengths[l], chunks[c], 1);
            CHECK(scripted_run(&sb, 12, 0, &ref) == 0);
            n_enc = script_prompt_chunks(&sb, &tail);
            CHECKF(tail == 0 && sb.engine_steps == n_enc + 2,
                   "prompt %d apart in chunks of %d: %d engine steps, %d chunks", lengths[l],
                   chunks[c], sb.engine_steps, n_enc);
            script_prompt(&sb, lengths[l], chunks[c], 0);
            CHECK(scripted_run(&sb, 12, 0, &o) == 0);
            n_enc = script_prompt_chunks(&sb, &tail);
            CHECKF(sb.engine_steps == n_enc + 2 && (tail > 0) == (sb.tails == 1),
                   "prompt %d in chunks of %d: %d engine steps, %d chunks and a rest of %d",
                   lengths[l], chunks[c], sb.engine_steps, n_enc, tail);
            CHECK(same_output(&o, &ref));
        }
    /* a prompt of one canvas, within a chunk: no encoder pass; one id
     * more: encoded whole */
    script_prompt(&sb, SCRIPT_CL, 512, 0);
    CHECK(scripted_run(&sb, 8, 0, &o) == 0 && sb.encodes == 0 && sb.tails == 1);
    script_prompt(&sb, SCRIPT_CL + 1, 512, 0);
    CHECK(scripted_run(&sb, 8, 0, &o) == 0 && sb.encodes == 1 && sb.tails == 0);
    /* 17 in chunks of 3: five chunks (the rest stays above 3 until 2 are
     * left), then those 2 in the first step */
    script_prompt(&sb, 17, 3, 0);
    CHECK(scripted_run(&sb, 8, 0, &o) == 0 && sb.encodes == 5 && sb.tails == 1);
    return 0;
}

/* Two requests in step; every denoise batch that appends is refused, so
 * the engine runs its items one at a time: each retry still carries its
 * prompt tail (the first step) or commit (checked per item by the
 * script), and both finish as one alone. */
static int scripted_refused_append(void)
{
    static struct outcome one, two[2];
    struct scripted sb;

    scripted_init(&sb);
    CHECK(scripted_run(&sb, 24, 1, &one) == 0);
    CHECK(one.stats.canvases == 3 && sb.canvas_starts == 2 && sb.appends == 3);
    sb.refuse_batched_append = 1;
    CHECK(scripted_run_n(&sb, 24, 1, 2, two) == 0);
    CHECKF(sb.refusals == 3 && sb.retried_appends == 6,
           "%d refusals, %d appends retried alone (want 3, 6)", sb.refusals, sb.retried_appends);
    for (int k = 0; k < 2; k++)
        CHECK(same_output(&two[k], &one) && two[k].finish == DG_FINISH_LENGTH);
    return 0;
}

int main(void)
{
    TEST_CASE(setup);
    TEST_CASE(determinism_batched);
    TEST_CASE(max_tokens_budget);
    TEST_CASE(stop_id_mid_canvas);
    TEST_CASE(stop_string_cuts_text);
    TEST_CASE(cancel_and_busy);
    TEST_CASE(bad_requests);
    TEST_CASE(backend_failures);
    TEST_CASE(backend_refuses_one);
    TEST_CASE(refused_append_retried);
    TEST_CASE(scripted_canvases);
    TEST_CASE(scripted_refused_append);
    TEST_CASE(scripted_prompt_parts);
    if (ready) {
        dg_tokenizer_free(tok);
        dg_model_free(&model);
        dg_checkpoint_close(&ck);
    }
    return test_finish();
}
