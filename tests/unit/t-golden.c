/*
 * Description: the CPU backend against Hugging Face transformers 5.17.0
 * (float32, CPU) on the golden models of tests/golden/ (made by
 * tests/hf/make_goldens.py): encoder hidden states of a prompt longer than
 * the sliding window, a decoder step without and with self-conditioning,
 * and a decoder step of the second block after a commit.  Each output must
 * satisfy max|ours - ref| / max|ref| <= 1e-4.  A missing golden fails.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/cpu-forward.h"
#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "lib/kv-cache.h"
#include "lib/model-weights.h"
#include "lib/npy.h"
#include "tests/harness.h"

#define TOL 1e-4

static const char *const GOLDENS[] = {"golden-a", "golden-b"};

static const char *cur; /* the golden under test */

static char *gpath(const char *file)
{
    static char buf[8][512];
    static int slot;
    slot = (slot + 1) % 8;
    snprintf(buf[slot], sizeof buf[slot], "tests/golden/%s/%s", cur, file);
    return buf[slot];
}

static int read_ids(const char *file, int64_t vocab, int32_t **ids, size_t *n,
                    struct dg_error *err)
{
    char *text;
    size_t len;
    int rc = dg_file_read(gpath(file), 1 << 20, &text, &len, err);
    if (rc)
        return rc;
    rc = dg_ids_parse(text, len, vocab, gpath(file), ids, n, err);
    free(text);
    return rc;
}

/* Compare got against the golden file; prints the measured ratio. */
static int compare(const char *file, const float *got, int64_t rows, int64_t cols,
                   struct dg_error *err, double *ratio_out)
{
    float *ref;
    int ndim;
    int64_t shape[8];
    double max_d = 0, max_r = 0;
    int64_t argmax_same = 0;
    int rc = dg_npy_read_f32(gpath(file), 64 << 20, &ref, &ndim, shape, err);

    if (rc)
        return rc;
    if (ndim != 2 || shape[0] != rows || shape[1] != cols) {
        free(ref);
        return dg_error_set(err, DG_E_SHAPE, "%s: shape [%lld, %lld], expected [%lld, %lld]",
                            gpath(file), (long long)(ndim > 0 ? shape[0] : -1),
                            (long long)(ndim > 1 ? shape[1] : -1), (long long)rows,
                            (long long)cols);
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t am_g = 0, am_r = 0;
        for (int64_t c = 0; c < cols; c++) {
            const double g = got[r * cols + c], e = ref[r * cols + c];
            if (!isfinite(g))
                max_d = INFINITY;
            if (fabs(g - e) > max_d)
                max_d = fabs(g - e);
            if (fabs(e) > max_r)
                max_r = fabs(e);
            if (got[r * cols + c] > got[r * cols + am_g])
                am_g = c;
            if (ref[r * cols + c] > ref[r * cols + am_r])
                am_r = c;
        }
        argmax_same += am_g == am_r;
    }
    free(ref);
    *ratio_out = max_r > 0 ? max_d / max_r : max_d;
    printf("# %s %s: max|d| %.3g, max|ref| %.3g, ratio %.3g, row argmax agree %lld/%lld\n", cur,
           file, max_d, max_r, *ratio_out, (long long)argmax_same, (long long)rows);
    return 0;
}

static int read_sc(const char *file, int64_t CL, int64_t V, float **sc, struct dg_error *err)
{
    int ndim;
    int64_t shape[8];
    int rc = dg_npy_read_f32(gpath(file), 64 << 20, sc, &ndim, shape, err);
    if (rc == 0 && (ndim != 2 || shape[0] != CL || shape[1] != V)) {
        free(*sc);
        *sc = NULL;
        return dg_error_set(err, DG_E_SHAPE, "%s: unexpected shape", gpath(file));
    }
    return rc;
}

