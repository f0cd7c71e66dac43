/* fp8-gemm.cu - W8A8 products on the tensor cores (see fp8-gemm.h;
 * references: dg_fp8_quantize_rows and dg_ref_fp8_linear in lib/ref-fp8.c).
 *
 * Quantize (one warp per row r of X, bf16 or fp32):
 *   s_r = max(max_k |X[r, k]| / 448, 2^-126)   (1 for a row of zeros, NaN with a NaN)
 *   Q[r, k] = e4m3(X[r, k] / s_r)  (nearest even, saturating at 448)
 *
 * Product (per group j, its rows r = offsets[j] .. + counts[j] - 1, or one
 * group of all rows):
 *   Y[r, n] = sa[r] * sw_j[n] * sum_k Q[r, k] * QW_j[n, k]
 * (accumulating: Y[r, n] += that, the sum rounded to Y's type once)
 * the sum in fp32 on the tensor cores (mma.sync m16n8k32, e4m3 x e4m3),
 * the products of two E4M3 values exact.  Block (64 columns, group j), 4
 * warps of 16 columns; the group's rows MT x 16 at a time; K in steps of BK
 * bytes through an ST-stage cp.async pipeline of the weight tile [64 x BK]
 * and the row tile [MT 16 x BK] (BK and ST: a configuration, fp8-gemm.h;
 * the public calls pick one by the rows a group has and K); rows past
 * the group's count, and bytes past K in the last step (K a multiple of
 * 16, not necessarily of BK: a rank's share of a width), load as zeros
 * and add nothing; those rows are not stored.  Each weight byte is read once per pass.  One group
 * of many rows (a projection at a large batch) spreads its passes over
 * grid.z, so that N / 64 blocks do not leave most of the GPU idle.
 * Configuration 6 is another kernel, on Hopper's warpgroup products
 * (fp8-wgmma.cu), the public calls' choice where the device has them
 * (dg_cuda_fp8_gemm_pick). */
#include "kernels/fp8-gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-quant.cuh"
#include "kernels/fp8-wgmma.h"
#include "kernels/mma.cuh"

#define F8_BN 64

/* The configurations' names (fp8-gemm.h), in launch_config's order: K
 * step in bytes (= values) and pipeline stages; the last with a 2 x 2
 * grid of warps (WM = 2: each half the pass's rows and 32 columns, so a
 * row fragment is read by two warps, not four) where a pass has 4 m-tiles
 * or more.  The shared row stride is
 * BK + 16 bytes, 16 modulo 128: ldmatrix's eight rows fall in distinct
 * banks. */
static const char *const CONFIGS[] = {"K step 64 bytes, 4 stages", "K step 128 bytes, 4 stages",
                                      "K step 128 bytes, 3 stages", "K step 256 bytes, 3 stages",
                                      "K step 64 bytes, 8 stages",
                                      "K step 64 bytes, 4 stages, 2 x 2 warps",
                                      "wgmma, K step 128 bytes, 3 stages"};
#define WGMMA_CONFIG 6 /* fp8-wgmma.cu's kernel */
#define N_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

/* ---- quantize ---------------------------------------------------------------- */

template <typename T>
__global__ static void quantize_rows_kernel(uint8_t *Q, float *S, const T *X, int64_t rows,
                                            int cols)
{
    const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const T *xr = X + r * cols;
    float amax = 0.0f, s;
    int nan = 0;
    if (r >= rows)
        return;
    for (int k = lane; k < cols; k += 32) {
        const float a = fabsf(dg_ld(xr + k));
        nan |= isnan(a);
        amax = fmaxf(amax, a);
    }
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    s = dg_fp8_row_scale(amax, nan);
    if (lane == 0)
        S[r] = s;
    for (int k = lane; k < cols; k += 32)
        Q[r * cols + k] =
            (uint8_t)__nv_cvt_float_to_fp8(dg_ld(xr + k) / s, __NV_SATFINITE, __NV_E4M3);
}

