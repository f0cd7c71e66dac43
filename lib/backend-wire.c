/* backend-wire.c - a backend call as bytes (see backend-wire.h). */
#include "lib/backend-wire.h"

#include <stdlib.h>
#include <string.h>

#define MAGIC 0x4a574744u /* "DGWJ" read as a little-endian u32 */
#define VERSION 2u /* 2: denoise items carry their appended ids */

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- writing ----------------------------------------------------------------- */

struct out {
    unsigned char **buf;
    size_t *cap, len;
};

static int room(struct out *o, size_t more, struct dg_error *err)
{
    if (o->len + more > *o->cap) {
        size_t cap = *o->cap ? *o->cap : 256;
        unsigned char *nb;
        while (cap < o->len + more)
            cap *= 2;
        nb = realloc(*o->buf, cap);
        if (!nb)
            return dg_error_set(err, DG_E_NOMEM, "backend wire: out of memory for %zu bytes",
                                cap);
        *o->buf = nb;
        *o->cap = cap;
    }
    return 0;
}

/* bytes of p, then zeros up to the next multiple of 8 */
static int put(struct out *o, const void *p, size_t n, struct dg_error *err)
{
    const size_t padded = pad8(n);
    int rc;
    if ((rc = room(o, padded, err)) < 0)
        return rc;
    memcpy(*o->buf + o->len, p, n);
    memset(*o->buf + o->len + n, 0, padded - n);
    o->len += padded;
    return 0;
}

#define PUT(ptr, n)                                                                     \
    do {                                                                                \
        if ((rc = put(&o, (ptr), (n), err)) < 0)                                        \
            return rc;                                                                  \
    } while (0)

int dg_wire_encode(const struct dg_wire_job *j, unsigned char **buf, size_t *len, size_t *cap,
                   struct dg_error *err)
{
    struct out o = {buf, cap, 0};
    uint32_t h32[4];
    int64_t h64[4];
    int rc;

    if (j->kind < DG_WIRE_OPEN || j->kind > DG_WIRE_QUIT || j->n < 0 ||
        j->n > DG_WIRE_MAX_ITEMS)
        return dg_error_set(err, DG_E_INVAL, "backend wire: kind %d with %d items", (int)j->kind,
                            j->n);
    h32[0] = MAGIC;
    h32[1] = VERSION;
    h32[2] = (uint32_t)j->kind;
    h32[3] = (uint32_t)j->n;
    h64[0] = 0; /* body bytes: written at the end */
    h64[1] = j->slot;
    h64[2] = j->max_positions;
    h64[3] = j->max_cl;
    PUT(h32, sizeof h32);
    PUT(h64, sizeof h64);
    for (int i = 0; i < j->n; i++) {
        if (j->kind == DG_WIRE_ENCODE) {
            const struct dg_encode_item *it = &j->enc[i];
            const int32_t head[2] = {it->slot, 0};
            if (it->n < 0 || it->n > DG_WIRE_MAX_IDS)
                return dg_error_set(err, DG_E_INVAL, "backend wire: item %d: %lld ids", i,
                                    (long long)it->n);
            PUT(head, sizeof head);
            PUT(&it->n, sizeof it->n);
            PUT(it->ids, sizeof(int32_t) * (size_t)it->n);
        } else if (j->kind == DG_WIRE_DENOISE) {
            const struct dg_denoise_item *it = &j->den[i];
            const int32_t head[4] = {it->slot, it->cl, it->self_cond, it->top_k};
            const float f[2] = {it->temperature, it->top_p};
            const uint32_t site[2] = {it->canvas_index, it->step};
            if (it->cl < 0 || it->cl > DG_WIRE_MAX_IDS)
                return dg_error_set(err, DG_E_INVAL, "backend wire: item %d: canvas of %d", i,
                                    it->cl);
            if (it->n_append < 0 || it->n_append > DG_WIRE_MAX_IDS ||
                (it->n_append > 0 && !it->append))
                return dg_error_set(err, DG_E_INVAL, "backend wire: item %d: %lld appended ids%s",
                                    i, (long long)it->n_append,
                                    it->n_append > 0 && !it->append ? " without an array"
                                                                    : ", outside 0 .. 2^24");
            PUT(head, sizeof head);
            PUT(f, sizeof f);
            PUT(&it->seed, sizeof it->seed);
            PUT(site, sizeof site);
            PUT(&it->n_append, sizeof it->n_append);
            if (it->n_append > 0) /* (no memcpy from a NULL append) */
                PUT(it->append, sizeof(int32_t) * (size_t)it->n_append);
            PUT(it->canvas, sizeof(int32_t) * (size_t)it->cl);
        }
    }
    if (j->kind == DG_WIRE_CONDITION) {
        int32_t *w = malloc(sizeof *w * (size_t)(j->n ? j->n : 1));
        if (!w)
            return dg_error_set(err, DG_E_NOMEM, "backend wire: out of memory");
        for (int i = 0; i < j->n; i++)
            w[i] = j->which[i];
        rc = put(&o, w, sizeof *w * (size_t)j->n, err);
        free(w);
        if (rc < 0)
            return rc;
    }
    {
        const uint64_t body = o.len - DG_WIRE_HEADER_BYTES;
        memcpy(*buf + sizeof h32, &body, sizeof body);
    }
    *len = o.len;
    return 0;
}

