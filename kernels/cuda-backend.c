/* cuda-backend.c - the backend interface on one or more GPUs, one worker
 * thread per GPU (see cuda-backend.h). */
#include "kernels/cuda-backend.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda-forward.h"
#include "kernels/cuda-model.h"
#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/fp8-lt.h"
#include "kernels/graph.h"
#include "kernels/prof.h"
#include "kernels/nccl.h"
#include "kernels/ops.h"
#include "lib/backend-wire.h"
#include "lib/coll.h"
#include "lib/log.h"
#include "lib/sampler.h"

#define ABORT_GRACE_MS 10000 /* how long aborted workers get to come back */

/* one slot on one rank: its KV heads and its soft input */
struct gslot {
    int open, has_soft, max_cl;
    struct dg_cuda_kv kv;
    void *soft;                     /* [max_cl, H] elements: (pi E) c, whole */
};

/* the last denoise batch, per item (the same on every rank) */
struct last_item {
    int slot, cl;
    int64_t off;                    /* first row in the batch buffers */
    int ahead;                      /* its condition's work queued by the denoise call */
};

enum step_kind { STEP_ENCODE = 1, STEP_DENOISE = 2 };

#define MAX_GRAPHS 32

/* profiler marks between two collects: a pass marks about 16 stages a
 * layer */
#define PROF_MARKS 2048

/* one captured step of a rank */
struct step_graph {
    int kind;                       /* enum step_kind */
    int64_t Te, Tb;                 /* its encoder rows and all its rows (buckets) */
    uint64_t gen;                   /* step_generation at capture */
    uint64_t seen_group;            /* nccl_gen when it ran eagerly */
    int seen;                       /* run once eagerly (kernels loaded, cuBLAS chose) */
    dg_graph_t exec;                /* NULL until captured */
    struct dg_coll_stats coll;      /* the collectives in it (counted again at each replay) */
};

enum job_kind { JOB_NONE, JOB_INIT, JOB_REGROUP, JOB_OPEN, JOB_CLOSE, JOB_ENCODE, JOB_DENOISE,
                JOB_CONDITION, JOB_SERVE, JOB_QUIT };

struct cuda_backend;

struct grank {
    struct cuda_backend *cb;
    int index, dev;
    pthread_t thread;
    int started;
    struct dg_cuda_model model;
    struct dg_cuda_ctx cx;
    struct dg_nccl *nccl;           /* NULL with one rank */
    struct gslot *slots;
    struct dg_cuda_seq *seqs;
    int seqs_cap;
    /* the last denoise batch: this rank's soft-capped logits columns
     * [rows, nv], per row temperature, threshold, draw site, statistics
     * (of the slice, then of the whole row) */
    int64_t rows_cap;
    float *logits, *T_d, *tau_d;
    struct dg_rand_site *sites_d;
    struct dg_row_stats *stats_d, *gather_d; /* gather_d: [n_ranks, rows] */
    void *stats_scratch;
    void *probs;                    /* [probs_cap, nv] elements */
    int64_t probs_cap;
    uint64_t rows_bytes, probs_bytes;
    float *T_h, *tau_h;
    struct dg_rand_site *sites_h;
    struct dg_row_stats *stats_h;
    dg_cuda_event_t results;        /* the sampler's results on the host (condition ahead) */
    /* option time_steps, rank 0 of the group: a denoise call's own work
     * on the stream, from before its first upload to its results */
    dg_cuda_event_t step_start, step_end;
    double step_ms;                 /* the last denoise call's; -1: none */
    int skip;                       /* fault injection: skip the next job */
    /* captured steps (cuda-backend.h: graphs) */
    struct step_graph graphs[MAX_GRAPHS];
    int n_graphs;
    uint64_t rows_gen, nccl_gen;    /* bumped when the row buffers, the group change */
    uint64_t captures, replays;
    /* option profile, rank 0: stage timings of the encoder passes and the
     * steps that commit first [0], and of the other denoising steps with
     * their self-conditioning [1] */
    struct dg_prof *prof[2];
    int64_t busy_since_ms;          /* serve: when the call in hand began (0: idle) */
    /* the job's outcome */
    int rc;
    struct dg_error err;
};

struct cuda_backend {
    struct dg_backend base;
    struct dg_cuda_backend_options opt;
    struct dg_tp_plan plan;
    int n;                          /* ranks in the group */
    int nl;                         /* ranks in this process: n, or 1 (multi-process) */
    int mp;                         /* multi-process: this process holds rank ranks[0].index */
    struct grank *ranks;            /* [nl] */
    /* multi-process: a call's message to the other processes, and the
     * ranks' outcomes after it */
    unsigned char *wire;
    size_t wire_len, wire_cap;
    struct dg_nccl_id id;
    /* the ranks of this process meet here before they join the NCCL
     * group (NULL with one): a rank that failed aborts it instead */
    struct dg_coll_cpu_group *gate;
    struct dg_nccl_shared *shared;  /* option shared_gpu: the group without NCCL */
    int regroup;                    /* the communicators were aborted: rebuild first */
    int failed;                     /* for good */
    int stuck;                      /* a worker never came back: its thread is left alone */
    char failure[256];
    cpu_set_t allowed;              /* the process's CPUs at creation */
    /* the job (written by the caller before the workers are woken) */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t seq;
    int finished;
    enum job_kind kind;
    const void *items;
    int n_items;
    const int *which;
    int slot, max_cl;
    int64_t max_positions;
    /* shared results */
    struct last_item *last;
    int n_last, last_cap;
};

static struct cuda_backend *impl(struct dg_backend *b)
{
    return (struct cuda_backend *)b;
}

#define TRY(call)                                                                       \
    do {                                                                                \
        if ((rc = (call)) < 0)                                                          \
            return rc;                                                                  \
    } while (0)

/* ---- per-rank buffers ------------------------------------------------------------ */

static void free_rows(struct grank *R)
{
    dg_cuda_free(R->logits);
    dg_cuda_free(R->T_d);
    dg_cuda_free(R->tau_d);
    dg_cuda_free(R->sites_d);
    dg_cuda_free(R->stats_d);
    dg_cuda_free(R->gather_d);
    dg_cuda_free(R->stats_scratch);
    free(R->T_h);
    free(R->tau_h);
    free(R->sites_h);
    free(R->stats_h);
    R->logits = R->T_d = R->tau_d = NULL;
    R->sites_d = NULL;
    R->stats_d = R->gather_d = NULL;
    R->stats_scratch = NULL;
    R->T_h = R->tau_h = NULL;
    R->sites_h = NULL;
    R->stats_h = NULL;
    R->rows_cap = 0;
    R->rows_bytes = 0;
}

static int reserve_rows(struct grank *R, int64_t rows, struct dg_error *err)
{
    const int64_t nv = R->model.nv;
    const size_t scratch = dg_cuda_row_stats_scratch(rows, nv);
    const size_t n = (size_t)rows;
    int rc;
    if (rows <= R->rows_cap)
        return 0;
    free_rows(R);
    R->rows_gen++;
    R->T_h = malloc(sizeof(float) * n);
    R->tau_h = malloc(sizeof(float) * n);
    R->sites_h = malloc(sizeof *R->sites_h * n);
    R->stats_h = malloc(sizeof *R->stats_h * n);
    if (!R->T_h || !R->tau_h || !R->sites_h || !R->stats_h)
        return dg_error_set(err, DG_E_NOMEM, "out of memory for %lld rows", (long long)rows);
    TRY(dg_cuda_alloc((void **)&R->logits, sizeof(float) * n * (size_t)nv, R->dev, err));
    TRY(dg_cuda_alloc((void **)&R->T_d, sizeof(float) * n, R->dev, err));
    TRY(dg_cuda_alloc((void **)&R->tau_d, sizeof(float) * n, R->dev, err));
    TRY(dg_cuda_alloc((void **)&R->sites_d, sizeof *R->sites_d * n, R->dev, err));
    TRY(dg_cuda_alloc((void **)&R->stats_d, sizeof *R->stats_d * n, R->dev, err));
    TRY(dg_cuda_alloc((void **)&R->gather_d, sizeof *R->gather_d * n * (size_t)R->cb->n, R->dev,
                      err));
    TRY(dg_cuda_alloc(&R->stats_scratch, scratch, R->dev, err));
    R->rows_cap = rows;
    R->rows_bytes = (sizeof(float) * (uint64_t)nv + 2 * sizeof(float) + sizeof *R->sites_d +
                     sizeof *R->stats_d * (uint64_t)(1 + R->cb->n)) * (uint64_t)rows + scratch;
    return 0;
}

static int reserve_probs(struct grank *R, int64_t rows, struct dg_error *err)
{
    const size_t bytes = (size_t)dg_elt_size(R->model.elt) * (size_t)rows * (size_t)R->model.nv;
    int rc;
    if (rows <= R->probs_cap)
        return 0;
    dg_cuda_free(R->probs);
    R->probs = NULL;
    R->probs_cap = 0;
    R->probs_bytes = 0;
    TRY(dg_cuda_alloc(&R->probs, bytes, R->dev, err));
    R->probs_cap = rows;
    R->probs_bytes = bytes;
    return 0;
}

