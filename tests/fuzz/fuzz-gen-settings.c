/*
 * Fuzz target: request settings from hostile JSON (the daemon's request
 * body).  Properties: settings that are accepted validate, serialise, and
 * read back to the same settings; settings that are rejected are left
 * exactly as they were.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/gen-settings.h"
#include "lib/json-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct dg_model_config cfg;
    static struct dg_generation_config gen;
    static struct dg_gen_limits lim;
    static int ready;
    struct dg_gen_settings s, before, back;
    struct dg_error err;
    json_t *o, *j;

    if (!ready) {
        dg_model_config_preset("small", &cfg, NULL);
        dg_generation_config_defaults(&gen);
        dg_gen_limits_default(&lim);
        ready = 1;
    }
    o = dg_json_parse((const char *)data, size, "fuzz", &err);
    if (!o)
        return 0;
    dg_gen_settings_defaults(&s, &cfg, &gen);
    before = s;
    if (dg_gen_settings_apply_json(&s, o, &cfg, &lim, "fuzz: ", &err) != 0) {
        if (memcmp(&s, &before, sizeof s) != 0 || err.code != DG_E_INVAL)
            abort();
        json_decref(o);
        return 0;
    }
    json_decref(o);
    if (dg_gen_settings_validate(&s, &cfg, &lim, &err) != 0)
        abort();
    if (!(j = dg_gen_settings_to_json(&s)))
        abort();
    dg_gen_settings_defaults(&back, &cfg, &gen);
    if (dg_gen_settings_apply_json(&back, j, &cfg, &lim, "", &err) != 0)
        abort();
    json_decref(j);
    if (memcmp(&s, &back, sizeof s) != 0)
        abort();
    return 0;
}
