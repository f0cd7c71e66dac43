/* cuda-backend.c - the backend interface on one GPU (see cuda-backend.h). */
#include "kernels/cuda-backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda-forward.h"
#include "kernels/cuda-model.h"
#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/sampler.h"

struct gslot {
    int open, has_soft, max_cl;
    struct dg_cuda_kv kv;
    void *soft;                     /* [max_cl, H] elements: (pi E) c */
};

/* the last denoise batch, per item */
struct last_item {
    int slot, cl;
    int64_t off;                    /* first row in the batch buffers */
};

struct cuda_backend {
    struct dg_backend base;
    int dev;
    struct dg_cuda_model model;
    struct dg_cuda_ctx cx;
    struct gslot *slots;
    struct dg_cuda_seq *seqs;
    int seqs_cap;
    /* the last denoise batch on the device: soft-capped logits [rows, V],
     * per row temperature, threshold, draw site, statistics */
    int64_t rows_cap;
    float *logits, *T_d, *tau_d;
    struct dg_rand_site *sites_d;
    struct dg_row_stats *stats_d;
    void *stats_scratch;
    void *probs;                    /* [probs_cap, V] elements */
    int64_t probs_cap;
    uint64_t rows_bytes, probs_bytes;
    /* their host twins */
    float *T_h, *tau_h;
    struct dg_rand_site *sites_h;
    struct dg_row_stats *stats_h;
    struct last_item *last;
    int n_last, last_cap;
};

static struct cuda_backend *impl(struct dg_backend *b)
{
    return (struct cuda_backend *)b;
}

#define TRY(call)                                                                       \
    do {                                                                                \
        if ((rc = (call)) < 0)                                                          \
            return rc;                                                                  \
    } while (0)

/* ---- buffers ------------------------------------------------------------------ */

static void free_rows(struct cuda_backend *cb)
{
    dg_cuda_free(cb->logits);
    dg_cuda_free(cb->T_d);
    dg_cuda_free(cb->tau_d);
    dg_cuda_free(cb->sites_d);
    dg_cuda_free(cb->stats_d);
    dg_cuda_free(cb->stats_scratch);
    free(cb->T_h);
    free(cb->tau_h);
    free(cb->sites_h);
    free(cb->stats_h);
    cb->logits = cb->T_d = cb->tau_d = NULL;
    cb->sites_d = NULL;
    cb->stats_d = NULL;
    cb->stats_scratch = NULL;
    cb->T_h = cb->tau_h = NULL;
    cb->sites_h = NULL;
    cb->stats_h = NULL;
    cb->rows_cap = 0;
    cb->rows_bytes = 0;
}

static int reserve_rows(struct cuda_backend *cb, int64_t rows, struct dg_error *err)
{
    const int64_t V = cb->model.cfg.vocab_size;
    const size_t scratch = dg_cuda_row_stats_scratch(rows, V);
    int rc;
    if (rows <= cb->rows_cap)
        return 0;
    free_rows(cb);
    cb->T_h = malloc(sizeof(float) * (size_t)rows);
    cb->tau_h = malloc(sizeof(float) * (size_t)rows);
    cb->sites_h = malloc(sizeof *cb->sites_h * (size_t)rows);
    cb->stats_h = malloc(sizeof *cb->stats_h * (size_t)rows);
    if (!cb->T_h || !cb->tau_h || !cb->sites_h || !cb->stats_h)
        return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory for %lld rows",
                            (long long)rows);
    TRY(dg_cuda_alloc((void **)&cb->logits, sizeof(float) * (size_t)(rows * V), cb->dev, err));
    TRY(dg_cuda_alloc((void **)&cb->T_d, sizeof(float) * (size_t)rows, cb->dev, err));
    TRY(dg_cuda_alloc((void **)&cb->tau_d, sizeof(float) * (size_t)rows, cb->dev, err));
    TRY(dg_cuda_alloc((void **)&cb->sites_d, sizeof *cb->sites_d * (size_t)rows, cb->dev, err));
    TRY(dg_cuda_alloc((void **)&cb->stats_d, sizeof *cb->stats_d * (size_t)rows, cb->dev, err));
    TRY(dg_cuda_alloc(&cb->stats_scratch, scratch, cb->dev, err));
    cb->rows_cap = rows;
    cb->rows_bytes = (sizeof(float) * (uint64_t)V + 2 * sizeof(float) + sizeof *cb->sites_d +
                      sizeof *cb->stats_d) * (uint64_t)rows + scratch;
    return 0;
}