#define QR_THREADS 128
#define QR_CHUNKS 8 /* pieces of 8 columns a thread: rows of up to 8,192 */
/* The same function as quantize_rows_kernel, a block a row: the row's
 * pieces of 8 columns loaded at once (16-byte loads) and kept in
 * registers, the maximum over the block, then 8 bytes stored a piece.
 * Without kpick, row r = rows_at[blockIdx.x] (nothing where it is
 * negative), or blockIdx.x: x's row r into q's and scale's row r.  With
 * kpick > 0 (the experts' picks straight from the tokens' rows) block t
 * is token t: x's row t, quantized once, into q's and scale's rows
 * rows_at[t kpick + k] for k < kpick (those that are not negative), the
 * same bytes in each.  GELU: as dg_fp8_piece_load (so the bytes are the
 * ones that dg_cuda_gelu_mul_e and this kernel's plain form give).  cols
 * a multiple of 8, at most 8 QR_THREADS QR_CHUNKS; x 16-byte aligned. */
template <typename T, int GELU>
__global__ static void __launch_bounds__(QR_THREADS)
    quantize_rows8_kernel(uint8_t *Q, float *S, const T *X, const int32_t *rows_at, int cols,
                          int kpick)
{
    __shared__ float s_amax[QR_THREADS / 32];
    __shared__ int s_nan[QR_THREADS / 32];
    const int64_t rx = kpick > 0 || !rows_at ? (int64_t)blockIdx.x
                                             : (int64_t)rows_at[blockIdx.x];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n8 = cols / 8;
    const T *xr = X + rx * (GELU ? 2 : 1) * (int64_t)cols;
    float v[QR_CHUNKS][8], amax = 0.0f, s;
    uint2 qb[QR_CHUNKS];
    int nan = 0;
    if (rx < 0)
        return;
#pragma unroll
    for (int i = 0; i < QR_CHUNKS; i++)
        if ((int)threadIdx.x + i * QR_THREADS < n8)
            dg_fp8_piece_load<T, GELU>(xr, cols, (int)threadIdx.x + i * QR_THREADS, v[i], amax,
                                         nan);
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    if (lane == 0) {
        s_amax[warp] = amax;
        s_nan[warp] = nan;
    }
    __syncthreads();
    for (int w = 0; w < QR_THREADS / 32; w++) {
        amax = fmaxf(amax, s_amax[w]);
        nan |= s_nan[w];
    }
    s = dg_fp8_row_scale(amax, nan);
#pragma unroll
    for (int i = 0; i < QR_CHUNKS; i++)
        if ((int)threadIdx.x + i * QR_THREADS < n8)
            qb[i] = dg_fp8_piece(v[i], s);
    for (int k = 0; k < (kpick > 0 ? kpick : 1); k++) {
        const int64_t r = kpick > 0 ? (int64_t)rows_at[(int64_t)blockIdx.x * kpick + k] : rx;
        if (r < 0)
            continue;
        if (threadIdx.x == 0)
            S[r] = s;
#pragma unroll
        for (int i = 0; i < QR_CHUNKS; i++) {
            const int c8 = (int)threadIdx.x + i * QR_THREADS;
            if (c8 < n8)
                *(uint2 *)(Q + r * cols + c8 * 8) = qb[i];
        }
    }
}

/* The same function, a warp a row (fp8-quant.cuh's
 * dg_fp8_quantize_row_warp), for rows of up to 32 DG_FQ_CHUNKS pieces
 * (1,024 columns): row r = rows_at[b] (nothing where it is negative) or b
 * for warp b < n of the grid (QR_THREADS / 32 a block); no barrier, so a
 * block's rows do not wait for one another.  (A block a row leaves most
 * of its threads idle at these widths: the experts' 704.) */
template <typename T, int GELU>
__global__ static void __launch_bounds__(QR_THREADS)
    quantize_rows8_warp_kernel(uint8_t *Q, float *S, const T *X, const int32_t *rows_at,
                               int64_t n, int cols)
{
    const int64_t b = (int64_t)blockIdx.x * (QR_THREADS / 32) + (threadIdx.x >> 5);
    const int64_t r = b >= n ? -1 : rows_at ? (int64_t)rows_at[b] : b;
    if (r >= 0)
        dg_fp8_quantize_row_warp<T, GELU>(Q + r * cols, S + r,
                                          X + r * (GELU ? 2 : 1) * (int64_t)cols, cols,
                                          (int)threadIdx.x & 31);
}

/* whether quantize_rows8_kernel takes rows of cols from x into q */
static int quantize8_fits(int cols, const void *x, const void *q)
{
    return cols >= 8 && cols % 8 == 0 && cols <= 8 * QR_THREADS * QR_CHUNKS &&
           (uintptr_t)x % 16 == 0 && (uintptr_t)q % 8 == 0;
}

