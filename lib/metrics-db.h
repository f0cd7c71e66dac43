/*
 * metrics-db.h - the metrics database: its schema, its migrations, and the
 * writes the daemon makes to it.  SQLite, WAL mode, one writer.
 *
 * SCHEMA (version DG_METRICS_SCHEMA_VERSION, kept in PRAGMA user_version;
 * times are Unix seconds as REAL, durations milliseconds)
 *
 *   runs       one row per daemon start
 *              id, started, stopped (NULL while running or after a crash),
 *              pid, version, host, model, backend, tp, config_digest
 *   requests   one row per request the daemon accepted, and one per
 *              generate request it refused (finish 'rejected')
 *              id (rowid), run, request_id (the protocol's id; NULL when
 *              refused), tag, uid, pid, source ('socket', 'shm', 'batch'),
 *              submitted, started, first_canvas, finished (NULL when it
 *              never reached that point, finished excepted),
 *              prompt_tokens, completion_tokens, canvases, steps (decoder
 *              passes), tokens_per_s (completion tokens / seconds after
 *              prefill), ttfc_ms (submitted -> first canvas, queueing
 *              included), total_ms (submitted -> finished), backend, tp,
 *              settings (JSON: the diffusion settings used), finish
 *              ('stop', 'length', 'cancelled', 'error', 'rejected'),
 *              error_code (a protocol or dg_status name), error (message)
 *   canvases   one row per canvas a request emitted
 *              request (requests.id), idx, steps, converged (0: stopped by
 *              the step cap), tokens (committed tokens it emitted), ms,
 *              mean_entropy (nats, at the last step)
 *   events     daemon events: start, stop, config, reload, error,
 *              metrics_lost, retention
 *              id, run, time, kind, detail
 *
 * A request and its canvases are written in one transaction, so a reader
 * never sees a request without its canvases.  Migrations run in order from
 * the file's version to ours inside one transaction; a file written by a
 * newer schema is refused, not touched.
 */
#ifndef DG_METRICS_DB_H
#define DG_METRICS_DB_H

#include <stdint.h>

#include "lib/error.h"

#define DG_METRICS_SCHEMA_VERSION 1

struct sqlite3;
struct dg_metrics_db;

enum dg_metrics_source { DG_SOURCE_SOCKET = 0, DG_SOURCE_SHM, DG_SOURCE_BATCH };

/* "socket", "shm", "batch" */
const char *dg_metrics_source_name(enum dg_metrics_source s);

struct dg_metrics_canvas {
    int index, steps, converged, tokens;
    double ms;
    double mean_entropy;
};

/* One request row.  Times are Unix seconds; 0 means "never" (stored as
 * NULL), except finished.  Strings may be NULL (stored as NULL). */
struct dg_metrics_request {
    uint64_t request_id;         /* 0: refused before it had one */
    const char *tag;
    int64_t uid, pid;            /* -1: unknown */
    enum dg_metrics_source source;
    double submitted, started, first_canvas, finished;
    int64_t prompt_tokens, completion_tokens, steps;
    int canvases;
    double tokens_per_s, ttfc_ms, total_ms; /* ttfc_ms < 0: no canvas; tokens_per_s < 0:
                                               no prefill finished (both NULL) */
    const char *settings_json;
    const char *finish;
    const char *error_code, *error;
    const struct dg_metrics_canvas *canvas; /* [n_canvas] */
    int n_canvas;
};

struct dg_metrics_run {
    double started;
    int64_t pid;
    const char *version, *host, *model, *backend, *config_digest;
    int tp;
};

enum dg_metrics_open_mode {
    DG_METRICS_WRITE = 0,    /* create if missing, WAL, migrate */
    DG_METRICS_READ,         /* read-only; the file must exist at our version */
};

/* Open the database at path.  WRITE: creates the file (mode 0640 under the
 * caller's umask) if missing, turns WAL on and migrates to our version;
 * when another connection holds the write lock, the setup is left for
 * dg_metrics_db_begin (so a locked file does not stop the daemon).  READ:
 * query_only, no migration.  busy_ms: how long a statement waits for a
 * lock before giving up.  Errors: DG_E_IO (cannot open or read),
 * DG_E_FORMAT (not an SQLite database, or a schema version this dgemma
 * does not know), DG_E_NOMEM. */
