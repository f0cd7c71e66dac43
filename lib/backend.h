/*
 * backend.h - what the generation engine asks of a compute backend (the
 * CPU reference, one GPU, a tensor-parallel group).  The engine owns the
 * requests and every decision; a backend owns weights, per-request KV
 * caches ("slots") and the self-conditioning state, and runs batches:
 *
 *   encode    append tokens to slots' caches (prompt chunks, commits)
 *   denoise   one decoder step for each item's canvas, then the sampler's
 *             per-position arithmetic (sampler.h): temperature, filter,
 *             argmax, Gumbel-max sample, entropy.  Logits stay inside the
 *             backend; only CL ids / ids / floats per item come back.
 *             An item may first append tokens to its slot's cache (the
 *             commit of its finished canvas): the result is exactly that
 *             of an encode of those tokens followed by the step, whether
 *             the backend runs them as two passes or as one (a pass whose
 *             rows are the appended tokens in encoder mode and the canvas
 *             in decoder mode: per layer the appended tokens' keys and
 *             values are written before the canvas attends to them).
 *   condition for items of the last denoise batch that will take another
 *             step: keep softmax(processed logits) E c as the slot's
 *             self-conditioning input for its next denoise.  A denoise
 *             item's condition_ahead says the engine expects to ask this
 *             for it (the canvas is not at its step cap): a backend may
 *             start that work at once, beside the engine's decisions, and
 *             have it ready when condition comes.  Only a hint: condition
 *             still names the items that go on, and the results are the
 *             same bits either way; but the slot's kept input may then
 *             change for an item that condition leaves out, so the caller
 *             denoises such an item next without self_cond (a canvas's
 *             first step) or not at all, as the engine does.
 *
 * Errors: a batch is checked before anything runs (open slots, ids inside
 * the vocabulary, room in the caches for the appended tokens and the
 * canvas, canvas sizes): DG_E_INVAL or
 * DG_E_RANGE, and nothing has changed; the engine then runs the batch's
 * items one at a time, so that a refusal ends only the request it is about
 * (a call that fails so after all may repeat: caches grow and the
 * self-conditioning state moves only when a call succeeds).  A failure while running (DG_E_NOMEM,
 * a device error) leaves the batch's slots in an unknown state: the engine
 * fails those requests and closes their slots.
 */
#ifndef DG_BACKEND_H
#define DG_BACKEND_H

#include <stdint.h>

#include "lib/error.h"
#include "lib/model-config.h"

struct dg_encode_item {
    int slot;
    const int32_t *ids;
    int64_t n;
};

struct dg_denoise_item {
    int slot;
    /* appended to the slot's cache before the step, as encode would
     * (NULL, 0: nothing); the canvas then sits after them */
    const int32_t *append;
    int64_t n_append;
    const int32_t *canvas;   /* [cl] */
    int cl;
    int self_cond;           /* 1: add the slot's kept soft embedding */
    int condition_ahead;     /* 1: condition is expected to follow (see above) */
    float temperature;
    int top_k;               /* 0: off */
    float top_p;             /* 1: off */
    uint64_t seed;           /* Gumbel noise site: (seed, canvas_index, step, position, v) */
    uint32_t canvas_index, step;
    /* outputs, cl entries each */
    int32_t *sample, *argmax;
    float *entropy;
    int64_t nonfinite;       /* out: positions whose logits held NaN or infinity */
};

struct dg_backend;

struct dg_backend_ops {
    /* Reserve slot for up to max_positions cached tokens and canvases of up
     * to max_cl.  Errors: DG_E_INVAL, DG_E_NOMEM. */
    int (*slot_open)(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                     struct dg_error *err);
    /* Release a slot (no-op when closed). */
    void (*slot_close)(struct dg_backend *b, int slot);
    /* Tokens the slot's cache holds. */
    int64_t (*slot_length)(const struct dg_backend *b, int slot);
    int (*encode)(struct dg_backend *b, const struct dg_encode_item *items, int n,
                  struct dg_error *err);
    int (*denoise)(struct dg_backend *b, struct dg_denoise_item *items, int n,
                   struct dg_error *err);
    /* which: indexes into the last denoise batch */
    int (*condition)(struct dg_backend *b, const int *which, int n, struct dg_error *err);
    void (*destroy)(struct dg_backend *b);
    /* Optional (NULL: never): why the backend has failed for good (a lost
     * GPU context, a worker that never came back), or NULL while it
     * works.  Every later call fails; the daemon stops. */
    const char *(*failure)(const struct dg_backend *b);
};

struct dg_backend {
    const struct dg_backend_ops *ops;
    const char *name;                 /* "cpu", "cuda", ... */
    const struct dg_model_config *cfg;
    int max_slots;
};

#endif
