/*
 * Description: each forward-pass primitive against values worked out by
 * hand from its formula (model.md §3): RMSNorm with and without weight,
 * gelu-tanh, soft-cap, both RoPE kinds (incl. the 26B proportional table),
 * router top-k with renormalisation, per-expert scale and ties, the mask of
 * every mode and layer kind, grouped-query attention, and the GPU
 * experts' routing layout and ordered sum (slots, padded runs).  The random
 * fill's rectangular slices: exactly the sliced elements of the 1-D fill.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ref-ops.h"
#include "tests/harness.h"

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

static int case_rmsnorm(void)
{
    /* x = [3, 4]: mean(x^2) = 12.5, scale (12.5 + 1e-6)^-1/2 = 0.2828427 */
    float x[2] = {3, 4}, y[2], w[2] = {2, 0.5f};
    dg_ref_rmsnorm(y, x, NULL, 1, 2, 1e-6f);
    CHECK(NEAR(y[0], 0.8485281, 1e-6) && NEAR(y[1], 1.1313708, 1e-6));
    dg_ref_rmsnorm(y, x, w, 1, 2, 1e-6f);
    CHECK(NEAR(y[0], 1.6970562, 1e-6) && NEAR(y[1], 0.5656854, 1e-6));
    /* in place, several rows; a zero row stays zero (eps keeps it finite) */
    {
        float z[6] = {3, 4, 0, 0, -6, 8};
        dg_ref_rmsnorm(z, z, w, 3, 2, 1e-6f);
        CHECK(NEAR(z[0], 1.6970562, 1e-6) && z[2] == 0 && z[3] == 0);
        /* [-6, 8]: mean 50, scale 0.1414214 -> [-0.8485, 1.1314] * w */
        CHECK(NEAR(z[4], -1.6970562, 1e-6) && NEAR(z[5], 0.5656854, 1e-6));
    }
    return 0;
}

static int case_gelu_and_softcap(void)
{
    /* 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) */
    CHECK(dg_gelu_tanh(0) == 0);
    CHECK(NEAR(dg_gelu_tanh(1), 0.8411920, 1e-6));
    CHECK(NEAR(dg_gelu_tanh(-1), -0.1588080, 1e-6));
    CHECK(NEAR(dg_gelu_tanh(2.5f), 2.4849157, 1e-6));
    CHECK(NEAR(dg_gelu_tanh(-3), -0.0036374, 1e-6));
    {
        /* 30 tanh(z / 30): 45 -> 27.154448, -100 -> -29.923739, 0 -> 0 */
        float z[3] = {45, -100, 0};
        dg_ref_softcap(z, 3, 30);
        CHECK(NEAR(z[0], 27.154448, 1e-4) && NEAR(z[1], -29.923739, 1e-4) && z[2] == 0);
        dg_ref_softcap(z, 3, 0); /* no cap: unchanged */
        CHECK(NEAR(z[0], 27.154448, 1e-4));
    }
    {
        /* exps [1, 1, 1/2] / 2.5; large values must not overflow (1000 - ln 2
         * rounds by up to 3e-5 in fp32, hence the tolerance) */
        float s[3] = {1000, 1000, 1000 - logf(2)};
        dg_ref_softmax(s, 3);
        CHECK(NEAR(s[0], 0.4, 2e-5) && NEAR(s[2], 0.2, 2e-5));
    }
    return 0;
}

static int case_rope_default(void)
{
    /* hd 4, theta 1e4: f = [1, 1e4^(-1/2)] = [1, 0.01]; pos 1 rotates the
     * pairs (x0, x2) by 1 rad and (x1, x3) by 0.01 rad */
    struct dg_rope_config r = {DG_ROPE_DEFAULT, 10000.0, 1.0, 1.0};
    float f[2], x[4] = {1, 2, 3, 4};
    dg_rope_inv_freq(&r, 4, f);
    CHECK(f[0] == 1.0f && NEAR(f[1], 0.01, 1e-9));
    dg_ref_rope(x, 1, 4, f, 1);
    CHECK(NEAR(x[0], -1.9841106, 1e-6) && NEAR(x[2], 2.4623779, 1e-6));
    CHECK(NEAR(x[1], 1.9599007, 1e-6) && NEAR(x[3], 4.0197997, 1e-6));
    /* position 0 is the identity; two heads rotate alike */
    {
        float y[8] = {1, 2, 3, 4, 1, 2, 3, 4};
        dg_ref_rope(y, 2, 4, f, 0);
        CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4);
        dg_ref_rope(y, 2, 4, f, 1);
        CHECK(y[4] == y[0] && y[7] == y[3] && NEAR(y[4], -1.9841106, 1e-6));
    }
    return 0;
}

