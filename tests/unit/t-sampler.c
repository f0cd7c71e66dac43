/*
 * Description: the sampler on hand-built logits.  Temperature per step;
 * row statistics (argmax with ties, entropy, probabilities) against a
 * double-precision softmax and split into slices in several ways; top-k /
 * top-p thresholds against a sort-based reference, ties included; the
 * entropy-bound acceptance set (ties, everything accepted, only the lowest
 * accepted, zero entropies); the canvas loop's stability test with s = 0,
 * 1, 2, the confidence stop and the step cap; renoising of rejected
 * positions only; and a chi-square test that Gumbel-max samples follow
 * softmax(z / T), with and without a top-k / top-p filter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/canvas-run.h"
#include "lib/philox.h"
#include "lib/sampler.h"
#include "tests/harness.h"

/* A small deterministic generator for test inputs (not the one under test). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* One row on one rank; NAN if the call fails (the tests compare values). */
static float dg_filter_threshold(const float *z, int64_t V, int top_k, double top_p,
                                 float *scratch)
{
    float tau;
    if (dg_filter_thresholds(z, 1, V, V, V, top_k, top_p, &tau, scratch, NULL, NULL) < 0)
        return NAN;
    return tau;
}

static int temperature_schedule(void)
{
    /* first step t_max, last step t_min + (t_max - t_min) / N, linear between */
    const int N = 48;
    float prev = INFINITY;
    CHECK(dg_temperature(0.4, 0.8, N, 0) == 0.8f);
    for (int k = 0; k < N; k++) {
        const float T = dg_temperature(0.4, 0.8, N, k);
        const double want = 0.4 + 0.4 * (double)(N - k) / N;
        CHECKF(fabs(T - want) < 1e-7, "step %d: %.9g, want %.9g", k, (double)T, want);
        CHECK(T < prev);
        prev = T;
    }
    CHECK(fabs(dg_temperature(0.4, 0.8, N, N - 1) - 0.408333333) < 1e-7);
    CHECK(fabs(dg_temperature(0.0, 1.0, 4, 1) - 0.75) < 1e-7);
    CHECK(dg_temperature(0.0, 1.0, 1, 0) == 1.0f);
    return 0;
}

/* Reference statistics of a full row in double precision. */
static void ref_row(const float *z, int V, double T, double tau, int *argmax, double *entropy,
                    double *p)
{
    double m = -INFINITY, s = 0, h = 0;
    *argmax = -1;
    for (int v = 0; v < V; v++)
        if (z[v] >= tau && (*argmax < 0 || z[v] > z[*argmax]))
            *argmax = v;
    m = z[*argmax] / T;
    for (int v = 0; v < V; v++)
        s += z[v] >= tau ? exp(z[v] / T - m) : 0;
    for (int v = 0; v < V; v++) {
        const double q = z[v] >= tau ? exp(z[v] / T - m) / s : 0;
        if (p)
            p[v] = q;
        if (q > 0)
            h -= q * log(q);
    }
    *entropy = h;
}

