/*
 * Description: what backend auto makes of the GPUs it finds, and how many
 * GPUs a dgemmad process needs (daemon/gpu-need.c), against the rules
 * dgemmad.yaml(5) and dgemmad(8) state: tp ranks in one process take a
 * GPU each, or one for all with one_gpu; a rank of a multi-process group
 * (--rank) is one rank on one GPU, whatever devices lists.  Cases: one
 * process at tp 1, 2 and 4, with and without one_gpu and a devices list;
 * multi-process ranks with one GPU visible (a group across hosts of one
 * GPU each), with a devices list of one entry, and with none visible.
 * The reason for the log names what fell short and fits a short buffer.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/gpu-need.h"
#include "tests/harness.h"

struct auto_case {
    const char *what;
    int visible, n_devices, tp, one_gpu, rank;
    int takes;        /* what the rules say */
    const char *why;  /* a part of the reason, where it does not take */
};

static int auto_cases(void)
{
    static const struct auto_case cases[] = {
        {"tp 1, one GPU", 1, 0, 1, 0, -1, 1, NULL},
        {"tp 2, one GPU", 1, 0, 2, 0, -1, 0, "tp 2 needs 2 GPU(s) but found 1"},
        {"tp 2, two GPUs", 2, 0, 2, 0, -1, 1, NULL},
        {"tp 2, four GPUs, devices lists one", 4, 1, 2, 0, -1, 0,
         "tp 2 needs 2 GPU(s) but devices lists 1"},
        {"tp 2, four GPUs, devices lists two", 4, 2, 2, 0, -1, 1, NULL},
        {"tp 4, one GPU, one_gpu", 1, 0, 4, 1, -1, 1, NULL},
        {"tp 4, one_gpu, devices lists one", 2, 1, 4, 1, -1, 1, NULL},
        {"tp 2, no GPU", 0, 0, 2, 0, -1, 0, "found 0"},
        /* a group across hosts of one GPU each: every rank takes its one */
        {"rank 1 of tp 2, one GPU", 1, 0, 2, 0, 1, 1, NULL},
        {"rank 0 of tp 4, one GPU", 1, 0, 4, 0, 0, 1, NULL},
        {"rank 3 of tp 4, one GPU, devices lists one", 1, 1, 4, 0, 3, 1, NULL},
        {"rank 1 of tp 2, no GPU", 0, 0, 2, 0, 1, 0, "rank 1 needs 1 GPU(s) but found 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct auto_case *c = &cases[i];
        char why[128];
        int got;
        memset(why, 0x7f, sizeof why);
        got = dgpu_auto_takes(c->visible, c->n_devices, c->tp, c->one_gpu, c->rank, why,
                              sizeof why);
        CHECKF(got == c->takes, "%s: auto takes the GPUs: %d, want %d", c->what, got, c->takes);
        if (!c->takes) {
            CHECKF(memchr(why, 0, sizeof why) != NULL, "%s: the reason is not terminated",
                   c->what);
            CHECKF(strstr(why, c->why) != NULL, "%s: reason '%s', want '%s' in it", c->what, why,
                   c->why);
        }
        /* (no room for a reason, or none asked: the same answer) */
        CHECKF(dgpu_auto_takes(c->visible, c->n_devices, c->tp, c->one_gpu, c->rank, NULL, 0) ==
                   c->takes,
               "%s: without a reason buffer", c->what);
    }
    return 0;
}

/* dgpu_needed and dgpu_devices_cover over tp 1..8, one_gpu or not, one
 * process or ranks 0..tp-1, devices lists of 0..8 entries, against the
 * rules restated here. */
static int rules(void)
{
    for (int tp = 1; tp <= 8; tp++)
        for (int one = 0; one <= 1; one++)
            for (int rank = -1; rank < tp; rank++) {
                const int need = rank >= 0 || one ? 1 : tp;
                CHECKF(dgpu_needed(tp, one, rank) == need, "tp %d one_gpu %d rank %d: %d", tp,
                       one, rank, dgpu_needed(tp, one, rank));
                for (int nd = 0; nd <= 8; nd++) {
                    const int cover = nd == 0 || rank >= 0 || nd >= need;
                    CHECKF(dgpu_devices_cover(nd, tp, one, rank) == cover,
                           "tp %d one_gpu %d rank %d devices %d: cover %d", tp, one, rank, nd,
                           dgpu_devices_cover(nd, tp, one, rank));
                    for (int vis = 0; vis <= 8; vis++)
                        CHECKF(dgpu_auto_takes(vis, nd, tp, one, rank, NULL, 0) ==
                                   (vis >= need && cover),
                               "tp %d one_gpu %d rank %d devices %d visible %d", tp, one, rank,
                               nd, vis);
                }
            }
    return 0;
}

/* A reason cut to a short buffer stays terminated; a buffer of one byte
 * gets the empty string. */
static int short_reason(void)
{
    char why[8], one[1] = {'x'};
    memset(why, 'x', sizeof why);
    CHECK(dgpu_auto_takes(1, 0, 4, 0, -1, why, sizeof why) == 0);
    CHECK(memchr(why, 0, sizeof why) == why + sizeof why - 1);
    CHECK(strncmp(why, "tp 4 ne", 7) == 0);
    CHECK(dgpu_auto_takes(0, 0, 2, 0, -1, one, sizeof one) == 0);
    CHECK(one[0] == 0);
    return 0;
}

int main(void)
{
    TEST_CASE(auto_cases);
    TEST_CASE(rules);
    TEST_CASE(short_reason);
    return test_finish();
}
