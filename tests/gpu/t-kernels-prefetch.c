/*
 * Description: dg_cuda_l2_prefetch, whose plain-C reference is the
 * identity: it computes nothing and must write nothing.  Buffers of random
 * bytes (16 bytes to past 3 MB: one thread's 64 KB chunk, one past it,
 * several blocks' worth) followed by guard bytes are prefetched whole and
 * in part (both ends moved in by 16), on the default stream and on one of
 * the test's own, then read back: every byte, the guards included, as
 * uploaded.  Refusals (a pointer or a size not a multiple of 16, a
 * negative size, no pointer for a non-zero size) with DG_E_INVAL and the
 * GPU named; 0 bytes with no pointer accepted.  Exit 77 where there is no
 * GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 256

static const int64_t SIZES[] = {16, 4096, 65536, 65552, 3 * 1048576 + 48};

/* n random bytes then GUARD bytes of 0xa5, malloc'd; NULL when out of
 * memory */
static unsigned char *random_bytes(size_t n)
{
    unsigned char *h = malloc(n + GUARD);
    if (!h)
        return NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(gt_next() >> 40);
    memset(h + n, 0xa5, GUARD);
    return h;
}

/* the device copy of n + GUARD bytes the same as h; -1 (reported) where
 * not */
static int same_bytes(const unsigned char *h, const void *d, size_t n, const char *what)
{
    struct dg_error err = {0};
    unsigned char *back = malloc(n + GUARD);
    int rc = 0;
    if (!back)
        return test_fail(__FILE__, __LINE__, "%s: out of memory", what);
    if (dg_cuda_download(back, d, n + GUARD, 0, &err) < 0)
        rc = test_fail(__FILE__, __LINE__, "%s: download: %s", what, err.msg);
    for (size_t i = 0; rc == 0 && i < n + GUARD; i++)
        if (back[i] != h[i])
            rc = test_fail(__FILE__, __LINE__, "%s: byte %zu of %zu is %#x, was %#x", what, i,
                           n, back[i], h[i]);
    free(back);
    return rc;
}

static int unchanged(void)
{
    struct dg_error err = {0};
    dg_stream_t st = NULL;
    gt_seed(17);
    CHECKF(dg_cuda_stream_create(&st, 0, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) {
        const int64_t n = SIZES[i];
        unsigned char *h = random_bytes((size_t)n);
        void *d;
        CHECK(h != NULL);
        d = gt_upload(h, (size_t)n + GUARD, &err);
        CHECKF(d != NULL, "%s", err.msg);
        CHECK_OK(dg_cuda_l2_prefetch(d, n, NULL, 0, &err), &err);
        if (n >= 48)
            CHECK_OK(dg_cuda_l2_prefetch((char *)d + 16, n - 32, st, 0, &err), &err);
        CHECK_OK(dg_cuda_l2_prefetch(d, n, st, 0, &err), &err);
        CHECK_OK(dg_cuda_stream_sync(st, 0, &err), &err);
        CHECK_OK(dg_cuda_sync(0, &err), &err);
        CHECKF(same_bytes(h, d, (size_t)n, "prefetched") == 0, "%lld bytes", (long long)n);
        dg_cuda_free(d);
        free(h);
    }
    dg_cuda_stream_destroy(st);
    return 0;
}

static int refusals(void)
{
    struct dg_error err = {0};
    unsigned char *h;
    void *d;
    gt_seed(18);
    h = random_bytes(64);
    CHECK(h != NULL);
    d = gt_upload(h, 64 + GUARD, &err);
    CHECKF(d != NULL, "%s", err.msg);
    CHECK_FAILS(dg_cuda_l2_prefetch((char *)d + 8, 32, NULL, 0, &err), &err, DG_E_INVAL,
                "GPU 0");
    CHECK_FAILS(dg_cuda_l2_prefetch(d, 24, NULL, 0, &err), &err, DG_E_INVAL, "multiples of 16");
    CHECK_FAILS(dg_cuda_l2_prefetch(d, -16, NULL, 0, &err), &err, DG_E_INVAL, "L2 prefetch");
    CHECK_FAILS(dg_cuda_l2_prefetch(NULL, 16, NULL, 0, &err), &err, DG_E_INVAL, "L2 prefetch");
    CHECK_OK(dg_cuda_l2_prefetch(NULL, 0, NULL, 0, &err), &err);
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    CHECK(same_bytes(h, d, 64, "refused") == 0);
    dg_cuda_free(d);
    free(h);
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-prefetch");
    if (rc)
        return rc;
    TEST_CASE(unchanged);
    TEST_CASE(refusals);
    return test_finish();
}
