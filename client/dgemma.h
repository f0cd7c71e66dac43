/*
 * dgemma.h - libdgemma, the C client library of dgemmad (see libdgemma(3)
 * and the protocol in dgemmad(8)).
 *
 * One dgemma_t is one connection to the daemon.  Requests are built with
 * dgemma_request_*, sent with dgemma_submit (any number may be in flight;
 * a tag tells their events apart), and their events are read one at a time
 * with dgemma_next_event, blocking or not; dgemma_fd gives the socket for
 * the caller's own poll loop.
 *
 * Errors: every function that can fail returns 0 or a negative
 * enum dgemma_status, and dgemma_errmsg(c) says what happened (the daemon's
 * own message for DGEMMA_E_DAEMON); for the dgemma_request_* functions,
 * dgemma_request_errmsg(r).  Nothing here prints, exits or raises a signal
 * (sends use MSG_NOSIGNAL).  A dgemma_t is used by one thread at a time.
 *
 * Link: pkg-config --cflags --libs dgemma (shared), or --static.
 */
#ifndef DGEMMA_H
#define DGEMMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DGEMMA_DEFAULT_SOCKET "/run/dgemma/dgemmad.sock"
#define DGEMMA_SOCKET_ENV "DGEMMA_SOCKET"

enum dgemma_status {
    DGEMMA_OK = 0,
    DGEMMA_E_INVAL = -1,    /* a bad argument (a NULL, a key that is not a setting name) */
    DGEMMA_E_NOMEM = -2,
    DGEMMA_E_CONNECT = -3,  /* no daemon at the socket (or not in time) */
    DGEMMA_E_IO = -4,       /* the connection failed while sending or receiving */
    DGEMMA_E_CLOSED = -5,   /* the daemon closed the connection */
    DGEMMA_E_PROTOCOL = -6, /* a line from the daemon that is not a version-1 event */
    DGEMMA_E_AGAIN = -7,    /* dgemma_next_event: no event within the timeout */
    DGEMMA_E_DAEMON = -8,   /* (used by helpers that wait for a result) an error event */
};

/* The name of a status ("connect", "closed", ...); "unknown" otherwise. */
const char *dgemma_status_name(int status);

typedef struct dgemma dgemma_t;
typedef struct dgemma_request dgemma_request_t;

/* ---- the connection --------------------------------------------------------- */

/* A new, unconnected handle; NULL when out of memory. */
dgemma_t *dgemma_new(void);

/* Connect to the daemon at path (NULL: $DGEMMA_SOCKET, else
 * DGEMMA_DEFAULT_SOCKET), retrying for up to wait_s seconds while the
 * socket does not exist, refuses (the daemon is starting) or has its
 * queue of connections full (never blocking past wait_s).
 * Errors: DGEMMA_E_CONNECT, DGEMMA_E_INVAL (a path empty or too long). */
int dgemma_connect(dgemma_t *c, const char *path, double wait_s);

/* Close the connection and free c (NULL is fine). */
void dgemma_close(dgemma_t *c);

/* The socket, for poll(2) (POLLIN: an event may be ready); -1 if not
 * connected.  Read events only through dgemma_next_event, and after each
 * POLLIN take every event with timeout 0 until DGEMMA_E_AGAIN: events
 * already in the library's buffer do not make the socket readable. */
int dgemma_fd(const dgemma_t *c);

/* What the last failing call on c was about. */
const char *dgemma_errmsg(const dgemma_t *c);

/* ---- requests ----------------------------------------------------------------- */

/* A generate request from text (a <bos> is added by the daemon), from chat
 * messages (add them with dgemma_request_add_message), or from token ids.
 * NULL when out of memory (or text not valid UTF-8). */
dgemma_request_t *dgemma_request_text(const char *prompt);
dgemma_request_t *dgemma_request_chat(void);
dgemma_request_t *dgemma_request_ids(const int32_t *ids, size_t n);

/* role: "system", "user" or "assistant"; checked by the daemon. */
int dgemma_request_add_message(dgemma_request_t *r, const char *role, const char *content);

/* Settings by their protocol names (dgemmad(8)): integers (max_tokens,
 * seed, top_k, canvas_length, max_denoising_steps, stability_threshold),
 * reals (entropy_bound, confidence_threshold, t_min, t_max, top_p).
 * DGEMMA_E_INVAL for a key that is not one of those names, or a real that
 * is not finite. */
int dgemma_request_set_int(dgemma_request_t *r, const char *key, long long value);
int dgemma_request_set_real(dgemma_request_t *r, const char *key, double value);
/* Append a stop string / a stop token id. */
int dgemma_request_add_stop(dgemma_request_t *r, const char *stop);
int dgemma_request_add_stop_id(dgemma_request_t *r, int32_t id);
/* Several settings at once from a JSON object text ({"top_p":0.9, ...});
 * the daemon checks names and values. */
