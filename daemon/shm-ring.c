/* shm-ring.c - the daemon's side of a shared-memory job ring (see
 * shm-ring.h for the design, lib/shm-layout.h for the layout and the
 * memory order). */
#include "daemon/shm-ring.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lib/utf8.h"

#define PAGE 4096u

/* A finished job waiting for room in the result arena. */
struct waiting {
    struct waiting *next;
    uint32_t slot;
    int spare;                     /* one of the ring's spares: not freed */
    struct dg_shm_cqe cqe;         /* out_off is set when posted */
    size_t len;                    /* bytes: ids then text */
    unsigned char bytes[];
};

struct rjob {
    int used;
    uint64_t user_data, id, seed;
};

/* A ring's geometry: its entries, its arenas' sizes and every part's
 * offset in the mapping, and the mapping's size (geometry_of). */
struct geometry {
    uint32_t sq_n, cq_n;
    uint64_t in_size, out_size;
    uint64_t sq_off, cq_off, in_off, out_off, total;
};

struct dshm_ring {
    unsigned char *map;
    struct dg_shm_header *hdr;
    /* the geometry: the daemon's copy, never read back from the client */
    struct geometry g;
    uint64_t max_prompt_ids;       /* dshm_limits' (0: none) */
    uint32_t max_stop_strings;
    int sq_efd, cq_efd;
    int bell_due;                  /* the completion doorbell is owed */
    /* what the daemon published or last accepted */
    uint32_t sq_head, cq_tail, cq_head;
    int broken;
    /* jobs taken and not yet posted */
    struct rjob *jobs;             /* [cq_n] */
    uint32_t *free_slots, n_free;  /* a stack of unused jobs[] indexes */
    struct waiting *wait_head, *wait_tail;
    /* one payload-free completion per job slot, made with the ring, for a
     * completion that cannot be allocated: the job still completes (as an
     * internal error) instead of vanishing */
    unsigned char *spares;         /* cq_n entries of sizeof(struct waiting) */
    /* the result arena as a FIFO of virtual byte positions: [a_head, a_tail)
     * is held by completions the client has not reaped */
    uint64_t a_head, a_tail;
    uint64_t *cq_end;              /* [cq_n]: a_tail after completion i was written */
};

static uint32_t pow2_at_least(uint64_t x)
{
    uint32_t p = 1;
    while (p < x && p < (1u << 30))
        p <<= 1;
    return p;
}

