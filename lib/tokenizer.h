/*
 * tokenizer.h - Hugging Face tokenizer.json (BPE) in C, exact to the
 * reference implementation (the Rust `tokenizers` library).
 *
 * Pipeline (read from the file, never hard-coded):
 *   encode(text):
 *     1. split the raw text on added tokens: leftmost-longest match among
 *        the added tokens that are not `normalized` (special or not; with
 *        DG_TOK_SPECIAL_AS_TEXT, tokens flagged `special` are not matched);
 *     2. normalizer on the pieces between matches (Replace, Prepend,
 *        Sequence); then the `normalized` added tokens are matched;
 *     3. pre-tokenizer (Split on a string, Sequence) into words;
 *     4. BPE per word: code points to vocabulary ids (byte fallback to
 *        <0xXX>, else <unk>, fused), then merges by rank, lowest first,
 *        leftmost on ties (a heap: O(n log n) on a whole document);
 *     5. post-processor (TemplateProcessing: e.g. <bos> $A) when asked.
 *   decode(ids): ids to token strings (specials dropped when asked, ids
 *     outside the vocabulary skipped), then the decoder chain (Replace,
 *     ByteFallback: a run of byte tokens becomes its UTF-8 text, or one
 *     U+FFFD per byte if invalid, Fuse, Strip).
 * Anything else in the file is refused at load time with a message naming
 * the component, so the tokenizer never silently differs from the reference.
 *
 * A loaded tokenizer is immutable: any number of threads may encode and
 * decode with it at once.
 */
#ifndef DG_TOKENIZER_H
#define DG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "lib/error.h"

struct dg_tokenizer;

/* A growable array of ids. */
struct dg_ids {
    int32_t *v;
    size_t n, cap;
};

/* A growable byte string (always NUL-terminated; may contain NULs). */
struct dg_buf {
    char *s;
    size_t n, cap;
};

void dg_ids_free(struct dg_ids *a);
void dg_buf_free(struct dg_buf *b);
/* Append n ids to a, or n bytes to b (which stays NUL-terminated):
 * 0, or -1 with a or b as it was when there is no memory. */
int dg_ids_append(struct dg_ids *a, const int32_t *ids, size_t n);
int dg_buf_append(struct dg_buf *b, const char *s, size_t n);

#define DG_TOKENIZER_JSON_MAX (256u << 20)

/* Load tokenizer.json at path, and tokenizer_config.json (config_path; may
 * be NULL, or name a missing file) for bos/eos names and add_bos_token.
 * Errors: DG_E_IO, DG_E_MISSING, DG_E_FORMAT (malformed JSON, duplicate
 * or inconsistent tokens, merges that produce unknown tokens), DG_E_RANGE
 * (a number in tokenizer_config.json past an int64 or a double),
 * DG_E_UNSUPPORTED (a component type dgemma does not implement),
 * DG_E_NOMEM. */
int dg_tokenizer_load(const char *path, const char *config_path, struct dg_tokenizer **out,
                      struct dg_error *err);

/* The same from a tokenizer.json held in memory (what names it in errors);
 * no tokenizer_config.json. */
int dg_tokenizer_load_text(const char *text, size_t len, const char *what,
                           struct dg_tokenizer **out, struct dg_error *err);

void dg_tokenizer_free(struct dg_tokenizer *t);

enum dg_tok_encode_flags {
    DG_TOK_ADD_SPECIAL = 1,     /* run the post-processor (e.g. prepend <bos>) */
    DG_TOK_SPECIAL_AS_TEXT = 2, /* do not match `special` added tokens in the text */
    DG_TOK_ADDED_AS_TEXT = 4,   /* match no added token at all: the whole text literal
                                 * (dg_tokenizer_encode_literal's spans give parts) */
};

/* Encode len bytes of UTF-8 text, appending ids to out.  Errors:
 * DG_E_INVAL (invalid UTF-8, naming the byte offset), DG_E_NOMEM. */
int dg_tokenizer_encode(const struct dg_tokenizer *t, const char *text, size_t len, int flags,
                        struct dg_ids *out, struct dg_error *err);

/* A byte range [start, start + len) of a text. */
struct dg_text_span {
    size_t start, len;
};

/* dg_tokenizer_encode, except that no added token (special or not) is
 * matched where it would touch a byte of literal[0..n_literal): those bytes
 * are encoded as ordinary text, as if they held no token's spelling, and
 * the added tokens matched before a span end where it starts (the longest
 * that fits).  Otherwise the text is split and merged as dg_tokenizer_encode
 * does it, so spans that hold no added token's spelling, with none crossing
 * their edges, give the same ids.  The spans are sorted and disjoint (empty
 * ones allowed); with DG_TOK_ADDED_AS_TEXT the whole text is one (literal
 * is not read).  Errors: those of dg_tokenizer_encode; DG_E_INVAL for spans
 * out of order or past len. */
int dg_tokenizer_encode_literal(const struct dg_tokenizer *t, const char *text, size_t len,
                                int flags, const struct dg_text_span *literal, size_t n_literal,
                                struct dg_ids *out, struct dg_error *err);

/* Decode n ids, appending UTF-8 text to out.  skip_special drops tokens
 * flagged `special`.  Ids with no token are skipped.  Errors: DG_E_NOMEM. */
int dg_tokenizer_decode(const struct dg_tokenizer *t, const int32_t *ids, size_t n,
                        int skip_special, struct dg_buf *out, struct dg_error *err);

/* Number of ids (highest id + 1; added tokens may lie past the model's
 * vocabulary, e.g. Gemma 3's <image_soft_token> at 262144). */
int64_t dg_tokenizer_n_ids(const struct dg_tokenizer *t);

/* The id of an exact token string (vocabulary or added), or -1. */
int32_t dg_tokenizer_token_id(const struct dg_tokenizer *t, const char *s, size_t len);

/* The text of id (not NUL-terminated; *len set), or NULL. */
const char *dg_tokenizer_token_text(const struct dg_tokenizer *t, int32_t id, size_t *len);

/* Whether id is an added token flagged special. */
int dg_tokenizer_is_special(const struct dg_tokenizer *t, int32_t id);

/* The beginning-of-sequence token: its text (from tokenizer_config.json's
 * bos_token, else the post-processor's first special token) and id; NULL /
 * -1 when there is none. */
const char *dg_tokenizer_bos(const struct dg_tokenizer *t, int32_t *id);

/* ---- streaming decode ---------------------------------------------------- */

/* Decodes ids as they arrive and emits text that never ends inside a UTF-8
 * sequence: a run of byte tokens is held back until it is complete.  The
 * concatenation of everything emitted equals dg_tokenizer_decode of all
 * the ids. */
struct dg_tok_stream {
    const struct dg_tokenizer *t;
    int skip_special;
    int lead_budget;       /* leading characters a Strip after a Fuse may still remove */
    struct dg_ids held;    /* trailing byte-token run not yet decoded */
};

/* Errors: DG_E_UNSUPPORTED for decoder chains that cannot stream. */
int dg_tok_stream_init(struct dg_tok_stream *st, const struct dg_tokenizer *t, int skip_special,
                       struct dg_error *err);
int dg_tok_stream_push(struct dg_tok_stream *st, const int32_t *ids, size_t n,
                       struct dg_buf *out, struct dg_error *err);
int dg_tok_stream_finish(struct dg_tok_stream *st, struct dg_buf *out, struct dg_error *err);
void dg_tok_stream_free(struct dg_tok_stream *st);

#endif
