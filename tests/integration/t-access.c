/*
 * t-access.c - who may use the real dgemmad (dgemmad(8), ACCESS):
 *   socket_default_mode  the socket is 0660 and the daemon's: never world-writable;
 *   client_limit         client_max_requests: the third generate on a connection
 *                        holding two is refused as busy; a ring's jobs past the limit
 *                        wait in the ring (never more than the limit in flight) and
 *                        all finish;
 *   and, as root (skipped otherwise), with a second user created here by useradd
 *   and removed at the end:
 *   root_refused         started as root without user or allow_root: exit 1, a clear
 *                        message, no socket;
 *   user_switch          user: NAME: every uid and gid of the process is the user's, the
 *                        socket and the log file are its;
 *   socket_owner_group   socket_owner, socket_group and socket_mode are applied;
 *   allow_list           allow_uids / allow_gids against SO_PEERCRED: a client as the
 *                        second user is refused with a forbidden line and a log line
 *                        naming its uid; let in by its uid, its group or a
 *                        supplementary group; the daemon's own uid always;
 *   others_live_socket   a daemon as the second user, on the path of a running root
 *                        daemon's socket it may not connect to (EACCES): exit 1 saying
 *                        it cannot tell whether a daemon serves it; the socket not
 *                        replaced, the first daemon still serving.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define TEST_USER "dgemma-t-access"
#define GID_A 43430 /* groups the test hands its clients; no need for them to exist */
#define GID_B 43431
#define UID_OTHER 43432

static uid_t t_uid = (uid_t)-1; /* the second user, once created */
static gid_t t_gid;
static int user_made;

static char sock_path[512], log_path[512];

/* Start dgemmad with extra "KEY=VALUE" options, stderr to errf (NULL: the
 * test's); the fixture's allow_root=true (as root) comes first, so a later
 * allow_root=false overrides it. */
static pid_t live; /* the daemon a failed case left running, killed by the next start */

static pid_t start(const char *sock, const char *log, const char *errf,
                   const char *const *extra)
{
    pid_t p;
    int saved = -1;
    if (live > 0) {
        kill(live, SIGKILL);
        waitpid(live, NULL, 0);
        unlink(sock_path);
        live = 0;
    }
    if (errf) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return -1;
        saved = dup(2);
        dup2(fd, 2);
        close(fd);
    }
    p = fixture_spawn(sock, log, extra);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    live = p;
    return p;
}

