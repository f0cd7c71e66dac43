/* cpu-forward.c - see cpu-forward.h for the maths. */
#include "lib/cpu-forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fp8.h"
#include "lib/ref-ops.h"
#include "lib/san-range.h"

float dg_embed_scale(int hidden, enum dg_dtype t)
{
    float c = (float)sqrt((double)hidden);
    if (t == DG_DTYPE_BF16)
        return dg_bf16_to_f32(dg_f32_to_bf16(c));
    if (t == DG_DTYPE_F16)
        return dg_f16_to_f32(dg_f32_to_f16(c));
    return c;
}

/* ---- model preparation ------------------------------------------------- */

static void load_vec(float *dst, const struct dg_weight *w)
{
    const int64_t n = w->rows * w->cols;
    for (int64_t i = 0; i < n; i++)
        dst[i] = dg_load_f32(w->data, w->dtype, (size_t)i);
}

static uint64_t view_bytes(const struct dg_weight *w)
{
    return w->data ? (uint64_t)(w->rows * w->cols) * dg_dtype_size(w->dtype) : 0;
}

/* Replicated vectors: fp32 copies in one pool. */
static int init_vectors(struct dg_cpu_model *cm, const struct dg_model *m, struct dg_error *err)
{
    const struct dg_model_config *c = &m->cfg;
    const int H = c->hidden_size, E = c->num_experts;
    size_t per_layer = (size_t)8 * H + (size_t)E, total, used = 0;
    float *p;

    total = 2 * (size_t)H + (size_t)c->head_dim / 2 + (size_t)c->global_head_dim / 2;
    for (int l = 0; l < c->num_layers; l++)
        total += per_layer + 2 * (size_t)dg_layer_head_dim(c, l);
    cm->pool = malloc(total * sizeof(float));
    cm->layers = calloc((size_t)c->num_layers, sizeof *cm->layers);
    cm->kv_heads = calloc((size_t)c->num_layers, sizeof *cm->kv_heads);
    cm->views = calloc((size_t)c->num_layers * (size_t)E * 3, sizeof *cm->views);
    if (!cm->pool || !cm->layers || !cm->kv_heads || !cm->views)
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory preparing the model");
    cm->pool_bytes = total * sizeof(float);
    dg_ledger_alloc(cm->ledger, cm->pool_bytes);
    p = cm->pool;
#define TAKE(dst, n) (dst = p + used, used += (size_t)(n))
    TAKE(cm->final_norm, H);
    TAKE(cm->sc_pre_norm, H);
    TAKE(cm->inv_freq_sliding, c->head_dim / 2);
    TAKE(cm->inv_freq_full, c->global_head_dim / 2);
    load_vec(cm->final_norm, &m->final_norm);
    load_vec(cm->sc_pre_norm, &m->sc_pre_norm);
    dg_rope_inv_freq(&c->rope_sliding, c->head_dim, cm->inv_freq_sliding);
    dg_rope_inv_freq(&c->rope_full, c->global_head_dim, cm->inv_freq_full);
    for (int l = 0; l < c->num_layers; l++) {
        struct dg_cpu_layer *L = &cm->layers[l];
        const struct dg_layer_weights *w = &m->layers[l];
        L->hd = dg_layer_head_dim(c, l);
        L->nkv = dg_layer_kv_heads(c, l);
        L->inv_freq = c->layer_kind[l] == DG_LAYER_FULL ? cm->inv_freq_full : cm->inv_freq_sliding;
        TAKE(L->input_norm, H);
        TAKE(L->q_norm, L->hd);
        TAKE(L->k_norm, L->hd);
        TAKE(L->post_attn_norm, H);
        TAKE(L->pre_ffn_norm, H);
        TAKE(L->post_ffn_norm_1, H);
        TAKE(L->router_scale, H);
        TAKE(L->router_expert_scale, E);
        TAKE(L->pre_ffn_norm_2, H);
        TAKE(L->post_ffn_norm_2, H);
        TAKE(L->post_ffn_norm, H);
        load_vec(L->input_norm, &w->input_norm);
        load_vec(L->q_norm, &w->q_norm);
        load_vec(L->k_norm, &w->k_norm);
        load_vec(L->post_attn_norm, &w->post_attn_norm);
        load_vec(L->pre_ffn_norm, &w->pre_ffn_norm);
        load_vec(L->post_ffn_norm_1, &w->post_ffn_norm_1);
        load_vec(L->router_scale, &w->router_scale);
        load_vec(L->router_expert_scale, &w->router_expert_scale);
        load_vec(L->pre_ffn_norm_2, &w->pre_ffn_norm_2);
        load_vec(L->post_ffn_norm_2, &w->post_ffn_norm_2);
        load_vec(L->post_ffn_norm, &w->post_ffn_norm);
        L->exp_gate = cm->views + (size_t)l * (size_t)E * 3;
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
    }
#undef TAKE
    return 0;
}

