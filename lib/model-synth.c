/* model-synth.c - see model-synth.h. */
#include "lib/model-synth.h"
#include "lib/json-util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/fileio.h"
#include "lib/grow.h"
#include "lib/safetensors-write.h"

void dg_synth_options_default(struct dg_synth_options *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = DG_DTYPE_F32;
    o->seed = 1;
    o->n_shards = 1;
    o->experts = DG_EXPERTS_PACKED;
}

int dg_synth_plan_add(struct dg_synth_plan *plan, const char *name, enum dg_dtype dtype, int ndim,
                      const int64_t *shape, struct dg_error *err)
{
    struct dg_synth_tensor *t = dg_grow(plan->t, &plan->cap, (size_t)plan->n + 1, sizeof *t, 256);

    if (!t)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    plan->t = t;
    t = &plan->t[plan->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim && d < 3; d++)
        t->shape[d] = shape[d];
    return 0;
}

int dg_synth_plan_find(const struct dg_synth_plan *plan, const char *name)
{
    for (int i = 0; i < plan->n; i++)
        if (strcmp(plan->t[i].name, name) == 0)
            return i;
    return -1;
}

void dg_synth_plan_free(struct dg_synth_plan *plan)
{
    free(plan->t);
    memset(plan, 0, sizeof *plan);
}

int dg_synth_plan_build(const struct dg_model_config *cfg, const struct dg_synth_options *opts,
                        struct dg_synth_plan *plan, struct dg_error *err)
{
    enum dg_expert_layout layout[DG_MAX_LAYERS];
    struct dg_catalog cat;
    int rc;

    memset(plan, 0, sizeof *plan);
    for (int l = 0; l < cfg->num_layers; l++)
        layout[l] = opts->experts;
    if ((rc = dg_catalog_build(cfg, layout, NULL, &cat, err)) < 0)
        return rc;
    for (int i = 0; i < cat.n && rc == 0; i++)
        rc = dg_synth_plan_add(plan, cat.entries[i].name, opts->dtype, cat.entries[i].ndim,
                               cat.entries[i].shape, err);
    dg_catalog_free(&cat);
    if (rc == 0 && opts->with_vision) {
        static const int64_t proj[2] = {8, 4}, vec[1] = {4};
        rc = dg_synth_plan_add(plan, "model.encoder.embed_vision.embedding_projection.weight",
                               opts->dtype, 2, proj, err);
        if (rc == 0)
            rc = dg_synth_plan_add(plan,
                                   "model.encoder.vision_tower.encoder.layers.0.input_layernorm.weight",
                                   opts->dtype, 1, vec, err);
    }
    if (rc)
        dg_synth_plan_free(plan);
    return rc;
}

