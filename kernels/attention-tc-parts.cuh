/*
 * attention-tc-parts.cuh - what the tensor-core attention's two files
 * share (CUDA translation units only): attention-tc.cu (the mma.sync and
 * wgmma forms, the split keys' fold, the rule that picks the splits, and
 * the entry points of attention-tc.h) and attention-ws.cu (the
 * warp-specialised form at head size 256).  The softmax's device
 * helpers, the split keys' scratch layout, the rows' store at a tile's
 * end, the occupancy query the splits rule takes, and the calls between
 * the two files (C++ linkage).
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

/* P (a warp's scores over a tile of NK keys, rounded to bf16) as the A
 * fragments of the tile's k16 steps of O += P V */
template <int NK>
__device__ static inline void tc_pack_p(const float (&sc)[NK / 8][4], uint32_t (&a)[NK / 16][4])
{
#pragma unroll
    for (int k = 0; k < NK / 16; k++) {
        a[k][0] = pack_bf16(sc[2 * k][0], sc[2 * k][1]);
        a[k][1] = pack_bf16(sc[2 * k][2], sc[2 * k][3]);
        a[k][2] = pack_bf16(sc[2 * k + 1][0], sc[2 * k + 1][1]);
        a[k][3] = pack_bf16(sc[2 * k + 1][2], sc[2 * k + 1][3]);
    }
}

/* Mask and online softmax of a tile of NK keys at key kt of sequence s,
 * whose keys the block walks up to j1, its cache's row 0 at position
 * k_start (sc: the mma accumulators' layout, the thread's column pair
 * tig; its two rows h = 0, 1 of sequence rseq[h], -1 past the tokens, at
 * position rpos[h]): sc becomes P, m and l move on, alpha[h] = exp(m_old
 * - m_new) for row h.  A tile that
 * every row of the warp sees whole (one sequence, all its keys inside
 * the range and visible) skips the per-key mask, which runs as a pass of
 * its own, so that the maxima, exponentials and sums after it are
 * straight-line code on every tile (the same operations in the same
 * order: the same bits).  Run 165, bench-attention, a step's attention
 * with this and the 32-bit descriptor add (wgmma.cuh) against the mask
 * tested inside the maxima's loop: batch 1 1,438 / 1,495 -> 1,305 /
 * 1,373 us, batch 16 12,351 / 12,433 -> 10,556 / 10,710, every output
 * hash equal. */
template <int NK>
__device__ static inline void tc_softmax(float (&sc)[NK / 8][4], int64_t kt, int64_t j1,
                                         int64_t k_start, int s, const int (&rseq)[2],
                                         const int64_t (&rpos)[2], int mask, int window,
                                         int tig, float (&m)[2], float (&l)[2],
                                         float (&alpha)[2])
{
    int whole = kt + NK <= j1;
    {
        const int64_t kfirst = k_start + kt, klast = kfirst + NK - 1;
#pragma unroll
        for (int h = 0; h < 2; h++)
            whole &= rseq[h] == s &&
                     (mask == 0 ||
                      (klast <= rpos[h] && (mask == 1 || kfirst > rpos[h] - window)));
        whole = __all_sync(0xffffffffu, whole);
    }
    /* the mask first, apart (warp-uniform: a whole tile skips it in one
     * branch), then the same maxima, exponentials and sums in the same
     * order on every tile */
    if (!whole)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int n = 0; n < NK / 8; n++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int64_t j = kt + n * 8 + tig * 2 + u;
                    if (rseq[h] != s || j >= j1 ||
                        !visible(mask, rpos[h], k_start + j, window))
                        sc[n][2 * h + u] = -INFINITY;
                }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mt = -INFINITY, mn, sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int u = 0; u < 2; u++)
                mt = fmaxf(mt, sc[n][2 * h + u]);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        mn = fmaxf(m[h], mt);
        /* e^(v - mn) = 2^(v log2 e - mn log2 e), one FFMA and one MUFU a
         * score; mn = -inf (every key so far masked, so v = -inf too)
         * taken as 0, so that a masked score gives 2^-inf = 0, not NaN */
        const float mb = (mn == -INFINITY ? 0.0f : mn) * TC_LOG2E;
        alpha[h] = mn == m[h] ? 1.0f : ex2_ftz(fmaf(m[h], TC_LOG2E, -mb));
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                float *v = &sc[n][2 * h + u];
                *v = ex2_ftz(fmaf(*v, TC_LOG2E, -mb));
                sum += *v;
            }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l[h] = alpha[h] * l[h] + sum;
        m[h] = mn;
    }
}

/* O *= alpha by row, only where some row of the warp's maximum moved
 * (alpha = 1 exactly where it did not, so skipping the multiply changes
 * nothing) */
template <int DV>
__device__ static inline void tc_rescale(float (&o)[DV / 8][4], const float (&alpha)[2])
{
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int d = 0; d < DV / 8; d++) {
            o[d][0] *= alpha[0];
            o[d][1] *= alpha[0];
            o[d][2] *= alpha[1];
            o[d][3] *= alpha[1];
        }
    }
}

/* A thread's two rows at the end of a row tile: tile rows rr and rr + 8
 * (rr: its warp's first row plus gid), tile row r being query head
 * c g + (rb + r) % g of token t_lo + (rb + r) / g (rows past Tq skipped),
 * over columns col0 + 8 d + {0, 1}, d < DV / 8, of head size hd.  One key
 * range (splits 1): O / l (0 where l is 0) into out [Tq nh, hd] in bf16.
 * Split keys: the range's m, l and unnormalised O into part at `split`,
 * laid out as tc_o_at says (the thread of column 0 writes m and l). */
template <int DV>
__device__ static inline void tc_store_rows(__nv_bfloat16 *out, float *part,
                                            const float (&o)[DV / 8][4], const float (&m)[2],
                                            const float (&l)[2], int rr, int rb, int64_t t_lo,
                                            int g, int c, int nh, int64_t Tq, int hd, int col0,
                                            int split, int splits)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = rb + rr + 8 * h;
        const int64_t t = t_lo + r / g, row = t * nh + c * g + r % g;
        if (t >= Tq)
            continue;
        if (splits > 1) {
            float *ml = part + ((int64_t)split * Tq * nh + row) * 2;
            float *dst =
                part + tc_o_at(splits, Tq * nh) + ((int64_t)split * Tq * nh + row) * hd + col0;
            if (col0 == 0) {
                ml[0] = m[h];
                ml[1] = l[h];
            }
#pragma unroll
            for (int d = 0; d < DV / 8; d++)
                *(float2 *)(dst + d * 8) = make_float2(o[d][2 * h], o[d][2 * h + 1]);
        } else {
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            __nv_bfloat16 *dst = out + row * hd + col0;
#pragma unroll
            for (int d = 0; d < DV / 8; d++)
                *(__nv_bfloat162 *)(dst + d * 8) =
                    __floats2bfloat162_rn(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
        }
    }
}

/* The blocks of `kernel` (`threads` a block, `shared` bytes of dynamic
 * shared memory, raised to that for it) the current device runs at once;
 * 0 where it cannot say (then the caller splits no keys). */
template <typename Kernel>
static int64_t tc_slots_of(Kernel kernel, int threads, size_t shared)
{
    int d, sms = 0, per = 0;
    if (cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)shared) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, threads, shared) !=
            cudaSuccess) {
        (void)cudaGetLastError(); /* (not sticky: clear it) */
        return 0;
    }
    return (int64_t)sms * per;
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
