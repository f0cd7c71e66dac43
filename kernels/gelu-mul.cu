/* gelu-mul.cu - the gated MLP's gelu(gate) * up (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"

/* grid (rows, ceil(n / 256)): out = gelu_tanh(g) * u in fp32, with
 *   gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). */
__global__ static void gelu_mul_kernel(__nv_bfloat16 *out, int64_t ld_out,
                                       const __nv_bfloat16 *gate, int64_t ld_gate,
                                       const __nv_bfloat16 *up, int64_t ld_up, int n)
{
    const int64_t r = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    float g, u;
    if (i >= n)
        return;
    g = __bfloat162float(gate[r * ld_gate + i]);
    u = __bfloat162float(up[r * ld_up + i]);
    g = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    out[r * ld_out + i] = __float2bfloat16(g * u);
}

extern "C" int dg_cuda_gelu_mul(uint16_t *out, int64_t ld_out, const uint16_t *gate,
                                int64_t ld_gate, const uint16_t *up, int64_t ld_up, int64_t rows,
                                int n, dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (rows <= 0)
        return 0;
    if (n < 1 || rows > 0x7fffffff || ld_out < n || ld_gate < n || ld_up < n)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: gelu_mul: %lld rows of %d", dev,
                            (long long)rows, n);
    gelu_mul_kernel<<<dim3((unsigned)rows, (unsigned)((n + 255) / 256)), 256, 0,
                      (cudaStream_t)stream>>>((__nv_bfloat16 *)out, ld_out,
                                              (const __nv_bfloat16 *)gate, ld_gate,
                                              (const __nv_bfloat16 *)up, ld_up, n);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
