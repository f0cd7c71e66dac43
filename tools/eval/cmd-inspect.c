/* cmd-inspect.c - `dgemma-eval inspect DIR [--json]`: load and validate a
 * checkpoint, then describe it (shapes, parameters, bytes per dtype, the
 * two layer_scalar copies, generation defaults). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/json-util.h"
#include "lib/model-weights.h"
#include "tools/eval/eval.h"

static const char usage[] =
    "usage: dgemma-eval inspect DIR [--json]\n"
    "Validate the checkpoint in DIR (config.json, generation_config.json,\n"
    "model.safetensors or model.safetensors.index.json and its shards) and\n"
    "describe it.  Exit status 0 if it loads, 1 with the reason if not.\n";

/* 1234567 -> "1.235 M"; units of 1000 (parameters) */
static const char *count_str(char *buf, size_t n, uint64_t x)
{
    if (x >= 1000000000ull)
        snprintf(buf, n, "%.3f B", (double)x / 1e9);
    else if (x >= 1000000ull)
        snprintf(buf, n, "%.3f M", (double)x / 1e6);
    else if (x >= 1000ull)
        snprintf(buf, n, "%.3f K", (double)x / 1e3);
    else
        snprintf(buf, n, "%llu", (unsigned long long)x);
    return buf;
}

/* bytes in decimal units, as model cards quote them */
static const char *bytes_str(char *buf, size_t n, uint64_t x)
{
    if (x >= 1000000000ull)
        snprintf(buf, n, "%.3f GB", (double)x / 1e9);
    else if (x >= 1000000ull)
        snprintf(buf, n, "%.3f MB", (double)x / 1e6);
    else if (x >= 1000ull)
        snprintf(buf, n, "%.3f kB", (double)x / 1e3);
    else
        snprintf(buf, n, "%llu bytes", (unsigned long long)x);
    return buf;
}

/* Largest |encoder - decoder| layer_scalar difference, and how many differ. */
static int scalars_differ(const struct dg_model *m, double *max_diff)
{
    int n = 0;
    *max_diff = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        double d = fabs((double)m->layers[l].scalar_encoder - m->layers[l].scalar_decoder);
        if (d > 0)
            n++;
        if (d > *max_diff)
            *max_diff = d;
    }
    return n;
}

static void print_text(const char *dir, const struct dg_checkpoint *ck, const struct dg_model *m)
{
    const struct dg_model_config *c = &m->cfg;
    const struct dg_model_stats *s = &m->stats;
    const struct dg_generation_config *g = &ck->generation;
    int n_full = 0, n_diff, packed = 0;
    double max_diff;
    char a[32], b[32], c2[32], d[32];

    for (int l = 0; l < c->num_layers; l++) {
        n_full += c->layer_kind[l] == DG_LAYER_FULL;
        packed += m->layers[l].experts_packed;
    }
    printf("checkpoint    %s (%s%d file%s), %s of tensor data\n", dir,
           ck->sharded ? "index + " : "", ck->n_shards, ck->n_shards == 1 ? "" : "s",
           bytes_str(a, sizeof a, ck->total_bytes));
    printf("layers        %d (%d sliding, %d full), hidden %d, vocab %lld\n", c->num_layers,
           c->num_layers - n_full, n_full, c->hidden_size, (long long)c->vocab_size);
    printf("attention     %d query heads; sliding: %d KV x %d, window %d, rope theta %g; "
           "full: %d KV x %d, rope %s theta %g, rotating %.3g\n",
           c->num_heads, c->num_kv_heads, c->head_dim, c->sliding_window, c->rope_sliding.theta,
           c->num_global_kv_heads, c->global_head_dim,
           c->rope_full.kind == DG_ROPE_PROPORTIONAL ? "proportional" : "default",
           c->rope_full.theta, c->rope_full.partial_rotary_factor);
    printf("feed-forward  dense %d; %d experts x %d, top %d (%s); self-conditioning %d\n",
           c->intermediate_size, c->num_experts, c->moe_intermediate_size, c->top_k_experts,
           packed == c->num_layers ? "packed banks" : packed ? "mixed" : "per-expert tensors",
           c->self_conditioning_size);
    printf("canvas        %d tokens; softcap %g; rms eps %g\n", c->canvas_length,
           c->final_logit_softcapping, c->rms_norm_eps);
    printf("parameters    %s total, %s active per token, %s embedding, %s experts "
           "(%llu tensors)\n", count_str(a, sizeof a, s->params_total),
           count_str(b, sizeof b, s->params_active), count_str(c2, sizeof c2, s->params_embedding),
           count_str(d, sizeof d, s->params_experts), (unsigned long long)s->n_tensors);
    printf("bytes        ");
    for (int t = 0; t < DG_DTYPE_COUNT; t++)
        if (s->bytes_by_dtype[t])
            printf(" %s %s", dg_dtype_name((enum dg_dtype)t),
                   bytes_str(a, sizeof a, s->bytes_by_dtype[t]));
    printf("\n");
    if (c->fp8)
        printf("quantized     FP8 E4M3 weights with per-channel scales; activations %s\n",
               c->fp8_act_per_token ? "per token at run time (W8A8)" : "unquantized");
    if (s->ignored_tensors)
        printf("ignored       %llu vision tensors, %s\n",
               (unsigned long long)s->ignored_tensors, bytes_str(a, sizeof a, s->ignored_bytes));
    n_diff = scalars_differ(m, &max_diff);
    if (n_diff)
        printf("layer_scalar  encoder and decoder copies differ on %d of %d layers (max |diff| %g)\n",
               n_diff, c->num_layers, max_diff);
    else
        printf("layer_scalar  encoder and decoder copies equal on all %d layers\n", c->num_layers);
    printf("generation    %s: %d steps max, entropy bound %g, t %g -> %g, stability %d, "
           "confidence %g, max_new_tokens %d\n",
           ck->has_generation_config ? "generation_config.json" : "defaults",
           g->max_denoising_steps, g->entropy_bound, g->t_max, g->t_min, g->stability_threshold,
           g->confidence_threshold, g->max_new_tokens);
}

