/*
 * Description: long prompts are tokenized off dgemmad's front-end thread.
 * A real daemon (max_line_bytes 8 MiB) gets a 3 MB prompt on one
 * connection, with a status and a short generate behind it on the same
 * connection: another connection's status requests are answered while the
 * prompt is being tokenized (their "tokenizing" is 1 at least once, which
 * a front end that tokenized itself could never show), and the first
 * connection's replies come in the order of its lines (the prompt's
 * too_large error, the status with "tokenizing" back to 0, the short
 * request's accepted and done).  A client that sends such a prompt and
 * vanishes costs nothing (the daemon answers after); a chat of long
 * messages goes the same way; SIGTERM while a prompt is being tokenized
 * still answers it, and the daemon exits 0.
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

#define BIG_BYTES (3u << 20)

static char sock_path[512], log_path[512];
static pid_t daemon_pid;

static const char *const DAEMON_OPTS[] = {
    "max_line_bytes=8388608", "max_batch=4", "queue_max=4", "shutdown_grace=1", "tick=0.05",
    "pin_workers=false", "log_level=debug", NULL,
};

/* A generate line (with its newline) whose prompt is BIG_BYTES of words,
 * tagged tag; or, with chat, the same text as two user messages.
 * malloc'd. */
static char *big_line(const char *tag, int chat)
{
    static const char *const words[] = {"alpha ", "beta ", "gamma ", "the ", "quick ",
                                        "brown ", "fox ", "12345 ", "hello ", "world "};
    char *text = malloc(BIG_BYTES + 1), *line;
    size_t n = 0;
    uint64_t k = 7;
    if (!text)
        return NULL;
    while (n + 8 < BIG_BYTES) {
        const char *w = words[test_xorshift(&k) >> 16 & 7];
        memcpy(text + n, w, strlen(w));
        n += strlen(w);
    }
    text[n] = '\0';
    line = malloc(n + 256);
    if (line) {
        if (chat)
            sprintf(line, "{\"v\":1,\"op\":\"generate\",\"tag\":\"%s\",\"messages\":["
                          "{\"role\":\"user\",\"content\":\"%s\"},"
                          "{\"role\":\"user\",\"content\":\"%s\"}]}\n",
                    tag, text + n / 2, text + n / 2);
        else
            sprintf(line, "{\"v\":1,\"op\":\"generate\",\"tag\":\"%s\",\"prompt\":\"%s\"}\n",
                    tag, text);
    }
    free(text);
    return line;
}

/* Status on connection c: its "tokenizing", or -1. */
static long long tokenizing(struct fixture_cl *c)
{
    int eof;
    json_t *e;
    long long v = -1;
    if (fixture_cl_send(c, "{\"v\":1,\"op\":\"status\"}\n") != 0)
        return -1;
    e = fixture_cl_event(c, &eof);
    if (e && !strcmp(fixture_ev_kind(e), "status") && json_object_get(e, "tokenizing"))
        v = fixture_ev_int(e, "tokenizing");
    json_decref(e);
    return v;
}

/* Poll status on c until "tokenizing" is want (0, or -1 after 60 s). */
static int wait_tokenizing(struct fixture_cl *c, long long want)
{
    const double end = fixture_now_ms() + 60000;
    long long v;
    while ((v = tokenizing(c)) != want) {
        if (v < 0 || fixture_now_ms() > end)
            return -1;
        usleep(1000);
    }
    return 0;
}

/* The next event on c is kind, tagged tag (and for an error, code). */
static int expect(struct fixture_cl *c, const char *kind, const char *tag, const char *code)
{
    int eof;
    json_t *e = fixture_cl_event(c, &eof);
    const char *t = e ? json_string_value(json_object_get(e, "tag")) : NULL;
    const char *k = e ? fixture_ev_kind(e) : "(none)";
    const char *got = e ? json_string_value(json_object_get(e, "code")) : NULL;
    const int ok = e && !strcmp(k, kind) && t && !strcmp(t, tag) &&
                   (!code || (got && !strcmp(got, code)));
    if (!ok)
        printf("# wanted %s %s %s, got %s tag %s code %s\n", kind, tag, code ? code : "",
               k, t ? t : "-", got ? got : "-");
    json_decref(e);
    return ok ? 0 : -1;
}

