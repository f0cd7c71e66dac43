/* metrics-db.c - the metrics database (see metrics-db.h for the schema). */
#include "lib/metrics-db.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/fileio.h"

/* Migration i takes a file from version i to i + 1.  Append only: a
 * released step never changes. */
static const char *const migrations[DG_METRICS_SCHEMA_VERSION] = {
    /* 0 -> 1 */
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  started REAL NOT NULL,"
    "  stopped REAL,"
    "  pid INTEGER,"
    "  version TEXT,"
    "  host TEXT,"
    "  model TEXT,"
    "  backend TEXT,"
    "  tp INTEGER,"
    "  config_digest TEXT);"
    "CREATE TABLE requests ("
    "  id INTEGER PRIMARY KEY,"
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  request_id INTEGER,"
    "  tag TEXT,"
    "  uid INTEGER,"
    "  pid INTEGER,"
    "  source TEXT NOT NULL,"
    "  submitted REAL NOT NULL,"
    "  started REAL,"
    "  first_canvas REAL,"
    "  finished REAL NOT NULL,"
    "  prompt_tokens INTEGER NOT NULL,"
    "  completion_tokens INTEGER NOT NULL,"
    "  canvases INTEGER NOT NULL,"
    "  steps INTEGER NOT NULL,"
    "  tokens_per_s REAL,"
    "  ttfc_ms REAL,"
    "  total_ms REAL,"
    "  backend TEXT,"
    "  tp INTEGER,"
    "  settings TEXT,"
    "  finish TEXT NOT NULL,"
    "  error_code TEXT,"
    "  error TEXT);"
    "CREATE INDEX requests_finished ON requests(finished);"
    "CREATE UNIQUE INDEX requests_run_id ON requests(run, request_id);"
    "CREATE TABLE canvases ("
    "  request INTEGER NOT NULL REFERENCES requests(id),"
    "  idx INTEGER NOT NULL,"
    "  steps INTEGER NOT NULL,"
    "  converged INTEGER NOT NULL,"
    "  tokens INTEGER NOT NULL,"
    "  ms REAL NOT NULL,"
    "  mean_entropy REAL,"
    "  PRIMARY KEY (request, idx)) WITHOUT ROWID;"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY,"
    "  run INTEGER,"
    "  time REAL NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  detail TEXT);"
    "CREATE INDEX events_time ON events(time);",
};

struct dg_metrics_db {
    sqlite3 *h;
    char *path;
    enum dg_metrics_open_mode mode;
    int ready;           /* WAL on and the schema at our version */
    int version;
    int in_txn;
    int immutable;       /* read as it is (reopen_immutable), the file as seen then: */
    struct stat seen;
    sqlite3_stmt *ins_request, *ins_canvas, *ins_event, *ins_run, *upd_run;
};

const char *dg_metrics_source_name(enum dg_metrics_source s)
{
    switch (s) {
    case DG_SOURCE_SOCKET: return "socket";
    case DG_SOURCE_SHM: return "shm";
    case DG_SOURCE_BATCH: return "batch";
    }
    return "socket";
}

/* SQLite's result code as a dg_status. */
static enum dg_status status_of(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return DG_E_BUSY;
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_AUTH:
        return DG_E_IO;
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_SCHEMA:
        return DG_E_FORMAT;
    case SQLITE_NOMEM:
        return DG_E_NOMEM;
    default:
        return DG_E_INTERNAL;
    }
}

static int fail(struct dg_metrics_db *db, int rc, struct dg_error *err, const char *what)
{
    return dg_error_set(err, status_of(rc), "%s: %s: %s", db->path, what,
                        db->h ? sqlite3_errmsg(db->h) : sqlite3_errstr(rc));
}

static int exec(struct dg_metrics_db *db, const char *sql, const char *what, struct dg_error *err)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : fail(db, rc, err, what);
}

