/*
 * Description: the generation settings' command-line flags
 * (lib/settings-flags.c), as dgemma-client and dgemma-eval read them:
 * every flag with a value of its form, applied by gen-settings.c (the
 * daemon's own reading of a settings object), lands in the setting the
 * flag names; the list flags append, a single value already there
 * becoming the list's first entry; each malformed value is refused with a
 * message naming the flag and the object is left as it was; and every
 * allocation that can fail, failing in turn, gives DG_E_NOMEM with the
 * object unchanged and nothing leaked (ASan's build checks the leaks).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/gen-settings.h"
#include "lib/model-config.h"
#include "lib/settings-flags.h"
#include "tests/harness.h"
#include "tests/json-alloc.h"

/* every flag, with a value the settings take */
static const char *const FLAG_VALUES[][2] = {
    {"--max-tokens", "9"},           {"--seed", "12345678901"},
    {"--canvas-length", "8"},        {"--max-denoising-steps", "5"},
    {"--entropy-bound", "0.25"},     {"--confidence-threshold", "0.125"},
    {"--stability-threshold", "3"},  {"--t-min", "0.25"},
    {"--t-max", "0.75"},             {"--top-k", "7"},
    {"--top-p", "0.5"},              {"--stop", "ab"},
    {"--stop", "c\xc3\xa9"},         {"--stop-id", "3"},
    {"--stop-id", "4"},
};

static int flags_reach_their_settings(void)
{
    struct dg_model_config cfg;
    struct dg_generation_config gen;
    struct dg_gen_limits lim;
    struct dg_gen_settings s;
    struct dg_error err = {0};
    json_t *o = json_object();
    int eos;

    CHECK(o);
    CHECK_OK(dg_model_config_preset("small", &cfg, &err), &err);
    dg_generation_config_defaults(&gen);
    dg_gen_limits_default(&lim);
    dg_gen_settings_defaults(&s, &cfg, &gen);
    eos = s.n_stop_ids;
    for (size_t k = 0; k < sizeof FLAG_VALUES / sizeof FLAG_VALUES[0]; k++) {
        CHECKF(dg_settings_flag_key(FLAG_VALUES[k][0]), "%s", FLAG_VALUES[k][0]);
        CHECK_OK(dg_settings_flag_set(o, FLAG_VALUES[k][0], FLAG_VALUES[k][1], &err), &err);
    }
    CHECK_OK(dg_gen_settings_apply_json(&s, o, &cfg, &lim, "flags: ", &err), &err);
    json_decref(o);
    CHECK(s.max_tokens == 9 && s.seed_set && s.seed == 12345678901ull);
    CHECK(s.canvas_length == 8 && s.max_denoising_steps == 5);
    CHECK(s.entropy_bound == 0.25 && s.confidence_threshold == 0.125 &&
          s.stability_threshold == 3);
    CHECK(s.t_min == 0.25 && s.t_max == 0.75 && s.top_k == 7 && s.top_p == 0.5);
    CHECK(s.n_stop_strings == 2 && !strcmp(s.stop_strings[0], "ab") &&
          !strcmp(s.stop_strings[1], "c\xc3\xa9"));
    CHECK(s.n_stop_ids == eos + 2 && s.stop_ids[eos] == 3 && s.stop_ids[eos + 1] == 4);
    /* not settings flags */
    CHECK(!dg_settings_flag_key("--temperature") && !dg_settings_flag_key("--top") &&
          !dg_settings_flag_key("top_p") && !dg_settings_flag_key("--settings") &&
          !dg_settings_flag_key(""));
    CHECK(!strcmp(dg_settings_flag_key("--stop-id"), "stop_token_ids"));
    return 0;
}

static int lists_take_a_single_value_first(void)
{
    struct dg_error err = {0};
    json_t *o = json_pack("{s:s, s:i}", "stop", "x", "stop_token_ids", 5);
    json_t *want = json_pack("{s:[s, s, s], s:[i, i]}", "stop", "x", "y", "z",
                             "stop_token_ids", 5, 6);
    CHECK(o && want);
    CHECK_OK(dg_settings_flag_set(o, "--stop", "y", &err), &err);
    CHECK_OK(dg_settings_flag_set(o, "--stop", "z", &err), &err);
    CHECK_OK(dg_settings_flag_set(o, "--stop-id", "6", &err), &err);
    CHECKF(json_equal(o, want), "%s", json_dumps(o, JSON_COMPACT));
    /* a one-value flag replaces */
    CHECK_OK(dg_settings_flag_set(o, "--top-k", "1", &err), &err);
    CHECK_OK(dg_settings_flag_set(o, "--top-k", "2", &err), &err);
    CHECK(json_integer_value(json_object_get(o, "top_k")) == 2);
    json_decref(o);
    json_decref(want);
    return 0;
}

