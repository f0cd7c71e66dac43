/* tokenizer-load.c - reading and validating tokenizer.json; see tokenizer.h. */
#include "lib/tokenizer-internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/fileio.h"
#include "lib/grow.h"
#include "lib/json-scan.h"
#include "lib/json-util.h"
#include "lib/utf8.h"

#define MAX_IDS (1 << 24)

/* ---- memory ------------------------------------------------------------------ */

/* Big tables are probed at random: ask for transparent huge pages, which
 * spares a TLB miss on most probes (where the kernel offers them; a no-op
 * elsewhere).  Allocated 2 MiB-aligned; freed with free(). */
static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes < (2u << 20))
        return malloc(bytes);
    if (posix_memalign(&p, 2u << 20, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes & ~(size_t)4095, MADV_HUGEPAGE);
#endif
    return p;
}

/* ---- small containers ---------------------------------------------------- */

void dg_ids_free(struct dg_ids *a)
{
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

void dg_buf_free(struct dg_buf *b)
{
    free(b->s);
    b->s = NULL;
    b->n = b->cap = 0;
}

int dg_ids_append(struct dg_ids *a, const int32_t *ids, size_t n)
{
    if (n == 0)
        return 0;
    if (n > SIZE_MAX - a->n)
        return -1;
    if (a->n + n > a->cap) {
        int32_t *v = dg_grow(a->v, &a->cap, a->n + n, sizeof *v, 256);
        if (!v)
            return -1;
        a->v = v;
    }
    memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
    return 0;
}

int dg_buf_append(struct dg_buf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX - b->n - 1)
        return -1;
    if (b->n + n + 1 > b->cap) {
        char *p = dg_grow(b->s, &b->cap, b->n + n + 1, 1, 256);
        if (!p)
            return -1;
        b->s = p;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

/* ---- the id table ------------------------------------------------------------ */

static int ensure_ids(struct dg_tokenizer *t, int64_t n)
{
    int64_t cap = t->n_ids;
    if (n <= cap)
        return 0;
    {
        int64_t ncap = cap ? cap : 1024;
        uint32_t *o, *l;
        uint8_t *f, *b;
        while (ncap < n)
            ncap *= 2;
        o = realloc(t->off, sizeof *o * (size_t)ncap);
        if (o)
            t->off = o;
        l = realloc(t->len, sizeof *l * (size_t)ncap);
        if (l)
            t->len = l;
        f = realloc(t->flags, (size_t)ncap);
        if (f)
            t->flags = f;
        b = realloc(t->byte_of, (size_t)ncap);
        if (b)
            t->byte_of = b;
        if (!o || !l || !f || !b)
            return -1;
        for (int64_t i = cap; i < ncap; i++) {
            t->off[i] = DG_TOK_NONE;
            t->len[i] = 0;
            t->flags[i] = 0;
            t->byte_of[i] = 0;
        }
        t->n_ids = ncap; /* trimmed to the real count at the end of loading */
    }
    return 0;
}

static int arena_add(struct dg_tokenizer *t, const char *s, size_t n, uint32_t *off)
{
    if (t->arena_len + n + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        char *p;
        while (cap < t->arena_len + n + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return -1;
        p = realloc(t->arena, cap);
        if (!p)
            return -1;
        t->arena = p;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, s, n);
    t->arena[t->arena_len + n] = '\0';
    *off = (uint32_t)t->arena_len;
    t->arena_len += n + 1;
    return 0;
}

static const char *tok_text(const struct dg_tokenizer *t, int32_t id, size_t *n)
{
    *n = t->len[id];
    return t->arena + t->off[id];
}

/* ---- string map -------------------------------------------------------------- */

int32_t tok_strmap_get(const struct dg_tokenizer *t, const struct tok_strmap *m, const char *s,
                       size_t n)
{
    const uint64_t h = tok_hash(s, n);
    const uint32_t tag = (uint32_t)(h >> 32);
    uint32_t i;
    if (!m->slot)
        return -1;
    for (i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_strslot *sl = &m->slot[i];
        if (sl->id < 0)
            return -1;
        if (sl->tag == tag && sl->len == n && memcmp(t->arena + sl->off, s, n) == 0)
            return sl->id;
    }
}

/* Look up n strings at once: the probes of a big table are cache misses,
 * so first prefetch every key's home slot, then every candidate's text,
 * then compare; the misses overlap instead of queueing. */
struct strkey {
    const char *s;
    size_t n;
    uint64_t h;
    int32_t id;
};

static void strmap_get_batch(const struct dg_tokenizer *t, const struct tok_strmap *m,
                             struct strkey *k, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        k[i].h = tok_hash(k[i].s, k[i].n);
        __builtin_prefetch(&m->slot[(uint32_t)k[i].h & m->mask]);
    }
    for (size_t i = 0; i < n; i++) { /* the first slot whose tag matches: prefetch its text */
        const uint32_t tag = (uint32_t)(k[i].h >> 32);
        for (uint32_t j = (uint32_t)k[i].h & m->mask;; j = (j + 1) & m->mask) {
            const struct tok_strslot *sl = &m->slot[j];
            if (sl->id < 0)
                break;
            if (sl->tag == tag && sl->len == k[i].n) {
                __builtin_prefetch(t->arena + sl->off);
                break;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        k[i].id = tok_strmap_get(t, m, k[i].s, k[i].n);
}

/* Insert id into m (sized beforehand); a string already present is an
 * error naming it. */
static int strmap_insert(struct dg_tokenizer *t, struct tok_strmap *m, int32_t id,
                         const char *what, struct dg_error *err)
{
    size_t len;
    const char *s = tok_text(t, id, &len);
    const uint64_t h = tok_hash(s, len);
    const uint32_t tag = (uint32_t)(h >> 32);
    uint32_t i;

    for (i = (uint32_t)h & m->mask; m->slot[i].id >= 0; i = (i + 1) & m->mask) {
        const struct tok_strslot *o = &m->slot[i];
        if (o->tag == tag && o->len == len && memcmp(t->arena + o->off, s, len) == 0)
            return dg_error_set(err, DG_E_FORMAT, "%s: token '%.64s' has two ids, %d and %d", what,
                                s, o->id, id);
    }
    m->slot[i] = (struct tok_strslot){id, tag, t->off[id], (uint32_t)len};
    return 0;
}

static int strmap_alloc(struct tok_strmap *m, size_t n)
{
    size_t slots = 16;
    while (slots < 2 * n)
        slots *= 2;
    m->slot = big_alloc(sizeof *m->slot * slots);
    if (!m->slot)
        return -1;
    for (size_t i = 0; i < slots; i++)
        m->slot[i].id = -1;
    m->mask = (uint32_t)(slots - 1);
    return 0;
}

/* The vocabulary map: every TOK_F_VOCAB id. */
static int build_vocab_map(struct dg_tokenizer *t, const char *what, struct dg_error *err)
{
    size_t n = 0;
    int rc;
    for (int64_t id = 0; id < t->n_ids; id++)
        n += (t->flags[id] & TOK_F_VOCAB) != 0;
    if (strmap_alloc(&t->vocab, n) < 0)
        return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
    for (int64_t id = 0; id < t->n_ids; id++)
        if ((t->flags[id] & TOK_F_VOCAB) && (rc = strmap_insert(t, &t->vocab, (int32_t)id, what,
                                                                 err)) < 0)
            return rc;
    return 0;
}

/* The map of every token: the vocabulary map plus the added tokens that
 * are not in the vocabulary (parse_added made sure the others agree). */
static int build_all_map(struct dg_tokenizer *t, const char *what, struct dg_error *err)
{
    size_t extra = 0, n = 0;
    int rc;
    for (int64_t id = 0; id < t->n_ids; id++) {
        extra += (t->flags[id] & (TOK_F_ADDED | TOK_F_VOCAB)) == TOK_F_ADDED;
        n += (t->flags[id] & TOK_F_VOCAB) != 0;
    }
    if (2 * (n + extra) <= (size_t)t->vocab.mask + 1) {
        size_t bytes = sizeof *t->all.slot * ((size_t)t->vocab.mask + 1);
        t->all.slot = big_alloc(bytes);
        if (!t->all.slot)
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        memcpy(t->all.slot, t->vocab.slot, bytes);
        t->all.mask = t->vocab.mask;
    } else {
        if (strmap_alloc(&t->all, n + extra) < 0)
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        for (int64_t id = 0; id < t->n_ids; id++)
            if ((t->flags[id] & TOK_F_VOCAB) &&
                (rc = strmap_insert(t, &t->all, (int32_t)id, what, err)) < 0)
                return rc;
    }
    for (int64_t id = 0; id < t->n_ids; id++)
        if ((t->flags[id] & (TOK_F_ADDED | TOK_F_VOCAB)) == TOK_F_ADDED &&
            (rc = strmap_insert(t, &t->all, (int32_t)id, what, err)) < 0)
            return rc;
    return 0;
}

/* ---- the trie of added tokens ------------------------------------------------ */

static int trie_edge(const struct tok_trie *tr, uint32_t node, unsigned char b)
{
    const uint64_t key = (uint64_t)node << 8 | b;
    for (uint32_t i = (uint32_t)tok_hash64(key) & tr->edge_mask;; i = (i + 1) & tr->edge_mask) {
        if (tr->edge_key[i] == key)
            return (int)tr->edge_child[i];
        if (tr->edge_key[i] == UINT64_MAX)
            return -1;
    }
}

static int build_trie(struct dg_tokenizer *t, struct tok_trie *tr, int normalized,
                      struct dg_error *err)
{
    size_t total = 1, slots = 16;
    for (int64_t id = 0; id < t->n_ids; id++)
        if ((t->flags[id] & TOK_F_ADDED) && !!(t->flags[id] & TOK_F_NORMALIZED) == normalized)
            total += t->len[id];
    while (slots < 2 * total)
        slots *= 2;
    tr->accept = malloc(sizeof *tr->accept * total);
    tr->edge_key = malloc(sizeof *tr->edge_key * slots);
    tr->edge_child = malloc(sizeof *tr->edge_child * slots);
    if (!tr->accept || !tr->edge_key || !tr->edge_child)
        return dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory for added tokens");
    memset(tr->edge_key, 0xff, sizeof *tr->edge_key * slots);
    tr->edge_mask = (uint32_t)(slots - 1);
    tr->accept[0] = -1;
    tr->n_nodes = 1;
    for (int64_t id = 0; id < t->n_ids; id++) {
        size_t len;
        const unsigned char *s;
        uint32_t node = 0;
        if (!(t->flags[id] & TOK_F_ADDED) || !!(t->flags[id] & TOK_F_NORMALIZED) != normalized)
            continue;
        s = (const unsigned char *)tok_text(t, (int32_t)id, &len);
        tr->first[s[0]] = 1;
        for (size_t k = 0; k < len; k++) {
            int child = trie_edge(tr, node, s[k]);
            if (child < 0) {
                const uint64_t key = (uint64_t)node << 8 | s[k];
                uint32_t i = (uint32_t)tok_hash64(key) & tr->edge_mask;
                while (tr->edge_key[i] != UINT64_MAX)
                    i = (i + 1) & tr->edge_mask;
                tr->edge_key[i] = key;
                tr->edge_child[i] = tr->n_nodes;
                tr->accept[tr->n_nodes] = -1;
                child = (int)tr->n_nodes++;
            }
            node = (uint32_t)child;
        }
        tr->accept[node] = (int32_t)id;
        tr->n_tokens++;
    }
    return 0;
}

size_t tok_trie_match(const struct tok_trie *tr, const char *text, size_t n, int special_as_text,
                      const struct dg_tokenizer *t, int32_t *id)
{
    uint32_t node = 0;
    size_t best = 0;

    if (!tr->n_tokens || !n || !tr->first[(unsigned char)text[0]])
        return 0;
    for (size_t k = 0; k < n; k++) {
        int child = trie_edge(tr, node, (unsigned char)text[k]);
        if (child < 0)
            break;
        node = (uint32_t)child;
        if (tr->accept[node] >= 0 &&
            !(special_as_text && (t->flags[tr->accept[node]] & TOK_F_SPECIAL))) {
            best = k + 1;
            *id = tr->accept[node];
        }
    }
    return best;
}

/* ---- pipeline components (small JSON, read with jansson) --------------------- */


static int unsupported(struct dg_error *err, const char *what, const char *component,
                       const char *detail)
{
    return dg_error_set(err, DG_E_UNSUPPORTED, "%s: %s %s is not supported", what, component,
                        detail);
}

/* pattern: {"String": s} (a Regex is refused) */
static int string_pattern(const json_t *o, const char *what, const char *component, char **out,
                          size_t *len, struct dg_error *err)
{
    json_t *p = json_object_get(o, "pattern"), *s;
    if (!json_is_object(p))
        return dg_error_set(err, DG_E_FORMAT, "%s: %s has no pattern object", what, component);
    s = json_object_get(p, "String");
    if (!json_is_string(s)) {
        if (json_object_get(p, "Regex"))
            return unsupported(err, what, component, "with a Regex pattern");
        return dg_error_set(err, DG_E_FORMAT, "%s: %s pattern has no String", what, component);
    }
    *len = json_string_length(s);
    if (*len == 0)
        return dg_error_set(err, DG_E_FORMAT, "%s: %s has an empty pattern", what, component);
    *out = strndup(json_string_value(s), *len);
    return *out ? 0 : dg_error_set(err, DG_E_NOMEM, "out of memory");
}

static int dup_string(const json_t *v, char **out, size_t *len, const char *what, const char *key,
                      struct dg_error *err)
{
    if (!json_is_string(v))
        return dg_error_set(err, DG_E_FORMAT, "%s: %s must be a string", what, key);
    *len = json_string_length(v);
    *out = strndup(json_string_value(v), *len);
    return *out ? 0 : dg_error_set(err, DG_E_NOMEM, "out of memory");
}

static const char *type_of(const json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "";
}

static int parse_normalizer(struct dg_tokenizer *t, const json_t *o, const char *what,
                            struct dg_error *err)
{
    const char *type;
    int rc;

    if (json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return dg_error_set(err, DG_E_FORMAT, "%s: normalizer must be an object or null", what);
    type = type_of(o);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "normalizers"), *x;
        size_t i;
        if (!json_is_array(list))
            return dg_error_set(err, DG_E_FORMAT, "%s: Sequence normalizer has no list", what);
        json_array_foreach(list, i, x) if ((rc = parse_normalizer(t, x, what, err)) < 0) return rc;
        return 0;
    }
    if (t->n_norm == 8)
        return unsupported(err, what, "normalizer", "with more than 8 steps");
    if (!strcmp(type, "Replace")) {
        struct tok_norm_op *op = &t->norm[t->n_norm];
        op->kind = NORM_REPLACE;
        if ((rc = string_pattern(o, what, "Replace normalizer", &op->pattern, &op->pattern_len,
                                 err)) < 0 ||
            (rc = dup_string(json_object_get(o, "content"), &op->content, &op->content_len, what,
                             "Replace normalizer content", err)) < 0)
            return rc;
        t->n_norm++;
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        struct tok_norm_op *op = &t->norm[t->n_norm];
        op->kind = NORM_PREPEND;
        if ((rc = dup_string(json_object_get(o, "prepend"), &op->content, &op->content_len, what,
                             "Prepend normalizer prepend", err)) < 0)
            return rc;
        t->n_norm++;
        return 0;
    }
    return unsupported(err, what, "normalizer type", type[0] ? type : "(none)");
}

static int parse_pre_tokenizer(struct dg_tokenizer *t, const json_t *o, const char *what,
                               struct dg_error *err)
{
    const char *type, *behavior;
    int rc;

    if (json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return dg_error_set(err, DG_E_FORMAT, "%s: pre_tokenizer must be an object or null", what);
    type = type_of(o);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(list))
            return dg_error_set(err, DG_E_FORMAT, "%s: Sequence pre_tokenizer has no list", what);
        json_array_foreach(list, i, x) if ((rc = parse_pre_tokenizer(t, x, what, err)) < 0) return rc;
        return 0;
    }
    if (strcmp(type, "Split") != 0)
        return unsupported(err, what, "pre_tokenizer type", type[0] ? type : "(none)");
    if (t->n_pre == 8)
        return unsupported(err, what, "pre_tokenizer", "with more than 8 steps");
    if (json_is_true(json_object_get(o, "invert")))
        return unsupported(err, what, "Split pre_tokenizer", "with invert: true");
    {
        struct tok_pre_op *op = &t->pre[t->n_pre];
        if ((rc = string_pattern(o, what, "Split pre_tokenizer", &op->pattern, &op->pattern_len,
                                 err)) < 0)
            return rc;
        behavior = json_string_value(json_object_get(o, "behavior"));
        if (!behavior)
            return dg_error_set(err, DG_E_FORMAT, "%s: Split pre_tokenizer has no behavior", what);
        if (!strcmp(behavior, "Removed"))
            op->behavior = SPLIT_REMOVED;
        else if (!strcmp(behavior, "Isolated"))
            op->behavior = SPLIT_ISOLATED;
        else if (!strcmp(behavior, "MergedWithPrevious"))
            op->behavior = SPLIT_MERGED_PREV;
        else if (!strcmp(behavior, "MergedWithNext"))
            op->behavior = SPLIT_MERGED_NEXT;
        else if (!strcmp(behavior, "Contiguous"))
            op->behavior = SPLIT_CONTIGUOUS;
        else
            return unsupported(err, what, "Split behavior", behavior);
        t->n_pre++;
    }
    return 0;
}

static int parse_decoder(struct dg_tokenizer *t, const json_t *o, const char *what,
                         struct dg_error *err)
{
    const char *type;
    struct tok_dec_op *op;
    int rc;

    if (json_is_null(o))
        return 0;
    if (!json_is_object(o))
        return dg_error_set(err, DG_E_FORMAT, "%s: decoder must be an object or null", what);
    type = type_of(o);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(o, "decoders"), *x;
        size_t i;
        if (!json_is_array(list))
            return dg_error_set(err, DG_E_FORMAT, "%s: Sequence decoder has no list", what);
        json_array_foreach(list, i, x) if ((rc = parse_decoder(t, x, what, err)) < 0) return rc;
        return 0;
    }
    if (t->n_dec == 8)
        return unsupported(err, what, "decoder", "with more than 8 steps");
    op = &t->dec[t->n_dec];
    if (!strcmp(type, "Replace")) {
        op->kind = DEC_REPLACE;
        if ((rc = string_pattern(o, what, "Replace decoder", &op->pattern, &op->pattern_len,
                                 err)) < 0 ||
            (rc = dup_string(json_object_get(o, "content"), &op->content, &op->content_len, what,
                             "Replace decoder content", err)) < 0)
            return rc;
    } else if (!strcmp(type, "ByteFallback")) {
        op->kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        op->kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        const char *c = json_string_value(json_object_get(o, "content"));
        json_t *start = json_object_get(o, "start"), *stop = json_object_get(o, "stop");
        uint32_t cp;
        op->kind = DEC_STRIP;
        if (!c || dg_utf8_decode((const unsigned char *)c, strlen(c), &cp) != strlen(c) ||
            !json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 ||
            json_integer_value(stop) < 0 || json_integer_value(start) > 1000 ||
            json_integer_value(stop) > 1000)
            return dg_error_set(err, DG_E_FORMAT, "%s: Strip decoder needs one character and "
                                "non-negative start/stop", what);
        op->strip_char = cp;
        op->strip_start = (int)json_integer_value(start);
        op->strip_stop = (int)json_integer_value(stop);
    } else {
        return unsupported(err, what, "decoder type", type[0] ? type : "(none)");
    }
    t->n_dec++;
    return 0;
}

/* TemplateProcessing: ids before and after $A in "single" */
static int parse_post_processor(struct dg_tokenizer *t, const json_t *o, const char *what,
                                struct dg_error *err)
{
    json_t *single, *specials, *item;
    size_t i;
    int seen_a = 0;

    if (json_is_null(o))
        return 0;
    if (!json_is_object(o) || strcmp(type_of(o), "TemplateProcessing") != 0)
        return unsupported(err, what, "post_processor type",
                           json_is_object(o) && type_of(o)[0] ? type_of(o) : "(not an object)");
    single = json_object_get(o, "single");
    specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single) || !json_is_object(specials))
        return dg_error_set(err, DG_E_FORMAT,
                            "%s: TemplateProcessing needs 'single' and 'special_tokens'", what);
    json_array_foreach(single, i, item) {
        json_t *sp = json_object_get(item, "SpecialToken"), *seq = json_object_get(item, "Sequence");
        if (seq) {
            const char *which = json_string_value(json_object_get(seq, "id"));
            if (!which || strcmp(which, "A") != 0 || seen_a)
                return unsupported(err, what, "TemplateProcessing", "single template other than "
                                   "one $A with special tokens around it");
            seen_a = 1;
        } else if (sp) {
            const char *name = json_string_value(json_object_get(sp, "id"));
            json_t *def = name ? json_object_get(specials, name) : NULL, *ids = json_object_get(def, "ids"), *x;
            size_t k;
            if (!json_is_array(ids))
                return dg_error_set(err, DG_E_FORMAT,
                                    "%s: TemplateProcessing names special token '%.64s' that "
                                    "special_tokens does not define", what, name ? name : "?");
            json_array_foreach(ids, k, x) {
                int *n = seen_a ? &t->n_suffix : &t->n_prefix;
                int32_t *dst = seen_a ? t->suffix : t->prefix;
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) >= MAX_IDS)
                    return dg_error_set(err, DG_E_FORMAT, "%s: bad id for special token '%.64s'",
                                        what, name);
                if (*n == 8)
                    return unsupported(err, what, "TemplateProcessing", "with more than 8 ids");
                dst[(*n)++] = (int32_t)json_integer_value(x);
            }
        } else {
            return dg_error_set(err, DG_E_FORMAT, "%s: bad TemplateProcessing item", what);
        }
    }
    if (!seen_a)
        return dg_error_set(err, DG_E_FORMAT, "%s: TemplateProcessing single has no $A", what);
    return 0;
}

