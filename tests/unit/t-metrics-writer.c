/*
 * t-metrics-writer - the daemon's metrics writer (daemon/metrics.c): every
 * record handed over lands, with its canvases, and a second run gets its
 * own row; with the file locked by another connection the producers never
 * wait, exactly queue_max records are kept and the rest counted as lost,
 * the kept ones land once the lock goes and the loss is recorded as an
 * event; a record the schema refuses is dropped alone, the records
 * batched with it land; a stop with the file locked gives up after
 * stop_wait_s; a bad file is refused at create.
 */
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/dlog.h"
#include "daemon/metrics.h"
#include "lib/metrics-db.h"
#include "tests/harness.h"
#include "tests/sql-peek.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* 24 random bits (harness.h's stream) */
static unsigned rnd(void)
{
    return (unsigned)(test_xorshift(&rng_state) >> 40);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* (a fresh connection each: the writer's view is not trusted) */
#define peek(path, sql) test_sql_int(path, "%s", sql)
#define peek_text(path, sql) test_sql_text(path, 0, sql)

static struct dmetrics_options options(const char *path, size_t q, double flush)
{
    struct dmetrics_options o = {
        .path = path, .queue_max = q, .flush_s = flush, .retention_days = 0, .max_bytes = 0,
        .busy_ms = 50, .stop_wait_s = 2.0, .version = "test", .model = "m", .backend = "cpu",
        .config_digest = "0123", .config_text = "model: m\n", .tp = 1,
    };
    return o;
}

/* Hand over request id with n random canvases; *tokens, *steps get its totals. */
static int send_request(struct dmetrics *m, uint64_t id, int n, int64_t *tokens, int64_t *steps)
{
    struct dg_metrics_canvas cv[16];
    struct dg_metrics_request r = {0};
    double t = dmetrics_now();
    r.request_id = id;
    r.tag = (id & 1) ? "odd" : NULL;
    r.uid = 1000;
    r.pid = 1;
    r.source = (enum dg_metrics_source)(id % 3);
    r.submitted = t - 1;
    r.started = t - 0.5;
    r.first_canvas = n ? t - 0.2 : 0;
    r.finished = t;
    r.prompt_tokens = 5;
    for (int i = 0; i < n; i++) {
        cv[i] = (struct dg_metrics_canvas){i, 1 + (int)(rnd() % 32), 1, (int)(rnd() % 17),
                                           1.5, 0.25};
        r.completion_tokens += cv[i].tokens;
        r.steps += cv[i].steps;
    }
    r.canvases = n;
    r.tokens_per_s = 10;
    r.ttfc_ms = n ? 800 : -1;
    r.total_ms = 1000;
    r.settings_json = "{\"seed\":3}";
    r.finish = n ? "stop" : "cancelled";
    r.canvas = cv;
    r.n_canvas = n;
    if (tokens)
        *tokens += r.completion_tokens;
    if (steps)
        *steps += r.steps;
    return dmetrics_request(m, &r);
}

/* The counter a wait looks at. */
enum counter { REQUESTS, EVENTS, LOST };

/* Wait (up to limit_s) until the writer's counter `which` reaches want:
 * 0, or -1 when the time ran out. */
static int wait_count(struct dmetrics *m, enum counter which, uint64_t want, double limit_s)
{
    double end = mono() + limit_s;
    struct dmetrics_counters c;
    for (;;) {
        dmetrics_counters(m, &c);
        if ((which == REQUESTS ? c.requests : which == EVENTS ? c.events : c.lost) >= want)
            return 0;
        if (mono() > end)
            return -1;
        usleep(5000);
    }
}

/* Request rows written, events written: wait_count's two common waits. */
static int wait_requests(struct dmetrics *m, uint64_t want, double limit_s)
{
    return wait_count(m, REQUESTS, want, limit_s);
}

static int wait_events(struct dmetrics *m, uint64_t want, double limit_s)
{
    return wait_count(m, EVENTS, want, limit_s);
}

/* Lines of the log file at path that hold both a and b (b NULL: a alone);
 * -1 when it cannot be read. */
static int log_lines(const char *path, const char *a, const char *b)
{
    char line[1024];
    int n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        n += strstr(line, a) && (!b || strstr(line, b));
    fclose(f);
    return n;
}

static int every_record_lands(void)
{
    const char *path = test_path("all.sqlite");
    struct dmetrics_options o = options(path, 4096, 0.02);
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    int64_t tokens = 0, steps = 0, canvases = 0;
    char *s;

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    for (uint64_t id = 1; id <= 300; id++) {
        int n = (int)(rnd() % 9);
        canvases += n;
        CHECK(send_request(m, id, n, &tokens, &steps) == 0);
        if (id % 50 == 0)
            usleep(10000); /* several batches */
    }
    CHECK(dmetrics_event(m, "reload", "SIGHUP") == 0);
    CHECK(wait_requests(m, 300, 10) == 0);
    dmetrics_counters(m, &c);
    CHECK(c.lost == 0 && c.run == 1);
    dmetrics_destroy(m);

    CHECK(peek(path, "SELECT count(*) FROM requests WHERE run = 1") == 300);
    CHECK(peek(path, "SELECT count(DISTINCT request_id) FROM requests") == 300);
    CHECK(peek(path, "SELECT sum(canvases) FROM requests") == canvases);
    CHECK(peek(path, "SELECT count(*) FROM canvases") == canvases);
    CHECK(peek(path, "SELECT sum(completion_tokens) FROM requests") == tokens);
    CHECK(peek(path, "SELECT sum(tokens) FROM canvases") == tokens);
    CHECK(peek(path, "SELECT sum(steps) FROM canvases") == steps);
    CHECK(peek(path, "SELECT sum(steps) FROM requests") == steps);
    /* the rows say what was handed over */
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE tag = 'odd'") == 150);
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE source = 'batch'") == 100);
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE finish = 'cancelled' "
                     "AND canvases = 0 AND ttfc_ms IS NULL AND first_canvas IS NULL") ==
          peek(path, "SELECT count(*) FROM requests WHERE canvases = 0"));
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'start'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'config' "
                     "AND detail = 'model: m\n'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'reload'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'stop'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM runs WHERE stopped IS NOT NULL "
                     "AND stopped >= started") == 1);
    s = peek_text(path, "SELECT backend || ' ' || config_digest || ' ' || version FROM runs");
    CHECKF(s && !strcmp(s, "cpu 0123 test"), "run row: %s", s ? s : "(null)");
    free(s);
    s = peek_text(path, "PRAGMA integrity_check");
    CHECK(s && !strcmp(s, "ok"));
    free(s);

    /* a second daemon run: its own row, the first one's kept */
    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(send_request(m, 1, 2, NULL, NULL) == 0); /* ids are unique per run */
    CHECK(wait_requests(m, 1, 10) == 0);
    dmetrics_counters(m, &c);
    CHECK(c.run == 2 && c.lost == 0);
    dmetrics_destroy(m);
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE run = 2") == 1);
    CHECK(peek(path, "SELECT count(*) FROM runs WHERE stopped IS NOT NULL") == 2);
    return 0;
}

