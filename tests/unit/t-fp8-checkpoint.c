/*
 * t-fp8-checkpoint.c - FP8 checkpoints end to end on the CPU side:
 *   quantize   the tiny model (packed expert banks, bf16) through
 *              dg_quantize_dir: it binds; every attention, MLP, expert and
 *              self-conditioning matrix is F8_E4M3 with its scales, and
 *              row j of each dequantizes to e4m3(w_j / s_j) s_j with
 *              s_j = max|w_j| / 448 recomputed here from the source (expert
 *              x of the per-expert tensors is expert x of the bank);
 *              everything else (embedding, routers, norms) is the source's
 *              bits; a second quantization is refused;
 *   refusals   the loader on rewritten copies: a missing scale, a scale of
 *              the wrong shape, dtype, sign or a NaN, F8 weights under a
 *              config.json without quantization_config, an F8 embedding, an
 *              F8 norm, F8 packed expert banks, a scale with no F8 weight;
 *   matmul     dg_ref_matmul over an F8 weight with per-token quantized
 *              activations against the W8A8 oracle dg_ref_fp8_linear (the
 *              sum in double) at several shapes, on row views too (each
 *              row's own scale); bound 1e-5 relative.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lib/checkpoint.h"
#include "lib/fileio.h"
#include "lib/fp8.h"
#include "lib/model-synth.h"
#include "lib/model-weights.h"
#include "lib/quantize.h"
#include "lib/ref-ops.h"
#include "lib/safetensors-write.h"
#include "tests/harness.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform(void)
{
    return (float)((test_xorshift(&rng) >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

/* The tiny preset, bf16, packed banks, written to dir. */
static int write_source(const char *dir, struct dg_error *err)
{
    struct dg_model_config c;
    struct dg_synth_options o;
    struct dg_synth_plan p;
    int rc;
    dg_model_config_preset("tiny", &c, NULL);
    dg_synth_options_default(&o);
    o.dtype = DG_DTYPE_BF16;
    if ((rc = dg_synth_plan_build(&c, &o, &p, err)) < 0)
        return rc;
    rc = dg_synth_write(dir, &c, NULL, &p, &o, err);
    dg_synth_plan_free(&p);
    return rc;
}

static const char *src_dir(void)
{
    static char dir[512];
    static int made;
    struct dg_error err = {0};
    if (!made) {
        snprintf(dir, sizeof dir, "%s", test_path("source"));
        if (write_source(dir, &err) < 0)
            return NULL;
        made = 1;
    }
    return dir;
}

static const char *fp8_dir(void)
{
    static char dir[512];
    static int made;
    struct dg_quantize_report rep;
    struct dg_error err = {0};
    if (!made) {
        snprintf(dir, sizeof dir, "%s", test_path("fp8"));
        if (!src_dir() || dg_quantize_dir(src_dir(), dir, 0, &rep, &err) < 0)
            return NULL;
        made = 1;
    }
    return dir;
}

/* w as floats [rows, cols] (F8: dequantized), through dg_ref_matmul of
 * the identity: y[k, j] = W[j, k] */
static float *dense_of(const struct dg_weight *w)
{
    const int64_t R = w->rows, C = w->cols;
    float *eye = calloc((size_t)(C * C), sizeof *eye), *y = malloc(sizeof(float) * (size_t)(C * R));
    float *out = malloc(sizeof(float) * (size_t)(R * C)), *buf = malloc(sizeof(float) * (size_t)C);
    if (!eye || !y || !out || !buf) {
        free(eye), free(y), free(out), free(buf);
        return NULL;
    }
    for (int64_t k = 0; k < C; k++)
        eye[k * C + k] = 1.0f;
    dg_ref_matmul(y, eye, C, w, buf);
    for (int64_t j = 0; j < R; j++)
        for (int64_t k = 0; k < C; k++)
            out[j * C + k] = y[k * R + j];
    free(eye), free(y), free(buf);
    return out;
}

/* fq (the F8 weight) against src quantized here, row by row */
static int same_quantized(const struct dg_weight *fq, const struct dg_weight *src)
{
    float *q, *s;
    CHECK(fq->dtype == DG_DTYPE_F8_E4M3 && fq->scale && fq->rows == src->rows &&
          fq->cols == src->cols);
    q = dense_of(fq);
    s = dense_of(src);
    CHECK(q && s);
    for (int64_t j = 0; j < src->rows; j++) {
        const float *sr = s + j * src->cols, *qr = q + j * src->cols;
        float amax = 0, sc;
        for (int64_t k = 0; k < src->cols; k++)
            amax = fmaxf(amax, fabsf(sr[k]));
        sc = amax > 0 ? amax / 448.0f : 1.0f;
        for (int64_t k = 0; k < src->cols; k++) {
            const float want = dg_e4m3_to_f32(dg_f32_to_e4m3(sr[k] / sc)) * sc;
            CHECKF(qr[k] == want, "%s row %lld col %lld: %g, want %g", fq->name, (long long)j,
                   (long long)k, (double)qr[k], (double)want);
        }
    }
    free(q);
    free(s);
    return 0;
}