static int case_rope_proportional(void)
{
    /* hd 8, partial 0.25: floor(0.25 * 8 / 2) = 1 rotated pair (x0, x4);
     * the exponent's denominator is the full hd */
    struct dg_rope_config r = {DG_ROPE_PROPORTIONAL, 1e6, 0.25, 1.0};
    float f[4], x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dg_rope_inv_freq(&r, 8, f);
    CHECK(f[0] == 1.0f && f[1] == 0 && f[2] == 0 && f[3] == 0);
    dg_ref_rope(x, 1, 8, f, 2);
    CHECK(NEAR(x[0], -4.9626340, 1e-6) && NEAR(x[4], -1.1714368, 1e-6));
    CHECK(x[1] == 2 && x[2] == 3 && x[3] == 4 && x[5] == 6 && x[6] == 7 && x[7] == 8);
    /* the 26B full layers: hd 512, 64 rotated pairs, f_i = 1e6^(-2i/512) */
    {
        float g[256];
        dg_rope_inv_freq(&r, 512, g);
        CHECK(g[0] == 1.0f && NEAR(g[1], 0.9474635, 1e-6) && NEAR(g[63], 0.0333762, 1e-6));
        for (int i = 64; i < 256; i++)
            CHECKF(g[i] == 0.0f, "pair %d should not rotate", i);
        /* factor divides the frequencies */
        r.factor = 2.0;
        dg_rope_inv_freq(&r, 512, g);
        CHECK(g[0] == 0.5f && g[64] == 0.0f);
    }
    return 0;
}

static int case_router_topk(void)
{
    /* logits [1, 3, 2, 3]: p = [0.0541, 0.3995, 0.1470, 0.3995]; top 2 is
     * the tie {1, 3}, lower index first; renormalised 0.5 each, times the
     * per-expert scales 2 and 0.5 */
    float logits[4] = {1, 3, 2, 3}, scale[4] = {1, 2, 1, 0.5f}, w[3];
    int idx[3];
    dg_ref_router_topk(idx, w, logits, 4, 2, scale);
    CHECK(idx[0] == 1 && idx[1] == 3);
    CHECK(NEAR(w[0], 1.0, 1e-6) && NEAR(w[1], 0.25, 1e-6));
    /* logits [0.5, -1, 2, 1.5, 0], K 3: experts 2, 3, 0 with
     * p / (p2 + p3 + p0) * scale = [1.0930988, 0.1657495, 0.1219517] */
    {
        float l2[5] = {0.5f, -1, 2, 1.5f, 0}, s2[5] = {1, 1.5f, 2, 0.5f, 1};
        dg_ref_router_topk(idx, w, l2, 5, 3, s2);
        CHECK(idx[0] == 2 && idx[1] == 3 && idx[2] == 0);
        CHECK(NEAR(w[0], 1.0930988, 1e-6) && NEAR(w[1], 0.1657495, 1e-6) &&
              NEAR(w[2], 0.1219517, 1e-6));
    }
    /* K = E: every expert, weights = p * scale */
    {
        float l3[2] = {0, 0}, s3[2] = {1, 3};
        dg_ref_router_topk(idx, w, l3, 2, 2, s3);
        CHECK(idx[0] == 0 && idx[1] == 1 && NEAR(w[0], 0.5, 1e-7) && NEAR(w[1], 1.5, 1e-6));
    }
    return 0;
}

