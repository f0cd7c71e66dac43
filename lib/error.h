/*
 * error.h - the error type every lib/ function reports through.
 *
 * Convention (after liburing's -errno): a fallible function returns 0 on
 * success or a negative dg_status (-DG_E_FORMAT, ...) on failure, and, when
 * the caller passed a struct dg_error, fills it with the same code and a
 * human message that names the file, tensor or key at fault.  lib/ never
 * prints and never exits; what to do with an error is the caller's call.
 *
 * The status names (dg_status_name) are stable: they appear in logs, in the
 * daemon's protocol errors and in tests.  Append new codes at the end.
 */
#ifndef DG_ERROR_H
#define DG_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dg_status {
    DG_OK = 0,
    DG_E_INVAL,       /* bad argument from the caller */
    DG_E_NOMEM,       /* allocation failed */
    DG_E_IO,          /* open/read/stat/mmap failed */
    DG_E_FORMAT,      /* malformed file contents: JSON, safetensors header */
    DG_E_CONFIG,      /* config value missing, out of range or inconsistent */
    DG_E_UNSUPPORTED, /* well-formed but not something this engine runs */
    DG_E_DTYPE,       /* tensor dtype not accepted where it is used */
    DG_E_SHAPE,       /* tensor shape does not match the config */
    DG_E_MISSING,     /* a required tensor or file is absent */
    DG_E_EXTRA,       /* a tensor nobody asked for */
    DG_E_RANGE,       /* an offset or length outside its buffer */
    DG_E_INTERNAL,    /* a broken invariant inside dgemma */
    DG_E_CUDA,        /* CUDA runtime error */
    DG_E_CUBLAS,      /* cuBLAS error */
    DG_E_NCCL,        /* NCCL error */
    DG_E_NODEV,       /* no usable GPU */
    DG_E_BUSY,        /* every slot or queue place is taken; try again later */
    DG_STATUS_COUNT
};

#define DG_ERROR_MSG_MAX 1024

struct dg_error {
    enum dg_status code;
    char msg[DG_ERROR_MSG_MAX];
};

/* Stable lower-case name of a status ("format", "shape", ...); "unknown"
 * for values outside the enum. */
const char *dg_status_name(int status);

/* Record an error: sets err->code and formats err->msg (truncated to fit).
 * err may be NULL.  Returns -code, so a caller can write
 *     return dg_error_set(err, DG_E_FORMAT, "%s: bad header", path); */
int dg_error_set(struct dg_error *err, enum dg_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepend context to an error already recorded: "ctx: old message".
 * Keeps the code.  Returns -err->code (or -DG_E_INTERNAL if err holds no
 * error).  err may be NULL, in which case it returns -DG_E_INTERNAL. */
int dg_error_prefix(struct dg_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clear to DG_OK and an empty message. err may be NULL. */
void dg_error_clear(struct dg_error *err);

#ifdef __cplusplus
}
#endif

#endif
