/*
 * ceilings.h - the two numbers every timing is read against (the device
 * METHOD's ceilings), measured on the GPU in hand: device memory
 * bandwidth, from a large device-to-device copy (bytes read + bytes
 * written over the time), and the bf16 matrix rate, from a large cuBLAS
 * GEMM on random data (fp32 accumulate).  Medians of timed repeats after
 * a warm-up, with device events.  Beside them, not a ceiling the rooflines
 * use: the L2's read bandwidth, from a buffer that fits in it read many
 * times over by every multiprocessor (dg_cuda_l2_read), for the kernels
 * bound by the L2 rather than the DRAM (the experts' launch at batch 1).
 */
#ifndef DG_KERNELS_CEILINGS_H
#define DG_KERNELS_CEILINGS_H

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dg_ceilings {
    double copy_gbps;        /* GB/s (1e9 bytes), read + write */
    double copy_bytes;       /* bytes copied per repeat */
    double gemm_tflops;      /* bf16 dense, fp32 accumulate */
    int gemm_n;              /* an n x n x n product */
    double l2_read_gbps;     /* GB/s read from the L2 */
    double l2_bytes;         /* the buffer read, bytes (64 passes a repeat) */
};

/* Measure them on GPU dev (made current): a copy of 2 GiB, an 8192^3
 * GEMM and 64 reads of a 16 MiB buffer, 20 timed repeats each.  Needs
 * about 2 GiB free (the copy's buffers serve the others).  Errors:
 * DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS. */
int dg_measure_ceilings(int dev, struct dg_ceilings *out, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
