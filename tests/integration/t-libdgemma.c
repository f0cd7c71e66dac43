/*
 * Description: libdgemma (client/dgemma.h) against the real dgemmad on the
 * random test model ($BUILD/model/random), through the public API only: NULL handles and
 * statuses, connecting to a missing socket (fails in about the wait), to a
 * listener whose queue is full (likewise, never blocking) and to
 * a daemon still starting (waits for it), a streamed text request (accepted
 * with the seed, canvases in order adding up to the done), a chat request
 * not streamed (text and ids in the done), a token-id request, settings
 * (checked locally for names, by the daemon for values), two requests in
 * flight told apart by tag, cancel, status, a non-blocking poll(2) loop on
 * dgemma_fd, and the daemon going away mid-request (a done or
 * DGEMMA_E_CLOSED, never a hang).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "tests/harness.h"
#include "tests/json-alloc.h"
#include "tests/integration/fixture.h"

#define WAIT_MS FIXTURE_WAIT_MS

static char sock_path[512], log_path[512];
static pid_t daemon_pid;

static const char *const DAEMON_OPTS[] = {
    "max_batch=4", "pin_workers=false", "tick=0.05", "shutdown_grace=1", "log_level=debug", NULL,
};

static dgemma_t *open_conn(void)
{
    dgemma_t *c = dgemma_new();
    if (c && dgemma_connect(c, sock_path, 5) != 0) {
        dgemma_close(c);
        return NULL;
    }
    return c;
}

/* The next event within WAIT_MS, or a failure naming the status. */
#define NEXT(c, ev)                                                                         \
    do {                                                                                    \
        int rc_ = dgemma_next_event((c), (ev), WAIT_MS);                                    \
        CHECKF(rc_ == 0, "dgemma_next_event: %d (%s): %s", rc_, dgemma_status_name(rc_),    \
               dgemma_errmsg(c));                                                           \
    } while (0)

#define CHECK_RC(call, c)                                                                   \
    do {                                                                                    \
        int rc_ = (call);                                                                   \
        CHECKF(rc_ == 0, "%s: %d (%s): %s", #call, rc_, dgemma_status_name(rc_),            \
               dgemma_errmsg(c));                                                           \
    } while (0)

