/* attention.cu - grouped-query attention, online softmax, no score matrix
 * in memory (see ops.h; reference: dg_ref_attention).  One kernel for both
 * element types of q, k, v and out: bf16 (dg_cuda_attention) and fp32
 * (dg_cuda_attention_e with DG_ELT_F32), fp32 arithmetic for both. */
#include "kernels/ops.h"

#include <cuda_bf16.h>
#include <math.h>

#include "kernels/attention-tc.h"
#include "kernels/cuda-check.h"
#include "kernels/elt.cuh"

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 16 /* hd <= 512 */

__device__ static int visible(int mask, int64_t q, int64_t k, int window)
{
    return mask == 0 ? 1 : mask == 1 ? k <= q : (k <= q && k > q - window);
}

/* One (query, head) of a block of ATT_WARPS warps.  Lane l of a warp
 * holds dims i = l + 32 u (u < hd / 32, rounded up) of q and of its
 * accumulator.  Warp w takes keys j = w, w + ATT_WARPS, ... of the Tk
 * rows at k, v (key j at position k_pos[j], or k_first + j when k_pos is
 * NULL):
 *   s = warp sum of q_i k_ji;  m' = max(m, s);  a = exp(m - m'), b = exp(s - m')
 *   l = a l + b;  acc_i = a acc_i + b v_ji;  m = m'
 * then warp 0 folds the warps' (m, l, acc) through shared memory:
 *   M = max m_w;  L = sum l_w e^{m_w - M};  out_i = sum acc_wi e^{m_w - M} / L.
 * c is the query head's KV head; rows of k and v hold nkv heads of hd.
 * Elt (__nv_bfloat16 or float) is the type of q, k, v and out; the
 * arithmetic is fp32 for both. */
