/*
 * Description: checkpoint directories written by the suite itself (single
 * file and sharded, F32 and BF16, packed and per-expert experts, both config
 * forms, with vision tensors) load and bind to the right bytes; a file laid
 * out by transformers 5.17 binds; the 26B-A4B catalogue has the model
 * card's parameter counts; and every corruption (missing, misnamed, extra,
 * misshapen, mistyped tensors, broken index, missing or truncated shards,
 * bad configs) fails with its own error naming the file and tensor.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/checkpoint.h"
#include "lib/fileio.h"
#include "lib/log.h"
#include "lib/model-synth.h"
#include "lib/model-weights.h"
#include "lib/safetensors-write.h"
#include "tests/harness.h"

static int counter;

/* A fresh directory path under the scratch dir. */
static const char *fresh_dir(const char *tag)
{
    char name[64];
    snprintf(name, sizeof name, "%s-%d", tag, counter++);
    return test_path(name);
}

static void tiny(struct dg_model_config *c)
{
    dg_model_config_preset("tiny", c, NULL);
}

/* Write the tiny model with opts, after letting edit() change the plan. */
static int write_tiny(const char *dir, const struct dg_synth_options *o,
                      void (*edit)(struct dg_synth_plan *), struct dg_error *err)
{
    struct dg_model_config c;
    struct dg_synth_plan p;
    int rc;

    tiny(&c);
    if ((rc = dg_synth_plan_build(&c, o, &p, err)) < 0)
        return rc;
    if (edit)
        edit(&p);
    rc = dg_synth_write(dir, &c, NULL, &p, o, err);
    dg_synth_plan_free(&p);
    return rc;
}

static int load(const char *dir, struct dg_error *err)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    int rc = dg_model_load(dir, &ck, &m, err);
    if (rc == 0) {
        dg_model_free(&m);
        dg_checkpoint_close(&ck);
    }
    return rc;
}

/* element i of a bound weight, as f32 */
static float at(const struct dg_weight *w, int64_t r, int64_t col)
{
    return dg_load_f32(w->data, w->dtype, (size_t)(r * w->cols + col));
}

/* what the synthesiser stored for element i of tensor `name`, rounded to dtype */
static float synth(const char *name, uint64_t i, int64_t cols, enum dg_dtype t)
{
    float v = dg_synth_value(1, name, i, cols);
    return t == DG_DTYPE_BF16 ? dg_bf16_to_f32(dg_f32_to_bf16(v)) : v;
}

/* Independent parameter count for a config (model.md §2.1 shapes). */
static uint64_t count_params(const struct dg_model_config *c, uint64_t *experts)
{
    const uint64_t H = (uint64_t)c->hidden_size, V = (uint64_t)c->vocab_size;
    const uint64_t I = (uint64_t)c->intermediate_size, S = (uint64_t)c->self_conditioning_size;
    const uint64_t E = (uint64_t)c->num_experts, Im = (uint64_t)c->moe_intermediate_size;
    const uint64_t nh = (uint64_t)c->num_heads;
    uint64_t n = V * H + H + H + 3 * S * H;

    *experts = 0;
    for (int l = 0; l < c->num_layers; l++) {
        const uint64_t hd = (uint64_t)dg_layer_head_dim(c, l), kv = (uint64_t)dg_layer_kv_heads(c, l);
        const int sliding = c->layer_kind[l] == DG_LAYER_SLIDING;
        n += H + nh * hd * H + kv * hd * H + (sliding ? kv * hd * H : 0) + H * nh * hd + 2 * hd;
        n += H + H + 3 * I * H + H;             /* post-attn, pre-ffn, dense MLP, post-ffn-1 */
        n += E * H + H + E + H;                 /* router proj/scale/per-expert, pre-ffn-2 */
        n += E * (2 * Im * H + H * Im) + H + H; /* experts, post-ffn-2, post-ffn */
        n += 2;                                 /* both layer_scalar copies */
        *experts += E * 3 * Im * H;
    }
    return n;
}

