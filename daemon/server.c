/* server.c - the io_uring front end: the loop, connections, socket requests,
 * the tokenizing thread's requests, set-up (see server.h for the design;
 * the shared-memory rings are server-ring.c's, the state both share
 * server-state.h's). */
#include "daemon/server.h"
#include "daemon/server-state.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/dlog.h"
#include "daemon/prep.h"
#include "daemon/sdnotify.h"
#include "daemon/send-buffer.h"
#include "daemon/shm-ring.h"
#include "lib/fileio.h"
#include "lib/json-util.h"

#define OUT_BLOCK 65536         /* largest output block */
#define OUT_MIN 4096            /* smallest: a block is sized to the backlog, not always OUT_BLOCK */
#define OUT_TAKE 256            /* outbox lines moved per eventfd wake-up */
#define PREP_TEXT_BYTES 4096    /* a prompt with this much text is tokenized off this thread */
#define REFUSAL_LOG_BURST 10    /* refusals logged at info level in a window; the rest at debug */
#define REFUSAL_LOG_WINDOW_S 10.0
#define REFUSAL_WHAT "refusals"
#define STARVED_LOG_BURST 4     /* lines on accepts short of descriptors a window (the rest debug) */
#define STARVED_LOG_WINDOW_S 60.0
#define STARVED_WHAT "lines on accepts short of descriptors"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* An SQE, flushing the submission queue when it is full. */
struct io_uring_sqe *get_sqe(struct dserver *srv)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&srv->ring);
    if (!sqe) {
        io_uring_submit(&srv->ring);
        sqe = io_uring_get_sqe(&srv->ring);
    }
    if (!sqe) {
        dlog(DG_LOG_ERROR, "io_uring: no submission entry after a flush");
        srv->failed = 1;
    }
    return sqe;
}

/* ---- arming operations ----------------------------------------------------------- */

static void arm_accept(struct dserver *srv)
{
    struct io_uring_sqe *sqe;
    if (srv->accept_armed || srv->listen_fd < 0 || !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_accept(sqe, srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, ud_make(OP_ACCEPT, 0, 0));
    srv->accept_armed = 1;
}

static void arm_event(struct dserver *srv)
{
    struct io_uring_sqe *sqe = get_sqe(srv);
    if (!sqe)
        return;
    io_uring_prep_read(sqe, srv->event_fd, &srv->event_buf, sizeof srv->event_buf, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_EVENT, 0, 0));
}

/* A poll, not a read: signalfd reads the signals of the task that reads
 * it, and io_uring may read from one of its own workers.  The read itself
 * happens here, on this thread (on_signal). */
static void arm_signal(struct dserver *srv)
{
    struct io_uring_sqe *sqe = get_sqe(srv);
    if (!sqe)
        return;
    io_uring_prep_poll_add(sqe, srv->signal_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, ud_make(OP_SIGNAL, 0, 0));
}

/* The end of shutdown_grace, from now (begin_shutdown), on a timeout of
 * its own: the tick's period may be far longer than the grace. */
static void arm_deadline(struct dserver *srv, double seconds)
{
    struct io_uring_sqe *sqe = get_sqe(srv);
    if (!sqe)
        return; /* (the tick still ends it, later) */
    srv->grace_ts.tv_sec = (long long)seconds;
    srv->grace_ts.tv_nsec = (long long)((seconds - (double)(long long)seconds) * 1e9);
    io_uring_prep_timeout(sqe, &srv->grace_ts, 0, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_DEADLINE, 0, 0));
}

/* shutdown_grace is over: the requests still running are cancelled (from
 * the tick or the deadline's own timeout, whichever comes first). */
static void grace_check(struct dserver *srv, double t)
{
    if (srv->phase == DRAINING && t >= srv->deadline) {
        dlog(DG_LOG_INFO, "shutdown grace period over: cancelling the running requests");
        srv->phase = CANCELLING;
        dsched_shutdown(srv->sched, 1);
    }
}

static void arm_tick(struct dserver *srv)
{
    struct io_uring_sqe *sqe = get_sqe(srv);
    if (!sqe)
        return;
    io_uring_prep_timeout(sqe, &srv->tick_ts, 0, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_TICK, 0, 0));
}

/* Whether the client has let enough of its output pile up that the daemon
 * stops taking its requests (it reads nothing more, and frames no more of
 * what it holds, until the client has read some): a quarter of
 * max_output_bytes.  Answers then stop short of the limit, and only what
 * the client's running requests stream can take it past. */
static int backed_up(const struct dserver *srv, const struct conn *c)
{
    return c->out_bytes > srv->o.max_output_bytes / 4;
}

static void arm_recv(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (c->recv_armed || c->read_closed || c->gone || c->prepping || c->held ||
        backed_up(srv, c) || !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_recv(sqe, c->fd, c->chunk, sizeof c->chunk, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_RECV, slot_of(srv, c), c->gen));
    c->recv_armed = 1;
    c->pending++;
}

static void arm_send(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    struct out_block *b = c->head;
    if (c->send_armed || c->gone || !b || !(sqe = get_sqe(srv)))
        return;
    if (b->nfds > 0) {
        /* the block's descriptors ride with its first bytes (SCM_RIGHTS) */
        struct cmsghdr *cm;
        memset(&c->msg, 0, sizeof c->msg);
        memset(&c->cmsg, 0, sizeof c->cmsg);
        c->iov.iov_base = b->data + b->off;
        c->iov.iov_len = b->len - b->off;
        c->msg.msg_iov = &c->iov;
        c->msg.msg_iovlen = 1;
        c->msg.msg_control = c->cmsg.buf;
        c->msg.msg_controllen = CMSG_SPACE((size_t)b->nfds * sizeof(int));
        cm = CMSG_FIRSTHDR(&c->msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)b->nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), b->fds, (size_t)b->nfds * sizeof(int));
        io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
    } else {
        io_uring_prep_send(sqe, c->fd, b->data + b->off, b->len - b->off, MSG_NOSIGNAL);
    }
    io_uring_sqe_set_data64(sqe, ud_make(OP_SEND, slot_of(srv, c), c->gen));
    c->send_armed = 1;
    c->pending++;
}