int dg_cpu_model_init_rank(struct dg_cpu_model *cm, const struct dg_model *m,
                           const struct dg_tp_plan *plan, int rank, struct dg_coll *coll,
                           struct dg_mem_ledger *ledger, struct dg_error *err)
{
    const struct dg_model_config *c = &m->cfg;
    const struct dg_tp_rank *pr;
    int rc;

    memset(cm, 0, sizeof *cm);
    if (rank < 0 || rank >= plan->n_ranks ||
        (plan->n_ranks > 1 && (!coll || coll->size != plan->n_ranks || coll->rank != rank)))
        return dg_error_set(err, DG_E_INVAL, "cpu backend: rank %d of a %d-rank plan with %s", rank,
                            plan->n_ranks, coll ? "a mismatched group" : "no collectives");
    pr = &plan->rank[rank];
    cm->m = m;
    cm->rank = rank;
    cm->n_ranks = plan->n_ranks;
    cm->coll = plan->n_ranks > 1 ? coll : NULL;
    cm->ledger = ledger;
    if ((rc = init_vectors(cm, m, err)) < 0) {
        dg_cpu_model_free(cm);
        return rc;
    }
    cm->v0 = pr->vocab.begin;
    cm->nv = dg_tp_len(pr->vocab);
    cm->embed = dg_weight_rows(&m->embed, pr->vocab.begin, pr->vocab.end);
    cm->mlp_width = (int)dg_tp_len(pr->mlp);
    cm->expert_width = (int)dg_tp_len(pr->expert_width);
    dg_ledger_weight(ledger, view_bytes(&cm->embed));
    for (int l = 0; l < c->num_layers; l++) {
        struct dg_cpu_layer *L = &cm->layers[l];
        const struct dg_layer_weights *w = &m->layers[l];
        const struct dg_tp_range kv = dg_tp_kv(plan, rank, c->layer_kind[l] == DG_LAYER_FULL);
        const int64_t hd = L->hd;
        L->q0 = (int)pr->q_heads.begin;
        L->nq = (int)dg_tp_len(pr->q_heads);
        L->kv0 = (int)kv.begin;
        L->nkv_local = (int)dg_tp_len(kv);
        L->group = c->num_heads / L->nkv;
        cm->kv_heads[l] = L->nkv_local;
        L->q_proj = dg_weight_rows(&w->q_proj, L->q0 * hd, (L->q0 + L->nq) * hd);
        L->k_proj = dg_weight_rows(&w->k_proj, L->kv0 * hd, (L->kv0 + L->nkv_local) * hd);
        L->v_proj = dg_weight_rows(&w->v_proj, L->kv0 * hd, (L->kv0 + L->nkv_local) * hd);
        L->o_proj = dg_weight_cols(&w->o_proj, L->q0 * hd, (L->q0 + L->nq) * hd);
        L->mlp_gate = dg_weight_rows(&w->mlp_gate, pr->mlp.begin, pr->mlp.end);
        L->mlp_up = dg_weight_rows(&w->mlp_up, pr->mlp.begin, pr->mlp.end);
        L->mlp_down = dg_weight_cols(&w->mlp_down, pr->mlp.begin, pr->mlp.end);
        L->e0 = (int)pr->experts.begin;
        L->e1 = (int)pr->experts.end;
        for (int e = L->e0; e < L->e1; e++) {
            L->exp_gate[e] = dg_weight_rows(&w->expert_gate[e], pr->expert_width.begin,
                                            pr->expert_width.end);
            L->exp_up[e] = dg_weight_rows(&w->expert_up[e], pr->expert_width.begin,
                                          pr->expert_width.end);
            L->exp_down[e] = dg_weight_cols(&w->expert_down[e], pr->expert_width.begin,
                                            pr->expert_width.end);
            dg_ledger_weight(ledger, view_bytes(&L->exp_gate[e]));
            dg_ledger_weight(ledger, view_bytes(&L->exp_up[e]));
            dg_ledger_weight(ledger, view_bytes(&L->exp_down[e]));
        }
        dg_ledger_weight(ledger, view_bytes(&L->q_proj));
        dg_ledger_weight(ledger, view_bytes(&L->k_proj));
        dg_ledger_weight(ledger, view_bytes(&L->v_proj));
        dg_ledger_weight(ledger, view_bytes(&L->o_proj));
        dg_ledger_weight(ledger, view_bytes(&L->mlp_gate));
        dg_ledger_weight(ledger, view_bytes(&L->mlp_up));
        dg_ledger_weight(ledger, view_bytes(&L->mlp_down));
        dg_ledger_weight(ledger, view_bytes(&w->router_proj));
    }
    dg_ledger_weight(ledger, view_bytes(&m->sc_gate));
    dg_ledger_weight(ledger, view_bytes(&m->sc_up));
    dg_ledger_weight(ledger, view_bytes(&m->sc_down));
    cm->embed_scale = dg_embed_scale(c->hidden_size, m->embed.dtype);
    return 0;
}

