/* cpu-backend.c - the backend interface over the CPU forward pass, on one
 * or more rank threads (see cpu-backend.h). */
#include "lib/cpu-backend.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/sampler.h"

struct rank_slot {
    struct dg_kv_cache kv;
    double *soft;             /* [max_cl, H] this rank's part of sum_v p_v E[v] */
};

/* the last denoise batch, per item (the same on every rank) */
struct last_item {
    int slot, cl;
    float temperature;
    size_t off;               /* first row in the batch buffers */
};

struct rank {
    struct dg_cpu_model cm;
    struct dg_coll *coll;     /* NULL with one rank */
    struct dg_mem_ledger *ledger;
    struct rank_slot *slots;
    /* the last denoise batch: this rank's logits columns, and per row the
     * filter threshold and the combined statistics */
    float *logits;            /* [rows, nv] */
    float *tau;
    struct dg_row_stats *local, *combined, *gather;
    float *filter_scratch;    /* [rows, nv] */
    size_t rows_cap;
    uint64_t held;            /* bytes of the buffers above, for the ledger */
    /* the job's outcome */
    int rc;
    struct dg_error err;
    pthread_t thread;
    int started;
    struct cpu_backend *cb;   /* for the thread */
    int index;
};

enum job_kind { JOB_NONE = 0, JOB_ENCODE, JOB_DENOISE, JOB_CONDITION, JOB_QUIT };

struct cpu_backend {
    struct dg_backend base;
    int workers;              /* rank 0 on a worker thread too */
    int pin;
    cpu_set_t allowed;        /* the CPUs this process may run on (for pinning) */
    const struct dg_model *m;
    struct dg_tp_plan plan;
    struct dg_coll_cpu_group *group;
    struct rank *ranks;
    int *slot_open, *slot_max_cl;
    struct last_item *last;
    int n_last, last_cap;
    struct dg_encode_item *appends;   /* a denoise batch's appends, as encode items */
    int appends_cap;
    /* the job every rank runs */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t seq;
    int finished;
    enum job_kind kind;
    const struct dg_encode_item *enc;
    struct dg_denoise_item *den;
    const int *which;
    int n;
};

static struct cpu_backend *impl(struct dg_backend *b)
{
    return (struct cpu_backend *)b;
}

/* ---- per-rank work ------------------------------------------------------- */

/* The per-row buffers freed, their bytes off the ledger, no rows held */
static void free_rows(struct rank *R)
{
    free(R->logits);
    free(R->tau);
    free(R->local);
    free(R->combined);
    free(R->gather);
    free(R->filter_scratch);
    R->logits = R->tau = R->filter_scratch = NULL;
    R->local = R->combined = R->gather = NULL;
    dg_ledger_free(R->ledger, R->held);
    R->held = 0;
    R->rows_cap = 0;
}

static int reserve_rows(struct rank *R, size_t rows, int n_ranks, struct dg_error *err)
{
    const size_t nv = (size_t)R->cm.nv;
    uint64_t bytes;
    if (rows <= R->rows_cap)
        return 0;
    free_rows(R);
    R->logits = malloc(sizeof(float) * rows * nv);
    R->tau = malloc(sizeof(float) * rows);
    R->local = malloc(sizeof *R->local * rows);
    R->combined = malloc(sizeof *R->combined * rows);
    R->gather = malloc(sizeof *R->gather * rows * (size_t)n_ranks);
    R->filter_scratch = malloc(sizeof(float) * rows * nv);
    if (!R->logits || !R->tau || !R->local || !R->combined || !R->gather || !R->filter_scratch)
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for %zu rows", rows);
    R->rows_cap = rows;
    dg_ledger_alloc(R->ledger, sizeof(float) * rows * nv);
    dg_ledger_alloc(R->ledger, sizeof(float) * rows * nv);
    dg_ledger_alloc(R->ledger, sizeof *R->gather * rows * (size_t)n_ranks);
    bytes = 2 * sizeof(float) * rows * nv + sizeof *R->gather * rows * (size_t)n_ranks;
    dg_ledger_hold(R->ledger, (sizeof(float) + 2 * sizeof *R->local) * rows);
    bytes += (sizeof(float) + 2 * sizeof *R->local) * rows;
    R->held = bytes;
    return 0;
}

