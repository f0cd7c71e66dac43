/* tokenizer-decode.c - ids to text, whole and streaming; see tokenizer.h. */
#include "lib/tokenizer-internal.h"

#include <stdlib.h>
#include <string.h>

#include "lib/utf8.h"

/* A list of token strings, each a span of one shared byte buffer. */
struct plist {
    struct dg_buf text;
    size_t *off, *len;
    size_t n, cap;
};

static int plist_add(struct plist *p, const char *s, size_t n)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        size_t *o = realloc(p->off, cap * sizeof *o), *l;
        if (!o)
            return -1;
        p->off = o;
        l = realloc(p->len, cap * sizeof *l);
        if (!l)
            return -1;
        p->len = l;
        p->cap = cap;
    }
    p->off[p->n] = p->text.n;
    p->len[p->n] = n;
    if (dg_buf_append(&p->text, s, n) < 0)
        return -1;
    p->n++;
    return 0;
}

static void plist_free(struct plist *p)
{
    dg_buf_free(&p->text);
    free(p->off);
    free(p->len);
    memset(p, 0, sizeof *p);
}

static void plist_swap(struct plist *a, struct plist *b)
{
    struct plist t = *a;
    *a = *b;
    *b = t;
    b->n = 0;
    b->text.n = 0;
}

/* (tokenizer-internal.h) */
int tok_byte_value(const char *s, size_t n)
{
    int v = 0;
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (i == 3 && c == '+')
            continue;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static int flush_bytes(struct plist *out, const unsigned char *b, size_t n)
{
    if (!n)
        return 0;
    if (dg_utf8_valid_prefix(b, n) == n)
        return plist_add(out, (const char *)b, n);
    for (size_t i = 0; i < n; i++) /* invalid: one U+FFFD per byte, as the reference */
        if (plist_add(out, "\xef\xbf\xbd", 3) < 0)
            return -1;
    return 0;
}

/* One decoder step over `in` into `out`.  lead_budget: NULL to strip each
 * token as the op says; else (a Strip after a Fuse, in a stream) how many
 * leading characters may still go, updated for the next chunk. */
static int apply_op(const struct tok_dec_op *op, struct plist *in, struct plist *out,
                    int *lead_budget)
{
    switch (op->kind) {
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.s + in->off[i];
            size_t n = in->len[i], k = 0, run = 0, start = out->text.n;
            /* write the replaced token directly into out's buffer */
            while (k + op->pattern_len <= n) {
                if (memcmp(s + k, op->pattern, op->pattern_len) == 0) {
                    if (dg_buf_append(&out->text, s + run, k - run) < 0 ||
                        dg_buf_append(&out->text, op->content, op->content_len) < 0)
                        return -1;
                    k += op->pattern_len;
                    run = k;
                } else {
                    k++;
                }
            }
            if (dg_buf_append(&out->text, s + run, n - run) < 0)
                return -1;
            {
                size_t len = out->text.n - start;
                out->text.n = start; /* plist_add appends it again at the same place */
                if (plist_add(out, out->text.s + start, len) < 0)
                    return -1;
            }
        }
        return 0;
    case DEC_BYTE_FALLBACK: {
        unsigned char *run = malloc(in->n + 1);
        size_t nrun = 0;
        if (!run)
            return -1;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = in->text.s + in->off[i];
            int b = tok_byte_value(s, in->len[i]);
            if (b >= 0) {
                run[nrun++] = (unsigned char)b;
                continue;
            }
            if (flush_bytes(out, run, nrun) < 0 || plist_add(out, s, in->len[i]) < 0) {
                free(run);
                return -1;
            }
            nrun = 0;
        }
        if (flush_bytes(out, run, nrun) < 0) {
            free(run);
            return -1;
        }
        free(run);
        return 0;
    }
    case DEC_FUSE: {
        size_t total = 0;
        for (size_t i = 0; i < in->n; i++)
            total += in->len[i];
        /* the spans are contiguous in order only if untouched; copy to be safe */
        if (plist_add(out, "", 0) < 0)
            return -1;
        for (size_t i = 0; i < in->n; i++)
            if (dg_buf_append(&out->text, in->text.s + in->off[i], in->len[i]) < 0)
                return -1;
        out->len[0] = total;
        return 0;
    }
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const unsigned char *s = (const unsigned char *)in->text.s + in->off[i];
            size_t n = in->len[i], a = 0, b = n;
            int lead = op->strip_start, k;
            uint32_t cp;
            size_t l;
            if (lead_budget)
                lead = *lead_budget;
            for (k = 0; k < lead && a < n; k++) {
                l = dg_utf8_decode(s + a, n - a, &cp);
                if (!l || cp != op->strip_char)
                    break;
                a += l;
            }
            if (lead_budget) /* a stream: what is left of the leading cut for later text */
                *lead_budget = a == n ? lead - k : 0;
            for (k = 0; k < op->strip_stop && b > a; k++) {
                size_t c = b - 1;
                while (c > a && (s[c] & 0xc0) == 0x80)
                    c--; /* back to the start of the last character */
                l = dg_utf8_decode(s + c, b - c, &cp);
                if (!l || c + l != b || cp != op->strip_char)
                    break;
                b = c;
            }
            if (plist_add(out, (const char *)s + a, b - a) < 0)
                return -1;
        }
        return 0;
    }
    return 0;
}