static uint32_t pow2_at_most(uint64_t x)
{
    uint32_t p = 1;
    while ((uint64_t)p * 2 <= x && p < (1u << 30))
        p <<= 1;
    return p;
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

/* ---- life cycle -------------------------------------------------------------------- */

/* A ring's geometry for ask under lim: each size rounded up (entries to
 * a power of two, arenas to a page; 0 takes the default), then capped;
 * the parts laid out one after another. */
static struct geometry geometry_of(const struct dshm_sizes *ask, const struct dshm_limits *lim)
{
    const uint32_t max_e = pow2_at_most(lim->max_entries ? lim->max_entries : 1);
    const uint64_t max_a = lim->max_arena_bytes / PAGE * PAGE;
    struct geometry g;
    g.sq_n = pow2_at_least(ask->sq_entries ? ask->sq_entries : DSHM_DEFAULT_ENTRIES);
    g.cq_n = pow2_at_least(ask->cq_entries ? ask->cq_entries : DSHM_DEFAULT_ENTRIES);
    g.sq_n = g.sq_n > max_e ? max_e : g.sq_n;
    g.cq_n = g.cq_n > max_e ? max_e : g.cq_n;
    g.in_size = round_up(ask->in_bytes ? ask->in_bytes : DSHM_DEFAULT_IN_BYTES, PAGE);
    g.out_size = round_up(ask->out_bytes ? ask->out_bytes : DSHM_DEFAULT_OUT_BYTES, PAGE);
    if (max_a >= PAGE) {
        g.in_size = g.in_size > max_a ? max_a : g.in_size;
        g.out_size = g.out_size > max_a ? max_a : g.out_size;
    } else {
        g.in_size = g.out_size = PAGE;
    }
    g.sq_off = DG_SHM_HEADER_SIZE;
    g.cq_off = round_up(g.sq_off + (uint64_t)g.sq_n * DG_SHM_SQE_SIZE, 64);
    g.in_off = round_up(g.cq_off + (uint64_t)g.cq_n * DG_SHM_CQE_SIZE, PAGE);
    g.out_off = g.in_off + g.in_size;
    g.total = g.out_off + g.out_size;
    return g;
}

uint64_t dshm_ring_size_for(const struct dshm_sizes *ask, const struct dshm_limits *lim)
{
    return geometry_of(ask, lim).total;
}

int dshm_ring_create(const struct dshm_sizes *ask, const struct dshm_limits *lim,
                     struct dshm_ring **out, int *memfd, struct dg_error *err)
{
    const struct geometry g = geometry_of(ask, lim);
    struct dshm_ring *r;
    int fd = -1;

    *out = NULL;
    *memfd = -1;
    r = calloc(1, sizeof *r);
    if (!r)
        return dg_error_set(err, DG_E_NOMEM, "shm ring: out of memory");
    r->sq_efd = r->cq_efd = -1;
    r->max_prompt_ids = lim->max_prompt_ids;
    r->max_stop_strings = lim->max_stop_strings;
    r->g = g;

    r->jobs = calloc(r->g.cq_n, sizeof *r->jobs);
    r->free_slots = malloc(r->g.cq_n * sizeof *r->free_slots);
    r->cq_end = calloc(r->g.cq_n, sizeof *r->cq_end);
    r->spares = calloc(r->g.cq_n, sizeof(struct waiting));
    if (!r->jobs || !r->free_slots || !r->cq_end || !r->spares) {
        dshm_ring_destroy(r);
        return dg_error_set(err, DG_E_NOMEM, "shm ring: out of memory");
    }
    for (uint32_t i = 0; i < r->g.cq_n; i++)
        r->free_slots[i] = r->g.cq_n - 1 - i;
    r->n_free = r->g.cq_n;

    fd = memfd_create("dgemma-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)r->g.total) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        dshm_ring_destroy(r);
        return dg_error_set(err, DG_E_IO, "shm ring: memfd of %llu bytes: %s",
                            (unsigned long long)g.total, strerror(e));
    }
    r->map = mmap(NULL, r->g.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->map == MAP_FAILED) {
        int e = errno;
        r->map = NULL;
        close(fd);
        dshm_ring_destroy(r);
        return dg_error_set(err, DG_E_IO, "shm ring: mmap: %s", strerror(e));
    }
    /* the client can neither shrink the file under the daemon's mapping
     * (which would fault the daemon on its next access) nor change the
     * seals */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int e = errno;
        close(fd);
        dshm_ring_destroy(r);
        return dg_error_set(err, DG_E_IO, "shm ring: sealing the memfd: %s", strerror(e));
    }
    r->sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->cq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->sq_efd < 0 || r->cq_efd < 0) {
        int e = errno;
        close(fd);
        dshm_ring_destroy(r);
        return dg_error_set(err, DG_E_IO, "shm ring: eventfd: %s", strerror(e));
    }
    r->hdr = (struct dg_shm_header *)r->map;
    r->hdr->magic = DG_SHM_MAGIC;
    r->hdr->version = DG_SHM_VERSION;
    r->hdr->sq_entries = r->g.sq_n;
    r->hdr->cq_entries = r->g.cq_n;
    r->hdr->sq_off = r->g.sq_off;
    r->hdr->cq_off = r->g.cq_off;
    r->hdr->in_off = r->g.in_off;
    r->hdr->in_size = r->g.in_size;
    r->hdr->out_off = r->g.out_off;
    r->hdr->out_size = r->g.out_size;
    r->hdr->total_size = r->g.total;
    *memfd = fd;
    *out = r;
    return 0;
}