static int rank_encode(struct cpu_backend *cb, struct rank *R, struct dg_error *err)
{
    int rc;
    for (int i = 0; i < cb->n; i++) {
        const struct dg_encode_item *it = &cb->enc[i];
        if ((rc = dg_cpu_encode(&R->cm, &R->slots[it->slot].kv, it->ids, it->n, NULL, err)) < 0)
            return rc;
    }
    return 0;
}

static int rank_denoise(struct cpu_backend *cb, struct rank *R, int is_root, struct dg_error *err)
{
    const int64_t nv = R->cm.nv, V = cb->base.cfg->vocab_size;
    size_t rows = 0, off = 0;
    int rc;

    for (int i = 0; i < cb->n; i++)
        rows += (size_t)cb->den[i].cl;
    if ((rc = reserve_rows(R, rows, cb->plan.n_ranks, err)) < 0)
        return rc;
    for (int i = 0; i < cb->n; i++) {
        struct dg_denoise_item *it = &cb->den[i];
        struct rank_slot *s = &R->slots[it->slot];
        float *z = R->logits + off * (size_t)nv;

        if ((rc = dg_cpu_decode_soft(&R->cm, &s->kv, it->canvas, it->cl,
                                     it->self_cond ? s->soft : NULL, z, err)) < 0)
            return rc;
        if ((rc = dg_filter_thresholds(z, it->cl, nv, nv, V, it->top_k, it->top_p,
                                       R->tau + off, R->filter_scratch, R->coll, err)) < 0)
            return rc;
        for (int p = 0; p < it->cl; p++) {
            const struct dg_rand_site site = {it->seed, it->canvas_index, it->step, (uint32_t)p};
            dg_row_stats_slice(z + (size_t)p * (size_t)nv, R->cm.v0, nv, it->temperature,
                               R->tau[off + (size_t)p], &site, &R->local[off + (size_t)p]);
        }
        if ((rc = dg_row_stats_allgather(R->coll, R->local + off, it->cl, R->combined + off,
                                         R->gather, err)) < 0)
            return rc;
        if (is_root) {
            /* one writer for the shared outputs; every rank has the same values */
            it->nonfinite = dg_row_outputs(R->combined + off, it->cl, it->sample, it->argmax,
                                           it->entropy);
            cb->last[i] = (struct last_item){it->slot, it->cl, it->temperature, off};
        }
        off += (size_t)it->cl;
    }
    return 0;
}

static int rank_condition(struct cpu_backend *cb, struct rank *R, struct dg_error *err)
{
    const int64_t nv = R->cm.nv;
    float *probs = NULL;
    size_t cap = 0;
    int rc = 0;

    for (int i = 0; i < cb->n && rc == 0; i++) {
        const struct last_item *li = &cb->last[cb->which[i]];
        if ((size_t)li->cl > cap) {
            free(probs);
            dg_ledger_free(R->ledger, sizeof(float) * cap * (size_t)nv);
            probs = malloc(sizeof(float) * (size_t)li->cl * (size_t)nv);
            if (!probs)
                return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for "
                                    "self-conditioning");
            cap = (size_t)li->cl;
            dg_ledger_alloc(R->ledger, sizeof(float) * cap * (size_t)nv);
        }
        for (int p = 0; p < li->cl; p++) {
            const size_t r = li->off + (size_t)p;
            dg_row_probs(R->logits + r * (size_t)nv, nv, li->temperature, R->tau[r],
                         &R->combined[r], probs + (size_t)p * (size_t)nv);
        }
        rc = dg_cpu_soft_embed(&R->cm, probs, li->cl, R->slots[li->slot].soft, err);
    }
    dg_ledger_free(R->ledger, sizeof(float) * cap * (size_t)nv);
    free(probs);
    return rc;
}

static int run_rank(struct cpu_backend *cb, int r)
{
    struct rank *R = &cb->ranks[r];
    dg_error_clear(&R->err);
    switch (cb->kind) {
    case JOB_ENCODE: R->rc = rank_encode(cb, R, &R->err); break;
    case JOB_DENOISE: R->rc = rank_denoise(cb, R, r == 0, &R->err); break;
    case JOB_CONDITION: R->rc = rank_condition(cb, R, &R->err); break;
    default: R->rc = 0; break;
    }
    /* the others must not wait for this rank in a collective */
    if (R->rc < 0 && cb->group)
        dg_coll_cpu_abort(cb->group);
    return R->rc;
}

