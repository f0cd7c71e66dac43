/*
 * t-metrics-db - the metrics database: a new file gets WAL, the schema
 * version and every table; rows round-trip; a file from a newer schema, a
 * file that is not SQLite and a missing directory are refused with clear
 * errors and left untouched; a v0 file (an empty SQLite database) is
 * migrated; a second connection's lock is DG_E_BUSY, not a hang; retention
 * by age and by size deletes exactly the rows it should; the check that
 * --check-config makes passes what a daemon could use and refuses the rest
 * without creating or changing a file; a stopped daemon's file is read by
 * a reader who may not write its directory; a damaged file and a negative
 * version are named as such.
 */
#include <fcntl.h>
#include <grp.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/metrics-db.h"
#include "tests/harness.h"
#include "tests/sql-peek.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull; /* (never 0: seeded below by xor) */

/* 24 random bits (harness.h's stream) */
static unsigned rnd(void)
{
    return (unsigned)(test_xorshift(&rng_state) >> 40);
}

/* (a fresh connection each: the writer's view is not trusted) */
#define peek(path, sql) test_sql_int(path, "%s", sql)
#define peek_text(path, sql) test_sql_text(path, 0, sql)

static int raw_exec(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    int rc = sqlite3_open(path, &h);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(h, sql, NULL, NULL, NULL);
    sqlite3_close(h);
    return rc;
}

/* A request row with n canvases of random content, finished at t. */
static void make_request(struct dg_metrics_request *r, struct dg_metrics_canvas *cv, int n,
                         uint64_t id, double t)
{
    memset(r, 0, sizeof *r);
    r->request_id = id;
    r->tag = (id % 3) ? "tag" : NULL;
    r->uid = 1000 + (int64_t)(id % 4);
    r->pid = 4242;
    r->source = (enum dg_metrics_source)(id % 3);
    r->submitted = t - 2.0;
    r->started = t - 1.5;
    r->first_canvas = n ? t - 1.0 : 0;
    r->finished = t;
    r->prompt_tokens = 1 + rnd() % 100;
    r->completion_tokens = 0;
    r->steps = 0;
    for (int i = 0; i < n; i++) {
        cv[i] = (struct dg_metrics_canvas){i, 1 + (int)(rnd() % 64), (int)(rnd() & 1),
                                           (int)(rnd() % 33), (rnd() % 1000) / 7.0,
                                           (rnd() % 1000) / 100.0};
        r->completion_tokens += cv[i].tokens;
        r->steps += cv[i].steps;
    }
    r->canvases = n;
    r->tokens_per_s = r->completion_tokens / 1.5;
    r->ttfc_ms = n ? 1000.0 : -1;
    r->total_ms = 2000.0;
    r->settings_json = "{\"seed\":1}";
    r->finish = n ? "stop" : "cancelled";
    r->error_code = n ? NULL : "client_gone";
    r->canvas = cv;
    r->n_canvas = n;
}

