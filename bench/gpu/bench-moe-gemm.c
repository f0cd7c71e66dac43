/*
 * bench-moe-gemm - the experts' grouped GEMMs alone, at the 26B-A4B's
 * shapes (128 experts; gate/up [1408 x 2816], down [2816 x 704]), against
 * the copy bandwidth measured in the same run: the FP8 kernel
 * (kernels/fp8-gemm.h) and the bf16 grouped GEMM (kernels/moe-gemm.h),
 * each in each of its configurations (K step, pipeline depth), at the
 * rows a denoising step routes to them.
 *
 * usage: bench-moe-gemm [--reps N] [BATCHES...]   (defaults 20; 1 4 16)
 *
 * A batch of B canvases is 256 B tokens, each routed to 8 distinct
 * experts drawn uniformly (seeded), so expert j gets counts[j] rows, in
 * one contiguous run per expert as the MoE lays them out.  Weights and
 * activations are random (E4M3 bytes that are finite numbers; bf16 in
 * [-1, 1)).  Each product runs once unrecorded, then REPS times, each
 * timed on the device (kernels/prof.h events around it alone); the table
 * gives medians.  floor = the weight bytes / the copy bandwidth (the
 * device METHOD's roofline: each weight byte read once); x floor = the
 * time over it.  Every configuration's output is compared with its
 * kernel's configuration 0's: the sums run in the same order, so they
 * must be equal to the bit ("same" column; the wgmma configurations add
 * in the tensor cores' order, so they are not compared: t-kernels-moe and
 * t-kernels-fp8 check them against their references).  "(default)" marks
 * the FP8 configuration the public calls pick for the shape.  Not a test: it
 * prints a table and asserts nothing about speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench-time.h"
#include "bench/gpu/bench-board.h"
#include "bench/gpu/bench-util.h"
#include "kernels/ceilings.h"
#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/moe-gemm.h"
#include "kernels/prof.h"

#define N_EXP 128
#define TOPK 8
#define HID 2816
#define INTER 704
#define MAX_REPS 1000

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* counts[j]: the rows expert j gets from T tokens routed to TOPK distinct
 * experts each, uniformly */
static void route(int32_t *counts, int32_t *offsets, int64_t T)
{
    int32_t acc = 0;
    memset(counts, 0, sizeof(int32_t) * N_EXP);
    for (int64_t t = 0; t < T; t++) {
        int32_t picked[TOPK];
        bench_distinct_ids(&rng, picked, TOPK, N_EXP);
        for (int k = 0; k < TOPK; k++)
            counts[picked[k]]++;
    }
    for (int j = 0; j < N_EXP; j++) {
        offsets[j] = acc;
        acc += counts[j];
    }
}

struct operands {
    uint8_t *qa, *qw;            /* device: rows x K, N_EXP x N x K */
    float *sa, *sw;
    uint16_t *xa, *xw;           /* device bf16: the same shapes */
    int32_t *offsets, *counts;   /* device */
    void *y, *y0;                /* device fp32 rows x N: the output, configuration 0's */
};

/* one product: the FP8 kernel (fp8) or the bf16 grouped GEMM in
 * configuration config */
struct product {
    const struct operands *o;
    int fp8, config, hint;
    int64_t rows, N, K;
};

static int product(void *ctx, struct dg_error *err)
{
    const struct product *p = ctx;
    const struct operands *o = p->o;
    return p->fp8 ? dg_cuda_fp8_gemm_config(p->config, o->y, 1, 0, o->qa, o->sa, o->qw, o->sw,
                                            o->offsets, o->counts, N_EXP, p->rows, p->N, p->K,
                                            p->hint, NULL, 0, err)
                  : dg_cuda_grouped_gemm_config(p->config, o->y, 1, o->xa, o->xw, o->offsets,
                                                o->counts, N_EXP, p->N, p->K, p->hint, NULL, 0,
                                                err);
}

