/*
 * Description: the real dgemmad (from $BUILD/bin) on the embedded default
 * model, driven over its UNIX socket: streamed and whole generation,
 * concurrent clients with different settings batched together (fewer
 * engine steps than one after another, and the same outputs), cancel
 * mid-request, a client that vanishes mid-stream, a half-closed client,
 * every kind of bad input (the connection stays usable), a full queue,
 * too many connections, a daemon out of file descriptors (new clients
 * wait in the backlog until some free; two log lines a wait, not one a
 * tick), a second daemon refused on a live socket, a stale
 * socket replaced, the start's status lines and then readiness sent to
 * $NOTIFY_SOCKET, the log reopened on SIGHUP, SIGTERM during generation
 * ending cleanly, a done line longer than max_output_bytes reaching a
 * client that keeps up, thousands of requests written at once answered,
 * whether the client reads at once or later, and a client that reads
 * nothing dropped with no more than send_buffer_bytes' worth held in the
 * kernel for it, and a send_buffer_bytes past net.core.wmem_max warned of
 * at start.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define WAIT_MS FIXTURE_WAIT_MS

static char daemon_bin[512], sock_path[512], log_path[512], notify_path[512];
static pid_t daemon_pid;
static int notify_fd = -1;

#define now_ms fixture_now_ms
#define spawn fixture_spawn
#define try_connect fixture_connect
#define wait_ready fixture_wait_ready
#define wait_exit fixture_wait_exit
#define file_has fixture_file_has

/* Whether the log at path has needle within WAIT_MS (a line the daemon
 * writes a moment after what the test saw happen). */
static int log_soon(const char *path, const char *needle)
{
    const double t0 = now_ms();
    while (!file_has(path, needle) && now_ms() - t0 < WAIT_MS)
        usleep(20000);
    return file_has(path, needle);
}

/* ---- a client ----------------------------------------------------------------- */

#define cl_open() fixture_cl_open(sock_path)
#define cl_close fixture_cl_close
#define cl_send fixture_cl_send

#define cl_event fixture_cl_event
#define ev_kind fixture_ev_kind
#define ev_int fixture_ev_int

/* Events of one request until its done (or an error): returns the done. */
struct run {
    long long id;
    json_t *done;
    char text[65536];
    size_t text_len;
    int ids[4096], n_ids;
    int canvases, tokens;
};

static int collect(struct fixture_cl *c, struct run *r)
{
    memset(r, 0, sizeof *r);
    for (;;) {
        int eof;
        json_t *e = cl_event(c, &eof);
        const char *k;
        if (!e)
            return -1;
        k = ev_kind(e);
        if (!strcmp(k, "accepted")) {
            r->id = ev_int(e, "id");
        } else if (!strcmp(k, "canvas")) {
            const json_t *ids = json_object_get(e, "ids"), *t = json_object_get(e, "text");
            size_t i;
            json_t *v;
            r->canvases++;
            r->tokens += (int)ev_int(e, "tokens");
            json_array_foreach(ids, i, v)
                if (r->n_ids < 4096)
                    r->ids[r->n_ids++] = (int)json_integer_value(v);
            if (json_is_string(t) && r->text_len + json_string_length(t) < sizeof r->text) {
                memcpy(r->text + r->text_len, json_string_value(t), json_string_length(t));
                r->text_len += json_string_length(t);
            }
        } else if (!strcmp(k, "done") || !strcmp(k, "error")) {
            r->done = e;
            return 0;
        }
        json_decref(e);
    }
}

/* status, on a fresh connection */
static json_t *status(void)
{
    return fixture_status(sock_path);
}

static long long status_int(const char *key)
{
    json_t *s = status();
    long long v = s ? ev_int(s, key) : -1;
    json_decref(s);
    return v;
}

/* ---- cases ------------------------------------------------------------------------ */

static const char *const DAEMON_OPTS[] = {
    "max_batch=4", "queue_max=2", "max_line_bytes=4096", "shutdown_grace=1", "tick=0.05",
    "max_connections=16", "pin_workers=false", "log_level=debug", NULL,
};

static int start(void)
{
    snprintf(daemon_bin, sizeof daemon_bin, "%s", fixture_bin("dgemmad"));
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    CHECKF(access(daemon_bin, X_OK) == 0, "%s: not built", daemon_bin);
    {
        /* a systemd-like notification socket for the first daemon */
        struct sockaddr_un a;
        snprintf(notify_path, sizeof notify_path, "%s", test_path("notify"));
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        snprintf(a.sun_path, sizeof a.sun_path, "%s", notify_path);
        notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        CHECK(notify_fd >= 0 && bind(notify_fd, (struct sockaddr *)&a, sizeof a) == 0);
        setenv("NOTIFY_SOCKET", notify_path, 1);
    }
    daemon_pid = spawn(sock_path, log_path, DAEMON_OPTS);
    unsetenv("NOTIFY_SOCKET");
    CHECKF(wait_ready(daemon_pid, sock_path) == 0, "the daemon did not come up; log %s",
           log_path);
    /* (the socket answers a moment before the line that says so) */
    CHECK(log_soon(log_path, "ready: socket"));
    {
        /* the start's status lines (loading the model, then the backend),
         * then READY=1 */
        char msg[256];
        int loading = 0, backend = 0, ready = 0;
        while (!ready) {
            struct pollfd p = {notify_fd, POLLIN, 0};
            ssize_t n;
            CHECKF(poll(&p, 1, 5000) == 1, "no READY=1 within 5 s (loading %d, backend %d)",
                   loading, backend);
            n = recv(notify_fd, msg, sizeof msg - 1, 0);
            CHECK(n > 0);
            msg[n] = '\0';
            if (strstr(msg, "STATUS=loading the model"))
                loading = 1;
            else if (strstr(msg, "STATUS=starting the backend"))
                backend = loading;
            else
                ready = strstr(msg, "READY=1") != NULL;
            CHECKF(ready || loading, "notification '%s' before the loading status", msg);
        }
        CHECKF(loading && backend, "READY=1 without the start's status lines (%d, %d)", loading,
               backend);
    }
    return 0;
}

