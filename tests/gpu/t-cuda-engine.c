/*
 * Description: the CUDA backend under the generation engine (lib/engine.h)
 * against the CPU backend, same requests, same seeds, on the golden models
 * and the "small" preset (bf16 weights).
 *
 *   sc_chain (CPU only): the goldens' self-conditioning chain amplifies a
 *     1e-5 perturbation of its first logits at least 100x in five steps
 *     (printed per step): why long free-running chains part on
 *     rounding-level differences.
 *   filters (fp32 elements): first steps with top-p 0.9, top-k 20 and
 *     both: samples and argmax equal, entropies within 1e-3 (the threshold
 *     is taken from the GPU's own soft-capped values: a host soft-cap one
 *     ulp apart used to drop the boundary id).
 *   backend steps (fp32 elements): one slot through prompt, four denoising
 *     steps each conditioned on the last, a commit, two steps of the next
 *     canvas (top-p, top-k): samples and argmax equal and entropies within 1e-3 where no
 *     chain is involved (first steps, a condition of a first step); deeper
 *     in a chain, shown.
 *   condition ahead (bf16 and fp32, graphs and eager): the self-conditioning
 *     queued by the denoise call against the condition call's own (option
 *     condition_apart): every id of four batched requests equal, six steps
 *     a canvas and every canvas converging at its first step.
 *   step time (option time_steps, bf16, graphs and eager, conditions
 *     ahead and apart): after every denoise call the GPU's time of its
 *     own work is there, above 0 and within the call's host time; without
 *     the option it is -1.
 *   generations, four requests in one engine (batched prefill chunks,
 *     self-conditioning, commits, two canvases), fp32 elements, two
 *     denoising steps a canvas: every id equal to the CPU backend's; the
 *     same in lockstep (a backend that runs every call on both and hands
 *     the engine the CPU's results): samples and argmax agree on >= 99.9%
 *     of positions, entropies within 1e-3, every differing acceptance
 *     decision on a tie of the CPU's own entropies.
 *   Shown: six steps a canvas (fp32 and bf16), free-running and in
 *     lockstep; one request alone and in a batch of four (bf16).
 * Exit 77 where there is no GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda-backend.h"
#include "lib/checkpoint.h"
#include "lib/cpu-backend.h"
#include "lib/cpu-forward.h"
#include "lib/engine.h"
#include "lib/gen-settings.h"
#include "lib/kv-cache.h"
#include "lib/model-synth.h"
#include "lib/model-weights.h"
#include "lib/sampler.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define NREQ GT_NREQ

enum which { CPU, GPU_F32, GPU_BF16 };

/* the GPU backends' options beyond the defaults (case_condition_ahead,
 * case_step_time) */
static int opt_condition_apart, opt_graphs, opt_time_steps;

static int make_backend(enum which w, const struct dg_model *m, int slots, struct dg_backend **b,
                        struct dg_error *err)
{
    if (w == CPU) {
        struct dg_cpu_backend_options o;
        memset(&o, 0, sizeof o);
        o.n_ranks = 1;
        o.max_slots = slots;
        return dg_cpu_backend_create(m, &o, b, err);
    } else {
        struct dg_cuda_backend_options o;
        memset(&o, 0, sizeof o);
        o.device = 0;
        o.max_slots = slots;
        o.model = m;
        o.fp32 = w == GPU_F32;
        o.condition_apart = opt_condition_apart;
        o.graphs = opt_graphs;
        o.time_steps = opt_time_steps;
        return dg_cuda_backend_create(&o, b, err);
    }
}

/* Requests first .. first+n-1 on backend w (gt_generate). */
static int generate(enum which w, const struct dg_checkpoint *ck, const struct dg_model *m,
                    const int *plen, int first, int n, int max_tokens, int steps,
                    struct gt_sink *sink)
{
    struct dg_backend *b = NULL;
    struct dg_error err = {0};
    CHECK_OK(make_backend(w, m, NREQ, &b, &err), &err);
    return gt_generate(b, ck, m, plen, first, n, max_tokens, steps, sink);
}

/* ---- lockstep: both backends under one engine ---------------------------------- */

