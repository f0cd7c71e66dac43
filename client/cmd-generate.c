/* cmd-generate.c - `dgemma-client generate`: one request, its text
 * streamed to standard output as canvases finish. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client.h"
#include "lib/utf8.h"

static const char usage[] =
    "usage: dgemma-client [generate] [-s|--socket SOCKET] [--wait SECONDS] [--json]\n"
    "                     [--no-stream] [--chat [--system TEXT] [--thinking]]\n"
    "                     [--ids \"ID ...\"] [--tag TAG] [--quiet] [SETTINGS] [PROMPT...]\n"
    "Send PROMPT (the arguments joined by spaces, or standard input) and write\n"
    "the text as each canvas arrives, then a summary to standard error (not\n"
    "with --quiet).  --chat sends it as a user message in the model's chat\n"
    "format (after --system's system message); --ids sends token ids instead of\n"
    "text; --json writes the daemon's events as they come.  Ctrl-C cancels the\n"
    "request.\n";

/* The prompt: the arguments joined by spaces, else standard input (NULL
 * after saying why: out of memory, a read error, a NUL byte, which a
 * prompt cannot hold; *status the exit code then). */
static char *prompt_text(int argc, char **argv, int first, int *status)
{
    size_t cap = 4096, len = 0;
    char *b;
    *status = EXIT_FAILED;
    if (first < argc) {
        size_t n = 1;
        for (int i = first; i < argc; i++)
            n += strlen(argv[i]) + 1;
        b = calloc(1, n);
        for (int i = first; b && i < argc; i++) {
            if (i > first)
                strcat(b, " ");
            strcat(b, argv[i]);
        }
        if (!b)
            client_errorf("out of memory reading the prompt");
        return b;
    }
    b = malloc(cap);
    while (b) {
        size_t got = fread(b + len, 1, cap - len - 1, stdin);
        len += got;
        if (got == 0)
            break;
        if (len + 1 == cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    if (!b) {
        client_errorf("out of memory reading the prompt");
        return NULL;
    }
    if (ferror(stdin)) {
        client_errorf("reading the prompt from standard input: %s", strerror(errno));
        free(b);
        return NULL;
    }
    if (memchr(b, '\0', len)) {
        client_errorf("the prompt holds a NUL byte (at byte %zu of standard input)",
                      (size_t)((char *)memchr(b, '\0', len) - b));
        *status = EXIT_USAGE;
        free(b);
        return NULL;
    }
    b[len] = '\0';
    return b;
}

/* "1 2 3" -> *ids (*n of them; freed by the caller).  Returns 0,
 * EXIT_USAGE on a bad token, EXIT_FAILED out of memory; *ids is NULL then. */
static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 64;
    int32_t *v = malloc(cap * sizeof *v);
    *n = 0;
    *ids = NULL;
    if (!v)
        return EXIT_FAILED;
    while (*s) {
        char *end;
        long x;
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n')
            s++;
        if (!*s)
            break;
        x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) {
            free(v);
            return EXIT_USAGE;
        }
        if (*n == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                return EXIT_FAILED;
            }
            v = nv;
            cap *= 2;
        }
        v[(*n)++] = (int32_t)x;
        s = end;
    }
    *ids = v;
    return 0;
}

