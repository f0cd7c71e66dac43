/*
 * Fuzz target: dg_st_parse over arbitrary bytes.  When a file is accepted,
 * every byte of every tensor is read (ASan traps any range outside the
 * input) and the ranges must tile the data section exactly.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_st_file f;
    struct dg_error err;
    /* an exact-size copy, so reading one byte past the input is caught */
    uint8_t *copy = malloc(size ? size : 1);
    volatile unsigned sum = 0;
    uint64_t covered = 0;

    memcpy(copy, data, size);
    if (dg_st_parse(copy, size, "fuzz", &f, &err) == 0) {
        for (size_t i = 0; i < f.n_tensors; i++) {
            const struct dg_st_tensor *t = &f.tensors[i];
            for (uint64_t b = 0; b < t->end - t->begin; b++)
                sum += t->data[b];
            covered += t->end - t->begin;
        }
        if (covered != f.data_size)
            abort();
        dg_st_file_free(&f);
    }
    free(copy);
    return 0;
}
