/* model-weights.c - the tensor catalogue and binding; see model-weights.h. */
#include "lib/model-weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/grow.h"

#define DEC "model.decoder."
#define ENC "model.encoder.language_model."

int dg_tensor_name_ignored(const char *name)
{
    return strncmp(name, "model.encoder.vision_tower.", 27) == 0 ||
           strncmp(name, "model.encoder.embed_vision.", 27) == 0;
}

struct cat_builder {
    struct dg_catalog *cat;
    size_t cap;
    int failed;
};

static struct dg_cat_entry *add(struct cat_builder *b, struct dg_weight *dst, enum dg_cat_role role,
                                int layer, int ndim, int64_t d0, int64_t d1, int64_t d2,
                                const char *fmt, ...) __attribute__((format(printf, 9, 10)));

static struct dg_cat_entry *add(struct cat_builder *b, struct dg_weight *dst, enum dg_cat_role role,
                                int layer, int ndim, int64_t d0, int64_t d1, int64_t d2,
                                const char *fmt, ...)
{
    struct dg_cat_entry *e;
    va_list ap;

    if (b->failed)
        return NULL;
    e = dg_grow(b->cat->entries, &b->cap, (size_t)b->cat->n + 1, sizeof *e, 256);
    if (!e) {
        b->failed = 1;
        return NULL;
    }
    b->cat->entries = e;
    e = &b->cat->entries[b->cat->n++];
    memset(e, 0, sizeof *e);
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->shape[2] = d2;
    e->role = role;
    e->layer = layer;
    e->dst = dst;
    return e;
}

#define W(field) (m ? &(field) : NULL)

int dg_catalog_build(const struct dg_model_config *c, const enum dg_expert_layout *layout,
                     struct dg_model *m, struct dg_catalog *cat, struct dg_error *err)
{
    struct cat_builder b = {cat, 0, 0};
    const int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    const int64_t S = c->self_conditioning_size, E = c->num_experts, Im = c->moe_intermediate_size;

    memset(cat, 0, sizeof *cat);
    add(&b, W(m->embed), DG_CAT_PLAIN, -1, 2, V, H, 0, DEC "embed_tokens.weight");
    add(&b, W(m->final_norm), DG_CAT_PLAIN, -1, 1, H, 0, 0, DEC "norm.weight");
    add(&b, W(m->sc_pre_norm), DG_CAT_PLAIN, -1, 1, H, 0, 0, DEC "self_conditioning.pre_norm.weight");
    add(&b, W(m->sc_gate), DG_CAT_PLAIN, -1, 2, S, H, 0, DEC "self_conditioning.gate_proj.weight");
    add(&b, W(m->sc_up), DG_CAT_PLAIN, -1, 2, S, H, 0, DEC "self_conditioning.up_proj.weight");
    add(&b, W(m->sc_down), DG_CAT_PLAIN, -1, 2, H, S, 0, DEC "self_conditioning.down_proj.weight");

