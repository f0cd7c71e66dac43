/*
 * daemon-config.c - dgemmad's option table, and the YAML reader and writer
 * it drives.
 *
 * Reading uses libyaml's event API with exactly one event held at a time
 * and no recursion: the shapes accepted are flat (a top-level mapping of
 * scalars and sequences of scalars), so the first event of any other shape
 * is an error and parsing stops there, however deep the input nests.
 * Values are applied to a copy of the caller's struct, which is written
 * back only when the whole input was accepted.
 */
#include "lib/daemon-config.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "lib/fileio.h"
#include "lib/utf8.h"

#define CONFIG_FILE_MAX (1u << 20)

enum opt_type { T_STRING, T_INT, T_LLONG, T_DOUBLE, T_BOOL, T_ENUM, T_OCTAL, T_INT_LIST };

static const char *const type_names[] = {
    [T_STRING] = "string",  [T_INT] = "integer",   [T_LLONG] = "integer",
    [T_DOUBLE] = "number",  [T_BOOL] = "boolean",  [T_ENUM] = "name",
    [T_OCTAL] = "octal mode", [T_INT_LIST] = "list of integers",
};

/* One option.  Integer bounds (min, max) serve T_INT, T_LLONG, T_OCTAL and
 * the elements of T_INT_LIST; zero_ok admits 0 besides [min, max]. */
struct opt {
    const char *name;
    enum opt_type type;
    size_t off;               /* offsetof the field in struct dg_config */
    size_t size;              /* T_STRING: buffer bytes; T_INT_LIST: capacity */
    size_t count_off;         /* T_INT_LIST: offsetof its int count */
    long long min, max;
    int zero_ok;
    int unique;               /* T_INT_LIST: an element given twice is an error */
    double dmin, dmax;        /* T_DOUBLE */
    const char *const *names; /* T_ENUM: the names of 0, 1, ...; NULL-terminated */
    const char *type_doc;     /* overrides type_names[type] in the documentation */
    const char *def;          /* the default, as YAML text */
    const char *help;
};

#define OFF(f) offsetof(struct dg_config, f)
#define SIZE(f) sizeof(((struct dg_config *)0)->f)
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const experts_names[] = {"across", "width", NULL};
static const char *const log_level_names[] = {"error", "warn", "info", "debug", NULL};

