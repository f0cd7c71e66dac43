/*
 * libdgemma.c - the C client library of dgemmad (see client/dgemma.h and
 * libdgemma(3)): requests built as jansson objects and sent as one JSON
 * line each; events read through a buffered line reader on the socket and
 * parsed into dgemma_event_t, whose pointers stay valid until the next
 * dgemma_next_event on the same handle.  The socket is read with recvmsg,
 * so descriptors the daemon passes (SCM_RIGHTS) are taken: the shared-
 * memory ring's (lib/shm-layout.h), whose client side is at the end.
 */
#include "client/dgemma.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h> /* isfinite: a macro, no libm */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lib/shm-layout.h"

#define LINE_MAX_BYTES ((size_t)256 << 20) /* one event line at most */
#define READ_CHUNK ((size_t)64 << 10)      /* room made before each recv */
#define RETRY_MS 50                        /* connect retry interval */
#define TAG_MAX 128                        /* the daemon's DPROTO_TAG_MAX */
#define SHOW_LINE 200                      /* bytes of a bad line in a message */
#define FD_STASH 16                        /* descriptors taken from one read */
#define RING_RECHECK_MS 1000               /* dgemma_ring_wait looks at the flags */

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
    /* Descriptors that came with the bytes read (SCM_RIGHTS), kept only
     * while dgemma_ring_attach waits for its answer; fds_lost: some did not
     * fit or came in a second read. */
    int fds[FD_STASH];
    int n_fds, fds_lost;
    char err[512];
};

static const int32_t NO_IDS[1]; /* an empty "ids" list */

struct dgemma_request {
    json_t *obj;
    /* What the last failing call on it was about (dgemma_request_errmsg). */
    char err[256];
};

/* ---- helpers ---------------------------------------------------------------- */

static int seterr(dgemma_t *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int seterr(dgemma_t *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return status;
}

static int rerr(dgemma_request_t *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int rerr(dgemma_request_t *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return status;
}

static const char *errstr(int e, char *buf, size_t n)
{
    return strerror_r(e, buf, n); /* the GNU variant */
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

const char *dgemma_status_name(int status)
{
    switch (status) {
    case DGEMMA_OK: return "ok";
    case DGEMMA_E_INVAL: return "inval";
    case DGEMMA_E_NOMEM: return "nomem";
    case DGEMMA_E_CONNECT: return "connect";
    case DGEMMA_E_IO: return "io";
    case DGEMMA_E_CLOSED: return "closed";
    case DGEMMA_E_PROTOCOL: return "protocol";
    case DGEMMA_E_AGAIN: return "again";
    case DGEMMA_E_DAEMON: return "daemon";
    }
    return "unknown";
}

/* ---- the connection ------------------------------------------------------------ */

dgemma_t *dgemma_new(void)
{
    dgemma_t *c = calloc(1, sizeof *c);
    if (c)
        c->fd = -1;
    return c;
}

/* Close the descriptors taken from the socket and not claimed. */
static void fds_drop(dgemma_t *c)
{
    for (int i = 0; i < c->n_fds; i++)
        close(c->fds[i]);
    c->n_fds = c->fds_lost = 0;
}

/* Drop the socket, the buffered input, the last event and any descriptors
 * received and not claimed. */
static void disconnect(dgemma_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->eof = c->skipping = 0;
    c->start = c->end = c->scan = 0;
    c->unanswered = 0;
    json_decref(c->ev);
    c->ev = NULL;
    c->ev_in_buf = 0;
    free(c->retired);
    c->retired = NULL;
    fds_drop(c);
}

int dgemma_connect(dgemma_t *c, const char *path, double wait_s)
{
    struct sockaddr_un a;
    double deadline;
    char eb[128];

    if (!c)
        return DGEMMA_E_INVAL;
    disconnect(c);
    if (!path) {
        const char *env = getenv(DGEMMA_SOCKET_ENV);
        path = env && *env ? env : DGEMMA_DEFAULT_SOCKET;
    }
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (!*path)
        return seterr(c, DGEMMA_E_INVAL, "connect: an empty socket path");
    if (strlen(path) >= sizeof a.sun_path)
        return seterr(c, DGEMMA_E_INVAL, "connect %.200s: the path is longer than %zu bytes",
                      path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path));
    if (!(wait_s > 0)) /* negative or NaN: one try */
        wait_s = 0;
    if (wait_s > 1e7)
        wait_s = 1e7;
    deadline = now_ms() + wait_s * 1e3;
    for (;;) {
        int e, fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        double left;
        if (fd < 0) {
            e = errno;
            return seterr(c, e == ENOMEM || e == ENOBUFS ? DGEMMA_E_NOMEM : DGEMMA_E_CONNECT,
                          "socket: %s", errstr(e, eb, sizeof eb));
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            c->fd = fd;
            c->err[0] = '\0';
            return DGEMMA_OK;
        }
        e = errno;
        close(fd);
        left = deadline - now_ms();
        if ((e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != EINTR) || left <= 0) {
            if (wait_s > 0 && (e == ENOENT || e == ECONNREFUSED || e == EAGAIN))
                return seterr(c, DGEMMA_E_CONNECT, "connect %.300s: %s (waited %.3g s)", path,
                              errstr(e, eb, sizeof eb), wait_s);
            return seterr(c, DGEMMA_E_CONNECT, "connect %.300s: %s", path,
                          errstr(e, eb, sizeof eb));
        }
        {
            const long ns = (long)((left < RETRY_MS ? left : RETRY_MS) * 1e6);
            struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
    }
}

void dgemma_close(dgemma_t *c)
{
    if (!c)
        return;
    disconnect(c);
    free(c->buf);
    free(c->ids);
    free(c);
}

int dgemma_fd(const dgemma_t *c)
{
    return c ? c->fd : -1;
}

const char *dgemma_request_errmsg(const dgemma_request_t *r)
{
    return r ? r->err : "no request (NULL)";
}

const char *dgemma_errmsg(const dgemma_t *c)
{
    if (!c)
        return "no connection handle (NULL)";
    return c->err;
}

/* Send all of s[0..n), whatever the socket's mode. */
static int send_all(dgemma_t *c, const char *s, size_t n, const char *what)
{
    char eb[128];
    if (c->fd < 0)
        return seterr(c, DGEMMA_E_INVAL, "%s: not connected", what);
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        if (w > 0) {
            s += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* the caller made the socket non-blocking: wait for room */
            struct pollfd p = {c->fd, POLLOUT, 0};
            if (poll(&p, 1, -1) < 0 && errno != EINTR)
                return seterr(c, DGEMMA_E_IO, "%s: poll: %s", what, errstr(errno, eb, sizeof eb));
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            return seterr(c, DGEMMA_E_CLOSED, "%s: the daemon closed the connection", what);
        if (w < 0 && (errno == ENOMEM || errno == ENOBUFS))
            return seterr(c, DGEMMA_E_NOMEM, "%s: send: %s", what, errstr(errno, eb, sizeof eb));
        return seterr(c, DGEMMA_E_IO, "%s: send: %s", what,
                      w < 0 ? errstr(errno, eb, sizeof eb) : "sent nothing");
    }
    return DGEMMA_OK;
}

/* ---- requests --------------------------------------------------------------------- */

static dgemma_request_t *request_new(const char *prompt_key, json_t *prompt)
{
    dgemma_request_t *r;
    if (!prompt)
        return NULL;
    r = calloc(1, sizeof *r);
    if (r)
        r->obj = json_pack("{s:i,s:s,s:o}", "v", 1, "op", "generate", prompt_key, prompt);
    else
        json_decref(prompt);
    if (r && !r->obj) {
        free(r);
        return NULL;
    }
    return r;
}

dgemma_request_t *dgemma_request_text(const char *prompt)
{
    /* json_string: NULL for NULL or invalid UTF-8 */
    return prompt ? request_new("prompt", json_string(prompt)) : NULL;
}

dgemma_request_t *dgemma_request_chat(void)
{
    return request_new("messages", json_array());
}

dgemma_request_t *dgemma_request_ids(const int32_t *ids, size_t n)
{
    json_t *a;
    if (!ids && n > 0)
        return NULL;
    a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return request_new("prompt_ids", a);
}

void dgemma_request_free(dgemma_request_t *r)
{
    if (!r)
        return;
    json_decref(r->obj);
    free(r);
}

/* Set key to v (stolen) in r. */
static int set_new(dgemma_request_t *r, const char *key, json_t *v)
{
    if (!v)
        return rerr(r, DGEMMA_E_NOMEM, "%s: out of memory", key);
    if (json_object_set_new(r->obj, key, v) != 0)
        return rerr(r, DGEMMA_E_NOMEM, "%s: out of memory", key);
    return DGEMMA_OK;
}

int dgemma_request_add_message(dgemma_request_t *r, const char *role, const char *content)
{
    json_t *list, *m;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!role || !content)
        return rerr(r, DGEMMA_E_INVAL, "add_message: a NULL role or content");
    list = json_object_get(r->obj, "messages");
    if (!json_is_array(list))
        return rerr(r, DGEMMA_E_INVAL, "add_message: not a chat request");
    {
        json_t *jr = json_string(role), *jc = json_string(content);
        if (!jr || !jc) {
            json_decref(jr);
            json_decref(jc);
            return rerr(r, DGEMMA_E_INVAL, "add_message: role or content not valid UTF-8");
        }
        m = json_object();
        if (!m || json_object_set_new(m, "role", jr) != 0) {
            json_decref(m);
            json_decref(jc);
            return rerr(r, DGEMMA_E_NOMEM, "add_message: out of memory");
        }
        if (json_object_set_new(m, "content", jc) != 0) {
            json_decref(m);
            return rerr(r, DGEMMA_E_NOMEM, "add_message: out of memory");
        }
        if (json_array_append_new(list, m) != 0) /* (frees m) */
            return rerr(r, DGEMMA_E_NOMEM, "add_message: out of memory");
    }
    return DGEMMA_OK;
}

static const char *const INT_KEYS[] = {"max_tokens", "seed", "top_k", "canvas_length",
                                       "max_denoising_steps", "stability_threshold"};
static const char *const REAL_KEYS[] = {"entropy_bound", "confidence_threshold", "t_min", "t_max",
                                        "top_p"};

static int in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i]))
            return 1;
    return 0;
}

