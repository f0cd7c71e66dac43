/*
 * Description: dgemmad's configuration: the table's defaults (documented
 * values, each re-parsing to itself), a file setting every key, the good
 * and bad forms of each value type with file:line:column messages,
 * unknown and repeated keys, wrong shapes, YAML syntax errors, aliases,
 * -o overrides, the struct left unchanged by every error, the YAML output
 * reading back identically, and the example file and man page naming
 * every key.  Runs from the repository root.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/daemon-config.h"
#include "lib/fileio.h"
#include "lib/log.h"
#include "tests/harness.h"

static int load(struct dg_config *c, const char *text, struct dg_error *err)
{
    return dg_config_load_text(c, text, strlen(text), "dgemmad.yaml", err);
}

static int defaults(void)
{
    struct dg_config c, d;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    CHECK(!strcmp(c.model, "") && c.backend == DG_BACKEND_AUTO && c.n_devices == 0);
    CHECK(c.tp == 1 && c.experts_width == 0 && c.pin_workers == 1 && c.gpu_timeout == 120 &&
          c.group_timeout == 300 && c.cuda_graphs == 1 && c.one_gpu == 0);
    CHECK(c.max_batch == 8 && c.max_canvas_length == 0 && c.max_denoising_steps == 256);
    CHECK(c.max_tokens == 8192 && c.max_context == 0 && c.default_max_tokens == 0 &&
          c.parse_special == 1);
    CHECK(c.prefill_chunk == 512 && c.queue_max == 64 && c.max_connections == 256);
    CHECK(c.max_line_bytes == 1048576 && c.max_output_bytes == 67108864 &&
          c.send_buffer_bytes == 0);
    CHECK(!strcmp(c.socket, "/run/dgemma/dgemmad.sock") && c.socket_mode == 0660);
    CHECK(!strcmp(c.socket_group, "") && !strcmp(c.metrics, "") && !strcmp(c.log_file, ""));
    CHECK(c.log_level == DG_LOG_INFO && c.shutdown_grace == 30 && c.tick == 1);
    CHECK_OK(dg_config_validate(&c, &err), &err);
    /* every default, given back through -o, parses and changes nothing */
    CHECK(c.metrics_queue == 4096 && c.metrics_flush == 1 && c.metrics_retention_days == 90);
    CHECK(c.metrics_max_mb == 1024);
    CHECK(c.shm_user_max_mb == 256);
    CHECK(dg_config_n_options() == 44);
    for (int i = 0; i < dg_config_n_options(); i++) {
        const char *name, *type, *def, *help;
        char assign[256];
        dg_config_option_doc(i, &name, &type, &def, &help);
        CHECK(name && type && def && help && strlen(help) > 10);
        snprintf(assign, sizeof assign, "%s=%s", name, def);
        d = c;
        CHECK_OK(dg_config_set(&d, assign, assign, &err), &err);
        CHECKF(!memcmp(&c, &d, sizeof c), "default of %s is not its own value", name);
    }
    {
        const char *name = "x";
        dg_config_option_doc(-1, &name, NULL, NULL, NULL);
        CHECK(name == NULL);
        dg_config_option_doc(dg_config_n_options(), &name, NULL, NULL, NULL);
        CHECK(name == NULL);
    }
    return 0;
}

