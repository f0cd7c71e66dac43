/* accuracy-run.c - `dgemma-eval accuracy`'s requests and their events (see
 * accuracy-run.h).  Each request carries the tag "p<index>"; the daemon
 * answers request lines in order (accepted or error), so a refusal without
 * a tag (a line it could not read) still finds its problem through the
 * queue of lines not yet answered. */
#include "tools/eval/accuracy-run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/eval/eval.h"

/* How long a request refused as busy waits before it is sent again. */
#define BUSY_RETRY_S 0.5

enum state { ST_TODO = 0, ST_SENT, ST_DONE };

struct item {
    enum state state;
    double retry_at;        /* busy: not before this (monotonic seconds) */
    double busy_since;      /* refused as busy since then, without being accepted
                               in between (0: not refused) */
    uint64_t id;            /* the daemon's request id, once accepted */
};

struct run {
    dgemma_t *c;
    const struct eval_problem *v;
    struct eval_outcome *out;
    struct item *it;
    size_t n, parallel, sent, done, correct;
    size_t *queue;          /* sent lines not yet answered (a ring of `parallel`) */
    size_t q_head, q_len;
    int progress;
    double busy_limit_s;    /* give up when one problem stays refused this long */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void show_progress(const struct run *r, int final)
{
    if (!r->progress)
        return;
    fprintf(stderr, "\rdgemma-eval accuracy: %zu/%zu done, %zu correct, %zu in flight   %s",
            r->done, r->n, r->correct, r->sent, final ? "\n" : "");
    fflush(stderr);
}

/* Build and send problem i's request.  Returns 0, or -1 after printing why. */
static int send_one(struct run *r, size_t i)
{
    char tag[32];
    dgemma_request_t *q = dgemma_request_text(r->v[i].prompt);
    int rc;

    if (!q) {
        eval_errorf("accuracy: problem %lld: out of memory", r->v[i].id);
        return -1;
    }
    snprintf(tag, sizeof tag, "p%zu", i);
    rc = dgemma_request_set_stream(q, 0);
    if (rc == 0)
        rc = dgemma_request_set_int(q, "seed", r->v[i].id);
    if (rc == 0)
        rc = dgemma_request_set_tag(q, tag);
    if (rc < 0) {
        eval_errorf("accuracy: problem %lld: %s", r->v[i].id, dgemma_request_errmsg(q));
        dgemma_request_free(q);
        return -1;
    }
    rc = dgemma_submit(r->c, q);
    dgemma_request_free(q);
    if (rc < 0) {
        eval_errorf("accuracy: the daemon went away: %s", dgemma_errmsg(r->c));
        return -1;
    }
    r->queue[(r->q_head + r->q_len++) % r->parallel] = i;
    r->it[i].state = ST_SENT;
    r->sent++;
    return 0;
}

/* Keep `parallel` requests in flight, sending the earliest problems first.
 * (*first_open: no problem before it is still to be sent or in flight; a
 * busy one goes back to be sent, so only finished ones are skipped for
 * good.)  Returns 0 or -1 (printed). */
static int fill(struct run *r, size_t *first_open)
{
    const double t = now_s();
    while (*first_open < r->n && r->it[*first_open].state == ST_DONE)
        ++*first_open;
    for (size_t i = *first_open; i < r->n && r->sent < r->parallel; i++)
        if (r->it[i].state == ST_TODO && r->it[i].retry_at <= t && send_one(r, i) < 0)
            return -1;
    return 0;
}

/* The problem a tag "p<index>" names, or n. */
static size_t index_of_tag(const struct run *r, const char *tag)
{
    char *end;
    unsigned long long i;
    if (!tag || tag[0] != 'p' || tag[1] < '0' || tag[1] > '9')
        return r->n;
    i = strtoull(tag + 1, &end, 10);
    return *end || i >= r->n ? r->n : (size_t)i;
}

/* Problem i ended: record its outcome.  Returns 0, or -1 when out of memory. */
static int finish(struct run *r, size_t i, const char *text, size_t text_len, const char *code,
                  const char *message)
{
    struct eval_outcome *o = &r->out[i];
    const struct eval_problem *p = &r->v[i];

    r->it[i].state = ST_DONE;
    r->sent--;
    r->done++;
    if (text) {
        if (!(o->text = malloc(text_len + 1)))
            return -1;
        memcpy(o->text, text, text_len);
        o->text[text_len] = '\0';
        o->text_len = text_len;
    }
    if (code) {
        o->error_code = dup_or_null(code);
        o->error_message = dup_or_null(message ? message : "");
        if (!o->error_code || !o->error_message)
            return -1;
        if (r->progress)
            fputc('\n', stderr);
        eval_errorf("accuracy: problem %lld: %s: %s", p->id, code, message ? message : "");
        return 0;
    }
    o->ok = text_len == p->answer_len && memcmp(text, p->answer, text_len) == 0;
    r->correct += (size_t)o->ok;
    return 0;
}

/* The first answer to a request line (accepted, or an error without an
 * id): it belongs to the oldest line not yet answered.  Returns 0 or -1
 * (printed). */
static int on_answer(struct run *r, const dgemma_event_t *ev)
{
    size_t i, by_tag = index_of_tag(r, ev->tag);

    if (r->q_len == 0 || (ev->tag && by_tag != r->queue[r->q_head])) {
        eval_errorf("accuracy: the daemon answered a request that is not waiting for one: %s",
                    ev->json);
        return -1;
    }
    i = r->queue[r->q_head];
    r->q_head = (r->q_head + 1) % r->parallel;
    r->q_len--;
    if (ev->kind == DGEMMA_EV_ACCEPTED) {
        r->it[i].id = ev->id;
        r->it[i].busy_since = 0;
        return 0;
    }
    if (ev->code && !strcmp(ev->code, "busy")) {
        const double t = now_s();
        if (r->it[i].busy_since == 0)
            r->it[i].busy_since = t;
        else if (r->busy_limit_s > 0 && t - r->it[i].busy_since >= r->busy_limit_s) {
            eval_errorf("accuracy: the daemon has refused problem %lld as busy for %.0f s "
                        "(--busy-timeout); %zu of %zu problems done", (long long)r->v[i].id,
                        t - r->it[i].busy_since, r->done, r->n);
            return -1;
        }
        r->it[i].state = ST_TODO;
        r->it[i].retry_at = t + BUSY_RETRY_S;
        r->sent--;
        return 0;
    }
    if (ev->code && !strcmp(ev->code, "shutting_down")) {
        eval_errorf("accuracy: the daemon is shutting down (%zu of %zu problems done)", r->done,
                    r->n);
        return -1;
    }
    if (finish(r, i, NULL, 0, ev->code ? ev->code : "error", ev->message) < 0) {
        eval_errorf("accuracy: out of memory");
        return -1;
    }
    return 0;
}

/* A done event: its problem's outcome.  Returns 0 or -1 (printed). */
static int on_done(struct run *r, const dgemma_event_t *ev)
{
    size_t i = index_of_tag(r, ev->tag);
    const char *reason = ev->finish_reason ? ev->finish_reason : "";
    int rc;

    if (i == r->n) /* no tag echoed: find it by its id */
        for (i = 0; i < r->n && !(r->it[i].state == ST_SENT && r->it[i].id == ev->id); i++)
            ;
    if (i == r->n || r->it[i].state != ST_SENT || r->it[i].id != ev->id)
        return 0; /* not one of ours, or not accepted yet: not expected; ignored */
    if (!strcmp(reason, "cancelled")) {
        eval_errorf("accuracy: the daemon cancelled problem %lld's request (shutting down, or "
                    "cancelled by hand); the run is incomplete", r->v[i].id);
        return -1;
    }
    r->out[i].canvases = ev->canvases;
    r->out[i].decoder_steps = ev->decoder_steps;
    if (!strcmp(reason, "error"))
        rc = finish(r, i, ev->text, ev->text_len, ev->code ? ev->code : "error",
                    ev->message ? ev->message : "the request failed");
    else if (!ev->text)
        rc = finish(r, i, NULL, 0, "no_text",
                    "the done event carries no text (has the model no tokenizer?)");
    else
        rc = finish(r, i, ev->text, ev->text_len, NULL, NULL);
    if (rc < 0)
        eval_errorf("accuracy: out of memory");
    return rc;
}

int eval_accuracy_run(dgemma_t *c, const struct eval_problem *v, size_t n, int parallel,
                      double busy_limit_s, int progress, struct eval_outcome *out)
{
    struct run r = {.c = c, .v = v, .out = out, .n = n, .parallel = (size_t)parallel,
                    .progress = progress, .busy_limit_s = busy_limit_s};
    size_t first_open = 0;
    int rc = 0;

    r.it = calloc(n ? n : 1, sizeof *r.it);
    r.queue = calloc(r.parallel, sizeof *r.queue);
    if (!r.it || !r.queue) {
        eval_errorf("accuracy: out of memory");
        rc = -1;
    }
    while (rc == 0 && r.done < n) {
        dgemma_event_t ev;
        int e;
        if ((rc = fill(&r, &first_open)) < 0)
            break;
        show_progress(&r, 0);
        e = dgemma_next_event(c, &ev, 200);
        if (e == DGEMMA_E_AGAIN)
            continue;
        if (e < 0) {
            if (progress)
                fputc('\n', stderr);
            eval_errorf("accuracy: the daemon went away: %s (%zu of %zu problems done)",
                        dgemma_errmsg(c), r.done, n);
            rc = -1;
        } else if (ev.kind == DGEMMA_EV_ACCEPTED || (ev.kind == DGEMMA_EV_ERROR && ev.id == 0)) {
            rc = on_answer(&r, &ev);
        } else if (ev.kind == DGEMMA_EV_DONE) {
            rc = on_done(&r, &ev);
        }
        /* canvas (not asked for), cancelling, status, other: nothing to do */
    }
    if (rc == 0)
        show_progress(&r, 1);
    free(r.it);
    free(r.queue);
    return rc;
}

void eval_outcome_free(struct eval_outcome *o)
{
    free(o->text);
    free(o->error_code);
    free(o->error_message);
    memset(o, 0, sizeof *o);
}
