/* embed.cu - embedding gather and scale over a vocabulary slice (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"

/* grid (T, ceil(dim / 256)): y[t, i] = emb[ids[t] - v0, i] * scale when the
 * id lies in this slice, else 0.  Product in fp32, rounded once. */
__global__ static void embed_kernel(__nv_bfloat16 *y, const int32_t *ids,
                                    const __nv_bfloat16 *emb, int64_t v0, int64_t n_rows,
                                    int dim, float scale)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    const int64_t row = (int64_t)ids[t] - v0;
    if (i >= dim)
        return;
    y[t * dim + i] = row >= 0 && row < n_rows
                         ? __float2bfloat16(__bfloat162float(emb[row * dim + i]) * scale)
                         : __float2bfloat16(0.0f);
}

extern "C" int dg_cuda_embed(uint16_t *y, const int32_t *ids, int64_t T, const uint16_t *emb,
                             int64_t v0, int64_t n_rows, int dim, float scale,
                             dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (T <= 0)
        return 0;
    if (dim < 1 || T > 0x7fffffff || n_rows < 0)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: embed: %lld tokens, dim %d, %lld rows",
                            dev, (long long)T, dim, (long long)n_rows);
    embed_kernel<<<dim3((unsigned)T, (unsigned)((dim + 255) / 256)), 256, 0,
                   (cudaStream_t)stream>>>((__nv_bfloat16 *)y, ids,
                                           (const __nv_bfloat16 *)emb, v0, n_rows, dim, scale);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
