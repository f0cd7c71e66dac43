/* tp-plan.c - the tensor-parallel split of a model (see tp-plan.h). */
#include "lib/tp-plan.h"

#include <string.h>

#include "lib/sampler.h"

/* Range r of n balanced parts of [0, total). */
static struct dg_tp_range part(int64_t total, int n, int r)
{
    struct dg_tp_range x = {total * r / n, total * (r + 1) / n};
    return x;
}

/* Range r of n parts of a width of total elements, in units of align
 * where there are at least n units (the last unit may be short), else of
 * one element; *used: the unit taken. */
static struct dg_tp_range width_part(int64_t total, int n, int r, int align, int *used)
{
    const int64_t units = (total + align - 1) / align;
    struct dg_tp_range x;
    if (units < n) {
        *used = 1;
        return part(total, n, r);
    }
    *used = align;
    x = part(units, n, r);
    x.begin *= align;
    x.end = x.end * align < total ? x.end * align : total;
    return x;
}

int dg_tp_plan_build(const struct dg_model_config *cfg, int n, enum dg_expert_split experts,
                     int vocab_align, struct dg_tp_plan *plan, struct dg_error *err)
{
    return dg_tp_plan_build_aligned(cfg, n, experts, vocab_align, 1, plan, err);
}

int dg_tp_plan_build_aligned(const struct dg_model_config *cfg, int n,
                             enum dg_expert_split experts, int vocab_align, int width_align,
                             struct dg_tp_plan *plan, struct dg_error *err)
{
    const int nh = cfg->num_heads;
    const int gs = nh / cfg->num_kv_heads, gf = nh / cfg->num_global_kv_heads;
    int64_t units;

    memset(plan, 0, sizeof *plan);
    if (n < 1 || n > DG_TP_MAX)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: %d ranks (1 .. %d)", n,
                            DG_TP_MAX);
    if (vocab_align < 1)
        vocab_align = 1;
    if (width_align < 1)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: widths split in units of %d",
                            width_align);
    units = (cfg->vocab_size + vocab_align - 1) / vocab_align;
    if (n > nh)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: %d ranks for %d query heads", n,
                            nh);
    if (n > cfg->intermediate_size || n > units)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: %d ranks for an MLP of %d and "
                            "%lld vocabulary slices of %d", n, cfg->intermediate_size,
                            (long long)units, vocab_align);
    if (experts == DG_EXPERTS_ACROSS && n > cfg->num_experts)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: %d ranks for %d experts (split "
                            "along the expert width instead)", n, cfg->num_experts);
    if (experts == DG_EXPERTS_WIDTH && n > cfg->moe_intermediate_size)
        return dg_error_set(err, DG_E_INVAL, "tensor parallel: %d ranks for an expert width of "
                            "%d", n, cfg->moe_intermediate_size);
    plan->n_ranks = n;
    plan->experts = experts;
    plan->vocab_align = vocab_align;
    for (int r = 0; r < n; r++) {
        struct dg_tp_rank *k = &plan->rank[r];
        struct dg_tp_range u = part(units, n, r);
        k->vocab.begin = u.begin * vocab_align;
        k->vocab.end = u.end * vocab_align < cfg->vocab_size ? u.end * vocab_align
                                                             : cfg->vocab_size;
        k->q_heads = part(nh, n, r);
        k->kv_sliding.begin = k->q_heads.begin / gs;
        k->kv_sliding.end = (k->q_heads.end - 1) / gs + 1;
        k->kv_full.begin = k->q_heads.begin / gf;
        k->kv_full.end = (k->q_heads.end - 1) / gf + 1;
        k->mlp = width_part(cfg->intermediate_size, n, r, width_align, &plan->mlp_align);
        if (experts == DG_EXPERTS_ACROSS) {
            k->experts = part(cfg->num_experts, n, r);
            k->expert_width = (struct dg_tp_range){0, cfg->moe_intermediate_size};
            plan->expert_align = 0;
        } else {
            k->experts = (struct dg_tp_range){0, cfg->num_experts};
            k->expert_width = width_part(cfg->moe_intermediate_size, n, r, width_align,
                                         &plan->expert_align);
        }
    }
    return 0;
}

