/*
 * bench-linear - the forward pass's cuBLAS projections alone, at the
 * 26B-A4B's shapes (tensor parallelism 1), against what cuBLASLt offers
 * for the same products: does some algorithm beat cublasGemmEx's default
 * by much, and which?
 *
 * usage: bench-linear [--reps N] [--all] [--search] [--no-flush] [T...]
 *   (defaults: 50 reps; T = 256 1024)
 *
 * --search looks past the heuristic: every algorithm id cuBLASLt has for
 * the types, each tile it lists, split-K 1-8 with each reduction it
 * takes and the cluster shapes up to 4 x 2, as cublasLtMatmulAlgoCheck
 * accepts them, each timed once; the fastest 12 then with their stages,
 * CTA swizzle and custom options varied; the best 12 of all timed with
 * every repeat and printed beside the default (search_shape).  It adds
 * the FP8 projections (E4M3 x and W, fp32 sums: fp8-lt.cu's unit mode),
 * against cuBLASLt's first heuristic algorithm (fp8-lt.cu's choice).
 *
 * Every product is row-major y[T, N] = alpha x[T, K] . W^T + beta y, W
 * [N, K] bf16 (nn.Linear), fp32 accumulation, as kernels/linear.cu runs it
 * in column-major terms: A = W (op T, lda K), B = x (op N, ldb K), C = D =
 * y (ldc N), m = N, n = T, k = K.  The shapes, as kernels/cuda-forward.c
 * and kernels/cuda-backend.c call dg_blas_gemm_e (checked there):
 *
 *   qkv sliding   N 8192 (q 4096 | k 2048 | v 2048)  K 2816  y bf16
 *   qkv full      N 9216 (q 8192 | k 1024; V is K)   K 2816  y bf16
 *                 (one GEMM when the three matrices are adjacent, as
 *                 cuda-model.c lays them out)
 *   o sliding     N 2816  K 4096  y bf16
 *   o full        N 2816  K 8192  y bf16
 *   dense gate|up N 4224  K 2816  y bf16  (the self-conditioning MLP's
 *                 gate|up is the same product: not repeated)
 *   dense down    N 2816  K 2112  y fp32
 *   sc down       N 2816  K 2112  y bf16, beta 1 (the self-conditioning
 *                 MLP's down projection adds into x: the one beta-1 call)
 *   router        N 128   K 2816  y fp32, alpha 1/sqrt(2816)
 *   lm head       N 262144 K 2816 y fp32                  (T <= 256 only)
 *   sc P.E        N 2816  K 262144 y bf16, alpha 53 = bf16(sqrt(2816)):
 *                 the sampler's probabilities times the embedding, W read
 *                 as [K, N] (op N, lda N; cuda-backend.c, one canvas of
 *                 256 rows at a time)                     (T <= 256 only)
 *
 * For each T and shape: (a) dg_blas_gemm_e exactly as the forward calls
 * it (cublasGemmEx, CUBLAS_GEMM_DEFAULT, the handle's 32 MiB workspace),
 * and (b) every algorithm cublasLtMatmulAlgoGetHeuristic returns (up to
 * 32, CUBLAS_COMPUTE_32F, fp32 scale, a 32 MiB workspace) on the same
 * operands.  Each runs once untimed, then REPS times, each timed alone on
 * the device (kernels/prof.h events around that one call); the table
 * gives medians.  Before every call a 256 MiB memset evicts the 50 MB L2
 * (in the forward a projection's weights arrive cold, other layers'
 * having passed through since) and keeps the GPU busy while the host
 * queues the call, so the time excludes the host's launch latency as a
 * CUDA graph would; --no-flush drops it (warm L2, and the launch latency
 * then may show in the smallest products).  An algorithm whose
 * cublasLtMatmul returns an error is skipped and listed under the table.
 *
 * floor = max(bytes / copy bandwidth, 2 T N K / bf16 GEMM rate), the two
 * ceilings measured first in the same run (kernels/ceilings.h); bytes =
 * W + x + y written (+ y read when beta is 1), each once.  The best
 * algorithm's output is compared with the default's (from the same y
 * before the call): max |difference| / max |default|, flagged DIFFERS
 * above 1e-2.  --all lists every algorithm's time under each table.
 *
 * cuBLASLt is called through its C API (the Makefile gives this file the
 * CUDA include directory).
 *
 * Not a test: it prints tables and asserts nothing about speed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench-board.h"
#include "bench/gpu/bench-util.h"
#include "kernels/ceilings.h"
#include "kernels/devmem.h"
#include "kernels/fp8-gemm.h"
#include "kernels/ops.h"
#include "kernels/prof.h"

/* (CUDA 13.0's cublasLt.h declares one function without a prototype) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

/* the layouts the declarations above assume (CUDA 13.0, x86-64) */
_Static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "cublasLtMatmulAlgo_t");
_Static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == 96, "cublasLtMatmulHeuristicResult_t");

#define HID 2816
#define VOCAB 262144
#define MAX_REPS 1000
#define MAX_T 16384
#define MAX_ALGOS 32
#define LT_WORKSPACE ((size_t)32 << 20)
#define FLUSH_BYTES ((size_t)256 << 20)
#define DIFF_FLAG 1e-2

