/*
 * bench-attention - the denoising step's attention alone (the tensor-core
 * kernels of kernels/attention-tc.h), at the 26B-A4B's shapes, against its
 * floor from the ceilings measured in the same run.
 *
 * usage: bench-attention [--reps N] [--form auto|mma|wgmma|ws] [BATCHES...]
 *   (defaults: 50 reps; auto; batches 1 4)
 *
 * The harness's workload: a prompt of 512 tokens, then canvases of 256.
 * While canvas c (1..4) is denoised, each of the B sequences holds len =
 * 512 + 256 (c - 1) committed rows and its 256 canvas rows; its queries
 * are at positions len .. len + 255 and see, with no mask (the decoder's),
 * the keys kernels/cuda-forward.c gives them: a sliding layer the last
 * W - 1 = 1,023 committed rows and the canvas, a full layer every row.
 * Shapes: sliding 16 heads over 8 KV heads of 256, full 16 over 2 of 512.
 * q, k and v are random bf16 in [-1, 1); the K/V caches, B x 1,536 rows a
 * layer kind, are laid out as the backend's (row r of sequence i: nkv x
 * hd values).  The split keys' scratch is what the backend gives
 * (dg_cuda_attention_tc_scratch), so the kernel splits as in the model.
 *
 * Each launch (with its fold where the keys are split) runs once untimed,
 * then REPS times, each timed alone on the device (kernels/prof.h events);
 * the table gives medians, with the L2 as the step leaves it (the keys
 * were just written; nothing evicts them between repeats).  floor =
 * max(bytes / copy bandwidth, operations / bf16 GEMM rate): bytes = q +
 * the keys and values read + out, operations = 4 x rows x keys x hd (QK^T
 * and PV), rows = B x 256 x 16.  The last rows give a step's attention:
 * 25 sliding and 5 full layers, the mean over the four canvases.  "out"
 * is a hash (FNV-1a, 32 bits) of the output's bytes: the inputs are the
 * same on every run (a fixed seed), so two builds whose kernels add in
 * the same order print the same hashes.
 *
 * Not a test: it prints a table and asserts nothing about speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench-time.h"
#include "bench/gpu/bench-board.h"
#include "bench/gpu/bench-util.h"
#include "kernels/attention-tc.h"
#include "kernels/ceilings.h"
#include "kernels/devmem.h"
#include "kernels/prof.h"

#define CL 256      /* canvas */
#define PROMPT 512
#define WINDOW 1024
#define CANVASES 4
#define MAX_B 16
#define NH 16
#define MAX_REPS 1000
#define CACHE_ROWS (PROMPT + CANVASES * CL) /* rows a sequence's cache holds */

static uint64_t rng = 0x2545f4914f6cdd1dull;

struct kind {
    const char *name;
    int nkv, hd, sliding, layers;
};

static const struct kind kinds[2] = {
    {"sliding", 8, 256, 1, 25},
    {"full", 2, 512, 0, 5},
};

struct operands {
    void *q, *out, *k[MAX_B], *v[MAX_B], *scratch;
    int64_t *q_pos;
    int32_t *q_seq;
    struct dg_attn_seq *seqs;
    size_t scratch_bytes;
};

/* one attention launch: form, kind k, Tq query rows */
struct launch {
    const struct operands *o;
    enum dg_attn_tc_form form;
    const struct kind *k;
    int64_t Tq;
};

static int launch(void *ctx, struct dg_error *err)
{
    const struct launch *l = ctx;
    const struct operands *o = l->o;
    return dg_cuda_attention_tc_form(l->form, o->out, o->q, o->q_pos, o->q_seq, l->Tq, o->seqs,
                                     NH, l->k->nkv, l->k->hd, 0, WINDOW, o->scratch,
                                     o->scratch_bytes, NULL, 0, err);
}

