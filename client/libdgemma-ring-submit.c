/*
 * libdgemma-ring-submit.c - the shared-memory ring's submissions (the
 * client side of lib/shm-layout.h; dgemma_ring_t, and how it keeps the
 * indexes and the submission arena, in libdgemma-internal.h): a request
 * encoded into a ring entry, its bytes into the submission arena, the entry
 * published (dgemma_ring_submit, dgemma_ring_cancel) and the daemon woken
 * (dgemma_ring_kick).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <string.h>

#include "client/libdgemma-internal.h"

/* Load sq_head (acquire) and give back the arena bytes of every entry the
 * daemon has copied out since the last call.  DGEMMA_E_PROTOCOL when the
 * daemon's sq_head is not between what it had and our tail. */
static int ring_reclaim(dgemma_ring_t *ring)
{
    const uint32_t head = __atomic_load_n(&ring->h->sq_head, __ATOMIC_ACQUIRE);
    if ((uint32_t)(head - ring->sq_freed) > (uint32_t)(ring->sq_tail - ring->sq_freed))
        return dgc_ring_break(ring, "sq_head %" PRIu32 " is outside [%" PRIu32 ", %" PRIu32 "]",
                              head, ring->sq_freed, ring->sq_tail);
    while (ring->sq_freed != head) {
        const struct arena_rec *a = &ring->slot[ring->sq_freed & (ring->sq_entries - 1)];
        if (a->end > ring->in_head)
            ring->in_head = a->end;
        ring->sq_freed++;
    }
    return DGEMMA_OK;
}

/* Take n bytes (n <= in_size) of the submission arena for entry sq_tail:
 * their offset in *off and the record in the entry's slot.  Starts are
 * 8-aligned (when in_size is); a block never wraps (the bytes to the end of
 * the arena are skipped and given back with the entry).  DGEMMA_E_AGAIN
 * (no message) when the arena has no room now. */
static int arena_take(dgemma_ring_t *ring, uint64_t n, uint64_t *off)
{
    struct arena_rec *rec = &ring->slot[ring->sq_tail & (ring->sq_entries - 1)];
    uint64_t pos, pad;
    if (ring->in_tail == ring->in_head && n > 0) {
        /* empty: start again at offset 0 (pending empty records end before) */
        const uint64_t r = ring->in_tail % ring->in_size;
        if (r != 0)
            ring->in_tail += ring->in_size - r;
        ring->in_head = ring->in_tail;
    }
    pos = ring->in_tail % ring->in_size;
    pad = (8 - pos % 8) % 8;
    if (n == 0)
        pad = 0;
    else if (pos + pad + n > ring->in_size)
        pad = ring->in_size - pos; /* to the start of the arena */
    if (ring->in_tail - ring->in_head + pad + n > ring->in_size)
        return DGEMMA_E_AGAIN;
    rec->start = ring->in_tail;
    ring->in_tail += pad + n;
    rec->end = ring->in_tail;
    *off = (pos + pad) % ring->in_size;
    return DGEMMA_OK;
}

/* Check that the SQ has a free entry: DGEMMA_E_AGAIN (message set) when
 * not, or an error. */
static int sq_room(dgemma_ring_t *ring, const char *what)
{
    int rc = ring_reclaim(ring);
    if (rc < 0)
        return rc;
    if ((uint32_t)(ring->sq_tail - ring->sq_freed) >= ring->sq_entries)
        return dgc_seterr(ring->c, DGEMMA_E_AGAIN,
                          "%s: the submission ring is full (%" PRIu32 " entries): reap, then "
                          "try again", what, ring->sq_entries);
    return DGEMMA_OK;
}

/* Write e into entry sq_tail and publish it (release store of sq_tail). */
static void sq_publish(dgemma_ring_t *ring, const struct dg_shm_sqe *e)
{
    memcpy(ring->sq + (size_t)(ring->sq_tail & (ring->sq_entries - 1)) * DG_SHM_SQE_SIZE, e,
           sizeof *e);
    ring->sq_tail++;
    __atomic_store_n(&ring->h->sq_tail, ring->sq_tail, __ATOMIC_RELEASE);
    ring->unkicked++;
}

