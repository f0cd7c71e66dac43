/* safetensors.c - see safetensors.h for the rules enforced here. */
#include "lib/safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json-util.h"

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Parse one header entry into t (name already set). */
static int parse_entry(const char *what, const char *name, json_t *v, uint64_t data_offset,
                       uint64_t data_size, struct dg_st_tensor *t, struct dg_error *err)
{
    json_t *dtype, *shape, *offs, *x;
    const char *key;
    size_t i;
    uint64_t nbytes, elsize;

    if (!json_is_object(v))
        return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s': entry is %s, not an object", what,
                            name, dg_json_type_name(v));
    json_object_foreach(v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s': unexpected key '%s'", what,
                                name, key);
    }
    dtype = json_object_get(v, "dtype");
    shape = json_object_get(v, "shape");
    offs = json_object_get(v, "data_offsets");
    if (!dtype || !shape || !offs)
        return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s': missing '%s'", what, name,
                            !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!json_is_string(dtype))
        return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s': dtype is %s, not a string", what,
                            name, dg_json_type_name(dtype));
    t->dtype = dg_dtype_parse(json_string_value(dtype));
    if (t->dtype == DG_DTYPE_INVALID)
        return dg_error_set(err, DG_E_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", what, name,
                            json_string_value(dtype));
    elsize = dg_dtype_size(t->dtype);

    if (!json_is_array(shape) || json_array_size(shape) > DG_ST_MAX_DIMS)
        return dg_error_set(err, DG_E_FORMAT,
                            "%s: tensor '%s': shape must be an array of at most %d non-negative "
                            "integers", what, name, DG_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    t->nelem = 1;
    json_array_foreach(shape, i, x) {
        long long d;
        if (!json_is_integer(x) || (d = json_integer_value(x)) < 0)
            return dg_error_set(err, DG_E_FORMAT,
                                "%s: tensor '%s': shape must be an array of at most %d "
                                "non-negative integers", what, name, DG_ST_MAX_DIMS);
        t->shape[i] = d;
        if (__builtin_mul_overflow(t->nelem, (uint64_t)d, &t->nelem))
            return dg_error_set(err, DG_E_RANGE, "%s: tensor '%s': element count overflows",
                                what, name);
    }
    if (__builtin_mul_overflow(t->nelem, elsize, &nbytes))
        return dg_error_set(err, DG_E_RANGE, "%s: tensor '%s': byte size overflows", what, name);

    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) ||
        json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0)
        return dg_error_set(err, DG_E_FORMAT,
                            "%s: tensor '%s': data_offsets must be two non-negative integers "
                            "[begin, end]", what, name);
    t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (t->begin > t->end)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: tensor '%s': non-monotonic data range [%llu, %llu)", what, name,
                            (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != nbytes)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: tensor '%s': %s with %llu elements needs %llu bytes but "
                            "data_offsets span %llu", what, name, dg_dtype_name(t->dtype),
                            (unsigned long long)t->nelem, (unsigned long long)nbytes,
                            (unsigned long long)(t->end - t->begin));
    if (t->end > data_size)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: tensor '%s': data range [%llu, %llu) runs past the end of the "
                            "data section (%llu bytes; file truncated?)", what, name,
                            (unsigned long long)t->begin, (unsigned long long)t->end,
                            (unsigned long long)data_size);
    if ((data_offset + t->begin) % elsize != 0)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: tensor '%s': data offset %llu is misaligned for %s "
                            "(%llu-byte elements)", what, name,
                            (unsigned long long)(data_offset + t->begin), dg_dtype_name(t->dtype),
                            (unsigned long long)elsize);
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct dg_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The sorted ranges must tile [0, data_size) exactly. */
static int check_tiling(const char *what, const struct dg_st_file *f, struct dg_error *err)
{
    uint64_t covered = 0;
    const char *last = NULL;

    for (size_t i = 0; i < f->n_tensors; i++) {
        const struct dg_st_tensor *t = &f->tensors[i];
        if (t->begin < covered)
            return dg_error_set(err, DG_E_RANGE,
                                "%s: tensors '%s' and '%s' overlap (bytes [%llu, %llu) of the "
                                "data section)", what, last, t->name,
                                (unsigned long long)t->begin, (unsigned long long)covered);
        if (t->begin > covered)
            return dg_error_set(err, DG_E_RANGE,
                                "%s: %llu unused bytes before tensor '%s' (the data section "
                                "must have no holes)", what,
                                (unsigned long long)(t->begin - covered), t->name);
        if (t->end > covered) {
            covered = t->end;
            last = t->name;
        }
    }
    if (covered != f->data_size)
        return dg_error_set(err, DG_E_RANGE, "%s: %llu trailing bytes after the last tensor", what,
                            (unsigned long long)(f->data_size - covered));
    return 0;
}

