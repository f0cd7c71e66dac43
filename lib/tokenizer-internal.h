/*
 * tokenizer-internal.h - the loaded tokenizer's data, shared by
 * tokenizer-load.c, tokenizer-encode.c and tokenizer-decode.c.
 */
#ifndef DG_TOKENIZER_INTERNAL_H
#define DG_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "lib/tokenizer.h"

#define DG_TOK_NONE UINT32_MAX

enum {
    TOK_F_VOCAB = 1,    /* in model.vocab */
    TOK_F_ADDED = 2,    /* an added token */
    TOK_F_SPECIAL = 4,  /* added and special */
    TOK_F_BYTE = 8,     /* decodes as one byte (<0xXX>); the byte is in byte_of */
    TOK_F_NORMALIZED = 16, /* added token matched on normalized text */
};

/* A string-keyed open-addressing table: string -> id.  Each slot keeps
 * the upper half of the string's hash, so a probe rejects other strings
 * without touching the token text. */
struct tok_strslot {
    int32_t id;         /* -1 = empty */
    uint32_t tag;       /* hash >> 32 */
    uint32_t off, len;  /* the token text in the arena (copied from the id table) */
};

struct tok_strmap {
    uint32_t mask;      /* slots - 1 (slots a power of two) */
    struct tok_strslot *slot;
};

/* (left id, right id) -> (rank, merged id); one 16-byte slot per entry, so
 * a lookup touches one cache line. */
struct tok_merge_slot {
    uint64_t key;       /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t out;
};

struct tok_merges {
    uint32_t mask;
    struct tok_merge_slot *slot;
    size_t n;
};

/* A byte trie of added-token strings: node 0 is the root; an edge is found
 * in a hash table keyed by (node << 8 | byte). */
struct tok_trie {
    uint32_t n_nodes;
    int32_t *accept;          /* [n_nodes] id of the token ending here, or -1 */
    uint32_t edge_mask;
    uint64_t *edge_key;       /* node << 8 | byte, UINT64_MAX = empty */
    uint32_t *edge_child;
    unsigned char first[256]; /* bytes that begin some token */
    size_t n_tokens;
};

enum tok_norm_kind { NORM_REPLACE, NORM_PREPEND };
struct tok_norm_op {
    enum tok_norm_kind kind;
    char *pattern, *content;  /* NUL-free UTF-8 (pattern unused for PREPEND) */
    size_t pattern_len, content_len;
};

enum tok_split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT,
                          SPLIT_CONTIGUOUS };
struct tok_pre_op {
    char *pattern;
    size_t pattern_len;
    enum tok_split_behavior behavior;
};

enum tok_dec_kind { DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP };
struct tok_dec_op {
    enum tok_dec_kind kind;
    char *pattern, *content;  /* REPLACE */
    size_t pattern_len, content_len;
    uint32_t strip_char;      /* STRIP: the code point removed */
    int strip_start, strip_stop;
};

struct dg_tokenizer {
    int64_t n_ids;
    uint32_t *off, *len;      /* [n_ids] token text in arena; off DG_TOK_NONE = no token */
    uint8_t *flags;           /* [n_ids] TOK_F_* */
    uint8_t *byte_of;         /* [n_ids] the byte of a TOK_F_BYTE token */
    char *arena;
    size_t arena_len, arena_cap;

    struct tok_strmap vocab;  /* model.vocab: string -> id */
    struct tok_strmap all;    /* vocabulary and added tokens: string -> id */
    struct tok_merges merges;
    int32_t byte_id[256];     /* <0xXX> ids, -1 if absent */
    int32_t ascii_id[128];    /* single-character vocabulary ids, -1 if absent */

    struct tok_trie added_raw, added_norm; /* non-normalized and normalized added tokens */
    int any_special_added;

    int n_norm, n_pre, n_dec;
    struct tok_norm_op norm[8];
    struct tok_pre_op pre[8];
    struct tok_dec_op dec[8];

    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;           /* -1 if none */

    int n_prefix, n_suffix;   /* post-processor: ids around $A */
    int32_t prefix[8], suffix[8];

    char bos_text[64];
    int32_t bos_id;
};

/* 64-bit hash of a byte string, eight bytes at a time, mixed for open
 * addressing (not for adversaries: a bad hash only makes a probe longer). */
static inline uint64_t tok_hash(const char *s, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * 0x94d049bb133111ebull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static inline uint64_t tok_hash64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}

/* id of s in m (strings compared through the tokenizer's id table), or -1 */
int32_t tok_strmap_get(const struct dg_tokenizer *t, const struct tok_strmap *m, const char *s,
                       size_t n);

/* rank and merged id of (a, b); 0 if the pair has no merge */
static inline int tok_merge_get(const struct tok_merges *m, int32_t a, int32_t b, uint32_t *rank,
                                int32_t *out)
{
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i;
    if (!m->slot)
        return 0;
    for (i = (uint32_t)tok_hash64(key) & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_merge_slot *sl = &m->slot[i];
        if (sl->key == key) {
            *rank = sl->rank;
            *out = sl->out;
            return 1;
        }
        if (sl->key == UINT64_MAX)
            return 0;
    }
}

/* Run the normalizer over src[0..n) into out (replacing its contents).
 * Returns 0, or -1 when out of memory. */
int tok_normalize(const struct dg_tokenizer *t, const char *src, size_t n, struct dg_buf *out);

/* The byte a "<0xHH>" token stands for, read as the reference's
 * ByteFallback decoder reads it (u8::from_str_radix on the two
 * characters, which also takes "+H"), or -1 (tokenizer-decode.c).  The
 * decoder and the loader's byte-token flag (TOK_F_BYTE, which the
 * streaming decode goes by) both use it, so that the two decodes agree. */
int tok_byte_value(const char *s, size_t n);

/* longest added token matching text at [0, n): its id and length, or 0 */
size_t tok_trie_match(const struct tok_trie *tr, const char *text, size_t n, int special_as_text,
                      const struct dg_tokenizer *t, int32_t *id);

#endif
