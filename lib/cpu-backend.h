/*
 * cpu-backend.h - the backend interface (backend.h) over the CPU forward
 * pass: the reference every other backend is compared with, whole or
 * tensor-parallel over T rank threads (tp-plan.h, coll.h).
 *
 * Each rank holds its shard of the weights, its share of every request's
 * KV cache (its KV heads) and its partial self-conditioning embedding.  A
 * denoise step on every rank: the forward pass (collectives inside), the
 * filter thresholds (summed bisection counts), its vocabulary slice's
 * sampler statistics, one all-gather that combines them; condition: its
 * probabilities times its embedding rows, kept as a partial sum until the
 * next step's embedding all-reduce adds the ranks' parts.  No rank holds a
 * full-vocabulary row of logits or probabilities or the whole embedding
 * (with T >= 2).  With T = 1 no thread is started and no collective runs.
 *
 * Items of a batch run one after another, each exactly as it would alone,
 * so a request's result never depends on its batch.  A denoise batch's
 * appended tokens (backend.h) run first, as one encode job, then its
 * steps.
 *
 * Threads: rank r > 0 always has its own worker thread; with `workers`
 * rank 0 has one too and the calling thread only hands each batch to the
 * workers and waits for them (what the daemon's scheduler does).  Workers
 * wait on a condition variable between batches; with `pin` each is bound
 * to one CPU (sched affinity), logged through lib/log.h.
 */
#ifndef DG_CPU_BACKEND_H
#define DG_CPU_BACKEND_H

#include "lib/backend.h"
#include "lib/coll.h"
#include "lib/cpu-forward.h"
#include "lib/mem-ledger.h"
#include "lib/tp-plan.h"

struct dg_cpu_backend_options {
    int n_ranks;                   /* tensor-parallel degree, 1 .. DG_TP_MAX */
    enum dg_expert_split experts;  /* how experts are split (n_ranks > 1) */
    int max_slots;                 /* requests in flight */
    struct dg_mem_ledger *ledgers; /* optional [n_ranks]: what each rank holds */
    int workers;                   /* 1: rank 0 too runs on a worker thread (the daemon);
                                      0: on the calling thread */
    int pin;                       /* 1: pin worker r to the r-th CPU this process may use */
};

/* A backend over m (which must outlive it).  Errors: DG_E_INVAL (a plan
 * that does not fit the model), DG_E_NOMEM, thread creation failures
 * (DG_E_INTERNAL). */
int dg_cpu_backend_create(const struct dg_model *m, const struct dg_cpu_backend_options *o,
                          struct dg_backend **out, struct dg_error *err);

/* The plan in use. */
const struct dg_tp_plan *dg_cpu_backend_plan(const struct dg_backend *b);

/* Rank r's collective counters (all zero with one rank). */
struct dg_coll_stats dg_cpu_backend_coll_stats(const struct dg_backend *b, int r);

#endif
