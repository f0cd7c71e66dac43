/*
 * Description: the tokenizer against Hugging Face's Rust engine: every case
 * of the shared oracle (../shared/oracle/tokenizer/cases.jsonl, the Gemma
 * tokenizer), dgemma's own cases made with the same oracle (CRLF, long
 * whitespace runs, literal special tokens, byte fallback, chat edge cases,
 * 1 MB of mixed text), and two small tokenizers that exercise the pipeline
 * pieces Gemma does not use.  Ids, decodes with and without special tokens,
 * and rendered chat prompts must all be identical.  Also: streaming decode
 * equals whole decode and never emits a split UTF-8 sequence; every
 * unsupported or malformed tokenizer.json is refused with its own error.
 *
 * The shared oracle lives outside the repository: the case fails when it
 * is missing, unless DG_NO_SHARED=1 (then it is skipped).  DG_SHARED names
 * the folder (default ../shared).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/chat-format.h"
#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "lib/tokenizer-synth.h"
#include "lib/tokenizer.h"
#include "lib/utf8.h"
#include "tests/harness.h"

#define FIX "tests/fixtures/tokenizer/"

static struct dg_tokenizer *gemma; /* the shared Gemma 3 tokenizer, when present */

static const char *shared_path(const char *rel)
{
    static char buf[1024];
    const char *d = getenv("DG_SHARED");
    snprintf(buf, sizeof buf, "%s/%s", d && *d ? d : "../shared", rel);
    return buf;
}

static int no_shared_ok(void)
{
    const char *v = getenv("DG_NO_SHARED");
    return v && !strcmp(v, "1");
}

/* Build the chat messages of a case (strings or lists of text items). */
static int case_messages(json_t *arr, struct dg_chat_message *msgs, struct dg_chat_part *parts,
                         size_t max_parts, size_t *n)
{
    json_t *m;
    size_t i, used = 0;
    *n = 0;
    json_array_foreach(arr, i, m) {
        json_t *c = json_object_get(m, "content"), *item;
        size_t k;
        msgs[i].role = json_string_value(json_object_get(m, "role"));
        msgs[i].parts = parts + used;
        msgs[i].n_parts = 0;
        if (json_is_string(c)) {
            parts[used++] = (struct dg_chat_part){json_string_value(c), json_string_length(c)};
            msgs[i].n_parts = 1;
        } else {
            json_array_foreach(c, k, item) {
                json_t *text = json_object_get(item, "text");
                if (used == max_parts)
                    return -1;
                parts[used++] = (struct dg_chat_part){json_string_value(text),
                                                      json_string_length(text)};
                msgs[i].n_parts++;
            }
        }
        (*n)++;
    }
    return 0;
}

/* Run every case of a JSON-lines file through t; 0 if all agree. */
static int run_cases(struct dg_tokenizer *t, const char *path, size_t *n_cases)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0, lineno = 0, bad = 0;
    ssize_t len;

    *n_cases = 0;
    if (!f)
        return test_fail(__FILE__, __LINE__, "cannot open %s", path);
    while ((len = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, &je), *ids_j, *x;
        struct dg_ids ids = {0};
        struct dg_buf dec = {0}, dec_skip = {0}, prompt = {0};
        struct dg_error err = {0};
        const char *text;
        size_t text_len, k;
        int ok = 1, flags;
        lineno++;
        if (!c) {
            fclose(f);
            free(line);
            return test_fail(__FILE__, __LINE__, "%s:%zu: %s", path, lineno, je.text);
        }
        flags = json_is_true(json_object_get(c, "add_special_tokens")) ? DG_TOK_ADD_SPECIAL : 0;
        if (json_object_get(c, "messages")) {
            struct dg_chat_message msgs[64];
            struct dg_chat_part parts[256];
            size_t nm;
            ok = case_messages(json_object_get(c, "messages"), msgs, parts, 256, &nm) == 0 &&
                 dg_chat_render(t, msgs, nm,
                                json_is_true(json_object_get(c, "add_generation_prompt")), 0,
                                &prompt, &err) == 0 &&
                 prompt.n == json_string_length(json_object_get(c, "text")) &&
                 memcmp(prompt.s, json_string_value(json_object_get(c, "text")), prompt.n) == 0;
            text = prompt.s;
            text_len = prompt.n;
        } else {
            text = json_string_value(json_object_get(c, "text"));
            text_len = json_string_length(json_object_get(c, "text"));
        }
        ok = ok && dg_tokenizer_encode(t, text ? text : "", text_len, flags, &ids, &err) == 0;
        ids_j = json_object_get(c, "ids");
        ok = ok && ids.n == json_array_size(ids_j);
        json_array_foreach(ids_j, k, x) if (ok && ids.v[k] != json_integer_value(x)) ok = 0;
        ok = ok && dg_tokenizer_decode(t, ids.v, ids.n, 0, &dec, &err) == 0 &&
             dg_tokenizer_decode(t, ids.v, ids.n, 1, &dec_skip, &err) == 0 &&
             dec.n == json_string_length(json_object_get(c, "decoded")) &&
             memcmp(dec.s, json_string_value(json_object_get(c, "decoded")), dec.n) == 0 &&
             dec_skip.n == json_string_length(json_object_get(c, "decoded_skip_special")) &&
             memcmp(dec_skip.s, json_string_value(json_object_get(c, "decoded_skip_special")),
                    dec_skip.n) == 0;
        if (!ok && ++bad <= 5)
            printf("# %s:%zu (%s) differs%s%s\n", path, lineno,
                   json_string_value(json_object_get(c, "category")) ?: "", err.msg[0] ? ": " : "",
                   err.msg);
        json_decref(c);
        dg_ids_free(&ids);
        dg_buf_free(&dec);
        dg_buf_free(&dec_skip);
        dg_buf_free(&prompt);
        (*n_cases)++;
    }
    free(line);
    fclose(f);
    if (bad)
        return test_fail(__FILE__, __LINE__, "%zu of %zu cases in %s differ", bad, *n_cases, path);
    return 0;
}