static int row_stats_and_slices(void)
{
    static const int sizes[] = {1, 2, 7, 64, 301, 4099};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int V = sizes[si];
        float *z = malloc(sizeof(float) * (size_t)V), *p = malloc(sizeof(float) * (size_t)V);
        double *pr = malloc(sizeof(double) * (size_t)V);
        CHECK(z && p && pr);
        for (int trial = 0; trial < 5; trial++) {
            const float T = (float)(0.1 + rnd());
            const struct dg_rand_site site = {1234, 0, (uint32_t)trial, 5};
            struct dg_row_stats all, part, acc;
            int am;
            double h, psum = 0, pmax = 0;
            for (int v = 0; v < V; v++)
                z[v] = (float)(8 * rnd() - 4);
            if (trial == 1 && V > 3)
                z[V - 1] = z[1] = 9.0f; /* a tie for the maximum: the lower id wins */
            ref_row(z, V, T, -INFINITY, &am, &h, pr);
            dg_row_stats_slice(z, 0, V, T, -INFINITY, &site, &all);
            CHECKF(all.argmax == am, "V %d: argmax %d, want %d", V, all.argmax, am);
            CHECKF(fabs(dg_row_entropy(&all) - h) <= 2e-6 * fmax(1, h), "V %d: entropy %.9g, want %.9g",
                   V, (double)dg_row_entropy(&all), h);
            CHECK(all.sample >= 0 && all.sample < V && all.nonfinite == 0);
            dg_row_probs(z, V, T, -INFINITY, &all, p);
            for (int v = 0; v < V; v++) {
                psum += p[v];
                if (fabs(p[v] - pr[v]) > pmax)
                    pmax = fabs(p[v] - pr[v]);
            }
            CHECKF(fabs(psum - 1) < 1e-5 && pmax < 1e-6, "V %d: probabilities off by %g", V, pmax);
            /* any split into slices combines to the same statistics */
            for (int parts = 2; parts <= 5; parts++) {
                int64_t v0 = 0;
                memset(&acc, 0, sizeof acc);
                acc.argmax = acc.sample = -1;
                acc.max = -INFINITY;
                for (int k = 0; k < parts; k++) {
                    const int64_t v1 = (int64_t)V * (k + 1) / parts;
                    dg_row_stats_slice(z + v0, v0, v1 - v0, T, -INFINITY, &site, &part);
                    dg_row_stats_combine(&acc, &part);
                    v0 = v1;
                }
                CHECKF(acc.argmax == all.argmax && acc.sample == all.sample && acc.max == all.max,
                       "V %d in %d slices: argmax %d/%d sample %d/%d", V, parts, acc.argmax,
                       all.argmax, acc.sample, all.sample);
                CHECK(fabs(dg_row_entropy(&acc) - dg_row_entropy(&all)) <= 1e-6 * fmax(1, h));
            }
        }
        free(z);
        free(p);
        free(pr);
    }
    return 0;
}

static int nonfinite_logits_counted(void)
{
    float z[6] = {1, NAN, 2, INFINITY, -INFINITY, 0};
    struct dg_row_stats st;
    dg_row_stats_slice(z, 0, 6, 1.0f, -INFINITY, NULL, &st);
    CHECK(st.nonfinite == 3 && st.argmax == 2 && st.sample == -1);
    return 0;
}

/* Sort-based reference: keep the top k (ties at the k-th value kept), then
 * the smallest prefix of the rest (descending) with mass >= p. */
static int cmp_desc(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static float ref_threshold(const float *z, int V, int k, double p)
{
    float *s = malloc(sizeof(float) * (size_t)V), tau = -INFINITY;
    int n = V;
    qsort(memcpy(s, z, sizeof(float) * (size_t)V), (size_t)V, sizeof(float), cmp_desc);
    if (k > 0 && k < V) {
        tau = s[k - 1];
        while (n > 0 && s[n - 1] < tau)
            n--;
    }
    if (p < 1.0) {
        double total = 0, run = 0;
        for (int i = 0; i < n; i++)
            total += exp((double)s[i] - s[0]);
        for (int i = 0; i < n; i++) {
            run += exp((double)s[i] - s[0]);
            if (run >= p * total) {
                if (s[i] > tau)
                    tau = s[i];
                break;
            }
        }
    }
    free(s);
    return tau;
}

static int filter_thresholds(void)
{
    static const int sizes[] = {2, 5, 64, 301, 2000};
    static const int ks[] = {0, 1, 2, 3, 10, 50, 1 << 20};
    static const double ps[] = {1.0, 0.999, 0.9, 0.5, 0.1, 1e-9};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int V = sizes[si];
        float *z = malloc(sizeof(float) * (size_t)V), *scratch = malloc(sizeof(float) * (size_t)V);
        CHECK(z && scratch);
        for (int trial = 0; trial < 3; trial++) {
            for (int v = 0; v < V; v++)
                z[v] = trial == 2 ? (float)(int)(4 * rnd()) : (float)(10 * rnd() - 5);
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
                    const float got = dg_filter_threshold(z, V, ks[ki], ps[pi], scratch);
                    const float want = ref_threshold(z, V, ks[ki], ps[pi]);
                    CHECKF(got == want, "V %d k %d p %g (trial %d): tau %.9g, want %.9g", V,
                           ks[ki], ps[pi], trial, (double)got, (double)want);
                }
        }
        free(z);
        free(scratch);
    }
    {
        /* no filter: -inf; k = 1: only the maximum survives */
        float z[4] = {0.5f, 3.0f, -1.0f, 2.0f}, scratch[4];
        CHECK(dg_filter_threshold(z, 4, 0, 1.0, scratch) == -INFINITY);
        CHECK(dg_filter_threshold(z, 4, 4, 1.0, scratch) == -INFINITY);
        CHECK(dg_filter_threshold(z, 4, 1, 1.0, scratch) == 3.0f);
        CHECK(dg_filter_threshold(z, 4, 2, 1.0, scratch) == 2.0f);
    }
    return 0;
}

