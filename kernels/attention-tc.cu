/* attention-tc.cu - the batched attention of attention.cu on the tensor
 * cores (bf16 q, k, v and out; head sizes 64, 128, 256, 512), the same
 * function as dg_cuda_attention_batch_e (reference: dg_ref_attention per
 * sequence).
 *
 * Rows.  For KV head c the g = nh / nkv query heads that read it are
 * taken together: row R = t g + j is query head h = c g + j of token t.
 * A block holds 64 rows (4 warps of 16) of one KV head and TC_DV columns
 * of the output; it walks the sequences its tokens belong to in
 * ascending order (a tile may straddle two), and each sequence's keys in
 * tiles of 32, FlashAttention-2 style:
 *
 *   S = Q K^T                      (mma m16n8k16, fp32 accumulate; over all hd)
 *   S_ij = -inf where key j is not visible to row i (another sequence,
 *          past the sequence's keys, or masked: causal / sliding window)
 *   m' = max(m, max_j S_ij);  a = exp(m - m');  P_ij = exp(S_ij - m')
 *                              (as 2^(x log2 e - m' log2 e), flushed to 0
 *                              below 2^-126)
 *   l  = a l + sum_j P_ij;    O = a O + P V     (P rounded to bf16)
 *   out = O / l                (0 where no key was visible)
 *
 * where m, l and O (fp32, in the mma accumulators' registers) belong to
 * the row.  Key tiles past the last position a causal tile can see, or
 * before the first a sliding one can, are skipped.  Keys are read only
 * inside [k_start, k_start + k_len): rows beyond are never touched.
 * No score matrix goes to memory.
 *
 * Key and value tiles are pipelined: tile i + 1's cp.async copies are in
 * flight into a second buffer while tile i is used, so the load's latency
 * hides behind the products (few blocks share a multiprocessor to hide it
 * otherwise: at head size 512 one, by shared memory; at 256 two, by
 * registers).  Run 60, batch-1 denoise on the H200: 26.81 ms with each
 * tile loaded then used, 23.77 ms pipelined together with the sampler's
 * Philox once a block (the two not timed apart).  The wgmma form also
 * overlaps its products, as FlashAttention-3 does within a warpgroup:
 * tile i's S = Q K^T and tile i - 1's O += P V are issued together, and
 * tile i's softmax runs while P V is on the tensor cores (the same
 * operations in the same order: the same bits).  Run 147,
 * bench-attention, a step's attention at batch 4: 3,735 / 3,779 us
 * without, 3,435 / 3,457 with it (the paired form not yet); run 150,
 * with the paired form's too: the full layers 5-9% faster (batch 4,
 * third canvas: 260 / 259 -> 238 us).
 *
 * Two forms of the products: mma.sync (any GPU of the build),
 * the Q and K tiles in rows padded for ldmatrix; or, where the device has
 * Hopper's wgmma (compute capability 9.0; the default there), one
 * warpgroup's m64n32k16 products straight from shared memory, Q and K in
 * 128-byte swizzled sub-tiles of 64 columns (wgmma.cuh), no fragment
 * loads; and O += P V as m64nDVk16 products with P from registers (the
 * A fragments mma.sync takes) and the V tile, swizzled the same way, read
 * N-major (wgmma's transposed B).  The accumulators' layout is mma.sync's,
 * so the softmax and the epilogue are the same code; the sums run in the
 * tensor cores' order, so the two forms agree within rounding, not to
 * the bit.  At head size 512 the wgmma form is paired: two warpgroups
 * over one row tile, each half the head's columns, S's two halves summed
 * through shared memory, so that neither computes S for the other's
 * half of O (see the kernel).
 *
 * At head size 256 on wgmma the default is a third form, warp-specialised
 * (producer warps copying K and V for two consumer warpgroups;
 * attention-ws.cu).
 *
 * Split keys (when the rows alone make too few blocks to fill the GPU):
 * each sequence's keys are cut into `splits` ranges, one per block; a
 * block writes its rows' (m, l) and unnormalised O (fp32) to scratch,
 * and a second kernel folds the ranges:
 *   M = max_s m_s;  L = sum_s l_s e^(m_s - M);  out = sum_s O_s e^(m_s - M) / L
 * (0 where L = 0). */
#include "kernels/attention-tc.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/attention-tc-parts.cuh"
#include "kernels/cuda-check.h"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#define TC_ROWS 64
#define TC_KEYS 32
#define TC_PAD 8 /* elements after each shared row: conflict-free ldmatrix */
#define TC_BUFS 2 /* key and value tile buffers: one used, the next one loading */

/* Copy rows [0, n) of width w elements (a multiple of 8) from src (row
 * stride ld elements) to shared dst (stride w + TC_PAD) through cp.async
 * (16-byte copies over the block's threads), zeros for rows n .. rows-1
 * (which read nothing); the caller commits and waits.  n >= 1. */
__device__ static void load_rows_async(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int64_t ld,
                                       int n, int rows, int w)
{
    const int per = w / 8;
    for (int i = threadIdx.x; i < rows * per; i += blockDim.x) {
        const int r = i / per, c = (i % per) * 8;
        dg_cp16(dst + r * (w + TC_PAD) + c, src + (int64_t)(r < n ? r : 0) * ld + c, r < n);
    }
}

