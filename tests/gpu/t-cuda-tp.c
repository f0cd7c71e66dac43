/*
 * Description: tensor parallelism over GPUs (NCCL) against one GPU, at
 * TP=2, and at TP=4 too where four GPUs are (below, TP=N is each of them);
 * with one GPU, TP=2 on it (below).
 *
 *   logits_golden: golden-a's and the "small" preset's decoder logits
 *     after a prompt, TP=N against TP=1: fp32 elements within 1e-5
 *     relative with the row argmax agreeing on >= 99% of rows; bf16
 *     against the fp32 pass as the truth, TP=N at most sqrt(N + 1) times
 *     as far from it as TP=1 and its argmax agreement at most 15% of the
 *     rows below TP=1's (compare_tp says why).
 *   logits_full: the full-size 26B-A4B shapes with random bf16 weights
 *     made on the GPUs (each rank fills only its slice with the whole
 *     model's values), prompt 128, canvas 256: TP=N against TP=1, argmax
 *     agreeing on >= 95% of rows, the distance printed (no fp32 pass to
 *     bound it by); per rank, the weights, the vocabulary rows and logits
 *     columns held (each < V) and the collectives of one decoder pass
 *     against what gathering the logits would move (printed).  Then the
 *     same with FP8 (W8A8) weights, where each rank also quantizes only
 *     the activation columns it holds, at TP=4 too (the plan splits the
 *     dense MLP's width in units of 32, DG_CUDA_WIDTH_ALIGN, so that each
 *     rank's gate/up rows fit the FP8 GEMM); and FP8 again with every
 *     expert split along its width (units of 32 too).
 *   generations: four requests through the engine (prefill chunks,
 *     self-conditioning, commits, two canvases) on the backend at TP=N and
 *     TP=1, fp32 elements, two denoising steps a canvas: every id equal;
 *     six steps (chains) and bf16 shown.
 *   rank_usage: the backend at TP=2 reports per rank a vocabulary slice
 *     and logits rows narrower than V, and collectives issued.
 *   watchdog: rank 1 skips a denoising step, so rank 0 waits in its first
 *     all-reduce: the call fails with a watchdog error within the timeout
 *     plus the abort's grace; the next call rebuilds the group and gives
 *     the same outputs as the step before the fault.
 *   graphs_equal_eager: at TP=1 and TP=N, golden-a (fp32) and the small
 *     preset (bf16): a backend with CUDA graphs and one without, the same
 *     calls (prompt chunks, chains of self-conditioned steps, a commit, a
 *     slot closed and opened again, a bucket whose graph went stale when
 *     the row buffers grew: captured again at its next step, not run
 *     eagerly first): every sample, argmax and entropy equal bit for bit;
 *     graphs made and replayed on every rank.
 *   refusals: golden-b's 6 query heads over 3 KV heads cannot split in 2
 *     whole KV groups: a clear error; tp larger than the GPUs: an error.
 *   start_failure: at TP=2 one rank fails after making its stream and
 *     before joining the NCCL group (option fault_start_rank), rank 0 and
 *     then rank 1: creation returns that rank's error within 120 s instead
 *     of the other rank waiting in ncclCommInitRank for good.  With one
 *     GPU both ranks are on it (no group is ever formed).
 * Under compute-sanitizer (DG_MEMCHECK) the full-size case and the
 * watchdog are left out.  With one GPU, TP=2 puts both ranks on it and
 * their collectives go through host meetings and copies on that GPU
 * instead of NCCL (nccl.h, a group on one shared GPU; the backend's
 * option shared_gpu): every case runs so but graphs_equal_eager at TP=2
 * (such a group runs eagerly), and NCCL itself is not exercised; exit 77
 * without a GPU.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cuda-backend.h"
#include "kernels/cuda-forward.h"
#include "kernels/cuda-model.h"
#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/nccl.h"
#include "lib/checkpoint.h"
#include "lib/engine.h"
#include "lib/gen-settings.h"
#include "lib/model-config.h"
#include "lib/model-synth.h"
#include "lib/model-weights.h"
#include "lib/tp-plan.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define MAXR 8
#define ARGMAX_BOUND 0.99

/* The TPs compared with TP=1: 2, and 4 where four GPUs are (main). */
static int tp_list[2] = {2}, n_tp_list = 1;

/* With one GPU: every rank on it, the collectives without NCCL
 * (nccl.h: a group on one shared GPU; the backend's option shared_gpu,
 * which runs eagerly). */
static int shared;

/* ---- one decoder pass at TP=n, rank threads of this process --------------------- */

struct tp_pass {
    /* in */
    const struct dg_model *m;           /* a checkpoint, or NULL for: */
    const struct dg_model_config *cfg;  /*   random weights of this shape */
    uint64_t seed;
    int fp8;                            /*   FP8 (W8A8) projections and experts, else bf16 */
    enum dg_expert_split experts;       /* experts across ranks (0) or along their width */
    enum dg_elt elt;
    int n;
    struct dg_tp_plan plan;
    struct dg_nccl_id id;
    struct dg_nccl_shared *shared;      /* with one GPU: the ranks' group on it */
    const int32_t *prompt, *canvas;
    int64_t P, CL;
    /* out */
    float *logits;                      /* [CL, V] host, assembled from the ranks' columns */
    struct dg_nccl *nccl[MAXR];
    int rc[MAXR];
    struct dg_error err[MAXR];
    uint64_t weights[MAXR], kv[MAXR], scratch[MAXR], used[MAXR];
    int64_t nv[MAXR];
    struct dg_coll_stats decode_coll[MAXR]; /* the decoder pass's collectives alone */
};

