/* st-index.c - see st-index.h. */
#include "lib/st-index.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-util.h"

static int shard_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n <= 255 && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\');
}

static int find_shard(const struct dg_index *idx, const char *name)
{
    for (int i = 0; i < idx->n_shards; i++)
        if (strcmp(idx->shards[i], name) == 0)
            return i;
    return -1;
}

int dg_index_parse(const char *buf, size_t len, const char *what, struct dg_index *out,
                   struct dg_error *err)
{
    struct dg_index idx = {0};
    json_t *root, *wm = NULL, *meta = NULL, *v;
    const char *key;
    char ctx[1100];
    int rc = 0;

    memset(out, 0, sizeof *out);
    idx.total_size = -1;
    root = dg_json_parse(buf, len, what, err);
    if (!root)
        return dg_json_parse_status(err);
    snprintf(ctx, sizeof ctx, "%s: ", what);
    if (!json_is_object(root)) {
        rc = dg_error_set(err, DG_E_FORMAT, "%s: expected a JSON object, got %s", what,
                          dg_json_type_name(root));
        goto out;
    }
    if ((rc = dg_json_get_object(root, "weight_map", DG_JSON_REQUIRED, ctx, &wm, err)) < 0 ||
        (rc = dg_json_get_object(root, "metadata", DG_JSON_OPTIONAL, ctx, &meta, err)) < 0)
        goto out;
    if (meta) {
        char mctx[1200];
        snprintf(mctx, sizeof mctx, "%smetadata.", ctx);
        if ((rc = dg_json_get_int(meta, "total_size", 0, 1LL << 62, DG_JSON_OPTIONAL, mctx,
                                  &idx.total_size, err)) < 0)
            goto out;
    }
    rc = 0;
    if (json_object_size(wm) == 0) {
        rc = dg_error_set(err, DG_E_FORMAT, "%s: weight_map is empty", what);
        goto out;
    }
    idx.entries = calloc(json_object_size(wm), sizeof *idx.entries);
    if (!idx.entries) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        goto out;
    }
    json_object_foreach(wm, key, v) {
        const char *sn;
        int s;
        if (!json_is_string(v)) {
            rc = dg_error_set(err, DG_E_FORMAT, "%sweight_map.%s: expected a file name, got %s",
                              ctx, key, dg_json_type_name(v));
            goto out;
        }
        sn = json_string_value(v);
        if (!shard_name_ok(sn)) {
            rc = dg_error_set(err, DG_E_FORMAT,
                              "%sweight_map.%s: '%.255s' is not a plain file name in the "
                              "checkpoint directory", ctx, key, sn);
            goto out;
        }
        s = find_shard(&idx, sn);
        if (s < 0) {
            char **p;
            if (idx.n_shards == DG_MAX_SHARDS) {
                rc = dg_error_set(err, DG_E_RANGE, "%s: more than %d shards", what, DG_MAX_SHARDS);
                goto out;
            }
            p = realloc(idx.shards, (size_t)(idx.n_shards + 1) * sizeof *p);
            if (!p || !(p[idx.n_shards] = strdup(sn))) {
                if (p)
                    idx.shards = p;
                rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
                goto out;
            }
            idx.shards = p;
            s = idx.n_shards++;
        }
        idx.entries[idx.n_entries].tensor = strdup(key);
        if (!idx.entries[idx.n_entries].tensor) {
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
            goto out;
        }
        idx.entries[idx.n_entries++].shard = s;
    }
out:
    json_decref(root);
    if (rc)
        dg_index_free(&idx);
    else
        *out = idx;
    return rc;
}

void dg_index_free(struct dg_index *idx)
{
    for (size_t i = 0; i < idx->n_entries; i++)
        free(idx->entries[i].tensor);
    for (int i = 0; i < idx->n_shards; i++)
        free(idx->shards[i]);
    free(idx->entries);
    free(idx->shards);
    memset(idx, 0, sizeof *idx);
    idx->total_size = -1;
}