/* The wgmma form's K or V tile: rows [0, n) of W columns (a multiple of
 * 64) from src (row stride ld elements) into ROWS rows of 128-byte
 * swizzled sub-tiles of 64 columns at shared address dst (sub-tile c / 8
 * at c / 8 x ROWS x 128 bytes), zeros for rows n .. ROWS-1 (which read
 * nothing), by THREADS threads (a multiple of W / 8); the caller commits
 * and waits.  n >= 1; ROWS ld < 2^31.  Each thread copies one 16-byte
 * column chunk of every (THREADS / (W / 8))th row, so that with the
 * shape known when compiled the divisions and the swizzle's row terms
 * fold into constants. */
template <int W, int ROWS, int THREADS>
__device__ static inline void load_swz_tile(uint32_t dst, const __nv_bfloat16 *src, int ld, int n)
{
    constexpr int PER = W / 8, RSTEP = THREADS / PER;
    static_assert(W % 64 == 0 && THREADS % PER == 0 && ROWS % RSTEP == 0, "tile shape");
    const int c = (int)threadIdx.x % PER, r0 = (int)threadIdx.x / PER;
    const uint32_t d = dst + (uint32_t)((c >> 3) * ROWS * 128);
    const __nv_bfloat16 *s = src + c * 8;
#pragma unroll
    for (int k = 0; k < ROWS / RSTEP; k++) {
        const int r = r0 + k * RSTEP;
        /* (a row past n reads nothing; its address is row n - 1's.  The
         * rows' offsets computed here, not held: 252 registers and no
         * spill, where holding them took 255 and spilt 12 bytes) */
        dg_cp16_to(d + dg_swz128(r, c & 7), s + min(r, n - 1) * ld, r < n);
    }
}

/* grid (ceil(Tq g / 64), nkv, hd / DV splits); 128 threads.  Shared: Q
 * [64][hd], K [2][32][hd], V [2][32][DV] (rows padded for mma.sync,
 * swizzled and 1,024-aligned for WG; two buffers of K and V), the tile's
 * tokens' sequences and positions.  WG: hd = 64 NKC (the products
 * unrolled whole; PAIR: 128 NKC); NKC is 0 otherwise.
 *
 * PAIR (WG only; hd = 2 DV): grid (ceil(Tq g / 64), nkv, splits), 256
 * threads, two warpgroups over the same 64 rows and key tiles.
 * Warpgroup w takes the head's columns [w DV, (w + 1) DV): its S_w = Q_w
 * K_w^T over them (NKC sub-tiles), the two exchanged through shared
 * memory (Sx [2][16][128] fp32) so that each holds S = S_0 + S_1 (the
 * same sum in both: addition is commutative), the same softmax, and O_w
 * += P V_w; V [2][32][hd].  No product is done twice, where one
 * warpgroup a column block computes all of S for each block. */
template <int DV, bool WG, int NKC, bool PAIR>
__global__ static void __launch_bounds__(PAIR ? 256 : 128)
    attention_tc_kernel(__nv_bfloat16 *out, float *part, const __nv_bfloat16 *q,
                        const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                        const struct dg_attn_seq *seqs, int nh, int nkv, int hd, int mask,
                        int window, int splits)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sbase =
        WG ? (dg_smem_u32(smem_raw) + 1023u) & ~1023u : dg_smem_u32(smem_raw);
    unsigned char *smem = smem_raw + (sbase - dg_smem_u32(smem_raw));
    static_assert(!PAIR || WG, "the paired form is the wgmma one");
    constexpr int THREADS = PAIR ? 256 : 128;
    constexpr int QHD = PAIR ? 128 * NKC : 64 * NKC; /* WG: hd */
    const int wg = PAIR ? (int)threadIdx.x >> 7 : 0;
    const int n_dv = PAIR ? 1 : hd / DV, split = (int)blockIdx.z / n_dv;
    const int g = nh / nkv, c = blockIdx.y;
    const int dv0 = PAIR ? wg * DV : ((int)blockIdx.z % n_dv) * DV;
    const int64_t R0 = (int64_t)blockIdx.x * TC_ROWS;
    const int64_t t_lo = R0 / g;
    /* row R0 + r: query head (rb + r) % g of KV head c's, token t_lo + (rb + r) / g */
    const int rb = (int)(R0 - t_lo * g);
    const int n_tok = (int)(min(Tq, (R0 + TC_ROWS - 1) / g + 1) - t_lo);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3; /* (in its warpgroup) */
    const int gid = lane >> 2, tig = lane & 3;
    const int qs = WG ? hd : hd + TC_PAD, vs = WG ? (PAIR ? 2 * DV : DV) : DV + TC_PAD;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *Ks = Qs + TC_ROWS * qs;
    __nv_bfloat16 *Vs = Ks + TC_BUFS * TC_KEYS * qs;
    float *Sx = (float *)(Vs + TC_BUFS * TC_KEYS * vs); /* PAIR: [2][16][128] */
    int64_t *tpos = (int64_t *)(Sx + (PAIR ? 2 * 16 * 128 : 0));
    int32_t *tseq = (int32_t *)(tpos + TC_ROWS);
    __shared__ int s_next;
    float o[DV / 8][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int64_t rpos[2];
    int rseq[2];
    int s;

    /* the tile's tokens, and its query rows (zeros past Tq) */
    for (int i = threadIdx.x; i < n_tok; i += blockDim.x) {
        tpos[i] = q_pos[t_lo + i];
        tseq[i] = q_seq[t_lo + i];
    }
    for (int i = threadIdx.x, per = WG ? QHD / 8 : hd / 8; i < TC_ROWS * per; i += THREADS) {
        const int r = i / per, col = (i % per) * 8;
        const int64_t t = t_lo + (rb + r) / g;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < Tq)
            v = *(const uint4 *)(q + (t * nh + c * g + (rb + r) % g) * hd + col);
        if (WG)
            *(uint4 *)(smem + (col >> 6) * TC_ROWS * 128 + dg_swz128(r, (col >> 3) & 7)) = v;
        else
            *(uint4 *)(Qs + r * qs + col) = v;
    }
    if (WG)
        dg_fence_proxy_async(); /* (wgmma reads Q through the async proxy) */
    __syncthreads();
    for (int h = 0; h < 2; h++) {
        const int64_t t = t_lo + (rb + warp * 16 + gid + 8 * h) / g;
        rseq[h] = t < Tq ? tseq[t - t_lo] : -1;
        rpos[h] = t < Tq ? tpos[t - t_lo] : 0;
    }
