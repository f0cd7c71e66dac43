/* cpu-forward.c - see cpu-forward.h for the maths. */
#include "lib/cpu-forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ref-ops.h"

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

int dg_cpu_model_init(struct dg_cpu_model *cm, const struct dg_model *m, struct dg_error *err)
{
    const struct dg_model_config *c = &m->cfg;
    const int H = c->hidden_size, E = c->num_experts;
    size_t per_layer = (size_t)9 * H + (size_t)E, total, used = 0;
    float *p;

    memset(cm, 0, sizeof *cm);
    cm->m = m;
    total = 2 * (size_t)H + (size_t)c->head_dim / 2 + (size_t)c->global_head_dim / 2;
    for (int l = 0; l < c->num_layers; l++)
        total += per_layer + 2 * (size_t)dg_layer_head_dim(c, l);
    cm->pool = malloc(total * sizeof(float));
    cm->layers = calloc((size_t)c->num_layers, sizeof *cm->layers);
    if (!cm->pool || !cm->layers) {
        dg_cpu_model_free(cm);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory preparing the model");
    }
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
    }
#undef TAKE
    cm->embed_scale = dg_embed_scale(H, m->embed.dtype);
    return 0;
}

void dg_cpu_model_free(struct dg_cpu_model *cm)
{
    free(cm->pool);
    free(cm->layers);
    memset(cm, 0, sizeof *cm);
}

/* ---- scratch ----------------------------------------------------------- */

/* Every buffer one pass needs, sized for T tokens against n_cached keys. */
struct scratch {
    float *x, *a, *h, *q, *kraw, *vraw, *k, *v, *o, *tmp;
    float *kall, *vall, *scores;
    int64_t *qpos, *kpos;
    float *gate, *up, *dense, *moe;
    float *rlogits, *rw;
    int *ridx;
    float *egate, *eup, *ein, *eout;
    int *members;
    float *row;
    void *block;
};

static void scratch_free(struct scratch *s)
{
    free(s->block);
    memset(s, 0, sizeof *s);
}

