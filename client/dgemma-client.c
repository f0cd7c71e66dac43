/*
 * dgemma-client - the command line of dgemmad: generate, chat, batch,
 * status, cancel, and stats (from the metrics database).  See
 * dgemma-client(1).
 */
#include <stdio.h>
#include <string.h>

#include "client/client.h"
#include "lib/version.h"

static const char usage[] =
    "usage: dgemma-client [generate] [OPTIONS] [PROMPT...]   one request, streamed\n"
    "       dgemma-client chat [OPTIONS]                      a conversation\n"
    "       dgemma-client batch --input FILE --output FILE [OPTIONS]\n"
    "                                                         JSON lines, for cron\n"
    "       dgemma-client status [--json]                     the daemon's state\n"
    "       dgemma-client cancel ID...                        stop requests\n"
    "       dgemma-client stats [--db FILE | -c CONFIG] [--hours N] [--json]\n"
    "                                                         metrics summary\n"
    "Every command but stats takes -s SOCKET (else $DGEMMA_SOCKET, else "
    DGEMMA_DEFAULT_SOCKET ")\n"
    "and --wait SECONDS (retry while the daemon starts).  COMMAND --help shows\n"
    "a command's options, --version the version.  Exit status: 0 done, 1 a\n"
    "request failed (or out of memory), 2 usage, 3 the daemon is unreachable or\n"
    "the connection was lost.\n";

static int is_command(const char *a)
{
    static const char *const commands[] = {"generate", "chat", "batch", "status", "cancel",
                                           "stats"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(a, commands[i]))
            return 1;
    return 0;
}

/* Options given before the command word (dgemma-client -s SOCK status):
 * move the command word to argv[1], so that the command parses them as its
 * own.  Only -s/--socket VALUE, --wait VALUE and --json are looked past;
 * anything else ends the scan (a prompt may be any word). */
static void command_first(int argc, char **argv)
{
    int i = 1;
    while (i < argc) {
        const char *a = argv[i];
        if ((!strcmp(a, "-s") || !strcmp(a, "--socket") || !strcmp(a, "--wait")) && i + 1 < argc)
            i += 2;
        else if (!strcmp(a, "--json"))
            i++;
        else
            break;
    }
    if (i > 1 && i < argc && is_command(argv[i])) {
        char *cmd = argv[i];
        memmove(&argv[2], &argv[1], (size_t)(i - 1) * sizeof *argv);
        argv[1] = cmd;
    }
}

int main(int argc, char **argv)
{
    command_first(argc, argv);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(usage, stdout);
        return EXIT_DONE;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("dgemma-client %s\n", DGEMMA_VERSION);
        return EXIT_DONE;
    }
    if (argc >= 2) {
        if (!strcmp(argv[1], "generate"))
            return cmd_generate(argc - 1, argv + 1);
        if (!strcmp(argv[1], "chat"))
            return cmd_chat(argc - 1, argv + 1);
        if (!strcmp(argv[1], "batch"))
            return cmd_batch(argc - 1, argv + 1);
        if (!strcmp(argv[1], "status"))
            return cmd_status(argc - 1, argv + 1);
        if (!strcmp(argv[1], "cancel"))
            return cmd_cancel(argc - 1, argv + 1);
        if (!strcmp(argv[1], "stats"))
            return cmd_stats(argc - 1, argv + 1);
    }
    /* no command: generate, with argv[0] standing in for the command name */
    return cmd_generate(argc, argv);
}