struct shape {
    const char *name;
    int64_t N, K;
    int y_f32;          /* y fp32 (else bf16) */
    int w_kn;           /* W stored [K, N] (op N), else [N, K] (op T) */
    float alpha, beta;
    int64_t max_T;      /* run only at T <= this (0: any) */
    int fp8;            /* --search only: x and W E4M3, y the fp32 sums (fp8-lt.cu's unit mode) */
};

static const struct shape shapes[] = {
    {"qkv sliding", 8192, HID, 0, 0, 1.0f, 0.0f, 0, 0},
    {"qkv full", 9216, HID, 0, 0, 1.0f, 0.0f, 0, 0},
    {"o sliding", HID, 4096, 0, 0, 1.0f, 0.0f, 0, 0},
    {"o full", HID, 8192, 0, 0, 1.0f, 0.0f, 0, 0},
    {"dense gate|up", 4224, HID, 0, 0, 1.0f, 0.0f, 0, 0},
    {"dense down", HID, 2112, 1, 0, 1.0f, 0.0f, 0, 0},
    {"sc down (beta 1)", HID, 2112, 0, 0, 1.0f, 1.0f, 0, 0},
    {"router", 128, HID, 1, 0, 0.018844524f /* 1/sqrt(2816) */, 0.0f, 0, 0},
    {"lm head", VOCAB, HID, 1, 0, 1.0f, 0.0f, 256, 0},
    {"sc P.E", HID, VOCAB, 0, 1, 53.0f, 0.0f, 256, 0},
    {"FP8 qkv sliding", 8192, HID, 1, 0, 1.0f, 0.0f, 0, 1},
    {"FP8 qkv full", 9216, HID, 1, 0, 1.0f, 0.0f, 0, 1},
    {"FP8 o sliding", HID, 4096, 1, 0, 1.0f, 0.0f, 0, 1},
    {"FP8 o full", HID, 8192, 1, 0, 1.0f, 0.0f, 0, 1},
    {"FP8 dense gate|up", 4224, HID, 1, 0, 1.0f, 0.0f, 0, 1},
    {"FP8 dense down", HID, 2112, 1, 0, 1.0f, 0.0f, 0, 1},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* names of the enum values cuBLASLt reports (cublasLt.h, CUDA 13.0); ids
 * outside these tables print as numbers */
static const char *const tile_names[] = {
    "undef", "8x8", "8x16", "16x8", "8x32", "16x16", "32x8", "8x64", "16x32", "32x16",
    "64x8", "32x32", "32x64", "64x32", "32x128", "64x64", "128x32", "64x128", "128x64",
    "64x256", "128x128", "256x64", "64x512", "128x256", "256x128", "512x64", "64x96", "96x64",
    "96x128", "128x160", "160x128", "192x128", "128x192", "128x96", "32x256", "256x32",
};
static const char *const stage_names[] = {
    "undef", "16x1", "16x2", "16x3", "16x4", "16x5", "16x6", "32x1", "32x2", "32x3",
    "32x4", "32x5", "32x6", "64x1", "64x2", "64x3", "64x4", "64x5", "64x6", "128x1",
    "128x2", "128x3", "128x4", "128x5", "128x6", "32x10", "8x4", "16x10", "8x5", NULL,
    NULL, "8x3", "8xAUTO", "16xAUTO", "32xAUTO", "64xAUTO", "128xAUTO", "256xAUTO", "768xAUTO",
};
static const char *const cluster_names[] = {
    "auto", NULL, "1x1x1", "2x1x1", "4x1x1", "1x2x1", "2x2x1", "4x2x1", "1x4x1",
    "2x4x1", "4x4x1", "8x1x1", "1x8x1", "8x2x1", "2x8x1", "16x1x1", "1x16x1",
};

static const char *enum_name(const char *const *names, size_t n, unsigned id, char *buf,
                             size_t len)
{
    if (id < n && names[id])
        return names[id];
    snprintf(buf, len, "#%u", id);
    return buf;
}

static const char *reduction_name(unsigned r)
{
    switch (r) {
    case 0: return "none";
    case 1: return "inplace";
    case 2: return "compute-type";
    case 4: return "output-type";
    default: return "?";
    }
}

/* One heuristic result, timed. */
struct algo_result {
    double us;              /* median; NAN when skipped */
    int status;             /* the cuBLAS status that skipped it, or 0 */
    char desc[192];
};

/* What one shape at one T came to. */
struct row {
    double floor_us, default_us, best_us, first_us, rel_diff;
    int n_algos, n_timed, best;
    struct algo_result algos[MAX_ALGOS];
};

struct bench {
    struct dg_blas *blas;
    cublasLtHandle_t lt;
    cublasLtMatmulPreference_t pref;
    struct dg_prof *prof;
    struct dg_ceilings ce;
    void *ws, *flush;
    uint16_t *x, *W;
    uint8_t *x8, *W8;   /* x and W quantized (the FP8 shapes) */
    float *x8s, *W8s;   /* their row scales (unused by the unit mode's sums) */
    void *y, *y_ref, *y_init;
    size_t y_bytes;
    int reps, flush_l2;
    double t[MAX_REPS];
};

/* The problem's cuBLASLt descriptors: D = alpha op(A) B + beta C, C = D. */
struct lt_problem {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
};

#define LT_CHECK(call)                                                                   \
    do {                                                                                 \
        cublasStatus_t s_ = (call);                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
            rc = dg_error_set(err, DG_E_CUBLAS, "%s:%d: %s: %s (%d)", __FILE__, __LINE__, \
                              #call, cublasLtGetStatusName(s_), (int)s_);                \
            goto out;                                                                    \
        }                                                                                \
    } while (0)

/* The cuBLASLt handle and the heuristic's preference: a 32 MiB workspace. */
static int lt_open(struct bench *b, struct dg_error *err)
{
    const uint64_t ws_bytes = LT_WORKSPACE;
    int rc = 0;
    LT_CHECK(cublasLtCreate(&b->lt));
    LT_CHECK(cublasLtMatmulPreferenceCreate(&b->pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(b->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes));
out:
    return rc;
}

static void lt_problem_free(struct lt_problem *p)
{
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->c)
        cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

/* linear.cu's column-major mapping: A = W (K x N, op T; or N x K, op N
 * when W is [K, N]), B = x (K x T, ld K), C = D = y (N x T, ld N). */
static int lt_problem_init(struct lt_problem *p, const struct shape *s, int64_t T,
                           struct dg_error *err)
{
    const int32_t ta = s->w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const uint64_t N = (uint64_t)s->N, K = (uint64_t)s->K;
    int rc = 0;
    memset(p, 0, sizeof *p);
    LT_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, s->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF,
                                        s->w_kn ? N : K, s->w_kn ? K : N,
                                        s->w_kn ? s->N : s->K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, s->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, K,
                                        (uint64_t)T, s->K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, s->y_f32 ? CUDA_R_32F : CUDA_R_16BF, N,
                                        (uint64_t)T, s->N));
out:
    if (rc < 0)
        lt_problem_free(p);
    return rc;
}

