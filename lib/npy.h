/*
 * npy.h - NumPy .npy files of float32, for exchanging tensors with
 * reference implementations (dgemma-eval forward, golden fixtures).
 *
 * Written: format 1.0, descr '<f4', C order, header padded to 64 bytes.
 * Read: formats 1.0, 2.0 and 3.0; descr '<f4' (little-endian float32
 * only), fortran_order False, a shape of at most 8
 * dimensions, and exactly the data that shape needs.  Everything else is
 * refused with a message naming the file.
 */
#ifndef DG_NPY_H
#define DG_NPY_H

#include <stdint.h>

#include "lib/error.h"

#define DG_NPY_MAX_DIMS 8

/* Errors: DG_E_IO, DG_E_INVAL (bad shape). */
int dg_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                     struct dg_error *err);

/* Parse an in-memory .npy image; *data points at the first float inside
 * buf.  It need not be 4-byte aligned (the header length is the writer's
 * choice): copy the floats out with memcpy.  Errors: DG_E_FORMAT,
 * DG_E_UNSUPPORTED (dtype, order), DG_E_RANGE (data size). */
int dg_npy_parse_f32(const void *buf, size_t size, const char *what, const void **data,
                     int *ndim, int64_t *shape, struct dg_error *err);

/* Read path into a fresh buffer (*data, free() it).  Files above
 * max_bytes are refused.  Errors: as dg_npy_parse_f32, DG_E_IO, DG_E_MISSING. */
int dg_npy_read_f32(const char *path, size_t max_bytes, float **data, int *ndim, int64_t *shape,
                    struct dg_error *err);

#endif
