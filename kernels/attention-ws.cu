/* attention-ws.cu - the tensor-core attention of attention-tc.h in a
 * warp-specialised form, at head size 256 (the default there on a device
 * with wgmma; attention-tc.cu dispatches).
 *
 * FlashAttention-3's division of labour, for head size 256 on wgmma (the
 * sliding layers of the 26B-A4B): a block of WS_ROWS = 128 rows, two
 * consumer warpgroups of 64 rows each (each its own rows' Q, S, P and O,
 * as in attention-tc.cu's wgmma form, and the same softmax), and a
 * producer warpgroup whose first WS_PRODUCERS warps do nothing but copy
 * each key tile's K and V (cp.async, a quarter of the tile's rows a warp)
 * into rings of WS_SK and WS_SV buffers, ahead of the consumers by as many
 * tiles as the rings hold.  mbarrier.cuh's protocol: a "full" barrier a
 * buffer that each producer lane arrives on once its copies land, an
 * "empty" one each consumer warp arrives on once its products have read
 * the buffer; K's buffer is given back once Q K^T is done, V's once P V
 * is, so the K ring runs a tile further ahead.  The copies' instructions
 * and their latency leave the consumers' chain, both warpgroups read each
 * buffer, and tiles of WS_KT = 64 keys give each of Q K^T's products
 * (m64n64k16) twice the keys for the same read of Q from shared memory.
 * A block walks the key tiles that any of its 128 rows sees (the wgmma
 * form's rule over twice the rows); within a warpgroup tile i's Q K^T runs
 * beside tile i - 1's P V as in the wgmma form.  The softmax runs over 64
 * keys at a time, not 32, so the results agree with the other forms
 * within rounding, not to the bit (each row's result is the same on
 * every run).  The query rows arrive by cp.async, waited for once the
 * producer has started on the keys.
 *
 * Grid (ceil(Tq g / 128), nkv, splits), WS_THREADS threads: warpgroups 0
 * and 1 the consumers, warpgroup 2 the producer; the producer's
 * warpgroup gives its registers down to 40 a thread and the consumers
 * take 232 (setmaxnreg; a launch of 384 threads gets 168 each, and at 168
 * the consumers spilt).  One block a multiprocessor: Q 64 KB, K 3 x 32
 * KB, V 2 x 32 KB of shared memory.
 *
 * Measured side by side in bench-attention (the H200; a step's attention,
 * 25 sliding layers and 5 full ones, the full ones in the paired wgmma
 * form either way), against the wgmma form: run 185, one producer warp,
 * 32-key tiles in one ring of 4: 20% slower at batch 1, 37% at batch 16
 * (the one warp could not issue the copies fast enough); run 186, four
 * producer warps: equal at batch 1, 7% faster at batch 16, and the two
 * warpgroups taking turns at the tensor cores (FlashAttention-3's
 * ping-pong, named barriers) no faster; run 189, Q by cp.async: 6-10%
 * faster than the wgmma form at batch 1-16; runs 187 and 191, 64-key
 * tiles in two shared K and V buffers: slower at batch 4 and 16; run 192,
 * 64-key tiles with K's ring of 3 apart from V's of 2: batch 1 1,224 /
 * 1,243 -> 1,090 / 1,095 us, batch 4 2,540 / 2,546 -> 2,131 / 2,145,
 * batch 16 9,349 / 9,351 -> 7,672 / 7,679. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/attention-tc-parts.cuh"
#include "kernels/cuda-check.h"
#include "kernels/mbarrier.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#define WS_ROWS 128
#define WS_THREADS 384
#define WS_HD DG_ATTN_WS_HD
#define WS_Q_BYTES (64 * WS_HD * 2)      /* a warpgroup's Q */
#ifndef WS_KT
#define WS_KT 64 /* keys a tile */
#define WS_SK 3  /* K buffers */
#define WS_SV 2  /* V buffers */
#endif
#define WS_T_BYTES (WS_KT * WS_HD * 2) /* a K or V tile */
#define WS_PRODUCERS 4 /* warps */