static int same_bits(const struct dg_weight *a, const struct dg_weight *b)
{
    CHECK(a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols);
    CHECK(memcmp(a->data, b->data, (size_t)(a->rows * a->cols) * dg_dtype_size(a->dtype)) == 0);
    return 0;
}

static int quantize(void)
{
    struct dg_checkpoint cs, cq;
    struct dg_model ms, mq;
    struct dg_quantize_report rep;
    struct dg_error err = {0};
    CHECK(fp8_dir());
    CHECK_OK(dg_model_load(src_dir(), &cs, &ms, &err), &err);
    CHECK_OK(dg_model_load(fp8_dir(), &cq, &mq, &err), &err);
    CHECK(mq.cfg.fp8 == 1 && mq.cfg.fp8_act_per_token == 1 && dg_model_has_fp8(&mq) &&
          !dg_model_has_fp8(&ms));
    for (int l = 0; l < ms.cfg.num_layers; l++) {
        const struct dg_layer_weights *S = &ms.layers[l], *Q = &mq.layers[l];
        CHECK(S->experts_packed && !Q->experts_packed);
        CHECK(same_quantized(&Q->q_proj, &S->q_proj) == 0);
        CHECK(same_quantized(&Q->o_proj, &S->o_proj) == 0);
        CHECK(same_quantized(&Q->mlp_down, &S->mlp_down) == 0);
        for (int x = 0; x < ms.cfg.num_experts; x++) {
            CHECK(same_quantized(&Q->expert_gate[x], &S->expert_gate[x]) == 0);
            CHECK(same_quantized(&Q->expert_up[x], &S->expert_up[x]) == 0);
            CHECK(same_quantized(&Q->expert_down[x], &S->expert_down[x]) == 0);
        }
        CHECK(same_bits(&Q->router_proj, &S->router_proj) == 0);
        CHECK(same_bits(&Q->input_norm, &S->input_norm) == 0);
        CHECK(Q->scalar_encoder == S->scalar_encoder && Q->scalar_decoder == S->scalar_decoder);
    }
    CHECK(same_quantized(&mq.sc_down, &ms.sc_down) == 0);
    CHECK(same_bits(&mq.embed, &ms.embed) == 0);
    CHECK(mq.stats.params_total == ms.stats.params_total);
    dg_model_free(&mq);
    dg_checkpoint_close(&cq);
    dg_model_free(&ms);
    dg_checkpoint_close(&cs);
    /* an FP8 checkpoint is not quantized again */
    CHECK_FAILS(dg_quantize_dir(fp8_dir(), test_path("again"), 0, &rep, &err), &err,
                DG_E_UNSUPPORTED, "already quantized");
    return 0;
}

/* ---- rewritten copies --------------------------------------------------- */

struct rw_tensor {
    char name[160];
    enum dg_dtype dtype;
    int ndim;
    int64_t shape[DG_ST_MAX_DIMS];
    unsigned char *data;
    size_t nbytes;
};

struct rw {
    struct rw_tensor *t;
    size_t n;
};

static int rw_fill(void *ud, size_t i, void *buf, size_t nbytes, struct dg_error *err)
{
    const struct rw *r = ud;
    (void)err;
    memcpy(buf, r->t[i].data, nbytes);
    return 0;
}

/* dir's tensors (and config.json, or cfg_text when given) rewritten into
 * a new directory by mutate (which may change, add after the last, or
 * drop entries by emptying their names); returns the new directory. */
