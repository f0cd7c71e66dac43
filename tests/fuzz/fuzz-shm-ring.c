/*
 * Fuzz target: a shared-memory ring as a hostile client leaves it (what any
 * local process that attached may write).  The input's first byte is how
 * many submission entries it published (may exceed the ring: an index out
 * of range); then the entries' bytes (160 each), then the prompt arena.
 * Properties: the ring either faults (and then stays broken) or yields
 * exactly one job per entry, each a request object that the protocol
 * parser accepts or refuses with a stable code, or an error with a
 * message; completing every job posts one completion each; nothing leaks.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/protocol.h"
#include "daemon/shm-ring.h"
#include "tests/fuzz/fuzz-proto-ctx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct dproto_ctx *ctx = &fuzz_proto_ctx()->ctx;
    const struct dshm_sizes ask = {16, 16, 4096, 4096};
    const struct dshm_limits lim = {.max_entries = 16, .max_arena_bytes = 1 << 20};
    struct dshm_ring *r;
    struct dg_error err;
    struct dshm_sizes got;
    uint64_t total;
    unsigned char *map;
    struct dg_shm_header *h;
    size_t n_entries, off;
    uint32_t taken = 0;
    int fd, rc, faulted = 0;

    if (size < 1)
        return 0;
    if (dshm_ring_create(&ask, &lim, &r, &fd, &err) != 0)
        abort();
    dshm_ring_sizes(r, &got, &total);
    map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        abort();
    h = (struct dg_shm_header *)map;
    n_entries = data[0];
    off = 1;
    for (size_t i = 0; i < got.sq_entries && off < size; i++) {
        size_t n = size - off < DG_SHM_SQE_SIZE ? size - off : DG_SHM_SQE_SIZE;
        memcpy(map + h->sq_off + i * DG_SHM_SQE_SIZE, data + off, n);
        off += n;
    }
    if (off < size)
        memcpy(map + h->in_off, data + off, size - off < got.in_bytes ? size - off : got.in_bytes);
    __atomic_store_n(&h->sq_tail, (uint32_t)n_entries, __ATOMIC_RELEASE);
    for (;;) {
        struct dshm_job job;
        struct dshm_result res;
        rc = dshm_ring_next(r, &job, &err);
        if (rc < 0) {
            faulted = 1;
            if (n_entries <= got.sq_entries || !dshm_ring_broken(r))
                abort(); /* only an index out of range breaks the ring */
            break;
        }
        if (rc == 0)
            break;
        taken++;
        if (job.op == DG_SHM_OP_CANCEL) {
            if (job.request)
                abort();
            continue;
        }
        memset(&res, 0, sizeof res);
        if (job.request) {
            struct dproto_request req;
            struct dproto_error perr;
            if (job.error)
                abort();
            if (dproto_parse_json(job.request, ctx, &req, &perr) == 0) {
                if (req.op != DPROTO_GENERATE || req.stream || req.n_ids == 0)
                    abort();
                dproto_request_free(&req);
            } else if (!perr.code || !perr.message[0]) {
                abort();
            }
            json_decref(job.request);
        } else if (!job.error || !job.message[0]) {
            abort();
        }
        res.status = job.error;
        res.text = job.message;
        res.text_len = strlen(job.message);
        if (dshm_ring_complete(r, job.slot, &res) != 0)
            abort();
    }
    if (!faulted && taken != (n_entries < got.sq_entries ? n_entries : got.sq_entries))
        abort();
    munmap(map, total);
    dshm_ring_destroy(r);
    return 0;
}
