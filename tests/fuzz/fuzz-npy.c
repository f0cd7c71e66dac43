/*
 * Fuzz target: the .npy parser over arbitrary bytes.  Property: an
 * accepted file's data (shape product x 4 bytes) lies inside the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    const void *d;
    int ndim;
    int64_t shape[DG_NPY_MAX_DIMS];
    struct dg_error err;

    memcpy(copy, data, size);
    if (dg_npy_parse_f32(copy, size, "fuzz", &d, &ndim, shape, &err) == 0) {
        uint64_t n = 1;
        volatile float sum = 0;
        for (int i = 0; i < ndim; i++)
            n *= (uint64_t)shape[i];
        if ((const uint8_t *)d < copy || (const uint8_t *)d + 4 * n > copy + size)
            abort();
        for (uint64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, (const uint8_t *)d + 4 * i, 4); /* may be unaligned */
            sum += f;
        }
    }
    free(copy);
    return 0;
}
