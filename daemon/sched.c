/* sched.c - the scheduler thread (see sched.h for the design). */
#include "daemon/sched.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/dlog.h"
#include "daemon/metrics.h"
#include "lib/json-util.h"

enum sreq_state { SREQ_QUEUED = 1, SREQ_RUNNING };

/* "no ids yet" for a non-streaming request's done line (not NULL: NULL
 * means "omit the ids") */
static const int32_t NO_IDS[1] = {0};

/* One request, from submission to its done line. */
struct sreq {
    struct sreq *next;          /* in the queue or the running list */
    uint64_t id, conn;
    uint64_t engine_id;
    enum sreq_state state;
    char tag[DPROTO_TAG_MAX + 1];
    int has_tag, stream;
    int cancel;                 /* asked to stop; picked up at the next step */
    int conn_gone;              /* drop its lines */
    uid_t uid;
    pid_t pid;
    int32_t *ids;
    size_t n_ids;
    struct dg_gen_settings settings;
    enum dg_metrics_source source;
    double t_submit, t_start, t_first;   /* wall clock (Unix s); 0: not yet */
    double m_submit, m_first;            /* monotonic, for durations */
    struct dg_buf text;         /* the whole output, for non-streaming requests */
    struct dg_ids out_ids;
    char *oom_line;             /* its last line if the real one cannot be made */
    size_t oom_len;
    int short_output;           /* a canvas or part of the output lost (out of
                                 * memory): it ends with oom_line */
};

