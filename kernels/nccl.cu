/* nccl.cu - one rank's NCCL communicator (see nccl.h). */
#include "kernels/nccl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"

struct dg_nccl {
    struct dg_coll coll;        /* first: the host face is a dg_coll */
    pthread_mutex_t mu;         /* guards comm against dg_nccl_abort */
    ncclComm_t comm;            /* NULL once aborted */
    int aborted;
    int dev;
    cudaStream_t stream;
    void *stage;                /* device staging for the host face */
    size_t stage_bytes;
    /* a group on one shared GPU instead of NCCL (NULL: NCCL) */
    struct dg_nccl_shared *shared;
    cudaEvent_t ready, read;    /* this rank's (the group's, which owns them): its input
                                 * written; others' inputs read */
    void *sum;                  /* the all-reduce's result before it lands in buf */
    size_t sum_bytes;
};

/* What the ranks of a shared group hand each other for the collective at
 * hand; src[r] and the events are written by rank r before a meeting and
 * read by the others after it.  The events are the group's: made by rank
 * r's first join, destroyed with the group, so a rank that returns from
 * its last collective and frees its dg_nccl leaves them for a slower rank
 * still to wait on. */
struct dg_nccl_shared {
    int n;
    struct dg_coll_cpu_group *meet; /* host barriers; aborting it ends the group */
    const void *src[DG_NCCL_SHARED_MAX];
    cudaEvent_t ready[DG_NCCL_SHARED_MAX], read[DG_NCCL_SHARED_MAX];
    int lag_ms[DG_NCCL_SHARED_MAX]; /* dg_nccl_shared_lag */
};

static const ncclDataType_t TYPES[] = {ncclFloat32, ncclBfloat16, ncclFloat64, ncclInt64};
static const size_t SIZES[] = {4, 2, 8, 8};

extern "C" int dg_nccl_get_id(struct dg_nccl_id *id, struct dg_error *err)
{
    int rc = 0, dev = -1;
    ncclUniqueId u;
    static_assert(sizeof u == DG_NCCL_ID_BYTES, "ncclUniqueId size");
    DG_NCCL_CHECK(ncclGetUniqueId(&u));
    memcpy(id->bytes, &u, sizeof u);
out:
    return rc;
}

/* The communicator, or NULL (error set) once aborted; c->mu held on success. */
static ncclComm_t lock_comm(struct dg_nccl *c, struct dg_error *err)
{
    pthread_mutex_lock(&c->mu);
    if (!c->comm) {
        pthread_mutex_unlock(&c->mu);
        dg_error_set(err, DG_E_NCCL, "GPU %d: rank %d: the NCCL communicator was aborted",
                     c->dev, c->coll.rank);
        return NULL;
    }
    return c->comm;
}

/* The outcome of an NCCL call made with c->mu held (lock_comm): the lock
 * released, then 0, or DG_E_NCCL with err naming the call. */
static int unlock_result(struct dg_nccl *c, ncclResult_t r, const char *call,
                         struct dg_error *err)
{
    pthread_mutex_unlock(&c->mu);
    if (r == ncclSuccess)
        return 0;
    return dg_error_set(err, DG_E_NCCL, "GPU %d: %s: %s (%s)", c->dev, call,
                        ncclGetErrorString(r), ncclGetLastError(NULL));
}

/* A device buffer *p of *cap bytes made at least bytes long (its
 * contents not kept). */
static int grow(struct dg_nccl *c, void **p, size_t *cap, size_t bytes, struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    if (bytes <= *cap)
        return 0;
    {
        /* (the smaller one goes first: a failure to free it is reported) */
        void *old = *p;
        *p = NULL;
        *cap = 0;
        DG_CUDA_CHECK(cudaFree(old));
    }
    DG_CUDA_CHECK(cudaMalloc(p, bytes));
    *cap = bytes;
out:
    return rc;
}

/* ---- a group of ranks sharing one GPU (no NCCL) ------------------------------ */

/* Where the ranks meet: 0, or DG_E_NCCL once the group was aborted. */
static int shared_meet(struct dg_nccl *c, struct dg_error *err)
{
    struct dg_error ignored;
    if (dg_barrier(dg_coll_cpu_rank(c->shared->meet, c->coll.rank), &ignored) < 0)
        return dg_error_set(err, DG_E_NCCL, "GPU %d: rank %d: the group was aborted", c->dev,
                            c->coll.rank);
    return 0;
}

