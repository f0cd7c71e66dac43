/* ref-moe.c - the mixture of experts over routed tokens, and the GPU's
 * routing layout and ordered sum on their own (see ref-ops.h). */
#include <stdlib.h>
#include <string.h>

#include "lib/ref-ops.h"

void dg_ref_expert_hidden(float *out, const float *x, int64_t T, int H, int I,
                          const struct dg_weight *gate_up, float *u, float *row)
{
    const struct dg_weight wg = dg_weight_rows(gate_up, 0, I),
                           wu = dg_weight_rows(gate_up, I, 2 * (int64_t)I);
    for (int64_t t = 0; t < T; t++) {
        dg_ref_matmul(out + t * I, x + t * H, 1, &wg, row);
        dg_ref_matmul(u, x + t * H, 1, &wu, row);
        dg_ref_gelu_mul(out + t * I, out + t * I, u, I);
    }
}

int dg_ref_moe(float *out, const float *x, int64_t T, int H, const int32_t *idx, const float *w,
               int K, int e0, int n_exp, int I, const struct dg_weight *gate_up,
               const struct dg_weight *down)
{
    float *g = malloc(sizeof(float) * (size_t)I), *u = malloc(sizeof(float) * (size_t)I);
    float *y = malloc(sizeof(float) * (size_t)H);
    float *row = malloc(sizeof(float) * (size_t)(H > I ? H : I));
    if (!g || !u || !y || !row) {
        free(g);
        free(u);
        free(y);
        free(row);
        return -1;
    }
    memset(out, 0, sizeof(float) * (size_t)(T * H));
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int e = idx[t * K + k] - e0;
            if (e < 0 || e >= n_exp)
                continue;
            dg_ref_expert_hidden(g, x + t * H, 1, H, I, &gate_up[e], u, row);
            dg_ref_matmul(y, g, 1, &down[e], row);
            for (int i = 0; i < H; i++)
                out[t * H + i] += w[t * K + k] * y[i];
        }
    free(g);
    free(u);
    free(y);
    free(row);
    return 0;
}

void dg_ref_moe_route(int32_t *counts, int32_t *offsets, int32_t *slot_of, const int32_t *idx,
                      int64_t picks, int e0, int n_exp, int ts)
{
    int32_t acc = 0;
    memset(counts, 0, sizeof(int32_t) * (size_t)n_exp);
    for (int64_t p = 0; p < picks; p++) {
        const int e = idx[p] - e0;
        if (e >= 0 && e < n_exp)
            counts[e]++;
    }
    for (int j = 0; j < n_exp; j++) {
        offsets[j] = acc;
        acc += (counts[j] + ts - 1) / ts * ts;
    }
    offsets[n_exp] = acc;
    memset(counts, 0, sizeof(int32_t) * (size_t)n_exp);   /* counted again as cursors */
    for (int64_t p = 0; p < picks; p++) {
        const int e = idx[p] - e0;
        slot_of[p] = e < 0 || e >= n_exp ? -1 : offsets[e] + counts[e]++;
    }
}

int64_t dg_ref_moe_overflow(int32_t *ov_offsets, int32_t *ov_counts, const int32_t *counts,
                            const int32_t *offsets, int n_exp, int64_t rb)
{
    int64_t total = 0;
    for (int j = 0; j < n_exp; j++) {
        const int64_t start = offsets[j] > rb ? offsets[j] : rb;
        const int64_t end = (int64_t)offsets[j] + counts[j];
        ov_offsets[j] = (int32_t)start;
        ov_counts[j] = end > start ? (int32_t)(end - start) : 0;
        total += ov_counts[j];
    }
    return total;
}

void dg_ref_moe_combine(float *out, const float *ys, const int32_t *slot_of, const float *w,
                        int64_t T, int K, int H)
{
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < H; i++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                const int32_t s = slot_of[t * K + k];
                if (s >= 0)
                    acc += w[t * K + k] * ys[(int64_t)s * H + i];
            }
            out[t * H + i] = acc;
        }
}
