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

/* One thread's running statistics over the ids it has seen, in fp32 (see
 * stats_one); turned into a struct dg_row_stats (double S and D) for the
 * block's fold. */
struct stats_acc {
    float max, sum, dev; /* M, S and D relative to M */
    int32_t argmax, sample;
    float sample_val;
    int64_t nonfinite;
};

/* One id of row (global id `id`), logit x, into a: soft-capped (returned
 * through *x, for the write-back), skipped when non-finite (counted) or
 * below th, then the online (M, S, D) update in fp32: a new maximum l
 * rescales by e = exp(M - l):
 *   D = e (D + S (M - l)),  S = e S;  then S += exp(l - M), D += exp(l - M)(l - M).
 * Returns whether the id was kept, with its l (for the Gumbel pick).
 * fp32 against the reference's double: each exponential within a few
 * units in the last place, a thread's 128 terms summed with the same
 * sign: at most 127 roundings of 2^-24 (7.6e-6 relative) in the worst
 * case, about 1e-6 for roundings of random sign (t-kernels-sampler's
 * bound is 1e-5). */
__device__ static inline int stats_one(struct stats_acc *a, float *x, int32_t id, float cap,
                                       float t, float th, float *l_out)
{
    float l;
    if (cap > 0.0f) /* (an infinite logit becomes +-cap, as on the CPU) */
        *x = cap * tanhf(*x / cap);
    if (!isfinite(*x)) {
        a->nonfinite++;
        return 0;
    }
    if (!(*x >= th))
        return 0;
    l = *x / t;
    if (a->argmax < 0 || l > a->max) {
        if (a->argmax >= 0) {
            const float d = a->max - l, e = expf(d);
            a->dev = e * fmaf(a->sum, d, a->dev);
            a->sum *= e;
        }
        a->max = l;
        a->argmax = id;
    }
    {
        const float d = l - a->max, e = expf(d);
        a->sum += e;
        a->dev = fmaf(e, d, a->dev);
    }
    *l_out = l;
    return 1;
}

/* Gumbel noise is below 17 (-log(-log u) at the largest u, 1 - 2^-24, is
 * 16.64), so an id with fl(l + 32) < the pick so far cannot win: rounding
 * is monotonic, fl(l + g) <= fl(l + 32) < best.  Such ids skip their
 * noise and Philox block; the pick is the same. */
#define GUMBEL_SKIP 32.0f

/* grid (chunks, rows).  Each thread takes the ids of one Philox block at a
 * time (4 consecutive global ids, v >> 2 equal; one 16-byte load where the
 * slice starts on a block), in ascending order, through stats_one (so the
 * first of equal maxima is kept); with sites it picks the Gumbel-max
 * sample among the kept ids, the block's four words computed once, when
 * the first of its ids that can still win is kept (each id's noise from
 * its own word of the block, as the CPU draws it).  Then a tree fold over
 * the block; one record per (row, chunk).  (Run 60, batch 1: the sampler
 * and the self-conditioning 2.13 ms a step with a Philox block per id,
 * 1.88 this way.)  Bound by issuing instructions (run 103: 71% of the
 * issue slots, about 190 instructions an id), so 4 blocks a
 * multiprocessor (64 registers, 8 bytes spilled) where 71 registers held
 * it to 3: run 104, batch 1, 0.557 -> 0.509 ms (5 blocks, 48 registers:
 * 0.525). */
__global__ static void __launch_bounds__(STATS_THREADS, 4)
    stats_kernel(struct dg_row_stats *parts, float *z, int64_t n, int64_t v0, float cap,
                 const float *T, const float *tau, const struct dg_rand_site *sites, int chunks,
                 int vec)
{
    __shared__ struct dg_row_stats sh[STATS_THREADS];
    const int64_t r = blockIdx.y;
    const int64_t lo = (int64_t)blockIdx.x * STATS_CHUNK;
    const int64_t hi = lo + STATS_CHUNK < n ? lo + STATS_CHUNK : n;
    const float t = T[r], th = tau[r];
    float *row = z + r * n;
    struct stats_acc a = {-INFINITY, 0.0f, 0.0f, -1, -1, -INFINITY, 0};
    struct dg_rand_site site;
    uint32_t b[4];
    /* the Philox blocks that cover global ids v0 + lo .. v0 + hi - 1 */
    const int64_t q_lo = (v0 + lo) >> 2, q_hi = (v0 + hi - 1) >> 2;

    if (sites)
        site = sites[r];
    for (int64_t q = q_lo + threadIdx.x; q <= q_hi; q += blockDim.x) {
        const int64_t i0 = 4 * q - v0;
        float x[4], l;
        int have = 0;
        if (vec) {
            const float4 v = *(const float4 *)(row + i0);
            x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
        } else {
            for (int u = 0; u < 4; u++)
                x[u] = i0 + u >= lo && i0 + u < hi ? row[i0 + u] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (i0 + u < lo || i0 + u >= hi ||
                !stats_one(&a, &x[u], (int32_t)(v0 + i0 + u), cap, t, th, &l) || !sites ||
                (a.sample >= 0 && l + GUMBEL_SKIP < a.sample_val))
                continue;
            if (!have) {
                dg_rand_block(site.seed, (uint32_t)q, site.position, site.step, DG_RAND_GUMBEL,
                              site.canvas, b);
                have = 1;
            }
            dg_row_stats_pick(&a.sample, &a.sample_val, (int32_t)(v0 + i0 + u),
                              l + dg_gumbel(dg_rand_unit(b[u])));
        }
        if (cap > 0.0f) { /* the soft-capped logits back */
            if (vec)
                *(float4 *)(row + i0) = make_float4(x[0], x[1], x[2], x[3]);
            else
                for (int u = 0; u < 4; u++)
                    if (i0 + u >= lo && i0 + u < hi)
                        row[i0 + u] = x[u];
        }
    }
    sh[threadIdx.x] = (struct dg_row_stats){a.max, a.sum, a.dev, a.argmax, a.max, a.sample,
                                            a.sample_val, a.nonfinite};
    __syncthreads();
    for (int s = STATS_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            dg_row_stats_fold(&sh[threadIdx.x], &sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        parts[r * chunks + blockIdx.x] = sh[0];
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
        stats_kernel<<<grid, STATS_THREADS, 0, (cudaStream_t)stream>>>(
            (struct dg_row_stats *)scratch, z, n, v0, cap, T, tau, sites, (int)chunks, vec);
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
