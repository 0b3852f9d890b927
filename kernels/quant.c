/* quant.c: GGML type table (names, block geometry), overflow-checked sizing,
 * fp16/bf16 conversions and the reference dequantizers for the supported types. */
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/dp.h"

typedef struct qtype_info {
    const char *name;
    uint32_t elems; /* elements per block; 0 = unknown id */
    uint32_t bytes; /* bytes per block */
    bool dequant;   /* quant_dequant_row handles it */
} qtype_info;

/* Geometry from ggml-common.h's block structs (sizes checked against its
 * static_asserts). Ids 4, 5 and 31-33, 36-38 were removed from ggml and stay
 * unknown; so are ids added after MXFP4, whose layouts are not settled. */
static const qtype_info g_types[DP_TYPE_COUNT] = {
    [DP_TYPE_F32] = {"F32", 1, 4, true},
    [DP_TYPE_F16] = {"F16", 1, 2, true},
    [DP_TYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [DP_TYPE_Q4_1] = {"Q4_1", 32, 20, true},
    [DP_TYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [DP_TYPE_Q5_1] = {"Q5_1", 32, 24, true},
    [DP_TYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [DP_TYPE_Q8_1] = {"Q8_1", 32, 36, true},
    [DP_TYPE_Q2_K] = {"Q2_K", 256, 84, true},
    [DP_TYPE_Q3_K] = {"Q3_K", 256, 110, true},
    [DP_TYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [DP_TYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [DP_TYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [DP_TYPE_Q8_K] = {"Q8_K", 256, 292, true},
    [DP_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, false},
    [DP_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [DP_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, false},
    [DP_TYPE_IQ1_S] = {"IQ1_S", 256, 50, false},
    [DP_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true},
    [DP_TYPE_IQ3_S] = {"IQ3_S", 256, 110, false},
    [DP_TYPE_IQ2_S] = {"IQ2_S", 256, 82, false},
    [DP_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136, true},
    [DP_TYPE_I8] = {"I8", 1, 1, false},
    [DP_TYPE_I16] = {"I16", 1, 2, false},
    [DP_TYPE_I32] = {"I32", 1, 4, false},
    [DP_TYPE_I64] = {"I64", 1, 8, false},
    [DP_TYPE_F64] = {"F64", 1, 8, false},
    [DP_TYPE_IQ1_M] = {"IQ1_M", 256, 56, false},
    [DP_TYPE_BF16] = {"BF16", 1, 2, true},
    [34] = {"TQ1_0", 256, 54, false},
    [35] = {"TQ2_0", 256, 66, false},
    [39] = {"MXFP4", 32, 17, false},
};

static const qtype_info *type_info(uint32_t type)
{
    if (type >= DP_TYPE_COUNT || g_types[type].elems == 0)
        return NULL;
    return &g_types[type];
}

const char *quant_type_name(uint32_t type)
{
    /* Thread-local so two threads formatting errors do not share the text. */
    static _Thread_local char buf[32];
    const qtype_info *ti = type_info(type);
    if (ti)
        return ti->name;
    snprintf(buf, sizeof buf, "unknown(%u)", type);
    return buf;
}

bool quant_type_known(uint32_t type) { return type_info(type) != NULL; }

bool quant_type_supported(uint32_t type)
{
    const qtype_info *ti = type_info(type);
    return ti && ti->dequant;
}

uint32_t quant_block_elems(uint32_t type)
{
    const qtype_info *ti = type_info(type);
    return ti ? ti->elems : 0;
}

uint32_t quant_block_bytes(uint32_t type)
{
    const qtype_info *ti = type_info(type);
    return ti ? ti->bytes : 0;
}

int quant_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes)
{
    const qtype_info *ti = type_info(type);
    if (!ti || n % ti->elems != 0)
        return DP_EINVAL;
    uint64_t blocks = n / ti->elems;
    if (blocks > UINT64_MAX / ti->bytes)
        return DP_ERANGE;
    *bytes = blocks * ti->bytes;
    return 0;
}

/* ---- fp16 / bf16 ------------------------------------------------------- */

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free so that loops over it vectorize: shifting the half's exponent and
 * mantissa into a float and scaling by 2^112 rebiases normals and turns half
 * subnormals into the right normal float exactly; inf/nan get the all-ones
 * exponent with the mantissa (nan payload) kept. */
static inline float fp16_to_f32_inline(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t bits = em << 13;
    float f = u2f(bits) * 0x1p112f;
    uint32_t r = em >= 0x7c00u ? (bits | 0x7f800000u) : f2u(f);
    return u2f(r | sign);
}

float dp_fp16_to_f32(uint16_t h) { return fp16_to_f32_inline(h); }

uint16_t dp_f32_to_fp16(float f)
{
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: keep it quiet and keep what fits of the payload. */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    if (x >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return sign | 0x7c00u;
    if (x < 0x38800000u) {
        /* Result is a half subnormal (or zero): adding 0.5 puts the value's
         * bits at the float ulp of 2^-24, so the FPU does the even rounding. */
        float t = u2f(x) + 0.5f;
        return (uint16_t)(sign | (f2u(t) - 0x3f000000u));
    }
    /* Normal: rebias the exponent (-112) and round to nearest even on bit 13. */
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;
    return (uint16_t)(sign | (x >> 13));
}

static inline float bf16_to_f32_inline(uint16_t h) { return u2f((uint32_t)h << 16); }

float dp_bf16_to_f32(uint16_t h) { return bf16_to_f32_inline(h); }

uint16_t dp_f32_to_bf16(float f)
{
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, never rounds to inf */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- block decoders ---------------------------------------------------- */
/* Blocks are read byte-wise (no struct casts): the blocks in a file are not
 * aligned, and byte reads keep this free of strict-aliasing concerns. Each
 * decoder works on one block with fixed trip counts so gcc vectorizes it. */

static inline float rd_h(const uint8_t *p) { return fp16_to_f32_inline((uint16_t)(p[0] | (p[1] << 8))); }

static inline float rd_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void deq_q4_0(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = rd_h(b);
        const uint8_t *restrict qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((int)(qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = rd_h(b);
        const float m = rd_h(b + 2);
        const uint8_t *restrict qs = b + 4;
        /* Two passes of 16 (one vector each) rather than one interleaved pass. */
        for (int j = 0; j < 16; j++)
            y[j] = (float)(qs[j] & 0x0f) * d + m;
        for (int j = 0; j < 16; j++)
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void deq_q5_0(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = rd_h(b);
        const uint32_t qh = rd_u32(b + 2);
        const uint8_t *restrict qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (int)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4));
            int hi = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

static void deq_q5_1(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = rd_h(b);
        const float m = rd_h(b + 2);
        const uint32_t qh = rd_u32(b + 4);
        const uint8_t *restrict qs = b + 8;
        for (int j = 0; j < 16; j++) {
            uint32_t lo = (qs[j] & 0x0fu) | (((qh >> j) & 1u) << 4);
            uint32_t hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        }
    }
}

static void deq_q8_0(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = rd_h(b);
        const int8_t *restrict qs = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++)
            y[j] = (float)qs[j] * d;
    }
}

static void deq_q8_1(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    /* The second half (s = d * sum(qs)) only serves dot products. */
    for (int64_t i = 0; i < nb; i++, b += 36, y += 32) {
        const float d = rd_h(b);
        const int8_t *restrict qs = (const int8_t *)(b + 4);
        for (int j = 0; j < 32; j++)
            y[j] = (float)qs[j] * d;
    }
}

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
 * Each qs byte holds four 2-bit values, for elements 32 apart. */
static void deq_q2_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 84, y += 256) {
        const uint8_t *sc = b;
        const uint8_t *qs = b + 16;
        const float d = rd_h(b + 80);
        const float dmin = rd_h(b + 82);
        for (int half = 0; half < 2; half++) {
            const uint8_t *q = qs + 32 * half;
            for (int s = 0; s < 4; s++) {
                for (int g = 0; g < 2; g++) {
                    uint8_t scm = sc[half * 8 + s * 2 + g];
                    float dl = d * (float)(scm & 0x0f);
                    float ml = dmin * (float)(scm >> 4);
                    float *out = y + half * 128 + s * 32 + g * 16;
                    for (int l = 0; l < 16; l++)
                        out[l] = dl * (float)((q[g * 16 + l] >> (2 * s)) & 3) - ml;
                }
            }
        }
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales, biased by 32), d.
 * Scale j: low 4 bits from byte j (j < 8) or the high nibble of byte j-8;
 * high 2 bits from byte 8 + j%4 at bit 2*(j/4). */
static void deq_q3_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 110, y += 256) {
        const uint8_t *hm = b;
        const uint8_t *qs = b + 32;
        const uint8_t *sb = b + 96;
        const float d = rd_h(b + 108);
        int scales[16];
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? (sb[j] & 0x0f) : (sb[j - 8] >> 4);
            int hi = (sb[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            scales[j] = (lo | (hi << 4)) - 32;
        }
        for (int half = 0; half < 2; half++) {
            const uint8_t *q = qs + 32 * half;
            for (int s = 0; s < 4; s++) {
                const unsigned hbit = 1u << (half * 4 + s);
                for (int g = 0; g < 2; g++) {
                    float dl = d * (float)scales[half * 8 + s * 2 + g];
                    float *out = y + half * 128 + s * 32 + g * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = (q[g * 16 + l] >> (2 * s)) & 3;
                        v -= (hm[g * 16 + l] & hbit) ? 0 : 4;
                        out[l] = dl * (float)v;
                    }
                }
            }
        }
    }
}

/* Q4_K/Q5_K scales: eight 6-bit (scale, min) pairs packed in 12 bytes. */
static inline void kq_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K and Q5_K: d, dmin, 6-bit scales and mins for 8 sub-blocks of 32,
 * then (Q5_K only) qh[32], each byte the fifth bit of 8 values, then qs[128]
 * (low 4 bits). high: the Q5_K layout. */
static void deq_q45_k(const uint8_t *restrict b, float *restrict y, int64_t nb, bool high)
{
    const int64_t stride = high ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, b += stride, y += 256) {
        const float d = rd_h(b);
        const float dmin = rd_h(b + 2);
        const uint8_t *sc = b + 4;
        const uint8_t *qh = b + 16;
        const uint8_t *q = b + (high ? 48 : 16);
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t s0, m0, s1, m1;
            kq_scale_min(2 * c, sc, &s0, &m0);
            kq_scale_min(2 * c + 1, sc, &s1, &m1);
            const float d0 = d * (float)s0, n0 = dmin * (float)m0;
            const float d1 = d * (float)s1, n1 = dmin * (float)m1;
            float *out = y + 64 * c;
            for (int l = 0; l < 32; l++) {
                int lo = q[l] & 0x0f, hi = q[l] >> 4;
                if (high) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                out[l] = d0 * (float)lo - n0;
                out[l + 32] = d1 * (float)hi - n1;
            }
        }
    }
}

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d. */
static void deq_q6_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 210, y += 256) {
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = rd_h(b + 208);
        for (int h = 0; h < 2; h++) {
            const uint8_t *l4 = ql + 64 * h;
            const uint8_t *h2 = qh + 32 * h;
            const int8_t *s = sc + 8 * h;
            float *out = y + 128 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((l4[l] & 0x0f) | ((h2[l] & 3) << 4)) - 32;
                int q2 = ((l4[l + 32] & 0x0f) | (((h2[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
                out[l] = d * (float)s[is] * (float)q1;
                out[l + 32] = d * (float)s[is + 2] * (float)q2;
                out[l + 64] = d * (float)s[is + 4] * (float)q3;
                out[l + 96] = d * (float)s[is + 6] * (float)q4;
            }
        }
    }
}

/* IQ4_NL and IQ4_XS: each nibble indexes 16 non-uniform levels. */
const int8_t quant_iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

static void deq_iq4_nl(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = rd_h(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)quant_iq4nl_levels[b[2 + j] & 0x0f];
            y[j + 16] = d * (float)quant_iq4nl_levels[b[2 + j] >> 4];
        }
    }
}

/* IQ4_XS: d, then each 32-value sub-block's 6-bit scale (bias 32): low 4
 * bits in scales_l (2 per byte), high 2 in scales_h; nibbles as IQ4_NL's. */
static void deq_iq4_xs(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 136) {
        const float d = rd_h(b);
        const uint32_t sh = (uint32_t)(b[2] | (b[3] << 8));
        const uint8_t *qs = b + 8;
        for (int s = 0; s < 8; s++, y += 32, qs += 16) {
            const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0x0f) | (int)(((sh >> (2 * s)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quant_iq4nl_levels[qs[j] & 0x0f];
                y[j + 16] = dl * (float)quant_iq4nl_levels[qs[j] >> 4];
            }
        }
    }
}

static void deq_q8_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 292, y += 256) {
        const float d = rd_f32(b);
        const int8_t *restrict qs = (const int8_t *)(b + 4);
        for (int j = 0; j < 256; j++)
            y[j] = d * (float)qs[j];
    }
}

