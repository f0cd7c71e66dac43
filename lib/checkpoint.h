/*
 * checkpoint.h - open a Hugging Face DiffusionGemma checkpoint directory.
 *
 * A directory holds config.json, optionally generation_config.json, and
 * either model.safetensors or model.safetensors.index.json plus the shards
 * it names (when both exist the single file wins, as in transformers).
 * Every shard is mapped read-only and validated by dg_st_parse; the index
 * and the shards must agree exactly: every index entry is in the shard it
 * names, every shard tensor is listed for that shard, no tensor is in two
 * shards, and shard names are plain file names inside the directory.
 * The result is one table of tensors sorted by name.
 */
#ifndef DG_CHECKPOINT_H
#define DG_CHECKPOINT_H

#include <stddef.h>

#include "lib/error.h"
#include "lib/fileio.h"
#include "lib/model-config.h"
#include "lib/safetensors.h"
#include "lib/st-index.h"

#define DG_CONFIG_JSON_MAX (16u << 20)
#define DG_INDEX_JSON_MAX (64u << 20)

struct dg_ckpt_shard {
    char *name;                /* file name as in the index, e.g. model-00001-of-00011.safetensors */
    char *path;                /* dir/name */
    struct dg_mapping map;
    struct dg_st_file st;
};

struct dg_ckpt_tensor {
    const char *name;          /* owned by the shard's dg_st_file */
    const struct dg_st_tensor *t;
    int shard;                 /* index into shards */
};

struct dg_checkpoint {
    char *dir;
    struct dg_model_config config;
    struct dg_generation_config generation; /* defaults when the file is absent */
    int has_generation_config;
    int sharded;               /* 1 when loaded through the index */
    int n_shards;
    struct dg_ckpt_shard *shards;
    size_t n_tensors;
    struct dg_ckpt_tensor *tensors; /* sorted by name */
    unsigned long long total_bytes; /* tensor data bytes over all shards */
};

/* Open and validate dir (config, generation config, index, every shard
 * header).  Tensor contents are not read.  On failure ck is left empty and
 * err names the file at fault. */
int dg_checkpoint_open(const char *dir, struct dg_checkpoint *ck, struct dg_error *err);

/* The tensor called name, or NULL. */
const struct dg_ckpt_tensor *dg_checkpoint_find(const struct dg_checkpoint *ck, const char *name);

/* File name of the shard holding t (for messages). */
const char *dg_checkpoint_shard_name(const struct dg_checkpoint *ck, const struct dg_ckpt_tensor *t);

void dg_checkpoint_close(struct dg_checkpoint *ck);

/* Open dir and bind it: the common path for tools and the daemon.  On
 * success the caller owns both (dg_model_free, then dg_checkpoint_close). */
struct dg_model;
int dg_model_load(const char *dir, struct dg_checkpoint *ck, struct dg_model *m,
                  struct dg_error *err);

#endif
