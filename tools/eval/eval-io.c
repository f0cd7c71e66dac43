/* eval-io.c - input helpers shared by dgemma-eval's subcommands. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "tools/eval/eval.h"

#define IDS_FILE_MAX (64u << 20)

int eval_read_ids(const char *path, int64_t vocab, int32_t **ids, size_t *n)
{
    struct dg_error err = {0};
    char *text = NULL;
    size_t len = 0;
    int rc;

    if (!strcmp(path, "-")) {
        size_t cap = 4096;
        text = malloc(cap);
        while (text) {
            size_t got = fread(text + len, 1, cap - len - 1, stdin);
            len += got;
            if (got == 0 || len > IDS_FILE_MAX)
                break;
            if (len + 1 == cap) {
                char *p = realloc(text, cap * 2);
                if (!p) {
                    free(text);
                    text = NULL;
                    break;
                }
                text = p;
                cap *= 2;
            }
        }
        if (!text) {
            eval_errorf("out of memory reading standard input");
            return 1;
        }
        rc = len > IDS_FILE_MAX ? dg_error_set(&err, DG_E_RANGE, "standard input: too long")
                                : dg_ids_parse(text, len, vocab, "standard input", ids, n, &err);
    } else {
        rc = dg_file_read(path, IDS_FILE_MAX, &text, &len, &err);
        if (rc == 0)
            rc = dg_ids_parse(text, len, vocab, path, ids, n, &err);
    }
    free(text);
    if (rc) {
        eval_errorf("%s", err.msg);
        return 1;
    }
    return 0;
}
