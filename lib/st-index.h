/*
 * st-index.h - parse model.safetensors.index.json.
 *
 * {"metadata": {"total_size": N, ...}, "weight_map": {"<tensor>": "<shard
 * file>", ...}}.  Only the structure is checked here (a pure function of
 * the bytes, so it can be fuzzed): weight_map is a non-empty object of
 * strings, every shard is a plain file name (no '/', '\', leading '.'; at
 * most 255 bytes), at most DG_MAX_SHARDS distinct shards, total_size (when
 * given) a non-negative integer.  Whether the shards exist and agree is
 * checkpoint.c's business.
 */
#ifndef DG_ST_INDEX_H
#define DG_ST_INDEX_H

#include <stddef.h>

#include "lib/error.h"

#define DG_MAX_SHARDS 4096

struct dg_index_entry {
    char *tensor;
    int shard;                 /* index into shards */
};

struct dg_index {
    size_t n_entries;
    struct dg_index_entry *entries; /* in file order */
    int n_shards;
    char **shards;             /* distinct names, in order of first use */
    long long total_size;      /* -1 when absent */
};

/* Parse len bytes; what names the file in errors.  Errors: DG_E_FORMAT
 * (malformed JSON, wrong types, bad shard names, empty map), DG_E_CONFIG
 * (missing weight_map, bad total_size), DG_E_RANGE (too many shards, or a
 * number past an int64 or a double), DG_E_NOMEM.  On failure *idx is left empty. */
int dg_index_parse(const char *buf, size_t len, const char *what, struct dg_index *idx,
                   struct dg_error *err);

void dg_index_free(struct dg_index *idx);

#endif
