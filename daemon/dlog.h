/*
 * dlog.h - the daemon's one logger.  Every line:
 *
 *   PID:T DD Mon YYYY HH:MM:SS.mmm L message
 *
 * T is the thread's tag (M main / front end, S scheduler, W the metrics
 * writer, - any other thread, such as the backend's rank workers, whose
 * messages name their rank), L one of E W I D.  Lines go to a file
 * (appending, reopened on SIGHUP) or to standard error, one write(2) each,
 * so threads do not interleave within a line.  lib/'s messages arrive here
 * through dlog_lib_sink.
 */
#ifndef DG_DAEMON_DLOG_H
#define DG_DAEMON_DLOG_H

#include <stddef.h>

#include "lib/error.h"
#include "lib/log.h"

/* Log to path ("" or NULL: standard error) up to level.  Errors: DG_E_IO. */
int dlog_open(const char *path, enum dg_log_level level, struct dg_error *err);

/* Reopen the file (after a rotation).  On failure the old one stays. */
int dlog_reopen(struct dg_error *err);

void dlog_close(void);

/* This thread's tag character. */
void dlog_set_tag(char tag);

void dlog(enum dg_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A dg_log sink (lib/log.h) that writes through dlog. */
void dlog_lib_sink(void *userdata, enum dg_log_level level, const char *line);

/* Call fn(ctx, message) for every error line, after it is written, except
 * from the thread tagged 'W' (the metrics writer, which must not feed
 * itself).  Set before threads start and cleared (NULL) after they stop. */
void dlog_set_error_hook(void (*fn)(void *ctx, const char *msg), void *ctx);

/* Async-signal-safe: write msg as an error line (the prefix above, with
 * the local time's UTC offset as the last line before it saw it) in one
 * write(2); a message is cut to fit 1 KB. */
void dlog_signal_safe(const char *msg);

/* Async-signal-safe: s appended to b (capacity cap, kept NUL-terminated,
 * cut to fit) at offset at; returns the new end.  For composing a message
 * for dlog_signal_safe in a handler. */
size_t dlog_put(char *b, size_t at, size_t cap, const char *s);

/* The prefix "PID:T DD Mon YYYY HH:MM:SS.mmm L " of a line at t seconds
 * since the epoch and ms milliseconds, local time being offset seconds
 * east of UTC, into buf (capacity cap, NUL-terminated, cut to fit);
 * returns its length.  Async-signal-safe (no locale, no time zone
 * lookup). */
size_t dlog_format_prefix(char *buf, size_t cap, long long t, int ms, long offset, long pid,
                          char tag, char level);

#endif