static const char *rewrite(const char *dir, const char *cfg_text,
                           void (*mutate)(struct rw *r), struct dg_error *err)
{
    static int counter;
    static char out[512];
    struct dg_checkpoint ck;
    struct rw r = {0};
    struct dg_st_out_tensor *ot;
    char *text = NULL, *path;
    size_t len, n = 0;
    int rc;

    snprintf(out, sizeof out, "%s", test_path(counter++ ? "rw1" : "rw0"));
    snprintf(out + strlen(out), sizeof out - strlen(out), "-%d", counter);
    if (dg_checkpoint_open(dir, &ck, err) < 0)
        return NULL;
    r.t = calloc(ck.n_tensors + 4, sizeof *r.t);
    ot = calloc(ck.n_tensors + 4, sizeof *ot);
    for (size_t i = 0; i < ck.n_tensors; i++) {
        const struct dg_st_tensor *t = ck.tensors[i].t;
        struct rw_tensor *w = &r.t[r.n++];
        snprintf(w->name, sizeof w->name, "%s", t->name);
        w->dtype = t->dtype;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->nbytes = (size_t)(t->end - t->begin);
        w->data = malloc(w->nbytes + 1);
        memcpy(w->data, t->data, w->nbytes);
    }
    mutate(&r);
    mkdir(out, 0755);
    if (!cfg_text) {
        path = dg_path_join(dir, "config.json");
        dg_file_read(path, 1 << 20, &text, &len, err);
        free(path);
    }
    dg_write_text(out, "config.json", cfg_text ? cfg_text : text, err);
    free(text);
    for (size_t i = 0; i < r.n; i++) {
        if (!r.t[i].name[0]) {
            free(r.t[i].data);
            continue;
        }
        r.t[n++] = r.t[i];
    }
    for (size_t i = 0; i < n; i++) {
        ot[i].name = r.t[i].name;
        ot[i].dtype = r.t[i].dtype;
        ot[i].ndim = r.t[i].ndim;
        memcpy(ot[i].shape, r.t[i].shape, sizeof ot[i].shape);
    }
    path = dg_path_join(out, "model.safetensors");
    rc = dg_st_write(path, ot, n, rw_fill, &r, err);
    free(path);
    for (size_t i = 0; i < n; i++)
        free(r.t[i].data);
    free(r.t);
    free(ot);
    dg_checkpoint_close(&ck);
    return rc < 0 ? NULL : out;
}

static struct rw_tensor *find(struct rw *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->t[i].name, name))
            return &r->t[i];
    return NULL;
}

#define QS "model.decoder.layers.0.self_attn.q_proj.weight_scale"

static void drop_scale(struct rw *r) { find(r, QS)->name[0] = 0; }

static void wide_scale(struct rw *r)
{
    struct rw_tensor *t = find(r, QS);
    t->shape[1] = 2;
    t->data = realloc(t->data, 2 * t->nbytes);
    memcpy(t->data + t->nbytes, t->data, t->nbytes);
    t->nbytes *= 2;
}

static void negative_scale(struct rw *r)
{
    const float v = -0.5f;
    memcpy(find(r, QS)->data + 4, &v, 4);
}

static void nan_scale(struct rw *r)
{
    const float v = NAN;
    memcpy(find(r, QS)->data, &v, 4);
}

static void int_scale(struct rw *r) { find(r, QS)->dtype = DG_DTYPE_I32; }

/* a new F32 "<of>_scale" [rows of of, 1] of zeros, after the last */
static void add_scale(struct rw *r, const struct rw_tensor *of)
{
    struct rw_tensor *s = &r->t[r->n++];
    snprintf(s->name, sizeof s->name, "%s_scale", of->name);
    s->dtype = DG_DTYPE_F32;
    s->ndim = 2;
    s->shape[0] = of->shape[0];
    s->shape[1] = 1;
    s->nbytes = 4 * (size_t)of->shape[0];
    s->data = calloc(s->nbytes, 1);
}

static void f8_embedding(struct rw *r)
{
    struct rw_tensor *e = find(r, "model.decoder.embed_tokens.weight");
    e->dtype = DG_DTYPE_F8_E4M3;
    e->nbytes /= 2; /* (the first bytes: any values will do) */
    add_scale(r, e);
}

static void f8_norm(struct rw *r)
{
    struct rw_tensor *t = find(r, "model.decoder.layers.0.input_layernorm.weight");
    t->dtype = DG_DTYPE_F8_E4M3;
    t->nbytes /= 2;
}

static void f8_bank(struct rw *r)
{
    struct rw_tensor *t = find(r, "model.decoder.layers.0.experts.gate_up_proj");
    t->dtype = DG_DTYPE_F8_E4M3;
    t->nbytes /= 2;
}

static void orphan_scale(struct rw *r)
{
    add_scale(r, find(r, "model.decoder.layers.0.router.proj.weight"));
}

static void nothing(struct rw *r) { (void)r; }

static int load_fails(const char *dir, enum dg_status want, const char *needle)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    CHECK(dir);
    CHECK_FAILS(dg_model_load(dir, &ck, &m, &err), &err, want, needle);
    return 0;
}

