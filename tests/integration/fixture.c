/* fixture.c - a real dgemmad for integration tests (see fixture.h). */
#include "tests/integration/fixture.h"
#include "tests/harness.h"
#include "tests/sql-peek.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *fixture_bin(const char *name)
{
    static char buf[4][600];
    static int slot;
    const char *b = getenv("BUILD");
    slot = (slot + 1) % 4;
    snprintf(buf[slot], sizeof buf[slot], "%s/bin/%s", b && *b ? b : "build", name);
    return buf[slot];
}

const char *fixture_random_model(void)
{
    static char buf[600];
    const char *b = getenv("BUILD");
    snprintf(buf, sizeof buf, "%s/model/random", b && *b ? b : "build");
    return buf;
}

double fixture_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

pid_t fixture_spawn(const char *sock, const char *log, const char *const *extra)
{
    return fixture_spawn_bin(fixture_bin("dgemmad"), sock, log, extra);
}

pid_t fixture_spawn_bin(const char *bin, const char *sock, const char *log,
                        const char *const *extra)
{
    char o_sock[700], o_log[700], o_model[700];
    const char *argv[64];
    int n = 0;
    pid_t pid;

    snprintf(o_sock, sizeof o_sock, "socket=%s", sock);
    snprintf(o_log, sizeof o_log, "log_file=%s", log);
    argv[n++] = bin;
    argv[n++] = "-o";
    argv[n++] = o_sock;
    argv[n++] = "-o";
    argv[n++] = o_log;
    snprintf(o_model, sizeof o_model, "model=%s", fixture_random_model());
    argv[n++] = "-o";
    argv[n++] = o_model;
    /* (CI runs as root; the daemon refuses root unless told) */
    if (geteuid() == 0) {
        argv[n++] = "-o";
        argv[n++] = "allow_root=true";
    }
    for (const char *const *e = extra; e && *e && n < 60; e++) {
        argv[n++] = "-o";
        argv[n++] = *e;
    }
    argv[n] = NULL;
    pid = fork();
    if (pid == 0) {
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int fixture_connect(const char *path)
{
    struct sockaddr_un a;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

int fixture_wait_ready(pid_t pid, const char *sock)
{
    const double t0 = fixture_now_ms();
    while (fixture_now_ms() - t0 < FIXTURE_WAIT_MS) {
        int st, fd = fixture_connect(sock);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (waitpid(pid, &st, WNOHANG) == pid)
            return -1;
        usleep(20000);
    }
    return -1;
}

int fixture_exits_clean(pid_t pid, const char *log)
{
    int st = 0;
    const int clean = fixture_wait_exit(pid, &st) == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!clean)
        printf("# the daemon (pid %d) did not exit 0 when told to stop: status 0x%x; log %s\n",
               (int)pid, st, log ? log : "(none)");
    return clean ? 0 : -1;
}

int fixture_stop(pid_t pid, const char *log)
{
    if (kill(pid, SIGTERM) != 0) {
        printf("# SIGTERM to the daemon (pid %d): %s\n", (int)pid, strerror(errno));
        return -1;
    }
    return fixture_exits_clean(pid, log);
}

int fixture_finish(pid_t pid, const char *log)
{
    int rc;
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    rc = test_finish();
    if (rc != 0 && log && log[0])
        printf("# daemon log: %s\n", log);
    return rc;
}

int fixture_wait_exit(pid_t pid, int *status)
{
    const double t0 = fixture_now_ms();
    while (fixture_now_ms() - t0 < FIXTURE_WAIT_MS) {
        if (waitpid(pid, status, WNOHANG) == pid)
            return 0;
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return -1;
}

int fixture_file_has(const char *path, const char *needle)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n;
    if (!f)
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

int fixture_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    if (fputs(text, f) < 0) {
        fclose(f);
        return -1;
    }
    return fclose(f) == 0 ? 0 : -1;
}

struct fixture_cl *fixture_cl_open(const char *sock)
{
    struct fixture_cl *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fixture_connect(sock);
    if (c->fd < 0) {
        free(c);
        return NULL;
    }
    return c;
}

void fixture_cl_close(struct fixture_cl *c)
{
    if (c) {
        close(c->fd);
        free(c);
    }
}

int fixture_cl_send(struct fixture_cl *c, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}


int fixture_cl_read(struct fixture_cl *c, json_t **out, int wait_ms)
{
    const double t0 = fixture_now_ms();
    *out = NULL;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        struct pollfd p = {c->fd, POLLIN, 0};
        ssize_t got;
        if (nl) {
            json_error_t je;
            *nl = '\0';
            /* (generated text may hold a NUL, sent as \u0000: valid JSON) */
            *out = json_loads(c->buf, JSON_ALLOW_NUL, &je);
            if (!*out)
                printf("# not JSON (%s, column %d): %.300s\n", je.text, je.column, c->buf);
            c->len -= (size_t)(nl - c->buf) + 1;
            memmove(c->buf, nl + 1, c->len);
            return *out ? FIXTURE_EV_OK : FIXTURE_EV_BAD;
        }
        if (c->len == sizeof c->buf)
            return FIXTURE_EV_BAD;
        if (fixture_now_ms() - t0 > wait_ms)
            return FIXTURE_EV_TIMEOUT;
        if (poll(&p, 1, 100) <= 0)
            continue;
        got = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (got <= 0)
            return FIXTURE_EV_EOF;
        c->len += (size_t)got;
    }
}

json_t *fixture_cl_event(struct fixture_cl *c, int *eof)
{
    json_t *e;
    *eof = fixture_cl_read(c, &e, FIXTURE_WAIT_MS) == FIXTURE_EV_EOF;
    return e;
}

json_t *fixture_status(const char *sock)
{
    struct fixture_cl *c = fixture_cl_open(sock);
    json_t *e = NULL;
    int eof;
    if (c && fixture_cl_send(c, "{\"v\":1,\"op\":\"status\"}\n") == 0)
        e = fixture_cl_event(c, &eof);
    fixture_cl_close(c);
    return e;
}

const char *fixture_ev_kind(const json_t *e)
{
    const char *k = json_string_value(json_object_get(e, "event"));
    return k ? k : "";
}

long long fixture_ev_int(const json_t *e, const char *key)
{
    return (long long)json_integer_value(json_object_get(e, key));
}

int fixture_wait_count(const char *db, int64_t want, double limit_s, const char *sql)
{
    const double end = fixture_now_ms() + limit_s * 1e3;
    while (test_sql_int(db, "%s", sql) != want) {
        if (fixture_now_ms() > end)
            return -1;
        usleep(20000);
    }
    return 0;
}

/* Walks /proc/pid/fd: the count of descriptors open, each of those below
 * 65536 marked in used (when not NULL); -1 if it cannot be read. */
static int read_fds(pid_t pid, unsigned char *used)
{
    char dir[64];
    struct dirent *d;
    DIR *dp;
    int n = 0;
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    if (!(dp = opendir(dir)))
        return -1;
    while ((d = readdir(dp))) {
        long fd;
        if (d->d_name[0] == '.')
            continue;
        n++;
        fd = strtol(d->d_name, NULL, 10);
        if (used && fd >= 0 && fd < 65536)
            used[fd] = 1;
    }
    closedir(dp);
    return n;
}

int fixture_fds_open(pid_t pid)
{
    return read_fds(pid, NULL);
}

int fixture_fd_first_free(pid_t pid)
{
    static unsigned char used[65536];
    memset(used, 0, sizeof used);
    if (read_fds(pid, used) < 0)
        return -1;
    for (int fd = 0; fd < (int)sizeof used; fd++)
        if (!used[fd])
            return fd;
    return -1;
}

long fixture_proc_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    const size_t n = strlen(field);
    long v = -1;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (!(f = fopen(path, "r")))
        return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}