/* One product into b->y: the forward's call (algo NULL) or cuBLASLt with
 * algo.  Returns 0, a negative dg_status (fatal), or the positive cuBLAS
 * status cublasLtMatmul refused it with (the algorithm is skipped). */
static int run_once(struct bench *b, const struct shape *s, int64_t T,
                    const struct lt_problem *p, const cublasLtMatmulAlgo_t *algo,
                    struct dg_error *err)
{
    cublasStatus_t st;
    if (!algo)
        return dg_blas_gemm_e(b->blas, DG_ELT_BF16, b->y, s->y_f32, b->x, T, b->W, s->w_kn,
                              s->N, s->K, s->w_kn ? s->N : s->K, s->alpha, s->beta, err);
    st = cublasLtMatmul(b->lt, p->op, &s->alpha, s->fp8 ? (const void *)b->W8 : b->W, p->a,
                        s->fp8 ? (const void *)b->x8 : b->x, p->b, &s->beta, b->y, p->c, b->y,
                        p->c, algo, b->ws, LT_WORKSPACE, NULL);
    if (st != CUBLAS_STATUS_SUCCESS) {
        dg_error_set(err, DG_E_CUBLAS, "cublasLtMatmul: %s (%d)", cublasLtGetStatusName(st),
                     (int)st);
        return (int)st;
    }
    return 0;
}

/* One warm-up call, then b->reps calls each timed alone on the device;
 * *us = the median.  Returns as run_once. */
static int time_product(struct bench *b, const struct shape *s, int64_t T,
                        const struct lt_problem *p, const cublasLtMatmulAlgo_t *algo, double *us,
                        struct dg_error *err)
{
    struct dg_prof_total tot[DG_PROF_MAX_LABELS];
    double before = 0.0;
    int rc;
    dg_prof_reset(b->prof);
    for (int r = -1; r < b->reps; r++) {
        /* evict L2 and give the host time to queue the call behind it */
        if (b->flush_l2 &&
            (rc = dg_cuda_memset_async(b->flush, r & 0xff, FLUSH_BYTES, NULL, 0, err)) < 0)
            return rc;
        if ((rc = dg_prof_begin(b->prof, NULL, err)) < 0)
            return rc;
        if ((rc = run_once(b, s, T, p, algo, err)) != 0) {
            /* leave the device idle and the profiler's pool empty */
            int rs = dg_cuda_sync(0, err);
            if (rs < 0)
                return rs;
            dg_prof_reset(b->prof);
            return rc;
        }
        if ((rc = dg_prof_mark(b->prof, "gemm", NULL, err)) < 0 ||
            (rc = dg_cuda_sync(0, err)) < 0 || (rc = dg_prof_collect(b->prof, err)) < 0)
            return rc;
        if (dg_prof_totals(b->prof, tot, DG_PROF_MAX_LABELS) < 1)
            return dg_error_set(err, DG_E_INTERNAL, "bench-linear: no time recorded");
        if (r >= 0)
            b->t[r] = (tot[0].ms - before) * 1e3;
        before = tot[0].ms;
    }
    *us = bench_median(b->t, b->reps);
    return 0;
}

