/*
 * Description: the CPU collectives for rank threads.  All-reduce (sum and
 * max; float, double, int64) and all-gather give every rank the result a
 * serial reference computes, bit for bit the same on every rank, for 1 to
 * 5 ranks and sizes from 1 to 100,000; calls and bytes are counted; a rank
 * that fails aborts the group and the others' collectives return an error
 * instead of waiting forever; after a reset the group works again.
 */
#include <stdlib.h>
#include <string.h>

#include "lib/coll.h"
#include "lib/tp-forward.h"
#include "tests/harness.h"

struct ctx {
    struct dg_coll_cpu_group *g;
    int n;
    size_t len;
    float *f[8];    /* per rank inputs, reduced in place */
    double *d[8];
    int64_t *i[8];
    float *gathered[8];
    int fail_rank;  /* -1: none */
};

static float val_f(int r, size_t k)
{
    return (float)((int)((k * 2654435761u + (size_t)r * 97) % 2001) - 1000) / 7.0f;
}

static int rank_fn(void *p, int r, struct dg_error *err)
{
    struct ctx *c = p;
    struct dg_coll *coll = dg_coll_cpu_rank(c->g, r);
    int rc;
    for (size_t k = 0; k < c->len; k++) {
        c->f[r][k] = val_f(r, k);
        c->d[r][k] = val_f(r, k) * 1e-3;
        c->i[r][k] = (int64_t)(k * 31 + (size_t)r) % 1000 - 500;
    }
    if (r == c->fail_rank)
        return dg_error_set(err, DG_E_NOMEM, "rank %d gives up", r);
    if ((rc = dg_all_reduce(coll, c->f[r], c->len, DG_COLL_F32, DG_COLL_SUM, err)) < 0 ||
        (rc = dg_all_reduce(coll, c->d[r], c->len, DG_COLL_F64, DG_COLL_MAX, err)) < 0 ||
        (rc = dg_all_reduce(coll, c->i[r], c->len, DG_COLL_I64, DG_COLL_SUM, err)) < 0)
        return rc;
    {
        float mine[3] = {(float)r, (float)r + 0.5f, (float)(r * r)};
        if ((rc = dg_all_gather(coll, mine, c->gathered[r], sizeof mine, err)) < 0)
            return rc;
    }
    return dg_barrier(coll, err);
}

static int run(int n, size_t len, int fail_rank, struct dg_coll_cpu_group *g, int *failed,
               struct dg_error *errs, struct ctx *c)
{
    memset(c, 0, sizeof *c);
    c->g = g;
    c->n = n;
    c->len = len;
    c->fail_rank = fail_rank;
    for (int r = 0; r < n; r++) {
        c->f[r] = malloc(sizeof(float) * len);
        c->d[r] = malloc(sizeof(double) * len);
        c->i[r] = malloc(sizeof(int64_t) * len);
        c->gathered[r] = malloc(sizeof(float) * 3 * (size_t)n);
    }
    return dg_tp_run(n, rank_fn, c, g, errs, failed);
}

static void free_ctx(struct ctx *c)
{
    for (int r = 0; r < c->n; r++) {
        free(c->f[r]);
        free(c->d[r]);
        free(c->i[r]);
        free(c->gathered[r]);
    }
}

static int reduce_and_gather(void)
{
    static const size_t lens[] = {1, 7, 1000, 100000};
    for (int n = 1; n <= 5; n++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            struct dg_coll_cpu_group *g;
            struct dg_error errs[8], err;
            struct ctx c;
            int failed;
            const size_t len = lens[li];
            CHECK_OK(dg_coll_cpu_group_create(n, &g, &err), &err);
            CHECK(run(n, len, -1, g, &failed, errs, &c) == 0 && failed == -1);
            for (size_t k = 0; k < len; k++) {
                float fs = val_f(0, k);
                double dm = val_f(0, k) * 1e-3;
                int64_t is = (int64_t)(k * 31) % 1000 - 500;
                for (int r = 1; r < n; r++) {
                    fs += val_f(r, k); /* rank order, as specified */
                    if (val_f(r, k) * 1e-3 > dm)
                        dm = val_f(r, k) * 1e-3;
                    is += (int64_t)(k * 31 + (size_t)r) % 1000 - 500;
                }
                for (int r = 0; r < n; r++)
                    CHECKF(c.f[r][k] == fs && c.d[r][k] == dm && c.i[r][k] == is,
                           "%d ranks, %zu values: element %zu on rank %d", n, len, k, r);
            }
            for (int r = 0; r < n; r++)
                for (int q = 0; q < n; q++)
                    CHECK(c.gathered[r][3 * q] == (float)q &&
                          c.gathered[r][3 * q + 2] == (float)(q * q));
            if (n > 1) {
                struct dg_coll *c0 = dg_coll_cpu_rank(g, 0);
                CHECK(c0->stats.calls[DG_COLL_ALL_REDUCE] == 3 &&
                      c0->stats.bytes[DG_COLL_ALL_REDUCE] == len * (4 + 8 + 8));
                CHECK(c0->stats.calls[DG_COLL_ALL_GATHER] == 1 &&
                      c0->stats.bytes[DG_COLL_ALL_GATHER] == 12);
                CHECK(c0->stats.calls[DG_COLL_BARRIER] == 1);
            }
            free_ctx(&c);
            dg_coll_cpu_group_free(g);
        }
    return 0;
}

static int failure_aborts(void)
{
    for (int n = 2; n <= 4; n++)
        for (int bad = 0; bad < n; bad++) {
            struct dg_coll_cpu_group *g;
            struct dg_error errs[8], err;
            struct ctx c;
            int failed, rc;
            CHECK_OK(dg_coll_cpu_group_create(n, &g, &err), &err);
            rc = run(n, 100, bad, g, &failed, errs, &c);
            /* the cause is reported, not the ranks told to give up */
            CHECKF(rc == -DG_E_NOMEM && failed == bad && strstr(errs[bad].msg, "gives up"),
                   "%d ranks, rank %d failing: rc %d, failed %d", n, bad, rc, failed);
            for (int r = 0; r < n; r++)
                if (r != bad)
                    CHECK(errs[r].code == DG_E_INTERNAL && strstr(errs[r].msg, "aborted"));
            free_ctx(&c);
            /* reset: the group works again */
            CHECK(run(n, 10, -1, g, &failed, errs, &c) == 0);
            CHECK(c.f[0][3] == c.f[n - 1][3]);
            free_ctx(&c);
            dg_coll_cpu_group_free(g);
        }
    return 0;
}

int main(void)
{
    TEST_CASE(reduce_and_gather);
    TEST_CASE(failure_aborts);
    return test_finish();
}
