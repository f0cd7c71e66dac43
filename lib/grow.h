/*
 * grow.h - making room in a growing array (lib/, the daemon, the client
 * and the tools share it).
 *
 * An array here is a pointer from malloc or realloc (or NULL) beside the
 * number of items it has room for.  Its room doubles, from a first size,
 * when it is full: appending n items costs O(n) copies in all.
 */
#ifndef DG_GROW_H
#define DG_GROW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The array `items` (room for *cap items of `size` bytes each) moved to
 * room for at least `need` items (need 0 counts as 1): where *cap is 0,
 * the first of first, 2·first, 4·first, ... that holds them (first 0
 * counts as 1); else the first of 2·*cap, 4·*cap, ...  Returns the array,
 * its first *cap items kept, and sets *cap; `items` itself where *cap >=
 * need already.  Returns NULL only on failure, no memory or a size in
 * bytes past SIZE_MAX, and then leaves `items` and *cap as they were: the
 * caller still owns `items`. */
void *dg_grow(void *items, size_t *cap, size_t need, size_t size, size_t first);

#ifdef __cplusplus
}
#endif

#endif
