/* server.c - the io_uring front end (see server.h for the design). */
#include "daemon/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon/dlog.h"

#define RECV_CHUNK 65536
#define OUT_BLOCK 65536
#define OUT_TAKE 256            /* outbox lines moved per eventfd wake-up */

/* ---- completion identity ------------------------------------------------------ */

enum op_kind { OP_ACCEPT = 1, OP_RECV, OP_SEND, OP_POLL, OP_EVENT, OP_SIGNAL, OP_TICK, OP_CANCEL };

static uint64_t ud_make(enum op_kind k, uint32_t slot, uint32_t gen)
{
    return ((uint64_t)k << 56) | ((uint64_t)(slot & 0xffffffu) << 32) | gen;
}

static enum op_kind ud_kind(uint64_t ud)
{
    return (enum op_kind)(ud >> 56);
}

static uint32_t ud_slot(uint64_t ud)
{
    return (uint32_t)(ud >> 32) & 0xffffffu;
}

static uint32_t ud_gen(uint64_t ud)
{
    return (uint32_t)ud;
}

/* ---- connections ------------------------------------------------------------- */

struct out_block {
    struct out_block *next;
    size_t len, off;           /* bytes held, bytes already sent */
    char data[OUT_BLOCK];
};

struct conn {
    int in_use, fd;
    uint32_t gen;
    int pending;               /* operations in flight */
    int recv_armed, send_armed, poll_armed;
    int read_closed;           /* EOF from the client: it reads, it will not write */
    int gone;                  /* torn down; the slot frees when pending reaches 0 */
    int discarding;            /* skipping the rest of an oversize line */
    char *rbuf;                /* unframed input */
    size_t rlen, rcap;
    char chunk[RECV_CHUNK];
    struct out_block *head, *tail;
    size_t out_bytes;          /* unsent */
    int active;                /* requests accepted and not yet done */
    uid_t uid;
    pid_t pid;
};

enum phase { RUNNING = 0, DRAINING, CANCELLING, FLUSHING };

struct dserver {
    struct dserver_options o;
    struct dsched *sched;
    const struct dproto_ctx *pctx;
    struct io_uring ring;
    int ring_ok;
    int listen_fd, event_fd, signal_fd;
    int accept_armed;
    uint64_t event_buf;
    struct signalfd_siginfo sig_buf;
    struct __kernel_timespec tick_ts;
    struct conn *conns;
    int n_conns;               /* slots in use */
    enum phase phase;
    int signals;               /* SIGTERM / SIGINT seen */
    double deadline;           /* DRAINING: cancel at; FLUSHING: give up at */
    double started;
    int failed;
    struct dsched_out *outbox;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t conn_key(const struct dserver *srv, const struct conn *c)
{
    return ((uint64_t)c->gen << 32) | (uint32_t)(c - srv->conns);
}

/* An SQE, flushing the submission queue when it is full. */
static struct io_uring_sqe *get_sqe(struct dserver *srv)
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

static void arm_tick(struct dserver *srv)
{
    struct io_uring_sqe *sqe = get_sqe(srv);
    if (!sqe)
        return;
    io_uring_prep_timeout(sqe, &srv->tick_ts, 0, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_TICK, 0, 0));
}

static uint32_t slot_of(const struct dserver *srv, const struct conn *c)
{
    return (uint32_t)(c - srv->conns);
}

static void arm_recv(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (c->recv_armed || c->read_closed || c->gone ||
        c->out_bytes > srv->o.max_output_bytes / 4 || !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_recv(sqe, c->fd, c->chunk, sizeof c->chunk, 0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_RECV, slot_of(srv, c), c->gen));
    c->recv_armed = 1;
    c->pending++;
}

