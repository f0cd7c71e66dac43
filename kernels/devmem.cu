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
    cudaError_t e;
    *p = NULL;
    e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        /* not sticky: clear it, and say what did not fit */
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        *p = NULL;
        return dg_error_set(err, DG_E_NOMEM, "GPU %d: out of device memory for %.1f MiB "
                            "(%.1f of %.1f GiB free)", dev, (double)bytes / (1 << 20),
                            (double)free_b / (1 << 30), (double)total_b / (1 << 30));
    }
    DG_CUDA_CHECK(e);
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

extern "C" int dg_cuda_stream_create(dg_stream_t *s, int dev, struct dg_error *err)
{
    int rc = 0;
    cudaStream_t st = NULL;
    *s = NULL;
    DG_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *s = (dg_stream_t)st;
out:
    return rc;
}

extern "C" void dg_cuda_stream_destroy(dg_stream_t s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

extern "C" int dg_cuda_stream_sync(dg_stream_t s, int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s));
out:
    return rc;
}

extern "C" int dg_cuda_event_create(dg_cuda_event_t *ev, int dev, struct dg_error *err)
{
    int rc = 0;
    cudaEvent_t e = NULL;
    *ev = NULL;
    DG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = (dg_cuda_event_t)e;
out:
    return rc;
}

extern "C" int dg_cuda_event_create_timed(dg_cuda_event_t *ev, int dev, struct dg_error *err)
{
    int rc = 0;
    cudaEvent_t e = NULL;
    *ev = NULL;
    DG_CUDA_CHECK(cudaEventCreate(&e));
    *ev = (dg_cuda_event_t)e;
out:
    return rc;
}

extern "C" int dg_cuda_event_ms(dg_cuda_event_t a, dg_cuda_event_t b, double *ms, int dev,
                                struct dg_error *err)
{
    int rc = 0;
    float f = 0;
    cudaError_t e = cudaEventElapsedTime(&f, (cudaEvent_t)a, (cudaEvent_t)b);
    *ms = -1;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* (not sticky: not a failure of the device) */
        return 0;
    }
    DG_CUDA_CHECK(e);
    *ms = f;
out:
    return rc;
}

extern "C" void dg_cuda_event_destroy(dg_cuda_event_t ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int dg_cuda_stream_after(dg_stream_t b, dg_stream_t a, dg_cuda_event_t ev, int dev,
                                    struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)a));
    DG_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)b, (cudaEvent_t)ev, 0));
out:
    return rc;
}

extern "C" int dg_cuda_event_record(dg_cuda_event_t ev, dg_stream_t s, int dev,
                                    struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s));
out:
    return rc;
}

extern "C" int dg_cuda_event_sync(dg_cuda_event_t ev, int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
out:
    return rc;
}

extern "C" int dg_cuda_copy_async(void *dst, const void *src, size_t bytes, dg_stream_t s,
                                  int dev, struct dg_error *err)
{
    int rc = 0;
    if (!bytes)
        return 0;
    DG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s));
out:
    return rc;
}

extern "C" int dg_cuda_memset_async(void *p, int value, size_t bytes, dg_stream_t s, int dev,
                                    struct dg_error *err)
{
    int rc = 0;
    if (!bytes)
        return 0;
    DG_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, (cudaStream_t)s));
out:
    return rc;
}

extern "C" int dg_cuda_mem_info(size_t *free_bytes, size_t *total_bytes, int dev,
                                struct dg_error *err)
{
    int rc = 0, old = -1;
    /* dev's, whichever GPU the calling thread has current */
    DG_CUDA_CHECK(cudaGetDevice(&old));
    DG_CUDA_CHECK(cudaSetDevice(dev));
    DG_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
out:
    if (old >= 0 && old != dev) {
        /* the caller's GPU back (a failure here is reported unless one came first) */
        const cudaError_t e = cudaSetDevice(old);
        if (e != cudaSuccess && rc == 0)
            rc = dg_error_set(err, DG_E_CUDA, "GPU %d: setting GPU %d current again: %s (%s)",
                              dev, old, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return rc;
}

extern "C" int dg_cuda_healthy(int dev, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaSetDevice(dev));
    DG_CUDA_CHECK(cudaDeviceSynchronize());
    DG_CUDA_CHECK(cudaGetLastError());
out:
    return rc;
}

extern "C" int dg_cuda_pci_id(int dev, char *buf, size_t len, struct dg_error *err)
{
    int rc = 0;
    DG_CUDA_CHECK(cudaDeviceGetPCIBusId(buf, (int)len, dev));
    for (char *p = buf; *p; p++)
        if (*p >= 'A' && *p <= 'F')
            *p = (char)(*p - 'A' + 'a');
out:
    return rc;
}
