/* gpu-util.c - see gpu-util.h. */
#include "tests/gpu/gpu-util.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/device-probe.h"
#include "kernels/devmem.h"
#include "lib/dtype.h"

static uint64_t state = 0x853c49e6748fea9bull;

void gt_seed(uint64_t seed)
{
    state = seed;
}

uint64_t gt_next(void)
{
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 16;
}

float gt_uniform(void)
{
    return (float)(gt_next() & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

int gt_rand_bf16(size_t n, float amp, uint16_t **h, float **f)
{
    *h = malloc(n * sizeof **h + 1);
    *f = malloc(n * sizeof **f + 1);
    if (!*h || !*f) {
        free(*h);
        free(*f);
        *h = NULL;
        *f = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        (*h)[i] = dg_f32_to_bf16(gt_uniform() * amp);
        (*f)[i] = dg_bf16_to_f32((*h)[i]);
    }
    return 0;
}

void *gt_upload(const void *h, size_t bytes, struct dg_error *err)
{
    void *d = NULL;
    if (dg_cuda_alloc(&d, bytes ? bytes : 1, 0, err) < 0)
        return NULL;
    if (bytes && dg_cuda_upload(d, h, bytes, 0, err) < 0) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}

int gt_setup(const char *prog)
{
    struct dg_error err = {0};
    int n = 0;
    if (dg_gpu_count(&n, &err) < 0 || n < 1) {
        printf("skip %s: no GPU here%s%s\n", prog, err.msg[0] ? ": " : "", err.msg);
        return 77;
    }
    if (dg_cuda_use(0, &err) < 0) {
        printf("not ok %s/setup: %s\n", prog, err.msg);
        return 1;
    }
    return 0;
}