static int streq(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

/* One request's events until its done (or its error event). */
struct result {
    uint64_t id, seed;
    long long prompt_tokens;
    int canvases, tokens, last_index;
    char text[65536];
    size_t text_len;
    int32_t ids[8192];
    size_t n_ids;
    /* the end */
    enum dgemma_event_kind end;
    char finish[32], code[64], message[512], tag[160];
    long long completion_tokens, done_prompt_tokens;
    int done_canvases;
    char done_text[65536];
    size_t done_text_len;
    int32_t done_ids[8192];
    size_t done_n_ids;
};

static void copy_str(char *dst, size_t n, const char *s)
{
    snprintf(dst, n, "%s", s ? s : "");
}

static int collect(dgemma_t *c, struct result *r)
{
    dgemma_event_t ev;
    memset(r, 0, sizeof *r);
    r->last_index = -1;
    for (;;) {
        NEXT(c, &ev);
        CHECK(ev.json && ev.json[0] == '{');
        switch (ev.kind) {
        case DGEMMA_EV_ACCEPTED:
            CHECK(r->id == 0 && ev.id > 0);
            r->id = ev.id;
            r->seed = ev.seed;
            r->prompt_tokens = ev.prompt_tokens;
            break;
        case DGEMMA_EV_CANVAS:
            CHECK(r->id && ev.id == r->id);
            CHECKF(ev.index == r->last_index + 1, "canvas %d after %d", ev.index, r->last_index);
            r->last_index = ev.index;
            r->canvases++;
            r->tokens += ev.tokens;
            CHECK((size_t)ev.tokens == ev.n_ids && ev.steps >= 1);
            CHECK(ev.text && r->text_len + ev.text_len < sizeof r->text);
            memcpy(r->text + r->text_len, ev.text, ev.text_len);
            r->text_len += ev.text_len;
            CHECK(r->n_ids + ev.n_ids <= sizeof r->ids / sizeof r->ids[0]);
            memcpy(r->ids + r->n_ids, ev.ids, ev.n_ids * sizeof(int32_t));
            r->n_ids += ev.n_ids;
            break;
        case DGEMMA_EV_DONE:
        case DGEMMA_EV_ERROR:
            r->end = ev.kind;
            copy_str(r->finish, sizeof r->finish, ev.finish_reason);
            copy_str(r->code, sizeof r->code, ev.code);
            copy_str(r->message, sizeof r->message, ev.message);
            copy_str(r->tag, sizeof r->tag, ev.tag);
            r->completion_tokens = ev.completion_tokens;
            r->done_prompt_tokens = ev.prompt_tokens;
            r->done_canvases = ev.canvases;
            if (ev.kind == DGEMMA_EV_DONE)
                CHECK(ev.id == r->id);
            if (ev.text) {
                CHECK(ev.text_len < sizeof r->done_text);
                memcpy(r->done_text, ev.text, ev.text_len);
                r->done_text_len = ev.text_len;
            }
            if (ev.ids) {
                CHECK(ev.n_ids <= sizeof r->done_ids / sizeof r->done_ids[0]);
                memcpy(r->done_ids, ev.ids, ev.n_ids * sizeof(int32_t));
                r->done_n_ids = ev.n_ids;
            }
            return 0;
        default:
            CHECKF(0, "unexpected event: %s", ev.json);
        }
    }
}

/* ---- cases without a daemon ----------------------------------------------------- */

static int null_handles(void)
{
    dgemma_request_t *r = dgemma_request_text("x");
    dgemma_t *c = dgemma_new();
    dgemma_event_t ev;
    const int all[] = {DGEMMA_OK,       DGEMMA_E_INVAL,    DGEMMA_E_NOMEM,
                       DGEMMA_E_CONNECT, DGEMMA_E_IO,      DGEMMA_E_CLOSED,
                       DGEMMA_E_PROTOCOL, DGEMMA_E_AGAIN,  DGEMMA_E_DAEMON};

    CHECK(r && c);
    dgemma_close(NULL);
    dgemma_request_free(NULL);
    CHECK(dgemma_connect(NULL, sock_path, 0) == DGEMMA_E_INVAL);
    CHECK(dgemma_submit(NULL, r) == DGEMMA_E_INVAL);
    CHECK(dgemma_submit(c, NULL) == DGEMMA_E_INVAL);
    CHECK(dgemma_cancel(NULL, 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_status(NULL) == DGEMMA_E_INVAL);
    CHECK(dgemma_next_event(NULL, &ev, 0) == DGEMMA_E_INVAL);
    CHECK(dgemma_next_event(c, NULL, 0) == DGEMMA_E_INVAL);
    CHECK(dgemma_fd(NULL) == -1 && dgemma_fd(c) == -1);
    CHECK(dgemma_errmsg(NULL) != NULL && dgemma_errmsg(NULL)[0]);
    CHECK(dgemma_request_add_message(NULL, "user", "x") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_int(NULL, "seed", 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_real(NULL, "top_p", 0.5) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_add_stop(NULL, "x") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_add_stop_id(NULL, 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_json(NULL, "{}") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_stream(NULL, 0) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_thinking(NULL, 0) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_tag(NULL, "t") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_text(NULL) == NULL);
    CHECK(dgemma_request_text("\xff\xfe") == NULL); /* not UTF-8 */
    CHECK(dgemma_request_ids(NULL, 3) == NULL);
    /* a text request is not a chat */
    CHECK(dgemma_request_add_message(r, "user", "x") == DGEMMA_E_INVAL);
    /* an unconnected handle */
    CHECK(dgemma_submit(c, r) == DGEMMA_E_INVAL && strstr(dgemma_errmsg(c), "not connected"));
    CHECK(dgemma_next_event(c, &ev, 0) == DGEMMA_E_INVAL);
    /* every status has its own name */
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(!streq(dgemma_status_name(all[i]), "unknown"));
        for (size_t j = 0; j < i; j++)
            CHECK(!streq(dgemma_status_name(all[i]), dgemma_status_name(all[j])));
    }
    CHECK(streq(dgemma_status_name(DGEMMA_E_CONNECT), "connect"));
    CHECK(streq(dgemma_status_name(DGEMMA_E_CLOSED), "closed"));
    CHECK(streq(dgemma_status_name(42), "unknown"));
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

static int connect_missing(void)
{
    dgemma_t *c = dgemma_new();
    char long_path[200];
    double t0, ms;
    int rc;

    CHECK(c);
    /* nobody there: fails after about the wait */
    t0 = fixture_now_ms();
    rc = dgemma_connect(c, test_path("nobody.sock"), 0.2);
    ms = fixture_now_ms() - t0;
    CHECKF(rc == DGEMMA_E_CONNECT, "rc %d: %s", rc, dgemma_errmsg(c));
    CHECKF(ms >= 180 && ms < 1500, "gave up after %.0f ms", ms);
    CHECK(strstr(dgemma_errmsg(c), "nobody.sock") && dgemma_fd(c) == -1);
    /* no wait: at once */
    t0 = fixture_now_ms();
    CHECK(dgemma_connect(c, test_path("nobody.sock"), 0) == DGEMMA_E_CONNECT);
    CHECK(fixture_now_ms() - t0 < 100);
    /* the path from the environment */
    setenv(DGEMMA_SOCKET_ENV, test_path("from-env.sock"), 1);
    CHECK(dgemma_connect(c, NULL, 0) == DGEMMA_E_CONNECT);
    CHECKF(strstr(dgemma_errmsg(c), "from-env.sock"), "%s", dgemma_errmsg(c));
    unsetenv(DGEMMA_SOCKET_ENV);
    /* a path too long for a UNIX socket */
    memset(long_path, 'x', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = '\0';
    CHECK(dgemma_connect(c, long_path, 0) == DGEMMA_E_INVAL);
    dgemma_close(c);
    return 0;
}

/* A listener that never accepts, its queue of connections full (a hung
 * daemon): the connect gives up after about the wait, never blocks (it
 * did, for ever, whatever the wait). */
static int connect_full_queue(void)
{
    struct sockaddr_un a;
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0), held[512], n_held = 0, rc;
    dgemma_t *c = dgemma_new();
    double t0, ms;

    CHECK(lfd >= 0 && c);
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", test_path("hung.sock"));
    CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 0) == 0);
    for (;;) {
        const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        CHECK(fd >= 0 && n_held < 512);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            CHECKF(errno == EAGAIN, "filling the queue: %s", strerror(errno));
            close(fd);
            break;
        }
        held[n_held++] = fd;
    }
    t0 = fixture_now_ms();
    rc = dgemma_connect(c, a.sun_path, 0.3);
    ms = fixture_now_ms() - t0;
    CHECKF(rc == DGEMMA_E_CONNECT && strstr(dgemma_errmsg(c), "queue of connections is full"),
           "rc %d: %s", rc, dgemma_errmsg(c));
    CHECKF(ms >= 250 && ms < 1500, "gave up after %.0f ms", ms);
    t0 = fixture_now_ms();
    CHECK(dgemma_connect(c, a.sun_path, 0) == DGEMMA_E_CONNECT);
    CHECK(fixture_now_ms() - t0 < 100);
    for (int i = 0; i < n_held; i++)
        close(held[i]);
    close(lfd);
    dgemma_close(c);
    return 0;
}

/* ---- a fake daemon: the exact request lines, and odd event lines ------------------- */

static int write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A scripted daemon's socket at test_path(name): c connected to it, its
 * end accepted into *sfd (the listener closed). */
static int fake_accept(const char *name, dgemma_t *c, int *sfd)
{
    const char *path = test_path(name);
    struct sockaddr_un a;
    const int lf = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    CHECK(lf >= 0 && bind(lf, (struct sockaddr *)&a, sizeof a) == 0 && listen(lf, 4) == 0);
    CHECK(c);
    CHECK_RC(dgemma_connect(c, path, 0), c);
    *sfd = accept(lf, NULL, NULL);
    CHECK(*sfd >= 0);
    close(lf);
    return 0;
}

/* The child: read n request lines, echo them in one event, then the script. */
static void fake_script(int fd, int n_lines)
{
    static char req[65536];
    size_t len = 0;
    int seen = 0;
    char *big;
    const size_t big_n = 3u << 20;
    while (seen < n_lines && len < sizeof req - 1) {
        ssize_t got = read(fd, req + len, sizeof req - 1 - len);
        if (got <= 0)
            _exit(2);
        for (ssize_t i = 0; i < got; i++)
            if (req[len + (size_t)i] == '\n') {
                req[len + (size_t)i] = seen + 1 < n_lines ? ',' : ' ';
                seen++;
            }
        len += (size_t)got;
    }
    req[len] = '\0';
    static const char head[] = "{\"v\":1,\"event\":\"echo\",\"lines\":[";
    if (write_all(fd, head, sizeof head - 1) ||
        write_all(fd, req, len) || write_all(fd, "]}\n", 3))
        _exit(3);
#define W(lit) write_all(fd, lit, sizeof lit - 1)
    W("\n\r\n");
    W("{\"v\":1,\"event\":\"canvas\",\"id\":3,\"tag\":\"t\",\"index\":0,\"text\":\"a\\u0000b\","
      "\"ids\":[1,2,3],\"tokens\":3,\"steps\":2,\"converged\":true,\"ms\":1.5}\r\n");
    W("not json\n");
    W("{\"v\":2,\"event\":\"x\"}\n");
    W("{\"v\":1}\n");
    W("{\"v\":1,\"event\":\"future\",\"id\":null,\"ids\":[]}\n");
    W("{\"v\":1,\"event\":\"done\",\"id\":3,\"finish_reason\":\"error\",\"usage\":"
      "{\"prompt_tokens\":4,\"completion_tokens\":0},\"canvases\":0,\"error\":{\"code\":"
      "\"internal\",\"message\":\"boom\"},\"stop_id\":1,\"stop\":\"zz\"}\n");
    /* a big line, then one in pieces */
    big = malloc(big_n + 64);
    if (!big)
        _exit(4);
    {
        static const char bh[] = "{\"v\":1,\"event\":\"canvas\",\"text\":\"";
        const size_t h = sizeof bh - 1;
        memcpy(big, bh, h);
        memset(big + h, 'x', big_n);
        memcpy(big + h + big_n, "\"}\n", 3);
        if (write_all(fd, big, h + big_n + 3))
            _exit(5);
    }
    free(big);
    W("{\"v\":1,\"event\":");
    usleep(20000);
    W("\"accepted\",\"id\":9,\"seed\":9223372036854775807");
    usleep(20000);
    W(",\"prompt_tokens\":2}\n");
    /* a last line, and half of one */
    W("{\"v\":1,\"event\":\"cancelling\",\"id\":9}\n{\"v\":1,\"ev");
#undef W
    _exit(0);
}

static int fake_daemon(void)
{
    int sfd, st, rc;
    dgemma_t *c = dgemma_new();
    dgemma_request_t *r = dgemma_request_text("hi");
    dgemma_event_t ev;
    json_t *echo, *l0;
    pid_t pid;

    CHECK(fake_accept("fake.sock", c, &sfd) == 0);
    CHECK(r);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 5), c);
    CHECK_RC(dgemma_request_add_stop(r, "a"), c);
    CHECK_RC(dgemma_request_set_json(r, "{\"stop\":\"b\",\"top_p\":0.5}"), c);
    CHECK_RC(dgemma_request_add_stop(r, "c"), c); /* a single stop becomes a list */
    CHECK_RC(dgemma_request_add_stop_id(r, 3), c);
    CHECK_RC(dgemma_request_set_stream(r, 0), c);
    CHECK_RC(dgemma_request_set_tag(r, "t"), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK_RC(dgemma_cancel(c, 7), c);
    CHECK_RC(dgemma_status(c), c);
    dgemma_request_free(r);
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        fake_script(sfd, 3);
    close(sfd);

    /* the requests as sent */
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_OTHER, "%s", ev.json);
    echo = json_loads(ev.json, 0, NULL);
    CHECKF(echo && json_array_size(json_object_get(echo, "lines")) == 3, "%s", ev.json);
    l0 = json_array_get(json_object_get(echo, "lines"), 0);
    CHECK(json_integer_value(json_object_get(l0, "v")) == 1);
    CHECK(streq(json_string_value(json_object_get(l0, "op")), "generate"));
    CHECK(streq(json_string_value(json_object_get(l0, "prompt")), "hi"));
    CHECK(json_integer_value(json_object_get(l0, "max_tokens")) == 5);
    CHECK(json_real_value(json_object_get(l0, "top_p")) == 0.5);
    CHECK(json_array_size(json_object_get(l0, "stop")) == 2);
    CHECK(streq(json_string_value(json_array_get(json_object_get(l0, "stop"), 1)), "c"));
    CHECK(json_integer_value(json_array_get(json_object_get(l0, "stop_token_ids"), 0)) == 3);
    CHECK(json_is_false(json_object_get(l0, "stream")));
    CHECK(streq(json_string_value(json_object_get(l0, "tag")), "t"));
    {
        json_t *want = json_pack("{s:i,s:s,s:i}", "v", 1, "op", "cancel", "id", 7);
        const int same = json_equal(json_array_get(json_object_get(echo, "lines"), 1), want);
        json_decref(want);
        CHECK(same);
        want = json_pack("{s:i,s:s}", "v", 1, "op", "status");
        CHECK(want);
        const int same2 = json_equal(json_array_get(json_object_get(echo, "lines"), 2), want);
        json_decref(want);
        CHECK(same2);
    }
    json_decref(echo);
    /* blank lines skipped; NUL in text; \r\n */
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_CANVAS && ev.id == 3 && streq(ev.tag, "t"), "%s", ev.json);
    CHECK(ev.text_len == 3 && !memcmp(ev.text, "a\0b", 3));
    CHECK(ev.n_ids == 3 && ev.ids[0] == 1 && ev.ids[2] == 3);
    CHECK(ev.tokens == 3 && ev.steps == 2 && ev.converged == 1 && ev.ms == 1.5);
    CHECK(ev.stop_id == -1 && !ev.finish_reason && !ev.code);
    /* bad lines: DGEMMA_E_PROTOCOL with the line, and the stream goes on */
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    CHECKF(rc == DGEMMA_E_PROTOCOL && strstr(dgemma_errmsg(c), "not json"), "%d: %s", rc,
           dgemma_errmsg(c));
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    CHECK(rc == DGEMMA_E_PROTOCOL && strstr(dgemma_errmsg(c), "\"v\":2"));
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    CHECK(rc == DGEMMA_E_PROTOCOL && strstr(dgemma_errmsg(c), "event"));
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_OTHER && ev.id == 0 && ev.n_ids == 0 && ev.ids != NULL);
    /* a done with an error */
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_DONE && streq(ev.finish_reason, "error"));
    CHECK(streq(ev.code, "internal") && streq(ev.message, "boom"));
    CHECK(ev.stop_id == 1 && streq(ev.stop, "zz") && ev.prompt_tokens == 4);
    CHECK(ev.text == NULL && ev.ids == NULL);
    /* 3 MiB of text */
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_CANVAS && ev.text_len == 3u << 20 && ev.text[12345] == 'x');
    /* a line that arrives in pieces */
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_ACCEPTED && ev.id == 9 && ev.prompt_tokens == 2 &&
               ev.seed == 9223372036854775807u, "%s", ev.json);
    /* the last complete line before the end, then the end */
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_CANCELLING && ev.id == 9);
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    CHECKF(rc == DGEMMA_E_CLOSED && strstr(dgemma_errmsg(c), "middle"), "%d: %s", rc,
           dgemma_errmsg(c));
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    dgemma_close(c);
    return 0;
}