void dshm_ring_destroy(struct dshm_ring *r)
{
    if (!r)
        return;
    if (r->map)
        munmap(r->map, r->g.total);
    if (r->sq_efd >= 0)
        close(r->sq_efd);
    if (r->cq_efd >= 0)
        close(r->cq_efd);
    while (r->wait_head) {
        struct waiting *w = r->wait_head;
        r->wait_head = w->next;
        if (!w->spare)
            free(w);
    }
    free(r->spares);
    free(r->jobs);
    free(r->free_slots);
    free(r->cq_end);
    free(r);
}

void dshm_ring_sizes(const struct dshm_ring *r, struct dshm_sizes *s, uint64_t *total)
{
    s->sq_entries = r->g.sq_n;
    s->cq_entries = r->g.cq_n;
    s->in_bytes = r->g.in_size;
    s->out_bytes = r->g.out_size;
    *total = r->g.total;
}

int dshm_ring_sq_fd(const struct dshm_ring *r)
{
    return r->sq_efd;
}

int dshm_ring_cq_fd(const struct dshm_ring *r)
{
    return r->cq_efd;
}

uint32_t dshm_ring_in_flight(const struct dshm_ring *r)
{
    return r->g.cq_n - r->n_free;
}

int dshm_ring_broken(const struct dshm_ring *r)
{
    return r->broken;
}

/* ---- the client's indexes ----------------------------------------------------------- */

static void ring_bell(struct dshm_ring *r);

static int fault(struct dshm_ring *r, struct dg_error *err, const char *what, uint32_t v)
{
    r->broken = 1;
    __atomic_fetch_or(&r->hdr->flags, DG_SHM_FAULT, __ATOMIC_SEQ_CST);
    ring_bell(r); /* a client waiting for completions wakes and sees the flag */
    return dg_error_set(err, DG_E_FORMAT, "shm ring: %s %u is out of range: the ring is "
                        "abandoned", what, v);
}

/* Load cq_head (acquire: the client is done with those completions and
 * their bytes) and free the result arena up to it.  It must lie between
 * the last value seen and what the daemon published. */
static int load_cq_head(struct dshm_ring *r, int order, struct dg_error *err)
{
    const uint32_t h = __atomic_load_n(&r->hdr->cq_head, order);
    if ((uint32_t)(h - r->cq_head) > (uint32_t)(r->cq_tail - r->cq_head))
        return fault(r, err, "cq_head", h);
    if (h != r->cq_head) {
        r->a_head = r->cq_end[(h - 1) & (r->g.cq_n - 1)];
        r->cq_head = h;
    }
    return 0;
}

/* ---- taking a submission ---------------------------------------------------------------- */

/* The bytes [off, off + len) of the submission arena, copied; NULL (with
 * *why) when the range is outside it; *p NULL and 0 for len 0. */
static int copy_in(const struct dshm_ring *r, uint64_t off, uint64_t len, unsigned char **p,
                   const char *what, struct dshm_job *job)
{
    *p = NULL;
    if (off > r->g.in_size || len > r->g.in_size - off) {
        job->error = DG_SHM_ERR_BAD_REQUEST;
        snprintf(job->message, sizeof job->message, "%s: bytes [%llu, +%llu) are outside the "
                 "submission arena of %llu bytes", what, (unsigned long long)off,
                 (unsigned long long)len, (unsigned long long)r->g.in_size);
        return -1;
    }
    if (len == 0)
        return 0;
    if (!(*p = malloc(len))) {
        job->error = DG_SHM_ERR_INTERNAL;
        snprintf(job->message, sizeof job->message, "out of memory");
        return -1;
    }
    memcpy(*p, r->map + r->g.in_off + off, len);
    return 0;
}

