/*
 * bench-cuda-step - one GPU running the model through the backend
 * interface, at the full 26B-A4B shapes with random bf16 weights made on
 * the GPU (no checkpoint file): per batch size, the prompt's encoder pass,
 * a denoising step (decoder pass + the fused sampler statistics), the
 * self-conditioning product, and a commit (the canvas's encoder pass), with
 * the device memory they take.
 *
 * usage: bench-cuda-step [--tp N] [--eager] [PRESET [PROMPT [REPS [BATCHES...]]]]
 *        (defaults tp 1, CUDA graphs on, 26b 512 5 and batches 1 8)
 * With --tp N the model is split over GPUs 0 .. N-1 (NCCL); after each
 * batch's row, one line per rank: its GPU's memory, the vocabulary
 * columns it holds, and the collectives of one denoising step (the last
 * round's) beside the bytes a gather of the fp32 logits would send.
 * Each batch size: B slots, B prompts of PROMPT random ids prefilled in
 * one encode call, then REPS rounds of denoise (self-conditioned after the
 * first) + condition + commit of a full canvas; medians over the rounds.
 * Times are host wall clock around each call (every call ends with its
 * stream synchronised); positions/s = B x canvas / the denoise time.  Memory: weights, what the backend holds besides
 * (caches, scratch, logits), and the device's used memory (cudaMemGetInfo).
 * Not a test: it prints a table and asserts nothing about speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/gpu/bench-util.h"
#include "kernels/cuda-backend.h"
#include "kernels/devmem.h"
#include "lib/model-config.h"

#define MAX_B 64
#define GIB (1024.0 * 1024.0 * 1024.0)


static uint64_t rng = 88172645463325252ull;

/* Per rank: the collectives between two snapshots. */
static void coll_delta(const struct dg_coll_stats *a, const struct dg_coll_stats *b,
                       struct dg_coll_stats *d)
{
    for (int k = 0; k < DG_COLL_KINDS; k++) {
        d->calls[k] = b->calls[k] - a->calls[k];
        d->bytes[k] = b->bytes[k] - a->bytes[k];
    }
}

static int run_batch(struct dg_backend *b, int B, int64_t P, int reps)
{
    const int n_ranks = dg_cuda_backend_ranks(b);
    struct dg_cuda_rank_usage before[8], after[8];
    const struct dg_model_config *c = b->cfg;
    const int CL = c->canvas_length;
    const int64_t V = c->vocab_size;
    struct dg_error err = {0};
    struct dg_encode_item enc[MAX_B];
    struct dg_denoise_item den[MAX_B];
    int which[MAX_B];
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(P * B));
    int32_t *canvas = malloc(sizeof(int32_t) * (size_t)CL * (size_t)B);
    int32_t *out = malloc(sizeof(int32_t) * 2 * (size_t)CL * (size_t)B);
    float *ent = malloc(sizeof(float) * (size_t)CL * (size_t)B);
    double *t_den = calloc((size_t)reps, sizeof(double)), *t_cond = calloc((size_t)reps, sizeof(double));
    double *t_commit = calloc((size_t)reps, sizeof(double));
    double t_prefill, t0;
    uint64_t wbytes, obytes;
    size_t dfree, dtotal;
    int rc = -1;

    if (!prompt || !canvas || !out || !ent || !t_den || !t_cond || !t_commit)
        goto out;
    for (int i = 0; i < B; i++)
        if (b->ops->slot_open(b, i, P + (int64_t)(reps + 1) * CL, CL, &err) < 0)
            goto fail;
    for (int64_t i = 0; i < P * B; i++)
        prompt[i] = bench_rand_id(&rng, V);
    for (int i = 0; i < B; i++)
        enc[i] = (struct dg_encode_item){i, prompt + (int64_t)i * P, P};
    t0 = bench_now_ms();
    if (b->ops->encode(b, enc, B, &err) < 0)
        goto fail;
    t_prefill = bench_now_ms() - t0;
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < B * CL; i++)
            canvas[i] = bench_rand_id(&rng, V);
        for (int i = 0; i < B; i++) {
            den[i] = (struct dg_denoise_item){0};
            den[i].slot = i;
            den[i].canvas = canvas + i * CL;
            den[i].cl = CL;
            den[i].self_cond = r > 0;
            den[i].temperature = 0.8f;
            den[i].top_k = 0;
            den[i].top_p = 1.0f;
            den[i].seed = 1234 + (uint64_t)i;
            den[i].canvas_index = 0;
            den[i].step = (uint32_t)r;
            den[i].sample = out + 2 * i * CL;
            den[i].argmax = out + 2 * i * CL + CL;
            den[i].entropy = ent + i * CL;
            which[i] = i;
        }
        for (int q = 0; q < n_ranks && q < 8; q++)
            dg_cuda_backend_rank_usage(b, q, &before[q]);
        t0 = bench_now_ms();
        if (b->ops->denoise(b, den, B, &err) < 0)
            goto fail;
        t_den[r] = bench_now_ms() - t0;
        for (int q = 0; q < n_ranks && q < 8; q++)
            dg_cuda_backend_rank_usage(b, q, &after[q]);
        t0 = bench_now_ms();
        if (b->ops->condition(b, which, B, &err) < 0)
            goto fail;
        t_cond[r] = bench_now_ms() - t0;
        for (int i = 0; i < B; i++)
            enc[i] = (struct dg_encode_item){i, out + 2 * i * CL, CL};
        t0 = bench_now_ms();
        if (b->ops->encode(b, enc, B, &err) < 0)
            goto fail;
        t_commit[r] = bench_now_ms() - t0;
    }
    dg_cuda_backend_bytes(b, &wbytes, &obytes);
    if (dg_cuda_mem_info(&dfree, &dtotal, 0, &err) < 0)
        goto fail;
    printf("| %2d | %6d | %9.1f | %10.2f | %12.2f | %10.2f | %11.0f | %7.2f | %9.2f | %9.2f |\n",
           B, B * CL, t_prefill, bench_median(t_den, reps), bench_median(t_cond, reps),
           bench_median(t_commit, reps), (double)(B * CL) / (bench_median(t_den, reps) / 1e3),
           (double)wbytes / GIB, (double)obytes / GIB, (double)(dtotal - dfree) / GIB);
    for (int q = 0; n_ranks > 1 && q < n_ranks && q < 8; q++) {
        struct dg_coll_stats d;
        coll_delta(&before[q].coll, &after[q].coll, &d);
        printf("|    rank %d on GPU %d: weights %.2f GiB, device %.2f GiB used; vocabulary "
               "columns %lld of %lld; one denoising step: %llu all-reduces %.2f MiB, %llu "
               "all-gathers %.1f KiB (a gather of the fp32 logits: %.1f MiB) |\n", q,
               after[q].device, (double)after[q].weights / GIB, (double)after[q].device_used / GIB,
               (long long)after[q].logits_cols, (long long)b->cfg->vocab_size,
               (unsigned long long)d.calls[DG_COLL_ALL_REDUCE],
               (double)d.bytes[DG_COLL_ALL_REDUCE] / (1 << 20),
               (unsigned long long)d.calls[DG_COLL_ALL_GATHER],
               (double)d.bytes[DG_COLL_ALL_GATHER] / 1024,
               (double)B * CL * (double)after[q].logits_cols * 4 / (1 << 20));
    }
    fflush(stdout);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench-cuda-step: batch %d: %s\n", B, err.msg);