#pragma unroll
    for (int d = 0; d < DV / 8; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    /* the tile's sequences, lowest first */
    s = INT32_MAX;
    for (int i = 0; i < n_tok; i++)
        s = min(s, tseq[i]);
    for (;;) {
        const struct dg_attn_seq sq = seqs[s];
        const int64_t row = (int64_t)nkv * hd;
        const __nv_bfloat16 *K = (const __nv_bfloat16 *)sq.k + sq.k_start * row + (int64_t)c * hd;
        const __nv_bfloat16 *V = (const __nv_bfloat16 *)sq.v + sq.k_start * row + (int64_t)c * hd +
                                 (PAIR ? 0 : dv0);
        int64_t j0 = 0, j1 = sq.k_len;
        if (mask != 0) {
            /* keys no row of this sequence in the tile can see */
            int64_t lo = INT64_MAX, hi = INT64_MIN;
            for (int i = 0; i < n_tok; i++)
                if (tseq[i] == s) {
                    lo = min(lo, tpos[i]);
                    hi = max(hi, tpos[i]);
                }
            j1 = min(j1, hi - sq.k_start + 1);
            if (mask == 2)
                j0 = max((int64_t)0, lo - window + 1 - sq.k_start);
        }
        if (splits > 1 && j1 > j0) {
            /* this block's range of the keys: whole tiles but the last */
            const int64_t per = ((j1 - j0 + splits - 1) / splits + TC_KEYS - 1) / TC_KEYS *
                                TC_KEYS;
            j0 += split * per;
            j1 = min(j1, j0 + per);
        }
        const int64_t ntiles = j1 > j0 ? (j1 - j0 + TC_KEYS - 1) / TC_KEYS : 0;
        /* tile kt's keys (load_k) or values (load_v) into buffer b, rows
         * past j1 as zeros; the caller commits */
        auto load_k = [&](int b, int64_t kt) {
            const int nk = (int)min((int64_t)TC_KEYS, j1 - kt);
            if constexpr (WG)
                load_swz_tile<QHD, TC_KEYS, THREADS>(
                    sbase + (uint32_t)((const unsigned char *)(Ks + b * TC_KEYS * qs) - smem),
                    K + kt * row, (int)row, nk);
            else
                load_rows_async(Ks + b * TC_KEYS * qs, K + kt * row, row, nk, TC_KEYS, hd);
        };
        auto load_v = [&](int b, int64_t kt) {
            const int nk = (int)min((int64_t)TC_KEYS, j1 - kt);
            if constexpr (WG)
                load_swz_tile<PAIR ? 2 * DV : DV, TC_KEYS, THREADS>(
                    sbase + (uint32_t)((const unsigned char *)(Vs + b * TC_KEYS * vs) - smem),
                    V + kt * row, (int)row, nk);
            else
                load_rows_async(Vs + b * TC_KEYS * vs, V + kt * row, row, nk, TC_KEYS, DV);
        };
        /* WG: S = Q K^T of the tile in buffer b over the whole head (PAIR:
         * over this warpgroup's half), the warpgroup's m64n32k16 products
         * sub-tile by sub-tile into d, the first one not adding; issued
         * only (the caller fences, commits and waits) */
        auto qk_issue = [&](float(&d)[16], int b) {
            const uint32_t ka = sbase + (uint32_t)((const unsigned char *)(Ks + b * TC_KEYS * qs) -
                                                   smem);
            const int kc0 = wg * NKC;
            const uint64_t qd = dg_wgmma_desc(sbase + kc0 * TC_ROWS * 128),
                           kd = dg_wgmma_desc(ka + kc0 * TC_KEYS * 128);
#pragma unroll
            for (int kc = 0; kc < NKC; kc++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    dg_wgmma_m64n32(d, dg_wgmma_desc_add(qd, kc * TC_ROWS * 128 + 32 * kk),
                                    dg_wgmma_desc_add(kd, kc * TC_KEYS * 128 + 32 * kk),
                                    kc > 0 || kk > 0);
        };
        /* WG: O += P V for the tile in buffer b, the warpgroup's m64nDVk16
         * products, B = the V tile read N-major (its swizzled 64-column
         * sub-tiles TC_KEYS x 128 bytes apart), the same O registers as
         * mma.sync's layout; issued only */
        auto pv_issue = [&](const uint32_t(&a)[TC_KEYS / 16][4], int b) {
            const uint32_t va = sbase +
                                (uint32_t)((const unsigned char *)(Vs + b * TC_KEYS * vs) - smem) +
                                (PAIR ? (uint32_t)(wg * (DV / 64) * TC_KEYS * 128) : 0u);
            const uint64_t vd0 = dg_wgmma_desc_n(va, TC_KEYS * 128);
            float(&od)[DV / 2] = *reinterpret_cast<float(*)[DV / 2]>(&o[0][0]);
#pragma unroll
            for (int k = 0; k < TC_KEYS / 16; k++) {
                const uint64_t vd = dg_wgmma_desc_add(vd0, k * 16 * 128);
                if constexpr (DV == 64)
                    dg_wgmma_m64n64_rt(od, a[k], vd);
                else if constexpr (DV == 128)
                    dg_wgmma_m64n128_rt(od, a[k], vd);
                else
                    dg_wgmma_m64n256_rt(od, a[k], vd);
            }
        };
        /* PAIR: S's two halves (each warpgroup's Q K^T over its half of
         * the head) added through shared memory, so that both hold the
         * whole S.  Sx is free: every thread passed a barrier after
         * reading the last tile's (the one before this tile's products) */
        auto add_halves = [&](float(&d)[16]) {
            if constexpr (PAIR) {
                const int t = threadIdx.x & 127;
#pragma unroll
                for (int i = 0; i < 16; i++)
                    Sx[(wg * 16 + i) * 128 + t] = d[i];
                __syncthreads();
#pragma unroll
                for (int i = 0; i < 16; i++)
                    d[i] += Sx[((wg ^ 1) * 16 + i) * 128 + t];
            }
        };
        /* (tc_softmax, tc_pack_p, tc_rescale: attention-tc-parts.cuh) */
        auto softmax = [&](float(&sc)[TC_KEYS / 8][4], int64_t kt, float(&alpha)[2]) {
            tc_softmax<TC_KEYS>(sc, kt, j1, sq.k_start, s, rseq, rpos, mask, window, tig, m, l,
                                alpha);
        };
        auto pack_p = [&](const float(&sc)[TC_KEYS / 8][4], uint32_t(&a)[TC_KEYS / 16][4]) {
            tc_pack_p<TC_KEYS>(sc, a);
        };
        auto rescale = [&](const float(&alpha)[2]) { tc_rescale<DV>(o, alpha); };
        if constexpr (WG) {
            /* Pipelined (FlashAttention-3's overlap within a warpgroup):
             * tile i's Q K^T is issued, O is scaled by alpha_{i-1} while
             * it runs, then P_{i-1} V_{i-1} is issued and tile i's softmax
             * (PAIR: after S's halves are added) runs while that is on the
             * tensor cores.  The same operations on the same values in the
             * same order as a tile at a time (O *= alpha_{i-1}, O +=
             * P_{i-1} V_{i-1}, then tile i), so the same results to the
             * bit.  P's registers are rewritten only after
             * the wait that completes P V (ptxas serialises the products
             * where a register an in-flight product reads is written), and
             * the operand fences after the waits keep the compiler from
             * moving a use of S or O above them.  Copies: K of tile i + 1
             * is issued before tile i's products, V of tile i + 1 after P
             * V has read the buffer it reuses (V_{i-1}'s); the groups go
             * K_0, V_0, K_1, V_1, ..., so at tile i all but the newest two
             * (V_i, K_{i+1}) have landed: K_i and V_{i-1}. */
            if (ntiles > 0) {
                uint32_t p[TC_KEYS / 16][4]; /* P_{i-1}: PV's A fragments */
                float alpha[2];              /* alpha_{i-1}: O's scale before P_{i-1} V_{i-1} */
                /* tile 0 alone: its S, softmax and P */
                load_k(0, j0);
                dg_cp_commit();
                load_v(0, j0);
                dg_cp_commit();
                if (ntiles > 1)
                    load_k(1, j0 + TC_KEYS);
                dg_cp_commit();
                dg_cp_wait<2>();
                dg_fence_proxy_async(); /* (the K and V tiles, for wgmma) */
                __syncthreads();
                {
                    float d[16], sc[TC_KEYS / 8][4];
                    dg_wgmma_fence();
                    qk_issue(d, 0);
                    dg_wgmma_commit();
                    dg_wgmma_wait<0>();
                    dg_wgmma_operand_fence(d);
                    add_halves(d);
#pragma unroll
                    for (int i = 0; i < 16; i++)
                        sc[i / 4][i % 4] = d[i];
                    softmax(sc, j0, alpha);
                    pack_p(sc, p);
                }
                __syncthreads();
                if (ntiles > 1)
                    load_v(1, j0 + TC_KEYS);
                dg_cp_commit();
                /* tiles 1 on: tile i's S beside tile i - 1's P V */
                for (int64_t it = 1; it < ntiles; it++) {
                    const int64_t kt = j0 + it * TC_KEYS;
                    const int buf = (int)(it & 1);
                    float d[16], sc[TC_KEYS / 8][4];
                    if (it + 1 < ntiles)
                        load_k(buf ^ 1, kt + TC_KEYS);
                    dg_cp_commit();
                    dg_cp_wait<2>();
                    dg_fence_proxy_async();
                    __syncthreads();
                    dg_wgmma_fence();
                    qk_issue(d, buf);
                    dg_wgmma_commit();
                    rescale(alpha); /* (while Q K^T runs) */
                    dg_wgmma_fence();
                    pv_issue(p, buf ^ 1);
                    dg_wgmma_commit();
                    dg_wgmma_wait<1>(); /* S_i */
                    dg_wgmma_operand_fence(d);
                    add_halves(d);
#pragma unroll
                    for (int i = 0; i < 16; i++)
                        sc[i / 4][i % 4] = d[i];
                    softmax(sc, kt, alpha); /* (while P V runs) */
                    dg_wgmma_wait<0>();     /* P_{i-1} V_{i-1} */
                    dg_wgmma_operand_fence(reinterpret_cast<float(&)[DV / 2]>(o[0][0]));
                    pack_p(sc, p);
                    __syncthreads(); /* V_{i-1}'s buffer is read: V_{i+1} may land there */
                    if (it + 1 < ntiles)
                        load_v(buf ^ 1, kt + TC_KEYS);
                    dg_cp_commit();
                }
                /* the last tile's P V */
                rescale(alpha);
                dg_cp_wait<0>();
                dg_fence_proxy_async();
                __syncthreads();
                dg_wgmma_fence();
                pv_issue(p, (int)((ntiles - 1) & 1));
                dg_wgmma_commit();
                dg_wgmma_wait<0>();
                dg_wgmma_operand_fence(reinterpret_cast<float(&)[DV / 2]>(o[0][0]));
            }
        } else {
            /* mma.sync, a tile at a time.  The first tile into buffer 0
             * (the last sequence's tiles are used up: the barrier after
             * each) */
            if (ntiles > 0) {
                load_k(0, j0);
                load_v(0, j0);
            }
            dg_cp_commit();
            for (int64_t it = 0; it < ntiles; it++) {
                const int64_t kt = j0 + it * TC_KEYS;
                const int buf = (int)(it & 1);
                float sc[TC_KEYS / 8][4], alpha[2];
                /* the next tile into the other buffer, then wait for this one's
                 * copies (all but the newest group) */
                if (it + 1 < ntiles) {
                    load_k(buf ^ 1, kt + TC_KEYS);
                    load_v(buf ^ 1, kt + TC_KEYS);
                }
                dg_cp_commit();
                dg_cp_wait<1>();
                __syncthreads();
                {
#pragma unroll
                    for (int n = 0; n < TC_KEYS / 8; n++)
                        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
                    /* S = Q K^T over the whole head */
                    const __nv_bfloat16 *Kb = Ks + buf * TC_KEYS * qs;
                    for (int k0 = 0; k0 < hd; k0 += 16) {
                        uint32_t a[4];
                        dg_ldsm4(a, Qs + (warp * 16 + (lane & 15)) * qs + k0 + (lane >> 4) * 8);
#pragma unroll
                        for (int n0 = 0; n0 < TC_KEYS; n0 += 16) {
                            uint32_t b[4];
                            dg_ldsm4(b, Kb + (n0 + (lane & 7) + (lane >> 4) * 8) * qs + k0 +
                                           ((lane >> 3) & 1) * 8);
                            dg_mma_bf16(sc[n0 / 8], a, b[0], b[1]);
                            dg_mma_bf16(sc[n0 / 8 + 1], a, b[2], b[3]);
                        }
                    }
                }
                softmax(sc, kt, alpha);
                rescale(alpha);
                /* O += P V: P from the score registers as A fragments */
                {
                    const __nv_bfloat16 *Vb = Vs + buf * TC_KEYS * vs;
#pragma unroll
                    for (int k0 = 0; k0 < TC_KEYS; k0 += 16) {
                        uint32_t a[4];
                        a[0] = pack_bf16(sc[k0 / 8][0], sc[k0 / 8][1]);
                        a[1] = pack_bf16(sc[k0 / 8][2], sc[k0 / 8][3]);
                        a[2] = pack_bf16(sc[k0 / 8 + 1][0], sc[k0 / 8 + 1][1]);
                        a[3] = pack_bf16(sc[k0 / 8 + 1][2], sc[k0 / 8 + 1][3]);
#pragma unroll
                        for (int d0 = 0; d0 < DV; d0 += 16) {
                            uint32_t b[4];
                            dg_ldsm4_t(b, Vb + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * vs + d0 +
                                              (lane >> 4) * 8);
                            dg_mma_bf16(o[d0 / 8], a, b[0], b[1]);
                            dg_mma_bf16(o[d0 / 8 + 1], a, b[2], b[3]);
                        }
                    }
                }
                __syncthreads(); /* this buffer is read: the next tile but one may land */
            }
        }
        /* the next sequence of the tile, in ascending order */
        __syncthreads();
        if (threadIdx.x == 0) {
            int nx = INT32_MAX;
            for (int i = 0; i < n_tok; i++)
                if (tseq[i] > s && tseq[i] < nx)
                    nx = tseq[i];
            s_next = nx;
        }
        __syncthreads();
        if (s_next == INT32_MAX)
            break;
        s = s_next;
    }
    /* (splits > 1: this range's m, l and O to the scratch, [splits][Tq nh]
     * (m, l), then from tc_o_at [splits][Tq nh][hd] O; else out = O / l) */
    tc_store_rows<DV>(out, part, o, m, l, warp * 16 + gid, rb, t_lo, g, c, nh, Tq, hd,
                      dv0 + tig * 2, split, splits);
}

/* The split ranges of each row (t, h) folded (see the top), four columns
 * a thread, the rows of a block side by side: grid ceil(rows / (blockDim
 * / (hd / 4))), blockDim a multiple of hd / 4 (hd a multiple of 4, at
 * most 1,024), part 16-byte aligned (O from tc_o_at), out 8-byte aligned,
 * splits at most TC_MAX_SPLITS.  Every split's (m, l) and O are loaded
 * before any is used.  (Run 131, batch 1, each launch alone: 15.2-15.5
 * -> 12.6-13.1 us against a thread for two columns and a block a row.) */
__global__ static void attention_fold_kernel(__nv_bfloat16 *out, const float *part,
                                              int64_t rows, int hd, int splits)
{
    const int tpr = hd / 4;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
    const int d = 4 * ((int)threadIdx.x % tpr);
    const float *O = part + tc_o_at(splits, rows);
    float2 ml[TC_MAX_SPLITS];
    float4 v[TC_MAX_SPLITS];
    float M = -INFINITY, L = 0.0f, a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (row >= rows)
        return;
#pragma unroll
    for (int s = 0; s < TC_MAX_SPLITS; s++)
        if (s < splits) {
            ml[s] = *(const float2 *)(part + ((int64_t)s * rows + row) * 2);
            v[s] = *(const float4 *)(O + ((int64_t)s * rows + row) * hd + d);
        }
#pragma unroll
    for (int s = 0; s < TC_MAX_SPLITS; s++)
        if (s < splits)
            M = fmaxf(M, ml[s].x);
    if (M != -INFINITY)
#pragma unroll
        for (int s = 0; s < TC_MAX_SPLITS; s++)
            if (s < splits) {
                const float w = ml[s].x == -INFINITY ? 0.0f : __expf(ml[s].x - M);
                L += w * ml[s].y;
                a[0] += w * v[s].x;
                a[1] += w * v[s].y;
                a[2] += w * v[s].z;
                a[3] += w * v[s].w;
            }
    {
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + row * hd + d);
        dst[0] = __floats2bfloat162_rn(a[0] * inv, a[1] * inv);
        dst[1] = __floats2bfloat162_rn(a[2] * inv, a[3] * inv);
    }
}