/* A rank's pause after a collective's second meeting, where a test asks
 * for one (dg_nccl_shared_lag). */
static void lag(const struct dg_nccl *c)
{
    const int ms = c->shared->lag_ms[c->coll.rank];
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    if (ms > 0)
        nanosleep(&ts, NULL);
}

/* Make c's stream wait for every other rank's event ev[q]. */
static int wait_others(struct dg_nccl *c, cudaEvent_t *ev, struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    for (int q = 0; q < c->coll.size; q++)
        if (q != c->coll.rank)
            DG_CUDA_CHECK(cudaStreamWaitEvent(c->stream, ev[q], 0));
out:
    return rc;
}

struct shared_srcs {
    const void *p[DG_NCCL_SHARED_MAX];
};

/* out[i] = src[0][i] op src[1][i] op ... op src[n-1][i], folded in rank
 * order in T's arithmetic (bf16: in fp32, rounded once at the end), the
 * order lib/coll-cpu.c folds in; one thread an element. */
template <typename T, typename A>
__global__ void shared_reduce(struct shared_srcs src, int n, size_t len, int is_max, T *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        A acc = (A)((const T *)src.p[0])[i];
        for (int q = 1; q < n; q++) {
            const A v = (A)((const T *)src.p[q])[i];
            acc = is_max ? (v > acc ? v : acc) : acc + v;
        }
        out[i] = (T)acc;
    }
}

template <typename T, typename A>
static void launch_reduce(const struct shared_srcs &src, int n, size_t len, int is_max, void *out,
                          cudaStream_t stream)
{
    const size_t blocks = (len + 255) / 256;
    shared_reduce<T, A><<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
        src, n, len, is_max, (T *)out);
}

/* A collective's first meeting: this rank's input (src, on its stream)
 * published and marked by its ready event, then, once all have met, its
 * stream made to wait for every other rank's. */
static int inputs_ready(struct dg_nccl *c, const void *src, struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    DG_CUDA_CHECK(cudaEventRecord(c->ready, c->stream));
    c->shared->src[c->coll.rank] = src;
    if ((rc = shared_meet(c, err)) < 0)
        return rc;
    rc = wait_others(c, c->shared->ready, err);
out:
    return rc;
}

/* A collective's second meeting: this rank's reads of the others' inputs
 * marked by its read event, then, once all have met (and after any lag a
 * test asked for), its stream made to wait for every other rank's reads
 * before it writes over its own input. */
static int inputs_read(struct dg_nccl *c, struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    DG_CUDA_CHECK(cudaEventRecord(c->read, c->stream));
    if ((rc = shared_meet(c, err)) < 0)
        return rc;
    lag(c);
    rc = wait_others(c, c->shared->read, err);
out:
    return rc;
}

/* All-reduce through the shared GPU: every rank's input ready (its event),
 * each rank folds all inputs into its own scratch, and once every rank
 * has read every input (their second events) writes the result over its
 * buf.  Two meetings on the host; the GPU never waits on a host. */
static int shared_all_reduce(struct dg_nccl *c, void *buf, size_t n, enum dg_nccl_type t,
                             enum dg_coll_op op, struct dg_error *err)
{
    struct dg_nccl_shared *g = c->shared;
    const int dev = c->dev;
    const size_t bytes = n * SIZES[t];
    struct shared_srcs src;
    int rc = 0;
    if ((rc = grow(c, &c->sum, &c->sum_bytes, bytes, err)) < 0 ||
        (rc = inputs_ready(c, buf, err)) < 0)
        return rc;
    memcpy(src.p, g->src, sizeof src.p);
    switch (t) {
    case DG_NCCL_F32: launch_reduce<float, float>(src, g->n, n, op == DG_COLL_MAX, c->sum,
                                                  c->stream); break;
    case DG_NCCL_BF16: launch_reduce<__nv_bfloat16, float>(src, g->n, n, op == DG_COLL_MAX,
                                                           c->sum, c->stream); break;
    case DG_NCCL_F64: launch_reduce<double, double>(src, g->n, n, op == DG_COLL_MAX, c->sum,
                                                    c->stream); break;
    case DG_NCCL_I64: launch_reduce<long long, long long>(src, g->n, n, op == DG_COLL_MAX,
                                                          c->sum, c->stream); break;
    }
    DG_LAUNCH_CHECK();
    if ((rc = inputs_read(c, err)) < 0)
        return rc;
    DG_CUDA_CHECK(cudaMemcpyAsync(buf, c->sum, bytes, cudaMemcpyDeviceToDevice, c->stream));
out:
    return rc;
}

