/*
 * json-util.h - typed, bounds-checked reads from jansson values, with
 * errors that name the file and the key path ("config.json:
 * text_config.hidden_size: expected an integer, got a string").
 *
 * Getter convention: returns 1 when the key was present (and *out set),
 * 0 when it is absent or JSON null and not required (*out untouched),
 * negative dg_status on a wrong type, a value out of bounds, or a
 * required key that is absent.  ctx is written right before the key in
 * messages, so it carries its own separator: "config.json: " or
 * "config.json: text_config.".
 */
#ifndef DG_JSON_UTIL_H
#define DG_JSON_UTIL_H

#include <jansson.h>
#include <stddef.h>

#include "lib/error.h"

enum dg_json_need { DG_JSON_OPTIONAL = 0, DG_JSON_REQUIRED = 1 };

/* Parse len bytes as one JSON object or array (duplicate keys rejected,
 * NUL characters rejected, nothing but whitespace after it), with this
 * project's reader (json-load.c), never jansson's, which can corrupt the
 * heap when an allocation fails.  what names the source in errors.
 * Returns a new reference, or NULL with DG_E_FORMAT set on malformed input
 * ("what: malformed JSON at line L column C: why"), DG_E_RANGE for a number
 * too large for an int64 or a double, DG_E_NOMEM when an allocation
 * failed.  err may be NULL. */
json_t *dg_json_parse(const char *buf, size_t len, const char *what, struct dg_error *err);

/* What a loader returns when dg_json_parse (or dg_json_loadb) gave NULL:
 * -err->code (malformed, a number out of range, or out of memory), or
 * -DG_E_FORMAT when err is NULL. */
int dg_json_parse_status(const struct dg_error *err);

/* dg_json_parse with flags given: any of JSON_REJECT_DUPLICATES,
 * JSON_ALLOW_NUL (NUL characters taken in string values, never in keys)
 * and JSON_DECODE_ANY (a scalar at the top level too); other flags are
 * refused with DG_E_INVAL.  Nesting deeper than 64 is malformed. */
json_t *dg_json_loadb(const char *buf, size_t len, size_t flags, const char *what,
                      struct dg_error *err);

/* json_dumps, or NULL when an allocation failed on the way (jansson may
 * then leave a key out or cut it short instead of failing). */
char *dg_json_dumps(const json_t *v, size_t flags);

/* A watch on jansson's allocations on this thread: dg_json_alloc_watch
 * starts it, dg_json_alloc_failed says whether one failed since.  For a
 * value built by many calls left unchecked (a failed json_integer gives
 * NULL, which json_object_set_new then refuses: the key is missing), one
 * check at the end. */
void dg_json_alloc_watch(void);
int dg_json_alloc_failed(void);

/* dg_json_dumps of a value built under a watch: NULL too when any of
 * jansson's allocations failed since dg_json_alloc_watch (the value may
 * then lack a member). */
char *dg_json_dumps_watched(const json_t *v, size_t flags);

/* A JSON string of the C string s for output, where s comes from outside
 * (a file name, a text read from a file) and need not be UTF-8: each byte
 * that does not start a valid sequence becomes U+FFFD.  NULL when out of
 * memory. */
json_t *dg_json_text(const char *s);

/* A JSON number of x, or null where x is infinite or NaN (which JSON cannot
 * hold).  NULL when out of memory. */
json_t *dg_json_number(double x);

/* msg, a dg_json_loadb error about one line of text read alone, in the
 * words of a report that names that line itself: "at line 1 column C"
 * becomes "at column C", and a leading "what: " (what may be NULL) goes
 * too.  A message without that position is copied whole.  Into dst[cap]. */
void dg_json_error_at_column(char *dst, size_t cap, const char *msg, const char *what);

/* Human name of a JSON value's type ("a string", "an object", ...). */
const char *dg_json_type_name(const json_t *v);

int dg_json_get_int(const json_t *obj, const char *key, long long lo, long long hi,
                    enum dg_json_need need, const char *ctx, long long *out,
                    struct dg_error *err);

/* Accepts JSON integers and reals; rejects non-finite results. */
int dg_json_get_real(const json_t *obj, const char *key, double lo, double hi,
                     enum dg_json_need need, const char *ctx, double *out,
                     struct dg_error *err);

int dg_json_get_bool(const json_t *obj, const char *key, enum dg_json_need need,
                     const char *ctx, int *out, struct dg_error *err);

/* *out points into obj (valid while obj lives). */
int dg_json_get_string(const json_t *obj, const char *key, enum dg_json_need need,
                       const char *ctx, const char **out, struct dg_error *err);

/* An object-valued key; *out borrowed from obj. */
int dg_json_get_object(const json_t *obj, const char *key, enum dg_json_need need,
                       const char *ctx, json_t **out, struct dg_error *err);

/* An integer or a list of integers in [lo, hi], e.g. eos_token_id.  Stores
 * up to cap values in out[] and their count in *n; more than cap values is
 * an error. */
int dg_json_get_int_list(const json_t *obj, const char *key, long long lo, long long hi,
                         enum dg_json_need need, const char *ctx, long long *out, int cap,
                         int *n, struct dg_error *err);

#endif
