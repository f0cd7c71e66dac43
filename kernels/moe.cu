/* moe.cu - the mixture of experts over routed tokens (see ops.h;
 * reference: dg_ref_moe; the routing stages and the ordered sum on their
 * own: dg_ref_moe_route, dg_ref_moe_combine).  With fp32 elements (dg_cuda_moe_e) the gathered
 * rows, the gate/up projection and the gelu output are fp32 as well, the
 * GEMMs plain fp32; the experts' outputs and the ordered sum are fp32 for
 * both types. */
#include "kernels/ops.h"

#include <cuda_bf16.h>
#include <math.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "kernels/fp8-gemm.h"
#include "kernels/fp8-wgmma.h"
#include "kernels/moe-gemm.h"
#include "kernels/moe-wgmma.h"
#include "lib/moe-plan.h"

#define ALIGN(x) (((x) + 255) & ~(size_t)255)

/* The tiles (lib/moe-plan.h): each expert's run of rows is padded to
 * whole tiles of ts rows, so a tile belongs to one expert and reads its
 * expert's weights; ts is what an expert gets with near certainty under
 * even routing, so that while the experts' rows are few (small batches:
 * the pass streams the weights) each expert's weights are read once, the
 * padding rows costing arithmetic the pass has to spare there.  The
 * batched GEMMs run the plan's `batched` tiles (a count fixed by the
 * shapes, so that the launches can be captured), a dummy's as dear as a
 * real one's: at top-8 of 128, ts 128, batch 16 (32,768 picks) 384 tiles
 * run where about 320 hold rows; the tiles past them go to the grouped
 * one-launch kernel (moe-wgmma.h).  A rank holding a share of the experts
 * expects that share of the picks, and the counts are planned from it
 * (the bound, tiles, from all of them). */

/* the scratch's pieces, in order */
struct moe_layout {
    int ts;
    int64_t tiles, rows;         /* tile bound, padded rows (tiles x ts) */
    int64_t batched;             /* tiles the batched GEMMs may leave to the one launch */
    size_t counts, offsets, slot_of, ptrs, xs, gu, hh, ys, dummy_gu, dummy_ys;
    size_t sync;                 /* the one-launch experts' words (moe-wgmma.h, fp8-wgmma.h) */
    size_t ov_offsets, ov_counts; /* the rows past the batched tiles, by expert */
    size_t ov_any;               /* one word: whether any expert has such rows */
    size_t q, qs, total;         /* FP8: the quantized rows (of H or I bytes) and their scales */
    size_t q2, qs2;              /* FP8, the one launch: the hidden rows quantized (I bytes) */
};

/* esz: bytes of one element of the gathered rows and the intermediates
 * (the outputs ys have room for fp32 whatever esz: partial sums stay
 * fp32); fp8: room for the rows quantized to E4M3 */
static struct moe_layout layout(const struct dg_moe_plan *p, int64_t T, int K, int H, int I,
                                int n_exp, size_t esz, int fp8)
{
    const int64_t S = T * K;
    struct moe_layout l;
    l.ts = p->ts;
    l.tiles = p->tiles;
    l.batched = p->batched;
    l.rows = l.tiles * l.ts;
    l.counts = 0;
    l.offsets = l.counts + ALIGN(sizeof(int32_t) * (size_t)n_exp);
    l.slot_of = l.offsets + ALIGN(sizeof(int32_t) * (size_t)(n_exp + 1));
    l.ptrs = l.slot_of + ALIGN(sizeof(int32_t) * (size_t)S);
    l.xs = l.ptrs + ALIGN(6 * sizeof(void *) * (size_t)l.tiles);
    l.gu = l.xs + ALIGN(esz * (size_t)l.rows * (size_t)H);
    l.hh = l.gu + ALIGN(esz * (size_t)l.rows * 2 * (size_t)I);
    l.ys = l.hh + ALIGN(esz * (size_t)l.rows * (size_t)I);
    l.dummy_gu = l.ys + ALIGN(4 * (size_t)l.rows * (size_t)H);
    l.dummy_ys = l.dummy_gu + ALIGN(esz * (size_t)l.ts * 2 * (size_t)I);
    l.sync = l.dummy_ys + ALIGN(4 * (size_t)l.ts * (size_t)H);
    l.ov_offsets = l.sync + ALIGN(sizeof(int32_t) * (size_t)(1 + 2 * n_exp));
    l.ov_counts = l.ov_offsets + ALIGN(sizeof(int32_t) * (size_t)n_exp);
    l.ov_any = l.ov_counts + ALIGN(sizeof(int32_t) * (size_t)n_exp);
    l.q = l.ov_any + ALIGN(sizeof(int32_t));
    l.qs = l.q + (fp8 ? ALIGN((size_t)l.rows * (size_t)(H > I ? H : I)) : 0);
    l.q2 = l.qs + (fp8 ? ALIGN(4 * (size_t)l.rows) : 0);
    l.qs2 = l.q2 + (fp8 ? ALIGN((size_t)l.rows * (size_t)I) : 0);
    l.total = l.qs2 + (fp8 ? ALIGN(4 * (size_t)l.rows) : 0);
    return l;
}

