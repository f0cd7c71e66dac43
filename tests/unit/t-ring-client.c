/*
 * t-ring-client - the client side of the shared-memory job ring
 * (dgemma_ring_* in client/libdgemma-ring*.c, the layout of lib/shm-layout.h)
 * against a fake daemon in a thread of this program: it listens on a UNIX
 * socket, answers shm_attach with a sealed memfd and two eventfds passed by
 * SCM_RIGHTS, then plays the daemon's side of the ring (consumes entries,
 * checks and records them, posts completions: the text prompt reversed, the
 * ids plus one).  Cases: 2000 jobs through rings much smaller than that
 * (the full submission ring, the full prompt arena, its wrap-around,
 * DG_SHM_NEED_WAKE, dgemma_ring_wait and a poll(2) loop on dgemma_ring_fd);
 * every setting encoded into the entry, and the completions of jobs
 * refused or failed after they started; chat requests and values of the
 * wrong type refused before they reach the ring; a refused attach; rings
 * the library must not use (bad magic, a region outside the memfd, sizes
 * that disagree, ...) refused without leaking a descriptor; events of other
 * requests arriving before the answer kept for dgemma_next_event (and the
 * last event's pointers kept valid across the attach); DG_SHM_FAULT and a
 * hang-up give DGEMMA_E_CLOSED after the completions already posted
 * (through dgemma_ring_wait, or dgemma_ring_reap in a poll loop); a
 * completion pointing outside the arena is DGEMMA_E_PROTOCOL and the ring
 * goes on.
 *
 * The unit tests do not link libdgemma, so this file includes its sources
 * (client/libdgemma*.c, every one: they hold one library between them) and
 * can look at its internals (client/libdgemma-internal.h) where the public
 * API cannot show a path was taken.
 */
#include "client/libdgemma.c"
#include "client/libdgemma-events.c"
#include "client/libdgemma-ring.c"
#include "client/libdgemma-ring-submit.c"
#include "client/libdgemma-ring-reap.c"

#include <dirent.h>
#include <pthread.h>
#include <sys/eventfd.h>

#include "tests/harness.h"

#define WAIT_MS 10000
#define NREC 16

enum fake_mode {
    FM_SERVE,      /* a good ring, served */
    FM_REFUSE,     /* an error event, no descriptors */
    FM_BAD_MAGIC,
    FM_BAD_REGION, /* the completion arena runs past the end of the memfd */
    FM_BAD_SIZE,   /* the event's size is not the memfd's */
    FM_BAD_POW2,   /* 6 submission entries */
    FM_BAD_GEOM,   /* the header's cq_entries is not the event's */
    FM_NOT_EMPTY,  /* sq_tail 1, sq_head 0 */
    FM_NO_SEAL,
    FM_TWO_FDS,
    FM_NO_FDS,
};

struct rec {
    struct dg_shm_sqe e;
    unsigned char prompt[256], stop[256];
};

struct fake {
    /* set by the case */
    enum fake_mode mode;
    uint32_t sq_entries, cq_entries;
    uint64_t in_size, out_size;
    int big_first_status;  /* answer the first status with a ~100 KiB event */
    const char *pre;       /* lines sent just before the shm_attached answer */
    int fault_after;       /* set DG_SHM_FAULT after this many completions */
    int fault_quietly;     /* ... without ringing the completion doorbell */
    int hangup_after;      /* close the connection after this many completions */
    int bad_cqe_at;        /* the n-th completion points outside the arena */
    /* the fake's own */
    char path[512];
    int lfd, conn, sq_efd, cq_efd;
    pthread_t th;
    char rbuf[4096];
    size_t rlen;
    unsigned char *base;
    size_t size;
    struct dg_shm_header *h;
    uint32_t sq_head, cq_tail;
    uint64_t last_off;
    /* what it saw */
    char attach_line[512];
    int n_jobs, n_cancels, need_wake_set, arena_wraps, n_status;
    struct rec recs[NREC];
    int n_recs;
    char fail[256];
};

