/* cuda-model.c - the weights on one GPU (see cuda-model.h). */
#include "kernels/cuda-model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/ops.h"
#include "lib/cpu-forward.h"
#include "lib/dtype.h"
#include "lib/grow.h"
#include "lib/ref-ops.h"

#define ALIGN 256
#define STAGE_BYTES ((size_t)32 << 20)
#define MAX_PARTS 2

/* A rectangle of a tensor seen as 2-D [R, C]: rows r0 .. r0+nr-1,
 * columns c0 .. c0+nc-1. */
struct rect {
    int64_t r0, nr, c0, nc;
};

/* One device tensor: where its pointer goes, the whole tensor's shape as
 * [R, C], the rectangles of it this rank holds (in order, concatenated),
 * and where the whole tensor's rows come from. */
struct entry {
    void **slot;
    int64_t R, C;
    int f32;                          /* fp32 (else elements of the model's type) */
    int q8;                           /* E4M3 bytes (FP8), its row scales in entry scale_entry-1 */
    int scale_entry;
    int scales_of;                    /* an fp32 entry of row scales of matrix entry scales_of-1 */
    int ones;                         /* random mode: 1.0 (else N(0, 0.02)) */
    int rect0, n_rects;               /* in plan.rects; none: the whole tensor */
    uint64_t n;                       /* elements held */
    uint64_t off;
    /* upload: the rows of parts[0], then of parts[1] ... (bank > 0: for
     * each of the bank's experts x, the rows of bank_parts[p][x] in p
     * order) */
    const struct dg_weight *parts[MAX_PARTS];
    int n_parts;
    const struct dg_weight *bank_parts[MAX_PARTS];
    int bank;
};

struct plan {
    struct entry *e;
    int n;
    size_t cap;
    struct rect *rects;
    int n_rects;
    size_t rects_cap;
    uint64_t bytes;
    int elt_size;                     /* bytes of one (non-fp32) element */
    int fp8_all;                      /* no checkpoint: every matrix Q8 marks is FP8 */
};

static int add(struct plan *p, void **slot, int64_t R, int64_t C, int f32, int ones,
               struct dg_error *err)
{
    struct entry *e = dg_grow(p->e, &p->cap, (size_t)p->n + 1, sizeof *e, 64);
    if (!e)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
    p->e = e;
    e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    e->slot = slot;
    e->R = R;
    e->C = C;
    e->f32 = f32;
    e->ones = ones;
    e->rect0 = p->n_rects;
    return 0;
}

/* Append a rectangle to the pool. */
static int push_rect(struct plan *p, struct rect r, struct dg_error *err)
{
    struct rect *nr = dg_grow(p->rects, &p->rects_cap, (size_t)p->n_rects + 1, sizeof *nr, 256);
    if (!nr)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
    p->rects = nr;
    p->rects[p->n_rects++] = r;
    return 0;
}

/* A rectangle of the last tensor added (each tensor's are contiguous in
 * the pool: they are added right after it). */
static int add_rect(struct plan *p, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                    struct dg_error *err)
{
    int rc = push_rect(p, (struct rect){r0, nr, c0, nc}, err);
    if (rc == 0)
        p->e[p->n - 1].n_rects++;
    return rc;
}

/* Sizes and offsets, once every tensor is in (a tensor without rectangles
 * is held whole: one rectangle appended for it).  The arena holds the
 * tensors in the plan's order, the FP8 scales after all of them (in their
 * order), so matrices added one after another are adjacent (a layer's q,
 * k and v projections: one GEMM reads them as one where the sizes keep
 * them adjacent, cuda-forward.c), and so are their scales. */