static void describe_algo(const cublasLtMatmulHeuristicResult_t *h, char *buf, size_t len)
{
    int32_t id = -1, splitk = 0;
    uint32_t tile = 0, stages = 0, red = 0, swz = 0, custom = 0;
    uint16_t cluster = 0;
    size_t w;
    char tb[16], sb[16], cb[16] = "";
    const cublasLtMatmulAlgo_t *a = &h->algo;
    /* each read alone: one the library refuses leaves its default (the
     * cluster shape then prints as n/a) */
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                         sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz,
                                         &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                         sizeof custom, &w);
    if (cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof cluster, &w) != CUBLAS_STATUS_SUCCESS)
        snprintf(cb, sizeof cb, "n/a");
    snprintf(buf, len,
             "algo %d, tile %s, stages %s, split-K %d, reduction %s, CTA swizzle %u, custom %u, "
             "cluster %s, ws %zu KiB, waves %.2f",
             (int)id,
             enum_name(tile_names, sizeof tile_names / sizeof *tile_names, tile, tb, sizeof tb),
             enum_name(stage_names, sizeof stage_names / sizeof *stage_names, stages, sb,
                       sizeof sb),
             (int)splitk, reduction_name(red), swz, custom,
             cb[0] ? cb
                   : enum_name(cluster_names, sizeof cluster_names / sizeof *cluster_names,
                               cluster, cb, sizeof cb),
             h->workspaceSize >> 10, (double)h->wavesCount);
}

static double bf16_to_f(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* max |y - ref| / max |ref| over n elements (host copies); NAN when
 * either holds a NaN or an infinity */
static double rel_diff(const void *ref, const void *y, size_t n, int f32)
{
    double dmax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double r = f32 ? ((const float *)ref)[i] : bf16_to_f(((const uint16_t *)ref)[i]);
        const double v = f32 ? ((const float *)y)[i] : bf16_to_f(((const uint16_t *)y)[i]);
        if (!isfinite(r) || !isfinite(v))
            return NAN;
        dmax = fmax(dmax, fabs(v - r));
        rmax = fmax(rmax, fabs(r));
    }
    return rmax > 0.0 ? dmax / rmax : dmax;
}

/* The output of ref (NULL: the default) and algo's, each from y_init;
 * *out = rel_diff. */
static int check_output(struct bench *b, const struct shape *s, int64_t T,
                        const struct lt_problem *p, const cublasLtMatmulAlgo_t *ref,
                        const cublasLtMatmulAlgo_t *algo, double *out, struct dg_error *err)
{
    const size_t n = (size_t)(T * s->N), bytes = n * (s->y_f32 ? 4 : 2);
    void *href = malloc(bytes), *hy = malloc(bytes);
    int rc = 0;
    if (!href || !hy) {
        rc = dg_error_set(err, DG_E_NOMEM, "bench-linear: out of host memory");
        goto out;
    }
    if ((rc = dg_cuda_copy_async(b->y, b->y_init, bytes, NULL, 0, err)) < 0 ||
        (rc = run_once(b, s, T, p, ref, err)) != 0 ||
        (rc = dg_cuda_copy_async(b->y_ref, b->y, bytes, NULL, 0, err)) < 0 ||
        (rc = dg_cuda_copy_async(b->y, b->y_init, bytes, NULL, 0, err)) < 0 ||
        (rc = run_once(b, s, T, p, algo, err)) != 0 || (rc = dg_cuda_sync(0, err)) < 0 ||
        (rc = dg_cuda_download(href, b->y_ref, bytes, 0, err)) < 0 ||
        (rc = dg_cuda_download(hy, b->y, bytes, 0, err)) < 0)
        goto out;
    *out = rel_diff(href, hy, n, s->y_f32);
out:
    free(href);
    free(hy);
    /* (an algorithm that ran in timing and fails here is as fatal) */
    return rc > 0 ? -DG_E_CUBLAS : rc;
}

static int bench_shape(struct bench *b, const struct shape *s, int64_t T, struct row *row,
                       struct dg_error *err)
{
    const double ysz = s->y_f32 ? 4.0 : 2.0;
    const double bytes = 2.0 * (double)s->N * (double)s->K + 2.0 * (double)T * (double)s->K +
                         ysz * (double)T * (double)s->N * (s->beta != 0.0f ? 2.0 : 1.0);
    const double flops = 2.0 * (double)T * (double)s->N * (double)s->K;
    cublasLtMatmulHeuristicResult_t heur[MAX_ALGOS];
    struct lt_problem p = {0};
    int rc = 0;

    memset(row, 0, sizeof *row);
    row->best = -1;
    row->best_us = row->first_us = row->rel_diff = NAN;
    row->floor_us = fmax(bytes / (b->ce.copy_gbps * 1e9), flops / (b->ce.gemm_tflops * 1e12)) *
                    1e6;
    if ((rc = lt_problem_init(&p, s, T, err)) < 0)
        goto out;
    memset(heur, 0, sizeof heur);
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, p.op, p.a, p.b, p.c, p.c, b->pref, MAX_ALGOS,
                                            heur, &row->n_algos));
    if ((rc = time_product(b, s, T, &p, NULL, &row->default_us, err)) != 0) {
        dg_error_prefix(err, "%s, T %lld: cublasGemmEx", s->name, (long long)T);
        rc = rc > 0 ? -DG_E_CUBLAS : rc;
        goto out;
    }
    for (int i = 0; i < row->n_algos; i++) {
        struct algo_result *a = &row->algos[i];
        describe_algo(&heur[i], a->desc, sizeof a->desc);
        a->us = NAN;
        a->status = (int)heur[i].state;
        if (a->status != 0)
            continue;
        rc = time_product(b, s, T, &p, &heur[i].algo, &a->us, err);
        if (rc < 0)
            goto out;
        if (rc > 0) {
            a->status = rc;
            a->us = NAN;
            rc = 0;
            continue;
        }
        row->n_timed++;
        if (i == 0)
            row->first_us = a->us;
        if (row->best < 0 || a->us < row->best_us) {
            row->best = i;
            row->best_us = a->us;
        }
    }
    if (row->best >= 0 &&
        (rc = check_output(b, s, T, &p, NULL, &heur[row->best].algo, &row->rel_diff, err)) < 0)
        goto out;