/* Another connection holds the write lock; Q records wait, the rest are
 * counted; nobody blocks. */
static int bound_while_locked(void)
{
    const char *path = test_path("locked.sqlite");
    const size_t Q = 16;
    const int N = 50;
    struct dmetrics_options o = options(path, Q, 0.02);
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    sqlite3 *h = NULL;
    double worst = 0;
    int accepted = 0;
    char *s;

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(wait_events(m, 2, 10) == 0); /* start and config written: the queue is empty */
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
    for (int i = 0; i < N; i++) {
        double t0 = mono();
        int rc = send_request(m, (uint64_t)i + 1, 3, NULL, NULL);
        double dt = mono() - t0;
        if (dt > worst)
            worst = dt;
        if (rc == 0) {
            CHECKF(i < (int)Q, "record %d accepted beyond the bound", i);
            accepted++;
        }
        usleep(2000); /* let the writer try (and fail) meanwhile */
    }
    usleep(300000);
    dmetrics_counters(m, &c);
    CHECKF(accepted == (int)Q, "%d accepted, want %zu", accepted, Q);
    CHECKF(c.held == Q && c.lost == (uint64_t)(N - (int)Q),
           "held %llu lost %llu", (unsigned long long)c.held, (unsigned long long)c.lost);
    CHECK(c.requests == 0 && c.retries > 0 && c.last_error[0]);
    CHECK(c.failing && c.last_error_at > 1e9);
    /* (a producer that waited on the database would wait busy_ms = 50 ms at least) */
    CHECKF(worst < 0.04, "a producer waited %.1f ms", worst * 1e3);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 0);

    CHECK(sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
    CHECK(wait_requests(m, Q, 15) == 0);
    dmetrics_counters(m, &c);
    CHECK(c.held == 0 && c.lost == (uint64_t)(N - (int)Q));
    /* written again: not failing, the last failure still told */
    CHECK(!c.failing && c.last_error[0] && c.last_error_at > 1e9);
    CHECK(peek(path, "SELECT count(*) FROM requests") == (int64_t)Q);
    CHECK(peek(path, "SELECT min(request_id) FROM requests") == 1);
    CHECK(peek(path, "SELECT max(request_id) FROM requests") == (int64_t)Q);
    CHECK(peek(path, "SELECT count(*) FROM canvases") == 3 * (int64_t)Q);
    s = peek_text(path, "SELECT detail FROM events WHERE kind = 'metrics_lost'");
    CHECKF(s && !strcmp(s, "34 records lost since the last report (34 in all)"),
           "metrics_lost event: %s", s ? s : "(none)");
    free(s);
    dmetrics_destroy(m);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'metrics_lost'") == 1);
    return 0;
}

