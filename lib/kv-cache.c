/* kv-cache.c - see kv-cache.h. */
#include "lib/kv-cache.h"

#include <stdlib.h>
#include <string.h>

int dg_kv_cache_init(struct dg_kv_cache *kv, const struct dg_model_config *cfg,
                     int64_t max_length, struct dg_error *err)
{
    return dg_kv_cache_init_heads(kv, cfg, max_length, NULL, err);
}

int dg_kv_cache_init_heads(struct dg_kv_cache *kv, const struct dg_model_config *cfg,
                           int64_t max_length, const int *kv_heads, struct dg_error *err)
{
    memset(kv, 0, sizeof *kv);
    if (max_length < 1)
        return dg_error_set(err, DG_E_INVAL, "kv cache: max_length %lld must be positive",
                            (long long)max_length);
    if (max_length > cfg->max_position_embeddings)
        max_length = cfg->max_position_embeddings;
    kv->layers = calloc((size_t)cfg->num_layers, sizeof *kv->layers);
    if (!kv->layers)
        return dg_error_set(err, DG_E_NOMEM, "kv cache: out of memory");
    kv->n_layers = cfg->num_layers;
    kv->max_length = max_length;
    for (int l = 0; l < cfg->num_layers; l++) {
        struct dg_kv_layer *L = &kv->layers[l];
        L->kv_dim = (kv_heads ? kv_heads[l] : dg_layer_kv_heads(cfg, l)) *
                    dg_layer_head_dim(cfg, l);
        if (cfg->layer_kind[l] == DG_LAYER_SLIDING) {
            L->sliding = 1;
            L->window = cfg->sliding_window - 1;
            if (L->window < 1)
                continue; /* W = 1: nothing is ever read back */
            L->cap = L->window;
            L->k = malloc(sizeof(float) * (size_t)L->cap * (size_t)L->kv_dim);
            L->v = malloc(sizeof(float) * (size_t)L->cap * (size_t)L->kv_dim);
            if (!L->k || !L->v) {
                dg_kv_cache_free(kv);
                return dg_error_set(err, DG_E_NOMEM, "kv cache: out of memory");
            }
        }
    }
    return 0;
}

void dg_kv_cache_free(struct dg_kv_cache *kv)
{
    for (int l = 0; kv->layers && l < kv->n_layers; l++) {
        free(kv->layers[l].k);
        free(kv->layers[l].v);
    }
    free(kv->layers);
    memset(kv, 0, sizeof *kv);
}

void dg_kv_cache_reset(struct dg_kv_cache *kv)
{
    kv->length = 0;
}

static int is_sliding(const struct dg_kv_layer *L)
{
    return L->sliding;
}

int64_t dg_kv_cache_visible(const struct dg_kv_cache *kv, int l)
{
    const struct dg_kv_layer *L = &kv->layers[l];
    if (!is_sliding(L))
        return kv->length;
    if (L->window < 1)
        return 0;
    return kv->length < L->window ? kv->length : L->window;
}

int64_t dg_kv_cache_read(const struct dg_kv_cache *kv, int l, float *k, float *v, int64_t *pos)
{
    const struct dg_kv_layer *L = &kv->layers[l];
    const int64_t n = dg_kv_cache_visible(kv, l), first = kv->length - n;
    const size_t row = sizeof(float) * (size_t)L->kv_dim;

    for (int64_t i = 0; i < n; i++) {
        const int64_t p = first + i, r = is_sliding(L) ? p % L->window : p;
        memcpy(k + i * L->kv_dim, L->k + r * L->kv_dim, row);
        memcpy(v + i * L->kv_dim, L->v + r * L->kv_dim, row);
        if (pos)
            pos[i] = p;
    }
    return n;
}

int dg_kv_cache_append(struct dg_kv_cache *kv, int l, const float *k, const float *v, int64_t T,
                       struct dg_error *err)
{
    struct dg_kv_layer *L = &kv->layers[l];
    const size_t row = sizeof(float) * (size_t)L->kv_dim;
    int64_t start = 0;

    if (T < 0 || kv->length + T > kv->max_length)
        return dg_error_set(err, DG_E_RANGE,
                            "kv cache: %lld + %lld tokens exceed its %lld positions",
                            (long long)kv->length, (long long)T, (long long)kv->max_length);
    if (is_sliding(L)) {
        if (L->window < 1)
            return 0;
        if (T > L->window)
            start = T - L->window; /* earlier rows would be overwritten anyway */
        for (int64_t i = start; i < T; i++) {
            const int64_t r = (kv->length + i) % L->window;
            memcpy(L->k + r * L->kv_dim, k + i * L->kv_dim, row);
            memcpy(L->v + r * L->kv_dim, v + i * L->kv_dim, row);
        }
        return 0;
    }
    if (kv->length + T > L->cap) {
        int64_t cap = L->cap ? L->cap : 64;
        float *nk, *nv;
        while (cap < kv->length + T)
            cap *= 2;
        if (cap > kv->max_length)
            cap = kv->max_length;
        nk = realloc(L->k, (size_t)cap * row);
        if (!nk)
            return dg_error_set(err, DG_E_NOMEM, "kv cache: out of memory for %lld rows",
                                (long long)cap);
        L->k = nk;
        nv = realloc(L->v, (size_t)cap * row);
        if (!nv)
            return dg_error_set(err, DG_E_NOMEM, "kv cache: out of memory for %lld rows",
                                (long long)cap);
        L->v = nv;
        L->cap = cap;
    }
    memcpy(L->k + kv->length * L->kv_dim, k, (size_t)T * row);
    memcpy(L->v + kv->length * L->kv_dim, v, (size_t)T * row);
    return 0;
}

void dg_kv_cache_advance(struct dg_kv_cache *kv, int64_t T)
{
    kv->length += T;
}

uint64_t dg_kv_cache_bytes(const struct dg_kv_cache *kv)
{
    uint64_t b = 0;
    for (int l = 0; l < kv->n_layers; l++)
        b += 2ull * sizeof(float) * (uint64_t)kv->layers[l].cap * (uint64_t)kv->layers[l].kv_dim;
    return b;
}
