/* access.c - who dgemmad runs as and who may talk to it (see access.h). */
#include "daemon/access.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A decimal id ("1000"), or -1 when s is not one. */
static long long parse_id(const char *s)
{
    char *end;
    long long v;
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < 0 || v > 4294967294LL)
        return -1;
    return v;
}

/* The password entry of name (or of the uid it spells) in *pw, its strings
 * in buf.  0, or DG_E_CONFIG when there is none. */
static int find_passwd(const char *name, struct passwd *pw, char *buf, size_t size,
                       struct dg_error *err)
{
    struct passwd *res = NULL;
    const long long id = parse_id(name);
    int rc = id >= 0 ? getpwuid_r((uid_t)id, pw, buf, size, &res)
                     : getpwnam_r(name, pw, buf, size, &res);
    if (rc != 0 || !res)
        return dg_error_set(err, DG_E_CONFIG, "user %s: %s", name,
                            rc ? strerror(rc) : "no such user in the password database");
    return 0;
}

int daccess_lookup_user(const char *name, uid_t *uid, gid_t *gid, struct dg_error *err)
{
    struct passwd pw;
    char buf[4096];
    const long long id = parse_id(name);
    struct dg_error ignore = {0};
    if (id >= 0 && find_passwd(name, &pw, buf, sizeof buf, &ignore) < 0) {
        *uid = (uid_t)id;
        *gid = (gid_t)-1;
        return 0;
    }
    if (id < 0 && find_passwd(name, &pw, buf, sizeof buf, err) < 0)
        return -err->code;
    *uid = pw.pw_uid;
    *gid = pw.pw_gid;
    return 0;
}

int daccess_lookup_group(const char *name, gid_t *gid, struct dg_error *err)
{
    struct group gr, *res = NULL;
    char buf[16384];
    const long long id = parse_id(name);
    int rc;
    if (id >= 0) {
        *gid = (gid_t)id;
        return 0;
    }
    rc = getgrnam_r(name, &gr, buf, sizeof buf, &res);
    if (rc != 0 || !res)
        return dg_error_set(err, DG_E_CONFIG, "group %s: %s", name,
                            rc ? strerror(rc) : "no such group");
    *gid = gr.gr_gid;
    return 0;
}

int daccess_switch_user(const char *user, int allow_root, char *note, size_t note_size,
                        struct dg_error *err)
{
    const uid_t euid = geteuid();
    struct passwd pw;
    char buf[4096];
    char dummy[8];

    if (!note || note_size == 0)
        note = dummy, note_size = sizeof dummy;
    note[0] = '\0';
    if (!user || !*user) {
        if (euid == 0 && !allow_root)
            return dg_error_set(err, DG_E_CONFIG,
                                "refusing to run as root: set user (the account to switch "
                                "to) or allow_root: true in the configuration");
        snprintf(note, note_size, "running as uid %d gid %d%s", (int)euid, (int)getegid(),
                 euid == 0 ? " (root, allowed by allow_root)" : "");
        return 0;
    }
    if (find_passwd(user, &pw, buf, sizeof buf, err) < 0)
        return -err->code;
    if (pw.pw_uid == 0 && !allow_root)
        return dg_error_set(err, DG_E_CONFIG,
                            "user %s is root: refusing to run as root (allow_root: false)",
                            user);
    if (euid != 0) {
        if (pw.pw_uid != euid)
            return dg_error_set(err, DG_E_CONFIG,
                                "user %s: switching to uid %d needs root (running as uid %d)",
                                user, (int)pw.pw_uid, (int)euid);
        snprintf(note, note_size, "running as %s (uid %d gid %d)", pw.pw_name, (int)euid,
                 (int)getegid());
        return 0;
    }
    if (pw.pw_uid == 0) {
        snprintf(note, note_size, "running as root (user %s, allowed by allow_root)", user);
        return 0;
    }
    if (initgroups(pw.pw_name, pw.pw_gid) != 0)
        return dg_error_set(err, DG_E_IO, "user %s: setting its supplementary groups: %s",
                            user, strerror(errno));
    if (setgid(pw.pw_gid) != 0)
        return dg_error_set(err, DG_E_IO, "user %s: setgid %d: %s", user, (int)pw.pw_gid,
                            strerror(errno));
    if (setuid(pw.pw_uid) != 0)
        return dg_error_set(err, DG_E_IO, "user %s: setuid %d: %s", user, (int)pw.pw_uid,
                            strerror(errno));
    /* all three uids and gids changed, and there is no way back */
    if (getuid() != pw.pw_uid || geteuid() != pw.pw_uid || getgid() != pw.pw_gid ||
        getegid() != pw.pw_gid || setuid(0) == 0)
        return dg_error_set(err, DG_E_IO, "user %s: the switch from root did not hold", user);
    snprintf(note, note_size, "switched from root to %s (uid %d gid %d)", pw.pw_name,
             (int)pw.pw_uid, (int)pw.pw_gid);
    return 0;
}

static int listed(const int *v, int n, long long id)
{
    for (int i = 0; i < n; i++)
        if ((long long)v[i] == id)
            return 1;
    return 0;
}

int daccess_peer_allowed(const struct daccess_policy *p, int fd, const struct ucred *cred,
                         char *why, size_t why_size)
{
    if (why && why_size)
        why[0] = '\0';
    if (p->n_uids == 0 && p->n_gids == 0)
        return 1;
    if (cred->uid == p->self_uid || listed(p->uids, p->n_uids, (long long)cred->uid) ||
        listed(p->gids, p->n_gids, (long long)cred->gid))
        return 1;
#ifdef SO_PEERGROUPS
    if (p->n_gids > 0) {
        gid_t groups[256];
        socklen_t len = sizeof groups;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
            for (size_t i = 0; i < len / sizeof groups[0]; i++)
                if (listed(p->gids, p->n_gids, (long long)groups[i]))
                    return 1;
    }
#else
    (void)fd;
#endif
    if (why && why_size)
        snprintf(why, why_size, "uid %d (gid %d) is not allowed to use this daemon "
                 "(allow_uids, allow_gids)", (int)cred->uid, (int)cred->gid);
    return 0;
}
