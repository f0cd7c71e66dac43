/* cpu-backend.c - the backend interface over the CPU forward pass. */
#include "lib/cpu-backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/sampler.h"

struct cpu_slot {
    int open;
    int max_cl;
    struct dg_kv_cache kv;
    float *soft;          /* [max_cl, H] self-conditioning input for the next step */
};

/* what condition() needs of the last denoise batch, per item */
struct last_item {
    int slot, cl;
    float temperature;
    size_t off;           /* first row in the batch buffers */
};

struct cpu_backend {
    struct dg_backend base;
    const struct dg_cpu_model *cm;
    struct cpu_slot *slots;
    /* the last denoise batch: raw logits, and per position the filter
     * threshold and the combined row statistics */
    float *logits;
    float *tau;
    struct dg_row_stats *stats;
    size_t rows_cap;
    struct last_item *last;
    int n_last, last_cap;
    float *filter_scratch; /* [V] */
};

static struct cpu_backend *impl(struct dg_backend *b)
{
    return (struct cpu_backend *)b;
}

static int slot_ok(const struct cpu_backend *cb, int slot, const char *what, struct dg_error *err)
{
    if (slot < 0 || slot >= cb->base.max_slots || !cb->slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: %s: slot %d is not open", what, slot);
    return 0;
}

static int cpu_slot_open(struct dg_backend *b, int slot, int64_t max_positions, int max_cl,
                         struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    struct cpu_slot *s;
    int rc;

    if (slot < 0 || slot >= b->max_slots || cb->slots[slot].open)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d is %s", slot,
                            slot < 0 || slot >= b->max_slots ? "out of range" : "already open");
    if (max_cl < 1 || max_positions < 1)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d: %lld positions, canvas %d",
                            slot, (long long)max_positions, max_cl);
    s = &cb->slots[slot];
    if ((rc = dg_kv_cache_init(&s->kv, b->cfg, max_positions, err)) < 0)
        return rc;
    if (s->kv.max_length < max_positions) {
        dg_kv_cache_free(&s->kv);
        return dg_error_set(err, DG_E_RANGE,
                            "cpu backend: %lld positions exceed the model's %lld",
                            (long long)max_positions, (long long)b->cfg->max_position_embeddings);
    }
    s->soft = malloc(sizeof(float) * (size_t)max_cl * (size_t)b->cfg->hidden_size);
    if (!s->soft) {
        dg_kv_cache_free(&s->kv);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for slot %d", slot);
    }
    s->max_cl = max_cl;
    s->open = 1;
    return 0;
}

static void cpu_slot_close(struct dg_backend *b, int slot)
{
    struct cpu_backend *cb = impl(b);
    if (slot < 0 || slot >= b->max_slots || !cb->slots[slot].open)
        return;
    dg_kv_cache_free(&cb->slots[slot].kv);
    free(cb->slots[slot].soft);
    memset(&cb->slots[slot], 0, sizeof cb->slots[slot]);
    /* the last batch may name this slot; forget it */
    for (int i = 0; i < cb->n_last; i++)
        if (cb->last[i].slot == slot)
            cb->last[i].slot = -1;
}

static int64_t cpu_slot_length(const struct dg_backend *b, int slot)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)b;
    if (slot < 0 || slot >= b->max_slots || !cb->slots[slot].open)
        return -1;
    return cb->slots[slot].kv.length;
}

static int check_ids(const struct dg_model_config *c, const int32_t *ids, int64_t n,
                     const char *what, int slot, struct dg_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return dg_error_set(err, DG_E_INVAL, "cpu backend: %s (slot %d): token %lld is id %d, "
                                "outside [0, %lld)", what, slot, (long long)i, ids[i],
                                (long long)c->vocab_size);
    return 0;
}