static int every_key(void)
{
    struct dg_config c;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    CHECK_OK(load(&c,
                  "# a full file\n"
                  "model: /srv/models/dg\n"
                  "backend: cuda\n"
                  "devices: [3, 1, 2]\n"
                  "tp: 2\n"
                  "experts: width\n"
                  "pin_workers: no\n"
                  "max_batch: 32\n"
                  "max_canvas_length: 64\n"
                  "max_denoising_steps: 100\n"
                  "max_tokens: 16777216\n"
                  "max_context: 2\n"
                  "default_max_tokens: 77\n"
                  "parse_special: false\n"
                  "prefill_chunk: 1024\n"
                  "queue_max: 0\n"
                  "max_connections: 65536\n"
                  "max_line_bytes: 1024\n"
                  "max_output_bytes: 4294967296\n"
                  "send_buffer_bytes: 67108864\n"
                  "socket: '/tmp/d g.sock'\n"
                  "socket_mode: 0o600\n"
                  "socket_group: dgemma\n"
                  "socket_owner: '1001'\n"
                  "allow_uids: [1000, 0]\n"
                  "allow_gids: [2147483647]\n"
                  "client_max_requests: 100000\n"
                  "user: dgemma\n"
                  "allow_root: yes\n"
                  "metrics: /var/lib/dgemma/m.sqlite\n"
                  "metrics_queue: 1\n"
                  "metrics_flush: 0.25\n"
                  "metrics_retention_days: 0\n"
                  "metrics_max_mb: 1048576\n"
                  "log_level: debug\n"
                  "log_file: \"/var/log/dgemma\\u00e9.log\"\n"
                  "shutdown_grace: 2.5\n"
                  "tick: 0.01\n",
                  &err),
             &err);
    CHECK(!strcmp(c.model, "/srv/models/dg") && c.backend == DG_BACKEND_CUDA);
    CHECK(c.n_devices == 3 && c.devices[0] == 3 && c.devices[1] == 1 && c.devices[2] == 2);
    CHECK(c.tp == 2 && c.experts_width == 1 && c.pin_workers == 0 && c.max_batch == 32);
    CHECK(c.max_canvas_length == 64 && c.max_denoising_steps == 100);
    CHECK(c.max_tokens == 16777216 && c.max_context == 2 && c.default_max_tokens == 77);
    CHECK(c.parse_special == 0);
    CHECK(c.prefill_chunk == 1024 && c.queue_max == 0 && c.max_connections == 65536);
    CHECK(c.max_line_bytes == 1024 && c.max_output_bytes == 4294967296LL &&
          c.send_buffer_bytes == 67108864);
    CHECK(!strcmp(c.socket, "/tmp/d g.sock") && c.socket_mode == 0600);
    CHECK(!strcmp(c.socket_group, "dgemma") && !strcmp(c.metrics, "/var/lib/dgemma/m.sqlite"));
    CHECK(c.log_level == DG_LOG_DEBUG && !strcmp(c.log_file, "/var/log/dgemma\xc3\xa9.log"));
    CHECK(c.shutdown_grace == 2.5 && c.tick == 0.01);
    CHECK(c.metrics_queue == 1 && c.metrics_flush == 0.25 && c.metrics_retention_days == 0);
    CHECK(c.metrics_max_mb == 1048576);
    CHECK(!strcmp(c.socket_owner, "1001") && !strcmp(c.user, "dgemma") && c.allow_root == 1);
    CHECK(c.n_allow_uids == 2 && c.allow_uids[0] == 1000 && c.allow_uids[1] == 0);
    CHECK(c.n_allow_gids == 1 && c.allow_gids[0] == 2147483647);
    CHECK(c.client_max_requests == 100000);
    CHECK_OK(dg_config_validate(&c, &err), &err);
    return 0;
}

