/* sampler.c - per-position sampler statistics, the filter threshold and the
 * entropy-bound acceptance (see sampler.h). */
#include "lib/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/philox.h"

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

/* The largest key t with pred(t); pred(0) must hold and pred must be
 * monotone (true below some key, false above). */
#define BISECT(pred_expr, out)                                                   \
    do {                                                                         \
        uint64_t lo_ = 0, hi_ = UINT64_C(1) << 32;                               \
        while (hi_ - lo_ > 1) {                                                  \
            const uint32_t t = (uint32_t)((lo_ + hi_) / 2);                      \
            if (pred_expr)                                                       \
                lo_ = t;                                                         \
            else                                                                 \
                hi_ = t;                                                         \
        }                                                                        \
        (out) = (uint32_t)lo_;                                                   \
    } while (0)

static int64_t count_at_least(const float *z, int64_t V, uint32_t t)
{
    int64_t c = 0;
    for (int64_t v = 0; v < V; v++)
        c += float_key(z[v]) >= t;
    return c;
}

static double mass_at_least(const float *z, const float *e, int64_t V, uint32_t t)
{
    double m = 0;
    for (int64_t v = 0; v < V; v++)
        if (float_key(z[v]) >= t)
            m += e[v];
    return m;
}

float dg_filter_threshold(const float *z, int64_t V, int top_k, double top_p, float *scratch)
{
    uint32_t kmin = 0; /* keys below this are filtered out */

    if (top_k > 0 && top_k < V) {
        const int64_t K = top_k;
        BISECT(count_at_least(z, V, t) >= K, kmin);
    }
    if (top_p < 1.0) {
        float zmax = -INFINITY;
        double total = 0;
        for (int64_t v = 0; v < V; v++)
            if (float_key(z[v]) >= kmin && z[v] > zmax)
                zmax = z[v];
        for (int64_t v = 0; v < V; v++) {
            scratch[v] = float_key(z[v]) >= kmin ? (float)exp((double)z[v] - zmax) : 0.0f;
            total += scratch[v];
        }
        {
            const double target = top_p * total;
            uint32_t kp;
            BISECT(mass_at_least(z, scratch, V, t) >= target, kp);
            if (kp > kmin)
                kmin = kp;
        }
    }
    return kmin == 0 ? -INFINITY : key_float(kmin);
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
            float l, d;
            if (!isfinite(z[i]) || !(z[i] >= tau))
                continue;
            l = z[i] / T;
            d = l - M;
            {
                const double e = exp((double)d);
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

/* a wins ties when its id is lower */
static void pick(int32_t *id, float *val, int32_t bid, float bval)
{
    if (bid < 0)
        return;
    if (*id < 0 || bval > *val || (bval == *val && bid < *id)) {
        *id = bid;
        *val = bval;
    }
}

void dg_row_stats_combine(struct dg_row_stats *a, const struct dg_row_stats *b)
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
    pick(&a->argmax, &a->argmax_val, b->argmax, b->argmax_val);
    pick(&a->sample, &a->sample_val, b->sample, b->sample_val);
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

void dg_row_probs(const float *z, int64_t n, float T, float tau, const struct dg_row_stats *all,
                  float *p)
{
    const double inv_s = 1.0 / all->sum;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(z[i]) && z[i] >= tau) {
            const float d = z[i] / T - all->max;
            p[i] = (float)(exp((double)d) * inv_s);
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