struct tp_arg {
    struct tp_pass *p;
    int r;
};

static void *tp_rank(void *arg)
{
    struct tp_arg *a = arg;
    struct tp_pass *p = a->p;
    const int r = a->r;
    struct dg_error *err = &p->err[r];
    struct dg_cuda_model cm;
    struct dg_cuda_ctx cx;
    struct dg_cuda_kv kv;
    struct dg_cuda_seq seq;
    float *d_logits = NULL, *h = NULL;
    const int64_t V = p->cfg->vocab_size;
    const int dev = shared ? 0 : r;
    int rc;

    memset(&cm, 0, sizeof cm);
    memset(&cx, 0, sizeof cx);
    memset(&kv, 0, sizeof kv);
    if ((rc = dg_cuda_use(dev, err)) < 0)
        goto out;
    rc = p->m ? dg_cuda_model_upload_rank(&cm, p->m, p->elt, &p->plan, r, dev, err)
              : dg_cuda_model_random_q_rank(&cm, p->cfg, p->seed, p->fp8, &p->plan, r, dev, err);
    if (rc < 0)
        goto out;
    if ((rc = dg_cuda_ctx_init(&cx, &cm, err)) < 0)
        goto out;
    if (p->n > 1) {
        if ((rc = shared ? dg_nccl_init_shared(&p->nccl[r], p->shared, r, dev, cx.stream, err)
                         : dg_nccl_init(&p->nccl[r], &p->id, p->n, r, dev, cx.stream, err)) < 0)
            goto out;
        cx.nccl = p->nccl[r];
    }
    if ((rc = dg_cuda_kv_init(&kv, &cm, p->P + p->CL, (int)p->CL, err)) < 0)
        goto out;
    seq = (struct dg_cuda_seq){&kv, p->prompt, p->P, NULL};
    if ((rc = dg_cuda_encode(&cx, &seq, 1, err)) < 0)
        goto out;
    if ((rc = dg_cuda_alloc((void **)&d_logits,
                            sizeof(float) * (size_t)(dg_cuda_bucket(p->CL) * cm.nv), dev, err)) < 0)
        goto out;
    {
        const struct dg_coll_stats before =
            p->nccl[r] ? dg_nccl_coll(p->nccl[r])->stats : (struct dg_coll_stats){{0}, {0}};
        seq = (struct dg_cuda_seq){&kv, p->canvas, p->CL, NULL};
        if ((rc = dg_cuda_decode(&cx, &seq, 1, d_logits, err)) < 0)
            goto out;
        if (p->nccl[r])
            for (int k = 0; k < DG_COLL_KINDS; k++) {
                p->decode_coll[r].calls[k] =
                    dg_nccl_coll(p->nccl[r])->stats.calls[k] - before.calls[k];
                p->decode_coll[r].bytes[k] =
                    dg_nccl_coll(p->nccl[r])->stats.bytes[k] - before.bytes[k];
            }
    }
    h = malloc(sizeof(float) * (size_t)(p->CL * cm.nv));
    if (!h) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = dg_cuda_stream_sync(cx.stream, dev, err)) < 0 ||
        (rc = dg_cuda_download(h, d_logits, sizeof(float) * (size_t)(p->CL * cm.nv), dev, err)) < 0)
        goto out;
    for (int64_t t = 0; t < p->CL; t++)
        memcpy(p->logits + t * V + cm.v0, h + t * cm.nv, sizeof(float) * (size_t)cm.nv);
    p->weights[r] = cm.bytes;
    p->kv[r] = kv.bytes;
    p->scratch[r] = cx.scratch_bytes;
    p->nv[r] = cm.nv;
    {
        size_t fr = 0, tot = 0;
        if (dg_cuda_mem_info(&fr, &tot, dev, err) == 0)
            p->used[r] = (uint64_t)(tot - fr);
    }
out:
    if (rc < 0 && p->n > 1)
        for (int q = 0; q < p->n; q++)
            dg_nccl_abort(p->nccl[q]);
    p->rc[r] = rc;
    free(h);
    dg_cuda_free(d_logits);
    dg_cuda_kv_free(&kv);
    if (p->nccl[r]) {
        dg_nccl_free(p->nccl[r]);
        p->nccl[r] = NULL;
    }
    cx.nccl = NULL;
    dg_cuda_ctx_free(&cx);
    dg_cuda_model_free(&cm);
    return NULL;
}

/* p's plan and group for p->n ranks, a thread a rank (tp_rank) started
 * and joined: each rank's result in p->rc and p->err.  0, or a failed
 * check of the set-up. */
static int tp_spawn(struct tp_pass *p)
{
    pthread_t th[MAXR];
    struct tp_arg args[MAXR];
    struct dg_error err = {0};
    memset(p->nccl, 0, sizeof p->nccl);
    memset(p->decode_coll, 0, sizeof p->decode_coll);
    CHECK_OK(dg_tp_plan_build_aligned(p->cfg, p->n, p->experts, 1, DG_CUDA_WIDTH_ALIGN,
                                      &p->plan, &err),
             &err);
    if (p->n > 1 && !shared)
        CHECK_OK(dg_nccl_get_id(&p->id, &err), &err);
    p->shared = NULL;
    if (p->n > 1 && shared)
        CHECK_OK(dg_nccl_shared_create(p->n, &p->shared, &err), &err);
    for (int r = 0; r < p->n; r++) {
        args[r] = (struct tp_arg){p, r};
        CHECK(pthread_create(&th[r], NULL, tp_rank, &args[r]) == 0);
    }
    for (int r = 0; r < p->n; r++)
        pthread_join(th[r], NULL);
    dg_nccl_shared_free(p->shared);
    p->shared = NULL;
    return 0;
}

