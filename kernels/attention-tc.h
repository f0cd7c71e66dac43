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

/* dg_cuda_attention_batch_e with bf16 q, k, v and out.  Errors:
 * DG_E_INVAL (a head size that does not fit, heads), DG_E_CUDA. */
int dg_cuda_attention_tc(void *out, const void *q, const int64_t *q_pos, const int32_t *q_seq,
                         int64_t Tq, const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                         int mask, int window, dg_stream_t stream, int dev, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