static int filtered_ids_never_sampled(void)
{
    float z[50], scratch[50];
    for (int v = 0; v < 50; v++)
        z[v] = (float)(rnd() * 2);
    {
        const float tau = dg_filter_threshold(z, 50, 5, 1.0, scratch);
        for (uint32_t step = 0; step < 2000; step++) {
            const struct dg_rand_site site = {77, 0, step, 3};
            struct dg_row_stats st;
            dg_row_stats_slice(z, 0, 50, 0.5f, tau, &site, &st);
            CHECK(z[st.sample] >= tau);
        }
    }
    {
        const float tau = dg_filter_threshold(z, 50, 1, 1.0, scratch);
        const struct dg_rand_site site = {77, 0, 1, 3};
        struct dg_row_stats st;
        dg_row_stats_slice(z, 0, 50, 5.0f, tau, &site, &st);
        CHECK(st.sample == st.argmax && dg_row_entropy(&st) == 0.0f);
    }
    return 0;
}

/* Gumbel-max samples follow softmax(z / T) over the kept ids. */
static int chi_square_case(const float *z, int V, float T, int top_k, double top_p,
                           const char *what)
{
    const long draws = 40000;
    long count[16] = {0};
    double p[16], chi = 0, crit;
    float scratch[16];
    const float tau = dg_filter_threshold(z, V, top_k, top_p, scratch);
    int am, dof = -1;
    double h;

    ref_row(z, V, T, tau, &am, &h, p);
    for (long d = 0; d < draws; d++) {
        const struct dg_rand_site site = {2026, (uint32_t)(d / 40000), (uint32_t)(d / 200 % 200),
                                          (uint32_t)(d % 200)};
        struct dg_row_stats st;
        dg_row_stats_slice(z, 0, V, T, tau, &site, &st);
        count[st.sample]++;
    }
    for (int v = 0; v < V; v++) {
        if (p[v] == 0) {
            CHECKF(count[v] == 0, "%s: filtered id %d sampled %ld times", what, v, count[v]);
            continue;
        }
        chi += (count[v] - draws * p[v]) * (count[v] - draws * p[v]) / (draws * p[v]);
        dof++;
    }
    /* critical values of chi-square at significance 0.001 */
    {
        static const double c001[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32,
                                      26.12, 27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70};
        CHECK(dof >= 1 && dof < 16);
        crit = c001[dof];
    }
    printf("# %s: chi-square %.2f with %d dof over %ld draws (critical %.2f at 0.001)\n", what,
           chi, dof, draws, crit);
    CHECKF(chi < crit, "%s: chi-square %.2f >= %.2f", what, chi, crit);
    return 0;
}

static int sampling_chi_square(void)
{
    /* every expected count is >= 100 in the unfiltered cases */
    const float z[8] = {1.0f, 0.2f, -0.5f, 1.4f, 0.0f, -1.0f, 0.7f, 1.1f};
    int rc;
    if ((rc = chi_square_case(z, 8, 0.7f, 0, 1.0, "T 0.7")) != 0)
        return rc;
    if ((rc = chi_square_case(z, 8, 1.3f, 0, 1.0, "T 1.3")) != 0)
        return rc;
    if ((rc = chi_square_case(z, 8, 0.8f, 5, 1.0, "T 0.8, top_k 5")) != 0)
        return rc;
    return chi_square_case(z, 8, 0.8f, 0, 0.7, "T 0.8, top_p 0.7");
}