static const struct opt opts[] = {
    {.name = "model", .type = T_STRING, .off = OFF(model), .size = SIZE(model), .def = "",
     .help = "Checkpoint directory to serve (config.json, safetensors and tokenizer files). "
             "Empty: the embedded default model."},
    {.name = "backend", .type = T_ENUM, .off = OFF(backend), .names = backend_names,
     .type_doc = "auto, cpu or cuda", .def = "auto",
     .help = "Where the model runs: cuda on GPUs, cpu on the CPU backend; auto takes cuda "
             "when a usable GPU is present and cpu otherwise."},
    {.name = "devices", .type = T_INT_LIST, .off = OFF(devices), .size = DG_CONFIG_MAX_DEVICES,
     .count_off = OFF(n_devices), .min = 0, .max = 1023, .unique = 1, .def = "[]",
     .help = "GPU ordinals, as CUDA numbers them, the daemon may use. Empty: every visible GPU."},
    {.name = "tp", .type = T_INT, .off = OFF(tp), .min = 1, .max = 64, .def = "1",
     .help = "Tensor-parallel degree: the model is split over this many GPUs (rank threads on "
             "the CPU backend)."},
    {.name = "experts", .type = T_ENUM, .off = OFF(experts_width), .names = experts_names,
     .type_doc = "across or width", .def = "across",
     .help = "How the MoE experts are split over tensor-parallel ranks: across gives each rank "
             "whole experts, width gives each rank a slice of every expert's width."},
    {.name = "pin_workers", .type = T_BOOL, .off = OFF(pin_workers), .def = "true",
     .help = "Pin each rank's worker thread to one CPU (on GPUs: one near its GPU)."},
    {.name = "gpu_timeout", .type = T_DOUBLE, .off = OFF(gpu_timeout), .dmin = 0,
     .dmax = 86400, .def = "120",
     .help = "Seconds one step of the GPU workers may take before the watchdog aborts their "
             "NCCL group (a hung collective) and fails the step's requests. 0: no watchdog."},
    {.name = "group_timeout", .type = T_DOUBLE, .off = OFF(group_timeout), .dmin = 0,
     .dmax = 86400, .def = "300",
     .help = "Seconds the tensor-parallel ranks (tp above 1 on GPUs) may take at start-up to "
             "form their NCCL group; past it the daemon logs why and exits 1 (in multi-process "
             "mode: a rank not started, or NCCL_COMM_ID naming the wrong host). 0: wait for "
             "good."},
    {.name = "cuda_graphs", .type = T_BOOL, .off = OFF(cuda_graphs), .def = "true",
     .help = "Capture the GPU backend's denoising and commit steps in CUDA graphs and replay "
             "them (false: launch every kernel, for debugging; the results are the same)."},
    {.name = "one_gpu", .type = T_BOOL, .off = OFF(one_gpu), .def = "false",
     .help = "Put every tensor-parallel rank on one GPU (the first of devices, else GPU 0), "
             "their collectives made through host memory instead of NCCL and every step "
             "launched without CUDA graphs: to try a tp on a machine with fewer GPUs (slower "
             "than tp 1). At most 8 ranks; not with --rank."},
    {.name = "max_batch", .type = T_INT, .off = OFF(max_batch), .min = 1, .max = 1024, .def = "8",
     .help = "Most requests generating at once; further requests wait in the queue."},
    {.name = "max_canvas_length", .type = T_INT, .off = OFF(max_canvas_length), .min = 0,
     .max = 4096, .def = "0",
     .help = "Largest canvas_length a request may ask for. 0: the model's canvas_length."},
    {.name = "max_denoising_steps", .type = T_INT, .off = OFF(max_denoising_steps), .min = 1,
     .max = 65535, .def = "256",
     .help = "Largest max_denoising_steps a request may ask for."},
    {.name = "max_tokens", .type = T_LLONG, .off = OFF(max_tokens), .min = 1, .max = 16777216,
     .def = "8192", .help = "Largest max_tokens a request may ask for."},
    {.name = "max_context", .type = T_LLONG, .off = OFF(max_context), .min = 2, .max = 16777216,
     .zero_ok = 1, .def = "0",
     .help = "Most positions one request may hold: its prompt and its max_tokens rounded up to "
             "whole canvases. 0: the model's max_position_embeddings (also the most it takes)."},
    {.name = "default_max_tokens", .type = T_INT, .off = OFF(default_max_tokens), .min = 0,
     .max = 16777216, .def = "0",
     .help = "max_tokens of a request that gives none. 0: the checkpoint's max_new_tokens."},
    {.name = "parse_special", .type = T_BOOL, .off = OFF(parse_special), .def = "true",
     .help = "parse_special of a request that gives none: whether text in a prompt or a "
             "message that spells an added token (a turn marker, <mask>) is that token. "
             "false: plain text, for clients that pass on text they do not trust."},
    {.name = "prefill_chunk", .type = T_INT, .off = OFF(prefill_chunk), .min = 1, .max = 65536,
     .def = "512",
     .help = "Prompt tokens per encoder pass; a longer prompt is encoded in chunks between the "
             "other requests' steps."},
    {.name = "queue_max", .type = T_INT, .off = OFF(queue_max), .min = 0, .max = 100000,
     .def = "64",
     .help = "Requests that may wait for a free slot; beyond them a request is refused as busy. "
             "0: no queue."},
    {.name = "max_connections", .type = T_INT, .off = OFF(max_connections), .min = 1,
     .max = 65536, .def = "256", .help = "Client connections open at once; more are refused."},
    {.name = "max_line_bytes", .type = T_LLONG, .off = OFF(max_line_bytes), .min = 1024,
     .max = 268435456, .def = "1048576",
     .help = "Longest request line in bytes; a longer one gets a too_large error and the rest of "
             "it is skipped (the connection stays usable)."},
    {.name = "max_output_bytes", .type = T_LLONG, .off = OFF(max_output_bytes), .min = 65536,
     .max = 4294967296LL, .def = "67108864",
     .help = "Unsent output bytes a connection may hold; a client that lets more pile up is "
             "dropped."},
    {.name = "send_buffer_bytes", .type = T_INT, .off = OFF(send_buffer_bytes), .min = 4096,
     .max = 67108864, .zero_ok = 1, .def = "0",
     .help = "The kernel's send buffer of each client socket (SO_SNDBUF), which takes a "
             "connection's output before max_output_bytes counts any. Linux doubles it and holds "
             "it to twice net.core.wmem_max. 0: the system's (net.core.wmem_default)."},
    {.name = "socket", .type = T_STRING, .off = OFF(socket), .size = SIZE(socket),
     .def = "/run/dgemma/dgemmad.sock",
     .help = "Path of the Unix socket clients connect to (a socket address holds 107 bytes)."},
    {.name = "socket_mode", .type = T_OCTAL, .off = OFF(socket_mode), .min = 0, .max = 0777,
     .def = "0660", .help = "Permissions of the socket, in octal (0660, 0o660 or 660)."},
    {.name = "socket_group", .type = T_STRING, .off = OFF(socket_group),
     .size = SIZE(socket_group), .def = "",
     .help = "Group (name or number) the socket is given. Empty: the group it was created with."},
    {.name = "socket_owner", .type = T_STRING, .off = OFF(socket_owner),
     .size = SIZE(socket_owner), .def = "",
     .help = "Owner (user name or number) the socket is given; changing it needs root. Empty: "
             "the user dgemmad runs as."},
    {.name = "allow_uids", .type = T_INT_LIST, .off = OFF(allow_uids),
     .size = DG_CONFIG_MAX_PEERS, .count_off = OFF(n_allow_uids), .min = 0, .max = 2147483647,
     .def = "[]",
     .help = "User ids whose clients may connect, checked with SO_PEERCRED besides the socket's "
             "permissions (the daemon's own uid always may). Empty, with allow_gids empty: any "
             "client the permissions let in."},
    {.name = "allow_gids", .type = T_INT_LIST, .off = OFF(allow_gids),
     .size = DG_CONFIG_MAX_PEERS, .count_off = OFF(n_allow_gids), .min = 0, .max = 2147483647,
     .def = "[]",
     .help = "Group ids whose members' clients may connect (the client's group or one of its "
             "supplementary groups)."},
    {.name = "client_max_requests", .type = T_INT, .off = OFF(client_max_requests), .min = 1,
     .max = 100000, .def = "64",
     .help = "Requests one connection may have in flight (queued or generating, ring jobs "
             "included); past it a request is refused as busy and ring jobs wait in the ring."},
    {.name = "user", .type = T_STRING, .off = OFF(user), .size = SIZE(user), .def = "",
     .help = "User (name or number) dgemmad switches to, with its group and supplementary "
             "groups, before it opens any file, when started as root. Empty: stay as started."},
    {.name = "allow_root", .type = T_BOOL, .off = OFF(allow_root), .def = "false",
     .help = "Let dgemmad serve as root. Off: started as root with no user to switch to, it "
             "refuses to start."},
    {.name = "shm_max_entries", .type = T_INT, .off = OFF(shm_max_entries), .min = 0,
     .max = 65536, .def = "1024",
     .help = "Most submission (and completion) entries of a client's shared-memory ring "
             "(rounded down to a power of two). 0: no rings (shm_attach is refused)."},
    {.name = "shm_max_arena_mb", .type = T_INT, .off = OFF(shm_max_arena_mb), .min = 1,
     .max = 1024, .def = "16",
     .help = "Largest prompt arena and largest result arena of a shared-memory ring, in MiB "
             "each."},
    {.name = "shm_user_max_mb", .type = T_INT, .off = OFF(shm_user_max_mb), .min = 0,
     .max = 1048576, .def = "256",
     .help = "MiB of shared-memory rings the connections of one uid may hold at once (each "
             "ring's whole mapping); an shm_attach past it is refused as busy, or as too_large "
             "where the ring alone is larger. 0: no limit."},
    {.name = "metrics", .type = T_STRING, .off = OFF(metrics), .size = SIZE(metrics), .def = "",
     .help = "SQLite file the per-request metrics are written to. Empty: no metrics."},
    {.name = "metrics_queue", .type = T_INT, .off = OFF(metrics_queue), .min = 1,
     .max = 1000000, .def = "4096",
     .help = "Records (requests and events) that may wait for the metrics writer; beyond them "
             "records are dropped and counted, never waited for."},
    {.name = "metrics_flush", .type = T_DOUBLE, .off = OFF(metrics_flush), .dmin = 0.01,
     .dmax = 60, .def = "1",
     .help = "Seconds a metrics record may wait before the transaction that writes it."},
    {.name = "metrics_retention_days", .type = T_DOUBLE, .off = OFF(metrics_retention_days),
     .dmin = 0, .dmax = 36500, .def = "90",
     .help = "Days metrics rows are kept. 0: no age limit."},
    {.name = "metrics_max_mb", .type = T_LLONG, .off = OFF(metrics_max_mb), .min = 0,
     .max = 1048576, .def = "1024",
     .help = "Size in MiB the metrics rows may take; past it the oldest rows go. 0: no limit."},
    {.name = "log_level", .type = T_ENUM, .off = OFF(log_level), .names = log_level_names,
     .type_doc = "error, warn, info or debug", .def = "info",
     .help = "Least severe messages logged."},
    {.name = "log_file", .type = T_STRING, .off = OFF(log_file), .size = SIZE(log_file),
     .def = "", .help = "File the log is appended to. Empty: standard error."},
    {.name = "shutdown_grace", .type = T_DOUBLE, .off = OFF(shutdown_grace), .dmin = 0,
     .dmax = 3600, .def = "30",
     .help = "Seconds the requests in flight at SIGTERM may take to finish before they are "
             "cancelled."},
    {.name = "tick", .type = T_DOUBLE, .off = OFF(tick), .dmin = 0.01, .dmax = 60, .def = "1",
     .help = "Period in seconds of the housekeeping timer (shared-memory rings that were not "
             "rung, accept retries, refused connections)."},
};

