/*
 * sched.h - the scheduler: one thread that owns the generation engine.
 *
 * DESIGN
 *   Threads.  The front end (io_uring loop) submits requests, cancels and
 *   "connection gone" notices; the scheduler thread admits queued requests
 *   into free engine slots, runs dg_engine_step() while anything is in
 *   flight (every request advances by one pass per step, whatever its
 *   phase), and turns engine events into protocol lines.  The backend's
 *   rank workers run below the engine, inside dg_engine_step().
 *   Queues.  Commands go in under `mu` (the scheduler picks cancels up at
 *   the next step boundary: the engine is touched by this thread only);
 *   output lines go out through an outbox under the same mutex, and each
 *   push writes the front end's eventfd.  Nothing here waits on a socket:
 *   a slow client costs only memory in the front end.
 *   Ordering.  For one request: accepted (sent by the front end before the
 *   scheduler sees the request), canvas events in order, then exactly one
 *   done.  A request whose connection is gone produces no lines.
 */
#ifndef DG_DAEMON_SCHED_H
#define DG_DAEMON_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/protocol.h"
#include "lib/backend.h"
#include "lib/engine.h"
#include "lib/error.h"
#include "lib/metrics-db.h"

struct dmetrics;

struct dsched;

/* One line for a connection; conn is the front end's key. */
struct dsched_out {
    uint64_t conn;
    char *line;          /* malloc'd; the receiver frees it */
    size_t len;
    int ends_request;    /* the request's last line (done) */
};

struct dsched_status {
    size_t queued, running;
    uint64_t accepted, finished, cancelled, failed;
    uint64_t completion_tokens, decoder_steps, engine_steps;
    int shutting_down;
};

/* A scheduler over b with ec; tok (may be NULL) for text; metrics (may
 * be NULL) gets one row per request that ends, however it ends; at most
 * queue_max requests wait for one of ec->max_batch slots (a submission
 * finding max_batch + queue_max requests in the scheduler is refused with
 * DG_E_BUSY); notify_fd is written (8 bytes) when
 * the outbox gains lines.  The thread starts here.  Errors: DG_E_NOMEM,
 * DG_E_INTERNAL (thread), the engine's. */
int dsched_create(struct dg_backend *b, const struct dg_engine_config *ec,
                  const struct dg_tokenizer *tok, size_t queue_max, int notify_fd,
                  struct dmetrics *metrics, struct dsched **out, struct dg_error *err);

/* Stop the thread (requests in flight are dropped without events) and free. */
void dsched_destroy(struct dsched *s);

/* Queue a parsed generate request for connection conn, from a client with
 * uid and pid, through source (metrics).  Takes req->ids.
 * *id: the request's id.  Errors: DG_E_RANGE (the prompt and max_tokens,
 * in whole canvases, past max_context: dg_engine_check_fit), DG_E_BUSY
 * (max_batch running and queue_max waiting),
 * DG_E_INVAL (shutting down: the message says so), DG_E_NOMEM. */
int dsched_submit(struct dsched *s, uint64_t conn, struct dproto_request *req, uid_t uid,
                  pid_t pid, enum dg_metrics_source source, uint64_t *id,
                  struct dg_error *err);

/* Cancel request id for a client on connection conn with user id uid: its
 * own requests, any request of the same user, or any request for root.
 * The done line goes to the request's connection.  Returns 0, or
 * -DG_E_INVAL when no such request is in flight for this client. */
int dsched_cancel(struct dsched *s, uint64_t conn, uid_t uid, uint64_t id);

/* The connection is gone: cancel its requests, send it nothing more. */
void dsched_conn_gone(struct dsched *s, uint64_t conn);

/* Move up to max lines out of the outbox; returns how many. */
size_t dsched_take(struct dsched *s, struct dsched_out *out, size_t max);

void dsched_status(struct dsched *s, struct dsched_status *st);

/* How many more requests dsched_submit would take now (0 while shutting
 * down): the front end takes ring jobs only while there is room, so they
 * wait in their ring rather than being refused as busy. */
size_t dsched_room(struct dsched *s);

/* Stop admitting (queued requests end, cancelled); with cancel_running,
 * cancel what is in flight too.  Either way every request gets its done. */
void dsched_shutdown(struct dsched *s, int cancel_running);

/* Nothing queued or in flight, and the outbox empty. */
int dsched_idle(struct dsched *s);

#endif