/* One integer from a query returning one row. */
static int query_int(struct dg_metrics_db *db, const char *sql, int64_t *v, struct dg_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            *v = sqlite3_column_int64(st, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            *v = 0;
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc == SQLITE_OK ? 0 : fail(db, rc, err, sql);
}

/* Whether h's database holds any table: 1, 0, or -1 (the query failed). */
static int holds_tables(sqlite3 *h)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(h, "SELECT count(*) FROM sqlite_master WHERE type = 'table'", -1,
                                &st, NULL);
    if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        rc = sqlite3_column_int64(st, 0) > 0;
    else
        rc = -1;
    sqlite3_finalize(st);
    return rc;
}

/* The words for a file at schema version 0 that holds tables: never one
 * of ours (the first migration creates the tables and sets version 1 in
 * one transaction), so another program's database, not to be changed. */
#define FOREIGN_MSG "an SQLite database with tables but no dgemma schema version: another " \
                    "program's file? (name a new file for the metrics)"

static int read_version(struct dg_metrics_db *db, struct dg_error *err)
{
    int64_t v;
    int rc = query_int(db, "PRAGMA user_version", &v, err);
    if (rc < 0) {
        if (rc == -DG_E_FORMAT && (sqlite3_errcode(db->h) & 0xff) == SQLITE_CORRUPT)
            return dg_error_set(err, DG_E_FORMAT, "%s: the file is damaged (%s); sqlite3's "
                                "\".recover\" may save its rows", db->path,
                                sqlite3_errmsg(db->h));
        if (rc == -DG_E_FORMAT)
            return dg_error_set(err, DG_E_FORMAT, "%s: not an SQLite database", db->path);
        return rc;
    }
    if (v < 0)
        return dg_error_set(err, DG_E_FORMAT, "%s: metrics schema version %lld is not one "
                            "dgemma writes: another program's file?", db->path, (long long)v);
    if (v > DG_METRICS_SCHEMA_VERSION)
        return dg_error_set(err, DG_E_FORMAT, "%s: metrics schema version %lld is newer than "
                            "this dgemma's (%d); use a newer dgemma or another file",
                            db->path, (long long)v, DG_METRICS_SCHEMA_VERSION);
    if (v == 0) {
        const int t = holds_tables(db->h);
        if (t < 0)
            return fail(db, sqlite3_errcode(db->h), err, "reading the schema");
        if (t > 0)
            return dg_error_set(err, DG_E_FORMAT, "%s: %s", db->path, FOREIGN_MSG);
    }
    db->version = (int)v;
    return 0;
}

/* WAL on and the schema migrated (the write lock is needed for both),
 * after the file's version is known to be one this dgemma writes (a file
 * that is not, or another program's, is left as it is). */