/* All-gather through the shared GPU: every rank copies every rank's send
 * into its recv once all are ready, and returns once all have copied its
 * own (so that its send may be written again). */
static int shared_all_gather(struct dg_nccl *c, const void *send, void *recv, size_t bytes,
                             struct dg_error *err)
{
    struct dg_nccl_shared *g = c->shared;
    const int dev = c->dev;
    int rc = 0;
    if ((rc = inputs_ready(c, send, err)) < 0)
        return rc;
    for (int q = 0; q < g->n; q++) {
        unsigned char *to = (unsigned char *)recv + (size_t)q * bytes;
        if (to != g->src[q]) /* (a send in its place in recv stays) */
            DG_CUDA_CHECK(cudaMemcpyAsync(to, g->src[q], bytes, cudaMemcpyDeviceToDevice,
                                          c->stream));
    }
    rc = inputs_read(c, err);
out:
    return rc;
}

extern "C" int dg_nccl_shared_create(int n, struct dg_nccl_shared **out, struct dg_error *err)
{
    struct dg_nccl_shared *g;
    int rc;
    *out = NULL;
    if (n < 1 || n > DG_NCCL_SHARED_MAX)
        return dg_error_set(err, DG_E_INVAL, "a group of %d ranks on one GPU (1 .. %d)", n,
                            DG_NCCL_SHARED_MAX);
    if (!(g = (struct dg_nccl_shared *)calloc(1, sizeof *g)))
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    g->n = n;
    if ((rc = dg_coll_cpu_group_create(n, &g->meet, err)) < 0) {
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

extern "C" void dg_nccl_shared_reset(struct dg_nccl_shared *g)
{
    if (g)
        dg_coll_cpu_reset(g->meet);
}

extern "C" void dg_nccl_shared_lag(struct dg_nccl_shared *g, int r, int ms)
{
    if (g && r >= 0 && r < g->n)
        g->lag_ms[r] = ms > 0 ? ms : 0;
}

extern "C" void dg_nccl_shared_free(struct dg_nccl_shared *g)
{
    if (!g)
        return;
    for (int r = 0; r < g->n; r++) {
        if (g->ready[r])
            cudaEventDestroy(g->ready[r]);
        if (g->read[r])
            cudaEventDestroy(g->read[r]);
    }
    dg_coll_cpu_group_free(g->meet);
    free(g);
}

extern "C" int dg_nccl_all_reduce(struct dg_nccl *c, void *buf, size_t n, enum dg_nccl_type t,
                                  enum dg_coll_op op, struct dg_error *err)
{
    const int dev = c->dev;
    ncclComm_t comm;
    if ((unsigned)t > DG_NCCL_I64 || (op != DG_COLL_SUM && op != DG_COLL_MAX) || (n && !buf))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: all-reduce of %zu values, type %d, op %d",
                            dev, n, (int)t, (int)op);
    c->coll.stats.calls[DG_COLL_ALL_REDUCE]++;
    c->coll.stats.bytes[DG_COLL_ALL_REDUCE] += n * SIZES[t];
    if (c->coll.size == 1 || n == 0)
        return 0;
    if (c->shared)
        return shared_all_reduce(c, buf, n, t, op, err);
    if (!(comm = lock_comm(c, err)))
        return -DG_E_NCCL;
    return unlock_result(c, ncclAllReduce(buf, buf, n, TYPES[t],
                                          op == DG_COLL_MAX ? ncclMax : ncclSum, comm, c->stream),
                         "ncclAllReduce", err);
}

extern "C" int dg_nccl_all_gather(struct dg_nccl *c, const void *send, void *recv, size_t bytes,
                                  struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    ncclComm_t comm;
    if (bytes && (!send || !recv))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: all-gather of %zu bytes", dev, bytes);
    c->coll.stats.calls[DG_COLL_ALL_GATHER]++;
    c->coll.stats.bytes[DG_COLL_ALL_GATHER] += bytes;
    if (bytes == 0)
        return 0;
    if (c->coll.size == 1) {
        DG_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, c->stream));
        return 0;
    }
    if (c->shared)
        return shared_all_gather(c, send, recv, bytes, err);
    if (!(comm = lock_comm(c, err)))
        return -DG_E_NCCL;
    return unlock_result(c, ncclAllGather(send, recv, bytes, ncclChar, comm, c->stream),
                         "ncclAllGather", err);
out:
    return rc;
}

