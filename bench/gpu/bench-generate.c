/*
 * bench-generate - whole generations through the serving engine on the
 * CUDA backend, at the full 26B-A4B shapes with random bf16 weights made
 * on the GPU: the workload of the performance harness (bench/perf/).
 *
 * usage: bench-generate [--tp N] [--fp8 | --fp8-own] [--eager] [--profile] [--no-ceilings]
 *                       [--commit-apart] [--prompt-apart] [--condition-apart]
 *                       [--json FILE] [--prompt P]
 *                       [--canvases C]
 *                       [--steps S] [--reps R] [--preset NAME] BATCH...
 *   (defaults: tp 1, CUDA graphs on, prompt 512, 4 canvases, 16 steps, 1
 *   rep, preset 26b, batches 1 4 16 32)
 *
 * Per batch size B: B requests of P random prompt ids, submitted at once
 * to one engine (max_batch B), each generating C canvases of the model's
 * canvas length with exactly S denoising steps a canvas (the confidence
 * and stability stops off: stability threshold 65535, confidence
 * threshold 1e-30; no stop ids, so every canvas is emitted whole).  The
 * backend's calls are timed on the host (each ends with its stream
 * synchronised): per-forward medians of the denoising steps (decoder pass
 * + sampler statistics), the self-conditioning calls (the probabilities
 * and their product with the embedding, for a step to come) and the steps
 * that commit the canvas before theirs first (one pass of the commit's
 * encoder rows and the canvas's decoder rows; with --commit-apart an
 * encoder pass and then the step's, to compare).  A commit's own cost
 * ("commit ms") is the median of those steps less the median of the
 * others, both as rank 0's GPU timed the call's own work (the backend's
 * option time_steps: from its first upload to its results, not what it
 * waited for behind an earlier call; the second table's "own" columns),
 * so that it does not depend on what was queued before the step (below).
 * "step ms" is a denoising step whole, the denoise call's median
 * and the condition call's (what transformers' decoder forward does in
 * one call), and is what the roofline is held against.  On one GPU the
 * denoise call queues the condition's work for the step to come behind
 * its results (cuda-backend.h: self-conditioning ahead), so the condition
 * call holds only the host's part, and the next denoise call waits for
 * that work before its own; --condition-apart keeps it in the condition
 * call, to compare (the split between the calls then means what it says).
 * A step that commits follows a canvas's last step, which queues none:
 * its call waits for no self-conditioning work where the others wait for
 * the one queued before them, so the calls' host times ("step with
 * commit ms" against "denoise ms") understate a commit by that work's
 * part the engine's turn does not hide; the own times do not.  The prefill
 * is the encoder calls before the first denoising step; a prompt's last
 * part of at most a canvas rides in that step (engine.h; with a prompt of
 * at most a canvas, all of it: no prefill call), which is then timed
 * apart ("first step with the prompt's rest ms"); --prompt-apart encodes
 * every prompt token in the prefill's calls, to compare.  Tokens/s count
 * committed (emitted) tokens over the generation's wall time without and
 * with the prefill.  A second table gives the medians of the denoise
 * calls' own GPU times (steps that commit nothing, and steps that commit
 * first), of the slots' openings and closings, the wall time past the
 * prefill that no call took (the engine's own work between calls), per
 * step, and the CUDA graphs rank 0 made in the recorded rounds (a bucket
 * that comes once a round is captured in the first of them).
 *
 * It first prints a board line for each rank's GPU (bench-board.h: the
 * card, its PCI address, VBIOS, InfoROM and driver), since H100s of two
 * boards read the same code's batch-1 step 0.9 ms apart.
 *
 * Roofline of one step (the METHOD's two numbers, measured first in
 * the same run unless --no-ceilings): the fewest bytes the step must move
 * (every weight it uses read once: the experts the batch is expected to
 * touch under uniform routing, E (1 - (1 - K/E)^T) per layer; the cached
 * keys and values it attends to; the logits written and read once by the
 * sampler, and read again with the embedding by the self-conditioning
 * product) over the measured copy bandwidth, against its operations
 * (2 x multiply-adds of the projections, experts, LM head, attention and
 * P E) over the measured bf16 GEMM rate; the larger is the floor.  The
 * table also splits it between the two calls (the probabilities and P E
 * the condition call's, the rest the denoise call's; JSON
 * roofline_denoise_ms is the whole step's).  At batch 1 the denoising
 * step is bandwidth-bound by a factor of about 5.  The encoder pass's
 * roofline (roofline_commit_ms) is a commit's as a pass of its own
 * (--commit-apart); a commit that rides in a step reads no weight the
 * step does not, so its own floor is mostly its operations.
 *
 * --fp8: the projections and experts in E4M3 with per-row scales and
 * activations quantized per token (W8A8, kernels/cuda-model.h), made from
 * the same random values; the floor counts those weights at one byte
 * (the operations still at the measured bf16 rate: the batch-1 step is
 * bandwidth-bound).  The projections go through cuBLASLt's FP8 matmul
 * where it has an algorithm (kernels/fp8-lt.h); --fp8-own keeps them on
 * the project's own kernel (kernels/fp8-gemm.h), to compare the two.
 *
 * --profile: the backend runs eagerly and times every stage of rank 0's
 * passes on the device (kernels/prof.h); a table per batch gives each
 * stage's milliseconds per denoising step beside its own floor.
 *
 * Prints a table; with --json, writes the numbers as JSON too (each
 * batch's row also holds started_unix_s and ended_unix_s, the wall clock
 * around its runs, which bench/perf/report.py matches against the GPU's
 * timed clock samples).  A figure with nothing to measure (a step that
 * commits, with one canvas; the first step's prompt rest, with none) is
 * "-" in the tables and null in the JSON.  Asserts nothing about speed.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ceilings.h"
#include "bench/gpu/bench-board.h"
#include "bench/gpu/bench-util.h"
#include "kernels/cuda-backend.h"
#include "kernels/devmem.h"
#include "lib/engine.h"
#include "lib/gen-settings.h"
#include "lib/model-config.h"

#define MAX_B 64
#define MAX_CALLS 65536
#define GIB (1024.0 * 1024.0 * 1024.0)


/* ---- the backend's calls, timed -------------------------------------------------- */