/* Run p over p->n GPUs (0 .. n-1); 0 or the first rank's failure printed. */
static int tp_run(struct tp_pass *p)
{
    CHECK(tp_spawn(p) == 0);
    for (int r = 0; r < p->n; r++)
        CHECKF(p->rc[r] == 0, "rank %d of %d: %s", r, p->n, p->err[r].msg);
    return 0;
}

/* Bounds.  fp32 elements: TP=n's logits within FP32_BOUND of TP=1's,
 * relative, and the row argmax the same on ARGMAX_BOUND of the rows.
 * bf16: on these random models one bf16 rounding moves the logits by
 * tens of percent (golden-a's bf16 pass is 30% from its fp32 pass, run
 * 242), so bf16 is bounded against the fp32 pass as the truth.  Where
 * TP=1 rounds the attention output once, TP=n rounds each rank's partial
 * sum and then their sum: n + 1 roundings of about the same size, which
 * add in quadrature, so TP=n's distance from the truth is at most
 * sqrt(n + 1) times TP=1's (less, as the roundings both share count too).
 * The argmax then agrees with the truth's on at most ARGMAX_SLACK of the
 * rows fewer than TP=1's does (TP=1 bf16 itself misses about a fifth;
 * run 247 saw TP=4 miss 4 of 32 more on the small preset, 0.244 from the
 * truth against TP=1's 0.153, 1.59 times, within sqrt 5).
 * The full-size model has no fp32 pass (its weights would need 94 GB):
 * its TP=n logits are compared with TP=1's by argmax alone, FULL_ARGMAX
 * of the rows (a near tie in a router's top-K picks another expert for a
 * row, so a few rows move far), the distance printed. */
#define FP32_BOUND 1e-5
#define ARGMAX_SLACK 0.15
#define FULL_ARGMAX 0.95

/* p at TP=n into logits (CL x V, poisoned first: every column must be
 * written by some rank); the per-rank lines printed with show_memory. */
static int pass_at(const char *what, struct tp_pass *p, int n, float *logits, int show_memory)
{
    const int64_t V = p->cfg->vocab_size;
    for (int64_t i = 0; i < p->CL * V; i++)
        logits[i] = NAN;
    p->n = n;
    p->logits = logits;
    CHECK(tp_run(p) == 0);
    for (int r = 0; r < n && n > 1; r++) {
        const struct dg_coll_stats *s = &p->decode_coll[r];
        if (show_memory)
            printf("# %s TP=%d rank %d: weights %.2f GiB, KV %.1f MiB, scratch %.1f MiB, GPU used "
                   "%.2f GiB; vocabulary rows and logits columns %lld of %lld\n", what, n, r,
                   (double)p->weights[r] / (1 << 30), (double)p->kv[r] / (1 << 20),
                   (double)p->scratch[r] / (1 << 20), (double)p->used[r] / (1 << 30),
                   (long long)p->nv[r], (long long)V);
        printf("# %s TP=%d rank %d: one decoder pass over %lld positions: %llu all-reduces, "
               "%.2f MiB; the logits all-gather it replaces would send %.2f MiB\n", what, n, r,
               (long long)p->CL, (unsigned long long)s->calls[DG_COLL_ALL_REDUCE],
               (double)s->bytes[DG_COLL_ALL_REDUCE] / (1 << 20),
               (double)(p->CL * p->nv[r]) * 4 / (1 << 20));
        CHECKF(p->nv[r] < V, "rank %d holds %lld of %lld vocabulary rows", r,
               (long long)p->nv[r], (long long)V);
        CHECK(s->calls[DG_COLL_ALL_REDUCE] == 2 * (uint64_t)p->cfg->num_layers + 1);
    }
    return 0;
}

/* The same pass at TP=1 and TP=n (p->elt), bounded as above; with
 * p->elt bf16 and have_f32, the fp32 pass is the truth. */
