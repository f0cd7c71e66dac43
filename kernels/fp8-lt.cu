/* fp8-lt.cu - the single-group W8A8 product through cuBLASLt (fp8-lt.h).
 *
 * cuBLASLt is column-major; our matrices are row-major, so the product is
 * computed transposed: Y^T [N x T] = op(A) B with A = qw seen as a [K x N]
 * column-major matrix (ld K) and op(A) = A^T, B = qa seen as [K x T]
 * (ld K), D = C = Y seen as [N x T] (ld N): the "TN" layout FP8 requires.
 * The outer-vector scales multiply element (i, j) of op(A) B by the i-th
 * A scale (sw: one per weight row n) and the j-th B scale (sa: one per
 * token t). */
#include "kernels/fp8-lt.h"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda-check.h"

#define LT_WORKSPACE ((size_t)32 << 20)
#define LT_PLANS 48

/* One shape's descriptors and chosen algorithm. */
struct lt_plan {
    int used;
    int64_t T, N, K;
    int y_f32, accumulate;
    int ok;                      /* 0: cuBLASLt has nothing for this shape */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

struct dg_fp8_lt {
    cublasLtHandle_t h;
    cudaStream_t stream;
    int dev;
    void *ws;
    int next;                    /* the slot a new shape takes when all are used */
    struct lt_plan plans[LT_PLANS];
};

static void plan_free(struct lt_plan *p)
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

extern "C" int dg_fp8_lt_create(int dev, dg_stream_t stream, struct dg_fp8_lt **out,
                                struct dg_error *err)
{
    struct dg_fp8_lt *lt = (struct dg_fp8_lt *)calloc(1, sizeof *lt);
    int rc = 0;
    *out = NULL;
    if (!lt)
        return dg_error_set(err, DG_E_NOMEM, "GPU %d: out of memory", dev);
    lt->dev = dev;
    lt->stream = (cudaStream_t)stream;
    DG_CUBLAS_CHECK(cublasLtCreate(&lt->h));
    DG_CUDA_CHECK(cudaMalloc(&lt->ws, LT_WORKSPACE));
    *out = lt;
    lt = NULL;
out:
    dg_fp8_lt_destroy(lt);
    return rc;
}

extern "C" void dg_fp8_lt_destroy(struct dg_fp8_lt *lt)
{
    if (!lt)
        return;
    for (int i = 0; i < LT_PLANS; i++)
        plan_free(&lt->plans[i]);
    if (lt->h)
        cublasLtDestroy(lt->h);
    cudaFree(lt->ws);
    free(lt);
}

/* Descriptors for p's shape and cuBLASLt's first-choice algorithm:
 * p->ok 1 when there is one.  Errors (DG_E_CUBLAS) only from creating the
 * descriptors; no algorithm is not an error here. */
static int plan_make(struct dg_fp8_lt *lt, struct lt_plan *p, struct dg_error *err)
{
    const int dev = lt->dev;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const cudaDataType_t yt = p->y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const size_t ws = LT_WORKSPACE;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0, rc = 0;
    memset(&res, 0, sizeof res);
    DG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                   sizeof ta));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                   sizeof tb));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                   &outer, sizeof outer));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                   &outer, sizeof outer));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                               (uint64_t)p->N, p->K));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                               (uint64_t)p->T, p->K));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, yt, (uint64_t)p->N, (uint64_t)p->T, p->N));
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* (a status other than success means no algorithm, as 0 results does) */
    if (cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->a, p->b, p->c, p->c, pref, 1, &res,
                                       &found) == CUBLAS_STATUS_SUCCESS &&
        found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res.algo;
        p->ok = 1;
    }
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return rc;
}

/* The kept plan for this shape, or a new one in a free (else the next)
 * slot.  Errors as plan_make. */
static int plan_get(struct dg_fp8_lt *lt, int64_t T, int64_t N, int64_t K, int y_f32,
                    int accumulate, struct lt_plan **out, struct dg_error *err)
{
    struct lt_plan *p = NULL;
    int rc;
    for (int i = 0; i < LT_PLANS; i++) {
        struct lt_plan *q = &lt->plans[i];
        if (q->used && q->T == T && q->N == N && q->K == K && q->y_f32 == y_f32 &&
            q->accumulate == accumulate) {
            *out = q;
            return 0;
        }
        if (!q->used && !p)
            p = q;
    }
    if (!p) {
        p = &lt->plans[lt->next];
        lt->next = (lt->next + 1) % LT_PLANS;
        plan_free(p);
    }
    p->used = 1;
    p->T = T, p->N = N, p->K = K, p->y_f32 = y_f32, p->accumulate = accumulate;
    if ((rc = plan_make(lt, p, err)) < 0) {
        plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

extern "C" int dg_fp8_lt_gemm(struct dg_fp8_lt *lt, void *y, int y_f32, int accumulate,
                              const uint8_t *qa, const float *sa, const uint8_t *qw,
                              const float *sw, int64_t T, int64_t N, int64_t K,
                              struct dg_error *err)
{
    const int dev = lt->dev;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    struct lt_plan *p;
    cublasStatus_t s;
    int rc = 0;
    if (T < 0 || N < 8 || N % 8 || K < 16 || K % 16 || T > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: FP8 matmul (cuBLASLt): [%lld x %lld] by "
                            "[%lld x %lld] (K a multiple of 16, N of 8)", dev, (long long)T,
                            (long long)K, (long long)N, (long long)K);
    if (T == 0)
        return 0;
    if ((rc = plan_get(lt, T, N, K, y_f32, !!accumulate, &p, err)) < 0)
        return rc;
    if (!p->ok)
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: cuBLASLt has no FP8 algorithm with "
                            "per-row scales for [%lld x %lld] by [%lld x %lld]", dev,
                            (long long)T, (long long)K, (long long)N, (long long)K);
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                   &sw, sizeof sw));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                   &sa, sizeof sa));
    s = cublasLtMatmul(lt->h, p->op, &alpha, qw, p->a, qa, p->b, &beta, y, p->c, y, p->c,
                       &p->algo, lt->ws, LT_WORKSPACE, lt->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        /* the heuristic offered it and the call refuses it (cuBLASLt says
         * INVALID_VALUE for a scale mode it does not take with these
         * types): this shape never again */
        p->ok = 0;
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: cuBLASLt refused its FP8 algorithm "
                            "for [%lld x %lld] by [%lld x %lld] (%s)", dev, (long long)T,
                            (long long)K, (long long)N, (long long)K, cublasGetStatusName(s));
    }
    DG_CUBLAS_CHECK(s);
out:
    return rc;
}
