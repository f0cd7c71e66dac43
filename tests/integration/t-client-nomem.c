/*
 * Description: dgemma-client short of memory, against the real dgemmad.  A
 * client linked with the fault injector around its allocation calls
 * ($BUILD/tests/fault/dgemma-client: failmalloc.c built with DG_FAULT_WRAP,
 * so the calls of the client, libdgemma, jansson and SQLite count) runs
 * status, generate (text; a chat turn with a system message, thinking
 * and a tag; token ids), chat through a pipe (two turns), batch, cancel
 * (of a request of the test's own, running) and stats --json (over the
 * metrics the daemon wrote for those), and libdgemma's ring runs a round
 * of jobs (tests/fault/ring-client, wrapped the same way), first with no
 * failure (counting its calls), then once for each call k with call k
 * alone failing (DG_FAULT_MALLOC_NTH).  Each run must end as the clean
 * run did (exit 0 and the same output: the text, the reply lines, the
 * status's keys, the summary), or with exit 1 and "out of memory" on
 * standard error: never exit 0 with less or other output, never a
 * misreport (a usage error, a lost connection, "not valid UTF-8", a
 * request the daemon reads as malformed), never silence; a status run
 * that fails writes no line of its table.  Each batch run is followed by the real
 * client run again on the same output, with nothing failing: the output
 * must then hold every input line's result exactly once, as the clean
 * run's (a resume loses and repeats nothing, and no line written under
 * the failure is torn or short of a key).  A cancel that exits 0 must have
 * ended its request cancelled.  chat_libc and batch_libc do
 * chat and batch again with the real client and the shim preloaded
 * (failmalloc.so), so that libc's own allocations count too: getline's
 * for the lines of standard input (batch's first 100 calls, where its
 * input is read).  stats fails every second call (most are SQLite's
 * own).  The sanitizer runs fail every call too; there a run whose
 * standard error holds a sanitizer's report (a leak, a bad access) fails
 * the case, and nothing can be preloaded: chat_libc and batch_libc are
 * skipped.  There the sweeps fail every third call of theirs, not each:
 * the leak check at a sanitized process's exit costs about 40 ms of CPU,
 * and the sweeps made some 3,300 runs, nearly half the sanitizer
 * suite's time.  Which third turns with the day (days since 1970, modulo
 * 3; DG_NOMEM_OFFSET=0, 1 or 2 chooses one, and each sweep's line names
 * its calls), so three days' runs fail every call under the sanitizers
 * too; the plain build fails each every run.  Last, the daemon that
 * served them all must stop on SIGTERM and exit 0 (its leak check under
 * the sanitizers).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

static char sock[600], log_path[600], wrapped[600], ring_client[600], shim[PATH_MAX], trigger[600], db_path[600],
    o_db[700];
static pid_t daemon_pid;

/* A call number past any run's last: nothing fails, the calls are counted. */
#define NO_FAILURE 1000000000LL

/* Under the sanitizers: every SAN_STRIDE-th call of a sweep fails, from
 * san_offset (see the top). */
#define SAN_STRIDE 3
static int san_offset;


/* Read path into buf (NUL-terminated, cut at cap - 1); its length, -1 if
 * it cannot be opened. */
static long slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n;
    if (!f) {
        buf[0] = '\0';
        return -1;
    }
    n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return (long)n;
}

/* Which allocation calls count. */
enum calls {
    WRAPPED, /* the wrapped client's: its own, libdgemma's and the static libraries' */
    PRELOAD, /* the real client with the shim preloaded: libc's own too (getline,
              * stdio); not under ASan, which owns malloc */
    RING,    /* not dgemma-client: tests/fault/ring-client, wrapped as it is */
};

/* Start bin (with nth >= 0, with allocation call nth failing, the calls
 * counted into stats; with preload, failmalloc.so preloaded) with args
 * (NULL-ended, after the program name; "@OUT@" stands for out_file),
 * standard input from in_path, output to out_path and err_path.  Returns
 * its pid, -1 if it could not start. */