static int cpu_encode(struct dg_backend *b, const struct dg_encode_item *items, int n,
                      struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    int rc;

    for (int i = 0; i < n; i++) {
        const struct cpu_slot *s;
        if ((rc = slot_ok(cb, items[i].slot, "encode", err)) < 0)
            return rc;
        s = &cb->slots[items[i].slot];
        if (items[i].n < 1 || s->kv.length + items[i].n > s->kv.max_length)
            return dg_error_set(err, DG_E_RANGE, "cpu backend: encode (slot %d): %lld tokens "
                                "after %lld do not fit %lld positions", items[i].slot,
                                (long long)items[i].n, (long long)s->kv.length,
                                (long long)s->kv.max_length);
        if ((rc = check_ids(b->cfg, items[i].ids, items[i].n, "encode", items[i].slot, err)) < 0)
            return rc;
        for (int j = 0; j < i; j++)
            if (items[j].slot == items[i].slot)
                return dg_error_set(err, DG_E_INVAL, "cpu backend: slot %d twice in one batch",
                                    items[i].slot);
    }
    for (int i = 0; i < n; i++)
        if ((rc = dg_cpu_encode(cb->cm, &cb->slots[items[i].slot].kv, items[i].ids, items[i].n,
                                NULL, err)) < 0)
            return rc;
    return 0;
}

static int reserve_rows(struct cpu_backend *cb, size_t rows, int items, struct dg_error *err)
{
    const size_t V = (size_t)cb->base.cfg->vocab_size;
    if (rows > cb->rows_cap) {
        float *l = realloc(cb->logits, sizeof(float) * rows * V);
        float *t;
        struct dg_row_stats *st;
        if (!l)
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for logits");
        cb->logits = l;
        if (!(t = realloc(cb->tau, sizeof(float) * rows)))
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        cb->tau = t;
        if (!(st = realloc(cb->stats, sizeof *st * rows)))
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        cb->stats = st;
        cb->rows_cap = rows;
    }
    if (items > cb->last_cap) {
        struct last_item *li = realloc(cb->last, sizeof *li * (size_t)items);
        if (!li)
            return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
        cb->last = li;
        cb->last_cap = items;
    }
    return 0;
}

static int cpu_denoise(struct dg_backend *b, struct dg_denoise_item *items, int n,
                       struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    const int64_t V = b->cfg->vocab_size;
    size_t rows = 0, off = 0;
    int rc;

    for (int i = 0; i < n; i++) {
        const struct dg_denoise_item *it = &items[i];
        const struct cpu_slot *s;
        if ((rc = slot_ok(cb, it->slot, "denoise", err)) < 0)
            return rc;
        s = &cb->slots[it->slot];
        if (it->cl < 1 || it->cl > s->max_cl || s->kv.length + it->cl > s->kv.max_length)
            return dg_error_set(err, DG_E_RANGE, "cpu backend: denoise (slot %d): canvas of %d "
                                "after %lld tokens does not fit (canvas up to %d, %lld positions)",
                                it->slot, it->cl, (long long)s->kv.length, s->max_cl,
                                (long long)s->kv.max_length);
        if (!(it->temperature > 0) || !isfinite(it->temperature) || !(it->top_p > 0))
            return dg_error_set(err, DG_E_INVAL, "cpu backend: denoise (slot %d): temperature "
                                "%g, top_p %g", it->slot, (double)it->temperature,
                                (double)it->top_p);
        if ((rc = check_ids(b->cfg, it->canvas, it->cl, "denoise", it->slot, err)) < 0)
            return rc;
        rows += (size_t)it->cl;
    }
    cb->n_last = 0;
    if ((rc = reserve_rows(cb, rows, n, err)) < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        struct dg_denoise_item *it = &items[i];
        struct cpu_slot *s = &cb->slots[it->slot];
        float *z = cb->logits + off * (size_t)V;

        if ((rc = dg_cpu_decode_soft(cb->cm, &s->kv, it->canvas, it->cl,
                                     it->self_cond ? s->soft : NULL, z, err)) < 0)
            return rc;
        it->nonfinite = 0;
        for (int p = 0; p < it->cl; p++) {
            const float *zr = z + (size_t)p * (size_t)V;
            const struct dg_rand_site site = {it->seed, it->canvas_index, it->step, (uint32_t)p};
            struct dg_row_stats *st = &cb->stats[off + (size_t)p];
            const float tau = dg_filter_threshold(zr, V, it->top_k, it->top_p, cb->filter_scratch);
            cb->tau[off + (size_t)p] = tau;
            dg_row_stats_slice(zr, 0, V, it->temperature, tau, &site, st);
            if (st->nonfinite || st->argmax < 0) {
                it->nonfinite++;
                it->sample[p] = it->argmax[p] = 0;
                it->entropy[p] = NAN;
                continue;
            }
            it->sample[p] = st->sample;
            it->argmax[p] = st->argmax;
            it->entropy[p] = dg_row_entropy(st);
        }
        cb->last[i] = (struct last_item){it->slot, it->cl, it->temperature, off};
        off += (size_t)it->cl;
    }
    cb->n_last = n;
    return 0;
}

