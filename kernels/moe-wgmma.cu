/* moe-wgmma.cu - the experts' grouped GEMM (moe-gemm.h's function) on
 * Hopper's warpgroup products: a block of one warpgroup computes 64 of
 * group j's weight rows against NT of its rows at a time, with the
 * weights as wgmma's A (M = 64) and the rows as its B (N = NT: 32, 64 or
 * 128), so that a few rows an expert waste no product:
 *
 *   Y[r, n0 + m] = sum_k W_j[n0 + m, k] X[r, k]      (the accumulators hold Y^T)
 *
 * K in steps of 64 through an ST-stage cp.async pipeline into 128-byte
 * swizzled tiles (wgmma.cuh); the four k16 products of a step issued
 * together, waited for before the stage is refilled.  From 64 rows a
 * pass on, a block holds two warpgroups over 128 weight rows (WGS = 2),
 * each its own 64 against the same staged rows: the rows' tile, which
 * at many rows an expert outweighs the weights' in the loads, is read
 * once for 128 weight rows instead of once for 64 (each output's sum the
 * same products in the same order: the same bits as one warpgroup).
 * Runs 149-150, bf16 batch-4 denoise: 35.3-35.5 -> 33.5-33.8 ms.  The
 * gated form (GATED) loads the block's weight rows as moe-gemm.cu's does (runs of
 * 8 gate rows, then the up rows of the same i), so a thread's accumulator
 * rows gid and gid + 8 are one i's gate and up sums: Y[r, i] =
 * gelu_tanh(rnd(g)) rnd(u), with rnd as in moe-gemm.cu.  fp32
 * accumulation; the products add in the tensor cores' order, not
 * mma.sync's (the same function, not the same bits as the other
 * configurations). */
#include "kernels/moe-wgmma.h"

#include <cuda_bf16.h>

#include "kernels/block-sync.cuh"
#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/wgmma.cuh"
#include "lib/moe-plan.h"

#define WG_BM 64  /* weight rows a block */
#define WG_BK 64  /* K a stage: one 128-byte swizzled row */

/* One block's work: 64 WGS of group j's weight rows, the bx-th 64 WGS
 * (GATED: the gate and up rows of Y's columns 32 WGS bx .. 32 WGS (bx +
 * 1) - 1), against the group's rows, NT at a time: the passes z, z + nz,
 * ... (all of them where nz is 1); 128 WGS threads
 * (WGS warpgroups, warpgroup w the block's weight rows 64 w .. 64 w + 63);
 * smem: ST stages of [64 WGS weight rows][128 B] then [NT rows][128 B],
 * swizzled, at shared address base (1,024-aligned) */
template <int NT, int ST, bool GATED, int WGS, typename Out>
__device__ static void tile_rows(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                                 int64_t row0, int count, int bx, int j, int64_t N,
                                 int64_t K, int z, int nz, unsigned char *smem, uint32_t base)
{
    constexpr int BM = WG_BM * WGS, WB = BM * 128, STAGE = WB + NT * 128, THREADS = 128 * WGS;
    const int wgi = WGS > 1 ? (int)threadIdx.x >> 7 : 0;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t I = N / 2;
    /* the block's first weight row (GATED: first gate row, = Y's column) */
    const int64_t n0 = (int64_t)bx * (GATED ? BM / 2 : BM);
    const __nv_bfloat16 *Wj = W + (int64_t)j * N * K + n0 * K;
    const int ksteps = (int)(K / WG_BK);

    for (int p0 = z * NT; p0 < count; p0 += nz * NT) {
        const int rows = min(NT, count - p0);
        const __nv_bfloat16 *Xp = X + (row0 + p0) * K;
        float d[NT / 2];
        /* stage s <- k step ks: 64 WGS weight rows, the pass's rows
         * (those past `rows` not loaded: their outputs are not stored) */
        auto load = [&](int s, int ks) {
            unsigned char *ws = smem + s * STAGE, *xs = ws + WB;
            const int64_t k0 = (int64_t)ks * WG_BK;
            for (int i = threadIdx.x; i < BM * 8; i += THREADS) {
                const int r = i >> 3, c = i & 7;
                const int64_t wr = GATED ? (r >> 4) * 8 + (r & 7) + ((r >> 3) & 1) * I : r;
                dg_cp16(ws + dg_swz128(r, c), Wj + wr * K + k0 + c * 8, 1);
            }
            for (int i = threadIdx.x; i < rows * 8; i += THREADS) {
                const int r = i >> 3, c = i & 7;
                dg_cp16(xs + dg_swz128(r, c), Xp + (int64_t)r * K + k0 + c * 8, 1);
            }
        };
#pragma unroll
        for (int e = 0; e < NT / 2; e++)
            d[e] = 0.0f;
        dg_wgmma_kloop<ST>(
            ksteps, load,
            [&](int s, int ks) {
                const uint32_t wa = base + (uint32_t)(s * STAGE + wgi * WG_BM * 128),
                               xa = base + (uint32_t)(s * STAGE + WB);
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    dg_wgmma_n<NT, false>(d, dg_wgmma_desc(wa + 32 * kk),
                                           dg_wgmma_desc(xa + 32 * kk), ks > 0 || kk > 0);
            },
            [](int) {});
        /* d[4c + e]: the warpgroup's weight row 16 warp + gid + 8 (e / 2),
         * pass row 8c + 2 tig + e % 2 */
        if constexpr (GATED) {
            const int64_t col = n0 + WG_BM / 2 * wgi + 8 * warp + gid;
#pragma unroll
            for (int c = 0; c < NT / 8; c++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int r = 8 * c + 2 * tig + u;
                    if (r < rows)
                        dg_st(Y + (row0 + p0 + r) * I + col,
                              dg_gelu_tanh_f(dg_round_as(Y, d[4 * c + u])) *
                                  dg_round_as(Y, d[4 * c + 2 + u]));
                }
        } else {
#pragma unroll
            for (int c = 0; c < NT / 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 8 * c + 2 * tig + (e & 1);
                    if (r < rows)
                        dg_st(Y + (row0 + p0 + r) * N + n0 + WG_BM * wgi + 16 * warp + gid +
                                      8 * (e >> 1),
                              d[4 * c + e]);
                }
        }
    }
}

