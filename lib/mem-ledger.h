/*
 * mem-ledger.h - what one tensor-parallel rank holds: its buffers (each
 * allocation noted by size) and the weight bytes it reads.  Tests use it to
 * prove that no rank ever holds a full-vocabulary [tokens x V] buffer or
 * the whole embedding.  Every function accepts a NULL ledger.
 */
#ifndef DG_MEM_LEDGER_H
#define DG_MEM_LEDGER_H

#include <stdint.h>

struct dg_mem_ledger {
    uint64_t live, peak;     /* bytes of buffers now and at most */
    uint64_t largest;        /* the largest single buffer */
    uint64_t weights;        /* weight bytes this rank reads */
    uint64_t largest_weight; /* the largest single weight view */
};

/* Bytes now held (live and peak), without counting them as one buffer. */
static inline void dg_ledger_hold(struct dg_mem_ledger *l, uint64_t bytes)
{
    if (!l)
        return;
    l->live += bytes;
    if (l->live > l->peak)
        l->peak = l->live;
}

/* One buffer of `bytes`. */
static inline void dg_ledger_alloc(struct dg_mem_ledger *l, uint64_t bytes)
{
    dg_ledger_hold(l, bytes);
    if (l && bytes > l->largest)
        l->largest = bytes;
}

/* A buffer carved out of a larger allocation (counted as its own size for
 * `largest`; the allocation itself goes through dg_ledger_alloc). */
static inline void dg_ledger_part(struct dg_mem_ledger *l, uint64_t bytes)
{
    if (l && bytes > l->largest)
        l->largest = bytes;
}

static inline void dg_ledger_free(struct dg_mem_ledger *l, uint64_t bytes)
{
    if (l)
        l->live -= bytes < l->live ? bytes : l->live;
}

static inline void dg_ledger_weight(struct dg_mem_ledger *l, uint64_t bytes)
{
    if (!l)
        return;
    l->weights += bytes;
    if (bytes > l->largest_weight)
        l->largest_weight = bytes;
}

#endif