/* SIGTERM and the exit status: 0 when it exited 0. */
static int stop(pid_t p)
{
    int st;
    if (p <= 0 || kill(p, SIGTERM) != 0 || fixture_wait_exit(p, &st) != 0)
        return -1;
    live = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* A status round trip on a fresh connection: 0 when a status event came,
 * 1 when the daemon answered forbidden (then closed), -1 otherwise. */
static int try_status(const char *sock)
{
    dgemma_t *c = dgemma_new();
    dgemma_event_t ev;
    int rc = -1;
    if (!c || dgemma_connect(c, sock, 5) != 0) {
        dgemma_close(c);
        return -1;
    }
    (void)dgemma_status(c); /* may fail: a refused client is closed at once */
    for (int i = 0; i < 4; i++) {
        if (dgemma_next_event(c, &ev, 10000) != 0)
            break;
        if (ev.kind == DGEMMA_EV_STATUS) {
            rc = 0;
            break;
        }
        if (ev.kind == DGEMMA_EV_ERROR) {
            rc = ev.code && !strcmp(ev.code, "forbidden") &&
                         ev.message && strstr(ev.message, "is not allowed")
                     ? 1
                     : -1;
            break;
        }
    }
    dgemma_close(c);
    return rc;
}

/* try_status in a child that first takes uid, gid and the supplementary
 * groups given (n of them): its result, or -2 when the switch failed. */
static int status_as(uid_t uid, gid_t gid, const gid_t *groups, size_t n)
{
    pid_t p = fork();
    int st;
    if (p == 0) {
        if (setgroups(n, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(200);
        switch (try_status(sock_path)) {
        case 0:
            _exit(0);
        case 1:
            _exit(1);
        default:
            _exit(2);
        }
    }
    if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st))
        return -3;
    return WEXITSTATUS(st) == 200 ? -2 : WEXITSTATUS(st) == 2 ? -1 : WEXITSTATUS(st);
}

static int make_user(void)
{
    struct passwd *pw;
    if (geteuid() != 0)
        return -1;
    /* (a left-over from an interrupted run goes first) */
    if (system("userdel " TEST_USER " >/dev/null 2>&1; useradd --system --no-create-home "
               "--user-group --shell /usr/sbin/nologin " TEST_USER " >/dev/null 2>&1") != 0)
        return -1;
    user_made = 1;
    if (!(pw = getpwnam(TEST_USER)))
        return -1;
    t_uid = pw->pw_uid;
    t_gid = pw->pw_gid;
    return 0;
}

/* ---- cases ------------------------------------------------------------------------ */

static int socket_default_mode(void)
{
    struct stat st;
    pid_t p = start(sock_path, log_path, NULL, NULL);
    CHECK(fixture_wait_ready(p, sock_path) == 0);
    CHECK(stat(sock_path, &st) == 0);
    CHECKF((st.st_mode & 07777) == 0660, "mode %o", (unsigned)(st.st_mode & 07777));
    CHECK(st.st_uid == geteuid());
    CHECK(try_status(sock_path) == 0);
    CHECK(stop(p) == 0);
    return 0;
}

static int client_limit(void)
{
    const char *const extra[] = {"client_max_requests=2", "max_batch=8", "pin_workers=false",
                                 NULL};
    pid_t p = start(sock_path, log_path, NULL, extra);
    dgemma_t *c = dgemma_new(), *watch = dgemma_new();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r = dgemma_request_text("hello there");
    dgemma_event_t ev;
    uint64_t ids[2] = {0, 0};
    int accepted = 0, busy = 0, done = 0, most = 0;

    CHECK(fixture_wait_ready(p, sock_path) == 0);
    CHECK(c && watch && r && dgemma_connect(c, sock_path, 5) == 0);
    CHECK(dgemma_connect(watch, sock_path, 5) == 0);
    /* three long requests on one connection */
    CHECK(dgemma_request_set_int(r, "max_tokens", 4000) == 0);
    for (int i = 0; i < 3; i++)
        CHECK(dgemma_submit(c, r) == 0);
    while (accepted + busy < 3 && dgemma_next_event(c, &ev, 20000) == 0) {
        if (ev.kind == DGEMMA_EV_ACCEPTED)
            ids[accepted++ % 2] = ev.id;
        else if (ev.kind == DGEMMA_EV_ERROR)
            busy += ev.code && !strcmp(ev.code, "busy") && ev.message &&
                    strstr(ev.message, "client_max_requests") != NULL;
    }
    CHECKF(accepted == 2 && busy == 1, "accepted %d, busy %d", accepted, busy);
    CHECK(dgemma_cancel(c, ids[0]) == 0 && dgemma_cancel(c, ids[1]) == 0);
    while (done < 2 && dgemma_next_event(c, &ev, 20000) == 0)
        done += ev.kind == DGEMMA_EV_DONE;
    CHECK(done == 2);

    /* six ring jobs: two at a time, all done */
    CHECK(dgemma_ring_attach(c, NULL, &ring) == 0);
    CHECK(dgemma_request_set_int(r, "max_tokens", 8) == 0);
    CHECK(dgemma_request_set_int(r, "canvas_length", 4) == 0);
    CHECK(dgemma_request_set_int(r, "max_denoising_steps", 8) == 0);
    for (int i = 0; i < 6; i++)
        CHECK(dgemma_ring_submit(ring, r, (uint64_t)i + 1) == 0);
    CHECK(dgemma_ring_kick(ring) == 0);
    done = 0;
    for (int rounds = 0; done < 6 && rounds < 2000; rounds++) {
        dgemma_completion_t cq;
        if (dgemma_status(watch) == 0 && dgemma_next_event(watch, &ev, 5000) == 0 &&
            ev.kind == DGEMMA_EV_STATUS) {
            long long running = 0, queued = 0;
            /* (counted daemon-wide: this is the only client with work) */
            const char *j = ev.json, *q;
            if ((q = strstr(j, "\"running\":")) != NULL)
                running = strtoll(q + 10, NULL, 10);
            if ((q = strstr(j, "\"queued\":")) != NULL)
                queued = strtoll(q + 9, NULL, 10);
            if (running + queued > most)
                most = (int)(running + queued);
        }
        while (dgemma_ring_reap(ring, &cq) == 0) {
            CHECKF(cq.id != 0 && cq.finish_reason && strcmp(cq.finish_reason, "error"),
                   "job %llu: %s %s", (unsigned long long)cq.user_data,
                   cq.code ? cq.code : "", cq.message ? cq.message : "");
            done++;
        }
        if (done < 6)
            (void)dgemma_ring_wait(ring, 20);
    }
    CHECKF(done == 6, "%d ring jobs done", done);
    CHECKF(most <= 2, "%d requests in flight at once", most);
    dgemma_ring_detach(ring);
    dgemma_request_free(r);
    dgemma_close(c);
    dgemma_close(watch);
    CHECK(stop(p) == 0);
    return 0;
}

static int root_refused(void)
{
    const char *const extra[] = {"allow_root=false", NULL};
    const char *errf = test_path("refused.err");
    pid_t p;
    int st;
    struct stat sb;
    if (geteuid() != 0)
        return test_skip("needs root");
    p = start(sock_path, log_path, errf, extra);
    CHECK(p > 0 && fixture_wait_exit(p, &st) == 0);
    live = 0;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(fixture_file_has(errf, "refusing to run as root"));
    CHECK(stat(sock_path, &sb) != 0);
    return 0;
}

/* A copy of model directory src in dir/model that any user may read, and
 * the "model=DIR/model" option naming it into opt: 0, or -1. */
static int readable_model(const char *src, const char *dir, char *opt, size_t n)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/model' && chmod -R a+rX '%s/model'", src, dir,
             dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(opt, n, "model=%s/model", dir);
    return 0;
}

