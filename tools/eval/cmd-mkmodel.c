/* cmd-mkmodel.c - `dgemma-eval mkmodel`: write a DiffusionGemma checkpoint
 * with deterministic random weights (lib/model-synth.h), from a preset or
 * from an existing config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/fileio.h"
#include "lib/model-config.h"
#include "lib/model-synth.h"
#include "lib/tokenizer-synth.h"
#include "tools/eval/eval.h"

static const char usage[] =
    "usage: dgemma-eval mkmodel --out DIR [options]\n"
    "Write config.json, generation_config.json and random weights to DIR, and,\n"
    "when the vocabulary has room (at least 361 ids), a matching small\n"
    "tokenizer.json and tokenizer_config.json.\n"
    "  --preset NAME        tiny (default), small (the daemon tests' random model,\n"
    "                       build/model/random) or 26b (the released shapes:\n"
    "                       ~50 GB with --dtype bf16, ~100 GB in f32)\n"
    "  --config FILE        take the shapes from this config.json instead\n"
    "  --dtype f32|bf16     weight dtype (default f32)\n"
    "  --seed N             weight seed (default 1)\n"
    "  --shards N           write N shards and an index (default 1: model.safetensors)\n"
    "  --per-expert         store experts as per-expert 2-D tensors, not packed banks\n"
    "  --per-layer-config   write config.json the way transformers 5.17 saves it\n"
    "  --layers N           keep the first N layers (the last made a full-attention one)\n"
    "  --vision             add a few vision-tower tensors (the loader skips them)\n"
    "  --no-tokenizer       do not write tokenizer.json\n";

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    const char *out = NULL, *preset = "tiny", *config = NULL;
    struct dg_synth_options o;
    struct dg_model_config cfg;
    struct dg_synth_plan plan;
    struct dg_error err = {0};
    unsigned long long v;
    int tokenizer = 1, layers = 0;

    dg_synth_options_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--out") && val) {
            out = val, i++;
        } else if (!strcmp(a, "--preset") && val) {
            preset = val, i++;
        } else if (!strcmp(a, "--config") && val) {
            config = val, i++;
        } else if (!strcmp(a, "--dtype") && val) {
            if (!strcmp(val, "f32"))
                o.dtype = DG_DTYPE_F32;
            else if (!strcmp(val, "bf16"))
                o.dtype = DG_DTYPE_BF16;
            else {
                eval_errorf("mkmodel: --dtype must be f32 or bf16, not '%s'", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--seed") && val) {
            if (parse_u64(val, &v)) {
                eval_errorf("mkmodel: --seed needs a non-negative integer, not '%s'", val);
                return 2;
            }
            o.seed = v, i++;
        } else if (!strcmp(a, "--shards") && val) {
            if (parse_u64(val, &v) || v < 1 || v > DG_MAX_SHARDS) {
                eval_errorf("mkmodel: --shards needs an integer in [1, %d], not '%s'",
                            DG_MAX_SHARDS, val);
                return 2;
            }
            o.n_shards = (int)v, i++;
        } else if (!strcmp(a, "--layers") && val) {
            if (parse_u64(val, &v) || v < 1 || v > DG_MAX_LAYERS) {
                eval_errorf("mkmodel: --layers needs an integer in [1, %d], not '%s'",
                            DG_MAX_LAYERS, val);
                return 2;
            }
            layers = (int)v, i++;
        } else if (!strcmp(a, "--per-expert")) {
            o.experts = DG_EXPERTS_PER_EXPERT;
        } else if (!strcmp(a, "--per-layer-config")) {
            o.per_layer_config_form = 1;
        } else if (!strcmp(a, "--vision")) {
            o.with_vision = 1;
        } else if (!strcmp(a, "--no-tokenizer")) {
            tokenizer = 0;
        } else {
            eval_errorf("mkmodel: unexpected argument '%s'%s", a,
                        val || a[0] != '-' ? "" : " (missing its value?)");
            fputs(usage, stderr);
            return 2;
        }
    }
    if (!out) {
        eval_errorf("mkmodel: --out DIR is required");
        fputs(usage, stderr);
        return 2;
    }
    if (config) {
        char *buf;
        size_t len;
        int rc = dg_file_read(config, DG_CONFIG_JSON_MAX, &buf, &len, &err);
        if (rc == 0) {
            rc = dg_model_config_parse(buf, len, config, &cfg, &err);
            free(buf);
        }
        if (rc) {
            eval_errorf("%s", err.msg);
            return 1;
        }
    } else if (dg_model_config_preset(preset, &cfg, &err) != 0) {
        eval_errorf("mkmodel: %s", err.msg);
        return 2;
    }
    if (layers && layers < cfg.num_layers) {
        /* (transformers requires the last layer to be a full one) */
        cfg.num_layers = layers;
        cfg.layer_kind[layers - 1] = DG_LAYER_FULL;
    }
    if (dg_synth_plan_build(&cfg, &o, &plan, &err) != 0 ||
        dg_synth_write(out, &cfg, NULL, &plan, &o, &err) != 0) {
        dg_synth_plan_free(&plan);
        eval_errorf("mkmodel: %s", err.msg);
        return 1;
    }
    tokenizer = tokenizer && cfg.vocab_size >= DG_TOKSYNTH_MIN_VOCAB;
    if (tokenizer && dg_tokenizer_synth_write(out, cfg.vocab_size, &err) != 0) {
        dg_synth_plan_free(&plan);
        eval_errorf("mkmodel: %s", err.msg);
        return 1;
    }
    printf("wrote %s: %d tensors in %d file%s%s\n", out, plan.n, o.n_shards,
           o.n_shards == 1 ? "" : "s", tokenizer ? ", tokenizer.json" : "");
    dg_synth_plan_free(&plan);
    return 0;
}