/* The scratch for the plan of (T, K, n_exp, n_all) with elements of esz
 * bytes: 0 for shapes the calls refuse. */
static size_t scratch_bytes(int64_t T, int K, int H, int I, int n_exp, int n_all, size_t esz,
                            int fp8)
{
    struct dg_moe_plan p;
    if (dg_moe_plan_make(T > 0 ? T : 1, K, n_exp, n_all, &p, NULL) < 0)
        return 0;
    return layout(&p, T > 0 ? T : 1, K, H, I, n_exp, esz, fp8).total;
}

/* (an element type other than the two: sized as bf16; dg_cuda_moe_e
 * refuses it) */
extern "C" size_t dg_cuda_moe_scratch_e(enum dg_elt e, int64_t T, int K, int H, int I,
                                        int n_exp, int n_all)
{
    return scratch_bytes(T, K, H, I, n_exp, n_all, (size_t)dg_elt_size(e), 0);
}

extern "C" size_t dg_cuda_moe_scratch_q(int64_t T, int K, int H, int I, int n_exp, int n_all)
{
    return scratch_bytes(T, K, H, I, n_exp, n_all, 2, 1);
}

extern "C" size_t dg_cuda_moe_scratch(int64_t T, int K, int H, int I, int n_exp, int n_all)
{
    return dg_cuda_moe_scratch_e(DG_ELT_BF16, T, K, H, I, n_exp, n_all);
}

/* counts[e] = picks of expert e0 + e */
/* The routing of the picks, one block (thread j < n_exp serves expert
 * j where a step is per expert; n_exp <= 1024), counting in shared
 * memory:
 *   c_j = #{p : idx[p] - e0 = j}                 (counts)
 *   pad_j = ceil(c_j / ts) ts,  offsets[j] = sum_{i<j} pad_i  (a scan)
 *   tile t of expert j's k-th ts rows (t = offsets[j] / ts + k):
 *     A1[t] = xs + (offsets[j] + k ts) H,  B1[t] = W_gu_j,    C1[t] = gu + (...) 2I
 *     A2[t] = hh + (offsets[j] + k ts) I,  B2[t] = W_down_j,  C2[t] = ys + (...) H
 *   (byte offsets: elements of esz bytes, ys's of ysz)
 *   tiles past the last used one compute into the dummies (the batched
 *   GEMMs have a fixed count: the host's bound);
 *   the rows from row rb on (rb: the batched GEMMs' tiles, times ts),
 *   expert by expert: ov_off[j] = max(offsets[j], rb), ov_cnt[j] =
 *   max(0, offsets[j] + c_j - ov_off[j]) (all 0 when the tiles used end
 *   by rb), *ov_any = 1 where any is not 0, else 0;
 *   slot_of[p] = offsets[j] + (p's place among expert j's picks), or -1
 *   for another rank's expert (the order within a run is free: rows are
 *   independent);
 *   sync[0 .. 2 n_exp] = 0 (the one-launch experts' words: moe-wgmma.h,
 *   fp8-wgmma.h).
 * shared: 2 n_exp + 1 int32. */