static int user_switch(void)
{
    char dir[512], sock[600], log[600], extra_user[300], model[600], path[64],
        line[256];
    const char *extra[] = {extra_user, model, NULL};
    struct stat st;
    FILE *f;
    int uid_ok = 0, gid_ok = 0;
    pid_t p;
    if (t_uid == (uid_t)-1)
        return test_skip("needs root and a second user (useradd)");
    /* a directory the user may write */
    snprintf(dir, sizeof dir, "%s", test_path("user"));
    CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST);
    CHECK(chown(dir, t_uid, t_gid) == 0);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(log, sizeof log, "%s/d.log", dir);
    snprintf(extra_user, sizeof extra_user, "user=%s", TEST_USER);
    /* (a copy of the default model the user can surely read) */
    CHECK(readable_model(fixture_bin("../model/default"), dir, model, sizeof model) == 0);
    p = start(sock, log, NULL, extra);
    CHECK(fixture_wait_ready(p, sock) == 0);
    snprintf(path, sizeof path, "/proc/%d/status", (int)p);
    CHECK((f = fopen(path, "r")) != NULL);
    while (fgets(line, sizeof line, f)) {
        unsigned a, b, c, d;
        if (sscanf(line, "Uid: %u %u %u %u", &a, &b, &c, &d) == 4)
            uid_ok = a == t_uid && b == t_uid && c == t_uid && d == t_uid;
        if (sscanf(line, "Gid: %u %u %u %u", &a, &b, &c, &d) == 4)
            gid_ok = a == t_gid && b == t_gid && c == t_gid && d == t_gid;
    }
    fclose(f);
    CHECK(uid_ok && gid_ok);
    CHECK(stat(sock, &st) == 0 && st.st_uid == t_uid);
    CHECK(stat(log, &st) == 0 && st.st_uid == t_uid);
    CHECK(fixture_file_has(log, "switched from root to " TEST_USER));
    CHECK(stop(p) == 0);
    return 0;
}

static int socket_owner_group(void)
{
    char owner[64], group[64];
    const char *extra[] = {owner, group, "socket_mode=0640", NULL};
    struct stat st;
    pid_t p;
    if (t_uid == (uid_t)-1)
        return test_skip("needs root and a second user (useradd)");
    snprintf(owner, sizeof owner, "socket_owner=%s", TEST_USER);
    snprintf(group, sizeof group, "socket_group=%d", GID_A);
    p = start(sock_path, log_path, NULL, extra);
    CHECK(fixture_wait_ready(p, sock_path) == 0);
    CHECK(stat(sock_path, &st) == 0);
    CHECK(st.st_uid == t_uid && st.st_gid == (gid_t)GID_A);
    CHECKF((st.st_mode & 07777) == 0640, "mode %o", (unsigned)(st.st_mode & 07777));
    CHECK(stop(p) == 0);
    return 0;
}