static void fake_fail(struct fake *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fake_fail(struct fake *f, const char *fmt, ...)
{
    va_list ap;
    if (f->fail[0])
        return;
    va_start(ap, fmt);
    vsnprintf(f->fail, sizeof f->fail, fmt, ap);
    va_end(ap);
}

static void send_str(struct fake *f, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = send(f->conn, s, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            fake_fail(f, "send: %s", strerror(errno));
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

/* The next request line from the client (without its newline) into out;
 * 0 when the client closed the connection. */
static int fake_line(struct fake *f, char *out, size_t cap)
{
    for (;;) {
        char *nl = memchr(f->rbuf, '\n', f->rlen);
        ssize_t got;
        if (nl) {
            size_t n = (size_t)(nl - f->rbuf);
            snprintf(out, cap, "%.*s", (int)n, f->rbuf);
            memmove(f->rbuf, nl + 1, f->rlen - n - 1);
            f->rlen -= n + 1;
            return 1;
        }
        if (f->rlen == sizeof f->rbuf) {
            fake_fail(f, "a request line over %zu bytes", sizeof f->rbuf);
            return 0;
        }
        got = read(f->conn, f->rbuf + f->rlen, sizeof f->rbuf - f->rlen);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        f->rlen += (size_t)got;
    }
}

/* Send line with the descriptors fds[0, n) in one sendmsg. */
static void send_fds(struct fake *f, const char *line, const int *fds, int n)
{
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(int) * 3)];
    } ctl;
    struct iovec iov = {(void *)line, strlen(line)};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (n > 0) {
        struct cmsghdr *h;
        memset(&ctl, 0, sizeof ctl);
        m.msg_control = ctl.b;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(h), fds, sizeof(int) * (size_t)n);
    }
    if (sendmsg(f->conn, &m, MSG_NOSIGNAL) != (ssize_t)strlen(line))
        fake_fail(f, "sendmsg: %s", strerror(errno));
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Answer shm_attach as the mode says.  Returns 1 when a ring is up. */
static int fake_attach(struct fake *f)
{
    uint32_t sq = f->mode == FM_BAD_POW2 ? 6 : f->sq_entries;
    uint64_t sq_off = DG_SHM_HEADER_SIZE, cq_off = sq_off + (uint64_t)sq * DG_SHM_SQE_SIZE;
    uint64_t in_off = cq_off + (uint64_t)f->cq_entries * DG_SHM_CQE_SIZE;
    uint64_t out_off = align_up(in_off + f->in_size, 8);
    uint64_t size = align_up(out_off + f->out_size, 4096), ev_size = size;
    uint64_t out_size = f->out_size;
    char line[512];
    int memfd, fds[3];

    if (f->mode == FM_REFUSE) {
        send_str(f, "{\"v\":1,\"event\":\"error\",\"id\":null,\"code\":\"busy\","
                    "\"message\":\"this connection has a ring already\"}\n");
        return 0;
    }
    memfd = memfd_create("fake-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0 || ftruncate(memfd, (off_t)size) != 0 ||
        (f->mode != FM_NO_SEAL &&
         fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)) {
        fake_fail(f, "memfd: %s", strerror(errno));
        if (memfd >= 0)
            close(memfd);
        return 0;
    }
    f->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (f->base == MAP_FAILED) {
        fake_fail(f, "mmap: %s", strerror(errno));
        f->base = NULL;
        close(memfd);
        return 0;
    }
    f->size = size;
    f->h = (struct dg_shm_header *)(void *)f->base;
    if (f->mode == FM_BAD_REGION)
        out_size += 8192;
    if (f->mode == FM_BAD_SIZE)
        ev_size += 4096;
    f->h->magic = f->mode == FM_BAD_MAGIC ? 0x12345678u : DG_SHM_MAGIC;
    f->h->version = DG_SHM_VERSION;
    f->h->sq_entries = sq;
    f->h->cq_entries = f->mode == FM_BAD_GEOM ? f->cq_entries * 2 : f->cq_entries;
    f->h->sq_off = sq_off;
    f->h->cq_off = cq_off;
    f->h->in_off = in_off;
    f->h->in_size = f->in_size;
    f->h->out_off = out_off;
    f->h->out_size = out_size;
    f->h->total_size = ev_size;
    if (f->mode == FM_NOT_EMPTY)
        f->h->sq_tail = 1;
    f->sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    f->cq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (f->sq_efd < 0 || f->cq_efd < 0) {
        fake_fail(f, "eventfd: %s", strerror(errno));
        close(memfd);
        return 0;
    }
    if (f->pre)
        send_str(f, f->pre);
    snprintf(line, sizeof line,
             "{\"v\":1,\"event\":\"shm_attached\",\"version\":1,\"size\":%" PRIu64
             ",\"sq_entries\":%" PRIu32 ",\"cq_entries\":%" PRIu32 ",\"in_bytes\":%" PRIu64
             ",\"out_bytes\":%" PRIu64 "}\n",
             ev_size, sq, f->cq_entries, f->in_size, out_size);
    fds[0] = memfd;
    fds[1] = f->sq_efd;
    fds[2] = f->cq_efd;
    send_fds(f, line, fds, f->mode == FM_NO_FDS ? 0 : f->mode == FM_TWO_FDS ? 2 : 3);
    close(memfd);
    return f->mode == FM_SERVE;
}

static void ring_cq_doorbell(struct fake *f)
{
    const uint64_t one = 1;
    if (write(f->cq_efd, &one, sizeof one) != (ssize_t)sizeof one)
        fake_fail(f, "completion doorbell: %s", strerror(errno));
}

/* Check, record and complete one entry. */
static void fake_job(struct fake *f, const struct dg_shm_sqe *e)
{
    const uint32_t cqm = f->cq_entries - 1;
    const uint64_t slot = f->out_size / f->cq_entries;
    unsigned char *in = f->base + f->h->in_off, *o;
    struct dg_shm_cqe q;
    const unsigned char *p = in + e->prompt_off;
    uint32_t n_ids = 0, text_len = 0;

    if (e->op < DG_SHM_OP_TEXT || e->op > DG_SHM_OP_CANCEL || (e->flags & ~DG_SHM_F_ALL) ||
        (e->set & ~(uint32_t)DG_SHM_SET_ALL) || e->n_stop_ids > DG_SHM_MAX_STOP_IDS ||
        e->prompt_off > f->in_size || e->prompt_len > f->in_size - e->prompt_off ||
        ((e->set & DG_SHM_SET_STOP) &&
         (e->stop_off > f->in_size || e->stop_len > f->in_size - e->stop_off || e->stop_len == 0 ||
          in[e->stop_off + e->stop_len - 1] != 0)) ||
        (e->op == DG_SHM_OP_IDS && e->prompt_len % 4)) {
        fake_fail(f, "a bad entry: op %u flags %u set %x prompt %" PRIu64 "+%u stop %" PRIu64
                  "+%u", e->op, e->flags, e->set, e->prompt_off, e->prompt_len, e->stop_off,
                  e->stop_len);
        return;
    }
    if (e->prompt_len > 0) {
        if (e->prompt_off < f->last_off)
            f->arena_wraps++;
        f->last_off = e->prompt_off;
    }
    if (f->n_recs < NREC) {
        struct rec *r = &f->recs[f->n_recs++];
        r->e = *e;
        memcpy(r->prompt, p, e->prompt_len < sizeof r->prompt ? e->prompt_len : sizeof r->prompt);
        if (e->set & DG_SHM_SET_STOP)
            memcpy(r->stop, in + e->stop_off,
                   e->stop_len < sizeof r->stop ? e->stop_len : sizeof r->stop);
    }
    if (e->op == DG_SHM_OP_CANCEL) {
        f->n_cancels++;
        return;
    }
    f->n_jobs++;
    memset(&q, 0, sizeof q);
    q.user_data = e->user_data;
    q.out_off = (f->cq_tail & cqm) * slot;
    o = f->base + f->h->out_off + q.out_off;
    if (e->op == DG_SHM_OP_TEXT && e->prompt_len == 9 && !memcmp(p, "refuse me", 9)) {
        static const char msg[] = "the queue is full";
        q.status = DG_SHM_ERR_BUSY;
        text_len = sizeof msg - 1;
        memcpy(o, msg, text_len);
    } else if (e->op == DG_SHM_OP_TEXT && e->prompt_len == 7 && !memcmp(p, "fail me", 7)) {
        static const char msg[] = "the engine failed";
        q.status = DG_SHM_ERR_INTERNAL; /* after it started: it has an id */
        text_len = sizeof msg - 1;
        memcpy(o, msg, text_len);
    } else if (e->op == DG_SHM_OP_TEXT) {
        const int32_t n = (int32_t)e->prompt_len;
        n_ids = 1;
        text_len = e->prompt_len;
        if (4 + text_len > slot) {
            fake_fail(f, "output of %u bytes for a %" PRIu64 "-byte slot", text_len, slot);
            return;
        }
        memcpy(o, &n, 4);
        for (uint32_t i = 0; i < text_len; i++)
            o[4 + i] = p[text_len - 1 - i];
    } else {
        n_ids = e->prompt_len / 4;
        text_len = 3;
        if (4 * n_ids + 3 > slot) {
            fake_fail(f, "output of %u ids for a %" PRIu64 "-byte slot", n_ids, slot);
            return;
        }
        for (uint32_t i = 0; i < n_ids; i++) {
            int32_t x;
            memcpy(&x, p + 4 * i, 4);
            x++;
            memcpy(o + 4 * i, &x, 4);
        }
        memcpy(o + 4 * n_ids, "ids", 3);
    }
    q.request_id = q.status == DG_SHM_ERR_BUSY ? 0 : 1000 + (uint64_t)f->n_jobs;
    q.finish = (e->set & DG_SHM_SET_MAX_TOKENS) ? DG_SHM_FINISH_LENGTH : DG_SHM_FINISH_STOP;
    q.n_ids = n_ids;
    q.text_len = text_len;
    q.prompt_tokens = e->op == DG_SHM_OP_IDS ? e->prompt_len / 4 : e->prompt_len + 1;
    q.completion_tokens = n_ids;
    q.canvases = 2;
    q.stop_id = (e->set & DG_SHM_SET_STOP_IDS) && e->n_stop_ids ? e->stop_ids[0] : -1;
    q.decoder_steps = 3;
    q.seed = (e->set & DG_SHM_SET_SEED) ? e->seed : 42;
    q.tokens_per_s = 1.5;
    q.ms_total = 2.5;
    q.ms_first_canvas = 0.5;
    if (f->n_jobs == f->bad_cqe_at) {
        q.out_off = f->out_size - 2;
        q.n_ids = 1;
    }
    memcpy(f->base + f->h->cq_off + (size_t)(f->cq_tail & cqm) * DG_SHM_CQE_SIZE, &q, sizeof q);
    f->cq_tail++;
    __atomic_store_n(&f->h->cq_tail, f->cq_tail, __ATOMIC_RELEASE);
    ring_cq_doorbell(f);
}

