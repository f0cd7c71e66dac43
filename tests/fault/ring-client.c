/*
 * ring-client - a fixed round of ring jobs through libdgemma, for
 * t-client-nomem: linked with the fault injector around its allocation
 * calls ($BUILD/tests/fault/ring-client), it runs once with nothing
 * failing and then once for each call failing alone.
 *
 * usage: ring-client SOCKET
 * Connects, attaches a ring, submits four jobs (text; token ids; text with
 * a stop string and a setting in JSON; one with max_tokens 0, which the
 * daemon refuses in its completion), kicks, and reaps the four
 * completions.  Prints one line a job, in user_data order:
 *   USER_DATA FINISH_REASON|CODE TEXT          (refused: "-" for the reason)
 * Exit 0 when all four came back; 1 with "out of memory" on standard
 * error when a call failed for memory; 3 for any other failure.
 * dgemma_ring_reap failing for memory keeps the completion for the next
 * call (libdgemma(3)): that failure is retried once, noted on standard
 * error, and the run must still print what a clean run prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/dgemma.h"

#define JOBS 4

static int fail(dgemma_t *c, const char *what, int e)
{
    fprintf(stderr, "ring-client: %s: %s\n", what,
            e == DGEMMA_E_NOMEM ? "out of memory" : c ? dgemma_errmsg(c) : "failed");
    return e == DGEMMA_E_NOMEM ? 1 : 3;
}

/* Job k's request: NULL when out of memory (every text here is UTF-8). */
static dgemma_request_t *job(int k, int *rc)
{
    static const int32_t ids[] = {5, 6, 7};
    dgemma_request_t *r = k == 1 ? dgemma_request_ids(ids, 3)
                                 : dgemma_request_text(k == 2 ? "three" : "one");
    int e = 0;
    if (!r) {
        *rc = DGEMMA_E_NOMEM;
        return NULL;
    }
    if ((e = dgemma_request_set_int(r, "max_tokens", k == 3 ? 0 : 8)) == 0 &&
        (e = dgemma_request_set_int(r, "max_denoising_steps", 1)) == 0 &&
        (e = dgemma_request_set_int(r, "seed", k + 1)) == 0 && k == 2 &&
        (e = dgemma_request_add_stop(r, "zz")) == 0)
        e = dgemma_request_set_json(r, "{\"top_k\": 5}");
    if (e < 0) {
        dgemma_request_free(r);
        *rc = e;
        return NULL;
    }
    return r;
}

int main(int argc, char **argv)
{
    dgemma_t *c;
    dgemma_ring_t *ring = NULL;
    char *lines[JOBS] = {0};
    int rc = 0, e, got = 0, retried = 0;

    if (argc != 2) {
        fputs("usage: ring-client SOCKET\n", stderr);
        return 2;
    }
    if (!(c = dgemma_new()))
        return fail(NULL, "dgemma_new", DGEMMA_E_NOMEM);
    if ((e = dgemma_connect(c, argv[1], 5.0)) < 0) {
        rc = fail(c, "connect", e);
        goto out;
    }
    if ((e = dgemma_ring_attach(c, NULL, &ring)) < 0) {
        rc = fail(c, "attach", e);
        goto out;
    }
    for (int k = 0; k < JOBS; k++) {
        dgemma_request_t *r = job(k, &e);
        if (!r) {
            rc = fail(NULL, "request", e);
            goto out;
        }
        e = dgemma_ring_submit(ring, r, (uint64_t)k);
        dgemma_request_free(r);
        if (e < 0) {
            rc = fail(c, "submit", e);
            goto out;
        }
    }
    if ((e = dgemma_ring_kick(ring)) < 0) {
        rc = fail(c, "kick", e);
        goto out;
    }
    while (got < JOBS) {
        dgemma_completion_t cpl;
        e = dgemma_ring_reap(ring, &cpl);
        if (e == DGEMMA_E_AGAIN) {
            if ((e = dgemma_ring_wait(ring, 30000)) < 0) {
                rc = fail(c, "wait", e);
                goto out;
            }
            continue;
        }
        if (e == DGEMMA_E_NOMEM && !retried) {
            fprintf(stderr, "ring-client: reap: %s; again\n", dgemma_errmsg(c));
            retried = 1;
            continue;
        }
        if (e < 0) {
            rc = fail(c, "reap", e);
            goto out;
        }
        if (cpl.user_data >= JOBS || lines[cpl.user_data]) {
            fprintf(stderr, "ring-client: a completion for job %llu, unknown or twice\n",
                    (unsigned long long)cpl.user_data);
            rc = 3;
            goto out;
        }
        if (asprintf(&lines[cpl.user_data], "%llu %s|%s %s\n",
                     (unsigned long long)cpl.user_data,
                     cpl.finish_reason ? cpl.finish_reason : "-", cpl.code ? cpl.code : "",
                     cpl.text) < 0) {
            lines[cpl.user_data] = NULL;
            rc = fail(NULL, "output", DGEMMA_E_NOMEM);
            goto out;
        }
        got++;
    }
    for (int k = 0; k < JOBS; k++)
        fputs(lines[k], stdout);
    if (fflush(stdout) != 0)
        rc = 3;
out:
    for (int k = 0; k < JOBS; k++)
        free(lines[k]);
    dgemma_ring_detach(ring);
    dgemma_close(c);
    return rc;
}
