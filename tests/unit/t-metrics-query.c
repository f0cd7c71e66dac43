/*
 * t-metrics-query - summaries of the metrics database: a few hundred random
 * requests (finishes, error codes, sources, uids, canvases, times over
 * several hours, some outside the window and some on its edges) written
 * through the writer, summarized through a read-only connection, and
 * checked against the same numbers computed here from the generated rows
 * with code of its own (its own sort, nearest rank, hours, buckets, group
 * counts); nearest-rank and bucket edge values; an empty window; a bad
 * window; files that are not metrics databases; a summary while another
 * connection holds the write lock (WAL: readers are not blocked), and
 * DG_E_BUSY where a lock does block them (a rollback journal); ties in
 * every ordering.
 */
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/metrics-db.h"
#include "lib/metrics-query.h"
#include "tests/harness.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull; /* (never 0: seeded below by xor) */

/* 24 random bits (harness.h's stream) */
static unsigned rnd(void)
{
    return (unsigned)(test_xorshift(&rng_state) >> 40);
}

/* ---- edge values ------------------------------------------------------------------ */

static int percentile_and_buckets(void)
{
    double four[] = {1, 2, 3, 4};
    double twenty[20], one[] = {7};
    int64_t lo, hi;

    for (int i = 0; i < 20; i++)
        twenty[i] = 100 + i;
    CHECK(dg_metrics_percentile(four, 4, 50) == 2);
    CHECK(dg_metrics_percentile(four, 4, 95) == 4);
    CHECK(dg_metrics_percentile(four, 4, 25) == 1);
    CHECK(dg_metrics_percentile(four, 4, 26) == 2);
    CHECK(dg_metrics_percentile(four, 4, 100) == 4);
    CHECK(dg_metrics_percentile(twenty, 20, 95) == 118);   /* the 19th */
    CHECK(dg_metrics_percentile(twenty, 20, 50) == 109);   /* the 10th */
    CHECK(dg_metrics_percentile(twenty, 20, 5) == 100);    /* the 1st */
    CHECK(dg_metrics_percentile(twenty, 20, 5.01) == 101); /* the 2nd */
    CHECK(dg_metrics_percentile(one, 1, 50) == 7);
    CHECK(dg_metrics_percentile(one, 1, 95) == 7);
    CHECK(dg_metrics_percentile(one, 0, 50) == 0);
    CHECK(dg_metrics_percentile(NULL, 0, 95) == 0);

    CHECK(dg_metrics_step_bucket(-3) == 0);
    CHECK(dg_metrics_step_bucket(0) == 0);
    CHECK(dg_metrics_step_bucket(1) == 1);
    CHECK(dg_metrics_step_bucket(2) == 2);
    CHECK(dg_metrics_step_bucket(3) == 3);
    CHECK(dg_metrics_step_bucket(4) == 3);
    CHECK(dg_metrics_step_bucket(5) == 4);
    CHECK(dg_metrics_step_bucket(8) == 4);
    CHECK(dg_metrics_step_bucket(9) == 5);
    CHECK(dg_metrics_step_bucket(256) == 9);
    CHECK(dg_metrics_step_bucket(257) == 10);
    CHECK(dg_metrics_step_bucket((int64_t)1 << 30) == DG_METRICS_STEP_BUCKETS - 1);
    CHECK(dg_metrics_step_bucket(INT64_MAX) == DG_METRICS_STEP_BUCKETS - 1);

    dg_metrics_step_bucket_range(0, &lo, &hi);
    CHECK(lo == 0 && hi == 0);
    dg_metrics_step_bucket_range(1, &lo, &hi);
    CHECK(lo == 1 && hi == 1);
    dg_metrics_step_bucket_range(2, &lo, &hi);
    CHECK(lo == 2 && hi == 2);
    dg_metrics_step_bucket_range(3, &lo, &hi);
    CHECK(lo == 3 && hi == 4);
    dg_metrics_step_bucket_range(4, &lo, &hi);
    CHECK(lo == 5 && hi == 8);
    dg_metrics_step_bucket_range(DG_METRICS_STEP_BUCKETS - 1, &lo, &hi);
    CHECK(lo == ((int64_t)1 << 29) + 1 && hi == (int64_t)1 << 30);
    /* every bucket's range maps back to it */
    for (int k = 0; k < DG_METRICS_STEP_BUCKETS; k++) {
        dg_metrics_step_bucket_range(k, &lo, &hi);
        CHECKF(dg_metrics_step_bucket(lo) == k && dg_metrics_step_bucket(hi) == k,
               "bucket %d: [%lld, %lld]", k, (long long)lo, (long long)hi);
    }

    CHECK(!strcmp(dg_metrics_finish_name(DG_MFINISH_STOP), "stop"));
    CHECK(!strcmp(dg_metrics_finish_name(DG_MFINISH_REJECTED), "rejected"));
    CHECK(!strcmp(dg_metrics_finish_name(DG_MFINISH_OTHER), "other"));
    CHECK(!strcmp(dg_metrics_finish_name(-1), "other"));
    CHECK(!strcmp(dg_metrics_finish_name(99), "other"));
    return 0;
}

