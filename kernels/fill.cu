/* fill.cu - random normal weights on the GPU (see ops.h; reference:
 * lib/ref-fill.c). */
#include "kernels/ops.h"

#include <math.h>

#include "kernels/cuda-check.h"
#include "lib/philox.h"

#define FILL_THREADS 256
#define FILL_MAX_BLOCKS 4096 /* the grid strides beyond 2^20 pairs */
#define FILL_TWO_PI 6.28318530717958647692f

/* float -> bf16 bits, round to nearest even, NaN kept quiet: the same bit
 * arithmetic as dg_f32_to_bf16 (lib/dtype.h). */
__device__ static __forceinline__ uint16_t fill_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Grid-stride over the pairs j < ceil(n / 2).  Pair j is one Philox block:
 *     key     = (seed lo, seed hi),  counter = (j lo, j hi, tensor, 0)
 *     u1 = unit(out[0]), u2 = unit(out[1])       (dg_rand_unit: open (0, 1))
 *     r  = sqrtf(-2 logf(u1)),  t = 2 pi u2
 *     y[2j]   = bf16(mean + std * (r cosf(t)))
 *     y[2j+1] = bf16(mean + std * (r sinf(t)))   (when 2j + 1 < n)
 * All fp32, the accurate logf/sqrtf/cosf/sinf (not the __ intrinsics), and
 * every product and sum through __fmul_rn/__fadd_rn so nothing contracts to
 * an FMA: the same roundings as the CPU's, which differs only by the last
 * ulp or two of logf/cosf/sinf.  std == 0: bf16(mean) itself. */
__global__ static void fill_normal_kernel(uint16_t *y, int64_t n, int64_t pairs, uint32_t k0,
                                          uint32_t k1, uint32_t tensor, float mean, float std)
{
    const uint32_t key[2] = {k0, k1};
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < pairs; j += stride) {
        const int64_t i = 2 * j;
        uint16_t b0, b1;
        if (std == 0.0f) {
            b0 = b1 = fill_bf16(mean);
        } else {
            const uint32_t ctr[4] = {(uint32_t)(uint64_t)j, (uint32_t)((uint64_t)j >> 32), tensor,
                                     0u};
            uint32_t out[4];
            float u1, u2, r, t;
            dg_philox4x32_10(ctr, key, out);
            u1 = dg_rand_unit(out[0]);
            u2 = dg_rand_unit(out[1]);
            r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
            t = __fmul_rn(FILL_TWO_PI, u2);
            b0 = fill_bf16(__fadd_rn(mean, __fmul_rn(std, __fmul_rn(r, cosf(t)))));
            b1 = fill_bf16(__fadd_rn(mean, __fmul_rn(std, __fmul_rn(r, sinf(t)))));
        }
        y[i] = b0;
        if (i + 1 < n)
            y[i + 1] = b1;
    }
}

extern "C" int dg_cuda_fill_normal(uint16_t *y, int64_t n, uint64_t seed, uint32_t tensor,
                                   float mean, float std, dg_stream_t stream, int dev,
                                   struct dg_error *err)
{
    int rc = 0;
    int64_t pairs, blocks;
    if (n == 0)
        return 0;
    if (n < 0 || !y || !isfinite(mean) || !isfinite(std) || std < 0.0f)
        return dg_error_set(err, DG_E_INVAL,
                            "GPU %d: fill_normal: %lld values at %p, mean %g, std %g", dev,
                            (long long)n, (void *)y, (double)mean, (double)std);
    pairs = n / 2 + (n & 1);
    blocks = (pairs + FILL_THREADS - 1) / FILL_THREADS;
    if (blocks > FILL_MAX_BLOCKS)
        blocks = FILL_MAX_BLOCKS;
    fill_normal_kernel<<<(unsigned)blocks, FILL_THREADS, 0, (cudaStream_t)stream>>>(
        y, n, pairs, (uint32_t)seed, (uint32_t)(seed >> 32), tensor, mean, std);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