#define N_OPTS ((int)NELEM(opts))

/* ---- reading context and messages ---------------------------------------- */

struct ctx {
    yaml_parser_t parser;
    yaml_event_t ev;   /* the current event, owned while have_ev */
    int have_ev;
    const char *what;
    int positions;     /* messages carry what:line:column */
    struct dg_error *err;
};

static void ctx_init(struct ctx *x, const char *what, int positions, struct dg_error *err)
{
    memset(x, 0, sizeof *x);
    x->what = what ? what : "config";
    x->positions = positions;
    x->err = err;
}

/* Record a DG_E_CONFIG error at mark m ("what:line:col: ..." or "what: ..."). */
__attribute__((format(printf, 3, 4)))
static int fail(struct ctx *x, yaml_mark_t m, const char *fmt, ...)
{
    char body[DG_ERROR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (x->positions)
        return dg_error_set(x->err, DG_E_CONFIG, "%s:%zu:%zu: %s", x->what, m.line + 1,
                            m.column + 1, body);
    return dg_error_set(x->err, DG_E_CONFIG, "%s: %s", x->what, body);
}

/* s[0..len) made fit to quote in a message, in buf (at least 80 bytes):
 * at most 60 bytes, cut at a character boundary with "..." appended,
 * control characters shown as '?'. */
static const char *show(char *buf, const char *s, size_t len)
{
    size_t n = len > 60 ? 60 : len;

    if (n < len)
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[i] = ch < 0x20 || ch == 0x7F ? '?' : (char)ch;
    }
    strcpy(buf + n, n < len ? "..." : "");
    return buf;
}

