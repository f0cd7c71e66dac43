/* safetensors-write.c - see safetensors-write.h. */
#include "lib/safetensors-write.h"
#include "lib/json-util.h"
#include "lib/utf8.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct order {
    size_t index;
    const struct dg_st_out_tensor *t;
    uint64_t nbytes;
};

static int cmp_layout(const void *a, const void *b)
{
    const struct order *x = a, *y = b;
    size_t sx = dg_dtype_size(x->t->dtype), sy = dg_dtype_size(y->t->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int dg_st_write(const char *path, const struct dg_st_out_tensor *tensors, size_t n,
                dg_st_fill_fn fill, void *userdata, struct dg_error *err)
{
    struct order *ord = calloc(n ? n : 1, sizeof *ord);
    json_t *hdr = json_object(), *meta = json_object();
    char *text = NULL, *tmp = NULL;
    unsigned char *buf = NULL;
    size_t buf_cap = 0, hlen, padded;
    uint64_t off = 0;
    FILE *f = NULL;
    int rc = 0;

    if (!ord || !hdr || !meta) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct dg_st_out_tensor *t = &tensors[i];
        uint64_t ne = 1;
        if (!t->name || !t->name[0] || dg_dtype_size(t->dtype) == 0 || t->ndim < 0 ||
            t->ndim > DG_ST_MAX_DIMS) {
            rc = dg_error_set(err, DG_E_INVAL, "%s: tensor %zu has no name, dtype or valid rank",
                              path, i);
            goto out;
        }
        if (dg_utf8_valid_prefix((const unsigned char *)t->name, strlen(t->name)) !=
            strlen(t->name)) {
            rc = dg_error_set(err, DG_E_INVAL, "%s: tensor %zu's name is not UTF-8", path, i);
            goto out;
        }
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || __builtin_mul_overflow(ne, (uint64_t)t->shape[d], &ne)) {
                rc = dg_error_set(err, DG_E_INVAL, "%s: tensor '%s' has a bad shape", path, t->name);
                goto out;
            }
        }
        ord[i].index = i;
        ord[i].t = t;
        ord[i].nbytes = ne * dg_dtype_size(t->dtype);
    }
    qsort(ord, n, sizeof *ord, cmp_layout);

    /* every insertion checked: a header short of a dimension or a key
     * would describe other tensors than the data that follows it */
    if (json_object_set_new(meta, "format", json_string("pt")) != 0) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    rc = json_object_set_new(hdr, "__metadata__", meta);
    meta = NULL; /* (set_new takes it, on failure too) */
    if (rc != 0) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct dg_st_out_tensor *t = ord[i].t;
        json_t *shape = json_array(), *e = json_object();
        int bad = !shape || !e;
        for (int d = 0; !bad && d < t->ndim; d++)
            bad = json_array_append_new(shape, json_integer(t->shape[d])) != 0;
        /* (json_object_set_new takes its value, on failure too) */
        if (!bad) {
            bad = json_object_set_new(e, "shape", shape) != 0;
            shape = NULL;
        }
        bad = bad || json_object_set_new(e, "dtype", json_string(dg_dtype_name(t->dtype))) != 0 ||
              json_object_set_new(e, "data_offsets",
                                  json_pack("[II]", (json_int_t)off,
                                            (json_int_t)(off + ord[i].nbytes))) != 0;
        json_decref(shape);
        if (bad) {
            json_decref(e);
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
            goto out;
        }
        if (json_object_get(hdr, t->name)) {
            json_decref(e);
            rc = dg_error_set(err, DG_E_INVAL, "%s: tensor '%s' named twice", path, t->name);
            goto out;
        }
        if (json_object_set_new(hdr, t->name, e) != 0) {
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
            goto out;
        }
        off += ord[i].nbytes;
    }
    /* (dg_json_dumps: jansson's own dump may leave a key out when an
     * allocation fails) */
    text = dg_json_dumps(hdr, JSON_COMPACT);
    if (!text) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory serialising the header", path);
        goto out;
    }
    hlen = strlen(text);
    padded = (hlen + 7) & ~(size_t)7;

    tmp = malloc(strlen(path) + 5);
    if (!tmp) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    sprintf(tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    {
        unsigned char le[8];
        for (int i = 0; i < 8; i++)
            le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        if (write_all(f, le, 8) || write_all(f, text, hlen))
            goto io_error;
        for (size_t i = hlen; i < padded; i++)
            if (fputc(' ', f) == EOF)
                goto io_error;
    }
    for (size_t i = 0; i < n; i++) {
        if (ord[i].nbytes > buf_cap) {
            unsigned char *p = realloc(buf, ord[i].nbytes);
            if (!p) {
                rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory for %llu bytes", path,
                                  (unsigned long long)ord[i].nbytes);
                goto out;
            }
            buf = p;
            buf_cap = ord[i].nbytes;
        }
        if (ord[i].nbytes && (rc = fill(userdata, ord[i].index, buf, ord[i].nbytes, err)) < 0)
            goto out;
        if (write_all(f, buf, ord[i].nbytes))
            goto io_error;
    }
    if (fflush(f) != 0 || ferror(f))
        goto io_error;
    if (fclose(f) != 0) {
        f = NULL;
        goto io_error;
    }
    f = NULL;
    if (rename(tmp, path) != 0) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot rename into place: %s", path, strerror(errno));
        goto out;
    }
    goto out;
io_error:
    rc = dg_error_set(err, DG_E_IO, "%s: write failed: %s", tmp, strerror(errno));
out:
    if (f)
        fclose(f);
    if (rc && tmp)
        remove(tmp);
    free(tmp);
    free(text);
    free(buf);
    free(ord);
    json_decref(meta);
    json_decref(hdr);
    return rc;
}
