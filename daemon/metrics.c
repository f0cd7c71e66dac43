/* metrics.c - the metrics writer thread (see metrics.h for the design). */
#include "daemon/metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/dlog.h"

#define RETENTION_PERIOD_S 600.0
#define PATH_CHECK_PERIOD_S 1.0 /* (one stat(2) a second at most, after a write) */
#define LOSS_LOG_PERIOD_S 10.0
#define RETRY_MAX_S 5.0

enum mrec_kind { MREC_REQUEST = 1, MREC_EVENT, MREC_STOP };

/* One record, self-contained: the strings and canvases live in the same
 * allocation or in malloc'd blocks it owns. */
struct mrec {
    struct mrec *next;
    enum mrec_kind kind;
    double time;
    char *kind_name, *detail;              /* events */
    struct dg_metrics_request req;         /* requests: pointers into owned copies */
    char *tag, *settings, *finish, *error_code, *error;
    struct dg_metrics_canvas *canvas;
};

struct dmetrics {
    struct dmetrics_options o;
    char *version, *model, *backend, *digest, *host;
    struct dg_metrics_db *db;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    struct mrec *head, *tail;              /* queued, not yet taken by the writer */
    size_t held;                           /* queued + being written */
    struct dmetrics_counters c;
    uint64_t lost_recorded;                /* lost already written as an event */
    double drop_logged_at;                 /* when salvage last logged a drop (monotonic) */
    char *path;                            /* the file as configured, */
    struct stat opened;                    /* and what it named at the open */
    int path_moved;                        /* the path names another file (or none): said */
    size_t drops_unlogged;                 /* records salvage dropped since then */
    int64_t run_id;                        /* the writer's copy of the run row id (0: none
                                            * committed yet); c.run follows it under mu */
    double started_at;
};

double dmetrics_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mrec_free(struct mrec *r)
{
    if (!r)
        return;
    free(r->kind_name);
    free(r->detail);
    free(r->tag);
    free(r->settings);
    free(r->finish);
    free(r->error_code);
    free(r->error);
    free(r->canvas);
    free(r);
}

/* strdup that keeps NULL and reports failure through *bad. */
static char *dup_or_null(const char *s, int *bad)
{
    char *d;
    if (!s)
        return NULL;
    if (!(d = strdup(s)))
        *bad = 1;
    return d;
}

/* Queue r, or drop it (counted) when the bound is reached.  force: the
 * run's start, config and stop records, which may exceed the bound (by
 * three at most: what queue_max of 1 or 2 could not otherwise hold). */
