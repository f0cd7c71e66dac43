/* gpu-util.c - see gpu-util.h. */
#include "tests/gpu/gpu-util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "lib/dtype.h"
#include "lib/gen-settings.h"
#include "tests/harness.h"

static uint64_t state = 0x853c49e6748fea9bull;

void gt_seed(uint64_t seed)
{
    state = seed;
}

uint64_t gt_next(void)
{
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 16;
}

float gt_uniform(void)
{
    return (float)(gt_next() & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

int gt_rand_bf16(size_t n, float amp, uint16_t **h, float **f)
{
    *h = malloc(n * sizeof **h + 1);
    *f = malloc(n * sizeof **f + 1);
    if (!*h || !*f) {
        free(*h);
        free(*f);
        *h = NULL;
        *f = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        (*h)[i] = dg_f32_to_bf16(gt_uniform() * amp);
        (*f)[i] = dg_bf16_to_f32((*h)[i]);
    }
    return 0;
}

int gt_rand_elts(enum dg_elt e, size_t n, float amp, void **h, float **f)
{
    float *v;
    if (e == DG_ELT_BF16) {
        uint16_t *b = NULL;
        const int rc = gt_rand_bf16(n, amp, &b, f);
        *h = b;
        return rc;
    }
    v = malloc(n * sizeof *v + 1);
    *h = malloc(n * sizeof *v + 1);
    if (!v || !*h) {
        free(v);
        free(*h);
        *h = NULL;
        *f = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = gt_uniform() * amp;
    memcpy(*h, v, n * sizeof *v);
    *f = v;
    return 0;
}

void *gt_out_alloc(size_t bytes, size_t guard_bytes, unsigned char guard, struct dg_error *err)
{
    unsigned char *g = malloc(guard_bytes + 1);
    void *d = NULL;
    if (!g) {
        dg_error_set(err, DG_E_NOMEM, "out of memory");
        return NULL;
    }
    memset(g, guard, guard_bytes);
    if (dg_cuda_alloc(&d, bytes + guard_bytes, 0, err) < 0 ||
        (bytes && dg_cuda_memset(d, 0xff, bytes, 0, err) < 0) ||
        (guard_bytes && dg_cuda_upload((unsigned char *)d + bytes, g, guard_bytes, 0, err) < 0)) {
        dg_cuda_free(d);
        d = NULL;
    }
    free(g);
    return d;
}

void *gt_upload(const void *h, size_t bytes, struct dg_error *err)
{
    void *d = NULL;
    if (dg_cuda_alloc(&d, bytes ? bytes : 1, 0, err) < 0)
        return NULL;
    if (bytes && dg_cuda_upload(d, h, bytes, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

int gt_setup(const char *prog)
{
    struct dg_error err = {0};
    int n = 0;
    if (dg_gpu_count(&n, &err) < 0 || n < 1) {
        printf("skip %s: no GPU here%s%s\n", prog, err.msg[0] ? ": " : "", err.msg);
        return 77;
    }
    if (dg_cuda_use(0, &err) < 0) {
        printf("not ok %s/setup: %s\n", prog, err.msg);
        return 1;
    }
    return 0;
}

double gt_rel_err(const float *got, const float *ref, int64_t rows, int64_t cols,
                  int64_t *agree)
{
    double num = 0, den = 0;
    *agree = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t ag = 0, ar = 0;
        for (int64_t j = 0; j < cols; j++) {
            const double d = (double)got[i * cols + j] - ref[i * cols + j];
            if (!isfinite(got[i * cols + j]))
                return INFINITY;
            num += d * d;
            den += (double)ref[i * cols + j] * ref[i * cols + j];
            if (got[i * cols + j] > got[i * cols + ag])
                ag = j;
            if (ref[i * cols + j] > ref[i * cols + ar])
                ar = j;
        }
        *agree += ag == ar;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void gt_on_event(void *ctx, const struct dg_gen_event *ev)
{
    struct gt_sink *s = ctx;
    for (int i = 0; i < s->n; i++) {
        struct gt_outcome *o = &s->out[i];
        if (o->id != ev->id)
            continue;
        if (ev->kind == DG_EVENT_CANVAS) {
            for (int j = 0; j < ev->n_ids && o->n < GT_MAX_OUT; j++)
                o->ids[o->n++] = ev->ids[j];
        } else {
            o->done = 1;
            o->finish = ev->finish;
        }
    }
}

int gt_generate(struct dg_backend *b, const struct dg_checkpoint *ck, const struct dg_model *m,
                const int *plen, int first, int n, int max_tokens, int steps,
                struct gt_sink *sink)
{
    return gt_generate_with(b, ck, m, plen, first, n, max_tokens, steps, NULL, sink);
}

int gt_generate_with(struct dg_backend *b, const struct dg_checkpoint *ck,
                     const struct dg_model *m, const int *plen, int first, int n, int max_tokens,
                     int steps, void (*adjust)(struct dg_gen_settings *), struct gt_sink *sink)
{
    struct dg_engine *e = NULL;
    struct dg_engine_config ec;
    struct dg_error err = {0};
    int rc;

    memset(sink, 0, sizeof *sink);
    dg_engine_config_default(&ec, &m->cfg);
    ec.max_batch = GT_NREQ;
    ec.prefill_chunk = 64;
    ec.max_context = 512;
    rc = dg_engine_create(b, &ec, NULL, gt_on_event, sink, &e, &err);
    if (rc < 0)
        b->ops->destroy(b);
    CHECK_OK(rc, &err);
    for (int i = 0; i < n; i++) {
        const int r = first + i;
        struct dg_gen_settings s;
        int32_t prompt[256];
        gt_rand_ids(prompt, plen[r], m->cfg.vocab_size, 1000 + (uint64_t)r);
        dg_gen_settings_defaults(&s, &m->cfg, &ck->generation);
        s.seed = 42 + (uint64_t)r;
        s.seed_set = 1;
        s.max_tokens = max_tokens;
        s.max_denoising_steps = steps;
        if (adjust)
            adjust(&s);
        rc = dg_engine_submit(e, prompt, plen[r], &s, NULL, &sink->out[i].id, &err);
        if (rc < 0) {
            dg_engine_destroy(e);
            b->ops->destroy(b);
        }
        CHECK_OK(rc, &err);
        sink->n++;
    }
    for (int guard = 0; guard < 100000 && dg_engine_step(e) > 0; guard++)
        ;
    dg_engine_destroy(e);
    b->ops->destroy(b);
    for (int i = 0; i < n; i++)
        CHECKF(sink->out[i].done && sink->out[i].finish != DG_FINISH_ERROR &&
                   sink->out[i].n > 0,
               "request %d: done %d, finish %s, %d ids", i, sink->out[i].done,
               dg_finish_name(sink->out[i].finish), sink->out[i].n);
    return 0;
}

int gt_compare(const char *what, const struct gt_sink *a, const struct gt_sink *b, int n)
{
    int differ = 0;
    for (int i = 0; i < n; i++) {
        const struct gt_outcome *x = &a->out[i], *y = &b->out[i];
        int j = 0;
        while (j < x->n && j < y->n && x->ids[j] == y->ids[j])
            j++;
        if (j == x->n && j == y->n && x->finish == y->finish) {
            printf("# %s: request %d: %d ids equal (%s)\n", what, i, x->n,
                   dg_finish_name(x->finish));
            continue;
        }
        differ++;
        printf("# %s: request %d: first difference at id %d of %d/%d (%d vs %d)\n", what, i, j,
               x->n, y->n, j < x->n ? x->ids[j] : -1, j < y->n ? y->ids[j] : -1);
    }
    return differ;
}

void gt_rand_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed)
{
    gt_seed(seed);
    for (int64_t i = 0; i < n; i++)
        ids[i] = 3 + (int32_t)(gt_next() % (uint64_t)(V - 3));
}
