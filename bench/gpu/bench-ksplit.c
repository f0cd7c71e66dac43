/*
 * bench-ksplit - does a batch-1 projection gain from its K range split
 * over concurrent streams?  At 256 rows cuBLASLt's FP8 products of the
 * 26B-A4B's projections read their weights at a fraction of the copy
 * rate (a sliding layer's o projection about 0.66 TB/s alone on an H100,
 * run 311): few output tiles for the multiprocessors, each walking the
 * whole K?  Here each product runs
 * (a) whole, as dg_fp8_lt_gemm runs it (outer-vector scales, bf16 out;
 * the forward takes the unit-scale fp32 sums of the same product), and
 * (b) as S products over K / S each, on S streams at once, into S fp32
 * partial sums (the scales are per row and per weight row, so the
 * partials add up to the whole; the pass that adds them and rounds to
 * bf16 is not run here: a [256 x N] pass of a few microseconds).  The same
 * in bf16 (cublasLt, no scales) for the bf16 projections.
 *
 * usage: bench-ksplit [--reps R] [T]   (defaults: 30 reps, T 256)
 *
 * Before every timed call a 256 MiB memset on the first stream evicts
 * the L2 and keeps the GPU busy while the host queues the products, as a
 * CUDA graph would; the time is the first stream's events around the
 * fork and the join.  Prints a table of medians (us) and the weights'
 * read rate.  Asserts nothing about speed; exits 1 where cuBLASLt has no
 * algorithm or a call fails.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench-util.h"

#define MAXS 4
#define WS_BYTES ((size_t)32 << 20)
#define FLUSH_BYTES ((size_t)256 << 20)

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "bench-ksplit: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,          \
                    cudaGetErrorString(e_));                                                   \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define LK(x)                                                                                  \
    do {                                                                                       \
        cublasStatus_t s_ = (x);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "bench-ksplit: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,          \
                    cublasLtGetStatusName(s_));                                                \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

struct shape {
    const char *name;
    int64_t N, K;
};

static const struct shape shapes[] = {
    {"qkv sliding", 8192, 2816}, {"qkv full", 9216, 2816}, {"o sliding", 2816, 4096},
    {"o full", 2816, 8192},      {"dense gate|up", 4224, 2816}, {"dense down", 2816, 2112},
};

/* One planned product: Y^T [N x T] = W^T-op . X over k of K (W and X
 * with ld K), D of type dt (ld N); fp8 with outer-vector scales. */
struct plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

static cublasLtHandle_t lt;
static cublasLtMatmulPreference_t pref;

static void plan_make(struct plan *p, int fp8, int64_t T, int64_t N, int64_t k, int64_t K,
                      cudaDataType_t dt, const float *sw, const float *sa)
{
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    cublasLtMatmulHeuristicResult_t h;
    int n = 0;
    memset(p, 0, sizeof *p);
    LK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fp8) {
        const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer,
                                          sizeof outer));
        LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer,
                                          sizeof outer));
        LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw,
                                          sizeof sw));
        LK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa,
                                          sizeof sa));
    }
    LK(cublasLtMatrixLayoutCreate(&p->a, in, (uint64_t)k, (uint64_t)N, K));
    LK(cublasLtMatrixLayoutCreate(&p->b, in, (uint64_t)k, (uint64_t)T, K));
    LK(cublasLtMatrixLayoutCreate(&p->d, dt, (uint64_t)N, (uint64_t)T, N));
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &h, &n));
    if (n < 1) {
        fprintf(stderr, "bench-ksplit: no algorithm for %s [%lld x %lld] k %lld\n",
                fp8 ? "FP8" : "bf16", (long long)T, (long long)N, (long long)k);
        exit(1);
    }
    p->algo = h.algo;
}

static void plan_free(struct plan *p)
{
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
}

