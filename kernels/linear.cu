/* linear.cu - nn.Linear through cuBLAS, bf16 in, fp32 accumulate (see ops.h). */
#include "kernels/ops.h"

#include <stdlib.h>

#include "kernels/cuda-check.h"

struct dg_blas {
    cublasHandle_t h;
    int dev;
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
    free(b);
}

/* Row-major y[T, N] = x[T, K] W[N, K]^T is column-major
 *   Y (N x T, ld N) = op_T(W: K x N, ld ldw) . X (K x T, ld K)
 * so one GemmEx with A = W transposed, B = x as is. */
extern "C" int dg_blas_linear(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                              const uint16_t *W, int64_t N, int64_t K, int64_t ldw,
                              struct dg_error *err)
{
    const float one = 1.0f, zero = 0.0f;
    const int dev = b->dev;
    int rc = 0;
    if (T < 1 || N < 1 || K < 1 || ldw < K || T > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff || ldw > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: linear: [%lld x %lld] . [%lld x %lld]^T "
                            "(ld %lld)", dev, (long long)T, (long long)K, (long long)N,
                            (long long)K, (long long)ldw);
    DG_CUBLAS_CHECK(cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one,
                                 W, CUDA_R_16BF, (int)ldw, x, CUDA_R_16BF, (int)K, &zero, y,
                                 y_f32 ? CUDA_R_32F : CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
out:
    return rc;
}

/* Row-major y[T, N] = x[T, K] W[K, N] is column-major
 *   Y (N x T, ld N) = W (N x K, ld ldw) . X (K x T, ld K)
 * with neither operand transposed. */
extern "C" int dg_blas_matmul(struct dg_blas *b, void *y, int y_f32, const uint16_t *x, int64_t T,
                              const uint16_t *W, int64_t K, int64_t N, int64_t ldw,
                              struct dg_error *err)
{
    const float one = 1.0f, zero = 0.0f;
    const int dev = b->dev;
    int rc = 0;
    if (T < 1 || N < 1 || K < 1 || ldw < N || T > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff || ldw > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: matmul: [%lld x %lld] . [%lld x %lld] "
                            "(ld %lld)", dev, (long long)T, (long long)K, (long long)K,
                            (long long)N, (long long)ldw);
    DG_CUBLAS_CHECK(cublasGemmEx(b->h, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one,
                                 W, CUDA_R_16BF, (int)ldw, x, CUDA_R_16BF, (int)K, &zero, y,
                                 y_f32 ? CUDA_R_32F : CUDA_R_16BF, (int)N, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
out:
    return rc;
}