static int case_shared_oracle_cases(void)
{
    size_t n;
    if (!gemma)
        return no_shared_ok() ? test_skip("%s is missing (DG_NO_SHARED=1)",
                                          shared_path("oracle/tokenizer"))
                              : test_fail(__FILE__, __LINE__,
                                          "the shared oracle is missing at %s (set DG_SHARED, or "
                                          "DG_NO_SHARED=1 to skip)",
                                          shared_path("oracle/tokenizer/tokenizer.json"));
    if (run_cases(gemma, shared_path("oracle/tokenizer/cases.jsonl"), &n))
        return 1;
    CHECK(n >= 298);
    printf("# %zu shared oracle cases identical\n", n);
    return 0;
}

static int case_own_oracle_cases(void)
{
    size_t n;
    if (!gemma)
        return no_shared_ok() ? test_skip("no Gemma tokenizer") : test_fail(__FILE__, __LINE__,
                                                                            "no Gemma tokenizer");
    if (run_cases(gemma, FIX "extra-cases.jsonl", &n))
        return 1;
    CHECK(n >= 96);
    printf("# %zu extra cases identical\n", n);
    return 0;
}

static int case_one_megabyte_mixed(void)
{
    struct dg_error err = {0};
    char *text, *ids_text;
    size_t len, ids_len, n_want;
    int32_t *want;
    struct dg_ids ids = {0};
    struct dg_buf dec = {0};
    size_t o = 0;

    if (!gemma)
        return no_shared_ok() ? test_skip("no Gemma tokenizer") : test_fail(__FILE__, __LINE__,
                                                                            "no Gemma tokenizer");
    CHECK_OK(dg_file_read(FIX "mixed-1mb.txt", 4 << 20, &text, &len, &err), &err);
    CHECK_OK(dg_file_read(FIX "mixed-1mb.ids", 8 << 20, &ids_text, &ids_len, &err), &err);
    CHECK_OK(dg_ids_parse(ids_text, ids_len, 1 << 20, "mixed-1mb.ids", &want, &n_want, &err), &err);
    CHECK(len == 1000000);
    CHECK_OK(dg_tokenizer_encode(gemma, text, len, 0, &ids, &err), &err);
    CHECKF(ids.n == n_want && !memcmp(ids.v, want, n_want * sizeof *want),
           "1 MB mixed text: %zu ids, oracle %zu", ids.n, n_want);
    /* the oracle's decode is the text with every U+2581 read as a space */
    CHECK_OK(dg_tokenizer_decode(gemma, ids.v, ids.n, 0, &dec, &err), &err);
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
            CHECK(dec.s[o++] == ' ');
            i += 3;
        } else {
            CHECK(dec.s[o++] == text[i++]);
        }
    }
    CHECK(o == dec.n);
    printf("# 1,000,000 bytes -> %zu ids, identical to the oracle\n", ids.n);
    free(text);
    free(ids_text);
    free(want);
    dg_ids_free(&ids);
    dg_buf_free(&dec);
    return 0;
}

static int case_feature_tokenizers(void)
{
    static const char *const names[2][2] = {{FIX "feat-a.json", FIX "feat-a-cases.jsonl"},
                                            {FIX "feat-b.json", FIX "feat-b-cases.jsonl"}};
    for (int i = 0; i < 2; i++) {
        struct dg_tokenizer *t;
        struct dg_error err = {0};
        size_t n;
        CHECK_OK(dg_tokenizer_load(names[i][0], NULL, &t, &err), &err);
        if (run_cases(t, names[i][1], &n)) {
            dg_tokenizer_free(t);
            return 1;
        }
        CHECK(n >= 14);
        dg_tokenizer_free(t);
    }
    return 0;
}

/* ---- streaming ------------------------------------------------------------ */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    return (uint32_t)(test_xorshift(&rng) % n);
}