static int case_26b_catalogue_matches_model_card(void)
{
    struct dg_model_config c;
    struct dg_catalog cat;
    struct dg_error err = {0};
    uint64_t total = 0, experts, want, active, sc;
    int v_proj = 0, scalars_enc = 0;

    dg_model_config_26b(&c);
    CHECK_OK(dg_catalog_build(&c, NULL, NULL, &cat, &err), &err);
    for (int i = 0; i < cat.n; i++) {
        uint64_t n = 1;
        for (int d = 0; d < cat.entries[i].ndim; d++)
            n *= (uint64_t)cat.entries[i].shape[d];
        total += n;
        v_proj += strstr(cat.entries[i].name, "v_proj") != NULL;
        scalars_enc += cat.entries[i].role == DG_CAT_SCALAR_ENC;
    }
    /* model.md §2.1: 6 global + 30 x 21 per layer + 25 v_proj + 30 encoder scalars = 691 */
    CHECK(cat.n == 691 && v_proj == 25 && scalars_enc == 30);
    want = count_params(&c, &experts);
    CHECK(total == want);
    active = total - experts + experts / 128 * 8;
    /* model.md §2.1 counts 25.23 B total and 3.82 B active, the model card
     * 25.2 B / 3.8 B; both leave out the self-conditioning MLP (3 x 2112 x
     * 2816 = 17.8 M), which the checkpoint holds */
    sc = 3ull * 2112 * 2816;
    CHECKF(fabs((double)(total - sc) / 1e9 - 25.23) < 0.005, "total %.4f B", (double)total / 1e9);
    CHECKF(fabs((double)(active - sc) / 1e9 - 3.82) < 0.005, "active %.4f B", (double)active / 1e9);
    dg_catalog_free(&cat);
    return 0;
}

static int case_single_file_f32_binds_right_bytes(void)
{
    const char *dir = fresh_dir("single");
    struct dg_synth_options o;
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    uint64_t experts;
    const int64_t H = 32, Im = 16;

    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, NULL, &err), &err);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    CHECK(!ck.sharded && ck.n_shards == 1 && ck.has_generation_config);
    CHECK(m.stats.params_total == count_params(&m.cfg, &experts));
    CHECK(m.stats.params_experts == experts);
    CHECK(m.stats.bytes_by_dtype[DG_DTYPE_F32] == 4 * m.stats.params_total);
    CHECK(m.stats.ignored_tensors == 0 && m.stats.n_tensors == 74);
    CHECK(m.embed.rows == 131 && m.embed.cols == H && m.embed.dtype == DG_DTYPE_F32);
    CHECK(at(&m.embed, 130, 31) == synth("model.decoder.embed_tokens.weight", 130 * 32 + 31, H,
                                         DG_DTYPE_F32));
    CHECK(m.layers[2].v_proj.data == NULL && m.layers[0].v_proj.data != NULL); /* full: K = V */
    CHECK(m.layers[2].q_proj.rows == 4 * 16 && m.layers[0].q_proj.rows == 4 * 8);
    CHECK(m.layers[2].q_norm.cols == 16 && m.layers[1].k_norm.cols == 8);
    /* packed banks sliced per expert: gate rows [e*2Im, e*2Im+Im), up the next Im */
    for (int e = 0; e < 4; e++) {
        const char *gu = "model.decoder.layers.1.experts.gate_up_proj";
        const char *dn = "model.decoder.layers.1.experts.down_proj";
        CHECK(m.layers[1].experts_packed == 1);
        CHECK(m.layers[1].expert_gate[e].rows == Im && m.layers[1].expert_gate[e].cols == H);
        CHECK(at(&m.layers[1].expert_gate[e], 3, 5) ==
              synth(gu, (uint64_t)((e * 2 * Im + 3) * H + 5), H, DG_DTYPE_F32));
        CHECK(at(&m.layers[1].expert_up[e], 15, 31) ==
              synth(gu, (uint64_t)((e * 2 * Im + Im + 15) * H + 31), H, DG_DTYPE_F32));
        CHECK(m.layers[1].expert_down[e].rows == H && m.layers[1].expert_down[e].cols == Im);
        CHECK(at(&m.layers[1].expert_down[e], 31, 15) ==
              synth(dn, (uint64_t)(e * H * Im + 31 * Im + 15), Im, DG_DTYPE_F32));
    }
    /* the two layer_scalar copies are distinct tensors, read as such */
    CHECK(m.layers[0].scalar_decoder == synth("model.decoder.layers.0.layer_scalar", 0, 1,
                                              DG_DTYPE_F32));
    CHECK(m.layers[0].scalar_encoder ==
          synth("model.encoder.language_model.layers.0.layer_scalar", 0, 1, DG_DTYPE_F32));
    CHECK(m.layers[0].scalar_encoder != m.layers[0].scalar_decoder);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

