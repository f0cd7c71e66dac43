/* chat-format.c - see chat-format.h. */
#include "lib/chat-format.h"

#include <stdlib.h>
#include <string.h>

#include "lib/grow.h"
#include "lib/utf8.h"

enum dg_chat_format dg_chat_detect(const struct dg_tokenizer *t)
{
    if (dg_tokenizer_token_id(t, "<|turn>", 7) >= 0 && dg_tokenizer_token_id(t, "<turn|>", 7) >= 0)
        return DG_CHAT_GEMMA4;
    if (dg_tokenizer_token_id(t, "<start_of_turn>", 15) >= 0 &&
        dg_tokenizer_token_id(t, "<end_of_turn>", 13) >= 0)
        return DG_CHAT_GEMMA3;
    return DG_CHAT_NONE;
}

/* [*a, *b) without leading and trailing Unicode whitespace */
static void trim(const char *s, size_t n, size_t *a, size_t *b)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, j = n;
    while (i < n) {
        uint32_t cp;
        size_t l = dg_utf8_decode(u + i, n - i, &cp);
        if (!l || !dg_unicode_is_space(cp))
            break;
        i += l;
    }
    while (j > i) {
        size_t k = j - 1;
        uint32_t cp;
        size_t l;
        while (k > i && (u[k] & 0xc0) == 0x80)
            k--;
        l = dg_utf8_decode(u + k, j - k, &cp);
        if (!l || k + l != j || !dg_unicode_is_space(cp))
            break;
        j = k;
    }
    *a = i;
    *b = j;
}

static int put(struct dg_buf *out, const char *s, size_t n)
{
    return dg_buf_append(out, s, n);
}

static int puts_(struct dg_buf *out, const char *s)
{
    return dg_buf_append(out, s, strlen(s));
}

/* put, recording the bytes written as a content span when sp is not NULL */
static int put_span(struct dg_buf *out, struct dg_chat_spans *sp, const char *s, size_t n)
{
    size_t at = out->n;
    if (put(out, s, n) < 0)
        return -1;
    if (!sp || n == 0)
        return 0;
    if (sp->n && sp->v[sp->n - 1].start + sp->v[sp->n - 1].len == at) {
        sp->v[sp->n - 1].len += n; /* a part right after the last */
        return 0;
    }
    struct dg_text_span *v = dg_grow(sp->v, &sp->cap, sp->n + 1, sizeof *v, 8);
    if (!v)
        return -1;
    sp->v = v;
    sp->v[sp->n].start = at;
    sp->v[sp->n].len = n;
    sp->n++;
    return 0;
}

void dg_chat_spans_free(struct dg_chat_spans *sp)
{
    free(sp->v);
    memset(sp, 0, sizeof *sp);
}

/* each part trimmed, concatenated; strip_thought removes <|channel>...<channel|> */
static int put_content(struct dg_buf *out, struct dg_chat_spans *sp,
                       const struct dg_chat_message *m, int strip_thought)
{
    for (size_t p = 0; p < m->n_parts; p++) {
        const char *s = m->parts[p].text;
        size_t n = m->parts[p].len, a, b;
        struct dg_buf clean = {0};
        if (strip_thought) {
            size_t i = 0;
            while (i < n) {
                const char *open = memmem(s + i, n - i, "<|channel>", 10), *close;
                if (!open) {
                    if (put(&clean, s + i, n - i) < 0)
                        return -1;
                    break;
                }
                close = memmem(open, (size_t)(s + n - open), "<channel|>", 10);
                if (!close) {
                    if (put(&clean, s + i, n - i) < 0)
                        return -1;
                    break;
                }
                if (put(&clean, s + i, (size_t)(open - (s + i))) < 0)
                    return -1;
                i = (size_t)(close + 10 - s);
            }
            if (!clean.s && put(&clean, "", 0) < 0)
                return -1;
            s = clean.s;
            n = clean.n;
        }
        trim(s, n, &a, &b);
        if (put_span(out, sp, s + a, b - a) < 0) {
            dg_buf_free(&clean);
            return -1;
        }
        dg_buf_free(&clean);
    }
    return 0;
}

