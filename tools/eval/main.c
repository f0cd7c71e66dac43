/*
 * dgemma-eval - offline tools over the dgemma engine: inspect a
 * checkpoint, write a random-weight one, run the CPU forward pass, compare
 * arrays, tokenize, generate; and measure a running daemon's exact-match
 * accuracy.  See man/dgemma-eval.1.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lib/log.h"
#include "lib/version.h"
#include "tools/eval/eval.h"

static const char usage[] =
    "usage: dgemma-eval COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  inspect DIR [--json]      validate a checkpoint directory and describe it\n"
    "  mkmodel --out DIR [...]   write a checkpoint with random weights\n"
    "  forward --model DIR ...   run the CPU backend on token ids, write .npy\n"
    "  compare A.npy B.npy       compare two float32 arrays\n"
    "  tokenize --tokenizer F    JSON lines of text or chat messages to token ids\n"
    "  generate --model DIR ...  generate text on the CPU backend\n"
    "  plan --preset NAME ...    tensor-parallel split: bytes per rank, collectives\n"
    "  quantize --model DIR ...  write the model with FP8 weights (W8A8 layout)\n"
    "  accuracy --problems FILE  exact-match accuracy of a running daemon\n"
    "\n"
    "dgemma-eval COMMAND --help shows a command's options; dgemma-eval --version the\n"
    "version.\n";

void eval_errorf(const char *fmt, ...)
{
    va_list ap;
    fputs("dgemma-eval: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void log_to_stderr(void *ud, enum dg_log_level level, const char *line)
{
    (void)ud;
    fprintf(stderr, "dgemma-eval: %s: %s\n",
            level == DG_LOG_ERROR ? "error" : level == DG_LOG_WARN ? "warning" : "note", line);
}

int main(int argc, char **argv)
{
    dg_log_set_sink(log_to_stderr, NULL, DG_LOG_WARN);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dgemma-eval %s\n", DGEMMA_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "inspect"))
        return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "mkmodel"))
        return cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(argv[1], "forward"))
        return cmd_forward(argc - 1, argv + 1);
    if (!strcmp(argv[1], "compare"))
        return cmd_compare(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize"))
        return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate"))
        return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "quantize"))
        return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan"))
        return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "accuracy"))
        return cmd_accuracy(argc - 1, argv + 1);
    eval_errorf("unknown command '%s'", argv[1]);
    fputs(usage, stderr);
    return 2;
}