#define IN(key, list) in_list(key, list, sizeof list / sizeof list[0])

int dgemma_request_set_int(dgemma_request_t *r, const char *key, long long value)
{
    if (!r)
        return DGEMMA_E_INVAL;
    if (!key)
        return rerr(r, DGEMMA_E_INVAL, "set_int: a NULL key");
    if (!IN(key, INT_KEYS))
        return rerr(r, DGEMMA_E_INVAL, "%.64s: not an integer setting%s", key,
                    IN(key, REAL_KEYS) ? " (a real one: use dgemma_request_set_real)" : "");
    return set_new(r, key, json_integer((json_int_t)value));
}

int dgemma_request_set_real(dgemma_request_t *r, const char *key, double value)
{
    if (!r)
        return DGEMMA_E_INVAL;
    if (!key)
        return rerr(r, DGEMMA_E_INVAL, "set_real: a NULL key");
    if (!IN(key, REAL_KEYS))
        return rerr(r, DGEMMA_E_INVAL, "%.64s: not a real setting%s", key,
                    IN(key, INT_KEYS) ? " (an integer one: use dgemma_request_set_int)" : "");
    if (!isfinite(value))
        return rerr(r, DGEMMA_E_INVAL, "%s: not a finite number", key);
    return set_new(r, key, json_real(value));
}

/* The list at key, made from a single value there (set_json) if need be. */
static json_t *list_at(dgemma_request_t *r, const char *key)
{
    json_t *cur = json_object_get(r->obj, key), *a;
    if (json_is_array(cur))
        return cur;
    a = json_array();
    if (!a)
        return NULL;
    if (cur && !json_is_null(cur) && json_array_append(a, cur) != 0) {
        json_decref(a);
        return NULL;
    }
    if (json_object_set_new(r->obj, key, a) != 0)
        return NULL;
    return a;
}

