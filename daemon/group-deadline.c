/* group-deadline.c - the start-up bound on forming the NCCL group (see
 * group-deadline.h). */
#include "daemon/group-deadline.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct dgroup_deadline {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* (CLOCK_MONOTONIC) a join, or the stop */
    pthread_t thread;
    struct timespec at;  /* the deadline, CLOCK_MONOTONIC */
    double seconds;
    int need, joined, stop;
    dgroup_expired_fn expired;
    void *arg;
};

static void *watch(void *p)
{
    struct dgroup_deadline *d = p;
    int late = 0, joined;
    pthread_mutex_lock(&d->mu);
    while (!d->stop && d->joined < d->need)
        if (pthread_cond_timedwait(&d->cv, &d->mu, &d->at) == ETIMEDOUT) {
            late = !d->stop && d->joined < d->need;
            break;
        }
    joined = d->joined;
    pthread_mutex_unlock(&d->mu);
    /* (without the lock: `expired` may end the process, or take long) */
    if (late)
        d->expired(d->arg, joined, d->need, d->seconds);
    return NULL;
}

int dgroup_deadline_start(double seconds, int need, dgroup_expired_fn expired, void *arg,
                          struct dgroup_deadline **out, struct dg_error *err)
{
    struct dgroup_deadline *d;
    pthread_condattr_t ca;
    double whole;
    int rc;
    *out = NULL;
    if (!isfinite(seconds) || seconds < 0 || need < 1 || !expired)
        return dg_error_set(err, DG_E_INVAL, "group deadline: %g s for %d rank(s)", seconds,
                            need);
    if (seconds == 0)
        return 0;
    if (!(d = calloc(1, sizeof *d)))
        return dg_error_set(err, DG_E_NOMEM, "group deadline: out of memory");
    d->seconds = seconds;
    d->need = need;
    d->expired = expired;
    d->arg = arg;
    clock_gettime(CLOCK_MONOTONIC, &d->at);
    d->at.tv_nsec += (long)(modf(seconds, &whole) * 1e9);
    d->at.tv_sec += (time_t)whole + d->at.tv_nsec / 1000000000L;
    d->at.tv_nsec %= 1000000000L;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_create(&d->thread, NULL, watch, d)) != 0) {
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        free(d);
        return dg_error_set(err, DG_E_INTERNAL, "group deadline: thread: error %d", rc);
    }
    *out = d;
    return 0;
}

void dgroup_deadline_joined(void *p, int rank)
{
    struct dgroup_deadline *d = p;
    (void)rank;
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->joined++;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

int dgroup_deadline_count(struct dgroup_deadline *d)
{
    int n;
    if (!d)
        return 0;
    pthread_mutex_lock(&d->mu);
    n = d->joined;
    pthread_mutex_unlock(&d->mu);
    return n;
}

void dgroup_deadline_stop(struct dgroup_deadline *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