static int allow_list(void)
{
    char uids[64], gids[64], needle[128];
    const char *extra[] = {"socket_mode=0666", uids, gids, NULL};
    const gid_t sup[1] = {GID_B};
    pid_t p;
    if (t_uid == (uid_t)-1)
        return test_skip("needs root and a second user (useradd)");
    snprintf(uids, sizeof uids, "allow_uids=[%d]", UID_OTHER);
    snprintf(gids, sizeof gids, "allow_gids=[%d, %d]", GID_A, GID_B);
    p = start(sock_path, log_path, NULL, extra);
    CHECK(fixture_wait_ready(p, sock_path) == 0);
    /* the second user, with its own group only: refused, and logged */
    CHECK(status_as(t_uid, t_gid, NULL, 0) == 1);
    snprintf(needle, sizeof needle, "refused a connection from uid %d gid %d", (int)t_uid,
             (int)t_gid);
    CHECK(fixture_file_has(log_path, needle));
    /* let in: by a supplementary group, by its group, by its uid; and the daemon's own */
    CHECK(status_as(t_uid, t_gid, sup, 1) == 0);
    CHECK(status_as(t_uid, (gid_t)GID_A, NULL, 0) == 0);
    CHECK(status_as((uid_t)UID_OTHER, t_gid, NULL, 0) == 0);
    CHECK(try_status(sock_path) == 0);
    /* and the refused one again, after the others */
    CHECK(status_as(t_uid, t_gid, NULL, 0) == 1);
    CHECK(stop(p) == 0);
    return 0;
}

static pid_t others_a; /* others_live_socket's first daemon, killed at the end if left */

static int others_live_socket(void)
{
    char dir[512], sock[600], log_a[600], log_b[600], errf[600], extra_user[300], model[600];
    const char *extra_b[] = {extra_user, model, NULL};
    const char *extra_a[] = {"socket_mode=0600", NULL};
    struct stat before, after;
    int st;
    pid_t a, b;
    if (t_uid == (uid_t)-1)
        return test_skip("needs root and a second user (useradd)");
    snprintf(dir, sizeof dir, "%s", test_path("shared"));
    CHECK(mkdir(dir, 0777) == 0 || errno == EEXIST);
    CHECK(chmod(dir, 0777) == 0);
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(log_a, sizeof log_a, "%s/a.log", dir);
    snprintf(log_b, sizeof log_b, "%s/b.log", dir);
    snprintf(errf, sizeof errf, "%s/b.err", dir);
    snprintf(extra_user, sizeof extra_user, "user=%s", TEST_USER);
    CHECK(readable_model(fixture_random_model(), dir, model, sizeof model) == 0);
    others_a = a = fixture_spawn(sock, log_a, extra_a);
    CHECK(fixture_wait_ready(a, sock) == 0);
    CHECK(stat(sock, &before) == 0);
    b = start(sock, log_b, errf, extra_b);
    CHECK(fixture_wait_exit(b, &st) == 0);
    live = 0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    CHECK(fixture_file_has(log_b, "cannot tell whether a daemon serves it"));
    CHECK(stat(sock, &after) == 0 && after.st_ino == before.st_ino);
    CHECK(try_status(sock) == 0);
    st = stop(a); /* (reaped either way) */
    others_a = 0;
    CHECK(st == 0);
    return 0;
}

int main(void)
{
    int rc;
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    if (access(fixture_bin("dgemmad"), X_OK) != 0) {
        printf("skip t-access: %s not built\n", fixture_bin("dgemmad"));
        return 77;
    }
    if (geteuid() == 0 && make_user() != 0)
        printf("# useradd %s failed: the cases needing a second user skip\n", TEST_USER);
    /* (the second user's daemon and clients reach paths in the scratch directory) */
    if (geteuid() == 0)
        chmod(test_tmpdir(), 0711);
    TEST_CASE(socket_default_mode);
    TEST_CASE(client_limit);
    TEST_CASE(root_refused);
    TEST_CASE(user_switch);
    TEST_CASE(socket_owner_group);
    TEST_CASE(allow_list);
    TEST_CASE(others_live_socket);
    if (others_a > 0) {
        kill(others_a, SIGKILL);
        waitpid(others_a, NULL, 0);
    }
    if (live > 0) {
        kill(live, SIGKILL);
        waitpid(live, NULL, 0);
    }
    if (user_made && system("userdel " TEST_USER " >/dev/null 2>&1") != 0)
        printf("# userdel %s failed\n", TEST_USER);
    rc = test_finish();
    if (rc != 0)
        printf("# daemon log: %s\n", log_path);
    return rc;
}