template <typename Elt>
__device__ static void attend(Elt *outr, const Elt *qr, int64_t qp, const Elt *k, const Elt *v,
                              const int64_t *k_pos, int64_t k_first, int64_t Tk, int nkv, int c,
                              int hd, int mask, int window)
{
    __shared__ float sh_m[ATT_WARPS], sh_l[ATT_WARPS];
    __shared__ float sh_acc[ATT_WARPS][32 * ATT_MAX_PER_LANE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = (hd + 31) / 32;
    float qv[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
    float m = -INFINITY, l = 0.0f;

    for (int u = 0; u < per; u++) {
        const int i = lane + 32 * u;
        qv[u] = i < hd ? dg_ld(&qr[i]) : 0.0f;
        acc[u] = 0.0f;
    }
    for (int64_t j = warp; j < Tk; j += ATT_WARPS) {
        const Elt *kr = k + (j * nkv + c) * hd, *vr = v + (j * nkv + c) * hd;
        float s = 0.0f, mn, a, b;
        if (!visible(mask, qp, k_pos ? k_pos[j] : k_first + j, window))
            continue;
        for (int u = 0; u < per; u++) {
            const int i = lane + 32 * u;
            if (i < hd)
                s += qv[u] * dg_ld(&kr[i]);
        }
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        mn = fmaxf(m, s);
        a = m == -INFINITY ? 0.0f : expf(m - mn);
        b = expf(s - mn);
        l = a * l + b;
        for (int u = 0; u < per; u++) {
            const int i = lane + 32 * u;
            acc[u] = a * acc[u] + (i < hd ? b * dg_ld(&vr[i]) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) {
        sh_m[warp] = m;
        sh_l[warp] = l;
    }
    for (int u = 0; u < per; u++)
        sh_acc[warp][lane + 32 * u] = acc[u];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY, L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, sh_m[w]);
        for (int w = 0; w < ATT_WARPS; w++)
            L += sh_m[w] == -INFINITY ? 0.0f : sh_l[w] * expf(sh_m[w] - M);
        for (int u = 0; u < per; u++) {
            const int i = lane + 32 * u;
            float o = 0.0f;
            if (i >= hd)
                continue;
            for (int w = 0; w < ATT_WARPS; w++)
                if (sh_m[w] != -INFINITY)
                    o += sh_acc[w][i] * expf(sh_m[w] - M);
            dg_st(&outr[i], L > 0.0f ? o / L : 0.0f);
        }
    }
}

/* grid (Tq, nh): query t, head h against all Tk keys (attend). */
template <typename Elt>
__global__ static void attention_kernel(Elt *out, const Elt *q, const int64_t *q_pos,
                                        const Elt *k, const Elt *v, const int64_t *k_pos,
                                        int64_t Tk, int nh, int nkv, int hd, int mask, int window)
{
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    attend<Elt>(out + (t * nh + h) * hd, q + (t * nh + h) * hd, q_pos[t], k, v, k_pos, 0, Tk,
                nkv, h / (nh / nkv), hd, mask, window);
}

/* grid (Tq, nh): query t of sequence s = q_seq[t], head h, against that
 * sequence's keys: rows k_start .. k_start+k_len-1 of its cache, each at
 * the position its row says (attend with k_pos NULL). */
template <typename Elt>
__global__ static void attention_batch_kernel(Elt *out, const Elt *q, const int64_t *q_pos,
                                              const int32_t *q_seq,
                                              const struct dg_attn_seq *seqs, int nh, int nkv,
                                              int hd, int mask, int window)
{
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const struct dg_attn_seq *s = &seqs[q_seq[t]];
    const int64_t row = (int64_t)nkv * hd;
    attend<Elt>(out + (t * nh + h) * hd, q + (t * nh + h) * hd, q_pos[t],
                (const Elt *)s->k + s->k_start * row, (const Elt *)s->v + s->k_start * row, NULL,
                s->k_start, s->k_len, nkv, h / (nh / nkv), hd, mask, window);
}

/* grid (Tq, ceil(row / 256)): token t's new K and V rows into its
 * sequence's cache at the row of its position: a copy. */
template <typename Elt>
__global__ static void kv_append_kernel(const struct dg_attn_seq *seqs, const int32_t *q_seq,
                                        const int64_t *q_pos, const Elt *k_new,
                                        const Elt *v_new, int64_t row)
{
    const int64_t t = blockIdx.x;
    const int64_t i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    const struct dg_attn_seq *s = &seqs[q_seq[t]];
    if (i >= row)
        return;
    ((Elt *)s->k)[q_pos[t] * row + i] = k_new[t * row + i];
    ((Elt *)s->v)[q_pos[t] * row + i] = v_new[t * row + i];
}

static int attention_args_ok(enum dg_elt e, int nh, int nkv, int hd, int mask, int window,
                             int64_t Tq)
{
    return (e == DG_ELT_BF16 || e == DG_ELT_F32) && hd >= 2 && hd % 2 == 0 &&
           hd <= 32 * ATT_MAX_PER_LANE && nh >= 1 && nkv >= 1 && nh % nkv == 0 && nh <= 65535 &&
           Tq <= 0x7fffffff && mask >= 0 && mask <= 2 && (mask != 2 || window >= 1);
}

extern "C" int dg_cuda_attention_batch_e(enum dg_elt e, void *out, const void *q,
                                         const int64_t *q_pos, const int32_t *q_seq, int64_t Tq,
                                         const struct dg_attn_seq *seqs, int nh, int nkv, int hd,
                                         int mask, int window, dg_stream_t stream, int dev,
                                         struct dg_error *err)
{
    return dg_cuda_attention_batch_ws_e(e, out, q, q_pos, q_seq, Tq, seqs, nh, nkv, hd, mask,
                                        window, NULL, 0, stream, dev, err);
}

extern "C" size_t dg_cuda_attention_batch_ws_bytes(enum dg_elt e, int64_t Tq, int nh, int nkv,
                                                   int hd)
{
    return e == DG_ELT_BF16 ? dg_cuda_attention_tc_scratch(Tq, nh, nkv, hd) : 0;
}

extern "C" int dg_cuda_attention_batch_ws_e(enum dg_elt e, void *out, const void *q,
                                            const int64_t *q_pos, const int32_t *q_seq,
                                            int64_t Tq, const struct dg_attn_seq *seqs, int nh,
                                            int nkv, int hd, int mask, int window, void *ws,
                                            size_t ws_bytes, dg_stream_t stream, int dev,
                                            struct dg_error *err)
{
    int rc = 0;
    if (Tq <= 0 && (e == DG_ELT_BF16 || e == DG_ELT_F32))
        return 0;
    if (!attention_args_ok(e, nh, nkv, hd, mask, window, Tq) || !q_seq || !seqs)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: batched attention: element type %d, %d "
                            "heads over %d KV heads of %d, mask %d window %d", dev, (int)e, nh,
                            nkv, hd, mask, window);
    if (e == DG_ELT_BF16 && dg_cuda_attention_tc_fits(hd))
        return dg_cuda_attention_tc(out, q, q_pos, q_seq, Tq, seqs, nh, nkv, hd, mask, window,
                                    ws, ws_bytes, stream, dev, err);
    const dim3 grid((unsigned)Tq, (unsigned)nh);
    if (e == DG_ELT_F32)
        attention_batch_kernel<float><<<grid, 32 * ATT_WARPS, 0, (cudaStream_t)stream>>>(
            (float *)out, (const float *)q, q_pos, q_seq, seqs, nh, nkv, hd, mask, window);
    else
        attention_batch_kernel<__nv_bfloat16><<<grid, 32 * ATT_WARPS, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)out, (const __nv_bfloat16 *)q, q_pos, q_seq, seqs, nh, nkv, hd,
            mask, window);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_kv_append_e(enum dg_elt e, const struct dg_attn_seq *seqs,
                                   const int32_t *q_seq, const int64_t *q_pos, const void *k_new,
                                   const void *v_new, int64_t Tq, int64_t row,
                                   dg_stream_t stream, int dev, struct dg_error *err)
{
    int rc = 0;
    if ((e != DG_ELT_BF16 && e != DG_ELT_F32) || row < 1 || Tq > 0x7fffffff ||
        row > (int64_t)256 * 65535)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: kv append: element type %d, rows of %lld",
                            dev, (int)e, (long long)row);
    if (Tq <= 0)
        return 0;
    const dim3 grid((unsigned)Tq, (unsigned)((row + 255) / 256));
    if (e == DG_ELT_F32)
        kv_append_kernel<float><<<grid, 256, 0, (cudaStream_t)stream>>>(
            seqs, q_seq, q_pos, (const float *)k_new, (const float *)v_new, row);
    else
        kv_append_kernel<__nv_bfloat16><<<grid, 256, 0, (cudaStream_t)stream>>>(
            seqs, q_seq, q_pos, (const __nv_bfloat16 *)k_new, (const __nv_bfloat16 *)v_new, row);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_attention_e(enum dg_elt e, void *out, const void *q,
                                   const int64_t *q_pos, int64_t Tq, const void *k,
                                   const void *v, const int64_t *k_pos, int64_t Tk, int nh,
                                   int nkv, int hd, int mask, int window, dg_stream_t stream,
                                   int dev, struct dg_error *err)
{
    int rc = 0;
    if (e != DG_ELT_BF16 && e != DG_ELT_F32)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: attention: element type %d", dev, (int)e);
    if (Tq <= 0)
        return 0;
    if (!attention_args_ok(e, nh, nkv, hd, mask, window, Tq) || Tk < 0)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: attention: %d heads over %d KV heads of "
                            "%d, mask %d window %d", dev, nh, nkv, hd, mask, window);
    const dim3 grid((unsigned)Tq, (unsigned)nh);
    if (e == DG_ELT_F32)
        attention_kernel<float><<<grid, 32 * ATT_WARPS, 0, (cudaStream_t)stream>>>(
            (float *)out, (const float *)q, q_pos, (const float *)k, (const float *)v, k_pos, Tk,
            nh, nkv, hd, mask, window);
    else
        attention_kernel<__nv_bfloat16><<<grid, 32 * ATT_WARPS, 0, (cudaStream_t)stream>>>(
            (__nv_bfloat16 *)out, (const __nv_bfloat16 *)q, q_pos, (const __nv_bfloat16 *)k,
            (const __nv_bfloat16 *)v, k_pos, Tk, nh, nkv, hd, mask, window);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

extern "C" int dg_cuda_attention(uint16_t *out, const uint16_t *q, const int64_t *q_pos,
                                 int64_t Tq, const uint16_t *k, const uint16_t *v,
                                 const int64_t *k_pos, int64_t Tk, int nh, int nkv, int hd,
                                 int mask, int window, dg_stream_t stream, int dev,
                                 struct dg_error *err)
{
    return dg_cuda_attention_e(DG_ELT_BF16, out, q, q_pos, Tq, k, v, k_pos, Tk, nh, nkv, hd,
                               mask, window, stream, dev, err);
}