void dg_tp_plan_bytes(const struct dg_model_config *c, const struct dg_tp_plan *plan, int r,
                      int elem_bytes, int kv_elem_bytes, struct dg_tp_bytes *out)
{
    const struct dg_tp_rank *k = &plan->rank[r];
    const uint64_t H = (uint64_t)c->hidden_size, E = (uint64_t)c->num_experts;
    const uint64_t nq = (uint64_t)dg_tp_len(k->q_heads);
    uint64_t emb, att = 0, mlp = 0, exp = 0, rep = 0, kvt = 0, kvw = 0;

    emb = (uint64_t)dg_tp_len(k->vocab) * H;
    for (int l = 0; l < c->num_layers; l++) {
        const int full = c->layer_kind[l] == DG_LAYER_FULL;
        const uint64_t hd = (uint64_t)dg_layer_head_dim(c, l);
        const uint64_t nkv = (uint64_t)dg_tp_len(full ? k->kv_full : k->kv_sliding);
        att += nq * hd * H * 2 + nkv * hd * H * (full ? 1 : 2);
        mlp += 3 * H * (uint64_t)dg_tp_len(k->mlp);
        exp += (uint64_t)dg_tp_len(k->experts) * 3 * (uint64_t)dg_tp_len(k->expert_width) * H;
        rep += 8 * H + 2 * hd + E * H + E + 2;
        if (full)
            kvt += 2 * nkv * hd;
        else if (c->sliding_window > 1)
            kvw += 2 * nkv * hd * (uint64_t)(c->sliding_window - 1);
    }
    rep += 2 * H + 3 * H * (uint64_t)c->self_conditioning_size;
    memset(out, 0, sizeof *out);
    out->embedding = emb * (uint64_t)elem_bytes;
    out->attention = att * (uint64_t)elem_bytes;
    out->mlp = mlp * (uint64_t)elem_bytes;
    out->experts = exp * (uint64_t)elem_bytes;
    out->replicated = rep * (uint64_t)elem_bytes;
    out->total = out->embedding + out->attention + out->mlp + out->experts + out->replicated;
    out->kv_per_token = kvt * (uint64_t)kv_elem_bytes;
    out->kv_window = kvw * (uint64_t)kv_elem_bytes;
}

static void add(struct dg_tp_comm *c, int gather, uint64_t calls, uint64_t bytes)
{
    if (gather) {
        c->all_gathers += calls;
        c->all_gather_bytes += bytes;
    } else {
        c->all_reduces += calls;
        c->all_reduce_bytes += bytes;
    }
}

/* The forward pass: the embedding reduce (with the self-conditioning
 * partial beside it), then per layer the attention output and the two FFN
 * outputs (one call for both). */
static void forward_comm(const struct dg_model_config *cfg, int64_t n, int self_cond,
                         int act_bytes, struct dg_tp_comm *out)
{
    const uint64_t row = (uint64_t)cfg->hidden_size * (uint64_t)act_bytes;
    add(out, 0, 1, (uint64_t)n * row * (self_cond ? 2 : 1));
    add(out, 0, (uint64_t)cfg->num_layers * 2, (uint64_t)cfg->num_layers * (uint64_t)n * row * 3);
}

void dg_tp_comm_encode(const struct dg_model_config *cfg, const struct dg_tp_plan *plan,
                       int64_t tokens, int act_bytes, struct dg_tp_comm *out)
{
    memset(out, 0, sizeof *out);
    if (plan->n_ranks > 1)
        forward_comm(cfg, tokens, 0, act_bytes, out);
}

void dg_tp_comm_denoise(const struct dg_model_config *cfg, const struct dg_tp_plan *plan,
                        int64_t tokens, int self_cond, int filtered, int act_bytes,
                        struct dg_tp_comm *out)
{
    const uint64_t n = (uint64_t)tokens;
    memset(out, 0, sizeof *out);
    if (plan->n_ranks <= 1)
        return;
    forward_comm(cfg, tokens, self_cond, act_bytes, out);
    /* the sampler: one all-gather of every position's slice statistics */
    add(out, 1, 1, n * sizeof(struct dg_row_stats));
    /* the filter threshold: 32 bisection rounds of per-position counts
     * (top-k) or masses (top-p, after the row maximum and total mass) */
    if (filtered & 1)
        add(out, 0, 32, 32 * n * 8);
    if (filtered & 2)
        add(out, 0, 34, n * 4 + n * 8 + 32 * n * 8);
}
