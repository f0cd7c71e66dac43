/* rope.cu - rotary position embedding in place (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"

/* grid (T, n_heads), hd/2 threads (up to 256) striding over the pairs:
 *   angle = float(pos[t]) * f_i;  (a, b) = (x_i, x_{i+hd/2})
 *   x_i = a cos - b sin,  x_{i+hd/2} = b cos + a sin      (f_i = 0: untouched)
 * sincosf in fp32, as the reference's cosf/sinf. */
__global__ static void rope_kernel(__nv_bfloat16 *x, const int64_t *pos, int n_heads, int hd,
                                   const float *inv_freq)
{
    const int half = hd / 2;
    __nv_bfloat16 *v = x + ((int64_t)blockIdx.x * n_heads + blockIdx.y) * hd;
    const float p = (float)pos[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = inv_freq[i];
        float s, c, a, b;
        if (f == 0.0f)
            continue;
        sincosf(p * f, &s, &c);
        a = __bfloat162float(v[i]);
        b = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16(a * c - b * s);
        v[i + half] = __float2bfloat16(b * c + a * s);
    }
}

extern "C" int dg_cuda_rope(uint16_t *x, const int64_t *pos, int64_t T, int n_heads, int hd,
                            const float *inv_freq, dg_stream_t stream, int dev,
                            struct dg_error *err)
{
    int rc = 0;
    int threads;
    if (T <= 0)
        return 0;
    if (hd < 2 || hd % 2 || n_heads < 1 || n_heads > 65535 || T > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rope: %lld tokens, %d heads of %d", dev,
                            (long long)T, n_heads, hd);
    threads = hd / 2 < 256 ? (hd / 2 + 31) / 32 * 32 : 256;
    rope_kernel<<<dim3((unsigned)T, (unsigned)n_heads), threads, 0, (cudaStream_t)stream>>>(
        (__nv_bfloat16 *)x, pos, n_heads, hd, inv_freq);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