out:
    lt_problem_free(&p);
    return rc;
}

/* ---- --search: cuBLASLt's configurations beyond its heuristic ------------------ */

#define MAX_IDS 128
#define MAX_CANDS 20000
#define SEARCH_FAST_REPS 1
#define SEARCH_KEEP 12

/* one configuration that cublasLtMatmulAlgoCheck accepted */
struct cand {
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    float waves;
    double us;
};

static int cand_cmp(const void *a, const void *b)
{
    const double x = ((const struct cand *)a)->us, y = ((const struct cand *)b)->us;
    return isnan(x) ? (isnan(y) ? 0 : 1) : isnan(y) ? -1 : x < y ? -1 : x > y;
}

/* a capability that is an array of uint32_t ids (tiles, stages): *n of
 * them into ids, or one 0 (undefined) where the algorithm lists none */
static void cap_ids(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoCapAttributes_t attr,
                    uint32_t *ids, int cap, int *n)
{
    size_t w = 0;
    *n = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, attr, NULL, 0, &w) == CUBLAS_STATUS_SUCCESS &&
        w >= sizeof(uint32_t)) {
        int k = (int)(w / sizeof(uint32_t));
        if (k > cap)
            k = cap;
        if (cublasLtMatmulAlgoCapGetAttribute(a, attr, ids, (size_t)k * sizeof(uint32_t), &w) ==
            CUBLAS_STATUS_SUCCESS)
            *n = k;
    }
    if (*n == 0) {
        ids[0] = 0;
        *n = 1;
    }
}

/* Every (algorithm id, tile, split-K and its reductions, cluster shape)
 * cublasLtMatmulAlgoCheck accepts for the problem (stages, CTA swizzle
 * and custom option left at their defaults), timed SEARCH_FAST_REPS times
 * each; the fastest SEARCH_KEEP then with their stages, swizzles and
 * custom options varied, and every survivor of that timed b->reps times.
 * Prints the default's time and the best SEARCH_KEEP. */