int cmd_generate(int argc, char **argv)
{
    struct client_opts o = {0};
    const char *system = NULL, *tag = NULL, *ids_text = NULL;
    int chat = 0, thinking = 0, stream = 1, quiet = 0, first = argc, rc = EXIT_UNREACHABLE;
    dgemma_request_t *r = NULL;
    dgemma_t *c = NULL;
    char *prompt = NULL;
    uint64_t id = 0;
    int cancelled = 0, e;
    const int terminal = isatty(1); /* (controls in the text shown as U+FFFD) */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int took, code;
        if ((took = client_command_option(&o, usage, argc, argv, &i, &code)) < 0)
            return code;
        if (took)
            continue;
        if (!strcmp(a, "--chat"))
            chat = 1;
        else if (!strcmp(a, "--thinking"))
            thinking = 1;
        else if (!strcmp(a, "--no-stream"))
            stream = 0;
        else if (!strcmp(a, "--quiet"))
            quiet = 1;
        else if (!strcmp(a, "--system") || !strcmp(a, "--tag") || !strcmp(a, "--ids")) {
            const char *v;
            if (i + 1 >= argc) {
                client_errorf("%s needs a value", a);
                json_decref(o.settings);
                return EXIT_USAGE;
            }
            v = argv[++i];
            if (a[2] == 's')
                system = v;
            else if (a[2] == 't')
                tag = v;
            else
                ids_text = v;
        } else if (!strcmp(a, "--")) {
            first = i + 1;
            break;
        } else if (a[0] == '-' && a[1]) {
            client_errorf("unknown option '%s'", a);
            fputs(usage, stderr);
            json_decref(o.settings);
            return EXIT_USAGE;
        } else {
            first = i;
            break;
        }
    }
    if ((system || thinking) && !chat) {
        client_errorf("--system and --thinking go with --chat");
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    if (ids_text) {
        size_t n;
        int32_t *ids;
        if (chat || first < argc) {
            client_errorf("--ids replaces the prompt (and --chat)");
            json_decref(o.settings);
            return EXIT_USAGE;
        }
        const int bad = parse_ids(ids_text, &ids, &n);
        if (bad || n == 0) {
            if (bad == EXIT_FAILED)
                client_errorf("--ids: out of memory");
            else
                client_errorf("--ids: expected token ids separated by spaces");
            free(ids);
            json_decref(o.settings);
            return bad ? bad : EXIT_USAGE;
        }
        r = dgemma_request_ids(ids, n);
        free(ids);
    } else {
        int status;
        prompt = prompt_text(argc, argv, first, &status);
        if (!prompt) {
            json_decref(o.settings);
            return status;
        }
        if (chat) {
            r = dgemma_request_chat();
            if (r) {
                e = system ? dgemma_request_add_message(r, "system", system) : 0;
                if (e == 0)
                    e = dgemma_request_add_message(r, "user", prompt);
                if (e == 0 && thinking)
                    e = dgemma_request_set_thinking(r, 1);
                if (e < 0) {
                    client_errorf("%s", dgemma_request_errmsg(r));
                    dgemma_request_free(r);
                    free(prompt);
                    json_decref(o.settings);
                    return e == DGEMMA_E_NOMEM ? EXIT_FAILED : EXIT_USAGE;
                }
            }
        } else if (dg_utf8_valid_prefix((const unsigned char *)prompt, strlen(prompt)) !=
                   strlen(prompt)) {
            client_errorf("the prompt is not valid UTF-8");
            free(prompt);
            json_decref(o.settings);
            return EXIT_USAGE;
        } else {
            r = dgemma_request_text(prompt); /* (NULL now: out of memory) */
        }
    }
    if (!r) {
        client_errorf("out of memory building the request");
        free(prompt);
        json_decref(o.settings);
        return EXIT_FAILED;
    }
    if ((e = dgemma_request_set_stream(r, stream)) < 0 ||
        (tag && (e = dgemma_request_set_tag(r, tag)) < 0)) {
        client_errorf("%s%s", e == DGEMMA_E_NOMEM ? "" : "--tag: ", dgemma_request_errmsg(r));
        rc = e == DGEMMA_E_NOMEM ? EXIT_FAILED : EXIT_USAGE;
        goto out;
    }
    if ((e = client_apply_settings(&o, r)) < 0) {
        rc = e == DGEMMA_E_NOMEM ? EXIT_FAILED : EXIT_USAGE;
        goto out;
    }
    if (!(c = client_connect(&o, &rc)))
        goto out;
    client_catch_sigint();
    if ((e = dgemma_submit(c, r)) < 0) {
        client_errorf("%s", dgemma_errmsg(c));
        rc = client_exit_for(e);
        goto out;
    }
    for (;;) {
        dgemma_event_t ev;
        if ((e = client_next_event(c, id, &cancelled, &ev)) < 0) {
            rc = client_exit_for(e);
            break;
        }
        if (o.json) /* (flushed by client_output_failed, in the loop or after it) */
            puts(ev.json);
        if (ev.kind == DGEMMA_EV_ACCEPTED) {
            id = ev.id;
        } else if (ev.kind == DGEMMA_EV_ERROR) {
            if (!o.json)
                client_errorf("%s: %s", ev.code ? ev.code : "error",
                              ev.message ? ev.message : "");
            rc = EXIT_FAILED;
            break;
        } else if (ev.kind == DGEMMA_EV_CANVAS && !o.json && ev.text) {
            client_write_text(stdout, ev.text, ev.text_len, terminal);
        } else if (ev.kind == DGEMMA_EV_DONE) {
            const char *fin = ev.finish_reason ? ev.finish_reason : "?";
            if (!o.json) {
                if (ev.text)
                    client_write_text(stdout, ev.text, ev.text_len, terminal);
                putchar('\n');
                fflush(stdout);
                if (!quiet)
                    fprintf(stderr, "dgemma-client: request %llu: %s%s%s; %lld prompt + %lld "
                            "tokens in %d canvas%s, %lld step%s, %.1f tokens/s\n",
                            (unsigned long long)ev.id, fin, ev.message ? ": " : "",
                            ev.message ? ev.message : "", ev.prompt_tokens, ev.completion_tokens,
                            ev.canvases, ev.canvases == 1 ? "" : "es", ev.decoder_steps,
                            ev.decoder_steps == 1 ? "" : "s", ev.tokens_per_s);
            }
            rc = !strcmp(fin, "stop") || !strcmp(fin, "length") ? EXIT_DONE : EXIT_FAILED;
            break;
        }
        /* output that cannot be written (a full disk): the request is of
         * no use any more */
        if (client_output_failed()) {
            if (id && !cancelled)
                dgemma_cancel(c, id);
            rc = EXIT_FAILED;
            goto out;
        }
    }
    if (client_output_failed() && rc == EXIT_DONE)
        rc = EXIT_FAILED;
out:
    dgemma_close(c);
    dgemma_request_free(r);
    free(prompt);
    json_decref(o.settings);
    return rc;
}
