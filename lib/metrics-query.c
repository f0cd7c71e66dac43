/* metrics-query.c - summaries of the metrics database (see metrics-query.h). */
#include "lib/metrics-query.h"

#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

static const char *const FINISH_NAMES[DG_MFINISH_COUNT] = {
    "stop", "length", "cancelled", "error", "rejected", "other",
};

const char *dg_metrics_finish_name(int f)
{
    return f >= 0 && f < DG_MFINISH_COUNT ? FINISH_NAMES[f] : FINISH_NAMES[DG_MFINISH_OTHER];
}

/* The enum value of a finish text from the file; OTHER for NULL or a text
 * this dgemma does not know ("other" itself included). */
static int finish_of(const char *s)
{
    if (s)
        for (int f = 0; f < DG_MFINISH_OTHER; f++)
            if (!strcmp(s, FINISH_NAMES[f]))
                return f;
    return DG_MFINISH_OTHER;
}

int dg_metrics_step_bucket(int64_t steps)
{
    int k = 1;
    int64_t hi = 1;
    if (steps <= 0)
        return 0;
    /* the smallest k >= 1 with steps <= 2^(k-1), capped at the last bucket */
    while (steps > hi && k < DG_METRICS_STEP_BUCKETS - 1) {
        hi <<= 1;
        k++;
    }
    return k;
}

void dg_metrics_step_bucket_range(int k, int64_t *lo, int64_t *hi)
{
    if (k <= 1) {
        *lo = *hi = k < 1 ? 0 : 1;
        return;
    }
    if (k > DG_METRICS_STEP_BUCKETS - 1)
        k = DG_METRICS_STEP_BUCKETS - 1;
    *lo = ((int64_t)1 << (k - 2)) + 1;
    *hi = (int64_t)1 << (k - 1);
}

double dg_metrics_percentile(const double *sorted, int64_t n, double p)
{
    double r;
    int64_t rank;
    if (n <= 0 || !sorted)
        return 0;
    /* p * n first: exact for integer p and any realistic n, so that p95 of
     * 20 values is rank 19 exactly, not ceil(19.000000000000004) */
    r = ceil(p * (double)n / 100.0);
    rank = r < 1 ? 1 : r > (double)n ? n : (int64_t)r;
    return sorted[rank - 1];
}

/* ---- errors -------------------------------------------------------------------- */

/* SQLite's primary result code as a dg_status, following metrics-query.h:
 * a missing table or column (SQLITE_ERROR "no such ...") and a corrupt or
 * foreign file are DG_E_FORMAT, a lock DG_E_BUSY, anything else DG_E_IO. */
static enum dg_status status_of(int rc, const char *msg)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return DG_E_BUSY;
    case SQLITE_NOMEM:
        return DG_E_NOMEM;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_SCHEMA:
        return DG_E_FORMAT;
    case SQLITE_ERROR:
        return msg && strstr(msg, "no such ") ? DG_E_FORMAT : DG_E_IO;
    default:
        return DG_E_IO;
    }
}

/* Record SQLite error rc of connection h while doing what; returns -status.
 * The message names the file and, for DG_E_FORMAT, says what that means. */
static int fail(sqlite3 *h, int rc, const char *what, struct dg_error *err)
{
    const char *msg = sqlite3_errmsg(h);
    const char *file = sqlite3_db_filename(h, "main");
    enum dg_status st = status_of(rc, msg);
    if (!file || !file[0])
        file = "metrics";
    if (st == DG_E_FORMAT)
        return dg_error_set(err, st, "%s: not a metrics database (%s: %s)", file, what, msg);
    if (st == DG_E_BUSY)
        return dg_error_set(err, st, "%s: locked by another connection (%s: %s)", file, what,
                            msg);
    return dg_error_set(err, st, "%s: %s: %s", file, what, msg);
}

static int nomem(struct dg_error *err)
{
    return dg_error_set(err, DG_E_NOMEM, "metrics summary: out of memory");
}

/* ---- queries ------------------------------------------------------------------- */

/* "finished in the window", ?1 = since, ?2 = until */
#define IN_WINDOW " finished >= ?1 AND finished < ?2 "

/* Prepare sql on h and bind the window to ?1 and ?2.  On failure *st is
 * NULL and err says why. */
static int prepare(sqlite3 *h, const char *sql, double since, double until, sqlite3_stmt **st,
                   const char *what, struct dg_error *err)
{
    int rc = sqlite3_prepare_v2(h, sql, -1, st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_bind_double(*st, 1, since)) == SQLITE_OK)
        rc = sqlite3_bind_double(*st, 2, until);
    if (rc != SQLITE_OK) {
        int r = fail(h, rc, what, err);
        sqlite3_finalize(*st);
        *st = NULL;
        return r;
    }
    return 0;
}