__global__ static void route_kernel(int32_t *counts, int32_t *offsets, int32_t *slot_of,
                                    int32_t *sync, int32_t *ov_off, int32_t *ov_cnt,
                                    int32_t *ov_any, int64_t rb, void **ptrs, const int32_t *idx,
                                    int64_t picks, int e0, int n_exp, int ts, int64_t tiles,
                                    unsigned char *xs,
                                    unsigned char *gu, unsigned char *hh, unsigned char *ys,
                                    const unsigned char *wgu, const unsigned char *wdn,
                                    unsigned char *dummy_gu, unsigned char *dummy_ys, int H,
                                    int I, int esz, int ysz)
{
    extern __shared__ int32_t s_route[]; /* counts, then offsets [n_exp + 1] */
    __shared__ int32_t s_warp[32];
    __shared__ int32_t s_any;
    int32_t *s_count = s_route, *s_off = s_route + n_exp;
    const int j = threadIdx.x;
    void **A1 = ptrs, **B1 = ptrs + tiles, **C1 = ptrs + 2 * tiles;
    void **A2 = ptrs + 3 * tiles, **B2 = ptrs + 4 * tiles, **C2 = ptrs + 5 * tiles;
    int64_t used;
    int32_t pad = 0;

    for (int i = j; i < n_exp; i += blockDim.x)
        s_count[i] = 0;
    if (j == 0)
        s_any = 0;
    __syncthreads();
    for (int64_t p = j; p < picks; p += blockDim.x) {
        const int e = idx[p] - e0;
        if (e >= 0 && e < n_exp)
            atomicAdd(&s_count[e], 1);
    }
    __syncthreads();
    /* the exclusive scan of the padded counts: each warp's inclusive scan
     * (shuffles), the warps' totals scanned by warp 0, added back */
    {
        const int lane = j & 31, warp = j >> 5;
        int32_t v = j < n_exp ? (s_count[j] + ts - 1) / ts * ts : 0, incl = v;
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t u = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += u;
        }
        if (lane == 31)
            s_warp[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            int32_t t = lane < (int)(blockDim.x >> 5) ? s_warp[lane] : 0, ti = t;
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t u = __shfl_up_sync(0xffffffffu, ti, o);
                if (lane >= o)
                    ti += u;
            }
            s_warp[lane] = ti - t; /* the warps before this one */
        }
        __syncthreads();
        if (j < n_exp)
            s_off[j] = s_warp[warp] + incl - v;
        if (j == n_exp - 1)
            s_off[n_exp] = s_warp[warp] + incl;
    }
    __syncthreads();
    for (int i = j; i <= 2 * n_exp; i += blockDim.x)
        sync[i] = 0;
    for (int i = j; i <= n_exp; i += blockDim.x) {
        offsets[i] = s_off[i];
        if (i < n_exp)
            counts[i] = s_count[i];
    }
    if (j < n_exp) {
        const int64_t I2 = 2 * (int64_t)I;
        const int64_t ov0 = s_off[j] > rb ? (int64_t)s_off[j] : rb,
                      end = (int64_t)s_off[j] + s_count[j];
        ov_off[j] = (int32_t)ov0;
        ov_cnt[j] = end > ov0 ? (int32_t)(end - ov0) : 0;
        if (end > ov0)
            s_any = 1;
        pad = (s_count[j] + ts - 1) / ts * ts;
        for (int32_t r = 0; r < pad; r += ts) {
            const int64_t row = (int64_t)s_off[j] + r, t = row / ts;
            A1[t] = xs + row * H * esz;
            B1[t] = (void *)(wgu + (int64_t)j * I2 * H * esz);
            C1[t] = gu + row * I2 * esz;
            A2[t] = hh + row * I * esz;
            B2[t] = (void *)(wdn + (int64_t)j * H * I * esz);
            C2[t] = ys + row * H * ysz;
        }
    }
    used = s_off[n_exp] / ts;
    for (int64_t t = used + j; t < tiles; t += blockDim.x) {
        A1[t] = xs;
        B1[t] = (void *)wgu;
        C1[t] = dummy_gu;
        A2[t] = hh;
        B2[t] = (void *)wdn;
        C2[t] = dummy_ys;
    }
    /* the counts become cursors: each pick takes the next row of its run */
    __syncthreads();
    if (j == 0)
        *ov_any = s_any;
    for (int i = j; i < n_exp; i += blockDim.x)
        s_count[i] = 0;
    __syncthreads();
    for (int64_t p = j; p < picks; p += blockDim.x) {
        const int e = idx[p] - e0;
        slot_of[p] = e < 0 || e >= n_exp ? -1 : s_off[e] + atomicAdd(&s_count[e], 1);
    }
}

/* grid (picks, ceil(H / 256)): xs[slot_of[p]] = x[p / K] (a copy: E is the
 * element type, bf16 or fp32) */
template <typename E>
__global__ static void gather_kernel(E *xs, const E *x, const int32_t *slot_of, int K, int H)
{
    const int64_t p = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    const int32_t s = slot_of[p];
    if (i < H && s >= 0)
        xs[(int64_t)s * H + i] = x[(p / K) * H + i];
}

/* the same sixteen bytes at a time, a token's row read once for its K
 * picks: grid (T, ceil(n16 / 128)), 128 threads (rows of n16 16-byte
 * pieces, 16-byte aligned) */
