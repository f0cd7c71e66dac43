/* eval.h - dgemma-eval's subcommands.  Each returns the process exit code:
 * 0 success, 1 failure (message already printed), 2 usage error. */
#ifndef DG_EVAL_H
#define DG_EVAL_H

int cmd_inspect(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

/* Print "dgemma-eval: <msg>" to stderr. */
void eval_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
