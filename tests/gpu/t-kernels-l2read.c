/*
 * Description: dg_cuda_l2_read against its plain-C reference,
 * dg_ref_word_sum.  Buffers of random words (16 bytes to 16 MiB, sizes
 * that leave a part-filled last stride among them), each followed on the
 * GPU by guard bytes that would change the sum if read, are read with 1
 * to 2,000 blocks and 1 or 3 passes; the blocks' sums, added mod 2^32,
 * must be passes times the reference's sum.  The output is poisoned
 * (0xff) and followed by guard bytes: the guard must be intact, and a
 * second call over an output of zeros must give the same total (a block
 * that wrote nothing would leave the two apart).  Refusals (a pointer or
 * a size not a multiple of 16, no bytes, no pass, no block, no output)
 * with DG_E_INVAL and the GPU named.  Exit 77 where there is no GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/devmem.h"
#include "kernels/ops.h"
#include "lib/ref-ops.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define GUARD 256
#define GUARD_BYTE 0x5a

static const int64_t SIZES[] = {16, 4096, 1048576 + 48, 16 * 1048576};
static const int BLOCKS[] = {1, 7, 264, 2000};
static const int PASSES[] = {1, 3};

/* the blocks' words of out (blocks + GUARD bytes on the GPU) added, and
 * the guard checked; -1 (reported) on a failed copy or a changed guard */
static int total_of(const void *out, int blocks, uint32_t *total)
{
    struct dg_error err = {0};
    const size_t n = (size_t)blocks * 4;
    unsigned char *back = malloc(n + GUARD);
    int rc = 0;
    if (!back)
        return test_fail(__FILE__, __LINE__, "out of memory");
    if (dg_cuda_download(back, out, n + GUARD, 0, &err) < 0)
        rc = test_fail(__FILE__, __LINE__, "download: %s", err.msg);
    for (size_t i = n; rc == 0 && i < n + GUARD; i++)
        if (back[i] != GUARD_BYTE)
            rc = test_fail(__FILE__, __LINE__, "guard byte %zu after %d blocks' sums is %#x",
                           i - n, blocks, back[i]);
    *total = 0;
    for (int b = 0; rc == 0 && b < blocks; b++) {
        uint32_t w;
        memcpy(&w, back + 4 * (size_t)b, 4);
        *total += w;
    }
    free(back);
    return rc;
}

static int sums(void)
{
    struct dg_error err = {0};
    dg_stream_t st = NULL;
    gt_seed(29);
    CHECKF(dg_cuda_stream_create(&st, 0, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) {
        const int64_t bytes = SIZES[i], n = bytes / 4;
        uint32_t *h = malloc((size_t)bytes + GUARD);
        void *d;
        CHECK(h != NULL);
        for (int64_t k = 0; k < n; k++)
            h[k] = (uint32_t)(gt_next() >> 16); /* (gt_next gives 48 bits) */
        memset((char *)h + bytes, 0xa5, GUARD); /* read past the end: another sum */
        d = gt_upload(h, (size_t)bytes + GUARD, &err);
        CHECKF(d != NULL, "%s", err.msg);
        for (size_t b = 0; b < sizeof BLOCKS / sizeof BLOCKS[0]; b++)
            for (size_t p = 0; p < sizeof PASSES / sizeof PASSES[0]; p++) {
                const int blocks = BLOCKS[b], passes = PASSES[p];
                const uint32_t want = dg_ref_word_sum(h, n, (uint32_t)passes);
                uint32_t got = 0, again = 0;
                void *out = gt_out_alloc((size_t)blocks * 4, GUARD, GUARD_BYTE, &err);
                CHECKF(out != NULL, "%s", err.msg);
                CHECK_OK(dg_cuda_l2_read(d, bytes, passes, out, blocks, st, 0, &err), &err);
                CHECK_OK(dg_cuda_stream_sync(st, 0, &err), &err);
                CHECK(total_of(out, blocks, &got) == 0);
                CHECK_OK(dg_cuda_memset(out, 0, (size_t)blocks * 4, 0, &err), &err);
                CHECK_OK(dg_cuda_l2_read(d, bytes, passes, out, blocks, NULL, 0, &err), &err);
                CHECK_OK(dg_cuda_sync(0, &err), &err);
                CHECK(total_of(out, blocks, &again) == 0);
                CHECKF(got == want && again == want, "%lld bytes, %d blocks, %d passes: sums "
                       "%#x and %#x, the reference's %#x", (long long)bytes, blocks, passes,
                       got, again, want);
                dg_cuda_free(out);
            }
        dg_cuda_free(d);
        free(h);
    }
    dg_cuda_stream_destroy(st);
    return 0;
}

static int refusals(void)
{
    struct dg_error err = {0};
    unsigned char h[64] = {0};
    void *d = gt_upload(h, sizeof h, &err), *out;
    CHECKF(d != NULL, "%s", err.msg);
    out = gt_out_alloc(64, GUARD, GUARD_BYTE, &err);
    CHECKF(out != NULL, "%s", err.msg);
    CHECK_FAILS(dg_cuda_l2_read((char *)d + 8, 32, 1, out, 1, NULL, 0, &err), &err, DG_E_INVAL,
                "GPU 0");
    CHECK_FAILS(dg_cuda_l2_read(d, 24, 1, out, 1, NULL, 0, &err), &err, DG_E_INVAL,
                "multiples of 16");
    CHECK_FAILS(dg_cuda_l2_read(d, 0, 1, out, 1, NULL, 0, &err), &err, DG_E_INVAL, "L2 read");
    CHECK_FAILS(dg_cuda_l2_read(d, 64, 0, out, 1, NULL, 0, &err), &err, DG_E_INVAL, "0 passes");
    CHECK_FAILS(dg_cuda_l2_read(d, 64, 1, out, 0, NULL, 0, &err), &err, DG_E_INVAL, "0 blocks");
    CHECK_FAILS(dg_cuda_l2_read(d, 64, 1, NULL, 1, NULL, 0, &err), &err, DG_E_INVAL, "L2 read");
    CHECK_FAILS(dg_cuda_l2_read(NULL, 64, 1, out, 1, NULL, 0, &err), &err, DG_E_INVAL,
                "L2 read");
    CHECK_OK(dg_cuda_sync(0, &err), &err);
    dg_cuda_free(out);
    dg_cuda_free(d);
    return 0;
}

int main(void)
{
    const int rc = gt_setup("t-kernels-l2read");
    if (rc)
        return rc;
    TEST_CASE(sums);
    TEST_CASE(refusals);
    return test_finish();
}
