/* fp8-lt.cu - the single-group W8A8 product through cuBLASLt (fp8-lt.h).
 *
 * cuBLASLt is column-major; our matrices are row-major, so the product is
 * computed transposed: Y^T [N x T] = op(A) B with A = qw seen as a [K x N]
 * column-major matrix (ld K) and op(A) = A^T, B = qa seen as [K x T]
 * (ld K), D = C = Y seen as [N x T] (ld N): the "TN" layout FP8 requires.
 *
 * Two ways to apply the scales, per shape, the first cuBLASLt has an
 * algorithm for:
 *   outer  the "outer vector" scale modes: cuBLASLt multiplies element
 *          (i, j) of op(A) B by the i-th A scale (sw: one per weight row
 *          n) and the j-th B scale (sa: one per token t) itself;
 *   unit   FP8 with unit scales into an fp32 scratch S = qa qw^T, rows
 *          of at most `chunk` tokens at a time, then a pass
 *              Y[t, n] (+)= S[t, n] * sa[t] * sw[n]
 *          (lt_scale4_kernel, four columns a thread; lt_scale_kernel where
 *          the shape or alignment does not allow it) rounding once to Y's
 *          type.  It costs one write and one read of S in fp32, and works
 *          where the outer modes do not.  dg_fp8_lt_product takes it
 *          always (its caller applies the scales).
 * (Until run 251 the heuristic was asked with the scale pointers unset,
 * which cuBLASLt 13.1 answers with "unsupported value": every shape went
 * the unit way.) */
#include "kernels/fp8-lt.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda-check.h"

#define LT_WORKSPACE ((size_t)32 << 20)
#define LT_SCRATCH_FLOATS ((int64_t)16 << 20) /* 64 MB: the unit mode's S */
#define LT_PLANS 48

enum { LT_NONE, LT_OUTER, LT_UNIT };

/* One shape's descriptors and chosen algorithm(s).  Unit mode: b, c and
 * algo for chunks of `chunk` tokens, b2, c2 and algo2 for the last,
 * shorter one (when T is not a multiple of chunk). */
struct lt_plan {
    int used;
    int64_t T, N, K;
    int y_f32, accumulate;
    int unit_only;               /* dg_fp8_lt_product's: never the outer modes */
    int mode;                    /* LT_NONE: cuBLASLt has nothing for this shape */
    int64_t chunk;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c, b2, c2;
    cublasLtMatmulAlgo_t algo, algo2;
};

struct dg_fp8_lt {
    cublasLtHandle_t h;
    cudaStream_t stream;
    int dev;
    unsigned flags;
    void *ws;
    float *scratch;              /* LT_SCRATCH_FLOATS */
    int next;                    /* the slot a new shape takes when all are used */
    struct lt_plan plans[LT_PLANS];
};

static void plan_free(struct lt_plan *p)
{
    const cublasLtMatrixLayout_t layouts[] = {p->a, p->b, p->c, p->b2, p->c2};
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i])
            cublasLtMatrixLayoutDestroy(layouts[i]);
    memset(p, 0, sizeof *p);
}

extern "C" int dg_fp8_lt_create(int dev, dg_stream_t stream, unsigned flags,
                                struct dg_fp8_lt **out, struct dg_error *err)
{
    struct dg_fp8_lt *lt = (struct dg_fp8_lt *)calloc(1, sizeof *lt);
    int rc = 0;
    *out = NULL;
    if (!lt)
        return dg_error_set(err, DG_E_NOMEM, "GPU %d: out of memory", dev);
    lt->dev = dev;
    lt->stream = (cudaStream_t)stream;
    lt->flags = flags;
    DG_CUBLAS_CHECK(cublasLtCreate(&lt->h));
    DG_CUDA_CHECK(cudaMalloc(&lt->ws, LT_WORKSPACE));
    DG_CUDA_CHECK(cudaMalloc(&lt->scratch, sizeof(float) * (size_t)LT_SCRATCH_FLOATS));
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
    cudaFree(lt->scratch);
    free(lt);
}