/* Decode ids[0..n) through the decoder chain, appending to out.
 * lead_budget: NULL for a whole text; in a stream, the leading-strip budget
 * of a Strip that follows a Fuse (see apply_op). */
static int decode_chunk(const struct dg_tokenizer *t, const int32_t *ids, size_t n,
                        int skip_special, int *lead_budget, struct dg_buf *out,
                        struct dg_error *err)
{
    struct plist a = {0}, b = {0};
    int fused = 0, rc = 0;

    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->off[id] == DG_TOK_NONE)
            continue; /* no such token: skipped, as the reference does */
        if (skip_special && (t->flags[id] & TOK_F_SPECIAL))
            continue;
        if (plist_add(&a, t->arena + t->off[id], t->len[id]) < 0)
            goto oom;
    }
    for (int k = 0; k < t->n_dec; k++) {
        int *budget = t->dec[k].kind == DEC_STRIP && fused ? lead_budget : NULL;
        if (apply_op(&t->dec[k], &a, &b, budget) < 0)
            goto oom;
        if (t->dec[k].kind == DEC_FUSE)
            fused = 1;
        plist_swap(&a, &b);
    }
    for (size_t i = 0; i < a.n; i++)
        if (dg_buf_append(out, a.text.s + a.off[i], a.len[i]) < 0)
            goto oom;
    if (!out->s && dg_buf_append(out, "", 0) < 0)
        goto oom;
    plist_free(&a);
    plist_free(&b);
    return rc;
oom:
    plist_free(&a);
    plist_free(&b);
    return dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory decoding");
}

int dg_tokenizer_decode(const struct dg_tokenizer *t, const int32_t *ids, size_t n,
                        int skip_special, struct dg_buf *out, struct dg_error *err)
{
    return decode_chunk(t, ids, n, skip_special, NULL, out, err);
}

/* ---- streaming ----------------------------------------------------------- */

int dg_tok_stream_init(struct dg_tok_stream *st, const struct dg_tokenizer *t, int skip_special,
                       struct dg_error *err)
{
    int fused = 0;
    memset(st, 0, sizeof *st);
    for (int k = 0; k < t->n_dec; k++) {
        /* after a Fuse the chain sees the whole text: only a leading Strip can stream */
        if (fused && !(t->dec[k].kind == DEC_STRIP && t->dec[k].strip_stop == 0))
            return dg_error_set(err, DG_E_UNSUPPORTED,
                                "tokenizer: this decoder chain cannot be decoded as a stream");
        fused |= t->dec[k].kind == DEC_FUSE;
    }
    st->t = t;
    st->skip_special = skip_special;
    for (int k = 0; k < t->n_dec; k++)
        if (t->dec[k].kind == DEC_STRIP)
            st->lead_budget = t->dec[k].strip_start;
    return 0;
}

static int is_byte_token(const struct dg_tokenizer *t, int32_t id)
{
    return (t->flags[id] & TOK_F_BYTE) != 0;
}

int dg_tok_stream_push(struct dg_tok_stream *st, const int32_t *ids, size_t n,
                       struct dg_buf *out, struct dg_error *err)
{
    const struct dg_tokenizer *t = st->t;
    struct dg_ids *h = &st->held;
    size_t keep_from;
    int rc;

    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->off[id] == DG_TOK_NONE)
            continue;
        if (st->skip_special && (t->flags[id] & TOK_F_SPECIAL))
            continue; /* dropped before decoding, so it does not end a byte run */
        if (h->n < h->cap)
            h->v[h->n++] = id;
        else if (dg_ids_append(h, &id, 1) < 0)
            return dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory");
    }
    /* decode everything up to the trailing run of byte tokens */
    keep_from = h->n;
    while (keep_from > 0 && is_byte_token(t, h->v[keep_from - 1]))
        keep_from--;
    if (keep_from == 0)
        return 0;
    if ((rc = decode_chunk(t, h->v, keep_from, st->skip_special, &st->lead_budget, out, err)) < 0)
        return rc;
    memmove(h->v, h->v + keep_from, (h->n - keep_from) * sizeof *h->v);
    h->n -= keep_from;
    return 0;
}

int dg_tok_stream_finish(struct dg_tok_stream *st, struct dg_buf *out, struct dg_error *err)
{
    int rc = 0;
    if (st->held.n)
        rc = decode_chunk(st->t, st->held.v, st->held.n, st->skip_special, &st->lead_budget, out,
                          err);
    st->held.n = 0;
    return rc;
}

void dg_tok_stream_free(struct dg_tok_stream *st)
{
    dg_ids_free(&st->held);
}
