/*
 * Description: the safetensors parser accepts well-formed files and refuses
 * each kind of corruption with its own error (header length past the file
 * or over the limit, malformed JSON, bad entries, non-monotonic, oversized,
 * out-of-file, misaligned, overlapping, gapped and trailing data ranges,
 * truncation at every length); the writer's files parse back bit-exact.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "lib/fileio.h"
#include "lib/safetensors-write.h"
#include "lib/safetensors.h"
#include "tests/harness.h"

/* A file image: u64 LE header length, the header text padded with spaces
 * to a multiple of 8 (as writers do, so data starts 8-aligned), then
 * data_len bytes of (i * 7 + 3) & 0xff. */
static unsigned char *image(const char *header, size_t data_len, size_t *len)
{
    size_t n = strlen(header), h = (n + 7) & ~(size_t)7;
    unsigned char *b = malloc(8 + h + data_len + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memset(b + 8, ' ', h);
    memcpy(b + 8, header, n);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (unsigned char)((i * 7 + 3) & 0xff);
    *len = 8 + h + data_len;
    return b;
}

/* parse an image; returns the parser's rc, fills err */
static int parse_image(const char *header, size_t data_len, struct dg_error *err)
{
    size_t len;
    unsigned char *b = image(header, data_len, &len);
    struct dg_st_file f;
    int rc = dg_st_parse(b, len, "x.safetensors", &f, err);
    if (rc == 0)
        dg_st_file_free(&f);
    free(b);
    return rc;
}

static int case_valid_file(void)
{
    /* header padded with spaces to 160 bytes, as writers do: data starts at 168 */
    char hdr[161];
    const char *json = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[0,4]},"
                       "\"__metadata__\":{\"format\":\"pt\"}}";
    struct dg_st_file f;
    struct dg_error err = {0};
    unsigned char *b;
    size_t len;

    CHECK(strlen(json) < 160);
    memset(hdr, ' ', 160);
    memcpy(hdr, json, strlen(json));
    hdr[160] = '\0';
    b = image(hdr, 12, &len);
    CHECK_OK(dg_st_parse(b, len, "v.safetensors", &f, &err), &err);
    CHECK(f.n_tensors == 2 && f.header_len == 160 && f.data_offset == 168 && f.data_size == 12);
    CHECK(!strcmp(f.tensors[0].name, "a") && !strcmp(f.tensors[1].name, "b")); /* offset order */
    CHECK(f.tensors[0].dtype == DG_DTYPE_BF16 && f.tensors[0].ndim == 2 &&
          f.tensors[0].shape[0] == 1 && f.tensors[0].shape[1] == 2 && f.tensors[0].nelem == 2);
    CHECK(f.tensors[1].data == b + 168 + 4 && f.tensors[1].end == 12);
    dg_st_file_free(&f);
    CHECK(f.n_tensors == 0 && f.tensors == NULL);
    free(b);
    return 0;
}