static int sighup_reopens_log(void)
{
    char moved[600];
    snprintf(moved, sizeof moved, "%s.1", log_path);
    CHECK(rename(log_path, moved) == 0);
    CHECK(kill(daemon_pid, SIGHUP) == 0);
    CHECK(log_soon(log_path, "SIGHUP: log reopened"));
    CHECK(file_has(moved, "ready: socket"));
    return 0;
}

static int streamed_generate(void)
{
    struct fixture_cl *c = cl_open();
    struct run a, b;
    CHECK(c);
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"Once upon a time\",\"tag\":\"s1\","
                     "\"max_tokens\":40,\"seed\":11,\"max_denoising_steps\":4}\n") == 0);
    CHECK(collect(c, &a) == 0 && !strcmp(ev_kind(a.done), "done"));
    CHECK(a.id >= 1 && ev_int(a.done, "id") == a.id);
    CHECK(!strcmp(json_string_value(json_object_get(a.done, "tag")), "s1"));
    CHECK(a.canvases == ev_int(a.done, "canvases") && a.canvases >= 1);
    CHECK(a.tokens == ev_int(json_object_get(a.done, "usage"), "completion_tokens"));
    CHECK(a.tokens == a.n_ids && a.tokens <= 40);
    /* the same request, not streamed: the same ids and text in the done */
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"Once upon a time\",\"stream\":false,"
                     "\"max_tokens\":40,\"seed\":11,\"max_denoising_steps\":4}\n") == 0);
    CHECK(collect(c, &b) == 0 && !strcmp(ev_kind(b.done), "done") && b.canvases == 0);
    {
        const json_t *ids = json_object_get(b.done, "ids"), *t = json_object_get(b.done, "text");
        CHECK((int)json_array_size(ids) == a.n_ids);
        for (int i = 0; i < a.n_ids; i++)
            CHECK(json_integer_value(json_array_get(ids, (size_t)i)) == a.ids[i]);
        CHECK(json_string_length(t) == a.text_len &&
              !memcmp(json_string_value(t), a.text, a.text_len));
    }
    json_decref(a.done);
    json_decref(b.done);
    cl_close(c);
    return 0;
}

#define NB 4

static const char *batch_request(int k)
{
    static char buf[NB][512];
    snprintf(buf[k], sizeof buf[k],
             "{\"v\":1,\"op\":\"generate\",\"prompt\":\"request %d, a different prompt\","
             "\"max_tokens\":%d,\"seed\":%d,\"max_denoising_steps\":5,\"canvas_length\":%d%s}\n",
             k, 48 + 16 * k, 100 + k, k % 2 ? 16 : 32,
             k == 2 ? ",\"top_k\":20" : k == 3 ? ",\"top_p\":0.9,\"entropy_bound\":1.0" : "");
    return buf[k];
}

static int concurrent_batching(void)
{
    static struct run seq[NB], conc[NB];
    struct fixture_cl *c[NB];
    long long s0, s1, s2;

    /* one after another */
    s0 = status_int("engine_steps");
    for (int k = 0; k < NB; k++) {
        struct fixture_cl *one = cl_open();
        CHECK(one && cl_send(one, batch_request(k)) == 0);
        CHECK(collect(one, &seq[k]) == 0 && !strcmp(ev_kind(seq[k].done), "done"));
        cl_close(one);
    }
    s1 = status_int("engine_steps");
    /* all at once, from NB clients */
    for (int k = 0; k < NB; k++)
        CHECK((c[k] = cl_open()) != NULL);
    for (int k = 0; k < NB; k++)
        CHECK(cl_send(c[k], batch_request(k)) == 0);
    for (int k = 0; k < NB; k++) {
        CHECK(collect(c[k], &conc[k]) == 0 && !strcmp(ev_kind(conc[k].done), "done"));
        cl_close(c[k]);
    }
    s2 = status_int("engine_steps");
    printf("# %d requests: %lld engine steps one after another, %lld together\n", NB, s1 - s0,
           s2 - s1);
    CHECKF(2 * (s2 - s1) < s1 - s0, "batched %lld steps, sequential %lld", s2 - s1, s1 - s0);
    for (int k = 0; k < NB; k++) {
        CHECKF(conc[k].n_ids == seq[k].n_ids &&
                   !memcmp(conc[k].ids, seq[k].ids, sizeof(int) * (size_t)seq[k].n_ids),
               "request %d: different tokens batched", k);
        json_decref(seq[k].done);
        json_decref(conc[k].done);
    }
    return 0;
}

/* Send FIXTURE_LONG_REQ on c (NULL: fails) and take its accepted and first
 * canvas events: the request is running. */
static int long_req_started(struct fixture_cl *c)
{
    json_t *e;
    int eof;
    CHECK(c && cl_send(c, FIXTURE_LONG_REQ) == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "accepted"));
    json_decref(e);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "canvas"));
    json_decref(e);
    return 0;
}

static int cancel_mid_request(void)
{
    struct fixture_cl *c = cl_open();
    json_t *e;
    long long id;
    int eof;
    CHECK(c && cl_send(c, FIXTURE_LONG_REQ) == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "accepted"));
    id = ev_int(e, "id");
    json_decref(e);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "canvas"));
    json_decref(e);
    {
        char msg[128];
        snprintf(msg, sizeof msg, "{\"v\":1,\"op\":\"cancel\",\"id\":%lld}\n", id);
        CHECK(cl_send(c, msg) == 0);
    }
    for (int acked = 0;;) {
        e = cl_event(c, &eof);
        CHECK(e);
        if (!strcmp(ev_kind(e), "done"))
            break;
        if (!strcmp(ev_kind(e), "cancelling")) {
            CHECK(ev_int(e, "id") == id && !acked);
            acked = 1;
        } else {
            CHECKF(!strcmp(ev_kind(e), "canvas"), "event %s: %s", ev_kind(e),
                   json_string_value(json_object_get(e, "message")));
        }
        json_decref(e);
    }
    CHECK(!strcmp(json_string_value(json_object_get(e, "finish_reason")), "cancelled"));
    CHECK(ev_int(json_object_get(e, "usage"), "completion_tokens") < 4000);
    json_decref(e);
    /* the connection still serves */
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"status\"}\n") == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "status") && ev_int(e, "running") == 0);
    json_decref(e);
    cl_close(c);
    return 0;
}

