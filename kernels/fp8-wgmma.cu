/* fp8-wgmma.cu - fp8-gemm.h's W8A8 product on Hopper's warpgroup products
 * (reference: dg_ref_fp8_linear in lib/ref-fp8.c):
 *
 *   Y[r, n] = sa[r] * sw_j[n] * sum_k Q[r, k] * QW_j[n, k]   (or Y += that)
 *
 * As moe-wgmma.cu does for bf16: a block of one warpgroup takes 64 of
 * group j's weight rows (wgmma's A, M = 64) against NT of its rows (B, N
 * = NT: 32, 64 or 128), K in steps of 128 bytes (128 values: one
 * 128-byte swizzled row, four m64nNk32 products) through an ST-stage
 * cp.async pipeline; bytes past K (a multiple of 16) load as zeros in both
 * tiles; rows past the pass's count are not loaded and not stored.  One
 * group of all rows (offsets NULL: a projection) spreads its passes over
 * grid.z as fp8-gemm.cu's kernel does.  The tensor cores add E4M3
 * products into an accumulator of about 13 fraction bits (t-kernels-fp8's
 * LT_F32_BOUND says more), so each step's four products start from zero
 * and their sum is added into fp32 registers, as cuBLASLt does; then
 * times sa and sw in fp8-gemm.cu's order.  Relative error about 1e-4
 * against the exact sum, not mma.sync's 1e-6.  The experts' one launch
 * takes two warpgroups a block from 17 rows an expert on, in passes of
 * 64 rows (WGS = 2, as moe-wgmma.cu): 128 weight rows against the same
 * staged rows, each output the same products in the same order, so the
 * same bytes. */
#include "kernels/fp8-wgmma.h"

#include <cuda_bf16.h>

#include "kernels/block-sync.cuh"
#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-quant.cuh"
#include "kernels/wgmma.cuh"
#include "lib/moe-plan.h"

#define FW_BM 64  /* weight rows a block */
#define FW_BK 128 /* K bytes a stage */

/* One block's work: the bx-th 64 WGS of group j's weight rows (QW_j,
 * SW_j) against the group's rows row0 .. row0 + count - 1, the passes of
 * NT rows pz, pz + nz, ... (a projection's passes spread over grid.z);
 * 128 WGS threads (WGS warpgroups, warpgroup w the block's weight rows 64
 * w .. 64 w + 63, as moe-wgmma.cu's tile_rows); smem: ST stages of [64
 * WGS weight rows][128 B] then [NT rows][128 B], swizzled, at shared
 * address base (1,024-aligned) */
template <int NT, int ST, int WGS, typename Out>
__device__ static void fp8_tile(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW,
                                const float *SW, int64_t row0, int64_t count, int bx, int j,
                                int64_t N, int64_t K, int accumulate, int pz, int nz,
                                unsigned char *smem, uint32_t base)
{
    constexpr int BM = FW_BM * WGS, WB = BM * 128, STAGE = WB + NT * 128, THREADS = 128 * WGS;
    const int wgi = WGS > 1 ? (int)threadIdx.x >> 7 : 0;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t n0 = (int64_t)bx * BM;
    const uint8_t *Wj = QW + (int64_t)j * N * K + n0 * K;
    const float *SWj = SW + (int64_t)j * N;
    const int ksteps = (int)((K + FW_BK - 1) / FW_BK);

    for (int64_t p0 = (int64_t)pz * NT; p0 < count; p0 += (int64_t)nz * NT) {
        const int rows = (int)min((int64_t)NT, count - p0);
        const uint8_t *Xp = QA + (row0 + p0) * K;
        float d[NT / 2], acc[NT / 2];
        /* stage s <- k step ks (chunks past K as zeros) */
        auto load = [&](int s, int ks) {
            unsigned char *ws = smem + s * STAGE, *xs = ws + WB;
            const int64_t k0 = (int64_t)ks * FW_BK;
            for (int i = threadIdx.x; i < BM * 8; i += THREADS) {
                const int r = i >> 3, c = i & 7;
                const int in_k = k0 + c * 16 < K;
                dg_cp16(ws + dg_swz128(r, c), Wj + (int64_t)r * K + (in_k ? k0 + c * 16 : 0),
                        in_k);
            }
            for (int i = threadIdx.x; i < rows * 8; i += THREADS) {
                const int r = i >> 3, c = i & 7;
                const int in_k = k0 + c * 16 < K;
                dg_cp16(xs + dg_swz128(r, c), Xp + (int64_t)r * K + (in_k ? k0 + c * 16 : 0),
                        in_k);
            }
        };
#pragma unroll
        for (int e = 0; e < NT / 2; e++)
            d[e] = acc[e] = 0.0f;
        dg_wgmma_kloop<ST>(
            ksteps, load,
            [&](int s, int) {
                const uint32_t wa = base + (uint32_t)(s * STAGE + wgi * FW_BM * 128),
                               xa = base + (uint32_t)(s * STAGE + WB);
#pragma unroll
                for (int kk = 0; kk < FW_BK / 32; kk++)
                    dg_wgmma_n<NT, true>(d, dg_wgmma_desc(wa + 32 * kk),
                                          dg_wgmma_desc(xa + 32 * kk), kk > 0);
            },
            /* the step's sum into fp32 (the tensor cores add E4M3
             * products into about 13 fraction bits) */
            [&](int) {
#pragma unroll
                for (int e = 0; e < NT / 2; e++)
                    acc[e] += d[e];
            });
        /* d[4c + e]: the warpgroup's weight row 16 warp + gid + 8 (e / 2),
         * pass row 8c + 2 tig + e % 2 */
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int64_t col = n0 + FW_BM * wgi + 16 * warp + gid + 8 * e2;
            const float w = SWj[col];
#pragma unroll
            for (int c = 0; c < NT / 8; c++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int r = 8 * c + 2 * tig + u;
                    if (r < rows) {
                        Out *y = Y + (row0 + p0 + r) * N + col;
                        float v = acc[4 * c + 2 * e2 + u] * SA[row0 + p0 + r] * w;
                        if (accumulate)
                            v += dg_ld(y);
                        dg_st(y, v);
                    }
                }
        }
    }
}