/* cuBLASLt's first-choice algorithm for op over layouts a, b, c (C = D):
 * 1 and *algo set, or 0 (no algorithm, or a status other than success,
 * which means the same here).  Errors (DG_E_CUBLAS) from the preference
 * object only. */
static int pick_algo(struct dg_fp8_lt *lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                     cublasLtMatmulAlgo_t *algo, struct dg_error *err)
{
    const int dev = lt->dev;
    const size_t ws = LT_WORKSPACE;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0, rc = 0;
    memset(&res, 0, sizeof res);
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    DG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    if (cublasLtMatmulAlgoGetHeuristic(lt->h, op, a, b, c, c, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        *algo = res.algo;
        rc = 1;
    }
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return rc;
}

/* The descriptors that both modes share: compute fp32, op(A) = A^T, and A
 * = qw as [K x N] (ld K). */
static int plan_common(struct dg_fp8_lt *lt, struct lt_plan *p, struct dg_error *err)
{
    const int dev = lt->dev;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int rc = 0;
    DG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                   sizeof ta));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                   sizeof tb));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                               (uint64_t)p->N, p->K));
out:
    return rc;
}

/* Outer mode for p's shape: p->mode LT_OUTER when cuBLASLt has an
 * algorithm (the descriptors are kept either way; plan_free frees them). */
static int plan_outer(struct dg_fp8_lt *lt, struct lt_plan *p, struct dg_error *err)
{
    const int dev = lt->dev;
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const cudaDataType_t yt = p->y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const float *stand_in = lt->scratch;
    int rc = 0;
    if ((rc = plan_common(lt, p, err)) < 0)
        goto out;
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                   &outer, sizeof outer));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                   &outer, sizeof outer));
    /* cuBLASLt 13.1's heuristic calls the outer modes an unsupported value
     * while the scale pointers are unset (run 251, H100): stand-ins here,
     * the call's own vectors set before each matmul */
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                   &stand_in, sizeof stand_in));
    DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                   &stand_in, sizeof stand_in));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                               (uint64_t)p->T, p->K));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, yt, (uint64_t)p->N, (uint64_t)p->T, p->N));
    if ((rc = pick_algo(lt, p->op, p->a, p->b, p->c, &p->algo, err)) < 0)
        goto out;
    if (rc == 1)
        p->mode = LT_OUTER;
    rc = 0;
out:
    return rc;
}

/* Unit mode for p's shape: chunks of as many tokens as the scratch holds
 * at N columns (all T if it holds them); p->mode LT_UNIT when cuBLASLt has
 * an algorithm for the chunk and for the last one. */
static int plan_unit(struct dg_fp8_lt *lt, struct lt_plan *p, struct dg_error *err)
{
    const int dev = lt->dev;
    int64_t tail;
    int rc = 0, ok;
    if (p->N > LT_SCRATCH_FLOATS)
        return 0;
    p->chunk = LT_SCRATCH_FLOATS / p->N < p->T ? LT_SCRATCH_FLOATS / p->N : p->T;
    tail = p->T % p->chunk;
    if ((rc = plan_common(lt, p, err)) < 0)
        goto out;
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                               (uint64_t)p->chunk, p->K));
    DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, (uint64_t)p->N,
                                               (uint64_t)p->chunk, p->N));
    if ((ok = pick_algo(lt, p->op, p->a, p->b, p->c, &p->algo, err)) < 0) {
        rc = ok;
        goto out;
    }
    if (ok && tail) {
        DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b2, CUDA_R_8F_E4M3, (uint64_t)p->K,
                                                   (uint64_t)tail, p->K));
        DG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c2, CUDA_R_32F, (uint64_t)p->N,
                                                   (uint64_t)tail, p->N));
        if ((ok = pick_algo(lt, p->op, p->a, p->b2, p->c2, &p->algo2, err)) < 0) {
            rc = ok;
            goto out;
        }
    }
    if (ok)
        p->mode = LT_UNIT;
out:
    return rc;
}

/* p's descriptors freed and made again for unit mode (its shape kept).
 * Errors as plan_unit. */
