/*
 * main.c - dgemmad: start-up, the run, shut-down.  See dgemmad(8).
 *
 * Threads: this one becomes the front end (server.h); the scheduler
 * (sched.h) owns the engine; the backend's workers, one per rank, run the
 * model.  SIGTERM, SIGINT and SIGHUP are blocked everywhere and read by the
 * front end through a signalfd; SIGPIPE is ignored (sends use MSG_NOSIGNAL).
 * Only this file decides what is fatal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/access.h"
#include "daemon/dlog.h"
#include "daemon/gpu-need.h"
#include "daemon/group-deadline.h"
#include "daemon/metrics.h"
#include "daemon/protocol.h"
#include "daemon/sched.h"
#include "daemon/sdnotify.h"
#include "daemon/server.h"
#include "lib/checkpoint.h"
#include "lib/cpu-backend.h"
#include "lib/daemon-config.h"
#include "lib/fileio.h"
#include "lib/metrics-db.h"
#include "lib/model-weights.h"
#include "lib/tokenizer.h"
#include "lib/tp-plan.h"
#include "lib/version.h"

#if DG_HAVE_CUDA
#include "kernels/cuda-backend.h"
#include "kernels/device-probe.h"
#endif

#ifndef DG_DATADIR
#define DG_DATADIR "/usr/local/share/dgemma"
#endif

static const char usage[] =
    "usage: dgemmad [-c FILE] [-o KEY=VALUE]... [--rank N] [--print-config]\n"
    "               [--check-config] [--version] [-h]\n"
    "Serve DiffusionGemma on a UNIX socket (JSON lines; see dgemmad(8)).\n"
    "  -c FILE          read the configuration (dgemmad.yaml(5)); without it,\n"
    "                   the defaults\n"
    "  -o KEY=VALUE     set one option over the file (repeatable)\n"
    "  --print-config   print the effective configuration and exit\n"
    "  --check-config   check the configuration, the model, the socket path and the\n"
    "                   metrics file (creating nothing), then exit\n"
    "  --rank N         multi-process mode: be rank N of tp processes joined by\n"
    "                   NCCL (NCCL_COMM_ID=HOST:PORT); rank 0 serves,\n"
    "                   the others compute beside it\n"
    "Without a model option, the small model shipped with dgemma is served.\n"
    "Started as root it switches to the configured user, or refuses to start\n"
    "unless allow_root is true (dgemmad(8), ACCESS).\n";

static void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void errorf(const char *fmt, ...)
{
    va_list ap;
    fputs("dgemmad: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* The embedded default model: beside the binary in a build tree
 * (build/bin/dgemmad -> build/model/default), else the installed copy. */
static int default_model(char *out, size_t size)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        snprintf(out, size, "%s/../model/default", dirname(exe));
        {
            char probe[PATH_MAX + 32];
            snprintf(probe, sizeof probe, "%s/config.json", out);
            if (dg_file_exists(probe))
                return 0;
        }
    }
    snprintf(out, size, "%s/model/default", DG_DATADIR);
    return 0;
}

/* FNV-1a, 64 bits, as 16 hex digits: tells configurations apart in the
 * metrics (not a security digest). */
static void digest_hex(const char *s, char out[17])
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

static void error_to_metrics(void *ctx, const char *msg)
{
    dmetrics_event(ctx, "error", msg);
}

struct loaded {
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_tokenizer *tok;
    int have_model;
};

static int load_model(const char *dir, struct loaded *L, struct dg_error *err)
{
    char tpath[PATH_MAX + 32], cpath[PATH_MAX + 32];
    int rc;
    memset(L, 0, sizeof *L);
    if ((rc = dg_model_load(dir, &L->ck, &L->m, err)) < 0)
        return rc;
    L->have_model = 1;
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    if (dg_file_exists(tpath) && (rc = dg_tokenizer_load(tpath, cpath, &L->tok, err)) < 0)
        return dg_error_prefix(err, "tokenizer");
    return 0;
}

static void unload(struct loaded *L)
{
    dg_tokenizer_free(L->tok);
    if (L->have_model) {
        dg_model_free(&L->m);
        dg_checkpoint_close(&L->ck);
    }
}

/* Settings a request starts from, and the limits it is held to. */
/* The GPU backend when the configuration asks for it, or for auto where
 * enough GPUs are present (tp of them: the first tp of devices, or GPUs
 * 0 .. tp-1); *b stays NULL for the CPU.  Errors: a GPU backend that
 * cannot start (named). */
