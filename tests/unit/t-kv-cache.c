/*
 * Description: KV-cache bookkeeping across several commits: sliding layers
 * expose exactly the last W-1 positions (ring wrap-around included, and a
 * prefill longer than the window), full layers every position; rows come
 * back with the right positions and contents; appends past the limit are
 * refused; a sliding layer's memory does not grow with the context.
 */
#include <stdlib.h>
#include <string.h>

#include "lib/kv-cache.h"
#include "lib/model-config.h"
#include "tests/harness.h"

/* the tiny preset: layers 0, 1 sliding (W 8: 7 rows kept, kv_dim 16),
 * layer 2 full (kv_dim 16) */
static void tiny(struct dg_model_config *c)
{
    dg_model_config_preset("tiny", c, NULL);
}

/* rows whose every value encodes (layer, position, k/v, column) */
static void fill(float *k, float *v, int l, int64_t first, int64_t T, int dim)
{
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < dim; j++) {
            k[t * dim + j] = (float)(l * 100000 + (first + t) * 100 + j);
            v[t * dim + j] = -(float)(l * 100000 + (first + t) * 100 + j);
        }
}

static int append_all(struct dg_kv_cache *kv, int64_t T, struct dg_error *err)
{
    float k[64 * 16], v[64 * 16];
    for (int l = 0; l < kv->n_layers; l++) {
        int rc;
        fill(k, v, l, kv->length, T, kv->layers[l].kv_dim);
        if ((rc = dg_kv_cache_append(kv, l, k, v, T, err)) < 0)
            return rc;
    }
    dg_kv_cache_advance(kv, T);
    return 0;
}

/* every layer exposes the right rows with the right contents */
static int verify(const struct dg_kv_cache *kv, int window)
{
    float k[512 * 16], v[512 * 16];
    int64_t pos[512];
    for (int l = 0; l < kv->n_layers; l++) {
        const int dim = kv->layers[l].kv_dim;
        const int64_t want = l < 2 ? (kv->length < window ? kv->length : window) : kv->length;
        const int64_t n = dg_kv_cache_read(kv, l, k, v, pos);
        CHECKF(n == want && dg_kv_cache_visible(kv, l) == want, "layer %d: %lld rows, want %lld",
               l, (long long)n, (long long)want);
        for (int64_t i = 0; i < n; i++) {
            const int64_t p = kv->length - n + i;
            CHECKF(pos[i] == p, "layer %d row %lld: position %lld, want %lld", l, (long long)i,
                   (long long)pos[i], (long long)p);
            for (int j = 0; j < dim; j++)
                CHECKF(k[i * dim + j] == (float)(l * 100000 + p * 100 + j) &&
                           v[i * dim + j] == -(float)(l * 100000 + p * 100 + j),
                       "layer %d position %lld column %d holds the wrong value", l, (long long)p, j);
        }
    }
    return 0;
}

static int case_commits_keep_the_window(void)
{
    struct dg_model_config c;
    struct dg_kv_cache kv;
    struct dg_error err = {0};
    /* a prompt shorter than the window, then commits that wrap the ring */
    const int64_t chunks[] = {3, 2, 5, 16, 1, 7, 9};
    uint64_t bytes_sliding;

    tiny(&c);
    CHECK_OK(dg_kv_cache_init(&kv, &c, 4096, &err), &err);
    CHECK(kv.layers[0].sliding && kv.layers[0].window == 7 && !kv.layers[2].sliding);
    bytes_sliding = 2ull * 4 * 7 * 16;
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        CHECK_OK(append_all(&kv, chunks[i], &err), &err);
        if (verify(&kv, 7))
            return 1;
    }
    CHECK(kv.length == 43);
    /* sliding layers hold 7 rows however long the context; the full one grows */
    CHECK((uint64_t)kv.layers[0].cap * 16 * 4 * 2 == bytes_sliding && kv.layers[2].cap >= 43);
    dg_kv_cache_reset(&kv);
    CHECK(kv.length == 0 && dg_kv_cache_visible(&kv, 0) == 0 && dg_kv_cache_visible(&kv, 2) == 0);
    CHECK_OK(append_all(&kv, 12, &err), &err); /* a prefill longer than the window at once */
    if (verify(&kv, 7))
        return 1;
    dg_kv_cache_free(&kv);
    return 0;
}

static int case_limits(void)
{
    struct dg_model_config c;
    struct dg_kv_cache kv;
    struct dg_error err = {0};
    float k[16 * 16] = {0}, v[16 * 16] = {0};

    tiny(&c);
    CHECK_OK(dg_kv_cache_init(&kv, &c, 20, &err), &err);
    CHECK(kv.max_length == 20);
    CHECK_OK(append_all(&kv, 16, &err), &err);
    CHECK_FAILS(dg_kv_cache_append(&kv, 2, k, v, 5, &err), &err, DG_E_RANGE,
                "kv cache: 16 + 5 tokens exceed its 20 positions");
    CHECK(kv.length == 16 && verify(&kv, 7) == 0);
    dg_kv_cache_free(&kv);
    CHECK_FAILS(dg_kv_cache_init(&kv, &c, 0, &err), &err, DG_E_INVAL, "max_length 0");
    /* clamped to max_position_embeddings */
    CHECK_OK(dg_kv_cache_init(&kv, &c, 1 << 30, &err), &err);
    CHECK(kv.max_length == c.max_position_embeddings);
    dg_kv_cache_free(&kv);
    /* W = 1: a sliding layer keeps nothing */
    c.sliding_window = 1;
    CHECK_OK(dg_kv_cache_init(&kv, &c, 64, &err), &err);
    CHECK_OK(append_all(&kv, 5, &err), &err);
    CHECK(dg_kv_cache_visible(&kv, 0) == 0 && dg_kv_cache_visible(&kv, 2) == 5);
    dg_kv_cache_free(&kv);
    return 0;
}

int main(void)
{
    TEST_CASE(case_commits_keep_the_window);
    TEST_CASE(case_limits);
    return test_finish();
}
