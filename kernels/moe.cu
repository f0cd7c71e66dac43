/* moe.cu - the mixture of experts over routed tokens (see ops.h;
 * reference: dg_ref_moe).  With fp32 elements (dg_cuda_moe_e) the gathered
 * rows, the gate/up projection and the gelu output are fp32 as well, the
 * GEMMs plain fp32; the experts' outputs and the ordered sum are fp32 for
 * both types. */
#include "kernels/ops.h"

#include <cuda_bf16.h>
#include <stdlib.h>

#include "kernels/cuda-check.h"

#define ALIGN(x) (((x) + 255) & ~(size_t)255)

/* the scratch's pieces, in order */
struct moe_layout {
    size_t counts, cursor, offsets, slot_of, row_token, xs, gu, hh, ys, total;
};

/* esz: bytes of one element of the gathered rows and the intermediates */
static struct moe_layout layout(int64_t T, int K, int H, int I, int n_exp, size_t esz)
{
    const size_t S = (size_t)T * K;
    struct moe_layout l;
    l.counts = 0;
    l.cursor = l.counts + ALIGN(sizeof(int32_t) * (size_t)n_exp);
    l.offsets = l.cursor + ALIGN(sizeof(int32_t) * (size_t)n_exp);
    l.slot_of = l.offsets + ALIGN(sizeof(int32_t) * (size_t)(n_exp + 1));
    l.row_token = l.slot_of + ALIGN(sizeof(int32_t) * S);
    l.xs = l.row_token + ALIGN(sizeof(int32_t) * S);
    l.gu = l.xs + ALIGN(esz * S * (size_t)H);
    l.hh = l.gu + ALIGN(esz * S * 2 * (size_t)I);
    l.ys = l.hh + ALIGN(esz * S * (size_t)I);
    l.total = l.ys + ALIGN(4 * S * (size_t)H);
    return l;
}

/* (an element type other than the two: sized as bf16; dg_cuda_moe_e
 * refuses it) */
extern "C" size_t dg_cuda_moe_scratch_e(enum dg_elt e, int64_t T, int K, int H, int I,
                                        int n_exp)
{
    return layout(T > 0 ? T : 1, K, H, I, n_exp, (size_t)dg_elt_size(e)).total;
}

extern "C" size_t dg_cuda_moe_scratch(int64_t T, int K, int H, int I, int n_exp)
{
    return dg_cuda_moe_scratch_e(DG_ELT_BF16, T, K, H, I, n_exp);
}

/* counts[e] = picks of expert e0 + e */
__global__ static void count_kernel(int32_t *counts, const int32_t *idx, int64_t picks, int e0,
                                    int n_exp)
{
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int e;
    if (p >= picks)
        return;
    e = idx[p] - e0;
    if (e >= 0 && e < n_exp)
        atomicAdd(&counts[e], 1);
}

/* each pick its slot in its expert's run (order within a run is free: rows
 * are independent), or -1 for another rank's expert */
__global__ static void fill_kernel(int32_t *slot_of, int32_t *row_token, int32_t *cursor,
                                   const int32_t *offsets, const int32_t *idx, int64_t picks,
                                   int K, int e0, int n_exp)
{
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int e;
    if (p >= picks)
        return;
    e = idx[p] - e0;
    if (e < 0 || e >= n_exp) {
        slot_of[p] = -1;
        return;
    }
    {
        const int32_t s = offsets[e] + atomicAdd(&cursor[e], 1);
        slot_of[p] = s;
        row_token[s] = (int32_t)(p / K);
    }
}

/* grid (rows, ceil(H / 256)): xs[s] = x[row_token[s]] (a copy: E is the
 * element type, bf16 or fp32) */
template <typename E>
__global__ static void gather_kernel(E *xs, const E *x, const int32_t *row_token, int H)
{
    const int64_t s = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < H)
        xs[s * H + i] = x[(int64_t)row_token[s] * H + i];
}

/* grid (T, ceil(H / 256)): out[t, i] = sum over k, in order, of w[t,k] ys[slot, i] */
__global__ static void combine_kernel(float *out, const float *ys, const int32_t *slot_of,
                                      const float *w, int K, int H)
{
    const int64_t t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    if (i >= H)
        return;
    for (int k = 0; k < K; k++) {
        const int32_t s = slot_of[t * K + k];
        if (s >= 0)
            acc += w[t * K + k] * ys[(int64_t)s * H + i];
    }
    out[t * H + i] = acc;
}

/* Every matrix of element type e (esz bytes) is addressed in bytes here:
 * its element offset times esz. */