/* ---- submissions ---- */

/* 1 with *x set when v is a JSON integer, else 0. */
static int get_ll(const json_t *v, long long *x)
{
    if (!json_is_integer(v))
        return 0;
    *x = (long long)json_integer_value(v);
    return 1;
}

/* Fill e (and *prompt, *stops) from the request object: everything a ring
 * entry carries, checked for what the ring can hold (types, sizes); the
 * daemon checks the values.  Returns 0 or DGEMMA_E_INVAL (message set). */
static int encode_request(dgemma_ring_t *ring, const json_t *obj, struct dg_shm_sqe *e,
                          const json_t **prompt, const json_t **stops, uint64_t *stop_len)
{
    static const struct {
        const char *key;
        uint32_t bit;
        size_t off;
    } I32[] = {
        {"canvas_length", DG_SHM_SET_CANVAS_LENGTH, offsetof(struct dg_shm_sqe, canvas_length)},
        {"max_denoising_steps", DG_SHM_SET_MAX_DENOISING_STEPS,
         offsetof(struct dg_shm_sqe, max_denoising_steps)},
        {"stability_threshold", DG_SHM_SET_STABILITY_THRESHOLD,
         offsetof(struct dg_shm_sqe, stability_threshold)},
        {"top_k", DG_SHM_SET_TOP_K, offsetof(struct dg_shm_sqe, top_k)},
    }, DBL[] = {
        {"entropy_bound", DG_SHM_SET_ENTROPY_BOUND, offsetof(struct dg_shm_sqe, entropy_bound)},
        {"confidence_threshold", DG_SHM_SET_CONFIDENCE_THRESHOLD,
         offsetof(struct dg_shm_sqe, confidence_threshold)},
        {"t_min", DG_SHM_SET_T_MIN, offsetof(struct dg_shm_sqe, t_min)},
        {"t_max", DG_SHM_SET_T_MAX, offsetof(struct dg_shm_sqe, t_max)},
        {"top_p", DG_SHM_SET_TOP_P, offsetof(struct dg_shm_sqe, top_p)},
    };
    dgemma_t *c = ring->c;
    const char *key;
    json_t *v;
    long long x;

    *prompt = *stops = NULL;
    *stop_len = 0;
    json_object_foreach((json_t *)obj, key, v) {
        size_t i;
        if (!strcmp(key, "v") || !strcmp(key, "stream") || !strcmp(key, "tag"))
            continue; /* ring jobs are never streamed; user_data replaces the tag */
        if (!strcmp(key, "op")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "generate") != 0)
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: op: not \"generate\"");
            continue;
        }
        if (!strcmp(key, "messages") || !strcmp(key, "enable_thinking"))
            return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: a chat request cannot go on the "
                              "ring (render it to text, or use dgemma_submit)", key);
        if (!strcmp(key, "prompt") || !strcmp(key, "prompt_ids")) {
            const int ids = !strcmp(key, "prompt_ids");
            if (*prompt)
                return dgc_seterr(c, DGEMMA_E_INVAL,
                                  "ring submit: both prompt and prompt_ids: give one");
            if (ids ? !json_is_array(v) : !json_is_string(v))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected %s", key,
                                  ids ? "a list of token ids" : "a string");
            *prompt = v;
            e->op = ids ? DG_SHM_OP_IDS : DG_SHM_OP_TEXT;
            continue;
        }
        if (!strcmp(key, "batch") || !strcmp(key, "parse_special")) {
            const int batch = !strcmp(key, "batch");
            if (!json_is_boolean(v))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected true or false",
                                  key);
            if (batch && json_is_true(v))
                e->flags |= DG_SHM_F_BATCH;
            if (!batch)
                e->flags |= json_is_true(v) ? DG_SHM_F_PARSE_SPECIAL : DG_SHM_F_PLAIN_TEXT;
            continue;
        }
        if (json_is_null(v)) /* a setting left at its default, as on the socket */
            continue;
        for (i = 0; i < sizeof I32 / sizeof I32[0]; i++)
            if (!strcmp(key, I32[i].key)) {
                int32_t y;
                if (!get_ll(v, &x))
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected an integer",
                                      key);
                if (x < INT32_MIN || x > INT32_MAX)
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: %lld does not fit the "
                                      "ring's 32 bits", key, x);
                y = (int32_t)x;
                memcpy((char *)e + I32[i].off, &y, sizeof y);
                e->set |= I32[i].bit;
                break;
            }
        if (i < sizeof I32 / sizeof I32[0])
            continue;
        for (i = 0; i < sizeof DBL / sizeof DBL[0]; i++)
            if (!strcmp(key, DBL[i].key)) {
                double d;
                if (!json_is_number(v))
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected a number", key);
                d = json_number_value(v);
                memcpy((char *)e + DBL[i].off, &d, sizeof d);
                e->set |= DBL[i].bit;
                break;
            }
        if (i < sizeof DBL / sizeof DBL[0])
            continue;
        if (!strcmp(key, "seed")) {
            if (!get_ll(v, &x))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: seed: expected an integer");
            if (x < 0)
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: seed: %lld is negative", x);
            e->seed = (uint64_t)x;
            e->set |= DG_SHM_SET_SEED;
        } else if (!strcmp(key, "max_tokens")) {
            if (!get_ll(v, &x))
                return dgc_seterr(c, DGEMMA_E_INVAL,
                                  "ring submit: max_tokens: expected an integer");
            e->max_tokens = (int64_t)x;
            e->set |= DG_SHM_SET_MAX_TOKENS;
        } else if (!strcmp(key, "stop_token_ids")) {
            const size_t k = json_is_array(v) ? json_array_size(v) : 1;
            if (!json_is_array(v) && !json_is_integer(v))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids: expected an "
                                  "integer or a list of integers");
            if (k > DG_SHM_MAX_STOP_IDS)
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids: %zu ids; the "
                                  "ring carries at most %d", k, DG_SHM_MAX_STOP_IDS);
            for (size_t j = 0; j < k; j++) {
                if (!get_ll(json_is_array(v) ? json_array_get(v, j) : v, &x))
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids[%zu]: "
                                      "expected an integer", j);
                if (x < INT32_MIN || x > INT32_MAX)
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids[%zu]: %lld "
                                      "does not fit 32 bits", j, x);
                e->stop_ids[j] = (int32_t)x;
            }
            e->n_stop_ids = (uint32_t)k;
            e->set |= DG_SHM_SET_STOP_IDS;
        } else if (!strcmp(key, "stop")) {
            const size_t k = json_is_array(v) ? json_array_size(v) : 1;
            if (!json_is_array(v) && !json_is_string(v))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop: expected a string or a "
                                  "list of strings");
            for (size_t j = 0; j < k; j++) {
                const json_t *s = json_is_array(v) ? json_array_get(v, j) : v;
                if (!json_is_string(s))
                    return dgc_seterr(c, DGEMMA_E_INVAL,
                                      "ring submit: stop[%zu]: expected a string", j);
                if (strlen(json_string_value(s)) != json_string_length(s))
                    return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: stop[%zu]: a NUL inside", j);
                *stop_len += json_string_length(s) + 1;
            }
            *stops = v;
            e->set |= DG_SHM_SET_STOP;
        } else {
            return dgc_seterr(c, DGEMMA_E_INVAL,
                              "ring submit: %.64s: not a setting the ring carries", key);
        }
    }
    if (!*prompt)
        return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: no prompt (a text or token-id request)");
    if (e->op == DG_SHM_OP_IDS && (e->flags & (DG_SHM_F_PLAIN_TEXT | DG_SHM_F_PARSE_SPECIAL)))
        return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: parse_special: with a text prompt "
                          "only");
    if (e->op == DG_SHM_OP_IDS) {
        json_t *id;
        size_t j;
        json_array_foreach(*prompt, j, id) {
            if (!get_ll(id, &x))
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: prompt_ids[%zu]: expected an "
                                  "integer", j);
            if (x < INT32_MIN || x > INT32_MAX)
                return dgc_seterr(c, DGEMMA_E_INVAL, "ring submit: prompt_ids[%zu]: %lld does not "
                                  "fit 32 bits", j, x);
        }
    }
    return DGEMMA_OK;
}

