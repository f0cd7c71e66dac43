/* fileio.c - see fileio.h. */
#include "lib/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int open_error(struct dg_error *err, const char *path, int e)
{
    if (e == ENOENT)
        return dg_error_set(err, DG_E_MISSING, "%s: no such file", path);
    return dg_error_set(err, DG_E_IO, "%s: cannot open: %s", path, strerror(e));
}

int dg_file_read(const char *path, size_t max_bytes, char **out, size_t *len,
                 struct dg_error *err)
{
    struct stat st;
    char *buf;
    size_t got = 0;
    int fd;

    *out = NULL;
    *len = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return open_error(err, path, errno);
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dg_error_set(err, DG_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dg_error_set(err, DG_E_IO, "%s: not a regular file", path);
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        close(fd);
        return dg_error_set(err, DG_E_RANGE, "%s: %lld bytes, more than the %zu allowed", path,
                            (long long)st.st_size, max_bytes);
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return dg_error_set(err, DG_E_NOMEM, "%s: out of memory for %lld bytes", path,
                            (long long)st.st_size + 1);
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return dg_error_set(err, DG_E_IO, "%s: read failed: %s", path, strerror(e));
        }
        if (n == 0)
            break; /* shrank under us: use what we got */
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

/* The live mappings, for dg_file_mapping_at: a slot is claimed by a
 * compare-and-swap of `state` from 0 (free) to 1, published by storing
 * its range after its path, and freed by clearing the range first.  A
 * reader in a signal handler sees a range only after its path. */
static struct {
    atomic_int state;                 /* 0 free, 1 claimed */
    atomic_uintptr_t lo, hi;          /* [lo, hi): 0, 0 while not published */
    char path[DG_MAPPING_PATH_MAX];
} mappings[DG_MAPPINGS_NAMED];

static void mapping_add(const char *path, const void *addr, size_t size)
{
    for (int i = 0; i < DG_MAPPINGS_NAMED; i++) {
        int free_ = 0;
        if (atomic_compare_exchange_strong(&mappings[i].state, &free_, 1)) {
            snprintf(mappings[i].path, sizeof mappings[i].path, "%s", path);
            atomic_store(&mappings[i].hi, (uintptr_t)addr + size);
            atomic_store(&mappings[i].lo, (uintptr_t)addr);
            return;
        }
    }
    /* (more live mappings than slots: this one goes unnamed) */
}

static void mapping_remove(const void *addr)
{
    for (int i = 0; i < DG_MAPPINGS_NAMED; i++)
        if (atomic_load(&mappings[i].state) && atomic_load(&mappings[i].lo) == (uintptr_t)addr) {
            atomic_store(&mappings[i].lo, 0);
            atomic_store(&mappings[i].hi, 0);
            atomic_store(&mappings[i].state, 0);
            return;
        }
}

const char *dg_file_mapping_at(const void *addr)
{
    const uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < DG_MAPPINGS_NAMED; i++) {
        const uintptr_t lo = atomic_load(&mappings[i].lo);
        if (lo && a >= lo && a < atomic_load(&mappings[i].hi))
            return mappings[i].path;
    }
    return NULL;
}

int dg_file_map(const char *path, struct dg_mapping *m, struct dg_error *err)
{
    struct stat st;
    int fd;

    m->addr = NULL;
    m->size = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return open_error(err, path, errno);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return dg_error_set(err, DG_E_IO, "%s: not a readable regular file%s%s", path,
                            e ? ": " : "", e ? strerror(e) : "");
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dg_error_set(err, DG_E_IO, "%s: mmap of %lld bytes failed: %s", path,
                                (long long)st.st_size, strerror(e));
        }
        m->addr = p;
        m->size = (size_t)st.st_size;
        mapping_add(path, p, m->size);
    }
    close(fd);
    return 0;
}

void dg_file_unmap(struct dg_mapping *m)
{
    if (m->addr) {
        mapping_remove(m->addr);
        munmap(m->addr, m->size);
    }
    m->addr = NULL;
    m->size = 0;
}

char *dg_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    int slash;
    char *p;

    while (a > 1 && dir[a - 1] == '/')
        a--;
    slash = a > 0 && dir[a - 1] != '/'; /* "/" + "x" is "/x", not "//x" */
    p = malloc(a + (size_t)slash + b + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    if (slash)
        p[a] = '/';
    memcpy(p + a + (size_t)slash, name, b + 1);
    return p;
}

void dg_path_dir(const char *path, char *buf, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else if (slash == path)
        snprintf(buf, n, "/");
    else
        snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

int dg_path_creatable(const char *what, const char *path, struct dg_error *err)
{
    char dir[4096];
    dg_path_dir(path, dir, sizeof dir);
    if (access(dir, W_OK | X_OK) != 0)
        return dg_error_set(err, DG_E_IO, "%s %s: cannot create it in %s: %s", what, path, dir,
                            strerror(errno));
    return 0;
}

int dg_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int dg_write_text(const char *dir, const char *name, const char *text, struct dg_error *err)
{
    char *path = dg_path_join(dir, name), *tmp = NULL;
    FILE *f = NULL;
    int rc = 0, ok;

    if (!path || !(tmp = malloc(strlen(path) + sizeof ".tmp"))) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        goto out;
    }
    sprintf(tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "w"))) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        rc = dg_error_set(err, DG_E_IO, "%s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot rename into place: %s", path,
                          strerror(errno));
        unlink(tmp);
    }
out:
    free(tmp);
    free(path);
    return rc;
}