static int compare_tp(const char *what, struct tp_pass *p, int n, int have_f32, int show_memory)
{
    const int64_t V = p->cfg->vocab_size, CL = p->CL;
    const enum dg_elt elt = p->elt;
    float *one = malloc(sizeof(float) * (size_t)(CL * V));
    float *two = malloc(sizeof(float) * (size_t)(CL * V));
    float *truth = elt == DG_ELT_BF16 && have_f32 ? malloc(sizeof(float) * (size_t)(CL * V)) : NULL;
    int64_t agree;
    double e;
    CHECK(one && two && (truth || elt != DG_ELT_BF16 || !have_f32));
    CHECK(pass_at(what, p, 1, one, show_memory) == 0);
    if (show_memory)
        printf("# %s TP=1: weights %.2f GiB, KV %.1f MiB, scratch %.1f MiB, GPU used %.2f GiB\n",
               what, (double)p->weights[0] / (1 << 30), (double)p->kv[0] / (1 << 20),
               (double)p->scratch[0] / (1 << 20), (double)p->used[0] / (1 << 30));
    CHECK(pass_at(what, p, n, two, show_memory) == 0);
    e = gt_rel_err(two, one, CL, V, &agree);
    printf("# %s: TP=%d vs TP=1 logits: relative error %.3g, row argmax agree %lld/%lld\n", what,
           n, e, (long long)agree, (long long)CL);
    if (elt == DG_ELT_F32) {
        CHECKF(e <= FP32_BOUND, "%s TP=%d: relative error %.3g > %.3g", what, n, e, FP32_BOUND);
        CHECKF((double)agree >= ARGMAX_BOUND * (double)CL, "%s TP=%d: argmax agrees on %lld of "
               "%lld", what, n, (long long)agree, (long long)CL);
    } else if (!truth) {
        CHECKF((double)agree >= FULL_ARGMAX * (double)CL, "%s TP=%d: argmax agrees on %lld of "
               "%lld", what, n, (long long)agree, (long long)CL);
    } else {
        int64_t agree1, agree_n;
        double e1, e_n;
        p->elt = DG_ELT_F32;
        CHECK(pass_at(what, p, 1, truth, 0) == 0);
        p->elt = elt;
        e1 = gt_rel_err(one, truth, CL, V, &agree1);
        e_n = gt_rel_err(two, truth, CL, V, &agree_n);
        printf("# %s: against the fp32 pass: TP=1 %.3g (argmax %lld/%lld), TP=%d %.3g (%lld/%lld)"
               "\n", what, e1, (long long)agree1, (long long)CL, n, e_n, (long long)agree_n,
               (long long)CL);
        CHECKF(e_n <= sqrt(n + 1.0) * e1, "%s TP=%d: %.3g from the fp32 pass, TP=1 %.3g", what,
               n, e_n, e1);
        CHECKF((double)agree_n >= (double)agree1 - ARGMAX_SLACK * (double)CL,
               "%s TP=%d: argmax with the fp32 pass on %lld rows, TP=1 on %lld", what, n,
               (long long)agree_n, (long long)agree1);
    }
    free(one);
    free(two);
    free(truth);
    return 0;
}

static int golden_logits(const char *dir, const char *name, enum dg_elt elt)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct tp_pass p;
    int32_t prompt[80], canvas[64];
    char what[96];
    memset(&p, 0, sizeof p);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    p.m = &m;
    p.cfg = &m.cfg;
    p.elt = elt;
    p.P = 70;
    p.CL = m.cfg.canvas_length < 64 ? m.cfg.canvas_length : 64;
    gt_rand_ids(prompt, p.P, m.cfg.vocab_size, 5);
    gt_rand_ids(canvas, p.CL, m.cfg.vocab_size, 6);
    p.prompt = prompt;
    p.canvas = canvas;
    snprintf(what, sizeof what, "%s %s", name, elt == DG_ELT_F32 ? "fp32" : "bf16");
    for (int i = 0; i < n_tp_list; i++)
        CHECK(compare_tp(what, &p, tp_list[i], 1, 0) == 0);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

static const char *small_bf16(void)
{
    static int made;
    struct dg_model_config c;
    struct dg_synth_options o;
    struct dg_synth_plan p;
    struct dg_error err = {0};
    const char *dir = test_path("small-bf16");
    if (made)
        return dir;
    dg_model_config_preset("small", &c, NULL);
    dg_synth_options_default(&o);
    o.dtype = DG_DTYPE_BF16;
    o.seed = 3;
    if (dg_synth_plan_build(&c, &o, &p, &err) < 0 || dg_synth_write(dir, &c, NULL, &p, &o, &err) < 0) {
        fprintf(stderr, "# small model: %s\n", err.msg);
        return NULL;
    }
    dg_synth_plan_free(&p);
    made = 1;
    return dir;
}

static int case_logits_golden(void)
{
    const char *small = small_bf16();
    CHECK(small);
    CHECK(golden_logits("tests/golden/golden-a/checkpoint", "golden-a", DG_ELT_F32) == 0);
    CHECK(golden_logits("tests/golden/golden-a/checkpoint", "golden-a", DG_ELT_BF16) == 0);
    CHECK(golden_logits(small, "small", DG_ELT_F32) == 0);
    CHECK(golden_logits(small, "small", DG_ELT_BF16) == 0);
    return 0;
}

static int case_logits_full(void)
{
    struct dg_model_config cfg;
    struct dg_error err = {0};
    struct tp_pass p;
    int32_t *prompt = malloc(sizeof(int32_t) * 128), *canvas = malloc(sizeof(int32_t) * 256);
    size_t fr = 0, tot = 0;
    CHECK(prompt && canvas);
    if (getenv("DG_MEMCHECK")) {
        free(prompt);
        free(canvas);
        return test_skip("under compute-sanitizer (50 GB of weights)");
    }
    CHECK_OK(dg_model_config_preset("26b", &cfg, &err), &err);
    CHECK_OK(dg_cuda_mem_info(&fr, &tot, 0, &err), &err);
    if (fr < ((size_t)60 << 30)) {
        free(prompt);
        free(canvas);
        return test_skip("%.1f GiB free on GPU 0; the full-size model needs 60",
                         (double)fr / (1 << 30));
    }
    memset(&p, 0, sizeof p);
    p.cfg = &cfg;
    p.seed = 1;
    p.elt = DG_ELT_BF16;
    p.P = 128;
    p.CL = 256;
    gt_rand_ids(prompt, p.P, cfg.vocab_size, 7);
    gt_rand_ids(canvas, p.CL, cfg.vocab_size, 8);
    p.prompt = prompt;
    p.canvas = canvas;
    for (int i = 0; i < n_tp_list; i++)
        CHECK(compare_tp("26B-A4B random", &p, tp_list[i], 0, 1) == 0);
    /* (at TP=4 the dense MLP's 2,112 split as 512, 544, 512, 544: gate/up
     * rows a multiple of 64, as the FP8 GEMM needs; 528 each would be
     * refused) */
    p.fp8 = 1;
    for (int i = 0; i < n_tp_list; i++)
        CHECK(compare_tp("26B-A4B random FP8", &p, tp_list[i], 0, 1) == 0);
    /* every expert split along its width (704 at TP=4: 160, 192, 160,
     * 192; 176 each would not fit the FP8 GEMM either) */
    p.experts = DG_EXPERTS_WIDTH;
    for (int i = 0; i < n_tp_list; i++)
        CHECK(compare_tp("26B-A4B random FP8, experts along their width", &p, tp_list[i], 0,
                         0) == 0);
    free(prompt);
    free(canvas);
    return 0;
}