/* A backend that runs every call on the CPU and on the GPU and hands the
 * engine the CPU's results, so the two stay on one trajectory (same
 * canvases, same commits) and every denoising step compares them on the
 * same inputs.  Where an acceptance decision (dg_accept_mask with the
 * request's beta) differs, the CPU's entropies must have been that close
 * to a tie: margin = the smallest gap between two of its entropies or
 * between a prefix sum and beta, within 4x the largest GPU-CPU entropy
 * difference of that canvas ("explained"). */
struct lockstep {
    struct dg_backend base;
    struct dg_backend *cpu, *gpu;
    double beta;
    int32_t *sample, *argmax;
    float *entropy;
    int cap;
    /* what was seen */
    long positions, sample_diff, argmax_diff, steps, decisions, flips, unexplained;
    double max_ent_diff, worst_ratio;
    int shown;
    struct dg_error err;
};

static struct lockstep *ls_of(struct dg_backend *b)
{
    return (struct lockstep *)b;
}

static int ls_slot_open(struct dg_backend *b, int slot, int64_t maxp, int max_cl,
                        struct dg_error *err)
{
    struct lockstep *L = ls_of(b);
    int rc = L->cpu->ops->slot_open(L->cpu, slot, maxp, max_cl, err);
    if (rc == 0 && (rc = L->gpu->ops->slot_open(L->gpu, slot, maxp, max_cl, err)) < 0)
        L->cpu->ops->slot_close(L->cpu, slot);
    return rc;
}

static void ls_slot_close(struct dg_backend *b, int slot)
{
    struct lockstep *L = ls_of(b);
    L->cpu->ops->slot_close(L->cpu, slot);
    L->gpu->ops->slot_close(L->gpu, slot);
}

static int64_t ls_slot_length(const struct dg_backend *b, int slot)
{
    const struct lockstep *L = (const struct lockstep *)b;
    return L->cpu->ops->slot_length(L->cpu, slot);
}

static int ls_encode(struct dg_backend *b, const struct dg_encode_item *it, int n,
                     struct dg_error *err)
{
    struct lockstep *L = ls_of(b);
    if (L->shown < 8) {
        printf("# lockstep: encode");
        for (int i = 0; i < n; i++)
            printf(" [slot %d: %lld after %lld]", it[i].slot, (long long)it[i].n,
                   (long long)L->cpu->ops->slot_length(L->cpu, it[i].slot));
        printf("\n");
    }
    int rc = L->cpu->ops->encode(L->cpu, it, n, err);
    return rc < 0 ? rc : L->gpu->ops->encode(L->gpu, it, n, err);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The CPU entropies' distance from a different decision (see above). */
static double decision_margin(const float *e, int n, double beta)
{
    float sorted[256];
    double gap = INFINITY, sum = 0;
    memcpy(sorted, e, sizeof(float) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(float), cmp_float);
    for (int i = 0; i < n; i++) {
        if (i > 0 && sorted[i] - sorted[i - 1] < gap)
            gap = sorted[i] - sorted[i - 1];
        if (fabs(sum - beta) < gap)
            gap = fabs(sum - beta);
        sum += sorted[i];
    }
    return gap;
}

static int ls_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                      struct dg_error *err)
{
    struct lockstep *L = ls_of(b);
    struct dg_denoise_item g[16];
    int total = 0, rc;

    if (n > 16)
        return dg_error_set(err, DG_E_INVAL, "lockstep: %d items", n);
    for (int i = 0; i < n; i++)
        total += items[i].cl;
    if (total > L->cap)
        return dg_error_set(err, DG_E_INVAL, "lockstep: %d positions", total);
    if ((rc = L->cpu->ops->denoise(L->cpu, items, n, err)) < 0)
        return rc;
    total = 0;
    for (int i = 0; i < n; i++) {
        g[i] = items[i];
        g[i].sample = L->sample + total;
        g[i].argmax = L->argmax + total;
        g[i].entropy = L->entropy + total;
        total += items[i].cl;
    }
    if ((rc = L->gpu->ops->denoise(L->gpu, g, n, err)) < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *c = &items[i];
        uint8_t mc[256], mg[256];
        int32_t order[256];
        double dmax = 0;
        int differ = 0;
        for (int p = 0; p < c->cl; p++) {
            const double d = fabs((double)c->entropy[p] - g[i].entropy[p]);
            L->sample_diff += c->sample[p] != g[i].sample[p];
            L->argmax_diff += c->argmax[p] != g[i].argmax[p];
            if (d > dmax)
                dmax = d;
        }
        L->positions += c->cl;
        L->steps++;
        if (dmax > 0.01 && L->shown < 8) {
            L->shown++;
            printf("# lockstep: entropy diff %.3g: item %d of %d, slot %d (length %lld), "
                   "self_cond %d, canvas %u, step %u\n", dmax, i, n, c->slot,
                   (long long)L->cpu->ops->slot_length(L->cpu, c->slot), c->self_cond,
                   c->canvas_index, c->step);
        }
        if (dmax > L->max_ent_diff)
            L->max_ent_diff = dmax;
        if (c->cl > 256)
            continue;
        dg_accept_mask(c->entropy, c->cl, L->beta, mc, order);
        dg_accept_mask(g[i].entropy, c->cl, L->beta, mg, order);
        L->decisions++;
        for (int p = 0; p < c->cl; p++)
            differ |= mc[p] != mg[p];
        if (differ) {
            const double margin = decision_margin(c->entropy, c->cl, L->beta);
            const double ratio = dmax > 0 ? margin / dmax : INFINITY;
            L->flips++;
            if (ratio > L->worst_ratio)
                L->worst_ratio = ratio;
            if (margin > 4 * dmax) {
                L->unexplained++;
                printf("# lockstep: unexplained decision flip: margin %.3g, entropy diff %.3g\n",
                       margin, dmax);
            }
        }
    }
    return 0;
}

