/*
 * quant-config.h - config.json's quantization_config for the FP8 weights
 * dgemma runs: compressed-tensors' "float-quantized" W8A8 (model.md §2.4),
 * the layout of the published FP8-dynamic checkpoint.
 *
 *   "quantization_config": {
 *     "quant_method": "compressed-tensors",
 *     "format": "float-quantized",
 *     "quantization_status": "compressed",          (optional)
 *     "config_groups": { "<name>": {                 (exactly one group)
 *       "targets": ["Linear"],
 *       "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
 *                   "symmetric": true, "dynamic": false},
 *       "input_activations": {"type": "float", "num_bits": 8,
 *                             "strategy": "token", "symmetric": true,
 *                             "dynamic": true}      (or null: weights only)
 *     }},
 *     "ignore": ["lm_head", ...],                    (names left in bf16)
 *     "kv_cache_scheme": null                        (a quantized cache is refused)
 *   }
 *
 * Which tensors are FP8 is read from the tensors themselves (dtype
 * F8_E4M3 with a "<name>_scale" beside "<name>"); the ignore list is
 * written for other readers and not enforced.  Anything else (other
 * methods, formats, bit widths, strategies, groups, an output or KV
 * quantization) is refused with the key named: a checkpoint is run as it
 * was quantized or not at all.
 */
#ifndef DG_QUANT_CONFIG_H
#define DG_QUANT_CONFIG_H

#include <jansson.h>

#include "lib/error.h"

struct dg_quant_config {
    int fp8;               /* the config has an FP8 quantization_config */
    int act_per_token;     /* activations quantized per token at run time (W8A8); 0: weights only */
};

/* Read qc (config.json's "quantization_config" value; ctx prefixes
 * messages).  Errors: DG_E_UNSUPPORTED (a scheme dgemma does not run),
 * DG_E_CONFIG (malformed). */
int dg_quant_config_parse(const json_t *qc, const char *ctx, struct dg_quant_config *q,
                          struct dg_error *err);

/* The object dg_quant_config_parse accepts for q (ignore: n names kept
 * in bf16); NULL on ENOMEM or when q is not fp8. */
json_t *dg_quant_config_json(const struct dg_quant_config *q, const char *const *ignore,
                             int n);

#endif