static int reserve_seqs(struct grank *R, int n, struct dg_error *err)
{
    if (n > R->seqs_cap) {
        struct dg_cuda_seq *s = realloc(R->seqs, sizeof *s * (size_t)n);
        if (!s)
            return dg_error_set(err, DG_E_NOMEM, "out of memory");
        R->seqs = s;
        R->seqs_cap = n;
    }
    return 0;
}

static void close_slot(struct grank *R, int slot)
{
    struct gslot *s = &R->slots[slot];
    struct dg_error ignored;
    /* (a condition queued ahead may still be writing its soft input) */
    (void)dg_cuda_stream_sync(R->cx.stream, R->dev, &ignored);
    dg_cuda_kv_free(&s->kv);
    dg_cuda_free(s->soft);
    memset(s, 0, sizeof *s);
}

/* ---- per-rank work (on the rank's thread) ----------------------------------------- */

/* Where the ranks of this process meet before they join the NCCL group:
 * ncclCommInitRank waits for every rank of the group, so one that failed
 * before it would leave the others there for good.  rc is this rank's
 * outcome so far: a failure aborts the meeting (and is returned); else
 * this rank waits for the others and gets 0 when all came without
 * failing, or DG_E_NCCL (the cause is the failed rank's own error). */
static int meet(struct grank *R, int rc, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    struct dg_error ignored;
    if (!cb->gate)
        return rc;
    if (rc < 0) {
        dg_coll_cpu_abort(cb->gate);
        return rc;
    }
    if (dg_barrier(dg_coll_cpu_rank(cb->gate, R->index), &ignored) < 0)
        return dg_error_set(err, DG_E_NCCL, "GPU %d: rank %d: not joining the NCCL group: "
                            "another rank failed before it", R->dev, R->index);
    return 0;
}

/* This rank's communicator: NCCL's from the group's id, or one of the
 * group on a shared GPU (option shared_gpu). */
static int join(struct grank *R, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    if (cb->shared)
        return dg_nccl_init_shared(&R->nccl, cb->shared, R->index, R->dev, R->cx.stream, err);
    return dg_nccl_init(&R->nccl, &cb->id, cb->n, R->index, R->dev, R->cx.stream, err);
}

static int rank_init(struct grank *R, struct dg_error *err)
{
    const struct dg_cuda_backend_options *o = &R->cb->opt;
    const struct dg_tp_plan *plan = &R->cb->plan;
    int rc;
    /* the stream and the group first: every rank joins at once, before a
     * slow load or a failing one can keep the others waiting */
    R->model.dev = R->dev;
    if ((rc = dg_cuda_use(R->dev, err)) >= 0)
        rc = dg_cuda_ctx_init(&R->cx, &R->model, err);
    if (rc >= 0 && o->fault_start_rank == R->index + 1)
        rc = dg_error_set(err, DG_E_NOMEM, "GPU %d: rank %d: a failure injected before the "
                          "NCCL group (option fault_start_rank)", R->dev, R->index);
    TRY(meet(R, rc, err));
    if (R->cb->n > 1) {
        TRY(join(R, err));
        R->cx.nccl = R->nccl;
        if (o->joined)
            o->joined(o->joined_arg, R->index);
    }
    if (o->profile && R->index == 0)
        for (int i = 0; i < 2; i++)
            TRY(dg_prof_create(&R->prof[i], PROF_MARKS, R->dev, err));
    TRY(dg_cuda_event_create(&R->results, R->dev, err));
    R->step_ms = -1;
    if (o->time_steps && R->index == 0) {
        TRY(dg_cuda_event_create_timed(&R->step_start, R->dev, err));
        TRY(dg_cuda_event_create_timed(&R->step_end, R->dev, err));
    }
    rc = o->model ? dg_cuda_model_upload_rank(&R->model, o->model,
                                              o->fp32 ? DG_ELT_F32 : DG_ELT_BF16, plan, R->index,
                                              R->dev, err)
                  : dg_cuda_model_random_q_rank(&R->model, o->cfg, o->seed, o->fp8, plan,
                                                R->index, R->dev, err);
    if (rc >= 0 && R->model.fp8 && !o->fp8_own_gemm) {
        /* one for each of the context's streams (cuda-forward.h) */
        rc = dg_fp8_lt_create(R->dev, R->cx.stream, 0, &R->cx.lt, err);
        if (rc >= 0)
            rc = dg_fp8_lt_create(R->dev, R->cx.side, 0, &R->cx.side_lt, err);
    }
    return rc;
}

/* After an abort: a new communicator from the new id (the old one's
 * counts carried over). */
static int rank_regroup(struct grank *R, struct dg_error *err)
{
    struct dg_coll_stats keep;
    int rc;
    if ((rc = dg_cuda_use(R->dev, err)) >= 0)
        rc = dg_cuda_healthy(R->dev, err);
    TRY(meet(R, rc, err));
    keep = dg_nccl_coll(R->nccl)->stats;
    dg_nccl_free(R->nccl);
    R->nccl = R->cx.nccl = NULL;
    TRY(join(R, err));
    dg_nccl_coll(R->nccl)->stats = keep;
    R->cx.nccl = R->nccl;
    R->nccl_gen++;
    return 0;
}

static int rank_open(struct grank *R, struct dg_error *err)
{
    const struct cuda_backend *cb = R->cb;
    struct gslot *s = &R->slots[cb->slot];
    int rc;
    if ((rc = dg_cuda_kv_init(&s->kv, &R->model, cb->max_positions, cb->max_cl, err)) < 0 ||
        (rc = dg_cuda_alloc(&s->soft, (size_t)dg_elt_size(R->model.elt) * (size_t)cb->max_cl *
                                          (size_t)cb->base.cfg->hidden_size, R->dev, err)) < 0) {
        close_slot(R, cb->slot);
        return rc;
    }
    s->open = 1;
    s->max_cl = cb->max_cl;
    return 0;
}

static int filtered(const struct dg_denoise_item *it, int64_t V)
{
    return (it->top_k > 0 && it->top_k < V) || it->top_p < 1;
}

/* Thresholds of a filtered item's rows: this rank's columns of its logits,
 * already soft-capped on the GPU (so the threshold is one of the values
 * the kernel compares), come to the host and go through the CPU's
 * bisection, counts summed across ranks. */
static int host_thresholds(struct grank *R, const struct dg_denoise_item *it, int64_t off,
                           struct dg_error *err)
{
    const int64_t nv = R->model.nv, V = R->model.cfg.vocab_size;
    const size_t n = (size_t)it->cl * (size_t)nv;
    float *z = malloc(sizeof(float) * n), *scratch = malloc(sizeof(float) * n);
    int rc = 0;
    if (!z || !scratch)
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory for a top-k/top-p filter over %d "
                          "positions", it->cl);
    if (rc == 0)
        rc = dg_cuda_copy_async(z, R->logits + off * nv, sizeof(float) * n, R->cx.stream, R->dev,
                                err);
    if (rc == 0)
        rc = dg_cuda_stream_sync(R->cx.stream, R->dev, err);
    if (rc == 0)
        rc = dg_filter_thresholds(z, it->cl, nv, nv, V, it->top_k, it->top_p, R->tau_h + off,
                                  scratch, R->nccl ? dg_nccl_coll(R->nccl) : NULL, err);
    free(z);
    free(scratch);
    return rc;
}

/* ---- captured steps ------------------------------------------------------------ */

/* The generation of everything a captured step holds pointers to: the
 * forward scratch and tables, the sampler's row buffers, the group. */
static uint64_t step_generation(const struct grank *R)
{
    return R->cx.generation + R->rows_gen + R->nccl_gen;
}

/* The sampler's statistics of the step's Tb rows (pads included): this
 * rank's slice, then, over several ranks, every rank's records gathered
 * and folded in rank order (dg_row_stats_combine's arithmetic).  With
 * sites NULL only the soft-cap is applied (the filters' first pass). */
static int step_stats(struct grank *R, int64_t Tb, float cap, const struct dg_rand_site *sites,
                      struct dg_error *err)
{
    const dg_stream_t st = R->cx.stream;
    int rc;
    if (!R->nccl || !sites)
        return dg_cuda_row_stats(R->stats_d, R->logits, Tb, R->model.nv, R->model.v0, cap,
                                 R->T_d, R->tau_d, sites, R->stats_scratch, st, R->dev, err);
    TRY(dg_cuda_row_stats(R->gather_d + (size_t)R->index * (size_t)Tb, R->logits, Tb,
                          R->model.nv, R->model.v0, cap, R->T_d, R->tau_d, sites,
                          R->stats_scratch, st, R->dev, err));
    TRY(dg_nccl_all_gather(R->nccl, R->gather_d + (size_t)R->index * (size_t)Tb, R->gather_d,
                           sizeof *R->gather_d * (size_t)Tb, err));
    return dg_cuda_row_stats_fold(R->stats_d, R->gather_d, Tb, R->cb->n, st, R->dev, err);
}