static int case_sharded_bf16_per_expert_with_vision(void)
{
    const char *dir = fresh_dir("sharded");
    struct dg_synth_options o;
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    uint64_t experts;

    dg_synth_options_default(&o);
    o.dtype = DG_DTYPE_BF16;
    o.n_shards = 3;
    o.experts = DG_EXPERTS_PER_EXPERT;
    o.per_layer_config_form = 1;
    o.with_vision = 1;
    CHECK_OK(write_tiny(dir, &o, NULL, &err), &err);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    CHECK(ck.sharded && ck.n_shards == 3);
    CHECK(m.cfg.global_head_dim == 16 && m.cfg.num_global_kv_heads == 1);
    CHECK(m.stats.params_total == count_params(&m.cfg, &experts));
    CHECK(m.stats.bytes_by_dtype[DG_DTYPE_BF16] == 2 * m.stats.params_total);
    CHECK(m.stats.ignored_tensors == 2);
    CHECK(m.layers[0].experts_packed == 0 && m.layers[0].expert_up[3].dtype == DG_DTYPE_BF16);
    CHECK(at(&m.layers[0].expert_up[3], 2, 7) ==
          synth("model.decoder.layers.0.experts.3.up_proj.weight", 2 * 32 + 7, 32, DG_DTYPE_BF16));
    CHECK(at(&m.layers[2].expert_down[1], 31, 15) ==
          synth("model.decoder.layers.2.experts.1.down_proj.weight", 31 * 16 + 15, 16,
                DG_DTYPE_BF16));
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

static int case_sharded_equals_single(void)
{
    const char *a = fresh_dir("eq-single"), *b = fresh_dir("eq-sharded");
    struct dg_synth_options o;
    struct dg_checkpoint ca, cb;
    struct dg_model ma, mb;
    struct dg_error err = {0};

    dg_synth_options_default(&o);
    o.dtype = DG_DTYPE_BF16;
    CHECK_OK(write_tiny(a, &o, NULL, &err), &err);
    o.n_shards = 5;
    CHECK_OK(write_tiny(b, &o, NULL, &err), &err);
    CHECK_OK(dg_model_load(a, &ca, &ma, &err), &err);
    CHECK_OK(dg_model_load(b, &cb, &mb, &err), &err);
    CHECK(cb.n_shards == 5 && ca.total_bytes == cb.total_bytes);
    CHECK(!memcmp(ma.embed.data, mb.embed.data, (size_t)(131 * 32 * 2)));
    for (int l = 0; l < 3; l++) {
        CHECK(!memcmp(ma.layers[l].o_proj.data, mb.layers[l].o_proj.data,
                      (size_t)(ma.layers[l].o_proj.rows * ma.layers[l].o_proj.cols * 2)));
        CHECK(!memcmp(ma.layers[l].expert_down[3].data, mb.layers[l].expert_down[3].data,
                      32 * 16 * 2));
        CHECK(ma.layers[l].scalar_encoder == mb.layers[l].scalar_encoder);
    }
    dg_model_free(&ma);
    dg_model_free(&mb);
    dg_checkpoint_close(&ca);
    dg_checkpoint_close(&cb);
    return 0;
}

/* A model.safetensors laid out exactly as transformers 5.17 saved it (the
 * committed header; zero-filled data), with its config files. */
static int case_transformers_layout_binds(void)
{
    const char *dir = fresh_dir("hf");
    struct dg_error err = {0};
    struct dg_checkpoint ck;
    struct dg_model m;
    json_error_t je;
    json_t *hdr = json_load_file("tests/fixtures/hf-5.17-tiny/header.json", 0, &je), *v;
    const char *key;
    char *text, *path;
    size_t hlen, padded;
    uint64_t data_size = 0, text_params = 0, n_vision = 0;
    FILE *f;

    CHECK(hdr);
    json_object_foreach(hdr, key, v) {
        json_t *offs = json_object_get(v, "data_offsets"), *shape = json_object_get(v, "shape"), *d;
        size_t i;
        uint64_t n = 1;
        if (!offs)
            continue;
        if ((uint64_t)json_integer_value(json_array_get(offs, 1)) > data_size)
            data_size = (uint64_t)json_integer_value(json_array_get(offs, 1));
        json_array_foreach(shape, i, d) n *= (uint64_t)json_integer_value(d);
        if (!strncmp(key, "model.encoder.vision_tower.", 27) ||
            !strncmp(key, "model.encoder.embed_vision.", 27))
            n_vision++;
        else
            text_params += n;
    }
    text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    hlen = strlen(text);
    padded = (hlen + 7) & ~(size_t)7;
    CHECK(mkdir(dir, 0755) == 0);
    path = dg_path_join(dir, "model.safetensors");
    f = fopen(path, "wb");
    free(path);
    CHECK(f);
    for (int i = 0; i < 8; i++)
        fputc((int)((padded >> (8 * i)) & 0xff), f);
    fputs(text, f);
    for (size_t i = hlen; i < padded; i++)
        fputc(' ', f);
    for (uint64_t i = 0; i < data_size; i++)
        fputc(0, f);
    CHECK(fclose(f) == 0);
    free(text);
    {
        char cmd[1200];
        snprintf(cmd, sizeof cmd,
                 "cp tests/fixtures/hf-5.17-tiny/config.json "
                 "tests/fixtures/hf-5.17-tiny/generation_config.json '%s'", dir);
        CHECK(system(cmd) == 0);
    }
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    CHECK(m.stats.n_tensors == 74 && m.stats.params_total == text_params);
    CHECK(m.stats.ignored_tensors == n_vision && n_vision > 0);
    CHECK(m.layers[2].q_proj.rows == 128 && m.layers[2].v_proj.data == NULL);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

/* ---- corruptions: the plan ------------------------------------------------ */

static void drop_q_proj_1(struct dg_synth_plan *p)
{
    int i = dg_synth_plan_find(p, "model.decoder.layers.1.self_attn.q_proj.weight");
    p->t[i] = p->t[--p->n];
}

static void misname_up_proj(struct dg_synth_plan *p)
{
    int i = dg_synth_plan_find(p, "model.decoder.layers.2.mlp.up_proj.weight");
    snprintf(p->t[i].name, sizeof p->t[i].name, "model.decoder.layers.2.mlp.up_prj.weight");
}

static void add_extra(struct dg_synth_plan *p)
{
    static const int64_t shape[1] = {32};
    dg_synth_plan_add(p, "model.decoder.layers.0.extra_norm.weight", DG_DTYPE_F32, 1, shape, NULL);
}

static void add_layer_3(struct dg_synth_plan *p)
{
    static const int64_t shape[1] = {32};
    dg_synth_plan_add(p, "model.decoder.layers.3.input_layernorm.weight", DG_DTYPE_F32, 1, shape,
                      NULL);
}

static void add_v_proj_on_full_layer(struct dg_synth_plan *p)
{
    static const int64_t shape[2] = {16, 32};
    dg_synth_plan_add(p, "model.decoder.layers.2.self_attn.v_proj.weight", DG_DTYPE_F32, 2, shape,
                      NULL);
}

static void widen_embedding(struct dg_synth_plan *p)
{
    p->t[dg_synth_plan_find(p, "model.decoder.embed_tokens.weight")].shape[0] = 132;
}

static void flatten_router(struct dg_synth_plan *p)
{
    struct dg_synth_tensor *t = &p->t[dg_synth_plan_find(p, "model.decoder.layers.0.router.proj.weight")];
    t->ndim = 1;
    t->shape[0] = 4 * 32;
}

static void int_norm(struct dg_synth_plan *p)
{
    p->t[dg_synth_plan_find(p, "model.decoder.norm.weight")].dtype = DG_DTYPE_I32;
}

static void mix_expert_forms(struct dg_synth_plan *p)
{
    static const int64_t shape[2] = {16, 32};
    dg_synth_plan_add(p, "model.decoder.layers.1.experts.0.gate_proj.weight", DG_DTYPE_F32, 2,
                      shape, NULL);
}

static int case_missing_tensor(void)
{
    const char *dir = fresh_dir("missing");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, drop_q_proj_1, &err), &err);
    CHECK_FAILS(load(dir, &err), &err, DG_E_MISSING,
                "missing tensor 'model.decoder.layers.1.self_attn.q_proj.weight' [32, 32] "
                "(1 missing in all)");
    CHECK(strstr(err.msg, dir));
    return 0;
}