static void arm_poll(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (c->poll_armed || c->gone || !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_poll_add(sqe, c->fd, POLLHUP | POLLERR);
    io_uring_sqe_set_data64(sqe, ud_make(OP_POLL, slot_of(srv, c), c->gen));
    c->poll_armed = 1;
    c->pending++;
}

/* ---- connection lifetime ----------------------------------------------------------- */

static void block_free(struct out_block *b)
{
    for (int i = 0; i < b->nfds; i++)
        close(b->fds[i]);
    free(b);
}

static void free_output(struct conn *c)
{
    while (c->head) {
        struct out_block *b = c->head;
        c->head = b->next;
        block_free(b);
    }
    c->tail = NULL;
    c->out_bytes = 0;
}

/* Free the slot once nothing of it is in flight. */
static void maybe_release(struct dserver *srv, struct conn *c)
{
    if (!c->gone || c->pending > 0 || !c->in_use)
        return;
    close(c->fd);
    free_output(c);
    if (c->ring) {
        dshm_ring_destroy(c->ring);
        c->ring = NULL;
        srv->rings--;
    }
    c->ring_again = c->ring_stalled = 0;
    free(c->rbuf);
    c->rbuf = NULL;
    c->rlen = c->rcap = 0;
    free(c->held);
    c->held = NULL;
    c->held_len = 0;
    c->in_use = 0;
    c->fd = -1;
    c->gen++;
    srv->n_conns--;
}

/* Tear the connection down: its requests are cancelled, its pending
 * operations complete (shutdown wakes them), then the slot is freed. */
static void conn_gone(struct dserver *srv, struct conn *c, const char *why)
{
    if (c->gone)
        return;
    dlog(c->active ? DG_LOG_INFO : DG_LOG_DEBUG, "conn %u (uid %d): %s%s",
         slot_of(srv, c), (int)c->uid, why,
         c->active ? "; cancelling its requests" : "");
    c->gone = 1;
    if (c->active) {
        dsched_conn_gone(srv->sched, conn_key(srv, c));
        if (c->ring)
            dsched_conn_gone(srv->sched, conn_key(srv, c) | RING_KEY_BIT);
    }
    {
        /* the doorbells' poll, read and write might never end by
         * themselves (the client may have made the eventfds blocking) */
        const enum op_kind bells[3] = {OP_BELL, OP_BELL_READ, OP_CQ_BELL};
        const int armed[3] = {c->bell_armed, c->bell_reading, c->cq_bell_busy};
        for (int i = 0; i < 3; i++) {
            struct io_uring_sqe *sqe = armed[i] ? get_sqe(srv) : NULL;
            if (sqe) {
                io_uring_prep_cancel64(sqe, ud_make(bells[i], slot_of(srv, c), c->gen), 0);
                io_uring_sqe_set_data64(sqe, ud_make(OP_CANCEL, 0, 0));
            }
        }
    }
    shutdown(c->fd, SHUT_RDWR);
    free_output(c);
    maybe_release(srv, c);
}

/* Done with a client that closed its side and has nothing more coming. */
void maybe_finish(struct dserver *srv, struct conn *c)
{
    if (!c->gone && c->read_closed && c->active == 0 && !c->prepping && !c->held && !c->head)
        conn_gone(srv, c, "closed");
}

/* Give up on a client for lack of memory, telling it so where that cannot
 * tear a line: with nothing of its output sent in part, a fixed error line
 * goes straight to the socket (non-blocking, best effort) before it is
 * closed.  Logged at warning level. */
static void oom_gone(struct dserver *srv, struct conn *c, const char *why)
{
    static const char line[] = "{\"v\":1,\"event\":\"error\",\"id\":null,\"code\":"
                               "\"internal\",\"message\":\"out of memory: the daemon closed "
                               "this connection\"}\n";
    if (c->gone)
        return;
    dlog(DG_LOG_WARN, "conn %u (uid %d): %s: closing it", slot_of(srv, c), (int)c->uid, why);
    if (!c->send_armed && (!c->head || c->head->off == 0)) {
        ssize_t w = send(c->fd, line, sizeof line - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
    }
    conn_gone(srv, c, why);
}

/* Queue bytes for the client.  The client is dropped as too slow when
 * what it had left unread before these bytes is past max_output_bytes:
 * one line bigger than the limit (a long result's done line) goes to a
 * client that keeps up. */
static void conn_write(struct dserver *srv, struct conn *c, const char *p, size_t n)
{
    const size_t unread = c->out_bytes;
    if (c->gone)
        return;
    while (n > 0) {
        struct out_block *b = c->tail;
        size_t take;
        /* the block being sent must not change under the kernel's feet */
        if (!b || b->len == b->cap || (c->send_armed && b == c->head)) {
            /* sized to what waits (a line, or a backlog), not a fixed
             * OUT_BLOCK: a thousand connections with a line each must not
             * pin a thousand mostly empty 64 KiB blocks */
            size_t cap = c->out_bytes + n;
            cap = cap < OUT_MIN ? OUT_MIN : cap > OUT_BLOCK ? OUT_BLOCK : cap;
            b = malloc(sizeof *b + cap);
            if (!b) {
                oom_gone(srv, c, "out of memory for its output");
                return;
            }
            b->next = NULL;
            b->len = b->off = 0;
            b->cap = cap;
            b->nfds = 0;
            if (c->tail)
                c->tail->next = b;
            else
                c->head = b;
            c->tail = b;
        }
        take = b->cap - b->len < n ? b->cap - b->len : n;
        memcpy(b->data + b->len, p, take);
        b->len += take;
        c->out_bytes += take;
        p += take;
        n -= take;
    }
    if (unread > srv->o.max_output_bytes) {
        dlog(DG_LOG_WARN, "conn %u (uid %d): %zu bytes unread (max_output_bytes %zu): the "
             "client is too slow", slot_of(srv, c), (int)c->uid, unread,
             srv->o.max_output_bytes);
        conn_gone(srv, c, "dropped");
        return;
    }
    arm_send(srv, c);
}

/* Queue a line with descriptors (taken: closed once sent or dropped). */
void conn_write_fds(struct dserver *srv, struct conn *c, const char *p, size_t n,
                    const int *fds, int nfds)
{
    struct out_block *b = NULL;
    if (!c->gone && n <= OUT_BLOCK)
        b = malloc(sizeof *b + n);
    if (!b) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (!c->gone)
            conn_gone(srv, c, "out of memory for its output");
        return;
    }
    b->next = NULL;
    b->len = b->cap = n;
    b->off = 0;
    b->nfds = nfds;
    memcpy(b->fds, fds, (size_t)nfds * sizeof *fds);
    memcpy(b->data, p, n);
    if (c->tail)
        c->tail->next = b;
    else
        c->head = b;
    c->tail = b;
    c->out_bytes += n;
    arm_send(srv, c);
}

/* Queue a formatted reply and free it.  line NULL (formatting ran out of
 * memory): the client gets an internal error with tag instead, and if even
 * that cannot be made it loses the connection (oom_gone), never silence. */
static void write_line(struct dserver *srv, struct conn *c, char *line, size_t len,
                       const char *tag)
{
    if (!line) {
        dlog(DG_LOG_ERROR, "conn %u: out of memory formatting a reply", slot_of(srv, c));
        line = dproto_error_line(0, tag, "internal", "out of memory formatting the reply", &len);
        if (!line) {
            oom_gone(srv, c, "out of memory for a reply");
            return;
        }
    }
    conn_write(srv, c, line, len);
    free(line);
}

/* A limit's count of lines held back (what names them), logged once at
 * info level; nothing when held is 0. */
static void log_held(const struct dlog_limit *l, const char *what, unsigned long long held)
{
    if (held)
        dlog(DG_LOG_INFO, "%llu more %s in the %.0f s before were logged at debug level only",
             held, what, l->window);
}

void log_refusal(struct dserver *srv, const struct conn *c, const char *what, const char *code,
                 const char *msg)
{
    unsigned long long held;
    const int info = dlog_limit_take(&srv->refusals, now_s(), &held);
    log_held(&srv->refusals, REFUSAL_WHAT, held);
    dlog(info ? DG_LOG_INFO : DG_LOG_DEBUG, "conn %u uid=%d: %srefused: %s: %s", slot_of(srv, c),
         (int)c->uid, what, code, msg);
}

void send_error(struct dserver *srv, struct conn *c, uint64_t id, const char *tag,
                       const char *code, const char *msg)
{
    size_t len = 0;
    char *line = dproto_error_line(id, tag, code, msg, &len);
    log_refusal(srv, c, "", code, msg);
    if (!line) {
        oom_gone(srv, c, "out of memory for an error reply");
        return;
    }
    conn_write(srv, c, line, len);
    free(line);
}

/* ---- requests ----------------------------------------------------------------------- */

/* A generate request refused before it had an id, for the metrics. */
void record_refusal(struct dserver *srv, const struct conn *c, const char *tag,
                    enum dg_metrics_source source, size_t prompt_tokens, const char *code,
                    const char *msg)
{
    struct dg_metrics_request row;
    if (!srv->o.metrics)
        return;
    memset(&row, 0, sizeof row);
    row.tag = tag;
    row.uid = (int64_t)c->uid;
    row.pid = (int64_t)c->pid;
    row.source = source;
    row.submitted = row.finished = dmetrics_now();
    row.prompt_tokens = (int64_t)prompt_tokens;
    row.ttfc_ms = -1;
    row.finish = "rejected";
    row.error_code = code;
    row.error = msg;
    dmetrics_request(srv->o.metrics, &row);
}

static void send_status(struct dserver *srv, struct conn *c, const char *tag)
{
    struct dsched_status st;
    json_t *o;
    size_t len = 0;

    dsched_status(srv->sched, &st);
    o = json_deep_copy(srv->o.info);
    if (!o || (tag && json_object_set_new(o, "tag", json_string(tag))) ||
        json_object_set_new(o, "queued", json_integer((json_int_t)st.queued)) ||
        json_object_set_new(o, "running", json_integer((json_int_t)st.running)) ||
        json_object_set_new(o, "connections", json_integer(srv->n_conns)) ||
        json_object_set_new(o, "accepted", json_integer((json_int_t)st.accepted)) ||
        json_object_set_new(o, "finished", json_integer((json_int_t)st.finished)) ||
        json_object_set_new(o, "cancelled", json_integer((json_int_t)st.cancelled)) ||
        json_object_set_new(o, "failed", json_integer((json_int_t)st.failed)) ||
        json_object_set_new(o, "completion_tokens", json_integer((json_int_t)st.completion_tokens)) ||
        json_object_set_new(o, "decoder_steps", json_integer((json_int_t)st.decoder_steps)) ||
        json_object_set_new(o, "engine_steps", json_integer((json_int_t)st.engine_steps)) ||
        json_object_set_new(o, "uptime_s", json_real(now_s() - srv->started)) ||
        json_object_set_new(o, "rings", json_integer(srv->rings)) ||
        json_object_set_new(o, "tokenizing", json_integer(srv->prepping)) ||
        json_object_set_new(o, "shutting_down", json_boolean(srv->phase != RUNNING))) {
        json_decref(o);
        send_error(srv, c, 0, tag, "internal", "out of memory");
        return;
    }
    if (srv->o.metrics) {
        struct dmetrics_counters mc;
        json_t *m;
        dmetrics_counters(srv->o.metrics, &mc);
        m = json_pack("{s:I,s:I,s:I,s:I,s:I,s:s,s:f,s:b}", "queued", (json_int_t)mc.held,
                      "requests_written", (json_int_t)mc.requests, "events_written",
                      (json_int_t)mc.events, "lost", (json_int_t)mc.lost, "retries",
                      (json_int_t)mc.retries, "last_error", mc.last_error, "last_error_at",
                      mc.last_error_at, "failing", mc.failing);
        if (!m || json_object_set_new(o, "metrics", m)) {
            json_decref(o);
            send_error(srv, c, 0, tag, "internal", "out of memory");
            return;
        }
    }
    {
        char *line = dproto_event_obj("status", o, &len);
        write_line(srv, c, line, len, tag);
    }
}

/* Whether a generate request from the socket is refused before anything
 * else is done for it (the daemon shutting down; the connection at
 * client_max_requests): 1 with the error sent, else 0. */
static int generate_refused(struct dserver *srv, struct conn *c,
                            const struct dproto_request *req)
{
    const char *tag = req->has_tag ? req->tag : NULL;
    const enum dg_metrics_source source = req->batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET;
    if (srv->phase != RUNNING) {
        record_refusal(srv, c, tag, source, req->n_ids, "shutting_down",
                       "the daemon is shutting down");
        send_error(srv, c, 0, tag, "shutting_down", "the daemon is shutting down");
        return 1;
    }
    if (c->active >= srv->o.client_max_requests) {
        char msg[160];
        snprintf(msg, sizeof msg, "this connection has %d requests in flight "
                 "(client_max_requests)", c->active);
        record_refusal(srv, c, tag, source, req->n_ids, "busy", msg);
        send_error(srv, c, 0, tag, "busy", msg);
        return 1;
    }
    return 0;
}

/* Hand a socket's generate request, parsed and tokenized, to the scheduler
 * and answer accepted (or refuse it).  req stays the caller's. */
static void submit_generate(struct dserver *srv, struct conn *c, struct dproto_request *req)
{
    const char *tag = req->has_tag ? req->tag : NULL;
    const size_t n_prompt = req->n_ids;
    const struct dg_gen_settings settings = req->settings;
    const enum dg_metrics_source source = req->batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET;
    struct dg_error err = {0};
    uint64_t id = 0;
    size_t alen = 0;
    int rc;

    if (generate_refused(srv, c, req))
        return;
    rc = dsched_submit(srv->sched, conn_key(srv, c), req, c->uid, c->pid, source, &id, &err);
    if (rc < 0) {
        const char *code = rc == -DG_E_BUSY    ? "busy"
                           : rc == -DG_E_RANGE ? "too_large"
                           : rc == -DG_E_INVAL ? "shutting_down"
                                               : "internal";
        record_refusal(srv, c, tag, source, n_prompt, code, err.msg);
        send_error(srv, c, 0, tag, code, err.msg);
        return;
    }
    c->active++;
    dlog(DG_LOG_INFO, "req=%llu conn %u uid=%d pid=%d accepted: %zu prompt tokens, "
         "max_tokens %lld, canvas %d, seed %llu", (unsigned long long)id, slot_of(srv, c),
         (int)c->uid, (int)c->pid, n_prompt, (long long)settings.max_tokens,
         settings.canvas_length, (unsigned long long)settings.seed);
    {
        char *acc = dproto_accepted(id, tag, n_prompt, &settings, &alen);
        if (!acc) {
            /* (a client never told the id must not get its events) */
            dsched_cancel(srv->sched, conn_key(srv, c), c->uid, id);
            send_error(srv, c, id, tag, "internal",
                       "out of memory answering the request; it was cancelled");
        } else {
            write_line(srv, c, acc, alen, tag);
        }
    }
}

/* A socket's request line that failed its parse or its tokenizing: a
 * generate is recorded as refused (from source), the client gets the
 * error with the tag, if one was read. */
static void line_refused(struct dserver *srv, struct conn *c, const struct dproto_error *e,
                         enum dg_metrics_source source)
{
    const char *tag = e->has_tag ? e->tag : NULL;
    if (e->op == DPROTO_GENERATE)
        record_refusal(srv, c, tag, source, 0, e->code, e->message);
    send_error(srv, c, 0, tag, e->code, e->message);
}

static void handle_line(struct dserver *srv, struct conn *c, const char *line, size_t len)
{
    struct dproto_request req;
    struct dproto_error perr;
    const char *tag;

    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return;
    if (dproto_parse(line, len, &srv->pctx_defer, &req, &perr) < 0) {
        line_refused(srv, c, &perr, perr.batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET);
        return;
    }
    tag = req.has_tag ? req.tag : NULL;
    switch (req.op) {
    case DPROTO_GENERATE:
        if (!req.text)
            submit_generate(srv, c, &req);
        else if (!generate_refused(srv, c, &req))
            prep_start(srv, c, &req, NULL); /* (submit_generate when it is back) */
        break;
    case DPROTO_CANCEL:
        if (dsched_cancel(srv->sched, conn_key(srv, c), c->uid, req.target) < 0) {
            char msg[128];
            snprintf(msg, sizeof msg, "request %llu is not in flight for this user",
                     (unsigned long long)req.target);
            send_error(srv, c, req.target, tag, "not_found", msg);
        } else {
            /* acknowledged here; the request's done goes to its own connection */
            size_t clen = 0;
            json_t *o = json_pack("{s:I}", "id", (json_int_t)req.target);
            char *ack;
            if (o && tag)
                json_object_set_new(o, "tag", json_string(tag));
            ack = dproto_event_obj("cancelling", o, &clen);
            write_line(srv, c, ack, clen, tag);
            dlog(DG_LOG_INFO, "req=%llu cancel asked by conn %u uid=%d",
                 (unsigned long long)req.target, slot_of(srv, c), (int)c->uid);
        }
        break;
    case DPROTO_STATUS:
        send_status(srv, c, tag);
        break;
    case DPROTO_SHM_ATTACH:
        shm_attach(srv, c, &req, tag);
        break;
    }
    dproto_request_free(&req);
}

/* Keep input that arrives, or was left over, while the connection waits
 * for the tokenizing thread or for the client to read (after what is held
 * already: at most one read's worth, as no read is armed meanwhile). */
static void hold(struct dserver *srv, struct conn *c, const char *p, size_t n)
{
    char *b = realloc(c->held, c->held_len + n);
    if (!b) {
        oom_gone(srv, c, "out of memory for its input");
        return;
    }
    memcpy(b + c->held_len, p, n);
    c->held = b;
    c->held_len += n;
}

/* Frame the input into lines and handle each; once a line goes to the
 * tokenizing thread, or the answers so far back the connection up
 * (backed_up), the rest is held for input_resume.  One read can hold a
 * thousand short requests: answered all before any is sent, they would
 * take a client that reads at once past max_output_bytes. */
static void consume(struct dserver *srv, struct conn *c, const char *p, size_t n)
{
    while (n > 0 && !c->gone) {
        const char *nl = memchr(p, '\n', n);
        const size_t upto = nl ? (size_t)(nl - p) : n;
        if (c->prepping || backed_up(srv, c)) {
            hold(srv, c, p, n);
            return;
        }
        if (c->discarding) {
            if (nl)
                c->discarding = 0;
        } else if (c->rlen + upto > srv->o.max_line_bytes) {
            char msg[160];
            snprintf(msg, sizeof msg, "a request line is longer than %zu bytes (max_line_bytes)",
                     srv->o.max_line_bytes);
            send_error(srv, c, 0, NULL, "too_large", msg);
            c->rlen = 0;
            c->discarding = !nl;
        } else {
            if (c->rlen + upto > c->rcap) {
                size_t cap = c->rcap ? c->rcap : 4096;
                char *b;
                while (cap < c->rlen + upto)
                    cap *= 2;
                b = realloc(c->rbuf, cap);
                if (!b) {
                    oom_gone(srv, c, "out of memory for its input");
                    return;
                }
                c->rbuf = b;
                c->rcap = cap;
            }
            memcpy(c->rbuf + c->rlen, p, upto);
            c->rlen += upto;
            if (nl) {
                handle_line(srv, c, c->rbuf, c->rlen);
                c->rlen = 0;
            }
        }
        p += upto + (nl ? 1 : 0);
        n -= upto + (nl ? 1 : 0);
    }
}

/* ---- the tokenizing thread's requests ----------------------------------------------- */

/* Hand req to the tokenizing thread (it is taken: *req is left empty),
 * for the socket's line or, with job, the ring's job.  The connection's
 * input and ring wait until it is back (drain_prep). */
void prep_start(struct dserver *srv, struct conn *c, struct dproto_request *req,
                const struct dshm_job *job)
{
    struct dprep_job *j = calloc(1, sizeof *j);
    if (!j) {
        static const char msg[] = "out of memory for the request";
        if (job) {
            ring_refuse(srv, c, job, DG_SHM_ERR_INTERNAL, msg, 0);
        } else {
            const char *tag = req->has_tag ? req->tag : NULL;
            record_refusal(srv, c, tag, req->batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET, 0,
                           "internal", msg);
            send_error(srv, c, 0, tag, "internal", msg);
        }
        return;
    }
    j->slot = slot_of(srv, c);
    j->gen = c->gen;
    if (job) {
        j->ring = 1;
        j->ring_slot = job->slot;
        j->user_data = job->user_data;
        j->batch = job->batch;
    }
    j->req = *req;
    memset(req, 0, sizeof *req);
    if (job)
        dlog(DG_LOG_DEBUG, "conn %u: ring job %llu: a long text, to the tokenizing thread",
             slot_of(srv, c), (unsigned long long)job->user_data);
    else
        dlog(DG_LOG_DEBUG, "conn %u: a long text, to the tokenizing thread", slot_of(srv, c));
    c->prepping = 1;
    c->pending++; /* (the slot stays this connection's until the job is back) */
    srv->prepping++;
    dprep_submit(srv->prep, j);
}

/* Frame the input held while the connection waited (which may hold it
 * again), unless it still waits; then read on. */
static void input_resume(struct dserver *srv, struct conn *c)
{
    char *held = c->held;
    const size_t n = c->held_len;
    if (c->gone || c->prepping || backed_up(srv, c))
        return;
    c->held = NULL;
    c->held_len = 0;
    if (held)
        consume(srv, c, held, n);
    free(held);
    arm_recv(srv, c);
}

/* The connection's request is back: frame the input held meanwhile, read
 * on, and look at its ring. */
static void prep_resume(struct dserver *srv, struct conn *c)
{
    input_resume(srv, c);
    if (c->gone || c->prepping)
        return;
    if (c->ring)
        c->ring_again = 1;
    maybe_finish(srv, c);
}

/* Requests back from the tokenizing thread: each admitted or refused as it
 * would have been at once, then its connection resumed. */
static void drain_prep(struct dserver *srv)
{
    struct dprep_job *j;
    while ((j = dprep_take(srv->prep)) != NULL) {
        struct conn *c = &srv->conns[j->slot];
        srv->prepping--;
        c->pending--;
        c->prepping = 0;
        if (!c->gone) {
            const struct dproto_error *e = &j->perr;
            if (j->ring) {
                struct dshm_job rj;
                memset(&rj, 0, sizeof rj);
                rj.slot = j->ring_slot;
                rj.user_data = j->user_data;
                rj.batch = j->batch;
                if (!c->ring || dshm_ring_broken(c->ring)) {
                    /* the ring broke meanwhile: its jobs went with it */
                } else if (j->rc < 0) {
                    ring_refuse(srv, c, &rj, shm_status_of(e->code), e->message, 0);
                } else {
                    ring_submit(srv, c, &rj, &j->req);
                }
            } else if (j->rc < 0) {
                line_refused(srv, c, e, j->req.batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET);
            } else {
                submit_generate(srv, c, &j->req);
            }
            prep_resume(srv, c);
        }
        dproto_request_free(&j->req);
        free(j);
        maybe_release(srv, c);
    }
}

/* ---- completions ------------------------------------------------------------------------ */

static struct conn *conn_of(struct dserver *srv, uint64_t ud)
{
    const uint32_t slot = ud_slot(ud);
    struct conn *c;
    if ((int)slot >= srv->o.max_connections)
        return NULL;
    c = &srv->conns[slot];
    return c->in_use && c->gen == ud_gen(ud) ? c : NULL;
}

/* Read and drop what a refused client sent, without waiting: 1 once it
 * has closed its side (or the socket failed), 0 while it may send more. */
static int drain_refused(int fd)
{
    for (size_t drained = 0; drained < (256u << 10);) {
        char sink[4096];
        const ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r == 0)
            return 1;
        if (r < 0)
            return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        drained += (size_t)r;
    }
    return 0;
}

