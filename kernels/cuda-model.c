/* cuda-model.c - the weights on one GPU (see cuda-model.h). */
#include "kernels/cuda-model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/cpu-forward.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"

#define ALIGN 256
#define STAGE_BYTES ((size_t)32 << 20)
#define MAX_PARTS 2

/* One device tensor: where its pointer goes, its size, and what fills it. */
struct entry {
    void **slot;
    uint64_t n;                       /* elements */
    int f32;                          /* fp32 (else bf16) */
    int ones;                         /* random mode: 1.0 (else N(0, 0.02)) */
    /* upload: the rows of parts[0], then of parts[1] ... (each of the
     * 'count' experts when bank > 0: part p of expert e is bank_parts[p][e]) */
    const struct dg_weight *parts[MAX_PARTS];
    int n_parts;
    const struct dg_weight *bank_parts[MAX_PARTS];
    int bank;
    const float *host;                /* or these n floats */
    uint64_t off;
};

struct plan {
    struct entry *e;
    int n, cap;
    uint64_t bytes;
    int elt_size;                     /* bytes of one (non-fp32) element */
};

static int add(struct plan *p, void **slot, uint64_t n, int f32, int ones, struct dg_error *err)
{
    struct entry *e;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        struct entry *ne = realloc(p->e, sizeof *ne * (size_t)cap);
        if (!ne)
            return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
        p->e = ne;
        p->cap = cap;
    }
    e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    e->slot = slot;
    e->n = n;
    e->f32 = f32;
    e->ones = ones;
    e->off = p->bytes;
    p->bytes += (n * (uint64_t)(f32 ? 4 : p->elt_size) + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    return 0;
}

/* Every tensor of cfg in a fixed order; with m, where each comes from. */
static int build_plan(struct dg_cuda_model *cm, const struct dg_model *m, struct plan *p,
                      struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    const uint64_t H = (uint64_t)c->hidden_size, V = (uint64_t)c->vocab_size;
    const uint64_t I = (uint64_t)c->intermediate_size, S = (uint64_t)c->self_conditioning_size;
    const uint64_t E = (uint64_t)c->num_experts, Im = (uint64_t)c->moe_intermediate_size;
    const uint64_t nh = (uint64_t)c->num_heads;
    int rc;
#define ADD(slot, n, f32, ones)                                                         \
    do {                                                                                \
        if ((rc = add(p, (void **)(slot), (n), (f32), (ones), err)) < 0)                \
            return rc;                                                                  \
    } while (0)
#define SRC(w) (p->e[p->n - 1].parts[p->e[p->n - 1].n_parts++] = (w))

    ADD(&cm->embed, V * H, 0, 0);
    if (m) SRC(&m->embed);
    ADD(&cm->final_norm, H, 0, 1);
    if (m) SRC(&m->final_norm);
    ADD(&cm->sc_pre_norm, H, 0, 1);
    if (m) SRC(&m->sc_pre_norm);
    ADD(&cm->sc_gu, 2 * S * H, 0, 0);
    if (m) { SRC(&m->sc_gate); SRC(&m->sc_up); }
    ADD(&cm->sc_down, H * S, 0, 0);
    if (m) SRC(&m->sc_down);
    ADD(&cm->inv_freq_sliding, (uint64_t)c->head_dim / 2, 1, 1);
    ADD(&cm->inv_freq_full, (uint64_t)c->global_head_dim / 2, 1, 1);
    for (int l = 0; l < c->num_layers; l++) {
        struct dg_cuda_layer *L = &cm->layers[l];
        const struct dg_layer_weights *w = m ? &m->layers[l] : NULL;
        const uint64_t hd = (uint64_t)L->hd, kvd = (uint64_t)L->nkv * hd;
#define VEC(field, n, src)                                                              \
        do {                                                                            \
            ADD(&L->field, (n), 0, 1);                                                  \
            if (w) SRC(&w->src);                                                        \
        } while (0)
        VEC(input_norm, H, input_norm);
        VEC(q_norm, hd, q_norm);
        VEC(k_norm, hd, k_norm);
        VEC(post_attn_norm, H, post_attn_norm);
        VEC(pre_ffn_norm, H, pre_ffn_norm);
        VEC(post_ffn_norm_1, H, post_ffn_norm_1);
        VEC(router_scale, H, router_scale);
        VEC(pre_ffn_norm_2, H, pre_ffn_norm_2);
        VEC(post_ffn_norm_2, H, post_ffn_norm_2);
        VEC(post_ffn_norm, H, post_ffn_norm);
#undef VEC
        ADD(&L->router_expert_scale, E, 1, 1);
        if (w) SRC(&w->router_expert_scale);
        ADD(&L->q_proj, nh * hd * H, 0, 0);
        if (w) SRC(&w->q_proj);
        ADD(&L->k_proj, kvd * H, 0, 0);
        if (w) SRC(&w->k_proj);
        if (L->sliding) {
            ADD(&L->v_proj, kvd * H, 0, 0);
            if (w) SRC(&w->v_proj);
        }
        ADD(&L->o_proj, H * nh * hd, 0, 0);
        if (w) SRC(&w->o_proj);
        ADD(&L->mlp_gu, 2 * I * H, 0, 0);
        if (w) { SRC(&w->mlp_gate); SRC(&w->mlp_up); }
        ADD(&L->mlp_down, H * I, 0, 0);
        if (w) SRC(&w->mlp_down);
        ADD(&L->router_proj, E * H, 0, 0);
        if (w) SRC(&w->router_proj);
        ADD(&L->exp_gu, E * 2 * Im * H, 0, 0);
        if (w) {
            struct entry *e = &p->e[p->n - 1];
            e->bank = (int)E;
            e->n_parts = 2;
            e->bank_parts[0] = w->expert_gate;
            e->bank_parts[1] = w->expert_up;
        }
        ADD(&L->exp_down, E * H * Im, 0, 0);
        if (w) {
            struct entry *e = &p->e[p->n - 1];
            e->bank = (int)E;
            e->n_parts = 1;
            e->bank_parts[0] = w->expert_down;
        }
    }
#undef SRC
#undef ADD
    return 0;
}

