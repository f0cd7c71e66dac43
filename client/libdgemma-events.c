/*
 * libdgemma-events.c - libdgemma's event stream: the socket read through a
 * buffered line reader (recvmsg, so descriptors the daemon passes with
 * SCM_RIGHTS are taken: the shared-memory ring's, for dgemma_ring_attach)
 * and each line parsed into a dgemma_event_t, whose pointers stay valid
 * until the next dgemma_next_event on the same handle.
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/libdgemma-internal.h"
#include "lib/json-util.h"

#define READ_CHUNK ((size_t)64 << 10)      /* room made before each recv */
#define SHOW_LINE 200                      /* bytes of a bad line in a message */

const char *dgc_str_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static long long int_of(const json_t *o, const char *key, long long dflt)
{
    const json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return (long long)json_integer_value(v);
    if (json_is_real(v) && json_real_value(v) > -9.2e18 && json_real_value(v) < 9.2e18)
        return (long long)json_real_value(v);
    return dflt;
}

static int protocol_error(dgemma_t *c, const char *why, const char *line, size_t n)
{
    char show[SHOW_LINE + 1];
    const size_t k = n < SHOW_LINE ? n : SHOW_LINE;
    for (size_t i = 0; i < k; i++) /* control bytes (a NUL, say) as '?' */
        show[i] = (unsigned char)line[i] < 0x20 || line[i] == 0x7f ? '?' : line[i];
    show[k] = '\0';
    return dgc_seterr(c, DGEMMA_E_PROTOCOL, "not a version-1 event (%s): %s%s", why, show,
                      n > SHOW_LINE ? "..." : "");
}

static int parse_event(dgemma_t *c, char *line, size_t n, dgemma_event_t *ev)
{
    struct dg_error je = {0};
    json_t *o = dg_json_loadb(line, n, JSON_ALLOW_NUL, "event", &je), *v;
    const char *kind;

    if (!o && je.code == DG_E_NOMEM)
        return dgc_seterr(c, DGEMMA_E_NOMEM, "%s", je.msg);
    if (!o)
        return protocol_error(c, je.msg, line, n);
    v = json_object_get(o, "v");
    kind = dgc_str_of(o, "event");
    if (!json_is_object(o) || !json_is_integer(v) || json_integer_value(v) != 1 || !kind) {
        const char *why = !json_is_object(o) ? "not an object"
                          : !json_is_integer(v) || json_integer_value(v) != 1 ? "\"v\" is not 1"
                          : "no \"event\"";
        json_decref(o);
        return protocol_error(c, why, line, n);
    }
    c->ev = o;
    ev->json = line;
    ev->kind = !strcmp(kind, "accepted")     ? DGEMMA_EV_ACCEPTED
               : !strcmp(kind, "canvas")     ? DGEMMA_EV_CANVAS
               : !strcmp(kind, "done")       ? DGEMMA_EV_DONE
               : !strcmp(kind, "error")      ? DGEMMA_EV_ERROR
               : !strcmp(kind, "cancelling") ? DGEMMA_EV_CANCELLING
               : !strcmp(kind, "status")     ? DGEMMA_EV_STATUS
                                             : DGEMMA_EV_OTHER;
    v = json_object_get(o, "id");
    ev->id = json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
    ev->tag = dgc_str_of(o, "tag");
    v = json_object_get(o, "text");
    if (json_is_string(v)) {
        ev->text = json_string_value(v);
        ev->text_len = json_string_length(v);
    }
    v = json_object_get(o, "ids");
    if (json_is_array(v)) {
        const size_t k = json_array_size(v);
        json_t *x;
        size_t i;
        if (k > c->ids_cap) {
            int32_t *p = realloc(c->ids, sizeof *p * k);
            if (!p) {
                c->ev = NULL;
                json_decref(o);
                memset(ev, 0, sizeof *ev);
                ev->stop_id = -1;
                return dgc_seterr(c, DGEMMA_E_NOMEM, "event: out of memory for %zu ids", k);
            }
            c->ids = p;
            c->ids_cap = k;
        }
        json_array_foreach(v, i, x)
            c->ids[i] = (int32_t)json_integer_value(x);
        ev->ids = k ? c->ids : dgc_no_ids;
        ev->n_ids = k;
    }
    ev->index = (int)int_of(o, "index", 0);
    ev->steps = (int)int_of(o, "steps", 0);
    ev->tokens = (int)int_of(o, "tokens", 0);
    ev->converged = json_is_true(json_object_get(o, "converged"));
    ev->ms = json_number_value(json_object_get(o, "ms"));
    ev->finish_reason = dgc_str_of(o, "finish_reason");
    ev->prompt_tokens = int_of(o, "prompt_tokens", 0);
    v = json_object_get(o, "usage");
    if (json_is_object(v)) {
        ev->prompt_tokens = int_of(v, "prompt_tokens", ev->prompt_tokens);
        ev->completion_tokens = int_of(v, "completion_tokens", 0);
    }
    ev->canvases = (int)int_of(o, "canvases", 0);
    ev->decoder_steps = int_of(o, "decoder_steps", 0);
    ev->tokens_per_s = json_number_value(json_object_get(o, "tokens_per_s"));
    ev->stop_id = int_of(o, "stop_id", -1);
    ev->stop = dgc_str_of(o, "stop");
    v = json_object_get(o, "seed");
    ev->seed = json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
    ev->code = dgc_str_of(o, "code");
    ev->message = dgc_str_of(o, "message");
    v = json_object_get(o, "error");
    if (json_is_object(v)) {
        if (!ev->code)
            ev->code = dgc_str_of(v, "code");
        if (!ev->message)
            ev->message = dgc_str_of(v, "message");
    }
    return DGEMMA_OK;
}