/* Multi-process mode (--rank): this process's rank and the group's id. */
struct mp {
    int rank;                   /* -1: not in multi-process mode */
#if DG_HAVE_CUDA
    struct dg_nccl_id id;
#endif
};

#if DG_HAVE_CUDA
_Static_assert(DG_CONFIG_ONE_GPU_MAX_TP == DG_NCCL_SHARED_MAX,
               "one_gpu's limit is the shared group's");

/* devices, where it is set, lists a GPU for each of the tp ranks of this
 * process (gpu-need.h). */
static int devices_cover_tp(const struct dg_config *cfg, const struct mp *mp,
                            struct dg_error *err)
{
    if (!dgpu_devices_cover(cfg->n_devices, cfg->tp, cfg->one_gpu, mp->rank))
        return dg_error_set(err, DG_E_CONFIG, "cuda: tp %d needs %d GPUs; devices lists %d",
                            cfg->tp, dgpu_needed(cfg->tp, cfg->one_gpu, mp->rank),
                            cfg->n_devices);
    return 0;
}
#endif

#if DG_HAVE_CUDA
/* group_timeout passed with the NCCL group not formed: ncclCommInitRank
 * cannot be called off, so say why and end the process (exit 1; nothing
 * is served yet, no socket made), for the launcher to start it again. */
struct group_late_ctx {
    int rank; /* -1: one process */
    int tp;
};

static void group_late(void *arg, int joined, int need, double seconds)
{
    const struct group_late_ctx *g = arg;
    const char *at = getenv("NCCL_COMM_ID");
    if (g->rank >= 0)
        dlog(DG_LOG_ERROR, "rank %d: the NCCL group of %d ranks did not form within %g s "
             "(group_timeout): is every rank started, with NCCL_COMM_ID (here %s) naming "
             "rank 0's host and port? exiting 1", g->rank, g->tp, seconds, at ? at : "unset");
    else
        dlog(DG_LOG_ERROR, "the group of %d tensor-parallel ranks did not form within %g s "
             "(group_timeout): %d of them joined; exiting 1", g->tp, seconds, joined);
    (void)need;
    _exit(1);
}
#endif

static int choose_backend(const struct dg_config *cfg, const struct loaded *L,
                          const struct mp *mp, struct dg_backend **b, struct dg_error *err)
{
    *b = NULL;
#if DG_HAVE_CUDA
    {
        struct dg_cuda_backend_options o;
        struct dgroup_deadline *deadline = NULL;
        static struct group_late_ctx late; /* (read by the deadline's thread) */
        char why[128];
        int n = 0, rc;
        if (cfg->backend == DG_BACKEND_CPU)
            return 0;
        if (cfg->backend == DG_BACKEND_AUTO) {
            struct dg_error probe = {0};
            if (dg_gpu_count(&n, &probe) < 0 || n == 0) {
                dlog(DG_LOG_INFO, "backend auto: no GPU (%s): the CPU",
                     probe.msg[0] ? probe.msg : "none visible");
                return 0;
            }
            if (!dgpu_auto_takes(n, cfg->n_devices, cfg->tp, cfg->one_gpu, mp->rank, why,
                                 sizeof why)) {
                dlog(DG_LOG_INFO, "backend auto: %s: the CPU", why);
                return 0;
            }
        }
        if ((rc = devices_cover_tp(cfg, mp, err)) < 0)
            return rc;
        memset(&o, 0, sizeof o);
        o.n_ranks = cfg->tp;
        o.device = cfg->n_devices ? cfg->devices[0] : 0;
        o.devices = cfg->n_devices ? cfg->devices : NULL;
        o.experts = cfg->experts_width ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS;
        o.max_slots = cfg->max_batch;
        o.model = &L->m;
        o.pin = cfg->pin_workers;
        o.timeout_ms = (int)(cfg->gpu_timeout * 1000 + 0.5);
        o.graphs = cfg->cuda_graphs;
        /* (every rank on o.device; the backend then runs without graphs) */
        o.shared_gpu = cfg->one_gpu && cfg->tp > 1;
        if (mp->rank >= 0) {
            /* one GPU in this process: the rank's of devices, else its own
             * ordinal among the visible ones */
            int have = 1;
            dg_gpu_count(&have, NULL);
            o.process_rank = mp->rank;
            o.nccl_id = &mp->id;
            o.device = cfg->n_devices > mp->rank ? cfg->devices[mp->rank]
                       : cfg->n_devices == 1   ? cfg->devices[0]
                                               : mp->rank % (have > 0 ? have : 1);
            o.devices = NULL;
        }
        /* an fp32 checkpoint runs at its own precision; the others as bf16 */
        o.fp32 = L->m.embed.dtype == DG_DTYPE_F32;
        /* the NCCL group's forming bounded by group_timeout (this
         * process's ranks: one in multi-process mode) */
        if (cfg->tp > 1) {
            late.rank = mp->rank;
            late.tp = cfg->tp;
            if ((rc = dgroup_deadline_start(cfg->group_timeout, mp->rank >= 0 ? 1 : cfg->tp,
                                            group_late, &late, &deadline, err)) < 0)
                return rc;
            o.joined = dgroup_deadline_joined;
            o.joined_arg = deadline;
        }
        rc = dg_cuda_backend_create(&o, b, err);
        if (rc >= 0 && deadline)
            dlog(DG_LOG_INFO, "the group of %d tensor-parallel ranks formed: %d joined in this "
                 "process (group_timeout %g s)", cfg->tp, dgroup_deadline_count(deadline),
                 cfg->group_timeout);
        dgroup_deadline_stop(deadline);
        if (rc < 0) {
            dg_error_prefix(err, "cuda (tp %d)", cfg->tp);
            return rc;
        }
        for (int r = 0; r < dg_cuda_backend_ranks(*b); r++) {
            struct dg_cuda_rank_usage u;
            dg_cuda_backend_rank_usage(*b, r, &u);
            dlog(DG_LOG_INFO, "backend cuda: rank %d of %d on GPU %d: weights %.2f GiB (%s), "
                 "vocabulary rows %lld of %lld", mp->rank >= 0 ? mp->rank : r, cfg->tp, u.device,
                 (double)u.weights / (1 << 30), o.fp32 ? "fp32" : "bf16",
                 (long long)u.vocab_rows, (long long)L->m.cfg.vocab_size);
        }
        return 0;
    }
#else
    (void)L;
    (void)mp;
    (void)err;
    if (cfg->backend == DG_BACKEND_AUTO)
        dlog(DG_LOG_INFO, "backend auto: the CPU (built without CUDA)");
    return 0;
#endif
}