int dgemma_request_add_stop(dgemma_request_t *r, const char *stop)
{
    json_t *a, *s;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!stop)
        return rerr(r, DGEMMA_E_INVAL, "stop: NULL");
    if (!(s = json_string(stop)))
        return rerr(r, DGEMMA_E_INVAL, "stop: not valid UTF-8");
    if (!(a = list_at(r, "stop")) || json_array_append_new(a, s) != 0) {
        if (!a)
            json_decref(s);
        return rerr(r, DGEMMA_E_NOMEM, "stop: out of memory");
    }
    return DGEMMA_OK;
}

int dgemma_request_add_stop_id(dgemma_request_t *r, int32_t id)
{
    json_t *a;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!(a = list_at(r, "stop_token_ids")) || json_array_append_new(a, json_integer(id)) != 0)
        return rerr(r, DGEMMA_E_NOMEM, "stop_token_ids: out of memory");
    return DGEMMA_OK;
}

int dgemma_request_set_json(dgemma_request_t *r, const char *json_object)
{
    json_error_t je;
    json_t *o;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!json_object)
        return rerr(r, DGEMMA_E_INVAL, "settings: NULL");
    o = json_loads(json_object, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return rerr(r, DGEMMA_E_INVAL, "settings: %s (line %d, column %d)", je.text, je.line,
                    je.column);
    if (!json_is_object(o)) {
        json_decref(o);
        return rerr(r, DGEMMA_E_INVAL, "settings: expected a JSON object");
    }
    if (json_object_update(r->obj, o) != 0) {
        json_decref(o);
        return rerr(r, DGEMMA_E_NOMEM, "settings: out of memory");
    }
    json_decref(o);
    return DGEMMA_OK;
}

int dgemma_request_set_stream(dgemma_request_t *r, int stream)
{
    if (!r)
        return DGEMMA_E_INVAL;
    return set_new(r, "stream", json_boolean(stream));
}

int dgemma_request_set_thinking(dgemma_request_t *r, int on)
{
    if (!r)
        return DGEMMA_E_INVAL;
    return set_new(r, "enable_thinking", json_boolean(on));
}

int dgemma_request_set_tag(dgemma_request_t *r, const char *tag)
{
    json_t *t;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!tag) {
        json_object_del(r->obj, "tag");
        return DGEMMA_OK;
    }
    if (strlen(tag) > TAG_MAX)
        return rerr(r, DGEMMA_E_INVAL, "tag: %zu bytes; at most %d", strlen(tag), TAG_MAX);
    if (!(t = json_string(tag)))
        return rerr(r, DGEMMA_E_INVAL, "tag: not valid UTF-8");
    return set_new(r, "tag", t);
}

int dgemma_submit(dgemma_t *c, const dgemma_request_t *r)
{
    char *s, *line;
    size_t n;
    int rc;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!r)
        return seterr(c, DGEMMA_E_INVAL, "submit: a NULL request");
    if (c->fd < 0)
        return seterr(c, DGEMMA_E_INVAL, "submit: not connected");
    s = json_dumps(r->obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s)
        return seterr(c, DGEMMA_E_NOMEM, "submit: out of memory");
    n = strlen(s);
    line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return seterr(c, DGEMMA_E_NOMEM, "submit: out of memory");
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    rc = send_all(c, line, n + 1, "submit");
    free(line);
    if (rc == DGEMMA_OK)
        c->unanswered++;
    return rc;
}

int dgemma_cancel(dgemma_t *c, uint64_t id)
{
    char line[96];
    int n, rc;
    if (!c)
        return DGEMMA_E_INVAL;
    n = snprintf(line, sizeof line, "{\"v\":1,\"op\":\"cancel\",\"id\":%" PRIu64 "}\n", id);
    if ((rc = send_all(c, line, (size_t)n, "cancel")) == DGEMMA_OK)
        c->unanswered++;
    return rc;
}

int dgemma_status(dgemma_t *c)
{
    static const char line[] = "{\"v\":1,\"op\":\"status\"}\n";
    int rc;
    if (!c)
        return DGEMMA_E_INVAL;
    if ((rc = send_all(c, line, sizeof line - 1, "status")) == DGEMMA_OK)
        c->unanswered++;
    return rc;
}

/* ---- events ------------------------------------------------------------------------- */

static const char *str_of(const json_t *o, const char *key)
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
    return seterr(c, DGEMMA_E_PROTOCOL, "not a version-1 event (%s): %s%s", why, show,
                  n > SHOW_LINE ? "..." : "");
}

static int parse_event(dgemma_t *c, char *line, size_t n, dgemma_event_t *ev)
{
    json_error_t je;
    json_t *o = json_loadb(line, n, JSON_ALLOW_NUL, &je), *v;
    const char *kind;

    if (!o)
        return protocol_error(c, je.text, line, n);
    v = json_object_get(o, "v");
    kind = str_of(o, "event");
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
    ev->tag = str_of(o, "tag");
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
                return seterr(c, DGEMMA_E_NOMEM, "event: out of memory for %zu ids", k);
            }
            c->ids = p;
            c->ids_cap = k;
        }
        json_array_foreach(v, i, x)
            c->ids[i] = (int32_t)json_integer_value(x);
        ev->ids = k ? c->ids : NO_IDS;
        ev->n_ids = k;
    }
    ev->index = (int)int_of(o, "index", 0);
    ev->steps = (int)int_of(o, "steps", 0);
    ev->tokens = (int)int_of(o, "tokens", 0);
    ev->converged = json_is_true(json_object_get(o, "converged"));
    ev->ms = json_number_value(json_object_get(o, "ms"));
    ev->finish_reason = str_of(o, "finish_reason");
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
    ev->stop = str_of(o, "stop");
    v = json_object_get(o, "seed");
    ev->seed = json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
    ev->code = str_of(o, "code");
    ev->message = str_of(o, "message");
    v = json_object_get(o, "error");
    if (json_is_object(v)) {
        if (!ev->code)
            ev->code = str_of(v, "code");
        if (!ev->message)
            ev->message = str_of(v, "message");
    }
    return DGEMMA_OK;
}

/* Whether event o is the first answer to a request line (the daemon
 * answers lines in order): accepted, cancelling, status, or an error
 * without an id (a line refused) or a cancel's not_found (the only error
 * with an id that answers a line; the others are about a request in
 * flight). */
