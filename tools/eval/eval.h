/* eval.h - dgemma-eval's subcommands.  Each returns the process exit code:
 * 0 success, 1 failure (message already printed), 2 usage error; accuracy
 * also 3 (the daemon unreachable or gone). */
#ifndef DG_EVAL_H
#define DG_EVAL_H

int cmd_inspect(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

int cmd_generate(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
/* Exact-match accuracy of a running daemon over a problems file. */
int cmd_accuracy(int argc, char **argv);

/* Print "dgemma-eval: <msg>" to stderr. */
void eval_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>



/* Read whitespace-separated ids in [0, vocab) from path ("-": standard
 * input).  Returns 0, or 1 after printing the error. */
int eval_read_ids(const char *path, int64_t vocab, int32_t **ids, size_t *n);

#endif