/* Bind the calling thread to the r-th allowed CPU (wrapping around). */
static void pin_to(struct cpu_backend *cb, int r)
{
    const int n = CPU_COUNT(&cb->allowed);
    cpu_set_t one;
    int k = 0, cpu = -1;
    if (n <= 0)
        return;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &cb->allowed) && k++ == r % n)
            cpu = c;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0)
        dg_log(DG_LOG_INFO, "cpu backend: rank %d worker pinned to CPU %d", r, cpu);
    else
        dg_log(DG_LOG_WARN, "cpu backend: rank %d worker: cannot pin to CPU %d", r, cpu);
}

static void *rank_thread(void *arg)
{
    struct rank *R = arg;
    struct cpu_backend *cb = R->cb;
    const int r = R->index;
    uint64_t seen = 0;

    if (cb->pin)
        pin_to(cb, r);
    for (;;) {
        pthread_mutex_lock(&cb->mu);
        while (cb->seq == seen)
            pthread_cond_wait(&cb->go, &cb->mu);
        seen = cb->seq;
        pthread_mutex_unlock(&cb->mu);
        if (cb->kind == JOB_QUIT)
            return NULL;
        run_rank(cb, r);
        pthread_mutex_lock(&cb->mu);
        cb->finished++;
        pthread_cond_signal(&cb->done);
        pthread_mutex_unlock(&cb->mu);
    }
}

/* Run the job on every rank (rank 0 here, the others on their threads) and
 * report the first real failure. */
static int run_job(struct cpu_backend *cb, enum job_kind kind, struct dg_error *err)
{
    const int n = cb->plan.n_ranks;
    const int threads = cb->workers ? n : n - 1; /* ranks on worker threads */
    int rc = 0, first = -1;

    cb->kind = kind;
    if (threads > 0) {
        pthread_mutex_lock(&cb->mu);
        cb->finished = 0;
        cb->seq++;
        pthread_cond_broadcast(&cb->go);
        pthread_mutex_unlock(&cb->mu);
    }
    if (!cb->workers)
        run_rank(cb, 0);
    if (threads > 0) {
        pthread_mutex_lock(&cb->mu);
        while (cb->finished < threads)
            pthread_cond_wait(&cb->done, &cb->mu);
        pthread_mutex_unlock(&cb->mu);
    }
    /* the cause, not the ranks that were told to give up */
    for (int r = 0; r < n; r++)
        if (cb->ranks[r].rc < 0 && (first < 0 || (cb->ranks[first].err.code == DG_E_INTERNAL &&
                                                  cb->ranks[r].err.code != DG_E_INTERNAL)))
            first = r;
    if (first >= 0) {
        rc = -cb->ranks[first].err.code;
        if (err)
            *err = cb->ranks[first].err;
        if (n > 1)
            dg_error_prefix(err, "rank %d", first);
    }
    if (cb->group)
        dg_coll_cpu_reset(cb->group);
    return rc;
}

/* ---- the interface -------------------------------------------------------- */

static int slot_ok(const struct cpu_backend *cb, int slot, const char *what, struct dg_error *err)
{
    if (slot < 0 || slot >= cb->base.max_slots || !cb->slot_open[slot])
        return dg_error_set(err, DG_E_INVAL, "cpu backend: %s: slot %d is not open", what, slot);
    return 0;
}

static void cpu_slot_close(struct dg_backend *b, int slot)
{
    struct cpu_backend *cb = impl(b);
    if (slot < 0 || slot >= b->max_slots || !cb->slot_open[slot])
        return;
    for (int r = 0; r < cb->plan.n_ranks; r++) {
        struct rank *R = &cb->ranks[r];
        struct rank_slot *s = &R->slots[slot];
        dg_ledger_free(R->ledger, sizeof(double) * (uint64_t)cb->slot_max_cl[slot] *
                                      (uint64_t)b->cfg->hidden_size);
        dg_kv_cache_free(&s->kv);
        free(s->soft);
        memset(s, 0, sizeof *s);
    }
    cb->slot_open[slot] = 0;
    /* the last batch may name this slot; forget it */
    for (int i = 0; i < cb->n_last; i++)
        if (cb->last[i].slot == slot)
            cb->last[i].slot = -1;
}

