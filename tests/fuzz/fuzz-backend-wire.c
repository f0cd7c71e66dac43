/*
 * Fuzz target: a tensor-parallel group's job message (lib/backend-wire.h),
 * as a serving process decodes what rank 0 broadcast.  Properties: an
 * accepted message is exactly as long as its header says
 * (dg_wire_length); every id it hands out (an encode item's, a denoise
 * item's appended ids and canvas) lies inside the input; its counts are
 * inside the limits; and it encodes again into a message that decodes to
 * the same job.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/backend-wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* p[0 .. n) of int32 inside [lo, lo + size) (n 0: nothing to check) */
static int inside(const int32_t *p, int64_t n, const uint8_t *lo, size_t size)
{
    const uint8_t *b = (const uint8_t *)p;
    if (n == 0)
        return 1;
    return n > 0 && p && b >= lo && (size_t)(b - lo) <= size &&
           (uint64_t)n * sizeof *p <= size - (size_t)(b - lo);
}

/* a and b hold the same job (kinds, header fields, items and their ids) */
static int same_job(const struct dg_wire_job *a, const struct dg_wire_job *b)
{
    if (a->kind != b->kind || a->slot != b->slot || a->max_cl != b->max_cl ||
        a->max_positions != b->max_positions || a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kind == DG_WIRE_ENCODE) {
            const struct dg_encode_item *x = &a->enc[i], *y = &b->enc[i];
            if (x->slot != y->slot || x->n != y->n ||
                (x->n && memcmp(x->ids, y->ids, sizeof *x->ids * (size_t)x->n)))
                return 0;
        } else if (a->kind == DG_WIRE_DENOISE) {
            const struct dg_denoise_item *x = &a->den[i], *y = &b->den[i];
            if (x->slot != y->slot || x->cl != y->cl || x->self_cond != y->self_cond ||
                x->top_k != y->top_k || memcmp(&x->temperature, &y->temperature, 4) ||
                memcmp(&x->top_p, &y->top_p, 4) || x->seed != y->seed ||
                x->canvas_index != y->canvas_index || x->step != y->step ||
                x->n_append != y->n_append ||
                (x->n_append && memcmp(x->append, y->append, 4 * (size_t)x->n_append)) ||
                (x->cl && memcmp(x->canvas, y->canvas, 4 * (size_t)x->cl)))
                return 0;
        } else if (a->kind == DG_WIRE_CONDITION && a->which[i] != b->which[i]) {
            return 0;
        }
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* (a copy of its own size, so that a read past it is reported) */
    uint8_t *copy = malloc(size ? size : 1);
    struct dg_wire_job j, k;
    struct dg_error err;
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0, want;

    memcpy(copy, data, size);
    if (dg_wire_decode(copy, size, &j, &err) != 0) {
        free(copy);
        return 0;
    }
    if (size < DG_WIRE_HEADER_BYTES || dg_wire_length(copy, SIZE_MAX, &want, &err) != 0 ||
        want != size || j.n < 0 || j.n > DG_WIRE_MAX_ITEMS)
        abort();
    for (int i = 0; i < j.n; i++) {
        if (j.kind == DG_WIRE_ENCODE &&
            (j.enc[i].n > DG_WIRE_MAX_IDS || !inside(j.enc[i].ids, j.enc[i].n, copy, size)))
            abort();
        if (j.kind == DG_WIRE_DENOISE &&
            (j.den[i].n_append > DG_WIRE_MAX_IDS || j.den[i].cl > DG_WIRE_MAX_IDS ||
             (j.den[i].n_append == 0) != (j.den[i].append == NULL) ||
             !inside(j.den[i].append, j.den[i].n_append, copy, size) ||
             !inside(j.den[i].canvas, j.den[i].cl, copy, size)))
            abort();
    }
    if (dg_wire_encode(&j, &buf, &len, &cap, &err) != 0 || len != size ||
        dg_wire_decode(buf, len, &k, &err) != 0)
        abort();
    if (!same_job(&j, &k))
        abort();
    dg_wire_job_free(&k);
    dg_wire_job_free(&j);
    free(buf);
    free(copy);
    return 0;
}