/* A record the schema refuses (a duplicate request id within a run) goes
 * alone; the records in its batch land. */
static int poison_record(void)
{
    const char *path = test_path("poison.sqlite");
    struct dmetrics_options o = options(path, 6, 60); /* flushes when half full */
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    char *s;

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(send_request(m, 7, 1, NULL, NULL) == 0); /* start + config + 7: half full */
    CHECK(wait_requests(m, 1, 10) == 0);
    CHECK(send_request(m, 8, 2, NULL, NULL) == 0);
    CHECK(send_request(m, 7, 4, NULL, NULL) == 0); /* the duplicate */
    CHECK(send_request(m, 9, 3, NULL, NULL) == 0);
    CHECK(wait_requests(m, 3, 10) == 0);
    dmetrics_counters(m, &c);
    CHECKF(c.lost == 1 && c.held == 0, "lost %llu held %llu", (unsigned long long)c.lost,
           (unsigned long long)c.held);
    CHECK(strstr(c.last_error, "1 records dropped") != NULL);
    CHECK(!c.failing && c.last_error_at > 1e9); /* (the rest was written) */
    CHECK(peek(path, "SELECT count(*) FROM requests") == 3);
    CHECK(peek(path, "SELECT canvases FROM requests WHERE request_id = 7") == 1);
    CHECK(peek(path, "SELECT count(*) FROM canvases") == 1 + 2 + 3);
    /* and the writer goes on: later records land, the loss is recorded */
    CHECK(send_request(m, 10, 1, NULL, NULL) == 0);
    dmetrics_destroy(m);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 4);
    s = peek_text(path, "SELECT detail FROM events WHERE kind = 'metrics_lost'");
    CHECKF(s && !strcmp(s, "1 records lost since the last report (1 in all)"),
           "metrics_lost event: %s", s ? s : "(none)");
    free(s);
    return 0;
}

