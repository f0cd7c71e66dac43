/* ids-text.c - see ids-text.h. */
#include "lib/ids-text.h"

#include <stdlib.h>

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int dg_ids_parse(const char *text, size_t len, int64_t vocab, const char *what, int32_t **ids,
                 size_t *n, struct dg_error *err)
{
    size_t cap = 64, count = 0, i = 0, line = 1, line_start = 0;
    int32_t *out = malloc(cap * sizeof *out);

    *ids = NULL;
    *n = 0;
    if (!out)
        return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
    while (i < len) {
        long long v = 0;
        size_t start;
        if (is_space(text[i])) {
            if (text[i] == '\n') {
                line++;
                line_start = i + 1;
            }
            i++;
            continue;
        }
        start = i;
        while (i < len && !is_space(text[i])) {
            if (text[i] < '0' || text[i] > '9' || i - start >= 10) {
                while (i < len && !is_space(text[i]))
                    i++;
                free(out);
                return dg_error_set(err, DG_E_FORMAT,
                                    "%s:%zu:%zu: '%.*s' is not a token id (a non-negative "
                                    "decimal integer)", what, line, start - line_start + 1,
                                    (int)(i - start > 32 ? 32 : i - start), text + start);
            }
            v = v * 10 + (text[i] - '0');
            i++;
        }
        if (v >= vocab) {
            free(out);
            return dg_error_set(err, DG_E_FORMAT, "%s:%zu:%zu: id %lld is outside the vocabulary "
                                "[0, %lld)", what, line, start - line_start + 1, v,
                                (long long)vocab);
        }
        if (count == cap) {
            int32_t *p = realloc(out, 2 * cap * sizeof *out);
            if (!p) {
                free(out);
                return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
            }
            out = p;
            cap *= 2;
        }
        out[count++] = (int32_t)v;
    }
    if (!count) {
        free(out);
        return dg_error_set(err, DG_E_FORMAT, "%s: no token ids", what);
    }
    *ids = out;
    *n = count;
    return 0;
}
