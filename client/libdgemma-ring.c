/*
 * libdgemma-ring.c - the shared-memory ring (the client side of
 * lib/shm-layout.h; dgemma_ring_t in libdgemma-internal.h), its attach:
 * dgemma_ring_attach asks for a ring on the connection and waits for the
 * answer among the other events, ring_map maps and checks what the daemon
 * sent, dgemma_ring_detach lets it go; and what every ring call shares:
 * the ring's state checks (dgc_ring_gone, dgc_ring_break) and its
 * submission doorbell.  Submissions are in libdgemma-ring-submit.c,
 * completions in libdgemma-ring-reap.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/libdgemma-internal.h"
#include "lib/json-util.h"

static int is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* The ring no longer usable: remember why, for every later call. */
int dgc_ring_break(dgemma_ring_t *ring, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring->why, sizeof ring->why, fmt, ap);
    va_end(ap);
    ring->broken = 1;
    return dgc_seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: %s", ring->why);
}

/* Whether the connection's socket says the daemon hung up (a poll that
 * does not wait); sets ring->hup.  A failing poll counts as no. */
int dgc_ring_hung_up(dgemma_ring_t *ring)
{
    struct pollfd p = {ring->sock, POLLRDHUP, 0};
    if (!ring->hup && poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
        ring->hup = 1;
    return ring->hup;
}

/* 0, or the status a ring call returns at once: DGEMMA_E_PROTOCOL (broken)
 * or DGEMMA_E_CLOSED (the daemon set DG_SHM_FAULT, or the connection hung
 * up), with the message set.  The caller decides whether completions still
 * in the ring come first. */
int dgc_ring_gone(dgemma_ring_t *ring)
{
    if (ring->broken)
        return dgc_seterr(ring->c, DGEMMA_E_PROTOCOL, "ring: %s", ring->why);
    if (__atomic_load_n(&ring->h->flags, __ATOMIC_ACQUIRE) & DG_SHM_FAULT)
        return dgc_seterr(ring->c, DGEMMA_E_CLOSED,
                          "ring: the daemon left the ring (DG_SHM_FAULT: it broke a rule)");
    if (ring->hup)
        return dgc_seterr(ring->c, DGEMMA_E_CLOSED, "ring: the daemon closed the connection");
    return DGEMMA_OK;
}

/* Add 1 to the submission doorbell. */
int dgc_ring_doorbell(dgemma_ring_t *ring)
{
    const uint64_t one = 1;
    char eb[128];
    for (;;) {
        ssize_t w = write(ring->sq_efd, &one, sizeof one);
        if (w == (ssize_t)sizeof one)
            return DGEMMA_OK;
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) /* the counter is at its top: a wake-up is pending */
            return DGEMMA_OK;
        return dgc_seterr(ring->c, DGEMMA_E_IO, "ring: the submission doorbell: %s",
                          w < 0 ? dgc_errstr(errno, eb, sizeof eb) : "a short write");
    }
}

/* ---- attach ---- */

/* Map and check the ring the daemon sent: the shm_attached event o and its
 * descriptors fds[3] (memfd, submission doorbell, completion doorbell),
 * which it takes (closed on failure, the doorbells kept on success).
 * DGEMMA_E_PROTOCOL for anything that does not fit lib/shm-layout.h. */
