/*
 * Description: model.safetensors.index.json parsing: the index transformers
 * 5.17 writes parses into its distinct shards; empty maps, wrong types,
 * shard names that leave the directory, and bad metadata are refused.
 */
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "lib/st-index.h"
#include "tests/harness.h"

static int parse(const char *text, struct dg_index *idx, struct dg_error *err)
{
    return dg_index_parse(text, strlen(text), "i.json", idx, err);
}

static int case_transformers_index(void)
{
    struct dg_index idx;
    struct dg_error err = {0};
    char *buf;
    size_t len;

    CHECK_OK(dg_file_read("tests/fixtures/hf-5.17-tiny/sharded-index.json", 1 << 20, &buf, &len,
                          &err), &err);
    CHECK_OK(dg_index_parse(buf, len, "index", &idx, &err), &err);
    free(buf);
    CHECK(idx.n_shards == 7 && idx.total_size == 3724232);
    CHECK(idx.n_entries == 90); /* 74 text + 16 vision tensors */
    for (size_t i = 0; i < idx.n_entries; i++)
        CHECK(idx.entries[i].shard >= 0 && idx.entries[i].shard < 7);
    CHECK(!strcmp(idx.shards[idx.entries[0].shard], "model-00002-of-00007.safetensors"));
    CHECK(!strcmp(idx.entries[0].tensor, "model.decoder.embed_tokens.weight"));
    dg_index_free(&idx);
    return 0;
}

static int case_minimal_and_no_metadata(void)
{
    struct dg_index idx;
    struct dg_error err = {0};
    CHECK_OK(parse("{\"weight_map\": {\"a\": \"s1\", \"b\": \"s2\", \"c\": \"s1\"}}", &idx, &err),
             &err);
    CHECK(idx.n_shards == 2 && idx.n_entries == 3 && idx.total_size == -1);
    CHECK(idx.entries[2].shard == 0 && idx.entries[1].shard == 1);
    dg_index_free(&idx);
    return 0;
}

static int case_refusals(void)
{
    struct dg_index idx;
    struct dg_error err = {0};
    char long_name[400];

    CHECK_FAILS(parse("[]", &idx, &err), &err, DG_E_FORMAT, "i.json: expected a JSON object");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": ", &idx, &err), &err, DG_E_FORMAT,
                "i.json: malformed JSON");
    CHECK_FAILS(parse("{\"metadata\": {}}", &idx, &err), &err, DG_E_CONFIG,
                "i.json: weight_map: required key is missing");
    CHECK_FAILS(parse("{\"weight_map\": []}", &idx, &err), &err, DG_E_CONFIG,
                "weight_map: expected an object, got an array");
    CHECK_FAILS(parse("{\"weight_map\": {}}", &idx, &err), &err, DG_E_FORMAT,
                "i.json: weight_map is empty");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": 3}}", &idx, &err), &err, DG_E_FORMAT,
                "weight_map.a: expected a file name, got an integer");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": \"../x\"}}", &idx, &err), &err, DG_E_FORMAT,
                "'../x' is not a plain file name");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": \"/etc/passwd\"}}", &idx, &err), &err, DG_E_FORMAT,
                "not a plain file name");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": \".hidden\"}}", &idx, &err), &err, DG_E_FORMAT,
                "not a plain file name");
    CHECK_FAILS(parse("{\"weight_map\": {\"a\": \"\"}}", &idx, &err), &err, DG_E_FORMAT,
                "not a plain file name");
    snprintf(long_name, sizeof long_name, "{\"weight_map\": {\"a\": \"%0300d\"}}", 7);
    CHECK_FAILS(parse(long_name, &idx, &err), &err, DG_E_FORMAT, "not a plain file name");
    CHECK_FAILS(parse("{\"metadata\": {\"total_size\": -1}, \"weight_map\": {\"a\": \"s\"}}", &idx,
                      &err), &err, DG_E_CONFIG, "metadata.total_size: -1 is out of range");
    CHECK_FAILS(parse("{\"metadata\": 5, \"weight_map\": {\"a\": \"s\"}}", &idx, &err), &err,
                DG_E_CONFIG, "metadata: expected an object");
    CHECK(idx.n_entries == 0 && idx.entries == NULL);
    return 0;
}

int main(void)
{
    TEST_CASE(case_transformers_index);
    TEST_CASE(case_minimal_and_no_metadata);
    TEST_CASE(case_refusals);
    return test_finish();
}
