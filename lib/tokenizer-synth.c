/* tokenizer-synth.c - see tokenizer-synth.h. */
#include "lib/tokenizer-synth.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"

/* ids 0..9: the special and turn tokens; <mask> is not special (as in Gemma) */
static const struct {
    const char *text;
    int special;
} specials[DG_TOKSYNTH_N_SPECIAL] = {
    {"<pad>", 1},  {"<eos>", 1},     {"<bos>", 1},      {"<unk>", 1},       {"<mask>", 0},
    {"<|turn>", 1}, {"<turn|>", 1}, {"<|think|>", 1}, {"<|channel>", 1}, {"<channel|>", 1},
};

#define SP "\xe2\x96\x81" /* U+2581, which stands for a space */

/* Merges tried in order; one whose parts are not both in the vocabulary
 * yet is skipped.  Common English pieces, "▁" (U+2581) marking a space. */
static const char *const merges[][2] = {
    {SP, "t"}, {SP, "a"}, {"h", "e"}, {"i", "n"}, {"t", "h"},
    {"e", "r"}, {"r", "e"}, {"o", "n"}, {SP, "s"}, {SP "t", "he"},
    {"a", "n"}, {"e", "n"}, {"a", "t"}, {SP, "w"}, {"o", "u"}, {"e", "d"},
    {"n", "d"}, {SP, "o"}, {"i", "t"}, {"i", "s"}, {"o", "r"}, {"e", "s"},
    {SP, "c"}, {SP, "b"}, {"in", "g"}, {SP, "f"},
    {SP, "p"}, {SP, "m"}, {SP, "in"}, {"a", "r"},
    {"a", "l"}, {"l", "e"}, {SP, "d"}, {SP, "h"}, {SP "t", "o"},
    {SP, "of"}, {"o", "f"}, {SP "a", "nd"}, {"i", "c"}, {"a", "s"},
    {SP, "th"}, {"s", "t"}, {"i", "on"}, {SP, "is"}, {SP, "l"},
    {SP, "n"}, {SP, "e"}, {SP, "re"}, {"o", "m"},
    {"l", "l"}, {SP, "g"}, {"v", "e"}, {SP, "I"}, {SP, "y"},
    {"o", "w"}, {"l", "y"}, {SP, "on"}, {SP, "it"}, {"e", "l"},
    {SP, "be"}, {"b", "e"}, {SP, "an"}, {"c", "t"}, {SP, "at"},
    {"u", "t"}, {SP, "u"}, {SP, "T"}, {SP, "A"},
    {SP "w", "h"}, {SP, "r"}, {"i", "d"}, {SP, "for"},
    {"f", "or"}, {"s", "e"}, {SP, "you"}, {"y", "ou"}, {"e", "t"},
    {SP, "1"}, {SP, "2"}, {SP, "0"}, {SP, "3"},
};

struct vocab {
    int n, cap;
    char **piece;
};

static int vocab_find(const struct vocab *v, const char *s)
{
    for (int i = 0; i < v->n; i++)
        if (v->piece[i] && strcmp(v->piece[i], s) == 0)
            return i;
    return -1;
}

static int vocab_add(struct vocab *v, const char *s)
{
    if (v->n == v->cap)
        return -1;
    v->piece[v->n] = strdup(s);
    if (!v->piece[v->n])
        return -1;
    return v->n++;
}

