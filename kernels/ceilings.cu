/* ceilings.cu - copy bandwidth and bf16 GEMM rate of one GPU, and beside
 * them the L2's read rate (ceilings.h). */
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

/* What one timed repeat runs, queued on st. */
struct repeat {
    int kind; /* COPY, GEMM or L2 */
    void *dst;
    const void *src, *src2; /* GEMM: C = dst, A = src, B = src2 */
    size_t bytes;
    struct dg_blas *blas;
    int n;      /* GEMM: n x n x n */
    int passes; /* L2: reads of the buffer a repeat */
    int blocks;
};
enum { COPY, GEMM, L2 };

static int queue_repeat(const struct repeat *w, cudaStream_t st, int dev, struct dg_error *err)
{
    switch (w->kind) {
    case COPY:
        return dg_cuda_copy_async(w->dst, w->src, w->bytes, (dg_stream_t)st, dev, err);
    case GEMM:
        return dg_blas_gemm_e(w->blas, DG_ELT_BF16, w->dst, 0, w->src, w->n, w->src2, 0, w->n,
                              w->n, w->n, 1.0f, 0.0f, err);
    default:
        return dg_cuda_l2_read(w->src, (int64_t)w->bytes, w->passes, (uint32_t *)w->dst,
                               w->blocks, (dg_stream_t)st, dev, err);
    }
}

/* The median of REPS timed repeats of w (after three untimed) in *ms,
 * timed with device events on st.  0, or a negative status with err set. */
static int median_ms(const struct repeat *w, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1,
                     double *ms_out, int dev, struct dg_error *err)
{
    float ms[REPS];
    int rc = 0;
    for (int r = -3; r < REPS; r++) {
        DG_CUDA_CHECK(cudaEventRecord(e0, st));
        if ((rc = queue_repeat(w, st, dev, err)) < 0)
            return rc;
        DG_CUDA_CHECK(cudaEventRecord(e1, st));
        DG_CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0)
            DG_CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    *ms_out = 0.5 * ((double)ms[REPS / 2 - 1] + (double)ms[REPS / 2]);
out:
    return rc;
}

extern "C" int dg_measure_ceilings(int dev, struct dg_ceilings *out, struct dg_error *err)
{
    const size_t copy = (size_t)1 << 30; /* each way: 2 GiB moved per repeat */
    const int n = 8192;
    const size_t mat = (size_t)n * n;
    /* the L2: 16 MiB (within an H100's 50 MB and an H200's) read 64 times
     * a repeat by as many 256-thread blocks as every multiprocessor holds;
     * the untimed repeats leave it in the L2 */
    const size_t l2 = (size_t)16 << 20;
    const int l2_passes = 64;
    void *src = NULL, *dst = NULL;
    uint16_t *A, *B, *C;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    struct dg_blas *blas = NULL;
    struct repeat w;
    double ms;
    int rc = 0, sms = 0, threads = 0;

    DG_CUDA_CHECK(cudaSetDevice(dev));
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    DG_CUDA_CHECK(cudaEventCreate(&e0));
    DG_CUDA_CHECK(cudaEventCreate(&e1));
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DG_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, dev));

    /* random bytes, not zeros */
    if ((rc = dg_cuda_alloc(&src, copy, dev, err)) < 0 ||
        (rc = dg_cuda_alloc(&dst, copy, dev, err)) < 0 ||
        (rc = dg_cuda_fill_normal((uint16_t *)src, (int64_t)(copy / 2), 7, 1, 0.0f, 1.0f,
                                  (dg_stream_t)st, dev, err)) < 0)
        goto out;
    w = (struct repeat){COPY, dst, src, NULL, copy, NULL, 0, 0, 0};
    if ((rc = median_ms(&w, st, e0, e1, &ms, dev, err)) < 0)
        goto out;
    out->copy_bytes = 2.0 * (double)copy;
    out->copy_gbps = out->copy_bytes / (ms * 1e-3) / 1e9;

    /* (src and dst, 1 GiB each, hold the GEMM's A and B (random, 128 MiB
     * each) and C; the L2's buffer is A's first 16 MiB, its sums dst's
     * first words) */
    A = (uint16_t *)src;
    B = A + mat;
    C = (uint16_t *)dst;
    if ((rc = dg_cuda_fill_normal(A, (int64_t)mat, 7, 2, 0.0f, 1.0f, (dg_stream_t)st, dev,
                                  err)) < 0 ||
        (rc = dg_cuda_fill_normal(B, (int64_t)mat, 7, 3, 0.0f, 1.0f, (dg_stream_t)st, dev,
                                  err)) < 0 ||
        (rc = dg_blas_create(dev, (dg_stream_t)st, &blas, err)) < 0)
        goto out;
    w = (struct repeat){GEMM, C, A, B, 0, blas, n, 0, 0};
    if ((rc = median_ms(&w, st, e0, e1, &ms, dev, err)) < 0)
        goto out;
    out->gemm_n = n;
    out->gemm_tflops = 2.0 * (double)n * n * n / (ms * 1e-3) / 1e12;

    w = (struct repeat){L2, dst, src, NULL, l2, NULL, 0, l2_passes,
                        sms * (threads / 256 > 0 ? threads / 256 : 1)};
    if ((rc = median_ms(&w, st, e0, e1, &ms, dev, err)) < 0)
        goto out;
    out->l2_bytes = (double)l2;
    out->l2_read_gbps = (double)l2_passes * (double)l2 / (ms * 1e-3) / 1e9;
out:
    dg_blas_destroy(blas);
    dg_cuda_free(src);
    dg_cuda_free(dst);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    return rc;
}
