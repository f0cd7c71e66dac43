/*
 * t-shm-ring - the daemon's side of the shared-memory ring
 * (daemon/shm-ring.c), driven from here as the client: the geometry and
 * the seals; a memfd the kernel refuses; submissions of every kind turned
 * into the protocol's request objects with every setting; completions with their bytes, through many
 * laps of both rings and the result arena; the bound (no slot, no take;
 * DG_SHM_NEED_WAKE) and completions that wait for room; every malformed
 * entry completing as its own job's error; random bytes in every entry;
 * indexes out of range abandoning the ring and nothing else.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/shm-ring.h"
#include "lib/shm-layout.h"
#include "tests/harness.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    return test_xorshift(&rng);
}

/* The client's view of a ring. */
struct cli {
    struct dshm_ring *r;
    unsigned char *map;
    size_t size;
    struct dg_shm_header *h;
    uint32_t tail, cq_head;
    uint64_t in_pos;
};

static int cli_open(struct cli *c, uint32_t sq, uint32_t cq, uint64_t in, uint64_t out)
{
    struct dshm_sizes ask = {sq, cq, in, out}, got;
    struct dshm_limits lim = {.max_entries = 1024, .max_arena_bytes = 1 << 20};
    struct dg_error err = {0};
    uint64_t total;
    int fd;
    memset(c, 0, sizeof *c);
    CHECK_OK(dshm_ring_create(&ask, &lim, &c->r, &fd, &err), &err);
    dshm_ring_sizes(c->r, &got, &total);
    c->size = total;
    c->map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(c->map != MAP_FAILED);
    c->h = (struct dg_shm_header *)c->map;
    return 0;
}

static void cli_close(struct cli *c)
{
    if (c->map && c->map != MAP_FAILED)
        munmap(c->map, c->size);
    dshm_ring_destroy(c->r);
    memset(c, 0, sizeof *c);
}

static struct dg_shm_sqe *sqe_at(struct cli *c, uint32_t i)
{
    return (struct dg_shm_sqe *)(c->map + c->h->sq_off +
                                 (uint64_t)(i & (c->h->sq_entries - 1)) * DG_SHM_SQE_SIZE);
}

/* Bytes into the submission arena (wrapping to 0 when they do not fit at
 * the end); their offset. */
static uint64_t put_bytes(struct cli *c, const void *p, size_t n)
{
    uint64_t off = c->in_pos % c->h->in_size;
    if (off + n > c->h->in_size)
        off = 0;
    memcpy(c->map + c->h->in_off + off, p, n);
    c->in_pos = off + n;
    return off;
}

static void publish(struct cli *c, const struct dg_shm_sqe *e)
{
    memcpy(sqe_at(c, c->tail), e, sizeof *e);
    c->tail++;
    __atomic_store_n(&c->h->sq_tail, c->tail, __ATOMIC_RELEASE);
}

static void text_job(struct cli *c, struct dg_shm_sqe *e, uint64_t user, const char *prompt)
{
    memset(e, 0, sizeof *e);
    e->user_data = user;
    e->op = DG_SHM_OP_TEXT;
    e->prompt_len = (uint32_t)strlen(prompt);
    e->prompt_off = put_bytes(c, prompt, e->prompt_len);
}

/* Take the next job; 1, 0 or -1 as dshm_ring_next. */
static int take(struct cli *c, struct dshm_job *job)
{
    struct dg_error err = {0};
    return dshm_ring_next(c->r, job, &err);
}

/* Reap one completion: 1 with *e and a copy of its bytes, 0 if none. */
static int reap(struct cli *c, struct dg_shm_cqe *e, unsigned char *bytes, size_t cap)
{
    uint32_t t = __atomic_load_n(&c->h->cq_tail, __ATOMIC_ACQUIRE);
    size_t n;
    if (t == c->cq_head)
        return 0;
    memcpy(e, c->map + c->h->cq_off + (uint64_t)(c->cq_head & (c->h->cq_entries - 1)) *
                                           DG_SHM_CQE_SIZE, sizeof *e);
    n = (size_t)e->n_ids * 4 + e->text_len;
    if (e->out_off > c->h->out_size || n > c->h->out_size - e->out_off || n > cap)
        return -1;
    memcpy(bytes, c->map + c->h->out_off + e->out_off, n);
    c->cq_head++;
    __atomic_store_n(&c->h->cq_head, c->cq_head, __ATOMIC_SEQ_CST);
    return 1;
}

