/* cmd-stats.c - `dgemma-client stats`: a summary of dgemmad's metrics
 * database (requests and tokens per hour, tokens/s and time to first
 * canvas, steps per canvas, errors, sources, uids) over a window of time,
 * as text or as one JSON object.  Reads the file directly (read-only; no
 * daemon needed). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "client/client.h"
#include "lib/daemon-config.h"
#include "lib/json-util.h"
#include "lib/metrics-db.h"
#include "lib/metrics-query.h"

#ifndef DG_DEFAULT_CONFIG
#define DG_DEFAULT_CONFIG "/etc/dgemma/dgemmad.yaml"
#endif
/* the file the systemd unit (etc/dgemmad.service) has the daemon write */
#define DG_UNIT_METRICS "/var/lib/dgemma/metrics.sqlite"

/* how long a query waits for a lock the daemon holds (WAL readers rarely do) */
#define STATS_BUSY_MS 2000
#define STATS_READS 3 /* reads of a file a daemon keeps writing under an unlocked read */
/* uids the text output lists */
#define STATS_TOP_UIDS 10
#define STATS_TOP_UIDS_TEXT "10"

static const char usage[] =
    "usage: dgemma-client stats [--db FILE | -c CONFIG] [--hours N]\n"
    "                           [--since UNIX] [--until UNIX] [--json]\n"
    "Summarize dgemmad's metrics database: requests and tokens per hour (UTC),\n"
    "tokens/s and time to first canvas (ttfc_ms), steps per canvas, errors, and\n"
    "requests by source and by uid, over the requests that finished in the\n"
    "window.  The file is read-only here; the daemon may keep writing it.\n"
    "  --db FILE        the metrics database\n"
    "  -c, --config CONFIG  take the file from CONFIG's metrics: key\n"
    "                   (default: " DG_DEFAULT_CONFIG "'s, else the systemd\n"
    "                   unit's " DG_UNIT_METRICS ")\n"
    "  --hours N        the window: the last N hours (default 24; at most 1e7)\n"
    "  --since UNIX     the window's start, in Unix seconds (--until: now)\n"
    "  --until UNIX     the window's end, excluded (without --since: N hours\n"
    "                   before it)\n"
    "  --json           one JSON object instead of text\n"
    "Exit status: 0 done, 1 the file is missing, locked or not a metrics\n"
    "database, 2 usage.\n";

struct stats_opts {
    const char *db, *config;
    double hours, since, until;
    int has_hours, has_since, has_until, json;
};

/* A finite number from s (the value of option opt); prints why not. */
static int parse_number(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(*out)) {
        client_errorf("stats: %s: '%s' is not a number", opt, s);
        return -1;
    }
    return 0;
}

/* Parse argv into o.  Returns 0, 1 after printing the help (exit 0), or -1
 * after printing a usage error (exit 2). */
static int parse_args(int argc, char **argv, struct stats_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int takes_value = !strcmp(a, "--db") || !strcmp(a, "-c") || !strcmp(a, "--config") ||
                          !strcmp(a, "--hours") || !strcmp(a, "--since") ||
                          !strcmp(a, "--until");
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 1;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!takes_value) {
            client_errorf("stats: unexpected '%s'", a);
            return -1;
        }
        if (i + 1 >= argc) {
            client_errorf("stats: %s needs a value", a);
            return -1;
        }
        v = argv[++i];
        if (!strcmp(a, "--db")) {
            o->db = v;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            o->config = v;
        } else if (!strcmp(a, "--hours")) {
            if (parse_number(a, v, &o->hours) < 0)
                return -1;
            if (!(o->hours > 0) || o->hours > 1e7) {
                client_errorf("stats: --hours: '%s' is not a number of hours above 0 and at "
                              "most 1e7", v);
                return -1;
            }
            o->has_hours = 1;
        } else if (!strcmp(a, "--since")) {
            if (parse_number(a, v, &o->since) < 0)
                return -1;
            o->has_since = 1;
        } else {
            if (parse_number(a, v, &o->until) < 0)
                return -1;
            o->has_until = 1;
        }
    }
    if (o->db && o->config) {
        client_errorf("stats: --db and --config exclude each other");
        return -1;
    }
    if (o->has_since && o->has_hours) {
        client_errorf("stats: --since and --hours exclude each other");
        return -1;
    }
    return 0;
}