static int cpu_condition(struct dg_backend *b, const int *which, int n, struct dg_error *err)
{
    struct cpu_backend *cb = impl(b);
    const int64_t V = b->cfg->vocab_size;
    float *probs = NULL;
    size_t probs_rows = 0;
    int rc = 0;

    for (int i = 0; i < n; i++)
        if (which[i] < 0 || which[i] >= cb->n_last || cb->last[which[i]].slot < 0)
            return dg_error_set(err, DG_E_INVAL, "cpu backend: condition: item %d is not in the "
                                "last denoise batch", which[i]);
    for (int i = 0; i < n && rc == 0; i++) {
        const struct last_item *li = &cb->last[which[i]];
        if ((size_t)li->cl > probs_rows) {
            free(probs);
            probs = malloc(sizeof(float) * (size_t)li->cl * (size_t)V);
            if (!probs)
                return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory for "
                                    "self-conditioning");
            probs_rows = (size_t)li->cl;
        }
        for (int p = 0; p < li->cl; p++) {
            const size_t r = li->off + (size_t)p;
            dg_row_probs(cb->logits + r * (size_t)V, V, li->temperature, cb->tau[r],
                         &cb->stats[r], probs + (size_t)p * (size_t)V);
        }
        rc = dg_cpu_soft_embed(cb->cm, probs, li->cl, cb->slots[li->slot].soft, err);
    }
    free(probs);
    return rc;
}

static void cpu_destroy(struct dg_backend *b)
{
    struct cpu_backend *cb = impl(b);
    if (!b)
        return;
    for (int i = 0; i < b->max_slots; i++)
        cpu_slot_close(b, i);
    free(cb->slots);
    free(cb->logits);
    free(cb->tau);
    free(cb->stats);
    free(cb->last);
    free(cb->filter_scratch);
    free(cb);
}

static const struct dg_backend_ops cpu_ops = {
    cpu_slot_open, cpu_slot_close, cpu_slot_length, cpu_encode, cpu_denoise, cpu_condition,
    cpu_destroy,
};

int dg_cpu_backend_create(const struct dg_cpu_model *cm, int max_slots, struct dg_backend **out,
                          struct dg_error *err)
{
    struct cpu_backend *cb;

    *out = NULL;
    if (max_slots < 1 || max_slots > 4096)
        return dg_error_set(err, DG_E_INVAL, "cpu backend: %d slots (1 .. 4096)", max_slots);
    cb = calloc(1, sizeof *cb);
    if (!cb)
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->base.cfg = &cm->m->cfg;
    cb->base.max_slots = max_slots;
    cb->cm = cm;
    cb->slots = calloc((size_t)max_slots, sizeof *cb->slots);
    cb->filter_scratch = malloc(sizeof(float) * (size_t)cm->m->cfg.vocab_size);
    if (!cb->slots || !cb->filter_scratch) {
        cpu_destroy(&cb->base);
        return dg_error_set(err, DG_E_NOMEM, "cpu backend: out of memory");
    }
    *out = &cb->base;
    return 0;
}