/* grid (N / (64 WGS), groups), 128 WGS threads: block (x, j) takes group
 * j's weight rows 64 WGS x on (GATED: Y's columns 32 WGS x on) */
template <int NT, int ST, bool GATED, int WGS, typename Out>
__global__ static void __launch_bounds__(128 * WGS, WGS == 2 ? 2 : 1)
    grouped_wgmma_kernel(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                         const int32_t *offsets, const int32_t *counts, int64_t N, int64_t K)
{
    uint32_t base;
    unsigned char *smem = dg_wgmma_stages(&base);
    const int j = blockIdx.y;
    tile_rows<NT, ST, GATED, WGS>(Y, X, W, offsets[j], counts[j], (int)blockIdx.x, j, N, K, 0, 1,
                                  smem, base);
}

/* warpgroups a block at NT rows a pass: two from 64 rows on (see the top) */
template <int NT>
struct wgs_of {
    static constexpr int value = NT >= 64 ? 2 : 1;
};

/* Both of the experts' products in one launch (dg_cuda_experts_wgmma):
 * nb1 = 2I / BM gated tiles a group, then nb2 = H / BM down tiles a
 * group (BM = 64 WGS weight rows a tile).  A block takes the next
 * ticket (sync[0]; block-sync.cuh) and with it its tile: tickets 0 ..
 * nb1 groups - 1 the gated tiles, group by group, then the down tiles
 * likewise.  A gated tile, once stored, counts itself done in
 * sync[1 + j]; a down tile of group j first waits until all nb1 of
 * group j's gated tiles are (it reads all of their columns).  A ticket is
 * taken by a block already running, so every tile a down tile waits for
 * belongs to a block that is running or done: no block waits on one not
 * yet placed, whatever order the hardware places blocks in.  The gated
 * tiles' tail on the multiprocessors is filled with down tiles of the
 * groups already done.
 *
 * nz > 1 splits every tile's passes over nz blocks (block z of a tile the
 * passes z, z + nz, ...; their tickets adjacent, so the nz blocks of one
 * weight tile run together and read it from the DRAM about once), as
 * fp8-wgmma.cu's one launch does: a group's gated tiles are done when all
 * nb1 nz of their blocks are, and a down block with no pass returns
 * before waiting.  Each output is the same products in the same order
 * whatever nz is: the same bits. */
template <int NT, int ST, int WGS, typename YOut>
/* (the blocks a multiprocessor holds by shared memory, as the two
 * kernels it replaces: left free, ptxas gives it registers for fewer) */