/* Turn away a just-accepted client, then accept again: the reason as one
 * error line, sent without blocking (best effort); our side shut for
 * writing (the client reads the line, then the end); the socket kept for
 * reading until the client closes or LINGER_S passes (linger_sweep).
 * Closed at once with its input unread, a UNIX socket resets its peer, and
 * a client that wrote its request first saw only the reset, or EPIPE,
 * never the line.  Past LINGER_MAX such sockets, closed at once. */
static void refuse_at_accept(struct dserver *srv, int fd, const char *code, const char *msg)
{
    size_t len = 0;
    char *line = dproto_error_line(0, NULL, code, msg, &len);
    if (line) {
        ssize_t w = send(fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)w;
        free(line);
    }
    shutdown(fd, SHUT_WR);
    if (drain_refused(fd) || srv->n_linger == LINGER_MAX) {
        close(fd);
    } else {
        srv->linger[srv->n_linger].fd = fd;
        srv->linger[srv->n_linger].until = now_s() + LINGER_S;
        srv->n_linger++;
    }
    arm_accept(srv);
}

/* The refused sockets kept by refuse_at_accept: each read (and dropped),
 * closed once its client has closed, or at its time. */
static void linger_sweep(struct dserver *srv, double t)
{
    for (int i = 0; i < srv->n_linger;)
        if (drain_refused(srv->linger[i].fd) || t >= srv->linger[i].until) {
            close(srv->linger[i].fd);
            srv->linger[i] = srv->linger[--srv->n_linger];
        } else {
            i++;
        }
}

