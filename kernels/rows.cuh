/*
 * rows.cuh - sums (and a maximum) over a row that TPR threads hold in
 * registers (the row-wise kernels: rmsnorm.cu, ffn-combine.cu).  Device
 * code only.
 *
 * TPR is 32 (a warp a row, four rows a block of 128 threads) or 128 (the
 * whole block on one row).  Every thread of the row gets the sum.  The
 * order is fixed: each thread's own partial, then the warp's butterfly
 * (xor 16, 8, 4, 2, 1), then for TPR 128 the four warps' sums as
 * (w0 + w1) + (w2 + w3).  With TPR 128 every thread of the block must
 * call (there are barriers); sh holds 8 floats.
 */
#ifndef DG_KERNELS_ROWS_CUH
#define DG_KERNELS_ROWS_CUH

template <int TPR>
__device__ static inline float2 dg_row_sum2(float a, float b, float *sh)
{
    static_assert(TPR == 32 || TPR == 128, "a row is a warp or a block of 128");
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (TPR == 128) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
            sh[warp] = a;
            sh[4 + warp] = b;
        }
        __syncthreads();
        a = (sh[0] + sh[1]) + (sh[2] + sh[3]);
        b = (sh[4] + sh[5]) + (sh[6] + sh[7]);
        __syncthreads(); /* sh may be used again */
    }
    return make_float2(a, b);
}

template <int TPR>
__device__ static inline float dg_row_sum(float a, float *sh)
{
    static_assert(TPR == 32 || TPR == 128, "a row is a warp or a block of 128");
    for (int o = 16; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
    if (TPR == 128) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
            sh[warp] = a;
        __syncthreads();
        a = (sh[0] + sh[1]) + (sh[2] + sh[3]);
        __syncthreads(); /* sh may be used again */
    }
    return a;
}

/* The row's maximum of amax and OR of nan (the same for every order:
 * fmaxf is exact), for every thread of the row; as dg_row_sum, TPR 128
 * has barriers and sh holds 8 floats. */
template <int TPR>
__device__ static inline void dg_row_max_nan(float &amax, int &nan, float *sh)
{
    static_assert(TPR == 32 || TPR == 128, "a row is a warp or a block of 128");
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    if (TPR == 128) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
            sh[warp] = amax;
            sh[4 + warp] = nan ? 1.0f : 0.0f;
        }
        __syncthreads();
        amax = fmaxf(fmaxf(sh[0], sh[1]), fmaxf(sh[2], sh[3]));
        nan = (sh[4] + sh[5] + sh[6] + sh[7]) != 0.0f;
        __syncthreads(); /* sh may be used again */
    }
}

#endif
