/* device-probe.cu - see device-probe.h. */
#include "kernels/device-probe.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda-check.h"

#define GEMM_M 64
#define GEMM_N 48
#define GEMM_K 80
#define GUARD_WORDS 64
#define GUARD_PATTERN 0x5a5a5a5au

extern "C" int dg_gpu_count(int *n, struct dg_error *err)
{
    int dev = -1, rc = 0;
    cudaError_t e = cudaGetDeviceCount(n);

    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        cudaGetLastError(); /* clear */
        *n = 0;
        return 0;
    }
    DG_CUDA_CHECK(e);
out:
    return rc;
}

/* a small deterministic generator for the test matrices */
static float lcg_uniform(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

extern "C" int dg_gpu_probe(int dev, struct dg_gpu_info *info, struct dg_error *err)
{
    const int M = GEMM_M, N = GEMM_N, K = GEMM_K;
    const size_t c_words = (size_t)M * N + GUARD_WORDS;
    __nv_bfloat16 *ha = NULL, *hb = NULL, *da = NULL, *db = NULL;
    float *hc = NULL, *dc = NULL;
    cublasHandle_t handle = NULL;
    cudaDeviceProp prop;
    size_t mem_free = 0, mem_total = 0;
    const float alpha = 1.0f, beta = 0.0f;
    double num = 0, den = 0;
    unsigned seed = 12345u + (unsigned)dev;
    int rc = 0;

    memset(info, 0, sizeof *info);
    info->index = dev;
    DG_CUDA_CHECK(cudaSetDevice(dev));
    DG_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    DG_CUDA_CHECK(cudaMemGetInfo(&mem_free, &mem_total));
    DG_CUDA_CHECK(cudaRuntimeGetVersion(&info->runtime_version));
    DG_CUDA_CHECK(cudaDriverGetVersion(&info->driver_version));
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    DG_CUDA_CHECK(cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id, dev));
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->mem_total = mem_total;
    info->mem_free = mem_free;

    DG_CUBLAS_CHECK(cublasCreate(&handle));
    DG_CUBLAS_CHECK(cublasGetVersion(handle, &info->cublas_version));

    ha = (__nv_bfloat16 *)malloc(sizeof *ha * M * K);
    hb = (__nv_bfloat16 *)malloc(sizeof *hb * K * N);
    hc = (float *)malloc(sizeof *hc * c_words);
    if (!ha || !hb || !hc) {
        rc = dg_error_set(err, DG_E_NOMEM, "GPU %d: host allocation failed", dev);
        goto out;
    }
    for (int i = 0; i < M * K; i++)
        ha[i] = __float2bfloat16(lcg_uniform(&seed));
    for (int i = 0; i < K * N; i++)
        hb[i] = __float2bfloat16(lcg_uniform(&seed));

    DG_CUDA_CHECK(cudaMalloc((void **)&da, sizeof *da * M * K));
    DG_CUDA_CHECK(cudaMalloc((void **)&db, sizeof *db * K * N));
    DG_CUDA_CHECK(cudaMalloc((void **)&dc, sizeof *dc * c_words));
    DG_CUDA_CHECK(cudaMemcpy(da, ha, sizeof *da * M * K, cudaMemcpyHostToDevice));
    DG_CUDA_CHECK(cudaMemcpy(db, hb, sizeof *db * K * N, cudaMemcpyHostToDevice));
    /* poison C (0xff bytes are a NaN) and lay the guard words after it */
    DG_CUDA_CHECK(cudaMemset(dc, 0xff, sizeof *dc * M * N));
    {
        unsigned guard[GUARD_WORDS];
        for (int i = 0; i < GUARD_WORDS; i++)
            guard[i] = GUARD_PATTERN;
        DG_CUDA_CHECK(cudaMemcpy(dc + (size_t)M * N, guard, sizeof guard, cudaMemcpyHostToDevice));
    }

    /* column-major: A [M x K] lda M, B [K x N] ldb K, C [M x N] ldc M */
    DG_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &alpha, da,
                                 CUDA_R_16BF, M, db, CUDA_R_16BF, K, &beta, dc, CUDA_R_32F, M,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    DG_CUDA_CHECK(cudaMemcpy(hc, dc, sizeof *hc * c_words, cudaMemcpyDeviceToHost));

    for (int j = 0; j < N; j++) {
        for (int i = 0; i < M; i++) {
            double ref = 0, got = hc[(size_t)j * M + i];
            for (int k = 0; k < K; k++)
                ref += (double)__bfloat162float(ha[(size_t)k * M + i]) *
                       (double)__bfloat162float(hb[(size_t)j * K + k]);
            if (!isfinite(got)) {
                rc = dg_error_set(err, DG_E_CUBLAS,
                                  "GPU %d: GEMM left C[%d, %d] unwritten or non-finite", dev, i, j);
                goto out;
            }
            num += (got - ref) * (got - ref);
            den += ref * ref;
        }
    }
    for (int i = 0; i < GUARD_WORDS; i++) {
        unsigned w;
        memcpy(&w, &hc[(size_t)M * N + i], sizeof w);
        if (w != GUARD_PATTERN) {
            rc = dg_error_set(err, DG_E_CUBLAS, "GPU %d: GEMM wrote past C (guard word %d)", dev, i);
            goto out;
        }
    }
    info->gemm_rel_err = sqrt(num / (den > 0 ? den : 1));
    if (!(info->gemm_rel_err <= 1e-5))
        rc = dg_error_set(err, DG_E_CUBLAS, "GPU %d: bf16 GEMM relative error %.3g exceeds 1e-5",
                          dev, info->gemm_rel_err);
out:
    if (handle)
        cublasDestroy(handle);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    free(ha);
    free(hb);
    free(hc);
    return rc;
}