static int case_empty_and_scalar_tensors(void)
{
    struct dg_error err = {0};
    CHECK_OK(parse_image("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
                         "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, &err),
             &err);
    CHECK_OK(parse_image("{}", 0, &err), &err);
    return 0;
}

static int case_too_short(void)
{
    struct dg_error err = {0};
    struct dg_st_file f;
    unsigned char b[7] = {0};
    CHECK_FAILS(dg_st_parse(b, sizeof b, "s.safetensors", &f, &err), &err, DG_E_RANGE,
                "s.safetensors: file is 7 bytes, too short for the 8-byte header length");
    return 0;
}

static int case_header_length_past_file(void)
{
    struct dg_error err = {0};
    struct dg_st_file f;
    size_t len;
    unsigned char *b = image("{}", 0, &len);
    b[0] = 9; /* claims 9 header bytes, file has 8 */
    CHECK_FAILS(dg_st_parse(b, len, "h.safetensors", &f, &err), &err, DG_E_RANGE,
                "header length 9 runs past the end of the file (16 bytes; truncated?)");
    b[7] = 0x80; /* a length near 2^63 must not overflow the check */
    CHECK_FAILS(dg_st_parse(b, len, "h.safetensors", &f, &err), &err, DG_E_RANGE,
                "runs past the end of the file");
    free(b);
    return 0;
}

static int case_header_length_over_limit(void)
{
    struct dg_error err = {0};
    struct dg_st_file f;
    size_t size = 8 + (size_t)DG_ST_HEADER_MAX + 16;
    unsigned char *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t h = (uint64_t)DG_ST_HEADER_MAX + 1;

    CHECK(b != MAP_FAILED);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(h >> (8 * i));
    CHECK_FAILS(dg_st_parse(b, size, "big.safetensors", &f, &err), &err, DG_E_RANGE,
                "header length 100000001 exceeds the limit of 100000000 bytes");
    munmap(b, size);
    return 0;
}

static int case_malformed_header_json(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",", 0, &err), &err, DG_E_FORMAT,
                "x.safetensors: header: malformed JSON at line 1");
    CHECK_FAILS(parse_image("[1,2]", 0, &err), &err, DG_E_FORMAT,
                "x.safetensors: header is an array, not a JSON object");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &err),
                &err, DG_E_FORMAT, "duplicate");
    CHECK_FAILS(parse_image("{\"a\":\"\xff\xfe\"}", 0, &err), &err, DG_E_FORMAT, "malformed JSON");
    return 0;
}

static int case_bad_entries(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":[1]}", 0, &err), &err, DG_E_FORMAT,
                "tensor 'a': entry is an array, not an object");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, &err), &err, DG_E_FORMAT,
                "tensor 'a': missing 'data_offsets'");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                            "\"x\":1}}", 4, &err), &err, DG_E_FORMAT, "tensor 'a': unexpected key 'x'");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            &err), &err, DG_E_FORMAT, "tensor 'a': unknown dtype 'Q4_K'");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err),
                &err, DG_E_FORMAT, "tensor 'a': dtype is an integer, not a string");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                            &err), &err, DG_E_FORMAT, "tensor 'a': shape must be an array");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                            &err), &err, DG_E_FORMAT, "shape must be an array");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                            "\"data_offsets\":[0,4]}}", 4, &err), &err, DG_E_FORMAT,
                "at most 8 non-negative integers");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                            &err), &err, DG_E_FORMAT, "data_offsets must be two non-negative integers");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
                            &err), &err, DG_E_FORMAT, "data_offsets must be");
    CHECK_FAILS(parse_image("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            &err), &err, DG_E_FORMAT, "tensor name is empty");
    CHECK_FAILS(parse_image("{\"__metadata__\":{\"format\":1}}", 0, &err), &err, DG_E_FORMAT,
                "__metadata__.format is an integer; values must be strings");
    CHECK_FAILS(parse_image("{\"__metadata__\":[]}", 0, &err), &err, DG_E_FORMAT,
                "__metadata__ is an array, not an object");
    return 0;
}

static int case_element_count_overflow(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                            "\"data_offsets\":[0,4]}}", 4, &err), &err, DG_E_RANGE,
                "element count overflows");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                            "\"data_offsets\":[0,4]}}", 4, &err), &err, DG_E_RANGE,
                "byte size overflows");
    return 0;
}

static int case_non_monotonic_range(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                            &err), &err, DG_E_RANGE, "tensor 'a': non-monotonic data range [8, 4)");
    return 0;
}

static int case_size_mismatch(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,6]}}",
                            6, &err), &err, DG_E_RANGE,
                "tensor 'a': BF16 with 4 elements needs 8 bytes but data_offsets span 6");
    return 0;
}

static int case_range_past_end(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
                            &err), &err, DG_E_RANGE,
                "tensor 'a': data range [0, 16) runs past the end of the data section (12 bytes; "
                "file truncated?)");
    return 0;
}