static int is_answer(const json_t *o)
{
    const char *kind = str_of(o, "event");
    const json_t *id = json_object_get(o, "id");
    if (!kind)
        return 0;
    if (!strcmp(kind, "accepted") || !strcmp(kind, "cancelling") || !strcmp(kind, "status"))
        return 1;
    if (strcmp(kind, "error") != 0)
        return 0;
    if (!id || json_is_null(id))
        return 1;
    return str_of(o, "code") && !strcmp(str_of(o, "code"), "not_found");
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
            return seterr(c, DGEMMA_E_NOMEM, "event: out of memory for a %zu-byte buffer", cap);
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
            return seterr(c, DGEMMA_E_NOMEM, "event: out of memory for a %zu-byte buffer", cap);
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
static int fill(dgemma_t *c, int wait_ms, int keep_fds)
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
        return seterr(c, DGEMMA_E_IO, "poll: %s", errstr(errno, eb, sizeof eb));
    }
    if (rc == 0)
        return DGEMMA_E_AGAIN;
    if (p.revents & POLLNVAL)
        return seterr(c, DGEMMA_E_IO, "poll: the socket is not open");
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
        return seterr(c, errno == ENOMEM || errno == ENOBUFS ? DGEMMA_E_NOMEM : DGEMMA_E_IO,
                      "recvmsg: %s", errstr(errno, eb, sizeof eb));
    }
    return DGEMMA_OK;
}

int dgemma_next_event(dgemma_t *c, dgemma_event_t *ev, int timeout_ms)
{
    double deadline;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!ev)
        return seterr(c, DGEMMA_E_INVAL, "next_event: a NULL event");
    memset(ev, 0, sizeof *ev);
    ev->stop_id = -1;
    /* the previous event's pointers die here */
    json_decref(c->ev);
    c->ev = NULL;
    c->ev_in_buf = 0;
    free(c->retired);
    c->retired = NULL;
    fds_drop(c); /* left by a dgemma_ring_attach that failed */
    if (c->fd < 0)
        return seterr(c, DGEMMA_E_INVAL, "next_event: not connected");
    deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        char *nl = c->end > c->scan ? memchr(c->buf + c->scan, '\n', c->end - c->scan) : NULL;
        int wait, rc;

        if (nl) {
            char *line = c->buf + c->start;
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
            line[n] = '\0';
            rc = parse_event(c, line, n, ev);
            if (rc == DGEMMA_OK) {
                c->ev_in_buf = 1;
                if (c->unanswered > 0 && is_answer(c->ev))
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
                return seterr(c, DGEMMA_E_CLOSED,
                              "the daemon closed the connection in the middle of a line");
            return seterr(c, DGEMMA_E_CLOSED, "the daemon closed the connection");
        }
        if (timeout_ms < 0) {
            wait = -1;
        } else {
            const double left = deadline - now_ms();
            wait = left > 0 ? (int)(left + 0.999) : 0;
        }
        rc = fill(c, wait, 0);
        if (rc == DGEMMA_E_AGAIN)
            return seterr(c, DGEMMA_E_AGAIN, "no event within %d ms", timeout_ms);
        if (rc < 0)
            return rc;
    }
}

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

static const char *const SHM_CODES[] = {NULL, "bad_request", "too_large", "busy",
                                        "shutting_down", "internal"};
static const char *const SHM_FINISH[] = {"stop", "length", "cancelled", "error"};

static int is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* The ring no longer usable: remember why, for every later call. */
static int ring_break(dgemma_ring_t *ring, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int ring_break(dgemma_ring_t *ring, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring->why, sizeof ring->why, fmt, ap);
    va_end(ap);
    ring->broken = 1;
    return seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: %s", ring->why);
}

/* 0, or the status a ring call returns at once: DGEMMA_E_PROTOCOL (broken)
 * or DGEMMA_E_CLOSED (the daemon set DG_SHM_FAULT, or the connection hung
 * up), with the message set.  The caller decides whether completions still
 * in the ring come first. */
static int ring_gone(dgemma_ring_t *ring)
{
    if (ring->broken)
        return seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: %s", ring->why);
    if (__atomic_load_n(&ring->h->flags, __ATOMIC_ACQUIRE) & DG_SHM_FAULT)
        return seterr(ring->c, DGEMMA_E_CLOSED,
                      "ring: the daemon left the ring (DG_SHM_FAULT: it broke a rule)");
    if (ring->hup)
        return seterr(ring->c, DGEMMA_E_CLOSED, "ring: the daemon closed the connection");
    return DGEMMA_OK;
}

/* Add 1 to the submission doorbell. */
static int ring_doorbell(dgemma_ring_t *ring)
{
    const uint64_t one = 1;
    char eb[128];
    for (;;) {
        ssize_t w = write(ring->sq_efd, &one, sizeof one);
        if (w == (ssize_t)sizeof one)
            return DGEMMA_OK;
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) /* the counter is at its top: a wake-up is pending */
            return DGEMMA_OK;
        return seterr(ring->c, DGEMMA_E_IO, "ring: the submission doorbell: %s",
                      w < 0 ? errstr(errno, eb, sizeof eb) : "a short write");
    }
}

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
        return seterr(ring->c, DGEMMA_E_IO, "ring: the completion doorbell: %s",
                      got < 0 ? errstr(errno, eb, sizeof eb) : "a short read");
    }
}

/* Load sq_head (acquire) and give back the arena bytes of every entry the
 * daemon has copied out since the last call.  DGEMMA_E_PROTOCOL when the
 * daemon's sq_head is not between what it had and our tail. */