/* added_tokens: [{id, content, single_word, lstrip, rstrip, normalized, special}] */
static int parse_added(struct dg_tokenizer *t, const json_t *arr, const char *what,
                       struct dg_error *err)
{
    json_t *o;
    size_t i;

    if (!json_is_array(arr))
        return dg_error_set(err, DG_E_FORMAT, "%s: added_tokens must be an array", what);
    json_array_foreach(arr, i, o) {
        json_t *jid = json_object_get(o, "id"), *jc = json_object_get(o, "content");
        long long id;
        size_t len;
        const char *s;
        if (!json_is_integer(jid) || !json_is_string(jc))
            return dg_error_set(err, DG_E_FORMAT, "%s: added_tokens[%zu] needs an integer id and "
                                "a string content", what, i);
        id = json_integer_value(jid);
        s = json_string_value(jc);
        len = json_string_length(jc);
        if (id < 0 || id >= MAX_IDS)
            return dg_error_set(err, DG_E_FORMAT, "%s: added_tokens[%zu]: id %lld out of range",
                                what, i, id);
        if (len == 0 || memchr(s, 0, len))
            return dg_error_set(err, DG_E_FORMAT, "%s: added token %lld is empty or holds a NUL",
                                what, id);
        if (json_is_true(json_object_get(o, "single_word")) ||
            json_is_true(json_object_get(o, "lstrip")) || json_is_true(json_object_get(o, "rstrip")))
            return dg_error_set(err, DG_E_UNSUPPORTED, "%s: added token '%.64s' uses single_word, "
                                "lstrip or rstrip, which are not supported", what, s);
        if (ensure_ids(t, id + 1) < 0)
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        if (t->flags[id] & TOK_F_ADDED)
            return dg_error_set(err, DG_E_FORMAT, "%s: id %lld is added twice", what, id);
        if (t->off[id] != DG_TOK_NONE) {
            if (t->len[id] != len || memcmp(t->arena + t->off[id], s, len) != 0)
                return dg_error_set(err, DG_E_FORMAT, "%s: added token %lld '%.64s' differs from "
                                    "the vocabulary's '%.64s'", what, id, s, t->arena + t->off[id]);
        } else if (arena_add(t, s, len, &t->off[id]) < 0) {
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        } else {
            t->len[id] = (uint32_t)len;
        }
        t->flags[id] |= TOK_F_ADDED;
        if (json_is_true(json_object_get(o, "special"))) {
            t->flags[id] |= TOK_F_SPECIAL;
            t->any_special_added = 1;
        }
        if (json_is_true(json_object_get(o, "normalized"))) {
            /* matched, and decoded, in normalized form: the reference keeps
             * normalize(content) as the token's text */
            struct dg_buf nb = {0};
            t->flags[id] |= TOK_F_NORMALIZED;
            if (tok_normalize(t, s, len, &nb) < 0 || !nb.n || memchr(nb.s, 0, nb.n) ||
                arena_add(t, nb.s, nb.n, &t->off[id]) < 0) {
                dg_buf_free(&nb);
                return dg_error_set(err, DG_E_NOMEM, "%s: cannot normalize added token '%.64s'",
                                    what, s);
            }
            t->len[id] = (uint32_t)nb.n;
            dg_buf_free(&nb);
        }
    }
    return 0;
}

