/*
 * quantize.h - write a checkpoint in the FP8 layout of the published
 * FP8-dynamic release (model.md §2.4, quant-config.h) from a bf16 / f16 /
 * f32 one: every attention, dense MLP, expert and self-conditioning
 * projection quantized per output channel (fp8.h: scale = max|row| / 448,
 * stored as "<name>_scale" [rows, 1] in F32 beside an F8_E4M3 "<name>"),
 * experts per expert in 2-D ("...experts.<e>.{gate,up,down}_proj.weight");
 * the embedding (the LM head), the routers, every norm and scalar copied
 * as they are; config.json with an FP8 quantization_config (activations
 * per token, W8A8, or weights only); generation_config.json and the
 * tokenizer files copied.  The vision tower is not written.  One file,
 * model.safetensors, written to a temporary name and renamed.
 */
#ifndef DG_QUANTIZE_H
#define DG_QUANTIZE_H

#include <stddef.h>

#include "lib/error.h"

struct dg_quantize_report {
    size_t tensors;        /* written */
    size_t fp8_tensors;    /* of them F8_E4M3 (each with its scale tensor) */
};

/* Quantize the checkpoint in model into out (created if needed).  Errors:
 * the loader's (dg_model_load), DG_E_UNSUPPORTED (model is already FP8),
 * DG_E_IO, DG_E_NOMEM. */
int dg_quantize_dir(const char *model, const char *out, int weights_only,
                    struct dg_quantize_report *rep, struct dg_error *err);

#endif