extern "C" int dg_cuda_moe_e(struct dg_blas *b, enum dg_elt e, float *out, const void *x,
                             int64_t T, int H, const int32_t *idx, const float *w, int K, int e0,
                             int n_exp, int I, const void *W_gu, const void *W_down,
                             void *scratch, dg_stream_t stream, struct dg_error *err)
{
    const int dev = dg_blas_device(b);
    const int64_t esz = dg_elt_size(e);
    const struct moe_layout l = layout(T, K, H, I, n_exp, (size_t)esz);
    const int64_t picks = T * K;
    const cudaStream_t st = (cudaStream_t)stream;
    unsigned char *sc = (unsigned char *)scratch;
    int32_t *counts = (int32_t *)(sc + l.counts), *cursor = (int32_t *)(sc + l.cursor);
    int32_t *offsets = (int32_t *)(sc + l.offsets), *slot_of = (int32_t *)(sc + l.slot_of);
    int32_t *row_token = (int32_t *)(sc + l.row_token);
    unsigned char *xs = sc + l.xs, *gu = sc + l.gu, *hh = sc + l.hh;
    const unsigned char *wgu = (const unsigned char *)W_gu;
    const unsigned char *wdn = (const unsigned char *)W_down;
    float *ys = (float *)(sc + l.ys);
    int32_t *hc = NULL, *ho = NULL;
    int rc = 0;

    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: element type %d", dev, (int)e);
    if (T <= 0)
        return 0;
    if (H < 1 || I < 1 || K < 1 || n_exp < 1 || e0 < 0 || picks > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: moe: %lld tokens x top-%d, H %d, I %d, "
                            "%d experts", dev, (long long)T, K, H, I, n_exp);
    hc = (int32_t *)malloc(sizeof *hc * (size_t)n_exp);
    ho = (int32_t *)malloc(sizeof *ho * (size_t)(n_exp + 1));
    if (!hc || !ho) {
        rc = dg_error_set(err, DG_E_NOMEM, "GPU %d: moe: out of memory", dev);
        goto out;
    }
    DG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)n_exp, st));
    DG_CUDA_CHECK(cudaMemsetAsync(cursor, 0, sizeof(int32_t) * (size_t)n_exp, st));
    count_kernel<<<(unsigned)((picks + 255) / 256), 256, 0, st>>>(counts, idx, picks, e0, n_exp);
    DG_LAUNCH_CHECK();
    DG_CUDA_CHECK(cudaMemcpyAsync(hc, counts, sizeof *hc * (size_t)n_exp, cudaMemcpyDeviceToHost,
                                  st));
    DG_CUDA_CHECK(cudaStreamSynchronize(st));
    ho[0] = 0;
    for (int j = 0; j < n_exp; j++)
        ho[j + 1] = ho[j] + hc[j];
    DG_CUDA_CHECK(cudaMemcpyAsync(offsets, ho, sizeof *ho * (size_t)(n_exp + 1),
                                  cudaMemcpyHostToDevice, st));
    fill_kernel<<<(unsigned)((picks + 255) / 256), 256, 0, st>>>(slot_of, row_token, cursor,
                                                                 offsets, idx, picks, K, e0,
                                                                 n_exp);
    DG_LAUNCH_CHECK();
    if (ho[n_exp] > 0) {
        const dim3 grid((unsigned)ho[n_exp], (unsigned)((H + 255) / 256));
        if (e == DG_ELT_F32)
            gather_kernel<float><<<grid, 256, 0, st>>>((float *)xs, (const float *)x, row_token,
                                                       H);
        else
            gather_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(
                (__nv_bfloat16 *)xs, (const __nv_bfloat16 *)x, row_token, H);
        DG_LAUNCH_CHECK();
    }
    for (int j = 0; j < n_exp; j++) {
        const int64_t off = ho[j], n = hc[j], I2 = 2 * (int64_t)I;
        unsigned char *g = gu + off * I2 * esz, *h = hh + off * I * esz;
        if (n == 0)
            continue;
        /* gu = xs W_gu^T (type e), hh = gelu(gate) * up (type e), ys = hh W_down^T (fp32) */
        if ((rc = dg_blas_gemm_e(b, e, g, 0, xs + off * H * esz, n, wgu + j * I2 * H * esz, 0,
                                 I2, H, H, 1.0f, 0.0f, err)) < 0 ||
            (rc = dg_cuda_gelu_mul_e(e, h, I, g, I2, g + I * esz, I2, n, I, stream, dev,
                                     err)) < 0 ||
            (rc = dg_blas_gemm_e(b, e, ys + off * H, 1, h, n, wdn + (int64_t)j * H * I * esz, 0,
                                 H, I, I, 1.0f, 0.0f, err)) < 0)
            goto out;
    }
    combine_kernel<<<dim3((unsigned)T, (unsigned)((H + 255) / 256)), 256, 0, st>>>(
        out, ys, slot_of, w, K, H);
    DG_LAUNCH_CHECK();
    /* (ho must outlive its copy: wait before freeing it) */
    DG_CUDA_CHECK(cudaStreamSynchronize(st));
out:
    free(hc);
    free(ho);
    return rc;
}

extern "C" int dg_cuda_moe(struct dg_blas *b, float *out, const uint16_t *x, int64_t T, int H,
                           const int32_t *idx, const float *w, int K, int e0, int n_exp, int I,
                           const uint16_t *W_gu, const uint16_t *W_down, void *scratch,
                           dg_stream_t stream, struct dg_error *err)
{
    return dg_cuda_moe_e(b, DG_ELT_BF16, out, x, T, H, idx, w, K, e0, n_exp, I, W_gu, W_down,
                         scratch, stream, err);
}