static int cpu_slot_open(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                         struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    int rc;

    if (slot < 0 || slot >= b->max_slots || cb->slot_open[slot])
        return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d is %s", slot,
                            slot < 0 || slot >= b->max_slots ? "out of range" : "already open");
    if (max_cl < 1 || max_positions < 1)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d: %lld positions, canvas %d",
                            slot, (long long)max_positions, max_cl);
    if (max_positions > b->cfg->max_position_embeddings)
        return dg_error_set(err, DG_E_RANGE, "cpu backend: %lld positions exceed the model's %lld",
                            (long long)max_positions, (long long)b->cfg->max_position_embeddings);
    cb->slot_open[slot] = 1;
    cb->slot_max_cl[slot] = max_cl;
    for (int r = 0; r < cb->plan.n_ranks; r++) {
        struct rank *R = &cb->ranks[r];
        struct rank_slot *s = &R->slots[slot];
        const size_t soft = sizeof(double) * (size_t)max_cl * (size_t)b->cfg->hidden_size;
        if ((rc = dg_cpu_kv_init(&R->cm, &s->kv, max_positions, err)) < 0) {
            cpu_slot_close(b, slot);
            return rc;
        }
        s->soft = malloc(soft);
        if (!s->soft) {
            cpu_slot_close(b, slot);
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for slot %d", slot);
        }
        dg_ledger_alloc(R->ledger, soft); /* (the KV cache: see dg_tp_plan_bytes) */
    }
    return 0;
}

static int64_t cpu_slot_length(const struct dg_backend *b, int slot)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)b;
    if (slot < 0 || slot >= b->max_slots || !cb->slot_open[slot])
        return -1;
    return cb->ranks[0].slots[slot].kv.length;
}

static int check_ids(const struct dg_model_config *c, const int32_t *ids, int64_t n,
                     const char *what, int slot, struct dg_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return dg_error_set(err, DG_E_INVAL, "cpu backend: %s (slot %d): token %lld is id %d, "
                                "outside [0, %lld)", what, slot, (long long)i, ids[i],
                                (long long)c->vocab_size);
    return 0;
}

static int cpu_encode(struct dg_backend *b, const struct dg_encode_item *items, int n,
                      struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    int rc;

    for (int i = 0; i < n; i++) {
        const struct dg_kv_cache *kv;
        if ((rc = slot_ok(cb, items[i].slot, "encode", err)) < 0)
            return rc;
        kv = &cb->ranks[0].slots[items[i].slot].kv;
        if (items[i].n < 1 || kv->length + items[i].n > kv->max_length)
            return dg_error_set(err, DG_E_RANGE, "cpu backend: encode (slot %d): %lld tokens "
                                "after %lld do not fit %lld positions", items[i].slot,
                                (long long)items[i].n, (long long)kv->length,
                                (long long)kv->max_length);
        if ((rc = check_ids(b->cfg, items[i].ids, items[i].n, "encode", items[i].slot, err)) < 0)
            return rc;
        for (int j = 0; j < i; j++)
            if (items[j].slot == items[i].slot)
                return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d twice in one batch",
                                    items[i].slot);
    }
    cb->enc = items;
    cb->n = n;
    return run_job(cb, JOB_ENCODE, err);
}

/* Check denoise item i of items[0..n) before anything runs: its slot, its
 * append (ids inside the vocabulary, alone on its slot in the batch), room
 * for the appended tokens and the canvas after them, its settings and
 * canvas ids.  0, or DG_E_INVAL / DG_E_RANGE with the item named. */
