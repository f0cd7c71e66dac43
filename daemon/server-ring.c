/* server-ring.c - the front end's shared-memory rings: attach, take the
 * clients' submissions, complete their jobs (see server.h and
 * server-state.h; the ring itself is shm-ring.c). */
#include "daemon/server-state.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/dlog.h"
#include "lib/json-util.h"

#define RING_TAKE 64 /* ring submissions taken per turn of the loop */

/* Wait for the client to ring its submission doorbell: a poll, then a
 * read that empties the counter (on_bell), both through the io_uring: the
 * client can make the eventfd blocking (the flag is the open file's, and
 * it holds the file too), and a read of the loop's own would then wait
 * for it. */
static void arm_bell(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (c->bell_armed || c->bell_reading || c->gone || !c->ring || dshm_ring_broken(c->ring) ||
        !(sqe = get_sqe(srv)))
        return;
    io_uring_prep_poll_add(sqe, dshm_ring_sq_fd(c->ring), POLLIN);
    io_uring_sqe_set_data64(sqe, ud_make(OP_BELL, slot_of(srv, c), c->gen));
    c->bell_armed = 1;
    c->pending++;
}

/* Write the completion doorbell if the ring owes one: through the io_uring
 * (a write of the loop's own would wait for ever on an eventfd the client
 * made blocking and filled), one write at a time (what is owed meanwhile
 * goes once that one ends: on_cq_bell). */
static void cq_bell(struct dserver *srv, struct conn *c)
{
    struct io_uring_sqe *sqe;
    if (!c->ring)
        return;
    if (dshm_ring_bell_due(c->ring))
        c->cq_bell_due = 1;
    if (!c->cq_bell_due || c->cq_bell_busy || c->gone || !(sqe = get_sqe(srv)))
        return;
    c->cq_bell_val = 1;
    io_uring_prep_write(sqe, dshm_ring_cq_fd(c->ring), &c->cq_bell_val, sizeof c->cq_bell_val,
                        0);
    io_uring_sqe_set_data64(sqe, ud_make(OP_CQ_BELL, slot_of(srv, c), c->gen));
    c->cq_bell_busy = 1;
    c->cq_bell_due = 0;
    c->pending++;
}

/* The completion doorbell's write ended (written, refused, or cancelled
 * with the connection): the next one owed, if any. */
void on_cq_bell(struct dserver *srv, struct conn *c, int res)
{
    (void)res; /* (a client that left its counter full gets no more wakes: its
                * loss alone) */
    c->cq_bell_busy = 0;
    cq_bell(srv, c);
}

/* A protocol or engine error code as a ring status: the client's mistakes
 * are bad_request; anything the daemon or engine ran into (out_of_memory,
 * cuda, ...) is internal. */
uint32_t shm_status_of(const char *code)
{
    return !strcmp(code, "too_large")       ? DG_SHM_ERR_TOO_LARGE
           : !strcmp(code, "busy")          ? DG_SHM_ERR_BUSY
           : !strcmp(code, "shutting_down") ? DG_SHM_ERR_SHUTTING_DOWN
           : !strcmp(code, "bad_request") || !strcmp(code, "bad_json") ||
                   !strcmp(code, "unknown_op") || !strcmp(code, "bad_version")
               ? DG_SHM_ERR_BAD_REQUEST
               : DG_SHM_ERR_INTERNAL;
}

static const char *shm_code_name(uint32_t st)
{
    static const char *const names[] = {"ok", "bad_request", "too_large", "busy",
                                        "shutting_down", "internal"};
    return st < sizeof names / sizeof names[0] ? names[st] : "internal";
}

/* Complete the ring job in slot with an error: status and msg, no output. */
static void ring_fail(struct dserver *srv, struct conn *c, uint32_t slot, uint32_t status,
                      const char *msg)
{
    struct dshm_result res;
    memset(&res, 0, sizeof res);
    res.status = status;
    res.finish = DG_SHM_FINISH_ERROR;
    res.text = msg;
    res.text_len = strlen(msg);
    res.stop_id = -1;
    if (dshm_ring_complete(c->ring, slot, &res) < 0)
        dlog(DG_LOG_ERROR, "conn %u: out of memory completing a ring job: it ends as an "
             "internal error", slot_of(srv, c));
    cq_bell(srv, c);
}

/* A ring job that will not run: its completion says why (and the metrics
 * record the refusal). */