/* Profiling (option profile, rank 0): start a call's marks, charge the
 * time since the last mark, add the marks up once the stream is idle. */
static int prof_begin(struct grank *R, int which, struct dg_error *err)
{
    R->cx.prof = R->prof[which];
    return R->cx.prof ? dg_prof_begin(R->cx.prof, R->cx.stream, err) : 0;
}

#define prof_mark(R, label) \
    ((R)->cx.prof ? dg_prof_mark((R)->cx.prof, label, (R)->cx.stream, err) : 0)

static int prof_collect(struct grank *R, struct dg_error *err)
{
    return R->cx.prof ? dg_prof_collect(R->cx.prof, err) : 0;
}

/* The work a step queues after its stage, every pointer and size a
 * function of (kind, Te, Tb) and of step_generation: an encoder pass
 * (Te = Tb), or a pass whose rows from Te on are decoder rows and the
 * statistics of their logits. */
static int step_work(struct grank *R, int kind, int64_t Te, int64_t Tb, struct dg_error *err)
{
    int rc;
    TRY(dg_cuda_pass_body(&R->cx, Te, Tb, R->logits, err));
    if (kind == STEP_DENOISE) {
        TRY(step_stats(R, Tb - Te, (float)R->cb->base.cfg->final_logit_softcapping, R->sites_d,
                       err));
        TRY(prof_mark(R, "sampler statistics"));
    }
    return 0;
}

/* Run a step's work: eagerly without graphs; with them, the first time a
 * (kind, Te, Tb) comes eagerly too (kernels load, cuBLAS chooses), the
 * second time captured and replayed, later replayed.  A graph whose
 * buffers changed since its capture is dropped and made again, never
 * replayed: captured at once when the buffers were only reallocated (a
 * larger step grew them: nothing left to load), after an eager run again
 * when the group was rebuilt (a new communicator sets up its
 * connections on its first collectives). */
static int run_step(struct grank *R, int kind, int64_t Te, int64_t Tb, struct dg_error *err)
{
    const uint64_t gen = step_generation(R);
    const dg_stream_t st = R->cx.stream;
    struct step_graph *g = NULL;
    int rc, rc2;

    if (!R->cb->opt.graphs || R->cx.prof)
        return step_work(R, kind, Te, Tb, err);
    for (int i = 0; i < R->n_graphs && !g; i++)
        if (R->graphs[i].kind == kind && R->graphs[i].Te == Te && R->graphs[i].Tb == Tb)
            g = &R->graphs[i];
    if (g && g->gen != gen) {
        dg_graph_destroy(g->exec);
        g->exec = NULL;
        g->gen = gen;
        if (g->seen_group != R->nccl_gen)
            g->seen = 0;
    }
    if (!g) {
        if (R->n_graphs == MAX_GRAPHS) {
            /* the oldest goes */
            dg_graph_destroy(R->graphs[0].exec);
            memmove(&R->graphs[0], &R->graphs[1], sizeof R->graphs[0] * (MAX_GRAPHS - 1));
            R->n_graphs--;
        }
        g = &R->graphs[R->n_graphs++];
        memset(g, 0, sizeof *g);
        g->kind = kind;
        g->Te = Te;
        g->Tb = Tb;
        g->gen = gen;
    }
    if (g->exec) {
        /* the collectives were counted when captured: again for this run */
        if (R->nccl) {
            struct dg_coll_stats *cs = &dg_nccl_coll(R->nccl)->stats;
            for (int k = 0; k < DG_COLL_KINDS; k++) {
                cs->calls[k] += g->coll.calls[k];
                cs->bytes[k] += g->coll.bytes[k];
            }
        }
        R->replays++;
        return dg_graph_launch(g->exec, st, R->dev, err);
    }
    if (!g->seen) {
        g->seen = 1;
        g->seen_group = R->nccl_gen;
        return step_work(R, kind, Te, Tb, err);
    }
    TRY(dg_graph_begin(st, R->dev, err));
    {
        const struct dg_coll_stats before =
            R->nccl ? dg_nccl_coll(R->nccl)->stats : (struct dg_coll_stats){{0}, {0}};
        rc = step_work(R, kind, Te, Tb, err);
        if (R->nccl)
            for (int k = 0; k < DG_COLL_KINDS; k++) {
                g->coll.calls[k] = dg_nccl_coll(R->nccl)->stats.calls[k] - before.calls[k];
                g->coll.bytes[k] = dg_nccl_coll(R->nccl)->stats.bytes[k] - before.bytes[k];
            }
    }
    rc2 = dg_graph_end(st, rc == 0, &g->exec, R->dev, rc == 0 ? err : NULL);
    if (rc < 0 || rc2 < 0)
        return rc < 0 ? rc : rc2;
    R->captures++;
    R->replays++;
    return dg_graph_launch(g->exec, st, R->dev, err);
}

static void drop_graphs(struct grank *R)
{
    for (int i = 0; i < R->n_graphs; i++)
        dg_graph_destroy(R->graphs[i].exec);
    R->n_graphs = 0;
}

static int rank_encode(struct grank *R, struct dg_error *err)
{
    const struct dg_encode_item *items = R->cb->items;
    const int n = R->cb->n_items;
    int64_t Tb;
    int rc;
    TRY(reserve_seqs(R, n, err));
    for (int i = 0; i < n; i++)
        R->seqs[i] = (struct dg_cuda_seq){&R->slots[items[i].slot].kv, items[i].ids, items[i].n,
                                          NULL};
    TRY(prof_begin(R, 0, err));
    TRY(dg_cuda_pass_stage(&R->cx, R->seqs, n, 0, &Tb, err));
    TRY(prof_mark(R, "stage"));
    TRY(run_step(R, STEP_ENCODE, Tb, Tb, err));
    TRY(dg_cuda_stream_sync(R->cx.stream, R->dev, err));
    dg_cuda_pass_finish(R->seqs, n, 0);
    return prof_collect(R, err);
}

/* The tokens the denoise items append (dg_denoise_item.append), as
 * encoder sequences at R->seqs[0 .. *n_app), then the canvases at
 * R->seqs[*n_app ..]: *dec. */
static int denoise_seqs(struct grank *R, const struct dg_denoise_item *items, int n, int *n_app,
                        struct dg_cuda_seq **dec, struct dg_error *err)
{
    int k = 0, rc;
    TRY(reserve_seqs(R, 2 * n, err));
    for (int i = 0; i < n; i++)
        if (items[i].n_append > 0)
            R->seqs[k++] = (struct dg_cuda_seq){&R->slots[items[i].slot].kv, items[i].append,
                                                items[i].n_append, NULL};
    *n_app = k;
    *dec = R->seqs + k;
    for (int i = 0; i < n; i++) {
        struct gslot *s = &R->slots[items[i].slot];
        (*dec)[i] = (struct dg_cuda_seq){&s->kv, items[i].canvas, items[i].cl,
                                         items[i].self_cond && s->has_soft ? s->soft : NULL};
    }
    return 0;
}

/* Item li of the last denoise batch: its self-conditioning input queued
 * on the rank's stream into its slot's soft: p = softmax over the kept ids
 * of this rank's columns (the whole row's max and sum), then this rank's
 * (p E) c, summed over ranks.  It reads the batch's logits, temperatures,
 * thresholds and statistics, which stay until the next denoise call. */
static int queue_condition(struct grank *R, const struct last_item *li, struct dg_error *err)
{
    const int64_t nv = R->model.nv, H = R->cb->base.cfg->hidden_size;
    struct gslot *s = &R->slots[li->slot];
    int rc;
    TRY(dg_cuda_row_probs_e(R->model.elt, R->probs, R->logits + li->off * nv, li->cl, nv,
                            R->T_d + li->off, R->tau_d + li->off, R->stats_d + li->off,
                            R->cx.stream, R->dev, err));
    TRY(prof_mark(R, "sampler probabilities"));
    TRY(dg_blas_gemm_e(R->cx.blas, R->model.elt, s->soft, 0, R->probs, li->cl, R->model.embed,
                       1, H, nv, H, R->model.embed_scale, 0.0f, err));
    TRY(prof_mark(R, "self-conditioning P.E"));
    if (R->nccl) {
        TRY(dg_nccl_all_reduce(R->nccl, s->soft, (size_t)(li->cl * H),
                               R->model.elt == DG_ELT_F32 ? DG_NCCL_F32 : DG_NCCL_BF16,
                               DG_COLL_SUM, err));
        TRY(prof_mark(R, "all-reduce"));
    }
    return 0;
}

/* Whether this denoise call queues conditions ahead (cuda-backend.h): one
 * rank, not profiling (the condition call's stages are timed apart), the
 * option not set, and an item marked condition_ahead. */
static int conditions_ahead(const struct grank *R, const struct dg_denoise_item *items, int n)
{
    if (R->cb->opt.condition_apart || R->cb->n > 1 || R->cx.prof)
        return 0;
    for (int i = 0; i < n; i++)
        if (items[i].condition_ahead)
            return 1;
    return 0;
}