static int reserve_probs(struct cuda_backend *cb, int64_t rows, struct dg_error *err)
{
    const int64_t V = cb->model.cfg.vocab_size;
    int rc;
    if (rows <= cb->probs_cap)
        return 0;
    dg_cuda_free(cb->probs);
    cb->probs = NULL;
    cb->probs_cap = 0;
    cb->probs_bytes = 0;
    TRY(dg_cuda_alloc(&cb->probs, (size_t)dg_elt_size(cb->model.elt) * (size_t)(rows * V),
                      cb->dev, err));
    cb->probs_cap = rows;
    cb->probs_bytes = (uint64_t)dg_elt_size(cb->model.elt) * (uint64_t)(rows * V);
    return 0;
}

static int reserve_seqs(struct cuda_backend *cb, int n, struct dg_error *err)
{
    if (n > cb->seqs_cap) {
        struct dg_cuda_seq *s = realloc(cb->seqs, sizeof *s * (size_t)n);
        struct last_item *li = realloc(cb->last, sizeof *li * (size_t)n);
        if (s)
            cb->seqs = s;
        if (li)
            cb->last = li;
        if (!s || !li)
            return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
        cb->seqs_cap = cb->last_cap = n;
    }
    return 0;
}

/* ---- slots --------------------------------------------------------------------- */

static int slot_ok(const struct cuda_backend *cb, int slot, const char *what,
                   struct dg_error *err)
{
    if (slot < 0 || slot >= cb->base.max_slots || !cb->slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: %s: slot %d is not open", what, slot);
    return 0;
}

static void cuda_slot_close(struct dg_backend *b, int slot)
{
    struct cuda_backend *cb = impl(b);
    struct gslot *s;
    if (slot < 0 || slot >= b->max_slots || !cb->slots[slot].open)
        return;
    s = &cb->slots[slot];
    dg_cuda_kv_free(&s->kv);
    dg_cuda_free(s->soft);
    memset(s, 0, sizeof *s);
    for (int i = 0; i < cb->n_last; i++)
        if (cb->last[i].slot == slot)
            cb->last[i].slot = -1;
}

static int cuda_slot_open(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                          struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    struct gslot *s;
    int rc;

    if (slot < 0 || slot >= b->max_slots || cb->slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: slot %d is %s", slot,
                            slot < 0 || slot >= b->max_slots ? "out of range" : "already open");
    if (max_cl < 1 || max_positions < 1)
        return dg_error_set(err, DG_E_INVAL, "cuda backend: slot %d: %lld positions, canvas %d",
                            slot, (long long)max_positions, max_cl);
    if (max_positions > b->cfg->max_position_embeddings)
        return dg_error_set(err, DG_E_RANGE, "cuda backend: %lld positions exceed the model's "
                            "%lld", (long long)max_positions,
                            (long long)b->cfg->max_position_embeddings);
    TRY(dg_cuda_use(cb->dev, err));
    s = &cb->slots[slot];
    if ((rc = dg_cuda_kv_init(&s->kv, &cb->model, max_positions, max_cl, err)) < 0 ||
        (rc = dg_cuda_alloc(&s->soft, (size_t)dg_elt_size(cb->model.elt) * (size_t)max_cl *
                                          (size_t)b->cfg->hidden_size, cb->dev, err)) < 0) {
        dg_cuda_kv_free(&s->kv);
        memset(s, 0, sizeof *s);
        dg_error_prefix(err, "cuda backend: slot %d", slot);
        return rc;
    }
    s->open = 1;
    s->max_cl = max_cl;
    return 0;
}

static int64_t cuda_slot_length(const struct dg_backend *b, int slot)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    if (slot < 0 || slot >= b->max_slots || !cb->slots[slot].open)
        return -1;
    return cb->slots[slot].kv.length;
}

