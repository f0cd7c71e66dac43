/*
 * bench-moe - the experts' stage whole (kernels/ops.h's dg_cuda_moe_e and
 * dg_cuda_moe_q: routing, the gathered rows, both products, the sum) on
 * one GPU, at the 26B-A4B's shapes (128 experts, top-8, hidden 2816,
 * expert width 704), for a rank holding all of the experts (TP=1) and for
 * a rank holding a half or a quarter of them (TP=2 and TP=4 with the
 * experts split across ranks: what each rank's GPU runs), each such share
 * planned two ways (lib/moe-plan.h): for its share of the picks (n_all
 * 128, as the engine calls it) and for all of them (n_all = n_exp, the
 * plan before the share was known), so the two stand side by side in one
 * run.
 *
 * usage: bench-moe [--reps N] [BATCHES...]   (defaults 10; 1 4 8 16 32)
 *
 * A batch of B canvases is 256 B tokens, each routed to 8 distinct
 * experts of the 128 drawn uniformly (seeded; the same routing for every
 * row of a batch); the rank holds experts 0 .. n_exp - 1 and sees the
 * picks of those.  Weights and activations are random (bf16 in [-1, 1)
 * scaled, E4M3 bytes that are finite numbers with scales near 1e-3).
 * Each call runs once unrecorded, then REPS times, each timed on the
 * device (kernels/prof.h events around it); the table gives medians and
 * the floor: the rank's expert weights the routing touches, read once at
 * the copy bandwidth measured first.  Not a test: it prints a table and
 * asserts nothing about speed (t-kernels-moe checks the outputs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench-time.h"
#include "bench/gpu/bench-board.h"
#include "bench/gpu/bench-util.h"
#include "kernels/ceilings.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "kernels/prof.h"
#include "lib/moe-plan.h"

#define N_EXP 128
#define TOPK 8
#define HID 2816
#define INTER 704
#define MAX_B 64
#define MAX_REPS 1000

static uint64_t rng = 0x2545f4914f6cdd1dull;

struct operands {
    uint16_t *x, *wgu, *wdn; /* device bf16 */
    uint8_t *qgu, *qdn;      /* device E4M3 */
    float *sgu, *sdn, *w;    /* device fp32 */
    int32_t *idx;            /* device */
    float *out;
    void *scratch;
};

/* idx [T, TOPK]: distinct experts of N_EXP a token, uniform; counts of
 * the first n_exp experts' picks into touched (how many have any) */
static void route(int32_t *idx, int64_t T, int n_exp, int *touched)
{
    static int32_t seen[N_EXP];
    memset(seen, 0, sizeof seen);
    for (int64_t t = 0; t < T; t++) {
        bench_distinct_ids(&rng, idx + t * TOPK, TOPK, N_EXP);
        for (int k = 0; k < TOPK; k++)
            seen[idx[t * TOPK + k]] = 1;
    }
    *touched = 0;
    for (int j = 0; j < n_exp; j++)
        *touched += seen[j];
}

/* one call of the experts' stage: fp8 or bf16, the rank's n_exp of n_all */
struct moe_call {
    struct dg_blas *blas;
    const struct operands *o;
    int fp8, n_exp, n_all;
    int64_t T;
};

static int moe_call(void *ctx, struct dg_error *err)
{
    const struct moe_call *c = ctx;
    const struct operands *o = c->o;
    return c->fp8 ? dg_cuda_moe_q(c->blas, o->out, o->x, c->T, HID, o->idx, o->w, TOPK, 0,
                                  c->n_exp, c->n_all, INTER, o->qgu, o->sgu, o->qdn, o->sdn, 0,
                                  o->scratch, NULL, err)
                  : dg_cuda_moe_e(c->blas, DG_ELT_BF16, o->out, o->x, c->T, HID, o->idx, o->w,
                                  TOPK, 0, c->n_exp, c->n_all, INTER, o->wgu, o->wdn, 0,
                                  o->scratch, NULL, err);
}

/* n bf16 values of |v| in [2^-5, 2^-4), either sign */
static void fill_bf16(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint16_t)(0x3d00u ^ (uint16_t)(bench_rand_id(&rng, 0x10000) & 0x807f));
}