/* Stopping while another connection holds the lock gives up after
 * stop_wait_s; the file is fine afterwards. */
static int stop_while_locked(void)
{
    const char *path = test_path("stop.sqlite");
    struct dmetrics_options o = options(path, 64, 0.02);
    struct dg_metrics_db *db = NULL;
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    sqlite3 *h = NULL;
    double t0;
    char *s;

    o.stop_wait_s = 0.3;
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    dg_metrics_db_close(db);
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    for (int i = 0; i < 5; i++)
        CHECK(send_request(m, (uint64_t)i + 1, 1, NULL, NULL) == 0);
    usleep(100000);
    dmetrics_counters(m, &c);
    CHECK(c.requests == 0 && c.held == 7);
    t0 = mono();
    dmetrics_destroy(m);
    CHECKF(mono() - t0 < 3.0, "stop took %.2f s", mono() - t0);
    CHECK(sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 0);
    CHECK(peek(path, "SELECT count(*) FROM runs") == 0);
    s = peek_text(path, "PRAGMA integrity_check");
    CHECK(s && !strcmp(s, "ok"));
    free(s);
    return 0;
}

/* Holds the write lock of a file from its own thread, for a while. */
struct locker {
    const char *path;
    double hold_s;
    int locked; /* (atomic) 0 not yet, 1 held, -1 never taken */
    int ok;
};

static void *lock_for_a_while(void *arg)
{
    struct locker *l = arg;
    sqlite3 *h = NULL;
    if (sqlite3_open(l->path, &h) == SQLITE_OK &&
        sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
        __atomic_store_n(&l->locked, 1, __ATOMIC_RELEASE);
        usleep((useconds_t)(l->hold_s * 1e6));
        l->ok = sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
    } else {
        __atomic_store_n(&l->locked, -1, __ATOMIC_RELEASE);
    }
    sqlite3_close(h);
    return NULL;
}

/* A stop that finds the file locked waits up to stop_wait_s for it, also
 * when the writer was asleep when the stop came (it gave up at its first
 * try): a lock let go within that time loses nothing. */
static int stop_waits_for_lock(void)
{
    const char *path = test_path("stopwait.sqlite");
    struct dmetrics_options o = options(path, 64, 60); /* (the writer asleep) */
    struct dg_metrics_db *db = NULL;
    struct dmetrics *m = NULL;
    struct dg_error err = {0};
    struct locker l = {path, 0.8, 0, 0};
    pthread_t t;
    double t0;

    o.stop_wait_s = 4.0;
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    dg_metrics_db_close(db);
    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    usleep(100000); /* (the writer waits out its 60 s flush) */
    for (int i = 0; i < 5; i++)
        CHECK(send_request(m, (uint64_t)i + 1, 1, NULL, NULL) == 0);
    CHECK(pthread_create(&t, NULL, lock_for_a_while, &l) == 0);
    while (__atomic_load_n(&l.locked, __ATOMIC_ACQUIRE) == 0)
        usleep(1000);
    t0 = mono();
    dmetrics_destroy(m);
    pthread_join(t, NULL);
    CHECK(l.locked == 1 && l.ok);
    CHECKF(mono() - t0 >= 0.7 && mono() - t0 < 4.5, "stop took %.2f s", mono() - t0);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 5);
    CHECK(peek(path, "SELECT count(*) FROM runs WHERE stopped IS NOT NULL") == 1);
    return 0;
}

/* Records the file refuses one by one (a damaged file refuses them all)
 * are logged at most once in LOSS_LOG_PERIOD_S, each counted. */
