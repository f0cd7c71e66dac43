/* canvas-run.c - one canvas's denoising loop (see canvas-run.h). */
#include "lib/canvas-run.h"

#include <stdlib.h>
#include <string.h>

#include "lib/philox.h"
#include "lib/sampler.h"

int dg_canvas_run_init(struct dg_canvas_run *r, const struct dg_canvas_params *p,
                       struct dg_error *err)
{
    const size_t n = p->canvas_length > 0 ? (size_t)p->canvas_length : 0;

    memset(r, 0, sizeof *r);
    if (p->canvas_length < 1 || p->max_steps < 1 || p->vocab_size < 1 ||
        p->vocab_size > UINT32_MAX || p->stability_threshold < 0)
        return dg_error_set(err, DG_E_INVAL,
                            "canvas: bad parameters (length %d, steps %d, vocabulary %lld, "
                            "stability %d)",
                            p->canvas_length, p->max_steps, (long long)p->vocab_size,
                            p->stability_threshold);
    r->p = *p;
    r->canvas = malloc(n * sizeof *r->canvas);
    r->argmax = malloc(n * sizeof *r->argmax);
    r->order = malloc(n * sizeof *r->order);
    r->accepted = malloc(n);
    if (!r->canvas || !r->argmax || !r->order || !r->accepted) {
        dg_canvas_run_free(r);
        return dg_error_set(err, DG_E_NOMEM, "canvas: out of memory for %d positions",
                            p->canvas_length);
    }
    return 0;
}

void dg_canvas_run_free(struct dg_canvas_run *r)
{
    free(r->canvas);
    free(r->argmax);
    free(r->order);
    free(r->accepted);
    memset(r, 0, sizeof *r);
}

static void reset(struct dg_canvas_run *r, uint32_t index)
{
    r->index = index;
    r->step = 0;
    r->run = 0;
    r->end = DG_CANVAS_RUNNING;
    r->last_mean_entropy = 0;
    r->last_stable = r->last_confident = 0;
    r->last_accepted = 0;
    memset(r->accepted, 0, (size_t)r->p.canvas_length);
    for (int i = 0; i < r->p.canvas_length; i++)
        r->argmax[i] = -1;
}

void dg_canvas_run_start(struct dg_canvas_run *r, uint32_t index)
{
    reset(r, index);
    for (int i = 0; i < r->p.canvas_length; i++)
        r->canvas[i] = dg_rand_token(r->p.seed, index, 0, (uint32_t)i, DG_RAND_INIT,
                                     (uint32_t)r->p.vocab_size);
}

void dg_canvas_run_start_with(struct dg_canvas_run *r, uint32_t index, const int32_t *init)
{
    reset(r, index);
    memcpy(r->canvas, init, (size_t)r->p.canvas_length * sizeof *init);
}

enum dg_canvas_end dg_canvas_run_step(struct dg_canvas_run *r, const int32_t *sample,
                                      const int32_t *argmax, const float *entropy,
                                      const int32_t *renoise)
{
    const int n = r->p.canvas_length;
    const int k = r->step;
    int same = r->step > 0, stable, confident;

    if (r->end != DG_CANVAS_RUNNING)
        return r->end;
    r->last_accepted = dg_accept_mask(entropy, n, r->p.entropy_bound, r->accepted, r->order);
    for (int i = 0; i < n && same; i++)
        same = argmax[i] == r->argmax[i];
    r->run = same ? r->run + 1 : 1;
    memcpy(r->argmax, argmax, (size_t)n * sizeof *argmax);
    stable = r->p.stability_threshold == 0 || r->run >= r->p.stability_threshold + 1;
    r->last_mean_entropy = dg_mean_entropy(entropy, n);
    confident = r->last_mean_entropy < (float)r->p.confidence_threshold;
    r->last_stable = stable;
    r->last_confident = confident;
    r->step = k + 1;
    if (stable && confident)
        return r->end = DG_CANVAS_CONVERGED;
    if (r->step >= r->p.max_steps)
        return r->end = DG_CANVAS_STEP_CAP;
    for (int i = 0; i < n; i++) {
        if (r->accepted[i])
            r->canvas[i] = sample[i];
        else if (renoise)
            r->canvas[i] = renoise[i];
        else
            r->canvas[i] = dg_rand_token(r->p.seed, r->index, (uint32_t)k, (uint32_t)i,
                                         DG_RAND_RENOISE, (uint32_t)r->p.vocab_size);
    }
    return DG_CANVAS_RUNNING;
}
