/*
 * Description: the real dgemma-client against the real dgemmad.  generate
 * (plain text, --json events, settings flags, Ctrl-C cancelling); batch
 * with 50 lines including bad ones (every line gets exactly one result;
 * blank lines, whitespace only too, get none; bad JSON is said in plain
 * words); a request of a batch cancelled by `dgemma-client cancel` (a
 * result) and by the daemon stopping (none); a flag's setting the daemon
 * refuses (the batch stops, nothing written);
 * batch killed halfway (SIGKILL, SIGINT, SIGTERM) and run again (no id
 * twice, none missing); chat
 * driven through a pseudo-terminal (a reply holding control bytes reaches
 * the terminal without them; Ctrl-C at its prompt) and through a pipe;
 * Ctrl-C while canvases stream fast, and a second one while the daemon
 * does not answer; options and input refused (non-finite numbers, ids out
 * of range, a lost tag, a NUL byte, a read error (generate and chat), a
 * prompt not UTF-8, --settings holding the
 * request's own keys, batch --json); output to a full disk; status and
 * cancel; every exit code (0 done, 1 failed, 2 usage, 3 unreachable); the socket
 * options before the command word.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/fixture.h"

static char sock[600], log_path[600];
static pid_t daemon_pid;

/* Run the client with argv (NULL-terminated, without the program name),
 * stdin from input's in_len bytes (input may be NULL) or, where in_path is
 * set, from that file opened for reading; stdout to out_path where set;
 * collecting stdout and stderr.  Returns the exit status, or -1 if it did
 * not exit normally. */
