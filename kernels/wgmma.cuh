/*
 * wgmma.cuh - Hopper's warpgroup matrix products (wgmma.mma_async, sm_90a)
 * as PTX, for the kernels that use them (moe-wgmma.cu, fp8-wgmma.cu): the
 * shared-memory matrix descriptor, the fences, and m64nN products with
 * fp32 accumulators (bf16 k16, E4M3 k32) for the N the kernels take.
 *
 * Operands live in shared memory in the 128-byte swizzled K-major layout:
 * rows of 128 bytes (64 bf16 or 128 E4M3 values), 16-byte chunk c of row
 * r stored at chunk c ^ (r % 8) of the row, groups of 8 rows 1,024 bytes
 * apart, the tile 1,024-byte aligned.  One descriptor covers a tile's rows; the k-th
 * 32 bytes of K are the same descriptor with its address 32 k bytes on
 * (the swizzle applies to the address bits, as the copies wrote them).
 *
 * (E4M3 operands take no transpose arguments: K-major is the only layout.)
 *
 * The accumulators of a warpgroup's 64 x N product, thread t (warp w = t /
 * 32, lane l: gid = l / 4, tig = l % 4): d[4 c + e] is row 16 w + gid + 8
 * (e / 2), column 8 c + 2 tig + e % 2 (mma.sync's C layout, N / 8 times).
 */
#ifndef DG_KERNELS_WGMMA_CUH
#define DG_KERNELS_WGMMA_CUH

#include <stdint.h>

#include "kernels/mma.cuh"

/* wgmma exists on sm_90a only: the build's portable PTX (compute_90)
 * gets a trap instead, and the host side launches these kernels only on
 * a device of compute capability 9.0 (dg_wgmma_device) */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DG_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define DG_WGMMA_ASM(...) __trap()
#endif

/* Whether device dev runs sm_90a code (compute capability 9.0), on the
 * host; 0 where it cannot say. */
static inline int dg_wgmma_device(int dev)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* (not sticky: clear it) */
        return 0;
    }
    return major == 9 && minor == 0;
}

/* the descriptor of a 128-byte-swizzled K-major tile at shared address a
 * (1,024-aligned but for the k offset): start a / 16, leading offset 1
 * (unused with this swizzle), stride 1,024 / 16 between 8-row groups,
 * swizzle mode 1 (128 bytes) */