out:
    for (int i = 0; i < B; i++)
        b->ops->slot_close(b, i);
    free(prompt);
    free(canvas);
    free(out);
    free(ent);
    free(t_den);
    free(t_cond);
    free(t_commit);
    return rc;
}

int main(int argc, char **argv)
{
    int tp = 1, graphs = 1;
    for (;;) {
        if (argc > 2 && !strcmp(argv[1], "--tp")) {
            tp = atoi(argv[2]);
            argv[2] = argv[0];
            argv += 2;
            argc -= 2;
        } else if (argc > 1 && !strcmp(argv[1], "--eager")) {
            graphs = 0;
            argv[1] = argv[0];
            argv += 1;
            argc -= 1;
        } else {
            break;
        }
    }
    const char *preset = argc > 1 ? argv[1] : "26b";
    const int64_t P = argc > 2 ? atoll(argv[2]) : 512;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    int batches[16] = {1, 8}, nb = 2, rc = 0;
    struct dg_model_config cfg;
    struct dg_cuda_backend_options o;
    struct dg_backend *b;
    struct dg_error err = {0};
    double t0;

    if (argc > 4) {
        nb = 0;
        for (int i = 4; i < argc && nb < 16; i++)
            batches[nb++] = atoi(argv[i]);
    }
    if (dg_model_config_preset(preset, &cfg, &err) < 0 || P < 1 || reps < 1 || tp < 1 ||
        tp > 8) {
        fprintf(stderr, "usage: bench-cuda-step [--tp N] [--eager] [PRESET [PROMPT [REPS "
                "[BATCHES...]]]]: "
                "%s\n",
                err.msg[0] ? err.msg : "bad numbers");
        return 2;
    }
    for (int i = 0; i < nb; i++)
        if (batches[i] < 1 || batches[i] > MAX_B) {
            fprintf(stderr, "bench-cuda-step: batch %d not in 1..%d\n", batches[i], MAX_B);
            return 2;
        }
    memset(&o, 0, sizeof o);
    o.device = 0;
    o.n_ranks = tp;
    o.pin = 1;
    o.graphs = graphs;
    o.max_slots = MAX_B;
    o.cfg = &cfg;
    o.seed = 1;
    t0 = bench_now_ms();
    if (dg_cuda_backend_create(&o, &b, &err) < 0) {
        fprintf(stderr, "bench-cuda-step: %s\n", err.msg);
        return 1;
    }
    printf("tp %d, CUDA graphs %s; preset %s: %d layers, hidden %d, vocabulary %lld, %d experts (top %d), canvas %d; "
           "random bf16 weights made on the GPU in %.0f ms; prompt %lld, %d rounds\n\n",
           tp, graphs ? "on" : "off", preset, cfg.num_layers, cfg.hidden_size, (long long)cfg.vocab_size, cfg.num_experts,
           cfg.top_k_experts, cfg.canvas_length, bench_now_ms() - t0, (long long)P, reps);
    printf("| B  | tokens | prefill ms | denoise ms | condition ms | commit ms | positions/s  |"
           " weights GiB | other GiB | device GiB |\n");
    printf("|----|--------|-----------:|-----------:|-------------:|----------:|-------------:|"
           "------------:|----------:|-----------:|\n");
    for (int i = 0; i < nb; i++)
        rc |= run_batch(b, batches[i], P, reps);
    b->ops->destroy(b);
    return rc ? 1 : 0;
}
