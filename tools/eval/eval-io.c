/* eval-io.c - input helpers shared by dgemma-eval's subcommands. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "tools/eval/eval.h"

#define IDS_FILE_MAX (64u << 20)

int eval_read_ids(const char *path, int64_t vocab, int32_t **ids, size_t *n)
{
    struct dg_error err = {0};
    char *text = NULL;
    size_t len = 0;
    int rc;

    if (!strcmp(path, "-")) {
        size_t cap = 4096;
        text = malloc(cap);
        while (text) {
            size_t got = fread(text + len, 1, cap - len - 1, stdin);
            len += got;
            if (got == 0 || len > IDS_FILE_MAX)
                break;
            if (len + 1 == cap) {
                char *p = realloc(text, cap * 2);
                if (!p) {
                    free(text);
                    text = NULL;
                    break;
                }
                text = p;
                cap *= 2;
            }
        }
        if (!text) {
            eval_errorf("out of memory reading standard input");
            return 1;
        }
        rc = len > IDS_FILE_MAX ? dg_error_set(&err, DG_E_RANGE, "standard input: too long")
                                : dg_ids_parse(text, len, vocab, "standard input", ids, n, &err);
    } else {
        rc = dg_file_read(path, IDS_FILE_MAX, &text, &len, &err);
        if (rc == 0)
            rc = dg_ids_parse(text, len, vocab, path, ids, n, &err);
    }
    free(text);
    if (rc) {
        eval_errorf("%s", err.msg);
        return 1;
    }
    return 0;
}

/* content: a string, or a list of {"type": "text", "text": ...} items */
static int content_parts(json_t *content, struct dg_chat_part *parts, size_t *n, char *why,
                         size_t why_len)
{
    json_t *item;
    size_t i;

    *n = 0;
    if (json_is_string(content)) {
        parts[0].text = json_string_value(content);
        parts[0].len = json_string_length(content);
        *n = 1;
        return 0;
    }
    if (!json_is_array(content)) {
        snprintf(why, why_len, "content must be a string or a list of text items");
        return -1;
    }
    json_array_foreach(content, i, item) {
        json_t *type = json_object_get(item, "type"), *text = json_object_get(item, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            snprintf(why, why_len, "content item %zu is not {\"type\": \"text\", \"text\": ...} "
                     "(images and other items are not supported)", i);
            return -1;
        }
        if (*n == EVAL_MAX_PARTS) {
            snprintf(why, why_len, "more than %d content items", EVAL_MAX_PARTS);
            return -1;
        }
        parts[*n].text = json_string_value(text);
        parts[*n].len = json_string_length(text);
        (*n)++;
    }
    return 0;
}

int eval_messages(json_t *messages, struct dg_chat_message *msgs,
                  struct dg_chat_part (*parts)[EVAL_MAX_PARTS], size_t *n, char *why,
                  size_t why_len)
{
    json_t *m;
    size_t i;

    if (!json_is_array(messages)) {
        snprintf(why, why_len, "messages must be a list");
        return -1;
    }
    if (json_array_size(messages) > EVAL_MAX_MESSAGES) {
        snprintf(why, why_len, "more than %d messages", EVAL_MAX_MESSAGES);
        return -1;
    }
    json_array_foreach(messages, i, m) {
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            snprintf(why, why_len, "message %zu has no string role", i);
            return -1;
        }
        msgs[i].role = json_string_value(role);
        msgs[i].parts = parts[i];
        if (content_parts(json_object_get(m, "content"), parts[i], &msgs[i].n_parts, why,
                          why_len) < 0)
            return -1;
    }
    *n = json_array_size(messages);
    return 0;
}
