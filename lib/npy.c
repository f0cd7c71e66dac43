/* npy.c - see npy.h. */
#include "lib/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"

int dg_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                     struct dg_error *err)
{
    char hdr[512], dims[300] = "";
    size_t off = 0, hlen, total;
    uint64_t n = 1;
    FILE *f;

    if (ndim < 0 || ndim > DG_NPY_MAX_DIMS)
        return dg_error_set(err, DG_E_INVAL, "%s: %d dimensions", path, ndim);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dg_error_set(err, DG_E_INVAL, "%s: negative dimension", path);
        n *= (uint64_t)shape[i];
        off += (size_t)snprintf(dims + off, sizeof dims - off, "%lld,%s", (long long)shape[i],
                                i + 1 < ndim ? " " : "");
    }
    if (ndim > 1)
        dims[strlen(dims) - 1] = '\0'; /* (a, b) has no trailing comma; (a,) keeps it */
    snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    hlen = strlen(hdr);
    total = (10 + hlen + 1 + 63) / 64 * 64; /* magic 6 + version 2 + len 2 + header + '\n' */
    memset(hdr + hlen, ' ', total - 10 - hlen - 1);
    hdr[total - 10 - 1] = '\n';
    f = fopen(path, "wb");
    if (!f)
        return dg_error_set(err, DG_E_IO, "%s: cannot create: %s", path, strerror(errno));
    {
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 (unsigned char)((total - 10) & 0xff),
                                 (unsigned char)((total - 10) >> 8)};
        int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, total - 10, f) == total - 10 &&
                 fwrite(data, sizeof(float), (size_t)n, f) == (size_t)n;
        ok = (fclose(f) == 0) && ok;
        if (!ok)
            return dg_error_set(err, DG_E_IO, "%s: write failed", path);
    }
    return 0;
}

/* Find 'key': in the header dict and return a pointer just past the colon. */
static const char *dict_value(const char *h, size_t n, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 2 < n; i++) {
        if ((h[i] == '\'' || h[i] == '"') && memcmp(h + i + 1, key, kl) == 0 &&
            h[i + 1 + kl] == h[i]) {
            const char *p = h + i + 2 + kl;
            while (p < h + n && (*p == ' '))
                p++;
            if (p < h + n && *p == ':')
                return p + 1;
        }
    }
    return NULL;
}

int dg_npy_parse_f32(const void *buf, size_t size, const char *what, const void **data,
                     int *ndim, int64_t *shape, struct dg_error *err)
{
    const unsigned char *b = buf;
    size_t hlen, hstart;
    const char *h, *v, *end;
    uint64_t n = 1;

    if (size < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return dg_error_set(err, DG_E_FORMAT, "%s: not a .npy file (bad magic)", what);
    if (b[6] == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hstart = 10;
    } else if (b[6] == 2 || b[6] == 3) {
        if (size < 12)
            return dg_error_set(err, DG_E_FORMAT, "%s: truncated header", what);
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hstart = 12;
    } else {
        return dg_error_set(err, DG_E_FORMAT, "%s: unknown .npy version %d.%d", what, b[6], b[7]);
    }
    if (hlen > size - hstart)
        return dg_error_set(err, DG_E_FORMAT, "%s: header length %zu runs past the file", what,
                            hlen);
    h = (const char *)b + hstart;
    end = h + hlen;

    v = dict_value(h, hlen, "descr");
    if (!v)
        return dg_error_set(err, DG_E_FORMAT, "%s: header has no 'descr'", what);
    while (v < end && *v == ' ')
        v++;
    if (end - v < 5 || !(memcmp(v, "'<f4'", 5) == 0 || memcmp(v, "\"<f4\"", 5) == 0))
        return dg_error_set(err, DG_E_UNSUPPORTED, "%s: dtype is not little-endian float32 ('<f4')",
                            what);
    v = dict_value(h, hlen, "fortran_order");
    if (!v)
        return dg_error_set(err, DG_E_FORMAT, "%s: header has no 'fortran_order'", what);
    while (v < end && *v == ' ')
        v++;
    if (end - v < 5 || memcmp(v, "False", 5) != 0)
        return dg_error_set(err, DG_E_UNSUPPORTED, "%s: Fortran-ordered arrays are not supported",
                            what);
    v = dict_value(h, hlen, "shape");
    if (!v)
        return dg_error_set(err, DG_E_FORMAT, "%s: header has no 'shape'", what);
    while (v < end && *v == ' ')
        v++;
    if (v >= end || *v != '(')
        return dg_error_set(err, DG_E_FORMAT, "%s: shape is not a tuple", what);
    v++;
    *ndim = 0;
    for (;;) {
        unsigned long long d = 0;
        int digits = 0;
        while (v < end && *v == ' ')
            v++;
        if (v < end && *v == ')')
            break;
        while (v < end && *v >= '0' && *v <= '9' && digits < 19) {
            d = d * 10 + (unsigned long long)(*v - '0');
            v++;
            digits++;
        }
        if (!digits || *ndim == DG_NPY_MAX_DIMS || d > (1ull << 40))
            return dg_error_set(err, DG_E_FORMAT, "%s: bad shape entry", what);
        shape[(*ndim)++] = (int64_t)d;
        if (__builtin_mul_overflow(n, d, &n))
            return dg_error_set(err, DG_E_FORMAT, "%s: shape overflows", what);
        while (v < end && *v == ' ')
            v++;
        if (v < end && *v == ',') {
            v++;
            continue;
        }
        if (v < end && *v == ')')
            break;
        return dg_error_set(err, DG_E_FORMAT, "%s: bad shape tuple", what);
    }
    if (n > (size_t)-1 / 4 || size - hstart - hlen != n * 4)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: shape needs %llu bytes of data but the file holds %zu", what,
                            (unsigned long long)(n * 4), size - hstart - hlen);
    *data = b + hstart + hlen;
    return 0;
}

int dg_npy_read_f32(const char *path, size_t max_bytes, float **data, int *ndim, int64_t *shape,
                    struct dg_error *err)
{
    char *buf;
    size_t len;
    const void *p;
    int rc = dg_file_read(path, max_bytes, &buf, &len, err);
    uint64_t n = 1;

    *data = NULL;
    if (rc)
        return rc;
    rc = dg_npy_parse_f32(buf, len, path, &p, ndim, shape, err);
    if (rc == 0) {
        for (int i = 0; i < *ndim; i++)
            n *= (uint64_t)shape[i];
        *data = malloc(n ? n * 4 : 4);
        if (!*data)
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
        else
            memcpy(*data, p, n * 4);
    }
    free(buf);
    return rc;
}
