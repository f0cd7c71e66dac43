/* cuda-forward.c - the forward pass on one GPU (see cuda-forward.h; the
 * maths is lib/cpu-forward.h's). */
#include "kernels/cuda-forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/fp8-lt.h"
#include "kernels/nccl.h"
#include "kernels/prof.h"

#define TRY(call)                                                                       \
    do {                                                                                \
        if ((rc = (call)) < 0)                                                          \
            return rc;                                                                  \
    } while (0)

/* With a profiler attached, the device time since the last mark goes to
 * label (prof.h). */
#define MARK(label)                                                            \
    do {                                                                       \
        if (cx->prof)                                                          \
            TRY(dg_prof_mark(cx->prof, label, cx->stream, err));               \
    } while (0)

/* ---- the KV cache --------------------------------------------------------- */

/* Element i of an array of e's elements. */
static void *at(const void *p, int64_t i, enum dg_elt e)
{
    return (unsigned char *)(uintptr_t)p + i * dg_elt_size(e);
}

/* Bytes of one cached row of layer l: the KV heads this rank holds. */
static uint64_t layer_row_bytes(const struct dg_cuda_model *cm, int l)
{
    return (uint64_t)cm->layers[l].nkv * (uint64_t)cm->layers[l].hd *
           (uint64_t)dg_elt_size(cm->elt);
}

uint64_t dg_cuda_kv_bytes(const struct dg_cuda_model *cm, int64_t max_length, int max_cl)
{
    uint64_t bytes = 0;
    for (int l = 0; l < cm->cfg.num_layers; l++)
        bytes += 2 * (((uint64_t)(max_length + max_cl) * layer_row_bytes(cm, l) + 255) &
                      ~(uint64_t)255);
    return bytes;
}

int dg_cuda_kv_init(struct dg_cuda_kv *kv, const struct dg_cuda_model *cm, int64_t max_length,
                    int max_cl, struct dg_error *err)
{
    const struct dg_model_config *c = &cm->cfg;
    unsigned char *p;
    int rc;

    memset(kv, 0, sizeof *kv);
    if (max_length < 1 || max_cl < 1 || max_length > c->max_position_embeddings)
        return dg_error_set(err, DG_E_INVAL, "cuda kv cache: %lld positions, canvas %d "
                            "(the model has %lld positions)", (long long)max_length, max_cl,
                            (long long)c->max_position_embeddings);
    kv->k = calloc((size_t)c->num_layers, sizeof *kv->k);
    kv->v = calloc((size_t)c->num_layers, sizeof *kv->v);
    if (!kv->k || !kv->v) {
        dg_cuda_kv_free(kv);
        return dg_error_set(err, DG_E_NOMEM, "cuda kv cache: out of memory");
    }
    kv->bytes = dg_cuda_kv_bytes(cm, max_length, max_cl);
    if ((rc = dg_cuda_alloc(&kv->block, (size_t)kv->bytes, cm->dev, err)) < 0) {
        dg_error_prefix(err, "cuda kv cache: %.1f MiB", (double)kv->bytes / (1 << 20));
        dg_cuda_kv_free(kv);
        return rc;
    }
    p = kv->block;
    for (int l = 0; l < c->num_layers; l++) {
        const uint64_t b = ((uint64_t)(max_length + max_cl) * layer_row_bytes(cm, l) + 255) &
                           ~(uint64_t)255;
        kv->k[l] = p;
        kv->v[l] = p + b;
        p += 2 * b;
    }
    kv->n_layers = c->num_layers;
    kv->elt = cm->elt;
    kv->max_length = max_length;
    kv->max_cl = max_cl;
    return 0;
}