static int ls_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct lockstep *L = ls_of(b);
    int rc = L->cpu->ops->condition(L->cpu, which, n, err);
    return rc < 0 ? rc : L->gpu->ops->condition(L->gpu, which, n, err);
}

static void ls_destroy(struct dg_backend *b)
{
    (void)b;
}

static const struct dg_backend_ops ls_ops = {
    ls_slot_open, ls_slot_close, ls_slot_length, ls_encode, ls_denoise, ls_condition, ls_destroy,
    NULL,
};

/* NREQ requests through one engine on the lockstep pair; prints what it saw;
 * with f32, checks it. */
static int lockstep_run(const struct dg_checkpoint *ck, const struct dg_model *m,
                        const int *plen, enum which gw, int steps, const char *name)
{
    struct lockstep L;
    struct gt_sink sink;
    struct dg_engine *e = NULL;
    struct dg_engine_config ec;
    struct dg_gen_settings s0;
    struct dg_error err = {0};
    const int cap = NREQ * 256;

    memset(&L, 0, sizeof L);
    memset(&sink, 0, sizeof sink);
    L.base.ops = &ls_ops;
    L.base.name = "lockstep";
    L.base.max_slots = NREQ;
    L.cap = cap;
    L.sample = malloc(sizeof(int32_t) * cap);
    L.argmax = malloc(sizeof(int32_t) * cap);
    L.entropy = malloc(sizeof(float) * cap);
    CHECK(L.sample && L.argmax && L.entropy);
    dg_gen_settings_defaults(&s0, &m->cfg, &ck->generation);
    L.beta = s0.entropy_bound;
    CHECK_OK(make_backend(CPU, m, NREQ, &L.cpu, &err), &err);
    CHECK_OK(make_backend(gw, m, NREQ, &L.gpu, &err), &err);
    L.base.cfg = L.cpu->cfg;
    dg_engine_config_default(&ec, &m->cfg);
    ec.max_batch = NREQ;
    ec.prefill_chunk = 64;
    ec.max_context = 512;
    CHECK_OK(dg_engine_create(&L.base, &ec, NULL, gt_on_event, &sink, &e, &err), &err);
    for (int i = 0; i < NREQ; i++) {
        struct dg_gen_settings s = s0;
        int32_t prompt[256];
        gt_rand_ids(prompt, plen[i], m->cfg.vocab_size, 1000 + (uint64_t)i);
        s.seed = 42 + (uint64_t)i;
        s.seed_set = 1;
        s.max_tokens = 3 * m->cfg.canvas_length;
        s.max_denoising_steps = steps;
        CHECK_OK(dg_engine_submit(e, prompt, plen[i], &s, NULL, &sink.out[i].id, &err), &err);
        sink.n++;
    }
    for (int guard = 0; guard < 100000 && dg_engine_step(e) > 0; guard++)
        ;
    dg_engine_destroy(e);
    L.cpu->ops->destroy(L.cpu);
    L.gpu->ops->destroy(L.gpu);
    free(L.sample);
    free(L.argmax);
    free(L.entropy);
    printf("# %s lockstep %s, up to %d steps a canvas%s: %ld steps, %ld positions: samples "
           "differ at %ld, argmax at %ld; max |entropy diff| %.3g; acceptance decisions %ld, "
           "differing %ld (all within 4x the entropy difference of a tie: %s; worst "
           "margin/diff %.3g)\n", name, gw == GPU_F32 ? "f32" : "bf16", steps,
           gw == GPU_F32 && steps <= 2 ? "" : " (shown)", L.steps, L.positions, L.sample_diff,
           L.argmax_diff, L.max_ent_diff, L.decisions, L.flips, L.unexplained ? "no" : "yes",
           L.worst_ratio);
    for (int i = 0; i < NREQ; i++)
        CHECKF(sink.out[i].done && sink.out[i].finish != DG_FINISH_ERROR,
               "%s: request %d did not finish", name, i);
    CHECK(L.steps > 0 && L.positions > 0);
    if (gw == GPU_F32 && steps <= 2) {
        CHECKF(L.sample_diff * 1000 <= L.positions && L.argmax_diff * 1000 <= L.positions,
               "%s: fp32 samples differ at %ld, argmax at %ld of %ld positions", name,
               L.sample_diff, L.argmax_diff, L.positions);
        CHECKF(L.max_ent_diff <= 1e-3, "%s: fp32 entropies differ by %.3g", name,
               L.max_ent_diff);
        CHECKF(L.unexplained == 0, "%s: %ld acceptance decisions differ away from a tie", name,
               L.unexplained);
    }
    return 0;
}

