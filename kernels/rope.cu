/* rope.cu - rotary position embedding in place (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

/* grid (T, n_heads), hd/2 threads (up to 256) striding over the pairs:
 *   angle = float(pos[t]) * f_i;  (a, b) = (x_i, x_{i+hd/2})
 *   x_i = a cos - b sin,  x_{i+hd/2} = b cos + a sin      (f_i = 0: untouched)
 * sincosf in fp32, as the reference's cosf/sinf.  x of bf16 or (T = float)
 * fp32 elements; the arithmetic is the same. */
template <typename T>
__global__ static void rope_kernel(T *x, const int64_t *pos, int n_heads, int hd,
                                   const float *inv_freq)
{
    const int half = hd / 2;
    T *v = x + ((int64_t)blockIdx.x * n_heads + blockIdx.y) * hd;
    const float p = (float)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = inv_freq[i];
        float s, c, a, b;
        if (f == 0.0f)
            continue;
        sincosf(p * f, &s, &c);
        a = dg_ld(v + i);
        b = dg_ld(v + (i + half));
        dg_st(v + i, a * c - b * s);
        dg_st(v + (i + half), b * c + a * s);
    }
}

extern "C" int dg_cuda_rope_e(enum dg_elt e, void *x, const int64_t *pos, int64_t T,
                              int n_heads, int hd, const float *inv_freq, dg_stream_t stream,
                              int dev, struct dg_error *err)
{
    int rc = 0;
    int threads;
    dim3 grid;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rope: element type %d", dev, (int)e);
    if (T <= 0)
        return 0;
    if (hd < 2 || hd % 2 || n_heads < 1 || n_heads > 65535 || T > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rope: %lld tokens, %d heads of %d", dev,
                            (long long)T, n_heads, hd);
    threads = hd / 2 < 256 ? (hd / 2 + 31) / 32 * 32 : 256;
    grid = dim3((unsigned)T, (unsigned)n_heads);
    if (e == DG_ELT_F32)
        rope_kernel<float><<<grid, threads, 0, (cudaStream_t)stream>>>((float *)x, pos, n_heads,
                                                                       hd, inv_freq);
    else
        rope_kernel<__nv_bfloat16><<<grid, threads, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)x, pos, n_heads, hd, inv_freq);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_rope(uint16_t *x, const int64_t *pos, int64_t T, int n_heads, int hd,
                            const float *inv_freq, dg_stream_t stream, int dev,
                            struct dg_error *err)
{
    return dg_cuda_rope_e(DG_ELT_BF16, x, pos, T, n_heads, hd, inv_freq, stream, dev, err);
}
