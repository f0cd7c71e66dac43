/*
 * Description: the real dgemmad (from $BUILD/bin) serving at tensor
 * parallelism on the CPU backend, on the random test model (4 query
 * heads over 2 KV heads in the sliding layers and 1 in the full layer, 8
 * experts: at tp 4 every KV head is held by two or four ranks, as the 26B
 * release's full layers' 2 are by two).  At tp 1, 2 and 4,
 * experts across ranks and along their width, NB requests sent at once
 * from NB clients (streamed and not, several canvases each, top-k,
 * top-p, different canvas lengths and seeds) are run batched and give
 * the same events, canvas by canvas, as at tp 1: the CPU ranks sum every
 * partial result in double and round once (t-tp), so how the work is
 * split does not reach a token.  Each run's status names its tp and
 * split, and its metrics database holds one runs row and NB requests
 * rows with that tp, the steps and tokens the clients saw, and their
 * canvases' rows.  DG_TEST_QUICK=1 (the sanitizer runs; `make test-tsan`
 * runs the daemon under ThreadSanitizer here): tp 1, and tp 4 with the
 * experts along their width.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"
#include "tests/sql-peek.h"

#define NB 5 /* requests at once: more than max_batch (4), so one waits */

/* A run's settings: tp ranks, experts split along their width or not. */
struct tp_run {
    int tp, width;
};

/* What each request's client saw: its events in order, less what a run
 * cannot repeat (times, speeds, the daemon's request id). */
static json_t *seen_at_one[NB];

/* The daemon of the case running (killed by main if a check left it). */
static pid_t live;

/* A member of e as a string ("" when it is not one). */
static const char *ev_str(const json_t *e, const char *key)
{
    const char *v = json_string_value(json_object_get(e, key));
    return v ? v : "";
}

/* Request k: a prompt and seed of its own; canvases of 16 or 32 ids and
 * up to 40-56 tokens (two or three canvases, so commits and the KV cache
 * are in it); top-k on one, top-p on another; one not streamed. */
static const char *request(int k)
{
    static char buf[NB][512];
    snprintf(buf[k], sizeof buf[k],
             "{\"v\":1,\"op\":\"generate\",\"prompt\":\"ranks %d, a prompt of its own\","
             "\"max_tokens\":%d,\"seed\":%d,\"max_denoising_steps\":6,\"canvas_length\":%d,"
             "\"tag\":\"r%d\"%s}\n",
             k, 40 + 8 * k, 300 + k, k % 2 ? 16 : 32, k,
             k == 1   ? ",\"top_k\":12"
             : k == 2 ? ",\"top_p\":0.8,\"entropy_bound\":1.0"
             : k == 4 ? ",\"stream\":false"
                      : "");
    return buf[k];
}

/* The event e as the runs compare it: times, speeds and the request id
 * taken out (mean_entropy stays: the ranks' statistics fold in rank
 * order in double, and it is compared exactly too). */
static json_t *comparable(json_t *e)
{
    static const char *const drop[] = {"id", "ms", "tokens_per_s", "ms_first_canvas", "ms_total"};
    json_t *c = json_deep_copy(e);
    for (size_t i = 0; c && i < sizeof drop / sizeof *drop; i++)
        json_object_del(c, drop[i]);
    return c;
}

/* Read c's events up to its done (or error) into *out (an array of
 * comparable events); the done's decoder steps, completion tokens and
 * canvases added to *steps, *tokens, *canvases.  0, or -1. */
static int collect(struct fixture_cl *c, json_t **out, long long *steps, long long *tokens,
                   long long *canvases)
{
    *out = json_array();
    for (;;) {
        int eof;
        json_t *e = fixture_cl_event(c, &eof);
        const char *k;
        if (!e)
            return -1;
        k = fixture_ev_kind(e);
        json_array_append_new(*out, comparable(e));
        if (!strcmp(k, "done")) {
            *steps += fixture_ev_int(e, "decoder_steps");
            *tokens += json_integer_value(
                json_object_get(json_object_get(e, "usage"), "completion_tokens"));
            *canvases += fixture_ev_int(e, "canvases");
            json_decref(e);
            return 0;
        }
        if (!strcmp(k, "error")) {
            json_decref(e);
            return -1;
        }
        json_decref(e);
    }
}

/* One daemon at r: the NB requests at once, their events compared with
 * tp 1's (kept when r is tp 1), its status and metrics rows checked. */