int dgemma_request_set_json(dgemma_request_t *r, const char *json_object);
/* stream (default 1): canvas events as they finish; 0: text in the done. */
int dgemma_request_set_stream(dgemma_request_t *r, int stream);
/* enable_thinking for chat requests. */
int dgemma_request_set_thinking(dgemma_request_t *r, int on);
/* parse_special (unset: the daemon's default, 1 unless configured): 0
 * encodes the prompt's text and the messages' contents as plain text, in
 * which a typed turn marker is not that token; for text a program did not
 * write itself. */
int dgemma_request_set_parse_special(dgemma_request_t *r, int on);
/* A tag (up to 128 bytes) the daemon echoes in this request's events. */
int dgemma_request_set_tag(dgemma_request_t *r, const char *tag);

/* What the last failing dgemma_request_* call on r was about (a key that
 * is not a setting, JSON that does not parse, ...); "" if none failed. */
const char *dgemma_request_errmsg(const dgemma_request_t *r);

void dgemma_request_free(dgemma_request_t *r);

/* Send r (it can be freed or reused afterwards).  The daemon answers with
 * an accepted event carrying the request's id, or an error event. */
int dgemma_submit(dgemma_t *c, const dgemma_request_t *r);

/* Ask the daemon to cancel request id (this connection's or the same
 * user's).  A cancelling event answers; the request's done follows on the
 * connection that submitted it. */
int dgemma_cancel(dgemma_t *c, uint64_t id);

/* Ask for the daemon's status: a status event answers. */
int dgemma_status(dgemma_t *c);

/* ---- events ------------------------------------------------------------------- */

enum dgemma_event_kind {
    DGEMMA_EV_ACCEPTED = 1,
    DGEMMA_EV_CANVAS,
    DGEMMA_EV_DONE,
    DGEMMA_EV_ERROR,
    DGEMMA_EV_CANCELLING,
    DGEMMA_EV_STATUS,
    DGEMMA_EV_OTHER,        /* an event kind this library does not know: see json */
};

/* One event.  Pointers stay valid until the next dgemma_next_event on the
 * same connection (or dgemma_close). */
typedef struct dgemma_event {
    enum dgemma_event_kind kind;
    uint64_t id;                 /* 0 when the event has none (an error before acceptance) */
    const char *tag;             /* NULL when none */
    /* canvas: this canvas's text and ids; done (stream false): the whole */
    const char *text;            /* NULL when absent; may contain NUL bytes: use text_len */
    size_t text_len;
    const int32_t *ids;
    size_t n_ids;
    int index;                   /* canvas */
    int steps;                   /* canvas */
    int tokens;                  /* canvas */
    int converged;               /* canvas */
    double ms;                   /* canvas */
    /* done */
    const char *finish_reason;   /* "stop", "length", "cancelled", "error" */
    long long prompt_tokens, completion_tokens;  /* done; accepted: prompt_tokens */
    int canvases;
    long long decoder_steps;
    double tokens_per_s;
    long long stop_id;           /* -1 when none */
    const char *stop;            /* the stop string that ended it, or NULL */
    uint64_t seed;               /* accepted */
    /* error (and done with finish_reason "error") */
    const char *code, *message;
    /* every event: the line as the daemon sent it (no newline) */
    const char *json;
} dgemma_event_t;

/* The next event, waiting up to timeout_ms (-1: no limit; 0: only one that
 * is already here).  Errors: DGEMMA_E_AGAIN (none in time), DGEMMA_E_CLOSED,
 * DGEMMA_E_IO, DGEMMA_E_PROTOCOL (the line is kept in dgemma_errmsg). */
int dgemma_next_event(dgemma_t *c, dgemma_event_t *ev, int timeout_ms);

/* ---- the shared-memory ring -------------------------------------------------------
 *
 * For many jobs at a high rate: the daemon lends the connection a ring in
 * shared memory (see "SHARED-MEMORY RING" in dgemmad(8)); jobs go in and
 * results come out without a system call each.  A ring job is a text or
 * token-id request (not a chat) with any settings, and it is never
 * streamed: one completion per job, with the whole output.  The request
 * builders above make ring jobs too.  The ring belongs to the connection:
 * it ends when the connection closes (jobs in flight are cancelled).
 * Detach it before closing (or reconnecting) the connection.  The ring
 * functions put their messages in dgemma_errmsg of the ring's connection,
 * and a ring and its connection are used by one thread at a time together.
 * Every ring function may also return DGEMMA_E_PROTOCOL once the daemon
 * broke the ring's rules (its indexes out of range); the ring is then
 * useless.
 */

typedef struct dgemma_ring dgemma_ring_t;

/* Sizes asked for (0: the daemon's default); the daemon caps each. */
typedef struct dgemma_ring_opts {
    unsigned sq_entries, cq_entries;  /* rounded up to a power of two */
    size_t in_bytes, out_bytes;       /* the prompt arena, the result arena */
} dgemma_ring_opts_t;