/* The child of attach_after_error_with_id: a submit answered with an
 * error carrying a new request's id (as dgemmad does when it runs out of
 * memory answering one), then the shm_attach refused. */
static void fake_refusals(int fd)
{
    static const char cancelled[] =
        "{\"v\":1,\"event\":\"error\",\"id\":5,\"code\":\"internal\",\"message\":\"out of "
        "memory answering the request; it was cancelled\"}\n";
    static const char refused[] = "{\"v\":1,\"event\":\"error\",\"id\":null,\"code\":"
                                  "\"bad_request\",\"message\":\"no rings here\"}\n";
    char buf[4096];
    size_t len = 0;
    int lines = 0;
    while (lines < 2) {
        ssize_t got = read(fd, buf + len, sizeof buf - 1 - len);
        if (got <= 0)
            _exit(2);
        for (ssize_t i = 0; i < got; i++)
            if (buf[len + (size_t)i] == '\n' && ++lines == 1 &&
                write_all(fd, cancelled, sizeof cancelled - 1) != 0)
                _exit(3);
        len += (size_t)got;
        if (len > sizeof buf - 256)
            len = 0;
    }
    if (write_all(fd, refused, sizeof refused - 1) != 0)
        _exit(4);
    usleep(200 * 1000);
    _exit(0);
}

