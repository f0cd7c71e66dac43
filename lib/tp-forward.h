/*
 * tp-forward.h - one forward pass run by T rank threads, for tools and
 * tests: the prompt and any committed canvases through the encoder, then
 * either the last encoder pass's hidden states or one decoder step's
 * logits, assembled for the caller.  Each rank computes only its part
 * (cpu-forward.h) and writes its vocabulary columns of the logits into the
 * caller's buffer; the assembled array is the caller's, never a rank's.
 */
#ifndef DG_TP_FORWARD_H
#define DG_TP_FORWARD_H

#include <stdint.h>

#include "lib/coll.h"
#include "lib/error.h"
#include "lib/mem-ledger.h"
#include "lib/model-weights.h"
#include "lib/tp-plan.h"

struct dg_tp_forward_job {
    const int32_t *prompt;
    int64_t n_prompt;
    const int32_t *const *commits;  /* canvases committed after the prompt, in order */
    const int64_t *n_commits;
    int n_commit;
    const int32_t *canvas;          /* NULL: encoder mode */
    int64_t n_canvas;
    const float *sc_logits;         /* decoder: processed logits [n_canvas, V] or NULL */
    float *out;                     /* encoder: [last pass tokens, H]; decoder: [n_canvas, V] */
    struct dg_mem_ledger *ledgers;  /* optional [n_ranks] */
    struct dg_coll_stats *stats;    /* optional [n_ranks] out: each rank's collectives */
};

/* Run the job over n_ranks ranks (1: no threads, no collectives).  Errors:
 * DG_E_INVAL (a plan that does not fit), the forward pass's errors (the
 * first rank's cause), DG_E_NOMEM, DG_E_INTERNAL (threads). */
int dg_tp_forward(const struct dg_model *m, int n_ranks, enum dg_expert_split experts,
                  struct dg_tp_forward_job *job, struct dg_error *err);

/* Run fn(ctx, r, err_r) for r in 0 .. n-1 on n threads (rank 0 on the
 * caller's), rank r's errors into errs[r].  When a rank fails the group
 * (if any) is aborted so the others leave their collectives.  Returns 0,
 * or the first failing rank's status, preferring a cause over "group
 * aborted"; *failed (may be NULL) names that rank. */
struct dg_coll_cpu_group;
int dg_tp_run(int n, int (*fn)(void *ctx, int rank, struct dg_error *err), void *ctx,
              struct dg_coll_cpu_group *group, struct dg_error *errs, int *failed);

#endif