/* ---- model.vocab and model.merges (scanned, not parsed into a DOM) ---------- */

/* model.vocab: {"token": id, ...}, read at the scanner's cursor. */
static int scan_vocab(struct dg_tokenizer *t, struct dg_jscan *s, const char *what,
                      struct dg_error *err)
{
    int rc;

    if ((rc = dg_jscan_object_begin(s)) < 0)
        return rc;
    while ((rc = dg_jscan_object_next(s)) > 0) {
        long long id;
        uint32_t off;
        const uint32_t len = (uint32_t)s->len;
        /* the key goes straight to the arena; its id arrives next */
        if (s->len == 0 || memchr(s->buf, 0, s->len))
            return dg_jscan_fail(s, "an empty token, or one holding a NUL");
        if (arena_add(t, s->buf, s->len, &off) < 0)
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        if ((rc = dg_jscan_int(s, 0, MAX_IDS - 1, &id)) < 0)
            return rc;
        if (ensure_ids(t, id + 1) < 0)
            return dg_error_set(err, DG_E_NOMEM, "%s: out of memory", what);
        if (t->off[id] != DG_TOK_NONE)
            return dg_error_set(err, DG_E_FORMAT, "%s: id %lld belongs to two tokens, '%.64s' and "
                                "'%.64s'", what, id, t->arena + t->off[id], t->arena + off);
        t->off[id] = off;
        t->len[id] = len;
        t->flags[id] |= TOK_F_VOCAB;
    }
    return rc < 0 ? rc : 0;
}