/* Finish stepping st: rc is the last sqlite3_step result.  Finalizes st;
 * returns 0 when rc is SQLITE_DONE, else -status with err set. */
static int finish_stmt(sqlite3 *h, sqlite3_stmt *st, int rc, const char *what,
                       struct dg_error *err)
{
    int r = 0;
    if (rc != SQLITE_DONE)
        r = fail(h, rc, what, err);
    sqlite3_finalize(st);
    return r;
}

/* Grow *p (of *cap elements of size sz) to hold at least n + 1 elements.
 * Returns 0, or -1 when out of memory (*p unchanged). */
static int grow(void **p, size_t sz, int64_t n, int64_t *cap)
{
    void *q;
    int64_t c;
    if (n < *cap)
        return 0;
    c = *cap ? *cap * 2 : 64;
    if ((uint64_t)c > SIZE_MAX / sz)
        return -1;
    if (!(q = realloc(*p, (size_t)c * sz)))
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Totals and hours: one row per (hour, finish text), hours ascending; the
 * hour is floor(finished / 3600) (CAST truncates toward zero, hence the
 * correction below zero). */
static int query_hours(sqlite3 *h, struct dg_metrics_summary *s, struct dg_error *err)
{
    static const char sql[] =
        "SELECT CAST(finished / 3600 AS INTEGER)"
        "       - (finished < 0 AND CAST(finished / 3600 AS INTEGER) <> finished / 3600) AS hr,"
        "  finish, count(*), sum(prompt_tokens), sum(completion_tokens)"
        " FROM requests WHERE" IN_WINDOW
        " GROUP BY hr, finish ORDER BY hr";
    sqlite3_stmt *st;
    int64_t cap = 0;
    int rc;

    if ((rc = prepare(h, sql, s->since, s->until, &st, "requests by hour", err)) < 0)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t hr = sqlite3_column_int64(st, 0);
        int f = finish_of((const char *)sqlite3_column_text(st, 1));
        int64_t n = sqlite3_column_int64(st, 2);
        int64_t pt = sqlite3_column_int64(st, 3);
        int64_t ct = sqlite3_column_int64(st, 4);
        struct dg_metrics_hour *hh;
        double start = (double)hr * 3600.0;

        if (s->n_hours == 0 || s->hours[s->n_hours - 1].start != start) {
            void *p = s->hours;
            if (s->n_hours == INT32_MAX || grow(&p, sizeof *s->hours, s->n_hours, &cap) < 0) {
                sqlite3_finalize(st);
                return nomem(err);
            }
            s->hours = p;
            hh = &s->hours[s->n_hours++];
            memset(hh, 0, sizeof *hh);
            hh->start = start;
        }
        hh = &s->hours[s->n_hours - 1];
        hh->requests += n;
        hh->prompt_tokens += pt;
        hh->completion_tokens += ct;
        hh->finish[f] += n;
        s->requests += n;
        s->prompt_tokens += pt;
        s->completion_tokens += ct;
        s->finish[f] += n;
    }
    return finish_stmt(h, st, rc, "requests by hour", err);
}

/* Load the first column of sql's rows (ascending, non-NULL) into *vals, a
 * malloc'd array of *n doubles (NULL when none). */
static int load_values(sqlite3 *h, const char *sql, double since, double until, double **vals,
                       int64_t *n, const char *what, struct dg_error *err)
{
    sqlite3_stmt *st;
    int64_t cap = 0;
    int rc;

    *vals = NULL;
    *n = 0;
    if ((rc = prepare(h, sql, since, until, &st, what, err)) < 0)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        void *p = *vals;
        if (grow(&p, sizeof **vals, *n, &cap) < 0) {
            sqlite3_finalize(st);
            return nomem(err);
        }
        *vals = p;
        (*vals)[(*n)++] = sqlite3_column_double(st, 0);
    }
    return finish_stmt(h, st, rc, what, err);
}

/* The distribution of n sorted values. */
static void distribution(const double *v, int64_t n, struct dg_metrics_dist *d)
{
    double sum = 0;
    memset(d, 0, sizeof *d);
    if (n <= 0)
        return;
    for (int64_t i = 0; i < n; i++)
        sum += v[i];
    d->n = n;
    d->mean = sum / (double)n;
    d->p50 = dg_metrics_percentile(v, n, 50);
    d->p95 = dg_metrics_percentile(v, n, 95);
    d->min = v[0];
    d->max = v[n - 1];
}