static const char *event_kind(const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_SCALAR_EVENT: return "a scalar";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    default: return "something else";
    }
}

/* The libyaml error held by the parser, as a dg_error. */
static int syntax_error(struct ctx *x)
{
    const yaml_parser_t *p = &x->parser;
    const char *problem = p->problem ? p->problem : "malformed input";
    char context[160] = "";

    if (p->error == YAML_MEMORY_ERROR)
        return dg_error_set(x->err, DG_E_NOMEM, "%s: out of memory reading YAML", x->what);
    if (p->error == YAML_READER_ERROR)
        return dg_error_set(x->err, DG_E_CONFIG, "%s: byte %zu: YAML: %s", x->what,
                            p->problem_offset, problem);
    if (p->context)
        snprintf(context, sizeof context, " (%s at line %zu)", p->context,
                 p->context_mark.line + 1);
    return fail(x, p->problem_mark, "YAML syntax error: %s%s", problem, context);
}

/* Advance to the next event, releasing the current one.  Aliases, anchors
 * and tags are refused here, so no caller sees them. */
static int next(struct ctx *x)
{
    const yaml_char_t *anchor = NULL, *tag = NULL;
    char shown[80];

    if (x->have_ev) {
        yaml_event_delete(&x->ev);
        x->have_ev = 0;
    }
    if (!yaml_parser_parse(&x->parser, &x->ev))
        return syntax_error(x);
    x->have_ev = 1;
    switch (x->ev.type) {
    case YAML_ALIAS_EVENT:
        anchor = x->ev.data.alias.anchor;
        return fail(x, x->ev.start_mark, "aliases (*%s) are not accepted",
                    show(shown, (const char *)anchor, strlen((const char *)anchor)));
    case YAML_SCALAR_EVENT:
        anchor = x->ev.data.scalar.anchor;
        tag = x->ev.data.scalar.tag;
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = x->ev.data.sequence_start.anchor;
        tag = x->ev.data.sequence_start.tag;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = x->ev.data.mapping_start.anchor;
        tag = x->ev.data.mapping_start.tag;
        break;
    default:
        break;
    }
    if (anchor)
        return fail(x, x->ev.start_mark, "anchors (&%s) are not accepted",
                    show(shown, (const char *)anchor, strlen((const char *)anchor)));
    if (tag) {
        const char *t = (const char *)tag, *std = "tag:yaml.org,2002:";
        int is_std = !strncmp(t, std, strlen(std));
        if (is_std)
            t += strlen(std);
        return fail(x, x->ev.start_mark, "tags (%s%s) are not accepted", is_std ? "!!" : "",
                    show(shown, t, strlen(t)));
    }
    return 0;
}

/* ---- options and scalars ---------------------------------------------------- */

static int find_option(const char *key, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].name) == len && !memcmp(opts[i].name, key, len))
            return i;
    return -1;
}

/* Levenshtein distance between a[0..na) and b, ignoring ASCII case; a large
 * number for keys too long to be a typo of an option. */
