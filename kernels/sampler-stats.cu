/* sampler-stats.cu - the sampler's per-row statistics over a vocabulary
 * slice, soft-cap included (see ops.h; reference: lib/sampler.c). */
#include "kernels/ops.h"

#include <cuda_bf16.h>
#include <math.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"
#include "lib/philox.h"
#include "lib/row-stats-fold.h"
#include "lib/sampler.h"

#define STATS_THREADS 256
/* vocabulary ids per block: 128 a thread.  Run 100, batch 1 (256 rows of
 * 262,144): 0.618 ms at 8,192, 0.552 at 32,768, 0.938 at 2,048. */
#define STATS_CHUNK 32768

/* (the per-chunk records are struct dg_row_stats, folded with the CPU's own
 * arithmetic: lib/row-stats-fold.h) */

/* x / c, rounded as IEEE division, with c's reciprocal taken once: the
 * division's own fast sequence (the code nvcc emits for div.rn.f32 when
 * its range check passes),
 *   r0 = rcp.approx(c), r = r0 + r0 (1 - c r0);  q = x r, q += r (x - c q),
 * where no step can leave the normal range: |c| in [2^-20, 2^20] (the
 * caller's `fast`) and |x| in [2^-64, 2^64] or 0.  Elsewhere (infinite or
 * NaN logits, tiny or huge values, a temperature or cap out of that range)
 * the plain division. */
struct fdiv {
    float c, r;
    int fast;
};

__device__ static inline struct fdiv fdiv_prep(float c)
{
    struct fdiv d;
    float r0;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r0) : "f"(c));
    d.c = c;
    d.r = fmaf(r0, fmaf(-c, r0, 1.0f), r0);
    d.fast = fabsf(c) >= 0x1p-20f && fabsf(c) <= 0x1p20f;
    return d;
}

__device__ static inline float fdiv_by(struct fdiv d, float x)
{
    const float ax = fabsf(x);
    if (d.fast && ax <= 0x1p64f && (ax >= 0x1p-64f || x == 0.0f)) {
        const float q = x * d.r;
        return fmaf(d.r, fmaf(-d.c, q, x), q);
    }
    return x / d.c;
}

/* Order-preserving map of floats (not NaN) to signed ints, and back, for
 * the warp's max through one redux.sync. */
__device__ static inline int32_t f2key(float f)
{
    const int32_t b = __float_as_int(f);
    return b >= 0 ? b : b ^ 0x7fffffff;
}

__device__ static inline float key2f(int32_t k)
{
    return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff);
}

/* the largest f over the warp (every lane taking part) */
__device__ static inline float warp_fmax(float f)
{
    return key2f(__reduce_max_sync(0xffffffffu, f2key(f)));
}

/* Gumbel noise is below 17 (-log(-log u) at the largest u, 1 - 2^-24, is
 * 16.64), so an id with fl(l + 32) < a value some id reached cannot win:
 * rounding is monotonic, fl(l + g) <= fl(l + 32) < best.  Such ids skip
 * their noise and Philox block; the pick is the same. */
#define GUMBEL_SKIP 32.0f

/* Whether an id of logit l and uniform u surely loses to a value best
 * (finite) that some id reached, decided without the exact noise's two
 * logarithms.  The id wins only if fl(l + g) >= best, g = -log(-log u) in
 * fp32 within 3e-6 of the true value (two logf of at most 1 ulp; |g| < 17).
 * With A = -ln u and B = exp(l - best), g < best - l - m exactly when
 * A > B e^m; the test takes A from lg2.approx (absolute error below
 * 2^-22.6 in log2 units, and relative 6e-8 from the scaling) and B from
 * ex2.approx (__expf: 2 + 1.2 |l - best| units in the last place, and
 * fl(l - best)'s own rounding: together below 2e-5 relative while
 * |l - best| < 150):
 *   A' > B' (1 + 2^-12) + 4e-7   implies   A > B (1 + 2.2e-4) > B e^(2e-4).
 * (Below l - best = -87, B' is 0 or subnormal and the 4e-7 alone is the
 * margin; past +88, B' is infinite and the test never holds, nor could it:
 * A < 16.7.)  So l + g is more than 1e-4 below best, and fl(l + g) < best
 * while best's unit in the last place is below that (|best| < 1024): the
 * id loses even a tie, and is skipped without changing the pick.  Where
 * the test does not hold, the exact noise decides. */
__device__ static inline int gumbel_loses(float u, float l, float best)
{
    const float A = -__log2f(u) * 0.693147181f;
    const float B = __expf(l - best);
    return fabsf(best) < 1024.0f && A > fmaf(B, 1.0f + 1.0f / 4096.0f, 4e-7f);
}

