/*
 * kv-cache.h - the per-sequence KV cache of the CPU backend.
 *
 * Holds, for every layer, the keys (after k_norm and RoPE) and values
 * (after the weight-free v_norm) of the committed tokens, positions
 * 0 .. length-1.  Only encoder passes write it (prompt prefill, canvas
 * commits); decoder passes read it.
 *
 * Full layers keep every position (storage grows by doubling up to
 * max_length).  Sliding layers keep only what any later pass can read: the
 * last W-1 positions (model.md §4.2: a canvas sees exactly the last W-1
 * cached keys; an encoder query at position q >= length sees keys > q - W,
 * all of which are either cached in that window or new).  They live in a
 * ring of W-1 rows, position p in row p mod (W-1).
 *
 * Writing is two-phase so a pass can append layer by layer while every
 * layer still sees the old length: dg_kv_cache_append() for each layer
 * (rows for positions length .. length+T-1), then dg_kv_cache_advance(T).
 */
#ifndef DG_KV_CACHE_H
#define DG_KV_CACHE_H

#include <stdint.h>

#include "lib/error.h"
#include "lib/model-config.h"

struct dg_kv_layer {
    int kv_dim;        /* nkv * hd */
    int sliding;       /* 1: keep only the last `window` rows in a ring */
    int window;        /* W-1 for sliding layers (may be 0 when W = 1) */
    int64_t cap;       /* rows allocated */
    float *k, *v;      /* [cap, kv_dim] */
};

struct dg_kv_cache {
    int n_layers;
    int64_t length;     /* committed tokens */
    int64_t max_length; /* positions this cache may hold */
    struct dg_kv_layer *layers;
};

/* An empty cache for cfg holding at most max_length positions (clamped to
 * max_position_embeddings).  Errors: DG_E_INVAL, DG_E_NOMEM. */
int dg_kv_cache_init(struct dg_kv_cache *kv, const struct dg_model_config *cfg,
                     int64_t max_length, struct dg_error *err);

/* The same holding kv_heads[l] KV heads for layer l (a tensor-parallel
 * rank's share); NULL: the config's. */
int dg_kv_cache_init_heads(struct dg_kv_cache *kv, const struct dg_model_config *cfg,
                           int64_t max_length, const int *kv_heads, struct dg_error *err);

void dg_kv_cache_free(struct dg_kv_cache *kv);

/* Forget every token (keeps the allocations). */
void dg_kv_cache_reset(struct dg_kv_cache *kv);

/* Number of cached rows layer l exposes: min(length, W-1) for sliding
 * layers, length for full ones.  They are positions length-n .. length-1. */
int64_t dg_kv_cache_visible(const struct dg_kv_cache *kv, int l);

/* Copy those rows, oldest first, into k and v ([n, kv_dim] each) and their
 * positions into pos (n entries; may be NULL).  Returns n. */
int64_t dg_kv_cache_read(const struct dg_kv_cache *kv, int l, float *k, float *v, int64_t *pos);

/* Store T rows for layer l at positions length .. length+T-1 (for sliding
 * layers only the last W-1 of them survive).  Errors: DG_E_RANGE past
 * max_length, DG_E_NOMEM. */
int dg_kv_cache_append(struct dg_kv_cache *kv, int l, const float *k, const float *v, int64_t T,
                       struct dg_error *err);

/* Make T appended rows part of the cache: length += T. */
void dg_kv_cache_advance(struct dg_kv_cache *kv, int64_t T);

/* Bytes held by the cache's row storage. */
uint64_t dg_kv_cache_bytes(const struct dg_kv_cache *kv);

#endif
