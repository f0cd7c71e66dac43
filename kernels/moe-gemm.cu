/* moe-gemm.cu - the experts' GEMMs as one grouped GEMM that streams each
 * expert's weights once (see moe-gemm.h; reference: dg_ref_matmul per
 * group).
 *
 * For group j (an expert) with rows r = offsets[j] .. offsets[j] + counts[j] - 1:
 *
 *   Y[r, n] = sum_k X[r, k] W_j[n, k]        W_j = W + j N K  ([N, K] row-major)
 *
 * bf16 X and W, fp32 accumulation (mma.sync m16n8k16), Y bf16 or fp32.
 * Block (n-slice of BN columns, group j; 64 or 128), 4 warps: WM = 1,
 * each warp BN / 4 columns of all the pass's rows, or WM = 2, a 2 x 2 grid
 * of warps, each BN / 2 columns of half the rows (per 16 of K a warp then
 * loads 6 fragments for 16 products where the first loads MT + 1 = 9 at
 * 128 rows: the row fragments are not read by all four warps); it takes
 * the group's rows MT x 16 at a time and, for
 * each, runs over K in steps of BK with an ST-deep cp.async pipeline of
 * the weight tile [BN x BK] and the row tile [MT 16 x BK] (BK and ST:
 * a configuration, moe-gemm.h; the default 64 and 4)
 * (only the m-tiles that hold rows are loaded; rows past the group's
 * count load as zeros and are not stored).  While a group's rows fit one pass
 * (small batches) every weight byte is read once: the kernel runs at the
 * memory's pace, which is what a denoising step at batch 1 is.
 *
 * The gated form (GATED; dg_cuda_grouped_gemm_gelu) takes W_j = [gate_j;
 * up_j] ([2I, K]) and writes the gated MLP's middle directly:
 *
 *   Y[r, i] = gelu_tanh(g) u,   g = rnd(sum_k X[r, k] gate_j[i, k]),
 *                               u = rnd(sum_k X[r, k] up_j[i, k])
 *
 * rnd rounding as Y's type holds a value (what storing [gate | up] and
 * reading it back did), Y rows of I.  A block's 64 weight rows are gate
 * rows i0 + 8 h .. + 7 then up rows of the same i, for h < 4, so a warp's
 * n-tiles 2q and 2q + 1 hold one set of eight i's gate and up sums in the
 * same registers: the epilogue needs no exchange, and the [rows, 2I]
 * intermediate and the separate gelu pass are gone. */
#include "kernels/moe-gemm.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/mma.cuh"
#include "kernels/moe-wgmma.h"

#define GG_BN 64 /* columns a block, unless a configuration says otherwise */

/* The configurations' names (moe-gemm.h), in launch_config's order: K
 * step in elements, pipeline stages, the 2 x 2 warps (WM = 2; where a
 * pass has 4 m-tiles or more), and 128 columns a block (BN; half the
 * blocks, so each group's rows are read by half as many: run 77's ncu has
 * the L2 87% busy in the gate/up product, 253 MB of those re-reads a
 * layer beside 1,015 MB of weights; run 80's bench-moe-gemm: at 16 rows
 * an expert no faster than 64 columns, 0.301 against 0.299 ms, at 64
 * rows 12-14% faster, as fast as the 2 x 2 warps); and Hopper's warpgroup
 * products (moe-wgmma.cu, its own kernel: the default where the device
 * has them).  The shared row stride is BK + 8
 * elements (2 BK + 16 bytes, 16 modulo 128: ldmatrix's eight rows fall in
 * distinct banks). */
static const char *const CONFIGS[] = {"K step 64, 4 stages", "K step 128, 4 stages",
                                      "K step 128, 3 stages", "K step 64, 6 stages",
                                      "K step 64, 4 stages, 2 x 2 warps",
                                      "K step 64, 4 stages, 128 columns",
                                      "wgmma, 64 weight rows a warpgroup (two a block from 64 "
                                      "rows a pass), 3 stages"};
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))
#define WGMMA_CONFIG 6 /* moe-wgmma.cu's kernel */

