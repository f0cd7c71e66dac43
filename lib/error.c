/* error.c - see error.h. */
#include "lib/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[DG_STATUS_COUNT] = {
    [DG_OK] = "ok",
    [DG_E_INVAL] = "invalid_argument",
    [DG_E_NOMEM] = "out_of_memory",
    [DG_E_IO] = "io",
    [DG_E_FORMAT] = "format",
    [DG_E_CONFIG] = "config",
    [DG_E_UNSUPPORTED] = "unsupported",
    [DG_E_DTYPE] = "dtype",
    [DG_E_SHAPE] = "shape",
    [DG_E_MISSING] = "missing",
    [DG_E_EXTRA] = "extra",
    [DG_E_RANGE] = "range",
    [DG_E_INTERNAL] = "internal",
    [DG_E_CUDA] = "cuda",
    [DG_E_CUBLAS] = "cublas",
    [DG_E_NCCL] = "nccl",
    [DG_E_NODEV] = "no_device",
    [DG_E_BUSY] = "busy",
};

const char *dg_status_name(int status)
{
    if (status < 0)
        status = -status;
    if (status >= DG_STATUS_COUNT || !status_names[status])
        return "unknown";
    return status_names[status];
}

int dg_error_set(struct dg_error *err, enum dg_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -(int)code;
}

int dg_error_prefix(struct dg_error *err, const char *fmt, ...)
{
    char ctx[DG_ERROR_MSG_MAX], old[DG_ERROR_MSG_MAX];
    va_list ap;

    if (!err || err->code == DG_OK)
        return -(int)DG_E_INTERNAL;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", ctx, old);
    return -(int)err->code;
}

void dg_error_clear(struct dg_error *err)
{
    if (err) {
        err->code = DG_OK;
        err->msg[0] = '\0';
    }
}
