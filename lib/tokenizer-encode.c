/* tokenizer-encode.c - text to ids; the pipeline is described in tokenizer.h. */
#include "lib/tokenizer-internal.h"

#include <stdlib.h>
#include <string.h>

#include "lib/grow.h"
#include "lib/utf8.h"

/* Scratch reused across the words of one encode call. */
struct enc {
    const struct dg_tokenizer *t;
    struct dg_ids *out;
    struct dg_error *err;
    int flags;
    /* literal byte ranges of the raw text (no added token matched there) */
    const char *base;
    const struct dg_text_span *lit;
    size_t n_lit;
    /* BPE symbols */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    /* merge heap */
    struct cand { uint32_t rank; int32_t pos; int32_t out; } *heap;
    size_t heap_n, heap_cap;
    /* normalized text and pre-tokenized words */
    struct dg_buf norm;
    size_t *word_start, *word_end, words_cap;
};

static int oom(struct enc *e)
{
    return dg_error_set(e->err, DG_E_NOMEM, "tokenizer: out of memory");
}

static int emit(struct enc *e, int32_t id)
{
    struct dg_ids *o = e->out;
    if (o->n < o->cap) { /* (once a token: the common case stays inline) */
        o->v[o->n++] = id;
        return 0;
    }
    return dg_ids_append(o, &id, 1) < 0 ? oom(e) : 0;
}

/* ---- the merge heap: min on (rank, pos) ---------------------------------- */

static int cand_less(const struct cand *a, const struct cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(struct enc *e, uint32_t rank, int32_t pos, int32_t out)
{
    size_t i;
    if (e->heap_n == e->heap_cap) {
        struct cand *h = dg_grow(e->heap, &e->heap_cap, e->heap_n + 1, sizeof *h, 256);
        if (!h)
            return oom(e);
        e->heap = h;
    }
    i = e->heap_n++;
    e->heap[i] = (struct cand){rank, pos, out};
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        struct cand tmp;
        if (!cand_less(&e->heap[i], &e->heap[parent]))
            break;
        tmp = e->heap[i];
        e->heap[i] = e->heap[parent];
        e->heap[parent] = tmp;
        i = parent;
    }
    return 0;
}

static struct cand heap_pop(struct enc *e)
{
    struct cand top = e->heap[0];
    size_t i = 0, n = --e->heap_n;
    e->heap[0] = e->heap[n];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct cand tmp;
        if (l < n && cand_less(&e->heap[l], &e->heap[m]))
            m = l;
        if (r < n && cand_less(&e->heap[r], &e->heap[m]))
            m = r;
        if (m == i)
            break;
        tmp = e->heap[i];
        e->heap[i] = e->heap[m];
        e->heap[m] = tmp;
        i = m;
    }
    return top;
}

/* ---- BPE on one word ----------------------------------------------------- */

static int push_pair(struct enc *e, int32_t pos)
{
    uint32_t rank;
    int32_t out;
    if (tok_merge_get(&e->t->merges, e->sym[pos], e->sym[e->next[pos]], &rank, &out))
        return heap_push(e, rank, pos, out);
    return 0;
}