static int case_golden(void)
{
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_cpu_model cm;
    struct dg_kv_cache kv;
    struct dg_error err = {0};
    int32_t *prompt = NULL, *c1 = NULL, *c2 = NULL, *commit = NULL, *c3 = NULL;
    size_t P, n1, n2, nc, n3;
    float *hidden, *logits, *sc2 = NULL, *sc3 = NULL;
    int64_t V, H, CL;
    double ratio;
    json_error_t je;
    json_t *meta = json_load_file(gpath("meta.json"), 0, &je);

    CHECKF(meta, "%s: %s", gpath("meta.json"), je.text);
    CHECKF(!strcmp(json_string_value(json_object_get(meta, "transformers")), "5.17.0") &&
               !strcmp(json_string_value(json_object_get(meta, "dtype")), "float32"),
           "%s: not a transformers 5.17.0 float32 golden", cur);
    json_decref(meta);

    CHECK_OK(dg_model_load(gpath("checkpoint"), &ck, &m, &err), &err);
    V = m.cfg.vocab_size;
    H = m.cfg.hidden_size;
    CHECK_OK(read_ids("prompt.ids", V, &prompt, &P, &err), &err);
    CHECK_OK(read_ids("canvas1.ids", V, &c1, &n1, &err), &err);
    CHECK_OK(read_ids("canvas2.ids", V, &c2, &n2, &err), &err);
    CHECK_OK(read_ids("commit.ids", V, &commit, &nc, &err), &err);
    CHECK_OK(read_ids("canvas3.ids", V, &c3, &n3, &err), &err);
    CL = (int64_t)n1;
    CHECK(n2 == n1 && nc == n1 && n3 == n1 && CL == m.cfg.canvas_length);
    CHECK((int64_t)P > m.cfg.sliding_window); /* the window matters */
    CHECK_OK(read_sc("sc2.npy", CL, V, &sc2, &err), &err);
    CHECK_OK(read_sc("sc3.npy", CL, V, &sc3, &err), &err);

    CHECK_OK(dg_cpu_model_init(&cm, &m, &err), &err);
    CHECK_OK(dg_kv_cache_init(&kv, &m.cfg, (int64_t)P + 2 * CL, &err), &err);
    hidden = malloc(sizeof(float) * P * (size_t)H);
    logits = malloc(sizeof(float) * (size_t)(CL * V));
    CHECK(hidden && logits);

    CHECK_OK(dg_cpu_encode(&cm, &kv, prompt, (int64_t)P, hidden, &err), &err);
    CHECK_OK(compare("encoder_hidden.npy", hidden, (int64_t)P, H, &err, &ratio), &err);
    CHECKF(ratio <= TOL, "encoder hidden states off by %.3g", ratio);

    CHECK_OK(dg_cpu_decode(&cm, &kv, c1, CL, NULL, (&cm)->m->cfg.vocab_size, logits, &err), &err);
    CHECK_OK(compare("logits1.npy", logits, CL, V, &err, &ratio), &err);
    CHECKF(ratio <= TOL, "decoder step without self-conditioning off by %.3g", ratio);

    CHECK_OK(dg_cpu_decode(&cm, &kv, c2, CL, sc2, (&cm)->m->cfg.vocab_size, logits, &err), &err);
    CHECK_OK(compare("logits2.npy", logits, CL, V, &err, &ratio), &err);
    CHECKF(ratio <= TOL, "decoder step with self-conditioning off by %.3g", ratio);

    CHECK_OK(dg_cpu_encode(&cm, &kv, commit, CL, NULL, &err), &err);
    CHECK(kv.length == (int64_t)P + CL);
    CHECK_OK(dg_cpu_decode(&cm, &kv, c3, CL, sc3, (&cm)->m->cfg.vocab_size, logits, &err), &err);
    CHECK_OK(compare("logits3.npy", logits, CL, V, &err, &ratio), &err);
    CHECKF(ratio <= TOL, "second block after a commit off by %.3g", ratio);

    free(hidden);
    free(logits);
    free(sc2);
    free(sc3);
    free(prompt);
    free(c1);
    free(c2);
    free(commit);
    free(c3);
    dg_kv_cache_free(&kv);
    dg_cpu_model_free(&cm);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

int main(void)
{
    for (size_t i = 0; i < sizeof GOLDENS / sizeof GOLDENS[0]; i++) {
        cur = GOLDENS[i];
        test_run(cur, case_golden);
    }
    return test_finish();
}