void dg_cuda_kv_free(struct dg_cuda_kv *kv)
{
    dg_cuda_free(kv->block);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

/* ---- the context ----------------------------------------------------------- */

int dg_cuda_ctx_init(struct dg_cuda_ctx *cx, const struct dg_cuda_model *cm, struct dg_error *err)
{
    int rc;
    memset(cx, 0, sizeof *cx);
    cx->cm = cm;
    cx->dev = cm->dev;
    if ((rc = dg_cuda_stream_create(&cx->stream, cm->dev, err)) < 0 ||
        (rc = dg_blas_create(cm->dev, cx->stream, &cx->blas, err)) < 0 ||
        (rc = dg_cuda_stream_create(&cx->side, cm->dev, err)) < 0 ||
        (rc = dg_blas_create(cm->dev, cx->side, &cx->side_blas, err)) < 0 ||
        (rc = dg_cuda_event_create(&cx->fork, cm->dev, err)) < 0 ||
        (rc = dg_cuda_event_create(&cx->join, cm->dev, err)) < 0) {
        dg_cuda_ctx_free(cx);
        return rc;
    }
    return 0;
}

void dg_cuda_ctx_free(struct dg_cuda_ctx *cx)
{
    struct dg_error ignored;
    if (cx->stream)
        dg_cuda_stream_sync(cx->stream, cx->dev, &ignored);
    if (cx->side)
        dg_cuda_stream_sync(cx->side, cx->dev, &ignored);
    dg_blas_destroy(cx->blas);
    dg_blas_destroy(cx->side_blas);
    dg_fp8_lt_destroy(cx->lt);
    dg_fp8_lt_destroy(cx->side_lt);
    dg_cuda_event_destroy(cx->fork);
    dg_cuda_event_destroy(cx->join);
    dg_cuda_stream_destroy(cx->stream);
    dg_cuda_stream_destroy(cx->side);
    dg_cuda_free(cx->scratch);
    dg_cuda_free(cx->seq_tab);
    dg_cuda_free(cx->dummy_kv);
    free(cx->h_seq_tab);
    free(cx->h_q_seq);
    free(cx->h_soft_src);
    free(cx->h_ids);
    free(cx->h_pos);
    memset(cx, 0, sizeof *cx);
}

/* Scratch for T tokens (kept when large enough). */
static int reserve_tokens(struct dg_cuda_ctx *cx, int64_t T, struct dg_error *err)
{
    const struct dg_model_config *c = &cx->cm->cfg;
    const int64_t H = c->hidden_size, E = c->num_experts, K = c->top_k_experts;
    const int64_t wide = cx->cm->mlp_w > c->self_conditioning_size
                             ? cx->cm->mlp_w : c->self_conditioning_size;
    int64_t qmax = 0, kvmax = 0;
    const size_t es = (size_t)dg_elt_size(cx->cm->elt);
    const int fp8 = cx->cm->fp8;
    int64_t kmax;             /* the widest projection input */
    size_t total = 0, off = 0, ws = 0;
    unsigned char *b;
    int rc;

    if (T <= cx->tokens_cap)
        return 0;
    T = (T + 63) & ~(int64_t)63;
    for (int l = 0; l < c->num_layers; l++) {
        const int64_t hd = cx->cm->layers[l].hd;
        if ((int64_t)cx->cm->nq * hd > qmax)
            qmax = (int64_t)cx->cm->nq * hd;
        if ((int64_t)cx->cm->layers[l].nkv * hd > kvmax)
            kvmax = (int64_t)cx->cm->layers[l].nkv * hd;
        /* the attention's work space for any bucket a pass may take */
        for (int64_t bk = 64; bk <= T; bk = dg_cuda_bucket(bk + 1)) {
            const size_t w = dg_cuda_attention_batch_ws_bytes(cx->cm->elt, bk, cx->cm->nq,
                                                              cx->cm->layers[l].nkv, (int)hd);
            if (w > ws)
                ws = w;
        }
    }
    kmax = H > qmax ? H : qmax;
    if (wide > kmax)
        kmax = wide;
    {
        const struct { void **ptr; size_t bytes; } plan[] = {
            {&cx->x, (size_t)(T * H) * es},        {&cx->a, (size_t)(T * H) * es},
            {&cx->a_router, (size_t)(T * H) * es}, {&cx->a_experts, (size_t)(T * H) * es},
            {&cx->attn, (size_t)(T * H) * es},     {&cx->soft, (size_t)(T * H) * es},
            {&cx->q, (size_t)(T * qmax) * es},     {&cx->o, (size_t)(T * qmax) * es},
            {&cx->kraw, (size_t)(T * kvmax) * es}, {&cx->vraw, (size_t)(T * kvmax) * es},
            {&cx->qkv, (size_t)(T * (qmax + 2 * kvmax)) * es},
            {&cx->attn_ws, ws},
            {&cx->k, (size_t)(T * kvmax) * es},    {&cx->v, (size_t)(T * kvmax) * es},
            {&cx->gu, (size_t)(T * 2 * wide) * es}, {&cx->act, (size_t)(T * wide) * es},
            /* dense and moe adjacent: one all-reduce sums both */
            {(void **)&cx->dense, (size_t)(2 * T * H) * 4},
            {(void **)&cx->rlogits, (size_t)(T * E) * 4}, {(void **)&cx->rw, (size_t)(T * K) * 4},
            {(void **)&cx->ridx, (size_t)(T * K) * 4},   {(void **)&cx->ids, (size_t)T * 4},
            {(void **)&cx->q_seq, (size_t)T * 4},
            {(void **)&cx->soft_src, (size_t)T * sizeof(void *)},
            {(void **)&cx->pos, (size_t)T * 8},
            {(void **)&cx->moe_scratch,
             fp8 ? dg_cuda_moe_scratch_q(T, (int)K, (int)H, cx->cm->exp_w, cx->cm->n_exp,
                                         (int)E)
                 : dg_cuda_moe_scratch_e(cx->cm->elt, T, (int)K, (int)H, cx->cm->exp_w,
                                         cx->cm->n_exp, (int)E)},
            /* FP8: a projection's input rows quantized */
            {(void **)&cx->qa, fp8 ? (size_t)(T * kmax) : 0},
            {(void **)&cx->sa, fp8 ? (size_t)T * 4 : 0},
        };
        const size_t n_plan = sizeof plan / sizeof plan[0];
        for (size_t i = 0; i < n_plan; i++)
            total += (plan[i].bytes + 255) & ~(size_t)255;
        dg_cuda_free(cx->scratch);
        free(cx->h_ids);
        free(cx->h_pos);
        free(cx->h_q_seq);
        free(cx->h_soft_src);
        cx->scratch = NULL;
        cx->tokens_cap = 0;
        cx->generation++;
        cx->h_ids = malloc(sizeof *cx->h_ids * (size_t)T);
        cx->h_pos = malloc(sizeof *cx->h_pos * (size_t)T);
        cx->h_q_seq = malloc(sizeof *cx->h_q_seq * (size_t)T);
        cx->h_soft_src = malloc(sizeof *cx->h_soft_src * (size_t)T);
        if (!cx->h_ids || !cx->h_pos || !cx->h_q_seq || !cx->h_soft_src)
            return dg_error_set(err, DG_E_NOMEM, "cuda forward: out of memory for %lld tokens",
                                (long long)T);
        if ((rc = dg_cuda_alloc(&cx->scratch, total, cx->dev, err)) < 0) {
            dg_error_prefix(err, "cuda forward: scratch for %lld tokens (%.1f MiB)",
                            (long long)T, (double)total / (1 << 20));
            return rc;
        }
        b = cx->scratch;
        for (size_t i = 0; i < n_plan; i++) {
            *plan[i].ptr = b + off;
            off += (plan[i].bytes + 255) & ~(size_t)255;
        }
    }
    cx->scratch_bytes = total;
    cx->attn_ws_bytes = ws;
    cx->tokens_cap = T;
    return 0;
}

/* Tables for n sequences and the dummy one (kept when large enough); the
 * dummy's one-row caches. */
static int reserve_seqs(struct dg_cuda_ctx *cx, int n, struct dg_error *err)
{
    const struct dg_cuda_model *cm = cx->cm;
    const int L = cm->cfg.num_layers;
    size_t cells;
    int rc;
    if (n <= cx->seq_cap)
        return 0;
    n = (n + 15) & ~15;
    cells = (size_t)L * (size_t)(n + 1);
    dg_cuda_free(cx->seq_tab);
    free(cx->h_seq_tab);
    cx->seq_tab = NULL;
    cx->seq_cap = 0;
    cx->generation++;
    cx->h_seq_tab = malloc(sizeof *cx->h_seq_tab * cells);
    if (!cx->h_seq_tab)
        return dg_error_set(err, DG_E_NOMEM, "cuda forward: out of memory for %d sequences", n);
    if ((rc = dg_cuda_alloc((void **)&cx->seq_tab, sizeof *cx->seq_tab * cells, cx->dev, err)) <
        0)
        return rc;
    if (!cx->dummy_kv) {
        size_t bytes = 0;
        for (int l = 0; l < L; l++)
            bytes += 2 * (size_t)cm->layers[l].nkv * (size_t)cm->layers[l].hd *
                     (size_t)dg_elt_size(cm->elt);
        if ((rc = dg_cuda_alloc(&cx->dummy_kv, bytes, cx->dev, err)) < 0)
            return rc;
    }
    {
        unsigned char *p = cx->dummy_kv;
        for (int l = 0; l < L; l++) {
            const size_t row = (size_t)cm->layers[l].nkv * (size_t)cm->layers[l].hd *
                               (size_t)dg_elt_size(cm->elt);
            cx->h_seq_tab[(size_t)l * (size_t)(n + 1) + (size_t)n] =
                (struct dg_attn_seq){p, p + row, 0, 0};
            p += 2 * row;
        }
    }
    cx->seq_cap = n;
    return 0;
}

/* ---- checks and staging ------------------------------------------------------ */

/* Tokens the encoder sequences of the same pass put in kv's cache before
 * a decoder sequence's canvas (0: kv is not among them). */
static int64_t ahead_of(const struct dg_cuda_kv *kv, const struct dg_cuda_seq *enc, int n_enc)
{
    for (int j = 0; j < n_enc; j++)
        if (enc[j].kv == kv)
            return enc[j].n;
    return 0;
}

/* Checks one part of a pass (the encoder sequences, enc NULL; or the
 * decoder ones, each after what enc appends to its cache) and sums its
 * tokens.  Errors: DG_E_INVAL (sizes, ids, a cache twice in the part),
 * DG_E_RANGE (past a cache). */
static int check_part(const struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                      int decoder, const struct dg_cuda_seq *enc, int n_enc, int64_t *T_out,
                      struct dg_error *err)
{
    const struct dg_model_config *c = &cx->cm->cfg;
    const char *what = decoder ? "decoder" : "encoder";
    int64_t T = 0;
    for (int i = 0; i < n_seqs; i++) {
        const struct dg_cuda_seq *s = &seqs[i];
        int64_t len;
        if (!s->kv || !s->kv->block || s->n < 1 || (decoder && s->n > s->kv->max_cl))
            return dg_error_set(err, DG_E_INVAL, "cuda %s: sequence %d: %lld tokens%s", what, i,
                                (long long)s->n, s->kv && s->kv->block ? "" : ", no cache");
        len = s->kv->length + (decoder ? ahead_of(s->kv, enc, n_enc) : 0);
        if (len + s->n > s->kv->max_length)
            return dg_error_set(err, DG_E_RANGE, "cuda %s: sequence %d: positions %lld..%lld run "
                                "past the cache's %lld positions", what, i, (long long)len,
                                (long long)(len + s->n - 1), (long long)s->kv->max_length);
        for (int64_t t = 0; t < s->n; t++)
            if (s->ids[t] < 0 || s->ids[t] >= c->vocab_size)
                return dg_error_set(err, DG_E_INVAL, "cuda %s: sequence %d: token %lld is id %d, "
                                    "outside [0, %lld)", what, i, (long long)t, s->ids[t],
                                    (long long)c->vocab_size);
        for (int j = 0; j < i; j++)
            if (seqs[j].kv == s->kv)
                return dg_error_set(err, DG_E_INVAL, "cuda %s: one cache twice in a batch", what);
        T += s->n;
    }
    *T_out = T;
    return 0;
}

int dg_cuda_pass_check(const struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                       const struct dg_cuda_seq *dec, int n_dec, int64_t *enc_tokens,
                       int64_t *dec_tokens, struct dg_error *err)
{
    int rc;
    if (n_enc < 0 || n_dec < 0 || n_enc + n_dec < 1)
        return dg_error_set(err, DG_E_INVAL, "cuda %s: an empty batch",
                            n_dec > 0 ? "decoder" : "encoder");
    TRY(check_part(cx, enc, n_enc, 0, NULL, 0, enc_tokens, err));
    return check_part(cx, dec, n_dec, 1, enc, n_enc, dec_tokens, err);
}

/* Rows t0 .. of the staging arrays for one part of a pass: its sequences'
 * tokens one after another, each sequence i at table entry tab0 + i,
 * positions from its cache's length plus `ahead` (decoder rows after the
 * same pass's encoder rows).  Returns the next row. */
static int64_t stage_part(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                          int tab0, int64_t t, const struct dg_cuda_seq *enc, int n_enc)
{
    const struct dg_model_config *c = &cx->cm->cfg;
    const int L = c->num_layers, W = c->sliding_window, H = c->hidden_size;
    const size_t es = (size_t)dg_elt_size(cx->cm->elt);
    for (int i = 0; i < n_seqs; i++) {
        const int64_t len = seqs[i].kv->length + ahead_of(seqs[i].kv, enc, n_enc);
        for (int64_t j = 0; j < seqs[i].n; j++, t++) {
            cx->h_ids[t] = seqs[i].ids[j];
            cx->h_pos[t] = len + j;
            cx->h_q_seq[t] = tab0 + i;
            cx->h_soft_src[t] = seqs[i].soft ? (const unsigned char *)seqs[i].soft +
                                                   (size_t)(j * H) * es
                                             : NULL;
        }
        /* sliding layers read the last W-1 committed rows and the new
         * ones, full layers every row */
        for (int l = 0; l < L; l++) {
            const int64_t start =
                cx->cm->layers[l].sliding && len > W - 1 ? len - (W - 1) : 0;
            cx->h_seq_tab[(size_t)l * (size_t)(cx->seq_cap + 1) + (size_t)(tab0 + i)] =
                (struct dg_attn_seq){seqs[i].kv->k[l], seqs[i].kv->v[l], start,
                                     len + seqs[i].n - start};
        }
    }
    return t;
}

/* Pad rows t .. end-1: id 0, position 0, the dummy sequence (entry
 * seq_cap of every table: a one-row cache per layer, no keys read), no
 * soft input. */
static void stage_pads(struct dg_cuda_ctx *cx, int64_t t, int64_t end)
{
    for (; t < end; t++) {
        cx->h_ids[t] = 0;
        cx->h_pos[t] = 0;
        cx->h_q_seq[t] = cx->seq_cap;
        cx->h_soft_src[t] = NULL;
    }
}

/* Scratch for Tb tokens, and the batch's ids, positions, token
 * sequences, self-conditioning sources and per-layer sequence tables on
 * the device: the encoder rows, padded to Te, then the decoder rows,
 * padded to Tb. */
static int stage_batch(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                       int64_t Te, const struct dg_cuda_seq *dec, int n_dec, int64_t Tb,
                       struct dg_error *err)
{
    const int L = cx->cm->cfg.num_layers;
    int64_t t;
    int rc;
    TRY(reserve_tokens(cx, Tb, err));
    TRY(reserve_seqs(cx, n_enc + n_dec, err));
    t = stage_part(cx, enc, n_enc, 0, 0, NULL, 0);
    stage_pads(cx, t, Te);
    t = stage_part(cx, dec, n_dec, n_enc, Te, enc, n_enc);
    stage_pads(cx, t, Tb);
    /* (pageable host memory: the copies complete before these return) */
    TRY(dg_cuda_copy_async(cx->ids, cx->h_ids, sizeof *cx->h_ids * (size_t)Tb, cx->stream,
                           cx->dev, err));
    TRY(dg_cuda_copy_async(cx->pos, cx->h_pos, sizeof *cx->h_pos * (size_t)Tb, cx->stream,
                           cx->dev, err));
    TRY(dg_cuda_copy_async(cx->q_seq, cx->h_q_seq, sizeof *cx->h_q_seq * (size_t)Tb, cx->stream,
                           cx->dev, err));
    TRY(dg_cuda_copy_async(cx->soft_src, cx->h_soft_src, sizeof *cx->h_soft_src * (size_t)Tb,
                           cx->stream, cx->dev, err));
    TRY(dg_cuda_copy_async(cx->seq_tab, cx->h_seq_tab,
                           sizeof *cx->h_seq_tab * (size_t)L * (size_t)(cx->seq_cap + 1),
                           cx->stream, cx->dev, err));
    return 0;
}

/* ---- tensor parallelism --------------------------------------------------------- */

static enum dg_nccl_type elt_type(enum dg_elt e)
{
    return e == DG_ELT_F32 ? DG_NCCL_F32 : DG_NCCL_BF16;
}

/* Sum a partial result over the ranks (nothing with one). */
static int reduce(struct dg_cuda_ctx *cx, void *buf, int64_t n, enum dg_nccl_type t,
                  struct dg_error *err)
{
    if (!cx->nccl)
        return 0;
    return dg_nccl_all_reduce(cx->nccl, buf, (size_t)n, t, DG_COLL_SUM, err);
}

/* ---- the layer --------------------------------------------------------------- */

/* x [T, H] -> x' for layer l.  Each sequence's K/V rows go into its cache
 * at rows length..; encoder: causal, decoder: bidirectional. */
/* Where a product is queued: a stream with its cuBLAS and cuBLASLt
 * handles (the context's main stream, or its side stream). */
struct lane {
    dg_stream_t st;
    struct dg_blas *blas;
    struct dg_fp8_lt *lt;
};

static struct lane main_lane(const struct dg_cuda_ctx *cx)
{
    return (struct lane){cx->stream, cx->blas, cx->lt};
}

/* x [T, K] quantized per row into cx->qa / cx->sa on lane `on`, unless
 * *x_in_qa says it is there already (then set; x_in_qa NULL: always). */
static int quantize_in(struct dg_cuda_ctx *cx, const struct lane *on, const void *x, int64_t T,
                       int64_t K, int *x_in_qa, struct dg_error *err)
{
    int rc;
    if (!x_in_qa || !*x_in_qa)
        TRY(dg_cuda_fp8_quantize_rows(cx->cm->elt, cx->qa, cx->sa, x, T, (int)K, on->st,
                                      cx->dev, err));
    if (x_in_qa)
        *x_in_qa = 1;
    return 0;
}

/* FP8 through cuBLASLt (on->lt): x [T, K] quantized as quantize_in does,
 * then the product with W [N, K] as unscaled sums alone into *S
 * (fp8-lt.h's dg_fp8_lt_product), for a pass that reads them and applies
 * the scales itself.  *S NULL where cuBLASLt does not take them in one go
 * (then proj, whose quantization x_in_qa skips). */
static int sums_alone(struct dg_cuda_ctx *cx, const struct lane *on, const void *x, int64_t T,
                      const void *W, int64_t N, int64_t K, int *x_in_qa, const float **S,
                      struct dg_error *err)
{
    int rc;
    *S = NULL;
    TRY(quantize_in(cx, on, x, T, K, x_in_qa, err));
    rc = dg_fp8_lt_product(on->lt, cx->qa, (const uint8_t *)W, T, N, K, S, err);
    return rc == -DG_E_UNSUPPORTED ? 0 : rc; /* (*S set only where taken) */
}

/* y[T, N] = x[T, K] W^T (+ y when accumulate), W [N, K] nn.Linear, queued
 * on lane `on`: bf16 or fp32 through cuBLAS (Ws NULL), or E4M3 with row
 * scales Ws, x then quantized per row first (W8A8, fp8-gemm.h) into
 * cx->qa / cx->sa, unless *x_in_qa says a projection before this one
 * already put this x there (then set; x_in_qa NULL: always quantize), the
 * product through cuBLASLt (on->lt, fp8-lt.h) where it has an algorithm
 * for the shape and fp8-gemm.cu's kernel otherwise; y of the model's type,
 * or fp32 when y_f32. */
static int proj(struct dg_cuda_ctx *cx, const struct lane *on, void *y, int y_f32,
                int accumulate, const void *x, int64_t T, const void *W, const float *Ws,
                int64_t N, int64_t K, int *x_in_qa, struct dg_error *err)
{
    int rc;
    if (!Ws)
        return dg_blas_gemm_e(on->blas, cx->cm->elt, y, y_f32, x, T, W, 0, N, K, K, 1.0f,
                              accumulate ? 1.0f : 0.0f, err);
    TRY(quantize_in(cx, on, x, T, K, x_in_qa, err));
    if (on->lt) {
        /* cuBLASLt where it has an algorithm for the shape, else the kernel */
        rc = dg_fp8_lt_gemm(on->lt, y, y_f32, accumulate, cx->qa, cx->sa, (const uint8_t *)W,
                            Ws, T, N, K, err);
        if (rc != -DG_E_UNSUPPORTED)
            return rc;
    }
    /* (the hint only picks the rows a pass takes: 32, 64 or 128) */
    return dg_cuda_fp8_gemm_acc(y, y_f32, accumulate, cx->qa, cx->sa, (const uint8_t *)W, Ws,
                                NULL, NULL, 1, T, N, K, T > 128 ? 128 : (int)T, on->st,
                                cx->dev, err);
}

/* Whether layer L's q, k (and on sliding layers v) projections lie one
 * after another in memory, rows and (FP8) row scales alike, so that one
 * GEMM of qdim + kvdim (+ kvdim) rows computes all three
 * (cuda-model.c places a layer's matrices so where the sizes allow). */
static int qkv_adjacent(const struct dg_cuda_model *cm, const struct dg_cuda_layer *L,
                        int64_t qdim, int64_t kvdim, int64_t H)
{
    const int64_t wes = L->q_proj_s ? 1 : dg_elt_size(cm->elt); /* bytes a weight */
    const char *q = L->q_proj, *k = L->k_proj, *v = L->v_proj;
    if (k != q + qdim * H * wes || (L->sliding && v != k + kvdim * H * wes))
        return 0;
    return !L->q_proj_s || (L->k_proj_s == L->q_proj_s + qdim &&
                            (!L->sliding || L->v_proj_s == L->k_proj_s + kvdim));
}

/* What a layer finds of its input norm when it starts: nothing (it norms
 * x itself), rms(x) * input_norm in cx->a (the layer before wrote it in
 * its last pass), or that and a's rows quantized in cx->qa / cx->sa (FP8
 * q, k, v projections). */
enum norm_in { NORM_NONE, NORM_DONE, NORM_QUANTIZED };

/* The feed-forward block's last pass over rows r0 .. r0+n-1 of the
 * pass's T: x' = (x + rms(rms(dense) + rms(moe))) * scalar, and where
 * next_w is set that pass also writes rms(x') * next_w into a (and its
 * rows quantized into qa / sa when `quantized`). */
static int combine_rows(struct dg_cuda_ctx *cx, const struct dg_cuda_layer *L, int64_t r0,
                        int64_t n, const float *moe, float scalar, const void *next_w,
                        int quantized, struct dg_error *err)
{
    const enum dg_elt e = cx->cm->elt;
    const int64_t H = cx->cm->cfg.hidden_size;
    const float eps = (float)cx->cm->cfg.rms_norm_eps;
    void *x = at(cx->x, r0 * H, e);
    const float *dense = cx->dense + r0 * H;
    moe += r0 * H;
    if (!next_w)
        return dg_cuda_ffn_combine_e(e, x, dense, moe, L->post_ffn_norm_1, L->post_ffn_norm_2,
                                     L->post_ffn_norm, n, H, eps, scalar, cx->stream, cx->dev,
                                     err);
    return dg_cuda_ffn_combine_norm_e(e, x, dense, moe, L->post_ffn_norm_1, L->post_ffn_norm_2,
                                      L->post_ffn_norm, n, H, eps, scalar, at(cx->a, r0 * H, e),
                                      next_w, quantized ? cx->qa + r0 * H : NULL,
                                      quantized ? cx->sa + r0 : NULL, cx->stream, cx->dev, err);
}

/* The first EXPERTS_PREFETCH bytes of the layer's bf16 experts' gate/up
 * weights (the tiles the experts' one launch takes first: expert by
 * expert, moe-wgmma.cu) fetched into the L2 on the side stream, queued
 * after the o projection: the fetch runs while the norms, the router and
 * the routing leave the DRAM idle, marked evict-last so that the dense
 * MLP's weights, read meanwhile, do not push it out.  A small gain,
 * measured side by side on nvidia-h200 in four runs over two starts: bf16
 * batch 1 -0.04 to -0.16 ms a step (0.2-0.9%; 17.16 / 17.17 -> 17.13 /
 * 17.11 in run 217), batch 16 -0.2 to -1.2%, batch 4 unchanged.  Not for
 * FP8, whose experts are bound by the L2 rather than the DRAM (run 155):
 * batch 1 11.72-11.75 -> 11.94 ms with it (run 215).  More than 16 MB does
 * not stay (runs 213-214); run 161's fetch as the layer forked, before the
 * o projection, of 24 or 40 MB, gained nothing. */
#define EXPERTS_PREFETCH ((int64_t)16 << 20)

static int prefetch_experts(struct dg_cuda_ctx *cx, const struct dg_cuda_layer *L,
                            struct dg_error *err)
{
    const struct dg_cuda_model *cm = cx->cm;
    const int64_t all = (int64_t)cm->n_exp * 2 * cm->exp_w * cm->cfg.hidden_size *
                        (int64_t)dg_elt_size(cm->elt);
    int rc;
    TRY(dg_cuda_stream_after(cx->side, cx->stream, cx->fork, cx->dev, err));
    return dg_cuda_l2_prefetch(L->exp_gu, (all < EXPERTS_PREFETCH ? all : EXPERTS_PREFETCH) &
                                              ~(int64_t)15,
                               cx->side, cx->dev, err);
}

/* Layer l's forward over T rows: rows 0 .. Te-1 in encoder mode, Te ..
 * T-1 in decoder mode (the attention's mask and the layer scalar's copy
 * follow the row; both modes' keys and values are in the caches before
 * any row attends).  *in says what of its input norm is done (above), and
 * on return what of the next one's this layer did: the next layer's input
 * norm (quantized where its q, k, v projections are FP8), or after the
 * last layer the final norm of the decoder rows, in the feed-forward
 * combine's pass.  The last layer of an encoder pass (Te = T) stops once
 * its keys and values are in the caches (x is then left as it was); in a
 * pass of both modes the encoder rows' last combine is skipped (nothing
 * reads them). */
static int layer_forward(struct dg_cuda_ctx *cx, int l, int64_t Te, int64_t T,
                         enum norm_in *in, struct dg_error *err)
{
    const struct dg_cuda_model *cm = cx->cm;
    const struct dg_model_config *c = &cm->cfg;
    const struct dg_cuda_layer *L = &cm->layers[l];
    const enum dg_elt e = cm->elt;
    /* this rank's query heads, KV heads, MLP and expert widths */
    const int H = c->hidden_size, nh = cm->nq, hd = L->hd, nkv = L->nkv;
    const int64_t qdim = (int64_t)nh * hd, kvdim = (int64_t)nkv * hd;
    const int I = cm->mlp_w, E = c->num_experts, K = c->top_k_experts;
    const int Im = cm->exp_w, W = c->sliding_window;
    const float eps = (float)c->rms_norm_eps;
    const dg_stream_t st = cx->stream;
    const int dev = cx->dev;
    /* the experts' output right after the dense MLP's (this batch's T
     * rows each), so one all-reduce sums both; partial: each pick's
     * output a partial sum here (the experts split along their width) */
    float *moe = cx->dense + T * H;
    const int partial = Im < c->moe_intermediate_size;
    const struct lane on = main_lane(cx);
    /* the dense MLP beside the router and the experts, on the side stream
     * (it reads a, writes gu, act and dense, and with FP8 qa and sa: none
     * of which the router or the experts touch); one stream where the side
     * has no cuBLASLt handle to match the main one's, or under a profiler
     * (so its marks time each stage alone) */
    const int fork = cx->side && !cx->prof && (!cx->lt || cx->side_lt);
    const struct lane dn = fork ? (struct lane){cx->side, cx->side_blas, cx->side_lt} : on;
    int rc;

    /* q, k and v read one input: quantized once (or before this layer) */
    int a_in_qa = *in == NORM_QUANTIZED;
    const void *next_w = NULL;     /* the next norm's weight, */
    enum norm_in next = NORM_NONE; /* and what of it this layer does */

    /* attention: q, k, v projections, their norms and RoPE for every token */
    if (*in == NORM_NONE) {
        TRY(dg_cuda_rmsnorm_e(e, cx->a, cx->x, L->input_norm, T, H, eps, st, dev, err));
        MARK("norms");
    }
    {
        /* the layer's table of sequences (its K/V caches) */
        const struct dg_attn_seq *tab = cx->seq_tab + (size_t)l * (size_t)(cx->seq_cap + 1);
        const void *qsrc, *ksrc, *vsrc;
        const float *S = NULL; /* FP8 through cuBLASLt: the product's unscaled sums */
        int64_t ld_q, ld_kv;
        if (qkv_adjacent(cm, L, qdim, kvdim, H)) {
            /* one GEMM over the three matrices side by side: [T, q | k | v] */
            const int64_t n = qdim + kvdim + (L->sliding ? kvdim : 0);
            if (L->q_proj_s && on.lt) /* scaled by the head norms' pass: no scaling pass */
                TRY(sums_alone(cx, &on, cx->a, T, L->q_proj, n, H, &a_in_qa, &S, err));
            if (!S)
                TRY(proj(cx, &on, cx->qkv, 0, 0, cx->a, T, L->q_proj, L->q_proj_s, n, H,
                         &a_in_qa, err));
            qsrc = cx->qkv;
            ksrc = at(cx->qkv, qdim, e);
            vsrc = L->sliding ? at(cx->qkv, qdim + kvdim, e) : ksrc;
            ld_q = ld_kv = n;
        } else {
            TRY(proj(cx, &on, cx->q, 0, 0, cx->a, T, L->q_proj, L->q_proj_s, qdim, H, &a_in_qa,
                     err));
            TRY(proj(cx, &on, cx->kraw, 0, 0, cx->a, T, L->k_proj, L->k_proj_s, kvdim, H, &a_in_qa,
                     err));
            if (L->sliding)
                TRY(proj(cx, &on, cx->vraw, 0, 0, cx->a, T, L->v_proj, L->v_proj_s, kvdim, H,
                         &a_in_qa, err));
            qsrc = cx->q;
            ksrc = cx->kraw;
            vsrc = L->sliding ? cx->vraw : cx->kraw;
            ld_q = qdim;
            ld_kv = kvdim;
        }
        MARK("qkv projection");
        /* q and k normed and rotated, v normed (full layers: V is the raw
         * K projection, normed without a weight), k and v into each
         * token's sequence's cache, in one pass */
        if (S)
            TRY(dg_cuda_head_norm_rope_scaled(cx->q, cx->k, cx->v, S, ld_q, qdim,
                                              L->sliding ? qdim + kvdim : qdim, cx->sa,
                                              L->q_proj_s, cx->pos, T, nh, nkv, hd, L->q_norm,
                                              L->k_norm, L->inv_freq, eps, tab, cx->q_seq, st,
                                              dev, err));
        else
            TRY(dg_cuda_head_norm_rope_e(e, cx->q, cx->k, cx->v, qsrc, ld_q, ksrc, vsrc, ld_kv,
                                         cx->pos, T, nh, nkv, hd, L->q_norm, L->k_norm,
                                         L->inv_freq, eps, tab, cx->q_seq, st, dev, err));
        MARK("qk norm, rope, kv append");
        if (Te == T && l + 1 == c->num_layers) {
            /* an encoder pass leaves only its keys and values: nothing
             * reads its last layer's output (dg_cuda_encode returns no
             * hidden states), so that layer ends here, every rank alike */
            *in = NORM_NONE;
            return 0;
        }
        /* attention over the rows the layer's table names (encoder
         * rows: causal, within the window on sliding layers; decoder
         * rows: all) */
        if (Te > 0)
            TRY(dg_cuda_attention_batch_ws_e(e, cx->o, cx->q, cx->pos, cx->q_seq, Te, tab, nh,
                                             nkv, hd, L->sliding ? 2 : 1, W, cx->attn_ws,
                                             cx->attn_ws_bytes, st, dev, err));
        if (Te < T)
            TRY(dg_cuda_attention_batch_ws_e(e, at(cx->o, Te * qdim, e), at(cx->q, Te * qdim, e),
                                             cx->pos + Te, cx->q_seq + Te, T - Te, tab, nh, nkv,
                                             hd, 0, W, cx->attn_ws, cx->attn_ws_bytes, st, dev,
                                             err));
        MARK(L->sliding ? "attention (sliding)" : "attention (full)");
    }
    /* h = x + rms(o_proj(o)) (x becomes h); o_proj over this rank's heads
     * is a partial sum, reduced in the element type.  On one rank with FP8
     * through cuBLASLt, the product's unscaled sums alone where it takes
     * them in one go, scaled by the norms' pass below (no scaling pass) */
    {
        const float *S = NULL;
        void *const y[3] = {cx->a, cx->a_router, cx->a_experts};
        const void *const wy[3] = {L->pre_ffn_norm, L->router_scale, L->pre_ffn_norm_2};
        int o_in_qa = 0;
        if (L->o_proj_s && on.lt && !cx->nccl)
            TRY(sums_alone(cx, &on, cx->o, T, L->o_proj, H, qdim, &o_in_qa, &S, err));
        if (!S)
            TRY(proj(cx, &on, cx->attn, 0, 0, cx->o, T, L->o_proj, L->o_proj_s, H, qdim,
                     &o_in_qa, err));
        MARK("o projection");
        if (fork && !L->exp_gu_s)
            TRY(prefetch_experts(cx, L, err));
        TRY(reduce(cx, cx->attn, T * H, elt_type(e), err));
        MARK("all-reduce");
        /* and in the same pass the three norms of h the feed-forward block
         * reads: the dense MLP's, the router's and the experts' inputs */
        if (S)
            TRY(dg_cuda_rmsnorm_add_norms_scaled(cx->x, S, cx->sa, L->o_proj_s, cx->attn,
                                                 L->post_attn_norm, T, H, eps, 1.0f, 3, y, wy,
                                                 st, dev, err));
        else
            TRY(dg_cuda_rmsnorm_add_norms_e(e, cx->x, cx->attn, L->post_attn_norm, T, H, eps,
                                            1.0f, 3, y, wy, st, dev, err));
    }
    MARK("norms");

    /* dense MLP: down(gelu(gate u) * up u), u = rms(h) */
    if (fork)
        TRY(dg_cuda_stream_after(dn.st, st, cx->fork, dev, err));
    TRY(proj(cx, &dn, cx->gu, 0, 0, cx->a, T, L->mlp_gu, L->mlp_gu_s, 2 * (int64_t)I, H, NULL,
             err));
    TRY(dg_cuda_gelu_mul_e(e, cx->act, I, cx->gu, 2 * (int64_t)I, at(cx->gu, I, e),
                           2 * (int64_t)I, T, I, dn.st, dev, err));
    TRY(proj(cx, &dn, cx->dense, 1, 0, cx->act, T, L->mlp_down, L->mlp_down_s, H, I, NULL, err));
    MARK("dense mlp");

    /* router: softmax(rms(h) * scale * H^-1/2 . W_r^T), top-K */
    TRY(dg_blas_gemm_e(cx->blas, e, cx->rlogits, 1, cx->a_router, T, L->router_proj, 0, E, H, H,
                       1.0f / sqrtf((float)H), 0.0f, err));
    TRY(dg_cuda_router_topk(cx->ridx, cx->rw, cx->rlogits, T, E, K, L->router_expert_scale, st,
                            dev, err));
    MARK("router");

    /* experts on v = rms(h), then x' = (h + rms(rms(d) + rms(m))) * s */
    if (L->exp_gu_s)
        TRY(dg_cuda_moe_q(cx->blas, moe, (const uint16_t *)cx->a_experts, T, H, cx->ridx, cx->rw, K,
                          cm->e0, cm->n_exp, E, Im, (const uint8_t *)L->exp_gu, L->exp_gu_s,
                          (const uint8_t *)L->exp_down, L->exp_down_s, partial, cx->moe_scratch,
                          st, err));
    else
        TRY(dg_cuda_moe_e(cx->blas, e, moe, cx->a_experts, T, H, cx->ridx, cx->rw, K, cm->e0,
                          cm->n_exp, E, Im, L->exp_gu, L->exp_down, partial, cx->moe_scratch, st,
                          err));
    MARK("experts");
    if (fork) /* the dense MLP's output is in */
        TRY(dg_cuda_stream_after(st, dn.st, cx->join, dev, err));
    /* both partial sums (adjacent, fp32) in one all-reduce */
    TRY(reduce(cx, cx->dense, 2 * T * H, DG_NCCL_F32, err));
    MARK("all-reduce");
    if (l + 1 < c->num_layers) {
        next_w = cm->layers[l + 1].input_norm;
        next = cm->layers[l + 1].q_proj_s ? NORM_QUANTIZED : NORM_DONE;
    } else if (Te < T) {
        next_w = cm->final_norm;
        next = NORM_DONE;
    }
    if (Te > 0 && l + 1 < c->num_layers)
        TRY(combine_rows(cx, L, 0, Te, moe, L->scalar_encoder, next_w, next == NORM_QUANTIZED,
                         err));
    if (Te < T)
        TRY(combine_rows(cx, L, Te, T - Te, moe, L->scalar_decoder, next_w,
                         next == NORM_QUANTIZED, err));
    *in = next;
    MARK("norms");
    return 0;
}

/* ---- the passes ---------------------------------------------------------------- */

int64_t dg_cuda_bucket(int64_t T)
{
    int64_t b = 64;
    if (T <= 64)
        return 64;
    for (;;) {
        if (T <= b + b / 2)
            return b + b / 2;
        if (T <= 2 * b)
            return 2 * b;
        b *= 2;
    }
}

int dg_cuda_pass_stage(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                       int decoder, int64_t *Tb, struct dg_error *err)
{
    int64_t Te;
    return decoder ? dg_cuda_pass_stage_mixed(cx, NULL, 0, seqs, n_seqs, &Te, Tb, err)
                   : dg_cuda_pass_stage_mixed(cx, seqs, n_seqs, NULL, 0, &Te, Tb, err);
}

int dg_cuda_pass_stage_mixed(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                             const struct dg_cuda_seq *dec, int n_dec, int64_t *Te, int64_t *Tb,
                             struct dg_error *err)
{
    int64_t ne = 0, nd = 0;
    int rc;
    TRY(dg_cuda_pass_check(cx, enc, n_enc, dec, n_dec, &ne, &nd, err));
    *Te = ne > 0 ? dg_cuda_bucket(ne) : 0;
    *Tb = *Te + (nd > 0 ? dg_cuda_bucket(nd) : 0);
    return stage_batch(cx, enc, n_enc, *Te, dec, n_dec, *Tb, err);
}

int dg_cuda_pass_body(struct dg_cuda_ctx *cx, int64_t Te, int64_t T, float *logits,
                      struct dg_error *err)
{
    const struct dg_cuda_model *cm = cx->cm;
    const struct dg_model_config *c = &cm->cfg;
    const enum dg_elt e = cm->elt;
    const int H = c->hidden_size, S = c->self_conditioning_size;
    const float eps = (float)c->rms_norm_eps;
    const dg_stream_t st = cx->stream;
    const int dev = cx->dev;
    const struct lane on = main_lane(cx);
    enum norm_in in = NORM_NONE;
    int rc;

    if (T > cx->tokens_cap || Te < 0 || Te > T || (Te < T && !logits))
        return dg_error_set(err, DG_E_INVAL, "cuda forward: a body of %lld tokens (%lld encoder) "
                            "after a stage of %lld%s", (long long)T, (long long)Te,
                            (long long)cx->tokens_cap, Te < T && !logits ? ", no logits" : "");
    TRY(dg_cuda_embed_e(e, cx->x, cx->ids, T, cm->embed, cm->v0, cm->nv, H, cm->embed_scale, st,
                        dev, err));
    /* each token's row is on one rank, zeros elsewhere: the sum is exact */
    TRY(reduce(cx, cx->x, T * H, elt_type(e), err));
    MARK("embedding");
    if (Te < T) {
        /* the decoder rows' self-conditioning: x += SC(soft) on every
         * step; a canvas without a soft input gets zero rows, whose SC
         * output is exactly zero (rms(0) = 0, gelu(0) = 0), so x is
         * unchanged bit for bit */
        const int64_t Td = T - Te;
        void *xd = at(cx->x, Te * H, e);
        TRY(dg_cuda_rows_gather_e(e, cx->soft, (const void *const *)cx->soft_src + Te, Td, H, st,
                                  dev, err));
        TRY(dg_cuda_rmsnorm_e(e, cx->a, cx->soft, cm->sc_pre_norm, Td, H, eps, st, dev, err));
        TRY(proj(cx, &on, cx->gu, 0, 0, cx->a, Td, cm->sc_gu, cm->sc_gu_s, 2 * (int64_t)S, H,
                 NULL, err));
        TRY(dg_cuda_gelu_mul_e(e, cx->act, S, cx->gu, 2 * (int64_t)S, at(cx->gu, S, e),
                               2 * (int64_t)S, Td, S, st, dev, err));
        TRY(proj(cx, &on, xd, 0, 1, cx->act, Td, cm->sc_down, cm->sc_down_s, H, S, NULL, err));
        /* the weight-free post-norm applies on every step */
        TRY(dg_cuda_rmsnorm_e(e, xd, xd, NULL, Td, H, eps, st, dev, err));
        MARK("self-conditioning mlp");
    }
    for (int l = 0; l < c->num_layers; l++)
        TRY(layer_forward(cx, l, Te, T, &in, err));
    if (Te < T) {
        /* (the last layer's pass wrote the final norm into a) */
        if (in == NORM_NONE)
            TRY(dg_cuda_rmsnorm_e(e, at(cx->a, Te * H, e), at(cx->x, Te * H, e),
                                  cm->final_norm, T - Te, H, eps, st, dev, err));
        /* this rank's vocabulary columns, of the decoder rows */
        TRY(dg_blas_gemm_e(cx->blas, e, logits, 1, at(cx->a, Te * H, e), T - Te, cm->embed, 0,
                           cm->nv, H, H, 1, 0, err));
        MARK("lm head");
    }
    return 0;
}

void dg_cuda_pass_finish(const struct dg_cuda_seq *seqs, int n_seqs, int decoder)
{
    if (!decoder)
        for (int i = 0; i < n_seqs; i++)
            seqs[i].kv->length += seqs[i].n;
}

int dg_cuda_encode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                   struct dg_error *err)
{
    int64_t Tb;
    int rc;
    TRY(dg_cuda_pass_stage(cx, seqs, n_seqs, 0, &Tb, err));
    TRY(dg_cuda_pass_body(cx, Tb, Tb, NULL, err));
    TRY(dg_cuda_stream_sync(cx->stream, cx->dev, err));
    dg_cuda_pass_finish(seqs, n_seqs, 0);
    return 0;
}

int dg_cuda_decode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                   float *logits, struct dg_error *err)
{
    int64_t Tb;
    int rc;
    TRY(dg_cuda_pass_stage(cx, seqs, n_seqs, 1, &Tb, err));
    return dg_cuda_pass_body(cx, 0, Tb, logits, err);
}

int dg_cuda_encode_decode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                          const struct dg_cuda_seq *dec, int n_dec, float *logits,
                          struct dg_error *err)
{
    int64_t Te, Tb;
    int rc;
    TRY(dg_cuda_pass_stage_mixed(cx, enc, n_enc, dec, n_dec, &Te, &Tb, err));
    TRY(dg_cuda_pass_body(cx, Te, Tb, logits, err));
    TRY(dg_cuda_stream_sync(cx->stream, cx->dev, err));
    dg_cuda_pass_finish(enc, n_enc, 0);
    return 0;
}
