/* cmd-quantize.c - `dgemma-eval quantize`: a checkpoint's FP8 form
 * (lib/quantize.h). */
#include <stdio.h>
#include <string.h>

#include "lib/quantize.h"
#include "tools/eval/eval.h"

static const char usage[] =
    "usage: dgemma-eval quantize --model DIR --out DIR [--weights-only]\n"
    "Write DIR's model with FP8 E4M3 weights: every attention, dense MLP,\n"
    "expert and self-conditioning projection quantized per output channel\n"
    "(scale = max|row| / 448, a <name>_scale tensor [rows, 1] in F32 beside\n"
    "each), experts stored per expert in 2-D; the embedding (the LM head),\n"
    "the routers, every norm and scalar copied as they are; config.json\n"
    "gains a compressed-tensors quantization_config whose activations are\n"
    "quantized per token at run time (W8A8), or not with --weights-only.\n"
    "generation_config.json and the tokenizer files are copied; the vision\n"
    "tower is not written.  One file: model.safetensors.\n";

int cmd_quantize(int argc, char **argv)
{
    const char *model = NULL, *out = NULL;
    int weights_only = 0;
    struct dg_quantize_report rep;
    struct dg_error err = {0};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--model") && v) {
            model = v, i++;
        } else if (!strcmp(a, "--out") && v) {
            out = v, i++;
        } else if (!strcmp(a, "--weights-only")) {
            weights_only = 1;
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (!model || !out) {
        fputs(usage, stderr);
        return 2;
    }
    if (dg_quantize_dir(model, out, weights_only, &rep, &err) != 0) {
        eval_errorf("quantize: %s [%s]", err.msg, dg_status_name(err.code));
        return 1;
    }
    printf("%s: %zu tensors, %zu of them FP8 E4M3 with per-channel scales; activations %s\n",
           out, rep.tensors, rep.fp8_tensors,
           weights_only ? "unquantized (weights only)" : "per token (W8A8)");
    return 0;
}