/* A distribution of the values sql loads. */
static int query_dist(sqlite3 *h, const char *sql, struct dg_metrics_summary *s,
                      struct dg_metrics_dist *d, const char *what, struct dg_error *err)
{
    double *v;
    int64_t n;
    int rc = load_values(h, sql, s->since, s->until, &v, &n, what, err);
    if (rc == 0)
        distribution(v, n, d);
    free(v);
    return rc;
}

/* Steps per canvas: the distribution and the histogram. */
static int query_steps(sqlite3 *h, struct dg_metrics_summary *s, struct dg_error *err)
{
    static const char sql[] =
        "SELECT c.steps FROM canvases c JOIN requests r ON c.request = r.id"
        " WHERE r.finished >= ?1 AND r.finished < ?2 AND c.steps IS NOT NULL"
        " ORDER BY c.steps";
    double *v;
    int64_t n;
    int rc = load_values(h, sql, s->since, s->until, &v, &n, "steps per canvas", err);
    if (rc == 0) {
        distribution(v, n, &s->steps);
        for (int64_t i = 0; i < n; i++) {
            /* a REAL steps value (not ours) is cut to an integer */
            double x = v[i];
            int64_t steps = !(x >= 1) ? 0 : x > 4e18 ? INT64_MAX : (int64_t)x;
            int k = dg_metrics_step_bucket(steps);
            s->step_hist[k]++;
            if (k + 1 > s->n_step_buckets)
                s->n_step_buckets = k + 1;
        }
    }
    free(v);
    return rc;
}

/* errors: most frequent first; ties by finish, then code (NULL first). */
static int cmp_error(const void *a, const void *b)
{
    const struct dg_metrics_error_count *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    if (x->finish != y->finish)
        return x->finish < y->finish ? -1 : 1;
    if (!x->code || !y->code)
        return x->code ? 1 : y->code ? -1 : 0;
    return strcmp(x->code, y->code);
}

/* strdup of a column's text, or NULL for SQL NULL; *oom set when a copy
 * could not be made. */
static char *column_strdup(sqlite3_stmt *st, int i, int *oom)
{
    const char *t = (const char *)sqlite3_column_text(st, i);
    char *c;
    if (!t) {
        if (sqlite3_column_type(st, i) != SQLITE_NULL)
            *oom = 1; /* text conversion failed: only out of memory */
        return NULL;
    }
    if (!(c = strdup(t)))
        *oom = 1;
    return c;
}

static int query_errors(sqlite3 *h, struct dg_metrics_summary *s, struct dg_error *err)
{
    static const char sql[] =
        "SELECT finish, error_code, count(*) FROM requests WHERE" IN_WINDOW
        " AND finish IN ('error', 'rejected', 'cancelled') GROUP BY finish, error_code";
    sqlite3_stmt *st;
    int64_t cap = 0;
    int rc;

    if ((rc = prepare(h, sql, s->since, s->until, &st, "errors", err)) < 0)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct dg_metrics_error_count *e;
        void *p = s->errors;
        int oom = 0;
        if (s->n_errors == INT32_MAX || grow(&p, sizeof *s->errors, s->n_errors, &cap) < 0) {
            sqlite3_finalize(st);
            return nomem(err);
        }
        s->errors = p;
        e = &s->errors[s->n_errors];
        e->finish = finish_of((const char *)sqlite3_column_text(st, 0));
        e->code = column_strdup(st, 1, &oom);
        e->count = sqlite3_column_int64(st, 2);
        s->n_errors++;
        if (oom) {
            sqlite3_finalize(st);
            return nomem(err);
        }
    }
    if ((rc = finish_stmt(h, st, rc, "errors", err)) < 0)
        return rc;
    if (s->n_errors > 1)
        qsort(s->errors, (size_t)s->n_errors, sizeof *s->errors, cmp_error);
    return 0;
}

