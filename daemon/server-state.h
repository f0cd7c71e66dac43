/*
 * server-state.h - the front end's state, shared by its two files:
 * server.c (the loop, connections, socket requests, the tokenizing thread's
 * requests, set-up) and server-ring.c (shared-memory rings).  Private to
 * dgemmad's front end; server.h is its public face.
 */
#ifndef DG_DAEMON_SERVER_STATE_H
#define DG_DAEMON_SERVER_STATE_H

#include <liburing.h>
#include <stdint.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "daemon/log-limit.h"
#include "daemon/prep.h"
#include "daemon/server.h"
#include "daemon/shm-ring.h"

#define RECV_CHUNK 65536
#define RING_KEY_BIT 0x80000000u /* in a request's connection key: a ring job */

/* ---- completion identity ------------------------------------------------------ */

enum op_kind {
    OP_ACCEPT = 1, OP_RECV, OP_SEND, OP_POLL, OP_EVENT, OP_SIGNAL, OP_TICK, OP_CANCEL,
    OP_BELL,                   /* a ring's submission doorbell is readable */
    OP_BELL_READ,              /* its counter read (emptied) */
    OP_CQ_BELL,                /* a ring's completion doorbell written */
    OP_DEADLINE,               /* shutdown_grace has passed (one timeout, at its time) */
};

static inline uint64_t ud_make(enum op_kind k, uint32_t slot, uint32_t gen)
{
    return ((uint64_t)k << 56) | ((uint64_t)(slot & 0xffffffu) << 32) | gen;
}

static inline enum op_kind ud_kind(uint64_t ud)
{
    return (enum op_kind)(ud >> 56);
}

static inline uint32_t ud_slot(uint64_t ud)
{
    return (uint32_t)(ud >> 32) & 0xffffffu;
}

static inline uint32_t ud_gen(uint64_t ud)
{
    return (uint32_t)ud;
}

/* ---- connections ------------------------------------------------------------- */

struct out_block {
    struct out_block *next;
    size_t len, off, cap;      /* bytes held, bytes already sent, room */
    int fds[3], nfds;          /* descriptors that go with the first byte (owned) */
    char data[];               /* cap bytes */
};

struct conn {
    int in_use, fd;
    uint32_t gen;
    int pending;               /* operations in flight */
    int recv_armed, send_armed, poll_armed;
    int read_closed;           /* EOF from the client: it reads, it will not write */
    int gone;                  /* torn down; the slot frees when pending reaches 0 */
    int discarding;            /* skipping the rest of an oversize line */
    char *rbuf;                /* unframed input */
    size_t rlen, rcap;
    int prepping;              /* a request with the tokenizing thread: input, ring paused */
    char *held;                /* input received after that request's line (malloc'd) */
    size_t held_len;
    char chunk[RECV_CHUNK];
    struct out_block *head, *tail;
    size_t out_bytes;          /* unsent */
    int active;                /* requests accepted and not yet done (ring jobs too) */
    uid_t uid;
    pid_t pid;
    /* the shared-memory ring, if attached */
    struct dshm_ring *ring;
    /* the doorbells go through the io_uring, never a read or write of the
     * loop's own: the eventfds' open files are shared with the client,
     * which can make them blocking (their flags are the file's) */
    int bell_armed;            /* the poll on the submission doorbell */
    int bell_reading;          /* the read that empties it */
    int cq_bell_busy;          /* a write of the completion doorbell */
    int cq_bell_due;           /* another is owed once that one ends */
    uint64_t bell_val, cq_bell_val; /* their 8 bytes (stable while in flight) */
    int ring_again;            /* more submissions may wait: look again this turn */
    int ring_stalled;          /* the scheduler was full: look again when it has room */
    int ring_active;           /* ring jobs accepted and not yet done (part of active) */
    struct msghdr msg;         /* a send with descriptors (stable while in flight) */
    struct iovec iov;
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } cmsg;
};

enum phase { RUNNING = 0, DRAINING, CANCELLING, FLUSHING };

/* connections refused at accept, kept open for reading a while */
#define LINGER_MAX 32
#define LINGER_S 1.0

