/*
 * Description: the metrics database written by the real dgemmad (from
 * $BUILD/bin) on the random test model ($BUILD/model/random): N requests (streamed and not,
 * tagged, one from a batch, one cancelled mid-way) give exactly N request
 * rows and one row per canvas, with the values the clients saw in their
 * events, and a refused request gives a 'rejected' row; another process
 * holding a long read transaction and the write lock does not stop
 * generation, the rows arrive once it lets go and none is lost below the
 * queue bound, while above it the loss counter (status op) is exactly the
 * excess; after kill -9 mid-run the file opens, passes PRAGMA
 * integrity_check, holds whole requests only, and the next daemon run
 * writes to it; dgemma-client batch's requests are recorded as source
 * 'batch'.
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"
#include "tests/sql-peek.h"

#define WAIT_MS FIXTURE_WAIT_MS

static char sock_path[512], log_path[512];
static pid_t daemon_pid;

/* Start dgemmad writing metrics to db, with extra options (NULL-ended). */
static int start_daemon(const char *db, const char *const *extra)
{
    static char o_db[700];
    const char *opts[24] = {"pin_workers=false", "tick=0.05", "max_batch=4",
                            "shutdown_grace=1", "log_level=debug", "metrics_flush=0.02"};
    int n = 6;
    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    opts[n++] = o_db;
    for (const char *const *e = extra; e && *e && n < 23; e++)
        opts[n++] = *e;
    opts[n] = NULL;
    daemon_pid = fixture_spawn(sock_path, log_path, opts);
    if (daemon_pid <= 0 || fixture_wait_ready(daemon_pid, sock_path) != 0)
        return -1;
    return 0;
}