/* Take what the submission ring has while the completion ring has room.
 * Returns 1 once the fake stopped serving (DG_SHM_FAULT set, or the
 * connection closed). */
static int fake_process(struct fake *f)
{
    const uint32_t sqm = f->sq_entries - 1;
    for (;;) {
        const uint32_t tail = __atomic_load_n(&f->h->sq_tail, __ATOMIC_ACQUIRE);
        struct dg_shm_sqe e;
        if ((uint32_t)(tail - f->sq_head) > f->sq_entries) {
            fake_fail(f, "sq_tail %u is more than a ring past sq_head %u", tail, f->sq_head);
            return 1;
        }
        if (tail == f->sq_head)
            break;
        if (f->cq_tail - __atomic_load_n(&f->h->cq_head, __ATOMIC_ACQUIRE) >= f->cq_entries) {
            __atomic_fetch_or(&f->h->flags, DG_SHM_NEED_WAKE, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if (f->cq_tail - __atomic_load_n(&f->h->cq_head, __ATOMIC_ACQUIRE) >=
                f->cq_entries) {
                f->need_wake_set++;
                return 0; /* the client rings when it has reaped */
            }
            continue;
        }
        memcpy(&e, f->base + f->h->sq_off + (size_t)(f->sq_head & sqm) * DG_SHM_SQE_SIZE,
               sizeof e);
        fake_job(f, &e); /* (reads the arena before sq_head moves) */
        f->sq_head++;
        __atomic_store_n(&f->h->sq_head, f->sq_head, __ATOMIC_RELEASE);
        if (f->fault_after && f->n_jobs == f->fault_after) {
            __atomic_fetch_or(&f->h->flags, DG_SHM_FAULT, __ATOMIC_SEQ_CST);
            if (!f->fault_quietly)
                ring_cq_doorbell(f);
            return 1;
        }
        if (f->hangup_after && f->n_jobs == f->hangup_after) {
            close(f->conn);
            f->conn = -1;
            return 1;
        }
    }
    __atomic_fetch_and(&f->h->flags, ~DG_SHM_NEED_WAKE, __ATOMIC_SEQ_CST);
    return 0;
}

/* Serve the ring until the client closes the connection. */
static void fake_serve(struct fake *f)
{
    int stopped = 0;
    for (;;) {
        struct pollfd p[2] = {{f->sq_efd, POLLIN, 0}, {f->conn, POLLIN, 0}};
        int rc;
        if (f->conn < 0)
            return;
        rc = poll(p, 2, 3 * WAIT_MS);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            fake_fail(f, "serve: %s", rc < 0 ? strerror(errno) : "no news in 30 s");
            return;
        }
        if (p[1].revents) {
            char b[256];
            ssize_t n = read(f->conn, b, sizeof b);
            if (n <= 0)
                return; /* the client left */
        }
        if (p[0].revents & POLLIN) {
            uint64_t v;
            if (read(f->sq_efd, &v, sizeof v) != (ssize_t)sizeof v && errno != EAGAIN)
                fake_fail(f, "submission doorbell: %s", strerror(errno));
        }
        if (!stopped)
            stopped = fake_process(f);
    }
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    char line[4096];
    int up = 0;

    f->conn = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
    close(f->lfd);
    f->lfd = -1;
    if (f->conn < 0) {
        fake_fail(f, "accept: %s", strerror(errno));
        return NULL;
    }
    while (fake_line(f, line, sizeof line)) {
        if (strstr(line, "\"op\":\"shm_attach\"")) {
            snprintf(f->attach_line, sizeof f->attach_line, "%s", line);
            up = fake_attach(f);
            break;
        }
        if (strstr(line, "\"op\":\"status\"")) {
            if (f->n_status++ == 0 && f->big_first_status) {
                static char big[100 * 1024];
                memset(big, 'x', sizeof big);
                memcpy(big, "{\"v\":1,\"event\":\"status\",\"pad\":\"", 31);
                memcpy(big + sizeof big - 4, "\"}\n", 4);
                send_str(f, big);
            } else {
                send_str(f, "{\"v\":1,\"event\":\"status\",\"queued\":2}\n");
            }
        } else if (strstr(line, "\"op\":\"generate\"")) {
            send_str(f, "{\"v\":1,\"event\":\"error\",\"id\":null,\"tag\":\"g\","
                        "\"code\":\"bad_request\",\"message\":\"prompt: expected a string\"}\n");
        }
    }
    if (up) {
        fake_serve(f);
    } else {
        while (f->conn >= 0 && read(f->conn, line, sizeof line) > 0) /* until the client leaves */
            ;
    }
    if (f->base)
        munmap(f->base, f->size);
    if (f->sq_efd >= 0)
        close(f->sq_efd);
    if (f->cq_efd >= 0)
        close(f->cq_efd);
    if (f->conn >= 0)
        close(f->conn);
    return NULL;
}