    for (int l = 0; l < c->num_layers; l++) {
        struct dg_layer_weights *L = m ? &m->layers[l] : NULL;
        const int64_t hd = dg_layer_head_dim(c, l), nkv = dg_layer_kv_heads(c, l);
        const int64_t nh = c->num_heads;
        const char *p = DEC "layers";

#define LW(field) (L ? &L->field : NULL)
        add(&b, LW(input_norm), DG_CAT_PLAIN, l, 1, H, 0, 0, "%s.%d.input_layernorm.weight", p, l);
        add(&b, LW(q_proj), DG_CAT_PLAIN, l, 2, nh * hd, H, 0, "%s.%d.self_attn.q_proj.weight", p, l);
        add(&b, LW(k_proj), DG_CAT_PLAIN, l, 2, nkv * hd, H, 0, "%s.%d.self_attn.k_proj.weight", p, l);
        if (c->layer_kind[l] == DG_LAYER_SLIDING)
            add(&b, LW(v_proj), DG_CAT_PLAIN, l, 2, nkv * hd, H, 0, "%s.%d.self_attn.v_proj.weight",
                p, l);
        add(&b, LW(o_proj), DG_CAT_PLAIN, l, 2, H, nh * hd, 0, "%s.%d.self_attn.o_proj.weight", p, l);
        add(&b, LW(q_norm), DG_CAT_PLAIN, l, 1, hd, 0, 0, "%s.%d.self_attn.q_norm.weight", p, l);
        add(&b, LW(k_norm), DG_CAT_PLAIN, l, 1, hd, 0, 0, "%s.%d.self_attn.k_norm.weight", p, l);
        add(&b, LW(post_attn_norm), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.post_attention_layernorm.weight", p, l);
        add(&b, LW(pre_ffn_norm), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.pre_feedforward_layernorm.weight", p, l);
        add(&b, LW(mlp_gate), DG_CAT_PLAIN, l, 2, I, H, 0, "%s.%d.mlp.gate_proj.weight", p, l);
        add(&b, LW(mlp_up), DG_CAT_PLAIN, l, 2, I, H, 0, "%s.%d.mlp.up_proj.weight", p, l);
        add(&b, LW(mlp_down), DG_CAT_PLAIN, l, 2, H, I, 0, "%s.%d.mlp.down_proj.weight", p, l);
        add(&b, LW(post_ffn_norm_1), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.post_feedforward_layernorm_1.weight", p, l);
        add(&b, LW(router_proj), DG_CAT_PLAIN, l, 2, E, H, 0, "%s.%d.router.proj.weight", p, l);
        add(&b, LW(router_scale), DG_CAT_PLAIN, l, 1, H, 0, 0, "%s.%d.router.scale", p, l);
        add(&b, LW(router_expert_scale), DG_CAT_PLAIN, l, 1, E, 0, 0,
            "%s.%d.router.per_expert_scale", p, l);
        add(&b, LW(pre_ffn_norm_2), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.pre_feedforward_layernorm_2.weight", p, l);
        if (!layout || layout[l] == DG_EXPERTS_PACKED) {
            add(&b, NULL, DG_CAT_BANK_GATE_UP, l, 3, E, 2 * Im, H, "%s.%d.experts.gate_up_proj", p, l);
            add(&b, NULL, DG_CAT_BANK_DOWN, l, 3, E, H, Im, "%s.%d.experts.down_proj", p, l);
        } else {
            for (int e = 0; e < E; e++) {
                add(&b, L ? &L->expert_gate[e] : NULL, DG_CAT_PLAIN, l, 2, Im, H, 0,
                    "%s.%d.experts.%d.gate_proj.weight", p, l, e);
                add(&b, L ? &L->expert_up[e] : NULL, DG_CAT_PLAIN, l, 2, Im, H, 0,
                    "%s.%d.experts.%d.up_proj.weight", p, l, e);
                add(&b, L ? &L->expert_down[e] : NULL, DG_CAT_PLAIN, l, 2, H, Im, 0,
                    "%s.%d.experts.%d.down_proj.weight", p, l, e);
            }
        }
        add(&b, LW(post_ffn_norm_2), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.post_feedforward_layernorm_2.weight", p, l);
        add(&b, LW(post_ffn_norm), DG_CAT_PLAIN, l, 1, H, 0, 0,
            "%s.%d.post_feedforward_layernorm.weight", p, l);
        add(&b, NULL, DG_CAT_SCALAR_DEC, l, 1, 1, 0, 0, "%s.%d.layer_scalar", p, l);
        add(&b, NULL, DG_CAT_SCALAR_ENC, l, 1, 1, 0, 0, ENC "layers.%d.layer_scalar", l);
#undef LW
    }
    if (b.failed) {
        dg_catalog_free(cat);
        return dg_error_set(err, DG_E_NOMEM, "out of memory building the tensor catalogue");
    }
    return 0;
}
#undef W

void dg_catalog_free(struct dg_catalog *cat)
{
    free(cat->entries);
    cat->entries = NULL;
    cat->n = 0;
}

/* ---- binding ----------------------------------------------------------- */

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

/* Levenshtein distance, capped: returns cap+1 as soon as it exceeds cap. */
static int edit_distance(const char *a, const char *b, int cap)
{
    size_t la = strlen(a), lb = strlen(b);
    int *row, best = 0;

    if ((la > lb ? la - lb : lb - la) > (size_t)cap)
        return cap + 1;
    row = malloc((lb + 1) * sizeof *row);
    if (!row)
        return cap + 1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0], rmin;
        row[0] = (int)i;
        rmin = row[0];
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v)
                v = up + 1;
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < rmin)
                rmin = v;
        }
        if (rmin > cap) {
            free(row);
            return cap + 1;
        }
    }
    best = row[lb];
    free(row);
    return best;
}

/* Which expert form does layer l use in this checkpoint? */
static int detect_layout(const struct dg_checkpoint *ck, int l, enum dg_expert_layout *out,
                         struct dg_error *err)
{
    char packed[128], per[128];
    int has_packed, has_per;

