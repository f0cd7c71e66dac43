/*
 * Description: a load test of the real dgemmad (from $BUILD/bin) on the
 * random test model ($BUILD/model/random) and the CPU backend.  One thread drives, with
 * epoll, 1000 UNIX-socket connections held open at once (the test's
 * RLIMIT_NOFILE soft limit is raised to the hard limit first; the daemon,
 * its child, inherits it) and two shared-memory rings (libdgemma), and
 * pushes at least 10,000 small generate requests through them in rounds
 * (round 0 is the warm-up; about 1,900 under AddressSanitizer, to keep its
 * run short: there the daemon took 287 requests a second against 660 in
 * the plain build, on a machine of 2 CPUs).  Ring jobs beyond the daemon's
 * client_max_requests (64) per connection wait in their ring, so the ring
 * path's latency includes that wait.  Every round also has:
 *   - slow readers that stop reading for 2 s while asking for about 530 KB
 *     of output (status events and streamed requests), more than the
 *     kernel's socket buffer and past the point where the daemon stops
 *     taking their requests (a quarter of max_output_bytes, which is
 *     64 KiB here), then read: they get every event, in order, and the
 *     other clients' requests kept finishing meanwhile;
 *   - clients that write 60 streamed requests and 4,000 status requests at
 *     once and read nothing: the daemon stops taking their requests, and
 *     their requests' streamed events take them past max_output_bytes: it
 *     drops them ("the client is too slow" in its log), their requests are
 *     cancelled, and what was sent before the drop (the accepted events
 *     first) is still there to read.  The events alone must overflow the
 *     kernel's socket buffer (set to 208 KiB: send_buffer_bytes) and then
 *     max_output_bytes: where the daemon writes
 *     them before the status answers have filled the buffer (a slow front
 *     end), the answers stop at a quarter of the limit and only the events
 *     are left to cross it;
 *   - clients that vanish: after their requests were accepted (most still
 *     queued), after the first canvas of a streamed request, or right after
 *     sending without reading anything; and a ring client that closes with
 *     jobs in flight.
 * Checks: every request the clients know of finished (or was accounted for
 * as vanished), events in order (accepted, canvases, done) with one done
 * each; the daemon's VmRSS after the warm-up and after the last round
 * (both idle) differs by at most RSS_BOUND_KIB (not checked under
 * AddressSanitizer, whose quarantine holds freed memory; LeakSanitizer
 * checks leaks when the daemon exits there); the metrics database has
 * exactly one request row per accepted request with the finish the client
 * saw (vanished ones: cancelled with error_code client_gone, or finished),
 * some cancelled while still queued, no rows for requests nobody sent, and
 * none lost; SIGTERM with every connection open ends the daemon with
 * status 0.  Prints one "# load:" summary line: connections held,
 * requests, wall time, p50 / p99 / max latency (submission to done) of the
 * socket and ring paths, RSS after warm-up and at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"

/* (-DLOAD_ROUNDS=N for a longer soak: the RSS check then spans more rounds) */
#ifndef LOAD_ROUNDS
#define LOAD_ROUNDS 4
#endif
#if defined(__SANITIZE_ADDRESS__)
#define LOAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOAD_ASAN 1
#endif
#endif

/* ---- sizes ------------------------------------------------------------------------------- */

#ifdef LOAD_ASAN
enum {
    ROUNDS = 3,          /* round 0 is the warm-up */
    SOCK_WARM = 500,     /* socket requests of round 0 (at most one per connection) */
    SOCK_ROUND = 300,    /* socket requests of each later round */
    RING_WARM = 100,     /* ring jobs of round 0 */
    RING_ROUND = 200,    /* ring jobs of each later round */
    NPAUSE = 5,          /* slow readers (among the held connections) */
    NVAN = 12,           /* vanishing clients per round */
    MIN_TOTAL = 1500,
};
#else
enum {
    ROUNDS = LOAD_ROUNDS,
    SOCK_WARM = 1000,    /* (every held connection sends one) */
    SOCK_ROUND = 2200,
    RING_WARM = 600,
    RING_ROUND = 1600,
    NPAUSE = 10,
    NVAN = 30,
    MIN_TOTAL = 10000,
};
#endif

enum {
    NCONN = 1000,        /* socket connections held open all along */
    NRING = 2,           /* ring connections held open all along */
    NDROP = 1,           /* clients dropped for not reading, per round */
    PAUSE_MS = 2000,     /* how long the slow readers do not read */
    PAUSE_STATUS = 1200, /* status requests of a slow reader (about 530 KB of output) */
    STATUS_BATCH = 50,   /* sent at once, every BATCH_MS */
    BATCH_MS = 20,
    DROP_FLOOD = 4000,   /* status requests a dropped client sends after its requests */
    PAUSE_GEN = 4,       /* streamed requests of a slow reader */
    DROP_GEN = 60,       /* streamed requests of a dropped client, DROP_TOKENS each */
    DROP_TOKENS = 128,   /* with nothing written before them, 60 requests of 32 tokens'
                          * events were dropped and of 24 were not (a socket buffer of
                          * 208 KiB, max_output_bytes 64 KiB): 128 leave four times that.
                          * The daemon is given that buffer (send_buffer_bytes), so
                          * that neither this margin nor the slow readers' rests on
                          * the machine's net.core.wmem_default */
    RING_VAN_JOBS = 32,  /* jobs of the ring client that vanishes, per round */
    ROUND_LIMIT_S = 150,
    MAX_CONNS = NCONN + ROUNDS * (NVAN + NDROP) + 4,
    MAX_RQ = SOCK_WARM + ROUNDS * (SOCK_ROUND + NPAUSE * PAUSE_GEN + NDROP * DROP_GEN + NVAN * 3),
    MAX_RING = RING_WARM + ROUNDS * RING_ROUND,
};

/* Growth of the daemon's VmRSS allowed between the end of the warm-up and
 * the end of the load, both measured idle: SQLite's page cache filling up
 * to its default 2 MiB as the metrics file grows, the WAL index, and
 * malloc's arenas settling are a few MiB; a leak of even 1 KiB per request
 * (or of the slow readers' output blocks) is more. */
#define RSS_BOUND_KIB (8 * 1024)

/* Daemon settings: tiny requests (two tokens, a canvas of two, one
 * denoising step: a prefill and a denoising step each). */
#define TINY "\"max_tokens\":2,\"canvas_length\":2,\"max_denoising_steps\":1"