static int setup(struct dg_metrics_db *db, struct dg_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc;

    if ((rc = read_version(db, err)) < 0)
        return rc;
    rc = sqlite3_prepare_v2(db->h, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0);
        rc = m && !strcmp(m, "wal") ? SQLITE_OK : SQLITE_BUSY;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return fail(db, rc, err, "turning on WAL");
    if ((rc = exec(db, "PRAGMA synchronous=NORMAL; PRAGMA journal_size_limit=67108864",
                   "pragmas", err)) < 0)
        return rc;
    if ((rc = exec(db, "BEGIN IMMEDIATE", "starting the migration", err)) < 0)
        return rc;
    if ((rc = read_version(db, err)) < 0)
        goto rollback;
    for (int v = db->version; v < DG_METRICS_SCHEMA_VERSION; v++) {
        char sql[64];
        if ((rc = exec(db, migrations[v], "migrating the schema", err)) < 0)
            goto rollback;
        snprintf(sql, sizeof sql, "PRAGMA user_version=%d", v + 1);
        if ((rc = exec(db, sql, "migrating the schema", err)) < 0)
            goto rollback;
    }
    if ((rc = exec(db, "COMMIT", "committing the migration", err)) < 0)
        goto rollback;
    db->version = DG_METRICS_SCHEMA_VERSION;
    db->ready = 1;
    return 0;
rollback:
    sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static int prepare(struct dg_metrics_db *db, sqlite3_stmt **st, const char *sql,
                   struct dg_error *err)
{
    int rc;
    if (*st)
        return 0;
    rc = sqlite3_prepare_v3(db->h, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);
    return rc == SQLITE_OK ? 0 : fail(db, rc, err, "preparing a statement");
}

/* db->h opened on name (a path, or with SQLITE_OPEN_URI a URI) with
 * flags: extended result codes, busy_ms of waiting for a lock.  0, or an
 * error naming db's file. */
static int open_handle(struct dg_metrics_db *db, const char *name, int flags, int busy_ms,
                       struct dg_error *err)
{
    const int rc = sqlite3_open_v2(name, &db->h, flags, NULL);
    if (rc != SQLITE_OK)
        return dg_error_set(err, status_of(rc), "%s: %s", db->path,
                            db->h ? sqlite3_errmsg(db->h) : sqlite3_errstr(rc));
    sqlite3_extended_result_codes(db->h, 1);
    sqlite3_busy_timeout(db->h, busy_ms);
    return 0;
}

/* A read-only reopening of db's file as an SQLite URI with immutable=1
 * (the path percent-escaped but for letters, digits and -._~/).  For a
 * file in WAL mode that no writer has open: SQLite reads such a file
 * read-only only where it can create the -shm beside it, so a reader
 * without write access to the directory (the dgemma group after a clean
 * stop, which removes -wal and -shm) needs the file taken as it is. */
static int reopen_immutable(struct dg_metrics_db *db, int busy_ms, struct dg_error *err)
{
    static const char hex[] = "0123456789ABCDEF";
    const size_t n = strlen(db->path);
    char *uri = malloc(5 + 3 * n + sizeof "?immutable=1");
    char *u = uri;
    int rc;
    if (!uri)
        return dg_error_set(err, DG_E_NOMEM, "metrics: out of memory");
    u += sprintf(u, "file:");
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)db->path[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-._~/", c)) {
            *u++ = (char)c;
        } else {
            *u++ = '%';
            *u++ = hex[c >> 4];
            *u++ = hex[c & 15];
        }
    }
    strcpy(u, "?immutable=1");
    sqlite3_close(db->h);
    db->h = NULL;
    rc = open_handle(db, uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI,
                     busy_ms, err);
    free(uri);
    return rc;
}

/* Whether db's file has no -wal file beside it (1), has one (0), or
 * cannot be told (-1). */
static int wal_absent(const struct dg_metrics_db *db)
{
    char *wal = malloc(strlen(db->path) + 5);
    int absent;
    if (!wal)
        return -1;
    sprintf(wal, "%s-wal", db->path);
    absent = access(wal, F_OK) == 0 ? 0 : errno == ENOENT ? 1 : -1;
    free(wal);
    return absent;
}

/* Whether read_version's failure on a read-only connection is SQLite
 * unable to open a WAL file it may not add a -shm to, with no writer
 * there (no -wal file). */
static int wal_needs_immutable(struct dg_metrics_db *db)
{
    const int code = sqlite3_errcode(db->h) & 0xff;
    if (code != SQLITE_READONLY && code != SQLITE_CANTOPEN)
        return 0;
    return wal_absent(db) == 1;
}

int dg_metrics_db_changed(struct dg_metrics_db *db)
{
    struct stat now;
    if (!db || !db->immutable)
        return 0;
    /* a writer has it open (or died with it open), or it is another file,
     * or its bytes were written since */
    if (wal_absent(db) != 1 || stat(db->path, &now) != 0)
        return 1;
    return now.st_dev != db->seen.st_dev || now.st_ino != db->seen.st_ino ||
           now.st_size != db->seen.st_size ||
           now.st_mtim.tv_sec != db->seen.st_mtim.tv_sec ||
           now.st_mtim.tv_nsec != db->seen.st_mtim.tv_nsec;
}

int dg_metrics_db_open(const char *path, enum dg_metrics_open_mode mode, int busy_ms,
                       struct dg_metrics_db **out, struct dg_error *err)
{
    struct dg_metrics_db *db;
    int rc, flags;

