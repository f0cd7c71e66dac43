/*
 * sampler.h - the per-position arithmetic of DiffusionGemma's sampler
 * (model.md §6), written so that it can run on a slice of the vocabulary
 * and be combined across slices: the vocab-parallel sampler of design.md
 * §3.4.  The CUDA sampler kernels are checked against these functions.
 *
 * For one canvas position with raw (softcapped) logits z over V ids, at
 * temperature T, with the request's top-k / top-p filter:
 *
 *   keep     = { v : z_v >= tau }      tau from the filter (-inf: keep all)
 *   l_v      = z_v / T                 processed logits (v in keep)
 *   p_v      = exp(l_v - M) / S,       M = max l, S = sum exp(l - M)
 *   argmax   = argmax_v l_v            (lowest id on ties; = argmax z)
 *   sample   = argmax_v l_v + g_v      Gumbel-max: a draw from p, with
 *                                      g_v = dg_rand_gumbel(seed, canvas,
 *                                      step, position, v)
 *   entropy  = -sum p log p = log S - D / S,  D = sum exp(l - M) (l - M)
 *
 * A slice yields (M, S, D, argmax, sample) for its ids; slices combine
 * exactly (up to rounding) with dg_row_stats_combine, so no full row of
 * logits or probabilities ever has to be gathered in one place.
 */
#ifndef DG_SAMPLER_H
#define DG_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "lib/coll.h"
#include "lib/error.h"

/* Where a position's random draws come from (see philox.h). */
struct dg_rand_site {
    uint64_t seed;
    uint32_t canvas, step, position;
};

struct dg_row_stats {
    float max;          /* M over kept ids of this slice; -inf if none */
    double sum;         /* S, relative to max */
    double dev;         /* D, relative to max (<= 0) */
    int32_t argmax;     /* -1 if no kept id */
    float argmax_val;   /* l at argmax */
    int32_t sample;     /* -1 if no kept id */
    float sample_val;   /* l + g at sample */
    int64_t nonfinite;  /* ids whose raw logit was NaN or infinite */
};

/* The temperature at 0-based step k of a canvas with at most n_steps steps,
 * computed as transformers does it (float32):
 *   T = t_min + (t_max - t_min) * ((n_steps - k) / n_steps)
 * so T = t_max at k = 0 and t_min + (t_max - t_min) / n_steps at the last
 * step. */
float dg_temperature(double t_min, double t_max, int n_steps, int k);

/* The filter thresholds tau for rows of raw logits: ids with z >= tau are
 * kept.  top_k: keep the top_k largest logits (0 or >= V: no limit);
 * top_p: then keep the smallest set of largest logits whose mass under
 * softmax(z) (renormalised over the top-k set) reaches top_p (>= 1: no
 * limit).  Ties at the boundary are all kept.  Both at their no-limit
 * values give -INFINITY.  The search is a bisection over the ordered float
 * values (32 counting passes), the form that also works when rows are
 * split across ranks:
 *
 * n_rows rows split over the ranks of coll (NULL: one rank), all ranks
 * calling together: this rank holds columns z[r * stride + j], j < nv, of
 * row r; V is the whole row's length.  tau[n_rows] out, the same on every
 * rank.  scratch: n_rows * nv floats.  The bisection's counts and masses
 * are summed across ranks (32 all-reduces of n_rows values per filter,
 * plus a max and a total for top-p).  Errors: DG_E_NOMEM, collective
 * failures. */
int dg_filter_thresholds(const float *z, int64_t n_rows, int64_t nv, int64_t stride, int64_t V,
                         int top_k, double top_p, float *tau, float *scratch,
                         struct dg_coll *coll, struct dg_error *err);

/* Statistics of the slice z[0..n) holding vocab ids v0 .. v0+n-1.  site may
 * be NULL (no sample drawn: sample = -1). */
void dg_row_stats_slice(const float *z, int64_t v0, int64_t n, float T, float tau,
                        const struct dg_rand_site *site, struct dg_row_stats *st);

/* Fold b into a: the statistics of the union of two disjoint slices. */
void dg_row_stats_combine(struct dg_row_stats *a, const struct dg_row_stats *b);

/* Combine every rank's statistics of n_rows rows (one all-gather): out[r]
 * folds the ranks' local[r] in rank order, so every rank gets the same
 * bits.  gather: scratch of coll->size * n_rows records (unused with one
 * rank, where out = local).  Errors: collective failures. */
int dg_row_stats_allgather(struct dg_coll *coll, const struct dg_row_stats *local, int64_t n_rows,
                           struct dg_row_stats *out, struct dg_row_stats *gather,
                           struct dg_error *err);

/* Entropy in nats of the row the statistics describe. */
float dg_row_entropy(const struct dg_row_stats *st);

/* A denoising step's outputs from the combined statistics of its n rows:
 * sample[p], argmax[p], entropy[p]; a row with a non-finite logit or no
 * kept id gives 0, 0, NaN.  Returns the number of such rows (what the
 * backend reports as the item's nonfinite). */
int64_t dg_row_outputs(const struct dg_row_stats *st, int n, int32_t *sample, int32_t *argmax,
                       float *entropy);

/* p[v] for the slice z[0..n): exp(z_v / T - M) / S for kept ids, 0 for
 * filtered ones, with M and S from the combined statistics of the row. */
void dg_row_probs(const float *z, int64_t n, float T, float tau, const struct dg_row_stats *all,
                  float *p);

/* The entropy-bound acceptance (model.md §6): order positions by entropy,
 * ascending (ties: lower position first); the r-th in that order is
 * accepted iff the sum of the entropies before it is <= beta.  The lowest
 * entropy is always accepted; the accepted set is a prefix of the order.
 * Arithmetic as transformers on the CPU: the running sum in double, each
 * partial sum rounded to float, minus the current entropy in float,
 * compared with (float)beta.  order: n ints of scratch.  Returns the number
 * accepted. */
int dg_accept_mask(const float *entropy, int n, double beta, uint8_t *mask, int32_t *order);

/* Mean of n entropies (float). */
float dg_mean_entropy(const float *entropy, int n);

#endif