/* --check-config's look at the backend, allocating nothing: the model
 * splits into tp ranks (the plan every backend builds), and an explicit
 * cuda backend finds as many GPUs as it needs (and those devices names). */
static int check_backend(const struct dg_config *cfg, const struct loaded *L,
                         const struct mp *mp, struct dg_error *err)
{
    struct dg_tp_plan plan;
    int rc = dg_tp_plan_build(&L->m.cfg, cfg->tp,
                              cfg->experts_width ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS, 1, &plan,
                              err);
    if (rc < 0)
        return rc;
#if DG_HAVE_CUDA
    if (cfg->backend == DG_BACKEND_CUDA && mp->rank < 0) {
        struct dg_error probe = {0};
        const int need = dgpu_needed(cfg->tp, cfg->one_gpu, mp->rank);
        int n = 0;
        if (dg_gpu_count(&n, &probe) < 0)
            n = 0;
        if ((rc = devices_cover_tp(cfg, mp, err)) < 0)
            return rc;
        for (int i = 0; i < cfg->n_devices; i++)
            if (cfg->devices[i] >= n)
                return dg_error_set(err, DG_E_CONFIG, "cuda: devices names GPU %d; %d visible%s%s",
                                    cfg->devices[i], n, probe.msg[0] ? ": " : "", probe.msg);
        if (n < need)
            return dg_error_set(err, DG_E_CONFIG, "cuda: tp %d needs %d GPU(s); %d visible%s%s",
                                cfg->tp, need, n, probe.msg[0] ? ": " : "", probe.msg);
    }
#else
    (void)mp;
#endif
    return 0;
}

