/*
 * cmd-batch.c - `dgemma-client batch`: JSON lines in, JSON lines out, for
 * cron.  Every input line but blank ones (only spaces, tabs and CRs) is a
 * request with an "id"; every result line carries that id.  Results are
 * appended as requests finish, one write(2) per line; ids already in the
 * output are skipped, so a killed job resumes where it stopped (a torn
 * last line is cut off first); SIGINT and SIGTERM are not caught, so they
 * end it as SIGKILL does.  Requests that did not finish (cancelled or
 * refused by a shutting-down daemon, lost with the connection) get no
 * result line, so the next run retries them; a request refused as busy is
 * sent again a second later, and so is the whole connection when the
 * daemon refuses it at accept as busy (max_connections), while --wait
 * lasts; past it, or refused as forbidden, the batch ends with exit 3 and
 * says why.  A request cancelled on purpose (dgemma-client cancel)
 * is a result, an error "cancelled": a done event does not say why it was
 * cancelled, so a status asked after it does (shutting_down false: a
 * cancel; true, or no answer: the daemon stopping; an error answer, out
 * of memory in the daemon, says neither: the status is asked again, up to
 * QUERY_TRIES times, after which those requests are left to the next run
 * as if the daemon were stopping).  A flag's setting the
 * daemon refuses (batch_flag_refused) stops the batch with nothing written
 * for it (exit 2) rather than give every line a bad_request result.
 * --json is refused (a usage error): the output is JSON lines always.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/batch-input.h"
#include "client/client.h"
#include "lib/grow.h"
#include "lib/json-util.h"

static const char usage[] =
    "usage: dgemma-client batch --input FILE|- --output FILE [--parallel N]\n"
    "                           [-s|--socket SOCKET] [--wait SECONDS] [SETTINGS]\n"
    "Each input line: {\"id\": \"...\" or N, \"prompt\": \"...\" | \"messages\": [...] |\n"
    "\"prompt_ids\": [...], any setting...}; the flags' settings apply where a\n"
    "line has none.  Each output line: {\"id\", \"finish_reason\", \"text\", \"ids\",\n"
    "\"usage\", \"seed\", ...} or {\"id\", \"error\": {\"code\", \"message\"}}; a line that\n"
    "has no usable id gets {\"line\": N, \"error\": ...}.  Re-running skips the ids\n"
    "(and bad lines) already in the output.  --parallel (default 4) requests are\n"
    "in flight at once.  --wait also covers a daemon that refuses the\n"
    "connection as busy (max_connections): the batch connects again each second.\n"
    "On a terminal, progress goes to standard error.\n"
    "Exit status: 0 every line has a result and none failed, 1 some failed (or\n"
    "the input could not be read, or out of memory: run it again to resume),\n"
    "2 usage (or another batch writes the output,\n"
    "or the daemon refuses a flag's setting: nothing is written for it),\n"
    "3 the daemon is unreachable, went away or stopped (run it again to resume).\n";

/* IT_CANCELLED: its done said "cancelled"; whether by a cancel (a result)
 * or by the daemon stopping (none: the next run retries it) is for the
 * answer to the status asked after it (settle_cancelled). */
enum item_state { IT_TODO = 0, IT_RUNNING, IT_CANCELLED, IT_DONE };

struct item {
    int line;               /* 1-based input line */
    json_t *obj;            /* the input object */
    char *key;              /* canonical JSON of its id */
    enum item_state state;
    uint64_t id;            /* the daemon's request id, once accepted */
    uint64_t seed;
    double retry_at;        /* busy: not before (monotonic seconds) */
    char *done_json;        /* IT_CANCELLED: its done event's line */
    unsigned long query;    /* IT_CANCELLED: the status query that settles it (its number) */
};