/* Whether event o is the first answer to a request line (the daemon
 * answers lines in order): accepted, cancelling, status, or an error
 * without an id (a line refused), a cancel's not_found, or an error whose
 * id is above *max_id, the largest an earlier event carried (a submit the
 * daemon cancelled as it accepted it, out of memory for its answer); the
 * other errors with an id are about a request in flight.  Raises *max_id
 * to o's id: call it once for each event, in the order they came
 * (dgemma_ring_attach's look ahead at the buffer keeps a copy). */
int dgc_is_answer(const json_t *o, uint64_t *max_id)
{
    const char *kind = dgc_str_of(o, "event");
    const json_t *id = json_object_get(o, "id");
    const uint64_t idv = json_is_integer(id) && json_integer_value(id) > 0
                             ? (uint64_t)json_integer_value(id) : 0;
    const int fresh = idv > *max_id;
    if (fresh)
        *max_id = idv;
    if (!kind)
        return 0;
    if (!strcmp(kind, "accepted") || !strcmp(kind, "cancelling") || !strcmp(kind, "status"))
        return 1;
    if (strcmp(kind, "error") != 0)
        return 0;
    if (!id || json_is_null(id))
        return 1;
    return fresh || (dgc_str_of(o, "code") && !strcmp(dgc_str_of(o, "code"), "not_found"));
}

/* Room for at least READ_CHUNK more bytes at buf + end.  While the last
 * event's json points into buf[0, start) (dgemma_ring_attach reading
 * between two dgemma_next_event), that buffer is neither moved nor freed:
 * the unread bytes go on in a new one and the old one is freed at the next
 * dgemma_next_event. */
static int make_room(dgemma_t *c)
{
    if (c->ev_in_buf) {
        size_t n = c->end - c->start, cap = READ_CHUNK;
        char *p;
        if (c->cap - c->end >= READ_CHUNK)
            return DGEMMA_OK;
        while (cap - n < READ_CHUNK)
            cap *= 2;
        if (!(p = malloc(cap)))
            return dgc_seterr(c, DGEMMA_E_NOMEM, "event: out of memory for a %zu-byte buffer", cap);
        if (n > 0)
            memcpy(p, c->buf + c->start, n);
        free(c->retired); /* (NULL: the last event is in buf) */
        c->retired = c->buf;
        c->buf = p;
        c->cap = cap;
        c->scan -= c->start;
        c->end = n;
        c->start = 0;
        c->ev_in_buf = 0;
        return DGEMMA_OK;
    }
    if (c->start > 0) {
        memmove(c->buf, c->buf + c->start, c->end - c->start);
        c->end -= c->start;
        c->scan -= c->start;
        c->start = 0;
    }
    if (c->cap - c->end < READ_CHUNK) {
        size_t cap = c->cap ? c->cap : READ_CHUNK;
        char *p;
        while (cap - c->end < READ_CHUNK)
            cap *= 2;
        /* a line over LINE_MAX_BYTES is refused before the buffer grows again */
        if (cap > LINE_MAX_BYTES + 2 * READ_CHUNK)
            cap = LINE_MAX_BYTES + 2 * READ_CHUNK;
        if (!(p = realloc(c->buf, cap)))
            return dgc_seterr(c, DGEMMA_E_NOMEM, "event: out of memory for a %zu-byte buffer", cap);
        c->buf = p;
        c->cap = cap;
    }
    return DGEMMA_OK;
}

/* Take the descriptors of a received message: stashed on c when keep (a
 * dgemma_ring_attach waiting for its answer; one batch only: a second one,
 * or more than FD_STASH, or a truncated control part, sets fds_lost),
 * closed at once otherwise (nobody asked for them). */
static void take_fds(dgemma_t *c, struct msghdr *m, int keep)
{
    const int had = c->n_fds;
    if (keep && (m->msg_flags & MSG_CTRUNC))
        c->fds_lost = 1;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(m); h; h = CMSG_NXTHDR(m, h)) {
        size_t n;
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS || h->cmsg_len < CMSG_LEN(0))
            continue;
        n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof fd, sizeof fd);
            if (keep && had > 0)
                c->fds_lost = 1; /* a second batch: the first one is the odd one too */
            if (keep && c->n_fds < FD_STASH) {
                c->fds[c->n_fds++] = fd;
            } else {
                close(fd);
                c->fds_lost |= keep;
            }
        }
    }
}