/* grid (N / 64, groups, z), 128 threads (one warpgroup): block (x, j, z)
 * takes group j's weight rows 64 x on, passes z, z + gridDim.z, ... */
template <int NT, int ST, typename Out>
__global__ static void __launch_bounds__(128)
    fp8_wgmma_kernel(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW,
                     const float *SW, const int32_t *offsets, const int32_t *counts,
                     int64_t rows_all, int64_t N, int64_t K, int accumulate)
{
    uint32_t base;
    unsigned char *smem = dg_wgmma_stages(&base);
    const int j = blockIdx.y;
    fp8_tile<NT, ST, 1>(Y, QA, SA, QW, SW, offsets ? offsets[j] : 0, offsets ? counts[j] : rows_all,
                     (int)blockIdx.x, j, N, K, accumulate, (int)blockIdx.z, (int)gridDim.z, smem,
                     base);
}

/* Both of the FP8 experts' products in one launch
 * (dg_cuda_fp8_experts_wgmma), as moe-wgmma.cu's experts_wgmma_kernel
 * takes the bf16 ones: tickets (sync[0]) 0 .. nb1 groups - 1 are the
 * gate/up tiles (nb1 = 2I / BM a group, BM = 64 WGS weight rows a tile:
 * gu = the bf16 [gate | up] rows), the rest the down tiles (nb2 = H / BM
 * a group: ys, fp32).  A gate/up
 * tile, once stored, counts itself in sync[1 + j]; the one that brings
 * the count to nb1 (the group's last) quantizes the group's hidden rows,
 * gelu_tanh(gate) * up, a warp a row, into q2 and qs2 (the bytes
 * dg_cuda_fp8_quantize_rows_at with gelu gives) and then sets sync[1 +
 * groups + j]; a down tile of group j waits for that.  Every block a down
 * tile waits on holds an earlier ticket, so it is running or done.
 *
 * nz > 1 splits every tile's passes over nz blocks (block z of a tile the
 * passes z, z + nz, ...; its tickets adjacent, so the nz blocks of one
 * weight tile run together and read its bytes from the DRAM about once:
 * one block walking every pass re-reads the tile, 360 KB of gate/up or
 * 90 KB of down at the 26B-A4B's shapes, once a pass, and the tiles of
 * the blocks a GPU holds are past its L2).  A
 * group's gate/up is done when all nb1 nz of its blocks are.  Each output
 * is the same products in the same order whatever nz is: the same bytes. */
