/*
 * safetensors-write.h - write a safetensors file, streaming tensor data.
 *
 * Tensors are laid out by decreasing element size, then by name, so every
 * tensor starts aligned to its element size; the header is padded with
 * spaces to a multiple of 8 bytes, as the reference writer does.  The file
 * is written to "<path>.tmp" and renamed into place, so a reader never sees
 * a half-written file.
 */
#ifndef DG_SAFETENSORS_WRITE_H
#define DG_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/safetensors.h"

struct dg_st_out_tensor {
    const char *name;
    enum dg_dtype dtype;
    int ndim;
    int64_t shape[DG_ST_MAX_DIMS];
};

/* Fill buf (nbytes, exactly the tensor's size) with tensor `index`'s data.
 * Return 0 or a negative dg_status (with err set). */
typedef int (*dg_st_fill_fn)(void *userdata, size_t index, void *buf, size_t nbytes,
                             struct dg_error *err);

/* Write n tensors to path.  fill is called once per tensor, in file order,
 * with the index of the tensor in the caller's array.  Errors: DG_E_INVAL
 * (bad dtype/shape/name, a name not UTF-8 or given twice), DG_E_IO,
 * DG_E_NOMEM, or whatever fill returns; on any, path is as it was and
 * no .tmp is left. */
int dg_st_write(const char *path, const struct dg_st_out_tensor *tensors, size_t n,
                dg_st_fill_fn fill, void *userdata, struct dg_error *err);

#endif