static size_t edit_distance(const char *a, size_t na, const char *b)
{
    size_t nb = strlen(b), row[65];

    if (na > 64 || nb > 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* "unknown key 'max_bach' (did you mean 'max_batch'?)": the suggestion is
 * the closest option within a third of its length (at least 1 edit). */
static int unknown_key(struct ctx *x, yaml_mark_t m, const char *key, size_t len)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    char shown[80];

    for (int i = 0; i < N_OPTS; i++) {
        size_t d = edit_distance(key, len, opts[i].name);
        size_t limit = strlen(opts[i].name) / 3;
        if (d <= (limit ? limit : 1) && d < best_d) {
            best = opts[i].name;
            best_d = d;
        }
    }
    if (best)
        return fail(x, m, "unknown key '%s' (did you mean '%s'?)", show(shown, key, len), best);
    return fail(x, m, "unknown key '%s'", show(shown, key, len));
}

/* What option o accepts, for "expected ..." messages. */
static const char *expected(const struct opt *o, char *buf, size_t cap)
{
    switch (o->type) {
    case T_STRING:
        snprintf(buf, cap, "a string of at most %zu bytes", o->size - 1);
        break;
    case T_INT:
    case T_LLONG:
        snprintf(buf, cap, "%san integer in [%lld, %lld]", o->zero_ok ? "0 or " : "", o->min,
                 o->max);
        break;
    case T_DOUBLE:
        snprintf(buf, cap, "a number in [%g, %g]", o->dmin, o->dmax);
        break;
    case T_BOOL:
        snprintf(buf, cap, "a boolean (true/false, yes/no, on/off)");
        break;
    case T_ENUM: {
        size_t n = (size_t)snprintf(buf, cap, "one of");
        for (int i = 0; o->names[i] && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s %s", i ? "," : "", o->names[i]);
        break;
    }
    case T_OCTAL:
        snprintf(buf, cap, "an octal mode in [0, 0%llo]", (unsigned long long)o->max);
        break;
    case T_INT_LIST:
        snprintf(buf, cap, "a list of at most %zu integers in [%lld, %lld]", o->size, o->min,
                 o->max);
        break;
    }
    return buf;
}

/* "max_batch: expected an integer in [1, 1024], got '0'" */
static int bad_value(struct ctx *x, const struct opt *o, yaml_mark_t m, const char *how,
                     const char *s, size_t len)
{
    char want[160], shown[80];
    return fail(x, m, "%s: expected %s, got %s'%s'", o->name, expected(o, want, sizeof want), how,
                show(shown, s, len));
}

/* A decimal integer: optional sign, then 1 to 18 digits. */
static int parse_ll(const char *s, size_t len, long long *out)
{
    size_t i = 0;
    long long v = 0;
    int neg = 0;

    if (len > 0 && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == len || len - i > 18)
        return -1;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

/* An octal mode: "0660", "0o660" or "660", up to 8 digits, all octal. */
static int parse_octal(const char *s, size_t len, long long *out)
{
    long long v = 0;

    if (len > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O')) {
        s += 2;
        len -= 2;
    }
    if (len == 0 || len > 8)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '7')
            return -1;
        v = v * 8 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* A finite decimal number ("30", "0.5", "1e-3", ".5"); no hex, inf or nan. */
static int parse_double(const char *s, size_t len, double *out)
{
    char buf[64], *end;
    double v;

    if (len == 0 || len >= sizeof buf || strspn(s, "0123456789+-.eE") < len)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    v = strtod(buf, &end);
    if (end != buf + len || !isfinite(v))
        return -1;
    *out = v == 0 ? 0.0 : v; /* no -0 */
    return 0;
}

static int parse_bool(const char *s, size_t len, int *out)
{
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};

    for (size_t i = 0; i < NELEM(yes); i++) {
        if (strlen(yes[i]) == len && !strncasecmp(s, yes[i], len)) {
            *out = 1;
            return 0;
        }
        if (strlen(no[i]) == len && !strncasecmp(s, no[i], len)) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

static int is_null(const char *s, size_t len, int plain)
{
    return plain && (len == 0 || (len == 1 && s[0] == '~') ||
                     (len == 4 && (!memcmp(s, "null", 4) || !memcmp(s, "Null", 4) ||
                                   !memcmp(s, "NULL", 4))));
}

/* Apply one scalar s[0..len) (plain: unquoted in the YAML) at mark m to
 * option o of c.  Strings take the scalar's text as written (a plain null
 * is ""); enums take plain or quoted names; numbers, booleans and modes
 * must be plain.  c is changed only on success. */
static int apply_scalar(struct ctx *x, const struct opt *o, const char *s, size_t len, int plain,
                        yaml_mark_t m, struct dg_config *c)
{
    char *field = (char *)c + o->off;
    char want[160], shown[80];
    long long v = 0;
    double d = 0;
    int b = 0;

    if (o->type == T_STRING) {
        if (is_null(s, len, plain))
            len = 0;
        if (memchr(s, '\0', len))
            return fail(x, m, "%s: the string contains a NUL byte", o->name);
        if (len >= o->size)
            return fail(x, m, "%s: expected %s, got %zu bytes", o->name,
                        expected(o, want, sizeof want), len);
        memset(field, 0, o->size);
        memcpy(field, s, len);
        return 0;
    }
    if (o->type == T_INT_LIST)
        return fail(x, m, "%s: expected %s, got the scalar '%s'", o->name,
                    expected(o, want, sizeof want), show(shown, s, len));
    if (o->type == T_ENUM) {
        for (int i = 0; o->names[i]; i++)
            if (strlen(o->names[i]) == len && !memcmp(o->names[i], s, len)) {
                *(int *)(void *)field = i;
                return 0;
            }
        return bad_value(x, o, m, "", s, len);
    }
    if (!plain)
        return bad_value(x, o, m, "the quoted string ", s, len);
    switch (o->type) {
    case T_INT:
    case T_LLONG:
        if (parse_ll(s, len, &v) || ((v < o->min || v > o->max) && !(o->zero_ok && v == 0)))
            return bad_value(x, o, m, "", s, len);
        if (o->type == T_INT)
            *(int *)(void *)field = (int)v;
        else
            *(long long *)(void *)field = v;
        return 0;
    case T_OCTAL:
        if (parse_octal(s, len, &v) || v < o->min || v > o->max)
            return bad_value(x, o, m, "", s, len);
        *(int *)(void *)field = (int)v;
        return 0;
    case T_DOUBLE:
        if (parse_double(s, len, &d) || d < o->dmin || d > o->dmax)
            return bad_value(x, o, m, "", s, len);
        *(double *)(void *)field = d;
        return 0;
    case T_BOOL:
        if (parse_bool(s, len, &b))
            return bad_value(x, o, m, "", s, len);
        *(int *)(void *)field = b;
        return 0;
    default:
        return dg_error_set(x->err, DG_E_INTERNAL, "%s: %s: bad option type", x->what, o->name);
    }
}

/* The current event opened a sequence for list option o: read its scalar
 * elements up to the closing event, check each (and, where o is unique,
 * that none repeats an earlier one), then store them in c. */
static int apply_list(struct ctx *x, const struct opt *o, struct dg_config *c)
{
    int vals[DG_CONFIG_MAX_DEVICES];
    size_t cap = o->size < NELEM(vals) ? o->size : NELEM(vals), n = 0;
    char want[64], shown[80];
    int rc;

    snprintf(want, sizeof want, "an integer in [%lld, %lld]", o->min, o->max);
    for (;;) {
        const yaml_event_t *ev;
        const char *s;
        size_t len;
        long long v;

        if ((rc = next(x)) != 0)
            return rc;
        ev = &x->ev;
        if (ev->type == YAML_SEQUENCE_END_EVENT)
            break;
        if (ev->type != YAML_SCALAR_EVENT)
            return fail(x, ev->start_mark, "%s[%zu]: expected %s, got %s", o->name, n, want,
                        event_kind(ev));
        if (n == cap)
            return fail(x, ev->start_mark, "%s: more than %zu entries", o->name, cap);
        s = (const char *)ev->data.scalar.value;
        len = ev->data.scalar.length;
        if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || parse_ll(s, len, &v) ||
            v < o->min || v > o->max)
            return fail(x, ev->start_mark, "%s[%zu]: expected %s, got %s'%s'", o->name, n, want,
                        ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ? "the quoted string "
                                                                          : "",
                        show(shown, s, len));
        for (size_t j = 0; o->unique && j < n; j++)
            if (vals[j] == (int)v)
                return fail(x, ev->start_mark, "%s[%zu]: %lld is listed twice (first as %s[%zu])",
                            o->name, n, v, o->name, j);
        vals[n++] = (int)v;
    }
    memset((char *)c + o->off, 0, o->size * sizeof(int));
    memcpy((char *)c + o->off, vals, n * sizeof(int));
    *(int *)(void *)((char *)c + o->count_off) = (int)n;
    return 0;
}

/* The current event starts the value of option o: apply it to c. */
static int apply_value(struct ctx *x, const struct opt *o, struct dg_config *c)
{
    const yaml_event_t *ev = &x->ev;
    char want[160];

    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        return apply_scalar(x, o, (const char *)ev->data.scalar.value, ev->data.scalar.length,
                            ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, ev->start_mark, c);
    case YAML_SEQUENCE_START_EVENT:
        if (o->type == T_INT_LIST)
            return apply_list(x, o, c);
        /* fall through */
    default:
        return fail(x, ev->start_mark, "%s: expected %s, got %s", o->name,
                    expected(o, want, sizeof want), event_kind(ev));
    }
}

/* The current event opened the top-level mapping: apply each key's value
 * to c, up to the mapping's end. */
static int load_mapping(struct ctx *x, struct dg_config *c)
{
    size_t first_line[NELEM(opts)] = {0};
    int rc;

    for (;;) {
        yaml_mark_t m;
        int i;

        if ((rc = next(x)) != 0)
            return rc;
        if (x->ev.type == YAML_MAPPING_END_EVENT)
            return 0;
        m = x->ev.start_mark;
        if (x->ev.type != YAML_SCALAR_EVENT)
            return fail(x, m, "expected a key, got %s", event_kind(&x->ev));
        i = find_option((const char *)x->ev.data.scalar.value, x->ev.data.scalar.length);
        if (i < 0)
            return unknown_key(x, m, (const char *)x->ev.data.scalar.value,
                               x->ev.data.scalar.length);
        if (first_line[i])
            return fail(x, m, "%s: given twice (first at line %zu)", opts[i].name, first_line[i]);
        first_line[i] = m.line + 1;
        if ((rc = next(x)) != 0 || (rc = apply_value(x, &opts[i], c)) != 0)
            return rc;
    }
}

/* After a document's node: its end, then the stream's end. */
static int expect_end(struct ctx *x)
{
    int rc;

    if ((rc = next(x)) != 0)
        return rc;
    if (x->ev.type != YAML_DOCUMENT_END_EVENT)
        return fail(x, x->ev.start_mark, "expected the end of the document");
    if ((rc = next(x)) != 0)
        return rc;
    if (x->ev.type != YAML_STREAM_END_EVENT)
        return fail(x, x->ev.start_mark, "a second document (only one is read)");
    return 0;
}

/* Read x's input: a document that is a mapping of options (o NULL), or
 * one value for option o (an empty input is ""). */
static int parse_text(struct ctx *x, const struct opt *o, struct dg_config *c)
{
    int rc;

    if ((rc = next(x)) != 0) /* STREAM-START */
        return rc;
    if ((rc = next(x)) != 0)
        return rc;
    if (x->ev.type == YAML_STREAM_END_EVENT) /* no document: nothing, or comments */
        return o ? apply_scalar(x, o, "", 0, 1, x->ev.start_mark, c) : 0;
    if ((rc = next(x)) != 0) /* the document's node */
        return rc;
    if (o)
        rc = apply_value(x, o, c);
    else if (x->ev.type == YAML_MAPPING_START_EVENT)
        rc = load_mapping(x, c);
    else if (!(x->ev.type == YAML_SCALAR_EVENT &&
               is_null((const char *)x->ev.data.scalar.value, x->ev.data.scalar.length,
                       x->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE)))
        rc = fail(x, x->ev.start_mark,
                  "expected a mapping of key: value at the top level, got %s",
                  event_kind(&x->ev));
    return rc ? rc : expect_end(x);
}

/* Run parse_text on a fresh parser over text, releasing everything after. */
static int parse_with_parser(struct ctx *x, const struct opt *o, const char *text, size_t len,
                             struct dg_config *c)
{
    int rc;

    if (!yaml_parser_initialize(&x->parser))
        return dg_error_set(x->err, DG_E_NOMEM, "%s: out of memory starting the YAML parser",
                            x->what);
    yaml_parser_set_encoding(&x->parser, YAML_UTF8_ENCODING);
    yaml_parser_set_input_string(&x->parser, (const unsigned char *)(text ? text : ""),
                                 text ? len : 0);
    rc = parse_text(x, o, c);
    if (x->have_ev)
        yaml_event_delete(&x->ev);
    x->have_ev = 0;
    yaml_parser_delete(&x->parser);
    return rc;
}

/* ---- the public functions --------------------------------------------------- */

void dg_config_defaults(struct dg_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        struct ctx x;
        yaml_mark_t m = {0, 0, 0};

        ctx_init(&x, "default", 0, NULL);
        /* Scalars take the path every file scalar takes; a list needs the
         * parser (if it runs out of memory the list stays empty, which is
         * the only list default). */
        if (o->type == T_INT_LIST)
            parse_with_parser(&x, o, o->def, strlen(o->def), c);
        else
            apply_scalar(&x, o, o->def, strlen(o->def), 1, m, c);
    }
}

int dg_config_load_text(struct dg_config *c, const char *text, size_t len, const char *what,
                        struct dg_error *err)
{
    struct dg_config tmp;
    struct ctx x;
    int rc;

    memcpy(&tmp, c, sizeof tmp);
    ctx_init(&x, what, 1, err);
    rc = parse_with_parser(&x, NULL, text, len, &tmp);
    if (rc == 0)
        memcpy(c, &tmp, sizeof tmp);
    return rc;
}

int dg_config_load_file(struct dg_config *c, const char *path, struct dg_error *err)
{
    char *buf;
    size_t len;
    int rc = dg_file_read(path, CONFIG_FILE_MAX, &buf, &len, err);

    if (rc == -DG_E_NOMEM)
        return rc;
    if (rc != 0) { /* missing, unreadable or too large: all "cannot read it" */
        char msg[DG_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : path);
        return dg_error_set(err, DG_E_IO, "%s", msg);
    }
    rc = dg_config_load_text(c, buf, len, path, err);
    free(buf);
    return rc;
}

int dg_config_set(struct dg_config *c, const char *assignment, const char *what,
                  struct dg_error *err)
{
    const char *eq = strchr(assignment, '=');
    struct dg_config tmp;
    struct ctx x;
    int i, rc;

    ctx_init(&x, what ? what : assignment, 0, err);
    if (!eq)
        return dg_error_set(err, DG_E_CONFIG, "%s: expected key=value", x.what);
    i = find_option(assignment, (size_t)(eq - assignment));
    if (i < 0) {
        yaml_mark_t m = {0, 0, 0};
        return unknown_key(&x, m, assignment, (size_t)(eq - assignment));
    }
    memcpy(&tmp, c, sizeof tmp);
    rc = parse_with_parser(&x, &opts[i], eq + 1, strlen(eq + 1), &tmp);
    if (rc == 0)
        memcpy(c, &tmp, sizeof tmp);
    return rc;
}

int dg_config_validate(const struct dg_config *c, struct dg_error *err)
{
    if (c->tp < 1 || c->tp > 64)
        return dg_error_set(err, DG_E_CONFIG, "tp: %d is outside [1, 64]", c->tp);
    if (c->n_devices < 0 || c->n_devices > DG_CONFIG_MAX_DEVICES)
        return dg_error_set(err, DG_E_CONFIG, "devices: %d entries, expected 0 to %d",
                            c->n_devices, DG_CONFIG_MAX_DEVICES);
    if (c->one_gpu && c->tp > DG_CONFIG_ONE_GPU_MAX_TP)
        return dg_error_set(err, DG_E_CONFIG, "one_gpu: tp %d; one GPU takes at most %d ranks",
                            c->tp, DG_CONFIG_ONE_GPU_MAX_TP);
    for (int i = 1; i < c->n_devices; i++)
        for (int j = 0; j < i; j++)
            if (c->devices[i] == c->devices[j])
                return dg_error_set(err, DG_E_CONFIG,
                                    "devices: GPU %d is listed twice (entries %d and %d)",
                                    c->devices[i], j, i);
    return 0;
}

/* ---- writing ---------------------------------------------------------------- */

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        char *p;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (!(p = realloc(b->p, cap))) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

__attribute__((format(printf, 2, 3)))
static void putf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A string plain YAML reads back as itself: [A-Za-z0-9_./-] only, not
 * empty, not starting with '-' (a sequence entry), not a null spelling. */
static int plain_ok(const char *s, size_t len)
{
    if (len == 0 || s[0] == '-' || is_null(s, len, 1))
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '.' || s[i] == '/' ||
              s[i] == '-'))
            return 0;
    return 1;
}