static int finish_plan(struct plan *p, struct dg_error *err)
{
    int rc;
    p->bytes = 0;
    for (int i = 0; i < p->n; i++) {
        struct entry *e = &p->e[i];
        if (e->scales_of)
            continue; /* (placed after the tensors, below) */
        if (e->n_rects == 0) {
            e->rect0 = p->n_rects;
            if ((rc = push_rect(p, (struct rect){0, e->R, 0, e->C}, err)) < 0)
                return rc;
            e->n_rects = 1;
        }
        e->n = 0;
        for (int k = 0; k < e->n_rects; k++)
            e->n += (uint64_t)(p->rects[e->rect0 + k].nr * p->rects[e->rect0 + k].nc);
        e->off = p->bytes;
        p->bytes += (e->n * (uint64_t)(e->f32 ? 4 : e->q8 ? 1 : p->elt_size) + ALIGN - 1) &
                    ~(uint64_t)(ALIGN - 1);
    }
    for (int i = 0; i < p->n; i++) {
        struct entry *e = &p->e[i];
        const struct entry *mx;
        if (!e->scales_of)
            continue;
        /* one fp32 scale per row its matrix holds */
        mx = &p->e[e->scales_of - 1];
        e->n = 0;
        for (int k = 0; k < mx->n_rects; k++)
            e->n += (uint64_t)p->rects[mx->rect0 + k].nr;
        e->off = p->bytes;
        p->bytes += (e->n * 4 + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    }
    return 0;
}

/* This rank's share of the plan into cm's fields (the whole model without
 * a plan).  Errors: DG_E_INVAL (a rank outside the plan, a split whose
 * query heads do not map onto its KV heads as a whole group). */
static int take_share(struct dg_cuda_model *cm, const struct dg_tp_plan *tp, int rank,
                      struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    const struct dg_tp_rank *k;
    if (!tp) {
        cm->rank = 0;
        cm->n_ranks = 1;
        cm->v0 = 0;
        cm->nv = c->vocab_size;
        cm->q0 = 0;
        cm->nq = c->num_heads;
        cm->mlp0 = 0;
        cm->mlp_w = c->intermediate_size;
        cm->e0 = 0;
        cm->n_exp = c->num_experts;
        cm->exp0 = 0;
        cm->exp_w = c->moe_intermediate_size;
        for (int l = 0; l < c->num_layers; l++) {
            cm->layers[l].kv0 = 0;
            cm->layers[l].nkv = dg_layer_kv_heads(c, l);
        }
        return 0;
    }
    if (rank < 0 || rank >= tp->n_ranks)
        return dg_error_set(err, DG_E_INVAL, "cuda model: rank %d of %d", rank, tp->n_ranks);
    k = &tp->rank[rank];
    cm->rank = rank;
    cm->n_ranks = tp->n_ranks;
    cm->v0 = k->vocab.begin;
    cm->nv = dg_tp_len(k->vocab);
    cm->q0 = (int)k->q_heads.begin;
    cm->nq = (int)dg_tp_len(k->q_heads);
    cm->mlp0 = (int)k->mlp.begin;
    cm->mlp_w = (int)dg_tp_len(k->mlp);
    cm->e0 = (int)k->experts.begin;
    cm->n_exp = (int)dg_tp_len(k->experts);
    cm->exp0 = (int)k->expert_width.begin;
    cm->exp_w = (int)dg_tp_len(k->expert_width);
    for (int l = 0; l < c->num_layers; l++) {
        const int full = c->layer_kind[l] == DG_LAYER_FULL;
        const struct dg_tp_range kv = dg_tp_kv(tp, rank, full);
        const int group = c->num_heads / dg_layer_kv_heads(c, l);
        cm->layers[l].kv0 = (int)kv.begin;
        cm->layers[l].nkv = (int)dg_tp_len(kv);
        /* the attention kernel maps local query head j to local KV head
         * j / (nq / nkv): that must be the global (q0 + j) / group - kv0 */
        for (int j = 0; j < cm->nq; j++)
            if (cm->nq % cm->layers[l].nkv ||
                j / (cm->nq / cm->layers[l].nkv) != (cm->q0 + j) / group - (int)kv.begin)
                return dg_error_set(err, DG_E_INVAL, "cuda model: rank %d of %d: query heads "
                                    "%d..%d do not cover whole KV groups of %d in layer %d",
                                    rank, tp->n_ranks, cm->q0, cm->q0 + cm->nq - 1, group, l);
    }
    return 0;
}

/* The last tensor added is a matrix that may be FP8: it is when its
 * checkpoint tensors are F8_E4M3 (without a checkpoint: when the plan is
 * FP8 throughout); then it is marked and an entry for its row scales,
 * whose pointer goes to *sslot, follows it. */
static int mark_q8(struct plan *p, float **sslot, struct dg_error *err)
{
    const int mi = p->n - 1;
    const struct entry *e = &p->e[mi];
    const struct dg_weight *src = e->bank ? &e->bank_parts[0][0]
                                  : e->n_parts ? e->parts[0] : NULL;
    int rc;
    if (src ? src->dtype != DG_DTYPE_F8_E4M3 : !p->fp8_all)
        return 0;
    if ((rc = add(p, (void **)sslot, 0, 0, 1, 0, err)) < 0)
        return rc;
    p->e[mi].q8 = 1;
    p->e[mi].scale_entry = p->n;
    p->e[p->n - 1].scales_of = mi + 1;
    return 0;
}

/* Every tensor of cfg in a fixed order (the random mode's tensor ids), the
 * rectangles cm's share holds; with m, where each comes from. */
static int build_plan(struct dg_cuda_model *cm, const struct dg_model *m, struct plan *p,
                      struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    const int64_t I = c->intermediate_size, S = c->self_conditioning_size;
    const int64_t E = c->num_experts, Im = c->moe_intermediate_size;
    const int64_t nh = c->num_heads;
    int rc;
#define ADD(slot, R, C, f32, ones)                                                      \
    do {                                                                                \
        if ((rc = add(p, (void **)(slot), (R), (C), (f32), (ones), err)) < 0)           \
            return rc;                                                                  \
    } while (0)
#define RECT(r0, nr, c0, nc)                                                            \
    do {                                                                                \
        if ((rc = add_rect(p, (r0), (nr), (c0), (nc), err)) < 0)                        \
            return rc;                                                                  \
    } while (0)
#define SRC(w) (p->e[p->n - 1].parts[p->e[p->n - 1].n_parts++] = (w))
#define Q8(sslot)                                                                       \
    do {                                                                                \
        if ((rc = mark_q8(p, (sslot), err)) < 0)                                        \
            return rc;                                                                  \
    } while (0)

    ADD(&cm->embed, V, H, 0, 0);
    RECT(cm->v0, cm->nv, 0, H);
    if (m) SRC(&m->embed);
    ADD(&cm->final_norm, 1, H, 0, 1);
    if (m) SRC(&m->final_norm);
    ADD(&cm->sc_pre_norm, 1, H, 0, 1);
    if (m) SRC(&m->sc_pre_norm);
    ADD(&cm->sc_gu, 2 * S, H, 0, 0);
    if (m) { SRC(&m->sc_gate); SRC(&m->sc_up); }
    Q8(&cm->sc_gu_s);
    ADD(&cm->sc_down, H, S, 0, 0);
    if (m) SRC(&m->sc_down);
    Q8(&cm->sc_down_s);
    ADD(&cm->inv_freq_sliding, 1, c->head_dim / 2, 1, 1);
    ADD(&cm->inv_freq_full, 1, c->global_head_dim / 2, 1, 1);
    for (int l = 0; l < c->num_layers; l++) {
        struct dg_cuda_layer *L = &cm->layers[l];
        const struct dg_layer_weights *w = m ? &m->layers[l] : NULL;
        const int64_t hd = L->hd, nkv_all = dg_layer_kv_heads(c, l);
#define VEC(field, n, src)                                                              \
        do {                                                                            \
            ADD(&L->field, 1, (n), 0, 1);                                               \
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
        ADD(&L->router_expert_scale, 1, E, 1, 1);
        if (w) SRC(&w->router_expert_scale);
        ADD(&L->q_proj, nh * hd, H, 0, 0);
        RECT(cm->q0 * hd, cm->nq * hd, 0, H);
        if (w) SRC(&w->q_proj);
        Q8(&L->q_proj_s);
        ADD(&L->k_proj, nkv_all * hd, H, 0, 0);
        RECT(L->kv0 * hd, L->nkv * hd, 0, H);
        if (w) SRC(&w->k_proj);
        Q8(&L->k_proj_s);
        if (L->sliding) {
            ADD(&L->v_proj, nkv_all * hd, H, 0, 0);
            RECT(L->kv0 * hd, L->nkv * hd, 0, H);
            if (w) SRC(&w->v_proj);
            Q8(&L->v_proj_s);
        }
        ADD(&L->o_proj, H, nh * hd, 0, 0);
        RECT(0, H, cm->q0 * hd, cm->nq * hd);
        if (w) SRC(&w->o_proj);
        Q8(&L->o_proj_s);
        ADD(&L->mlp_gu, 2 * I, H, 0, 0);
        RECT(cm->mlp0, cm->mlp_w, 0, H);
        RECT(I + cm->mlp0, cm->mlp_w, 0, H);
        if (w) { SRC(&w->mlp_gate); SRC(&w->mlp_up); }
        Q8(&L->mlp_gu_s);
        ADD(&L->mlp_down, H, I, 0, 0);
        RECT(0, H, cm->mlp0, cm->mlp_w);
        if (w) SRC(&w->mlp_down);
        Q8(&L->mlp_down_s);
        ADD(&L->router_proj, E, H, 0, 0);
        if (w) SRC(&w->router_proj);
        /* the expert banks as [E * 2Im, H] and [E * H, Im] */
        ADD(&L->exp_gu, E * 2 * Im, H, 0, 0);
        for (int64_t x = cm->e0; x < cm->e0 + cm->n_exp; x++) {
            RECT(x * 2 * Im + cm->exp0, cm->exp_w, 0, H);
            RECT(x * 2 * Im + Im + cm->exp0, cm->exp_w, 0, H);
        }
        if (w) {
            struct entry *e = &p->e[p->n - 1];
            e->bank = (int)E;
            e->n_parts = 2;
            e->bank_parts[0] = w->expert_gate;
            e->bank_parts[1] = w->expert_up;
        }
        Q8(&L->exp_gu_s);
        ADD(&L->exp_down, E * H, Im, 0, 0);
        if (cm->exp_w == Im)
            RECT(cm->e0 * H, cm->n_exp * H, 0, Im);
        else
            for (int64_t x = cm->e0; x < cm->e0 + cm->n_exp; x++)
                RECT(x * H, H, cm->exp0, cm->exp_w);
        if (w) {
            struct entry *e = &p->e[p->n - 1];
            e->bank = (int)E;
            e->n_parts = 1;
            e->bank_parts[0] = w->expert_down;
        }
        Q8(&L->exp_down_s);
    }
#undef Q8
#undef SRC
#undef RECT
#undef ADD
    return finish_plan(p, err);
}

/* Elements on their way to the device, in chunks. */
struct stager {
    unsigned char *buf;
    size_t cap, used;         /* elements */
    int es;                   /* bytes an element: 4 fp32, 2 bf16, 1 E4M3 (copied as stored) */
    unsigned char *dst;       /* device cursor */
    int dev;
};

static int stage_flush(struct stager *s, struct dg_error *err)
{
    const size_t es = (size_t)s->es;
    int rc = 0;
    if (s->used) {
        rc = dg_cuda_upload(s->dst, s->buf, s->used * es, s->dev, err);
        s->dst += s->used * es;
        s->used = 0;
    }
    return rc;
}

/* Append columns c0 .. c0+nc-1 of row r of w (any dtype, any stride) as
 * the stager's elements. */
static int stage_row(struct stager *s, const struct dg_weight *w, int64_t r, int64_t c0,
                     int64_t nc, struct dg_error *err)
{
    const int64_t stride = w->stride ? w->stride : w->cols;
    const size_t es = dg_dtype_size(w->dtype);
    const unsigned char *row;
    int rc;
    if (!w->data)
        return dg_error_set(err, DG_E_INTERNAL, "cuda model: tensor %s has no data",
                            w->name ? w->name : "?");
    if (r < 0 || r >= w->rows || c0 < 0 || c0 + nc > w->cols)
        return dg_error_set(err, DG_E_INTERNAL, "cuda model: tensor %s: row %lld, columns "
                            "%lld+%lld outside [%lld, %lld]", w->name ? w->name : "?",
                            (long long)r, (long long)c0, (long long)nc, (long long)w->rows,
                            (long long)w->cols);
    row = (const unsigned char *)w->data + (size_t)(r * stride) * es;
    if (s->es == 1 && w->dtype != DG_DTYPE_F8_E4M3)
        return dg_error_set(err, DG_E_UNSUPPORTED, "cuda model: tensor %s is %s where the rest "
                            "of its matrix is F8_E4M3", w->name ? w->name : "?",
                            dg_dtype_name(w->dtype));
    if ((s->es == 2 && w->dtype == DG_DTYPE_BF16) || s->es == 1) {
        /* the serving cases: bf16, or E4M3 bytes, copied as they are */
        for (int64_t i = c0; i < c0 + nc;) {
            size_t n = (size_t)(c0 + nc - i);
            if (s->used == s->cap && (rc = stage_flush(s, err)) < 0)
                return rc;
            if (n > s->cap - s->used)
                n = s->cap - s->used;
            memcpy(s->buf + s->used * es, row + (size_t)i * es, n * es);
            s->used += n;
            i += (int64_t)n;
        }
        return 0;
    }
    if (w->dtype == DG_DTYPE_F8_E4M3)
        return dg_error_set(err, DG_E_UNSUPPORTED, "cuda model: tensor %s is F8_E4M3 where "
                            "the rest of its matrix is not", w->name ? w->name : "?");
    for (int64_t i = c0; i < c0 + nc; i++) {
        if (s->used == s->cap && (rc = stage_flush(s, err)) < 0)
            return rc;
        if (s->es == 4)
            ((float *)(void *)s->buf)[s->used++] = dg_load_f32(row, w->dtype, (size_t)i);
        else
            ((uint16_t *)(void *)s->buf)[s->used++] =
                dg_f32_to_bf16(dg_load_f32(row, w->dtype, (size_t)i));
    }
    return 0;
}

/* The source of row g of e's whole tensor: a weight and its row. */
static const struct dg_weight *source_row(const struct entry *e, int64_t g, int64_t *row)
{
    if (e->bank) {
        int64_t per = 0;
        for (int q = 0; q < e->n_parts; q++)
            per += e->bank_parts[q][0].rows;
        {
            const int64_t x = g / per;
            int64_t rr = g % per;
            for (int q = 0; q < e->n_parts; q++) {
                const struct dg_weight *w = &e->bank_parts[q][x];
                if (rr < w->rows) {
                    *row = rr;
                    return w;
                }
                rr -= w->rows;
            }
        }
        return NULL;
    }
    for (int q = 0; q < e->n_parts; q++) {
        if (g < e->parts[q]->rows) {
            *row = g;
            return e->parts[q];
        }
        g -= e->parts[q]->rows;
    }
    return NULL;
}

static int fill_upload(struct dg_cuda_model *cm, const struct plan *p, struct dg_error *err)
{
    struct stager s = {0};
    float *tmp = NULL;
    int rc = 0;

    s.buf = malloc(STAGE_BYTES);
    s.dev = cm->dev;
    if (!s.buf)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory for the upload buffer");
    for (int i = 0; i < p->n && rc == 0; i++) {
        const struct entry *e = &p->e[i];
        s.dst = (unsigned char *)cm->arena + e->off;
        s.used = 0;
        s.es = e->q8 ? 1 : cm->elt == DG_ELT_F32 ? 4 : 2;
        s.cap = STAGE_BYTES / (size_t)s.es;
        if (e->scales_of) {
            /* the matrix's row scales, in the order its rows are held */
            const struct entry *mx = &p->e[e->scales_of - 1];
            uint64_t j = 0;
            free(tmp);
            tmp = malloc(sizeof(float) * (size_t)(e->n ? e->n : 1));
            if (!tmp) {
                rc = dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
                break;
            }
            for (int k = 0; k < mx->n_rects && rc == 0; k++) {
                const struct rect *r = &p->rects[mx->rect0 + k];
                for (int64_t g = r->r0; g < r->r0 + r->nr && rc == 0; g++) {
                    int64_t row = 0;
                    const struct dg_weight *w = source_row(mx, g, &row);
                    if (!w || !w->scale)
                        rc = dg_error_set(err, DG_E_INTERNAL, "cuda model: no scale for row "
                                          "%lld of tensor %d", (long long)g, e->scales_of - 1);
                    else
                        tmp[j++] = dg_load_f32(w->scale, w->scale_dtype, (size_t)row);
                }
            }
            if (rc == 0)
                rc = dg_cuda_upload(s.dst, tmp, sizeof(float) * (size_t)e->n, cm->dev, err);
            continue;
        }
        if (e->f32) {
            /* fp32 vectors, whole: the per-expert scale, the RoPE tables */
            free(tmp);
            tmp = calloc((size_t)(e->n ? e->n : 1), sizeof(float));
            if (!tmp) {
                rc = dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
                break;
            }
            if (e->n_parts)
                for (uint64_t j = 0; j < e->n; j++)
                    tmp[j] = dg_load_f32(e->parts[0]->data, e->parts[0]->dtype, (size_t)j);
            rc = dg_cuda_upload(s.dst, tmp, sizeof(float) * (size_t)e->n, cm->dev, err);
            continue;
        }
        for (int k = 0; k < e->n_rects && rc == 0; k++) {
            const struct rect *r = &p->rects[e->rect0 + k];
            for (int64_t g = r->r0; g < r->r0 + r->nr && rc == 0; g++) {
                int64_t row = 0;
                const struct dg_weight *w = source_row(e, g, &row);
                rc = w ? stage_row(&s, w, row, r->c0, r->nc, err)
                       : dg_error_set(err, DG_E_INTERNAL, "cuda model: tensor %d has no row "
                                      "%lld", i, (long long)g);
            }
        }
        if (rc == 0)
            rc = stage_flush(&s, err);
    }
    free(tmp);
    free(s.buf);
    return rc;
}

/* Shapes only: a model struct with its layers and share, no arena. */
static int shape(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                 const struct dg_tp_plan *tp, int rank, struct dg_error *err)
{
    cm->cfg = *cfg;
    cm->layers = calloc((size_t)cfg->num_layers, sizeof *cm->layers);
    if (!cm->layers)
        return dg_error_set(err, DG_E_NOMEM, "cuda model: out of memory");
    for (int l = 0; l < cfg->num_layers; l++) {
        cm->layers[l].hd = dg_layer_head_dim(cfg, l);
        cm->layers[l].sliding = cfg->layer_kind[l] == DG_LAYER_SLIDING;
    }
    return take_share(cm, tp, rank, err);
}

uint64_t dg_cuda_model_bytes_rank(const struct dg_model_config *cfg, enum dg_elt elt,
                                  const struct dg_tp_plan *tp, int rank)
{
    struct dg_cuda_model cm;
    struct plan p = {0};
    uint64_t bytes = 0;
    memset(&cm, 0, sizeof cm);
    p.elt_size = dg_elt_size(elt);
    if (shape(&cm, cfg, tp, rank, NULL) == 0 && build_plan(&cm, NULL, &p, NULL) == 0)
        bytes = p.bytes;
    free(p.e);
    free(p.rects);
    free(cm.layers);
    return bytes;
}

uint64_t dg_cuda_model_bytes(const struct dg_model_config *cfg, enum dg_elt elt)
{
    return dg_cuda_model_bytes_rank(cfg, elt, NULL, 0);
}

/* Shapes, the arena, every pointer; then the RoPE tables and scalars. */
/* An FP8 matrix as this rank holds it must fit the FP8 GEMM (each call's
 * N a multiple of 64, K of 16). */
static int fits(const char *what, int l, int64_t N, int64_t K, const void *scales, int dev,
                struct dg_error *err)
{
    char where[32] = "";
    if (!scales || dg_cuda_fp8_gemm_fits(N, K))
        return 0;
    if (l >= 0)
        snprintf(where, sizeof where, " of layer %d", l);
    return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: FP8 %s%s is [%lld x %lld] here; the "
                        "FP8 GEMM needs rows a multiple of 64 and columns of 16 (this model or "
                        "split runs FP8 on the CPU backend)", dev, what, where, (long long)N,
                        (long long)K);
}

static int check_fp8_shapes(const struct dg_cuda_model *cm, struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    const int64_t H = c->hidden_size, S = c->self_conditioning_size;
    int rc;
    if ((rc = fits("self-conditioning gate/up", -1, 2 * S, H, cm->sc_gu_s, cm->dev, err)) < 0 ||
        (rc = fits("self-conditioning down", -1, H, S, cm->sc_down_s, cm->dev, err)) < 0)
        return rc;
    for (int l = 0; l < c->num_layers; l++) {
        const struct dg_cuda_layer *L = &cm->layers[l];
        const int64_t qd = (int64_t)cm->nq * L->hd, kvd = (int64_t)L->nkv * L->hd;
        if ((rc = fits("q_proj", l, qd, H, L->q_proj_s, cm->dev, err)) < 0 ||
            (rc = fits("k_proj", l, kvd, H, L->k_proj_s, cm->dev, err)) < 0 ||
            (rc = fits("v_proj", l, kvd, H, L->v_proj_s, cm->dev, err)) < 0 ||
            (rc = fits("o_proj", l, H, qd, L->o_proj_s, cm->dev, err)) < 0 ||
            (rc = fits("mlp gate/up", l, 2 * (int64_t)cm->mlp_w, H, L->mlp_gu_s, cm->dev,
                       err)) < 0 ||
            (rc = fits("mlp down", l, H, cm->mlp_w, L->mlp_down_s, cm->dev, err)) < 0 ||
            (rc = fits("expert gate/up", l, 2 * (int64_t)cm->exp_w, H, L->exp_gu_s, cm->dev,
                       err)) < 0 ||
            (rc = fits("expert down", l, H, cm->exp_w, L->exp_down_s, cm->dev, err)) < 0)
            return rc;
    }
    return 0;
}

static int prepare(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                   const struct dg_model *m, enum dg_elt elt, int fp8, const struct dg_tp_plan *tp,
                   int rank, int dev, struct plan *p, struct dg_error *err)
{
    int rc;
    memset(cm, 0, sizeof *cm);
    if ((elt != DG_ELT_BF16 && elt != DG_ELT_F32) || (fp8 && elt != DG_ELT_BF16))
        return dg_error_set(err, DG_E_INVAL, "cuda model: element type %d%s", (int)elt,
                            fp8 ? " with FP8 weights" : "");
    cm->dev = dev;
    cm->elt = elt;
    p->elt_size = dg_elt_size(elt);
    p->fp8_all = fp8 && !m;
    /* the scale as transformers computes it in the checkpoint's dtype */
    cm->embed_scale = dg_embed_scale(cfg->hidden_size, m ? m->embed.dtype : DG_DTYPE_BF16);
    if ((rc = shape(cm, cfg, tp, rank, err)) < 0)
        return rc;
    for (int l = 0; l < cfg->num_layers; l++) {
        cm->layers[l].scalar_encoder = m ? m->layers[l].scalar_encoder : 1.0f;
        cm->layers[l].scalar_decoder = m ? m->layers[l].scalar_decoder : 1.0f;
    }
    if ((rc = build_plan(cm, m, p, err)) < 0)
        return rc;
    if ((rc = dg_cuda_alloc(&cm->arena, (size_t)p->bytes, dev, err)) < 0) {
        dg_error_prefix(err, "cuda model: %.1f GiB of weights", (double)p->bytes / (1 << 30));
        return rc;
    }
    cm->bytes = p->bytes;
    for (int i = 0; i < p->n; i++) {
        *p->e[i].slot = (unsigned char *)cm->arena + p->e[i].off;
        cm->fp8 |= p->e[i].q8;
    }
    if (cm->fp8 && (rc = check_fp8_shapes(cm, err)) < 0)
        return rc;
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

int dg_cuda_model_upload_rank(struct dg_cuda_model *cm, const struct dg_model *m,
                              enum dg_elt elt, const struct dg_tp_plan *tp, int rank, int dev,
                              struct dg_error *err)
{
    struct plan p = {0};
    int rc;
    const int fp8 = dg_model_has_fp8(m);
    if (fp8 && (elt != DG_ELT_BF16 || !m->cfg.fp8_act_per_token)) {
        memset(cm, 0, sizeof *cm);
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: this checkpoint has FP8 (F8_E4M3) "
                            "weights %s; the CUDA backend runs FP8 as W8A8 (activations "
                            "quantized per token) with bf16 elsewhere (this one runs on the "
                            "CPU backend)", dev,
                            elt != DG_ELT_BF16 ? "beside fp32 ones" : "without activation "
                            "quantization (weights only)");
    }
    rc = prepare(cm, &m->cfg, m, elt, fp8, tp, rank, dev, &p, err);
    if (rc == 0)
        rc = fill_upload(cm, &p, err);
    if (rc == 0)
        rc = upload_rope(cm, err);
    if (rc == 0)
        rc = dg_cuda_sync(dev, err); /* (pageable copies may still be in flight) */
    free(p.e);
    free(p.rects);
    if (rc < 0)
        dg_cuda_model_free(cm);
    return rc;
}

int dg_cuda_model_upload(struct dg_cuda_model *cm, const struct dg_model *m, enum dg_elt elt,
                         int dev, struct dg_error *err)
{
    return dg_cuda_model_upload_rank(cm, m, elt, NULL, 0, dev, err);
}

int dg_cuda_model_random_q_rank(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                                uint64_t seed, int fp8, const struct dg_tp_plan *tp, int rank,
                                int dev, struct dg_error *err)
{
    struct plan p = {0};
    float *ones = NULL;
    void *tmp = NULL;          /* FP8: one rectangle's bf16 values before quantization */
    uint64_t tmp_bytes = 0;
    uint32_t next_tid = 0;     /* tensor ids: places among the non-scale entries, so that
                                  FP8 draws the bf16 model's values */
    int rc = prepare(cm, cfg, NULL, DG_ELT_BF16, fp8, tp, rank, dev, &p, err);

    for (int i = 0; i < p.n && rc == 0; i++) {
        const struct entry *e = &p.e[i];
        unsigned char *dst = (unsigned char *)cm->arena + e->off;
        float *scales;
        uint32_t tid;
        if (e->scales_of)
            continue; /* written with its matrix */
        tid = next_tid++;
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
            continue;
        }
        scales = e->q8 ? (float *)(void *)((unsigned char *)cm->arena +
                                           p.e[e->scale_entry - 1].off)
                       : NULL;
        /* tensor i's values at this rank's places (FP8: drawn as bf16, then
         * quantized row by row into the bytes and the scales) */
        for (int k = 0; k < e->n_rects && rc == 0; k++) {
            const struct rect *r = &p.rects[e->rect0 + k];
            const uint64_t bytes = (uint64_t)(r->nr * r->nc) * 2;
            void *out = dst;
            if (e->q8 && bytes > tmp_bytes) {
                dg_cuda_free(tmp);
                tmp = NULL;
                tmp_bytes = 0;
                if ((rc = dg_cuda_alloc(&tmp, (size_t)bytes, dev, err)) < 0)
                    break;
                tmp_bytes = bytes;
            }
            if (e->q8)
                out = tmp;
            rc = dg_cuda_fill_normal_rect((uint16_t *)out, r->nr, r->nc, e->C,
                                          r->r0 * e->C + r->c0, seed, tid,
                                          e->ones ? 1.0f : 0.0f, e->ones ? 0.0f : 0.02f, NULL,
                                          dev, err);
            if (rc == 0 && e->q8) {
                rc = dg_cuda_fp8_quantize_rows(DG_ELT_BF16, dst, scales, tmp, r->nr, (int)r->nc,
                                               NULL, dev, err);
                scales += r->nr;
            }
            dst += (size_t)(r->nr * r->nc) * (e->q8 ? 1 : 2);
        }
    }
    free(ones);
    if (rc == 0)
        rc = upload_rope(cm, err);
    if (rc == 0)
        rc = dg_cuda_sync(dev, err);
    dg_cuda_free(tmp);
    free(p.e);
    free(p.rects);
    if (rc < 0)
        dg_cuda_model_free(cm);
    return rc;
}

int dg_cuda_model_random_rank(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                              uint64_t seed, const struct dg_tp_plan *tp, int rank, int dev,
                              struct dg_error *err)
{
    return dg_cuda_model_random_q_rank(cm, cfg, seed, 0, tp, rank, dev, err);
}

int dg_cuda_model_random(struct dg_cuda_model *cm, const struct dg_model_config *cfg,
                         uint64_t seed, int dev, struct dg_error *err)
{
    return dg_cuda_model_random_rank(cm, cfg, seed, NULL, 0, dev, err);
}

void dg_cuda_model_free(struct dg_cuda_model *cm)
{
    dg_cuda_free(cm->arena);
    free(cm->layers);
    memset(cm, 0, sizeof *cm);
}