static int good_forms(void)
{
    static const struct {
        const char *text;
        int want;
    } bools[] = {{"true", 1}, {"True", 1}, {"YES", 1}, {"on", 1}, {"On", 1},
                 {"false", 0}, {"FALSE", 0}, {"no", 0}, {"off", 0}, {"OFF", 0}},
      modes[] = {{"0660", 0660}, {"0o640", 0640}, {"0O600", 0600}, {"755", 0755}, {"0", 0},
                 {"0777", 0777}, {"00", 0}};
    struct dg_config c;
    struct dg_error err = {0};
    char text[128];

    dg_config_defaults(&c);
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        snprintf(text, sizeof text, "pin_workers: %s\n", bools[i].text);
        c.pin_workers = !bools[i].want;
        CHECK_OK(load(&c, text, &err), &err);
        CHECKF(c.pin_workers == bools[i].want, "%s", text);
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        snprintf(text, sizeof text, "socket_mode: %s\n", modes[i].text);
        CHECK_OK(load(&c, text, &err), &err);
        CHECKF(c.socket_mode == modes[i].want, "%s", text);
    }
    /* lists: flow, block, empty, one line */
    CHECK_OK(load(&c, "devices:\n  - 4\n  - 0\n", &err), &err);
    CHECK(c.n_devices == 2 && c.devices[0] == 4 && c.devices[1] == 0);
    CHECK_OK(load(&c, "devices:\n- 7\n", &err), &err);
    CHECK(c.n_devices == 1 && c.devices[0] == 7 && c.devices[1] == 0);
    CHECK_OK(load(&c, "devices: []", &err), &err);
    CHECK(c.n_devices == 0 && c.devices[0] == 0);
    CHECK_OK(load(&c, "devices: [0,1,1023]", &err), &err);
    CHECK(c.n_devices == 3 && c.devices[2] == 1023);
    /* strings: quoting and escapes; a number or a boolean taken as written */
    CHECK_OK(load(&c, "socket: \"/tmp/a\\\"b\\\\c\\td\\x41\"", &err), &err);
    CHECK(!strcmp(c.socket, "/tmp/a\"b\\c\tdA"));
    CHECK_OK(load(&c, "socket: 'it''s'", &err), &err);
    CHECK(!strcmp(c.socket, "it's"));
    CHECK_OK(load(&c, "socket_group: 1000\nmetrics: yes\n", &err), &err);
    CHECK(!strcmp(c.socket_group, "1000") && !strcmp(c.metrics, "yes"));
    CHECK_OK(load(&c, "metrics: \"null\"\nlog_file: 0660\n", &err), &err);
    CHECK(!strcmp(c.metrics, "null") && !strcmp(c.log_file, "0660"));
    CHECK_OK(load(&c, "metrics:\nlog_file: ~\n", &err), &err);
    CHECK(!strcmp(c.metrics, "") && !strcmp(c.log_file, ""));
    CHECK_OK(load(&c, "model: |\n  two\n  lines\n", &err), &err);
    CHECK(!strcmp(c.model, "two\nlines\n"));
    /* enums, quoted or not; numbers */
    CHECK_OK(load(&c, "backend: \"cpu\"\nlog_level: 'warn'\nexperts: across\n", &err), &err);
    CHECK(c.backend == DG_BACKEND_CPU && c.log_level == DG_LOG_WARN && c.experts_width == 0);
    CHECK_OK(load(&c, "shutdown_grace: 0\ntick: 6e1\nmax_context: 0\nqueue_max: +5\n", &err),
             &err);
    CHECK(c.shutdown_grace == 0 && c.tick == 60 && c.max_context == 0 && c.queue_max == 5);
    CHECK_OK(load(&c, "tick: .5\nshutdown_grace: -0.0\n", &err), &err);
    CHECK(c.tick == 0.5 && c.shutdown_grace == 0 && !signbit(c.shutdown_grace));
    /* flow-style mapping at the top; explicit document markers; BOM */
    CHECK_OK(load(&c, "{max_batch: 3, tp: 4}", &err), &err);
    CHECK(c.max_batch == 3 && c.tp == 4);
    CHECK_OK(load(&c, "%YAML 1.1\n---\nmax_batch: 5\n...\n", &err), &err);
    CHECK(c.max_batch == 5);
    CHECK_OK(load(&c, "\xef\xbb\xbfmax_batch: 6\n", &err), &err);
    CHECK(c.max_batch == 6);
    return 0;
}

static int empty_documents(void)
{
    static const char *const empty[] = {"", "\n", "# only a comment\n", "---\n", "--- ~\n",
                                        "null", "---\n...\n"};
    struct dg_config c, d;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    c.max_batch = 99;
    d = c;
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        CHECK_OK(load(&c, empty[i], &err), &err);
        CHECKF(!memcmp(&c, &d, sizeof c), "'%s' changed the config", empty[i]);
    }
    CHECK_OK(dg_config_load_text(&c, NULL, 0, "nothing", &err), &err);
    return 0;
}