/* Wait up to wait_ms (-1: no limit) for the socket to be readable, then
 * read what it has into the buffer (recvmsg: descriptors that come along
 * go to take_fds(keep)).  Returns 0 (read something, noted the end of the
 * stream, or was interrupted: look at the buffer and call again),
 * DGEMMA_E_AGAIN (nothing within wait_ms), or an error with c->err set. */
int dgc_fill(dgemma_t *c, int wait_ms, int keep_fds)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(int) * FD_STASH)];
    } ctl;
    struct pollfd p = {c->fd, POLLIN, 0};
    struct msghdr m;
    struct iovec iov;
    ssize_t got;
    char eb[128];
    int rc = poll(&p, 1, wait_ms);

    if (rc < 0) {
        if (errno == EINTR)
            return DGEMMA_OK;
        return dgc_seterr(c, DGEMMA_E_IO, "poll: %s", dgc_errstr(errno, eb, sizeof eb));
    }
    if (rc == 0)
        return DGEMMA_E_AGAIN;
    if (p.revents & POLLNVAL)
        return dgc_seterr(c, DGEMMA_E_IO, "poll: the socket is not open");
    if ((rc = make_room(c)) < 0)
        return rc;
    memset(&m, 0, sizeof m);
    iov.iov_base = c->buf + c->end;
    iov.iov_len = c->cap - c->end;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.b;
    m.msg_controllen = sizeof ctl.b;
    got = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got >= 0)
        take_fds(c, &m, keep_fds);
    if (got > 0) {
        c->end += (size_t)got;
    } else if (got == 0) {
        c->eof = 1;
    } else if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
        return DGEMMA_OK;
    } else if (errno == ECONNRESET || errno == EPIPE) {
        c->eof = 1;
    } else {
        return dgc_seterr(c, errno == ENOMEM || errno == ENOBUFS ? DGEMMA_E_NOMEM : DGEMMA_E_IO,
                          "recvmsg: %s", dgc_errstr(errno, eb, sizeof eb));
    }
    return DGEMMA_OK;
}

int dgemma_next_event(dgemma_t *c, dgemma_event_t *ev, int timeout_ms)
{
    double deadline;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!ev)
        return dgc_seterr(c, DGEMMA_E_INVAL, "next_event: a NULL event");
    memset(ev, 0, sizeof *ev);
    ev->stop_id = -1;
    /* the previous event's pointers die here */
    json_decref(c->ev);
    c->ev = NULL;
    c->ev_in_buf = 0;
    free(c->retired);
    c->retired = NULL;
    dgc_fds_drop(c); /* left by a dgemma_ring_attach that failed */
    if (c->fd < 0)
        return dgc_seterr(c, DGEMMA_E_INVAL, "next_event: not connected");
    deadline = dgc_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        char *nl = c->end > c->scan ? memchr(c->buf + c->scan, '\n', c->end - c->scan) : NULL;
        int wait, rc;

        if (nl) {
            const size_t at = c->start;
            char *line = c->buf + c->start, end;
            size_t n = (size_t)(nl - line);
            c->start = c->scan = (size_t)(nl - c->buf) + 1;
            if (c->skipping) { /* the tail of an overlong line */
                c->skipping = 0;
                continue;
            }
            if (n > 0 && line[n - 1] == '\r')
                n--;
            if (n == 0) /* a blank line: nothing to report */
                continue;
            end = line[n];
            line[n] = '\0';
            rc = parse_event(c, line, n, ev);
            if (rc == DGEMMA_E_NOMEM) { /* the event stays, read again by the next call */
                line[n] = end;
                c->start = c->scan = at;
            }
            if (rc == DGEMMA_OK) {
                c->ev_in_buf = 1;
                if (dgc_is_answer(c->ev, &c->max_id) && c->unanswered > 0)
                    c->unanswered--;
            }
            return rc;
        }
        c->scan = c->end;
        if (c->end - c->start > LINE_MAX_BYTES || (c->skipping && c->end > c->start)) {
            const int first = !c->skipping;
            if (first)
                protocol_error(c, "a line over 256 MiB", c->buf + c->start, c->end - c->start);
            c->skipping = 1;
            c->start = c->end = c->scan = 0;
            if (first) { /* give the big buffer back */
                free(c->buf);
                c->buf = NULL;
                c->cap = 0;
            }
            if (first)
                return DGEMMA_E_PROTOCOL;
        }
        if (c->eof) {
            if (c->end > c->start)
                return dgc_seterr(c, DGEMMA_E_CLOSED,
                                  "the daemon closed the connection in the middle of a line");
            return dgc_seterr(c, DGEMMA_E_CLOSED, "the daemon closed the connection");
        }
        if (timeout_ms < 0) {
            wait = -1;
        } else {
            const double left = deadline - dgc_now_ms();
            wait = left > 0 ? (int)(left + 0.999) : 0;
        }
        rc = dgc_fill(c, wait, 0);
        if (rc == DGEMMA_E_AGAIN)
            return dgc_seterr(c, DGEMMA_E_AGAIN, "no event within %d ms", timeout_ms);
        if (rc < 0)
            return rc;
    }
}