static int request_defaults(const struct dg_config *cfg, const struct loaded *L,
                            struct dg_engine_config *ec, struct dg_gen_settings *def,
                            struct dg_error *err)
{
    const struct dg_model_config *mc = &L->m.cfg;
    dg_engine_config_default(ec, mc);
    ec->max_batch = cfg->max_batch;
    ec->prefill_chunk = cfg->prefill_chunk;
    if (cfg->max_context > 0) {
        ec->max_context = cfg->max_context < mc->max_position_embeddings
                              ? cfg->max_context : mc->max_position_embeddings;
        if (cfg->max_context > ec->max_context)
            dlog(DG_LOG_WARN, "max_context %lld: the model holds %lld positions; using %lld",
                 (long long)cfg->max_context, (long long)mc->max_position_embeddings,
                 (long long)ec->max_context);
    }
    ec->limits.max_canvas_length = cfg->max_canvas_length > 0 ? cfg->max_canvas_length
                                                              : mc->canvas_length;
    ec->limits.max_denoising_steps = cfg->max_denoising_steps;
    ec->limits.max_tokens = cfg->max_tokens;
    dg_gen_settings_defaults(def, mc, &L->ck.generation);
    if (cfg->default_max_tokens > 0)
        def->max_tokens = cfg->default_max_tokens;
    /* the defaults within the limits, as a request's own values must be
     * (said where a configured value is what gives way) */
    if (def->max_tokens > cfg->max_tokens) {
        if (cfg->default_max_tokens > 0)
            dlog(DG_LOG_WARN, "default_max_tokens %lld is above max_tokens %lld; using %lld",
                 (long long)cfg->default_max_tokens, (long long)cfg->max_tokens,
                 (long long)cfg->max_tokens);
        def->max_tokens = cfg->max_tokens;
    }
    if (def->max_denoising_steps > cfg->max_denoising_steps)
        def->max_denoising_steps = cfg->max_denoising_steps;
    if (def->canvas_length > ec->limits.max_canvas_length)
        def->canvas_length = ec->limits.max_canvas_length;
    if (dg_gen_settings_validate(def, mc, &ec->limits, err) < 0)
        return dg_error_prefix(err, "the default request settings (generation_config.json "
                                    "and the configuration)");
    /* a one-token prompt with the defaults must fit, or no request that
     * leaves max_tokens out could ever run */
    if (dg_engine_check_fit(ec->max_context, 1, def, err) < 0)
        return dg_error_prefix(err, "max_context %lld cannot hold a request with the default "
                                    "settings (raise max_context or lower default_max_tokens)",
                               (long long)ec->max_context);
    return 0;
}

/* Start-up's watcher.  SIGTERM and SIGINT are blocked from the start, for
 * the front end's signalfd; until the front end runs (the model's load
 * alone can take a minute) this thread takes them instead: the daemon
 * stops at once, exit 0 (nothing is served yet, so nothing to drain).
 * Once startup_over is set (just before the server is created) a signal
 * it takes is sent again, pending for the front end's signalfd. */
static atomic_int startup_over;
static pthread_t startup_thread;
static int startup_running;

static void *startup_watch(void *arg)
{
    const struct timespec tick = {0, 100 * 1000 * 1000};
    sigset_t set;
    (void)arg;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    while (!atomic_load(&startup_over)) {
        const int sig = sigtimedwait(&set, NULL, &tick);
        if (sig <= 0)
            continue;
        if (atomic_load(&startup_over)) {
            kill(getpid(), sig); /* (pending again, for the front end) */
            break;
        }
        dlog(DG_LOG_INFO, "%s during start-up: stopping (nothing served yet)",
             sig == SIGTERM ? "SIGTERM" : "SIGINT");
        _exit(0);
    }
    return NULL;
}

static void startup_watch_stop(void)
{
    if (!startup_running)
        return;
    atomic_store(&startup_over, 1);
    pthread_join(startup_thread, NULL);
    startup_running = 0;
}

/* --check-config's look at log_file, creating nothing: an existing file
 * must open for appending, a missing one needs a directory this process
 * may create it in.  0, or -1 with err set. */
static int check_log_file(const char *path, struct dg_error *err)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    if (errno != ENOENT)
        return dg_error_set(err, DG_E_IO, "log_file %s: %s", path, strerror(errno));
    return dg_path_creatable("log_file", path, err);
}

/* Raise the soft RLIMIT_NOFILE towards what the configuration may need:
 * a descriptor per connection, three more per shared-memory ring (memfd,
 * two doorbells), and some for the log, metrics, ring and signals; warn
 * when the hard limit is below it. */
static void raise_fd_limit(const struct dg_config *cfg)
{
    const rlim_t need = (rlim_t)cfg->max_connections * (cfg->shm_max_entries > 0 ? 4 : 1) + 64;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        dlog(DG_LOG_WARN, "file descriptors: cannot raise the limit to %llu: %s",
             (unsigned long long)rl.rlim_cur, strerror(errno));
    if (rl.rlim_cur < need)
        dlog(DG_LOG_WARN, "file descriptors: the limit is %llu, max_connections %d may need "
             "%llu (raise the hard limit, e.g. LimitNOFILE= in the unit)",
             (unsigned long long)rl.rlim_cur, cfg->max_connections, (unsigned long long)need);
}

