/*
 * Description: the real dgemmad (from $BUILD/bin) on the embedded default
 * model under faults.
 *   alloc_failures (and alloc_failures_tp4, the same at tp 4: 4 rank
 *     threads, where a rank that fails must not leave the others waiting
 *     in a collective; the log must show some request failed by a rank
 *     other than 0): with tests/fault/failmalloc.so preloaded and armed
 *     (one allocation in 40, then in 400, fails with ENOMEM), 360 requests
 *     from 6 connections each end with a done or an error event (an error
 *     must say "out of memory": the requests are valid, so any other
 *     message is a misreport), or with the connection closed when the log
 *     says the daemon could not queue its output: none hangs, no line is
 *     torn; 24 ring jobs a round each complete (with an output or an error
 *     code) or end with their ring when the daemon drops its connection,
 *     none lost; the daemon stays up, and once disarmed a status and a normal
 *     request are served, the metrics writer writes again and SIGTERM
 *     exits 0.
 *   sigkill_restart: kill -9 with requests, a shared-memory ring's jobs and
 *     a dgemma-client batch in flight; the batch exits (3: the daemon went
 *     away) and the orphaned ring's owner is told (DGEMMA_E_CLOSED) instead
 *     of hanging; the next daemon replaces the stale socket and serves a new
 *     ring, the metrics file passes
 *     PRAGMA integrity_check and takes new rows, and the batch re-run with
 *     the same output ends with every input id exactly once.
 *   sigterm_under_load: SIGTERM with 20 connections' requests running or
 *     queued: the daemon exits 0 within its shutdown_grace (plus slack),
 *     every client sees a done or an error event (nothing silently lost),
 *     and the metrics hold one row per request the daemon answered.
 *   bad_start: a truncated checkpoint, a tensor of the wrong shape, a YAML
 *     syntax error, an unknown key, a value out of range and a max_context
 *     too small for the default request each make the daemon exit non-zero
 *     quickly with a one-line message naming the
 *     problem, leaving no socket file.
 *   metrics_disk_full: with the metrics file's writes failing with ENOSPC
 *     (the same shim), requests are still served, the loss is counted (the
 *     status op's metrics object) and recorded once the disk takes writes
 *     again (a metrics_lost event), and new rows land.
 * The shim owns malloc, so it cannot be preloaded into an AddressSanitizer
 * build: there alloc_failures runs $BUILD/tests/fault/dgemmad, the daemon
 * linked with the same injector around its allocation calls (failmalloc.c,
 * DG_FAULT_WRAP), so that ASan sees every bad access and LeakSanitizer
 * every leak the failures cause (a leak makes the daemon's exit status
 * non-zero); metrics_disk_full, which needs the shim's writes, is skipped,
 * and the others run with fewer requests there.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"
#include "tests/sql-peek.h"

/* a request that waits this long for its next event is hung */
#define EVENT_WAIT_MS 30000

static char sock_path[512], log_path[512], shim_path[600], wrapped_path[600];
static pid_t daemon_pid;

/* ---- the daemon ------------------------------------------------------------------ */

/* Start dgemmad (bin, or $BUILD/bin/dgemmad when NULL) with opts
 * (NULL-ended) and, when env is not NULL, the "NAME=VALUE" strings of env
 * (NULL-ended) in its environment only.  0 once it answers on its socket. */
static int start_daemon(const char *bin, const char *const *opts, const char *const *env)
{
    char names[8][64];
    int n = 0;
    for (const char *const *e = env; e && *e && n < 8; e++, n++) {
        const char *eq = strchr(*e, '=');
        snprintf(names[n], sizeof names[n], "%.*s", (int)(eq - *e), *e);
        setenv(names[n], eq + 1, 1);
    }
    daemon_pid = bin ? fixture_spawn_bin(bin, sock_path, log_path, opts)
                     : fixture_spawn(sock_path, log_path, opts);
    for (int i = 0; i < n; i++)
        unsetenv(names[i]);
    if (daemon_pid <= 0 || fixture_wait_ready(daemon_pid, sock_path) != 0)
        return -1;
    return 0;
}

/* SIGTERM and wait: the exit status as waitpid gives it (-1: killed
 * after FIXTURE_WAIT_MS); *secs: how long it took. */
static int stop_daemon(double *secs)
{
    const double t0 = fixture_now_ms();
    int st = 0;
    if (daemon_pid <= 0)
        return -1;
    kill(daemon_pid, SIGTERM);
    if (fixture_wait_exit(daemon_pid, &st) != 0)
        st = -1;
    daemon_pid = 0;
    if (secs)
        *secs = (fixture_now_ms() - t0) / 1e3;
    return st;
}

static int alive(void)
{
    return daemon_pid > 0 && waitpid(daemon_pid, NULL, WNOHANG) == 0;
}

/* Kill a daemon a failed case left behind. */
static void reap(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
        /* (its listening socket may outlive it a moment: the next case must
         * not find it) */
        unlink(sock_path);
    }
}

/* ---- a client ---------------------------------------------------------------------- */

#define cl_open() fixture_cl_open(sock_path)
#define cl_close fixture_cl_close
#define cl_send fixture_cl_send

#define cl_event fixture_cl_read
enum { EV_OK = FIXTURE_EV_OK, EV_EOF = FIXTURE_EV_EOF, EV_TIMEOUT = FIXTURE_EV_TIMEOUT,
       EV_BAD = FIXTURE_EV_BAD };

static const char *ev_str(const json_t *e, const char *key)
{
    const char *s = json_string_value(json_object_get(e, key));
    return s ? s : "";
}

/* How one request ended. */
enum end { END_DONE = 0, END_ERROR, END_EOF, END_HUNG, END_BAD };