static int refusals(void)
{
    struct dg_model_config c;
    struct dg_error err = {0};
    char *plain, *fp8cfg;
    CHECK(fp8_dir());
    CHECK(load_fails(rewrite(fp8_dir(), NULL, drop_scale, &err), DG_E_MISSING,
                     "its per-channel scales") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, wide_scale, &err), DG_E_SHAPE,
                     "a scale per output channel") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, negative_scale, &err), DG_E_CONFIG,
                     "scale 1 is -0.5") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, nan_scale, &err), DG_E_CONFIG,
                     "must be finite") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, int_scale, &err), DG_E_DTYPE,
                     "not supported for scales") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, f8_embedding, &err), DG_E_DTYPE,
                     "the embedding stays in bf16") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, f8_norm, &err), DG_E_DTYPE, "not a matrix") == 0);
    CHECK(load_fails(rewrite(fp8_dir(), NULL, orphan_scale, &err), DG_E_EXTRA,
                     "router.proj.weight_scale") == 0);
    /* F8 tensors under a config.json that does not say so */
    dg_model_config_preset("tiny", &c, NULL);
    plain = dg_model_config_to_json(&c, 0);
    CHECK(plain);
    CHECK(load_fails(rewrite(fp8_dir(), plain, nothing, &err), DG_E_CONFIG,
                     "has no FP8 quantization_config") == 0);
    /* packed banks in F8, under a config that allows FP8 */
    c.fp8 = 1;
    fp8cfg = dg_model_config_to_json(&c, 0);
    CHECK(fp8cfg);
    CHECK(load_fails(rewrite(src_dir(), fp8cfg, f8_bank, &err), DG_E_DTYPE,
                     "store them per expert") == 0);
    free(plain);
    free(fp8cfg);
    return 0;
}

/* ---- the W8A8 matmul ------------------------------------------------------ */

static int matmul(void)
{
    static const int shapes[][3] = {{1, 7, 16}, {5, 33, 130}, {16, 64, 2816}, {3, 130, 704}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *x = malloc(sizeof(float) * (size_t)(T * K)), *w = malloc(sizeof(float) * (size_t)(N * K));
        float *xq = malloc(sizeof(float) * (size_t)(T * K)), *sa = malloc(sizeof(float) * (size_t)T);
        float *sw = malloc(sizeof(float) * (size_t)N), *y = malloc(sizeof(float) * (size_t)(T * N));
        float *ref = malloc(sizeof(float) * (size_t)(T * N)), *row = malloc(sizeof(float) * (size_t)K);
        uint8_t *qa = malloc((size_t)(T * K)), *qw = malloc((size_t)(N * K));
        struct dg_weight dw;
        double num = 0, den = 0;
        CHECK(x && w && xq && sa && sw && y && ref && row && qa && qw);
        for (int i = 0; i < T * K; i++)
            x[i] = uniform() * (i % 5 == 0 ? 8.0f : 1.0f);
        for (int i = 0; i < N * K; i++)
            w[i] = uniform() * 0.05f;
        dg_fp8_quantize_rows(w, (size_t)N, (size_t)K, (size_t)K, qw, sw);
        dg_fp8_quantize_rows(x, (size_t)T, (size_t)K, (size_t)K, qa, sa);
        dg_ref_fp8_linear(ref, qa, sa, qw, sw, (size_t)T, (size_t)N, (size_t)K);
        dw = (struct dg_weight){qw, DG_DTYPE_F8_E4M3, N, K, 0, "w", sw, DG_DTYPE_F32};
        dg_fp8_fake_quant_rows(xq, x, (size_t)T, (size_t)K);
        for (int i = 0; i < T * N; i++)
            y[i] = NAN;
        dg_ref_matmul(y, xq, T, &dw, row);
        for (int i = 0; i < T * N; i++) {
            CHECK(!isnan(y[i]));
            num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
            den += (double)ref[i] * ref[i];
        }
        printf("# W8A8 %d x %d x %d: relative error %.2e against the oracle\n", T, N, K,
               sqrt(num / den));
        CHECK(sqrt(num / den) <= 1e-5);
        /* rows [N/3, N) alone: each keeps its own scale (the same bits as
         * those rows of the whole product) */
        {
            const int r0 = N / 3;
            const struct dg_weight v = dg_weight_rows(&dw, r0, N);
            float *yv = malloc(sizeof(float) * (size_t)(T * (N - r0)));
            CHECK(yv);
            dg_ref_matmul(yv, xq, T, &v, row);
            for (int t = 0; t < T; t++)
                for (int n = r0; n < N; n++)
                    CHECKF(yv[t * (N - r0) + (n - r0)] == y[t * N + n], "row view %d,%d", t, n);
            free(yv);
        }
        free(x), free(w), free(xq), free(sa), free(sw), free(y), free(ref), free(row), free(qa),
            free(qw);
    }
    return 0;
}

int main(void)
{
    TEST_CASE(quantize);
    TEST_CASE(refusals);
    TEST_CASE(matmul);
    return test_finish();
}
