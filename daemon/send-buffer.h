/*
 * send-buffer.h - the kernel's send buffer of each client socket (SO_SNDBUF).
 *
 * Output a client has not read waits in two places: first the kernel's send
 * buffer for its socket, then the daemon's own queue, which
 * max_output_bytes bounds.  send_buffer_bytes sets the first on every
 * accepted socket, so that what a client that does not read can hold, and
 * when it is dropped, does not rest on the system's net.core.wmem_default
 * (a UNIX socket's accepted end does not take its listener's size).  Linux
 * doubles the size asked, for its bookkeeping of each buffer's overhead,
 * and holds what is asked to net.core.wmem_max (SO_SNDBUFFORCE, which
 * passes it, needs CAP_NET_ADMIN and is not used).
 */
#ifndef DG_DAEMON_SEND_BUFFER_H
#define DG_DAEMON_SEND_BUFFER_H

#include "lib/error.h"

/* Ask for a send buffer of bytes (> 0) on socket fd.  0, or -errno. */
int dsend_buffer_set(int fd, int bytes);

/* What the kernel gives a UNIX stream socket asked for bytes (> 0): *got is
 * the size getsockopt reads back (twice bytes where net.core.wmem_max
 * allows it, less where it does not).  Tried on a socket pair of its own,
 * before any client connects.  0, or a negative status with err set. */
int dsend_buffer_probe(int bytes, int *got, struct dg_error *err);

#endif
