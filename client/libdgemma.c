/*
 * libdgemma.c - the C client library of dgemmad (see client/dgemma.h and
 * libdgemma(3)): requests built as jansson objects and sent as one JSON
 * line each; events read through a buffered line reader on the socket and
 * parsed into dgemma_event_t, whose pointers stay valid until the next
 * dgemma_next_event on the same handle.
 */
#include "client/dgemma.h"

#include <errno.h>
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

#define LINE_MAX_BYTES ((size_t)256 << 20) /* one event line at most */
#define READ_CHUNK ((size_t)64 << 10)      /* room made before each recv */
#define RETRY_MS 50                        /* connect retry interval */
#define TAG_MAX 128                        /* the daemon's DPROTO_TAG_MAX */
#define SHOW_LINE 200                      /* bytes of a bad line in a message */

struct dgemma {
    int fd;
    int eof;        /* the daemon closed its side */
    int skipping;   /* discarding the rest of an overlong line */
    char *buf;      /* unread bytes are [start, end); no '\n' in [start, scan) */
    size_t cap, start, end, scan;
    json_t *ev;     /* the last event's parse (the event's strings point into it) */
    int32_t *ids;   /* the last event's ids */
    size_t ids_cap;
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

/* Drop the socket, the buffered input and the last event. */
static void disconnect(dgemma_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->eof = c->skipping = 0;
    c->start = c->end = c->scan = 0;
    json_decref(c->ev);
    c->ev = NULL;
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
    return rc;
}

int dgemma_cancel(dgemma_t *c, uint64_t id)
{
    char line[96];
    int n;
    if (!c)
        return DGEMMA_E_INVAL;
    n = snprintf(line, sizeof line, "{\"v\":1,\"op\":\"cancel\",\"id\":%" PRIu64 "}\n", id);
    return send_all(c, line, (size_t)n, "cancel");
}

int dgemma_status(dgemma_t *c)
{
    static const char line[] = "{\"v\":1,\"op\":\"status\"}\n";
    if (!c)
        return DGEMMA_E_INVAL;
    return send_all(c, line, sizeof line - 1, "status");
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

/* Room for at least READ_CHUNK more bytes at buf + end. */
static int make_room(dgemma_t *c)
{
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

int dgemma_next_event(dgemma_t *c, dgemma_event_t *ev, int timeout_ms)
{
    double deadline;
    char eb[128];

    if (!c)
        return DGEMMA_E_INVAL;
    if (!ev)
        return seterr(c, DGEMMA_E_INVAL, "next_event: a NULL event");
    memset(ev, 0, sizeof *ev);
    ev->stop_id = -1;
    /* the previous event's pointers die here */
    json_decref(c->ev);
    c->ev = NULL;
    if (c->fd < 0)
        return seterr(c, DGEMMA_E_INVAL, "next_event: not connected");
    deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        char *nl = c->end > c->scan ? memchr(c->buf + c->scan, '\n', c->end - c->scan) : NULL;
        struct pollfd p = {c->fd, POLLIN, 0};
        ssize_t got;
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
            return parse_event(c, line, n, ev);
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
        rc = poll(&p, 1, wait);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            return seterr(c, DGEMMA_E_IO, "poll: %s", errstr(errno, eb, sizeof eb));
        }
        if (rc == 0)
            return seterr(c, DGEMMA_E_AGAIN, "no event within %d ms", timeout_ms);
        if (p.revents & POLLNVAL)
            return seterr(c, DGEMMA_E_IO, "poll: the socket is not open");
        if ((rc = make_room(c)) < 0)
            return rc;
        got = recv(c->fd, c->buf + c->end, c->cap - c->end, MSG_DONTWAIT);
        if (got > 0) {
            c->end += (size_t)got;
        } else if (got == 0) {
            c->eof = 1;
        } else if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
            continue;
        } else if (errno == ECONNRESET || errno == EPIPE) {
            c->eof = 1;
        } else {
            return seterr(c, errno == ENOMEM || errno == ENOBUFS ? DGEMMA_E_NOMEM : DGEMMA_E_IO,
                          "recv: %s", errstr(errno, eb, sizeof eb));
        }
    }
}