template <int NT, int ST, int WGS, typename YOut>
/* (the blocks a multiprocessor holds: at 32 rows a pass 6, as many as
 * the stages' shared memory allows, in 78 registers without spills where
 * 5 took 92 (run 155, batch 1: a layer's launch 211 -> 204 us, the FP8
 * denoise 11.71, 11.68 -> 11.45, 11.39 ms); with two warpgroups at 64
 * rows a pass 3, as the shared memory allows, in 80 registers (8 bytes
 * spilled) where 2 took 127 (run 156: FP8 batch 4 27.26, 27.49
 * -> 26.81, 26.88 ms, batch 16 97.11, 97.36 -> 96.71, 96.90; two
 * warpgroups at 32 rows a pass, batch 1, no faster than one: 11.76, 11.81
 * against 11.73, 11.78); one warpgroup at 64 and 128 as for the product
 * alone) */
__global__ static void __launch_bounds__(128 * WGS, WGS == 2 ? (NT == 64 ? 3 : 2)
                                                             : NT == 32 ? 6 : NT == 64 ? 4 : 2)
    fp8_experts_kernel(__nv_bfloat16 *gu, uint8_t *q2, float *qs2, YOut *ys, const uint8_t *q,
                       const float *qs, const uint8_t *W_gu, const float *S_gu,
                       const uint8_t *W_down, const float *S_down, const int32_t *offsets,
                       const int32_t *counts, int32_t *sync, int groups, int64_t I, int64_t H,
                       int nz)
{
    uint32_t base;
    unsigned char *smem = dg_wgmma_stages(&base);
    /* a word after the stages, in the alignment's slack (the dynamic
     * memory starts 16-aligned: at most 1,008 of the 1,024 spare bytes
     * lie before base) */
    int *s_word = (int *)(smem + ST * (FW_BM * WGS + NT) * 128);
    const int nb1 = (int)(2 * I / (FW_BM * WGS)), nb2 = (int)(H / (FW_BM * WGS));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31; /* (warp: of the block) */
    const int t = dg_block_ticket(&sync[0], s_word);
    if (t < nb1 * nz * groups) {
        const int j = t / (nb1 * nz), tz = t % (nb1 * nz), count = counts[j];
        const int64_t row0 = offsets[j];
        fp8_tile<NT, ST, WGS>(gu, q, qs, W_gu, S_gu, row0, count, tz / nz, j, 2 * I, H, 0,
                              tz % nz, nz, smem, base);
        if (dg_block_done(&sync[1 + j], s_word) != nb1 * nz - 1)
            return;
        /* the group's last gate/up tile: its hidden rows, read through
         * the L2 (the other tiles' columns) */
        for (int r = warp; r < count; r += 4 * WGS)
            dg_fp8_quantize_row_warp<__nv_bfloat16, 1, true>(
                q2 + (row0 + r) * I, qs2 + row0 + r, gu + (row0 + r) * 2 * I, (int)I, lane);
        dg_block_release(&sync[1 + groups + j]);
    } else {
        const int u = t - nb1 * nz * groups, j = u / (nb2 * nz), uz = u % (nb2 * nz);
        const int count = counts[j];
        if ((int64_t)(uz % nz) * NT >= count) /* no pass of this block's */
            return;
        dg_block_wait(&sync[1 + groups + j], 1);
        fp8_tile<NT, ST, WGS>(ys, q2, qs2, W_down, S_down, offsets[j], count, uz / nz, j, H, I, 0,
                              uz % nz, nz, smem, base);
    }
}