/* The conditions of the items marked condition_ahead, queued (behind the
 * step's results) and noted in the last batch's items for rank_condition. */
static int queue_ahead(struct grank *R, const struct dg_denoise_item *items, int n,
                       struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    int64_t most = 0;
    int rc;
    for (int i = 0; i < n; i++)
        if (items[i].condition_ahead && items[i].cl > most)
            most = items[i].cl;
    TRY(reserve_probs(R, most, err));
    for (int i = 0; i < n; i++)
        if (items[i].condition_ahead) {
            TRY(queue_condition(R, &cb->last[i], err));
            cb->last[i].ahead = 1;
        }
    return 0;
}

/* A denoising step of the items (and the tokens they append first): the
 * appended tokens and the canvases as one pass (their encoder rows, then
 * the decoder rows), or with option commit_apart an encoder pass first;
 * either way everything is checked before anything runs. */
static int rank_denoise(struct grank *R, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    struct dg_denoise_item *items = (struct dg_denoise_item *)(uintptr_t)cb->items;
    const int n = cb->n_items;
    const int64_t V = cb->base.cfg->vocab_size;
    const dg_stream_t st = R->cx.stream;
    struct dg_cuda_seq *dec;
    int64_t rows = 0, off = 0, Td, Te, Tb;
    int any_filtered = 0, n_app, rc;

    for (int i = 0; i < n; i++) {
        rows += items[i].cl;
        any_filtered |= filtered(&items[i], V);
    }
    Td = dg_cuda_bucket(rows);
    R->step_ms = -1;
    if (R->step_start)
        /* (behind any work queued before the call: what it waits for is
         * not the call's own) */
        TRY(dg_cuda_event_record(R->step_start, st, R->dev, err));
    TRY(denoise_seqs(R, items, n, &n_app, &dec, err));
    /* (a step that commits first is timed with the encoder passes) */
    TRY(prof_begin(R, n_app > 0 ? 0 : 1, err));
    TRY(reserve_rows(R, Td, err));
    if (n_app > 0 && cb->opt.commit_apart) {
        int64_t ne, nd;
        TRY(dg_cuda_pass_check(&R->cx, R->seqs, n_app, dec, n, &ne, &nd, err));
        TRY(dg_cuda_pass_stage(&R->cx, R->seqs, n_app, 0, &Tb, err));
        TRY(run_step(R, STEP_ENCODE, Tb, Tb, err));
        TRY(dg_cuda_stream_sync(st, R->dev, err));
        dg_cuda_pass_finish(R->seqs, n_app, 0);
        TRY(prof_mark(R, "commit apart"));
        n_app = 0;
    }
    TRY(dg_cuda_pass_stage_mixed(&R->cx, R->seqs, n_app, dec, n, &Te, &Tb, err));
    /* per row: temperature, threshold (none yet), draw site; the pad rows
     * a harmless 1, none, site 0 */
    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *it = &items[i];
        for (int p = 0; p < it->cl; p++) {
            R->T_h[off + p] = it->temperature;
            R->tau_h[off + p] = -INFINITY;
            R->sites_h[off + p] =
                (struct dg_rand_site){it->seed, it->canvas_index, it->step, (uint32_t)p};
        }
        off += it->cl;
    }
    for (int64_t r = rows; r < Td; r++) {
        R->T_h[r] = 1.0f;
        R->tau_h[r] = -INFINITY;
        R->sites_h[r] = (struct dg_rand_site){0, 0, 0, 0};
    }
    TRY(dg_cuda_copy_async(R->T_d, R->T_h, sizeof(float) * (size_t)Td, st, R->dev, err));
    TRY(dg_cuda_copy_async(R->sites_d, R->sites_h, sizeof *R->sites_h * (size_t)Td, st, R->dev,
                           err));
    TRY(dg_cuda_copy_async(R->tau_d, R->tau_h, sizeof(float) * (size_t)Td, st, R->dev, err));
    TRY(prof_mark(R, "stage"));
    if (!any_filtered) {
        TRY(run_step(R, STEP_DENOISE, Te, Tb, err));
    } else {
        /* (eager) a first pass only soft-caps the logits in place; the
         * filtered items' thresholds come from those values on the host;
         * the statistics pass then leaves them as they are */
        TRY(dg_cuda_pass_body(&R->cx, Te, Tb, R->logits, err));
        TRY(step_stats(R, Td, (float)cb->base.cfg->final_logit_softcapping, NULL, err));
        for (int i = 0, o = 0; i < n; o += items[i].cl, i++)
            if (filtered(&items[i], V))
                TRY(host_thresholds(R, &items[i], o, err));
        TRY(dg_cuda_copy_async(R->tau_d, R->tau_h, sizeof(float) * (size_t)Td, st, R->dev, err));
        TRY(step_stats(R, Td, 0.0f, R->sites_d, err));
        TRY(prof_mark(R, "sampler statistics"));
    }
    TRY(dg_cuda_copy_async(R->stats_h, R->stats_d, sizeof *R->stats_h * (size_t)rows, st, R->dev,
                           err));
    if (R->step_end)
        TRY(dg_cuda_event_record(R->step_end, st, R->dev, err));
    if (conditions_ahead(R, items, n)) {
        /* the results marked, the self-conditioning of the items expected
         * to go on queued behind them, and only the results waited for */
        TRY(dg_cuda_event_record(R->results, st, R->dev, err));
        TRY(queue_ahead(R, items, n, err));
        TRY(dg_cuda_event_sync(R->results, R->dev, err));
    } else {
        TRY(dg_cuda_stream_sync(st, R->dev, err));
    }
    dg_cuda_pass_finish(R->seqs, n_app, 0);
    if (R->step_end)
        TRY(dg_cuda_event_ms(R->step_start, R->step_end, &R->step_ms, R->dev, err));
    if (R->cx.prof) {
        /* (the wait for the results, as the host sees it) */
        TRY(prof_mark(R, "results to the host"));
        TRY(dg_cuda_stream_sync(st, R->dev, err));
        TRY(prof_collect(R, err));
    }
    if (R->index == 0)
        for (int i = 0, o = 0; i < n; o += items[i].cl, i++)
            items[i].nonfinite = dg_row_outputs(R->stats_h + o, items[i].cl, items[i].sample,
                                                items[i].argmax, items[i].entropy);
    return 0;
}

static int rank_condition(struct grank *R, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    int64_t most = 0;
    int rc;

    /* the items whose work the denoise call queued: kept as they are */
    for (int i = 0; i < cb->n_items; i++) {
        const struct last_item *li = &cb->last[cb->which[i]];
        if (li->ahead)
            R->slots[li->slot].has_soft = 1;
        else if (li->cl > most)
            most = li->cl;
    }
    if (most == 0)
        return 0;
    TRY(reserve_probs(R, most, err));
    TRY(prof_begin(R, 1, err));
    for (int i = 0; i < cb->n_items; i++) {
        const struct last_item *li = &cb->last[cb->which[i]];
        if (li->ahead)
            continue;
        TRY(queue_condition(R, li, err));
        R->slots[li->slot].has_soft = 1;
    }
    TRY(dg_cuda_stream_sync(R->cx.stream, R->dev, err));
    return prof_collect(R, err);
}

static void rank_free(struct grank *R)
{
    struct dg_error ignored;
    if (dg_cuda_use(R->dev, &ignored) < 0)
        return;
    for (int i = 0; R->slots && i < R->cb->base.max_slots; i++)
        if (R->slots[i].open)
            close_slot(R, i);
    drop_graphs(R);
    for (int i = 0; i < 2; i++) {
        dg_prof_destroy(R->prof[i]);
        R->prof[i] = NULL;
    }
    R->cx.prof = NULL;
    dg_cuda_event_destroy(R->results);
    dg_cuda_event_destroy(R->step_start);
    dg_cuda_event_destroy(R->step_end);
    R->results = R->step_start = R->step_end = NULL;
    /* the communicator before the stream it enqueues on */
    if (R->nccl)
        dg_nccl_free(R->nccl);
    R->nccl = R->cx.nccl = NULL;
    dg_cuda_ctx_free(&R->cx);
    free_rows(R);
    dg_cuda_free(R->probs);
    R->probs = NULL;
    dg_cuda_model_free(&R->model);
}

/* ---- multi-process: calls to the other processes ------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* the job kinds that travel */
static int wire_kind(enum job_kind k)
{
    switch (k) {
    case JOB_OPEN: return DG_WIRE_OPEN;
    case JOB_CLOSE: return DG_WIRE_CLOSE;
    case JOB_ENCODE: return DG_WIRE_ENCODE;
    case JOB_DENOISE: return DG_WIRE_DENOISE;
    case JOB_CONDITION: return DG_WIRE_CONDITION;
    case JOB_QUIT: return DG_WIRE_QUIT;
    default: return 0;
    }
}

/* Rank 0: the job's bytes to every other process (its header first, so a
 * receiver knows the length, then the rest). */