/* Producer warp pw's share of a K or V tile: of rows [0, n) of WS_HD
 * columns from src (row stride ld elements) into WS_KT rows of 128-byte
 * swizzled sub-tiles of 64 columns at shared address dst (sub-tile c / 8
 * at c / 8 x WS_KT x 128 bytes), zeros for rows n .. WS_KT - 1 (which
 * read nothing), the warp's WS_KT / WS_PRODUCERS consecutive rows; lane
 * copies 16-byte column chunk `lane` of each.  n >= 1. */
__device__ static inline void ws_load_tile(uint32_t dst, const __nv_bfloat16 *src, int ld, int n,
                                           int lane, int pw)
{
    static_assert(WS_HD / 8 == 32, "a chunk a lane");
    const uint32_t d = dst + (uint32_t)((lane >> 3) * WS_KT * 128);
    const __nv_bfloat16 *s = src + lane * 8;
    /* (a row past n reads nothing; its address is row n - 1's.  Rows a
     * pointer step apart, few at a time: the producer runs on 40
     * registers) */
    const int r0 = pw * (WS_KT / WS_PRODUCERS);
    s += min(r0, n - 1) * ld;
#pragma unroll 4
    for (int r = r0; r < r0 + WS_KT / WS_PRODUCERS; r++) {
        dg_cp16_to(d + dg_swz128(r, lane & 7), s, r < n);
        if (r + 1 < n)
            s += ld;
    }
}

