/* dlog.c - the daemon's logger (see dlog.h). */
#include "daemon/dlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char line[2304];
    struct timeval tv;
    struct tm tm;
    int n;

    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
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

void dlog_signal_safe(const char *msg)
{
    /* no locks, no formatting: a handler may interrupt a locked write */
    ssize_t r = write(log_fd, msg, strlen(msg));
    r = write(log_fd, "\n", 1);
    (void)r;
}