static int new_file(void)
{
    const char *path = test_path("new.sqlite");
    struct dg_metrics_db *db;
    struct dg_error err = {0};
    struct dg_metrics_run run = {.started = 1000, .pid = 7, .version = "v", .host = "h",
                                 .model = "m", .backend = "cpu", .config_digest = "d", .tp = 2};
    struct dg_metrics_request r;
    struct dg_metrics_canvas cv[5];
    struct stat sb;
    int64_t id = 0;
    char *s;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK(dg_metrics_db_version(db) == DG_METRICS_SCHEMA_VERSION);
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0007) == 0);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_run(db, &run, &id, &err), &err);
    CHECK(id == 1);
    make_request(&r, cv, 5, 17, 2000.0);
    CHECK_OK(dg_metrics_db_put_request(db, id, "cpu", 2, &r, &err), &err);
    make_request(&r, cv, 0, 0, 2001.0); /* a refusal: no id, no canvas */
    r.finish = "rejected";
    r.error_code = "busy";
    r.started = 0;
    CHECK_OK(dg_metrics_db_put_request(db, id, "cpu", 2, &r, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, id, 2002.0, "start", "detail", &err), &err);
    CHECK_OK(dg_metrics_db_stop_run(db, id, 2003.0, &err), &err);
    /* nothing visible before the commit */
    CHECK(peek(path, "SELECT count(*) FROM requests") == 0);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    /* what another connection sees */
    CHECK(peek(path, "PRAGMA user_version") == DG_METRICS_SCHEMA_VERSION);
    s = peek_text(path, "PRAGMA journal_mode");
    CHECKF(s && !strcmp(s, "wal"), "journal_mode %s", s ? s : "(null)");
    free(s);
    CHECK(peek(path, "PRAGMA auto_vacuum") == 2);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 2);
    CHECK(peek(path, "SELECT count(*) FROM canvases") == 5);
    CHECK(peek(path, "SELECT sum(tokens) FROM canvases") ==
          peek(path, "SELECT completion_tokens FROM requests WHERE request_id = 17"));
    CHECK(peek(path, "SELECT sum(steps) FROM canvases") ==
          peek(path, "SELECT steps FROM requests WHERE request_id = 17"));
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE request_id IS NULL AND "
                     "started IS NULL AND first_canvas IS NULL AND ttfc_ms IS NULL AND "
                     "tokens_per_s IS NULL AND finish = 'rejected' AND error_code = 'busy'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE request_id = 17 AND run = 1 AND "
                     "uid = 1001 AND pid = 4242 AND source = 'batch' AND backend = 'cpu' AND "
                     "tp = 2 AND settings = '{\"seed\":1}' AND finish = 'stop' AND "
                     "submitted = 1998 AND started = 1998.5 AND first_canvas = 1999 AND "
                     "finished = 2000 AND ttfc_ms = 1000 AND total_ms = 2000") == 1);
    CHECK(peek(path, "SELECT count(*) FROM runs WHERE stopped = 2003 AND tp = 2 AND "
                     "backend = 'cpu' AND config_digest = 'd'") == 1);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind = 'start' AND run = 1") == 1);
    /* a duplicate request id in one run is refused (UNIQUE) and rolled back */
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    make_request(&r, cv, 1, 17, 2004.0);
    CHECK_FAILS(dg_metrics_db_put_request(db, 1, "cpu", 2, &r, &err), &err, DG_E_INTERNAL,
                "UNIQUE");
    dg_metrics_db_rollback(db);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 2);
    /* writes outside a transaction are bugs, reported as such */
    CHECK_FAILS(dg_metrics_db_put_event(db, 1, 1.0, "x", NULL, &err), &err, DG_E_INTERNAL,
                "outside a transaction");
    dg_metrics_db_close(db);
    /* reopened: the same version, nothing migrated twice */
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK(dg_metrics_db_version(db) == DG_METRICS_SCHEMA_VERSION);
    dg_metrics_db_close(db);
    /* and read-only: writes fail */
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_READ, 100, &db, &err), &err);
    CHECK(sqlite3_exec(dg_metrics_db_handle(db), "DELETE FROM requests", NULL, NULL, NULL) !=
          SQLITE_OK);
    CHECK_FAILS(dg_metrics_db_begin(db, &err), &err, DG_E_INVAL, "read-only");
    dg_metrics_db_close(db);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 2);
    return 0;
}