/* ---- random requests ------------------------------------------------------------- */

#define N_REQ 400
#define MAX_CANVAS 5
#define T0 1700000000.0

static const char *const FINISHES[] = {"stop", "length", "cancelled", "error", "rejected", "odd"};
static const char *const CODES[] = {NULL, "busy", "bad_request", "client_gone", "internal"};
static const int64_t UIDS[] = {-1, 0, 1000, 1001, 1002, 65534};

struct gen {
    struct dg_metrics_request r[N_REQ];
    struct dg_metrics_canvas cv[N_REQ][MAX_CANVAS];
};

/* The finish index of a text, the test's own mapping (5 = other). */
static int finish_index(const char *s)
{
    static const char *const known[] = {"stop", "length", "cancelled", "error", "rejected"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, known[i]))
            return i;
    return 5;
}

/* The bucket of a steps value, computed from the bit length of steps - 1:
 * 0 for none, 1 for one step, else 1 + that length. */
static int bucket_of(int64_t steps)
{
    uint64_t v;
    int bits = 0;
    if (steps <= 1)
        return steps < 1 ? 0 : 1;
    for (v = (uint64_t)(steps - 1); v; v >>= 1)
        bits++;
    return bits + 1 > 31 ? 31 : bits + 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank for integer p: ceil(p * n / 100) in integers. */
static double nearest_rank(const double *sorted, int n, int p)
{
    int rank = (p * n + 99) / 100;
    if (rank < 1)
        rank = 1;
    return sorted[rank - 1];
}

static int close_to(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

/* Check d against the n values in v (sorted here). */
static int check_dist(const char *what, const struct dg_metrics_dist *d, double *v, int n)
{
    double sum = 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int i = 0; i < n; i++)
        sum += v[i];
    CHECKF(d->n == n, "%s: n %lld, want %d", what, (long long)d->n, n);
    if (n == 0) {
        CHECKF(d->mean == 0 && d->p50 == 0 && d->p95 == 0 && d->min == 0 && d->max == 0,
               "%s: an empty distribution is not all zeros", what);
        return 0;
    }
    CHECKF(close_to(d->mean, sum / n), "%s: mean %.17g, want %.17g", what, d->mean, sum / n);
    CHECKF(d->p50 == nearest_rank(v, n, 50), "%s: p50 %g, want %g", what, d->p50,
           nearest_rank(v, n, 50));
    CHECKF(d->p95 == nearest_rank(v, n, 95), "%s: p95 %g, want %g", what, d->p95,
           nearest_rank(v, n, 95));
    CHECKF(d->min == v[0] && d->max == v[n - 1], "%s: min %g max %g, want %g %g", what, d->min,
           d->max, v[0], v[n - 1]);
    return 0;
}

/* Fill g with random requests finishing around [since, until): some before,
 * some after, a few exactly on either edge. */
static void generate(struct gen *g, double since, double until)
{
    for (int i = 0; i < N_REQ; i++) {
        struct dg_metrics_request *r = &g->r[i];
        int n = (int)(rnd() % (MAX_CANVAS + 1));
        double span = until - since + 4 * 3600.0;
        memset(r, 0, sizeof *r);
        r->finish = FINISHES[rnd() % 6];
        r->request_id = !strcmp(r->finish, "rejected") ? 0 : (uint64_t)i + 1;
        r->tag = rnd() % 2 ? "t" : NULL;
        r->uid = UIDS[rnd() % 6];
        r->pid = rnd() % 2 ? 4000 + (int64_t)(rnd() % 100) : -1;
        r->source = (enum dg_metrics_source)(rnd() % 3);
        if (i == 0)
            r->finished = since;                 /* in */
        else if (i == 1)
            r->finished = until;                 /* out */
        else if (i == 2)
            r->finished = until - 0.001;         /* in */
        else if (i == 3)
            r->finished = since - 0.001;         /* out */
        else
            r->finished = since - 2 * 3600.0 + (rnd() % (unsigned)span) + (rnd() % 1000) / 1000.0;
        r->submitted = r->finished - 5;
        r->started = rnd() % 5 ? r->finished - 4 : 0;   /* 0: tokens_per_s NULL */
        r->first_canvas = n ? r->finished - 3 : 0;
        r->prompt_tokens = rnd() % 2000;
        r->completion_tokens = rnd() % 500;
        r->tokens_per_s = (rnd() % 100000) / 100.0;
        r->ttfc_ms = rnd() % 4 ? (rnd() % 50000) / 10.0 : -1;
        r->total_ms = 5000;
        r->error_code = strcmp(r->finish, "stop") && strcmp(r->finish, "length")
                            ? CODES[rnd() % 5] : NULL;
        r->error = r->error_code ? "message" : NULL;
        r->settings_json = "{}";
        for (int k = 0; k < n; k++) {
            int steps;
            switch (rnd() % 8) {
            case 0: steps = (int)(rnd() % 6); break;                 /* the small edges, 0 too */
            case 1: steps = 1 << (rnd() % 12); break;                /* powers of two */
            case 2: steps = (1 << (rnd() % 12)) + 1; break;          /* just above */
            case 3: steps = 100000 + (int)(rnd() % 10); break;       /* large */
            default: steps = 1 + (int)(rnd() % 300); break;
            }
            g->cv[i][k] = (struct dg_metrics_canvas){k, steps, (int)(rnd() & 1),
                                                     (int)(rnd() % 32), (rnd() % 1000) / 3.0,
                                                     NAN};
            r->steps += steps;
        }
        r->canvases = n;
        r->canvas = g->cv[i];
        r->n_canvas = n;
    }
}

/* Write g to a new database at path. */
static int write_db(const char *path, const struct gen *g, struct dg_error *err)
{
    struct dg_metrics_db *db;
    struct dg_metrics_run run = {.started = T0 - 86400, .pid = 1, .version = "test",
                                 .host = "h", .model = "m", .backend = "cpu",
                                 .config_digest = "d", .tp = 1};
    int64_t id;
    int rc;

    if ((rc = dg_metrics_db_open(path, DG_METRICS_WRITE, 1000, &db, err)) < 0)
        return rc;
    if ((rc = dg_metrics_db_begin(db, err)) == 0 &&
        (rc = dg_metrics_db_put_run(db, &run, &id, err)) == 0) {
        for (int i = 0; i < N_REQ && rc == 0; i++)
            rc = dg_metrics_db_put_request(db, id, "cpu", 1, &g->r[i], err);
        if (rc == 0)
            rc = dg_metrics_db_put_event(db, id, T0, "start", NULL, err);
        if (rc == 0)
            rc = dg_metrics_db_commit(db, err);
    }
    dg_metrics_db_close(db);
    return rc;
}

static int in_window(const struct dg_metrics_request *r, double since, double until)
{
    return r->finished >= since && r->finished < until;
}

/* Hours, totals and finish counts. */
static int check_hours(const struct gen *g, const struct dg_metrics_summary *s)
{
    int64_t req = 0, pt = 0, ct = 0, fin[6] = {0};
    int64_t sum_req = 0;
    double prev = -INFINITY;

    for (int i = 0; i < N_REQ; i++) {
        const struct dg_metrics_request *r = &g->r[i];
        if (!in_window(r, s->since, s->until))
            continue;
        req++;
        pt += r->prompt_tokens;
        ct += r->completion_tokens;
        fin[finish_index(r->finish)]++;
    }
    CHECKF(s->requests == req, "requests %lld, want %lld", (long long)s->requests,
           (long long)req);
    CHECK(s->prompt_tokens == pt && s->completion_tokens == ct);
    for (int f = 0; f < 6; f++)
        CHECKF(s->finish[f] == fin[f], "finish %s: %lld, want %lld", dg_metrics_finish_name(f),
               (long long)s->finish[f], (long long)fin[f]);

    /* each reported hour: ascending, non-empty, and its numbers; every
     * request in the window falls in one of them */
    for (int h = 0; h < s->n_hours; h++) {
        const struct dg_metrics_hour *hr = &s->hours[h];
        int64_t hreq = 0, hpt = 0, hct = 0, hfin[6] = {0};
        CHECKF(hr->start > prev, "hour %d not after the one before", h);
        CHECKF(fmod(hr->start, 3600.0) == 0, "hour start %.3f", hr->start);
        prev = hr->start;
        for (int i = 0; i < N_REQ; i++) {
            const struct dg_metrics_request *r = &g->r[i];
            if (!in_window(r, s->since, s->until) || floor(r->finished / 3600.0) * 3600 != hr->start)
                continue;
            hreq++;
            hpt += r->prompt_tokens;
            hct += r->completion_tokens;
            hfin[finish_index(r->finish)]++;
        }
        CHECKF(hreq > 0 && hr->requests == hreq, "hour %.0f: %lld requests, want %lld",
               hr->start, (long long)hr->requests, (long long)hreq);
        CHECK(hr->prompt_tokens == hpt && hr->completion_tokens == hct);
        for (int f = 0; f < 6; f++)
            CHECK(hr->finish[f] == hfin[f]);
        sum_req += hreq;
    }
    CHECKF(sum_req == req, "hours hold %lld requests of %lld", (long long)sum_req,
           (long long)req);
    /* the window spans parts of at least 6 hours here, with requests in each */
    CHECKF(s->n_hours >= 6, "only %d hours", s->n_hours);
    return 0;
}

static int check_distributions(const struct gen *g, const struct dg_metrics_summary *s)
{
    static double tps[N_REQ], ttfc[N_REQ], steps[N_REQ * MAX_CANVAS];
    int n_tps = 0, n_ttfc = 0, n_steps = 0;
    int64_t hist[32] = {0};
    int last = -1;

    for (int i = 0; i < N_REQ; i++) {
        const struct dg_metrics_request *r = &g->r[i];
        int done = !strcmp(r->finish, "stop") || !strcmp(r->finish, "length");
        if (!in_window(r, s->since, s->until))
            continue;
        if (done && r->started > 0)
            tps[n_tps++] = r->tokens_per_s;
        if (done && r->ttfc_ms >= 0)
            ttfc[n_ttfc++] = r->ttfc_ms;
        for (int k = 0; k < r->n_canvas; k++) {
            int b = bucket_of(r->canvas[k].steps);
            steps[n_steps++] = r->canvas[k].steps;
            hist[b]++;
            if (b > last)
                last = b;
        }
    }
    CHECK(n_tps > 10 && n_ttfc > 10 && n_steps > 100);
    if (check_dist("tokens_per_s", &s->tokens_per_s, tps, n_tps) ||
        check_dist("ttfc_ms", &s->ttfc_ms, ttfc, n_ttfc) ||
        check_dist("steps", &s->steps, steps, n_steps))
        return 1;
    CHECKF(s->n_step_buckets == last + 1, "%d step buckets, want %d", s->n_step_buckets,
           last + 1);
    for (int k = 0; k < DG_METRICS_STEP_BUCKETS; k++)
        CHECKF(s->step_hist[k] == hist[k], "bucket %d: %lld, want %lld", k,
               (long long)s->step_hist[k], (long long)hist[k]);
    return 0;
}

static int same_code(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static int check_groups(const struct gen *g, const struct dg_metrics_summary *s)
{
    int64_t total = 0;

    /* errors: each row's count, every (finish, code) present, the order */
    for (int e = 0; e < s->n_errors; e++) {
        const struct dg_metrics_error_count *x = &s->errors[e];
        int64_t n = 0;
        CHECK(x->finish == DG_MFINISH_CANCELLED || x->finish == DG_MFINISH_ERROR ||
              x->finish == DG_MFINISH_REJECTED);
        for (int i = 0; i < N_REQ; i++)
            if (in_window(&g->r[i], s->since, s->until) &&
                finish_index(g->r[i].finish) == x->finish &&
                same_code(g->r[i].error_code, x->code))
                n++;
        CHECKF(x->count == n && n > 0, "errors %s/%s: %lld, want %lld",
               dg_metrics_finish_name(x->finish), x->code ? x->code : "-",
               (long long)x->count, (long long)n);
        for (int f = 0; f < e; f++)
            CHECK(s->errors[f].finish != x->finish || !same_code(s->errors[f].code, x->code));
        if (e > 0) {
            const struct dg_metrics_error_count *p = &s->errors[e - 1];
            CHECK(p->count >= x->count);
            if (p->count == x->count) {
                CHECK(p->finish <= x->finish);
                if (p->finish == x->finish)
                    CHECK(!p->code || (x->code && strcmp(p->code, x->code) < 0));
            }
        }
        total += x->count;
    }
    CHECK(total == s->finish[DG_MFINISH_CANCELLED] + s->finish[DG_MFINISH_ERROR] +
                       s->finish[DG_MFINISH_REJECTED]);

    /* sources */
    total = 0;
    for (int j = 0; j < s->n_sources; j++) {
        const struct dg_metrics_source_count *x = &s->sources[j];
        int64_t n = 0;
        for (int i = 0; i < N_REQ; i++)
            if (in_window(&g->r[i], s->since, s->until) &&
                !strcmp(dg_metrics_source_name(g->r[i].source), x->source))
                n++;
        CHECKF(x->requests == n && n > 0, "source %s: %lld, want %lld", x->source,
               (long long)x->requests, (long long)n);
        if (j > 0)
            CHECK(s->sources[j - 1].requests > x->requests ||
                  (s->sources[j - 1].requests == x->requests &&
                   strcmp(s->sources[j - 1].source, x->source) < 0));
        total += n;
    }
    CHECK(s->n_sources == 3 && total == s->requests);

    /* uids */
    total = 0;
    for (int j = 0; j < s->n_uids; j++) {
        const struct dg_metrics_uid_count *x = &s->uids[j];
        int64_t n = 0, pt = 0, ct = 0;
        for (int i = 0; i < N_REQ; i++)
            if (in_window(&g->r[i], s->since, s->until) && g->r[i].uid == x->uid) {
                n++;
                pt += g->r[i].prompt_tokens;
                ct += g->r[i].completion_tokens;
            }
        CHECKF(x->requests == n && n > 0, "uid %lld: %lld, want %lld", (long long)x->uid,
               (long long)x->requests, (long long)n);
        CHECK(x->prompt_tokens == pt && x->completion_tokens == ct);
        if (j > 0) {
            const struct dg_metrics_uid_count *p = &s->uids[j - 1];
            CHECK(p->requests >= x->requests);
            if (p->requests == x->requests)
                CHECK(x->uid == -1 ? p->uid != -1 : (p->uid != -1 && p->uid < x->uid));
        }
        total += n;
    }
    CHECK(s->n_uids == 6 && total == s->requests);
    return 0;
}

static int random_summary(void)
{
    static struct gen g;
    const char *path = test_path("random.sqlite");
    double since = T0 + 1234.5, until = since + 5 * 3600.0 + 777.25;
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    int bad;

    generate(&g, since, until);
    CHECK_OK(write_db(path, &g, &err), &err);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_READ, 1000, &db, &err), &err);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), since, until, &s, &err), &err);
    CHECK(s.since == since && s.until == until);
    bad = check_hours(&g, &s) || check_distributions(&g, &s) || check_groups(&g, &s);
    dg_metrics_summary_free(&s);
    CHECK(s.hours == NULL && s.n_hours == 0 && s.requests == 0);
    dg_metrics_summary_free(&s);   /* twice is harmless */
    dg_metrics_summary_free(NULL);
    if (bad) {
        dg_metrics_db_close(db);
        return 1;
    }

    /* the whole file: every request */
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), 0, 4e9, &s, &err), &err);
    CHECK(s.requests == N_REQ);
    dg_metrics_summary_free(&s);

    /* an empty window: zeros and no rows */
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), T0 + 1e7, T0 + 1e7 + 3600, &s, &err),
             &err);
    CHECK(s.requests == 0 && s.prompt_tokens == 0 && s.completion_tokens == 0);
    for (int f = 0; f < DG_MFINISH_COUNT; f++)
        CHECK(s.finish[f] == 0);
    CHECK(s.n_hours == 0 && s.hours == NULL);
    CHECK(s.tokens_per_s.n == 0 && s.tokens_per_s.mean == 0 && s.tokens_per_s.p95 == 0);
    CHECK(s.ttfc_ms.n == 0 && s.steps.n == 0 && s.steps.max == 0);
    CHECK(s.n_step_buckets == 0);
    for (int k = 0; k < DG_METRICS_STEP_BUCKETS; k++)
        CHECK(s.step_hist[k] == 0);
    CHECK(s.n_errors == 0 && s.n_sources == 0 && s.n_uids == 0);
    CHECK(s.since == T0 + 1e7);
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    return 0;
}

