/*
 * bench-tokenizer - load time and single-thread encode throughput of the C
 * tokenizer, printed as one JSON line (bench/tokenizer/run.sh compares it
 * with Hugging Face's Rust engine on the same files).
 *
 * usage: bench-tokenizer TOKENIZER.json CORPUS.txt [LOADS] [ENCODES]
 * The corpus is encoded whole (one text) ENCODES times; the median of the
 * runs is reported.  Not a test: it asserts nothing about speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/fileio.h"
#include "lib/tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    struct dg_error err = {0};
    struct dg_tokenizer *t = NULL;
    char *corpus;
    size_t len;
    int loads = argc > 3 ? atoi(argv[3]) : 5, encodes = argc > 4 ? atoi(argv[4]) : 5;
    double *lt, *et;
    struct dg_ids ids = {0};

    if (argc < 3 || loads < 1 || encodes < 1) {
        fprintf(stderr, "usage: bench-tokenizer TOKENIZER.json CORPUS.txt [LOADS] [ENCODES]\n");
        return 2;
    }
    if (dg_file_read(argv[2], 1u << 30, &corpus, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    lt = calloc((size_t)loads, sizeof *lt);
    et = calloc((size_t)encodes, sizeof *et);
    for (int i = 0; i < loads; i++) {
        double t0 = now();
        if (t)
            dg_tokenizer_free(t);
        if (dg_tokenizer_load(argv[1], NULL, &t, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        lt[i] = now() - t0;
    }
    for (int i = 0; i < encodes; i++) {
        double t0;
        ids.n = 0;
        t0 = now();
        if (dg_tokenizer_encode(t, corpus, len, 0, &ids, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        et[i] = now() - t0;
    }
    qsort(lt, (size_t)loads, sizeof *lt, cmp_double);
    qsort(et, (size_t)encodes, sizeof *et, cmp_double);
    printf("{\"engine\": \"dgemma\", \"load_s\": %.4f, \"encode_s\": %.4f, \"bytes\": %zu, "
           "\"tokens\": %zu, \"mb_per_s\": %.2f}\n", lt[loads / 2], et[encodes / 2], len, ids.n,
           (double)len / 1e6 / et[encodes / 2]);
    dg_ids_free(&ids);
    dg_tokenizer_free(t);
    free(corpus);
    free(lt);
    free(et);
    return 0;
}