int dg_cpu_model_init(struct dg_cpu_model *cm, const struct dg_model *m, struct dg_error *err)
{
    struct dg_tp_plan plan;
    int rc = dg_tp_plan_build(&m->cfg, 1, DG_EXPERTS_ACROSS, 1, &plan, err);
    if (rc < 0) {
        memset(cm, 0, sizeof *cm);
        return rc;
    }
    return dg_cpu_model_init_rank(cm, m, &plan, 0, NULL, NULL, err);
}

void dg_cpu_model_free(struct dg_cpu_model *cm)
{
    dg_ledger_free(cm->ledger, cm->pool_bytes);
    free(cm->pool);
    free(cm->layers);
    free(cm->kv_heads);
    free(cm->views);
    memset(cm, 0, sizeof *cm);
}

int dg_cpu_kv_init(const struct dg_cpu_model *cm, struct dg_kv_cache *kv, int64_t max_length,
                   struct dg_error *err)
{
    return dg_kv_cache_init_heads(kv, &cm->m->cfg, max_length, cm->kv_heads, err);
}

/* ---- scratch ----------------------------------------------------------- */

/* Every buffer one pass needs, sized for T tokens against n_cached keys,
 * with this rank's widths. */
struct scratch {
    float *x, *a, *h, *q, *kraw, *vraw, *k, *v, *o, *tmp;
    float *pair;                 /* [2, T, H] */
    double *pair64;              /* [2, T, H]: partial sums, reduced across ranks in double */
    double *eout64;              /* [T, H] one expert's output */
    float *kall, *vall, *scores;
    int64_t *qpos, *kpos;
    float *gate, *up;
    float *rlogits, *rw;
    int *ridx;
    float *egate, *eup, *ein;
    int *members;
    float *row;
    float *aq;                   /* [T, widest]: FP8-quantized activations (W8A8) */
    void *block;
    uint64_t bytes;
    struct dg_mem_ledger *ledger;
};

static void scratch_free(struct scratch *s)
{
    dg_ledger_free(s->ledger, s->bytes);
    free(s->block);
    memset(s, 0, sizeof *s);
}

