/*
 * Description: the tokenizing thread (daemon/prep.c) without a daemon.
 * 200 generate requests with texts of random lengths (prompts and chats,
 * some too long for the context), parsed with every text left for
 * dproto_tokenize, go through the thread in bursts: each comes back once,
 * in the order submitted, with the ids (or the error code) that tokenizing
 * on this thread gives, and the eventfd has been written for it.  Then a
 * thread destroyed with jobs queued and a job in hand frees them all (the
 * sanitizer builds check for leaks; ThreadSanitizer runs it too).
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/prep.h"
#include "tests/harness.h"
#include "tests/unit/proto-ctx.h"

#define N_JOBS 200

static struct test_proto P;
static struct dproto_ctx ctx_defer;
static uint64_t rng = 0x2545f4914f6cdd1dull; /* (xorshift: the inputs' lengths and words) */

static uint64_t rnd(void)
{
    return test_xorshift(&rng);
}

static int setup(void)
{
    if (test_proto_setup(&P, 3000))
        return 1;
    ctx_defer = P.ctx;
    ctx_defer.defer_text_bytes = 1;
    return 0;
}

/* Request line k (malloc'd): a prompt or a chat of random words, 1 to
 * about 8,000 bytes (the longest past max_prompt_tokens). */
static char *line_of(int k)
{
    static const char *const words[] = {"cat ", "the ", "sat ", "on ", "a ", "mat ", "42 ",
                                        "hello ", "world ", "\\u00e9t\\u00e9 "};
    const size_t want = 1 + (size_t)(rnd() % 8000);
    char *text = malloc(want + 16), *line;
    size_t n = 0;
    if (!text)
        return NULL;
    while (n < want) {
        const char *w = words[rnd() % 10];
        memcpy(text + n, w, strlen(w));
        n += strlen(w);
    }
    text[n] = '\0';
    line = malloc(n + 200);
    if (line) {
        if (k % 3 == 0)
            sprintf(line, "{\"v\":1,\"op\":\"generate\",\"tag\":\"j%d\",\"messages\":[{\"role\":"
                          "\"user\",\"content\":\"%s\"}]}", k, text);
        else
            sprintf(line, "{\"v\":1,\"op\":\"generate\",\"tag\":\"j%d\",\"prompt\":\"%s\"}", k,
                    text);
    }
    free(text);
    return line;
}

/* Block until fd's counter is non-zero, then read it: 0, or -1 after 60 s. */
static int wait_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    uint64_t v;
    if (poll(&p, 1, 60000) != 1)
        return -1;
    return read(fd, &v, sizeof v) == (ssize_t)sizeof v && v > 0 ? 0 : -1;
}

static int jobs_round_trip(void)
{
    static struct dproto_request want[N_JOBS];
    static int want_rc[N_JOBS];
    static const char *want_code[N_JOBS];
    struct dg_error err = {0};
    struct dprep *p = NULL;
    const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int next = 0, back = 0, too_long = 0;

    CHECK(fd >= 0);
    CHECK_OK(dprep_create(&P.ctx, fd, &p, &err), &err);
    while (back < N_JOBS) {
        /* a burst of 1 to 20 */
        const int burst = 1 + (int)(rnd() % 20);
        for (int i = 0; i < burst && next < N_JOBS; i++, next++) {
            char *line = line_of(next);
            struct dprep_job *j = calloc(1, sizeof *j);
            struct dproto_error e;
            CHECK(line && j);
            /* what the parse itself gives, then the deferred parse */
            want_rc[next] = dproto_parse(line, strlen(line), &P.ctx, &want[next], &e);
            want_code[next] = want_rc[next] < 0 ? e.code : NULL;
            too_long += want_rc[next] < 0;
            CHECK(dproto_parse(line, strlen(line), &ctx_defer, &j->req, &e) == 0);
            free(line);
            CHECK(j->req.text && !j->req.ids);
            j->slot = (uint32_t)next;
            dprep_submit(p, j);
        }
        CHECK(wait_fd(fd) == 0);
        for (struct dprep_job *j; (j = dprep_take(p)) != NULL; free(j)) {
            const int k = (int)j->slot;
            CHECKF(k == back, "job %d came back as number %d", k, back);
            CHECK(j->rc == want_rc[k] && !j->req.text);
            if (j->rc < 0) {
                CHECK(!strcmp(j->perr.code, want_code[k]));
                CHECK(j->perr.has_tag && atoi(j->perr.tag + 1) == k);
            } else {
                CHECKF(j->req.n_ids == want[k].n_ids &&
                           !memcmp(j->req.ids, want[k].ids, want[k].n_ids * sizeof(int32_t)),
                       "job %d: other ids", k);
            }
            dproto_request_free(&j->req);
            dproto_request_free(&want[k]);
            back++;
        }
    }
    CHECK(too_long > 0 && too_long < N_JOBS); /* both ends were reached */
    dprep_destroy(p);
    close(fd);
    return 0;
}

static int destroy_with_jobs(void)
{
    struct dg_error err = {0};
    struct dprep *p = NULL;
    const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    CHECK(fd >= 0);
    CHECK_OK(dprep_create(&P.ctx, fd, &p, &err), &err);
    for (int k = 0; k < 30; k++) {
        char *line = line_of(k);
        struct dprep_job *j = calloc(1, sizeof *j);
        struct dproto_error e;
        CHECK(line && j);
        CHECK(dproto_parse(line, strlen(line), &ctx_defer, &j->req, &e) == 0);
        free(line);
        dprep_submit(p, j);
    }
    dprep_destroy(p); /* (some done, one perhaps in hand, the rest queued) */
    dprep_destroy(NULL);
    close(fd);
    return 0;
}

int main(void)
{
    TEST_CASE(setup);
    TEST_CASE(jobs_round_trip);
    TEST_CASE(destroy_with_jobs);
    dg_tokenizer_free(P.tok);
    return test_finish();
}