/* Rows of elements on their way to the device, in chunks. */
struct stager {
    unsigned char *buf;
    size_t cap, used;         /* elements */
    int f32;                  /* fp32 elements (else bf16) */
    unsigned char *dst;       /* device cursor */
    int dev;
};

static int stage_flush(struct stager *s, struct dg_error *err)
{
    const size_t es = s->f32 ? 4 : 2;
    int rc = 0;
    if (s->used) {
        rc = dg_cuda_upload(s->dst, s->buf, s->used * es, s->dev, err);
        s->dst += s->used * es;
        s->used = 0;
    }
    return rc;
}

/* Append w's rows (any dtype, any stride) as the stager's elements. */
static int stage_weight(struct stager *s, const struct dg_weight *w, struct dg_error *err)
{
    const int64_t stride = w->stride ? w->stride : w->cols;
    const size_t es = dg_dtype_size(w->dtype);
    int rc;
    if (!w->data)
        return dg_error_set(err, DG_E_INTERNAL, "cuda model: tensor %s has no data",
                            w->name ? w->name : "?");
    for (int64_t r = 0; r < w->rows; r++) {
        const unsigned char *row = (const unsigned char *)w->data + (size_t)(r * stride) * es;
        if (!s->f32 && w->dtype == DG_DTYPE_BF16) {
            /* the serving case: bf16 rows copied as they are */
            for (int64_t i = 0; i < w->cols;) {
                size_t n = (size_t)(w->cols - i);
                if (s->used == s->cap && (rc = stage_flush(s, err)) < 0)
                    return rc;
                if (n > s->cap - s->used)
                    n = s->cap - s->used;
                memcpy(s->buf + s->used * 2, row + (size_t)i * 2, n * 2);
                s->used += n;
                i += (int64_t)n;
            }
            continue;
        }
        for (int64_t i = 0; i < w->cols; i++) {
            if (s->used == s->cap && (rc = stage_flush(s, err)) < 0)
                return rc;
            if (s->f32)
                ((float *)(void *)s->buf)[s->used++] = dg_load_f32(row, w->dtype, (size_t)i);
            else
                ((uint16_t *)(void *)s->buf)[s->used++] =
                    dg_f32_to_bf16(dg_load_f32(row, w->dtype, (size_t)i));
        }
    }
    return 0;
}