/* A submit answered by an error with the request's id (never accepted),
 * then dgemma_ring_attach: its refusal is its answer.  It waited for ever,
 * counting the refusal as the submit's answer. */
static int attach_after_error_with_id(void)
{
    int sfd, st, rc;
    dgemma_t *c = dgemma_new();
    dgemma_request_t *r = dgemma_request_text("hi");
    dgemma_ring_t *ring = NULL;
    dgemma_event_t ev;
    pid_t pid;

    CHECK(fake_accept("fake3.sock", c, &sfd) == 0);
    CHECK(r);
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        fake_refusals(sfd);
    close(sfd);
    CHECK_RC(dgemma_submit(c, r), c);
    dgemma_request_free(r);
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_ERROR && ev.id == 5 && streq(ev.code, "internal"), "%s",
           ev.json);
    alarm(20); /* (a hang ends the test) */
    rc = dgemma_ring_attach(c, NULL, &ring);
    alarm(0);
    CHECKF(rc == DGEMMA_E_DAEMON && !ring && strstr(dgemma_errmsg(c), "no rings here"),
           "%d: %s", rc, dgemma_errmsg(c));
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    dgemma_close(c);
    return 0;
}

/* A line over 256 MiB: DGEMMA_E_PROTOCOL, its rest skipped, the next line
 * read. */
static int overlong_line(void)
{
    int sfd, st, rc;
    dgemma_t *c = dgemma_new();
    dgemma_event_t ev;
    pid_t pid;

    CHECK(fake_accept("fake2.sock", c, &sfd) == 0);
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        static char chunk[1 << 20];
        static const char head[] = "{\"v\":1,\"event\":\"canvas\",\"text\":\"";
        static const char tail[] = "\"}\n{\"v\":1,\"event\":\"status\"}\n";
        memset(chunk, 'x', sizeof chunk);
        if (write_all(sfd, head, sizeof head - 1))
            _exit(2);
        for (int i = 0; i < 257; i++)
            if (write_all(sfd, chunk, sizeof chunk))
                _exit(3);
        if (write_all(sfd, tail, sizeof tail - 1))
            _exit(4);
        _exit(0);
    }
    close(sfd);
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    CHECKF(rc == DGEMMA_E_PROTOCOL && strstr(dgemma_errmsg(c), "256 MiB") &&
               strstr(dgemma_errmsg(c), "{\"v\":1,\"event\":\"canvas\""),
           "%d: %s", rc, dgemma_errmsg(c));
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_STATUS, "%s", ev.json);
    CHECK(dgemma_next_event(c, &ev, WAIT_MS) == DGEMMA_E_CLOSED);
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    dgemma_close(c);
    return 0;
}

