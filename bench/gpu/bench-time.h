/*
 * bench-time.h - one call's device time in the GPU benchmarks: the call
 * run once unrecorded, then reps times, each between two events of a
 * profiler (kernels/prof.h) on the null stream, the device synchronised
 * after each; the times (ms) into t[0 .. reps - 1] and their median back.
 */
#ifndef DG_BENCH_TIME_H
#define DG_BENCH_TIME_H

#include "bench/gpu/bench-util.h"
#include "kernels/devmem.h"
#include "kernels/prof.h"

/* call(ctx, err): queues the work on the null stream, 0 or a negative
 * status.  The median ms, or -1 with err set where a call or the
 * profiler failed. */
static inline double bench_time_device(struct dg_prof *prof, int reps, double *t,
                                       int (*call)(void *ctx, struct dg_error *err), void *ctx,
                                       struct dg_error *err)
{
    struct dg_prof_total tot[DG_PROF_MAX_LABELS];
    double before = 0.0;
    for (int r = -1; r < reps; r++) {
        if (dg_prof_begin(prof, NULL, err) < 0 || call(ctx, err) < 0 ||
            dg_prof_mark(prof, "call", NULL, err) < 0 || dg_cuda_sync(0, err) < 0 ||
            dg_prof_collect(prof, err) < 0 || dg_prof_totals(prof, tot, DG_PROF_MAX_LABELS) < 1)
            return -1.0;
        if (r >= 0)
            t[r] = tot[0].ms - before;
        before = tot[0].ms;
    }
    return bench_median(t, reps);
}

#endif
