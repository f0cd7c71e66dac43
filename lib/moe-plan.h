/*
 * moe-plan.h - the experts' stage's plan, from the shapes alone: how many
 * rows a tile holds, how many tiles any routing can need, how many a
 * routing as even as chance makes it needs, and the rows an expert gets on
 * average.  The GPU's mixture of experts (kernels/moe.cu) sizes its
 * scratch and fixes its launches by it before any routing exists, so that
 * the launches can be captured in a CUDA graph.
 *
 * A rank holds the experts e0 .. e0 + n_exp - 1 of the model's n_all
 * (n_exp = n_all at TP=1 and with the experts split along their width; a
 * share of them with the experts split across ranks).  Of the T K picks a
 * step makes, every one may land on this rank's experts (so the bounds
 * count them all), but under even routing the rank expects
 *
 *   expect = ceil(T K n_exp / n_all)
 *
 * and each of its experts about mean = T K / n_all rows.  The tiles:
 *
 *   ts      = the smallest power of two, 16 .. 128, at or above
 *             mean + 4 sqrt(mean) (what an expert gets with near certainty)
 *   tiles   = ceil(T K / ts) + n_exp                  (sum ceil(c_j / ts), any c)
 *   batched = min(tiles, ceil(expect / ts) + n_exp / 2 + ceil(2 sqrt(n_exp)))
 *
 * batched: beyond expect / ts each expert whose run ends in a part-filled
 * tile adds one, n_exp / 2 of them when the fractions are spread, with a
 * spread of at most sqrt(n_exp) / 2 for independent ones: that mean and 4
 * spreads.  hint = ceil(expect / n_exp), the mean rows an expert, picks a
 * kernel's rows a pass.
 */
#ifndef DG_MOE_PLAN_H
#define DG_MOE_PLAN_H

#include <stdint.h>

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_MOE_PLAN_MAX_EXPERTS 1024 /* a rank's: one routing block's threads */

struct dg_moe_plan {
    int ts;          /* rows a tile */
    int64_t tiles;   /* tiles any routing can need */
    int64_t batched; /* tiles an even routing needs, with margin (at most tiles) */
    int64_t expect;  /* picks this rank expects */
    int hint;        /* rows an expert expects (at least 1) */
};

/* The plan above for T tokens of top-K picks, a rank holding n_exp of the
 * model's n_all experts.  Errors: DG_E_INVAL where T, K or n_exp is below
 * 1, n_exp above DG_MOE_PLAN_MAX_EXPERTS or n_all, or T K above 2^31 - 1
 * (the picks are counted in int32). */
int dg_moe_plan_make(int64_t T, int K, int n_exp, int n_all, struct dg_moe_plan *p,
                     struct dg_error *err);

/* The blocks a weight tile's passes of NT rows are split over in the
 * experts' one-launch kernels (block z of a tile takes the passes z, z +
 * nz, ...): as many as the fullest expert needs under even routing, whose
 * rows are with near certainty at most rows_hint + 4 sqrt(rows_hint) (a
 * block with no pass returns at once), at most DG_MOE_SPLIT_MAX, and
 * fewer where tiles nz would pass 2^31 - 1 tickets (tiles: the launch's
 * tiles at nz = 1).  1 where NT < 1 or tiles < 1. */
#define DG_MOE_SPLIT_MAX 32
int dg_moe_plan_split(int rows_hint, int NT, int64_t tiles);

#ifdef __cplusplus
}
#endif

#endif
