/* json-alloc.c - jansson's allocator, counted and made to fail (json-alloc.h). */
#include "tests/json-alloc.h"

#include <jansson.h>
#include <stdlib.h>

static json_malloc_t saved_malloc;
static json_free_t saved_free;
static long calls, fail_at = -1;
static int fail_on;

static void *counting_malloc(size_t n)
{
    const long c = calls++;
    if (fail_at >= 0 && (c == fail_at || (fail_on && c > fail_at)))
        return NULL;
    return malloc(n);
}

void tj_alloc_hold(void)
{
    json_get_alloc_funcs(&saved_malloc, &saved_free);
    tj_alloc_arm(-1, 0);
    json_set_alloc_funcs(counting_malloc, free);
}

void tj_alloc_release(void)
{
    tj_alloc_arm(-1, 0);
    json_set_alloc_funcs(saved_malloc, saved_free);
}

void tj_alloc_arm(long at, int from_on)
{
    calls = 0;
    fail_at = at;
    fail_on = from_on;
}

long tj_alloc_calls(void)
{
    return calls;
}