/* grid (N / BN, groups), 128 threads; MT m-tiles of 16 rows a pass, K
 * in steps of BK through ST stages (K a multiple of 64: with BK 128 the
 * last step may be half, its other half loading as zeros); WM rows of
 * warps (MT / WM m-tiles and BN / (4 / WM) columns each); GATED: N is
 * 2I (gate and up rows), a block BN / 2 of Y's I columns */
template <int MT, int BK, int ST, int WM, bool GATED, typename Out, int BN>
__global__ static void __launch_bounds__(128)
    grouped_gemm_kernel(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                        const int32_t *offsets, const int32_t *counts, int64_t N, int64_t K)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int LD = BK + 8;                   /* shared row stride, elements */
    using G = dg_warp_grid<BN, MT, WM>;
    constexpr int WN = G::WN, WC = G::WC, NW = G::NW, MW = G::MW;
    __nv_bfloat16 *Ws = (__nv_bfloat16 *)smem;   /* [ST][BN][LD] */
    __nv_bfloat16 *Xs = Ws + ST * BN * LD;       /* [ST][MT 16][LD] */
    const int j = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
    /* the block's first column of Y (GATED: also its first gate row) */
    const int64_t n0 = (int64_t)blockIdx.x * (GATED ? BN / 2 : BN);
    const int count = counts[j];
    const int64_t row0 = offsets[j];
    const __nv_bfloat16 *Wj = W + (int64_t)j * N * K + n0 * K;
    const int ksteps = (int)((K + BK - 1) / BK);

    for (int p0 = 0; p0 < count; p0 += MT * 16) {
        const int rows = min(MT * 16, count - p0);
        const __nv_bfloat16 *Xp = X + (row0 + p0) * K;
        const int mrows = (rows + 15) / 16 * 16; /* rows of the m-tiles in use */
        float acc[MW][NW][4];
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int n = 0; n < NW; n++)
                acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

        /* stage s <- k step ks: the weights' tile, the rows of the
         * m-tiles in use (in bytes: 2 a value) */
        auto load = [&](int s, int ks) {
            dg_stage_load<BN, 2 * BK, 2 * LD>(
                (unsigned char *)(Ws + s * BN * LD), (unsigned char *)(Xs + s * MT * 16 * LD),
                (const unsigned char *)Wj, (const unsigned char *)Xp, mrows, rows,
                2 * (int64_t)ks * BK, 2 * K, GATED ? N / 2 : 0);
        };

        dg_cp_kloop<ST>(ksteps, load, [&](int s, int) {
            dg_warp_stage<MW, NW, 2 * BK, 2 * LD>(
                acc, (const unsigned char *)(Ws + s * BN * LD),
                (const unsigned char *)(Xs + s * MT * 16 * LD), wn * WC, wm * MW, rows, lane,
                dg_mma_bf16_op());
        });
        if constexpr (GATED) {
            /* n-tile 2q: the gate sums of Y's columns n0 + (wn WC + 16 q) / 2
             * + 0..7, n-tile 2q + 1 their up sums */
            const int64_t I = N / 2;
#pragma unroll
            for (int m = 0; m < MW; m++)
#pragma unroll
                for (int q = 0; q < NW / 2; q++) {
                    const int r = (wm * MW + m) * 16 + gid;
                    const int64_t col = n0 + (wn * WC) / 2 + q * 8 + tig * 2;
                    float h[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        h[e] = dg_gelu_tanh_f(dg_round_as(Y, acc[m][2 * q][e])) *
                               dg_round_as(Y, acc[m][2 * q + 1][e]);
                    if (r < rows)
                        dg_store2(Y + (row0 + p0 + r) * I + col, h[0], h[1]);
                    if (r + 8 < rows)
                        dg_store2(Y + (row0 + p0 + r + 8) * I + col, h[2], h[3]);
                }
        } else {
#pragma unroll
            for (int m = 0; m < MW; m++)
#pragma unroll
                for (int n = 0; n < NW; n++) {
                    const int r = (wm * MW + m) * 16 + gid;
                    const int64_t col = n0 + wn * WC + n * 8 + tig * 2;
                    if (r < rows)
                        dg_store2(Y + (row0 + p0 + r) * N + col, acc[m][n][0], acc[m][n][1]);
                    if (r + 8 < rows)
                        dg_store2(Y + (row0 + p0 + r + 8) * N + col, acc[m][n][2],
                                  acc[m][n][3]);
                }
        }
    }
}

