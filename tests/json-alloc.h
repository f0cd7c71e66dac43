/*
 * json-alloc.h - jansson's allocator swapped for the tests that make its
 * allocations fail (out-of-memory paths of the code that parses and
 * builds JSON): between tj_alloc_hold and tj_alloc_release, jansson's
 * allocations are counted from the last tj_alloc_arm, and the one that
 * arming names fails (NULL), or it and every one after.  Frees go to
 * free().  One holder at a time; not thread-safe (the tests that use it
 * call jansson from one thread while held).
 */
#ifndef DG_TESTS_JSON_ALLOC_H
#define DG_TESTS_JSON_ALLOC_H

/* Jansson's allocation functions saved and the counting one installed,
 * armed to fail nothing. */
void tj_alloc_hold(void);

/* The saved functions back in place. */
void tj_alloc_release(void);

/* Count from 0 again; allocation `at` (the at-th from now, 0 the next)
 * fails, or with from_on every allocation from it on; at < 0: none. */
void tj_alloc_arm(long at, int from_on);

/* Allocations asked for since the last tj_alloc_arm (failed ones too). */
long tj_alloc_calls(void);

#endif