/* n rows (kpick 0) or tokens (kpick K) through quantize_rows8_kernel,
 * or rows of up to 1,024 columns through its warp form */
template <typename T>
static void quantize8_launch(uint8_t *q, float *scale, const T *x, const int32_t *rows_at,
                             int64_t n, int cols, int gelu, int kpick, cudaStream_t st)
{
    const unsigned wblocks = (unsigned)((n + QR_THREADS / 32 - 1) / (QR_THREADS / 32));
    const int warp_form = kpick == 0 && cols <= 8 * 32 * DG_FQ_CHUNKS;
    if (warp_form && gelu)
        quantize_rows8_warp_kernel<T, 1><<<wblocks, QR_THREADS, 0, st>>>(q, scale, x, rows_at,
                                                                          n, cols);
    else if (warp_form)
        quantize_rows8_warp_kernel<T, 0><<<wblocks, QR_THREADS, 0, st>>>(q, scale, x, rows_at,
                                                                          n, cols);
    else if (gelu)
        quantize_rows8_kernel<T, 1><<<(unsigned)n, QR_THREADS, 0, st>>>(q, scale, x, rows_at,
                                                                        cols, kpick);
    else
        quantize_rows8_kernel<T, 0><<<(unsigned)n, QR_THREADS, 0, st>>>(q, scale, x, rows_at,
                                                                        cols, kpick);
}

extern "C" int dg_cuda_fp8_quantize_rows_at_fits(int cols, const void *x, const void *q)
{
    return quantize8_fits(cols, x, q);
}

/* The listed rows' launch (dg_cuda_fp8_quantize_rows_at: n rows, kpick
 * 0; dg_cuda_fp8_quantize_picks: n tokens, kpick = K), its arguments checked by the
 * caller but for the columns: DG_E_UNSUPPORTED (what names the call) where
 * the kernel does not take them, nothing queued. */
static int quantize8_at(enum dg_elt e, uint8_t *q, float *scale, const void *x,
                        const int32_t *rows_at, int64_t n, int cols, int gelu, int kpick,
                        const char *what, dg_stream_t stream, int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    int rc = 0;
    if (!quantize8_fits(cols, x, q))
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: fp8 quantize %s: %d columns (a "
                            "multiple of 8 up to %d, aligned)", dev, what, cols,
                            8 * QR_THREADS * QR_CHUNKS);
    if (n == 0)
        return 0;
    if (e == DG_ELT_F32)
        quantize8_launch(q, scale, (const float *)x, rows_at, n, cols, gelu, kpick, st);
    else
        quantize8_launch(q, scale, (const __nv_bfloat16 *)x, rows_at, n, cols, gelu, kpick, st);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_fp8_quantize_rows_at(enum dg_elt e, uint8_t *q, float *scale,
                                            const void *x, const int32_t *rows_at, int64_t n,
                                            int cols, int gelu, dg_stream_t stream, int dev,
                                            struct dg_error *err)
{
    if ((e != DG_ELT_BF16 && e != DG_ELT_F32) || n < 0 || n > 0x7fffffff || !rows_at)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: fp8 quantize at rows: element type %d, "
                            "%lld rows", dev, (int)e, (long long)n);
    return quantize8_at(e, q, scale, x, rows_at, n, cols, gelu, 0, "at rows", stream, dev, err);
}

extern "C" int dg_cuda_fp8_quantize_picks(enum dg_elt e, uint8_t *q, float *scale,
                                          const void *x, const int32_t *slot_of, int64_t picks,
                                          int K, int cols, dg_stream_t stream, int dev,
                                          struct dg_error *err)
{
    if ((e != DG_ELT_BF16 && e != DG_ELT_F32) || picks < 0 || picks > 0x7fffffff || K < 1 ||
        picks % K || !slot_of)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: fp8 quantize picks: element type %d, "
                            "%lld picks, top-%d (K picks a token)", dev, (int)e,
                            (long long)picks, K);
    /* a block a token, its row stored to each of its picks' slots */
    return quantize8_at(e, q, scale, x, slot_of, picks / K, cols, 0, K, "picks", stream, dev,
                        err);
}