int dg_st_parse(const void *buf, size_t size, const char *what, struct dg_st_file *out,
                struct dg_error *err)
{
    const unsigned char *base = buf;
    struct dg_st_file f = {0};
    json_t *hdr = NULL, *v;
    const char *key;
    int rc = 0;
    char ctx[256];

    memset(out, 0, sizeof *out);
    if (size < 8)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: file is %zu bytes, too short for the 8-byte header length", what,
                            size);
    f.header_len = load_le64(base);
    if (f.header_len > size - 8)
        return dg_error_set(err, DG_E_RANGE,
                            "%s: header length %llu runs past the end of the file (%zu bytes; "
                            "truncated?)", what, (unsigned long long)f.header_len, size);
    if (f.header_len > DG_ST_HEADER_MAX)
        return dg_error_set(err, DG_E_RANGE, "%s: header length %llu exceeds the limit of %u bytes",
                            what, (unsigned long long)f.header_len, DG_ST_HEADER_MAX);
    f.data_offset = 8 + f.header_len;
    f.data_size = size - f.data_offset;

    snprintf(ctx, sizeof ctx, "%s: header", what);
    hdr = dg_json_parse((const char *)base + 8, (size_t)f.header_len, ctx, err);
    if (!hdr)
        return dg_json_parse_status(err);
    if (!json_is_object(hdr)) {
        rc = dg_error_set(err, DG_E_FORMAT, "%s: header is %s, not a JSON object", what,
                          dg_json_type_name(hdr));
        goto out;
    }

    f.tensors = calloc(json_object_size(hdr) + 1, sizeof *f.tensors);
    if (!f.tensors) {
        rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory for the tensor table", what);
        goto out;
    }
    json_object_foreach(hdr, key, v) {
        struct dg_st_tensor *t;
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                rc = dg_error_set(err, DG_E_FORMAT, "%s: __metadata__ is %s, not an object", what,
                                  dg_json_type_name(v));
                goto out;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = dg_error_set(err, DG_E_FORMAT,
                                      "%s: __metadata__.%.64s is %s; values must be strings",
                                      what, mk, dg_json_type_name(mv));
                    goto out;
                }
            }
            continue;
        }
        if (key[0] == '\0' || strlen(key) > DG_ST_NAME_MAX) {
            rc = dg_error_set(err, DG_E_FORMAT, "%s: tensor name is empty or longer than %d bytes",
                              what, DG_ST_NAME_MAX);
            goto out;
        }
        t = &f.tensors[f.n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
            goto out;
        }
        f.n_tensors++;
        rc = parse_entry(what, key, v, f.data_offset, f.data_size, t, err);
        if (rc)
            goto out;
        t->data = base + f.data_offset + t->begin;
    }
    qsort(f.tensors, f.n_tensors, sizeof *f.tensors, cmp_by_offset);
    rc = check_tiling(what, &f, err);
out:
    json_decref(hdr);
    if (rc)
        dg_st_file_free(&f);
    else
        *out = f;
    return rc;
}

void dg_st_file_free(struct dg_st_file *f)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}