/* The level for a line on accepts short of descriptors: level while the
 * window allows one, else debug (a limit near the connections' count
 * would otherwise log two lines a connection). */
static enum dg_log_level starved_log_level(struct dserver *srv, enum dg_log_level level)
{
    unsigned long long held;
    const int ok = dlog_limit_take(&srv->starved_log, now_s(), &held);
    log_held(&srv->starved_log, STARVED_WHAT, held);
    return ok ? level : DG_LOG_DEBUG;
}

static void on_accept(struct dserver *srv, int res)
{
    struct conn *c = NULL;
    struct ucred cred;
    socklen_t clen = sizeof cred;

    srv->accept_armed = 0;
    if (res == -EMFILE || res == -ENFILE) {
        /* retried at the next tick; the clients wait in the backlog */
        if (srv->accept_starved++ == 0) {
            srv->accept_starved_since = now_s();
            dlog(starved_log_level(srv, DG_LOG_WARN), "accept: %s: new connections wait in "
                 "the socket's backlog, tried again every tick, until a descriptor is free "
                 "(%d connections open; the limit: RLIMIT_NOFILE, LimitNOFILE= in a unit)",
                 strerror(-res), srv->n_conns);
        }
        return;
    }
    if (res < 0) {
        if (res != -ECANCELED && res != -EBADF && res != -EINVAL)
            dlog(DG_LOG_WARN, "accept: %s", strerror(-res));
        arm_accept(srv);
        return;
    }
    if (srv->accept_starved) {
        dlog(starved_log_level(srv, DG_LOG_INFO), "accept works again after %.1f s (%llu "
             "%s failed for want of a descriptor)", now_s() - srv->accept_starved_since,
             srv->accept_starved, srv->accept_starved == 1 ? "try" : "tries");
        srv->accept_starved = 0;
    }
    for (int i = 0; i < srv->o.max_connections && !c; i++)
        if (!srv->conns[i].in_use)
            c = &srv->conns[i];
    if (!c || srv->phase != RUNNING) {
        if (!c)
            dlog(DG_LOG_WARN, "refused a connection: %d open (max_connections)", srv->n_conns);
        refuse_at_accept(srv, res, c ? "shutting_down" : "busy",
                         c ? "the daemon is shutting down"
                           : "too many connections (max_connections)");
        return;
    }
    memset(&cred, 0, sizeof cred);
    if (getsockopt(res, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
        cred.uid = (uid_t)-1, cred.gid = (gid_t)-1, cred.pid = 0;
    {
        char why[160];
        if (!daccess_peer_allowed(&srv->o.access, res, &cred, why, sizeof why)) {
            dlog(DG_LOG_WARN, "refused a connection from uid %d gid %d pid %d: not in "
                 "allow_uids or allow_gids", (int)cred.uid, (int)cred.gid, (int)cred.pid);
            refuse_at_accept(srv, res, "forbidden", why);
            return;
        }
    }
    if (srv->o.send_buffer_bytes > 0) {
        const int e = dsend_buffer_set(res, srv->o.send_buffer_bytes);
        if (e != 0) /* (served with the system's size, as without the option) */
            dlog(DG_LOG_WARN, "conn %u: send_buffer_bytes %d: SO_SNDBUF: %s", slot_of(srv, c),
                 srv->o.send_buffer_bytes, strerror(-e));
    }
    c->in_use = 1;
    c->fd = res;
    c->pending = 0;
    c->recv_armed = c->send_armed = c->poll_armed = 0;
    c->read_closed = c->gone = c->discarding = 0;
    c->rlen = 0;
    c->prepping = 0;
    c->head = c->tail = NULL;
    c->out_bytes = 0;
    c->active = 0;
    c->uid = cred.uid;
    c->pid = cred.pid;
    c->ring = NULL;
    c->bell_armed = c->bell_reading = c->cq_bell_busy = c->cq_bell_due = 0;
    c->ring_again = c->ring_stalled = c->ring_active = 0;
    srv->n_conns++;
    dlog(DG_LOG_DEBUG, "conn %u: uid %d pid %d", slot_of(srv, c), (int)c->uid, (int)c->pid);
    arm_recv(srv, c);
    arm_poll(srv, c);
    arm_accept(srv);
}

static void on_recv(struct dserver *srv, struct conn *c, int res)
{
    c->recv_armed = 0;
    if (c->gone)
        return;
    if (res > 0) {
        consume(srv, c, c->chunk, (size_t)res);
        arm_recv(srv, c);
    } else if (res == 0) {
        c->read_closed = 1;
        if (c->discarding || c->rlen)
            dlog(DG_LOG_DEBUG, "conn %u: input ended inside a line", slot_of(srv, c));
        maybe_finish(srv, c);
    } else if (res == -EINTR || res == -EAGAIN) {
        arm_recv(srv, c);
    } else {
        conn_gone(srv, c, strerror(-res));
    }
}

static void on_send(struct dserver *srv, struct conn *c, int res)
{
    c->send_armed = 0;
    if (c->gone)
        return;
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
            arm_send(srv, c);
            return;
        }
        conn_gone(srv, c, strerror(-res));
        return;
    }
    c->head->off += (size_t)res;
    c->out_bytes -= (size_t)res;
    if (res > 0 && c->head->nfds > 0) {
        /* delivered with the first byte: the daemon's copies go */
        for (int i = 0; i < c->head->nfds; i++)
            close(c->head->fds[i]);
        c->head->nfds = 0;
    }
    if (c->head->off == c->head->len) {
        struct out_block *b = c->head;
        c->head = b->next;
        if (!c->head)
            c->tail = NULL;
        block_free(b);
    }
    arm_send(srv, c);
    input_resume(srv, c); /* backpressure may have lifted */
    maybe_finish(srv, c);
}