/* Listen at a fresh path and start the fake's thread.  0 or -1. */
static int fake_start(struct fake *f, const char *name)
{
    struct sockaddr_un a;
    f->lfd = f->conn = f->sq_efd = f->cq_efd = -1;
    if (!f->sq_entries)
        f->sq_entries = 16;
    if (!f->cq_entries)
        f->cq_entries = 16;
    if (!f->in_size)
        f->in_size = 4096;
    if (!f->out_size)
        f->out_size = (uint64_t)f->cq_entries * 256;
    snprintf(f->path, sizeof f->path, "%s", test_path(name));
    unlink(f->path);
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(f->path) >= sizeof a.sun_path)
        return -1;
    memcpy(a.sun_path, f->path, strlen(f->path));
    f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->lfd, 4) != 0)
        return -1;
    return pthread_create(&f->th, NULL, fake_main, f) == 0 ? 0 : -1;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own */
}

#define CHECK_RC(call, c)                                                                   \
    do {                                                                                    \
        int rc_ = (call);                                                                   \
        CHECKF(rc_ == 0, "%s: %d (%s): %s", #call, rc_, dgemma_status_name(rc_),            \
               dgemma_errmsg(c));                                                           \
    } while (0)

#define CHECK_STATUS(call, want, c)                                                         \
    do {                                                                                    \
        int rc_ = (call);                                                                   \
        CHECKF(rc_ == (want), "%s: %d (%s), want %s: %s", #call, rc_,                      \
               dgemma_status_name(rc_), dgemma_status_name(want), dgemma_errmsg(c));        \
    } while (0)

/* Connect a new handle to the fake. */
static dgemma_t *connect_fake(const struct fake *f)
{
    dgemma_t *c = dgemma_new();
    if (c && dgemma_connect(c, f->path, 5) != 0) {
        dgemma_close(c);
        return NULL;
    }
    return c;
}

/* ---- cases ---------------------------------------------------------------------------- */

#define N_JOBS 2000
#define CHUNK 50

/* Job j's request: text "job <j>" (with a stop string every 7th) or ids
 * j, j+1, j+2. */
static dgemma_request_t *job_request(int j)
{
    dgemma_request_t *r;
    if (j % 2 == 0) {
        char s[32];
        snprintf(s, sizeof s, "job %d", j);
        r = dgemma_request_text(s);
        if (r && j % 7 == 0 && dgemma_request_add_stop(r, "zz") != 0) {
            dgemma_request_free(r);
            r = NULL;
        }
    } else {
        const int32_t ids[3] = {j, j + 1, j + 2};
        r = dgemma_request_ids(ids, 3);
    }
    return r;
}

/* Job j's completion is what the fake makes of its request. */
static int check_job(const dgemma_completion_t *x)
{
    const int j = (int)x->user_data;
    CHECKF(x->user_data < N_JOBS, "user_data %" PRIu64, x->user_data);
    CHECKF(x->code == NULL && x->finish_reason && !strcmp(x->finish_reason, "stop"),
           "job %d: code %s finish %s", j, x->code ? x->code : "-",
           x->finish_reason ? x->finish_reason : "-");
    CHECK(x->id > 1000 && x->seed == 42 && x->canvases == 2 && x->stop_id == -1);
    if (j % 2 == 0) {
        char s[32], rev[32];
        const size_t n = (size_t)snprintf(s, sizeof s, "job %d", j);
        for (size_t i = 0; i < n; i++)
            rev[i] = s[n - 1 - i];
        rev[n] = '\0';
        CHECKF(x->text_len == n && !strcmp(x->text, rev), "job %d: text \"%s\"", j, x->text);
        CHECK(x->n_ids == 1 && x->ids[0] == (int32_t)n);
    } else {
        CHECKF(x->n_ids == 3 && x->ids[0] == j + 1 && x->ids[1] == j + 2 && x->ids[2] == j + 3,
               "job %d: %zu ids", j, x->n_ids);
        CHECK(x->text_len == 3 && !strcmp(x->text, "ids"));
    }
    return 0;
}

