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
 * Tensor parallelism (design.md §3.4): over n_ranks GPUs, rank r holds
 * its share of lib/tp-plan.h's split (cuda-model.h) and its KV heads of
 * every slot; the forward pass meets in NCCL all-reduces
 * (cuda-forward.h).  The sampler is vocabulary-parallel: each rank takes
 * the statistics of its logits columns, one all-gather of those records
 * (48 bytes per position) and a fold in rank order on the device
 * (dg_cuda_row_stats_fold) give every rank the whole row's; the filters'
 * bisection (on the host) sums counts across ranks;
 * self-conditioning multiplies each rank's probabilities by its own
 * embedding rows, and one all-reduce of [CL, H] sums them.  No rank holds
 * the whole embedding or a whole row of logits or probabilities.
 *
 * Workers: every rank runs on a thread of its own, created here and
 * pinned to a CPU near its GPU (the GPU's local_cpulist in sysfs, when
 * the process may run there), which owns the GPU for the backend's
 * life: its stream, cuBLAS handle, NCCL communicator, weights, caches.
 * The interface's calls hand their work to the workers and wait.
 *
 * CUDA graphs (option graphs): every pass pads its tokens to a bucket
 * (dg_cuda_bucket), so a step's kernels depend on (encoder or decoder,
 * bucket) alone; per rank, the second time a bucket comes its work is
 * captured (the forward pass with its NCCL collectives, and for a
 * denoising step the sampler's statistics, all-gather and fold) and from
 * then on replayed; what differs from one batch to the next (ids,
 * positions, caches, soft inputs, temperatures, draw sites) is uploaded
 * to the same device buffers before each launch.  A graph is dropped and
 * made again when any buffer it holds was reallocated (captured at its
 * bucket's next step) or the group was rebuilt (that step eager, the
 * next captured).  Steps with a top-k / top-p filter run eagerly.  Without
 * graphs the same kernels run eagerly on the same padded shapes, so both
 * give the same bits.
 *
 * Self-conditioning ahead (one rank, not profiling, unless option
 * condition_apart): a denoise call queues the probabilities and P E of
 * its items marked condition_ahead on the stream right after the
 * sampler's results, and waits for the results alone (an event), so the
 * engine's decisions, the condition call and the next step's uploads run
 * on the host while the GPU computes it; condition then only marks those
 * items' soft inputs as kept.  The same kernels on the same inputs in
 * the same stream order as the condition call's: the same bits.  An item
 * that ends its canvas at the step anyway (it converged) has had one
 * product computed for nothing.
 *
 * Multi-process mode: each process holds one rank (options process_rank,
 * nccl_id); the engine runs in the rank-0 process, whose worker sends
 * every call to the others (one NCCL broadcast of the call's bytes,
 * lib/backend-wire.h) before making it, and after it every rank's outcome
 * is gathered, so a call fails everywhere or nowhere.  A failure that
 * needs the group rebuilt ends the group instead: the backend fails for
 * good and the processes stop (a launcher starts them again).
 *
 * Failures: a rank that fails aborts the group's communicators so the
 * others leave their collectives; the call fails (the engine fails the
 * batch's requests) and the group is rebuilt from a fresh id before the
 * next call.  A watchdog bounds each call (timeout_ms): past it the
 * communicators are aborted too, which ends a hung collective.  A worker
 * that does not come back even then, or a GPU whose context is lost (a
 * sticky CUDA error), leaves the backend failed: every later call fails,
 * and dg_cuda_backend_failed says so (the daemon stops with a log line).
 * Before the ranks of one process join the NCCL group (at creation, and
 * when it is rebuilt) they meet: a rank that failed before joining (its
 * stream, or its GPU's health) stops the others there, since
 * ncclCommInitRank would wait for it for good.  Creation is not bounded by
 * the watchdog: a rank that fails inside ncclCommInitRank, or a process of
 * a multi-process group that never starts, still leaves the others
 * waiting there; options.joined tells a caller which ranks got past it
 * (dgemmad ends the process when they do not in time).
 */
#ifndef DG_KERNELS_CUDA_BACKEND_H
#define DG_KERNELS_CUDA_BACKEND_H

#include <stdint.h>

#include "kernels/nccl.h"
#include "kernels/prof.h"
#include "lib/backend.h"
#include "lib/coll.h"
#include "lib/model-weights.h"
#include "lib/tp-plan.h"

struct dg_cuda_backend_options {
    int device;                          /* CUDA device index (one GPU) */
    int n_ranks;                         /* GPUs (0 or 1: one, `device`) */
    const int *devices;                  /* [n_ranks] device indexes, or NULL: 0 .. n-1 */
    enum dg_expert_split experts;        /* how experts are split over ranks */
    int max_slots;                       /* requests in flight */
    const struct dg_model *model;        /* weights to upload, or NULL for: */
    const struct dg_model_config *cfg;   /*   random weights of this shape */
    uint64_t seed;                       /*   made from this seed */
    int fp32;                            /* with model: fp32 elements (else bf16) */
    int fp8;                             /* random weights: FP8 (W8A8) projections and
                                            experts (cuda-model.h); a model's own dtypes
                                            decide for it */
    int pin;                             /* pin each worker to a CPU near its GPU */
    int timeout_ms;                      /* watchdog per call; 0: none */
    int graphs;                          /* capture steps in CUDA graphs (see above) */
    int profile;                         /* time rank 0's stages on its GPU (no graphs) */
    int fp8_own_gemm;                    /* FP8: the projections on fp8-gemm.cu's kernel
                                            only, not cuBLASLt (fp8-lt.h): to compare */
    int commit_apart;                    /* a denoising step's appended tokens (a commit)
                                            in an encoder pass of their own before it,
                                            not in the step's pass: to compare */
    int condition_apart;                 /* self-conditioning only in the condition call,
                                            never ahead of it (see above): to compare */
    int time_steps;                      /* rank 0 times each denoise call's own work
                                            on its GPU (dg_cuda_backend_step_ms) */
    /* for fault tests: 1 + the rank whose start fails after its stream
     * is made and before it joins the NCCL group (0: none), to show that
     * the others do not wait for it; with it set a GPU may be named for
     * more than one rank, so that one GPU can show it */
    int fault_start_rank;
    /* for tests on one GPU: all n_ranks ranks on GPU `device` (devices
     * unused), their collectives made without NCCL (nccl.h: a group on one
     * shared GPU); steps run eagerly (graphs off); not multi-process */
    int shared_gpu;
    /* multi-process mode (with nccl_id): this process holds rank
     * process_rank of n_ranks on GPU `device` (or devices[0]); the other
     * ranks run in other processes (dg_cuda_backend_serve) joined by the
     * same id */
    int process_rank;
    const struct dg_nccl_id *nccl_id;
    /* called on each of this process's rank threads once the rank has
     * joined the group at creation (not at a rebuild; not with n_ranks
     * 1), with its rank: a caller bounding how long the group takes to
     * form learns that it did (dgemmad's group_timeout); NULL: none */
    void (*joined)(void *arg, int rank);
    void *joined_arg;
};

/* Errors: DG_E_INVAL (options), DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS,
 * DG_E_NCCL, DG_E_INTERNAL (threads). */
int dg_cuda_backend_create(const struct dg_cuda_backend_options *o, struct dg_backend **out,
                           struct dg_error *err);

/* Device bytes the backend holds, over all ranks: weights, and slots +
 * scratch now. */
void dg_cuda_backend_bytes(const struct dg_backend *b, uint64_t *weights, uint64_t *other);

/* What rank r holds (bytes unless said otherwise). */
struct dg_cuda_rank_usage {
    int device;
    int64_t vocab_rows;          /* embedding / LM head rows held (of V) */
    int64_t logits_cols;         /* columns of a logits or probability row held (of V) */
    uint64_t weights, embedding; /* all weights; the embedding slice among them */
    uint64_t kv, scratch;        /* open slots' caches + soft inputs; forward + sampler scratch */
    uint64_t device_used;        /* the GPU's used memory, as the driver reports it */
    struct dg_coll_stats coll;   /* the collectives it issued */
    uint64_t captures, replays;  /* CUDA graphs made, and launched */
};

/* Fills u for rank r; -1 when r is not a rank. */
int dg_cuda_backend_rank_usage(const struct dg_backend *b, int r, struct dg_cuda_rank_usage *u);

/* Multi-process mode, in a process whose rank is not 0: make every call
 * the rank-0 process makes of its backend, as it comes, until that
 * backend is destroyed (0), the group fails, or *stop becomes non-zero
 * (checked every 200 ms; a signal handler may set it).  A call that takes
 * longer than timeout_ms (0: no limit) aborts the group (the watchdog).
 * Errors: DG_E_NCCL (the group failed or was aborted), the call's own
 * errors when it cannot be refused alike everywhere, DG_E_INVAL (not a
 * serving backend). */
int dg_cuda_backend_serve(struct dg_backend *b, volatile const int *stop, struct dg_error *err);

/* With option profile, in the process of rank 0: rank 0's device time
 * per stage (kernels/prof.h), summed over its encoder passes and the
 * denoising steps that append tokens (commit) first (which 0), or its
 * other denoising steps and the self-conditioning (which 1) since the
 * last reset; copies at most max totals to out and returns how many there
 * are (-1: no profile).  Stage names are the forward pass's ("experts",
 * "attention (full)", ...) and the sampler's.  Call between calls. */
int dg_cuda_backend_profile(struct dg_backend *b, int which, struct dg_prof_total *out, int max,
                            int reset);

/* With option time_steps, in the process of rank 0, between calls: the
 * milliseconds from when rank 0's stream reached the last denoise call's
 * first work (its uploads) to when it reached its results' copy's end,
 * as the device timed them.  Work an earlier call queued, which the call
 * starts behind (the self-conditioning queued ahead), is not counted,
 * nor is what the call queues ahead itself; time the device waits there
 * for the host's launches is.  -1 without the option, before a denoise
 * call, or after one that failed. */
double dg_cuda_backend_step_ms(const struct dg_backend *b);

/* Ranks of the backend in this process. */
int dg_cuda_backend_ranks(const struct dg_backend *b);

/* Whether the backend has failed for good (see above). */
int dg_cuda_backend_failed(const struct dg_backend *b);

/* For fault tests: rank r does nothing in the next call, so that the
 * others wait in their first collective (a lost rank, a hung peer) until
 * the watchdog ends it. */
void dg_cuda_backend_inject_skip(struct dg_backend *b, int r);

#endif
