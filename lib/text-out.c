/* text-out.c - streaming text with stop strings (see text-out.h). */
#include "lib/text-out.h"

#include <string.h>

int dg_text_out_init(struct dg_text_out *to, const struct dg_tokenizer *tok,
                     const struct dg_gen_settings *settings, struct dg_error *err)
{
    memset(to, 0, sizeof *to);
    to->settings = settings;
    to->matched = -1;
    return dg_tok_stream_init(&to->st, tok, 1, err);
}

void dg_text_out_free(struct dg_text_out *to)
{
    dg_tok_stream_free(&to->st);
    dg_buf_free(&to->pending);
    dg_buf_free(&to->piece);
    memset(to, 0, sizeof *to);
}

/* Earliest occurrence of any stop string in b (*which: its index); -1 if
 * none. */
static long first_stop(const struct dg_gen_settings *s, const struct dg_buf *b, int *which)
{
    long best = -1;
    if (b->n == 0)
        return -1;
    for (int i = 0; i < s->n_stop_strings; i++) {
        const char *hit = memmem(b->s, b->n, s->stop_strings[i], strlen(s->stop_strings[i]));
        if (hit && (best < 0 || hit - b->s < best)) {
            best = hit - b->s;
            *which = i;
        }
    }
    return best;
}

/* Length of the longest suffix of b that is a proper prefix of a stop string. */
static size_t held_suffix(const struct dg_gen_settings *s, const struct dg_buf *b)
{
    size_t hold = 0;
    for (int i = 0; i < s->n_stop_strings; i++) {
        const size_t len = strlen(s->stop_strings[i]);
        for (size_t k = len - 1; k > hold; k--)
            if (k <= b->n && !memcmp(b->s + b->n - k, s->stop_strings[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

static int release(struct dg_buf *from, size_t n, struct dg_buf *out, struct dg_error *err)
{
    if (n == 0)
        return 0;
    if (dg_buf_append(out, from->s, n) < 0)
        return dg_error_set(err, DG_E_NOMEM, "text: out of memory");
    memmove(from->s, from->s + n, from->n - n);
    from->n -= n;
    from->s[from->n] = '\0';
    return 0;
}

int dg_text_out_push(struct dg_text_out *to, const int32_t *ids, size_t n, struct dg_buf *out,
                     size_t *consumed, int *stopped, struct dg_error *err)
{
    int rc;

    *consumed = 0;
    *stopped = to->stopped;
    for (size_t i = 0; i < n && !to->stopped; i++) {
        long at;
        to->piece.n = 0;
        if ((rc = dg_tok_stream_push(&to->st, &ids[i], 1, &to->piece, err)) < 0)
            return rc;
        if (to->piece.n && dg_buf_append(&to->pending, to->piece.s, to->piece.n) < 0)
            return dg_error_set(err, DG_E_NOMEM, "text: out of memory");
        *consumed = i + 1;
        if (to->settings->n_stop_strings == 0) {
            if ((rc = release(&to->pending, to->pending.n, out, err)) < 0)
                return rc;
            continue;
        }
        if ((at = first_stop(to->settings, &to->pending, &to->matched)) >= 0) {
            if ((rc = release(&to->pending, (size_t)at, out, err)) < 0)
                return rc;
            to->pending.n = 0;
            to->stopped = *stopped = 1;
            break;
        }
        if ((rc = release(&to->pending, to->pending.n - held_suffix(to->settings, &to->pending),
                          out, err)) < 0)
            return rc;
    }
    return 0;
}

int dg_text_out_finish(struct dg_text_out *to, struct dg_buf *out, struct dg_error *err)
{
    int rc;
    if (to->stopped)
        return 0;
    to->piece.n = 0;
    if ((rc = dg_tok_stream_finish(&to->st, &to->piece, err)) < 0)
        return rc;
    if (to->piece.n && dg_buf_append(&to->pending, to->piece.s, to->piece.n) < 0)
        return dg_error_set(err, DG_E_NOMEM, "text: out of memory");
    if (to->settings->n_stop_strings) {
        const long at = first_stop(to->settings, &to->pending, &to->matched);
        if (at >= 0) {
            to->pending.n = (size_t)at;
            to->stopped = 1;
        }
    }
    return release(&to->pending, to->pending.n, out, err);
}