/* Double the merge table (or create it), rehashing every entry. */
static int merges_grow(struct tok_merges *m, size_t first_size)
{
    size_t slots = m->slot ? 2 * ((size_t)m->mask + 1) : first_size;
    struct tok_merge_slot *nv = big_alloc(slots * sizeof *nv);
    if (!nv)
        return -1;
    for (size_t i = 0; i < slots; i++)
        nv[i].key = UINT64_MAX;
    for (size_t i = 0; m->slot && i <= m->mask; i++) {
        uint32_t j;
        if (m->slot[i].key == UINT64_MAX)
            continue;
        for (j = (uint32_t)tok_hash64(m->slot[i].key) & (uint32_t)(slots - 1);
             nv[j].key != UINT64_MAX; j = (j + 1) & (uint32_t)(slots - 1))
            ;
        nv[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = nv;
    m->mask = (uint32_t)(slots - 1);
    return 0;
}

/* Record merge `rank`: (ia, ib) -> io. */
static int add_merge(struct tok_merges *m, int32_t ia, int32_t ib, int32_t io, uint32_t rank,
                     const char *what, struct dg_error *err)
{
    const uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint32_t i;

    if (2 * (m->n + 1) > (size_t)m->mask + 1 && merges_grow(m, 0) < 0)
        return dg_error_set(err, DG_E_NOMEM, "%s: out of memory for merges", what);
    for (i = (uint32_t)tok_hash64(key) & m->mask; m->slot[i].key != UINT64_MAX;
         i = (i + 1) & m->mask)
        if (m->slot[i].key == key)
            break; /* a repeated pair: the later rank wins, as in the reference's map */
    if (m->slot[i].key == UINT64_MAX)
        m->n++;
    m->slot[i] = (struct tok_merge_slot){key, rank, io};
    return 0;
}

#define MERGE_BATCH 128

/* Merges waiting for their lookups: the texts of a, b and a+b. */
struct merge_batch {
    struct dg_buf text;
    size_t a_off[MERGE_BATCH], a_len[MERGE_BATCH], b_len[MERGE_BATCH];
    size_t n;
    uint32_t first_rank;
    struct strkey keys[3 * MERGE_BATCH];
};

static int batch_add(struct merge_batch *b, const char *a, size_t la, const char *s2, size_t lb)
{
    b->a_off[b->n] = b->text.n;
    b->a_len[b->n] = la;
    b->b_len[b->n] = lb;
    /* stored as a, then a+b (b is the tail of a+b) */
    if (dg_buf_append(&b->text, a, la) < 0 || dg_buf_append(&b->text, a, la) < 0 ||
        dg_buf_append(&b->text, s2, lb) < 0)
        return -1;
    b->n++;
    return 0;
}

static int batch_flush(struct dg_tokenizer *t, struct merge_batch *b, const char *what,
                       struct dg_error *err)
{
    int rc;
    for (size_t i = 0; i < b->n; i++) {
        const char *base = b->text.s + b->a_off[i];
        const size_t la = b->a_len[i], lb = b->b_len[i];
        b->keys[3 * i] = (struct strkey){base, la, 0, -1};
        b->keys[3 * i + 1] = (struct strkey){base + 2 * la, lb, 0, -1};
        b->keys[3 * i + 2] = (struct strkey){base + la, la + lb, 0, -1};
    }
    strmap_get_batch(t, &t->vocab, b->keys, 3 * b->n);
    for (size_t i = 0; i < b->n; i++) {
        const struct strkey *k = &b->keys[3 * i];
        const uint32_t rank = b->first_rank + (uint32_t)i;
        if (k[0].id < 0 || k[1].id < 0)
            return dg_error_set(err, DG_E_FORMAT, "%s: merge %u ('%.*s' '%.*s') uses a token not "
                                "in the vocabulary", what, rank, (int)(k[0].n > 32 ? 32 : k[0].n),
                                k[0].s, (int)(k[1].n > 32 ? 32 : k[1].n), k[1].s);
        if (k[2].id < 0)
            return dg_error_set(err, DG_E_FORMAT, "%s: merge %u ('%.*s' '%.*s') makes a token not "
                                "in the vocabulary", what, rank, (int)(k[0].n > 32 ? 32 : k[0].n),
                                k[0].s, (int)(k[1].n > 32 ? 32 : k[1].n), k[1].s);
        if ((rc = add_merge(&t->merges, k[0].id, k[1].id, k[2].id, rank, what, err)) < 0)
            return rc;
    }
    b->first_rank += (uint32_t)b->n;
    b->n = 0;
    b->text.n = 0;
    return 0;
}

/* model.merges: [["a", "b"], ...] or ["a b", ...], read at the scanner's
 * cursor; the vocabulary map must be built. */
static int scan_merges(struct dg_tokenizer *t, struct dg_jscan *s, const char *what,
                       struct dg_error *err)
{
    struct tok_merges *m = &t->merges;
    struct merge_batch *b = calloc(1, sizeof *b);
    size_t first_cap = 0;
    char *first = NULL;
    int rc;
    uint32_t rank = 0;

    if (!b)
        return dg_error_set(err, DG_E_NOMEM, "%s: out of memory for merges", what);
    if (!m->slot) {
        /* BPE files hold about two merges per vocabulary entry: start there */
        size_t first_size = (size_t)1 << 12;
        while (first_size < 2 * (size_t)(t->vocab.mask + 1))
            first_size *= 2;
        if (merges_grow(m, first_size) < 0) {
            rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory for merges", what);
            goto out;
        }
    }
    if ((rc = dg_jscan_array_begin(s)) < 0)
        goto out;
    while ((rc = dg_jscan_array_next(s)) > 0) {
        char c = dg_jscan_peek(s);
        if (c == '[') { /* ["a", "b"] */
            size_t la;
            if ((rc = dg_jscan_array_begin(s)) < 0 || (rc = dg_jscan_array_next(s)) <= 0 ||
                (rc = dg_jscan_string(s)) < 0)
                goto bad_pair;
            la = s->len;
            if (la + 1 > first_cap) {
                char *p = realloc(first, la + 64);
                if (!p) {
                    rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
                    goto out;
                }
                first = p;
                first_cap = la + 64;
            }
            memcpy(first, s->buf, la + 1);
            if ((rc = dg_jscan_array_next(s)) <= 0 || (rc = dg_jscan_string(s)) < 0)
                goto bad_pair;
            if (batch_add(b, first, la, s->buf, s->len) < 0)
                goto oom;
            if ((rc = dg_jscan_array_next(s)) != 0)
                goto bad_pair;
        } else if (c == '"') { /* "a b" */
            char *sp;
            if ((rc = dg_jscan_string(s)) < 0)
                goto out;
            sp = memchr(s->buf, ' ', s->len);
            if (!sp || sp == s->buf || sp + 1 == s->buf + s->len ||
                memchr(sp + 1, ' ', (size_t)(s->buf + s->len - sp - 1)))
                goto bad_pair;
            if (batch_add(b, s->buf, (size_t)(sp - s->buf), sp + 1,
                          (size_t)(s->buf + s->len - sp - 1)) < 0)
                goto oom;
        } else {
            goto bad_pair;
        }
        rank++;
        if (b->n == MERGE_BATCH && (rc = batch_flush(t, b, what, err)) < 0)
            goto out;
    }
    if (rc == 0)
        rc = batch_flush(t, b, what, err);
    goto out;
oom:
    rc = dg_error_set(err, DG_E_NOMEM, "%s: out of memory for merges", what);
    goto out;
bad_pair:
    if (rc >= 0 || (err && err->code != DG_E_NOMEM))
        rc = dg_jscan_fail(s, "merge %u is not a [\"a\", \"b\"] pair or an \"a b\" string", rank);
out:
    free(first);
    if (b)
        dg_buf_free(&b->text);
    free(b);
    return rc < 0 ? rc : 0;
}

/* ---- the model object ------------------------------------------------------ */

struct model_state {
    int vocab_done, merges_done;
    const char *merges_span;  /* merges seen before vocab: read them afterwards */
    size_t merges_len;
    char *unk;
};

static int scan_model(struct dg_tokenizer *t, struct dg_jscan *s, struct model_state *ms,
                      const char *what, struct dg_error *err)
{
    int rc, have_type = 0;

    t->byte_fallback = 0;
    t->fuse_unk = 0;
    t->ignore_merges = 0;
    if ((rc = dg_jscan_object_begin(s)) < 0)
        return rc;
    while ((rc = dg_jscan_object_next(s)) > 0) {
        char key[64];
        char c;
        snprintf(key, sizeof key, "%s", s->buf);
        c = dg_jscan_peek(s);
        if (!strcmp(key, "vocab")) {
            if (ms->vocab_done)
                return dg_jscan_fail(s, "duplicate key 'vocab'");
            if ((rc = scan_vocab(t, s, what, err)) == 0)
                rc = build_vocab_map(t, what, err);
            ms->vocab_done = 1;
        } else if (!strcmp(key, "merges")) {
            if (ms->merges_done || ms->merges_span)
                return dg_jscan_fail(s, "duplicate key 'merges'");
            if (ms->vocab_done) {
                rc = scan_merges(t, s, what, err);
                ms->merges_done = 1;
            } else {
                rc = dg_jscan_span(s, &ms->merges_span, &ms->merges_len);
            }
        } else if (!strcmp(key, "type")) {
            if ((rc = dg_jscan_string(s)) == 0 && strcmp(s->buf, "BPE") != 0)
                return unsupported(err, what, "model type", s->buf);
            have_type = 1;
        } else if (!strcmp(key, "unk_token")) {
            if (ms->unk)
                return dg_jscan_fail(s, "duplicate key 'unk_token'");
            if (c == 'n')
                rc = dg_jscan_skip(s);
            else if ((rc = dg_jscan_string(s)) == 0 && !(ms->unk = strdup(s->buf)))
                rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        } else if (!strcmp(key, "byte_fallback") || !strcmp(key, "fuse_unk") ||
                   !strcmp(key, "ignore_merges")) {
            int v = c == 't';
            if (c != 't' && c != 'f')
                return dg_jscan_fail(s, "%s must be a boolean", key);
            rc = dg_jscan_skip(s);
            if (!strcmp(key, "byte_fallback"))
                t->byte_fallback = v;
            else if (!strcmp(key, "fuse_unk"))
                t->fuse_unk = v;
            else
                t->ignore_merges = v;
        } else if (!strcmp(key, "dropout")) {
            const char *sp;
            size_t len;
            rc = dg_jscan_span(s, &sp, &len);
            if (rc == 0 && !(len == 4 && !memcmp(sp, "null", 4)) &&
                !(len >= 1 && strspn(sp, "0.") == len))
                return unsupported(err, what, "BPE", "dropout (it makes encoding random)");
        } else if (!strcmp(key, "continuing_subword_prefix") ||
                   !strcmp(key, "end_of_word_suffix")) {
            if (c == 'n')
                rc = dg_jscan_skip(s);
            else if ((rc = dg_jscan_string(s)) == 0 && s->len)
                return unsupported(err, what, "BPE", key);
        } else {
            rc = dg_jscan_skip(s);
        }
        if (rc < 0)
            return rc;
    }
    if (rc < 0)
        return rc;
    if (!have_type)
        return dg_error_set(err, DG_E_FORMAT, "%s: model has no type", what);
    if (!ms->vocab_done || !(ms->merges_done || ms->merges_span))
        return dg_error_set(err, DG_E_FORMAT, "%s: model needs vocab and merges", what);
    if (ms->merges_span) { /* merges came first: read them now */
        struct dg_jscan sub;
        dg_jscan_init(&sub, ms->merges_span, ms->merges_len, what, err);
        rc = scan_merges(t, &sub, what, err);
        dg_jscan_free(&sub);
        if (rc < 0)
            return rc;
        ms->merges_done = 1;
    }
    return 0;
}

/* ---- tokenizer_config.json --------------------------------------------------- */

static int read_config(struct dg_tokenizer *t, const char *path, struct dg_error *err)
{
    char *buf;
    size_t len;
    json_t *root, *bos;
    int rc;

    if (!path || !dg_file_exists(path))
        return 0;
    if ((rc = dg_file_read(path, 64u << 20, &buf, &len, err)) < 0)
        return rc;
    root = dg_json_parse(buf, len, path, err);
    free(buf);
    if (!root)
        return dg_json_parse_status(err);
    bos = json_object_get(root, "bos_token");
    if (json_is_object(bos))
        bos = json_object_get(bos, "content");
    if (json_is_string(bos) && json_string_length(bos) < sizeof t->bos_text) {
        int32_t id = dg_tokenizer_token_id(t, json_string_value(bos), json_string_length(bos));
        if (id >= 0) {
            snprintf(t->bos_text, sizeof t->bos_text, "%s", json_string_value(bos));
            t->bos_id = id;
        }
    }
    json_decref(root);
    return 0;
}

/* ---- load ------------------------------------------------------------------ */

/* One small part of tokenizer.json (span: its raw text) as a jansson value;
 * errors name the file and the part ("tokenizer.json: normalizer: malformed
 * JSON at line L column C: ...", the line counted within the part). */
static int parse_small(const char *span, size_t len, const char *what, const char *key,
                       json_t **out, struct dg_error *err)
{
    char where[512];
    struct dg_error e = {0};
    snprintf(where, sizeof where, "%s: %s", what, key);
    *out = dg_json_loadb(span, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, where, &e);
    return *out ? 0 : dg_error_set(err, e.code, "%s", e.msg);
}

static int load_text(const char *text, size_t len, const char *path, const char *config_path,
                     struct dg_tokenizer **out, struct dg_error *err);

int dg_tokenizer_load(const char *path, const char *config_path, struct dg_tokenizer **out,
                      struct dg_error *err)
{
    struct dg_mapping map = {0};
    int rc;

    *out = NULL;
    if ((rc = dg_file_map(path, &map, err)) < 0)
        return rc;
    if (map.size > DG_TOKENIZER_JSON_MAX) {
        dg_file_unmap(&map);
        return dg_error_set(err, DG_E_RANGE, "%s: %zu bytes, more than the %u allowed", path,
                            map.size, DG_TOKENIZER_JSON_MAX);
    }
    rc = load_text(map.addr ? (const char *)map.addr : "", map.size, path, config_path, out, err);
    dg_file_unmap(&map);
    return rc;
}

int dg_tokenizer_load_text(const char *text, size_t len, const char *what,
                           struct dg_tokenizer **out, struct dg_error *err)
{
    return load_text(text, len, what, NULL, out, err);
}

static int load_text(const char *text, size_t len, const char *path, const char *config_path,
                     struct dg_tokenizer **out, struct dg_error *err)
{
    struct dg_tokenizer *t = calloc(1, sizeof *t);
    struct model_state ms = {0};
    struct dg_jscan s;
    json_t *comp[5] = {0};
    static const char *const comp_name[5] = {"added_tokens", "normalizer", "pre_tokenizer",
                                             "post_processor", "decoder"};
    int rc, have_model = 0;
    int64_t max_id = -1;

    *out = NULL;
    if (!t)
        return dg_error_set(err, DG_E_NOMEM, "out of memory");
    t->unk_id = -1;
    t->bos_id = -1;
    memset(&s, 0, sizeof s);

    dg_jscan_init(&s, text, len, path, err);
    if ((rc = dg_jscan_object_begin(&s)) < 0)
        goto fail;
    while ((rc = dg_jscan_object_next(&s)) > 0) {
        int which = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(s.buf, comp_name[i]))
                which = i;
        if (which >= 0) {
            const char *sp;
            size_t sl;
            if (comp[which]) {
                rc = dg_jscan_fail(&s, "duplicate key '%s'", comp_name[which]);
                goto fail;
            }
            if ((rc = dg_jscan_span(&s, &sp, &sl)) < 0 ||
                (rc = parse_small(sp, sl, path, comp_name[which], &comp[which], err)) < 0)
                goto fail;
        } else if (!strcmp(s.buf, "model")) {
            if (have_model) {
                rc = dg_jscan_fail(&s, "duplicate key 'model'");
                goto fail;
            }
            have_model = 1;
            if ((rc = scan_model(t, &s, &ms, path, err)) < 0)
                goto fail;
        } else if (!strcmp(s.buf, "truncation") || !strcmp(s.buf, "padding")) {
            char key[16];
            snprintf(key, sizeof key, "%s", s.buf);
            if (dg_jscan_peek(&s) != 'n') {
                rc = dg_error_set(err, DG_E_UNSUPPORTED, "%s: %s must be null", path, key);
                goto fail;
            }
            if ((rc = dg_jscan_skip(&s)) < 0)
                goto fail;
        } else if ((rc = dg_jscan_skip(&s)) < 0) {
            goto fail;
        }
    }
    if (rc < 0 || (rc = dg_jscan_finish(&s)) < 0)
        goto fail;
    if (!have_model) {
        rc = dg_error_set(err, DG_E_FORMAT, "%s: no model", path);
        goto fail;
    }

    /* the pipeline, then added tokens on top of the vocabulary */
    if ((comp[1] && (rc = parse_normalizer(t, comp[1], path, err)) < 0) ||
        (comp[2] && (rc = parse_pre_tokenizer(t, comp[2], path, err)) < 0) ||
        (comp[3] && (rc = parse_post_processor(t, comp[3], path, err)) < 0) ||
        (comp[4] && (rc = parse_decoder(t, comp[4], path, err)) < 0))
        goto fail;
    if (comp[0] && (rc = parse_added(t, comp[0], path, err)) < 0)
        goto fail;
    for (int64_t id = 0; id < t->n_ids; id++)
        if (t->off[id] != DG_TOK_NONE)
            max_id = id;
    if (max_id < 0) {
        rc = dg_error_set(err, DG_E_FORMAT, "%s: the vocabulary is empty", path);
        goto fail;
    }
    t->n_ids = max_id + 1;
    if ((rc = build_all_map(t, path, err)) < 0)
        goto fail;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_strmap_get(t, &t->vocab, name, 6);
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        t->ascii_id[c] = tok_strmap_get(t, &t->vocab, &ch, 1);
    }
    for (int64_t id = 0; id < t->n_ids; id++) {
        size_t l;
        const char *sx;
        int v;
        if (t->off[id] == DG_TOK_NONE)
            continue;
        sx = tok_text(t, (int32_t)id, &l);
        if ((v = tok_byte_value(sx, l)) >= 0) {
            t->flags[id] |= TOK_F_BYTE;
            t->byte_of[id] = (uint8_t)v;
        }
    }
    if (ms.unk) {
        t->unk_id = tok_strmap_get(t, &t->all, ms.unk, strlen(ms.unk));
        if (t->unk_id < 0) {
            rc = dg_error_set(err, DG_E_FORMAT, "%s: unk_token '%.64s' is not a token", path, ms.unk);
            goto fail;
        }
    }
    if ((rc = build_trie(t, &t->added_raw, 0, err)) < 0 || (rc = build_trie(t, &t->added_norm, 1, err)) < 0)
        goto fail;
    for (int i = 0; i < t->n_prefix + t->n_suffix; i++) {
        int32_t id = i < t->n_prefix ? t->prefix[i] : t->suffix[i - t->n_prefix];
        if (id >= t->n_ids || t->off[id] == DG_TOK_NONE) {
            rc = dg_error_set(err, DG_E_FORMAT, "%s: the post-processor adds id %d, which is not a "
                              "token", path, id);
            goto fail;
        }
    }
    if (t->n_prefix > 0) { /* BOS: the post-processor's first token */
        size_t l;
        const char *sx = tok_text(t, t->prefix[0], &l);
        if (l < sizeof t->bos_text) {
            memcpy(t->bos_text, sx, l);
            t->bos_text[l] = '\0';
            t->bos_id = t->prefix[0];
        }
    }
    if ((rc = read_config(t, config_path, err)) < 0)
        goto fail;

    for (int i = 0; i < 5; i++)
        json_decref(comp[i]);
    free(ms.unk);
    dg_jscan_free(&s);
    *out = t;
    return 0;
fail:
    for (int i = 0; i < 5; i++)
        json_decref(comp[i]);
    free(ms.unk);
    dg_jscan_free(&s);
    dg_tokenizer_free(t);
    return rc < 0 ? rc : -DG_E_FORMAT;
}

