/* gpu-util.c - see gpu-util.h. */
#include "tests/gpu/gpu-util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int gt_rand_elts(enum dg_elt e, size_t n, float amp, void **h, float **f)
{
    float *v;
    if (e == DG_ELT_BF16) {
        uint16_t *b = NULL;
        const int rc = gt_rand_bf16(n, amp, &b, f);
        *h = b;
        return rc;
    }
    v = malloc(n * sizeof *v + 1);
    *h = malloc(n * sizeof *v + 1);
    if (!v || !*h) {
        free(v);
        free(*h);
        *h = NULL;
        *f = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = gt_uniform() * amp;
    memcpy(*h, v, n * sizeof *v);
    *f = v;
    return 0;
}

void *gt_out_alloc(size_t bytes, size_t guard_bytes, unsigned char guard, struct dg_error *err)
{
    unsigned char *g = malloc(guard_bytes + 1);
    void *d = NULL;
    if (!g) {
        dg_error_set(err, DG_E_NOMEM, "out of memory");
        return NULL;
    }
    memset(g, guard, guard_bytes);
    if (dg_cuda_alloc(&d, bytes + guard_bytes, 0, err) < 0 ||
        (bytes && dg_cuda_memset(d, 0xff, bytes, 0, err) < 0) ||
        (guard_bytes && dg_cuda_upload((unsigned char *)d + bytes, g, guard_bytes, 0, err) < 0)) {
        dg_cuda_free(d);
        d = NULL;
    }
    free(g);
    return d;
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