static char sock_path[512], log_path[512], db_path[512];
static pid_t daemon_pid;

/* ---- bookkeeping ------------------------------------------------------------------------- */

enum finish { F_NONE = 0, F_STOP, F_LENGTH, F_CANCELLED, F_ERROR, F_REJECTED };
static const char *const FINISH[] = {"", "stop", "length", "cancelled", "error", "rejected"};

static enum finish finish_of(const char *s)
{
    for (int i = 1; s && i <= F_REJECTED; i++)
        if (!strcmp(s, FINISH[i]))
            return (enum finish)i;
    return F_NONE;
}

enum rq_state { RQ_FREE = 0, RQ_SENT, RQ_ACCEPTED, RQ_DONE, RQ_REFUSED };

/* One socket request (its tag is "r<index>"). */
struct rq {
    double t_sub, t_done;
    uint64_t id;
    int conn;
    char kind;                  /* 'r' regular, 'p' slow reader, 'd' dropped,
                                   'q' 'm' 'b' vanishing */
    unsigned char stream, state, finish;
    unsigned char row_seen;     /* metrics check */
    int canvases_seen, canvases_done;
};

/* One ring job (user_data is its index). */
struct rrq {
    double t_sub, t_done;
    uint64_t id;
    unsigned char state, finish, row_seen;
};

enum ckind { C_REG = 1, C_PAUSE, C_DROP, C_VANQ, C_VANM, C_VANB };

enum cstage { S_IDLE = 0, S_WAIT_ACC, S_PAUSED, S_READING, S_FINISHED };

struct conn {
    int fd;
    enum ckind kind;
    enum cstage stage;
    int reading, in_epoll;
    uint32_t ev;
    int closed, eof, reset, hup;
    char *rb;
    size_t rlen, rcap;
    char *wb;
    size_t woff, wlen, wcap;
    int inflight, accepted, refused, nsent;
    int status_sent, status_seen, status_target;
    double next_batch, resume_at;
};

struct ring {
    dgemma_t *c;
    dgemma_ring_t *r;
};

static struct {
    int ep;
    struct conn conns[MAX_CONNS];
    int nconns;
    struct rq rq[MAX_RQ];
    int nrq;
    struct rrq rr[MAX_RING];
    int nrr;
    struct ring rings[NRING];
    int round;
    double t0;                   /* round start */
    int sock_left, ring_left;
    int vans_started;
    int ring_van_done;
    /* counters */
    int busy, ring_refused;
    long done_in_pause;          /* regular and ring completions while slow readers paused */
    int ring_van_jobs, blind_sent, dropped, pausers_ok;
    /* latencies, ms */
    double *lat_sock, *lat_ring;
    int n_lat_sock, n_lat_ring;
    /* the first problem seen */
    int nerr;
    char err[512];
} L;

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...)
{
    va_list ap;
    if (L.nerr++ == 0) {
        va_start(ap, fmt);
        vsnprintf(L.err, sizeof L.err, fmt, ap);
        va_end(ap);
    }
}

#define now_ms fixture_now_ms

/* ---- the daemon -------------------------------------------------------------------------- */

static int start_daemon(void)
{
    static char o_db[700];
    const char *opts[] = {
        "pin_workers=false", "tick=0.05", "max_batch=16", "queue_max=4000",
        "max_connections=1200", "max_output_bytes=65536", "send_buffer_bytes=212992",
        "shutdown_grace=5", "metrics_flush=0.25", "metrics_queue=200000", o_db, NULL,
    };
    snprintf(o_db, sizeof o_db, "metrics=%s", db_path);
    daemon_pid = fixture_spawn(sock_path, log_path, opts);
    return daemon_pid > 0 && fixture_wait_ready(daemon_pid, sock_path) == 0 ? 0 : -1;
}


/* The status event on the blocking monitor connection mon; NULL on failure. */
static json_t *status_of(int mon)
{
    static char buf[1 << 16];
    size_t len = 0;
    const char req[] = "{\"v\":1,\"op\":\"status\"}\n";
    if (send(mon, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1))
        return NULL;
    while (len < sizeof buf - 1) {
        ssize_t n = recv(mon, buf + len, sizeof buf - 1 - len, 0);
        char *nl;
        if (n <= 0)
            return NULL;
        len += (size_t)n;
        if ((nl = memchr(buf, '\n', len)) != NULL)
            return json_loadb(buf, (size_t)(nl - buf), 0, NULL);
    }
    return NULL;
}