static int bad_values(void)
{
    static const struct {
        const char *text, *needle;
    } bad[] = {
        /* integers */
        {"max_batch: 0", "dgemmad.yaml:1:12: max_batch: expected an integer in [1, 1024], got '0'"},
        {"max_batch: 1025", "got '1025'"},
        {"max_batch: 8.0", "max_batch: expected an integer"},
        {"max_batch: 0x10", "got '0x10'"},
        {"max_batch: '8'", "got the quoted string '8'"},
        {"max_batch: 99999999999999999999999", "max_batch: expected an integer"},
        {"max_batch: -1", "got '-1'"},
        {"max_batch:", "got ''"},
        {"tp: 65", "tp: expected an integer in [1, 64]"},
        {"max_context: 1", "max_context: expected 0 or an integer in [2, 16777216], got '1'"},
        {"max_tokens: 16777217", "max_tokens"},
        {"max_output_bytes: 4294967297", "max_output_bytes"},
        {"max_line_bytes: 1023", "max_line_bytes"},
        {"send_buffer_bytes: 4095",
         "send_buffer_bytes: expected 0 or an integer in [4096, 67108864], got '4095'"},
        {"send_buffer_bytes: 67108865", "send_buffer_bytes"},
        {"send_buffer_bytes: -1", "send_buffer_bytes"},
        {"queue_max: 100001", "queue_max"},
        /* numbers */
        {"tick: 0", "tick: expected a number in [0.01, 60], got '0'"},
        {"tick: 61", "tick: expected a number"},
        {"tick: .nan", "got '.nan'"},
        {"tick: inf", "got 'inf'"},
        {"tick: 0x1p-3", "got '0x1p-3'"},
        {"tick: 1..2", "got '1..2'"},
        {"shutdown_grace: -1", "shutdown_grace: expected a number in [0, 3600]"},
        {"shutdown_grace: \"3\"", "got the quoted string '3'"},
        /* booleans */
        {"pin_workers: 1", "pin_workers: expected a boolean (true/false, yes/no, on/off), got '1'"},
        {"pin_workers: y", "got 'y'"},
        {"pin_workers: \"true\"", "got the quoted string 'true'"},
        /* names */
        {"backend: gpu", "backend: expected one of auto, cpu, cuda, got 'gpu'"},
        {"backend: CUDA", "got 'CUDA'"},
        {"log_level: warning", "log_level: expected one of error, warn, info, debug"},
        {"experts: [width]", "experts: expected one of across, width, got a list"},
        /* octal */
        {"socket_mode: 0668", "socket_mode: expected an octal mode in [0, 0777], got '0668'"},
        {"socket_mode: 0o9", "got '0o9'"},
        {"socket_mode: 1000", "got '1000'"},
        {"socket_mode: 0o", "got '0o'"},
        {"socket_mode: -1", "got '-1'"},
        {"socket_mode: rw", "got 'rw'"},
        /* lists */
        {"devices: 0", "devices: expected a list of at most 64 integers in [0, 1023], got the scalar '0'"},
        {"devices: [0, 1024]", "dgemmad.yaml:1:14: devices[1]: expected an integer in [0, 1023], got '1024'"},
        {"devices: [a]", "devices[0]: expected an integer in [0, 1023], got 'a'"},
        {"devices: ['1']", "devices[0]: expected an integer in [0, 1023], got the quoted string '1'"},
        {"devices: [[1]]", "devices[0]: expected an integer in [0, 1023], got a list"},
        {"devices:\n  - {a: 1}\n", "dgemmad.yaml:2:5: devices[0]: expected an integer in [0, 1023], got a mapping"},
        {"devices: {0: 1}", "devices: expected a list of at most 64 integers in [0, 1023], got a mapping"},
        {"devices: [2, 0, 2]", "dgemmad.yaml:1:17: devices[2]: 2 is listed twice (first as devices[0])"},
        {"tp: 2\ndevices:\n  - 1\n  - 1\n", "dgemmad.yaml:4:5: devices[1]: 1 is listed twice (first as devices[0])"},
        /* strings */
        {"socket: [a]", "socket: expected a string of at most 4095 bytes, got a list"},
        {"socket: {a: b}", "socket: expected a string of at most 4095 bytes, got a mapping"},
        {"socket: \"a\\0b\"", "socket: the string contains a NUL byte"},
        {"socket_group: \"\\x00\"", "socket_group: the string contains a NUL byte"},
        /* keys */
        {"\n\nmax_bach: 8", "dgemmad.yaml:3:1: unknown key 'max_bach' (did you mean 'max_batch'?)"},
        {"Max_Batch: 8", "unknown key 'Max_Batch' (did you mean 'max_batch'?)"},
        {"tpp: 2", "unknown key 'tpp' (did you mean 'tp'?)"},
        {"temperature: 0.7", "dgemmad.yaml:1:1: unknown key 'temperature'"},
        {"max_batch: 8\ntp: 2\nmax_batch: 9", "dgemmad.yaml:3:1: max_batch: given twice (first at line 1)"},
        {"[a]: 1", "dgemmad.yaml:1:1: expected a key, got a list"},
        {"? {a: 1}\n: 2\n", "expected a key, got a mapping"},
        /* shapes and syntax */
        {"- max_batch: 8", "dgemmad.yaml:1:1: expected a mapping of key: value at the top level, got a list"},
        {"max_batch", "expected a mapping of key: value at the top level, got a scalar"},
        {"'null'", "expected a mapping"},
        {"max_batch: 8\n---\ntp: 2\n", "dgemmad.yaml:2:1: a second document (only one is read)"},
        {"tp: 2\nmax_batch: 8: 9\n", "dgemmad.yaml:2:13: YAML syntax error: mapping values are not allowed in this context"},
        {"devices: [1, 2", "YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence at line 1)"},
        {"socket: \"abc", "YAML syntax error: found unexpected end of stream"},
        {"tp: \t2\n\tmax_batch: 3", "YAML syntax error"},
        {"max_batch: 8\xff\n", "dgemmad.yaml: byte 12: YAML: invalid leading UTF-8 octet"},
        {"max_batch: 8\x01\n", "control characters are not allowed"},
        /* anchors, aliases, tags */
        {"max_batch: &a 8\nqueue_max: *a\n", "dgemmad.yaml:1:12: anchors (&a) are not accepted"},
        {"max_batch: *a\n", "dgemmad.yaml:1:12: aliases (*a) are not accepted"},
        {"devices: [1, *x]\n", "dgemmad.yaml:1:14: aliases (*x) are not accepted"},
        {"devices: &l [1]\n", "anchors (&l) are not accepted"},
        {"max_batch: !!int 8", "dgemmad.yaml:1:12: tags (!!int) are not accepted"},
        {"!foo {tp: 1}", "tags (!foo) are not accepted"},
    };
    struct dg_config c, before;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    c.max_batch = 17;
    strcpy(c.model, "/m");
    before = c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_FAILS(load(&c, bad[i].text, &err), &err, DG_E_CONFIG, bad[i].needle);
        CHECKF(!memcmp(&c, &before, sizeof c), "%s: config changed on error", bad[i].text);
    }
    /* the error comes after good keys: nothing of the file is applied */
    CHECK_FAILS(load(&c, "tp: 4\nmodel: /x\ndevices: [1]\nmax_batch: 0\n", &err), &err,
                DG_E_CONFIG, "dgemmad.yaml:4:12: max_batch");
    CHECK(!memcmp(&c, &before, sizeof c));
    return 0;
}