struct outcome {
    enum end end;
    int accepted;
    char code[64], message[256], finish[32];
};

/* Read c's events until the end of the request in flight on it. */
static void read_to_end(struct fixture_cl *c, struct outcome *o)
{
    memset(o, 0, sizeof *o);
    for (;;) {
        json_t *e;
        int rc = cl_event(c, &e, EVENT_WAIT_MS);
        const char *k;
        if (rc != EV_OK) {
            o->end = rc == EV_EOF ? END_EOF : rc == EV_TIMEOUT ? END_HUNG : END_BAD;
            return;
        }
        k = ev_str(e, "event");
        if (!strcmp(k, "accepted")) {
            o->accepted = 1;
        } else if (!strcmp(k, "done")) {
            o->end = END_DONE;
            snprintf(o->finish, sizeof o->finish, "%s", ev_str(e, "finish_reason"));
            snprintf(o->code, sizeof o->code, "%s", ev_str(json_object_get(e, "error"), "code"));
            snprintf(o->message, sizeof o->message, "%s",
                     ev_str(json_object_get(e, "error"), "message"));
            json_decref(e);
            return;
        } else if (!strcmp(k, "status")) {
            o->end = END_DONE;
            snprintf(o->finish, sizeof o->finish, "status");
            json_decref(e);
            return;
        } else if (!strcmp(k, "error")) {
            o->end = END_ERROR;
            snprintf(o->code, sizeof o->code, "%s", ev_str(e, "code"));
            snprintf(o->message, sizeof o->message, "%s", ev_str(e, "message"));
            json_decref(e);
            return;
        }
        json_decref(e);
    }
}

/* The status event's integer key (or metrics.key when sub); -1 if none. */
static long long status_int(const char *sub, const char *key)
{
    struct fixture_cl *c = cl_open();
    json_t *e = NULL, *o;
    long long v = -1;
    if (c && cl_send(c, "{\"v\":1,\"op\":\"status\"}\n") == 0 &&
        cl_event(c, &e, EVENT_WAIT_MS) == EV_OK && !strcmp(ev_str(e, "event"), "status")) {
        o = sub ? json_object_get(e, sub) : e;
        if (json_is_integer(json_object_get(o, key)))
            v = (long long)json_integer_value(json_object_get(o, key));
    }
    json_decref(e);
    cl_close(c);
    return v;
}

/* One request on a fresh connection, to its end. */
static int one_request(const char *line, struct outcome *o)
{
    struct fixture_cl *c = cl_open();
    if (!c || cl_send(c, line) != 0) {
        cl_close(c);
        return -1;
    }
    read_to_end(c, o);
    cl_close(c);
    return 0;
}

/* ---- files ----------------------------------------------------------------------- */

#define q_int test_sql_int
#define integrity(db) test_sql_text(db, 1, "PRAGMA integrity_check")
#define wait_count fixture_wait_count

/* Print the lines of the daemon's log that contain needle, as comments;
 * how many. */
static int show_log(const char *needle)
{
    FILE *f = fopen(log_path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, needle)) {
            printf("# log: %s", line);
            n++;
        }
    if (f)
        fclose(f);
    return n;
}