/* ---- encode ---------------------------------------------------------------------- */

static int cuda_encode(struct dg_backend *b, const struct dg_encode_item *items, int n,
                       struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    int rc;

    if (n < 1)
        return 0;
    TRY(reserve_seqs(cb, n, err));
    for (int i = 0; i < n; i++) {
        TRY(slot_ok(cb, items[i].slot, "encode", err));
        cb->seqs[i] = (struct dg_cuda_seq){&cb->slots[items[i].slot].kv, items[i].ids, items[i].n,
                                           NULL};
    }
    TRY(dg_cuda_use(cb->dev, err));
    rc = dg_cuda_encode(&cb->cx, cb->seqs, n, err);
    if (rc < 0)
        dg_error_prefix(err, "cuda backend");
    return rc;
}

/* ---- denoise --------------------------------------------------------------------- */

/* Thresholds of a filtered item's rows: its logits, already soft-capped on
 * the GPU (so the threshold is one of the values the kernel compares), come
 * to the host and go through the CPU's bisection. */
static int host_thresholds(struct cuda_backend *cb, const struct dg_denoise_item *it,
                           int64_t off, struct dg_error *err)
{
    const int64_t V = cb->model.cfg.vocab_size;
    const size_t n = (size_t)it->cl * (size_t)V;
    float *z = malloc(sizeof(float) * n), *scratch = malloc(sizeof(float) * n);
    int rc = 0;
    if (!z || !scratch)
        rc = dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory for a top-k/top-p "
                          "filter over %d positions", it->cl);
    if (rc == 0)
        rc = dg_cuda_copy_async(z, cb->logits + off * V, sizeof(float) * n, cb->cx.stream,
                                cb->dev, err);
    if (rc == 0)
        rc = dg_cuda_stream_sync(cb->cx.stream, cb->dev, err);
    if (rc == 0)
        rc = dg_filter_thresholds(z, it->cl, V, V, V, it->top_k, it->top_p, cb->tau_h + off,
                                  scratch, NULL, err);
    free(z);
    free(scratch);
    return rc;
}