static int limits(void)
{
    struct dg_config c, before;
    struct dg_error err = {0};
    char *text = malloc(8192);
    size_t n;
    int rc;

    CHECK(text);
    dg_config_defaults(&c);
    before = c;
    /* 64 devices fit, 65 do not */
    n = (size_t)sprintf(text, "devices: [");
    for (int i = 0; i < 64; i++)
        n += (size_t)sprintf(text + n, "%s%d", i ? ", " : "", i);
    strcpy(text + n, "]");
    rc = load(&c, text, &err);
    if (rc == 0 && (c.n_devices != 64 || c.devices[63] != 63))
        rc = -1;
    strcpy(text + n, ", 64]");
    if (rc == 0 && (load(&c, text, &err) != -DG_E_CONFIG ||
                    !strstr(err.msg, "devices: more than 64 entries")))
        rc = -2;
    /* strings: size - 1 bytes fit */
    c = before;
    memset(text, 0, 8192);
    memcpy(text, "socket_group: ", 14);
    memset(text + 14, 'g', 255);
    if (rc == 0 && load(&c, text, &err) != 0)
        rc = -3;
    if (rc == 0 && strlen(c.socket_group) != 255)
        rc = -4;
    text[14 + 255] = 'g';
    if (rc == 0 && (load(&c, text, &err) != -DG_E_CONFIG ||
                    !strstr(err.msg, "socket_group: expected a string of at most 255 bytes, "
                                     "got 256 bytes")))
        rc = -5;
    free(text);
    CHECKF(rc == 0, "step %d: %s", -rc, err.msg);
    return 0;
}

/* Hostile shapes end in an error, not a crash or deep recursion. */
static int hostile(void)
{
    size_t n = 200000;
    char *text = malloc(n + 16);
    struct dg_config c;
    struct dg_error err = {0};

    CHECK(text);
    dg_config_defaults(&c);
    memset(text, '[', n);
    text[n] = '\0';
    if (load(&c, text, &err) != -DG_E_CONFIG) {
        free(text);
        CHECK(!"deep flow nesting accepted");
    }
    memcpy(text, "devices: ", 9);
    if (dg_config_load_text(&c, text, n, "x", &err) != -DG_E_CONFIG ||
        !strstr(err.msg, "devices[0]: expected an integer")) {
        free(text);
        CHECK(!"deep nesting in a list accepted");
    }
    for (size_t i = 0; i < n; i++)
        text[i] = (char)(i * 131 + 7);
    if (dg_config_load_text(&c, text, n, "x", &err) != -DG_E_CONFIG) {
        free(text);
        CHECK(!"binary garbage accepted");
    }
    /* a huge scalar given to a string key */
    memcpy(text, "model: ", 7);
    memset(text + 7, 'm', n - 7);
    if (dg_config_load_text(&c, text, n, "x", &err) != -DG_E_CONFIG ||
        !strstr(err.msg, "model: expected a string of at most 4095 bytes")) {
        free(text);
        CHECK(!"huge scalar accepted");
    }
    free(text);
    return 0;
}