/* ---- reading ----------------------------------------------------------------- */

struct in {
    const unsigned char *p;
    size_t len, at;
};

/* n bytes (then the padding) from the message, or NULL past its end */
static const unsigned char *take(struct in *in, size_t n)
{
    const unsigned char *q;
    const size_t padded = pad8(n);
    if (padded < n || padded > in->len - in->at)
        return NULL;
    q = in->p + in->at;
    in->at += padded;
    return q;
}

int dg_wire_length(const unsigned char *header, size_t max_bytes, size_t *len,
                   struct dg_error *err)
{
    uint32_t h32[4];
    uint64_t body;
    memcpy(h32, header, sizeof h32);
    memcpy(&body, header + sizeof h32, sizeof body);
    if (h32[0] != MAGIC || h32[1] != VERSION)
        return dg_error_set(err, DG_E_FORMAT, "backend wire: not a job (magic %08x, version %u)",
                            (unsigned)h32[0], (unsigned)h32[1]);
    if (body > max_bytes || body + DG_WIRE_HEADER_BYTES > max_bytes || body % 8)
        return dg_error_set(err, DG_E_FORMAT, "backend wire: a body of %llu bytes (at most %zu)",
                            (unsigned long long)body, max_bytes);
    *len = DG_WIRE_HEADER_BYTES + (size_t)body;
    return 0;
}