__global__ static void gather16_kernel(uint4 *xs, const uint4 *x, const int32_t *slot_of, int K,
                                       int n16)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= n16)
        return;
    const uint4 v = x[t * n16 + i];
    for (int k = 0; k < K; k++) {
        const int32_t s = slot_of[t * K + k];
        if (s >= 0)
            xs[(int64_t)s * n16 + i] = v;
    }
}

/* grid (T, ceil(H / 256)): out[t, i] = sum over k, in order, of w[t,k] ys[slot, i]
 * (ys fp32 or bf16, each value as float) */
template <typename Y>
__global__ static void combine_kernel(float *out, const Y *ys, const int32_t *slot_of,
                                      const float *w, int K, int H)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    if (i >= H)
        return;
    for (int k = 0; k < K; k++) {
        const int32_t s = slot_of[t * K + k];
        if (s >= 0)
            acc += w[t * K + k] * dg_ld(ys + (int64_t)s * H + i);
    }
    out[t * H + i] = acc;
}

/* The same sum a 16-byte piece of ys a thread, N = 16 / sizeof(Y) columns
 * (4 fp32 or 8 bf16, each value as float: the same products added in the
 * same order as combine_kernel, so the same bits): grid (T, ceil(n16 /
 * 256)), rows of n16 pieces of ys, ys 16-byte and out 4N-byte aligned; the
 * picks' loads unrolled so that several are in flight at once. */
template <typename Y>
__global__ static void combine16_kernel(float4 *out, const uint4 *ys, const int32_t *slot_of,
                                        const float *w, int K, int n16)
{
    constexpr int N = 16 / (int)sizeof(Y);
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    float acc[N];
    if (i >= n16)
        return;
#pragma unroll
    for (int u = 0; u < N; u++)
        acc[u] = 0.0f;
#pragma unroll 4
    for (int k = 0; k < K; k++) {
        const int32_t s = slot_of[t * K + k];
        if (s >= 0) {
            const float wk = w[t * K + k];
            const uint4 y = ys[(int64_t)s * n16 + i];
            const Y *v = (const Y *)&y;
#pragma unroll
            for (int u = 0; u < N; u++)
                acc[u] += wk * dg_ld(v + u);
        }
    }
#pragma unroll
    for (int u = 0; u < N / 4; u++)
        out[(t * n16 + i) * (N / 4) + u] =
            make_float4(acc[4 * u], acc[4 * u + 1], acc[4 * u + 2], acc[4 * u + 3]);
}

/* The routing stages (ops.h, dg_cuda_moe_route_e) into scratch laid out as
 * l: the counts, the tile schedule and each pick's slot (one launch),
 * then with gather the gathered rows.  ys_f32: the outputs' tiles in fp32
 * (else of type e).  Nothing waits for the device. */
static int route(enum dg_elt e, int ys_f32, const struct moe_layout *l, int64_t batched,
                 const void *x, int64_t T, int H, const int32_t *idx, int K, int e0, int n_exp,
                 int I, const void *W_gu, const void *W_down, unsigned char *sc, int gather,
                 cudaStream_t st, int dev, struct dg_error *err)
{
    const int64_t esz = dg_elt_size(e), picks = T * K;
    int32_t *counts = (int32_t *)(sc + l->counts);
    int32_t *offsets = (int32_t *)(sc + l->offsets), *slot_of = (int32_t *)(sc + l->slot_of);
    int rc = 0;

    route_kernel<<<1, 1024, sizeof(int32_t) * (size_t)(2 * n_exp + 1), st>>>(
        counts, offsets, slot_of, (int32_t *)(sc + l->sync), (int32_t *)(sc + l->ov_offsets),
        (int32_t *)(sc + l->ov_counts), (int32_t *)(sc + l->ov_any), batched * l->ts,
        (void **)(sc + l->ptrs), idx, picks,
        e0, n_exp, l->ts, l->tiles, sc + l->xs, sc + l->gu, sc + l->hh, sc + l->ys,
        (const unsigned char *)W_gu, (const unsigned char *)W_down, sc + l->dummy_gu,
        sc + l->dummy_ys, H, I, (int)esz, ys_f32 ? 4 : (int)esz);
    DG_LAUNCH_CHECK();
    if (!gather)
        goto out;
    if ((H * esz) % 16 == 0 && !((uintptr_t)x & 15)) {
        const int n16 = (int)(H * esz / 16);
        gather16_kernel<<<dim3((unsigned)T, (unsigned)((n16 + 127) / 128)), 128, 0, st>>>(
            (uint4 *)(sc + l->xs), (const uint4 *)x, slot_of, K, n16);
        DG_LAUNCH_CHECK();
    } else {
        const dim3 grid((unsigned)picks, (unsigned)((H + 255) / 256));
        if (e == DG_ELT_F32)
            gather_kernel<float><<<grid, 256, 0, st>>>((float *)(sc + l->xs), (const float *)x,
                                                       slot_of, K, H);
        else
            gather_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(
                (__nv_bfloat16 *)(sc + l->xs), (const __nv_bfloat16 *)x, slot_of, K, H);
        DG_LAUNCH_CHECK();
    }
out:
    return rc;
}

