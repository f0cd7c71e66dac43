/* coll-cpu.c - collectives for rank threads in one process (see coll.h).
 *
 * Each call is two rendezvous: every rank publishes its buffer pointer and
 * waits; then every rank reads all the buffers (in rank order) into its
 * own scratch and waits again, so no buffer is overwritten while another
 * rank still reads it; then each copies its result out.  The rendezvous
 * is a generation-counting barrier that an abort breaks. */
#include "lib/coll.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dg_coll_cpu_group {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    uint64_t generation;
    int aborted;
    const void **bufs;        /* [n] published pointers */
    struct rank_slot *slots;  /* [n] */
    void **scratch;           /* [n] per-rank result scratch */
    size_t *scratch_cap;
};

static const struct dg_coll_ops cpu_ops;

/* A rank's handle and its group. */
struct rank_slot {
    struct dg_coll c; /* first: a struct dg_coll * is a struct rank_slot * */
    struct dg_coll_cpu_group *g;
};

size_t dg_coll_type_size(enum dg_coll_type t)
{
    return t == DG_COLL_F32 ? 4 : 8;
}

int dg_all_reduce(struct dg_coll *c, void *buf, size_t n, enum dg_coll_type t, enum dg_coll_op op,
                  struct dg_error *err)
{
    if (!c || c->size <= 1)
        return 0;
    c->stats.calls[DG_COLL_ALL_REDUCE]++;
    c->stats.bytes[DG_COLL_ALL_REDUCE] += n * dg_coll_type_size(t);
    return c->ops->all_reduce(c, buf, n, t, op, err);
}

int dg_all_gather(struct dg_coll *c, const void *send, void *recv, size_t bytes,
                  struct dg_error *err)
{
    if (!c || c->size <= 1) {
        if (recv != send)
            memmove(recv, send, bytes);
        return 0;
    }
    c->stats.calls[DG_COLL_ALL_GATHER]++;
    c->stats.bytes[DG_COLL_ALL_GATHER] += bytes;
    return c->ops->all_gather(c, send, recv, bytes, err);
}

int dg_barrier(struct dg_coll *c, struct dg_error *err)
{
    if (!c || c->size <= 1)
        return 0;
    c->stats.calls[DG_COLL_BARRIER]++;
    return c->ops->barrier(c, err);
}

static struct dg_coll_cpu_group *group_of(struct dg_coll *c)
{
    return ((struct rank_slot *)(void *)c)->g;
}

/* Wait until all n ranks arrived.  Returns 0, or -DG_E_INTERNAL if the
 * group is (or becomes) aborted. */
static int rendezvous(struct dg_coll_cpu_group *g, struct dg_error *err)
{
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        rc = -1;
    } else if (++g->waiting == g->n) {
        g->waiting = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        const uint64_t gen = g->generation;
        while (gen == g->generation && !g->aborted)
            pthread_cond_wait(&g->cv, &g->mu);
        if (gen == g->generation)
            rc = -1;
    }
    pthread_mutex_unlock(&g->mu);
    if (rc)
        return dg_error_set(err, DG_E_INTERNAL, "collectives: group aborted (another rank failed)");
    return 0;
}

static int reserve(struct dg_coll_cpu_group *g, int r, size_t bytes, struct dg_error *err)
{
    if (bytes > g->scratch_cap[r]) {
        void *p = realloc(g->scratch[r], bytes);
        if (!p) {
            dg_coll_cpu_abort(g);
            return dg_error_set(err, DG_E_NOMEM, "collectives: out of memory for %zu bytes",
                                bytes);
        }
        g->scratch[r] = p;
        g->scratch_cap[r] = bytes;
    }
    return 0;
}

#define REDUCE(T)                                                                   \
    do {                                                                            \
        T *out = (T *)res;                                                          \
        memcpy(out, g->bufs[0], n * sizeof(T));                                     \
        for (int q = 1; q < g->n; q++) {                                            \
            const T *in = (const T *)g->bufs[q];                                    \
            if (op == DG_COLL_SUM)                                                  \
                for (size_t i = 0; i < n; i++)                                      \
                    out[i] += in[i];                                                \
            else                                                                    \
                for (size_t i = 0; i < n; i++)                                      \
                    out[i] = in[i] > out[i] ? in[i] : out[i];                       \
        }                                                                           \
    } while (0)