    *out = NULL;
    if (!path || !path[0])
        return dg_error_set(err, DG_E_INVAL, "metrics: no database file given");
    db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return dg_error_set(err, DG_E_NOMEM, "metrics: out of memory");
    }
    db->mode = mode;
    if (mode == DG_METRICS_WRITE) {
        /* created here so that the file (and SQLite's -wal and -shm, which
         * take its mode) is not world-readable: rows name users */
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
        if (fd < 0) {
            rc = dg_error_set(err, DG_E_IO, "%s: %s", path, strerror(errno));
            goto failed;
        }
        close(fd);
        {
            /* said here, before SQLite's "attempt to write a readonly database" */
            char dir[4096];
            dg_path_dir(path, dir, sizeof dir);
            if (access(dir, W_OK | X_OK) != 0) {
                rc = dg_error_set(err, DG_E_IO, "%s: cannot write in %s (SQLite keeps its -wal "
                                  "and -shm files there): %s", path, dir, strerror(errno));
                goto failed;
            }
        }
        flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
    } else {
        flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX;
    }
    if ((rc = open_handle(db, path, flags, busy_ms, err)) < 0)
        goto failed;
    rc = read_version(db, err);
    if (rc < 0 && mode == DG_METRICS_READ && wal_needs_immutable(db)) {
        /* a stopped daemon's file in a directory this reader cannot
         * write: taken as it is (nothing uncommitted: no -wal), as it is
         * now, so that dg_metrics_db_changed can tell a daemon that
         * started writing it meanwhile */
        if (stat(path, &db->seen) != 0) {
            rc = dg_error_set(err, DG_E_IO, "%s: %s", path, strerror(errno));
            goto failed;
        }
        if ((rc = reopen_immutable(db, busy_ms, err)) < 0)
            goto failed;
        db->immutable = 1;
        rc = read_version(db, err);
    }
    if (rc < 0 && rc != -DG_E_BUSY)
        goto failed;
    if (mode == DG_METRICS_READ) {
        if (rc < 0)
            goto failed;
        if (db->version != DG_METRICS_SCHEMA_VERSION) {
            rc = dg_error_set(err, DG_E_FORMAT, "%s: metrics schema version %d, this dgemma "
                              "reads version %d (a running dgemmad migrates the file)", path,
                              db->version, DG_METRICS_SCHEMA_VERSION);
            goto failed;
        }
        sqlite3_exec(db->h, "PRAGMA query_only=1", NULL, NULL, NULL);
        db->ready = 1;
    } else {
        /* takes effect only on a new file, before its first table */
        sqlite3_exec(db->h, "PRAGMA auto_vacuum=INCREMENTAL", NULL, NULL, NULL);
        if (rc == 0 && (rc = setup(db, err)) < 0 && rc != -DG_E_BUSY)
            goto failed;
        /* locked by another connection: begin finishes the setup */
    }
    dg_error_clear(err);
    *out = db;
    return 0;
failed:
    dg_metrics_db_close(db);
    return rc;
}