int dg_metrics_db_open(const char *path, enum dg_metrics_open_mode mode, int busy_ms,
                       struct dg_metrics_db **out, struct dg_error *err);

void dg_metrics_db_close(struct dg_metrics_db *db);

/* Whether a daemon could keep its metrics at path, creating nothing and
 * writing nothing (dgemmad --check-config): an existing path must be a
 * regular file we may read and write, an SQLite database at a schema
 * version this dgemma writes or migrates, in a directory we may write
 * (SQLite keeps its -wal and -shm files beside it); a missing file needs
 * a directory that exists and that we may write.  Errors: DG_E_INVAL (no
 * path), DG_E_IO, DG_E_FORMAT. */
int dg_metrics_db_check(const char *path, struct dg_error *err);

/* Whether what a READ-mode db read may be torn: 1 where it was opened as
 * it is, without SQLite's locks (a stopped daemon's file in a directory
 * the reader cannot write: SQLite's immutable open), and since then a
 * writer has opened the file (a -wal beside it) or its size, time of
 * change or identity moved; 0 otherwise (locked reads are never torn).
 * A reader that finds 1 after its queries reads again with a new open. */
int dg_metrics_db_changed(struct dg_metrics_db *db);

/* The connection, for queries (readers).  Owned by db. */
struct sqlite3 *dg_metrics_db_handle(struct dg_metrics_db *db);

/* The file's schema version (after migration, in WRITE mode). */
int dg_metrics_db_version(struct dg_metrics_db *db);

/* Start a write transaction (BEGIN IMMEDIATE), finishing the setup first
 * if open could not (WAL, migration).  Errors: DG_E_BUSY (another
 * connection holds the lock past busy_ms), DG_E_IO (disk full, I/O
 * error, read-only file), DG_E_FORMAT (schema), DG_E_INTERNAL. */
int dg_metrics_db_begin(struct dg_metrics_db *db, struct dg_error *err);

/* Commit; on failure the transaction is rolled back.  Errors as begin. */
int dg_metrics_db_commit(struct dg_metrics_db *db, struct dg_error *err);

/* Roll back the open transaction, if any. */
void dg_metrics_db_rollback(struct dg_metrics_db *db);

/* Inside a transaction: insert a run; *id its row id. */
int dg_metrics_db_put_run(struct dg_metrics_db *db, const struct dg_metrics_run *run,
                          int64_t *id, struct dg_error *err);

/* Inside a transaction: mark run id stopped at time t. */
int dg_metrics_db_stop_run(struct dg_metrics_db *db, int64_t run, double t,
                           struct dg_error *err);

/* Inside a transaction: a request row and its canvas rows, for run. */
int dg_metrics_db_put_request(struct dg_metrics_db *db, int64_t run, const char *backend, int tp,
                              const struct dg_metrics_request *r, struct dg_error *err);

/* Inside a transaction: an event row (detail may be NULL). */
int dg_metrics_db_put_event(struct dg_metrics_db *db, int64_t run, double t, const char *kind,
                            const char *detail, struct dg_error *err);

struct dg_metrics_retained {
    int64_t requests, canvases, events, runs;  /* rows deleted */
};

/* Inside a transaction: delete requests (with their canvases), events and
 * runs (by their stop, or their start if they never stopped) older than
 * max_age_s before now (0: no age limit), then the oldest requests and
 * events (a tenth of each a round) until the live pages take at most 90%
 * of max_bytes (0: no size limit), and give the freed pages back to the
 * file system (incremental vacuum).  Run keep_run (the writer's own; 0:
 * none) and its start and config events are never deleted.  *out counts
 * what went. */
int dg_metrics_db_retain(struct dg_metrics_db *db, double now, double max_age_s,
                         int64_t max_bytes, int64_t keep_run, struct dg_metrics_retained *out,
                         struct dg_error *err);

/* Bytes the live pages take: (page_count - freelist_count) * page_size. */
int dg_metrics_db_live_bytes(struct dg_metrics_db *db, int64_t *bytes, struct dg_error *err);

#endif