/* A new database with no requests at all: zeros. */
static int empty_database(void)
{
    const char *path = test_path("empty.sqlite");
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 1000, &db, &err), &err);
    dg_metrics_db_close(db);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_READ, 1000, &db, &err), &err);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), 0, 1e10, &s, &err), &err);
    CHECK(s.requests == 0 && s.n_hours == 0 && s.n_uids == 0 && s.steps.n == 0);
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    return 0;
}

static int bad_window(void)
{
    const char *path = test_path("window.sqlite");
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    sqlite3 *h;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 1000, &db, &err), &err);
    h = dg_metrics_db_handle(db);
    s.requests = 99;
    CHECK_FAILS(dg_metrics_summary(h, 100, 100, &s, &err), &err, DG_E_INVAL, "window");
    CHECK(s.requests == 0 && s.hours == NULL);
    CHECK_FAILS(dg_metrics_summary(h, 200, 100, &s, &err), &err, DG_E_INVAL, "window");
    CHECK_FAILS(dg_metrics_summary(h, NAN, 100, &s, &err), &err, DG_E_INVAL, "window");
    CHECK_FAILS(dg_metrics_summary(h, 0, INFINITY, &s, &err), &err, DG_E_INVAL, "window");
    CHECK_FAILS(dg_metrics_summary(NULL, 0, 1, &s, &err), &err, DG_E_INVAL, "connection");
    /* not inside a transaction of the caller's */
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_FAILS(dg_metrics_summary(h, 0, 1, &s, &err), &err, DG_E_INVAL, "transaction");
    dg_metrics_db_rollback(db);
    CHECK_OK(dg_metrics_summary(h, 0, 1, &s, &err), &err);
    CHECK(sqlite3_get_autocommit(h));   /* the read transaction is over */
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    return 0;
}