/* ---- the host face: staged through device memory, waited for -------------- */

static int stage(struct dg_nccl *c, size_t bytes, struct dg_error *err)
{
    return grow(c, &c->stage, &c->stage_bytes, bytes, err);
}

static enum dg_nccl_type host_type(enum dg_coll_type t)
{
    return t == DG_COLL_F64 ? DG_NCCL_F64 : t == DG_COLL_I64 ? DG_NCCL_I64 : DG_NCCL_F32;
}

static int host_all_reduce(struct dg_coll *coll, void *buf, size_t n, enum dg_coll_type t,
                           enum dg_coll_op op, struct dg_error *err)
{
    struct dg_nccl *c = (struct dg_nccl *)coll;
    const size_t bytes = n * dg_coll_type_size(t);
    const struct dg_coll_stats keep = c->coll.stats; /* (dg_all_reduce counted it) */
    int rc = 0, dev = c->dev;
    if ((rc = stage(c, bytes, err)) < 0)
        return rc;
    DG_CUDA_CHECK(cudaMemcpyAsync(c->stage, buf, bytes, cudaMemcpyHostToDevice, c->stream));
    if ((rc = dg_nccl_all_reduce(c, c->stage, n, host_type(t), op, err)) < 0)
        goto out;
    c->coll.stats = keep;
    DG_CUDA_CHECK(cudaMemcpyAsync(buf, c->stage, bytes, cudaMemcpyDeviceToHost, c->stream));
    DG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
out:
    return rc;
}

static int host_all_gather(struct dg_coll *coll, const void *send, void *recv, size_t bytes,
                           struct dg_error *err)
{
    struct dg_nccl *c = (struct dg_nccl *)coll;
    const size_t total = bytes * (size_t)c->coll.size;
    const struct dg_coll_stats keep = c->coll.stats;
    int rc = 0, dev = c->dev;
    unsigned char *s;
    if ((rc = stage(c, total + bytes, err)) < 0)
        return rc;
    s = (unsigned char *)c->stage;
    DG_CUDA_CHECK(cudaMemcpyAsync(s + total, send, bytes, cudaMemcpyHostToDevice, c->stream));
    if ((rc = dg_nccl_all_gather(c, s + total, s, bytes, err)) < 0)
        goto out;
    c->coll.stats = keep;
    DG_CUDA_CHECK(cudaMemcpyAsync(recv, s, total, cudaMemcpyDeviceToHost, c->stream));
    DG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
out:
    return rc;
}

extern "C" int dg_nccl_broadcast_host(struct dg_nccl *c, void *buf, size_t bytes, int root,
                                      struct dg_error *err)
{
    int rc = 0, dev = c->dev;
    ncclComm_t comm;
    if (root < 0 || root >= c->coll.size || (bytes && !buf))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: broadcast of %zu bytes from rank %d", dev,
                            bytes, root);
    if (c->coll.size == 1 || bytes == 0)
        return 0;
    if (c->shared)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: a broadcast in a group on one GPU "
                            "(multi-process groups only)", dev);
    if ((rc = stage(c, bytes, err)) < 0)
        return rc;
    if (c->coll.rank == root)
        DG_CUDA_CHECK(cudaMemcpyAsync(c->stage, buf, bytes, cudaMemcpyHostToDevice, c->stream));
    if (!(comm = lock_comm(c, err)))
        return -DG_E_NCCL;
    if ((rc = unlock_result(c, ncclBroadcast(c->stage, c->stage, bytes, ncclChar, root, comm,
                                             c->stream),
                            "ncclBroadcast", err)) < 0)
        return rc;
    if (c->coll.rank != root)
        DG_CUDA_CHECK(cudaMemcpyAsync(buf, c->stage, bytes, cudaMemcpyDeviceToHost, c->stream));
    DG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
out:
    return rc;
}

static int host_barrier(struct dg_coll *coll, struct dg_error *err)
{
    struct dg_nccl *c = (struct dg_nccl *)coll;
    const struct dg_coll_stats keep = c->coll.stats;
    float one = 1.0f;
    int rc = host_all_reduce(coll, &one, 1, DG_COLL_F32, DG_COLL_SUM, err);
    c->coll.stats = keep;
    return rc;
}

static const struct dg_coll_ops HOST_OPS = {host_all_reduce, host_all_gather, host_barrier};

extern "C" struct dg_coll *dg_nccl_coll(struct dg_nccl *c)
{
    return &c->coll;
}

/* ---- life ------------------------------------------------------------------- */