/* ---- through the backend ------------------------------------------------------------ */

#define NREQ GT_NREQ

static int make_backend(const struct dg_model *m, int tp, int fp32, int timeout_ms,
                        struct dg_backend **b, struct dg_error *err)
{
    struct dg_cuda_backend_options o;
    memset(&o, 0, sizeof o);
    o.n_ranks = tp;
    o.max_slots = NREQ;
    o.model = m;
    o.fp32 = fp32;
    o.pin = 1;
    o.timeout_ms = timeout_ms;
    o.shared_gpu = shared && tp > 1;
    return dg_cuda_backend_create(&o, b, err);
}

/* Four requests (prompts of 21, 70, 5, 130 random ids, seeds 42 + i,
 * gt_generate) on the backend at TP=tp, two canvases each. */
static int generate(const struct dg_checkpoint *ck, const struct dg_model *m, int tp, int fp32,
                    int steps, struct gt_sink *sink)
{
    static const int plen[NREQ] = {21, 70, 5, 130};
    struct dg_backend *b = NULL;
    struct dg_error err = {0};
    CHECK_OK(make_backend(m, tp, fp32, 60000, &b, &err), &err);
    return gt_generate(b, ck, m, plen, 0, NREQ, 2 * m->cfg.canvas_length, steps, sink);
}

static int case_generations(void)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct gt_sink *one = calloc(1, sizeof *one), *two = calloc(1, sizeof *two);
    const char *small = small_bf16();
    CHECK(one && two && small);
    char what[96];
    CHECK_OK(dg_model_load("tests/golden/golden-a/checkpoint", &ck, &m, &err), &err);
    CHECK(generate(&ck, &m, 1, 1, 2, one) == 0);
    for (int i = 0; i < n_tp_list; i++) {
        snprintf(what, sizeof what, "golden-a fp32, 2 steps a canvas, TP=%d vs TP=1", tp_list[i]);
        CHECK(generate(&ck, &m, tp_list[i], 1, 2, two) == 0);
        CHECKF(gt_compare(what, two, one, NREQ) == 0, "%s: the generations differ", what);
    }
    /* chains of self-conditioning amplify rounding (t-cuda-engine's
     * sc_chain): shown */
    CHECK(generate(&ck, &m, 1, 1, 6, one) == 0);
    for (int i = 0; i < n_tp_list; i++) {
        snprintf(what, sizeof what, "golden-a fp32, 6 steps a canvas, TP=%d vs TP=1 (shown)",
                 tp_list[i]);
        CHECK(generate(&ck, &m, tp_list[i], 1, 6, two) == 0);
        gt_compare(what, two, one, NREQ);
    }
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    CHECK_OK(dg_model_load(small, &ck, &m, &err), &err);
    CHECK(generate(&ck, &m, 1, 0, 2, one) == 0);
    for (int i = 0; i < n_tp_list; i++) {
        snprintf(what, sizeof what, "small bf16, 2 steps a canvas, TP=%d vs TP=1 (shown)",
                 tp_list[i]);
        CHECK(generate(&ck, &m, tp_list[i], 0, 2, two) == 0);
        gt_compare(what, two, one, NREQ);
    }
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    free(one);
    free(two);
    return 0;
}

/* One slot: a prompt, then denoising steps of one canvas. */
struct one_slot {
    int32_t prompt[40], canvas[64];
    int32_t sample[64], argmax[64];
    float entropy[64];
    struct dg_denoise_item it;
};