int dg_metrics_db_check(const char *path, struct dg_error *err)
{
    char dir[4096];
    struct stat st;
    sqlite3 *h = NULL;
    sqlite3_stmt *q = NULL;
    int rc;
    if (!path || !path[0])
        return dg_error_set(err, DG_E_INVAL, "metrics: no database file given");
    dg_path_dir(path, dir, sizeof dir);
    if (stat(path, &st) != 0) {
        if (errno != ENOENT)
            return dg_error_set(err, DG_E_IO, "metrics %s: %s", path, strerror(errno));
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return dg_error_set(err, DG_E_IO, "metrics %s: the directory %s does not exist",
                                path, dir);
        return dg_path_creatable("metrics", path, err);
    }
    if (!S_ISREG(st.st_mode))
        return dg_error_set(err, DG_E_IO, "metrics %s: not a regular file", path);
    if (access(path, R_OK | W_OK) != 0)
        return dg_error_set(err, DG_E_IO, "metrics %s: cannot write it: %s", path,
                            strerror(errno));
    if (access(dir, W_OK | X_OK) != 0)
        return dg_error_set(err, DG_E_IO, "metrics %s: cannot write in %s (SQLite's -wal and "
                            "-shm files go there): %s", path, dir, strerror(errno));
    rc = sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(h, "PRAGMA user_version", -1, &q, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
        const int64_t v = sqlite3_column_int64(q, 0);
        rc = v < 0 ? dg_error_set(err, DG_E_FORMAT, "metrics %s: schema version %lld is not "
                                  "one dgemma writes: another program's file?", path,
                                  (long long)v)
             : v > DG_METRICS_SCHEMA_VERSION
                 ? dg_error_set(err, DG_E_FORMAT, "metrics %s: schema version %lld is newer "
                                "than this dgemma's (%d)", path, (long long)v,
                                DG_METRICS_SCHEMA_VERSION)
             : v == 0 && holds_tables(h) > 0
                 ? dg_error_set(err, DG_E_FORMAT, "metrics %s: %s", path, FOREIGN_MSG)
                 : 0;
    } else {
        rc = dg_error_set(err, (rc & 0xff) == SQLITE_NOTADB ? DG_E_FORMAT : DG_E_IO,
                          "metrics %s: %s", path,
                          (rc & 0xff) == SQLITE_NOTADB ? "not an SQLite database"
                          : h ? sqlite3_errmsg(h) : sqlite3_errstr(rc));
    }
    sqlite3_finalize(q);
    sqlite3_close(h);
    return rc;
}

void dg_metrics_db_close(struct dg_metrics_db *db)
{
    if (!db)
        return;
    if (db->in_txn)
        dg_metrics_db_rollback(db);
    sqlite3_finalize(db->ins_request);
    sqlite3_finalize(db->ins_canvas);
    sqlite3_finalize(db->ins_event);
    sqlite3_finalize(db->ins_run);
    sqlite3_finalize(db->upd_run);
    sqlite3_close(db->h);
    free(db->path);
    free(db);
}

struct sqlite3 *dg_metrics_db_handle(struct dg_metrics_db *db)
{
    return db->h;
}

int dg_metrics_db_version(struct dg_metrics_db *db)
{
    return db->version;
}

int dg_metrics_db_begin(struct dg_metrics_db *db, struct dg_error *err)
{
    int rc;
    if (db->mode != DG_METRICS_WRITE)
        return dg_error_set(err, DG_E_INVAL, "%s: opened read-only", db->path);
    if (db->in_txn)
        return dg_error_set(err, DG_E_INTERNAL, "%s: a transaction is already open", db->path);
    if (!db->ready && (rc = setup(db, err)) < 0)
        return rc;
    /* a rollback that failed (out of memory) left its transaction open:
     * end it now, or every later transaction would fail */
    if (!sqlite3_get_autocommit(db->h) &&
        (rc = exec(db, "ROLLBACK", "rolling back an earlier transaction", err)) < 0)
        return rc;
    if ((rc = exec(db, "BEGIN IMMEDIATE", "starting a transaction", err)) < 0)
        return rc;
    db->in_txn = 1;
    return 0;
}

int dg_metrics_db_commit(struct dg_metrics_db *db, struct dg_error *err)
{
    int rc;
    if (!db->in_txn)
        return dg_error_set(err, DG_E_INTERNAL, "%s: no transaction to commit", db->path);
    rc = exec(db, "COMMIT", "committing", err);
    if (rc < 0)
        dg_metrics_db_rollback(db);
    db->in_txn = 0;
    return rc;
}

void dg_metrics_db_rollback(struct dg_metrics_db *db)
{
    if (!sqlite3_get_autocommit(db->h))
        sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    db->in_txn = 0;
}

/* ---- binding helpers ---------------------------------------------------------- */

static int bind_text(sqlite3_stmt *st, int i, const char *s)
{
    return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i);
}

/* a time, or NULL for "never" */
static int bind_time(sqlite3_stmt *st, int i, double t)
{
    return t > 0 ? sqlite3_bind_double(st, i, t) : sqlite3_bind_null(st, i);
}

