/*
 * libdgemma-internal.h - private to libdgemma, shared by its files only:
 * the definitions of the handles dgemma.h leaves opaque (dgemma_t,
 * dgemma_request_t, dgemma_ring_t) and the helpers more than one of the
 * library's files calls (dgc_*).  It is not installed and is no part of
 * the API or the ABI: the layouts can change in any release without the
 * soname changing, which only holds while callers cannot see them.  The
 * shared library exports none of it (client/libdgemma.map keeps dgemma_*
 * only), and the helpers are hidden as well, so that a program or library
 * linking libdgemma.a does not export them either.
 *
 * The files:
 *   libdgemma.c              helpers, the connection, requests
 *   libdgemma-events.c       the event stream over the socket
 *   libdgemma-ring.c         the shared-memory ring: attach, detach, its checks
 *   libdgemma-ring-submit.c  the ring's submissions
 *   libdgemma-ring-reap.c    the ring's completions
 * (tests/unit/t-ring-client.c compiles them all into itself, to look at
 * the handles.)
 */
#ifndef DGEMMA_LIBDGEMMA_INTERNAL_H
#define DGEMMA_LIBDGEMMA_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "client/dgemma.h"
#include "lib/shm-layout.h"

/* Not exported, from the .so or from a library that links libdgemma.a. */
#define DGC_HIDDEN __attribute__((visibility("hidden")))

#define LINE_MAX_BYTES ((size_t)256 << 20) /* one event line at most */
#define FD_STASH 16                        /* descriptors taken from one read */

struct dgemma {
    int fd;
    int eof;        /* the daemon closed its side */
    int skipping;   /* discarding the rest of an overlong line */
    char *buf;      /* unread bytes are [start, end); no '\n' in [start, scan) */
    size_t cap, start, end, scan;
    json_t *ev;     /* the last event's parse (the event's strings point into it) */
    int ev_in_buf;  /* the last event's json points into buf[0, start): keep it */
    char *retired;  /* the buffer the last event's json points into, when
                       dgemma_ring_attach needed a new one; freed at the next event */
    int32_t *ids;   /* the last event's ids */
    size_t ids_cap;
    /* Lines sent (submit, cancel, status) whose first answer (accepted,
     * cancelling, status, or an error for the line) has not been read: the
     * daemon answers lines in order, so it tells dgemma_ring_attach which
     * error event without an id answers its shm_attach. */
    unsigned long unanswered;
    /* The largest request id an event on this connection has carried: the
     * daemon's ids only grow, so an error whose id is larger names a
     * request this connection was never told of, and answers a line (a
     * submit the daemon could not answer with its accepted). */
    uint64_t max_id;
    /* Descriptors that came with the bytes read (SCM_RIGHTS), kept only
     * while dgemma_ring_attach waits for its answer; fds_lost: some did not
     * fit or came in a second read. */
    int fds[FD_STASH];
    int n_fds, fds_lost;
    char err[512];
};

struct dgemma_request {
    json_t *obj;
    /* What the last failing call on it was about (dgemma_request_errmsg). */
    char err[256];
};

/* ---- the shared-memory ring ------------------------------------------------------------
 *
 * The client side of lib/shm-layout.h.  The ring keeps private copies of
 * the geometry and of the indexes it writes (sq_tail, cq_head), and reads
 * the daemon's (sq_head, cq_tail, flags) with acquire loads, checking them
 * before use.  The submission arena is a FIFO: entry i's bytes are
 * [slot[i].start, slot[i].end) on a free-running byte counter (position =
 * counter mod in_size), given back once sq_head has passed i.
 */

struct arena_rec {
    uint64_t start, end; /* free-running byte counters */
};

struct dgemma_ring {
    dgemma_t *c;             /* for its err (and its socket, to notice a hang-up) */
    int sock;                /* c->fd at attach (not owned) */
    int sq_efd, cq_efd;      /* the doorbells (owned) */
    unsigned char *base;     /* the mapping */
    size_t size;
    struct dg_shm_header *h;
    unsigned char *sq, *cq, *in, *out;
    uint32_t sq_entries, cq_entries;
    uint64_t in_size, out_size;
    uint32_t sq_tail;        /* ours: the next entry to fill */
    uint32_t sq_freed;       /* entries before it have their arena bytes given back */
    uint32_t cq_head;        /* ours: the next completion to take */
    uint32_t unkicked;       /* entries published since the last doorbell */
    uint64_t in_tail, in_head; /* arena bytes taken / given back (free-running) */
    struct arena_rec *slot;  /* per SQ slot */
    int hup;                 /* the connection hung up */
    int broken;              /* the daemon broke the ring's rules: DGEMMA_E_PROTOCOL from now on */
    char why[256];           /* ... and why */
    unsigned char *obuf;     /* the last completion's ids, then its text and a NUL */
    size_t obuf_cap;
};

/* ---- the helpers the files share (what each does: at its definition) ---- */

/* libdgemma.c */
DGC_HIDDEN extern const int32_t dgc_no_ids[1]; /* an empty "ids" list */
/* c's message set (printf-style); returns status */
DGC_HIDDEN int dgc_seterr(dgemma_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
DGC_HIDDEN const char *dgc_errstr(int e, char *buf, size_t n); /* strerror_r, into buf */
DGC_HIDDEN double dgc_now_ms(void);                            /* CLOCK_MONOTONIC, in ms */
DGC_HIDDEN void dgc_fds_drop(dgemma_t *c);
DGC_HIDDEN int dgc_send_all(dgemma_t *c, const char *s, size_t n, const char *what);

/* libdgemma-events.c */
DGC_HIDDEN const char *dgc_str_of(const json_t *o, const char *key);
DGC_HIDDEN int dgc_is_answer(const json_t *o, uint64_t *max_id);
DGC_HIDDEN int dgc_fill(dgemma_t *c, int wait_ms, int keep_fds);

/* libdgemma-ring.c */
DGC_HIDDEN int dgc_ring_break(dgemma_ring_t *ring, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
DGC_HIDDEN int dgc_ring_gone(dgemma_ring_t *ring);
DGC_HIDDEN int dgc_ring_hung_up(dgemma_ring_t *ring);
DGC_HIDDEN int dgc_ring_doorbell(dgemma_ring_t *ring);

#endif
