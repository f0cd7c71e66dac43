/* fileio.c - see fileio.h. */
#include "lib/fileio.h"

#include <errno.h>
#include <fcntl.h>
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
        return dg_error_set(err, DG_E_NOMEM, "%s: cannot allocate %lld bytes", path,
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
    }
    close(fd);
    return 0;
}

void dg_file_unmap(struct dg_mapping *m)
{
    if (m->addr)
        munmap(m->addr, m->size);
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

int dg_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int dg_write_text(const char *dir, const char *name, const char *text, struct dg_error *err)
{
    char *path = dg_path_join(dir, name);
    FILE *f;
    int ok;

    if (!path)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    f = fopen(path, "w");
    if (!f) {
        int rc = dg_error_set(err, DG_E_IO, "%s: cannot create: %s", path, strerror(errno));
        free(path);
        return rc;
    }
    ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        int rc = dg_error_set(err, DG_E_IO, "%s: write failed", path);
        free(path);
        return rc;
    }
    free(path);
    return 0;
}
