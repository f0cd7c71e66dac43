/*
 * Description: the GPU machine's environment works for dgemma: every CUDA
 * device opens, cuBLAS runs a checked bf16 GEMM on each, and NCCL joins all
 * devices and all-reduces correctly.  Exit 77 where there is no GPU.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/device-probe.h"
#include "tests/harness.h"

static int n_dev;
static int cur_dev;

static int case_cublas_on_device(void)
{
    struct dg_gpu_info gi;
    struct dg_error err = {0};
    unsigned dom, bus, slot, fn;
    char end;

    CHECK_OK(dg_gpu_probe(cur_dev, &gi, &err), &err);
    /* the PCI address, as nvidia-smi -i takes it: domain:bus:device.function */
    CHECK(sscanf(gi.pci_bus_id, "%x:%x:%x.%x%c", &dom, &bus, &slot, &fn, &end) == 4);
    printf("# GPU %d (%s): %s, compute %d.%d, %d SMs, %.1f GiB (%.1f free), runtime %d, driver %d, "
           "cuBLAS %d, bf16 GEMM rel err %.2e\n",
           gi.index, gi.pci_bus_id, gi.name, gi.cc_major, gi.cc_minor, gi.sm_count,
           (double)gi.mem_total / (1 << 30), (double)gi.mem_free / (1 << 30), gi.runtime_version,
           gi.driver_version, gi.cublas_version, gi.gemm_rel_err);
    return 0;
}

static int case_nccl_all_reduce(void)
{
    struct dg_error err = {0};
    int version = 0;

    CHECK_OK(dg_nccl_probe(n_dev, &version, &err), &err);
    printf("# NCCL %d: all-reduce of 4 MiB over %d GPU(s) exact\n", version, n_dev);
    return 0;
}

int main(void)
{
    struct dg_error err = {0};
    char name[64];

    /* NVLink multicast stays off on shared machines (device README) */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (dg_gpu_count(&n_dev, &err) != 0) {
        printf("not ok t-gpu-env/count: %s\n", err.msg);
        return 1;
    }
    if (n_dev == 0) {
        printf("skip t-gpu-env: no CUDA device\n");
        return 77;
    }
    for (cur_dev = 0; cur_dev < n_dev; cur_dev++) {
        snprintf(name, sizeof name, "cublas_gpu%d", cur_dev);
        test_run(name, case_cublas_on_device);
    }
    test_run("nccl_all_reduce", case_nccl_all_reduce);
    return test_finish();
}