int main(int argc, char **argv)
{
    static const int shares[] = {1, 2, 4};
    int batches[16], nb = 0, reps = 10, maxb = 1;
    struct dg_error err = {0};
    struct dg_ceilings ce;
    struct dg_prof *prof = NULL;
    struct dg_blas *blas = NULL;
    static double t[MAX_REPS];
    struct operands o = {0};
    const size_t ngu = (size_t)N_EXP * 2 * INTER * HID, ndn = (size_t)N_EXP * HID * INTER;
    size_t sbytes = 0, hbytes;
    unsigned char *h = NULL;
    int32_t *idx = NULL;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (argv[i][0] != '-' && nb < 16 && atoi(argv[i]) >= 1 &&
                   atoi(argv[i]) <= MAX_B) {
            batches[nb++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: bench-moe [--reps N] [BATCHES...] (batches 1-%d)\n", MAX_B);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench-moe: --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    if (!nb) {
        static const int def[] = {1, 4, 8, 16, 32};
        for (nb = 0; nb < 5; nb++)
            batches[nb] = def[nb];
    }
    for (int i = 0; i < nb; i++)
        maxb = batches[i] > maxb ? batches[i] : maxb;
    /* the largest scratch any configuration asks (the bound counts every
     * pick, so the full share planned for all picks is the largest) */
    for (size_t s = 0; s < sizeof shares / sizeof shares[0]; s++) {
        const int n_exp = N_EXP / shares[s];
        const size_t a = dg_cuda_moe_scratch_q(256 * (int64_t)maxb, TOPK, HID, INTER, n_exp, n_exp),
                     b = dg_cuda_moe_scratch_e(DG_ELT_BF16, 256 * (int64_t)maxb, TOPK, HID, INTER,
                                               n_exp, n_exp);
        sbytes = a > sbytes ? a : sbytes;
        sbytes = b > sbytes ? b : sbytes;
    }
    hbytes = 2 * ngu;
    if (dg_cuda_use(0, &err) < 0 || bench_print_board(0, &err) < 0 ||
        dg_measure_ceilings(0, &ce, &err) < 0 ||
        dg_prof_create(&prof, 8, 0, &err) < 0 || dg_blas_create(0, NULL, &blas, &err) < 0)
        goto fail;
    h = malloc(hbytes);
    idx = malloc(sizeof(int32_t) * (size_t)(256 * maxb * TOPK));
    if (!h || !idx) {
        fprintf(stderr, "bench-moe: out of host memory\n");
        return 1;
    }
    if (dg_cuda_alloc((void **)&o.x, 2 * (size_t)(256 * maxb) * HID, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.wgu, 2 * ngu, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.wdn, 2 * ndn, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.qgu, ngu, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.qdn, ndn, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.sgu, sizeof(float) * N_EXP * 2 * INTER, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.sdn, sizeof(float) * N_EXP * HID, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.w, sizeof(float) * (size_t)(256 * maxb * TOPK), 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.idx, sizeof(int32_t) * (size_t)(256 * maxb * TOPK), 0, &err) <
            0 ||
        dg_cuda_alloc((void **)&o.out, sizeof(float) * (size_t)(256 * maxb) * HID, 0, &err) < 0 ||
        dg_cuda_alloc(&o.scratch, sbytes, 0, &err) < 0)
        goto fail;
    fill_bf16((uint16_t *)h, ngu);
    if (dg_cuda_upload(o.wgu, h, 2 * ngu, 0, &err) < 0 ||
        dg_cuda_upload(o.x, h, 2 * (size_t)(256 * maxb) * HID, 0, &err) < 0)
        goto fail;
    fill_bf16((uint16_t *)h, ndn);
    if (dg_cuda_upload(o.wdn, h, 2 * ndn, 0, &err) < 0)
        goto fail;
    bench_fill_e4m3(&rng, h, ngu);
    if (dg_cuda_upload(o.qgu, h, ngu, 0, &err) < 0 || dg_cuda_upload(o.qdn, h, ndn, 0, &err) < 0)
        goto fail;
    for (int64_t i = 0; i < 256 * maxb * TOPK || i < N_EXP * HID; i++)
        ((float *)h)[i] = i < 256 * maxb * TOPK && i % 2 ? 0.125f : 1e-3f * (float)(1 + i % 7);
    if (dg_cuda_upload(o.sgu, h, sizeof(float) * N_EXP * 2 * INTER, 0, &err) < 0 ||
        dg_cuda_upload(o.sdn, h, sizeof(float) * N_EXP * HID, 0, &err) < 0 ||
        dg_cuda_upload(o.w, h, sizeof(float) * (size_t)(256 * maxb * TOPK), 0, &err) < 0)
        goto fail;

    printf("ceilings, GPU 0: device copy %.0f GB/s (read + write), L2 read %.0f GB/s; %d "
           "experts, top %d, hidden %d, expert width %d; a rank holds experts 0 .. n_exp - 1; "
           "%d timed repeats a row, medians\n\n",
           ce.copy_gbps, ce.l2_read_gbps, N_EXP, TOPK, HID, INTER, reps);
    printf("| B | weights | share (TP) | n_exp | planned for | ts | batched tiles | hint | ms | "
           "floor ms | x floor | x the share's plan |\n"
           "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int bi = 0; bi < nb; bi++) {
        const int64_t T = 256 * (int64_t)batches[bi];
        for (size_t s = 0; s < sizeof shares / sizeof shares[0]; s++) {
            const int n_exp = N_EXP / shares[s];
            int touched;
            route(idx, T, n_exp, &touched);
            if (dg_cuda_upload(o.idx, idx, sizeof(int32_t) * (size_t)(T * TOPK), 0, &err) < 0)
                goto fail;
            for (int fp8 = 0; fp8 < 2; fp8++) {
                const double bytes =
                    (double)touched * 3.0 * INTER * HID * (fp8 ? 1.0 : 2.0);
                const double floor_ms = bytes / (ce.copy_gbps * 1e9) * 1e3;
                double share_ms = 0.0;
                /* the share's plan (n_all 128), then all picks' (n_all n_exp) */
                for (int all = 0; all < (shares[s] > 1 ? 2 : 1); all++) {
                    const int n_all = all ? n_exp : N_EXP;
                    struct moe_call c = {blas, &o, fp8, n_exp, n_all, T};
                    struct dg_moe_plan p;
                    double ms;
                    if (dg_moe_plan_make(T, TOPK, n_exp, n_all, &p, &err) < 0)
                        goto fail;
                    ms = bench_time_device(prof, reps, t, moe_call, &c, &err);
                    if (ms < 0)
                        goto fail;
                    if (!all)
                        share_ms = ms;
                    printf("| %d | %s | 1/%d | %d | %s | %d | %lld | %d | %.3f | %.3f | %.2f | "
                           "%.2f |\n",
                           batches[bi], fp8 ? "FP8" : "bf16", shares[s], n_exp,
                           all ? "all picks" : "its share", p.ts, (long long)p.batched, p.hint,
                           ms, floor_ms, ms / floor_ms, ms / share_ms);
                }
            }
        }
    }
    free(h);
    free(idx);
    dg_blas_destroy(blas);
    dg_prof_destroy(prof);
    return 0;
fail:
    fprintf(stderr, "bench-moe: %s\n", err.msg);
    return 1;
}