extern "C" int dg_cuda_grouped_gemm_fits(int64_t N, int64_t K)
{
    return N > 0 && K > 0 && N % 128 == 0 && K % 64 == 0 && N / GG_BN <= 65535;
}

template <int MT, int BK, int ST, int WM, bool GATED = false, int BN = GG_BN, typename Out>
static int launch(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W, const int32_t *offsets,
                  const int32_t *counts, int groups, int64_t N, int64_t K, cudaStream_t st,
                  int dev, struct dg_error *err)
{
    const size_t shared = sizeof(__nv_bfloat16) * ST * (BN + MT * 16) * (BK + 8);
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<MT, BK, ST, WM, GATED, Out, BN>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    grouped_gemm_kernel<MT, BK, ST, WM, GATED, Out, BN>
        <<<dim3((unsigned)(N / BN), (unsigned)groups), 128, shared, st>>>(Y, X, W, offsets,
                                                                         counts, N, K);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* configuration config's kernel (CONFIGS[config]) with MT m-tiles */
template <int MT, typename Out>
static int launch_config(int config, Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                         const int32_t *offsets, const int32_t *counts, int groups, int64_t N,
                         int64_t K, cudaStream_t st, int dev, struct dg_error *err)
{
    switch (config) {
    case 1:
        return launch<MT, 128, 4, 1>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    case 2:
        return launch<MT, 128, 3, 1>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    case 3:
        return launch<MT, 64, 6, 1>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    case 4: /* (2 x 2 warps from 4 m-tiles: at 2 the second row of warps would idle) */
        return launch<MT, 64, 4, (MT >= 4 ? 2 : 1)>(Y, X, W, offsets, counts, groups, N, K, st,
                                                   dev, err);
    case 5: /* 128 columns a block */
        return launch<MT, 64, 4, 1, false, 128>(Y, X, W, offsets, counts, groups, N, K, st, dev,
                                                err);
    default:
        return launch<MT, 64, 4, 1>(Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    }
}

/* the gated form (the default configuration's K step, depth and warps:
 * 2 x 2 of them where a pass has 4 m-tiles or more; a warp's 32 columns
 * are then two runs of 8 gate and 8 up rows, as the epilogue needs) */
template <int MT, typename Out>
static int launch_gated(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                        const int32_t *offsets, const int32_t *counts, int groups, int64_t I,
                        int64_t K, cudaStream_t st, int dev, struct dg_error *err)
{
    return launch<MT, 64, 4, (MT >= 4 ? 2 : 1), true>(Y, X, W, offsets, counts, groups, 2 * I, K,
                                                      st, dev, err);
}

template <typename Out>
static int pick_gated(Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                      const int32_t *offsets, const int32_t *counts, int groups, int64_t I,
                      int64_t K, int rows_hint, cudaStream_t st, int dev, struct dg_error *err)
{
    if (rows_hint > 64)
        return launch_gated<8>(Y, X, W, offsets, counts, groups, I, K, st, dev, err);
    if (rows_hint > 16)
        return launch_gated<4>(Y, X, W, offsets, counts, groups, I, K, st, dev, err);
    return launch_gated<2>(Y, X, W, offsets, counts, groups, I, K, st, dev, err);
}

template <typename Out>
static int pick(int config, Out *Y, const __nv_bfloat16 *X, const __nv_bfloat16 *W,
                const int32_t *offsets, const int32_t *counts, int groups, int64_t N, int64_t K,
                int rows_hint, cudaStream_t st, int dev, struct dg_error *err)
{
    if (rows_hint > 64)
        return launch_config<8>(config, Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    if (rows_hint > 16)
        return launch_config<4>(config, Y, X, W, offsets, counts, groups, N, K, st, dev, err);
    return launch_config<2>(config, Y, X, W, offsets, counts, groups, N, K, st, dev, err);
}

extern "C" int dg_cuda_grouped_gemm_configs(void)
{
    return N_CONFIGS;
}

extern "C" int dg_cuda_grouped_gemm_config_exact(int config)
{
    return config >= 0 && config < N_CONFIGS && config != WGMMA_CONFIG;
}

extern "C" const char *dg_cuda_grouped_gemm_config_name(int config)
{
    return config >= 0 && config < N_CONFIGS ? CONFIGS[config] : NULL;
}

extern "C" int dg_cuda_grouped_gemm_config(int config, void *Y, int y_f32, const void *X,
                                           const void *W, const int32_t *offsets,
                                           const int32_t *counts, int groups, int64_t N,
                                           int64_t K, int rows_hint, dg_stream_t stream, int dev,
                                           struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)X, *w = (const __nv_bfloat16 *)W;
    if (config < 0 || config >= N_CONFIGS || !dg_cuda_grouped_gemm_fits(N, K) || groups < 0 ||
        groups > 65535)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: grouped GEMM: %d groups of [%lld x %lld]%s",
                            dev, groups, (long long)N, (long long)K,
                            config < 0 || config >= N_CONFIGS ? " (no such configuration)" : "");
    if (groups == 0)
        return 0;
    if (config == WGMMA_CONFIG)
        return dg_cuda_grouped_wgmma(Y, y_f32, 0, X, W, offsets, counts, groups, N, K, rows_hint,
                                     stream, dev, err);
    if (y_f32)
        return pick(config, (float *)Y, x, w, offsets, counts, groups, N, K, rows_hint, st, dev,
                    err);
    return pick(config, (__nv_bfloat16 *)Y, x, w, offsets, counts, groups, N, K, rows_hint, st,
                dev, err);
}

extern "C" int dg_cuda_grouped_gemm(void *Y, int y_f32, const void *X, const void *W,
                                    const int32_t *offsets, const int32_t *counts, int groups,
                                    int64_t N, int64_t K, int rows_hint, dg_stream_t stream,
                                    int dev, struct dg_error *err)
{
    /* wgmma where the device has it (configuration 6; runs 84-85's
     * bench-moe-gemm, nvidia-h200: gate/up 0.272 ms at 16 rows an expert,
     * 0.365 at 64, against 0.304 and 0.568 for configuration 4; down
     * 0.135 and 0.205 against 0.153 and 0.295); else the 2 x 2 warps
     * (configuration 4; configuration 0 at 2 m-tiles a pass): at 64 rows
     * an expert 0.300 ms against 0.344 for the down product, 0.569 against
     * 0.655 for gate/up, the same at 16 (run 80) */
    return dg_cuda_grouped_gemm_config(dg_cuda_grouped_wgmma_fits(dev, N, K) ? WGMMA_CONFIG : 4,
                                       Y, y_f32, X, W, offsets, counts, groups, N, K, rows_hint,
                                       stream, dev, err);
}

extern "C" int dg_cuda_grouped_gemm_gelu_fits(int64_t I, int64_t K)
{
    return I > 0 && K > 0 && I % (GG_BN / 2) == 0 && K % 64 == 0 && I / (GG_BN / 2) <= 65535;
}

extern "C" int dg_cuda_grouped_gemm_gelu(void *Y, int y_f32, const void *X, const void *W,
                                         const int32_t *offsets, const int32_t *counts,
                                         int groups, int64_t I, int64_t K, int rows_hint,
                                         dg_stream_t stream, int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)X, *w = (const __nv_bfloat16 *)W;
    if (!dg_cuda_grouped_gemm_gelu_fits(I, K) || groups < 0 || groups > 65535)
        return dg_error_set(err, DG_E_INVAL,
                            "GPU %d: grouped gated GEMM: %d groups of [2 x %lld x %lld]", dev,
                            groups, (long long)I, (long long)K);
    if (groups == 0)
        return 0;
    if (dg_cuda_grouped_wgmma_fits(dev, 2 * I, K))
        return dg_cuda_grouped_wgmma(Y, y_f32, 1, X, W, offsets, counts, groups, 2 * I, K,
                                     rows_hint, stream, dev, err);
    if (y_f32)
        return pick_gated((float *)Y, x, w, offsets, counts, groups, I, K, rows_hint, st, dev,
                          err);
    return pick_gated((__nv_bfloat16 *)Y, x, w, offsets, counts, groups, I, K, rows_hint, st,
                      dev, err);
}