static int send_job(struct grank *R, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    struct dg_wire_job j;
    int rc;
    memset(&j, 0, sizeof j);
    j.kind = (enum dg_wire_kind)wire_kind(cb->kind);
    j.slot = cb->slot;
    j.max_positions = cb->max_positions;
    j.max_cl = cb->max_cl;
    if (cb->kind == JOB_ENCODE || cb->kind == JOB_DENOISE || cb->kind == JOB_CONDITION)
        j.n = cb->n_items;
    j.enc = cb->kind == JOB_ENCODE ? cb->items : NULL;
    j.den = cb->kind == JOB_DENOISE ? (struct dg_denoise_item *)(uintptr_t)cb->items : NULL;
    j.which = cb->kind == JOB_CONDITION ? cb->which : NULL;
    TRY(dg_wire_encode(&j, &cb->wire, &cb->wire_len, &cb->wire_cap, err));
    TRY(dg_nccl_broadcast_host(R->nccl, cb->wire, DG_WIRE_HEADER_BYTES, 0, err));
    return dg_nccl_broadcast_host(R->nccl, cb->wire + DG_WIRE_HEADER_BYTES,
                                  cb->wire_len - DG_WIRE_HEADER_BYTES, 0, err);
}

/* Every rank's outcome of the job: a record of (status, message) from each,
 * gathered; when this rank succeeded and another did not, that rank's
 * failure becomes this rank's (so every process agrees). */
struct outcome {
    int32_t rc, code;
    char msg[248];
};

static int exchange_outcomes(struct grank *R, int rc, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    struct outcome mine, *all = calloc((size_t)cb->n, sizeof *all);
    struct dg_error gerr = {0};
    int grc;
    if (!all)
        return rc < 0 ? rc : dg_error_set(err, DG_E_NOMEM, "out of memory");
    memset(&mine, 0, sizeof mine);
    mine.rc = rc;
    mine.code = rc < 0 ? (int32_t)err->code : 0;
    if (rc < 0)
        snprintf(mine.msg, sizeof mine.msg, "%s", err->msg);
    grc = dg_all_gather(dg_nccl_coll(R->nccl), &mine, all, sizeof mine, &gerr);
    if (grc < 0) {
        free(all);
        if (rc < 0)
            return rc;
        *err = gerr;
        return grc;
    }
    for (int q = 0; q < cb->n && rc == 0; q++)
        if (all[q].rc < 0) {
            all[q].msg[sizeof all[q].msg - 1] = '\0';
            rc = dg_error_set(err, all[q].code > 0 ? (enum dg_status)all[q].code : DG_E_INTERNAL,
                              "rank %d (another process): %s", q, all[q].msg);
        }
    free(all);
    return rc;
}

/* Multi-process, a rank other than 0: receive each call rank 0 makes and
 * make it here, until QUIT.  The slots a call names are checked first
 * (the bytes come from our own rank 0, but a wrong slot must not reach
 * an array). */
static int reserve_last(struct cuda_backend *cb, int n, struct dg_error *err);

static int serve_checks(struct grank *R, const struct dg_wire_job *j, struct dg_error *err)
{
    const struct cuda_backend *cb = R->cb;
    const int slots = cb->base.max_slots;
#define SLOT_OK(s, want_open)                                                           \
    ((s) >= 0 && (s) < slots && R->slots[(s)].open == (want_open))
    switch (j->kind) {
    case DG_WIRE_OPEN:
        if (!SLOT_OK(j->slot, 0) || j->max_cl < 1 || j->max_positions < 1)
            return dg_error_set(err, DG_E_INVAL, "serve: open slot %d", j->slot);
        return 0;
    case DG_WIRE_CLOSE:
        return j->slot >= 0 && j->slot < slots ? 0
               : dg_error_set(err, DG_E_INVAL, "serve: close slot %d", j->slot);
    case DG_WIRE_ENCODE:
        for (int i = 0; i < j->n; i++)
            if (!SLOT_OK(j->enc[i].slot, 1))
                return dg_error_set(err, DG_E_INVAL, "serve: encode: slot %d", j->enc[i].slot);
        return 0;
    case DG_WIRE_DENOISE:
        for (int i = 0; i < j->n; i++)
            if (!SLOT_OK(j->den[i].slot, 1) || j->den[i].cl > R->slots[j->den[i].slot].max_cl)
                return dg_error_set(err, DG_E_INVAL, "serve: denoise: slot %d", j->den[i].slot);
        return 0;
    case DG_WIRE_CONDITION:
        for (int i = 0; i < j->n; i++)
            if (j->which[i] < 0 || j->which[i] >= cb->n_last || cb->last[j->which[i]].slot < 0)
                return dg_error_set(err, DG_E_INVAL, "serve: condition: item %d", j->which[i]);
        return 0;
    default:
        return 0;
    }
#undef SLOT_OK
}

static int rank_serve(struct grank *R, struct dg_error *err)
{
    struct cuda_backend *cb = R->cb;
    unsigned char *buf = NULL;
    size_t cap = 0, len;
    int rc = 0;

    if (!cb->mp || R->index == 0)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: serve: not a multi-process rank "
                            "other than 0");
    for (;;) {
        unsigned char head[DG_WIRE_HEADER_BYTES];
        struct dg_wire_job j;
        int jrc;
        /* (idle: waits here, without a deadline, for rank 0's next call) */
        if ((rc = dg_nccl_broadcast_host(R->nccl, head, sizeof head, 0, err)) < 0 ||
            (rc = dg_wire_length(head, (size_t)1 << 30, &len, err)) < 0)
            break;
        if (len > cap) {
            unsigned char *nb = realloc(buf, len);
            if (!nb) {
                rc = dg_error_set(err, DG_E_NOMEM, "serve: out of memory for %zu bytes", len);
                break;
            }
            buf = nb;
            cap = len;
        }
        memcpy(buf, head, sizeof head);
        if ((rc = dg_nccl_broadcast_host(R->nccl, buf + sizeof head, len - sizeof head, 0,
                                         err)) < 0)
            break;
        __atomic_store_n(&R->busy_since_ms, now_ms() + 1, __ATOMIC_RELEASE);
        if ((jrc = dg_wire_decode(buf, len, &j, err)) == 0)
            jrc = serve_checks(R, &j, err);
        if (jrc == 0) {
            switch (j.kind) {
            case DG_WIRE_OPEN:
                cb->slot = j.slot;
                cb->max_positions = j.max_positions;
                cb->max_cl = j.max_cl;
                jrc = rank_open(R, err);
                break;
            case DG_WIRE_CLOSE:
                if (R->slots[j.slot].open)
                    close_slot(R, j.slot);
                for (int i = 0; i < cb->n_last; i++)
                    if (cb->last[i].slot == j.slot)
                        cb->last[i].slot = -1;
                break;
            case DG_WIRE_ENCODE:
                cb->items = j.enc;
                cb->n_items = j.n;
                jrc = rank_encode(R, err);
                break;
            case DG_WIRE_DENOISE: {
                int64_t off = 0;
                cb->n_last = 0;
                if ((jrc = reserve_last(cb, j.n, err)) < 0)
                    break;
                for (int i = 0; i < j.n; i++) {
                    cb->last[i] = (struct last_item){j.den[i].slot, j.den[i].cl, off, 0};
                    off += j.den[i].cl;
                }
                cb->items = j.den;
                cb->n_items = j.n;
                if ((jrc = rank_denoise(R, err)) == 0)
                    cb->n_last = j.n;
                break;
            }
            case DG_WIRE_CONDITION:
                cb->which = j.which;
                cb->n_items = j.n;
                jrc = rank_condition(R, err);
                break;
            default:
                break;
            }
        }
        if (jrc == 0 && j.kind == DG_WIRE_QUIT) {
            dg_wire_job_free(&j);
            __atomic_store_n(&R->busy_since_ms, 0, __ATOMIC_RELEASE);
            break; /* rank 0 is going: so are we (no outcome to gather) */
        }
        dg_wire_job_free(&j);
        jrc = exchange_outcomes(R, jrc, err);
        __atomic_store_n(&R->busy_since_ms, 0, __ATOMIC_RELEASE);
        if (jrc < 0 && err->code != DG_E_INVAL && err->code != DG_E_RANGE) {
            rc = jrc; /* the group is broken: this process ends */
            break;
        }
        if (jrc < 0)
            dg_log(DG_LOG_WARN, "cuda backend: rank %d: a call refused: %s", R->index, err->msg);
    }
    free(buf);
    return rc;
}

