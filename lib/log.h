/*
 * log.h - how lib/ reports things worth logging without printing.
 *
 * lib/ never writes to stdout/stderr.  A program that wants lib/'s warnings
 * (the daemon, the tools) installs a sink once, before it starts threads;
 * without a sink every message is dropped.  The sink receives the level and
 * one formatted line without a trailing newline; the line format on disk is
 * the sink's business (the daemon's logger adds time, pid, thread, level).
 */
#ifndef DG_LOG_H
#define DG_LOG_H

enum dg_log_level {
    DG_LOG_ERROR = 0,
    DG_LOG_WARN = 1,
    DG_LOG_INFO = 2,
    DG_LOG_DEBUG = 3,
};

typedef void (*dg_log_fn)(void *userdata, enum dg_log_level level, const char *line);

/* Install (or, with fn == NULL, remove) the sink.  Messages above max_level
 * are dropped before formatting.  Not thread-safe against concurrent
 * dg_log() calls: call it during start-up. */
void dg_log_set_sink(dg_log_fn fn, void *userdata, enum dg_log_level max_level);

/* Format and pass one line to the sink, if any and if level <= max_level.
 * Lines longer than 2 KiB are truncated. */
void dg_log(enum dg_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One upper-case letter per level, for sinks: E W I D. */
char dg_log_level_char(enum dg_log_level level);

#endif