static int complete_text(struct cli *c, const struct dshm_job *job, const char *text,
                         const int32_t *ids, size_t n_ids)
{
    struct dshm_result res;
    memset(&res, 0, sizeof res);
    res.finish = DG_SHM_FINISH_LENGTH;
    res.text = text;
    res.text_len = strlen(text);
    res.ids = ids;
    res.n_ids = n_ids;
    res.completion_tokens = (uint32_t)n_ids;
    res.stop_id = -1;
    return dshm_ring_complete(c->r, job->slot, &res);
}

/* ---- cases -------------------------------------------------------------------------- */

static int geometry_and_seals(void)
{
    struct dshm_sizes ask = {100, 0, 5000, 0}, got;
    struct dshm_limits lim = {.max_entries = 64, .max_arena_bytes = 1 << 20};
    struct dg_error err = {0};
    struct dshm_ring *r;
    struct stat st;
    uint64_t total;
    int fd;
    const struct dg_shm_header *h;
    void *m;

    CHECK_OK(dshm_ring_create(&ask, &lim, &r, &fd, &err), &err);
    dshm_ring_sizes(r, &got, &total);
    CHECK(got.sq_entries == 64);                 /* 128, capped at 64 */
    CHECK(got.cq_entries == 64);                 /* the default 256, capped */
    CHECK(got.in_bytes == 8192);                 /* rounded up to pages */
    CHECK(got.out_bytes == (1 << 20));           /* the default 4 MiB, capped at 1 MiB */
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == total);
    /* sealed: the client can neither shrink nor grow it, nor unseal */
    CHECK(ftruncate(fd, 4096) != 0);
    CHECK(ftruncate(fd, (off_t)total * 2) != 0);
    CHECK(fcntl(fd, F_GET_SEALS) == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    m = mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    h = m;
    CHECK(h->magic == DG_SHM_MAGIC && h->version == DG_SHM_VERSION);
    CHECK(h->sq_entries == 64 && h->cq_entries == 64 && h->total_size == total);
    CHECK(h->sq_off == DG_SHM_HEADER_SIZE && h->cq_off >= h->sq_off + 64 * DG_SHM_SQE_SIZE);
    CHECK(h->in_off >= h->cq_off + 64 * DG_SHM_CQE_SIZE && h->in_off % 4096 == 0);
    CHECK(h->out_off == h->in_off + h->in_size && h->out_off + h->out_size == total);
    CHECK(dshm_ring_sq_fd(r) >= 0 && dshm_ring_cq_fd(r) >= 0);
    CHECK(fcntl(dshm_ring_sq_fd(r), F_GETFL) & O_NONBLOCK);
    munmap(m, total);
    close(fd);
    dshm_ring_destroy(r);
    dshm_ring_destroy(NULL);
    return 0;
}

/* A memfd the kernel will not size (here: past the process's file-size
 * limit, RLIMIT_FSIZE) fails the creation with the size asked for and the
 * kernel's reason, and frees what the creation had made (the sanitizer
 * build reads any freed byte the message used). */
