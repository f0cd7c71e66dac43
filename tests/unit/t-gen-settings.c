/*
 * Description: per-request generation settings: defaults from the
 * checkpoint's configs, every key applied from JSON, and each kind of bad
 * value rejected with a message naming the key while the settings stay as
 * they were; the JSON form read back gives the same settings.
 */
#include <string.h>

#include "lib/gen-settings.h"
#include "lib/json-util.h"
#include "tests/harness.h"

static struct dg_model_config cfg;
static struct dg_generation_config gen;
static struct dg_gen_limits lim;

static int apply(struct dg_gen_settings *s, const char *json, struct dg_error *err)
{
    json_t *o = dg_json_parse(json, strlen(json), "test", err);
    int rc;
    if (!o)
        return -DG_E_FORMAT;
    rc = dg_gen_settings_apply_json(s, o, &cfg, &lim, "request: ", err);
    json_decref(o);
    return rc;
}

static int defaults(void)
{
    struct dg_gen_settings s;
    dg_model_config_preset("small", &cfg, NULL);
    dg_generation_config_defaults(&gen);
    dg_gen_limits_default(&lim);
    dg_gen_settings_defaults(&s, &cfg, &gen);
    CHECK(s.canvas_length == cfg.canvas_length && s.max_denoising_steps == 48);
    CHECK(s.entropy_bound == 0.1 && s.confidence_threshold == 0.005 && s.stability_threshold == 1);
    CHECK(s.t_min == 0.4 && s.t_max == 0.8 && s.top_k == 0 && s.top_p == 1.0);
    CHECK(s.max_tokens == 256 && !s.seed_set && s.n_stop_strings == 0);
    /* no EOS in the generation config: the model config's */
    CHECK(s.n_stop_ids == cfg.n_eos && s.stop_ids[0] == cfg.eos_ids[0]);
    gen.eos_ids[0] = 7;
    gen.n_eos = 1;
    dg_gen_settings_defaults(&s, &cfg, &gen);
    CHECK(s.n_stop_ids == 1 && s.stop_ids[0] == 7);
    gen.n_eos = 0;
    CHECK(dg_gen_settings_validate(&s, &cfg, &lim, NULL) == 0);
    return 0;
}

static int every_key(void)
{
    struct dg_gen_settings s;
    struct dg_error err = {0};
    dg_gen_settings_defaults(&s, &cfg, &gen);
    CHECK_OK(apply(&s, "{\"canvas_length\": 16, \"max_denoising_steps\": 12, "
                       "\"entropy_bound\": 0.5, \"confidence_threshold\": 0.01, "
                       "\"stability_threshold\": 2, \"t_min\": 0.1, \"t_max\": 1.5, "
                       "\"top_k\": 40, \"top_p\": 0.9, \"seed\": 9007199254740993, "
                       "\"max_tokens\": 100, \"stop_token_ids\": [300, 1, 301], "
                       "\"stop\": [\"\\n\\n\", \"END\"]}", &err), &err);
    CHECK(s.canvas_length == 16 && s.max_denoising_steps == 12 && s.entropy_bound == 0.5);
    CHECK(s.confidence_threshold == 0.01 && s.stability_threshold == 2);
    CHECK(s.t_min == 0.1 && s.t_max == 1.5 && s.top_k == 40 && s.top_p == 0.9);
    CHECK(s.seed_set && s.seed == 9007199254740993ull && s.max_tokens == 100);
    /* stop ids add to the EOS ids, without duplicates */
    CHECK(s.n_stop_ids == cfg.n_eos + 2 && dg_gen_settings_is_stop_id(&s, 300) &&
          dg_gen_settings_is_stop_id(&s, 301) && dg_gen_settings_is_stop_id(&s, 1));
    CHECK(s.n_stop_strings == 2 && !strcmp(s.stop_strings[0], "\n\n") &&
          !strcmp(s.stop_strings[1], "END"));
    /* a single string and a single id are accepted too */
    CHECK_OK(apply(&s, "{\"stop\": \"###\", \"stop_token_ids\": 5}", &err), &err);
    CHECK(s.n_stop_strings == 1 && !strcmp(s.stop_strings[0], "###"));
    CHECK(dg_gen_settings_is_stop_id(&s, 5));
    /* null means "keep" */
    CHECK_OK(apply(&s, "{\"top_k\": null}", &err), &err);
    CHECK(s.top_k == 40);
    return 0;
}

