/* ceilings.cu - copy bandwidth and bf16 GEMM rate of one GPU (ceilings.h). */
#include "kernels/ceilings.h"

#include <stdlib.h>

#include "kernels/cuda-check.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"

#define REPS 20

static int cmp_f(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

extern "C" int dg_measure_ceilings(int dev, struct dg_ceilings *out, struct dg_error *err)
{
    const size_t copy = (size_t)1 << 30; /* each way: 2 GiB moved per repeat */
    const int n = 8192;
    const size_t mat = (size_t)n * n;
    void *src = NULL, *dst = NULL;
    uint16_t *A = NULL, *B = NULL, *C = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    struct dg_blas *blas = NULL;
    float ms[REPS];
    int rc = 0;

    DG_CUDA_CHECK(cudaSetDevice(dev));
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DG_CUDA_CHECK(cudaEventCreate(&e0));
    DG_CUDA_CHECK(cudaEventCreate(&e1));
    if ((rc = dg_cuda_alloc(&src, copy, dev, err)) < 0 ||
        (rc = dg_cuda_alloc(&dst, copy, dev, err)) < 0)
        goto out;
    /* random bytes, not zeros */
    if ((rc = dg_cuda_fill_normal((uint16_t *)src, (int64_t)(copy / 2), 7, 1, 0.0f, 1.0f,
                                  (dg_stream_t)st, dev, err)) < 0)
        goto out;
    for (int r = -3; r < REPS; r++) {
        DG_CUDA_CHECK(cudaEventRecord(e0, st));
        DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy, cudaMemcpyDeviceToDevice, st));
        DG_CUDA_CHECK(cudaEventRecord(e1, st));
        DG_CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0)
            DG_CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    out->copy_bytes = 2.0 * (double)copy;
    out->copy_gbps = out->copy_bytes / (0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]) * 1e-3) / 1e9;
    dg_cuda_free(src);
    dg_cuda_free(dst);
    src = dst = NULL;

    if ((rc = dg_cuda_alloc((void **)&A, 2 * mat, dev, err)) < 0 ||
        (rc = dg_cuda_alloc((void **)&B, 2 * mat, dev, err)) < 0 ||
        (rc = dg_cuda_alloc((void **)&C, 2 * mat, dev, err)) < 0 ||
        (rc = dg_cuda_fill_normal(A, (int64_t)mat, 7, 2, 0.0f, 1.0f, (dg_stream_t)st, dev,
                                  err)) < 0 ||
        (rc = dg_cuda_fill_normal(B, (int64_t)mat, 7, 3, 0.0f, 1.0f, (dg_stream_t)st, dev,
                                  err)) < 0 ||
        (rc = dg_blas_create(dev, (dg_stream_t)st, &blas, err)) < 0)
        goto out;
    for (int r = -3; r < REPS; r++) {
        DG_CUDA_CHECK(cudaEventRecord(e0, st));
        if ((rc = dg_blas_gemm_e(blas, DG_ELT_BF16, C, 0, A, n, B, 0, n, n, n, 1.0f, 0.0f,
                                 err)) < 0)
            goto out;
        DG_CUDA_CHECK(cudaEventRecord(e1, st));
        DG_CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0)
            DG_CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    out->gemm_n = n;
    out->gemm_tflops =
        2.0 * (double)n * n * n / (0.5 * (ms[REPS / 2 - 1] + ms[REPS / 2]) * 1e-3) / 1e12;
out:
    dg_blas_destroy(blas);
    dg_cuda_free(src);
    dg_cuda_free(dst);
    dg_cuda_free(A);
    dg_cuda_free(B);
    dg_cuda_free(C);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    return rc;
}