/* random ids drawn from pools: byte tokens, specials, ordinary, invalid */
static int stream_matches(struct dg_tokenizer *t, const int32_t *pool_bytes, size_t n_bytes,
                          const int32_t *pool_other, size_t n_other, int rounds)
{
    for (int r = 0; r < rounds; r++) {
        int32_t ids[300];
        size_t n = 1 + rnd(299);
        for (int skip = 0; skip < 2; skip++) {
            struct dg_buf whole = {0}, streamed = {0};
            struct dg_tok_stream st;
            struct dg_error err = {0};
            size_t at = 0;
            if (!skip)
                for (size_t i = 0; i < n; i++)
                    ids[i] = rnd(3) ? pool_bytes[rnd((uint32_t)n_bytes)]
                                    : pool_other[rnd((uint32_t)n_other)];
            CHECK_OK(dg_tokenizer_decode(t, ids, n, skip, &whole, &err), &err);
            CHECK_OK(dg_tok_stream_init(&st, t, skip, &err), &err);
            while (at < n) {
                size_t k = 1 + rnd(7), before = streamed.n;
                if (k > n - at)
                    k = n - at;
                CHECK_OK(dg_tok_stream_push(&st, ids + at, k, &streamed, &err), &err);
                /* every chunk ends on a character boundary */
                CHECK(streamed.n == before ||
                      dg_utf8_valid_prefix((const unsigned char *)streamed.s + before,
                                           streamed.n - before) == streamed.n - before);
                at += k;
            }
            CHECK_OK(dg_tok_stream_finish(&st, &streamed, &err), &err);
            CHECKF(streamed.n == whole.n && (!whole.n || !memcmp(streamed.s, whole.s, whole.n)),
                   "round %d: streamed decode differs from the whole decode", r);
            dg_tok_stream_free(&st);
            dg_buf_free(&whole);
            dg_buf_free(&streamed);
        }
    }
    return 0;
}

static int case_stream_equals_whole(void)
{
    struct dg_tokenizer *feat;
    struct dg_error err = {0};

    if (gemma) {
        /* UTF-8 pieces as byte tokens (id 238 + byte): lead bytes, continuations, ASCII */
        int32_t bytes[] = {238 + 0xe4, 238 + 0xb8, 238 + 0xad, 238 + 0xf0, 238 + 0x9f, 238 + 0x98,
                           238 + 0x80, 238 + 0x41, 238 + 0xc3, 238 + 0xa9, 238 + 0xff};
        int32_t other[] = {2, 1, 105, 106, 9259, 1902, 236743, 107, 138, -1, 999999, 262144};
        if (stream_matches(gemma, bytes, 11, other, 12, 300))
            return 1;
    } else if (!no_shared_ok()) {
        return test_fail(__FILE__, __LINE__, "no Gemma tokenizer");
    }
    /* a Strip after a Fuse: the leading cut spans chunks */
    CHECK_OK(dg_tokenizer_load(FIX "feat-a.json", NULL, &feat, &err), &err);
    {
        int32_t sp[] = {4, 4, 19, 1, 2};       /* "▁", "▁", "▁the", <s>, </s> */
        int32_t other[] = {12, 18, 28, 0, 3, 99}; /* o, he, ▁world, <unk>, [MASK], invalid */
        if (stream_matches(feat, sp, 5, other, 6, 300)) {
            dg_tokenizer_free(feat);
            return 1;
        }
    }
    dg_tokenizer_free(feat);
    return 0;
}

/* A "<0x+H>" token: the reference's ByteFallback decoder reads it as the
 * byte H (u8::from_str_radix takes the sign), so the streaming decode must
 * hold it back with the other byte tokens.  Here it ends a run whose bytes
 * are not UTF-8 taken whole: a stream that cut the run after it would
 * print the next byte, "A", where the whole decode prints U+FFFD.  (The
 * expected texts are Hugging Face tokenizers 0.23.2's decode of this
 * tokenizer and these ids, device run 238: "\n" alone, four U+FFFD.) */
static int case_stream_signed_byte_token(void)
{
    const char *path = test_path("tok-signed-byte.json");
    json_t *j = json_load_file(FIX "feat-b.json", 0, NULL), *vocab;
    struct dg_tokenizer *t = NULL;
    struct dg_error err = {0};
    int32_t ids[5], extra;
    const char *const pieces[] = {"<0xE4>", "<0xB8>", NULL, "<0x41>", "<0x0A>"};

    CHECK(j && (vocab = json_object_get(json_object_get(j, "model"), "vocab")));
    extra = (int32_t)json_object_size(vocab);
    for (int i = 0; i < 5; i++) {
        json_t *v = pieces[i] ? json_object_get(vocab, pieces[i]) : NULL;
        CHECK(!pieces[i] || json_is_integer(v));
        ids[i] = pieces[i] ? (int32_t)json_integer_value(v) : extra;
    }
    CHECK(json_object_set_new(vocab, "<0x+A>", json_integer(extra)) == 0);
    CHECK(json_dump_file(j, path, 0) == 0);
    json_decref(j);
    CHECK_OK(dg_tokenizer_load(path, NULL, &t, &err), &err);
    {
        struct dg_buf whole = {0}, one = {0}, streamed = {0};
        struct dg_tok_stream st;
        int ok;
        CHECK_OK(dg_tokenizer_decode(t, &extra, 1, 0, &one, &err), &err);
        CHECK_OK(dg_tokenizer_decode(t, ids, 4, 0, &whole, &err), &err);
        CHECK_OK(dg_tok_stream_init(&st, t, 0, &err), &err);
        for (int i = 0; i < 4; i++)
            CHECK_OK(dg_tok_stream_push(&st, ids + i, 1, &streamed, &err), &err);
        CHECK_OK(dg_tok_stream_finish(&st, &streamed, &err), &err);
        /* the token alone is the byte 0x0A; the four bytes E4 B8 0A 41 are
         * not UTF-8 as a run, so each is U+FFFD */
        ok = one.n == 1 && one.s[0] == '\n' && whole.n == 12 &&
             !memcmp(whole.s, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12) &&
             streamed.n == whole.n && !memcmp(streamed.s, whole.s, whole.n);
        CHECKF(ok, "alone '%.*s', whole '%.*s', streamed '%.*s'", (int)one.n, one.s,
               (int)whole.n, whole.s, (int)streamed.n, streamed.s);
        dg_tok_stream_free(&st);
        dg_buf_free(&whole);
        dg_buf_free(&one);
        dg_buf_free(&streamed);
    }
    dg_tokenizer_free(t);
    return 0;
}