static int scratch_alloc(struct scratch *s, const struct dg_cpu_model *cm, int64_t T,
                         int64_t n_cached, struct dg_error *err)
{
    const struct dg_model_config *c = &cm->m->cfg;
    const int64_t H = c->hidden_size, S = c->self_conditioning_size;
    const int64_t Im = cm->expert_width, E = c->num_experts, K = c->top_k_experts;
    const int64_t Tk = n_cached + T;
    int64_t qdim = 0, kvdim = 0, widest = H;
    size_t total = 0, off = 0;

    for (int l = 0; l < c->num_layers; l++) {
        const struct dg_cpu_layer *L = &cm->layers[l];
        if ((int64_t)L->nq * L->hd > qdim)
            qdim = (int64_t)L->nq * L->hd;
        if ((int64_t)L->nkv_local * L->hd > kvdim)
            kvdim = (int64_t)L->nkv_local * L->hd;
    }
    if (qdim > widest) widest = qdim;
    if (cm->mlp_width > widest) widest = cm->mlp_width;
    if (S > widest) widest = S;
    if (Im > widest) widest = Im;
    {
        /* every buffer: where it goes, how many elements, element size */
        const struct { void **ptr; int64_t n; size_t size; } plan[] = {
            {(void **)&s->x, T * H, 4},      {(void **)&s->a, T * H, 4},
            {(void **)&s->h, T * H, 4},      {(void **)&s->tmp, T * H, 4},
            {(void **)&s->pair, 2 * T * H, 4},
            {(void **)&s->pair64, 2 * T * H, 8}, {(void **)&s->eout64, T * H, 8},
            {(void **)&s->q, T * qdim, 4},   {(void **)&s->o, T * qdim, 4},
            {(void **)&s->kraw, T * kvdim, 4}, {(void **)&s->vraw, T * kvdim, 4},
            {(void **)&s->k, T * kvdim, 4},  {(void **)&s->v, T * kvdim, 4},
            {(void **)&s->kall, Tk * kvdim, 4}, {(void **)&s->vall, Tk * kvdim, 4},
            {(void **)&s->scores, Tk, 4},
            {(void **)&s->gate, T * widest, 4}, {(void **)&s->up, T * widest, 4},
            {(void **)&s->rlogits, E, 4},    {(void **)&s->rw, K * T, 4},
            {(void **)&s->egate, T * Im, 4}, {(void **)&s->eup, T * Im, 4},
            {(void **)&s->ein, T * H, 4},
            {(void **)&s->row, widest, 4},
            {(void **)&s->aq, c->fp8_act_per_token ? T * widest : 0, 4},
            {(void **)&s->qpos, Tk, 8},      {(void **)&s->kpos, Tk, 8},
            {(void **)&s->ridx, K * T, sizeof(int)}, {(void **)&s->members, T, sizeof(int)},
        };
        const size_t n_plan = sizeof plan / sizeof plan[0];
        char *b;

        memset(s, 0, sizeof *s);
        for (size_t i = 0; i < n_plan; i++)
            total += ((size_t)plan[i].n * plan[i].size + 15) & ~(size_t)15;
        b = malloc(total ? total : 1);
        if (!b)
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for %lld tokens",
                                (long long)T);
        for (size_t i = 0; i < n_plan; i++) {
            *plan[i].ptr = b + off;
            off += ((size_t)plan[i].n * plan[i].size + 15) & ~(size_t)15;
            /* the ledger sees each buffer (the block is a packing detail) */
            dg_ledger_part(cm->ledger, (uint64_t)plan[i].n * plan[i].size);
        }
        s->block = b;
        s->bytes = total;
        s->ledger = cm->ledger;
        dg_ledger_hold(cm->ledger, total);
    }
    return 0;
}

/* The input a matmul with w takes: with per-token FP8 activations (W8A8,
 * quant-config.h) and an F8_E4M3 w, each of the T rows of x (w->cols
 * values: under tensor parallelism the columns this rank holds) quantized
 * to E4M3 with its own scale and dequantized into s->aq (fp8.h); else x. */
static const float *mm_in(const struct dg_cpu_model *cm, struct scratch *s, const float *x,
                          int64_t T, const struct dg_weight *w)
{
    if (w->dtype != DG_DTYPE_F8_E4M3 || !cm->m->cfg.fp8_act_per_token)
        return x;
    dg_fp8_fake_quant_rows(s->aq, x, (size_t)T, (size_t)w->cols);
    return s->aq;
}

#define MM_IN(x, T, w) mm_in(cm, s, (x), (T), (w))

/* ---- the layer ----------------------------------------------------------- */

enum pass_mode { PASS_ENCODER, PASS_DECODER };

/* x [T, H] -> x'.  Positions kv->length + t.  Encoder: also appends K/V. */
static int layer_forward(const struct dg_cpu_model *cm, int l, enum pass_mode mode,
                         struct dg_kv_cache *kv_write, const struct dg_kv_cache *kv, int64_t T,
                         struct scratch *s, struct dg_error *err)
{
    const struct dg_model *m = cm->m;
    const struct dg_model_config *c = &m->cfg;
    const struct dg_layer_weights *w = &m->layers[l];
    const struct dg_cpu_layer *L = &cm->layers[l];
    const int H = c->hidden_size, nq = L->nq, hd = L->hd, nkv = L->nkv_local;
    const int64_t qdim = (int64_t)nq * hd, kvdim = (int64_t)nkv * hd;
    const int E = c->num_experts, K = c->top_k_experts, Im = cm->expert_width;
    const int I = cm->mlp_width;
    const float eps = (float)c->rms_norm_eps;
    const int sliding = c->layer_kind[l] == DG_LAYER_SLIDING;
    float *dense = s->pair, *moe = s->pair + T * H;
    double *dense64 = s->pair64, *moe64 = s->pair64 + T * H;
    int64_t n_cached, Tk;
    enum dg_attn_mask mask;
    float scalar;
    int rc;

