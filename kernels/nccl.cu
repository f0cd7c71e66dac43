/* nccl.cu - one rank's NCCL communicator (see nccl.h). */
#include "kernels/nccl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    int rc = 0, dev = c->dev;
    if (bytes <= c->stage_bytes)
        return 0;
    {
        /* (the smaller stage goes first: a failure to free it is reported) */
        void *old = c->stage;
        c->stage = NULL;
        c->stage_bytes = 0;
        DG_CUDA_CHECK(cudaFree(old));
    }
    DG_CUDA_CHECK(cudaMalloc(&c->stage, bytes));
    c->stage_bytes = bytes;
out:
    return rc;
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
    c = (struct dg_nccl *)calloc(1, sizeof *c);
    if (!c)
        return dg_error_set(err, DG_E_NOMEM, "GPU %d: NCCL: out of memory", dev);
    pthread_mutex_init(&c->mu, NULL);
    c->coll.ops = &HOST_OPS;
    c->coll.rank = r;
    c->coll.size = n;
    c->dev = dev;
    c->stream = (cudaStream_t)stream;
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
    if (rc < 0) {
        if (c->comm)
            ncclCommAbort(c->comm);
        pthread_mutex_destroy(&c->mu);
        free(c);
    }
    return rc;
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
    cudaFree(c->stage);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
