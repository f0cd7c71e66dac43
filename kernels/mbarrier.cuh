/*
 * mbarrier.cuh - Hopper's shared-memory barriers (mbarrier) between the
 * warps of one block that fill buffers and the warps that read them, and
 * cp.async copies counted on such a barrier.
 *
 * The protocol, for a ring of buffers each with a "full" and an "empty"
 * barrier: the filling warp waits for a buffer's empty barrier (skipped on
 * the ring's first round), issues its copies and makes each of its lanes
 * arrive on the full barrier once those copies land
 * (dg_mbar_arrive_cp: full's count is the lanes that copy); the reading
 * warps wait for the full barrier's phase, fence (the copies are generic
 * proxy writes, wgmma reads through the async proxy), read, and arrive on
 * the empty barrier (its count: the readers that arrive).  A barrier's
 * phase parity flips each time its count of arrivals is reached, so a
 * waiter on round n of a ring of S buffers waits for parity (n / S) & 1.
 *
 * sm_90 and later; the host side uses these only where the device is
 * (the wgmma kernels' check, wgmma.cuh).
 */
#ifndef DG_KERNELS_MBARRIER_CUH
#define DG_KERNELS_MBARRIER_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DG_MBAR_ASM(...) asm volatile(__VA_ARGS__)
#else
#define DG_MBAR_ASM(...) __trap()
#endif

/* barrier bar (shared address, 8-byte aligned) for `count` arrivals a
 * phase; then dg_mbar_init_fence and a block barrier before any use */
__device__ static inline void dg_mbar_init(uint32_t bar, uint32_t count)
{
    DG_MBAR_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* the barriers' initialisation made visible (to the copies' arrivals) */
__device__ static inline void dg_mbar_init_fence(void)
{
    DG_MBAR_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* one arrival on bar */
__device__ static inline void dg_mbar_arrive(uint32_t bar)
{
    DG_MBAR_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* one arrival on bar once every cp.async this thread issued before has
 * landed (the count not raised: it is one of the phase's arrivals) */
__device__ static inline void dg_mbar_arrive_cp(uint32_t bar)
{
    DG_MBAR_ASM("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

/* wait until bar's phase of parity `parity` has completed */
__device__ static inline void dg_mbar_wait(uint32_t bar, uint32_t parity)
{
    DG_MBAR_ASM("{\n"
                ".reg .pred done;\n"
                "DG_MBAR_WAIT_%=:\n"
                "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                "@!done bra DG_MBAR_WAIT_%=;\n"
                "}\n" ::"r"(bar),
                "r"(parity)
                : "memory");
}

#endif
