/*
 * dgemma-client - send a request to dgemmad and stream the answer.
 * See dgemma-client(1) and the protocol in dgemmad(8).
 */
#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/dgemma/dgemmad.sock"
#define LINE_MAX_BYTES (64u << 20)

static const char usage[] =
    "usage: dgemma-client [-s SOCKET] [--wait SECONDS] [--chat] [--json] [--no-stream]\n"
    "                     [--settings JSON] [--max-tokens N] [--seed N] [--tag TAG]\n"
    "                     [PROMPT...]\n"
    "       dgemma-client [-s SOCKET] --status\n"
    "Send PROMPT (the arguments joined by spaces, or standard input) to dgemmad\n"
    "and write the text to standard output as each canvas arrives, then a\n"
    "summary to standard error.  --chat sends it as a user message in the\n"
    "model's chat format; --settings adds generation settings (a JSON object:\n"
    "max_tokens, seed, top_p, stop, ...); --json writes the daemon's events as\n"
    "they come.  --wait retries the connection for up to SECONDS while the\n"
    "daemon starts.  The socket is -s, else $DGEMMA_SOCKET, else " DEFAULT_SOCKET ".\n"
    "Exit status: 0 done, 1 an error event or a lost connection, 2 usage.\n";

static void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void errorf(const char *fmt, ...)
{
    va_list ap;
    fputs("dgemma-client: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static int connect_to(const char *path, double wait_s)
{
    struct sockaddr_un a;
    int fd;
    double waited = 0;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) {
        errorf("socket path too long: %s", path);
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    for (;;) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        if (fd >= 0)
            close(fd);
        if (waited >= wait_s || (errno != ENOENT && errno != ECONNREFUSED))
            break;
        usleep(50000);
        waited += 0.05;
    }
    errorf("cannot connect to %s: %s (is dgemmad running?)", path, strerror(errno));
    return -1;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read standard input whole (the prompt when no argument is given). */
static char *read_stdin(void)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    while (b) {
        size_t got = fread(b + len, 1, cap - len - 1, stdin);
        len += got;
        if (got == 0)
            break;
        if (len + 1 == cap) {
            char *nb = cap >= LINE_MAX_BYTES ? NULL : realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
    }
    if (b)
        b[len] = '\0';
    return b;
}

struct reader {
    int fd;
    char *buf;
    size_t len, cap;
};

/* The next line (without its newline, NUL-terminated) into *line; 0 at
 * EOF, -1 on error. */
static int read_line(struct reader *r, char **line)
{
    for (;;) {
        char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
        ssize_t got;
        if (nl) {
            const size_t n = (size_t)(nl - r->buf);
            *line = malloc(n + 1);
            if (!*line)
                return -1;
            memcpy(*line, r->buf, n);
            (*line)[n] = '\0';
            memmove(r->buf, nl + 1, r->len - n - 1);
            r->len -= n + 1;
            return 1;
        }
        if (r->len == r->cap) {
            char *nb;
            if (r->cap >= LINE_MAX_BYTES)
                return -1;
            nb = realloc(r->buf, r->cap ? 2 * r->cap : 65536);
            if (!nb)
                return -1;
            r->buf = nb;
            r->cap = r->cap ? 2 * r->cap : 65536;
        }
        got = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -1;
        if (got == 0)
            return 0;
        r->len += (size_t)got;
    }
}

int main(int argc, char **argv)
{
    const char *sock = getenv("DGEMMA_SOCKET"), *settings = NULL, *tag = NULL;
    int chat = 0, json_out = 0, stream = 1, status_op = 0, first_arg = argc, rc = 1, fd;
    long long max_tokens = -1, seed = -1;
    double wait_s = 0;
    json_t *req;
    char *prompt = NULL, *text;
    struct reader rd = {0};

    if (!sock || !*sock)
        sock = DEFAULT_SOCKET;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--json")) {
            json_out = 1;
        } else if (!strcmp(a, "--no-stream")) {
            stream = 0;
        } else if (!strcmp(a, "--status")) {
            status_op = 1;
        } else if ((!strcmp(a, "-s") || !strcmp(a, "--socket")) && val) {
            sock = val;
            i++;
        } else if (!strcmp(a, "--settings") && val) {
            settings = val;
            i++;
        } else if (!strcmp(a, "--wait") && val) {
            char *end;
            wait_s = strtod(val, &end);
            if (end == val || *end || !(wait_s >= 0) || wait_s > 3600) {
                errorf("--wait: '%s' is not a number of seconds (0 .. 3600)", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--tag") && val) {
            tag = val;
            i++;
        } else if ((!strcmp(a, "--max-tokens") || !strcmp(a, "--seed")) && val) {
            char *end;
            long long x = strtoll(val, &end, 10);
            if (end == val || *end || x < 0) {
                errorf("%s: '%s' is not a non-negative integer", a, val);
                return 2;
            }
            if (a[2] == 'm')
                max_tokens = x;
            else
                seed = x;
            i++;
        } else if (!strcmp(a, "--")) {
            first_arg = i + 1;
            break;
        } else if (a[0] == '-' && a[1]) {
            errorf("unknown option '%s'", a);
            fputs(usage, stderr);
            return 2;
        } else {
            first_arg = i;
            break;
        }
    }

    if (status_op) {
        req = json_pack("{s:i,s:s}", "v", 1, "op", "status");
    } else {
        if (first_arg < argc) {
            size_t n = 1;
            for (int i = first_arg; i < argc; i++)
                n += strlen(argv[i]) + 1;
            prompt = calloc(1, n);
            for (int i = first_arg; prompt && i < argc; i++) {
                if (i > first_arg)
                    strcat(prompt, " ");
                strcat(prompt, argv[i]);
            }
        } else {
            prompt = read_stdin();
        }
        if (!prompt) {
            errorf("out of memory reading the prompt");
            return 1;
        }
        req = json_pack("{s:i,s:s,s:b}", "v", 1, "op", "generate", "stream", stream);
        if (req && chat)
            json_object_set_new(req, "messages",
                                json_pack("[{s:s,s:s}]", "role", "user", "content", prompt));
        else if (req)
            json_object_set_new(req, "prompt", json_string(prompt));
        if (req && !json_object_get(req, chat ? "messages" : "prompt")) {
            errorf("the prompt is not valid UTF-8");
            json_decref(req);
            free(prompt);
            return 2;
        }
        if (req && settings) {
            json_error_t je;
            json_t *s = json_loads(settings, JSON_REJECT_DUPLICATES, &je);
            if (!json_is_object(s)) {
                errorf("--settings: %s", s ? "must be a JSON object" : je.text);
                json_decref(s);
                json_decref(req);
                free(prompt);
                return 2;
            }
            json_object_update(req, s);
            json_decref(s);
        }
        if (req && max_tokens >= 0)
            json_object_set_new(req, "max_tokens", json_integer(max_tokens));
        if (req && seed >= 0)
            json_object_set_new(req, "seed", json_integer(seed));
    }
    if (req && tag)
        json_object_set_new(req, "tag", json_string(tag));
    free(prompt);
    text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!text) {
        errorf("out of memory");
        return 1;
    }
    if ((fd = connect_to(sock, wait_s)) < 0) {
        free(text);
        return 1;
    }
    if (send_all(fd, text, strlen(text)) < 0 || send_all(fd, "\n", 1) < 0) {
        errorf("%s: the connection failed while sending: %s", sock, strerror(errno));
        free(text);
        close(fd);
        return 1;
    }
    free(text);
    rd.fd = fd;
    for (;;) {
        char *line = NULL;
        json_t *ev;
        const char *kind;
        int r = read_line(&rd, &line);
        if (r <= 0) {
            errorf("%s: the daemon closed the connection before the request finished", sock);
            break;
        }
        if (json_out) {
            puts(line);
            fflush(stdout);
        }
        ev = json_loads(line, 0, NULL);
        free(line);
        kind = json_string_value(json_object_get(ev, "event"));
        if (!kind) {
            errorf("an event the client does not understand");
            json_decref(ev);
            break;
        }
        if (!strcmp(kind, "error")) {
            errorf("%s: %s", json_string_value(json_object_get(ev, "code")),
                   json_string_value(json_object_get(ev, "message")));
            json_decref(ev);
            break;
        }
        if (!strcmp(kind, "status")) {
            if (!json_out) {
                char *s = json_dumps(ev, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                if (s)
                    puts(s);
                free(s);
            }
            json_decref(ev);
            rc = 0;
            break;
        }
        if (!json_out && (!strcmp(kind, "canvas") || !strcmp(kind, "done"))) {
            const json_t *t = json_object_get(ev, "text");
            if (json_is_string(t)) {
                fwrite(json_string_value(t), 1, json_string_length(t), stdout);
                fflush(stdout);
            }
        }
        if (!strcmp(kind, "done")) {
            const char *fin = json_string_value(json_object_get(ev, "finish_reason"));
            const json_t *u = json_object_get(ev, "usage");
            if (!json_out) {
                putchar('\n');
                fflush(stdout);
                fprintf(stderr, "dgemma-client: request %lld: %s; %lld prompt + %lld tokens in "
                        "%lld canvases, %lld steps, %.1f tokens/s\n",
                        (long long)json_integer_value(json_object_get(ev, "id")), fin ? fin : "?",
                        (long long)json_integer_value(json_object_get(u, "prompt_tokens")),
                        (long long)json_integer_value(json_object_get(u, "completion_tokens")),
                        (long long)json_integer_value(json_object_get(ev, "canvases")),
                        (long long)json_integer_value(json_object_get(ev, "decoder_steps")),
                        json_number_value(json_object_get(ev, "tokens_per_s")));
            }
            rc = fin && strcmp(fin, "error") ? 0 : 1;
            json_decref(ev);
            break;
        }
        json_decref(ev);
    }
    free(rd.buf);
    close(fd);
    return rc;
}
