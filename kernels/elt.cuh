/*
 * elt.cuh - element loads and stores for the kernels templated on their
 * element type (kernels/ops.h, "element types"): bf16 or fp32 in memory,
 * fp32 in registers.  A bf16 store rounds to nearest even; fp32 is
 * untouched both ways.  Device code only.
 */
#ifndef DG_KERNELS_ELT_CUH
#define DG_KERNELS_ELT_CUH

#include <cuda_bf16.h>

__device__ static inline float dg_ld(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}

__device__ static inline float dg_ld(const float *p)
{
    return *p;
}

__device__ static inline void dg_st(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16(v);
}

__device__ static inline void dg_st(float *p, float v)
{
    *p = v;
}

#endif