static int scratch_alloc(struct scratch *s, const struct dg_model_config *c, int64_t T,
                         int64_t n_cached, struct dg_error *err)
{
    const int64_t H = c->hidden_size, I = c->intermediate_size, S = c->self_conditioning_size;
    const int64_t Im = c->moe_intermediate_size, E = c->num_experts, K = c->top_k_experts;
    const int64_t hdmax = c->head_dim > c->global_head_dim ? c->head_dim : c->global_head_dim;
    const int64_t qdim = c->num_heads * hdmax, Tk = n_cached + T;
    int64_t kvdim = 0, widest = H;
    size_t total = 0, off = 0;

    for (int l = 0; l < c->num_layers; l++) {
        int64_t d = (int64_t)dg_layer_kv_heads(c, l) * dg_layer_head_dim(c, l);
        if (d > kvdim)
            kvdim = d;
    }
    if (qdim > widest) widest = qdim;
    if (I > widest) widest = I;
    if (S > widest) widest = S;
    if (Im > widest) widest = Im;
    if (c->vocab_size > widest) widest = c->vocab_size; /* row buffer for the LM head */
    {
        /* every buffer: where it goes, how many elements, element size */
        const struct { void **ptr; int64_t n; size_t size; } plan[] = {
            {(void **)&s->x, T * H, 4},      {(void **)&s->a, T * H, 4},
            {(void **)&s->h, T * H, 4},      {(void **)&s->tmp, T * H, 4},
            {(void **)&s->q, T * qdim, 4},   {(void **)&s->o, T * qdim, 4},
            {(void **)&s->kraw, T * kvdim, 4}, {(void **)&s->vraw, T * kvdim, 4},
            {(void **)&s->k, T * kvdim, 4},  {(void **)&s->v, T * kvdim, 4},
            {(void **)&s->kall, Tk * kvdim, 4}, {(void **)&s->vall, Tk * kvdim, 4},
            {(void **)&s->scores, Tk, 4},
            {(void **)&s->gate, T * widest, 4}, {(void **)&s->up, T * widest, 4},
            {(void **)&s->dense, T * H, 4},  {(void **)&s->moe, T * H, 4},
            {(void **)&s->rlogits, E, 4},    {(void **)&s->rw, K * T, 4},
            {(void **)&s->egate, T * Im, 4}, {(void **)&s->eup, T * Im, 4},
            {(void **)&s->ein, T * H, 4},    {(void **)&s->eout, T * H, 4},
            {(void **)&s->row, widest, 4},
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
        }
        s->block = b;
    }
    return 0;
}

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
    const int H = c->hidden_size, nh = c->num_heads, hd = L->hd, nkv = L->nkv;
    const int64_t qdim = (int64_t)nh * hd, kvdim = (int64_t)nkv * hd;
    const int E = c->num_experts, K = c->top_k_experts, Im = c->moe_intermediate_size;
    const int I = c->intermediate_size;
    const float eps = (float)c->rms_norm_eps;
    const int sliding = c->layer_kind[l] == DG_LAYER_SLIDING;
    int64_t n_cached, Tk;
    enum dg_attn_mask mask;
    float scalar;

    /* attention */
    dg_ref_rmsnorm(s->a, s->x, L->input_norm, T, H, eps);
    dg_ref_matmul(s->q, s->a, T, &w->q_proj, s->row);
    dg_ref_matmul(s->kraw, s->a, T, &w->k_proj, s->row);
    if (sliding)
        dg_ref_matmul(s->vraw, s->a, T, &w->v_proj, s->row);
    else
        memcpy(s->vraw, s->kraw, sizeof(float) * (size_t)(T * kvdim)); /* V = raw K */
    dg_ref_rmsnorm(s->q, s->q, L->q_norm, T * nh, hd, eps);
    dg_ref_rmsnorm(s->k, s->kraw, L->k_norm, T * nkv, hd, eps);
    dg_ref_rmsnorm(s->v, s->vraw, NULL, T * nkv, hd, eps);
    for (int64_t t = 0; t < T; t++) {
        const int64_t pos = kv->length + t;
        dg_ref_rope(s->q + t * qdim, nh, hd, L->inv_freq, pos);
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
    dg_ref_attention(s->o, s->q, s->qpos, T, s->kall, s->vall, s->kpos, Tk, nh, nkv, hd, mask,
                     c->sliding_window, s->scores);
    if (mode == PASS_ENCODER) {
        int rc = dg_kv_cache_append(kv_write, l, s->k, s->v, T, err);
        if (rc)
            return rc;
    }
    dg_ref_matmul(s->tmp, s->o, T, &w->o_proj, s->row);
    dg_ref_rmsnorm(s->tmp, s->tmp, L->post_attn_norm, T, H, eps);
    for (int64_t i = 0; i < T * H; i++)
        s->h[i] = s->x[i] + s->tmp[i];

    /* dense MLP: d' = rms(down(gelu(gate u) * up u)), u = rms(h) */
    dg_ref_rmsnorm(s->a, s->h, L->pre_ffn_norm, T, H, eps);
    dg_ref_matmul(s->gate, s->a, T, &w->mlp_gate, s->row);
    dg_ref_matmul(s->up, s->a, T, &w->mlp_up, s->row);
    for (int64_t i = 0; i < T * I; i++)
        s->gate[i] = dg_gelu_tanh(s->gate[i]) * s->up[i];
    dg_ref_matmul(s->dense, s->gate, T, &w->mlp_down, s->row);
    dg_ref_rmsnorm(s->dense, s->dense, L->post_ffn_norm_1, T, H, eps);

    /* router on the un-normed h: r = rms_noscale(h) * scale * H^-1/2 */
    {
        const float root = 1.0f / sqrtf((float)H);
        dg_ref_rmsnorm(s->a, s->h, NULL, T, H, eps);
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < H; i++)
                s->a[t * H + i] = s->a[t * H + i] * L->router_scale[i] * root;
        for (int64_t t = 0; t < T; t++) {
            dg_ref_matmul(s->rlogits, s->a + t * H, 1, &w->router_proj, s->row);
            dg_ref_router_topk(s->ridx + t * K, s->rw + t * K, s->rlogits, E, K,
                               L->router_expert_scale);
        }
    }

    /* MoE: m' = rms(sum_j w_j down_e(gelu(gate_e v) * up_e v)), v = rms(h),
     * experts in index order, each over the tokens routed to it */
    dg_ref_rmsnorm(s->a, s->h, L->pre_ffn_norm_2, T, H, eps);
    memset(s->moe, 0, sizeof(float) * (size_t)(T * H));
    for (int e = 0; e < E; e++) {
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
        dg_ref_matmul(s->egate, s->ein, n, &w->expert_gate[e], s->row);
        dg_ref_matmul(s->eup, s->ein, n, &w->expert_up[e], s->row);
        for (int64_t i = 0; i < (int64_t)n * Im; i++)
            s->egate[i] = dg_gelu_tanh(s->egate[i]) * s->eup[i];
        dg_ref_matmul(s->eout, s->egate, n, &w->expert_down[e], s->row);
        for (int r = 0; r < n; r++) {
            const int64_t t = s->members[r] / K;
            const float wt = s->rw[s->members[r]];
            for (int i = 0; i < H; i++)
                s->moe[t * H + i] += wt * s->eout[(int64_t)r * H + i];
        }
    }
    dg_ref_rmsnorm(s->moe, s->moe, L->post_ffn_norm_2, T, H, eps);

    /* x' = (h + rms(d' + m')) * layer_scalar (encoder or decoder copy) */
    for (int64_t i = 0; i < T * H; i++)
        s->tmp[i] = s->dense[i] + s->moe[i];
    dg_ref_rmsnorm(s->tmp, s->tmp, L->post_ffn_norm, T, H, eps);
    scalar = mode == PASS_ENCODER ? w->scalar_encoder : w->scalar_decoder;
    for (int64_t i = 0; i < T * H; i++)
        s->x[i] = (s->h[i] + s->tmp[i]) * scalar;
    return 0;
}