/* How many lines of the daemon's log contain needle. */
static int log_lines(const char *needle)
{
    FILE *f = fopen(log_path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* ---- alloc_failures ------------------------------------------------------------------ */

#define N_CONN 6

/* Status requests go in among the generate requests (a status line that
 * cannot be formatted becomes an out-of-memory error, never silence). */
#define STATUS_UNDER_FAULTS 1

/* Tallies of the requests sent while a fault is armed. */
struct tally {
    int sent, ends[5], err_oom, done_oom;
};

/* N_CONN connections, per_conn requests each (one at a time per
 * connection, all connections at once); a connection the daemon closes is
 * opened again.  Every request must end (no hang, no line that is not
 * JSON); an error must say it ran out of memory (the requests are valid:
 * anything else is a misreport). */
static int fault_round(int round, int per_conn, struct tally *t)
{
    struct fixture_cl *c[N_CONN] = {0};
    char line[512];
    struct outcome o;
    for (int k = 0; k < per_conn; k++) {
        for (int i = 0; i < N_CONN; i++) {
            const int q = (round * per_conn + k) * N_CONN + i;
            if (!c[i]) {
                for (int tries = 0; !c[i] && tries < 50; tries++)
                    if (!(c[i] = cl_open()))
                        usleep(20000);
                CHECKF(c[i], "cannot connect (daemon %s)", alive() ? "alive" : "dead");
            }
            if (STATUS_UNDER_FAULTS && (k + i) % 7 == 6) /* (now and then a status) */
                snprintf(line, sizeof line, "{\"v\":1,\"op\":\"status\",\"tag\":\"f%d\"}\n", q);
            else
                snprintf(line, sizeof line,
                         "{\"v\":1,\"op\":\"generate\",\"prompt\":\"fault %d of %d\",\"tag\":"
                         "\"f%d\",\"max_tokens\":%d,\"seed\":%d,\"max_denoising_steps\":3,"
                         "\"stream\":%s}\n",
                         k, i, q, 8 + 8 * (k % 3), q + 1, (k + i) % 2 ? "true" : "false");
            if (cl_send(c[i], line) != 0) {
                /* (closed by the daemon after its last request) */
                cl_close(c[i]);
                c[i] = NULL;
                i--;
                continue;
            }
            t->sent++;
        }
        for (int i = 0; i < N_CONN; i++) {
            const int q = (round * per_conn + k) * N_CONN + i;
            read_to_end(c[i], &o);
            t->ends[o.end]++;
            CHECKF(o.end != END_HUNG, "request f%d: no end after %d s", q, EVENT_WAIT_MS / 1000);
            CHECKF(o.end != END_BAD, "request f%d: a line that is not JSON", q);
            if (o.end == END_ERROR || (o.end == END_DONE && !strcmp(o.finish, "error"))) {
                CHECKF(strstr(o.message, "out of memory"), "request f%d: %s %s: %s", q,
                       o.end == END_ERROR ? "error" : "done with error", o.code, o.message);
                if (o.end == END_ERROR)
                    t->err_oom++;
                else
                    t->done_oom++;
            }
            if (o.end == END_EOF) {
                cl_close(c[i]);
                c[i] = NULL;
            }
        }
        CHECKF(alive(), "the daemon died; log %s", log_path);
    }
    for (int i = 0; i < N_CONN; i++)
        cl_close(c[i]);
    return 0;
}

/* Tallies of the ring jobs sent while a fault is armed. */
struct ring_tally {
    int sent, ok, failed, closed;
    int tries; /* connections and attaches tried before one took, over the rounds */
};

/* n jobs through a ring (attached here, on a connection of its own) while
 * the fault is armed: each must complete, with an output or with an error
 * code, within EVENT_WAIT_MS; or the daemon, short of memory, drops the
 * connection and with it the ring, which its owner is told of
 * (DGEMMA_E_CLOSED).  Nothing may simply never come back. */
static int ring_round(int n, struct ring_tally *t)
{
    dgemma_t *c = dgemma_new();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *job = dgemma_request_text("a ring job under faults");
    int done = 0, rc = 0, attached = 0;
    CHECK(c && job && dgemma_request_set_int(job, "max_tokens", 8) == 0 &&
          dgemma_request_set_int(job, "max_denoising_steps", 3) == 0);
    /* (under faults the connection or the attach may be refused at any of
     * the allocations they make: try until one takes; 20 tries were once
     * all refused at 1 in 40, so the rounds print how many it took) */
    for (int tries = 0; tries < 300 && !attached; tries++) {
        t->tries++;
        if (dgemma_connect(c, sock_path, 5) == 0 && dgemma_ring_attach(c, NULL, &ring) == 0)
            attached = 1;
        else {
            dgemma_close(c);
            c = dgemma_new();
            CHECK(c != NULL);
        }
    }
    CHECKF(attached, "no ring could be attached under faults");
    for (int i = 0; i < n; i++)
        CHECK(dgemma_ring_submit(ring, job, (uint64_t)i + 1) == 0);
    t->sent += n;
    if (dgemma_ring_kick(ring) != 0)
        rc = DGEMMA_E_CLOSED;
    while (done < n && rc == 0) {
        dgemma_completion_t cq;
        rc = dgemma_ring_wait(ring, EVENT_WAIT_MS);
        CHECKF(rc != DGEMMA_E_AGAIN, "ring: %d of %d jobs came back in %d s", done, n,
               EVENT_WAIT_MS / 1000);
        while (rc == 0 && (rc = dgemma_ring_reap(ring, &cq)) == 0) {
            const int failed = !cq.finish_reason || !strcmp(cq.finish_reason, "error");
            /* (valid jobs: a failure can only be the daemon's, "internal") */
            CHECKF(!failed || (cq.code && !strcmp(cq.code, "internal")),
                   "ring job %llu: %s: %s", (unsigned long long)cq.user_data,
                   cq.code ? cq.code : "(no code)", cq.message ? cq.message : "");
            t->ok += !failed;
            t->failed += failed;
            done++;
        }
        if (rc == DGEMMA_E_AGAIN)
            rc = 0;
    }
    if (done < n) {
        CHECKF(rc == DGEMMA_E_CLOSED, "ring: %d of %d jobs, then %d", done, n, rc);
        t->closed += n - done;
    }
    dgemma_ring_detach(ring);
    dgemma_close(c);
    dgemma_request_free(job);
    return 0;
}

/* alloc_failures at tp ranks (the CPU backend's rank threads). */
static int alloc_failures_at(int tp)
{
    const char *trig = test_pathf("malloc-tp%d.trigger", tp);
    const char *stats = test_pathf("malloc-tp%d.stats", tp);
    const char *db = test_pathf("alloc-tp%d.sqlite", tp);
    char e_pre[700], e_trig[700], e_stats[700], e_seed[64], o_db[700], o_tp[32], buf[128] = "";
    const char *env[5], *opts[13];
    static const int rates[] = {40, 400};
    const int per_conn = 30;
    int n = 0, st;
    struct tally t = {0};
    struct ring_tally rt = {0};
    const double t0 = fixture_now_ms();
    struct outcome o;
    FILE *f;
    /* (under ASan the injector is linked into a dgemmad of its own) */
    const char *injector = UNDER_ASAN ? wrapped_path : shim_path;

    CHECKF(access(injector, R_OK) == 0, "%s: not built", injector);
    snprintf(o_tp, sizeof o_tp, "tp=%d", tp);
    snprintf(e_pre, sizeof e_pre, "LD_PRELOAD=%s", shim_path);
    snprintf(e_trig, sizeof e_trig, "DG_FAULT_MALLOC_TRIGGER=%s", trig);
    snprintf(e_stats, sizeof e_stats, "DG_FAULT_STATS=%s", stats);
    snprintf(e_seed, sizeof e_seed, "DG_FAULT_SEED=%s",
             getenv("DG_FAULT_SEED") ? getenv("DG_FAULT_SEED") : "7");
    env[0] = e_trig, env[1] = e_stats, env[2] = e_seed, env[3] = UNDER_ASAN ? NULL : e_pre;
    env[4] = NULL;
    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    opts[n++] = "pin_workers=false", opts[n++] = "tick=0.05", opts[n++] = "max_batch=4";
    opts[n++] = "queue_max=64", opts[n++] = "shutdown_grace=2", opts[n++] = "log_level=debug";
    opts[n++] = "metrics_flush=0.02", opts[n++] = o_db, opts[n++] = o_tp, opts[n] = NULL;
    unlink(trig);
    CHECKF(start_daemon(UNDER_ASAN ? injector : NULL, opts, env) == 0,
           "the daemon did not start; log %s", log_path);

    for (int r = 0; r < 2; r++) {
        char rs[16];
        snprintf(rs, sizeof rs, "%d\n", rates[r]);
        CHECK(fixture_write_file(trig, rs) == 0);
        usleep(50000); /* (the shim looks every 5 ms) */
        if (fault_round(r, per_conn, &t) || ring_round(24, &rt))
            return 1;
    }
    unlink(trig);
    usleep(50000);
    /* connections the daemon closed: each when it could not keep its input,
     * queue its output or format a reply (logged, and told where possible) */
    if (t.ends[END_EOF])
        CHECKF(show_log("out of memory for ") > 0,
               "%d connections closed without a reason in the log", t.ends[END_EOF]);
    /* disarmed: status, then a normal request */
    CHECK(status_int(NULL, "running") == 0);
    CHECK(one_request("{\"v\":1,\"op\":\"generate\",\"prompt\":\"after\",\"max_tokens\":16,"
                      "\"max_denoising_steps\":3,\"seed\":3,\"tag\":\"after\"}\n", &o) == 0);
    CHECKF(o.end == END_DONE && strcmp(o.finish, "error"), "after disarming: %d %s %s", o.end,
           o.code, o.message);
    /* the metrics writer came through too: the row of that request lands */
    CHECKF(wait_count(db, 1, 15,
                      "SELECT count(*) FROM requests WHERE tag = 'after'") == 0,
           "no metrics row for the request after disarming");
    if ((f = fopen(stats, "r")) != NULL) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = '\0';
    CHECKF(strncmp(buf, "malloc_failed ", 14) == 0 && atoi(buf + 14) > 0,
           "the shim injected nothing (stats '%s')", buf);
    printf("# alloc_failures, tp %d: %d requests (1 allocation in %d, then in %d, fails): %d done, "
           "%d done with an out-of-memory error, %d error events (out of memory), "
           "%d connections closed by the daemon; shim: %s; %.1f s\n",
           tp, t.sent, rates[0], rates[1], t.ends[END_DONE] - t.done_oom, t.done_oom, t.err_oom,
           t.ends[END_EOF], buf, (fixture_now_ms() - t0) / 1e3);
    printf("# alloc_failures: ring: %d jobs: %d completed, %d completed with an error code, "
           "%d ended with their ring (connection dropped); %d tries to attach its rings\n",
           rt.sent, rt.ok, rt.failed, rt.closed, rt.tries);
    if (tp > 1) { /* (the log holds the tp 1 daemon's lines too: no "rank" in them) */
        int by[4] = {0};
        for (int r = 0; r < 4 && r < tp; r++) {
            char needle[32];
            snprintf(needle, sizeof needle, "error: rank %d: ", r);
            by[r] = log_lines(needle);
        }
        printf("# alloc_failures, tp %d: requests failed by rank 0, 1, 2, 3: %d, %d, %d, %d\n",
               tp, by[0], by[1], by[2], by[3]);
        CHECKF(by[1] + by[2] + by[3] > 0, "tp %d: no request failed by a rank past 0; log %s",
               tp, log_path);
    }
    st = stop_daemon(NULL);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d; log %s", st, log_path);
    return 0;
}

static int alloc_failures(void) { return alloc_failures_at(1); }
static int alloc_failures_tp4(void) { return alloc_failures_at(4); }

/* ---- sigkill_restart ------------------------------------------------------------------- */

/* The result lines of a batch output: *n lines, *dups ids seen twice,
 * *errors error results, ids "k1".."kN" only; -1 when a line does not
 * parse or has another id. */
static int batch_results(const char *path, int n_ids, int *n, int *dups, int *errors)
{
    FILE *f = fopen(path, "r");
    char line[1 << 16];
    char seen[256] = {0};
    *n = *dups = *errors = 0;
    if (!f)
        return errno == ENOENT ? 0 : -1;
    while (fgets(line, sizeof line, f)) {
        json_t *r = json_loads(line, JSON_ALLOW_NUL, NULL);
        const char *id = json_string_value(json_object_get(r, "id"));
        int k = id && id[0] == 'k' ? atoi(id + 1) : 0;
        if (k < 1 || k > n_ids || k >= (int)sizeof seen) {
            json_decref(r);
            fclose(f);
            return -1;
        }
        *dups += seen[k]++ > 0;
        *errors += json_object_get(r, "error") != NULL;
        (*n)++;
        json_decref(r);
    }
    fclose(f);
    return 0;
}

/* Start dgemma-client batch on in/out (stdout and stderr to errfile). */
static pid_t start_batch(const char *in, const char *out, const char *errfile)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errfile, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("DGEMMA_SOCKET", sock_path, 1);
        execl(fixture_bin("dgemma-client"), "dgemma-client", "batch", "--input", in, "--output",
              out, "--parallel", "2", "--max-denoising-steps", "4", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Wait up to limit_s for pid: its exit code, or -1 (killed: it hung). */
static int wait_child(pid_t pid, double limit_s)
{
    const double end = fixture_now_ms() + limit_s * 1e3;
    int st;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (fixture_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(20000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int sigkill_restart(void)
{
    const char *db = test_path("kill.sqlite"), *in = test_path("kill-in.jsonl");
    const char *out = test_path("kill-out.jsonl"), *errfile = test_path("kill-batch.err");
    char o_db[700], *t;
    /* (slots for the long requests, the ring's jobs and the batch at once) */
    const char *opts[] = {"pin_workers=false", "tick=0.05", "max_batch=8", "queue_max=16",
                          "shutdown_grace=1", "log_level=info", "metrics_flush=0.02", o_db, NULL};
    const int N = 30;
    struct fixture_cl *c[3];
    struct outcome o;
    int n, n_killed, dups, errors, rc;
    struct stat sb;
    pid_t batch;
    FILE *f;
    const double t0 = fixture_now_ms();
    dgemma_t *rc_conn = dgemma_new();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *job = dgemma_request_text("a ring job the kill orphans");
    dgemma_completion_t cq;

    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    CHECK((f = fopen(in, "w")) != NULL);
    for (int i = 1; i <= N; i++)
        fprintf(f, "{\"id\":\"k%d\",\"prompt\":\"killed batch %d\",\"max_tokens\":%d,\"seed\":%d}\n",
                i, i, 16 + 8 * (i % 4), i);
    fclose(f);
    CHECKF(start_daemon(NULL, opts, NULL) == 0, "the daemon did not start; log %s", log_path);
    /* long requests in flight beside the batch */
    for (int i = 0; i < 3; i++) {
        json_t *e;
        CHECK((c[i] = cl_open()) != NULL && cl_send(c[i], FIXTURE_LONG_REQ) == 0);
        rc = cl_event(c[i], &e, EVENT_WAIT_MS);
        CHECKF(rc == EV_OK && !strcmp(ev_str(e, "event"), "accepted"),
               "long request %d: %d %s (daemon %s)", i, rc, ev_str(e, "event"),
               alive() ? "alive" : "dead");
        json_decref(e);
    }
    /* and a shared-memory ring with long jobs in flight */
    CHECK(rc_conn && job && dgemma_connect(rc_conn, sock_path, 5) == 0);
    CHECK(dgemma_ring_attach(rc_conn, NULL, &ring) == 0);
    CHECK(dgemma_request_set_int(job, "max_tokens", 4000) == 0);
    for (int i = 0; i < 2; i++)
        CHECK(dgemma_ring_submit(ring, job, (uint64_t)i + 1) == 0);
    CHECK(dgemma_ring_kick(ring) == 0);
    CHECK((batch = start_batch(in, out, errfile)) > 0);
    /* kill -9 once a few results are written */
    for (;;) {
        CHECK(fixture_now_ms() - t0 < FIXTURE_WAIT_MS && waitpid(batch, NULL, WNOHANG) == 0);
        if (batch_results(out, N, &n, &dups, &errors) == 0 && n >= 3)
            break;
        usleep(5000);
    }
    CHECK(kill(daemon_pid, SIGKILL) == 0);
    waitpid(daemon_pid, NULL, 0);
    daemon_pid = 0;
    /* the batch notices (exit 3: the daemon went away), the clients see the end */
    rc = wait_child(batch, 30);
    CHECKF(rc == 3, "dgemma-client batch after the daemon's kill -9: exit %d (-1: hung)", rc);
    for (int i = 0; i < 3; i++) {
        read_to_end(c[i], &o);
        CHECKF(o.end == END_EOF, "long request %d: end %d", i, o.end);
        cl_close(c[i]);
    }
    /* the orphaned ring: its owner learns the daemon left, no wait for ever */
    for (int tries = 0; (rc = dgemma_ring_wait(ring, 1000)) == DGEMMA_E_AGAIN && tries < 30;
         tries++)
        ;
    CHECKF(rc == DGEMMA_E_CLOSED, "ring wait after the kill: %d", rc);
    CHECK(dgemma_ring_reap(ring, &cq) == DGEMMA_E_CLOSED);
    dgemma_ring_detach(ring);
    dgemma_close(rc_conn);
    ring = NULL;
    CHECK(batch_results(out, N, &n, &dups, &errors) == 0);
    printf("# sigkill_restart: killed with %d of %d batch results written\n", n, N);
    CHECK(n < N && dups == 0 && errors == 0);
    n_killed = n;
    t = integrity(db);
    CHECKF(t && !strcmp(t, "ok"), "integrity_check after kill -9: %s", t ? t : "(failed)");
    free(t);

    /* a new daemon on the same socket path (the old socket file is still there) */
    CHECK(stat(sock_path, &sb) == 0 && S_ISSOCK(sb.st_mode));
    snprintf(log_path, sizeof log_path, "%s", test_path("d2.log"));
    CHECKF(start_daemon(NULL, opts, NULL) == 0, "the daemon did not restart; log %s", log_path);
    CHECK(fixture_file_has(log_path, "removed a stale socket"));
    /* a new ring from the same client program works */
    CHECK((rc_conn = dgemma_new()) != NULL && dgemma_connect(rc_conn, sock_path, 5) == 0);
    CHECK(dgemma_ring_attach(rc_conn, NULL, &ring) == 0);
    CHECK(dgemma_request_set_int(job, "max_tokens", 8) == 0);
    CHECK(dgemma_ring_submit(ring, job, 9) == 0 && dgemma_ring_kick(ring) == 0);
    CHECK(dgemma_ring_wait(ring, EVENT_WAIT_MS) == 0 && dgemma_ring_reap(ring, &cq) == 0);
    CHECKF(cq.user_data == 9 && cq.id != 0 && cq.finish_reason &&
           strcmp(cq.finish_reason, "error"), "ring job after the restart: %s %s",
           cq.code ? cq.code : "", cq.message ? cq.message : "");
    dgemma_ring_detach(ring);
    dgemma_close(rc_conn);
    dgemma_request_free(job);
    /* the batch again, with the same output: every id once */
    CHECK((batch = start_batch(in, out, errfile)) > 0);
    rc = wait_child(batch, 120);
    CHECKF(rc == 0, "the batch re-run: exit %d; see %s", rc, errfile);
    CHECK(batch_results(out, N, &n, &dups, &errors) == 0);
    CHECKF(n == N && dups == 0 && errors == 0, "%d results of %d, %d twice, %d errors", n, N, dups,
           errors);
    /* (the rows are written by the time it stops) */
    rc = stop_daemon(NULL);
    CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "exit status %d", rc);
    CHECK(q_int(db, "SELECT count(*) FROM runs") == 2);
    /* (the re-run sent only the ids without a result) */
    CHECKF(q_int(db, "SELECT count(*) FROM requests WHERE run = 2 AND source = 'batch'") ==
               N - n_killed, "%lld batch rows in the second run, want %d",
           (long long)q_int(db, "SELECT count(*) FROM requests WHERE run = 2"), N - n_killed);
    t = integrity(db);
    CHECKF(t && !strcmp(t, "ok"), "integrity_check: %s", t ? t : "(failed)");
    free(t);
    printf("# sigkill_restart: %.1f s\n", (fixture_now_ms() - t0) / 1e3);
    return 0;
}

/* ---- sigterm_under_load ----------------------------------------------------------- */

#define N_LOAD 20

static int sigterm_under_load(void)
{
    const char *db = test_path("term.sqlite");
    char o_db[700], line[512];
    const char *opts[] = {"pin_workers=false", "tick=0.05", "max_batch=4", "queue_max=32",
                          "shutdown_grace=2", "max_connections=64", "log_level=info",
                          "metrics_flush=0.02", o_db, NULL};
    const double grace = 2, slack = UNDER_ASAN ? 15 : 4;
    struct fixture_cl *c[N_LOAD];
    int accepted = 0, refused = 0, done = 0, cancelled = 0, unanswered = 0, late = -1, st;
    double secs, t_term;
    const double t0 = fixture_now_ms();

    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    CHECKF(start_daemon(NULL, opts, NULL) == 0, "the daemon did not start; log %s", log_path);
    for (int i = 0; i < N_LOAD; i++) {
        snprintf(line, sizeof line,
                 "{\"v\":1,\"op\":\"generate\",\"prompt\":\"load %d\",\"max_tokens\":400,"
                 "\"max_denoising_steps\":8,\"seed\":%d,\"stream\":%s}\n",
                 i, i + 1, i % 2 ? "true" : "false");
        CHECK((c[i] = cl_open()) != NULL && cl_send(c[i], line) == 0);
    }
    /* every request is in: 4 running, the rest queued */
    for (int tries = 0; status_int(NULL, "accepted") < N_LOAD && tries < 500; tries++)
        usleep(10000);
    CHECK(status_int(NULL, "accepted") == N_LOAD);
    CHECK(kill(daemon_pid, SIGTERM) == 0);
    t_term = fixture_now_ms();
    /* a request after the signal, on a connection still open (the daemon
     * closes those whose requests have ended) */
    usleep(100000);
    for (int i = 0; i < N_LOAD && late < 0; i++)
        if (cl_send(c[i], "{\"v\":1,\"op\":\"generate\",\"prompt\":\"late\",\"tag\":\"late\"}\n") ==
            0)
            late = i;
    for (int i = 0; i < N_LOAD; i++) {
        /* each connection: its request's end (then the late one's), then EOF */
        for (int want = i == late ? 2 : 1; want > 0;) {
            struct outcome o;
            read_to_end(c[i], &o);
            CHECKF(o.end != END_HUNG && o.end != END_BAD, "connection %d: end %d", i, o.end);
            if (o.end == END_EOF) {
                CHECKF(i == late && want == 1, "connection %d: closed with a request unanswered",
                       i);
                unanswered++; /* (the late request, if the daemon had closed it first) */
                break;
            }
            want--;
            accepted += o.accepted;
            if (o.end == END_DONE) {
                done++;
                cancelled += !strcmp(o.finish, "cancelled");
                CHECKF(strcmp(o.finish, "error"), "connection %d: error %s", i, o.message);
            } else {
                CHECKF(!strcmp(o.code, "shutting_down"), "connection %d: error %s: %s", i, o.code,
                       o.message);
                refused++;
            }
        }
        cl_close(c[i]);
    }
    CHECK(fixture_wait_exit(daemon_pid, &st) == 0);
    secs = (fixture_now_ms() - t_term) / 1e3;
    daemon_pid = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d; log %s", st, log_path);
    printf("# sigterm_under_load: %d requests: %d done (%d cancelled), %d refused "
           "(shutting_down), %d unanswered with the connection closed; exit %.1f s after "
           "SIGTERM (grace %.0f s); %.1f s in all\n", N_LOAD + 1, done, cancelled, refused,
           unanswered, secs, grace, (fixture_now_ms() - t0) / 1e3);
    CHECKF(secs <= grace + slack, "exit %.1f s after SIGTERM", secs);
    CHECK(accepted == N_LOAD && done == N_LOAD);
    if (late < 0)
        unanswered++; /* (every connection was closed already: not sent) */
    /* one row per request answered */
    CHECKF(q_int(db, "SELECT count(*) FROM requests WHERE request_id IS NOT NULL") == N_LOAD,
           "%lld rows of accepted requests",
           (long long)q_int(db, "SELECT count(*) FROM requests WHERE request_id IS NOT NULL"));
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE request_id IS NULL") == refused);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'stop'") == 1);
    return 0;
}

/* ---- bad_start --------------------------------------------------------------------- */

/* The line of file that contains needle (without its newline) into out;
 * 0, or -1 when none does. */
static int find_line(const char *file, const char *needle, char *out, size_t size)
{
    FILE *f = fopen(file, "r");
    char line[2048];
    int rc = -1;
    while (f && rc < 0 && fgets(line, sizeof line, f))
        if (strstr(line, needle)) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, size, "%s", line);
            rc = 0;
        }
    if (f)
        fclose(f);
    return rc;
}

/* Run dgemmad with "-o socket", "-o log_file" and args (NULL-ended): it
 * must exit non-zero within limit_s with one line (on standard error or
 * in its log) containing needle and needle2, and leave no socket file. */
static int refused_start(const char *what, const char *const *args, const char *needle,
                         const char *needle2)
{
    const char *errfile = test_path("bad.err"), *bad_log = test_path("bad.log");
    const double limit_s = UNDER_ASAN ? 60 : 20, t0 = fixture_now_ms();
    char o_sock[700], o_log[700], line[2048] = "";
    const char *argv[32];
    int n = 0, rc;
    pid_t pid;
    struct stat sb;

    unlink(errfile);
    unlink(bad_log);
    unlink(sock_path);
    snprintf(o_sock, sizeof o_sock, "socket=%s", sock_path);
    snprintf(o_log, sizeof o_log, "log_file=%s", bad_log);
    argv[n++] = fixture_bin("dgemmad");
    argv[n++] = "-o", argv[n++] = o_sock, argv[n++] = "-o", argv[n++] = o_log;
    if (geteuid() == 0)
        argv[n++] = "-o", argv[n++] = "allow_root=true";
    for (const char *const *a = args; *a && n < 30; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    pid = fork();
    if (pid == 0) {
        int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    CHECK(pid > 0);
    rc = wait_child(pid, limit_s);
    CHECKF(rc > 0 && rc < 128, "%s: exit %d (-1: still running after %.0f s)", what, rc, limit_s);
    CHECKF(find_line(errfile, needle, line, sizeof line) == 0 ||
               find_line(bad_log, needle, line, sizeof line) == 0,
           "%s: no line with '%s' on standard error or in the log", what, needle);
    CHECKF(strstr(line, needle2), "%s: the message lacks '%s': %s", what, needle2, line);
    printf("# bad_start: %s: exit %d after %.2f s: %s\n", what, rc,
           (fixture_now_ms() - t0) / 1e3, line);
    CHECKF(stat(sock_path, &sb) != 0, "%s: a socket file was left behind", what);
    return 0;
}

static int bad_start(void)
{
    const char *b = getenv("BUILD");
    char cmd[2048], trunc_dir[600], shape_dir[600], o_model[700], yaml[600];
    const char *args[4] = {"-o", o_model, NULL, NULL};
    struct stat sb;
    FILE *f;

    /* a truncated checkpoint */
    snprintf(trunc_dir, sizeof trunc_dir, "%s", test_path("trunc-model"));
    snprintf(cmd, sizeof cmd, "cp -r '%s/model/random' '%s'", b && *b ? b : "build", trunc_dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/model.safetensors", trunc_dir);
    CHECK(stat(cmd, &sb) == 0 && truncate(cmd, sb.st_size / 2) == 0);
    snprintf(o_model, sizeof o_model, "model=%s", trunc_dir);
    if (refused_start("truncated checkpoint", args, "model.safetensors", "file truncated"))
        return 1;

    /* a tensor of the wrong shape: [512, 64] written as [64, 512] (the same bytes) */
    snprintf(shape_dir, sizeof shape_dir, "%s", test_path("shape-model"));
    snprintf(cmd, sizeof cmd, "cp -r '%s/model/random' '%s'", b && *b ? b : "build", shape_dir);
    CHECK(system(cmd) == 0);
    {
        static char head[1 << 16];
        char path[700], *p;
        size_t n;
        snprintf(path, sizeof path, "%s/model.safetensors", shape_dir);
        CHECK((f = fopen(path, "r+b")) != NULL);
        n = fread(head, 1, sizeof head - 1, f);
        head[n] = '\0';
        p = memmem(head, n, "\"shape\":[512,64]", 16);
        CHECK(p);
        memcpy(p, "\"shape\":[64,512]", 16);
        CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(head, 1, n, f) == n);
        fclose(f);
    }
    snprintf(o_model, sizeof o_model, "model=%s", shape_dir);
    if (refused_start("tensor of the wrong shape", args, "shape [64, 512]", "needs [512, 64]"))
        return 1;

    /* configuration files: a YAML syntax error, an unknown key, a value out of range */
    snprintf(yaml, sizeof yaml, "%s", test_path("bad.yaml"));
    args[0] = "-c", args[1] = yaml;
    CHECK(fixture_write_file(yaml, "max_batch: 4\nqueue_max: 3: 4\n") == 0);
    if (refused_start("YAML syntax error", args, "bad.yaml:2", "YAML syntax error"))
        return 1;
    CHECK(fixture_write_file(yaml, "max_batch: 4\nmax_bacth: 4\n") == 0);
    if (refused_start("unknown key", args, "bad.yaml:2", "unknown key 'max_bacth'"))
        return 1;
    CHECK(fixture_write_file(yaml, "queue_max: 3\nmax_batch: 0\n") == 0);
    if (refused_start("value out of range", args, "bad.yaml:2", "max_batch"))
        return 1;
    args[0] = "-o", args[1] = "max_batch=5000";
    if (refused_start("value out of range (-o)", args, "max_batch=5000", "[1, 1024]"))
        return 1;
    {
        /* a max_context too small for a request with the default settings
         * (256 tokens in canvases of 32, and a prompt token): the daemon
         * would start and then refuse every request that leaves max_tokens
         * out */
        char o_good[700];
        const char *ctx_args[] = {"-o", o_good, "-o", "max_context=40", NULL};
        snprintf(o_good, sizeof o_good, "model=%s/model/random", b && *b ? b : "build");
        if (refused_start("max_context below the default request", ctx_args, "max_context 40",
                          "default_max_tokens"))
            return 1;
    }
    return 0;
}

/* ---- metrics_disk_full -------------------------------------------------------------- */

/* The status op's metrics counters. */
struct mstat {
    long long queued, requests_written, lost, retries;
};

static void metrics_status(struct mstat *m)
{
    m->queued = status_int("metrics", "queued");
    m->requests_written = status_int("metrics", "requests_written");
    m->lost = status_int("metrics", "lost");
    m->retries = status_int("metrics", "retries");
}

/* n requests, one after another: each must be done. */
static int serve(int n, const char *tag)
{
    char line[300];
    struct outcome o;
    for (int i = 0; i < n; i++) {
        snprintf(line, sizeof line, "{\"v\":1,\"op\":\"generate\",\"prompt\":\"disk %d\","
                 "\"max_tokens\":8,\"max_denoising_steps\":3,\"seed\":%d,\"tag\":\"%s\"}\n",
                 i, i + 1, tag);
        CHECK(one_request(line, &o) == 0);
        CHECKF(o.end == END_DONE && strcmp(o.finish, "error"), "request %d (%s): %d %s %s", i,
               tag, o.end, o.code, o.message);
    }
    return 0;
}

static int metrics_disk_full(void)
{
    const char *db = test_path("full.sqlite"), *trig = test_path("write.trigger");
    char e_pre[700], e_trig[700], e_path[700], o_db[700];
    const char *env[] = {e_pre, e_trig, e_path, NULL};
    const char *opts[] = {"pin_workers=false", "tick=0.05", "max_batch=4", "shutdown_grace=1",
                          "log_level=info", "metrics_flush=0.02", "metrics_queue=6", o_db, NULL};
    const int Q = 6, N = 10;
    struct mstat ms;
    int st;
    const double t0 = fixture_now_ms();

    if (UNDER_ASAN)
        return test_skip("the fault shim cannot run beside AddressSanitizer");
    CHECKF(access(shim_path, R_OK) == 0, "%s: not built", shim_path);
    snprintf(e_pre, sizeof e_pre, "LD_PRELOAD=%s", shim_path);
    snprintf(e_trig, sizeof e_trig, "DG_FAULT_WRITE_TRIGGER=%s", trig);
    snprintf(e_path, sizeof e_path, "DG_FAULT_WRITE_PATH=%s", db);
    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    unlink(trig);
    CHECKF(start_daemon(NULL, opts, env) == 0, "the daemon did not start; log %s", log_path);
    if (serve(2, "before"))
        return 1;
    CHECK(wait_count(db, 2, 15, "SELECT count(*) FROM requests") == 0);
    /* the disk is full: requests are served all the same */
    CHECK(fixture_write_file(trig, "") == 0);
    usleep(50000);
    if (serve(N, "full"))
        return 1;
    metrics_status(&ms);
    for (int tries = 0; ms.retries == 0 && tries < 250; tries++) {
        usleep(20000);
        metrics_status(&ms);
    }
    printf("# metrics_disk_full: %d requests while full: metrics queued %lld, lost %lld, "
           "retries %lld\n", N, ms.queued, ms.lost, ms.retries);
    CHECKF(ms.retries > 0 && ms.lost == N - Q && ms.queued == Q,
           "queued %lld lost %lld retries %lld", ms.queued, ms.lost, ms.retries);
    CHECK(q_int(db, "SELECT count(*) FROM requests") == 2);
    CHECK(show_log("disk is full") > 0);
    /* space again: the kept rows land, the loss is recorded, new rows land */
    unlink(trig);
    CHECK(wait_count(db, 2 + Q, 15, "SELECT count(*) FROM requests") == 0);
    CHECK(wait_count(db, N - Q, 15, "SELECT sum(CAST(detail AS INTEGER)) FROM events "
                                    "WHERE kind = 'metrics_lost'") == 0);
    if (serve(1, "after"))
        return 1;
    CHECK(wait_count(db, 1, 15, "SELECT count(*) FROM requests WHERE tag = 'after'") == 0);
    metrics_status(&ms);
    CHECK(ms.lost == N - Q && ms.queued == 0);
    st = stop_daemon(NULL);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    {
        char *t = integrity(db);
        CHECKF(t && !strcmp(t, "ok"), "integrity_check: %s", t ? t : "(failed)");
        free(t);
    }
    printf("# metrics_disk_full: %.1f s\n", (fixture_now_ms() - t0) / 1e3);
    return 0;
}

int main(void)
{
    const char *b = getenv("BUILD");
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    snprintf(shim_path, sizeof shim_path, "%s/tests/fault/failmalloc.so", b && *b ? b : "build");
    if (shim_path[0] != '/') {
        char cwd[400];
        if (getcwd(cwd, sizeof cwd)) {
            char rel[600];
            snprintf(rel, sizeof rel, "%s", shim_path);
            snprintf(shim_path, sizeof shim_path, "%s/%s", cwd, rel);
        }
    }
    snprintf(wrapped_path, sizeof wrapped_path, "%s/tests/fault/dgemmad", b && *b ? b : "build");
    signal(SIGPIPE, SIG_IGN);
    TEST_CASE(alloc_failures);
    reap();
    TEST_CASE(alloc_failures_tp4);
    reap();
    TEST_CASE(sigkill_restart);
    reap();
    TEST_CASE(sigterm_under_load);
    reap();
    TEST_CASE(bad_start);
    reap();
    TEST_CASE(metrics_disk_full);
    reap();
    return test_finish();
}
