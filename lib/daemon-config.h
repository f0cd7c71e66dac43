/*
 * daemon-config.h - dgemmad's configuration: the struct the daemon runs
 * from, read from a YAML file (etc/dgemmad.yaml, dgemmad.yaml(5)) and
 * "-o key=value" overrides, and written back as YAML.
 *
 * One static option table in daemon-config.c drives defaults, parsing,
 * checks, the YAML output and the documentation; a key is added by adding
 * a field here and a row there (and a line to etc/dgemmad.yaml and
 * man/dgemmad.yaml.5, which a unit test checks).
 *
 * Errors are DG_E_CONFIG (bad value, unknown key, wrong type, YAML syntax),
 * DG_E_IO (unreadable file) or DG_E_NOMEM, with messages of the form
 * "dgemmad.yaml:7:12: max_batch: expected an integer in [1, 1024], got '0'".
 */
#ifndef DG_DAEMON_CONFIG_H
#define DG_DAEMON_CONFIG_H

#include <stddef.h>

#include "lib/error.h"

enum dg_backend_kind { DG_BACKEND_AUTO = 0, DG_BACKEND_CPU, DG_BACKEND_CUDA };

#define DG_CONFIG_MAX_DEVICES 64
#define DG_CONFIG_PATH_MAX 4096
#define DG_CONFIG_MAX_PEERS 64
/* the most ranks one_gpu puts on one GPU (kernels/nccl.h's DG_NCCL_SHARED_MAX) */
#define DG_CONFIG_ONE_GPU_MAX_TP 8

struct dg_config {
    char model[DG_CONFIG_PATH_MAX];      /* "" : the embedded default model */
    int backend;                         /* enum dg_backend_kind */
    int devices[DG_CONFIG_MAX_DEVICES];  /* GPU ordinals; n_devices 0 = all visible */
    int n_devices;
    int tp;                              /* tensor-parallel degree, 1..64 */
    int experts_width;                   /* 0: across ranks, 1: along the expert width */
    int pin_workers;                     /* bool: pin each rank's worker thread to a CPU */
    double gpu_timeout;                  /* seconds a GPU call may take, 0 = no watchdog, default 120 */
    double group_timeout;                /* seconds to form the NCCL group at start, 0 = no
                                            bound, default 300 */
    int cuda_graphs;                     /* bool: capture GPU steps in CUDA graphs, default true */
    int one_gpu;                         /* bool: every tp rank on one GPU (cuda), default false */
    int max_batch;                       /* requests in flight, 1..1024, default 8 */
    int max_canvas_length;               /* 0 = the model's canvas_length; else 1..4096 */
    int max_denoising_steps;             /* per-request cap, 1..65535, default 256 */
    long long max_tokens;                /* per-request cap, 1..16777216, default 8192 */
    long long max_context;               /* 0 = the model's max_position_embeddings; else 2..16777216 */
    int default_max_tokens;              /* 0 = the checkpoint's max_new_tokens; else 1..16777216 */
    int parse_special;                   /* bool: a request's parse_special default, true */
    int prefill_chunk;                   /* prompt tokens per encoder pass, 1..65536, default 512 */
    int queue_max;                       /* requests waiting for a slot, 0..100000, default 64 */
    int max_connections;                 /* 1..65536, default 256 */
    long long max_line_bytes;            /* one request line, 1024..268435456, default 1048576 */
    long long max_output_bytes;          /* unsent bytes per connection before it is dropped,
                                            65536..4294967296, default 67108864 */
    int send_buffer_bytes;               /* SO_SNDBUF of client sockets, 0 (the system's) or
                                            4096..67108864, default 0 */
    char socket[DG_CONFIG_PATH_MAX];     /* default "/run/dgemma/dgemmad.sock" */
    int socket_mode;                     /* octal, 0..0777, default 0660 */
    char socket_group[256];              /* "" = leave the group as is */
    char socket_owner[256];              /* "" = the user the daemon runs as */
    int allow_uids[DG_CONFIG_MAX_PEERS]; /* clients let in by uid (SO_PEERCRED); */
    int n_allow_uids;                    /*   with allow_gids both empty: everyone */
    int allow_gids[DG_CONFIG_MAX_PEERS]; /* clients let in by a group they hold */
    int n_allow_gids;
    int client_max_requests;             /* in flight per connection, 1..100000, default 64 */
    char user[256];                      /* "" = stay as started; else switch to it */
    int allow_root;                      /* bool: may serve as uid 0, default false */
    int shm_max_entries;                 /* ring entries cap, 0..65536 (0 = no rings), default 1024 */
    int shm_max_arena_mb;                /* each ring arena's cap, 1..1024, default 16 */
    int shm_user_max_mb;                 /* rings' MiB one uid may hold, 0..1048576 (0 = no cap), default 256 */
    char metrics[DG_CONFIG_PATH_MAX];    /* SQLite file, "" = no metrics */
    int metrics_queue;                   /* records waiting for the writer, 1..1000000, default 4096 */
    double metrics_flush;                /* seconds a record may wait, 0.01..60, default 1 */
    double metrics_retention_days;       /* 0 = no age limit; else up to 36500, default 90 */
    long long metrics_max_mb;            /* 0 = no size limit; else up to 1048576, default 1024 */
    int log_level;                       /* enum dg_log_level (lib/log.h), default info */
    char log_file[DG_CONFIG_PATH_MAX];   /* "" = standard error */
    double shutdown_grace;               /* seconds, 0..3600, default 30 */
    double tick;                         /* housekeeping period in seconds, 0.01..60, default 1 */
};

/* Fill c with the table's defaults (every byte of c is set, padding
 * included, so two default structs compare equal with memcmp). */
void dg_config_defaults(struct dg_config *c);

/* Apply YAML text over c: one document whose top level is a mapping of
 * key: value (an empty document changes nothing).  Scalars for scalar
 * keys, sequences for list keys; anchors, aliases and tags are refused.
 * what names the source in errors, which give what:line:column and the
 * key.  Every error leaves c unchanged.  text need not be NUL-terminated. */
int dg_config_load_text(struct dg_config *c, const char *text, size_t len, const char *what,
                        struct dg_error *err);

/* dg_config_load_text on the file at path (at most 1 MiB).  A file that is
 * missing, unreadable or too large is DG_E_IO, naming path. */
int dg_config_load_file(struct dg_config *c, const char *path, struct dg_error *err);

/* Apply one "key=value" override (a command line's -o): value is YAML
 * scalar or flow syntax ("devices=[0, 1]", "socket='/tmp/a b'"); an empty
 * value is the empty string.  what names it in errors ("-o max_batch=0").
 * The same checks as a file; every error leaves c unchanged. */
int dg_config_set(struct dg_config *c, const char *assignment, const char *what,
                  struct dg_error *err);

/* Checks across fields, for after every file and override is applied:
 * tp in [1, 64], and at most DG_CONFIG_ONE_GPU_MAX_TP with one_gpu; no GPU
 * listed twice in devices. */
int dg_config_validate(const struct dg_config *c, struct dg_error *err);

/* The configuration as YAML, one "key: value" line per option in table
 * order, in forms dg_config_load_text reads back to an identical struct
 * (strings are assumed to be UTF-8, as anything loaded from YAML is).
 * malloc'd; NULL when out of memory. */
char *dg_config_to_yaml(const struct dg_config *c);

/* The option table, for documentation and --help: how many options, and
 * option i's key, type name, default (as YAML text) and help sentence.
 * For i out of range every output is set to NULL. */
int dg_config_n_options(void);
void dg_config_option_doc(int i, const char **name, const char **type, const char **def,
                          const char **help);

#endif