/* Step a bound insert to completion and reset it. */
static int run_stmt(struct dg_metrics_db *db, sqlite3_stmt *st, int bind_rc, const char *what,
                    struct dg_error *err)
{
    int rc = bind_rc;
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_OK ? 0 : fail(db, rc, err, what);
}

static int need_txn(struct dg_metrics_db *db, struct dg_error *err)
{
    if (!db->in_txn)
        return dg_error_set(err, DG_E_INTERNAL, "%s: write outside a transaction", db->path);
    return 0;
}

int dg_metrics_db_put_run(struct dg_metrics_db *db, const struct dg_metrics_run *run,
                          int64_t *id, struct dg_error *err)
{
    sqlite3_stmt *st;
    int rc, b = SQLITE_OK;

    if ((rc = need_txn(db, err)) < 0 ||
        (rc = prepare(db, &db->ins_run, "INSERT INTO runs (started, pid, version, host, model, "
                      "backend, tp, config_digest) VALUES (?,?,?,?,?,?,?,?)", err)) < 0)
        return rc;
    st = db->ins_run;
    b |= sqlite3_bind_double(st, 1, run->started);
    b |= sqlite3_bind_int64(st, 2, run->pid);
    b |= bind_text(st, 3, run->version);
    b |= bind_text(st, 4, run->host);
    b |= bind_text(st, 5, run->model);
    b |= bind_text(st, 6, run->backend);
    b |= sqlite3_bind_int(st, 7, run->tp);
    b |= bind_text(st, 8, run->config_digest);
    if ((rc = run_stmt(db, st, b, "recording the daemon's start", err)) < 0)
        return rc;
    *id = sqlite3_last_insert_rowid(db->h);
    return 0;
}

int dg_metrics_db_stop_run(struct dg_metrics_db *db, int64_t run, double t, struct dg_error *err)
{
    int rc, b = SQLITE_OK;
    if ((rc = need_txn(db, err)) < 0 ||
        (rc = prepare(db, &db->upd_run, "UPDATE runs SET stopped = ? WHERE id = ?", err)) < 0)
        return rc;
    b |= sqlite3_bind_double(db->upd_run, 1, t);
    b |= sqlite3_bind_int64(db->upd_run, 2, run);
    return run_stmt(db, db->upd_run, b, "recording the daemon's stop", err);
}