static int ring_map(dgemma_t *c, const json_t *o, int fds[3], dgemma_ring_t **out)
{
    static const char *const KEYS[] = {"version", "size", "sq_entries", "cq_entries", "in_bytes",
                                       "out_bytes"};
    json_int_t v[6];
    struct dg_shm_header g;
    struct stat st;
    dgemma_ring_t *ring = NULL;
    void *base = MAP_FAILED;
    size_t size;
    char eb[128];
    int rc, fl;
    struct {
        const char *name;
        uint64_t off, len;
    } reg[4];

    for (int i = 0; i < 6; i++) {
        const json_t *x = json_object_get(o, KEYS[i]);
        if (!json_is_integer(x) || json_integer_value(x) <= 0) {
            rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: \"%s\" is not a positive integer",
                            KEYS[i]);
            goto fail;
        }
        v[i] = json_integer_value(x);
    }
    if (v[0] != (json_int_t)DG_SHM_VERSION) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL,
                        "shm_attached: ring version %lld; this library knows %u", (long long)v[0],
                        DG_SHM_VERSION);
        goto fail;
    }
    if ((uint64_t)v[1] < DG_SHM_HEADER_SIZE || (uint64_t)v[1] > SIZE_MAX) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: a size of %lld bytes",
                        (long long)v[1]);
        goto fail;
    }
    size = (size_t)v[1];
    if (fstat(fds[0], &st) != 0) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: fstat of the ring: %s",
                        dgc_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_size != (off_t)size) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL,
                        "shm_attached: the ring's file is %s of %lld bytes, not the %zu announced",
                        S_ISREG(st.st_mode) ? "a file" : "not a file", (long long)st.st_size, size);
        goto fail;
    }
    fl = fcntl(fds[0], F_GET_SEALS);
    if (fl < 0 || !(fl & F_SEAL_SHRINK)) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: the ring's memfd is not sealed "
                        "against shrinking");
        goto fail;
    }
    /* our reads of the completion doorbell must not wait (the daemon makes it
     * EFD_NONBLOCK; the flag is the open file's, shared with the daemon) */
    fl = fcntl(fds[2], F_GETFL);
    if (fl < 0 || fcntl(fds[1], F_GETFL) < 0 ||
        (!(fl & O_NONBLOCK) && fcntl(fds[2], F_SETFL, fl | O_NONBLOCK) != 0)) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "shm_attached: a doorbell descriptor: %s",
                        dgc_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (base == MAP_FAILED) {
        rc = dgc_seterr(c, errno == ENOMEM ? DGEMMA_E_NOMEM : DGEMMA_E_PROTOCOL,
                        "shm_attached: mmap of %zu bytes: %s", size,
                        dgc_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    /* check a copy: the mapping can change under us */
    memcpy(&g, base, sizeof g);
    if (g.magic != DG_SHM_MAGIC || g.version != DG_SHM_VERSION) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "ring header: magic 0x%08" PRIx32 " version %" PRIu32
                        " (want 0x%08x version %u)", g.magic, g.version, DG_SHM_MAGIC,
                        DG_SHM_VERSION);
        goto fail;
    }
    if (g.sq_entries != (uint64_t)v[2] || g.cq_entries != (uint64_t)v[3] ||
        g.in_size != (uint64_t)v[4] || g.out_size != (uint64_t)v[5] ||
        g.total_size != (uint64_t)v[1]) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL,
                        "ring header: its geometry (sq %" PRIu32 ", cq %" PRIu32 ", in %" PRIu64
                        ", out %" PRIu64 ", size %" PRIu64 ") is not the event's",
                        g.sq_entries, g.cq_entries, g.in_size, g.out_size, g.total_size);
        goto fail;
    }
    if (!is_pow2(g.sq_entries) || !is_pow2(g.cq_entries)) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "ring header: %" PRIu32 " and %" PRIu32
                        " entries: not powers of two", g.sq_entries, g.cq_entries);
        goto fail;
    }
    reg[0].name = "submissions", reg[0].off = g.sq_off;
    reg[0].len = (uint64_t)g.sq_entries * DG_SHM_SQE_SIZE;
    reg[1].name = "completions", reg[1].off = g.cq_off;
    reg[1].len = (uint64_t)g.cq_entries * DG_SHM_CQE_SIZE;
    reg[2].name = "the submission arena", reg[2].off = g.in_off, reg[2].len = g.in_size;
    reg[3].name = "the completion arena", reg[3].off = g.out_off, reg[3].len = g.out_size;
    for (int i = 0; i < 4; i++) {
        if (reg[i].off < DG_SHM_HEADER_SIZE || reg[i].off > size || reg[i].len > size - reg[i].off ||
            (i < 2 && reg[i].off % 8 != 0)) {
            rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "ring header: %s at [%" PRIu64 ", +%" PRIu64
                            ") %s", reg[i].name, reg[i].off, reg[i].len,
                        i < 2 && reg[i].off % 8 ? "is not 8-aligned"
                                                : "is not inside the region after the header");
            goto fail;
        }
        for (int j = 0; j < i; j++)
            if (reg[i].off < reg[j].off + reg[j].len && reg[j].off < reg[i].off + reg[i].len) {
                rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "ring header: %s overlaps %s", reg[i].name,
                                reg[j].name);
                goto fail;
            }
    }
    if (!(ring = calloc(1, sizeof *ring)) ||
        !(ring->slot = calloc(g.sq_entries, sizeof *ring->slot))) {
        rc = dgc_seterr(c, DGEMMA_E_NOMEM, "shm_attach: out of memory");
        goto fail;
    }
    ring->h = base;
    ring->sq_tail = __atomic_load_n(&ring->h->sq_tail, __ATOMIC_ACQUIRE);
    ring->cq_head = __atomic_load_n(&ring->h->cq_head, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&ring->h->sq_head, __ATOMIC_ACQUIRE) != ring->sq_tail ||
        __atomic_load_n(&ring->h->cq_tail, __ATOMIC_ACQUIRE) != ring->cq_head) {
        rc = dgc_seterr(c, DGEMMA_E_PROTOCOL, "ring header: a new ring that is not empty");
        goto fail;
    }
    if (close(fds[0]) != 0) { /* the mapping stays */
        fds[0] = -1;
        rc = dgc_seterr(c, DGEMMA_E_IO, "shm_attach: close: %s", dgc_errstr(errno, eb, sizeof eb));
        goto fail;
    }
    ring->c = c;
    ring->sock = c->fd;
    ring->sq_efd = fds[1];
    ring->cq_efd = fds[2];
    ring->base = base;
    ring->size = size;
    ring->sq = ring->base + g.sq_off;
    ring->cq = ring->base + g.cq_off;
    ring->in = ring->base + g.in_off;
    ring->out = ring->base + g.out_off;
    ring->sq_entries = g.sq_entries;
    ring->cq_entries = g.cq_entries;
    ring->in_size = g.in_size;
    ring->out_size = g.out_size;
    ring->sq_freed = ring->sq_tail;
    *out = ring;
    return DGEMMA_OK;