__global__ static void __launch_bounds__(128 * WGS, WGS == 2 ? (NT == 64 ? 3 : 2)
                                                             : NT == 32 ? 6 : NT == 64 ? 4 : 3)
    experts_wgmma_kernel(__nv_bfloat16 *hh, YOut *ys, const __nv_bfloat16 *xs,
                         const __nv_bfloat16 *W_gu, const __nv_bfloat16 *W_down,
                         const int32_t *offsets, const int32_t *counts, int32_t *sync,
                         const int32_t *active, int groups, int64_t I, int64_t H, int nz)
{
    uint32_t base;
    if (active && !*active)
        return;
    unsigned char *smem = dg_wgmma_stages(&base);
    /* a word after the stages, in the alignment's slack: the dynamic
     * memory starts 16-aligned, so at most 1,008 of its 1,024 spare bytes
     * lie before base (not one byte more: at 32 rows a pass six blocks
     * fill a multiprocessor's 228 KB exactly) */
    int *s_word = (int *)(smem + ST * (WG_BM * WGS + NT) * 128);
    const int nb1 = (int)(2 * I / (WG_BM * WGS)), nb2 = (int)(H / (WG_BM * WGS));
    const int t = dg_block_ticket(&sync[0], s_word);
    if (t < nb1 * nz * groups) {
        const int j = t / (nb1 * nz), tz = t % (nb1 * nz);
        tile_rows<NT, ST, true, WGS>(hh, xs, W_gu, offsets[j], counts[j], tz / nz, j, 2 * I, H,
                                     tz % nz, nz, smem, base);
        dg_block_done(&sync[1 + j], s_word);
    } else {
        const int u = t - nb1 * nz * groups, j = u / (nb2 * nz), uz = u % (nb2 * nz);
        const int count = counts[j];
        if ((int64_t)(uz % nz) * NT >= count) /* no pass of this block's */
            return;
        /* every column of the group's hidden rows stored */
        dg_block_wait(&sync[1 + j], nb1 * nz);
        tile_rows<NT, ST, false, WGS>(ys, hh, W_down, offsets[j], count, uz / nz, j, H, I,
                                      uz % nz, nz, smem, base);
    }
}

