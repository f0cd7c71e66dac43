/* accuracy-run.h - `dgemma-eval accuracy`'s talk with the daemon: every
 * problem as a text generate request (not streamed, seed = its id, no
 * other setting), a fixed number in flight at once, each answer compared
 * byte for byte with the problem's. */
#ifndef DG_EVAL_ACCURACY_RUN_H
#define DG_EVAL_ACCURACY_RUN_H

#include <stddef.h>

#include "client/dgemma.h"
#include "tools/eval/problems.h"

/* What became of one problem's request. */
struct eval_outcome {
    int ok;                 /* the done event's text equals the answer, byte for byte */
    char *text;             /* the done event's text (text_len bytes, NUL-terminated);
                               NULL when it had none or the request failed before one */
    size_t text_len;
    char *error_code;       /* the request failed (an error event, or a done with finish
                               "error", or a done without text): why; else NULL */
    char *error_message;
    int canvases;           /* from the done event */
    long long decoder_steps;
};

/* Send problems v[0..n) over c, at most parallel (>= 1) in flight, and
 * fill out[0..n) (zeroed by the caller).  A request the daemon refuses as
 * busy is sent again half a second later, until the daemon has refused it
 * for busy_limit_s seconds in a row (0: no limit), which ends the run;
 * any other refusal or failure is
 * the problem's outcome (wrong), printed to standard error with the
 * problem's id.  progress: show a progress line on standard error.
 * Returns 0 when every problem has an outcome; -1 after printing why when
 * the daemon went away or cannot go on with this run (the connection lost
 * or broken, the daemon shutting down or cancelling a request, busy past
 * busy_limit_s, out of memory). */
int eval_accuracy_run(dgemma_t *c, const struct eval_problem *v, size_t n, int parallel,
                      double busy_limit_s, int progress, struct eval_outcome *out);

/* Free an outcome's strings (and leave it zeroed). */
void eval_outcome_free(struct eval_outcome *o);

#endif
