/*
 * Description: the shared-memory ring against the real dgemmad (from
 * $BUILD/bin) on the random test model ($BUILD/model/random).  2000
 * small jobs (150 under AddressSanitizer) through libdgemma's ring give,
 * each, the same output as the same request over the socket; a hostile
 * client that writes random bytes into every field of its ring (header,
 * indexes, entries, arenas) and rings its doorbell while another client
 * runs normally: the other client's outputs are
 * unchanged, the daemon stays up and answers; a client killed with jobs in
 * flight: the daemon cancels them, releases the ring (status "rings" back
 * to 0) and holds no more descriptors than before; a job cancelled through
 * the ring ends cancelled, also while a running job holds each of its
 * completion slots; entries far past the request limits (2M prompt ids,
 * 4M stop strings) refused without the daemon's memory growing; a client
 * that makes its doorbells blocking and fills the completion doorbell
 * gets its completion while the daemon serves others, and its ring is
 * released when it leaves; jobs
 * with prompts long enough for the
 * tokenizing thread (3 MB: status shows it being tokenized, then
 * too_large; 4.2 KB, just past the thread's 4 KiB: the socket's output,
 * a prompt whose prefill is short even under AddressSanitizer) and a
 * short one behind them all
 * complete; a second shm_attach on
 * one connection and an attach with rings turned off are refused, and an
 * attach while the daemon has no descriptor free fails with the reason
 * (the same connection attaches once it has).  Each daemon the cases stop
 * must exit 0 on SIGTERM: under AddressSanitizer that is its leak check.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/dgemma.h"
#include "lib/shm-layout.h"
#include "tests/harness.h"
#include "tests/integration/fixture.h"

#define WAIT_MS FIXTURE_WAIT_MS

static char sock_path[512], log_path[512];
static pid_t daemon_pid;

static const char *const DAEMON_OPTS[] = {
    "max_batch=16", "queue_max=64", "pin_workers=false", "tick=0.05", "shutdown_grace=1",
    NULL,
};

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    return test_xorshift(&rng);
}

static int start_daemon(const char *const *opts)
{
    daemon_pid = fixture_spawn(sock_path, log_path, opts);
    return daemon_pid > 0 && fixture_wait_ready(daemon_pid, sock_path) == 0 ? 0 : -1;
}

/* The daemon, if one runs, stopped (fixture_stop): 0 when it exited 0 or
 * none ran. */
static int stop_daemon(void)
{
    const pid_t p = daemon_pid;
    daemon_pid = 0;
    return p > 0 ? fixture_stop(p, log_path) : 0;
}

static dgemma_t *open_conn(void)
{
    dgemma_t *c = dgemma_new();
    if (c && dgemma_connect(c, sock_path, 5) != 0) {
        dgemma_close(c);
        return NULL;
    }
    return c;
}

/* The daemon's open descriptors. */
static int daemon_fds(void)
{
    return fixture_fds_open(daemon_pid);
}

/* One integer of the status event; -1 on failure. */
static long long status_int(const char *key)
{
    dgemma_t *c = open_conn();
    dgemma_event_t ev;
    long long v = -1;
    json_t *s;
    if (!c)
        return -1;
    if (dgemma_status(c) == 0 && dgemma_next_event(c, &ev, WAIT_MS) == 0 &&
        ev.kind == DGEMMA_EV_STATUS && (s = json_loads(ev.json, 0, NULL))) {
        v = json_integer_value(json_object_get(s, key));
        json_decref(s);
    }
    dgemma_close(c);
    return v;
}

/* ---- a request and its output over the socket ------------------------------------- */

struct out {
    char text[4096];
    size_t text_len;
    int32_t ids[512];
    size_t n_ids;
    char finish[16];
    long long prompt_tokens;
};

static dgemma_request_t *job_request(int i)
{
    char p[64];
    dgemma_request_t *r;
    snprintf(p, sizeof p, "job number %d says", i);
    r = dgemma_request_text(p);
    if (r && (dgemma_request_set_int(r, "seed", 1000 + i) != 0 ||
              dgemma_request_set_int(r, "max_tokens", 1 + i % 4) != 0 ||
              dgemma_request_set_int(r, "canvas_length", 4) != 0 ||
              dgemma_request_set_int(r, "max_denoising_steps", 1 + i % 2) != 0)) {
        dgemma_request_free(r);
        r = NULL;
    }
    return r;
}

/* Run request r over connection c, not streamed; its output in *o. */
static int socket_run(dgemma_t *c, dgemma_request_t *r, struct out *o)
{
    dgemma_event_t ev;
    memset(o, 0, sizeof *o);
    CHECK(dgemma_request_set_stream(r, 0) == 0);
    CHECK(dgemma_submit(c, r) == 0);
    for (;;) {
        CHECKF(dgemma_next_event(c, &ev, WAIT_MS) == 0, "%s", dgemma_errmsg(c));
        if (ev.kind == DGEMMA_EV_ACCEPTED)
            continue;
        CHECKF(ev.kind == DGEMMA_EV_DONE, "%s", ev.json);
        CHECK(ev.text_len < sizeof o->text && ev.n_ids <= 512);
        memcpy(o->text, ev.text, ev.text_len);
        o->text_len = ev.text_len;
        memcpy(o->ids, ev.ids, ev.n_ids * sizeof *ev.ids);
        o->n_ids = ev.n_ids;
        snprintf(o->finish, sizeof o->finish, "%s", ev.finish_reason);
        o->prompt_tokens = ev.prompt_tokens;
        return 0;
    }
}