static int start(void)
{
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    daemon_pid = fixture_spawn(sock_path, log_path, DAEMON_OPTS);
    CHECKF(fixture_wait_ready(daemon_pid, sock_path) == 0, "the daemon did not come up; log %s",
           log_path);
    return 0;
}

/* Two connections and a big line, or 0 with nothing held. */
static int open_two(struct fixture_cl **a, struct fixture_cl **b, char **line, const char *tag,
                    int chat)
{
    *a = fixture_cl_open(sock_path);
    *b = fixture_cl_open(sock_path);
    *line = big_line(tag, chat);
    if (*a && *b && *line)
        return 1;
    fixture_cl_close(*a);
    fixture_cl_close(*b);
    free(*line);
    return 0;
}

/* a's replies after others_served_meanwhile's lines: 0 when they come in
 * their order */
static int replies_in_order(struct fixture_cl *a)
{
    int eof, rc = -1;
    json_t *e;
    const char *t;
    if (expect(a, "error", "big", "too_large") != 0)
        return -1;
    e = fixture_cl_event(a, &eof);
    t = e ? json_string_value(json_object_get(e, "tag")) : NULL;
    if (e && !strcmp(fixture_ev_kind(e), "status") && t && !strcmp(t, "after") &&
        fixture_ev_int(e, "tokenizing") == 0)
        rc = expect(a, "accepted", "small", NULL) || expect(a, "done", "small", NULL) ? -1 : 0;
    else
        printf("# wanted the status tagged after with tokenizing 0\n");
    json_decref(e);
    return rc;
}

static int others_served_meanwhile(void)
{
    struct fixture_cl *a, *b;
    char *line;
    int saw = 0, ordered = 0;
    CHECK(open_two(&a, &b, &line, "big", 0));
    if (tokenizing(b) == 0 && fixture_cl_send(a, line) == 0 &&
        fixture_cl_send(a, "{\"v\":1,\"op\":\"status\",\"tag\":\"after\"}\n"
                           "{\"v\":1,\"op\":\"generate\",\"tag\":\"small\",\"prompt\":\"hi\","
                           "\"max_tokens\":1,\"stream\":false}\n") == 0) {
        saw = wait_tokenizing(b, 1) == 0;
        ordered = replies_in_order(a) == 0;
    }
    free(line);
    fixture_cl_close(a);
    fixture_cl_close(b);
    CHECKF(saw, "no status showed a prompt being tokenized");
    CHECK(ordered);
    return 0;
}

static int chat_and_vanishing_client(void)
{
    struct fixture_cl *a, *b;
    char *line;
    int ok;
    CHECK(open_two(&a, &b, &line, "chat", 1));
    ok = fixture_cl_send(a, line) == 0 && wait_tokenizing(b, 1) == 0;
    free(line);
    fixture_cl_close(a); /* gone before its answer */
    fixture_cl_close(b);
    CHECK(ok);
    /* still serving, and a second chat is answered in full */
    CHECK(open_two(&a, &b, &line, "chat2", 1));
    ok = wait_tokenizing(b, 0) == 0 && fixture_cl_send(a, line) == 0 &&
         expect(a, "error", "chat2", "too_large") == 0;
    free(line);
    fixture_cl_close(a);
    fixture_cl_close(b);
    CHECK(ok);
    return 0;
}

static int sigterm_while_tokenizing(void)
{
    struct fixture_cl *a, *b;
    char *line;
    int ok, st;
    CHECK(open_two(&a, &b, &line, "last", 0));
    ok = fixture_cl_send(a, line) == 0 && wait_tokenizing(b, 1) == 0 &&
         kill(daemon_pid, SIGTERM) == 0 && expect(a, "error", "last", NULL) == 0;
    free(line);
    fixture_cl_close(a);
    fixture_cl_close(b);
    CHECK(ok);
    CHECK(fixture_wait_exit(daemon_pid, &st) == 0);
    daemon_pid = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    return 0;
}

int main(void)
{
    TEST_CASE(start);
    if (daemon_pid > 0) {
        TEST_CASE(others_served_meanwhile);
        TEST_CASE(chat_and_vanishing_client);
        TEST_CASE(sigterm_while_tokenizing);
    }
    return fixture_finish(daemon_pid, log_path);
}