/* x[t] = E[ids[t]] * c */
static void embed(const struct dg_cpu_model *cm, const int32_t *ids, int64_t T, float *x)
{
    const struct dg_weight *E = &cm->m->embed;
    const int64_t H = E->cols;
    for (int64_t t = 0; t < T; t++) {
        const unsigned char *row = (const unsigned char *)E->data +
                                   (size_t)ids[t] * (size_t)H * dg_dtype_size(E->dtype);
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = dg_load_f32(row, E->dtype, (size_t)i) * cm->embed_scale;
    }
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
    if ((rc = scratch_alloc(&s, c, T, kv->length, err)) < 0)
        return rc;
    embed(cm, ids, T, s.x);
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

int dg_cpu_soft_embed(const struct dg_cpu_model *cm, const float *probs, int64_t CL, float *soft,
                      struct dg_error *err)
{
    const struct dg_model *m = cm->m;
    const int64_t V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    double *acc = calloc((size_t)(CL * H), sizeof *acc);
    float *row = malloc(sizeof(float) * (size_t)H);

    if (!acc || !row) {
        free(acc);
        free(row);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for self-conditioning");
    }
    for (int64_t v = 0; v < V; v++) {
        const unsigned char *src = (const unsigned char *)m->embed.data +
                                   (size_t)v * (size_t)H * dg_dtype_size(m->embed.dtype);
        int loaded = 0;
        for (int64_t t = 0; t < CL; t++) {
            const double pv = probs[t * V + v];
            if (pv == 0.0)
                continue;
            if (!loaded) {
                for (int64_t i = 0; i < H; i++)
                    row[i] = dg_load_f32(src, m->embed.dtype, (size_t)i);
                loaded = 1;
            }
            for (int64_t i = 0; i < H; i++)
                acc[t * H + i] += pv * row[i];
        }
    }
    for (int64_t i = 0; i < CL * H; i++)
        soft[i] = (float)acc[i] * cm->embed_scale;
    free(acc);
    free(row);
    return 0;
}

/* The SC MLP on a soft embedding: out[t] = down(gelu(gate u) * up u),
 * u = rms(soft[t]; pre_norm). */
static void self_conditioning(const struct dg_cpu_model *cm, const float *soft, int64_t CL,
                              struct scratch *s, float *out)
{
    const struct dg_model *m = cm->m;
    const struct dg_model_config *c = &m->cfg;
    const int64_t S = c->self_conditioning_size;

    dg_ref_rmsnorm(s->a, soft, cm->sc_pre_norm, CL, c->hidden_size, (float)c->rms_norm_eps);
    dg_ref_matmul(s->gate, s->a, CL, &m->sc_gate, s->row);
    dg_ref_matmul(s->up, s->a, CL, &m->sc_up, s->row);
    for (int64_t i = 0; i < CL * S; i++)
        s->gate[i] = dg_gelu_tanh(s->gate[i]) * s->up[i];
    dg_ref_matmul(out, s->gate, CL, &m->sc_down, s->row);
}

int dg_cpu_decode_soft(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                       const int32_t *canvas, int64_t CL, const float *soft, float *logits,
                       struct dg_error *err)
{
    const struct dg_model *m = cm->m;
    const struct dg_model_config *c = &m->cfg;
    const int H = c->hidden_size;
    struct scratch s;
    int rc;

    if ((rc = check_ids(c, canvas, CL, kv, "decoder", err)) < 0)
        return rc;
    if ((rc = scratch_alloc(&s, c, CL, kv->length, err)) < 0)
        return rc;
    embed(cm, canvas, CL, s.x);
    if (soft) {
        self_conditioning(cm, soft, CL, &s, s.tmp);
        for (int64_t i = 0; i < CL * H; i++)
            s.x[i] += s.tmp[i];
    }
    /* the weight-free post-norm applies on every step, SC or not */
    dg_ref_rmsnorm(s.x, s.x, NULL, CL, H, (float)c->rms_norm_eps);
    for (int l = 0; l < c->num_layers && rc == 0; l++)
        rc = layer_forward(cm, l, PASS_DECODER, NULL, kv, CL, &s, err);
    if (rc == 0) {
        dg_ref_rmsnorm(s.x, s.x, cm->final_norm, CL, H, (float)c->rms_norm_eps);
        dg_ref_matmul(logits, s.x, CL, &m->embed, s.row);
        dg_ref_softcap(logits, CL * c->vocab_size, (float)c->final_logit_softcapping);
    }
    scratch_free(&s);
    return rc;
}

int dg_cpu_decode(const struct dg_cpu_model *cm, const struct dg_kv_cache *kv,
                  const int32_t *canvas, int64_t CL, const float *sc_logits, float *logits,
                  struct dg_error *err)
{
    const int64_t V = cm->m->cfg.vocab_size, H = cm->m->cfg.hidden_size;
    float *p, *soft;
    int rc;

    if (!sc_logits)
        return dg_cpu_decode_soft(cm, kv, canvas, CL, NULL, logits, err);
    if (CL < 1)
        return dg_error_set(err, DG_E_INVAL, "decoder: %lld tokens; need at least one",
                            (long long)CL);
    p = malloc(sizeof(float) * (size_t)(CL * V));
    soft = malloc(sizeof(float) * (size_t)(CL * H));
    if (!p || !soft) {
        free(p);
        free(soft);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for self-conditioning");
    }
    memcpy(p, sc_logits, sizeof(float) * (size_t)(CL * V));
    for (int64_t t = 0; t < CL; t++)
        dg_ref_softmax(p + t * V, V);
    rc = dg_cpu_soft_embed(cm, p, CL, soft, err);
    free(p);
    if (rc == 0)
        rc = dg_cpu_decode_soft(cm, kv, canvas, CL, soft, logits, err);
    free(soft);
    return rc;
}