static pid_t spawn(const char *bin, long long nth, int preload, const char *const *args,
                   const char *out_file, const char *in_path, const char *out_path,
                   const char *err_path, const char *stats)
{
    const char *argv[32];
    int n = 0;
    pid_t pid;
    argv[n++] = bin;
    for (const char *const *a = args; *a && n < 31; a++)
        argv[n++] = strcmp(*a, "@OUT@") ? *a : out_file;
    argv[n] = NULL;
    if ((pid = fork()) != 0)
        return pid;
    {
        char v[32];
        const int in = open(in_path, O_RDONLY),
                  out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644),
                  err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 ||
            dup2(err, 2) < 0)
            _exit(126);
        if (nth >= 0) {
            snprintf(v, sizeof v, "%lld", nth);
            setenv("DG_FAULT_MALLOC_TRIGGER", trigger, 1);
            setenv("DG_FAULT_MALLOC_NTH", v, 1);
            setenv("DG_FAULT_STATS", stats, 1);
        }
        if (preload)
            setenv("LD_PRELOAD", shim, 1);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
}

/* pid's exit status, or -1 if it did not exit normally. */
static int reap(pid_t pid)
{
    int st;
    if (pid < 0 || fixture_wait_exit(pid, &st) < 0 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

/* Whether a run's standard error holds a sanitizer's report.  (A leak
 * found at exit leaves ASan's exit status 1 unless ASAN_OPTIONS sets
 * another, and 1 is the status of a run that failed for memory anyway.) */
static int sanitizer_said(const char *err)
{
    return strstr(err, "Sanitizer") != NULL;
}

/* What a command's output is compared by. */
enum compare {
    SAME_BYTES,  /* generate's text, chat's reply lines */
    SAME_KEYS,   /* status: the first word of each line (the values are counters) */
    BATCH_OUT,   /* batch: the results (its output file), whatever their order */
};

/* The first word of each line of s, joined by spaces, into out. */
static void first_words(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    while (*s && o + 1 < cap) {
        size_t n = strcspn(s, " \n");
        if (o + n + 2 >= cap)
            break;
        memcpy(out + o, s, n);
        o += n;
        out[o++] = ' ';
        s += strcspn(s, "\n");
        if (*s)
            s++;
    }
    out[o] = '\0';
}

/* The batch output file's results, in a canonical form: each line as
 * "id|finish_reason|text|error code" (the timings left out), sorted,
 * joined by newlines; a line that is not a JSON object shows as BAD. */
static int line_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void batch_results(const char *path, char *out, size_t cap)
{
    static char buf[1 << 16];
    char *lines[64];
    size_t n = 0, o = 0;
    char *p = buf;
    out[0] = '\0';
    if (slurp(path, buf, sizeof buf) < 0)
        return;
    while (*p && n < 64) {
        char *nl = strchr(p, '\n');
        json_t *r;
        char *key = NULL, *id = NULL;
        if (nl)
            *nl = '\0';
        r = json_loads(p, JSON_ALLOW_NUL, NULL);
        if (json_is_object(r)) {
            json_t *idv = json_object_get(r, "id");
            id = idv ? json_dumps(idv, JSON_ENCODE_ANY)
                     : json_dumps(json_object_get(r, "line"), JSON_ENCODE_ANY);
            if (asprintf(&key, "%s|%s|%s|%s", id ? id : "(none)",
                         json_string_value(json_object_get(r, "finish_reason"))
                             ? json_string_value(json_object_get(r, "finish_reason"))
                             : "",
                         json_string_value(json_object_get(r, "text"))
                             ? json_string_value(json_object_get(r, "text"))
                             : "",
                         json_string_value(json_object_get(json_object_get(r, "error"), "code"))
                             ? json_string_value(
                                   json_object_get(json_object_get(r, "error"), "code"))
                             : "") < 0)
                key = NULL;
        }
        lines[n++] = key ? key : strdup("BAD");
        free(id);
        json_decref(r);
        if (!nl)
            break;
        p = nl + 1;
    }
    qsort(lines, n, sizeof lines[0], line_cmp);
    for (size_t i = 0; i < n; i++) {
        const size_t l = lines[i] ? strlen(lines[i]) : 0;
        if (lines[i] && o + l + 2 < cap) {
            memcpy(out + o, lines[i], l);
            o += l;
            out[o++] = '\n';
        }
        free(lines[i]);
    }
    out[o] = '\0';
}

/* What a run's output comes to, for the comparison: into out. */
static void outcome(enum compare how, const char *out_path, const char *batch_out, char *out,
                    size_t cap)
{
    static char buf[1 << 16];
    if (how == BATCH_OUT) {
        batch_results(batch_out, out, cap);
        return;
    }
    slurp(out_path, buf, sizeof buf);
    if (how == SAME_KEYS)
        first_words(buf, out, cap);
    else
        snprintf(out, cap, "%s", buf);
}

/* The calls the stats file counted ("... malloc_calls C"), -1 if none. */
static long long calls_counted(const char *stats)
{
    char buf[256];
    const char *p;
    if (slurp(stats, buf, sizeof buf) < 0 || !(p = strstr(buf, "malloc_calls ")))
        return -1;
    return atoll(p + 13);
}

/* The files of one of the runs that go on side by side. */
struct slot {
    const char *in, *out, *err, *stats, *batch_out;
    long long k;
    pid_t pid;
};

/* One command, every allocation call of it failing in turn (see the top),
 * WORKERS runs at a time: of its first first_n calls (0: all), every
 * step-th (under the sanitizers, every SAN_STRIDE * step-th, from
 * san_offset * step). */
#define WORKERS 4
static int sweep(const char *what, const char *const *args, const char *input, enum compare how,
                 enum calls calls_of, long long first_n, long step)
{
    const int pre = calls_of == PRELOAD;
    const long every = UNDER_ASAN ? SAN_STRIDE * step : step;
    const long long from = UNDER_ASAN ? (long long)san_offset * step : 0;
    long long upto;
    const char *bin = pre ? fixture_bin("dgemma-client") : calls_of == RING ? ring_client : wrapped;
    static char want[1 << 16], got[1 << 16], err[4096];
    struct slot w[WORKERS];
    long long calls;
    int n_ok = 0, n_nomem = 0, rc;
    const double t0 = fixture_now_ms();

    for (int i = 0; i < WORKERS; i++) {
        w[i].in = test_pathf("%s.in", what);
        w[i].out = test_pathf("%s.%d.out", what, i);
        w[i].err = test_pathf("%s.%d.err", what, i);
        w[i].stats = test_pathf("%s.%d.stats", what, i);
        w[i].batch_out = test_pathf("%s.%d.jsonl", what, i);
    }
    CHECK(fixture_write_file(w[0].in, input) == 0);
    unlink(w[0].batch_out);
    rc = reap(spawn(bin, NO_FAILURE, pre, args, w[0].batch_out, w[0].in, w[0].out, w[0].err,
                    w[0].stats));
    slurp(w[0].err, err, sizeof err);
    CHECKF(!sanitizer_said(err), "%s, nothing failing: %s", what, err);
    CHECKF(rc == 0 || (how == BATCH_OUT && rc == 1), "%s, nothing failing: exit %d: %s", what,
           rc, err);
    outcome(how, w[0].out, w[0].batch_out, want, sizeof want);
    CHECKF(want[0], "%s: no output", what);
    calls = calls_counted(w[0].stats);
    CHECKF(calls > 10, "%s: %lld allocation calls counted", what, calls);
    upto = first_n > 0 && first_n < calls ? first_n : calls;
    for (long long k0 = from; k0 < upto; k0 += WORKERS * every) {
        int n = 0;
        for (; n < WORKERS && k0 + n * every < upto; n++) {
            struct slot *s = &w[n];
            s->k = k0 + n * every;
            unlink(s->batch_out);
            s->pid = spawn(bin, s->k, pre, args, s->batch_out, s->in, s->out, s->err,
                           s->stats);
        }
        for (int i = 0; i < n; i++) {
            struct slot *s = &w[i];
            rc = reap(s->pid);
            slurp(s->err, err, sizeof err);
            CHECKF(!sanitizer_said(err), "%s, call %lld failing: %s", what, s->k, err);
            if (how == BATCH_OUT) {
                /* the batch's bad line makes exit 1 on success too:
                 * success is told by the output, here when the run said
                 * nothing, and after the resume (started here, one per
                 * slot, reaped below) */
                CHECKF(rc == 0 || rc == 1, "%s, call %lld failing: exit %d: %s", what, s->k, rc,
                       err);
                if (strstr(err, "out of memory")) {
                    n_nomem++;
                } else { /* (nothing said: the output must be whole already) */
                    outcome(how, s->out, s->batch_out, got, sizeof got);
                    CHECKF(!strcmp(got, want), "%s, call %lld failing: exit %d without a word, "
                           "with results\n%s\nwhere the clean run's are\n%s", what, s->k, rc,
                           got, want);
                    n_ok++;
                }
                s->pid = spawn(fixture_bin("dgemma-client"), -1, 0, args, s->batch_out, s->in,
                               s->out, s->err, NULL);
            } else if (rc == 0) {
                outcome(how, s->out, s->batch_out, got, sizeof got);
                CHECKF(!strcmp(got, want), "%s, call %lld failing: exit 0 with\n%s\nwhere the "
                       "clean run gave\n%s", what, s->k, got, want);
                n_ok++;
            } else {
                CHECKF(rc == 1 && strstr(err, "out of memory"),
                       "%s, call %lld failing: exit %d: %s", what, s->k, rc, err);
                /* (status's table comes whole or not at all) */
                CHECKF(how != SAME_KEYS || slurp(s->out, got, sizeof got) == 0,
                       "%s, call %lld failing: exit 1 after writing\n%s", what, s->k, got);
                n_nomem++;
            }
        }
        for (int i = 0; how == BATCH_OUT && i < n; i++) {
            struct slot *s = &w[i];
            rc = reap(s->pid);
            slurp(s->err, err, sizeof err);
            CHECKF(rc == 1 && !sanitizer_said(err),
                   "%s, call %lld failing, then resumed: exit %d: %s", what, s->k, rc,
                   err);
            outcome(how, s->out, s->batch_out, got, sizeof got);
            CHECKF(!strcmp(got, want), "%s, call %lld failing, then resumed: results\n%s\n"
                   "where the clean run's are\n%s", what, s->k, got, want);
        }
    }
    printf("# %s%s: %lld allocation calls; calls %lld, %lld, %lld, ... below %lld each failed "
           "alone in a run: %d runs as the clean one, %d said out of memory (exit 1); %.1f s\n",
           what, pre ? " (libc's calls too)" : "", calls, from, from + every, from + 2 * every,
           upto, n_ok, n_nomem, (fixture_now_ms() - t0) / 1e3);
    CHECKF(n_nomem > 0, "%s: no run said out of memory", what);
    return 0;
}

static int start(void)
{
    const char *b = getenv("BUILD");
    const char *o = getenv("DG_NOMEM_OFFSET");
    if (o && *o) {
        CHECKF(o[1] == '\0' && o[0] >= '0' && o[0] < '0' + SAN_STRIDE,
               "DG_NOMEM_OFFSET=%s: 0 to %d", o, SAN_STRIDE - 1);
        san_offset = o[0] - '0';
    } else {
        san_offset = (int)(time(NULL) / 86400 % SAN_STRIDE);
    }
    if (UNDER_ASAN)
        printf("# under the sanitizers: 1 call in %d of each sweep fails, from offset %d "
               "(DG_NOMEM_OFFSET=%d repeats it)\n", SAN_STRIDE, san_offset, san_offset);
    snprintf(wrapped, sizeof wrapped, "%s/tests/fault/dgemma-client", b && *b ? b : "build");
    CHECKF(access(wrapped, X_OK) == 0, "%s: not built", wrapped);
    snprintf(ring_client, sizeof ring_client, "%s/tests/fault/ring-client", b && *b ? b : "build");
    CHECKF(access(ring_client, X_OK) == 0, "%s: not built", ring_client);
    {
        char rel[600];
        snprintf(rel, sizeof rel, "%s/tests/fault/failmalloc.so", b && *b ? b : "build");
        if (!realpath(rel, shim))
            shim[0] = '\0'; /* (not built under ASan) */
    }
    snprintf(trigger, sizeof trigger, "%s", test_path("trigger"));
    CHECK(fixture_write_file(trigger, "1\n") == 0);
    snprintf(sock, sizeof sock, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    snprintf(db_path, sizeof db_path, "%s", test_path("metrics.sqlite"));
    snprintf(o_db, sizeof o_db, "metrics=%s", db_path);
    {
        const char *opts[] = {"max_batch=4",     "queue_max=64",       "pin_workers=false",
                              "shutdown_grace=1", "metrics_flush=0.02", o_db,
                              NULL};
        daemon_pid = fixture_spawn(sock, log_path, opts);
    }
    CHECKF(fixture_wait_ready(daemon_pid, sock) == 0, "no daemon; log %s", log_path);
    return 0;
}

static int status(void)
{
    const char *args[] = {"-s", sock, "status", NULL};
    return sweep("status", args, "", SAME_KEYS, WRAPPED, 0, 1);
}

static int generate(void)
{
    const char *args[] = {"-s", sock, "--quiet", "--max-tokens", "16", "--max-denoising-steps",
                          "1", "--seed", "4", "--stop", "zz", "hello", NULL};
    return sweep("generate", args, "", SAME_BYTES, WRAPPED, 0, 1);
}

/* generate's other forms: a chat turn with a system message, thinking
 * and a tag; token ids, not streamed */
static int generate_forms(void)
{
    const char *chat[] = {"-s", sock, "--quiet", "--chat", "--system", "be brief", "--thinking",
                          "--tag", "t1", "--max-tokens", "8", "--max-denoising-steps", "1",
                          "--seed", "5", "hello", NULL};
    const char *ids[] = {"-s", sock, "--quiet", "--ids", "5 6 7", "--no-stream", "--max-tokens",
                         "8", "--max-denoising-steps", "1", "--seed", "6", NULL};
    if (sweep("generate-chat", chat, "", SAME_BYTES, WRAPPED, 0, 1))
        return 1;
    return sweep("generate-ids", ids, "", SAME_BYTES, WRAPPED, 0, 1);
}

static int chat_with(enum calls calls_of)
{
    const char *args[] = {"-s", sock, "chat", "--max-tokens", "16", "--max-denoising-steps", "1",
                          "--seed", "4", NULL};
    return sweep("chat", args, "hello\nand again\n", SAME_BYTES, calls_of, 0, 1);
}

static int batch_with(enum calls calls_of, long long first_n)
{
    const char *args[] = {"-s", sock, "batch", "--input", "-", "--output", "@OUT@",
                          "--parallel", "2", "--max-denoising-steps", "1", NULL};
    static const char input[] =
        "{\"id\":1,\"prompt\":\"one\",\"max_tokens\":8,\"seed\":1}\n"
        "not json\n"
        "{\"id\":\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"two\"}],"
        "\"max_tokens\":8,\"seed\":2}\n";
    return sweep("batch", args, input, BATCH_OUT, calls_of, first_n, 1);
}

static int chat(void) { return chat_with(WRAPPED); }
static int batch(void) { return batch_with(WRAPPED, 0); }

/* The two commands that read standard input line by line (getline, whose
 * failures only the preloaded shim reaches), with libc's calls counted. */
static int chat_libc(void)
{
    if (UNDER_ASAN || !shim[0])
        return test_skip("the shim cannot be preloaded under ASan");
    return chat_with(PRELOAD);
}

static int batch_libc(void)
{
    if (UNDER_ASAN || !shim[0])
        return test_skip("the shim cannot be preloaded under ASan");
    /* (the input is read first: past its calls the run is the wrapped
     * sweep's again, with libc's stdio besides) */
    return batch_with(PRELOAD, 100);
}

/* A request of the test's own on c, not streamed, that runs until
 * cancelled (4,000 tokens): its id (from its accepted event), 0 on
 * failure. */
static long long long_request(struct fixture_cl *c)
{
    static const char req[] = "{\"v\":1," FIXTURE_LONG_FIELDS ",\"stream\":false}\n";
    json_t *e;
    long long id = 0;
    int eof;
    if (fixture_cl_send(c, req) != 0)
        return 0;
    e = fixture_cl_event(c, &eof);
    if (e && !strcmp(fixture_ev_kind(e), "accepted"))
        id = fixture_ev_int(e, "id");
    json_decref(e);
    return id;
}

/* c's events up to request id's done (not streamed: no canvases): its
 * finish_reason into reason.  With own_cancel, the test's own cancel of it
 * first, and the answer to that cancel ("cancelling", or an error when the
 * request had ended) is waited for too. */
static int end_request(struct fixture_cl *c, long long id, int own_cancel, char *reason,
                       size_t cap)
{
    char msg[128];
    int done = 0, answered = !own_cancel, eof;
    if (own_cancel) {
        snprintf(msg, sizeof msg, "{\"v\":1,\"op\":\"cancel\",\"id\":%lld}\n", id);
        CHECK(fixture_cl_send(c, msg) == 0);
    }
    reason[0] = '\0';
    while (!done || !answered) {
        json_t *e = fixture_cl_event(c, &eof);
        const char *k;
        CHECKF(e, "request %lld: no done (%s)", id,
               eof ? "the connection ended" : "nothing within the wait");
        k = fixture_ev_kind(e);
        if (!strcmp(k, "done")) {
            const char *r = json_string_value(json_object_get(e, "finish_reason"));
            CHECK(fixture_ev_int(e, "id") == id);
            snprintf(reason, cap, "%s", r ? r : "(none)");
            done = 1;
        } else if (!strcmp(k, "cancelling") || !strcmp(k, "error")) {
            answered = 1;
        } else {
            CHECKF(0, "request %lld: event %s", id, k);
        }
        json_decref(e);
    }
    return 0;
}

/* cancel: each run (call k failing) asks to cancel a request of the
 * test's own, still running.  It must say "cancelling ID" and exit 0 (and
 * the request then ends cancelled), or exit 1 with "out of memory".
 * Every call fails in turn. */
static int cancel(void)
{
    struct fixture_cl *c = fixture_cl_open(sock);
    const char *out = test_path("cancel.out"), *err = test_path("cancel.err"),
               *stats = test_path("cancel.stats"), *in = test_path("cancel.in");
    char got[256], want[64], ebuf[4096], reason[64], idarg[32];
    const char *args[] = {"-s", sock, "cancel", idarg, NULL};
    long long calls = -1;
    int n_ok = 0, n_nomem = 0;
    const double t0 = fixture_now_ms();
    CHECK(c != NULL);
    CHECK(fixture_write_file(in, "") == 0);
    for (long long k = NO_FAILURE; k == NO_FAILURE || k < calls;
         k = k == NO_FAILURE ? 0 : k + 1) {
        const long long id = long_request(c);
        int rc;
        CHECKF(id > 0, "call %lld: no request to cancel", k);
        snprintf(idarg, sizeof idarg, "%lld", id);
        snprintf(want, sizeof want, "cancelling %lld\n", id);
        rc = reap(spawn(wrapped, k, 0, args, NULL, in, out, err, stats));
        slurp(out, got, sizeof got);
        slurp(err, ebuf, sizeof ebuf);
        CHECKF(!sanitizer_said(ebuf), "cancel, call %lld failing: %s", k, ebuf);
        /* (a run that said "cancelling" must have cancelled it: no help) */
        CHECK(end_request(c, id, rc != 0, reason, sizeof reason) == 0);
        if (k == NO_FAILURE) {
            CHECKF(rc == 0 && !strcmp(got, want) && !strcmp(reason, "cancelled"),
                   "cancel, nothing failing: exit %d, output '%s', request %s: %s", rc, got,
                   reason, ebuf);
            calls = calls_counted(stats);
            CHECKF(calls > 10, "cancel: %lld allocation calls counted", calls);
        } else if (rc == 0) {
            CHECKF(!strcmp(got, want) && !strcmp(reason, "cancelled"),
                   "cancel, call %lld failing: exit 0 with '%s', request %s", k, got, reason);
            n_ok++;
        } else {
            CHECKF(rc == 1 && strstr(ebuf, "out of memory"), "cancel, call %lld failing: exit %d: %s",
                   k, rc, ebuf);
            n_nomem++;
        }
    }
    fixture_cl_close(c);
    printf("# cancel: %lld allocation calls, each failed alone in a run: %d runs as the clean "
           "one, %d said out of memory (exit 1); %.1f s\n",
           calls, n_ok, n_nomem, (fixture_now_ms() - t0) / 1e3);
    CHECKF(n_nomem > 0, "cancel: no run said out of memory");
    return 0;
}

/* libdgemma's ring: attach, four jobs (one the daemon refuses), kick,
 * reap and wait, by tests/fault/ring-client; a reap that fails for memory
 * must keep its completion for the next (the client retries it once and
 * must then print what the clean run printed). */
static int ring(void)
{
    const char *args[] = {sock, NULL};
    return sweep("ring", args, "", SAME_BYTES, RING, 0, 1);
}

/* The summary of the rows the cases above made the daemon write (their
 * runs' requests), over a fixed window: the same output every run.  As
 * JSON: the text form makes no allocation of its own past the summary. */
static int stats(void)
{
    const char *json[] = {"stats", "--db", db_path, "--since", "0", "--until", "4102444800",
                          "--json", NULL};
    /* (the rows are written behind the requests: wait until none runs,
     * none is queued and the metrics writer holds no row) */
    int quiet = 0;
    for (int i = 0; i < 200 && !quiet; i++) {
        json_t *st = fixture_status(sock);
        quiet = st && json_integer_value(json_object_get(st, "running")) == 0 &&
                json_integer_value(json_object_get(st, "queued")) == 0 &&
                json_integer_value(json_object_get(json_object_get(st, "metrics"), "queued")) ==
                    0 &&
                json_integer_value(
                    json_object_get(json_object_get(st, "metrics"), "requests_written")) > 0;
        json_decref(st);
        if (!quiet)
            usleep(50000);
    }
    CHECKF(quiet, "the daemon did not settle, or wrote no metrics (%s)", db_path);
    /* (every second call: most are SQLite's own, its fallbacks tested by
     * SQLite) */
    return sweep("stats", json, "", SAME_BYTES, WRAPPED, 0, 2);
}

/* The daemon that served every sweep's clients, each cut short wherever
 * its allocation failed, stops on SIGTERM and exits 0 (under the
 * sanitizers that is also their leak check of everything those clients
 * left it, which the SIGKILL of fixture_finish would skip). */
static int daemon_stops_clean(void)
{
    const pid_t p = daemon_pid;
    daemon_pid = 0;
    CHECK(fixture_stop(p, log_path) == 0);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TEST_CASE(start);
    if (daemon_pid <= 0)
        return test_finish();
    TEST_CASE(status);
    TEST_CASE(generate);
    TEST_CASE(generate_forms);
    TEST_CASE(chat);
    TEST_CASE(batch);
    TEST_CASE(chat_libc);
    TEST_CASE(batch_libc);
    TEST_CASE(cancel);
    TEST_CASE(ring);
    TEST_CASE(stats);
    TEST_CASE(daemon_stops_clean);
    return fixture_finish(daemon_pid, log_path);
}
