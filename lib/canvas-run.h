/*
 * canvas-run.h - one canvas's denoising loop as a state machine, with no
 * model inside (model.md §6): the engine runs the decoder and the
 * per-position sampler, and hands this the results of each step.
 *
 *   start:  canvas = uniform random ids (Philox, purpose INIT), step 0
 *   step k: given per position the sample y, the argmax a and the entropy
 *           H of the step's tempered distribution,
 *             accepted  = entropy-bound acceptance of H (dg_accept_mask)
 *             stable    = s == 0, or a equals each of the s previous argmax
 *                         canvases (s = stability_threshold)
 *             confident = mean(H) < confidence_threshold
 *             done      = (stable and confident) or k + 1 == max steps
 *           if not done: canvas = y where accepted, else fresh uniform ids
 *           (Philox, purpose RENOISE, or ids the caller supplies)
 *   done:   the argmax canvas a of the last step is the result.
 *
 * Stability is tracked as the length of the run of identical consecutive
 * argmax canvases, which is what transformers' history of s canvases
 * (initialised to -1) decides: stable iff that run reaches s + 1.
 */
#ifndef DG_CANVAS_RUN_H
#define DG_CANVAS_RUN_H

#include <stdint.h>

#include "lib/error.h"

struct dg_canvas_params {
    int canvas_length;
    int max_steps;
    double entropy_bound;
    double confidence_threshold;
    int stability_threshold;
    int64_t vocab_size;
    uint64_t seed;
};

enum dg_canvas_end {
    DG_CANVAS_RUNNING = 0,
    DG_CANVAS_CONVERGED,   /* stable and confident */
    DG_CANVAS_STEP_CAP,    /* max_steps reached */
};

struct dg_canvas_run {
    struct dg_canvas_params p;
    uint32_t index;        /* canvas number within the request */
    int step;              /* steps taken */
    int run;               /* identical consecutive argmax canvases, the last included */
    enum dg_canvas_end end;
    float last_mean_entropy;
    int last_stable, last_confident; /* the last step's two tests */
    int last_accepted;     /* positions accepted at the last step */
    int32_t *canvas;       /* [CL] the next decoder input */
    int32_t *argmax;       /* [CL] the last step's argmax canvas */
    int32_t *order;        /* [CL] scratch */
    uint8_t *accepted;     /* [CL] the last step's acceptance mask */
};

/* Allocate for p->canvas_length positions.  Errors: DG_E_INVAL, DG_E_NOMEM. */
int dg_canvas_run_init(struct dg_canvas_run *r, const struct dg_canvas_params *p,
                       struct dg_error *err);

void dg_canvas_run_free(struct dg_canvas_run *r);

/* Begin canvas number index: a fresh random canvas, history cleared. */
void dg_canvas_run_start(struct dg_canvas_run *r, uint32_t index);

/* Begin with a given initial canvas (a replay of another implementation). */
void dg_canvas_run_start_with(struct dg_canvas_run *r, uint32_t index, const int32_t *init);

/* Take one step's results (CL entries each).  renoise: ids for rejected
 * positions, or NULL to draw them from Philox.  Returns the new end state
 * (DG_CANVAS_RUNNING while more steps follow).  When it returns a finished
 * state, r->argmax is the canvas's result and r->canvas is left as it was. */
enum dg_canvas_end dg_canvas_run_step(struct dg_canvas_run *r, const int32_t *sample,
                                      const int32_t *argmax, const float *entropy,
                                      const int32_t *renoise);

/* Whether step r->step (the next one) is the first of its canvas: no
 * self-conditioning input. */
static inline int dg_canvas_run_first_step(const struct dg_canvas_run *r)
{
    return r->step == 0;
}

/* Whether step r->step (the next one) is its canvas's last whatever its
 * results: the step cap.  Before it a canvas goes on unless the step's
 * results make it converge. */
static inline int dg_canvas_run_last_step(const struct dg_canvas_run *r)
{
    return r->step + 1 >= r->p.max_steps;
}

#endif