static int run_client_io(const char *const *args, const char *input, size_t in_len,
                         const char *in_path, const char *out_path, char *out, size_t out_size,
                         char *err, size_t err_size)
{
    int in_p[2], out_p[2], err_p[2], st;
    size_t no = 0, ne = 0;
    pid_t pid;
    const char *argv[64];
    int n = 0;

    argv[n++] = fixture_bin("dgemma-client");
    for (const char *const *a = args; *a && n < 62; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    if (pipe(in_p) || pipe(out_p) || pipe(err_p))
        return -1;
    pid = fork();
    if (pid == 0) {
        dup2(in_p[0], 0);
        dup2(out_p[1], 1);
        dup2(err_p[1], 2);
        close(in_p[1]);
        close(out_p[0]);
        close(err_p[0]);
        if (in_path) {
            int fd = open(in_path, O_RDONLY);
            if (fd < 0 || dup2(fd, 0) < 0)
                _exit(126);
        }
        if (out_path) {
            int fd = open(out_path, O_WRONLY);
            if (fd < 0 || dup2(fd, 1) < 0)
                _exit(126);
        }
        setenv("DGEMMA_SOCKET", sock, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in_p[0]);
    close(out_p[1]);
    close(err_p[1]);
    if (input) {
        size_t len = in_len, off = 0;
        signal(SIGPIPE, SIG_IGN);
        while (off < len) {
            ssize_t w = write(in_p[1], input + off, len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
    }
    close(in_p[1]);
    for (;;) {
        struct pollfd p[2] = {{out_p[0], POLLIN, 0}, {err_p[0], POLLIN, 0}};
        int open_fds = 0;
        if (poll(p, 2, FIXTURE_WAIT_MS) <= 0)
            break;
        for (int k = 0; k < 2; k++) {
            char *buf = k ? err : out;
            size_t *len = k ? &ne : &no, size = k ? err_size : out_size;
            if (p[k].revents & (POLLIN | POLLHUP)) {
                ssize_t r = read(p[k].fd, buf + *len, size - 1 - *len);
                if (r > 0) {
                    *len += (size_t)r;
                    open_fds++;
                } else {
                    p[k].fd = -1;
                }
            }
        }
        if (!open_fds && !(p[0].revents & POLLIN) && !(p[1].revents & POLLIN))
            break;
        if (no >= out_size - 1 || ne >= err_size - 1)
            break;
    }
    out[no] = '\0';
    err[ne] = '\0';
    close(out_p[0]);
    close(err_p[0]);
    if (fixture_wait_exit(pid, &st) < 0 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

static int run_client(const char *const *args, const char *input, char *out, size_t out_size,
                      char *err, size_t err_size)
{
    return run_client_io(args, input, input ? strlen(input) : 0, NULL, NULL, out, out_size, err,
                         err_size);
}

static char OUT[1 << 20], ERR[1 << 16];

static const char *const DAEMON_OPTS[] = {"max_batch=4", "queue_max=64", "pin_workers=false",
                                          "tick=0.05", "shutdown_grace=1", "log_level=debug",
                                          NULL};

static int start(void)
{
    snprintf(sock, sizeof sock, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    daemon_pid = fixture_spawn(sock, log_path, DAEMON_OPTS);
    CHECKF(fixture_wait_ready(daemon_pid, sock) == 0, "no daemon; log %s", log_path);
    return 0;
}

static int generate_plain_and_json(void)
{
    const char *plain[] = {"generate", "--max-tokens", "20", "--seed", "3",
                           "--max-denoising-steps", "3", "Hello", "there", NULL};
    const char *json[] = {"--json", "--max-tokens", "20", "--seed", "3",
                          "--max-denoising-steps", "3", "Hello", "there", NULL};
    int rc = run_client(plain, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    CHECK(strlen(OUT) > 1 && OUT[strlen(OUT) - 1] == '\n');
    CHECKF(strstr(ERR, "dgemma-client: request ") && strstr(ERR, ": length; ") &&
               strstr(ERR, " prompt + 20 tokens in "), "%s", ERR);
    /* 20 tokens fit one canvas of the random model's 32: said in the singular */
    CHECKF(strstr(ERR, " tokens in 1 canvas, "), "%s", ERR);
    /* --json: one event per line, the last the done, with the same text */
    {
        char plain_text[4096];
        snprintf(plain_text, sizeof plain_text, "%.*s", (int)strlen(OUT) - 1, OUT);
        rc = run_client(json, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0, "exit %d: %s", rc, ERR);
        {
            char *line = OUT, *nl, text[4096] = "";
            int n = 0, done = 0;
            while ((nl = strchr(line, '\n'))) {
                json_t *e;
                *nl = '\0';
                e = json_loads(line, 0, NULL);
                CHECKF(e && json_integer_value(json_object_get(e, "v")) == 1, "line: %s", line);
                if (!strcmp(json_string_value(json_object_get(e, "event")), "canvas"))
                    strncat(text, json_string_value(json_object_get(e, "text")),
                            sizeof text - strlen(text) - 1);
                done = !strcmp(json_string_value(json_object_get(e, "event")), "done");
                json_decref(e);
                n++;
                line = nl + 1;
            }
            CHECK(n >= 3 && done && !strcmp(text, plain_text));
        }
    }
    return 0;
}

/* generate, chat and batch: -h/--help prints the command's usage and
 * then the settings flags to standard output, exit 0, with nothing sent;
 * a bad common option (--wait's value) is a usage error, exit 2, with the
 * reason on standard error. */
static int command_help_and_common_usage(void)
{
    static const char *const cmds[][2] = {{"generate", "usage: dgemma-client [generate]"},
                                          {"chat", "usage: dgemma-client chat"},
                                          {"batch", "usage: dgemma-client batch"}};
    for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
        const char *help[] = {"-s", "/nonexistent/d.sock", cmds[k][0], "--help", NULL};
        const char *help_h[] = {cmds[k][0], "-h", NULL};
        const char *bad_wait[] = {cmds[k][0], "--wait", "soon", NULL};
        const char *no_value[] = {cmds[k][0], "--socket", NULL};
        const char *usage, *settings;
        int rc = run_client(help, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        usage = strstr(OUT, cmds[k][1]);
        settings = strstr(OUT, "generation settings (dgemmad(8)):");
        CHECKF(rc == 0 && usage && settings && usage < settings && strstr(settings, "--top-p") &&
                   !ERR[0],
               "%s --help: exit %d: %s / %s", cmds[k][0], rc, OUT, ERR);
        rc = run_client(help_h, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0 && strstr(OUT, cmds[k][1]) && strstr(OUT, "--max-tokens"),
               "%s -h: exit %d: %s", cmds[k][0], rc, OUT);
        rc = run_client(bad_wait, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "--wait: 'soon' is not a number of seconds") && !OUT[0],
               "%s --wait soon: exit %d: %s", cmds[k][0], rc, ERR);
        rc = run_client(no_value, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "--socket needs a value"), "%s --socket: exit %d: %s",
               cmds[k][0], rc, ERR);
    }
    return 0;
}

static int exit_codes(void)
{
    const char *bad_value[] = {"--top-p", "7", "x", NULL};
    const char *usage[] = {"--no-such-flag", NULL};
    const char *usage2[] = {"batch", "--input", "x", NULL};
    const char *nowhere[] = {"-s", "/nonexistent/d.sock", "hello", NULL};
    const char *status[] = {"status", NULL};
    const char *cancel_none[] = {"cancel", "987654", NULL};
    int rc;
    rc = run_client(bad_value, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "bad_request: top_p"), "%d: %s", rc, ERR);
    CHECK(run_client(usage, NULL, OUT, sizeof OUT, ERR, sizeof ERR) == 2);
    CHECK(run_client(usage2, NULL, OUT, sizeof OUT, ERR, sizeof ERR) == 2);
    rc = run_client(nowhere, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 3 && strstr(ERR, "/nonexistent/d.sock"), "%d: %s", rc, ERR);
    rc = run_client(status, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0 && strstr(OUT, "model") && strstr(OUT, "running"), "%d: %s", rc, ERR);
    /* the table reads as text: a string bare, the uptime to a tenth */
    {
        const char *up = strstr(OUT, "\nuptime_s ");
        unsigned whole, tenth;
        char end;
        CHECKF(strstr(OUT, "\nbackend            cpu\n"), "%s", OUT);
        CHECKF(up && sscanf(up, " uptime_s %u.%1u%c", &whole, &tenth, &end) == 3 && end == '\n',
               "%s", OUT);
    }
    rc = run_client(cancel_none, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "not in flight"), "%d: %s", rc, ERR);
    /* the socket options may come before the command word */
    {
        const char *status_after[] = {"-s", sock, "--wait", "1", "status", NULL};
        const char *gen_after[] = {"--socket", sock, "generate", "--max-tokens", "4",
                                   "--max-denoising-steps", "2", "x", NULL};
        const char *cancel_after[] = {"-s", sock, "cancel", "987654", NULL};
        const char *prompt_word[] = {"-s", sock, "--max-tokens", "4", "--max-denoising-steps", "2",
                                     "status", NULL};
        rc = run_client(status_after, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0 && strstr(OUT, "model") && strstr(OUT, "running"), "%d: %s", rc, ERR);
        /* a generation summary is the proof; the random model may stop
         * before 4 tokens, so the count is not asserted here */
        rc = run_client(gen_after, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0 && strstr(ERR, " prompt + ") && strstr(ERR, " tokens in "), "%d: %s", rc,
               ERR);
        rc = run_client(cancel_after, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "not in flight"), "%d: %s", rc, ERR);
        /* after a generation setting, "status" is prompt text */
        rc = run_client(prompt_word, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0 && strstr(ERR, " prompt + ") && strstr(ERR, " tokens in "), "%d: %s", rc,
               ERR);
    }
    return 0;
}

/* Run the client with args (NULL-terminated, after the program name),
 * send SIGINT once its first text arrives, and require the daemon's
 * cancel: exit 1 and ": cancelled;" in the summary. */
static int interrupted_after_first_text(const char *const *args)
{
    int out_p[2], err_p[2], st;
    char buf[4096];
    const char *argv[32];
    int n = 0;
    ssize_t got;
    pid_t pid;
    argv[n++] = "dgemma-client";
    for (const char *const *a = args; *a && n < 31; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    CHECK(pipe(out_p) == 0 && pipe(err_p) == 0);
    pid = fork();
    if (pid == 0) {
        dup2(out_p[1], 1);
        dup2(err_p[1], 2);
        setenv("DGEMMA_SOCKET", sock, 1);
        execv(fixture_bin("dgemma-client"), (char *const *)argv);
        _exit(127);
    }
    close(out_p[1]);
    close(err_p[1]);
    got = read(out_p[0], buf, sizeof buf);
    CHECK(got > 0);
    CHECK(kill(pid, SIGINT) == 0);
    /* (keep reading, so that the client never blocks on a full pipe) */
    while (read(out_p[0], buf, sizeof buf) > 0)
        ;
    CHECK(fixture_wait_exit(pid, &st) == 0 && WIFEXITED(st));
    got = read(err_p[0], buf, sizeof buf - 1);
    buf[got > 0 ? got : 0] = '\0';
    CHECKF(WEXITSTATUS(st) == 1 && strstr(buf, ": cancelled;"), "exit %d: %s",
           WEXITSTATUS(st), buf);
    close(out_p[0]);
    close(err_p[0]);
    return 0;
}

static int generate_interrupted(void)
{
    /* Ctrl-C: the client cancels, the daemon says cancelled, exit 1.  (Seed
     * 1: its first 256 tokens hold no stop token, so the request is still
     * running when the interrupt comes; without a seed the random model
     * sometimes stopped in its first canvas.) */
    const char *args[] = {"--max-tokens", "4000", "--max-denoising-steps", "30", "--seed", "1",
                          "a long one", NULL};
    return interrupted_after_first_text(args);
}

/* Ctrl-C while canvases keep coming (short canvases, each well inside the
 * client's 200 ms wait): cancelled all the same.  It used to be looked at
 * only when no event came for 200 ms, and the request ran to its end. */
static int generate_interrupted_fast_canvases(void)
{
    const char *args[] = {"--max-tokens", "4000", "--canvas-length", "8",
                          "--max-denoising-steps", "2", "--seed", "1", "a long one", NULL};
    return interrupted_after_first_text(args);
}

/* A second Ctrl-C ends the client at once, while the daemon (stopped here)
 * cannot answer the first one's cancel. */
static int second_interrupt(void)
{
    int out_p[2], st = 0;
    char buf[4096];
    pid_t pid;
    double t0;
    CHECK(pipe(out_p) == 0);
    pid = fork();
    if (pid == 0) {
        dup2(out_p[1], 1);
        setenv("DGEMMA_SOCKET", sock, 1);
        execl(fixture_bin("dgemma-client"), "dgemma-client", "--max-tokens", "4000",
              "--max-denoising-steps", "30", "--seed", "1", "a long one", (char *)NULL);
        _exit(127);
    }
    close(out_p[1]);
    CHECK(read(out_p[0], buf, sizeof buf) > 0);
    CHECK(kill(daemon_pid, SIGSTOP) == 0);
    CHECK(kill(pid, SIGINT) == 0);
    usleep(500 * 1000);
    {
        const pid_t w = waitpid(pid, &st, WNOHANG); /* still waiting for the daemon */
        if (w != 0)
            kill(daemon_pid, SIGCONT);
        CHECKF(w == 0, "the client ended after one Ctrl-C (status 0x%x)", st);
    }
    t0 = fixture_now_ms();
    CHECK(kill(pid, SIGINT) == 0);
    {
        const int rc = fixture_wait_exit(pid, &st);
        kill(daemon_pid, SIGCONT);
        CHECK(rc == 0);
    }
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT, "status 0x%x", st);
    CHECKF(fixture_now_ms() - t0 < 2000, "%.0f ms after the second Ctrl-C",
           fixture_now_ms() - t0);
    close(out_p[0]);
    return 0;
}

/* Options and input the client refuses, each with its exit code and
 * message (each of these used to be taken and lost, or misreported). */
static int refused_input(void)
{
    static char long_tag[200];
    static const struct {
        const char *args[12];
        int want;
        const char *says;
    } cases[] = {
        {{"--top-p", "nan", "x"}, 2, "--top-p: 'nan' is not a finite number"},
        {{"--t-min", "1e999", "x"}, 2, "--t-min: '1e999' is not a finite number"},
        {{"--seed", "18446744073709551616", "x"}, 2, "--seed: '18446744073709551616' is out of range"},
        {{"cancel", "99999999999999999999999"}, 2, "is not a request id"},
        {{"cancel", "9223372036854775808"}, 2, "is not a request id"},
        {{"--tag", long_tag, "x"}, 2, "--tag: "},
        {{"--max-tokens", "4", "--tag"}, 2, "--tag needs a value"},
        {{"--chat", "--system"}, 2, "--system needs a value"},
        {{"--ids"}, 2, "--ids needs a value"},
        {{"chat", "--system"}, 2, "--system needs a value"},
        {{"chat", "--json"}, 2, "chat: --json is for generate"},
        {{"chat", "--system", "\xff"}, 2, "--system: "},
        {{"--settings", "{\"prompt\":\"x\"}", "y"}, 2, "'prompt' is not a generation setting"},
        {{"--settings", "{\"stream\":false}", "y"}, 2, "'stream' is not a generation setting"},
    };
    memset(long_tag, 't', 129);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int rc = run_client(cases[i].args, "", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == cases[i].want && strstr(ERR, cases[i].says), "case %zu (%s): exit %d: %s",
               i, cases[i].args[0], rc, ERR);
    }
    /* standard input: a NUL byte (2), a read error (1) */
    {
        const char *args[] = {"--max-tokens", "4", "--seed", "1", NULL};
        int rc = run_client_io(args, "Tell me\0 more", 14, NULL, NULL, OUT, sizeof OUT, ERR,
                               sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "the prompt holds a NUL byte (at byte 7"), "exit %d: %s",
               rc, ERR);
        rc = run_client_io(args, NULL, 0, test_tmpdir(), NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "reading the prompt from standard input: "), "exit %d: %s",
               rc, ERR);
    }
    /* chat: a read error is not the end of the conversation (exit 1, said) */
    {
        const char *args[] = {"chat", "--max-tokens", "4", NULL};
        const int rc = run_client_io(args, NULL, 0, test_tmpdir(), NULL, OUT, sizeof OUT, ERR,
                                     sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "reading standard input: "), "exit %d: %s", rc, ERR);
    }
    /* a prompt that is not UTF-8: a usage error that says so */
    {
        const char *args[] = {"--max-tokens", "4", "a\xff", NULL};
        const int rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "the prompt is not valid UTF-8"), "exit %d: %s", rc, ERR);
    }
    /* a chat line that is not UTF-8: said, and (off a terminal) exit 1 */
    {
        const char *args[] = {"chat", "--max-tokens", "4", NULL};
        int rc = run_client(args, "a\xff\nb\n", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "UTF-8"), "exit %d: %s", rc, ERR);
    }
    return 0;
}

