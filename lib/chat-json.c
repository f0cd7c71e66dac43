/* chat-json.c - JSON chat messages to a prompt (see chat-json.h). */
#include "lib/chat-json.h"

#include <stdlib.h>
#include <string.h>

/* content: a string, or a list of {"type": "text", "text": ...} */
static int content_parts(const json_t *content, size_t msg, struct dg_chat_part *parts,
                         size_t *n, struct dg_error *err)
{
    const json_t *item;
    size_t i;

    *n = 0;
    if (json_is_string(content)) {
        parts[0].text = json_string_value(content);
        parts[0].len = json_string_length(content);
        *n = 1;
        return 0;
    }
    if (!json_is_array(content))
        return dg_error_set(err, DG_E_INVAL, "messages[%zu].content: must be a string or a list "
                            "of text items", msg);
    if (json_array_size(content) > DG_CHAT_MAX_PARTS)
        return dg_error_set(err, DG_E_INVAL, "messages[%zu].content: more than %d items", msg,
                            DG_CHAT_MAX_PARTS);
    json_array_foreach(content, i, item) {
        const json_t *type = json_object_get(item, "type"), *text = json_object_get(item, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text))
            return dg_error_set(err, DG_E_INVAL, "messages[%zu].content[%zu]: not {\"type\": "
                                "\"text\", \"text\": ...} (images and other items are not "
                                "supported)", msg, i);
        parts[*n].text = json_string_value(text);
        parts[*n].len = json_string_length(text);
        (*n)++;
    }
    return 0;
}

int dg_chat_render_json(const struct dg_tokenizer *t, const json_t *messages,
                        int add_generation_prompt, int enable_thinking, struct dg_buf *out,
                        struct dg_chat_spans *content, struct dg_error *err)
{
    struct dg_chat_message *msgs;
    struct dg_chat_part *parts;
    const json_t *m;
    size_t i, n, used = 0;
    int rc = 0;

    if (!json_is_array(messages))
        return dg_error_set(err, DG_E_INVAL, "messages: must be a list");
    n = json_array_size(messages);
    if (n > DG_CHAT_MAX_MESSAGES)
        return dg_error_set(err, DG_E_INVAL, "messages: %zu of them; at most %d", n,
                            DG_CHAT_MAX_MESSAGES);
    {
        size_t total = 0;
        json_array_foreach(messages, i, m) {
            const json_t *c = json_object_get(m, "content");
            total += json_is_array(c) ? json_array_size(c) : 1;
        }
        msgs = calloc(n ? n : 1, sizeof *msgs);
        parts = calloc(total ? total : 1, sizeof *parts);
    }
    if (!msgs || !parts) {
        free(msgs);
        free(parts);
        return dg_error_set(err, DG_E_NOMEM, "messages: out of memory");
    }
    json_array_foreach(messages, i, m) {
        const json_t *role = json_object_get(m, "role");
        size_t k = 0;
        if (!json_is_object(m) || !json_is_string(role)) {
            rc = dg_error_set(err, DG_E_INVAL, "messages[%zu]: needs a string \"role\"", i);
            break;
        }
        msgs[i].role = json_string_value(role);
        msgs[i].parts = parts + used;
        if ((rc = content_parts(json_object_get(m, "content"), i, parts + used, &k, err)) < 0)
            break;
        msgs[i].n_parts = k;
        used += k;
    }
    if (rc == 0)
        rc = dg_chat_render_spans(t, msgs, n, add_generation_prompt, enable_thinking, out,
                                  content, err);
    free(msgs);
    free(parts);
    return rc;
}

int dg_chat_encode_json(const struct dg_tokenizer *t, const json_t *messages,
                        int add_generation_prompt, int enable_thinking, int parse_special,
                        struct dg_buf *text, struct dg_ids *ids, struct dg_error *err)
{
    struct dg_chat_spans content = {0};
    int rc = dg_chat_render_json(t, messages, add_generation_prompt, enable_thinking, text,
                                 parse_special ? NULL : &content, err);
    if (rc == 0)
        rc = dg_tokenizer_encode_literal(t, text->s, text->n, 0, content.v, content.n, ids, err);
    dg_chat_spans_free(&content);
    return rc;
}