static int ring_reclaim(dgemma_ring_t *ring)
{
    const uint32_t head = __atomic_load_n(&ring->h->sq_head, __ATOMIC_ACQUIRE);
    if ((uint32_t)(head - ring->sq_freed) > (uint32_t)(ring->sq_tail - ring->sq_freed))
        return ring_break(ring, "sq_head %" PRIu32 " is outside [%" PRIu32 ", %" PRIu32 "]",
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
        return seterr(ring->c, DGEMMA_E_AGAIN,
                      "%s: the submission ring is full (%" PRIu32 " entries): reap, then try again",
                      what, ring->sq_entries);
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

/* ---- attach ---- */

/* Map and check the ring the daemon sent: the shm_attached event o and its
 * descriptors fds[3] (memfd, submission doorbell, completion doorbell),
 * which it takes (closed on failure, the doorbells kept on success).
 * DGEMMA_E_PROTOCOL for anything that does not fit lib/shm-layout.h. */
static int ring_map(dgemma_t *c, const json_t *o, int fds[3], dgemma_ring_t **out)
{
    static const char *const KEYS[] = {"version", "size", "sq_entries", "cq_entries", "in_bytes",
                                       "out_bytes"};
    json_int_t v[6];
    struct dg_shm_header g;
    struct stat st;
    dgemma_ring_t *ring = NULL;
    void *base = MAP_FAILED;
    size_t size;
    char eb[128];
    int rc, fl;
    struct {
        const char *name;
        uint64_t off, len;
    } reg[4];

    for (int i = 0; i < 6; i++) {
        const json_t *x = json_object_get(o, KEYS[i]);
        if (!json_is_integer(x) || json_integer_value(x) <= 0) {
            rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: \"%s\" is not a positive integer",
                        KEYS[i]);
            goto fail;
        }
        v[i] = json_integer_value(x);
    }
    if (v[0] != (json_int_t)DG_SHM_VERSION) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: ring version %lld; this library knows %u",
                    (long long)v[0], DG_SHM_VERSION);
        goto fail;
    }
    if ((uint64_t)v[1] < DG_SHM_HEADER_SIZE || (uint64_t)v[1] > SIZE_MAX) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: a size of %lld bytes", (long long)v[1]);
        goto fail;
    }
    size = (size_t)v[1];
    if (fstat(fds[0], &st) != 0) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: fstat of the ring: %s",
                    errstr(errno, eb, sizeof eb));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_size != (off_t)size) {
        rc = seterr(c, DGEMMA_E_PROTOCOL,
                    "shm_attached: the ring's file is %s of %lld bytes, not the %zu announced",
                    S_ISREG(st.st_mode) ? "a file" : "not a file", (long long)st.st_size, size);
        goto fail;
    }
    fl = fcntl(fds[0], F_GET_SEALS);
    if (fl < 0 || !(fl & F_SEAL_SHRINK)) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: the ring's memfd is not sealed against "
                    "shrinking");
        goto fail;
    }
    /* our reads of the completion doorbell must not wait (the daemon makes it
     * EFD_NONBLOCK; the flag is the open file's, shared with the daemon) */
    fl = fcntl(fds[2], F_GETFL);
    if (fl < 0 || fcntl(fds[1], F_GETFL) < 0 ||
        (!(fl & O_NONBLOCK) && fcntl(fds[2], F_SETFL, fl | O_NONBLOCK) != 0)) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: a doorbell descriptor: %s",
                    errstr(errno, eb, sizeof eb));
        goto fail;
    }
    base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (base == MAP_FAILED) {
        rc = seterr(c, errno == ENOMEM ? DGEMMA_E_NOMEM : DGEMMA_E_PROTOCOL,
                    "shm_attached: mmap of %zu bytes: %s", size, errstr(errno, eb, sizeof eb));
        goto fail;
    }
    /* check a copy: the mapping can change under us */
    memcpy(&g, base, sizeof g);
    if (g.magic != DG_SHM_MAGIC || g.version != DG_SHM_VERSION) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: magic 0x%08" PRIx32 " version %" PRIu32
                    " (want 0x%08x version %u)", g.magic, g.version, DG_SHM_MAGIC, DG_SHM_VERSION);
        goto fail;
    }
    if (g.sq_entries != (uint64_t)v[2] || g.cq_entries != (uint64_t)v[3] ||
        g.in_size != (uint64_t)v[4] || g.out_size != (uint64_t)v[5] ||
        g.total_size != (uint64_t)v[1]) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: its geometry (sq %" PRIu32 ", cq %" PRIu32
                    ", in %" PRIu64 ", out %" PRIu64 ", size %" PRIu64 ") is not the event's",
                    g.sq_entries, g.cq_entries, g.in_size, g.out_size, g.total_size);
        goto fail;
    }
    if (!is_pow2(g.sq_entries) || !is_pow2(g.cq_entries)) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: %" PRIu32 " and %" PRIu32
                    " entries: not powers of two", g.sq_entries, g.cq_entries);
        goto fail;
    }
    reg[0].name = "submissions", reg[0].off = g.sq_off;
    reg[0].len = (uint64_t)g.sq_entries * DG_SHM_SQE_SIZE;
    reg[1].name = "completions", reg[1].off = g.cq_off;
    reg[1].len = (uint64_t)g.cq_entries * DG_SHM_CQE_SIZE;
    reg[2].name = "the submission arena", reg[2].off = g.in_off, reg[2].len = g.in_size;
    reg[3].name = "the completion arena", reg[3].off = g.out_off, reg[3].len = g.out_size;
    for (int i = 0; i < 4; i++) {
        if (reg[i].off < DG_SHM_HEADER_SIZE || reg[i].off > size || reg[i].len > size - reg[i].off ||
            (i < 2 && reg[i].off % 8 != 0)) {
            rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: %s at [%" PRIu64 ", +%" PRIu64
                        ") %s", reg[i].name, reg[i].off, reg[i].len,
                        i < 2 && reg[i].off % 8 ? "is not 8-aligned"
                                                : "is not inside the region after the header");
            goto fail;
        }
        for (int j = 0; j < i; j++)
            if (reg[i].off < reg[j].off + reg[j].len && reg[j].off < reg[i].off + reg[i].len) {
                rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: %s overlaps %s", reg[i].name,
                            reg[j].name);
                goto fail;
            }
    }
    if (!(ring = calloc(1, sizeof *ring)) ||
        !(ring->slot = calloc(g.sq_entries, sizeof *ring->slot))) {
        rc = seterr(c, DGEMMA_E_NOMEM, "shm_attach: out of memory");
        goto fail;
    }
    ring->h = base;
    ring->sq_tail = __atomic_load_n(&ring->h->sq_tail, __ATOMIC_ACQUIRE);
    ring->cq_head = __atomic_load_n(&ring->h->cq_head, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&ring->h->sq_head, __ATOMIC_ACQUIRE) != ring->sq_tail ||
        __atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE) != ring->cq_head) {
        rc = seterr(c, DGEMMA_E_PROTOCOL, "ring header: a new ring that is not empty");
        goto fail;
    }
    if (close(fds[0]) != 0) { /* the mapping stays */
        fds[0] = -1;
        rc = seterr(c, DGEMMA_E_IO, "shm_attach: close: %s", errstr(errno, eb, sizeof eb));
        goto fail;
    }
    ring->c = c;
    ring->sock = c->fd;
    ring->sq_efd = fds[1];
    ring->cq_efd = fds[2];
    ring->base = base;
    ring->size = size;
    ring->sq = ring->base + g.sq_off;
    ring->cq = ring->base + g.cq_off;
    ring->in = ring->base + g.in_off;
    ring->out = ring->base + g.out_off;
    ring->sq_entries = g.sq_entries;
    ring->cq_entries = g.cq_entries;
    ring->in_size = g.in_size;
    ring->out_size = g.out_size;
    ring->sq_freed = ring->sq_tail;
    *out = ring;
    return DGEMMA_OK;
