/* gelu-mul.cu - the gated MLP's gelu(gate) * up (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

/* grid (rows, ceil(n / 256)): out = gelu_tanh(g) * u in fp32, with
 *   gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))),
 * stored as T (bf16: rounded once, at the store; fp32: as computed). */
template <typename T>
__global__ static void gelu_mul_kernel(T *out, int64_t ld_out, const T *gate, int64_t ld_gate,
                                       const T *up, int64_t ld_up, int n)
{
    const int64_t r = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    float g, u;
    if (i >= n)
        return;
    g = dg_ld(gate + r * ld_gate + i);
    u = dg_ld(up + r * ld_up + i);
    dg_st(out + r * ld_out + i, dg_gelu_tanh_f(g) * u);
}

extern "C" int dg_cuda_gelu_mul_e(enum dg_elt e, void *out, int64_t ld_out, const void *gate,
                                  int64_t ld_gate, const void *up, int64_t ld_up, int64_t rows,
                                  int n, dg_stream_t stream, int dev, struct dg_error *err)
{
    const cudaStream_t cs = (cudaStream_t)stream;
    dim3 grid;
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: gelu_mul: element type %d", dev, (int)e);
    if (rows <= 0)
        return 0;
    if (n < 1 || rows > 0x7fffffff || ld_out < n || ld_gate < n || ld_up < n)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: gelu_mul: %lld rows of %d", dev,
                            (long long)rows, n);
    grid = dim3((unsigned)rows, (unsigned)((n + 255) / 256));
    if (e == DG_ELT_F32)
        gelu_mul_kernel<float><<<grid, 256, 0, cs>>>((float *)out, ld_out, (const float *)gate,
                                                     ld_gate, (const float *)up, ld_up, n);
    else
        gelu_mul_kernel<__nv_bfloat16><<<grid, 256, 0, cs>>>(
            (__nv_bfloat16 *)out, ld_out, (const __nv_bfloat16 *)gate, ld_gate,
            (const __nv_bfloat16 *)up, ld_up, n);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_gelu_mul(uint16_t *out, int64_t ld_out, const uint16_t *gate,
                                int64_t ld_gate, const uint16_t *up, int64_t ld_up, int64_t rows,
                                int n, dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_gelu_mul_e(DG_ELT_BF16, out, ld_out, gate, ld_gate, up, ld_up, rows, n,
                              stream, dev, err);
}