/* ---- values ------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* uniform in (0, 1) from 53 random bits, never 0 */
static double unit(uint64_t r)
{
    return ((double)(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

float dg_synth_value(uint64_t seed, const char *name, uint64_t i, int64_t cols)
{
    uint64_t key = splitmix64(seed ^ name_hash(name));
    uint64_t r1 = splitmix64(key + 2 * i), r2 = splitmix64(key + 2 * i + 1);
    double gauss = sqrt(-2.0 * log(unit(r1))) * cos(6.283185307179586 * unit(r2));

    if (ends_with(name, "layer_scalar"))
        return (float)(0.5 + unit(r1));
    if (ends_with(name, "norm.weight") || ends_with(name, "router.scale") ||
        ends_with(name, "per_expert_scale"))
        return (float)(1.0 + 0.1 * gauss);
    return (float)(gauss / sqrt((double)(cols > 0 ? cols : 1)));
}

struct fill_ctx {
    const struct dg_synth_plan *plan;
    const int *members;   /* plan indices in this shard */
    uint64_t seed;
};

static int fill_tensor(void *ud, size_t index, void *buf, size_t nbytes, struct dg_error *err)
{
    const struct fill_ctx *c = ud;
    const struct dg_synth_tensor *t = &c->plan->t[c->members[index]];
    size_t es = dg_dtype_size(t->dtype), n = nbytes / es;
    int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1;

    for (size_t i = 0; i < n; i++) {
        float v = dg_synth_value(c->seed, t->name, i, cols);
        if (t->dtype == DG_DTYPE_F32) {
            memcpy((char *)buf + 4 * i, &v, 4);
        } else if (t->dtype == DG_DTYPE_BF16) {
            uint16_t h = dg_f32_to_bf16(v);
            memcpy((char *)buf + 2 * i, &h, 2);
        } else {
            /* other dtypes (tests writing wrongly typed tensors): a byte pattern */
            memset((char *)buf + es * i, (int)(i & 0x7f), es);
        }
    }
    (void)err;
    return 0;
}


static int write_generation_config(const char *dir, const struct dg_model_config *cfg,
                                   const struct dg_generation_config *gen, struct dg_error *err)
{
    struct dg_generation_config d;
    json_t *o, *eos;
    char *s;
    int rc;

    /* (the calls below are not checked one by one: a failed allocation in
     * any of them leaves a key out, and the watch sees it) */
    dg_json_alloc_watch();
    o = json_object(), eos = json_array();
    if (!gen) {
        dg_generation_config_defaults(&d);
        gen = &d;
    }
    for (int i = 0; i < (gen->n_eos ? gen->n_eos : cfg->n_eos); i++)
        json_array_append_new(eos, json_integer(gen->n_eos ? gen->eos_ids[i] : cfg->eos_ids[i]));
    json_object_set_new(o, "max_new_tokens", json_integer(gen->max_new_tokens));
    json_object_set_new(o, "max_denoising_steps", json_integer(gen->max_denoising_steps));
    json_object_set_new(o, "sampler_config",
                        json_pack("{s:s, s:f}", "_cls_name", "EntropyBoundSamplerConfig",
                                  "entropy_bound", gen->entropy_bound));
    json_object_set_new(o, "t_min", json_real(gen->t_min));
    json_object_set_new(o, "t_max", json_real(gen->t_max));
    json_object_set_new(o, "stability_threshold", json_integer(gen->stability_threshold));
    json_object_set_new(o, "confidence_threshold", json_real(gen->confidence_threshold));
    json_object_set_new(o, "eos_token_id", eos);
    json_object_set_new(o, "pad_token_id",
                        json_integer(gen->pad_token_id >= 0 ? gen->pad_token_id : cfg->pad_token_id));
    s = dg_json_dumps_watched(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!s)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    rc = dg_write_text(dir, "generation_config.json", s, err);
    free(s);
    return rc;
}

static uint64_t plan_bytes(const struct dg_synth_tensor *t)
{
    uint64_t n = dg_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* Write the plan's tensors whose shard is s into `file`. */
static int write_shard(const char *path, const struct dg_synth_plan *plan, const int *shard_of,
                       int s, uint64_t seed, struct dg_error *err)
{
    struct dg_st_out_tensor *out = calloc((size_t)plan->n + 1, sizeof *out);
    int *members = calloc((size_t)plan->n + 1, sizeof *members);
    struct fill_ctx ctx = {plan, members, seed};
    size_t n = 0;
    int rc;

    if (!out || !members) {
        free(out);
        free(members);
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < plan->n; i++) {
        if (shard_of[i] != s)
            continue;
        out[n].name = plan->t[i].name;
        out[n].dtype = plan->t[i].dtype;
        out[n].ndim = plan->t[i].ndim;
        for (int d = 0; d < plan->t[i].ndim; d++)
            out[n].shape[d] = plan->t[i].shape[d];
        members[n++] = i;
    }
    rc = dg_st_write(path, out, n, fill_tensor, &ctx, err);
    free(out);
    free(members);
    return rc;
}

int dg_synth_write(const char *dir, const struct dg_model_config *cfg,
                   const struct dg_generation_config *gen, const struct dg_synth_plan *plan,
                   const struct dg_synth_options *opts, struct dg_error *err)
{
    int n_shards = opts->n_shards < 1 ? 1 : opts->n_shards;
    int *shard_of = NULL, rc;
    char *cfg_text = NULL;
    uint64_t total = 0, cum = 0;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dg_error_set(err, DG_E_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    cfg_text = dg_model_config_to_json(cfg, opts->per_layer_config_form);
    if (!cfg_text)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    rc = dg_write_text(dir, "config.json", cfg_text, err);
    free(cfg_text);
    if (rc == 0)
        rc = write_generation_config(dir, cfg, gen, err);
    if (rc)
        return rc;

    if (n_shards > plan->n)
        n_shards = plan->n > 0 ? plan->n : 1;
    shard_of = calloc((size_t)plan->n + 1, sizeof *shard_of);
    if (!shard_of)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    for (int i = 0; i < plan->n; i++)
        total += plan_bytes(&plan->t[i]);
    for (int i = 0; i < plan->n; i++) {
        /* contiguous runs of roughly equal bytes; every shard gets at least one tensor */
        int s = total ? (int)((long double)cum * n_shards / total) : 0;
        int min_s = n_shards - (plan->n - i); /* leave one tensor for each later shard */
        int prev = i ? shard_of[i - 1] : 0;
        if (s < prev)
            s = prev;
        if (s > prev + 1)
            s = prev + 1;
        if (s < min_s)
            s = min_s;
        if (i == 0)
            s = 0;
        shard_of[i] = s;
        cum += plan_bytes(&plan->t[i]);
    }

    if (n_shards == 1) {
        char *path = dg_path_join(dir, "model.safetensors");
        rc = path ? write_shard(path, plan, shard_of, 0, opts->seed, err)
                  : dg_error_set(err, DG_E_NOMEM, "out of memory");
        free(path);
    } else {
        json_t *wm, *root;
        char name[64], *text;
        /* (the index's calls are not checked one by one: the watch sees a
         * failed allocation in any of them) */
        dg_json_alloc_watch();
        wm = json_object(), root = json_object();
        for (int s = 0; s < n_shards && rc == 0; s++) {
            char *path;
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
            path = dg_path_join(dir, name);
            rc = path ? write_shard(path, plan, shard_of, s, opts->seed, err)
                      : dg_error_set(err, DG_E_NOMEM, "out of memory");
            free(path);
            for (int i = 0; i < plan->n; i++)
                if (shard_of[i] == s)
                    json_object_set_new(wm, plan->t[i].name, json_string(name));
        }
        json_object_set_new(root, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
        json_object_set_new(root, "weight_map", wm);
        text = dg_json_dumps_watched(root, JSON_INDENT(2));
        json_decref(root);
        if (rc == 0)
            rc = text ? dg_write_text(dir, "model.safetensors.index.json", text, err)
                      : dg_error_set(err, DG_E_NOMEM, "out of memory");
        free(text);
    }
    free(shard_of);
    /* the other layout's file, from a model written here before, would be
     * loaded instead (a single file wins over an index) or warned about */
    if (rc == 0) {
        char *stale = dg_path_join(dir, n_shards == 1 ? "model.safetensors.index.json"
                                                      : "model.safetensors");
        if (!stale)
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        else if (unlink(stale) != 0 && errno != ENOENT)
            rc = dg_error_set(err, DG_E_IO, "%s: cannot remove the earlier model's file: %s",
                              stale, strerror(errno));
        free(stale);
    }
    return rc;
}