static int search_shape(struct bench *b, const struct shape *s, int64_t T, struct dg_error *err)
{
    static const int splits[] = {1, 2, 3, 4, 6, 8};
    static const uint16_t clusters[] = {0, 2, 3, 4, 5, 6, 7, 8, 9};
    const cudaDataType_t ct = s->y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t abt = s->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatmulHeuristicResult_t h0; /* FP8: the heuristic's first, fp8-lt.cu's choice */
    const cublasLtMatmulAlgo_t *ref = NULL;
    int n_h0 = 0;
    struct lt_problem p = {0};
    struct cand *c = calloc(MAX_CANDS, sizeof *c);
    int ids[MAX_IDS], n_ids = 0, n = 0, accepted = 0, checked = 0, reps = b->reps, rc = 0;
    double def_us = NAN, diff = NAN;

    if (!c)
        return dg_error_set(err, DG_E_NOMEM, "bench-linear: out of host memory");
    if ((rc = lt_problem_init(&p, s, T, err)) < 0)
        goto out;
    LT_CHECK(cublasLtMatmulAlgoGetIds(b->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, abt, abt, ct, ct,
                                      MAX_IDS, ids, &n_ids));
    if (s->fp8) {
        memset(&h0, 0, sizeof h0);
        LT_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, p.op, p.a, p.b, p.c, p.c, b->pref, 1, &h0,
                                                &n_h0));
        if (n_h0 < 1) {
            rc = dg_error_set(err, DG_E_CUBLAS, "%s: no heuristic algorithm", s->name);
            goto out;
        }
        ref = &h0.algo;
    }
    for (int i = 0; i < n_ids; i++) {
        cublasLtMatmulAlgo_t base;
        uint32_t tiles[64], red_mask = 0;
        int n_tiles = 0, splitk_ok = 0;
        size_t w;
        if (cublasLtMatmulAlgoInit(b->lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, abt, abt, ct, ct,
                                   ids[i], &base) != CUBLAS_STATUS_SUCCESS)
            continue;
        cap_ids(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, 64, &n_tiles);
        cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok,
                                          sizeof splitk_ok, &w);
        cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                          &red_mask, sizeof red_mask, &w);
        for (int t = 0; t < n_tiles; t++)
            for (int k = 0; k < (int)(sizeof splits / sizeof *splits); k++) {
                if (splits[k] > 1 && !splitk_ok)
                    continue;
                for (uint32_t red = 0; red <= 4; red = red ? red * 2 : 1) {
                    if ((splits[k] == 1) != (red == 0) || (red && !(red_mask & red)))
                        continue;
                    for (int q = 0; q < (int)(sizeof clusters / sizeof *clusters); q++) {
                        cublasLtMatmulAlgo_t a = base;
                        cublasLtMatmulHeuristicResult_t h;
                        const int32_t sk = splits[k];
                        if (cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[t], sizeof tiles[t]) ||
                            cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) ||
                            cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red))
                            continue;
                        if (clusters[q] && cublasLtMatmulAlgoConfigSetAttribute(
                                               &a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                               &clusters[q], sizeof clusters[q]))
                            continue;
                        checked++;
                        memset(&h, 0, sizeof h);
                        if (cublasLtMatmulAlgoCheck(b->lt, p.op, p.a, p.b, p.c, p.c, &a, &h) !=
                                CUBLAS_STATUS_SUCCESS ||
                            h.workspaceSize > LT_WORKSPACE || n >= MAX_CANDS)
                            continue;
                        c[n].algo = a;
                        c[n].ws = h.workspaceSize;
                        c[n].waves = h.wavesCount;
                        n++;
                    }
                }
            }
    }
    if ((rc = time_product(b, s, T, &p, ref, &def_us, err)) != 0) {
        rc = rc > 0 ? -DG_E_CUBLAS : rc;
        goto out;
    }
    /* the quick pass */
    b->reps = SEARCH_FAST_REPS;
    for (int i = 0; i < n; i++) {
        rc = time_product(b, s, T, &p, &c[i].algo, &c[i].us, err);
        if (rc < 0)
            goto out;
        if (rc > 0)
            c[i].us = NAN;
        rc = 0;
    }
    accepted = n;
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    /* the best few with stages, swizzle and custom options varied */
    {
        const int keep = n < SEARCH_KEEP ? n : SEARCH_KEEP;
        int m = keep;
        for (int i = 0; i < keep && !isnan(c[i].us); i++) {
            uint32_t stages[64];
            int n_st = 0, swz_ok = 0, cmax = 0;
            size_t w;
            cap_ids(&c[i].algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, 64, &n_st);
            cublasLtMatmulAlgoCapGetAttribute(&c[i].algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                                              &swz_ok, sizeof swz_ok, &w);
            cublasLtMatmulAlgoCapGetAttribute(&c[i].algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX,
                                              &cmax, sizeof cmax, &w);
            for (int st = 0; st < n_st; st++)
                for (uint32_t swz = 0; swz <= (swz_ok ? 1u : 0u); swz++)
                    for (uint32_t cu = 0; cu <= (uint32_t)(cmax > 3 ? 3 : cmax); cu++) {
                        cublasLtMatmulAlgo_t a = c[i].algo;
                        cublasLtMatmulHeuristicResult_t h;
                        if ((!stages[st] && !swz && !cu) || m >= MAX_CANDS)
                            continue;
                        if (cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages[st],
                                sizeof stages[st]) ||
                            cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz) ||
                            cublasLtMatmulAlgoConfigSetAttribute(
                                &a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cu, sizeof cu))
                            continue;
                        checked++;
                        memset(&h, 0, sizeof h);
                        if (cublasLtMatmulAlgoCheck(b->lt, p.op, p.a, p.b, p.c, p.c, &a, &h) !=
                                CUBLAS_STATUS_SUCCESS ||
                            h.workspaceSize > LT_WORKSPACE)
                            continue;
                        c[m].algo = a;
                        c[m].ws = h.workspaceSize;
                        c[m].waves = h.wavesCount;
                        rc = time_product(b, s, T, &p, &a, &c[m].us, err);
                        if (rc < 0)
                            goto out;
                        if (rc > 0)
                            c[m].us = NAN;
                        rc = 0;
                        m++;
                    }
        }
        qsort(c, (size_t)m, sizeof *c, cand_cmp);
        n = m;
    }
    /* the best few again, with every repeat */
    b->reps = reps;
    for (int i = 0; i < n && i < SEARCH_KEEP; i++)
        if (!isnan(c[i].us) && (rc = time_product(b, s, T, &p, &c[i].algo, &c[i].us, err)) != 0)
            goto out;
    qsort(c, (size_t)(n < SEARCH_KEEP ? n : SEARCH_KEEP), sizeof *c, cand_cmp);
    if (n > 0 && !isnan(c[0].us) && (rc = check_output(b, s, T, &p, ref, &c[0].algo, &diff, err)) < 0)
        goto out;
    printf("\n%s (N %lld, K %lld), T %lld: %d configurations checked, %d accepted (%d with "
           "stages, swizzle, options varied); %s %.2f us; ",
           s->name, (long long)s->N, (long long)s->K, (long long)T, checked, accepted, n,
           s->fp8 ? "cuBLASLt heuristic #0" : "GemmEx default", def_us);
    if (n == 0 || isnan(c[0].us)) {
        printf("none ran\n");
        goto out;
    }
    printf("best %.2f us (%.2f x), max rel diff %.2e%s\n\n"
           "| # | us | x default | algorithm |\n|---:|---:|---:|---|\n",
           c[0].us, c[0].us / def_us, diff, isnan(diff) || diff > DIFF_FLAG ? " DIFFERS" : "");
    for (int i = 0; i < n && i < SEARCH_KEEP; i++) {
        cublasLtMatmulHeuristicResult_t h;
        char desc[192];
        memset(&h, 0, sizeof h);
        h.algo = c[i].algo;
        h.workspaceSize = c[i].ws;
        h.wavesCount = c[i].waves;
        describe_algo(&h, desc, sizeof desc);
        printf("| %d | %.2f | %.2f | %s |\n", i, c[i].us, c[i].us / def_us, desc);
    }
    fflush(stdout);