/* FNV-1a over the n bytes at device p (host staging h, n bytes at least) */
static int hash_out(const void *p, void *h, size_t n, uint32_t *out, struct dg_error *err)
{
    const unsigned char *b = h;
    uint32_t x = 2166136261u;
    if (dg_cuda_download(h, p, n, 0, err) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        x = (x ^ b[i]) * 16777619u;
    *out = x;
    return 0;
}

/* n random bf16 values in [-1, 1) at device p (host staging h) */
static int fill_bf16(void *p, uint16_t *h, size_t n, struct dg_error *err)
{
    for (size_t i = 0; i < n; i++)
        /* bf16 of |x| in [0.5, 1), either sign */
        h[i] = (uint16_t)(0x3f00u ^ (uint16_t)(bench_rand_id(&rng, 0x10000) & 0x807f));
    return dg_cuda_upload(p, h, sizeof(uint16_t) * n, 0, err);
}

int main(int argc, char **argv)
{
    int batches[8], nb = 0, reps = 50;
    enum dg_attn_tc_form form = DG_ATTN_TC_AUTO;
    struct dg_error err = {0};
    struct dg_ceilings ce;
    struct dg_prof *prof = NULL;
    static double t[MAX_REPS];
    struct operands o = {0};
    const size_t q_elems = (size_t)MAX_B * CL * NH * 512;
    const size_t kv_elems = (size_t)CACHE_ROWS * 8 * 256; /* (2 x 512 is less) */
    uint16_t *h = malloc(sizeof(uint16_t) * (q_elems > kv_elems ? q_elems : kv_elems));
    int64_t *h_pos = malloc(sizeof(int64_t) * MAX_B * CL);
    int32_t *h_seq = malloc(sizeof(int32_t) * MAX_B * CL);

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--form") && i + 1 < argc) {
            const char *f = argv[++i];
            form = !strcmp(f, "mma") ? DG_ATTN_TC_MMA
                   : !strcmp(f, "wgmma") ? DG_ATTN_TC_WGMMA
                   : !strcmp(f, "ws") ? DG_ATTN_TC_WS
                   : !strcmp(f, "auto") ? DG_ATTN_TC_AUTO
                                        : (enum dg_attn_tc_form)-1;
            if ((int)form < 0) {
                fprintf(stderr, "bench-attention: --form auto, mma, wgmma or ws\n");
                return 2;
            }
        } else if (argv[i][0] != '-' && nb < 8 && atoi(argv[i]) >= 1 &&
                   atoi(argv[i]) <= MAX_B) {
            batches[nb++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: bench-attention [--reps N] [--form auto|mma|wgmma|ws] "
                            "[BATCHES...] (batches 1-%d)\n", MAX_B);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench-attention: --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    if (!h || !h_pos || !h_seq) {
        fprintf(stderr, "bench-attention: out of host memory\n");
        return 1;
    }
    if (!nb) {
        batches[nb++] = 1;
        batches[nb++] = 4;
    }
    if (dg_cuda_use(0, &err) < 0 || bench_print_board(0, &err) < 0 ||
        dg_measure_ceilings(0, &ce, &err) < 0 ||
        dg_prof_create(&prof, 8, 0, &err) < 0 ||
        dg_cuda_alloc(&o.q, sizeof(uint16_t) * q_elems, 0, &err) < 0 ||
        dg_cuda_alloc(&o.out, sizeof(uint16_t) * q_elems, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.q_pos, sizeof(int64_t) * MAX_B * CL, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.q_seq, sizeof(int32_t) * MAX_B * CL, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&o.seqs, sizeof(struct dg_attn_seq) * MAX_B, 0, &err) < 0 ||
        fill_bf16(o.q, h, q_elems, &err) < 0)
        goto fail;
    for (int i = 0; i < MAX_B; i++)
        if (dg_cuda_alloc(&o.k[i], sizeof(uint16_t) * kv_elems, 0, &err) < 0 ||
            dg_cuda_alloc(&o.v[i], sizeof(uint16_t) * kv_elems, 0, &err) < 0 ||
            fill_bf16(o.k[i], h, kv_elems, &err) < 0 || fill_bf16(o.v[i], h, kv_elems, &err) < 0)
            goto fail;

    printf("ceilings, GPU 0: device copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s, L2 read %.0f GB/s; "
           "prompt %d, canvases of %d, window %d; %d heads; %d timed repeats a row, medians\n\n",
           ce.copy_gbps, ce.gemm_tflops, ce.l2_read_gbps, PROMPT, CL, WINDOW, NH, reps);
    printf("| B | canvas | layer | KV heads x hd | keys a query | split | us | floor us | "
           "x floor | TFLOP/s | out |\n|---:|---:|---|---|---:|---|---:|---:|---:|---:|---|\n");
    for (int bi = 0; bi < nb; bi++) {
        const int B = batches[bi];
        const int64_t Tq = (int64_t)B * CL;
        double step_us = 0.0, step_floor = 0.0;
        for (int c = 1; c <= CANVASES; c++) {
            const int64_t len = PROMPT + (int64_t)(c - 1) * CL;
            for (int i = 0; i < B; i++)
                for (int j = 0; j < CL; j++) {
                    h_pos[i * CL + j] = len + j;
                    h_seq[i * CL + j] = i;
                }
            if (dg_cuda_upload(o.q_pos, h_pos, sizeof(int64_t) * (size_t)Tq, 0, &err) < 0 ||
                dg_cuda_upload(o.q_seq, h_seq, sizeof(int32_t) * (size_t)Tq, 0, &err) < 0)
                goto fail;
            for (int ki = 0; ki < 2; ki++) {
                const struct kind *k = &kinds[ki];
                const int64_t start = k->sliding && len > WINDOW - 1 ? len - (WINDOW - 1) : 0;
                const int64_t keys = len + CL - start;
                struct dg_attn_seq seqs[MAX_B];
                const double ops = 4.0 * (double)Tq * NH * (double)keys * k->hd;
                const double bytes = 2.0 * ((double)Tq * NH * k->hd * 2.0 +
                                            (double)B * keys * k->nkv * k->hd * 2.0);
                const struct launch l = {&o, form, k, Tq};
                double floor_us, us;
                size_t part;
                uint32_t hash;
                for (int i = 0; i < B; i++)
                    seqs[i] = (struct dg_attn_seq){o.k[i], o.v[i], start, keys};
                part = dg_cuda_attention_tc_scratch(Tq, NH, k->nkv, k->hd);
                if (part > o.scratch_bytes) {
                    dg_cuda_free(o.scratch);
                    o.scratch = NULL;
                    o.scratch_bytes = 0;
                    if (dg_cuda_alloc(&o.scratch, part, 0, &err) < 0)
                        goto fail;
                    o.scratch_bytes = part;
                }
                if (dg_cuda_upload(o.seqs, seqs, sizeof seqs[0] * (size_t)B, 0, &err) < 0)
                    goto fail;
                us = 1e3 * bench_time_device(prof, reps, t, launch, (void *)&l, &err);
                if (us < 0 || hash_out(o.out, h, sizeof(uint16_t) * (size_t)Tq * NH * (size_t)k->hd,
                                       &hash, &err) < 0)
                    goto fail;
                floor_us = 1e6 * (bytes / (ce.copy_gbps * 1e9) > ops / (ce.gemm_tflops * 1e12)
                                      ? bytes / (ce.copy_gbps * 1e9)
                                      : ops / (ce.gemm_tflops * 1e12));
                step_us += us * k->layers / CANVASES;
                step_floor += floor_us * k->layers / CANVASES;
                printf("| %d | %d | %s | %d x %d | %lld | %s | %.1f | %.1f | %.2f | %.0f "
                       "| %08x |\n",
                       B, c, k->name, k->nkv, k->hd, (long long)keys, part ? "yes" : "no", us,
                       floor_us, us / floor_us, ops / (us * 1e-6) / 1e12, (unsigned)hash);
            }
        }
        printf("| %d | mean | a step: 25 sliding + 5 full | | | | %.0f | %.0f | %.2f | | |\n", B,
               step_us, step_floor, step_us / step_floor);
    }
    dg_prof_destroy(prof);
    return 0;
fail:
    fprintf(stderr, "bench-attention: %s\n", err.msg);
    return 1;
}