struct call_times {
    double v[MAX_CALLS];
    int n;
};

static struct {
    const struct dg_backend_ops *orig;
    int denoised;                 /* a denoising step came */
    double first_denoise_ms;      /* when it came */
    struct call_times prefill, denoise, condition, commit; /* commit: steps that commit */
    struct call_times tail; /* first steps that append the prompt's rest */
    /* rank 0's GPU time of the call's own work (option time_steps) */
    struct call_times own_denoise, own_commit;
    struct call_times open, close; /* slots opened and closed */
} tm;

static void add_time(struct call_times *c, double ms)
{
    if (c->n < MAX_CALLS)
        c->v[c->n++] = ms;
}

static int timed_encode(struct dg_backend *b, const struct dg_encode_item *items, int n,
                        struct dg_error *err)
{
    const double t0 = bench_now_ms();
    const int rc = tm.orig->encode(b, items, n, err);
    add_time(&tm.prefill, bench_now_ms() - t0);
    return rc;
}

static int timed_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                         struct dg_error *err)
{
    const double t0 = bench_now_ms();
    int rc, commits = 0, tails = 0;
    if (!tm.denoised) {
        tm.denoised = 1;
        tm.first_denoise_ms = t0;
    }
    for (int i = 0; i < n; i++) {
        commits |= items[i].n_append > 0 && items[i].canvas_index > 0;
        tails |= items[i].n_append > 0 && items[i].canvas_index == 0;
    }
    rc = tm.orig->denoise(b, items, n, err);
    add_time(tails ? &tm.tail : commits ? &tm.commit : &tm.denoise, bench_now_ms() - t0);
    if (rc >= 0 && !tails) {
        const double own = dg_cuda_backend_step_ms(b);
        if (own >= 0)
            add_time(commits ? &tm.own_commit : &tm.own_denoise, own);
    }
    return rc;
}

static int timed_slot_open(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                           struct dg_error *err)
{
    const double t0 = bench_now_ms();
    const int rc = tm.orig->slot_open(b, slot, max_positions, max_cl, err);
    add_time(&tm.open, bench_now_ms() - t0);
    return rc;
}

static void timed_slot_close(struct dg_backend *b, int slot)
{
    const double t0 = bench_now_ms();
    tm.orig->slot_close(b, slot);
    add_time(&tm.close, bench_now_ms() - t0);
}

static int timed_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    const double t0 = bench_now_ms();
    const int rc = tm.orig->condition(b, which, n, err);
    add_time(&tm.condition, bench_now_ms() - t0);
    return rc;
}

/* ---- the floor of one forward ---------------------------------------------------- */

struct floor_parts {
    double bytes, flops;
};

/* Bytes and operations of the named stages of one pass over T tokens
 * (B sequences, each with `ctx` committed positions), decoder or
 * encoder, at TP = tp (per rank: a rank holds 1/tp of every split
 * weight, the replicated norms aside). */
struct pass_floor {
    struct floor_parts attn_proj, attention, dense, router, experts, lm_head, sc_mlp, sampler,
        probs_pe, total;
};

