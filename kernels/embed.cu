/* embed.cu - embedding gather and scale over a vocabulary slice, and the
 * gather of rows from anywhere (see ops.h). */
#include "kernels/ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

/* grid (T, ceil(dim / 256)): y[t, i] = emb[ids[t] - v0, i] * scale when the
 * id lies in this slice, else 0.  Product in fp32, rounded once (fp32
 * elements, T = float: not rounded). */
template <typename T>
__global__ static void embed_kernel(T *y, const int32_t *ids, const T *emb, int64_t v0,
                                    int64_t n_rows, int dim, float scale)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    const int64_t row = (int64_t)ids[t] - v0;
    if (i >= dim)
        return;
    dg_st(y + t * dim + i, row >= 0 && row < n_rows ? dg_ld(emb + row * dim + i) * scale : 0.0f);
}

extern "C" int dg_cuda_embed_e(enum dg_elt e, void *y, const int32_t *ids, int64_t T,
                               const void *emb, int64_t v0, int64_t n_rows, int dim, float scale,
                               dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    dim3 grid;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: embed: element type %d", dev, (int)e);
    if (T <= 0)
        return 0;
    if (dim < 1 || T > 0x7fffffff || n_rows < 0)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: embed: %lld tokens, dim %d, %lld rows",
                            dev, (long long)T, dim, (long long)n_rows);
    grid = dim3((unsigned)T, (unsigned)((dim + 255) / 256));
    if (e == DG_ELT_F32)
        embed_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>(
            (float *)y, ids, (const float *)emb, v0, n_rows, dim, scale);
    else
        embed_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)y, ids, (const __nv_bfloat16 *)emb, v0, n_rows, dim, scale);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_embed(uint16_t *y, const int32_t *ids, int64_t T, const uint16_t *emb,
                             int64_t v0, int64_t n_rows, int dim, float scale,
                             dg_stream_t stream, int dev, struct dg_error *err)
{
    return dg_cuda_embed_e(DG_ELT_BF16, y, ids, T, emb, v0, n_rows, dim, scale, stream, dev,
                           err);
}

/* grid (T, ceil(dim / 256)): y[t, i] = src[t][i], or 0 where src[t] is
 * NULL (a copy). */
template <typename T>
__global__ static void rows_gather_kernel(T *y, const void *const *src, int dim)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    const T *s = (const T *)src[t];
    if (i >= dim)
        return;
    y[t * dim + i] = s ? s[i] : T(0.0f);
}

extern "C" int dg_cuda_rows_gather_e(enum dg_elt e, void *y, const void *const *src, int64_t T,
                                     int dim, dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    dim3 grid;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rows_gather: element type %d", dev, (int)e);
    if (T <= 0)
        return 0;
    if (dim < 1 || T > 0x7fffffff || !y || !src)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: rows_gather: %lld rows of %d", dev,
                            (long long)T, dim);
    grid = dim3((unsigned)T, (unsigned)((dim + 255) / 256));
    if (e == DG_ELT_F32)
        rows_gather_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>((float *)y, src, dim);
    else
        rows_gather_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)y, src, dim);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
