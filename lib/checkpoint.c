/* checkpoint.c - see checkpoint.h. */
#include "lib/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/model-weights.h"
#include "lib/st-index.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static int read_config(const char *dir, struct dg_checkpoint *ck, struct dg_error *err)
{
    char *path = dg_path_join(dir, "config.json"), *buf = NULL;
    size_t len;
    int rc;

    if (!path)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    rc = dg_file_read(path, DG_CONFIG_JSON_MAX, &buf, &len, err);
    if (rc == 0)
        rc = dg_model_config_parse(buf, len, path, &ck->config, err);
    free(buf);
    buf = NULL;
    free(path);
    if (rc)
        return rc;

    dg_generation_config_defaults(&ck->generation);
    path = dg_path_join(dir, "generation_config.json");
    if (!path)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    if (dg_file_exists(path)) {
        rc = dg_file_read(path, DG_CONFIG_JSON_MAX, &buf, &len, err);
        if (rc == 0)
            rc = dg_generation_config_parse(buf, len, path, &ck->generation, err);
        ck->has_generation_config = rc == 0;
    }
    free(buf);
    free(path);
    return rc;
}

static int add_shard(struct dg_checkpoint *ck, const char *name, struct dg_error *err)
{
    struct dg_ckpt_shard *sh = &ck->shards[ck->n_shards];
    int rc;

    sh->name = strdup(name);
    sh->path = dg_path_join(ck->dir, name);
    if (!sh->name || !sh->path) {
        free(sh->name);
        free(sh->path);
        sh->name = sh->path = NULL;
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    }
    ck->n_shards++;
    rc = dg_file_map(sh->path, &sh->map, err);
    if (rc)
        return rc;
    return dg_st_parse(sh->map.addr, sh->map.size, sh->path, &sh->st, err);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct dg_ckpt_tensor *)a)->name,
                  ((const struct dg_ckpt_tensor *)b)->name);
}

/* Merge every shard's tensors into ck->tensors, sorted; reject a name
 * that occurs in two shards. */
static int build_table(struct dg_checkpoint *ck, struct dg_error *err)
{
    size_t n = 0;

    for (int s = 0; s < ck->n_shards; s++)
        n += ck->shards[s].st.n_tensors;
    ck->tensors = calloc(n ? n : 1, sizeof *ck->tensors);
    if (!ck->tensors)
        return dg_error_set(err, DG_E_NOMEM, "out of memory for %zu tensors", n);
    for (int s = 0; s < ck->n_shards; s++) {
        const struct dg_st_file *f = &ck->shards[s].st;
        for (size_t i = 0; i < f->n_tensors; i++) {
            struct dg_ckpt_tensor *e = &ck->tensors[ck->n_tensors++];
            e->name = f->tensors[i].name;
            e->t = &f->tensors[i];
            e->shard = s;
            ck->total_bytes += f->tensors[i].end - f->tensors[i].begin;
        }
    }
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, cmp_tensor_name);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (strcmp(ck->tensors[i - 1].name, ck->tensors[i].name) == 0)
            return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s' appears in both %s and %s",
                                ck->dir, ck->tensors[i].name,
                                ck->shards[ck->tensors[i - 1].shard].name,
                                ck->shards[ck->tensors[i].shard].name);
    return 0;
}

