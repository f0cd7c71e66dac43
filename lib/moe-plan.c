/* moe-plan.c - the experts' stage's plan from the shapes (moe-plan.h). */
#include "lib/moe-plan.h"

#include <math.h>

/* the smallest power of two, 16 .. 128, at or above mean + 4 sqrt(mean) */
static int tile_rows(double mean)
{
    const double want = mean + 4.0 * sqrt(mean);
    int ts = 16;
    while (ts < 128 && ts < want)
        ts *= 2;
    return ts;
}

int dg_moe_plan_make(int64_t T, int K, int n_exp, int n_all, struct dg_moe_plan *p,
                     struct dg_error *err)
{
    int64_t picks, b;
    if (T < 1 || K < 1 || n_exp < 1 || n_exp > DG_MOE_PLAN_MAX_EXPERTS || n_all < n_exp ||
        T > 0x7fffffff / K)
        return dg_error_set(err, DG_E_INVAL, "moe plan: %lld tokens x top-%d, %d of %d experts",
                            (long long)T, K, n_exp, n_all);
    picks = T * K;
    p->expect = (picks * n_exp + n_all - 1) / n_all;
    p->ts = tile_rows((double)picks / n_all);
    p->tiles = (picks + p->ts - 1) / p->ts + n_exp;
    b = (p->expect + p->ts - 1) / p->ts + n_exp / 2 + (int64_t)ceil(2.0 * sqrt((double)n_exp));
    p->batched = b < p->tiles ? b : p->tiles;
    p->hint = (int)((p->expect + n_exp - 1) / n_exp);
    return 0;
}

int dg_moe_plan_split(int rows_hint, int NT, int64_t tiles)
{
    const double most = rows_hint > 0 ? rows_hint + 4.0 * sqrt((double)rows_hint) : 0.0;
    int nz = NT > 0 && most > NT ? (int)ceil(most / NT) : 1;
    if (nz > DG_MOE_SPLIT_MAX)
        nz = DG_MOE_SPLIT_MAX;
    while (nz > 1 && (tiles < 1 || tiles * nz > 0x7fffffff))
        nz--;
    return nz;
}