static void free_trie(struct tok_trie *tr)
{
    free(tr->accept);
    free(tr->edge_key);
    free(tr->edge_child);
}

void dg_tokenizer_free(struct dg_tokenizer *t)
{
    if (!t)
        return;
    free(t->off);
    free(t->len);
    free(t->flags);
    free(t->byte_of);
    free(t->arena);
    free(t->vocab.slot);
    free(t->all.slot);
    free(t->merges.slot);
    free_trie(&t->added_raw);
    free_trie(&t->added_norm);
    for (int i = 0; i < 8; i++) {
        free(t->norm[i].pattern);
        free(t->norm[i].content);
        free(t->pre[i].pattern);
        free(t->dec[i].pattern);
        free(t->dec[i].content);
    }
    free(t);
}

/* ---- queries --------------------------------------------------------------- */

int64_t dg_tokenizer_n_ids(const struct dg_tokenizer *t)
{
    return t->n_ids;
}

int32_t dg_tokenizer_token_id(const struct dg_tokenizer *t, const char *s, size_t len)
{
    return tok_strmap_get(t, &t->all, s, len);
}

const char *dg_tokenizer_token_text(const struct dg_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || t->off[id] == DG_TOK_NONE)
        return NULL;
    return tok_text(t, id, len);
}

int dg_tokenizer_is_special(const struct dg_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_F_SPECIAL);
}

const char *dg_tokenizer_bos(const struct dg_tokenizer *t, int32_t *id)
{
    if (id)
        *id = t->bos_id;
    return t->bos_id >= 0 ? t->bos_text : NULL;
}
