/*
 * Description: the start-up bound on forming the NCCL group
 * (daemon/group-deadline.c): with none of two ranks in, and with one of
 * two, `expired` is called once, not before the deadline, with the count
 * that joined; with every rank in before it, never (waited well past
 * it); stopped before the deadline, never, and the stop does not wait for
 * the deadline (30 s: its whole seconds count too); ranks joining from
 * threads of their own are all counted; seconds 0 starts nothing; bad
 * arguments are refused.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "daemon/group-deadline.h"
#include "tests/harness.h"

struct seen {
    pthread_mutex_t mu;
    int calls, joined, need;
    double seconds, at; /* when it was called, s since the start */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double t0;

static void record(void *arg, int joined, int need, double seconds)
{
    struct seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    s->joined = joined;
    s->need = need;
    s->seconds = seconds;
    s->at = now_s() - t0;
    pthread_mutex_unlock(&s->mu);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Whether `expired` has been called, waiting up to `s` seconds for it. */
static int called_within(struct seen *s, double wait)
{
    const double end = now_s() + wait;
    for (;;) {
        int c;
        pthread_mutex_lock(&s->mu);
        c = s->calls;
        pthread_mutex_unlock(&s->mu);
        if (c || now_s() >= end)
            return c;
        sleep_s(0.005);
    }
}

/* `joined` of `need` ranks join, then the deadline of 0.1 s passes. */
static int expires_with(int joined, int need)
{
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = NULL;
    struct dg_error err = {0};
    t0 = now_s();
    CHECK_OK(dgroup_deadline_start(0.1, need, record, &s, &d, &err), &err);
    CHECK(d != NULL);
    for (int i = 0; i < joined; i++)
        dgroup_deadline_joined(d, i);
    CHECKF(called_within(&s, 5.0) == 1, "%d of %d joined: expired not called in 5 s", joined,
           need);
    dgroup_deadline_stop(d);
    CHECKF(s.calls == 1, "expired called %d times", s.calls);
    CHECKF(s.joined == joined && s.need == need, "expired with %d of %d, want %d of %d",
           s.joined, s.need, joined, need);
    CHECKF(s.seconds == 0.1, "expired with %g s", s.seconds);
    CHECKF(s.at >= 0.1, "expired %.3f s after the start, before its deadline", s.at);
    return 0;
}

static int none_joined(void)
{
    return expires_with(0, 2);
}

static int one_of_two(void)
{
    return expires_with(1, 2);
}

/* Both ranks in before the deadline: nothing called, waited to 3x it. */
static int all_joined(void)
{
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = NULL;
    struct dg_error err = {0};
    t0 = now_s();
    CHECK_OK(dgroup_deadline_start(0.1, 2, record, &s, &d, &err), &err);
    dgroup_deadline_joined(d, 0);
    dgroup_deadline_joined(d, 1);
    CHECK(dgroup_deadline_count(d) == 2);
    CHECKF(called_within(&s, 0.3) == 0, "expired called with every rank in (at %.3f s)", s.at);
    dgroup_deadline_stop(d);
    CHECK(s.calls == 0);
    return 0;
}

/* A deadline of 30 s with nobody in, stopped 0.2 s into it: nothing
 * called by then, and the stop comes back long before the deadline. */
static int stopped_early(void)
{
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = NULL;
    struct dg_error err = {0};
    double took;
    t0 = now_s();
    CHECK_OK(dgroup_deadline_start(30, 4, record, &s, &d, &err), &err);
    CHECKF(called_within(&s, 0.2) == 0, "expired called %.3f s into a deadline of 30 s", s.at);
    dgroup_deadline_stop(d);
    took = now_s() - t0;
    CHECKF(took < 5.0, "the stop took %.3f s", took);
    CHECK(s.calls == 0);
    return 0;
}

struct joiner {
    struct dgroup_deadline *d;
    int rank;
};

static void *join_from_thread(void *p)
{
    struct joiner *j = p;
    dgroup_deadline_joined(j->d, j->rank);
    return NULL;
}

/* Eight ranks join from threads of their own: all counted, and with all
 * in, nothing expires. */
static int threads_join(void)
{
    enum { N = 8 };
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = NULL;
    struct dg_error err = {0};
    struct joiner j[N];
    pthread_t th[N];
    t0 = now_s();
    CHECK_OK(dgroup_deadline_start(0.2, N, record, &s, &d, &err), &err);
    for (int i = 0; i < N; i++) {
        j[i].d = d;
        j[i].rank = i;
        CHECK(pthread_create(&th[i], NULL, join_from_thread, &j[i]) == 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    CHECK(dgroup_deadline_count(d) == N);
    CHECKF(called_within(&s, 0.5) == 0, "expired called with %d of %d in", s.joined, s.need);
    dgroup_deadline_stop(d);
    return 0;
}

/* seconds 0: no deadline, nothing started; NULL is accepted everywhere. */
static int no_deadline(void)
{
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = (struct dgroup_deadline *)&s;
    struct dg_error err = {0};
    CHECK_OK(dgroup_deadline_start(0, 2, record, &s, &d, &err), &err);
    CHECK(d == NULL);
    dgroup_deadline_joined(NULL, 0);
    CHECK(dgroup_deadline_count(NULL) == 0);
    dgroup_deadline_stop(NULL);
    CHECK(s.calls == 0);
    return 0;
}

static int bad_arguments(void)
{
    struct seen s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct dgroup_deadline *d = NULL;
    struct dg_error err = {0};
    CHECK_FAILS(dgroup_deadline_start(-1, 2, record, &s, &d, &err), &err, DG_E_INVAL, "-1 s");
    CHECK_FAILS(dgroup_deadline_start(NAN, 2, record, &s, &d, &err), &err, DG_E_INVAL, "nan");
    CHECK_FAILS(dgroup_deadline_start(1, 0, record, &s, &d, &err), &err, DG_E_INVAL, "0 rank");
    CHECK_FAILS(dgroup_deadline_start(1, 2, NULL, &s, &d, &err), &err, DG_E_INVAL, "group");
    CHECK(d == NULL);
    return 0;
}

int main(void)
{
    TEST_CASE(none_joined);
    TEST_CASE(one_of_two);
    TEST_CASE(all_joined);
    TEST_CASE(stopped_early);
    TEST_CASE(threads_join);
    TEST_CASE(no_deadline);
    TEST_CASE(bad_arguments);
    return test_finish();
}