static void one_slot_item(struct one_slot *s, const struct dg_model_config *c)
{
    const int cl = c->canvas_length < 64 ? c->canvas_length : 64;
    memset(&s->it, 0, sizeof s->it);
    s->it.slot = 0;
    s->it.canvas = s->canvas;
    s->it.cl = cl;
    s->it.temperature = 1.0f;
    s->it.top_p = 1.0f;
    s->it.seed = 9;
    s->it.sample = s->sample;
    s->it.argmax = s->argmax;
    s->it.entropy = s->entropy;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int case_rank_usage_and_watchdog(void)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct dg_backend *b = NULL;
    struct one_slot s;
    struct dg_encode_item enc;
    int32_t first_sample[64], first_argmax[64];
    const int timeout = 3000;
    double t0, took;
    int rc;

    if (getenv("DG_MEMCHECK"))
        return test_skip("under compute-sanitizer (the watchdog aborts NCCL on purpose)");
    CHECK_OK(dg_model_load("tests/golden/golden-a/checkpoint", &ck, &m, &err), &err);
    CHECK_OK(make_backend(&m, 2, 1, timeout, &b, &err), &err);
    gt_rand_ids(s.prompt, 40, m.cfg.vocab_size, 11);
    gt_rand_ids(s.canvas, 64, m.cfg.vocab_size, 12);
    one_slot_item(&s, &m.cfg);
    CHECK_OK(b->ops->slot_open(b, 0, 40 + 2 * s.it.cl, s.it.cl, &err), &err);
    enc = (struct dg_encode_item){0, s.prompt, 40};
    CHECK_OK(b->ops->encode(b, &enc, 1, &err), &err);
    CHECK_OK(b->ops->denoise(b, &s.it, 1, &err), &err);
    memcpy(first_sample, s.sample, sizeof first_sample);
    memcpy(first_argmax, s.argmax, sizeof first_argmax);
    for (int r = 0; r < 2; r++) {
        struct dg_cuda_rank_usage u;
        CHECK(dg_cuda_backend_rank_usage(b, r, &u) == 0);
        printf("# golden-a TP=2 backend rank %d (GPU %d): vocabulary rows %lld, logits columns "
               "%lld of %lld; weights %.1f KiB (embedding %.1f KiB); KV %.1f KiB; scratch %.1f "
               "KiB; %llu all-reduces, %llu all-gathers so far\n", r, u.device,
               (long long)u.vocab_rows, (long long)u.logits_cols, (long long)m.cfg.vocab_size,
               (double)u.weights / 1024, (double)u.embedding / 1024, (double)u.kv / 1024,
               (double)u.scratch / 1024, (unsigned long long)u.coll.calls[DG_COLL_ALL_REDUCE],
               (unsigned long long)u.coll.calls[DG_COLL_ALL_GATHER]);
        CHECK(u.vocab_rows < m.cfg.vocab_size && u.logits_cols < m.cfg.vocab_size);
        CHECK(u.coll.calls[DG_COLL_ALL_REDUCE] > 0 && u.coll.calls[DG_COLL_ALL_GATHER] > 0);
    }
    CHECK(dg_cuda_backend_ranks(b) == 2);
    /* a lost rank: the other waits in its collective until the watchdog */
    dg_cuda_backend_inject_skip(b, 1);
    t0 = now_ms();
    rc = b->ops->denoise(b, &s.it, 1, &err);
    took = now_ms() - t0;
    printf("# watchdog: the step failed after %.0f ms (timeout %d ms): %s\n", took, timeout,
           err.msg);
    CHECKF(rc == -DG_E_NCCL && strstr(err.msg, "watchdog"), "rc %d: %s", rc, err.msg);
    CHECK(took >= timeout * 0.9 && took < timeout + 12000);
    CHECK(!dg_cuda_backend_failed(b) && !b->ops->failure(b));
    /* the group is rebuilt; the slot's cache was not touched */
    memset(s.sample, 0xff, sizeof s.sample);
    CHECK_OK(b->ops->denoise(b, &s.it, 1, &err), &err);
    CHECK(!memcmp(s.sample, first_sample, sizeof(int32_t) * (size_t)s.it.cl));
    CHECK(!memcmp(s.argmax, first_argmax, sizeof(int32_t) * (size_t)s.it.cl));
    CHECK_OK(b->ops->condition(b, (int[]){0}, 1, &err), &err);
    s.it.self_cond = 1;
    s.it.step = 1;
    CHECK_OK(b->ops->denoise(b, &s.it, 1, &err), &err);
    b->ops->destroy(b);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

/* ---- graphs against eager -------------------------------------------------------- */

#define GSLOTS 2

/* The same calls on two backends (graphs on, off); every output compared
 * bit for bit. */
struct twin {
    struct dg_backend *b[2];
    int cl;
    int32_t prompt[GSLOTS][40], canvas[GSLOTS][64];
    int32_t sample[2][GSLOTS][64], argmax[2][GSLOTS][64];
    float entropy[2][GSLOTS][64];
    int steps;
};

static int twin_encode(struct twin *w, const int32_t (*ids)[64], int n, int which_slots)
{
    struct dg_error err = {0};
    struct dg_encode_item it[GSLOTS];
    int k = 0;
    for (int s = 0; s < GSLOTS; s++)
        if (which_slots & (1 << s))
            it[k++] = (struct dg_encode_item){s, ids ? ids[s] : w->prompt[s], n};
    for (int b = 0; b < 2; b++)
        CHECK_OK(w->b[b]->ops->encode(w->b[b], it, k, &err), &err);
    return 0;
}

static int twin_denoise(struct twin *w, int step, int self_cond)
{
    struct dg_error err = {0};
    for (int b = 0; b < 2; b++) {
        struct dg_denoise_item it[GSLOTS];
        const int which[GSLOTS] = {0, 1};
        for (int s = 0; s < GSLOTS; s++) {
            memset(&it[s], 0, sizeof it[s]);
            it[s].slot = s;
            it[s].canvas = w->canvas[s];
            it[s].cl = w->cl;
            it[s].self_cond = self_cond;
            it[s].temperature = 0.9f;
            it[s].top_p = 1.0f;
            it[s].seed = 100 + (uint64_t)s;
            it[s].step = (uint32_t)step;
            it[s].sample = w->sample[b][s];
            it[s].argmax = w->argmax[b][s];
            it[s].entropy = w->entropy[b][s];
        }
        CHECK_OK(w->b[b]->ops->denoise(w->b[b], it, GSLOTS, &err), &err);
        CHECK_OK(w->b[b]->ops->condition(w->b[b], which, GSLOTS, &err), &err);
    }
    for (int s = 0; s < GSLOTS; s++) {
        CHECKF(!memcmp(w->sample[0][s], w->sample[1][s], sizeof(int32_t) * (size_t)w->cl) &&
                   !memcmp(w->argmax[0][s], w->argmax[1][s], sizeof(int32_t) * (size_t)w->cl) &&
                   !memcmp(w->entropy[0][s], w->entropy[1][s], sizeof(float) * (size_t)w->cl),
               "step %d slot %d: graphs and eager differ", step, s);
        /* the next canvas state: the samples */
        memcpy(w->canvas[s], w->sample[0][s], sizeof(int32_t) * (size_t)w->cl);
    }
    w->steps++;
    return 0;
}

/* golden-a (fp32 elements) or the small preset (bf16) at TP=tp: prompts,
 * a chain of self-conditioned steps, a commit, steps of the next canvas,
 * a slot closed and opened again (new caches: the graphs stay valid, the
 * tables on the device name the new ones), a bucket whose graph went
 * stale (captured again at once): every output of the backend
 * with graphs equal to the one without, bit for bit, and the graphs made
 * and replayed on every rank. */
static int graphs_run(const char *dir, const char *name, int tp, int fp32)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct twin *w = calloc(1, sizeof *w);
    int64_t maxp;
    CHECK(w);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    for (int b = 0; b < 2; b++) {
        struct dg_cuda_backend_options o;
        memset(&o, 0, sizeof o);
        o.n_ranks = tp;
        o.max_slots = GSLOTS;
        o.model = &m;
        o.fp32 = fp32;
        o.timeout_ms = 60000;
        o.graphs = b == 0;
        CHECK_OK(dg_cuda_backend_create(&o, &w->b[b], &err), &err);
    }
    w->cl = m.cfg.canvas_length < 32 ? m.cfg.canvas_length : 32;
    maxp = 4 * 40 + 4 * w->cl; /* slot 0: four prompt chunks, a commit, steps */
    for (int s = 0; s < GSLOTS; s++) {
        gt_rand_ids(w->prompt[s], 40, m.cfg.vocab_size, 300 + (uint64_t)s);
        gt_rand_ids(w->canvas[s], 64, m.cfg.vocab_size, 400 + (uint64_t)s);
        for (int b = 0; b < 2; b++)
            CHECK_OK(w->b[b]->ops->slot_open(w->b[b], s, maxp, w->cl, &err), &err);
    }
    /* prompt chunks: the same bucket three times (eager, captured, replayed) */
    for (int k = 0; k < 3; k++)
        CHECK(twin_encode(w, NULL, 40, 3) == 0);
    for (int step = 0; step < 4; step++)
        CHECK(twin_denoise(w, step, step > 0) == 0);
    CHECK(twin_encode(w, (const int32_t(*)[64])w->canvas, w->cl, 3) == 0); /* commit */
    for (int step = 0; step < 2; step++)
        CHECK(twin_denoise(w, step, step > 0) == 0);
    /* slot 1 anew: new caches behind the same graphs */
    for (int b = 0; b < 2; b++) {
        w->b[b]->ops->slot_close(w->b[b], 1);
        CHECK_OK(w->b[b]->ops->slot_open(w->b[b], 1, maxp, w->cl, &err), &err);
    }
    CHECK(twin_encode(w, NULL, 40, 2) == 0);
    CHECK(twin_encode(w, NULL, 40, 2) == 0);
    CHECK(twin_encode(w, NULL, 40, 2) == 0);
    for (int step = 0; step < 3; step++)
        CHECK(twin_denoise(w, step, step > 0) == 0);
    /* both prompts' bucket again: its graph went stale when the first
     * denoising step made the row buffers, and a bucket already run
     * eagerly is captured at once */
    {
        struct dg_cuda_rank_usage before[4], after;
        CHECK(tp <= 4);
        for (int r = 0; r < tp; r++)
            CHECK(dg_cuda_backend_rank_usage(w->b[0], r, &before[r]) == 0);
        CHECK(twin_encode(w, NULL, 40, 3) == 0);
        for (int r = 0; r < tp; r++) {
            CHECK(dg_cuda_backend_rank_usage(w->b[0], r, &after) == 0);
            CHECKF(after.captures == before[r].captures + 1 &&
                       after.replays == before[r].replays + 1,
                   "rank %d: a stale graph's bucket: %llu captures and %llu replays more, "
                   "want 1 and 1",
                   r, (unsigned long long)(after.captures - before[r].captures),
                   (unsigned long long)(after.replays - before[r].replays));
        }
        CHECK(twin_denoise(w, 3, 1) == 0);
    }
    for (int r = 0; r < tp; r++) {
        struct dg_cuda_rank_usage on, off;
        CHECK(dg_cuda_backend_rank_usage(w->b[0], r, &on) == 0);
        CHECK(dg_cuda_backend_rank_usage(w->b[1], r, &off) == 0);
        printf("# %s TP=%d rank %d: %llu graphs made, %llu replays; %d steps equal to eager\n",
               name, tp, r, (unsigned long long)on.captures, (unsigned long long)on.replays,
               w->steps);
        CHECK(on.captures >= 2 && on.replays > on.captures && off.captures == 0 &&
              off.replays == 0);
        /* replays count their collectives as the eager calls do */
        for (int k = 0; k < DG_COLL_KINDS; k++)
            CHECKF(on.coll.calls[k] == off.coll.calls[k] && on.coll.bytes[k] == off.coll.bytes[k],
                   "rank %d: collectives of kind %d: %llu calls with graphs, %llu without", r, k,
                   (unsigned long long)on.coll.calls[k], (unsigned long long)off.coll.calls[k]);
    }
    for (int b = 0; b < 2; b++)
        w->b[b]->ops->destroy(w->b[b]);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    free(w);
    return 0;
}

