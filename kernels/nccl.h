/*
 * nccl.h - one rank's NCCL communicator for C callers: the GPU side of the
 * collectives interface (lib/coll.h, design.md §3.5).
 *
 * A group of n ranks is joined from one dg_nccl_id: made by one of them
 * and handed to the others (threads of one process), or made alike by
 * every process from NCCL_COMM_ID (processes on one or several hosts:
 * NCCL's own bootstrap, rank 0 listening at that address).  Each rank
 * calls dg_nccl_init on its own GPU; the call returns when all n have
 * joined.
 *
 * Two faces:
 *   device  dg_nccl_all_reduce / dg_nccl_all_gather on device buffers,
 *           enqueued on the rank's stream (asynchronous, capturable in a
 *           CUDA graph);
 *   host    dg_nccl_coll: a struct dg_coll whose calls take host buffers,
 *           staged through device memory and waited for (the sampler's
 *           small reductions that the CPU code already makes, lib/sampler.h).
 * Both count their calls and payload bytes in the dg_coll's stats.
 *
 * Every rank must make the same calls in the same order with the same
 * sizes.  A rank that fails, or a collective that hangs, is handled by
 * dg_nccl_abort (from any thread): operations in flight end, later ones
 * fail with DG_E_NCCL; the group is then rebuilt from a new id.
 */
#ifndef DG_KERNELS_NCCL_H
#define DG_KERNELS_NCCL_H

#include <stddef.h>

#include "kernels/ops.h"
#include "lib/coll.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_NCCL_ID_BYTES 128

struct dg_nccl_id {
    unsigned char bytes[DG_NCCL_ID_BYTES];
};

enum dg_nccl_type { DG_NCCL_F32 = 0, DG_NCCL_BF16, DG_NCCL_F64, DG_NCCL_I64 };

struct dg_nccl;

/* A fresh group id.  Errors: DG_E_NCCL. */
int dg_nccl_get_id(struct dg_nccl_id *id, struct dg_error *err);

/* Join the group of n ranks as rank r, on GPU dev (made the calling
 * thread's current GPU), enqueuing on stream; then one small all-reduce so
 * every connection is made before the first real call.  Blocks until all
 * n ranks have joined.  Errors: DG_E_INVAL, DG_E_NOMEM, DG_E_CUDA,
 * DG_E_NCCL. */
int dg_nccl_init(struct dg_nccl **out, const struct dg_nccl_id *id, int n, int r, int dev,
                 dg_stream_t stream, struct dg_error *err);

/* End every operation of this rank's communicator and free it: safe from
 * any thread, also while the owner waits on a hung collective.  Later
 * calls fail with DG_E_NCCL ("aborted").  Idempotent. */
void dg_nccl_abort(struct dg_nccl *c);

/* Whether c was aborted. */
int dg_nccl_aborted(struct dg_nccl *c);

/* Free c (after its owner has stopped using it). */
void dg_nccl_free(struct dg_nccl *c);

/* buf[0..n) on the device becomes the elementwise op over all ranks, in
 * stream order.  Errors: DG_E_INVAL, DG_E_NCCL. */
int dg_nccl_all_reduce(struct dg_nccl *c, void *buf, size_t n, enum dg_nccl_type t,
                       enum dg_coll_op op, struct dg_error *err);

/* recv[r * bytes ..] = rank r's send[0..bytes), device buffers, in
 * stream order.  Errors: DG_E_INVAL, DG_E_NCCL. */
int dg_nccl_all_gather(struct dg_nccl *c, const void *send, void *recv, size_t bytes,
                       struct dg_error *err);

/* buf[0..bytes) (host memory) of rank root, on every rank: staged through
 * device memory and waited for.  Errors: DG_E_INVAL, DG_E_CUDA, DG_E_NCCL. */
int dg_nccl_broadcast_host(struct dg_nccl *c, void *buf, size_t bytes, int root,
                           struct dg_error *err);

/* The host-buffer face (owned by c). */
struct dg_coll *dg_nccl_coll(struct dg_nccl *c);

/* ---- a group on one shared GPU, without NCCL (for tests) ----------------
 *
 * NCCL will not make a group of two ranks on one GPU, so a test with one
 * GPU makes this instead: the ranks are threads of one process, each with
 * its own stream on the same GPU, and a collective meets on the host
 * twice (lib/coll.h's CPU barrier): every rank records an event after its
 * input is written, waits (on the GPU) for the others', folds or copies
 * all inputs into its own result, records a second event, and only after
 * every rank's second event writes its result over its input.  An
 * all-reduce folds in rank order (bf16 in fp32, rounded once), as
 * lib/coll-cpu.c does; NCCL's order may differ, so sums may differ from
 * NCCL's in the last bits.  The host never waits for the GPU, but a
 * collective's call returns only when every rank has made it, so it
 * cannot be captured in a CUDA graph (each rank captures its own stream:
 * the events of another capture cannot be waited on).  Abort (from any
 * thread) ends every rank's meeting with DG_E_NCCL; dg_nccl_shared_reset
 * makes the group usable again once no rank is inside a call.
 * No broadcast (a multi-process group's only). */

#define DG_NCCL_SHARED_MAX 8

struct dg_nccl_shared;

/* A group of n ranks (1 .. DG_NCCL_SHARED_MAX).  Errors: DG_E_INVAL,
 * DG_E_NOMEM. */
int dg_nccl_shared_create(int n, struct dg_nccl_shared **out, struct dg_error *err);

/* Clear an abort (no rank inside a call). */
void dg_nccl_shared_reset(struct dg_nccl_shared *g);

/* For tests: rank r pauses ms milliseconds after each collective's second
 * meeting, before its stream waits on the others' events (a slow rank:
 * the others may return and free their dg_nccl meanwhile).  0: none. */
void dg_nccl_shared_lag(struct dg_nccl_shared *g, int r, int ms);

/* Free g (and the events its ranks record) after every rank's dg_nccl is
 * freed. */
void dg_nccl_shared_free(struct dg_nccl_shared *g);

/* Join g as rank r on GPU dev with stream (as dg_nccl_init: returns when
 * all of g's ranks have joined).  The result is used and freed through the
 * functions above, alike.  Errors: DG_E_INVAL, DG_E_NOMEM, DG_E_CUDA,
 * DG_E_NCCL (aborted). */
int dg_nccl_init_shared(struct dg_nccl **out, struct dg_nccl_shared *g, int r, int dev,
                        dg_stream_t stream, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
