/*
 * model-synth.h - write a DiffusionGemma checkpoint with random weights.
 *
 * Used by the test suite (small checkpoints, then deliberately broken
 * ones) and by `dgemma-eval mkmodel`.  The plan is the list of tensors to
 * write, built from the same catalogue the loader checks against; a test
 * may edit it (drop, rename, reshape, retype, add) before writing.
 *
 * Values are deterministic functions of (seed, tensor name, element index),
 * so a tensor's contents do not depend on the plan's order or on sharding:
 *   matrices        N(0, 1) / sqrt(columns)
 *   norm weights, router.scale, router.per_expert_scale   1 + 0.1 N(0, 1)
 *   layer_scalar    uniform in [0.5, 1.5)
 */
#ifndef DG_MODEL_SYNTH_H
#define DG_MODEL_SYNTH_H

#include <stdint.h>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/model-config.h"
#include "lib/model-weights.h"

struct dg_synth_options {
    enum dg_dtype dtype;              /* BF16, F16 or F32 */
    uint64_t seed;
    int n_shards;                     /* 1: model.safetensors; > 1: index + shards */
    enum dg_expert_layout experts;    /* packed banks or per-expert tensors */
    int per_layer_config_form;        /* write config.json as transformers 5.17 saves it */
    int with_vision;                  /* add a few vision tensors (the loader skips them) */
};

struct dg_synth_tensor {
    char name[128];
    enum dg_dtype dtype;
    int ndim;
    int64_t shape[3];
};

struct dg_synth_plan {
    int n;
    size_t cap;
    struct dg_synth_tensor *t;
};

/* Sensible defaults: F32, seed 1, one file, packed experts, flat config. */
void dg_synth_options_default(struct dg_synth_options *o);

/* The tensors a checkpoint of cfg holds under opts. Errors: DG_E_NOMEM. */
int dg_synth_plan_build(const struct dg_model_config *cfg, const struct dg_synth_options *opts,
                        struct dg_synth_plan *plan, struct dg_error *err);

/* Append one tensor (for tests that add extras). Errors: DG_E_NOMEM. */
int dg_synth_plan_add(struct dg_synth_plan *plan, const char *name, enum dg_dtype dtype, int ndim,
                      const int64_t *shape, struct dg_error *err);

/* Index of the tensor called name in the plan, or -1. */
int dg_synth_plan_find(const struct dg_synth_plan *plan, const char *name);

void dg_synth_plan_free(struct dg_synth_plan *plan);

/* Create dir if needed and write config.json, generation_config.json (gen,
 * or transformers' defaults when NULL) and the plan's tensors. */
int dg_synth_write(const char *dir, const struct dg_model_config *cfg,
                   const struct dg_generation_config *gen, const struct dg_synth_plan *plan,
                   const struct dg_synth_options *opts, struct dg_error *err);

/* The value dg_synth_write stores for element i of the tensor called name
 * (before rounding to the file's dtype). */
float dg_synth_value(uint64_t seed, const char *name, uint64_t i, int64_t cols);

#endif