    snprintf(packed, sizeof packed, DEC "layers.%d.experts.gate_up_proj", l);
    snprintf(per, sizeof per, DEC "layers.%d.experts.0.gate_proj.weight", l);
    has_packed = dg_checkpoint_find(ck, packed) != NULL;
    has_per = dg_checkpoint_find(ck, per) != NULL;
    if (has_packed && has_per)
        return dg_error_set(err, DG_E_CONFIG,
                            "%s: layer %d has both packed expert banks and per-expert tensors",
                            ck->dir, l);
    *out = has_per ? DG_EXPERTS_PER_EXPERT : DG_EXPERTS_PACKED;
    return 0;
}

static int alloc_layers(struct dg_model *m)
{
    const struct dg_model_config *c = &m->cfg;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers)
        return -1;
    for (int l = 0; l < c->num_layers; l++) {
        struct dg_layer_weights *L = &m->layers[l];
        L->expert_gate = calloc((size_t)c->num_experts, sizeof *L->expert_gate);
        L->expert_up = calloc((size_t)c->num_experts, sizeof *L->expert_up);
        L->expert_down = calloc((size_t)c->num_experts, sizeof *L->expert_down);
        if (!L->expert_gate || !L->expert_up || !L->expert_down)
            return -1;
    }
    return 0;
}

static void set_view(struct dg_weight *w, const struct dg_st_tensor *t, const void *data,
                     int64_t rows, int64_t cols)
{
    w->data = data;
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->stride = 0;
    w->name = t->name;
}

/* An F8_E4M3 weight's "<name>_scale": [rows, 1] or [rows], a float
 * dtype, every value finite and >= 0; marked used and set on w. */
static int bind_scale(const struct dg_checkpoint *ck, const struct dg_cat_entry *e,
                      const char *file, struct dg_weight *w, unsigned char *used,
                      struct dg_error *err)
{
    char name[160];
    const struct dg_ckpt_tensor *sc;
    const struct dg_st_tensor *t;
    const int64_t rows = e->shape[0];

    snprintf(name, sizeof name, "%s_scale", e->name);
    if (!(sc = dg_checkpoint_find(ck, name)))
        return dg_error_set(err, DG_E_MISSING, "%s: tensor '%s' is F8_E4M3 but '%s' (its "
                            "per-channel scales) is missing", file, e->name, name);
    t = sc->t;
    used[sc - ck->tensors] = 1;
    if (!dg_dtype_is_float_weight(t->dtype))
        return dg_error_set(err, DG_E_DTYPE, "%s: tensor '%s': dtype %s is not supported for "
                            "scales (BF16, F16, F32)", dg_checkpoint_shard_name(ck, sc), name,
                            dg_dtype_name(t->dtype));
    if (!((t->ndim == 2 && t->shape[0] == rows && t->shape[1] == 1) ||
          (t->ndim == 1 && t->shape[0] == rows))) {
        char got[96];
        format_shape(got, sizeof got, t->ndim, t->shape);
        return dg_error_set(err, DG_E_SHAPE, "%s: tensor '%s': shape %s but '%s' needs [%lld, "
                            "1] (a scale per output channel)", dg_checkpoint_shard_name(ck, sc),
                            name, got, e->name, (long long)rows);
    }
    for (int64_t i = 0; i < rows; i++) {
        const float v = dg_load_f32(t->data, t->dtype, (size_t)i);
        if (!isfinite(v) || v < 0)
            return dg_error_set(err, DG_E_CONFIG, "%s: tensor '%s': scale %lld is %g (scales "
                                "must be finite and >= 0)", dg_checkpoint_shard_name(ck, sc),
                                name, (long long)i, (double)v);
    }
    w->scale = t->data;
    w->scale_dtype = t->dtype;
    return 0;
}

