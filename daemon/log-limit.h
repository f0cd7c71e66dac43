/*
 * log-limit.h - a bound on how many lines of one kind the log takes: at
 * most `burst` in a window of `window` seconds; the rest are held back and
 * counted, and the count is handed over when the next window opens (or a
 * timer finds the window over), so that a client sending bad lines in a
 * loop cannot fill the disk while an operator still sees that it happens
 * and how often.
 */
#ifndef DG_DAEMON_LOG_LIMIT_H
#define DG_DAEMON_LOG_LIMIT_H

struct dlog_limit {
    unsigned burst;            /* lines a window may log */
    double window;             /* seconds */
    double start;              /* when the current window opened (monotonic s) */
    unsigned used;             /* lines logged in it */
    unsigned long long held;   /* lines held back in it */
    int open;                  /* a window has opened */
};

/* May a line be logged at now (monotonic seconds, not decreasing)?  A new
 * window opens at the first call and at the first call window seconds or
 * more after the last one opened; *held_before then gets the count of
 * lines the closed window held back (0 if none or no window closed), for
 * the caller to log before its own line. */
int dlog_limit_take(struct dlog_limit *l, double now, unsigned long long *held_before);

/* For a timer, so that a count held back is told even when no line
 * follows: when the window is over and held lines back, their count (the
 * window closes: the next take opens one); 0 otherwise. */
unsigned long long dlog_limit_due(struct dlog_limit *l, double now);

#endif