/* An event that cannot be read for lack of memory is DGEMMA_E_NOMEM, and it
 * is kept: the next call, with memory again, returns it (then the next). */
static int event_out_of_memory(void)
{
    static const char lines[] = "{\"v\":1,\"event\":\"status\",\"running\":7}\n"
                                "{\"v\":1,\"event\":\"status\",\"running\":8}\n";
    dgemma_t *c = dgemma_new();
    dgemma_event_t ev;
    int sfd, rc;
    json_t *j;

    CHECK(fake_accept("fake-nomem.sock", c, &sfd) == 0);
    CHECK(write_all(sfd, lines, sizeof lines - 1) == 0);
    tj_alloc_hold();
    tj_alloc_arm(0, 1); /* every allocation fails */
    rc = dgemma_next_event(c, &ev, WAIT_MS);
    tj_alloc_release();
    CHECKF(rc == DGEMMA_E_NOMEM && strstr(dgemma_errmsg(c), "out of memory"), "%d: %s", rc,
           dgemma_errmsg(c));
    for (int want = 7; want <= 8; want++) {
        NEXT(c, &ev);
        CHECKF(ev.kind == DGEMMA_EV_STATUS, "%s", ev.json);
        j = json_loads(ev.json, 0, NULL);
        CHECKF(json_integer_value(json_object_get(j, "running")) == want, "%s", ev.json);
        json_decref(j);
    }
    close(sfd);
    CHECK(dgemma_next_event(c, &ev, WAIT_MS) == DGEMMA_E_CLOSED);
    dgemma_close(c);
    return 0;
}

/* An event met while waiting for the ring that cannot be read for lack of
 * memory may be the answer: the attach says so (waiting on could wait for
 * ever) rather than leave it for dgemma_next_event. */
static int attach_out_of_memory(void)
{
    static const char line[] = "{\"v\":1,\"event\":\"shm_attached\",\"version\":1}\n";
    dgemma_t *c = dgemma_new();
    dgemma_ring_t *ring = NULL;
    int sfd, rc;

    CHECK(fake_accept("fake-attach-nomem.sock", c, &sfd) == 0);
    CHECK(write_all(sfd, line, sizeof line - 1) == 0);
    shutdown(sfd, SHUT_WR);
    tj_alloc_hold();
    tj_alloc_arm(0, 1);
    rc = dgemma_ring_attach(c, NULL, &ring);
    tj_alloc_release();
    CHECKF(rc == DGEMMA_E_NOMEM && !ring && strstr(dgemma_errmsg(c), "out of memory"), "%d: %s",
           rc, dgemma_errmsg(c));
    close(sfd);
    dgemma_close(c);
    return 0;
}

/* ---- the daemon ----------------------------------------------------------------- */

static int connect_waits_for_daemon(void)
{
    dgemma_t *c = dgemma_new(), *c2;
    dgemma_event_t ev;
    double t0;
    int rc;

    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    CHECKF(access(fixture_bin("dgemmad"), X_OK) == 0, "%s: not built", fixture_bin("dgemmad"));
    CHECK(c);
    /* connect while the daemon is still starting: the wait covers it */
    t0 = fixture_now_ms();
    daemon_pid = fixture_spawn(sock_path, log_path, DAEMON_OPTS);
    CHECK(daemon_pid > 0);
    rc = dgemma_connect(c, sock_path, WAIT_MS / 1000.0);
    CHECKF(rc == 0, "connect: %d: %s (log %s)", rc, dgemma_errmsg(c), log_path);
    printf("# connected %.0f ms after starting the daemon\n", fixture_now_ms() - t0);
    CHECK(fixture_wait_ready(daemon_pid, sock_path) == 0);
    CHECK(dgemma_fd(c) >= 0);
    /* it answers */
    CHECK_RC(dgemma_status(c), c);
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_STATUS, "%s", ev.json);
    /* connecting again replaces the connection */
    CHECK_RC(dgemma_connect(c, sock_path, 0), c);
    CHECK_RC(dgemma_status(c), c);
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_STATUS);
    /* the socket from the environment */
    setenv(DGEMMA_SOCKET_ENV, sock_path, 1);
    CHECK((c2 = dgemma_new()) != NULL);
    CHECK_RC(dgemma_connect(c2, NULL, 0), c2);
    unsetenv(DGEMMA_SOCKET_ENV);
    dgemma_close(c2);
    dgemma_close(c);
    return 0;
}

static int streamed_text(void)
{
    static struct result a, b;
    dgemma_t *c = open_conn();
    dgemma_request_t *r = dgemma_request_text("Once upon a time");
    CHECK(c && r);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 40), c);
    CHECK_RC(dgemma_request_set_int(r, "seed", 11), c);
    CHECK_RC(dgemma_request_set_int(r, "max_denoising_steps", 4), c);
    CHECK_RC(dgemma_request_set_int(r, "canvas_length", 16), c);
    CHECK_RC(dgemma_request_set_tag(r, "s1"), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &a) == 0);
    CHECKF(a.end == DGEMMA_EV_DONE, "ended with %s: %s", a.code, a.message);
    CHECK(a.id >= 1 && a.seed == 11 && a.prompt_tokens > 0);
    CHECK(streq(a.tag, "s1"));
    CHECK(a.canvases >= 1 && a.canvases == a.done_canvases);
    CHECKF(a.tokens == a.completion_tokens, "canvas tokens %d, done %lld", a.tokens,
           a.completion_tokens);
    CHECK((size_t)a.tokens == a.n_ids && a.tokens <= 40);
    CHECK(a.done_prompt_tokens == a.prompt_tokens);
    CHECK(streq(a.finish, "length") || streq(a.finish, "stop"));
    CHECK(a.done_text_len == 0 && a.done_n_ids == 0); /* streamed: nothing in the done */
    /* the same request not streamed: the same text and ids, in the done
     * (the request can be reused after a submit) */
    CHECK_RC(dgemma_request_set_stream(r, 0), c);
    CHECK_RC(dgemma_request_set_tag(r, NULL), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &b) == 0 && b.end == DGEMMA_EV_DONE && b.canvases == 0);
    CHECK(b.tag[0] == '\0');
    CHECK(b.done_n_ids == a.n_ids && !memcmp(b.done_ids, a.ids, a.n_ids * sizeof(int32_t)));
    CHECK(b.done_text_len == a.text_len && !memcmp(b.done_text, a.text, a.text_len));
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

