/* quantize.c - write a checkpoint with FP8 weights (see quantize.h). */
#include "lib/quantize.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/checkpoint.h"
#include "lib/fileio.h"
#include "lib/fp8.h"
#include "lib/grow.h"
#include "lib/model-weights.h"
#include "lib/safetensors-write.h"

enum out_kind { OUT_COPY, OUT_F8, OUT_SCALE };

struct out_entry {
    char name[160];
    enum out_kind kind;
    const struct dg_weight *w;      /* F8 / SCALE: the source matrix */
    const struct dg_st_tensor *src; /* COPY */
};

struct qctx {
    struct out_entry *e;
    size_t n, cap;
};

static int add(struct qctx *q, enum out_kind kind, const struct dg_weight *w,
               const struct dg_st_tensor *src, const char *name)
{
    struct out_entry *e = dg_grow(q->e, &q->cap, q->n + 1, sizeof *e, 256);
    if (!e)
        return -1;
    q->e = e;
    memset(&q->e[q->n], 0, sizeof q->e[q->n]);
    q->e[q->n].kind = kind;
    q->e[q->n].w = w;
    q->e[q->n].src = src;
    snprintf(q->e[q->n].name, sizeof q->e[q->n].name, "%s", name);
    q->n++;
    return 0;
}

/* A matrix to quantize: its F8 tensor and its scales. */
static int add_matrix(struct qctx *q, const struct dg_weight *w, const char *name)
{
    char sname[176];
    snprintf(sname, sizeof sname, "%s_scale", name);
    return add(q, OUT_F8, w, NULL, name) < 0 || add(q, OUT_SCALE, w, NULL, sname) < 0 ? -1 : 0;
}

/* w's rows as floats into buf (rows x cols). */
static void load_rows(const struct dg_weight *w, float *buf)
{
    const int64_t stride = w->stride ? w->stride : w->cols;
    const size_t es = dg_dtype_size(w->dtype);
    for (int64_t r = 0; r < w->rows; r++) {
        const unsigned char *row = (const unsigned char *)w->data + (size_t)(r * stride) * es;
        for (int64_t c = 0; c < w->cols; c++)
            buf[r * w->cols + c] = dg_load_f32(row, w->dtype, (size_t)c);
    }
}

static int fill(void *ud, size_t index, void *buf, size_t nbytes, struct dg_error *err)
{
    const struct out_entry *e = &((struct qctx *)ud)->e[index];
    const struct dg_weight *w = e->w;
    float *x, *scale;
    uint8_t *qb;

    if (e->kind == OUT_COPY) {
        memcpy(buf, e->src->data, nbytes);
        return 0;
    }
    x = malloc(sizeof(float) * (size_t)(w->rows * w->cols));
    scale = malloc(sizeof(float) * (size_t)w->rows);
    qb = e->kind == OUT_F8 ? buf : malloc((size_t)(w->rows * w->cols));
    if (!x || !scale || !qb) {
        free(x);
        free(scale);
        if (e->kind == OUT_SCALE)
            free(qb);
        return dg_error_set(err, DG_E_NOMEM, "out of memory quantizing '%s'", e->name);
    }
    load_rows(w, x);
    dg_fp8_quantize_rows(x, (size_t)w->rows, (size_t)w->cols, (size_t)w->cols, qb, scale);
    /* a row holding an infinity or a NaN has no scale (the loader refuses
     * one that is not finite): said here, with the row */
    for (int64_t r = 0; r < w->rows; r++)
        if (!isfinite(scale[r])) {
            free(x);
            free(scale);
            if (e->kind == OUT_SCALE)
                free(qb);
            return dg_error_set(err, DG_E_FORMAT, "'%s' row %lld holds a value that is not "
                                "finite (inf or NaN): it cannot be quantized", w->name,
                                (long long)r);
        }
    if (e->kind == OUT_SCALE) {
        memcpy(buf, scale, nbytes);
        free(qb);
    }
    free(x);
    free(scale);
    return 0;
}

/* Every tensor of the output, in the model's terms. */
static int plan(struct qctx *q, const struct dg_checkpoint *ck, const struct dg_model *m)
{
    const struct dg_model_config *c = &m->cfg;
    static const char *const proj[3] = {"gate", "up", "down"};
    char name[160];
    /* the source tensors the quantized ones replace */
    unsigned char *taken = calloc(ck->n_tensors + 1, 1);
    const struct dg_weight *mats[16];
    int rc = -1;

    if (!taken)
        return -1;
#define TAKE(w)                                                                          \
    do {                                                                                 \
        const struct dg_ckpt_tensor *t_ = dg_checkpoint_find(ck, (w)->name);             \
        if (t_)                                                                          \
            taken[t_ - ck->tensors] = 1;                                                 \
    } while (0)
    {
        const struct dg_weight *sc[3] = {&m->sc_gate, &m->sc_up, &m->sc_down};
        for (int i = 0; i < 3; i++) {
            TAKE(sc[i]);
            if (add_matrix(q, sc[i], sc[i]->name) < 0)
                goto out;
        }
    }
    for (int l = 0; l < c->num_layers; l++) {
        const struct dg_layer_weights *L = &m->layers[l];
        int n = 0;
        mats[n++] = &L->q_proj;
        mats[n++] = &L->k_proj;
        if (L->v_proj.data)
            mats[n++] = &L->v_proj;
        mats[n++] = &L->o_proj;
        mats[n++] = &L->mlp_gate;
        mats[n++] = &L->mlp_up;
        mats[n++] = &L->mlp_down;
        for (int i = 0; i < n; i++) {
            TAKE(mats[i]);
            if (add_matrix(q, mats[i], mats[i]->name) < 0)
                goto out;
        }
        for (int x = 0; x < c->num_experts; x++) {
            const struct dg_weight *ew[3] = {&L->expert_gate[x], &L->expert_up[x],
                                             &L->expert_down[x]};
            for (int p = 0; p < 3; p++) {
                TAKE(ew[p]); /* a packed bank, or the per-expert tensor */
                snprintf(name, sizeof name, "model.decoder.layers.%d.experts.%d.%s_proj.weight",
                         l, x, proj[p]);
                if (add_matrix(q, ew[p], name) < 0)
                    goto out;
            }
        }
    }
#undef TAKE
    /* the rest as it is: embedding, routers, norms, scalars (not the
     * vision tower) */
    for (size_t i = 0; i < ck->n_tensors; i++)
        if (!taken[i] && !dg_tensor_name_ignored(ck->tensors[i].name) &&
            add(q, OUT_COPY, NULL, ck->tensors[i].t, ck->tensors[i].name) < 0)
            goto out;
    rc = 0;
out:
    free(taken);
    return rc;
}

