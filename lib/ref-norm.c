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
