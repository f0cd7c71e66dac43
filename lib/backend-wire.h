/*
 * backend-wire.h - a backend call as bytes, for the processes of a
 * multi-process tensor-parallel group: the process that runs the engine
 * (rank 0) sends each call it makes of the backend interface (lib/backend.h)
 * to the others, which make the same call on their own GPU.
 *
 * Layout (native byte order: the group's processes run the same build on
 * the same architecture), every field 8-byte aligned:
 *
 *   header   u32 magic "DGWJ", u32 version 2, u32 kind, u32 n_items,
 *            u64 body bytes, i64 slot, i64 max_positions, i64 max_cl
 *   ENCODE   per item: i32 slot, i32 0, i64 n, then n i32 ids (padded to 8)
 *   DENOISE  per item: i32 slot, i32 cl, i32 self_cond, i32 top_k,
 *            f32 temperature, f32 top_p, u64 seed, u32 canvas_index,
 *            u32 step, i64 n_append, then n_append i32 appended ids
 *            (padded to 8), then cl i32 canvas ids (padded to 8)
 *   CONDITION n_items i32 indexes (padded to 8)
 *   OPEN, CLOSE, QUIT: the header alone (slot, max_positions, max_cl)
 *
 * Decoding checks every length and count against the bytes there are
 * (DG_E_FORMAT, naming the field): a short or damaged message is refused,
 * never read past.
 */
#ifndef DG_BACKEND_WIRE_H
#define DG_BACKEND_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/backend.h"
#include "lib/error.h"

#define DG_WIRE_HEADER_BYTES 48
#define DG_WIRE_MAX_ITEMS 65536
#define DG_WIRE_MAX_IDS (1 << 24)   /* per item */

enum dg_wire_kind {
    DG_WIRE_OPEN = 1,
    DG_WIRE_CLOSE,
    DG_WIRE_ENCODE,
    DG_WIRE_DENOISE,
    DG_WIRE_CONDITION,
    DG_WIRE_QUIT,
};

struct dg_wire_job {
    enum dg_wire_kind kind;
    int slot, max_cl;                  /* OPEN (slot, max_positions, max_cl), CLOSE (slot) */
    int64_t max_positions;
    int n;                             /* items */
    const struct dg_encode_item *enc;  /* ENCODE */
    struct dg_denoise_item *den;       /* DENOISE (outputs unused when encoding) */
    const int *which;                  /* CONDITION */
    void *owned;                       /* decoded: the item arrays (dg_wire_job_free) */
};

/* The job's bytes into *buf (grown as needed: *cap its size, *len the
 * message's).  Errors: DG_E_INVAL (a kind or count outside the limits,
 * appended ids counted but not given), DG_E_NOMEM. */
int dg_wire_encode(const struct dg_wire_job *j, unsigned char **buf, size_t *len, size_t *cap,
                   struct dg_error *err);

/* The whole message's length from its header (the first
 * DG_WIRE_HEADER_BYTES bytes), for a reader that takes the header first.
 * Errors: DG_E_FORMAT (not a header, a body larger than max_bytes). */
int dg_wire_length(const unsigned char *header, size_t max_bytes, size_t *len,
                   struct dg_error *err);

/* The job in buf[0..len): item arrays allocated (free with
 * dg_wire_job_free), ids, appended ids and canvases pointing into buf
 * (which must outlive the job; append NULL where n_append is 0); denoise
 * outputs NULL.  Errors: DG_E_FORMAT, DG_E_NOMEM. */
int dg_wire_decode(const unsigned char *buf, size_t len, struct dg_wire_job *j,
                   struct dg_error *err);

void dg_wire_job_free(struct dg_wire_job *j);

#endif
