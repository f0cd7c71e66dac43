/*
 * access.h - who dgemmad runs as and who may talk to it.
 *
 *   - daccess_switch_user: at start, before any file is opened: switch from
 *     root to the configured user (uid, group, supplementary groups), or
 *     refuse to serve as root unless allow_root says so.
 *   - daccess_lookup_user / daccess_lookup_group: a name or a number, for
 *     the socket's owner and group.
 *   - daccess_peer_allowed: the allow-list (uids, gids) checked against a
 *     connected client's SO_PEERCRED credentials and SO_PEERGROUPS.
 *
 * Nothing here prints: errors come back as a code and a message.
 */
#ifndef DG_DAEMON_ACCESS_H
#define DG_DAEMON_ACCESS_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "lib/error.h"

/* A user by name, or by number (decimal; it need not exist in the password
 * database, then *gid is (gid_t)-1).  DG_E_CONFIG for an unknown name. */
int daccess_lookup_user(const char *name, uid_t *uid, gid_t *gid, struct dg_error *err);

/* A group by name or by number.  DG_E_CONFIG for an unknown name. */
int daccess_lookup_group(const char *name, gid_t *gid, struct dg_error *err);

/* The start-up identity rule.  user "" or NULL: stay as started; then an
 * effective uid of 0 is refused unless allow_root.  user given: started as
 * root, switch to it (setgroups to its supplementary groups, setgid, setuid;
 * checked afterwards, root cannot be regained); not started as root, user
 * must name the uid already held.  The user must exist in the password
 * database (its group comes from there).  On success *note (may be NULL)
 * says what was done, for the log.  Errors: DG_E_CONFIG (refused, unknown
 * user), DG_E_IO (a set*id call failed). */
int daccess_switch_user(const char *user, int allow_root, char *note, size_t note_size,
                        struct dg_error *err);

/* Who may connect: uids and gids (borrowed arrays), both empty = anyone
 * the socket's permissions let in; self_uid (the daemon's) always may. */
struct daccess_policy {
    const int *uids;
    int n_uids;
    const int *gids;
    int n_gids;
    uid_t self_uid;
};

/* Whether the client on fd with credentials cred may talk to the daemon:
 * 1 yes, 0 no (then why says so, naming uid and gid).  A client group
 * matches allow_gids through cred->gid or its supplementary groups
 * (SO_PEERGROUPS, where the kernel has it). */
int daccess_peer_allowed(const struct daccess_policy *p, int fd, const struct ucred *cred,
                         char *why, size_t why_size);

#endif