static int chat_not_streamed(void)
{
    static struct result a;
    dgemma_t *c = open_conn();
    dgemma_request_t *r = dgemma_request_chat();
    CHECK(c && r);
    CHECK_RC(dgemma_request_add_message(r, "system", "Answer briefly."), c);
    CHECK_RC(dgemma_request_add_message(r, "user", "Why is the sky blue?"), c);
    CHECK_RC(dgemma_request_set_stream(r, 0), c);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 32), c);
    CHECK_RC(dgemma_request_set_int(r, "max_denoising_steps", 3), c);
    /* a fixed seed: on the random model about one seed in a thousand
     * (793 of 1 to 1,000) draws the end of text first, 0 tokens */
    CHECK_RC(dgemma_request_set_int(r, "seed", 5), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &a) == 0);
    CHECKF(a.end == DGEMMA_EV_DONE, "ended with %s: %s", a.code, a.message);
    CHECK(a.canvases == 0 && a.completion_tokens >= 1 && a.completion_tokens <= 32);
    CHECK(a.done_n_ids == (size_t)a.completion_tokens);
    CHECK(a.done_text_len > 0 || a.completion_tokens == 0);
    /* a role the daemon refuses: an error event, then the connection serves */
    dgemma_request_free(r);
    r = dgemma_request_chat();
    CHECK(r);
    CHECK_RC(dgemma_request_add_message(r, "tool", "x"), c);
    CHECK_RC(dgemma_request_set_tag(r, "bad-role"), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &a) == 0 && a.end == DGEMMA_EV_ERROR && a.id == 0);
    CHECK(streq(a.code, "bad_request") && strstr(a.message, "role") && streq(a.tag, "bad-role"));
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

static int token_ids(void)
{
    static struct result a;
    static const int32_t ids[] = {2, 10, 20, 30, 40};
    dgemma_t *c = open_conn();
    dgemma_request_t *r = dgemma_request_ids(ids, 5);
    CHECK(c && r);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 24), c);
    CHECK_RC(dgemma_request_set_int(r, "max_denoising_steps", 3), c);
    CHECK_RC(dgemma_request_set_int(r, "seed", 3), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &a) == 0 && a.end == DGEMMA_EV_DONE);
    CHECK(a.prompt_tokens == 5 && a.done_prompt_tokens == 5 && a.seed == 3);
    CHECK(a.tokens == a.completion_tokens && a.tokens <= 24);
    dgemma_request_free(r);
    /* an empty list is the daemon's to refuse */
    r = dgemma_request_ids(NULL, 0);
    CHECK(r);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &a) == 0 && a.end == DGEMMA_EV_ERROR && streq(a.code, "bad_request"));
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

