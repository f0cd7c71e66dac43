/* linear.cu - nn.Linear through cuBLAS, bf16 (or fp32) in, fp32 accumulate (see ops.h). */
#include "kernels/ops.h"

#include <stdlib.h>

#include "kernels/cuda-check.h"

#define DG_BLAS_WORKSPACE ((size_t)32 << 20)

struct dg_blas {
    cublasHandle_t h;
    int dev;
    void *ws;                   /* the handle's workspace */
};

extern "C" int dg_blas_create(int dev, dg_stream_t stream, struct dg_blas **out,
                              struct dg_error *err)
{
    struct dg_blas *b = (struct dg_blas *)calloc(1, sizeof *b);
    int rc = 0;
    *out = NULL;
    if (!b)
        return dg_error_set(err, DG_E_NOMEM, "GPU %d: out of memory", dev);
    b->dev = dev;
    DG_CUBLAS_CHECK(cublasCreate(&b->h));
    DG_CUBLAS_CHECK(cublasSetStream(b->h, (cudaStream_t)stream));
    DG_CUBLAS_CHECK(cublasSetMathMode(b->h, CUBLAS_DEFAULT_MATH));
    /* a workspace of our own, so that no call allocates one while a CUDA
     * graph is being captured */
    DG_CUDA_CHECK(cudaMalloc(&b->ws, DG_BLAS_WORKSPACE));
    DG_CUBLAS_CHECK(cublasSetWorkspace(b->h, b->ws, DG_BLAS_WORKSPACE));
    *out = b;
    b = NULL;
out:
    dg_blas_destroy(b);
    return rc;
}

extern "C" int dg_blas_device(const struct dg_blas *b)
{
    return b->dev;
}

extern "C" void dg_blas_destroy(struct dg_blas *b)
{
    if (!b)
        return;
    if (b->h)
        cublasDestroy(b->h);
    cudaFree(b->ws);
    free(b);
}

/* Row-major y[T, N] = alpha x[T, K] op(W) + beta y is, column-major,
 *   Y (N x T, ld N) = alpha op'(W) . X (K x T, ld K) + beta Y
 * with op'(W) = W^T read as K x N (ld ldw) when W is [N, K] (nn.Linear),
 * and W itself, N x K (ld ldw), when W is [K, N]: one GemmEx, B = x as is.
 * bf16 elements: CUDA_R_16BF operands, fp32 accumulation (tensor cores).
 * fp32 elements: CUDA_R_32F operands with CUBLAS_COMPUTE_32F on a handle in
 * CUBLAS_DEFAULT_MATH (dg_blas_create), which cuBLAS computes in plain fp32:
 * TF32 tensor cores only with CUBLAS_TF32_TENSOR_OP_MATH or a _FAST_TF32
 * compute type, neither used here. */
extern "C" int dg_blas_gemm_e(struct dg_blas *b, enum dg_elt e, void *y, int y_f32,
                              const void *x, int64_t T, const void *W, int w_kn, int64_t N,
                              int64_t K, int64_t ldw, float alpha, float beta,
                              struct dg_error *err)
{
    const int dev = b->dev;
    const int64_t row = w_kn ? N : K; /* W's row length */
    cudaDataType_t et, yt;
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: gemm: element type %d", dev, (int)e);
    if (T < 1 || N < 1 || K < 1 || ldw < row || T > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff || ldw > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: gemm: [%lld x %lld] . %s[%lld x %lld] "
                            "(ld %lld)", dev, (long long)T, (long long)K, w_kn ? "" : "T",
                            (long long)(w_kn ? K : N), (long long)(w_kn ? N : K),
                            (long long)ldw);
    et = e == DG_ELT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    yt = y_f32 ? CUDA_R_32F : et;
    DG_CUBLAS_CHECK(cublasGemmEx(b->h, w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, (int)N,
                                 (int)T, (int)K, &alpha, W, et, (int)ldw, x, et, (int)K, &beta,
                                 y, yt, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
out:
    return rc;
}

/* The same for `count` problems at once (cublasGemmBatchedEx): problem i
 * is y_i = x_i W_i^T with x_i [m, K], W_i [N, K] (ld ldw), y_i [m, N];
 * the pointer arrays live on the device and are read when the GEMM runs,
 * so a kernel queued before may fill them. */
extern "C" int dg_blas_gemm_batched_e(struct dg_blas *b, enum dg_elt e, void *const *y,
                                      int y_f32, const void *const *x, int64_t m,
                                      const void *const *W, int64_t N, int64_t K, int64_t ldw,
                                      int64_t count, struct dg_error *err)
{
    const int dev = b->dev;
    const float alpha = 1.0f, beta = 0.0f;
    cudaDataType_t et, yt;
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: batched gemm: element type %d", dev,
                            (int)e);
    if (count < 1)
        return 0;
    if (m < 1 || N < 1 || K < 1 || ldw < K || m > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff || ldw > 0x7fffffff || count > 0x7fffffff || !y || !x || !W)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: batched gemm: %lld x [%lld x %lld] . "
                            "T[%lld x %lld] (ld %lld)", dev, (long long)count, (long long)m,
                            (long long)K, (long long)N, (long long)K, (long long)ldw);
    et = e == DG_ELT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    yt = y_f32 ? CUDA_R_32F : et;
    DG_CUBLAS_CHECK(cublasGemmBatchedEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)m, (int)K,
                                        &alpha, W, et, (int)ldw, x, et, (int)K, &beta, y, yt,
                                        (int)N, (int)count, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
out:
    return rc;
}

extern "C" int dg_blas_gemm(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                            const uint16_t *W, int w_kn, int64_t N, int64_t K, int64_t ldw,
                            float alpha, float beta, struct dg_error *err)
{
    return dg_blas_gemm_e(b, DG_ELT_BF16, y, y_f32, x, T, W, w_kn, N, K, ldw, alpha, beta, err);
}

extern "C" int dg_blas_linear(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                              const uint16_t *W, int64_t N, int64_t K, int64_t ldw,
                              struct dg_error *err)
{
    return dg_blas_gemm(b, y, y_f32, x, T, W, 0, N, K, ldw, 1.0f, 0.0f, err);
}

extern "C" int dg_blas_matmul(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                              const uint16_t *W, int64_t K, int64_t N, int64_t ldw,
                              struct dg_error *err)
{
    return dg_blas_gemm(b, y, y_f32, x, T, W, 1, N, K, ldw, 1.0f, 0.0f, err);
}