/* Copy dir/name to out/name through out/name.tmp, renamed into place once
 * whole (an old out/name, or a symlink there, replaced, not written
 * through); where dir/name does not exist, remove an out/name left from
 * another model. */
static int copy_file(const char *dir, const char *out, const char *name, struct dg_error *err)
{
    char src[4096], dst[4096], tmp[4096 + 8], buf[1 << 16];
    FILE *in, *o;
    size_t n;
    int bad = 0;
    snprintf(src, sizeof src, "%s/%s", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    if (!(in = fopen(src, "rb"))) {
        if (errno != ENOENT)
            return dg_error_set(err, DG_E_IO, "%s: %s", src, strerror(errno));
        if (unlink(dst) != 0 && errno != ENOENT)
            return dg_error_set(err, DG_E_IO, "%s: cannot remove the one of another model: %s",
                                dst, strerror(errno));
        return 0;
    }
    if (!(o = fopen(tmp, "wb"))) {
        int rc = dg_error_set(err, DG_E_IO, "%s: %s", tmp, strerror(errno));
        fclose(in);
        return rc;
    }
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, o) != n) {
            bad = 1;
            break;
        }
    bad |= ferror(in) != 0;
    fclose(in);
    if (fclose(o) != 0 || bad) {
        unlink(tmp);
        return dg_error_set(err, DG_E_IO, "%s: could not copy to %s", src, tmp);
    }
    if (rename(tmp, dst) != 0) {
        int rc = dg_error_set(err, DG_E_IO, "%s: cannot rename into place: %s", dst,
                              strerror(errno));
        unlink(tmp);
        return rc;
    }
    return 0;
}

/* Whether the folders a and b are one (by device and inode, so that a
 * second name or a symlink for the model's folder counts). */
static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int dg_quantize_dir(const char *model, const char *out, int weights_only,
                    struct dg_quantize_report *rep, struct dg_error *err)
{
    static const char *const extra[] = {"generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_model_config cfg;
    struct qctx q = {0};
    struct dg_st_out_tensor *ot = NULL;
    char *text = NULL;
    int rc;

    memset(rep, 0, sizeof *rep);
    if ((rc = dg_model_load(model, &ck, &m, err)) != 0)
        return rc;
    if (m.cfg.fp8) {
        rc = dg_error_set(err, DG_E_UNSUPPORTED, "%s is already quantized (its config.json has "
                          "an FP8 quantization_config)", model);
        goto out;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        rc = dg_error_set(err, DG_E_IO, "%s: cannot create directory: %s", out, strerror(errno));
        goto out;
    }
    if (same_dir(model, out)) {
        rc = dg_error_set(err, DG_E_INVAL, "%s: the output folder is the model's own (%s): "
                          "quantize into another folder", out, model);
        goto out;
    }
    if (plan(&q, &ck, &m) < 0 || !(ot = calloc(q.n + 1, sizeof *ot))) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory planning %s", out);
        goto out;
    }
    for (size_t i = 0; i < q.n; i++) {
        const struct out_entry *e = &q.e[i];
        ot[i].name = e->name;
        if (e->kind == OUT_COPY) {
            ot[i].dtype = e->src->dtype;
            ot[i].ndim = e->src->ndim;
            for (int d = 0; d < e->src->ndim; d++)
                ot[i].shape[d] = e->src->shape[d];
        } else {
            ot[i].dtype = e->kind == OUT_F8 ? DG_DTYPE_F8_E4M3 : DG_DTYPE_F32;
            ot[i].ndim = 2;
            ot[i].shape[0] = e->w->rows;
            ot[i].shape[1] = e->kind == OUT_F8 ? e->w->cols : 1;
            rep->fp8_tensors += e->kind == OUT_F8;
        }
    }
    rep->tensors = q.n;
    cfg = m.cfg;
    cfg.fp8 = 1;
    cfg.fp8_act_per_token = !weights_only;
    if (!(text = dg_model_config_to_json(&cfg, 0))) {
        rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
        goto out;
    }
    /* the weights first and config.json last, each renamed into place
     * whole: a folder left by a failure or a kill between them holds FP8
     * weights under a config without FP8, which the loader refuses, never
     * an FP8 config over weights that are not */
    {
        char *path = dg_path_join(out, "model.safetensors");
        if (!path) {
            rc = dg_error_set(err, DG_E_NOMEM, "out of memory");
            goto out;
        }
        rc = dg_st_write(path, ot, q.n, fill, &q, err);
        free(path);
        if (rc != 0)
            goto out;
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if ((rc = copy_file(model, out, extra[i], err)) != 0)
            goto out;
    if ((rc = dg_write_text(out, "config.json", text, err)) != 0)
        goto out;
out:
    free(text);
    free(ot);
    free(q.e);
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return rc;
}