static int case_misnamed_tensor(void)
{
    const char *dir = fresh_dir("misnamed");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, misname_up_proj, &err), &err);
    CHECK_FAILS(load(dir, &err), &err, DG_E_MISSING,
                "missing tensor 'model.decoder.layers.2.mlp.up_proj.weight' [48, 32] (1 missing "
                "in all); 'model.decoder.layers.2.mlp.up_prj.weight' in");
    CHECK(strstr(err.msg, "model.safetensors looks misnamed"));
    return 0;
}

static int case_extra_tensors(void)
{
    const char *d1 = fresh_dir("extra"), *d2 = fresh_dir("extra-layer"), *d3 = fresh_dir("extra-v");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(d1, &o, add_extra, &err), &err);
    CHECK_FAILS(load(d1, &err), &err, DG_E_EXTRA,
                "model.safetensors: unexpected tensor 'model.decoder.layers.0.extra_norm.weight' "
                "(1 unexpected in all");
    CHECK_OK(write_tiny(d2, &o, add_layer_3, &err), &err);
    CHECK_FAILS(load(d2, &err), &err, DG_E_EXTRA,
                "unexpected tensor 'model.decoder.layers.3.input_layernorm.weight'");
    CHECK_OK(write_tiny(d3, &o, add_v_proj_on_full_layer, &err), &err);
    CHECK_FAILS(load(d3, &err), &err, DG_E_EXTRA,
                "unexpected tensor 'model.decoder.layers.2.self_attn.v_proj.weight'");
    return 0;
}

