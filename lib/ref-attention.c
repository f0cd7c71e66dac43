/* ref-attention.c - masked grouped-query attention reference; see ref-ops.h. */
#include "lib/ref-ops.h"

#include <string.h>

void dg_ref_attention(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                      const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                      int nh, int nkv, int hd, enum dg_attn_mask mask, int window,
                      float *scores)
{
    dg_ref_attention_heads(out, q, q_pos, Tq, k, v, k_pos, Tk, nh, 0, nkv, 0, nh / nkv, hd, mask,
                           window, scores);
}

void dg_ref_attention_heads(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                            const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                            int nq, int q_base, int nkv, int kv_base, int group, int hd,
                            enum dg_attn_mask mask, int window, float *scores)
{
    const int64_t qdim = (int64_t)nq * hd, kdim = (int64_t)nkv * hd;

    for (int64_t t = 0; t < Tq; t++) {
        for (int h = 0; h < nq; h++) {
            const float *qv = q + t * qdim + (int64_t)h * hd;
            const int c = (q_base + h) / group - kv_base;
            float *o = out + t * qdim + (int64_t)h * hd;
            float mx = -INFINITY;
            double sum = 0;
            int any = 0;

            for (int64_t j = 0; j < Tk; j++) {
                const float *kv = k + j * kdim + (int64_t)c * hd;
                float s = 0;
                if (!dg_mask_visible(mask, q_pos[t], k_pos[j], window)) {
                    scores[j] = -INFINITY;
                    continue;
                }
                for (int i = 0; i < hd; i++)
                    s += qv[i] * kv[i];
                scores[j] = s;
                if (s > mx)
                    mx = s;
                any = 1;
            }
            memset(o, 0, sizeof *o * (size_t)hd);
            if (!any)
                continue;
            for (int64_t j = 0; j < Tk; j++) {
                scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - mx);
                sum += scores[j];
            }
            for (int64_t j = 0; j < Tk; j++) {
                const float p = (float)(scores[j] / sum);
                const float *vv = v + j * kdim + (int64_t)c * hd;
                if (p == 0.0f)
                    continue;
                for (int i = 0; i < hd; i++)
                    o[i] += p * vv[i];
            }
        }
    }
}

void dg_ref_kv_append(float *const *k_caches, float *const *v_caches, const int32_t *q_seq,
                      const int64_t *q_pos, const float *k_new, const float *v_new, int64_t Tq,
                      int64_t row)
{
    for (int64_t t = 0; t < Tq; t++)
        for (int64_t i = 0; i < row; i++) {
            k_caches[q_seq[t]][q_pos[t] * row + i] = k_new[t * row + i];
            v_caches[q_seq[t]][q_pos[t] * row + i] = v_new[t * row + i];
        }
}
