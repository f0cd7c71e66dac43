/* ref-embed.c - embedding gather and scale (see ref-ops.h). */
#include <string.h>

#include "lib/dtype.h"
#include "lib/ref-ops.h"

void dg_ref_embed(float *x, const int32_t *ids, int64_t T, const struct dg_weight *E, int64_t v0,
                  float scale)
{
    const int64_t H = E->cols, stride = E->stride ? E->stride : E->cols;
    for (int64_t t = 0; t < T; t++) {
        const int64_t r = (int64_t)ids[t] - v0;
        const unsigned char *row;
        if (r < 0 || r >= E->rows) {
            memset(x + t * H, 0, sizeof(float) * (size_t)H);
            continue;
        }
        row = (const unsigned char *)E->data + (size_t)(r * stride) * dg_dtype_size(E->dtype);
        for (int64_t i = 0; i < H; i++)
            x[t * H + i] = dg_load_f32(row, E->dtype, (size_t)i) * scale;
    }
}

void dg_ref_rows_gather(float *y, const float *const *src, int64_t T, int dim)
{
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < dim; i++)
            y[t * dim + i] = src[t] ? src[t][i] : 0.0f;
}
