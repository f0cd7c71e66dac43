/* devmem.cu - device memory for C callers (see devmem.h). */
#include "kernels/devmem.h"

#include "kernels/cuda-check.h"

extern "C" int dg_cuda_use(int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaSetDevice(dev));
out:
    return rc;
}

extern "C" int dg_cuda_alloc(void **p, size_t bytes, int dev, struct dg_error *err)
{
    int rc = 0;
    *p = NULL;
    DG_CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1));
out:
    return rc;
}

extern "C" void dg_cuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

extern "C" int dg_cuda_upload(void *dst, const void *src, size_t bytes, int dev,
                              struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
out:
    return rc;
}

extern "C" int dg_cuda_download(void *dst, const void *src, size_t bytes, int dev,
                                struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
out:
    return rc;
}

extern "C" int dg_cuda_memset(void *p, int value, size_t bytes, int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaMemset(p, value, bytes));
out:
    return rc;
}

extern "C" int dg_cuda_sync(int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaDeviceSynchronize());
out:
    return rc;
}
