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
#define STATS_CHUNK 8192 /* vocabulary ids per block */

/* (the per-chunk records are struct dg_row_stats, folded with the CPU's own
 * arithmetic: lib/row-stats-fold.h) */

/* One id i of row (global id v0 + i) into p: soft-capped (and written
 * back), skipped when non-finite (counted) or below th, then the online
 * (M, S, D) update: a new maximum l rescales by e = exp(M - l):
 *   D = e (D + S (M - l)),  S = e S;  then S += exp(l - M), D += exp(l - M)(l - M).
 * Returns whether the id was kept, with its l (for the Gumbel pick). */
__device__ static inline int stats_one(struct dg_row_stats *p, float *row, int64_t i, int64_t v0,
                                       float cap, float t, float th, float *l_out)
{
    float x = row[i], l;
    if (cap > 0.0f) { /* (an infinite logit becomes +-cap, as on the CPU) */
        x = cap * tanhf(x / cap);
        row[i] = x;
    }
    if (!isfinite(x)) {
        p->nonfinite++;
        return 0;
    }
    if (!(x >= th))
        return 0;
    l = x / t;
    if (p->argmax < 0 || l > p->max) {
        if (p->argmax >= 0) {
            const double d = (double)p->max - l, e = exp(d);
            p->dev = e * (p->dev + p->sum * d);
            p->sum *= e;
        }
        p->max = l;
        p->argmax = (int32_t)(v0 + i);
        p->argmax_val = l;
    }
    {
        const double d = (double)l - p->max, e = exp(d);
        p->sum += e;
        p->dev += e * d;
    }
    *l_out = l;
    return 1;
}

/* grid (chunks, rows).  Each thread takes the ids of one Philox block at a
 * time (4 consecutive global ids, v >> 2 equal), in ascending order,
 * through stats_one (so the first of equal maxima is kept); with sites it
 * picks the Gumbel-max sample among the kept ids, the block's four words
 * computed once, when the first of its ids is kept (each id's noise from
 * its own word of the block, as the CPU draws it).  Then a tree fold over the block;
 * one record per (row, chunk).  (Run 60, batch 1: the sampler and the
 * self-conditioning 2.13 ms a step with a Philox block per id, 1.88 this
 * way.) */
__global__ static void stats_kernel(struct dg_row_stats *parts, float *z, int64_t n, int64_t v0,
                                    float cap, const float *T, const float *tau,
                                    const struct dg_rand_site *sites, int chunks)
{
    __shared__ struct dg_row_stats sh[STATS_THREADS];
    const int64_t r = blockIdx.y;
    const int64_t lo = (int64_t)blockIdx.x * STATS_CHUNK;
    const int64_t hi = lo + STATS_CHUNK < n ? lo + STATS_CHUNK : n;
    const float t = T[r], th = tau[r];
    float *row = z + r * n;
    struct dg_row_stats p = {-INFINITY, 0.0, 0.0, -1, -INFINITY, -1, -INFINITY, 0};
    struct dg_rand_site site;
    uint32_t b[4];
    float l;
    /* the Philox blocks that cover global ids v0 + lo .. v0 + hi - 1 */
    const int64_t q_lo = (v0 + lo) >> 2, q_hi = (v0 + hi - 1) >> 2;

    if (sites)
        site = sites[r];
    for (int64_t q = q_lo + threadIdx.x; q <= q_hi; q += blockDim.x) {
        int have = 0;
        for (int u = 0; u < 4; u++) {
            const int64_t i = 4 * q + u - v0;
            if (i < lo || i >= hi || !stats_one(&p, row, i, v0, cap, t, th, &l) || !sites)
                continue;
            if (!have) {
                dg_rand_block(site.seed, (uint32_t)q, site.position, site.step, DG_RAND_GUMBEL,
                              site.canvas, b);
                have = 1;
            }
            dg_row_stats_pick(&p.sample, &p.sample_val, (int32_t)(v0 + i),
                              l + dg_gumbel(dg_rand_unit(b[u])));
        }
    }
    sh[threadIdx.x] = p;
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
        const dim3 grid((unsigned)chunks, (unsigned)rows);
        stats_kernel<<<grid, STATS_THREADS, 0, (cudaStream_t)stream>>>(
            (struct dg_row_stats *)scratch, z, n, v0, cap, T, tau, sites, (int)chunks);
        DG_LAUNCH_CHECK();
    }
    fold_kernel<<<(unsigned)((rows + 127) / 128), 128, 0, (cudaStream_t)stream>>>(
        out, (const struct dg_row_stats *)scratch, rows, (int)chunks, chunks, 1);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* grid (rows, ceil(n / 256)): p = exp(double(z / T) - M) / S as Elt (bf16
 * or fp32) for kept ids, 0 for the others (the reference's arithmetic,
 * rounded to fp32 once, then to bf16 for the bf16 form). */
template <typename Elt>
__global__ static void probs_kernel(Elt *p, const float *z, int64_t n, const float *T,
                                    const float *tau, const struct dg_row_stats *all)
{
    const int64_t r = blockIdx.x, i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    float x;
    if (i >= n)
        return;
    x = z[r * n + i];
    dg_st(&p[r * n + i],
                isfinite(x) && x >= tau[r]
                    ? (float)(exp((double)(x / T[r]) - (double)all[r].max) / all[r].sum)
                    : 0.0f);
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
    const dim3 grid((unsigned)rows, (unsigned)((n + 255) / 256));
    if (e == DG_ELT_F32)
        probs_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>((float *)p, z, n, T, tau,
                                                                   all);
    else
        probs_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)p, z, n, T, tau, all);
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
