/* cmd-forward.c - `dgemma-eval forward`: run the CPU backend on given ids
 * and write the result as float32 .npy, for comparison with references;
 * and `dgemma-eval compare`, which compares two such files. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/fileio.h"
#include "lib/ids-text.h"
#include "lib/model-weights.h"
#include "lib/npy.h"
#include "lib/tp-forward.h"
#include "tools/eval/eval.h"

#define MAX_COMMITS 64
#define NPY_FILE_MAX (4ull << 30)

static const char usage[] =
    "usage: dgemma-eval forward --model DIR --prompt-ids FILE [--commit-ids FILE]...\n"
    "                           [--canvas-ids FILE] [--sc-logits FILE.npy]\n"
    "                           [--mode encoder|decoder] [--tp T]\n"
    "                           [--experts across|width] --out FILE.npy\n"
    "Encode the prompt (and then each committed canvas, in order) on the CPU\n"
    "backend.  encoder mode (the default without --canvas-ids) writes the\n"
    "final-normed hidden states of the last encoder pass [T, H]; decoder mode\n"
    "runs one denoising step over the canvas and writes its softcapped logits\n"
    "[CL, V], self-conditioned on --sc-logits (processed logits [CL, V]) if given.\n"
    "Id files hold whitespace-separated integers; '-' reads standard input.\n"
    "--tp T runs T tensor-parallel rank threads (experts split across ranks, or\n"
    "along their width with --experts width); the result is assembled from the\n"
    "ranks' parts.\n";

int cmd_forward(int argc, char **argv)
{
    const char *model = NULL, *prompt_path = NULL, *canvas_path = NULL, *sc_path = NULL;
    const char *out = NULL, *mode = NULL, *commits[MAX_COMMITS];
    int n_commits = 0, decoder, status = 1;
    struct dg_checkpoint ck;
    struct dg_model m;
    int tp = 1;
    enum dg_expert_split experts = DG_EXPERTS_ACROSS;
    struct dg_error err = {0};
    int32_t *prompt = NULL, *canvas = NULL, *commit_ids[MAX_COMMITS] = {0};
    size_t n_prompt = 0, n_canvas = 0, n_commit[MAX_COMMITS] = {0};
    float *sc = NULL, *result = NULL;
    int64_t total, shape[2];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!val || a[0] != '-') {
            eval_errorf("forward: unexpected argument '%s'%s", a, val ? "" : " (missing value?)");
            fputs(usage, stderr);
            return 2;
        }
        if (!strcmp(a, "--model"))
            model = val;
        else if (!strcmp(a, "--prompt-ids"))
            prompt_path = val;
        else if (!strcmp(a, "--canvas-ids"))
            canvas_path = val;
        else if (!strcmp(a, "--sc-logits"))
            sc_path = val;
        else if (!strcmp(a, "--out"))
            out = val;
        else if (!strcmp(a, "--mode"))
            mode = val;
        else if (!strcmp(a, "--tp")) {
            char *end;
            long t = strtol(val, &end, 10);
            if (end == val || *end || t < 1 || t > DG_TP_MAX) {
                eval_errorf("forward: --tp must be 1 .. %d, not '%s'", DG_TP_MAX, val);
                return 2;
            }
            tp = (int)t;
        } else if (!strcmp(a, "--experts")) {
            if (strcmp(val, "across") && strcmp(val, "width")) {
                eval_errorf("forward: --experts must be across or width, not '%s'", val);
                return 2;
            }
            experts = !strcmp(val, "width") ? DG_EXPERTS_WIDTH : DG_EXPERTS_ACROSS;
        }
        else if (!strcmp(a, "--commit-ids")) {
            if (n_commits == MAX_COMMITS) {
                eval_errorf("forward: at most %d --commit-ids", MAX_COMMITS);
                return 2;
            }
            commits[n_commits++] = val;
        } else {
            eval_errorf("forward: unknown option '%s'", a);
            fputs(usage, stderr);
            return 2;
        }
        i++;
    }
    if (!model || !prompt_path || !out) {
        eval_errorf("forward: --model, --prompt-ids and --out are required");
        fputs(usage, stderr);
        return 2;
    }
    if (mode && strcmp(mode, "encoder") && strcmp(mode, "decoder")) {
        eval_errorf("forward: --mode must be encoder or decoder, not '%s'", mode);
        return 2;
    }
    decoder = mode ? !strcmp(mode, "decoder") : canvas_path != NULL;
    if (decoder && !canvas_path) {
        eval_errorf("forward: decoder mode needs --canvas-ids");
        return 2;
    }
    if (!decoder && (canvas_path || sc_path)) {
        eval_errorf("forward: --canvas-ids and --sc-logits belong to decoder mode");
        return 2;
    }

    if (dg_model_load(model, &ck, &m, &err) != 0) {
        eval_errorf("%s [%s]", err.msg, dg_status_name(err.code));
        return 1;
    }
    if (eval_read_ids(prompt_path, m.cfg.vocab_size, &prompt, &n_prompt))
        goto out;
    total = (int64_t)n_prompt;
    for (int i = 0; i < n_commits; i++) {
        if (eval_read_ids(commits[i], m.cfg.vocab_size, &commit_ids[i], &n_commit[i]))
            goto out;
        total += (int64_t)n_commit[i];
    }
    if (decoder) {
        if (eval_read_ids(canvas_path, m.cfg.vocab_size, &canvas, &n_canvas))
            goto out;
        total += (int64_t)n_canvas;
    }
    if (sc_path) {
        int ndim;
        int64_t sh[DG_NPY_MAX_DIMS];
        if (dg_npy_read_f32(sc_path, NPY_FILE_MAX, &sc, &ndim, sh, &err) != 0) {
            eval_errorf("%s", err.msg);
            goto out;
        }
        if (ndim != 2 || sh[0] != (int64_t)n_canvas || sh[1] != m.cfg.vocab_size) {
            eval_errorf("%s: shape %s[%lld, %lld], but the canvas needs [%zu, %lld]", sc_path,
                        ndim == 2 ? "" : "of rank != 2, ", (long long)(ndim > 0 ? sh[0] : 0),
                        (long long)(ndim > 1 ? sh[1] : 0), n_canvas, (long long)m.cfg.vocab_size);
            goto out;
        }
    }
    {
        const int32_t *cptr[MAX_COMMITS];
        int64_t clen[MAX_COMMITS];
        struct dg_tp_forward_job job;
        const size_t last_n = n_commits ? n_commit[n_commits - 1] : n_prompt;
        memset(&job, 0, sizeof job);
        for (int i = 0; i < n_commits; i++) {
            cptr[i] = commit_ids[i];
            clen[i] = (int64_t)n_commit[i];
        }
        job.prompt = prompt;
        job.n_prompt = (int64_t)n_prompt;
        job.commits = cptr;
        job.n_commits = clen;
        job.n_commit = n_commits;
        job.canvas = decoder ? canvas : NULL;
        job.n_canvas = decoder ? (int64_t)n_canvas : 0;
        job.sc_logits = sc;
        shape[0] = decoder ? (int64_t)n_canvas : (int64_t)last_n;
        shape[1] = decoder ? m.cfg.vocab_size : m.cfg.hidden_size;
        result = malloc(sizeof(float) * (size_t)(shape[0] * shape[1]));
        if (!result) {
            eval_errorf("forward: out of memory for [%lld, %lld] outputs", (long long)shape[0],
                        (long long)shape[1]);
            goto out;
        }
        job.out = result;
        if (dg_tp_forward(&m, tp, experts, &job, &err) != 0) {
            eval_errorf("%s", err.msg);
            goto out;
        }
    }
    if (dg_npy_write_f32(out, result, 2, shape, &err)) {
        eval_errorf("%s", err.msg);
        goto out;
    }
    printf("wrote %s: %s [%lld, %lld] after %lld cached tokens%s\n", out,
           decoder ? "logits" : "hidden states", (long long)shape[0], (long long)shape[1],
           (long long)(total - shape[0]), tp > 1 ? " (tensor parallel)" : "");
    status = 0;
out:
    free(result);
    free(sc);
    free(prompt);
    free(canvas);
    for (int i = 0; i < n_commits; i++)
        free(commit_ids[i]);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return status;
}

static const char compare_usage[] =
    "usage: dgemma-eval compare OURS.npy REF.npy [--tol X]\n"
    "Compare two float32 arrays of the same shape: prints max|ours - ref|,\n"
    "max|ref|, their ratio and, for 2-D arrays, how many rows have the same\n"
    "argmax.  Exit status 0 if the ratio is at most X (default 1e-4), 1 if not.\n";

int cmd_compare(int argc, char **argv)
{
    const char *paths[2] = {NULL, NULL};
    double tol = 1e-4, max_d = 0, max_r = 0, ratio;
    float *a = NULL, *b = NULL;
    int nd[2], n_paths = 0, status = 1;
    int64_t sa[DG_NPY_MAX_DIMS], sb[DG_NPY_MAX_DIMS], n = 1, same = 0;
    struct dg_error err = {0};

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(compare_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--tol") && i + 1 < argc) {
            char *end;
            tol = strtod(argv[++i], &end);
            if (*end || !(tol >= 0)) {
                eval_errorf("compare: --tol needs a non-negative number");
                return 2;
            }
        } else if (argv[i][0] != '-' && n_paths < 2) {
            paths[n_paths++] = argv[i];
        } else {
            eval_errorf("compare: unexpected argument '%s'", argv[i]);
            fputs(compare_usage, stderr);
            return 2;
        }
    }
    if (n_paths != 2) {
        fputs(compare_usage, stderr);
        return 2;
    }
    if (dg_npy_read_f32(paths[0], NPY_FILE_MAX, &a, &nd[0], sa, &err) ||
        dg_npy_read_f32(paths[1], NPY_FILE_MAX, &b, &nd[1], sb, &err)) {
        eval_errorf("%s", err.msg);
        goto out;
    }
    if (nd[0] != nd[1] || memcmp(sa, sb, sizeof(int64_t) * (size_t)nd[0])) {
        eval_errorf("compare: the arrays have different shapes");
        goto out;
    }
    for (int i = 0; i < nd[0]; i++)
        n *= sa[i];
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!isfinite(a[i]) || !isfinite(b[i]))
            d = INFINITY;
        if (d > max_d)
            max_d = d;
        if (fabs((double)b[i]) > max_r)
            max_r = fabs((double)b[i]);
    }
    ratio = max_r > 0 ? max_d / max_r : max_d;
    printf("max|d| %.4g  max|ref| %.4g  ratio %.4g", max_d, max_r, ratio);
    if (nd[0] == 2 && sa[1] > 0) {
        for (int64_t r = 0; r < sa[0]; r++) {
            int64_t ia = 0, ib = 0;
            for (int64_t c = 1; c < sa[1]; c++) {
                if (a[r * sa[1] + c] > a[r * sa[1] + ia])
                    ia = c;
                if (b[r * sa[1] + c] > b[r * sa[1] + ib])
                    ib = c;
            }
            same += ia == ib;
        }
        printf("  argmax agree %lld/%lld", (long long)same, (long long)sa[0]);
    }
    printf("  %s (tol %g)\n", ratio <= tol ? "ok" : "EXCEEDS", tol);
    status = ratio <= tol ? 0 : 1;
out:
    free(a);
    free(b);
    return status;
}
