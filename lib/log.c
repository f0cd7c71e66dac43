/* log.c - see log.h. */
#include "lib/log.h"

#include <stdarg.h>
#include <stdio.h>

static dg_log_fn sink_fn;
static void *sink_userdata;
static enum dg_log_level sink_max = DG_LOG_INFO;

void dg_log_set_sink(dg_log_fn fn, void *userdata, enum dg_log_level max_level)
{
    sink_fn = fn;
    sink_userdata = userdata;
    sink_max = max_level;
}

void dg_log(enum dg_log_level level, const char *fmt, ...)
{
    char line[2048];
    va_list ap;

    if (!sink_fn || level > sink_max)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    sink_fn(sink_userdata, level, line);
}

char dg_log_level_char(enum dg_log_level level)
{
    switch (level) {
    case DG_LOG_ERROR: return 'E';
    case DG_LOG_WARN: return 'W';
    case DG_LOG_INFO: return 'I';
    case DG_LOG_DEBUG: return 'D';
    }
    return '?';
}
