/* cmd-accuracy.c - `dgemma-eval accuracy`: exact-match accuracy of a
 * running daemon over a problems file (problems.h), per task and in total,
 * with the mean denoising steps per canvas; optionally every problem's
 * result as JSON lines. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "lib/json-util.h"
#include "tools/eval/accuracy-run.h"
#include "tools/eval/eval.h"
#include "tools/eval/problems.h"

enum {
    ACC_PASS = 0,    /* accuracy >= --min */
    ACC_BELOW = 1,   /* below --min (or the results not written, out of memory) */
    ACC_USAGE = 2,   /* usage, or a bad problems file */
    ACC_LOST = 3,    /* the daemon is unreachable, went away or stayed busy */
};

static const char usage[] =
    "usage: dgemma-eval accuracy --problems FILE [-s SOCKET] [--wait SECONDS]\n"
    "                            [--limit N] [--parallel N] [--min FRACTION]\n"
    "                            [--results FILE] [--busy-timeout SECONDS]\n"
    "Send each problem of FILE (JSON lines {\"id\": N, \"task\": \"...\", \"prompt\":\n"
    "\"...\", \"answer\": \"...\"}) to the running daemon as a text request (seed =\n"
    "its id, the model's default settings) and compare the text with the answer\n"
    "byte for byte.  Prints per task \"TASK  OK/N  = ACC\", then \"exact match OK/N\n"
    "= ACC\" and \"steps per canvas X\".  -s/--socket defaults to $DGEMMA_SOCKET,\n"
    "else " DGEMMA_DEFAULT_SOCKET "; --wait (default 0) waits that long for it.\n"
    "--limit: only the first N problems.  --parallel (default 8): requests in\n"
    "flight at once.  --results: one JSON line per problem, in id order.\n"
    "--busy-timeout (default 600; 0: none): give up when the daemon has refused\n"
    "one problem as busy for that long.\n"
    "Exit status: 0 accuracy >= --min (default 0), 1 below it, 2 usage or a bad\n"
    "problems file (nothing is sent), 3 the daemon is unreachable, went away or\n"
    "stayed busy.\n";

struct acc_opts {
    const char *problems, *socket, *results;
    double wait_s, min, busy_s;
    long long limit;     /* 0: all */
    int parallel;
};

/* The value after argv[*i] as a number in [lo, hi] (an integer when
 * integer); advances *i.  Returns 0, or -1 after printing a usage error. */