static int drops_logged_sparingly(void)
{
    const char *path = test_path("drops.sqlite"), *log = test_path("drops.log");
    struct dmetrics_options o = options(path, 64, 0.01);
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    int lines;

    CHECK_OK(dlog_open(log, DG_LOG_INFO, &err), &err);
    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(send_request(m, 7, 1, NULL, NULL) == 0);
    CHECK(wait_requests(m, 1, 10) == 0);
    for (int i = 0; i < 10; i++) { /* the same request id again: refused, each alone */
        CHECK(send_request(m, 7, 1, NULL, NULL) == 0);
        usleep(30000);
    }
    CHECK(wait_count(m, LOST, 10, 10) == 0);
    dmetrics_counters(m, &c);
    CHECKF(c.lost == 10, "lost %llu", (unsigned long long)c.lost);
    dmetrics_destroy(m);
    dlog_close();
    lines = log_lines(log, " E metrics: ", " dropped"); /* (errors) */
    CHECKF(lines == 1, "%d log lines for 10 dropped records", lines);
    return 0;
}

/* After a failure the writer waits out its pause (0.1 s, doubling) even
 * while records keep coming past half the queue: a locked file for 1.2 s
 * is tried a handful of times, not at every record. */
static int pause_kept_under_load(void)
{
    const char *path = test_path("pause.sqlite");
    struct dmetrics_options o = options(path, 256, 0.02);
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    sqlite3 *h = NULL;
    double t0, locked_s, most;

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(wait_events(m, 2, 10) == 0);
    CHECK(sqlite3_open(path, &h) == SQLITE_OK);
    CHECK(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
    t0 = mono();
    for (int i = 0; i < 200; i++) { /* past half the queue from the 128th on */
        CHECK(send_request(m, (uint64_t)i + 1, 1, NULL, NULL) == 0);
        usleep(6000);
    }
    dmetrics_counters(m, &c);
    locked_s = mono() - t0;
    /* pauses of 0.1, 0.2, 0.4, ... s: in T seconds a first try and at most
     * log2(1 + T / 0.1) more (5 in the 1.2 s or so this takes; one more
     * allowed) */
    most = 2 + log2(1 + locked_s / 0.1);
    CHECKF(c.retries >= 1 && (double)c.retries <= most, "%llu retries in %.2f s locked",
           (unsigned long long)c.retries, locked_s);
    CHECK(sqlite3_exec(h, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(h);
    CHECK(wait_requests(m, 200, 15) == 0);
    dmetrics_destroy(m);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 200);
    return 0;
}

/* The file renamed under a running writer: said once in the log (the
 * rows go on to the renamed file, none lost), and said again when the
 * path names it once more. */
static int file_moved(void)
{
    const char *path = test_path("moved.sqlite"), *away = test_path("away.sqlite");
    const char *log = test_path("moved.log");
    struct dmetrics_options o = options(path, 64, 0.01);
    struct dmetrics *m = NULL;
    struct dg_error err = {0};
    int moved, back;

    CHECK_OK(dlog_open(log, DG_LOG_INFO, &err), &err);
    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(send_request(m, 1, 1, NULL, NULL) == 0);
    CHECK(wait_requests(m, 1, 10) == 0);
    CHECK(rename(path, away) == 0);
    for (int i = 0; i < 25; i++) { /* 1.25 s: past a check */
        CHECK(send_request(m, (uint64_t)i + 2, 1, NULL, NULL) == 0);
        usleep(50000);
    }
    CHECK(wait_requests(m, 26, 10) == 0);
    CHECK(rename(away, path) == 0);
    for (int i = 0; i < 25; i++) {
        CHECK(send_request(m, (uint64_t)i + 100, 1, NULL, NULL) == 0);
        usleep(50000);
    }
    dmetrics_destroy(m);
    dlog_close();
    moved = log_lines(log, " E metrics: ", "no longer names the file");
    back = log_lines(log, "names the file being written again", NULL);
    CHECKF(moved == 1 && back == 1, "%d 'moved' and %d 'again' log lines", moved, back);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 51);
    return 0;
}

/* A queue too small for its bursts loses records in every burst: the
 * losses go into a metrics_lost event at most every 10 s (and at the
 * stop), the last one's total every record lost. */
static int lost_events_sparingly(void)
{
    const char *path = test_path("bursts.sqlite");
    struct dmetrics_options o = options(path, 2, 0.005);
    struct dmetrics *m = NULL;
    struct dmetrics_counters c;
    struct dg_error err = {0};
    unsigned long long in_all = 0;
    char *s;

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(wait_events(m, 2, 10) == 0);
    for (int b = 0; b < 40; b++) { /* bursts of 5, 20 ms apart */
        for (int i = 0; i < 5; i++)
            send_request(m, (uint64_t)(b * 5 + i + 1), 1, NULL, NULL);
        usleep(20000);
    }
    dmetrics_counters(m, &c);
    CHECKF(c.lost >= 40, "%llu lost", (unsigned long long)c.lost);
    dmetrics_destroy(m);
    CHECKF(peek(path, "SELECT count(*) FROM events WHERE kind = 'metrics_lost'") <= 2,
           "%lld metrics_lost events in about 1 s",
           (long long)peek(path, "SELECT count(*) FROM events WHERE kind = 'metrics_lost'"));
    s = peek_text(path, "SELECT detail FROM events WHERE kind = 'metrics_lost' ORDER BY id DESC "
                        "LIMIT 1");
    CHECK(s && sscanf(strchr(s, '(') ? strchr(s, '(') : s, "(%llu in all)", &in_all) == 1);
    free(s);
    CHECK(peek(path, "SELECT count(*) FROM requests") + (int64_t)in_all == 200);
    return 0;
}

/* The smallest queue (metrics_queue 1) still keeps the run's start,
 * config and stop events: they are not held to the bound. */
static int queue_of_one(void)
{
    const char *path = test_path("q1.sqlite");
    struct dmetrics_options o = options(path, 1, 0.01);
    struct dmetrics *m = NULL;
    struct dg_error err = {0};

    CHECK_OK(dmetrics_create(&o, &m, &err), &err);
    CHECK(wait_events(m, 2, 10) == 0);
    dmetrics_destroy(m);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'start'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'config'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'stop'") == 1);
    return 0;
}

static int refused_at_create(void)
{
    const char *junk = test_path("junk.sqlite");
    struct dmetrics_options o = options(junk, 8, 0.1);
    struct dmetrics *m = (struct dmetrics *)1;
    struct dg_error err = {0};
    FILE *f = fopen(junk, "w");

    CHECK(f != NULL);
    for (int i = 0; i < 200; i++)
        fputs("this is not a database\n", f);
    fclose(f);
    CHECK(dmetrics_create(&o, &m, &err) == -DG_E_FORMAT && m == NULL);
    CHECKF(strstr(err.msg, "not an SQLite database") != NULL, "%s", err.msg);
    o.path = "/nonexistent-dir/x.sqlite";
    CHECK(dmetrics_create(&o, &m, &err) == -DG_E_IO && m == NULL);
    CHECKF(strstr(err.msg, "/nonexistent-dir/x.sqlite") != NULL, "%s", err.msg);
    o.path = test_path("q0.sqlite");
    o.queue_max = 0;
    CHECK(dmetrics_create(&o, &m, &err) == -DG_E_INVAL && m == NULL);
    /* no metrics: the calls are no-ops */
    CHECK(send_request(NULL, 1, 1, NULL, NULL) == 0);
    CHECK(dmetrics_event(NULL, "reload", NULL) == 0);
    dmetrics_destroy(NULL);
    return 0;
}

int main(void)
{
    TEST_CASE(every_record_lands);
    TEST_CASE(bound_while_locked);
    TEST_CASE(poison_record);
    TEST_CASE(stop_while_locked);
    TEST_CASE(stop_waits_for_lock);
    TEST_CASE(drops_logged_sparingly);
    TEST_CASE(queue_of_one);
    TEST_CASE(pause_kept_under_load);
    TEST_CASE(file_moved);
    TEST_CASE(lost_events_sparingly);
    TEST_CASE(refused_at_create);
    return test_finish();
}