int dg_metrics_db_put_request(struct dg_metrics_db *db, int64_t run, const char *backend, int tp,
                              const struct dg_metrics_request *r, struct dg_error *err)
{
    sqlite3_stmt *st;
    int64_t rowid;
    int rc, b = SQLITE_OK;

    if ((rc = need_txn(db, err)) < 0 ||
        (rc = prepare(db, &db->ins_request,
                      "INSERT INTO requests (run, request_id, tag, uid, pid, source, submitted, "
                      "started, first_canvas, finished, prompt_tokens, completion_tokens, "
                      "canvases, steps, tokens_per_s, ttfc_ms, total_ms, backend, tp, settings, "
                      "finish, error_code, error) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", err)) < 0 ||
        (rc = prepare(db, &db->ins_canvas,
                      "INSERT INTO canvases (request, idx, steps, converged, tokens, ms, "
                      "mean_entropy) VALUES (?,?,?,?,?,?,?)", err)) < 0)
        return rc;
    st = db->ins_request;
    b |= sqlite3_bind_int64(st, 1, run);
    b |= r->request_id ? sqlite3_bind_int64(st, 2, (sqlite3_int64)r->request_id)
                       : sqlite3_bind_null(st, 2);
    b |= bind_text(st, 3, r->tag);
    b |= r->uid >= 0 ? sqlite3_bind_int64(st, 4, r->uid) : sqlite3_bind_null(st, 4);
    b |= r->pid >= 0 ? sqlite3_bind_int64(st, 5, r->pid) : sqlite3_bind_null(st, 5);
    b |= sqlite3_bind_text(st, 6, dg_metrics_source_name(r->source), -1, SQLITE_STATIC);
    b |= sqlite3_bind_double(st, 7, r->submitted);
    b |= bind_time(st, 8, r->started);
    b |= bind_time(st, 9, r->first_canvas);
    b |= sqlite3_bind_double(st, 10, r->finished);
    b |= sqlite3_bind_int64(st, 11, r->prompt_tokens);
    b |= sqlite3_bind_int64(st, 12, r->completion_tokens);
    b |= sqlite3_bind_int(st, 13, r->canvases);
    b |= sqlite3_bind_int64(st, 14, r->steps);
    b |= r->started > 0 && r->tokens_per_s >= 0 ? sqlite3_bind_double(st, 15, r->tokens_per_s)
                                                : sqlite3_bind_null(st, 15);
    b |= r->ttfc_ms >= 0 ? sqlite3_bind_double(st, 16, r->ttfc_ms) : sqlite3_bind_null(st, 16);
    b |= sqlite3_bind_double(st, 17, r->total_ms);
    b |= bind_text(st, 18, backend);
    b |= sqlite3_bind_int(st, 19, tp);
    b |= bind_text(st, 20, r->settings_json);
    b |= bind_text(st, 21, r->finish ? r->finish : "error");
    b |= bind_text(st, 22, r->error_code);
    b |= bind_text(st, 23, r->error);
    if ((rc = run_stmt(db, st, b, "recording a request", err)) < 0)
        return rc;
    rowid = sqlite3_last_insert_rowid(db->h);
    st = db->ins_canvas;
    for (int i = 0; i < r->n_canvas; i++) {
        const struct dg_metrics_canvas *c = &r->canvas[i];
        b = SQLITE_OK;
        b |= sqlite3_bind_int64(st, 1, rowid);
        b |= sqlite3_bind_int(st, 2, c->index);
        b |= sqlite3_bind_int(st, 3, c->steps);
        b |= sqlite3_bind_int(st, 4, c->converged);
        b |= sqlite3_bind_int(st, 5, c->tokens);
        b |= sqlite3_bind_double(st, 6, c->ms);
        b |= c->mean_entropy == c->mean_entropy ? sqlite3_bind_double(st, 7, c->mean_entropy)
                                                : sqlite3_bind_null(st, 7);
        if ((rc = run_stmt(db, st, b, "recording a canvas", err)) < 0)
            return rc;
    }
    return 0;
}

int dg_metrics_db_put_event(struct dg_metrics_db *db, int64_t run, double t, const char *kind,
                            const char *detail, struct dg_error *err)
{
    sqlite3_stmt *st;
    int rc, b = SQLITE_OK;
    if ((rc = need_txn(db, err)) < 0 ||
        (rc = prepare(db, &db->ins_event,
                      "INSERT INTO events (run, time, kind, detail) VALUES (?,?,?,?)", err)) < 0)
        return rc;
    st = db->ins_event;
    b |= run > 0 ? sqlite3_bind_int64(st, 1, run) : sqlite3_bind_null(st, 1);
    b |= sqlite3_bind_double(st, 2, t);
    b |= bind_text(st, 3, kind);
    b |= bind_text(st, 4, detail);
    return run_stmt(db, st, b, "recording an event", err);
}

/* ---- retention ---------------------------------------------------------------- */

int dg_metrics_db_live_bytes(struct dg_metrics_db *db, int64_t *bytes, struct dg_error *err)
{
    int64_t pages, free_pages, page_size;
    int rc;
    if ((rc = query_int(db, "PRAGMA page_count", &pages, err)) < 0 ||
        (rc = query_int(db, "PRAGMA freelist_count", &free_pages, err)) < 0 ||
        (rc = query_int(db, "PRAGMA page_size", &page_size, err)) < 0)
        return rc;
    *bytes = (pages - free_pages) * page_size;
    return 0;
}

/* Run sql with one bound real (or integer when is_int), add the rows it
 * changed to *count. */
/* Run a DELETE with ?1 = x (an integer where is_int) and, where it has a
 * ?2, ?2 = keep (the run whose start is kept); *count += rows deleted. */
