/*
 * cuda-forward.h - the DiffusionGemma forward pass on one GPU, over a batch
 * of sequences at once (the same maths as lib/cpu-forward.h, bf16
 * activations and weights, fp32 inside every reduction).
 *
 *   encoder  each sequence's new tokens at positions length .. +n-1,
 *            causal (sliding layers: within the window) over its cache and
 *            themselves; K/V appended to its cache; lengths advance.  (No
 *            hidden states come out: the last layer stops at its K/V.)
 *   decoder  each sequence's canvas at positions length .. +CL-1, with an
 *            optional self-conditioning input (the soft embedding
 *            (pi E) c, [CL, H] elements); bidirectional over its cached window
 *            and the canvas; the cache's committed rows are read, never
 *            written; returns the logits [sum CL, V] fp32 before the
 *            soft-cap (dg_cuda_row_stats applies it in its one pass).
 *   both     encoder rows and then decoder rows in one pass (a commit
 *            and the next canvas's first step: dg_cuda_encode_decode).
 *
 * Token-wise work (norms, projections, MLPs, router, experts, LM head) runs
 * once over every token of the batch, and so do the KV append and the
 * attention: each token reads its sequence's cache through a table on the
 * device (dg_cuda_attention_batch_e).
 *
 * KV cache: per layer, rows [max_length + max_cl, nkv * hd] of keys
 * (after k_norm and RoPE) and values (after the weight-free v_norm); row =
 * position.  A decoder pass writes its canvas's K/V into the rows past the
 * committed length (scratch, never counted), so attention reads one
 * contiguous range of rows: sliding layers from max(0, length - (W-1)),
 * full layers from 0.
 *
 * As one rank of a tensor-parallel group (cuda-model.h) the pass computes
 * this rank's heads, widths and experts; the partial sums meet in NCCL
 * all-reduces on the context's stream: the token embedding (exact: one
 * rank holds each row) and the attention output in the element type, the
 * dense MLP's and the experts' outputs together in fp32 (one call).  Every
 * rank runs the same passes over the same batch.
 *
 * The caller owns the GPU's thread (dg_cuda_use) and the stream; every
 * function returns 0 or a negative dg_status with err set.  A failure
 * while running leaves the batch's caches' uncommitted rows undefined
 * (lengths do not advance).
 */
#ifndef DG_KERNELS_CUDA_FORWARD_H
#define DG_KERNELS_CUDA_FORWARD_H

#include <stdint.h>

#include "kernels/cuda-model.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/error.h"

struct dg_fp8_lt;

struct dg_nccl;
struct dg_prof;

struct dg_cuda_kv {
    int64_t length, max_length;
    int max_cl;
    int n_layers;
    enum dg_elt elt;
    void **k, **v;            /* [n_layers] device rows */
    void *block;              /* behind every row */
    uint64_t bytes;
};

/* An empty cache for max_length positions and canvases of up to max_cl.
 * Errors: DG_E_INVAL, DG_E_NOMEM, DG_E_CUDA. */
int dg_cuda_kv_init(struct dg_cuda_kv *kv, const struct dg_cuda_model *cm, int64_t max_length,
                    int max_cl, struct dg_error *err);
void dg_cuda_kv_free(struct dg_cuda_kv *kv);

/* Bytes a cache of cm's KV heads for max_length positions and canvases of
 * max_cl takes. */
uint64_t dg_cuda_kv_bytes(const struct dg_cuda_model *cm, int64_t max_length, int max_cl);

/* One sequence of a batch. */
struct dg_cuda_seq {
    struct dg_cuda_kv *kv;
    const int32_t *ids;       /* host, n ids in [0, V) */
    int64_t n;
    const void *soft;         /* decoder: device [n, H] (pi E) c, or NULL */
};

/* What a pass needs on the GPU: its stream, cuBLAS, scratch sized for the
 * largest batch seen. */
struct dg_cuda_ctx {
    const struct dg_cuda_model *cm;
    int dev;
    struct dg_nccl *nccl;     /* the rank's group (NULL: one GPU); set by the caller */
    struct dg_prof *prof;     /* stage timings (prof.h), or NULL; set by the caller */
    dg_stream_t stream;
    struct dg_blas *blas;
    int64_t tokens_cap;       /* scratch holds this many tokens */
    int seq_cap;              /* sequences the tables hold */
    void *scratch;
    uint64_t scratch_bytes;
    /* views into scratch */
    void *x, *a, *q, *kraw, *vraw, *k, *v, *o, *attn, *gu, *act, *soft; /* elements */
    void *a_router, *a_experts; /* the router's and the experts' normed inputs */
    void *qkv;                /* [T, q | k | v]: one GEMM's q, k and v projections */
    float *dense, *rlogits, *rw;  /* dense: [2, T, H] the dense MLP's and the experts' outputs */
    int32_t *ridx, *ids;
    int64_t *pos;
    void *moe_scratch;
    uint8_t *qa;              /* FP8 models: activations quantized per token (E4M3) */
    float *sa;                /*   and their scales */
    struct dg_fp8_lt *lt;     /* FP8 models: cuBLASLt for the projections (fp8-lt.h), or
                                 NULL: fp8-gemm.cu's kernel; set by the caller, freed
                                 with the context */
    /* the side stream: each layer's dense MLP runs on it beside the router
     * and the experts on `stream` (forked from and joined to it by the two
     * events), with a cuBLAS handle of its own and, for FP8 with
     * cuBLASLt, side_lt (set by the caller like lt; lt without side_lt,
     * or a profiler attached: no fork, the dense MLP on `stream`) */
    dg_stream_t side;
    struct dg_blas *side_blas;
    struct dg_fp8_lt *side_lt;
    dg_cuda_event_t fork, join;
    void *attn_ws;            /* the attention's split keys (ops.h) */
    size_t attn_ws_bytes;
    /* the batch's sequences: per layer a table of their caches and the
     * rows their queries read ([n_layers][seq_cap]), and each token's
     * sequence; device, with host staging */
    struct dg_attn_seq *seq_tab, *h_seq_tab;   /* [n_layers][seq_cap + 1]: the last the dummy */
    int32_t *q_seq, *h_q_seq;
    const void **soft_src, **h_soft_src;       /* per token its soft input row, or NULL */
    void *dummy_kv;                            /* the dummy sequence's one-row caches */
    uint64_t generation;      /* bumped when any buffer above is reallocated */
    int32_t *h_ids;           /* host staging */
    int64_t *h_pos;
};