static int malformed_values_are_refused(void)
{
    static const char *const cases[][3] = {
        {"--max-tokens", "", "--max-tokens: '' is not an integer"},
        {"--max-tokens", "12x", "--max-tokens: '12x' is not an integer"},
        {"--max-tokens", "1.5", "--max-tokens: '1.5' is not an integer"},
        {"--seed", "99999999999999999999", "--seed: '99999999999999999999' is out of range"},
        {"--stop-id", "-99999999999999999999",
         "--stop-id: '-99999999999999999999' is out of range"},
        {"--top-p", "half", "--top-p: 'half' is not a number"},
        {"--top-p", "0.5 ", "--top-p: '0.5 ' is not a number"},
        {"--top-p", "inf", "--top-p: 'inf' is not a finite number"},
        {"--t-min", "nan", "--t-min: 'nan' is not a finite number"},
        {"--entropy-bound", "1e999", "--entropy-bound: '1e999' is not a finite number"},
        {"--stop", "a\xff", "--stop: not valid UTF-8"},
        {"--stop", "\xc3", "--stop: not valid UTF-8"},
        {"--temperature", "1", "--temperature is not a settings flag"},
    };
    json_t *o = json_pack("{s:i, s:[s]}", "top_k", 3, "stop", "q"), *before = json_deep_copy(o);
    CHECK(o && before);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct dg_error err = {0};
        int rc = dg_settings_flag_set(o, cases[k][0], cases[k][1], &err);
        CHECKF(rc == -DG_E_INVAL && err.code == DG_E_INVAL && !strcmp(err.msg, cases[k][2]),
               "%s '%s': %d %s", cases[k][0], cases[k][1], rc, err.msg);
        CHECKF(json_equal(o, before), "%s changed the object", cases[k][0]);
    }
    json_decref(o);
    json_decref(before);
    return 0;
}


static int allocation_failures(void)
{
    /* (flag, value, the object before it): each path that allocates */
    static const char *const cases[][3] = {
        {"--top-p", "0.5", "{}"},
        {"--stop", "y", "{\"stop\": \"x\"}"},
        {"--stop", "y", "{}"},
        {"--stop-id", "7", "{\"stop_token_ids\": [1, 2]}"},
        {"--stop", "a long enough string to need its own allocation", "{\"stop\": []}"},
    };
    int bad = 0;

    tj_alloc_hold();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !bad; k++) {
        json_t *before = json_loads(cases[k][2], 0, NULL), *o;
        struct dg_error err = {0};
        long total;
        int rc;
        if (!before || !(o = json_deep_copy(before))) {
            json_decref(before);
            bad = test_fail(__FILE__, __LINE__, "case %zu: no object", k);
            break;
        }
        tj_alloc_arm(-1, 0);
        rc = dg_settings_flag_set(o, cases[k][0], cases[k][1], &err);
        total = tj_alloc_calls();
        json_decref(o);
        if (rc < 0 || total < 1) {
            bad = test_fail(__FILE__, __LINE__, "case %zu: %s, %ld allocations", k, err.msg,
                            total);
            json_decref(before);
            break;
        }
        for (long at = 0; at < total && !bad; at++) {
            tj_alloc_arm(-1, 0);
            o = json_deep_copy(before);
            if (!o) {
                bad = test_fail(__FILE__, __LINE__, "case %zu: no copy", k);
                break;
            }
            tj_alloc_arm(at, 0);
            dg_error_clear(&err);
            rc = dg_settings_flag_set(o, cases[k][0], cases[k][1], &err);
            tj_alloc_arm(-1, 0);
            if (rc != -DG_E_NOMEM || strcmp(err.msg, "out of memory") || !json_equal(o, before))
                bad = test_fail(__FILE__, __LINE__, "case %zu, allocation %ld failed: %d %s%s",
                                k, at, rc, err.msg,
                                json_equal(o, before) ? "" : " (the object changed)");
            json_decref(o);
        }
        json_decref(before);
    }
    tj_alloc_release();
    return bad;
}

int main(void)
{
    TEST_CASE(flags_reach_their_settings);
    TEST_CASE(lists_take_a_single_value_first);
    TEST_CASE(malformed_values_are_refused);
    TEST_CASE(allocation_failures);
    return test_finish();
}