static int fill_upload(struct dg_cuda_model *cm, const struct plan *p, struct dg_error *err)
{
    struct stager s = {0};
    float *tmp = NULL;
    int rc = 0;

    s.f32 = cm->elt == DG_ELT_F32;
    s.cap = STAGE_BYTES / (s.f32 ? 4 : 2);
    s.buf = malloc(STAGE_BYTES);
    s.dev = cm->dev;
    if (!s.buf)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory for the upload buffer");
    for (int i = 0; i < p->n && rc == 0; i++) {
        const struct entry *e = &p->e[i];
        s.dst = (unsigned char *)cm->arena + e->off;
        s.used = 0;
        if (e->f32) {
            /* fp32 vectors: the per-expert scale, the RoPE tables */
            free(tmp);
            tmp = calloc((size_t)(e->n ? e->n : 1), sizeof(float));
            if (!tmp) {
                rc = dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
                break;
            }
            if (e->n_parts)
                for (uint64_t j = 0; j < e->n; j++)
                    tmp[j] = dg_load_f32(e->parts[0]->data, e->parts[0]->dtype, (size_t)j);
            else if (e->host)
                memcpy(tmp, e->host, sizeof(float) * (size_t)e->n);
            rc = dg_cuda_upload(s.dst, tmp, sizeof(float) * (size_t)e->n, cm->dev, err);
            continue;
        }
        if (e->bank) {
            for (int x = 0; x < e->bank && rc == 0; x++)
                for (int q = 0; q < e->n_parts && rc == 0; q++)
                    rc = stage_weight(&s, &e->bank_parts[q][x], err);
        } else {
            for (int q = 0; q < e->n_parts && rc == 0; q++)
                rc = stage_weight(&s, e->parts[q], err);
        }
        if (rc == 0)
            rc = stage_flush(&s, err);
    }
    free(tmp);
    free(s.buf);
    return rc;
}

uint64_t dg_cuda_model_bytes(const struct dg_model_config *cfg, enum dg_elt elt)
{
    struct dg_cuda_model cm;
    struct plan p = {0};
    uint64_t bytes = 0;
    memset(&cm, 0, sizeof cm);
    p.elt_size = dg_elt_size(elt);
    cm.cfg = *cfg;
    cm.layers = calloc((size_t)cfg->num_layers, sizeof *cm.layers);
    if (!cm.layers)
        return 0;
    for (int l = 0; l < cfg->num_layers; l++) {
        cm.layers[l].hd = dg_layer_head_dim(cfg, l);
        cm.layers[l].nkv = dg_layer_kv_heads(cfg, l);
        cm.layers[l].sliding = cfg->layer_kind[l] == DG_LAYER_SLIDING;
    }
    if (build_plan(&cm, NULL, &p, NULL) == 0)
        bytes = p.bytes;
    free(p.e);
    free(cm.layers);
    return bytes;
}

/* Shapes, the arena, every pointer; then the RoPE tables and scalars. */
static int prepare(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                   const struct dg_model *m, enum dg_elt elt, int dev, struct plan *p,
                   struct dg_error *err)
{
    int rc;
    memset(cm, 0, sizeof *cm);
    if (elt != DG_ELT_BF16 && elt != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "cuda model: element type %d", (int)elt);
    cm->cfg = *cfg;
    cm->dev = dev;
    cm->elt = elt;
    p->elt_size = dg_elt_size(elt);
    /* the scale as transformers computes it in the checkpoint's dtype */
    cm->embed_scale = dg_embed_scale(cfg->hidden_size, m ? m->embed.dtype : DG_DTYPE_BF16);
    cm->layers = calloc((size_t)cfg->num_layers, sizeof *cm->layers);
    if (!cm->layers)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
    for (int l = 0; l < cfg->num_layers; l++) {
        struct dg_cuda_layer *L = &cm->layers[l];
        L->hd = dg_layer_head_dim(cfg, l);
        L->nkv = dg_layer_kv_heads(cfg, l);
        L->sliding = cfg->layer_kind[l] == DG_LAYER_SLIDING;
        L->scalar_encoder = m ? m->layers[l].scalar_encoder : 1.0f;
        L->scalar_decoder = m ? m->layers[l].scalar_decoder : 1.0f;
    }
    if ((rc = build_plan(cm, m, p, err)) < 0)
        return rc;
    if ((rc = dg_cuda_alloc(&cm->arena, (size_t)p->bytes, dev, err)) < 0) {
        dg_error_prefix(err, "cuda model: %.1f GiB of weights", (double)p->bytes / (1 << 30));
        return rc;
    }
    cm->bytes = p->bytes;
    for (int i = 0; i < p->n; i++)
        *p->e[i].slot = (unsigned char *)cm->arena + p->e[i].off;
    for (int l = 0; l < cfg->num_layers; l++)
        cm->layers[l].inv_freq =
            cm->layers[l].sliding ? cm->inv_freq_sliding : cm->inv_freq_full;
    return 0;
}