static int overrides(void)
{
    struct dg_config c, before;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    CHECK_OK(dg_config_set(&c, "max_batch=16", "-o max_batch=16", &err), &err);
    CHECK(c.max_batch == 16);
    CHECK_OK(dg_config_set(&c, "devices=[0,1]", "-o", &err), &err);
    CHECK(c.n_devices == 2 && c.devices[0] == 0 && c.devices[1] == 1);
    CHECK_OK(dg_config_set(&c, "devices=[]", "-o", &err), &err);
    CHECK(c.n_devices == 0 && c.devices[1] == 0);
    CHECK_FAILS(dg_config_set(&c, "devices=[3,3]", "-o devices=[3,3]", &err), &err, DG_E_CONFIG,
                "-o devices=[3,3]: devices[1]: 3 is listed twice (first as devices[0])");
    CHECK(c.n_devices == 0);
    /* a uid given twice means what it says once: not an error */
    CHECK_OK(dg_config_set(&c, "allow_uids=[5,5]", "-o", &err), &err);
    CHECK(c.n_allow_uids == 2);
    CHECK_OK(dg_config_set(&c, "socket=/tmp/x y.sock", "-o", &err), &err);
    CHECK(!strcmp(c.socket, "/tmp/x y.sock"));
    CHECK_OK(dg_config_set(&c, "socket=\"a=b\"", "-o", &err), &err);
    CHECK(!strcmp(c.socket, "a=b"));
    CHECK_OK(dg_config_set(&c, "model=", "-o", &err), &err);
    CHECK(!strcmp(c.model, ""));
    CHECK_OK(dg_config_set(&c, "socket_mode=0o600", "-o", &err), &err);
    CHECK(c.socket_mode == 0600);
    CHECK_OK(dg_config_set(&c, "pin_workers=off", NULL, &err), &err);
    CHECK(c.pin_workers == 0);
    CHECK_OK(dg_config_set(&c, "log_level=debug", NULL, &err), &err);
    CHECK(c.log_level == DG_LOG_DEBUG);

    before = c;
    CHECK_FAILS(dg_config_set(&c, "max_batch=0", "-o max_batch=0", &err), &err, DG_E_CONFIG,
                "-o max_batch=0: max_batch: expected an integer in [1, 1024], got '0'");
    CHECK_FAILS(dg_config_set(&c, "max_bach=1", "-o max_bach=1", &err), &err, DG_E_CONFIG,
                "-o max_bach=1: unknown key 'max_bach' (did you mean 'max_batch'?)");
    CHECK_FAILS(dg_config_set(&c, "max_batch", "-o max_batch", &err), &err, DG_E_CONFIG,
                "-o max_batch: expected key=value");
    CHECK_FAILS(dg_config_set(&c, "devices=[0,x]", "-o", &err), &err, DG_E_CONFIG,
                "-o: devices[1]: expected an integer in [0, 1023], got 'x'");
    CHECK_FAILS(dg_config_set(&c, "devices=1", "-o", &err), &err, DG_E_CONFIG,
                "devices: expected a list");
    CHECK_FAILS(dg_config_set(&c, "tp=[1]", "-o", &err), &err, DG_E_CONFIG,
                "tp: expected an integer in [1, 64], got a list");
    CHECK_FAILS(dg_config_set(&c, "model=a: b", "-o", &err), &err, DG_E_CONFIG,
                "model: expected a string of at most 4095 bytes, got a mapping");
    CHECK_FAILS(dg_config_set(&c, "tp=1\n---\n2", "-o", &err), &err, DG_E_CONFIG,
                "a second document");
    CHECK_FAILS(dg_config_set(&c, "devices=[1", "-o", &err), &err, DG_E_CONFIG, "YAML syntax error");
    CHECK_FAILS(dg_config_set(&c, "tp=*a", "-o", &err), &err, DG_E_CONFIG, "-o: ");
    CHECK_FAILS(dg_config_set(&c, "=1", "-o", &err), &err, DG_E_CONFIG, "unknown key ''");
    CHECK_FAILS(dg_config_set(&c, "tp=", "-o", &err), &err, DG_E_CONFIG,
                "tp: expected an integer in [1, 64], got ''");
    CHECK(!memcmp(&c, &before, sizeof c));
    return 0;
}

