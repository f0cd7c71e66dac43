/* l2-prefetch.cu - device memory fetched into the L2 ahead of the kernel
 * that reads it (see ops.h).  It computes nothing: its reference is the
 * identity (memory unchanged), which t-kernels-prefetch checks. */
#include "kernels/ops.h"

#include "kernels/cuda-check.h"

#define PF_CHUNK (64 * 1024) /* bytes one thread's bulk prefetch names */

/* one thread a chunk of 64 KB: cp.async.bulk.prefetch.L2 of bytes
 * [c, c + n) of p (16-aligned, n a multiple of 16), the lines marked
 * evict-last (an L2 line read normally is replaced before them); nothing
 * reaches the thread, nothing is written, and no thread waits */
__global__ static void l2_prefetch_kernel(const char *p, int64_t bytes)
{
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * PF_CHUNK;
    if (c >= bytes)
        return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    {
        const uint32_t n = (uint32_t)(bytes - c < PF_CHUNK ? bytes - c : PF_CHUNK);
        uint64_t policy;
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;"
                     ::"l"(p + c), "r"(n), "l"(policy) : "memory");
    }
#endif
}

extern "C" int dg_cuda_l2_prefetch(const void *p, int64_t bytes, dg_stream_t stream, int dev,
                                   struct dg_error *err)
{
    const cudaStream_t cs = (cudaStream_t)stream;
    int64_t chunks;
    int rc = 0;
    if (bytes < 0 || (bytes & 15) || ((uintptr_t)p & 15) || (bytes > 0 && !p))
        return dg_error_set(err, DG_E_INVAL, "GPU %d: L2 prefetch: %lld bytes at %p (a "
                            "pointer and a size that are multiples of 16)", dev,
                            (long long)bytes, p);
    if (bytes == 0)
        return 0;
    chunks = (bytes + PF_CHUNK - 1) / PF_CHUNK;
    if (chunks > (int64_t)0x7fffffff * 128)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: L2 prefetch: %lld bytes is too many", dev,
                            (long long)bytes);
    l2_prefetch_kernel<<<(unsigned)((chunks + 127) / 128), 128, 0, cs>>>((const char *)p, bytes);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
