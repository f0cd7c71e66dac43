/*
 * fileio.h - small-file reading and read-only mappings of large files.
 */
#ifndef DG_FILEIO_H
#define DG_FILEIO_H

#include <stddef.h>

#include "lib/error.h"

/* Read the whole file at path into a fresh NUL-terminated buffer.  Files
 * larger than max_bytes are refused (DG_E_RANGE) before anything is read,
 * so a hostile file cannot make us allocate without bound.  On success
 * *out owns the buffer (free() it) and *len excludes the NUL.
 * Errors: DG_E_IO (with strerror) when the file cannot be opened or read,
 * DG_E_MISSING when it does not exist. */
int dg_file_read(const char *path, size_t max_bytes, char **out, size_t *len,
                 struct dg_error *err);

/* A read-only private mapping of a whole file. */
struct dg_mapping {
    void *addr;     /* NULL for an empty file */
    size_t size;
};

/* Map path read-only.  Errors: DG_E_MISSING, DG_E_IO. */
int dg_file_map(const char *path, struct dg_mapping *m, struct dg_error *err);

/* Unmap; safe on a zeroed or already-released mapping. */
void dg_file_unmap(struct dg_mapping *m);

/* The file whose live mapping (dg_file_map) holds addr, or NULL.  Safe
 * in a signal handler (no locks, no allocation): a SIGBUS there means the
 * file shrank under the mapping.  The first DG_MAPPINGS_NAMED mappings at
 * a time are known; the path may be cut to DG_MAPPING_PATH_MAX - 1 bytes. */
#define DG_MAPPINGS_NAMED 64
#define DG_MAPPING_PATH_MAX 256
const char *dg_file_mapping_at(const void *addr);

/* Join dir and name with exactly one '/' into a fresh string (NULL on
 * allocation failure). */
char *dg_path_join(const char *dir, const char *name);

/* The directory path lies in, into buf (n bytes, cut to fit): "." for a
 * bare name, "/" for one at the root. */
void dg_path_dir(const char *path, char *buf, size_t n);

/* Whether this process may create path's file in its directory (write and
 * search permission there): 0, or DG_E_IO "WHAT PATH: cannot create it in
 * DIR: reason". */
int dg_path_creatable(const char *what, const char *path, struct dg_error *err);

/* Write text and a newline to dir/name: into dir/name.tmp, renamed over
 * dir/name once whole, so that a failure leaves an old dir/name as it was
 * and a symlink there is replaced, not written through.  Errors:
 * DG_E_NOMEM, DG_E_IO (naming the path; the .tmp removed). */
int dg_write_text(const char *dir, const char *name, const char *text, struct dg_error *err);

/* True if path names an existing regular file (following symlinks). */
int dg_file_exists(const char *path);

#endif