/* Ties: uids by uid with the unknown last, sources by name, errors by
 * finish then code with NULL first; an hour starts at its first second. */
static int tie_orders(void)
{
    static const struct {
        int64_t uid;
        enum dg_metrics_source src;
        const char *finish, *code;
        double t;
    } rows[] = {
        {-1, DG_SOURCE_SOCKET, "error", "b", T0},
        {7, DG_SOURCE_BATCH, "error", NULL, T0},
        {-1, DG_SOURCE_SOCKET, "cancelled", "z", T0},
        {3, DG_SOURCE_BATCH, "stop", NULL, 1700002800.0},         /* an hour's first second */
        {7, DG_SOURCE_SHM, "error", "a", 1700002800.0 - 0.5},
        {3, DG_SOURCE_SHM, "rejected", "busy", 1700002800.0 + 1},
    };
    const char *path = test_path("ties.sqlite");
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    struct dg_metrics_run run = {.started = T0, .pid = 1, .tp = 1};
    int64_t id;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    CHECK_OK(dg_metrics_db_begin(db, &err), &err);
    CHECK_OK(dg_metrics_db_put_run(db, &run, &id, &err), &err);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct dg_metrics_request q = {.request_id = i + 1, .uid = rows[i].uid, .pid = -1,
                                       .source = rows[i].src, .submitted = rows[i].t,
                                       .finished = rows[i].t, .ttfc_ms = -1,
                                       .finish = rows[i].finish, .error_code = rows[i].code};
        CHECK_OK(dg_metrics_db_put_request(db, id, "cpu", 1, &q, &err), &err);
    }
    CHECK_OK(dg_metrics_db_commit(db, &err), &err);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), T0 - 1, T0 + 7200, &s, &err), &err);
    CHECK(s.n_uids == 3 && s.uids[0].uid == 3 && s.uids[1].uid == 7 && s.uids[2].uid == -1);
    CHECK(s.n_sources == 3 && !strcmp(s.sources[0].source, "batch") &&
          !strcmp(s.sources[1].source, "shm") && !strcmp(s.sources[2].source, "socket"));
    CHECK(s.n_errors == 5);
    CHECK(s.errors[0].finish == DG_MFINISH_CANCELLED && !strcmp(s.errors[0].code, "z"));
    CHECK(s.errors[1].finish == DG_MFINISH_ERROR && s.errors[1].code == NULL);
    CHECK(s.errors[2].finish == DG_MFINISH_ERROR && !strcmp(s.errors[2].code, "a"));
    CHECK(s.errors[3].finish == DG_MFINISH_ERROR && !strcmp(s.errors[3].code, "b"));
    CHECK(s.errors[4].finish == DG_MFINISH_REJECTED && !strcmp(s.errors[4].code, "busy"));
    /* 1700002800 is 472223 * 3600 */
    CHECK(s.n_hours == 2 && s.hours[0].start == 1700002800.0 - 3600 &&
          s.hours[1].start == 1700002800.0);
    CHECK(s.hours[0].requests == 4 && s.hours[1].requests == 2);
    CHECK(s.hours[1].finish[DG_MFINISH_STOP] == 1 && s.hours[1].finish[DG_MFINISH_REJECTED] == 1);
    CHECK(s.hours[0].finish[DG_MFINISH_ERROR] == 3 && s.hours[0].finish[DG_MFINISH_CANCELLED] == 1);
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    return 0;
}