/* The job completes with status (a DG_SHM_ERR_*) and the message; -1. */
static int refuse(struct dshm_job *job, uint32_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refuse(struct dshm_job *job, uint32_t status, const char *fmt, ...)
{
    va_list ap;
    job->error = status;
    va_start(ap, fmt);
    vsnprintf(job->message, sizeof job->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define bad(job, ...) refuse(job, DG_SHM_ERR_BAD_REQUEST, __VA_ARGS__)
#define too_large(job, ...) refuse(job, DG_SHM_ERR_TOO_LARGE, __VA_ARGS__)

/* Out of memory building the job: an internal error, not the client's. */
static int oom(struct dshm_job *job)
{
    job->error = DG_SHM_ERR_INTERNAL;
    snprintf(job->message, sizeof job->message, "out of memory");
    return -1;
}

/* Set key to a JSON number (checked finite). */
static int put_real(json_t *o, const char *key, double v, struct dshm_job *job)
{
    if (!isfinite(v))
        return bad(job, "%s: not a finite number", key);
    if (json_object_set_new(o, key, json_real(v)) != 0)
        return oom(job);
    return 0;
}

static int put_int(json_t *o, const char *key, long long v, struct dshm_job *job)
{
    if (json_object_set_new(o, key, json_integer(v)) != 0)
        return oom(job);
    return 0;
}

/* The request object of a TEXT or IDS entry e (copied), with its prompt
 * and stop bytes; the values are checked by the protocol parser later, the
 * form here.  NULL with job->error set when the entry cannot be used. */
static json_t *request_of(const struct dshm_ring *r, const struct dg_shm_sqe *e,
                          const unsigned char *prompt, const unsigned char *stop,
                          struct dshm_job *job)
{
    json_t *o = json_pack("{s:i,s:s,s:b,s:b}", "v", 1, "op", "generate", "stream", 0, "batch",
                          (e->flags & DG_SHM_F_BATCH) != 0);
    const uint32_t set = e->set;
    int rc = 0;

    if (!o) {
        oom(job);
        return NULL;
    }
    if (e->op == DG_SHM_OP_TEXT) {
        json_t *s;
        if (e->prompt_len && (memchr(prompt, 0, e->prompt_len) ||
                              dg_utf8_valid_prefix(prompt, e->prompt_len) != e->prompt_len))
            rc = bad(job, "prompt: not UTF-8 text (or it holds a NUL byte)");
        else if (!(s = json_stringn(e->prompt_len ? (const char *)prompt : "", e->prompt_len)) ||
                 json_object_set_new(o, "prompt", s) != 0 ||
                 ((e->flags & (DG_SHM_F_PLAIN_TEXT | DG_SHM_F_PARSE_SPECIAL)) &&
                  json_object_set_new(o, "parse_special",
                                      json_boolean(e->flags & DG_SHM_F_PARSE_SPECIAL)) != 0))
            rc = oom(job);
    } else {
        json_t *a = json_array();
        if (e->prompt_len % 4 != 0)
            rc = bad(job, "prompt: %u bytes is not a whole number of int32 token ids",
                     e->prompt_len);
        else if (r->max_prompt_ids && e->prompt_len / 4 > r->max_prompt_ids)
            rc = too_large(job, "prompt_ids: %u tokens; at most %llu", e->prompt_len / 4,
                           (unsigned long long)r->max_prompt_ids);
        for (uint32_t i = 0; rc == 0 && a && i < e->prompt_len / 4; i++) {
            int32_t id;
            memcpy(&id, prompt + 4 * (size_t)i, 4);
            if (json_array_append_new(a, json_integer(id)) != 0)
                rc = oom(job);
        }
        if (rc == 0 && (!a || json_object_set_new(o, "prompt_ids", a) != 0)) {
            a = NULL;
            rc = oom(job);
        }
        if (rc < 0)
            json_decref(a);
    }
    if (rc == 0 && (set & ~(uint32_t)DG_SHM_SET_ALL))
        rc = bad(job, "set: unknown bits 0x%x", set & ~(uint32_t)DG_SHM_SET_ALL);
    if (rc == 0 && (set & DG_SHM_SET_CANVAS_LENGTH))
        rc = put_int(o, "canvas_length", e->canvas_length, job);
    if (rc == 0 && (set & DG_SHM_SET_MAX_DENOISING_STEPS))
        rc = put_int(o, "max_denoising_steps", e->max_denoising_steps, job);
    if (rc == 0 && (set & DG_SHM_SET_STABILITY_THRESHOLD))
        rc = put_int(o, "stability_threshold", e->stability_threshold, job);
    if (rc == 0 && (set & DG_SHM_SET_TOP_K))
        rc = put_int(o, "top_k", e->top_k, job);
    if (rc == 0 && (set & DG_SHM_SET_ENTROPY_BOUND))
        rc = put_real(o, "entropy_bound", e->entropy_bound, job);
    if (rc == 0 && (set & DG_SHM_SET_CONFIDENCE_THRESHOLD))
        rc = put_real(o, "confidence_threshold", e->confidence_threshold, job);
    if (rc == 0 && (set & DG_SHM_SET_T_MIN))
        rc = put_real(o, "t_min", e->t_min, job);
    if (rc == 0 && (set & DG_SHM_SET_T_MAX))
        rc = put_real(o, "t_max", e->t_max, job);
    if (rc == 0 && (set & DG_SHM_SET_TOP_P))
        rc = put_real(o, "top_p", e->top_p, job);
    if (rc == 0 && (set & DG_SHM_SET_SEED)) {
        if (e->seed > (uint64_t)INT64_MAX)
            rc = bad(job, "seed: %llu is larger than 2^63 - 1", (unsigned long long)e->seed);
        else
            rc = put_int(o, "seed", (long long)e->seed, job);
    }
    if (rc == 0 && (set & DG_SHM_SET_MAX_TOKENS))
        rc = put_int(o, "max_tokens", (long long)e->max_tokens, job);
    if (rc == 0 && (set & DG_SHM_SET_STOP_IDS)) {
        json_t *a = json_array();
        if (e->n_stop_ids > DG_SHM_MAX_STOP_IDS)
            rc = bad(job, "n_stop_ids: %u is more than %d", e->n_stop_ids, DG_SHM_MAX_STOP_IDS);
        for (uint32_t i = 0; rc == 0 && a && i < e->n_stop_ids; i++)
            if (json_array_append_new(a, json_integer(e->stop_ids[i])) != 0)
                rc = oom(job);
        if (rc == 0 && (!a || json_object_set_new(o, "stop_token_ids", a) != 0)) {
            a = NULL;
            rc = oom(job);
        }
        if (rc < 0)
            json_decref(a);
    }
    if (rc == 0 && (set & DG_SHM_SET_STOP)) {
        json_t *a = json_array();
        size_t i = 0;
        if (e->stop_len > 0 && stop[e->stop_len - 1] != 0)
            rc = bad(job, "stop: the strings must each end with a NUL byte");
        if (rc == 0 && r->max_stop_strings) {
            /* counted before any is copied (each ends with its NUL) */
            size_t n = 0;
            for (const unsigned char *q = stop, *end = stop + e->stop_len;
                 n <= r->max_stop_strings && (q = memchr(q, 0, (size_t)(end - q))) != NULL; q++)
                n++;
            if (n > r->max_stop_strings)
                rc = bad(job, "stop: more than %u strings", r->max_stop_strings);
        }
        while (rc == 0 && a && i < e->stop_len) {
            const size_t n = strlen((const char *)stop + i);
            json_t *s;
            if (dg_utf8_valid_prefix(stop + i, n) != n)
                rc = bad(job, "stop: not UTF-8 text");
            else if (!(s = json_stringn((const char *)stop + i, n)) ||
                     json_array_append_new(a, s) != 0)
                rc = oom(job);
            i += n + 1;
        }
        if (rc == 0 && (!a || json_object_set_new(o, "stop", a) != 0)) {
            a = NULL;
            rc = oom(job);
        }
        if (rc < 0)
            json_decref(a);
    }
    if (rc < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* dshm_ring_next, or with cancels_only dshm_ring_next_cancel.  The entry
 * is copied once, and that copy decides: a cancel needs no slot. */
static int ring_take(struct dshm_ring *r, struct dshm_job *job, int cancels_only,
                     struct dg_error *err)
{
    struct dg_shm_sqe e;
    unsigned char *prompt = NULL, *stop = NULL;
    uint32_t tail;

    memset(job, 0, sizeof *job);
    if (r->broken)
        return dg_error_set(err, DG_E_FORMAT, "shm ring: abandoned"), -1;
    if (load_cq_head(r, __ATOMIC_ACQUIRE, err) < 0)
        return -1;
    tail = __atomic_load_n(&r->hdr->sq_tail, __ATOMIC_ACQUIRE);
    if ((uint32_t)(tail - r->sq_head) > r->g.sq_n)
        return fault(r, err, "sq_tail", tail), -1;
    if (tail == r->sq_head)
        return 0;
    /* copy the entry out (once: this copy is what counts), its bytes
     * below, then hand the entry back */
    memcpy(&e, r->map + r->g.sq_off + (uint64_t)(r->sq_head & (r->g.sq_n - 1)) * DG_SHM_SQE_SIZE,
           sizeof e);
    if (e.op != DG_SHM_OP_CANCEL) {
        if (cancels_only)
            return 0;
        /* a completion slot for it: jobs held + completions unreaped < cq_n */
        if (r->n_free == 0 || (r->g.cq_n - r->n_free) + (r->cq_tail - r->cq_head) >= r->g.cq_n) {
            /* ask for a ring after the client reaps; then look again, in
             * case it reaped between the check and the flag (seq_cst on
             * both sides: the client stores cq_head, then loads flags) */
            __atomic_fetch_or(&r->hdr->flags, DG_SHM_NEED_WAKE, __ATOMIC_SEQ_CST);
            if (load_cq_head(r, __ATOMIC_SEQ_CST, err) < 0)
                return -1;
            if (r->n_free == 0 || (r->g.cq_n - r->n_free) + (r->cq_tail - r->cq_head) >= r->g.cq_n)
                return 0;
        }
        __atomic_fetch_and(&r->hdr->flags, ~DG_SHM_NEED_WAKE, __ATOMIC_SEQ_CST);
    }
    /* (a cancel's user_data is the job it names) */
    job->user_data = e.op == DG_SHM_OP_CANCEL ? e.cancel_user_data : e.user_data;
    job->op = e.op;
    job->batch = (e.flags & DG_SHM_F_BATCH) != 0;
    if (e.op == DG_SHM_OP_TEXT || e.op == DG_SHM_OP_IDS) {
        if (copy_in(r, e.prompt_off, e.prompt_len, &prompt, "prompt", job) == 0 &&
            (e.set & DG_SHM_SET_STOP))
            copy_in(r, e.stop_off, e.stop_len, &stop, "stop", job);
    }
    r->sq_head++;
    __atomic_store_n(&r->hdr->sq_head, r->sq_head, __ATOMIC_RELEASE);

    if (e.op == DG_SHM_OP_CANCEL) {
        free(prompt);
        free(stop);
        return 1; /* no slot: it has no completion of its own */
    }
    if (job->error == 0) {
        if (e.op != DG_SHM_OP_TEXT && e.op != DG_SHM_OP_IDS)
            bad(job, "op: %u is not a known operation", e.op);
        else if (e.flags & ~DG_SHM_F_ALL)
            bad(job, "flags: unknown bits 0x%x", e.flags & ~DG_SHM_F_ALL);
        else if ((e.flags & (DG_SHM_F_PLAIN_TEXT | DG_SHM_F_PARSE_SPECIAL)) &&
                 e.op != DG_SHM_OP_TEXT)
            bad(job, "flags: PLAIN_TEXT and PARSE_SPECIAL are for a text prompt, not token ids");
        else if ((e.flags & DG_SHM_F_PLAIN_TEXT) && (e.flags & DG_SHM_F_PARSE_SPECIAL))
            bad(job, "flags: PLAIN_TEXT and PARSE_SPECIAL together");
        else
            job->request = request_of(r, &e, prompt, stop, job);
    }
    free(prompt);
    free(stop);
    job->slot = r->free_slots[--r->n_free];
    r->jobs[job->slot] = (struct rjob){1, e.user_data, 0, 0};
    return 1;
}

int dshm_ring_next(struct dshm_ring *r, struct dshm_job *job, struct dg_error *err)
{
    return ring_take(r, job, 0, err);
}

int dshm_ring_next_cancel(struct dshm_ring *r, struct dshm_job *job, struct dg_error *err)
{
    return ring_take(r, job, 1, err);
}

void dshm_ring_bind(struct dshm_ring *r, uint32_t slot, uint64_t id, uint64_t seed)
{
    if (slot < r->g.cq_n && r->jobs[slot].used) {
        r->jobs[slot].id = id;
        r->jobs[slot].seed = seed;
    }
}

uint64_t dshm_ring_id_of(const struct dshm_ring *r, uint32_t slot)
{
    return slot < r->g.cq_n && r->jobs[slot].used ? r->jobs[slot].id : 0;
}

int dshm_ring_find_id(const struct dshm_ring *r, uint64_t id)
{
    for (uint32_t i = 0; id && i < r->g.cq_n; i++)
        if (r->jobs[i].used && r->jobs[i].id == id)
            return (int)i;
    return -1;
}

int dshm_ring_find_user(const struct dshm_ring *r, uint64_t user_data)
{
    for (uint32_t i = 0; i < r->g.cq_n; i++)
        if (r->jobs[i].used && r->jobs[i].user_data == user_data)
            return (int)i;
    return -1;
}

/* ---- posting completions ------------------------------------------------------------------ */

/* Room for n bytes (8-aligned) in the result arena: its offset, or -1. */
static int64_t arena_alloc(struct dshm_ring *r, uint64_t n)
{
    uint64_t pos, off;
    n = round_up(n, 8);
    if (n > r->g.out_size)
        return -1;
    if (r->a_head == r->a_tail) /* empty: start a fresh lap, so any n fits */
        r->a_head = r->a_tail = round_up(r->a_tail, r->g.out_size);
    pos = r->a_tail;
    off = pos % r->g.out_size;
    if (off + n > r->g.out_size) {
        pos += r->g.out_size - off; /* skip the end: one piece each */
        off = 0;
    }
    if (pos + n - r->a_head > r->g.out_size)
        return -1;
    r->a_tail = pos + n;
    return (int64_t)off;
}

/* Post w if there is room: bytes, entry, then cq_tail (release).  Returns 1
 * when posted, 0 when it must wait. */
static int post(struct dshm_ring *r, struct waiting *w)
{
    const uint32_t i = r->cq_tail & (r->g.cq_n - 1);
    int64_t off;

    if ((uint32_t)(r->cq_tail - r->cq_head) >= r->g.cq_n)
        return 0;
    off = arena_alloc(r, w->len);
    if (off < 0)
        return 0;
    if (w->len)
        memcpy(r->map + r->g.out_off + (uint64_t)off, w->bytes, w->len);
    w->cqe.out_off = (uint64_t)off;
    memcpy(r->map + r->g.cq_off + (uint64_t)i * DG_SHM_CQE_SIZE, &w->cqe, sizeof w->cqe);
    r->cq_end[i] = r->a_tail;
    r->cq_tail++;
    __atomic_store_n(&r->hdr->cq_tail, r->cq_tail, __ATOMIC_RELEASE);
    /* the job's slot is free again */
    if (w->slot < r->g.cq_n && r->jobs[w->slot].used) {
        r->jobs[w->slot].used = 0;
        r->free_slots[r->n_free++] = w->slot;
    }
    return 1;
}

/* The completion doorbell is owed (the caller writes it: dshm_ring_bell_due). */
static void ring_bell(struct dshm_ring *r)
{
    r->bell_due = 1;
}

int dshm_ring_bell_due(struct dshm_ring *r)
{
    const int due = r->bell_due;
    r->bell_due = 0;
    return due;
}

/* Post waiting completions in order while there is room; 1 if any went. */
static int post_waiting(struct dshm_ring *r)
{
    int any = 0;
    while (r->wait_head && post(r, r->wait_head)) {
        struct waiting *w = r->wait_head;
        r->wait_head = w->next;
        if (!r->wait_head)
            r->wait_tail = NULL;
        if (!w->spare)
            free(w);
        any = 1;
    }
    return any;
}

int dshm_ring_complete(struct dshm_ring *r, uint32_t slot, const struct dshm_result *res)
{
    struct dg_shm_cqe c;
    struct waiting *w;
    size_t ids_bytes = res->n_ids * sizeof(int32_t), len = ids_bytes + res->text_len;
    char msg[160];
    const int32_t *ids = res->ids;
    const char *text = res->text;
    size_t text_len = res->text_len, n_ids = res->n_ids;
    int rc = 0;

    if (slot >= r->g.cq_n || !r->jobs[slot].used)
        return 0;
    memset(&c, 0, sizeof c);
    c.user_data = r->jobs[slot].user_data;
    c.request_id = r->jobs[slot].id;
    c.seed = r->jobs[slot].seed;
    c.status = res->status;
    c.finish = res->finish;
    c.prompt_tokens = res->prompt_tokens;
    c.completion_tokens = res->completion_tokens;
    c.canvases = res->canvases;
    c.stop_id = res->stop_id;
    c.decoder_steps = res->decoder_steps;
    c.tokens_per_s = res->tokens_per_s;
    c.ms_total = res->ms_total;
    c.ms_first_canvas = res->ms_first_canvas;
    if (round_up(len, 8) > r->g.out_size || len > UINT32_MAX) {
        snprintf(msg, sizeof msg, "the output (%zu bytes) is larger than the ring's result "
                 "arena (%llu bytes)", len, (unsigned long long)r->g.out_size);
        c.status = DG_SHM_ERR_TOO_LARGE;
        ids = NULL;
        n_ids = ids_bytes = 0;
        text = msg;
        text_len = len = strlen(msg);
    }
    c.n_ids = (uint32_t)n_ids;
    c.text_len = (uint32_t)text_len;
    w = malloc(sizeof *w + len);
    if (w) {
        w->spare = 0;
        w->len = len;
        if (ids_bytes)
            memcpy(w->bytes, ids, ids_bytes);
        if (text_len)
            memcpy(w->bytes + ids_bytes, text, text_len);
    } else {
        /* (out of memory: the slot's spare, an internal error without text) */
        w = (struct waiting *)(r->spares + (size_t)slot * sizeof(struct waiting));
        w->spare = 1;
        w->len = 0;
        c.status = DG_SHM_ERR_INTERNAL;
        c.finish = DG_SHM_FINISH_ERROR;
        c.n_ids = c.text_len = 0;
        rc = -DG_E_NOMEM;
    }
    w->next = NULL;
    w->slot = slot;
    w->cqe = c;
    if (r->broken) {
        if (!w->spare)
            free(w);
        r->jobs[slot].used = 0;
        r->free_slots[r->n_free++] = slot;
        return 0;
    }
    if (r->wait_tail)
        r->wait_tail->next = w;
    else
        r->wait_head = w;
    r->wait_tail = w;
    if (post_waiting(r))
        ring_bell(r);
    return rc;
}

int dshm_ring_flush(struct dshm_ring *r, struct dg_error *err)
{
    if (r->broken)
        return -1;
    if (load_cq_head(r, __ATOMIC_ACQUIRE, err) < 0)
        return -1;
    if (post_waiting(r))
        ring_bell(r);
    return 0;
}
