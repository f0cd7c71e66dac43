/*
 * gpu-need.h - how many GPUs the ranks of one dgemmad process need, and
 * whether backend auto takes the GPUs it finds (daemon/main.c's choice,
 * kept apart from CUDA so that it runs, and is tested, anywhere).
 *
 * The rules (dgemmad.yaml(5), backend; dgemmad(8), MULTI-PROCESS MODE):
 * the tp ranks of one process take a GPU each, or one GPU for all with
 * one_gpu; a rank of a multi-process group is one rank, on one GPU
 * (devices[rank] where the list is that long, its one entry where it has
 * one, else GPU rank modulo the visible ones).
 */
#ifndef DG_DAEMON_GPU_NEED_H
#define DG_DAEMON_GPU_NEED_H

#include <stddef.h>

/* The GPUs this process's ranks need: 1 for a rank of a multi-process
 * group (process_rank >= 0) or with one_gpu, else tp. */
int dgpu_needed(int tp, int one_gpu, int process_rank);

/* Whether a devices list of n_devices entries (0: not set) names enough
 * GPUs for this process's ranks: at least dgpu_needed of them (so any
 * list in a multi-process rank, where one entry serves every rank).  1 or
 * 0. */
int dgpu_devices_cover(int n_devices, int tp, int one_gpu, int process_rank);

/* Whether backend auto takes the GPU backend with `visible` GPUs found:
 * 1 when there are at least dgpu_needed of them and a devices list, if
 * set, covers the ranks (dgpu_devices_cover); else 0, with the reason for
 * the log in why (at most len bytes, NUL-terminated; why may be NULL). */
int dgpu_auto_takes(int visible, int n_devices, int tp, int one_gpu, int process_rank, char *why,
                    size_t len);

#endif