/* the shapes dg_cuda_moe_e and dg_cuda_moe_route_e take, or DG_E_INVAL;
 * their plan (lib/moe-plan.h) into *p */
static int check_shapes(int64_t T, int H, int K, int I, int e0, int n_exp, int n_all,
                        struct dg_moe_plan *p, int dev, struct dg_error *err)
{
    if (H < 1 || I < 1 || K < 1 || n_exp < 1 || e0 < 0 || e0 > n_all - n_exp ||
        dg_moe_plan_make(T, K, n_exp, n_all, p, NULL) < 0)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: %lld tokens x top-%d, H %d, I %d, "
                            "experts %d .. %d of %d", dev, (long long)T, K, H, I, e0,
                            e0 + n_exp - 1, n_all);
    return 0;
}

/* The tiles the batched GEMMs run for element type e: l's bound where
 * the one launch takes the rest (bf16 experts it fits on a Hopper GPU),
 * otherwise all of them (no rows past them) */
static int64_t batched_of(enum dg_elt e, const struct moe_layout *l, int H, int I, int dev)
{
    return e == DG_ELT_BF16 && l->batched < l->tiles && dg_cuda_experts_wgmma_fits(dev, I, H)
               ? l->batched
               : l->tiles;
}

extern "C" int dg_cuda_moe_route_e(enum dg_elt e, const void *x, int64_t T, int H,
                                   const int32_t *idx, int K, int e0, int n_exp, int n_all,
                                   int I, const void *W_gu, const void *W_down, void *scratch,
                                   struct dg_moe_route_view *view, dg_stream_t stream, int dev,
                                   struct dg_error *err)
{
    unsigned char *sc = (unsigned char *)scratch;
    struct dg_moe_plan p;
    struct moe_layout l;
    int rc;

    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: element type %d", dev, (int)e);
    if (T < 1)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: routing of %lld tokens", dev,
                            (long long)T);
    if ((rc = check_shapes(T, H, K, I, e0, n_exp, n_all, &p, dev, err)) < 0)
        return rc;
    l = layout(&p, T, K, H, I, n_exp, (size_t)dg_elt_size(e), 0);
    *view = (struct dg_moe_route_view){
        .ts = l.ts, .tiles = l.tiles, .rows = l.rows,
        .counts = (int32_t *)(sc + l.counts), .offsets = (int32_t *)(sc + l.offsets),
        .slot_of = (int32_t *)(sc + l.slot_of), .ptrs = (void **)(sc + l.ptrs),
        .xs = sc + l.xs, .gu = sc + l.gu, .hh = sc + l.hh, .ys = sc + l.ys,
        .dummy_gu = sc + l.dummy_gu, .dummy_ys = sc + l.dummy_ys,
        .sync = (int32_t *)(sc + l.sync), .batched = batched_of(e, &l, H, I, dev),
        .ov_offsets = (int32_t *)(sc + l.ov_offsets),
        .ov_counts = (int32_t *)(sc + l.ov_counts), .ov_any = (int32_t *)(sc + l.ov_any)};
    return route(e, e == DG_ELT_F32, &l, view->batched, x, T, H, idx, K, e0, n_exp, I, W_gu,
                 W_down, sc, 1, (cudaStream_t)stream, dev, err);
}

/* The combine's launch for outputs ys of type Y: a 16-byte piece a
 * thread (combine16_kernel) where H, ys and out allow it, else a column a
 * thread (combine_kernel). */
template <typename Y>
static void launch_combine(float *out, const Y *ys, const int32_t *slot_of, const float *w,
                           int64_t T, int K, int H, cudaStream_t st)
{
    constexpr int N = 16 / (int)sizeof(Y);
    if (H % N == 0 && !((uintptr_t)ys & 15) && !((uintptr_t)out & (4 * N - 1)))
        combine16_kernel<Y><<<dim3((unsigned)T, (unsigned)((H / N + 255) / 256)), 256, 0, st>>>(
            (float4 *)out, (const uint4 *)ys, slot_of, w, K, H / N);
    else
        combine_kernel<<<dim3((unsigned)T, (unsigned)((H + 255) / 256)), 256, 0, st>>>(
            out, ys, slot_of, w, K, H);
}