static void deq_f16(const uint8_t *restrict b, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = fp16_to_f32_inline((uint16_t)(b[2 * i] | (b[2 * i + 1] << 8)));
}

static void deq_bf16(const uint8_t *restrict b, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = bf16_to_f32_inline((uint16_t)(b[2 * i] | (b[2 * i + 1] << 8)));
}

/* ---- Quantization (the KV cache's q8_0 / q4_0 rows) ---------------------- */

static inline void wr_h(uint8_t *p, float x)
{
    uint16_t h = dp_f32_to_fp16(x);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* Nearest integer of x (ties away from zero), clamped to [lo, hi]; the
 * clamp comes before the cast, which is undefined out of int's range. */
static inline int q_round(float x, int lo, int hi)
{
    if (x != x) /* NaN (a non-finite block's scale): 0, not an undefined cast */
        return 0;
    if (x <= (float)lo)
        return lo;
    if (x >= (float)hi)
        return hi;
    int q = (int)(x < 0.0f ? x - 0.5f : x + 0.5f);
    return q < lo ? lo : q > hi ? hi : q;
}

/* Q8_0: d = max|x| / 127, q = x / d. The values are divided by the scale
 * as stored (f16), so that dequantization multiplies back by exactly the
 * divisor used. */
static void quant_q8_0(const float *restrict x, uint8_t *restrict b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 34, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        wr_h(b, amax / 127.0f);
        const float d = rd_h(b), id = d > 0.0f ? 1.0f / d : 0.0f;
        int8_t *restrict qs = (int8_t *)(b + 2);
        for (int j = 0; j < 32; j++)
            qs[j] = (int8_t)q_round(x[j] * id, -127, 127);
    }
}

