/* problems.h - the problems file of `dgemma-eval accuracy`: JSON lines,
 * each {"id": integer >= 1, "task": string, "prompt": string,
 * "answer": string}, read and checked whole before anything is sent. */
#ifndef DG_EVAL_PROBLEMS_H
#define DG_EVAL_PROBLEMS_H

#include <stddef.h>
#include <stdio.h>

struct eval_problem {
    long long id;       /* >= 1, unique in the file */
    int line;           /* 1-based line of the file */
    char *task;         /* non-empty, no control characters */
    char *prompt;       /* no NUL bytes (it goes out as a C string) */
    char *answer;       /* answer_len bytes (may hold NULs), NUL-terminated too */
    size_t answer_len;
};

struct eval_problems {
    struct eval_problem *v;  /* in file order */
    size_t n;
};

/* Read every problem of path into *out (file order).  Blank lines are
 * skipped; keys other than the four are ignored.  A line that is not a
 * JSON object, a key missing or of the wrong type, an id < 1, a task that
 * is empty or holds a control character, a prompt with a NUL byte, an id
 * seen on an earlier line, or a file with no problem at all: the first
 * such fault in file order is printed as "accuracy: PATH:LINE: why" (or
 * "accuracy: PATH: why") and -1 returned, with *out empty.  Returns 0 on
 * success. */
int eval_problems_load(const char *path, struct eval_problems *out);

/* The same over an open stream f (read to its end or its first bad line;
 * not closed), path naming it in messages. */
int eval_problems_read(FILE *f, const char *path, struct eval_problems *out);

/* Free what eval_problems_load filled in (an empty *p is fine). */
void eval_problems_free(struct eval_problems *p);

#endif
