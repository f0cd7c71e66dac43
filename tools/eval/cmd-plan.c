/* cmd-plan.c - `dgemma-eval plan`: how a model splits over tensor-parallel
 * ranks: weight and KV bytes per rank, and the collectives of one
 * denoising step against gathering the logits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/model-config.h"
#include "lib/sampler.h"
#include "lib/tp-plan.h"
#include "tools/eval/eval.h"

static const char usage[] =
    "usage: dgemma-eval plan (--model DIR | --preset NAME) [--tp T]...\n"
    "                        [--experts across|width] [--width-align U] [--tokens N]\n"
    "                        [--weight-bytes B] [--act-bytes B]\n"
    "For each tensor-parallel degree T (default 1 2 4 8): the largest rank's\n"
    "weight bytes by part (at --weight-bytes per element, default 2: bf16; the\n"
    "dense MLP's width, and under --experts width each expert's, split in units\n"
    "of U columns where there are at least T of them: 1 as the CPU backend\n"
    "splits, the default; 32 as the CUDA backend does), its\n"
    "KV cache per token of the full layers and for the sliding windows, and the\n"
    "collectives of one denoising step over --tokens positions (default: one\n"
    "canvas) with self-conditioning, activations reduced at --act-bytes per\n"
    "element (default 2: bf16; the CPU backend reduces in double, 8), next to\n"
    "an all-gather of the fp32 logits.  --model reads DIR/config.json only.\n";

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* Whether a is one of this command's options (each takes a value). */
static int takes_value(const char *a)
{
    static const char *const opts[] = {"--model",        "--preset",       "--experts",
                                       "--tp",           "--tokens",       "--weight-bytes",
                                       "--act-bytes",    "--width-align"};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
        if (!strcmp(a, opts[k]))
            return 1;
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *preset = NULL;
    int tps[16], n_tp = 0, weight_bytes = 2, act_bytes = 2, width_align = 1;
    int64_t tokens = 0;
    enum dg_expert_split experts = DG_EXPERTS_ACROSS;
    struct dg_model_config cfg;
    struct dg_error err = {0};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!takes_value(a)) {
            eval_errorf("plan: unknown option '%s'", a);
            fputs(usage, stderr);
            return 2;
        }
        if (!val) {
            eval_errorf("plan: %s needs a value", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) {
            model = val;
            continue;
        }
        if (!strcmp(a, "--preset")) {
            preset = val;
            continue;
        }
        if (!strcmp(a, "--experts")) {
            if (strcmp(val, "across") && strcmp(val, "width")) {
                eval_errorf("plan: --experts must be across or width");
                return 2;
            }
            experts = !strcmp(val, "width") ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS;
            continue;
        }
        x = strtol(val, &end, 10);
        if (end == val || *end || x < 1) {
            eval_errorf("plan: %s: '%s' is not a positive integer", a, val);
            return 2;
        }
        if (!strcmp(a, "--tp")) {
            if (n_tp == 16 || x > DG_TP_MAX) {
                eval_errorf("plan: at most 16 --tp values, each up to %d", DG_TP_MAX);
                return 2;
            }
            tps[n_tp++] = (int)x;
        } else if (!strcmp(a, "--tokens")) {
            tokens = x;
        } else if (!strcmp(a, "--width-align")) {
            if (x > 4096) {
                eval_errorf("plan: --width-align: at most 4096 columns, not '%s'", val);
                return 2;
            }
            width_align = (int)x;
        } else if (!strcmp(a, "--weight-bytes") && (x == 1 || x == 2 || x == 4)) {
            weight_bytes = (int)x;
        } else if (!strcmp(a, "--act-bytes") && (x == 2 || x == 4 || x == 8)) {
            act_bytes = (int)x;
        } else {
            eval_errorf("plan: %s must be %s, not '%s'", a,
                        !strcmp(a, "--weight-bytes") ? "1, 2 or 4" : "2, 4 or 8", val);
            return 2;
        }
    }
    if (!!model == !!preset) {
        eval_errorf("plan: need exactly one of --model, --preset");
        return 2;
    }
    if (preset && dg_model_config_preset(preset, &cfg, &err) != 0) {
        eval_errorf("plan: %s", err.msg);
        return 2;
    }
    if (model) {
        struct dg_checkpoint ck;
        if (dg_checkpoint_open(model, &ck, &err) != 0) {
            eval_errorf("%s", err.msg);
            return 1;
        }
        cfg = ck.config;
        dg_checkpoint_close(&ck);
    }
    if (n_tp == 0) {
        tps[0] = 1, tps[1] = 2, tps[2] = 4, tps[3] = 8;
        n_tp = 4;
    }
    if (tokens == 0)
        tokens = cfg.canvas_length;

    printf("vocabulary %lld, hidden %d, %d layers, %d experts (top %d); weights at %d "
           "byte(s) per element, experts %s, widths split in units of %d column(s)\n",
           (long long)cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_experts,
           cfg.top_k_experts, weight_bytes,
           experts == DG_EXPERTS_ACROSS ? "across ranks" : "along their width", width_align);
    printf("\n%-3s %12s %12s %12s %12s %12s %12s %12s %12s\n", "T", "embed MiB", "attn MiB",
           "mlp MiB", "experts MiB", "repl MiB", "total MiB", "KV B/token", "KV window MiB");
    for (int k = 0; k < n_tp; k++) {
        struct dg_tp_plan plan;
        struct dg_tp_bytes worst, b;
        if (dg_tp_plan_build_aligned(&cfg, tps[k], experts, 1, width_align, &plan, &err) != 0) {
            printf("%-3d %s\n", tps[k], err.msg);
            continue;
        }
        memset(&worst, 0, sizeof worst);
        for (int r = 0; r < tps[k]; r++) {
            dg_tp_plan_bytes(&cfg, &plan, r, weight_bytes, 2, &b);
            if (b.total > worst.total)
                worst = b;
        }
        printf("%-3d %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12llu %12.2f\n", tps[k],
               mib(worst.embedding), mib(worst.attention), mib(worst.mlp), mib(worst.experts),
               mib(worst.replicated), mib(worst.total), (unsigned long long)worst.kv_per_token,
               mib(worst.kv_window));
    }
    printf("\n(the largest rank; KV in bf16)\n");

    printf("\none denoising step over %lld positions, per rank (activations at %d bytes):\n",
           (long long)tokens, act_bytes);
    printf("%-3s %14s %14s %14s %14s %16s %10s\n", "T", "all-reduces", "bytes", "all-gathers",
           "bytes", "gather logits B", "ratio");
    for (int k = 0; k < n_tp; k++) {
        struct dg_tp_plan plan;
        struct dg_tp_comm c;
        uint64_t mine, gather;
        if (dg_tp_plan_build_aligned(&cfg, tps[k], experts, 1, width_align, &plan, &err) != 0)
            continue;
        dg_tp_comm_denoise(&cfg, &plan, tokens, 1, 0, act_bytes, &c);
        /* a sampler that gathers the logits instead: every rank sends its
         * [tokens, V/T] fp32 slice (and the per-step reduces stay) */
        gather = tps[k] > 1 ? (uint64_t)tokens * (uint64_t)cfg.vocab_size * 4 / (uint64_t)tps[k]
                            : 0;
        mine = c.all_gather_bytes;
        printf("%-3d %14llu %14llu %14llu %14llu %16llu %10.0f\n", tps[k],
               (unsigned long long)c.all_reduces, (unsigned long long)c.all_reduce_bytes,
               (unsigned long long)c.all_gathers, (unsigned long long)c.all_gather_bytes,
               (unsigned long long)gather, mine ? (double)gather / (double)mine : 0.0);
    }
    printf("\n(ratio: bytes a rank sends to gather the logits / bytes it sends for the "
           "sampler statistics, %zu per position; top-k adds 32 all-reduces of %lld doubles, "
           "top-p 34)\n", sizeof(struct dg_row_stats), (long long)tokens);
    return 0;
}