void ring_refuse(struct dserver *srv, struct conn *c, const struct dshm_job *job,
                 uint32_t status, const char *msg, size_t prompt_tokens)
{
    record_refusal(srv, c, NULL, job->batch ? DG_SOURCE_BATCH : DG_SOURCE_SHM, prompt_tokens,
                   shm_code_name(status), msg);
    {
        char what[48];
        snprintf(what, sizeof what, "ring job %llu ", (unsigned long long)job->user_data);
        log_refusal(srv, c, what, shm_code_name(status), msg);
    }
    ring_fail(srv, c, job->slot, status, msg);
}

/* A broken ring: the client loses it (and its jobs); the connection stays. */
static void ring_fault(struct dserver *srv, struct conn *c, const char *why)
{
    dlog(DG_LOG_WARN, "conn %u (uid %d): %s", slot_of(srv, c), (int)c->uid, why);
    if (c->ring_active) {
        /* cancelled without a done line: they stop counting now */
        dsched_conn_gone(srv->sched, conn_key(srv, c) | RING_KEY_BIT);
        c->active -= c->ring_active;
        c->ring_active = 0;
    }
    c->ring_again = c->ring_stalled = 0;
    cq_bell(srv, c); /* (the fault's: a client waiting for completions sees the flag) */
    maybe_finish(srv, c);
}

/* Hand a ring's job, its request parsed and tokenized, to the scheduler
 * (or refuse it).  req stays the caller's. */
void ring_submit(struct dserver *srv, struct conn *c, const struct dshm_job *job,
                 struct dproto_request *req)
{
    const uint64_t key = conn_key(srv, c) | RING_KEY_BIT;
    struct dg_error err = {0};
    uint64_t id = 0;
    int rc;

    if (srv->phase != RUNNING) {
        ring_refuse(srv, c, job, DG_SHM_ERR_SHUTTING_DOWN, "the daemon is shutting down",
                    req->n_ids);
    } else {
        const size_t n_prompt = req->n_ids;
        const uint64_t seed = req->settings.seed;
        rc = dsched_submit(srv->sched, key, req, c->uid, c->pid,
                           job->batch ? DG_SOURCE_BATCH : DG_SOURCE_SHM, &id, &err);
        if (rc < 0) {
            ring_refuse(srv, c, job,
                        rc == -DG_E_BUSY    ? DG_SHM_ERR_BUSY
                        : rc == -DG_E_RANGE ? DG_SHM_ERR_TOO_LARGE
                        : rc == -DG_E_INVAL ? DG_SHM_ERR_SHUTTING_DOWN
                                            : DG_SHM_ERR_INTERNAL,
                        err.msg, n_prompt);
        } else {
            dshm_ring_bind(c->ring, job->slot, id, seed);
            c->active++;
            c->ring_active++;
            dlog(DG_LOG_DEBUG, "req=%llu conn %u uid=%d: ring job %llu, %zu prompt tokens",
                 (unsigned long long)id, slot_of(srv, c), (int)c->uid,
                 (unsigned long long)job->user_data, n_prompt);
        }
    }
}

/* Take one submission: a cancel, or a request parsed here and then handed
 * to the scheduler, or to the tokenizing thread first (a long text). */
static void ring_job(struct dserver *srv, struct conn *c, struct dshm_job *job)
{
    struct dproto_request req;
    struct dproto_error perr;
    int rc;

    if (job->op == DG_SHM_OP_CANCEL) {
        const int slot = dshm_ring_find_user(c->ring, job->user_data);
        /* (a job not in flight, or already done: nothing to do) */
        if (slot >= 0) {
            const uint64_t target = dshm_ring_id_of(c->ring, (uint32_t)slot);
            if (target)
                dsched_cancel(srv->sched, conn_key(srv, c) | RING_KEY_BIT, c->uid, target);
        }
        return;
    }
    if (job->error) {
        ring_refuse(srv, c, job, job->error, job->message, 0);
        return;
    }
    rc = dproto_parse_json(job->request, &srv->pctx_defer, &req, &perr);
    json_decref(job->request);
    job->request = NULL;
    if (rc < 0) {
        ring_refuse(srv, c, job, shm_status_of(perr.code), perr.message, 0);
        return;
    }
    if (req.text && srv->phase == RUNNING)
        prep_start(srv, c, &req, job);
    else
        ring_submit(srv, c, job, &req);
    dproto_request_free(&req);
}

/* Take what the client submitted: posts waiting completions first, then at
 * most RING_TAKE submissions, and only while the scheduler has room (the
 * rest wait in the ring: ring_again / ring_stalled say when to look
 * again). */