    /* attention over this rank's heads */
    dg_ref_rmsnorm(s->a, s->x, L->input_norm, T, H, eps);
    dg_ref_matmul(s->q, MM_IN(s->a, T, &L->q_proj), T, &L->q_proj, s->row);
    dg_ref_matmul(s->kraw, MM_IN(s->a, T, &L->k_proj), T, &L->k_proj, s->row);
    if (sliding)
        dg_ref_matmul(s->vraw, MM_IN(s->a, T, &L->v_proj), T, &L->v_proj, s->row);
    else
        memcpy(s->vraw, s->kraw, sizeof(float) * (size_t)(T * kvdim)); /* V = raw K */
    dg_ref_rmsnorm(s->q, s->q, L->q_norm, T * nq, hd, eps);
    dg_ref_rmsnorm(s->k, s->kraw, L->k_norm, T * nkv, hd, eps);
    dg_ref_rmsnorm(s->v, s->vraw, NULL, T * nkv, hd, eps);
    for (int64_t t = 0; t < T; t++) {
        const int64_t pos = kv->length + t;
        dg_ref_rope(s->q + t * qdim, nq, hd, L->inv_freq, pos);
        dg_ref_rope(s->k + t * kvdim, nkv, hd, L->inv_freq, pos);
        s->qpos[t] = pos;
    }
    n_cached = dg_kv_cache_read(kv, l, s->kall, s->vall, s->kpos);
    memcpy(s->kall + n_cached * kvdim, s->k, sizeof(float) * (size_t)(T * kvdim));
    memcpy(s->vall + n_cached * kvdim, s->v, sizeof(float) * (size_t)(T * kvdim));
    for (int64_t t = 0; t < T; t++)
        s->kpos[n_cached + t] = kv->length + t;
    Tk = n_cached + T;
    mask = mode == PASS_DECODER ? DG_MASK_NONE : sliding ? DG_MASK_CAUSAL_WINDOW : DG_MASK_CAUSAL;
    dg_ref_attention_heads(s->o, s->q, s->qpos, T, s->kall, s->vall, s->kpos, Tk, nq, L->q0, nkv,
                           L->kv0, L->group, hd, mask, c->sliding_window, s->scores);
    if (mode == PASS_ENCODER && (rc = dg_kv_cache_append(kv_write, l, s->k, s->v, T, err)) < 0)
        return rc;
    /* o_proj over this rank's heads: a partial sum, reduced in double */
    dg_ref_matmul_f64(s->pair64, MM_IN(s->o, T, &L->o_proj), T, &L->o_proj, s->row);
    if ((rc = dg_all_reduce(cm->coll, s->pair64, (size_t)(T * H), DG_COLL_F64, DG_COLL_SUM,
                            err)) < 0)
        return rc;
    for (int64_t i = 0; i < T * H; i++)
        s->tmp[i] = (float)s->pair64[i];
    dg_ref_rmsnorm(s->tmp, s->tmp, L->post_attn_norm, T, H, eps);
    for (int64_t i = 0; i < T * H; i++)
        s->h[i] = s->x[i] + s->tmp[i];

    /* dense MLP (this rank's width): down(gelu(gate u) * up u), u = rms(h) */
    dg_ref_rmsnorm(s->a, s->h, L->pre_ffn_norm, T, H, eps);
    dg_ref_matmul(s->gate, MM_IN(s->a, T, &L->mlp_gate), T, &L->mlp_gate, s->row);
    dg_ref_matmul(s->up, MM_IN(s->a, T, &L->mlp_up), T, &L->mlp_up, s->row);
    dg_ref_gelu_mul(s->gate, s->gate, s->up, T * I);
    dg_ref_matmul_f64(dense64, MM_IN(s->gate, T, &L->mlp_down), T, &L->mlp_down, s->row);