static int case_masks(void)
{
    /* model.md §4.3, W = 4 */
    const int W = 4;
    /* encoder, full layers: causal */
    CHECK(dg_mask_visible(DG_MASK_CAUSAL, 10, 0, W) && dg_mask_visible(DG_MASK_CAUSAL, 10, 10, W));
    CHECK(!dg_mask_visible(DG_MASK_CAUSAL, 10, 11, W));
    /* encoder, sliding layers: k <= q and k > q - W (the last W including self) */
    CHECK(dg_mask_visible(DG_MASK_CAUSAL_WINDOW, 10, 10, W));
    CHECK(dg_mask_visible(DG_MASK_CAUSAL_WINDOW, 10, 7, W));
    CHECK(!dg_mask_visible(DG_MASK_CAUSAL_WINDOW, 10, 6, W));
    CHECK(!dg_mask_visible(DG_MASK_CAUSAL_WINDOW, 10, 11, W));
    /* decoder, both kinds: everything handed over (cached window + canvas),
     * including canvas keys after the query */
    CHECK(dg_mask_visible(DG_MASK_NONE, 10, 0, W) && dg_mask_visible(DG_MASK_NONE, 10, 15, W));
    return 0;
}

static int case_attention(void)
{
    /* 2 query heads sharing 1 KV head (GQA), hd 2.  Keys at positions
     * 4, 5, 6: k4 = [0, 0], k5 = [ln 2, 0], k6 = [ln 3, 0]; values
     * v4 = [1, 0], v5 = [0, 1], v6 = [1, 1].  Query head 0 = [1, 0]: scores
     * [0, ln 2, ln 3] -> softmax [1/6, 2/6, 3/6] over all three keys;
     * head 1 = [0, 1]: scores 0 -> uniform. */
    const float l2 = logf(2), l3 = logf(3);
    float q[2 * 4] = {1, 0, 0, 1, /* query at position 5 */ 1, 0, 0, 1 /* position 6 */};
    float k[3 * 2] = {0, 0, l2, 0, l3, 0}, v[3 * 2] = {1, 0, 0, 1, 1, 1};
    int64_t qpos[2] = {5, 6}, kpos[3] = {4, 5, 6};
    float out[2 * 4], scores[3];

    dg_ref_attention(out, q, qpos, 2, k, v, kpos, 3, 2, 1, 2, DG_MASK_NONE, 0, scores);
    CHECK(NEAR(out[0], 4.0 / 6, 1e-6) && NEAR(out[1], 5.0 / 6, 1e-6));
    CHECK(NEAR(out[2], 2.0 / 3, 1e-6) && NEAR(out[3], 2.0 / 3, 1e-6));
    /* causal: the query at 5 sees keys 4 and 5 only: [1/3, 2/3] */
    dg_ref_attention(out, q, qpos, 2, k, v, kpos, 3, 2, 1, 2, DG_MASK_CAUSAL, 0, scores);
    CHECK(NEAR(out[0], 1.0 / 3, 1e-6) && NEAR(out[1], 2.0 / 3, 1e-6));
    CHECK(NEAR(out[4], 4.0 / 6, 1e-6)); /* position 6 sees all three */
    /* window 1: each query sees only its own position */
    dg_ref_attention(out, q, qpos, 2, k, v, kpos, 3, 2, 1, 2, DG_MASK_CAUSAL_WINDOW, 1, scores);
    CHECK(NEAR(out[0], 0, 1e-7) && NEAR(out[1], 1, 1e-7) && NEAR(out[4], 1, 1e-7) &&
          NEAR(out[5], 1, 1e-7));
    /* a query that sees nothing gets zeros, not NaN */
    qpos[0] = 1;
    dg_ref_attention(out, q, qpos, 1, k, v, kpos, 3, 2, 1, 2, DG_MASK_CAUSAL, 0, scores);
    CHECK(out[0] == 0 && out[1] == 0 && out[2] == 0 && out[3] == 0);
    return 0;
}

