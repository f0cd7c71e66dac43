/*
 * Description: dg_grow, the growing arrays' one allocator: the room it
 * makes (doubling from the first size, or from the room there was, until
 * the need fits; the same array where it already fits), the items kept
 * across each move (written before, read after, over many random needs),
 * and its refusals (a size in bytes past SIZE_MAX, room that would double
 * past it), which must leave the array and its room as they were; and
 * dg_ids_append and dg_buf_append, which grow with it.
 */
#include <stdint.h>
#include <stdlib.h>

#include "lib/grow.h"
#include "lib/tokenizer.h"
#include "tests/harness.h"

/* reference: the room dg_grow should give, by its contract */
static size_t room_for(size_t cap, size_t need, size_t first)
{
    size_t c = cap ? cap : (first ? first : 1);
    if (need <= cap)
        return cap;
    while (c < need)
        c *= 2;
    return c;
}

static int case_room(void)
{
    static const struct {
        size_t cap, need, first, want;
    } t[] = {
        {0, 1, 16, 16},   {0, 16, 16, 16}, {0, 17, 16, 32}, {0, 1000, 16, 1024},
        {16, 17, 256, 32}, {16, 16, 256, 16}, {0, 1, 0, 1},  {0, 5, 0, 8},
        {3, 4, 256, 6},   {3, 13, 256, 24},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t cap = 0;
        int32_t *v = NULL;
        if (t[i].cap) {
            v = dg_grow(NULL, &cap, t[i].cap, sizeof *v, t[i].cap);
            CHECKF(v && cap == t[i].cap, "row %zu: set-up room %zu", i, cap);
        }
        int32_t *before = v;
        int32_t *w = dg_grow(v, &cap, t[i].need, sizeof *w, t[i].first);
        CHECKF(w != NULL, "row %zu: refused", i);
        CHECKF(cap == t[i].want, "row %zu: room %zu, want %zu", i, cap, t[i].want);
        CHECKF(cap == room_for(t[i].cap, t[i].need, t[i].first), "row %zu: table and rule differ",
               i);
        if (t[i].need <= t[i].cap)
            CHECKF(w == before, "row %zu: moved though the need fitted", i);
        w[cap - 1] = 7; /* the whole room is writable (ASan would see it not) */
        free(w);
    }
    /* need 0 counts as 1, so NULL always means a refusal */
    size_t cap = 0;
    void *p = dg_grow(NULL, &cap, 0, 4, 16);
    CHECK(p != NULL && cap == 16);
    free(p);
    return 0;
}

static int case_items_kept(void)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 20; round++) {
        size_t cap = 0, n = 0, first = test_xorshift(&seed) % 9;
        uint64_t *v = NULL;
        for (int step = 0; step < 40; step++) {
            size_t need = n + 1 + test_xorshift(&seed) % 300, old = cap;
            uint64_t *w = dg_grow(v, &cap, need, sizeof *w, first);
            CHECKF(w != NULL, "round %d step %d: refused %zu", round, step, need);
            CHECKF(cap >= need && cap == room_for(old, need, first),
                   "round %d step %d: room %zu for need %zu from %zu", round, step, cap, need, old);
            for (size_t i = 0; i < n; i++)
                CHECKF(w[i] == i * 2654435761u + (size_t)round, "round %d: item %zu lost", round, i);
            v = w;
            for (; n < need; n++)
                v[n] = n * 2654435761u + (size_t)round;
        }
        free(v);
    }
    return 0;
}

static int case_refusals(void)
{
    size_t cap = 4;
    char *v = malloc(4), *w;
    CHECK(v != NULL);
    memcpy(v, "abcd", 4);
    /* the bytes would pass SIZE_MAX */
    w = dg_grow(v, &cap, 5, (SIZE_MAX >> 2) + 1, 1); /* 8 of them wrap to 0 */
    CHECK(w == NULL && cap == 4);
    /* the room would double past SIZE_MAX */
    w = dg_grow(v, &cap, SIZE_MAX / 2 + 2, 1, 1);
    CHECK(w == NULL && cap == 4);
    /* still the caller's, still whole */
    CHECK(memcmp(v, "abcd", 4) == 0);
    w = dg_grow(v, &cap, 5, 1, 1);
    CHECK(w != NULL && cap == 8 && memcmp(w, "abcd", 4) == 0);
    free(w);
    return 0;
}

/* chunks of random lengths (0 among them) appended, against a plain copy */
static int case_appends(void)
{
    enum { TOTAL = 20000 };
    static int32_t want[TOTAL];
    static char want_b[TOTAL];
    struct dg_ids a = {0};
    struct dg_buf b = {0};
    uint64_t seed = 0x2545f4914f6cdd1dull;
    size_t n = 0;

    for (size_t i = 0; i < TOTAL; i++) {
        want[i] = (int32_t)(test_xorshift(&seed) >> 33);
        want_b[i] = (char)(test_xorshift(&seed) >> 56); /* NULs among them */
    }
    while (n < TOTAL) {
        size_t k = test_xorshift(&seed) % 700;
        if (k > TOTAL - n)
            k = TOTAL - n;
        CHECK(dg_ids_append(&a, want + n, k) == 0);
        CHECK(dg_buf_append(&b, want_b + n, k) == 0);
        n += k;
        CHECKF(a.n == n && b.n == n && a.cap >= n && b.cap > n, "at %zu: %zu ids, %zu bytes", n,
               a.n, b.n);
        CHECKF(b.s[b.n] == '\0', "at %zu: the bytes are not NUL-terminated", n);
    }
    CHECK(memcmp(a.v, want, sizeof want) == 0);
    CHECK(memcmp(b.s, want_b, sizeof want_b) == 0);
    /* past SIZE_MAX: refused, nothing changed */
    CHECK(dg_ids_append(&a, want, SIZE_MAX) == -1 && a.n == TOTAL);
    CHECK(dg_buf_append(&b, want_b, SIZE_MAX - 1) == -1 && b.n == TOTAL);
    dg_ids_free(&a);
    dg_buf_free(&b);
    /* an empty one gets a NUL-terminated empty string */
    CHECK(dg_buf_append(&b, "", 0) == 0 && b.s && b.s[0] == '\0' && b.n == 0);
    dg_buf_free(&b);
    CHECK(dg_ids_append(&a, NULL, 0) == 0 && a.n == 0);
    return 0;
}

int main(void)
{
    TEST_CASE(case_room);
    TEST_CASE(case_items_kept);
    TEST_CASE(case_refusals);
    TEST_CASE(case_appends);
    return test_finish();
}
