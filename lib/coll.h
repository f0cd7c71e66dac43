/*
 * coll.h - the collectives a tensor-parallel group of ranks talks through
 * (design.md §3.5): all-reduce (sum, max), all-gather and barrier.  The
 * CPU implementation (dg_coll_cpu_*) serves rank threads of one process;
 * the GPU one wraps NCCL.  Every rank must make the same calls in the same
 * order with the same sizes; that is the caller's contract.
 *
 * Results are identical on every rank: the CPU implementation reduces the
 * ranks' buffers in rank order on each rank, so a float sum is the same
 * bits everywhere.
 *
 * Every call is counted (per kind: calls and payload bytes per rank), so
 * the communication of a step can be measured, not estimated.
 */
#ifndef DG_COLL_H
#define DG_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum dg_coll_type { DG_COLL_F32 = 0, DG_COLL_F64, DG_COLL_I64 };
enum dg_coll_op { DG_COLL_SUM = 0, DG_COLL_MAX };
enum dg_coll_kind { DG_COLL_ALL_REDUCE = 0, DG_COLL_ALL_GATHER, DG_COLL_BARRIER, DG_COLL_KINDS };

struct dg_coll_stats {
    uint64_t calls[DG_COLL_KINDS];
    uint64_t bytes[DG_COLL_KINDS];   /* payload per rank: all-reduce n*size, all-gather bytes sent */
};

struct dg_coll;

struct dg_coll_ops {
    /* buf[0..n) on every rank becomes the elementwise op over all ranks */
    int (*all_reduce)(struct dg_coll *c, void *buf, size_t n, enum dg_coll_type t,
                      enum dg_coll_op op, struct dg_error *err);
    /* recv[r * bytes ..] = rank r's send[0..bytes), for every r */
    int (*all_gather)(struct dg_coll *c, const void *send, void *recv, size_t bytes,
                      struct dg_error *err);
    int (*barrier)(struct dg_coll *c, struct dg_error *err);
};

struct dg_coll {
    const struct dg_coll_ops *ops;
    int rank, size;
    struct dg_coll_stats stats;
};

/* Size in bytes of one element. */
size_t dg_coll_type_size(enum dg_coll_type t);

/* Convenience wrappers: they count, and with size 1 (or c NULL) they do
 * nothing but return 0. */
int dg_all_reduce(struct dg_coll *c, void *buf, size_t n, enum dg_coll_type t, enum dg_coll_op op,
                  struct dg_error *err);
int dg_all_gather(struct dg_coll *c, const void *send, void *recv, size_t bytes,
                  struct dg_error *err);
int dg_barrier(struct dg_coll *c, struct dg_error *err);

/* ---- the CPU implementation: rank threads in one process ---------------- */

struct dg_coll_cpu_group;

/* A group of n ranks (1 .. 256).  Errors: DG_E_INVAL, DG_E_NOMEM. */
int dg_coll_cpu_group_create(int n, struct dg_coll_cpu_group **out, struct dg_error *err);

/* Rank r's handle (owned by the group; use it from one thread). */
struct dg_coll *dg_coll_cpu_rank(struct dg_coll_cpu_group *g, int r);

/* Make every pending and later call on every rank fail with DG_E_INTERNAL
 * ("group aborted"): what a rank that failed between collectives does so
 * the others do not wait for it forever.  Safe from any thread. */
void dg_coll_cpu_abort(struct dg_coll_cpu_group *g);

/* Whether the group was aborted. */
int dg_coll_cpu_aborted(struct dg_coll_cpu_group *g);

/* Clear an abort once every rank has returned from its calls (between
 * batches), so the group can be used again. */
void dg_coll_cpu_reset(struct dg_coll_cpu_group *g);

void dg_coll_cpu_group_free(struct dg_coll_cpu_group *g);

#ifdef __cplusplus
}
#endif

#endif
