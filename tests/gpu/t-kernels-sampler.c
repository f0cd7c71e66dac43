/*
 * Description: the sampler's statistics kernel (soft-cap, temperature,
 * top-k/top-p threshold, max, sum of exponentials, entropy term, argmax,
 * Philox Gumbel-max sample, non-finite count) against the plain-C sampler
 * (dg_ref_softcap, then dg_row_stats_slice over each row) on fresh random
 * logits: rows of 1,000 to 65,536 ids (not multiples of the chunk),
 * vocabulary slices that start past 0, thresholds that keep all or part,
 * NaN logits.  Argmax and sample ids must be equal; max within fp32
 * rounding, S and D within 1e-5 relative (fp32 vs double exponentials),
 * the soft-capped logits written back within fp32 rounding.  Output
 * records poisoned before, guard bytes after.  Exit 77 where there is no
 * GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/ref-ops.h"
#include "lib/sampler.h"
#include "tests/harness.h"

#define GUARD_BYTES 512
#define GUARD_BYTE 0x3c

static uint64_t rng = 0xda3e39cb94b95bdbull;

static uint64_t next(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 16;
}

static float uniform(void)
{
    return (float)(next() & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void *upload(const void *h, size_t bytes, struct dg_error *err)
{
    void *d = NULL;
    if (dg_cuda_alloc(&d, bytes, 0, err) < 0)
        return NULL;
    if (dg_cuda_upload(d, h, bytes, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

static double rel(double a, double b)
{
    return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1.0);
}

static int stats_case(int64_t rows, int64_t n, int64_t v0, float cap, int filter, int with_nan)
{
    const size_t cells = (size_t)(rows * n);
    struct dg_error err = {0};
    float *z = malloc(cells * 4), *zc = malloc(cells * 4), *zg = malloc(cells * 4);
    float *T = malloc((size_t)rows * 4), *tau = malloc((size_t)rows * 4);
    struct dg_rand_site *sites = malloc((size_t)rows * sizeof *sites);
    struct dg_row_stats *ref = malloc((size_t)rows * sizeof *ref);
    unsigned char *got = malloc((size_t)rows * sizeof(struct dg_row_stats) + GUARD_BYTES);
    void *dz, *dT, *dtau, *dsites, *dout = NULL, *scratch = NULL;
    double worst_s = 0, worst_z = 0;
    int samples_equal = 0;

    CHECK(z && zc && zg && T && tau && sites && ref && got);
    for (size_t i = 0; i < cells; i++)
        z[i] = uniform() * 40.0f; /* past the soft-cap's knee */
    if (with_nan)
        for (int64_t r = 0; r < rows; r++)
            z[(size_t)r * n + (size_t)(next() % (uint64_t)n)] = NAN;
    for (int64_t r = 0; r < rows; r++) {
        T[r] = 0.5f + (uniform() + 1.0f) * 0.5f;
        sites[r] = (struct dg_rand_site){next(), (uint32_t)r, (uint32_t)(r % 7),
                                         (uint32_t)(r * 3)};
    }
    memcpy(zc, z, cells * 4);
    dg_ref_softcap(zc, (int64_t)cells, cap);
    for (int64_t r = 0; r < rows; r++) {
        /* keep all; or the ids within 2 of the row's top (a top-k/top-p
         * threshold), or, for every fifth row, none */
        float top = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            if (zc[(size_t)r * n + i] > top)
                top = zc[(size_t)r * n + i];
        tau[r] = !filter ? -INFINITY : r % 5 == 4 ? top + 1.0f : top - 2.0f;
        dg_row_stats_slice(zc + (size_t)r * n, v0, n, T[r], tau[r], &sites[r], &ref[r]);
    }

    dz = upload(z, cells * 4, &err);
    dT = upload(T, (size_t)rows * 4, &err);
    dtau = upload(tau, (size_t)rows * 4, &err);
    dsites = upload(sites, (size_t)rows * sizeof *sites, &err);
    CHECKF(dz && dT && dtau && dsites, "%s", err.msg);
    CHECK_OK(dg_cuda_alloc(&scratch, dg_cuda_row_stats_scratch(rows, n), 0, &err), &err);
    CHECK_OK(dg_cuda_alloc(&dout, (size_t)rows * sizeof(struct dg_row_stats) + GUARD_BYTES, 0,
                           &err),
             &err);
    memset(got, GUARD_BYTE, (size_t)rows * sizeof(struct dg_row_stats) + GUARD_BYTES);
    memset(got, 0xff, (size_t)rows * sizeof(struct dg_row_stats)); /* poison */
    CHECK_OK(dg_cuda_upload(dout, got, (size_t)rows * sizeof(struct dg_row_stats) + GUARD_BYTES,
                            0, &err),
             &err);
    CHECK_OK(dg_cuda_row_stats(dout, dz, rows, n, v0, cap, dT, dtau, dsites, scratch, NULL, 0,
                               &err),
             &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(got, dout, (size_t)rows * sizeof(struct dg_row_stats) + GUARD_BYTES,
                              0, &err),
             &err);
    CHECK_OK(dg_cuda_download(zg, dz, cells * 4, 0, &err), &err);
    for (size_t i = 0; i < GUARD_BYTES; i++)
        CHECKF(got[(size_t)rows * sizeof(struct dg_row_stats) + i] == GUARD_BYTE,
               "guard byte %zu changed", i);
    for (size_t i = 0; i < cells; i++)
        if (!isnan(zc[i])) {
            const double d = rel(zg[i], zc[i]);
            worst_z = d > worst_z ? d : worst_z;
        }
    for (int64_t r = 0; r < rows; r++) {
        struct dg_row_stats g;
        memcpy(&g, got + (size_t)r * sizeof g, sizeof g);
        CHECKF(g.argmax == ref[r].argmax, "row %lld: argmax %d, reference %d", (long long)r,
               g.argmax, ref[r].argmax);
        CHECKF(g.nonfinite == ref[r].nonfinite, "row %lld: %lld non-finite, reference %lld",
               (long long)r, (long long)g.nonfinite, (long long)ref[r].nonfinite);
        if (ref[r].argmax < 0) { /* nothing kept */
            CHECK(g.sample < 0 && g.max == -INFINITY && g.sum == 0);
            continue;
        }
        CHECKF(rel(g.max, ref[r].max) <= 1e-6, "row %lld: max %g vs %g", (long long)r, g.max,
               ref[r].max);
        CHECKF(rel(g.sum, ref[r].sum) <= 1e-5 && fabs(g.dev - ref[r].dev) <= 1e-5 * (fabs(ref[r].dev) + ref[r].sum),
               "row %lld: S %g vs %g, D %g vs %g", (long long)r, g.sum, ref[r].sum, g.dev,
               ref[r].dev);
        worst_s = rel(g.sum, ref[r].sum) > worst_s ? rel(g.sum, ref[r].sum) : worst_s;
        CHECKF(g.sample == ref[r].sample, "row %lld: sample %d (%.9g), reference %d (%.9g)",
               (long long)r, g.sample, g.sample_val, ref[r].sample, ref[r].sample_val);
        samples_equal++;
        {
            const double h = dg_row_entropy(&g), hr = dg_row_entropy(&ref[r]);
            CHECKF(fabs(h - hr) <= 1e-4 * (1 + fabs(hr)), "row %lld: entropy %g vs %g",
                   (long long)r, h, hr);
        }
    }
    printf("# row_stats %lld rows x %lld ids from %lld, cap %g%s%s: argmax and %d samples equal, "
           "S within %.1e, soft-capped logits within %.1e\n",
           (long long)rows, (long long)n, (long long)v0, cap, filter ? ", filtered" : "",
           with_nan ? ", NaNs" : "", samples_equal, worst_s, worst_z);
    dg_cuda_free(dz);
    dg_cuda_free(dT);
    dg_cuda_free(dtau);
    dg_cuda_free(dsites);
    dg_cuda_free(dout);
    dg_cuda_free(scratch);
    free(z);
    free(zc);
    free(zg);
    free(T);
    free(tau);
    free(sites);
    free(ref);
    free(got);
    return 0;
}