static int check_denoise_item(const struct cpu_backend *cb, const struct dg_denoise_item *items,
                              int i, struct dg_error *err)
{
    const struct dg_model_config *c = cb->base.cfg;
    const struct dg_denoise_item *it = &items[i];
    const struct dg_kv_cache *kv;
    int rc;

    if ((rc = slot_ok(cb, it->slot, "denoise", err)) < 0)
        return rc;
    kv = &cb->ranks[0].slots[it->slot].kv;
    if (it->n_append < 0 || (it->n_append > 0 && !it->append))
        return dg_error_set(err, DG_E_INVAL, "cpu backend: denoise (slot %d): an append of "
                            "%lld tokens%s", it->slot, (long long)it->n_append,
                            it->n_append > 0 ? " without ids" : "");
    if (it->cl < 1 || it->cl > cb->slot_max_cl[it->slot] ||
        it->n_append > kv->max_length - kv->length - it->cl)
        return dg_error_set(err, DG_E_RANGE, "cpu backend: denoise (slot %d): %lld appended "
                            "tokens and a canvas of %d after %lld tokens do not fit (canvas up "
                            "to %d, %lld positions)", it->slot, (long long)it->n_append, it->cl,
                            (long long)kv->length, cb->slot_max_cl[it->slot],
                            (long long)kv->max_length);
    if (!(it->temperature > 0) || !isfinite(it->temperature) || !(it->top_p > 0))
        return dg_error_set(err, DG_E_INVAL, "cpu backend: denoise (slot %d): temperature "
                            "%g, top_p %g", it->slot, (double)it->temperature,
                            (double)it->top_p);
    if ((rc = check_ids(c, it->append, it->n_append, "denoise append", it->slot, err)) < 0)
        return rc;
    if ((rc = check_ids(c, it->canvas, it->cl, "denoise", it->slot, err)) < 0)
        return rc;
    /* an append changes the slot that another item of the batch reads */
    for (int j = 0; j < i; j++)
        if (items[j].slot == it->slot && (it->n_append > 0 || items[j].n_append > 0))
            return dg_error_set(err, DG_E_INVAL, "cpu backend: denoise: slot %d twice in one "
                                "batch with an append", it->slot);
    return 0;
}

/* The items' appends as encode items in cb->appends (grown as needed);
 * *n_out of them.  Errors: DG_E_NOMEM. */
static int gather_appends(struct cpu_backend *cb, const struct dg_denoise_item *items, int n,
                          int *n_out, struct dg_error *err)
{
    int k = 0;
    if (n > cb->appends_cap) {
        struct dg_encode_item *a = realloc(cb->appends, sizeof *a * (size_t)n);
        if (!a)
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        cb->appends = a;
        cb->appends_cap = n;
    }
    for (int i = 0; i < n; i++)
        if (items[i].n_append > 0)
            cb->appends[k++] = (struct dg_encode_item){items[i].slot, items[i].append,
                                                       items[i].n_append};
    *n_out = k;
    return 0;
}

/* Every item checked first (nothing runs on a refusal); then the appends
 * as one encode job, then the denoising steps: exactly what an encode of
 * the appended tokens followed by the step gives. */
static int cpu_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                       struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    int rc, n_app = 0;

    for (int i = 0; i < n; i++)
        if ((rc = check_denoise_item(cb, items, i, err)) < 0)
            return rc;
    cb->n_last = 0;
    if (n > cb->last_cap) {
        struct last_item *li = realloc(cb->last, sizeof *li * (size_t)n);
        if (!li)
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        cb->last = li;
        cb->last_cap = n;
    }
    if ((rc = gather_appends(cb, items, n, &n_app, err)) < 0)
        return rc;
    if (n_app > 0) {
        cb->enc = cb->appends;
        cb->n = n_app;
        if ((rc = run_job(cb, JOB_ENCODE, err)) < 0)
            return rc;
    }
    cb->den = items;
    cb->n = n;
    if ((rc = run_job(cb, JOB_DENOISE, err)) < 0)
        return rc;
    cb->n_last = n;
    return 0;
}

static int cpu_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);

    for (int i = 0; i < n; i++)
        if (which[i] < 0 || which[i] >= cb->n_last || cb->last[which[i]].slot < 0)
            return dg_error_set(err, DG_E_INVAL, "cpu backend: condition: item %d is not in the "
                                "last denoise batch", which[i]);
    cb->which = which;
    cb->n = n;
    return run_job(cb, JOB_CONDITION, err);
}