/* SIGBUS on a mapped checkpoint: the file shrank under the running
 * daemon (rewritten in place, or truncated), and the pages the model
 * reads are gone.  Nothing can go on: say which file and what to do in
 * the log, remove our socket (once it is ours, and only while the path
 * still names the file we bound: another daemon may have taken it), exit
 * 74 (EX_IOERR).  A SIGBUS anywhere else is a fault of ours: the default
 * action, a core.  Only async-signal-safe calls here (lstat and unlink
 * are). */
static char sigbus_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static dev_t sigbus_socket_dev;
static ino_t sigbus_socket_ino;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    const char *path = dg_file_mapping_at(si->si_addr);
    char msg[1024];
    size_t n = 0;
    (void)uc;
    if (!path) {
        signal(sig, SIG_DFL); /* the access faults again, without us */
        return;
    }
    n = dlog_put(msg, n, sizeof msg, "fatal: ");
    n = dlog_put(msg, n, sizeof msg, path);
    n = dlog_put(msg, n, sizeof msg,
                 " shrank under the running daemon (written over in place or truncated); "
                 "exiting 74. Restart dgemmad to load it again, and replace a model by "
                 "renaming a complete file over the old one, not by writing into it");
    (void)n;
    dlog_signal_safe(msg);
    if (sigbus_socket[0]) {
        struct stat st;
        if (lstat(sigbus_socket, &st) == 0 && st.st_dev == sigbus_socket_dev &&
            st.st_ino == sigbus_socket_ino)
            unlink(sigbus_socket);
    }
    _exit(74);
}

static void catch_sigbus(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

#if DG_HAVE_CUDA
static volatile int stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}
#endif

/* Multi-process mode, rank > 0: the rank's GPU beside rank 0's process,
 * until rank 0 ends the group (exit 0), a signal (exit 0) or a failure of
 * the group (exit 1, logged). */
static int serve_rank(const struct dg_config *cfg, const struct loaded *L, const struct mp *mp)
{
#if DG_HAVE_CUDA
    struct dg_backend *b = NULL;
    struct dg_error err = {0};
    struct sigaction sa;
    sigset_t mask;
    int rc;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &mask, NULL);
    if (choose_backend(cfg, L, mp, &b, &err) < 0 || !b) {
        dlog(DG_LOG_ERROR, "rank %d: backend: %s", mp->rank,
             b ? "" : err.msg[0] ? err.msg : "the GPU backend is needed in multi-process mode");
        return 1;
    }
    dlog(DG_LOG_INFO, "rank %d of %d: serving rank 0's calls", mp->rank, cfg->tp);
    sd_notify_send("READY=1\nSTATUS=serving rank 0's calls");
    rc = dg_cuda_backend_serve(b, &stop_requested, &err);
    sd_notify_send("STOPPING=1");
    if (rc < 0 && !stop_requested)
        dlog(DG_LOG_ERROR, "rank %d: the group failed: %s", mp->rank, err.msg);
    else
        dlog(DG_LOG_INFO, "rank %d: %s", mp->rank,
             stop_requested ? "stopped by a signal" : "rank 0 ended the group");
    b->ops->destroy(b);
    return rc < 0 && !stop_requested ? 1 : 0;
#else
    (void)cfg;
    (void)L;
    dlog(DG_LOG_ERROR, "rank %d: this build has no CUDA", mp->rank);
    return 1;
#endif
}

/* The group's id in multi-process mode, from NCCL's own bootstrap at
 * NCCL_COMM_ID (host:port, the same in every process: rank 0 listens
 * there, so every process makes the same id). */
static int mp_setup(struct mp *mp, const struct dg_config *cfg, struct dg_error *err)
{
#if DG_HAVE_CUDA
    if (cfg->tp < 2 || mp->rank >= cfg->tp)
        return dg_error_set(err, DG_E_CONFIG, "--rank %d: multi-process mode needs tp of at "
                            "least 2 and above the rank (tp is %d)", mp->rank, cfg->tp);
    if (cfg->backend == DG_BACKEND_CPU)
        return dg_error_set(err, DG_E_CONFIG, "--rank: multi-process mode runs on GPUs, not "
                            "backend cpu");
    if (cfg->one_gpu)
        return dg_error_set(err, DG_E_CONFIG, "--rank: multi-process mode joins its ranks "
                            "through NCCL, one GPU each, not one_gpu");
    if (!getenv("NCCL_COMM_ID"))
        return dg_error_set(err, DG_E_CONFIG, "--rank: set NCCL_COMM_ID=HOST:PORT (rank 0's "
                            "address, the same for every process)");
    return dg_nccl_get_id(&mp->id, err);
#else
    (void)mp;
    (void)cfg;
    return dg_error_set(err, DG_E_UNSUPPORTED, "--rank: this build has no CUDA");
#endif
}

