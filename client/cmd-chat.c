/* cmd-chat.c - `dgemma-client chat`: a conversation.  On a terminal: a
 * "> " prompt, the reply streamed, /exit or Ctrl-D to leave, Ctrl-C to stop
 * a reply.  Otherwise each input line is one turn and each reply one
 * output line. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client.h"
#include "lib/grow.h"

static const char usage[] =
    "usage: dgemma-client chat [-s|--socket SOCKET] [--wait SECONDS] [--system TEXT]\n"
    "                          [--thinking] [SETTINGS]\n"
    "A conversation: every turn sends the whole history in the model's chat\n"
    "format.  On a terminal it prompts with \"> \"; /reset forgets the history,\n"
    "/exit or end of input leaves; Ctrl-C stops the reply being written.  When\n"
    "standard input is not a terminal, each line is a turn and each reply is\n"
    "written as one line.\n";

struct turn {
    char *role, *content;
};

struct history {
    struct turn *t;
    size_t n, cap;
};

static int push(struct history *h, const char *role, const char *content, size_t len)
{
    struct turn *t = dg_grow(h->t, &h->cap, h->n + 1, sizeof *t, 16);
    if (!t)
        return -1;
    h->t = t;
    h->t[h->n].role = strdup(role);
    h->t[h->n].content = strndup(content, len);
    if (!h->t[h->n].role || !h->t[h->n].content) {
        free(h->t[h->n].role);
        free(h->t[h->n].content);
        return -1;
    }
    h->n++;
    return 0;
}

static void clear(struct history *h, size_t keep)
{
    while (h->n > keep) {
        h->n--;
        free(h->t[h->n].role);
        free(h->t[h->n].content);
    }
}

/* One reply: written as it arrives, kept whole in *reply.  Returns an
 * exit code (EXIT_DONE even when cancelled by Ctrl-C: the chat goes on);
 * *fatal is set when the chat cannot go on (the connection lost, its
 * events no longer read, a usage error in the settings). */
static int reply(dgemma_t *c, const struct client_opts *o, const struct history *h, int thinking,
                 char **out, size_t *out_len, int tty, int *fatal)
{
    dgemma_request_t *r = dgemma_request_chat();
    uint64_t id = 0;
    int cancelled = 0, lost = 0, rc = EXIT_UNREACHABLE, e = 0;
    size_t len = 0, cap = 0;
    char *text = NULL;

    *out = NULL;
    *out_len = 0;
    *fatal = 0;
    if (!r) {
        client_errorf("out of memory building the request");
        return EXIT_FAILED;
    }
    for (size_t i = 0; i < h->n && e == 0; i++)
        e = dgemma_request_add_message(r, h->t[i].role, h->t[i].content);
    if (e == 0 && thinking)
        e = dgemma_request_set_thinking(r, 1);
    if (e < 0) { /* (out of memory, or a line not UTF-8) */
        client_errorf("%s", dgemma_request_errmsg(r));
        dgemma_request_free(r);
        return EXIT_FAILED;
    }
    /* settings out of memory: this turn fails, the chat may go on;
     * settings refused would refuse every turn, and a failed send (even
     * for memory: part of the line may be out) leaves the connection in
     * doubt */
    if ((e = client_apply_settings(o, r)) < 0) {
        dgemma_request_free(r);
        *fatal = e != DGEMMA_E_NOMEM;
        return e == DGEMMA_E_NOMEM ? EXIT_FAILED : EXIT_USAGE;
    }
    if ((e = dgemma_submit(c, r)) < 0) {
        client_errorf("%s", dgemma_errmsg(c));
        dgemma_request_free(r);
        *fatal = 1;
        return client_exit_for(e);
    }
    dgemma_request_free(r);
    client_interrupted = 0;
    for (;;) {
        dgemma_event_t ev;
        if ((e = client_next_event(c, id, &cancelled, &ev)) < 0) {
            /* (out of memory too: the chat ends, its events no longer
             * read in order) */
            *fatal = 1;
            rc = client_exit_for(e);
            break;
        }
        if (ev.kind == DGEMMA_EV_ACCEPTED) {
            id = ev.id;
        } else if (ev.kind == DGEMMA_EV_ERROR) {
            client_errorf("%s: %s", ev.code ? ev.code : "error", ev.message ? ev.message : "");
            rc = EXIT_FAILED;
            break;
        } else if (ev.kind == DGEMMA_EV_CANVAS && ev.text && !lost) {
            if (len + ev.text_len + 1 > cap) {
                size_t ncap = 2 * (len + ev.text_len + 1);
                char *nt = realloc(text, ncap);
                if (!nt) {
                    /* the reply cannot be kept: stopped, its events read
                     * to its end, so the next turn starts clean */
                    client_errorf("out of memory for the reply: stopped");
                    if (id && !cancelled)
                        dgemma_cancel(c, id);
                    cancelled = lost = 1;
                    continue;
                }
                text = nt;
                cap = ncap;
            }
            memcpy(text + len, ev.text, ev.text_len);
            len += ev.text_len;
            /* a line per reply off a terminal: newlines inside become spaces */
            if (!tty)
                for (size_t i = len - ev.text_len; i < len; i++)
                    if (text[i] == '\n')
                        text[i] = ' ';
            client_write_text(stdout, text + len - ev.text_len, ev.text_len, isatty(1));
            if (client_output_failed()) { /* (the caller ends the chat) */
                if (id && !cancelled)
                    dgemma_cancel(c, id);
                rc = EXIT_FAILED;
                break;
            }
        } else if (ev.kind == DGEMMA_EV_DONE) {
            putchar('\n');
            fflush(stdout);
            if (cancelled && tty && !lost)
                fprintf(stderr, "(stopped)\n");
            rc = lost || (ev.finish_reason && !strcmp(ev.finish_reason, "error")) ? EXIT_FAILED
                                                                                  : EXIT_DONE;
            break;
        }
    }
    *out = text;
    *out_len = len;
    return rc;
}