static int query_sources(sqlite3 *h, struct dg_metrics_summary *s, struct dg_error *err)
{
    static const char sql[] =
        "SELECT source, count(*) AS n FROM requests WHERE" IN_WINDOW
        " GROUP BY source ORDER BY n DESC, source";
    sqlite3_stmt *st;
    int64_t cap = 0;
    int rc;

    if ((rc = prepare(h, sql, s->since, s->until, &st, "requests by source", err)) < 0)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct dg_metrics_source_count *c;
        void *p = s->sources;
        int oom = 0;
        if (s->n_sources == INT32_MAX || grow(&p, sizeof *s->sources, s->n_sources, &cap) < 0) {
            sqlite3_finalize(st);
            return nomem(err);
        }
        s->sources = p;
        c = &s->sources[s->n_sources];
        /* the schema has source NOT NULL; a NULL from elsewhere reads "" */
        c->source = column_strdup(st, 0, &oom);
        if (!c->source && !oom && !(c->source = strdup("")))
            oom = 1;
        c->requests = sqlite3_column_int64(st, 1);
        s->n_sources++;
        if (oom) {
            sqlite3_finalize(st);
            return nomem(err);
        }
    }
    return finish_stmt(h, st, rc, "requests by source", err);
}

static int query_uids(sqlite3 *h, struct dg_metrics_summary *s, struct dg_error *err)
{
    static const char sql[] =
        "SELECT uid, count(*) AS n, sum(prompt_tokens), sum(completion_tokens)"
        " FROM requests WHERE" IN_WINDOW
        " GROUP BY uid ORDER BY n DESC, uid IS NULL, uid";
    sqlite3_stmt *st;
    int64_t cap = 0;
    int rc;

    if ((rc = prepare(h, sql, s->since, s->until, &st, "requests by uid", err)) < 0)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct dg_metrics_uid_count *u;
        void *p = s->uids;
        if (s->n_uids == INT32_MAX || grow(&p, sizeof *s->uids, s->n_uids, &cap) < 0) {
            sqlite3_finalize(st);
            return nomem(err);
        }
        s->uids = p;
        u = &s->uids[s->n_uids++];
        u->uid = sqlite3_column_type(st, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 0);
        u->requests = sqlite3_column_int64(st, 1);
        u->prompt_tokens = sqlite3_column_int64(st, 2);
        u->completion_tokens = sqlite3_column_int64(st, 3);
    }
    return finish_stmt(h, st, rc, "requests by uid", err);
}

/* ---- the summary --------------------------------------------------------------- */

int dg_metrics_summary(struct sqlite3 *h, double since, double until,
                       struct dg_metrics_summary *out, struct dg_error *err)
{
    int rc;

    memset(out, 0, sizeof *out);
    if (!h)
        return dg_error_set(err, DG_E_INVAL, "metrics summary: no database connection");
    if (!isfinite(since) || !isfinite(until) || since >= until)
        return dg_error_set(err, DG_E_INVAL, "metrics summary: the window [%g, %g) is empty "
                            "or not finite", since, until);
    if (!sqlite3_get_autocommit(h))
        return dg_error_set(err, DG_E_INVAL, "metrics summary: the connection is already "
                            "inside a transaction");
    out->since = since;
    out->until = until;

    /* deferred: the first SELECT takes the read snapshot every later one
     * shares; in WAL mode a writer's lock does not block it */
    rc = sqlite3_exec(h, "BEGIN", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = fail(h, rc, "starting a read transaction", err);
        goto failed;
    }
    if ((rc = query_hours(h, out, err)) < 0 ||
        (rc = query_dist(h, "SELECT tokens_per_s FROM requests WHERE" IN_WINDOW
                         " AND finish IN ('stop', 'length') AND tokens_per_s IS NOT NULL"
                         " ORDER BY tokens_per_s", out, &out->tokens_per_s, "tokens per second",
                         err)) < 0 ||
        (rc = query_dist(h, "SELECT ttfc_ms FROM requests WHERE" IN_WINDOW
                         " AND finish IN ('stop', 'length') AND ttfc_ms IS NOT NULL"
                         " ORDER BY ttfc_ms", out, &out->ttfc_ms, "time to first canvas",
                         err)) < 0 ||
        (rc = query_steps(h, out, err)) < 0 ||
        (rc = query_errors(h, out, err)) < 0 ||
        (rc = query_sources(h, out, err)) < 0 ||
        (rc = query_uids(h, out, err)) < 0)
        goto failed;
    rc = sqlite3_exec(h, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = fail(h, rc, "ending the read transaction", err);
        goto failed;
    }
    return 0;

failed:
    if (!sqlite3_get_autocommit(h))
        sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    dg_metrics_summary_free(out);
    return rc;
}

void dg_metrics_summary_free(struct dg_metrics_summary *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_errors; i++)
        free(s->errors[i].code);
    for (int i = 0; i < s->n_sources; i++)
        free(s->sources[i].source);
    free(s->hours);
    free(s->errors);
    free(s->sources);
    free(s->uids);
    memset(s, 0, sizeof *s);
}