static int client_vanishes(void)
{
    struct fixture_cl *c = cl_open();
    const long long cancelled = status_int("cancelled");
    double t0;
    CHECK(long_req_started(c) == 0);
    cl_close(c); /* mid-stream */
    t0 = now_ms();
    while (status_int("running") != 0 && now_ms() - t0 < WAIT_MS)
        usleep(20000);
    CHECK(status_int("running") == 0);
    CHECK(status_int("cancelled") == cancelled + 1);
    CHECK(file_has(log_path, "cancelled: its client went away"));
    return 0;
}

static int half_closed_client(void)
{
    struct fixture_cl *c = cl_open();
    struct run r;
    int eof;
    CHECK(c && cl_send(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"half\",\"max_tokens\":20,"
                          "\"max_denoising_steps\":3,\"seed\":1}\n") == 0);
    CHECK(shutdown(c->fd, SHUT_WR) == 0);
    CHECK(collect(c, &r) == 0 && !strcmp(ev_kind(r.done), "done"));
    json_decref(r.done);
    /* then the daemon closes its side */
    CHECK(cl_event(c, &eof) == NULL && eof);
    cl_close(c);
    return 0;
}

static int expect_error(struct fixture_cl *c, const char *line, const char *code, const char *needle)
{
    json_t *e;
    int eof;
    CHECK(cl_send(c, line) == 0);
    e = cl_event(c, &eof);
    CHECKF(e && !strcmp(ev_kind(e), "error"), "no error event for %.80s", line);
    CHECKF(!strcmp(json_string_value(json_object_get(e, "code")), code) &&
               strstr(json_string_value(json_object_get(e, "message")), needle),
           "%.60s: got %s: %s", line, json_string_value(json_object_get(e, "code")),
           json_string_value(json_object_get(e, "message")));
    json_decref(e);
    return 0;
}

/* The log at path, read from byte `from` on (NULL: not there). */
static FILE *log_from(const char *path, long from)
{
    FILE *f = fopen(path, "r");
    if (f && fseek(f, from, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    return f;
}

/* Lines of the log at path from byte `from` on holding both needles. */
static int log_count(const char *path, long from, const char *a, const char *b)
{
    FILE *f = log_from(path, from);
    char line[4096];
    int n = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        n += strstr(line, a) && strstr(line, b);
    fclose(f);
    return n;
}

/* The refusals the log at path, from byte `from` on, says were held back
 * ("N more refusals in the ..." lines, summed). */
static long log_held(const char *path, long from)
{
    static const char needle[] = " more refusals in the ";
    FILE *f = log_from(path, from);
    char line[4096];
    long n = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        char *at = strstr(line, needle), *p;
        if (!at)
            continue;
        for (p = at; p > line && p[-1] >= '0' && p[-1] <= '9'; p--)
            ;
        n += strtol(p, NULL, 10);
    }
    fclose(f);
    return n;
}

static long log_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Refusals are logged at info level, 10 in 10 s at most: a client that
 * sends 60 bad lines at once gets between 1 and 20 lines (two windows),
 * the daemon having refused nothing before; the rest are counted, and the
 * last window's count is logged by the daemon's tick once the window is
 * over, with no refusal after it (refusals_counted, a case later: within
 * the window and a few ticks the info lines and the counts add up to the
 * 60; the cases between them use daemons of their own, so that the wait
 * for the window overlaps their work and nothing else is refused). */
static long refusals_from = -1; /* the log's size before the 60 */
static int refusals_info;       /* of them, logged at info level */

static int refusals_logged(void)
{
    struct fixture_cl *c = cl_open();
    const long from = log_size(log_path);
    int n;

    CHECK(c);
    for (int i = 0; i < 60; i++)
        CHECK(expect_error(c, "{\"v\":1,\"op\":\"fly\"}\n", "unknown_op", "fly") == 0);
    cl_close(c);
    n = log_count(log_path, from, " I conn ", "refused: unknown_op: ");
    CHECKF(n >= 1 && n <= 20, "%d refusals logged at info level", n);
    CHECK(log_count(log_path, from, " I conn ", " uid=") >= 1);
    refusals_from = from;
    refusals_info = n;
    return 0;
}

static int refusals_counted(void)
{
    const long from = refusals_from;
    const int n = refusals_info;
    CHECKF(from >= 0, "refusals_logged failed");
    for (int waited = 0; waited < 250 && n + log_held(log_path, from) < 60; waited++)
        usleep(100 * 1000);
    CHECKF(n + log_held(log_path, from) == 60, "%d refusals at info level and %ld counted after "
           "25 s, not 60", n, log_held(log_path, from));
    return 0;
}

static int bad_input(void)
{
    struct fixture_cl *c = cl_open();
    char big[6000];
    json_t *e;
    int eof;

    CHECK(c);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\n", "bad_json", "malformed JSON") == 0);
    CHECK(expect_error(c, "[1,2]\n", "bad_request", "JSON object") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":5}\n", "bad_request",
                       "prompt: expected a string") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"x\",\"temprature\":1}\n",
                       "bad_request", "temprature: unknown setting") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":\"9\"}\n",
                       "bad_request", "max_tokens") == 0);
    CHECK(expect_error(c, "{\"v\":2,\"op\":\"status\"}\n", "bad_version", "version 1") == 0);
    CHECK(expect_error(c, "{\"op\":\"status\"}\n", "bad_request", "v: missing") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"fly\"}\n", "unknown_op", "fly") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"status\",\"x\":1}\n", "bad_request",
                       "x: unknown field") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2,999999]}\n",
                       "bad_request", "outside the vocabulary") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[]}\n", "bad_request",
                       "empty") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"\xff\xfe\"}\n", "bad_json",
                       "") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"cancel\",\"id\":424242}\n", "not_found",
                       "not in flight") == 0);
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"tag\":\"t9\",\"messages\":[{\"role\":"
                          "\"tool\",\"content\":\"x\"}]}\n", "bad_request", "role") == 0);
    /* a prompt and max_tokens past max_context (8,192 positions: 3 + 256
     * canvases of 32): refused before it is accepted, so a client waiting
     * for the done line of an accepted request is never left without one */
    CHECK(expect_error(c, "{\"v\":1,\"op\":\"generate\",\"tag\":\"ctx\",\"prompt_ids\":[2,3,4],"
                          "\"max_tokens\":8192,\"seed\":1}\n",
                       "too_large", "8195 positions") == 0);
    /* an oversize line, in pieces: too_large, and the next line still works */
    static const char head[] = "{\"v\":1,\"op\":\"generate\",\"prompt\":\"";
    memset(big, 'a', sizeof big);
    memcpy(big, head, sizeof head - 1);
    big[sizeof big - 2] = '"';
    big[sizeof big - 1] = '\0';
    CHECK(cl_send(c, big) == 0 && cl_send(c, "}\n") == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(json_string_value(json_object_get(e, "code")), "too_large"));
    json_decref(e);
    /* a tag comes back with the error */
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"fly\",\"tag\":\"mine\"}\n") == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(json_string_value(json_object_get(e, "tag")), "mine"));
    json_decref(e);
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"status\"}\n") == 0);
    e = cl_event(c, &eof);
    CHECK(e && !strcmp(ev_kind(e), "status"));
    json_decref(e);
    cl_close(c);
    return 0;
}

