/*
 * chat-format.h - rendering chat messages into a prompt, chosen from the
 * turn tokens the tokenizer defines (model.md §8):
 *
 *   Gemma 4 / DiffusionGemma (<|turn> and <turn|> exist):
 *     <bos>[<|turn>system\n[<|think|>\n]{system}<turn|>\n]
 *     (<|turn>{user|model}\n{content}<turn|>\n)*
 *     [<|turn>model\n[<|channel>thought\n<channel|>]]
 *     The system turn appears when there is a system message or thinking
 *     is on; with thinking off (the default) the generation prompt ends in
 *     an empty closed thought channel; earlier model turns have their
 *     <|channel>...<channel|> sections removed.
 *   Gemma 3 (<start_of_turn> and <end_of_turn> exist):
 *     <bos>(<start_of_turn>{user|model}\n{content}<end_of_turn>\n)*
 *     [<start_of_turn>model\n]; a system message is folded into the first
 *     user turn as "{system}\n\n"; user and model turns must alternate.
 *
 * Roles: system (first message only), user, assistant (or model); any
 * other role is an error.  Content is trimmed of leading and trailing
 * whitespace (Python's str.strip, as Jinja's trim), except the Gemma 3
 * system prefix, which the template leaves as it is.  The rendered text
 * starts with the BOS token's text, so encode it without DG_TOK_ADD_SPECIAL.
 */
#ifndef DG_CHAT_FORMAT_H
#define DG_CHAT_FORMAT_H

#include <stddef.h>

#include "lib/error.h"
#include "lib/tokenizer.h"

enum dg_chat_format { DG_CHAT_NONE = 0, DG_CHAT_GEMMA4 = 1, DG_CHAT_GEMMA3 = 2 };

struct dg_chat_part {
    const char *text;
    size_t len;
};

struct dg_chat_message {
    const char *role;
    const struct dg_chat_part *parts; /* content: one part for a plain string */
    size_t n_parts;
};

/* Which format the tokenizer's tokens call for. */
enum dg_chat_format dg_chat_detect(const struct dg_tokenizer *t);

/* Render msgs[0..n) into out.  Errors: DG_E_UNSUPPORTED (the tokenizer
 * defines no chat tokens), DG_E_INVAL (an unknown role, a misplaced system
 * message, Gemma 3 turns that do not alternate, no messages). */
int dg_chat_render(const struct dg_tokenizer *t, const struct dg_chat_message *msgs, size_t n,
                   int add_generation_prompt, int enable_thinking, struct dg_buf *out,
                   struct dg_error *err);

/* The byte ranges of a rendered prompt that hold the messages' text (the
 * trimmed contents and the Gemma 3 system prefix), sorted, disjoint and
 * non-empty, for dg_tokenizer_encode_literal. */
struct dg_chat_spans {
    struct dg_text_span *v;
    size_t n, cap;
};

void dg_chat_spans_free(struct dg_chat_spans *sp);

/* dg_chat_render, and when content is not NULL, the ranges of out that
 * hold the messages' text appended to *content (offsets from out's start).
 * Errors: those of dg_chat_render. */
int dg_chat_render_spans(const struct dg_tokenizer *t, const struct dg_chat_message *msgs,
                         size_t n, int add_generation_prompt, int enable_thinking,
                         struct dg_buf *out, struct dg_chat_spans *content, struct dg_error *err);

#endif