/* A rank's record as every kind of group starts it: rank r of n on GPU
 * dev, issuing on stream, the host face set; NULL (DG_E_NOMEM set in err)
 * when out of memory. */
static struct dg_nccl *rank_new(int n, int r, int dev, dg_stream_t stream, struct dg_error *err)
{
    struct dg_nccl *c = (struct dg_nccl *)calloc(1, sizeof *c);
    if (!c) {
        dg_error_set(err, DG_E_NOMEM, "GPU %d: out of memory for rank %d of %d", dev, r, n);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->coll.ops = &HOST_OPS;
    c->coll.rank = r;
    c->coll.size = n;
    c->dev = dev;
    c->stream = (cudaStream_t)stream;
    return c;
}

/* A rank's record whose group did not form: its communicator aborted (no
 * peer waits on it), the record freed (a shared group's events stay the
 * group's). */
static void rank_discard(struct dg_nccl *c)
{
    if (c->comm)
        ncclCommAbort(c->comm);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

extern "C" int dg_nccl_init(struct dg_nccl **out, const struct dg_nccl_id *id, int n, int r,
                            int dev, dg_stream_t stream, struct dg_error *err)
{
    struct dg_nccl *c;
    ncclUniqueId u;
    int rc = 0;
    float *one = NULL;

    *out = NULL;
    if (n < 1 || r < 0 || r >= n || !stream)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: NCCL rank %d of %d", dev, r, n);
    if (!(c = rank_new(n, r, dev, stream, err)))
        return -DG_E_NOMEM;
    memcpy(&u, id->bytes, sizeof u);
    DG_CUDA_CHECK(cudaSetDevice(dev));
    if (n > 1) {
        DG_NCCL_CHECK(ncclCommInitRank(&c->comm, n, u, r));
        /* connect now: the first collective sets up the transports */
        DG_CUDA_CHECK(cudaMalloc((void **)&one, sizeof *one));
        DG_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof *one, c->stream));
        DG_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, c->comm, c->stream));
        DG_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    }
    *out = c;
out:
    cudaFree(one);
    if (rc < 0)
        rank_discard(c);
    return rc;
}

extern "C" int dg_nccl_init_shared(struct dg_nccl **out, struct dg_nccl_shared *g, int r,
                                   int dev, dg_stream_t stream, struct dg_error *err)
{
    struct dg_nccl *c;
    int rc = 0;

    *out = NULL;
    if (!g || r < 0 || r >= g->n || !stream)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rank %d of a shared group of %d", dev, r,
                            g ? g->n : 0);
    if (!(c = rank_new(g->n, r, dev, stream, err)))
        return -DG_E_NOMEM;
    c->shared = g;
    DG_CUDA_CHECK(cudaSetDevice(dev));
    /* rank r's events, made at its first join (only rank r writes slot r) */
    if (!g->ready[r])
        DG_CUDA_CHECK(cudaEventCreateWithFlags(&g->ready[r], cudaEventDisableTiming));
    if (!g->read[r])
        DG_CUDA_CHECK(cudaEventCreateWithFlags(&g->read[r], cudaEventDisableTiming));
    c->ready = g->ready[r];
    c->read = g->read[r];
    /* every rank's events are in place before any collective reads them */
    rc = shared_meet(c, err);
out:
    if (rc < 0) {
        rank_discard(c);
        return rc;
    }
    *out = c;
    return 0;
}

extern "C" void dg_nccl_abort(struct dg_nccl *c)
{
    ncclComm_t comm;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    comm = c->comm;
    c->comm = NULL;
    c->aborted = 1;
    pthread_mutex_unlock(&c->mu);
    if (comm)
        ncclCommAbort(comm);
    if (c->shared)
        dg_coll_cpu_abort(c->shared->meet);
}

extern "C" int dg_nccl_aborted(struct dg_nccl *c)
{
    int a;
    pthread_mutex_lock(&c->mu);
    a = c->aborted;
    pthread_mutex_unlock(&c->mu);
    return a;
}

extern "C" void dg_nccl_free(struct dg_nccl *c)
{
    if (!c)
        return;
    cudaSetDevice(c->dev);
    if (c->comm) {
        /* a clean end: wait for this rank's work, then destroy */
        cudaStreamSynchronize(c->stream);
        ncclCommDestroy(c->comm);
    }
    if (c->shared) {
        cudaStreamSynchronize(c->stream);
        cudaFree(c->sum);
    }
    cudaFree(c->stage);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