struct dsched {
    struct dg_engine *engine;
    size_t max_batch;           /* the engine's slots */
    int64_t max_context;        /* the engine's positions a request */
    int have_tok;               /* events carry text */
    size_t queue_max;
    int notify_fd;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit, shutting_down, cancel_all;
    int dead;                   /* the backend failed for good (scheduler thread) */
    struct dg_backend *backend;
    uint64_t next_id;
    struct sreq *queue_head, *queue_tail;
    size_t queued;
    struct sreq *running;
    size_t n_running;
    /* the outbox: cap_out >= n_out + queued + n_running always, so the last
     * line of every request held here has its place */
    struct dsched_out *out;
    size_t n_out, cap_out;
    struct dsched_status totals;
    struct dmetrics *metrics;   /* NULL: none */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Hand r's row to the metrics writer (never waits on the database).
 * st NULL: the request never ran. */
static void record(struct dsched *s, const struct sreq *r, const char *finish,
                   const char *error_code, const char *error, const struct dg_request_stats *st)
{
    struct dg_metrics_request row;
    struct dg_metrics_canvas canvas[64], *cv = canvas;
    json_t *sj;
    char *settings = NULL;
    const double m_end = mono_s();

    if (!s->metrics)
        return;
    memset(&row, 0, sizeof row);
    row.request_id = r->id;
    row.tag = r->has_tag ? r->tag : NULL;
    row.uid = (int64_t)r->uid;
    row.pid = (int64_t)r->pid;
    row.source = r->source;
    row.submitted = r->t_submit;
    row.started = r->t_start;
    row.first_canvas = r->t_first;
    row.finished = r->t_submit + (m_end - r->m_submit);
    row.prompt_tokens = (int64_t)r->n_ids;
    row.ttfc_ms = r->t_first > 0 ? (r->m_first - r->m_submit) * 1e3 : -1;
    row.total_ms = (m_end - r->m_submit) * 1e3;
    row.finish = finish;
    row.error_code = error_code;
    row.error = error;
    if (st) {
        row.completion_tokens = st->completion_tokens;
        row.canvases = st->canvases;
        row.steps = st->decoder_steps;
        row.tokens_per_s = st->prefilled ? st->tokens_per_s : -1; /* (NULL: no prefill) */
        if (st->canvases > (int)(sizeof canvas / sizeof canvas[0]) &&
            !(cv = malloc((size_t)st->canvases * sizeof *cv)))
            cv = NULL;
        for (int i = 0; cv && i < st->canvases; i++) {
            const struct dg_canvas_stats *c = &st->canvas[i];
            cv[i] = (struct dg_metrics_canvas){c->index, c->steps, c->converged, c->tokens,
                                               c->ms, c->mean_entropy};
        }
        row.canvas = cv;
        row.n_canvas = cv ? st->canvases : 0;
    }
    if ((sj = dg_gen_settings_to_json(&r->settings)) != NULL) {
        settings = dg_json_dumps(sj, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(sj);
    }
    row.settings_json = settings;
    dmetrics_request(s->metrics, &row);
    free(settings);
    if (cv != canvas)
        free(cv);
}

static void sreq_free(struct sreq *r)
{
    free(r->ids);
    dg_buf_free(&r->text);
    dg_ids_free(&r->out_ids);
    free(r->oom_line);
    free(r);
}

static void notify(struct dsched *s)
{
    const uint64_t one = 1;
    ssize_t w;
    do
        w = write(s->notify_fd, &one, sizeof one);
    while (w < 0 && errno == EINTR);
}

/* Grow the outbox to hold at least need lines (mu held): 0, or -1 when
 * out of memory (the outbox is unchanged). */
static int outbox_grow(struct dsched *s, size_t need)
{
    size_t cap = s->cap_out ? s->cap_out : 64;
    struct dsched_out *o;
    while (cap < need)
        cap *= 2;
    if (cap == s->cap_out)
        return 0;
    if (!(o = realloc(s->out, cap * sizeof *o)))
        return -1;
    s->out = o;
    s->cap_out = cap;
    return 0;
}

/* Append a line for r's connection (mu held).  A request's last line
 * (ends) always gets out: its place in the outbox was reserved when it was
 * submitted, and when it could not be formatted (line NULL) the done line
 * with an out-of-memory error made at submission goes instead.  Other
 * lines (canvases) that cannot be formatted or queued are dropped, and
 * logged. */
static void push(struct dsched *s, struct sreq *r, char *line, size_t len, int ends)
{
    if (!ends && !line)
        r->short_output = 1;
    if (!line) {
        dlog(DG_LOG_ERROR, "req=%llu: out of memory formatting %s",
             (unsigned long long)r->id, ends ? "its output: it ends with an error" : "an event");
        if (!ends)
            return;
        line = r->oom_line;
        len = line ? r->oom_len : 0;
        r->oom_line = NULL;
    }
    if (r->conn_gone) {
        free(line);
        return;
    }
    /* (a canvas may not take the places kept for last lines) */
    if (outbox_grow(s, s->n_out + 1 + (ends ? 0 : s->queued + s->n_running)) < 0) {
        /* (a last line finds its place reserved: this is a canvas) */
        dlog(DG_LOG_ERROR, "req=%llu: out of memory queueing an event",
             (unsigned long long)r->id);
        free(line);
        r->short_output = 1;
        return;
    }
    s->out[s->n_out++] = (struct dsched_out){r->conn, line, len, ends};
    notify(s);
}

/* A done line for a request that never ran (cancelled while queued). */
static void done_unstarted(struct dsched *s, struct sreq *r, const char *why)
{
    struct dg_request_stats st;
    struct dg_gen_event ev;
    size_t len = 0;
    char *line;

    memset(&st, 0, sizeof st);
    st.prompt_tokens = (int64_t)r->n_ids;
    memset(&ev, 0, sizeof ev);
    ev.kind = DG_EVENT_DONE;
    ev.finish = DG_FINISH_CANCELLED;
    ev.stop_id = -1;
    ev.stats = &st;
    line = dproto_done(r->id, r->has_tag ? r->tag : NULL, &ev, "", 0, !r->stream && s->have_tok,
                       r->stream ? NULL : NO_IDS, 0, &len);
    dlog(DG_LOG_INFO, "req=%llu cancelled before it started (%s)", (unsigned long long)r->id,
         why);
    record(s, r, "cancelled", NULL, why, NULL);
    push(s, r, line, len, 1);
    s->totals.cancelled++;
}

/* ---- engine events (scheduler thread, during dg_engine_step) -------------- */

static void on_event(void *ctx, const struct dg_gen_event *ev)
{
    struct dsched *s = ctx;
    struct sreq *r = ev->user;
    const char *tag = r->has_tag ? r->tag : NULL;
    size_t len = 0;
    char *line;

    if (ev->kind == DG_EVENT_CANVAS) {
        if (r->t_first == 0) {
            r->m_first = mono_s();
            r->t_first = r->t_submit + (r->m_first - r->m_submit);
        }
        if (r->stream) {
            line = dproto_canvas(r->id, tag, ev, &len);
            pthread_mutex_lock(&s->mu);
            push(s, r, line, len, 0);
            pthread_mutex_unlock(&s->mu);
            return;
        }
        if ((ev->text && dg_buf_append(&r->text, ev->text, ev->text_len) < 0)) {
            dlog(DG_LOG_ERROR, "req=%llu: out of memory collecting text",
                 (unsigned long long)r->id);
            r->short_output = 1;
        }
        if (ev->n_ids > 0 && dg_ids_append(&r->out_ids, ev->ids, (size_t)ev->n_ids) < 0) {
            dlog(DG_LOG_ERROR, "req=%llu: out of memory collecting ids",
                 (unsigned long long)r->id);
            r->short_output = 1;
        }
        return;
    }
    /* done: the last line, a log line, and the request is forgotten; an
     * output that lost a part ends with the out-of-memory error instead */
    line = r->short_output ? NULL
                           : dproto_done(r->id, tag, ev, r->text.s ? r->text.s : "", r->text.n,
                                         !r->stream && s->have_tok,
                                         r->stream ? NULL
                                                   : (r->out_ids.v ? r->out_ids.v : NO_IDS),
                                         r->out_ids.n, &len);
    dlog(ev->finish == DG_FINISH_ERROR ? DG_LOG_WARN : DG_LOG_INFO,
         "req=%llu uid=%d done %s%s%s prompt=%lld completion=%lld canvases=%d steps=%lld "
         "tokens/step=%.2f tokens/s=%.1f ms=%.1f", (unsigned long long)r->id, (int)r->uid,
         dg_finish_name(ev->finish), ev->error ? ": " : "", ev->error ? ev->error : "",
         (long long)ev->stats->prompt_tokens, (long long)ev->stats->completion_tokens,
         ev->stats->canvases, (long long)ev->stats->decoder_steps, ev->stats->tokens_per_step,
         ev->stats->tokens_per_s, ev->stats->ms_total);
    if (!line && !r->conn_gone) /* (the client gets the out-of-memory error: so does the row) */
        record(s, r, "error", dg_status_name(DG_E_NOMEM),
               "out of memory: its output could not be kept or sent whole", ev->stats);
    else
        record(s, r, dg_finish_name(ev->finish),
               ev->finish == DG_FINISH_ERROR ? dg_status_name(ev->error_code)
               /* (a request that ended by itself as its client went keeps
                * its own finish, and no code) */
               : r->conn_gone && ev->finish == DG_FINISH_CANCELLED ? "client_gone"
                                                                   : NULL,
               ev->finish == DG_FINISH_ERROR ? ev->error : NULL, ev->stats);
    pthread_mutex_lock(&s->mu);
    push(s, r, line, len, 1);
    s->totals.finished++;
    s->totals.completion_tokens += (uint64_t)ev->stats->completion_tokens;
    s->totals.decoder_steps += (uint64_t)ev->stats->decoder_steps;
    if (ev->finish == DG_FINISH_CANCELLED)
        s->totals.cancelled++;
    if (ev->finish == DG_FINISH_ERROR)
        s->totals.failed++;
    /* unlink from the running list */
    for (struct sreq **p = &s->running; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            s->n_running--;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    sreq_free(r);
}

/* ---- the thread --------------------------------------------------------------- */

/* Admit queued requests into free slots (mu held; the engine is ours). */
static void admit(struct dsched *s)
{
    while (s->queue_head) {
        struct sreq *r = s->queue_head;
        struct dg_error err = {0};
        uint64_t eid;
        int rc = dg_engine_submit(s->engine, r->ids, (int64_t)r->n_ids, &r->settings, r, &eid,
                                  &err);
        if (rc == -DG_E_BUSY)
            break; /* every slot taken: wait for one */
        s->queue_head = r->next;
        if (!s->queue_head)
            s->queue_tail = NULL;
        s->queued--;
        if (rc < 0) {
            /* the request's size was checked at submission (dsched_submit),
             * so this is a resource failure; the client was told the id,
             * so its last event is a done line (finish_reason error) */
            size_t len = 0;
            char *line = dproto_done_error(r->id, r->has_tag ? r->tag : NULL,
                                           rc == -DG_E_RANGE ? "too_large" : "internal", err.msg,
                                           &len);
            dlog(DG_LOG_WARN, "req=%llu not started: %s", (unsigned long long)r->id, err.msg);
            record(s, r, "error", rc == -DG_E_RANGE ? "too_large" : "internal", err.msg, NULL);
            push(s, r, line, len, 1);
            s->totals.failed++;
            sreq_free(r);
            continue;
        }
        r->engine_id = eid;
        r->state = SREQ_RUNNING;
        r->t_start = r->t_submit + (mono_s() - r->m_submit);
        r->next = s->running;
        s->running = r;
        s->n_running++;
        dlog(DG_LOG_DEBUG, "req=%llu started (%zu in flight)", (unsigned long long)r->id,
             s->n_running);
    }
}

static void *sched_thread(void *arg)
{
    struct dsched *s = arg;

    dlog_set_tag('S');
    pthread_mutex_lock(&s->mu);
    while (!s->quit) {
        for (struct sreq *r = s->running; r; r = r->next)
            if (r->cancel || s->cancel_all) {
                dg_engine_cancel(s->engine, r->engine_id);
                r->cancel = 0;
            }
        if (!s->shutting_down)
            admit(s);
        if (s->n_running == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        dg_engine_step(s->engine);
        if (s->backend->ops->failure && s->backend->ops->failure(s->backend) && !s->dead) {
            /* its requests have failed; nothing more can run: stop */
            s->dead = 1;
            dlog(DG_LOG_ERROR, "backend %s failed for good: %s; the daemon stops",
                 s->backend->name, s->backend->ops->failure(s->backend));
            kill(getpid(), SIGTERM);
        }
        pthread_mutex_lock(&s->mu);
        s->totals.engine_steps++;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int dsched_create(struct dg_backend *b, const struct dg_engine_config *ec,
                  const struct dg_tokenizer *tok, size_t queue_max, int notify_fd,
                  struct dmetrics *metrics, struct dsched **out, struct dg_error *err)
{
    struct dsched *s = calloc(1, sizeof *s);
    int rc;

    *out = NULL;
    if (!s)
        return dg_error_set(err, DG_E_NOMEM, "scheduler: out of memory");
    s->queue_max = queue_max;
    s->backend = b;
    s->max_batch = (size_t)ec->max_batch;
    s->max_context = ec->max_context;
    s->notify_fd = notify_fd;
    s->metrics = metrics;
    s->have_tok = tok != NULL;
    s->next_id = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if ((rc = dg_engine_create(b, ec, tok, on_event, s, &s->engine, err)) < 0) {
        dsched_destroy(s);
        return rc;
    }
    if (pthread_create(&s->thread, NULL, sched_thread, s) != 0) {
        dsched_destroy(s);
        return dg_error_set(err, DG_E_INTERNAL, "scheduler: cannot start its thread");
    }
    s->started = 1;
    *out = s;
    return 0;
}

void dsched_destroy(struct dsched *s)
{
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    dg_engine_destroy(s->engine); /* drops the running requests' engine state */
    while (s->running) {
        struct sreq *r = s->running;
        s->running = r->next;
        sreq_free(r);
    }
    while (s->queue_head) {
        struct sreq *r = s->queue_head;
        s->queue_head = r->next;
        sreq_free(r);
    }
    for (size_t i = 0; i < s->n_out; i++)
        free(s->out[i].line);
    free(s->out);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int dsched_submit(struct dsched *s, uint64_t conn, struct dproto_request *req, uid_t uid,
                  pid_t pid, enum dg_metrics_source source, uint64_t *id, struct dg_error *err)
{
    struct sreq *r;

    pthread_mutex_lock(&s->mu);
    if (s->shutting_down) {
        pthread_mutex_unlock(&s->mu);
        return dg_error_set(err, DG_E_INVAL, "the daemon is shutting down");
    }
    /* a request that could never start is refused before it is accepted
     * (the engine checks the same when it admits it) */
    if (dg_engine_check_fit(s->max_context, (int64_t)req->n_ids, &req->settings, err) < 0) {
        pthread_mutex_unlock(&s->mu);
        return -DG_E_RANGE;
    }
    /* running + waiting: the same before and after an admission, so the
     * answer does not depend on how far the scheduler thread has got */
    if (s->queued + s->n_running >= s->max_batch + s->queue_max) {
        size_t waiting = s->queued + s->n_running > s->max_batch
                             ? s->queued + s->n_running - s->max_batch : 0;
        pthread_mutex_unlock(&s->mu);
        return dg_error_set(err, DG_E_BUSY, "%zu requests are running and %zu waiting "
                            "(max_batch %zu, queue_max %zu); try again later",
                            s->queued + s->n_running - waiting, waiting, s->max_batch,
                            s->queue_max);
    }
    r = calloc(1, sizeof *r);
    /* its last line's place in the outbox, and the line that says it ran
     * out of memory (see push) */
    if (!r || outbox_grow(s, s->n_out + s->queued + s->n_running + 1) < 0 ||
        !(r->oom_line = dproto_done_error(s->next_id, req->has_tag ? req->tag : NULL,
                                          dg_status_name(DG_E_NOMEM),
                                          "out of memory: its output could not be kept "
                                          "or sent whole",
                                          &r->oom_len))) {
        free(r);
        pthread_mutex_unlock(&s->mu);
        return dg_error_set(err, DG_E_NOMEM, "scheduler: out of memory");
    }
    r->id = s->next_id++;
    r->conn = conn;
    r->state = SREQ_QUEUED;
    memcpy(r->tag, req->tag, sizeof r->tag);
    r->has_tag = req->has_tag;
    r->stream = req->stream;
    r->uid = uid;
    r->pid = pid;
    r->ids = req->ids;
    r->n_ids = req->n_ids;
    req->ids = NULL;
    req->n_ids = 0;
    r->settings = req->settings;
    r->source = source;
    r->m_submit = mono_s();
    r->t_submit = dmetrics_now();
    if (s->queue_tail)
        s->queue_tail->next = r;
    else
        s->queue_head = r;
    s->queue_tail = r;
    s->queued++;
    s->totals.accepted++;
    *id = r->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Take r out of the queue (mu held). */
static void unqueue(struct dsched *s, struct sreq *r)
{
    struct sreq *prev = NULL;
    for (struct sreq *q = s->queue_head; q; prev = q, q = q->next)
        if (q == r) {
            if (prev)
                prev->next = r->next;
            else
                s->queue_head = r->next;
            if (s->queue_tail == r)
                s->queue_tail = prev;
            s->queued--;
            return;
        }
}

/* May a client (conn, uid) cancel r? Its own connection, the same user, or root. */
static int may_cancel(const struct sreq *r, uint64_t conn, uid_t uid)
{
    return r->conn == conn || r->uid == uid || uid == 0;
}

int dsched_cancel(struct dsched *s, uint64_t conn, uid_t uid, uint64_t id)
{
    int rc = -DG_E_INVAL;
    pthread_mutex_lock(&s->mu);
    for (struct sreq *r = s->queue_head; r; r = r->next)
        if (r->id == id && may_cancel(r, conn, uid)) {
            unqueue(s, r);
            done_unstarted(s, r, "cancel");
            sreq_free(r);
            rc = 0;
            goto out;
        }
    for (struct sreq *r = s->running; r; r = r->next)
        if (r->id == id && may_cancel(r, conn, uid)) {
            r->cancel = 1;
            pthread_cond_signal(&s->cv);
            rc = 0;
            goto out;
        }
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void dsched_conn_gone(struct dsched *s, uint64_t conn)
{
    pthread_mutex_lock(&s->mu);
    for (struct sreq *r = s->queue_head, *next; r; r = next) {
        next = r->next;
        if (r->conn == conn) {
            unqueue(s, r);
            dlog(DG_LOG_INFO, "req=%llu dropped: its client went away", (unsigned long long)r->id);
            record(s, r, "cancelled", "client_gone", "the client went away before it started",
                   NULL);
            s->totals.cancelled++;
            sreq_free(r);
        }
    }
    for (struct sreq *r = s->running; r; r = r->next)
        if (r->conn == conn) {
            r->cancel = 1;
            r->conn_gone = 1;
            dlog(DG_LOG_INFO, "req=%llu cancelled: its client went away",
                 (unsigned long long)r->id);
        }
    /* lines already in the outbox for it are the front end's to drop */
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

size_t dsched_take(struct dsched *s, struct dsched_out *out, size_t max)
{
    size_t n;
    pthread_mutex_lock(&s->mu);
    n = s->n_out < max ? s->n_out : max;
    if (n > 0) { /* (the outbox may not exist yet: a wake-up of the tokenizing thread's) */
        memcpy(out, s->out, n * sizeof *out);
        memmove(s->out, s->out + n, (s->n_out - n) * sizeof *out);
        s->n_out -= n;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

size_t dsched_room(struct dsched *s)
{
    size_t held, cap, room;
    pthread_mutex_lock(&s->mu);
    held = s->queued + s->n_running;
    cap = s->max_batch + s->queue_max;
    room = s->shutting_down || held >= cap ? 0 : cap - held;
    pthread_mutex_unlock(&s->mu);
    return room;
}

void dsched_status(struct dsched *s, struct dsched_status *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->totals;
    st->queued = s->queued;
    st->running = s->n_running;
    st->shutting_down = s->shutting_down;
    pthread_mutex_unlock(&s->mu);
}

void dsched_shutdown(struct dsched *s, int cancel_running)
{
    pthread_mutex_lock(&s->mu);
    if (!s->shutting_down)
        while (s->queue_head) {
            struct sreq *r = s->queue_head;
            unqueue(s, r);
            done_unstarted(s, r, "shutting down");
            sreq_free(r);
        }
    s->shutting_down = 1;
    if (cancel_running)
        s->cancel_all = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int dsched_idle(struct dsched *s)
{
    int idle;
    pthread_mutex_lock(&s->mu);
    idle = !s->queue_head && !s->running && s->n_out == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}
