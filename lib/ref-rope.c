/* ref-rope.c - rotary position embedding reference; see ref-ops.h. */
#include "lib/ref-ops.h"

void dg_rope_inv_freq(const struct dg_rope_config *rope, int hd, float *inv_freq)
{
    int half = hd / 2, rotated = half;
    float factor = 1.0f;

    if (rope->kind == DG_ROPE_PROPORTIONAL) {
        rotated = (int)(rope->partial_rotary_factor * hd / 2); /* floor, as int() in Python */
        if (rotated > half)
            rotated = half;
        factor = (float)rope->factor;
    }
    for (int i = 0; i < half; i++) {
        if (i < rotated) {
            /* transformers: 1 / theta ** (arange(0, 2r, 2).float() / hd), in fp32 */
            float e = (float)(2 * i) / (float)hd;
            inv_freq[i] = (1.0f / powf((float)rope->theta, e)) / factor;
        } else {
            inv_freq[i] = 0.0f;
        }
    }
}

void dg_ref_rope(float *x, int n_heads, int hd, const float *inv_freq, int64_t pos)
{
    const int half = hd / 2;

    for (int i = 0; i < half; i++) {
        float angle, c, s;
        if (inv_freq[i] == 0.0f)
            continue; /* cos 1, sin 0: untouched */
        angle = (float)pos * inv_freq[i];
        c = cosf(angle);
        s = sinf(angle);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (int64_t)h * hd;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}