static int case_matmul_dtypes(void)
{
    /* W [2, 3] = [[1, 2, 3], [-1, 0.5, 4]] in F32, BF16 and F16 (all exact);
     * x [2, 3] = [[1, 1, 1], [2, 0, -1]]: y = x W^T = [[6, 3.5], [-1, -6]] */
    const float wf[6] = {1, 2, 3, -1, 0.5f, 4}, x[6] = {1, 1, 1, 2, 0, -1};
    uint16_t wb[6], wh[6];
    float y[4], row[3];
    struct dg_weight w = {.data = wf, .dtype = DG_DTYPE_F32, .rows = 2, .cols = 3, .name = "w"};

    for (int i = 0; i < 6; i++) {
        wb[i] = dg_f32_to_bf16(wf[i]);
        wh[i] = dg_f32_to_f16(wf[i]);
    }
    for (int t = 0; t < 3; t++) {
        w.data = t == 0 ? (const void *)wf : t == 1 ? (const void *)wb : (const void *)wh;
        w.dtype = t == 0 ? DG_DTYPE_F32 : t == 1 ? DG_DTYPE_BF16 : DG_DTYPE_F16;
        memset(y, 0xff, sizeof y);
        dg_ref_matmul(y, x, 2, &w, row);
        CHECKF(y[0] == 6 && y[1] == 3.5f && y[2] == -1 && y[3] == -6, "dtype %s",
               dg_dtype_name(w.dtype));
    }
    return 0;
}

/* BF16 weights widened in blocks of eight and a tail, whole and through a
 * column view that starts off a block (cols 3..3+n): the product equals
 * the one over the same values stored as F32 (bf16 -> f32 is exact), bit
 * for bit, at widths 1 to 40. */
static int case_matmul_bf16_widths(void)
{
    enum { R = 5, T = 3, CMAX = 43 };
    uint16_t wb[R * CMAX];
    float wf[R * CMAX], x[T * CMAX], y[T * R], want[T * R], row[CMAX];
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < R * CMAX; i++) {
        test_xorshift(&st);
        wb[i] = dg_f32_to_bf16((float)((int)(st >> 40) % 2001 - 1000) / 137.0f);
        wf[i] = dg_bf16_to_f32(wb[i]);
    }
    for (int i = 0; i < T * CMAX; i++)
        x[i] = (float)((i * 29) % 23) / 7.0f - 1.5f;
    for (int n = 1; n <= 40; n++) {
        const struct dg_weight b_all = {.data = wb, .dtype = DG_DTYPE_BF16, .rows = R,
                                        .cols = CMAX, .name = "wb"},
                               f_all = {.data = wf, .dtype = DG_DTYPE_F32, .rows = R,
                                        .cols = CMAX, .name = "wf"};
        const struct dg_weight bv = dg_weight_cols(&b_all, 3, 3 + n),
                               fv = dg_weight_cols(&f_all, 3, 3 + n);
        memset(y, 0xff, sizeof y);
        dg_ref_matmul(want, x, T, &fv, row);
        dg_ref_matmul(y, x, T, &bv, row);
        CHECKF(!memcmp(y, want, sizeof y), "bf16 columns 3..%d", 3 + n);
    }
    {
        const struct dg_weight b = {.data = wb, .dtype = DG_DTYPE_BF16, .rows = R, .cols = CMAX,
                                    .name = "wb"},
                               f = {.data = wf, .dtype = DG_DTYPE_F32, .rows = R, .cols = CMAX,
                                    .name = "wf"};
        dg_ref_matmul(want, x, T, &f, row);
        dg_ref_matmul(y, x, T, &b, row);
        CHECK(!memcmp(y, want, sizeof y));
    }
    return 0;
}

/* Row and column views: y over a view equals the same sub-product of the
 * whole matrix; attention over a slice of heads equals those heads of the
 * whole. */