static struct pass_floor pass_floor(const struct dg_model_config *c, int B, int64_t ctx,
                                    int decoder, int tp, int fp8)
{
    /* bytes of a projection or expert weight: E4M3 with FP8 (the row
     * scales are 4 / K of that), else bf16 */
    const double wb = fp8 ? 1.0 : 2.0;
    const double H = c->hidden_size, V = (double)c->vocab_size, E = c->num_experts;
    const double K = c->top_k_experts, Im = c->moe_intermediate_size, I = c->intermediate_size;
    const double CL = c->canvas_length, T = B * CL, S = c->self_conditioning_size;
    const double W = c->sliding_window;
    struct pass_floor f;
    memset(&f, 0, sizeof f);
    for (int l = 0; l < c->num_layers; l++) {
        const int full = c->layer_kind[l] == DG_LAYER_FULL;
        const double hd = dg_layer_head_dim(c, l), nkv = dg_layer_kv_heads(c, l);
        const double nh = c->num_heads;
        const double qkv = nh * hd * H + nkv * hd * H * (full ? 1 : 2), o = nh * hd * H;
        /* keys each query sees: the committed window and its own block */
        const double keys = (full ? (double)ctx : fmin((double)ctx, W - 1)) + CL;
        const double touched = E * (1.0 - pow(1.0 - K / E, T));
        f.attn_proj.bytes += wb * (qkv + o);
        f.attn_proj.flops += 2.0 * T * (qkv + o);
        f.attention.bytes += B * keys * nkv * hd * 2.0 * 2.0;
        f.attention.flops += 4.0 * T * keys * nh * hd;
        f.dense.bytes += wb * 3.0 * I * H;
        f.dense.flops += 2.0 * T * 3.0 * I * H;
        f.router.bytes += 2.0 * E * H;
        f.router.flops += 2.0 * T * E * H;
        f.experts.bytes += touched * wb * 3.0 * Im * H;
        f.experts.flops += 2.0 * T * K * 3.0 * Im * H;
    }
    if (decoder) {
        f.lm_head.bytes = 2.0 * V * H + 4.0 * T * V;
        f.lm_head.flops = 2.0 * T * V * H;
        f.sc_mlp.bytes = wb * 3.0 * S * H;
        f.sc_mlp.flops = 2.0 * T * 3.0 * S * H;
        f.sampler.bytes = 4.0 * T * V;          /* the logits read once */
        f.probs_pe.bytes = 4.0 * T * V + 2.0 * V * H; /* logits, embedding */
        f.probs_pe.flops = 2.0 * T * V * H;
    }
    {
        struct floor_parts *all[] = {&f.attn_proj, &f.attention, &f.dense, &f.router,
                                     &f.experts, &f.lm_head, &f.sc_mlp, &f.sampler, &f.probs_pe};
        /* a rank's share: heads, widths, experts and vocabulary split tp ways */
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            all[i]->bytes /= tp;
            all[i]->flops /= tp;
            f.total.bytes += all[i]->bytes;
            f.total.flops += all[i]->flops;
        }
    }
    return f;
}

static double floor_ms(struct floor_parts p, const struct dg_ceilings *ce)
{
    return fmax(p.bytes / (ce->copy_gbps * 1e9), p.flops / (ce->gemm_tflops * 1e12)) * 1e3;
}

/* ---- one batch size ------------------------------------------------------------- */

struct run_cfg {
    int tp, graphs, profile, canvases, steps, reps;
    int64_t prompt;
    int fp8;
    int fp8_own;      /* FP8 projections on the own GEMM, not cuBLASLt */
    int commit_apart; /* commits in encoder passes of their own (backend option) */
    int prompt_apart; /* every prompt token in encoder passes (engine option) */
    int condition_apart; /* self-conditioning in the condition call alone (backend option) */
};

/* One batch size's figures (a median is NaN where it had no sample). */
struct batch_result {
    int B;
    int64_t tokens;
    double wall_ms, prefill_ms, den_ms, cond_ms, commit_ms, prefill_call_ms;
    double den_commit_ms;         /* a step that commits first, whole */
    double den_own_ms, commit_own_ms; /* the two kinds of denoise call's own GPU time */
    double open_ms, close_ms;     /* a slot's opening and closing */
    double tail_ms;               /* a first step that appends the prompt's rest */
    double between_ms;            /* host time outside the calls after the prefill, a step */
    double tps_excl, tps_incl;
    double roof_den_ms, roof_commit_ms; /* roof_den_ms: a step whole (both calls) */
    double roof_den_call_ms, roof_cond_ms; /* the denoise call's part, the condition call's */
    double gib_rank[8];
    double started_s, ended_s;    /* wall clock (seconds since 1970) around the batch's runs */
    long long captures;           /* rank 0's graphs made in all the recorded rounds */
    int n_steps;
    int n_plain;                  /* of them, steps that commit nothing (the profile's) */
    struct dg_prof_total prof[DG_PROF_MAX_LABELS];
    int n_prof;
};

/* The wall clock, seconds since 1970: what the harness matches nvidia-smi's
 * timed samples against. */
static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct gen_count {
    int64_t tokens;
    int done, errors;
    char error[256];
};

