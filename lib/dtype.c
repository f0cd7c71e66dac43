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

uint16_t dg_f32_to_f16(float f)
{
    uint32_t u, sign, exp, man;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 16) & 0x8000u;
    exp = (u >> 23) & 0xffu;
    man = u & 0x7fffffu;

    if (exp == 0xff) /* inf or NaN (keep NaN quiet and non-zero) */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    if (exp > 112) { /* normal in f32, at least 2^-14: normal half or overflow */
        uint32_t e = exp - 112, m = man >> 13, rest = man & 0x1fffu;
        uint32_t h = (e << 10) | m;
        if (rest > 0x1000u || (rest == 0x1000u && (m & 1u)))
            h++; /* may carry into the exponent, and into inf: both correct */
        if (e >= 31)
            return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | (h > 0x7c00u ? 0x7c00u : h));
    }
    if (exp < 102) /* below half the smallest subnormal: zero */
        return (uint16_t)sign;
    {
        /* subnormal half: value = m * 2^-24 with m = (1.man) * 2^(exp-127+24) */
        uint32_t full = man | 0x800000u, shift = 126 - exp; /* 14..24 */
        uint32_t m = full >> shift, rest = full & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (m & 1u)))
            m++;
        return (uint16_t)(sign | m);
    }
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