fail:
    if (ring)
        free(ring->slot);
    free(ring);
    if (base != MAP_FAILED)
        munmap(base, size);
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

/* What a line in the buffer is to a waiting dgemma_ring_attach. */
enum attach_kind { AK_OTHER, AK_ANSWER_OTHER, AK_ATTACHED, AK_ERROR_NO_ID };

/* Parse line[0, n) (a '\r' already cut); *o: the parse when it is an
 * event (the caller's to free), else NULL. */
static enum attach_kind attach_classify(const char *line, size_t n, json_t **o)
{
    json_t *v = json_loadb(line, n, JSON_ALLOW_NUL, NULL), *ver;
    const char *kind;
    *o = NULL;
    if (!v)
        return AK_OTHER;
    ver = json_object_get(v, "v");
    kind = str_of(v, "event");
    if (!json_is_object(v) || !json_is_integer(ver) || json_integer_value(ver) != 1 || !kind) {
        json_decref(v);
        return AK_OTHER;
    }
    *o = v;
    if (!strcmp(kind, "shm_attached"))
        return AK_ATTACHED;
    if (!strcmp(kind, "error") && (!json_object_get(v, "id") || json_is_null(json_object_get(v, "id"))))
        return AK_ERROR_NO_ID;
    return is_answer(v) ? AK_ANSWER_OTHER : AK_OTHER;
}

int dgemma_ring_attach(dgemma_t *c, const dgemma_ring_opts_t *opts, dgemma_ring_t **out)
{
    static const char *const NAMES[] = {"sq_entries", "cq_entries", "in_bytes", "out_bytes"};
    char line[320];
    size_t n, seen = 0; /* bytes after c->start known not to hold the answer */
    unsigned long before; /* answers due to earlier lines, before ours */
    int rc;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!out)
        return seterr(c, DGEMMA_E_INVAL, "shm_attach: a NULL out pointer");
    *out = NULL;
    if (c->fd < 0)
        return seterr(c, DGEMMA_E_INVAL, "shm_attach: not connected");
    n = (size_t)snprintf(line, sizeof line, "{\"v\":1,\"op\":\"shm_attach\"");
    for (int i = 0; opts && i < 4; i++) {
        uint64_t x = i == 0 ? opts->sq_entries : i == 1 ? opts->cq_entries
                     : i == 2 ? (uint64_t)opts->in_bytes : (uint64_t)opts->out_bytes;
        if (x == 0)
            continue;
        if (i < 2) { /* a power of two, as the daemon takes it */
            uint64_t p = 1;
            while (p < x && p < ((uint64_t)1 << 31))
                p <<= 1;
            x = p;
        } else if (x > ((uint64_t)1 << 62)) {
            x = (uint64_t)1 << 62;
        }
        n += (size_t)snprintf(line + n, sizeof line - n, ",\"%s\":%" PRIu64, NAMES[i], x);
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "}\n");
    fds_drop(c);
    if ((rc = send_all(c, line, n, "shm_attach")) < 0)
        return rc;
    before = c->unanswered;
    for (;;) {
        char *nl;
        if (c->skipping && c->end > c->start) { /* the tail of an overlong line */
            nl = memchr(c->buf + c->start, '\n', c->end - c->start);
            c->start = c->scan = nl ? (size_t)(nl - c->buf) + 1 : c->end;
            c->skipping = !nl;
        }
        while (!c->skipping && c->end - c->start > seen &&
               (nl = memchr(c->buf + c->start + seen, '\n', c->end - c->start - seen)) != NULL) {
            const size_t ls = c->start + seen, le = (size_t)(nl - c->buf) + 1;
            size_t len = le - 1 - ls;
            enum attach_kind k;
            json_t *o;
            if (len > 0 && c->buf[ls + len - 1] == '\r')
                len--;
            seen = le - c->start;
            k = attach_classify(c->buf + ls, len, &o);
            if (k == AK_ANSWER_OTHER || (k == AK_ERROR_NO_ID && before > 0)) {
                if (before > 0)
                    before--;
                k = AK_OTHER;
            }
            if (k == AK_OTHER) { /* left for dgemma_next_event */
                json_decref(o);
                continue;
            }
            /* ours: take the line out of the buffer */
            memmove(c->buf + ls, c->buf + le, c->end - le);
            c->end -= le - ls;
            c->scan = c->start;
            if (k == AK_ERROR_NO_ID) {
                const char *code = str_of(o, "code"), *msg = str_of(o, "message");
                rc = seterr(c, DGEMMA_E_DAEMON, "shm_attach refused (%s): %s",
                            code ? code : "no code", msg ? msg : "no message");
                json_decref(o);
                fds_drop(c);
                return rc;
            }
            if (c->n_fds != 3 || c->fds_lost) {
                rc = seterr(c, DGEMMA_E_PROTOCOL,
                            "shm_attached came with %d descriptor(s)%s; it needs 3", c->n_fds,
                            c->fds_lost ? " and more lost" : "");
                json_decref(o);
                fds_drop(c);
                return rc;
            }
            c->n_fds = 0; /* ring_map takes them */
            rc = ring_map(c, o, c->fds, out);
            json_decref(o);
            if (rc == DGEMMA_OK)
                c->err[0] = '\0';
            return rc;
        }
        if (c->end - c->start > LINE_MAX_BYTES)
            return seterr(c, DGEMMA_E_PROTOCOL,
                          "shm_attach: no answer within 256 MiB of events (read them first)");
        if (c->eof)
            return seterr(c, DGEMMA_E_CLOSED,
                          "shm_attach: the daemon closed the connection before answering");
        rc = fill(c, -1, 1);
        if (rc < 0 && rc != DGEMMA_E_AGAIN)
            return rc;
    }
}

