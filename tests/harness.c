/* harness.c - see harness.h. */
#include "tests/harness.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int n_pass, n_fail, n_skip;
static char fail_msg[2048], skip_msg[1024];
static char program[256];
static char scratch[512];
static char *paths[4096]; /* every test_path() result, alive until test_finish() */
static size_t n_paths;

/* Standard output line-buffered before main runs (nothing has been
 * written yet): a program the runner kills at its time limit leaves every
 * line it printed in its log, not a lost buffer (run 56: a case cut at
 * 300 s showed none of its progress). */
__attribute__((constructor)) static void line_buffered(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
}

int test_fail(const char *file, int line, const char *fmt, ...)
{
    if (!fail_msg[0]) {
        int off = snprintf(fail_msg, sizeof fail_msg, "%s:%d: ", file, line);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fail_msg + off, sizeof fail_msg - (size_t)off, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static const char *prog_name(void)
{
    if (!program[0]) {
        char buf[512];
        ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
        const char *base = "test";
        if (n > 0) {
            buf[n] = '\0';
            base = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
        }
        snprintf(program, sizeof program, "%s", base);
    }
    return program;
}

int test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_msg, sizeof skip_msg, fmt, ap);
    va_end(ap);
    return 0;
}

void test_run(const char *name, int (*fn)(void))
{
    int r;

    fail_msg[0] = '\0';
    skip_msg[0] = '\0';
    r = fn();
    if (r == 0 && !fail_msg[0] && skip_msg[0]) {
        n_skip++;
        printf("skip %s/%s: %s\n", prog_name(), name, skip_msg);
    } else if (r == 0 && !fail_msg[0]) {
        n_pass++;
        printf("ok %s/%s\n", prog_name(), name);
    } else {
        n_fail++;
        printf("not ok %s/%s: %s\n", prog_name(), name, fail_msg[0] ? fail_msg : "failed");
    }
    fflush(stdout);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int test_finish(void)
{
    printf("# %s: %d passed, %d failed, %d skipped\n", prog_name(), n_pass, n_fail, n_skip);
    if (scratch[0] && !n_fail)  /* keep the evidence when something failed */
        nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    else if (scratch[0])
        printf("# scratch files kept in %s\n", scratch);
    for (size_t i = 0; i < n_paths; i++)
        free(paths[i]);
    n_paths = 0;
    return n_fail ? 1 : 0;
}

const char *test_tmpdir(void)
{
    char *dir = scratch;
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof scratch, "%s/dgemma-%s-XXXXXX", base && *base ? base : "/tmp",
                 prog_name());
        if (!mkdtemp(dir)) {
            fprintf(stderr, "cannot create a scratch directory under %s: %s\n",
                    base ? base : "/tmp", strerror(errno));
            exit(1);
        }
    }
    return dir;
}

const char *test_path(const char *name)
{
    char *p;
    if (n_paths == sizeof paths / sizeof paths[0]) {
        fprintf(stderr, "test_path: more than %zu paths in one program\n",
                sizeof paths / sizeof paths[0]);
        exit(1);
    }
    if (asprintf(&p, "%s/%s", test_tmpdir(), name) < 0) {
        fprintf(stderr, "test_path: out of memory\n");
        exit(1);
    }
    paths[n_paths++] = p;
    return p;
}

const char *test_pathf(const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return test_path(name);
}

long long test_read_ll(const char *path)
{
    long long v = -1;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}