static int case_graphs_equal_eager(void)
{
    const char *small = small_bf16();
    CHECK(small);
    for (int i = -1; i < n_tp_list; i++) {
        const int tp = i < 0 ? 1 : tp_list[i];
        if (tp > 1 && shared) {
            printf("# TP=%d on one GPU runs eagerly: graphs at TP=1 only\n", tp);
            continue;
        }
        CHECK(graphs_run("tests/golden/golden-a/checkpoint", "golden-a fp32", tp, 1) == 0);
        CHECK(graphs_run(small, "small bf16", tp, 0) == 0);
    }
    return 0;
}

static int case_refusals(void)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    struct dg_backend *b = NULL;
    struct dg_cuda_backend_options o;
    int n = 0, rc;
    CHECK_OK(dg_model_load("tests/golden/golden-b/checkpoint", &ck, &m, &err), &err);
    rc = make_backend(&m, 2, 1, 0, &b, &err);
    printf("# golden-b at TP=2: %s\n", err.msg);
    CHECKF(rc == -DG_E_INVAL && strstr(err.msg, "whole KV groups") && !b, "rc %d: %s", rc,
           err.msg);
    CHECK_OK(dg_gpu_count(&n, &err), &err);
    memset(&o, 0, sizeof o);
    o.n_ranks = n + 1;
    o.max_slots = 1;
    o.model = &m;
    o.timeout_ms = 10000;
    rc = dg_cuda_backend_create(&o, &b, &err);
    printf("# TP=%d on %d GPUs: %s\n", n + 1, n, err.msg);
    CHECKF(rc < 0 && !b, "rc %d", rc);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