int dg_attn_tc_fold(__nv_bfloat16 *out, const float *part, int64_t rows, int hd, int splits,
                    cudaStream_t st, int dev, struct dg_error *err)
{
    const int tpr = hd / 4, per = 256 / tpr; /* threads a row, rows a block */
    int rc = 0;
    attention_fold_kernel<<<(unsigned)((rows + per - 1) / per), per * tpr, 0, st>>>(
        out, part, rows, hd, splits);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* Key ranges per row tile.  The blocks of one launch run in waves of
 * `slots` (the blocks a multiprocessor holds at once, by registers and
 * shared memory, times the multiprocessors), and a block's time grows
 * with its keys: splitting each tile's keys s ways makes s times the
 * blocks with 1/s of the keys each, so the launch takes about
 * ceil(blocks s / slots) / s of the unsplit one.  The fewest splits (up
 * to 8, and as many as the scratch holds) that minimise that; ties go to
 * fewer (each split adds partial results and the fold).  On the H200 at
 * batch 1: sliding layers 64 tiles over 264 slots (two blocks of 238
 * registers a multiprocessor) take 4 splits, one wave where the earlier
 * rule's 5 made 320 blocks, two waves; full layers, paired, 64 tiles
 * over 132 slots (215 KB of shared memory a block) take 2.  Only where
 * the tiles alone fill less than one wave: past it the waves' rounding
 * costs little, and the partial results a lot (batch 16's full layers,
 * 1,024 tiles over 132 slots, took 5 splits for 7.8 waves' time against
 * 8, and wrote and folded 671 MB of partial results a layer).  (At most
 * TC_MAX_SPLITS.) */

/* whether the wgmma form (wg) at head size hd takes the paired kernel:
 * at 512 only.  Run 101, the H200: the full layers (hd 512) 0.750 ->
 * 0.490 ms at batch 1, 27.86 -> 11.05 at batch 16; paired at hd 256 too,
 * the sliding layers went 1.347 -> 1.658 and 13.32 -> 31.80 ms (one
 * block of 8 warps a multiprocessor, where unpaired fits two of 4). */
static int tc_pair(int hd, int wg)
{
    return wg && hd == 512;
}

static int64_t tc_blocks(int64_t Tq, int nh, int nkv, int hd, int pair)
{
    return (Tq * (nh / nkv) + TC_ROWS - 1) / TC_ROWS * nkv *
           (!pair && hd > 256 ? hd / 256 : 1);
}

size_t dg_attn_tc_part_bytes(int splits, int64_t Tq, int nh, int hd)
{
    return splits > 1 ? sizeof(float) * (size_t)(tc_o_at(splits, Tq * nh) +
                                                 (int64_t)splits * Tq * nh * hd)
                      : 0;
}

int dg_attn_tc_splits_of(int64_t blocks, int64_t Tq, int nh, int hd, size_t scratch_bytes,
                         int64_t slots)
{
    int best = 1;
    int64_t best_waves; /* cost best_waves / best */
    if (slots < 1 || blocks >= slots)
        return 1;
    best_waves = (blocks + slots - 1) / slots;
    for (int s = 2; s <= TC_MAX_SPLITS && dg_attn_tc_part_bytes(s, Tq, nh, hd) <= scratch_bytes;
         s++) {
        const int64_t waves = (blocks * s + slots - 1) / slots;
        if (waves * best < best_waves * s) { /* waves / s < best_waves / best */
            best = s;
            best_waves = waves;
        }
    }
    return best;
}

static int tc_splits(int64_t Tq, int nh, int nkv, int hd, int pair, size_t scratch_bytes,
                     int64_t slots)
{
    return dg_attn_tc_splits_of(tc_blocks(Tq, nh, nkv, hd, pair), Tq, nh, hd, scratch_bytes,
                                slots);
}

/* the kernel's dynamic shared memory at head size hd, column block DV, in
 * the wgmma form (Q and K unpadded, and room to align them to 1,024) or
 * not, paired (V's tiles whole, and the two halves of S) or not */
static size_t tc_shared(int hd, int DV, int wg, int pair)
{
    const size_t qk = (size_t)(TC_ROWS + TC_BUFS * TC_KEYS) * (size_t)(wg ? hd : hd + TC_PAD);
    const size_t vw = pair ? (size_t)hd : (size_t)(wg ? DV : DV + TC_PAD);
    return sizeof(__nv_bfloat16) * qk + sizeof(__nv_bfloat16) * TC_BUFS * TC_KEYS * vw +
           (pair ? sizeof(float) * 2 * 16 * 128 : 0) +
           (sizeof(int64_t) + sizeof(int32_t)) * TC_ROWS + (wg ? 1024 : 0);
}

/* DV: hd's column block (64, 128, else 256); paired, half the head */
static int tc_dv(int hd, int pair)
{
    return pair ? hd / 2 : hd == 64 ? 64 : hd == 128 ? 128 : 256;
}

/* The blocks of the kernel that the current device runs at once (0 where
 * it cannot say: then no split). */
template <int DV, bool WG, int NKC, bool PAIR>
static int64_t tc_slots_dv(size_t shared)
{
    return tc_slots_of(attention_tc_kernel<DV, WG, NKC, PAIR>, PAIR ? 256 : 128, shared);
}

template <bool WG>
static int64_t tc_slots_wg(int hd)
{
    const int pair = tc_pair(hd, WG);
    const size_t shared = tc_shared(hd, tc_dv(hd, pair), WG, pair);
    if (hd == 64)
        return tc_slots_dv<64, WG, WG ? 1 : 0, false>(shared);
    if (hd == 128)
        return tc_slots_dv<128, WG, WG ? 2 : 0, false>(shared);
    if (hd == 256)
        return tc_slots_dv<256, WG, WG ? 4 : 0, false>(shared);
    if constexpr (WG)
        return tc_slots_dv<256, true, 4, true>(shared); /* hd 512: paired */
    else
        return tc_slots_dv<256, false, 0, false>(shared);
}

static int64_t tc_slots(int hd, int wg)
{
    return wg ? tc_slots_wg<true>(hd) : tc_slots_wg<false>(hd);
}

/* the form a call takes: wgmma where asked, or by default where device dev
 * has it; -1 where wgmma was asked of a device without it */
static int tc_wg(enum dg_attn_tc_form form, int dev)
{
    const int has = dg_wgmma_device(dev);
    return form == DG_ATTN_TC_MMA ? 0 : form != DG_ATTN_TC_AUTO ? (has ? 1 : -1) : has;
}

/* whether a call of that form (wg: tc_wg's answer) at head size hd takes
 * the warp-specialised kernel: where asked, or by default, at head size
 * 256 on wgmma */
static int tc_ws(enum dg_attn_tc_form form, int hd, int wg)
{
    return wg > 0 && hd == DG_ATTN_WS_HD && (form == DG_ATTN_TC_WS || form == DG_ATTN_TC_AUTO);
}

extern "C" size_t dg_cuda_attention_tc_scratch(int64_t Tq, int nh, int nkv, int hd)
{
    int d = 0;
    if (Tq <= 0 || nkv < 1 || !dg_cuda_attention_tc_fits(hd))
        return 0;
    if (cudaGetDevice(&d) != cudaSuccess)
        (void)cudaGetLastError();
    const int wg = tc_wg(DG_ATTN_TC_AUTO, d);
    if (tc_ws(DG_ATTN_TC_AUTO, hd, wg))
        return dg_attn_tc_part_bytes(dg_attn_tc_splits_of(dg_attn_ws_blocks(Tq, nh, nkv), Tq, nh,
                                                          hd, SIZE_MAX, dg_attn_ws_slots()),
                                     Tq, nh, hd);
    return dg_attn_tc_part_bytes(
        tc_splits(Tq, nh, nkv, hd, tc_pair(hd, wg), SIZE_MAX, tc_slots(hd, wg)), Tq, nh, hd);
}

extern "C" int dg_cuda_attention_tc_fits(int hd)
{
    return hd == 64 || hd == 128 || hd == 256 || hd == 512;
}

template <int DV, bool WG, int NKC, bool PAIR>
static int launch(__nv_bfloat16 *out, float *part, int splits, const __nv_bfloat16 *q,
                  const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                  const struct dg_attn_seq *seqs, int nh, int nkv, int hd, int mask, int window,
                  cudaStream_t st, int dev, struct dg_error *err)
{
    const size_t shared = tc_shared(hd, DV, WG, PAIR);
    const int g = nh / nkv;
    const dim3 grid((unsigned)((Tq * g + TC_ROWS - 1) / TC_ROWS), (unsigned)nkv,
                    (unsigned)((PAIR ? 1 : hd / DV) * splits));
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel<DV, WG, NKC, PAIR>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    attention_tc_kernel<DV, WG, NKC, PAIR><<<grid, PAIR ? 256 : 128, shared, st>>>(
        out, part, q, q_pos, q_seq, Tq, seqs, nh, nkv, hd, mask, window, splits);
    DG_LAUNCH_CHECK();
    if (splits > 1)
        return dg_attn_tc_fold(out, part, Tq * nh, hd, splits, st, dev, err);
out:
    return rc;
}

/* launch with DV = hd's column block (64, 128, else 256), and for WG the
 * head's sub-tiles; WG at hd 512 paired (tc_pair): DV half the head and
 * each warpgroup half the sub-tiles */
template <bool WG>
static int launch_dv(__nv_bfloat16 *out, float *part, int splits, const __nv_bfloat16 *q,
                     const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                     const struct dg_attn_seq *seqs, int nh, int nkv, int hd, int mask,
                     int window, cudaStream_t st, int dev, struct dg_error *err)
{
    if (hd == 64)
        return launch<64, WG, WG ? 1 : 0, false>(out, part, splits, q, q_pos, q_seq, Tq, seqs,
                                                 nh, nkv, hd, mask, window, st, dev, err);
    if (hd == 128)
        return launch<128, WG, WG ? 2 : 0, false>(out, part, splits, q, q_pos, q_seq, Tq, seqs,
                                                  nh, nkv, hd, mask, window, st, dev, err);
    if (hd == 256)
        return launch<256, WG, WG ? 4 : 0, false>(out, part, splits, q, q_pos, q_seq, Tq, seqs,
                                                  nh, nkv, hd, mask, window, st, dev, err);
    if constexpr (WG)
        return launch<256, true, 4, true>(out, part, splits, q, q_pos, q_seq, Tq, seqs, nh, nkv,
                                          hd, mask, window, st, dev, err);
    else
        return launch<256, false, 0, false>(out, part, splits, q, q_pos, q_seq, Tq, seqs, nh, nkv,
                                            hd, mask, window, st, dev, err);
}

extern "C" int dg_cuda_attention_tc_form(enum dg_attn_tc_form form, void *out, const void *q,
                                         const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                                         const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                                         int mask, int window, void *scratch,
                                         size_t scratch_bytes, dg_stream_t stream, int dev,
                                         struct dg_error *err)
{
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    const __nv_bfloat16 *qq = (const __nv_bfloat16 *)q;
    const cudaStream_t st = (cudaStream_t)stream;
    const int wg = tc_wg(form, dev);
    int splits, can_split;
    if (!dg_cuda_attention_tc_fits(hd) || nkv < 1 || nh % nkv != 0 || nkv > 65535)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: tensor-core attention: %d heads over %d KV "
                            "heads of %d", dev, nh, nkv, hd);
    if (wg < 0)
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: tensor-core attention: the wgmma "
                            "form needs a device of compute capability 9.0", dev);
    if (Tq <= 0)
        return 0;
    /* (split keys need the fold's alignments: scratch 16 bytes, out 8) */
    can_split = scratch && (uintptr_t)scratch % 16 == 0 && (uintptr_t)out % 8 == 0;
    if (tc_ws(form, hd, wg))
        return dg_attn_ws_launch(o, can_split ? (float *)scratch : NULL, scratch_bytes, qq,
                                 q_pos, q_seq, Tq, seqs, nh, nkv, mask, window, st, dev, err);
    splits = can_split ? tc_splits(Tq, nh, nkv, hd, tc_pair(hd, wg), scratch_bytes,
                                   tc_slots(hd, wg))
                       : 1;
    return wg ? launch_dv<true>(o, (float *)scratch, splits, qq, q_pos, q_seq, Tq, seqs, nh, nkv,
                                hd, mask, window, st, dev, err)
              : launch_dv<false>(o, (float *)scratch, splits, qq, q_pos, q_seq, Tq, seqs, nh, nkv,
                                 hd, mask, window, st, dev, err);
}

extern "C" int dg_cuda_attention_tc(void *out, const void *q, const int64_t *q_pos,
                                    const int32_t *q_seq, int64_t Tq,
                                    const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                                    int mask, int window, void *scratch, size_t scratch_bytes,
                                    dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_attention_tc_form(DG_ATTN_TC_AUTO, out, q, q_pos, q_seq, Tq, seqs, nh, nkv, hd,
                                     mask, window, scratch, scratch_bytes, stream, dev, err);
}