static int print_json(const char *dir, const struct dg_checkpoint *ck, const struct dg_model *m)
{
    const struct dg_model_stats *s = &m->stats;
    json_t *o, *bytes, *scal;
    double max_diff;
    char *text;

    /* (the set calls below are unchecked: the watch sees a failed
     * allocation in any, which would leave a key out of the line) */
    dg_json_alloc_watch();
    o = json_object(), bytes = json_object(), scal = json_array();

    for (int t = 0; t < DG_DTYPE_COUNT; t++)
        if (s->bytes_by_dtype[t])
            json_object_set_new(bytes, dg_dtype_name((enum dg_dtype)t),
                                json_integer((json_int_t)s->bytes_by_dtype[t]));
    for (int l = 0; l < m->cfg.num_layers; l++)
        json_array_append_new(scal, json_pack("[f,f]", m->layers[l].scalar_encoder,
                                              m->layers[l].scalar_decoder));
    json_object_set_new(o, "dir", json_string(dir));
    json_object_set_new(o, "shards", json_integer(ck->n_shards));
    json_object_set_new(o, "tensor_bytes", json_integer((json_int_t)ck->total_bytes));
    json_object_set_new(o, "tensors", json_integer((json_int_t)s->n_tensors));
    json_object_set_new(o, "params_total", json_integer((json_int_t)s->params_total));
    json_object_set_new(o, "params_active", json_integer((json_int_t)s->params_active));
    json_object_set_new(o, "params_embedding", json_integer((json_int_t)s->params_embedding));
    json_object_set_new(o, "params_experts", json_integer((json_int_t)s->params_experts));
    json_object_set_new(o, "bytes_by_dtype", bytes);
    json_object_set_new(o, "quantization",
                        !m->cfg.fp8              ? json_null()
                        : m->cfg.fp8_act_per_token ? json_string("fp8-w8a8")
                                                   : json_string("fp8-weights"));
    json_object_set_new(o, "ignored_tensors", json_integer((json_int_t)s->ignored_tensors));
    json_object_set_new(o, "ignored_bytes", json_integer((json_int_t)s->ignored_bytes));
    json_object_set_new(o, "layer_scalars", scal);
    json_object_set_new(o, "layer_scalars_differ", json_integer(scalars_differ(m, &max_diff)));
    text = dg_json_dumps_watched(o, JSON_COMPACT);
    json_decref(o);
    if (!text) {
        eval_errorf("inspect: out of memory");
        return 1;
    }
    puts(text);
    free(text);
    return 0;
}

int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    int json = 0, rc;
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (argv[i][0] == '-' || dir) {
            eval_errorf("inspect: unexpected argument '%s'", argv[i]);
            fputs(usage, stderr);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        fputs(usage, stderr);
        return 2;
    }
    if (dg_model_load(dir, &ck, &m, &err) != 0) {
        eval_errorf("%s [%s]", err.msg, dg_status_name(err.code));
        return 1;
    }
    if (json)
        rc = print_json(dir, &ck, &m);
    else {
        print_text(dir, &ck, &m);
        rc = 0;
    }
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return rc;
}