static int run_model(const char *dir, const char *name)
{
    static const int plen[NREQ] = {21, 70, 5, 130};
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct gt_sink *cpu = calloc(1, sizeof *cpu), *f32 = calloc(1, sizeof *f32);
    struct gt_sink *b16 = calloc(1, sizeof *b16), *alone = calloc(1, sizeof *alone);
    char what[128];
    int max_tokens;

    CHECK(cpu && f32 && b16 && alone);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    max_tokens = 2 * m.cfg.canvas_length; /* two canvases: a commit between them */
    /* two steps a canvas: one self-conditioned step on a fresh condition,
     * no chain: the fp32 GPU must produce the CPU's ids */
    CHECK(generate(CPU, &ck, &m, plen, 0, NREQ, max_tokens, 2, cpu) == 0);
    CHECK(generate(GPU_F32, &ck, &m, plen, 0, NREQ, max_tokens, 2, f32) == 0);
    snprintf(what, sizeof what, "%s f32 gpu vs cpu, 2 steps a canvas", name);
    CHECKF(gt_compare(what, f32, cpu, NREQ) == 0, "%s: the ids differ", what);
    CHECK(lockstep_run(&ck, &m, plen, GPU_F32, 2, name) == 0);
    /* six steps: chains of self-conditioning, which these random models
     * amplify (case_sc_chain): shown */
    CHECK(generate(CPU, &ck, &m, plen, 0, NREQ, max_tokens, 6, cpu) == 0);
    CHECK(generate(GPU_F32, &ck, &m, plen, 0, NREQ, max_tokens, 6, f32) == 0);
    CHECK(generate(GPU_BF16, &ck, &m, plen, 0, NREQ, max_tokens, 6, b16) == 0);
    snprintf(what, sizeof what, "%s f32 gpu vs cpu, 6 steps a canvas (shown)", name);
    gt_compare(what, f32, cpu, NREQ);
    snprintf(what, sizeof what, "%s bf16 gpu vs cpu, 6 steps a canvas (shown)", name);
    gt_compare(what, b16, cpu, NREQ);
    CHECK(lockstep_run(&ck, &m, plen, GPU_F32, 6, name) == 0);
    CHECK(lockstep_run(&ck, &m, plen, GPU_BF16, 6, name) == 0);
    /* request 3 alone on the GPU against its run in the batch (shown: the
     * batched GEMMs may round differently, and these models amplify it) */
    CHECK(generate(GPU_BF16, &ck, &m, plen, 3, 1, max_tokens, 6, alone) == 0);
    b16->out[0] = b16->out[3];
    snprintf(what, sizeof what, "%s bf16 gpu in a batch of %d vs alone (shown)", name, NREQ);
    gt_compare(what, b16, alone, 1);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    free(cpu);
    free(f32);
    free(b16);
    free(alone);
    return 0;
}

