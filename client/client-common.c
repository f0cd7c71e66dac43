/* client-common.c - options, settings flags and connection for every
 * dgemma-client command (see client.h). */
#include "client/client.h"
#include "lib/json-util.h"
#include "lib/settings-flags.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t client_interrupted;

const char client_settings_help[] =
    "generation settings (dgemmad(8)):\n"
    "  --max-tokens N  --seed N  --canvas-length N  --max-denoising-steps N\n"
    "  --entropy-bound X  --confidence-threshold X  --stability-threshold N\n"
    "  --t-min X  --t-max X  --top-k N  --top-p X  --stop TEXT  --stop-id N\n"
    "  --settings JSON (an object of the same settings)\n"
    "  --no-parse-special (a typed turn marker or <mask> in the prompt is text)\n"
    "  --parse-special (it is that token; the daemon's default unless configured)\n";

void client_errorf(const char *fmt, ...)
{
    va_list ap;
    fputs("dgemma-client: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void client_write_text(FILE *f, const char *s, size_t n, int terminal)
{
    static const char repl[] = "\xef\xbf\xbd"; /* U+FFFD */
    size_t i = 0, from = 0;
    if (!terminal) {
        fwrite(s, 1, n, f);
        return;
    }
    while (i < n) {
        const unsigned char c = (unsigned char)s[i];
        const int crlf = c == '\r' && i + 1 < n && s[i + 1] == '\n';
        const size_t bad = (c < 0x20 && c != '\n' && c != '\t' && !crlf) || c == 0x7f ? 1
                           : c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                                   (unsigned char)s[i + 1] <= 0x9f
                               ? 2
                               : 0;
        if (!bad) {
            i++;
            continue;
        }
        fwrite(s + from, 1, i - from, f);
        fwrite(repl, 1, sizeof repl - 1, f);
        i += bad;
        from = i;
    }
    fwrite(s + from, 1, n - from, f);
}

/* a generate line's keys that are not settings (daemon/protocol.c) */
static const char *const REQUEST_KEYS[] = {
    "v", "op", "tag", "prompt", "messages", "prompt_ids", "stream", "enable_thinking", "batch",
    "parse_special",
};

static int need_value(int argc, char **argv, int i)
{
    if (i + 1 >= argc) {
        client_errorf("%s needs a value", argv[i]);
        return -1;
    }
    return 0;
}

int client_common_option(struct client_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    char *end;

    if (!o->settings && !(o->settings = json_object())) {
        client_errorf("out of memory");
        return CLIENT_OPT_NOMEM;
    }
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return 1;
    }
    if (!strcmp(a, "-s") || !strcmp(a, "--socket")) {
        if (need_value(argc, argv, *i) < 0)
            return -1;
        o->socket = argv[++*i];
        return 1;
    }
    if (!strcmp(a, "--wait")) {
        if (need_value(argc, argv, *i) < 0)
            return -1;
        o->wait_s = strtod(argv[*i + 1], &end);
        if (end == argv[*i + 1] || *end || !(o->wait_s >= 0) || o->wait_s > 3600) {
            client_errorf("--wait: '%s' is not a number of seconds (0 .. 3600)", argv[*i + 1]);
            return -1;
        }
        ++*i;
        return 1;
    }
    if (!strcmp(a, "--parse-special") || !strcmp(a, "--no-parse-special")) {
        if (json_object_set_new(o->settings, "parse_special", json_boolean(a[2] == 'p')) != 0) {
            client_errorf("out of memory");
            return CLIENT_OPT_NOMEM;
        }
        return 1;
    }
    if (!strcmp(a, "--settings")) {
        struct dg_error je = {0};
        json_t *s;
        if (need_value(argc, argv, *i) < 0)
            return -1;
        s = dg_json_loadb(argv[*i + 1], strlen(argv[*i + 1]),
                          JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, "--settings", &je);
        if (!json_is_object(s)) {
            if (s)
                client_errorf("--settings: must be a JSON object");
            else
                client_errorf("%s", je.msg);
            json_decref(s);
            return !s && je.code == DG_E_NOMEM ? CLIENT_OPT_NOMEM : -1;
        }
        /* the request's own keys are not settings: they would replace
         * what the command builds (the prompt, the stream, ...) */
        for (size_t k = 0; k < sizeof REQUEST_KEYS / sizeof REQUEST_KEYS[0]; k++)
            if (json_object_get(s, REQUEST_KEYS[k])) {
                client_errorf("--settings: '%s' is not a generation setting", REQUEST_KEYS[k]);
                json_decref(s);
                return -1;
            }
        if (json_object_update(o->settings, s) != 0) {
            client_errorf("out of memory");
            json_decref(s);
            return CLIENT_OPT_NOMEM;
        }
        json_decref(s);
        ++*i;
        return 1;
    }
    if (dg_settings_flag_key(a)) {
        struct dg_error se = {0};
        if (need_value(argc, argv, *i) < 0)
            return -1;
        if (dg_settings_flag_set(o->settings, a, argv[++*i], &se) < 0) {
            client_errorf("%s", se.msg);
            return se.code == DG_E_NOMEM ? CLIENT_OPT_NOMEM : -1;
        }
        return 1;
    }
    return 0;
}

dgemma_t *client_connect(const struct client_opts *o, int *exit_code)
{
    dgemma_t *c = dgemma_new();
    int rc;
    if (!c) {
        client_errorf("out of memory");
        *exit_code = EXIT_FAILED;
        return NULL;
    }
    if ((rc = dgemma_connect(c, o->socket, o->wait_s)) < 0) {
        client_errorf("%s", dgemma_errmsg(c));
        dgemma_close(c);
        *exit_code = client_exit_for(rc);
        return NULL;
    }
    return c;
}

int client_exit_for(int e)
{
    return e == DGEMMA_E_NOMEM ? EXIT_FAILED : EXIT_UNREACHABLE;
}

int client_apply_settings(const struct client_opts *o, dgemma_request_t *r)
{
    char *text;
    int rc;
    if (!o->settings || json_object_size(o->settings) == 0)
        return 0;
    /* (dg_json_dumps: jansson's own dump may leave a key out when short
     * of memory, and a different setting would be sent) */
    if (!(text = dg_json_dumps(o->settings, JSON_COMPACT))) {
        client_errorf("settings: out of memory");
        return DGEMMA_E_NOMEM;
    }
    rc = dgemma_request_set_json(r, text);
    if (rc < 0)
        client_errorf("settings: %s", dgemma_request_errmsg(r));
    free(text);
    return rc;
}

void client_on_interrupt(dgemma_t *c, uint64_t id, int *cancelled)
{
    if (client_interrupted >= 2)
        client_interrupt_now();
    if (client_interrupted && id && !*cancelled) {
        dgemma_cancel(c, id);
        *cancelled = 1;
    }
}

int client_next_event(dgemma_t *c, uint64_t id, int *cancelled, dgemma_event_t *ev)
{
    for (;;) {
        int e = dgemma_next_event(c, ev, 200);
        client_on_interrupt(c, id, cancelled);
        if (e == DGEMMA_E_AGAIN)
            continue;
        if (e < 0)
            client_errorf("%s", dgemma_errmsg(c));
        return e < 0 ? e : 0;
    }
}

void client_interrupt_now(void)
{
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    _exit(130); /* (if SIGINT is ignored or blocked) */
}

int client_output_failed(void)
{
    static int said;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return 0;
    if (!said++)
        client_errorf("writing the output: %s", strerror(errno ? errno : EIO));
    return 1;
}

static void on_sigint(int sig)
{
    (void)sig;
    client_interrupted++;
}

void client_catch_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

int client_command_option(struct client_opts *o, const char *usage, int argc, char **argv,
                          int *i, int *exit_code)
{
    int took;
    if (!strcmp(argv[*i], "-h") || !strcmp(argv[*i], "--help")) {
        fputs(usage, stdout);
        fputs(client_settings_help, stdout);
        *exit_code = EXIT_DONE;
    } else if ((took = client_common_option(o, argc, argv, i)) >= 0) {
        return took;
    } else {
        *exit_code = took == CLIENT_OPT_NOMEM ? EXIT_FAILED : EXIT_USAGE;
    }
    json_decref(o->settings);
    o->settings = NULL;
    return -1;
}