struct batch {
    int out_fd;
    json_t *seen;           /* result keys already in the output: "id JSON" or "line:N" */
    struct item *items;
    size_t n_items, cap_items;
    size_t done, failed, running, total;
    size_t unfinished;      /* cancelled by the daemon: retried by the next run */
    int failed_before;      /* error results in the output for lines of this input */
    int stopping;           /* the daemon is shutting down: submit nothing more */
    /* status queries asked after cancelled dones: sent and answered so far
     * (one at a time), and whether a cancelled item waits for the next */
    unsigned long queries_sent, queries_answered;
    int want_query;
    int query_errors;       /* error answers to the query in a row */
    double query_at;        /* the next query not before (monotonic seconds) */
    size_t unconfirmed;     /* of unfinished: cancels the daemon's status never settled */
    int progress;           /* stderr is a terminal */
    /* submitted items not yet answered (accepted or refused), oldest first:
     * the daemon answers a connection's request lines in order, so an
     * error without a tag (a line it could not read, too long) is the
     * oldest's.  A ring of `parallel` + 1 indexes: the items, and
     * QUERY_MARK for the status query in flight. */
    size_t *unanswered;
    size_t ua_head, ua_n, ua_cap;
};

#define QUERY_MARK SIZE_MAX /* (in b->unanswered: the status query) */
#define QUERY_TRIES 3       /* error answers to the status query before giving up */
#define QUERY_PAUSE 0.25    /* seconds between them */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void show_progress(struct batch *b, int final)
{
    if (!b->progress)
        return;
    fprintf(stderr, "\rdgemma-client batch: %zu/%zu done, %zu failed, %zu running   %s", b->done,
            b->total, b->failed, b->running, final ? "\n" : "");
    fflush(stderr);
}

/* One result line, appended whole.  Returns 0, or -1 after saying why. */
static int write_result(struct batch *b, json_t *res)
{
    /* (dg_json_dumps: jansson's own dump, short of memory, may leave a
     * key out and give a line that is not the result, or not JSON) */
    char *s = dg_json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t n;
    ssize_t w;
    if (!s) {
        client_errorf("out of memory writing a result");
        return -1;
    }
    n = strlen(s);
    s[n] = '\n'; /* json_dumps leaves room for the NUL: reuse it */
    w = write(b->out_fd, s, n + 1);
    free(s);
    if (w != (ssize_t)(n + 1)) {
        client_errorf("cannot write a result: %s", w < 0 ? strerror(errno) : "short write");
        return -1;
    }
    return 0;
}

static int line_error(struct batch *b, int line, const char *code, const char *msg)
{
    json_t *r = batch_line_error(line, code, msg);
    int rc = r ? write_result(b, r) : -1;
    if (!r)
        client_errorf("out of memory writing the result of input line %d", line);
    json_decref(r);
    b->failed++;
    b->done++;
    return rc;
}

/* Read the output file's results into b->seen (batch_output_scan); cut a
 * torn last line.  Returns 0, or -1 after printing why. */
static int load_output(struct batch *b, const char *path)
{
    struct stat st;
    char *buf;
    size_t keep;
    if (fstat(b->out_fd, &st) != 0)
        return -1;
    if (st.st_size == 0)
        return 0;
    if (!(buf = malloc((size_t)st.st_size))) {
        client_errorf("%s: out of memory reading it", path);
        return -1;
    }
    if (pread(b->out_fd, buf, (size_t)st.st_size, 0) != st.st_size) {
        free(buf);
        client_errorf("%s: cannot read it", path);
        return -1;
    }
    /* (the errors that count are those of this input's lines: read_input) */
    if (batch_output_scan(buf, (size_t)st.st_size, b->seen, &(int){0}, &keep) != 0) {
        free(buf);
        client_errorf("%s: out of memory reading its results", path);
        return -1;
    }
    free(buf);
    if ((off_t)keep != st.st_size) {
        if (ftruncate(b->out_fd, (off_t)keep) != 0) {
            client_errorf("%s: cannot cut its torn last line: %s", path, strerror(errno));
            return -1;
        }
        fprintf(stderr, "dgemma-client: %s: cut a torn last line (an interrupted write)\n",
                path);
    }
    return 0;
}

static int add_item(struct batch *b, int line, json_t *obj, char *key)
{
    struct item *it = dg_grow(b->items, &b->cap_items, b->n_items + 1, sizeof *it, 64);
    if (!it)
        return -1;
    b->items = it;
    memset(&b->items[b->n_items], 0, sizeof b->items[0]);
    b->items[b->n_items].line = line;
    b->items[b->n_items].obj = obj;
    b->items[b->n_items].key = key;
    b->n_items++;
    return 0;
}