static int role_of(const char *r)
{
    if (!strcmp(r, "system"))
        return 's';
    if (!strcmp(r, "user"))
        return 'u';
    if (!strcmp(r, "assistant") || !strcmp(r, "model"))
        return 'm';
    return 0;
}

int dg_chat_render(const struct dg_tokenizer *t, const struct dg_chat_message *msgs, size_t n,
                   int add_generation_prompt, int enable_thinking, struct dg_buf *out,
                   struct dg_error *err)
{
    return dg_chat_render_spans(t, msgs, n, add_generation_prompt, enable_thinking, out, NULL,
                                err);
}

int dg_chat_render_spans(const struct dg_tokenizer *t, const struct dg_chat_message *msgs,
                         size_t n, int add_generation_prompt, int enable_thinking,
                         struct dg_buf *out, struct dg_chat_spans *content, struct dg_error *err)
{
    enum dg_chat_format f = dg_chat_detect(t);
    const char *bos = dg_tokenizer_bos(t, NULL);
    size_t first = 0;
    int has_system;

    if (f == DG_CHAT_NONE)
        return dg_error_set(err, DG_E_UNSUPPORTED,
                            "chat: the tokenizer defines neither <|turn>/<turn|> nor "
                            "<start_of_turn>/<end_of_turn>");
    if (n == 0)
        return dg_error_set(err, DG_E_INVAL, "chat: no messages");
    for (size_t i = 0; i < n; i++) {
        int r = role_of(msgs[i].role ? msgs[i].role : "");
        if (!r)
            return dg_error_set(err, DG_E_INVAL,
                                "chat: message %zu has role '%.32s'; roles are system, user and "
                                "assistant (or model)", i, msgs[i].role ? msgs[i].role : "");
        if (r == 's' && i > 0)
            return dg_error_set(err, DG_E_INVAL,
                                "chat: message %zu is a system message; only the first may be", i);
    }
    has_system = role_of(msgs[0].role) == 's';
    if (has_system)
        first = 1;
    if (bos && puts_(out, bos) < 0)
        goto oom;

    if (f == DG_CHAT_GEMMA4) {
        if (has_system || enable_thinking) {
            if (puts_(out, "<|turn>system\n") < 0 ||
                (enable_thinking && puts_(out, "<|think|>\n") < 0) ||
                (has_system && put_content(out, content, &msgs[0], 0) < 0) || puts_(out, "<turn|>\n") < 0)
                goto oom;
        }
        for (size_t i = first; i < n; i++) {
            int model = role_of(msgs[i].role) == 'm';
            if (puts_(out, model ? "<|turn>model\n" : "<|turn>user\n") < 0 ||
                put_content(out, content, &msgs[i], model) < 0 || puts_(out, "<turn|>\n") < 0)
                goto oom;
        }
        if (add_generation_prompt &&
            (puts_(out, "<|turn>model\n") < 0 ||
             (!enable_thinking && puts_(out, "<|channel>thought\n<channel|>") < 0)))
            goto oom;
        return 0;
    }

    /* Gemma 3 */
    for (size_t i = first; i < n; i++) {
        int model = role_of(msgs[i].role) == 'm';
        if (model != ((i - first) % 2 == 1))
            return dg_error_set(err, DG_E_INVAL,
                                "chat: conversation roles must alternate user/assistant/user/... "
                                "(message %zu)", i);
        if (puts_(out, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n") < 0)
            goto oom;
        if (i == first && has_system) {
            /* the template adds the system text untrimmed: a string, or its first part */
            if (msgs[0].n_parts &&
                put_span(out, content, msgs[0].parts[0].text, msgs[0].parts[0].len) < 0)
                goto oom;
            if (puts_(out, "\n\n") < 0)
                goto oom;
        }
        if (put_content(out, content, &msgs[i], 0) < 0 || puts_(out, "<end_of_turn>\n") < 0)
            goto oom;
    }
    if (add_generation_prompt && puts_(out, "<start_of_turn>model\n") < 0)
        goto oom;
    return 0;
oom:
    return dg_error_set(err, DG_E_NOMEM, "chat: out of memory");
}