int dgemma_ring_submit(dgemma_ring_t *ring, const dgemma_request_t *r, uint64_t user_data)
{
    struct dg_shm_sqe e;
    const json_t *prompt, *stops;
    uint64_t plen, slen, off = 0;
    int rc;

    if (!ring)
        return DGEMMA_E_INVAL;
    if (!r)
        return dgc_seterr(ring->c, DGEMMA_E_INVAL, "ring submit: a NULL request");
    if ((rc = dgc_ring_gone(ring)) < 0)
        return rc;
    memset(&e, 0, sizeof e);
    e.user_data = user_data;
    if ((rc = encode_request(ring, r->obj, &e, &prompt, &stops, &slen)) < 0)
        return rc;
    plen = e.op == DG_SHM_OP_IDS ? (uint64_t)json_array_size(prompt) * sizeof(int32_t)
                                 : (uint64_t)json_string_length(prompt);
    if (plen + slen > ring->in_size || plen > UINT32_MAX || slen > UINT32_MAX)
        return dgc_seterr(ring->c, DGEMMA_E_INVAL, "ring submit: %" PRIu64 " bytes of prompt and "
                          "stop strings; the prompt arena holds %" PRIu64, plen + slen,
                          ring->in_size);
    if ((rc = sq_room(ring, "ring submit")) < 0)
        return rc;
    if (arena_take(ring, plen + slen, &off) < 0)
        return dgc_seterr(ring->c, DGEMMA_E_AGAIN, "ring submit: the prompt arena is full (%" PRIu64
                          " of %" PRIu64 " bytes taken): reap, then try again",
                          ring->in_tail - ring->in_head, ring->in_size);
    e.prompt_off = off;
    e.prompt_len = (uint32_t)plen;
    if (e.op == DG_SHM_OP_IDS) {
        json_t *id;
        size_t j;
        json_array_foreach(prompt, j, id) {
            const int32_t x = (int32_t)json_integer_value(id);
            memcpy(ring->in + off + j * sizeof x, &x, sizeof x);
        }
    } else if (plen > 0) {
        memcpy(ring->in + off, json_string_value(prompt), plen);
    }
    if (stops) {
        const size_t k = json_is_array(stops) ? json_array_size(stops) : 1;
        uint64_t at = off + plen;
        e.stop_off = at;
        e.stop_len = (uint32_t)slen;
        for (size_t j = 0; j < k; j++) {
            const json_t *s = json_is_array(stops) ? json_array_get(stops, j) : stops;
            memcpy(ring->in + at, json_string_value(s), json_string_length(s) + 1);
            at += json_string_length(s) + 1;
        }
    }
    sq_publish(ring, &e);
    return DGEMMA_OK;
}