static int bpe_word(struct enc *e, const char *w, size_t n)
{
    const struct dg_tokenizer *t = e->t;
    size_t ns = 0, i = 0;
    int last_unk = 0, rc;

    if (n == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(t, &t->vocab, w, n);
        if (id >= 0)
            return emit(e, id);
    }
    if (n > e->sym_cap) {
        size_t cap = n + 64;
        int32_t *a = realloc(e->sym, cap * sizeof *a), *b, *c;
        if (a)
            e->sym = a;
        b = realloc(e->prev, cap * sizeof *b);
        if (b)
            e->prev = b;
        c = realloc(e->next, cap * sizeof *c);
        if (c)
            e->next = c;
        if (!a || !b || !c)
            return oom(e);
        e->sym_cap = cap;
    }
    /* code points to symbols: the vocabulary, else its bytes, else <unk> */
    while (i < n) {
        unsigned char c = (unsigned char)w[i];
        size_t l = 1;
        int32_t id;
        if (c < 0x80) {
            id = t->ascii_id[c];
        } else {
            uint32_t cp;
            l = dg_utf8_decode((const unsigned char *)w + i, n - i, &cp);
            id = tok_strmap_get(t, &t->vocab, w + i, l);
        }
        if (id >= 0) {
            e->sym[ns++] = id;
            last_unk = 0;
        } else {
            int all_bytes = t->byte_fallback;
            for (size_t k = 0; all_bytes && k < l; k++)
                all_bytes = t->byte_id[(unsigned char)w[i + k]] >= 0;
            if (all_bytes) {
                for (size_t k = 0; k < l; k++)
                    e->sym[ns++] = t->byte_id[(unsigned char)w[i + k]];
                last_unk = 0;
            } else if (t->unk_id < 0) {
                return dg_error_set(e->err, DG_E_INVAL,
                                    "tokenizer: '%.*s' is not in the vocabulary and there is no "
                                    "unk token", (int)l, w + i);
            } else if (!(t->fuse_unk && last_unk)) {
                e->sym[ns++] = t->unk_id;
                last_unk = 1;
            }
        }
        i += l;
    }
    /* merges, lowest rank first, leftmost on ties */
    for (size_t k = 0; k < ns; k++) {
        e->prev[k] = (int32_t)k - 1;
        e->next[k] = k + 1 < ns ? (int32_t)k + 1 : -1;
    }
    e->heap_n = 0;
    for (size_t k = 0; k + 1 < ns; k++)
        if ((rc = push_pair(e, (int32_t)k)) < 0)
            return rc;
    while (e->heap_n) {
        struct cand c = heap_pop(e);
        int32_t right, after;
        uint32_t rank;
        int32_t out;
        if (e->sym[c.pos] < 0 || e->next[c.pos] < 0)
            continue; /* merged away, or now the last symbol */
        right = e->next[c.pos];
        /* stale if the pair here no longer makes the same token (as the reference checks) */
        if (!tok_merge_get(&t->merges, e->sym[c.pos], e->sym[right], &rank, &out) || out != c.out)
            continue;
        e->sym[c.pos] = c.out;
        e->sym[right] = -1;
        after = e->next[right];
        e->next[c.pos] = after;
        if (after >= 0)
            e->prev[after] = c.pos;
        if (e->prev[c.pos] >= 0 && (rc = push_pair(e, e->prev[c.pos])) < 0)
            return rc;
        if (after >= 0 && (rc = push_pair(e, c.pos)) < 0)
            return rc;
    }
    for (int32_t k = ns ? 0 : -1; k >= 0; k = e->next[k])
        if ((rc = emit(e, e->sym[k])) < 0)
            return rc;
    return 0;
}

/* ---- pre-tokenizer: Split on a string ------------------------------------ */

struct span {
    size_t a, b;
    int match;
};

/* Split [a, b) of text with one Split op, appending the pieces to *out
 * (reference semantics: matches non-overlapping left to right; then the
 * behavior; empty pieces dropped). */
static int split_piece(const struct tok_pre_op *op, const char *text, size_t a, size_t b,
                       struct span **out, size_t *n_out, size_t *cap)
{
    struct span *v = NULL;
    size_t nv = 0, capv = 0, prev = a;
#define PUSH(arr, n, c, val)                                                    \
    do {                                                                        \
        if ((n) == (c)) {                                                       \
            struct span *p_ = dg_grow((arr), &(c), (n) + 1, sizeof *p_, 16);    \
            if (!p_) {                                                          \
                free(v);                                                        \
                return -1;                                                      \
            }                                                                   \
            (arr) = p_;                                                         \
        }                                                                       \
        (arr)[(n)++] = (val);                                                   \
    } while (0)

    for (size_t i = a; i + op->pattern_len <= b;) {
        if (memcmp(text + i, op->pattern, op->pattern_len) == 0) {
            if (prev != i)
                PUSH(v, nv, capv, ((struct span){prev, i, 0}));
            PUSH(v, nv, capv, ((struct span){i, i + op->pattern_len, 1}));
            i += op->pattern_len;
            prev = i;
        } else {
            i++;
        }
    }
    if (prev != b)
        PUSH(v, nv, capv, ((struct span){prev, b, 0}));

