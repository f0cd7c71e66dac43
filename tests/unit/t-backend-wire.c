/*
 * Description: backend calls as bytes (lib/backend-wire.h), the messages
 * between the processes of a multi-process tensor-parallel group: every
 * kind through encode and decode gives back the same call (slots, ids,
 * canvases, denoise items' appended ids, settings, indexes); the message
 * cut at every length, a header's fields damaged one at a time, a length
 * that claims more than there is, counts past the limits (an append count
 * negative, huge or past the message included): each refused with
 * DG_E_FORMAT (or DG_E_INVAL when encoding), never read past (the suite
 * runs under ASan).
 */
#include <stdlib.h>
#include <string.h>

#include "lib/backend-wire.h"
#include "tests/harness.h"

static int32_t ids_a[5] = {1, 2, 3, 4, 5}, ids_b[1] = {262143};
static int32_t canvas_a[3] = {7, 8, 9}, canvas_b[4] = {0, 1, 2, 3};
static int32_t commit_a[5] = {11, 12, 13, 14, 262143};

static const struct dg_encode_item ENC[2] = {{3, ids_a, 5}, {0, ids_b, 1}};

static void den_items(struct dg_denoise_item *d)
{
    memset(d, 0, 2 * sizeof *d);
    d[0] = (struct dg_denoise_item){.slot = 1, .append = commit_a, .n_append = 5,
                                    .canvas = canvas_a, .cl = 3, .self_cond = 1,
                                    .temperature = 0.8f, .top_k = 20, .top_p = 0.9f,
                                    .seed = 0x0123456789abcdefull, .canvas_index = 4, .step = 7};
    d[1] = (struct dg_denoise_item){.slot = 2, .canvas = canvas_b, .cl = 4, .self_cond = 0,
                                    .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 9,
                                    .canvas_index = 0, .step = 0};
}

/* j: a DENOISE job of den's two items (den_items). */
static void den_job(struct dg_wire_job *j, struct dg_denoise_item *den)
{
    den_items(den);
    memset(j, 0, sizeof *j);
    j->kind = DG_WIRE_DENOISE;
    j->n = 2;
    j->den = den;
}

/* Encode j, decode it into *out; buf holds the bytes (free it). */
static int round_trip(const struct dg_wire_job *j, struct dg_wire_job *out, unsigned char **buf,
                      size_t *len)
{
    struct dg_error err = {0};
    size_t cap = 0, whole = 0;
    *buf = NULL;
    CHECK_OK(dg_wire_encode(j, buf, len, &cap, &err), &err);
    CHECK(*len >= DG_WIRE_HEADER_BYTES && *len % 8 == 0);
    CHECK_OK(dg_wire_length(*buf, 1 << 20, &whole, &err), &err);
    CHECK(whole == *len);
    CHECK_OK(dg_wire_decode(*buf, *len, out, &err), &err);
    CHECK(out->kind == j->kind && out->n == j->n);
    return 0;
}