static void arm_send(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (c->send_armed || c->gone || !c->head || !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_send(sqe, c->fd, c->head->data + c->head->off, c->head->len - c->head->off,
                       MSG_NOSIGNAL);
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

static void free_output(struct conn *c)
{
    while (c->head) {
        struct out_block *b = c->head;
        c->head = b->next;
        free(b);
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
    free(c->rbuf);
    c->rbuf = NULL;
    c->rlen = c->rcap = 0;
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
    if (c->active)
        dsched_conn_gone(srv->sched, conn_key(srv, c));
    shutdown(c->fd, SHUT_RDWR);
    free_output(c);
    maybe_release(srv, c);
}

/* Done with a client that closed its side and has nothing more coming. */
static void maybe_finish(struct dserver *srv, struct conn *c)
{
    if (!c->gone && c->read_closed && c->active == 0 && !c->head)
        conn_gone(srv, c, "closed");
}

/* Queue bytes for the client. */
static void conn_write(struct dserver *srv, struct conn *c, const char *p, size_t n)
{
    if (c->gone)
        return;
    while (n > 0) {
        struct out_block *b = c->tail;
        size_t take;
        /* the block being sent must not change under the kernel's feet */
        if (!b || b->len == OUT_BLOCK || (c->send_armed && b == c->head)) {
            b = malloc(sizeof *b);
            if (!b) {
                conn_gone(srv, c, "out of memory for its output");
                return;
            }
            b->next = NULL;
            b->len = b->off = 0;
            if (c->tail)
                c->tail->next = b;
            else
                c->head = b;
            c->tail = b;
        }
        take = OUT_BLOCK - b->len < n ? OUT_BLOCK - b->len : n;
        memcpy(b->data + b->len, p, take);
        b->len += take;
        c->out_bytes += take;
        p += take;
        n -= take;
    }
    if (c->out_bytes > srv->o.max_output_bytes) {
        dlog(DG_LOG_WARN, "conn %u (uid %d): %zu bytes unread (max_output_bytes %zu): the "
             "client is too slow", slot_of(srv, c), (int)c->uid, c->out_bytes,
             srv->o.max_output_bytes);
        conn_gone(srv, c, "dropped");
        return;
    }
    arm_send(srv, c);
}

static void write_line(struct dserver *srv, struct conn *c, char *line, size_t len)
{
    if (!line) {
        dlog(DG_LOG_ERROR, "conn %u: out of memory formatting a reply", slot_of(srv, c));
        return;
    }
    conn_write(srv, c, line, len);
    free(line);
}

static void send_error(struct dserver *srv, struct conn *c, uint64_t id, const char *tag,
                       const char *code, const char *msg)
{
    size_t len = 0;
    char *line = dproto_error_line(id, tag, code, msg, &len);
    dlog(DG_LOG_DEBUG, "conn %u: error %s: %s", slot_of(srv, c), code, msg);
    write_line(srv, c, line, len);
}

/* ---- requests ----------------------------------------------------------------------- */

/* A generate request refused before it had an id, for the metrics. */
static void record_refusal(struct dserver *srv, const struct conn *c, const char *tag,
                           int batch, size_t prompt_tokens, const char *code, const char *msg)
{
    struct dg_metrics_request row;
    if (!srv->o.metrics)
        return;
    memset(&row, 0, sizeof row);
    row.tag = tag;
    row.uid = (int64_t)c->uid;
    row.pid = (int64_t)c->pid;
    row.source = batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET;
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
        json_object_set_new(o, "shutting_down", json_boolean(srv->phase != RUNNING))) {
        json_decref(o);
        send_error(srv, c, 0, tag, "internal", "out of memory");
        return;
    }
    if (srv->o.metrics) {
        struct dmetrics_counters mc;
        json_t *m;
        dmetrics_counters(srv->o.metrics, &mc);
        m = json_pack("{s:I,s:I,s:I,s:I,s:I,s:s}", "queued", (json_int_t)mc.held,
                      "requests_written", (json_int_t)mc.requests, "events_written",
                      (json_int_t)mc.events, "lost", (json_int_t)mc.lost, "retries",
                      (json_int_t)mc.retries, "last_error", mc.last_error);
        if (!m || json_object_set_new(o, "metrics", m)) {
            json_decref(o);
            send_error(srv, c, 0, tag, "internal", "out of memory");
            return;
        }
    }
    {
        char *line = dproto_event_obj("status", o, &len);
        write_line(srv, c, line, len);
    }
}

static void handle_line(struct dserver *srv, struct conn *c, const char *line, size_t len)
{
    struct dproto_request req;
    struct dproto_error perr;
    struct dg_error err = {0};
    const char *tag;

    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return;
    if (dproto_parse(line, len, srv->pctx, &req, &perr) < 0) {
        if (perr.op == DPROTO_GENERATE)
            record_refusal(srv, c, perr.has_tag ? perr.tag : NULL, 0, 0, perr.code,
                           perr.message);
        send_error(srv, c, 0, perr.has_tag ? perr.tag : NULL, perr.code, perr.message);
        return;
    }
    tag = req.has_tag ? req.tag : NULL;
    switch (req.op) {
    case DPROTO_GENERATE: {
        const size_t n_prompt = req.n_ids;
        const struct dg_gen_settings settings = req.settings;
        uint64_t id = 0;
        size_t alen = 0;
        int rc;
        const int batch = req.batch;
        if (srv->phase != RUNNING) {
            record_refusal(srv, c, tag, batch, n_prompt, "shutting_down",
                           "the daemon is shutting down");
            send_error(srv, c, 0, tag, "shutting_down", "the daemon is shutting down");
            break;
        }
        rc = dsched_submit(srv->sched, conn_key(srv, c), &req, c->uid, c->pid,
                           batch ? DG_SOURCE_BATCH : DG_SOURCE_SOCKET, &id, &err);
        if (rc < 0) {
            const char *code = rc == -DG_E_BUSY    ? "busy"
                               : rc == -DG_E_INVAL ? "shutting_down"
                                                   : "internal";
            record_refusal(srv, c, tag, batch, n_prompt, code, err.msg);
            send_error(srv, c, 0, tag, code, err.msg);
            break;
        }
        c->active++;
        dlog(DG_LOG_INFO, "req=%llu conn %u uid=%d pid=%d accepted: %zu prompt tokens, "
             "max_tokens %lld, canvas %d, seed %llu", (unsigned long long)id, slot_of(srv, c),
             (int)c->uid, (int)c->pid, n_prompt, (long long)settings.max_tokens,
             settings.canvas_length, (unsigned long long)settings.seed);
        {
            char *acc = dproto_accepted(id, tag, n_prompt, &settings, &alen);
            write_line(srv, c, acc, alen);
        }
        break;
    }
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
            write_line(srv, c, ack, clen);
            dlog(DG_LOG_INFO, "req=%llu cancel asked by conn %u uid=%d",
                 (unsigned long long)req.target, slot_of(srv, c), (int)c->uid);
        }
        break;
    case DPROTO_STATUS:
        send_status(srv, c, tag);
        break;
    }
    dproto_request_free(&req);
}

/* Frame the input into lines and handle each. */
static void consume(struct dserver *srv, struct conn *c, const char *p, size_t n)
{
    while (n > 0 && !c->gone) {
        const char *nl = memchr(p, '\n', n);
        const size_t upto = nl ? (size_t)(nl - p) : n;
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
                    conn_gone(srv, c, "out of memory for its input");
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

static void on_accept(struct dserver *srv, int res)
{
    struct conn *c = NULL;
    struct ucred cred;
    socklen_t clen = sizeof cred;

    srv->accept_armed = 0;
    if (res < 0) {
        if (res != -ECANCELED && res != -EBADF && res != -EINVAL)
            dlog(DG_LOG_WARN, "accept: %s", strerror(-res));
        if (res == -EMFILE || res == -ENFILE)
            return; /* retried at the next tick */
        arm_accept(srv);
        return;
    }
    for (int i = 0; i < srv->o.max_connections && !c; i++)
        if (!srv->conns[i].in_use)
            c = &srv->conns[i];
    if (!c || srv->phase != RUNNING) {
        /* best effort, without blocking: the reason, then close */
        size_t len = 0;
        char *line = dproto_error_line(0, NULL, c ? "shutting_down" : "busy",
                                       c ? "the daemon is shutting down"
                                         : "too many connections (max_connections)", &len);
        if (line) {
            ssize_t w = send(res, line, len, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
            free(line);
        }
        if (!c)
            dlog(DG_LOG_WARN, "refused a connection: %d open (max_connections)", srv->n_conns);
        close(res);
        arm_accept(srv);
        return;
    }
    memset(&cred, 0, sizeof cred);
    if (getsockopt(res, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
        cred.uid = (uid_t)-1, cred.pid = 0;
    c->in_use = 1;
    c->fd = res;
    c->pending = 0;
    c->recv_armed = c->send_armed = c->poll_armed = 0;
    c->read_closed = c->gone = c->discarding = 0;
    c->rlen = 0;
    c->head = c->tail = NULL;
    c->out_bytes = 0;
    c->active = 0;
    c->uid = cred.uid;
    c->pid = cred.pid;
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
    if (c->head->off == c->head->len) {
        struct out_block *b = c->head;
        c->head = b->next;
        if (!c->head)
            c->tail = NULL;
        free(b);
    }
    arm_send(srv, c);
    arm_recv(srv, c); /* backpressure may have lifted */
    maybe_finish(srv, c);
}

/* Lines from the scheduler, to their connections. */
static void drain_outbox(struct dserver *srv)
{
    size_t n;
    while ((n = dsched_take(srv->sched, srv->outbox, OUT_TAKE)) > 0)
        for (size_t i = 0; i < n; i++) {
            struct dsched_out *o = &srv->outbox[i];
            const uint32_t slot = (uint32_t)o->conn;
            struct conn *c = (int)slot < srv->o.max_connections ? &srv->conns[slot] : NULL;
            if (c && c->in_use && c->gen == (uint32_t)(o->conn >> 32) && !c->gone) {
                if (o->line)
                    conn_write(srv, c, o->line, o->len);
                if (o->ends_request && c->active > 0)
                    c->active--;
                maybe_finish(srv, c);
            }
            free(o->line);
        }
}

static void begin_shutdown(struct dserver *srv, const char *why)
{
    srv->signals++;
    if (srv->signals == 1) {
        dlog(DG_LOG_INFO, "%s: shutting down: no new connections or requests; running "
             "requests have %.0f s", why, srv->o.shutdown_grace);
        srv->phase = DRAINING;
        srv->deadline = now_s() + srv->o.shutdown_grace;
        if (srv->listen_fd >= 0) {
            struct io_uring_sqe *sqe = get_sqe(srv);
            if (sqe) {
                io_uring_prep_cancel64(sqe, ud_make(OP_ACCEPT, 0, 0), 0);
                io_uring_sqe_set_data64(sqe, ud_make(OP_CANCEL, 0, 0));
            }
            close(srv->listen_fd);
            srv->listen_fd = -1;
            unlink(srv->socket_path);
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
                dlog(DG_LOG_ERROR, "SIGHUP: %s", err.msg);
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
    if (srv->listen_fd >= 0 && !srv->accept_armed)
        arm_accept(srv);
    if (srv->phase == DRAINING && t >= srv->deadline) {
        dlog(DG_LOG_INFO, "shutdown grace period over: cancelling the running requests");
        srv->phase = CANCELLING;
        dsched_shutdown(srv->sched, 1);
    }
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
            if (dsched_idle(srv->sched)) {
                srv->phase = FLUSHING;
                srv->deadline = now_s() + 2.0;
            }
        }
        if (srv->phase == FLUSHING && (all_flushed(srv) || now_s() >= srv->deadline))
            break;
        rc = io_uring_submit_and_wait(&srv->ring, 1);
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
                arm_event(srv);
                break;
            case OP_SIGNAL:
                on_signal(srv, res);
                break;
            case OP_TICK:
                on_tick(srv);
                break;
            case OP_CANCEL:
                break;
            case OP_RECV:
            case OP_SEND:
            case OP_POLL:
                c = conn_of(srv, ud);
                if (!c)
                    break;
                c->pending--;
                if (ud_kind(ud) == OP_RECV)
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

/* Bind path: refuse it if a live daemon answers there, replace it if it is
 * a stale socket, refuse anything else that is in the way. */
static int listen_on(const char *path, int mode, const char *group, int backlog,
                     struct dg_error *err)
{
    struct sockaddr_un a;
    struct stat st;
    int fd;

    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path || !*path)
        return dg_error_set(err, DG_E_INVAL, "socket %s: path empty or longer than %zu bytes",
                            path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    if (lstat(path, &st) == 0) {
        int probe;
        if (!S_ISSOCK(st.st_mode))
            return dg_error_set(err, DG_E_INVAL, "socket %s: the path exists and is not a "
                                "socket; not touching it", path);
        probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof a) == 0) {
            close(probe);
            return dg_error_set(err, DG_E_INVAL, "socket %s: another dgemmad is serving it",
                                path);
        }
        if (probe >= 0)
            close(probe);
        if (unlink(path) != 0)
            return dg_error_set(err, DG_E_IO, "socket %s: cannot remove the stale socket: %s",
                                path, strerror(errno));
        dlog(DG_LOG_INFO, "socket %s: removed a stale socket", path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dg_error_set(err, DG_E_IO, "socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        return dg_error_set(err, DG_E_IO, "socket %s: bind: %s", path, strerror(e));
    }
    if (chmod(path, (mode_t)mode) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dg_error_set(err, DG_E_IO, "socket %s: chmod %o: %s", path, mode, strerror(e));
    }
    if (group && *group) {
        struct group *g = getgrnam(group);
        if (!g || chown(path, (uid_t)-1, g->gr_gid) != 0) {
            int e = errno;
            close(fd);
            unlink(path);
            return dg_error_set(err, DG_E_IO, "socket %s: group %s: %s", path, group,
                                g ? strerror(e) : "no such group");
        }
    }
    if (listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dg_error_set(err, DG_E_IO, "socket %s: listen: %s", path, strerror(e));
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
    srv->event_fd = event_fd;
    srv->listen_fd = srv->signal_fd = -1;
    srv->started = now_s();
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
    rc = listen_on(o->socket_path, o->socket_mode, o->socket_group,
                   o->max_connections < 128 ? 128 : o->max_connections, err);
    if (rc < 0) {
        dserver_destroy(srv);
        return rc;
    }
    srv->listen_fd = rc;
    *out = srv;
    return 0;
}

void dserver_destroy(struct dserver *srv)
{
    if (!srv)
        return;
    for (int i = 0; srv->conns && i < srv->o.max_connections; i++) {
        struct conn *c = &srv->conns[i];
        if (c->in_use) {
            close(c->fd);
            free_output(c);
            free(c->rbuf);
        }
    }
    if (srv->listen_fd >= 0) {
        close(srv->listen_fd);
        unlink(srv->socket_path);
    }
    if (srv->signal_fd >= 0)
        close(srv->signal_fd);
    if (srv->ring_ok)
        io_uring_queue_exit(&srv->ring);
    free(srv->conns);
    free(srv->outbox);
    free(srv);
}