static int bad_files(void)
{
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    const char *junk = test_path("junk.sqlite"), *newer = test_path("newer.sqlite");
    const char *v0 = test_path("v0.sqlite");
    char buf[4096];
    struct stat a, b;
    FILE *f;

    /* not SQLite: refused, not overwritten */
    memset(buf, 'x', sizeof buf);
    f = fopen(junk, "wb");
    CHECK(f && fwrite(buf, 1, sizeof buf, f) == sizeof buf && fclose(f) == 0);
    CHECK_FAILS(dg_metrics_db_open(junk, DG_METRICS_WRITE, 100, &db, &err), &err, DG_E_FORMAT,
                "not an SQLite database");
    CHECK(db == NULL);
    CHECK_FAILS(dg_metrics_db_open(junk, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "not an SQLite database");
    f = fopen(junk, "rb");
    CHECK(f && fread(buf, 1, sizeof buf, f) == sizeof buf && fclose(f) == 0);
    for (size_t i = 0; i < sizeof buf; i++)
        CHECK(buf[i] == 'x');
    /* a newer schema: refused and untouched */
    CHECK(raw_exec(newer, "CREATE TABLE future (x); PRAGMA user_version = 99") == SQLITE_OK);
    CHECK(stat(newer, &a) == 0);
    CHECK_FAILS(dg_metrics_db_open(newer, DG_METRICS_WRITE, 100, &db, &err), &err, DG_E_FORMAT,
                "version 99 is newer");
    CHECK_FAILS(dg_metrics_db_open(newer, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "version 99 is newer");
    CHECK(stat(newer, &b) == 0 && a.st_size == b.st_size && a.st_mtime == b.st_mtime);
    CHECK(peek(newer, "PRAGMA user_version") == 99);
    CHECK(peek(newer, "SELECT count(*) FROM sqlite_master WHERE name = 'requests'") == 0);
    /* version 0 with tables: another program's database (a mistyped path),
     * refused by every open and by --check-config, and left as it is */
    CHECK(raw_exec(v0, "CREATE TABLE mine (x); INSERT INTO mine VALUES (5)") == SQLITE_OK);
    CHECK(stat(v0, &a) == 0);
    CHECK_FAILS(dg_metrics_db_open(v0, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "tables but no dgemma schema version");
    CHECK_FAILS(dg_metrics_db_open(v0, DG_METRICS_WRITE, 100, &db, &err), &err, DG_E_FORMAT,
                "tables but no dgemma schema version");
    CHECK_FAILS(dg_metrics_db_check(v0, &err), &err, DG_E_FORMAT,
                "tables but no dgemma schema version");
    CHECK(stat(v0, &b) == 0 && a.st_size == b.st_size && a.st_mtime == b.st_mtime);
    CHECK(peek(v0, "PRAGMA user_version") == 0 && peek(v0, "SELECT x FROM mine") == 5);
    CHECK(peek(v0, "SELECT count(*) FROM sqlite_master WHERE name = 'requests'") == 0);
    /* an empty SQLite file (version 0, no table) is made a metrics file */
    CHECK(raw_exec(test_path("empty.sqlite"), "PRAGMA user_version = 0") == SQLITE_OK);
    CHECK_OK(dg_metrics_db_open(test_path("empty.sqlite"), DG_METRICS_WRITE, 100, &db, &err),
             &err);
    dg_metrics_db_close(db);
    CHECK(peek(test_path("empty.sqlite"), "PRAGMA user_version") == DG_METRICS_SCHEMA_VERSION);
    /* missing: a directory that is not there, a file read-only mode needs */
    CHECK_FAILS(dg_metrics_db_open("/nonexistent/dir/m.sqlite", DG_METRICS_WRITE, 100, &db,
                                   &err), &err, DG_E_IO, "/nonexistent/dir/m.sqlite");
    CHECK_FAILS(dg_metrics_db_open(test_path("absent.sqlite"), DG_METRICS_READ, 100, &db, &err),
                &err, DG_E_IO, "absent.sqlite");
    CHECK(access(test_path("absent.sqlite"), F_OK) != 0);
    CHECK_FAILS(dg_metrics_db_open("", DG_METRICS_WRITE, 100, &db, &err), &err, DG_E_INVAL,
                "no database file");
    return 0;
}

/* A file of a newer schema that another connection holds locked while
 * the writer opens it (the open then leaves the set-up to the first
 * begin): the begin refuses it as newer and leaves it as it is, not
 * turned to WAL first. */
static int newer_locked_at_open(void)
{
    const char *path = test_path("newer-locked.sqlite");
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    sqlite3 *other = NULL;
    unsigned char hdr[20];
    struct stat a, b;
    FILE *f;

    CHECK(raw_exec(path, "CREATE TABLE future (x); PRAGMA user_version = 7") == SQLITE_OK);
    CHECK(stat(path, &a) == 0);
    CHECK(sqlite3_open(path, &other) == SQLITE_OK);
    CHECK(sqlite3_exec(other, "BEGIN EXCLUSIVE", NULL, NULL, NULL) == SQLITE_OK);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 50, &db, &err), &err);
    CHECK(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(other);
    CHECK_FAILS(dg_metrics_db_begin(db, &err), &err, DG_E_FORMAT, "version 7 is newer");
    dg_metrics_db_close(db);
    /* (bytes 18 and 19 of the header: 1 for a rollback journal, 2 for WAL) */
    f = fopen(path, "rb");
    CHECK(f && fread(hdr, 1, sizeof hdr, f) == sizeof hdr && fclose(f) == 0);
    CHECKF(hdr[18] == 1 && hdr[19] == 1, "the file was turned to WAL (%u, %u)", hdr[18], hdr[19]);
    CHECK(stat(path, &b) == 0 && a.st_size == b.st_size);
    CHECK(peek(path, "PRAGMA user_version") == 7);
    return 0;
}

/* Another connection holds the write lock: begin fails with BUSY after
 * busy_ms, and works once the lock is gone; a file locked at open is set
 * up by the first begin. */
static int locked(void)
{
    const char *path = test_path("locked.sqlite");
    struct dg_metrics_db *db;
    struct dg_error err = {0};
    sqlite3 *other = NULL;
    struct timespec t0, t1;
    double ms;

    /* locked before the writer ever opened it (rollback journal, exclusive) */
    CHECK(sqlite3_open(path, &other) == SQLITE_OK);
    CHECK(sqlite3_exec(other, "BEGIN EXCLUSIVE; PRAGMA user_version = 0", NULL, NULL, NULL) ==
          SQLITE_OK);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 50, &db, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_FAILS(dg_metrics_db_begin(db, &err), &err, DG_E_BUSY, "locked");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECKF(ms >= 40 && ms < 5000, "waited %.0f ms for a 50 ms busy timeout", ms);
    CHECK(sqlite3_exec(other, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, 0, 1.0, "e", NULL, &err), &err);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK(peek(path, "SELECT count(*) FROM events") == 1);
    /* in WAL now: a reader's long transaction does not block the writer,
     * a second writer's does */
    CHECK(sqlite3_exec(other, "BEGIN; SELECT count(*) FROM events", NULL, NULL, NULL) ==
          SQLITE_OK);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, 0, 2.0, "e", NULL, &err), &err);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK(sqlite3_exec(other, "COMMIT; BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
    CHECK_FAILS(dg_metrics_db_begin(db, &err), &err, DG_E_BUSY, "locked");
    CHECK(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL) == SQLITE_OK);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    dg_metrics_db_rollback(db);
    sqlite3_close(other);
    dg_metrics_db_close(db);
    CHECK(peek(path, "SELECT count(*) FROM events") == 2);
    return 0;
}

static int retention_by_age(void)
{
    const char *path = test_path("age.sqlite");
    struct dg_metrics_db *db;
    struct dg_error err = {0};
    struct dg_metrics_run run = {.started = 0, .pid = 1, .tp = 1};
    struct dg_metrics_request r;
    struct dg_metrics_canvas cv[8];
    struct dg_metrics_retained gone;
    int64_t id1 = 0, id2 = 0, id3 = 0;
    int64_t want_req = 0, want_cv = 0, want_ev = 0;
    const double now = 1e6, age = 1000;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    /* an old stopped run with nothing left after retention, an old one that
     * never stopped (its daemon killed: it stayed for ever), and the
     * current one, started long ago, whose start and config events stay */
    CHECK_OK(dg_metrics_db_put_run(db, &run, &id1, &err), &err);
    CHECK_OK(dg_metrics_db_stop_run(db, id1, now - 2 * age, &err), &err);
    run.started = now - 3 * age;
    CHECK_OK(dg_metrics_db_put_run(db, &run, &id3, &err), &err);
    run.started = now - 3 * age;
    CHECK_OK(dg_metrics_db_put_run(db, &run, &id2, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, id2, now - 3 * age, "start", NULL, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, id2, now - 3 * age, "config", "x: 1", &err), &err);
    for (int i = 0; i < 200; i++) {
        const double t = now - 2 * age + (double)(rnd() % (unsigned)(2 * age));
        const int n = (int)(rnd() % 8);
        make_request(&r, cv, n, (uint64_t)i + 1, t);
        CHECK_OK(dg_metrics_db_put_request(db, t < now - 1500 ? id1 : id2, "cpu", 1, &r, &err),
                 &err);
        if (t < now - age) {
            want_req++;
            want_cv += n;
        }
        CHECK_OK(dg_metrics_db_put_event(db, t < now - 1500 ? id1 : id2, t, "x", NULL, &err),
                 &err);
        want_ev += t < now - age;
    }
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_retain(db, now, age, 0, id2, &gone, &err), &err);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECKF(gone.requests == want_req && gone.canvases == want_cv && gone.events == want_ev,
           "deleted %lld/%lld/%lld, want %lld/%lld/%lld", (long long)gone.requests,
           (long long)gone.canvases, (long long)gone.events, (long long)want_req,
           (long long)want_cv, (long long)want_ev);
    CHECKF(gone.runs == 2, "%lld runs deleted", (long long)gone.runs);
    CHECK(peek(path, "SELECT count(*) FROM events WHERE kind IN ('start', 'config')") == 2);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 200 - want_req);
    CHECK(peek(path, "SELECT count(*) FROM requests WHERE finished < 999000") == 0);
    CHECK(peek(path, "SELECT count(*) FROM canvases WHERE request NOT IN "
                     "(SELECT id FROM requests)") == 0);
    CHECK(peek(path, "SELECT count(*) FROM canvases") ==
          peek(path, "SELECT sum(canvases) FROM requests"));
    CHECK(peek(path, "SELECT count(*) FROM runs") == 1);
    dg_metrics_db_close(db);
    return 0;
}

