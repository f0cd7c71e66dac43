/* grow.c - making room in a growing array (grow.h). */
#include "lib/grow.h"

#include <stdint.h>
#include <stdlib.h>

void *dg_grow(void *items, size_t *cap, size_t need, size_t size, size_t first)
{
    size_t c = *cap ? *cap : (first ? first : 1);
    void *p;

    if (need == 0)
        need = 1;
    if (need <= *cap)
        return items;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return NULL;
        c *= 2;
    }
    if (size && c > SIZE_MAX / size)
        return NULL;
    if (!(p = realloc(items, c * (size ? size : 1))))
        return NULL;
    *cap = c;
    return p;
}