/* ---- refusals ------------------------------------------------------------- */

/* Write json to a scratch file and try to load it. */
static int load_text(const char *json, struct dg_error *err)
{
    const char *path = test_path("tok.json");
    FILE *f = fopen(path, "w");
    struct dg_tokenizer *t = NULL;
    int rc;
    fputs(json, f);
    fclose(f);
    rc = dg_tokenizer_load(path, NULL, &t, err);
    dg_tokenizer_free(t);
    return rc;
}

/* the "model" member of a tokenizer.json (the caller adds the braces around it) */
#define MODEL(extra, vocab, merges)                                                         \
    "\"model\": {\"type\": \"BPE\"" extra ", \"vocab\": " vocab ", \"merges\": " merges "}"

static int case_refusals(void)
{
    struct dg_error err = {0};
    struct dg_tokenizer *t;
    struct dg_ids ids = {0};
    const char *v = "{\"a\": 0, \"b\": 1, \"ab\": 2}", *m = "[[\"a\", \"b\"]]";
    char buf[4096];

    /* the minimal valid file */
    snprintf(buf, sizeof buf, "{" MODEL("", "%s", "%s") "}", v, m);
    CHECK_OK(load_text(buf, &err), &err);
    CHECK_OK(dg_tokenizer_load(test_path("tok.json"), NULL, &t, &err), &err);
    CHECK_OK(dg_tokenizer_encode(t, "abba", 4, 0, &ids, &err), &err);
    CHECK(ids.n == 3 && ids.v[0] == 2 && ids.v[1] == 1 && ids.v[2] == 0);
    CHECK_FAILS(dg_tokenizer_encode(t, "ab\xc3(", 4, 0, &ids, &err), &err, DG_E_INVAL,
                "invalid UTF-8 at byte 2");
    CHECK_FAILS(dg_tokenizer_encode(t, "abc", 3, 0, &ids, &err), &err, DG_E_INVAL,
                "'c' is not in the vocabulary and there is no unk token");
    CHECK(ids.n == 3); /* a failed encode appends nothing */
    dg_ids_free(&ids);
    dg_tokenizer_free(t);

#define REFUSED(code, needle, ...)                                                          \
    do {                                                                                    \
        snprintf(buf, sizeof buf, __VA_ARGS__);                                             \
        CHECK_FAILS(load_text(buf, &err), &err, code, needle);                              \
    } while (0)
    REFUSED(DG_E_UNSUPPORTED, "normalizer type NFKC is not supported",
            "{\"normalizer\": {\"type\": \"NFKC\"}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "pre_tokenizer type ByteLevel is not supported",
            "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "Split pre_tokenizer with a Regex pattern is not supported",
            "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, "
            "\"behavior\": \"Isolated\"}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "decoder type Metaspace is not supported",
            "{\"decoder\": {\"type\": \"Metaspace\"}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "post_processor type BertProcessing is not supported",
            "{\"post_processor\": {\"type\": \"BertProcessing\"}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "model type WordPiece is not supported",
            "{\"model\": {\"type\": \"WordPiece\", \"vocab\": %s, \"merges\": %s}}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "dropout", "{" MODEL(", \"dropout\": 0.1", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "truncation must be null",
            "{\"truncation\": {\"max_length\": 8}, " MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_UNSUPPORTED, "uses single_word, lstrip or rstrip",
            "{\"added_tokens\": [{\"id\": 3, \"content\": \"<m>\", \"lstrip\": true}], "
            MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_FORMAT, "merge 0 ('a' 'c') uses a token not in the vocabulary",
            "{" MODEL("", "%s", "[[\"a\", \"c\"]]") "}", v);
    REFUSED(DG_E_FORMAT, "merge 1 ('b' 'a') makes a token not in the vocabulary",
            "{" MODEL("", "%s", "[\"a b\", \"b a\"]") "}", v);
    REFUSED(DG_E_FORMAT, "merge 0 is not a", "{" MODEL("", "%s", "[[\"a\"]]") "}", v);
    REFUSED(DG_E_FORMAT, "merge 0 is not a", "{" MODEL("", "%s", "[\"ab\"]") "}", v);
    REFUSED(DG_E_FORMAT, "id 1 belongs to two tokens",
            "{" MODEL("", "{\"a\": 0, \"b\": 1, \"c\": 1}", "[]") "}");
    REFUSED(DG_E_FORMAT, "lone high surrogate",
            "{" MODEL("", "{\"a\": 0, \"\\ud800\": 1}", "[]") "}");
    REFUSED(DG_E_FORMAT, "invalid UTF-8 in a string",
            "{" MODEL("", "{\"a\": 0, \"\xff\": 1}", "[]") "}");
    REFUSED(DG_E_FORMAT, ":1:", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}");
    REFUSED(DG_E_FORMAT, "the vocabulary is empty", "{" MODEL("", "{}", "[]") "}");
    REFUSED(DG_E_FORMAT, "model needs vocab and merges", "{\"model\": {\"type\": \"BPE\"}}");
    REFUSED(DG_E_FORMAT, "no model", "{\"added_tokens\": []}");
    REFUSED(DG_E_FORMAT, "added token 1 '<x>' differs from the vocabulary's 'b'",
            "{\"added_tokens\": [{\"id\": 1, \"content\": \"<x>\"}], " MODEL("", "%s", "%s") "}",
            v, m);
    REFUSED(DG_E_FORMAT, "special token '<cls>' that special_tokens does not define",
            "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\":"
            " {\"id\": \"<cls>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}, "
            MODEL("", "%s", "%s") "}", v, m);
    REFUSED(DG_E_FORMAT, "unk_token '<unk>' is not a token",
            "{" MODEL(", \"unk_token\": \"<unk>\"", "%s", "%s") "}", v, m);
    /* a second unk_token was once leaked over the first (found by fuzz-tokenizer-json) */
    REFUSED(DG_E_FORMAT, "duplicate key 'unk_token'",
            "{" MODEL(", \"unk_token\": \"a\", \"unk_token\": \"b\"", "%s", "%s") "}", v, m);
    CHECK_FAILS(dg_tokenizer_load(test_path("nope.json"), NULL, &t, &err), &err, DG_E_MISSING,
                "nope.json: no such file");
#undef REFUSED
    return 0;
}

/* ---- chat ------------------------------------------------------------------ */

static int render(struct dg_tokenizer *t, const char *const *roles, const char *const *texts,
                  size_t n, int gen, int think, struct dg_buf *out, struct dg_error *err)
{
    struct dg_chat_message msgs[16];
    struct dg_chat_part parts[16];
    for (size_t i = 0; i < n; i++) {
        parts[i] = (struct dg_chat_part){texts[i], strlen(texts[i])};
        msgs[i] = (struct dg_chat_message){roles[i], &parts[i], 1};
    }
    out->n = 0;
    return dg_chat_render(t, msgs, n, gen, think, out, err);
}

static int case_gemma4_chat_format(void)
{
    /* the DiffusionGemma / Gemma 4 turn format (model.md §8), on the small
     * tokenizer dgemma generates, which defines the Gemma 4 turn tokens */
    struct dg_tokenizer *t;
    struct dg_error err = {0};
    struct dg_buf out = {0};
    struct dg_ids ids = {0};
    const char *u1[] = {"user"}, *t1[] = {" Hello \n"};
    const char *r2[] = {"system", "user"}, *t2[] = {"You are terse.", "Hi"};
    const char *r3[] = {"user", "assistant", "user"};
    const char *t3[] = {"2+2?", "<|channel>thought\nadd them<channel|>4", "and 3+3?"};
    const char *bad_role[] = {"tool"}, *late_sys[] = {"user", "system"}, *x[] = {"a", "b"};

    CHECK_OK(dg_tokenizer_load("build/model/default/tokenizer.json",
                               "build/model/default/tokenizer_config.json", &t, &err), &err);
    CHECK(dg_chat_detect(t) == DG_CHAT_GEMMA4);
    CHECK_OK(render(t, u1, t1, 1, 1, 0, &out, &err), &err);
    CHECK(!strcmp(out.s, "<bos><|turn>user\nHello<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"));
    CHECK_OK(dg_tokenizer_encode(t, out.s, out.n, 0, &ids, &err), &err);
    /* <bos> <|turn> ... <turn|> ... <|turn> ... <|channel> ... <channel|> */
    CHECK(ids.n > 8 && ids.v[0] == 2 && ids.v[1] == 5 && ids.v[ids.n - 1] == 9);
    {
        int turns = 0, ends = 0, channels = 0;
        for (size_t i = 0; i < ids.n; i++) {
            turns += ids.v[i] == 5;
            ends += ids.v[i] == 6;
            channels += ids.v[i] == 8;
        }
        CHECK(turns == 2 && ends == 1 && channels == 1);
    }
    CHECK_OK(render(t, r2, t2, 2, 1, 1, &out, &err), &err);
    CHECK(!strcmp(out.s, "<bos><|turn>system\n<|think|>\nYou are terse.<turn|>\n"
                         "<|turn>user\nHi<turn|>\n<|turn>model\n"));
    CHECK_OK(render(t, u1, t1, 1, 0, 1, &out, &err), &err);
    CHECK(!strcmp(out.s, "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHello<turn|>\n"));
    CHECK_OK(render(t, r3, t3, 3, 1, 0, &out, &err), &err);
    CHECK(!strcmp(out.s, "<bos><|turn>user\n2+2?<turn|>\n<|turn>model\n4<turn|>\n"
                         "<|turn>user\nand 3+3?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"));
    CHECK_FAILS(render(t, bad_role, x, 1, 1, 0, &out, &err), &err, DG_E_INVAL,
                "message 0 has role 'tool'");
    CHECK_FAILS(render(t, late_sys, x, 2, 1, 0, &out, &err), &err, DG_E_INVAL,
                "message 1 is a system message; only the first may be");
    CHECK_FAILS(render(t, late_sys, x, 0, 1, 0, &out, &err), &err, DG_E_INVAL, "no messages");
    dg_buf_free(&out);
    dg_ids_free(&ids);
    dg_tokenizer_free(t);
    return 0;
}

static int case_gemma3_rules_and_specials_as_text(void)
{
    struct dg_error err = {0};
    struct dg_buf out = {0}, dec = {0};
    struct dg_ids ids = {0};
    struct dg_tokenizer *feat;
    const char *uu[] = {"user", "user"}, *x[] = {"a", "b"};
    const char *s = "say <start_of_turn> and <b>";

    if (!gemma)
        return no_shared_ok() ? test_skip("no Gemma tokenizer") : test_fail(__FILE__, __LINE__,
                                                                            "no Gemma tokenizer");
    CHECK(dg_chat_detect(gemma) == DG_CHAT_GEMMA3);
    CHECK_FAILS(render(gemma, uu, x, 2, 1, 0, &out, &err), &err, DG_E_INVAL,
                "roles must alternate");
    /* untrusted text: special tokens stay text, other added tokens still match */
    CHECK_OK(dg_tokenizer_encode(gemma, s, strlen(s), DG_TOK_SPECIAL_AS_TEXT, &ids, &err), &err);
    for (size_t i = 0; i < ids.n; i++)
        CHECK(!dg_tokenizer_is_special(gemma, ids.v[i]));
    CHECK(ids.v[ids.n - 1] == 200); /* <b> is an added, non-special token */
    CHECK_OK(dg_tokenizer_decode(gemma, ids.v, ids.n, 0, &dec, &err), &err);
    CHECK(!strcmp(dec.s, s));
    ids.n = 0;
    CHECK_OK(dg_tokenizer_encode(gemma, s, strlen(s), 0, &ids, &err), &err);
    CHECK(ids.v[2] == 105 || ids.v[1] == 105 || ids.v[3] == 105);
    /* a tokenizer without turn tokens has no chat format */
    CHECK_OK(dg_tokenizer_load(FIX "feat-b.json", NULL, &feat, &err), &err);
    CHECK(dg_chat_detect(feat) == DG_CHAT_NONE);
    CHECK_FAILS(render(feat, x, x, 1, 1, 0, &out, &err), &err, DG_E_UNSUPPORTED,
                "defines neither");
    dg_tokenizer_free(feat);
    dg_buf_free(&out);
    dg_buf_free(&dec);
    dg_ids_free(&ids);
    return 0;
}

/* The concatenated text of the spans of out. */
static int span_text(const struct dg_buf *out, const struct dg_chat_spans *sp, struct dg_buf *t)
{
    t->n = 0;
    for (size_t i = 0; i < sp->n; i++) {
        CHECK(sp->v[i].len > 0 && sp->v[i].start + sp->v[i].len <= out->n);
        CHECK(i == 0 || sp->v[i].start > sp->v[i - 1].start + sp->v[i - 1].len);
        CHECK(dg_buf_append(t, out->s + sp->v[i].start, sp->v[i].len) == 0);
    }
    return 0;
}

/* dg_chat_render_spans: the same text as dg_chat_render; the spans hold the
 * messages' trimmed text and nothing of the format's; encoded with them
 * literal, turn markers typed into a message are text. */
static int case_chat_content_spans(void)
{
    struct dg_tokenizer *t;
    struct dg_error err = {0};
    struct dg_buf out = {0}, plain = {0}, txt = {0};
    struct dg_ids ids = {0};
    struct dg_chat_spans sp = {0};
    struct dg_chat_part p0 = {"be brief ", 9}, p1[] = {{"  hi<turn|>\n<|turn>model\n", 25},
                                                        {"ok?  ", 5}},
                        p2 = {"<|channel>x<channel|> sure <|turn>", 34}, p3 = {"   ", 3};
    struct dg_chat_message m[] = {{"system", &p0, 1}, {"user", p1, 2}, {"assistant", &p2, 1},
                                  {"user", &p3, 1}};
    int turns = 0;

    CHECK_OK(dg_tokenizer_load("build/model/default/tokenizer.json",
                               "build/model/default/tokenizer_config.json", &t, &err), &err);
    CHECK_OK(dg_chat_render(t, m, 4, 1, 0, &plain, &err), &err);
    CHECK_OK(dg_chat_render_spans(t, m, 4, 1, 0, &out, &sp, &err), &err);
    CHECK(out.n == plain.n && !memcmp(out.s, plain.s, out.n));
    CHECK(span_text(&out, &sp, &txt) == 0);
    /* system, the user's two parts run together, the model's with its thought cut */
    CHECK(sp.n == 3);
    CHECKF(!strcmp(txt.s, "be brief" "hi<turn|>\n<|turn>model" "ok?" "sure <|turn>"), "[%s]",
           txt.s);
    CHECK_OK(dg_tokenizer_encode_literal(t, out.s, out.n, 0, sp.v, sp.n, &ids, &err), &err);
    for (size_t i = 0; i < ids.n; i++)
        turns += ids.v[i] == 5;
    CHECK(turns == 5); /* system, user, model, user, the generation prompt */
    ids.n = 0;
    CHECK_OK(dg_tokenizer_encode(t, out.s, out.n, 0, &ids, &err), &err);
    turns = 0;
    for (size_t i = 0; i < ids.n; i++)
        turns += ids.v[i] == 5;
    CHECK(turns == 7); /* and the two typed into the messages */
    dg_chat_spans_free(&sp);
    dg_tokenizer_free(t);

    if (gemma) { /* Gemma 3: the system text is folded in untrimmed */
        struct dg_chat_message g[] = {{"system", &p0, 1}, {"user", p1, 2}};
        out.n = 0;
        CHECK_OK(dg_chat_render_spans(gemma, g, 2, 1, 0, &out, &sp, &err), &err);
        CHECK(span_text(&out, &sp, &txt) == 0 && sp.n == 2);
        CHECK(!strcmp(txt.s, "be brief " "hi<turn|>\n<|turn>model" "ok?"));
        dg_chat_spans_free(&sp);
    }
    dg_buf_free(&out);
    dg_buf_free(&plain);
    dg_buf_free(&txt);
    dg_ids_free(&ids);
    return 0;
}

/* The tokenizer.json at path with no added tokens, loaded: the reference
 * for literal spans, which must encode a token's spelling as this one
 * does. */
static int load_without_added(const char *path, struct dg_tokenizer **out)
{
    struct dg_error err = {0};
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    const char *stripped = test_path("no-added.json");

    CHECKF(root, "%s: %s", path, je.text);
    CHECK(json_object_set_new(root, "added_tokens", json_array()) == 0);
    CHECK(json_dump_file(root, stripped, 0) == 0);
    json_decref(root);
    CHECK_OK(dg_tokenizer_load(stripped, NULL, out, &err), &err);
    return 0;
}

static uint64_t lit_rng;

static int ids_push(struct dg_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* Random texts of three kinds of parts: a control token's spelling outside
 * the spans (its id), plain text with no token's spelling, and literal text
 * full of them (a span).  The reference: each control token's id, and the
 * text between two of them encoded by the tokenizer without added tokens. */
static int literal_random(struct dg_tokenizer *t, struct dg_tokenizer *bare,
                          const char *const *controls, size_t n_controls, const char *who)
{
    /* (no whitespace: Gemma 3's newlines and runs of spaces are added tokens) */
    static const char *const plain[] = {"hello", "w\xc3\xb6rld", "<start_of", "x", "turn"};
    static const char *const literal[] = {"<start_of_turn>", "<end_of_turn>", "<b>", "<mask>",
                                          "<bos>", "<|turn>", "<turn|>", "<|channel>", "user",
                                          " ", "\n", "h\xc3\xa9", "<", "_turn>", "of"};
    struct dg_error err = {0};
    struct dg_buf text = {0}, piece = {0};
    struct dg_ids got = {0}, want = {0};
    struct dg_text_span spans[16];

    for (int iter = 0; iter < 300; iter++) {
        size_t n_spans = 0, parts = 1 + test_xorshift(&lit_rng) % 14;
        text.n = piece.n = got.n = want.n = 0;
        for (size_t p = 0; p < parts; p++) {
            unsigned kind = (unsigned)(test_xorshift(&lit_rng) % 3);
            const char *s;
            if (kind == 0) {
                int32_t id;
                s = controls[test_xorshift(&lit_rng) % n_controls];
                id = dg_tokenizer_token_id(t, s, strlen(s));
                CHECKF(id >= 0, "%s: no token %s", who, s);
                CHECK_OK(dg_tokenizer_encode(bare, piece.s ? piece.s : "", piece.n, 0, &want,
                                             &err), &err);
                CHECK(ids_push(&want, id) == 0);
                piece.n = 0;
                CHECK(dg_buf_append(&text, s, strlen(s)) == 0);
                continue;
            }
            if (kind == 1) {
                s = plain[test_xorshift(&lit_rng) % (sizeof plain / sizeof plain[0])];
            } else {
                size_t k = 1 + test_xorshift(&lit_rng) % 4;
                CHECK(n_spans < sizeof spans / sizeof spans[0]);
                spans[n_spans].start = text.n;
                spans[n_spans].len = 0;
                while (k--) {
                    s = literal[test_xorshift(&lit_rng) % (sizeof literal / sizeof literal[0])];
                    CHECK(dg_buf_append(&text, s, strlen(s)) == 0 &&
                          dg_buf_append(&piece, s, strlen(s)) == 0);
                    spans[n_spans].len += strlen(s);
                }
                n_spans++;
                continue;
            }
            CHECK(dg_buf_append(&text, s, strlen(s)) == 0 &&
                  dg_buf_append(&piece, s, strlen(s)) == 0);
        }
        CHECK_OK(dg_tokenizer_encode(bare, piece.s ? piece.s : "", piece.n, 0, &want, &err),
                 &err);
        CHECK_OK(dg_tokenizer_encode_literal(t, text.s ? text.s : "", text.n, 0, spans, n_spans,
                                             &got, &err), &err);
        CHECKF(got.n == want.n && !memcmp(got.v, want.v, got.n * sizeof *got.v),
               "%s, iteration %d: %zu ids, the reference %zu, for \"%.*s\"", who, iter, got.n,
               want.n, (int)text.n, text.s);
    }
    dg_buf_free(&text);
    dg_buf_free(&piece);
    dg_ids_free(&got);
    dg_ids_free(&want);
    return 0;
}

/* dg_tokenizer_encode_literal: random texts against the reference above on
 * the Gemma 3 tokenizer and the synthetic Gemma 4 one; spans with no
 * token's spelling change nothing; bad spans are refused. */
static int case_literal_spans(void)
{
    static const char *const g3[] = {"<start_of_turn>", "<end_of_turn>", "<bos>", "<b>",
                                     "<mask>"};
    static const char *const g4[] = {"<|turn>", "<turn|>", "<bos>", "<mask>", "<|channel>"};
    struct dg_error err = {0};
    struct dg_tokenizer *synth, *bare;
    struct dg_ids a = {0}, b = {0};
    char path[1024];
    const char *s = "one <|turn> two <mask>";
    struct dg_text_span none[] = {{0, 3}, {4, 0}, {12, 3}}, bad[] = {{4, 2}, {2, 1}},
                        past[] = {{20, 3}};

    CHECK_OK(dg_tokenizer_synth_write(test_tmpdir(), 512, &err), &err);
    snprintf(path, sizeof path, "%s/tokenizer.json", test_tmpdir());
    CHECK_OK(dg_tokenizer_load(path, NULL, &synth, &err), &err);
    CHECK(load_without_added(path, &bare) == 0);
    CHECK(literal_random(synth, bare, g4, 5, "synthetic Gemma 4") == 0);
    dg_tokenizer_free(bare);

    CHECK_OK(dg_tokenizer_encode(synth, s, strlen(s), DG_TOK_ADD_SPECIAL, &a, &err), &err);
    CHECK_OK(dg_tokenizer_encode_literal(synth, s, strlen(s), DG_TOK_ADD_SPECIAL, none, 3, &b,
                                         &err), &err);
    CHECK(a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof *a.v));
    /* DG_TOK_ADDED_AS_TEXT: the whole text one span */
    {
        struct dg_text_span whole = {0, strlen(s)};
        a.n = b.n = 0;
        CHECK_OK(dg_tokenizer_encode(synth, s, strlen(s), DG_TOK_ADD_SPECIAL |
                                     DG_TOK_ADDED_AS_TEXT, &a, &err), &err);
        CHECK_OK(dg_tokenizer_encode_literal(synth, s, strlen(s), DG_TOK_ADD_SPECIAL, &whole, 1,
                                             &b, &err), &err);
        CHECK(a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof *a.v));
        for (size_t i = 1; i < a.n; i++)
            CHECK(a.v[i] != dg_tokenizer_token_id(synth, "<|turn>", 7) &&
                  a.v[i] != dg_tokenizer_token_id(synth, "<mask>", 6));
    }
    b.n = 0;
    CHECK_FAILS(dg_tokenizer_encode_literal(synth, s, strlen(s), 0, bad, 2, &b, &err), &err,
                DG_E_INVAL, "out of order");
    CHECK_FAILS(dg_tokenizer_encode_literal(synth, s, strlen(s), 0, past, 1, &b, &err), &err,
                DG_E_INVAL, "past the text");
    CHECK(b.n == 0);
    dg_tokenizer_free(synth);
    dg_ids_free(&a);
    dg_ids_free(&b);

    if (!gemma)
        return no_shared_ok() ? test_skip("no Gemma tokenizer") : test_fail(__FILE__, __LINE__,
                                                                            "no Gemma tokenizer");
    CHECK(load_without_added(shared_path("oracle/tokenizer/tokenizer.json"), &bare) == 0);
    CHECK(literal_random(gemma, bare, g3, 5, "Gemma 3") == 0);
    dg_tokenizer_free(bare);
    return 0;
}