    /* router on the un-normed h (every rank: the same experts):
     * r = rms_noscale(h) * scale * H^-1/2 */
    {
        const float root = 1.0f / sqrtf((float)H);
        dg_ref_rmsnorm(s->a, s->h, NULL, T, H, eps);
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < H; i++)
                s->a[t * H + i] = s->a[t * H + i] * L->router_scale[i] * root;
        for (int64_t t = 0; t < T; t++) {
            dg_ref_matmul(s->rlogits, MM_IN(s->a + t * H, 1, &w->router_proj), 1, &w->router_proj,
                          s->row);
            dg_ref_router_topk(s->ridx + t * K, s->rw + t * K, s->rlogits, E, K,
                               L->router_expert_scale);
        }
    }

    /* MoE (this rank's experts): sum_j w_j down_e(gelu(gate_e v) * up_e v),
     * v = rms(h), experts in index order, each over the tokens routed to it */
    dg_ref_rmsnorm(s->a, s->h, L->pre_ffn_norm_2, T, H, eps);
    memset(moe64, 0, sizeof(double) * (size_t)(T * H));
    for (int e = L->e0; e < L->e1; e++) {
        int n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (s->ridx[t * K + j] == e)
                    s->members[n++] = (int)(t * K + j);
        if (!n)
            continue;
        for (int r = 0; r < n; r++)
            memcpy(s->ein + (int64_t)r * H, s->a + (int64_t)(s->members[r] / K) * H,
                   sizeof(float) * (size_t)H);
        dg_ref_matmul(s->egate, MM_IN(s->ein, n, &L->exp_gate[e]), n, &L->exp_gate[e], s->row);
        dg_ref_matmul(s->eup, MM_IN(s->ein, n, &L->exp_up[e]), n, &L->exp_up[e], s->row);
        dg_ref_gelu_mul(s->egate, s->egate, s->eup, (int64_t)n * Im);
        dg_ref_matmul_f64(s->eout64, MM_IN(s->egate, n, &L->exp_down[e]), n, &L->exp_down[e],
                          s->row);
        for (int r = 0; r < n; r++) {
            const int64_t t = s->members[r] / K;
            const double wt = s->rw[s->members[r]];
            for (int i = 0; i < H; i++)
                moe64[t * H + i] += wt * s->eout64[(int64_t)r * H + i];
        }
    }
    /* both partial sums in one all-reduce (double), then their norms */
    if ((rc = dg_all_reduce(cm->coll, s->pair64, (size_t)(2 * T * H), DG_COLL_F64, DG_COLL_SUM,
                            err)) < 0)
        return rc;
    for (int64_t i = 0; i < 2 * T * H; i++)
        s->pair[i] = (float)s->pair64[i];

    /* d' = rms(d), m' = rms(m), x' = (h + rms(d' + m')) * layer_scalar
     * (encoder or decoder copy) */
    scalar = mode == PASS_ENCODER ? w->scalar_encoder : w->scalar_decoder;
    memcpy(s->x, s->h, sizeof(float) * (size_t)(T * H));
    dg_ref_ffn_combine(s->x, dense, moe, L->post_ffn_norm_1, L->post_ffn_norm_2,
                       L->post_ffn_norm, T, H, eps, scalar);
    return 0;
}

/* x[t] = E[ids[t]] * c for the ids in this rank's rows, 0 for the others
 * (summed over ranks: the embedding). */
static void embed(const struct dg_cpu_model *cm, const int32_t *ids, int64_t T, float *x)
{
    dg_ref_embed(x, ids, T, &cm->embed, cm->v0, cm->embed_scale);
}

static int check_ids(const struct dg_model_config *c, const int32_t *ids, int64_t T,
                     const struct dg_kv_cache *kv, const char *what, struct dg_error *err)
{
    if (T < 1)
        return dg_error_set(err, DG_E_INVAL, "%s: %lld tokens; need at least one", what,
                            (long long)T);
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return dg_error_set(err, DG_E_INVAL, "%s: token %lld is id %d, outside [0, %lld)",
                                what, (long long)t, ids[t], (long long)c->vocab_size);
    if (kv->length + T > kv->max_length)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: positions %lld..%lld run past the cache's %lld positions", what,
                            (long long)kv->length, (long long)(kv->length + T - 1),
                            (long long)kv->max_length);
    return 0;
}