static int memfd_refused(void)
{
    struct dshm_sizes ask = {64, 64, 1 << 16, 1 << 16};
    struct dshm_limits lim = {.max_entries = 1024, .max_arena_bytes = 1 << 20};
    struct dg_error err = {0};
    struct dshm_ring *r = (struct dshm_ring *)(uintptr_t)1; /* must come back NULL */
    struct rlimit old, low;
    char want[80];
    int fd = 12345, rc;

    snprintf(want, sizeof want, "memfd of %llu bytes: %s",
             (unsigned long long)dshm_ring_size_for(&ask, &lim), strerror(EFBIG));
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    low = old;
    low.rlim_cur = 4096;
    CHECK(signal(SIGXFSZ, SIG_IGN) != SIG_ERR);
    CHECK(setrlimit(RLIMIT_FSIZE, &low) == 0);
    rc = dshm_ring_create(&ask, &lim, &r, &fd, &err);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    CHECKF(rc == -DG_E_IO && err.code == DG_E_IO && strstr(err.msg, want),
           "rc %d: %s (want \"%s\")", rc, err.msg, want);
    CHECK(r == NULL && fd == -1);
    return 0;
}

/* Every setting and both prompt kinds become the protocol's request. */
static int requests_carry_everything(void)
{
    struct cli c;
    struct dg_shm_sqe e;
    struct dshm_job job;
    const int32_t ids[3] = {2, 651, 1234};
    const char stops[] = "END\0</s>";
    json_t *v;

    if (cli_open(&c, 8, 8, 0, 0))
        return 1;
    text_job(&c, &e, 77, "Hello, ring");
    e.flags = DG_SHM_F_BATCH;
    e.set = DG_SHM_SET_ALL;
    e.canvas_length = 16;
    e.max_denoising_steps = 9;
    e.stability_threshold = 2;
    e.top_k = 40;
    e.entropy_bound = 0.25;
    e.confidence_threshold = 0.875;
    e.t_min = 0.125;
    e.t_max = 0.75;
    e.top_p = 0.9;
    e.seed = 123456789012345ull;
    e.max_tokens = 77;
    e.n_stop_ids = 2;
    e.stop_ids[0] = 1;
    e.stop_ids[1] = 106;
    e.stop_len = sizeof stops;
    e.stop_off = put_bytes(&c, stops, sizeof stops);
    publish(&c, &e);
    CHECK(take(&c, &job) == 1);
    CHECK(job.user_data == 77 && job.op == DG_SHM_OP_TEXT && job.batch && job.error == 0);
    CHECK(job.request);
    CHECK(!strcmp(json_string_value(json_object_get(job.request, "op")), "generate"));
    CHECK(!strcmp(json_string_value(json_object_get(job.request, "prompt")), "Hello, ring"));
    CHECK(json_is_false(json_object_get(job.request, "stream")));
    CHECK(json_is_true(json_object_get(job.request, "batch")));
    CHECK(json_integer_value(json_object_get(job.request, "canvas_length")) == 16);
    CHECK(json_integer_value(json_object_get(job.request, "max_denoising_steps")) == 9);
    CHECK(json_integer_value(json_object_get(job.request, "stability_threshold")) == 2);
    CHECK(json_integer_value(json_object_get(job.request, "top_k")) == 40);
    CHECK(json_real_value(json_object_get(job.request, "entropy_bound")) == 0.25);
    CHECK(json_real_value(json_object_get(job.request, "confidence_threshold")) == 0.875);
    CHECK(json_real_value(json_object_get(job.request, "t_min")) == 0.125);
    CHECK(json_real_value(json_object_get(job.request, "t_max")) == 0.75);
    CHECK(json_real_value(json_object_get(job.request, "top_p")) == 0.9);
    CHECK(json_integer_value(json_object_get(job.request, "seed")) == 123456789012345ll);
    CHECK(json_integer_value(json_object_get(job.request, "max_tokens")) == 77);
    v = json_object_get(job.request, "stop_token_ids");
    CHECK(json_array_size(v) == 2 && json_integer_value(json_array_get(v, 1)) == 106);
    v = json_object_get(job.request, "stop");
    CHECK(json_array_size(v) == 2 && !strcmp(json_string_value(json_array_get(v, 1)), "</s>"));
    json_decref(job.request);

    /* token ids, no settings: only the prompt, the defaults for the rest */
    memset(&e, 0, sizeof e);
    e.user_data = 78;
    e.op = DG_SHM_OP_IDS;
    e.prompt_len = sizeof ids;
    e.prompt_off = put_bytes(&c, ids, sizeof ids);
    publish(&c, &e);
    CHECK(take(&c, &job) == 1 && job.user_data == 78 && job.request && !job.batch);
    v = json_object_get(job.request, "prompt_ids");
    CHECK(json_array_size(v) == 3 && json_integer_value(json_array_get(v, 2)) == 1234);
    CHECK(json_object_size(job.request) == 5); /* v, op, stream, batch, prompt_ids */
    json_decref(job.request);


    /* a cancel takes no slot; its user_data is the job it names */
    memset(&e, 0, sizeof e);
    e.op = DG_SHM_OP_CANCEL;
    e.user_data = 1234;
    e.cancel_user_data = 78;
    publish(&c, &e);
    CHECK(dshm_ring_in_flight(c.r) == 2);
    CHECK(take(&c, &job) == 1 && job.op == DG_SHM_OP_CANCEL && !job.request);
    CHECK(job.user_data == 78);
    CHECK(dshm_ring_in_flight(c.r) == 2);
    CHECK(dshm_ring_find_user(c.r, 78) >= 0 && dshm_ring_find_user(c.r, 79) < 0);
    dshm_ring_bind(c.r, (uint32_t)dshm_ring_find_user(c.r, 78), 5000, 9);
    CHECK(dshm_ring_find_id(c.r, 5000) == dshm_ring_find_user(c.r, 78));
    CHECK(dshm_ring_id_of(c.r, (uint32_t)dshm_ring_find_id(c.r, 5000)) == 5000);
    CHECK(take(&c, &job) == 0);
    cli_close(&c);
    return 0;
}