static int case_round_trips(void)
{
    struct dg_wire_job j, d;
    struct dg_denoise_item den[2];
    const int which[3] = {2, 0, 1};
    unsigned char *buf;
    size_t len;

    memset(&j, 0, sizeof j);
    j.kind = DG_WIRE_OPEN;
    j.slot = 5;
    j.max_positions = 131072;
    j.max_cl = 256;
    CHECK(round_trip(&j, &d, &buf, &len) == 0);
    CHECK(d.slot == 5 && d.max_positions == 131072 && d.max_cl == 256 && len == 48);
    dg_wire_job_free(&d);
    free(buf);

    memset(&j, 0, sizeof j);
    j.kind = DG_WIRE_ENCODE;
    j.n = 2;
    j.enc = ENC;
    CHECK(round_trip(&j, &d, &buf, &len) == 0);
    for (int i = 0; i < 2; i++)
        CHECK(d.enc[i].slot == ENC[i].slot && d.enc[i].n == ENC[i].n &&
              !memcmp(d.enc[i].ids, ENC[i].ids, sizeof(int32_t) * (size_t)ENC[i].n));
    dg_wire_job_free(&d);
    free(buf);

    den_job(&j, den);
    CHECK(round_trip(&j, &d, &buf, &len) == 0);
    for (int i = 0; i < 2; i++) {
        const struct dg_denoise_item *a = &den[i], *b = &d.den[i];
        CHECK(a->slot == b->slot && a->cl == b->cl && a->self_cond == b->self_cond &&
              a->top_k == b->top_k && a->temperature == b->temperature && a->top_p == b->top_p &&
              a->seed == b->seed && a->canvas_index == b->canvas_index && a->step == b->step &&
              !memcmp(a->canvas, b->canvas, sizeof(int32_t) * (size_t)a->cl));
        CHECK(a->n_append == b->n_append && (a->n_append > 0 ? b->append != NULL : !b->append));
        CHECK(a->n_append == 0 ||
              !memcmp(a->append, b->append, sizeof(int32_t) * (size_t)a->n_append));
        CHECK(!b->sample && !b->argmax && !b->entropy);
    }
    dg_wire_job_free(&d);
    free(buf);

    memset(&j, 0, sizeof j);
    j.kind = DG_WIRE_CONDITION;
    j.n = 3;
    j.which = which;
    CHECK(round_trip(&j, &d, &buf, &len) == 0);
    CHECK(d.which[0] == 2 && d.which[1] == 0 && d.which[2] == 1);
    dg_wire_job_free(&d);
    free(buf);

    memset(&j, 0, sizeof j);
    j.kind = DG_WIRE_QUIT;
    j.slot = -1;
    CHECK(round_trip(&j, &d, &buf, &len) == 0);
    dg_wire_job_free(&d);
    free(buf);
    return 0;
}

/* Every prefix of a message, each in a buffer of its own size (so ASan
 * sees a read past it), refused. */
static int case_truncated(void)
{
    struct dg_wire_job j, d;
    struct dg_denoise_item den[2];
    struct dg_error err = {0};
    unsigned char *buf = NULL;
    size_t len, cap = 0;
    den_job(&j, den);
    CHECK_OK(dg_wire_encode(&j, &buf, &len, &cap, &err), &err);
    for (size_t n = 0; n < len; n++) {
        unsigned char *cut = malloc(n ? n : 1);
        CHECK(cut);
        memcpy(cut, buf, n);
        CHECKF(dg_wire_decode(cut, n, &d, &err) == -DG_E_FORMAT, "a prefix of %zu bytes", n);
        free(cut);
    }
    free(buf);
    return 0;
}

/* The header's fields damaged one at a time; lengths that lie. */
static int case_damaged(void)
{
    struct dg_wire_job j, d;
    struct dg_error err = {0};
    unsigned char *buf = NULL;
    size_t len, cap = 0, whole;
    memset(&j, 0, sizeof j);
    j.kind = DG_WIRE_ENCODE;
    j.n = 2;
    j.enc = ENC;
    CHECK_OK(dg_wire_encode(&j, &buf, &len, &cap, &err), &err);
    {
        static const struct {
            size_t at;
            uint32_t value;
            const char *want;
        } bad[] = {
            {0, 0x12345678u, "not a job"},      /* magic */
            {4, 1, "not a job"},                /* version (1: denoise items without appends) */
            {8, 0, "kind 0"},                   /* kind */
            {8, 99, "kind 99"},
            {12, 65537, "65537 items"},         /* too many items */
            {12, 3, "runs past"},               /* one item more than there is */
            {16, 8, "the header says"},         /* body shorter than the message */
            {16, 1u << 30, "a body of"},        /* body longer than allowed */
            {16, 13, "a body of"},              /* not a multiple of 8 */
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            unsigned char *b = malloc(len);
            uint32_t v = bad[k].value;
            CHECK(b);
            memcpy(b, buf, len);
            memcpy(b + bad[k].at, &v, sizeof v);
            CHECKF(dg_wire_decode(b, len, &d, &err) == -DG_E_FORMAT && strstr(err.msg, bad[k].want),
                   "damage %zu: %s", k, err.msg);
            free(b);
        }
    }
    /* item 0's id count made huge, then past the message */
    {
        unsigned char *b = malloc(len);
        int64_t n = (int64_t)DG_WIRE_MAX_IDS + 1;
        CHECK(b);
        memcpy(b, buf, len);
        memcpy(b + 56, &n, sizeof n);
        CHECKF(dg_wire_decode(b, len, &d, &err) == -DG_E_FORMAT && strstr(err.msg, "ids"), "%s",
               err.msg);
        n = 9; /* (6 would pad to the same 24 bytes as 5: a valid message) */
        memcpy(b + 56, &n, sizeof n);
        CHECKF(dg_wire_decode(b, len, &d, &err) == -DG_E_FORMAT, "%s", err.msg);
        n = -1;
        memcpy(b + 56, &n, sizeof n);
        CHECKF(dg_wire_decode(b, len, &d, &err) == -DG_E_FORMAT, "%s", err.msg);
        free(b);
    }
    CHECK(dg_wire_length(buf, 40, &whole, &err) == -DG_E_FORMAT);
    free(buf);
    return 0;
}