/* Ask the daemon for a ring on c (opts may be NULL) and map it.  Waits for
 * the answer (events of requests already in flight on c that arrive
 * meanwhile are kept for dgemma_next_event: a poll loop must take them
 * with timeout 0 after the call, as after a POLLIN, since they do not make
 * the socket readable).  Errors: DGEMMA_E_DAEMON (the
 * daemon refused: dgemma_errmsg says why), DGEMMA_E_PROTOCOL (a ring this
 * library cannot use), DGEMMA_E_IO, DGEMMA_E_CLOSED, DGEMMA_E_NOMEM. */
int dgemma_ring_attach(dgemma_t *c, const dgemma_ring_opts_t *opts, dgemma_ring_t **out);

/* Unmap the ring and close its descriptors (the daemon lets go of its side
 * when the connection closes).  r may be NULL. */
void dgemma_ring_detach(dgemma_ring_t *r);

/* Queue r as a job with user_data (echoed in its completion; the caller
 * keeps it unique among its jobs in flight).  Copies what it needs; r may
 * be freed at once.  The daemon hears of queued jobs at the next
 * dgemma_ring_kick, dgemma_ring_wait or dgemma_ring_reap.  Errors:
 * DGEMMA_E_AGAIN (the submission ring or the prompt arena is full: reap,
 * then try again), DGEMMA_E_INVAL (a chat request, a setting the ring
 * cannot carry, a value of the wrong JSON type or one the entry's field
 * cannot hold (an integer setting outside 32 bits, a negative seed), more
 * than 8 stop ids, a prompt larger than the arena: nothing is queued; the
 * daemon checks the values' ranges, refusing the job in its completion),
 * DGEMMA_E_CLOSED (the daemon left the ring). */
int dgemma_ring_submit(dgemma_ring_t *ring, const dgemma_request_t *r, uint64_t user_data);

/* Queue a cancel of the job submitted with user_data (its completion says
 * cancelled, or it finished first).  Errors as dgemma_ring_submit. */
int dgemma_ring_cancel(dgemma_ring_t *ring, uint64_t user_data);

/* Tell the daemon about the jobs queued since the last kick (one write to
 * the doorbell; nothing when there are none).  Errors: DGEMMA_E_IO,
 * DGEMMA_E_CLOSED (the daemon left the ring). */
int dgemma_ring_kick(dgemma_ring_t *ring);

/* One job's result.  Pointers stay valid until the next dgemma_ring_reap
 * on the same ring (or its detach). */
typedef struct dgemma_completion {
    uint64_t user_data, id, seed;       /* id 0: the daemon refused the job */
    const char *code, *message;         /* refused, or failed once started (finish_reason
                                           "error"): the error code and message; else NULL */
    const char *finish_reason;          /* "stop", "length", "cancelled", "error"; NULL if refused */
    const char *text;                   /* the output (text_len bytes, NUL-terminated too) */
    size_t text_len;
    const int32_t *ids;
    size_t n_ids;
    long long prompt_tokens, completion_tokens, decoder_steps, stop_id; /* stop_id -1: none */
    int canvases;
    double tokens_per_s, ms_total, ms_first_canvas;
} dgemma_completion_t;

/* Take the next completion, if one is there (kicks first when jobs are
 * queued).  Returns 0 with *out filled, or DGEMMA_E_AGAIN when none is
 * ready (the completion doorbell is then cleared); DGEMMA_E_CLOSED when
 * the daemon left the ring and nothing more will come (the completions
 * posted before come first); DGEMMA_E_PROTOCOL for a completion that does
 * not fit the ring (it is dropped, dgemma_errmsg names its user_data, and
 * the next call goes on with the next one); DGEMMA_E_NOMEM when there was
 * no memory to copy it out (it stays in the ring for the next call). */
int dgemma_ring_reap(dgemma_ring_t *ring, dgemma_completion_t *out);

/* Wait until a completion is ready or timeout_ms passes (-1: no limit;
 * kicks first when jobs are queued).  Returns 0 (one is ready),
 * DGEMMA_E_AGAIN (the timeout), DGEMMA_E_CLOSED (the daemon left the ring
 * or hung up, and no completion is left), DGEMMA_E_IO. */
int dgemma_ring_wait(dgemma_ring_t *ring, int timeout_ms);

/* The completion doorbell (an eventfd) for the caller's poll loop: readable
 * when completions may be ready (then dgemma_ring_reap until
 * DGEMMA_E_AGAIN).  Call dgemma_ring_kick after queueing jobs, before
 * polling: dgemma_ring_submit does not tell the daemon.  Poll dgemma_fd
 * too (POLLIN): a daemon that hangs up shows there, not here (then
 * dgemma_ring_reap returns DGEMMA_E_CLOSED).  -1 for NULL. */
int dgemma_ring_fd(const dgemma_ring_t *ring);

#ifdef __cplusplus
}
#endif

#endif