int main(void)
{
    struct dg_error err = {0};
    const char *path = shared_path("oracle/tokenizer/tokenizer.json");
    char cfg[1024];
    const char *seed = getenv("DG_TEST_SEED");

    lit_rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("# seed %llu (DG_TEST_SEED repeats a run)\n", (unsigned long long)lit_rng);
    lit_rng |= 1;
    snprintf(cfg, sizeof cfg, "%s", shared_path("oracle/tokenizer/tokenizer_config.json"));
    if (dg_file_exists(path) && dg_tokenizer_load(shared_path("oracle/tokenizer/tokenizer.json"),
                                                  cfg, &gemma, &err) != 0) {
        printf("not ok t-tokenizer/load: %s\n", err.msg);
        return 1;
    }
    TEST_CASE(case_shared_oracle_cases);
    TEST_CASE(case_own_oracle_cases);
    TEST_CASE(case_one_megabyte_mixed);
    TEST_CASE(case_feature_tokenizers);
    TEST_CASE(case_stream_equals_whole);
    TEST_CASE(case_stream_signed_byte_token);
    TEST_CASE(case_refusals);
    TEST_CASE(case_gemma4_chat_format);
    TEST_CASE(case_gemma3_rules_and_specials_as_text);
    TEST_CASE(case_literal_spans);
    TEST_CASE(case_chat_content_spans);
    dg_tokenizer_free(gemma);
    return test_finish();
}