int main(int argc, char **argv)
{
    struct dg_config cfg;
    struct dg_error err = {0};
    const char *config_path = NULL;
    int print_config = 0, check_config = 0, status = 1, event_fd = -1, rc_run;
    char model_dir[PATH_MAX];
    char who[300];
    struct loaded L;
    struct dg_engine_config ec;
    struct dg_gen_settings defaults;
    struct dproto_ctx pctx;
    struct dg_backend *backend = NULL;
    struct dsched *sched = NULL;
    struct dserver *srv = NULL;
    struct dmetrics *metrics = NULL;
    struct dserver_options so;
    json_t *info = NULL;
    sigset_t mask;
    struct mp mp;

    memset(&L, 0, sizeof L);
    memset(&mp, 0, sizeof mp);
    mp.rank = -1;
    dlog_set_tag('M');
    dg_config_defaults(&cfg);
    /* the file first, whatever the order of the arguments, then -o in order */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("dgemmad %s\n", DGEMMA_VERSION);
            return 0;
        }
        if (!strcmp(argv[i], "--print-config"))
            print_config = 1;
        else if (!strcmp(argv[i], "--check-config"))
            check_config = 1;
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
            char *end;
            long r = strtol(argv[i + 1], &end, 10);
            if (*end || end == argv[i + 1] || r < 0 || r > 63) {
                errorf("--rank: '%s' is not a rank (0..63)", argv[i + 1]);
                return 2;
            }
            mp.rank = (int)r;
            i++;
        }
        else if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "-o")) && i + 1 < argc) {
            if (argv[i][1] == 'c') {
                if (config_path) { /* (the first would be dropped without a word) */
                    errorf("-c given twice ('%s', then '%s'): one configuration file; "
                           "-o sets single keys over it", config_path, argv[i + 1]);
                    return 2;
                }
                config_path = argv[i + 1];
            }
            i++;
        } else {
            errorf("unexpected argument '%s'", argv[i]);
            fputs(usage, stderr);
            return 2;
        }
    }
    if (config_path && dg_config_load_file(&cfg, config_path, &err) < 0) {
        errorf("%s", err.msg);
        return 1;
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            char what[300];
            snprintf(what, sizeof what, "-o %.280s", argv[i + 1]);
            if (dg_config_set(&cfg, argv[i + 1], what, &err) < 0) {
                errorf("%s", err.msg);
                return 1;
            }
            i++;
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--rank")) {
            i++;
        }
    if (dg_config_validate(&cfg, &err) < 0) {
        errorf("%s", err.msg);
        return 1;
    }
    if (print_config) {
        char *y = dg_config_to_yaml(&cfg);
        if (!y) {
            errorf("out of memory");
            return 1;
        }
        fputs(y, stdout);
        free(y);
        return 0;
    }
    if (cfg.model[0])
        snprintf(model_dir, sizeof model_dir, "%s", cfg.model);
    else
        default_model(model_dir, sizeof model_dir);
    {
        char real[PATH_MAX];
        if (realpath(model_dir, real))
            snprintf(model_dir, sizeof model_dir, "%s", real);
    }

    /* as whom: before the first file (log, model, metrics, socket) is opened */
    if (daccess_switch_user(cfg.user, cfg.allow_root, who, sizeof who, &err) < 0) {
        errorf("%s", err.msg);
        return 1;
    }
    /* (--check-config: the log file could open, and what the check finds
     * goes to the terminal; nothing created) */
    if (check_config && cfg.log_file[0] && check_log_file(cfg.log_file, &err) < 0) {
        errorf("%s", err.msg);
        return 1;
    }
    if (dlog_open(check_config ? "" : cfg.log_file, (enum dg_log_level)cfg.log_level, &err) <
        0) {
        errorf("%s", err.msg);
        return 1;
    }
    dg_log_set_sink(dlog_lib_sink, NULL, (enum dg_log_level)cfg.log_level);
    catch_sigbus();
    raise_fd_limit(&cfg);
    /* before any thread: the front end reads these through a signalfd */
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    startup_running = pthread_create(&startup_thread, NULL, startup_watch, NULL) == 0;

    dlog(DG_LOG_INFO, "dgemmad %s starting: config %s, model %s; %s", DGEMMA_VERSION,
         config_path ? config_path : "(defaults)", model_dir, who);
#if !DG_HAVE_CUDA
    if (cfg.backend == DG_BACKEND_CUDA) {
        dlog(DG_LOG_ERROR, "backend cuda: this build has no CUDA (built without nvcc); use cpu "
             "or auto");
        goto out;
    }
