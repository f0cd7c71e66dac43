/*
 * Description: the reference loops arranged for speed give the plain
 * loops' bits, on fresh random inputs (outputs compared with memcmp,
 * poisoned before each call):
 * - dg_ref_attention_heads (the CPU backend's attention and the GPU
 *   kernels' oracle), which looks only at the run of keys a causal or
 *   windowed query can see when the key positions ascend and takes four
 *   keys' dot products (four heads' too, where four share a kv head) and
 *   value updates side by side, against the loop
 *   over every key one at a time (kept here): every mask, windows of 1, 3
 *   and 40, query positions inside, before and past the keys, ascending
 *   positions, a cache's positions with repeats, shuffled positions (no
 *   run: the whole loop), head sizes 1 to 67 (1 to 3 keys and values left
 *   over), key counts 0 to 300, grouped heads and a rank's slice of them;
 * - dg_ref_matmul_f64, four rows of x side by side, against one row at a
 *   time: 0 to 9 rows (1 to 3 left over), widths 1 to 131, fp32, bf16 and
 *   fp8 weights with a row stride.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dtype.h"
#include "lib/fp8.h"
#include "lib/ref-ops.h"
#include "tests/harness.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    return test_xorshift(&rng);
}

static float uniform(void) /* [-1, 1) */
{
    return (float)((double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The plain loop: every key, its mask, one dot product at a time. */
static void plain_attention(float *out, const float *q, const int64_t *q_pos, int64_t Tq,
                            const float *k, const float *v, const int64_t *k_pos, int64_t Tk,
                            int nq, int q_base, int nkv, int kv_base, int group, int hd,
                            enum dg_attn_mask mask, int window, float *scores)
{
    const int64_t qdim = (int64_t)nq * hd, kdim = (int64_t)nkv * hd;
    for (int64_t t = 0; t < Tq; t++)
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

enum layout { ASCENDING, REPEATS, SHUFFLED };

struct shape {
    int64_t Tq, Tk;
    int nq, q_base, nkv, kv_base, group, hd;
};

/* One shape, mask, window and layout: both ways, the same bits. */
static int one(const struct shape *s, enum dg_attn_mask mask, int window, enum layout lay)
{
    const int64_t qdim = (int64_t)s->nq * s->hd, kdim = (int64_t)s->nkv * s->hd;
    const size_t nout = (size_t)(s->Tq * qdim);
    float *q = malloc(sizeof(float) * (nout ? nout : 1));
    float *k = malloc(sizeof(float) * (size_t)(s->Tk * kdim + 1));
    float *v = malloc(sizeof(float) * (size_t)(s->Tk * kdim + 1));
    float *want = malloc(sizeof(float) * (nout ? nout : 1));
    float *got = malloc(sizeof(float) * (nout ? nout : 1));
    float *scores = malloc(sizeof(float) * (size_t)(s->Tk + 1));
    int64_t *q_pos = malloc(sizeof(int64_t) * (size_t)(s->Tq + 1));
    int64_t *k_pos = malloc(sizeof(int64_t) * (size_t)(s->Tk + 1));
    int64_t p = (int64_t)(next() % 50);
    CHECK(q && k && v && want && got && scores && q_pos && k_pos);
    for (size_t i = 0; i < nout; i++)
        q[i] = 2.0f * uniform();
    for (int64_t i = 0; i < s->Tk * kdim; i++)
        k[i] = 2.0f * uniform(), v[i] = uniform();
    for (int64_t j = 0; j < s->Tk; j++) {
        k_pos[j] = p;
        p += lay == REPEATS ? (int64_t)(next() % 3) : 1;
    }
    if (lay == SHUFFLED)
        for (int64_t j = s->Tk - 1; j > 0; j--) {
            const int64_t r = (int64_t)(next() % (uint64_t)(j + 1)), x = k_pos[j];
            k_pos[j] = k_pos[r], k_pos[r] = x;
        }
    /* queries from before the first key to past the last */
    for (int64_t t = 0; t < s->Tq; t++)
        q_pos[t] = (int64_t)(next() % (uint64_t)(p + 60)) - 5;
    memset(want, 0xff, sizeof(float) * nout);
    memset(got, 0xff, sizeof(float) * nout);
    plain_attention(want, q, q_pos, s->Tq, k, v, k_pos, s->Tk, s->nq, s->q_base, s->nkv,
                    s->kv_base, s->group, s->hd, mask, window, scores);
    dg_ref_attention_heads(got, q, q_pos, s->Tq, k, v, k_pos, s->Tk, s->nq, s->q_base, s->nkv,
                           s->kv_base, s->group, s->hd, mask, window, scores);
    for (size_t i = 0; i < nout; i++)
        CHECKF(!memcmp(&want[i], &got[i], sizeof(float)),
               "Tq %lld Tk %lld hd %d mask %d window %d layout %d: output %zu is %.9g, the "
               "plain loop's %.9g", (long long)s->Tq, (long long)s->Tk, s->hd, (int)mask, window,
               (int)lay, i, (double)got[i], (double)want[i]);
    free(q), free(k), free(v), free(want), free(got), free(scores), free(q_pos), free(k_pos);
    return 0;
}

static int case_same_bits(void)
{
    static const struct shape shapes[] = {
        {1, 0, 2, 0, 1, 0, 2, 8},       /* no keys */
        {3, 1, 2, 0, 1, 0, 2, 1},       /* one key, head size 1 */
        {7, 5, 4, 0, 2, 0, 2, 3},       /* 5 keys: one group of 4 and one left */
        {17, 38, 4, 0, 1, 0, 4, 16},    /* 2 left over */
        {40, 127, 6, 2, 3, 1, 2, 67},   /* a rank's slice: heads 2..7 of 12, kv 1..3 */
        {64, 300, 8, 0, 2, 0, 4, 32},
        {5, 9, 4, 0, 1, 0, 4, 1},       /* four heads on one kv head, head size 1 */
        {33, 77, 6, 2, 2, 0, 4, 20},    /* heads 2..7: a block of four after two alone */
        {9, 50, 16, 0, 2, 0, 8, 64},    /* eight heads a kv head: two blocks each */
    };
    static const int windows[] = {1, 3, 40};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int lay = ASCENDING; lay <= SHUFFLED; lay++) {
            if (one(&shapes[si], DG_MASK_NONE, 0, (enum layout)lay) ||
                one(&shapes[si], DG_MASK_CAUSAL, 0, (enum layout)lay))
                return 1;
            for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++)
                if (one(&shapes[si], DG_MASK_CAUSAL_WINDOW, windows[w], (enum layout)lay))
                    return 1;
        }
    return 0;
}

/* Weight (j, i) as fp32, read element by element (e4m3 times its row's
 * scale, as the reference scales a row). */
static float weight_value(const struct dg_weight *w, int64_t j, int64_t i)
{
    const size_t at = (size_t)(j * w->stride + i);
    if (w->dtype == DG_DTYPE_F8_E4M3)
        return dg_e4m3_to_f32(((const unsigned char *)w->data)[at]) *
               dg_load_f32(w->scale, w->scale_dtype, (size_t)j);
    return dg_load_f32(w->data, w->dtype, at);
}

/* One row at a time, each sum in double in the order i = 0, 1, ... */
static void plain_matmul_f64(double *y, const float *x, int64_t T, const struct dg_weight *w)
{
    for (int64_t j = 0; j < w->rows; j++)
        for (int64_t t = 0; t < T; t++) {
            double acc = 0;
            for (int64_t i = 0; i < w->cols; i++)
                acc += (double)x[t * w->cols + i] * weight_value(w, j, i);
            y[t * w->rows + j] = acc;
        }
}

static int case_matmul_f64_same_bits(void)
{
    static const int64_t Ts[] = {0, 1, 3, 4, 5, 8, 9};
    static const int64_t widths[] = {1, 7, 64, 131};
    static const enum dg_dtype types[] = {DG_DTYPE_F32, DG_DTYPE_BF16, DG_DTYPE_F8_E4M3};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                const int64_t T = Ts[k], cols = widths[wi], rows = 5, stride = cols + 3;
                const size_t esz = dg_dtype_size(types[ti]);
                unsigned char *wd = malloc(esz * (size_t)(rows * stride));
                float *x = malloc(sizeof(float) * (size_t)(T * cols + 1));
                float *scale = malloc(sizeof(float) * (size_t)rows);
                float *row = malloc(sizeof(float) * (size_t)cols);
                double *want = malloc(sizeof(double) * (size_t)(T * rows + 1));
                double *got = malloc(sizeof(double) * (size_t)(T * rows + 1));
                struct dg_weight w = {.data = wd, .dtype = types[ti], .rows = rows,
                                      .cols = cols, .stride = stride};
                CHECK(wd && x && scale && row && want && got);
                for (size_t i = 0; i < esz * (size_t)(rows * stride); i++)
                    wd[i] = (unsigned char)next();
                if (types[ti] == DG_DTYPE_F32 || types[ti] == DG_DTYPE_BF16)
                    for (int64_t i = 0; i < rows * stride; i++) {
                        /* finite values: a random exponent byte could be inf or NaN */
                        const float f = uniform();
                        if (types[ti] == DG_DTYPE_F32)
                            memcpy(wd + 4 * i, &f, 4);
                        else {
                            const uint16_t h = dg_f32_to_bf16(f);
                            memcpy(wd + 2 * i, &h, 2);
                        }
                    }
                else
                    for (int64_t i = 0; i < rows * stride; i++)
                        wd[i] &= 0x7e; /* (e4m3 0x7f and 0xff are NaN) */
                for (int64_t r = 0; r < rows; r++)
                    scale[r] = 0.5f + (float)r;
                if (types[ti] == DG_DTYPE_F8_E4M3)
                    w.scale = scale, w.scale_dtype = DG_DTYPE_F32;
                for (int64_t i = 0; i < T * cols; i++)
                    x[i] = uniform();
                memset(want, 0xff, sizeof(double) * (size_t)(T * rows + 1));
                memset(got, 0xff, sizeof(double) * (size_t)(T * rows + 1));
                plain_matmul_f64(want, x, T, &w);
                dg_ref_matmul_f64(got, x, T, &w, row);
                CHECKF(!memcmp(want, got, sizeof(double) * (size_t)(T * rows + 1)),
                       "dtype %d, %lld rows of %lld: not the bits of one row at a time",
                       (int)types[ti], (long long)T, (long long)cols);
                free(wd), free(x), free(scale), free(row), free(want), free(got);
            }
    return 0;
}

int main(void)
{
    TEST_CASE(case_same_bits);
    TEST_CASE(case_matmul_f64_same_bits);
    return test_finish();
}