/* One creation at TP=2 on a thread of its own, so that a creation that
 * never returns fails the test instead of hanging it. */
struct start_try {
    struct dg_cuda_backend_options o;
    struct dg_backend *b;
    struct dg_error err;
    int rc, done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *start_thread(void *p)
{
    struct start_try *t = p;
    int rc = dg_cuda_backend_create(&t->o, &t->b, &t->err);
    pthread_mutex_lock(&t->mu);
    t->rc = rc;
    t->done = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static int case_start_failure(void)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    int n = 0, devices[2];
    CHECK_OK(dg_model_load("tests/golden/golden-a/checkpoint", &ck, &m, &err), &err);
    CHECK_OK(dg_gpu_count(&n, &err), &err);
    devices[0] = 0;
    devices[1] = n > 1 ? 1 : 0; /* with one GPU both ranks on it: the fault option allows it */
    for (int failing = 0; failing < 2; failing++) {
        struct start_try t;
        struct timespec deadline;
        pthread_t th;
        int waited = 0;
        memset(&t, 0, sizeof t);
        pthread_mutex_init(&t.mu, NULL);
        pthread_cond_init(&t.cv, NULL);
        t.o.n_ranks = 2;
        t.o.devices = devices;
        t.o.max_slots = 1;
        t.o.model = &m;
        t.o.timeout_ms = 10000;
        t.o.fault_start_rank = failing + 1;
        CHECK(pthread_create(&th, NULL, start_thread, &t) == 0);
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 120;
        pthread_mutex_lock(&t.mu);
        while (!t.done && waited == 0)
            waited = pthread_cond_timedwait(&t.cv, &t.mu, &deadline);
        pthread_mutex_unlock(&t.mu);
        if (!t.done) {
            /* a rank is waiting for the failed one for good: nothing to join */
            printf("FAIL: TP=2, rank %d failing before the group: creation still waiting after "
                   "120 s\n", failing);
            fflush(stdout);
            _exit(1);
        }
        pthread_join(th, NULL);
        printf("# TP=2 on GPUs %d and %d, rank %d failing before the group: %s\n", devices[0],
               devices[1], failing, t.err.msg);
        CHECKF(t.rc == -DG_E_NOMEM && !t.b && strstr(t.err.msg, "injected") &&
                   strstr(t.err.msg, failing ? "rank 1" : "rank 0"),
               "rc %d: %s", t.rc, t.err.msg);
        pthread_mutex_destroy(&t.mu);
        pthread_cond_destroy(&t.cv);
    }
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

int main(void)
{
    struct dg_error err = {0};
    int n = 0, rc = gt_setup("t-cuda-tp");
    if (rc)
        return rc;
    if (dg_gpu_count(&n, &err) < 0 || n < 1) {
        printf("skip t-cuda-tp: no GPU\n");
        return 77;
    }
    if (n < 2) {
        printf("# 1 GPU: TP=2 and TP=4 with every rank on it, without NCCL (eager)\n");
        shared = 1;
        tp_list[n_tp_list++] = 4;
    } else if (n >= 4)
        tp_list[n_tp_list++] = 4;
    else
        printf("# %d GPUs: TP=2 only (TP=4 needs 4)\n", n);
    TEST_CASE(case_refusals);
    TEST_CASE(case_start_failure);
    TEST_CASE(case_logits_golden);
    TEST_CASE(case_generations);
    TEST_CASE(case_rank_usage_and_watchdog);
    TEST_CASE(case_graphs_equal_eager);
    TEST_CASE(case_logits_full);
    return test_finish();
}
