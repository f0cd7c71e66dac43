/* ref-matmul.c - y = x W^T over a weight in its stored dtype; see ref-ops.h. */
#include "lib/ref-ops.h"

#include <string.h>

#include "lib/fp8.h"
#include "lib/san-range.h"

/* The loops below are left uninstrumented by the sanitizers
 * (san-range.h); dg_ref_matmul and dg_ref_matmul_f64 check every range
 * they touch first (check_ranges). */

/* Row j of w as f32: the row itself for F32 weights, else converted into buf
 * (exactly, for BF16 and F16; E4M3 times the row's scale). */
DG_SAN_RANGE_CHECKED static const float *weight_row(const struct dg_weight *w, int64_t j,
                                                    float *buf)
{
    const size_t cols = (size_t)w->cols, stride = w->stride ? (size_t)w->stride : cols;
    const unsigned char *base = (const unsigned char *)w->data + (size_t)j * stride * dg_dtype_size(w->dtype);

    if (w->dtype == DG_DTYPE_F32)
        return (const float *)(const void *)base;
    if (w->dtype == DG_DTYPE_F8_E4M3) {
        /* e4m3 values times the row's (output channel's) scale */
        const float sc = dg_load_f32(w->scale, w->scale_dtype, (size_t)j);
        for (size_t i = 0; i < cols; i++)
            buf[i] = dg_e4m3_to_f32(base[i]) * sc;
        return buf;
    }
    if (w->dtype == DG_DTYPE_BF16) {
        size_t i = 0;
        /* eight at a time: a block the compiler widens at -O2 */
        for (; i + 8 <= cols; i += 8) {
            uint16_t h[8];
            memcpy(h, base + 2 * i, sizeof h);
            for (int k = 0; k < 8; k++)
                buf[i + k] = dg_bf16_to_f32(h[k]);
        }
        for (; i < cols; i++) {
            uint16_t h;
            memcpy(&h, base + 2 * i, 2);
            buf[i] = dg_bf16_to_f32(h);
        }
    } else {
        for (size_t i = 0; i < cols; i++)
            buf[i] = dg_load_f32(base, w->dtype, i);
    }
    return buf;
}

/* 8 independent partial sums: vectorisable, and closer to a pairwise sum. */
DG_SAN_RANGE_CHECKED static float dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    for (; i < n; i++)
        acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The ranges a product reads and writes: x [T x cols] floats, y [T x rows]
 * of y_size bytes each, row_buf (unless W is f32) and W's rows.  (E4M3
 * scales are read through dg_load_f32, which is instrumented.) */
static void check_ranges(void *y, size_t y_size, const float *x, int64_t T,
                         const struct dg_weight *w, float *row_buf)
{
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    const size_t stride = w->stride ? (size_t)w->stride : cols;

    dg_san_read(x, (size_t)T * cols * sizeof *x);
    dg_san_write(y, (size_t)T * rows * y_size);
    if (rows == 0)
        return;
    dg_san_read(w->data, ((rows - 1) * stride + cols) * dg_dtype_size(w->dtype));
    if (w->dtype != DG_DTYPE_F32)
        dg_san_write(row_buf, cols * sizeof *row_buf);
}

DG_SAN_RANGE_CHECKED static void matmul(float *y, const float *x, int64_t T,
                                        const struct dg_weight *w, float *row_buf)
{
    const int64_t rows = w->rows, cols = w->cols;

    for (int64_t j = 0; j < rows; j++) {
        const float *wr = weight_row(w, j, row_buf);
        for (int64_t t = 0; t < T; t++)
            y[t * rows + j] = dot(x + t * cols, wr, cols);
    }
}

void dg_ref_matmul(float *y, const float *x, int64_t T, const struct dg_weight *w, float *row_buf)
{
    check_ranges(y, sizeof *y, x, T, w, row_buf);
    matmul(y, x, T, w, row_buf);
}

DG_SAN_RANGE_CHECKED static void matmul_f64(double *y, const float *x, int64_t T,
                                            const struct dg_weight *w, float *row_buf)
{
    const int64_t rows = w->rows, cols = w->cols;

    for (int64_t j = 0; j < rows; j++) {
        const float *wr = weight_row(w, j, row_buf);
        int64_t t = 0;
        /* four rows of x side by side: each sum still runs i = 0, 1, ...
         * on its own (the same bits as one row at a time), and the four
         * chains overlap */
        for (; t + 4 <= T; t += 4) {
            const float *x0 = x + t * cols, *x1 = x0 + cols, *x2 = x1 + cols, *x3 = x2 + cols;
            double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int64_t i = 0; i < cols; i++) {
                const double wi = wr[i];
                a0 += (double)x0[i] * wi;
                a1 += (double)x1[i] * wi;
                a2 += (double)x2[i] * wi;
                a3 += (double)x3[i] * wi;
            }
            y[t * rows + j] = a0;
            y[(t + 1) * rows + j] = a1;
            y[(t + 2) * rows + j] = a2;
            y[(t + 3) * rows + j] = a3;
        }
        for (; t < T; t++) {
            const float *xt = x + t * cols;
            double acc = 0;
            for (int64_t i = 0; i < cols; i++)
                acc += (double)xt[i] * wr[i];
            y[t * rows + j] = acc;
        }
    }
}

void dg_ref_matmul_f64(double *y, const float *x, int64_t T, const struct dg_weight *w,
                       float *row_buf)
{
    check_ranges(y, sizeof *y, x, T, w, row_buf);
    matmul_f64(y, x, T, w, row_buf);
}
