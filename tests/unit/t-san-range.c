/*
 * t-san-range.c - the loops left uninstrumented (lib/san-range.h) are
 * still checked by the sanitizer of the build.
 *
 * ASan: each case runs the function in a child process over buffers of
 * which one is a heap block one element short, and expects ASan's report
 * of a heap overflow; and over whole buffers, expecting a clean exit.
 * TSan: a thread writes the product's input, unsynchronised, before the
 * product reads it, and the child must end with TSan's report of the
 * race; with a join between them, cleanly.  In other builds there is
 * nothing to check: the cases skip.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cpu-forward.h"
#include "lib/dtype.h"
#include "lib/ref-ops.h"
#include "lib/san-range.h"
#include "tests/harness.h"

#if defined(DG_SAN_ADDRESS) || defined(DG_SAN_THREAD)
static char ERR[1 << 16];

enum { R = 6, C = 20, T = 5 };

/* Run fn(which) in a child with its stderr in err; 0 when it exited 0, 1
 * when it ended otherwise, -1 when it could not be run. */
static int run_child(void (*fn)(int), int which, char *err, size_t size)
{
    int fd[2], st;
    ssize_t n;
    size_t len = 0;
    pid_t pid;
    if (pipe(fd) != 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn(which);
        _exit(0);
    }
    close(fd[1]);
    while (len + 1 < size && (n = read(fd[0], err + len, size - 1 - len)) > 0)
        len += (size_t)n;
    err[len] = '\0';
    close(fd[0]);
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

#endif

#ifdef DG_SAN_ADDRESS

/* A copy of n bytes of src in a block of exactly n - short_by bytes (the
 * rest of src is not copied); never NULL. */
static void *block(const void *src, size_t n, size_t short_by)
{
    unsigned char *p = malloc(n - short_by);
    if (!p)
        abort();
    memcpy(p, src, n - short_by);
    return p;
}

/* The product over a bf16 or E4M3 W (which & 8: E4M3, which & 16: f64),
 * with range (which & 7) one element short: 1 x, 2 y, 3 row_buf, 4 W,
 * 5 the scales; 0 none. */
static void matmul_child(int which)
{
    const int e4m3 = which & 8, f64 = which & 16, bad = which & 7;
    float x[T * C], row[C], scale[R];
    double y[T * R];
    unsigned char w[R * C * 2];
    struct dg_weight W = {.dtype = e4m3 ? DG_DTYPE_F8_E4M3 : DG_DTYPE_BF16, .rows = R,
                          .cols = C, .name = "w", .scale_dtype = DG_DTYPE_F32};
    const size_t w_bytes = (size_t)(R * C) * dg_dtype_size(W.dtype);
    const size_t y_size = f64 ? sizeof(double) : sizeof(float);
    float *xp, *rp;
    void *yp;
    for (int i = 0; i < T * C; i++)
        x[i] = (float)(i % 7) - 3.0f;
    for (size_t i = 0; i < sizeof w; i++)
        w[i] = (unsigned char)(i * 37 % 113);
    for (int i = 0; i < R; i++)
        scale[i] = 0.5f + (float)i;
    memset(y, 0, sizeof y);
    xp = block(x, sizeof x, bad == 1 ? sizeof *x : 0);
    yp = block(y, (size_t)(T * R) * y_size, bad == 2 ? y_size : 0);
    rp = block(row, sizeof row, bad == 3 ? sizeof *row : 0);
    W.data = block(w, w_bytes, bad == 4 ? dg_dtype_size(W.dtype) : 0);
    W.scale = e4m3 ? block(scale, sizeof scale, bad == 5 ? sizeof *scale : 0) : NULL;
    if (f64)
        dg_ref_matmul_f64(yp, xp, T, &W, rp);
    else
        dg_ref_matmul(yp, xp, T, &W, rp);
}

/* The self-conditioning embedding over a model of E alone, with (which)
 * 1 probs, 2 acc, 3 E one element short; 0 none. */
static void soft_embed_child(int which)
{
    enum { V = 9, H = 12, CL = 3 };
    uint16_t e[V * H];
    float probs[CL * V];
    double acc[CL * H];
    struct dg_cpu_model cm = {.nv = V, .embed = {.dtype = DG_DTYPE_BF16, .rows = V, .cols = H,
                                                 .stride = H, .name = "embed"}};
    struct dg_error err;
    void *pp, *ap;
    for (int i = 0; i < V * H; i++)
        e[i] = dg_f32_to_bf16((float)(i % 5) - 2.0f);
    for (int i = 0; i < CL * V; i++)
        probs[i] = 1.0f / V;
    pp = block(probs, sizeof probs, which == 1 ? sizeof *probs : 0);
    ap = block(acc, sizeof acc, which == 2 ? sizeof *acc : 0);
    cm.embed.data = block(e, sizeof e, which == 3 ? sizeof *e : 0);
    if (dg_cpu_soft_embed(&cm, pp, CL, ap, &err) != 0)
        _exit(2);
}

/* Attention of NQ query heads on one KV head (the four-head path) over
 * keys with no mask, with (which) 1 q, 2 out, 3 q_pos, 4 k, 5 v, 6 k_pos,
 * 7 scores one element short; 8: whole buffers, but the heads' KV head
 * outside the slice (kv_base 1: head -1, the row before k); 0 none. */
static void attention_child(int which)
{
    enum { NQ = 4, HD = 8, TQ = 3, TK = 5 };
    float q[TQ * NQ * HD], out[TQ * NQ * HD], k[TK * HD], v[TK * HD], sc[TK];
    int64_t qpos[TQ], kpos[TK];
    float *qp, *op, *kp, *vp, *sp;
    int64_t *qpp, *kpp;
    for (int i = 0; i < TQ * NQ * HD; i++)
        q[i] = (float)(i % 5) * 0.25f - 0.5f;
    for (int i = 0; i < TK * HD; i++)
        k[i] = (float)(i % 3) * 0.5f - 0.5f, v[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < TQ; i++)
        qpos[i] = TK + i;
    for (int i = 0; i < TK; i++)
        kpos[i] = i;
    qp = block(q, sizeof q, which == 1 ? sizeof *q : 0);
    op = block(out, sizeof out, which == 2 ? sizeof *out : 0);
    qpp = block(qpos, sizeof qpos, which == 3 ? sizeof *qpos : 0);
    kp = block(k, sizeof k, which == 4 ? sizeof *k : 0);
    vp = block(v, sizeof v, which == 5 ? sizeof *v : 0);
    kpp = block(kpos, sizeof kpos, which == 6 ? sizeof *kpos : 0);
    sp = block(sc, sizeof sc, which == 7 ? sizeof *sc : 0);
    dg_ref_attention_heads(op, qp, qpp, TQ, kp, vp, kpp, TK, NQ, 0, 1, which == 8, NQ, HD,
                           DG_MASK_NONE, 0, sp);
}

static int expect_report(void (*fn)(int), int which, const char *what)
{
    int rc = run_child(fn, which, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "heap-buffer-overflow"),
           "%s: no ASan report of the short block (child %d): %.400s", what, rc, ERR);
    return 0;
}