static int cpu_all_reduce(struct dg_coll *c, void *buf, size_t n, enum dg_coll_type t,
                          enum dg_coll_op op, struct dg_error *err)
{
    struct dg_coll_cpu_group *g = group_of(c);
    const size_t bytes = n * dg_coll_type_size(t);
    void *res;
    int rc;

    if ((rc = reserve(g, c->rank, bytes, err)) < 0)
        return rc;
    res = g->scratch[c->rank];
    g->bufs[c->rank] = buf;
    if ((rc = rendezvous(g, err)) < 0)
        return rc;
    if (t == DG_COLL_F32)
        REDUCE(float);
    else if (t == DG_COLL_F64)
        REDUCE(double);
    else
        REDUCE(int64_t);
    if ((rc = rendezvous(g, err)) < 0)
        return rc;
    memcpy(buf, res, bytes);
    return 0;
}

static int cpu_all_gather(struct dg_coll *c, const void *send, void *recv, size_t bytes,
                          struct dg_error *err)
{
    struct dg_coll_cpu_group *g = group_of(c);
    int rc;

    g->bufs[c->rank] = send;
    if ((rc = rendezvous(g, err)) < 0)
        return rc;
    /* each rank writes only its own recv (send may be inside it) */
    for (int q = 0; q < g->n; q++)
        if ((const char *)recv + (size_t)q * bytes != (const char *)g->bufs[q])
            memmove((char *)recv + (size_t)q * bytes, g->bufs[q], bytes);
    return rendezvous(g, err);
}

static int cpu_barrier(struct dg_coll *c, struct dg_error *err)
{
    return rendezvous(group_of(c), err);
}

static const struct dg_coll_ops cpu_ops = {cpu_all_reduce, cpu_all_gather, cpu_barrier};

int dg_coll_cpu_group_create(int n, struct dg_coll_cpu_group **out, struct dg_error *err)
{
    struct dg_coll_cpu_group *g;
    struct rank_slot *slots;

    *out = NULL;
    if (n < 1 || n > 256)
        return dg_error_set(err, DG_E_INVAL, "collectives: %d ranks (1 .. 256)", n);
    g = calloc(1, sizeof *g);
    slots = calloc((size_t)n, sizeof *slots);
    if (!g || !slots) {
        free(g);
        free(slots);
        return dg_error_set(err, DG_E_NOMEM, "collectives: out of memory");
    }
    g->n = n;
    g->bufs = calloc((size_t)n, sizeof *g->bufs);
    g->scratch = calloc((size_t)n, sizeof *g->scratch);
    g->scratch_cap = calloc((size_t)n, sizeof *g->scratch_cap);
    g->slots = slots;
    if (!g->bufs || !g->scratch || !g->scratch_cap || pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g->bufs);
        free(g->scratch);
        free(g->scratch_cap);
        free(slots);
        free(g);
        return dg_error_set(err, DG_E_NOMEM, "collectives: out of memory");
    }
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        free(g->bufs);
        free(g->scratch);
        free(g->scratch_cap);
        free(slots);
        free(g);
        return dg_error_set(err, DG_E_NOMEM, "collectives: cannot create a condition variable");
    }
    for (int r = 0; r < n; r++) {
        slots[r].c.ops = &cpu_ops;
        slots[r].c.rank = r;
        slots[r].c.size = n;
        slots[r].g = g;
    }
    *out = g;
    return 0;
}

struct dg_coll *dg_coll_cpu_rank(struct dg_coll_cpu_group *g, int r)
{
    return r >= 0 && r < g->n ? &g->slots[r].c : NULL;
}

void dg_coll_cpu_abort(struct dg_coll_cpu_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

int dg_coll_cpu_aborted(struct dg_coll_cpu_group *g)
{
    int a;
    pthread_mutex_lock(&g->mu);
    a = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return a;
}

void dg_coll_cpu_reset(struct dg_coll_cpu_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->aborted = 0;
    g->waiting = 0;
    pthread_mutex_unlock(&g->mu);
}

void dg_coll_cpu_group_free(struct dg_coll_cpu_group *g)
{
    if (!g)
        return;
    for (int r = 0; r < g->n; r++)
        free(g->scratch[r]);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->bufs);
    free(g->scratch);
    free(g->scratch_cap);
    free(g->slots);
    free(g);
}