static int bind_entry(const struct dg_checkpoint *ck, struct dg_model *m,
                      const struct dg_cat_entry *e, const struct dg_ckpt_tensor *ct,
                      unsigned char *used, struct dg_error *err)
{
    const struct dg_st_tensor *t = ct->t;
    const char *file = dg_checkpoint_shard_name(ck, ct);
    char want[96], got[96];
    int same = t->ndim == e->ndim;

    for (int i = 0; same && i < e->ndim; i++)
        same = t->shape[i] == e->shape[i];
    if (!same) {
        format_shape(want, sizeof want, e->ndim, e->shape);
        format_shape(got, sizeof got, t->ndim, t->shape);
        return dg_error_set(err, DG_E_SHAPE,
                            "%s: tensor '%s': shape %s but the config needs %s", file, e->name,
                            got, want);
    }
    if (t->dtype == DG_DTYPE_F8_E4M3) {
        /* a matrix of its own (not a packed bank, not the embedding: a
         * gather table), in a checkpoint that says it is quantized */
        if (e->role != DG_CAT_PLAIN || e->ndim != 2 || e->dst == &m->embed)
            return dg_error_set(err, DG_E_DTYPE, "%s: tensor '%s': F8_E4M3 is supported for "
                                "per-tensor matrices only (%s)", file, e->name,
                                e->role != DG_CAT_PLAIN ? "experts as packed banks: store them "
                                                          "per expert"
                                : e->ndim != 2          ? "not a matrix"
                                                        : "the embedding stays in bf16");
        if (!m->cfg.fp8)
            return dg_error_set(err, DG_E_CONFIG, "%s: tensor '%s' is F8_E4M3 but config.json "
                                "has no FP8 quantization_config", file, e->name);
    } else if (!dg_dtype_is_float_weight(t->dtype)) {
        return dg_error_set(err, DG_E_DTYPE,
                            "%s: tensor '%s': dtype %s is not supported for weights (BF16, F16, "
                            "F32%s)", file, e->name, dg_dtype_name(t->dtype),
                            m->cfg.fp8 ? ", F8_E4M3 with scales" : "");
    }

    switch (e->role) {
    case DG_CAT_PLAIN:
        set_view(e->dst, t, t->data, e->ndim == 1 ? 1 : e->shape[0],
                 e->ndim == 1 ? e->shape[0] : e->shape[1]);
        if (t->dtype == DG_DTYPE_F8_E4M3)
            return bind_scale(ck, e, file, e->dst, used, err);
        break;
    case DG_CAT_BANK_GATE_UP: {
        struct dg_layer_weights *L = &m->layers[e->layer];
        const int64_t E = e->shape[0], Im = e->shape[1] / 2, H = e->shape[2];
        const size_t es = dg_dtype_size(t->dtype);
        L->experts_packed = 1;
        for (int64_t x = 0; x < E; x++) {
            const unsigned char *base = t->data + (size_t)(x * 2 * Im * H) * es;
            set_view(&L->expert_gate[x], t, base, Im, H);
            set_view(&L->expert_up[x], t, base + (size_t)(Im * H) * es, Im, H);
        }
        break;
    }
    case DG_CAT_BANK_DOWN: {
        struct dg_layer_weights *L = &m->layers[e->layer];
        const int64_t E = e->shape[0], H = e->shape[1], Im = e->shape[2];
        const size_t es = dg_dtype_size(t->dtype);
        for (int64_t x = 0; x < E; x++)
            set_view(&L->expert_down[x], t, t->data + (size_t)(x * H * Im) * es, H, Im);
        break;
    }
    case DG_CAT_SCALAR_ENC:
    case DG_CAT_SCALAR_DEC: {
        float v = dg_load_f32(t->data, t->dtype, 0);
        if (!isfinite(v))
            return dg_error_set(err, DG_E_CONFIG, "%s: tensor '%s': layer_scalar is not finite",
                                file, e->name);
        if (e->role == DG_CAT_SCALAR_ENC)
            m->layers[e->layer].scalar_encoder = v;
        else
            m->layers[e->layer].scalar_decoder = v;
        break;
    }
    }
    return 0;
}

/* The first missing tensor, with a hint if an unexpected one is close. */
static int report_missing(const struct dg_checkpoint *ck, const struct dg_cat_entry *e,
                          int n_missing, const unsigned char *used, struct dg_error *err)
{
    char want[96];
    const struct dg_ckpt_tensor *best = NULL;
    int best_d = 0, cap = (int)strlen(e->name) / 8 + 2;

    for (size_t i = 0; i < ck->n_tensors; i++) {
        int d;
        if (used[i] || dg_tensor_name_ignored(ck->tensors[i].name))
            continue;
        d = edit_distance(e->name, ck->tensors[i].name, cap);
        if (d <= cap && (!best || d < best_d)) {
            best = &ck->tensors[i];
            best_d = d;
        }
    }
    format_shape(want, sizeof want, e->ndim, e->shape);
    if (best)
        return dg_error_set(err, DG_E_MISSING,
                            "%s: missing tensor '%s' %s (%d missing in all); '%s' in %s looks "
                            "misnamed", ck->dir, e->name, want, n_missing, best->name,
                            dg_checkpoint_shard_name(ck, best));
    return dg_error_set(err, DG_E_MISSING, "%s: missing tensor '%s' %s (%d missing in all)",
                        ck->dir, e->name, want, n_missing);
}

static int is_scale_name(const char *name)
{
    const size_t n = strlen(name), k = strlen(".weight_scale");
    return n > k && strcmp(name + n - k, ".weight_scale") == 0;
}

