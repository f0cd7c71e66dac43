/*
 * harness.h - the shared scaffolding of the C test programs.
 *
 * A test program is a list of named cases run from main():
 *
 *     static int case_parses_minimal(void) { CHECK(x == 1); return 0; }
 *     int main(void) {
 *         TEST_CASE(case_parses_minimal);
 *         return test_finish();
 *     }
 *
 * Each case prints "ok <program>/<case>" or "not ok <program>/<case>: why";
 * tests/run.sh counts those lines.  test_finish() returns the exit code:
 * 0 when every case passed, 1 otherwise.  A program that cannot run here at
 * all (no GPU) prints "skip <program>: why" and exits 77.
 */
#ifndef DG_TEST_HARNESS_H
#define DG_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lib/error.h"

/* xorshift64 (Marsaglia): the next value of the stream *state (which
 * must not be 0), for tests that draw their own inputs. */
static inline uint64_t test_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* Record a failure of the running case (first one wins) and return 1. */
int test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Mark the running case skipped (it could not run here), with a reason;
 * returns 0 so a case can `return test_skip(...)`. */
int test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run one case and print its verdict. */
void test_run(const char *name, int (*fn)(void));

/* Print the program's tally; return its exit code. */
int test_finish(void);

/* Scratch directory for this program (created on first use, under
 * $TMPDIR or /tmp; removed by test_finish() when every case passed), and a
 * path inside it (each call returns its own string, valid until
 * test_finish()). */
const char *test_tmpdir(void);
const char *test_path(const char *name);
/* test_path of the name fmt makes (printf-style). */
const char *test_pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The integer a one-number file holds (a /proc/sys setting such as
 * /proc/sys/net/core/wmem_max), or -1 where it cannot be opened or read. */
long long test_read_ll(const char *path);

#define TEST_CASE(fn) test_run(#fn, fn)

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            return test_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);   \
    } while (0)

#define CHECKF(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond))                                                           \
            return test_fail(__FILE__, __LINE__, __VA_ARGS__);                 \
    } while (0)

/* A call that must succeed; prints the error message otherwise. */
#define CHECK_OK(call, errp)                                                   \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != 0)                                                          \
            return test_fail(__FILE__, __LINE__, "%s returned %d (%s): %s",    \
                             #call, rc_, dg_status_name(rc_), (errp)->msg);    \
    } while (0)

/* A call that must fail with status `code` and a message containing
 * `needle`. */
#define CHECK_FAILS(call, errp, want, needle)                                  \
    do {                                                                       \
        int rc_;                                                               \
        dg_error_clear(errp);                                                  \
        rc_ = (call);                                                          \
        if (rc_ != -(int)(want) || (errp)->code != (want))                     \
            return test_fail(__FILE__, __LINE__,                               \
                             "%s: want %s, got rc %d err.code %s: %s", #call,  \
                             dg_status_name(want), rc_,                        \
                             dg_status_name((errp)->code), (errp)->msg);       \
        if (!strstr((errp)->msg, (needle)))                                    \
            return test_fail(__FILE__, __LINE__,                               \
                             "%s: message lacks \"%s\": %s", #call, (needle),  \
                             (errp)->msg);                                     \
    } while (0)

#endif
