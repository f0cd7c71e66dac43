/*
 * attention-tc.h - the batched attention (ops.h: dg_cuda_attention_batch_e)
 * on the tensor cores, for bf16 elements and the head sizes the model
 * uses.  dg_cuda_attention_batch_e takes this path by itself where it
 * fits; the contract and the result are the same (within bf16 rounding of
 * the probabilities, which the tensor cores multiply in bf16).
 */
#ifndef DG_KERNELS_ATTENTION_TC_H
#define DG_KERNELS_ATTENTION_TC_H

#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether head size hd has a tensor-core kernel (64, 128, 256, 512). */
int dg_cuda_attention_tc_fits(int hd);

/* dg_cuda_attention_batch_e with bf16 q, k, v and out.  With scratch
 * (device, scratch_bytes) the keys may be split over several blocks
 * when the rows make too few (small batches), as far as the scratch
 * holds their partial results (scratch 16-byte and out 8-byte aligned,
 * as allocations are); NULL: one block per row tile.  Errors:
 * DG_E_INVAL (a head size that does not fit, heads), DG_E_CUDA. */
int dg_cuda_attention_tc(void *out, const void *q, const int64_t *q_pos, const int32_t *q_seq,
                         int64_t Tq, const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                         int mask, int window, void *scratch, size_t scratch_bytes,
                         dg_stream_t stream, int dev, struct dg_error *err);

/* The products S = Q K^T through mma.sync, through Hopper's wgmma
 * (compute capability 9.0), through wgmma in the warp-specialised form
 * (WS: producer warps copying K and V for two consumer warpgroups; head
 * size 256, the wgmma form at others), or (AUTO) the warp-specialised
 * form at head size 256 and wgmma at others where the device has wgmma,
 * mma.sync where not. */
enum dg_attn_tc_form {
    DG_ATTN_TC_AUTO = 0,
    DG_ATTN_TC_MMA = 1,
    DG_ATTN_TC_WGMMA = 2,
    DG_ATTN_TC_WS = 3
};

/* dg_cuda_attention_tc in the given form (the tests run both).  Errors as
 * dg_cuda_attention_tc, and DG_E_UNSUPPORTED for DG_ATTN_TC_WGMMA or WS on a
 * device without wgmma. */
int dg_cuda_attention_tc_form(enum dg_attn_tc_form form, void *out, const void *q,
                              const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                              const struct dg_attn_seq *seqs, int nh, int nkv, int hd, int mask,
                              int window, void *scratch, size_t scratch_bytes, dg_stream_t stream,
                              int dev, struct dg_error *err);

/* Scratch bytes that let dg_cuda_attention_tc split the keys as it would
 * for these shapes (0: it would not split). */
size_t dg_cuda_attention_tc_scratch(int64_t Tq, int nh, int nkv, int hd);

#ifdef __cplusplus
}
#endif

#endif
