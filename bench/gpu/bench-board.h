/*
 * bench-board.h - the line a GPU benchmark prints first to say which card
 * ran it: the CUDA device's name and PCI address, and that board's VBIOS,
 * InfoROM image and driver as nvidia-smi reports them.  H100s of two
 * VBIOS versions read the experts' stage 0.8 ms a step apart
 * (docs/notes.md, "The spread between starts is the board"), so figures
 * from two runs compare only where this line matches; bench/perf/run.sh
 * keeps the same fields in its board.csv.
 */
#ifndef DG_BENCH_BOARD_H
#define DG_BENCH_BOARD_H

#include <stdio.h>
#include <string.h>

#include "kernels/device-probe.h"

/* Prints "board, GPU dev: NAME (BUS), VBIOS V, InfoROM I, driver D" to
 * stdout; where nvidia-smi is missing or says nothing of the bus id, the
 * line says so in place of the three.  0, or -1 with err set when the
 * device cannot be described (dg_gpu_probe's errors). */
static inline int bench_print_board(int dev, struct dg_error *err)
{
    struct dg_gpu_info gi;
    char cmd[160], smi[256] = "";
    FILE *p;

    if (dg_gpu_probe(dev, &gi, err) < 0)
        return -1;
    /* (the bus id is the driver's own string: hex digits, ':' and '.') */
    snprintf(cmd, sizeof cmd, "nvidia-smi --query-gpu=vbios_version,inforom.img,driver_version "
             "--format=csv,noheader -i %s 2>/dev/null", gi.pci_bus_id);
    if ((p = popen(cmd, "r")) != NULL) {
        if (!fgets(smi, sizeof smi, p))
            smi[0] = '\0';
        if (pclose(p) != 0)
            smi[0] = '\0';
    }
    smi[strcspn(smi, "\n")] = '\0';
    {
        char vbios[64], inforom[64], driver[64];
        if (sscanf(smi, "%63[^,], %63[^,], %63s", vbios, inforom, driver) == 3)
            printf("board, GPU %d: %s (%s), VBIOS %s, InfoROM %s, driver %s\n", dev, gi.name,
                   gi.pci_bus_id, vbios, inforom, driver);
        else
            printf("board, GPU %d: %s (%s), VBIOS unknown (nvidia-smi gave nothing)\n", dev,
                   gi.name, gi.pci_bus_id);
    }
    return 0;
}

#endif