/* Output that cannot be written: exit 1 with the reason, never 0. */
static int output_full(void)
{
    const char *gen[] = {"--max-tokens", "8", "--max-denoising-steps", "2", "--seed", "1", "hi",
                         NULL};
    const char *json[] = {"--json", "--max-tokens", "8", "--max-denoising-steps", "2", "--seed",
                          "1", "hi", NULL};
    const char *status[] = {"status", NULL};
    const char *chat[] = {"chat", "--max-tokens", "8", "--max-denoising-steps", "2", "--seed", "1",
                          NULL};
    const char *const *cases[] = {gen, json, status, chat};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int rc = run_client_io(cases[i], i == 3 ? "hello\n" : "", i == 3 ? 6 : 0, NULL,
                                     "/dev/full", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "writing the output: No space left on device"),
               "case %zu: exit %d: %s", i, rc, ERR);
    }
    return 0;
}

/* --stop after a single stop string from --settings: both are sent (the
 * accepted event echoes the settings) */
static int stop_after_settings(void)
{
    const char *args[] = {"--json", "--settings", "{\"stop\":\"xx\"}", "--stop", "yy",
                          "--max-tokens", "4", "--max-denoising-steps", "2", "--seed", "1", "hi",
                          NULL};
    const int rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0 && strstr(OUT, "\"stop\":[\"xx\",\"yy\"]"), "exit %d: %.400s %s", rc,
           OUT, ERR);
    return 0;
}

/* The batch input: 50 lines, 5 of them bad. */
static void batch_input(const char *path)
{
    FILE *f = fopen(path, "w");
    for (int i = 1; i <= 50; i++) {
        if (i == 7)
            fprintf(f, "this is not json\n");
        else if (i == 13)
            fprintf(f, "{\"prompt\":\"no id\"}\n");
        else if (i == 21)
            fprintf(f, "{\"id\":\"q3\",\"prompt\":\"the same id again\"}\n");
        else if (i == 30)
            fprintf(f, "{\"id\":\"q30\",\"prompt\":\"x\",\"top_p\":9}\n");
        else if (i == 41)
            fprintf(f, "{\"id\":\"q41\"}\n");
        else if (i % 5 == 0)
            fprintf(f, "{\"id\":\"q%d\",\"messages\":[{\"role\":\"user\",\"content\":\"hi %d\"}],"
                       "\"max_tokens\":12,\"seed\":%d}\n", i, i, i);
        else if (i % 7 == 0)
            fprintf(f, "{\"id\":%d,\"prompt_ids\":[2,%d,%d],\"max_tokens\":12,\"seed\":%d}\n", i,
                    10 + i, 20 + i, i);
        else
            fprintf(f, "{\"id\":\"q%d\",\"prompt\":\"question %d\",\"max_tokens\":12,\"seed\":%d}\n",
                    i, i, i);
    }
    fclose(f);
}

/* Count the output's results: each key (id or line) must occur once. */
static int check_results(const char *path, int *n_results, int *n_errors, int *n_dups)
{
    FILE *f = fopen(path, "r");
    char line[1 << 16];
    json_t *seen;
    *n_results = *n_errors = *n_dups = 0;
    if (!f)
        return -1;
    seen = json_object();
    while (fgets(line, sizeof line, f)) {
        json_t *r = json_loads(line, JSON_ALLOW_NUL, NULL), *id;
        char *key;
        if (!json_is_object(r)) {
            /* (a line being written right now) */
            json_decref(r);
            json_decref(seen);
            fclose(f);
            return -1;
        }
        id = json_object_get(r, "id");
        key = id ? json_dumps(id, JSON_ENCODE_ANY) : NULL;
        if (!key) {
            char k[32];
            snprintf(k, sizeof k, "line:%lld",
                     (long long)json_integer_value(json_object_get(r, "line")));
            key = strdup(k);
        }
        if (json_object_get(seen, key))
            (*n_dups)++;
        json_object_set_new(seen, key, json_true());
        free(key);
        (*n_results)++;
        *n_errors += json_object_get(r, "error") != NULL;
        json_decref(r);
    }
    fclose(f);
    json_decref(seen);
    return 0;
}

