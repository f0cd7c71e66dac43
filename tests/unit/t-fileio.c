/*
 * Description: file helpers: path joining, whether a path's file could be
 * created, whole-file reads with a size cap
 * (missing files, directories and oversize files refused before reading),
 * and read-only mappings, which name their file by address while mapped.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/fileio.h"
#include "tests/harness.h"

static int joined(const char *dir, const char *name, const char *want)
{
    char *p = dg_path_join(dir, name);
    int ok = p && strcmp(p, want) == 0;
    free(p);
    return ok;
}

static int case_path_join(void)
{
    CHECK(joined("a", "b", "a/b"));
    CHECK(joined("a/", "b", "a/b"));
    CHECK(joined("a///", "b", "a/b"));
    CHECK(joined("/", "b", "/b"));
    CHECK(joined("", "b", "b"));
    {
        /* and the other way: the directory a path lies in */
        static const char *const cases[][2] = {{"a/b", "a"},       {"/x", "/"},
                                               {"name", "."},      {"/var/lib/m.db", "/var/lib"},
                                               {"rel/dir/f", "rel/dir"}};
        char buf[64], tiny[4];
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            dg_path_dir(cases[i][0], buf, sizeof buf);
            CHECKF(!strcmp(buf, cases[i][1]), "dir of %s: %s", cases[i][0], buf);
        }
        dg_path_dir("/long/dir/f", tiny, sizeof tiny);
        CHECK(!strcmp(tiny, "/lo"));
    }
    {
        /* whether a file could be made there, the reason named */
        struct dg_error err = {0};
        char path[600];
        snprintf(path, sizeof path, "%s/new.file", test_tmpdir());
        CHECK_OK(dg_path_creatable("thing", path, &err), &err);
        CHECK_FAILS(dg_path_creatable("thing", "/nonexistent-dgemma/x", &err), &err, DG_E_IO,
                    "thing /nonexistent-dgemma/x: cannot create it in /nonexistent-dgemma: ");
    }
    return 0;
}

static int case_read_with_cap(void)
{
    struct dg_error err = {0};
    const char *path = test_path("ten");
    FILE *f = fopen(path, "w");
    char *buf;
    size_t len;

    CHECK(f && fputs("0123456789", f) >= 0 && fclose(f) == 0);
    CHECK_OK(dg_file_read(path, 10, &buf, &len, &err), &err);
    CHECK(len == 10 && buf[10] == '\0' && !strcmp(buf, "0123456789"));
    free(buf);
    CHECK_FAILS(dg_file_read(path, 9, &buf, &len, &err), &err, DG_E_RANGE,
                "10 bytes, more than the 9 allowed");
    CHECK(buf == NULL && len == 0);
    CHECK_FAILS(dg_file_read(test_path("absent"), 100, &buf, &len, &err), &err, DG_E_MISSING,
                "absent: no such file");
    CHECK_FAILS(dg_file_read(test_tmpdir(), 100, &buf, &len, &err), &err, DG_E_IO,
                "not a regular file");
    return 0;
}

static int case_map(void)
{
    struct dg_error err = {0};
    struct dg_mapping m;
    const char *path = test_path("m"), *empty = test_path("empty");
    FILE *f = fopen(path, "w");

    CHECK(f && fputs("abc", f) >= 0 && fclose(f) == 0);
    CHECK_OK(dg_file_map(path, &m, &err), &err);
    CHECK(m.size == 3 && !memcmp(m.addr, "abc", 3));
    /* the live mapping is known by address (for the daemon's SIGBUS
     * handler), and forgotten at unmap */
    {
        const unsigned char *a = m.addr;
        CHECK(dg_file_mapping_at(a) && !strcmp(dg_file_mapping_at(a), path));
        CHECK(dg_file_mapping_at(a + 2) == dg_file_mapping_at(a));
        CHECK(dg_file_mapping_at(a + 3) == NULL &&
              dg_file_mapping_at((const void *)((uintptr_t)a - 1)) == NULL);
        dg_file_unmap(&m);
        CHECK(dg_file_mapping_at(a) == NULL);
    }
    CHECK(m.addr == NULL && m.size == 0);
    dg_file_unmap(&m); /* twice is harmless */
    f = fopen(empty, "w");
    CHECK(f && fclose(f) == 0);
    CHECK_OK(dg_file_map(empty, &m, &err), &err);
    CHECK(m.addr == NULL && m.size == 0);
    CHECK_FAILS(dg_file_map(test_path("nope"), &m, &err), &err, DG_E_MISSING, "no such file");
    CHECK_FAILS(dg_file_map(test_tmpdir(), &m, &err), &err, DG_E_IO, "not a readable regular file");
    CHECK(dg_file_exists(path) && !dg_file_exists(test_tmpdir()) && !dg_file_exists(test_path("x")));
    return 0;
}

int main(void)
{
    TEST_CASE(case_path_join);
    TEST_CASE(case_read_with_cap);
    TEST_CASE(case_map);
    return test_finish();
}