out:
    b->reps = reps;
    if (rc > 0)
        rc = -DG_E_CUBLAS;
    lt_problem_free(&p);
    free(c);
    return rc;
}

static void print_table(int64_t T, const int *ran, const struct row *rows, int all)
{
    int skipped = 0;
    printf("\n### T = %lld\n\n", (long long)T);
    printf("| shape | N | K | y | floor us | GemmEx default us | best Lt us | Lt #0 us | "
           "best/default | algos timed | max rel diff | best algorithm (heuristic #) |\n"
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < N_SHAPES; i++) {
        const struct shape *s = &shapes[i];
        const struct row *r = &rows[i];
        if (!ran[i])
            continue;
        printf("| %s | %lld | %lld | %s%s | %.2f | %.2f | ", s->name, (long long)s->N,
               (long long)s->K, s->y_f32 ? "fp32" : "bf16", s->beta != 0.0f ? ", beta 1" : "",
               r->floor_us, r->default_us);
        if (r->best < 0) {
            printf("- | - | - | 0/%d | - | (none ran) |\n", r->n_algos);
            continue;
        }
        printf("%.2f | ", r->best_us);
        if (isnan(r->first_us))
            printf("- | ");
        else
            printf("%.2f | ", r->first_us);
        printf("%.2f | %d/%d | %.2e%s | #%d: %s |\n", r->best_us / r->default_us, r->n_timed,
               r->n_algos, r->rel_diff,
               isnan(r->rel_diff) || r->rel_diff > DIFF_FLAG ? " DIFFERS" : "", r->best,
               r->algos[r->best].desc);
    }
    for (int i = 0; i < N_SHAPES; i++)
        for (int k = 0; ran[i] && k < rows[i].n_algos; k++)
            skipped += rows[i].algos[k].status != 0;
    if (skipped) {
        printf("\nskipped (cuBLASLt refused them):\n\n");
        for (int i = 0; i < N_SHAPES; i++)
            for (int k = 0; ran[i] && k < rows[i].n_algos; k++)
                if (rows[i].algos[k].status != 0)
                    printf("- %s, heuristic #%d: status %d; %s\n", shapes[i].name, k,
                           rows[i].algos[k].status, rows[i].algos[k].desc);
    }
    if (!all)
        return;
    for (int i = 0; i < N_SHAPES; i++) {
        if (!ran[i])
            continue;
        printf("\n%s, T %lld: GemmEx default %.2f us\n\n| # | us | x default | algorithm |\n"
               "|---:|---:|---:|---|\n", shapes[i].name, (long long)T, rows[i].default_us);
        for (int k = 0; k < rows[i].n_algos; k++) {
            const struct algo_result *a = &rows[i].algos[k];
            if (a->status != 0)
                printf("| %d | - | - | skipped (status %d); %s |\n", k, a->status, a->desc);
            else
                printf("| %d | %.2f | %.2f | %s |\n", k, a->us, a->us / rows[i].default_us,
                       a->desc);
        }
    }
}