static int batch_with_bad_lines(void)
{
    char in[600], out[600];
    int rc, n, errors, dups;
    snprintf(in, sizeof in, "%s", test_path("batch-in.jsonl"));
    snprintf(out, sizeof out, "%s", test_path("batch-out.jsonl"));
    batch_input(in);
    {
        const char *args[] = {"batch", "--input", in, "--output", out, "--max-denoising-steps",
                              "3", NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1, "exit %d: %s", rc, ERR);
    }
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 50 && errors == 5 && dups == 0, "%d results, %d errors, %d duplicates", n, errors,
           dups);
    CHECK(strstr(ERR, "50/50 done, 5 failed"));
    /* a second run has nothing to do and says the same */
    {
        const char *args[] = {"batch", "--input", in, "--output", out, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECK(rc == 1 && check_results(out, &n, &errors, &dups) == 0 && n == 50 && dups == 0);
    }
    /* all good: exit 0 */
    {
        const char *args[] = {"batch", "--input", "-", "--output", test_path("good.jsonl"),
                              "--max-tokens", "8", "--max-denoising-steps", "2", NULL};
        rc = run_client(args, "{\"id\":1,\"prompt\":\"a\"}\n{\"id\":2,\"prompt\":\"b\"}\n", OUT,
                        sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    }
    /* daemon unreachable: 3, and nothing lost */
    {
        const char *args[] = {"batch", "-s", "/nonexistent/x.sock", "--input", "-", "--output",
                              test_path("none.jsonl"), NULL};
        rc = run_client(args, "{\"id\":1,\"prompt\":\"a\"}\n", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECK(rc == 3);
    }
    return 0;
}

/* A reply whose text holds a NUL (sent and written as \u0000) is still a
 * result: the batch ends 0 with it written, and a second run finds it done
 * (runs nothing, writes no duplicate). */
static int batch_text_with_nul(void)
{
    char out[600];
    /* (seeded: this reply's text holds a NUL and a 0x1c; chat_terminal's) */
    const char *in = "{\"id\":\"n\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"second\"}],\"max_tokens\":16,"
                     "\"max_denoising_steps\":2,\"seed\":3492929928041919275}\n";
    const char *args[] = {"batch", "--input", "-", "--output", out, NULL};
    int rc, n, errors, dups;
    snprintf(out, sizeof out, "%s", test_path("nul.jsonl"));
    for (int run = 0; run < 2; run++) {
        rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0, "run %d: exit %d: %s", run, rc, ERR);
        CHECKF(strstr(ERR, "1/1 done, 0 failed"), "run %d: %s", run, ERR);
        CHECK(check_results(out, &n, &errors, &dups) == 0);
        CHECKF(n == 1 && errors == 0 && dups == 0, "run %d: %d results, %d errors, %d duplicates",
               run, n, errors, dups);
    }
    {
        FILE *f = fopen(out, "r");
        char line[1 << 16] = "";
        json_t *r, *text;
        CHECK(f && fgets(line, sizeof line, f));
        fclose(f);
        r = json_loads(line, JSON_ALLOW_NUL, NULL);
        text = json_object_get(r, "text");
        CHECKF(json_is_string(text) && memchr(json_string_value(text), '\0',
                                               json_string_length(text)),
               "no NUL in the result's text: %s", line);
        json_decref(r);
    }
    return 0;
}

/* A batch ended by sig halfway (SIGKILL; SIGINT and SIGTERM, which it
 * does not catch, as dgemma-client(1) says) keeps the results written so
 * far, whole, and the next run finishes: no id twice, none missing. */
static int batch_resume_after(int sig)
{
    char in[600], out[600], name[64];
    int st, n, errors, dups;
    pid_t pid;
    double t0;
    snprintf(in, sizeof in, "%s", test_path("batch-in.jsonl"));
    snprintf(name, sizeof name, "resume-out-%d.jsonl", sig);
    snprintf(out, sizeof out, "%s", test_path(name));
    batch_input(in);
    pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        signal(SIGINT, SIG_DFL); /* (as at a terminal or under cron) */
        signal(SIGTERM, SIG_DFL);
        setenv("DGEMMA_SOCKET", sock, 1);
        execl(fixture_bin("dgemma-client"), "dgemma-client", "batch", "--input", in, "--output",
              out, "--parallel", "4", "--max-denoising-steps", "3", (char *)NULL);
        _exit(127);
    }
    /* kill it once about half of the results are written */
    t0 = fixture_now_ms();
    for (;;) {
        if (check_results(out, &n, &errors, &dups) == 0 && n >= 25)
            break;
        CHECK(fixture_now_ms() - t0 < FIXTURE_WAIT_MS && waitpid(pid, &st, WNOHANG) == 0);
        usleep(2000);
    }
    CHECK(kill(pid, sig) == 0);
    waitpid(pid, &st, 0);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == sig, "signal %d: status 0x%x", sig, st);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    printf("# signal %d ended the batch at %d of 50 results\n", sig, n);
    CHECK(n < 50 && dups == 0);
    {
        const char *args[] = {"batch", "--input", in, "--output", out, "--parallel", "4",
                              "--max-denoising-steps", "3", NULL};
        int rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1, "exit %d: %s", rc, ERR);
    }
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 50 && errors == 5 && dups == 0, "%d results, %d errors, %d duplicates", n, errors,
           dups);
    return 0;
}

static int batch_resume_after_kill(void)
{
    return batch_resume_after(SIGKILL);
}

static int batch_resume_after_sigint_sigterm(void)
{
    return batch_resume_after(SIGINT) || batch_resume_after(SIGTERM);
}

/* The whole of a file (up to cap - 1 bytes, NUL-terminated); its length,
 * or -1. */
static long slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n;
    if (!f)
        return -1;
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (long)n;
}

/* batch --json (after the command word or before it) is a usage error,
 * exit 2, with nothing run or written: it used to be taken and ignored. */
static int batch_json_refused(void)
{
    char out[600];
    const char *after[] = {"batch", "--json", "--input", "-", "--output", out, NULL};
    const char *before[] = {"--json", "batch", "--input", "-", "--output", out, NULL};
    const char *const *cases[] = {after, before};
    struct stat st;
    snprintf(out, sizeof out, "%s", test_path("json-out.jsonl"));
    for (size_t i = 0; i < 2; i++) {
        const int rc = run_client(cases[i], "{\"id\":1,\"prompt\":\"a\",\"max_tokens\":4}\n",
                                  OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "batch: --json is for generate and status"),
               "case %zu: exit %d: %s", i, rc, ERR);
        CHECKF(stat(out, &st) != 0, "case %zu: the output was made", i);
    }
    return 0;
}

/* A line that is JSON the batch cannot take (a string holding \u0000, a
 * key twice) or not JSON at all gets a bad_line result in plain words:
 * never jansson's own, which name flags of its API (JSON_ALLOW_NUL), and
 * the column without the parser's "line 1" (the result names the line). */
static int batch_bad_json_words(void)
{
    char out[600];
    const char *in = "{\"id\":\"z\",\"prompt\":\"a\\u0000b\"}\n"
                     "{\"id\":\"d\",\"prompt\":\"a\",\"prompt\":\"b\"}\n"
                     "{\"id\":\"t\",\n";
    const char *args[] = {"batch", "--input", "-", "--output", out, NULL};
    int rc, n, errors, dups;
    snprintf(out, sizeof out, "%s", test_path("words-out.jsonl"));
    rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "3/3 done, 3 failed"), "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 3 && errors == 3 && dups == 0, "%d results, %d errors", n, errors);
    CHECK(slurp(out, OUT, sizeof OUT) > 0);
    CHECKF(!strstr(OUT, "JSON_") && !strstr(OUT, "line 1 "), "%s", OUT);
    CHECKF(strstr(OUT, "{\"line\":1,\"error\":{\"code\":\"bad_line\",\"message\":\"the line: a "
                       "string holds \\\\u0000 (a NUL character)") &&
               strstr(OUT, "{\"line\":2,\"error\":{\"code\":\"bad_line\",\"message\":\"the line: "
                           "malformed JSON at column ") &&
               strstr(OUT, "duplicate object key") &&
               strstr(OUT, "{\"line\":3,\"error\":{\"code\":\"bad_line\""), "%s", OUT);
    return 0;
}

/* Lines of nothing but spaces, tabs and CRs are skipped as empty ones are
 * (they used to get bad_line results), and the lines after them keep their
 * numbers in their results. */
/* The first "prompt_tokens": N in s (-1: none). */
static long long prompt_tokens_in(const char *s)
{
    const char *p = strstr(s, "\"prompt_tokens\":");
    return p ? strtoll(p + 16, NULL, 10) : -1;
}

/* --no-parse-special: the prompt's typed markers are text (more prompt
 * tokens), for generate and for batch, whose lines of ids do not take the
 * flag (it is refused with ids, and would have stopped the batch). */
