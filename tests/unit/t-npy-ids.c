/*
 * Description: .npy float32 files (written and read back; files NumPy
 * wrote; every malformed header refused) and token-id text files (ranges,
 * non-numbers with line:column, empty input).
 */
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "lib/npy.h"
#include "tests/harness.h"

static int case_npy_round_trip(void)
{
    struct dg_error err = {0};
    const float x[6] = {1, -2.5f, 3e-8f, 4, 5, 6};
    const int64_t s2[2] = {2, 3}, s1[1] = {6}, s0[1] = {0};
    float *y;
    int nd;
    int64_t sh[8];
    struct dg_mapping m;

    CHECK_OK(dg_npy_write_f32(test_path("a.npy"), x, 2, s2, &err), &err);
    CHECK_OK(dg_npy_read_f32(test_path("a.npy"), 1 << 20, &y, &nd, sh, &err), &err);
    CHECK(nd == 2 && sh[0] == 2 && sh[1] == 3 && memcmp(x, y, sizeof x) == 0);
    free(y);
    /* NumPy's layout: header padded to a multiple of 64 bytes (here 128) ending
     * in '\n'; 1-D shapes "(6,)" */
    CHECK_OK(dg_npy_write_f32(test_path("b.npy"), x, 1, s1, &err), &err);
    CHECK_OK(dg_file_map(test_path("b.npy"), &m, &err), &err);
    CHECK(m.size == 128 + 24 && ((char *)m.addr)[127] == '\n');
    CHECK(memmem(m.addr, 128, "'shape': (6,), }", 16));
    dg_file_unmap(&m);
    CHECK_OK(dg_npy_write_f32(test_path("c.npy"), x, 1, s0, &err), &err);
    CHECK_OK(dg_npy_read_f32(test_path("c.npy"), 1 << 20, &y, &nd, sh, &err), &err);
    CHECK(nd == 1 && sh[0] == 0);
    free(y);
    return 0;
}

static int case_npy_written_by_numpy(void)
{
    struct dg_error err = {0};
    float *y;
    int nd;
    int64_t sh[8];
    /* the goldens were saved by numpy.save on the GPU machine */
    CHECK_OK(dg_npy_read_f32("tests/golden/golden-b/logits1.npy", 1 << 20, &y, &nd, sh, &err),
             &err);
    CHECK(nd == 2 && sh[0] == 32 && sh[1] == 263);
    free(y);
    return 0;
}

/* parse a literal image: 10-byte preamble for v1 + header text + data bytes */
static int parse_v1(const char *header, size_t data_bytes, struct dg_error *err)
{
    size_t h = strlen(header), n = 10 + h + data_bytes;
    unsigned char *b = calloc(1, n);
    const void *d;
    int nd, rc;
    int64_t sh[8];
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(h & 0xff);
    b[9] = (unsigned char)(h >> 8);
    memcpy(b + 10, header, h);
    rc = dg_npy_parse_f32(b, n, "x.npy", &d, &nd, sh, err);
    free(b);
    return rc;
}

static int case_npy_unaligned_data(void)
{
    /* a 71-byte header puts the data at offset 81: legal, and unaligned
     * (found by fuzz-npy: the parser once returned a misaligned float *) */
    struct dg_error err = {0};
    const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }             \n";
    const float vals[2] = {1.5f, -3.25f};
    unsigned char b[10 + 71 + 8];
    const void *d;
    float got[2];
    int nd;
    int64_t sh[8];

    CHECK(strlen(h) == 71);
    memcpy(b, "\x93NUMPY\x01\x00\x47\x00", 10);
    memcpy(b + 10, h, 71);
    memcpy(b + 81, vals, 8);
    CHECK_OK(dg_npy_parse_f32(b, sizeof b, "u.npy", &d, &nd, sh, &err), &err);
    CHECK(d == b + 81 && nd == 1 && sh[0] == 2);
    memcpy(got, d, sizeof got);
    CHECK(got[0] == 1.5f && got[1] == -3.25f);
    return 0;
}

static int case_npy_refusals(void)
{
    struct dg_error err = {0};
    const void *d;
    int nd;
    int64_t sh[8];

    CHECK_OK(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n", 16, &err),
             &err);
    CHECK_FAILS(dg_npy_parse_f32("PK\x03\x04zipfile", 12, "x.npy", &d, &nd, sh, &err), &err,
                DG_E_FORMAT, "x.npy: not a .npy file");
    CHECK_FAILS(parse_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, &err),
                &err, DG_E_UNSUPPORTED, "not little-endian float32");
    CHECK_FAILS(parse_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, &err),
                &err, DG_E_UNSUPPORTED, "not little-endian float32");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, &err),
                &err, DG_E_UNSUPPORTED, "Fortran-ordered");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, &err),
                &err, DG_E_RANGE, "shape needs 24 bytes of data but the file holds 20");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 8, &err),
                &err, DG_E_FORMAT, "bad shape");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': 2, }", 8, &err), &err,
                DG_E_FORMAT, "shape is not a tuple");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False}", 8, &err), &err, DG_E_FORMAT,
                "no 'shape'");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': "
                         "(1,1,1,1,1,1,1,1,1), }", 4, &err), &err, DG_E_FORMAT, "bad shape entry");
    CHECK_FAILS(parse_v1("{'descr': '<f4', 'fortran_order': False, 'shape': "
                         "(4294967296, 4294967296), }", 0, &err), &err, DG_E_FORMAT,
                "shape overflows");
    {
        unsigned char b[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xff, 0xff, '{', '}'};
        CHECK_FAILS(dg_npy_parse_f32(b, sizeof b, "x.npy", &d, &nd, sh, &err), &err, DG_E_FORMAT,
                    "header length 65535 runs past the file");
    }
    return 0;
}

static int ids(const char *text, int64_t vocab, int32_t **out, size_t *n, struct dg_error *err)
{
    return dg_ids_parse(text, strlen(text), vocab, "p.ids", out, n, err);
}

static int case_ids(void)
{
    struct dg_error err = {0};
    int32_t *v;
    size_t n;

    CHECK_OK(ids(" 2 10\n\t300  0\r\n", 301, &v, &n, &err), &err);
    CHECK(n == 4 && v[0] == 2 && v[1] == 10 && v[2] == 300 && v[3] == 0);
    free(v);
    CHECK_FAILS(ids("1 2\n3 301", 301, &v, &n, &err), &err, DG_E_FORMAT,
                "p.ids:2:3: id 301 is outside the vocabulary [0, 301)");
    CHECK_FAILS(ids("1 -2", 301, &v, &n, &err), &err, DG_E_FORMAT,
                "p.ids:1:3: '-2' is not a token id");
    CHECK_FAILS(ids("1,2", 301, &v, &n, &err), &err, DG_E_FORMAT, "'1,2' is not a token id");
    CHECK_FAILS(ids("99999999999999", 301, &v, &n, &err), &err, DG_E_FORMAT, "is not a token id");
    CHECK_FAILS(ids(" \n ", 301, &v, &n, &err), &err, DG_E_FORMAT, "p.ids: no token ids");
    CHECK(v == NULL && n == 0);
    return 0;
}

int main(void)
{
    TEST_CASE(case_npy_round_trip);
    TEST_CASE(case_npy_written_by_numpy);
    TEST_CASE(case_npy_unaligned_data);
    TEST_CASE(case_npy_refusals);
    TEST_CASE(case_ids);
    return test_finish();
}
