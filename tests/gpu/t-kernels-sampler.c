/*
 * Description: the sampler's statistics kernel (soft-cap, temperature,
 * top-k/top-p threshold, max, sum of exponentials, entropy term, argmax,
 * Philox Gumbel-max sample, non-finite count) against the plain-C sampler
 * (dg_ref_softcap, then dg_row_stats_slice over each row) on fresh random
 * logits, spread wide (past the soft-cap's knee) and close together (the
 * Gumbel noise deciding the sample): rows of 1,000 to 262,144 ids (some
 * not multiples of the chunk),
 * vocabulary slices that start past 0, thresholds that keep all or part,
 * NaN logits.  Argmax and sample ids must be equal; max within fp32
 * rounding, S and D within 1e-5 relative (fp32 vs double exponentials),
 * the max equal to the bit to the CPU's over the GPU's own soft-capped
 * logits (the kernel's division by T is IEEE division), the soft-capped
 * logits written back within fp32 rounding (slices from
 * id 7 and 131,072: Philox blocks that straddle the chunks); the
 * probabilities (bf16) and the self-conditioning product P . E through
 * cuBLAS within the bf16 bound 1e-2 of dg_row_probs and a double product;
 * then the same with fp32 probabilities and embedding rows
 * (dg_cuda_row_probs_e, dg_blas_gemm_e): the probabilities within 1e-6 of
 * dg_row_probs over the GPU's soft-capped logits and statistics (1e-5 of
 * the CPU's whole chain), the product within 1e-5.  Outputs poisoned
 * (0xff bytes) before, guard bytes after; element types other than bf16
 * and fp32 refused.  The fold of slices' records into whole rows
 * (dg_cuda_row_stats_fold, as after an all-gather over 1 .. 8 ranks)
 * against dg_row_stats_combine: ids, values and max equal, S and D within
 * 1e-12.  Exit 77 where there is no GPU.
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

/* rows random rows of n logits uniform on [-spread, spread] (ids v0 ..
 * v0 + n - 1) through dg_cuda_row_stats against dg_row_stats_slice: see
 * the description above.  A small spread leaves the sample to the Gumbel
 * noise, where the kernel's screen of losing ids (gumbel_loses) is what
 * decides most ids. */
