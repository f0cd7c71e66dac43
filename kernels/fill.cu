/* fill.cu - random normal weights on the GPU (see ops.h; reference:
 * lib/ref-fill.c). */
#include "kernels/ops.h"

#include <math.h>
#include <stdint.h>

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

/* The polar form of pair j's Philox block (one block per pair of elements):
 *     key     = (seed lo, seed hi),  counter = (j lo, j hi, tensor, 0)
 *     u1 = unit(out[0]), u2 = unit(out[1])       (dg_rand_unit: open (0, 1))
 *     r  = sqrtf(-2 logf(u1)),  t = 2 pi u2
 * All fp32, the accurate logf/sqrtf (not the __ intrinsics), every product
 * through __fmul_rn so nothing contracts to an FMA. */
__device__ static __forceinline__ void fill_polar(int64_t j, uint32_t k0, uint32_t k1,
                                                  uint32_t tensor, float *r, float *t)
{
    const uint32_t key[2] = {k0, k1};
    const uint32_t ctr[4] = {(uint32_t)(uint64_t)j, (uint32_t)((uint64_t)j >> 32), tensor, 0u};
    uint32_t out[4];
    float u1, u2;
    dg_philox4x32_10(ctr, key, out);
    u1 = dg_rand_unit(out[0]);
    u2 = dg_rand_unit(out[1]);
    *r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
    *t = __fmul_rn(FILL_TWO_PI, u2);
}

/* One element from its pair's r and its trig value (cosf(t) for the even
 * element, sinf(t) for the odd one): bf16(mean + std * (r * trig)), each
 * step one fp32 rounding (__fmul_rn/__fadd_rn, no FMA). */
__device__ static __forceinline__ uint16_t fill_value(float mean, float std, float r,
                                                      float trig)
{
    return fill_bf16(__fadd_rn(mean, __fmul_rn(std, __fmul_rn(r, trig))));
}

/* Grid-stride over the pairs j < ceil(n / 2).  Pair j is one Philox block
 * (fill_polar):
 *     y[2j]   = bf16(mean + std * (r cosf(t)))
 *     y[2j+1] = bf16(mean + std * (r sinf(t)))   (when 2j + 1 < n)
 * All fp32, the accurate logf/sqrtf/cosf/sinf (not the __ intrinsics), and
 * every product and sum through __fmul_rn/__fadd_rn so nothing contracts to
 * an FMA: the same roundings as the CPU's, which differs only by the last
 * ulp or two of logf/cosf/sinf.  std == 0: bf16(mean) itself. */
__global__ static void fill_normal_kernel(uint16_t *y, int64_t n, int64_t pairs, uint32_t k0,
                                          uint32_t k1, uint32_t tensor, float mean, float std)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < pairs; j += stride) {
        const int64_t i = 2 * j;
        uint16_t b0, b1;
        if (std == 0.0f) {
            b0 = b1 = fill_bf16(mean);
        } else {
            float r, t;
            fill_polar(j, k0, k1, tensor, &r, &t);
            b0 = fill_value(mean, std, r, cosf(t));
            b1 = fill_value(mean, std, r, sinf(t));
        }
        y[i] = b0;
        if (i + 1 < n)
            y[i + 1] = b1;
    }
}

/* A rows x cols slice of the stream, packed: grid-stride over the outputs
 * k < rows * cols, one element an iteration:
 *     r = k / cols, c = k % cols,  i = first + r ld + c    (the global index)
 *     j = i / 2:  (r_j, t_j) = fill_polar(j)
 *     y[k] = bf16(mean + std * (r_j cosf(t_j)))   i even
 *     y[k] = bf16(mean + std * (r_j sinf(t_j)))   i odd
 * the same helpers, so the same operations in the same order, as
 * fill_normal_kernel: y[k] is bit for bit element i of the 1-D fill of the
 * same (seed, tensor).  std == 0: bf16(mean) itself.  The caller has
 * checked that every i fits an int64_t. */
__global__ static void fill_normal_rect_kernel(uint16_t *y, int64_t total, int64_t cols,
                                               int64_t ld, int64_t first, uint32_t k0,
                                               uint32_t k1, uint32_t tensor, float mean,
                                               float std)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
        const int64_t row = k / cols, c = k - row * cols;
        const int64_t i = first + row * ld + c;
        if (std == 0.0f) {
            y[k] = fill_bf16(mean);
        } else {
            float r, t;
            fill_polar(i >> 1, k0, k1, tensor, &r, &t);
            y[k] = fill_value(mean, std, r, (i & 1) ? sinf(t) : cosf(t));
        }
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

extern "C" int dg_cuda_fill_normal_rect(uint16_t *y, int64_t rows, int64_t cols, int64_t ld,
                                        int64_t first, uint64_t seed, uint32_t tensor,
                                        float mean, float std, dg_stream_t stream, int dev,
                                        struct dg_error *err)
{
    int rc = 0;
    int64_t blocks;
    if (rows < 0 || cols < 0 || ld < 0 || first < 0)
        goto inval;
    if (rows == 0 || cols == 0)
        return 0;
    /* the outputs' count and the last global index, first + (rows - 1) ld +
     * cols - 1, must fit an int64_t */
    if (!y || (rows > 1 && cols > ld) || !isfinite(mean) || !isfinite(std) || std < 0.0f ||
        rows > INT64_MAX / cols || cols - 1 > INT64_MAX - first ||
        (rows > 1 && ld > 0 && rows - 1 > (INT64_MAX - first - (cols - 1)) / ld))
        goto inval;
    blocks = rows * cols / FILL_THREADS + (rows * cols % FILL_THREADS != 0);
    if (blocks > FILL_MAX_BLOCKS)
        blocks = FILL_MAX_BLOCKS;
    fill_normal_rect_kernel<<<(unsigned)blocks, FILL_THREADS, 0, (cudaStream_t)stream>>>(
        y, rows * cols, cols, ld, first, (uint32_t)seed, (uint32_t)(seed >> 32), tensor, mean,
        std);
    DG_LAUNCH_CHECK();
out:
    return rc;
inval:
    return dg_error_set(err, DG_E_INVAL,
                        "GPU %d: fill_normal_rect: %lld x %lld values (ld %lld, first %lld) at "
                        "%p, mean %g, std %g",
                        dev, (long long)rows, (long long)cols, (long long)ld, (long long)first,
                        (void *)y, (double)mean, (double)std);
}
