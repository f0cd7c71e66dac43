/*
 * Fuzz target: model.safetensors.index.json parsing.  Property: every
 * accepted entry points at a listed shard whose name stays inside the
 * directory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/st-index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_index idx;
    struct dg_error err;

    if (dg_index_parse((const char *)data, size, "fuzz", &idx, &err) != 0)
        return 0;
    for (size_t i = 0; i < idx.n_entries; i++)
        if (idx.entries[i].shard < 0 || idx.entries[i].shard >= idx.n_shards)
            abort();
    for (int s = 0; s < idx.n_shards; s++)
        if (strchr(idx.shards[s], '/') || idx.shards[s][0] == '.' || !idx.shards[s][0])
            abort();
    dg_index_free(&idx);
    return 0;
}
