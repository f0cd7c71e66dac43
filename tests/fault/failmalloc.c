/*
 * failmalloc.c - a fault injector for the tests, loaded with LD_PRELOAD
 * into dgemmad (tests/integration/t-faults.c), dgemma-client
 * (t-client-nomem.c) and dgemma-eval (tests/cli/t-eval-nomem.sh).  It does
 * nothing until a test arms it, so the program starts normally:
 *
 *   DG_FAULT_MALLOC_TRIGGER=FILE  while FILE exists, malloc, calloc, realloc,
 *                                 reallocarray, posix_memalign, aligned_alloc,
 *                                 memalign and valloc fail with ENOMEM once
 *                                 in N calls (N: the number written in FILE,
 *                                 100 if none); strdup and the like allocate
 *                                 through malloc and fail with it.
 *   DG_FAULT_WRITE_TRIGGER=FILE   while FILE exists, write, pwrite, pwrite64,
 *   DG_FAULT_WRITE_PATH=PREFIX    writev and pwritev on a descriptor whose
 *                                 /proc/self/fd link begins with PREFIX fail
 *                                 with ENOSPC (a full disk).
 *   DG_FAULT_SEED=S               the seed of the failure sequence (default 1):
 *                                 call k (counted while armed) fails when a
 *                                 hash of (S, k) is 0 modulo N.
 *   DG_FAULT_MALLOC_NTH=K         instead, only allocation call K (counted
 *                                 from 0 while armed) fails; a K past the
 *                                 last call fails none.  A test counts a
 *                                 run's calls with a large K, then makes
 *                                 each of them fail in turn.
 *   DG_FAULT_STATS=FILE           "malloc_failed A write_failed B
 *                                 malloc_calls C" written there at every
 *                                 disarming and at exit.
 *
 * The trigger files are looked at no more often than every 5 ms (a coarse
 * clock read on each call), so the cost while disarmed is one vDSO call.
 * Built without sanitizers as a preloaded library (ASan owns malloc, so it
 * cannot be preloaded into an ASan build).
 *
 * Built with -DDG_FAULT_WRAP it is instead linked into a dgemmad of its
 * own (under AddressSanitizer: $BUILD/tests/fault/dgemmad), into a
 * dgemma-client of its own ($BUILD/tests/fault/dgemma-client) and into
 * $BUILD/tests/fault/ring-client (a round of ring jobs), whose link
 * sends malloc, calloc, realloc, strdup, strndup and posix_memalign here
 * (-Wl,--wrap=NAME); each goes on to __real_NAME, the sanitizer's (or
 * libc's) allocator.  The calls of the program and of the libraries linked
 * into it statically (jansson, libyaml, liburing, SQLite) are counted; those made
 * inside shared libraries (libc's own) are not.  No write faults there.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifdef DG_FAULT_WRAP
/* an allocation function's name in this file: the one the linker's --wrap
 * sends the program's calls to */
#define ALLOC(name) __wrap_##name
#include "tests/fault/alloc-wrap.h"
#define __libc_malloc __real_malloc
#define __libc_calloc __real_calloc
#define __libc_realloc __real_realloc
#else
#define ALLOC(name) name
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
#endif

#define CHECK_PERIOD_NS 5000000LL

struct trigger {
    const char *env;          /* the variable naming the file */
    int inited;
    const char *path;         /* NULL: never armed */
    _Atomic long long next_check_ns;
    _Atomic int armed;
    _Atomic unsigned rate;    /* 1 in rate */
    _Atomic unsigned long long calls, failed;
};

static struct trigger t_malloc = {.env = "DG_FAULT_MALLOC_TRIGGER"};
static struct trigger t_write = {.env = "DG_FAULT_WRITE_TRIGGER"};
static unsigned long long seed = 1;
static long long nth = -1; /* DG_FAULT_MALLOC_NTH, -1: unset */
static const char *write_prefix, *stats_path;
static _Atomic int env_read;