/* The window [since, until) the options ask for; -1 after a usage error. */
static int window(struct stats_opts *o)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!o->has_until)
        o->until = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    if (!o->has_since)
        o->since = o->until - (o->has_hours ? o->hours : 24.0) * 3600.0;
    if (!(o->since < o->until)) {
        if (o->has_hours && !o->has_since)
            client_errorf("stats: the window is empty: --hours %g is too short a time to "
                          "leave one", o->hours);
        else
            client_errorf("stats: the window is empty: --since %.3f is not before --until "
                          "%.3f", o->since, o->until);
        return -1;
    }
    return 0;
}

/* The database's path: --db; else the metrics: key of -c CONFIG; else
 * that of the default configuration when it sets one, and otherwise the
 * file the systemd unit gives the daemon (-o metrics=...).  The result may
 * point into cfg.  NULL after printing why (a file error). */
static const char *db_path(const struct stats_opts *o, struct dg_config *cfg)
{
    const char *conf = o->config ? o->config : DG_DEFAULT_CONFIG;
    struct dg_error err = {0};
    if (o->db)
        return o->db;
    dg_config_defaults(cfg);
    if (!o->config && access(conf, F_OK) != 0)
        return DG_UNIT_METRICS;
    if (dg_config_load_file(cfg, conf, &err) < 0) {
        client_errorf("stats: %s", err.msg);
        return NULL;
    }
    if (!cfg->metrics[0] && !o->config)
        return DG_UNIT_METRICS;
    if (!cfg->metrics[0]) {
        client_errorf("stats: %s names no metrics file (metrics: \"\" or no metrics: key); a "
                      "daemon started with -o metrics=FILE (the systemd unit gives it %s) "
                      "writes FILE: name it with --db FILE", conf, DG_UNIT_METRICS);
        return NULL;
    }
    return cfg->metrics;
}

/* ---- text ------------------------------------------------------------------------ */

/* t (Unix seconds, UTC) as "YYYY-MM-DD HH:MM" or, with secs, ":SS" too. */
static void fmt_time(double t, int secs, char *buf, size_t size)
{
    time_t tt;
    struct tm tm;
    if (!(fabs(t) < 1e15)) { /* beyond any calendar gmtime knows */
        snprintf(buf, size, "%.6g", t);
        return;
    }
    tt = (time_t)floor(t);
    if (!gmtime_r(&tt, &tm) || !strftime(buf, size, secs ? "%Y-%m-%d %H:%M:%S" : "%Y-%m-%d %H:%M",
                                         &tm))
        snprintf(buf, size, "%.0f", t);
}

static void print_dist(const char *name, const struct dg_metrics_dist *d)
{
    if (d->n == 0) {
        printf("  %-18s %8d %10s %10s %10s %10s %10s\n", name, 0, "-", "-", "-", "-", "-");
        return;
    }
    printf("  %-18s %8lld %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, (long long)d->n, d->mean,
           d->p50, d->p95, d->min, d->max);
}

/* The first histogram bucket with a count (0 when none). */
static int first_nonempty(const struct dg_metrics_summary *s)
{
    for (int k = 0; k < s->n_step_buckets; k++)
        if (s->step_hist[k])
            return k;
    return 0;
}

static void print_finish_counts(const int64_t *finish)
{
    int any = 0;
    for (int f = 0; f < DG_MFINISH_COUNT; f++) {
        if (!finish[f])
            continue;
        printf("%s%s %lld", any ? ", " : "", dg_metrics_finish_name(f), (long long)finish[f]);
        any = 1;
    }
    if (!any)
        fputs("-", stdout);
    putchar('\n');
}

