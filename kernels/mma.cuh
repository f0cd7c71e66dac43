/*
 * mma.cuh - the tensor-core and async-copy instructions the hand-written
 * kernels share (attention-tc.cu, moe-gemm.cu, fp8-gemm.cu), as PTX, and
 * the two grouped GEMMs' pipeline-stage load, warp products and warp grid.
 *
 * Fragments of mma.sync m16n8kK (K = 16 for bf16, 32 for e4m3), lane l,
 * gid = l / 4, tig = l % 4:
 *   A (16 x K, row-major): a0 row gid, a1 row gid+8, the first half of K;
 *                          a2, a3 the same rows, the second half
 *   B (K x 8, column):     b0 the first half of K, b1 the second, column gid
 *   C/D (16 x 8, fp32):    d0, d1 row gid, columns 2 tig, 2 tig + 1;
 *                          d2, d3 row gid + 8
 * ldmatrix x4 loads four 8x8 tiles of 16-bit words (8 rows of 16 bytes,
 * rows addressed by lanes 0-7, 8-15, 16-23, 24-31): for a row-major tile
 * that is an A fragment, or two B fragments of a tile stored one column of
 * B per row; .trans gives the B fragments of a tile stored one row of B
 * per row.
 */
#ifndef DG_KERNELS_MMA_CUH
#define DG_KERNELS_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ static inline uint32_t dg_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ static inline void dg_ldsm4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(dg_smem_u32(p)));
}

__device__ static inline void dg_ldsm4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(dg_smem_u32(p)));
}

