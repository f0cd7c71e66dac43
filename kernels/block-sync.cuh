/*
 * block-sync.cuh - blocks of one launch that wait for one another (the
 * experts' one launch: moe-wgmma.cu, fp8-wgmma.cu), through counters in
 * device memory that are zero when the launch starts.
 *
 * A block that waits must never wait on a block not yet placed on the
 * GPU, or the launch can hang: so a block takes a ticket (dg_block_ticket)
 * and does the work of that ticket, not of its blockIdx, and waits only on
 * work of smaller tickets, whose blocks took them first and so are
 * running or done.
 */
#ifndef DG_KERNELS_BLOCK_SYNC_CUH
#define DG_KERNELS_BLOCK_SYNC_CUH

#include <stdint.h>

/* The block's ticket: counter's value before the block's increment, the
 * same for every thread.  word: a shared int the block may reuse after. */
__device__ static inline int dg_block_ticket(int32_t *counter, int *word)
{
    if (threadIdx.x == 0)
        *word = atomicAdd(counter, 1);
    __syncthreads();
    return *word;
}

/* After every thread's stores of the block's work: adds 1 to *count with
 * those stores visible to the device before it (the fence after the
 * barrier), and returns the count before it, the same for every thread.
 * word: as dg_block_ticket's. */
__device__ static inline int dg_block_done(int32_t *count, int *word)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        *word = atomicAdd(count, 1);
        __threadfence(); /* (what others stored before their counts: seen after it) */
    }
    __syncthreads();
    return *word;
}

/* Sets *flag to 1 once every thread's stores are visible to the device. */
__device__ static inline void dg_block_release(int32_t *flag)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicExch(flag, 1);
    }
}

/* Waits until *count >= target (thread 0 polls with acquire loads; the
 * barrier after it holds the rest), so that what was stored before the
 * count reached it is seen after. */
__device__ static inline void dg_block_wait(const int32_t *count, int target)
{
    if (threadIdx.x == 0)
        for (;;) {
            int v;
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n"
                         : "=r"(v)
                         : "l"(count)
                         : "memory");
            if (v >= target)
                break;
            __nanosleep(256);
        }
    __syncthreads();
}

#endif
