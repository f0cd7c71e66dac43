/*
 * metrics-query.h - summaries of the metrics database (metrics-db.h) for
 * `dgemma-client stats`: requests and tokens per hour, tokens/s and time
 * to first canvas percentiles, steps per canvas, errors by code, requests
 * by source and by uid, over a window of time.
 *
 * The window is half-open, since <= finished < until: a request counts
 * where it finished (requests.finished, indexed, never NULL).  An hour is
 * [k * 3600, (k + 1) * 3600) in Unix seconds (UTC hours); the first and
 * last hours of a window may be partial.
 *
 * Percentiles are nearest-rank: with the n values sorted ascending (n >=
 * 1), the p-th percentile is the value at rank ceil(p / 100 * n), rank 1
 * being the smallest.  It is always one of the values, never an
 * interpolation: p50 of {1, 2, 3, 4} is 2, p95 of 20 values is the 19th.
 *
 * Reads only (one read transaction, so every number comes from one
 * snapshot while the daemon writes); never prints, never exits.
 */
#ifndef DG_METRICS_QUERY_H
#define DG_METRICS_QUERY_H

#include <stdint.h>

#include "lib/error.h"

struct sqlite3;

/* The finish values of the schema, and OTHER for anything else. */
enum dg_metrics_finish {   /* (DG_MFINISH_: not lib/engine.h's DG_FINISH_) */
    DG_MFINISH_STOP = 0,
    DG_MFINISH_LENGTH,
    DG_MFINISH_CANCELLED,
    DG_MFINISH_ERROR,
    DG_MFINISH_REJECTED,
    DG_MFINISH_OTHER,
    DG_MFINISH_COUNT
};

/* "stop", "length", "cancelled", "error", "rejected", "other". */
const char *dg_metrics_finish_name(int f);

/* Steps-per-canvas histogram buckets: bucket 0 holds steps <= 0 (a canvas
 * that never ran a step), bucket 1 exactly 1, bucket k (k >= 2) holds
 * 2^(k-2) < steps <= 2^(k-1): 0, 1, 2, 3-4, 5-8, 9-16, ...; the last
 * bucket also takes anything larger. */
#define DG_METRICS_STEP_BUCKETS 32

/* Bucket of a steps value (see above). */
int dg_metrics_step_bucket(int64_t steps);

/* The smallest and largest steps value bucket k holds (lo = hi = 0 for
 * bucket 0, 1 for bucket 1; hi of the last bucket is its nominal 2^30). */
void dg_metrics_step_bucket_range(int k, int64_t *lo, int64_t *hi);

/* Nearest-rank percentile of n values sorted ascending (see above); 0 when
 * n == 0.  p in (0, 100]. */
double dg_metrics_percentile(const double *sorted, int64_t n, double p);

/* A distribution: how many values, their mean, nearest-rank p50 and p95,
 * smallest and largest.  All 0 when n == 0. */
struct dg_metrics_dist {
    int64_t n;
    double mean, p50, p95, min, max;
};

/* Requests that finished in one hour. */
struct dg_metrics_hour {
    double start;                          /* Unix seconds, a multiple of 3600 */
    int64_t requests, prompt_tokens, completion_tokens;
    int64_t finish[DG_MFINISH_COUNT];       /* requests by finish */
};

/* Requests with one finish and error code (finish error, rejected or
 * cancelled). */
struct dg_metrics_error_count {
    int finish;                            /* enum dg_metrics_finish */
    char *code;                            /* NULL: the row had none */
    int64_t count;
};

/* Requests from one source ("socket", "shm", "batch", or whatever the file
 * holds). */
struct dg_metrics_source_count {
    char *source;
    int64_t requests;
};

/* Requests from one uid. */
struct dg_metrics_uid_count {
    int64_t uid;                           /* -1: unknown (NULL) */
    int64_t requests, prompt_tokens, completion_tokens;
};

struct dg_metrics_summary {
    double since, until;                   /* the window, as asked */

    /* totals over the window */
    int64_t requests, prompt_tokens, completion_tokens;
    int64_t finish[DG_MFINISH_COUNT];

    /* hours with at least one request, oldest first */
    struct dg_metrics_hour *hours;
    int n_hours;

    /* over requests with finish stop or length and a non-NULL value */
    struct dg_metrics_dist tokens_per_s, ttfc_ms;

    /* over the canvases of every request in the window */
    struct dg_metrics_dist steps;
    int64_t step_hist[DG_METRICS_STEP_BUCKETS];
    int n_step_buckets;                    /* buckets up to the last non-empty one */

    /* most frequent first; ties by finish, then code (NULL first) */
    struct dg_metrics_error_count *errors;
    int n_errors;

    /* most requests first; ties by name */
    struct dg_metrics_source_count *sources;
    int n_sources;

    /* most requests first; ties by uid, unknown last */
    struct dg_metrics_uid_count *uids;
    int n_uids;
};

/* Summarize the requests of h (a connection to a metrics database at
 * DG_METRICS_SCHEMA_VERSION, e.g. dg_metrics_db_handle of a database
 * opened DG_METRICS_READ) that finished in [since, until).  Runs every
 * query in one read transaction (h must not be inside one already).  On
 * success *out holds the summary (free it with dg_metrics_summary_free);
 * an empty window gives zeros and no rows.  On failure *out is left
 * empty (safe to free).  Errors: DG_E_INVAL (since >= until or not
 * finite), DG_E_BUSY (the file stayed locked past the connection's busy
 * timeout), DG_E_IO, DG_E_FORMAT (not a metrics database: a table or
 * column missing, a corrupt file), DG_E_NOMEM. */
int dg_metrics_summary(struct sqlite3 *h, double since, double until,
                       struct dg_metrics_summary *out, struct dg_error *err);

/* Free what dg_metrics_summary allocated and zero *s.  s may be NULL. */
void dg_metrics_summary_free(struct dg_metrics_summary *s);

#endif