static int queue_full(void)
{
    struct fixture_cl *c = cl_open();
    long long ids[8];
    int accepted = 0, busy = 0, dones = 0, eof;
    CHECK(c);
    /* 4 run, 2 wait, the 7th finds the queue full */
    for (int k = 0; k < 7; k++)
        CHECK(cl_send(c, FIXTURE_LONG_REQ) == 0);
    while (accepted + busy < 7) {
        json_t *e = cl_event(c, &eof);
        CHECK(e);
        if (!strcmp(ev_kind(e), "accepted"))
            ids[accepted++] = ev_int(e, "id");
        else if (!strcmp(ev_kind(e), "error")) {
            CHECK(!strcmp(json_string_value(json_object_get(e, "code")), "busy"));
            busy++;
        }
        json_decref(e);
    }
    CHECK(accepted == 6 && busy == 1);
    for (int k = 0; k < accepted; k++) {
        char msg[128];
        snprintf(msg, sizeof msg, "{\"v\":1,\"op\":\"cancel\",\"id\":%lld}\n", ids[k]);
        CHECK(cl_send(c, msg) == 0);
    }
    while (dones < accepted) {
        json_t *e = cl_event(c, &eof);
        CHECK(e);
        CHECK(!strcmp(ev_kind(e), "done") || !strcmp(ev_kind(e), "cancelling") ||
              !strcmp(ev_kind(e), "canvas"));
        if (!strcmp(ev_kind(e), "done")) {
            CHECK(!strcmp(json_string_value(json_object_get(e, "finish_reason")), "cancelled"));
            dones++;
        }
        json_decref(e);
    }
    cl_close(c);
    return 0;
}

static int too_many_connections(void)
{
    struct fixture_cl *c[16];
    struct fixture_cl *extra;
    json_t *e;
    int eof, n = 0;
    /* max_connections 16: the 17th gets busy and is closed */
    for (; n < 16; n++)
        CHECK((c[n] = cl_open()) != NULL);
    /* make sure the daemon accepted all of them */
    CHECK(cl_send(c[15], "{\"v\":1,\"op\":\"status\"}\n") == 0);
    e = cl_event(c[15], &eof);
    CHECK(e && ev_int(e, "connections") == 16);
    json_decref(e);
    CHECK((extra = cl_open()) != NULL);
    e = cl_event(extra, &eof);
    CHECK(e && !strcmp(json_string_value(json_object_get(e, "code")), "busy"));
    json_decref(e);
    CHECK(cl_event(extra, &eof) == NULL && eof);
    cl_close(extra);
    /* one that writes its request before it reads, as clients do, after
     * the daemon has refused it: the write goes through and the busy line
     * is there to read (the daemon closed at once: the write met EPIPE, or
     * a request already in met a reset, and the line was lost) */
    CHECK((extra = cl_open()) != NULL);
    usleep(200 * 1000); /* (refused by now) */
    CHECK(cl_send(extra, "{\"v\":1,\"op\":\"status\"}\n") == 0);
    e = cl_event(extra, &eof);
    CHECKF(e && !strcmp(json_string_value(json_object_get(e, "code")), "busy"), "%s",
           e ? "another event" : eof ? "end of stream" : "nothing");
    json_decref(e);
    CHECK(cl_event(extra, &eof) == NULL && eof);
    cl_close(extra);
    for (int k = 0; k < n; k++)
        cl_close(c[k]);
    return 0;
}

/* A daemon out of file descriptors (its soft RLIMIT_NOFILE lowered, from
 * here, to what it holds and two more): eight clients connect and each
 * sends a status request.  Those the free descriptors allow are taken and
 * answered; the others wait in the socket's backlog, unanswered, while
 * every accept fails (EMFILE) at each tick of 20 ms, and they are taken
 * and answered as the answered ones close.  The log says when accepts
 * begin to fail and when they work again, not at every tick, and no more
 * than 4 such lines a minute; with the limit back the daemon serves as
 * before and stops cleanly. */