/* Q4_0: 16 levels q - 8 for q in 0..15; the value of largest magnitude maps
 * to -8 (d takes the opposite sign), so its side gets the extra level. */
static void quant_q4_0(const float *restrict x, uint8_t *restrict b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 18, x += 32) {
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                m = x[j];
            }
        wr_h(b, m / -8.0f);
        const float d = rd_h(b), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *restrict qs = b + 2;
        for (int j = 0; j < 16; j++) {
            int lo = q_round(x[j] * id, -8, 7) + 8, hi = q_round(x[j + 16] * id, -8, 7) + 8;
            qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quant_asym_roundtrip(float *x, int32_t n, int32_t stride, int bits)
{
    if (n <= 0 || bits < 1 || bits > 8)
        return;
    float lo = x[0], hi = x[0];
    for (int32_t i = 1; i < n; i++) {
        const float v = x[(size_t)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    const int top = (1 << bits) - 1;
    /* The minimum and the scale as stored (f16), the values divided by the
     * stored scale: dequantization adds back exactly what was taken. */
    const float m = dp_fp16_to_f32(dp_f32_to_fp16(lo));
    const float d = dp_fp16_to_f32(dp_f32_to_fp16((hi - m) / (float)top));
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int32_t i = 0; i < n; i++) {
        float *v = &x[(size_t)i * stride];
        *v = m + (float)q_round((*v - m) * id, 0, top) * d;
    }
}

/* The f16 minimum and scale of n values at a stride (quant_asym_roundtrip's
 * rounding), and their codes. */
static void asym4(const float *x, int32_t n, int32_t stride, uint16_t *dh, uint16_t *mh, uint8_t *q)
{
    float lo = x[0], hi = x[0];
    for (int32_t i = 1; i < n; i++) {
        const float v = x[(size_t)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    *mh = dp_f32_to_fp16(lo);
    const float m = dp_fp16_to_f32(*mh);
    *dh = dp_f32_to_fp16((hi - m) / 15.0f);
    const float d = dp_fp16_to_f32(*dh), id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int32_t i = 0; i < n; i++)
        q[i] = (uint8_t)q_round((x[(size_t)i * stride] - m) * id, 0, 15);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

void kivi_quant_k(const float *k, int32_t g, int32_t head_dim, uint8_t *dst)
{
    uint8_t q[256];
    uint8_t *codes = dst + (size_t)head_dim * 4;
    for (int32_t c = 0; c < head_dim; c++) {
        uint16_t dh, mh;
        asym4(k + c, g, head_dim, &dh, &mh, q);
        put16(dst + (size_t)c * 2, dh);
        put16(dst + (size_t)(head_dim + c) * 2, mh);
        uint8_t *row = codes + (size_t)c * (size_t)(g / 2);
        for (int32_t j = 0; j < g / 2; j++)
            row[j] = (uint8_t)(q[2 * j] | q[2 * j + 1] << 4);
    }
}

void kivi_quant_vrow(const float *v, int32_t head_dim, uint8_t *dst)
{
    uint8_t q[KIVI_VGROUP];
    uint8_t *codes = dst + (size_t)head_dim / KIVI_VGROUP * 4;
    for (int32_t c0 = 0; c0 < head_dim; c0 += KIVI_VGROUP) {
        uint16_t dh, mh;
        asym4(v + c0, KIVI_VGROUP, 1, &dh, &mh, q);
        put16(dst + (size_t)c0 / KIVI_VGROUP * 4, dh);
        put16(dst + (size_t)c0 / KIVI_VGROUP * 4 + 2, mh);
        for (int32_t j = 0; j < KIVI_VGROUP / 2; j++)
            codes[c0 / 2 + j] = (uint8_t)(q[2 * j] | q[2 * j + 1] << 4);
    }
}

void kivi_dequant_k(const uint8_t *src, int32_t g, int32_t head_dim, int32_t t0, int32_t n,
                    float *rows)
{
    const uint8_t *codes = src + (size_t)head_dim * 4;
    for (int32_t c = 0; c < head_dim; c++) {
        const float d = dp_fp16_to_f32(get16(src + (size_t)c * 2));
        const float m = dp_fp16_to_f32(get16(src + (size_t)(head_dim + c) * 2));
        const uint8_t *row = codes + (size_t)c * (size_t)(g / 2);
        for (int32_t t = t0; t < t0 + n; t++) {
            const int q = row[t / 2] >> (4 * (t & 1)) & 15;
            rows[(size_t)(t - t0) * (size_t)head_dim + (size_t)c] = m + (float)q * d;
        }
    }
}

void kivi_dequant_vrow(const uint8_t *src, int32_t head_dim, float *dst)
{
    const uint8_t *codes = src + (size_t)head_dim / KIVI_VGROUP * 4;
    for (int32_t c = 0; c < head_dim; c++) {
        const uint8_t *sm = src + (size_t)(c / KIVI_VGROUP) * 4;
        const float d = dp_fp16_to_f32(get16(sm)), m = dp_fp16_to_f32(get16(sm + 2));
        dst[c] = m + (float)(codes[c / 2] >> (4 * (c & 1)) & 15) * d;
    }
}

int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n)
{
    if (n < 0 || n % 32 != 0)
        return DP_EINVAL;
    switch (type) {
    case DP_TYPE_Q8_0: quant_q8_0(src, dst, n / 32); return 0;
    case DP_TYPE_Q4_0: quant_q4_0(src, dst, n / 32); return 0;
    default: return DP_EUNSUPPORTED;
    }
}

int quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const qtype_info *ti = type_info(type);
    if (!ti)
        return DP_EINVAL;
    if (!ti->dequant)
        return DP_EUNSUPPORTED;
    if (n < 0 || n % ti->elems != 0)
        return DP_EINVAL;
    const uint8_t *b = src;
    int64_t nb = n / ti->elems;
    switch (type) {
    case DP_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case DP_TYPE_F16: deq_f16(b, dst, n); break;
    case DP_TYPE_BF16: deq_bf16(b, dst, n); break;
    case DP_TYPE_Q4_0: deq_q4_0(b, dst, nb); break;
    case DP_TYPE_Q4_1: deq_q4_1(b, dst, nb); break;
    case DP_TYPE_Q5_0: deq_q5_0(b, dst, nb); break;
    case DP_TYPE_Q5_1: deq_q5_1(b, dst, nb); break;
    case DP_TYPE_Q8_0: deq_q8_0(b, dst, nb); break;
    case DP_TYPE_Q8_1: deq_q8_1(b, dst, nb); break;
    case DP_TYPE_Q2_K: deq_q2_k(b, dst, nb); break;
    case DP_TYPE_Q3_K: deq_q3_k(b, dst, nb); break;
    case DP_TYPE_Q4_K: deq_q45_k(b, dst, nb, false); break;
    case DP_TYPE_Q5_K: deq_q45_k(b, dst, nb, true); break;
    case DP_TYPE_Q6_K: deq_q6_k(b, dst, nb); break;
    case DP_TYPE_Q8_K: deq_q8_k(b, dst, nb); break;
    case DP_TYPE_IQ4_NL: deq_iq4_nl(b, dst, nb); break;
    case DP_TYPE_IQ4_XS: deq_iq4_xs(b, dst, nb); break;
    default: return DP_EUNSUPPORTED;
    }
    return 0;
}