static void on_event(void *ctx, const struct dg_gen_event *ev)
{
    struct gen_count *g = ctx;
    if (ev->kind == DG_EVENT_CANVAS)
        g->tokens += ev->n_ids;
    if (ev->kind == DG_EVENT_DONE) {
        g->done++;
        if (ev->finish == DG_FINISH_ERROR && !g->errors++)
            snprintf(g->error, sizeof g->error, "%s", ev->error ? ev->error : "?");
    }
}

static uint64_t rng = 88172645463325252ull;

static int run_batch(struct dg_backend *b, const struct run_cfg *rc, int B,
                     const struct dg_ceilings *ce, struct batch_result *r)
{
    const struct dg_model_config *c = b->cfg;
    const int CL = c->canvas_length;
    const int64_t P = rc->prompt, V = c->vocab_size;
    struct dg_engine_config ec;
    struct dg_generation_config gc;
    struct dg_gen_settings s;
    struct dg_error err = {0};
    double *walls = calloc((size_t)rc->reps, sizeof(double));
    double *prefills = calloc((size_t)rc->reps, sizeof(double));
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
    struct dg_cuda_rank_usage u0;
    uint64_t captures0 = 0;
    int ok = -1;

    memset(r, 0, sizeof *r);
    r->B = B;
    if (!walls || !prefills || !prompt)
        goto out;
    dg_engine_config_default(&ec, c);
    ec.max_batch = B;
    ec.prefill_chunk = (int)P;
    ec.prompt_apart = rc->prompt_apart;
    ec.max_context = P + (int64_t)rc->canvases * CL;
    dg_generation_config_defaults(&gc);
    dg_gen_settings_defaults(&s, c, &gc);
    s.canvas_length = CL;
    s.max_denoising_steps = rc->steps;
    s.stability_threshold = 65535;
    s.confidence_threshold = 1e-30;
    s.max_tokens = (int64_t)rc->canvases * CL;
    s.n_stop_ids = 0;
    s.seed_set = 1;
    if (dg_gen_settings_validate(&s, c, &ec.limits, &err) < 0) {
        fprintf(stderr, "bench-generate: settings: %s\n", err.msg);
        goto out;
    }
    /* a first round unrecorded (kernels load, cuBLAS picks, graphs are
     * captured), then reps rounds */
    for (int rep = -1; rep < rc->reps; rep++) {
        struct dg_engine *e = NULL;
        struct gen_count g = {0};
        double t0;
        tm.denoised = 0;
        if (rep == 0) {
            /* the timings and profiles of the recorded rounds only */
            tm.prefill.n = tm.denoise.n = tm.condition.n = tm.commit.n = tm.tail.n = 0;
            tm.own_denoise.n = tm.own_commit.n = 0;
            tm.open.n = tm.close.n = 0;
            if (dg_cuda_backend_rank_usage(b, 0, &u0) == 0)
                captures0 = u0.captures;
            if (rc->profile)
                for (int w = 0; w < 2; w++)
                    dg_cuda_backend_profile(b, w, NULL, 0, 1);
        }
        if (dg_engine_create(b, &ec, NULL, on_event, &g, &e, &err) < 0) {
            fprintf(stderr, "bench-generate: engine: %s\n", err.msg);
            goto out;
        }
        t0 = bench_now_ms();
        for (int i = 0; i < B; i++) {
            uint64_t id;
            for (int64_t j = 0; j < P; j++)
                prompt[j] = bench_rand_id(&rng, V);
            s.seed = 1000 + (uint64_t)i + 100 * (uint64_t)(rep + 1);
            if (dg_engine_submit(e, prompt, P, &s, NULL, &id, &err) < 0) {
                fprintf(stderr, "bench-generate: submit: %s\n", err.msg);
                dg_engine_destroy(e);
                goto out;
            }
        }
        while (dg_engine_step(e) > 0)
            ;
        dg_engine_destroy(e);
        if (g.errors) {
            fprintf(stderr, "bench-generate: batch %d: %d requests failed: %s\n", B, g.errors,
                    g.error);
            goto out;
        }
        if (rep >= 0) {
            walls[rep] = bench_now_ms() - t0;
            prefills[rep] = tm.first_denoise_ms - t0;
            r->tokens = g.tokens;
        }
    }
    r->wall_ms = bench_median(walls, rc->reps);
    r->prefill_ms = bench_median(prefills, rc->reps);
    r->n_steps = (tm.denoise.n + tm.commit.n + tm.tail.n) / rc->reps;
    r->n_plain = tm.denoise.n / rc->reps;
    r->den_ms = bench_median(tm.denoise.v, tm.denoise.n);
    r->cond_ms = bench_median(tm.condition.v, tm.condition.n);
    r->den_commit_ms = bench_median(tm.commit.v, tm.commit.n);
    r->den_own_ms = bench_median(tm.own_denoise.v, tm.own_denoise.n);
    r->commit_own_ms = bench_median(tm.own_commit.v, tm.own_commit.n);
    /* (the calls' host times where the GPU's are missing: not expected) */
    r->commit_ms = tm.own_commit.n && tm.own_denoise.n ? r->commit_own_ms - r->den_own_ms
                   : tm.commit.n                       ? r->den_commit_ms - r->den_ms
                                                       : 0;
    r->tail_ms = bench_median(tm.tail.v, tm.tail.n);
    r->open_ms = bench_median(tm.open.v, tm.open.n);
    r->close_ms = bench_median(tm.close.v, tm.close.n);
    {
        /* the generation's wall time past the prefill less every call in it */
        double calls = 0;
        const struct call_times *in[] = {&tm.denoise, &tm.commit, &tm.tail, &tm.condition,
                                         &tm.close};
        for (size_t k = 0; k < sizeof in / sizeof in[0]; k++)
            for (int i = 0; i < in[k]->n; i++)
                calls += in[k]->v[i];
        r->between_ms = r->n_steps ? ((r->wall_ms - r->prefill_ms) * rc->reps - calls) /
                                         ((double)r->n_steps * rc->reps)
                                   : 0;
    }
    r->prefill_call_ms = bench_median(tm.prefill.v, tm.prefill.n);
    if (dg_cuda_backend_rank_usage(b, 0, &u0) == 0)
        r->captures = (long long)(u0.captures - captures0);
    r->tps_excl = (double)r->tokens / ((r->wall_ms - r->prefill_ms) * 1e-3);
    r->tps_incl = (double)r->tokens / (r->wall_ms * 1e-3);
    if (ce) {
        /* averaged over the canvases' committed lengths; the step's
         * probabilities and P E are the condition call's, the rest the
         * denoise call's */
        double den = 0, com = 0, call = 0, cond = 0;
        for (int k = 0; k < rc->canvases; k++) {
            const int64_t ctx = P + (int64_t)k * CL;
            struct pass_floor fd = pass_floor(c, B, ctx, 1, rc->tp, rc->fp8);
            struct pass_floor fe = pass_floor(c, B, ctx, 0, rc->tp, rc->fp8);
            struct floor_parts rest = {fd.total.bytes - fd.probs_pe.bytes,
                                       fd.total.flops - fd.probs_pe.flops};
            den += floor_ms(fd.total, ce) / rc->canvases;
            com += floor_ms(fe.total, ce) / rc->canvases;
            call += floor_ms(rest, ce) / rc->canvases;
            cond += floor_ms(fd.probs_pe, ce) / rc->canvases;
        }
        r->roof_den_ms = den;
        r->roof_commit_ms = com;
        r->roof_den_call_ms = call;
        r->roof_cond_ms = cond;
    }
    for (int q = 0; q < dg_cuda_backend_ranks(b) && q < 8; q++) {
        struct dg_cuda_rank_usage u;
        if (dg_cuda_backend_rank_usage(b, q, &u) == 0)
            r->gib_rank[q] = (double)u.device_used / GIB;
    }
    if (rc->profile)
        r->n_prof = dg_cuda_backend_profile(b, 1, r->prof, DG_PROF_MAX_LABELS, 0);
    ok = 0;
out:
    free(walls);
    free(prefills);
    free(prompt);
    return ok;
}