static int open_sharded(struct dg_checkpoint *ck, const char *index_path, struct dg_error *err)
{
    struct dg_index idx;
    char *buf = NULL;
    size_t len;
    int rc;

    rc = dg_file_read(index_path, DG_INDEX_JSON_MAX, &buf, &len, err);
    if (rc)
        return rc;
    rc = dg_index_parse(buf, len, index_path, &idx, err);
    free(buf);
    if (rc)
        return rc;

    ck->shards = calloc((size_t)idx.n_shards, sizeof *ck->shards);
    if (!ck->shards) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < idx.n_shards; s++) {
        char *p = dg_path_join(ck->dir, idx.shards[s]);
        int exists = p && dg_file_exists(p);
        free(p);
        if (!exists) {
            const char *first = "";
            for (size_t i = 0; i < idx.n_entries; i++)
                if (idx.entries[i].shard == s) {
                    first = idx.entries[i].tensor;
                    break;
                }
            rc = dg_error_set(err, DG_E_MISSING,
                              "%s names shard '%s' (for tensor '%s'), which does not exist in %s",
                              index_path, idx.shards[s], first, ck->dir);
            goto out;
        }
        if ((rc = add_shard(ck, idx.shards[s], err)) < 0)
            goto out;
    }
    if ((rc = build_table(ck, err)) < 0)
        goto out;

    /* the index and the shards must describe the same tensors */
    for (size_t i = 0; i < idx.n_entries; i++) {
        const struct dg_index_entry *e = &idx.entries[i];
        const struct dg_ckpt_tensor *t = dg_checkpoint_find(ck, e->tensor);
        if (!t) {
            rc = dg_error_set(err, DG_E_MISSING, "%s lists tensor '%s' in %s, but no shard holds it",
                              index_path, e->tensor, idx.shards[e->shard]);
            goto out;
        }
        if (t->shard != e->shard) { /* ck->shards[] are in the index's shard order */
            rc = dg_error_set(err, DG_E_FORMAT, "%s lists tensor '%s' in %s, but it is in %s",
                              index_path, e->tensor, idx.shards[e->shard],
                              ck->shards[t->shard].name);
            goto out;
        }
    }
    if (ck->n_tensors != idx.n_entries) {
        /* every index entry was found, so some shard tensor is unlisted; name it */
        unsigned char *listed = calloc(ck->n_tensors, 1);
        if (!listed) {
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < idx.n_entries; i++)
            listed[dg_checkpoint_find(ck, idx.entries[i].tensor) - ck->tensors] = 1;
        for (size_t i = 0; i < ck->n_tensors; i++)
            if (!listed[i]) {
                rc = dg_error_set(err, DG_E_FORMAT, "%s holds tensor '%s', which %s does not list",
                                  ck->shards[ck->tensors[i].shard].path, ck->tensors[i].name,
                                  index_path);
                break;
            }
        free(listed);
        if (rc)
            goto out;
    }
    if (idx.total_size >= 0 && (unsigned long long)idx.total_size != ck->total_bytes)
        dg_log(DG_LOG_WARN, "%s: metadata.total_size is %lld but the shards hold %llu tensor bytes",
               index_path, idx.total_size, ck->total_bytes);
    ck->sharded = 1;
out:
    dg_index_free(&idx);
    return rc;
}

int dg_checkpoint_open(const char *dir, struct dg_checkpoint *ck, struct dg_error *err)
{
    char *single = NULL, *index = NULL;
    int rc;

    memset(ck, 0, sizeof *ck);
    ck->dir = strdup(dir);
    single = dg_path_join(dir, SINGLE_NAME);
    index = dg_path_join(dir, INDEX_NAME);
    if (!ck->dir || !single || !index) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = read_config(dir, ck, err)) < 0)
        goto out;
    if (dg_file_exists(single)) {
        if (dg_file_exists(index))
            dg_log(DG_LOG_WARN, "%s: both %s and %s exist; using %s, as transformers does", dir,
                   SINGLE_NAME, INDEX_NAME, SINGLE_NAME);
        ck->shards = calloc(1, sizeof *ck->shards);
        if (!ck->shards) {
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = add_shard(ck, SINGLE_NAME, err)) < 0 || (rc = build_table(ck, err)) < 0)
            goto out;
    } else if (dg_file_exists(index)) {
        rc = open_sharded(ck, index, err);
    } else {
        rc = dg_error_set(err, DG_E_MISSING, "%s: neither %s nor %s exists", dir, SINGLE_NAME,
                          INDEX_NAME);
    }
out:
    free(single);
    free(index);
    if (rc)
        dg_checkpoint_close(ck);
    return rc;
}

const struct dg_ckpt_tensor *dg_checkpoint_find(const struct dg_checkpoint *ck, const char *name)
{
    struct dg_ckpt_tensor key = {.name = name};
    if (!ck->tensors)
        return NULL;
    return bsearch(&key, ck->tensors, ck->n_tensors, sizeof key, cmp_tensor_name);
}

const char *dg_checkpoint_shard_name(const struct dg_checkpoint *ck, const struct dg_ckpt_tensor *t)
{
    return ck->shards[t->shard].path;
}

void dg_checkpoint_close(struct dg_checkpoint *ck)
{
    if (ck->shards) {
        for (int i = 0; i < ck->n_shards; i++) {
            dg_st_file_free(&ck->shards[i].st);
            dg_file_unmap(&ck->shards[i].map);
            free(ck->shards[i].name);
            free(ck->shards[i].path);
        }
    }
    free(ck->shards);
    free(ck->tensors);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

int dg_model_load(const char *dir, struct dg_checkpoint *ck, struct dg_model *m,
                  struct dg_error *err)
{
    int rc = dg_checkpoint_open(dir, ck, err);
    if (rc)
        return rc;
    rc = dg_model_bind(ck, m, err);
    if (rc)
        dg_checkpoint_close(ck);
    return rc;
}