/* SIGTERM and wait: 0 when it exited 0. */
static int stop_daemon(void)
{
    int st = 0;
    if (daemon_pid <= 0)
        return 0;
    kill(daemon_pid, SIGTERM);
    if (fixture_wait_exit(daemon_pid, &st) != 0) {
        daemon_pid = 0;
        return -1;
    }
    daemon_pid = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* ---- reading the database from here ----------------------------------------- */

#define q_int test_sql_int
#define q_text(db, sql) test_sql_text(db, 1, sql)
#define wait_count fixture_wait_count

/* ---- the daemon's side ---------------------------------------------------------- */

static dgemma_t *open_conn(void)
{
    dgemma_t *c = dgemma_new();
    if (c && dgemma_connect(c, sock_path, 5) != 0) {
        dgemma_close(c);
        return NULL;
    }
    return c;
}

/* The status op's "metrics" object, as integers. */
struct mstat {
    long long queued, requests_written, events_written, lost, retries;
    int failing;          /* (-1: not a boolean) */
    double last_error_at; /* (-1: not a number) */
};

static int metrics_status(struct mstat *m)
{
    dgemma_t *c = open_conn();
    dgemma_event_t ev;
    json_t *s, *o;
    int rc = -1;
    if (!c)
        return -1;
    if (dgemma_status(c) == 0 && dgemma_next_event(c, &ev, WAIT_MS) == 0 &&
        ev.kind == DGEMMA_EV_STATUS && (s = json_loads(ev.json, 0, NULL)) != NULL) {
        if ((o = json_object_get(s, "metrics")) != NULL) {
            m->queued = json_integer_value(json_object_get(o, "queued"));
            m->requests_written = json_integer_value(json_object_get(o, "requests_written"));
            m->events_written = json_integer_value(json_object_get(o, "events_written"));
            m->lost = json_integer_value(json_object_get(o, "lost"));
            m->retries = json_integer_value(json_object_get(o, "retries"));
            m->failing = json_is_boolean(json_object_get(o, "failing"))
                             ? json_is_true(json_object_get(o, "failing"))
                             : -1;
            m->last_error_at = json_is_number(json_object_get(o, "last_error_at"))
                                   ? json_number_value(json_object_get(o, "last_error_at"))
                                   : -1;
            rc = 0;
        }
        json_decref(s);
    }
    dgemma_close(c);
    return rc;
}

#define MAX_CANVAS 64

/* What one client asked for and saw. */
struct seen {
    /* asked */
    int stream, batch, max_tokens, steps, cancel_after_first;
    long long want_seed;           /* 0: the daemon draws one */
    char tag[32];
    /* seen */
    dgemma_t *c;
    uint64_t id, seed;
    long long prompt_tokens;
    int n_canvas;
    struct {
        int index, steps, tokens, converged;
    } canvas[MAX_CANVAS];
    int end;                       /* DGEMMA_EV_DONE or DGEMMA_EV_ERROR */
    char finish[32], code[64];
    long long completion_tokens, decoder_steps;
    int canvases;
    double tokens_per_s;
};

static int submit(struct seen *s, const char *prompt)
{
    dgemma_request_t *r = dgemma_request_text(prompt);
    int rc;
    CHECK(r);
    CHECK((s->c = open_conn()) != NULL);
    CHECK(dgemma_request_set_int(r, "max_tokens", s->max_tokens) == 0);
    /* (few denoising steps unless asked: the random model never converges,
     * and each step is a decoder pass) */
    CHECK(dgemma_request_set_int(r, "max_denoising_steps", s->steps ? s->steps : 4) == 0);
    if (s->want_seed)
        CHECK(dgemma_request_set_int(r, "seed", s->want_seed) == 0);
    CHECK(dgemma_request_set_stream(r, s->stream) == 0);
    if (s->tag[0])
        CHECK(dgemma_request_set_tag(r, s->tag) == 0);
    if (s->batch)
        CHECK(dgemma_request_set_json(r, "{\"batch\": true}") == 0);
    rc = dgemma_submit(s->c, r);
    dgemma_request_free(r);
    CHECKF(rc == 0, "submit: %s", dgemma_errmsg(s->c));
    return 0;
}

/* Read s's events until its done or error; cancel after the first canvas
 * when asked. */
static int collect(struct seen *s)
{
    dgemma_event_t ev;
    for (;;) {
        int rc = dgemma_next_event(s->c, &ev, WAIT_MS);
        CHECKF(rc == 0, "next_event: %s", dgemma_errmsg(s->c));
        switch (ev.kind) {
        case DGEMMA_EV_ACCEPTED:
            s->id = ev.id;
            s->seed = ev.seed;
            s->prompt_tokens = ev.prompt_tokens;
            break;
        case DGEMMA_EV_CANVAS:
            CHECK(s->n_canvas < MAX_CANVAS);
            s->canvas[s->n_canvas].index = ev.index;
            s->canvas[s->n_canvas].steps = ev.steps;
            s->canvas[s->n_canvas].tokens = ev.tokens;
            s->canvas[s->n_canvas].converged = ev.converged;
            if (s->cancel_after_first && s->n_canvas == 0)
                CHECK(dgemma_cancel(s->c, s->id) == 0);
            s->n_canvas++;
            break;
        case DGEMMA_EV_CANCELLING:
            break;
        case DGEMMA_EV_DONE:
        case DGEMMA_EV_ERROR:
            s->end = ev.kind;
            snprintf(s->finish, sizeof s->finish, "%s", ev.finish_reason ? ev.finish_reason : "");
            snprintf(s->code, sizeof s->code, "%s", ev.code ? ev.code : "");
            s->completion_tokens = ev.completion_tokens;
            s->decoder_steps = ev.decoder_steps;
            s->canvases = ev.canvases;
            s->tokens_per_s = ev.tokens_per_s;
            dgemma_close(s->c);
            s->c = NULL;
            return 0;
        default:
            CHECKF(0, "unexpected event: %s", ev.json);
        }
    }
}

/* Send n plain requests at once and read them to the end. */
static int run_requests(int n, int max_tokens)
{
    struct seen *s = calloc((size_t)n, sizeof *s);
    int rc = 0;
    CHECK(s);
    for (int i = 0; i < n && rc == 0; i++) {
        s[i].max_tokens = max_tokens;
        s[i].stream = i & 1;
        rc = submit(&s[i], "metrics");
    }
    for (int i = 0; i < n && rc == 0; i++)
        if ((rc = collect(&s[i])) == 0 && s[i].end != DGEMMA_EV_DONE)
            rc = test_fail(__FILE__, __LINE__, "request %d: %s", i, s[i].code);
    for (int i = 0; i < n; i++)
        dgemma_close(s[i].c);
    free(s);
    return rc;
}

/* Compare the row (and canvas rows) of s with what the client saw. */
static int check_row(const char *db, const struct seen *s)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    json_t *settings;
    int64_t rowid;
    double submitted, started, first_canvas, finished, tps;
    int n = 0;

    CHECK(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(h,
                             "SELECT id, coalesce(tag, ''), uid, source, prompt_tokens, "
                             "completion_tokens, canvases, steps, finish, settings, "
                             "submitted, started, coalesce(first_canvas, 0), finished, "
                             "tokens_per_s FROM requests WHERE run = 1 AND request_id = ?",
                             -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_int64(st, 1, (sqlite3_int64)s->id);
    CHECKF(sqlite3_step(st) == SQLITE_ROW, "no row for request %llu", (unsigned long long)s->id);
    rowid = sqlite3_column_int64(st, 0);
    CHECK(!strcmp((const char *)sqlite3_column_text(st, 1), s->tag));
    CHECK(sqlite3_column_int64(st, 2) == (int64_t)getuid());
    CHECK(!strcmp((const char *)sqlite3_column_text(st, 3), s->batch ? "batch" : "socket"));
    CHECK(sqlite3_column_int64(st, 4) == s->prompt_tokens);
    CHECKF(sqlite3_column_int64(st, 5) == s->completion_tokens, "completion %lld vs %lld",
           (long long)sqlite3_column_int64(st, 5), s->completion_tokens);
    CHECK(sqlite3_column_int64(st, 6) == s->canvases);
    CHECK(sqlite3_column_int64(st, 7) == s->decoder_steps);
    CHECKF(!strcmp((const char *)sqlite3_column_text(st, 8), s->finish), "finish %s vs %s",
           sqlite3_column_text(st, 8), s->finish);
    settings = json_loads((const char *)sqlite3_column_text(st, 9), 0, NULL);
    CHECK(settings);
    CHECK((uint64_t)json_integer_value(json_object_get(settings, "seed")) == s->seed);
    CHECK(json_integer_value(json_object_get(settings, "max_tokens")) == s->max_tokens);
    json_decref(settings);
    submitted = sqlite3_column_double(st, 10);
    started = sqlite3_column_double(st, 11);
    first_canvas = sqlite3_column_double(st, 12);
    finished = sqlite3_column_double(st, 13);
    tps = sqlite3_column_double(st, 14);
    CHECK(submitted > 1.7e9 && submitted <= started && started <= finished);
    CHECK(s->canvases == 0 || (started <= first_canvas && first_canvas <= finished));
    CHECKF(fabs(tps - s->tokens_per_s) <= 1e-3 * (1 + s->tokens_per_s), "tokens/s %g vs %g", tps,
           s->tokens_per_s);
    sqlite3_finalize(st);

    CHECK(sqlite3_prepare_v2(h, "SELECT idx, steps, tokens, converged FROM canvases "
                                "WHERE request = ? ORDER BY idx", -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_int64(st, 1, rowid);
    while (sqlite3_step(st) == SQLITE_ROW) {
        CHECK(sqlite3_column_int(st, 0) == n);
        if (s->stream) {
            CHECK(n < s->n_canvas);
            CHECK(sqlite3_column_int(st, 0) == s->canvas[n].index);
            CHECK(sqlite3_column_int(st, 1) == s->canvas[n].steps);
            CHECK(sqlite3_column_int(st, 2) == s->canvas[n].tokens);
            CHECK(sqlite3_column_int(st, 3) == s->canvas[n].converged);
        }
        n++;
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    CHECKF(n == s->canvases, "%d canvas rows, done said %d", n, s->canvases);
    CHECK(!s->stream || n == s->n_canvas);
    return 0;
}

/* ---- cases ---------------------------------------------------------------------- */

static int rows_match_events(void)
{
    const char *db = test_path("rows.sqlite");
    enum { N = 8 };
    struct seen s[N + 1];
    int accepted = 0;
    int64_t canvases = 0;
    char *t;

    memset(s, 0, sizeof s);
    CHECK(start_daemon(db, NULL) == 0);
    for (int i = 0; i < N; i++) {
        s[i].stream = i % 2 == 0;
        s[i].batch = i == 3;
        s[i].max_tokens = 8 + 8 * (i % 3);
        if (i % 3 != 2)
            snprintf(s[i].tag, sizeof s[i].tag, "job-%d", i);
    }
    s[5].cancel_after_first = 1; /* cancelled after its first canvas */
    s[5].stream = 1;
    s[5].max_tokens = 400;
    s[5].steps = 48;
    s[5].want_seed = 7; /* (a seed whose output has no stop token early on: it must
                         * still be running when the cancel comes) */
    /* s[N]: refused (a value out of range) */
    snprintf(s[N].tag, sizeof s[N].tag, "refused");
    for (int i = 0; i < N; i++)
        if (submit(&s[i], i % 2 ? "The metrics of a request" : "hello"))
            return 1;
    {
        dgemma_request_t *r = dgemma_request_text("x");
        CHECK(r && (s[N].c = open_conn()) != NULL);
        CHECK(dgemma_request_set_real(r, "top_p", 7.0) == 0);
        CHECK(dgemma_request_set_tag(r, "refused") == 0);
        CHECK(dgemma_submit(s[N].c, r) == 0);
        dgemma_request_free(r);
    }
    for (int i = 0; i <= N; i++)
        if (collect(&s[i]))
            return 1;
    CHECKF(s[N].end == DGEMMA_EV_ERROR && s[N].id == 0, "refused request: %s", s[N].finish);
    CHECK(!strcmp(s[5].finish, "cancelled") && s[5].canvases >= 1);
    for (int i = 0; i < N; i++) {
        CHECKF(s[i].end == DGEMMA_EV_DONE && s[i].id > 0, "request %d ended %s %s", i,
               s[i].finish, s[i].code);
        accepted++;
        canvases += s[i].canvases;
    }
    CHECK(stop_daemon() == 0);

    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE request_id IS NOT NULL") == accepted);
    CHECK(q_int(db, "SELECT count(*) FROM canvases") == canvases);
    for (int i = 0; i < N; i++)
        if (check_row(db, &s[i]))
            return 1;
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE finish = 'rejected'") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE finish = 'rejected' AND "
                    "request_id IS NULL AND tag = 'refused' AND error_code = '%s' AND "
                    "uid = %d AND canvases = 0", s[N].code, (int)getuid()) == 1);
    CHECK(q_int(db, "SELECT count(*) FROM runs") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM runs WHERE id = 1 AND stopped >= started AND "
                    "backend = 'cpu' AND tp = 1 AND length(config_digest) > 0") == 1);
    CHECK(q_int(db, "SELECT count(DISTINCT backend || tp) FROM requests") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'start'") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'stop'") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'config'") == 1);
    t = q_text(db, "PRAGMA integrity_check");
    CHECK(t && !strcmp(t, "ok"));
    free(t);
    return 0;
}

/* A child process that holds a read transaction open and the write lock
 * until told to let go.  *go: write a byte to release it. */
static pid_t lock_holder(const char *db, int *go)
{
    int ready[2], release[2];
    pid_t pid;
    char b;
    if (pipe(ready) != 0 || pipe(release) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        sqlite3 *r = NULL, *w = NULL;
        int ok;
        close(ready[0]);
        close(release[1]);
        ok = sqlite3_open(db, &r) == SQLITE_OK && sqlite3_open(db, &w) == SQLITE_OK &&
             sqlite3_exec(r, "BEGIN; SELECT count(*) FROM requests", NULL, NULL, NULL) ==
                 SQLITE_OK &&
             sqlite3_exec(w, "BEGIN EXCLUSIVE", NULL, NULL, NULL) == SQLITE_OK;
        b = ok ? 'y' : 'n';
        if (write(ready[1], &b, 1) != 1 || !ok)
            _exit(1);
        if (read(release[0], &b, 1) != 1)
            _exit(1);
        ok = sqlite3_exec(w, "COMMIT", NULL, NULL, NULL) == SQLITE_OK &&
             sqlite3_exec(r, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
        sqlite3_close(w);
        sqlite3_close(r);
        _exit(ok ? 0 : 1);
    }
    close(ready[1]);
    close(release[0]);
    if (pid < 0 || read(ready[0], &b, 1) != 1 || b != 'y') {
        close(ready[0]);
        close(release[1]);
        if (pid > 0)
            waitpid(pid, NULL, 0);
        return -1;
    }
    close(ready[0]);
    *go = release[1];
    return pid;
}

static int release_holder(pid_t pid, int go)
{
    int st = 0;
    if (write(go, "x", 1) != 1)
        return -1;
    close(go);
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int locked_below_bound(void)
{
    const char *db = test_path("locked.sqlite");
    const int M = 6;
    struct mstat ms = {0};
    int go = -1;
    pid_t holder;

    CHECK(start_daemon(db, NULL) == 0);
    CHECK(wait_count(db, 2, 10, "SELECT count(*) FROM events") == 0); /* start, config */
    CHECK((holder = lock_holder(db, &go)) > 0);
    CHECK(run_requests(M, 8) == 0); /* generation goes on */
    /* (the writer's first try may still be waiting out its busy timeout) */
    for (int tries = 0; metrics_status(&ms) == 0 && ms.retries == 0 && tries < 250; tries++)
        usleep(20000);
    CHECKF(ms.queued == M && ms.lost == 0 && ms.retries > 0 && ms.requests_written == 0,
           "queued %lld lost %lld retries %lld written %lld", ms.queued, ms.lost, ms.retries,
           ms.requests_written);
    CHECKF(ms.failing == 1 && ms.last_error_at > 1e9, "failing %d, last error at %.0f",
           ms.failing, ms.last_error_at);
    CHECK(q_int(db, "SELECT count(*) FROM requests") == 0);
    CHECK(release_holder(holder, go) == 0);
    CHECK(wait_count(db, M, 15, "SELECT count(*) FROM requests") == 0);
    CHECK(metrics_status(&ms) == 0);
    CHECK(ms.queued == 0 && ms.lost == 0 && ms.requests_written == M);
    CHECK(ms.failing == 0 && ms.last_error_at > 1e9);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'metrics_lost'") == 0);
    CHECK(stop_daemon() == 0);
    CHECK(q_int(db, "SELECT count(*) FROM requests") == M);
    return 0;
}

static int locked_above_bound(void)
{
    const char *db = test_path("overflow.sqlite");
    const char *const extra[] = {"metrics_queue=4", NULL};
    const int N = 10, Q = 4;
    struct mstat ms = {0};
    int go = -1;
    pid_t holder;
    char *t;

    CHECK(start_daemon(db, extra) == 0);
    CHECK(wait_count(db, 2, 10, "SELECT count(*) FROM events") == 0);
    CHECK((holder = lock_holder(db, &go)) > 0);
    CHECK(run_requests(N, 8) == 0);
    CHECK(metrics_status(&ms) == 0);
    CHECKF(ms.queued == Q && ms.lost == N - Q, "queued %lld lost %lld", ms.queued, ms.lost);
    CHECK(release_holder(holder, go) == 0);
    CHECK(wait_count(db, Q, 15, "SELECT count(*) FROM requests") == 0);
    /* the loss is recorded once the file takes writes: in one event, or in
     * two when a transaction that began before the last loss was counted
     * commits first ("5 ... (5 in all)", then "1 ... (6 in all)"); the
     * reports add up to the total either way */
    CHECK(wait_count(db, 1, 15, "SELECT count(*) FROM events WHERE kind = 'metrics_lost' "
                                "AND detail LIKE '% (6 in all)'") == 0);
    CHECK(metrics_status(&ms) == 0);
    CHECK(ms.queued == 0 && ms.lost == N - Q && ms.requests_written == Q);
    CHECK(q_int(db, "SELECT sum(CAST(detail AS INTEGER)) FROM events "
                    "WHERE kind = 'metrics_lost'") == N - Q);
    t = q_text(db, "SELECT detail FROM events WHERE kind = 'metrics_lost' ORDER BY id DESC");
    CHECKF(t && strstr(t, " records lost since the last report (6 in all)"), "event: %s",
           t ? t : "(none)");
    free(t);
    CHECK(stop_daemon() == 0);
    CHECK(q_int(db, "SELECT count(*) FROM requests") == Q);
    return 0;
}

static int kill9_mid_run(void)
{
    const char *db = test_path("killed.sqlite");
    enum { K = 4 };
    struct seen s[K];
    dgemma_event_t ev;
    char *t;

    memset(s, 0, sizeof s);
    CHECK(start_daemon(db, NULL) == 0);
    CHECK(run_requests(3, 8) == 0);
    CHECK(wait_count(db, 3, 10, "SELECT count(*) FROM requests") == 0);
    /* more in flight, some rows on their way, then the daemon dies */
    for (int i = 0; i < K; i++) {
        s[i].stream = 1;
        s[i].max_tokens = 64 + 64 * i;
        CHECK(submit(&s[i], "killed mid-run") == 0);
    }
    CHECK(dgemma_next_event(s[0].c, &ev, WAIT_MS) == 0); /* accepted */
    CHECK(dgemma_next_event(s[0].c, &ev, WAIT_MS) == 0 && ev.kind == DGEMMA_EV_CANVAS);
    kill(daemon_pid, SIGKILL);
    waitpid(daemon_pid, NULL, 0);
    daemon_pid = 0;
    for (int i = 0; i < K; i++)
        dgemma_close(s[i].c);
    unlink(sock_path);

    t = q_text(db, "PRAGMA integrity_check");
    CHECKF(t && !strcmp(t, "ok"), "integrity_check: %s", t ? t : "(failed)");
    free(t);
    CHECK(q_int(db, "SELECT count(*) FROM requests") >= 3);
    CHECK(q_int(db, "SELECT count(*) FROM canvases") ==
          q_int(db, "SELECT sum(canvases) FROM requests"));
    CHECK(q_int(db, "SELECT count(*) FROM runs WHERE stopped IS NULL") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM events WHERE kind = 'stop'") == 0);

    /* the next run writes to the same file */
    CHECK(start_daemon(db, NULL) == 0);
    CHECK(run_requests(1, 8) == 0);
    CHECK(stop_daemon() == 0);
    CHECK(q_int(db, "SELECT count(*) FROM runs") == 2);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE run = 2") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM runs WHERE id = 2 AND stopped IS NOT NULL") == 1);
    t = q_text(db, "PRAGMA integrity_check");
    CHECK(t && !strcmp(t, "ok"));
    free(t);
    return 0;
}

/* dgemma-client batch marks its requests: their rows say source 'batch'. */
static int batch_source(void)
{
    const char *db = test_path("batch.sqlite");
    const char *in = test_path("batch.in"), *out = test_path("batch.out");
    char cmd[4096];
    FILE *f;

    CHECK(start_daemon(db, NULL) == 0);
    CHECK((f = fopen(in, "w")) != NULL);
    /* (the third refused by the daemon's parse: recorded as batch too, where
     * it was socket) */
    fputs("{\"id\":\"a\",\"prompt\":\"one\",\"max_tokens\":8}\n"
          "{\"id\":\"b\",\"prompt\":\"two\",\"max_tokens\":8}\n"
          "{\"id\":\"c\",\"prompt\":\"three\",\"top_p\":7}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s batch -s %s --input %s --output %s", fixture_bin("dgemma-client"),
             sock_path, in, out);
    {
        const int st = system(cmd);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "batch: status %d", st);
    }
    CHECK(run_requests(1, 8) == 0); /* and one that is not */
    CHECK(stop_daemon() == 0);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE source = 'batch'") == 3);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE source = 'batch' AND "
                    "finish = 'rejected' AND error_code = 'bad_request'") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE source = 'socket'") == 1);
    CHECK(q_int(db, "SELECT count(*) FROM requests WHERE source = 'batch' AND "
                    "tag IN ('b0', 'b1') AND finish IN ('stop', 'length')") == 2);
    return 0;
}

/* Kill a daemon a failed case left behind. */
static void reap(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
    }
}

int main(void)
{
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    signal(SIGPIPE, SIG_IGN);
    TEST_CASE(rows_match_events);
    reap();
    TEST_CASE(locked_below_bound);
    reap();
    TEST_CASE(locked_above_bound);
    reap();
    TEST_CASE(kill9_mid_run);
    reap();
    TEST_CASE(batch_source);
    reap();
    return test_finish();
}
