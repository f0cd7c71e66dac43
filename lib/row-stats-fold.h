/*
 * row-stats-fold.h - folding the sampler's statistics of two disjoint
 * vocabulary slices into those of their union: the one piece of arithmetic
 * the CPU (dg_row_stats_combine, lib/sampler.c) and the GPU
 * (kernels/sampler-stats.cu) share, compiled for both (DG_HD, as philox.h).
 *
 *   M = max(Ma, Mb),  s_x = exp(Mx - M)          (in double)
 *   S = Sa sa + Sb sb
 *   D = sa (Da + (Ma - M) Sa) + sb (Db + (Mb - M) Sb)
 *   argmax, sample: the larger value, the lower id on ties
 *   nonfinite: summed
 */
#ifndef DG_ROW_STATS_FOLD_H
#define DG_ROW_STATS_FOLD_H

#include <math.h>
#include <stdint.h>

#include "lib/philox.h"
#include "lib/sampler.h"

/* (id, val) := (bid, bval) when b is there and wins */
DG_HD void dg_row_stats_pick(int32_t *id, float *val, int32_t bid, float bval)
{
    if (bid < 0)
        return;
    if (*id < 0 || bval > *val || (bval == *val && bid < *id)) {
        *id = bid;
        *val = bval;
    }
}

DG_HD void dg_row_stats_fold(struct dg_row_stats *a, const struct dg_row_stats *b)
{
    a->nonfinite += b->nonfinite;
    if (b->argmax < 0)
        return;
    if (a->argmax < 0) {
        const int64_t bad = a->nonfinite;
        *a = *b;
        a->nonfinite = bad;
        return;
    }
    {
        const float M = a->max > b->max ? a->max : b->max;
        const double da = (double)a->max - M, db = (double)b->max - M;
        const double sa = exp(da), sb = exp(db);
        const double S = a->sum * sa + b->sum * sb;
        const double D = sa * (a->dev + da * a->sum) + sb * (b->dev + db * b->sum);
        a->max = M;
        a->sum = S;
        a->dev = D;
    }
    dg_row_stats_pick(&a->argmax, &a->argmax_val, b->argmax, b->argmax_val);
    dg_row_stats_pick(&a->sample, &a->sample_val, b->sample, b->sample_val);
}

#endif