int dg_cpu_encode(const struct dg_cpu_model *cm, struct dg_kv_cache *kv, const int32_t *ids,
                  int64_t T, float *hidden, struct dg_error *err)
{
    const struct dg_model_config *c = &cm->m->cfg;
    struct scratch s;
    int rc;

    if ((rc = check_ids(c, ids, T, kv, "encoder", err)) < 0)
        return rc;
    if ((rc = scratch_alloc(&s, cm, T, kv->length, err)) < 0)
        return rc;
    embed(cm, ids, T, s.x);
    if (cm->coll) {
        /* one rank holds each row: the sum is exact */
        for (int64_t i = 0; i < T * c->hidden_size; i++)
            s.pair64[i] = s.x[i];
        rc = dg_all_reduce(cm->coll, s.pair64, (size_t)(T * c->hidden_size), DG_COLL_F64,
                           DG_COLL_SUM, err);
        for (int64_t i = 0; rc == 0 && i < T * c->hidden_size; i++)
            s.x[i] = (float)s.pair64[i];
    }
    for (int l = 0; l < c->num_layers && rc == 0; l++)
        rc = layer_forward(cm, l, PASS_ENCODER, kv, kv, T, &s, err);
    if (rc == 0) {
        dg_kv_cache_advance(kv, T);
        if (hidden)
            dg_ref_rmsnorm(hidden, s.x, cm->final_norm, T, c->hidden_size,
                           (float)c->rms_norm_eps);
    }
    /* on error the rows appended to some layers lie beyond kv->length: unseen */
    scratch_free(&s);
    return rc;
}

/* acc[t] += sum_v probs[t, v] E[v] over rows of E as f32 (row: H floats of
 * scratch).  Uninstrumented (san-range.h): the caller checks probs and
 * clears acc, and E is read through dg_load_f32, which is not. */
DG_SAN_RANGE_CHECKED static void soft_embed_rows(const struct dg_weight *E, int64_t V,
                                                 const float *probs, int64_t CL, double *acc,
                                                 float *row)
{
    const int64_t H = E->cols;

    for (int64_t v = 0; v < V; v++) {
        const unsigned char *src = (const unsigned char *)E->data +
                                   (size_t)(v * E->stride) * dg_dtype_size(E->dtype);
        int loaded = 0;
        for (int64_t t = 0; t < CL; t++) {
            const double pv = probs[t * V + v];
            if (pv == 0.0)
                continue;
            if (!loaded) {
                for (int64_t i = 0; i < H; i++)
                    row[i] = dg_load_f32(src, E->dtype, (size_t)i);
                loaded = 1;
            }
            for (int64_t i = 0; i < H; i++)
                acc[t * H + i] += pv * row[i];
        }
    }
}

int dg_cpu_soft_embed(const struct dg_cpu_model *cm, const float *probs, int64_t CL, double *acc,
                      struct dg_error *err)
{
    const struct dg_weight *E = &cm->embed;
    const int64_t V = cm->nv, H = E->cols;
    float *row = malloc(sizeof(float) * (size_t)H);

    if (!row)
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for self-conditioning");
    dg_san_read(probs, sizeof *probs * (size_t)(CL * V));
    memset(acc, 0, sizeof *acc * (size_t)(CL * H));
    soft_embed_rows(E, V, probs, CL, acc, row);
    free(row);
    return 0;
}

/* The SC MLP on the soft embedding: out[t] = down(gelu(gate u) * up u),
 * u = rms(soft[t]; pre_norm).  Replicated: every rank computes all of it. */
static void self_conditioning(const struct dg_cpu_model *cm, const float *soft, int64_t CL,
                              struct scratch *s, float *out)
{
    const struct dg_model *m = cm->m;
    const struct dg_model_config *c = &m->cfg;
    const int64_t S = c->self_conditioning_size;

    dg_ref_rmsnorm(s->a, soft, cm->sc_pre_norm, CL, c->hidden_size, (float)c->rms_norm_eps);
    dg_ref_matmul(s->gate, MM_IN(s->a, CL, &m->sc_gate), CL, &m->sc_gate, s->row);
    dg_ref_matmul(s->up, MM_IN(s->a, CL, &m->sc_up), CL, &m->sc_up, s->row);
    dg_ref_gelu_mul(s->gate, s->gate, s->up, CL * S);
    dg_ref_matmul(out, MM_IN(s->gate, CL, &m->sc_down), CL, &m->sc_down, s->row);
}

int dg_cpu_decode_soft(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                       const int32_t *canvas, int64_t CL, const double *soft, float *logits,
                       struct dg_error *err)
{
    const struct dg_model *m = cm->m;
    const struct dg_model_config *c = &m->cfg;
    const int H = c->hidden_size;
    float *sum_soft;
    struct scratch s;
    int rc;