static int raw_exec(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    int rc = sqlite3_open(path, &h);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(h, sql, NULL, NULL, NULL);
    sqlite3_close(h);
    return rc;
}

static int not_metrics(void)
{
    const char *other = test_path("other.sqlite");
    const char *v1 = test_path("v1.sqlite");
    const char *text = test_path("text.txt");
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    sqlite3 *h = NULL;
    FILE *f;

    /* an SQLite file with a table of its own: refused at open, and a
     * summary on a plain connection to it is DG_E_FORMAT too */
    CHECK(raw_exec(other, "CREATE TABLE dummy (x INTEGER); INSERT INTO dummy VALUES (1)") ==
          SQLITE_OK);
    CHECK_FAILS(dg_metrics_db_open(other, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "version");
    CHECK(sqlite3_open_v2(other, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK_FAILS(dg_metrics_summary(h, 0, 1e10, &s, &err), &err, DG_E_FORMAT,
                "not a metrics database");
    CHECK(strstr(err.msg, "requests") && strstr(err.msg, "other.sqlite"));
    CHECK(s.requests == 0 && s.hours == NULL);
    CHECK(sqlite3_get_autocommit(h));   /* rolled back */
    sqlite3_close(h);

    /* our version number, a table missing: open passes, the summary does not */
    CHECK(raw_exec(v1, "CREATE TABLE requests (id INTEGER PRIMARY KEY, finished REAL);"
                       "PRAGMA user_version = 1") == SQLITE_OK);
    CHECK_OK(dg_metrics_db_open(v1, DG_METRICS_READ, 100, &db, &err), &err);
    CHECK_FAILS(dg_metrics_summary(dg_metrics_db_handle(db), 0, 1e10, &s, &err), &err,
                DG_E_FORMAT, "not a metrics database");
    CHECK(strstr(err.msg, "no such column"));
    dg_metrics_db_close(db);

    /* not SQLite at all */
    CHECK((f = fopen(text, "w")) != NULL);
    for (int i = 0; i < 100; i++)
        fputs("this is a text file, not a database\n", f);
    fclose(f);
    CHECK_FAILS(dg_metrics_db_open(text, DG_METRICS_READ, 100, &db, &err), &err, DG_E_FORMAT,
                "not an SQLite database");
    CHECK(sqlite3_open_v2(text, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    CHECK_FAILS(dg_metrics_summary(h, 0, 1e10, &s, &err), &err, DG_E_FORMAT,
                "not a metrics database");
    sqlite3_close(h);
    return 0;
}

/* Another connection holds the write lock (BEGIN IMMEDIATE) with rows not
 * yet committed: a summary runs at once from the last commit (WAL), and
 * sees the rows once they are committed. */
static int reader_while_writing(void)
{
    const char *path = test_path("locked.sqlite");
    struct dg_metrics_db *w, *r;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    struct dg_metrics_run run = {.started = T0, .pid = 1, .tp = 1};
    struct dg_metrics_canvas cv = {0, 9, 1, 8, 10.0, NAN};
    struct dg_metrics_request q = {.request_id = 1, .uid = 5, .pid = -1, .submitted = T0,
                                   .started = T0, .finished = T0 + 1, .prompt_tokens = 3,
                                   .completion_tokens = 8, .canvases = 1, .steps = 9,
                                   .tokens_per_s = 8, .ttfc_ms = 5, .total_ms = 1000,
                                   .finish = "stop", .canvas = &cv, .n_canvas = 1};
    int64_t id;
    struct timespec a, b;
    double ms;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &w, &err), &err);
    CHECK_OK(dg_metrics_db_begin(w, &err), &err);
    CHECK_OK(dg_metrics_db_put_run(w, &run, &id, &err), &err);
    CHECK_OK(dg_metrics_db_put_request(w, id, "cpu", 1, &q, &err), &err);
    CHECK_OK(dg_metrics_db_commit(w, &err), &err);

    /* the writer holds the lock, one more request uncommitted */
    CHECK_OK(dg_metrics_db_begin(w, &err), &err);
    q.request_id = 2;
    q.finished = T0 + 2;
    CHECK_OK(dg_metrics_db_put_request(w, id, "cpu", 1, &q, &err), &err);

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_READ, 2000, &r, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &a);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(r), T0, T0 + 3600, &s, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    CHECKF(ms < 1000, "the summary waited %.0f ms for the writer", ms);
    CHECK(s.requests == 1 && s.steps.n == 1 && s.steps.max == 9 && s.n_uids == 1 &&
          s.uids[0].uid == 5);
    dg_metrics_summary_free(&s);

    CHECK_OK(dg_metrics_db_commit(w, &err), &err);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(r), T0, T0 + 3600, &s, &err), &err);
    CHECK(s.requests == 2 && s.steps.n == 2 && s.finish[DG_MFINISH_STOP] == 2);
    CHECK(s.n_hours == 1 && s.hours[0].start == floor(T0 / 3600) * 3600);
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(r);
    dg_metrics_db_close(w);
    return 0;
}

