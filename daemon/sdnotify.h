/*
 * sdnotify.h - readiness and status for systemd (the sd_notify protocol,
 * without libsystemd): a datagram to $NOTIFY_SOCKET when it is set.
 */
#ifndef DG_DAEMON_SDNOTIFY_H
#define DG_DAEMON_SDNOTIFY_H

/* Send state ("READY=1", "STOPPING=1", "STATUS=..."), if run under
 * systemd.  Returns 1 if sent, 0 if not under systemd, -1 on failure. */
int sd_notify_send(const char *state);

#endif
