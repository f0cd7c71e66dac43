/* dtype.c - see dtype.h. */
#include "lib/dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[DG_DTYPE_COUNT] = {
    [DG_DTYPE_INVALID] = {"INVALID", 0},
    [DG_DTYPE_BOOL] = {"BOOL", 1},
    [DG_DTYPE_U8] = {"U8", 1},
    [DG_DTYPE_I8] = {"I8", 1},
    [DG_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [DG_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DG_DTYPE_I16] = {"I16", 2},
    [DG_DTYPE_U16] = {"U16", 2},
    [DG_DTYPE_F16] = {"F16", 2},
    [DG_DTYPE_BF16] = {"BF16", 2},
    [DG_DTYPE_I32] = {"I32", 4},
    [DG_DTYPE_U32] = {"U32", 4},
    [DG_DTYPE_F32] = {"F32", 4},
    [DG_DTYPE_F64] = {"F64", 8},
    [DG_DTYPE_I64] = {"I64", 8},
    [DG_DTYPE_U64] = {"U64", 8},
};

const char *dg_dtype_name(enum dg_dtype t)
{
    if ((int)t < 0 || t >= DG_DTYPE_COUNT)
        return "INVALID";
    return dtype_info[t].name;
}

enum dg_dtype dg_dtype_parse(const char *name)
{
    for (int t = 1; t < DG_DTYPE_COUNT; t++)
        if (strcmp(name, dtype_info[t].name) == 0)
            return (enum dg_dtype)t;
    return DG_DTYPE_INVALID;
}

size_t dg_dtype_size(enum dg_dtype t)
{
    if ((int)t < 0 || t >= DG_DTYPE_COUNT)
        return 0;
    return dtype_info[t].size;
}

int dg_dtype_is_float_weight(enum dg_dtype t)
{
    return t == DG_DTYPE_BF16 || t == DG_DTYPE_F16 || t == DG_DTYPE_F32;
}

float dg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    float f;

    if (exp == 0x1f) {                      /* inf / NaN */
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {                  /* normal */
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {                  /* zero */
        u = sign;
    } else {                                /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

float dg_load_f32(const void *data, enum dg_dtype t, size_t i)
{
    uint16_t h;
    float f;

    switch (t) {
    case DG_DTYPE_F32:
        memcpy(&f, (const char *)data + 4 * i, 4);
        return f;
    case DG_DTYPE_BF16:
        memcpy(&h, (const char *)data + 2 * i, 2);
        return dg_bf16_to_f32(h);
    case DG_DTYPE_F16:
        memcpy(&h, (const char *)data + 2 * i, 2);
        return dg_f16_to_f32(h);
    default:
        return 0.0f;
    }
}