static int case_roundtrip_2000_jobs(void)
{
    static unsigned char seen[N_JOBS];
    static struct fake f;
    const dgemma_ring_opts_t opts = {5, 4, 96, 256}; /* 5: sent as 8 */
    const int fds0 = count_fds();
    dgemma_ring_t *ring = NULL;
    dgemma_t *c;
    int next = 0, done = 0, again_sq = 0, again_arena = 0, round = 0;

    memset(&f, 0, sizeof f);
    memset(seen, 0, sizeof seen);
    f.sq_entries = 8;
    f.cq_entries = 4;
    f.in_size = 96;
    f.out_size = 4 * 64;
    CHECK(fake_start(&f, "roundtrip.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_RC(dgemma_ring_attach(c, &opts, &ring), c);
    CHECK(ring && dgemma_ring_fd(ring) >= 0);
    CHECKF(strstr(f.attach_line, "\"sq_entries\":8,\"cq_entries\":4,\"in_bytes\":96,"
                                 "\"out_bytes\":256}"), "%s", f.attach_line);
    while (done < N_JOBS) {
        const int end = next + CHUNK < N_JOBS ? next + CHUNK : N_JOBS;
        dgemma_completion_t x;
        int rc;
        while (next < end) {
            dgemma_request_t *r = job_request(next);
            CHECK(r != NULL);
            rc = dgemma_ring_submit(ring, r, (uint64_t)next);
            dgemma_request_free(r);
            if (rc == DGEMMA_E_AGAIN) {
                if (strstr(dgemma_errmsg(c), "submission ring is full"))
                    again_sq++;
                else if (strstr(dgemma_errmsg(c), "prompt arena is full"))
                    again_arena++;
                else
                    CHECKF(0, "AGAIN: %s", dgemma_errmsg(c));
                break;
            }
            CHECK_RC(rc, c);
            next++;
        }
        if (round++ % 2) { /* the caller's own poll loop */
            struct pollfd p = {dgemma_ring_fd(ring), POLLIN, 0};
            CHECK_RC(dgemma_ring_kick(ring), c);
            CHECKF(poll(&p, 1, WAIT_MS) == 1, "no completion within %d ms", WAIT_MS);
        } else {
            CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
        }
        while ((rc = dgemma_ring_reap(ring, &x)) == 0) {
            if (check_job(&x))
                return 1;
            CHECKF(seen[x.user_data]++ == 0, "job %" PRIu64 " completed twice", x.user_data);
            done++;
        }
        CHECK_STATUS(rc, DGEMMA_E_AGAIN, c);
    }
    CHECK(next == N_JOBS);
    CHECK_STATUS(dgemma_ring_wait(ring, 0), DGEMMA_E_AGAIN, c);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    CHECKF(f.n_jobs == N_JOBS, "the fake saw %d jobs", f.n_jobs);
    CHECKF(again_sq > 0 && again_arena > 0, "AGAIN: %d for the ring, %d for the arena", again_sq,
           again_arena);
    CHECKF(f.need_wake_set > 0, "NEED_WAKE was never set");
    CHECKF(f.arena_wraps > 0, "the arena never wrapped");
    CHECKF(count_fds() == fds0, "%d descriptors open, %d before", count_fds(), fds0);
    return 0;
}

/* Reap n completions (each within WAIT_MS) into x[], in order. */
static int reap_n(dgemma_t *c, dgemma_ring_t *ring, dgemma_completion_t *x, char (*texts)[64],
                  int n)
{
    for (int i = 0; i < n; i++) {
        int rc;
        CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
        CHECK_RC(rc = dgemma_ring_reap(ring, &x[i]), c);
        /* the pointers last until the next reap: keep the text */
        snprintf(texts[i], 64, "%s", x[i].message ? x[i].message : x[i].text);
        x[i].text = x[i].message = texts[i];
        x[i].ids = NULL; /* (n_ids kept) */
    }
    return 0;
}

static int case_every_setting(void)
{
    static struct fake f;
    dgemma_completion_t x[5];
    char texts[5][64];
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r;
    dgemma_t *c;
    const int32_t ids[3] = {5, 6, 7};
    const struct rec *q;

    memset(&f, 0, sizeof f);
    CHECK(fake_start(&f, "settings.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_RC(dgemma_ring_attach(c, NULL, &ring), c);
    CHECKF(!strcmp(f.attach_line, "{\"v\":1,\"op\":\"shm_attach\"}"), "%s", f.attach_line);

    /* 1: text with every setting */
    CHECK((r = dgemma_request_text("hello")) != NULL);
    CHECK(dgemma_request_set_int(r, "canvas_length", 32) == 0);
    CHECK(dgemma_request_set_int(r, "max_denoising_steps", 12) == 0);
    CHECK(dgemma_request_set_int(r, "stability_threshold", 3) == 0);
    CHECK(dgemma_request_set_int(r, "top_k", 40) == 0);
    CHECK(dgemma_request_set_real(r, "entropy_bound", 0.25) == 0);
    CHECK(dgemma_request_set_real(r, "confidence_threshold", 0.75) == 0);
    CHECK(dgemma_request_set_real(r, "t_min", 0.125) == 0);
    CHECK(dgemma_request_set_real(r, "t_max", 1.5) == 0);
    CHECK(dgemma_request_set_real(r, "top_p", 0.9) == 0);
    CHECK(dgemma_request_set_int(r, "seed", 12345) == 0);
    CHECK(dgemma_request_set_int(r, "max_tokens", 99) == 0);
    CHECK(dgemma_request_add_stop_id(r, 1) == 0 && dgemma_request_add_stop_id(r, 2) == 0 &&
          dgemma_request_add_stop_id(r, 3) == 0);
    CHECK(dgemma_request_add_stop(r, "END") == 0 && dgemma_request_add_stop(r, "\n\n") == 0);
    CHECK(dgemma_request_set_json(r, "{\"batch\":true}") == 0);
    CHECK(dgemma_request_set_tag(r, "ignored") == 0 && dgemma_request_set_stream(r, 0) == 0);
    CHECK_RC(dgemma_ring_submit(ring, r, 1), c);
    dgemma_request_free(r);
    /* 2: ids, no settings */
    CHECK((r = dgemma_request_ids(ids, 3)) != NULL);
    CHECK_RC(dgemma_ring_submit(ring, r, 2), c);
    dgemma_request_free(r);
    /* 3: single values where lists may go, an integer for a real, a null */
    CHECK((r = dgemma_request_text("abc")) != NULL);
    CHECK(dgemma_request_set_json(r, "{\"stop\":\"one\",\"stop_token_ids\":9,\"seed\":null,"
                                     "\"top_p\":1,\"batch\":false}") == 0);
    CHECK(dgemma_request_set_parse_special(r, 0) == 0);
    CHECK_RC(dgemma_ring_submit(ring, r, 3), c);
    dgemma_request_free(r);
    /* 4: refused by the daemon */
    CHECK((r = dgemma_request_text("refuse me")) != NULL);
    CHECK_RC(dgemma_ring_submit(ring, r, 4), c);
    dgemma_request_free(r);
    CHECK_RC(dgemma_ring_cancel(ring, 2), c);
    /* 5: failed after it started */
    CHECK((r = dgemma_request_text("fail me")) != NULL);
    CHECK(dgemma_request_set_parse_special(r, 1) == 0);
    CHECK_RC(dgemma_ring_submit(ring, r, 5), c);
    dgemma_request_free(r);
    if (reap_n(c, ring, x, texts, 5))
        return 1;

    CHECK(x[0].user_data == 1 && x[0].id == 1001 && !strcmp(x[0].finish_reason, "length"));
    CHECK(!strcmp(x[0].text, "olleh") && x[0].text_len == 5 && x[0].n_ids == 1 && !x[0].code);
    CHECK(x[0].seed == 12345 && x[0].stop_id == 1 && x[0].prompt_tokens == 6);
    CHECK(x[0].completion_tokens == 1 && x[0].decoder_steps == 3 && x[0].canvases == 2);
    CHECK(x[0].tokens_per_s == 1.5 && x[0].ms_total == 2.5 && x[0].ms_first_canvas == 0.5);
    CHECK(x[1].user_data == 2 && !strcmp(x[1].text, "ids") && x[1].n_ids == 3);
    CHECK(!strcmp(x[1].finish_reason, "stop") && x[1].seed == 42 && x[1].stop_id == -1);
    CHECK(x[2].user_data == 3 && !strcmp(x[2].text, "cba") && x[2].stop_id == 9);
    CHECK(x[3].user_data == 4 && x[3].id == 0 && x[3].code && !strcmp(x[3].code, "busy"));
    CHECK(!strcmp(x[3].message, "the queue is full") && x[3].finish_reason == NULL);
    CHECK(x[4].user_data == 5 && x[4].id != 0 && x[4].code && !strcmp(x[4].code, "internal"));
    CHECK(!strcmp(x[4].message, "the engine failed") && !strcmp(x[4].finish_reason, "error"));
    CHECK_STATUS(dgemma_ring_wait(ring, 50), DGEMMA_E_AGAIN, c);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    CHECK(f.n_recs == 6 && f.n_jobs == 5 && f.n_cancels == 1);

    q = &f.recs[0];
    CHECK(q->e.user_data == 1 && q->e.op == DG_SHM_OP_TEXT && q->e.flags == DG_SHM_F_BATCH);
    CHECK(q->e.prompt_len == 5 && !memcmp(q->prompt, "hello", 5));
    CHECKF(q->e.set == (uint32_t)DG_SHM_SET_ALL, "set 0x%x", q->e.set);
    CHECK(q->e.canvas_length == 32 && q->e.max_denoising_steps == 12);
    CHECK(q->e.stability_threshold == 3 && q->e.top_k == 40);
    CHECK(q->e.entropy_bound == 0.25 && q->e.confidence_threshold == 0.75);
    CHECK(q->e.t_min == 0.125 && q->e.t_max == 1.5 && q->e.top_p == 0.9);
    CHECK(q->e.seed == 12345 && q->e.max_tokens == 99);
    CHECK(q->e.n_stop_ids == 3 && q->e.stop_ids[0] == 1 && q->e.stop_ids[1] == 2 &&
          q->e.stop_ids[2] == 3);
    CHECK(q->e.stop_len == 7 && !memcmp(q->stop, "END\0\n\n\0", 7));
    CHECK(q->e.stop_off == q->e.prompt_off + 5);

    q = &f.recs[1];
    CHECK(q->e.user_data == 2 && q->e.op == DG_SHM_OP_IDS && q->e.flags == 0 && q->e.set == 0);
    CHECK(q->e.prompt_len == 12 && !memcmp(q->prompt, ids, 12) && q->e.prompt_off % 4 == 0);
    CHECK(q->e.n_stop_ids == 0 && q->e.stop_len == 0);

    q = &f.recs[2];
    CHECKF(q->e.set == (DG_SHM_SET_STOP | DG_SHM_SET_STOP_IDS | DG_SHM_SET_TOP_P), "set 0x%x",
           q->e.set);
    CHECK(q->e.flags == DG_SHM_F_PLAIN_TEXT && q->e.top_p == 1.0 && q->e.n_stop_ids == 1 &&
          q->e.stop_ids[0] == 9);
    CHECK(q->e.stop_len == 4 && !memcmp(q->stop, "one", 4));

    q = &f.recs[4];
    CHECK(q->e.op == DG_SHM_OP_CANCEL && q->e.cancel_user_data == 2 && q->e.user_data == 2);
    q = &f.recs[5];
    CHECK(q->e.user_data == 5 && q->e.flags == DG_SHM_F_PARSE_SPECIAL);
    return 0;
}

/* Submit r (then free it): DGEMMA_E_INVAL with needle in the message. */
static int refused(dgemma_t *c, dgemma_ring_t *ring, dgemma_request_t *r, const char *needle)
{
    int rc;
    CHECK(r != NULL);
    rc = dgemma_ring_submit(ring, r, 99);
    dgemma_request_free(r);
    CHECKF(rc == DGEMMA_E_INVAL, "want inval (%s), got %s: %s", needle, dgemma_status_name(rc),
           dgemma_errmsg(c));
    CHECKF(strstr(dgemma_errmsg(c), needle), "\"%s\" not in: %s", needle, dgemma_errmsg(c));
    return 0;
}

/* A text request with the settings of a JSON text. */
static dgemma_request_t *with_json(const char *json)
{
    dgemma_request_t *r = dgemma_request_text("x");
    if (r && dgemma_request_set_json(r, json) != 0) {
        dgemma_request_free(r);
        return NULL;
    }
    return r;
}

static int case_refused_requests(void)
{
    static struct fake f;
    static char big[5000];
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r;
    dgemma_completion_t x;
    dgemma_t *c;
    const int32_t one = 1;

    memset(&f, 0, sizeof f);
    CHECK(fake_start(&f, "refused.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_RC(dgemma_ring_attach(c, NULL, &ring), c);

    r = dgemma_request_chat();
    CHECK(r && dgemma_request_add_message(r, "user", "hi") == 0);
    if (refused(c, ring, r, "chat"))
        return 1;
    r = dgemma_request_text("x");
    CHECK(r && dgemma_request_set_thinking(r, 1) == 0);
    if (refused(c, ring, r, "enable_thinking"))
        return 1;
    if (refused(c, ring, with_json("{\"top_k\":1.5}"), "top_k: expected an integer") ||
        refused(c, ring, with_json("{\"top_p\":\"high\"}"), "top_p: expected a number") ||
        refused(c, ring, with_json("{\"max_tokens\":true}"), "max_tokens") ||
        refused(c, ring, with_json("{\"stop\":[1]}"), "stop[0]: expected a string") ||
        refused(c, ring, with_json("{\"stop_token_ids\":[1,\"2\"]}"), "stop_token_ids[1]") ||
        refused(c, ring, with_json("{\"stop_token_ids\":[1,2,3,4,5,6,7,8,9]}"), "at most 8") ||
        refused(c, ring, with_json("{\"batch\":1}"), "batch") ||
        refused(c, ring, with_json("{\"parse_special\":\"no\"}"), "parse_special: expected") ||
        refused(c, ring, with_json("{\"temperature\":0.7}"), "not a setting the ring carries") ||
        refused(c, ring, with_json("{\"top_k\":4294967296}"), "32 bits") ||
        refused(c, ring, with_json("{\"seed\":-1}"), "negative") ||
        refused(c, ring, with_json("{\"prompt_ids\":[1]}"), "both prompt and prompt_ids") ||
        refused(c, ring, with_json("{\"prompt\":7}"), "prompt: expected a string") ||
        refused(c, ring, with_json("{\"op\":\"status\"}"), "op"))
        return 1;
    r = dgemma_request_ids(&one, 1);
    CHECK(r && dgemma_request_set_parse_special(r, 0) == 0);
    if (refused(c, ring, r, "parse_special: with a text prompt only"))
        return 1;
    r = dgemma_request_ids(&one, 1);
    CHECK(r && dgemma_request_set_json(r, "{\"prompt_ids\":[1,\"a\"]}") == 0);
    if (refused(c, ring, r, "prompt_ids[1]"))
        return 1;
    memset(big, 'a', sizeof big - 1);
    if (refused(c, ring, dgemma_request_text(big), "the prompt arena holds 4096"))
        return 1;
    CHECK_STATUS(dgemma_ring_submit(ring, NULL, 1), DGEMMA_E_INVAL, c);
    CHECK(dgemma_ring_submit(NULL, NULL, 1) == DGEMMA_E_INVAL);
    CHECK(dgemma_ring_reap(NULL, &x) == DGEMMA_E_INVAL && dgemma_ring_fd(NULL) == -1);
    CHECK(dgemma_ring_attach(NULL, NULL, &ring) == DGEMMA_E_INVAL);
    /* nothing reached the ring: the next job is the fake's first */
    CHECK((r = dgemma_request_text("ok")) != NULL);
    CHECK_RC(dgemma_ring_submit(ring, r, 7), c);
    dgemma_request_free(r);
    CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
    CHECK_RC(dgemma_ring_reap(ring, &x), c);
    CHECK(x.user_data == 7 && !strcmp(x.text, "ko"));
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    CHECK(f.n_recs == 1 && f.n_jobs == 1);
    return 0;
}

static int case_attach_refused(void)
{
    static struct fake f;
    const int fds0 = count_fds();
    dgemma_ring_t *ring = (dgemma_ring_t *)&f; /* anything: must become NULL */
    dgemma_event_t ev;
    dgemma_t *c;

    memset(&f, 0, sizeof f);
    f.mode = FM_REFUSE;
    CHECK(fake_start(&f, "refuse.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_STATUS(dgemma_ring_attach(c, NULL, &ring), DGEMMA_E_DAEMON, c);
    CHECK(ring == NULL);
    CHECKF(strstr(dgemma_errmsg(c), "this connection has a ring already") &&
           strstr(dgemma_errmsg(c), "busy"), "%s", dgemma_errmsg(c));
    /* the answer was taken: nothing is left for next_event */
    CHECK_STATUS(dgemma_next_event(c, &ev, 0), DGEMMA_E_AGAIN, c);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    CHECKF(count_fds() == fds0, "%d descriptors open, %d before", count_fds(), fds0);
    return 0;
}

static int case_bad_rings(void)
{
    static const struct {
        enum fake_mode mode;
        const char *needle;
    } bad[] = {
        {FM_BAD_MAGIC, "magic"},
        {FM_BAD_REGION, "not inside"},
        {FM_BAD_SIZE, "not the"},
        {FM_BAD_POW2, "powers of two"},
        {FM_BAD_GEOM, "geometry"},
        {FM_NOT_EMPTY, "not empty"},
        {FM_NO_SEAL, "sealed"},
        {FM_TWO_FDS, "2 descriptor(s)"},
        {FM_NO_FDS, "0 descriptor(s)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static struct fake f;
        const int fds0 = count_fds();
        dgemma_ring_t *ring = NULL;
        dgemma_event_t ev;
        char name[32];
        dgemma_t *c;

        memset(&f, 0, sizeof f);
        f.mode = bad[i].mode;
        snprintf(name, sizeof name, "bad%zu.sock", i);
        CHECK(fake_start(&f, name) == 0);
        CHECK((c = connect_fake(&f)) != NULL);
        CHECK_STATUS(dgemma_ring_attach(c, NULL, &ring), DGEMMA_E_PROTOCOL, c);
        CHECKF(ring == NULL && strstr(dgemma_errmsg(c), bad[i].needle), "case %zu: %s", i,
               dgemma_errmsg(c));
        CHECK_STATUS(dgemma_next_event(c, &ev, 0), DGEMMA_E_AGAIN, c);
        dgemma_close(c);
        pthread_join(f.th, NULL);
        CHECKF(!f.fail[0], "fake: %s", f.fail);
        CHECKF(count_fds() == fds0, "case %zu: %d descriptors open, %d before", i, count_fds(),
               fds0);
    }
    return 0;
}

static int case_events_before_the_answer(void)
{
    static struct fake f;
    const int fds0 = count_fds();
    dgemma_ring_t *ring = NULL;
    dgemma_request_t *r;
    dgemma_event_t ev;
    dgemma_t *c;
    char *saved;

    memset(&f, 0, sizeof f);
    f.big_first_status = 1;
    f.pre = "{\"v\":1,\"event\":\"canvas\",\"id\":5,\"index\":0,\"text\":\"hi\",\"ids\":[1]}\n"
            "{\"v\":1,\"event\":\"done\",\"id\":5,\"finish_reason\":\"stop\"}\n";
    CHECK(fake_start(&f, "pending.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    /* a live event whose json must outlast the attach */
    CHECK_RC(dgemma_status(c), c);
    CHECK_RC(dgemma_next_event(c, &ev, WAIT_MS), c);
    CHECK(ev.kind == DGEMMA_EV_STATUS && strlen(ev.json) > 100000 - 10);
    CHECK((saved = strdup(ev.json)) != NULL);
    /* two lines in flight whose answers come before the attach's: the error
     * without an id is the generate's, not the attach's */
    CHECK((r = dgemma_request_text("x")) != NULL);
    CHECK(dgemma_request_set_tag(r, "g") == 0);
    CHECK_RC(dgemma_submit(c, r), c);
    dgemma_request_free(r);
    CHECK_RC(dgemma_status(c), c);
    CHECK_RC(dgemma_ring_attach(c, NULL, &ring), c);
    CHECKF(c->retired != NULL, "the attach never needed a new buffer (the test's sizes)");
    CHECKF(!strcmp(ev.json, saved), "the last event's json changed under the attach");
    free(saved);
    CHECK_RC(dgemma_next_event(c, &ev, WAIT_MS), c);
    CHECK(ev.kind == DGEMMA_EV_ERROR && ev.tag && !strcmp(ev.tag, "g"));
    CHECK(!strcmp(ev.code, "bad_request"));
    CHECK_RC(dgemma_next_event(c, &ev, WAIT_MS), c);
    CHECK(ev.kind == DGEMMA_EV_STATUS);
    CHECK_RC(dgemma_next_event(c, &ev, WAIT_MS), c);
    CHECK(ev.kind == DGEMMA_EV_CANVAS && ev.id == 5 && !strcmp(ev.text, "hi"));
    CHECK_RC(dgemma_next_event(c, &ev, WAIT_MS), c);
    CHECK(ev.kind == DGEMMA_EV_DONE && ev.id == 5);
    CHECK_STATUS(dgemma_next_event(c, &ev, 0), DGEMMA_E_AGAIN, c);
    CHECK(c->unanswered == 0);
    /* the ring works */
    CHECK((r = dgemma_request_text("ring")) != NULL);
    CHECK_RC(dgemma_ring_submit(ring, r, 1), c);
    dgemma_request_free(r);
    {
        dgemma_completion_t x;
        CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
        CHECK_RC(dgemma_ring_reap(ring, &x), c);
        CHECK(!strcmp(x.text, "gnir"));
    }
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    CHECKF(count_fds() == fds0, "%d descriptors open, %d before", count_fds(), fds0);
    return 0;
}

/* Submit n text jobs "t<i>" with user_data i. */
static int submit_n(dgemma_t *c, dgemma_ring_t *ring, int n)
{
    for (int i = 0; i < n; i++) {
        char s[16];
        dgemma_request_t *r;
        snprintf(s, sizeof s, "t%d", i);
        CHECK((r = dgemma_request_text(s)) != NULL);
        CHECK_RC(dgemma_ring_submit(ring, r, (uint64_t)i), c);
        dgemma_request_free(r);
    }
    return 0;
}

/* The daemon stops after 3 of 5 jobs (fault: DG_SHM_FAULT; else it hangs
 * up): the 3 completions, then DGEMMA_E_CLOSED, seen by dgemma_ring_wait,
 * or (poll_loop) by dgemma_ring_reap in the caller's poll loop on
 * dgemma_ring_fd and dgemma_fd. */
static int closed_after_3(int fault, int poll_loop, int quietly)
{
    static struct fake f;
    dgemma_ring_t *ring = NULL;
    dgemma_completion_t x;
    dgemma_request_t *r;
    dgemma_t *c;
    int got = 0, rc;

    memset(&f, 0, sizeof f);
    f.fault_quietly = quietly;
    if (fault)
        f.fault_after = 3;
    else
        f.hangup_after = 3;
    CHECK(fake_start(&f, fault ? "fault.sock" : "hangup.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_RC(dgemma_ring_attach(c, NULL, &ring), c);
    if (submit_n(c, ring, 5))
        return 1;
    for (;;) {
        if (poll_loop) {
            struct pollfd p[2] = {{dgemma_ring_fd(ring), POLLIN, 0}, {dgemma_fd(c), POLLIN, 0}};
            CHECK_RC(dgemma_ring_kick(ring), c);
            CHECKF(poll(p, 2, WAIT_MS) > 0, "nothing within %d ms", WAIT_MS);
        } else if ((rc = dgemma_ring_wait(ring, quietly ? -1 : WAIT_MS)) != 0) {
            break;
        }
        while ((rc = dgemma_ring_reap(ring, &x)) == 0)
            CHECK(x.user_data == (uint64_t)got++);
        if (rc != DGEMMA_E_AGAIN)
            break;
    }
    CHECKF(rc == DGEMMA_E_CLOSED && got == 3, "%s after %d completions: %s",
           dgemma_status_name(rc), got, dgemma_errmsg(c));
    CHECK_STATUS(dgemma_ring_reap(ring, &x), DGEMMA_E_CLOSED, c);
    CHECK_STATUS(dgemma_ring_wait(ring, 0), DGEMMA_E_CLOSED, c);
    CHECK((r = dgemma_request_text("late")) != NULL);
    CHECK_STATUS(dgemma_ring_submit(ring, r, 9), DGEMMA_E_CLOSED, c);
    dgemma_request_free(r);
    CHECK_STATUS(dgemma_ring_kick(ring), DGEMMA_E_CLOSED, c);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    return 0;
}

static int case_fault_is_closed(void)
{
    return closed_after_3(1, 0, 0);
}

/* DG_SHM_FAULT set without a ring of the completion doorbell: a wait
 * without a timeout still ends (it looks at the flags every second) */
static int case_fault_without_a_ring(void)
{
    return closed_after_3(1, 0, 1);
}

static int case_hangup_is_closed(void)
{
    return closed_after_3(0, 0, 0);
}

static int case_hangup_in_a_poll_loop(void)
{
    return closed_after_3(0, 1, 0);
}

static int case_completion_outside_the_arena(void)
{
    static struct fake f;
    dgemma_ring_t *ring = NULL;
    dgemma_completion_t x;
    dgemma_t *c;

    memset(&f, 0, sizeof f);
    f.bad_cqe_at = 2;
    CHECK(fake_start(&f, "badcqe.sock") == 0);
    CHECK((c = connect_fake(&f)) != NULL);
    CHECK_RC(dgemma_ring_attach(c, NULL, &ring), c);
    if (submit_n(c, ring, 3))
        return 1;
    CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
    CHECK_RC(dgemma_ring_reap(ring, &x), c);
    CHECK(x.user_data == 0 && !strcmp(x.text, "0t"));
    CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
    CHECK_STATUS(dgemma_ring_reap(ring, &x), DGEMMA_E_PROTOCOL, c);
    CHECKF(strstr(dgemma_errmsg(c), "job 1") && strstr(dgemma_errmsg(c), "outside"), "%s",
           dgemma_errmsg(c));
    CHECK_RC(dgemma_ring_wait(ring, WAIT_MS), c);
    CHECK_RC(dgemma_ring_reap(ring, &x), c);
    CHECK(x.user_data == 2 && !strcmp(x.text, "2t"));
    dgemma_ring_detach(ring);
    dgemma_close(c);
    pthread_join(f.th, NULL);
    CHECKF(!f.fail[0], "fake: %s", f.fail);
    return 0;
}

int main(void)
{
    alarm(300); /* a hang is a failure */
    TEST_CASE(case_roundtrip_2000_jobs);
    TEST_CASE(case_every_setting);
    TEST_CASE(case_refused_requests);
    TEST_CASE(case_attach_refused);
    TEST_CASE(case_bad_rings);
    TEST_CASE(case_events_before_the_answer);
    TEST_CASE(case_fault_is_closed);
    TEST_CASE(case_fault_without_a_ring);
    TEST_CASE(case_hangup_is_closed);
    TEST_CASE(case_hangup_in_a_poll_loop);
    TEST_CASE(case_completion_outside_the_arena);
    return test_finish();
}
