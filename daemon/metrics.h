/*
 * metrics.h - the metrics writer: one thread that owns the SQLite
 * connection (lib/metrics-db.h), fed by a bounded queue.
 *
 * DESIGN
 *   Producers (the scheduler at each request's end, the front end for
 *   refused requests, anyone logging an error) hand over a finished record;
 *   the call takes a mutex for a pointer swap and never waits on the
 *   database.  The writer wakes every flush_s seconds (or when the queue is
 *   half full), writes everything queued in one transaction and only then
 *   lets go of the records.
 *   Bound.  Records queued or being written are counted against
 *   queue_max; a record that finds queue_max already held is dropped and
 *   counted as lost (never waited for).  So with the database locked, slow
 *   or on a full disk, generation goes on, queue_max records wait for it,
 *   and the rest are counted.  The loss is logged (at most every 10 s) and,
 *   once the database takes writes again, recorded as a metrics_lost event.
 *   Failures.  Busy, locked, full or I/O errors keep the batch and retry
 *   with a growing pause (up to 5 s).  Any other failure (a record the
 *   schema refuses, a broken file) writes the batch again one record per
 *   transaction and drops only the records that fail on their own,
 *   counted as lost, so one bad record can neither wedge the writer nor
 *   take good ones with it.
 *   Retention.  At the first write and then every 10 minutes, rows older
 *   than retention_days go, then the oldest until the file's live pages fit
 *   max_bytes.
 *   Stop.  dmetrics_destroy writes what is queued plus the stop event,
 *   trying for at most stop_wait_s, then gives up (counted as lost).
 */
#ifndef DG_DAEMON_METRICS_H
#define DG_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/error.h"
#include "lib/metrics-db.h"

struct dmetrics;

struct dmetrics_options {
    const char *path;
    size_t queue_max;        /* records queued or being written, >= 1 */
    double flush_s;          /* longest a record waits for its transaction */
    double retention_days;   /* 0: keep every row */
    int64_t max_bytes;       /* 0: no size limit */
    int busy_ms;             /* lock wait per attempt */
    double stop_wait_s;      /* how long dmetrics_destroy tries to write what is left */
    /* the run row */
    const char *version, *model, *backend, *config_digest, *config_text;
    int tp;
};

struct dmetrics_counters {
    uint64_t held;           /* records queued or being written */
    uint64_t requests;       /* request rows written */
    uint64_t events;         /* event rows written */
    uint64_t lost;           /* records dropped: queue full, or a batch that failed for good */
    uint64_t retries;        /* transactions that failed and were tried again */
    int64_t run;             /* this run's row id (0 until the first write) */
    char last_error[256];    /* the last write failure, "" if none; kept after recovery */
    double last_error_at;    /* when (Unix seconds), 0 if none */
    int failing;             /* the last transaction tried failed: records wait (or are lost) */
};

/* Open the database (checked here: a bad path, a file that is not SQLite
 * or a newer schema fail now) and start the writer.  The start and config
 * events are queued.  Errors: DG_E_IO, DG_E_FORMAT, DG_E_NOMEM,
 * DG_E_INTERNAL (thread). */
int dmetrics_create(const struct dmetrics_options *o, struct dmetrics **out,
                    struct dg_error *err);

/* Write what is queued and the stop event (for at most stop_wait_s), stop
 * the thread, close.  m may be NULL. */
void dmetrics_destroy(struct dmetrics *m);

/* Queue a request row: every pointer in r is copied (r's canvas array
 * too).  Never blocks on the database.  Returns 0, or -1 when the record
 * was dropped (queue full, or no memory) and counted as lost.  m may be
 * NULL (no metrics): returns 0. */
int dmetrics_request(struct dmetrics *m, const struct dg_metrics_request *r);

/* Queue a daemon event (kind: "reload", "error", ...; detail may be
 * NULL).  As dmetrics_request. */
int dmetrics_event(struct dmetrics *m, const char *kind, const char *detail);

void dmetrics_counters(struct dmetrics *m, struct dmetrics_counters *c);

/* Wall-clock time in Unix seconds, as the rows store it. */
double dmetrics_now(void);

#endif
