/*
 * Description: the daemon logger's signal-safe line prefix
 * (dlog_format_prefix, what dlog_signal_safe writes from the SIGBUS
 * handler) against the C library's gmtime_r and snprintf formatting the
 * same layout as every other line, over random times from 1970 to 2242
 * and UTC offsets from -12 to +14 hours; its truncation; and one line
 * written through dlog_signal_safe to a log file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/dlog.h"
#include "daemon/log-limit.h"
#include "tests/harness.h"

static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    return test_xorshift(&rng);
}

/* the reference: the C library's calendar, the logger's snprintf layout */
static void reference(char *out, size_t cap, long long t, int ms, long offset, long pid,
                      char tag, char level)
{
    const time_t local = (time_t)(t + offset);
    struct tm tm;
    gmtime_r(&local, &tm);
    snprintf(out, cap, "%ld:%c %02d %s %04d %02d:%02d:%02d.%03d %c ", pid, tag, tm.tm_mday,
             months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec, ms,
             level);
}

static int case_prefix_matches_libc(void)
{
    /* the edges first: the epoch, leap days, century and 400-year years */
    static const long long edges[] = {0,          86399,      86400,      951782400,
                                      951868799,  951868800,  4107542400, 4107628800,
                                      1709164800, 1709251199, 1735689599, 1735689600};
    char got[128], want[128];
    for (int i = 0; i < 200000; i++) {
        const int e = i < (int)(sizeof edges / sizeof edges[0]);
        const long long t = e ? edges[i] : (long long)(next() % 8589934592ull);
        const long offset = e ? 0 : ((long)(next() % 105) - 48) * 900; /* -12 h .. +14 h */
        const int ms = (int)(next() % 1000);
        const long pid = (long)(next() % 4194304);
        const char tag = "MSW-"[next() % 4], level = "EWID"[next() % 4];
        size_t n;
        if (t + offset < 0)
            continue;
        n = dlog_format_prefix(got, sizeof got, t, ms, offset, pid, tag, level);
        reference(want, sizeof want, t, ms, offset, pid, tag, level);
        CHECKF(strcmp(got, want) == 0 && n == strlen(want),
               "t %lld offset %ld: \"%s\", want \"%s\"", t, offset, got, want);
    }
    return 0;
}

static int case_prefix_cut_to_fit(void)
{
    char full[128], buf[16];
    const size_t n = dlog_format_prefix(full, sizeof full, 1764600000, 7, 3600, 12345, 'M',
                                        'E');
    memset(buf, 'x', sizeof buf);
    CHECK(dlog_format_prefix(buf, 10, 1764600000, 7, 3600, 12345, 'M', 'E') == 9);
    CHECK(buf[9] == '\0' && strncmp(buf, full, 9) == 0 && buf[10] == 'x');
    CHECK(n == strlen(full) && dlog_format_prefix(buf, 0, 0, 0, 0, 1, 'M', 'E') == 0);
    return 0;
}

static int case_signal_safe_line(void)
{
    const char *path = test_path("d.log");
    struct dg_error err = {0};
    char line[512], want_date[32];
    const time_t now = time(NULL);
    struct tm tm;
    FILE *f;
    CHECK_OK(dlog_open(path, DG_LOG_INFO, &err), &err);
    dlog_set_tag('M');
    dlog(DG_LOG_INFO, "first"); /* (sets the UTC offset the signal-safe line uses) */
    dlog_signal_safe("fatal: a message from a handler");
    dlog_close();
    CHECK((f = fopen(path, "r")) != NULL);
    CHECK(fgets(line, sizeof line, f) != NULL && strstr(line, " I first\n"));
    CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    localtime_r(&now, &tm);
    snprintf(want_date, sizeof want_date, ":M %02d %s %04d ", tm.tm_mday, months[tm.tm_mon],
             tm.tm_year + 1900);
    CHECKF(strstr(line, want_date) && strstr(line, " E fatal: a message from a handler\n"),
           "line \"%s\", want the date \"%s\"", line, want_date);
    return 0;
}

/* dlog_limit_take by its contract: burst 3 a window of 10 s, by hand, and
 * dlog_limit_due; then random call times, where no window logs more than
 * its burst and every line held back is handed over once, by the window
 * after its own or by the timer. */
static int case_log_limit(void)
{
    static const struct {
        double t;
        int allowed;
        unsigned long long held_before;
    } steps[] = {
        {0, 1, 0},    {1, 1, 0},  {2, 1, 0},   {3, 0, 0},  {9.99, 0, 0},
        {10, 1, 2},   {10.5, 1, 0}, {19.9, 1, 0}, {19.95, 0, 0},
        {45, 1, 1},   {46, 1, 0},  {56, 1, 0},
    };
    struct dlog_limit l = {.burst = 3, .window = 10};
    unsigned long long held, total_held = 0, handed = 0;
    double t = 0, start = 0;
    unsigned in_window = 0;
    int opened = 0;

    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int ok = dlog_limit_take(&l, steps[i].t, &held);
        CHECKF(ok == steps[i].allowed && held == steps[i].held_before,
               "at %.2f s: allowed %d, %llu held before (want %d, %llu)", steps[i].t, ok, held,
               steps[i].allowed, steps[i].held_before);
    }
    /* a timer: the count once the window is over, once; the window closed */
    memset(&l, 0, sizeof l);
    l.burst = 2;
    l.window = 10;
    CHECK(dlog_limit_due(&l, 0) == 0);
    CHECK(dlog_limit_take(&l, 0, &held) == 1 && dlog_limit_take(&l, 1, &held) == 1);
    CHECK(dlog_limit_take(&l, 2, &held) == 0 && dlog_limit_take(&l, 3, &held) == 0);
    CHECK(dlog_limit_due(&l, 9.9) == 0 && dlog_limit_due(&l, 10) == 2 &&
          dlog_limit_due(&l, 11) == 0);
    CHECK(dlog_limit_take(&l, 12, &held) == 1 && held == 0);
    CHECK(dlog_limit_due(&l, 30) == 0); /* (nothing held: the window stays) */
    CHECK(dlog_limit_take(&l, 31, &held) == 1 && held == 0 && l.start == 31);

    memset(&l, 0, sizeof l);
    l.burst = 1 + (unsigned)(next() % 20);
    l.window = 0.5 + (double)(next() % 100) / 10;
    for (int i = 0; i < 100000; i++) {
        int ok;
        t += (double)(next() % 1000) / 1000.0 * (next() % 4 ? 0.01 : 3.0);
        if (next() % 8 == 0) {
            handed += dlog_limit_due(&l, t);
            continue;
        }
        ok = dlog_limit_take(&l, t, &held);
        handed += held;
        if (!opened || t - start >= l.window) {
            opened = 1;
            start = t;
            in_window = 0;
        } else {
            CHECKF(held == 0, "%llu handed over inside a window", held);
        }
        in_window += (unsigned)ok;
        CHECKF(in_window <= l.burst, "%u lines in a window of burst %u", in_window, l.burst);
        CHECKF(ok || in_window == l.burst, "refused with %u of %u used", in_window, l.burst);
        total_held += (unsigned long long)!ok;
    }
    CHECKF(handed + l.held == total_held, "%llu handed over + %llu held != %llu", handed, l.held,
           total_held);
    return 0;
}

int main(void)
{
    TEST_CASE(case_prefix_matches_libc);
    TEST_CASE(case_prefix_cut_to_fit);
    TEST_CASE(case_signal_safe_line);
    TEST_CASE(case_log_limit);
    return test_finish();
}
