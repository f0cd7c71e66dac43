/*
 * libdgemma.c - the C client library of dgemmad (see client/dgemma.h and
 * libdgemma(3)), its first part: the helpers the library's files share
 * (messages, the clock), the connection (dgemma_new, dgemma_connect,
 * dgemma_close, the sends) and requests: built as jansson objects and sent
 * as one JSON line each (dgemma_submit, dgemma_cancel, dgemma_status).
 * The events read back are in libdgemma-events.c, the shared-memory ring
 * in libdgemma-ring.c (attach), libdgemma-ring-submit.c (submissions) and
 * libdgemma-ring-reap.c (completions); what the files share is in
 * libdgemma-internal.h.
 */
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
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client/libdgemma-internal.h"
#include "lib/json-util.h"
#include "lib/utf8.h"

#define RETRY_MS 50                        /* connect retry interval */
#define TAG_MAX 128                        /* the daemon's DPROTO_TAG_MAX */

const int32_t dgc_no_ids[1]; /* an empty "ids" list */

/* ---- helpers ---------------------------------------------------------------- */

int dgc_seterr(dgemma_t *c, int status, const char *fmt, ...)
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

const char *dgc_errstr(int e, char *buf, size_t n)
{
    return strerror_r(e, buf, n); /* the GNU variant */
}

