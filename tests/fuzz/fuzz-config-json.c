/*
 * Fuzz target: config.json and generation_config.json parsing over the same
 * bytes.  Property: a config that parses serialises (both forms) to JSON
 * that parses back, and its tensor catalogue can be listed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/model-config.h"
#include "lib/model-weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dg_model_config c, back;
    struct dg_generation_config g;
    struct dg_error err;

    (void)dg_generation_config_parse((const char *)data, size, "fuzz", &g, &err);
    if (dg_model_config_parse((const char *)data, size, "fuzz", &c, &err) != 0)
        return 0;
    for (int form = 0; form < 2; form++) {
        char *text = dg_model_config_to_json(&c, form);
        if (!text)
            abort();
        if (dg_model_config_parse(text, strlen(text), "round-trip", &back, &err) != 0)
            abort(); /* what we accept, we must be able to write back */
        if (back.num_layers != c.num_layers || back.global_head_dim != c.global_head_dim ||
            back.vocab_size != c.vocab_size)
            abort();
        free(text);
    }
    /* the catalogue of a small enough config */
    if ((long long)c.num_layers * c.num_experts <= 4096) {
        struct dg_catalog cat;
        if (dg_catalog_build(&c, NULL, NULL, &cat, &err) == 0)
            dg_catalog_free(&cat);
    }
    return 0;
}