static int no_parse_special(void)
{
    const char *typed = "say <|turn>model and <mask>";
    const char *gen[] = {"generate", "--json", "--max-tokens", "2", "--max-denoising-steps", "2",
                         "--seed", "1", typed, NULL, NULL};
    char out[600], in[300];
    const char *batch[] = {"batch", "--input", "-", "--output", out, "--max-denoising-steps", "2",
                           NULL, NULL};
    long long parsed, plain;
    int rc, n, errors, dups;

    rc = run_client(gen, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    parsed = prompt_tokens_in(OUT);
    gen[8] = "--no-parse-special";
    gen[9] = typed;
    rc = run_client(gen, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    plain = prompt_tokens_in(OUT);
    CHECKF(parsed > 0 && plain > parsed, "%lld prompt tokens plain, %lld parsed", plain, parsed);

    snprintf(in, sizeof in, "{\"id\":1,\"prompt\":\"%s\",\"max_tokens\":2}\n"
             "{\"id\":2,\"prompt_ids\":[2,5,6],\"max_tokens\":2}\n", typed);
    snprintf(out, sizeof out, "%s", test_path("plain-out.jsonl"));
    batch[7] = "--no-parse-special";
    rc = run_client(batch, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 2 && errors == 0, "%d results, %d errors", n, errors);
    CHECK(slurp(out, OUT, sizeof OUT) > 0);
    CHECKF(prompt_tokens_in(strstr(OUT, "{\"id\":1,")) == plain, "%s", OUT);
    CHECKF(prompt_tokens_in(strstr(OUT, "{\"id\":2,")) == 3, "%s", OUT);
    return 0;
}

static int batch_blank_lines(void)
{
    char out[600];
    const char *in = " \t \r\n"
                     "not json\n"
                     "\n"
                     "\t\n"
                     "{\"id\":\"b1\",\"prompt\":\"x\",\"max_tokens\":4,\"max_denoising_steps\":2}\n"
                     "   \n"
                     "{\"prompt\":\"no id\"}\n";
    const char *args[] = {"batch", "--input", "-", "--output", out, NULL};
    int rc, n, errors, dups;
    snprintf(out, sizeof out, "%s", test_path("blank-out.jsonl"));
    rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "3/3 done, 2 failed"), "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 3 && errors == 2 && dups == 0, "%d results, %d errors", n, errors);
    CHECK(slurp(out, OUT, sizeof OUT) > 0);
    CHECKF(strstr(OUT, "{\"line\":2,\"error\":{\"code\":\"bad_line\"") &&
               strstr(OUT, "{\"line\":7,\"error\":{\"code\":\"bad_line\"") &&
               strstr(OUT, "{\"id\":\"b1\",\"finish_reason\":"), "%s", OUT);
    return 0;
}

/* What a batch must not take as it is: a line longer than the daemon
 * reads (it answers without a tag: that line's result is too_large, and
 * the next line runs, where the batch used to wait for ever); --input and
 * --output naming one file (nothing run, and the input left whole, where
 * its last line was cut as a torn result); an input that cannot be read
 * (a directory; a read error midway, not taken for its end); an output
 * that is not a regular file; the reason an output cannot be opened (it
 * was the terminal test's ENOTTY); a byte-order mark; and error results
 * of ids this input does not hold, which do not make it fail. */
static int batch_refusals(void)
{
    char in[600], out[600], before[256], after[256];
    static char big[(1 << 20) + 4096];
    int rc, n, errors, dups;
    FILE *f;

    /* a line past max_line_bytes (1 MiB), then a short one */
    snprintf(in, sizeof in, "%s", test_path("long-in.jsonl"));
    snprintf(out, sizeof out, "%s", test_path("long-out.jsonl"));
    f = fopen(in, "w");
    CHECK(f);
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fprintf(f, "{\"id\":\"big\",\"prompt\":\"%s\",\"max_tokens\":4}\n", big);
    fprintf(f, "{\"id\":\"small\",\"prompt\":\"hi\",\"max_tokens\":4,\"max_denoising_steps\":2}\n");
    CHECK(fclose(f) == 0);
    {
        const char *args[] = {"batch", "--input", in, "--output", out, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1, "exit %d: %s", rc, ERR);
    }
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 2 && errors == 1 && dups == 0, "%d results, %d errors", n, errors);
    CHECK(slurp(out, OUT, sizeof OUT) > 0);
    CHECKF(strstr(OUT, "{\"id\":\"big\",\"error\":{\"code\":\"too_large\"") &&
               strstr(OUT, "{\"id\":\"small\",\"finish_reason\":"), "%s", OUT);

    /* one file for both: refused, the file as it was */
    snprintf(in, sizeof in, "%s", test_path("same.jsonl"));
    f = fopen(in, "w");
    CHECK(f && fputs("{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"y\"}", f) >= 0 &&
          fclose(f) == 0);
    CHECK(slurp(in, before, sizeof before) > 0);
    {
        const char *args[] = {"batch", "--input", in, "--output", in, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "are the same file"), "exit %d: %s", rc, ERR);
    }
    CHECK(slurp(in, after, sizeof after) > 0 && !strcmp(before, after));

    /* inputs that cannot be read: exit 2 (a directory), 1 (a read error) */
    snprintf(out, sizeof out, "%s", test_path("unread-out.jsonl"));
    {
        const char *args[] = {"batch", "--input", test_tmpdir(), "--output", out, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "is a directory"), "exit %d: %s", rc, ERR);
    }
    {
        /* (reading /proc/self/mem at offset 0 fails: EIO) */
        const char *args[] = {"batch", "--input", "/proc/self/mem", "--output", out, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "cannot read it after line 0"), "exit %d: %s", rc, ERR);
    }
    /* outputs: a FIFO; a path that cannot be opened, with its reason */
    snprintf(out, sizeof out, "%s", test_path("fifo"));
    CHECK(mkfifo(out, 0600) == 0);
    {
        const char *args[] = {"batch", "--input", "-", "--output", out, NULL};
        rc = run_client(args, "{\"id\":1,\"prompt\":\"a\"}\n", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "not a regular file"), "exit %d: %s", rc, ERR);
    }
    {
        const char *args[] = {"batch", "--input", "-", "--output", "/nonexistent/dir/out.jsonl",
                              NULL};
        rc = run_client(args, "{\"id\":1,\"prompt\":\"a\"}\n", OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 2 && strstr(ERR, "No such file or directory"), "exit %d: %s", rc, ERR);
    }
    /* a byte-order mark; another input's error result in the output */
    snprintf(out, sizeof out, "%s", test_path("bom-out.jsonl"));
    f = fopen(out, "w");
    CHECK(f && fputs("{\"id\":\"zzz\",\"error\":{\"code\":\"x\",\"message\":\"y\"}}\n", f) >= 0 &&
          fclose(f) == 0);
    {
        const char *args[] = {"batch", "--input", "-", "--output", out, "--max-tokens", "4",
                              "--max-denoising-steps", "2", NULL};
        rc = run_client(args, "\xef\xbb\xbf{\"id\":1,\"prompt\":\"a\"}\n", OUT, sizeof OUT, ERR,
                        sizeof ERR);
        CHECKF(rc == 0 && strstr(ERR, "1/1 done, 0 failed"), "exit %d: %s", rc, ERR);
    }
    return 0;
}

/* A daemon shutting down during a batch: the requests it refuses then
 * (shutting_down) get no result, the batch stops sending, exits 3, and
 * the next run (on a daemon again) finishes them, each id once. */
/* A case's own daemon and batch process, stopped by side_stopped whatever
 * its checks say (a failed check returns early and would leave them). */
static pid_t side_daemon, side_batch;

static int side_stopped(int rc)
{
    if (side_batch > 0) {
        kill(side_batch, SIGKILL);
        waitpid(side_batch, NULL, 0);
    }
    if (side_daemon > 0) {
        kill(side_daemon, SIGKILL);
        fixture_wait_exit(side_daemon, NULL);
    }
    side_batch = side_daemon = 0;
    return rc;
}