/* Lines from the scheduler, to their connections. */
static void drain_outbox(struct dserver *srv)
{
    size_t n;
    while ((n = dsched_take(srv->sched, srv->outbox, OUT_TAKE)) > 0)
        for (size_t i = 0; i < n; i++) {
            struct dsched_out *o = &srv->outbox[i];
            const uint32_t slot = (uint32_t)o->conn & ~RING_KEY_BIT;
            const int ring_job = ((uint32_t)o->conn & RING_KEY_BIT) != 0;
            struct conn *c = (int)slot < srv->o.max_connections ? &srv->conns[slot] : NULL;
            if (c && c->in_use && c->gen == (uint32_t)(o->conn >> 32) && !c->gone) {
                if (o->line && ring_job)
                    ring_done(srv, c, o->line, o->len);
                else if (o->line)
                    conn_write(srv, c, o->line, o->len);
                /* a ring job counts in active only while its ring does: a
                 * fault took all of them off at once (ring_fault), and the
                 * end of one already on its way here must not count again */
                if (o->ends_request && (ring_job ? c->ring_active > 0 : c->active > 0)) {
                    c->active--;
                    if (ring_job)
                        c->ring_active--;
                }
                maybe_finish(srv, c);
            }
            free(o->line);
        }
}

/* Remove the socket path if it is still the socket this daemon bound: a
 * daemon started after it may have taken the path (its socket there is
 * not ours to remove). */