/* One slot through the backend interface on the CPU and on the GPU (fp32
 * elements): prompt, four denoising steps each conditioned on the last
 * (a chain of self-conditioning), a commit (the CPU's an encode, the
 * GPU's appended to the next step: one pass), two steps of the next canvas
 * (one with top-p 0.9, one with top-k 20): every sample and argmax equal,
 * entropies within 1e-3 on the steps with no condition or a condition of a
 * first step; deeper in the chain, shown. */
static int backend_steps(const char *dir, const char *name)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct dg_backend *b[2];
    int32_t prompt[80], canvas[64], sample[2][64], argmax[2][64], committed[64];
    float ent[2][64];
    int CL, which = 0, bad = 0;

    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    CL = m.cfg.canvas_length;
    CHECK(CL <= 64);
    CHECK(80 + 2 * CL <= 80 + 128);
    CHECK_OK(make_backend(CPU, &m, 1, &b[0], &err), &err);
    CHECK_OK(make_backend(GPU_F32, &m, 1, &b[1], &err), &err);
    gt_seed(9);
    for (int t = 0; t < 80; t++)
        prompt[t] = (int32_t)(gt_next() % (uint64_t)m.cfg.vocab_size);
    for (int k = 0; k < 2; k++) {
        struct dg_encode_item it = {0, prompt, 80};
        CHECK_OK(b[k]->ops->slot_open(b[k], 0, 80 + 2 * CL, CL, &err), &err);
        CHECK_OK(b[k]->ops->encode(b[k], &it, 1, &err), &err);
    }
    for (int step = 0; step < 6; step++) {
        for (int t = 0; t < CL; t++)
            canvas[t] = (int32_t)(gt_next() % (uint64_t)m.cfg.vocab_size);
        for (int k = 0; k < 2; k++) {
            struct dg_denoise_item it;
            memset(&it, 0, sizeof it);
            it.slot = 0;
            it.canvas = canvas;
            it.cl = CL;
            it.self_cond = step != 0 && step != 4; /* a chain of SC steps per canvas */
            it.temperature = 0.7f;
            /* the filters on the checked steps of the second canvas: their
             * thresholds come from the host (cuda-backend.h) */
            it.top_p = step == 4 ? 0.9f : 1.0f;
            it.top_k = step == 5 ? 20 : 0;
            it.seed = 99;
            it.canvas_index = (uint32_t)(step / 4);
            it.step = (uint32_t)step;
            it.sample = sample[k];
            it.argmax = argmax[k];
            it.entropy = ent[k];
            if (step == 4 && k == 1) {
                it.append = committed;
                it.n_append = CL;
            }
            CHECK_OK(b[k]->ops->denoise(b[k], &it, 1, &err), &err);
            CHECKF(b[k]->ops->slot_length(b[k], 0) == 80 + (step >= 4 ? CL : 0),
                   "%s: backend %d: %lld tokens cached after step %d", name, k,
                   (long long)b[k]->ops->slot_length(b[k], 0), step);
            CHECK_OK(b[k]->ops->condition(b[k], &which, 1, &err), &err);
        }
        {
            int ds = 0, da = 0;
            double de = 0;
            for (int p = 0; p < CL; p++) {
                ds += sample[0][p] != sample[1][p];
                da += argmax[0][p] != argmax[1][p];
                if (fabs((double)ent[0][p] - ent[1][p]) > de)
                    de = fabs((double)ent[0][p] - ent[1][p]);
            }
            printf("# %s backend step %d: samples differ at %d, argmax at %d of %d; "
                   "max |entropy diff| %.3g\n", name, step, ds, da, CL, de);
            /* steps 2 and 3 continue a chain: shown (case_sc_chain) */
            if (step != 2 && step != 3)
                bad += ds + da + (de > 1e-3);
        }
        if (step == 3) {
            struct dg_encode_item it = {0, committed, CL};
            memcpy(committed, sample[0], sizeof committed);
            CHECK_OK(b[0]->ops->encode(b[0], &it, 1, &err), &err);
        }
    }
    b[0]->ops->destroy(b[0]);
    b[1]->ops->destroy(b[1]);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    CHECKF(bad == 0, "%s: the backends differ", name);
    return 0;
}

/* A first step (no self-conditioning) with a filter, on the CPU and the
 * GPU (fp32 elements), from the same prompt: top-p 0.9, then top-k 20 and
 * both: samples and argmax equal, entropies within 1e-3. */