static int validate(void)
{
    struct dg_config c;
    struct dg_error err = {0};

    dg_config_defaults(&c);
    CHECK_OK(load(&c, "devices: [2, 0, 5]\ntp: 64\n", &err), &err);
    CHECK_OK(dg_config_validate(&c, &err), &err);
    /* (a config built in code, not read: the loader refuses this list) */
    c.n_devices = 3, c.devices[0] = 2, c.devices[1] = 0, c.devices[2] = 2;
    CHECK_FAILS(dg_config_validate(&c, &err), &err, DG_E_CONFIG,
                "devices: GPU 2 is listed twice (entries 0 and 2)");
    dg_config_defaults(&c);
    c.tp = 65;
    CHECK_FAILS(dg_config_validate(&c, &err), &err, DG_E_CONFIG, "tp: 65 is outside [1, 64]");
    c.tp = 1;
    c.n_devices = 65;
    CHECK_FAILS(dg_config_validate(&c, &err), &err, DG_E_CONFIG, "devices: 65 entries");
    /* one_gpu: every rank on one GPU, at most DG_CONFIG_ONE_GPU_MAX_TP */
    dg_config_defaults(&c);
    CHECK_OK(load(&c, "one_gpu: true\ntp: 8\n", &err), &err);
    CHECK(c.one_gpu == 1);
    CHECK_OK(dg_config_validate(&c, &err), &err);
    CHECK_OK(dg_config_set(&c, "tp=9", "-o tp=9", &err), &err);
    CHECK_FAILS(dg_config_validate(&c, &err), &err, DG_E_CONFIG,
                "one_gpu: tp 9; one GPU takes at most 8 ranks");
    CHECK_OK(dg_config_set(&c, "one_gpu=false", "-o one_gpu=false", &err), &err);
    CHECK_OK(dg_config_validate(&c, &err), &err);
    return 0;
}

static int round_trip_one(const struct dg_config *c, struct dg_error *err)
{
    struct dg_config back;
    char *y = dg_config_to_yaml(c);
    int rc;

    if (!y)
        return test_fail(__FILE__, __LINE__, "dg_config_to_yaml returned NULL");
    dg_config_defaults(&back);
    rc = dg_config_load_text(&back, y, strlen(y), "to_yaml", err);
    if (rc != 0) {
        test_fail(__FILE__, __LINE__, "reading back failed: %s\n%s", err->msg, y);
        free(y);
        return 1;
    }
    if (memcmp(c, &back, sizeof back) != 0) {
        test_fail(__FILE__, __LINE__, "read back differs:\n%s", y);
        free(y);
        return 1;
    }
    free(y);
    return 0;
}

static int yaml_round_trip(void)
{
    static const char *const strings[] = {
        "", "plain/path-1.2_x", "null", "Null", "~", "-", "-x", "a b", "true", "1000", "0660",
        "it's \"quoted\"\\", "tab\there\nnewline\r", "\x01\x1f\x7f", "caf\xc3\xa9 \xe2\x82\xac",
        "\xc2\x85nel\xe2\x80\xa8ls\xe2\x80\xa9ps\xef\xbb\xbf\xef\xbf\xbe", "\xc2\x80\xc2\x9f\xc2\xa0",
        "\xf0\x9f\x98\x80", " lead", "trail ", "#hash", ": colon", "[x]", "*a", "&a", "!t", "%p",
        "@", "`", "'", "a: b", "a #b", "{", "?", "|", ">",
    };
    static const double doubles[] = {0, 30, 0.1, 0.01, 1.0 / 3, 3599.999999999999, 2.5e-300,
                                     1e-5, 3600};
    struct dg_config c;
    struct dg_error err = {0};
    char *y;

    dg_config_defaults(&c);
    if (round_trip_one(&c, &err))
        return 1;
    y = dg_config_to_yaml(&c);
    CHECK(y);
    CHECKF(strstr(y, "model: \"\"\nbackend: auto\ndevices: []\ntp: 1\n") == y, "%s", y);
    CHECKF(strstr(y, "\nsocket: /run/dgemma/dgemmad.sock\nsocket_mode: 0660\n"), "%s", y);
    CHECKF(strstr(y, "\nshutdown_grace: 30.0\ntick: 1.0\n"), "%s", y);
    free(y);

    CHECK_OK(load(&c, "devices: [5, 0, 1023]\nbackend: cpu\npin_workers: off\n"
                      "socket_mode: 0\nmax_output_bytes: 4294967296\nlog_level: error\n",
                  &err),
             &err);
    y = dg_config_to_yaml(&c);
    CHECK(y);
    CHECKF(strstr(y, "\ndevices: [5, 0, 1023]\n") && strstr(y, "\nsocket_mode: 0000\n"), "%s", y);
    free(y);
    if (round_trip_one(&c, &err))
        return 1;
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        memset(c.socket, 0, sizeof c.socket);
        strcpy(c.socket, strings[i]);
        if (round_trip_one(&c, &err))
            return 1;
    }
    memset(c.model, 'q', sizeof c.model - 1);
    memset(c.socket_group, '\n', sizeof c.socket_group - 1);
    if (round_trip_one(&c, &err))
        return 1;
    for (size_t i = 0; i < sizeof doubles / sizeof doubles[0]; i++) {
        c.shutdown_grace = doubles[i];
        if (round_trip_one(&c, &err))
            return 1;
    }
    return 0;
}