static void print_text(const char *path, const struct dg_metrics_summary *s)
{
    char a[32], b[32];
    int64_t top = 0;

    fmt_time(s->since, 1, a, sizeof a);
    fmt_time(s->until, 1, b, sizeof b);
    printf("metrics  %s\n", path);
    printf("window   %s .. %s UTC (%.4g h)\n", a, b, (s->until - s->since) / 3600.0);

    printf("\ntotals\n");
    printf("  %-18s %lld\n", "requests", (long long)s->requests);
    printf("  %-18s %lld\n", "prompt tokens", (long long)s->prompt_tokens);
    printf("  %-18s %lld\n", "completion tokens", (long long)s->completion_tokens);
    printf("  %-18s ", "finish");
    print_finish_counts(s->finish);

    printf("\n%-20s %10s %12s %12s %8s\n", "per hour (UTC)", "requests", "prompt",
           "completion", "errors");
    if (s->n_hours == 0)
        printf("  (none)\n");
    for (int i = 0; i < s->n_hours; i++) {
        const struct dg_metrics_hour *h = &s->hours[i];
        fmt_time(h->start, 0, a, sizeof a);
        printf("  %-18s %10lld %12lld %12lld %8lld\n", a, (long long)h->requests,
               (long long)h->prompt_tokens, (long long)h->completion_tokens,
               (long long)(h->finish[DG_MFINISH_ERROR] + h->finish[DG_MFINISH_REJECTED]));
    }

    printf("\n%-20s %8s %10s %10s %10s %10s %10s\n", "distributions", "n", "mean", "p50",
           "p95", "min", "max");
    print_dist("tokens/s", &s->tokens_per_s);
    print_dist("ttfc_ms", &s->ttfc_ms);
    print_dist("steps per canvas", &s->steps);

    printf("\n%-20s %8s %7s\n", "steps per canvas", "count", "%");
    if (s->n_step_buckets == 0)
        printf("  (none)\n");
    for (int k = 0; k < s->n_step_buckets; k++)
        if (s->step_hist[k] > top)
            top = s->step_hist[k];
    /* from the first non-empty bucket to the last */
    for (int k = 0; k < s->n_step_buckets; k++) {
        int64_t lo, hi, c = s->step_hist[k];
        if (k < first_nonempty(s))
            continue;
        char range[48];
        int bar = top ? (int)((c * 40 + top - 1) / top) : 0;
        dg_metrics_step_bucket_range(k, &lo, &hi);
        if (k == DG_METRICS_STEP_BUCKETS - 1)
            snprintf(range, sizeof range, "%lld+", (long long)lo);
        else if (lo == hi)
            snprintf(range, sizeof range, "%lld", (long long)lo);
        else
            snprintf(range, sizeof range, "%lld-%lld", (long long)lo, (long long)hi);
        printf("  %-18s %8lld %6.1f%%", range, (long long)c,
               s->steps.n ? 100.0 * (double)c / (double)s->steps.n : 0.0);
        if (bar)
            fputs("  ", stdout);
        for (int j = 0; j < bar; j++)
            putchar('#');
        putchar('\n');
    }

    printf("\nerrors (finish, code)\n");
    if (s->n_errors == 0)
        printf("  (none)\n");
    for (int i = 0; i < s->n_errors; i++)
        printf("  %-10s %-24s %8lld\n", dg_metrics_finish_name(s->errors[i].finish),
               s->errors[i].code ? s->errors[i].code : "-", (long long)s->errors[i].count);

    printf("\n%-20s %8s\n", "by source", "requests");
    if (s->n_sources == 0)
        printf("  (none)\n");
    for (int i = 0; i < s->n_sources; i++)
        printf("  %-18s %8lld\n", s->sources[i].source, (long long)s->sources[i].requests);

    printf("\n%-20s %8s %12s %12s\n", "by uid (top " STATS_TOP_UIDS_TEXT ")", "requests", "prompt", "completion");
    if (s->n_uids == 0)
        printf("  (none)\n");
    for (int i = 0; i < s->n_uids && i < STATS_TOP_UIDS; i++) {
        const struct dg_metrics_uid_count *u = &s->uids[i];
        char uid[24];
        if (u->uid < 0)
            snprintf(uid, sizeof uid, "unknown");
        else
            snprintf(uid, sizeof uid, "%lld", (long long)u->uid);
        printf("  %-18s %8lld %12lld %12lld\n", uid, (long long)u->requests,
               (long long)u->prompt_tokens, (long long)u->completion_tokens);
    }
    if (s->n_uids > STATS_TOP_UIDS)
        printf("  (%d more)\n", s->n_uids - STATS_TOP_UIDS);
}