static int retention_by_size(void)
{
    const char *path = test_path("size.sqlite");
    struct dg_metrics_db *db;
    struct dg_error err = {0};
    struct dg_metrics_run run = {.started = 1, .pid = 1, .tp = 1};
    struct dg_metrics_request r;
    struct dg_metrics_canvas cv[8];
    struct dg_metrics_retained gone;
    int64_t run_id = 0, live = 0, live_after = 0, max_bytes, oldest;
    char settings[600];
    struct stat sb;

    memset(settings, 's', sizeof settings - 1);
    settings[sizeof settings - 1] = '\0';
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_run(db, &run, &run_id, &err), &err);
    /* the run's start and config, and a few other events: trimming took
     * at least 64 events a round, so all of them, and the run's start */
    CHECK_OK(dg_metrics_db_put_event(db, run_id, 1, "start", NULL, &err), &err);
    CHECK_OK(dg_metrics_db_put_event(db, run_id, 1, "config", "x: 1", &err), &err);
    for (int i = 0; i < 5; i++)
        CHECK_OK(dg_metrics_db_put_event(db, run_id, 2 + i, "reload", NULL, &err), &err);
    for (int i = 0; i < 3000; i++) {
        make_request(&r, cv, 8, (uint64_t)i + 1, 100.0 + i);
        r.settings_json = settings;
        CHECK_OK(dg_metrics_db_put_request(db, run_id, "cpu", 1, &r, &err), &err);
    }
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK_OK(dg_metrics_db_live_bytes(db, &live, &err), &err);
    CHECKF(live > 2000000, "3000 requests take only %lld bytes", (long long)live);
    /* under the limit: nothing goes */
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_retain(db, 1e9, 0, live + 4096, run_id, &gone, &err), &err);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK(gone.requests == 0 && gone.events == 0);
    /* half the size: the oldest go until the live pages fit 90% of it */
    max_bytes = live / 2;
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_retain(db, 1e9, 0, max_bytes, run_id, &gone, &err), &err);
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK_OK(dg_metrics_db_live_bytes(db, &live_after, &err), &err);
    CHECKF(live_after <= max_bytes - max_bytes / 10, "live %lld after trimming to %lld",
           (long long)live_after, (long long)max_bytes);
    CHECKF(gone.requests > 1500 && gone.requests < 3000, "deleted %lld requests",
           (long long)gone.requests);
    CHECK(gone.canvases == 8 * gone.requests);
    CHECK(peek(path, "SELECT count(*) FROM requests") == 3000 - gone.requests);
    CHECKF(peek(path, "SELECT count(*) FROM events WHERE kind IN ('start', 'config')") == 2 &&
               peek(path, "SELECT count(*) FROM events") >= 2,
           "%lld events deleted", (long long)gone.events);
    /* the oldest went: what is left is the newest, contiguous */
    oldest = peek(path, "SELECT min(request_id) FROM requests");
    CHECK(oldest == gone.requests + 1);
    CHECK(peek(path, "SELECT max(request_id) FROM requests") == 3000);
    CHECK(peek(path, "SELECT count(*) FROM canvases WHERE request NOT IN "
                     "(SELECT id FROM requests)") == 0);
    dg_metrics_db_close(db);
    /* the file itself shrank (incremental vacuum, then a checkpoint at close) */
    CHECK(stat(path, &sb) == 0);
    CHECKF(sb.st_size <= live_after + 65536, "file %lld bytes, live %lld", (long long)sb.st_size,
           (long long)live_after);
    {
        char *ic = peek_text(path, "PRAGMA integrity_check");
        CHECKF(ic && !strcmp(ic, "ok"), "integrity_check: %s", ic ? ic : "(null)");
        free(ic);
    }
    return 0;
}

