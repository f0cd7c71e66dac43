/* tp-forward.c - a forward pass on T rank threads (see tp-forward.h). */
#include "lib/tp-forward.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cpu-forward.h"
#include "lib/kv-cache.h"

struct run_arg {
    int (*fn)(void *ctx, int rank, struct dg_error *err);
    void *ctx;
    int rank, rc;
    struct dg_error *err;
    struct dg_coll_cpu_group *group;
};

static void *run_thread(void *p)
{
    struct run_arg *a = p;
    a->rc = a->fn(a->ctx, a->rank, a->err);
    if (a->rc < 0 && a->group)
        dg_coll_cpu_abort(a->group);
    return NULL;
}

int dg_tp_run(int n, int (*fn)(void *ctx, int rank, struct dg_error *err), void *ctx,
              struct dg_coll_cpu_group *group, struct dg_error *errs, int *failed)
{
    struct run_arg *args = calloc((size_t)n, sizeof *args);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    int *started = calloc((size_t)n, sizeof *started);
    int first = -1;

    if (failed)
        *failed = -1;
    if (!args || !th || !started) {
        free(args);
        free(th);
        free(started);
        return dg_error_set(&errs[0], DG_E_NOMEM, "tensor parallel: out of memory");
    }
    for (int r = 0; r < n; r++) {
        args[r] = (struct run_arg){fn, ctx, r, 0, &errs[r], group};
        dg_error_clear(&errs[r]);
    }
    for (int r = 1; r < n; r++) {
        if (pthread_create(&th[r], NULL, run_thread, &args[r]) != 0) {
            args[r].rc = dg_error_set(&errs[r], DG_E_INTERNAL,
                                      "tensor parallel: cannot start rank thread %d", r);
            if (group)
                dg_coll_cpu_abort(group);
            continue;
        }
        started[r] = 1;
    }
    run_thread(&args[0]);
    for (int r = 1; r < n; r++)
        if (started[r])
            pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        if (args[r].rc < 0 && (first < 0 || (errs[first].code == DG_E_INTERNAL &&
                                             errs[r].code != DG_E_INTERNAL)))
            first = r;
    if (group)
        dg_coll_cpu_reset(group);
    free(args);
    free(th);
    free(started);
    if (failed)
        *failed = first;
    return first < 0 ? 0 : -errs[first].code;
}

struct fwd_ctx {
    const struct dg_model *m;
    const struct dg_tp_plan *plan;
    struct dg_coll_cpu_group *group;
    struct dg_tp_forward_job *job;
};

static int rank_forward(void *p, int r, struct dg_error *err)
{
    struct fwd_ctx *c = p;
    struct dg_tp_forward_job *job = c->job;
    const struct dg_model_config *cfg = &c->m->cfg;
    struct dg_coll *coll = c->group ? dg_coll_cpu_rank(c->group, r) : NULL;
    struct dg_mem_ledger *ledger = job->ledgers ? &job->ledgers[r] : NULL;
    struct dg_cpu_model cm;
    struct dg_kv_cache kv;
    float *local = NULL;
    int64_t total = job->n_prompt + job->n_canvas;
    int rc;

    memset(&kv, 0, sizeof kv);
    for (int i = 0; i < job->n_commit; i++)
        total += job->n_commits[i];
    if ((rc = dg_cpu_model_init_rank(&cm, c->m, c->plan, r, coll, ledger, err)) < 0)
        return rc;
    if ((rc = dg_cpu_kv_init(&cm, &kv, total, err)) < 0)
        goto out;
    if (kv.max_length < total) {
        rc = dg_error_set(err, DG_E_RANGE, "%lld positions exceed max_position_embeddings %lld",
                          (long long)total, (long long)cfg->max_position_embeddings);
        goto out;
    }
    {
        const int hidden_here = !job->canvas && r == 0;
        if ((rc = dg_cpu_encode(&cm, &kv, job->prompt, job->n_prompt,
                                hidden_here && job->n_commit == 0 ? job->out : NULL, err)) < 0)
            goto out;
        for (int i = 0; i < job->n_commit; i++)
            if ((rc = dg_cpu_encode(&cm, &kv, job->commits[i], job->n_commits[i],
                                    hidden_here && i == job->n_commit - 1 ? job->out : NULL,
                                    err)) < 0)
                goto out;
        if (!job->canvas) {
            /* every rank computed the hidden states; rank 0 wrote them */
            rc = 0;
            goto out;
        }
    }
    local = malloc(sizeof(float) * (size_t)(job->n_canvas * cm.nv));
    if (!local) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory for logits");
        goto out;
    }
    dg_ledger_alloc(ledger, sizeof(float) * (uint64_t)(job->n_canvas * cm.nv));
    rc = dg_cpu_decode(&cm, &kv, job->canvas, job->n_canvas,
                       job->sc_logits ? job->sc_logits + cm.v0 : NULL, cfg->vocab_size, local,
                       err);
    if (rc == 0)
        for (int64_t t = 0; t < job->n_canvas; t++)
            memcpy(job->out + t * cfg->vocab_size + cm.v0, local + t * cm.nv,
                   sizeof(float) * (size_t)cm.nv);
    dg_ledger_free(ledger, sizeof(float) * (uint64_t)(job->n_canvas * cm.nv));
out:
    if (job->stats && coll)
        job->stats[r] = coll->stats;
    free(local);
    dg_kv_cache_free(&kv);
    dg_cpu_model_free(&cm);
    return rc;
}

int dg_tp_forward(const struct dg_model *m, int n_ranks, enum dg_expert_split experts,
                  struct dg_tp_forward_job *job, struct dg_error *err)
{
    struct dg_tp_plan plan;
    struct dg_coll_cpu_group *group = NULL;
    struct dg_error *errs;
    struct fwd_ctx c;
    int rc, failed;

    if ((rc = dg_tp_plan_build(&m->cfg, n_ranks, experts, 1, &plan, err)) < 0)
        return rc;
    if (n_ranks > 1 && (rc = dg_coll_cpu_group_create(n_ranks, &group, err)) < 0)
        return rc;
    errs = calloc((size_t)n_ranks, sizeof *errs);
    if (!errs) {
        dg_coll_cpu_group_free(group);
        return dg_error_set(err, DG_E_NOMEM, "tensor parallel: out of memory");
    }
    if (job->stats)
        memset(job->stats, 0, sizeof *job->stats * (size_t)n_ranks);
    c = (struct fwd_ctx){m, &plan, group, job};
    rc = dg_tp_run(n_ranks, rank_forward, &c, group, errs, &failed);
    if (rc < 0 && err) {
        *err = errs[failed];
        if (n_ranks > 1)
            dg_error_prefix(err, "rank %d", failed);
    }
    free(errs);
    dg_coll_cpu_group_free(group);
    return rc;
}