static long long jint(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* Wait (up to 60 s) until the daemon is idle: nothing queued or running,
 * the metrics writer has caught up, and only the held connections are
 * open (the vanished ones released).  0, or -1; either way the last status
 * is in *last (NULL or a status event the caller frees; a previous one
 * there is freed). */
static int wait_idle(int mon, json_t **last)
{
    const double end = now_ms() + 60000;
    while (now_ms() < end) {
        json_t *s = status_of(mon);
        if (!s)
            return -1;
        json_decref(*last);
        *last = s;
        if (jint(s, "queued", NULL) == 0 && jint(s, "running", NULL) == 0 &&
            jint(s, "metrics", "queued") == 0 &&
            jint(s, "connections", NULL) == NCONN + NRING + 1 && jint(s, "rings", NULL) == NRING)
            return 0;
        usleep(50000);
    }
    return -1;
}

/* Whether the daemon's log (all of it: it is several MiB) has needle. */
static int log_has(const char *needle)
{
    FILE *f = fopen(log_path, "r");
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    if (!f)
        return 0;
    while (!found && getline(&line, &cap, f) > 0)
        found = strstr(line, needle) != NULL;
    free(line);
    fclose(f);
    return found;
}

/* ---- socket connections (non-blocking, in the epoll set) --------------------------------- */

static void conn_events(struct conn *c)
{
    const int i = (int)(c - L.conns);
    uint32_t ev = (c->reading ? EPOLLIN | EPOLLRDHUP : 0) | (c->wlen > c->woff ? EPOLLOUT : 0);
    struct epoll_event e = {.events = ev, .data.u64 = (uint64_t)i};
    if (c->fd < 0)
        return;
    if (!c->in_epoll) {
        if (c->hup)
            return; /* (taken out after a hang-up while paused: read at resume) */
        if (epoll_ctl(L.ep, EPOLL_CTL_ADD, c->fd, &e) == 0)
            c->in_epoll = 1, c->ev = ev;
        else
            bad("epoll add: %s", strerror(errno));
    } else if (ev != c->ev) {
        if (epoll_ctl(L.ep, EPOLL_CTL_MOD, c->fd, &e) == 0)
            c->ev = ev;
    }
}

static void conn_close(struct conn *c)
{
    if (c->fd < 0)
        return;
    if (c->in_epoll)
        epoll_ctl(L.ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->in_epoll = 0;
    c->closed = 1;
    free(c->rb);
    free(c->wb);
    c->rb = c->wb = NULL;
    c->rlen = c->rcap = c->woff = c->wlen = c->wcap = 0;
}

/* Send what is buffered, as far as the socket takes it. */
static void conn_flush(struct conn *c)
{
    while (c->fd >= 0 && c->woff < c->wlen) {
        ssize_t n = send(c->fd, c->wb + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
        if (n > 0) {
            c->woff += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            break;
        } else {
            /* the daemon closed it (a dropped client): the rest is moot */
            c->woff = c->wlen;
            c->hup = 1;
        }
    }
    if (c->woff == c->wlen)
        c->woff = c->wlen = 0;
    conn_events(c);
}

/* Queue bytes for the daemon and send what the socket takes now. */
static void conn_put(struct conn *c, const char *p, size_t n)
{
    if (c->fd < 0)
        return;
    if (c->wlen + n > c->wcap) {
        size_t cap = c->wcap ? c->wcap : 4096;
        char *b;
        while (cap < c->wlen + n)
            cap *= 2;
        if (!(b = realloc(c->wb, cap))) {
            bad("out of memory");
            return;
        }
        c->wb = b;
        c->wcap = cap;
    }
    memcpy(c->wb + c->wlen, p, n);
    c->wlen += n;
    conn_flush(c);
}

static struct conn *conn_new(enum ckind kind)
{
    struct conn *c;
    int fd;
    if (L.nconns == MAX_CONNS) {
        bad("connection table full");
        return NULL;
    }
    fd = fixture_connect(sock_path);
    if (fd < 0) {
        bad("connect #%d: %s", L.nconns, strerror(errno));
        return NULL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    c = &L.conns[L.nconns++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->kind = kind;
    c->reading = 1;
    conn_events(c);
    return c;
}

/* Send a generate request of kind k on c ("extra" settings as JSON members). */
static int submit(struct conn *c, char k, int stream, const char *extra)
{
    char line[512];
    struct rq *q;
    int i, n;
    if (L.nrq == MAX_RQ) {
        bad("request table full");
        return -1;
    }
    i = L.nrq++;
    q = &L.rq[i];
    memset(q, 0, sizeof *q);
    q->conn = (int)(c - L.conns);
    q->kind = k;
    q->stream = (unsigned char)stream;
    q->state = RQ_SENT;
    n = snprintf(line, sizeof line,
                 "{\"v\":1,\"op\":\"generate\",\"prompt\":\"load %d says\",%s,\"seed\":%d,"
                 "\"stream\":%s,\"tag\":\"r%d\"}\n",
                 i % 97, extra, i + 1, stream ? "true" : "false", i);
    q->t_sub = now_ms();
    c->inflight++;
    c->nsent++;
    conn_put(c, line, (size_t)n);
    return i;
}

static void send_status(struct conn *c, int n)
{
    static const char s[] = "{\"v\":1,\"op\":\"status\"}\n";
    char buf[STATUS_BATCH * (sizeof s - 1)];
    while (n > 0) {
        const int k = n < STATUS_BATCH ? n : STATUS_BATCH;
        for (int j = 0; j < k; j++)
            memcpy(buf + (size_t)j * (sizeof s - 1), s, sizeof s - 1);
        conn_put(c, buf, (size_t)k * (sizeof s - 1));
        c->status_sent += k;
        n -= k;
    }
}

/* Whether the clock is inside a slow readers' pause of this round. */
static int in_pause(double t)
{
    return t > L.t0 + 300 && t < L.t0 + PAUSE_MS;
}

/* A regular connection's next request, while the round's quota lasts. */
static void regular_next(struct conn *c)
{
    if (c->kind == C_REG && c->inflight == 0 && L.sock_left > 0 && c->fd >= 0) {
        L.sock_left--;
        /* (one in ten streamed: its canvases are counted against its done) */
        submit(c, 'r', L.nrq % 10 == 0, TINY);
    }
}

/* One event line from the daemon on c. */
static void on_line(struct conn *c, char *line, size_t len)
{
    static const char status_prefix[] = "{\"v\":1,\"event\":\"status\"";
    json_t *o;
    const char *ev, *tag;
    struct rq *q = NULL;
    int i = -1;

    if (len >= sizeof status_prefix - 1 && !memcmp(line, status_prefix, sizeof status_prefix - 1)) {
        if (c->kind != C_PAUSE && c->kind != C_DROP)
            bad("a status event on a connection that asked for none");
        c->status_seen++;
        return;
    }
    /* (text may hold U+0000) */
    if (!(o = json_loadb(line, len, JSON_ALLOW_NUL, NULL))) {
        bad("an event that does not parse: %.200s", line);
        return;
    }
    ev = json_string_value(json_object_get(o, "event"));
    tag = json_string_value(json_object_get(o, "tag"));
    if (tag && tag[0] == 'r')
        i = atoi(tag + 1);
    if (i >= 0 && i < L.nrq && L.rq[i].conn == (int)(c - L.conns))
        q = &L.rq[i];
    if (!ev || !q) {
        bad("an event for no request of this connection: %.200s", line);
        json_decref(o);
        return;
    }
    if (!strcmp(ev, "accepted")) {
        if (q->state != RQ_SENT)
            bad("r%d: accepted twice or late", i);
        q->state = RQ_ACCEPTED;
        q->id = (uint64_t)jint(o, "id", NULL);
        c->accepted++;
    } else if (!strcmp(ev, "canvas")) {
        if (q->state != RQ_ACCEPTED || !q->stream)
            bad("r%d: a canvas event out of order (state %d)", i, q->state);
        q->canvases_seen++;
        if (c->kind == C_VANM) {
            /* gone after its first canvas: the request is running */
            conn_close(c);
            c->stage = S_FINISHED;
        }
    } else if (!strcmp(ev, "done")) {
        const double t = now_ms();
        if (q->state != RQ_ACCEPTED || (uint64_t)jint(o, "id", NULL) != q->id)
            bad("r%d: a done event out of order (state %d)", i, q->state);
        q->state = RQ_DONE;
        q->t_done = t;
        q->finish =
            (unsigned char)finish_of(json_string_value(json_object_get(o, "finish_reason")));
        q->canvases_done = (int)jint(o, "canvases", NULL);
        if (q->finish != F_STOP && q->finish != F_LENGTH &&
            !(q->finish == F_CANCELLED && (c->kind == C_DROP)))
            bad("r%d (%c): finished %s: %.200s", i, q->kind, FINISH[q->finish], line);
        if (q->stream && q->canvases_seen != q->canvases_done)
            bad("r%d: %d canvas events, done says %d", i, q->canvases_seen, q->canvases_done);
        c->inflight--;
        if (q->kind == 'r') {
            L.lat_sock[L.n_lat_sock++] = t - q->t_sub;
            if (in_pause(t))
                L.done_in_pause++;
        }
        regular_next(c);
    } else if (!strcmp(ev, "error")) {
        const char *code = json_string_value(json_object_get(o, "code"));
        if (q->state != RQ_SENT)
            bad("r%d: an error event after acceptance: %.200s", i, line);
        q->state = RQ_REFUSED;
        q->finish = F_REJECTED;
        c->inflight--;
        c->refused++;
        if (code && !strcmp(code, "busy"))
            L.busy++;
        else
            bad("r%d: refused: %.200s", i, line);
        regular_next(c);
    } else {
        bad("an unexpected event: %.200s", line);
    }
    json_decref(o);
}

/* Read what is there; frame lines; notice the end of the connection. */
static void conn_read(struct conn *c)
{
    char buf[65536];
    for (;;) {
        ssize_t n;
        if (c->fd < 0)
            return;
        n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            size_t start = 0;
            if (c->rlen + (size_t)n > c->rcap) {
                size_t cap = c->rcap ? c->rcap : 65536;
                char *b;
                while (cap < c->rlen + (size_t)n)
                    cap *= 2;
                if (!(b = realloc(c->rb, cap))) {
                    bad("out of memory");
                    return;
                }
                c->rb = b;
                c->rcap = cap;
            }
            memcpy(c->rb + c->rlen, buf, (size_t)n);
            c->rlen += (size_t)n;
            for (size_t k = 0; k < c->rlen && c->fd >= 0; k++)
                if (c->rb[k] == '\n') {
                    on_line(c, c->rb + start, k - start);
                    start = k + 1;
                }
            if (c->fd < 0)
                return;
            memmove(c->rb, c->rb + start, c->rlen - start);
            c->rlen -= start;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n == 0)
            c->eof = 1;
        else
            c->reset = 1;
        if (c->kind != C_DROP)
            bad("connection %d (kind %d) ended by the daemon: %s", (int)(c - L.conns), c->kind,
                n == 0 ? "EOF" : strerror(errno));
        conn_close(c);
        return;
    }
}

/* ---- rings ------------------------------------------------------------------------------- */

static dgemma_request_t *ring_job(int i, int max_tokens)
{
    char p[48];
    dgemma_request_t *r;
    snprintf(p, sizeof p, "ring %d says", i % 89);
    r = dgemma_request_text(p);
    if (r && (dgemma_request_set_int(r, "max_tokens", max_tokens) != 0 ||
              dgemma_request_set_int(r, "canvas_length", 2) != 0 ||
              dgemma_request_set_int(r, "max_denoising_steps", 1) != 0 ||
              dgemma_request_set_int(r, "seed", 100000 + i) != 0)) {
        dgemma_request_free(r);
        r = NULL;
    }
    return r;
}

/* Queue jobs on ring k while the round's quota lasts and the ring has room. */
static void ring_fill(int k)
{
    struct ring *g = &L.rings[k];
    int queued = 0;
    while (L.ring_left > 0 && L.nrr < MAX_RING) {
        const int i = L.nrr;
        dgemma_request_t *r = ring_job(i, 2);
        int rc;
        if (!r) {
            bad("ring job: out of memory");
            return;
        }
        rc = dgemma_ring_submit(g->r, r, (uint64_t)i);
        dgemma_request_free(r);
        if (rc == DGEMMA_E_AGAIN)
            break;
        if (rc != 0) {
            bad("ring submit: %s: %s", dgemma_status_name(rc), dgemma_errmsg(g->c));
            return;
        }
        memset(&L.rr[i], 0, sizeof L.rr[i]);
        L.rr[i].t_sub = now_ms();
        L.rr[i].state = RQ_SENT;
        L.nrr++;
        L.ring_left--;
        queued++;
    }
    if (queued && dgemma_ring_kick(g->r) != 0)
        bad("ring kick: %s", dgemma_errmsg(g->c));
}

/* Take every completion ring k has, then queue more. */
static void ring_reap(int k)
{
    struct ring *g = &L.rings[k];
    dgemma_completion_t d;
    int rc;
    while ((rc = dgemma_ring_reap(g->r, &d)) == 0) {
        const double t = now_ms();
        struct rrq *q = d.user_data < (uint64_t)L.nrr ? &L.rr[d.user_data] : NULL;
        if (!q || q->state != RQ_SENT) {
            bad("ring: a completion for job %llu, unknown or done",
                (unsigned long long)d.user_data);
            continue;
        }
        q->t_done = t;
        q->id = d.id;
        if (d.id == 0) {
            q->state = RQ_REFUSED;
            q->finish = F_REJECTED;
            L.ring_refused++;
            bad("ring job %llu refused: %s: %s", (unsigned long long)d.user_data,
                d.code ? d.code : "?", d.message ? d.message : "");
            continue;
        }
        q->state = RQ_DONE;
        q->finish = (unsigned char)finish_of(d.finish_reason);
        if (q->finish != F_STOP && q->finish != F_LENGTH)
            bad("ring job %llu: finished %s %s", (unsigned long long)d.user_data,
                d.finish_reason ? d.finish_reason : "?", d.message ? d.message : "");
        L.lat_ring[L.n_lat_ring++] = t - q->t_sub;
        if (in_pause(t))
            L.done_in_pause++;
    }
    if (rc != DGEMMA_E_AGAIN)
        bad("ring reap: %s: %s", dgemma_status_name(rc), dgemma_errmsg(g->c));
    ring_fill(k);
}

/* A ring client that submits jobs and goes away without waiting for them. */
static void ring_vanish(void)
{
    dgemma_t *c = dgemma_new();
    dgemma_ring_t *r = NULL;
    dgemma_ring_opts_t opts = {64, 64, 0, 0};
    if (!c || dgemma_connect(c, sock_path, 5) != 0 || dgemma_ring_attach(c, &opts, &r) != 0) {
        bad("ring vanisher: %s", c ? dgemma_errmsg(c) : "out of memory");
        dgemma_close(c);
        return;
    }
    for (int i = 0; i < RING_VAN_JOBS; i++) {
        dgemma_request_t *q = ring_job(1000000 + i, 2);
        if (!q || dgemma_ring_submit(r, q, (uint64_t)i) != 0)
            bad("ring vanisher: submit: %s", dgemma_errmsg(c));
        dgemma_request_free(q);
        L.ring_van_jobs++;
    }
    if (dgemma_ring_kick(r) != 0)
        bad("ring vanisher: kick: %s", dgemma_errmsg(c));
    usleep(20000); /* (the daemon takes them; they wait behind the queue) */
    dgemma_ring_detach(r);
    dgemma_close(c);
}

/* ---- a round ----------------------------------------------------------------------------- */

/* Start vanishing client j of the round: kinds q (waits for its requests'
 * accepted events, then closes), m (closes after the first canvas of a
 * streamed request), b (closes right after sending). */
static void vanisher_start(int j)
{
    const enum ckind k = j % 3 == 0 ? C_VANQ : j % 3 == 1 ? C_VANM : C_VANB;
    struct conn *c = conn_new(k);
    if (!c)
        return;
    c->stage = S_WAIT_ACC;
    if (k == C_VANQ) {
        for (int n = 0; n < 3; n++)
            submit(c, 'q', 0, TINY);
    } else if (k == C_VANM) {
        submit(c, 'm', 1, "\"max_tokens\":16,\"canvas_length\":4,\"max_denoising_steps\":1");
    } else {
        for (int n = 0; n < 2; n++)
            submit(c, 'b', 0, TINY);
        L.blind_sent += 2;
        if (c->wlen)
            bad("a blind vanisher could not send at once");
        conn_close(c);
        c->stage = S_FINISHED;
    }
}

static void round_start(int r)
{
    L.round = r;
    L.t0 = now_ms();
    L.sock_left = r == 0 ? (SOCK_WARM < NCONN - NPAUSE ? SOCK_WARM : NCONN - NPAUSE) : SOCK_ROUND;
    L.ring_left = r == 0 ? RING_WARM : RING_ROUND;
    L.vans_started = 0;
    L.ring_van_done = 0;
    /* slow readers: requests and the first status batch, then no reading */
    for (int i = 0; i < NPAUSE; i++) {
        struct conn *c = &L.conns[i];
        c->stage = S_PAUSED;
        c->reading = 0;
        c->status_sent = c->status_seen = 0;
        c->status_target = PAUSE_STATUS;
        c->nsent = c->accepted = c->refused = 0;
        for (int n = 0; n < PAUSE_GEN; n++)
            submit(c, 'p', 1, "\"max_tokens\":8,\"canvas_length\":4,\"max_denoising_steps\":1");
        send_status(c, STATUS_BATCH);
        c->next_batch = L.t0 + BATCH_MS;
        c->resume_at = L.t0 + PAUSE_MS;
        conn_events(c);
    }
    /* clients to be dropped: streamed requests, then status requests
     * whose answers back the connection up, all in one go, and nothing read
     * until the daemon hangs up (the accepted events are the first lines
     * there); the requests' events cross max_output_bytes whether the
     * answers or the events fill the socket first (DROP_TOKENS) */
    char drop_settings[96];
    snprintf(drop_settings, sizeof drop_settings,
             "\"max_tokens\":%d,\"canvas_length\":2,\"max_denoising_steps\":1", DROP_TOKENS);
    for (int i = 0; i < NDROP; i++) {
        struct conn *c = conn_new(C_DROP);
        if (!c)
            return;
        c->stage = S_PAUSED;
        c->reading = 0;
        for (int n = 0; n < DROP_GEN; n++)
            submit(c, 'd', 1, drop_settings);
        send_status(c, DROP_FLOOD);
        conn_events(c);
    }
    for (int i = NPAUSE; i < NCONN; i++)
        regular_next(&L.conns[i]);
    for (int k = 0; k < NRING; k++)
        ring_fill(k);
}

/* Timed steps of the round: status batches, resumes, vanishers. */
static void round_timers(void)
{
    const double t = now_ms();
    for (int i = 0; i < L.nconns; i++) {
        struct conn *c = &L.conns[i];
        if (c->kind == C_DROP && c->stage == S_PAUSED && c->hup) {
            /* dropped: read what is there */
            c->stage = S_READING;
            c->reading = 1;
            conn_read(c);
            continue;
        }
        if (c->kind != C_PAUSE || c->stage != S_PAUSED)
            continue;
        if (c->status_sent < c->status_target && t >= c->next_batch) {
            send_status(c, STATUS_BATCH);
            c->next_batch = t + BATCH_MS;
        }
        if (t >= c->resume_at && c->status_sent >= c->status_target) {
            c->stage = S_READING;
            c->reading = 1;
            if (c->hup && !c->in_epoll)
                conn_read(c); /* (hung up while paused: the rest is all there) */
            else
                conn_events(c);
        }
    }
    while (L.vans_started < NVAN && t >= L.t0 + 100.0 * L.vans_started)
        vanisher_start(L.vans_started++);
    if (!L.ring_van_done && t >= L.t0 + 1000) {
        L.ring_van_done = 1;
        ring_vanish();
    }
}

/* Per-connection progress after its events: stage changes. */
static void conn_progress(struct conn *c)
{
    /* (a refusal answers a request as an acceptance does: a vanisher whose
     * request was refused goes too, and the round ends; the refusal fails
     * the test at the end, as a busy one anywhere does) */
    if (c->kind == C_VANQ && c->stage == S_WAIT_ACC && c->accepted + c->refused == 3) {
        conn_close(c); /* with its requests accepted, most of them still queued */
        c->stage = S_FINISHED;
    }
    if (c->kind == C_VANM && c->stage == S_WAIT_ACC && c->refused > 0) {
        conn_close(c); /* its one request refused: no canvas will come */
        c->stage = S_FINISHED;
    }
    if (c->kind == C_PAUSE && c->stage == S_READING && c->status_seen == c->status_target &&
        c->inflight == 0) {
        c->stage = S_FINISHED;
        L.pausers_ok++;
    }
    if (c->kind == C_DROP && c->stage == S_READING && c->closed) {
        c->stage = S_FINISHED;
        if (c->status_seen >= c->status_sent)
            bad("a client with %d status answers unread was not dropped", c->status_sent);
        if (c->accepted != DROP_GEN)
            bad("a dropped client read %d of its %d accepted events", c->accepted, DROP_GEN);
        L.dropped++;
    }
}

/* What round's end still waits on, written into buf (n bytes) and returned;
 * NULL once the round is over. round_over and the timeout's message both use it,
 * so the message names exactly the condition that held the round open. */
static const char *round_open(char *buf, size_t n)
{
    static const char *const kinds[] = {"?", "regular", "pausing", "dropped",
                                        "vanishing after acceptance", "vanishing mid-stream",
                                        "vanishing at once"};
    static const char *const stages[] = {"idle", "waiting for acceptances", "paused", "reading",
                                         "finished"};
    if (L.sock_left > 0 || L.ring_left > 0) {
        snprintf(buf, n, "%d socket and %d ring requests not yet sent", L.sock_left, L.ring_left);
        return buf;
    }
    if (L.vans_started < NVAN) {
        snprintf(buf, n, "%d of %d vanishing clients started", L.vans_started, NVAN);
        return buf;
    }
    if (!L.ring_van_done) {
        snprintf(buf, n, "the ring's vanishing client not yet run");
        return buf;
    }
    for (int i = 0; i < L.nconns; i++) {
        const struct conn *c = &L.conns[i];
        if ((c->kind == C_REG && c->inflight > 0) ||
            (c->kind != C_REG && c->stage != S_FINISHED && c->stage != S_IDLE)) {
            snprintf(buf, n, "connection %d (%s, %s): %d in flight, %d accepted, %d sent, "
                     "%d refused, status answers %d seen of %d asked (target %d), closed %d, "
                     "eof %d, hup %d", i, kinds[c->kind], stages[c->stage], c->inflight,
                     c->accepted, c->nsent, c->refused, c->status_seen, c->status_sent,
                     c->status_target, c->closed, c->eof, c->hup);
            return buf;
        }
    }
    for (int i = 0; i < L.nrr; i++)
        if (L.rr[i].state == RQ_SENT) {
            snprintf(buf, n, "ring request %d sent and not yet completed", i);
            return buf;
        }
    return NULL;
}

static int round_over(void)
{
    char why[256];
    return round_open(why, sizeof why) == NULL;
}

/* Drive round r until every client of it is done; 0, or -1 on a timeout. */
static int run_round(int r)
{
    struct epoll_event evs[256];
    double last_poll = 0;
    round_start(r);
    while (!round_over()) {
        const int n = epoll_wait(L.ep, evs, 256, 10);
        for (int k = 0; k < n; k++) {
            const uint64_t u = evs[k].data.u64;
            if (u >> 32) {
                ring_reap((int)(u & 0xffff));
                continue;
            }
            {
                struct conn *c = &L.conns[u];
                if (c->fd < 0)
                    continue;
                if ((evs[k].events & EPOLLOUT))
                    conn_flush(c);
                if (c->reading && (evs[k].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                    conn_read(c);
                else if (!c->reading && (evs[k].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP))) {
                    /* dropped while it was not reading: read it at resume */
                    c->hup = 1;
                    epoll_ctl(L.ep, EPOLL_CTL_DEL, c->fd, NULL);
                    c->in_epoll = 0;
                }
                conn_progress(c);
            }
        }
        round_timers();
        for (int i = 0; i < L.nconns; i++)
            if (L.conns[i].kind != C_REG)
                conn_progress(&L.conns[i]);
        if (now_ms() - last_poll > 50) {
            /* (the doorbell is the way; this only makes sure) */
            last_poll = now_ms();
            for (int k = 0; k < NRING; k++)
                ring_reap(k);
        }
        if (now_ms() - L.t0 > ROUND_LIMIT_S * 1e3)
            return -1;
    }
    return 0;
}

/* ---- results ----------------------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile p of the sorted v[0..n-1]; NAN when empty. */
static double pct(const double *v, int n, double p)
{
    int k;
    if (n == 0)
        return NAN;
    k = (int)ceil(p / 100.0 * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* Check the metrics database against what the clients saw: one row per
 * accepted request with its finish, vanished ones cancelled (client_gone)
 * or finished, rows for requests no client heard about only from the
 * blind vanishers and the vanished ring client, refusals as seen. */
static int check_metrics(int *rows_out, int *van_queued_out, int *van_cancelled_out)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    uint64_t max_id = 0;
    int *by_id, rows = 0, rejected = 0, blind_rows = 0, ringvan_rows = 0, known = 0;
    int van_queued = 0, van_cancelled = 0;

    for (int i = 0; i < L.nrq; i++)
        max_id = L.rq[i].id > max_id ? L.rq[i].id : max_id;
    for (int i = 0; i < L.nrr; i++)
        max_id = L.rr[i].id > max_id ? L.rr[i].id : max_id;
    max_id += (uint64_t)(L.blind_sent + L.ring_van_jobs) + 1;
    by_id = calloc(max_id + 1, sizeof *by_id); /* 0: unknown; i+1: socket i; -(i+1): ring i */
    CHECK(by_id);
    for (int i = 0; i < L.nrq; i++)
        if (L.rq[i].id)
            by_id[L.rq[i].id] = i + 1, known++;
    for (int i = 0; i < L.nrr; i++)
        if (L.rr[i].id) {
            CHECKF(by_id[L.rr[i].id] == 0, "id %llu given twice", (unsigned long long)L.rr[i].id);
            by_id[L.rr[i].id] = -(i + 1), known++;
        }
    CHECKF(sqlite3_open_v2(db_path, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK, "open %s",
           db_path);
    CHECKF(sqlite3_prepare_v2(h, "SELECT request_id, finish, error_code, tag, source, "
                              "started IS NULL FROM requests", -1, &st, NULL) == SQLITE_OK,
           "%s", sqlite3_errmsg(h));
    while (sqlite3_step(st) == SQLITE_ROW) {
        const int has_id = sqlite3_column_type(st, 0) != SQLITE_NULL;
        const uint64_t id = (uint64_t)sqlite3_column_int64(st, 0);
        const enum finish f = finish_of((const char *)sqlite3_column_text(st, 1));
        const char *code = (const char *)sqlite3_column_text(st, 2);
        const char *tag = (const char *)sqlite3_column_text(st, 3);
        const char *source = (const char *)sqlite3_column_text(st, 4);
        const int never_started = sqlite3_column_int(st, 5);
        const int gone_ok = f == F_STOP || f == F_LENGTH ||
                            (f == F_CANCELLED && code && !strcmp(code, "client_gone"));
        rows++;
        if (!has_id) {
            if (f != F_REJECTED)
                bad("a row without a request id that is not a refusal");
            rejected++;
            continue;
        }
        if (id > max_id || by_id[id] == 0) {
            /* nobody heard of it: a blind vanisher's or the vanished ring client's */
            const int i = tag && tag[0] == 'r' ? atoi(tag + 1) : -1;
            if (i >= 0 && i < L.nrq && L.rq[i].kind == 'b' && !L.rq[i].row_seen && gone_ok) {
                L.rq[i].row_seen = 1;
                blind_rows++;
            } else if (!tag && source && !strcmp(source, "shm") && gone_ok) {
                ringvan_rows++;
            } else {
                bad("a row for request %llu (tag %s, %s) no client knows", (unsigned long long)id,
                    tag ? tag : "none", FINISH[f]);
            }
            continue;
        }
        if (by_id[id] > 0) {
            struct rq *q = &L.rq[by_id[id] - 1];
            if (q->row_seen++)
                bad("two rows for request %llu", (unsigned long long)id);
            if (!source || strcmp(source, "socket"))
                bad("request %llu: source %s", (unsigned long long)id, source ? source : "NULL");
            if (q->state == RQ_DONE && f != q->finish)
                bad("request %llu (r%d): the client saw %s, the row says %s",
                    (unsigned long long)id, by_id[id] - 1, FINISH[q->finish], FINISH[f]);
            if (q->state == RQ_ACCEPTED) {
                /* vanished or dropped before its done */
                if (!gone_ok)
                    bad("vanished request %llu: %s (%s)", (unsigned long long)id, FINISH[f],
                        code ? code : "no code");
                van_cancelled += f == F_CANCELLED;
                van_queued += f == F_CANCELLED && never_started;
            }
        } else {
            struct rrq *q = &L.rr[-by_id[id] - 1];
            if (q->row_seen++)
                bad("two rows for ring request %llu", (unsigned long long)id);
            if (!source || strcmp(source, "shm"))
                bad("ring request %llu: source %s", (unsigned long long)id,
                    source ? source : "NULL");
            if (f != q->finish)
                bad("ring request %llu: the client saw %s, the row says %s",
                    (unsigned long long)id, FINISH[q->finish], FINISH[f]);
        }
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    free(by_id);
    for (int i = 0; i < L.nrq; i++)
        if (L.rq[i].id && !L.rq[i].row_seen)
            bad("no row for request %llu (r%d, %c)", (unsigned long long)L.rq[i].id, i,
                L.rq[i].kind);
    for (int i = 0; i < L.nrr; i++)
        if (L.rr[i].id && !L.rr[i].row_seen)
            bad("no row for ring request %llu", (unsigned long long)L.rr[i].id);
    CHECKF(L.nerr == 0, "%d problems; the first: %s", L.nerr, L.err);
    CHECKF(rejected == L.busy + L.ring_refused, "%d refusal rows, the clients saw %d", rejected,
           L.busy + L.ring_refused);
    CHECKF(rows == known + blind_rows + ringvan_rows + rejected,
           "%d rows: %d known + %d blind + %d vanished ring + %d refused", rows, known, blind_rows,
           ringvan_rows, rejected);
    CHECKF(blind_rows <= L.blind_sent && ringvan_rows <= L.ring_van_jobs,
           "%d blind rows of %d sent, %d vanished-ring rows of %d", blind_rows, L.blind_sent,
           ringvan_rows, L.ring_van_jobs);
    printf("# metrics: %d rows = %d accepted requests the clients know + %d blind vanishers' + "
           "%d vanished ring jobs + %d refused; vanished: %d cancelled, %d of them queued\n",
           rows, known, blind_rows, ringvan_rows, rejected, van_cancelled, van_queued);
    *rows_out = rows;
    *van_queued_out = van_queued;
    *van_cancelled_out = van_cancelled;
    return 0;
}

/* ---- the case ---------------------------------------------------------------------------- */

static int load(void)
{
    struct rlimit rl;
    long rss[ROUNDS];
    int mon = -1, rows = 0, van_queued = 0, van_cancelled = 0, st = 0;
    double t_load0, t_load;
    json_t *last = NULL;
    long long lost;

    /* descriptors: ours and, inherited, the daemon's */
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    if (rl.rlim_cur < (rlim_t)MAX_CONNS + 100)
        return test_skip("RLIMIT_NOFILE hard limit %llu: %d connections need more",
                         (unsigned long long)rl.rlim_cur, NCONN);
    L.lat_sock = calloc(MAX_RQ, sizeof *L.lat_sock);
    L.lat_ring = calloc(MAX_RING, sizeof *L.lat_ring);
    CHECK(L.lat_sock && L.lat_ring);
    CHECK((L.ep = epoll_create1(EPOLL_CLOEXEC)) >= 0);
    CHECKF(start_daemon() == 0, "no daemon; log %s", log_path);
    CHECK((mon = fixture_connect(sock_path)) >= 0);
    for (int i = 0; i < NCONN; i++)
        CHECKF(conn_new(i < NPAUSE ? C_PAUSE : C_REG), "connection %d: %s", i, L.err);
    for (int k = 0; k < NRING; k++) {
        struct ring *g = &L.rings[k];
        dgemma_ring_opts_t opts = {256, 256, 0, 0};
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = (1ull << 32) | (uint64_t)k};
        CHECK((g->c = dgemma_new()) != NULL);
        CHECKF(dgemma_connect(g->c, sock_path, 5) == 0, "%s", dgemma_errmsg(g->c));
        CHECKF(dgemma_ring_attach(g->c, &opts, &g->r) == 0, "%s", dgemma_errmsg(g->c));
        CHECK(epoll_ctl(L.ep, EPOLL_CTL_ADD, dgemma_ring_fd(g->r), &e) == 0);
    }
    t_load0 = now_ms();
    for (int r = 0; r < ROUNDS; r++) {
        const double t = now_ms();
        const long in_pause_before = L.done_in_pause;
        char why[256];
        const int late = run_round(r) != 0;
        const char *open = late ? round_open(why, sizeof why) : NULL;
        CHECKF(!late, "round %d not over after %d s: still open: %s; first problem: %s", r,
               ROUND_LIMIT_S, open ? open : "nothing, as the time ran out",
               L.err[0] ? L.err : "none");
        CHECKF(L.nerr == 0, "round %d: %d problems; the first: %s", r, L.nerr, L.err);
        CHECKF(L.done_in_pause > in_pause_before,
               "round %d: no request finished while the slow readers were not reading", r);
        CHECKF(wait_idle(mon, &last) == 0, "round %d: the daemon does not settle: %s", r,
               last ? json_dumps(last, JSON_COMPACT) : "no status");
        rss[r] = fixture_proc_kib(daemon_pid, "VmRSS");
        printf("# round %d: %.1f s, RSS %ld KiB, %ld done while slow readers paused\n", r,
               (now_ms() - t) / 1e3, rss[r], L.done_in_pause - in_pause_before);

        fflush(stdout);
    }
    t_load = now_ms() - t_load0;
    lost = jint(last, "metrics", "lost");
    json_decref(last);
    CHECKF(lost == 0, "metrics: %lld records lost", lost);
    /* every request finished: the regular and ring ones with a done */
    for (int i = 0; i < L.nrq; i++)
        if (L.rq[i].kind == 'r' || L.rq[i].kind == 'p')
            CHECKF(L.rq[i].state == RQ_DONE || L.rq[i].state == RQ_REFUSED,
                   "r%d (%c) never finished (state %d)", i, L.rq[i].kind, L.rq[i].state);
    for (int i = 0; i < L.nrr; i++)
        CHECKF(L.rr[i].state == RQ_DONE, "ring job %d never finished", i);
    CHECKF(L.pausers_ok == ROUNDS * NPAUSE, "%d of %d slow readers got everything", L.pausers_ok,
           ROUNDS * NPAUSE);
    CHECKF(L.dropped == ROUNDS * NDROP, "%d of %d non-reading clients dropped", L.dropped,
           ROUNDS * NDROP);
    CHECKF(L.busy == 0, "%d requests refused as busy", L.busy);
    /* SIGTERM with every connection open: a clean exit */
    kill(daemon_pid, SIGTERM);
    CHECK(fixture_wait_exit(daemon_pid, &st) == 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dgemmad: status %#x; log %s", st, log_path);
    CHECKF(log_has("the client is too slow"),
           "the log does not say why clients were dropped");
    daemon_pid = 0;
    for (int k = 0; k < NRING; k++) {
        dgemma_ring_detach(L.rings[k].r);
        dgemma_close(L.rings[k].c);
    }
    for (int i = 0; i < L.nconns; i++)
        conn_close(&L.conns[i]);
    close(mon);
    if (check_metrics(&rows, &van_queued, &van_cancelled))
        return 1;
    CHECKF(van_cancelled > 0 && van_queued > 0,
           "vanished requests: %d cancelled, %d of them queued", van_cancelled, van_queued);
    {
        int socket_n = 0, reg = 0;
        double sp50, sp99, smax, rp50, rp99, rmax;
        const long growth = rss[ROUNDS - 1] - rss[0];
        for (int i = 0; i < L.nrq; i++)
            socket_n += L.rq[i].id != 0;
        for (int i = 0; i < L.nrq; i++)
            reg += L.rq[i].kind == 'r';
        qsort(L.lat_sock, (size_t)L.n_lat_sock, sizeof *L.lat_sock, cmp_d);
        qsort(L.lat_ring, (size_t)L.n_lat_ring, sizeof *L.lat_ring, cmp_d);
        sp50 = pct(L.lat_sock, L.n_lat_sock, 50);
        sp99 = pct(L.lat_sock, L.n_lat_sock, 99);
        smax = pct(L.lat_sock, L.n_lat_sock, 100);
        rp50 = pct(L.lat_ring, L.n_lat_ring, 50);
        rp99 = pct(L.lat_ring, L.n_lat_ring, 99);
        rmax = pct(L.lat_ring, L.n_lat_ring, 100);
        printf("# load: %d connections held (+%d rings); %d requests (socket %d, ring %d; "
               "%d vanished-client, %d dropped-client) in %.1f s, %.0f req/s; socket p50 %.0f "
               "p99 %.0f max %.0f ms; ring p50 %.0f p99 %.0f max %.0f ms; RSS warm %ld KiB, end "
               "%ld KiB (%+ld KiB)%s\n",
               NCONN, NRING, socket_n + L.nrr, socket_n, L.nrr,
               ROUNDS * NVAN, ROUNDS * NDROP, t_load / 1e3, (socket_n + L.nrr) / (t_load / 1e3),
               sp50, sp99, smax, rp50, rp99, rmax, rss[0], rss[ROUNDS - 1], growth,
#ifdef LOAD_ASAN
               " [AddressSanitizer: RSS not bounded]"
#else
               ""
#endif
        );
        fflush(stdout);
        CHECKF(L.n_lat_sock == reg && reg > 0, "%d socket latencies for %d requests", L.n_lat_sock,
               reg);
        CHECKF(isfinite(sp99) && isfinite(rp99) && L.n_lat_ring == L.nrr, "p99 %f / %f", sp99,
               rp99);
        CHECKF(socket_n + L.nrr >= MIN_TOTAL, "only %d requests", socket_n + L.nrr);
        CHECK(rows >= socket_n + L.nrr);
#ifndef LOAD_ASAN
        CHECKF(rss[0] > 0 && growth <= RSS_BOUND_KIB,
               "the daemon's RSS grew by %ld KiB after the warm-up (bound %d KiB)", growth,
               RSS_BOUND_KIB);
#endif
    }
    free(L.lat_sock);
    free(L.lat_ring);
    close(L.ep);
    return 0;
}

int main(void)
{
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    snprintf(db_path, sizeof db_path, "%s", test_path("metrics.sqlite"));
    signal(SIGPIPE, SIG_IGN);
    TEST_CASE(load);
    return fixture_finish(daemon_pid, NULL);
}
