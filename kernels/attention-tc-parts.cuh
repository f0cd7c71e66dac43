/*
 * attention-tc-parts.cuh - what the tensor-core attention's two files
 * share (CUDA translation units only): attention-tc.cu (the mma.sync and
 * wgmma forms, the split keys' fold, the rule that picks the splits, and
 * the entry points of attention-tc.h) and attention-ws.cu (the
 * warp-specialised form at head size 256).  The softmax's device
 * helpers, the split keys' scratch layout, and the calls between the two
 * files (C++ linkage).
 */
#ifndef DG_KERNELS_ATTENTION_TC_PARTS_CUH
#define DG_KERNELS_ATTENTION_TC_PARTS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "lib/error.h"

#define TC_LOG2E 1.4426950408889634f
#define TC_MAX_SPLITS 8 /* key ranges a row's split keys fold */

__device__ static inline uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* 2^x by the special function unit, denormal results flushed to 0
 * (ex2.approx.ftz: 2 ulp; 2^-inf = 0).  __expf's ex2.approx without ftz
 * costs about eight more instructions a call (a range test and a
 * scaling around the MUFU; run 165's SASS), in the softmax sixteen times
 * a tile a thread.  Run 166, bench-attention, a step's attention against
 * __expf: batch 1 1,367 / 1,374 -> 1,298 / 1,299 us, batch 16 10,659 /
 * 10,770 -> 9,466 / 9,494, every output hash equal. */
__device__ static inline float ex2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ static inline int visible(int mask, int64_t q, int64_t k, int window)
{
    return mask == 0 ? 1 : mask == 1 ? k <= q : (k <= q && k > q - window);
}

/* Where the split keys' O partials start in part, in floats: after the
 * [splits][rows] (m, l) pairs, rounded up to 16 bytes so that the fold
 * reads O four floats at a time. */
__host__ __device__ static inline int64_t tc_o_at(int splits, int64_t rows)
{
    return ((int64_t)splits * rows * 2 + 3) & ~(int64_t)3;
}

/* The splits of `blocks` blocks' keys (1 .. TC_MAX_SPLITS) where the
 * device runs `slots` blocks at once and the scratch holds
 * scratch_bytes of partial results (attention-tc.cu, "Key ranges per row
 * tile"). */
int dg_attn_tc_splits_of(int64_t blocks, int64_t Tq, int nh, int hd, size_t scratch_bytes,
                         int64_t slots);

/* Bytes of partial results `splits` key ranges of Tq nh rows of hd
 * take (0 for one range). */
size_t dg_attn_tc_part_bytes(int splits, int64_t Tq, int nh, int hd);

/* The split ranges' partial results in part (laid out as tc_o_at says)
 * folded into out [rows, hd], queued on st.  Errors: DG_E_CUDA. */
int dg_attn_tc_fold(__nv_bfloat16 *out, const float *part, int64_t rows, int hd, int splits,
                    cudaStream_t st, int dev, struct dg_error *err);

/* ---- attention-ws.cu: the warp-specialised form ---- */

#define DG_ATTN_WS_HD 256 /* the one head size it takes */

/* Its blocks for Tq tokens of nh query heads over nkv KV heads (before
 * any split), and how many the current device runs at once (0 where it
 * cannot say). */
int64_t dg_attn_ws_blocks(int64_t Tq, int nh, int nkv);
int64_t dg_attn_ws_slots(void);

/* The attention of dg_cuda_attention_tc at head size DG_ATTN_WS_HD in the
 * warp-specialised form, its keys split as far as part (NULL: not at
 * all; part_bytes of scratch, 16-byte aligned, out 8-byte aligned) holds
 * and the splits rule asks, queued on st.  The device has wgmma (the
 * caller's check).  Errors: DG_E_CUDA. */
int dg_attn_ws_launch(__nv_bfloat16 *out, float *part, size_t part_bytes,
                      const __nv_bfloat16 *q, const int64_t *q_pos, const int32_t *q_seq,
                      int64_t Tq, const struct dg_attn_seq *seqs, int nh, int nkv, int mask,
                      int window, cudaStream_t st, int dev, struct dg_error *err);

#endif