/* dg_metrics_db_check (dgemmad --check-config): a missing file in a
 * directory we may write, an empty SQLite file (version 0, migratable) and
 * a current one pass, and none is created or changed; a missing
 * directory, a directory in the file's place, a file that is not SQLite, a
 * newer schema and no path at all are refused with what is wrong. */
static int check_paths(void)
{
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    const char *fresh = test_path("check-fresh.sqlite"), *cur = test_path("check-cur.sqlite");
    const char *empty = test_path("check-v0.sqlite"), *junk = test_path("check-junk.sqlite");
    const char *newer = test_path("check-newer.sqlite"), *dir = test_path("check-dir");
    struct stat a, b;
    FILE *f;

    CHECK_OK(dg_metrics_db_check(fresh, &err), &err);
    CHECK(access(fresh, F_OK) != 0);
    CHECK_OK(dg_metrics_db_open(cur, DG_METRICS_WRITE, 100, &db, &err), &err);
    dg_metrics_db_close(db);
    CHECK(stat(cur, &a) == 0);
    CHECK_OK(dg_metrics_db_check(cur, &err), &err);
    CHECK(stat(cur, &b) == 0 && a.st_size == b.st_size && a.st_mtime == b.st_mtime);
    CHECK(raw_exec(empty, "PRAGMA user_version = 0") == SQLITE_OK); /* (one page, no table) */
    CHECK_OK(dg_metrics_db_check(empty, &err), &err);
    CHECK(peek(empty, "PRAGMA user_version") == 0);
    CHECK_FAILS(dg_metrics_db_check("/nonexistent/dir/m.sqlite", &err), &err, DG_E_IO,
                "the directory /nonexistent/dir does not exist");
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_FAILS(dg_metrics_db_check(dir, &err), &err, DG_E_IO, "not a regular file");
    f = fopen(junk, "wb");
    CHECK(f && fputs("not a database, not at all; just text long enough to be a header....",
                     f) >= 0 && fclose(f) == 0);
    CHECK_FAILS(dg_metrics_db_check(junk, &err), &err, DG_E_FORMAT, "not an SQLite database");
    CHECK(raw_exec(newer, "CREATE TABLE future (x); PRAGMA user_version = 99") == SQLITE_OK);
    CHECK_FAILS(dg_metrics_db_check(newer, &err), &err, DG_E_FORMAT, "version 99 is newer");
    CHECK(peek(newer, "PRAGMA user_version") == 99);
    CHECK_FAILS(dg_metrics_db_check("", &err), &err, DG_E_INVAL, "no database file");
    return 0;
}

