/*
 * gen-settings.h - a request's generation settings: the diffusion knobs
 * (per request, unlike vLLM's server-wide ones), the output limits and the
 * seed.  Defaults come from the checkpoint's generation_config.json;
 * requests override them by name, in JSON:
 *
 *   canvas_length         int    1 .. limits.max_canvas_length
 *   max_denoising_steps   int    1 .. limits.max_denoising_steps
 *   entropy_bound         real   > 0                  (beta)
 *   confidence_threshold  real   > 0                  nats, mean over the canvas
 *   stability_threshold   int    0 .. 65535           (s)
 *   t_min, t_max          real   0 <= t_min < t_max <= 100
 *   top_k                 int    0 (off) .. 2^30
 *   top_p                 real   (0, 1]               (1: off)
 *   seed                  int    0 .. 2^63-1          (absent: the caller picks one)
 *   max_tokens            int    1 .. limits.max_tokens
 *   stop_token_ids        [int]  ids in [0, V), up to DG_MAX_STOP_IDS with the EOS ids
 *   stop                  string or [string], up to DG_MAX_STOP_STRINGS, each
 *                         1 .. DG_STOP_STRING_MAX bytes
 *
 * Unknown keys are errors (a misspelt knob must not silently do nothing);
 * so is "temperature", which diffusion sampling does not take (the
 * schedule t_max -> t_min replaces it).  The model's EOS ids always stop.
 */
#ifndef DG_GEN_SETTINGS_H
#define DG_GEN_SETTINGS_H

#include <jansson.h>
#include <stdint.h>

#include "lib/error.h"
#include "lib/model-config.h"

#define DG_MAX_STOP_IDS 32
#define DG_MAX_STOP_STRINGS 8
#define DG_STOP_STRING_MAX 128

struct dg_gen_settings {
    int canvas_length;
    int max_denoising_steps;
    double entropy_bound;
    double confidence_threshold;
    int stability_threshold;
    double t_min, t_max;
    int top_k;
    double top_p;
    uint64_t seed;
    int seed_set;                 /* 0: the caller must pick a seed before submitting */
    int64_t max_tokens;
    int stop_ids[DG_MAX_STOP_IDS];/* EOS ids first, then the request's */
    int n_stop_ids;
    int n_stop_strings;
    char stop_strings[DG_MAX_STOP_STRINGS][DG_STOP_STRING_MAX + 1];
};

/* What a deployment allows (the daemon's configuration). */
struct dg_gen_limits {
    int max_canvas_length;
    int max_denoising_steps;
    int64_t max_tokens;
};

/* Limits for offline use: canvases up to 1024, 1024 steps, 1 << 20 tokens. */
void dg_gen_limits_default(struct dg_gen_limits *l);

/* Defaults: canvas_length from config.json, the diffusion knobs and
 * max_tokens (max_new_tokens) from generation_config.json, no top-k/top-p,
 * stop ids = the generation config's EOS ids (or config.json's), no seed. */
void dg_gen_settings_defaults(struct dg_gen_settings *s, const struct dg_model_config *cfg,
                              const struct dg_generation_config *gen);

/* Apply the keys of a JSON object over s.  ctx prefixes error messages
 * ("request: ").  Values are checked against the limits and the model (a
 * stop id outside the vocabulary, t_min >= t_max after the update, ...).
 * On error s is unchanged.  Errors: DG_E_INVAL with the key named. */
int dg_gen_settings_apply_json(struct dg_gen_settings *s, const json_t *obj,
                               const struct dg_model_config *cfg,
                               const struct dg_gen_limits *lim, const char *ctx,
                               struct dg_error *err);

/* The same checks on settings built in code. */
int dg_gen_settings_validate(const struct dg_gen_settings *s, const struct dg_model_config *cfg,
                             const struct dg_gen_limits *lim, struct dg_error *err);

/* All settings as a JSON object (for responses and logs); NULL on ENOMEM. */
json_t *dg_gen_settings_to_json(const struct dg_gen_settings *s);

/* Whether id is one of the stop ids. */
int dg_gen_settings_is_stop_id(const struct dg_gen_settings *s, int32_t id);

#endif