fail:
    if (ring)
        free(ring->slot);
    free(ring);
    if (base != MAP_FAILED)
        munmap(base, size);
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

/* What a line in the buffer is to a waiting dgemma_ring_attach. */
enum attach_kind { AK_OTHER, AK_ANSWER_OTHER, AK_ATTACHED, AK_ERROR_NO_ID, AK_NOMEM };

/* Parse line[0, n) (a '\r' already cut); *o: the parse when it is an
 * event (the caller's to free), else NULL.  AK_NOMEM: it could not be read
 * for lack of memory (it may be the answer). */
static enum attach_kind attach_classify(const char *line, size_t n, json_t **o,
                                        uint64_t *max_id)
{
    struct dg_error err = {0};
    json_t *v = dg_json_loadb(line, n, JSON_ALLOW_NUL, "event", &err), *ver;
    const char *kind;
    *o = NULL;
    if (!v)
        return err.code == DG_E_NOMEM ? AK_NOMEM : AK_OTHER;
    ver = json_object_get(v, "v");
    kind = dgc_str_of(v, "event");
    if (!json_is_object(v) || !json_is_integer(ver) || json_integer_value(ver) != 1 || !kind) {
        json_decref(v);
        return AK_OTHER;
    }
    *o = v;
    if (!strcmp(kind, "shm_attached"))
        return AK_ATTACHED;
    if (!strcmp(kind, "error") && (!json_object_get(v, "id") || json_is_null(json_object_get(v, "id"))))
        return AK_ERROR_NO_ID;
    return dgc_is_answer(v, max_id) ? AK_ANSWER_OTHER : AK_OTHER;
}