/* Read the input `name` (each line through batch_input_line): bad lines
 * get their result now, good ones become items.  Returns 0, or -1 after
 * saying why when a result cannot be written, the input cannot be read
 * (a read error is not its end) or out of memory. */
static int read_input(struct batch *b, FILE *in, const char *name)
{
    struct batch_input bi;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int ln = 0, rc = 0;

    if (batch_input_init(&bi, b->seen) < 0) {
        client_errorf("out of memory reading the input");
        return -1;
    }
    while (rc == 0 && (errno = 0, n = getline(&line, &cap, in)) >= 0) {
        struct batch_line l;
        /* (a UTF-8 byte-order mark, as some editors write, is not the line's) */
        const size_t bom = ln == 0 && n >= 3 && !memcmp(line, "\xef\xbb\xbf", 3) ? 3 : 0;
        if (batch_input_line(&bi, line + bom, (size_t)n - bom, ++ln, &l) < 0) {
            client_errorf("out of memory reading the input");
            rc = -1;
            break;
        }
        if (l.kind == BATCH_LINE_BLANK)
            continue;
        b->total++;
        if (l.kind == BATCH_LINE_DONE) {
            b->done++; /* its result is there already */
            b->failed_before += l.failed;
        } else if (l.kind == BATCH_LINE_BAD) {
            rc = line_error(b, ln, l.code, l.msg);
        } else if (add_item(b, ln, l.obj, l.key) < 0) {
            client_errorf("out of memory reading the input");
            free(l.key);
            json_decref(l.obj);
            rc = -1;
        }
    }
    /* a read error, or no memory for a line (getline's ENOMEM leaves the
     * stream's error flag alone): not the end of the input, and nothing
     * of it may run as if it were */
    if (rc == 0 && (ferror(in) || errno == ENOMEM)) {
        client_errorf("%s: cannot read it after line %d: %s", name, ln,
                      errno == ENOMEM ? "out of memory" : strerror(errno));
        rc = -1;
    }
    free(line);
    batch_input_free(&bi);
    return rc;
}

/* The request for the index-th item (batch_request_parts): its prompt
 * form, then the flags' settings, then its own keys.  NULL with *why set
 * for a line that names no prompt (or an ill-formed one); NULL with *why
 * NULL when out of memory. */
static dgemma_request_t *build(const struct client_opts *o, const struct item *it, size_t index,
                               const char **why)
{
    enum batch_prompt kind;
    json_t *prompt, *extra;
    dgemma_request_t *r = NULL;
    char *text;

    if (batch_request_parts(it->obj, o->settings, index, &kind, &prompt, &extra, why) != 0)
        return NULL;
    if (kind == BATCH_PROMPT_TEXT) {
        r = dgemma_request_text(json_string_value(prompt));
    } else if (kind == BATCH_PROMPT_MESSAGES) {
        r = dgemma_request_chat(); /* the list itself comes with the other keys */
    } else {
        size_t n = json_array_size(prompt), i;
        int32_t *v = malloc(n * sizeof *v);
        json_t *x;
        if (v) {
            json_array_foreach(prompt, i, x)
                v[i] = (int32_t)json_integer_value(x);
            r = dgemma_request_ids(v, n);
        }
        free(v);
    }
    text = r ? dg_json_dumps(extra, JSON_COMPACT) : NULL;
    if (r && (!text || dgemma_request_set_json(r, text) < 0)) {
        dgemma_request_free(r);
        r = NULL;
    }
    free(text);
    json_decref(prompt);
    json_decref(extra);
    return r;
}

static struct item *item_of(struct batch *b, const char *tag)
{
    char *end;
    unsigned long long i;
    if (!tag || tag[0] != 'b')
        return NULL;
    i = strtoull(tag + 1, &end, 10);
    return *end || i >= b->n_items ? NULL : &b->items[i];
}

/* A finished item's result line, from its done event's line done_json;
 * with cancel_error, also an "error" of code "cancelled" (a request
 * cancelled on purpose is a failed one: the next run skips it). */