static int enqueue(struct dmetrics *m, struct mrec *r, int force)
{
    int dropped = 0;
    pthread_mutex_lock(&m->mu);
    if (!r || (!force && m->held >= m->o.queue_max)) {
        m->c.lost++;
        dropped = 1;
    } else {
        r->next = NULL;
        if (m->tail)
            m->tail->next = r;
        else
            m->head = r;
        m->tail = r;
        m->held++;
        if (force || m->held * 2 >= m->o.queue_max)
            pthread_cond_signal(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    if (dropped) {
        mrec_free(r);
        return -1;
    }
    return 0;
}

int dmetrics_request(struct dmetrics *m, const struct dg_metrics_request *q)
{
    struct mrec *r;
    int bad = 0;

    if (!m)
        return 0;
    r = calloc(1, sizeof *r);
    if (r) {
        r->kind = MREC_REQUEST;
        r->req = *q;
        r->tag = dup_or_null(q->tag, &bad);
        r->settings = dup_or_null(q->settings_json, &bad);
        r->finish = dup_or_null(q->finish, &bad);
        r->error_code = dup_or_null(q->error_code, &bad);
        r->error = dup_or_null(q->error, &bad);
        r->req.tag = r->tag;
        r->req.settings_json = r->settings;
        r->req.finish = r->finish;
        r->req.error_code = r->error_code;
        r->req.error = r->error;
        r->req.canvas = NULL;
        r->req.n_canvas = 0;
        if (q->n_canvas > 0) {
            r->canvas = malloc((size_t)q->n_canvas * sizeof *r->canvas);
            if (r->canvas) {
                memcpy(r->canvas, q->canvas, (size_t)q->n_canvas * sizeof *r->canvas);
                r->req.canvas = r->canvas;
                r->req.n_canvas = q->n_canvas;
            } else {
                bad = 1;
            }
        }
        if (bad) {
            mrec_free(r);
            r = NULL;
        }
    }
    return enqueue(m, r, 0);
}

static struct mrec *event_rec(enum mrec_kind kind, const char *name, const char *detail)
{
    struct mrec *r = calloc(1, sizeof *r);
    int bad = 0;
    if (!r)
        return NULL;
    r->kind = kind;
    r->time = dmetrics_now();
    r->kind_name = dup_or_null(name, &bad);
    r->detail = dup_or_null(detail, &bad);
    if (bad) {
        mrec_free(r);
        return NULL;
    }
    return r;
}

int dmetrics_event(struct dmetrics *m, const char *kind, const char *detail)
{
    if (!m)
        return 0;
    return enqueue(m, event_rec(MREC_EVENT, kind, detail), 0);
}

void dmetrics_counters(struct dmetrics *m, struct dmetrics_counters *c)
{
    pthread_mutex_lock(&m->mu);
    *c = m->c;
    c->held = m->held;
    pthread_mutex_unlock(&m->mu);
}

/* ---- the writer --------------------------------------------------------------- */

/* Record a write failure (m->mu held): last_error (printf format) and its
 * time; with failing, the file cannot be written until a transaction
 * commits (records dropped one by one while the rest is written: not). */
static void note_failure(struct dmetrics *m, int failing, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void note_failure(struct dmetrics *m, int failing, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->c.last_error, sizeof m->c.last_error, fmt, ap);
    va_end(ap);
    m->c.last_error_at = dmetrics_now();
    if (failing)
        m->c.failing = 1;
}

/* Write batch (and the loss and retention events) in one transaction.
 * Returns 0, or a negative dg_status: DG_E_BUSY / DG_E_IO are worth a
 * retry, anything else is not. */
static int write_batch(struct dmetrics *m, struct mrec *batch, int *retention_due,
                       uint64_t lost_now, size_t *n_req, size_t *n_ev, struct dg_error *err)
{
    int rc, new_run = 0;
    *n_req = *n_ev = 0;
    if ((rc = dg_metrics_db_begin(m->db, err)) < 0)
        return rc;
    if (m->run_id == 0) {
        struct dg_metrics_run run = {
            .started = m->started_at, .pid = getpid(), .version = m->version,
            .host = m->host, .model = m->model, .backend = m->backend,
            .config_digest = m->digest, .tp = m->o.tp,
        };
        int64_t id = 0;
        if ((rc = dg_metrics_db_put_run(m->db, &run, &id, err)) < 0)
            goto rollback;
        m->run_id = id;
        new_run = 1;
    }
    for (struct mrec *r = batch; r; r = r->next) {
        switch (r->kind) {
        case MREC_REQUEST:
            rc = dg_metrics_db_put_request(m->db, m->run_id, m->backend, m->o.tp, &r->req, err);
            ++*n_req;
            break;
        case MREC_EVENT:
            rc = dg_metrics_db_put_event(m->db, m->run_id, r->time, r->kind_name, r->detail, err);
            ++*n_ev;
            break;
        case MREC_STOP:
            if ((rc = dg_metrics_db_put_event(m->db, m->run_id, r->time, "stop", r->detail,
                                              err)) == 0)
                rc = dg_metrics_db_stop_run(m->db, m->run_id, r->time, err);
            ++*n_ev;
            break;
        }
        if (rc < 0)
            goto rollback;
    }
    if (lost_now > m->lost_recorded) {
        char d[96];
        snprintf(d, sizeof d, "%llu records lost since the last report (%llu in all)",
                 (unsigned long long)(lost_now - m->lost_recorded),
                 (unsigned long long)lost_now);
        if ((rc = dg_metrics_db_put_event(m->db, m->run_id, dmetrics_now(), "metrics_lost", d,
                                          err)) < 0)
            goto rollback;
        ++*n_ev;
    }
    if (*retention_due && (m->o.retention_days > 0 || m->o.max_bytes > 0)) {
        struct dg_metrics_retained gone;
        if ((rc = dg_metrics_db_retain(m->db, dmetrics_now(), m->o.retention_days * 86400.0,
                                       m->o.max_bytes, m->run_id, &gone, err)) < 0)
            goto rollback;
        if (gone.requests + gone.events + gone.runs > 0) {
            char d[160];
            snprintf(d, sizeof d, "deleted %lld requests, %lld canvases, %lld events, %lld runs",
                     (long long)gone.requests, (long long)gone.canvases, (long long)gone.events,
                     (long long)gone.runs);
            if ((rc = dg_metrics_db_put_event(m->db, m->run_id, dmetrics_now(), "retention", d,
                                              err)) < 0)
                goto rollback;
            dlog(DG_LOG_INFO, "metrics retention: %s", d);
        }
    }
    if ((rc = dg_metrics_db_commit(m->db, err)) < 0)
        goto rolled_back;
    m->lost_recorded = lost_now > m->lost_recorded ? lost_now : m->lost_recorded;
    *retention_due = 0;
    return 0;
rollback:
    dg_metrics_db_rollback(m->db);
rolled_back:
    if (new_run) /* the run row went with the transaction */
        m->run_id = 0;
    return rc;
}

static int retryable(int rc)
{
    return rc == -DG_E_BUSY || rc == -DG_E_IO || rc == -DG_E_NOMEM;
}

/* After *batch failed for good as a whole: write its records one per
 * transaction, dropping (and counting as lost) only those that fail on
 * their own, so one bad record does not take the good ones with it.
 * Called and returns with m->mu held; unlocks it around each write.
 * Returns 0 when the batch is used up, or the retryable error that
 * stopped it (the records not yet written stay in *batch). */
static int salvage(struct dmetrics *m, struct mrec **batch, struct mrec **tail,
                   int *retention_due, struct dg_error *err)
{
    size_t dropped = 0;
    int rc = 0;
    while (*batch) {
        struct mrec *r = *batch;
        size_t n_req = 0, n_ev = 0;
        *batch = r->next;
        r->next = NULL;
        pthread_mutex_unlock(&m->mu);
        /* (lost_now == lost_recorded: the loss event waits for the next batch) */
        rc = write_batch(m, r, retention_due, m->lost_recorded, &n_req, &n_ev, err);
        pthread_mutex_lock(&m->mu);
        if (rc < 0 && retryable(rc)) {
            r->next = *batch;
            *batch = r;
            break;
        }
        if (rc < 0) {
            /* (logged at most every LOSS_LOG_PERIOD_S: a damaged file fails
             * every record, and would fill the log at the request rate) */
            m->c.lost++;
            dropped++;
            m->drops_unlogged++;
            if (mono_now() - m->drop_logged_at >= LOSS_LOG_PERIOD_S) {
                dlog(DG_LOG_ERROR, "metrics: %zu record(s) dropped since the last such line: %s",
                     m->drops_unlogged, err->msg);
                m->drops_unlogged = 0;
                m->drop_logged_at = mono_now();
            }
        } else {
            m->c.requests += n_req;
            m->c.events += n_ev;
            m->c.run = m->run_id;
            m->c.failing = 0;
        }
        m->held--;
        mrec_free(r);
        rc = 0;
    }
    if (!*batch)
        *tail = NULL;
    if (dropped)
        note_failure(m, 0, "%zu records dropped: %s", dropped, err->msg);
    return rc;
}

static void timed_wait(struct dmetrics *m, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)seconds;
    ts.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
}

/* Whether m's path still names the file the writer opened: said once in
 * the log (an error) when it stops doing so (the file moved, deleted or
 * replaced: rows go on to the open file, which nobody will find at the
 * path), and once when it names it again.  The writer's thread, no lock
 * held (it reads only what create set and what only this thread
 * changes). */
static void check_path(struct dmetrics *m)
{
    struct stat now;
    const int moved = stat(m->path, &now) != 0 || now.st_dev != m->opened.st_dev ||
                      now.st_ino != m->opened.st_ino;
    if (moved && !m->path_moved)
        dlog(DG_LOG_ERROR, "metrics: %s no longer names the file being written (moved, deleted "
             "or replaced): the rows go to the file opened at start; restart dgemmad to write "
             "at %s", m->path, m->path);
    else if (!moved && m->path_moved)
        dlog(DG_LOG_INFO, "metrics: %s names the file being written again", m->path);
    m->path_moved = moved;
}

/* Whether the stop's time to write what is left has run out: 0 before
 * the stop; the deadline (stop_wait_s on) set at the first look after
 * quit, wherever the writer was when it came. */
static int past_stop(const struct dmetrics *m, double *deadline)
{
    if (!m->quit)
        return 0;
    if (*deadline == 0)
        *deadline = mono_now() + m->o.stop_wait_s;
    return mono_now() >= *deadline;
}

static void *writer_thread(void *arg)
{
    struct dmetrics *m = arg;
    struct mrec *batch = NULL, *batch_tail = NULL;
    double pause = 0, next_retention = 0, last_loss_log = -1e9, stop_deadline = 0;
    double next_path_check = 0, last_lost_event = -1e9;
    uint64_t lost_logged = 0;
    int retention_due = 1, was_due;

    dlog_set_tag('W');
    pthread_mutex_lock(&m->mu);
    for (;;) {
        struct dg_error err = {0};
        size_t n_req = 0, n_ev = 0;
        uint64_t lost, recorded;
        int rc;

        (void)past_stop(m, &stop_deadline);
        if (pause > 0) {
            /* the whole pause after a failure, however full the queue gets
             * (what it cannot hold is dropped and counted), unless a stop */
            const double until = mono_now() + pause;
            while (!m->quit && mono_now() < until)
                timed_wait(m, until - mono_now());
        } else if (!m->quit && (!m->head || m->held * 2 < m->o.queue_max)) {
            /* (a batch already half the bound: its signal may have come
             * before this wait) */
            timed_wait(m, m->o.flush_s);
        }
        /* take what is queued */
        if (m->head) {
            if (batch_tail)
                batch_tail->next = m->head;
            else
                batch = m->head;
            batch_tail = m->tail;
            m->head = m->tail = NULL;
        }
        lost = m->c.lost;
        if (!m->quit && lost > lost_logged && mono_now() - last_loss_log >= LOSS_LOG_PERIOD_S) {
            dlog(DG_LOG_WARN, "metrics: %llu records lost so far (the queue of %zu full, or "
                 "out of memory%s%s)",
                 (unsigned long long)lost, m->o.queue_max, m->c.last_error[0] ? "; " : "",
                 m->c.last_error);
            lost_logged = lost;
            last_loss_log = mono_now();
        }
        if (!retention_due && mono_now() >= next_retention)
            retention_due = 1;
        /* losses go into a metrics_lost event at most every LOSS_LOG_PERIOD_S
         * (and at the stop): a queue too small for its bursts would
         * otherwise write one with every batch */
        if (lost > m->lost_recorded && !m->quit &&
            mono_now() - last_lost_event < LOSS_LOG_PERIOD_S)
            lost = m->lost_recorded;
        if (!batch && lost == m->lost_recorded && !retention_due) {
            if (m->quit)
                break;
            continue;
        }
        was_due = retention_due;
        recorded = m->lost_recorded; /* (written by this thread only) */
        pthread_mutex_unlock(&m->mu);

        rc = write_batch(m, batch, &retention_due, lost, &n_req, &n_ev, &err);
        if (rc == 0 && was_due)
            next_retention = mono_now() + RETENTION_PERIOD_S;
        if (rc == 0 && lost > recorded) /* (a metrics_lost event went in) */
            last_lost_event = mono_now();
        if (rc == 0 && mono_now() >= next_path_check) {
            check_path(m);
            next_path_check = mono_now() + PATH_CHECK_PERIOD_S;
        }

        pthread_mutex_lock(&m->mu);
        if (rc == 0) {
            size_t n = 0;
            for (struct mrec *r = batch, *next; r; r = next) {
                next = r->next;
                mrec_free(r);
                n++;
            }
            batch = batch_tail = NULL;
            m->held -= n;
            m->c.requests += n_req;
            m->c.events += n_ev;
            m->c.run = m->run_id;
            m->c.failing = 0;
            if (pause > 0)
                dlog(DG_LOG_INFO, "metrics: writing again");
            pause = 0;
            continue;
        }
        note_failure(m, 1, "%s", err.msg);
        if (retryable(rc)) {
            /* keep the batch; try again after a pause */
            m->c.retries++;
            if (pause == 0)
                dlog(DG_LOG_WARN, "metrics: cannot write, will retry: %s", err.msg);
            pause = pause == 0 ? 0.1 : pause * 2 > RETRY_MAX_S ? RETRY_MAX_S : pause * 2;
            if (past_stop(m, &stop_deadline))
                break;
            if (m->quit) {
                pthread_mutex_unlock(&m->mu);
                usleep((useconds_t)(pause * 1e6));
                pthread_mutex_lock(&m->mu);
            }
            continue;
        }
        /* a failure a retry will not fix: find the records that cause it */
        rc = salvage(m, &batch, &batch_tail, &retention_due, &err);
        if (rc < 0) {
            note_failure(m, 1, "%s", err.msg);
            m->c.retries++;
            pause = 0.1;
            if (past_stop(m, &stop_deadline))
                break;
            continue;
        }
        /* (at stop: go on for what is queued, the stop event among them) */
        if (past_stop(m, &stop_deadline))
            break;
        if (m->quit) {
            pthread_mutex_unlock(&m->mu);
            usleep(10000);
            pthread_mutex_lock(&m->mu);
        }
    }
    /* what could not be written in time */
    {
        size_t n = 0;
        for (struct mrec *r = batch, *next; r; r = next) {
            next = r->next;
            mrec_free(r);
            n++;
        }
        for (struct mrec *r = m->head, *next; r; r = next) {
            next = r->next;
            mrec_free(r);
            n++;
        }
        m->head = m->tail = NULL;
        m->held -= n;
        m->c.lost += n;
        if (n)
            dlog(DG_LOG_WARN, "metrics: %zu records not written at stop: %s", n,
                 m->c.last_error);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* ---- life cycle ----------------------------------------------------------------- */

int dmetrics_create(const struct dmetrics_options *o, struct dmetrics **out,
                    struct dg_error *err)
{
    struct dmetrics *m;
    char host[256] = "";
    int bad = 0, rc;

    *out = NULL;
    if (o->queue_max < 1 || !(o->flush_s > 0))
        return dg_error_set(err, DG_E_INVAL, "metrics: queue_max >= 1 and flush_s > 0 needed");
    m = calloc(1, sizeof *m);
    if (!m)
        return dg_error_set(err, DG_E_NOMEM, "metrics: out of memory");
    m->o = *o;
    m->drop_logged_at = -1e9; /* (the first drop is logged at once) */
    gethostname(host, sizeof host - 1);
    m->version = dup_or_null(o->version, &bad);
    m->model = dup_or_null(o->model, &bad);
    m->backend = dup_or_null(o->backend, &bad);
    m->digest = dup_or_null(o->config_digest, &bad);
    m->host = dup_or_null(host, &bad);
    m->o.path = NULL;
    m->started_at = dmetrics_now();
    pthread_mutex_init(&m->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&m->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (bad) {
        dmetrics_destroy(m);
        return dg_error_set(err, DG_E_NOMEM, "metrics: out of memory");
    }
    if ((rc = dg_metrics_db_open(o->path, DG_METRICS_WRITE, o->busy_ms, &m->db, err)) < 0) {
        dmetrics_destroy(m);
        return dg_error_prefix(err, "metrics");
    }
    /* (what the path names now is the file just opened) */
    if (!(m->path = strdup(o->path))) {
        dmetrics_destroy(m);
        return dg_error_set(err, DG_E_NOMEM, "metrics: out of memory");
    }
    if (stat(o->path, &m->opened) != 0) {
        const int e = errno;
        dmetrics_destroy(m);
        return dg_error_set(err, DG_E_IO, "metrics: %s: %s", o->path, strerror(e));
    }
    {
        char d[512];
        snprintf(d, sizeof d, "dgemmad %s pid %d: model %s, backend %s, tp %d",
                 o->version ? o->version : "?", (int)getpid(), o->model ? o->model : "?",
                 o->backend ? o->backend : "?", o->tp);
        enqueue(m, event_rec(MREC_EVENT, "start", d), 1);
        if (o->config_text)
            enqueue(m, event_rec(MREC_EVENT, "config", o->config_text), 1);
    }
    if (pthread_create(&m->thread, NULL, writer_thread, m) != 0) {
        dmetrics_destroy(m);
        return dg_error_set(err, DG_E_INTERNAL, "metrics: cannot start the writer thread");
    }
    m->started = 1;
    *out = m;
    return 0;
}

void dmetrics_destroy(struct dmetrics *m)
{
    if (!m)
        return;
    if (m->started) {
        char d[160];
        struct mrec *stop;
        snprintf(d, sizeof d, "dgemmad pid %d stopping", (int)getpid());
        stop = event_rec(MREC_STOP, "stop", d);
        if (stop)
            enqueue(m, stop, 1);
        pthread_mutex_lock(&m->mu);
        m->quit = 1;
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->thread, NULL);
    }
    while (m->head) {
        struct mrec *r = m->head;
        m->head = r->next;
        mrec_free(r);
    }
    dg_metrics_db_close(m->db);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m->version);
    free(m->model);
    free(m->backend);
    free(m->digest);
    free(m->host);
    free(m->path);
    free(m);
}
