/*
 * Description: tensor parallelism on the CPU, T = 1 .. 4 rank threads.
 * The plan covers every vocabulary row, head, MLP column and expert
 * exactly once (KV heads where needed), with T that does not divide V, and
 * its bytes add up to the model's; on the golden models the encoder hidden
 * states and the decoder logits (without and with self-conditioning, after
 * a commit) equal the T = 1 results (the bound measured is printed); the
 * sharded soft embedding equals the dense P E product; generation with a
 * fixed seed gives the same tokens at every T and expert split, top-k /
 * top-p included; no rank of T >= 2 holds a [tokens x V] buffer or the
 * whole embedding (memory ledger; T = 1 shows the check bites), and every
 * rank's ledger is back to nothing held once the backend is gone; the
 * collectives the backend issues per pass are the ones dg_tp_comm_*
 * predicts (a denoise item that appends: an encode's and a step's); and a
 * denoise item that appends tokens (backend.h) gives, at T = 1 and T >= 2,
 * bit for bit the samples, argmax, entropies and cache length of an encode
 * of them followed by the step, in a batch with items that do not append,
 * and also for the step after; a refused append (an id outside the
 * vocabulary, no room, a bad count, a batch with one bad item) changes
 * nothing: lengths stay, and the next good call gives what a slot that was
 * never refused gives.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/checkpoint.h"
#include "lib/cpu-backend.h"
#include "lib/engine.h"
#include "lib/ids-text.h"
#include "lib/fileio.h"
#include "lib/model-synth.h"
#include "lib/npy.h"
#include "lib/tp-forward.h"
#include "tests/harness.h"

static const char *const GOLDENS[] = {"golden-a", "golden-b"};

/* DG_TEST_QUICK=1 (the sanitizer runs): fewer models and degrees */
static int quick(void)
{
    const char *q = getenv("DG_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

struct golden {
    struct dg_checkpoint ck;
    struct dg_model m;
    int32_t *prompt, *c1, *c2, *commit, *c3;
    size_t P, CL;
    float *sc2, *sc3;
};

static int read_ids(const char *g, const char *file, int64_t V, int32_t **ids, size_t *n)
{
    char path[512], *text;
    size_t len;
    struct dg_error err = {0};
    int rc;
    snprintf(path, sizeof path, "tests/golden/%s/%s", g, file);
    if ((rc = dg_file_read(path, 1 << 20, &text, &len, &err)) != 0)
        return rc;
    rc = dg_ids_parse(text, len, V, path, ids, n, &err);
    free(text);
    return rc;
}

static int open_golden(const char *g, struct golden *G)
{
    struct dg_error err = {0};
    char path[512];
    int ndim;
    int64_t shape[8];
    size_t n;
    memset(G, 0, sizeof *G);
    snprintf(path, sizeof path, "tests/golden/%s/checkpoint", g);
    CHECK_OK(dg_model_load(path, &G->ck, &G->m, &err), &err);
    CHECK(read_ids(g, "prompt.ids", G->m.cfg.vocab_size, &G->prompt, &G->P) == 0);
    CHECK(read_ids(g, "canvas1.ids", G->m.cfg.vocab_size, &G->c1, &G->CL) == 0);
    CHECK(read_ids(g, "canvas2.ids", G->m.cfg.vocab_size, &G->c2, &n) == 0 && n == G->CL);
    CHECK(read_ids(g, "commit.ids", G->m.cfg.vocab_size, &G->commit, &n) == 0 && n == G->CL);
    CHECK(read_ids(g, "canvas3.ids", G->m.cfg.vocab_size, &G->c3, &n) == 0 && n == G->CL);
    snprintf(path, sizeof path, "tests/golden/%s/sc2.npy", g);
    CHECK_OK(dg_npy_read_f32(path, 64 << 20, &G->sc2, &ndim, shape, &err), &err);
    snprintf(path, sizeof path, "tests/golden/%s/sc3.npy", g);
    CHECK_OK(dg_npy_read_f32(path, 64 << 20, &G->sc3, &ndim, shape, &err), &err);
    return 0;
}

static void close_golden(struct golden *G)
{
    free(G->prompt);
    free(G->c1);
    free(G->c2);
    free(G->commit);
    free(G->c3);
    free(G->sc2);
    free(G->sc3);
    dg_model_free(&G->m);
    dg_checkpoint_close(&G->ck);
}

/* ---- the plan ------------------------------------------------------------ */

/* Range k of T of a width of total elements split in units of `unit`
 * (the plan's): its start a multiple of the unit, its length a whole
 * number of units (the last range: up to the width's end), between
 * floor and ceil of the units over T. */
static int check_width(struct dg_tp_range x, int64_t total, int T, int k, int unit)
{
    const int64_t units = (total + unit - 1) / unit, n = (dg_tp_len(x) + unit - 1) / unit;
    CHECKF(x.begin % unit == 0 && (x.end % unit == 0 || (k == T - 1 && x.end == total)),
           "range %d [%lld, %lld) of %lld in units of %d", k, (long long)x.begin,
           (long long)x.end, (long long)total, unit);
    CHECKF(n >= units / T && n <= (units + T - 1) / T, "range %d: %lld units of %lld over %d",
           k, (long long)n, (long long)units, T);
    return 0;
}

/* The plan of c over T ranks with the widths split in units of align:
 * contiguous, balanced, every query head's KV head kept, the bytes adding
 * up; the widths' units align where they hold T of them, else 1. */
static int check_plan(const struct dg_model_config *c, int T, enum dg_expert_split split,
                      int align)
{
    struct dg_tp_plan p;
    struct dg_error err = {0};
    int64_t v = 0, h = 0, i = 0, e = 0, w = 0;
    uint64_t emb = 0;
    const int gs = c->num_heads / c->num_kv_heads, gf = c->num_heads / c->num_global_kv_heads;
    const int mlp_unit = (c->intermediate_size + align - 1) / align >= T ? align : 1;
    const int exp_unit = (c->moe_intermediate_size + align - 1) / align >= T ? align : 1;
    CHECK_OK(dg_tp_plan_build_aligned(c, T, split, 1, align, &p, &err), &err);
    CHECK(p.mlp_align == mlp_unit);
    CHECK(p.expert_align == (split == DG_EXPERTS_ACROSS ? 0 : exp_unit));
    for (int r = 0; r < T; r++) {
        const struct dg_tp_rank *k = &p.rank[r];
        struct dg_tp_bytes b;
        /* contiguous, in order, non-empty, balanced */
        CHECK(k->vocab.begin == v && k->vocab.end > v);
        CHECK(k->q_heads.begin == h && k->q_heads.end > h);
        CHECK(k->mlp.begin == i && k->mlp.end > i);
        CHECK(check_width(k->mlp, c->intermediate_size, T, r, mlp_unit) == 0);
        CHECK(dg_tp_len(k->vocab) - c->vocab_size / T <= 1 && dg_tp_len(k->vocab) >= c->vocab_size / T);
        v = k->vocab.end;
        h = k->q_heads.end;
        i = k->mlp.end;
        if (split == DG_EXPERTS_ACROSS) {
            CHECK(k->experts.begin == e && k->experts.end > e &&
                  dg_tp_len(k->expert_width) == c->moe_intermediate_size);
            e = k->experts.end;
        } else {
            CHECK(k->expert_width.begin == w && dg_tp_len(k->experts) == c->num_experts);
            CHECK(check_width(k->expert_width, c->moe_intermediate_size, T, r, exp_unit) == 0);
            w = k->expert_width.end;
        }
        /* every query head's KV head is kept */
        for (int64_t q = k->q_heads.begin; q < k->q_heads.end; q++) {
            CHECK(q / gs >= k->kv_sliding.begin && q / gs < k->kv_sliding.end);
            CHECK(q / gf >= k->kv_full.begin && q / gf < k->kv_full.end);
        }
        dg_tp_plan_bytes(c, &p, r, 2, 2, &b);
        CHECK(b.total == b.embedding + b.attention + b.mlp + b.experts + b.replicated);
        emb += b.embedding;
    }
    CHECK(v == c->vocab_size && h == c->num_heads && i == c->intermediate_size);
    CHECK(split == DG_EXPERTS_ACROSS ? e == c->num_experts : w == c->moe_intermediate_size);
    CHECK(emb == (uint64_t)c->vocab_size * (uint64_t)c->hidden_size * 2);
    return 0;
}

static int plan_invariants(void)
{
    static const char *const presets[] = {"26b", "small", "tiny"};
    struct dg_model_config c;
    struct dg_tp_plan p;
    struct dg_error err = {0};

    for (size_t k = 0; k < 3; k++) {
        CHECK(dg_model_config_preset(presets[k], &c, NULL) == 0);
        for (int T = 1; T <= 8; T++) {
            if (T > c.num_heads)
                continue;
            /* the widths by the element (the CPU's plan) and by 32 (the CUDA backend's) */
            for (int a = 1; a <= 32; a += 31) {
                CHECKF(check_plan(&c, T, DG_EXPERTS_ACROSS, a) == 0, "%s T %d across, align %d",
                       presets[k], T, a);
                CHECKF(check_plan(&c, T, DG_EXPERTS_WIDTH, a) == 0, "%s T %d width, align %d",
                       presets[k], T, a);
            }
        }
    }
    /* 26B at T = 4: the 2 KV heads of the full layers are replicated */
    CHECK(dg_model_config_preset("26b", &c, NULL) == 0);
    CHECK_OK(dg_tp_plan_build(&c, 4, DG_EXPERTS_ACROSS, 1, &p, &err), &err);
    CHECK(p.rank[0].kv_full.begin == 0 && p.rank[1].kv_full.begin == 0 &&
          p.rank[2].kv_full.begin == 1 && p.rank[3].kv_full.begin == 1 &&
          dg_tp_len(p.rank[3].kv_full) == 1);
    /* alignment: slices of 64 rows but the last */
    CHECK_OK(dg_tp_plan_build(&c, 8, DG_EXPERTS_ACROSS, 64, &p, &err), &err);
    for (int r = 0; r < 7; r++)
        CHECK(p.rank[r].vocab.end % 64 == 0);
    CHECK(p.rank[7].vocab.end == c.vocab_size);
    /* the widths in units of 32 (the CUDA backend's): 26B's dense MLP of
     * 2,112 at T = 4 in 16, 17, 16 and 17 of them, not 528 each (a gate/up
     * of 1,056 rows, which the FP8 GEMM cannot take) */
    CHECK_OK(dg_tp_plan_build_aligned(&c, 4, DG_EXPERTS_WIDTH, 1, 32, &p, &err), &err);
    CHECK(dg_tp_len(p.rank[0].mlp) == 512 && dg_tp_len(p.rank[1].mlp) == 544 &&
          dg_tp_len(p.rank[2].mlp) == 512 && dg_tp_len(p.rank[3].mlp) == 544);
    CHECK(dg_tp_len(p.rank[0].expert_width) == 160 && dg_tp_len(p.rank[1].expert_width) == 192);
    CHECK_FAILS(dg_tp_plan_build_aligned(&c, 4, DG_EXPERTS_WIDTH, 1, 0, &p, &err), &err,
                DG_E_INVAL, "units of 0");
    /* the bytes of T = 1 are the model's */
    for (size_t g = 0; g < 2; g++) {
        struct golden G;
        struct dg_tp_bytes b;
        CHECK(open_golden(GOLDENS[g], &G) == 0);
        CHECK_OK(dg_tp_plan_build(&G.m.cfg, 1, DG_EXPERTS_ACROSS, 1, &p, &err), &err);
        dg_tp_plan_bytes(&G.m.cfg, &p, 0, 4, 4, &b);
        CHECKF(b.total == G.m.stats.params_total * 4, "%s: plan %llu bytes, model %llu params",
               GOLDENS[g], (unsigned long long)b.total,
               (unsigned long long)G.m.stats.params_total);
        /* T = 3 does not divide V = 301 or 263 */
        CHECK(check_plan(&G.m.cfg, 3, DG_EXPERTS_ACROSS, 1) == 0);
        CHECK(check_plan(&G.m.cfg, 3, DG_EXPERTS_WIDTH, 32) == 0);
        close_golden(&G);
    }
    /* too many ranks */
    CHECK_FAILS(dg_tp_plan_build(&c, 17, DG_EXPERTS_ACROSS, 1, &p, &err), &err, DG_E_INVAL,
                "query heads");
    CHECK(dg_model_config_preset("small", &c, NULL) == 0);
    CHECK_FAILS(dg_tp_plan_build(&c, 5, DG_EXPERTS_ACROSS, 1, &p, &err), &err, DG_E_INVAL,
                "query heads");
    return 0;
}

/* ---- logits and hidden states against T = 1 ------------------------------- */

static double worst_ratio;

static int compare_runs(const char *what, const float *a, const float *ref, int64_t n)
{
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            md = INFINITY;
        if (fabs((double)a[i] - ref[i]) > md)
            md = fabs((double)a[i] - ref[i]);
        if (fabs(ref[i]) > mr)
            mr = fabs(ref[i]);
    }
    if (md / mr > worst_ratio)
        worst_ratio = md / mr;
    CHECKF(md / mr <= 1e-6, "%s: max|d| %g, max|ref| %g", what, md, mr);
    return 0;
}

/* run the four passes of the ladder at T; outputs [4] arrays */
static int ladder(struct golden *G, int T, enum dg_expert_split split, float **out)
{
    const int64_t V = G->m.cfg.vocab_size, H = G->m.cfg.hidden_size, CL = (int64_t)G->CL;
    struct dg_error err = {0};
    const int32_t *commits[1] = {G->commit};
    const int64_t ncommit[1] = {CL};
    struct dg_tp_forward_job j;

    out[0] = malloc(sizeof(float) * G->P * (size_t)H);
    for (int k = 1; k < 4; k++)
        out[k] = malloc(sizeof(float) * (size_t)(CL * V));
    memset(&j, 0, sizeof j);
    j.prompt = G->prompt;
    j.n_prompt = (int64_t)G->P;
    j.out = out[0];
    CHECK_OK(dg_tp_forward(&G->m, T, split, &j, &err), &err);
    j.canvas = G->c1;
    j.n_canvas = CL;
    j.out = out[1];
    CHECK_OK(dg_tp_forward(&G->m, T, split, &j, &err), &err);
    j.canvas = G->c2;
    j.sc_logits = G->sc2;
    j.out = out[2];
    CHECK_OK(dg_tp_forward(&G->m, T, split, &j, &err), &err);
    j.canvas = G->c3;
    j.sc_logits = G->sc3;
    j.commits = commits;
    j.n_commits = ncommit;
    j.n_commit = 1;
    j.out = out[3];
    CHECK_OK(dg_tp_forward(&G->m, T, split, &j, &err), &err);
    return 0;
}

static int logits_match(void)
{
    for (size_t g = 0; g < (quick() ? 1u : 2u); g++) {
        struct golden G;
        float *ref[4], *got[4];
        int64_t n[4];
        CHECK(open_golden(GOLDENS[g], &G) == 0);
        n[0] = (int64_t)G.P * G.m.cfg.hidden_size;
        n[1] = n[2] = n[3] = (int64_t)G.CL * G.m.cfg.vocab_size;
        CHECK(ladder(&G, 1, DG_EXPERTS_ACROSS, ref) == 0);
        for (int T = 2; T <= (quick() ? 3 : 4); T++)
            for (int split = 0; split < 2; split++) {
                static const char *const names[4] = {"encoder", "decoder", "decoder+SC",
                                                     "after commit"};
                CHECK(ladder(&G, T, (enum dg_expert_split)split, got) == 0);
                for (int k = 0; k < 4; k++) {
                    char what[128];
                    snprintf(what, sizeof what, "%s T %d %s: %s", GOLDENS[g], T,
                             split ? "width" : "across", names[k]);
                    CHECK(compare_runs(what, got[k], ref[k], n[k]) == 0);
                    free(got[k]);
                }
            }
        for (int k = 0; k < 4; k++)
            free(ref[k]);
        close_golden(&G);
    }
    printf("# T = 2, 3, 4 (experts across and along the width) against T = 1: worst "
           "max|d| / max|ref| %.3g\n", worst_ratio);
    return 0;
}

/* ---- the sharded soft embedding -------------------------------------------- */

static int soft_embedding(void)
{
    struct golden G;
    struct dg_error err = {0};
    CHECK(open_golden("golden-a", &G) == 0);
    {
        const struct dg_model *m = &G.m;
        const int64_t V = m->cfg.vocab_size, H = m->cfg.hidden_size, CL = 5;
        float *P = malloc(sizeof(float) * (size_t)(CL * V));
        double *dense = calloc((size_t)(CL * H), sizeof(double));
        uint64_t s = 12345;
        for (int64_t t = 0; t < CL; t++) {
            double z = 0;
            for (int64_t v = 0; v < V; v++) {
                test_xorshift(&s);
                P[t * V + v] = (float)((s >> 40) % 1000) + (t == 2 && v % 3 ? 0.0f : 1.0f);
                z += P[t * V + v];
            }
            for (int64_t v = 0; v < V; v++)
                P[t * V + v] = (float)(P[t * V + v] / z);
        }
        /* dense: P E, straight from the checkpoint */
        for (int64_t t = 0; t < CL; t++)
            for (int64_t v = 0; v < V; v++)
                for (int64_t i = 0; i < H; i++)
                    dense[t * H + i] += (double)P[t * V + v] *
                                        dg_load_f32(m->embed.data, m->embed.dtype,
                                                    (size_t)(v * H + i));
        for (int T = 1; T <= 4; T++) {
            struct dg_tp_plan plan;
            struct dg_coll_cpu_group *grp = NULL;
            double *sum = calloc((size_t)(CL * H), sizeof(double));
            double *part = malloc(sizeof(double) * (size_t)(CL * H));
            double md = 0, mr = 0;
            CHECK_OK(dg_tp_plan_build(&m->cfg, T, DG_EXPERTS_ACROSS, 1, &plan, &err), &err);
            if (T > 1)
                CHECK_OK(dg_coll_cpu_group_create(T, &grp, &err), &err);
            for (int r = 0; r < T; r++) {
                struct dg_cpu_model cm;
                /* this rank's probabilities: its columns of P */
                const int64_t v0 = plan.rank[r].vocab.begin, nv = dg_tp_len(plan.rank[r].vocab);
                float *Pr = malloc(sizeof(float) * (size_t)(CL * nv));
                for (int64_t t = 0; t < CL; t++)
                    memcpy(Pr + t * nv, P + t * V + v0, sizeof(float) * (size_t)nv);
                CHECK_OK(dg_cpu_model_init_rank(&cm, m, &plan, r,
                                                grp ? dg_coll_cpu_rank(grp, r) : NULL, NULL, &err),
                         &err);
                CHECK(cm.v0 == v0 && cm.nv == nv);
                CHECK_OK(dg_cpu_soft_embed(&cm, Pr, CL, part, &err), &err);
                for (int64_t i = 0; i < CL * H; i++)
                    sum[i] += part[i];
                dg_cpu_model_free(&cm);
                free(Pr);
            }
            for (int64_t i = 0; i < CL * H; i++) {
                if (fabs(sum[i] - dense[i]) > md)
                    md = fabs(sum[i] - dense[i]);
                if (fabs(dense[i]) > mr)
                    mr = fabs(dense[i]);
            }
            printf("# soft embedding, T %d: max|sharded - dense| %.3g (max %.3g)\n", T, md, mr);
            CHECK(md <= 1e-12 * mr);
            free(sum);
            free(part);
            dg_coll_cpu_group_free(grp);
        }
        free(P);
        free(dense);
    }
    close_golden(&G);
    return 0;
}

/* ---- generation ------------------------------------------------------------ */

#define NREQ 3
#define MAXTOK 96

struct gen_out {
    int32_t ids[NREQ][MAXTOK];
    int n[NREQ];
    int finish[NREQ];
    int64_t steps[NREQ];
};

struct gen_sink {
    struct gen_out *o;
    uint64_t first_id;
};

static void gen_event(void *ctx, const struct dg_gen_event *ev)
{
    struct gen_sink *s = ctx;
    const int k = (int)(ev->id - s->first_id);
    if (k < 0 || k >= NREQ)
        return;
    if (ev->kind == DG_EVENT_CANVAS) {
        for (int i = 0; i < ev->n_ids && s->o->n[k] < MAXTOK; i++)
            s->o->ids[k][s->o->n[k]++] = ev->ids[i];
    } else {
        s->o->finish[k] = ev->finish;
        s->o->steps[k] = ev->stats->decoder_steps;
    }
}

static int generate(const struct dg_model *m, int T, enum dg_expert_split split,
                    struct dg_mem_ledger *ledgers, struct gen_out *o)
{
    struct dg_cpu_backend_options bo = {T, split, NREQ, ledgers, 0, 0};
    struct dg_backend *b;
    struct dg_engine *e;
    struct dg_engine_config ec;
    struct dg_error err = {0};
    struct gen_sink sink = {o, 0};
    int32_t prompt[12];

    memset(o, 0, sizeof *o);
    CHECK_OK(dg_cpu_backend_create(m, &bo, &b, &err), &err);
    dg_engine_config_default(&ec, &m->cfg);
    ec.max_batch = NREQ;
    ec.prefill_chunk = 7;
    CHECK_OK(dg_engine_create(b, &ec, NULL, gen_event, &sink, &e, &err), &err);
    for (int k = 0; k < NREQ; k++) {
        struct dg_gen_settings s;
        uint64_t id;
        for (int i = 0; i < 12; i++)
            prompt[i] = (int32_t)((i * 17 + k * 5 + 3) % m->cfg.vocab_size);
        {
            struct dg_generation_config gc;
            dg_generation_config_defaults(&gc);
            dg_gen_settings_defaults(&s, &m->cfg, &gc);
        }
        s.seed = 1000 + (uint64_t)k;
        s.seed_set = 1;
        s.max_tokens = 40 + 20 * k;
        s.max_denoising_steps = 12;
        s.n_stop_ids = 0;
        if (k == 1)
            s.top_k = 20;
        if (k == 2) {
            s.top_p = 0.8;
            s.top_k = 50;
            s.entropy_bound = 1.5;
        }
        CHECK_OK(dg_engine_submit(e, prompt, 12, &s, NULL, &id, &err), &err);
        if (k == 0)
            sink.first_id = id;
    }
    while (dg_engine_step(e) > 0)
        ;
    dg_engine_destroy(e);
    b->ops->destroy(b);
    return 0;
}

static int same_tokens(void)
{
    for (size_t g = quick() ? 1 : 0; g < 2; g++) {
        struct golden G;
        static struct gen_out ref, got;
        CHECK(open_golden(GOLDENS[g], &G) == 0);
        CHECK(generate(&G.m, 1, DG_EXPERTS_ACROSS, NULL, &ref) == 0);
        for (int k = 0; k < NREQ; k++)
            CHECK(ref.n[k] == 40 + 20 * k && ref.finish[k] == DG_FINISH_LENGTH);
        for (int T = 2; T <= (quick() ? 3 : 4); T++)
            for (int split = 0; split < (quick() ? 1 : 2); split++) {
                CHECK(generate(&G.m, T, (enum dg_expert_split)split, NULL, &got) == 0);
                for (int k = 0; k < NREQ; k++)
                    CHECKF(got.n[k] == ref.n[k] && got.steps[k] == ref.steps[k] &&
                               !memcmp(got.ids[k], ref.ids[k], sizeof(int32_t) * (size_t)ref.n[k]),
                           "%s T %d %s: request %d differs", GOLDENS[g], T,
                           split ? "width" : "across", k);
            }
        printf("# %s: 3 requests (one with top-k, one with top-k + top-p), %lld + %lld + %lld "
               "steps: the same tokens at T = 1 .. 4, both expert splits\n", GOLDENS[g],
               (long long)ref.steps[0], (long long)ref.steps[1], (long long)ref.steps[2]);
        close_golden(&G);
    }
    return 0;
}

/* ---- memory per rank ----------------------------------------------------------- */

static int memory_per_rank(void)
{
    /* a model whose vocabulary dwarfs everything else: 4099 ids, hidden 32 */
    struct dg_model_config c;
    struct dg_synth_options so;
    struct dg_synth_plan sp;
    struct dg_checkpoint ck;
    struct dg_model m;
    struct dg_error err = {0};
    const char *dir = test_path("wide-vocab");

    dg_model_config_preset("tiny", &c, NULL);
    c.vocab_size = 4099;
    dg_synth_options_default(&so);
    CHECK_OK(dg_synth_plan_build(&c, &so, &sp, &err), &err);
    CHECK_OK(dg_synth_write(dir, &c, NULL, &sp, &so, &err), &err);
    dg_synth_plan_free(&sp);
    CHECK_OK(dg_model_load(dir, &ck, &m, &err), &err);
    {
        /* the batch: NREQ canvases of CL tokens */
        const uint64_t tokens = NREQ * (uint64_t)m.cfg.canvas_length, V = (uint64_t)m.cfg.vocab_size;
        const uint64_t full_rows = tokens * V * 4, full_embedding = V * (uint64_t)m.cfg.hidden_size * 4;
        for (int T = 1; T <= (quick() ? 2 : 3); T++) {
            struct dg_mem_ledger led[4];
            static struct gen_out o;
            memset(led, 0, sizeof led);
            CHECK(generate(&m, T, DG_EXPERTS_ACROSS, led, &o) == 0);
            for (int r = 0; r < T; r++) {
                printf("# T %d rank %d: largest buffer %llu bytes, peak %llu, largest weight "
                       "view %llu, weights %llu (a [tokens x V] fp32 buffer: %llu; the embedding: "
                       "%llu)\n", T, r, (unsigned long long)led[r].largest,
                       (unsigned long long)led[r].peak, (unsigned long long)led[r].largest_weight,
                       (unsigned long long)led[r].weights, (unsigned long long)full_rows,
                       (unsigned long long)full_embedding);
                /* everything the rank held is given back by the end */
                CHECKF(led[r].live == 0, "T %d rank %d: %llu bytes still held", T, r,
                       (unsigned long long)led[r].live);
                if (T == 1) {
                    /* the check bites: one rank holds both */
                    CHECK(led[r].largest >= full_rows && led[r].largest_weight >= full_embedding);
                } else {
                    CHECK(led[r].largest < full_rows);
                    CHECK(led[r].largest_weight < full_embedding);
                }
            }
        }
    }
    dg_model_free(&m);
    dg_checkpoint_close(&ck);
    return 0;
}

/* ---- communication counted ------------------------------------------------------- */

static int delta_matches(const struct dg_backend *b, int T, const struct dg_coll_stats *before,
                         const struct dg_tp_comm *want, const char *what)
{
    for (int r = 0; r < T; r++) {
        const struct dg_coll_stats now = dg_cpu_backend_coll_stats(b, r);
        const uint64_t ar = now.calls[DG_COLL_ALL_REDUCE] - before[r].calls[DG_COLL_ALL_REDUCE];
        const uint64_t arb = now.bytes[DG_COLL_ALL_REDUCE] - before[r].bytes[DG_COLL_ALL_REDUCE];
        const uint64_t ag = now.calls[DG_COLL_ALL_GATHER] - before[r].calls[DG_COLL_ALL_GATHER];
        const uint64_t agb = now.bytes[DG_COLL_ALL_GATHER] - before[r].bytes[DG_COLL_ALL_GATHER];
        CHECKF(ar == want->all_reduces && arb == want->all_reduce_bytes &&
                   ag == want->all_gathers && agb == want->all_gather_bytes,
               "%s T %d rank %d: counted %llu all-reduces (%llu B), %llu all-gathers (%llu B); "
               "predicted %llu (%llu B), %llu (%llu B)", what, T, r, (unsigned long long)ar,
               (unsigned long long)arb, (unsigned long long)ag, (unsigned long long)agb,
               (unsigned long long)want->all_reduces, (unsigned long long)want->all_reduce_bytes,
               (unsigned long long)want->all_gathers, (unsigned long long)want->all_gather_bytes);
    }
    return 0;
}

static int comm_counted(void)
{
    struct golden G;
    CHECK(open_golden("golden-b", &G) == 0);
    for (int T = 2; T <= (quick() ? 2 : 4); T++) {
        struct dg_cpu_backend_options bo = {T, DG_EXPERTS_ACROSS, 1, NULL, 0, 0};
        struct dg_backend *b;
        struct dg_error err = {0};
        struct dg_coll_stats before[4];
        struct dg_tp_comm want;
        const struct dg_model_config *c = &G.m.cfg;
        const int CL = (int)G.CL;
        int32_t sample[64], argmax[64];
        float ent[64];
        struct dg_encode_item enc = {0, G.prompt, (int64_t)G.P};
        struct dg_denoise_item it;
        int which = 0;

        CHECK_OK(dg_cpu_backend_create(&G.m, &bo, &b, &err), &err);
        CHECK_OK(b->ops->slot_open(b, 0, 200, CL, &err), &err);
#define SNAP() for (int r = 0; r < T; r++) before[r] = dg_cpu_backend_coll_stats(b, r)
        SNAP();
        CHECK_OK(b->ops->encode(b, &enc, 1, &err), &err);
        dg_tp_comm_encode(c, dg_cpu_backend_plan(b), (int64_t)G.P, 8, &want);
        CHECK(delta_matches(b, T, before, &want, "prefill") == 0);
        for (int variant = 0; variant < 4; variant++) {
            memset(&it, 0, sizeof it);
            it.slot = 0;
            it.canvas = G.c1;
            it.cl = CL;
            it.self_cond = variant > 0;
            it.temperature = 0.7f;
            it.top_k = (variant & 1) ? 10 : 0;
            it.top_p = variant >= 2 ? 0.9f : 1.0f;
            it.seed = 5;
            it.step = (uint32_t)variant;
            it.sample = sample;
            it.argmax = argmax;
            it.entropy = ent;
            SNAP();
            CHECK_OK(b->ops->denoise(b, &it, 1, &err), &err);
            dg_tp_comm_denoise(c, dg_cpu_backend_plan(b), CL, it.self_cond,
                               ((variant & 1) ? 1 : 0) | (variant >= 2 ? 2 : 0), 8, &want);
            CHECK(delta_matches(b, T, before, &want, "denoise") == 0);
            /* conditioning needs no collective: the partials wait for the next step */
            SNAP();
            CHECK_OK(b->ops->condition(b, &which, 1, &err), &err);
            memset(&want, 0, sizeof want);
            CHECK(delta_matches(b, T, before, &want, "condition") == 0);
        }
        {
            /* a step that first appends a commit: an encode's collectives, then a step's */
            struct dg_tp_comm step;
            it.append = G.commit;
            it.n_append = CL;
            it.step = 4;
            SNAP();
            CHECK_OK(b->ops->denoise(b, &it, 1, &err), &err);
            dg_tp_comm_encode(c, dg_cpu_backend_plan(b), CL, 8, &want);
            dg_tp_comm_denoise(c, dg_cpu_backend_plan(b), CL, it.self_cond, 3, 8, &step);
            want.all_reduces += step.all_reduces;
            want.all_reduce_bytes += step.all_reduce_bytes;
            want.all_gathers += step.all_gathers;
            want.all_gather_bytes += step.all_gather_bytes;
            CHECK(delta_matches(b, T, before, &want, "denoise with an append") == 0);
            CHECK(b->ops->slot_length(b, 0) == (int64_t)G.P + CL);
        }
#undef SNAP
        b->ops->destroy(b);
    }
    close_golden(&G);
    return 0;
}

/* ---- a denoise item that appends ------------------------------------------ */

struct step_out {
    int32_t sample[64], argmax[64];
    float entropy[64];
};

static void den_item(struct dg_denoise_item *it, int slot, const int32_t *canvas, int cl,
                     int self_cond, uint32_t step, struct step_out *o)
{
    memset(it, 0, sizeof *it);
    it->slot = slot;
    it->canvas = canvas;
    it->cl = cl;
    it->self_cond = self_cond;
    it->temperature = 0.8f;
    it->top_k = 10;
    it->top_p = 0.95f;
    it->seed = 77;
    it->canvas_index = 1;
    it->step = step;
    it->sample = o->sample;
    it->argmax = o->argmax;
    it->entropy = o->entropy;
}

static int same_step(const struct step_out *a, const struct step_out *b, int cl)
{
    return !memcmp(a->sample, b->sample, sizeof(int32_t) * (size_t)cl) &&
           !memcmp(a->argmax, b->argmax, sizeof(int32_t) * (size_t)cl) &&
           !memcmp(a->entropy, b->entropy, sizeof(float) * (size_t)cl);
}

/* Slots 0, 1, 2 alike (prompt, a first step, conditioned), each able to
 * hold the prompt and two canvases exactly.  Slot 0 then encodes the
 * commit; slots 1 and 2 are refused appends; then one batch steps slot 0
 * plainly and slots 1 and 2 with the commit appended, and one more step
 * after that: the three agree bit for bit at each. */
static int append_at(struct golden *G, int T)
{
    struct dg_cpu_backend_options bo = {T, DG_EXPERTS_ACROSS, 3, NULL, 0, 0};
    const int CL = (int)G->CL;
    const int64_t P = (int64_t)G->P, V = G->m.cfg.vocab_size;
    const int all[3] = {0, 1, 2};
    struct dg_backend *b;
    struct dg_error err = {0};
    struct dg_encode_item enc[3];
    struct dg_denoise_item it[3];
    static struct step_out out[3];
    int32_t bad_id[64], longer[65];

    CHECK(CL <= 64);
    CHECK_OK(dg_cpu_backend_create(&G->m, &bo, &b, &err), &err);
    for (int s = 0; s < 3; s++) {
        CHECK_OK(b->ops->slot_open(b, s, P + 2 * CL, CL, &err), &err);
        enc[s] = (struct dg_encode_item){s, G->prompt, P};
        den_item(&it[s], s, G->c1, CL, 0, 0, &out[s]);
    }
    CHECK_OK(b->ops->encode(b, enc, 3, &err), &err);
    CHECK_OK(b->ops->denoise(b, it, 3, &err), &err);
    CHECK_OK(b->ops->condition(b, all, 3, &err), &err);
    enc[0] = (struct dg_encode_item){0, G->commit, CL};
    CHECK_OK(b->ops->encode(b, enc, 1, &err), &err);
    CHECK(b->ops->slot_length(b, 0) == P + CL);

    /* refusals: nothing runs, nothing changes */
    memcpy(bad_id, G->commit, sizeof(int32_t) * (size_t)CL);
    bad_id[CL / 2] = (int32_t)V;
    memcpy(longer, G->commit, sizeof(int32_t) * (size_t)CL);
    longer[CL] = G->commit[0];
    den_item(&it[0], 2, G->c3, CL, 1, 1, &out[2]);
    it[0].append = bad_id;
    it[0].n_append = CL;
    CHECK_FAILS(b->ops->denoise(b, it, 1, &err), &err, DG_E_INVAL, "denoise append (slot 2)");
    it[0].append = longer;
    it[0].n_append = CL + 1;  /* one past the slot's positions */
    CHECK_FAILS(b->ops->denoise(b, it, 1, &err), &err, DG_E_RANGE, "do not fit");
    it[0].n_append = -1;
    CHECK_FAILS(b->ops->denoise(b, it, 1, &err), &err, DG_E_INVAL, "append of -1");
    it[0].append = NULL;
    it[0].n_append = CL;
    CHECK_FAILS(b->ops->denoise(b, it, 1, &err), &err, DG_E_INVAL, "without ids");
    /* a good item batched with a bad one: the whole batch refused */
    den_item(&it[0], 1, G->c3, CL, 1, 1, &out[1]);
    it[0].append = G->commit;
    it[0].n_append = CL;
    den_item(&it[1], 2, G->c3, CL, 1, 1, &out[2]);
    it[1].append = bad_id;
    it[1].n_append = CL;
    CHECK_FAILS(b->ops->denoise(b, it, 2, &err), &err, DG_E_INVAL, "outside");
    /* an append on a slot another item of the batch steps */
    it[1] = it[0];
    it[1].append = NULL;
    it[1].n_append = 0;
    CHECK_FAILS(b->ops->denoise(b, it, 2, &err), &err, DG_E_INVAL, "twice");
    CHECK(b->ops->slot_length(b, 1) == P && b->ops->slot_length(b, 2) == P);

    /* the step: slot 0 plain (commit encoded), slots 1 and 2 appending */
    for (int s = 0; s < 3; s++) {
        den_item(&it[s], s, G->c3, CL, 1, 1, &out[s]);
        if (s > 0) {
            it[s].append = G->commit;
            it[s].n_append = CL;
        }
    }
    CHECK_OK(b->ops->denoise(b, it, 3, &err), &err);
    for (int s = 0; s < 3; s++)
        CHECKF(b->ops->slot_length(b, s) == P + CL, "T %d slot %d: %lld tokens", T, s,
               (long long)b->ops->slot_length(b, s));
    CHECKF(same_step(&out[1], &out[0], CL) && same_step(&out[2], &out[0], CL),
           "T %d: a step with the commit appended differs from encode then step", T);
    /* and the step after it, from the caches and conditioning so made */
    CHECK_OK(b->ops->condition(b, all, 3, &err), &err);
    for (int s = 0; s < 3; s++)
        den_item(&it[s], s, G->c2, CL, 1, 2, &out[s]);
    CHECK_OK(b->ops->denoise(b, it, 3, &err), &err);
    CHECKF(same_step(&out[1], &out[0], CL) && same_step(&out[2], &out[0], CL),
           "T %d: the step after an append differs", T);
    CHECK(b->ops->slot_length(b, 0) == P + CL);
    b->ops->destroy(b);
    return 0;
}

static int denoise_append(void)
{
    for (size_t g = 0; g < (quick() ? 1u : 2u); g++) {
        struct golden G;
        CHECK(open_golden(GOLDENS[g], &G) == 0);
        for (int T = 1; T <= (quick() ? 2 : 3); T++)
            CHECKF(append_at(&G, T) == 0, "%s T %d", GOLDENS[g], T);
        close_golden(&G);
    }
    return 0;
}

int main(void)
{
    TEST_CASE(plan_invariants);
    TEST_CASE(logits_match);
    TEST_CASE(soft_embedding);
    TEST_CASE(same_tokens);
    TEST_CASE(memory_per_rank);
    TEST_CASE(comm_counted);
    TEST_CASE(denoise_append);
    return test_finish();
}