#define NCCL_COUNT (1u << 20)

/* pattern(i): small integers, so every partial sum is exact in fp32 */
static float pattern(size_t i) { return (float)(i % 251) - 125.0f; }

extern "C" int dg_nccl_probe(int ndev, int *version, struct dg_error *err)
{
    ncclComm_t *comms = NULL;
    cudaStream_t *streams = NULL;
    float **bufs = NULL, *host = NULL;
    int *devs = NULL, dev = -1, rc = 0;
    int comms_made = 0;

    if (ndev < 1)
        return dg_error_set(err, DG_E_INVAL, "dg_nccl_probe: ndev is %d", ndev);
    DG_NCCL_CHECK(ncclGetVersion(version));
    comms = (ncclComm_t *)calloc((size_t)ndev, sizeof *comms);
    streams = (cudaStream_t *)calloc((size_t)ndev, sizeof *streams);
    bufs = (float **)calloc((size_t)ndev, sizeof *bufs);
    devs = (int *)calloc((size_t)ndev, sizeof *devs);
    host = (float *)malloc(sizeof *host * NCCL_COUNT);
    if (!comms || !streams || !bufs || !devs || !host) {
        rc = dg_error_set(err, DG_E_NOMEM, "host allocation failed");
        goto out;
    }
    for (int r = 0; r < ndev; r++)
        devs[r] = r;
    DG_NCCL_CHECK(ncclCommInitAll(comms, ndev, devs));
    comms_made = 1;
    for (dev = 0; dev < ndev; dev++) {
        DG_CUDA_CHECK(cudaSetDevice(dev));
        DG_CUDA_CHECK(cudaStreamCreate(&streams[dev]));
        DG_CUDA_CHECK(cudaMalloc((void **)&bufs[dev], sizeof(float) * NCCL_COUNT));
        for (size_t i = 0; i < NCCL_COUNT; i++)
            host[i] = (float)(dev + 1) * pattern(i);
        DG_CUDA_CHECK(cudaMemcpy(bufs[dev], host, sizeof(float) * NCCL_COUNT,
                                 cudaMemcpyHostToDevice));
    }
    dev = -1;
    DG_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < ndev; r++)
        DG_NCCL_CHECK(ncclAllReduce(bufs[r], bufs[r], NCCL_COUNT, ncclFloat, ncclSum, comms[r],
                                    streams[r]));
    DG_NCCL_CHECK(ncclGroupEnd());
    for (dev = 0; dev < ndev; dev++) {
        const float scale = (float)(ndev * (ndev + 1) / 2);
        DG_CUDA_CHECK(cudaSetDevice(dev));
        DG_CUDA_CHECK(cudaStreamSynchronize(streams[dev]));
        DG_CUDA_CHECK(cudaMemcpy(host, bufs[dev], sizeof(float) * NCCL_COUNT,
                                 cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < NCCL_COUNT; i++) {
            if (host[i] != scale * pattern(i)) {
                rc = dg_error_set(err, DG_E_INTERNAL,
                                  "GPU %d: all-reduce element %zu is %g, expected %g", dev, i,
                                  (double)host[i], (double)(scale * pattern(i)));
                goto out;
            }
        }
    }
out:
    for (int r = 0; bufs && r < ndev; r++) {
        if (bufs[r] || streams[r]) {
            cudaSetDevice(r);
            cudaFree(bufs[r]);
            if (streams[r])
                cudaStreamDestroy(streams[r]);
        }
    }
    for (int r = 0; comms_made && r < ndev; r++)
        ncclCommDestroy(comms[r]);
    free(comms);
    free(streams);
    free(bufs);
    free(devs);
    free(host);
    return rc;
}
