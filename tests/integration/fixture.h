/*
 * fixture.h - a real dgemmad for integration tests: started from
 * $BUILD/bin with options, waited for, stopped.
 */
#ifndef DG_TEST_FIXTURE_H
#define DG_TEST_FIXTURE_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#define FIXTURE_WAIT_MS 60000

/* 1 in a build under AddressSanitizer (GCC's macro or clang's feature),
 * where the daemon runs 5-10 times slower; else 0. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* $BUILD/bin/NAME (BUILD defaults to "build"). */
const char *fixture_bin(const char *name);

double fixture_now_ms(void);

/* $BUILD/model/random: the small preset with random weights (dgemma-eval
 * mkmodel): the model these tests were written against, whose random
 * generations run long (a stop id is 2 of its 512 ids), where the trained
 * default model answers in a few tokens. */
const char *fixture_random_model(void);

/* Start dgemmad on socket sock, logging to log, on fixture_random_model()
 * (an extra "model=..." overrides it), with "-o KEY=VALUE" for each string
 * of extra (NULL-terminated; may be NULL), and allow_root=true when the
 * test runs as root.  Returns the pid. */
pid_t fixture_spawn(const char *sock, const char *log, const char *const *extra);

/* fixture_spawn with the daemon at path bin instead of $BUILD/bin/dgemmad. */
pid_t fixture_spawn_bin(const char *bin, const char *sock, const char *log,
                        const char *const *extra);

/* Connect to a UNIX socket; -1 if nobody answers. */
int fixture_connect(const char *path);

/* Wait until the daemon answers on its socket: 0, or -1 if it exited or
 * FIXTURE_WAIT_MS passed. */
int fixture_wait_ready(pid_t pid, const char *sock);

/* Wait for the process to exit (killing it after FIXTURE_WAIT_MS): 0 if it
 * exited by itself; *status as waitpid gives it. */
int fixture_wait_exit(pid_t pid, int *status);

/* The daemon pid's end, once told to stop: 0 when it exited 0 within
 * FIXTURE_WAIT_MS (under the sanitizers that is also their leak check,
 * which a SIGKILL skips: LeakSanitizer's exit is not 0); -1 otherwise,
 * said on a comment line naming log (may be NULL). */
int fixture_exits_clean(pid_t pid, const char *log);

/* SIGTERM to the daemon pid, then fixture_exits_clean. */
int fixture_stop(pid_t pid, const char *log);

/* The end of a daemon test's main: the daemon, if still running (pid > 0),
 * killed (SIGKILL) and reaped; then test_finish()'s exit code, and when a
 * case failed and log is a path (not NULL or empty), a "# daemon log: PATH"
 * line. */
int fixture_finish(pid_t pid, const char *log);

/* Whether the file contains needle (its first 1 MiB). */
int fixture_file_has(const char *path, const char *needle);

/* Write text to path (created or emptied); 0, or -1 on any failure. */
int fixture_write_file(const char *path, const char *text);

/* The members of a generate request that runs until it is cancelled on
 * the random model (4,000 tokens, 30 steps a canvas), and that request as
 * a protocol line (streamed). */
#define FIXTURE_LONG_FIELDS                                                    \
    "\"op\":\"generate\",\"prompt\":\"a long one\",\"max_tokens\":4000,"          \
    "\"max_denoising_steps\":30,\"seed\":5"
#define FIXTURE_LONG_REQ "{\"v\":1," FIXTURE_LONG_FIELDS "}\n"

/* A line client of the daemon's socket: connected, and its unread bytes. */
struct fixture_cl {
    int fd;
    char buf[1 << 20];
    size_t len;
};

/* Connect to sock (NULL if nobody answers or out of memory); close and
 * free (NULL is fine); send all of s (0, or -1 when the send fails). */
struct fixture_cl *fixture_cl_open(const char *sock);
void fixture_cl_close(struct fixture_cl *c);
int fixture_cl_send(struct fixture_cl *c, const char *s);

/* What fixture_cl_read found. */
enum { FIXTURE_EV_OK = 0, FIXTURE_EV_EOF, FIXTURE_EV_TIMEOUT, FIXTURE_EV_BAD };

/* The next event line into *out (NULL unless FIXTURE_EV_OK): FIXTURE_EV_EOF
 * when the daemon closed the connection, FIXTURE_EV_TIMEOUT after wait_ms
 * without a whole line, FIXTURE_EV_BAD for a line that is not JSON (printed
 * as a comment) or one longer than the client's buffer. */
int fixture_cl_read(struct fixture_cl *c, json_t **out, int wait_ms);

/* The next event line as JSON, or NULL after FIXTURE_WAIT_MS, for a line
 * that is not JSON, or at the end of the stream (*eof set). */
json_t *fixture_cl_event(struct fixture_cl *c, int *eof);

/* A status request on a fresh connection to sock: its answer (whatever
 * event it is), or NULL when none came (no connection, EOF, timeout). */
json_t *fixture_status(const char *sock);

/* An event's "event" ("" when it has none), and an integer member (0 when
 * it is not there). */
const char *fixture_ev_kind(const json_t *e);
long long fixture_ev_int(const json_t *e, const char *key);

/* Descriptors open in process pid (its /proc/pid/fd entries); -1 if they
 * cannot be read. */
int fixture_fds_open(pid_t pid);

/* The lowest descriptor number process pid does not have open (a soft
 * RLIMIT_NOFILE of that number leaves it none to open); -1 if its
 * descriptors cannot be read or the lowest free one is past 65535. */
int fixture_fd_first_free(pid_t pid);

/* A "Name:   123 kB" line of /proc/pid/status (field "VmRSS", "VmHWM",
 * ...), in KiB; -1 where it cannot be read. */
long fixture_proc_kib(pid_t pid, const char *field);

/* The metrics database, read from the test (tests/sql-peek.h reads one
 * value): wait up to limit_s seconds until the query gives want (0, or -1
 * at the limit). */
int fixture_wait_count(const char *db, int64_t want, double limit_s, const char *sql);

#endif