static int delete_with(struct dg_metrics_db *db, const char *sql, double x, int is_int,
                       int64_t keep, int64_t *count, struct dg_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = is_int ? sqlite3_bind_int64(st, 1, (sqlite3_int64)x) : sqlite3_bind_double(st, 1, x);
        if (rc == SQLITE_OK && sqlite3_bind_parameter_count(st) >= 2)
            rc = sqlite3_bind_int64(st, 2, keep);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return fail(db, rc, err, "retention");
    *count += sqlite3_changes(db->h);
    return 0;
}

int dg_metrics_db_retain(struct dg_metrics_db *db, double now, double max_age_s,
                         int64_t max_bytes, int64_t keep_run, struct dg_metrics_retained *out,
                         struct dg_error *err)
{
    /* (the events that say which daemon this is and how it was set up) */
#define KEPT_EVENT "(run = ?2 AND kind IN ('start', 'config'))"
    int64_t live, n_req, n_ev;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = need_txn(db, err)) < 0)
        return rc;
    if (max_age_s > 0) {
        const double cutoff = now - max_age_s;
        /* a run that never stopped (its daemon killed) goes by its start */
        if ((rc = delete_with(db, "DELETE FROM canvases WHERE request IN "
                              "(SELECT id FROM requests WHERE finished < ?1)", cutoff, 0,
                              keep_run, &out->canvases, err)) < 0 ||
            (rc = delete_with(db, "DELETE FROM requests WHERE finished < ?1", cutoff, 0,
                              keep_run, &out->requests, err)) < 0 ||
            (rc = delete_with(db, "DELETE FROM events WHERE time < ?1 AND NOT " KEPT_EVENT,
                              cutoff, 0, keep_run, &out->events, err)) < 0 ||
            (rc = delete_with(db, "DELETE FROM runs WHERE id != ?2 AND "
                              "coalesce(stopped, started) < ?1 "
                              "AND NOT EXISTS (SELECT 1 FROM requests WHERE run = runs.id) "
                              "AND NOT EXISTS (SELECT 1 FROM events WHERE run = runs.id)",
                              cutoff, 0, keep_run, &out->runs, err)) < 0)
            return rc;
    }
    if (max_bytes > 0) {
        if ((rc = dg_metrics_db_live_bytes(db, &live, err)) < 0)
            return rc;
        const int trimming = live > max_bytes;
        while (trimming && live > max_bytes - max_bytes / 10) {
            const int64_t before = out->requests + out->events;
            if ((rc = query_int(db, "SELECT count(*) FROM requests", &n_req, err)) < 0 ||
                (rc = query_int(db, "SELECT count(*) FROM events", &n_ev, err)) < 0)
                return rc;
            if (n_req + n_ev == 0)
                break;
            /* the oldest tenth of each, per round: at least 64 requests;
             * events, a small share of the file, by their tenth alone (a
             * floor of 64 took every event of a small table), never the
             * kept run's start and config */
            n_req = n_req / 10 > 64 ? n_req / 10 : 64;
            n_ev /= 10;
            if ((rc = delete_with(db, "DELETE FROM canvases WHERE request IN "
                                  "(SELECT id FROM requests ORDER BY id LIMIT ?1)",
                                  (double)n_req, 1, keep_run, &out->canvases, err)) < 0 ||
                (rc = delete_with(db, "DELETE FROM requests WHERE id IN "
                                  "(SELECT id FROM requests ORDER BY id LIMIT ?1)",
                                  (double)n_req, 1, keep_run, &out->requests, err)) < 0 ||
                (rc = delete_with(db, "DELETE FROM events WHERE id IN (SELECT id FROM events "
                                  "WHERE NOT " KEPT_EVENT " ORDER BY id LIMIT ?1)",
                                  (double)n_ev, 1, keep_run, &out->events, err)) < 0)
                return rc;
            if (out->requests + out->events == before)
                break; /* (nothing left that may go) */
            if ((rc = dg_metrics_db_live_bytes(db, &live, err)) < 0)
                return rc;
        }
    }
#undef KEPT_EVENT
    if (out->requests + out->events + out->runs > 0 &&
        (rc = exec(db, "PRAGMA incremental_vacuum", "returning free pages", err)) < 0)
        return rc;
    return 0;
}
