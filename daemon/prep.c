/* prep.c - the tokenizing thread (see prep.h). */
#include "daemon/prep.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dprep {
    const struct dproto_ctx *ctx;
    int notify_fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dprep_job *todo, *todo_tail; /* FIFO */
    struct dprep_job *done, *done_tail; /* FIFO */
    int stop;
};

static void push(struct dprep_job **head, struct dprep_job **tail, struct dprep_job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static struct dprep_job *pop(struct dprep_job **head, struct dprep_job **tail)
{
    struct dprep_job *j = *head;
    if (j) {
        *head = j->next;
        if (!*head)
            *tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void free_list(struct dprep_job *j)
{
    while (j) {
        struct dprep_job *next = j->next;
        dproto_request_free(&j->req);
        free(j);
        j = next;
    }
}

static void *run(void *arg)
{
    struct dprep *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct dprep_job *j;
        const uint64_t one = 1;
        ssize_t n;
        while (!p->stop && !p->todo)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        j = pop(&p->todo, &p->todo_tail);
        pthread_mutex_unlock(&p->mu);
        j->rc = dproto_tokenize(p->ctx, &j->req, &j->perr);
        pthread_mutex_lock(&p->mu);
        push(&p->done, &p->done_tail, j);
        /* (an eventfd: a write fails only when its counter would overflow,
         * and then a wake-up is already due) */
        do
            n = write(p->notify_fd, &one, sizeof one);
        while (n < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dprep_create(const struct dproto_ctx *ctx, int notify_fd, struct dprep **out,
                 struct dg_error *err)
{
    struct dprep *p = calloc(1, sizeof *p);
    int rc;
    *out = NULL;
    if (!p)
        return dg_error_set(err, DG_E_NOMEM, "out of memory for the tokenizing thread");
    p->ctx = ctx;
    p->notify_fd = notify_fd;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return dg_error_set(err, DG_E_INTERNAL, "the tokenizing thread's mutex");
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return dg_error_set(err, DG_E_INTERNAL, "the tokenizing thread's condition");
    }
    if ((rc = pthread_create(&p->thread, NULL, run, p)) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return dg_error_set(err, DG_E_INTERNAL, "the tokenizing thread: %s", strerror(rc));
    }
    *out = p;
    return 0;
}

void dprep_submit(struct dprep *p, struct dprep_job *job)
{
    pthread_mutex_lock(&p->mu);
    push(&p->todo, &p->todo_tail, job);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

struct dprep_job *dprep_take(struct dprep *p)
{
    struct dprep_job *j;
    pthread_mutex_lock(&p->mu);
    j = pop(&p->done, &p->done_tail);
    pthread_mutex_unlock(&p->mu);
    return j;
}

void dprep_destroy(struct dprep *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    free_list(p->todo);
    free_list(p->done);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