template <int NT, typename Out>
static int launch(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW, const float *SW,
                  const int32_t *offsets, const int32_t *counts, int groups, int64_t rows_all,
                  int64_t N, int64_t K, int accumulate, cudaStream_t st, int dev,
                  struct dg_error *err)
{
    /* 3 stages, as the bf16 kernel.  Run 96 measured 3 against 4 only with
     * 128-row passes at batch 4 (FP8 denoise 36.6 against 36.3 ms); with
     * the 64-row passes now taken there only 3 (34.3 ms) */
    constexpr int ST = 3;
    const size_t shared = (size_t)ST * (FW_BM + NT) * 128 + 1024;
    auto kernel = fp8_wgmma_kernel<NT, ST, Out>;
    /* one group: its passes over z, enough blocks for about two waves of
     * 132 SMs (as fp8-gemm.cu) */
    const int64_t passes = (rows_all + NT - 1) / NT, nb = N / FW_BM;
    const unsigned z = offsets ? 1u
                               : (unsigned)(passes < 1 ? 1
                                            : passes < (264 + nb - 1) / nb ? passes
                                            : (264 + nb - 1) / nb);
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
    kernel<<<dim3((unsigned)nb, (unsigned)groups, z), 128, shared, st>>>(
        Y, QA, SA, QW, SW, offsets, counts, rows_all, N, K, accumulate);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* Rows a pass by the rows an expert gets (rows_hint): 128 only past 64.
 * A 128-row pass keeps two accumulator sets of 64 floats a thread, which
 * leaves room for two blocks a multiprocessor; at 64 rows an expert
 * (batch 4) 64-row passes took the FP8 batch-4 denoise from 36.3 to 34.3
 * ms (run 96, with 3 stages). */
template <typename Out>
static int pick(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW, const float *SW,
                const int32_t *offsets, const int32_t *counts, int groups, int64_t rows_all,
                int64_t N, int64_t K, int rows_hint, int accumulate, cudaStream_t st, int dev,
                struct dg_error *err)
{
    if (rows_hint > 64)
        return launch<128>(Y, QA, SA, QW, SW, offsets, counts, groups, rows_all, N, K,
                           accumulate, st, dev, err);
    if (rows_hint > 16)
        return launch<64>(Y, QA, SA, QW, SW, offsets, counts, groups, rows_all, N, K, accumulate,
                          st, dev, err);
    return launch<32>(Y, QA, SA, QW, SW, offsets, counts, groups, rows_all, N, K, accumulate, st,
                      dev, err);
}

/* both products in one launch, NT rows a pass, WGS warpgroups a block
 * (fp8_experts_kernel; 2 only where 2I and H are multiples of 128), ys
 * of type YOut; each tile's passes split over the blocks
 * dg_moe_plan_split gives for rows_hint (lib/moe-plan.h) */
template <int NT, int WGS, typename YOut>
static int launch_experts(__nv_bfloat16 *gu, uint8_t *q2, float *qs2, YOut *ys, const uint8_t *q,
                          const float *qs, const uint8_t *W_gu, const float *S_gu,
                          const uint8_t *W_down, const float *S_down, const int32_t *offsets,
                          const int32_t *counts, int32_t *sync, int groups, int64_t I, int64_t H,
                          int rows_hint, cudaStream_t st, int dev, struct dg_error *err)
{
    constexpr int ST = 3; /* as launch's */
    constexpr int BM = FW_BM * WGS;
    const size_t shared = (size_t)ST * (BM + NT) * 128 + 1024;
    const int64_t tiles = (2 * I / BM + H / BM) * (int64_t)groups;
    const int nz = dg_moe_plan_split(rows_hint, NT, tiles);
    const int64_t blocks = tiles * nz;
    auto kernel = fp8_experts_kernel<NT, ST, WGS, YOut>;
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
    kernel<<<(unsigned)blocks, 128 * WGS, shared, st>>>(gu, q2, qs2, ys, q, qs, W_gu, S_gu,
                                                         W_down, S_down, offsets, counts, sync,
                                                         groups, I, H, nz);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_fp8_experts_wgmma_fits(int dev, int64_t I, int64_t H)
{
    /* the hidden rows a warp quantizes: at most 8 x 32 x DG_FQ_CHUNKS */
    return dg_cuda_fp8_wgmma_fits(dev, 2 * I, H) && dg_cuda_fp8_wgmma_fits(dev, H, I) &&
           I % 64 == 0 && H % 64 == 0 && I <= 8 * 32 * DG_FQ_CHUNKS &&
           (2 * I / FW_BM + H / FW_BM) * 65535 <= 0x7fffffff;
}

/* the launch by the rows a pass and the widths, ys of type YOut */
template <typename YOut>
static int experts_pick(__nv_bfloat16 *g, uint8_t *q2, float *qs2, YOut *ys, const uint8_t *q,
                        const float *qs, const uint8_t *W_gu, const float *S_gu,
                        const uint8_t *W_down, const float *S_down, const int32_t *offsets,
                        const int32_t *counts, int32_t *sync, int groups, int64_t I, int64_t H,
                        int rows_hint, cudaStream_t st, int dev, struct dg_error *err)
{
    /* from 17 rows an expert on, passes of 64 rows with two warpgroups a
     * block where the widths allow (the rows' tile read once for 128
     * weight rows, as moe-wgmma.cu; run 149, batch 4: 27.63, 27.72 ->
     * 27.30, 27.28 ms), more rows an expert taking more passes, split
     * over as many blocks (dg_moe_plan_split; run 290, FP8 step at batch 8
     * 54.08, 53.99 -> 50.26, 50.04 ms, 16 101.92, 102.08 -> 94.74, 94.60,
     * 32 199.41, 198.21 -> 182.15, 180.88), as many as the fullest
     * expert's passes (runs 299-300: at batch 4, 64 rows an expert on
     * average, the experts past 64 had run their second pass in the same
     * block; the step 29.60-29.67 -> 27.45-27.72 ms, a layer's experts
     * 0.490 -> 0.407 ms; batch 1 level).  Not
     * passes of 128: there the two accumulator sets leave room for one
     * such block a multiprocessor, not two of one warpgroup (run 149,
     * batch 16: 102.79, 102.40 -> 103.19, 103.29 ms), and passes of 64
     * with two warpgroups beat one warpgroup's passes of 128 (run 151,
     * batch 16: 100.59, 100.98 -> 96.94, 96.83 ms) */
    if (rows_hint <= 16)
        return launch_experts<32, 1>(g, q2, qs2, ys, q, qs, W_gu, S_gu, W_down, S_down, offsets,
                                     counts, sync, groups, I, H, rows_hint, st, dev, err);
    if (H % 128 == 0)
        return launch_experts<64, 2>(g, q2, qs2, ys, q, qs, W_gu, S_gu, W_down, S_down, offsets,
                                     counts, sync, groups, I, H, rows_hint, st, dev, err);
    /* (H an odd multiple of 64: one warpgroup a block) */
    if (rows_hint > 64)
        return launch_experts<128, 1>(g, q2, qs2, ys, q, qs, W_gu, S_gu, W_down, S_down, offsets,
                                      counts, sync, groups, I, H, rows_hint, st, dev, err);
    return launch_experts<64, 1>(g, q2, qs2, ys, q, qs, W_gu, S_gu, W_down, S_down, offsets,
                                 counts, sync, groups, I, H, rows_hint, st, dev, err);
}

extern "C" int dg_cuda_fp8_experts_wgmma(void *gu, uint8_t *q2, float *qs2, void *ys, int ys_f32,
                                         const uint8_t *q, const float *qs, const uint8_t *W_gu,
                                         const float *S_gu, const uint8_t *W_down,
                                         const float *S_down, const int32_t *offsets,
                                         const int32_t *counts, int32_t *sync, int groups,
                                         int64_t I, int64_t H, int rows_hint, dg_stream_t stream,
                                         int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    __nv_bfloat16 *g = (__nv_bfloat16 *)gu;
    if (!dg_cuda_fp8_experts_wgmma_fits(dev, I, H) || groups < 0 || groups > 65535 || !sync)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: FP8 experts' wgmma: %d experts of [2 x "
                            "%lld x %lld] and [%lld x %lld] (widths multiples of 64, the hidden "
                            "one at most %d, a device of compute capability 9.0)", dev, groups,
                            (long long)I, (long long)H, (long long)H, (long long)I,
                            8 * 32 * DG_FQ_CHUNKS);
    if (groups == 0)
        return 0;
    if (ys_f32)
        return experts_pick(g, q2, qs2, (float *)ys, q, qs, W_gu, S_gu, W_down, S_down, offsets,
                            counts, sync, groups, I, H, rows_hint, st, dev, err);
    return experts_pick(g, q2, qs2, (__nv_bfloat16 *)ys, q, qs, W_gu, S_gu, W_down, S_down,
                        offsets, counts, sync, groups, I, H, rows_hint, st, dev, err);
}

extern "C" int dg_cuda_fp8_wgmma_fits(int dev, int64_t N, int64_t K)
{
    return N > 0 && K > 0 && N % FW_BM == 0 && K % 16 == 0 && N / FW_BM <= 0x7fffffff &&
           dg_wgmma_device(dev);
}

extern "C" int dg_cuda_fp8_wgmma(void *Y, int y_f32, int accumulate, const uint8_t *qa,
                                 const float *sa, const uint8_t *qw, const float *sw,
                                 const int32_t *offsets, const int32_t *counts, int groups,
                                 int64_t rows, int64_t N, int64_t K, int rows_hint,
                                 dg_stream_t stream, int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    if (!dg_cuda_fp8_wgmma_fits(dev, N, K) || groups < 1 || groups > 65535 ||
        (!offsets && (groups != 1 || rows < 0)) || (!offsets != !counts))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: fp8 wgmma: %d group(s) of [%lld x %lld] "
                            "(N a multiple of 64, K of 16, a device of compute capability 9.0)",
                            dev, groups, (long long)N, (long long)K);
    if (!offsets && rows == 0)
        return 0;
    if (y_f32)
        return pick((float *)Y, qa, sa, qw, sw, offsets, counts, groups, rows, N, K, rows_hint,
                    !!accumulate, st, dev, err);
    return pick((__nv_bfloat16 *)Y, qa, sa, qw, sw, offsets, counts, groups, rows, N, K,
                rows_hint, !!accumulate, st, dev, err);
}
