/* problems.c - read and check the problems file of `dgemma-eval accuracy`
 * (see problems.h). */
#include "tools/eval/problems.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/grow.h"
#include "lib/json-util.h"
#include "tools/eval/eval.h"

/* Copy a JSON string's n bytes with a NUL after them; NULL when out of memory. */
static char *copy_bytes(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* The string value of obj[key] in *s (*n bytes); on a key that is missing
 * or not a string, the reason in why (prefixed with ctx) and -1. */
static int get_string(const json_t *obj, const char *key, const char *ctx, const char **s,
                      size_t *n, char *why, size_t why_len)
{
    struct dg_error err = {0};
    if (dg_json_get_string(obj, key, DG_JSON_REQUIRED, ctx, s, &err) < 0) {
        snprintf(why, why_len, "%s", err.msg);
        return -1;
    }
    *n = json_string_length(json_object_get(obj, key));
    return 0;
}

/* Parse one non-blank line (len bytes, no newline) into *p.  Returns 0; -1
 * with the reason in why ("PATH:LINE: ..."); -2 when out of memory. */
static int parse_line(const char *path, int line, const char *text, size_t len,
                      struct eval_problem *p, char *why, size_t why_len)
{
    char ctx[512], what[512];
    struct dg_error err = {0};
    const char *task, *prompt, *answer;
    size_t task_n, prompt_n, answer_n;
    json_t *o;
    int rc = -1;

    snprintf(ctx, sizeof ctx, "%s:%d: ", path, line);
    snprintf(what, sizeof what, "%s:%d", path, line);
    o = dg_json_loadb(text, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, what, &err);
    if (!o) {
        snprintf(why, why_len, "%s", err.msg);
        return err.code == DG_E_NOMEM ? -2 : -1;
    }
    memset(p, 0, sizeof *p);
    p->line = line;
    if (!json_is_object(o)) {
        snprintf(why, why_len, "%sexpected a JSON object, got %s", ctx, dg_json_type_name(o));
    } else if (dg_json_get_int(o, "id", 1, LLONG_MAX, DG_JSON_REQUIRED, ctx, &p->id, &err) < 0) {
        snprintf(why, why_len, "%s", err.msg);
    } else if (get_string(o, "task", ctx, &task, &task_n, why, why_len) < 0 ||
               get_string(o, "prompt", ctx, &prompt, &prompt_n, why, why_len) < 0 ||
               get_string(o, "answer", ctx, &answer, &answer_n, why, why_len) < 0) {
        /* why is set */
    } else if (task_n == 0) {
        snprintf(why, why_len, "%stask: must not be empty", ctx);
    } else if (strlen(prompt) != prompt_n) {
        snprintf(why, why_len, "%sprompt: holds a NUL byte (\\u0000)", ctx);
    } else {
        size_t i;
        for (i = 0; i < task_n && (unsigned char)task[i] >= 0x20 && task[i] != 0x7f; i++)
            ;
        if (i < task_n) {
            snprintf(why, why_len, "%stask: holds a control character (byte %zu)", ctx, i);
        } else {
            p->task = copy_bytes(task, task_n);
            p->prompt = copy_bytes(prompt, prompt_n);
            p->answer = copy_bytes(answer, answer_n);
            p->answer_len = answer_n;
            rc = p->task && p->prompt && p->answer ? 0 : -2;
            if (rc < 0)
                snprintf(why, why_len, "%s: out of memory", what);
        }
    }
    if (rc < 0) {
        free(p->task);
        free(p->prompt);
        free(p->answer);
        memset(p, 0, sizeof *p);
    }
    json_decref(o);
    return rc;
}

struct id_line {
    long long id;
    int line;
};

static int by_id_then_line(const void *a, const void *b)
{
    const struct id_line *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

/* The earliest line whose id an earlier line already has: its line in
 * *dup and the first line with that id in *first.  Returns 1 if there is
 * one, 0 if the ids are unique, -1 when out of memory. */
static int find_duplicate(const struct eval_problems *ps, int *dup, int *first, long long *id)
{
    struct id_line *v = malloc((ps->n ? ps->n : 1) * sizeof *v);
    int found = 0;
    if (!v)
        return -1;
    for (size_t i = 0; i < ps->n; i++) {
        v[i].id = ps->v[i].id;
        v[i].line = ps->v[i].line;
    }
    qsort(v, ps->n, sizeof *v, by_id_then_line);
    for (size_t i = 1, group = 0; i < ps->n; i++) {
        if (v[i].id != v[group].id) {
            group = i;
        } else if (!found || v[i].line < *dup) {
            found = 1;
            *dup = v[i].line;
            *first = v[group].line;
            *id = v[i].id;
        }
    }
    free(v);
    return found;
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

int eval_problems_load(const char *path, struct eval_problems *out)
{
    FILE *f = fopen(path, "r");
    int rc;

    memset(out, 0, sizeof *out);
    if (!f) {
        eval_errorf("accuracy: %s: %s", path, strerror(errno));
        return -1;
    }
    rc = eval_problems_read(f, path, out);
    fclose(f);
    return rc;
}

int eval_problems_read(FILE *f, const char *path, struct eval_problems *out)
{
    struct eval_problems ps = {0};
    size_t cap = 0, line_cap = 0;
    char *text = NULL, why[1200] = "";
    ssize_t n;
    int line = 0, rc = 0, dup_line = 0, first_line = 0;
    long long dup_id = 0;

    memset(out, 0, sizeof *out);
    /* read up to the first bad line; the ids before it are checked after */
    while (rc == 0 && (n = getline(&text, &line_cap, f)) >= 0) {
        line++;
        if (is_blank(text, (size_t)n))
            continue;
        struct eval_problem *v = dg_grow(ps.v, &cap, ps.n + 1, sizeof *v, 256);
        if (!v) {
            snprintf(why, sizeof why, "%s: out of memory", path);
            rc = -1;
            break;
        }
        ps.v = v;
        if (n > 0 && text[n - 1] == '\n')
            n--;
        if (parse_line(path, line, text, (size_t)n, &ps.v[ps.n], why, sizeof why) == 0)
            ps.n++;
        else
            rc = -1;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(why, sizeof why, "%s: cannot read it: %s", path, strerror(errno));
        rc = -1;
    }
    free(text);
    switch (find_duplicate(&ps, &dup_line, &first_line, &dup_id)) {
    case 1: /* a duplicate comes before any bad line (only lines before one were kept) */
        snprintf(why, sizeof why, "%s:%d: id %lld is a duplicate (first on line %d)", path,
                 dup_line, dup_id, first_line);
        rc = -1;
        break;
    case -1:
        snprintf(why, sizeof why, "%s: out of memory", path);
        rc = -1;
        break;
    }
    if (rc == 0 && ps.n == 0) {
        snprintf(why, sizeof why, "%s: no problems in it (an empty file?)", path);
        rc = -1;
    }
    if (rc < 0) {
        eval_errorf("accuracy: %s", why);
        eval_problems_free(&ps);
        return -1;
    }
    *out = ps;
    return 0;
}

void eval_problems_free(struct eval_problems *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->v[i].task);
        free(p->v[i].prompt);
        free(p->v[i].answer);
    }
    free(p->v);
    p->v = NULL;
    p->n = 0;
}