static void cpu_destroy(struct dg_backend *b)
{
    struct cpu_backend *cb = impl(b);
    if (!b)
        return;
    if (cb->ranks) {
        int started = 0;
        for (int r = 0; r < cb->plan.n_ranks; r++)
            started |= cb->ranks[r].started;
        if (started) {
            pthread_mutex_lock(&cb->mu);
            cb->kind = JOB_QUIT;
            cb->seq++;
            pthread_cond_broadcast(&cb->go);
            pthread_mutex_unlock(&cb->mu);
            for (int r = 0; r < cb->plan.n_ranks; r++)
                if (cb->ranks[r].started)
                    pthread_join(cb->ranks[r].thread, NULL);
        }
        for (int i = 0; cb->slot_open && i < b->max_slots; i++)
            cpu_slot_close(b, i);
        for (int r = 0; r < cb->plan.n_ranks; r++) {
            struct rank *R = &cb->ranks[r];
            dg_cpu_model_free(&R->cm);
            free(R->slots);
            free_rows(R);
        }
        free(cb->ranks);
    }
    dg_coll_cpu_group_free(cb->group);
    pthread_cond_destroy(&cb->go);
    pthread_cond_destroy(&cb->done);
    pthread_mutex_destroy(&cb->mu);
    free(cb->slot_open);
    free(cb->slot_max_cl);
    free(cb->last);
    free(cb->appends);
    free(cb);
}

static const struct dg_backend_ops cpu_ops = {
    cpu_slot_open, cpu_slot_close, cpu_slot_length, cpu_encode, cpu_denoise, cpu_condition,
    cpu_destroy, NULL,
};

const struct dg_tp_plan *dg_cpu_backend_plan(const struct dg_backend *b)
{
    return &((const struct cpu_backend *)b)->plan;
}

struct dg_coll_stats dg_cpu_backend_coll_stats(const struct dg_backend *b, int r)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)b;
    struct dg_coll_stats none;
    memset(&none, 0, sizeof none);
    if (r < 0 || r >= cb->plan.n_ranks || !cb->ranks[r].coll)
        return none;
    return cb->ranks[r].coll->stats;
}

int dg_cpu_backend_create(const struct dg_model *m, const struct dg_cpu_backend_options *o,
                          struct dg_backend **out, struct dg_error *err)
{
    struct cpu_backend *cb;
    const int n = o->n_ranks;
    int rc;

    *out = NULL;
    if (o->max_slots < 1 || o->max_slots > 4096)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: %d slots (1 .. 4096)", o->max_slots);
    cb = calloc(1, sizeof *cb);
    if (!cb)
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
    pthread_mutex_init(&cb->mu, NULL);
    pthread_cond_init(&cb->go, NULL);
    pthread_cond_init(&cb->done, NULL);
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->base.cfg = &m->cfg;
    cb->base.max_slots = o->max_slots;
    cb->m = m;
    cb->workers = o->workers;
    cb->pin = o->pin;
    if (sched_getaffinity(0, sizeof cb->allowed, &cb->allowed) != 0)
        CPU_ZERO(&cb->allowed);
    if ((rc = dg_tp_plan_build(&m->cfg, n, o->experts, 1, &cb->plan, err)) < 0) {
        cpu_destroy(&cb->base);
        return rc;
    }
    cb->slot_open = calloc((size_t)o->max_slots, sizeof *cb->slot_open);
    cb->slot_max_cl = calloc((size_t)o->max_slots, sizeof *cb->slot_max_cl);
    cb->ranks = calloc((size_t)n, sizeof *cb->ranks);
    if (!cb->slot_open || !cb->slot_max_cl || !cb->ranks) {
        cpu_destroy(&cb->base);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
    }
    if (n > 1 && (rc = dg_coll_cpu_group_create(n, &cb->group, err)) < 0) {
        cpu_destroy(&cb->base);
        return rc;
    }
    for (int r = 0; r < n; r++) {
        struct rank *R = &cb->ranks[r];
        R->cb = cb;
        R->index = r;
        R->coll = cb->group ? dg_coll_cpu_rank(cb->group, r) : NULL;
        R->ledger = o->ledgers ? &o->ledgers[r] : NULL;
        R->slots = calloc((size_t)o->max_slots, sizeof *R->slots);
        if (!R->slots) {
            cpu_destroy(&cb->base);
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        }
        if ((rc = dg_cpu_model_init_rank(&R->cm, m, &cb->plan, r, R->coll, R->ledger, err)) < 0) {
            cpu_destroy(&cb->base);
            return rc;
        }
    }
    for (int r = cb->workers ? 0 : 1; r < n; r++) {
        if (pthread_create(&cb->ranks[r].thread, NULL, rank_thread, &cb->ranks[r]) != 0) {
            cpu_destroy(&cb->base);
            return dg_error_set(err, DG_E_INTERNAL, "cpu backend: cannot start rank thread %d",
                                r);
        }
        cb->ranks[r].started = 1;
    }
    *out = &cb->base;
    return 0;
}
