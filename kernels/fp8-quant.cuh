/*
 * fp8-quant.cuh - the per-row E4M3 quantization's pieces (fp8-gemm.cu's
 * kernels, and the FP8 experts' one launch in fp8-wgmma.cu, which
 * quantizes an expert's hidden rows itself):
 *
 *   s_r = max(max_k |X[r, k]| / 448, 2^-126)   (1 for a row of zeros, NaN with a NaN)
 *   Q[r, k] = e4m3(X[r, k] / s_r)  (nearest even, saturating at 448)
 *
 * the values X read 8 at a time (16-byte loads: rows 16-byte aligned,
 * cols a multiple of 8), or with GELU the values h = gelu_tanh(gate) * up
 * of a row [gate | up] (2 cols wide), rounded to the row's type T: what
 * dg_cuda_gelu_mul_e stores, so the bytes are those of that pass and the
 * plain quantization after it.
 */
#ifndef DG_KERNELS_FP8_QUANT_CUH
#define DG_KERNELS_FP8_QUANT_CUH

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "kernels/elt.cuh"

#define DG_FQ_CHUNKS 4 /* dg_fp8_quantize_row_warp's pieces a lane: rows of up to 1,024 */

/* the row's scale from its maximum: amax / 448, at least FLT_MIN (1 for
 * zeros, NaN with a NaN), as lib/ref-fp8.c's row_scale */
__device__ static inline float dg_fp8_row_scale(float amax, int nan)
{
    return nan ? NAN : amax > 0.0f ? fmaxf(amax / 448.0f, 0x1p-126f) : 1.0f;
}

/* x[0..8) into v, through the L2 only where CG (elt.cuh's dg_ld8_cg) */
template <bool CG, typename T>
__device__ static inline void dg_fp8_ld8(const T *x, float (&v)[8])
{
    if (CG)
        dg_ld8_cg(x, v);
    else
        dg_ld8(x, v);
}

/* Piece c8 (columns 8 c8 .. 8 c8 + 7) of the values row xr quantizes into
 * v, and |v|'s maximum and NaN into amax and nan (GELU: the h above; CG:
 * read through the L2 only). */
template <typename T, int GELU, bool CG = false>
__device__ static inline void dg_fp8_piece_load(const T *xr, int cols, int c8, float (&v)[8],
                                                float &amax, int &nan)
{
    if (GELU) {
        float u[8];
        dg_fp8_ld8<CG>(xr + c8 * 8, v);
        dg_fp8_ld8<CG>(xr + cols + c8 * 8, u);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = dg_round_as(xr, dg_gelu_tanh_f(v[k]) * u[k]);
    } else {
        dg_fp8_ld8<CG>(xr + c8 * 8, v);
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = fabsf(v[k]);
        nan |= isnan(a);
        amax = fmaxf(amax, a);
    }
}

/* the eight E4M3 bytes of v / s (nearest even, saturating) */
__device__ static inline uint2 dg_fp8_piece(const float (&v)[8], float s)
{
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++)
        w[k / 4] |= (uint32_t)__nv_cvt_float_to_fp8(v[k] / s, __NV_SATFINITE, __NV_E4M3)
                    << (8 * (k % 4));
    return make_uint2(w[0], w[1]);
}

/* One row by one warp (the caller's lane): xr's values (GELU: the h of
 * [gate | up]; CG: read through the L2 only) into q's cols bytes and *s,
 * the maximum through shuffles alone.  cols a multiple of 8, at most 8 x
 * 32 x DG_FQ_CHUNKS; xr 16-byte aligned, q 8-byte.  All 32 lanes call
 * it. */
template <typename T, int GELU, bool CG = false>
__device__ static inline void dg_fp8_quantize_row_warp(uint8_t *q, float *s, const T *xr,
                                                       int cols, int lane)
{
    const int n8 = cols / 8;
    float v[DG_FQ_CHUNKS][8], amax = 0.0f, sc;
    int nan = 0;
#pragma unroll
    for (int i = 0; i < DG_FQ_CHUNKS; i++)
        if (lane + 32 * i < n8)
            dg_fp8_piece_load<T, GELU, CG>(xr, cols, lane + 32 * i, v[i], amax, nan);
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    sc = dg_fp8_row_scale(amax, nan);
    if (lane == 0)
        *s = sc;
#pragma unroll
    for (int i = 0; i < DG_FQ_CHUNKS; i++)
        if (lane + 32 * i < n8)
            *(uint2 *)(q + (lane + 32 * i) * 8) = dg_fp8_piece(v[i], sc);
}

#endif