/* The profile of one batch: ms per denoising step by stage, beside each
 * stage's floor where one is counted. */
static void print_profile(const struct dg_model_config *c, const struct run_cfg *rc,
                          const struct batch_result *r, const struct dg_ceilings *ce)
{
    const struct pass_floor f = pass_floor(c, r->B, rc->prompt + (int64_t)(rc->canvases - 1) *
                                                                  c->canvas_length / 2,
                                           1, rc->tp, rc->fp8);
    const double steps = (double)r->n_plain * rc->reps;
    double total = 0;
    printf("\nprofile, batch %d: device ms per denoising step (eager, rank 0), mean over the %d "
           "steps that commit nothing; floor at the mean committed length\n\n",
           r->B, (int)steps);
    printf("| stage | ms / step | share | floor ms | x floor |\n|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < r->n_prof; i++)
        total += r->prof[i].ms;
    for (int i = 0; i < r->n_prof; i++) {
        const char *l = r->prof[i].label;
        const struct floor_parts *fp =
            !strcmp(l, "qkv projection") || !strcmp(l, "o projection") ? NULL
            : !strncmp(l, "attention", 9)                              ? NULL
            : !strcmp(l, "dense mlp")                                  ? &f.dense
            : !strcmp(l, "experts")                                    ? &f.experts
            : !strcmp(l, "lm head")                                    ? &f.lm_head
            : !strcmp(l, "self-conditioning mlp")                      ? &f.sc_mlp
            : !strcmp(l, "sampler statistics")                         ? &f.sampler
            : !strcmp(l, "self-conditioning P.E")                      ? &f.probs_pe
            : !strcmp(l, "router")                                     ? &f.router
                                                                       : NULL;
        const double ms = r->prof[i].ms / steps;
        if (fp && ce) {
            const double fl = floor_ms(*fp, ce);
            printf("| %s | %.3f | %.1f%% | %.3f | %.1f |\n", l, ms, 100 * r->prof[i].ms / total,
                   fl, ms / fl);
        } else {
            printf("| %s | %.3f | %.1f%% | | |\n", l, ms, 100 * r->prof[i].ms / total);
        }
    }
    if (ce) {
        struct floor_parts qkvo = f.attn_proj;
        printf("| (q, k, v, o projections together) | | | %.3f | |\n", floor_ms(qkvo, ce));
        printf("| (attention, all layers) | | | %.3f | |\n", floor_ms(f.attention, ce));
    }
    if (ce)
        printf("| total | %.3f | 100%% | %.3f | %.1f |\n", total / steps,
               floor_ms(f.total, ce), total / steps / floor_ms(f.total, ce));
    else
        printf("| total | %.3f | 100%% | | |\n", total / steps);
}

/* A denoising step whole: the denoise call and the condition call */
static double step_ms(const struct batch_result *r)
{
    return r->den_ms + r->cond_ms;
}

/* A figure as JSON: null where there was nothing to measure (NaN), since
 * jansson makes no value of a NaN. */
static json_t *num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* A figure as a table cell of prec decimals, written in b[n]: "-" for NaN. */
static const char *cell(char *b, size_t n, double v, int prec)
{
    if (isfinite(v))
        snprintf(b, n, "%.*f", prec, v);
    else
        snprintf(b, n, "-");
    return b;
}

/* Prints n figures as table cells, " v |" each, v[k] to prec[k] decimals
 * ("-" for NaN). */
static void print_cells(const double *v, const int *prec, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        char t[32];
        printf(" %s |", cell(t, sizeof t, v[k], prec[k]));
    }
}