static int plan_to_unit(struct dg_fp8_lt *lt, struct lt_plan *p, struct dg_error *err)
{
    const struct lt_plan keep = *p;
    plan_free(p);
    p->used = 1;
    p->T = keep.T, p->N = keep.N, p->K = keep.K;
    p->y_f32 = keep.y_f32, p->accumulate = keep.accumulate, p->unit_only = keep.unit_only;
    return plan_unit(lt, p, err);
}

/* The kept plan for this shape, or a new one in a free (else the next)
 * slot: outer mode unless unit_only or flags say unit, else unit mode,
 * else none.  Errors (DG_E_CUBLAS) from creating descriptors. */
static int plan_get(struct dg_fp8_lt *lt, int64_t T, int64_t N, int64_t K, int y_f32,
                    int accumulate, int unit_only, struct lt_plan **out, struct dg_error *err)
{
    struct lt_plan *p = NULL;
    int rc;
    for (int i = 0; i < LT_PLANS; i++) {
        struct lt_plan *q = &lt->plans[i];
        if (q->used && q->T == T && q->N == N && q->K == K && q->y_f32 == y_f32 &&
            q->accumulate == accumulate && q->unit_only == unit_only) {
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
    p->unit_only = unit_only;
    rc = unit_only || lt->flags & DG_FP8_LT_UNIT_SCALES ? 0 : plan_outer(lt, p, err);
    if (rc >= 0 && p->mode == LT_NONE)
        rc = plan_to_unit(lt, p, err);
    if (rc < 0) {
        plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Y[t0 + t, n] = (accumulate ? Y[t0 + t, n] : 0) + S[t, n] * sa[t0 + t] *
 * sw[n] for t < rows, n < N, rounded once to Y's type (fp32, or bf16
 * round-to-nearest-even).  One thread an element, row-major. */
__global__ void lt_scale_kernel(void *y, int y_f32, int accumulate, const float *S,
                                const float *sa, const float *sw, int64_t t0, int64_t rows,
                                int64_t N)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * N)
        return;
    const int64_t t = i / N, n = i % N, o = (t0 + t) * N + n;
    float v = S[i] * sa[t0 + t] * sw[n];
    if (y_f32) {
        float *Y = (float *)y;
        Y[o] = accumulate ? Y[o] + v : v;
    } else {
        __nv_bfloat16 *Y = (__nv_bfloat16 *)y;
        if (accumulate)
            v += __bfloat162float(Y[o]);
        Y[o] = __float2bfloat16_rn(v);
    }
}

/* The same pass, four consecutive n a thread: grid (ceil(N / 1,024),
 * rows), no division; the same products in the same order (the same
 * bits).  N a multiple of 4, and S, Y and sw 16-byte aligned (8 for bf16
 * Y). */
__global__ void lt_scale4_kernel(void *y, int y_f32, int accumulate, const float *S,
                                 const float *sa, const float *sw, int64_t t0, int64_t N)
{
    const int64_t t = blockIdx.y;
    const int64_t n = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (n >= N)
        return;
    const float a = sa[t0 + t];
    const float4 s = *(const float4 *)(S + t * N + n), w = *(const float4 *)(sw + n);
    const int64_t o = (t0 + t) * N + n;
    float v[4] = {s.x * a * w.x, s.y * a * w.y, s.z * a * w.z, s.w * a * w.w};
    if (y_f32) {
        float4 *Y = (float4 *)((float *)y + o);
        if (accumulate) {
            const float4 p = *Y;
            v[0] = p.x + v[0], v[1] = p.y + v[1], v[2] = p.z + v[2], v[3] = p.w + v[3];
        }
        *Y = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        uint2 *Y = (uint2 *)((__nv_bfloat16 *)y + o);
        __nv_bfloat162 h[2];
        if (accumulate) {
            const uint2 p = *Y;
            const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&p.x);
            const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&p.y);
            v[0] += lo.x, v[1] += lo.y, v[2] += hi.x, v[3] += hi.y;
        }
        h[0] = __floats2bfloat162_rn(v[0], v[1]);
        h[1] = __floats2bfloat162_rn(v[2], v[3]);
        *Y = make_uint2(*(const uint32_t *)&h[0], *(const uint32_t *)&h[1]);
    }
}