/* A text entry with DG_SHM_F_PLAIN_TEXT becomes "parse_special": false,
 * with DG_SHM_F_PARSE_SPECIAL true; without either the request has no such
 * key (the daemon's default). */
static int plain_text_flag(void)
{
    struct cli c;
    struct dg_shm_sqe e;
    struct dshm_job job;

    if (cli_open(&c, 8, 8, 0, 0))
        return 1;
    text_job(&c, &e, 79, "a <mask>");
    e.flags = DG_SHM_F_PLAIN_TEXT | DG_SHM_F_BATCH;
    publish(&c, &e);
    CHECK(take(&c, &job) == 1 && job.user_data == 79 && job.request && job.error == 0);
    CHECK(json_is_false(json_object_get(job.request, "parse_special")) && job.batch);
    CHECK(!strcmp(json_string_value(json_object_get(job.request, "prompt")), "a <mask>"));
    json_decref(job.request);
    text_job(&c, &e, 80, "a <mask>");
    publish(&c, &e);
    CHECK(take(&c, &job) == 1 && job.request && !json_object_get(job.request, "parse_special"));
    json_decref(job.request);
    text_job(&c, &e, 81, "a <mask>");
    e.flags = DG_SHM_F_PARSE_SPECIAL;
    publish(&c, &e);
    CHECK(take(&c, &job) == 1 && job.request && job.error == 0);
    CHECK(json_is_true(json_object_get(job.request, "parse_special")));
    json_decref(job.request);
    cli_close(&c);
    return 0;
}

/* Thousands of jobs through small rings: every completion comes back once,
 * in order, with its bytes, across many laps of the arena. */
