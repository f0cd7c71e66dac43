/*
 * libdgemma-ring-reap.c - the shared-memory ring's completions (the client
 * side of lib/shm-layout.h; dgemma_ring_t in libdgemma-internal.h): each
 * taken out of the ring into a dgemma_completion_t (dgemma_ring_reap), or
 * waited for (dgemma_ring_wait), with the completion doorbell cleared and
 * a hang-up of the connection noticed.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/libdgemma-internal.h"

#define RING_RECHECK_MS 1000               /* dgemma_ring_wait looks at the flags */

static const char *const SHM_CODES[] = {NULL, "bad_request", "too_large", "busy",
                                        "shutting_down", "internal"};
static const char *const SHM_FINISH[] = {"stop", "length", "cancelled", "error"};

/* Read (and so clear) the completion doorbell, without waiting. */
static int ring_drain(dgemma_ring_t *ring)
{
    uint64_t v;
    char eb[128];
    for (;;) {
        ssize_t got = read(ring->cq_efd, &v, sizeof v);
        if (got == (ssize_t)sizeof v || (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)))
            return DGEMMA_OK;
        if (got < 0 && errno == EINTR)
            continue;
        return dgc_seterr(ring->c, DGEMMA_E_IO, "ring: the completion doorbell: %s",
                          got < 0 ? dgc_errstr(errno, eb, sizeof eb) : "a short read");
    }
}

/* ---- completions ---- */


/* Kick when entries are queued, unless the ring is gone (the caller tells
 * that after taking what completions are left). */
static int kick_if_queued(dgemma_ring_t *ring)
{
    if (ring->unkicked == 0 || dgc_ring_gone(ring) < 0)
        return DGEMMA_OK;
    return dgemma_ring_kick(ring);
}

/* Take completion cq_head into *out (its bytes copied to ring->obuf), move
 * cq_head (release) and ring the submission doorbell when the daemon waits
 * for room (DG_SHM_NEED_WAKE).  DGEMMA_E_AGAIN (no message) when none is
 * there; DGEMMA_E_PROTOCOL for indexes the daemon broke (the ring is then
 * broken) or for a completion that does not fit (it is dropped). */
static int reap_one(dgemma_ring_t *ring, dgemma_completion_t *out)
{
    const uint32_t tail = __atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE);
    struct dg_shm_cqe e;
    uint64_t idb, need;
    int bad = 0;

    if (tail == ring->cq_head)
        return DGEMMA_E_AGAIN;
    if ((uint32_t)(tail - ring->cq_head) > ring->cq_entries)
        return dgc_ring_break(ring, "cq_tail %" PRIu32 " is more than %" PRIu32 " past cq_head %"
                              PRIu32, tail, ring->cq_entries, ring->cq_head);
    memcpy(&e, ring->cq + (size_t)(ring->cq_head & (ring->cq_entries - 1)) * DG_SHM_CQE_SIZE,
           sizeof e);
    idb = (uint64_t)e.n_ids * sizeof(int32_t);
    need = idb + e.text_len;
    if (e.status > DG_SHM_ERR_INTERNAL || (e.status == DG_SHM_OK && e.finish > DG_SHM_FINISH_ERROR))
        bad = dgc_seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: the completion of job %" PRIu64
                         " has status %" PRIu32 " finish %" PRIu32 " (dropped)", e.user_data,
                         e.status, e.finish);
    else if (e.out_off > ring->out_size || need > ring->out_size - e.out_off)
        bad = dgc_seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: the completion of job %" PRIu64
                         " has %" PRIu64 " bytes at %" PRIu64 ", outside the %" PRIu64 "-byte arena"
                         " (dropped)", e.user_data, need, e.out_off, ring->out_size);
    else if (need + 1 > ring->obuf_cap) {
        size_t cap = ring->obuf_cap ? ring->obuf_cap : 256;
        unsigned char *p;
        while (cap < need + 1)
            cap *= 2;
        if (!(p = realloc(ring->obuf, cap)))
            return dgc_seterr(ring->c, DGEMMA_E_NOMEM, "ring: out of memory for a %" PRIu64
                              "-byte completion", need);
        ring->obuf = p;
        ring->obuf_cap = cap;
    }
    if (!bad) {
        memcpy(ring->obuf, ring->out + e.out_off, need);
        ring->obuf[need] = '\0';
    }
    ring->cq_head++;
    /* Our store of cq_head, then our load of flags; the daemon sets
     * NEED_WAKE, then loads cq_head: all four sequentially consistent, so
     * one side sees the other's store (release/acquire alone would let
     * both miss). */
    __atomic_store_n(&ring->h->cq_head, ring->cq_head, __ATOMIC_SEQ_CST);
    if ((__atomic_load_n(&ring->h->flags, __ATOMIC_SEQ_CST) & DG_SHM_NEED_WAKE) &&
        dgc_ring_doorbell(ring) < 0)
        ring->unkicked++; /* try again at the next kick, which reports it */
    if (bad)
        return bad;
    memset(out, 0, sizeof *out);
    out->user_data = e.user_data;
    out->id = e.request_id;
    out->seed = e.seed;
    out->ids = e.n_ids ? (const int32_t *)(void *)ring->obuf : dgc_no_ids;
    out->n_ids = e.n_ids;
    if (e.status != DG_SHM_OK) {
        /* refused (no id), or failed once started (an id: finish "error") */
        out->code = SHM_CODES[e.status];
        out->message = (const char *)ring->obuf + idb;
        out->finish_reason = e.request_id ? SHM_FINISH[DG_SHM_FINISH_ERROR] : NULL;
        out->text = "";
    } else {
        out->finish_reason = SHM_FINISH[e.finish];
        out->text = (const char *)ring->obuf + idb;
        out->text_len = e.text_len;
    }
    out->prompt_tokens = e.prompt_tokens;
    out->completion_tokens = e.completion_tokens;
    out->decoder_steps = (long long)e.decoder_steps;
    out->stop_id = e.stop_id;
    out->canvases = (int)e.canvases;
    out->tokens_per_s = e.tokens_per_s;
    out->ms_total = e.ms_total;
    out->ms_first_canvas = e.ms_first_canvas;
    return DGEMMA_OK;
}