static int finish(struct batch *b, struct item *it, const char *done_json, int cancel_error)
{
    struct dg_error je = {0};
    /* (the text can hold a NUL, sent as \u0000) */
    json_t *done = dg_json_loadb(done_json, strlen(done_json), JSON_ALLOW_NUL, "done event", &je),
           *res;
    static const char *const keep[] = {"finish_reason", "text", "ids", "usage", "canvases",
                                       "steps_per_canvas", "decoder_steps", "tokens_per_step",
                                       "tokens_per_s", "ms_total", "stop_id", "stop", "error"};
    int rc, bad;
    if (!done) {
        client_errorf("input line %d: the daemon's %s", it->line, je.msg);
        return -1;
    }
    res = json_object();
    bad = !res || json_object_set(res, "id", json_object_get(it->obj, "id")) != 0;
    for (size_t k = 0; !bad && k < sizeof keep / sizeof keep[0]; k++) {
        json_t *v = json_object_get(done, keep[k]);
        if (v && json_object_set(res, keep[k], v) != 0)
            bad = 1;
        if (k == 0 && v &&
            json_object_set_new(res, "seed", json_integer((json_int_t)it->seed)) != 0)
            bad = 1;
    }
    if (!bad && cancel_error && !json_object_get(res, "error") &&
        json_object_set_new(res, "error",
                            json_pack("{s:s,s:s}", "code", "cancelled", "message",
                                      "cancelled by a cancel request (dgemma-client cancel), "
                                      "not by the daemon stopping")) != 0)
        bad = 1;
    /* (a result short of a key is not written: the next run retries) */
    if (bad) {
        client_errorf("out of memory writing the result of input line %d", it->line);
        rc = -1;
    } else {
        rc = write_result(b, res);
    }
    if (rc == 0 && json_object_get(res, "error"))
        b->failed++;
    json_decref(res);
    json_decref(done);
    return rc;
}

static int error_result(struct batch *b, struct item *it, const char *code, const char *msg)
{
    json_t *res = json_object();
    int rc;
    if (!res || json_object_set(res, "id", json_object_get(it->obj, "id")) != 0 ||
        json_object_set_new(res, "error", json_pack("{s:s,s:s}", "code", code ? code : "error",
                                                    "message", msg ? msg : "")) != 0) {
        client_errorf("out of memory writing the result of input line %d", it->line);
        rc = -1;
    } else {
        rc = write_result(b, res);
    }
    json_decref(res);
    b->failed++;
    return rc;
}

/* Item i submitted: it waits for its answer behind those before it.
 * (The queue holds at most the `parallel` requests in flight: every
 * answer, and a done, takes its item off; were it full, the oldest would
 * make room, to be answered by its tag.) */
static void unanswered_push(struct batch *b, size_t i)
{
    if (b->ua_n == b->ua_cap) {
        b->ua_head = (b->ua_head + 1) % b->ua_cap;
        b->ua_n--;
    }
    b->unanswered[(b->ua_head + b->ua_n++) % b->ua_cap] = i;
}

/* Item i was answered (accepted or refused): off the queue, wherever it is
 * (the head, as the daemon answers in order). */
static void unanswered_drop(struct batch *b, size_t i)
{
    for (size_t k = 0; k < b->ua_n; k++) {
        if (b->unanswered[(b->ua_head + k) % b->ua_cap] != i)
            continue;
        for (; k > 0; k--) /* (the ones before it move up one) */
            b->unanswered[(b->ua_head + k) % b->ua_cap] =
                b->unanswered[(b->ua_head + k - 1) % b->ua_cap];
        b->ua_head = (b->ua_head + 1) % b->ua_cap;
        b->ua_n--;
        return;
    }
}

/* The item an event is about: by its tag, or, for an error with neither
 * tag nor request id about a request line the daemon could not read (too
 * long), the oldest unanswered one.  NULL when none (the refusals of a
 * whole connection at accept, busy, forbidden or shutting_down, are no
 * request's: the daemon then closes it). */