static int out_of_descriptors(void)
{
    enum { N = 8 };
    const char *opts[] = {"tick=0.02", "pin_workers=false", NULL};
    char sock2[600], log5[600];
    struct fixture_cl *c[N] = {0};
    int answered[N] = {0};
    struct rlimit low, was;
    json_t *e;
    int st, held, begins, ends, n_answered = 0, n_first;
    pid_t p;

    snprintf(sock2, sizeof sock2, "%s", test_path("nofd.sock"));
    snprintf(log5, sizeof log5, "%s", test_path("nofd.log"));
    p = spawn(sock2, log5, opts);
    CHECKF(wait_ready(p, sock2) == 0, "the daemon did not come up; log %s", log5);
    usleep(200000); /* (wait_ready's probe closed) */
    CHECK((held = fixture_fds_open(p)) > 0);
    CHECK(prlimit(p, RLIMIT_NOFILE, NULL, &was) == 0);
    low = was; /* (the soft limit: the daemon raises it only at its start) */
    low.rlim_cur = (rlim_t)held + 2;
    CHECK(prlimit(p, RLIMIT_NOFILE, &low, NULL) == 0);
    for (int k = 0; k < N; k++) {
        CHECK((c[k] = fixture_cl_open(sock2)) != NULL); /* (the backlog takes it) */
        CHECK(cl_send(c[k], "{\"v\":1,\"op\":\"status\"}\n") == 0);
    }
    /* those taken answer; then nothing more for two rounds of reads of
     * 100 ms a client waiting (more than 25 ticks) */
    for (int quiet = 0; quiet < 2;) {
        int got = 0;
        for (int k = 0; k < N; k++) {
            if (answered[k])
                continue;
            st = fixture_cl_read(c[k], &e, 1);
            CHECKF(st == FIXTURE_EV_OK || st == FIXTURE_EV_TIMEOUT, "client %d: %s", k,
                   st == FIXTURE_EV_EOF ? "EOF" : "a bad line");
            if (st == FIXTURE_EV_OK) {
                CHECKF(!strcmp(ev_kind(e), "status"), "client %d: %s", k, ev_kind(e));
                json_decref(e);
                answered[k] = 1;
                n_answered++;
                got = 1;
            }
        }
        quiet = got ? 0 : quiet + 1;
    }
    n_first = n_answered;
    CHECKF(n_first >= 1 && n_first < N, "%d of %d answered with 2 descriptors free (log %s)",
           n_first, N, log5);
    /* one answered client closes, and the next waiting one is taken and
     * answered; then the next closes: a wait (and its two lines) a client */
    for (int k = 0, shut = 0; k < N; k++) {
        if (answered[k])
            continue;
        while (!c[shut])
            shut++;
        fixture_cl_close(c[shut]);
        c[shut] = NULL;
        CHECKF(fixture_cl_read(c[k], &e, WAIT_MS) == FIXTURE_EV_OK, "client %d: no answer "
               "after client %d closed (log %s)", k, shut, log5);
        CHECKF(!strcmp(ev_kind(e), "status"), "client %d: %s", k, ev_kind(e));
        json_decref(e);
        answered[k] = 1;
        n_answered++;
    }
    for (int k = 0; k < N; k++)
        fixture_cl_close(c[k]);
    CHECK(n_answered == N);
    CHECK(prlimit(p, RLIMIT_NOFILE, &was, NULL) == 0);
    e = fixture_status(sock2);
    CHECK(e && !strcmp(ev_kind(e), "status"));
    json_decref(e);
    /* dozens of failed accepts (25 ticks and more), said in one line when
     * they began and one when they ended, a pair a wait, at most 4 lines a
     * minute (the rest at debug level) */
    CHECKF(log_soon(log5, "accept works again"), "log %s", log5);
    begins = log_count(log5, 0, "accept: Too many open files", "");
    CHECKF(begins >= 1 && begins <= 2, "%d lines of failed accepts (log %s)", begins, log5);
    ends = log_count(log5, 0, "accept works again", "");
    CHECKF(ends == begins, "%d lines of accepts working again, %d of failing (log %s)", ends,
           begins, log5);
    printf("# out_of_descriptors: %d of %d answered at first, %d waits logged\n", n_first, N,
           begins);
    CHECK(fixture_stop(p, log5) == 0);
    return 0;
}

static int second_daemon_refused(void)
{
    char log2[600];
    int st;
    pid_t p;
    snprintf(log2, sizeof log2, "%s", test_path("second.log"));
    p = spawn(sock_path, log2, DAEMON_OPTS);
    CHECK(wait_exit(p, &st) == 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(file_has(log2, "another dgemmad is serving it"));
    /* and the first one still serves */
    CHECK(status_int("running") == 0);
    return 0;
}

static int sigterm_during_generation(void)
{
    struct fixture_cl *c = cl_open();
    json_t *e;
    int eof, st, saw_done = 0;
    struct stat sb;
    CHECK(long_req_started(c) == 0);
    CHECK(kill(daemon_pid, SIGTERM) == 0);
    {
        /* systemd hears of the stop as it begins, while the request still
         * runs (its grace is 1 s), not once the daemon is gone */
        char msg[256];
        struct pollfd pf = {notify_fd, POLLIN, 0};
        ssize_t n;
        CHECK(poll(&pf, 1, 900) == 1);
        n = recv(notify_fd, msg, sizeof msg - 1, MSG_DONTWAIT);
        CHECK(n > 0);
        msg[n] = '\0';
        CHECKF(strstr(msg, "STOPPING=1"), "%s", msg);
        CHECK(kill(daemon_pid, 0) == 0);
    }
    /* the request ends (cancelled after the 1 s grace), then the connection */
    while ((e = cl_event(c, &eof)) != NULL) {
        if (!strcmp(ev_kind(e), "done")) {
            CHECK(!strcmp(json_string_value(json_object_get(e, "finish_reason")), "cancelled"));
            saw_done = 1;
        }
        json_decref(e);
    }
    CHECK(saw_done && eof);
    cl_close(c);
    CHECK(wait_exit(daemon_pid, &st) == 0);
    daemon_pid = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    CHECK(stat(sock_path, &sb) != 0); /* the socket is gone */
    CHECK(file_has(log_path, "SIGTERM: shutting down") && file_has(log_path, "dgemmad stopped"));
    return 0;
}

/* Set key of the JSON object in file path (of its member object sub
 * when sub is not NULL) to v (taken). */
static int json_file_set(const char *path, const char *sub, const char *key, json_t *v)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je), *at = sub && o ? json_object_get(o, sub) : o;
    int rc = at && json_object_set_new(at, key, v) == 0 && json_dump_file(o, path, 0) == 0 ? 0
                                                                                            : -1;
    if (!at)
        json_decref(v);
    json_decref(o);
    return rc;
}

/* A non-streamed request whose done line (12,288 ids and their text, about
 * 85 KB) is longer than max_output_bytes (65,536, the least it takes),
 * read as it comes: the client gets its done line, and is not dropped as
 * too slow (the limit is on what a client left unread before a line).
 * On a copy of the random model whose stop id is 9 (the random model
 * stops within a canvas of 1,024 otherwise) and whose context holds the
 * 12 canvases (about 11 s of generation here, under AddressSanitizer as
 * in the plain build). */