static void unlink_own_socket(const struct dserver *srv)
{
    struct stat st;
    if (lstat(srv->socket_path, &st) != 0)
        return;
    if (st.st_dev == srv->socket_dev && st.st_ino == srv->socket_ino)
        unlink(srv->socket_path);
    else
        dlog(DG_LOG_WARN, "socket %s: another socket is there now; left in place",
             srv->socket_path);
}

static void begin_shutdown(struct dserver *srv, const char *why)
{
    srv->signals++;
    if (srv->signals == 1) {
        dlog(DG_LOG_INFO, "%s: shutting down: no new connections or requests; running "
             "requests have %g s", why, srv->o.shutdown_grace);
        sd_notify_send("STOPPING=1\nSTATUS=draining");
        srv->phase = DRAINING;
        srv->deadline = now_s() + srv->o.shutdown_grace;
        if (srv->o.shutdown_grace > 0)
            arm_deadline(srv, srv->o.shutdown_grace);
        if (srv->listen_fd >= 0) {
            struct io_uring_sqe *sqe = get_sqe(srv);
            if (sqe) {
                io_uring_prep_cancel64(sqe, ud_make(OP_ACCEPT, 0, 0), 0);
                io_uring_sqe_set_data64(sqe, ud_make(OP_CANCEL, 0, 0));
            }
            close(srv->listen_fd);
            srv->listen_fd = -1;
            unlink_own_socket(srv);
        }
        dsched_shutdown(srv->sched, srv->o.shutdown_grace <= 0);
        if (srv->o.shutdown_grace <= 0)
            srv->phase = CANCELLING;
    } else if (srv->signals == 2) {
        dlog(DG_LOG_INFO, "%s again: cancelling the running requests now", why);
        srv->phase = CANCELLING;
        dsched_shutdown(srv->sched, 1);
    } else {
        dlog_signal_safe("dgemmad: third signal: exiting at once");
        _exit(1);
    }
}

static void on_signal(struct dserver *srv, int res)
{
    ssize_t n;
    (void)res;
    while ((n = read(srv->signal_fd, &srv->sig_buf, sizeof srv->sig_buf)) ==
           (ssize_t)sizeof srv->sig_buf) {
        const int sig = (int)srv->sig_buf.ssi_signo;
        if (sig == SIGHUP) {
            struct dg_error err = {0};
            if (dlog_reopen(&err) < 0) {
                /* (also where an operator looks when the old log is gone:
                 * standard error, the journal under systemd) */
                dlog(DG_LOG_ERROR, "SIGHUP: %s", err.msg);
                fprintf(stderr, "dgemmad: SIGHUP: %s\n", err.msg);
            } else {
                dlog(DG_LOG_INFO, "SIGHUP: log reopened");
                dmetrics_event(srv->o.metrics, "reload", "SIGHUP: log reopened");
            }
        } else {
            begin_shutdown(srv, sig == SIGTERM ? "SIGTERM" : "SIGINT");
        }
    }
    arm_signal(srv);
}

static int all_flushed(const struct dserver *srv)
{
    for (int i = 0; i < srv->o.max_connections; i++)
        if (srv->conns[i].in_use && !srv->conns[i].gone && srv->conns[i].head)
            return 0;
    return 1;
}

