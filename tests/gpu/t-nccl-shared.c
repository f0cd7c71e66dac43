/*
 * Description: the collectives of a group on one shared GPU (nccl.h,
 * dg_nccl_init_shared), which let the tensor-parallel tests run on one
 * GPU, against the CPU collectives (lib/coll-cpu.c) as the reference.
 *
 *   all_reduce: 2, 3 and 4 rank threads, each on its own stream of GPU 0,
 *     reduce fresh random inputs of 1, 1,000 and 100,003 elements: fp32
 *     sum and max, fp64 sum, int64 sum and max (equal to the bit to what
 *     the CPU group gives for the same inputs), bf16 sum (equal to the
 *     rank-order fp32 sum of the bf16 inputs rounded once); the bytes
 *     after each buffer (guards) untouched; eight calls in a row each
 *     reading the previous result.
 *   all_gather: the same ranks gather 1, 12,288 (a sampler step's
 *     records at 256 positions) and 100,003 bytes into outputs poisoned
 *     before, every rank's part in its place, guards untouched.
 *   host_face: dg_nccl_coll's host-buffer all-reduce and barrier through
 *     the group, calls counted.
 *   abort: rank 1 joins and never comes to its all-reduce, then aborts
 *     its communicator after 200 ms (as a failed rank does): rank 0's
 *     call ends with DG_E_NCCL; after a reset, new communicators work.
 *   slow_rank: rank 1 pauses after each collective's second meeting
 *     (dg_nccl_shared_lag), so rank 0 returns and frees its communicator
 *     while rank 1 is still to wait on rank 0's events: both calls of
 *     both ranks succeed with the right sums.
 * Exit 77 without a GPU.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/devmem.h"
#include "kernels/nccl.h"
#include "lib/coll.h"
#include "tests/gpu/gpu-util.h"
#include "tests/harness.h"

#define MAXR 4
#define GUARD 64
#define REPEAT 8

struct group_run {
    int n;
    struct dg_nccl_shared *g;
    struct dg_coll_cpu_group *cpu; /* the reference */
    size_t len;
    int what;                      /* an index into KINDS, or -1: all-gather */
    int rc[MAXR];
    struct dg_error err[MAXR];
    int bad[MAXR];                 /* mismatches seen by rank r */
};

struct kind {
    const char *name;
    enum dg_nccl_type t;
    enum dg_coll_type ct;          /* the CPU type (bf16: none, computed here) */
    enum dg_coll_op op;
    size_t size;
};

static const struct kind KINDS[] = {
    {"fp32 sum", DG_NCCL_F32, DG_COLL_F32, DG_COLL_SUM, 4},
    {"fp32 max", DG_NCCL_F32, DG_COLL_F32, DG_COLL_MAX, 4},
    {"fp64 sum", DG_NCCL_F64, DG_COLL_F64, DG_COLL_SUM, 8},
    {"int64 sum", DG_NCCL_I64, DG_COLL_I64, DG_COLL_SUM, 8},
    {"int64 max", DG_NCCL_I64, DG_COLL_I64, DG_COLL_MAX, 8},
    {"bf16 sum", DG_NCCL_BF16, DG_COLL_F32, DG_COLL_SUM, 2},
};
#define N_KINDS (int)(sizeof KINDS / sizeof KINDS[0])

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (finite inputs) */
    return (uint16_t)(u >> 16);
}

static float f_of_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rank r's input element i of kind k, as bytes at p. */
static void input(const struct kind *k, int r, size_t i, uint64_t round, void *p)
{
    const uint64_t x = (i * 2654435761u + (uint64_t)r * 40503u + round * 977u) % 200003u;
    const double v = ((double)x - 100001.0) / 9.0;
    switch (k->t) {
    case DG_NCCL_F32: *(float *)p = (float)v; break;
    case DG_NCCL_F64: *(double *)p = v / 7.0; break;
    case DG_NCCL_I64: *(int64_t *)p = (int64_t)x * 1000003 - 100000000000LL; break;
    case DG_NCCL_BF16: *(uint16_t *)p = bf16_of((float)v / 64.0f); break;
    }
}

struct rank_arg {
    struct group_run *run;
    int r;
};

/* One rank: REPEAT all-reduces (each round's input: fresh values plus the
 * previous result, so the result must have landed) or one all-gather,
 * each checked against the reference. */