static int many_laps(void)
{
    struct cli c;
    enum { N = 3000 };
    uint64_t submitted = 0, taken = 0, reaped = 0;
    static unsigned char bytes[1 << 16];
    static int32_t ids[2048];
    struct dshm_job pending[16];
    int n_pending = 0;

    if (cli_open(&c, 16, 16, 4096, 8192))
        return 1;
    while (reaped < N) {
        struct dg_shm_sqe e;
        struct dg_shm_cqe q;
        struct dshm_job job;
        int rc;
        /* submit while there is room */
        while (submitted < N && c.tail - __atomic_load_n(&c.h->sq_head, __ATOMIC_ACQUIRE) < 16) {
            char p[64];
            snprintf(p, sizeof p, "job %llu", (unsigned long long)submitted);
            text_job(&c, &e, submitted, p);
            publish(&c, &e);
            submitted++;
        }
        /* the daemon takes what it may, and finishes some */
        while ((rc = take(&c, &job)) == 1) {
            CHECK(job.user_data == taken && job.request && !job.error);
            json_decref(job.request);
            pending[n_pending++] = job;
            taken++;
            CHECK(n_pending <= 16);
        }
        CHECK(rc == 0);
        while (n_pending > 0 && (rnd() % 3 != 0 || n_pending == 16)) {
            struct dshm_job *j = &pending[0];
            char text[600];
            const size_t n_ids = (size_t)(j->user_data % 700);
            for (size_t i = 0; i < n_ids; i++)
                ids[i] = (int32_t)(j->user_data * 7 + i);
            snprintf(text, sizeof text, "result of %llu", (unsigned long long)j->user_data);
            CHECK(complete_text(&c, j, text, ids, n_ids) == 0);
            memmove(pending, pending + 1, (size_t)--n_pending * sizeof *pending);
        }
        /* the client reaps some */
        for (int k = (int)(rnd() % 20); k > 0; k--) {
            char want[64];
            rc = reap(&c, &q, bytes, sizeof bytes);
            CHECK(rc >= 0);
            if (rc == 0)
                break;
            CHECKF(q.user_data == reaped, "completion %llu, want %llu",
                   (unsigned long long)q.user_data, (unsigned long long)reaped);
            CHECK(q.status == 0 && q.finish == DG_SHM_FINISH_LENGTH);
            CHECK(q.n_ids == reaped % 700 && q.completion_tokens == q.n_ids);
            for (uint32_t i = 0; i < q.n_ids; i++) {
                int32_t id;
                memcpy(&id, bytes + 4 * (size_t)i, 4);
                CHECK(id == (int32_t)(reaped * 7 + i));
            }
            snprintf(want, sizeof want, "result of %llu", (unsigned long long)reaped);
            CHECK(q.text_len == strlen(want) && !memcmp(bytes + 4 * q.n_ids, want, q.text_len));
            reaped++;
        }
        {
            struct dg_error err = {0};
            CHECK_OK(dshm_ring_flush(c.r, &err), &err);
        }
    }
    CHECK(!dshm_ring_broken(c.r) && dshm_ring_in_flight(c.r) == 0);
    cli_close(&c);
    return 0;
}

/* No free completion slot: nothing is taken, NEED_WAKE is set; reaping
 * lets it go on.  A completion larger than the free arena waits. */