static int filter_steps(const char *dir, const char *name)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct dg_backend *b[2];
    int32_t prompt[40], canvas[64], sample[2][64], argmax[2][64];
    float ent[2][64];
    static const int ks[3] = {0, 20, 20};
    static const float ps[3] = {0.9f, 1.0f, 0.8f};
    int CL, bad = 0;

    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    CL = m.cfg.canvas_length;
    CHECK(CL <= 64);
    CHECK_OK(make_backend(CPU, &m, 1, &b[0], &err), &err);
    CHECK_OK(make_backend(GPU_F32, &m, 1, &b[1], &err), &err);
    gt_seed(21);
    for (int t = 0; t < 40; t++)
        prompt[t] = (int32_t)(gt_next() % (uint64_t)m.cfg.vocab_size);
    for (int k = 0; k < 2; k++) {
        struct dg_encode_item it = {0, prompt, 40};
        CHECK_OK(b[k]->ops->slot_open(b[k], 0, 40 + CL, CL, &err), &err);
        CHECK_OK(b[k]->ops->encode(b[k], &it, 1, &err), &err);
    }
    for (int f = 0; f < 3; f++) {
        int ds = 0, da = 0;
        double de = 0;
        for (int t = 0; t < CL; t++)
            canvas[t] = (int32_t)(gt_next() % (uint64_t)m.cfg.vocab_size);
        for (int k = 0; k < 2; k++) {
            struct dg_denoise_item it;
            memset(&it, 0, sizeof it);
            it.canvas = canvas;
            it.cl = CL;
            it.temperature = 0.7f;
            it.top_k = ks[f];
            it.top_p = ps[f];
            it.seed = 5;
            it.step = (uint32_t)f;
            it.sample = sample[k];
            it.argmax = argmax[k];
            it.entropy = ent[k];
            CHECK_OK(b[k]->ops->denoise(b[k], &it, 1, &err), &err);
        }
        for (int p = 0; p < CL; p++) {
            ds += sample[0][p] != sample[1][p];
            da += argmax[0][p] != argmax[1][p];
            if (fabs((double)ent[0][p] - ent[1][p]) > de)
                de = fabs((double)ent[0][p] - ent[1][p]);
        }
        printf("# %s first step, top-k %d top-p %g: samples differ at %d, argmax at %d of %d; "
               "max |entropy diff| %.3g (position 0: cpu %.6f gpu %.6f)\n", name, ks[f],
               (double)ps[f], ds, da, CL, de, (double)ent[0][0], (double)ent[1][0]);
        bad += ds + da + (de > 1e-3);
    }
    b[0]->ops->destroy(b[0]);
    b[1]->ops->destroy(b[1]);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    CHECKF(bad == 0, "%s: the filtered steps differ", name);
    return 0;
}

static int case_filters(void)
{
    return filter_steps("tests/golden/golden-a/checkpoint", "golden-a") ||
           filter_steps("tests/golden/golden-b/checkpoint", "golden-b");
}

static int case_backend_steps(void)
{
    return backend_steps("tests/golden/golden-a/checkpoint", "golden-a") ||
           backend_steps("tests/golden/golden-b/checkpoint", "golden-b");
}

/* The CPU alone: the golden models' self-conditioning chain (logits /
 * 0.7 fed back as SC for five steps) run twice, the second time with its
 * first logits perturbed by 1e-5 relative (the size of the fp32 GPU-CPU
 * difference): the divergence per step is printed, and it must grow by at
 * least 100x over the chain -- the amplification that makes free-running
 * sequences part on rounding-level differences. */