static int case_views_and_head_slices(void)
{
    float W[5 * 7], x[3 * 7], y_full[3 * 5], y[3 * 5], row[7];
    struct dg_weight w = {.data = W, .dtype = DG_DTYPE_F32, .rows = 5, .cols = 7, .name = "w"};
    for (int i = 0; i < 35; i++)
        W[i] = (float)((i * 37) % 11) - 5.0f;
    for (int i = 0; i < 21; i++)
        x[i] = (float)((i * 13) % 7) - 3.0f;
    dg_ref_matmul(y_full, x, 3, &w, row);
    {
        struct dg_weight r = dg_weight_rows(&w, 1, 4); /* output rows 1..3 */
        dg_ref_matmul(y, x, 3, &r, row);
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < 3; j++)
                CHECK(y[t * 3 + j] == y_full[t * 5 + 1 + j]);
    }
    {
        /* columns 2..5 of W against the matching columns of x: partial sums
         * that add up (exactly, for these small integers) to y */
        struct dg_weight c1 = dg_weight_cols(&w, 0, 2), c2 = dg_weight_cols(&w, 2, 7);
        float xa[3 * 2], xb[3 * 5], ya[15], yb[15];
        for (int t = 0; t < 3; t++) {
            memcpy(xa + t * 2, x + t * 7, 2 * sizeof(float));
            memcpy(xb + t * 5, x + t * 7 + 2, 5 * sizeof(float));
        }
        dg_ref_matmul(ya, xa, 3, &c1, row);
        dg_ref_matmul(yb, xb, 3, &c2, row);
        for (int i = 0; i < 15; i++)
            CHECK(ya[i] + yb[i] == y_full[i]);
        /* a column view of a row view */
        {
            struct dg_weight rc = dg_weight_rows(&c2, 2, 5);
            dg_ref_matmul(y, xb, 3, &rc, row);
            for (int t = 0; t < 3; t++)
                for (int j = 0; j < 3; j++)
                    CHECK(y[t * 3 + j] == yb[t * 5 + 2 + j]);
        }
    }
    {
        /* 6 query heads, 2 KV heads (group 3), hd 2, 2 queries, 3 keys:
         * heads 2..4 read KV heads 0 and 1 */
        float q[2 * 12], k[3 * 4], v[3 * 4], out_full[2 * 12], out[2 * 6], sc[3];
        float qs[2 * 6], ks[3 * 4], vs[3 * 4];
        int64_t qpos[2] = {3, 4}, kpos[3] = {2, 3, 4};
        for (int i = 0; i < 24; i++)
            q[i] = (float)((i * 7) % 5) * 0.25f - 0.5f;
        for (int i = 0; i < 12; i++) {
            k[i] = (float)((i * 3) % 7) * 0.2f - 0.6f;
            v[i] = (float)((i * 5) % 9) * 0.1f;
        }
        dg_ref_attention(out_full, q, qpos, 2, k, v, kpos, 3, 6, 2, 2, DG_MASK_CAUSAL, 0, sc);
        for (int t = 0; t < 2; t++)
            memcpy(qs + t * 6, q + t * 12 + 4, 6 * sizeof(float));
        memcpy(ks, k, sizeof ks);
        memcpy(vs, v, sizeof vs);
        dg_ref_attention_heads(out, qs, qpos, 2, ks, vs, kpos, 3, 3, 2, 2, 0, 3, 2,
                               DG_MASK_CAUSAL, 0, sc);
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 6; i++)
                CHECK(out[t * 6 + i] == out_full[t * 12 + 4 + i]);
    }
    return 0;
}

/* A rectangular slice of the random fill: dg_ref_fill_normal_rect equals,
 * bit for bit, the elements first + r ld + c of dg_ref_fill_normal of the
 * whole tensor (odd first and ld, cols == ld, one column, one row, a slice
 * of a bank), at std > 0 and std = 0. */
static int case_moe_route_and_combine(void)
{
    /* 3 tokens x top-2 over experts 2..4 (e0 2, three experts), tiles of 2
     * rows: expert 2 has picks 0, 3, 5 (3 rows, padded to 4), expert 3
     * pick 2 (1, padded to 2), expert 4 none; picks 1 and 4 are another
     * rank's (experts 0 and 5) */
    static const int32_t idx[6] = {2, 0, 3, 2, 5, 2};
    static const int32_t want_off[4] = {0, 4, 6, 6}, want_slot[6] = {0, -1, 4, 1, -1, 2};
    static const float w[6] = {0.5f, 9, 0.25f, 2, 7, 1};
    int32_t counts[3], off[4], slot[6];
    float ys[12], out[6];
    dg_ref_moe_route(counts, off, slot, idx, 6, 2, 3, 2);
    CHECK(counts[0] == 3 && counts[1] == 1 && counts[2] == 0);
    CHECK(!memcmp(off, want_off, sizeof off) && !memcmp(slot, want_slot, sizeof slot));
    /* row r of ys: [r + 1, 10 (r + 1)]; token 0: 0.5 row 0; token 1:
     * 0.25 row 4 + 2 row 1; token 2: 1 row 2 (k order, others skipped) */
    for (int r = 0; r < 6; r++)
        ys[2 * r] = (float)(r + 1), ys[2 * r + 1] = 10.0f * (float)(r + 1);
    dg_ref_moe_combine(out, ys, slot, w, 3, 2, 2);
    CHECK(out[0] == 0.5f && out[1] == 5.0f && out[2] == 5.25f && out[3] == 52.5f &&
          out[4] == 3.0f && out[5] == 30.0f);
    return 0;
}

