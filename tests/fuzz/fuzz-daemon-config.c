/*
 * Fuzz target: dgemmad.yaml from hostile bytes.  Properties: a file that
 * is accepted writes out as YAML that reads back to the identical struct;
 * a file that is rejected (with DG_E_CONFIG, or DG_E_NOMEM) leaves the
 * struct exactly as it was.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/daemon-config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_config c, before, back;
    struct dg_error err;
    char *y;

    dg_config_defaults(&c);
    before = c;
    if (dg_config_load_text(&c, (const char *)data, size, "fuzz", &err) != 0) {
        if (memcmp(&c, &before, sizeof c) != 0 ||
            (err.code != DG_E_CONFIG && err.code != DG_E_NOMEM))
            abort();
        return 0;
    }
    (void)dg_config_validate(&c, &err);
    if (!(y = dg_config_to_yaml(&c)))
        abort();
    dg_config_defaults(&back);
    if (dg_config_load_text(&back, y, strlen(y), "round trip", &err) != 0)
        abort();
    free(y);
    if (memcmp(&c, &back, sizeof c) != 0)
        abort();
    return 0;
}