static int case_wrong_shapes(void)
{
    const char *d1 = fresh_dir("shape"), *d2 = fresh_dir("rank");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(d1, &o, widen_embedding, &err), &err);
    CHECK_FAILS(load(d1, &err), &err, DG_E_SHAPE,
                "model.safetensors: tensor 'model.decoder.embed_tokens.weight': shape [132, 32] "
                "but the config needs [131, 32]");
    CHECK_OK(write_tiny(d2, &o, flatten_router, &err), &err);
    CHECK_FAILS(load(d2, &err), &err, DG_E_SHAPE,
                "tensor 'model.decoder.layers.0.router.proj.weight': shape [128] but the config "
                "needs [4, 32]");
    return 0;
}

static int case_unsupported_dtype(void)
{
    const char *dir = fresh_dir("dtype");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, int_norm, &err), &err);
    CHECK_FAILS(load(dir, &err), &err, DG_E_DTYPE,
                "tensor 'model.decoder.norm.weight': dtype I32 is not supported for weights "
                "(BF16, F16, F32)");
    return 0;
}

static int case_mixed_expert_forms(void)
{
    const char *dir = fresh_dir("mixed");
    struct dg_synth_options o;
    struct dg_error err = {0};
    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, mix_expert_forms, &err), &err);
    CHECK_FAILS(load(dir, &err), &err, DG_E_CONFIG,
                "layer 1 has both packed expert banks and per-expert tensors");
    return 0;
}

/* ---- corruptions: files ------------------------------------------------- */

/* Overwrite the first bytes of tensor `name` in the safetensors file at path. */
static int patch_tensor(const char *path, const char *name, const void *bytes, size_t n)
{
    struct dg_mapping m;
    struct dg_st_file f;
    struct dg_error err;
    long off = -1;
    FILE *fp;

    if (dg_file_map(path, &m, &err) || dg_st_parse(m.addr, m.size, path, &f, &err))
        return -1;
    for (size_t i = 0; i < f.n_tensors; i++)
        if (!strcmp(f.tensors[i].name, name))
            off = (long)(f.data_offset + f.tensors[i].begin);
    dg_st_file_free(&f);
    dg_file_unmap(&m);
    if (off < 0 || !(fp = fopen(path, "r+b")))
        return -1;
    fseek(fp, off, SEEK_SET);
    fwrite(bytes, 1, n, fp);
    return fclose(fp);
}

static int case_non_finite_layer_scalar(void)
{
    const char *dir = fresh_dir("nan");
    struct dg_synth_options o;
    struct dg_error err = {0};
    float nan = NAN;
    char *path;

    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, NULL, &err), &err);
    path = dg_path_join(dir, "model.safetensors");
    CHECK(patch_tensor(path, "model.encoder.language_model.layers.1.layer_scalar", &nan, 4) == 0);
    free(path);
    CHECK_FAILS(load(dir, &err), &err, DG_E_CONFIG,
                "tensor 'model.encoder.language_model.layers.1.layer_scalar': layer_scalar is not "
                "finite");
    return 0;
}

static int write_sharded(const char *dir, struct dg_error *err)
{
    struct dg_synth_options o;
    dg_synth_options_default(&o);
    o.n_shards = 3;
    return write_tiny(dir, &o, NULL, err);
}