    if ((rc = check_ids(c, canvas, CL, kv, "decoder", err)) < 0)
        return rc;
    if ((rc = scratch_alloc(&s, cm, CL, kv->length, err)) < 0)
        return rc;
    /* the token embedding and the self-conditioning partial in one reduce
     * (double: the soft embedding's parts add up the same way whatever the
     * split) */
    sum_soft = s.pair + CL * H;
    embed(cm, canvas, CL, s.x);
    for (int64_t i = 0; i < CL * H; i++)
        s.pair64[i] = s.x[i];
    if (soft)
        memcpy(s.pair64 + CL * H, soft, sizeof(double) * (size_t)(CL * H));
    rc = dg_all_reduce(cm->coll, s.pair64, (size_t)((soft ? 2 : 1) * CL * H), DG_COLL_F64,
                       DG_COLL_SUM, err);
    if (rc == 0) {
        for (int64_t i = 0; i < CL * H; i++)
            s.x[i] = (float)s.pair64[i];
        if (soft) {
            for (int64_t i = 0; i < CL * H; i++)
                sum_soft[i] = (float)s.pair64[CL * H + i] * cm->embed_scale;
            self_conditioning(cm, sum_soft, CL, &s, s.tmp);
            for (int64_t i = 0; i < CL * H; i++)
                s.x[i] += s.tmp[i];
        }
        /* the weight-free post-norm applies on every step, SC or not */
        dg_ref_rmsnorm(s.x, s.x, NULL, CL, H, (float)c->rms_norm_eps);
    }
    for (int l = 0; l < c->num_layers && rc == 0; l++)
        rc = layer_forward(cm, l, PASS_DECODER, NULL, kv, CL, &s, err);
    if (rc == 0) {
        dg_ref_rmsnorm(s.x, s.x, cm->final_norm, CL, H, (float)c->rms_norm_eps);
        dg_ref_matmul(logits, s.x, CL, &cm->embed, s.row);
        dg_ref_softcap(logits, CL * cm->nv, (float)c->final_logit_softcapping);
    }
    scratch_free(&s);
    return rc;
}

int dg_cpu_decode(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                  const int32_t *canvas, int64_t CL, const float *sc_logits, int64_t sc_stride,
                  float *logits, struct dg_error *err)
{
    const int64_t V = cm->nv, H = cm->m->cfg.hidden_size;
    float *p, *mx;
    double *sum, *soft;
    int rc;

    if (!sc_logits)
        return dg_cpu_decode_soft(cm, kv, canvas, CL, NULL, logits, err);
    if (CL < 1 || sc_stride < V)
        return dg_error_set(err, DG_E_INVAL, "decoder: %lld tokens, logits row stride %lld",
                            (long long)CL, (long long)sc_stride);
    p = malloc(sizeof(float) * (size_t)(CL * V));
    soft = malloc(sizeof(double) * (size_t)(CL * H));
    mx = malloc(sizeof(float) * (size_t)CL);
    sum = malloc(sizeof(double) * (size_t)CL);
    if (!p || !soft || !mx || !sum) {
        rc = dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for self-conditioning");
        goto out;
    }
    dg_ledger_alloc(cm->ledger, sizeof(float) * (uint64_t)(CL * V));
    /* softmax over whole rows: the max and the sum across ranks (as
     * dg_ref_softmax: max-subtracted fp32 exp, double sum) */
    for (int64_t t = 0; t < CL; t++) {
        const float *z = sc_logits + t * sc_stride;
        mx[t] = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            if (z[v] > mx[t])
                mx[t] = z[v];
    }
    if ((rc = dg_all_reduce(cm->coll, mx, (size_t)CL, DG_COLL_F32, DG_COLL_MAX, err)) < 0)
        goto out_ledger;
    for (int64_t t = 0; t < CL; t++) {
        const float *z = sc_logits + t * sc_stride;
        sum[t] = 0;
        for (int64_t v = 0; v < V; v++) {
            p[t * V + v] = expf(z[v] - mx[t]);
            sum[t] += p[t * V + v];
        }
    }
    if ((rc = dg_all_reduce(cm->coll, sum, (size_t)CL, DG_COLL_F64, DG_COLL_SUM, err)) < 0)
        goto out_ledger;
    for (int64_t t = 0; t < CL; t++)
        for (int64_t v = 0; v < V; v++)
            p[t * V + v] = (float)(p[t * V + v] / sum[t]);
    rc = dg_cpu_soft_embed(cm, p, CL, soft, err);
    if (rc == 0)
        rc = dg_cpu_decode_soft(cm, kv, canvas, CL, soft, logits, err);
out_ledger:
    dg_ledger_free(cm->ledger, sizeof(float) * (uint64_t)(CL * V));
out:
    free(p);
    free(soft);
    free(mx);
    free(sum);
    return rc;
}