/* grid (chunks, rows).  Each thread takes the ids of one Philox block at a
 * time (4 consecutive global ids, v >> 2 equal), a warp 32 consecutive
 * blocks, lanes past the slice's last block idle but in step.  Per block:
 *   - soft-cap x = cap tanh(x / cap) (written back), non-finite ids counted
 *     and skipped, ids below th skipped, l = x / T for the rest (kept);
 *   - argmax: the thread's first largest l (ids ascending);
 *   - (M, S, D) online in fp32 with M the warp's running maximum (one
 *     redux a block, so every lane rescales together, no lane alone):
 *     when M rises to M', e = exp(M - M'), D = e (D + S (M - M')), S = e S;
 *     then S += exp(l - M), D += exp(l - M)(l - M) for each kept l;
 *   - with sites, the Gumbel-max sample among kept ids: ids that surely
 *     lose to the warp's best value so far (GUMBEL_SKIP, before the Philox
 *     block; gumbel_loses, after it) are skipped, the rest get their exact
 *     noise from their own word of the block (as the CPU draws it) and
 *     compete in the thread (ids ascending, so ties keep the lower id).
 * A thread's record has M (the warp's, reached by one of its ids) and its
 * own argmax and sample; the block folds its 256 in a tree, one record
 * per (row, chunk), whose max is the chunk's.  fp32 against the
 * reference's double: each exponential within a few units in the last
 * place, a thread's 128 terms summed with the same sign: at most 127
 * roundings of 2^-24 (7.6e-6 relative) in the worst case, about 1e-6 for
 * roundings of random sign (t-kernels-sampler's bound is 1e-5).  VEC:
 * every block whole inside the slice and 16-byte aligned (one load, no
 * per-id bounds).  Offsets within a row are 32-bit (v0 + n < 2^31,
 * checked by the caller).  Bound by issuing instructions, so 4 blocks a
 * multiprocessor (run 104: 0.557 -> 0.509 ms at batch 1 against 3).  Run
 * 103 counted about 190 instructions an id, most in lanes that took the
 * exact noise or a new maximum alone; with the warp's maximum and best
 * value shared, run 126 counts about 135 (0.413 ms at batch 1). */