int dgemma_ring_attach(dgemma_t *c, const dgemma_ring_opts_t *opts, dgemma_ring_t **out)
{
    static const char *const NAMES[] = {"sq_entries", "cq_entries", "in_bytes", "out_bytes"};
    char line[320];
    size_t n, seen = 0; /* bytes after c->start known not to hold the answer */
    unsigned long before; /* answers due to earlier lines, before ours */
    uint64_t max_id;      /* (a copy: dgemma_next_event notes the ids again) */
    int rc;

    if (!c)
        return DGEMMA_E_INVAL;
    if (!out)
        return dgc_seterr(c, DGEMMA_E_INVAL, "shm_attach: a NULL out pointer");
    *out = NULL;
    if (c->fd < 0)
        return dgc_seterr(c, DGEMMA_E_INVAL, "shm_attach: not connected");
    n = (size_t)snprintf(line, sizeof line, "{\"v\":1,\"op\":\"shm_attach\"");
    for (int i = 0; opts && i < 4; i++) {
        uint64_t x = i == 0 ? opts->sq_entries : i == 1 ? opts->cq_entries
                     : i == 2 ? (uint64_t)opts->in_bytes : (uint64_t)opts->out_bytes;
        if (x == 0)
            continue;
        if (i < 2) { /* a power of two, as the daemon takes it */
            uint64_t p = 1;
            while (p < x && p < ((uint64_t)1 << 31))
                p <<= 1;
            x = p;
        } else if (x > ((uint64_t)1 << 62)) {
            x = (uint64_t)1 << 62;
        }
        n += (size_t)snprintf(line + n, sizeof line - n, ",\"%s\":%" PRIu64, NAMES[i], x);
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "}\n");
    dgc_fds_drop(c);
    if ((rc = dgc_send_all(c, line, n, "shm_attach")) < 0)
        return rc;
    before = c->unanswered;
    max_id = c->max_id;
    for (;;) {
        char *nl;
        if (c->skipping && c->end > c->start) { /* the tail of an overlong line */
            nl = memchr(c->buf + c->start, '\n', c->end - c->start);
            c->start = c->scan = nl ? (size_t)(nl - c->buf) + 1 : c->end;
            c->skipping = !nl;
        }
        while (!c->skipping && c->end - c->start > seen &&
               (nl = memchr(c->buf + c->start + seen, '\n', c->end - c->start - seen)) != NULL) {
            const size_t ls = c->start + seen, le = (size_t)(nl - c->buf) + 1;
            size_t len = le - 1 - ls;
            enum attach_kind k;
            json_t *o;
            if (len > 0 && c->buf[ls + len - 1] == '\r')
                len--;
            seen = le - c->start;
            k = attach_classify(c->buf + ls, len, &o, &max_id);
            if (k == AK_NOMEM) { /* (waiting on would wait for ever if it was ours) */
                dgc_fds_drop(c);
                return dgc_seterr(c, DGEMMA_E_NOMEM,
                                  "shm_attach: out of memory reading the daemon's events");
            }
            if (k == AK_ANSWER_OTHER || (k == AK_ERROR_NO_ID && before > 0)) {
                if (before > 0)
                    before--;
                k = AK_OTHER;
            }
            if (k == AK_OTHER) { /* left for dgemma_next_event */
                json_decref(o);
                continue;
            }
            /* ours: take the line out of the buffer */
            memmove(c->buf + ls, c->buf + le, c->end - le);
            c->end -= le - ls;
            c->scan = c->start;
            if (k == AK_ERROR_NO_ID) {
                const char *code = dgc_str_of(o, "code"), *msg = dgc_str_of(o, "message");
                rc = dgc_seterr(c, DGEMMA_E_DAEMON, "shm_attach refused (%s): %s",
                                code ? code : "no code", msg ? msg : "no message");
                json_decref(o);
                dgc_fds_drop(c);
                return rc;
            }
            if (c->n_fds != 3 || c->fds_lost) {
                rc = dgc_seterr(c, DGEMMA_E_PROTOCOL,
                                "shm_attached came with %d descriptor(s)%s; it needs 3", c->n_fds,
                                c->fds_lost ? " and more lost" : "");
                json_decref(o);
                dgc_fds_drop(c);
                return rc;
            }
            c->n_fds = 0; /* ring_map takes them */
            rc = ring_map(c, o, c->fds, out);
            json_decref(o);
            if (rc == DGEMMA_OK)
                c->err[0] = '\0';
            return rc;
        }
        if (c->end - c->start > LINE_MAX_BYTES)
            return dgc_seterr(c, DGEMMA_E_PROTOCOL,
                              "shm_attach: no answer within 256 MiB of events (read them first)");
        if (c->eof)
            return dgc_seterr(c, DGEMMA_E_CLOSED,
                              "shm_attach: the daemon closed the connection before answering");
        rc = dgc_fill(c, -1, 1);
        if (rc < 0 && rc != DGEMMA_E_AGAIN)
            return rc;
    }
}

void dgemma_ring_detach(dgemma_ring_t *r)
{
    if (!r)
        return;
    munmap(r->base, r->size);
    close(r->sq_efd);
    close(r->cq_efd);
    free(r->slot);
    free(r->obuf);
    free(r);
}

int dgemma_ring_fd(const dgemma_ring_t *ring)
{
    return ring ? ring->cq_efd : -1;
}