static int cuda_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                        struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    const struct dg_model_config *c = b->cfg;
    const int64_t V = c->vocab_size;
    float cap = (float)c->final_logit_softcapping;
    int64_t rows = 0, off = 0;
    int any_filtered = 0, rc;

    cb->n_last = 0;
    if (n < 1)
        return 0;
    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *it = &items[i];
        const struct gslot *s;
        TRY(slot_ok(cb, it->slot, "denoise", err));
        s = &cb->slots[it->slot];
        if (it->cl < 1 || it->cl > s->max_cl || s->kv.length + it->cl > s->kv.max_length)
            return dg_error_set(err, DG_E_RANGE, "cuda backend: denoise (slot %d): canvas of %d "
                                "after %lld tokens does not fit (canvas up to %d, %lld positions)",
                                it->slot, it->cl, (long long)s->kv.length, s->max_cl,
                                (long long)s->kv.max_length);
        if (!(it->temperature > 0) || !isfinite(it->temperature) || !(it->top_p > 0))
            return dg_error_set(err, DG_E_INVAL, "cuda backend: denoise (slot %d): temperature "
                                "%g, top_p %g", it->slot, (double)it->temperature,
                                (double)it->top_p);
        rows += it->cl;
    }
    TRY(reserve_seqs(cb, n, err));
    TRY(dg_cuda_use(cb->dev, err));
    TRY(reserve_rows(cb, rows, err));
    for (int i = 0; i < n; i++) {
        struct gslot *s = &cb->slots[items[i].slot];
        cb->seqs[i] = (struct dg_cuda_seq){&s->kv, items[i].canvas, items[i].cl,
                                           items[i].self_cond && s->has_soft ? s->soft : NULL};
    }
    if ((rc = dg_cuda_decode(&cb->cx, cb->seqs, n, cb->logits, err)) < 0) {
        dg_error_prefix(err, "cuda backend");
        return rc;
    }
    /* per row: temperature, threshold (none yet), draw site */
    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *it = &items[i];
        any_filtered |= (it->top_k > 0 && it->top_k < V) || it->top_p < 1;
        for (int p = 0; p < it->cl; p++) {
            cb->T_h[off + p] = it->temperature;
            cb->tau_h[off + p] = -INFINITY;
            cb->sites_h[off + p] =
                (struct dg_rand_site){it->seed, it->canvas_index, it->step, (uint32_t)p};
        }
        cb->last[i] = (struct last_item){it->slot, it->cl, off};
        off += it->cl;
    }
    TRY(dg_cuda_copy_async(cb->T_d, cb->T_h, sizeof(float) * (size_t)rows, cb->cx.stream, cb->dev,
                           err));
    TRY(dg_cuda_copy_async(cb->sites_d, cb->sites_h, sizeof *cb->sites_h * (size_t)rows,
                           cb->cx.stream, cb->dev, err));
    if (any_filtered) {
        /* a first pass only soft-caps the logits in place (its statistics
         * are dropped); the filtered items' thresholds come from those
         * values; the statistics pass then leaves them as they are */
        TRY(dg_cuda_copy_async(cb->tau_d, cb->tau_h, sizeof(float) * (size_t)rows,
                               cb->cx.stream, cb->dev, err));
        TRY(dg_cuda_row_stats(cb->stats_d, cb->logits, rows, V, 0, cap, cb->T_d, cb->tau_d, NULL,
                              cb->stats_scratch, cb->cx.stream, cb->dev, err));
        for (int i = 0; i < n; i++)
            if (((items[i].top_k > 0 && items[i].top_k < V) || items[i].top_p < 1) &&
                (rc = host_thresholds(cb, &items[i], cb->last[i].off, err)) < 0)
                return rc;
        cap = 0.0f;
    }
    TRY(dg_cuda_copy_async(cb->tau_d, cb->tau_h, sizeof(float) * (size_t)rows, cb->cx.stream,
                           cb->dev, err));
    TRY(dg_cuda_row_stats(cb->stats_d, cb->logits, rows, V, 0, cap, cb->T_d, cb->tau_d,
                          cb->sites_d, cb->stats_scratch, cb->cx.stream, cb->dev, err));
    TRY(dg_cuda_copy_async(cb->stats_h, cb->stats_d, sizeof *cb->stats_h * (size_t)rows,
                           cb->cx.stream, cb->dev, err));
    TRY(dg_cuda_stream_sync(cb->cx.stream, cb->dev, err));
    for (int i = 0; i < n; i++)
        items[i].nonfinite = dg_row_outputs(cb->stats_h + cb->last[i].off, items[i].cl,
                                            items[i].sample, items[i].argmax, items[i].entropy);
    cb->n_last = n;
    return 0;
}

/* ---- condition ------------------------------------------------------------------- */

static int cuda_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct cuda_backend *cb = impl(b);
    const struct dg_model_config *c = b->cfg;
    const int64_t V = c->vocab_size;
    int64_t most = 0;
    int rc;

    for (int i = 0; i < n; i++) {
        if (which[i] < 0 || which[i] >= cb->n_last || cb->last[which[i]].slot < 0)
            return dg_error_set(err, DG_E_INVAL, "cuda backend: condition: item %d is not in the "
                                "last denoise batch", which[i]);
        if (cb->last[which[i]].cl > most)
            most = cb->last[which[i]].cl;
    }
    if (n < 1)
        return 0;
    TRY(dg_cuda_use(cb->dev, err));
    TRY(reserve_probs(cb, most, err));
    for (int i = 0; i < n; i++) {
        const struct last_item *li = &cb->last[which[i]];
        struct gslot *s = &cb->slots[li->slot];
        /* p = softmax over the kept ids (bf16), then (p E) c into the slot */
        TRY(dg_cuda_row_probs_e(cb->model.elt, cb->probs, cb->logits + li->off * V, li->cl, V,
                                cb->T_d + li->off, cb->tau_d + li->off, cb->stats_d + li->off,
                                cb->cx.stream, cb->dev, err));
        TRY(dg_blas_gemm_e(cb->cx.blas, cb->model.elt, s->soft, 0, cb->probs, li->cl,
                           cb->model.embed, 1, c->hidden_size, V, c->hidden_size,
                           cb->model.embed_scale, 0.0f, err));
        s->has_soft = 1;
    }
    TRY(dg_cuda_stream_sync(cb->cx.stream, cb->dev, err));
    return 0;
}