/* Rewrite dir/model.safetensors.index.json after edit(). */
static int edit_index(const char *dir, void (*edit)(json_t *wm))
{
    char *path = dg_path_join(dir, "model.safetensors.index.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    int rc;
    if (!root) {
        free(path);
        return -1;
    }
    edit(json_object_get(root, "weight_map"));
    rc = json_dump_file(root, path, JSON_INDENT(1));
    json_decref(root);
    free(path);
    return rc;
}

static void move_embed_to_shard_3(json_t *wm)
{
    json_object_set_new(wm, "model.decoder.embed_tokens.weight",
                        json_string("model-00003-of-00003.safetensors"));
}

static void list_phantom(json_t *wm)
{
    json_object_set_new(wm, "model.decoder.phantom.weight",
                        json_string("model-00001-of-00003.safetensors"));
}

static void unlist_final_norm(json_t *wm)
{
    json_object_del(wm, "model.decoder.norm.weight");
}

static void escape_dir(json_t *wm)
{
    json_object_set_new(wm, "model.decoder.norm.weight",
                        json_string("../model-00001-of-00003.safetensors"));
}

static void name_missing_shard(json_t *wm)
{
    json_object_set_new(wm, "model.decoder.norm.weight",
                        json_string("model-00009-of-00009.safetensors"));
}

static int case_index_naming_missing_shard(void)
{
    const char *d1 = fresh_dir("noshard"), *d2 = fresh_dir("noshard2");
    struct dg_error err = {0};
    char *p;

    CHECK_OK(write_sharded(d1, &err), &err);
    p = dg_path_join(d1, "model-00002-of-00003.safetensors");
    CHECK(unlink(p) == 0);
    free(p);
    CHECK_FAILS(load(d1, &err), &err, DG_E_MISSING, "names shard 'model-00002-of-00003.safetensors'");
    CHECK(strstr(err.msg, "which does not exist in"));
    CHECK_OK(write_sharded(d2, &err), &err);
    CHECK(edit_index(d2, name_missing_shard) == 0);
    CHECK_FAILS(load(d2, &err), &err, DG_E_MISSING,
                "names shard 'model-00009-of-00009.safetensors' (for tensor "
                "'model.decoder.norm.weight'), which does not exist");
    return 0;
}

static int case_index_disagrees_with_shards(void)
{
    const char *d1 = fresh_dir("idx-move"), *d2 = fresh_dir("idx-phantom");
    const char *d3 = fresh_dir("idx-unlisted"), *d4 = fresh_dir("idx-escape");
    struct dg_error err = {0};

    CHECK_OK(write_sharded(d1, &err), &err);
    CHECK(edit_index(d1, move_embed_to_shard_3) == 0);
    CHECK_FAILS(load(d1, &err), &err, DG_E_FORMAT,
                "lists tensor 'model.decoder.embed_tokens.weight' in "
                "model-00003-of-00003.safetensors, but it is in model-00001-of-00003.safetensors");
    CHECK_OK(write_sharded(d2, &err), &err);
    CHECK(edit_index(d2, list_phantom) == 0);
    CHECK_FAILS(load(d2, &err), &err, DG_E_MISSING,
                "lists tensor 'model.decoder.phantom.weight' in model-00001-of-00003.safetensors, "
                "but no shard holds it");
    CHECK_OK(write_sharded(d3, &err), &err);
    CHECK(edit_index(d3, unlist_final_norm) == 0);
    CHECK_FAILS(load(d3, &err), &err, DG_E_FORMAT,
                "holds tensor 'model.decoder.norm.weight', which");
    CHECK(strstr(err.msg, "model.safetensors.index.json does not list"));
    CHECK_OK(write_sharded(d4, &err), &err);
    CHECK(edit_index(d4, escape_dir) == 0);
    CHECK_FAILS(load(d4, &err), &err, DG_E_FORMAT,
                "weight_map.model.decoder.norm.weight: '../model-00001-of-00003.safetensors' is "
                "not a plain file name");
    return 0;
}

static int case_index_malformed(void)
{
    const char *d1 = fresh_dir("idx-json"), *d2 = fresh_dir("idx-nomap");
    struct dg_error err = {0};
    char *p;
    FILE *f;

    CHECK_OK(write_sharded(d1, &err), &err);
    p = dg_path_join(d1, "model.safetensors.index.json");
    f = fopen(p, "w");
    fputs("{\"weight_map\": {\"a\": ", f);
    fclose(f);
    CHECK_FAILS(load(d1, &err), &err, DG_E_FORMAT, "model.safetensors.index.json: malformed JSON");
    free(p);
    CHECK_OK(write_sharded(d2, &err), &err);
    p = dg_path_join(d2, "model.safetensors.index.json");
    f = fopen(p, "w");
    fputs("{\"metadata\": {}}", f);
    fclose(f);
    CHECK_FAILS(load(d2, &err), &err, DG_E_CONFIG, "index.json: weight_map: required key is missing");
    free(p);
    return 0;
}

static int copy_fill(void *ud, size_t index, void *buf, size_t nbytes, struct dg_error *err)
{
    const void *const *srcs = ud;
    memcpy(buf, srcs[index], nbytes);
    (void)err;
    return 0;
}

static int case_tensor_in_two_shards(void)
{
    const char *dir = fresh_dir("dup");
    struct dg_error err = {0};
    static const float zeros[32];
    const void *src = zeros;
    struct dg_st_out_tensor t = {"model.decoder.norm.weight", DG_DTYPE_F32, 1, {32}};
    struct dg_mapping m;
    struct dg_st_file f;
    char *p3;

    CHECK_OK(write_sharded(dir, &err), &err);
    /* append norm.weight (listed for another shard) to shard 3 by rewriting it */
    p3 = dg_path_join(dir, "model-00003-of-00003.safetensors");
    CHECK_OK(dg_file_map(p3, &m, &err), &err);
    CHECK_OK(dg_st_parse(m.addr, m.size, p3, &f, &err), &err);
    {
        struct dg_st_out_tensor *out = calloc(f.n_tensors + 1, sizeof *out);
        const void **srcs = calloc(f.n_tensors + 1, sizeof *srcs);
        int rc;
        for (size_t i = 0; i < f.n_tensors; i++) {
            out[i].name = f.tensors[i].name;
            out[i].dtype = f.tensors[i].dtype;
            out[i].ndim = f.tensors[i].ndim;
            memcpy(out[i].shape, f.tensors[i].shape, sizeof out[i].shape);
            srcs[i] = f.tensors[i].data;
        }
        out[f.n_tensors] = t;
        srcs[f.n_tensors] = src;
        rc = dg_st_write(p3, out, f.n_tensors + 1, copy_fill, srcs, &err);
        free(out);
        free(srcs);
        dg_st_file_free(&f);
        dg_file_unmap(&m);
        CHECK_OK(rc, &err);
    }
    free(p3);
    CHECK_FAILS(load(dir, &err), &err, DG_E_FORMAT,
                "tensor 'model.decoder.norm.weight' appears in both");
    return 0;
}

static int case_truncated_files(void)
{
    const char *d1 = fresh_dir("trunc-shard"), *d2 = fresh_dir("trunc-header");
    struct dg_synth_options o;
    struct dg_error err = {0};
    struct stat st;
    char *p;

    CHECK_OK(write_sharded(d1, &err), &err);
    p = dg_path_join(d1, "model-00003-of-00003.safetensors");
    CHECK(stat(p, &st) == 0 && truncate(p, st.st_size - 10) == 0);
    CHECK_FAILS(load(d1, &err), &err, DG_E_RANGE, "runs past the end of the data section");
    CHECK(strstr(err.msg, "model-00003-of-00003.safetensors") && strstr(err.msg, "truncated?"));
    free(p);

    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(d2, &o, NULL, &err), &err);
    p = dg_path_join(d2, "model.safetensors");
    CHECK(truncate(p, 100) == 0);
    CHECK_FAILS(load(d2, &err), &err, DG_E_RANGE, "runs past the end of the file (100 bytes");
    CHECK(truncate(p, 3) == 0);
    CHECK_FAILS(load(d2, &err), &err, DG_E_RANGE, "file is 3 bytes, too short");
    free(p);
    return 0;
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char *p = dg_path_join(dir, name);
    FILE *f = fopen(p, "w");
    free(p);
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

static int case_directory_and_config_errors(void)
{
    const char *d1 = fresh_dir("nofiles"), *d2 = fresh_dir("noconfig"), *d3 = fresh_dir("badcfg");
    const char *d4 = fresh_dir("badgen"), *d5 = fresh_dir("cfgjson"), *d6 = fresh_dir("layers");
    struct dg_synth_options o;
    struct dg_error err = {0};
    char *p;

    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(d1, &o, NULL, &err), &err);
    p = dg_path_join(d1, "model.safetensors");
    CHECK(unlink(p) == 0);
    free(p);
    CHECK_FAILS(load(d1, &err), &err, DG_E_MISSING,
                "neither model.safetensors nor model.safetensors.index.json exists");

    CHECK_OK(write_tiny(d2, &o, NULL, &err), &err);
    p = dg_path_join(d2, "config.json");
    CHECK(unlink(p) == 0);
    free(p);
    CHECK_FAILS(load(d2, &err), &err, DG_E_MISSING, "config.json: no such file");

    CHECK_OK(write_tiny(d3, &o, NULL, &err), &err);
    {
        struct dg_model_config c;
        char *text;
        tiny(&c);
        c.top_k_experts = 5; /* more than the 4 experts */
        text = dg_model_config_to_json(&c, 0);
        CHECK(write_file(d3, "config.json", text) == 0);
        free(text);
    }
    CHECK_FAILS(load(d3, &err), &err, DG_E_CONFIG, "top_k_experts (5) must be in [1, num_experts (4)]");
    CHECK(strstr(err.msg, "config.json"));

    CHECK_OK(write_tiny(d4, &o, NULL, &err), &err);
    CHECK(write_file(d4, "generation_config.json", "{\"t_min\": 0.9, \"t_max\": 0.5}") == 0);
    CHECK_FAILS(load(d4, &err), &err, DG_E_CONFIG, "generation_config.json: t_max (0.5) must be greater");

    CHECK_OK(write_tiny(d5, &o, NULL, &err), &err);
    CHECK(write_file(d5, "config.json", "{\"model_type\": \"diffusion_gemma\",,}") == 0);
    CHECK_FAILS(load(d5, &err), &err, DG_E_FORMAT, "config.json: malformed JSON at line 1");

    /* a config with one layer more than the weights */
    CHECK_OK(write_tiny(d6, &o, NULL, &err), &err);
    {
        struct dg_model_config c;
        char *text;
        tiny(&c);
        c.num_layers = 4;
        c.layer_kind[2] = DG_LAYER_SLIDING;
        c.layer_kind[3] = DG_LAYER_FULL;
        text = dg_model_config_to_json(&c, 0);
        CHECK(write_file(d6, "config.json", text) == 0);
        free(text);
    }
    CHECK_FAILS(load(d6, &err), &err, DG_E_SHAPE, "model.decoder.layers.2.self_attn.q_proj.weight");
    return 0;
}

