/* gpu-need.c - the GPUs a dgemmad process needs (see gpu-need.h). */
#include "daemon/gpu-need.h"

#include <stdio.h>

int dgpu_needed(int tp, int one_gpu, int process_rank)
{
    return process_rank >= 0 || one_gpu ? 1 : tp;
}

int dgpu_devices_cover(int n_devices, int tp, int one_gpu, int process_rank)
{
    return n_devices == 0 || n_devices >= dgpu_needed(tp, one_gpu, process_rank);
}

int dgpu_auto_takes(int visible, int n_devices, int tp, int one_gpu, int process_rank, char *why,
                    size_t len)
{
    const int need = dgpu_needed(tp, one_gpu, process_rank);
    if (visible >= need && dgpu_devices_cover(n_devices, tp, one_gpu, process_rank))
        return 1;
    if (why && len)
        snprintf(why, len, "%s %d needs %d GPU(s) but %s %d", process_rank >= 0 ? "rank" : "tp",
                 process_rank >= 0 ? process_rank : tp, need,
                 visible < need ? "found" : "devices lists", visible < need ? visible : n_devices);
    return 0;
}
