/*
 * safetensors.h - parse and validate one safetensors file held in memory.
 *
 * Layout: u64 little-endian N, then N bytes of UTF-8 JSON (the header),
 * then the data section.  The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to
 * the data section, plus an optional "__metadata__" object of strings.
 *
 * Nothing in the file is trusted.  dg_st_parse accepts a file only if:
 *   - the header fits in the file and under DG_ST_HEADER_MAX bytes, and is
 *     one JSON object with no duplicate keys;
 *   - every entry has exactly the three keys, a known dtype, a shape of at
 *     most DG_ST_MAX_DIMS non-negative integers, and begin <= end;
 *   - end - begin equals the element count times the element size (no
 *     overflow), end lies inside the data section, and the tensor's first
 *     byte is aligned to its element size within the file;
 *   - the ranges, sorted, tile the data section exactly: no overlap, no
 *     hole, no trailing bytes (the safetensors format forbids holes).
 * After a successful parse every tensor's data pointer addresses exactly
 * end - begin readable bytes of buf, so no later read can go out of bounds.
 */
#ifndef DG_SAFETENSORS_H
#define DG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "lib/dtype.h"
#include "lib/error.h"

#define DG_ST_MAX_DIMS 8
#define DG_ST_HEADER_MAX (100u * 1000u * 1000u) /* the reference implementation's limit */
#define DG_ST_NAME_MAX 1024

struct dg_st_tensor {
    char *name;
    enum dg_dtype dtype;
    int ndim;
    int64_t shape[DG_ST_MAX_DIMS];
    uint64_t nelem;
    uint64_t begin, end;          /* relative to the data section */
    const unsigned char *data;    /* first byte, inside the parsed buffer */
};

struct dg_st_file {
    size_t n_tensors;
    struct dg_st_tensor *tensors; /* sorted by data offset */
    uint64_t header_len;
    uint64_t data_offset;         /* 8 + header_len */
    uint64_t data_size;
};

/* Parse buf[0..size) as a safetensors file.  what names the file in error
 * messages.  On success *out owns its allocations (dg_st_file_free) and
 * points into buf, which must outlive it.  On failure *out is left empty.
 * Errors: DG_E_FORMAT (malformed header or entry), DG_E_RANGE (lengths or
 * offsets outside the file, overlap, holes, misalignment, a number past an
 * int64 or a double), DG_E_NOMEM. */
int dg_st_parse(const void *buf, size_t size, const char *what, struct dg_st_file *out,
                struct dg_error *err);

void dg_st_file_free(struct dg_st_file *f);

#endif