/* cuBLASLt refused (status s) the unit-scale algorithm it offered for
 * p's shape, before writing anything: the shape never again (LT_NONE),
 * and DG_E_UNSUPPORTED so that the caller takes another way. */
static int refused(struct dg_fp8_lt *lt, struct lt_plan *p, cublasStatus_t s,
                   struct dg_error *err)
{
    p->mode = LT_NONE;
    return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: cuBLASLt refused its FP8 algorithm for "
                        "[%lld x %lld] by [%lld x %lld] (%s)", lt->dev, (long long)p->T,
                        (long long)p->K, (long long)p->N, (long long)p->K,
                        cublasGetStatusName(s));
}

/* Y[t, n] = bf16(S[t ld + n] * sa[t] * sw[n]) (the scaling pass's value,
 * the products in its order) for n < N: grid (ceil(N / 256), T). */
__global__ void lt_scale_rows_kernel(__nv_bfloat16 *y, const float *S, int64_t ld,
                                     const float *sa, const float *sw, int64_t N)
{
    const int64_t t = blockIdx.y, n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N)
        y[t * N + n] = __float2bfloat16_rn(S[t * ld + n] * sa[t] * sw[n]);
}

extern "C" int dg_fp8_lt_scale_rows(void *y, const float *S, int64_t ld, const float *sa,
                                    const float *sw, int64_t T, int64_t N, dg_stream_t stream,
                                    int dev, struct dg_error *err)
{
    int rc = 0;
    if (T < 0 || N < 1 || ld < N || T > 65535 || N > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: FP8 scaling pass: %lld rows of %lld, %lld "
                            "apart (at most 65,535 rows)", dev, (long long)T, (long long)N,
                            (long long)ld);
    if (T == 0)
        return 0;
    lt_scale_rows_kernel<<<dim3((unsigned)((N + 255) / 256), (unsigned)T), 256, 0,
                           (cudaStream_t)stream>>>((__nv_bfloat16 *)y, S, ld, sa, sw, N);
    DG_LAUNCH_CHECK();
out:
    return rc;
}

/* DG_E_INVAL (naming the call `what`) unless T >= t_min, N a multiple of
 * 8 and K of 16 (N >= 8, K >= 16), each below 2^31 */
static int check_shape(int dev, const char *what, int64_t t_min, int64_t T, int64_t N,
                       int64_t K, struct dg_error *err)
{
    if (T < t_min || N < 8 || N % 8 || K < 16 || K % 16 || T > 0x7fffffff || N > 0x7fffffff ||
        K > 0x7fffffff)
        return dg_error_set(err, DG_E_INVAL, "GPU %d: FP8 %s (cuBLASLt): [%lld x %lld] by "
                            "[%lld x %lld] (K a multiple of 16, N of 8)", dev, what,
                            (long long)T, (long long)K, (long long)N, (long long)K);
    return 0;
}

