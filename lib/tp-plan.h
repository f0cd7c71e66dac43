/*
 * tp-plan.h - how a model is split over T tensor-parallel ranks
 * (design.md §3.4), computed from the configuration alone:
 *
 *   vocabulary    contiguous slices of the embedding / tied LM head rows;
 *                 the slice bounds live here and nowhere else (T need not
 *                 divide V; slices may be rounded to a multiple of align)
 *   attention     contiguous ranges of query heads; each rank keeps the KV
 *                 heads its query heads read, so a KV head shared by ranks
 *                 is replicated (the full layers' 2 KV heads when T > 2);
 *                 q/k/v projections split by output rows, o_proj by input
 *                 columns (partial sums, one all-reduce)
 *   dense MLP     gate/up rows and down columns split over the width I
 *   experts       DG_EXPERTS_ACROSS: contiguous ranges of whole experts;
 *                 DG_EXPERTS_WIDTH: every expert split over its width Im
 *   replicated    norms, router, layer scalars, the self-conditioning MLP
 *                 (small; replicating it saves a collective per step)
 *
 * Ranges are balanced: sizes differ by at most one unit (a head, an expert,
 * align vocabulary rows; for the widths, one element, or width_align of
 * them where a backend asks: see dg_tp_plan_build_aligned).
 */
#ifndef DG_TP_PLAN_H
#define DG_TP_PLAN_H

#include <stdint.h>

#include "lib/error.h"
#include "lib/model-config.h"

#define DG_TP_MAX 64

enum dg_expert_split { DG_EXPERTS_ACROSS = 0, DG_EXPERTS_WIDTH = 1 };

struct dg_tp_range {
    int64_t begin, end; /* [begin, end) */
};

struct dg_tp_rank {
    struct dg_tp_range vocab;
    struct dg_tp_range q_heads;        /* same split for sliding and full layers */
    struct dg_tp_range kv_sliding;     /* KV heads this rank keeps, sliding layers */
    struct dg_tp_range kv_full;        /* KV heads this rank keeps, full layers */
    struct dg_tp_range mlp;            /* dense MLP width */
    struct dg_tp_range experts;        /* ACROSS: expert ids; WIDTH: all of them */
    struct dg_tp_range expert_width;   /* WIDTH: a slice of Im; ACROSS: all of it */
};

struct dg_tp_plan {
    int n_ranks;
    enum dg_expert_split experts;
    int vocab_align;
    int mlp_align, expert_align; /* the units the widths were split in (expert_align 0:
                                  * DG_EXPERTS_ACROSS, experts whole) */
    struct dg_tp_rank rank[DG_TP_MAX];
};

/* Split cfg over n ranks.  Errors: DG_E_INVAL (n outside 1 .. DG_TP_MAX,
 * more ranks than query heads, experts (ACROSS) or expert width (WIDTH),
 * or vocabulary slices of align rows). */
int dg_tp_plan_build(const struct dg_model_config *cfg, int n, enum dg_expert_split experts,
                     int vocab_align, struct dg_tp_plan *plan, struct dg_error *err);

/* The same, with the dense MLP's width (and under DG_EXPERTS_WIDTH each
 * expert's) split in units of width_align elements where the width holds
 * at least n of them: every slice then starts at a multiple of it, and
 * every one but the last (where width_align does not divide the width)
 * is a multiple of it; a width with fewer than n units is split element
 * by element, as dg_tp_plan_build does (plan->mlp_align and expert_align
 * say which).  For a backend whose kernels want such slices (the CUDA
 * backend's FP8 GEMM: gate/up rows a multiple of 64).  Errors: as
 * dg_tp_plan_build, and width_align < 1. */
int dg_tp_plan_build_aligned(const struct dg_model_config *cfg, int n,
                             enum dg_expert_split experts, int vocab_align, int width_align,
                             struct dg_tp_plan *plan, struct dg_error *err);

static inline int64_t dg_tp_len(struct dg_tp_range r)
{
    return r.end - r.begin;
}

/* The KV range a layer of kind `kind` uses on rank r. */
static inline struct dg_tp_range dg_tp_kv(const struct dg_tp_plan *p, int r, int full)
{
    return full ? p->rank[r].kv_full : p->rank[r].kv_sliding;
}

/* Weight elements held by rank r, by part. */
struct dg_tp_bytes {
    uint64_t embedding;     /* vocabulary slice of the embedding / LM head */
    uint64_t attention;     /* q/k/v/o projections */
    uint64_t mlp;           /* dense MLP */
    uint64_t experts;
    uint64_t replicated;    /* norms, router, scalars, self-conditioning MLP */
    uint64_t total;
    uint64_t kv_per_token;  /* KV cache of the full layers, per cached token */
    uint64_t kv_window;     /* KV cache of the sliding layers (their W-1 rows), fixed */
};

/* Bytes of rank r's weights at elem_bytes per element (2 for bf16), and
 * its KV cache per token at kv_elem_bytes per element. */
void dg_tp_plan_bytes(const struct dg_model_config *cfg, const struct dg_tp_plan *plan, int r,
                      int elem_bytes, int kv_elem_bytes, struct dg_tp_bytes *out);

/* Communication of one pass over `tokens` tokens (a canvas's denoising
 * step, or a prefill chunk or commit): the collectives a backend issues,
 * per rank, with activations reduced at act_bytes per element (8: the CPU
 * backend reduces in double; 2 or 4 on GPUs).  Zero with one rank. */
struct dg_tp_comm {
    uint64_t all_reduces, all_reduce_bytes;   /* per rank */
    uint64_t all_gathers, all_gather_bytes;   /* per rank, bytes sent */
};

/* filtered: whether the step's request uses top-k (1), top-p (2) or both (3). */
void dg_tp_comm_denoise(const struct dg_model_config *cfg, const struct dg_tp_plan *plan,
                        int64_t tokens, int self_cond, int filtered, int act_bytes,
                        struct dg_tp_comm *out);
void dg_tp_comm_encode(const struct dg_model_config *cfg, const struct dg_tp_plan *plan,
                       int64_t tokens, int act_bytes, struct dg_tp_comm *out);

#endif
