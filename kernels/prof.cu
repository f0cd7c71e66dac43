/* prof.cu - device-timed stages of a stream (see prof.h). */
#include "kernels/prof.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda-check.h"

struct dg_prof {
    int dev;
    int max_marks;
    cudaEvent_t *ev;           /* [max_marks] */
    const char **mark_label;   /* [max_marks]: the label of the interval ending at mark i */
    int n_marks;               /* recorded since begin (0: no begin) */
    int64_t dropped;
    struct dg_prof_total tot[DG_PROF_MAX_LABELS];
    int n_tot;
};

extern "C" int dg_prof_create(struct dg_prof **out, int max_marks, int dev,
                              struct dg_error *err)
{
    struct dg_prof *p;
    int rc = 0;
    *out = NULL;
    if (max_marks < 2)
        return dg_error_set(err, DG_E_INVAL, "profiler: %d marks", max_marks);
    p = (struct dg_prof *)calloc(1, sizeof *p);
    if (!p)
        return dg_error_set(err, DG_E_NOMEM, "profiler: out of memory");
    p->dev = dev;
    p->ev = (cudaEvent_t *)calloc((size_t)max_marks, sizeof *p->ev);
    p->mark_label = (const char **)calloc((size_t)max_marks, sizeof *p->mark_label);
    if (!p->ev || !p->mark_label) {
        dg_prof_destroy(p);
        return dg_error_set(err, DG_E_NOMEM, "profiler: out of memory for %d marks", max_marks);
    }
    for (int i = 0; i < max_marks; i++) {
        DG_CUDA_CHECK(cudaEventCreate(&p->ev[i]));
        p->max_marks = i + 1;
    }
    *out = p;
    return 0;
out:
    dg_prof_destroy(p);
    return rc;
}

extern "C" void dg_prof_destroy(struct dg_prof *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->max_marks; i++)
        cudaEventDestroy(p->ev[i]);
    free(p->ev);
    free(p->mark_label);
    free(p);
}

extern "C" int dg_prof_begin(struct dg_prof *p, dg_stream_t stream, struct dg_error *err)
{
    const int dev = p->dev;
    int rc = 0;
    p->n_marks = 0;
    DG_CUDA_CHECK(cudaEventRecord(p->ev[0], (cudaStream_t)stream));
    p->mark_label[0] = NULL;
    p->n_marks = 1;
out:
    return rc;
}

extern "C" int dg_prof_mark(struct dg_prof *p, const char *label, dg_stream_t stream,
                            struct dg_error *err)
{
    const int dev = p->dev;
    int rc = 0;
    if (p->n_marks == 0)
        return dg_prof_begin(p, stream, err);
    if (p->n_marks == p->max_marks) {
        p->dropped++;
        return 0;
    }
    DG_CUDA_CHECK(cudaEventRecord(p->ev[p->n_marks], (cudaStream_t)stream));
    p->mark_label[p->n_marks++] = label;
out:
    return rc;
}

static struct dg_prof_total *find(struct dg_prof *p, const char *label)
{
    for (int i = 0; i < p->n_tot; i++)
        if (p->tot[i].label == label || strcmp(p->tot[i].label, label) == 0)
            return &p->tot[i];
    if (p->n_tot == DG_PROF_MAX_LABELS)
        return NULL;
    p->tot[p->n_tot] = (struct dg_prof_total){label, 0.0, 0};
    return &p->tot[p->n_tot++];
}

extern "C" int dg_prof_collect(struct dg_prof *p, struct dg_error *err)
{
    const int dev = p->dev;
    int rc = 0, lost = 0;
    for (int i = 1; i < p->n_marks; i++) {
        float ms = 0.0f;
        struct dg_prof_total *t;
        DG_CUDA_CHECK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
        if (!(t = find(p, p->mark_label[i]))) {
            lost++;
            continue;
        }
        t->ms += ms;
        t->calls++;
    }
    p->n_marks = 0;
    if (lost)
        return dg_error_set(err, DG_E_RANGE, "profiler: more than %d labels; %d intervals "
                            "dropped", DG_PROF_MAX_LABELS, lost);
out:
    p->n_marks = 0;
    return rc;
}

extern "C" int dg_prof_totals(const struct dg_prof *p, struct dg_prof_total *out, int max)
{
    for (int i = 0; i < p->n_tot && i < max; i++)
        out[i] = p->tot[i];
    return p->n_tot;
}

extern "C" void dg_prof_reset(struct dg_prof *p)
{
    p->n_tot = 0;
    p->dropped = 0;
}

extern "C" int64_t dg_prof_dropped(const struct dg_prof *p)
{
    return p->dropped;
}
