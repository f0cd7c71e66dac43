/*
 * elt.cuh - element loads and stores for the kernels templated on their
 * element type (kernels/ops.h, "element types"): bf16 or fp32 in memory,
 * fp32 in registers.  A bf16 store rounds to nearest even; fp32 is
 * untouched both ways.  Device code only.
 */
#ifndef DG_KERNELS_ELT_CUH
#define DG_KERNELS_ELT_CUH

#include <cuda_bf16.h>
#include <stdint.h>

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

/* gelu with the tanh approximation, in fp32 (lib/ref-ops.h's dg_gelu_tanh):
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (one definition, so the fused and the separate gated MLP round alike) */
__device__ static inline float dg_gelu_tanh_f(float g)
{
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

/* v as a value of type T would hold it (bf16: rounded to nearest even) */
__device__ static inline float dg_round_as(const __nv_bfloat16 *, float v)
{
    return __bfloat162float(__float2bfloat16(v));
}

__device__ static inline float dg_round_as(const float *, float v)
{
    return v;
}

/* Eight consecutive elements (16-byte aligned for bf16, 32 for fp32). */
__device__ static inline void dg_ld8(const __nv_bfloat16 *p, float v[8])
{
    const uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

__device__ static inline void dg_ld8(const float *p, float v[8])
{
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ static inline void dg_st8(__nv_bfloat16 *p, const float v[8])
{
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *(uint4 *)p = u;
}

__device__ static inline void dg_st8(float *p, const float v[8])
{
    ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

/* Eight consecutive elements as loaded, not yet converted: one 16-byte
 * load (bf16) or two (fp32).  Loading a row's pieces into these first and
 * converting after issues all of a thread's loads before any is used, so
 * the row costs one memory latency instead of one per piece. */
template <typename T> struct dg_raw8;
template <> struct dg_raw8<__nv_bfloat16> {
    uint4 u;
};
template <> struct dg_raw8<float> {
    float4 a, b;
};

__device__ static inline void dg_load_raw8(dg_raw8<__nv_bfloat16> *r, const __nv_bfloat16 *p)
{
    r->u = *(const uint4 *)p;
}

__device__ static inline void dg_load_raw8(dg_raw8<float> *r, const float *p)
{
    r->a = ((const float4 *)p)[0];
    r->b = ((const float4 *)p)[1];
}

/* v rounded to bf16 into r (the bytes dg_st8 stores) */
__device__ static inline void dg_pack8(dg_raw8<__nv_bfloat16> *r, const float v[8])
{
    __nv_bfloat162 *h = (__nv_bfloat162 *)&r->u;
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
}

/* the eight values of r in fp32 (what dg_ld8 of the same address gives) */
__device__ static inline void dg_unpack8(const dg_raw8<__nv_bfloat16> &r, float v[8])
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r.u;
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

__device__ static inline void dg_unpack8(const dg_raw8<float> &r, float v[8])
{
    v[0] = r.a.x, v[1] = r.a.y, v[2] = r.a.z, v[3] = r.a.w;
    v[4] = r.b.x, v[5] = r.b.y, v[6] = r.b.z, v[7] = r.b.w;
}

/* dg_ld8 through the L2 only (ld.global.cg): for values another block
 * wrote during this kernel, which this multiprocessor's L1 may hold an
 * older copy of */
__device__ static inline void dg_ld8_cg(const __nv_bfloat16 *p, float v[8])
{
    dg_raw8<__nv_bfloat16> r;
    r.u = __ldcg((const uint4 *)p);
    dg_unpack8(r, v);
}

__device__ static inline void dg_ld8_cg(const float *p, float v[8])
{
    dg_raw8<float> r;
    r.a = __ldcg((const float4 *)p);
    r.b = __ldcg((const float4 *)p + 1);
    dg_unpack8(r, v);
}

/* Whether rows of dim elements of esz bytes at every pointer given (NULL
 * allowed) can be read eight at a time. */
static inline bool dg_rows_by8(int dim, int esz, const void *a, const void *b = 0,
                               const void *c = 0, const void *d = 0)
{
    const uintptr_t al = (uintptr_t)(8 * esz) - 1;
    return dim % 8 == 0 && !((uintptr_t)a & al) && !((uintptr_t)b & al) &&
           !((uintptr_t)c & al) && !((uintptr_t)d & al);
}

#endif