static int n_warn;
static void count_warn(void *ud, enum dg_log_level lv, const char *line)
{
    (void)ud;
    (void)line;
    n_warn += lv == DG_LOG_WARN;
}

static int case_single_file_wins_over_index(void)
{
    const char *dir = fresh_dir("both");
    struct dg_synth_options o;
    struct dg_error err = {0};
    int rc;

    dg_synth_options_default(&o);
    CHECK_OK(write_tiny(dir, &o, NULL, &err), &err);
    CHECK(write_file(dir, "model.safetensors.index.json", "not even json") == 0);
    n_warn = 0;
    dg_log_set_sink(count_warn, NULL, DG_LOG_WARN);
    rc = load(dir, &err);
    dg_log_set_sink(NULL, NULL, DG_LOG_INFO);
    CHECK_OK(rc, &err);
    CHECK(n_warn == 1);
    return 0;
}

int main(void)
{
    TEST_CASE(case_26b_catalogue_matches_model_card);
    TEST_CASE(case_single_file_f32_binds_right_bytes);
    TEST_CASE(case_sharded_bf16_per_expert_with_vision);
    TEST_CASE(case_sharded_equals_single);
    TEST_CASE(case_transformers_layout_binds);
    TEST_CASE(case_missing_tensor);
    TEST_CASE(case_misnamed_tensor);
    TEST_CASE(case_extra_tensors);
    TEST_CASE(case_wrong_shapes);
    TEST_CASE(case_unsupported_dtype);
    TEST_CASE(case_mixed_expert_forms);
    TEST_CASE(case_non_finite_layer_scalar);
    TEST_CASE(case_index_naming_missing_shard);
    TEST_CASE(case_index_disagrees_with_shards);
    TEST_CASE(case_index_malformed);
    TEST_CASE(case_tensor_in_two_shards);
    TEST_CASE(case_truncated_files);
    TEST_CASE(case_directory_and_config_errors);
    TEST_CASE(case_single_file_wins_over_index);
    return test_finish();
}