static int long_done_line(void)
{
    const char *b = getenv("BUILD");
    char dir[600], cmd[1400], path[700], o_model[700], sock2[600], log4[600];
    const char *opts[] = {o_model, "max_output_bytes=65536", "max_canvas_length=1024",
                          "max_tokens=16384", "pin_workers=false", NULL};
    struct fixture_cl *c;
    struct run r;
    json_t *done;
    const char *fin;
    int st;
    pid_t p;

    snprintf(dir, sizeof dir, "%s", test_path("noeos-model"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/model/random' '%s'", dir,
             b && *b ? b : "build", dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(json_file_set(path, NULL, "eos_token_id", json_pack("[i]", 9)) == 0 &&
          json_file_set(path, "text_config", "eos_token_id", json_integer(9)) == 0 &&
          json_file_set(path, "text_config", "max_position_embeddings", json_integer(32768)) ==
              0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    CHECK(json_file_set(path, NULL, "eos_token_id", json_pack("[i]", 9)) == 0);
    snprintf(o_model, sizeof o_model, "model=%s", dir);
    snprintf(sock2, sizeof sock2, "%s", test_path("long.sock"));
    snprintf(log4, sizeof log4, "%s", test_path("long.log"));
    p = spawn(sock2, log4, opts);
    CHECKF(wait_ready(p, sock2) == 0, "the daemon did not come up; log %s", log4);
    CHECK((c = fixture_cl_open(sock2)) != NULL);
    CHECK(cl_send(c, "{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2],\"seed\":11,"
                     "\"canvas_length\":1024,\"max_tokens\":12288,\"max_denoising_steps\":1,"
                     "\"stream\":false}\n") == 0);
    CHECKF(collect(c, &r) == 0 && r.done, "no done line (log %s)", log4);
    done = r.done;
    fin = json_string_value(json_object_get(done, "finish_reason"));
    CHECKF(!strcmp(ev_kind(done), "done") && fin && !strcmp(fin, "length"),
           "%s, finish %s: %s", ev_kind(done), fin ? fin : "(none)",
           json_string_value(json_object_get(done, "message")));
    CHECK(json_array_size(json_object_get(done, "ids")) == 12288);
    {
        char *line = json_dumps(done, JSON_COMPACT);
        CHECK(line);
        printf("# long_done_line: a done line of %zu bytes, max_output_bytes 65536\n",
               strlen(line));
        CHECK(strlen(line) > 65536);
        free(line);
    }
    json_decref(done);
    fixture_cl_close(c);
    CHECK(!file_has(log4, "too slow"));
    CHECK(kill(p, SIGTERM) == 0 && wait_exit(p, &st) == 0 && WIFEXITED(st) &&
          WEXITSTATUS(st) == 0);
    return 0;
}

/* Write n status requests on a new connection to sock, reading nothing
 * for quiet_ms (writing as much as the socket takes meanwhile), then
 * reading as it writes the rest.  Returns how many status answers came
 * (n when all did) before the daemon closed the connection or 10 s passed
 * with nothing to read or write; -1 when a line is not a status answer. */
static int status_flood(const char *sock, int n, int quiet_ms)
{
    static const char req[] = "{\"v\":1,\"op\":\"status\"}\n";
    static const char answer[] = "{\"v\":1,\"event\":\"status\"";
    const size_t rl = sizeof req - 1, total = (size_t)n * rl;
    char *out = malloc(total), line[64];
    size_t sent = 0, at = 0; /* (at: bytes of the line being read) */
    const double quiet_end = now_ms() + quiet_ms;
    int fd = try_connect(sock), seen = 0;

    if (!out || fd < 0) {
        free(out);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * rl, req, rl);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (seen < n) {
        const int quiet = now_ms() < quiet_end;
        struct pollfd p = {fd, (short)((quiet ? 0 : POLLIN) | (sent < total ? POLLOUT : 0)), 0};
        int r = poll(&p, 1, quiet ? 10 : 10000);
        char buf[65536];
        ssize_t k;
        if (r == 0 && !quiet)
            break; /* nothing for 10 s */
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        if ((p.revents & POLLOUT) && (k = send(fd, out + sent, total - sent, MSG_NOSIGNAL)) > 0)
            sent += (size_t)k;
        if (quiet)
            continue;
        if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0)
            continue;
        if ((k = recv(fd, buf, sizeof buf, 0)) <= 0) {
            if (k < 0 && errno == EAGAIN)
                continue;
            break; /* the daemon closed it */
        }
        for (ssize_t j = 0; j < k; j++) {
            if (at < sizeof answer - 1)
                line[at] = buf[j];
            if (buf[j] != '\n') {
                at++;
                continue;
            }
            if (at < sizeof answer - 1 || memcmp(line, answer, sizeof answer - 1)) {
                printf("# status_flood: answer %d is not a status event\n", seen);
                seen = -1;
                break;
            }
            seen++;
            at = 0;
        }
        if (seen < 0)
            break;
    }
    close(fd);
    free(out);
    return seen;
}

/* Requests written at once, against the least max_output_bytes (64 KiB, a
 * quarter of which is 16 KiB): 3,000 status requests written at once (a
 * 64 KiB read holds 2,978 of them, whose answers are 1.3 MB), read at
 * once, are all answered; so are 20,000 written while the client does not
 * read for 0.5 s (the daemon stops taking them and goes on once the client
 * reads).  A daemon that answers every line of a read before it sends
 * drops both clients as too slow. */
static int requests_at_once(void)
{
    const char *opts[] = {"max_output_bytes=65536", "pin_workers=false", NULL};
    char sock2[600], log7[600];
    int st = -1, at_once = -1, later = -1, up, slow;
    pid_t p;

    snprintf(sock2, sizeof sock2, "%s", test_path("once.sock"));
    snprintf(log7, sizeof log7, "%s", test_path("once.log"));
    p = spawn(sock2, log7, opts);
    CHECK(p > 0);
    if ((up = wait_ready(p, sock2) == 0)) {
        at_once = status_flood(sock2, 3000, 0);
        later = status_flood(sock2, 20000, 500);
    }
    slow = file_has(log7, "too slow");
    /* (stopped before the checks: a daemon left running would hold the
     * runner's output open) */
    kill(p, SIGTERM);
    if (wait_exit(p, &st) != 0) /* (killed there) */
        st = -1;
    CHECKF(up, "the daemon did not come up; log %s", log7);
    CHECKF(at_once == 3000, "%d of 3000 status requests written at once answered (log %s)",
           at_once, log7);
    CHECKF(later == 20000, "%d of 20000 status requests answered (log %s)", later, log7);
    CHECKF(!slow, "a client was dropped as too slow (log %s)", log7);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return 0;
}

/* send_buffer_bytes on each client socket.  A client that writes streamed
 * requests and reads nothing is dropped once its events fill the kernel's
 * send buffer and then pass max_output_bytes (64 KiB) in the daemon's own
 * queue.  What it finds to read after the drop is what the kernel's buffer
 * held: at send_buffer_bytes 8 KiB (the kernel doubles it, and a send may
 * pass it by about half again) within 4 times that, where the system's
 * size (net.core.wmem_default, printed; 208 KiB on many machines) holds
 * many times more.  Not dropped within 60 s, or more than that to read:
 * the size was not applied. */
enum { SNDBUF = 8192 };

static int send_buffer(void)
{
    char o_sndbuf[64], sock2[600], log8[600], req[256], buf[65536];
    const char *opts[] = {"max_output_bytes=65536", o_sndbuf, "pin_workers=false", NULL};
    const long long wmem_default = test_read_ll("/proc/sys/net/core/wmem_default");
    size_t held = 0;
    int st = -1, up, fd = -1, hup = 0, n;
    pid_t p;

    snprintf(o_sndbuf, sizeof o_sndbuf, "send_buffer_bytes=%d", SNDBUF);
    snprintf(sock2, sizeof sock2, "%s", test_path("sndbuf.sock"));
    snprintf(log8, sizeof log8, "%s", test_path("sndbuf.log"));
    n = snprintf(req, sizeof req,
                 "{\"v\":1,\"op\":\"generate\",\"prompt_ids\":[2,3],\"stream\":true,"
                 "\"max_tokens\":128,\"canvas_length\":2,\"max_denoising_steps\":1}\n");
    p = spawn(sock2, log8, opts);
    CHECK(p > 0);
    if ((up = wait_ready(p, sock2) == 0) && (fd = try_connect(sock2)) >= 0) {
        const double end = now_ms() + 60000;
        for (int i = 0; i < 60; i++)
            if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
                break;
        /* read nothing until the daemon closes the connection */
        while (!hup && now_ms() < end) {
            struct pollfd pf = {fd, 0, 0};
            if (poll(&pf, 1, 100) > 0 && (pf.revents & (POLLHUP | POLLERR)))
                hup = 1;
        }
        for (ssize_t k; hup && (k = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0;)
            held += (size_t)k;
    }
    if (fd >= 0)
        close(fd);
    kill(p, SIGTERM);
    if (wait_exit(p, &st) != 0) /* (killed there) */
        st = -1;
    CHECKF(up, "the daemon did not come up; log %s", log8);
    printf("# send_buffer: send_buffer_bytes %d: %zu bytes left to read after the drop "
           "(net.core.wmem_default %lld)\n", SNDBUF, held, wmem_default);
    CHECKF(file_has(log8, "client sockets' send buffer"), "no send buffer line (log %s)", log8);
    CHECKF(hup, "the client was not dropped within 60 s (log %s)", log8);
    CHECKF(file_has(log8, "too slow"), "no drop logged (log %s)", log8);
    CHECKF(held > 0 && held <= 4 * SNDBUF, "%zu bytes were left to read, against a send buffer "
           "of %d (log %s)", held, SNDBUF, log8);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return 0;
}

/* send_buffer_bytes past net.core.wmem_max: the kernel holds the size to
 * twice wmem_max, and the daemon says so at start (a warning that names
 * wmem_max) and serves.  Skipped where wmem_max is not below the most the
 * option takes (64 MiB) or cannot be read. */
static int send_buffer_past_wmem_max(void)
{
    const char *opts[] = {"send_buffer_bytes=67108864", "pin_workers=false", NULL};
    char sock2[600], log9[600];
    const long long wmem_max = test_read_ll("/proc/sys/net/core/wmem_max");
    int st = -1, up;
    pid_t p;

    if (wmem_max < 0 || wmem_max >= 67108864)
        return test_skip("net.core.wmem_max %lld", wmem_max);
    snprintf(sock2, sizeof sock2, "%s", test_path("wmem.sock"));
    snprintf(log9, sizeof log9, "%s", test_path("wmem.log"));
    p = spawn(sock2, log9, opts);
    CHECK(p > 0);
    up = wait_ready(p, sock2) == 0;
    kill(p, SIGTERM);
    if (wait_exit(p, &st) != 0) /* (killed there) */
        st = -1;
    CHECKF(up, "the daemon did not come up; log %s", log9);
    CHECKF(file_has(log9, "net.core.wmem_max holds it"), "no warning (log %s)", log9);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return 0;
}

/* shutdown_grace shorter than the tick (0.5 s against 5): a request still
 * running at SIGTERM is cancelled at the grace's end, not at the next tick
 * (which ended it 4.3 s after the signal), and the log says 0.5 s. */
static int grace_shorter_than_tick(void)
{
    const char *opts[] = {"tick=5", "shutdown_grace=0.5", "pin_workers=false", NULL};
    char sock2[600], log6[600];
    struct fixture_cl *c;
    json_t *e;
    int eof, st, saw_done = 0;
    double t0, ms = 0;
    pid_t p;

    snprintf(sock2, sizeof sock2, "%s", test_path("grace.sock"));
    snprintf(log6, sizeof log6, "%s", test_path("grace.log"));
    p = spawn(sock2, log6, opts);
    CHECKF(wait_ready(p, sock2) == 0, "the daemon did not come up; log %s", log6);
    CHECK(long_req_started(c = fixture_cl_open(sock2)) == 0);
    t0 = now_ms();
    CHECK(kill(p, SIGTERM) == 0);
    while ((e = cl_event(c, &eof)) != NULL) {
        if (!strcmp(ev_kind(e), "done")) {
            ms = now_ms() - t0;
            CHECK(!strcmp(json_string_value(json_object_get(e, "finish_reason")), "cancelled"));
            saw_done = 1;
        }
        json_decref(e);
    }
    fixture_cl_close(c);
    CHECK(saw_done);
    CHECKF(ms >= 400 && ms < 2500, "cancelled %.0f ms after SIGTERM (grace 0.5 s, tick 5 s)", ms);
    CHECK(wait_exit(p, &st) == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(file_has(log6, "running requests have 0.5 s"));
    return 0;
}

static int stale_socket_replaced(void)
{
    struct sockaddr_un a;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0), st;
    char log3[600];
    pid_t p;
    /* a socket file nobody serves */
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    close(fd);
    snprintf(log3, sizeof log3, "%s", test_path("stale.log"));
    p = spawn(sock_path, log3, DAEMON_OPTS);
    CHECK(wait_ready(p, sock_path) == 0);
    CHECK(file_has(log3, "removed a stale socket"));
    CHECK(status_int("running") == 0);
    CHECK(kill(p, SIGTERM) == 0 && wait_exit(p, &st) == 0 && WIFEXITED(st) &&
          WEXITSTATUS(st) == 0);
    return 0;
}

/* A daemon whose socket path another daemon took over (the file removed
 * by hand, a second daemon started) leaves the other's socket in place
 * when it stops. */
static pid_t over_a, over_b; /* killed at the end if a failed check left them */

static int socket_taken_over(void)
{
    char sock[600], log_a[600], log_b[600];
    struct stat before, after;
    int st, rc;
    pid_t a, b;
    snprintf(sock, sizeof sock, "%s", test_path("over.sock"));
    snprintf(log_a, sizeof log_a, "%s", test_path("over-a.log"));
    snprintf(log_b, sizeof log_b, "%s", test_path("over-b.log"));
    over_a = a = spawn(sock, log_a, DAEMON_OPTS);
    CHECK(wait_ready(a, sock) == 0);
    CHECK(unlink(sock) == 0);
    over_b = b = spawn(sock, log_b, DAEMON_OPTS);
    CHECK(wait_ready(b, sock) == 0);
    CHECK(stat(sock, &before) == 0);
    CHECK(kill(a, SIGTERM) == 0);
    rc = wait_exit(a, &st); /* (reaped either way) */
    over_a = 0;
    CHECK(rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(file_has(log_a, "another socket is there now; left in place"));
    CHECK(stat(sock, &after) == 0 && after.st_ino == before.st_ino);
    {
        const int fd = fixture_connect(sock); /* b still answers */
        CHECK(fd >= 0);
        close(fd);
    }
    CHECK(kill(b, SIGTERM) == 0);
    rc = wait_exit(b, &st);
    over_b = 0;
    CHECK(rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(stat(sock, &after) != 0); /* its own socket: removed */
    return 0;
}

/* A socket whose listener does not accept (a hung daemon: its backlog
 * full) is a live one: a new daemon refuses it at once instead of waiting
 * in connect, and leaves it in place. */
static int hung_daemon_socket(void)
{
    struct sockaddr_un a;
    char sock[600], log2[600];
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), st, full = 0, fds[64], n = 0;
    pid_t p;
    snprintf(sock, sizeof sock, "%s", test_path("hung.sock"));
    snprintf(log2, sizeof log2, "%s", test_path("hung.log"));
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 0) == 0);
    while (n < 64 && !full) { /* fill its backlog, accepting none */
        int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        CHECK(c >= 0);
        if (connect(c, (struct sockaddr *)&a, sizeof a) != 0) {
            CHECKF(errno == EAGAIN, "connect: %s", strerror(errno));
            full = 1;
            close(c);
        } else {
            fds[n++] = c;
        }
    }
    CHECK(full);
    p = spawn(sock, log2, DAEMON_OPTS);
    CHECK(wait_exit(p, &st) == 0); /* (the fixture gives up after its timeout) */
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    CHECK(file_has(log2, "another dgemmad is serving it"));
    CHECK(access(sock, F_OK) == 0);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    close(lfd);
    return 0;
}

/* SIGTERM while the model loads (here: its config.json a FIFO no one
 * writes, so the load waits in open) stops the daemon at once, exit 0. */
static int sigterm_during_start(void)
{
    char dir[600], cmd[1500], sock[600], log2[600], fifo[700], model[700];
    const char *opts[] = {model, NULL};
    int st;
    pid_t p;
    snprintf(dir, sizeof dir, "%s", test_path("fifo-model"));
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", fixture_random_model(), dir);
    CHECK(system(cmd) == 0);
    snprintf(fifo, sizeof fifo, "%s/config.json", dir);
    CHECK(unlink(fifo) == 0 && mkfifo(fifo, 0600) == 0);
    snprintf(model, sizeof model, "model=%s", dir);
    snprintf(sock, sizeof sock, "%s", test_path("fifo.sock"));
    snprintf(log2, sizeof log2, "%s", test_path("fifo.log"));
    p = spawn(sock, log2, opts);
    CHECK(p > 0);
    CHECK(log_soon(log2, "starting"));
    usleep(200000); /* (into the load) */
    CHECK(kill(p, SIGTERM) == 0);
    CHECK(wait_exit(p, &st) == 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    CHECK(file_has(log2, "SIGTERM during start-up: stopping"));
    CHECK(access(sock, F_OK) != 0);
    return 0;
}

int main(void)
{
    TEST_CASE(start);
    if (daemon_pid > 0) {
        TEST_CASE(refusals_logged); /* first: no refusal before it in its window */
        TEST_CASE(long_done_line);  /* (its own daemon: the window passes meanwhile) */
        TEST_CASE(refusals_counted);
        TEST_CASE(sighup_reopens_log);
        TEST_CASE(streamed_generate);
        TEST_CASE(concurrent_batching);
        TEST_CASE(cancel_mid_request);
        TEST_CASE(client_vanishes);
        TEST_CASE(half_closed_client);
        TEST_CASE(bad_input);
        TEST_CASE(queue_full);
        TEST_CASE(too_many_connections);
        TEST_CASE(out_of_descriptors);
        TEST_CASE(second_daemon_refused);
        TEST_CASE(sigterm_during_generation);
        TEST_CASE(stale_socket_replaced);
        TEST_CASE(socket_taken_over);
        TEST_CASE(hung_daemon_socket);
        TEST_CASE(sigterm_during_start);
        TEST_CASE(requests_at_once);
        TEST_CASE(grace_shorter_than_tick);
        TEST_CASE(send_buffer);
        TEST_CASE(send_buffer_past_wmem_max);
    }
    for (int i = 0; i < 2; i++) {
        const pid_t left = i ? over_b : over_a;
        if (left > 0 && kill(left, SIGKILL) == 0)
            waitpid(left, NULL, 0);
    }
    return fixture_finish(daemon_pid, log_path);
}
