/*
 * Description: the sampler's deterministic parts against Hugging Face
 * transformers 5.17.0 (model.md §9b step 4).  tests/golden/sampler/ holds
 * HF's generate recorded decision by decision (tests/hf/make_sampler_goldens.py):
 * per step the raw decoder logits, the multinomial samples and the uniform
 * ids HF drew.  Fed those logits and draws, dgemma must reach the same
 * temperatures, argmax canvases (exact), entropies (within 1e-5 relative),
 * acceptance masks (exact), next canvases (exact), stable / confident flags,
 * stop step and emitted canvas.  A missing golden fails.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/canvas-run.h"
#include "lib/npy.h"
#include "lib/sampler.h"
#include "tests/harness.h"

static const char *const CASES[] = {
    "cap", "beta-wide", "s0", "eos", "fixed-s1", "fixed-s2-confident", "fixed-unsure", "b-default",
};

static const char *cur;

static const char *gpath(const char *suffix)
{
    static char buf[4][512];
    static int slot;
    slot = (slot + 1) % 4;
    snprintf(buf[slot], sizeof buf[slot], "tests/golden/sampler/%s%s", cur, suffix);
    return buf[slot];
}

/* Copy a JSON list of n integers; 0 if the list is not that. */
static int ints(const json_t *list, int n, int32_t *out)
{
    if (!json_is_array(list) || (int)json_array_size(list) != n)
        return 0;
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, (size_t)i);
        if (!json_is_integer(v))
            return 0;
        out[i] = (int32_t)json_integer_value(v);
    }
    return 1;
}

static int floats(const json_t *list, int n, float *out)
{
    if (!json_is_array(list) || (int)json_array_size(list) != n)
        return 0;
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, (size_t)i);
        if (!json_is_number(v))
            return 0;
        out[i] = (float)json_number_value(v);
    }
    return 1;
}

static double num(const json_t *obj, const char *key)
{
    return json_number_value(json_object_get(obj, key));
}

/* totals over every case, printed at the end */
static long n_steps_total, n_positions_total, n_converged, n_capped;
static double worst_entropy_rel;