/* ---- JSON ------------------------------------------------------------------------ */

/* {stop: N, length: N, ...}: every finish, zeros included. */
static json_t *json_finish(const int64_t *finish)
{
    json_t *o = json_object();
    for (int f = 0; o && f < DG_MFINISH_COUNT; f++)
        if (json_object_set_new(o, dg_metrics_finish_name(f), json_integer(finish[f]))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* (a value infinite in the file, as dgemmad never writes, is null) */
static json_t *json_dist(const struct dg_metrics_dist *d)
{
    return json_pack("{s:I,s:o,s:o,s:o,s:o,s:o}", "n", (json_int_t)d->n, "mean",
                     dg_json_number(d->mean), "p50", dg_json_number(d->p50), "p95",
                     dg_json_number(d->p95), "min", dg_json_number(d->min), "max",
                     dg_json_number(d->max));
}

/* The summary as one JSON object (keys in dgemma-client(1)); NULL when out
 * of memory.  Texts from the file and its name go through dg_json_text (a
 * byte that is not UTF-8 becomes U+FFFD). */
static json_t *summary_json(const char *path, const struct dg_metrics_summary *s)
{
    json_t *root = NULL, *hours = json_array(), *steps = json_dist(&s->steps);
    json_t *hist = json_array(), *errors = json_array(), *sources = json_array();
    json_t *uids = json_array();
    int bad = !hours || !steps || !hist || !errors || !sources || !uids;

    for (int i = 0; !bad && i < s->n_hours; i++) {
        const struct dg_metrics_hour *h = &s->hours[i];
        bad |= json_array_append_new(
            hours, json_pack("{s:I,s:I,s:I,s:I,s:o}", "start", (json_int_t)h->start,
                             "requests", (json_int_t)h->requests, "prompt_tokens",
                             (json_int_t)h->prompt_tokens, "completion_tokens",
                             (json_int_t)h->completion_tokens, "finish",
                             json_finish(h->finish)));
    }
    /* from bucket 1 (steps 1), and bucket 0 (no step) only where it counts any */
    for (int k = s->step_hist[0] ? 0 : 1; !bad && k < s->n_step_buckets; k++) {
        int64_t lo, hi;
        dg_metrics_step_bucket_range(k, &lo, &hi);
        bad |= json_array_append_new(hist, json_pack("{s:I,s:I,s:I}", "lo", (json_int_t)lo,
                                                     "hi", (json_int_t)hi, "count",
                                                     (json_int_t)s->step_hist[k]));
    }
    for (int i = 0; !bad && i < s->n_errors; i++)
        bad |= json_array_append_new(
            errors, json_pack("{s:s,s:o,s:I}", "finish",
                              dg_metrics_finish_name(s->errors[i].finish), "code",
                              s->errors[i].code ? dg_json_text(s->errors[i].code) : json_null(),
                              "count", (json_int_t)s->errors[i].count));
    for (int i = 0; !bad && i < s->n_sources; i++)
        bad |= json_array_append_new(sources,
                                     json_pack("{s:o,s:I}", "source", dg_json_text(s->sources[i].source),
                                               "requests", (json_int_t)s->sources[i].requests));
    for (int i = 0; !bad && i < s->n_uids; i++) {
        const struct dg_metrics_uid_count *u = &s->uids[i];
        bad |= json_array_append_new(
            uids, json_pack("{s:o,s:I,s:I,s:I}", "uid",
                            u->uid < 0 ? json_null() : json_integer(u->uid), "requests",
                            (json_int_t)u->requests, "prompt_tokens",
                            (json_int_t)u->prompt_tokens, "completion_tokens",
                            (json_int_t)u->completion_tokens));
    }
    if (!bad && !json_object_set(steps, "histogram", hist))
        root = json_pack("{s:f,s:f,s:o,s:{s:I,s:I,s:I,s:o},s:O,s:o,s:o,s:O,s:O,s:O,s:O}",
                         "since", s->since, "until", s->until, "file", dg_json_text(path),
                         "totals", "requests", (json_int_t)s->requests,
                         "prompt_tokens", (json_int_t)s->prompt_tokens,
                         "completion_tokens", (json_int_t)s->completion_tokens,
                         "finish", json_finish(s->finish),
                         "hours", hours, "tokens_per_s", json_dist(&s->tokens_per_s),
                         "ttfc_ms", json_dist(&s->ttfc_ms), "steps_per_canvas", steps,
                         "errors", errors, "sources", sources, "uids", uids);
    /* root (if any) holds its own references ("O") */
    json_decref(hours);
    json_decref(steps);
    json_decref(hist);
    json_decref(errors);
    json_decref(sources);
    json_decref(uids);
    return root;
}

/* ---- the command ----------------------------------------------------------------- */

int cmd_stats(int argc, char **argv)
{
    struct stats_opts o = {0};
    struct dg_config *cfg = NULL;
    struct dg_metrics_db *db = NULL;
    struct dg_metrics_summary s = {0};
    struct dg_error err = {0};
    const char *path;
    struct stat sb;
    int rc = EXIT_FAILED, p;

    if ((p = parse_args(argc, argv, &o)) != 0) {
        if (p < 0)
            fputs(usage, stderr);
        return p > 0 ? EXIT_DONE : EXIT_USAGE;
    }
    if (window(&o) < 0)
        return EXIT_USAGE;
    if (!o.db && !(cfg = malloc(sizeof *cfg))) {
        client_errorf("stats: out of memory");
        return EXIT_FAILED;
    }
    if (!(path = db_path(&o, cfg)))
        goto out;
    /* said here, before SQLite's "unable to open database file" */
    if (stat(path, &sb) < 0) {
        client_errorf("stats: %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        client_errorf("stats: %s: not a regular file", path);
        goto out;
    }
    /* a file read without SQLite's locks (a stopped daemon's) that a
     * daemon started writing meanwhile is read again */
    for (int tries = 1;; tries++) {
        int changed;
        if (dg_metrics_db_open(path, DG_METRICS_READ, STATS_BUSY_MS, &db, &err) < 0 ||
            dg_metrics_summary(dg_metrics_db_handle(db), o.since, o.until, &s, &err) < 0) {
            if (!dg_metrics_db_changed(db) || tries == STATS_READS) {
                client_errorf("stats: %s", err.msg);
                goto out;
            }
            changed = 1;
        } else {
            changed = dg_metrics_db_changed(db);
        }
        if (!changed)
            break;
        if (tries == STATS_READS) {
            client_errorf("stats: %s: a daemon wrote the file during each of %d reads; try "
                          "again", path, STATS_READS);
            goto out;
        }
        dg_metrics_summary_free(&s);
        memset(&s, 0, sizeof s);
        dg_metrics_db_close(db);
        db = NULL;
    }
    if (o.json) {
        json_t *j = summary_json(path, &s);
        /* (dg_json_dumps: jansson's own dump may leave a key out when an
         * allocation fails) */
        char *text = j ? dg_json_dumps(j, JSON_SORT_KEYS | JSON_INDENT(2) |
                                              JSON_REAL_PRECISION(15))
                       : NULL;
        json_decref(j);
        if (!text) {
            client_errorf("stats: out of memory for the JSON output");
            goto out;
        }
        puts(text);
        free(text);
    } else {
        print_text(path, &s);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        client_errorf("stats: writing the output: %s", strerror(errno));
        goto out;
    }
    rc = EXIT_DONE;
out:
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    free(cfg);
    return rc;
}
