/* cmd-status.c - `dgemma-client status` and `dgemma-client cancel`. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client.h"
#include "lib/json-util.h"

static const char status_usage[] =
    "usage: dgemma-client status [-s|--socket SOCKET] [--wait SECONDS] [--json]\n"
    "The daemon's model, backend, limits, queue, running requests, counters\n"
    "and uptime; --json writes the status event as it comes.\n";

static const char cancel_usage[] =
    "usage: dgemma-client cancel [-s|--socket SOCKET] [--wait SECONDS] [--json] ID...\n"
    "Cancel requests by id (yours, or any as root).  Exit status 1 if one of\n"
    "them is not in flight.\n";

/* The next event: 0, or libdgemma's error after saying why. */
static int wait_event(dgemma_t *c, dgemma_event_t *ev)
{
    int e = dgemma_next_event(c, ev, 60000);
    if (e < 0)
        client_errorf("%s", e == DGEMMA_E_AGAIN ? "no answer from the daemon in 60 s"
                                                : dgemma_errmsg(c));
    return e;
}

/* How a status field reads in the table: a string as it is where every
 * byte of it prints (else JSON-quoted, escapes and all), a real with one
 * decimal (uptime_s), anything else as compact JSON.  Allocated; NULL
 * when out of memory. */
static char *status_text(const json_t *v)
{
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        const size_t n = json_string_length(v);
        size_t i = 0;
        while (i < n && (unsigned char)t[i] >= 0x20 && t[i] != 0x7f)
            i++;
        if (i == n && n > 0)
            return strdup(t);
    } else if (json_is_real(v)) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.1f", json_real_value(v));
        return strdup(buf);
    }
    return dg_json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
}

/* The status event's fields, one "key value" line each; EXIT_FAILED
 * (after saying so) when out of memory, before anything is written. */
static int print_status(const char *json)
{
    struct dg_error je = {0};
    json_t *s = dg_json_loadb(json, strlen(json), 0, "status", &je), *v;
    const char *key;
    size_t n = 0;
    struct row {
        const char *key; /* (s's) */
        char *text;
    } *rows;
    int rc = EXIT_DONE;
    if (!s) {
        client_errorf("%s", je.msg);
        return EXIT_FAILED;
    }
    /* every value is formatted before the first line is written: the
     * table comes whole or not at all */
    if (!(rows = calloc(json_object_size(s) + 1, sizeof *rows))) {
        client_errorf("status: out of memory");
        json_decref(s);
        return EXIT_FAILED;
    }
    json_object_foreach(s, key, v) {
        if (!strcmp(key, "v") || !strcmp(key, "event"))
            continue;
        if (!(rows[n].text = status_text(v))) {
            client_errorf("status: out of memory");
            rc = EXIT_FAILED;
            break;
        }
        rows[n++].key = key;
    }
    for (size_t i = 0; i < n; i++) {
        if (rc == EXIT_DONE)
            printf("%-18s %s\n", rows[i].key, rows[i].text);
        free(rows[i].text);
    }
    free(rows);
    json_decref(s);
    return rc;
}

int cmd_status(int argc, char **argv)
{
    struct client_opts o = {0};
    dgemma_event_t ev;
    dgemma_t *c;
    int rc = EXIT_UNREACHABLE, e;

    for (int i = 1; i < argc; i++) {
        int took;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(status_usage, stdout);
            json_decref(o.settings);
            return EXIT_DONE;
        }
        took = client_common_option(&o, argc, argv, &i);
        if (took == CLIENT_OPT_NOMEM) {
            json_decref(o.settings);
            return EXIT_FAILED;
        }
        if (took <= 0 || json_object_size(o.settings) > 0) {
            if (took == 0)
                client_errorf("status: unexpected '%s'", argv[i]);
            fputs(status_usage, stderr);
            json_decref(o.settings);
            return EXIT_USAGE;
        }
    }
    if (!(c = client_connect(&o, &rc))) {
        json_decref(o.settings);
        return rc;
    }
    if ((e = dgemma_status(c)) < 0) {
        client_errorf("%s", dgemma_errmsg(c));
        rc = client_exit_for(e);
    } else if ((e = wait_event(c, &ev)) < 0) {
        rc = client_exit_for(e);
    } else {
        if (o.json) {
            puts(ev.json);
            rc = EXIT_DONE;
        } else if (ev.kind == DGEMMA_EV_STATUS) {
            rc = print_status(ev.json);
        } else {
            client_errorf("unexpected answer: %s", ev.json);
            rc = EXIT_FAILED;
        }
    }
    if (client_output_failed() && rc == EXIT_DONE)
        rc = EXIT_FAILED;
    dgemma_close(c);
    json_decref(o.settings);
    return rc;
}

int cmd_cancel(int argc, char **argv)
{
    struct client_opts o = {0};
    uint64_t ids[256];
    int n = 0, rc = EXIT_DONE;
    dgemma_t *c;

    for (int i = 1; i < argc; i++) {
        int took;
        char *end;
        unsigned long long x;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(cancel_usage, stdout);
            json_decref(o.settings);
            return EXIT_DONE;
        }
        if ((took = client_common_option(&o, argc, argv, &i)) != 0) {
            if (took == CLIENT_OPT_NOMEM) {
                json_decref(o.settings);
                return EXIT_FAILED;
            }
            if (took < 0 || json_object_size(o.settings) > 0) {
                fputs(cancel_usage, stderr);
                json_decref(o.settings);
                return EXIT_USAGE;
            }
            continue;
        }
        errno = 0;
        x = strtoull(argv[i], &end, 10);
        /* (ids are JSON integers: at most 2^63 - 1) */
        if (*end || x == 0 || argv[i][0] == '-' || errno == ERANGE || x > INT64_MAX ||
            n == 256) {
            client_errorf("cancel: '%s' is not a request id (or too many ids)", argv[i]);
            json_decref(o.settings);
            return EXIT_USAGE;
        }
        ids[n++] = x;
    }
    if (n == 0) {
        fputs(cancel_usage, stderr);
        json_decref(o.settings);
        return EXIT_USAGE;
    }
    if (!(c = client_connect(&o, &rc))) {
        json_decref(o.settings);
        return rc;
    }
    for (int k = 0; k < n; k++) {
        dgemma_event_t ev;
        int e = dgemma_cancel(c, ids[k]);
        if (e < 0)
            client_errorf("%s", dgemma_errmsg(c));
        else
            e = wait_event(c, &ev);
        if (e < 0) {
            rc = client_exit_for(e);
            break;
        }
        if (o.json)
            puts(ev.json);
        if (ev.kind == DGEMMA_EV_CANCELLING) {
            if (!o.json)
                printf("cancelling %llu\n", (unsigned long long)ids[k]);
        } else {
            client_errorf("%llu: %s", (unsigned long long)ids[k],
                          ev.message ? ev.message : "refused");
            rc = EXIT_FAILED;
        }
    }
    if (client_output_failed() && rc == EXIT_DONE)
        rc = EXIT_FAILED;
    dgemma_close(c);
    json_decref(o.settings);
    return rc;
}