static int case_misaligned(void)
{
    struct dg_error err = {0};
    /* the header pads to 112 bytes, so data starts at 120; an F32 at data
     * offset 2 sits at file offset 122 */
    const char *h = "{\"p\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}";
    CHECK(strlen(h) == 106);
    CHECK_FAILS(parse_image(h, 6, &err), &err, DG_E_RANGE,
                "tensor 'a': data offset 122 is misaligned for F32 (4-byte elements)");
    return 0;
}

static int case_overlap(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                            &err), &err, DG_E_RANGE, "tensors 'a' and 'b' overlap");
    return 0;
}

static int case_hole(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
                            &err), &err, DG_E_RANGE, "4 unused bytes before tensor 'b'");
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                            &err), &err, DG_E_RANGE, "4 unused bytes before tensor 'a'");
    return 0;
}

static int case_trailing_bytes(void)
{
    struct dg_error err = {0};
    CHECK_FAILS(parse_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
                            &err), &err, DG_E_RANGE, "5 trailing bytes after the last tensor");
    return 0;
}

/* ---- writer round trip, truncation sweep, byte flips --------------------- */

struct fill_data {
    const void *const *src;
};

static int fill_from(void *ud, size_t index, void *buf, size_t nbytes, struct dg_error *err)
{
    const struct fill_data *f = ud;
    memcpy(buf, f->src[index], nbytes);
    (void)err;
    return 0;
}

static int write_sample(const char *path, struct dg_error *err)
{
    static const uint16_t odd[3] = {0x3f80, 0xc000, 0x4040};  /* BF16, 6 bytes */
    static const float vec[5] = {1, -2, 3.5f, 1e-3f, 42};
    static const uint8_t bytes[3] = {9, 8, 7};
    static const double d[2] = {0.25, -8};
    const void *src[4] = {odd, vec, bytes, d};
    struct fill_data fd = {src};
    struct dg_st_out_tensor t[4] = {
        {"z.odd", DG_DTYPE_BF16, 1, {3}},
        {"m.vec", DG_DTYPE_F32, 2, {1, 5}},
        {"a.bytes", DG_DTYPE_U8, 1, {3}},
        {"k.f64", DG_DTYPE_F64, 1, {2}},
    };
    return dg_st_write(path, t, 4, fill_from, &fd, err);
}

static int case_writer_round_trip(void)
{
    struct dg_error err = {0};
    struct dg_mapping m;
    struct dg_st_file f;
    const char *path = test_path("w.safetensors");
    float v[5];

    CHECK_OK(write_sample(path, &err), &err);
    CHECK_OK(dg_file_map(path, &m, &err), &err);
    CHECK_OK(dg_st_parse(m.addr, m.size, path, &f, &err), &err);
    CHECK(f.n_tensors == 4 && f.header_len % 8 == 0);
    /* laid out by decreasing element size: F64, F32, BF16, U8 */
    CHECK(!strcmp(f.tensors[0].name, "k.f64") && !strcmp(f.tensors[1].name, "m.vec") &&
          !strcmp(f.tensors[2].name, "z.odd") && !strcmp(f.tensors[3].name, "a.bytes"));
    memcpy(v, f.tensors[1].data, sizeof v);
    CHECK(v[0] == 1 && v[2] == 3.5f && v[4] == 42);
    CHECK(f.tensors[1].shape[0] == 1 && f.tensors[1].shape[1] == 5);
    CHECK(f.tensors[3].data[0] == 9 && f.tensors[3].data[2] == 7);
    dg_st_file_free(&f);
    dg_file_unmap(&m);
    CHECK(!dg_file_exists(test_path("w.safetensors.tmp")));
    return 0;
}

/* The writer refuses names the header could not hold as given: one name
 * twice (the header would keep one entry for two tensors' bytes) and a
 * name that is not UTF-8; the path is left as it was, and no .tmp. */
