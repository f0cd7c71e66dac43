/*
 * Description: the lib/ error type (codes, messages, truncation, prefixes,
 * stable names) and the log interface (no sink: silent; a sink gets each
 * line at or below its level).
 */
#include <stdlib.h>
#include <string.h>

#include "lib/error.h"
#include "lib/log.h"
#include "tests/harness.h"

static int case_set_returns_negative_code(void)
{
    struct dg_error err = {0};
    int rc = dg_error_set(&err, DG_E_SHAPE, "tensor %s: %d", "x", 7);
    CHECK(rc == -DG_E_SHAPE);
    CHECK(err.code == DG_E_SHAPE);
    CHECK(strcmp(err.msg, "tensor x: 7") == 0);
    CHECK(dg_error_set(NULL, DG_E_IO, "ignored") == -DG_E_IO);
    dg_error_clear(&err);
    CHECK(err.code == DG_OK && err.msg[0] == '\0');
    return 0;
}

static int case_long_messages_truncate(void)
{
    struct dg_error err;
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    dg_error_set(&err, DG_E_FORMAT, "%s", big);
    CHECK(strlen(err.msg) == DG_ERROR_MSG_MAX - 1);
    CHECK(dg_error_prefix(&err, "ctx") == -DG_E_FORMAT);
    CHECK(strncmp(err.msg, "ctx: aaa", 8) == 0 && strlen(err.msg) == DG_ERROR_MSG_MAX - 1);
    return 0;
}

static int case_prefix(void)
{
    struct dg_error err = {0};
    CHECK(dg_error_prefix(&err, "nothing recorded") == -DG_E_INTERNAL);
    CHECK(dg_error_prefix(NULL, "x") == -DG_E_INTERNAL);
    dg_error_set(&err, DG_E_MISSING, "no such file");
    CHECK(dg_error_prefix(&err, "loading %s", "m") == -DG_E_MISSING);
    CHECK(strcmp(err.msg, "loading m: no such file") == 0 && err.code == DG_E_MISSING);
    return 0;
}

static int case_status_names_stable(void)
{
    static const char *const want[] = {"ok", "invalid_argument", "out_of_memory", "io", "format",
                                       "config", "unsupported", "dtype", "shape", "missing",
                                       "extra", "range", "internal", "cuda", "cublas", "nccl",
                                       "no_device", "busy"};
    CHECK(sizeof want / sizeof want[0] == DG_STATUS_COUNT);
    for (int i = 0; i < DG_STATUS_COUNT; i++) {
        CHECKF(strcmp(dg_status_name(i), want[i]) == 0, "status %d is %s", i, dg_status_name(i));
        CHECK(strcmp(dg_status_name(-i), want[i]) == 0);
    }
    CHECK(strcmp(dg_status_name(DG_STATUS_COUNT), "unknown") == 0);
    CHECK(strcmp(dg_status_name(-1000), "unknown") == 0);
    return 0;
}

static int n_lines;
static enum dg_log_level last_level;
static char last_line[4096];

static void sink(void *ud, enum dg_log_level level, const char *line)
{
    if (ud != (void *)&n_lines) /* the userdata must come back unchanged */
        abort();
    n_lines++;
    last_level = level;
    snprintf(last_line, sizeof last_line, "%s", line);
}

static int case_log_sink(void)
{
    char big[5000];

    dg_log_set_sink(NULL, NULL, DG_LOG_DEBUG);
    dg_log(DG_LOG_ERROR, "dropped %d", 1); /* no sink: nothing happens */
    dg_log_set_sink(sink, &n_lines, DG_LOG_WARN);
    dg_log(DG_LOG_INFO, "too verbose");
    CHECK(n_lines == 0);
    dg_log(DG_LOG_WARN, "layer %d forced", 29);
    CHECK(n_lines == 1 && last_level == DG_LOG_WARN && strcmp(last_line, "layer 29 forced") == 0);
    dg_log(DG_LOG_ERROR, "bad");
    CHECK(n_lines == 2 && last_level == DG_LOG_ERROR);
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    dg_log(DG_LOG_ERROR, "%s", big);
    CHECK(strlen(last_line) == 2047);
    CHECK(dg_log_level_char(DG_LOG_ERROR) == 'E' && dg_log_level_char(DG_LOG_WARN) == 'W' &&
          dg_log_level_char(DG_LOG_INFO) == 'I' && dg_log_level_char(DG_LOG_DEBUG) == 'D');
    dg_log_set_sink(NULL, NULL, DG_LOG_INFO);
    return 0;
}

int main(void)
{
    TEST_CASE(case_set_returns_negative_code);
    TEST_CASE(case_long_messages_truncate);
    TEST_CASE(case_prefix);
    TEST_CASE(case_status_names_stable);
    TEST_CASE(case_log_sink);
    return test_finish();
}