static struct item *item_of_event(struct batch *b, const dgemma_event_t *ev)
{
    if (ev->tag)
        return item_of(b, ev->tag);
    if (ev->kind == DGEMMA_EV_ERROR && ev->id == 0 && b->ua_n > 0 && ev->code &&
        strcmp(ev->code, "busy") && strcmp(ev->code, "forbidden") &&
        strcmp(ev->code, "shutting_down") && b->unanswered[b->ua_head] != QUERY_MARK)
        return &b->items[b->unanswered[b->ua_head]];
    return NULL;
}

/* The cancelled items the status query just answered covers (asked after
 * their dones): by a cancel, with shutting_down false, each gets its
 * result (an error "cancelled"); by the daemon stopping (shutting_down
 * true), none, and the next run retries them.  An error answer (the
 * daemon out of memory) says neither: the items wait for a query asked
 * again QUERY_PAUSE later; after QUERY_TRIES such answers in a row they
 * are left to the next run, said so, and nothing more is sent.  Returns
 * 0, or -1 when a result cannot be written. */
static int settle_cancelled(struct batch *b, const dgemma_event_t *ev)
{
    json_t *st = ev->kind == DGEMMA_EV_STATUS
                     ? dg_json_loadb(ev->json, strlen(ev->json), 0, "status", NULL)
                     : NULL;
    const int by_cancel = json_is_false(json_object_get(st, "shutting_down"));
    /* (an error answer, or a status this client had no memory to read:
     * neither says why) */
    const int unsettled = !st;
    size_t n_left = 0;
    int rc = 0;

    json_decref(st);
    b->queries_answered++;
    unanswered_drop(b, QUERY_MARK);
    b->query_errors = unsettled ? b->query_errors + 1 : 0;
    if (unsettled && b->query_errors < QUERY_TRIES) {
        for (size_t i = 0; i < b->n_items; i++)
            if (b->items[i].state == IT_CANCELLED && b->items[i].query <= b->queries_answered)
                b->items[i].query = b->queries_sent + 1;
        b->want_query = 1;
        b->query_at = now_s() + QUERY_PAUSE;
        return 0;
    }
    if (!by_cancel)
        b->stopping = 1; /* (it stops: what is not sent yet is the next run's) */
    for (size_t i = 0; i < b->n_items; i++) {
        struct item *it = &b->items[i];
        if (it->state != IT_CANCELLED || it->query > b->queries_answered)
            continue;
        it->state = IT_DONE;
        if (by_cancel) {
            b->done++;
            if (rc == 0)
                rc = finish(b, it, it->done_json, 1);
        } else {
            b->unfinished++;
            n_left++;
        }
        free(it->done_json);
        it->done_json = NULL;
    }
    if (unsettled && n_left) {
        b->unconfirmed += n_left;
        client_errorf("%zu requests ended cancelled, and the daemon answered the status query "
                      "that would say why with an error %d times (%s: %s): left to the next run",
                      n_left, QUERY_TRIES, ev->code ? ev->code : "?",
                      ev->message ? ev->message : "");
    }
    return rc;
}

/* Ask the daemon whether it is shutting down, once the cancelled items
 * waiting for it have no query in flight (the status event answers: a
 * query sent after an item's done settles it, as the daemon's
 * shutting_down is set before it cancels anything).  Returns 0, or
 * libdgemma's error when the query could not be sent. */
static int ask_status(struct batch *b, dgemma_t *c)
{
    int e;
    if (!b->want_query || b->queries_sent != b->queries_answered || now_s() < b->query_at)
        return 0;
    if ((e = dgemma_status(c)) < 0)
        return e;
    b->queries_sent++;
    b->want_query = 0;
    unanswered_push(b, QUERY_MARK);
    return 0;
}

/* Whether ev, the first event of a connection, is the daemon refusing the
 * connection itself at accept (busy, forbidden, shutting_down: a line
 * without tag or request id, then the end): it read none of the requests. */
static int refused_at_accept(const dgemma_event_t *ev)
{
    return ev->kind == DGEMMA_EV_ERROR && !ev->tag && ev->id == 0 && ev->code &&
           (!strcmp(ev->code, "busy") || !strcmp(ev->code, "forbidden") ||
            !strcmp(ev->code, "shutting_down"));
}

/* After a connection refused at accept: the requests sent on it go back to
 * be sent again (nothing else can be under way: nothing was heard on it). */
