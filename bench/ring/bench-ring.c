/*
 * bench-ring - what a job costs to submit through the shared-memory ring
 * and through the socket, side by side in one run against one dgemmad.
 *
 * usage: bench-ring [JOBS] [ROUNDS]          (defaults 2000 and 7)
 * Starts $BUILD/bin/dgemmad (BUILD defaults to "build") on the embedded
 * default model with room for every job at once, then alternates rounds:
 * JOBS tiny jobs (3 prompt ids, one token, one denoising step, canvas 4)
 * over one socket connection (dgemma_submit each, not streamed), then the
 * same jobs through one ring (dgemma_ring_submit each, one kick).  For each
 * path it prints the medians over the rounds of:
 *   submit us/job     wall time of the submission loop / JOBS
 *   client CPU us/job the client's CPU time for the whole round / JOBS
 *   front-end us/job  the daemon's front-end thread (its main thread) CPU
 *                     time for the round / JOBS (from /proc; 10 ms ticks)
 *   jobs/s            JOBS / the round's wall time, submit to last result
 * Not a test: it prints a table and asserts nothing about speed.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/dgemma.h"

struct round {
    double submit, client_cpu, front_end, wall;
};

static double now(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of the daemon's main thread (the io_uring front end). */
static double front_end_cpu(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long long ut = 0, st = 0;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)pid);
    if (!(f = fopen(path, "r")))
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* after the ")" of the command name: state is field 3, utime 14, stime 15 */
    if (!(p = strrchr(buf, ')')) ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static dgemma_request_t *job(int i)
{
    const int32_t ids[3] = {2, 100 + i % 50, 101};
    dgemma_request_t *r = dgemma_request_ids(ids, 3);
    if (!r || dgemma_request_set_int(r, "max_tokens", 1) || dgemma_request_set_int(r, "seed", i) ||
        dgemma_request_set_int(r, "max_denoising_steps", 1) ||
        dgemma_request_set_int(r, "canvas_length", 4) || dgemma_request_set_stream(r, 0)) {
        fprintf(stderr, "bench-ring: cannot build a request\n");
        exit(1);
    }
    return r;
}

static int socket_round(dgemma_t *c, int jobs, pid_t d, struct round *out)
{
    const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    const double f0 = front_end_cpu(d);
    dgemma_event_t ev;
    int done = 0;
    for (int i = 0; i < jobs; i++) {
        dgemma_request_t *r = job(i);
        int rc = dgemma_submit(c, r);
        dgemma_request_free(r);
        if (rc) {
            fprintf(stderr, "bench-ring: submit: %s\n", dgemma_errmsg(c));
            return -1;
        }
    }
    out->submit = now(CLOCK_MONOTONIC) - w0;
    while (done < jobs) {
        if (dgemma_next_event(c, &ev, 60000)) {
            fprintf(stderr, "bench-ring: socket: %s\n", dgemma_errmsg(c));
            return -1;
        }
        if (ev.kind == DGEMMA_EV_ERROR) {
            fprintf(stderr, "bench-ring: socket: %s\n", ev.json);
            return -1;
        }
        done += ev.kind == DGEMMA_EV_DONE;
    }
    out->wall = now(CLOCK_MONOTONIC) - w0;
    out->client_cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    out->front_end = front_end_cpu(d) - f0;
    return 0;
}

static int ring_round(dgemma_ring_t *ring, int jobs, pid_t d, struct round *out)
{
    const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    const double f0 = front_end_cpu(d);
    dgemma_completion_t comp;
    int done = 0;
    for (int i = 0; i < jobs; i++) {
        dgemma_request_t *r = job(i);
        int rc = dgemma_ring_submit(ring, r, (uint64_t)i);
        dgemma_request_free(r);
        if (rc) {
            fprintf(stderr, "bench-ring: ring submit: %d\n", rc);
            return -1;
        }
    }
    if (dgemma_ring_kick(ring)) {
        fprintf(stderr, "bench-ring: kick failed\n");
        return -1;
    }
    out->submit = now(CLOCK_MONOTONIC) - w0;
    while (done < jobs) {
        int rc = dgemma_ring_reap(ring, &comp);
        if (rc == DGEMMA_E_AGAIN) {
            if (dgemma_ring_wait(ring, 60000)) {
                fprintf(stderr, "bench-ring: ring: no completion in 60 s\n");
                return -1;
            }
            continue;
        }
        if (rc || comp.code) {
            fprintf(stderr, "bench-ring: ring: %d %s %s\n", rc, comp.code ? comp.code : "",
                    comp.message ? comp.message : "");
            return -1;
        }
        done++;
    }
    out->wall = now(CLOCK_MONOTONIC) - w0;
    out->client_cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    out->front_end = front_end_cpu(d) - f0;
    return 0;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const struct round *r, int n, size_t field)
{
    double v[64];
    for (int i = 0; i < n; i++)
        v[i] = *(const double *)((const char *)&r[i] + field);
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    const int jobs = argc > 1 ? atoi(argv[1]) : 2000, rounds = argc > 2 ? atoi(argv[2]) : 7;
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char dir[] = "/tmp/bench-ring-XXXXXX", sock[128], bin[512], o_sock[160], o_log[160];
    struct round sr[64], rr[64];
    dgemma_t *cs = NULL, *cr = NULL;
    dgemma_ring_t *ring = NULL;
    dgemma_ring_opts_t ro = {0, 0, 0, 0};
    pid_t d;
    int st, rc = 1;

    if (jobs < 1 || jobs > 60000 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: bench-ring [JOBS 1..60000] [ROUNDS 1..64]\n");
        return 2;
    }
    if (!mkdtemp(dir)) {
        perror("bench-ring: mkdtemp");
        return 1;
    }
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(bin, sizeof bin, "%s/bin/dgemmad", build);
    snprintf(o_sock, sizeof o_sock, "socket=%s", sock);
    snprintf(o_log, sizeof o_log, "log_file=%s/d.log", dir);
    d = fork();
    if (d == 0) {
        /* (every job in flight at once on one connection: client_max_requests
         * at its top; as root, as CI runs, the daemon must be told) */
        const char *args[] = {bin,
                               "-o", o_sock,
                               "-o", o_log,
                               "-o", "pin_workers=false",
                               "-o", "max_batch=64",
                               "-o", "queue_max=100000",
                               "-o", "client_max_requests=100000",
                               "-o", "shm_max_entries=65536",
                               "-o", "max_output_bytes=1073741824",
                               "-o", "log_level=warn",
                               geteuid() == 0 ? "-o" : NULL,
                               "allow_root=true",
                               NULL};
        execv(bin, (char *const *)args);
        _exit(127);
    }
    cs = dgemma_new();
    cr = dgemma_new();
    ro.sq_entries = ro.cq_entries = (unsigned)jobs;
    if (!cs || !cr || dgemma_connect(cs, sock, 30) || dgemma_connect(cr, sock, 30) ||
        dgemma_ring_attach(cr, &ro, &ring)) {
        fprintf(stderr, "bench-ring: cannot reach the daemon or attach: %s %s\n",
                cs ? dgemma_errmsg(cs) : "", cr ? dgemma_errmsg(cr) : "");
        goto out;
    }
    /* one warm-up round each */
    if (socket_round(cs, jobs, d, &sr[0]) || ring_round(ring, jobs, d, &rr[0]))
        goto out;
    for (int i = 0; i < rounds; i++)
        if (socket_round(cs, jobs, d, &sr[i]) || ring_round(ring, jobs, d, &rr[i]))
            goto out;
    printf("%d jobs per round, %d rounds, medians; daemon: max_batch 64, CPU backend, "
           "embedded default model\n\n", jobs, rounds);
    printf("| path | submit us/job | client CPU us/job | front-end CPU us/job | jobs/s |\n");
    printf("|---|---|---|---|---|\n");
    for (int p = 0; p < 2; p++) {
        const struct round *r = p ? rr : sr;
        printf("| %s | %.2f | %.2f | %.1f | %.0f |\n", p ? "ring" : "socket",
               median(r, rounds, offsetof(struct round, submit)) * 1e6 / jobs,
               median(r, rounds, offsetof(struct round, client_cpu)) * 1e6 / jobs,
               median(r, rounds, offsetof(struct round, front_end)) * 1e6 / jobs,
               jobs / median(r, rounds, offsetof(struct round, wall)));
    }
    printf("\nratios socket/ring: submit %.1fx, client CPU %.1fx, front-end CPU %.1fx\n",
           median(sr, rounds, offsetof(struct round, submit)) /
               median(rr, rounds, offsetof(struct round, submit)),
           median(sr, rounds, offsetof(struct round, client_cpu)) /
               median(rr, rounds, offsetof(struct round, client_cpu)),
           median(sr, rounds, offsetof(struct round, front_end)) /
               (median(rr, rounds, offsetof(struct round, front_end)) + 1e-12));
    rc = 0;
out:
    dgemma_ring_detach(ring);
    dgemma_close(cr);
    dgemma_close(cs);
    kill(d, SIGTERM);
    waitpid(d, &st, 0);
    {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench-ring: could not remove %s\n", dir);
    }
    return rc;
}