template <int NT, bool GATED, typename Out>
static int launch(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W, const int32_t *offsets,
                  const int32_t *counts, int groups, int64_t N, int64_t K, cudaStream_t st,
                  int dev, struct dg_error *err)
{
    /* 3 stages: at 128 rows a pass 72 KB, three blocks a multiprocessor
     * where 4 stages' 97 KB held two (run 96: bf16 batch-4 denoise 39.7
     * -> 38.3 ms; batch 1 and 16 within noise) */
    constexpr int ST = 3, WGS = wgs_of<NT>::value;
    const size_t shared = (size_t)ST * (WG_BM * WGS + NT) * 128 + 1024;
    auto kernel = grouped_wgmma_kernel<NT, ST, GATED, WGS, Out>;
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
    kernel<<<dim3((unsigned)(N / (WG_BM * WGS)), (unsigned)groups), 128 * WGS, shared, st>>>(
        Y, X, W, offsets, counts, N, K);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

template <bool GATED, typename Out>
static int pick(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W, const int32_t *offsets,
                const int32_t *counts, int groups, int64_t N, int64_t K, int rows_hint,
                cudaStream_t st, int dev, struct dg_error *err)
{
    if (rows_hint > 32)
        return launch<128, GATED>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    if (rows_hint > 16)
        return launch<64, GATED>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    return launch<32, GATED>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
}

/* both products in one launch, NT rows a pass (experts_wgmma_kernel),
 * ys of type YOut; each tile's passes split over the blocks
 * dg_moe_plan_split gives for rows_hint (lib/moe-plan.h): at batch 8,
 * 128 rows an expert on average in passes of 128, the experts past 128
 * had run their second pass after the first in one block (run 303: a
 * layer's experts 0.981, 0.983 -> 0.843, 0.849 ms, the step 62.19, 62.36
 * -> 60.77, 60.74 ms; batch 1, 4 and 16 level) */
template <int NT, typename YOut>
static int launch_experts(__nv_bfloat16 *hh, YOut *ys, const __nv_bfloat16 *xs,
                          const __nv_bfloat16 *W_gu, const __nv_bfloat16 *W_down,
                          const int32_t *offsets, const int32_t *counts, int32_t *sync,
                          const int32_t *active, int groups, int64_t I, int64_t H, int rows_hint,
                          cudaStream_t st, int dev, struct dg_error *err)
{
    constexpr int ST = 3, WGS = wgs_of<NT>::value; /* as launch's */
    constexpr int BM = WG_BM * WGS;
    const size_t shared = (size_t)ST * (BM + NT) * 128 + 1024;
    const int64_t tiles = (2 * I / BM + H / BM) * (int64_t)groups;
    const int nz = dg_moe_plan_split(rows_hint, NT, tiles);
    const int64_t blocks = tiles * nz;
    auto kernel = experts_wgmma_kernel<NT, ST, WGS, YOut>;
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
    kernel<<<(unsigned)blocks, 128 * WGS, shared, st>>>(hh, ys, xs, W_gu, W_down, offsets,
                                                         counts, sync, active, groups, I, H, nz);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_experts_wgmma_fits(int dev, int64_t I, int64_t H)
{
    return dg_cuda_grouped_wgmma_fits(dev, 2 * I, H) && dg_cuda_grouped_wgmma_fits(dev, H, I) &&
           (2 * I / WG_BM + H / WG_BM) * 65535 <= 0x7fffffff;
}

/* the launch by the rows a pass, ys of type YOut */
template <typename YOut>
static int experts_pick(__nv_bfloat16 *h, YOut *ys, const __nv_bfloat16 *x,
                        const __nv_bfloat16 *wg, const __nv_bfloat16 *wd, const int32_t *offsets,
                        const int32_t *counts, int32_t *sync, const int32_t *active, int groups,
                        int64_t I, int64_t H, int rows_hint, cudaStream_t st, int dev,
                        struct dg_error *err)
{
    if (rows_hint > 32)
        return launch_experts<128>(h, ys, x, wg, wd, offsets, counts, sync, active, groups, I, H,
                                   rows_hint, st, dev, err);
    if (rows_hint > 16)
        return launch_experts<64>(h, ys, x, wg, wd, offsets, counts, sync, active, groups, I, H,
                                  rows_hint, st, dev, err);
    return launch_experts<32>(h, ys, x, wg, wd, offsets, counts, sync, active, groups, I, H,
                              rows_hint, st, dev, err);
}

extern "C" int dg_cuda_experts_wgmma(void *hh, void *ys, int ys_f32, const void *xs,
                                     const void *W_gu, const void *W_down,
                                     const int32_t *offsets, const int32_t *counts,
                                     int32_t *sync, const int32_t *active, int groups, int64_t I,
                                     int64_t H, int rows_hint, dg_stream_t stream, int dev,
                                     struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    __nv_bfloat16 *h = (__nv_bfloat16 *)hh;
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)xs, *wg = (const __nv_bfloat16 *)W_gu,
                        *wd = (const __nv_bfloat16 *)W_down;
    if (!dg_cuda_experts_wgmma_fits(dev, I, H) || groups < 0 || groups > 65535 || !sync)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: experts' wgmma: %d experts of [2 x %lld "
                            "x %lld] and [%lld x %lld] (widths multiples of 64 and 128, a "
                            "device of compute capability 9.0)", dev, groups, (long long)I,
                            (long long)H, (long long)H, (long long)I);
    if (groups == 0)
        return 0;
    if (ys_f32)
        return experts_pick(h, (float *)ys, x, wg, wd, offsets, counts, sync, active, groups, I,
                            H, rows_hint, st, dev, err);
    return experts_pick(h, (__nv_bfloat16 *)ys, x, wg, wd, offsets, counts, sync, active, groups,
                        I, H, rows_hint, st, dev, err);
}

extern "C" int dg_cuda_grouped_wgmma_fits(int dev, int64_t N, int64_t K)
{
    return N > 0 && K > 0 && N % (2 * WG_BM) == 0 && K % WG_BK == 0 && N / WG_BM <= 65535 &&
           dg_wgmma_device(dev);
}

extern "C" int dg_cuda_grouped_wgmma(void *Y, int y_f32, int gated, const void *X, const void *W,
                                     const int32_t *offsets, const int32_t *counts, int groups,
                                     int64_t N, int64_t K, int rows_hint, dg_stream_t stream,
                                     int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)X, *w = (const __nv_bfloat16 *)W;
    if (!dg_cuda_grouped_wgmma_fits(dev, N, K) || groups < 0 || groups > 65535)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: grouped wgmma: %d groups of [%lld x %lld] "
                            "(N a multiple of 128, K of 64, a device of compute capability 9.0)",
                            dev, groups, (long long)N, (long long)K);
    if (groups == 0)
        return 0;
    if (gated)
        return y_f32 ? pick<true>((float *)Y, x, w, offsets, counts, groups, N, K, rows_hint, st,
                                  dev, err)
                     : pick<true>((__nv_bfloat16 *)Y, x, w, offsets, counts, groups, N, K,
                                  rows_hint, st, dev, err);
    return y_f32 ? pick<false>((float *)Y, x, w, offsets, counts, groups, N, K, rows_hint, st, dev,
                               err)
                 : pick<false>((__nv_bfloat16 *)Y, x, w, offsets, counts, groups, N, K, rows_hint,
                               st, dev, err);
}
