/*
 * Fuzz target: the problems file of `dgemma-eval accuracy`
 * (tools/eval/problems.c), read from the input's bytes.  Properties:
 *  - it is accepted or refused, never anything else; a refusal leaves the
 *    set empty and prints one reason;
 *  - an accepted file has one problem per non-blank line (counted here
 *    independently: lines split at '\n', blank = only space, tab, CR),
 *    in file order, each on its own line number (increasing, within the
 *    file's line count);
 *  - every problem keeps the parser's promises: id >= 1 and unique; task
 *    non-empty with no control character; prompt a C string of its own
 *    length; answer answer_len bytes followed by a NUL.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/eval/problems.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int n_reasons; /* eval_errorf calls in this input */

/* (dgemma-eval's main.c has the real one; the parser's reason goes here) */
void eval_errorf(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    n_reasons++;
}

/* The non-blank lines of data: their count, their 1-based numbers in
 * lines[] (at most cap), and the file's line count in *total. */
static size_t nonblank_lines(const uint8_t *data, size_t size, int *lines, size_t cap,
                             int *total)
{
    size_t n = 0, i = 0;
    int line = 0;
    while (i < size) {
        size_t j = i;
        int blank = 1;
        while (j < size && data[j] != '\n') {
            if (data[j] != ' ' && data[j] != '\t' && data[j] != '\r')
                blank = 0;
            j++;
        }
        line++;
        if (!blank) {
            if (n < cap)
                lines[n] = line;
            n++;
        }
        i = j + 1;
    }
    *total = line;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct eval_problems ps;
    FILE *f;
    int rc, total, *lines;
    size_t want;

    if (size > (1u << 14))
        return 0;
    /* fmemopen of zero bytes is refused by some C libraries: a one-byte
     * buffer read as empty instead */
    f = fmemopen(size ? (void *)data : (void *)"", size ? size : 1, "r");
    if (!f)
        abort();
    if (!size)
        fgetc(f);
    n_reasons = 0;
    rc = eval_problems_read(f, "input", &ps);
    fclose(f);
    if (rc != 0) {
        if (rc != -1 || ps.n != 0 || ps.v != NULL || n_reasons != 1)
            abort();
        return 0;
    }
    if (n_reasons != 0 || ps.n == 0)
        abort();
    lines = malloc(ps.n * sizeof *lines);
    if (!lines)
        abort();
    want = nonblank_lines(data, size, lines, ps.n, &total);
    if (want != ps.n)
        abort();
    for (size_t i = 0; i < ps.n; i++) {
        const struct eval_problem *p = &ps.v[i];
        if (p->line != lines[i] || p->line < 1 || p->line > total || p->id < 1)
            abort();
        for (size_t j = 0; j < i; j++)
            if (ps.v[j].id == p->id)
                abort();
        if (!p->task || !p->task[0] || !p->prompt || !p->answer || p->answer[p->answer_len])
            abort();
        for (const char *c = p->task; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                abort();
    }
    free(lines);
    eval_problems_free(&ps);
    return 0;
}