template <int VEC>
__global__ static void __launch_bounds__(STATS_THREADS, 4)
    stats_kernel(struct dg_row_stats *parts, float *z, int32_t n, int32_t v0, float cap,
                 const float *T, const float *tau, const struct dg_rand_site *sites, int chunks)
{
    __shared__ struct dg_row_stats sh[STATS_THREADS];
    const int r = blockIdx.y, lane = threadIdx.x & 31;
    const int32_t lo = (int32_t)blockIdx.x * STATS_CHUNK;
    const int32_t hi = n - lo > STATS_CHUNK ? lo + STATS_CHUNK : n;
    const float th = tau[r];
    const struct fdiv dt = fdiv_prep(T[r]), dc = fdiv_prep(cap);
    float *row = z + (int64_t)r * n;
    /* the Philox blocks that cover global ids v0 + lo .. v0 + hi - 1 */
    const int32_t q_lo = (v0 + lo) >> 2, nq = ((v0 + hi - 1) >> 2) - q_lo + 1;
    float M = -INFINITY, S = 0.0f, D = 0.0f, amax_v = -INFINITY, smp_v = -INFINITY;
    float best = -INFINITY; /* the warp's best sample value so far */
    int32_t amax = -1, smp = -1;
    int64_t bad = 0;
    struct dg_rand_site site;

    if (sites)
        site = sites[r];
    for (int32_t k = (int32_t)(threadIdx.x & ~31u); k < nq; k += STATS_THREADS) {
        const int32_t q = q_lo + k + lane, i0 = 4 * q - v0;
        const int on = k + lane < nq;
        float x[4], l[4], m = -INFINITY;
        unsigned keep = 0;
        if (on) {
            if (VEC) {
                const float4 v = *(const float4 *)(row + i0);
                x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
            } else {
                for (int u = 0; u < 4; u++)
                    x[u] = i0 + u >= lo && i0 + u < hi ? row[i0 + u] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                l[u] = -INFINITY;
                if (!VEC && (i0 + u < lo || i0 + u >= hi))
                    continue;
                if (cap > 0.0f) /* (an infinite logit becomes +-cap, as on the CPU) */
                    x[u] = cap * tanhf(fdiv_by(dc, x[u]));
                if (!isfinite(x[u])) {
                    bad++;
                    continue;
                }
                if (!(x[u] >= th))
                    continue;
                l[u] = fdiv_by(dt, x[u]);
                keep |= 1u << u;
                if (l[u] > amax_v || amax < 0) {
                    amax_v = l[u];
                    amax = v0 + i0 + u;
                }
                m = fmaxf(m, l[u]);
            }
            if (cap > 0.0f) { /* the soft-capped logits back */
                if (VEC)
                    *(float4 *)(row + i0) = make_float4(x[0], x[1], x[2], x[3]);
                else
                    for (int u = 0; u < 4; u++)
                        if (i0 + u >= lo && i0 + u < hi)
                            row[i0 + u] = x[u];
            }
        }
        m = warp_fmax(fmaxf(m, M));
        if (m > M) { /* the same on every lane */
            if (M > -INFINITY) {
                const float d = M - m, e = expf(d);
                D = e * fmaf(S, d, D);
                S *= e;
            }
            M = m;
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (keep >> u & 1) {
                const float d = l[u] - M, e = expf(d);
                S += e;
                D = fmaf(e, d, D);
            }
        if (!sites)
            continue;
        {
            uint32_t b[4];
            int have = 0;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float w, val;
                if (!(keep >> u & 1) || l[u] + GUMBEL_SKIP < best)
                    continue;
                if (!have) {
                    dg_rand_block(site.seed, (uint32_t)q, site.position, site.step,
                                  DG_RAND_GUMBEL, site.canvas, b);
                    have = 1;
                }
                w = dg_rand_unit(b[u]);
                if (best > -INFINITY && gumbel_loses(w, l[u], best))
                    continue;
                val = l[u] + dg_gumbel(w);
                dg_row_stats_pick(&smp, &smp_v, v0 + i0 + u, val);
                best = fmaxf(best, smp_v);
            }
        }
        best = warp_fmax(best);
    }
    sh[threadIdx.x] = (struct dg_row_stats){M, S, D, amax, amax_v, smp, smp_v, bad};
    __syncthreads();
    for (int s = STATS_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            dg_row_stats_fold(&sh[threadIdx.x], &sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        parts[(int64_t)r * chunks + blockIdx.x] = sh[0];
}

/* one thread per row r: fold its parts c = 0 .. n_parts-1, at
 * parts[r * row_stride + c * part_stride], in order (dg_row_stats_fold) */
__global__ static void fold_kernel(struct dg_row_stats *out, const struct dg_row_stats *parts,
                                   int64_t rows, int n_parts, int64_t row_stride,
                                   int64_t part_stride)
{
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    struct dg_row_stats a;
    if (r >= rows)
        return;
    a = parts[r * row_stride];
    for (int c = 1; c < n_parts; c++)
        dg_row_stats_fold(&a, &parts[r * row_stride + c * part_stride]);
    out[r] = a;
}

extern "C" int dg_cuda_row_stats_fold(struct dg_row_stats *out, const struct dg_row_stats *parts,
                                      int64_t rows, int n_parts, dg_stream_t stream, int dev,
                                      struct dg_error *err)
{
    int rc = 0;
    if (rows <= 0)
        return 0;
    if (n_parts < 1 || rows > 0x7fffffff || !out || !parts)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: row_stats_fold: %lld rows of %d parts", dev,
                            (long long)rows, n_parts);
    fold_kernel<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)stream>>>(
        out, parts, rows, n_parts, 1, rows);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" size_t dg_cuda_row_stats_scratch(int64_t rows, int64_t n)
{
    const int64_t chunks = n > 0 ? (n + STATS_CHUNK - 1) / STATS_CHUNK : 1;
    return (size_t)(rows > 0 ? rows : 1) * (size_t)chunks * sizeof(struct dg_row_stats);
}

extern "C" int dg_cuda_row_stats(struct dg_row_stats *out, float *z, int64_t rows, int64_t n,
                                 int64_t v0, float cap, const float *T, const float *tau,
                                 const struct dg_rand_site *sites, void *scratch,
                                 dg_stream_t stream, int dev, struct dg_error *err)
{
    const int64_t chunks = (n + STATS_CHUNK - 1) / STATS_CHUNK;
    int rc = 0;
    if (rows <= 0)
        return 0;
    if (n < 1 || rows > 65535 || chunks > 0x7fffffff || v0 < 0 || v0 + n > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: row_stats: %lld rows of %lld ids from %lld",
                            dev, (long long)rows, (long long)n, (long long)v0);
    {
        /* every Philox block whole and 16-byte aligned: one load a block */
        const int vec = v0 % 4 == 0 && n % 4 == 0 && (uintptr_t)z % 16 == 0;
        const dim3 grid((unsigned)chunks, (unsigned)rows);
        auto kernel = vec ? stats_kernel<1> : stats_kernel<0>;
        kernel<<<grid, STATS_THREADS, 0, (cudaStream_t)stream>>>(
            (struct dg_row_stats *)scratch, z, (int32_t)n, (int32_t)v0, cap, T, tau, sites,
            (int)chunks);
        DG_LAUNCH_CHECK();
    }
    fold_kernel<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)stream>>>(
        out, (const struct dg_row_stats *)scratch, rows, (int)chunks, chunks, 1);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

#define PROBS_PER 8 /* ids a thread in the vector form: two 16-byte loads */

/* p = exp(z / T - M) / S for kept ids (finite, >= tau), 0 for the others,
 * in fp32: expf of the fp32 difference, times 1 / S rounded to fp32 once a
 * thread.  Against the reference's double exponential and division: a few
 * units in the last place where z / T is near M, growing with |z / T - M|
 * (its rounding) where the probabilities are small: the vector of a row
 * stays within about 1e-7 relative (t-kernels-sampler's bound is 1e-6). */
__device__ static inline float prob_one(float x, float t, float th, float M, float inv_s)
{
    return isfinite(x) && x >= th ? expf(x / t - M) * inv_s : 0.0f;
}

/* grid (rows, ceil(n / 256)): one id a thread (any n, any alignment) */
template <typename Elt>
__global__ static void probs_kernel(Elt *p, const float *z, int64_t n, const float *T,
                                    const float *tau, const struct dg_row_stats *all)
{
    const int64_t r = blockIdx.x, i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    dg_st(&p[r * n + i], prob_one(z[r * n + i], T[r], tau[r], all[r].max,
                                  (float)(1.0 / all[r].sum)));
}

/* grid (rows, ceil(n / (256 PROBS_PER))): PROBS_PER consecutive ids a
 * thread through 16-byte loads and stores (n a multiple of PROBS_PER, z and
 * p 16-byte aligned); 1 / S once a thread */
template <typename Elt>
__global__ static void probs_vec_kernel(Elt *p, const float *z, int64_t n, const float *T,
                                        const float *tau, const struct dg_row_stats *all)
{
    const int64_t r = blockIdx.x;
    const int64_t i = ((int64_t)blockIdx.y * blockDim.x + threadIdx.x) * PROBS_PER;
    const float t = T[r], th = tau[r], M = all[r].max;
    float x[PROBS_PER], y[PROBS_PER];
    float inv_s;
    if (i >= n)
        return;
    inv_s = (float)(1.0 / all[r].sum);
    dg_ld8(z + r * n + i, x);
#pragma unroll
    for (int u = 0; u < PROBS_PER; u++)
        y[u] = prob_one(x[u], t, th, M, inv_s);
    dg_st8(p + r * n + i, y);
}

/* The probabilities written as e: bf16 (dg_cuda_row_probs) or fp32, the
 * operand of the self-conditioning product of an fp32 plan. */
extern "C" int dg_cuda_row_probs_e(enum dg_elt e, void *p, const float *z, int64_t rows,
                                   int64_t n, const float *T, const float *tau,
                                   const struct dg_row_stats *all, dg_stream_t stream, int dev,
                                   struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: row_probs: element type %d", dev, (int)e);
    if (rows <= 0)
        return 0;
    if (n < 1 || rows > 0x7fffffff || (n + 255) / 256 > 65535)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: row_probs: %lld rows of %lld", dev,
                            (long long)rows, (long long)n);
    if (n % PROBS_PER == 0 && ((uintptr_t)p | (uintptr_t)z) % 16 == 0) {
        const int64_t per_block = 256 * PROBS_PER;
        const dim3 grid((unsigned)rows, (unsigned)((n + per_block - 1) / per_block));
        if (e == DG_ELT_F32)
            probs_vec_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>((float *)p, z, n, T,
                                                                           tau, all);
        else
            probs_vec_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
                (__nv_bfloat16 *)p, z, n, T, tau, all);
    } else {
        const dim3 grid((unsigned)rows, (unsigned)((n + 255) / 256));
        if (e == DG_ELT_F32)
            probs_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>((float *)p, z, n, T, tau,
                                                                       all);
        else
            probs_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
                (__nv_bfloat16 *)p, z, n, T, tau, all);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_row_probs(uint16_t *p, const float *z, int64_t rows, int64_t n,
                                 const float *T, const float *tau, const struct dg_row_stats *all,
                                 dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_row_probs_e(DG_ELT_BF16, p, z, rows, n, T, tau, all, stream, dev, err);
}