extern "C" int dg_cuda_fp8_quantize_rows(enum dg_elt e, uint8_t *q, float *scale, const void *x,
                                         int64_t rows, int cols, dg_stream_t stream, int dev,
                                         struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    const unsigned blocks = (unsigned)((rows + 3) / 4);
    int rc = 0;
    if ((e != DG_ELT_BF16 && e != DG_ELT_F32) || cols < 1 || rows < 0 ||
        rows > 4 * (int64_t)0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: fp8 quantize: element type %d, %lld rows "
                            "of %d", dev, (int)e, (long long)rows, cols);
    if (rows == 0)
        return 0;
    if (quantize8_fits(cols, x, q) && rows <= 0x7fffffff) {
        /* a block a row */
        if (e == DG_ELT_F32)
            quantize8_launch(q, scale, (const float *)x, NULL, rows, cols, 0, 0, st);
        else
            quantize8_launch(q, scale, (const __nv_bfloat16 *)x, NULL, rows, cols, 0, 0,
                             st);
        DG_LAUNCH_CHECK();
        return 0;
    }
    if (e == DG_ELT_F32)
        quantize_rows_kernel<float><<<blocks, 128, 0, st>>>(q, scale, (const float *)x, rows,
                                                           cols);
    else
        quantize_rows_kernel<__nv_bfloat16><<<blocks, 128, 0, st>>>(
            q, scale, (const __nv_bfloat16 *)x, rows, cols);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* ---- the product ------------------------------------------------------------- */

/* grid (N / 64, groups), 128 threads; MT m-tiles of 16 rows a pass, K in
 * steps of BK bytes through ST stages; WM rows of warps (MT / WM m-tiles
 * and 64 / (4 / WM) columns each) */
template <int MT, int BK, int ST, int WM, typename Out>
__global__ static void __launch_bounds__(128)
    fp8_gemm_kernel(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW,
                    const float *SW, const int32_t *offsets, const int32_t *counts,
                    int64_t rows_all, int64_t N, int64_t K, int accumulate)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int LD = BK + 16;                  /* shared row stride, bytes */
    using G = dg_warp_grid<F8_BN, MT, WM>;
    constexpr int WN = G::WN, WC = G::WC, NW = G::NW, MW = G::MW;
    unsigned char *Ws = smem;                    /* [ST][BN][LD] */
    unsigned char *Xs = Ws + ST * F8_BN * LD;    /* [ST][MT 16][LD] */
    const int j = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * F8_BN;
    const int64_t count = offsets ? counts[j] : rows_all;
    const int64_t row0 = offsets ? offsets[j] : 0;
    const uint8_t *Wj = QW + (int64_t)j * N * K + n0 * K;
    const float *SWj = SW + (int64_t)j * N;
    const int ksteps = (int)((K + BK - 1) / BK);

    /* passes of MT x 16 rows, spread over gridDim.z blocks */
    for (int64_t p0 = (int64_t)blockIdx.z * MT * 16; p0 < count;
         p0 += (int64_t)gridDim.z * MT * 16) {
        const int rows = (int)min((int64_t)MT * 16, count - p0);
        const int mrows = (rows + 15) / 16 * 16;
        const uint8_t *Xp = QA + (row0 + p0) * K;
        float acc[MW][NW][4];
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int n = 0; n < NW; n++)
                acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

        auto load = [&](int s, int ks) {
            dg_stage_load<F8_BN, BK, LD>(Ws + s * F8_BN * LD, Xs + s * MT * 16 * LD, Wj, Xp,
                                         mrows, rows, (int64_t)ks * BK, K);
        };

        dg_cp_kloop<ST>(ksteps, load, [&](int s, int) {
            dg_warp_stage<MW, NW, BK, LD>(acc, Ws + s * F8_BN * LD, Xs + s * MT * 16 * LD,
                                          wn * WC, wm * MW, rows, lane, dg_mma_e4m3_op());
        });
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int n = 0; n < NW; n++) {
                const int r = (wm * MW + m) * 16 + gid;
                const int64_t col = n0 + wn * WC + n * 8 + tig * 2;
                const float w0 = SWj[col], w1 = SWj[col + 1];
                for (int h = 0; h < 2; h++) {
                    const int rr = r + 8 * h;
                    if (rr < rows) {
                        const float a = SA[row0 + p0 + rr];
                        Out *y = Y + (row0 + p0 + rr) * N + col;
                        float v0 = acc[m][n][2 * h] * a * w0, v1 = acc[m][n][2 * h + 1] * a * w1;
                        if (accumulate) {
                            v0 += dg_ld(y);
                            v1 += dg_ld(y + 1);
                        }
                        dg_store2(y, v0, v1);
                    }
                }
            }
    }
}