static int case_writer_refuses_names(void)
{
    static const uint8_t bytes[3] = {1, 2, 3};
    const void *src[2] = {bytes, bytes};
    struct fill_data fd = {src};
    struct dg_error err = {0};
    const char *path = test_path("names.safetensors");
    const char *tmp = test_path("names.safetensors.tmp");
    struct dg_st_out_tensor twice[2] = {
        {"a.w", DG_DTYPE_U8, 1, {3}},
        {"a.w", DG_DTYPE_U8, 1, {3}},
    };
    struct dg_st_out_tensor bad[1] = {{"a.\xff", DG_DTYPE_U8, 1, {3}}};

    CHECK_FAILS(dg_st_write(path, twice, 2, fill_from, &fd, &err), &err, DG_E_INVAL,
                "named twice");
    CHECK_FAILS(dg_st_write(path, bad, 1, fill_from, &fd, &err), &err, DG_E_INVAL,
                "not UTF-8");
    CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0);
    return 0;
}

static int case_truncated_at_every_length(void)
{
    struct dg_error err = {0};
    struct dg_mapping m;
    const char *path = test_path("t.safetensors");

    CHECK_OK(write_sample(path, &err), &err);
    CHECK_OK(dg_file_map(path, &m, &err), &err);
    for (size_t n = 0; n < m.size; n++) {
        struct dg_st_file f;
        unsigned char *copy = malloc(n ? n : 1); /* exact-size copy: ASan sees any overread */
        int rc;
        memcpy(copy, m.addr, n);
        dg_error_clear(&err);
        rc = dg_st_parse(copy, n, "cut", &f, &err);
        free(copy);
        CHECKF(rc == -DG_E_RANGE || rc == -DG_E_FORMAT, "prefix of %zu/%zu bytes: rc %d (%s)", n,
               m.size, rc, err.msg);
    }
    dg_file_unmap(&m);
    return 0;
}

static int case_byte_flips_never_escape(void)
{
    struct dg_error err = {0};
    struct dg_mapping m;
    const char *path = test_path("f.safetensors");
    size_t accepted = 0;

    CHECK_OK(write_sample(path, &err), &err);
    CHECK_OK(dg_file_map(path, &m, &err), &err);
    for (size_t i = 0; i < m.size; i++) {
        for (int bit = 0; bit < 8; bit++) {
            struct dg_st_file f;
            unsigned char *copy = malloc(m.size);
            memcpy(copy, m.addr, m.size);
            copy[i] ^= (unsigned char)(1u << bit);
            if (dg_st_parse(copy, m.size, "flip", &f, &err) == 0) {
                /* whatever was accepted must describe in-bounds, tiled data */
                uint64_t covered = 0;
                for (size_t t = 0; t < f.n_tensors; t++) {
                    CHECK(f.tensors[t].data >= copy + f.data_offset);
                    CHECK(f.tensors[t].data + (f.tensors[t].end - f.tensors[t].begin) <=
                          copy + m.size);
                    covered += f.tensors[t].end - f.tensors[t].begin;
                }
                CHECK(covered == f.data_size);
                accepted++;
                dg_st_file_free(&f);
            }
            free(copy);
        }
    }
    printf("# %zu of %zu single-bit flips still parse (data bytes, padding, names)\n", accepted,
           m.size * 8);
    dg_file_unmap(&m);
    return 0;
}

int main(void)
{
    TEST_CASE(case_valid_file);
    TEST_CASE(case_empty_and_scalar_tensors);
    TEST_CASE(case_too_short);
    TEST_CASE(case_header_length_past_file);
    TEST_CASE(case_header_length_over_limit);
    TEST_CASE(case_malformed_header_json);
    TEST_CASE(case_bad_entries);
    TEST_CASE(case_element_count_overflow);
    TEST_CASE(case_non_monotonic_range);
    TEST_CASE(case_size_mismatch);
    TEST_CASE(case_range_past_end);
    TEST_CASE(case_misaligned);
    TEST_CASE(case_overlap);
    TEST_CASE(case_hole);
    TEST_CASE(case_trailing_bytes);
    TEST_CASE(case_writer_round_trip);
    TEST_CASE(case_writer_refuses_names);
    TEST_CASE(case_truncated_at_every_length);
    TEST_CASE(case_byte_flips_never_escape);
    return test_finish();
}