static int bound_and_waiting(void)
{
    struct cli c;
    struct dg_shm_sqe e;
    struct dshm_job job[5];
    struct dg_shm_cqe q;
    struct dg_error err = {0};
    static unsigned char bytes[1 << 14];
    static int32_t ids[1500];

    if (cli_open(&c, 8, 4, 0, 8192))
        return 1;
    for (int i = 0; i < 6; i++) {
        text_job(&c, &e, (uint64_t)i, "x");
        publish(&c, &e);
    }
    for (int i = 0; i < 4; i++)
        CHECK(take(&c, &job[i]) == 1 && job[i].user_data == (uint64_t)i);
    CHECK(take(&c, &job[4]) == 0);
    CHECK(c.h->flags & DG_SHM_NEED_WAKE);
    for (int i = 0; i < 4; i++)
        json_decref(job[i].request);
    /* 6000 bytes each: the second must wait for the first to be reaped */
    CHECK(complete_text(&c, &job[0], "", ids, 1500) == 0);
    CHECK(complete_text(&c, &job[1], "", ids, 1500) == 0);
    CHECK(c.h->cq_tail == 1);
    CHECK(take(&c, &job[4]) == 0); /* 2 held, 1 unreaped, 1 ... still none free */
    CHECK(reap(&c, &q, bytes, sizeof bytes) == 1 && q.user_data == 0);
    CHECK_OK(dshm_ring_flush(c.r, &err), &err);
    CHECK(c.h->cq_tail == 2);
    CHECK(reap(&c, &q, bytes, sizeof bytes) == 1 && q.user_data == 1 && q.n_ids == 1500);
    /* two slots free now: the waiting submissions go */
    CHECK(take(&c, &job[4]) == 1 && job[4].user_data == 4);
    CHECK(!(c.h->flags & DG_SHM_NEED_WAKE));
    json_decref(job[4].request);
    /* larger than the whole arena: a too_large completion instead */
    CHECK(complete_text(&c, &job[2], "", ids, 1500) == 0);
    {
        static int32_t big[4096];
        struct dshm_result res;
        memset(&res, 0, sizeof res);
        res.ids = big;
        res.n_ids = 4096;
        CHECK(dshm_ring_complete(c.r, job[3].slot, &res) == 0);
    }
    CHECK(reap(&c, &q, bytes, sizeof bytes) == 1 && q.user_data == 2 && q.status == 0);
    CHECK_OK(dshm_ring_flush(c.r, &err), &err);
    CHECK(reap(&c, &q, bytes, sizeof bytes) == 1 && q.user_data == 3);
    CHECK(q.status == DG_SHM_ERR_TOO_LARGE && q.n_ids == 0 && q.text_len > 0);
    CHECK(strstr((const char *)bytes, "larger than the ring's result arena") != NULL);
    cli_close(&c);
    return 0;
}

/* Each malformed entry completes as its own error; the ring goes on. */
static int malformed_entries(void)
{
    struct cli c;
    struct dg_shm_sqe e;
    struct dshm_job job;
    const int32_t ids[2] = {5, 6};
    static const struct {
        const char *why, *expect;
    } cases[] = {
        {"unknown op", "op: 9"},
        {"unknown flag", "flags: unknown"},
        {"unknown set bit", "set: unknown"},
        {"prompt outside", "outside the submission arena"},
        {"prompt length wraps", "outside the submission arena"},
        {"ids not whole", "whole number of int32"},
        {"not utf-8", "not UTF-8"},
        {"NUL in text", "NUL"},
        {"NaN top_p", "top_p: not a finite number"},
        {"huge seed", "seed:"},
        {"too many stop ids", "n_stop_ids"},
        {"stop without NUL", "must each end with a NUL"},
        {"stop outside", "stop: bytes"},
        {"plain text with ids", "PLAIN_TEXT and PARSE_SPECIAL are for a text prompt"},
        {"both parse flags", "PLAIN_TEXT and PARSE_SPECIAL together"},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);

    if (cli_open(&c, 32, 32, 0, 0))
        return 1;
    for (int i = 0; i < n; i++) {
        text_job(&c, &e, (uint64_t)i, "ok");
        switch (i) {
        case 0: e.op = 9; break;
        case 1: e.flags = 0x10; break;
        case 2: e.set = 1u << 20; break;
        case 3: e.prompt_off = c.h->in_size; e.prompt_len = 1; break;
        case 4: e.prompt_off = 16; e.prompt_len = UINT32_MAX; break;
        case 5: e.op = DG_SHM_OP_IDS; e.prompt_off = put_bytes(&c, ids, 8); e.prompt_len = 7; break;
        case 6: e.prompt_off = put_bytes(&c, "\xff\xfe", 2); e.prompt_len = 2; break;
        case 7: e.prompt_off = put_bytes(&c, "a\0b", 3); e.prompt_len = 3; break;
        case 8: e.set = DG_SHM_SET_TOP_P; e.top_p = NAN; break;
        case 9: e.set = DG_SHM_SET_SEED; e.seed = UINT64_MAX; break;
        case 10: e.set = DG_SHM_SET_STOP_IDS; e.n_stop_ids = 9; break;
        case 11: e.set = DG_SHM_SET_STOP; e.stop_off = put_bytes(&c, "ab", 2); e.stop_len = 2; break;
        case 12: e.set = DG_SHM_SET_STOP; e.stop_off = (uint64_t)1 << 40; e.stop_len = 4; break;
        case 13:
            e.op = DG_SHM_OP_IDS;
            e.flags = DG_SHM_F_PLAIN_TEXT;
            e.prompt_off = put_bytes(&c, ids, 8);
            e.prompt_len = 8;
            break;
        case 14: e.flags = DG_SHM_F_PLAIN_TEXT | DG_SHM_F_PARSE_SPECIAL; break;
        }
        publish(&c, &e);
        CHECK(take(&c, &job) == 1);
        CHECKF(job.error == DG_SHM_ERR_BAD_REQUEST && !job.request &&
                   strstr(job.message, cases[i].expect),
               "%s: error %u '%s'", cases[i].why, job.error, job.message);
        CHECK(job.user_data == (uint64_t)i);
    }
    /* and a good one after them */
    text_job(&c, &e, 99, "fine");
    publish(&c, &e);
    CHECK(take(&c, &job) == 1 && job.request && job.error == 0 && job.user_data == 99);
    json_decref(job.request);
    CHECK(!dshm_ring_broken(c.r));
    cli_close(&c);
    return 0;
}