static int settings(void)
{
    dgemma_t *c = open_conn();
    dgemma_request_t *r = dgemma_request_text("settings");
    dgemma_event_t ev;
    json_t *acc, *s;
    static struct result res;

    CHECK(c && r);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 24), c);
    CHECK_RC(dgemma_request_set_int(r, "seed", 7), c);
    CHECK_RC(dgemma_request_set_int(r, "top_k", 20), c);
    CHECK_RC(dgemma_request_set_int(r, "canvas_length", 8), c);
    CHECK_RC(dgemma_request_set_int(r, "max_denoising_steps", 3), c);
    CHECK_RC(dgemma_request_set_int(r, "stability_threshold", 1), c);
    CHECK_RC(dgemma_request_set_real(r, "top_p", 0.9), c);
    CHECK_RC(dgemma_request_set_real(r, "entropy_bound", 0.5), c);
    CHECK_RC(dgemma_request_set_real(r, "confidence_threshold", 0.25), c);
    CHECK_RC(dgemma_request_set_real(r, "t_min", 0.0), c);
    CHECK_RC(dgemma_request_set_real(r, "t_max", 0.5), c);
    CHECK_RC(dgemma_request_add_stop(r, "never-in-the-output-1"), c);
    CHECK_RC(dgemma_request_add_stop(r, "never-in-the-output-2"), c);
    CHECK_RC(dgemma_request_add_stop_id(r, 500), c);
    CHECK_RC(dgemma_request_set_json(r, "{\"t_max\":0.75,\"max_tokens\":20}"), c);
    /* bad names are refused here, bad JSON too; the request is unchanged */
    CHECK(dgemma_request_set_int(r, "temperature", 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_int(r, "top_p", 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_real(r, "max_tokens", 1.0) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_real(r, "top_p", INFINITY) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_int(r, NULL, 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_json(r, "{\"top_p\":") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_json(r, "[1,2]") == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_json(r, NULL) == DGEMMA_E_INVAL);
    CHECK(dgemma_request_set_tag(r, "0123456789012345678901234567890123456789012345678901234567890"
                                    "12345678901234567890123456789012345678901234567890123456789"
                                    "0123456789") == DGEMMA_E_INVAL); /* 130 bytes */
    CHECK_RC(dgemma_submit(c, r), c);
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_ACCEPTED, "%s", ev.json);
    /* the daemon's view of the settings, from the accepted line */
    acc = json_loads(ev.json, 0, NULL);
    s = json_object_get(acc, "settings");
    CHECK(acc && json_is_object(s));
    CHECK(json_integer_value(json_object_get(s, "max_tokens")) == 20);
    CHECK(json_integer_value(json_object_get(s, "top_k")) == 20);
    CHECK(json_integer_value(json_object_get(s, "canvas_length")) == 8);
    CHECK(json_integer_value(json_object_get(s, "seed")) == 7);
    CHECK(json_real_value(json_object_get(s, "top_p")) == 0.9);
    CHECK(json_real_value(json_object_get(s, "t_max")) == 0.75);
    CHECK(json_array_size(json_object_get(s, "stop")) == 2);
    CHECK(streq(json_string_value(json_array_get(json_object_get(s, "stop"), 1)),
                "never-in-the-output-2"));
    {
        const json_t *ids = json_object_get(s, "stop_token_ids"), *v;
        size_t i;
        int found = 0;
        json_array_foreach(ids, i, v)
            found |= json_integer_value(v) == 500;
        CHECK(found);
    }
    json_decref(acc);
    CHECK(ev.seed == 7);
    for (;;) {
        NEXT(c, &ev);
        if (ev.kind == DGEMMA_EV_DONE)
            break;
        CHECK(ev.kind == DGEMMA_EV_CANVAS && ev.tokens <= 8);
    }
    CHECK(ev.completion_tokens <= 20);
    dgemma_request_free(r);
    /* a bad value is the daemon's to refuse: an error event, no id */
    r = dgemma_request_text("x");
    CHECK(r);
    CHECK_RC(dgemma_request_set_int(r, "top_k", -5), c);
    CHECK_RC(dgemma_request_set_tag(r, "bad-value"), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &res) == 0 && res.end == DGEMMA_EV_ERROR && res.id == 0);
    CHECKF(streq(res.code, "bad_request") && strstr(res.message, "top_k"), "%s: %s", res.code,
           res.message);
    CHECK(streq(res.tag, "bad-value"));
    dgemma_request_free(r);
    /* set_json with a name the daemon does not know */
    r = dgemma_request_text("x");
    CHECK(r);
    CHECK_RC(dgemma_request_set_json(r, "{\"temprature\":1}"), c);
    CHECK_RC(dgemma_submit(c, r), c);
    CHECK(collect(c, &res) == 0 && res.end == DGEMMA_EV_ERROR && streq(res.code, "bad_request"));
    CHECK(strstr(res.message, "temprature"));
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

static int two_tags(void)
{
    dgemma_t *c = open_conn();
    dgemma_request_t *ra = dgemma_request_text("the first of two"),
                     *rb = dgemma_request_text("the second of two, longer prompt");
    dgemma_event_t ev;
    struct {
        uint64_t id;
        int tokens, next_index, done;
        long long completion;
    } t[2] = {{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};

    CHECK(c && ra && rb);
    CHECK_RC(dgemma_request_set_tag(ra, "a"), c);
    CHECK_RC(dgemma_request_set_tag(rb, "b"), c);
    CHECK_RC(dgemma_request_set_int(ra, "max_tokens", 48), c);
    CHECK_RC(dgemma_request_set_int(rb, "max_tokens", 32), c);
    CHECK_RC(dgemma_request_set_json(ra, "{\"canvas_length\":16,\"max_denoising_steps\":3}"), c);
    CHECK_RC(dgemma_request_set_json(rb, "{\"canvas_length\":8,\"max_denoising_steps\":4}"), c);
    CHECK_RC(dgemma_submit(c, ra), c);
    CHECK_RC(dgemma_submit(c, rb), c);
    while (!t[0].done || !t[1].done) {
        int k;
        NEXT(c, &ev);
        CHECKF(streq(ev.tag, "a") || streq(ev.tag, "b"), "an event without our tag: %s", ev.json);
        k = ev.tag[0] == 'b';
        switch (ev.kind) {
        case DGEMMA_EV_ACCEPTED:
            CHECK(t[k].id == 0 && ev.id > 0);
            t[k].id = ev.id;
            break;
        case DGEMMA_EV_CANVAS:
            CHECK(ev.id == t[k].id && ev.index == t[k].next_index++);
            t[k].tokens += ev.tokens;
            break;
        case DGEMMA_EV_DONE:
            CHECK(ev.id == t[k].id && !t[k].done);
            t[k].done = 1;
            t[k].completion = ev.completion_tokens;
            break;
        default:
            CHECKF(0, "unexpected event: %s", ev.json);
        }
    }
    CHECK(t[0].id != t[1].id);
    CHECK(t[0].tokens == t[0].completion && t[1].tokens == t[1].completion);
    CHECK(t[0].completion <= 48 && t[1].completion <= 32);
    dgemma_request_free(ra);
    dgemma_request_free(rb);
    dgemma_close(c);
    return 0;
}

static dgemma_request_t *long_request(void)
{
    dgemma_request_t *r = dgemma_request_text("a long one");
    if (r && (dgemma_request_set_int(r, "max_tokens", 4000) != 0 ||
              dgemma_request_set_int(r, "max_denoising_steps", 30) != 0 ||
              dgemma_request_set_int(r, "seed", 5) != 0)) {
        dgemma_request_free(r);
        r = NULL;
    }
    return r;
}

static int cancel(void)
{
    dgemma_t *c = open_conn();
    dgemma_request_t *r = long_request();
    dgemma_event_t ev;
    uint64_t id;
    int acked = 0;

    CHECK(c && r);
    CHECK_RC(dgemma_submit(c, r), c);
    dgemma_request_free(r);
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_ACCEPTED);
    id = ev.id;
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_CANVAS && ev.id == id);
    CHECK_RC(dgemma_cancel(c, id), c);
    for (;;) {
        NEXT(c, &ev);
        if (ev.kind == DGEMMA_EV_DONE)
            break;
        if (ev.kind == DGEMMA_EV_CANCELLING) {
            CHECK(ev.id == id && !acked);
            acked = 1;
        } else {
            CHECKF(ev.kind == DGEMMA_EV_CANVAS, "unexpected event: %s", ev.json);
        }
    }
    CHECK(acked);
    CHECK(ev.id == id && streq(ev.finish_reason, "cancelled"));
    CHECK(ev.completion_tokens < 4000);
    /* an id not in flight */
    CHECK_RC(dgemma_cancel(c, id), c);
    NEXT(c, &ev);
    CHECKF(ev.kind == DGEMMA_EV_ERROR && streq(ev.code, "not_found"), "%s", ev.json);
    dgemma_close(c);
    return 0;
}

