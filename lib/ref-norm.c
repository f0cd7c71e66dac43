/* ref-norm.c - RMSNorm, soft-cap and softmax references; see ref-ops.h. */
#include "lib/ref-ops.h"

void dg_ref_rmsnorm(float *y, const float *x, const float *w, int64_t rows, int dim, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0;
        float inv;

        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        if (w)
            for (int i = 0; i < dim; i++)
                yr[i] = xr[i] * inv * w[i];
        else
            for (int i = 0; i < dim; i++)
                yr[i] = xr[i] * inv;
    }
}

void dg_ref_softcap(float *z, int64_t n, float cap)
{
    if (!(cap > 0))
        return;
    for (int64_t i = 0; i < n; i++)
        z[i] = cap * tanhf(z[i] / cap);
}

void dg_ref_softmax(float *x, int64_t n)
{
    float mx = -INFINITY;
    double sum = 0;

    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(x[i] / sum);
}

void dg_ref_gelu_mul(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = dg_gelu_tanh(gate[i]) * up[i];
}

/* The same steps as the CPU forward's (and bit for bit the same results):
 * the two norms in place, then per row s = dense + moe, its norm computed
 * as dg_ref_rmsnorm would on a copy of s (double sum of squares, then
 * float s_i * inv * w_i), and x = (x + that) * scale.  s is recomputed
 * rather than stored, so no scratch is needed. */
void dg_ref_ffn_combine(float *x, float *dense, float *moe, const float *w1, const float *w2,
                        const float *w, int64_t rows, int dim, float eps, float scale)
{
    dg_ref_rmsnorm(dense, dense, w1, rows, dim, eps);
    dg_ref_rmsnorm(moe, moe, w2, rows, dim, eps);
    for (int64_t r = 0; r < rows; r++) {
        const float *dr = dense + r * dim, *mr = moe + r * dim;
        float *xr = x + r * dim;
        double ss = 0;
        float inv;

        for (int i = 0; i < dim; i++) {
            const float s = dr[i] + mr[i];
            ss += (double)s * s;
        }
        inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++) {
            const float s = dr[i] + mr[i];
            float v = s * inv;
            if (w)
                v *= w[i];
            xr[i] = (xr[i] + v) * scale;
        }
    }
}