static int serve_at(struct tp_run r)
{
    char name[64], o_db[700], o_tp[32], o_ex[32];
    const char *sock, *log, *db;
    const char *opts[] = {"max_batch=4",      "tick=0.02",    "shutdown_grace=5",
                          "pin_workers=false", "backend=cpu", "metrics_flush=0.02",
                          o_db,                o_tp,          o_ex,
                          NULL};
    struct fixture_cl *c[NB] = {0};
    json_t *got[NB] = {0}, *s;
    long long steps = 0, tokens = 0, canvases = 0, e0, e1;
    int st, rc = 0;
    pid_t pid;

    snprintf(name, sizeof name, "tp%d-%s", r.tp, r.width ? "width" : "across");
    sock = test_path(name);
    log = test_pathf("%s.log", name);
    db = test_pathf("%s.db", name);
    snprintf(o_db, sizeof o_db, "metrics=%s", db);
    snprintf(o_tp, sizeof o_tp, "tp=%d", r.tp);
    snprintf(o_ex, sizeof o_ex, "experts=%s", r.width ? "width" : "across");
    if (live > 0) { /* (an earlier case's, left by a failed check) */
        kill(live, SIGKILL);
        waitpid(live, NULL, 0);
    }
    live = pid = fixture_spawn(sock, log, opts);
    CHECK(pid > 0);
    CHECKF(fixture_wait_ready(pid, sock) == 0, "%s: not started; its log: %s", name, log);
    s = fixture_status(sock);
    e0 = s ? fixture_ev_int(s, "engine_steps") : -1;
    CHECKF(s && fixture_ev_int(s, "tp") == r.tp &&
               !strcmp(ev_str(s, "experts"), r.width ? "width" : "across") &&
               !strcmp(ev_str(s, "backend"), "cpu"),
           "%s: status says tp %lld", name, s ? fixture_ev_int(s, "tp") : -1);
    json_decref(s);
    for (int k = 0; k < NB && rc == 0; k++)
        if (!(c[k] = fixture_cl_open(sock)))
            rc = test_fail(__FILE__, __LINE__, "%s: client %d cannot connect", name, k);
    for (int k = 0; k < NB && rc == 0; k++)
        if (fixture_cl_send(c[k], request(k)) != 0)
            rc = test_fail(__FILE__, __LINE__, "%s: request %d not sent", name, k);
    for (int k = 0; k < NB && rc == 0; k++)
        if (collect(c[k], &got[k], &steps, &tokens, &canvases) != 0)
            rc = test_fail(__FILE__, __LINE__, "%s: request %d: no done event", name, k);
    for (int k = 0; k < NB; k++)
        fixture_cl_close(c[k]);
    s = fixture_status(sock);
    e1 = s ? fixture_ev_int(s, "engine_steps") : -1;
    json_decref(s);
    printf("# %s: %d requests, %lld decoder steps in %lld engine steps, %lld tokens, %lld "
           "canvases\n",
           name, NB, steps, e1 - e0, tokens, canvases);
    if (rc == 0 && !(e0 >= 0 && e1 - e0 < steps))
        rc = test_fail(__FILE__, __LINE__, "%s: not batched: %lld engine steps for %lld", name,
                       e1 - e0, steps);
    for (int k = 0; k < NB && rc == 0; k++) {
        if (r.tp == 1 && !r.width) {
            seen_at_one[k] = json_incref(got[k]);
        } else if (!seen_at_one[k] || !json_equal(got[k], seen_at_one[k])) {
            char *a = json_dumps(got[k], JSON_COMPACT), *b = json_dumps(seen_at_one[k], JSON_COMPACT);
            printf("# %s, request %d:\n#   %s\n# tp 1:\n#   %s\n", name, k, a ? a : "?",
                   b ? b : "(none)");
            free(a);
            free(b);
            rc = test_fail(__FILE__, __LINE__, "%s: request %d's events differ from tp 1's", name,
                           k);
        }
    }
    for (int k = 0; k < NB; k++)
        json_decref(got[k]);
    if (rc != 0) {
        printf("# daemon log: %s\n", log);
        return rc;
    }
    /* the metrics: written once the daemon stops (its last flush) */
    CHECK(kill(pid, SIGTERM) == 0);
    CHECK(fixture_wait_exit(pid, &st) == 0);
    live = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %d", name, st);
    CHECKF(test_sql_int(db, "SELECT count(*) FROM runs WHERE tp = %d AND backend = 'cpu'", r.tp) ==
               1,
           "%s: runs rows", name);
    CHECKF(test_sql_int(db, "SELECT count(*) FROM requests WHERE tp = %d AND backend = 'cpu'",
                        r.tp) == NB,
           "%s: %lld of %lld request rows say tp %d, backend cpu", name,
           (long long)test_sql_int(db, "SELECT count(*) FROM requests WHERE tp = %d", r.tp),
           (long long)test_sql_int(db, "SELECT count(*) FROM requests"), r.tp);
    CHECKF(test_sql_int(db, "SELECT sum(steps) FROM requests") == steps &&
               test_sql_int(db, "SELECT sum(completion_tokens) FROM requests") == tokens &&
               test_sql_int(db, "SELECT count(*) FROM canvases") == canvases &&
               test_sql_int(db, "SELECT sum(steps) FROM canvases") == steps,
           "%s: the rows' steps %lld, tokens %lld, canvases %lld; the clients saw %lld, %lld, %lld",
           name, (long long)test_sql_int(db, "SELECT sum(steps) FROM requests"),
           (long long)test_sql_int(db, "SELECT sum(completion_tokens) FROM requests"),
           (long long)test_sql_int(db, "SELECT count(*) FROM canvases"), steps, tokens, canvases);
    return 0;
}

static int tp1(void) { return serve_at((struct tp_run){1, 0}); }
static int tp2_across(void) { return serve_at((struct tp_run){2, 0}); }
static int tp4_across(void) { return serve_at((struct tp_run){4, 0}); }
static int tp4_width(void) { return serve_at((struct tp_run){4, 1}); }

int main(void)
{
    /* DG_TEST_QUICK=1 (the sanitizer runs): tp 1 and 4 only */
    const char *q = getenv("DG_TEST_QUICK");
    const int quick = q && *q && strcmp(q, "0");
    TEST_CASE(tp1);
    if (!quick)
        TEST_CASE(tp2_across);
    if (!quick)
        TEST_CASE(tp4_across);
    TEST_CASE(tp4_width);
    for (int k = 0; k < NB; k++)
        json_decref(seen_at_one[k]);
    return fixture_finish(live, NULL);
}