__device__ static inline uint64_t dg_wgmma_desc(uint32_t a)
{
    return (uint64_t)((a & 0x3ffff) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* the descriptor of a 128-byte-swizzled tile read N-major (wgmma's B
 * transposed: the K rows of 128 bytes hold 64 consecutive N values each,
 * as dg_swz128 stores them): start a / 16, leading offset `lbo` bytes
 * between the tile's 64-column sub-tiles (along N), stride 1,024 / 16
 * between 8-row groups (along K), swizzle mode 1 */
__device__ static inline uint64_t dg_wgmma_desc_n(uint32_t a, uint32_t lbo)
{
    return (uint64_t)((a & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* the descriptor d (either form above) moved `off` bytes on (a multiple
 * of 16): the same as building it at a + off, while a + off stays in the
 * shared window (below 256 KB), in one add */
__device__ static inline uint64_t dg_wgmma_desc_add(uint64_t d, uint32_t off)
{
    /* a + off < 256 KB keeps the start field (bits 0-13) from carrying
     * into the fields above it, so a 32-bit add on the low word does: it
     * spares the 64-bit add (two instructions and a carry) beside every
     * wgmma */
    return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (off >> 4));
}

/* where a 128-byte-swizzled tile keeps 16-byte chunk c of row r */
__device__ static inline uint32_t dg_swz128(int r, int c)
{
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* The block's dynamic shared memory from its first 1,024-aligned byte
 * (the swizzled tiles' alignment; the launch asks for 1,024 bytes more
 * than the tiles take), its shared address in *base. */
__device__ static inline unsigned char *dg_wgmma_stages(uint32_t *base)
{
    extern __shared__ __align__(1024) unsigned char dg_wgmma_smem[];
    *base = (dg_smem_u32(dg_wgmma_smem) + 1023u) & ~1023u;
    return dg_wgmma_smem + (*base - dg_smem_u32(dg_wgmma_smem));
}

/* before the first product of a batch (orders the accumulators' earlier
 * writes and reads against it) */
__device__ static inline void dg_wgmma_fence(void)
{
    DG_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ static inline void dg_wgmma_commit(void)
{
    DG_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* wait until at most N committed batches are in flight */
template <int N>
__device__ static inline void dg_wgmma_wait(void)
{
    DG_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* After the wait that completes an asynchronous product: its accumulator
 * r "changes" here, so the compiler moves no use of r above the wait
 * (no instruction is emitted). */
template <int N>
__device__ static inline void dg_wgmma_operand_fence(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}

/* the generic proxy's shared-memory writes (cp.async's) made visible to
 * the async proxy that wgmma reads through */
__device__ static inline void dg_fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* The K loop of the wgmma kernels (moe-wgmma.cu, fp8-wgmma.cu): mma.cuh's
 * dg_cp_kloop with wgmma's fences and waits.  load(s, ks) issues step
 * ks's copies into stage s; products(s, ks) issues the step's products
 * from stage s (between wgmma's fence and commit); done(ks) runs once they
 * are complete.  A stage is refilled only at the step after the one that
 * read it, past the barrier every thread reaches once its products from
 * it were waited for; the copies reach wgmma's proxy through
 * dg_fence_proxy_async before that barrier.  Starts with a barrier (the
 * stages free of a previous pass) and ends with no copy in flight. */
template <int ST, typename Load, typename Products, typename Done>
__device__ static inline void dg_wgmma_kloop(int ksteps, Load &&load, Products &&products,
                                             Done &&done)
{
    dg_cp_kloop<ST>(
        ksteps, load,
        [&](int s, int ks) {
            dg_wgmma_fence();
            products(s, ks);
            dg_wgmma_commit();
            dg_wgmma_wait<0>();
            done(ks);
        },
        [] { dg_fence_proxy_async(); });
}

/* The accumulators' operands: %0 .. %(R - 1) in the instruction, bound to
 * d[0] .. d[R - 1] (R = 16, 32, 64) */
#define DG_WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, " \
    "%8, %9, %10, %11, %12, %13, %14, %15"
#define DG_WG_REGS32 DG_WG_REGS16 ", " \
    "%16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31"
#define DG_WG_REGS64 DG_WG_REGS32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63"
#define DG_WG_OUT16(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), \
    "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define DG_WG_OUT32(d) DG_WG_OUT16(d), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DG_WG_OUT64(d) DG_WG_OUT32(d), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
    "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define DG_WG_REGS128 DG_WG_REGS64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, " \
    "%72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, " \
    "%88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, " \
    "%104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, " \
    "%120, %121, %122, %123, %124, %125, %126, %127"
#define DG_WG_OUT128(d) DG_WG_OUT64(d), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
    "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
    "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
    "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), \
    "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
    "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
    "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), \
    "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

/* name(d, a, b, acc): d (64 x N, fp32, R = N / 2 a thread) = a b + (acc ? d
 * : 0) through the operands' descriptors, `shape` the instruction's
 * shape and types, `tail` what follows the scales (bf16: the two
 * transpose flags, 0 for K-major; E4M3: nothing), pa, pb, pp the
 * descriptors' and the predicate's operand numbers (R, R + 1, R + 2) */
#define DG_WGMMA_FN(name, R, shape, tail, pa, pb, pp)                                          \
    __device__ static inline void name(float(&d)[R], uint64_t a, uint64_t b, int acc)         \
    {                                                                                           \
        DG_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %" pp ", 0;\n"                          \
                     "wgmma.mma_async.sync.aligned." shape " {" DG_WG_REGS##R "}, %" pa        \
                     ", %" pb ", p, 1, 1" tail ";\n}\n"                                        \
                     : DG_WG_OUT##R(d)                                                          \
                     : "l"(a), "l"(b), "r"(acc));                                               \
    }

/* bf16: a (64 x 16) and b (N x 16), both K-major */
DG_WGMMA_FN(dg_wgmma_m64n32, 16, "m64n32k16.f32.bf16.bf16", ", 0, 0", "16", "17", "18")
DG_WGMMA_FN(dg_wgmma_m64n64, 32, "m64n64k16.f32.bf16.bf16", ", 0, 0", "32", "33", "34")
DG_WGMMA_FN(dg_wgmma_m64n128, 64, "m64n128k16.f32.bf16.bf16", ", 0, 0", "64", "65", "66")

/* E4M3: a (64 x 32) and b (N x 32), both K-major */
DG_WGMMA_FN(dg_wgmma_e4m3_m64n32, 16, "m64n32k32.f32.e4m3.e4m3", "", "16", "17", "18")
DG_WGMMA_FN(dg_wgmma_e4m3_m64n64, 32, "m64n64k32.f32.e4m3.e4m3", "", "32", "33", "34")
DG_WGMMA_FN(dg_wgmma_e4m3_m64n128, 64, "m64n128k32.f32.e4m3.e4m3", "", "64", "65", "66")

/* name(d, a, b): d (64 x N, fp32) += a b, bf16 k16, A from registers
 * (a[0..3]: mma.sync m16n8k16's A fragment of the thread's warp's 16 rows,
 * the warpgroup's four warps rows 0-15, 16-31, 32-47, 48-63) and B through
 * an N-major descriptor (dg_wgmma_desc_n): the instruction's transpose-B
 * flag set.  pa = R, pb = R + 4. */
#define DG_WGMMA_RA_FN(name, R, shape, pa0, pa1, pa2, pa3, pb)                                 \
    __device__ static inline void name(float(&d)[R], const uint32_t(&a)[4], uint64_t b)       \
    {                                                                                           \
        DG_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                               \
                     "wgmma.mma_async.sync.aligned." shape " {" DG_WG_REGS##R "}, {%" pa0      \
                     ", %" pa1 ", %" pa2 ", %" pa3 "}, %" pb ", p, 1, 1, 1;\n}\n"               \
                     : DG_WG_OUT##R(d)                                                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                     \
    }

DG_WGMMA_RA_FN(dg_wgmma_m64n64_rt, 32, "m64n64k16.f32.bf16.bf16", "32", "33", "34", "35", "36")
DG_WGMMA_RA_FN(dg_wgmma_m64n128_rt, 64, "m64n128k16.f32.bf16.bf16", "64", "65", "66", "67",
               "68")
DG_WGMMA_RA_FN(dg_wgmma_m64n256_rt, 128, "m64n256k16.f32.bf16.bf16", "128", "129", "130", "131",
               "132")

/* The product above for N = NT (32, 64 or 128): bf16 (k16) or E4M3 (k32). */
template <int NT, bool E4M3>
__device__ static inline void dg_wgmma_n(float (&d)[NT / 2], uint64_t a, uint64_t b, int acc)
{
    if constexpr (E4M3 && NT == 32)
        dg_wgmma_e4m3_m64n32(d, a, b, acc);
    else if constexpr (E4M3 && NT == 64)
        dg_wgmma_e4m3_m64n64(d, a, b, acc);
    else if constexpr (E4M3)
        dg_wgmma_e4m3_m64n128(d, a, b, acc);
    else if constexpr (NT == 32)
        dg_wgmma_m64n32(d, a, b, acc);
    else if constexpr (NT == 64)
        dg_wgmma_m64n64(d, a, b, acc);
    else
        dg_wgmma_m64n128(d, a, b, acc);
}

#endif