static int number_arg(int argc, char **argv, int *i, double lo, double hi, int integer,
                      double *out)
{
    const char *flag = argv[*i], *s;
    char *end;
    double x;
    if (*i + 1 >= argc) {
        eval_errorf("accuracy: %s needs a value", flag);
        return -1;
    }
    s = argv[++*i];
    errno = 0;
    x = integer ? (double)strtoll(s, &end, 10) : strtod(s, &end);
    if (end == s || *end || errno || !isfinite(x) || x < lo || x > hi) {
        eval_errorf("accuracy: %s: '%s' is not %s in [%.*f, %.*f]", flag, s,
                    integer ? "an integer" : "a number", integer ? 0 : 1, lo, integer ? 0 : 1,
                    hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* Parse argv into *o.  Returns -1 to go on, or the exit code (help: 0,
 * a usage error: 2, printed). */
static int parse_options(int argc, char **argv, struct acc_opts *o)
{
    *o = (struct acc_opts){.parallel = 8, .busy_s = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--problems") || !strcmp(a, "-s") || !strcmp(a, "--socket") ||
            !strcmp(a, "--results")) {
            if (i + 1 >= argc) {
                eval_errorf("accuracy: %s needs a value", a);
                return ACC_USAGE;
            }
            if (!strcmp(a, "--problems"))
                o->problems = argv[++i];
            else if (!strcmp(a, "--results"))
                o->results = argv[++i];
            else
                o->socket = argv[++i];
        } else if (!strcmp(a, "--limit")) {
            if (number_arg(argc, argv, &i, 1, 1e15, 1, &x) < 0)
                return ACC_USAGE;
            o->limit = (long long)x;
        } else if (!strcmp(a, "--parallel")) {
            if (number_arg(argc, argv, &i, 1, 1024, 1, &x) < 0)
                return ACC_USAGE;
            o->parallel = (int)x;
        } else if (!strcmp(a, "--min")) {
            if (number_arg(argc, argv, &i, 0, 1, 0, &o->min) < 0)
                return ACC_USAGE;
        } else if (!strcmp(a, "--wait")) {
            if (number_arg(argc, argv, &i, 0, 3600, 0, &o->wait_s) < 0)
                return ACC_USAGE;
        } else if (!strcmp(a, "--busy-timeout")) {
            if (number_arg(argc, argv, &i, 0, 86400, 0, &o->busy_s) < 0)
                return ACC_USAGE;
        } else {
            eval_errorf("accuracy: unexpected argument '%s'", a);
            fputs(usage, stderr);
            return ACC_USAGE;
        }
    }
    if (!o->problems) {
        eval_errorf("accuracy: --problems FILE is required");
        fputs(usage, stderr);
        return ACC_USAGE;
    }
    return -1;
}

/* Print one line per task (in order of first appearance), the total and,
 * when the daemon reported canvases, the mean steps per canvas.  Returns
 * the fraction correct. */
static double report(const struct eval_problem *v, const struct eval_outcome *out, size_t n)
{
    size_t ok = 0;
    long long steps = 0, canvases = 0;

    for (size_t i = 0; i < n; i++) {
        size_t first = 0, t_ok = 0, t_n = 0;
        while (strcmp(v[first].task, v[i].task)) /* its first appearance */
            first++;
        ok += (size_t)out[i].ok;
        steps += out[i].decoder_steps;
        canvases += out[i].canvases;
        if (first < i)
            continue;
        for (size_t j = i; j < n; j++)
            if (!strcmp(v[j].task, v[i].task)) {
                t_n++;
                t_ok += (size_t)out[j].ok;
            }
        printf("%s  %zu/%zu  = %.4f\n", v[i].task, t_ok, t_n, (double)t_ok / (double)t_n);
    }
    printf("exact match %zu/%zu = %.4f\n", ok, n, (double)ok / (double)n);
    if (canvases > 0)
        printf("steps per canvas %.2f\n", (double)steps / (double)canvases);
    fflush(stdout);
    return (double)ok / (double)n;
}

static int by_id(const void *a, const void *b)
{
    const struct eval_problem *x = *(const struct eval_problem *const *)a;
    const struct eval_problem *y = *(const struct eval_problem *const *)b;
    return (x->id > y->id) - (x->id < y->id);
}

/* One problem's result as a JSON line, or NULL when out of memory. */
static char *result_line(const struct eval_problem *p, const struct eval_outcome *o)
{
    json_t *r = json_object();
    char *s;
    if (!r)
        return NULL;
    json_object_set_new(r, "id", json_integer(p->id));
    json_object_set_new(r, "task", json_string(p->task));
    json_object_set_new(r, "prompt", json_string(p->prompt));
    json_object_set_new(r, "answer", json_stringn(p->answer, p->answer_len));
    json_object_set_new(r, "text", o->text ? json_stringn(o->text, o->text_len) : json_null());
    json_object_set_new(r, "ok", json_boolean(o->ok));
    if (o->error_code)
        json_object_set_new(r, "error", json_pack("{s:s,s:s}", "code", o->error_code,
                                                  "message", o->error_message));
    /* (a value that failed to be made leaves its key out: counted as a failure) */
    s = json_object_size(r) == 6u + !!o->error_code
            ? dg_json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER)
            : NULL;
    json_decref(r);
    return s;
}

/* Write every problem's result to f in id order and close f.  Returns 0,
 * or -1 after printing why. */
static int write_results(FILE *f, const char *path, const struct eval_problem *v,
                         const struct eval_outcome *out, size_t n)
{
    const struct eval_problem **order = malloc(n * sizeof *order);
    int rc = order ? 0 : -1;

    errno = 0;
    for (size_t i = 0; order && i < n; i++)
        order[i] = &v[i];
    if (order)
        qsort(order, n, sizeof *order, by_id);
    for (size_t k = 0; rc == 0 && k < n; k++) {
        char *line = result_line(order[k], &out[order[k] - v]);
        if (!line || fprintf(f, "%s\n", line) < 0)
            rc = -1;
        free(line);
    }
    free(order);
    if (fclose(f) != 0 || rc < 0) {
        eval_errorf("accuracy: %s: cannot write the results: %s", path,
                    errno ? strerror(errno) : "out of memory");
        return -1;
    }
    return 0;
}

int cmd_accuracy(int argc, char **argv)
{
    struct acc_opts o;
    struct eval_problems ps = {0};
    struct eval_outcome *out = NULL;
    FILE *results = NULL;
    dgemma_t *c = NULL;
    size_t n;
    int rc = parse_options(argc, argv, &o);

    if (rc >= 0)
        return rc;
    if (eval_problems_load(o.problems, &ps) < 0)
        return ACC_USAGE;
    n = o.limit > 0 && (unsigned long long)o.limit < ps.n ? (size_t)o.limit : ps.n;
    if (o.results && !(results = fopen(o.results, "w"))) { /* (man: "could not be written") */
        eval_errorf("accuracy: %s: %s", o.results, strerror(errno));
        eval_problems_free(&ps);
        return ACC_BELOW;
    }
    rc = ACC_LOST;
    if (!(out = calloc(n, sizeof *out)) || !(c = dgemma_new())) {
        eval_errorf("accuracy: out of memory");
        rc = ACC_BELOW;
    } else if (dgemma_connect(c, o.socket, o.wait_s) < 0) {
        eval_errorf("accuracy: cannot reach the daemon: %s", dgemma_errmsg(c));
    } else if (eval_accuracy_run(c, ps.v, n, o.parallel, o.busy_s, isatty(2), out) == 0) {
        double acc = report(ps.v, out, n);
        rc = acc >= o.min ? ACC_PASS : ACC_BELOW;
        if (rc == ACC_BELOW)
            eval_errorf("accuracy: %.4f is below --min %g", acc, o.min);
        if (results) {
            if (write_results(results, o.results, ps.v, out, n) < 0)
                rc = ACC_BELOW;
            results = NULL;
        }
    }
    if (results) /* the run did not finish: the file is left empty */
        fclose(results);
    dgemma_close(c);
    for (size_t i = 0; out && i < n; i++)
        eval_outcome_free(&out[i]);
    free(out);
    eval_problems_free(&ps);
    return rc;
}