/* Whether the device outputs a and b (rows x N fp32) are equal to the bit. */
static int same_output(const void *a, const void *b, size_t bytes, struct dg_error *err)
{
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    int same = 0;
    if (ha && hb && dg_cuda_download(ha, a, bytes, 0, err) == 0 &&
        dg_cuda_download(hb, b, bytes, 0, err) == 0)
        same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

int main(int argc, char **argv)
{
    int batches[16], nb = 0, reps = 20;
    struct dg_error err = {0};
    struct dg_ceilings ce;
    struct dg_prof *prof = NULL;
    static double t[MAX_REPS];
    const int64_t shapes[2][2] = {{2 * INTER, HID}, {HID, INTER}}; /* N, K */
    const char *names[2] = {"gate/up", "down"};
    const int64_t max_rows = 256 * 64 * TOPK, max_nk = 2 * INTER * (int64_t)HID;
    struct operands o = {0};
    uint8_t *h8 = NULL;
    uint16_t *h16 = NULL;
    float *hf = NULL;
    int32_t counts[N_EXP], offsets[N_EXP];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (argv[i][0] != '-' && nb < 16 && atoi(argv[i]) >= 1 && atoi(argv[i]) <= 64) {
            batches[nb++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: bench-moe-gemm [--reps N] [BATCHES...] (batches 1-64)\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench-moe-gemm: --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    if (!nb) {
        batches[nb++] = 1;
        batches[nb++] = 4;
        batches[nb++] = 16;
    }
    if (dg_cuda_use(0, &err) < 0 || bench_print_board(0, &err) < 0 ||
        dg_measure_ceilings(0, &ce, &err) < 0 ||
        dg_prof_create(&prof, 8, 0, &err) < 0)
        goto fail;
    h8 = malloc((size_t)(N_EXP * max_nk));
    h16 = malloc(sizeof(uint16_t) * (size_t)(N_EXP * max_nk));
    hf = malloc(sizeof(float) * (size_t)(N_EXP * HID > max_rows ? N_EXP * HID : max_rows));
    if (!h8 || !h16 || !hf) {
        fprintf(stderr, "bench-moe-gemm: out of host memory\n");
        return 1;
    }
    if (dg_cuda_alloc((void **)&o.qw, (size_t)(N_EXP * max_nk), 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.xw, 2 * (size_t)(N_EXP * max_nk), 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.sw, sizeof(float) * N_EXP * HID, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.qa, (size_t)(max_rows * HID), 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.xa, 2 * (size_t)(max_rows * HID), 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.sa, sizeof(float) * (size_t)max_rows, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.offsets, sizeof offsets, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.counts, sizeof counts, 0, &err) < 0 ||
        dg_cuda_alloc(&o.y, sizeof(float) * (size_t)(max_rows * HID), 0, &err) < 0 ||
        dg_cuda_alloc(&o.y0, sizeof(float) * (size_t)(max_rows * HID), 0, &err) < 0)
        goto fail;
    /* random operands, made once at the largest shapes (each product reads
     * its prefix) */
    bench_fill_e4m3(&rng, h8, (size_t)(N_EXP * max_nk));
    for (int64_t i = 0; i < N_EXP * max_nk; i++)
        /* bf16 of |x| in [1, 2), either sign */
        h16[i] = (uint16_t)(0x3f80u ^ (uint16_t)(bench_rand_id(&rng, 0x10000) & 0x807f));
    if (dg_cuda_upload(o.qw, h8, (size_t)(N_EXP * max_nk), 0, &err) < 0 ||
        dg_cuda_upload(o.xw, h16, 2 * (size_t)(N_EXP * max_nk), 0, &err) < 0 ||
        dg_cuda_upload(o.qa, h8, (size_t)(max_rows * HID), 0, &err) < 0 ||
        dg_cuda_upload(o.xa, h16, 2 * (size_t)(max_rows * HID), 0, &err) < 0)
        goto fail;
    for (int64_t i = 0; i < (N_EXP * HID > max_rows ? N_EXP * HID : max_rows); i++)
        hf[i] = 1e-3f * (float)(1 + bench_rand_id(&rng, 1000));
    if (dg_cuda_upload(o.sw, hf, sizeof(float) * N_EXP * HID, 0, &err) < 0 ||
        dg_cuda_upload(o.sa, hf, sizeof(float) * (size_t)max_rows, 0, &err) < 0)
        goto fail;

    printf("ceilings, GPU 0: device copy %.0f GB/s (read + write), L2 read %.0f GB/s; %d "
           "experts, top %d, hidden %d, expert width %d; %d timed repeats a row, medians\n\n",
           ce.copy_gbps, ce.l2_read_gbps, N_EXP, TOPK, HID, INTER, reps);
    printf("| B | rows | rows an expert (min-max) | GEMM | kernel | ms | floor ms | x floor | "
           "GB/s | same |\n|---:|---:|---|---|---|---:|---:|---:|---:|---|\n");
    for (int bi = 0; bi < nb; bi++) {
        const int64_t T = 256 * (int64_t)batches[bi], rows = T * TOPK;
        const int hint = (int)((rows + N_EXP - 1) / N_EXP);
        int32_t lo = 1 << 30, hi = 0;
        route(counts, offsets, T);
        for (int j = 0; j < N_EXP; j++) {
            lo = counts[j] < lo ? counts[j] : lo;
            hi = counts[j] > hi ? counts[j] : hi;
        }
        if (dg_cuda_upload(o.counts, counts, sizeof counts, 0, &err) < 0 ||
            dg_cuda_upload(o.offsets, offsets, sizeof offsets, 0, &err) < 0)
            goto fail;
        for (int s = 0; s < 2; s++) {
            const int64_t N = shapes[s][0], K = shapes[s][1];
            const size_t ybytes = sizeof(float) * (size_t)(rows * N);
            const int n8 = dg_cuda_fp8_gemm_configs();
            for (int k = 0; k < n8 + dg_cuda_grouped_gemm_configs(); k++) {
                const int fp8 = k < n8, c = fp8 ? k : k - n8;
                const double bytes = (double)N_EXP * (double)(N * K) * (fp8 ? 1.0 : 2.0);
                const double floor_ms = bytes / (ce.copy_gbps * 1e9) * 1e3;
                const struct product pr = {&o, fp8, c, hint, rows, N, K};
                double ms;
                int same = -1;
                if (dg_cuda_memset(o.y, 0xff, ybytes, 0, &err) < 0)
                    goto fail;
                ms = bench_time_device(prof, reps, t, product, (void *)&pr, &err);
                if (ms < 0)
                    goto fail;
                if (c == 0 && dg_cuda_copy_async(o.y0, o.y, ybytes, NULL, 0, &err) < 0)
                    goto fail;
                if (c > 0 && (fp8 ? dg_cuda_fp8_gemm_config_exact(c)
                                  : dg_cuda_grouped_gemm_config_exact(c)))
                    same = same_output(o.y, o.y0, ybytes, &err);
                printf("| %d | %lld | %.1f (%d-%d) | %s [%lld x %lld] | %s, %s%s | %.3f | %.3f | "
                       "%.2f | %.0f | %s |\n",
                       batches[bi], (long long)rows, (double)rows / N_EXP, lo, hi, names[s],
                       (long long)N, (long long)K,
                       fp8 ? "FP8" : "bf16",
                       fp8 ? dg_cuda_fp8_gemm_config_name(c) : dg_cuda_grouped_gemm_config_name(c),
                       fp8 && c == dg_cuda_fp8_gemm_pick(0, hint, N, K) ? " (default)" : "",
                       ms,
                       floor_ms, ms / floor_ms, bytes / (ms * 1e-3) / 1e9,
                       same < 0 ? "" : same ? "yes" : "NO");
            }
        }
    }
    dg_prof_destroy(prof);
    return 0;
fail:
    fprintf(stderr, "bench-moe-gemm: %s\n", err.msg);
    return 1;
}