static int run_rank(struct grank *R)
{
    struct cuda_backend *cb = R->cb;
    const int travels = cb->mp && R->index == 0 && wire_kind(cb->kind) && cb->kind != JOB_QUIT;
    int rc;
    dg_error_clear(&R->err);
    if (R->skip) {
        R->skip = 0;
        return R->rc = 0;
    }
    if (cb->kind != JOB_INIT && cb->kind != JOB_QUIT &&
        (rc = dg_cuda_use(R->dev, &R->err)) < 0)
        return R->rc = rc;
    if (travels && (rc = send_job(R, &R->err)) < 0)
        return R->rc = rc;
    switch (cb->kind) {
    case JOB_SERVE: rc = rank_serve(R, &R->err); break;
    case JOB_INIT: rc = rank_init(R, &R->err); break;
    case JOB_REGROUP: rc = rank_regroup(R, &R->err); break;
    case JOB_OPEN: rc = rank_open(R, &R->err); break;
    case JOB_CLOSE: close_slot(R, cb->slot); rc = 0; break;
    case JOB_ENCODE: rc = rank_encode(R, &R->err); break;
    case JOB_DENOISE: rc = rank_denoise(R, &R->err); break;
    case JOB_CONDITION: rc = rank_condition(R, &R->err); break;
    default: rc = 0; break;
    }
    if (travels)
        rc = exchange_outcomes(R, rc, &R->err);
    /* the others must not wait for this rank in a collective (a batch
     * refused by its checks is refused alike on every rank, before any
     * collective: no need) */
    if (rc < 0 && cb->n > 1 && R->err.code != DG_E_INVAL && R->err.code != DG_E_RANGE)
        for (int r = 0; r < cb->nl; r++)
            dg_nccl_abort(cb->ranks[r].nccl);
    return R->rc = rc;
}

/* ---- the workers -------------------------------------------------------------------- */

/* The CPUs sysfs lists as local to GPU dev, within the allowed set; 0 if
 * none is known. */
static int gpu_cpus(int dev, const cpu_set_t *allowed, cpu_set_t *out)
{
    char bus[64], path[160], list[4096];
    const char *id = bus;
    FILE *f;
    struct dg_error ignored;
    CPU_ZERO(out);
    if (dg_cuda_pci_id(dev, bus, sizeof bus, &ignored) < 0)
        return 0;
    /* CUDA may write an 8-digit PCI domain; sysfs uses 4 */
    if (strchr(bus, ':') == bus + 8)
        id = bus + 4;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", id);
    if (!(f = fopen(path, "r")))
        return 0;
    if (!fgets(list, sizeof list, f)) {
        fclose(f);
        return 0;
    }
    fclose(f);
    for (char *p = list; *p && *p != '\n';) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            break;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c < CPU_SETSIZE; c++)
            if (c >= 0 && CPU_ISSET((int)c, allowed))
                CPU_SET((int)c, out);
        p = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(out);
}

/* Bind the calling thread to one CPU near its GPU: the r-th of the GPU's
 * local CPUs (or of all allowed ones), wrapping around. */
static void pin_worker(struct grank *R)
{
    struct cuda_backend *cb = R->cb;
    cpu_set_t near, one;
    const cpu_set_t *from = &near;
    int n = gpu_cpus(R->dev, &cb->allowed, &near), k = 0, cpu = -1;
    if (n == 0) {
        from = &cb->allowed;
        n = CPU_COUNT(&cb->allowed);
    }
    if (n == 0)
        return;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, from) && k++ == R->index % n)
            cpu = c;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0)
        dg_log(DG_LOG_INFO, "cuda backend: rank %d (GPU %d) worker pinned to CPU %d%s", R->index,
               R->dev, cpu, from == &near ? " (local to the GPU)" : "");
    else
        dg_log(DG_LOG_WARN, "cuda backend: rank %d (GPU %d) worker: cannot pin to CPU %d",
               R->index, R->dev, cpu);
}

static void *worker(void *arg)
{
    struct grank *R = arg;
    struct cuda_backend *cb = R->cb;
    uint64_t seen = 0;

    if (cb->opt.pin)
        pin_worker(R);
    for (;;) {
        enum job_kind kind;
        pthread_mutex_lock(&cb->mu);
        while (cb->seq == seen)
            pthread_cond_wait(&cb->go, &cb->mu);
        seen = cb->seq;
        kind = cb->kind;
        pthread_mutex_unlock(&cb->mu);
        if (kind == JOB_QUIT) {
            if (cb->mp && R->index == 0 && R->nccl && !dg_nccl_aborted(R->nccl)) {
                struct dg_error ignored;
                if (dg_cuda_use(R->dev, &ignored) == 0)
                    send_job(R, &ignored);
            }
            rank_free(R);
            return NULL;
        }
        run_rank(R);
        pthread_mutex_lock(&cb->mu);
        cb->finished++;
        pthread_cond_broadcast(&cb->done);
        pthread_mutex_unlock(&cb->mu);
    }
}

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Wait for every worker, until the deadline (NULL: for ever); 0 when all
 * finished.  cb->mu held. */
static int wait_workers(struct cuda_backend *cb, const struct timespec *deadline)
{
    while (cb->finished < cb->nl) {
        if (!deadline)
            pthread_cond_wait(&cb->done, &cb->mu);
        else if (pthread_cond_timedwait(&cb->done, &cb->mu, deadline) == ETIMEDOUT)
            return cb->finished < cb->nl ? -1 : 0;
    }
    return 0;
}

static int fail_for_good(struct cuda_backend *cb, struct dg_error *err, const char *fmt,
                         const char *why)
{
    cb->failed = 1;
    snprintf(cb->failure, sizeof cb->failure, fmt, why);
    dg_log(DG_LOG_ERROR, "cuda backend: %s", cb->failure);
    return dg_error_set(err, DG_E_INTERNAL, "cuda backend: %s", cb->failure);
}

static int run_job(struct cuda_backend *cb, enum job_kind kind, struct dg_error *err);

/* A fresh group id and every rank's communicator made from it. */
static int regroup(struct cuda_backend *cb, struct dg_error *err)
{
    int rc;
    if ((rc = dg_nccl_get_id(&cb->id, err)) < 0)
        return rc;
    cb->regroup = 0;
    if ((rc = run_job(cb, JOB_REGROUP, err)) < 0) {
        if (!cb->failed)
            rc = fail_for_good(cb, err, "cannot rebuild the NCCL group: %s", err ? err->msg : "");
        return rc;
    }
    dg_log(DG_LOG_INFO, "cuda backend: NCCL group of %d rebuilt", cb->n);
    return 0;
}

/* Run the job on every rank's worker and wait (bounded by the watchdog);
 * report the first real failure. */
static int run_job(struct cuda_backend *cb, enum job_kind kind, struct dg_error *err)
{
    struct timespec deadline;
    int rc = 0, first = -1, late;

    if (cb->failed)
        return dg_error_set(err, DG_E_INTERNAL, "cuda backend: failed earlier: %s", cb->failure);
    if (cb->regroup && cb->mp)
        return fail_for_good(cb, err, "%s", "the NCCL group of the processes failed and cannot "
                             "be rebuilt from within: restart every process of the group");
    if (cb->regroup && kind != JOB_QUIT && kind != JOB_REGROUP && (rc = regroup(cb, err)) < 0)
        return rc;
    if (kind == JOB_INIT || kind == JOB_REGROUP) { /* every worker is idle here */
        if (cb->gate)
            dg_coll_cpu_reset(cb->gate);
        dg_nccl_shared_reset(cb->shared);
    }
    pthread_mutex_lock(&cb->mu);
    cb->kind = kind;
    cb->finished = 0;
    cb->seq++;
    pthread_cond_broadcast(&cb->go);
    if (cb->opt.timeout_ms > 0 && kind != JOB_INIT && kind != JOB_QUIT)
        deadline_in(&deadline, cb->opt.timeout_ms);
    late = wait_workers(cb, cb->opt.timeout_ms > 0 && kind != JOB_INIT && kind != JOB_QUIT
                                ? &deadline : NULL);
    pthread_mutex_unlock(&cb->mu);
    if (late) {
        /* the watchdog: end every collective in flight, then give the
         * workers a grace period to come back */
        dg_log(DG_LOG_ERROR, "cuda backend: a call ran past %d ms: aborting the NCCL group",
               cb->opt.timeout_ms);
        for (int r = 0; r < cb->nl; r++)
            dg_nccl_abort(cb->ranks[r].nccl);
        if (cb->gate)
            dg_coll_cpu_abort(cb->gate);
        pthread_mutex_lock(&cb->mu);
        deadline_in(&deadline, ABORT_GRACE_MS);
        late = wait_workers(cb, &deadline);
        pthread_mutex_unlock(&cb->mu);
        if (late) {
            cb->stuck = 1;
            return fail_for_good(cb, err, "%s", "a GPU worker did not return after its NCCL "
                                 "group was aborted (a hung kernel?)");
        }
        cb->regroup = cb->n > 1;
        /* the call failed, whatever each rank saw */
        for (int r = 0; r < cb->nl; r++)
            if (cb->ranks[r].rc == 0 || cb->ranks[r].err.code == DG_E_NCCL)
                cb->ranks[r].rc = dg_error_set(&cb->ranks[r].err, DG_E_NCCL, "watchdog: no "
                                               "progress in %d ms (a hung collective?); the "
                                               "NCCL group was aborted", cb->opt.timeout_ms);
    }
    /* the cause, not the ranks that were told to give up */
    for (int r = 0; r < cb->nl; r++)
        if (cb->ranks[r].rc < 0 && (first < 0 || (cb->ranks[first].err.code == DG_E_NCCL &&
                                                  cb->ranks[r].err.code != DG_E_NCCL)))
            first = r;
    if (first >= 0) {
        rc = -cb->ranks[first].err.code;
        if (err) {
            *err = cb->ranks[first].err;
            dg_error_prefix(err, "cuda backend: rank %d (GPU %d)", cb->ranks[first].index,
                            cb->ranks[first].dev);
        }
        if (cb->n > 1)
            cb->regroup = 1;
        /* a lost context cannot be recovered in this process */
        for (int r = 0; r < cb->nl; r++)
            if (cb->ranks[r].rc < 0 && cb->ranks[r].err.code == DG_E_CUDA &&
                kind != JOB_INIT) {
                struct dg_error probe;
                if (dg_cuda_healthy(cb->ranks[r].dev, &probe) < 0)
                    return fail_for_good(cb, err, "GPU context lost: %s", probe.msg), rc;
            }
    }
    return rc;
}