int main(int argc, char **argv)
{
    int reps = 30;
    int64_t T = 256, maxN = 0, maxK = 0;
    cudaStream_t st[MAXS];
    cudaEvent_t e0, e1, fork, join[MAXS];
    void *ws[MAXS], *flush, *W, *X, *Y, *P;
    float *sw, *sa;
    double *t;
    uint64_t rng = 7;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            T = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench-ksplit [--reps R] [T]\n");
            return 2;
        }
    }
    if (reps < 1 || T < 1 || T > 4096) {
        fprintf(stderr, "bench-ksplit: reps >= 1, T in 1 .. 4096\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        maxN = shapes[i].N > maxN ? shapes[i].N : maxN;
        maxK = shapes[i].K > maxK ? shapes[i].K : maxK;
    }
    t = malloc(sizeof(double) * (size_t)reps);
    if (!t)
        return 1;
    LK(cublasLtCreate(&lt));
    LK(cublasLtMatmulPreferenceCreate(&pref));
    {
        const uint64_t w = WS_BYTES;
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &w, sizeof w));
    }
    for (int s = 0; s < MAXS; s++) {
        CK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&join[s], cudaEventDisableTiming));
        CK(cudaMalloc(&ws[s], WS_BYTES));
    }
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaMalloc(&flush, FLUSH_BYTES));
    CK(cudaMalloc(&W, (size_t)(maxN * maxK * 2)));
    CK(cudaMalloc(&X, (size_t)(T * maxK * 2)));
    CK(cudaMalloc(&Y, (size_t)(T * maxN * 2)));
    CK(cudaMalloc(&P, (size_t)(MAXS * T * maxN * 4)));
    CK(cudaMalloc((void **)&sw, (size_t)maxN * 4));
    CK(cudaMalloc((void **)&sa, (size_t)T * 4));
    {
        /* finite E4M3 bytes (and, read as bf16, finite bf16 values but
         * for a few: the time does not depend on them) and unit-ish scales */
        const size_t nb = (size_t)(maxN * maxK * 2), nx = (size_t)(T * maxK * 2);
        uint8_t *h = malloc(nb > nx ? nb : nx);
        float *hs = malloc(sizeof(float) * (size_t)(maxN > T ? maxN : T));
        if (!h || !hs)
            return 1;
        bench_fill_e4m3(&rng, h, nb);
        CK(cudaMemcpy(W, h, nb, cudaMemcpyHostToDevice));
        bench_fill_e4m3(&rng, h, nx);
        CK(cudaMemcpy(X, h, nx, cudaMemcpyHostToDevice));
        for (int64_t i = 0; i < (maxN > T ? maxN : T); i++)
            hs[i] = 1.0f / 64;
        CK(cudaMemcpy(sw, hs, (size_t)maxN * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sa, hs, (size_t)T * 4, cudaMemcpyHostToDevice));
        free(h);
        free(hs);
    }

    printf("T %lld, %d reps; us (median), and the weights' read rate in GB/s; K split in "
           "slices of a multiple of 16, the last taking the rest\n\n", (long long)T, reps);
    printf("| weights | product | N | K | whole us | GB/s | 2 at once us | 3 at once us | "
           "4 at once us | best GB/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int fp8 = 1; fp8 >= 0; fp8--)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const struct shape *sh = &shapes[i];
            const double wbytes = (double)(sh->N * sh->K * (fp8 ? 1 : 2));
            double us[MAXS + 1];
            for (int S = 1; S <= MAXS; S++) {
                struct plan p[MAXS];
                /* slices of a multiple of 16 but the last, which takes the rest */
                const int64_t k = sh->K / S / 16 * 16;
                for (int s = 0; s < S; s++)
                    plan_make(&p[s], fp8, T, sh->N, s < S - 1 ? k : sh->K - (S - 1) * k, sh->K,
                              S == 1 ? CUDA_R_16BF : CUDA_R_32F, sw, sa);
                for (int r = -1; r < reps; r++) {
                    const float one = 1.0f, zero = 0.0f;
                    float ms = 0;
                    CK(cudaMemsetAsync(flush, r & 0xff, FLUSH_BYTES, st[0]));
                    CK(cudaEventRecord(e0, st[0]));
                    CK(cudaEventRecord(fork, st[0]));
                    for (int s = 0; s < S; s++) {
                        const size_t el = fp8 ? 1 : 2;
                        const char *a = (const char *)W + (size_t)(s * k) * el;
                        const char *b = (const char *)X + (size_t)(s * k) * el;
                        void *d = S == 1 ? Y : (char *)P + (size_t)(s * T * sh->N) * 4;
                        if (s)
                            CK(cudaStreamWaitEvent(st[s], fork, 0));
                        LK(cublasLtMatmul(lt, p[s].op, &one, a, p[s].a, b, p[s].b, &zero, d,
                                          p[s].d, d, p[s].d, &p[s].algo, ws[s], WS_BYTES,
                                          st[s]));
                        if (s) {
                            CK(cudaEventRecord(join[s], st[s]));
                            CK(cudaStreamWaitEvent(st[0], join[s], 0));
                        }
                    }
                    CK(cudaEventRecord(e1, st[0]));
                    CK(cudaStreamSynchronize(st[0]));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 0)
                        t[r] = ms * 1e3;
                }
                us[S] = bench_median(t, reps);
                for (int s = 0; s < S; s++)
                    plan_free(&p[s]);
            }
            {
                double best = us[1];
                for (int S = 2; S <= MAXS; S++)
                    if (us[S] > 0 && us[S] < best)
                        best = us[S];
                printf("| %s | %s | %lld | %lld | %.1f | %.0f | %.1f | %.1f | %.1f | %.0f |\n",
                       fp8 ? "FP8" : "bf16", sh->name, (long long)sh->N, (long long)sh->K,
                       us[1], wbytes / us[1] * 1e-3, us[2], us[3], us[4],
                       wbytes / best * 1e-3);
            }
        }
    return 0;
}
