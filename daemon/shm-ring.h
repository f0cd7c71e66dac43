/*
 * shm-ring.h - the daemon's side of one client's shared-memory job ring
 * (the layout and its rules: lib/shm-layout.h).
 *
 * DESIGN
 *   The front end owns every ring (one thread: nothing here locks).  A ring
 *   is a sealed memfd mapped MAP_SHARED, two eventfds and private
 *   book-keeping that the client cannot see: the geometry, the indexes the
 *   daemon last published, the jobs in flight and where each completion's
 *   bytes lie.  The client's memory is read in two places only: the
 *   indexes it owns (sq_tail, cq_head), each loaded once and checked, and
 *   a submission entry with its arena bytes, copied out before anything
 *   looks at them.
 *   Bound.  A submission is taken only while a completion slot is free for
 *   it (jobs in flight + completions not yet reaped < cq_entries), so the
 *   daemon holds at most cq_entries jobs of a ring, and a client that stops
 *   reaping stops only itself (DG_SHM_NEED_WAKE asks it to ring after it
 *   reaps).  A finished job whose bytes do not fit in the free part of the
 *   result arena waits in daemon memory (bounded by the same cq_entries)
 *   until the client reaps.
 *   Faults.  An index out of its range is a broken ring: DG_SHM_FAULT is
 *   set, nothing more is read or posted, and the caller cancels its jobs.
 */
#ifndef DG_DAEMON_SHM_RING_H
#define DG_DAEMON_SHM_RING_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"
#include "lib/shm-layout.h"

struct dshm_ring;

/* What a client may ask for (0: the default), and the caps. */
struct dshm_sizes {
    uint32_t sq_entries, cq_entries;
    uint64_t in_bytes, out_bytes;
};

struct dshm_limits {
    uint32_t max_entries;          /* cap on sq_entries and cq_entries */
    uint64_t max_arena_bytes;      /* cap on in_bytes and out_bytes */
    /* what a request may hold (0: no cap here), refused while the entry is
     * read, before any of it is copied into a request: more prompt ids
     * (too_large), more stop strings (bad_request) */
    uint64_t max_prompt_ids;
    uint32_t max_stop_strings;
};

/* The defaults when a client asks for nothing (capped by the limits). */
#define DSHM_DEFAULT_ENTRIES 256u
#define DSHM_DEFAULT_IN_BYTES (1u << 20)
#define DSHM_DEFAULT_OUT_BYTES (4u << 20)

/* The size in bytes of the mapping dshm_ring_create would make for ask
 * under lim (what the ring pins), making nothing. */
uint64_t dshm_ring_size_for(const struct dshm_sizes *ask, const struct dshm_limits *lim);

/* Create a ring with ask's sizes (each rounded up: entries to a power of
 * two, arenas to 4 KiB; then capped by lim).  *memfd: the sealed memfd for
 * the client (the caller sends it and closes its copy; the ring keeps its
 * mapping).  Errors: DG_E_IO (memfd, mmap, eventfd: the message says
 * which), DG_E_NOMEM. */
int dshm_ring_create(const struct dshm_sizes *ask, const struct dshm_limits *lim,
                     struct dshm_ring **out, int *memfd, struct dg_error *err);

/* Unmap, close the eventfds, free what is held.  r may be NULL. */
void dshm_ring_destroy(struct dshm_ring *r);

/* The sizes in effect and the mapping's size. */
void dshm_ring_sizes(const struct dshm_ring *r, struct dshm_sizes *s, uint64_t *total);

/* The submission doorbell (the client writes it; the caller reads it) and
 * the completion doorbell (dshm_ring_* write it). */
int dshm_ring_sq_fd(const struct dshm_ring *r);
int dshm_ring_cq_fd(const struct dshm_ring *r);

/* One submission, copied out of shared memory. */
struct dshm_job {
    uint32_t slot;                 /* the ring's record of it (for bind/complete) */
    uint64_t user_data;            /* CANCEL: the job to cancel (cancel_user_data) */
    uint32_t op;                   /* DG_SHM_OP_TEXT / _IDS / _CANCEL */
    int batch;
    json_t *request;               /* TEXT, IDS: the generate request, as the socket
                                    * protocol's object (the caller owns it) */
    /* an entry that cannot be used: the job completes with this error */
    uint32_t error;                /* 0 or a DG_SHM_ERR_* */
    char message[256];
};

/* Take the next submission.  Returns 1 with *job filled (json_decref
 * job->request), 0 when there is none or no completion slot is free for it
 * (DG_SHM_NEED_WAKE is then set), -1 when the ring is broken (err says how;
 * it stays broken).  A CANCEL takes no slot (it is taken even when every
 * slot is held); any other op does, until its completion is posted. */
int dshm_ring_next(struct dshm_ring *r, struct dshm_job *job, struct dg_error *err);

/* The same, but only a CANCEL: for a caller that can take no new job
 * now (its scheduler is full).  Returns 0, leaving the entry, when the
 * next one is not a cancel. */
int dshm_ring_next_cancel(struct dshm_ring *r, struct dshm_job *job, struct dg_error *err);

/* Record that the job in slot became request id (daemon's id). */
void dshm_ring_bind(struct dshm_ring *r, uint32_t slot, uint64_t id, uint64_t seed);

/* The slot of the job bound to request id, or of the job with user_data;
 * -1 if none is in flight. */
int dshm_ring_find_id(const struct dshm_ring *r, uint64_t id);
int dshm_ring_find_user(const struct dshm_ring *r, uint64_t user_data);

/* The request id bound to slot; 0 if none. */
uint64_t dshm_ring_id_of(const struct dshm_ring *r, uint32_t slot);

/* How a job ended. */
struct dshm_result {
    uint32_t status;               /* 0 or a DG_SHM_ERR_* */
    uint32_t finish;               /* DG_SHM_FINISH_* (status 0) */
    const int32_t *ids;
    size_t n_ids;
    const char *text;              /* status != 0: the message */
    size_t text_len;
    uint32_t prompt_tokens, completion_tokens, canvases;
    int32_t stop_id;
    uint64_t decoder_steps;
    double tokens_per_s, ms_total, ms_first_canvas;
};

/* The job in slot has ended: post its completion (copied), or keep it
 * until the result arena has room.  Output larger than the whole arena
 * becomes a DG_SHM_ERR_TOO_LARGE completion.  Owes the completion
 * doorbell (dshm_ring_bell_due) when something was posted.  Returns 0, or -DG_E_NOMEM when
 * the completion could not be copied: the job then completes as
 * DG_SHM_ERR_INTERNAL without output (from a spare made with the ring). */
int dshm_ring_complete(struct dshm_ring *r, uint32_t slot, const struct dshm_result *res);

/* Post what waits for room, after the client reaped.  Returns -1 when the
 * ring is (or just became) broken, else 0. */
int dshm_ring_flush(struct dshm_ring *r, struct dg_error *err);

/* Whether the completion doorbell is owed (something was posted, or the
 * ring broke, since the last call); clears it.  The ring never writes the
 * doorbell itself: the caller does, without blocking (the client can make
 * the eventfd blocking, and fill its counter). */
int dshm_ring_bell_due(struct dshm_ring *r);

/* Jobs taken and not yet posted. */
uint32_t dshm_ring_in_flight(const struct dshm_ring *r);

int dshm_ring_broken(const struct dshm_ring *r);

#endif