/* Outputs of jobs 0..n-1 (job_request) over the socket, up to `window` in
 * flight at once, told apart by their tags. */
static int socket_run_many(dgemma_t *c, int n, int window, struct out *o)
{
    int sent = 0, done = 0;
    while (done < n) {
        dgemma_event_t ev;
        while (sent < n && sent - done < window) {
            dgemma_request_t *r = job_request(sent);
            char tag[16];
            snprintf(tag, sizeof tag, "%d", sent);
            CHECK(r && dgemma_request_set_stream(r, 0) == 0 && dgemma_request_set_tag(r, tag) == 0);
            CHECK(dgemma_submit(c, r) == 0);
            dgemma_request_free(r);
            sent++;
        }
        CHECKF(dgemma_next_event(c, &ev, WAIT_MS) == 0, "%s", dgemma_errmsg(c));
        if (ev.kind == DGEMMA_EV_ACCEPTED)
            continue;
        CHECKF(ev.kind == DGEMMA_EV_DONE && ev.tag, "%s", ev.json);
        {
            const int i = atoi(ev.tag);
            CHECK(i >= 0 && i < n && ev.text_len < sizeof o[i].text && ev.n_ids <= 512);
            memcpy(o[i].text, ev.text, ev.text_len);
            o[i].text_len = ev.text_len;
            memcpy(o[i].ids, ev.ids, ev.n_ids * sizeof *ev.ids);
            o[i].n_ids = ev.n_ids;
            snprintf(o[i].finish, sizeof o[i].finish, "%s", ev.finish_reason);
        }
        done++;
    }
    return 0;
}

/* ---- a raw ring, without libdgemma (for the hostile client) ---------------------------- */

struct raw {
    int sock, memfd, sq_fd, cq_fd;
    unsigned char *map;
    size_t size;
};