extern "C" int dg_cuda_fp8_gemm_fits(int64_t N, int64_t K)
{
    /* K: whole 16-byte copies (cp.async), the last 64-byte step padded */
    return N > 0 && K > 0 && N % F8_BN == 0 && K % 16 == 0 && N / F8_BN <= 0x7fffffff;
}

template <int MT, int BK, int ST, int WM, typename Out>
static int launch(Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW, const float *SW,
                  const int32_t *offsets, const int32_t *counts, int groups, int64_t rows_all,
                  int64_t N, int64_t K, int accumulate, cudaStream_t st, int dev,
                  struct dg_error *err)
{
    const size_t shared = (size_t)ST * (F8_BN + MT * 16) * (BK + 16);
    /* one group: its passes over z, enough blocks for about two waves of
     * 132 SMs (grouped calls keep z = 1: the groups spread the work) */
    const int64_t passes = (rows_all + MT * 16 - 1) / (MT * 16), nb = N / F8_BN;
    const unsigned z = offsets ? 1u
                               : (unsigned)(passes < 1 ? 1
                                            : passes < (264 + nb - 1) / nb ? passes
                                            : (264 + nb - 1) / nb);
    int rc = 0;
    DG_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<MT, BK, ST, WM, Out>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    fp8_gemm_kernel<MT, BK, ST, WM, Out>
        <<<dim3((unsigned)(N / F8_BN), (unsigned)groups, z), 128, shared, st>>>(
            Y, QA, SA, QW, SW, offsets, counts, rows_all, N, K, accumulate);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* configuration config's kernel (CONFIGS[config]) with MT m-tiles */
template <int MT, typename Out>
static int launch_config(int config, Out *Y, const uint8_t *QA, const float *SA,
                         const uint8_t *QW, const float *SW, const int32_t *offsets,
                         const int32_t *counts, int groups, int64_t rows_all, int64_t N,
                         int64_t K, int accumulate, cudaStream_t st, int dev,
                         struct dg_error *err)
{
#define F8_LAUNCH(bk, stages, wm)                                                              \
    launch<MT, bk, stages, wm>(Y, QA, SA, QW, SW, offsets, counts, groups, rows_all, N, K,  \
                               accumulate, st, dev, err)
    switch (config) {
    case 1:
        return F8_LAUNCH(128, 4, 1);
    case 2:
        return F8_LAUNCH(128, 3, 1);
    case 3:
        return F8_LAUNCH(256, 3, 1);
    case 4:
        return F8_LAUNCH(64, 8, 1);
    case 5: /* (2 x 2 warps from 4 m-tiles: at 2 the second row of warps would idle) */
        return F8_LAUNCH(64, 4, (MT >= 4 ? 2 : 1));
    default:
        return F8_LAUNCH(64, 4, 1);
    }
#undef F8_LAUNCH
}

template <typename Out>
static int pick(int config, Out *Y, const uint8_t *QA, const float *SA, const uint8_t *QW,
                const float *SW, const int32_t *offsets, const int32_t *counts, int groups,
                int64_t rows_all, int64_t N, int64_t K, int rows_hint, int accumulate,
                cudaStream_t st, int dev, struct dg_error *err)
{
    if (rows_hint > 32)
        return launch_config<8>(config, Y, QA, SA, QW, SW, offsets, counts, groups, rows_all,
                                N, K, accumulate, st, dev, err);
    if (rows_hint > 16)
        return launch_config<4>(config, Y, QA, SA, QW, SW, offsets, counts, groups, rows_all,
                                N, K, accumulate, st, dev, err);
    return launch_config<2>(config, Y, QA, SA, QW, SW, offsets, counts, groups, rows_all, N,
                            K, accumulate, st, dev, err);
}

extern "C" int dg_cuda_fp8_gemm_configs(void)
{
    return N_CONFIGS;
}

extern "C" const char *dg_cuda_fp8_gemm_config_name(int config)
{
    return config >= 0 && config < N_CONFIGS ? CONFIGS[config] : NULL;
}

extern "C" int dg_cuda_fp8_gemm_config_exact(int config)
{
    return config >= 0 && config < N_CONFIGS && config != WGMMA_CONFIG;
}

extern "C" int dg_cuda_fp8_gemm_config(int config, void *Y, int y_f32, int accumulate,
                                       const uint8_t *qa, const float *sa, const uint8_t *qw,
                                       const float *sw, const int32_t *offsets,
                                       const int32_t *counts, int groups, int64_t rows,
                                       int64_t N, int64_t K, int rows_hint, dg_stream_t stream,
                                       int dev, struct dg_error *err)
{
    const cudaStream_t st = (cudaStream_t)stream;
    if (config < 0 || config >= N_CONFIGS || !dg_cuda_fp8_gemm_fits(N, K) || groups < 1 ||
        groups > 65535 || (!offsets && (groups != 1 || rows < 0)) || (!offsets != !counts))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: fp8 GEMM: %d group(s) of [%lld x %lld]%s%s",
                            dev, groups, (long long)N, (long long)K,
                            dg_cuda_fp8_gemm_fits(N, K) ? "" : " (N a multiple of 64, K of 16)",
                            config < 0 || config >= N_CONFIGS ? " (no such configuration)" : "");
    if (!offsets && rows == 0)
        return 0;
    if (config == WGMMA_CONFIG)
        return dg_cuda_fp8_wgmma(Y, y_f32, accumulate, qa, sa, qw, sw, offsets, counts, groups,
                                 rows, N, K, rows_hint, stream, dev, err);
    if (y_f32)
        return pick(config, (float *)Y, qa, sa, qw, sw, offsets, counts, groups, rows, N, K,
                    rows_hint, !!accumulate, st, dev, err);
    return pick(config, (__nv_bfloat16 *)Y, qa, sa, qw, sw, offsets, counts, groups, rows, N, K,
                rows_hint, !!accumulate, st, dev, err);
}

