/* router.cu - MoE router softmax and top-k (see ops.h). */
#include "kernels/ops.h"

#include <math.h>

#include "kernels/cuda-check.h"

#define ROUTER_WARPS 4

/* The warp's maximum and sum of v, in every lane (a butterfly: each step
 * adds the same two values in every lane pair, so every lane ends with the
 * same bits) */
__device__ static inline float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ static inline float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The warp's largest (best, be) over its lanes' pairs, the lower be on a
 * tie, in every lane */
__device__ static inline void warp_best(float &best, int &be)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ob > best || (ob == best && oe < be)) {
            best = ob;
            be = oe;
        }
    }
}

/* One warp per token.  Each lane holds logits e = lane, lane + 32, ...;
 *   m = max_e l_e (warp max), s = sum_e exp(l_e - m) (warp sum, fp32),
 *   K rounds: the largest l not yet taken (lower index on ties: the same
 *   order as p, since exp is monotonic), p_j = exp(l_j - m) / s;
 *   w_j = p_j / sum_j p_j * scale[e_j]. */
__global__ static void router_kernel(int32_t *idx, float *w, const float *logits, int64_t T,
                                     int E, int K, const float *scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    const float *l = logits + t * E;
    float m = -INFINITY, s = 0.0f, sel = 0.0f;
    float pk[32];
    int ek[32];

    if (t >= T)
        return;
    for (int e = lane; e < E; e += 32)
        m = fmaxf(m, l[e]);
    m = warp_max(m);
    for (int e = lane; e < E; e += 32)
        s += expf(l[e] - m);
    s = warp_sum(s);
    for (int k = 0; k < K; k++) {
        /* this lane's best untaken logit, then the warp's */
        float best = -INFINITY;
        int be = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= ek[j] == e;
            if (!taken && (l[e] > best || (l[e] == best && e < be))) {
                best = l[e];
                be = e;
            }
        }
        warp_best(best, be);
        ek[k] = be;
        pk[k] = expf(best - m) / s;
        sel += pk[k];
    }
    if (lane < K) {
        /* (K <= 32: lane k writes entry k; registers indexed by a lane
         * value go through local memory, fine for 8 entries) */
        idx[t * K + lane] = ek[lane];
        w[t * K + lane] = pk[lane] / sel * scale[ek[lane]];
    }
}

/* The same with each lane's logits in registers (e = lane + 32 r, r < RP:
 * E <= 32 RP): read once, a taken expert marked by a bit of its lane, and
 * pick k's id and weight kept by lane k.  The same comparisons and sums in
 * the same order: the same ids and weights, bit for bit. */
template <int RP>
__global__ static void router_regs_kernel(int32_t *idx, float *w, const float *logits,
                                          int64_t T, int E, int K, const float *scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    float lv[RP];
    float m = -INFINITY, s = 0.0f, sel = 0.0f, my_p = 0.0f;
    unsigned taken = 0;
    int my_e = 0;

    if (t >= T)
        return;
#pragma unroll
    for (int r = 0; r < RP; r++)
        lv[r] = lane + 32 * r < E ? logits[t * E + lane + 32 * r] : -INFINITY;
#pragma unroll
    for (int r = 0; r < RP; r++)
        if (lane + 32 * r < E)
            m = fmaxf(m, lv[r]);
    m = warp_max(m);
#pragma unroll
    for (int r = 0; r < RP; r++)
        if (lane + 32 * r < E)
            s += expf(lv[r] - m);
    s = warp_sum(s);
    for (int k = 0; k < K; k++) {
        float best = -INFINITY, p;
        int be = 0x7fffffff;
#pragma unroll
        for (int r = 0; r < RP; r++) {
            const int e = lane + 32 * r;
            if (e < E && !((taken >> r) & 1u) && (lv[r] > best || (lv[r] == best && e < be))) {
                best = lv[r];
                be = e;
            }
        }
        warp_best(best, be);
        if ((be & 31) == lane)
            taken |= 1u << (be >> 5);
        p = expf(best - m) / s;
        sel += p;
        if (lane == k) {
            my_e = be;
            my_p = p;
        }
    }
    if (lane < K) {
        idx[t * K + lane] = my_e;
        w[t * K + lane] = my_p / sel * scale[my_e];
    }
}

extern "C" int dg_cuda_router_topk(int32_t *idx, float *w, const float *logits, int64_t T, int E,
                                   int K, const float *per_expert_scale, dg_stream_t stream,
                                   int dev, struct dg_error *err)
{
    int rc = 0;
    if (T <= 0)
        return 0;
    if (E < 1 || K < 1 || K > 32 || K > E)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: router: top-%d of %d experts", dev, K, E);
    {
        const unsigned blocks = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
        const cudaStream_t st = (cudaStream_t)stream;
        if (E <= 32 * 4)
            router_regs_kernel<4><<<blocks, 32 * ROUTER_WARPS, 0, st>>>(idx, w, logits, T, E, K,
                                                                       per_expert_scale);
        else if (E <= 32 * 8)
            router_regs_kernel<8><<<blocks, 32 * ROUTER_WARPS, 0, st>>>(idx, w, logits, T, E, K,
                                                                       per_expert_scale);
        else
            router_kernel<<<blocks, 32 * ROUTER_WARPS, 0, st>>>(idx, w, logits, T, E, K,
                                                               per_expert_scale);
    }
    DG_LAUNCH_CHECK();
out:
    return rc;
}
