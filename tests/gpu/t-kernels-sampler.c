/*
 * Description: the sampler's statistics kernel (soft-cap, temperature,
 * top-k/top-p threshold, max, sum of exponentials, entropy term, argmax,
 * Philox Gumbel-max sample, non-finite count) against the plain-C sampler
 * (dg_ref_softcap, then dg_row_stats_slice over each row) on fresh random
 * logits: rows of 1,000 to 65,536 ids (not multiples of the chunk),
 * vocabulary slices that start past 0, thresholds that keep all or part,
 * NaN logits.  Argmax and sample ids must be equal; max within fp32
 * rounding, S and D within 1e-5 relative (fp32 vs double exponentials),
 * the soft-capped logits written back within fp32 rounding; the
 * probabilities (bf16) and the self-conditioning product P . E through
 * cuBLAS within the bf16 bound 1e-2 of dg_row_probs and a double product.
 * Output records poisoned before, guard bytes after.  Exit 77 where there
 * is no GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "lib/sampler.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD_BYTES 512
#define GUARD_BYTE 0x3c

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
        z[i] = gt_uniform() * 40.0f; /* past the soft-cap's knee */
    if (with_nan)
        for (int64_t r = 0; r < rows; r++)
            z[(size_t)r * n + (size_t)(gt_next() % (uint64_t)n)] = NAN;
    for (int64_t r = 0; r < rows; r++) {
        T[r] = 0.5f + (gt_uniform() + 1.0f) * 0.5f;
        sites[r] = (struct dg_rand_site){gt_next(), (uint32_t)r, (uint32_t)(r % 7),
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

    dz = gt_upload(z, cells * 4, &err);
    dT = gt_upload(T, (size_t)rows * 4, &err);
    dtau = gt_upload(tau, (size_t)rows * 4, &err);
    dsites = gt_upload(sites, (size_t)rows * sizeof *sites, &err);
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

/* The self-conditioning product over a slice: statistics, probabilities
 * (bf16), then P . E through cuBLAS, against dg_row_probs and a
 * double-precision product. */
static int soft_embedding(void)
{
    static const struct {
        int64_t rows, n, H;
    } shapes[] = {{16, 5000, 256}, {1, 70000, 64}, {40, 3001, 2816}};
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int64_t R = shapes[k].rows, n = shapes[k].n, H = shapes[k].H;
        const float cap = 30.0f;
        float *z = malloc((size_t)(R * n) * 4), *T = malloc((size_t)R * 4);
        float *tau = malloc((size_t)R * 4), *p = malloc((size_t)(R * n) * 4);
        float *ef = malloc((size_t)(n * H) * 4), *soft = malloc((size_t)(R * H) * 4);
        uint16_t *eh = malloc((size_t)(n * H) * 2), *pg = malloc((size_t)(R * n) * 2);
        struct dg_row_stats *st = malloc((size_t)R * sizeof *st);
        double *ref = calloc((size_t)(R * H), sizeof *ref), num = 0, den = 0, pn = 0, pd = 0;
        void *dz, *dT, *dtau, *de, *dst = NULL, *scratch = NULL, *dp = NULL, *dsoft = NULL;
        CHECK(z && T && tau && p && ef && soft && eh && pg && st && ref);
        for (int64_t i = 0; i < R * n; i++)
            z[i] = gt_uniform() * 12.0f;
        for (int64_t i = 0; i < n * H; i++) {
            eh[i] = dg_f32_to_bf16(gt_uniform() * 0.05f);
            ef[i] = dg_bf16_to_f32(eh[i]);
        }
        for (int64_t r = 0; r < R; r++) {
            T[r] = 0.7f + 0.1f * (float)(r % 4);
            tau[r] = r % 3 == 2 ? 6.0f : -INFINITY;
        }
        dz = gt_upload(z, (size_t)(R * n) * 4, &err);
        dT = gt_upload(T, (size_t)R * 4, &err);
        dtau = gt_upload(tau, (size_t)R * 4, &err);
        de = gt_upload(eh, (size_t)(n * H) * 2, &err);
        CHECKF(dz && dT && dtau && de, "%s", err.msg);
        /* CPU: soft-cap, statistics, probabilities, product */
        dg_ref_softcap(z, R * n, cap);
        for (int64_t r = 0; r < R; r++) {
            dg_row_stats_slice(z + r * n, 0, n, T[r], tau[r], NULL, &st[r]);
            dg_row_probs(z + r * n, n, T[r], tau[r], &st[r], p + r * n);
            for (int64_t v = 0; v < n; v++)
                if (p[r * n + v] != 0.0f)
                    for (int64_t h = 0; h < H; h++)
                        ref[r * H + h] += (double)p[r * n + v] * ef[v * H + h];
        }
        /* GPU */
        CHECK_OK(dg_cuda_alloc(&scratch, dg_cuda_row_stats_scratch(R, n), 0, &err), &err);
        CHECK_OK(dg_cuda_alloc(&dst, (size_t)R * sizeof *st, 0, &err), &err);
        CHECK_OK(dg_cuda_alloc(&dp, (size_t)(R * n) * 2, 0, &err), &err);
        CHECK_OK(dg_cuda_alloc(&dsoft, (size_t)(R * H) * 4, 0, &err), &err);
        CHECK_OK(dg_cuda_memset(dsoft, 0xff, (size_t)(R * H) * 4, 0, &err), &err);
        CHECK_OK(dg_cuda_row_stats(dst, dz, R, n, 0, cap, dT, dtau, NULL, scratch, NULL, 0, &err),
                 &err);
        CHECK_OK(dg_cuda_row_probs(dp, dz, R, n, dT, dtau, dst, NULL, 0, &err), &err);
        CHECK_OK(dg_blas_matmul(blas, dsoft, 1, dp, R, de, n, H, H, &err), &err);
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        CHECK_OK(dg_cuda_download(pg, dp, (size_t)(R * n) * 2, 0, &err), &err);
        CHECK_OK(dg_cuda_download(soft, dsoft, (size_t)(R * H) * 4, 0, &err), &err);
        for (int64_t i = 0; i < R * n; i++) {
            const double d = (double)dg_bf16_to_f32(pg[i]) - p[i];
            CHECK(!isnan(dg_bf16_to_f32(pg[i])));
            CHECK((pg[i] == 0) == (p[i] == 0.0f) || p[i] < 1e-30f);
            pn += d * d;
            pd += (double)p[i] * p[i];
        }
        for (int64_t i = 0; i < R * H; i++) {
            CHECK(!isnan(soft[i]));
            num += (soft[i] - ref[i]) * (soft[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        printf("# soft embedding %lld rows x %lld ids x %lld: probabilities within %.2e, P.E "
               "within %.2e\n", (long long)R, (long long)n, (long long)H, sqrt(pn / pd),
               sqrt(num / den));
        CHECKF(sqrt(pn / pd) <= 1e-2 && sqrt(num / den) <= 1e-2, "probs %.3e, product %.3e",
               sqrt(pn / pd), sqrt(num / den));
        dg_cuda_free(dz);
        dg_cuda_free(dT);
        dg_cuda_free(dtau);
        dg_cuda_free(de);
        dg_cuda_free(dst);
        dg_cuda_free(scratch);
        dg_cuda_free(dp);
        dg_cuda_free(dsoft);
        free(z);
        free(T);
        free(tau);
        free(p);
        free(ef);
        free(soft);
        free(eh);
        free(pg);
        free(st);
        free(ref);
    }
    dg_blas_destroy(blas);
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
    const int rc = gt_setup("t-kernels-sampler");
    if (rc)
        return rc;
    gt_seed(0xda3e39cb94b95bdbull);
    TEST_CASE(row_stats);
    TEST_CASE(soft_embedding);
    TEST_CASE(refusals);
    return test_finish();
}