int dgemma_ring_cancel(dgemma_ring_t *ring, uint64_t user_data)
{
    struct dg_shm_sqe e;
    uint64_t off;
    int rc;

    if (!ring)
        return DGEMMA_E_INVAL;
    dgc_ring_hung_up(ring); /* (a daemon gone would never see the cancel) */
    if ((rc = dgc_ring_gone(ring)) < 0)
        return rc;
    if ((rc = sq_room(ring, "ring cancel")) < 0)
        return rc;
    memset(&e, 0, sizeof e);
    e.user_data = user_data; /* the job's: a cancel has no completion of its own */
    e.op = DG_SHM_OP_CANCEL;
    e.cancel_user_data = user_data;
    arena_take(ring, 0, &off); /* (an empty record: never fails) */
    sq_publish(ring, &e);
    return DGEMMA_OK;
}

int dgemma_ring_kick(dgemma_ring_t *ring)
{
    int rc;
    if (!ring)
        return DGEMMA_E_INVAL;
    dgc_ring_hung_up(ring); /* (one poll that does not wait, beside the doorbell's write) */
    if ((rc = dgc_ring_gone(ring)) < 0)
        return rc;
    if (ring->unkicked == 0)
        return DGEMMA_OK;
    if ((rc = dgc_ring_doorbell(ring)) < 0)
        return rc;
    ring->unkicked = 0;
    return DGEMMA_OK;
}