__global__ static void __launch_bounds__(WS_THREADS, 1)
    attention_ws_kernel(__nv_bfloat16 *out, float *part, const __nv_bfloat16 *q,
                        const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                        const struct dg_attn_seq *seqs, int nh, int nkv, int mask, int window,
                        int splits)
{
    constexpr int HD = WS_HD, NKC = HD / 64, KT = WS_KT, SK = WS_SK, SV = WS_SV;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t sbase = (dg_smem_u32(smem_raw) + 1023u) & ~1023u;
    unsigned char *smem = smem_raw + (sbase - dg_smem_u32(smem_raw));
    const uint32_t kbase = sbase + 2 * WS_Q_BYTES, vbase = kbase + SK * WS_T_BYTES;
    /* barriers: K full [SK], K empty [SK], V full [SV], V empty [SV] */
    const uint32_t kfull = vbase + SV * WS_T_BYTES, kempty = kfull + 8 * SK,
                   vfull = kempty + 8 * SK, vempty = vfull + 8 * SV;
    int64_t *tpos = (int64_t *)(smem + (vempty + 8 * SV - sbase));
    int32_t *tseq = (int32_t *)(tpos + WS_ROWS);
    const int lane = threadIdx.x & 31, wg = (int)threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int gid = lane >> 2, tig = lane & 3;
    const int split = (int)blockIdx.z, g = nh / nkv, c = (int)blockIdx.y;
    const int64_t R0 = (int64_t)blockIdx.x * WS_ROWS;
    const int64_t t_lo = R0 / g;
    /* row R0 + r: query head (rb + r) % g of KV head c's, token t_lo + (rb + r) / g */
    const int rb = (int)(R0 - t_lo * g);
    const int n_tok = (int)(min(Tq, (R0 + WS_ROWS - 1) / g + 1) - t_lo);
    const int64_t row = (int64_t)nkv * HD; /* a key's values in the caches */

    if (threadIdx.x == 0) {
        /* full: the producer's lanes; empty: the consumers' warps */
        for (int s = 0; s < SK; s++) {
            dg_mbar_init(kfull + 8 * s, 32 * WS_PRODUCERS);
            dg_mbar_init(kempty + 8 * s, 8);
        }
        for (int s = 0; s < SV; s++) {
            dg_mbar_init(vfull + 8 * s, 32 * WS_PRODUCERS);
            dg_mbar_init(vempty + 8 * s, 8);
        }
        dg_mbar_init_fence();
    }
    /* the tile's tokens; the consumers' query rows by cp.async (zeros past
     * Tq; warpgroup r / 64's Q, row r % 64: a thread's 16-byte column
     * chunk of every eighth row), waited for only after the producer has
     * started on the keys */
    for (int i = threadIdx.x; i < n_tok; i += WS_THREADS) {
        tpos[i] = q_pos[t_lo + i];
        tseq[i] = q_seq[t_lo + i];
    }
    if (wg < 2) {
        const int col = (int)(threadIdx.x & 31) * 8;
#pragma unroll 4
        for (int r = (int)threadIdx.x >> 5; r < WS_ROWS; r += 8) {
            const int64_t t = t_lo + (rb + r) / g;
            dg_cp16_to(sbase + (uint32_t)((r >> 6) * WS_Q_BYTES + (col >> 6) * 64 * 128) +
                           dg_swz128(r & 63, (col >> 3) & 7),
                       t < Tq ? q + (t * nh + c * g + (rb + r) % g) * HD + col : q, t < Tq);
        }
    }
    __syncthreads(); /* (the barriers' initialisation, the tokens) */

    /* range(sq, s, j0, j1) for each sequence s of the tile's tokens, lowest
     * first, with this block's key range [j0, j1) of it (as attention-tc.cu's
     * kernel computes it); every thread walks it alone */
    auto walk = [&](auto &&range) {
        int s = INT32_MAX;
        for (int i = 0; i < n_tok; i++)
            s = min(s, tseq[i]);
        while (s != INT32_MAX) {
            const struct dg_attn_seq sq = seqs[s];
            int64_t j0 = 0, j1 = sq.k_len;
            int nx = INT32_MAX;
            if (mask != 0) {
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
                const int64_t per = ((j1 - j0 + splits - 1) / splits + KT - 1) / KT * KT;
                j0 += split * per;
                j1 = min(j1, j0 + per);
            }
            range(sq, s, j0, j1);
            for (int i = 0; i < n_tok; i++)
                if (tseq[i] > s && tseq[i] < nx)
                    nx = tseq[i];
            s = nx;
        }
    };

    if (wg == 2) { /* the producer warpgroup: its first WS_PRODUCERS warps copy */
        uint32_t n = 0; /* tiles issued so far */
        DG_WGMMA_ASM("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp >= WS_PRODUCERS)
            return;
        walk([&](const struct dg_attn_seq &sq, int, int64_t j0, int64_t j1) {
            const __nv_bfloat16 *K =
                (const __nv_bfloat16 *)sq.k + sq.k_start * row + (int64_t)c * HD;
            const __nv_bfloat16 *V =
                (const __nv_bfloat16 *)sq.v + sq.k_start * row + (int64_t)c * HD;
            for (int64_t kt = j0; kt < j1; kt += KT, n++) {
                const int nk = (int)min((int64_t)KT, j1 - kt);
                /* each buffer once the consumers are done with its last tile */
                if (n >= SK)
                    dg_mbar_wait(kempty + 8 * (n % SK), (n / SK - 1) & 1);
                ws_load_tile(kbase + (n % SK) * WS_T_BYTES, K + kt * row, (int)row, nk, lane,
                             warp);
                dg_mbar_arrive_cp(kfull + 8 * (n % SK));
                if (n >= SV)
                    dg_mbar_wait(vempty + 8 * (n % SV), (n / SV - 1) & 1);
                ws_load_tile(vbase + (n % SV) * WS_T_BYTES, V + kt * row, (int)row, nk, lane,
                             warp);
                dg_mbar_arrive_cp(vfull + 8 * (n % SV));
            }
        });
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    DG_WGMMA_ASM("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    /* Q landed, fenced for wgmma, and seen by both warpgroups (named
     * barrier 1: the consumers' 256 threads) */
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    dg_fence_proxy_async();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    float o[HD / 8][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int64_t rpos[2];
    int rseq[2];
    uint32_t n = 0; /* tiles read so far */
    for (int h = 0; h < 2; h++) {
        const int64_t t = t_lo + (rb + wg * 64 + warp * 16 + gid + 8 * h) / g;
        rseq[h] = t < Tq ? tseq[t - t_lo] : -1;
        rpos[h] = t < Tq ? tpos[t - t_lo] : 0;
    }
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    walk([&](const struct dg_attn_seq &sq, int s, int64_t j0, int64_t j1) {
        const int64_t ntiles = j1 > j0 ? (j1 - j0 + KT - 1) / KT : 0;
        /* wait for tile i's K (or V) buffer, then fence it for wgmma */
        auto wait_k = [&](uint32_t i) {
            dg_mbar_wait(kfull + 8 * (i % SK), (i / SK) & 1);
            dg_fence_proxy_async();
        };
        auto wait_v = [&](uint32_t i) {
            dg_mbar_wait(vfull + 8 * (i % SV), (i / SV) & 1);
            dg_fence_proxy_async();
        };
        /* this warp is done with tile i's K (or V) buffer */
        auto release_k = [&](uint32_t i) {
            __syncwarp();
            if (lane == 0)
                dg_mbar_arrive(kempty + 8 * (i % SK));
        };
        auto release_v = [&](uint32_t i) {
            __syncwarp();
            if (lane == 0)
                dg_mbar_arrive(vempty + 8 * (i % SV));
        };
        auto qk_issue = [&](float(&d)[KT / 2], uint32_t i) {
            const uint64_t qd = dg_wgmma_desc(sbase + wg * WS_Q_BYTES),
                           kd = dg_wgmma_desc(kbase + (i % SK) * WS_T_BYTES);
#pragma unroll
            for (int kc = 0; kc < NKC; kc++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    dg_wgmma_n<KT, false>(d, dg_wgmma_desc_add(qd, kc * 64 * 128 + 32 * kk),
                                          dg_wgmma_desc_add(kd, kc * KT * 128 + 32 * kk),
                                          kc > 0 || kk > 0);
        };
        auto pv_issue = [&](const uint32_t(&a)[KT / 16][4], uint32_t i) {
            const uint64_t vd0 = dg_wgmma_desc_n(vbase + (i % SV) * WS_T_BYTES, KT * 128);
            float(&od)[HD / 2] = *reinterpret_cast<float(*)[HD / 2]>(&o[0][0]);
#pragma unroll
            for (int k = 0; k < KT / 16; k++)
                dg_wgmma_m64n256_rt(od, a[k], dg_wgmma_desc_add(vd0, k * 16 * 128));
        };
        /* (tc_softmax, tc_pack_p, tc_rescale: attention-tc-parts.cuh) */
        auto softmax = [&](float(&sc)[KT / 8][4], int64_t kt, float(&alpha)[2]) {
            tc_softmax<KT>(sc, kt, j1, sq.k_start, s, rseq, rpos, mask, window, tig, m, l, alpha);
        };
        auto pack_p = [&](const float(&sc)[KT / 8][4], uint32_t(&a)[KT / 16][4]) {
            tc_pack_p<KT>(sc, a);
        };
        auto rescale = [&](const float(&alpha)[2]) { tc_rescale<HD>(o, alpha); };
        if (ntiles == 0)
            return;
        uint32_t p[KT / 16][4]; /* P_{i-1}: PV's A fragments */
        float alpha[2];              /* alpha_{i-1} */
        {
            float d[KT / 2], sc[KT / 8][4];
            wait_k(n);
            dg_wgmma_fence();
            qk_issue(d, n);
            dg_wgmma_commit();
            dg_wgmma_wait<0>();
            dg_wgmma_operand_fence(d);
            release_k(n);
#pragma unroll
            for (int i = 0; i < KT / 2; i++)
                sc[i / 4][i % 4] = d[i];
            softmax(sc, j0, alpha);
            pack_p(sc, p);
        }
        for (int64_t it = 1; it < ntiles; it++) {
            const uint32_t i = n + (uint32_t)it;
            float d[KT / 2], sc[KT / 8][4];
            wait_k(i);
            wait_v(i - 1);
            rescale(alpha);
            dg_wgmma_fence();
            qk_issue(d, i);
            dg_wgmma_commit();
            dg_wgmma_fence();
            pv_issue(p, i - 1);
            dg_wgmma_commit();
            dg_wgmma_wait<1>(); /* S_i */
            dg_wgmma_operand_fence(d);
            release_k(i);
#pragma unroll
            for (int k = 0; k < KT / 2; k++)
                sc[k / 4][k % 4] = d[k];
            softmax(sc, j0 + it * KT, alpha); /* (while P V runs) */
            dg_wgmma_wait<0>();                    /* P_{i-1} V_{i-1} */
            dg_wgmma_operand_fence(reinterpret_cast<float(&)[HD / 2]>(o[0][0]));
            release_v(i - 1);
            pack_p(sc, p);
        }
        {
            const uint32_t i = n + (uint32_t)ntiles - 1;
            rescale(alpha);
            wait_v(i);
            dg_wgmma_fence();
            pv_issue(p, i);
            dg_wgmma_commit();
            dg_wgmma_wait<0>();
            dg_wgmma_operand_fence(reinterpret_cast<float(&)[HD / 2]>(o[0][0]));
            release_v(i);
        }
        n += (uint32_t)ntiles;
    });

    tc_store_rows<HD>(out, part, o, m, l, wg * 64 + warp * 16 + gid, rb, t_lo, g, c, nh, Tq,
                      HD, tig * 2, split, splits);
}

/* its dynamic shared memory: Q, the K and V rings, their barriers, the
 * tile's tokens, and room to align to 1,024 */
static size_t ws_shared(void)
{
    return 2 * (size_t)WS_Q_BYTES + (size_t)(WS_SK + WS_SV) * (WS_T_BYTES + 16) +
           (sizeof(int64_t) + sizeof(int32_t)) * WS_ROWS + 1024;
}

int64_t dg_attn_ws_blocks(int64_t Tq, int nh, int nkv)
{
    return (Tq * (nh / nkv) + WS_ROWS - 1) / WS_ROWS * nkv;
}

int64_t dg_attn_ws_slots(void)
{
    return tc_slots_of(attention_ws_kernel, WS_THREADS, ws_shared());
}

int dg_attn_ws_launch(__nv_bfloat16 *out, float *part, size_t part_bytes,
                      const __nv_bfloat16 *q, const int64_t *q_pos, const int32_t *q_seq,
                      int64_t Tq, const struct dg_attn_seq *seqs, int nh, int nkv, int mask,
                      int window, cudaStream_t st, int dev, struct dg_error *err)
{
    const size_t shared = ws_shared();
    const int g = nh / nkv;
    const int splits =
        part ? dg_attn_tc_splits_of(dg_attn_ws_blocks(Tq, nh, nkv), Tq, nh, WS_HD, part_bytes,
                                    dg_attn_ws_slots())
             : 1;
    const dim3 grid((unsigned)((Tq * g + WS_ROWS - 1) / WS_ROWS), (unsigned)nkv,
                    (unsigned)splits);
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(attention_ws_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    attention_ws_kernel<<<grid, WS_THREADS, shared, st>>>(out, part, q, q_pos, q_seq, Tq, seqs,
                                                          nh, nkv, mask, window, splits);
    DG_LAUNCH_CHECK();
    if (splits > 1)
        return dg_attn_tc_fold(out, part, Tq * nh, WS_HD, splits, st, dev, err);
out:
    return rc;
}

