/* client.h - what dgemma-client's commands share: options, settings flags,
 * exit codes. */
#ifndef DG_CLIENT_H
#define DG_CLIENT_H

#include <jansson.h>
#include <signal.h>
#include <stdio.h>

#include "client/dgemma.h"

/* Exit codes, the same for every command (dgemma-client(1)). */
enum {
    EXIT_DONE = 0,        /* everything asked for is done */
    EXIT_FAILED = 1,      /* a request (or a batch line) failed or was cancelled */
    EXIT_USAGE = 2,
    EXIT_UNREACHABLE = 3, /* no daemon at the socket, or the connection was lost */
};

struct client_opts {
    const char *socket;   /* NULL: $DGEMMA_SOCKET or the default */
    double wait_s;
    int json;             /* print the daemon's events as JSON lines */
    json_t *settings;     /* settings from flags and --settings (an object) */
};

/* What client_common_option returns after saying it ran out of memory:
 * the command fails (EXIT_FAILED), it is not a usage error. */
#define CLIENT_OPT_NOMEM (-2)

/* Parse the options every command takes (-s/--socket, --wait, --json) and
 * the settings flags (--max-tokens, --top-p, ..., --stop, --stop-id,
 * --settings).  *i is the index of argv[*i]; on a match it advances past
 * the option's value.  Returns 1 if it took the option, 0 if it is not
 * one of these, -1 after printing a usage error, CLIENT_OPT_NOMEM after
 * saying it ran out of memory. */
int client_common_option(struct client_opts *o, int argc, char **argv, int *i);

/* One step of a generating command's option loop (generate, chat,
 * batch): -h/--help, then what client_common_option takes.  Returns 1 if
 * it took argv[*i], 0 if it is not one of these, -1 when the command ends
 * now with *exit_code: EXIT_DONE after the help (usage, then the settings
 * flags, to stdout), EXIT_USAGE after a usage error, EXIT_FAILED out of
 * memory; o->settings is then released. */
int client_command_option(struct client_opts *o, const char *usage, int argc, char **argv,
                          int *i, int *exit_code);

/* The settings flags, for usage texts. */
extern const char client_settings_help[];

/* Print "dgemma-client: ..." to stderr. */
void client_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Write n bytes of generated text to f.  To a terminal (terminal != 0)
 * the controls a terminal acts on, which a model may well emit, go out as
 * U+FFFD: C0 other than newline, tab and a CR before a newline, DEL, and
 * C1 (U+0080..U+009F, in UTF-8).  So the text cannot move the cursor,
 * rewrite what is shown or send escape sequences.  Otherwise the bytes go
 * out as they are. */
void client_write_text(FILE *f, const char *s, size_t n, int terminal);

/* Connect with o's socket and wait; prints why on failure, with
 * *exit_code EXIT_FAILED when out of memory, else EXIT_UNREACHABLE. */
dgemma_t *client_connect(const struct client_opts *o, int *exit_code);

/* The exit code for libdgemma's error e (after its message was shown):
 * out of memory fails the command (EXIT_FAILED); any other error of the
 * connection means the daemon is out of reach (EXIT_UNREACHABLE). */
int client_exit_for(int e);

/* Copy o's settings into r (the request's own keys win when present);
 * prints why on failure.  Returns 0, or libdgemma's error:
 * DGEMMA_E_NOMEM when out of memory, else the daemon would refuse them. */
int client_apply_settings(const struct client_opts *o, dgemma_request_t *r);

/* Counts SIGINTs (installed by client_catch_sigint, without SA_RESTART:
 * a blocking read returns EINTR). */
extern volatile sig_atomic_t client_interrupted;
void client_catch_sigint(void);

/* What Ctrl-C does while request id (0: not accepted yet) runs on c:
 * the first cancels it (once its id is known), a second ends the client
 * at once (client_interrupt_now).  Call it after every dgemma_next_event,
 * whatever it returned: events that keep coming must not hide it. */
void client_on_interrupt(dgemma_t *c, uint64_t id, int *cancelled);

/* The next event of request id's stream on c (id 0: not accepted yet),
 * waiting as long as it takes, with Ctrl-C handled as client_on_interrupt
 * says: 0 with *ev set, or libdgemma's error after saying it.  (After an
 * error the caller ends the client: the daemon cancels the requests of a
 * connection that hangs up, so none is left to run for no one.) */
int client_next_event(dgemma_t *c, uint64_t id, int *cancelled, dgemma_event_t *ev);

/* End the process as SIGINT's default action does (after a second Ctrl-C:
 * the daemon may not answer the first one's cancel). */
void client_interrupt_now(void) __attribute__((noreturn));

/* Whether standard output has failed (flushed here): 1 after saying why
 * once on standard error, so that lost output is an error, not exit 0. */
int client_output_failed(void);

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_cancel(int argc, char **argv);
/* Summarize the metrics database (reads the file, not the daemon). */
int cmd_stats(int argc, char **argv);

#endif