static void on_tick(struct dserver *srv)
{
    const double t = now_s();
    /* every ring, now and then: a client that reaped without ringing (it
     * is allowed to when DG_SHM_NEED_WAKE was not set) is served anyway */
    for (int i = 0; srv->rings > 0 && i < srv->o.max_connections; i++)
        if (srv->conns[i].in_use && srv->conns[i].ring && !srv->conns[i].gone)
            ring_service(srv, &srv->conns[i]);
    if (srv->listen_fd >= 0 && !srv->accept_armed)
        arm_accept(srv);
    linger_sweep(srv, t);
    grace_check(srv, t);
    log_held(&srv->refusals, REFUSAL_WHAT, dlog_limit_due(&srv->refusals, t));
    log_held(&srv->starved_log, STARVED_WHAT, dlog_limit_due(&srv->starved_log, t));
    arm_tick(srv);
}

int dserver_run(struct dserver *srv, struct dg_error *err)
{
    arm_accept(srv);
    arm_event(srv);
    arm_signal(srv);
    arm_tick(srv);
    while (!srv->failed) {
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        int rc;

        if (srv->phase == DRAINING || srv->phase == CANCELLING) {
            /* (a request with the tokenizing thread is still to be answered) */
            if (dsched_idle(srv->sched) && srv->prepping == 0) {
                srv->phase = FLUSHING;
                srv->deadline = now_s() + 2.0;
            }
        }
        if (srv->phase == FLUSHING && (all_flushed(srv) || now_s() >= srv->deadline))
            break;
        /* rings with submissions left over from the last turn: do not sleep */
        rc = io_uring_submit_and_wait(&srv->ring, rings_turn(srv, 0) ? 0 : 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
            return dg_error_set(err, DG_E_IO, "io_uring: %s", strerror(-rc));
        io_uring_for_each_cqe(&srv->ring, head, cqe) {
            const uint64_t ud = io_uring_cqe_get_data64(cqe);
            const int res = cqe->res;
            struct conn *c;
            seen++;
            switch (ud_kind(ud)) {
            case OP_ACCEPT:
                on_accept(srv, res);
                break;
            case OP_EVENT:
                drain_outbox(srv);
                drain_prep(srv);
                arm_event(srv);
                rings_turn(srv, 1); /* requests ended: room for waiting ring jobs */
                break;
            case OP_SIGNAL:
                on_signal(srv, res);
                break;
            case OP_TICK:
                on_tick(srv);
                break;
            case OP_DEADLINE:
                grace_check(srv, srv->deadline); /* (its time, by construction) */
                break;
            case OP_CANCEL:
                break;
            case OP_RECV:
            case OP_SEND:
            case OP_POLL:
            case OP_BELL:
            case OP_BELL_READ:
            case OP_CQ_BELL:
                c = conn_of(srv, ud);
                if (!c)
                    break;
                c->pending--;
                if (ud_kind(ud) == OP_BELL)
                    on_bell(srv, c, res);
                else if (ud_kind(ud) == OP_BELL_READ)
                    on_bell_read(srv, c, res);
                else if (ud_kind(ud) == OP_CQ_BELL)
                    on_cq_bell(srv, c, res);
                else if (ud_kind(ud) == OP_RECV)
                    on_recv(srv, c, res);
                else if (ud_kind(ud) == OP_SEND)
                    on_send(srv, c, res);
                else {
                    c->poll_armed = 0;
                    if (!c->gone && res >= 0 && !(res & (POLLHUP | POLLERR))) {
                        /* the client shut its writing side (POLLRDHUP, which the
                         * ring reports unasked): it may still read, so it is not
                         * gone; a later send finds out if it went entirely */
                        dlog(DG_LOG_DEBUG, "conn %u: half-closed by the client", ud_slot(ud));
                    } else if (!c->gone) {
                        conn_gone(srv, c, res < 0 ? strerror(-res) : "hung up");
                    }
                }
                maybe_release(srv, c);
                break;
            }
        }
        io_uring_cq_advance(&srv->ring, seen);
    }
    if (srv->failed)
        return dg_error_set(err, DG_E_IO, "io_uring: the submission queue failed");
    return 0;
}

/* ---- set-up ----------------------------------------------------------------------- */

/* What listen_on and dserver_check_socket both look at: owner and group
 * resolved (uid, gid: -1 for as is), the address filled, and whether
 * something is at path (*exists) and, if so, a daemon answers there
 * (*live).  A socket is stale only where connecting is refused outright
 * (ECONNREFUSED: nothing listens); a full backlog (EAGAIN: the probe does
 * not wait) is a live daemon, and any other failure (EACCES: a daemon of
 * another user) leaves it unknown: an error, the socket untouched.
 * Errors: DG_E_CONFIG (owner, group), DG_E_INVAL (the path is empty, too
 * long, something other than a socket is there, or a socket whose daemon
 * cannot be told alive or not). */
static int socket_target(const char *path, const char *owner, const char *group,
                         struct sockaddr_un *a, uid_t *uid, gid_t *gid, int *exists, int *live,
                         struct dg_error *err)
{
    struct dg_error lookup = {0};
    struct stat st;
    gid_t owner_gid;
    *uid = (uid_t)-1, *gid = (gid_t)-1, *exists = 0, *live = 0;
    if (owner && *owner && daccess_lookup_user(owner, uid, &owner_gid, &lookup) < 0)
        return dg_error_set(err, DG_E_CONFIG, "socket_owner: %s", lookup.msg);
    if (group && *group && daccess_lookup_group(group, gid, &lookup) < 0)
        return dg_error_set(err, DG_E_CONFIG, "socket_group: %s", lookup.msg);
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path || !*path)
        return dg_error_set(err, DG_E_INVAL, "socket %s: path empty or longer than %zu bytes",
                            path, sizeof a->sun_path - 1);
    memcpy(a->sun_path, path, strlen(path) + 1);
    if (lstat(path, &st) == 0) {
        int probe;
        if (!S_ISSOCK(st.st_mode))
            return dg_error_set(err, DG_E_INVAL, "socket %s: the path exists and is not a "
                                "socket; not touching it", path);
        *exists = 1;
        probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (probe < 0)
            return dg_error_set(err, DG_E_IO, "socket: %s", strerror(errno));
        if (connect(probe, (struct sockaddr *)a, sizeof *a) == 0 || errno == EAGAIN ||
            errno == EINPROGRESS) {
            *live = 1;
        } else if (errno == ENOENT) {
            *exists = 0; /* (gone meanwhile) */
        } else if (errno != ECONNREFUSED) {
            const int e = errno;
            close(probe);
            return dg_error_set(err, DG_E_INVAL, "socket %s: cannot tell whether a daemon "
                                "serves it (connect: %s); not touching it", path, strerror(e));
        }
        close(probe);
    }
    return 0;
}

int dserver_check_socket(const char *path, const char *owner, const char *group, int *live,
                         struct dg_error *err)
{
    struct sockaddr_un a;
    uid_t uid;
    gid_t gid;
    int exists, rc;
    if ((rc = socket_target(path, owner, group, &a, &uid, &gid, &exists, live, err)) < 0)
        return rc;
    return dg_path_creatable("socket", path, err);
}