/* Without WAL (a file switched back to a rollback journal), a writer's
 * exclusive lock does block readers: the summary gives up after the busy
 * timeout with DG_E_BUSY, and works once the lock is gone. */
static int busy_without_wal(void)
{
    const char *path = test_path("journal.sqlite");
    struct dg_metrics_db *db;
    struct dg_metrics_summary s;
    struct dg_error err = {0};
    sqlite3 *lock = NULL;

    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_WRITE, 100, &db, &err), &err);
    dg_metrics_db_close(db);
    CHECK(raw_exec(path, "PRAGMA journal_mode=DELETE") == SQLITE_OK);
    CHECK_OK(dg_metrics_db_open(path, DG_METRICS_READ, 50, &db, &err), &err);
    CHECK(sqlite3_open(path, &lock) == SQLITE_OK);
    CHECK(sqlite3_exec(lock, "BEGIN EXCLUSIVE; INSERT INTO events (time, kind) VALUES (1, 'x')",
                       NULL, NULL, NULL) == SQLITE_OK);
    CHECK_FAILS(dg_metrics_summary(dg_metrics_db_handle(db), 0, 1e10, &s, &err), &err,
                DG_E_BUSY, "locked");
    CHECK(s.requests == 0 && s.hours == NULL);
    CHECK(sqlite3_get_autocommit(dg_metrics_db_handle(db)));
    CHECK(sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(lock);
    CHECK_OK(dg_metrics_summary(dg_metrics_db_handle(db), 0, 1e10, &s, &err), &err);
    dg_metrics_summary_free(&s);
    dg_metrics_db_close(db);
    return 0;
}

int main(void)
{
    const char *seed = getenv("DG_TEST_SEED");
    const unsigned s = seed ? (unsigned)strtoul(seed, NULL, 10) : (unsigned)time(NULL);
    rng_state ^= s;
    printf("# seed %u (DG_TEST_SEED repeats a run)\n", s);
    TEST_CASE(percentile_and_buckets);
    TEST_CASE(random_summary);
    TEST_CASE(empty_database);
    TEST_CASE(tie_orders);
    TEST_CASE(bad_window);
    TEST_CASE(not_metrics);
    TEST_CASE(reader_while_writing);
    TEST_CASE(busy_without_wal);
    return test_finish();
}