static int accept_sets(void)
{
    uint8_t m[8];
    int32_t order[8];
    {
        /* ties: equal entropies, the lower position first; criteria 0, .3, .6 */
        const float h[4] = {0.3f, 0.3f, 0.3f, 0.3f};
        CHECK(dg_accept_mask(h, 4, 0.5, m, order) == 2);
        CHECK(m[0] && m[1] && !m[2] && !m[3]);
    }
    {
        /* distinct: sorted .05 (3), .1 (1), .2 (2), .5 (0); criteria 0, .05, .15, .35 */
        const float h[4] = {0.5f, 0.1f, 0.2f, 0.05f};
        CHECK(dg_accept_mask(h, 4, 0.2, m, order) == 3);
        CHECK(!m[0] && m[1] && m[2] && m[3]);
        /* only the lowest */
        CHECK(dg_accept_mask(h, 4, 0.01, m, order) == 1);
        CHECK(!m[0] && !m[1] && !m[2] && m[3]);
        /* all */
        CHECK(dg_accept_mask(h, 4, 100.0, m, order) == 4);
        CHECK(m[0] && m[1] && m[2] && m[3]);
        /* a criterion exactly at the bound is accepted (<=) */
        CHECK(dg_accept_mask(h, 4, 0.15000000596046448, m, order) == 3);
    }
    {
        /* zero entropy everywhere: everything accepted for any bound */
        const float h[5] = {0, 0, 0, 0, 0};
        CHECK(dg_accept_mask(h, 5, 1e-9, m, order) == 5);
    }
    {
        /* high entropies (a random model): only the lowest */
        const float h[6] = {5.1f, 4.9f, 5.3f, 5.0f, 5.2f, 4.95f};
        CHECK(dg_accept_mask(h, 6, 0.1, m, order) == 1);
        CHECK(m[1] && !m[0] && !m[2] && !m[3] && !m[4] && !m[5]);
    }
    return 0;
}

/* Drive a canvas with scripted argmax canvases; return the step it ends on. */
static int run_script(int s, double conf, int max_steps, const int32_t (*argmax)[4],
                      const float *mean_h, int n_script, enum dg_canvas_end *end)
{
    struct dg_canvas_params p = {4, max_steps, 0.1, conf, s, 1000, 5};
    struct dg_canvas_run r;
    struct dg_error err;
    int32_t sample[4] = {1, 2, 3, 4};
    if (dg_canvas_run_init(&r, &p, &err) != 0)
        return -1;
    dg_canvas_run_start(&r, 0);
    *end = DG_CANVAS_RUNNING;
    for (int k = 0; k < n_script && *end == DG_CANVAS_RUNNING; k++) {
        float h[4];
        for (int i = 0; i < 4; i++)
            h[i] = mean_h[k];
        *end = dg_canvas_run_step(&r, sample, argmax[k], h, NULL);
    }
    {
        const int steps = r.step;
        dg_canvas_run_free(&r);
        return steps;
    }
}