/* Lines of the file at path that start with "name:" (after an optional
 * "# "), or for the man page the ".BR name " entries. */
static int file_names_key(const char *text, const char *name, int man)
{
    char want[128];
    size_t n;

    if (man) {
        snprintf(want, sizeof want, "\n.BR %s ", name);
        return strstr(text, want) != NULL;
    }
    n = (size_t)snprintf(want, sizeof want, "%s:", name);
    for (const char *line = text; line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (!strncmp(line, "# ", 2))
            line += 2;
        if (!strncmp(line, want, n))
            return 1;
    }
    return 0;
}

static int documented(void)
{
    static const char *const files[] = {"etc/dgemmad.yaml", "man/dgemmad.yaml.5"};
    struct dg_error err = {0};

    for (int f = 0; f < 2; f++) {
        char *text;
        size_t len;
        CHECK_OK(dg_file_read(files[f], 1 << 20, &text, &len, &err), &err);
        for (int i = 0; i < dg_config_n_options(); i++) {
            const char *name, *def;
            dg_config_option_doc(i, &name, NULL, &def, NULL);
            if (!file_names_key(text, name, f == 1)) {
                free(text);
                return test_fail(__FILE__, __LINE__, "%s does not document '%s'", files[f],
                                 name);
            }
        }
        free(text);
    }
    return 0;
}

static int files(void)
{
    struct dg_config c, d;
    struct dg_error err = {0};

    dg_config_defaults(&d);
    memset(&c, 0xAB, sizeof c);
    dg_config_defaults(&c);
    CHECK(!memcmp(&c, &d, sizeof c));
    c.max_batch = 3;
    CHECK_OK(dg_config_load_file(&c, "etc/dgemmad.yaml", &err), &err);
    CHECK(!memcmp(&c, &d, sizeof c));
    CHECK_FAILS(dg_config_load_file(&c, "/nonexistent/dgemmad.yaml", &err), &err, DG_E_IO,
                "/nonexistent/dgemmad.yaml");
    CHECK_FAILS(dg_config_load_file(&c, "tests", &err), &err, DG_E_IO, "tests");
    {
        const char *p = test_path("bad.yaml");
        FILE *f = fopen(p, "w");
        CHECK(f);
        fputs("tp: 2\nmax_batch: 0\n", f);
        fclose(f);
        CHECK_FAILS(dg_config_load_file(&c, p, &err), &err, DG_E_CONFIG, ":2:12: max_batch:");
        CHECK(strstr(err.msg, p) == err.msg);
    }
    CHECK(!memcmp(&c, &d, sizeof c));
    return 0;
}

int main(void)
{
    TEST_CASE(defaults);
    TEST_CASE(every_key);
    TEST_CASE(good_forms);
    TEST_CASE(empty_documents);
    TEST_CASE(bad_values);
    TEST_CASE(limits);
    TEST_CASE(hostile);
    TEST_CASE(overrides);
    TEST_CASE(validate);
    TEST_CASE(yaml_round_trip);
    TEST_CASE(documented);
    TEST_CASE(files);
    return test_finish();
}