/* A denoise message's append section made hostile: the count negative,
 * past the limit, or past the message; each refused, naming it. */
static int case_damaged_append(void)
{
    static const struct {
        int64_t n;
        const char *want;
    } bad[] = {
        {-1, "item 0: -1 appended ids, outside"},
        {INT64_MIN, "item 0: -9223372036854775808 appended ids, outside"},
        {(int64_t)DG_WIRE_MAX_IDS + 1, "item 0: 16777217 appended ids, outside"},
        {1000, "item 0: 1000 appended ids run past"},
        /* (6 would pad to the same 24 bytes as 5: a valid message) 7 takes 8 bytes
         * more, so item 1 is read from the wrong place and refused */
        {7, "item 1"},
    };
    struct dg_wire_job j, d;
    struct dg_denoise_item den[2];
    struct dg_error err = {0};
    unsigned char *buf = NULL;
    size_t len, cap = 0;
    const size_t at = DG_WIRE_HEADER_BYTES + 40; /* item 0's n_append */
    int64_t n;

    den_job(&j, den);
    CHECK_OK(dg_wire_encode(&j, &buf, &len, &cap, &err), &err);
    memcpy(&n, buf + at, sizeof n);
    CHECK(n == 5);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        unsigned char *b = malloc(len);
        CHECK(b);
        memcpy(b, buf, len);
        memcpy(b + at, &bad[k].n, sizeof bad[k].n);
        CHECKF(dg_wire_decode(b, len, &d, &err) == -DG_E_FORMAT, "append count %lld decoded",
               (long long)bad[k].n);
        CHECKF(strstr(err.msg, bad[k].want), "append count %lld: %s", (long long)bad[k].n,
               err.msg);
        free(b);
    }
    free(buf);
    return 0;
}

static int case_encode_refusals(void)
{
    struct dg_wire_job j;
    struct dg_error err = {0};
    struct dg_encode_item big = {0, ids_a, (int64_t)DG_WIRE_MAX_IDS + 1};
    unsigned char *buf = NULL;
    size_t len, cap = 0;
    memset(&j, 0, sizeof j);
    j.kind = (enum dg_wire_kind)0;
    CHECK(dg_wire_encode(&j, &buf, &len, &cap, &err) == -DG_E_INVAL);
    j.kind = DG_WIRE_CONDITION;
    j.n = DG_WIRE_MAX_ITEMS + 1;
    CHECK(dg_wire_encode(&j, &buf, &len, &cap, &err) == -DG_E_INVAL);
    j.kind = DG_WIRE_ENCODE;
    j.n = 1;
    j.enc = &big;
    CHECK(dg_wire_encode(&j, &buf, &len, &cap, &err) == -DG_E_INVAL);
    {
        /* appends: a negative count, one past the limit, a count without ids */
        struct dg_denoise_item den[2];
        const int64_t counts[3] = {-1, (int64_t)DG_WIRE_MAX_IDS + 1, 2};
        den_job(&j, den);
        for (int k = 0; k < 3; k++) {
            den[1].n_append = counts[k];
            den[1].append = k == 2 ? NULL : commit_a;
            CHECK_FAILS(dg_wire_encode(&j, &buf, &len, &cap, &err), &err, DG_E_INVAL,
                        k == 2 ? "item 1: 2 appended ids without an array" : "appended ids, outside");
        }
    }
    free(buf);
    return 0;
}

int main(void)
{
    TEST_CASE(case_round_trips);
    TEST_CASE(case_truncated);
    TEST_CASE(case_damaged);
    TEST_CASE(case_damaged_append);
    TEST_CASE(case_encode_refusals);
    return test_finish();
}
