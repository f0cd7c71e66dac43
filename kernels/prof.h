/*
 * prof.h - where a stream's time goes: device-timed stages of a pass.
 *
 * A profiler holds a pool of CUDA events.  dg_prof_begin records the
 * first; each dg_prof_mark(label) records the next and charges the device
 * time between the two to label.  After the stream has been synchronised,
 * dg_prof_collect adds every interval to its label's total and call count
 * and empties the pool for the next pass.  Labels are compared by
 * pointer first and by text after (pass string literals).
 *
 * Marks are events on the stream: they serialise nothing beyond what the
 * stream already orders, but they cannot be captured into a CUDA graph
 * (the backend runs eagerly while a profiler is attached).  A pool that
 * runs out drops later marks (dg_prof_dropped counts them); their time is
 * charged to the next mark that fits after the next collect.
 */
#ifndef DG_KERNELS_PROF_H
#define DG_KERNELS_PROF_H

#include <stdint.h>

#include "kernels/devmem.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_PROF_MAX_LABELS 48

struct dg_prof_total {
    const char *label;
    double ms;          /* device time charged to the label */
    int64_t calls;      /* intervals charged */
};

struct dg_prof;

/* A profiler with room for max_marks marks between collects, on the
 * calling thread's GPU dev.  Errors: DG_E_INVAL, DG_E_NOMEM, DG_E_CUDA. */
int dg_prof_create(struct dg_prof **out, int max_marks, int dev, struct dg_error *err);
void dg_prof_destroy(struct dg_prof *p);

/* Start a run of marks on stream (drops marks not yet collected). */
int dg_prof_begin(struct dg_prof *p, dg_stream_t stream, struct dg_error *err);

/* Charge the time since the previous mark (or begin) to label.  Without a
 * begin since the last collect, the mark is a begin.  Errors: DG_E_CUDA. */
int dg_prof_mark(struct dg_prof *p, const char *label, dg_stream_t stream,
                 struct dg_error *err);

/* After the stream is synchronised: add the marks' intervals to the
 * totals and empty the pool.  Errors: DG_E_CUDA (an event not complete:
 * the stream was not synchronised), DG_E_RANGE (more labels than
 * DG_PROF_MAX_LABELS: later ones are dropped). */
int dg_prof_collect(struct dg_prof *p, struct dg_error *err);

/* The totals so far, in the order labels first came; returns how many
 * (at most max are copied).  dg_prof_reset zeroes them. */
int dg_prof_totals(const struct dg_prof *p, struct dg_prof_total *out, int max);
void dg_prof_reset(struct dg_prof *p);
int64_t dg_prof_dropped(const struct dg_prof *p);

#ifdef __cplusplus
}
#endif

#endif