extern "C" int dg_fp8_lt_product(struct dg_fp8_lt *lt, const uint8_t *qa, const uint8_t *qw,
                                 int64_t T, int64_t N, int64_t K, const float **S,
                                 struct dg_error *err)
{
    const int dev = lt->dev;
    const float one = 1.0f, zero = 0.0f;
    struct lt_plan *p;
    cublasStatus_t s;
    int rc = 0;
    if ((rc = check_shape(dev, "product", 1, T, N, K, err)) < 0)
        return rc;
    /* the unit-scale plan a bf16 Y of this shape would take */
    if ((rc = plan_get(lt, T, N, K, 0, 0, 1, &p, err)) < 0)
        return rc;
    if (p->mode != LT_UNIT || p->chunk < T)
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: FP8 product (cuBLASLt): [%lld x "
                            "%lld] by [%lld x %lld] does not go in one unit-scale chunk", dev,
                            (long long)T, (long long)K, (long long)N, (long long)K);
    s = cublasLtMatmul(lt->h, p->op, &one, qw, p->a, qa, p->b, &zero, lt->scratch, p->c,
                       lt->scratch, p->c, &p->algo, lt->ws, LT_WORKSPACE, lt->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
        return refused(lt, p, s, err); /* (before anything was written) */
    DG_CUBLAS_CHECK(s);
    *S = lt->scratch;
out:
    return rc;
}

extern "C" int dg_fp8_lt_gemm(struct dg_fp8_lt *lt, void *y, int y_f32, int accumulate,
                              const uint8_t *qa, const float *sa, const uint8_t *qw,
                              const float *sw, int64_t T, int64_t N, int64_t K,
                              struct dg_error *err)
{
    const int dev = lt->dev;
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    struct lt_plan *p;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    int rc = 0;
    if ((rc = check_shape(dev, "matmul", 0, T, N, K, err)) < 0)
        return rc;
    if (T == 0)
        return 0;
    if ((rc = plan_get(lt, T, N, K, y_f32, !!accumulate, 0, &p, err)) < 0)
        return rc;
    if (p->mode == LT_NONE)
        return dg_error_set(err, DG_E_UNSUPPORTED, "GPU %d: cuBLASLt has no FP8 algorithm "
                            "for [%lld x %lld] by [%lld x %lld]", dev, (long long)T,
                            (long long)K, (long long)N, (long long)K);
    if (p->mode == LT_OUTER) {
        DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
        DG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
        s = cublasLtMatmul(lt->h, p->op, &one, qw, p->a, qa, p->b, &beta, y, p->c, y, p->c,
                           &p->algo, lt->ws, LT_WORKSPACE, lt->stream);
    } else {
        for (int64_t t0 = 0; t0 < T; t0 += p->chunk) {
            const int64_t rows = T - t0 < p->chunk ? T - t0 : p->chunk;
            const int last = rows < p->chunk;
            const int64_t n = rows * N;
            s = cublasLtMatmul(lt->h, p->op, &one, qw, p->a, qa + t0 * K, last ? p->b2 : p->b,
                               &zero, lt->scratch, last ? p->c2 : p->c, lt->scratch,
                               last ? p->c2 : p->c, last ? &p->algo2 : &p->algo, lt->ws,
                               LT_WORKSPACE, lt->stream);
            if (s != CUBLAS_STATUS_SUCCESS && t0 > 0)
                DG_CUBLAS_CHECK(s); /* (Y partly written: an error, not a fallback) */
            if (s != CUBLAS_STATUS_SUCCESS)
                break;
            if (N % 4 == 0 && rows <= 65535 && ((uintptr_t)y | (uintptr_t)sw) % 16 == 0)
                lt_scale4_kernel<<<dim3((unsigned)((N + 1023) / 1024), (unsigned)rows), 256, 0,
                                   lt->stream>>>(y, y_f32, accumulate, lt->scratch, sa, sw, t0,
                                                 N);
            else
                lt_scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, lt->stream>>>(
                    y, y_f32, accumulate, lt->scratch, sa, sw, t0, rows, N);
            DG_LAUNCH_CHECK();
        }
    }
    if ((s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) &&
        p->mode == LT_OUTER) {
        /* the heuristic offered it and the call refuses it (cuBLASLt says
         * INVALID_VALUE for a scale mode it does not take with these
         * types): this shape in unit mode from now on, and this call too
         * (nothing was written) */
        if ((rc = plan_to_unit(lt, p, err)) < 0) {
            plan_free(p);
            return rc;
        }
        if (p->mode == LT_UNIT)
            return dg_fp8_lt_gemm(lt, y, y_f32, accumulate, qa, sa, qw, sw, T, N, K, err);
    }
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
        return refused(lt, p, s, err); /* (in unit mode on its first chunk: nothing written) */
    DG_CUBLAS_CHECK(s);
out:
    return rc;
}

extern "C" const char *dg_fp8_lt_mode(struct dg_fp8_lt *lt, int64_t T, int64_t N, int64_t K,
                                      int y_f32, int accumulate)
{
    for (int i = 0; lt && i < LT_PLANS; i++) {
        const struct lt_plan *q = &lt->plans[i];
        if (q->used && !q->unit_only && q->T == T && q->N == N && q->K == K &&
            q->y_f32 == !!y_f32 && q->accumulate == !!accumulate)
            return q->mode == LT_OUTER ? "outer-vector scales"
                 : q->mode == LT_UNIT  ? "unit scales and a scaling pass"
                                       : "none";
    }
    return "not tried";
}