static int case_fill_normal_rect(void)
{
    enum { N = 4096 };
    static const struct {
        int64_t rows, cols, ld, first;
    } shape[] = {
        {1, 1000, 1000, 0},      /* one row from 0: the 1-D fill */
        {1, 999, 0, 0},          /* (ld unused with one row) */
        {7, 13, 13, 0},          /* cols == ld: a contiguous run */
        {5, 9, 21, 3},           /* odd first, odd ld */
        {6, 8, 30, 11},          /* even ld, odd first */
        {40, 1, 17, 1},          /* a single column */
        {9, 16, 32, 2 * 9 * 32}, /* matrix 2 of a bank of 9 x 32 matrices */
        {3, 31, 63, 1001},       /* odd cols, odd ld, odd first */
    };
    static const struct {
        uint64_t seed;
        uint32_t tensor;
        float mean, std;
    } par[] = {{0x0123456789abcdefull, 0xfffffffeu, 1.0f, 0.5f}, {42, 7, -0.25f, 0.0f}};
    uint16_t *whole = malloc(N * 2), *slice = malloc(N * 2);
    CHECK(whole && slice);
    for (size_t p = 0; p < sizeof par / sizeof par[0]; p++) {
        dg_ref_fill_normal(whole, N, par[p].seed, par[p].tensor, par[p].mean, par[p].std);
        for (size_t k = 0; k < sizeof shape / sizeof shape[0]; k++) {
            const int64_t R = shape[k].rows, C = shape[k].cols, ld = shape[k].ld,
                          f = shape[k].first;
            CHECK(f + (R - 1) * ld + C <= N && R * C <= N);
            memset(slice, 0xff, N * 2);
            dg_ref_fill_normal_rect(slice, R, C, ld, f, par[p].seed, par[p].tensor,
                                    par[p].mean, par[p].std);
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    CHECKF(slice[r * C + c] == whole[f + r * ld + c],
                           "params %zu, %lld x %lld (ld %lld, first %lld): [%lld][%lld] %#06x, "
                           "want %#06x",
                           p, (long long)R, (long long)C, (long long)ld, (long long)f,
                           (long long)r, (long long)c, slice[r * C + c], whole[f + r * ld + c]);
            /* nothing written past the slice */
            for (int64_t i = R * C; i < N; i++)
                CHECKF(slice[i] == 0xffffu, "[%lld] written", (long long)i);
        }
    }
    /* an empty slice writes nothing */
    memset(slice, 0xff, N * 2);
    dg_ref_fill_normal_rect(slice, 0, 5, 5, 0, 1, 2, 0.0f, 1.0f);
    dg_ref_fill_normal_rect(slice, 5, 0, 5, 0, 1, 2, 0.0f, 1.0f);
    CHECK(slice[0] == 0xffffu);
    free(whole);
    free(slice);
    return 0;
}

int main(void)
{
    TEST_CASE(case_rmsnorm);
    TEST_CASE(case_gelu_and_softcap);
    TEST_CASE(case_rope_default);
    TEST_CASE(case_rope_proportional);
    TEST_CASE(case_router_topk);
    TEST_CASE(case_masks);
    TEST_CASE(case_attention);
    TEST_CASE(case_matmul_dtypes);
    TEST_CASE(case_matmul_bf16_widths);
    TEST_CASE(case_views_and_head_slices);
    TEST_CASE(case_moe_route_and_combine);
    TEST_CASE(case_fill_normal_rect);
    return test_finish();
}