static void requeue_refused(struct batch *b)
{
    for (size_t i = 0; i < b->n_items; i++)
        if (b->items[i].state == IT_RUNNING) {
            b->items[i].state = IT_TODO;
            b->items[i].retry_at = 0;
        }
    b->running = 0;
    b->ua_head = b->ua_n = 0;
    b->queries_sent = b->queries_answered;
}

/* The daemon refused a setting that came from the flags (setting, in its
 * words msg): say so, naming the flag.  Nothing is written for it: every
 * line that leaves the setting to the flags would get the same refusal,
 * so the batch stops rather than spend the input on a typo. */
static void flag_refused(const char *setting, const char *msg)
{
    /* (the flags are the settings' names with '-' for '_', but --stop-id) */
    const char *name = strcmp(setting, "stop_token_ids") ? setting : "stop_id";
    char flag[64];
    size_t n = 0;
    for (; n < sizeof flag - 1 && name[n]; n++)
        flag[n] = name[n] == '_' ? '-' : name[n];
    flag[n] = '\0';
    client_errorf("batch: the daemon refuses the setting %s given on the command line "
                  "(--%s or --settings): %s; no result was written for it: correct it and run "
                  "again", setting, flag, msg);
}

static int run(struct batch *b, const struct client_opts *o, int parallel)
{
    dgemma_t *c;
    size_t next = 0;
    const double wait_end = now_s() + o->wait_s;
    int heard = 0, code; /* heard: an event came on this connection */

    if (b->n_items == 0)
        return EXIT_DONE;
    b->ua_cap = (size_t)parallel + 1;
    if (!(b->unanswered = malloc(b->ua_cap * sizeof *b->unanswered))) {
        client_errorf("out of memory");
        return EXIT_FAILED;
    }
    if (!(c = client_connect(o, &code)))
        return code;
    for (;;) {
        dgemma_event_t ev;
        int e;
        /* keep `parallel` requests in flight */
        for (size_t i = next; !b->stopping && i < b->n_items && b->running < (size_t)parallel;
             i++) {
            struct item *it = &b->items[i];
            dgemma_request_t *r;
            if (it->state != IT_TODO || it->retry_at > now_s())
                continue;
            {
                const char *why;
                if (!(r = build(o, it, i, &why))) {
                    if (!why) {
                        client_errorf("out of memory building line %d", it->line);
                        dgemma_close(c);
                        return EXIT_FAILED;
                    }
                    it->state = IT_DONE;
                    b->done++;
                    if (error_result(b, it, "bad_request", why) < 0) {
                        dgemma_close(c);
                        return EXIT_FAILED;
                    }
                    continue;
                }
            }
            if ((e = dgemma_submit(c, r)) < 0) {
                client_errorf("%s", dgemma_errmsg(c));
                dgemma_request_free(r);
                dgemma_close(c);
                return client_exit_for(e);
            }
            dgemma_request_free(r);
            it->state = IT_RUNNING;
            b->running++;
            unanswered_push(b, i);
        }
        while (next < b->n_items && b->items[next].state == IT_DONE)
            next++;
        if (next == b->n_items)
            break;
        if (b->stopping && b->running == 0) {
            /* what was not sent is for the next run, as what was refused */
            for (size_t i = next; i < b->n_items; i++)
                if (b->items[i].state == IT_TODO || b->items[i].state == IT_CANCELLED) {
                    b->items[i].state = IT_DONE;
                    b->unfinished++;
                }
            break;
        }
        if ((e = ask_status(b, c)) < 0) {
            client_errorf("%s (%zu requests unfinished; run again to resume)", dgemma_errmsg(c),
                          b->n_items - next);
            dgemma_close(c);
            return client_exit_for(e);
        }
        show_progress(b, 0);
        e = dgemma_next_event(c, &ev, 500);
        if (e == DGEMMA_E_AGAIN)
            continue;
        if (e < 0) {
            show_progress(b, 1);
            client_errorf("%s (%zu requests unfinished; run again to resume)", dgemma_errmsg(c),
                          b->n_items - next);
            dgemma_close(c);
            return client_exit_for(e);
        }
        if (!heard && refused_at_accept(&ev)) {
            /* busy: connect again in a second while --wait lasts */
            struct client_opts again = *o;
            const int busy = !strcmp(ev.code, "busy");
            if (!busy || now_s() + 1.0 > wait_end) {
                show_progress(b, 1);
                client_errorf("the daemon refused the connection (%s: %s) and took none of its "
                              "requests; %zu requests unfinished: run again to resume%s",
                              ev.code, ev.message ? ev.message : "", b->n_items - next,
                              !busy           ? ""
                              : o->wait_s > 0 ? " (refused until --wait ran out)"
                                              : " (or give --wait SECONDS to retry meanwhile)");
                dgemma_close(c);
                return EXIT_UNREACHABLE;
            }
            dgemma_close(c);
            requeue_refused(b);
            usleep(1000000);
            again.wait_s = wait_end > now_s() ? wait_end - now_s() : 0;
            if (!(c = client_connect(&again, &code)))
                return code;
            continue;
        }
        heard = 1;
        if (ev.kind == DGEMMA_EV_STATUS ||
            (ev.kind == DGEMMA_EV_ERROR && !ev.tag && ev.id == 0 && b->ua_n > 0 &&
             b->unanswered[b->ua_head] == QUERY_MARK)) {
            /* the status query's answer (an error without a tag, in its
             * turn, is its too) */
            if (b->queries_sent > b->queries_answered && settle_cancelled(b, &ev) < 0) {
                dgemma_close(c);
                return EXIT_FAILED;
            }
            continue;
        }
        {
            struct item *it = item_of_event(b, &ev);
            const char *flag;
            if (!it || it->state != IT_RUNNING)
                continue;
            if (ev.kind == DGEMMA_EV_ACCEPTED || ev.kind == DGEMMA_EV_ERROR ||
                ev.kind == DGEMMA_EV_DONE) /* (a done too, were its accepted line lost) */
                unanswered_drop(b, (size_t)(it - b->items));
            if (ev.kind == DGEMMA_EV_ACCEPTED) {
                it->id = ev.id;
                it->seed = ev.seed;
            } else if (ev.kind == DGEMMA_EV_ERROR && ev.code && !strcmp(ev.code, "busy")) {
                /* the daemon is full: try again in a second */
                it->state = IT_TODO;
                it->retry_at = now_s() + 1.0;
                b->running--;
            } else if (ev.kind == DGEMMA_EV_ERROR && ev.code &&
                       !strcmp(ev.code, "shutting_down")) {
                /* refused by a daemon on its way out: no result, the next
                 * run retries it, and nothing more is sent */
                it->state = IT_DONE;
                b->running--;
                b->unfinished++;
                b->stopping = 1;
            } else if (ev.kind == DGEMMA_EV_ERROR &&
                       (flag = batch_flag_refused(it->obj, o->settings, ev.code, ev.message))) {
                /* a flag's setting, not the line's: stop, writing nothing
                 * for it (the requests in flight are cancelled as the
                 * connection closes, and retried by the next run) */
                show_progress(b, 1);
                flag_refused(flag, ev.message);
                dgemma_close(c);
                return EXIT_USAGE;
            } else if (ev.kind == DGEMMA_EV_ERROR || ev.kind == DGEMMA_EV_DONE) {
                int rc;
                b->running--;
                if (ev.kind == DGEMMA_EV_DONE && ev.finish_reason &&
                    !strcmp(ev.finish_reason, "cancelled")) {
                    /* by a cancel (a result) or by the daemon stopping (none:
                     * the next run retries it)?  The done does not say; a
                     * status asked now does (settle_cancelled) */
                    if (!(it->done_json = strdup(ev.json))) {
                        client_errorf("out of memory");
                        dgemma_close(c);
                        return EXIT_FAILED;
                    }
                    it->state = IT_CANCELLED;
                    it->query = b->queries_sent + 1;
                    b->want_query = 1;
                    continue;
                }
                rc = ev.kind == DGEMMA_EV_ERROR ? error_result(b, it, ev.code, ev.message)
                                                : finish(b, it, ev.json, 0);
                it->state = IT_DONE;
                b->done++;
                if (rc < 0) {
                    dgemma_close(c);
                    return EXIT_FAILED;
                }
            }
        }
    }
    show_progress(b, 1);
    dgemma_close(c);
    return EXIT_DONE;
}