/* Random bytes in every entry and the submission arena: each entry is a
 * job (usable or an error), never more; nothing is read outside. */
static int random_entries(void)
{
    struct cli c;
    struct dshm_job job;
    int usable = 0, refused = 0;

    if (cli_open(&c, 64, 64, 4096, 4096))
        return 1;
    for (int round = 0; round < 200; round++) {
        int took = 0;
        for (uint64_t i = 0; i < c.h->in_size; i += 8) {
            uint64_t x = rnd();
            memcpy(c.map + c.h->in_off + i, &x, 8);
        }
        for (int k = 0; k < 32; k++) {
            struct dg_shm_sqe e;
            unsigned char *b = (unsigned char *)&e;
            for (size_t i = 0; i < sizeof e; i++)
                b[i] = (unsigned char)rnd();
            /* half of them with small fields, so they get past the first checks */
            if (k & 1) {
                e.op = 1 + (uint32_t)(rnd() % 3);
                e.flags &= 1;
                e.prompt_off = rnd() % c.h->in_size;
                e.prompt_len = (uint32_t)(rnd() % 64);
                e.set &= DG_SHM_SET_ALL;
                e.stop_off = rnd() % c.h->in_size;
                e.stop_len = (uint32_t)(rnd() % 16);
                e.n_stop_ids %= 10;
            }
            publish(&c, &e);
        }
        for (int rc; (rc = take(&c, &job)) != 0; took++) {
            CHECK(rc == 1);
            if (job.op == DG_SHM_OP_CANCEL)
                continue;
            if (job.request) {
                usable++;
                json_decref(job.request);
            } else {
                CHECK(job.error != 0 && job.message[0]);
                refused++;
            }
            {
                struct dshm_result res;
                memset(&res, 0, sizeof res);
                res.status = job.error;
                res.text = job.message;
                res.text_len = strlen(job.message);
                CHECK(dshm_ring_complete(c.r, job.slot, &res) == 0);
            }
        }
        CHECK(took == 32);
        {
            struct dg_shm_cqe q;
            static unsigned char bytes[8192];
            while (reap(&c, &q, bytes, sizeof bytes) == 1)
                ;
        }
    }
    CHECK(!dshm_ring_broken(c.r));
    CHECKF(usable > 100 && refused > 100, "%d usable, %d refused", usable, refused);
    cli_close(&c);
    return 0;
}