/* ---- the interface ------------------------------------------------------------------ */

static int slot_ok(const struct cuda_backend *cb, int slot, const char *what,
                   struct dg_error *err)
{
    if (slot < 0 || slot >= cb->base.max_slots || !cb->ranks[0].slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: %s: slot %d is not open", what, slot);
    return 0;
}

static void cuda_slot_close(struct dg_backend *b, int slot)
{
    struct cuda_backend *cb = impl(b);
    struct dg_error ignored;
    if (slot < 0 || slot >= b->max_slots || !cb->ranks[0].slots[slot].open)
        return;
    cb->slot = slot;
    if (run_job(cb, JOB_CLOSE, &ignored) < 0)
        dg_log(DG_LOG_WARN, "cuda backend: closing slot %d: %s", slot, ignored.msg);
    for (int i = 0; i < cb->n_last; i++)
        if (cb->last[i].slot == slot)
            cb->last[i].slot = -1;
}

static int cuda_slot_open(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                          struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    int rc;

    if (slot < 0 || slot >= b->max_slots || cb->ranks[0].slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: slot %d is %s", slot,
                            slot < 0 || slot >= b->max_slots ? "out of range" : "already open");
    if (max_cl < 1 || max_positions < 1)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: slot %d: %lld positions, canvas %d",
                            slot, (long long)max_positions, max_cl);
    if (max_positions > b->cfg->max_position_embeddings)
        return dg_error_set(err, DG_E_RANGE, "cuda backend: %lld positions exceed the model's "
                            "%lld", (long long)max_positions,
                            (long long)b->cfg->max_position_embeddings);
    cb->slot = slot;
    cb->max_positions = max_positions;
    cb->max_cl = max_cl;
    if ((rc = run_job(cb, JOB_OPEN, err)) < 0) {
        struct dg_error ignored;
        /* the ranks that opened it close it again */
        run_job(cb, JOB_CLOSE, &ignored);
        dg_error_prefix(err, "slot %d", slot);
    }
    return rc;
}

static int64_t cuda_slot_length(const struct dg_backend *b, int slot)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    if (slot < 0 || slot >= b->max_slots || !cb->ranks[0].slots[slot].open)
        return -1;
    return cb->ranks[0].slots[slot].kv.length;
}

static int cuda_encode(struct dg_backend *b, const struct dg_encode_item *items, int n,
                       struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    int rc;
    if (n < 1)
        return 0;
    for (int i = 0; i < n; i++)
        TRY(slot_ok(cb, items[i].slot, "encode", err));
    cb->items = items;
    cb->n_items = n;
    return run_job(cb, JOB_ENCODE, err);
}

static int reserve_last(struct cuda_backend *cb, int n, struct dg_error *err)
{
    if (n > cb->last_cap) {
        struct last_item *li = realloc(cb->last, sizeof *li * (size_t)n);
        if (!li)
            return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
        cb->last = li;
        cb->last_cap = n;
    }
    return 0;
}

static int cuda_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                        struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    int64_t off = 0;
    int rc;

    cb->n_last = 0;
    if (n < 1)
        return 0;
    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *it = &items[i];
        const struct gslot *s;
        TRY(slot_ok(cb, it->slot, "denoise", err));
        s = &cb->ranks[0].slots[it->slot];
        if (it->n_append < 0 || (it->n_append > 0 && !it->append))
            return dg_error_set(err, DG_E_INVAL, "cuda backend: denoise (slot %d): %lld tokens "
                                "to append%s", it->slot, (long long)it->n_append,
                                it->n_append > 0 ? " and none given" : "");
        if (it->cl < 1 || it->cl > s->max_cl ||
            it->n_append > s->kv.max_length - s->kv.length - it->cl)
            return dg_error_set(err, DG_E_RANGE, "cuda backend: denoise (slot %d): canvas of %d "
                                "after %lld + %lld tokens does not fit (canvas up to %d, %lld "
                                "positions)", it->slot, it->cl, (long long)s->kv.length,
                                (long long)it->n_append, s->max_cl, (long long)s->kv.max_length);
        if (!(it->temperature > 0) || !isfinite(it->temperature) || !(it->top_p > 0))
            return dg_error_set(err, DG_E_INVAL, "cuda backend: denoise (slot %d): temperature "
                                "%g, top_p %g", it->slot, (double)it->temperature,
                                (double)it->top_p);
        for (int j = 0; j < i; j++)
            if (items[j].slot == it->slot)
                return dg_error_set(err, DG_E_INVAL, "cuda backend: denoise: slot %d twice in a "
                                    "batch", it->slot);
    }
    TRY(reserve_last(cb, n, err));
    for (int i = 0; i < n; i++) {
        cb->last[i] = (struct last_item){items[i].slot, items[i].cl, off, 0};
        off += items[i].cl;
    }
    cb->items = items;
    cb->n_items = n;
    TRY(run_job(cb, JOB_DENOISE, err));
    cb->n_last = n;
    return 0;
}

static int cuda_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    for (int i = 0; i < n; i++)
        if (which[i] < 0 || which[i] >= cb->n_last || cb->last[which[i]].slot < 0)
            return dg_error_set(err, DG_E_INVAL, "cuda backend: condition: item %d is not in the "
                                "last denoise batch", which[i]);
    if (n < 1)
        return 0;
    cb->which = which;
    cb->n_items = n;
    return run_job(cb, JOB_CONDITION, err);
}

/* Stop the workers (each frees its rank) and free the rest. */
static void cuda_destroy(struct dg_backend *b)
{
    struct cuda_backend *cb = impl(b);
    int started = 0;
    if (!b)
        return;
    for (int r = 0; r < cb->nl; r++)
        started += cb->ranks[r].started;
    if (started && !cb->stuck) {
        pthread_mutex_lock(&cb->mu);
        cb->kind = JOB_QUIT;
        cb->seq++;
        pthread_cond_broadcast(&cb->go);
        pthread_mutex_unlock(&cb->mu);
        for (int r = 0; r < cb->nl; r++)
            if (cb->ranks[r].started)
                pthread_join(cb->ranks[r].thread, NULL);
    } else if (started) {
        /* a worker may be stuck for good: leave the threads (and their
         * memory) to the process's end */
        return;
    }
    for (int r = 0; r < cb->nl; r++) {
        free(cb->ranks[r].slots);
        free(cb->ranks[r].seqs);
    }
    free(cb->ranks);
    free(cb->last);
    free(cb->wire);
    if (cb->gate)
        dg_coll_cpu_group_free(cb->gate);
    dg_nccl_shared_free(cb->shared);
    pthread_mutex_destroy(&cb->mu);
    pthread_cond_destroy(&cb->go);
    pthread_cond_destroy(&cb->done);
    free(cb);
}

static const char *cuda_failure(const struct dg_backend *b)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    return cb->failed ? cb->failure : NULL;
}

static const struct dg_backend_ops cuda_ops = {
    cuda_slot_open, cuda_slot_close, cuda_slot_length, cuda_encode, cuda_denoise, cuda_condition,
    cuda_destroy, cuda_failure,
};

static uint64_t rank_other(const struct cuda_backend *cb, const struct grank *R, uint64_t *kv)
{
    uint64_t k = 0;
    for (int i = 0; i < cb->base.max_slots; i++)
        if (R->slots[i].open)
            k += R->slots[i].kv.bytes + (uint64_t)dg_elt_size(R->model.elt) *
                                            (uint64_t)R->slots[i].max_cl *
                                            (uint64_t)cb->base.cfg->hidden_size;
    if (kv)
        *kv = k;
    return k + R->cx.scratch_bytes + R->rows_bytes +
           R->probs_bytes;
}

void dg_cuda_backend_bytes(const struct dg_backend *b, uint64_t *weights, uint64_t *other)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    *weights = *other = 0;
    for (int r = 0; r < cb->nl; r++) {
        *weights += cb->ranks[r].model.bytes;
        *other += rank_other(cb, &cb->ranks[r], NULL);
    }
}