#define TAKE(dst, n, what)                                                              \
    do {                                                                                \
        const unsigned char *q_ = take(&in, (n));                                       \
        if (!q_) {                                                                      \
            rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: %s runs past "  \
                              "the message's %zu bytes", i, (what), len);               \
            goto fail;                                                                  \
        }                                                                               \
        memcpy((dst), q_, (n));                                                         \
    } while (0)

int dg_wire_decode(const unsigned char *buf, size_t len, struct dg_wire_job *j,
                   struct dg_error *err)
{
    struct in in = {buf, len, 0};
    uint32_t h32[4];
    int64_t h64[4];
    size_t whole;
    int rc, i = -1;

    memset(j, 0, sizeof *j);
    if (len < DG_WIRE_HEADER_BYTES)
        return dg_error_set(err, DG_E_FORMAT, "backend wire: %zu bytes, shorter than a header",
                            len);
    if ((rc = dg_wire_length(buf, len, &whole, err)) < 0)
        return rc;
    if (whole != len)
        return dg_error_set(err, DG_E_FORMAT, "backend wire: the header says %zu bytes, the "
                            "message has %zu", whole, len);
    memcpy(h32, take(&in, sizeof h32), sizeof h32);
    memcpy(h64, take(&in, sizeof h64), sizeof h64);
    if (h32[2] < DG_WIRE_OPEN || h32[2] > DG_WIRE_QUIT || h32[3] > DG_WIRE_MAX_ITEMS ||
        h64[1] < -1 || h64[1] > 0x7fffffff || h64[2] < 0 || h64[3] < 0 || h64[3] > 0x7fffffff)
        return dg_error_set(err, DG_E_FORMAT, "backend wire: kind %u, %u items, slot %lld, "
                            "%lld positions, canvas %lld", (unsigned)h32[2], (unsigned)h32[3],
                            (long long)h64[1], (long long)h64[2], (long long)h64[3]);
    j->kind = (enum dg_wire_kind)h32[2];
    j->n = (int)h32[3];
    j->slot = (int)h64[1];
    j->max_positions = h64[2];
    j->max_cl = (int)h64[3];
    if (j->kind == DG_WIRE_ENCODE) {
        struct dg_encode_item *it = calloc((size_t)(j->n ? j->n : 1), sizeof *it);
        if (!it)
            return dg_error_set(err, DG_E_NOMEM, "backend wire: out of memory");
        j->owned = it;
        j->enc = it;
        for (i = 0; i < j->n; i++) {
            int32_t head[2];
            const unsigned char *ids;
            TAKE(head, sizeof head, "its slot");
            TAKE(&it[i].n, sizeof it[i].n, "its length");
            if (it[i].n < 0 || it[i].n > DG_WIRE_MAX_IDS) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: %lld ids", i,
                                  (long long)it[i].n);
                goto fail;
            }
            it[i].slot = head[0];
            if (!(ids = take(&in, sizeof(int32_t) * (size_t)it[i].n))) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: %lld ids run past "
                                  "the message's %zu bytes", i, (long long)it[i].n, len);
                goto fail;
            }
            it[i].ids = (const int32_t *)(const void *)ids;
        }
    } else if (j->kind == DG_WIRE_DENOISE) {
        struct dg_denoise_item *it = calloc((size_t)(j->n ? j->n : 1), sizeof *it);
        if (!it)
            return dg_error_set(err, DG_E_NOMEM, "backend wire: out of memory");
        j->owned = it;
        j->den = it;
        for (i = 0; i < j->n; i++) {
            int32_t head[4];
            float f[2];
            uint32_t site[2];
            const unsigned char *canvas, *append;
            TAKE(head, sizeof head, "its slot");
            TAKE(f, sizeof f, "its temperature");
            TAKE(&it[i].seed, sizeof it[i].seed, "its seed");
            TAKE(site, sizeof site, "its draw site");
            TAKE(&it[i].n_append, sizeof it[i].n_append, "its append count");
            if (head[1] < 0 || head[1] > DG_WIRE_MAX_IDS) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: canvas of %d", i,
                                  head[1]);
                goto fail;
            }
            if (it[i].n_append < 0 || it[i].n_append > DG_WIRE_MAX_IDS) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: %lld appended ids, "
                                  "outside 0 .. 2^24", i, (long long)it[i].n_append);
                goto fail;
            }
            if (!(append = take(&in, sizeof(int32_t) * (size_t)it[i].n_append))) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: %lld appended ids "
                                  "run past the message's %zu bytes", i,
                                  (long long)it[i].n_append, len);
                goto fail;
            }
            it[i].append = it[i].n_append > 0 ? (const int32_t *)(const void *)append : NULL;
            it[i].slot = head[0];
            it[i].cl = head[1];
            it[i].self_cond = head[2];
            it[i].top_k = head[3];
            it[i].temperature = f[0];
            it[i].top_p = f[1];
            it[i].canvas_index = site[0];
            it[i].step = site[1];
            if (!(canvas = take(&in, sizeof(int32_t) * (size_t)it[i].cl))) {
                rc = dg_error_set(err, DG_E_FORMAT, "backend wire: item %d: a canvas of %d runs "
                                  "past the message's %zu bytes", i, it[i].cl, len);
                goto fail;
            }
            it[i].canvas = (const int32_t *)(const void *)canvas;
        }
    } else if (j->kind == DG_WIRE_CONDITION) {
        int *w = calloc((size_t)(j->n ? j->n : 1), sizeof *w);
        const unsigned char *q = take(&in, sizeof(int32_t) * (size_t)j->n);
        if (!w)
            return dg_error_set(err, DG_E_NOMEM, "backend wire: out of memory");
        j->owned = w;
        j->which = w;
        if (!q) {
            rc = dg_error_set(err, DG_E_FORMAT, "backend wire: %d indexes run past the "
                              "message's %zu bytes", j->n, len);
            goto fail;
        }
        for (int k = 0; k < j->n; k++) {
            int32_t v;
            memcpy(&v, q + sizeof v * (size_t)k, sizeof v);
            w[k] = v;
        }
    } else if (j->n != 0) {
        return dg_error_set(err, DG_E_FORMAT, "backend wire: kind %d with %d items",
                            (int)j->kind, j->n);
    }
    if (in.at != len) {
        rc = dg_error_set(err, DG_E_FORMAT, "backend wire: %zu bytes left over", len - in.at);
        goto fail;
    }
    return 0;
fail:
    dg_wire_job_free(j);
    return rc;
}

void dg_wire_job_free(struct dg_wire_job *j)
{
    free(j->owned);
    memset(j, 0, sizeof *j);
}