static int sc_chain(const char *dir, const char *name)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_cpu_model cm;
    struct dg_kv_cache kv;
    struct dg_error err = {0};
    int32_t prompt[80], canvas[64];
    float *a, *b, *sa, *sb;
    double first = 0, last = 0;
    int64_t V, CL;

    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    V = m.cfg.vocab_size;
    CL = m.cfg.canvas_length;
    CHECK(CL <= 64);
    CHECK_OK(dg_cpu_model_init(&cm, &m, &err), &err);
    CHECK_OK(dg_kv_cache_init(&kv, &m.cfg, 80 + CL, &err), &err);
    gt_seed(9);
    for (int t = 0; t < 80; t++)
        prompt[t] = (int32_t)(gt_next() % (uint64_t)V);
    CHECK_OK(dg_cpu_encode(&cm, &kv, prompt, 80, NULL, &err), &err);
    a = malloc(sizeof(float) * (size_t)(CL * V));
    b = malloc(sizeof(float) * (size_t)(CL * V));
    sa = malloc(sizeof(float) * (size_t)(CL * V));
    sb = malloc(sizeof(float) * (size_t)(CL * V));
    CHECK(a && b && sa && sb);
    for (int step = 0; step < 6; step++) {
        double num = 0, den = 0;
        for (int64_t t = 0; t < CL; t++)
            canvas[t] = (int32_t)(gt_next() % (uint64_t)V);
        CHECK_OK(dg_cpu_decode(&cm, &kv, canvas, CL, step ? sa : NULL, V, a, &err), &err);
        CHECK_OK(dg_cpu_decode(&cm, &kv, canvas, CL, step ? sb : NULL, V, b, &err), &err);
        if (step == 0)
            for (int64_t i = 0; i < CL * V; i++)
                b[i] *= 1.0f + 1e-5f * gt_uniform();
        for (int64_t i = 0; i < CL * V; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)a[i] * a[i];
            sa[i] = a[i] / 0.7f;
            sb[i] = b[i] / 0.7f;
        }
        last = sqrt(num / den);
        if (step == 0)
            first = last;
        printf("# %s cpu self-conditioning chain, step %d: logits differ by %.3g relative\n",
               name, step, last);
    }
    free(a);
    free(b);
    free(sa);
    free(sb);
    dg_kv_cache_free(&kv);
    dg_cpu_model_free(&cm);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    CHECKF(last >= 100 * first, "%s: the chain grew a %.3g perturbation to %.3g only", name,
           first, last);
    return 0;
}

static int case_sc_chain(void)
{
    return sc_chain("tests/golden/golden-a/checkpoint", "golden-a") ||
           sc_chain("tests/golden/golden-b/checkpoint", "golden-b");
}

static int case_golden_a(void)
{
    return run_model("tests/golden/golden-a/checkpoint", "golden-a");
}

static int case_golden_b(void)
{
    return run_model("tests/golden/golden-b/checkpoint", "golden-b");
}

static int case_small(void)
{
    struct dg_model_config c;
    struct dg_synth_options o;
    struct dg_synth_plan p;
    struct dg_error err = {0};
    const char *dir = test_path("small-bf16");
    dg_model_config_preset("small", &c, NULL);
    dg_synth_options_default(&o);
    o.dtype = DG_DTYPE_BF16;
    o.seed = 3;
    CHECK_OK(dg_synth_plan_build(&c, &o, &p, &err), &err);
    CHECK_OK(dg_synth_write(dir, &c, NULL, &p, &o, &err), &err);
    dg_synth_plan_free(&p);
    return run_model(dir, "small-bf16");
}

/* every canvas converged at its first step: stable without a history
 * (stability 0) and confident whatever its entropy */
static void converge_at_once(struct dg_gen_settings *s)
{
    s->stability_threshold = 0;
    s->confidence_threshold = 1e30;
}

/* The self-conditioning queued by the denoise call ahead of the condition
 * call (cuda-backend.h; the default on one GPU) against the condition
 * call's own (option condition_apart): the same kernels on the same
 * inputs, so every id of the four requests equal, bf16 and fp32, with
 * graphs and without.  Six steps a canvas: chains of self-conditioning
 * that part on any rounding (case_sc_chain), requests at different steps
 * in one batch (some items marked ahead, the ones at their step cap not);
 * and every canvas converging at its first step, each condition queued
 * ahead and never asked for (the next canvas's first step reads none). */