/* Bind a context to cm on the calling thread's GPU (two streams, each with
 * a cuBLAS handle of its own, and the events that order them).  Errors: DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS. */
int dg_cuda_ctx_init(struct dg_cuda_ctx *cx, const struct dg_cuda_model *cm,
                     struct dg_error *err);
void dg_cuda_ctx_free(struct dg_cuda_ctx *cx);

/* Encoder pass over the sequences' new tokens (appended to their caches,
 * lengths advanced on success).  Errors: DG_E_INVAL (ids, sizes), DG_E_RANGE
 * (past a cache), device errors. */
int dg_cuda_encode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                   struct dg_error *err);

/* Decoder pass over the sequences' canvases (n <= the cache's max_cl):
 * logits [Tb, nv] fp32 on the device (Tb = dg_cuda_bucket of the batch's
 * tokens; rows past sum n are padding), this rank's vocabulary columns
 * (all V with one GPU), raw (before the soft-cap), the sequences' rows one
 * after another.  Errors as dg_cuda_encode. */
int dg_cuda_decode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                   float *logits, struct dg_error *err);

/* An encoder pass and a decoder pass as one (the commit of a finished
 * canvas and the next canvas's first step): rows for the encoder
 * sequences' tokens, then for the decoder sequences' canvases, where a
 * canvas whose cache is among the encoder sequences sits after their
 * tokens (positions, window, keys).  Per layer every row's keys and values
 * are appended before any row attends, each row with its own mode's mask
 * and layer scalar, so the result is that of dg_cuda_encode(enc) then
 * dg_cuda_decode(dec) up to the products' rounding over more rows.
 * Logits as dg_cuda_decode's, of the decoder rows alone; the encoder
 * sequences' lengths advance.  n_enc or n_dec may be 0.  Errors as
 * dg_cuda_encode, checked before anything runs. */
int dg_cuda_encode_decode(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                          const struct dg_cuda_seq *dec, int n_dec, float *logits,
                          struct dg_error *err);

/* The passes in three parts, so that the middle one can be captured in a
 * CUDA graph and replayed for any batch of the same buckets:
 *
 *   stage   checks the batch, reserves scratch, uploads what the batch is
 *           made of (ids, positions, each token's sequence and soft
 *           input, the per-layer sequence tables): the encoder rows
 *           padded to *Te, then the decoder rows, all padded to *Tb;
 *   body    the kernels alone, reading only device buffers: a function of
 *           (Te, Tb, logits) and of the buffers behind cx->generation,
 *           which changes when any is reallocated; logits get Tb - Te rows;
 *   finish  (encoder) the caches' lengths advance: after the body's work
 *           has completed.
 *
 * dg_cuda_pass_stage stages one kind (Te = Tb for an encoder pass, 0 for a
 * decoder one); dg_cuda_pass_check is the stage's checks alone, with each
 * part's tokens (a caller that runs the parts as two passes checks both
 * before it runs the first).  Every part pads its tokens to a bucket (64,
 * 96, 128, 192, 256, 384, ...), eager or replayed, so both compute the same
 * shapes. */
int64_t dg_cuda_bucket(int64_t T);
int dg_cuda_pass_check(const struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                       const struct dg_cuda_seq *dec, int n_dec, int64_t *enc_tokens,
                       int64_t *dec_tokens, struct dg_error *err);
int dg_cuda_pass_stage(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *seqs, int n_seqs,
                       int decoder, int64_t *Tb, struct dg_error *err);
int dg_cuda_pass_stage_mixed(struct dg_cuda_ctx *cx, const struct dg_cuda_seq *enc, int n_enc,
                             const struct dg_cuda_seq *dec, int n_dec, int64_t *Te, int64_t *Tb,
                             struct dg_error *err);
int dg_cuda_pass_body(struct dg_cuda_ctx *cx, int64_t Te, int64_t Tb, float *logits,
                      struct dg_error *err);
void dg_cuda_pass_finish(const struct dg_cuda_seq *seqs, int n_seqs, int decoder);

#endif