int cmd_batch(int argc, char **argv)
{
    struct client_opts o = {0};
    const char *input = NULL, *output = NULL;
    int parallel = 4, rc;
    struct batch b;
    struct stat in_st, out_st;
    FILE *in;

    memset(&b, 0, sizeof b);
    b.out_fd = -1;
    for (int i = 1; i < argc; i++) {
        int took, code;
        if ((took = client_command_option(&o, usage, argc, argv, &i, &code)) < 0)
            return code;
        if (took)
            continue;
        if ((!strcmp(argv[i], "--input") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
            if (argv[i][2] == 'i')
                input = argv[++i];
            else
                output = argv[++i];
        } else if (!strcmp(argv[i], "--parallel") && i + 1 < argc) {
            char *end;
            long p = strtol(argv[++i], &end, 10);
            if (*end || p < 1 || p > 1024) {
                client_errorf("--parallel: 1 .. 1024");
                json_decref(o.settings);
                return EXIT_USAGE;
            }
            parallel = (int)p;
        } else {
            client_errorf("batch: unexpected '%s'", argv[i]);
            fputs(usage, stderr);
            json_decref(o.settings);
            return EXIT_USAGE;
        }
    }
    if (o.json) {
        /* (taken by the options every command shares; the results are JSON
         * lines whatever is asked, so it would do nothing) */
        client_errorf("batch: --json is for generate and status: batch always writes JSON "
                      "lines; leave it out");
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    if (!input || !output) {
        client_errorf("batch: --input and --output are required");
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    b.progress = isatty(2); /* (before the opens: it can set errno) */
    in = strcmp(input, "-") ? fopen(input, "r") : stdin;
    if (!in || fstat(fileno(in), &in_st) != 0) {
        client_errorf("%s: %s", input, strerror(errno));
        if (in && in != stdin)
            fclose(in);
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    b.out_fd = open(output, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    b.seen = json_object();
    rc = EXIT_USAGE;
    if (b.out_fd < 0 || fstat(b.out_fd, &out_st) != 0) {
        client_errorf("%s: %s", output, strerror(errno));
    } else if (S_ISDIR(in_st.st_mode)) {
        client_errorf("%s: is a directory", input);
    } else if (!S_ISREG(out_st.st_mode)) {
        /* (a pipe or a device would take the results and keep none to
         * resume from) */
        client_errorf("%s: not a regular file", output);
    } else if (in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino) {
        client_errorf("batch: --input and --output are the same file (%s)", output);
    } else if (flock(b.out_fd, LOCK_EX | LOCK_NB) != 0) {
        client_errorf("%s: another batch is writing it", output);
    } else if (!b.seen) {
        client_errorf("out of memory");
        rc = EXIT_FAILED;
    } else if (load_output(&b, output) < 0 ||
               read_input(&b, in, strcmp(input, "-") ? input : "standard input") < 0) {
        rc = EXIT_FAILED;
    } else {
        rc = run(&b, &o, parallel);
        if (rc == EXIT_DONE && b.unfinished > b.unconfirmed)
            client_errorf("%zu requests were cancelled or refused by the daemon shutting down; "
                          "run again to finish them", b.unfinished - b.unconfirmed);
        if (rc == EXIT_DONE && b.unfinished)
            rc = EXIT_UNREACHABLE;
        if (rc == EXIT_DONE && (b.failed || b.failed_before))
            rc = EXIT_FAILED;
        if (!b.progress)
            fprintf(stderr, "dgemma-client batch: %zu/%zu done, %zu failed\n", b.done, b.total,
                    b.failed);
    }
    if (in != stdin)
        fclose(in);
    if (b.out_fd >= 0)
        close(b.out_fd);
    for (size_t i = 0; i < b.n_items; i++) {
        json_decref(b.items[i].obj);
        free(b.items[i].key);
        free(b.items[i].done_json);
    }
    free(b.items);
    free(b.unanswered);
    json_decref(b.seen);
    json_decref(o.settings);
    return rc;
}