static int bad_values(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"canvas_length\": 0}", "canvas_length"},
        {"{\"canvas_length\": 1025}", "canvas_length"},
        {"{\"canvas_length\": \"16\"}", "canvas_length"},
        {"{\"max_denoising_steps\": 0}", "max_denoising_steps"},
        {"{\"entropy_bound\": 0}", "entropy_bound"},
        {"{\"entropy_bound\": -1}", "entropy_bound"},
        {"{\"confidence_threshold\": 0}", "confidence_threshold"},
        {"{\"stability_threshold\": -1}", "stability_threshold"},
        {"{\"stability_threshold\": 1.5}", "stability_threshold"},
        {"{\"t_min\": 0.9}", "t_min"},
        {"{\"t_max\": 0.3}", "t_max"},
        {"{\"t_min\": -0.1}", "t_min"},
        {"{\"t_max\": 1000}", "t_max"},
        /* the last step's temperature below 1e-30: z / T would overflow */
        {"{\"t_min\": 0, \"t_max\": 1e-37}", "temperature of the last of"},
        {"{\"t_min\": 0, \"t_max\": 1e-29, \"max_denoising_steps\": 16}",
         "raise t_max or t_min"},
        {"{\"top_k\": -1}", "top_k"},
        {"{\"top_p\": 0}", "top_p"},
        {"{\"top_p\": 1.5}", "top_p"},
        /* values that float32, where the filter takes top_p, makes 0 or 1 */
        {"{\"top_p\": 1e-300}", "is 0 in float32"},
        {"{\"top_p\": 1e-46}", "is 0 in float32"},
        {"{\"top_p\": 0.99999999}", "rounds to 1 in float32"},
        /* and the canvas's confidence comparison makes 0 */
        {"{\"confidence_threshold\": 1e-300}", "confidence_threshold"},
        {"{\"seed\": -1}", "seed"},
        {"{\"max_tokens\": 0}", "max_tokens"},
        {"{\"max_tokens\": 2000000}", "max_tokens"},
        {"{\"stop_token_ids\": [512]}", "stop_token_ids"},
        {"{\"stop_token_ids\": [-1]}", "stop_token_ids"},
        {"{\"stop_token_ids\": \"1\"}", "stop_token_ids"},
        {"{\"stop\": \"\"}", "stop"},
        {"{\"stop\": [\"a\", 3]}", "stop[1]"},
        {"{\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", "at most 8"},
        {"{\"stop\": 7}", "stop"},
        {"{\"temperature\": 0.7}", "not a setting of diffusion sampling"},
        {"{\"top_kk\": 3}", "top_kk: unknown setting"},
        {"[1, 2]", "expected an object"},
    };
    struct dg_gen_settings s, before;
    struct dg_error err = {0};
    char long_stop[300];

    dg_gen_settings_defaults(&s, &cfg, &gen);
    before = s;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_error_clear(&err);
        CHECKF(apply(&s, bad[i].json, &err) == -DG_E_INVAL && err.code == DG_E_INVAL,
               "%s: accepted or wrong code (%s)", bad[i].json, err.msg);
        CHECKF(strstr(err.msg, bad[i].needle) && !strncmp(err.msg, "request: ", 9),
               "%s: message '%s' lacks '%s'", bad[i].json, err.msg, bad[i].needle);
        CHECKF(!memcmp(&s, &before, sizeof s), "%s: settings changed on error", bad[i].json);
    }
    memset(long_stop, 0, sizeof long_stop);
    memcpy(long_stop, "{\"stop\": \"", 10);
    memset(long_stop + 10, 'x', 129);
    memcpy(long_stop + 139, "\"}", 2);
    CHECK(apply(&s, long_stop, &err) == -DG_E_INVAL && strstr(err.msg, "stop"));
    /* too many stop ids overall */
    {
        char buf[512] = "{\"stop_token_ids\": [";
        for (int i = 0; i < 40; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%d", i ? "," : "", 100 + i);
        strcat(buf, "]}");
        CHECK(apply(&s, buf, &err) == -DG_E_INVAL && strstr(err.msg, "stop_token_ids"));
    }
    /* a tiny temperature whose last step stays at 1e-30 or above: kept
     * (0 .. 1e-9 over 48 steps: the last 2.1e-11) */
    CHECK(apply(&s, "{\"t_min\": 0, \"t_max\": 1e-9}", &err) == 0 && s.t_max == 1e-9 &&
          s.t_min == 0);
    /* the float32 extremes that keep their meaning: kept */
    CHECK(apply(&s, "{\"top_p\": 1e-44, \"confidence_threshold\": 1e-44}", &err) == 0 &&
          s.top_p == 1e-44 && s.confidence_threshold == 1e-44);
    CHECK(apply(&s, "{\"top_p\": 0.99999994}", &err) == 0 && s.top_p == 0.99999994);
    /* limits of the deployment */
    lim.max_canvas_length = 64;
    CHECK(apply(&s, "{\"canvas_length\": 65}", &err) == -DG_E_INVAL);
    CHECK(apply(&s, "{\"canvas_length\": 64}", &err) == 0 && s.canvas_length == 64);
    dg_gen_limits_default(&lim);
    return 0;
}

static int json_round_trip(void)
{
    struct dg_gen_settings s, t;
    struct dg_error err = {0};
    json_t *j;

    dg_gen_settings_defaults(&s, &cfg, &gen);
    CHECK_OK(apply(&s, "{\"top_k\": 7, \"seed\": 42, \"stop\": [\"ab\"], \"t_max\": 0.95, "
                       "\"stop_token_ids\": [33]}", &err), &err);
    j = dg_gen_settings_to_json(&s);
    CHECK(j);
    dg_gen_settings_defaults(&t, &cfg, &gen);
    CHECK_OK(dg_gen_settings_apply_json(&t, j, &cfg, &lim, "", &err), &err);
    json_decref(j);
    CHECK(!memcmp(&s, &t, sizeof s));
    return 0;
}

int main(void)
{
    TEST_CASE(defaults);
    TEST_CASE(every_key);
    TEST_CASE(bad_values);
    TEST_CASE(json_round_trip);
    return test_finish();
}