struct dserver {
    struct dserver_options o;
    struct dsched *sched;
    const struct dproto_ctx *pctx;
    struct dproto_ctx pctx_defer; /* *pctx, long texts left to the tokenizing thread */
    struct dprep *prep;
    int prepping;              /* requests with the tokenizing thread */
    struct io_uring ring;
    int ring_ok;
    int listen_fd, event_fd, signal_fd;
    int accept_armed;
    /* accepts failed for want of a descriptor (EMFILE, ENFILE) since the
     * last that worked, retried at each tick; logged when they begin and
     * when they end, not at each try, and those lines limited as the
     * refusals are (STARVED_LOG_BURST a window) */
    unsigned long long accept_starved;
    double accept_starved_since;
    struct dlog_limit starved_log;
    /* connections refused at accept (busy, forbidden), their refusal sent
     * and their side shut for writing, kept until the client closes or
     * LINGER_S passes, what they send read and dropped: a client that
     * writes before it reads gets the line, not a reset or EPIPE */
    struct {
        int fd;
        double until;
    } linger[LINGER_MAX];
    int n_linger;
    struct dlog_limit refusals; /* refusals logged at info: REFUSAL_LOG_BURST a window */
    uint64_t event_buf;
    struct signalfd_siginfo sig_buf;
    struct __kernel_timespec tick_ts;
    struct __kernel_timespec grace_ts; /* shutdown_grace, for OP_DEADLINE */
    struct conn *conns;
    int n_conns;               /* slots in use */
    enum phase phase;
    int signals;               /* SIGTERM / SIGINT seen */
    double deadline;           /* DRAINING: cancel at; FLUSHING: give up at */
    double started;
    int failed;
    struct dsched_out *outbox;
    int rings;                 /* connections with a ring */
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    dev_t socket_dev;          /* the socket file this daemon bound (removed only if */
    ino_t socket_ino;          /* still it: another daemon may have taken the path) */
};

static inline uint32_t slot_of(const struct dserver *srv, const struct conn *c)
{
    return (uint32_t)(c - srv->conns);
}

static inline uint64_t conn_key(const struct dserver *srv, const struct conn *c)
{
    return ((uint64_t)c->gen << 32) | (uint32_t)(c - srv->conns);
}


/* ---- server.c, for server-ring.c ---------------------------------------------- */

/* An SQE, flushing the submission queue when it is full (NULL, with the
 * server marked failed, when there is none even then). */
struct io_uring_sqe *get_sqe(struct dserver *srv);

/* Done with a client that closed its side and has nothing more coming. */
void maybe_finish(struct dserver *srv, struct conn *c);

/* Queue n bytes for the client with descriptors fds (owned from here on:
 * sent with the first byte, closed when they are). */
void conn_write_fds(struct dserver *srv, struct conn *c, const char *p, size_t n,
                    const int *fds, int nfds);

/* Log a request refused (code, msg) on c's behalf; what ("" or "ring job N ")
 * names it.  At info level while srv->refusals allows, at debug beyond. */
void log_refusal(struct dserver *srv, const struct conn *c, const char *what, const char *code,
                 const char *msg);

/* An error event line to the client (id 0: a request without one), logged
 * as a refusal. */
void send_error(struct dserver *srv, struct conn *c, uint64_t id, const char *tag,
                const char *code, const char *msg);

/* A generate request refused before it had an id, for the metrics. */
void record_refusal(struct dserver *srv, const struct conn *c, const char *tag,
                    enum dg_metrics_source source, size_t prompt_tokens, const char *code,
                    const char *msg);

/* Hand req to the tokenizing thread (*req is left empty), for the socket's
 * line or, with job, the ring's job; the connection's input and ring wait
 * until it is back. */
void prep_start(struct dserver *srv, struct conn *c, struct dproto_request *req,
                const struct dshm_job *job);

/* ---- server-ring.c, for server.c ----------------------------------------------- */

/* A protocol or engine error code as a ring status. */
uint32_t shm_status_of(const char *code);

/* Complete a ring job that will not run with status and msg (the metrics
 * record the refusal). */
void ring_refuse(struct dserver *srv, struct conn *c, const struct dshm_job *job,
                 uint32_t status, const char *msg, size_t prompt_tokens);

/* Hand a ring's job, its request parsed and tokenized, to the scheduler
 * (or refuse it).  req stays the caller's. */
void ring_submit(struct dserver *srv, struct conn *c, const struct dshm_job *job,
                 struct dproto_request *req);

/* Take what the client submitted to its ring, as far as there is room. */
void ring_service(struct dserver *srv, struct conn *c);

/* A ring job's last line from the scheduler: its completion. */
void ring_done(struct dserver *srv, struct conn *c, const char *line, size_t len);

/* The shm_attach request: a ring for the connection, its descriptors sent. */
void shm_attach(struct dserver *srv, struct conn *c, const struct dproto_request *req,
                const char *tag);

/* The doorbell poll of the connection's ring completed. */
void on_bell(struct dserver *srv, struct conn *c, int res);
void on_bell_read(struct dserver *srv, struct conn *c, int res);
void on_cq_bell(struct dserver *srv, struct conn *c, int res);

/* Look again at the rings that asked for it (stalled ones too when
 * stalled_too).  Returns whether one still has more to take. */
int rings_turn(struct dserver *srv, int stalled_too);

#endif