/* out[T, H] from the experts' outputs ys (fp32 where ys_f32, else bf16)
 * by the picks' slots (ops.h) */
static int combine(float *out, const void *ys, int ys_f32, const int32_t *slot_of,
                   const float *w, int64_t T, int K, int H, cudaStream_t st, int dev,
                   struct dg_error *err)
{
    int rc = 0;
    if (ys_f32)
        launch_combine(out, (const float *)ys, slot_of, w, T, K, H, st);
    else
        launch_combine(out, (const __nv_bfloat16 *)ys, slot_of, w, T, K, H, st);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_moe_combine(float *out, const void *ys, int ys_f32,
                                   const int32_t *slot_of, const float *w, int64_t T, int K,
                                   int H, dg_stream_t stream, int dev, struct dg_error *err)
{
    if (T < 1 || K < 1 || H < 1 || T > 0x7fffffff)
        return T == 0 ? 0 : dg_error_set(err, DG_E_INVAL, "GPU %d: moe combine: %lld tokens "
                                         "x top-%d, H %d", dev, (long long)T, K, H);
    return combine(out, ys, ys_f32, slot_of, w, T, K, H, (cudaStream_t)stream, dev, err);
}

/* Every matrix of element type e (esz bytes) is addressed in bytes here:
 * its element offset times esz.  Nothing waits for the device and nothing
 * the host computes depends on the routing: the launches and their shapes
 * are a function of (T, K, H, I, n_exp) alone, so the sequence can be
 * captured in a CUDA graph. */
static int moe(struct dg_blas *b, enum dg_elt e, float *out, const void *x, int64_t T, int H,
               const int32_t *idx, const float *w, int K, int e0, int n_exp, int n_all, int I,
               const void *W_gu, const float *S_gu, const void *W_down, const float *S_down,
               int partial, void *scratch, dg_stream_t stream, struct dg_error *err)
{
    const int dev = dg_blas_device(b);
    const int64_t esz = dg_elt_size(e);
    const int64_t picks = T * K;
    const cudaStream_t st = (cudaStream_t)stream;
    unsigned char *sc = (unsigned char *)scratch;
    struct dg_moe_plan p;
    struct moe_layout l;
    int32_t *counts, *offsets, *slot_of;
    void **ptrs;
    int64_t batched;
    int at, direct, rc = 0;
    /* the experts' outputs in the element type (bf16 as a bf16 product
     * stores them: half fp32's bytes to write and to read again), but
     * partial sums (experts split along their width) in fp32: rounded
     * before the all-reduce adds them they cost FP8 at TP=4 argmax 250 ->
     * 241 of 256 against TP=1 (run 272) */
    const int ys_f32 = e == DG_ELT_F32 || partial;

    if ((e != DG_ELT_BF16 && e != DG_ELT_F32) || (S_gu && e != DG_ELT_BF16) || !S_gu != !S_down)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: element type %d%s", dev, (int)e,
                            S_gu || S_down ? " with FP8 experts" : "");
    if (S_gu && (!dg_cuda_fp8_gemm_fits(2 * (int64_t)I, H) || !dg_cuda_fp8_gemm_fits(H, I)))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: FP8 experts of width %d over %d "
                            "(the FP8 GEMM needs rows a multiple of 64, columns of 16)", dev, I,
                            H);
    if (T <= 0)
        return 0;
    if ((rc = check_shapes(T, H, K, I, e0, n_exp, n_all, &p, dev, err)) < 0)
        return rc;
    l = layout(&p, T, K, H, I, n_exp, (size_t)esz, S_gu != NULL);
    counts = (int32_t *)(sc + l.counts);
    offsets = (int32_t *)(sc + l.offsets);
    slot_of = (int32_t *)(sc + l.slot_of);
    ptrs = (void **)(sc + l.ptrs);
    batched = batched_of(e, &l, H, I, dev);
    /* FP8: the quantization of the picks' rows only (at), read straight
     * from x by token where it takes x's rows (direct), so that no gathered
     * copy is made.  (The bf16 wgmma product reading its rows by token was
     * slower than the gather and the product over the gathered rows: run
     * 107, batch 4 37.6 -> 38.9 ms.) */
    at = S_gu && dg_cuda_fp8_quantize_rows_at_fits(H, sc + l.xs, sc + l.q) &&
         dg_cuda_fp8_quantize_rows_at_fits(I, sc + l.gu, sc + l.q);
    direct = at && dg_cuda_fp8_quantize_rows_at_fits(H, x, sc + l.q);
    if ((rc = route(e, ys_f32, &l, batched, x, T, H, idx, K, e0, n_exp, I, W_gu, W_down, sc,
                    !direct, st, dev, err)) < 0)
        goto out;
    if (S_gu) {
        /* FP8 (W8A8): each expert's rows quantized per row, the grouped
         * E4M3 GEMM with the weights' row scales, the gelu output quantized
         * again for the down projection (fp8-gemm.h) */
        const int hint = p.hint;
        uint8_t *q = (uint8_t *)(sc + l.q);
        float *qs = (float *)(sc + l.qs);
        /* at: only the picks' rows (slot_of: a third of the padded rows
         * at batch 1), direct: read from their tokens' rows (the same
         * bytes), the gelu folded into the second quantization; the padded
         * rows' bytes are never read into a stored output */
        if (at && dg_cuda_fp8_experts_wgmma_fits(dev, I, H)) {
            /* Hopper: the two products and the hidden rows' quantization
             * in one launch, each expert's down tiles starting once its
             * hidden rows are quantized (fp8-wgmma.h) */
            if ((rc = direct ? dg_cuda_fp8_quantize_picks(e, q, qs, x, slot_of, picks, K, H,
                                                          stream, dev, err)
                             : dg_cuda_fp8_quantize_rows_at(e, q, qs, sc + l.xs, slot_of, picks,
                                                            H, 0, stream, dev, err)) < 0)
                goto out;
            rc = dg_cuda_fp8_experts_wgmma(sc + l.gu, sc + l.q2, (float *)(sc + l.qs2),
                                           sc + l.ys, ys_f32, q, qs, (const uint8_t *)W_gu, S_gu,
                                           (const uint8_t *)W_down, S_down, offsets, counts,
                                           (int32_t *)(sc + l.sync), n_exp, I, H, hint, stream,
                                           dev, err);
            if (rc < 0)
                goto out;
            goto combine;
        }
        if (at) {
            if ((rc = direct ? dg_cuda_fp8_quantize_picks(e, q, qs, x, slot_of, picks, K, H,
                                                          stream, dev, err)
                             : dg_cuda_fp8_quantize_rows_at(e, q, qs, sc + l.xs, slot_of, picks,
                                                            H, 0, stream, dev, err)) < 0 ||
                (rc = dg_cuda_fp8_gemm(sc + l.gu, 0, q, qs, (const uint8_t *)W_gu, S_gu, offsets,
                                       counts, n_exp, l.rows, 2 * (int64_t)I, H, hint, stream,
                                       dev, err)) < 0 ||
                (rc = dg_cuda_fp8_quantize_rows_at(e, q, qs, sc + l.gu, slot_of, picks, I, 1,
                                                   stream, dev, err)) < 0)
                goto out;
        } else if ((rc = dg_cuda_fp8_quantize_rows(e, q, qs, sc + l.xs, l.rows, H, stream, dev,
                                                   err)) < 0 ||
                   (rc = dg_cuda_fp8_gemm(sc + l.gu, 0, q, qs, (const uint8_t *)W_gu, S_gu,
                                          offsets, counts, n_exp, l.rows, 2 * (int64_t)I, H, hint,
                                          stream, dev, err)) < 0 ||
                   (rc = dg_cuda_gelu_mul_e(e, sc + l.hh, I, sc + l.gu, 2 * (int64_t)I,
                                            sc + l.gu + I * esz, 2 * (int64_t)I, l.rows, I,
                                            stream, dev, err)) < 0 ||
                   (rc = dg_cuda_fp8_quantize_rows(e, q, qs, sc + l.hh, l.rows, I, stream, dev,
                                                   err)) < 0) {
            goto out;
        }
        if ((rc = dg_cuda_fp8_gemm(sc + l.ys, ys_f32, q, qs, (const uint8_t *)W_down, S_down,
                                   offsets, counts, n_exp, l.rows, H, I, hint, stream, dev,
                                   err)) < 0)
            goto out;
    } else if (e == DG_ELT_BF16 && p.hint <= 128 &&
               dg_cuda_grouped_gemm_gelu_fits(I, H) && dg_cuda_grouped_gemm_fits(H, I)) {
        /* few rows an expert: one grouped GEMM each, every weight read
         * once, the first with the gelu in its epilogue (moe-gemm.h: the
         * same bits as the GEMM into [gate | up] and dg_cuda_gelu_mul_e) */
        const int hint = p.hint;
        if (dg_cuda_experts_wgmma_fits(dev, I, H)) {
            /* Hopper: both in one launch, each expert's down tiles
             * starting once its gate/up tiles are stored */
            if ((rc = dg_cuda_experts_wgmma(sc + l.hh, sc + l.ys, ys_f32, sc + l.xs, W_gu, W_down,
                                            offsets, counts, (int32_t *)(sc + l.sync), NULL,
                                            n_exp, I, H, hint, stream, dev, err)) < 0)
                goto out;
        } else if ((rc = dg_cuda_grouped_gemm_gelu(sc + l.hh, 0, sc + l.xs, W_gu, offsets, counts,
                                                   n_exp, I, H, hint, stream, dev, err)) < 0 ||
                   (rc = dg_cuda_grouped_gemm(sc + l.ys, ys_f32, sc + l.hh, W_down, offsets, counts,
                                              n_exp, H, I, hint, stream, dev, err)) < 0) {
            goto out;
        }
    } else {
        const int64_t I2 = 2 * (int64_t)I, nt = l.tiles;
        /* gu = xs W_gu^T, hh = gelu(gate) * up over every padded row, ys =
         * hh W_down^T (all three of type e): tile by tile, each with its
         * expert's weights, over the first `batched` tiles (pointer arrays
         * of nt); the rows past them, if any, through the one launch
         * (hh and ys alike, the bits of the grouped kernels, not cuBLAS's;
         * with none, its blocks return at once: ov_any) */
        if ((rc = dg_blas_gemm_batched_e(b, e, ptrs + 2 * nt, 0, (const void *const *)ptrs,
                                         l.ts, (const void *const *)(ptrs + nt), I2, H, H,
                                         batched, err)) < 0 ||
            (rc = dg_cuda_gelu_mul_e(e, sc + l.hh, I, sc + l.gu, I2, sc + l.gu + I * esz, I2,
                                     batched * l.ts, I, stream, dev, err)) < 0 ||
            (rc = dg_blas_gemm_batched_e(b, e, ptrs + 5 * nt, ys_f32,
                                         (const void *const *)(ptrs + 3 * nt), l.ts,
                                         (const void *const *)(ptrs + 4 * nt), H, I, I, batched,
                                         err)) < 0)
            goto out;
        if (batched < nt &&
            (rc = dg_cuda_experts_wgmma(sc + l.hh, sc + l.ys, ys_f32, sc + l.xs, W_gu, W_down,
                                        (const int32_t *)(sc + l.ov_offsets),
                                        (const int32_t *)(sc + l.ov_counts),
                                        (int32_t *)(sc + l.sync),
                                        (const int32_t *)(sc + l.ov_any), n_exp, I, H, 128,
                                        stream, dev, err)) < 0)
            goto out;
    }