/* One batch size's row of the JSON: its settings and figures (null where
 * there was no sample), memory per rank, and the profile's stages when
 * profiled.  The caller owns it. */
static json_t *result_json(const struct run_cfg *rc, const struct batch_result *r, int n_ranks)
{
    const struct {
        const char *key;
        double v;
    } figs[] = {
        {"wall_ms", r->wall_ms},
        {"prefill_ms", r->prefill_ms},
        {"denoise_ms", r->den_ms},
        {"condition_ms", r->cond_ms},
        {"commit_ms", r->commit_ms},
        {"roofline_denoise_ms", r->roof_den_ms},
        {"roofline_commit_ms", r->roof_commit_ms},
        {"tokens_per_s", r->tps_excl},
        {"tokens_per_s_with_prefill", r->tps_incl},
        {"step_ms", step_ms(r)},
        {"roofline_denoise_call_ms", r->roof_den_call_ms},
        {"roofline_condition_ms", r->roof_cond_ms},
        {"denoise_commit_ms", r->den_commit_ms},
        {"denoise_own_gpu_ms", r->den_own_ms},
        {"denoise_commit_own_gpu_ms", r->commit_own_ms},
        {"slot_open_ms", r->open_ms},
        {"slot_close_ms", r->close_ms},
        {"host_between_calls_ms_per_step", r->between_ms},
        {"tail_step_ms", r->tail_ms},
        {"started_unix_s", r->started_s},
        {"ended_unix_s", r->ended_s},
    };
    json_t *o = json_pack("{s:i, s:i, s:b, s:I, s:I}", "tp", rc->tp, "batch", r->B, "graphs",
                          rc->graphs, "prompt", (json_int_t)rc->prompt, "tokens",
                          (json_int_t)r->tokens);
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
        json_object_set_new(o, figs[i].key, num(figs[i].v));
    json_object_set_new(o, "steps_per_canvas",
                        json_integer(r->n_steps / (rc->canvases ? rc->canvases : 1)));
    json_t *mem = json_array(), *prof = json_object();
    json_object_set_new(o, "weights", json_string(rc->fp8 ? "fp8" : "bf16"));
    json_object_set_new(o, "commit_apart", json_boolean(rc->commit_apart));
    json_object_set_new(o, "prompt_apart", json_boolean(rc->prompt_apart));
    json_object_set_new(o, "condition_apart", json_boolean(rc->condition_apart));
    json_object_set_new(o, "graphs_made_recorded", json_integer(r->captures));
    if (rc->fp8)
        json_object_set_new(o, "fp8_projections",
                            json_string(rc->fp8_own ? "own GEMM" : "cuBLASLt"));
    for (int q = 0; q < n_ranks && q < 8; q++)
        json_array_append_new(mem, num(r->gib_rank[q]));
    json_object_set_new(o, "gpu_gib_per_rank", mem);
    for (int i = 0; i < r->n_prof; i++)
        json_object_set_new(prof, r->prof[i].label,
                            num(r->prof[i].ms / ((double)r->n_plain * rc->reps)));
    if (r->n_prof)
        json_object_set_new(o, "profile_ms_per_step", prof);
    else
        json_decref(prof);
    return o;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench-generate [--tp N] [--fp8 | --fp8-own] [--eager] [--profile] "
                    "[--no-ceilings] [--commit-apart] [--prompt-apart] [--condition-apart] "
                    "[--json FILE] [--prompt P] [--canvases C] [--steps S] [--reps R] "
                    "[--preset NAME] BATCH...\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct run_cfg rc = {1, 1, 0, 4, 16, 1, 512, 0, 0, 0, 0, 0};
    const char *json_path = NULL, *preset = "26b";
    int ceilings = 1, batches[16], nb = 0, maxb = 1, status = 0;
    struct dg_model_config cfg;
    struct dg_cuda_backend_options o;
    struct dg_backend *b = NULL;
    struct dg_backend_ops ops;
    struct dg_ceilings ce;
    struct dg_error err = {0};
    json_t *out = json_object(), *rows = json_array();
    double t0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--eager")) {
            rc.graphs = 0;
        } else if (!strcmp(a, "--profile")) {
            rc.profile = 1;
        } else if (!strcmp(a, "--fp8")) {
            rc.fp8 = 1;
        } else if (!strcmp(a, "--fp8-own")) {
            rc.fp8 = 1;
            rc.fp8_own = 1;
        } else if (!strcmp(a, "--no-ceilings")) {
            ceilings = 0;
        } else if (!strcmp(a, "--commit-apart")) {
            rc.commit_apart = 1;
        } else if (!strcmp(a, "--prompt-apart")) {
            rc.prompt_apart = 1;
        } else if (!strcmp(a, "--condition-apart")) {
            rc.condition_apart = 1;
        } else if (v && !strcmp(a, "--tp")) {
            rc.tp = atoi(v), i++;
        } else if (v && !strcmp(a, "--json")) {
            json_path = v, i++;
        } else if (v && !strcmp(a, "--prompt")) {
            rc.prompt = atoll(v), i++;
        } else if (v && !strcmp(a, "--canvases")) {
            rc.canvases = atoi(v), i++;
        } else if (v && !strcmp(a, "--steps")) {
            rc.steps = atoi(v), i++;
        } else if (v && !strcmp(a, "--reps")) {
            rc.reps = atoi(v), i++;
        } else if (v && !strcmp(a, "--preset")) {
            preset = v, i++;
        } else if (a[0] != '-' && nb < 16) {
            batches[nb++] = atoi(a);
        } else {
            return usage();
        }
    }
    if (!nb) {
        const int def[] = {1, 4, 16, 32};
        for (nb = 0; nb < 4; nb++)
            batches[nb] = def[nb];
    }
    if (rc.tp < 1 || rc.tp > 8 || rc.prompt < 1 || rc.canvases < 1 || rc.steps < 1 ||
        rc.reps < 1)
        return usage();
    for (int i = 0; i < nb; i++) {
        if (batches[i] < 1 || batches[i] > MAX_B) {
            fprintf(stderr, "bench-generate: batch %d not in 1..%d\n", batches[i], MAX_B);
            return 2;
        }
        if (batches[i] > maxb)
            maxb = batches[i];
    }
    if (dg_model_config_preset(preset, &cfg, &err) < 0) {
        fprintf(stderr, "bench-generate: %s\n", err.msg);
        return 2;
    }
    if (!out || !rows)
        return 1;
    /* which cards run it: one line a rank's GPU (bench-board.h); each
     * probe makes its GPU current, so GPU 0 is made current again after */
    for (int d = 0; d < rc.tp; d++) {
        if (bench_print_board(d, &err) < 0) {
            fprintf(stderr, "bench-generate: --tp %d: %s\n", rc.tp, err.msg);
            return 1;
        }
    }
    if (dg_cuda_use(0, &err) < 0) {
        fprintf(stderr, "bench-generate: %s\n", err.msg);
        return 1;
    }
    if (ceilings) {
        if (dg_measure_ceilings(0, &ce, &err) < 0) {
            fprintf(stderr, "bench-generate: ceilings: %s\n", err.msg);
            return 1;
        }
        printf("ceilings, GPU 0: device copy %.0f GB/s (read + write), bf16 GEMM %d^3 %.0f "
               "TFLOP/s; L2 read %.0f GB/s (%.0f MiB)\n",
               ce.copy_gbps, ce.gemm_n, ce.gemm_tflops, ce.l2_read_gbps,
               ce.l2_bytes / 1048576.0);
        json_object_set_new(out, "ceilings",
                            json_pack("{s:f, s:f, s:f}", "copy_gbps", ce.copy_gbps, "gemm_tflops",
                                      ce.gemm_tflops, "l2_read_gbps", ce.l2_read_gbps));
    }
    memset(&o, 0, sizeof o);
    o.n_ranks = rc.tp;
    o.pin = 1;
    o.graphs = rc.graphs;
    o.profile = rc.profile;
    o.fp8 = rc.fp8;
    o.fp8_own_gemm = rc.fp8_own;
    o.commit_apart = rc.commit_apart;
    o.condition_apart = rc.condition_apart;
    o.time_steps = 1;
    o.max_slots = maxb;
    o.cfg = &cfg;
    o.seed = 1;
    t0 = bench_now_ms();
    if (dg_cuda_backend_create(&o, &b, &err) < 0) {
        fprintf(stderr, "bench-generate: %s\n", err.msg);
        return 1;
    }
    printf("tp %d, CUDA graphs %s%s, commits %s, the prompt's rest %s, self-conditioning %s; "
           "preset %s, random %s "
           "weights made in %.0f "
           "ms; prompt %lld, %d canvas%s of %d, %d step%s each; %d rep(s) after one "
           "unrecorded\n\n",
           rc.tp, rc.graphs && !rc.profile ? "on" : "off", rc.profile ? ", profiled" : "",
           rc.commit_apart ? "apart" : "in the next step's pass",
           rc.prompt_apart ? "apart" : "in the first step's pass",
           rc.condition_apart || rc.tp > 1 || rc.profile ? "in the condition call"
                                                          : "queued ahead by the denoise call",
           preset, !rc.fp8 ? "bf16" : rc.fp8_own ? "FP8 (W8A8, own GEMM)" : "FP8 (W8A8)",
           bench_now_ms() - t0, (long long)rc.prompt,
           rc.canvases, rc.canvases == 1 ? "" : "es", cfg.canvas_length,
           rc.steps, rc.steps == 1 ? "" : "s", rc.reps);
    tm.orig = b->ops;
    ops = *b->ops;
    ops.encode = timed_encode;
    ops.denoise = timed_denoise;
    ops.condition = timed_condition;
    ops.slot_open = timed_slot_open;
    ops.slot_close = timed_slot_close;
    b->ops = &ops;

    {
        struct batch_result *res = calloc((size_t)nb, sizeof *res);
        if (!res)
            return 1;
        for (int i = 0; i < nb; i++) {
            const double started = wall_s();
            if (run_batch(b, &rc, batches[i], ceilings ? &ce : NULL, &res[i]) < 0) {
                status = 1;
                break;
            }
            res[i].started_s = started;
            res[i].ended_s = wall_s();
            json_array_append_new(rows, result_json(&rc, &res[i], rc.tp));
        }
        printf("%s weights\n", !rc.fp8      ? "bf16"
                               : rc.fp8_own ? "FP8 (W8A8), projections on the own GEMM"
                                            : "FP8 (W8A8), projections through cuBLASLt");
        printf("| TP | B | tokens | step ms | roofline ms | x roofline | denoise ms | "
               "roofline ms | condition ms | roofline ms | step with commit ms | commit ms | "
               "encoder pass roofline ms | prefill ms | tok/s | tok/s with prefill | "
               "GiB/rank |\n");
        printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
               "---:|\n");
        for (int i = 0; i < nb && res[i].wall_ms > 0; i++) {
            const struct batch_result *r = &res[i];
            const double v[] = {step_ms(r), r->roof_den_ms,
                                r->roof_den_ms > 0 ? step_ms(r) / r->roof_den_ms : NAN,
                                r->den_ms, r->roof_den_call_ms, r->cond_ms, r->roof_cond_ms,
                                r->den_commit_ms, r->commit_ms, r->roof_commit_ms,
                                r->prefill_ms, r->tps_excl, r->tps_incl, r->gib_rank[0]};
            static const int prec[] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 0, 0, 2};
            printf("| %d | %d | %lld |", rc.tp, r->B, (long long)r->tokens);
            print_cells(v, prec, sizeof v / sizeof v[0]);
            printf("\n");
        }
        printf("\n| B | denoise own GPU ms | step with commit own GPU ms | slot open ms | "
               "slot close ms | host ms between calls, a step | first step with the prompt's "
               "rest ms | graphs made in the recorded rounds |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int i = 0; i < nb && res[i].wall_ms > 0; i++) {
            const struct batch_result *r = &res[i];
            const double v[] = {r->den_own_ms, r->commit_own_ms, r->open_ms, r->close_ms,
                                r->between_ms, r->tail_ms};
            static const int prec[] = {2, 2, 2, 2, 3, 2};
            printf("| %d |", r->B);
            print_cells(v, prec, sizeof v / sizeof v[0]);
            printf(" %lld |\n", r->captures);
        }
        if (rc.profile)
            for (int i = 0; i < nb && res[i].wall_ms > 0; i++)
                print_profile(&cfg, &rc, &res[i], ceilings ? &ce : NULL);
        free(res);
    }
    b->ops = tm.orig;
    b->ops->destroy(b);
    json_object_set_new(out, "runs", rows);
    if (json_path && json_dump_file(out, json_path, JSON_INDENT(1)) < 0) {
        fprintf(stderr, "bench-generate: cannot write %s\n", json_path);
        status = 1;
    }
    json_decref(out);
    return status;
}
