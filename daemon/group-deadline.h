/*
 * group-deadline.h - a bound on how long the tensor-parallel ranks of a
 * dgemmad process take to form their NCCL group at start-up
 * (group_timeout, dgemmad.yaml(5)).
 *
 * ncclCommInitRank waits for every rank of the group and cannot be
 * called off: a rank of a multi-process group that never starts (or one
 * whose NCCL_COMM_ID names the wrong host), or a rank of one process that
 * fails inside it, would leave the others there for good.  A deadline
 * counts this process's ranks as the backend reports each joined
 * (dg_cuda_backend_options.joined); if they are not all in by the
 * deadline, its thread calls `expired`, which in dgemmad logs why and
 * ends the process.  Kept apart from CUDA so that it runs, and is
 * tested, anywhere.
 */
#ifndef DG_DAEMON_GROUP_DEADLINE_H
#define DG_DAEMON_GROUP_DEADLINE_H

#include "lib/error.h"

struct dgroup_deadline;

/* Called once, on the deadline's own thread, when `seconds` passed with
 * `joined` of the `need` ranks in. */
typedef void (*dgroup_expired_fn)(void *arg, int joined, int need, double seconds);

/* Start a deadline of `seconds` (> 0) for `need` (>= 1) ranks to join: a
 * thread that waits until they have (then ends, calling nothing), until
 * dgroup_deadline_stop, or until the deadline, where it calls `expired`.
 * seconds 0: no deadline (*out NULL; the other calls accept NULL).
 * Errors: DG_E_INVAL (seconds negative or not finite, need < 1, expired
 * NULL), DG_E_NOMEM, DG_E_INTERNAL (the thread). */
int dgroup_deadline_start(double seconds, int need, dgroup_expired_fn expired, void *arg,
                          struct dgroup_deadline **out, struct dg_error *err);

/* One more rank joined (any thread; `rank` is for the signature of
 * dg_cuda_backend_options.joined, unused).  d may be NULL. */
void dgroup_deadline_joined(void *d, int rank);

/* How many ranks have joined so far (0 for NULL). */
int dgroup_deadline_count(struct dgroup_deadline *d);

/* Stop waiting (if the thread still does, it ends without calling
 * `expired`; if `expired` is running, this waits for it), join the thread
 * and free d.  NULL is a no-op. */
void dgroup_deadline_stop(struct dgroup_deadline *d);

#endif