static int batch_daemon_stops_checks(void)
{
    static const char *const opts[] = {"max_batch=2", "pin_workers=false", "tick=0.05",
                                       "shutdown_grace=5", NULL};
    char in[600], out[600], s2[600], l2[600];
    int st, n = 0, errors, dups;
    pid_t d, pid;
    double t0;
    FILE *f;

    snprintf(in, sizeof in, "%s", test_path("stop-in.jsonl"));
    snprintf(out, sizeof out, "%s", test_path("stop-out.jsonl"));
    snprintf(s2, sizeof s2, "%s", test_path("d2.sock"));
    snprintf(l2, sizeof l2, "%s", test_path("d2.log"));
    f = fopen(in, "w");
    CHECK(f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"id\":%d,\"prompt\":\"item %d\",\"max_tokens\":24,"
                   "\"max_denoising_steps\":4,\"seed\":%d}\n", i, i, i);
    CHECK(fclose(f) == 0);
    d = side_daemon = fixture_spawn(s2, l2, opts);
    CHECK(d > 0 && fixture_wait_ready(d, s2) == 0);
    pid = side_batch = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(fixture_bin("dgemma-client"), "dgemma-client", "-s", s2, "batch", "--input", in,
              "--output", out, "--parallel", "4", (char *)NULL);
        _exit(127);
    }
    /* the daemon told to stop once a few results are in */
    t0 = fixture_now_ms();
    while (!(check_results(out, &n, &errors, &dups) == 0 && n >= 3)) {
        CHECK(fixture_now_ms() - t0 < FIXTURE_WAIT_MS && waitpid(pid, &st, WNOHANG) == 0);
        usleep(2000);
    }
    CHECK(kill(d, SIGTERM) == 0);
    CHECK(waitpid(pid, &st, 0) == pid);
    side_batch = 0;
    side_daemon = 0;
    CHECK(fixture_exits_clean(d, l2) == 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %d", st);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    printf("# %d of 40 results before the daemon stopped\n", n);
    CHECKF(n < 40 && errors == 0 && dups == 0, "%d results, %d errors, %d duplicates", n, errors,
           dups);
    d = side_daemon = fixture_spawn(s2, l2, opts);
    CHECK(d > 0 && fixture_wait_ready(d, s2) == 0);
    {
        const char *args[] = {"-s", s2, "batch", "--input", in, "--output", out, NULL};
        const int rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    }
    side_daemon = 0;
    CHECK(fixture_stop(d, l2) == 0);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 40 && errors == 0 && dups == 0, "%d results, %d errors, %d duplicates", n,
           errors, dups);
    return 0;
}

/* A daemon that refuses the batch's connection (busy: max_connections
 * reached) takes none of its requests: without --wait, or refused for
 * longer than it, exit 3, saying so, no result written (none taken for a
 * request's); with --wait, the batch connects again each second until
 * there is room (here after 1.5 s), and does them all. */
static int batch_daemon_stops(void)
{
    return side_stopped(batch_daemon_stops_checks());
}

static int batch_daemon_full_checks(void)
{
    static const char *const opts[] = {"max_connections=1", "pin_workers=false", "tick=0.05",
                                       NULL};
    char out[600], s3[600], l3[600];
    const char *in = "{\"id\":1,\"prompt\":\"a\",\"max_tokens\":4}\n"
                     "{\"id\":2,\"prompt\":\"b\",\"max_tokens\":4}\n";
    int rc, n, errors, dups, held;
    pid_t d;

    snprintf(out, sizeof out, "%s", test_path("full-out.jsonl"));
    snprintf(s3, sizeof s3, "%s", test_path("d3.sock"));
    snprintf(l3, sizeof l3, "%s", test_path("d3.log"));
    d = side_daemon = fixture_spawn(s3, l3, opts);
    CHECK(d > 0 && fixture_wait_ready(d, s3) == 0);
    held = fixture_connect(s3); /* (the one connection it takes) */
    CHECK(held >= 0);
    usleep(100000);
    {
        const char *args[] = {"-s", s3, "batch", "--input", "-", "--output", out, NULL};
        rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 3, "exit %d: %s", rc, ERR);
    }
    CHECKF(strstr(ERR, "busy") && strstr(ERR, "--wait"), "%s", ERR);
    {
        /* refused for longer than --wait: the same, once it runs out */
        const char *args[] = {"-s", s3, "batch", "--input", "-", "--output", out, "--wait",
                              "1.5", NULL};
        rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 3 && strstr(ERR, "--wait ran out"), "exit %d: %s", rc, ERR);
    }
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 0, "%d results written by a refused batch", n);
    {
        /* the connection freed 1.5 s from now: a child keeps it that long */
        const pid_t h = fork();
        const char *args[] = {"-s", s3, "batch", "--input", "-", "--output", out, "--wait",
                              "20", NULL};
        double t0;
        CHECK(h >= 0);
        if (h == 0) {
            usleep(1500000);
            _exit(0);
        }
        close(held);
        t0 = fixture_now_ms();
        rc = run_client(args, in, OUT, sizeof OUT, ERR, sizeof ERR);
        waitpid(h, NULL, 0);
        CHECKF(rc == 0, "exit %d: %s", rc, ERR);
        CHECKF(fixture_now_ms() - t0 > 1000, "done in %.0f ms: never refused",
               fixture_now_ms() - t0);
    }
    side_daemon = 0;
    CHECK(fixture_stop(d, l3) == 0);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 2 && errors == 0 && dups == 0, "%d results, %d errors", n, errors);
    return 0;
}

static int batch_daemon_full(void)
{
    return side_stopped(batch_daemon_full_checks());
}

/* A setting given by a flag that the daemon refuses stops the batch at its
 * first refusal: exit 2, the setting and its flag named, no result
 * written (every line used to get a bad_request result, the whole input
 * spent on a typo); the next run, the flag corrected, does every line.  A
 * refusal of the line's own setting (its t_min beside the flag's t_max)
 * is still that line's result. */
static int batch_flag_refusal(void)
{
    char out[600];
    const char *in = "{\"id\":\"a\",\"prompt\":\"x\",\"max_tokens\":4}\n"
                     "{\"id\":\"b\",\"prompt\":\"y\",\"max_tokens\":4,\"max_denoising_steps\":2}\n"
                     "{\"id\":\"c\",\"prompt\":\"z\",\"max_tokens\":4}\n";
    const char *steps[] = {"batch", "--input", "-", "--output", out, "--parallel", "1",
                           "--max-denoising-steps", "100000", NULL};
    const char *t_max[] = {"batch", "--input", "-", "--output", out, "--t-max", "0.3", NULL};
    const char *fixed[] = {"batch", "--input", "-", "--output", out, "--max-denoising-steps",
                           "2", NULL};
    int rc, n, errors, dups;

    snprintf(out, sizeof out, "%s", test_path("flag-out.jsonl"));
    rc = run_client(steps, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 2 && strstr(ERR, "refuses the setting max_denoising_steps given on the command "
                                  "line (--max-denoising-steps or --settings): "
                                  "max_denoising_steps: 100000 "),
           "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 0, "%d results written for a flag's refusal", n);
    /* (the schedule's check: t_max below the model's t_min) */
    rc = run_client(t_max, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 2 && strstr(ERR, "refuses the setting t_max given on the command line (--t-max"),
           "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 0, "%d results written for a flag's refusal", n);
    rc = run_client(fixed, in, OUT, sizeof OUT, ERR, sizeof ERR);
    CHECKF(rc == 0 && strstr(ERR, "3/3 done, 0 failed"), "exit %d: %s", rc, ERR);
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 3 && errors == 0 && dups == 0, "%d results, %d errors", n, errors);
    /* the line's own t_min with the flag's t_max: that line's result */
    {
        const char *own = "{\"id\":\"o\",\"prompt\":\"x\",\"max_tokens\":4,\"t_min\":0.9}\n"
                          "{\"id\":\"p\",\"prompt\":\"y\",\"max_tokens\":4,"
                          "\"max_denoising_steps\":2}\n";
        const char *args[] = {"batch", "--input", "-", "--output", out, "--t-max", "0.85", NULL};
        snprintf(out, sizeof out, "%s", test_path("flag-own-out.jsonl"));
        rc = run_client(args, own, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "2/2 done, 1 failed"), "exit %d: %s", rc, ERR);
        CHECK(slurp(out, OUT, sizeof OUT) > 0);
        CHECKF(strstr(OUT, "{\"id\":\"o\",\"error\":{\"code\":\"bad_request\",\"message\":"
                           "\"t_min 0.9, t_max 0.85: "), "%s", OUT);
    }
    return 0;
}

