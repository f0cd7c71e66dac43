/*
 * batch-input.h - the pure parsing steps of `dgemma-client batch`: what an
 * existing output file says is done, what each input line is, and the
 * request body for an input item.  Nothing here does I/O or prints; the
 * command (cmd-batch.c) reads the files, writes the results and talks to
 * the daemon.  Fuzzed by tests/fuzz/fuzz-batch-input.c.
 *
 * Result keys: an item's result is keyed by the compact JSON of its "id"
 * (a string id starts with '"', an integer with a digit or '-'); a bad
 * line's result by "line:N".  The two never collide.
 */
#ifndef DG_CLIENT_BATCH_INPUT_H
#define DG_CLIENT_BATCH_INPUT_H

#include <jansson.h>
#include <stddef.h>

/* Scan the output file's bytes buf[0 .. len): sets *keep to the length of
 * its complete lines (through the last '\n'; what follows is a torn last
 * line the caller cuts), and adds to seen (an object: key -> true, or
 * false where that result has an "error") the key of every complete line
 * that is a result object (the first line of a key decides), counting in
 * *failed_before those first seen with an "error".  Lines that are not
 * results are skipped.  Byte-exact: a NUL byte is part of its line (which
 * then is no result).  buf needs no terminator and is only read.  Returns
 * 0, or -1 when out of memory (seen is then incomplete: a result missed
 * would have its line run again). */
int batch_output_scan(const char *buf, size_t len, json_t *seen, int *failed_before,
                      size_t *keep);

/* What one input line is. */
enum batch_line_kind {
    BATCH_LINE_BLANK = 0, /* nothing but spaces, tabs and line ends: not counted */
    BATCH_LINE_ITEM,      /* a request to run: obj and key are the caller's */
    BATCH_LINE_DONE,      /* its result is in the output already */
    BATCH_LINE_BAD,       /* code and msg: its {"line": N, "error"} result is due */
};

struct batch_line {
    enum batch_line_kind kind;
    json_t *obj;          /* ITEM: the line's object (a reference the caller owns) */
    char *key;            /* ITEM: its result key (malloc'd, the caller frees) */
    int failed;           /* DONE: the result already there is an error */
    const char *code;     /* BAD: "bad_line" or "duplicate_id" */
    char msg[300];        /* BAD: why, valid UTF-8 (a byte that was not shows as '?') */
};

/* The state across the lines of one input file. */
struct batch_input {
    json_t *first_line;   /* id key -> the line it was first on */
    const json_t *seen;   /* the output's keys (batch_output_scan); not owned */
};

/* Start reading an input against the output's keys seen (kept, not
 * owned).  Returns 0, or -1 when out of memory. */
int batch_input_init(struct batch_input *in, const json_t *seen);
void batch_input_free(struct batch_input *in);

/* Classify input line number ln (1-based, blank lines counted) of n bytes
 * (its '\n' and any trailing '\r's or '\n's are ignored; it need not be
 * terminated and is only read) into *out.  A line of nothing but spaces,
 * tabs and CRs is BLANK, as an empty one is.  A line is BAD when it is not
 * JSON, not an object, has no string or integer "id", or repeats an id of
 * an earlier line; BAD and the lines whose id or "line:N" key is in seen
 * are DONE instead of BAD or ITEM.  Returns 0, or -1 when out of memory
 * (out holds nothing then). */
int batch_input_line(struct batch_input *in, const char *line, size_t n, int ln,
                     struct batch_line *out);

/* The result object for bad line ln: {"line": ln, "error": {"code", "message"}}.
 * NULL when out of memory. */
json_t *batch_line_error(int ln, const char *code, const char *msg);

/* The prompt form of an item. */
enum batch_prompt { BATCH_PROMPT_TEXT = 1, BATCH_PROMPT_MESSAGES, BATCH_PROMPT_IDS };

/* The request for item obj (an ITEM's object), the index-th of the input,
 * with settings (an object, or NULL) applied where the item has none of its
 * own.  On success returns 0 with *kind its prompt form, *prompt a new
 * reference to the prompt's value (a string; the "messages" value, which
 * the daemon checks; a non-empty list of integers in [0, INT32_MAX]) and
 * *extra a new object of the other keys to send: the settings, then the
 * item's own keys but "id", "prompt" and "prompt_ids" (so a chat item's
 * "messages" is in it), "batch": true, "stream": false and "tag":
 * "b<index>".  The request is {"v": 1, "op": "generate", <prompt key>:
 * *prompt} updated with *extra.  Returns 1 with *why set (static text) and
 * nothing held for an item whose prompt is missing or ill-formed, or that
 * sets a key of the protocol's framing ("v", "op", "tag", "stream": the
 * batch's own); -1 when out of memory. */
int batch_request_parts(const json_t *obj, const json_t *settings, size_t index,
                        enum batch_prompt *kind, json_t **prompt, json_t **extra,
                        const char **why);

/* Whether the daemon's refusal (error code and msg) of item obj's request
 * is the fault of settings (the flags' settings object; may be NULL), not
 * of the line: then the batch stops instead of spending every line on it.
 * The daemon checks a request's settings as one object (the flags' with
 * the line's own over them) and its message starts with the setting it
 * refuses ("max_denoising_steps: 5000 is out of range ...", "stop[0]: ..."),
 * or, for the temperature schedule, "t_min X, t_max Y: ..." (t_min, t_max
 * and max_denoising_steps weighed together).  So a bad_request is the
 * flags' when the setting it names comes from the flags alone (the line
 * does not set it), and a schedule refusal when the line sets none of the
 * three and the flags set one: the daemon's defaults and the flags then
 * make that refusal whatever the line.  Any other refusal (a message that
 * names no setting of the flags, a setting the line gives itself) is the
 * line's.  Returns the setting's name (a key of settings, valid while
 * settings lives), or NULL. */
const char *batch_flag_refused(const json_t *obj, const json_t *settings, const char *code,
                               const char *msg);

#endif