int dg_tokenizer_synth_write(const char *dir, int64_t vocab_size, struct dg_error *err)
{
    struct vocab v = {0, 0, NULL};
    json_t *root = NULL, *added, *model, *vmap, *mlist, *cfg;
    char *path = NULL, piece[16];
    int rc = 0, n_merges = 0;

    if (vocab_size < DG_TOKSYNTH_MIN_VOCAB || vocab_size > 1000000)
        return dg_error_set(err, DG_E_INVAL,
                            "tokenizer: a vocabulary of %lld is outside [%d, 1000000]",
                            (long long)vocab_size, DG_TOKSYNTH_MIN_VOCAB);
    v.cap = (int)vocab_size;
    v.piece = calloc((size_t)v.cap, sizeof *v.piece);
    if (!v.piece)
        return dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory");
    for (int i = 0; i < DG_TOKSYNTH_N_SPECIAL; i++)
        vocab_add(&v, specials[i].text);
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        vocab_add(&v, piece);
    }
    vocab_add(&v, SP);
    for (int c = 0x21; c < 0x7f; c++) {
        piece[0] = (char)c;
        piece[1] = '\0';
        vocab_add(&v, piece);
    }
    root = json_object();
    mlist = json_array();
    for (size_t i = 0; i < sizeof merges / sizeof merges[0] && v.n < v.cap; i++) {
        char joined[64];
        if (vocab_find(&v, merges[i][0]) < 0 || vocab_find(&v, merges[i][1]) < 0)
            continue;
        snprintf(joined, sizeof joined, "%s%s", merges[i][0], merges[i][1]);
        if (vocab_find(&v, joined) >= 0)
            continue;
        if (vocab_add(&v, joined) < 0) {
            rc = dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory");
            goto out;
        }
        json_array_append_new(mlist, json_pack("[s,s]", merges[i][0], merges[i][1]));
        n_merges++;
    }
    while (v.n < v.cap) { /* fill the rest as Gemma does: unused added tokens */
        snprintf(piece, sizeof piece, "<unused%d>", v.n - (DG_TOKSYNTH_MIN_VOCAB + n_merges));
        if (vocab_add(&v, piece) < 0) {
            rc = dg_error_set(err, DG_E_NOMEM, "tokenizer: out of memory");
            goto out;
        }
    }

    added = json_array();
    for (int i = 0; i < v.n; i++) {
        int is_special = i < DG_TOKSYNTH_N_SPECIAL, unused = !is_special &&
                                                           !strncmp(v.piece[i], "<unused", 7);
        if (!is_special && !unused)
            continue;
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content",
                                               v.piece[i], "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special",
                                               is_special ? specials[i].special : 0));
    }
    vmap = json_object();
    for (int i = 0; i < v.n; i++)
        json_object_set_new(vmap, v.piece[i], json_integer(i));
    model = json_pack("{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b}", "type", "BPE", "dropout", "unk_token",
                      "<unk>", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1,
                      "byte_fallback", 1, "ignore_merges", 0);
    json_object_set_new(model, "vocab", vmap);
    json_object_set_new(model, "merges", mlist);
    mlist = NULL;
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer",
                        json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", " ",
                                  "content", SP));
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s,s:{s:s},s:s,s:b}", "type", "Split", "pattern", "String",
                                  " ", "behavior", "MergedWithPrevious", "invert", 0));
    json_object_set_new(
        root, "post_processor",
        json_pack("{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:[{s:{s:s,s:i}},{s:{s:s,s:i}},"
                  "{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i],s:[s]}}}",
                  "type", "TemplateProcessing",
                  "single", "SpecialToken", "id", "<bos>", "type_id", 0, "Sequence", "id", "A",
                  "type_id", 0,
                  "pair", "SpecialToken", "id", "<bos>", "type_id", 0, "Sequence", "id", "A",
                  "type_id", 0, "SpecialToken", "id", "<bos>", "type_id", 1, "Sequence", "id",
                  "B", "type_id", 1,
                  "special_tokens", "<bos>", "id", "<bos>", "ids", 2, "tokens", "<bos>"));
    json_object_set_new(
        root, "decoder",
        json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]}", "type", "Sequence", "decoders",
                  "type", "Replace", "pattern", "String", SP, "content", " ", "type",
                  "ByteFallback", "type", "Fuse"));
    json_object_set_new(root, "model", model);

    path = dg_path_join(dir, "tokenizer.json");
    if (!path || json_dump_file(root, path, JSON_INDENT(1) | JSON_ENSURE_ASCII) != 0) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot write: %s", path ? path : dir,
                          strerror(errno));
        goto out;
    }
    free(path);
    cfg = json_pack("{s:b,s:b,s:s,s:s,s:s,s:s,s:i,s:s}", "add_bos_token", 1, "add_eos_token", 0,
                    "bos_token", "<bos>", "eos_token", "<eos>", "pad_token", "<pad>", "unk_token",
                    "<unk>", "model_max_length", 1048576, "tokenizer_class", "GemmaTokenizer");
    path = dg_path_join(dir, "tokenizer_config.json");
    if (!path || json_dump_file(cfg, path, JSON_INDENT(1)) != 0)
        rc = dg_error_set(err, DG_E_IO, "%s: cannot write: %s", path ? path : dir,
                          strerror(errno));
    json_decref(cfg);
out:
    free(path);
    json_decref(mlist);
    json_decref(root);
    for (int i = 0; i < v.n; i++)
        free(v.piece[i]);
    free(v.piece);
    return rc;
}
