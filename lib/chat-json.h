/*
 * chat-json.h - chat messages as JSON ([{"role": ..., "content": ...}]) to a
 * prompt, through the chat formats of chat-format.h.  Content is a string
 * or a list of {"type": "text", "text": ...} items (other item types, such
 * as images, are rejected).
 */
#ifndef DG_CHAT_JSON_H
#define DG_CHAT_JSON_H

#include <jansson.h>

#include "lib/chat-format.h"
#include "lib/error.h"
#include "lib/tokenizer.h"

#define DG_CHAT_MAX_MESSAGES 4096
#define DG_CHAT_MAX_PARTS 256

/* Render messages (a JSON list) into out, appending; when content is not
 * NULL, the ranges of out that hold the messages' text are appended to it
 * (dg_chat_render_spans).  Errors: DG_E_INVAL
 * (not a list, more than DG_CHAT_MAX_MESSAGES, a message without a string
 * role, content neither a string nor a list of text items), and those of
 * dg_chat_render; DG_E_NOMEM. */
int dg_chat_render_json(const struct dg_tokenizer *t, const json_t *messages,
                        int add_generation_prompt, int enable_thinking, struct dg_buf *out,
                        struct dg_chat_spans *content, struct dg_error *err);

/* Render messages as dg_chat_render_json does into text, which starts
 * empty, and encode it, appending to ids; unless parse_special, the
 * messages' text matches no added token (dg_tokenizer_encode_literal over
 * its spans), the format's own markers still do.  Errors: those of
 * dg_chat_render_json and dg_tokenizer_encode_literal. */
int dg_chat_encode_json(const struct dg_tokenizer *t, const json_t *messages,
                        int add_generation_prompt, int enable_thinking, int parse_special,
                        struct dg_buf *text, struct dg_ids *ids, struct dg_error *err);

#endif
