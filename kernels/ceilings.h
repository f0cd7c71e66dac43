/*
 * ceilings.h - the two numbers every timing is read against (the device
 * METHOD's ceilings), measured on the GPU in hand: device memory
 * bandwidth, from a large device-to-device copy (bytes read + bytes
 * written over the time), and the bf16 matrix rate, from a large cuBLAS
 * GEMM on random data (fp32 accumulate).  Medians of timed repeats after
 * a warm-up, with device events.
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
};

/* Measure both on GPU dev (made current): a copy of 2 GiB and an 8192^3
 * GEMM, 20 timed repeats each.  Needs about 2.4 GiB free.  Errors:
 * DG_E_NOMEM, DG_E_CUDA, DG_E_CUBLAS. */
int dg_measure_ceilings(int dev, struct dg_ceilings *out, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