/* s[0..len) as a YAML double-quoted scalar.  ASCII controls and the C1
 * range are escaped as \xHH, characters YAML treats as line breaks or
 * that its reader refuses as \uXXXX; other UTF-8 is copied.  A byte that
 * is not valid UTF-8 cannot be written as YAML and becomes \xHH (the
 * character of that number), so it does not read back the same. */
static void put_quoted(struct sbuf *b, const char *s, size_t len)
{
    put(b, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)s[i];
        uint32_t cp;
        size_t n;

        if (ch < 0x80) {
            if (ch == '"' || ch == '\\')
                putf(b, "\\%c", ch);
            else if (ch == '\n')
                put(b, "\\n", 2);
            else if (ch == '\t')
                put(b, "\\t", 2);
            else if (ch < 0x20 || ch == 0x7F)
                putf(b, "\\x%02X", ch);
            else
                put(b, s + i, 1);
            i++;
        } else if (!(n = dg_utf8_decode((const unsigned char *)s + i, len - i, &cp))) {
            putf(b, "\\x%02X", ch);
            i++;
        } else {
            if (cp < 0xA0)
                putf(b, "\\x%02X", (unsigned)cp);
            else if (cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF || cp == 0xFFFE || cp == 0xFFFF)
                putf(b, "\\u%04X", (unsigned)cp);
            else
                put(b, s + i, n);
            i += n;
        }
    }
    put(b, "\"", 1);
}