static int status(void)
{
    dgemma_t *c = open_conn();
    dgemma_event_t ev;
    json_t *j;
    CHECK(c);
    CHECK_RC(dgemma_status(c), c);
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_STATUS && ev.id == 0 && ev.tag == NULL);
    j = json_loads(ev.json, 0, NULL);
    CHECK(j);
    CHECK(json_integer_value(json_object_get(j, "running")) == 0);
    CHECK(json_integer_value(json_object_get(j, "connections")) >= 1);
    CHECK(json_integer_value(json_object_get(j, "finished")) >= 1);
    json_decref(j);
    dgemma_close(c);
    return 0;
}

/* The poll(2) pattern: wait on dgemma_fd, then take every event already
 * here with timeout 0 until DGEMMA_E_AGAIN. */
static int non_blocking(void)
{
    dgemma_t *c = open_conn();
    dgemma_request_t *r = dgemma_request_text("poll loop");
    dgemma_event_t ev;
    const double t0 = fixture_now_ms();
    int rc, done = 0, events = 0, wakeups = 0, tokens = 0;

    CHECK(c && r);
    CHECK_RC(dgemma_request_set_int(r, "max_tokens", 64), c);
    CHECK_RC(dgemma_request_set_int(r, "max_denoising_steps", 4), c);
    CHECK_RC(dgemma_request_set_int(r, "canvas_length", 16), c);
    CHECK_RC(dgemma_submit(c, r), c);
    dgemma_request_free(r);
    rc = dgemma_next_event(c, &ev, 0);
    if (rc == 0)
        events++, printf("# an event was already here right after the submit\n");
    else
        CHECKF(rc == DGEMMA_E_AGAIN, "%d: %s", rc, dgemma_errmsg(c));
    while (!done) {
        struct pollfd p = {dgemma_fd(c), POLLIN, 0};
        CHECK(fixture_now_ms() - t0 < WAIT_MS);
        CHECK(poll(&p, 1, 100) >= 0);
        if (!(p.revents & (POLLIN | POLLHUP)))
            continue;
        wakeups++;
        while ((rc = dgemma_next_event(c, &ev, 0)) == 0) {
            events++;
            if (ev.kind == DGEMMA_EV_CANVAS)
                tokens += ev.tokens;
            if (ev.kind == DGEMMA_EV_DONE) {
                CHECK(ev.completion_tokens == tokens);
                done = 1;
            }
        }
        CHECKF(rc == DGEMMA_E_AGAIN, "%d: %s", rc, dgemma_errmsg(c));
    }
    CHECK(events >= 3); /* accepted, a canvas, done */
    printf("# %d events in %d wake-ups\n", events, wakeups);
    /* and nothing more */
    CHECK(dgemma_next_event(c, &ev, 0) == DGEMMA_E_AGAIN);
    rc = dgemma_next_event(c, &ev, 50);
    CHECK(rc == DGEMMA_E_AGAIN && strstr(dgemma_errmsg(c), "50 ms"));
    dgemma_close(c);
    return 0;
}

/* SIGTERM while a long request runs: its done (cancelled after the 1 s
 * grace), then DGEMMA_E_CLOSED; an idle connection just closes. */
static int daemon_goes_away(void)
{
    dgemma_t *c = open_conn(), *idle = open_conn();
    dgemma_request_t *r = long_request();
    dgemma_event_t ev;
    int rc, st, saw_done = 0;

    CHECK(c && idle && r);
    CHECK_RC(dgemma_submit(c, r), c);
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_ACCEPTED);
    NEXT(c, &ev);
    CHECK(ev.kind == DGEMMA_EV_CANVAS);
    CHECK(kill(daemon_pid, SIGTERM) == 0);
    while ((rc = dgemma_next_event(c, &ev, WAIT_MS)) == 0) {
        if (ev.kind == DGEMMA_EV_DONE) {
            CHECK(!saw_done && streq(ev.finish_reason, "cancelled"));
            saw_done = 1;
        } else {
            CHECKF(ev.kind == DGEMMA_EV_CANVAS, "unexpected event: %s", ev.json);
        }
    }
    CHECKF(rc == DGEMMA_E_CLOSED, "%d (%s): %s", rc, dgemma_status_name(rc), dgemma_errmsg(c));
    CHECK(saw_done);
    /* it stays closed; sending fails without a SIGPIPE */
    CHECK(dgemma_next_event(c, &ev, 0) == DGEMMA_E_CLOSED);
    rc = dgemma_submit(c, r);
    CHECKF(rc == DGEMMA_E_CLOSED || rc == DGEMMA_E_IO, "submit after close: %d: %s", rc,
           dgemma_errmsg(c));
    rc = dgemma_next_event(idle, &ev, WAIT_MS);
    CHECKF(rc == DGEMMA_E_CLOSED, "the idle connection: %d: %s", rc, dgemma_errmsg(idle));
    CHECK(fixture_wait_exit(daemon_pid, &st) == 0);
    daemon_pid = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    /* and nobody is there any more */
    CHECK(dgemma_connect(c, sock_path, 0) == DGEMMA_E_CONNECT);
    dgemma_request_free(r);
    dgemma_close(idle);
    dgemma_close(c);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL); /* a send raising SIGPIPE would kill the test */
    TEST_CASE(null_handles);
    TEST_CASE(connect_missing);
    TEST_CASE(connect_full_queue);
    TEST_CASE(fake_daemon);
    TEST_CASE(overlong_line);
    TEST_CASE(event_out_of_memory);
    TEST_CASE(attach_out_of_memory);
    TEST_CASE(attach_after_error_with_id);
    TEST_CASE(connect_waits_for_daemon);
    if (daemon_pid > 0) {
        TEST_CASE(streamed_text);
        TEST_CASE(chat_not_streamed);
        TEST_CASE(token_ids);
        TEST_CASE(settings);
        TEST_CASE(two_tags);
        TEST_CASE(cancel);
        TEST_CASE(status);
        TEST_CASE(non_blocking);
        TEST_CASE(daemon_goes_away);
    }
    return fixture_finish(daemon_pid, log_path);
}