/* Wait until standard input, a terminal, has a line, or Ctrl-C comes
 * (-1).  A terminal in canonical mode gives a read at most one line, so
 * nothing waits in stdio's buffer that a poll would miss.  SIGINT is let
 * in only inside ppoll, so a Ctrl-C typed as the prompt was written (before
 * the wait began) is seen, not left for a read that then blocks. */
static int wait_line(void)
{
    sigset_t block, old;
    struct pollfd p = {0, POLLIN, 0};
    int rc = 0;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    for (;;) {
        int r;
        if (client_interrupted) {
            rc = -1;
            break;
        }
        r = ppoll(&p, 1, NULL, &old);
        if (r > 0 || (r < 0 && errno != EINTR))
            break; /* (a line, the end, or an error getline then reports) */
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    struct client_opts o = {0};
    struct history h = {0};
    const char *system = NULL;
    int thinking = 0, rc = EXIT_DONE, fatal = 0;
    const int tty = isatty(0);
    size_t base;
    dgemma_t *c;
    char *line = NULL;
    size_t cap = 0;

    for (int i = 1; i < argc; i++) {
        int took, code;
        if ((took = client_command_option(&o, usage, argc, argv, &i, &code)) < 0)
            return code;
        if (took)
            continue;
        if (!strcmp(argv[i], "--thinking")) {
            thinking = 1;
        } else if (!strcmp(argv[i], "--system")) {
            if (i + 1 >= argc) {
                client_errorf("--system needs a value");
                json_decref(o.settings);
                return EXIT_USAGE;
            }
            system = argv[++i];
        } else {
            client_errorf("chat: unexpected '%s'", argv[i]);
            fputs(usage, stderr);
            json_decref(o.settings);
            return EXIT_USAGE;
        }
    }
    if (o.json) {
        client_errorf("chat: --json is for generate (generate --chat --json sends one turn)");
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    if (system) { /* checked before the first turn */
        dgemma_request_t *r = dgemma_request_chat();
        int bad = r && dgemma_request_add_message(r, "system", system) < 0;
        if (bad)
            client_errorf("--system: %s", dgemma_request_errmsg(r));
        dgemma_request_free(r);
        if (bad) {
            json_decref(o.settings);
            return EXIT_USAGE;
        }
    }
    if (system && push(&h, "system", system, strlen(system)) < 0) {
        client_errorf("out of memory");
        json_decref(o.settings);
        return EXIT_FAILED;
    }
    base = h.n;
    if (!(c = client_connect(&o, &rc))) {
        clear(&h, 0);
        free(h.t);
        json_decref(o.settings);
        return rc;
    }
    client_catch_sigint();
    for (;;) {
        ssize_t n;
        char *text;
        size_t text_len;
        client_interrupted = 0; /* (before the prompt: a Ctrl-C at it counts) */
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        n = tty && wait_line() < 0 ? -1 : getline(&line, &cap, stdin);
        if (n < 0 && client_interrupted) {
            /* Ctrl-C at the prompt: a new prompt, the conversation kept */
            clearerr(stdin);
            putchar('\n');
            continue;
        }
        if (n < 0) {
            if (tty)
                putchar('\n');
            /* a read error, or no memory for the line (getline then
             * returns -1 with errno ENOMEM and leaves the stream's error
             * flag alone): not the end of the input */
            if (ferror(stdin) || errno == ENOMEM) {
                client_errorf("reading standard input: %s",
                              errno == ENOMEM ? "out of memory" : strerror(errno ? errno : EIO));
                rc = EXIT_FAILED;
            }
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        if (memchr(line, '\0', (size_t)n)) {
            client_errorf("a line holds a NUL byte: not sent");
            if (!tty) {
                rc = EXIT_FAILED;
                break;
            }
            continue;
        }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            clear(&h, base);
            continue;
        }
        if (push(&h, "user", line, (size_t)n) < 0) {
            client_errorf("out of memory");
            rc = EXIT_FAILED;
            break;
        }
        rc = reply(c, &o, &h, thinking, &text, &text_len, tty, &fatal);
        if (client_output_failed()) { /* nowhere to write the conversation */
            free(text);
            rc = EXIT_FAILED;
            break;
        }
        if (rc == EXIT_DONE && text_len > 0 && push(&h, "assistant", text, text_len) < 0) {
            client_errorf("out of memory: the reply is not kept in the conversation");
            rc = EXIT_FAILED;
        }
        if (rc != EXIT_DONE || text_len == 0)
            clear(&h, h.n - 1); /* no answer: forget the question too */
        free(text);
        if (fatal || rc == EXIT_UNREACHABLE || (rc != EXIT_DONE && !tty))
            break;
        rc = EXIT_DONE; /* on a terminal the conversation goes on */
    }
    free(line);
    dgemma_close(c);
    clear(&h, 0);
    free(h.t);
    json_decref(o.settings);
    return rc;
}