/* ---- life ------------------------------------------------------------------------- */

static void cuda_destroy(struct dg_backend *b)
{
    struct cuda_backend *cb = impl(b);
    struct dg_error ignored;
    if (!b)
        return;
    dg_cuda_use(cb->dev, &ignored);
    for (int i = 0; cb->slots && i < b->max_slots; i++)
        cuda_slot_close(b, i);
    dg_cuda_ctx_free(&cb->cx);
    free_rows(cb);
    dg_cuda_free(cb->probs);
    dg_cuda_model_free(&cb->model);
    free(cb->slots);
    free(cb->seqs);
    free(cb->last);
    free(cb);
}

static const struct dg_backend_ops cuda_ops = {
    cuda_slot_open, cuda_slot_close, cuda_slot_length, cuda_encode, cuda_denoise, cuda_condition,
    cuda_destroy,
};

void dg_cuda_backend_bytes(const struct dg_backend *b, uint64_t *weights, uint64_t *other)
{
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    uint64_t o = cb->cx.scratch_bytes + (uint64_t)cb->cx.pos_cap * 8 + cb->rows_bytes +
                 cb->probs_bytes;
    for (int i = 0; i < b->max_slots; i++)
        if (cb->slots[i].open)
            o += cb->slots[i].kv.bytes + (uint64_t)dg_elt_size(cb->model.elt) *
                                             (uint64_t)cb->slots[i].max_cl *
                                             (uint64_t)b->cfg->hidden_size;
    *weights = cb->model.bytes;
    *other = o;
}

int dg_cuda_backend_create(const struct dg_cuda_backend_options *o, struct dg_backend **out,
                           struct dg_error *err)
{
    struct cuda_backend *cb;
    int rc;

    *out = NULL;
    if (o->max_slots < 1 || (!o->model && !o->cfg) || (!o->model && o->fp32))
        return dg_error_set(err, DG_E_INVAL, "cuda backend: %d slots, %s", o->max_slots,
                            o->model ? "a model"
                            : !o->cfg ? "no model and no config"
                            : o->fp32 ? "random weights are bf16 only" : "a config");
    if ((rc = dg_cuda_use(o->device, err)) < 0)
        return rc;
    cb = calloc(1, sizeof *cb);
    if (!cb)
        return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
    cb->dev = o->device;
    cb->slots = calloc((size_t)o->max_slots, sizeof *cb->slots);
    if (!cb->slots) {
        free(cb);
        return dg_error_set(err, DG_E_NOMEM, "cuda backend: out of memory");
    }
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->base.max_slots = o->max_slots;
    rc = o->model ? dg_cuda_model_upload(&cb->model, o->model,
                                         o->fp32 ? DG_ELT_F32 : DG_ELT_BF16, o->device, err)
                  : dg_cuda_model_random(&cb->model, o->cfg, o->seed, o->device, err);
    if (rc == 0)
        rc = dg_cuda_ctx_init(&cb->cx, &cb->model, err);
    if (rc < 0) {
        dg_cuda_ctx_free(&cb->cx);
        dg_cuda_model_free(&cb->model);
        free(cb->slots);
        free(cb);
        return rc;
    }
    cb->base.cfg = &cb->model.cfg;
    *out = &cb->base;
    return 0;
}