/* Wait for needle in the log at path while pid runs; 0 when it came. */
static int wait_log(const char *path, const char *needle, pid_t pid)
{
    const double t0 = fixture_now_ms();
    int st;
    while (!fixture_file_has(path, needle)) {
        if (fixture_now_ms() - t0 > FIXTURE_WAIT_MS || waitpid(pid, &st, WNOHANG) != 0)
            return -1;
        usleep(5000);
    }
    return 0;
}

/* Start a batch of in on socket s into out (--parallel par), its output
 * and errors to /dev/null; its pid. */
static pid_t spawn_batch(const char *s, const char *in, const char *out, const char *par)
{
    const pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(fixture_bin("dgemma-client"), "dgemma-client", "-s", s, "batch", "--input", in,
              "--output", out, "--parallel", par, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* An operator's `dgemma-client cancel ID` of a request a batch runs is
 * that request's result (an error "cancelled"): the batch goes on with
 * the others and exits 1, and the next run skips it (it used to end the
 * batch with exit 3, no result, and every later run ran it again).  A
 * daemon that cancels the running requests as it stops (shutdown_grace 0)
 * still leaves them unfinished: no result, exit 3. */

static int batch_cancelled_checks(void)
{
    static const char *const opts[] = {"max_batch=2", "pin_workers=false", "tick=0.05",
                                       "shutdown_grace=0", NULL};
    static const char LONG[] = "\"prompt\":\"a long one\",\"max_tokens\":4000,"
                               "\"max_denoising_steps\":30,\"seed\":1}\n";
    char in[600], out[600], s4[600], l4[600];
    int st, rc, n, errors, dups;
    pid_t d, pid;
    FILE *f;

    snprintf(in, sizeof in, "%s", test_path("cancel-in.jsonl"));
    snprintf(out, sizeof out, "%s", test_path("cancel-out.jsonl"));
    snprintf(s4, sizeof s4, "%s", test_path("d4.sock"));
    snprintf(l4, sizeof l4, "%s", test_path("d4.log"));
    f = fopen(in, "w");
    CHECK(f);
    fprintf(f, "{\"id\":\"long\",%s", LONG);
    for (int i = 0; i < 2; i++)
        fprintf(f, "{\"id\":\"s%d\",\"prompt\":\"x\",\"max_tokens\":4,"
                   "\"max_denoising_steps\":2,\"seed\":%d}\n", i, i + 2);
    CHECK(fclose(f) == 0);
    d = side_daemon = fixture_spawn(s4, l4, opts);
    CHECK(d > 0 && fixture_wait_ready(d, s4) == 0);
    /* (one at a time: the long one is the daemon's first request, req=1) */
    pid = side_batch = spawn_batch(s4, in, out, "1");
    CHECKF(wait_log(l4, "req=1 conn ", pid) == 0, "the batch's first request not seen");
    {
        const char *args[] = {"-s", s4, "cancel", "1", NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 0, "cancel: exit %d: %s", rc, ERR);
    }
    CHECK(fixture_wait_exit(pid, &st) == 0);
    side_batch = 0;
    CHECK(WIFEXITED(st));
    CHECKF(WEXITSTATUS(st) == 1, "the batch exited %d", WEXITSTATUS(st));
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 3 && errors == 1 && dups == 0, "%d results, %d errors", n, errors);
    CHECK(slurp(out, OUT, sizeof OUT) > 0);
    CHECKF(strstr(OUT, "{\"id\":\"long\",\"finish_reason\":\"cancelled\"") &&
               strstr(OUT, "\"error\":{\"code\":\"cancelled\""), "%s", OUT);
    /* the next run has nothing to do: the cancelled one is not run again */
    {
        const char *args[] = {"-s", s4, "batch", "--input", in, "--output", out, NULL};
        rc = run_client(args, NULL, OUT, sizeof OUT, ERR, sizeof ERR);
        CHECKF(rc == 1 && strstr(ERR, "3/3 done, 0 failed"), "exit %d: %s", rc, ERR);
    }
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 3 && dups == 0, "%d results, %d duplicates", n, dups);

    /* the daemon stopping cancels two running requests: unfinished */
    snprintf(in, sizeof in, "%s", test_path("cancel2-in.jsonl"));
    snprintf(out, sizeof out, "%s", test_path("cancel2-out.jsonl"));
    f = fopen(in, "w");
    CHECK(f && fprintf(f, "{\"id\":\"L1\",%s{\"id\":\"L2\",%s", LONG, LONG) > 0 &&
          fclose(f) == 0);
    pid = side_batch = spawn_batch(s4, in, out, "2");
    CHECKF(wait_log(l4, "req=5 conn ", pid) == 0, "the batch's requests not seen");
    usleep(100000);
    CHECK(kill(d, SIGTERM) == 0);
    CHECK(fixture_wait_exit(pid, &st) == 0);
    side_batch = 0;
    CHECK(WIFEXITED(st));
    side_daemon = 0;
    CHECK(fixture_exits_clean(d, l4) == 0);
    CHECKF(WEXITSTATUS(st) == 3, "the batch exited %d", WEXITSTATUS(st));
    CHECK(check_results(out, &n, &errors, &dups) == 0);
    CHECKF(n == 0, "%d results of requests the stopping daemon cancelled", n);
    return 0;
}

static int batch_cancelled(void)
{
    return side_stopped(batch_cancelled_checks());
}

/* ---- a scripted daemon: the status query answered with errors ------------------- */

/* The scripted daemon's side of one connection on listener lf: every
 * generate line is accepted and then done "cancelled" (as a cancel, or a
 * daemon stopping, ends it), and the first status_errors status queries
 * are answered with an error without tag or id (as the daemon's out of
 * memory answers them); a later one with shutting_down false.  Exits with
 * the number of status queries read (at most 100) at the client's EOF. */
static void scripted_status_errors(int lf, int status_errors)
{
    FILE *in;
    char line[8192];
    int fd = accept(lf, NULL, NULL), queries = 0;
    if (fd < 0 || !(in = fdopen(fd, "r+")))
        _exit(101);
    setvbuf(in, NULL, _IONBF, 0);
    while (fgets(line, sizeof line, in)) {
        json_t *r = json_loads(line, 0, NULL), *tag = json_object_get(r, "tag");
        const char *op = json_string_value(json_object_get(r, "op"));
        char *ans = NULL;
        if (op && !strcmp(op, "generate")) {
            char *t = json_dumps(tag ? tag : json_null(), JSON_ENCODE_ANY);
            if (!t || asprintf(&ans,
                               "{\"v\":1,\"event\":\"accepted\",\"id\":1,\"tag\":%s,"
                               "\"prompt_tokens\":1,\"seed\":1,\"settings\":{}}\n"
                               "{\"v\":1,\"event\":\"done\",\"id\":1,\"tag\":%s,"
                               "\"finish_reason\":\"cancelled\",\"usage\":{\"prompt_tokens\":1,"
                               "\"completion_tokens\":0},\"canvases\":0}\n",
                               t, t) < 0)
                _exit(102);
            free(t);
        } else if (op && !strcmp(op, "status")) {
            if (asprintf(&ans, "%s\n",
                         queries++ < status_errors
                             ? "{\"v\":1,\"event\":\"error\",\"id\":null,\"code\":\"internal\","
                               "\"message\":\"out of memory\"}"
                             : "{\"v\":1,\"event\":\"status\",\"running\":0,"
                               "\"shutting_down\":false}") < 0)
                _exit(102);
        }
        json_decref(r);
        if (ans && write(fd, ans, strlen(ans)) != (ssize_t)strlen(ans))
            _exit(103);
        free(ans);
    }
    _exit(queries > 100 ? 100 : queries);
}