    /* apply the behavior into v (in place, front to back) */
    {
        size_t w = 0;
        int previous_match = 0;
        switch (op->behavior) {
        case SPLIT_REMOVED:
            for (size_t i = 0; i < nv; i++)
                if (!v[i].match)
                    v[w++] = v[i];
            break;
        case SPLIT_ISOLATED:
            w = nv;
            break;
        case SPLIT_MERGED_PREV:
            for (size_t i = 0; i < nv; i++) {
                if (v[i].match && !previous_match && w > 0)
                    v[w - 1].b = v[i].b;
                else
                    v[w++] = v[i];
                previous_match = v[i].match;
            }
            break;
        case SPLIT_MERGED_NEXT:
            /* the mirror image: walk backwards, merging a match into what follows */
            for (size_t i = nv; i-- > 0;) {
                if (v[i].match && !previous_match && w > 0)
                    v[nv - w].a = v[i].a;
                else {
                    w++;
                    v[nv - w] = v[i];
                }
                previous_match = v[i].match;
            }
            memmove(v, v + nv - w, w * sizeof *v);
            break;
        case SPLIT_CONTIGUOUS:
            for (size_t i = 0; i < nv; i++) {
                if (w > 0 && v[i].match == previous_match)
                    v[w - 1].b = v[i].b;
                else
                    v[w++] = v[i];
                previous_match = v[i].match;
            }
            break;
        }
        for (size_t i = 0; i < w; i++)
            if (v[i].a != v[i].b)
                PUSH(*out, *n_out, *cap, v[i]);
    }
#undef PUSH
    free(v);
    return 0;
}

/* Pre-tokenize text[0..n) and BPE every word. */
static int words(struct enc *e, const char *text, size_t n)
{
    const struct dg_tokenizer *t = e->t;
    struct span *cur = NULL, *nxt = NULL;
    size_t ncur = 0, capcur = 0, nnxt = 0, capnxt = 0;
    int rc = 0;

    if (n == 0)
        return 0;
    if (t->n_pre == 0)
        return bpe_word(e, text, n);
    cur = malloc(sizeof *cur);
    if (!cur)
        return oom(e);
    cur[0] = (struct span){0, n, 0};
    ncur = capcur = 1;
    for (int k = 0; k < t->n_pre; k++) {
        nnxt = 0;
        for (size_t i = 0; i < ncur; i++)
            if (split_piece(&t->pre[k], text, cur[i].a, cur[i].b, &nxt, &nnxt, &capnxt) < 0) {
                rc = oom(e);
                goto out;
            }
        {
            struct span *tmp = cur;
            size_t tc = capcur;
            cur = nxt;
            capcur = capnxt;
            ncur = nnxt;
            nxt = tmp;
            capnxt = tc;
        }
    }
    for (size_t i = 0; i < ncur && rc == 0; i++)
        rc = bpe_word(e, text + cur[i].a, cur[i].b - cur[i].a);
out:
    free(cur);
    free(nxt);
    return rc;
}

/* ---- normalizer ------------------------------------------------------------ */

int tok_normalize(const struct dg_tokenizer *t, const char *src, size_t n, struct dg_buf *out)
{
    struct dg_buf a = {0}, b = {0};
    struct dg_buf *in = &a, *outb = &b;

    out->n = 0;
    if (dg_buf_append(&a, src, n) < 0)
        return -1;
    for (int k = 0; k < t->n_norm; k++) {
        const struct tok_norm_op *op = &t->norm[k];
        struct dg_buf *tmp;
        outb->n = 0;
        if (op->kind == NORM_PREPEND) {
            if (in->n && (dg_buf_append(outb, op->content, op->content_len) < 0 ||
                          dg_buf_append(outb, in->s, in->n) < 0))
                goto fail;
        } else {
            size_t i = 0, run = 0;
            while (i + op->pattern_len <= in->n) {
                if (memcmp(in->s + i, op->pattern, op->pattern_len) == 0) {
                    if (dg_buf_append(outb, in->s + run, i - run) < 0 ||
                        dg_buf_append(outb, op->content, op->content_len) < 0)
                        goto fail;
                    i += op->pattern_len;
                    run = i;
                } else {
                    i++;
                }
            }
            if (dg_buf_append(outb, in->s + run, in->n - run) < 0)
                goto fail;
        }
        if (!outb->s && dg_buf_append(outb, "", 0) < 0)
            goto fail;
        tmp = in;
        in = outb;
        outb = tmp;
    }
    if (dg_buf_append(out, in->s ? in->s : "", in->n) < 0)
        goto fail;
    dg_buf_free(&a);
    dg_buf_free(&b);
    return 0;
fail:
    dg_buf_free(&a);
    dg_buf_free(&b);
    return -1;
}

/* Does the raw text's [a, b) overlap a literal span? */
static int overlaps_literal(const struct enc *e, size_t a, size_t b)
{
    for (size_t k = 0; k < e->n_lit; k++)
        if (e->lit[k].len && a < e->lit[k].start + e->lit[k].len && e->lit[k].start < b)
            return 1;
    return 0;
}