#endif
    if (mp.rank >= 0 && mp_setup(&mp, &cfg, &err) < 0) {
        dlog(DG_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    /* (what `systemctl status` shows while a start takes long) */
    if (!check_config)
        sd_notify_send("STATUS=loading the model");
    if (load_model(model_dir, &L, &err) < 0) {
        dlog(DG_LOG_ERROR, "model %s: %s", model_dir, err.msg);
        goto out;
    }
    if (request_defaults(&cfg, &L, &ec, &defaults, &err) < 0) {
        dlog(DG_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    if (check_config) {
        /* what start-up would open next, checked without creating anything */
        int live = 0;
        if (mp.rank <= 0 &&
            dserver_check_socket(cfg.socket, cfg.socket_owner, cfg.socket_group, &live, &err) < 0) {
            dlog(DG_LOG_ERROR, "%s", err.msg);
            goto out;
        }
        if (mp.rank <= 0 && cfg.metrics[0] && dg_metrics_db_check(cfg.metrics, &err) < 0) {
            dlog(DG_LOG_ERROR, "%s", err.msg);
            goto out;
        }
        if (check_backend(&cfg, &L, &mp, &err) < 0) {
            dlog(DG_LOG_ERROR, "backend: %s", err.msg);
            goto out;
        }
        if (live)
            printf("dgemmad: note: a daemon is serving %s now; another starts there only "
                   "once it stops\n", cfg.socket);
        printf("dgemmad: configuration %s and model %s are usable\n",
               config_path ? config_path : "(defaults)", model_dir);
        status = 0;
        goto out;
    }
    if (mp.rank > 0) {
        /* a worker process: no socket, no engine; its rank's share of
         * every call rank 0 makes, until rank 0 goes */
        startup_watch_stop(); /* (serve_rank takes the signals itself) */
        status = serve_rank(&cfg, &L, &mp);
        goto out;
    }
    sd_notify_send("STATUS=starting the backend (on GPUs: the ranks joining, the weights "
                   "uploaded)");
    if (choose_backend(&cfg, &L, &mp, &backend, &err) < 0) {
        dlog(DG_LOG_ERROR, "backend: %s", err.msg);
        goto out;
    }
    if (mp.rank == 0 && !backend) {
        dlog(DG_LOG_ERROR, "--rank 0: multi-process mode runs on GPUs and none is usable here");
        goto out;
    }
    if (!backend) {
        struct dg_cpu_backend_options bo;
        memset(&bo, 0, sizeof bo);
        bo.n_ranks = cfg.tp;
        bo.experts = cfg.experts_width ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS;
        bo.max_slots = cfg.max_batch;
        bo.workers = 1;
        bo.pin = cfg.pin_workers;
        if (dg_cpu_backend_create(&L.m, &bo, &backend, &err) < 0) {
            dlog(DG_LOG_ERROR, "backend: %s", err.msg);
            goto out;
        }
    }
    if (cfg.metrics[0]) {
        struct dmetrics_options mo;
        char digest[17];
        char *yaml = dg_config_to_yaml(&cfg);
        memset(&mo, 0, sizeof mo);
        mo.path = cfg.metrics;
        mo.queue_max = (size_t)cfg.metrics_queue;
        mo.flush_s = cfg.metrics_flush;
        mo.retention_days = cfg.metrics_retention_days;
        mo.max_bytes = (int64_t)cfg.metrics_max_mb << 20;
        mo.busy_ms = 200;
        mo.stop_wait_s = 5;
        mo.version = DGEMMA_VERSION;
        mo.model = model_dir;
        mo.backend = backend->name;
        mo.tp = cfg.tp;
        digest_hex(yaml ? yaml : "", digest);
        mo.config_digest = digest;
        mo.config_text = yaml;
        if (dmetrics_create(&mo, &metrics, &err) < 0) {
            free(yaml);
            dlog(DG_LOG_ERROR, "%s", err.msg);
            goto out;
        }
        free(yaml);
        dlog_set_error_hook(error_to_metrics, metrics);
        dlog(DG_LOG_INFO, "metrics: %s (queue %d, flush %.2f s, keep %g days, %lld MiB)",
             cfg.metrics, cfg.metrics_queue, cfg.metrics_flush, cfg.metrics_retention_days,
             cfg.metrics_max_mb);
    }
    event_fd = eventfd(0, EFD_CLOEXEC);
    if (event_fd < 0) {
        dlog(DG_LOG_ERROR, "eventfd: %s", strerror(errno));
        goto out;
    }
    if (dsched_create(backend, &ec, L.tok, (size_t)cfg.queue_max, event_fd, metrics, &sched,
                      &err) < 0) {
        dlog(DG_LOG_ERROR, "scheduler: %s", err.msg);
        goto out;
    }
    memset(&pctx, 0, sizeof pctx);
    pctx.cfg = &L.m.cfg;
    pctx.defaults = &defaults;
    pctx.limits = &ec.limits;
    pctx.tok = L.tok;
    pctx.max_prompt_tokens = (size_t)(ec.max_context - 1);
    pctx.plain_text = !cfg.parse_special;
    info = json_pack("{s:s,s:s,s:s,s:i,s:s,s:I,s:i,s:i,s:i,s:I,s:I}", "version", DGEMMA_VERSION,
                     "model", model_dir, "backend", backend->name, "tp", cfg.tp, "experts",
                     cfg.experts_width ? "width" : "across", "vocab_size",
                     (json_int_t)L.m.cfg.vocab_size, "canvas_length", L.m.cfg.canvas_length,
                     "max_batch", cfg.max_batch, "queue_max", cfg.queue_max, "max_context",
                     (json_int_t)ec.max_context, "max_tokens", (json_int_t)ec.limits.max_tokens);
    memset(&so, 0, sizeof so);
    so.socket_path = cfg.socket;
    so.socket_mode = cfg.socket_mode;
    so.socket_group = cfg.socket_group;
    so.socket_owner = cfg.socket_owner;
    so.access.uids = cfg.allow_uids;
    so.access.n_uids = cfg.n_allow_uids;
    so.access.gids = cfg.allow_gids;
    so.access.n_gids = cfg.n_allow_gids;
    so.access.self_uid = geteuid();
    so.client_max_requests = cfg.client_max_requests;
    so.max_connections = cfg.max_connections;
    so.shm.max_entries = (uint32_t)cfg.shm_max_entries;
    so.shm.max_arena_bytes = (uint64_t)cfg.shm_max_arena_mb << 20;
    so.shm_user_max_bytes = (uint64_t)cfg.shm_user_max_mb << 20;
    so.max_line_bytes = (size_t)cfg.max_line_bytes;
    so.max_output_bytes = (size_t)cfg.max_output_bytes;
    so.send_buffer_bytes = cfg.send_buffer_bytes;
    so.tick = cfg.tick;
    so.shutdown_grace = cfg.shutdown_grace;
    so.info = info;
    so.metrics = metrics;
    /* from here the front end's signalfd takes SIGTERM and SIGINT (one the
     * watcher takes meanwhile it sends again) */
    atomic_store(&startup_over, 1);
    if (!info || dserver_create(&so, sched, &pctx, event_fd, &srv, &err) < 0) {
        dlog(DG_LOG_ERROR, "%s", info ? err.msg : "out of memory");
        goto out;
    }
    dserver_socket_file(srv, &sigbus_socket_dev, &sigbus_socket_ino);
    atomic_signal_fence(memory_order_seq_cst); /* (before the handler may read them) */
    snprintf(sigbus_socket, sizeof sigbus_socket, "%s", cfg.socket); /* ours now */
    dlog(DG_LOG_INFO, "ready: socket %s, model %s (vocabulary %lld, canvas %d), backend %s, "
         "tp %d, max_batch %d, %s", cfg.socket, model_dir, (long long)L.m.cfg.vocab_size,
         L.m.cfg.canvas_length, backend->name, cfg.tp, cfg.max_batch,
         L.tok ? "tokenizer" : "no tokenizer");
    sd_notify_send("READY=1\nSTATUS=serving");
    /* (the watcher ends by itself within its tick; joined at the end, so
     * that serving does not wait for it) */
    rc_run = dserver_run(srv, &err);
    sigbus_socket[0] = '\0'; /* (the server removes its socket as it goes) */
    if (rc_run < 0) {
        dlog(DG_LOG_ERROR, "%s", err.msg);
        goto out;
    }
    status = 0; /* (STOPPING=1 went as the shutdown began: server.c) */
out:
    startup_watch_stop();
    dserver_destroy(srv);
    dsched_destroy(sched);
    dlog_set_error_hook(NULL, NULL);
    dmetrics_destroy(metrics); /* writes what is queued and the stop event */
    if (backend)
        backend->ops->destroy(backend);
    if (event_fd >= 0)
        close(event_fd);
    json_decref(info);
    unload(&L);
    dlog(status == 0 ? DG_LOG_INFO : DG_LOG_ERROR, "dgemmad %s", status == 0 ? "stopped"
                                                                             : "failed");
    dlog_close();
    return status;
}