/* d += a b: bf16 a 16x16, b 16x8, fp32 d 16x8 */
__device__ static inline void dg_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a b: e4m3 a 16x32, b 32x8, fp32 d 16x8 */
__device__ static inline void dg_mma_e4m3(float d[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The two products as functors, for dg_warp_stage */
struct dg_mma_bf16_op {
    __device__ void operator()(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) const
    {
        dg_mma_bf16(d, a, b0, b1);
    }
};

struct dg_mma_e4m3_op {
    __device__ void operator()(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) const
    {
        dg_mma_e4m3(d, a, b0, b1);
    }
};

/* One warp's products over one pipeline stage of the grouped GEMMs
 * (moe-gemm.cu: bf16, fp8-gemm.cu: e4m3), counted in bytes: SB bytes of
 * K a stage in 32-byte steps (one mma: K 16 bf16 or 32 e4m3), shared rows
 * LDB bytes apart.  acc[m][n] += A_m B_n, with B_n the weight rows of the
 * warp's n-tile n (ws rows wc0 + 8 n on, one column of B a row: two
 * n-tiles an ldmatrix) and A_m the rows of m-tile mt0 + m (xs rows 16 (mt0
 * + m) on); m-tiles from row `rows` on are skipped (their outputs are not
 * stored).  Mma: dg_mma_bf16_op or dg_mma_e4m3_op. */
template <int MW, int NW, int SB, int LDB, typename Mma>
__device__ static inline void dg_warp_stage(float (&acc)[MW][NW][4], const unsigned char *ws,
                                            const unsigned char *xs, int wc0, int mt0, int rows,
                                            int lane, Mma mma)
{
#pragma unroll
    for (int kb = 0; kb < SB; kb += 32) {
        uint32_t b[NW / 2][4];
#pragma unroll
        for (int h = 0; h < NW / 2; h++)
            dg_ldsm4(b[h], ws + (wc0 + h * 16 + (lane & 7) + (lane >> 4) * 8) * LDB + kb +
                               ((lane >> 3) & 1) * 16);
#pragma unroll
        for (int m = 0; m < MW; m++) {
            uint32_t a[4];
            if ((mt0 + m) * 16 >= rows)
                break;
            dg_ldsm4(a, xs + ((mt0 + m) * 16 + (lane & 15)) * LDB + kb + (lane >> 4) * 16);
#pragma unroll
            for (int h = 0; h < NW / 2; h++) {
                mma(acc[m][2 * h], a, b[h][0], b[h][1]);
                mma(acc[m][2 * h + 1], a, b[h][2], b[h][3]);
            }
        }
    }
}

/* 16 bytes global -> shared, asynchronously; zeros when !valid */
__device__ static inline void dg_cp16(void *dst, const void *src, int valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dg_smem_u32(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}

/* the same to shared address dst (no generic-to-shared conversion) */
__device__ static inline void dg_cp16_to(uint32_t dst, const void *src, int valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

__device__ static inline void dg_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* wait until at most N groups of copies are in flight */
template <int N>
__device__ static inline void dg_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* One stage of a grouped GEMM's cp.async pipeline (moe-gemm.cu,
 * fp8-gemm.cu), counted in bytes: the weight tile, BN rows of SB bytes
 * from w (rows kb bytes apart) at byte k0, and the first mrows rows of the
 * row tile likewise from x, into shared rows LDB bytes apart, 16-byte
 * copies over the block's 128 threads.  Bytes past kb, and rows from `rows`
 * on, load as zeros (reading nothing).  With up_rows > 0 the weight tile
 * interleaves two halves of w in runs of 8 rows: tile row t holds w's row
 * (t / 16) 8 + t % 8, plus up_rows where (t / 8) is odd (a gate run, then
 * the up run of the same rows: moe-gemm.cu's gated form). */
template <int BN, int SB, int LDB>
__device__ static inline void dg_stage_load(unsigned char *ws, unsigned char *xs,
                                            const unsigned char *w, const unsigned char *x,
                                            int mrows, int rows, int64_t k0, int64_t kb,
                                            int64_t up_rows = 0)
{
    constexpr int CH = SB / 16;
    for (int i = threadIdx.x; i < BN * CH; i += 128) {
        const int r = i / CH, c = (i % CH) * 16;
        const int in_k = k0 + c < kb;
        const int64_t wr = up_rows ? (r >> 4) * 8 + (r & 7) + ((r >> 3) & 1) * up_rows : r;
        dg_cp16(ws + r * LDB + c, w + wr * kb + (in_k ? k0 + c : 0), in_k);
    }
    for (int i = threadIdx.x; i < mrows * CH; i += 128) {
        const int r = i / CH, c = (i % CH) * 16;
        const int ok = r < rows && k0 + c < kb;
        dg_cp16(xs + r * LDB + c, x + (ok ? (int64_t)r * kb + k0 + c : 0), ok);
    }
}

/* The K loop of the grouped GEMMs (moe-gemm.cu, fp8-gemm.cu; through
 * wgmma.cuh's dg_wgmma_kloop, moe-wgmma.cu and fp8-wgmma.cu): ksteps steps
 * through an ST-stage cp.async pipeline.  load(s, ks) issues step ks's
 * copies into stage s; step(s, ks) computes from stage s; landed() runs
 * once a step's copies have landed, before the barrier (dg_wgmma_kloop's
 * proxy fence).  The copies run ST - 1 steps ahead; a stage is refilled
 * at the step after the one that read it, past the barrier every thread
 * reaches once done with it.  Starts with a barrier (the stages free of a
 * previous pass) and ends with no copy in flight. */
template <int ST, typename Load, typename Step, typename Landed>
__device__ static inline void dg_cp_kloop(int ksteps, Load &&load, Step &&step, Landed &&landed)
{
    __syncthreads();
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < ksteps)
            load(s, s);
        dg_cp_commit();
    }
    for (int ks = 0; ks < ksteps; ks++) {
        const int s = ks % ST;
        dg_cp_wait<ST - 2>();
        landed();
        __syncthreads();
        if (ks + ST - 1 < ksteps)
            load((ks + ST - 1) % ST, ks + ST - 1);
        dg_cp_commit();
        step(s, ks);
    }
    dg_cp_wait<0>();
}

template <int ST, typename Load, typename Step>
__device__ static inline void dg_cp_kloop(int ksteps, Load &&load, Step &&step)
{
    dg_cp_kloop<ST>(ksteps, load, step, [] {});
}

/* The 4 warps of a grouped GEMM's block over its BN columns and MT
 * m-tiles of 16 rows: WM rows of warps, WN = 4 / WM columns of them; a
 * warp holds WC columns (NW n-tiles of 8) of MW m-tiles. */
template <int BN, int MT, int WM>
struct dg_warp_grid {
    static constexpr int WN = 4 / WM, WC = BN / WN, NW = WC / 8, MW = MT / WM;
    static_assert(MT % WM == 0 && NW % 2 == 0, "warp grid");
};

/* two adjacent outputs */
__device__ static inline void dg_store2(float *p, float a, float b)
{
    *(float2 *)p = make_float2(a, b);
}

__device__ static inline void dg_store2(__nv_bfloat16 *p, float a, float b)
{
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}

#endif