static void ring_take_all(struct dserver *srv, struct conn *c)
{
    struct dg_error err = {0};
    c->ring_again = c->ring_stalled = 0;
    if (!c->ring || c->gone || dshm_ring_broken(c->ring))
        return;
    if (dshm_ring_flush(c->ring, &err) < 0) {
        ring_fault(srv, c, err.msg);
        return;
    }
    for (int n = 0;; n++) {
        struct dshm_job job;
        int rc;
        if (c->prepping)
            return; /* (prep_resume looks again) */
        if (n == RING_TAKE) {
            c->ring_again = 1;
            return;
        }
        /* no room for a new job: only a cancel is taken (it needs none) */
        const int full = srv->phase == RUNNING && (dsched_room(srv->sched) == 0 ||
                                                   c->active >= srv->o.client_max_requests);
        rc = full ? dshm_ring_next_cancel(c->ring, &job, &err)
                  : dshm_ring_next(c->ring, &job, &err);
        if (rc < 0) {
            ring_fault(srv, c, err.msg);
            return;
        }
        if (rc == 0) {
            c->ring_stalled = full;
            return;
        }
        ring_job(srv, c, &job);
        json_decref(job.request);
    }
}

void ring_service(struct dserver *srv, struct conn *c)
{
    ring_take_all(srv, c);
    cq_bell(srv, c); /* (for what the flush and the refusals posted) */
}

/* A ring job's last line (done, or error when it could not start): its
 * completion. */
void ring_done(struct dserver *srv, struct conn *c, const char *line, size_t len)
{
    /* (the text may hold U+0000: a byte-fallback token can decode to it) */
    /* (a parse during which memory ran short is not trusted: jansson may
     * misread the id, and the job would never complete) */
    struct dg_error perr = {0};
    json_t *d = dg_json_loadb(line, len, JSON_ALLOW_NUL, "a ring job's result", &perr), *ids, *err,
           *usage, *v;
    struct dshm_result res;
    int32_t *idv = NULL;
    const char *finish, *msg = NULL, *event;
    int slot;

    if (!d) {
        /* (out of memory: the scheduler's lines are JSON) the job still
         * completes, with an error, found by the id its line starts with */
        const char *p = memmem(line, len, "\"id\":", 5);
        dlog(DG_LOG_ERROR, "conn %u: out of memory reading a ring job's result",
             slot_of(srv, c));
        slot = p && c->ring ? dshm_ring_find_id(c->ring, strtoull(p + 5, NULL, 10)) : -1;
        if (slot >= 0)
            ring_fail(srv, c, (uint32_t)slot, DG_SHM_ERR_INTERNAL,
                      "out of memory reading the job's result");
        return;
    }
    event = json_string_value(json_object_get(d, "event"));
    event = event ? event : "";
    slot = c->ring && (!strcmp(event, "done") || !strcmp(event, "error"))
               ? dshm_ring_find_id(c->ring, (uint64_t)json_integer_value(json_object_get(d, "id")))
               : -1;
    if (slot < 0) {
        json_decref(d);
        return;
    }
    if (!strcmp(event, "error")) {
        /* (a job the engine could not start ends with an error line) */
        const char *code = json_string_value(json_object_get(d, "code"));
        msg = json_string_value(json_object_get(d, "message"));
        ring_fail(srv, c, (uint32_t)slot, shm_status_of(code ? code : "internal"),
                  msg ? msg : "failed");
        json_decref(d);
        return;
    }
    memset(&res, 0, sizeof res);
    finish = json_string_value(json_object_get(d, "finish_reason"));
    finish = finish ? finish : "error";
    res.finish = !strcmp(finish, "stop")        ? DG_SHM_FINISH_STOP
                 : !strcmp(finish, "length")    ? DG_SHM_FINISH_LENGTH
                 : !strcmp(finish, "cancelled") ? DG_SHM_FINISH_CANCELLED
                                                : DG_SHM_FINISH_ERROR;
    usage = json_object_get(d, "usage");
    res.prompt_tokens = (uint32_t)json_integer_value(json_object_get(usage, "prompt_tokens"));
    res.completion_tokens =
        (uint32_t)json_integer_value(json_object_get(usage, "completion_tokens"));
    res.canvases = (uint32_t)json_integer_value(json_object_get(d, "canvases"));
    res.decoder_steps = (uint64_t)json_integer_value(json_object_get(d, "decoder_steps"));
    res.tokens_per_s = json_number_value(json_object_get(d, "tokens_per_s"));
    res.ms_total = json_number_value(json_object_get(d, "ms_total"));
    res.ms_first_canvas = json_number_value(json_object_get(d, "ms_first_canvas"));
    v = json_object_get(d, "stop_id");
    res.stop_id = json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
    ids = json_object_get(d, "ids");
    if (json_array_size(ids) > 0 && (idv = malloc(json_array_size(ids) * sizeof *idv))) {
        size_t i;
        json_array_foreach(ids, i, v)
            idv[i] = (int32_t)json_integer_value(v);
        res.ids = idv;
        res.n_ids = json_array_size(ids);
    }
    res.text = json_string_value(json_object_get(d, "text"));
    res.text_len = res.text ? json_string_length(json_object_get(d, "text")) : 0;
    if (json_array_size(ids) > 0 && !idv) {
        /* (out of memory for the ids: an error, not a silently shorter output) */
        res.finish = DG_SHM_FINISH_ERROR;
        res.status = DG_SHM_ERR_INTERNAL;
        res.text = "out of memory copying the job's output";
        res.text_len = strlen(res.text);
    } else if (res.finish == DG_SHM_FINISH_ERROR &&
               (err = json_object_get(d, "error")) != NULL) {
        const char *code = json_string_value(json_object_get(err, "code"));
        msg = json_string_value(json_object_get(err, "message"));
        res.status = shm_status_of(code ? code : "internal");
        res.ids = NULL;
        res.n_ids = 0;
        res.text = msg ? msg : "failed";
        res.text_len = strlen(res.text);
    }
    if (dshm_ring_complete(c->ring, (uint32_t)slot, &res) < 0)
        dlog(DG_LOG_ERROR, "conn %u: out of memory completing a ring job: it ends as an "
             "internal error", slot_of(srv, c));
    cq_bell(srv, c);
    free(idv);
    json_decref(d);
}