static int row_stats(void)
{
    if (stats_case(4, 1000, 0, 30.0f, 0, 0) || stats_case(16, 65536, 131072, 30.0f, 0, 1) ||
        stats_case(33, 20000, 7, 30.0f, 1, 0) || stats_case(3, 8193, 0, 0.0f, 0, 1) ||
        stats_case(64, 4096, 262144 - 4096, 30.0f, 1, 1))
        return 1;
    return 0;
}

static int refusals(void)
{
    struct dg_error err = {0};
    CHECK(dg_cuda_row_stats(NULL, NULL, 2, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, &err) ==
          -DG_E_INVAL);
    CHECK(dg_cuda_row_stats(NULL, NULL, 0, 10, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, &err) == 0);
    return 0;
}

int main(void)
{
    struct dg_error err = {0};
    int n = 0;
    if (dg_gpu_count(&n, &err) < 0 || n < 1) {
        printf("skip t-kernels-sampler: no GPU here%s%s\n", err.msg[0] ? ": " : "", err.msg);
        return 77;
    }
    if (dg_cuda_use(0, &err) < 0) {
        printf("not ok t-kernels-sampler/setup: %s\n", err.msg);
        return 1;
    }
    TEST_CASE(row_stats);
    TEST_CASE(refusals);
    return test_finish();
}