static int replay(void)
{
    struct dg_error err = {0};
    json_error_t je;
    json_t *doc = json_load_file(gpath(".json"), 0, &je), *settings, *canvases, *cv;
    float *logits = NULL;
    int ndim;
    int64_t shape[8];
    size_t ci;
    int CL, V, N;
    struct dg_canvas_params p;
    struct dg_canvas_run run;
    int32_t *buf;
    float *hf_ent, *our_ent;
    int32_t *sample, *renoise, *argmax_hf, *argmax_ours, *canvas_in, *accepted_hf;

    CHECKF(doc, "%s: %s", gpath(".json"), je.text);
    CHECKF(!strcmp(json_string_value(json_object_get(doc, "transformers")), "5.17.0") &&
               !strcmp(json_string_value(json_object_get(doc, "dtype")), "float32"),
           "%s: not a transformers 5.17.0 float32 golden", cur);
    CHECK_OK(dg_npy_read_f32(gpath("-logits.npy"), 64 << 20, &logits, &ndim, shape, &err), &err);
    settings = json_object_get(doc, "settings");
    CL = (int)json_integer_value(json_object_get(doc, "canvas_length"));
    V = (int)json_integer_value(json_object_get(doc, "vocab_size"));
    N = (int)json_integer_value(json_object_get(settings, "max_denoising_steps"));
    CHECK(ndim == 3 && shape[1] == CL && shape[2] == V && CL > 0 && V > 0 && N > 0);

    memset(&p, 0, sizeof p);
    p.canvas_length = CL;
    p.max_steps = N;
    p.entropy_bound = num(settings, "entropy_bound");
    p.confidence_threshold = num(settings, "confidence_threshold");
    p.stability_threshold = (int)json_integer_value(json_object_get(settings,
                                                                    "stability_threshold"));
    p.vocab_size = V;
    p.seed = 0;
    CHECK_OK(dg_canvas_run_init(&run, &p, &err), &err);

    buf = malloc(sizeof(int32_t) * (size_t)CL * 6 + sizeof(float) * (size_t)CL * 2);
    CHECK(buf);
    sample = buf;
    renoise = buf + CL;
    argmax_hf = buf + 2 * CL;
    argmax_ours = buf + 3 * CL;
    canvas_in = buf + 4 * CL;
    accepted_hf = buf + 5 * CL;
    hf_ent = (float *)(buf + 6 * CL);
    our_ent = hf_ent + CL;

    canvases = json_object_get(doc, "canvases");
    CHECK(json_is_array(canvases) && json_array_size(canvases) > 0);
    json_array_foreach(canvases, ci, cv) {
        json_t *steps = json_object_get(cv, "steps"), *st;
        size_t k;
        CHECK(ints(json_object_get(cv, "init"), CL, canvas_in));
        dg_canvas_run_start_with(&run, (uint32_t)ci, canvas_in);
        CHECK(json_is_array(steps) && json_array_size(steps) > 0);
        json_array_foreach(steps, k, st) {
            const int last = k + 1 == json_array_size(steps);
            const long li = (long)json_integer_value(json_object_get(st, "logits_index"));
            const float T = dg_temperature(num(settings, "t_min"),
                                           num(settings, "t_max"), N, (int)k);
            const float *z;
            enum dg_canvas_end end;
            uint8_t mask_from_hf_entropy[1024];
            int32_t order[1024];

            CHECK(CL <= 1024 && li >= 0 && li < shape[0]);
            z = logits + (size_t)li * (size_t)CL * (size_t)V;
            CHECKF(json_integer_value(json_object_get(st, "cur_step")) == N - (long)k,
                   "%s canvas %zu step %zu: cur_step", cur, ci, k);
            CHECKF((double)T == num(st, "temperature"),
                   "%s canvas %zu step %zu: temperature %.17g, HF %.17g", cur, ci, k, (double)T,
                   num(st, "temperature"));
            CHECKF(json_is_true(json_object_get(st, "sc")) == (k > 0),
                   "%s: self-conditioning flag at step %zu", cur, k);
            CHECKF(ints(json_object_get(st, "canvas_in"), CL, canvas_in) &&
                       !memcmp(canvas_in, run.canvas, sizeof(int32_t) * (size_t)CL),
                   "%s canvas %zu step %zu: the decoder's input canvas differs", cur, ci, k);
            CHECK(ints(json_object_get(st, "sample"), CL, sample));
            CHECK(ints(json_object_get(st, "argmax"), CL, argmax_hf));
            CHECK(ints(json_object_get(st, "accepted"), CL, accepted_hf));
            CHECK(floats(json_object_get(st, "entropy"), CL, hf_ent));
            if (!ints(json_object_get(st, "renoise"), CL, renoise))
                CHECKF(last, "%s canvas %zu step %zu: no renoise ids recorded", cur, ci, k);

            for (int i = 0; i < CL; i++) {
                struct dg_row_stats rs;
                double rel;
                dg_row_stats_slice(z + (size_t)i * V, 0, V, T, -INFINITY, NULL, &rs);
                argmax_ours[i] = rs.argmax;
                our_ent[i] = dg_row_entropy(&rs);
                rel = fabs((double)our_ent[i] - hf_ent[i]) / fmax(1.0, fabs(hf_ent[i]));
                if (rel > worst_entropy_rel)
                    worst_entropy_rel = rel;
                CHECKF(rel <= 1e-5, "%s canvas %zu step %zu pos %d: entropy %.9g, HF %.9g", cur,
                       ci, k, i, (double)our_ent[i], (double)hf_ent[i]);
                CHECKF(rs.argmax == argmax_hf[i],
                       "%s canvas %zu step %zu pos %d: argmax %d, HF %d", cur, ci, k, i,
                       rs.argmax, argmax_hf[i]);
            }
            /* the acceptance rule alone, on HF's own entropies */
            dg_accept_mask(hf_ent, CL, p.entropy_bound, mask_from_hf_entropy, order);
            for (int i = 0; i < CL; i++)
                CHECKF(mask_from_hf_entropy[i] == accepted_hf[i],
                       "%s canvas %zu step %zu pos %d: mask from HF's entropies", cur, ci, k, i);

            end = dg_canvas_run_step(&run, sample, argmax_ours, our_ent, last ? NULL : renoise);
            for (int i = 0; i < CL; i++)
                CHECKF(run.accepted[i] == accepted_hf[i],
                       "%s canvas %zu step %zu pos %d: accepted %d, HF %d", cur, ci, k, i,
                       run.accepted[i], accepted_hf[i]);
            CHECKF(run.last_stable == json_is_true(json_object_get(st, "stable")) &&
                       run.last_confident == json_is_true(json_object_get(st, "confident")),
                   "%s canvas %zu step %zu: stable %d confident %d, HF %d %d", cur, ci, k,
                   run.last_stable, run.last_confident,
                   json_is_true(json_object_get(st, "stable")),
                   json_is_true(json_object_get(st, "confident")));
            CHECKF(fabs((double)run.last_mean_entropy - num(st, "mean_entropy")) <=
                       1e-5 * fmax(1.0, fabs(num(st, "mean_entropy"))),
                   "%s: mean entropy %.9g, HF %.9g", cur, (double)run.last_mean_entropy,
                   num(st, "mean_entropy"));
            if (json_is_true(json_object_get(st, "finished"))) {
                CHECKF(last && end == DG_CANVAS_CONVERGED,
                       "%s canvas %zu: HF converged at step %zu, dgemma state %d", cur, ci, k,
                       (int)end);
                n_converged++;
            } else if (last) {
                CHECKF((int)k + 1 == N && end == DG_CANVAS_STEP_CAP,
                       "%s canvas %zu: HF stopped at step %zu of %d, dgemma state %d", cur, ci,
                       k, N, (int)end);
                n_capped++;
            } else {
                CHECKF(end == DG_CANVAS_RUNNING, "%s canvas %zu: dgemma stopped at step %zu", cur,
                       ci, k);
            }
            n_steps_total++;
            n_positions_total += CL;
        }
        CHECK(ints(json_object_get(cv, "emitted"), CL, canvas_in));
        CHECKF(!memcmp(canvas_in, run.argmax, sizeof(int32_t) * (size_t)CL),
               "%s canvas %zu: emitted canvas differs", cur, ci);
    }
    free(buf);
    free(logits);
    dg_canvas_run_free(&run);
    json_decref(doc);
    return 0;
}