/* A double in the shortest %g form that strtod reads back exactly (without
 * an exponent for magnitudes from 1e-4 to 1e15), with ".0" added where it
 * would otherwise look like an integer. */
static void put_double(struct sbuf *b, double v)
{
    int plain_range = fabs(v) >= 1e-4 && fabs(v) < 1e15;
    char tmp[40];

    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v && !(plain_range && strchr(tmp, 'e')))
            break;
    }
    if (!strpbrk(tmp, ".eEni"))
        strcat(tmp, ".0");
    put(b, tmp, strlen(tmp));
}

static void put_value(struct sbuf *b, const struct opt *o, const struct dg_config *c)
{
    const char *field = (const char *)c + o->off;
    int iv = 0;

    if (o->type != T_STRING && o->type != T_LLONG && o->type != T_DOUBLE)
        iv = *(const int *)(const void *)field;
    switch (o->type) {
    case T_STRING: {
        size_t len = strnlen(field, o->size);
        if (plain_ok(field, len))
            put(b, field, len);
        else
            put_quoted(b, field, len);
        break;
    }
    case T_INT:
        putf(b, "%d", iv);
        break;
    case T_LLONG:
        putf(b, "%lld", *(const long long *)(const void *)field);
        break;
    case T_DOUBLE:
        put_double(b, *(const double *)(const void *)field);
        break;
    case T_BOOL:
        putf(b, "%s", iv ? "true" : "false");
        break;
    case T_ENUM: {
        int n = 0;
        while (o->names[n])
            n++;
        if (iv >= 0 && iv < n)
            putf(b, "%s", o->names[iv]);
        else
            putf(b, "%d", iv); /* not a name: reading it back fails, as it should */
        break;
    }
    case T_OCTAL:
        putf(b, "0%03o", (unsigned)iv);
        break;
    case T_INT_LIST: {
        int n = *(const int *)(const void *)((const char *)c + o->count_off);
        if (n < 0)
            n = 0;
        if ((size_t)n > o->size)
            n = (int)o->size;
        put(b, "[", 1);
        for (int i = 0; i < n; i++)
            putf(b, "%s%d", i ? ", " : "", ((const int *)(const void *)field)[i]);
        put(b, "]", 1);
        break;
    }
    }
}

char *dg_config_to_yaml(const struct dg_config *c)
{
    struct sbuf b = {0};

    for (int i = 0; i < N_OPTS; i++) {
        put(&b, opts[i].name, strlen(opts[i].name));
        put(&b, ": ", 2);
        put_value(&b, &opts[i], c);
        put(&b, "\n", 1);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

int dg_config_n_options(void)
{
    return N_OPTS;
}

void dg_config_option_doc(int i, const char **name, const char **type, const char **def,
                          const char **help)
{
    const struct opt *o = i >= 0 && i < N_OPTS ? &opts[i] : NULL;

    if (name)
        *name = o ? o->name : NULL;
    if (type)
        *type = o ? (o->type_doc ? o->type_doc : type_names[o->type]) : NULL;
    if (def)
        *def = o ? o->def : NULL;
    if (help)
        *help = o ? o->help : NULL;
}
