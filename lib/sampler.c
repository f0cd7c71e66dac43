/* sampler.c - per-position sampler statistics, the filter threshold and the
 * entropy-bound acceptance (see sampler.h). */
#include "lib/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/philox.h"
#include "lib/row-stats-fold.h"

float dg_temperature(double t_min, double t_max, int n_steps, int k)
{
    /* transformers: cur_step = n_steps - k (an int32 tensor); cur_step / N
     * is a float32 division; the Python floats t_min and (t_max - t_min)
     * enter as float32 scalars. */
    const float frac = (float)(n_steps - k) / (float)n_steps;
    const float span = (float)(t_max - t_min);
    const float prod = span * frac;
    return (float)t_min + prod;
}

/* Order-preserving map of a (non-NaN) float to an unsigned key. */
static uint32_t float_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static float key_float(uint32_t k)
{
    const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Local count of keys >= t[r] (or mass, with e) per row, then summed over
 * the ranks. */
static int reduce_round(const float *z, const float *e, int64_t n_rows, int64_t nv, int64_t stride,
                        const uint32_t *kmin, const uint64_t *mid, double *acc,
                        struct dg_coll *coll, struct dg_error *err)
{
    for (int64_t r = 0; r < n_rows; r++) {
        const float *zr = z + r * stride;
        const uint32_t t = (uint32_t)mid[r];
        double a = 0;
        if (e) {
            for (int64_t v = 0; v < nv; v++)
                if (float_key(zr[v]) >= t && float_key(zr[v]) >= kmin[r])
                    a += e[r * nv + v];
        } else {
            int64_t c = 0;
            for (int64_t v = 0; v < nv; v++)
                c += float_key(zr[v]) >= t;
            a = (double)c;
        }
        acc[r] = a;
    }
    return dg_all_reduce(coll, acc, (size_t)n_rows, DG_COLL_F64, DG_COLL_SUM, err);
}

/* The largest key with acc(key) >= target[r], per row: 32 halvings of
 * [0, 2^32). */
static int bisect(const float *z, const float *e, int64_t n_rows, int64_t nv, int64_t stride,
                  const uint32_t *kmin, const double *target, uint32_t *out, uint64_t *lo,
                  uint64_t *hi, uint64_t *mid, double *acc, struct dg_coll *coll,
                  struct dg_error *err)
{
    int rc;
    for (int64_t r = 0; r < n_rows; r++) {
        lo[r] = 0;
        hi[r] = UINT64_C(1) << 32;
    }
    for (int round = 0; round < 32; round++) {
        for (int64_t r = 0; r < n_rows; r++)
            mid[r] = (lo[r] + hi[r]) / 2;
        if ((rc = reduce_round(z, e, n_rows, nv, stride, kmin, mid, acc, coll, err)) < 0)
            return rc;
        for (int64_t r = 0; r < n_rows; r++) {
            if (acc[r] >= target[r])
                lo[r] = mid[r];
            else
                hi[r] = mid[r];
        }
    }
    for (int64_t r = 0; r < n_rows; r++)
        out[r] = (uint32_t)lo[r];
    return 0;
}

int dg_filter_thresholds(const float *z, int64_t n_rows, int64_t nv, int64_t stride, int64_t V,
                         int top_k, double top_p, float *tau, float *scratch,
                         struct dg_coll *coll, struct dg_error *err)
{
    const int use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0;
    uint64_t *lo = NULL, *hi = NULL, *mid = NULL;
    uint32_t *kmin = NULL, *kp = NULL;
    double *acc = NULL, *target = NULL;
    float *zmax = NULL;
    int rc = 0;

    if (!use_k && !use_p) {
        for (int64_t r = 0; r < n_rows; r++)
            tau[r] = -INFINITY;
        return 0;
    }
    lo = malloc(sizeof *lo * (size_t)n_rows);
    hi = malloc(sizeof *hi * (size_t)n_rows);
    mid = malloc(sizeof *mid * (size_t)n_rows);
    kmin = calloc((size_t)n_rows, sizeof *kmin);
    kp = malloc(sizeof *kp * (size_t)n_rows);
    acc = malloc(sizeof *acc * (size_t)n_rows);
    target = malloc(sizeof *target * (size_t)n_rows);
    zmax = malloc(sizeof *zmax * (size_t)n_rows);
    if (!lo || !hi || !mid || !kmin || !kp || !acc || !target || !zmax) {
        rc = dg_error_set(err, DG_E_NOMEM, "sampler: out of memory for %lld rows",
                          (long long)n_rows);
        goto out;
    }
    if (use_k) {
        for (int64_t r = 0; r < n_rows; r++)
            target[r] = (double)top_k;
        if ((rc = bisect(z, NULL, n_rows, nv, stride, kmin, target, kmin, lo, hi, mid, acc, coll,
                         err)) < 0)
            goto out;
    }
    if (use_p) {
        /* the kept ids' mass under softmax(z), relative to the kept maximum */
        for (int64_t r = 0; r < n_rows; r++) {
            const float *zr = z + r * stride;
            zmax[r] = -INFINITY;
            for (int64_t v = 0; v < nv; v++)
                if (float_key(zr[v]) >= kmin[r] && zr[v] > zmax[r])
                    zmax[r] = zr[v];
        }
        if ((rc = dg_all_reduce(coll, zmax, (size_t)n_rows, DG_COLL_F32, DG_COLL_MAX, err)) < 0)
            goto out;
        for (int64_t r = 0; r < n_rows; r++) {
            const float *zr = z + r * stride;
            double total = 0;
            for (int64_t v = 0; v < nv; v++) {
                float *e = &scratch[r * nv + v];
                *e = float_key(zr[v]) >= kmin[r] ? (float)exp((double)zr[v] - zmax[r]) : 0.0f;
                total += *e;
            }
            acc[r] = total;
        }
        if ((rc = dg_all_reduce(coll, acc, (size_t)n_rows, DG_COLL_F64, DG_COLL_SUM, err)) < 0)
            goto out;
        for (int64_t r = 0; r < n_rows; r++)
            target[r] = top_p * acc[r];
        if ((rc = bisect(z, scratch, n_rows, nv, stride, kmin, target, kp, lo, hi, mid, acc, coll,
                         err)) < 0)
            goto out;
        for (int64_t r = 0; r < n_rows; r++)
            if (kp[r] > kmin[r])
                kmin[r] = kp[r];
    }
    for (int64_t r = 0; r < n_rows; r++)
        tau[r] = kmin[r] == 0 ? -INFINITY : key_float(kmin[r]);
out:
    free(lo);
    free(hi);
    free(mid);
    free(kmin);
    free(kp);
    free(acc);
    free(target);
    free(zmax);
    return rc;
}

void dg_row_stats_slice(const float *z, int64_t v0, int64_t n, float T, float tau,
                        const struct dg_rand_site *site, struct dg_row_stats *st)
{
    float M = -INFINITY;
    int32_t am = -1, sm = -1;
    float amv = -INFINITY, smv = -INFINITY;
    int64_t bad = 0;
    double S = 0, D = 0;
    uint32_t block[4], block_c0 = UINT32_MAX;

    for (int64_t i = 0; i < n; i++) {
        float l;
        if (!isfinite(z[i])) {
            bad++;
            continue;
        }
        if (!(z[i] >= tau))
            continue;
        l = z[i] / T;
        if (l > M) {
            M = l;
            am = (int32_t)(v0 + i);
            amv = l;
        }
    }
    if (am >= 0) {
        for (int64_t i = 0; i < n; i++) {
            float l;
            double d;
            if (!isfinite(z[i]) || !(z[i] >= tau))
                continue;
            l = z[i] / T;
            /* in double: exact for two floats, so the slice's sums rescale
             * to any other maximum without a float rounding in between */
            d = (double)l - (double)M;
            {
                const double e = exp(d);
                S += e;
                D += e * d;
            }
            if (site) {
                const uint32_t v = (uint32_t)(v0 + i);
                float g, val;
                if (v >> 2 != block_c0) {
                    block_c0 = v >> 2;
                    dg_rand_block(site->seed, block_c0, site->position, site->step,
                                  DG_RAND_GUMBEL, site->canvas, block);
                }
                g = dg_gumbel(dg_rand_unit(block[v & 3]));
                val = l + g;
                if (val > smv) {
                    smv = val;
                    sm = (int32_t)v;
                }
            }
        }
    }
    st->max = M;
    st->sum = S;
    st->dev = D;
    st->argmax = am;
    st->argmax_val = amv;
    st->sample = sm;
    st->sample_val = smv;
    st->nonfinite = bad;
}

void dg_row_stats_combine(struct dg_row_stats *a, const struct dg_row_stats *b)
{
    dg_row_stats_fold(a, b);
}

int dg_row_stats_allgather(struct dg_coll *coll, const struct dg_row_stats *local, int64_t n_rows,
                           struct dg_row_stats *out, struct dg_row_stats *gather,
                           struct dg_error *err)
{
    int rc;
    if (!coll || coll->size <= 1) {
        if (out != local)
            memmove(out, local, sizeof *out * (size_t)n_rows);
        return 0;
    }
    if ((rc = dg_all_gather(coll, local, gather, sizeof *local * (size_t)n_rows, err)) < 0)
        return rc;
    for (int64_t r = 0; r < n_rows; r++) {
        out[r] = gather[r];
        for (int q = 1; q < coll->size; q++)
            dg_row_stats_combine(&out[r], &gather[(int64_t)q * n_rows + r]);
    }
    return 0;
}

float dg_row_entropy(const struct dg_row_stats *st)
{
    if (st->argmax < 0 || !(st->sum > 0))
        return NAN;
    {
        const double h = log(st->sum) - st->dev / st->sum;
        return (float)(h > 0 ? h : 0.0);
    }
}

int64_t dg_row_outputs(const struct dg_row_stats *st, int n, int32_t *sample, int32_t *argmax,
                       float *entropy)
{
    int64_t bad = 0;
    for (int p = 0; p < n; p++) {
        if (st[p].nonfinite || st[p].argmax < 0) {
            bad++;
            sample[p] = argmax[p] = 0;
            entropy[p] = NAN;
            continue;
        }
        sample[p] = st[p].sample;
        argmax[p] = st[p].argmax;
        entropy[p] = dg_row_entropy(&st[p]);
    }
    return bad;
}

void dg_row_probs(const float *z, int64_t n, float T, float tau, const struct dg_row_stats *all,
                  float *p)
{
    const double inv_s = 1.0 / all->sum;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(z[i]) && z[i] >= tau) {
            const double d = (double)(z[i] / T) - (double)all->max;
            p[i] = (float)(exp(d) * inv_s);
        } else {
            p[i] = 0.0f;
        }
    }
}

static int cmp_entropy(const void *pa, const void *pb, void *ctx)
{
    const float *h = ctx;
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (h[a] < h[b])
        return -1;
    if (h[a] > h[b])
        return 1;
    return (a > b) - (a < b);
}

int dg_accept_mask(const float *entropy, int n, double beta, uint8_t *mask, int32_t *order)
{
    double run = 0;
    const float fbeta = (float)beta;
    int accepted = 0;

    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, cmp_entropy, (void *)entropy);
    for (int r = 0; r < n; r++) {
        const float h = entropy[order[r]];
        float cum, crit;
        run += h;
        cum = (float)run;
        crit = cum - h;
        mask[order[r]] = crit <= fbeta;
        accepted += crit <= fbeta;
    }
    return accepted;
}

float dg_mean_entropy(const float *entropy, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += entropy[i];
    return n > 0 ? (float)(s / n) : 0.0f;
}