static void count_stats(struct dg_model *m, const struct dg_checkpoint *ck,
                        const unsigned char *used)
{
    struct dg_model_stats *s = &m->stats;
    const struct dg_model_config *c = &m->cfg;
    uint64_t experts = 0;

    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dg_st_tensor *t = ck->tensors[i].t;
        if (!used[i]) {
            s->ignored_tensors++;
            s->ignored_bytes += t->end - t->begin;
            continue;
        }
        s->n_tensors++;
        s->bytes_by_dtype[t->dtype] += t->end - t->begin;
        if (is_scale_name(t->name))
            continue; /* an FP8 weight's scales: not parameters */
        s->params_total += t->nelem;
        if (strstr(t->name, ".experts."))
            experts += t->nelem;
    }
    s->params_embedding = (uint64_t)c->vocab_size * (uint64_t)c->hidden_size;
    s->params_experts = experts;
    s->params_active = s->params_total - experts +
                       experts / (uint64_t)c->num_experts * (uint64_t)c->top_k_experts;
}

int dg_model_bind(const struct dg_checkpoint *ck, struct dg_model *m, struct dg_error *err)
{
    enum dg_expert_layout layout[DG_MAX_LAYERS];
    struct dg_catalog cat = {0};
    unsigned char *used = NULL;
    int rc = 0, n_missing = 0, first_missing = -1;

    memset(m, 0, sizeof *m);
    m->cfg = ck->config;
    for (int l = 0; l < m->cfg.num_layers; l++)
        if ((rc = detect_layout(ck, l, &layout[l], err)) < 0)
            return rc;
    used = calloc(ck->n_tensors ? ck->n_tensors : 1, 1);
    if (!used || alloc_layers(m) < 0) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory binding %s", ck->dir);
        goto out;
    }
    if ((rc = dg_catalog_build(&m->cfg, layout, m, &cat, err)) < 0)
        goto out;

    for (int i = 0; i < cat.n; i++) {
        const struct dg_ckpt_tensor *ct = dg_checkpoint_find(ck, cat.entries[i].name);
        if (!ct) {
            if (n_missing++ == 0)
                first_missing = i;
            continue;
        }
        used[ct - ck->tensors] = 1;
        if ((rc = bind_entry(ck, m, &cat.entries[i], ct, used, err)) < 0)
            goto out;
    }
    if (n_missing) {
        rc = report_missing(ck, &cat.entries[first_missing], n_missing, used, err);
        goto out;
    }
    {
        size_t n_extra = 0, first_extra = 0;
        for (size_t i = 0; i < ck->n_tensors; i++)
            if (!used[i] && !dg_tensor_name_ignored(ck->tensors[i].name))
                if (n_extra++ == 0)
                    first_extra = i;
        if (n_extra) {
            const struct dg_ckpt_tensor *t = &ck->tensors[first_extra];
            rc = dg_error_set(err, DG_E_EXTRA,
                              "%s: unexpected tensor '%s' (%zu unexpected in all; not part of a "
                              "DiffusionGemma text model with this config)",
                              dg_checkpoint_shard_name(ck, t), t->name, n_extra);
            goto out;
        }
    }
    count_stats(m, ck, used);
out:
    dg_catalog_free(&cat);
    free(used);
    if (rc)
        dg_model_free(m);
    return rc;
}

int dg_model_has_fp8(const struct dg_model *m)
{
    const struct dg_weight *g[] = {&m->sc_gate, &m->sc_up, &m->sc_down};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (g[i]->dtype == DG_DTYPE_F8_E4M3)
            return 1;
    for (int l = 0; m->layers && l < m->cfg.num_layers; l++) {
        const struct dg_layer_weights *L = &m->layers[l];
        const struct dg_weight *w[] = {&L->q_proj,   &L->k_proj,   &L->v_proj,     &L->o_proj,
                                       &L->mlp_gate, &L->mlp_up,   &L->mlp_down,
                                       &L->router_proj};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->dtype == DG_DTYPE_F8_E4M3)
                return 1;
        for (int x = 0; x < m->cfg.num_experts; x++)
            if (L->expert_gate[x].dtype == DG_DTYPE_F8_E4M3 ||
                L->expert_up[x].dtype == DG_DTYPE_F8_E4M3 ||
                L->expert_down[x].dtype == DG_DTYPE_F8_E4M3)
                return 1;
    }
    return 0;
}

void dg_model_free(struct dg_model *m)
{
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_layers; l++) {
            free(m->layers[l].expert_gate);
            free(m->layers[l].expert_up);
            free(m->layers[l].expert_down);
        }
    }
    free(m->layers);
    memset(m, 0, sizeof *m);
}