static int case_condition_ahead(void)
{
    static const int plen[NREQ] = {21, 70, 5, 130};
    const char *dir = "tests/golden/golden-a/checkpoint";
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct gt_sink *sink[2] = {calloc(1, sizeof(struct gt_sink)),
                               calloc(1, sizeof(struct gt_sink))};
    const enum which kinds[2] = {GPU_BF16, GPU_F32};
    int bad = 0;

    CHECK(sink[0] && sink[1]);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    for (int k = 0; k < 2; k++)
        for (int graphs = 0; graphs < 2; graphs++)
            for (int at_once = 0; at_once < 2; at_once++) {
                char what[160];
                opt_graphs = graphs;
                for (int apart = 0; apart < 2; apart++) {
                    struct dg_backend *b = NULL;
                    opt_condition_apart = apart;
                    CHECK_OK(make_backend(kinds[k], &m, NREQ, &b, &err), &err);
                    CHECK(gt_generate_with(b, &ck, &m, plen, 0, NREQ, 3 * m.cfg.canvas_length,
                                           6, at_once ? converge_at_once : NULL,
                                           sink[apart]) == 0);
                }
                snprintf(what, sizeof what, "golden-a %s%s%s: conditions ahead vs apart",
                         k ? "f32" : "bf16", graphs ? ", graphs" : "",
                         at_once ? ", converged at once" : ", 6 steps a canvas");
                bad += gt_compare(what, sink[0], sink[1], NREQ);
            }
    opt_condition_apart = opt_graphs = 0;
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    free(sink[0]);
    free(sink[1]);
    CHECKF(bad == 0, "%d generations differ with the conditions queued ahead", bad);
    return 0;
}

/* ---- the denoise calls' own GPU time (option time_steps) ----------------------- */

static struct {
    const struct dg_backend_ops *orig;
    int with;                    /* the backend has option time_steps */
    long calls, outside;         /* denoise calls; those whose time broke the contract */
    double worst_over;           /* the most a GPU time exceeded its call's host time */
} st;

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int st_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                      struct dg_error *err)
{
    const double t0 = mono_ms();
    const int rc = st.orig->denoise(b, items, n, err);
    const double host = mono_ms() - t0, own = dg_cuda_backend_step_ms(b);
    if (rc < 0)
        return rc;
    st.calls++;
    /* (the events' clock resolves about half a microsecond) */
    if (st.with ? !(own > 0 && own <= host + 0.002) : own != -1) {
        if (st.outside++ < 3)
            fprintf(stderr, "  denoise call %ld: own GPU time %.4f ms, the call %.4f ms on "
                    "the host (time_steps %d)\n", st.calls, own, host, st.with);
        if (own - host > st.worst_over)
            st.worst_over = own - host;
    }
    return rc;
}

static int case_step_time(void)
{
    static const int plen[NREQ] = {21, 70, 5, 130};
    const char *dir = "tests/golden/golden-a/checkpoint";
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct gt_sink *sink = calloc(1, sizeof(struct gt_sink));

    CHECK(sink);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    for (int with = 0; with < 2; with++)
        for (int graphs = 0; graphs < 2; graphs++)
            for (int apart = 0; apart < 2; apart++) {
                struct dg_backend *b = NULL;
                struct dg_backend_ops ops;
                opt_time_steps = with, opt_graphs = graphs, opt_condition_apart = apart;
                CHECK_OK(make_backend(GPU_BF16, &m, NREQ, &b, &err), &err);
                CHECK(dg_cuda_backend_step_ms(b) == -1);
                st.orig = b->ops;
                st.with = with;
                st.calls = st.outside = 0;
                st.worst_over = 0;
                ops = *b->ops;
                ops.denoise = st_denoise;
                b->ops = &ops;
                /* (gt_generate_with destroys the backend through its ops:
                 * the wrapper's destroy is the backend's own) */
                CHECK(gt_generate_with(b, &ck, &m, plen, 0, NREQ, 2 * m.cfg.canvas_length, 4,
                                       NULL, sink) == 0);
                printf("  time_steps %d, graphs %d, conditions %s: %ld denoise calls, %ld "
                       "outside the contract\n", with, graphs, apart ? "apart" : "ahead",
                       st.calls, st.outside);
                CHECKF(st.calls > 0 && st.outside == 0,
                       "%ld of %ld denoise calls' own GPU times outside the contract (worst "
                       "%.4f ms past its call)", st.outside, st.calls, st.worst_over);
            }
    opt_time_steps = opt_graphs = opt_condition_apart = 0;
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    free(sink);
    return 0;
}

int main(void)
{
    int rc = gt_setup("t-cuda-engine");
    if (rc)
        return rc;
    TEST_CASE(case_sc_chain);
    TEST_CASE(case_filters);
    TEST_CASE(case_backend_steps);
    TEST_CASE(case_condition_ahead);
    TEST_CASE(case_step_time);
    TEST_CASE(case_golden_a);
    TEST_CASE(case_golden_b);
    TEST_CASE(case_small);
    return test_finish();
}