/* Indexes out of range: the ring is abandoned (FAULT), nothing else. */
static int bad_indexes(void)
{
    struct cli c;
    struct dshm_job job;
    struct dg_shm_sqe e;
    struct dg_error err = {0};

    /* sq_tail more than sq_entries ahead */
    if (cli_open(&c, 8, 8, 0, 0))
        return 1;
    __atomic_store_n(&c.h->sq_tail, 9u, __ATOMIC_RELEASE);
    CHECK(dshm_ring_next(c.r, &job, &err) == -1 && strstr(err.msg, "sq_tail 9"));
    CHECK(dshm_ring_broken(c.r) && (c.h->flags & DG_SHM_FAULT));
    /* the client is to be woken to see it: the doorbell is owed, once (the
     * caller writes it; the ring never does) */
    CHECK(dshm_ring_bell_due(c.r) == 1 && dshm_ring_bell_due(c.r) == 0);
    CHECK(dshm_ring_next(c.r, &job, &err) == -1);
    CHECK(dshm_ring_flush(c.r, &err) == -1);
    cli_close(&c);

    /* sq_tail behind sq_head (wraps to a huge count) */
    if (cli_open(&c, 8, 8, 0, 0))
        return 1;
    text_job(&c, &e, 1, "a");
    publish(&c, &e);
    CHECK(take(&c, &job) == 1);
    json_decref(job.request);
    __atomic_store_n(&c.h->sq_tail, 0u, __ATOMIC_RELEASE);
    CHECK(take(&c, &job) == -1 && dshm_ring_broken(c.r));
    cli_close(&c);

    /* cq_head past cq_tail, and cq_head moved backwards */
    for (int back = 0; back < 2; back++) {
        if (cli_open(&c, 8, 8, 0, 0))
            return 1;
        text_job(&c, &e, 1, "a");
        publish(&c, &e);
        CHECK(take(&c, &job) == 1);
        json_decref(job.request);
        CHECK(complete_text(&c, &job, "r", NULL, 0) == 0);
        if (back) {
            struct dg_shm_cqe q;
            unsigned char b[64];
            CHECK(reap(&c, &q, b, sizeof b) == 1);
            CHECK_OK(dshm_ring_flush(c.r, &err), &err);
            __atomic_store_n(&c.h->cq_head, 0u, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&c.h->cq_head, 2u, __ATOMIC_RELEASE);
        }
        CHECK(dshm_ring_flush(c.r, &err) == -1 && strstr(err.msg, "cq_head"));
        CHECK(dshm_ring_broken(c.r) && (c.h->flags & DG_SHM_FAULT));
        /* completions after a fault are dropped, quietly */
        text_job(&c, &e, 2, "b");
        CHECK(dshm_ring_in_flight(c.r) == 0);
        cli_close(&c);
    }

    /* the geometry in the header is the client's to spoil: not read back */
    if (cli_open(&c, 8, 8, 0, 0))
        return 1;
    memcpy(c.map + c.h->in_off, "z", 1);
    c.h->sq_entries = 1u << 30;
    c.h->in_size = UINT64_MAX;
    c.h->sq_off = UINT64_MAX;
    c.h->magic = 0;
    {
        struct dg_shm_sqe *slot0 = (struct dg_shm_sqe *)(c.map + DG_SHM_HEADER_SIZE);
        memset(&e, 0, sizeof e);
        e.user_data = 5;
        e.op = DG_SHM_OP_TEXT;
        e.prompt_len = 1;
        e.prompt_off = 0;
        *slot0 = e;
        __atomic_store_n(&c.h->sq_tail, 1u, __ATOMIC_RELEASE);
    }
    CHECK(take(&c, &job) == 1 && job.user_data == 5 && job.request);
    json_decref(job.request);
    cli_close(&c);
    return 0;
}

int main(void)
{
    TEST_CASE(geometry_and_seals);
    TEST_CASE(memfd_refused);
    TEST_CASE(requests_carry_everything);
    TEST_CASE(plain_text_flag);
    TEST_CASE(many_laps);
    TEST_CASE(bound_and_waiting);
    TEST_CASE(malformed_entries);
    TEST_CASE(random_entries);
    TEST_CASE(bad_indexes);
    return test_finish();
}