/* In a child process: when root, become user and group 65534 with no
 * other groups.  0, or -1. */
static int drop_to_nobody(void)
{
    if (geteuid() != 0)
        return 0;
    return setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 &&
                   setresuid(65534, 65534, 65534) == 0
               ? 0
               : -1;
}

/* fn(path) in a child that has dropped to nobody (drop_to_nobody): its
 * value (0 to 2) as the exit status, 3 where the privileges could not be
 * dropped, -1 where the child could not be run. */
static int as_nobody(int (*fn)(const char *path), const char *path)
{
    pid_t pid = fork();
    int st;
    if (pid < 0)
        return -1;
    if (pid == 0)
        _exit(drop_to_nobody() < 0 ? 3 : fn(path));
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

/* The rows of runs through a read-only open of path: 0 with one run,
 * else 1 (the open failed: its message on stderr) or 2. */
static int reads_one_run(const char *path)
{
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    sqlite3_stmt *q = NULL;
    int n = -1;
    if (dg_metrics_db_open(path, DG_METRICS_READ, 100, &db, &err) < 0) {
        fprintf(stderr, "# the reader: %s\n", err.msg);
        return 1;
    }
    if (sqlite3_prepare_v2(dg_metrics_db_handle(db), "SELECT count(*) FROM runs", -1, &q,
                           NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        n = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    dg_metrics_db_close(db);
    return n == 1 ? 0 : 2;
}

/* A WRITE open of path: 0 when it is refused with the directory named,
 * else 1 (it opened) or 2 (another message, on stderr). */
static int write_refused(const char *path)
{
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    if (dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err) == 0) {
        dg_metrics_db_close(db);
        return 1;
    }
    if (!strstr(err.msg, "cannot write in") || !strstr(err.msg, "-wal")) {
        fprintf(stderr, "# the writer: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* A new metrics file at path holding one run (its row id in *run) and
 * requests 1 .. n of 8 canvases each; closed, so no -wal is left.  0, or
 * the harness's failure. */
static int file_with_run(const char *path, int n, int64_t *run)
{
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    struct dg_metrics_run info = {.started = 1, .pid = 7, .version = "v", .backend = "cpu",
                                  .tp = 1};
    struct dg_metrics_request r;
    struct dg_metrics_canvas cv[8];

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_run(db, &info, run, &err), &err);
    for (int i = 0; i < n; i++) {
        make_request(&r, cv, 8, (uint64_t)i + 1, 100.0 + i);
        CHECK_OK(dg_metrics_db_put_request(db, *run, "cpu", 1, &r, &err), &err);
    }
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    dg_metrics_db_close(db);
    return 0;
}

/* dgemmad(8)'s layout: the file 0640, readable by the dgemma group, in a
 * directory only the daemon writes.  After a clean stop (SQLite removes
 * -wal and -shm) such a reader can still open it, and nothing is created
 * beside it; a truncated copy is named damaged, not "not SQLite"; a
 * negative schema version is not called newer. */
static int readers(void)
{
    const char *dir = test_path("ro"), *path = test_path("ro/m.sqlite");
    const char *cut = test_path("cut.sqlite"), *neg = test_path("neg.sqlite");
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    char wal[700], shm[700], buf[8192];
    int64_t id = 0;
    int rc;
    FILE *f;

    CHECK(mkdir(dir, 0755) == 0);
    if (file_with_run(path, 200, &id) != 0) /* (several pages, for the truncated copy) */
        return 1;
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    CHECK(access(wal, F_OK) != 0 && access(shm, F_OK) != 0);
    CHECK(chmod(path, 0644) == 0 && chmod(test_tmpdir(), 0711) == 0 && chmod(dir, 0555) == 0);
    rc = as_nobody(reads_one_run, path);
    /* a writer (the daemon's user) whose file is writable but its
     * directory not: told why, before SQLite's "readonly database" */
    if (rc == 0) {
        CHECK(chmod(path, 0666) == 0);
        rc = as_nobody(write_refused, path);
        CHECK(chmod(path, 0644) == 0);
    }
    CHECK(chmod(dir, 0755) == 0 && chmod(test_tmpdir(), 0700) == 0);
    CHECKF(rc == 0, "the reader (or the refused writer) exited %d", rc);
    CHECK(access(wal, F_OK) != 0 && access(shm, F_OK) != 0);
    /* the first 8 KB of it */
    f = fopen(path, "rb");
    CHECK(f && fread(buf, 1, sizeof buf, f) == sizeof buf && fclose(f) == 0);
    f = fopen(cut, "wb");
    CHECK(f && fwrite(buf, 1, sizeof buf, f) == sizeof buf && fclose(f) == 0);
    CHECK_FAILS(dg_metrics_db_open(cut, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "the file is damaged");
    CHECK(raw_exec(neg, "CREATE TABLE x (y); PRAGMA user_version = -1") == SQLITE_OK);
    CHECK_FAILS(dg_metrics_db_open(neg, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "version -1 is not one dgemma writes");
    CHECK_FAILS(dg_metrics_db_check(neg, &err), &err, DG_E_FORMAT,
                "version -1 is not one dgemma writes"); /* (--check-config's look) */
    return 0;
}

/* One byte through fd (write) or from it (read); 0 or -1. */
static int put_byte(int fd, char c)
{
    return write(fd, &c, 1) == 1 ? 0 : -1;
}

static int get_byte(int fd)
{
    char c;
    return read(fd, &c, 1) == 1 ? (unsigned char)c : -1;
}

/* A reader that had to take a stopped daemon's file as it is (no locks)
 * is told when a daemon starts writing it during the read: while the
 * writer has it open (a -wal beside it) and after the writer's close has
 * checkpointed into it and removed the -wal; not before. */
static int immutable_changed(void)
{
    const char *dir = test_path("ro2"), *path = test_path("ro2/m.sqlite");
    struct dg_metrics_db *db = NULL;
    struct dg_error err = {0};
    struct dg_metrics_request r;
    struct dg_metrics_canvas cv[8];
    int64_t id = 0;
    int to_child[2], to_parent[2], st = 0, got[3] = {-1, -1, -1};
    pid_t pid;

    CHECK(mkdir(dir, 0755) == 0);
    if (file_with_run(path, 20, &id) != 0)
        return 1;
    CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
    CHECK(chmod(path, 0644) == 0 && chmod(test_tmpdir(), 0711) == 0 && chmod(dir, 0555) == 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* the reader: its verdict before, during and after the writer */
        struct dg_metrics_db *rd = NULL;
        if (drop_to_nobody() < 0)
            _exit(3);
        if (dg_metrics_db_open(path, DG_METRICS_READ, 100, &rd, &err) < 0) {
            fprintf(stderr, "# the reader: %s\n", err.msg);
            _exit(1);
        }
        for (int k = 0; k < 3; k++) {
            if (k > 0 && get_byte(to_child[0]) < 0)
                _exit(4);
            if (put_byte(to_parent[1], (char)('0' + dg_metrics_db_changed(rd))) < 0)
                _exit(5);
        }
        dg_metrics_db_close(rd);
        _exit(0);
    }
    got[0] = get_byte(to_parent[0]);
    /* the writer, where a daemon would write: the directory writable
     * again (a reader not root could not otherwise be shown here), past
     * the reader's open by more than a tick of the file clock */
    CHECK(chmod(dir, 0755) == 0);
    usleep(20000);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    for (int i = 0; i < 20; i++) {
        make_request(&r, cv, 8, (uint64_t)i + 101, 300.0 + i);
        CHECK_OK(dg_metrics_db_put_request(db, id, "cpu", 1, &r, &err), &err);
    }
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK(put_byte(to_child[1], 'w') == 0);
    got[1] = get_byte(to_parent[0]);
    dg_metrics_db_close(db); /* (checkpoints into the file, removes the -wal) */
    CHECK(put_byte(to_child[1], 'c') == 0);
    got[2] = get_byte(to_parent[0]);
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(chmod(test_tmpdir(), 0700) == 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the reader: status %d", st);
    CHECKF(got[0] == '0' && got[1] == '1' && got[2] == '1',
           "changed before / while open / after close: %c %c %c", got[0], got[1], got[2]);
    return 0;
}

int main(void)
{
    const char *seed = getenv("DG_TEST_SEED");
    const unsigned s = seed ? (unsigned)strtoul(seed, NULL, 10) : (unsigned)time(NULL);
    rng_state ^= s;
    printf("# seed %u (DG_TEST_SEED repeats a run)\n", s);
    TEST_CASE(new_file);
    TEST_CASE(bad_files);
    TEST_CASE(locked);
    TEST_CASE(newer_locked_at_open);
    TEST_CASE(retention_by_age);
    TEST_CASE(retention_by_size);
    TEST_CASE(check_paths);
    TEST_CASE(readers);
    TEST_CASE(immutable_changed);
    return test_finish();
}