/* A cancelled request's status query answered with an error (out of
 * memory in the daemon) says neither a cancel nor the daemon stopping: the
 * batch asks again.  One error, then an answer: the request gets its
 * "cancelled" result (exit 1), after two queries.  Errors to every query:
 * after 3 the request is left to the next run (no result, exit 3), and
 * the batch says why; it used to take the first error for the daemon
 * stopping. */
static int batch_status_error(void)
{
    for (int errors = 1; errors <= 5; errors += 4) {
        const char *path = test_pathf("scripted-%d.sock", errors);
        const char *out = test_pathf("scripted-%d.jsonl", errors);
        const char *args[] = {"-s", path, "batch", "--input", "-", "--output", out, NULL};
        struct sockaddr_un a;
        const int lf = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc, st, n, n_err, dups;
        pid_t pid;

        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
        CHECK(lf >= 0 && bind(lf, (struct sockaddr *)&a, sizeof a) == 0 && listen(lf, 4) == 0);
        fflush(stdout);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0)
            scripted_status_errors(lf, errors);
        close(lf);
        rc = run_client(args, "{\"id\":\"c1\",\"prompt\":\"x\"}\n", OUT, sizeof OUT, ERR,
                        sizeof ERR);
        CHECK(fixture_wait_exit(pid, &st) == 0 && WIFEXITED(st));
        printf("# %d error answers scripted: the batch exited %d after %d status queries\n",
               errors, rc, WEXITSTATUS(st));
        CHECK(check_results(out, &n, &n_err, &dups) == 0);
        if (errors == 1) {
            CHECKF(rc == 1 && WEXITSTATUS(st) == 2, "exit %d after %d queries: %s", rc,
                   WEXITSTATUS(st), ERR);
            CHECK(n == 1 && n_err == 1 && slurp(out, OUT, sizeof OUT) > 0);
            CHECKF(strstr(OUT, "{\"id\":\"c1\",") && strstr(OUT, "\"code\":\"cancelled\""),
                   "%s", OUT);
        } else {
            CHECKF(rc == 3 && WEXITSTATUS(st) == 3, "exit %d after %d queries: %s", rc,
                   WEXITSTATUS(st), ERR);
            CHECKF(n == 0 && strstr(ERR, "with an error 3 times (internal: out of memory): "
                                         "left to the next run") &&
                       !strstr(ERR, "shutting down"),
                   "%d results: %s", n, ERR);
        }
    }
    return 0;
}

static int chat_pipe(void)
{
    const char *args[] = {"chat", "--max-tokens", "16", "--max-denoising-steps", "2", "--seed",
                          "4", NULL};
    int rc = run_client(args, "hello\nand again\n", OUT, sizeof OUT, ERR, sizeof ERR);
    int lines = 0;
    CHECKF(rc == 0, "exit %d: %s", rc, ERR);
    for (char *p = OUT; *p; p++)
        lines += *p == '\n';
    CHECKF(lines == 2, "%d reply lines: %s", lines, OUT);
    /* the second turn carried the first one: a longer prompt */
    CHECK(fixture_file_has(log_path, "accepted: "));
    return 0;
}

static size_t pty_controls; /* C0 bytes but CR, LF and tab (and DEL) the pty gave */

/* Read from the pty until needle appears (or the time runs out), counting
 * the control bytes in pty_controls.  A NUL byte read is kept as '.', so
 * that what follows it is still searched. */
static int expect(int fd, const char *needle, char *seen, size_t size)
{
    size_t len = strlen(seen);
    const double t0 = fixture_now_ms();
    while (!strstr(seen, needle)) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t r;
        if (fixture_now_ms() - t0 > FIXTURE_WAIT_MS || poll(&p, 1, 200) < 0)
            return -1;
        if (!(p.revents & POLLIN))
            continue;
        r = read(fd, seen + len, size - 1 - len);
        if (r <= 0)
            return -1;
        for (ssize_t i = 0; i < r; i++) {
            const unsigned char ch = (unsigned char)seen[len + (size_t)i];
            pty_controls += (ch < 0x20 && ch != '\r' && ch != '\n' && ch != '\t') || ch == 0x7f;
            if (ch == '\0')
                seen[len + (size_t)i] = '.';
        }
        len += (size_t)r;
        seen[len] = '\0';
    }
    return 0;
}

static int chat_terminal(void)
{
    int master, st;
    char seen[1 << 16] = "";
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("DGEMMA_SOCKET", sock, 1);
        /* (seeded: the reply to "second" then holds a NUL and a 0x1c,
         * which the terminal must get as U+FFFD) */
        execl(fixture_bin("dgemma-client"), "dgemma-client", "chat", "--system", "Be brief.",
              "--max-tokens", "16", "--max-denoising-steps", "2", "--seed",
              "3492929928041919275", (char *)NULL);
        _exit(127);
    }
    CHECKF(expect(master, "> ", seen, sizeof seen) == 0, "no prompt: %s", seen);
    CHECK(write(master, "first question\n", 15) == 15);
    seen[0] = '\0';
    /* the reply, then the prompt again */
    CHECKF(expect(master, "\n> ", seen, sizeof seen) == 0, "no second prompt: %s", seen);
    /* Ctrl-C at the prompt: a new prompt, the chat goes on (it used to end
     * the chat, exit 0) */
    CHECK(write(master, "\x03", 1) == 1);
    seen[0] = '\0';
    CHECKF(expect(master, "> ", seen, sizeof seen) == 0, "no prompt after Ctrl-C: %s", seen);
    CHECK(write(master, "/reset\n", 7) == 7);
    seen[0] = '\0';
    CHECK(expect(master, "> ", seen, sizeof seen) == 0);
    CHECK(write(master, "second\n", 7) == 7);
    seen[0] = '\0';
    CHECK(expect(master, "\n> ", seen, sizeof seen) == 0);
    CHECK(write(master, "/exit\n", 6) == 6);
    CHECK(fixture_wait_exit(pid, &st) == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(master);
    CHECKF(pty_controls == 0, "%zu control bytes reached the terminal", pty_controls);
    return 0;
}

/* The shared daemon stops on SIGTERM and exits 0 (under the sanitizers,
 * with no report). */
static int daemon_stops(void)
{
    const pid_t p = daemon_pid;
    daemon_pid = 0;
    CHECK(fixture_stop(p, log_path) == 0);
    return 0;
}

int main(void)
{
    TEST_CASE(start);
    if (daemon_pid > 0) {
        TEST_CASE(generate_plain_and_json);
        TEST_CASE(exit_codes);
        TEST_CASE(command_help_and_common_usage);
        TEST_CASE(generate_interrupted);
        TEST_CASE(generate_interrupted_fast_canvases);
        TEST_CASE(second_interrupt);
        TEST_CASE(refused_input);
        TEST_CASE(output_full);
        TEST_CASE(stop_after_settings);
        TEST_CASE(batch_with_bad_lines);
        TEST_CASE(batch_text_with_nul);
        TEST_CASE(batch_resume_after_kill);
        TEST_CASE(batch_resume_after_sigint_sigterm);
        TEST_CASE(batch_refusals);
        TEST_CASE(batch_blank_lines);
        TEST_CASE(no_parse_special);
        TEST_CASE(batch_bad_json_words);
        TEST_CASE(batch_json_refused);
        TEST_CASE(batch_flag_refusal);
        TEST_CASE(batch_daemon_stops);
        TEST_CASE(batch_daemon_full);
        TEST_CASE(batch_cancelled);
        TEST_CASE(batch_status_error);
        TEST_CASE(chat_pipe);
        TEST_CASE(chat_terminal);
        TEST_CASE(daemon_stops);
    }
    return test_finish();
}