/* A raw write that does not come back through this file's write(). */
static void raw_write(int fd, const char *p, size_t n)
{
    while (n > 0) {
        long w = syscall(SYS_write, fd, p, n);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Append the decimal digits of v to *p (no allocation, no stdio). */
static void put_u64(char **p, unsigned long long v)
{
    char d[24];
    int n = 0;
    do
        d[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    while (n > 0)
        *(*p)++ = d[--n];
}

/* Write the counters to DG_FAULT_STATS (when set). */
static void write_stats(void)
{
    char buf[128], *p = buf;
    int fd;
    if (!stats_path)
        return;
    memcpy(p, "malloc_failed ", 14);
    p += 14;
    put_u64(&p, atomic_load(&t_malloc.failed));
    memcpy(p, " write_failed ", 14);
    p += 14;
    put_u64(&p, atomic_load(&t_write.failed));
    memcpy(p, " malloc_calls ", 14);
    p += 14;
    put_u64(&p, atomic_load(&t_malloc.calls));
    *p++ = '\n';
    fd = (int)syscall(SYS_openat, AT_FDCWD, stats_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                      0644);
    if (fd >= 0) {
        raw_write(fd, buf, (size_t)(p - buf));
        syscall(SYS_close, fd);
    }
}

/* Read the environment once (getenv does not allocate). */
static void read_env(void)
{
    const char *s;
    if (atomic_load_explicit(&env_read, memory_order_acquire))
        return;
    t_malloc.path = getenv(t_malloc.env);
    t_write.path = getenv(t_write.env);
    write_prefix = getenv("DG_FAULT_WRITE_PATH");
    stats_path = getenv("DG_FAULT_STATS");
    if ((s = getenv("DG_FAULT_SEED")) != NULL)
        seed = strtoull(s, NULL, 10);
    if ((s = getenv("DG_FAULT_MALLOC_NTH")) != NULL)
        nth = strtoll(s, NULL, 10);
    atomic_store_explicit(&env_read, 1, memory_order_release);
}

static long long coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether t is armed now: its file is looked at (and its rate read) at
 * most every CHECK_PERIOD_NS, by whichever thread gets there first. */
static int armed(struct trigger *t)
{
    long long now, next;
    read_env();
    if (!t->path)
        return 0;
    now = coarse_ns();
    next = atomic_load_explicit(&t->next_check_ns, memory_order_relaxed);
    if (now >= next &&
        atomic_compare_exchange_strong(&t->next_check_ns, &next, now + CHECK_PERIOD_NS)) {
        int fd = (int)syscall(SYS_openat, AT_FDCWD, t->path, O_RDONLY | O_CLOEXEC);
        int was = atomic_load(&t->armed);
        if (fd >= 0) {
            char b[16];
            long n = syscall(SYS_read, fd, b, sizeof b - 1);
            unsigned rate = 0;
            syscall(SYS_close, fd);
            for (long i = 0; i < n && b[i] >= '0' && b[i] <= '9'; i++)
                rate = rate * 10 + (unsigned)(b[i] - '0');
            atomic_store(&t->rate, rate ? rate : 100);
            atomic_store(&t->armed, 1);
        } else {
            atomic_store(&t->armed, 0);
            if (was)
                write_stats();
        }
    }
    return atomic_load_explicit(&t->armed, memory_order_relaxed);
}

/* splitmix64 */
static unsigned long long mix(unsigned long long x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Whether this call of t's kind should fail (counts it when it does). */
static int should_fail(struct trigger *t)
{
    unsigned long long k;
    unsigned rate;
    if (!armed(t))
        return 0;
    k = atomic_fetch_add(&t->calls, 1);
    if (t == &t_malloc && nth >= 0) {
        if (k != (unsigned long long)nth)
            return 0;
    } else if ((rate = atomic_load(&t->rate)) == 0 || mix(seed * 0x100000001b3ULL + k) % rate != 0) {
        return 0;
    }
    atomic_fetch_add(&t->failed, 1);
    return 1;
}

__attribute__((destructor)) static void at_exit_stats(void)
{
    if (atomic_load(&env_read))
        write_stats();
}

/* ---- allocation ---------------------------------------------------------------- */

/* Whether this allocation should fail; errno is then ENOMEM. */
static int alloc_fails(void)
{
    if (!should_fail(&t_malloc))
        return 0;
    errno = ENOMEM;
    return 1;
}

void *ALLOC(malloc)(size_t n)
{
    if (alloc_fails())
        return NULL;
    return __libc_malloc(n);
}

void *ALLOC(calloc)(size_t n, size_t size)
{
    if (alloc_fails())
        return NULL;
    return __libc_calloc(n, size);
}

void *ALLOC(realloc)(void *p, size_t n)
{
    /* (realloc(p, 0) frees: not a failure point) */
    if (n > 0 && alloc_fails())
        return NULL;
    return __libc_realloc(p, n);
}

#ifdef DG_FAULT_WRAP
char *ALLOC(strdup)(const char *s)
{
    if (alloc_fails())
        return NULL;
    return __real_strdup(s);
}

char *ALLOC(strndup)(const char *s, size_t n)
{
    if (alloc_fails())
        return NULL;
    return __real_strndup(s, n);
}

int ALLOC(posix_memalign)(void **out, size_t align, size_t n)
{
    if (should_fail(&t_malloc))
        return ENOMEM;
    return __real_posix_memalign(out, align, n);
}
#else
void *reallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n * size);
}

void *memalign(size_t align, size_t n)
{
    if (alloc_fails())
        return NULL;
    return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    return memalign(align, n);
}

void *valloc(size_t n)
{
    return memalign((size_t)sysconf(_SC_PAGESIZE), n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p;
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    if (should_fail(&t_malloc))
        return ENOMEM;
    if (!(p = __libc_memalign(align, n)))
        return ENOMEM;
    *out = p;
    return 0;
}
#endif

#ifndef DG_FAULT_WRAP
/* ---- writes ---------------------------------------------------------------------- */

/* Whether a write to fd should fail with ENOSPC now. */
static int write_fails(int fd)
{
    char link[64], *p = link, target[4096];
    long n;
    if (!armed(&t_write) || !write_prefix || !*write_prefix)
        return 0;
    memcpy(p, "/proc/self/fd/", 14);
    p += 14;
    put_u64(&p, (unsigned long long)(unsigned)fd);
    *p = '\0';
    n = syscall(SYS_readlinkat, AT_FDCWD, link, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    if (strncmp(target, write_prefix, strlen(write_prefix)) != 0)
        return 0;
    atomic_fetch_add(&t_write.failed, 1);
    return 1;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);

/* The next definition of name (libc's), looked up on first use. */
#define REAL(name)                                                                         \
    static name##_fn real_##name;                                                          \
    if (!real_##name)                                                                      \
    real_##name = (name##_fn)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *p, size_t n)
{
    REAL(write);
    if (write_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_write(fd, p, n);
}

ssize_t pwrite(int fd, const void *p, size_t n, off_t off)
{
    REAL(pwrite);
    if (write_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_pwrite(fd, p, n, off);
}

ssize_t pwrite64(int fd, const void *p, size_t n, off64_t off)
{
    REAL(pwrite64);
    if (write_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_pwrite64(fd, p, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    REAL(writev);
    if (write_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_writev(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    REAL(pwritev);
    if (write_fails(fd)) {
        errno = ENOSPC;
        return -1;
    }
    return real_pwritev(fd, iov, cnt, off);
}
#endif
