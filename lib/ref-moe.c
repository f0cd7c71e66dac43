/* ref-moe.c - the mixture of experts over routed tokens (see ref-ops.h). */
#include <stdlib.h>
#include <string.h>

#include "lib/ref-ops.h"

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
            struct dg_weight wg, wu;
            if (e < 0 || e >= n_exp)
                continue;
            wg = dg_weight_rows(&gate_up[e], 0, I);
            wu = dg_weight_rows(&gate_up[e], I, 2 * (int64_t)I);
            dg_ref_matmul(g, x + t * H, 1, &wg, row);
            dg_ref_matmul(u, x + t * H, 1, &wu, row);
            dg_ref_gelu_mul(g, g, u, I);
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