double dgc_now_ms(void)
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
void dgc_fds_drop(dgemma_t *c)
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
    c->max_id = 0;
    json_decref(c->ev);
    c->ev = NULL;
    c->ev_in_buf = 0;
    free(c->retired);
    c->retired = NULL;
    dgc_fds_drop(c);
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
        return dgc_seterr(c, DGEMMA_E_INVAL, "connect: an empty socket path");
    if (strlen(path) >= sizeof a.sun_path)
        return dgc_seterr(c, DGEMMA_E_INVAL, "connect %.200s: the path is longer than %zu bytes",
                          path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path));
    if (!(wait_s > 0)) /* negative or NaN: one try */
        wait_s = 0;
    if (wait_s > 1e7)
        wait_s = 1e7;
    deadline = dgc_now_ms() + wait_s * 1e3;
    for (;;) {
        /* non-blocking, so that a daemon whose queue of connections is full
         * (a hung one) gives EAGAIN at once, retried until the deadline,
         * instead of a connect that blocks for ever */
        int e, fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        double left;
        if (fd < 0) {
            e = errno;
            return dgc_seterr(c, e == ENOMEM || e == ENOBUFS ? DGEMMA_E_NOMEM : DGEMMA_E_CONNECT,
                              "socket: %s", dgc_errstr(e, eb, sizeof eb));
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            const int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
                e = errno;
                close(fd);
                return dgc_seterr(c, DGEMMA_E_CONNECT, "connect %.300s: %s", path,
                                  dgc_errstr(e, eb, sizeof eb));
            }
            c->fd = fd;
            c->err[0] = '\0';
            return DGEMMA_OK;
        }
        e = errno;
        close(fd);
        if (e == EAGAIN && !(deadline - dgc_now_ms() > 0))
            return dgc_seterr(c, DGEMMA_E_CONNECT, "connect %.300s: the daemon's queue of "
                              "connections is full (a hung daemon?)%s", path,
                              wait_s > 0 ? " after the wait" : "");
        left = deadline - dgc_now_ms();
        if ((e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != EINTR) || left <= 0) {
            if (wait_s > 0 && (e == ENOENT || e == ECONNREFUSED || e == EAGAIN))
                return dgc_seterr(c, DGEMMA_E_CONNECT, "connect %.300s: %s (waited %.3g s)", path,
                                  dgc_errstr(e, eb, sizeof eb), wait_s);
            return dgc_seterr(c, DGEMMA_E_CONNECT, "connect %.300s: %s", path,
                              dgc_errstr(e, eb, sizeof eb));
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
int dgc_send_all(dgemma_t *c, const char *s, size_t n, const char *what)
{
    char eb[128];
    if (c->fd < 0)
        return dgc_seterr(c, DGEMMA_E_INVAL, "%s: not connected", what);
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
                return dgc_seterr(c, DGEMMA_E_IO, "%s: poll: %s", what,
                                  dgc_errstr(errno, eb, sizeof eb));
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            return dgc_seterr(c, DGEMMA_E_CLOSED, "%s: the daemon closed the connection", what);
        if (w < 0 && (errno == ENOMEM || errno == ENOBUFS))
            return dgc_seterr(c, DGEMMA_E_NOMEM, "%s: send: %s", what,
                              dgc_errstr(errno, eb, sizeof eb));
        return dgc_seterr(c, DGEMMA_E_IO, "%s: send: %s", what,
                          w < 0 ? dgc_errstr(errno, eb, sizeof eb) : "sent nothing");
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

/* A JSON string of s in *out: DGEMMA_E_INVAL when s is not UTF-8,
 * DGEMMA_E_NOMEM when the allocation failed (json_string alone says NULL
 * for both). */
static int make_string(const char *s, json_t **out)
{
    const size_t n = strlen(s);
    *out = NULL;
    if (dg_utf8_valid_prefix((const unsigned char *)s, n) != n)
        return DGEMMA_E_INVAL;
    *out = json_stringn_nocheck(s, n);
    return *out ? DGEMMA_OK : DGEMMA_E_NOMEM;
}

dgemma_request_t *dgemma_request_text(const char *prompt)
{
    json_t *p;
    return prompt && make_string(prompt, &p) == DGEMMA_OK ? request_new("prompt", p) : NULL;
}

dgemma_request_t *dgemma_request_chat(void)
{
    return request_new("messages", json_array());
}

dgemma_request_t *dgemma_request_ids(const int32_t *ids, size_t n)
{
    json_t *a;
    if (!ids && n > 0) /* (NULL, 0: an empty list, the daemon's to refuse) */
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
        json_t *jr, *jc = NULL;
        int e = make_string(role, &jr);
        if (e == DGEMMA_OK)
            e = make_string(content, &jc);
        if (e != DGEMMA_OK) {
            json_decref(jr);
            return rerr(r, e, e == DGEMMA_E_NOMEM ? "add_message: out of memory"
                                                  : "add_message: role or content not valid UTF-8");
        }
        /* (json_object_set_new takes its value, on failure too; without
         * m, jr is still the function's to free) */
        m = json_object();
        if (!m || json_object_set_new(m, "role", jr) != 0) {
            if (!m)
                json_decref(jr);
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
    int e;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!stop)
        return rerr(r, DGEMMA_E_INVAL, "stop: NULL");
    if ((e = make_string(stop, &s)) != DGEMMA_OK)
        return rerr(r, e, e == DGEMMA_E_NOMEM ? "stop: out of memory" : "stop: not valid UTF-8");
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
    struct dg_error je = {0};
    json_t *o;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!json_object)
        return rerr(r, DGEMMA_E_INVAL, "settings: NULL");
    o = dg_json_loadb(json_object, strlen(json_object), JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                      "settings", &je);
    if (!o)
        return rerr(r, je.code == DG_E_NOMEM ? DGEMMA_E_NOMEM : DGEMMA_E_INVAL, "%s", je.msg);
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

int dgemma_request_set_parse_special(dgemma_request_t *r, int on)
{
    if (!r)
        return DGEMMA_E_INVAL;
    return set_new(r, "parse_special", json_boolean(on));
}

int dgemma_request_set_tag(dgemma_request_t *r, const char *tag)
{
    json_t *t;
    int e;
    if (!r)
        return DGEMMA_E_INVAL;
    if (!tag) {
        json_object_del(r->obj, "tag");
        return DGEMMA_OK;
    }
    if (strlen(tag) > TAG_MAX)
        return rerr(r, DGEMMA_E_INVAL, "tag: %zu bytes; at most %d", strlen(tag), TAG_MAX);
    if ((e = make_string(tag, &t)) != DGEMMA_OK)
        return rerr(r, e, e == DGEMMA_E_NOMEM ? "tag: out of memory" : "tag: not valid UTF-8");
    return set_new(r, "tag", t);
}

/* What json_dump_callback writes into: a buffer that grows, and whether it
 * once could not.  jansson 2.14 ignores a failed write of an object's key
 * (the text goes on without it: a malformed or a different request), so
 * the failure is kept here instead of trusted to come back.  (Not
 * json-util's dg_json_dumps, whose watch is the allocator it installs in
 * jansson: the library is not linked with it, and must leave the
 * application's jansson allocators as they are.) */
struct dump_buf {
    char *p;
    size_t n, cap;
    int failed;
};

static int dump_put(const char *s, size_t n, void *data)
{
    struct dump_buf *b = data;
    if (b->failed)
        return -1;
    if (n + 2 > b->cap - b->n) { /* (room kept for the newline and a NUL) */
        /* (from 16 bytes: a request line grows a few times, so a growth
         * that fails inside an object's key is met, and tested) */
        size_t cap = b->cap ? b->cap : 16;
        char *p;
        while (cap - b->n < n + 2) {
            if (cap > SIZE_MAX / 2) {
                b->failed = 1;
                return -1;
            }
            cap *= 2;
        }
        if (!(p = realloc(b->p, cap))) {
            b->failed = 1;
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

int dgemma_submit(dgemma_t *c, const dgemma_request_t *r)
{
    struct dump_buf b = {0};
    int rc;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!r)
        return dgc_seterr(c, DGEMMA_E_INVAL, "submit: a NULL request");
    if (c->fd < 0)
        return dgc_seterr(c, DGEMMA_E_INVAL, "submit: not connected");
    if (json_dump_callback(r->obj, dump_put, &b, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0 ||
        b.failed || !b.p) {
        free(b.p);
        return dgc_seterr(c, DGEMMA_E_NOMEM, "submit: out of memory");
    }
    b.p[b.n] = '\n';
    rc = dgc_send_all(c, b.p, b.n + 1, "submit");
    free(b.p);
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
    if ((rc = dgc_send_all(c, line, (size_t)n, "cancel")) == DGEMMA_OK)
        c->unanswered++;
    return rc;
}

int dgemma_status(dgemma_t *c)
{
    static const char line[] = "{\"v\":1,\"op\":\"status\"}\n";
    int rc;
    if (!c)
        return DGEMMA_E_INVAL;
    if ((rc = dgc_send_all(c, line, sizeof line - 1, "status")) == DGEMMA_OK)
        c->unanswered++;
    return rc;
}
