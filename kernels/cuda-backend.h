/*
 * cuda-backend.h - the backend interface (lib/backend.h) on one GPU: the
 * forward pass of kernels/cuda-forward.h over a whole batch at once, the
 * sampler's statistics in one fused pass over the logits
 * (dg_cuda_row_stats: soft-cap, temperature, max, sum, entropy term,
 * argmax, Gumbel-max sample), and self-conditioning as the probabilities
 * (dg_cuda_row_probs) times the embedding through cuBLAS, kept per slot as
 * the soft embedding (pi E) c.  Elements bf16, or fp32 for an fp32
 * checkpoint run at the CPU reference's precision (fp32 option).  Only CL ids, ids and floats per item
 * come back to the host.
 *
 * Random draws are the CPU's (the same Philox sites), and the batch's
 * items never meet: a request's outcome does not depend on its batch up to
 * the rounding of batched GEMMs.
 *
 * Top-k / top-p: the threshold of a filtered item is computed on the host
 * from its soft-capped logits (dg_filter_thresholds, as the CPU backend
 * does; a batch with a filtered item makes one more pass over the logits,
 * to soft-cap them first); the logits of unfiltered items never leave the
 * GPU.
 *
 * All calls run on the calling thread, which they bind to the backend's
 * GPU (the daemon's GPU worker).
 */
#ifndef DG_KERNELS_CUDA_BACKEND_H
#define DG_KERNELS_CUDA_BACKEND_H

#include <stdint.h>

#include "lib/backend.h"
#include "lib/model-weights.h"

struct dg_cuda_backend_options {
    int device;                          /* CUDA device index */
    int max_slots;                       /* requests in flight */
    const struct dg_model *model;        /* weights to upload, or NULL for: */
    const struct dg_model_config *cfg;   /*   random weights of this shape */
    uint64_t seed;                       /*   made from this seed */
    int fp32;                            /* with model: fp32 elements (else bf16) */
};

/* Errors: DG_E_INVAL (options), DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS. */
int dg_cuda_backend_create(const struct dg_cuda_backend_options *o, struct dg_backend **out,
                           struct dg_error *err);

/* Device bytes the backend holds: weights, and slots + scratch now. */
void dg_cuda_backend_bytes(const struct dg_backend *b, uint64_t *weights, uint64_t *other);

#endif