combine:
    rc = combine(out, sc + l.ys, ys_f32, slot_of, w, T, K, H, st, dev, err);
out:
    return rc;
}

extern "C" int dg_cuda_moe_e(struct dg_blas *b, enum dg_elt e, float *out, const void *x,
                             int64_t T, int H, const int32_t *idx, const float *w, int K, int e0,
                             int n_exp, int n_all, int I, const void *W_gu, const void *W_down,
                             int partial, void *scratch, dg_stream_t stream, struct dg_error *err)
{
    return moe(b, e, out, x, T, H, idx, w, K, e0, n_exp, n_all, I, W_gu, NULL, W_down, NULL,
               partial, scratch, stream, err);
}

extern "C" int dg_cuda_moe_q(struct dg_blas *b, float *out, const uint16_t *x, int64_t T, int H,
                             const int32_t *idx, const float *w, int K, int e0, int n_exp,
                             int n_all, int I, const uint8_t *W_gu, const float *S_gu,
                             const uint8_t *W_down, const float *S_down, int partial,
                             void *scratch, dg_stream_t stream, struct dg_error *err)
{
    if (!S_gu || !S_down)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: FP8 experts without their scales",
                            dg_blas_device(b));
    return moe(b, DG_ELT_BF16, out, x, T, H, idx, w, K, e0, n_exp, n_all, I, W_gu, S_gu, W_down,
               S_down, partial, scratch, stream, err);
}

extern "C" int dg_cuda_moe(struct dg_blas *b, float *out, const uint16_t *x, int64_t T, int H,
                           const int32_t *idx, const float *w, int K, int e0, int n_exp,
                           int n_all, int I, const uint16_t *W_gu, const uint16_t *W_down,
                           void *scratch, dg_stream_t stream, struct dg_error *err)
{
    return dg_cuda_moe_e(b, DG_ELT_BF16, out, x, T, H, idx, w, K, e0, n_exp, n_all, I, W_gu,
                         W_down, 0, scratch, stream, err);
}