void dgemma_ring_detach(dgemma_ring_t *r)
{
    if (!r)
        return;
    munmap(r->base, r->size);
    close(r->sq_efd);
    close(r->cq_efd);
    free(r->slot);
    free(r->obuf);
    free(r);
}

int dgemma_ring_fd(const dgemma_ring_t *ring)
{
    return ring ? ring->cq_efd : -1;
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
                return seterr(c, DGEMMA_E_INVAL, "ring submit: op: not \"generate\"");
            continue;
        }
        if (!strcmp(key, "messages") || !strcmp(key, "enable_thinking"))
            return seterr(c, DGEMMA_E_INVAL, "ring submit: %s: a chat request cannot go on the "
                          "ring (render it to text, or use dgemma_submit)", key);
        if (!strcmp(key, "prompt") || !strcmp(key, "prompt_ids")) {
            const int ids = !strcmp(key, "prompt_ids");
            if (*prompt)
                return seterr(c, DGEMMA_E_INVAL,
                              "ring submit: both prompt and prompt_ids: give one");
            if (ids ? !json_is_array(v) : !json_is_string(v))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected %s", key,
                              ids ? "a list of token ids" : "a string");
            *prompt = v;
            e->op = ids ? DG_SHM_OP_IDS : DG_SHM_OP_TEXT;
            continue;
        }
        if (!strcmp(key, "batch")) {
            if (!json_is_boolean(v))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: batch: expected true or false");
            if (json_is_true(v))
                e->flags |= DG_SHM_F_BATCH;
            continue;
        }
        if (json_is_null(v)) /* a setting left at its default, as on the socket */
            continue;
        for (i = 0; i < sizeof I32 / sizeof I32[0]; i++)
            if (!strcmp(key, I32[i].key)) {
                int32_t y;
                if (!get_ll(v, &x))
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected an integer", key);
                if (x < INT32_MIN || x > INT32_MAX)
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: %s: %lld does not fit the "
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
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: %s: expected a number", key);
                d = json_number_value(v);
                memcpy((char *)e + DBL[i].off, &d, sizeof d);
                e->set |= DBL[i].bit;
                break;
            }
        if (i < sizeof DBL / sizeof DBL[0])
            continue;
        if (!strcmp(key, "seed")) {
            if (!get_ll(v, &x))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: seed: expected an integer");
            if (x < 0)
                return seterr(c, DGEMMA_E_INVAL, "ring submit: seed: %lld is negative", x);
            e->seed = (uint64_t)x;
            e->set |= DG_SHM_SET_SEED;
        } else if (!strcmp(key, "max_tokens")) {
            if (!get_ll(v, &x))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: max_tokens: expected an integer");
            e->max_tokens = (int64_t)x;
            e->set |= DG_SHM_SET_MAX_TOKENS;
        } else if (!strcmp(key, "stop_token_ids")) {
            const size_t k = json_is_array(v) ? json_array_size(v) : 1;
            if (!json_is_array(v) && !json_is_integer(v))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids: expected an "
                              "integer or a list of integers");
            if (k > DG_SHM_MAX_STOP_IDS)
                return seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids: %zu ids; the ring "
                              "carries at most %d", k, DG_SHM_MAX_STOP_IDS);
            for (size_t j = 0; j < k; j++) {
                if (!get_ll(json_is_array(v) ? json_array_get(v, j) : v, &x))
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids[%zu]: expected "
                                  "an integer", j);
                if (x < INT32_MIN || x > INT32_MAX)
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: stop_token_ids[%zu]: %lld "
                                  "does not fit 32 bits", j, x);
                e->stop_ids[j] = (int32_t)x;
            }
            e->n_stop_ids = (uint32_t)k;
            e->set |= DG_SHM_SET_STOP_IDS;
        } else if (!strcmp(key, "stop")) {
            const size_t k = json_is_array(v) ? json_array_size(v) : 1;
            if (!json_is_array(v) && !json_is_string(v))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: stop: expected a string or a list "
                              "of strings");
            for (size_t j = 0; j < k; j++) {
                const json_t *s = json_is_array(v) ? json_array_get(v, j) : v;
                if (!json_is_string(s))
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: stop[%zu]: expected a string",
                                  j);
                if (strlen(json_string_value(s)) != json_string_length(s))
                    return seterr(c, DGEMMA_E_INVAL, "ring submit: stop[%zu]: a NUL inside", j);
                *stop_len += json_string_length(s) + 1;
            }
            *stops = v;
            e->set |= DG_SHM_SET_STOP;
        } else {
            return seterr(c, DGEMMA_E_INVAL, "ring submit: %.64s: not a setting the ring carries",
                          key);
        }
    }
    if (!*prompt)
        return seterr(c, DGEMMA_E_INVAL, "ring submit: no prompt (a text or token-id request)");
    if (e->op == DG_SHM_OP_IDS) {
        json_t *id;
        size_t j;
        json_array_foreach(*prompt, j, id) {
            if (!get_ll(id, &x))
                return seterr(c, DGEMMA_E_INVAL, "ring submit: prompt_ids[%zu]: expected an "
                              "integer", j);
            if (x < INT32_MIN || x > INT32_MAX)
                return seterr(c, DGEMMA_E_INVAL, "ring submit: prompt_ids[%zu]: %lld does not "
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
        return seterr(ring->c, DGEMMA_E_INVAL, "ring submit: a NULL request");
    if ((rc = ring_gone(ring)) < 0)
        return rc;
    memset(&e, 0, sizeof e);
    e.user_data = user_data;
    if ((rc = encode_request(ring, r->obj, &e, &prompt, &stops, &slen)) < 0)
        return rc;
    plen = e.op == DG_SHM_OP_IDS ? (uint64_t)json_array_size(prompt) * sizeof(int32_t)
                                 : (uint64_t)json_string_length(prompt);
    if (plen + slen > ring->in_size || plen > UINT32_MAX || slen > UINT32_MAX)
        return seterr(ring->c, DGEMMA_E_INVAL, "ring submit: %" PRIu64 " bytes of prompt and "
                      "stop strings; the prompt arena holds %" PRIu64, plen + slen, ring->in_size);
    if ((rc = sq_room(ring, "ring submit")) < 0)
        return rc;
    if (arena_take(ring, plen + slen, &off) < 0)
        return seterr(ring->c, DGEMMA_E_AGAIN, "ring submit: the prompt arena is full (%" PRIu64
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
    if ((rc = ring_gone(ring)) < 0)
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
    if ((rc = ring_gone(ring)) < 0)
        return rc;
    if (ring->unkicked == 0)
        return DGEMMA_OK;
    if ((rc = ring_doorbell(ring)) < 0)
        return rc;
    ring->unkicked = 0;
    return DGEMMA_OK;
}

/* ---- completions ---- */

/* Whether the connection's socket says the daemon hung up (a poll that
 * does not wait); sets ring->hup.  A failing poll counts as no. */
static int ring_hung_up(dgemma_ring_t *ring)
{
    struct pollfd p = {ring->sock, POLLRDHUP, 0};
    if (!ring->hup && poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
        ring->hup = 1;
    return ring->hup;
}

/* Kick when entries are queued, unless the ring is gone (the caller tells
 * that after taking what completions are left). */
static int kick_if_queued(dgemma_ring_t *ring)
{
    if (ring->unkicked == 0 || ring_gone(ring) < 0)
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
        return ring_break(ring, "cq_tail %" PRIu32 " is more than %" PRIu32 " past cq_head %"
                          PRIu32, tail, ring->cq_entries, ring->cq_head);
    memcpy(&e, ring->cq + (size_t)(ring->cq_head & (ring->cq_entries - 1)) * DG_SHM_CQE_SIZE,
           sizeof e);
    idb = (uint64_t)e.n_ids * sizeof(int32_t);
    need = idb + e.text_len;
    if (e.status > DG_SHM_ERR_INTERNAL || (e.status == DG_SHM_OK && e.finish > DG_SHM_FINISH_ERROR))
        bad = seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: the completion of job %" PRIu64
                     " has status %" PRIu32 " finish %" PRIu32 " (dropped)", e.user_data,
                     e.status, e.finish);
    else if (e.out_off > ring->out_size || need > ring->out_size - e.out_off)
        bad = seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: the completion of job %" PRIu64
                     " has %" PRIu64 " bytes at %" PRIu64 ", outside the %" PRIu64 "-byte arena"
                     " (dropped)", e.user_data, need, e.out_off, ring->out_size);
    else if (need + 1 > ring->obuf_cap) {
        size_t cap = ring->obuf_cap ? ring->obuf_cap : 256;
        unsigned char *p;
        while (cap < need + 1)
            cap *= 2;
        if (!(p = realloc(ring->obuf, cap)))
            return seterr(ring->c, DGEMMA_E_NOMEM, "ring: out of memory for a %" PRIu64
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
        ring_doorbell(ring) < 0)
        ring->unkicked++; /* try again at the next kick, which reports it */
    if (bad)
        return bad;
    memset(out, 0, sizeof *out);
    out->user_data = e.user_data;
    out->id = e.request_id;
    out->seed = e.seed;
    out->ids = e.n_ids ? (const int32_t *)(void *)ring->obuf : NO_IDS;
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
        return seterr(ring->c, DGEMMA_E_INVAL, "ring reap: a NULL completion");
    memset(out, 0, sizeof *out);
    out->stop_id = -1;
    if (ring->broken)
        return ring_gone(ring);
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
    if (ring_hung_up(ring) && (rc = reap_one(ring, out)) != DGEMMA_E_AGAIN)
        return rc;
    if ((rc = ring_gone(ring)) < 0)
        return rc;
    return seterr(ring->c, DGEMMA_E_AGAIN, "ring reap: no completion ready");
}

int dgemma_ring_wait(dgemma_ring_t *ring, int timeout_ms)
{
    double deadline;
    char eb[128];
    int rc;

    if (!ring)
        return DGEMMA_E_INVAL;
    if (ring->broken)
        return ring_gone(ring);
    if ((rc = kick_if_queued(ring)) < 0)
        return rc;
    deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        struct pollfd p[2] = {{ring->cq_efd, POLLIN, 0}, {ring->sock, POLLRDHUP, 0}};
        const uint32_t tail = __atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE);
        int wait;
        if (tail != ring->cq_head)
            return DGEMMA_OK; /* (reap checks it) */
        if ((rc = ring_gone(ring)) < 0)
            return rc;
        if (timeout_ms < 0) {
            wait = -1;
        } else {
            const double left = deadline - now_ms();
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
            return seterr(ring->c, DGEMMA_E_IO, "ring wait: poll: %s",
                          errstr(errno, eb, sizeof eb));
        if (rc == 0) {
            if (__atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE) != ring->cq_head)
                return DGEMMA_OK;
            if (timeout_ms < 0 || deadline - now_ms() > 0)
                continue; /* (a recheck) */
            return seterr(ring->c, DGEMMA_E_AGAIN, "ring wait: no completion within %d ms",
                          timeout_ms);
        }
        if ((p[0].revents | p[1].revents) & POLLNVAL)
            return seterr(ring->c, DGEMMA_E_IO, "ring wait: %s is not open",
                          p[0].revents & POLLNVAL ? "the completion doorbell"
                                                  : "the connection's socket");
        if (p[0].revents & POLLERR)
            return seterr(ring->c, DGEMMA_E_IO, "ring wait: the completion doorbell failed");
        if (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR))
            ring->hup = 1; /* the ring is looked at once more, then CLOSED */
        if ((p[0].revents & POLLIN) && (rc = ring_drain(ring)) < 0)
            return rc;
    }
}