/* Whether c's uid may take a ring of `size` more bytes under
 * shm_user_max_bytes (the rings its connections hold now counted); if
 * not, c is told why (too_large where the ring alone passes the cap,
 * busy where the uid's other rings leave no room) and 0 returned. */
static int user_has_room(struct dserver *srv, struct conn *c, uint64_t size, const char *tag)
{
    const uint64_t cap = srv->o.shm_user_max_bytes;
    uint64_t held = 0;
    int rings = 0;
    char msg[256];
    if (cap == 0)
        return 1;
    if (size > cap) {
        snprintf(msg, sizeof msg, "shm_attach: a ring of %llu bytes is more than one user may "
                 "hold (shm_user_max_mb: %llu); ask for fewer entries or smaller arenas",
                 (unsigned long long)size, (unsigned long long)(cap >> 20));
        send_error(srv, c, 0, tag, "too_large", msg);
        return 0;
    }
    for (int i = 0; i < srv->o.max_connections; i++) {
        const struct conn *o = &srv->conns[i];
        struct dshm_sizes got;
        uint64_t total = 0;
        if (!o->in_use || !o->ring || o->uid != c->uid)
            continue;
        dshm_ring_sizes(o->ring, &got, &total);
        held += total;
        rings++;
    }
    if (held + size <= cap)
        return 1;
    snprintf(msg, sizeof msg, "shm_attach: uid %d's %d ring(s) hold %llu bytes; %llu more would "
             "pass shm_user_max_mb (%llu)", (int)c->uid, rings, (unsigned long long)held,
             (unsigned long long)size, (unsigned long long)(cap >> 20));
    dlog(DG_LOG_WARN, "conn %u pid=%d: %s", slot_of(srv, c), (int)c->pid, msg);
    send_error(srv, c, 0, tag, "busy", msg);
    return 0;
}