static int stability_and_confidence(void)
{
    static const int32_t A[4] = {1, 2, 3, 4}, B[4] = {1, 2, 3, 5};
    const int32_t seq_same[6][4] = {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4},
                                    {1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}};
    int32_t seq_abb[6][4];
    const float low[6] = {0.001f, 0.001f, 0.001f, 0.001f, 0.001f, 0.001f};
    const float high[6] = {1, 1, 1, 1, 1, 1};
    const float falling[6] = {1, 0.5f, 0.2f, 0.0049f, 0.001f, 0.001f};
    enum dg_canvas_end end;

    memcpy(seq_abb[0], A, sizeof A);
    for (int k = 1; k < 6; k++)
        memcpy(seq_abb[k], B, sizeof B);
    /* s = 0: no stability test; confident at once -> stop after step 1 */
    CHECK(run_script(0, 0.005, 10, seq_same, low, 6, &end) == 1 && end == DG_CANVAS_CONVERGED);
    /* s = 1: two identical argmax canvases */
    CHECK(run_script(1, 0.005, 10, seq_same, low, 6, &end) == 2 && end == DG_CANVAS_CONVERGED);
    /* s = 2: three */
    CHECK(run_script(2, 0.005, 10, seq_same, low, 6, &end) == 3 && end == DG_CANVAS_CONVERGED);
    /* a change restarts the run: A B B -> s = 1 stops at step 3, s = 2 at 4 */
    CHECK(run_script(1, 0.005, 10, (const int32_t(*)[4])seq_abb, low, 6, &end) == 3);
    CHECK(run_script(2, 0.005, 10, (const int32_t(*)[4])seq_abb, low, 6, &end) == 4);
    /* stable but never confident: the step cap */
    CHECK(run_script(1, 0.005, 5, seq_same, high, 6, &end) == 5 && end == DG_CANVAS_STEP_CAP);
    /* confidence reached at step 4 (mean 0.0049 < 0.005), stable since 2 */
    CHECK(run_script(1, 0.005, 10, seq_same, falling, 6, &end) == 4 && end == DG_CANVAS_CONVERGED);
    /* confidence is strict: mean == threshold is not confident */
    CHECK(run_script(0, 0.002, 3, seq_same, low, 6, &end) == 1);
    CHECK(run_script(0, 0.0009765625, 3, seq_same, (const float[6]){0.0009765625f, 0.0009765625f,
                                                    0.0009765625f, 1, 1, 1}, 6, &end) == 3 &&
          end == DG_CANVAS_STEP_CAP);
    /* a cap of one step: always exactly one step */
    CHECK(run_script(3, 0.005, 1, seq_same, high, 6, &end) == 1 && end == DG_CANVAS_STEP_CAP);
    return 0;
}

static int renoise_only_rejected(void)
{
    struct dg_canvas_params p = {6, 10, 0.1, 0.005, 1, 1u << 30, 321};
    struct dg_canvas_run r;
    struct dg_error err;
    const int32_t sample[6] = {10, 11, 12, 13, 14, 15}, am[6] = {20, 21, 22, 23, 24, 25};
    const float h[6] = {0.1f, 3, 0.01f, 3, 3, 0.02f}; /* sorted criteria 0, .01, .03, .13: accepted 2, 5, 0 */
    int32_t init[6];

    CHECK_OK(dg_canvas_run_init(&r, &p, &err), &err);
    dg_canvas_run_start(&r, 4);
    /* the initial canvas is the INIT stream of canvas 4 */
    for (int i = 0; i < 6; i++)
        CHECK(r.canvas[i] == dg_rand_token(321, 4, 0, (uint32_t)i, DG_RAND_INIT, 1u << 30));
    memcpy(init, r.canvas, sizeof init);
    CHECK(dg_canvas_run_step(&r, sample, am, h, NULL) == DG_CANVAS_RUNNING);
    CHECK(r.last_accepted == 3);
    for (int i = 0; i < 6; i++) {
        if (i == 0 || i == 2 || i == 5)
            CHECK(r.accepted[i] && r.canvas[i] == sample[i]);
        else
            CHECK(!r.accepted[i] &&
                  r.canvas[i] == dg_rand_token(321, 4, 0, (uint32_t)i, DG_RAND_RENOISE, 1u << 30));
    }
    /* a restart of the same canvas index gives the same initial canvas */
    dg_canvas_run_start(&r, 4);
    CHECK(!memcmp(r.canvas, init, sizeof init) && r.step == 0);
    dg_canvas_run_free(&r);
    return 0;
}

int main(void)
{
    TEST_CASE(temperature_schedule);
    TEST_CASE(row_stats_and_slices);
    TEST_CASE(nonfinite_logits_counted);
    TEST_CASE(filter_thresholds);
    TEST_CASE(filtered_ids_never_sampled);
    TEST_CASE(sampling_chi_square);
    TEST_CASE(accept_sets);
    TEST_CASE(stability_and_confidence);
    TEST_CASE(renoise_only_rejected);
    return test_finish();
}