/* Bind path: refuse it if a live daemon answers there, replace it if it is
 * a stale socket, refuse anything else that is in the way. */
static int listen_on(const char *path, int mode, const char *owner, const char *group,
                     int backlog, struct stat *bound, struct dg_error *err)
{
    struct sockaddr_un a;
    uid_t uid;
    gid_t gid;
    mode_t old_mask;
    int fd, rc, exists, live;

    if ((rc = socket_target(path, owner, group, &a, &uid, &gid, &exists, &live, err)) < 0)
        return rc;
    if (live)
        return dg_error_set(err, DG_E_INVAL, "socket %s: another dgemmad is serving it", path);
    if (exists) {
        if (unlink(path) != 0)
            return dg_error_set(err, DG_E_IO, "socket %s: cannot remove the stale socket: %s",
                                path, strerror(errno));
        dlog(DG_LOG_INFO, "socket %s: removed a stale socket", path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dg_error_set(err, DG_E_IO, "socket: %s", strerror(errno));
    /* (born owner-only: no client gets in before mode and owner are set) */
    old_mask = umask(0177);
    rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    umask(old_mask);
    if (rc != 0) {
        int e = errno;
        close(fd);
        return dg_error_set(err, DG_E_IO, "socket %s: bind: %s", path, strerror(e));
    }
    if ((uid != (uid_t)-1 || gid != (gid_t)-1) && chown(path, uid, gid) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dg_error_set(err, DG_E_IO, "socket %s: owner %s, group %s: %s", path,
                            owner && *owner ? owner : "(as is)", group && *group ? group
                                                                                 : "(as is)",
                            strerror(e));
    }
    if (chmod(path, (mode_t)mode) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dg_error_set(err, DG_E_IO, "socket %s: chmod %o: %s", path, mode, strerror(e));
    }
    if (listen(fd, backlog) != 0 || lstat(path, bound) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dg_error_set(err, DG_E_IO, "socket %s: listen (or stat): %s", path,
                            strerror(e));
    }
    return fd;
}

int dserver_create(const struct dserver_options *o, struct dsched *s,
                   const struct dproto_ctx *pctx, int event_fd, struct dserver **out,
                   struct dg_error *err)
{
    struct dserver *srv = calloc(1, sizeof *srv);
    struct io_uring_params p;
    sigset_t mask;
    int rc;

    *out = NULL;
    if (!srv)
        return dg_error_set(err, DG_E_NOMEM, "server: out of memory");
    srv->o = *o;
    srv->sched = s;
    srv->pctx = pctx;
    srv->pctx_defer = *pctx;
    srv->pctx_defer.defer_text_bytes = PREP_TEXT_BYTES;
    srv->event_fd = event_fd;
    srv->listen_fd = srv->signal_fd = -1;
    srv->started = now_s();
    srv->refusals.burst = REFUSAL_LOG_BURST;
    srv->refusals.window = REFUSAL_LOG_WINDOW_S;
    srv->starved_log.burst = STARVED_LOG_BURST;
    srv->starved_log.window = STARVED_LOG_WINDOW_S;
    srv->tick_ts.tv_sec = (long long)o->tick;
    srv->tick_ts.tv_nsec = (long long)((o->tick - (double)(long long)o->tick) * 1e9);
    snprintf(srv->socket_path, sizeof srv->socket_path, "%s", o->socket_path);
    srv->conns = calloc((size_t)o->max_connections, sizeof *srv->conns);
    srv->outbox = calloc(OUT_TAKE, sizeof *srv->outbox);
    if (!srv->conns || !srv->outbox) {
        dserver_destroy(srv);
        return dg_error_set(err, DG_E_NOMEM, "server: out of memory for %d connections",
                            o->max_connections);
    }
    for (int i = 0; i < o->max_connections; i++)
        srv->conns[i].fd = -1;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_SINGLE_ISSUER;
    rc = io_uring_queue_init_params(256, &srv->ring, &p);
    if (rc == -EINVAL) {
        dlog(DG_LOG_INFO, "io_uring: no IORING_SETUP_SINGLE_ISSUER here; without it");
        memset(&p, 0, sizeof p);
        rc = io_uring_queue_init_params(256, &srv->ring, &p);
    }
    if (rc < 0) {
        dserver_destroy(srv);
        return dg_error_set(err, DG_E_IO, "io_uring: cannot set up a ring: %s", strerror(-rc));
    }
    srv->ring_ok = 1;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    srv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (srv->signal_fd < 0) {
        int e = errno;
        dserver_destroy(srv);
        return dg_error_set(err, DG_E_IO, "signalfd: %s", strerror(e));
    }
    if (o->send_buffer_bytes > 0) {
        /* what each client socket will get, said once (the kernel takes
         * twice what it is asked where net.core.wmem_max allows it) */
        int got;
        if ((rc = dsend_buffer_probe(o->send_buffer_bytes, &got, err)) < 0) {
            dserver_destroy(srv);
            return rc;
        }
        if (got / 2 < o->send_buffer_bytes)
            dlog(DG_LOG_WARN, "send_buffer_bytes %d: the kernel gives client sockets %d bytes, "
                 "not twice that: net.core.wmem_max holds it", o->send_buffer_bytes, got);
        else
            dlog(DG_LOG_INFO, "client sockets' send buffer: %d bytes (send_buffer_bytes %d)",
                 got, o->send_buffer_bytes);
    }
    {
        struct stat bound;
        rc = listen_on(o->socket_path, o->socket_mode, o->socket_owner, o->socket_group,
                       o->max_connections < 128 ? 128 : o->max_connections, &bound, err);
        if (rc < 0) {
            dserver_destroy(srv);
            return rc;
        }
        srv->listen_fd = rc;
        srv->socket_dev = bound.st_dev;
        srv->socket_ino = bound.st_ino;
    }
    if ((rc = dprep_create(pctx, event_fd, &srv->prep, err)) < 0) {
        dserver_destroy(srv);
        return rc;
    }
    *out = srv;
    return 0;
}

void dserver_socket_file(const struct dserver *srv, dev_t *dev, ino_t *ino)
{
    *dev = srv->socket_dev;
    *ino = srv->socket_ino;
}

void dserver_destroy(struct dserver *srv)
{
    if (!srv)
        return;
    dprep_destroy(srv->prep); /* (before the connections: its jobs name them) */
    for (int i = 0; i < srv->n_linger; i++)
        close(srv->linger[i].fd);
    for (int i = 0; srv->conns && i < srv->o.max_connections; i++) {
        struct conn *c = &srv->conns[i];
        if (c->in_use) {
            close(c->fd);
            free_output(c);
            free(c->rbuf);
            free(c->held);
            dshm_ring_destroy(c->ring);
        }
    }
    if (srv->listen_fd >= 0) {
        close(srv->listen_fd);
        unlink_own_socket(srv);
    }
    if (srv->signal_fd >= 0)
        close(srv->signal_fd);
    if (srv->ring_ok)
        io_uring_queue_exit(&srv->ring);
    free(srv->conns);
    free(srv->outbox);
    free(srv);
}