static int stats_case(int64_t rows, int64_t n, int64_t v0, float cap, int filter, int with_nan,
                      float spread)
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
        z[i] = gt_uniform() * spread; /* 40: past the soft-cap's knee */
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
        {
            /* over the GPU's own soft-capped logits the division by T is
             * the CPU's: the same max to the bit */
            struct dg_row_stats own;
            dg_row_stats_slice(zg + (size_t)r * n, v0, n, T[r], tau[r], NULL, &own);
            CHECKF(g.max == own.max && g.argmax == own.argmax,
                   "row %lld: max %.9g (id %d), the CPU's over the GPU's logits %.9g (id %d)",
                   (long long)r, g.max, g.argmax, own.max, own.argmax);
        }
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
    printf("# row_stats %lld rows x %lld ids from %lld, logits within %g, cap %g%s%s: argmax and "
           "%d samples equal, S within %.1e, soft-capped logits within %.1e\n",
           (long long)rows, (long long)n, (long long)v0, spread, cap, filter ? ", filtered" : "",
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

/* n_parts slices of rows random rows (some slices keeping no id, some
 * with a NaN), their records from dg_row_stats_slice, folded on the GPU
 * (dg_cuda_row_stats_fold) and on the host (dg_row_stats_combine in part
 * order): argmax, sample and their values, max and the non-finite counts
 * equal; S and D within 1e-12 relative (the device's exp against the
 * host's); the guard after the output untouched. */
static int fold_case(int64_t rows, int n_parts, int64_t n)
{
    const size_t rb = sizeof(struct dg_row_stats);
    struct dg_error err = {0};
    struct dg_row_stats *parts = malloc(rb * (size_t)(rows * n_parts)), *ref = malloc(rb * (size_t)rows);
    unsigned char *got = malloc(rb * (size_t)rows + GUARD_BYTES);
    float *z = malloc(sizeof(float) * (size_t)n);
    void *dparts, *dout = NULL;
    CHECK(parts && ref && got && z);
    for (int q = 0; q < n_parts; q++)
        for (int64_t r = 0; r < rows; r++) {
            const struct dg_rand_site site = {77, (uint32_t)r, 1, (uint32_t)r};
            float tau = (r + q) % 7 == 3 ? INFINITY : -INFINITY; /* none kept */
            for (int64_t i = 0; i < n; i++)
                z[i] = gt_uniform() * 20.0f + (float)q;
            if ((r + q) % 11 == 5)
                z[gt_next() % (uint64_t)n] = NAN;
            dg_row_stats_slice(z, (int64_t)q * n, n, 0.9f, tau, &site,
                               &parts[(int64_t)q * rows + r]);
        }
    for (int64_t r = 0; r < rows; r++) {
        ref[r] = parts[r];
        for (int q = 1; q < n_parts; q++)
            dg_row_stats_combine(&ref[r], &parts[(int64_t)q * rows + r]);
    }
    dparts = gt_upload(parts, rb * (size_t)(rows * n_parts), &err);
    dout = gt_out_alloc(rb * (size_t)rows, GUARD_BYTES, GUARD_BYTE, &err);
    CHECKF(dparts && dout, "%s", err.msg);
    CHECK_OK(dg_cuda_row_stats_fold(dout, dparts, rows, n_parts, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK_OK(dg_cuda_download(got, dout, rb * (size_t)rows + GUARD_BYTES, 0, &err), &err);
    for (size_t i = 0; i < GUARD_BYTES; i++)
        CHECKF(got[rb * (size_t)rows + i] == GUARD_BYTE, "fold: guard byte %zu changed", i);
    for (int64_t r = 0; r < rows; r++) {
        struct dg_row_stats g;
        memcpy(&g, got + (size_t)r * rb, rb);
        CHECKF(g.argmax == ref[r].argmax && g.sample == ref[r].sample &&
                   g.nonfinite == ref[r].nonfinite,
               "fold row %lld: argmax %d/%d sample %d/%d non-finite %lld/%lld", (long long)r,
               g.argmax, ref[r].argmax, g.sample, ref[r].sample, (long long)g.nonfinite,
               (long long)ref[r].nonfinite);
        if (ref[r].argmax < 0)
            continue;
        CHECK(g.max == ref[r].max && g.argmax_val == ref[r].argmax_val &&
              g.sample_val == ref[r].sample_val);
        CHECKF(rel(g.sum, ref[r].sum) <= 1e-12 &&
                   fabs(g.dev - ref[r].dev) <= 1e-12 * (fabs(ref[r].dev) + ref[r].sum),
               "fold row %lld: S %.17g vs %.17g, D %.17g vs %.17g", (long long)r, g.sum,
               ref[r].sum, g.dev, ref[r].dev);
    }
    printf("# row_stats_fold: %lld rows of %d parts of %lld ids: equal to the host's fold\n",
           (long long)rows, n_parts, (long long)n);
    dg_cuda_free(dparts);
    dg_cuda_free(dout);
    free(parts);
    free(ref);
    free(got);
    free(z);
    return 0;
}

static int row_stats_fold(void)
{
    struct dg_error err = {0};
    CHECK(fold_case(1, 1, 100) == 0 && fold_case(256, 2, 500) == 0 &&
          fold_case(300, 4, 64) == 0 && fold_case(33, 8, 10) == 0);
    CHECK_FAILS(dg_cuda_row_stats_fold(NULL, NULL, 4, 0, NULL, 0, &err), &err, DG_E_INVAL,
                "row_stats_fold");
    CHECK(dg_cuda_row_stats_fold(NULL, NULL, 0, 2, NULL, 0, &err) == 0);
    return 0;
}

static int row_stats(void)
{
    if (stats_case(4, 1000, 0, 30.0f, 0, 0, 40.0f) ||
        stats_case(16, 65536, 131072, 30.0f, 0, 1, 40.0f) ||
        stats_case(33, 20000, 7, 30.0f, 1, 0, 40.0f) || stats_case(3, 8193, 0, 0.0f, 0, 1, 40.0f) ||
        stats_case(64, 4096, 262144 - 4096, 30.0f, 1, 1, 40.0f) ||
        stats_case(2, 3 * 32768 + 1001, 3, 30.0f, 1, 1, 40.0f) ||
        /* the whole vocabulary, logits close together (as a random-weight
         * model's): the Gumbel noise picks, nearly every id screened */
        stats_case(8, 262144, 0, 30.0f, 0, 0, 0.5f) ||
        stats_case(8, 262144, 0, 30.0f, 0, 1, 4.0f) ||
        stats_case(5, 50001, 13, 0.0f, 1, 0, 2.0f))
        return 1;
    return 0;
}

/* Download bytes of d into h and check the guard bytes after them: the
 * first one changed, or -1 (-2 when the download failed, err set). */
static long out_fetch(void *h, const void *d, size_t bytes, struct dg_error *err)
{
    unsigned char guard[GUARD_BYTES];
    if (dg_cuda_download(h, d, bytes, 0, err) < 0 ||
        dg_cuda_download(guard, (const unsigned char *)d + bytes, GUARD_BYTES, 0, err) < 0)
        return -2;
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (guard[i] != GUARD_BYTE)
            return (long)i;
    return -1;
}

/* The self-conditioning product over a slice: statistics, probabilities
 * (element type e), then P . E through cuBLAS (E of type e), against
 * dg_row_probs and a double-precision product.  bf16: both within 1e-2 of
 * the CPU's chain (soft-cap, statistics, probabilities).  fp32: the
 * probabilities within 1e-6 of dg_row_probs over the GPU's own soft-capped
 * logits and statistics (what the kernel is given; the CPU's chain differs
 * from them by the soft-cap's tanhf rounding), within 1e-5 of the CPU's
 * chain, and the product (plain fp32 GEMM) within 1e-5 of the CPU's. */
static int soft_case(struct dg_blas *blas, enum dg_elt e, int64_t R, int64_t n, int64_t H)
{
    const float cap = 30.0f;
    const int f32 = e == DG_ELT_F32;
    const size_t es = (size_t)dg_elt_size(e);
    const char *tn = f32 ? "f32" : "bf16";
    struct dg_error err = {0};
    float *z = malloc((size_t)(R * n) * 4), *T = malloc((size_t)R * 4);
    float *tau = malloc((size_t)R * 4), *p = malloc((size_t)(R * n) * 4);
    float *ef = malloc((size_t)(n * H) * 4), *soft = malloc((size_t)(R * H) * 4);
    float *zg = malloc((size_t)(R * n) * 4), *pr = malloc((size_t)(R * n) * 4);
    uint16_t *eh = malloc((size_t)(n * H) * 2);
    unsigned char *pg = malloc((size_t)(R * n) * es);
    struct dg_row_stats *st = malloc((size_t)R * sizeof *st);
    struct dg_row_stats *stg = malloc((size_t)R * sizeof *stg);
    double *ref = calloc((size_t)(R * H), sizeof *ref), num = 0, den = 0, pn = 0, pd = 0;
    double qn = 0, qd = 0;
    void *dz, *dT, *dtau, *de, *dst = NULL, *scratch = NULL, *dp, *dsoft;
    long g;
    CHECK(z && T && tau && p && ef && soft && zg && pr && eh && pg && st && stg && ref);
    for (int64_t i = 0; i < R * n; i++)
        z[i] = gt_uniform() * 12.0f;
    for (int64_t i = 0; i < n * H; i++) {
        if (f32) {
            ef[i] = gt_uniform() * 0.05f;
        } else {
            eh[i] = dg_f32_to_bf16(gt_uniform() * 0.05f);
            ef[i] = dg_bf16_to_f32(eh[i]);
        }
    }
    for (int64_t r = 0; r < R; r++) {
        T[r] = 0.7f + 0.1f * (float)(r % 4);
        tau[r] = r % 3 == 2 ? 6.0f : -INFINITY;
    }
    dz = gt_upload(z, (size_t)(R * n) * 4, &err);
    dT = gt_upload(T, (size_t)R * 4, &err);
    dtau = gt_upload(tau, (size_t)R * 4, &err);
    de = f32 ? gt_upload(ef, (size_t)(n * H) * 4, &err) : gt_upload(eh, (size_t)(n * H) * 2, &err);
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
    dp = gt_out_alloc((size_t)(R * n) * es, GUARD_BYTES, GUARD_BYTE, &err);
    dsoft = gt_out_alloc((size_t)(R * H) * 4, GUARD_BYTES, GUARD_BYTE, &err);
    CHECKF(dp && dsoft, "%s", err.msg);
    CHECK_OK(dg_cuda_row_stats(dst, dz, R, n, 0, cap, dT, dtau, NULL, scratch, NULL, 0, &err),
             &err);
    if (f32) {
        CHECK_OK(dg_cuda_row_probs_e(DG_ELT_F32, dp, dz, R, n, dT, dtau, dst, NULL, 0, &err),
                 &err);
        CHECK_OK(dg_blas_gemm_e(blas, DG_ELT_F32, dsoft, 1, dp, R, de, 1, H, n, H, 1.0f, 0.0f,
                                &err),
                 &err);
    } else {
        CHECK_OK(dg_cuda_row_probs(dp, dz, R, n, dT, dtau, dst, NULL, 0, &err), &err);
        CHECK_OK(dg_blas_matmul(blas, dsoft, 1, dp, R, de, n, H, H, &err), &err);
    }
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    g = out_fetch(pg, dp, (size_t)(R * n) * es, &err);
    CHECKF(g == -1, "%s probabilities: %s%ld", tn, g == -2 ? err.msg : "guard byte ", g);
    g = out_fetch(soft, dsoft, (size_t)(R * H) * 4, &err);
    CHECKF(g == -1, "%s product: %s%ld", tn, g == -2 ? err.msg : "guard byte ", g);
    CHECK_OK(dg_cuda_download(zg, dz, (size_t)(R * n) * 4, 0, &err), &err);
    CHECK_OK(dg_cuda_download(stg, dst, (size_t)R * sizeof *stg, 0, &err), &err);
    /* the reference over the GPU's own soft-capped logits and statistics */
    for (int64_t r = 0; r < R; r++)
        dg_row_probs(zg + r * n, n, T[r], tau[r], &stg[r], pr + r * n);
    for (int64_t i = 0; i < R * n; i++) {
        float x;
        if (f32) {
            memcpy(&x, pg + (size_t)i * 4, 4);
        } else {
            uint16_t b;
            memcpy(&b, pg + (size_t)i * 2, 2);
            x = dg_bf16_to_f32(b);
        }
        CHECKF(!isnan(x), "%s probabilities: NaN at %lld", tn, (long long)i);
        if (f32) /* the ids kept: those of the GPU's own soft-capped logits */
            CHECKF((x == 0.0f) == (pr[i] == 0.0f) || pr[i] < 1e-30f,
                   "f32 probabilities: %g at %lld, reference %g", x, (long long)i, pr[i]);
        else
            CHECK((x == 0.0f) == (p[i] == 0.0f) || p[i] < 1e-30f);
        pn += ((double)x - p[i]) * ((double)x - p[i]);
        pd += (double)p[i] * p[i];
        qn += ((double)x - pr[i]) * ((double)x - pr[i]);
        qd += (double)pr[i] * pr[i];
    }
    for (int64_t i = 0; i < R * H; i++) {
        CHECK(!isnan(soft[i]));
        num += (soft[i] - ref[i]) * (soft[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (f32) {
        printf("# soft embedding f32 %lld rows x %lld ids x %lld: probabilities within %.2e "
               "(of the CPU's chain %.2e), P.E within %.2e\n", (long long)R, (long long)n,
               (long long)H, sqrt(qn / qd), sqrt(pn / pd), sqrt(num / den));
        CHECKF(sqrt(qn / qd) <= 1e-6 && sqrt(pn / pd) <= 1e-5 && sqrt(num / den) <= 1e-5,
               "f32 probs %.3e (chain %.3e), product %.3e", sqrt(qn / qd), sqrt(pn / pd),
               sqrt(num / den));
    } else {
        printf("# soft embedding %lld rows x %lld ids x %lld: probabilities within %.2e, P.E "
               "within %.2e\n", (long long)R, (long long)n, (long long)H, sqrt(pn / pd),
               sqrt(num / den));
        CHECKF(sqrt(pn / pd) <= 1e-2 && sqrt(num / den) <= 1e-2, "probs %.3e, product %.3e",
               sqrt(pn / pd), sqrt(num / den));
    }
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
    free(zg);
    free(pr);
    free(eh);
    free(pg);
    free(st);
    free(stg);
    free(ref);
    return 0;
}

static const struct {
    int64_t rows, n, H;
} soft_shapes[] = {{16, 5000, 256}, {1, 70000, 64}, {40, 3001, 2816}};

static int soft_embedding_e(enum dg_elt e)
{
    struct dg_blas *blas = NULL;
    struct dg_error err = {0};
    int rc = 0;
    CHECK_OK(dg_blas_create(0, NULL, &blas, &err), &err);
    for (size_t k = 0; k < sizeof soft_shapes / sizeof soft_shapes[0] && !rc; k++)
        rc = soft_case(blas, e, soft_shapes[k].rows, soft_shapes[k].n, soft_shapes[k].H);
    dg_blas_destroy(blas);
    return rc;
}

static int soft_embedding(void)
{
    return soft_embedding_e(DG_ELT_BF16);
}

/* The same with fp32 probabilities and embedding rows (fresh inputs). */
static int soft_embedding_f32(void)
{
    return soft_embedding_e(DG_ELT_F32);
}

static int refusals(void)
{
    struct dg_error err = {0};
    CHECK(dg_cuda_row_stats(NULL, NULL, 2, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, &err) ==
          -DG_E_INVAL);
    CHECK(dg_cuda_row_stats(NULL, NULL, 0, 10, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, &err) == 0);
    CHECK(dg_cuda_row_probs(NULL, NULL, 2, 0, NULL, NULL, NULL, NULL, 0, &err) == -DG_E_INVAL);
    CHECK(dg_cuda_row_probs_e(DG_ELT_F32, NULL, NULL, 2, 0, NULL, NULL, NULL, NULL, 0, &err) ==
          -DG_E_INVAL);
    CHECK(dg_cuda_row_probs_e(DG_ELT_F32, NULL, NULL, 0, 10, NULL, NULL, NULL, NULL, 0, &err) ==
          0);
    CHECK_FAILS(dg_cuda_row_probs_e((enum dg_elt)7, NULL, NULL, 2, 10, NULL, NULL, NULL, NULL, 0,
                                    &err),
                &err, DG_E_INVAL, "element type 7");
    CHECK_FAILS(dg_cuda_row_probs_e((enum dg_elt)7, NULL, NULL, 0, 10, NULL, NULL, NULL, NULL, 0,
                                    &err),
                &err, DG_E_INVAL, "element type 7"); /* even with nothing to do */
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-sampler");
    if (rc)
        return rc;
    gt_seed(0xda3e39cb94b95bdbull);
    TEST_CASE(row_stats);
    TEST_CASE(row_stats_fold);
    TEST_CASE(soft_embedding);
    TEST_CASE(soft_embedding_f32);
    TEST_CASE(refusals);
    return test_finish();
}