/* HF pads everything after the first EOS of the canvas it stops on; the
 * server cuts there instead (the EOS excluded).  Check HF's returned tokens
 * agree with the emitted canvas up to that EOS. */
static int eos_padding(void)
{
    json_error_t je;
    json_t *doc, *c0;
    int32_t emitted[64], returned[64], eos;
    int CL, first = -1;

    cur = "eos";
    doc = json_load_file(gpath(".json"), 0, &je);
    CHECKF(doc, "%s: %s", gpath(".json"), je.text);
    CL = (int)json_integer_value(json_object_get(doc, "canvas_length"));
    CHECK(CL <= 64);
    CHECK(json_array_size(json_object_get(doc, "canvases")) == 1);
    c0 = json_array_get(json_object_get(doc, "canvases"), 0);
    CHECK(ints(json_object_get(c0, "emitted"), CL, emitted));
    CHECK(ints(json_object_get(c0, "returned"), CL, returned));
    eos = (int32_t)json_integer_value(json_array_get(json_object_get(doc, "eos_token_id"), 0));
    for (int i = 0; i < CL && first < 0; i++)
        if (emitted[i] == eos)
            first = i;
    CHECK(first >= 0 && first < CL - 1);
    for (int i = 0; i < CL; i++)
        CHECKF(returned[i] == (i <= first ? emitted[i] : 0), "eos: position %d", i);
    json_decref(doc);
    return 0;
}

int main(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char name[64];
        cur = CASES[i];
        snprintf(name, sizeof name, "replay_%s", CASES[i]);
        test_run(name, replay);
    }
    TEST_CASE(eos_padding);
    printf("# %ld steps, %ld positions replayed; %ld canvases converged, %ld at the step cap; "
           "worst entropy difference %.2g relative\n",
           n_steps_total, n_positions_total, n_converged, n_capped, worst_entropy_rel);
    return test_finish();
}
