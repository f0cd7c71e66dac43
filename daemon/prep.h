/*
 * prep.h - the tokenizing thread: long prompts are tokenized off the
 * front end's thread.
 *
 * DESIGN
 *   The front end parses every request line itself, but a prompt or chat
 *   with at least dproto_ctx.defer_text_bytes of text is left untokenized
 *   (dproto_tokenize): tokenizing a 1 MB prompt takes a good part of a
 *   second, and the front end's one thread serves every connection.  Such a
 *   request becomes a job for this thread: the front end submits it, stops
 *   reading that connection (so its replies stay in the order of its
 *   lines), and goes on serving the others.  The thread tokenizes, puts
 *   the job on a done list and writes notify_fd (8 bytes); the front end
 *   takes done jobs when that fd reads, admits or refuses each, and
 *   resumes the connection.  A job is owned by one side at a time: the
 *   queues hand it over under one mutex.
 */
#ifndef DG_DAEMON_PREP_H
#define DG_DAEMON_PREP_H

#include <stdint.h>

#include "daemon/protocol.h"
#include "lib/error.h"

/* One request to tokenize, and what the front end needs to finish it. */
struct dprep_job {
    struct dprep_job *next;     /* (the queues' link) */
    uint32_t slot, gen;         /* the connection */
    int ring;                   /* a shared-memory ring's job: ring_slot, user_data */
    uint32_t ring_slot;
    uint64_t user_data;
    int batch;
    struct dproto_request req;  /* in: req.text set; out: ids, or freed on failure */
    int rc;                     /* out: dproto_tokenize's */
    struct dproto_error perr;   /* out, when rc < 0 */
};

struct dprep;

/* Start the thread, tokenizing with ctx (kept, borrowed); notify_fd is
 * written when a job is done.  Errors: DG_E_NOMEM, DG_E_INTERNAL. */
int dprep_create(const struct dproto_ctx *ctx, int notify_fd, struct dprep **out,
                 struct dg_error *err);

/* Hand job (malloc'd) to the thread, which owns it until dprep_take
 * returns it. */
void dprep_submit(struct dprep *p, struct dprep_job *job);

/* The next done job (the caller owns it, and frees it with free() after
 * its request), or NULL when none is done. */
struct dprep_job *dprep_take(struct dprep *p);

/* Stop the thread, waiting for the job in hand, and free every job not
 * taken (their requests too).  NULL is fine. */
void dprep_destroy(struct dprep *p);

#endif
