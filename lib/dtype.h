/*
 * dtype.h - element types as safetensors names them, and bf16/f16 <-> f32.
 */
#ifndef DG_DTYPE_H
#define DG_DTYPE_H

#include <stdint.h>
#include <string.h>

enum dg_dtype {
    DG_DTYPE_INVALID = 0,
    DG_DTYPE_BOOL,
    DG_DTYPE_U8,
    DG_DTYPE_I8,
    DG_DTYPE_F8_E5M2,
    DG_DTYPE_F8_E4M3,
    DG_DTYPE_I16,
    DG_DTYPE_U16,
    DG_DTYPE_F16,
    DG_DTYPE_BF16,
    DG_DTYPE_I32,
    DG_DTYPE_U32,
    DG_DTYPE_F32,
    DG_DTYPE_F64,
    DG_DTYPE_I64,
    DG_DTYPE_U64,
    DG_DTYPE_COUNT
};

/* safetensors spelling ("BF16"), or "INVALID". */
const char *dg_dtype_name(enum dg_dtype t);

/* Parse a safetensors dtype string; DG_DTYPE_INVALID if unknown. */
enum dg_dtype dg_dtype_parse(const char *name);

/* Bytes per element; 0 for DG_DTYPE_INVALID. */
size_t dg_dtype_size(enum dg_dtype t);

/* True for the dtypes model weights may be stored in: BF16, F16, F32. */
int dg_dtype_is_float_weight(enum dg_dtype t);

static inline float dg_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t dg_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half -> float, exact (subnormals, inf, NaN included). */
float dg_f16_to_f32(uint16_t h);

/* float -> IEEE half, round to nearest even; overflow to inf; NaN stays NaN. */
uint16_t dg_f32_to_f16(float f);

/* Read element i of a float weight buffer of type t as f32.  t must satisfy
 * dg_dtype_is_float_weight(); other types return 0. */
float dg_load_f32(const void *data, enum dg_dtype t, size_t i);

#endif