int dg_cuda_backend_rank_usage(const struct dg_backend *b, int r, struct dg_cuda_rank_usage *u)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    const struct grank *R;
    size_t free_b = 0, total_b = 0;
    struct dg_error ignored;
    if (r < 0 || r >= cb->nl)
        return -1;
    R = &cb->ranks[r];
    memset(u, 0, sizeof *u);
    u->device = R->dev;
    u->vocab_rows = R->model.nv;
    u->logits_cols = R->model.nv;
    u->weights = R->model.bytes;
    u->embedding = (uint64_t)R->model.nv * (uint64_t)b->cfg->hidden_size *
                   (uint64_t)dg_elt_size(R->model.elt);
    u->scratch = rank_other(cb, R, &u->kv) - u->kv;
    if (dg_cuda_mem_info(&free_b, &total_b, R->dev, &ignored) == 0)
        u->device_used = (uint64_t)(total_b - free_b);
    if (R->nccl)
        u->coll = dg_nccl_coll(R->nccl)->stats;
    u->captures = R->captures;
    u->replays = R->replays;
    return 0;
}

int dg_cuda_backend_profile(struct dg_backend *b, int which, struct dg_prof_total *out, int max,
                            int reset)
{
    struct cuda_backend *cb = impl(b);
    struct dg_prof *p;
    int n;
    if (which < 0 || which > 1 || !cb->nl || cb->ranks[0].index != 0 ||
        !(p = cb->ranks[0].prof[which]))
        return -1;
    n = dg_prof_totals(p, out, max);
    if (reset)
        dg_prof_reset(p);
    return n;
}

double dg_cuda_backend_step_ms(const struct dg_backend *b)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    if (!cb->nl || cb->ranks[0].index != 0)
        return -1;
    return cb->ranks[0].step_ms;
}

int dg_cuda_backend_ranks(const struct dg_backend *b)
{
    return ((const struct cuda_backend *)b)->nl;
}

int dg_cuda_backend_failed(const struct dg_backend *b)
{
    return ((const struct cuda_backend *)b)->failed;
}

void dg_cuda_backend_inject_skip(struct dg_backend *b, int r)
{
    struct cuda_backend *cb = impl(b);
    if (r >= 0 && r < cb->nl)
        cb->ranks[r].skip = 1;
}

int dg_cuda_backend_serve(struct dg_backend *b, volatile const int *stop, struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    struct grank *R = &cb->ranks[0];
    int aborted = 0;
    if (!cb->mp || R->index == 0)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: serve: not a multi-process rank "
                            "other than 0");
    if (cb->failed)
        return dg_error_set(err, DG_E_INTERNAL, "cuda backend: failed earlier: %s", cb->failure);
    pthread_mutex_lock(&cb->mu);
    cb->kind = JOB_SERVE;
    cb->finished = 0;
    cb->seq++;
    pthread_cond_broadcast(&cb->go);
    while (cb->finished < cb->nl) {
        struct timespec deadline;
        int64_t busy;
        deadline_in(&deadline, 200);
        if (pthread_cond_timedwait(&cb->done, &cb->mu, &deadline) != ETIMEDOUT)
            continue;
        busy = __atomic_load_n(&R->busy_since_ms, __ATOMIC_ACQUIRE);
        if (aborted)
            continue;
        if ((stop && *stop) ||
            (cb->opt.timeout_ms > 0 && busy && now_ms() - busy > cb->opt.timeout_ms)) {
            /* end the collective the worker waits in; it returns */
            dg_log(stop && *stop ? DG_LOG_INFO : DG_LOG_ERROR, "cuda backend: rank %d: %s: "
                   "aborting its NCCL communicator", R->index,
                   stop && *stop ? "asked to stop" : "watchdog: a call ran too long");
            dg_nccl_abort(R->nccl);
            aborted = 1;
        }
    }
    pthread_mutex_unlock(&cb->mu);
    if (R->rc < 0) {
        *err = R->err;
        if (aborted)
            dg_error_prefix(err, "%s", stop && *stop ? "stopped" : "watchdog");
        cb->failed = 1;
        snprintf(cb->failure, sizeof cb->failure, "%s", err->msg);
        return R->rc;
    }
    return 0;
}

int dg_cuda_backend_create(const struct dg_cuda_backend_options *o, struct dg_backend **out,
                           struct dg_error *err)
{
    struct cuda_backend *cb;
    const struct dg_model_config *cfg = o->model ? &o->model->cfg : o->cfg;
    const int n = o->n_ranks > 1 ? o->n_ranks : 1;
    const int mp = o->process_rank >= 0 && o->nccl_id;
    const int nl = mp ? 1 : n;
    int rc;

    *out = NULL;
    if (o->max_slots < 1 || !cfg || (!o->model && o->fp32) || (o->model && o->fp8) ||
        n > DG_TP_MAX || o->fault_start_rank < 0 || o->fault_start_rank > n ||
        (o->shared_gpu && (mp || n > DG_NCCL_SHARED_MAX)) ||
        o->timeout_ms < 0 || (mp && o->process_rank >= n))
        return dg_error_set(err, DG_E_INVAL, "cuda backend: %d slots, %d ranks%s, %s",
                            o->max_slots, n, mp ? " (one in this process)" : "",
                            o->model ? (o->fp8 ? "a model with option fp8 (a checkpoint's "
                                                 "own dtypes say which matrices are FP8)"
                                               : "a model")
                            : !o->cfg ? "no model and no config"
                            : o->fp32 ? "random weights are bf16 only" : "a config");
    cb = calloc(1, sizeof *cb);
    if (!cb)
        return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
    cb->opt = *o;
    if (o->shared_gpu)
        cb->opt.graphs = 0; /* (nccl.h: a shared group's collectives are not capturable) */
    cb->n = n;
    cb->nl = nl;
    cb->mp = mp;
    pthread_mutex_init(&cb->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&cb->done, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_cond_init(&cb->go, NULL);
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->base.max_slots = o->max_slots;
    cb->base.cfg = cfg;
    if (sched_getaffinity(0, sizeof cb->allowed, &cb->allowed) != 0)
        CPU_ZERO(&cb->allowed);
    if ((rc = dg_tp_plan_build_aligned(cfg, n, o->experts, 1, DG_CUDA_WIDTH_ALIGN, &cb->plan,
                                       err)) < 0) {
        cuda_destroy(&cb->base);
        return rc;
    }
    cb->ranks = calloc((size_t)nl, sizeof *cb->ranks);
    if (!cb->ranks) {
        cuda_destroy(&cb->base);
        return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
    }
    for (int r = 0; r < nl; r++) {
        struct grank *R = &cb->ranks[r];
        R->cb = cb;
        R->index = mp ? o->process_rank : r;
        R->dev = mp || n == 1 ? (o->devices ? o->devices[0] : o->device)
                              : (o->devices ? o->devices[r] : r);
        if (o->shared_gpu)
            R->dev = o->device;
        for (int q = 0; q < r && !o->fault_start_rank && !o->shared_gpu; q++)
            if (cb->ranks[q].dev == R->dev) {
                cuda_destroy(&cb->base);
                return dg_error_set(err, DG_E_INVAL, "cuda backend: GPU %d named twice", R->dev);
            }
        R->slots = calloc((size_t)o->max_slots, sizeof *R->slots);
        if (!R->slots) {
            cuda_destroy(&cb->base);
            return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
        }
    }
    {
        /* every GPU must exist before any rank waits for the others */
        int have = 0;
        if ((rc = dg_gpu_count(&have, err)) < 0) {
            cuda_destroy(&cb->base);
            return rc;
        }
        for (int r = 0; r < nl; r++)
            if (cb->ranks[r].dev < 0 || cb->ranks[r].dev >= have) {
                const int dev = cb->ranks[r].dev, idx = cb->ranks[r].index;
                cuda_destroy(&cb->base);
                return dg_error_set(err, DG_E_NODEV, "cuda backend: rank %d: no GPU %d (%d "
                                    "visible)", idx, dev, have);
            }
    }
    if (nl > 1 && ((rc = dg_coll_cpu_group_create(nl, &cb->gate, err)) < 0 ||
                   (o->shared_gpu && (rc = dg_nccl_shared_create(nl, &cb->shared, err)) < 0))) {
        cuda_destroy(&cb->base);
        return rc;
    }
    if (mp)
        cb->id = *o->nccl_id;
    else if (n > 1 && (rc = dg_nccl_get_id(&cb->id, err)) < 0) {
        cuda_destroy(&cb->base);
        return rc;
    }
    for (int r = 0; r < nl; r++) {
        if (pthread_create(&cb->ranks[r].thread, NULL, worker, &cb->ranks[r]) != 0) {
            cuda_destroy(&cb->base);
            return dg_error_set(err, DG_E_INTERNAL, "cuda backend: cannot start the worker of "
                                "GPU %d", cb->ranks[r].dev);
        }
        cb->ranks[r].started = 1;
    }
    /* every rank loads its share and joins the group on its own thread
     * (in multi-process mode, each process its own rank) */
    if ((rc = run_job(cb, JOB_INIT, err)) < 0) {
        cuda_destroy(&cb->base);
        return rc;
    }
    cb->base.cfg = &cb->ranks[0].model.cfg;
    *out = &cb->base;
    return 0;
}
