/*
 * server.h - the front end: one thread, one io_uring, the UNIX socket.
 *
 * DESIGN
 *   The ring (IORING_SETUP_SINGLE_ISSUER when the kernel has it) carries
 *   every wait of the daemon's main thread: accept on the listening socket;
 *   per connection a recv, a send and a poll for hang-up; a read on the
 *   scheduler's eventfd (its outbox has lines); a read on a signalfd
 *   (SIGTERM, SIGINT, SIGHUP); and a periodic timeout for housekeeping.
 *   Completions are identified by user_data = kind | slot | generation
 *   (never a raw fd: a slot's generation changes when it is reused).
 *   Connections.  A fixed table of max_connections slots.  A client whose
 *   SO_PEERCRED credentials the allow-list refuses gets one forbidden error
 *   line and is closed at accept.  Each connection may hold
 *   client_max_requests requests in flight: a generate past it is refused
 *   as busy; a ring's jobs past it wait in the ring.  Input is framed
 *   by newlines; a line longer than max_line_bytes gets a too_large error
 *   and is skipped up to its newline.  A generate whose prompt or chat has
 *   4 KiB of text or more goes to the tokenizing thread (prep.h); the
 *   connection's input and ring wait until it is back, so its replies keep
 *   the order of its lines, and other connections are served meanwhile.
 *   Output is a queue of blocks, sent one
 *   send at a time; while more than max_output_bytes / 4 is unsent the
 *   connection is not read (backpressure), and beyond max_output_bytes the
 *   client is too slow: its requests are cancelled and it is dropped
 *   (what the kernel's send buffer holds comes first: send_buffer_bytes,
 *   send-buffer.h).  A
 *   half-closed client (EOF on its side) still gets its events; a hung-up
 *   one (poll: POLLHUP) is gone at once and its requests are cancelled.
 *   Shutdown.  The first SIGTERM or SIGINT stops accepting, removes the
 *   socket, ends queued requests and lets running ones finish for
 *   shutdown_grace seconds, then cancels them; once every request has its
 *   done line and the output is flushed (or 2 s more have passed), run
 *   returns.  A second signal cancels at once; a third exits immediately.
 */
#ifndef DG_DAEMON_SERVER_H
#define DG_DAEMON_SERVER_H

#include <sys/types.h>

#include <jansson.h>

#include "daemon/access.h"
#include "daemon/protocol.h"
#include "daemon/metrics.h"
#include "daemon/sched.h"
#include "daemon/shm-ring.h"
#include "lib/error.h"

struct dserver_options {
    const char *socket_path;
    int socket_mode;              /* permission bits of the socket file */
    const char *socket_group;     /* "" or NULL: leave it */
    const char *socket_owner;     /* "" or NULL: leave it */
    struct daccess_policy access; /* who may connect (checked at accept) */
    int client_max_requests;      /* requests in flight per connection (ring jobs too) */
    int max_connections;
    size_t max_line_bytes;
    size_t max_output_bytes;
    int send_buffer_bytes;        /* SO_SNDBUF of each accepted socket; 0: the system's */
    double tick;                  /* housekeeping period, seconds */
    double shutdown_grace;        /* seconds running requests get at shutdown */
    json_t *info;                 /* what status reports about the model and backend (borrowed) */
    struct dmetrics *metrics;     /* refused requests are recorded here; NULL: none */
    struct dshm_limits shm;       /* shared-memory rings: caps (max_entries 0: none) */
    uint64_t shm_user_max_bytes;  /* rings' bytes one uid's connections may hold; 0: no cap */
};

struct dserver;

/* Bind the socket (refusing a path a live daemon serves, replacing a stale
 * one; created under umask 0177, then given socket_mode, socket_owner and
 * socket_group), set up the ring and the signalfd.  SIGTERM, SIGINT and SIGHUP must
 * already be blocked in every thread.  Errors: DG_E_IO (socket, ring),
 * DG_E_INVAL (the path is taken or too long), DG_E_NOMEM. */
int dserver_create(const struct dserver_options *o, struct dsched *s,
                   const struct dproto_ctx *pctx, int event_fd, struct dserver **out,
                   struct dg_error *err);

/* Whether a daemon could listen at path (dgemmad --check-config),
 * creating and removing nothing: the path fits a socket address, its
 * directory exists and we may write it, nothing but a socket is in the
 * way (a stale one is replaced at start), and owner and group (NULL or
 * empty: as is) name a user and a group.  *live is set to 1 when a daemon
 * answers there now: not an error, since the check may run beside the
 * daemon it is to replace.  Errors: DG_E_INVAL, DG_E_IO, DG_E_CONFIG. */
int dserver_check_socket(const char *path, const char *owner, const char *group, int *live,
                         struct dg_error *err);

/* The device and inode of the socket file this server bound, for a
 * caller that must remove it where the server cannot (a signal handler):
 * remove the path only while lstat still finds that file there. */
void dserver_socket_file(const struct dserver *srv, dev_t *dev, ino_t *ino);

/* Serve until shut down.  Returns 0 after a clean shutdown, or a negative
 * status for a failure of the ring itself. */
int dserver_run(struct dserver *srv, struct dg_error *err);

void dserver_destroy(struct dserver *srv);

#endif