static int expect_clean(void (*fn)(int), int which, const char *what)
{
    int rc = run_child(fn, which, ERR, sizeof ERR);
    CHECKF(rc == 0, "%s: whole buffers, child %d: %.400s", what, rc, ERR);
    return 0;
}

static int case_matmul_ranges(void)
{
    static const char *const names[] = {"", "x", "y", "row_buf", "W", "scales"};
    char what[80];
    for (int v = 0; v < 4; v++) {
        const int flags = (v & 1 ? 8 : 0) | (v & 2 ? 16 : 0);
        snprintf(what, sizeof what, "%s %s", flags & 8 ? "e4m3" : "bf16",
                 flags & 16 ? "f64" : "f32");
        if (expect_clean(matmul_child, flags, what))
            return 1;
        for (int bad = 1; bad <= (flags & 8 ? 5 : 4); bad++) {
            snprintf(what, sizeof what, "%s %s, %s short", flags & 8 ? "e4m3" : "bf16",
                     flags & 16 ? "f64" : "f32", names[bad]);
            if (expect_report(matmul_child, flags | bad, what))
                return 1;
        }
    }
    return 0;
}

/* fn(0) exits cleanly, and fn(k) gets ASan's report for each of the
 * n - 1 faults names[k] (names[0]: what fn runs). */
static int expect_each(void (*fn)(int), const char *const *names, int n)
{
    if (expect_clean(fn, 0, names[0]))
        return 1;
    for (int bad = 1; bad < n; bad++)
        if (expect_report(fn, bad, names[bad]))
            return 1;
    return 0;
}

static int case_soft_embed_ranges(void)
{
    static const char *const names[] = {"soft embed", "probs", "acc", "embedding"};
    return expect_each(soft_embed_child, names, 4);
}

static int case_attention_ranges(void)
{
    static const char *const names[] = {"attention", "q",     "out",    "q_pos",
                                        "k",         "v",     "k_pos",  "scores",
                                        "kv head outside the slice"};
    return expect_each(attention_child, names, 9);
}

#else

static int case_matmul_ranges(void)
{
    return test_skip("not an AddressSanitizer build");
}

static int case_soft_embed_ranges(void)
{
    return test_skip("not an AddressSanitizer build");
}

static int case_attention_ranges(void)
{
    return test_skip("not an AddressSanitizer build");
}

#endif

#ifdef DG_SAN_THREAD

static float X[T * C];
static atomic_int written;

static void *write_x(void *arg)
{
    (void)arg;
    for (int i = 0; i < T * C; i++)
        X[i] = (float)(i % 3);
    atomic_store_explicit(&written, 1, memory_order_relaxed);
    return NULL;
}

/* A product over X, which another thread wrote: (which) 0 after joining
 * it, 1 after seeing its relaxed flag only (no order: a race). */
static void race_child(int which)
{
    static float w[R * C], row[C];
    double y[T * R];
    const struct dg_weight W = {.data = w, .dtype = DG_DTYPE_F32, .rows = R, .cols = C,
                                .name = "w"};
    pthread_t th;
    if (pthread_create(&th, NULL, write_x, NULL) != 0)
        _exit(3);
    if (which == 0)
        pthread_join(th, NULL);
    else
        while (!atomic_load_explicit(&written, memory_order_relaxed))
            ;
    dg_ref_matmul_f64(y, X, T, &W, row);
    if (which != 0)
        pthread_join(th, NULL);
    exit(0); /* (not _exit: TSan gives a run with a report its exit status at exit) */
}

static int case_matmul_race(void)
{
    int rc = run_child(race_child, 0, ERR, sizeof ERR);
    CHECKF(rc == 0, "joined writer: child %d: %.400s", rc, ERR);
    rc = run_child(race_child, 1, ERR, sizeof ERR);
    CHECKF(rc == 1 && strstr(ERR, "ThreadSanitizer: data race"),
           "unordered writer: no TSan report (child %d): %.400s", rc, ERR);
    return 0;
}

#else

static int case_matmul_race(void)
{
    return test_skip("not a ThreadSanitizer build");
}

#endif

int main(void)
{
    TEST_CASE(case_matmul_ranges);
    TEST_CASE(case_soft_embed_ranges);
    TEST_CASE(case_attention_ranges);
    TEST_CASE(case_matmul_race);
    return test_finish();
}