extern "C" int dg_cuda_fp8_gemm_default_config(int rows_hint, int64_t K)
{
    /* run 55 (bench-moe-gemm, H200, the 26B-A4B's experts): at 16 rows an
     * expert the gate/up product (K 2,816) took 0.191 ms with K steps of
     * 128 bytes against 0.238 with 64; the down product (K 704) 0.117
     * against 0.110, and at 64 rows an expert both were slower with 128 */
    return rows_hint <= 16 && K >= 2048 ? 1 : 0;
}

extern "C" int dg_cuda_fp8_gemm_pick(int dev, int rows_hint, int64_t N, int64_t K)
{
    /* run 85 (bench-moe-gemm, H200, the 26B-A4B's experts): wgmma 0.145 /
     * 0.093 ms (gate/up / down) at 16 rows an expert against 0.237 /
     * 0.110, 0.254 / 0.215 at 64 against 0.481 / 0.270 */
    return dg_cuda_fp8_wgmma_fits(dev, N, K) ? WGMMA_CONFIG
                                             : dg_cuda_fp8_gemm_default_config(rows_hint, K);
}

extern "C" int dg_cuda_fp8_gemm_acc(void *Y, int y_f32, int accumulate, const uint8_t *qa,
                                    const float *sa, const uint8_t *qw, const float *sw,
                                    const int32_t *offsets, const int32_t *counts, int groups,
                                    int64_t rows, int64_t N, int64_t K, int rows_hint,
                                    dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_fp8_gemm_config(dg_cuda_fp8_gemm_pick(dev, rows_hint, N, K), Y, y_f32,
                                   accumulate, qa, sa, qw, sw, offsets, counts, groups, rows, N,
                                   K, rows_hint, stream, dev, err);
}

extern "C" int dg_cuda_fp8_gemm(void *Y, int y_f32, const uint8_t *qa, const float *sa,
                                const uint8_t *qw, const float *sw, const int32_t *offsets,
                                const int32_t *counts, int groups, int64_t rows, int64_t N,
                                int64_t K, int rows_hint, dg_stream_t stream, int dev,
                                struct dg_error *err)
{
    return dg_cuda_fp8_gemm_acc(Y, y_f32, 0, qa, sa, qw, sw, offsets, counts, groups, rows, N, K,
                                rows_hint, stream, dev, err);
}
