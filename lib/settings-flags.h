/*
 * settings-flags.h - the generation settings as command-line flags, as
 * dgemma-client and dgemma-eval read them: --max-tokens N, --seed N,
 * --canvas-length N, --max-denoising-steps N, --entropy-bound X,
 * --confidence-threshold X, --stability-threshold N, --t-min X, --t-max X,
 * --top-k N, --top-p X (one value each) and --stop TEXT, --stop-id N
 * (repeatable: each adds to the list).  Each sets its key of a JSON
 * settings object (gen-settings.h), which the settings' own checks then
 * judge; here only the value's form is checked.
 */
#ifndef DG_SETTINGS_FLAGS_H
#define DG_SETTINGS_FLAGS_H

#include <jansson.h>

#include "lib/error.h"

/* The settings key flag sets ("top_p" for "--top-p"), or NULL where flag
 * is not a settings flag. */
const char *dg_settings_flag_key(const char *flag);

/* flag's value val into the JSON object settings: an integer (decimal,
 * within int64), a finite real, or a string (UTF-8); --stop and --stop-id
 * append to their list, a single value already there (from a settings
 * object) becoming its first entry.  Returns 0; -DG_E_INVAL where flag is
 * not a settings flag or val is not of its form ("--top-p: 'inf' is not
 * a finite number"); -DG_E_NOMEM.  settings is unchanged on an error. */
int dg_settings_flag_set(json_t *settings, const char *flag, const char *val,
                         struct dg_error *err);

#endif