static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    struct group_run *run = a->run;
    const int r = a->r, n = run->n;
    struct dg_error *err = &run->err[r];
    struct dg_nccl *c = NULL;
    dg_stream_t stream = NULL;
    void *d = NULL;
    unsigned char *h = NULL, *want = NULL, *got = NULL;
    int rc;

    if ((rc = dg_cuda_use(0, err)) < 0 || (rc = dg_cuda_stream_create(&stream, 0, err)) < 0 ||
        (rc = dg_nccl_init_shared(&c, run->g, r, 0, stream, err)) < 0)
        goto out;
    if (run->what < 0) {
        const size_t bytes = run->len, total = bytes * (size_t)n;
        unsigned char *send;
        h = malloc(bytes + 1);
        got = malloc(total + GUARD);
        want = malloc(total);
        if (!h || !got || !want) {
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < bytes; i++)
            h[i] = (unsigned char)(i * 131 + (size_t)r * 17 + 1);
        if (!(send = gt_upload(h, bytes, err)) ||
            !(d = gt_out_alloc(total, GUARD, 0x5a, err)) ||
            dg_cuda_sync(0, err) < 0) { /* (the copies above are not on this rank's stream) */
            dg_cuda_free(send);
            rc = -DG_E_CUDA;
            goto out;
        }
        rc = dg_nccl_all_gather(c, send, d, bytes, err);
        if (rc == 0 && (rc = dg_cuda_stream_sync(stream, 0, err)) == 0)
            rc = dg_cuda_download(got, d, total + GUARD, 0, err);
        dg_cuda_free(send);
        if (rc < 0)
            goto out;
        /* the reference: the CPU group's all-gather of the same bytes */
        if ((rc = dg_all_gather(dg_coll_cpu_rank(run->cpu, r), h, want, bytes, err)) < 0)
            goto out;
        if (memcmp(got, want, total))
            run->bad[r]++;
        for (size_t i = 0; i < GUARD; i++)
            if (got[total + i] != 0x5a)
                run->bad[r]++;
    } else {
        const struct kind *k = &KINDS[run->what];
        const size_t bytes = run->len * k->size, wbytes = run->len * 8;
        h = malloc(bytes + GUARD);
        got = malloc(bytes + GUARD);
        want = malloc(wbytes);     /* the reference, as doubles or int64 or floats */
        if (!h || !got || !want) {
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = dg_cuda_alloc(&d, bytes + GUARD, 0, err)) < 0)
            goto out;
        memset(h + bytes, 0xa5, GUARD);
        for (uint64_t round = 0; round < REPEAT; round++) {
            /* the input: fresh values, plus (after the first round) the
             * previous result read back from the device */
            for (size_t i = 0; i < run->len; i++) {
                unsigned char v[8];
                input(k, r, i, round, v);
                if (round == 0) {
                    memcpy(h + i * k->size, v, k->size);
                    continue;
                }
                switch (k->t) {
                case DG_NCCL_F32: ((float *)h)[i] = ((float *)got)[i] * 0.25f + *(float *)v; break;
                case DG_NCCL_F64: ((double *)h)[i] = ((double *)got)[i] * 0.25 + *(double *)v; break;
                case DG_NCCL_I64: ((int64_t *)h)[i] = ((int64_t *)got)[i] / 4 + *(int64_t *)v; break;
                case DG_NCCL_BF16:
                    ((uint16_t *)h)[i] = bf16_of(f_of_bf16(((uint16_t *)got)[i]) * 0.25f +
                                                 f_of_bf16(*(uint16_t *)v));
                    break;
                }
            }
            /* (on this rank's stream, so that its event follows the copy) */
            if ((rc = dg_cuda_copy_async(d, h, bytes + GUARD, stream, 0, err)) < 0 ||
                (rc = dg_nccl_all_reduce(c, d, run->len, k->t, k->op, err)) < 0 ||
                (rc = dg_cuda_stream_sync(stream, 0, err)) < 0 ||
                (rc = dg_cuda_download(got, d, bytes + GUARD, 0, err)) < 0)
                goto out;
            /* the reference */
            if (k->t == DG_NCCL_BF16) {
                float *f = (float *)want;
                for (size_t i = 0; i < run->len; i++)
                    f[i] = f_of_bf16(((uint16_t *)h)[i]);
                if ((rc = dg_all_reduce(dg_coll_cpu_rank(run->cpu, r), f, run->len, DG_COLL_F32,
                                        DG_COLL_SUM, err)) < 0)
                    goto out;
                for (size_t i = 0; i < run->len; i++)
                    if (((uint16_t *)got)[i] != bf16_of(f[i]))
                        run->bad[r]++;
            } else {
                memcpy(want, h, bytes);
                if ((rc = dg_all_reduce(dg_coll_cpu_rank(run->cpu, r), want, run->len, k->ct,
                                        k->op, err)) < 0)
                    goto out;
                if (memcmp(got, want, bytes))
                    run->bad[r]++;
            }
            for (size_t i = 0; i < GUARD; i++)
                if (got[bytes + i] != 0xa5)
                    run->bad[r]++;
        }
    }
