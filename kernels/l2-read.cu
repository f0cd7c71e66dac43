/* l2-read.cu - one buffer read many times over, for the read bandwidth of
 * the L2 (see ops.h; the ceilings in ceilings.cu).  Its reference is
 * dg_ref_word_sum (lib/ref-sum.c), which t-kernels-l2read checks. */
#include "kernels/ops.h"

#include "kernels/cuda-check.h"

#define L2R_THREADS 256

/* grid (blocks), L2R_THREADS threads.  The buffer as n 16-byte chunks c,
 * each four 32-bit words; thread t of block b takes chunks
 * c = b L2R_THREADS + t + k G L2R_THREADS (G = blocks, k = 0, 1, ...),
 * `passes` times over, and
 *     out[b] = sum over its passes and chunks of the chunk's four words
 *              (mod 2^32),
 * so that sum_b out[b] = passes * sum_i w[i] (mod 2^32) whatever the grid.
 * The loads go through the L1-bypassing path (ld.global.cg), so from the
 * second pass on a buffer that fits in the L2 is read from it. */
__global__ static void __launch_bounds__(L2R_THREADS)
    l2_read_kernel(const uint4 *p, int64_t n, int passes, uint32_t *out)
{
    __shared__ uint32_t warp_sums[L2R_THREADS / 32];
    const int64_t stride = (int64_t)gridDim.x * L2R_THREADS;
    uint32_t s = 0;
    for (int r = 0; r < passes; r++)
        for (int64_t c = (int64_t)blockIdx.x * L2R_THREADS + threadIdx.x; c < n; c += stride) {
            const uint4 v = __ldcg(p + c);
            s += v.x + v.y + v.z + v.w;
        }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t t = 0;
        for (int w = 0; w < L2R_THREADS / 32; w++)
            t += warp_sums[w];
        out[blockIdx.x] = t;
    }
}

extern "C" int dg_cuda_l2_read(const void *p, int64_t bytes, int passes, uint32_t *out,
                               int blocks, dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if (bytes <= 0 || (bytes & 15) || ((uintptr_t)p & 15) || !p || passes < 1 || blocks < 1 ||
        blocks > 65535 * 32 || !out)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: L2 read: %lld bytes at %p, %d passes, %d "
                            "blocks (a pointer and a size that are multiples of 16, at least "
                            "one pass and one block)", dev, (long long)bytes, p, passes,
                            blocks);
    l2_read_kernel<<<(unsigned)blocks, L2R_THREADS, 0, (cudaStream_t)stream>>>(
        (const uint4 *)p, bytes / 16, passes, out);
    DG_LAUNCH_CHECK();
out:
    return rc;
}