int main(int argc, char **argv)
{
    int64_t Ts[16];
    int nT = 0, all = 0, search = 0, status = 1;
    struct dg_error err = {0};
    struct bench *b = calloc(1, sizeof *b);
    static struct row rows[N_SHAPES];
    int ran[N_SHAPES];
    int64_t max_x = 0, max_w = 0, max_y = 0;

    if (!b) {
        fprintf(stderr, "bench-linear: out of host memory\n");
        return 1;
    }
    b->reps = 50;
    b->flush_l2 = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            b->reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--all")) {
            all = 1;
        } else if (!strcmp(argv[i], "--search")) {
            search = 1;
        } else if (!strcmp(argv[i], "--no-flush")) {
            b->flush_l2 = 0;
        } else if (argv[i][0] != '-' && nT < 16 && atoll(argv[i]) >= 1 &&
                   atoll(argv[i]) <= MAX_T) {
            Ts[nT++] = atoll(argv[i]);
        } else {
            fprintf(stderr, "usage: bench-linear [--reps N] [--all] [--search] [--no-flush] [T...] "
                            "(T 1-%d, at most 16)\n", MAX_T);
            free(b);
            return 2;
        }
    }
    if (b->reps < 1 || b->reps > MAX_REPS) {
        fprintf(stderr, "bench-linear: --reps 1..%d\n", MAX_REPS);
        free(b);
        return 2;
    }
    if (!nT) {
        Ts[nT++] = 256;
        Ts[nT++] = 1024;
    }
    /* buffers for the largest operands any (T, shape) run reads */
    for (int t = 0; t < nT; t++)
        for (int i = 0; i < N_SHAPES; i++) {
            const struct shape *s = &shapes[i];
            if (s->max_T && Ts[t] > s->max_T)
                continue;
            max_x = Ts[t] * s->K > max_x ? Ts[t] * s->K : max_x;
            max_w = s->N * s->K > max_w ? s->N * s->K : max_w;
            max_y = Ts[t] * s->N * (s->y_f32 ? 4 : 2) > max_y ? Ts[t] * s->N * (s->y_f32 ? 4 : 2)
                                                               : max_y;
        }
    b->y_bytes = (size_t)max_y;

    /* the ceilings first, while the GPU is empty (they need ~2.4 GiB) */
    if (dg_cuda_use(0, &err) < 0 || bench_print_board(0, &err) < 0 ||
        dg_measure_ceilings(0, &b->ce, &err) < 0 ||
        dg_prof_create(&b->prof, 8, 0, &err) < 0 || dg_blas_create(0, NULL, &b->blas, &err) < 0)
        goto out;
    if (dg_cuda_alloc(&b->ws, LT_WORKSPACE, 0, &err) < 0 ||
        dg_cuda_alloc(&b->flush, FLUSH_BYTES, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->x, 2 * (size_t)max_x, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->W, 2 * (size_t)max_w, 0, &err) < 0 ||
        dg_cuda_alloc(&b->y, b->y_bytes, 0, &err) < 0 ||
        dg_cuda_alloc(&b->y_ref, b->y_bytes, 0, &err) < 0 ||
        dg_cuda_alloc(&b->y_init, b->y_bytes, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->x8, (size_t)max_x, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->W8, (size_t)max_w, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->x8s, 4 * (size_t)max_x / HID + 64, 0, &err) < 0 ||
        dg_cuda_alloc((void **)&b->W8s, 4 * (size_t)max_w / HID + 64, 0, &err) < 0)
        goto out;
    /* random operands, made once at the largest shapes (each product reads
     * its prefix): x ~ N(0, 1), W ~ N(0, 0.05^2), y's starting values (read
     * by the beta-1 product) ~ N(0, 1) as bf16 */
    if (dg_cuda_fill_normal(b->x, max_x, 11, 1, 0.0f, 1.0f, NULL, 0, &err) < 0 ||
        dg_cuda_fill_normal(b->W, max_w, 11, 2, 0.0f, 0.05f, NULL, 0, &err) < 0 ||
        dg_cuda_fill_normal((uint16_t *)b->y_init, max_y / 2, 11, 3, 0.0f, 1.0f, NULL, 0,
                            &err) < 0 ||
        dg_cuda_sync(0, &err) < 0)
        goto out;
    /* and quantized per row of HID (E4M3 values of the same spread) */
    if (dg_cuda_fp8_quantize_rows(DG_ELT_BF16, b->x8, b->x8s, b->x, max_x / HID, HID, NULL, 0,
                                  &err) < 0 ||
        dg_cuda_fp8_quantize_rows(DG_ELT_BF16, b->W8, b->W8s, b->W, max_w / HID, HID, NULL, 0,
                                  &err) < 0 ||
        dg_cuda_sync(0, &err) < 0)
        goto out;

    if (lt_open(b, &err) < 0)
        goto out;

    printf("ceilings, GPU 0: device copy %.0f GB/s (read + write), bf16 GEMM %.0f TFLOP/s "
           "(%d^3), L2 read %.0f GB/s; %d timed repeats a product, medians in us; L2 %s before "
           "each call; cuBLASLt: up to %d heuristic algorithms, %zu MiB workspace\n",
           b->ce.copy_gbps, b->ce.gemm_tflops, b->ce.gemm_n, b->ce.l2_read_gbps, b->reps,
           b->flush_l2 ? "flushed" : "not flushed", MAX_ALGOS, LT_WORKSPACE >> 20);
    for (int t = 0; t < nT && search; t++)
        for (int i = 0; i < N_SHAPES; i++)
            if ((!shapes[i].max_T || Ts[t] <= shapes[i].max_T) &&
                search_shape(b, &shapes[i], Ts[t], &err) < 0)
                goto out;
    for (int t = 0; t < nT && !search; t++) {
        for (int i = 0; i < N_SHAPES; i++) {
            ran[i] = (!shapes[i].max_T || Ts[t] <= shapes[i].max_T) && !shapes[i].fp8;
            if (ran[i] && bench_shape(b, &shapes[i], Ts[t], &rows[i], &err) < 0)
                goto out;
        }
        print_table(Ts[t], ran, rows, all);
        fflush(stdout);
    }
    status = 0;
out:
    if (status)
        fprintf(stderr, "bench-linear: %s\n", err.msg[0] ? err.msg : "failed");
    if (b->pref)
        cublasLtMatmulPreferenceDestroy(b->pref);
    if (b->lt)
        cublasLtDestroy(b->lt);
    dg_cuda_free(b->ws);
    dg_cuda_free(b->flush);
    dg_cuda_free(b->x);
    dg_cuda_free(b->W);
    dg_cuda_free(b->y);
    dg_cuda_free(b->y_ref);
    dg_cuda_free(b->y_init);
    dg_cuda_free(b->x8);
    dg_cuda_free(b->W8);
    dg_cuda_free(b->x8s);
    dg_cuda_free(b->W8s);
    dg_blas_destroy(b->blas);
    dg_prof_destroy(b->prof);
    free(b);
    return status;
}