out:
    if (rc < 0) {
        dg_coll_cpu_abort(run->cpu);
        dg_nccl_abort(c);
    }
    run->rc[r] = rc;
    dg_cuda_free(d);
    dg_nccl_free(c);
    dg_cuda_stream_destroy(stream);
    free(h);
    free(want);
    free(got);
    return NULL;
}

static int run_group(int n, int what, size_t len)
{
    struct group_run run;
    struct rank_arg args[MAXR];
    pthread_t th[MAXR];
    struct dg_error err = {0};
    memset(&run, 0, sizeof run);
    run.n = n;
    run.what = what;
    run.len = len;
    CHECK_OK(dg_nccl_shared_create(n, &run.g, &err), &err);
    CHECK_OK(dg_coll_cpu_group_create(n, &run.cpu, &err), &err);
    for (int r = 0; r < n; r++) {
        args[r] = (struct rank_arg){&run, r};
        CHECK(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        CHECKF(run.rc[r] == 0, "%d ranks, %s, %zu: rank %d: %s", n,
               what < 0 ? "all-gather" : KINDS[what].name, len, r, run.err[r].msg);
        CHECKF(run.bad[r] == 0, "%d ranks, %s, %zu: rank %d: %d mismatches", n,
               what < 0 ? "all-gather" : KINDS[what].name, len, r, run.bad[r]);
    }
    dg_nccl_shared_free(run.g);
    dg_coll_cpu_group_free(run.cpu);
    return 0;
}

static int case_all_reduce(void)
{
    static const size_t lens[] = {1, 1000, 100003};
    for (int n = 2; n <= MAXR; n++)
        for (int k = 0; k < N_KINDS; k++)
            for (int i = 0; i < 3; i++)
                CHECK(run_group(n, k, lens[i]) == 0);
    printf("# 2..4 ranks, %d kinds, 3 sizes, %d calls each: equal to the CPU group's\n", N_KINDS,
           REPEAT);
    return 0;
}

static int case_all_gather(void)
{
    static const size_t lens[] = {1, 12288, 100003};
    for (int n = 2; n <= MAXR; n++)
        for (int i = 0; i < 3; i++)
            CHECK(run_group(n, -1, lens[i]) == 0);
    return 0;
}

/* ---- the host face and abort -------------------------------------------------- */

struct host_run {
    struct dg_nccl_shared *g;
    int n, late;                    /* late: rank 1 never calls (abort case) */
    struct dg_nccl *c[MAXR];
    dg_stream_t late_stream;        /* rank 1's then, freed after its communicator */
    int rc[MAXR], code[MAXR];
    double sums[MAXR][3];
    uint64_t calls[MAXR];
};

struct host_arg {
    struct host_run *run;
    int r;
};

static void *host_rank(void *p)
{
    struct host_arg *a = p;
    struct host_run *run = a->run;
    const int r = a->r;
    struct dg_error err = {0};
    dg_stream_t stream = NULL;
    int rc;
    if ((rc = dg_cuda_use(0, &err)) < 0 || (rc = dg_cuda_stream_create(&stream, 0, &err)) < 0 ||
        (rc = dg_nccl_init_shared(&run->c[r], run->g, r, 0, stream, &err)) < 0)
        goto out;
    if (run->late && r == 1)
        goto out;
    {
        struct dg_coll *coll = dg_nccl_coll(run->c[r]);
        double v[3] = {r + 1.0, r * 0.5, -1.0 * r};
        if ((rc = dg_all_reduce(coll, v, 3, DG_COLL_F64, DG_COLL_SUM, &err)) < 0 ||
            (rc = dg_barrier(coll, &err)) < 0)
            goto out;
        memcpy(run->sums[r], v, sizeof v);
        run->calls[r] = coll->stats.calls[DG_COLL_ALL_REDUCE] + coll->stats.calls[DG_COLL_BARRIER];
    }
out:
    run->rc[r] = rc;
    run->code[r] = err.code;
    if (run->late && r == 1) {
        run->late_stream = stream;
        return NULL;
    }
    dg_nccl_free(run->c[r]);
    run->c[r] = NULL;
    dg_cuda_stream_destroy(stream);
    return NULL;
}

static int case_host_face(void)
{
    struct host_run run;
    struct host_arg args[3];
    pthread_t th[3];
    struct dg_error err = {0};
    memset(&run, 0, sizeof run);
    run.n = 3;
    CHECK_OK(dg_nccl_shared_create(3, &run.g, &err), &err);
    for (int r = 0; r < 3; r++) {
        args[r] = (struct host_arg){&run, r};
        CHECK(pthread_create(&th[r], NULL, host_rank, &args[r]) == 0);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        CHECKF(run.rc[r] == 0, "rank %d: code %d", r, run.code[r]);
        CHECKF(run.sums[r][0] == 6.0 && run.sums[r][1] == 1.5 && run.sums[r][2] == -3.0,
               "rank %d: %g %g %g", r, run.sums[r][0], run.sums[r][1], run.sums[r][2]);
        CHECKF(run.calls[r] == 2, "rank %d: %llu calls counted", r,
               (unsigned long long)run.calls[r]);
    }
    dg_nccl_shared_free(run.g);
    return 0;
}

/* Rank 1, away since it joined, gives up after 200 ms. */
static void *aborter(void *p)
{
    struct host_run *run = p;
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    dg_nccl_abort(run->c[1]);
    return NULL;
}

static int case_abort(void)
{
    struct host_run run;
    struct host_arg args[2];
    pthread_t th[2], ab;
    struct dg_error err = {0};
    struct timespec t0, t1;
    memset(&run, 0, sizeof run);
    run.n = 2;
    run.late = 1;
    CHECK_OK(dg_nccl_shared_create(2, &run.g, &err), &err);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 2; r++) {
        args[r] = (struct host_arg){&run, r};
        CHECK(pthread_create(&th[r], NULL, host_rank, &args[r]) == 0);
    }
    pthread_join(th[1], NULL); /* joined, then away: rank 0 waits for it */
    CHECK(pthread_create(&ab, NULL, aborter, &run) == 0);
    pthread_join(th[0], NULL);
    pthread_join(ab, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("# rank 1 away: rank 0's all-reduce ended after %.0f ms: code %d\n",
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
           run.code[0]);
    CHECKF(run.rc[0] == -DG_E_NCCL && run.code[0] == DG_E_NCCL, "rank 0: rc %d", run.rc[0]);
    dg_nccl_free(run.c[1]);
    run.c[1] = NULL;
    dg_cuda_stream_destroy(run.late_stream);
    /* reset: the group works again */
    dg_nccl_shared_reset(run.g);
    run.late = 0;
    for (int r = 0; r < 2; r++)
        CHECK(pthread_create(&th[r], NULL, host_rank, &args[r]) == 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        CHECKF(run.rc[r] == 0 && run.sums[r][0] == 3.0, "after the reset, rank %d: rc %d, %g", r,
               run.rc[r], run.sums[r][0]);
    dg_nccl_shared_free(run.g);
    return 0;
}

/* A slow rank: rank 1 pauses 100 ms after each collective's second
 * meeting, before it waits on rank 0's events, so rank 0 returns from the
 * host face's all-reduce and barrier and frees its communicator first.
 * Rank 1 must still finish both calls with the right sum (the events
 * are the group's, not the freed rank's). */
static int case_slow_rank(void)
{
    struct host_run run;
    struct host_arg args[2];
    pthread_t th[2];
    struct dg_error err = {0};
    memset(&run, 0, sizeof run);
    run.n = 2;
    CHECK_OK(dg_nccl_shared_create(2, &run.g, &err), &err);
    dg_nccl_shared_lag(run.g, 1, 100);
    for (int r = 0; r < 2; r++) {
        args[r] = (struct host_arg){&run, r};
        CHECK(pthread_create(&th[r], NULL, host_rank, &args[r]) == 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        CHECKF(run.rc[r] == 0 && run.sums[r][0] == 3.0 && run.sums[r][1] == 0.5,
               "rank %d: rc %d (code %d), %g %g", r, run.rc[r], run.code[r], run.sums[r][0],
               run.sums[r][1]);
    dg_nccl_shared_free(run.g);
    return 0;
}

int main(void)
{
    int rc = gt_setup("t-nccl-shared");
    if (rc)
        return rc;
    TEST_CASE(case_all_reduce);
    TEST_CASE(case_all_gather);
    TEST_CASE(case_host_face);
    TEST_CASE(case_abort);
    TEST_CASE(case_slow_rank);
    return test_finish();
}