/* The RoPE tables (computed on the host as the CPU does) in their slots. */
static int upload_rope(struct dg_cuda_model *cm, struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    float *fs = malloc(sizeof(float) * (size_t)(c->head_dim / 2 + 1));
    float *ff = malloc(sizeof(float) * (size_t)(c->global_head_dim / 2 + 1));
    int rc;
    if (!fs || !ff) {
        free(fs);
        free(ff);
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
    }
    dg_rope_inv_freq(&c->rope_sliding, c->head_dim, fs);
    dg_rope_inv_freq(&c->rope_full, c->global_head_dim, ff);
    rc = dg_cuda_upload(cm->inv_freq_sliding, fs, sizeof(float) * (size_t)(c->head_dim / 2),
                        cm->dev, err);
    if (rc == 0)
        rc = dg_cuda_upload(cm->inv_freq_full, ff, sizeof(float) * (size_t)(c->global_head_dim / 2),
                            cm->dev, err);
    free(fs);
    free(ff);
    return rc;
}

int dg_cuda_model_upload(struct dg_cuda_model *cm, const struct dg_model *m, enum dg_elt elt,
                         int dev, struct dg_error *err)
{
    struct plan p = {0};
    int rc = prepare(cm, &m->cfg, m, elt, dev, &p, err);
    if (rc == 0)
        rc = fill_upload(cm, &p, err);
    if (rc == 0)
        rc = upload_rope(cm, err);
    if (rc == 0)
        rc = dg_cuda_sync(dev, err); /* (pageable copies may still be in flight) */
    free(p.e);
    if (rc < 0)
        dg_cuda_model_free(cm);
    return rc;
}

int dg_cuda_model_random(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                         uint64_t seed, int dev, struct dg_error *err)
{
    struct plan p = {0};
    float *ones = NULL;
    int rc = prepare(cm, cfg, NULL, DG_ELT_BF16, dev, &p, err);

    for (int i = 0; i < p.n && rc == 0; i++) {
        const struct entry *e = &p.e[i];
        void *dst = (unsigned char *)cm->arena + e->off;
        if (e->f32) {
            /* per-expert scales 1 (the RoPE tables come next) */
            free(ones);
            ones = malloc(sizeof(float) * (size_t)(e->n ? e->n : 1));
            if (!ones) {
                rc = dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
                break;
            }
            for (uint64_t j = 0; j < e->n; j++)
                ones[j] = 1.0f;
            rc = dg_cuda_upload(dst, ones, sizeof(float) * (size_t)e->n, dev, err);
        } else {
            rc = dg_cuda_fill_normal(dst, (int64_t)e->n, seed, (uint32_t)i, e->ones ? 1.0f : 0.0f,
                                     e->ones ? 0.0f : 0.02f, NULL, dev, err);
        }
    }
    free(ones);
    if (rc == 0)
        rc = upload_rope(cm, err);
    if (rc == 0)
        rc = dg_cuda_sync(dev, err);
    free(p.e);
    if (rc < 0)
        dg_cuda_model_free(cm);
    return rc;
}

void dg_cuda_model_free(struct dg_cuda_model *cm)
{
    dg_cuda_free(cm->arena);
    free(cm->layers);
    memset(cm, 0, sizeof *cm);
}