void shm_attach(struct dserver *srv, struct conn *c, const struct dproto_request *req,
                const char *tag)
{
    const struct dshm_sizes ask = {req->shm.sq_entries, req->shm.cq_entries, req->shm.in_bytes,
                                   req->shm.out_bytes};
    struct dshm_sizes got;
    struct dshm_limits lim;
    struct dg_error err = {0};
    uint64_t total = 0;
    int fds[3] = {-1, -1, -1};
    json_t *o;
    char *line;
    size_t len = 0;

    if (srv->o.shm.max_entries == 0) {
        send_error(srv, c, 0, tag, "bad_request",
                   "shm_attach: shared-memory rings are off (shm_max_entries: 0)");
        return;
    }
    if (c->ring) {
        send_error(srv, c, 0, tag, "bad_request", "shm_attach: this connection has a ring");
        return;
    }
    if (srv->phase != RUNNING) {
        send_error(srv, c, 0, tag, "shutting_down", "the daemon is shutting down");
        return;
    }
    lim = srv->o.shm;
    lim.max_prompt_ids = srv->pctx_defer.max_prompt_tokens;
    lim.max_stop_strings = DG_MAX_STOP_STRINGS;
    if (!user_has_room(srv, c, dshm_ring_size_for(&ask, &lim), tag))
        return;
    if (dshm_ring_create(&ask, &lim, &c->ring, &fds[0], &err) < 0) {
        dlog(DG_LOG_ERROR, "conn %u: %s", slot_of(srv, c), err.msg);
        send_error(srv, c, 0, tag, "internal", err.msg);
        return;
    }
    srv->rings++;
    dshm_ring_sizes(c->ring, &got, &total);
    fds[1] = fcntl(dshm_ring_sq_fd(c->ring), F_DUPFD_CLOEXEC, 0);
    fds[2] = fcntl(dshm_ring_cq_fd(c->ring), F_DUPFD_CLOEXEC, 0);
    o = json_pack("{s:i,s:I,s:I,s:I,s:I,s:I}", "version", (int)DG_SHM_VERSION, "size",
                  (json_int_t)total, "sq_entries", (json_int_t)got.sq_entries, "cq_entries",
                  (json_int_t)got.cq_entries, "in_bytes", (json_int_t)got.in_bytes,
                  "out_bytes", (json_int_t)got.out_bytes);
    if (o && tag)
        json_object_set_new(o, "tag", json_string(tag));
    line = o ? dproto_event_obj("shm_attached", o, &len) : NULL;
    if (!line || fds[1] < 0 || fds[2] < 0) {
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        free(line);
        dshm_ring_destroy(c->ring);
        c->ring = NULL;
        srv->rings--;
        send_error(srv, c, 0, tag, "internal", "shm_attach: out of memory or descriptors");
        return;
    }
    dlog(DG_LOG_INFO, "conn %u uid=%d pid=%d: shared-memory ring of %llu bytes (%u/%u "
         "entries, arenas %llu/%llu bytes)", slot_of(srv, c), (int)c->uid, (int)c->pid,
         (unsigned long long)total, got.sq_entries, got.cq_entries,
         (unsigned long long)got.in_bytes, (unsigned long long)got.out_bytes);
    conn_write_fds(srv, c, line, len, fds, 3);
    free(line);
    arm_bell(srv, c);
}

/* The doorbell poll completed: serve the ring, and empty the counter by a
 * read through the io_uring (the poll is armed again once it ends:
 * on_bell_read). */
void on_bell(struct dserver *srv, struct conn *c, int res)
{
    struct io_uring_sqe *sqe;
    c->bell_armed = 0;
    if (c->gone || !c->ring)
        return;
    if (res < 0 && res != -EINTR && res != -EAGAIN) {
        ring_fault(srv, c, "the ring's doorbell failed");
        return;
    }
    if ((sqe = get_sqe(srv)) != NULL) {
        io_uring_prep_read(sqe, dshm_ring_sq_fd(c->ring), &c->bell_val, sizeof c->bell_val, 0);
        io_uring_sqe_set_data64(sqe, ud_make(OP_BELL_READ, slot_of(srv, c), c->gen));
        c->bell_reading = 1;
        c->pending++;
    }
    ring_service(srv, c);
    arm_bell(srv, c); /* (only where no read went out) */
}

/* The doorbell's counter was read (or the read failed: -EAGAIN when the
 * client emptied it first): serve the ring again, and wait for the next
 * ring. */
void on_bell_read(struct dserver *srv, struct conn *c, int res)
{
    c->bell_reading = 0;
    if (c->gone || !c->ring)
        return;
    if (res < 0 && res != -EINTR && res != -EAGAIN) {
        ring_fault(srv, c, "the ring's doorbell failed");
        return;
    }
    ring_service(srv, c);
    arm_bell(srv, c);
}

/* Look again at the rings that asked for it (stalled ones only when the
 * scheduler has room).  Returns whether one still has more to take. */
int rings_turn(struct dserver *srv, int stalled_too)
{
    int more = 0;
    if (srv->rings == 0)
        return 0;
    for (int i = 0; i < srv->o.max_connections; i++) {
        struct conn *c = &srv->conns[i];
        if (!c->in_use || c->gone || !c->ring)
            continue;
        if (c->ring_again || (stalled_too && c->ring_stalled))
            ring_service(srv, c);
        more |= c->ring_again;
    }
    return more;
}