int dgemma_ring_reap(dgemma_ring_t *ring, dgemma_completion_t *out)
{
    int rc;
    if (!ring)
        return DGEMMA_E_INVAL;
    if (!out)
        return dgc_seterr(ring->c, DGEMMA_E_INVAL, "ring reap: a NULL completion");
    memset(out, 0, sizeof *out);
    out->stop_id = -1;
    if (ring->broken)
        return dgc_ring_gone(ring);
    if ((rc = kick_if_queued(ring)) < 0)
        return rc;
    if ((rc = reap_one(ring, out)) != DGEMMA_E_AGAIN)
        return rc;
    /* none: clear the doorbell (a poll loop on dgemma_ring_fd would spin on
     * it), then look again for one posted before the write we took */
    if ((rc = ring_drain(ring)) < 0)
        return rc;
    if ((rc = reap_one(ring, out)) != DGEMMA_E_AGAIN)
        return rc;
    /* the daemon hung up: what it posted before that, then CLOSED */
    if (dgc_ring_hung_up(ring) && (rc = reap_one(ring, out)) != DGEMMA_E_AGAIN)
        return rc;
    if ((rc = dgc_ring_gone(ring)) < 0)
        return rc;
    return dgc_seterr(ring->c, DGEMMA_E_AGAIN, "ring reap: no completion ready");
}

int dgemma_ring_wait(dgemma_ring_t *ring, int timeout_ms)
{
    double deadline;
    char eb[128];
    int rc;

    if (!ring)
        return DGEMMA_E_INVAL;
    if (ring->broken)
        return dgc_ring_gone(ring);
    if ((rc = kick_if_queued(ring)) < 0)
        return rc;
    deadline = dgc_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        struct pollfd p[2] = {{ring->cq_efd, POLLIN, 0}, {ring->sock, POLLRDHUP, 0}};
        const uint32_t tail = __atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE);
        int wait;
        if (tail != ring->cq_head)
            return DGEMMA_OK; /* (reap checks it) */
        if ((rc = dgc_ring_gone(ring)) < 0)
            return rc;
        if (timeout_ms < 0) {
            wait = -1;
        } else {
            const double left = deadline - dgc_now_ms();
            wait = left > 0 ? (int)(left + 0.999) : 0;
        }
        /* a look at the flags now and then, should DG_SHM_FAULT come
         * without a ring of the doorbell */
        if (wait < 0 || wait > RING_RECHECK_MS)
            wait = RING_RECHECK_MS;
        rc = poll(p, 2, wait);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return dgc_seterr(ring->c, DGEMMA_E_IO, "ring wait: poll: %s",
                              dgc_errstr(errno, eb, sizeof eb));
        if (rc == 0) {
            if (__atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE) != ring->cq_head)
                return DGEMMA_OK;
            if (timeout_ms < 0 || deadline - dgc_now_ms() > 0)
                continue; /* (a recheck) */
            return dgc_seterr(ring->c, DGEMMA_E_AGAIN, "ring wait: no completion within %d ms",
                              timeout_ms);
        }
        if ((p[0].revents | p[1].revents) & POLLNVAL)
            return dgc_seterr(ring->c, DGEMMA_E_IO, "ring wait: %s is not open",
                              p[0].revents & POLLNVAL ? "the completion doorbell"
                                                  : "the connection's socket");
        if (p[0].revents & POLLERR)
            return dgc_seterr(ring->c, DGEMMA_E_IO, "ring wait: the completion doorbell failed");
        if (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR))
            ring->hup = 1; /* the ring is looked at once more, then CLOSED */
        if ((p[0].revents & POLLIN) && (rc = ring_drain(ring)) < 0)
            return rc;
    }
}