/* Attach over a new connection with the shm_attach line req: 0, or -1. */
static int raw_attach_req(struct raw *w, const char *req)
{
    char buf[4096];
    union {
        char b[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr a;
    } cm;
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr msg = {0};
    struct cmsghdr *h;
    json_t *ev;
    ssize_t n;
    int fds[3] = {-1, -1, -1};

    memset(w, 0, sizeof *w);
    w->sock = fixture_connect(sock_path);
    if (w->sock < 0 || send(w->sock, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
        return -1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cm.b;
    msg.msg_controllen = sizeof cm.b;
    n = recvmsg(w->sock, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    for (h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h))
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
            h->cmsg_len == CMSG_LEN(3 * sizeof(int)))
            memcpy(fds, CMSG_DATA(h), sizeof fds);
    ev = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    if (!ev || fds[0] < 0)
        return json_decref(ev), -1;
    w->size = (size_t)json_integer_value(json_object_get(ev, "size"));
    json_decref(ev);
    w->memfd = fds[0];
    w->sq_fd = fds[1];
    w->cq_fd = fds[2];
    w->map = mmap(NULL, w->size, PROT_READ | PROT_WRITE, MAP_SHARED, w->memfd, 0);
    return w->map == MAP_FAILED ? -1 : 0;
}

static int raw_attach(struct raw *w)
{
    return raw_attach_req(w, "{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":64,"
                             "\"cq_entries\":64}\n");
}

static struct dg_shm_header *raw_hdr(struct raw *w)
{
    return (struct dg_shm_header *)w->map;
}

/* Entry e as submission number i (then the caller publishes sq_tail). */
static void raw_put(struct raw *w, uint32_t i, const struct dg_shm_sqe *e)
{
    const struct dg_shm_header *h = raw_hdr(w);
    memcpy(w->map + h->sq_off + (uint64_t)(i & (h->sq_entries - 1)) * DG_SHM_SQE_SIZE, e,
           sizeof *e);
}

/* The next completion (number i) into *c and its message (up to cap - 1
 * bytes) into msg; 0, or -1 when none came within ms. */
static int raw_reap(struct raw *w, uint32_t i, struct dg_shm_cqe *c, char *msg, size_t cap,
                    int ms)
{
    struct dg_shm_header *h = raw_hdr(w);
    size_t n;
    for (int t = 0; __atomic_load_n(&h->cq_tail, __ATOMIC_ACQUIRE) == i; t++) {
        if (t >= ms)
            return -1;
        usleep(1000);
    }
    memcpy(c, w->map + h->cq_off + (uint64_t)(i & (h->cq_entries - 1)) * DG_SHM_CQE_SIZE,
           sizeof *c);
    n = c->text_len < cap - 1 ? c->text_len : cap - 1;
    memcpy(msg, w->map + h->out_off + c->out_off + 4 * (uint64_t)c->n_ids, n);
    msg[n] = 0;
    __atomic_store_n(&h->cq_head, i + 1, __ATOMIC_RELEASE);
    return 0;
}

static void raw_detach(struct raw *w)
{
    munmap(w->map, w->size);
    close(w->memfd);
    close(w->sq_fd);
    close(w->cq_fd);
    close(w->sock);
}


static void raw_bell(struct raw *w)
{
    uint64_t one = 1;
    if (write(w->sq_fd, &one, sizeof one) != (ssize_t)sizeof one) {
        /* (the counter is full or the daemon left: nothing to do) */
    }
}

/* ---- cases ------------------------------------------------------------------------------ */

/* Thousands of jobs through the ring: the socket's outputs, exactly. */
static int ring_equals_socket(void)
{
    /* (2000 jobs, about 13 s on a machine of 2 CPUs; 150 in the
     * AddressSanitizer build, to keep its run short, still more than twice
     * the rings' 64 entries) */
#if defined(__SANITIZE_ADDRESS__)
    enum { N = 150 };
#else
    enum { N = 2000 };
#endif
    static struct out ref[N];
    dgemma_t *c = open_conn(), *s = open_conn();
    dgemma_ring_t *ring = NULL;
    dgemma_ring_opts_t opts = {64, 64, 0, 0};
    int submitted = 0, reaped = 0, seen_again = 0;
    static unsigned char got[N];

    CHECK(c && s);
    if (socket_run_many(s, N, 64, ref))
        return 1;
    CHECKF(dgemma_ring_attach(c, &opts, &ring) == 0, "%s", dgemma_errmsg(c));
    while (reaped < N) {
        dgemma_completion_t d;
        int rc;
        while (submitted < N) {
            dgemma_request_t *r = job_request(submitted);
            CHECK(r);
            rc = dgemma_ring_submit(ring, r, (uint64_t)submitted);
            dgemma_request_free(r);
            if (rc == DGEMMA_E_AGAIN) {
                seen_again = 1;
                break;
            }
            CHECKF(rc == 0, "submit: %d", rc);
            submitted++;
        }
        rc = dgemma_ring_wait(ring, WAIT_MS);
        if (rc != 0) {
            int missing = 0;
            while (missing < N && got[missing])
                missing++;
            CHECKF(0, "wait: %d after %d of %d (submitted %d; job %d missing)", rc, reaped, N,
                   submitted, missing);
        }
        while ((rc = dgemma_ring_reap(ring, &d)) == 0) {
            const int i = (int)d.user_data;
            CHECK(i >= 0 && i < N && !got[i]);
            got[i] = 1;
            CHECKF(d.code == NULL && d.id > 0, "job %d: %s %s", i, d.code ? d.code : "",
                   d.message ? d.message : "");
            CHECK(d.seed == (uint64_t)(1000 + i));
            CHECK(d.completion_tokens == (long long)d.n_ids && d.n_ids <= (size_t)(1 + i % 4));
            CHECKF(d.text_len == ref[i].text_len && !memcmp(d.text, ref[i].text, d.text_len),
                   "job %d: ring text differs from the socket's", i);
            CHECK(d.n_ids == ref[i].n_ids && !memcmp(d.ids, ref[i].ids, d.n_ids * sizeof *d.ids));
            CHECK(!strcmp(d.finish_reason, ref[i].finish));
            reaped++;
        }
        CHECK(rc == DGEMMA_E_AGAIN);
    }
    CHECK(seen_again); /* the rings were smaller than the work: backpressure was exercised */
    dgemma_ring_detach(ring);
    dgemma_close(c);
    dgemma_close(s);
    return 0;
}

/* A client scribbles over its whole ring; another client does not notice. */
static int hostile_client(void)
{
    enum { M = 40 };
    static struct out ref[M], again;
    dgemma_t *s = open_conn();
    pid_t child;
    int go[2], st;

    CHECK(s);
    for (int i = 0; i < M; i++) {
        dgemma_request_t *r = job_request(i);
        CHECK(r && socket_run(s, r, &ref[i]) == 0);
        dgemma_request_free(r);
    }
    CHECK(pipe(go) == 0);
    child = fork();
    if (child == 0) {
        struct raw w;
        char b = 0;
        close(go[0]);
        if (raw_attach(&w) != 0)
            _exit(2);
        if (write(go[1], "r", 1) != 1)
            _exit(3);
        /* random bytes everywhere, over and over, with the doorbell */
        for (int round = 0; round < 3000; round++) {
            for (int k = 0; k < 64; k++) {
                uint64_t x = rnd();
                size_t at = (size_t)(rnd() % (w.size - 8));
                if (k < 8) /* the indexes and the header more often */
                    at = (size_t)(rnd() % 512);
                memcpy(w.map + at, &x, 8);
            }
            raw_bell(&w);
            if (round % 100 == 0)
                usleep(1000);
        }
        (void)b;
        _exit(0);
    }
    close(go[1]);
    {
        char b;
        CHECK(read(go[0], &b, 1) == 1 && b == 'r');
    }
    close(go[0]);
    /* the normal client, meanwhile */
    for (int i = 0; i < M; i++) {
        dgemma_request_t *r = job_request(i);
        CHECK(r && socket_run(s, r, &again) == 0);
        dgemma_request_free(r);
        CHECKF(again.text_len == ref[i].text_len &&
                   !memcmp(again.text, ref[i].text, again.text_len) &&
                   again.n_ids == ref[i].n_ids &&
                   !memcmp(again.ids, ref[i].ids, again.n_ids * sizeof *again.ids),
               "request %d changed while another client scribbled", i);
    }
    CHECK(waitpid(child, &st, 0) == child);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "hostile child: status %d", st);
    CHECK(kill(daemon_pid, 0) == 0);
    {
        /* gone with its connection */
        int tries = 0;
        while (status_int("rings") != 0 && tries++ < 100)
            usleep(20000);
        CHECK(status_int("rings") == 0);
    }
    dgemma_close(s);
    return 0;
}

/* A client killed with jobs in flight. */
static int killed_client(void)
{
    int fds_before, st, go[2];
    long long cancelled_before = status_int("cancelled");
    pid_t child;

    CHECK(cancelled_before >= 0);
    /* (connections of the status calls close asynchronously: the fewest seen) */
    fds_before = daemon_fds();
    for (int tries = 0; tries < 15; tries++) {
        const int n = daemon_fds();
        fds_before = n < fds_before ? n : fds_before;
        usleep(20000);
    }
    CHECK(fds_before > 0);
    CHECK(pipe(go) == 0);
    child = fork();
    if (child == 0) {
        dgemma_t *c = open_conn();
        dgemma_ring_t *ring = NULL;
        close(go[0]);
        if (!c || dgemma_ring_attach(c, NULL, &ring) != 0)
            _exit(2);
        for (int i = 0; i < 40; i++) {
            dgemma_request_t *r = dgemma_request_text("a long job that will not finish");
            if (!r || dgemma_request_set_int(r, "max_tokens", 4000) != 0 ||
                dgemma_ring_submit(ring, r, (uint64_t)i) != 0)
                _exit(3);
            dgemma_request_free(r);
        }
        if (dgemma_ring_kick(ring) != 0 || write(go[1], "k", 1) != 1)
            _exit(4);
        pause();
        _exit(0);
    }
    close(go[1]);
    {
        char b;
        CHECK(read(go[0], &b, 1) == 1 && b == 'k');
    }
    close(go[0]);
    /* wait until the daemon runs some of them */
    {
        long long running = 0, rings = 0;
        for (int tries = 0; (running = status_int("running")) <= 0 && tries < 200; tries++)
            usleep(10000);
        rings = status_int("rings");
        kill(child, SIGKILL);
        CHECK(waitpid(child, &st, 0) == child);
        CHECKF(running > 0 && rings == 1, "running %lld, rings %lld", running, rings);
    }
    for (int tries = 0; (status_int("rings") != 0 || status_int("running") != 0 ||
                         status_int("queued") != 0) && tries < 300; tries++)
        usleep(20000);
    CHECK(status_int("rings") == 0 && status_int("running") == 0 && status_int("queued") == 0);
    CHECK(status_int("cancelled") > cancelled_before);
    for (int tries = 0; daemon_fds() > fds_before && tries < 100; tries++)
        usleep(20000);
    CHECKF(daemon_fds() <= fds_before, "daemon descriptors: %d before, %d after", fds_before,
           daemon_fds());
    return 0;
}

/* A ring job cancelled through the ring. */
static int ring_cancel(void)
{
    dgemma_t *c = open_conn();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r = dgemma_request_text("a long one");
    dgemma_completion_t d;
    int rc;

    CHECK(c && r && dgemma_ring_attach(c, NULL, &ring) == 0);
    CHECK(dgemma_request_set_int(r, "max_tokens", 4000) == 0);
    CHECK(dgemma_ring_submit(ring, r, 7) == 0 && dgemma_ring_kick(ring) == 0);
    dgemma_request_free(r);
    for (int tries = 0; status_int("running") <= 0 && tries < 200; tries++)
        usleep(10000);
    CHECK(dgemma_ring_cancel(ring, 7) == 0 && dgemma_ring_kick(ring) == 0);
    CHECK(dgemma_ring_wait(ring, WAIT_MS) == 0);
    rc = dgemma_ring_reap(ring, &d);
    CHECKF(rc == 0 && d.user_data == 7 && d.code == NULL, "reap %d: %s", rc,
           d.code ? d.code : "");
    CHECKF(!strcmp(d.finish_reason, "cancelled") && d.completion_tokens < 4000, "%s, %lld tokens",
           d.finish_reason, d.completion_tokens);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    return 0;
}

/* A cancel is taken while the ring's every completion slot is held by a
 * running job (cq_entries 2, two long jobs): the job ends cancelled.  (It
 * used to wait behind the jobs it was meant to stop.) */
static int ring_cancel_when_full(void)
{
    const dgemma_ring_opts_t opts = {.sq_entries = 8, .cq_entries = 2};
    dgemma_t *c = open_conn();
    dgemma_ring_t *ring = NULL;
    dgemma_completion_t d;
    int rc;

    CHECK(c && dgemma_ring_attach(c, &opts, &ring) == 0);
    for (uint64_t u = 1; u <= 2; u++) {
        dgemma_request_t *r = dgemma_request_text("a long one");
        CHECK(r && dgemma_request_set_int(r, "max_tokens", 4000) == 0);
        CHECK(dgemma_ring_submit(ring, r, u) == 0);
        dgemma_request_free(r);
    }
    CHECK(dgemma_ring_kick(ring) == 0);
    for (int tries = 0; status_int("running") < 2 && tries < 500; tries++)
        usleep(10000);
    CHECK(status_int("running") == 2);
    CHECK(dgemma_ring_cancel(ring, 1) == 0 && dgemma_ring_kick(ring) == 0);
    CHECK(dgemma_ring_wait(ring, WAIT_MS) == 0);
    rc = dgemma_ring_reap(ring, &d);
    CHECKF(rc == 0 && d.user_data == 1 && d.code == NULL, "reap %d: user_data %llu", rc,
           (unsigned long long)d.user_data);
    CHECKF(!strcmp(d.finish_reason, "cancelled") && d.completion_tokens < 4000, "%s, %lld tokens",
           d.finish_reason, d.completion_tokens);
    CHECK(dgemma_ring_cancel(ring, 2) == 0 && dgemma_ring_kick(ring) == 0);
    CHECK(dgemma_ring_wait(ring, WAIT_MS) == 0 && dgemma_ring_reap(ring, &d) == 0);
    CHECK(d.user_data == 2 && !strcmp(d.finish_reason, "cancelled"));
    dgemma_ring_detach(ring);
    dgemma_close(c);
    return 0;
}

/* Entries far past the request limits (2M prompt ids, 4M stop strings,
 * in a 16 MiB arena) are refused as they are read, without building them
 * into requests: too_large and bad_request, the daemon's peak memory up
 * by less than 128 MiB (building them took gigabytes), another client
 * served after them. */
static int ring_oversized(void)
{
    struct raw w;
    struct dg_shm_sqe e;
    struct dg_shm_cqe cq;
    char msg[256];
    const uint32_t ids_len = 8u << 20, stop_len = 4u << 20;
    long before, after;
    struct out o;
    dgemma_t *c;
    dgemma_request_t *r;

    CHECK(raw_attach_req(&w, "{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":8,"
                             "\"cq_entries\":8,\"in_bytes\":16777216}\n") == 0);
    CHECK(raw_hdr(&w)->in_size >= (uint64_t)ids_len + 64 + stop_len);
    before = fixture_proc_kib(daemon_pid, "VmHWM");
    memset(w.map + raw_hdr(&w)->in_off, 0, (size_t)ids_len + 64 + stop_len);
    memcpy(w.map + raw_hdr(&w)->in_off + ids_len, "hi", 2);
    memset(&e, 0, sizeof e);
    e.user_data = 1;
    e.op = DG_SHM_OP_IDS;
    e.prompt_off = 0;
    e.prompt_len = ids_len;
    raw_put(&w, 0, &e);
    memset(&e, 0, sizeof e);
    e.user_data = 2;
    e.op = DG_SHM_OP_TEXT;
    e.prompt_off = ids_len;
    e.prompt_len = 2;
    e.set = DG_SHM_SET_STOP;
    e.stop_off = ids_len + 64;
    e.stop_len = stop_len;
    raw_put(&w, 1, &e);
    __atomic_store_n(&raw_hdr(&w)->sq_tail, 2, __ATOMIC_RELEASE);
    raw_bell(&w);
    CHECK(raw_reap(&w, 0, &cq, msg, sizeof msg, WAIT_MS) == 0);
    CHECKF(cq.user_data == 1 && cq.status == DG_SHM_ERR_TOO_LARGE &&
               strstr(msg, "prompt_ids: 2097152 tokens"),
           "user_data %llu status %u: %s", (unsigned long long)cq.user_data, cq.status, msg);
    CHECK(raw_reap(&w, 1, &cq, msg, sizeof msg, WAIT_MS) == 0);
    CHECKF(cq.user_data == 2 && cq.status == DG_SHM_ERR_BAD_REQUEST &&
               strstr(msg, "more than 8 strings"),
           "user_data %llu status %u: %s", (unsigned long long)cq.user_data, cq.status, msg);
    after = fixture_proc_kib(daemon_pid, "VmHWM");
    CHECKF(before > 0 && after - before < 128 * 1024, "VmHWM %ld -> %ld KiB", before, after);
    raw_detach(&w);
    /* and the daemon serves on */
    c = open_conn();
    r = dgemma_request_text("after");
    CHECK(c && r && dgemma_request_set_int(r, "max_tokens", 4) == 0);
    CHECK(socket_run(c, r, &o) == 0);
    dgemma_request_free(r);
    dgemma_close(c);
    return 0;
}

/* A client that makes both of its doorbells blocking (the eventfds' flags
 * are the open file's, which it shares) and fills the completion
 * doorbell's counter: its job still completes, the daemon serves another
 * client meanwhile, and the ring is released when the client leaves.
 * (The daemon's own write of the doorbell used to wait for ever, and with
 * it the whole daemon.) */
static int blocking_doorbells(void)
{
    struct raw w;
    struct dg_shm_sqe e;
    struct dg_shm_cqe cq;
    char msg[256];
    const uint64_t full = 0xfffffffffffffffeull;
    dgemma_t *c;
    dgemma_event_t ev;

    CHECK(raw_attach(&w) == 0);
    CHECK(fcntl(w.cq_fd, F_SETFL, fcntl(w.cq_fd, F_GETFL) & ~O_NONBLOCK) == 0);
    CHECK(fcntl(w.sq_fd, F_SETFL, fcntl(w.sq_fd, F_GETFL) & ~O_NONBLOCK) == 0);
    CHECK(write(w.cq_fd, &full, sizeof full) == (ssize_t)sizeof full);
    memcpy(w.map + raw_hdr(&w)->in_off, "hi", 2);
    memset(&e, 0, sizeof e);
    e.user_data = 5;
    e.op = DG_SHM_OP_TEXT;
    e.prompt_len = 2;
    e.set = DG_SHM_SET_MAX_TOKENS;
    e.max_tokens = 4;
    raw_put(&w, 0, &e);
    __atomic_store_n(&raw_hdr(&w)->sq_tail, 1, __ATOMIC_RELEASE);
    raw_bell(&w);
    CHECK(raw_reap(&w, 0, &cq, msg, sizeof msg, WAIT_MS) == 0);
    CHECKF(cq.user_data == 5 && cq.status == DG_SHM_OK, "status %u: %s", cq.status, msg);
    /* (the daemon's write of the doorbell now waits on the full counter) */
    c = open_conn();
    CHECK(c && dgemma_status(c) == 0);
    CHECKF(dgemma_next_event(c, &ev, 10000) == 0, "status: %s", dgemma_errmsg(c));
    dgemma_close(c);
    raw_detach(&w);
    for (int tries = 0; status_int("rings") != 0 && tries < 200; tries++)
        usleep(10000);
    CHECK(status_int("rings") == 0);
    return 0;
}

/* The daemon killed under a ring with a job in it: kick and cancel say
 * DGEMMA_E_CLOSED (they said 0 until a reap or a wait looked), and the
 * reap too.  Last: the daemon is gone after it. */
/* An shm_attach line req on a new connection answered by an error line
 * with code `code` whose message holds needle: 0, or -1 (said why). */
static int attach_refused(const char *req, const char *code, const char *needle)
{
    char buf[1024];
    const int fd = fixture_connect(sock_path);
    ssize_t n = -1;
    json_t *ev = NULL;
    const char *got_code, *got_msg;
    int rc = -1;
    if (fd >= 0 && send(fd, req, strlen(req), MSG_NOSIGNAL) == (ssize_t)strlen(req))
        n = recv(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
        buf[n] = 0;
        ev = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    }
    got_code = json_string_value(json_object_get(ev, "code"));
    got_msg = json_string_value(json_object_get(ev, "message"));
    if (got_code && got_msg && !strcmp(got_code, code) && strstr(got_msg, needle))
        rc = 0;
    else
        printf("# attach_refused: wanted %s '%s', got: %s\n", code, needle,
               n > 0 ? buf : "(nothing)");
    json_decref(ev);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* shm_user_max_mb: the rings of one uid's connections together stay
 * under it (the next attach is busy until one goes), and a ring larger
 * than it alone is too_large. */
static int user_ring_cap(void)
{
    static const char five[] = "{\"v\":1,\"op\":\"shm_attach\",\"sq_entries\":8,"
                               "\"cq_entries\":8,\"in_bytes\":1048576,\"out_bytes\":4194304}\n";
    static const char big[] = "{\"v\":1,\"op\":\"shm_attach\",\"in_bytes\":8388608,"
                              "\"out_bytes\":8388608}\n";
    const char *const opts[] = {"pin_workers=false", "tick=0.05", "shm_user_max_mb=12", NULL};
    struct raw a, b, c;
    int rc = -1;

    CHECK(stop_daemon() == 0); /* (refusals left one with rings off) */
    CHECK(start_daemon(opts) == 0);
    CHECK(raw_attach_req(&a, five) == 0 && raw_attach_req(&b, five) == 0);
    CHECK(a.size > (5u << 20) && a.size + b.size <= (12u << 20));
    CHECK(attach_refused(five, "busy", "2 ring(s) hold") == 0);
    CHECK(attach_refused(big, "too_large", "more than one user may hold") == 0);
    /* a ring let go makes room (once the daemon has seen the close) */
    raw_detach(&a);
    for (int tries = 0; tries < 200 && (rc = raw_attach_req(&c, five)) != 0; tries++) {
        if (c.sock > 0)
            close(c.sock);
        usleep(10000);
    }
    CHECK(rc == 0);
    raw_detach(&b);
    raw_detach(&c);
    /* and without a cap, the large ring is lent */
    CHECK(stop_daemon() == 0);
    {
        const char *const none[] = {"pin_workers=false", "shm_user_max_mb=0", NULL};
        CHECK(start_daemon(none) == 0);
    }
    CHECK(raw_attach_req(&a, big) == 0 && a.size > (16u << 20));
    raw_detach(&a);
    return 0;
}

static int daemon_killed(void)
{
    dgemma_t *c;
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r = dgemma_request_text("a long one");
    dgemma_completion_t d;
    int rc;

    CHECK(stop_daemon() == 0); /* (refusals left one with rings off) */
    CHECK(start_daemon(DAEMON_OPTS) == 0);
    c = open_conn();

    CHECK(c && r && dgemma_ring_attach(c, NULL, &ring) == 0);
    CHECK(dgemma_request_set_int(r, "max_tokens", 4000) == 0);
    CHECK(dgemma_ring_submit(ring, r, 9) == 0 && dgemma_ring_kick(ring) == 0);
    dgemma_request_free(r);
    CHECK(kill(daemon_pid, SIGKILL) == 0 && fixture_wait_exit(daemon_pid, NULL) == 0);
    daemon_pid = 0;
    /* (the kernel closes the killed daemon's end once its io_uring lets
     * go of the socket, a moment after the exit: looked at for up to 2 s) */
    for (int tries = 0; (rc = dgemma_ring_kick(ring)) == 0 && tries < 200; tries++)
        usleep(10000);
    CHECKF(rc == DGEMMA_E_CLOSED, "kick %d: %s", rc, dgemma_errmsg(c));
    rc = dgemma_ring_cancel(ring, 9);
    CHECKF(rc == DGEMMA_E_CLOSED, "cancel %d: %s", rc, dgemma_errmsg(c));
    rc = dgemma_ring_reap(ring, &d);
    CHECKF(rc == DGEMMA_E_CLOSED, "reap %d: %s", rc, dgemma_errmsg(c));
    dgemma_ring_detach(ring);
    dgemma_close(c);
    return 0;
}

/* Jobs whose prompts go to the tokenizing thread, with a short one behind
 * them in the same ring: a 3 MB prompt (512 KB under AddressSanitizer,
 * where it takes as long; while it is tokenized, another connection's
 * status says so; then too_large), a 4.2 KB one (the same output as the
 * same request over the socket), and the short one. */
static int ring_long_prompt(void)
{
    enum { BIG = UNDER_ASAN ? 512 << 10 : 3 << 20 };
    dgemma_t *c = open_conn(), *s = open_conn();
    dgemma_ring_t *ring = NULL;
    dgemma_ring_opts_t opts = {16, 16, (size_t)4 << 20, 0};
    dgemma_request_t *big, *mid, *small = job_request(3);
    struct out ref;
    char *text = malloc(BIG + 1);
    int done = 0, seen = 0;

    CHECK(c && s && small && text);
    for (int i = 0; i < BIG; i++)
        text[i] = "abcdefgh "[(i * 7 + i / 9) % 9];
    text[BIG] = '\0';
    big = dgemma_request_text(text);
    text[4200] = '\0';
    mid = dgemma_request_text(text);
    free(text);
    CHECK(big && mid && dgemma_request_set_int(mid, "seed", 5) == 0 &&
          dgemma_request_set_int(mid, "max_tokens", 3) == 0 &&
          dgemma_request_set_int(mid, "max_denoising_steps", 4) == 0);
    CHECK(socket_run(s, mid, &ref) == 0);
    CHECKF(dgemma_ring_attach(c, &opts, &ring) == 0, "%s", dgemma_errmsg(c));
    CHECK(dgemma_ring_submit(ring, big, 1) == 0 && dgemma_ring_submit(ring, mid, 2) == 0 &&
          dgemma_ring_submit(ring, small, 4) == 0 && dgemma_ring_kick(ring) == 0);
    dgemma_request_free(big);
    dgemma_request_free(mid);
    dgemma_request_free(small);
    for (int tries = 0; !seen && tries < 60000; tries++)
        if (!(seen = status_int("tokenizing") == 1))
            usleep(1000);
    CHECKF(seen, "no status showed the ring's prompt being tokenized");
    while (done != 7) {
        dgemma_completion_t d;
        int rc;
        CHECK(dgemma_ring_wait(ring, WAIT_MS) == 0);
        while ((rc = dgemma_ring_reap(ring, &d)) == 0) {
            const int u = (int)d.user_data;
            CHECK(u == 1 || u == 2 || u == 4);
            CHECKF(u == 1 ? d.code && !strcmp(d.code, "too_large") : d.code == NULL,
                   "job %d: %s %s", u, d.code ? d.code : "(none)", d.message ? d.message : "");
            if (u == 2)
                CHECKF(d.text_len == ref.text_len && !memcmp(d.text, ref.text, d.text_len) &&
                       d.n_ids == ref.n_ids && !strcmp(d.finish_reason, ref.finish),
                       "the 4.2 KB job's output differs from the socket's");
            done |= u;
        }
        CHECK(rc == DGEMMA_E_AGAIN);
    }
    CHECK(status_int("tokenizing") == 0);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    dgemma_close(s);
    return 0;
}

static const char plain_prompt[] = "say <|turn>model then <turn|> and <mask>";
static long long plain_tokens, parsed_tokens; /* its prompt's tokens each way */

/* parse_special false on the ring: the prompt's typed markers are plain
 * text (more prompt tokens than the default) and the output is the socket's. */
static int ring_plain_text(void)
{
    const char *prompt = plain_prompt;
    dgemma_t *c = open_conn(), *s = open_conn();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r;
    dgemma_completion_t d;
    struct out parsed, plain;

    CHECK(c && s);
    for (int special = 1; special >= 0; special--) {
        CHECK((r = dgemma_request_text(prompt)) != NULL);
        CHECK(dgemma_request_set_int(r, "seed", 7) == 0 &&
              dgemma_request_set_int(r, "max_tokens", 4) == 0 &&
              dgemma_request_set_int(r, "max_denoising_steps", 4) == 0 &&
              (special || dgemma_request_set_parse_special(r, 0) == 0));
        CHECK(socket_run(s, r, special ? &parsed : &plain) == 0);
        if (!special) {
            CHECKF(dgemma_ring_attach(c, NULL, &ring) == 0, "%s", dgemma_errmsg(c));
            CHECK(dgemma_ring_submit(ring, r, 1) == 0 && dgemma_ring_wait(ring, WAIT_MS) == 0);
            CHECK(dgemma_ring_reap(ring, &d) == 0 && d.code == NULL);
            CHECKF(d.prompt_tokens == plain.prompt_tokens && d.text_len == plain.text_len &&
                       !memcmp(d.text, plain.text, d.text_len),
                   "ring: %lld prompt tokens, the socket %lld", d.prompt_tokens,
                   plain.prompt_tokens);
            dgemma_ring_detach(ring);
        }
        dgemma_request_free(r);
    }
    CHECKF(plain.prompt_tokens > parsed.prompt_tokens, "plain text %lld tokens, parsed %lld",
           plain.prompt_tokens, parsed.prompt_tokens);
    plain_tokens = plain.prompt_tokens;
    parsed_tokens = parsed.prompt_tokens;
    dgemma_close(c);
    dgemma_close(s);
    return 0;
}

/* A daemon configured with parse_special: false takes a request without
 * the key, over the socket or the ring, as plain text; one that asks still
 * gets the markers parsed. */
static int plain_text_default(void)
{
    const char *const opts[] = {"pin_workers=false", "tick=0.05", "parse_special=false", NULL};
    dgemma_t *c;
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r;
    dgemma_completion_t d;
    struct out o;

    CHECK(plain_tokens > parsed_tokens && parsed_tokens > 0); /* (ring_plain_text ran) */
    CHECK(stop_daemon() == 0);
    CHECK(start_daemon(opts) == 0);
    CHECK((c = open_conn()) != NULL);
    for (int ask = 0; ask < 3; ask++) { /* no key, parse_special true, false */
        CHECK((r = dgemma_request_text(plain_prompt)) != NULL);
        CHECK(dgemma_request_set_int(r, "max_tokens", 2) == 0 &&
              dgemma_request_set_int(r, "max_denoising_steps", 4) == 0);
        CHECK(ask == 0 || dgemma_request_set_parse_special(r, ask == 1) == 0);
        CHECK(socket_run(c, r, &o) == 0);
        CHECKF(o.prompt_tokens == (ask == 1 ? parsed_tokens : plain_tokens),
               "ask %d: %lld prompt tokens", ask, o.prompt_tokens);
        if (ask == 1) {
            CHECKF(dgemma_ring_attach(c, NULL, &ring) == 0, "%s", dgemma_errmsg(c));
            CHECK(dgemma_ring_submit(ring, r, 1) == 0 && dgemma_ring_wait(ring, WAIT_MS) == 0);
            CHECK(dgemma_ring_reap(ring, &d) == 0 && d.code == NULL);
            CHECK(d.prompt_tokens == parsed_tokens);
            dgemma_ring_detach(ring);
        }
        dgemma_request_free(r);
    }
    dgemma_close(c);
    return 0;
}

static int refusals(void)
{
    dgemma_t *c = open_conn();
    dgemma_ring_t *a = NULL, *b = NULL;
    CHECK(c);
    CHECK(dgemma_ring_attach(c, NULL, &a) == 0);
    CHECK(dgemma_ring_attach(c, NULL, &b) == DGEMMA_E_DAEMON && b == NULL);
    CHECKF(strstr(dgemma_errmsg(c), "has a ring"), "%s", dgemma_errmsg(c));
    dgemma_ring_detach(a);
    dgemma_close(c);
    /* the daemon out of descriptors (its soft limit lowered to the lowest
     * it has free): the attach fails with the reason; the connection and
     * the daemon go on, and with the limit back the same connection
     * attaches */
    c = open_conn();
    CHECK(c && status_int("running") >= 0); /* (c taken: a status after it answered) */
    {
        struct rlimit was, low;
        int first = -1, rc;
        /* the status connection closed on the daemon's side too: the same
         * lowest free descriptor three times 50 ms apart */
        for (int same = 0, tries = 0; same < 3 && tries < 200; tries++) {
            const int now = fixture_fd_first_free(daemon_pid);
            same = now == first ? same + 1 : 0;
            first = now;
            usleep(50000);
        }
        CHECK(first > 0);
        CHECK(prlimit(daemon_pid, RLIMIT_NOFILE, NULL, &was) == 0);
        low = was;
        low.rlim_cur = (rlim_t)first;
        CHECK(prlimit(daemon_pid, RLIMIT_NOFILE, &low, NULL) == 0);
        rc = dgemma_ring_attach(c, NULL, &b);
        CHECK(prlimit(daemon_pid, RLIMIT_NOFILE, &was, NULL) == 0);
        CHECKF(rc == DGEMMA_E_DAEMON && b == NULL &&
                   strstr(dgemma_errmsg(c), "Too many open files"),
               "rc %d: %s", rc, dgemma_errmsg(c));
        CHECKF(dgemma_ring_attach(c, NULL, &a) == 0, "%s", dgemma_errmsg(c));
        dgemma_ring_detach(a);
    }
    dgemma_close(c);
    /* rings off */
    CHECK(stop_daemon() == 0);
    {
        const char *const off[] = {"pin_workers=false", "shm_max_entries=0", NULL};
        CHECK(start_daemon(off) == 0);
    }
    c = open_conn();
    CHECK(c && dgemma_ring_attach(c, NULL, &a) == DGEMMA_E_DAEMON && a == NULL);
    CHECKF(strstr(dgemma_errmsg(c), "rings are off"), "%s", dgemma_errmsg(c));
    dgemma_close(c);
    CHECK(stop_daemon() == 0);
    return 0;
}

int main(void)
{
    snprintf(sock_path, sizeof sock_path, "%s", test_path("d.sock"));
    snprintf(log_path, sizeof log_path, "%s", test_path("d.log"));
    signal(SIGPIPE, SIG_IGN);
    if (start_daemon(DAEMON_OPTS) != 0) {
        printf("not ok t-shm/start: no daemon; log %s\n", log_path);
        return 1;
    }
    TEST_CASE(ring_equals_socket);
    TEST_CASE(hostile_client);
    TEST_CASE(killed_client);
    TEST_CASE(ring_cancel);
    TEST_CASE(ring_cancel_when_full);
    TEST_CASE(ring_oversized);
    TEST_CASE(blocking_doorbells);
    TEST_CASE(ring_long_prompt);
    TEST_CASE(ring_plain_text);
    TEST_CASE(refusals);
    TEST_CASE(user_ring_cap);
    TEST_CASE(plain_text_default);
    TEST_CASE(daemon_killed);
    return fixture_finish(daemon_pid, NULL);
}