/* A piece between raw added-token matches: normalize, match the normalized
 * added tokens, pre-tokenize and BPE what lies between them.  A piece that
 * overlaps a literal span matches no normalized added token. */
static int segment(struct enc *e, const char *s, size_t n)
{
    const struct dg_tokenizer *t = e->t;
    const int sat = !!(e->flags & DG_TOK_SPECIAL_AS_TEXT);
    size_t start = 0, i = 0;
    const char *text;
    size_t tn;
    int rc;

    if (n == 0)
        return 0;
    if (t->n_norm) {
        if (tok_normalize(t, s, n, &e->norm) < 0)
            return oom(e);
        text = e->norm.s;
        tn = e->norm.n;
    } else {
        text = s;
        tn = n;
    }
    if (!t->added_norm.n_tokens ||
        overlaps_literal(e, (size_t)(s - e->base), (size_t)(s - e->base) + n))
        return words(e, text, tn);
    while (i < tn) {
        int32_t id;
        size_t m = tok_trie_match(&t->added_norm, text + i, tn - i, sat, t, &id);
        if (!m) {
            i++;
            continue;
        }
        if ((rc = words(e, text + start, i - start)) < 0 || (rc = emit(e, id)) < 0)
            return rc;
        i += m;
        start = i;
    }
    return words(e, text + start, tn - start);
}

int dg_tokenizer_encode(const struct dg_tokenizer *t, const char *text, size_t len, int flags,
                        struct dg_ids *out, struct dg_error *err)
{
    return dg_tokenizer_encode_literal(t, text, len, flags, NULL, 0, out, err);
}

int dg_tokenizer_encode_literal(const struct dg_tokenizer *t, const char *text, size_t len,
                                int flags, const struct dg_text_span *literal, size_t n_literal,
                                struct dg_ids *out, struct dg_error *err)
{
    struct enc e;
    const int sat = !!(flags & DG_TOK_SPECIAL_AS_TEXT);
    size_t bad = dg_utf8_valid_prefix((const unsigned char *)text, len), start = 0, i = 0;
    size_t n0 = out->n, next = 0;
    const struct dg_text_span all = {0, len};
    int rc = 0;

    if (flags & DG_TOK_ADDED_AS_TEXT) {
        literal = &all;
        n_literal = 1;
    }
    if (bad != len)
        return dg_error_set(err, DG_E_INVAL, "tokenizer: invalid UTF-8 at byte %zu of the text", bad);
    for (size_t j = 0; j < n_literal; j++)
        if (literal[j].start > len || literal[j].len > len - literal[j].start ||
            (j && literal[j].start < literal[j - 1].start + literal[j - 1].len))
            return dg_error_set(err, DG_E_INVAL, "tokenizer: literal span %zu is out of order "
                                "or past the text's %zu bytes", j, len);
    memset(&e, 0, sizeof e);
    e.t = t;
    e.out = out;
    e.err = err;
    e.flags = flags;
    e.base = text;
    e.lit = literal;
    e.n_lit = n_literal;
    if (flags & DG_TOK_ADD_SPECIAL)
        for (int k = 0; k < t->n_prefix && rc == 0; k++)
            rc = emit(&e, t->prefix[k]);
    /* leftmost-longest added tokens on the raw text */
    while (rc == 0 && i < len) {
        int32_t id;
        size_t m;
        while (next < n_literal &&
               (!literal[next].len || literal[next].start + literal[next].len <= i))
            next++;
        if (next < n_literal && literal[next].start <= i) {
            i = literal[next].start + literal[next].len; /* inside a literal span: no match */
            continue;
        }
        /* (a match ends where the next literal span starts) */
        m = t->added_raw.first[(unsigned char)text[i]]
                ? tok_trie_match(&t->added_raw, text + i,
                                 (next < n_literal ? literal[next].start : len) - i, sat, t, &id)
                : 0;
        if (!m) {
            i++;
            continue;
        }
        if ((rc = segment(&e, text + start, i - start)) < 0 || (rc = emit(&e, id)) < 0)
            break;
        i += m;
        start = i;
    }
    if (rc == 0)
        rc = segment(&e, text + start, len - start);
    if (rc == 0 && (flags & DG_TOK_ADD_SPECIAL))
        for (int k = 0; k < t->n_suffix && rc == 0; k++)
            rc = emit(&e, t->suffix[k]);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    dg_buf_free(&e.norm);
    if (rc)
        out->n = n0;
    return rc;
}
