/* dlog.c - the daemon's logger (see dlog.h). */
#include "daemon/dlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = 2;
static int own_fd;            /* 1 when log_fd is a file we opened */
static char log_path[4096];
static enum dg_log_level max_level = DG_LOG_INFO;
static __thread char thread_tag = '-';
static void (*error_hook)(void *, const char *);
static void *error_hook_ctx;
/* local time's offset from UTC in seconds as the last formatted line saw
 * it, for dlog_signal_safe, which may not call localtime_r */
static atomic_long utc_offset;
static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

void dlog_set_error_hook(void (*fn)(void *ctx, const char *msg), void *ctx)
{
    error_hook = fn;
    error_hook_ctx = ctx;
}

int dlog_open(const char *path, enum dg_log_level level, struct dg_error *err)
{
    max_level = level;
    if (!path || !*path) {
        log_fd = 2;
        own_fd = 0;
        log_path[0] = '\0';
        return 0;
    }
    snprintf(log_path, sizeof log_path, "%s", path);
    return dlog_reopen(err);
}

int dlog_reopen(struct dg_error *err)
{
    int fd, old;
    if (!log_path[0])
        return 0;
    fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return dg_error_set(err, DG_E_IO, "%s: cannot open the log: %s", log_path,
                            strerror(errno));
    pthread_mutex_lock(&mu);
    old = own_fd ? log_fd : -1;
    log_fd = fd;
    own_fd = 1;
    pthread_mutex_unlock(&mu);
    if (old >= 0)
        close(old);
    return 0;
}

void dlog_close(void)
{
    pthread_mutex_lock(&mu);
    if (own_fd)
        close(log_fd);
    log_fd = 2;
    own_fd = 0;
    pthread_mutex_unlock(&mu);
}

void dlog_set_tag(char tag)
{
    thread_tag = tag;
}

static void emit(enum dg_log_level level, const char *msg)
{
    char line[2304];
    struct timeval tv;
    struct tm tm;
    int n;

    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    atomic_store_explicit(&utc_offset, tm.tm_gmtoff, memory_order_relaxed);
    n = snprintf(line, sizeof line - 1, "%d:%c %02d %s %04d %02d:%02d:%02d.%03d %c %s",
                 (int)getpid(), thread_tag, tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                 dg_log_level_char(level), msg);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&mu);
    {
        ssize_t off = 0;
        while (off < n) {
            ssize_t w = write(log_fd, line + off, (size_t)(n - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += w;
        }
    }
    pthread_mutex_unlock(&mu);
}

void dlog(enum dg_log_level level, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    if (level > max_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(level, msg);
    if (level == DG_LOG_ERROR && error_hook && thread_tag != 'W')
        error_hook(error_hook_ctx, msg);
}

void dlog_lib_sink(void *userdata, enum dg_log_level level, const char *line)
{
    (void)userdata;
    if (level <= max_level)
        emit(level, line);
    if (level == DG_LOG_ERROR && error_hook && thread_tag != 'W')
        error_hook(error_hook_ctx, line);
}

size_t dlog_put(char *b, size_t at, size_t cap, const char *s)
{
    while (*s && at + 1 < cap)
        b[at++] = *s++;
    b[at] = '\0';
    return at;
}

/* v in decimal, at least width digits (zeros before) */
static size_t put_uint(char *b, size_t at, size_t cap, unsigned long v, int width)
{
    char d[24];
    int n = 0;
    do {
        d[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < (int)sizeof d);
    while (n < width && n < (int)sizeof d)
        d[n++] = '0';
    while (n > 0 && at + 1 < cap)
        b[at++] = d[--n];
    b[at] = '\0';
    return at;
}

size_t dlog_format_prefix(char *buf, size_t cap, long long t, int ms, long offset, long pid,
                          char tag, char level)
{
    /* the civil date of a day count from 1970-01-01, in the proleptic
     * Gregorian calendar (eras of 400 years, March-based years) */
    const long long local = t + offset;
    const long long days = (local >= 0 ? local : local - 86399) / 86400;
    const long long secs = local - days * 86400;
    const long long z = days + 719468;
    const long long era = (z >= 0 ? z : z - 146096) / 146097;
    const long long doe = z - era * 146097;
    const long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const long long mp = (5 * doy + 2) / 153;
    const long long day = doy - (153 * mp + 2) / 5 + 1;
    const long long month = mp < 10 ? mp + 3 : mp - 9;
    const long long year = yoe + era * 400 + (month <= 2);
    const char sep[2] = {tag, '\0'}, lv[2] = {level, '\0'};
    size_t n = 0;
    if (cap == 0)
        return 0;
    buf[0] = '\0';
    n = put_uint(buf, n, cap, (unsigned long)pid, 1);
    n = dlog_put(buf, n, cap, ":");
    n = dlog_put(buf, n, cap, sep);
    n = dlog_put(buf, n, cap, " ");
    n = put_uint(buf, n, cap, (unsigned long)day, 2);
    n = dlog_put(buf, n, cap, " ");
    n = dlog_put(buf, n, cap, months[month - 1]);
    n = dlog_put(buf, n, cap, " ");
    n = put_uint(buf, n, cap, (unsigned long)(year > 0 ? year : 0), 4);
    n = dlog_put(buf, n, cap, " ");
    n = put_uint(buf, n, cap, (unsigned long)(secs / 3600), 2);
    n = dlog_put(buf, n, cap, ":");
    n = put_uint(buf, n, cap, (unsigned long)(secs / 60 % 60), 2);
    n = dlog_put(buf, n, cap, ":");
    n = put_uint(buf, n, cap, (unsigned long)(secs % 60), 2);
    n = dlog_put(buf, n, cap, ".");
    n = put_uint(buf, n, cap, (unsigned long)ms, 3);
    n = dlog_put(buf, n, cap, " ");
    n = dlog_put(buf, n, cap, lv);
    return dlog_put(buf, n, cap, " ");
}

void dlog_signal_safe(const char *msg)
{
    /* no locks, no stdio, no localtime_r: a handler may interrupt any of
     * them.  clock_gettime, getpid and write are async-signal-safe; the
     * UTC offset is the last formatted line's */
    struct timespec ts;
    char line[1280];
    size_t n;
    ssize_t r;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = dlog_format_prefix(line, sizeof line, (long long)ts.tv_sec, (int)(ts.tv_nsec / 1000000),
                           atomic_load_explicit(&utc_offset, memory_order_relaxed),
                           (long)getpid(), thread_tag, dg_log_level_char(DG_LOG_ERROR));
    n = dlog_put(line, n, sizeof line - 1, msg);
    line[n++] = '\n';
    r = write(log_fd, line, n);
    (void)r;
}
