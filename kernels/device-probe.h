/*
 * device-probe.h - find the GPUs and prove the libraries work on each:
 * open cuBLAS and run a checked bf16 GEMM per device, and join all devices
 * in one NCCL communicator and check an all-reduce.  The daemon logs these
 * at start-up; `make test-gpu` runs them as the first GPU test.
 */
#ifndef DG_DEVICE_PROBE_H
#define DG_DEVICE_PROBE_H

#include "lib/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dg_gpu_info {
    int index;
    char name[256];
    char pci_bus_id[32];                 /* "0000:18:00.0": the board nvidia-smi -i names */
    int cc_major, cc_minor;
    int sm_count;
    unsigned long long mem_total, mem_free;
    int runtime_version, driver_version; /* 13000 = 13.0 */
    int cublas_version;                  /* e.g. 130100 */
    double gemm_rel_err;                 /* ||C - ref|| / ||ref|| of the bf16 GEMM check */
};

/* Number of CUDA devices; 0 (not an error) when there is no driver or no
 * device.  Errors: DG_E_CUDA for anything else. */
int dg_gpu_count(int *n, struct dg_error *err);

/* Describe device dev and check cuBLAS on it: C = A.B with A [64 x 80],
 * B [80 x 48] in bf16, fp32 accumulate and output, against a host
 * reference over the same bf16 values; C is poisoned with NaN before the
 * call and followed by guard words that must survive.  Fails (DG_E_CUBLAS)
 * if the relative error exceeds 1e-5 or any element stays unwritten. */
int dg_gpu_probe(int dev, struct dg_gpu_info *info, struct dg_error *err);

/* Create one NCCL communicator over devices 0..ndev-1 (ncclCommInitAll) and
 * all-reduce (sum) 1 Mi floats per device, each rank contributing
 * (rank + 1) * pattern(i); check the exact sums.  *version receives NCCL's
 * version code. Errors: DG_E_NCCL, DG_E_CUDA, DG_E_INTERNAL (wrong sum). */
int dg_nccl_probe(int ndev, int *version, struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
