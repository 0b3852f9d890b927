/* test_quant.c: type table and sizing, fp16/bf16 conversions, dequantization
 * of hand-built blocks, and bit-level agreement with gguf-py (golden file). */
#include <stdint.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "tools/synth_gguf.h"
#include "t.h"

#define GOLDEN_PATH "tests/golden/quant_golden.bin"

static void put_h(uint8_t *p, float f)
{
    uint16_t h = dp_f32_to_fp16(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference half decoding written independently of the library's trick. */
static double half_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_table(void)
{
    CHECK(strcmp(quant_type_name(DP_TYPE_Q4_1), "Q4_1") == 0);
    CHECK(strcmp(quant_type_name(DP_TYPE_BF16), "BF16") == 0);
    CHECK(strcmp(quant_type_name(DP_TYPE_IQ2_XXS), "IQ2_XXS") == 0);
    CHECK(strstr(quant_type_name(4), "4") != NULL);
    CHECK(strstr(quant_type_name(12345), "12345") != NULL);
    CHECK(!quant_type_known(4) && !quant_type_known(5) && !quant_type_known(31) && !quant_type_known(40));
    CHECK(!quant_type_known(UINT32_MAX));
    static const struct { uint32_t t, be, bb; bool sup; } g[] = {
        {DP_TYPE_F32, 1, 4, true},        {DP_TYPE_F16, 1, 2, true},       {DP_TYPE_Q4_0, 32, 18, true},
        {DP_TYPE_Q4_1, 32, 20, true},     {DP_TYPE_Q5_0, 32, 22, true},    {DP_TYPE_Q5_1, 32, 24, true},
        {DP_TYPE_Q8_0, 32, 34, true},     {DP_TYPE_Q8_1, 32, 36, true},    {DP_TYPE_Q2_K, 256, 84, true},
        {DP_TYPE_Q3_K, 256, 110, true},   {DP_TYPE_Q4_K, 256, 144, true},  {DP_TYPE_Q5_K, 256, 176, true},
        {DP_TYPE_Q6_K, 256, 210, true},   {DP_TYPE_Q8_K, 256, 292, true},  {DP_TYPE_IQ2_XXS, 256, 66, false},
        {DP_TYPE_IQ2_XS, 256, 74, false}, {DP_TYPE_IQ3_XXS, 256, 98, false}, {DP_TYPE_IQ1_S, 256, 50, false},
        {DP_TYPE_IQ4_NL, 32, 18, true},  {DP_TYPE_IQ3_S, 256, 110, false}, {DP_TYPE_IQ2_S, 256, 82, false},
        {DP_TYPE_IQ4_XS, 256, 136, true}, {DP_TYPE_I8, 1, 1, false},      {DP_TYPE_I16, 1, 2, false},
        {DP_TYPE_I32, 1, 4, false},       {DP_TYPE_I64, 1, 8, false},      {DP_TYPE_F64, 1, 8, false},
        {DP_TYPE_IQ1_M, 256, 56, false},  {DP_TYPE_BF16, 1, 2, true},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        CHECK_MSG(quant_type_known(g[i].t), "%s", quant_type_name(g[i].t));
        CHECK_EQ_INT(quant_block_elems(g[i].t), g[i].be);
        CHECK_EQ_INT(quant_block_bytes(g[i].t), g[i].bb);
        CHECK_MSG(quant_type_supported(g[i].t) == g[i].sup, "%s", quant_type_name(g[i].t));
    }
    CHECK_EQ_INT(quant_block_elems(4), 0);
    CHECK_EQ_INT(quant_block_bytes(99), 0);

    uint64_t b = 0;
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_F32, 10, &b), 0);
    CHECK_EQ_INT(b, 40);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_Q4_0, 64, &b), 0);
    CHECK_EQ_INT(b, 36);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_Q6_K, 512, &b), 0);
    CHECK_EQ_INT(b, 420);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_Q8_0, 0, &b), 0);
    CHECK_EQ_INT(b, 0);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_Q4_0, 33, &b), DP_EINVAL);
    CHECK_EQ_INT(quant_row_bytes(4, 32, &b), DP_EINVAL);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_F32, 1ull << 62, &b), DP_ERANGE);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_Q8_0, UINT64_MAX - 31, &b), DP_ERANGE);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_I8, UINT64_MAX, &b), 0);
    CHECK(b == UINT64_MAX);
    CHECK_EQ_INT(quant_row_bytes(DP_TYPE_F32, (1ull << 62) - 1, &b), 0);

    uint8_t blk[300] = {0};
    float out[256];
    CHECK_EQ_INT(quant_dequant_row(DP_TYPE_IQ2_XXS, blk, out, 256), DP_EUNSUPPORTED);
    CHECK_EQ_INT(quant_dequant_row(DP_TYPE_I32, blk, out, 4), DP_EUNSUPPORTED);
    CHECK_EQ_INT(quant_dequant_row(4, blk, out, 32), DP_EINVAL);
    CHECK_EQ_INT(quant_dequant_row(DP_TYPE_Q8_0, blk, out, 31), DP_EINVAL);
    CHECK_EQ_INT(quant_dequant_row(DP_TYPE_Q8_0, blk, out, -32), DP_EINVAL);
    CHECK_EQ_INT(quant_dequant_row(DP_TYPE_Q8_0, blk, out, 0), 0);
}

static void test_fp16(void)
{
    /* Every half decodes to its exact value and re-encodes to itself. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dp_fp16_to_f32((uint16_t)h);
        double r = half_ref((uint16_t)h);
        if (isnan(r)) {
            CHECK_MSG(isnan(f), "half 0x%04x", h);
            CHECK_MSG(isnan(dp_fp16_to_f32(dp_f32_to_fp16(f))), "half 0x%04x", h);
            continue;
        }
        CHECK_MSG((double)f == r && !signbit(f) == !signbit(r), "half 0x%04x: %g vs %g", h, f, r);
        CHECK_MSG(dp_f32_to_fp16(f) == h, "half 0x%04x round trip gives 0x%04x", h, dp_f32_to_fp16(f));
    }
    /* Rounding: nearest, ties to even, overflow to inf, underflow to 0. */
    CHECK_EQ_INT(dp_f32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(dp_f32_to_fp16(-2.0f), 0xc000);
    CHECK_EQ_INT(dp_f32_to_fp16(-0.0f), 0x8000);
    CHECK_EQ_INT(dp_f32_to_fp16(65504.0f), 0x7bff);
    CHECK_EQ_INT(dp_f32_to_fp16(65519.0f), 0x7bff);
    CHECK_EQ_INT(dp_f32_to_fp16(65520.0f), 0x7c00);
    CHECK_EQ_INT(dp_f32_to_fp16(1e30f), 0x7c00);
    CHECK_EQ_INT(dp_f32_to_fp16(-1e30f), 0xfc00);
    CHECK_EQ_INT(dp_f32_to_fp16(INFINITY), 0x7c00);
    CHECK_EQ_INT(dp_f32_to_fp16(-INFINITY), 0xfc00);
    CHECK((dp_f32_to_fp16(NAN) & 0x7c00) == 0x7c00 && (dp_f32_to_fp16(NAN) & 0x3ff));
    CHECK_EQ_INT(dp_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);        /* tie -> even */
    CHECK_EQ_INT(dp_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie -> even */
    CHECK_EQ_INT(dp_f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    CHECK_EQ_INT(dp_f32_to_fp16(0x1p-25f), 0x0000);               /* tie -> even (0) */
    CHECK_EQ_INT(dp_f32_to_fp16(0x1p-25f * 1.001f), 0x0001);
    CHECK_EQ_INT(dp_f32_to_fp16(3 * 0x1p-25f), 0x0002);           /* tie -> even */
    CHECK_EQ_INT(dp_f32_to_fp16(1e-10f), 0x0000);
    CHECK_EQ_INT(dp_f32_to_fp16(-1e-10f), 0x8000);
    CHECK_EQ_INT(dp_f32_to_fp16(0x1p-14f), 0x0400);
    CHECK_EQ_INT(dp_f32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);    /* tie 0x3ff/0x400 -> even */
    CHECK_EQ_INT(dp_f32_to_fp16(u2f(0x00000001)), 0x0000);        /* float subnormal */
    /* Random floats over the half range: the result is a nearest half, and
     * on a tie the even one. */
    uint64_t s = 12345;
    for (int i = 0; i < 300000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t x = (uint32_t)(s >> 32);
        x = (x & 0x80000000u) | (0x33000000u + (x & 0x7fffffffu) % (0x47800000u - 0x33000000u));
        float f = u2f(x);
        uint16_t h = dp_f32_to_fp16(f);
        double v = half_ref(h), e = fabs((double)f - v);
        uint16_t mag = h & 0x7fff;
        if (mag < 0x7c00) {
            double up = half_ref((uint16_t)((h & 0x8000) | (mag + 1)));
            CHECK_MSG(mag + 1 == 0x7c00 || e <= fabs((double)f - up), "f=%a h=0x%04x", f, h);
            if (mag + 1 < 0x7c00 && e == fabs((double)f - up))
                CHECK_MSG((h & 1) == 0, "f=%a h=0x%04x tie not even", f, h);
        }
        if (mag == 0x7c00) {
            CHECK_MSG(fabsf(f) >= 65520.0f, "f=%a overflowed", f);
        } else if (mag > 0) {
            double dn = half_ref((uint16_t)((h & 0x8000) | (mag - 1)));
            CHECK_MSG(e <= fabs((double)f - dn), "f=%a h=0x%04x", f, h);
            if (e == fabs((double)f - dn))
                CHECK_MSG((h & 1) == 0, "f=%a h=0x%04x tie not even", f, h);
        }
    }
}

static void test_bf16(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dp_bf16_to_f32((uint16_t)h);
        CHECK(f2u(f) == h << 16);
        if (isnan(f))
            CHECK(isnan(dp_bf16_to_f32(dp_f32_to_bf16(f))));
        else
            CHECK_MSG(dp_f32_to_bf16(f) == h, "bf16 0x%04x", h);
    }
    CHECK_EQ_INT(dp_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(dp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          /* tie -> even */
    CHECK_EQ_INT(dp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie -> even */
    CHECK_EQ_INT(dp_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_EQ_INT(dp_f32_to_bf16(u2f(0x7f7fffffu)), 0x7f80);       /* FLT_MAX rounds to inf */
    CHECK_EQ_INT(dp_f32_to_bf16(-INFINITY), 0xff80);
    CHECK(isnan(dp_bf16_to_f32(dp_f32_to_bf16(NAN))));
    CHECK(isnan(dp_bf16_to_f32(dp_f32_to_bf16(u2f(0x7f800001u))))); /* payload in low bits only */
    CHECK_EQ_INT(dp_f32_to_bf16(u2f(0x00010000u)), 0x0001);       /* subnormal kept */
}

/* ---- hand-built blocks ---- */

static void check_row(uint32_t type, const void *blk, const float *want, int n)
{
    float got[512];
    CHECK_EQ_INT(quant_dequant_row(type, blk, got, n), 0);
    for (int i = 0; i < n; i++)
        CHECK_MSG(got[i] == want[i], "%s element %d: got %.9g want %.9g", quant_type_name(type), i, got[i], want[i]);
}

static void test_simple_blocks(void)
{
    uint8_t b[64];
    float want[512];

    /* Q4_0: d = 0.5, low nibbles 0..15, high nibbles 15..0: (q - 8) * d. */
    memset(b, 0, sizeof b);
    put_h(b, 0.5f);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 16; j++) {
        want[j] = (float)(j - 8) * 0.5f;
        want[j + 16] = (float)(7 - j) * 0.5f;
    }
    CHECK(want[0] == -4.0f && want[15] == 3.5f && want[16] == 3.5f && want[31] == -4.0f);
    check_row(DP_TYPE_Q4_0, b, want, 32);

    /* Q4_1: d = 0.5, m = -1: q * d + m, so -1 .. 6.5. */
    memset(b, 0, sizeof b);
    put_h(b, 0.5f);
    put_h(b + 2, -1.0f);
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 16; j++) {
        want[j] = (float)j * 0.5f - 1.0f;
        want[j + 16] = (float)(15 - j) * 0.5f - 1.0f;
    }
    CHECK(want[0] == -1.0f && want[15] == 6.5f);
    check_row(DP_TYPE_Q4_1, b, want, 32);
    /* Two blocks in a row: the second with d = 2, m = 3 and all nibbles 5. */
    uint8_t b2[40];
    memcpy(b2, b, 20);
    put_h(b2 + 20, 2.0f);
    put_h(b2 + 22, 3.0f);
    memset(b2 + 24, 0x55, 16);
    for (int j = 32; j < 64; j++)
        want[j] = 13.0f;
    check_row(DP_TYPE_Q4_1, b2, want, 64);

    /* Q5_0: d = 0.25, qh = 0xf0f0_0f0f: element j's fifth bit is qh bit j, element
     * j+16's is qh bit j+16. Value (q - 16) * d. */
    memset(b, 0, sizeof b);
    put_h(b, 0.25f);
    uint32_t qh = 0xf0f00f0fu;
    memcpy(b + 2, &qh, 4);
    for (int j = 0; j < 16; j++)
        b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 16; j++) {
        int lo = j | (int)(((qh >> j) & 1) << 4), hi = (15 - j) | (int)(((qh >> (j + 16)) & 1) << 4);
        want[j] = (float)(lo - 16) * 0.25f;
        want[j + 16] = (float)(hi - 16) * 0.25f;
    }
    CHECK(want[0] == 0.0f && want[4] == -3.0f && want[16] == -0.25f && want[31] == 0.0f);
    check_row(DP_TYPE_Q5_0, b, want, 32);

    /* Q5_1: d = 1, m = 0.5, same bits: q + 0.5 with q in 0..31. */
    memset(b, 0, sizeof b);
    put_h(b, 1.0f);
    put_h(b + 2, 0.5f);
    memcpy(b + 4, &qh, 4);
    for (int j = 0; j < 16; j++)
        b[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 16; j++) {
        int lo = j | (int)(((qh >> j) & 1) << 4), hi = (15 - j) | (int)(((qh >> (j + 16)) & 1) << 4);
        want[j] = (float)lo + 0.5f;
        want[j + 16] = (float)hi + 0.5f;
    }
    CHECK(want[0] == 16.5f && want[4] == 4.5f && want[16] == 15.5f && want[28] == 19.5f);
    check_row(DP_TYPE_Q5_1, b, want, 32);

    /* Q8_0: d = 0.25, q = 8j - 128 (all of int8's range). */
    memset(b, 0, sizeof b);
    put_h(b, 0.25f);
    for (int j = 0; j < 32; j++) {
        b[2 + j] = (uint8_t)(int8_t)(8 * j - 128);
        want[j] = (float)(8 * j - 128) * 0.25f;
    }
    CHECK(want[0] == -32.0f && want[31] == 30.0f);
    check_row(DP_TYPE_Q8_0, b, want, 32);

    /* Q8_1: d = -2 (s ignored), q = 127 - 4j. */
    memset(b, 0, sizeof b);
    put_h(b, -2.0f);
    put_h(b + 2, 1000.0f);
    for (int j = 0; j < 32; j++) {
        b[4 + j] = (uint8_t)(int8_t)(127 - 4 * j);
        want[j] = (float)(127 - 4 * j) * -2.0f;
    }
    check_row(DP_TYPE_Q8_1, b, want, 32);

    /* F32, F16, BF16 rows. */
    float f[4] = {1.5f, -0.0f, 65504.0f, 0x1p-24f};
    check_row(DP_TYPE_F32, f, f, 4);
    uint8_t h[8];
    for (int i = 0; i < 4; i++)
        put_h(h + 2 * i, f[i]);
    check_row(DP_TYPE_F16, h, f, 4);
    uint16_t bf[2] = {0x3fc0, 0xc000}; /* 1.5, -2 */
    float bw[2] = {1.5f, -2.0f};
    check_row(DP_TYPE_BF16, bf, bw, 2);
}

/* Packs eight 6-bit (scale, min) pairs the way Q4_K/Q5_K store them. */
static void pack_k4_scales(uint8_t q[12], const uint8_t sc[8], const uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
}

static void test_k_blocks(void)
{
    static uint8_t b[300];
    static float want[256];
    /* Scales and mins, with some above 15 so the packed high bits matter. */
    const uint8_t sc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
    const uint8_t mn[8] = {0, 7, 63, 1, 20, 2, 40, 9};

    /* Q4_K: y = d*sc[s]*q - dmin*mn[s]; 64-element chunk c holds sub-blocks
     * 2c (low nibbles) and 2c+1 (high nibbles) of bytes qs[32c .. 32c+31]. */
    memset(b, 0, sizeof b);
    put_h(b, 0.5f);
    put_h(b + 2, 0.25f);
    pack_k4_scales(b + 4, sc, mn);
    for (int i = 0; i < 128; i++)
        b[16 + i] = (uint8_t)((i % 16) | (((i * 7) % 16) << 4));
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int i = 32 * c + l;
            want[64 * c + l] = 0.5f * sc[2 * c] * (float)(i % 16) - 0.25f * mn[2 * c];
            want[64 * c + 32 + l] = 0.5f * sc[2 * c + 1] * (float)((i * 7) % 16) - 0.25f * mn[2 * c + 1];
        }
    CHECK(want[1] == 0.5f && want[64 + 32] == 0.0f * 0.5f - 0.25f * 1); /* sc[3]=63, q=0, mn[3]=1 */
    check_row(DP_TYPE_Q4_K, b, want, 256);

    /* Q5_K: as Q4_K plus a fifth bit: chunk c takes bit 2c (low) and 2c+1 (high) of qh[l]. */
    memset(b, 0, sizeof b);
    put_h(b, 0.5f);
    put_h(b + 2, 0.25f);
    pack_k4_scales(b + 4, sc, mn);
    for (int l = 0; l < 32; l++)
        b[16 + l] = (uint8_t)(l * 37 + 11);
    for (int i = 0; i < 128; i++)
        b[48 + i] = (uint8_t)((i % 16) | (((i * 7) % 16) << 4));
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int i = 32 * c + l, hb = b[16 + l];
            int lo = (i % 16) + (((hb >> (2 * c)) & 1) ? 16 : 0);
            int hi = ((i * 7) % 16) + (((hb >> (2 * c + 1)) & 1) ? 16 : 0);
            want[64 * c + l] = 0.5f * sc[2 * c] * (float)lo - 0.25f * mn[2 * c];
            want[64 * c + 32 + l] = 0.5f * sc[2 * c + 1] * (float)hi - 0.25f * mn[2 * c + 1];
        }
    check_row(DP_TYPE_Q5_K, b, want, 256);

    /* Q6_K: element e = 128h + 32k + l (k = 0..3) takes its low nibble from
     * ql[64h + l + 32(k&1)] (low nibble for k < 2, high for k >= 2), its two
     * high bits from qh[32h + l] at bit 2k, scale sc[8h + 2k + l/16]; q - 32. */
    memset(b, 0, sizeof b);
    for (int i = 0; i < 128; i++)
        b[i] = (uint8_t)(i * 13 + 5);
    for (int i = 0; i < 64; i++)
        b[128 + i] = (uint8_t)(i * 29 + 3);
    int8_t s6[16];
    for (int i = 0; i < 16; i++) {
        s6[i] = (int8_t)(i * 17 - 128);
        b[192 + i] = (uint8_t)s6[i];
    }
    put_h(b + 208, 0.125f);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                uint8_t qlb = b[64 * h + l + 32 * (k & 1)];
                int lo = k < 2 ? (qlb & 15) : (qlb >> 4);
                int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
                int q = (lo | (hi << 4)) - 32;
                want[128 * h + 32 * k + l] = 0.125f * (float)s6[8 * h + 2 * k + l / 16] * (float)q;
            }
    check_row(DP_TYPE_Q6_K, b, want, 256);

    /* IQ4_NL: d, then nibbles (elements j low, 16 + j high) indexing the
     * levels, written out here as llama.cpp's table reads. */
    static const int8_t lv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
    memset(b, 0, sizeof b);
    put_h(b, 0.25f);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 16; j++) {
        want[j] = 0.25f * (float)lv[j];
        want[16 + j] = 0.25f * (float)lv[15 - j];
    }
    check_row(DP_TYPE_IQ4_NL, b, want, 32);

    /* IQ4_XS: d, scales_h (2 bits per sub-block), scales_l (4 bits per
     * sub-block, 2 per byte), nibbles as IQ4_NL's per 32; scale - 32. */
    memset(b, 0, sizeof b);
    put_h(b, 0.5f);
    int ls[8];
    uint16_t shi = 0;
    for (int t = 0; t < 8; t++) {
        ls[t] = (t * 19 + 3) % 64;
        b[4 + t / 2] = (uint8_t)(b[4 + t / 2] | ((ls[t] & 15) << (4 * (t % 2))));
        shi = (uint16_t)(shi | ((ls[t] >> 4) << (2 * t)));
    }
    b[2] = (uint8_t)shi;
    b[3] = (uint8_t)(shi >> 8);
    for (int i = 0; i < 128; i++)
        b[8 + i] = (uint8_t)(i * 29 + 1);
    for (int t = 0; t < 8; t++)
        for (int j = 0; j < 16; j++) {
            uint8_t q = b[8 + 16 * t + j];
            want[32 * t + j] = 0.5f * (float)(ls[t] - 32) * (float)lv[q & 15];
            want[32 * t + 16 + j] = 0.5f * (float)(ls[t] - 32) * (float)lv[q >> 4];
        }
    check_row(DP_TYPE_IQ4_XS, b, want, 256);

    /* Q8_K: f32 d, int8 q. */
    memset(b, 0, sizeof b);
    float d8 = -0.375f;
    memcpy(b, &d8, 4);
    for (int i = 0; i < 256; i++) {
        b[4 + i] = (uint8_t)(int8_t)(i - 128);
        want[i] = -0.375f * (float)(i - 128);
    }
    check_row(DP_TYPE_Q8_K, b, want, 256);

    /* Q2_K: 16 sub-blocks of 16; sub-block t = 8h + 2s + g uses scales[t]
     * (low nibble scale, high nibble min) and bits 2s of qs[32h + 16g + l]. */
    memset(b, 0, sizeof b);
    for (int t = 0; t < 16; t++)
        b[t] = (uint8_t)((t % 16) | (((15 - t) % 16) << 4));
    for (int i = 0; i < 64; i++)
        b[16 + i] = (uint8_t)(i * 53 + 7);
    put_h(b + 80, 0.5f);
    put_h(b + 82, 0.125f);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int g = 0; g < 2; g++)
                for (int l = 0; l < 16; l++) {
                    int t = 8 * h + 2 * s + g;
                    int q = (b[16 + 32 * h + 16 * g + l] >> (2 * s)) & 3;
                    want[128 * h + 32 * s + 16 * g + l] = 0.5f * (float)(t % 16) * (float)q - 0.125f * (float)(15 - t);
                }
    check_row(DP_TYPE_Q2_K, b, want, 256);

    /* Q3_K: scales are 6-bit, biased by 32: scale t has low bits in the low
     * (t < 8) or high (t >= 8) nibble of byte t%8 and high bits at 2*(t/4) of
     * byte 8 + t%4. Values (q2 - (hmask bit ? 0 : 4)) * d * scale. */
    memset(b, 0, sizeof b);
    int s3[16];
    for (int t = 0; t < 16; t++)
        s3[t] = (t * 23 + 5) % 64;
    for (int t = 0; t < 16; t++) {
        int lo = s3[t] & 15, hi = s3[t] >> 4;
        if (t < 8)
            b[96 + t] = (uint8_t)(b[96 + t] | lo);
        else
            b[96 + t - 8] = (uint8_t)(b[96 + t - 8] | (lo << 4));
        b[96 + 8 + t % 4] = (uint8_t)(b[96 + 8 + t % 4] | (hi << (2 * (t / 4))));
    }
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(i * 71 + 1);
    for (int i = 0; i < 64; i++)
        b[32 + i] = (uint8_t)(i * 53 + 7);
    put_h(b + 108, 0.25f);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int g = 0; g < 2; g++)
                for (int l = 0; l < 16; l++) {
                    int t = 8 * h + 2 * s + g;
                    int q = (b[32 + 32 * h + 16 * g + l] >> (2 * s)) & 3;
                    int hbit = (b[16 * g + l] >> (4 * h + s)) & 1;
                    want[128 * h + 32 * s + 16 * g + l] = 0.25f * (float)(s3[t] - 32) * (float)(q - (hbit ? 0 : 4));
                }
    check_row(DP_TYPE_Q3_K, b, want, 256);
}

/* ---- golden file from gguf-py ---- */

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void test_golden(void)
{
    FILE *f = fopen(GOLDEN_PATH, "rb");
    CHECK_MSG(f != NULL, "cannot open %s (run from the project root)", GOLDEN_PATH);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    CHECK(sz > 12);
    uint8_t *buf = malloc((size_t)sz);
    CHECK(buf != NULL);
    CHECK(fread(buf, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    CHECK(memcmp(buf, "DPQG", 4) == 0);
    CHECK_EQ_INT(rd32(buf + 4), 1);
    uint32_t n_rec = rd32(buf + 8);
    size_t pos = 12;
    int types_seen = 0;
    for (uint32_t r = 0; r < n_rec; r++) {
        CHECK((size_t)sz - pos >= 12);
        uint32_t type = rd32(buf + pos), n = rd32(buf + pos + 4), nbytes = rd32(buf + pos + 8);
        pos += 12;
        CHECK((size_t)sz - pos >= (size_t)nbytes + 4ull * n);
        uint64_t rb;
        CHECK_EQ_INT(quant_row_bytes(type, n, &rb), 0);
        CHECK_EQ_INT(rb, nbytes);
        const uint8_t *data = buf + pos;
        const uint8_t *vals = buf + pos + nbytes;
        pos += nbytes + 4ull * n;
        float *got = malloc(n * sizeof *got);
        CHECK(got != NULL);
        CHECK_EQ_INT(quant_dequant_row(type, data, got, n), 0);
        uint32_t be = quant_block_elems(type);
        int inexact = 0;
        for (uint32_t i = 0; i < n; i++) {
            float want;
            memcpy(&want, vals + 4ull * i, 4);
            if (isnan(want)) {
                CHECK_MSG(isnan(got[i]), "%s element %u: got %g want nan", quant_type_name(type), i, got[i]);
                continue;
            }
            if (got[i] == want)
                continue;
            /* One ulp is allowed where a*b+c may be fused by the compiler;
             * when that sum cancels, the ulp is the block's (so: 2^-22 of its
             * largest value), not the tiny result's. */
            float bmax = 0;
            for (uint32_t k = i / be * be; k < i / be * be + be; k++) {
                float w;
                memcpy(&w, vals + 4ull * k, 4);
                bmax = fmaxf(bmax, fabsf(w));
            }
            double ulp = fmax(fabs(nextafterf(want, INFINITY) - want), bmax * 0x1p-22);
            inexact++;
            CHECK_MSG(fabs((double)got[i] - want) <= ulp, "%s element %u: got %.9g want %.9g", quant_type_name(type),
                      i, got[i], want);
        }
        printf("golden %-5s %5u values, %d within an ulp, rest exact\n", quant_type_name(type), n, inexact);
        free(got);
        types_seen++;
    }
    CHECK(pos == (size_t)sz);
    CHECK(types_seen >= 13);
    free(buf);
}

/* The KV cache's quantizers: every value of a block is within half a step
 * (d/2) of its dequantized value, except that Q4_0's side opposite the
 * largest value has one level fewer (q - 8 stops at 7), so values there may
 * be a whole step off; zeros come back as zeros, and requantizing a
 * dequantized row gives its bytes back. The relative L2 error
 * on Gaussian rows is printed: it is what a quantized decode pool costs per
 * row before attention averages over tokens. */
static uint64_t qs_state = 0x9e3779b97f4a7c15ull;
static double gauss(void)
{
    double u = 0, v = 0;
    while (u <= 0) {
        qs_state = qs_state * 6364136223846793005ull + 1442695040888963407ull;
        u = (double)(qs_state >> 11) / 9007199254740992.0;
    }
    qs_state = qs_state * 6364136223846793005ull + 1442695040888963407ull;
    v = (double)(qs_state >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static void test_kv_quantize(void)
{
    const uint32_t types[2] = {DP_TYPE_Q8_0, DP_TYPE_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = types[ti];
        enum { N = 4096 };
        static float x[N], y[N];
        uint8_t q[N / 32 * 34];
        double num = 0, den = 0;
        for (int i = 0; i < N; i++)
            x[i] = (float)gauss() * (i < 32 ? 1e-3f : 1.0f); /* one tiny block */
        CHECK(quant_quantize_row(type, x, q, N) == 0);
        CHECK(quant_dequant_row(type, q, y, N) == 0);
        for (int b = 0; b < N / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fabsf(x[b * 32 + j]) > amax ? fabsf(x[b * 32 + j]) : amax;
            /* The step, with room for the scale's f16 rounding. */
            const double step = (type == DP_TYPE_Q8_0 ? amax / 127.0 : amax / 8.0) * 1.001;
            for (int j = 0; j < 32; j++) {
                double e = fabs((double)y[b * 32 + j] - x[b * 32 + j]);
                CHECK_MSG(e <= (type == DP_TYPE_Q8_0 ? step / 2 : step), "%s block %d elt %d: %g vs %g",
                          quant_type_name(type), b, j, y[b * 32 + j], x[b * 32 + j]);
            }
        }
        for (int i = 0; i < N; i++) {
            num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            den += (double)x[i] * x[i];
        }
        printf("  %s round trip on Gaussian rows: rel L2 %.4f\n", quant_type_name(type), sqrt(num / den));
        CHECK(sqrt(num / den) < (type == DP_TYPE_Q8_0 ? 0.01 : 0.12));
        /* Zeros stay zeros (a zero block has scale 0: no division by it). */
        float z[64] = {0}, out[64];
        uint8_t zq[2 * 34];
        CHECK(quant_quantize_row(type, z, zq, 64) == 0);
        CHECK(quant_dequant_row(type, zq, out, 64) == 0);
        for (int i = 0; i < 64; i++)
            CHECK(out[i] == 0.0f);
        /* Quantizing what was dequantized gives the same bytes (a block can
         * move between stores through f32 without drifting). */
        uint8_t q2[N / 32 * 34];
        CHECK(quant_quantize_row(type, y, q2, N) == 0);
        CHECK(memcmp(q, q2, (size_t)N / 32 * quant_block_bytes(type)) == 0);
    }
    float x[40] = {0};
    uint8_t q[64];
    CHECK(quant_quantize_row(DP_TYPE_Q8_0, x, q, 40) == DP_EINVAL);
    CHECK(quant_quantize_row(DP_TYPE_Q4_1, x, q, 32) == DP_EUNSUPPORTED);
}

/* quant_asym_roundtrip: every value within half a step of where it was (the
 * step as stored, f16), the group's extremes kept (the minimum exactly, up
 * to its f16 rounding), a constant group exact, values at a stride only,
 * and a second round trip changes nothing. */
static void test_asym_roundtrip(void)
{
    for (int bits = 2; bits <= 4; bits += 2) {
        enum { N = 32, STRIDE = 3 };
        float x[N * STRIDE], y[N * STRIDE];
        for (int i = 0; i < N * STRIDE; i++)
            x[i] = (float)gauss() * 0.7f + 0.2f;
        memcpy(y, x, sizeof x);
        quant_asym_roundtrip(y, N, STRIDE, bits);
        float lo = x[0], hi = x[0];
        for (int i = 0; i < N; i++) {
            lo = x[i * STRIDE] < lo ? x[i * STRIDE] : lo;
            hi = x[i * STRIDE] > hi ? x[i * STRIDE] : hi;
        }
        const double step = (hi - lo) / ((1 << bits) - 1) * 1.002;
        float ymin = y[0];
        for (int i = 0; i < N * STRIDE; i++) {
            if (i % STRIDE) {
                CHECK(y[i] == x[i]); /* not in the group */
                continue;
            }
            CHECK_MSG(fabs((double)y[i] - x[i]) <= step / 2 + 1e-3 * fabs((double)lo),
                      "%d bits: %g -> %g (step %g)", bits, x[i], y[i], step);
            ymin = y[i] < ymin ? y[i] : ymin;
        }
        CHECK(ymin == dp_fp16_to_f32(dp_f32_to_fp16(lo)));
        float z[N * STRIDE];
        memcpy(z, y, sizeof y);
        quant_asym_roundtrip(z, N, STRIDE, bits);
        CHECK(memcmp(z, y, sizeof y) == 0);
    }
    float c[8] = {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f};
    quant_asym_roundtrip(c, 8, 1, 4);
    for (int i = 0; i < 8; i++)
        CHECK(c[i] == 1.5f);
}

/* The synthetic models' quantizers (tools/synth_gguf.c) must write blocks
 * that the reference dequantizer reads back close to the input: a layout
 * slip (a nibble in the wrong half, a scale in the wrong byte) shows up as
 * an error of the order of the values themselves. */
static void test_synth_quantizers(void)
{
    static const struct {
        uint32_t type;
        double max_rel_rms;
    } cases[] = {{DP_TYPE_Q8_0, 0.005}, {DP_TYPE_Q4_0, 0.08}, {DP_TYPE_Q4_1, 0.07},
                 {DP_TYPE_Q5_0, 0.04}, {DP_TYPE_Q5_1, 0.035}, {DP_TYPE_Q4_K, 0.07},
                 {DP_TYPE_Q5_K, 0.035}, {DP_TYPE_Q6_K, 0.02}, {DP_TYPE_Q2_K, 0.30},
                 {DP_TYPE_Q3_K, 0.20}};
    enum { N = 1024 };
    static float x[N], y[N];
    static uint8_t b[N * 2];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int shape = 0; shape < 3; shape++) {
            /* uniform; one large value per 64 (scales that differ across
             * sub-blocks); all non-negative (mins at zero) */
            double ss = 0, se = 0;
            for (int i = 0; i < N; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                float u = (float)(s >> 40) * 0x1p-23f - 1.0f;
                x[i] = shape == 2 ? fabsf(u) : shape == 1 && i % 64 == 5 ? 8.0f * u : u;
                ss += (double)x[i] * x[i];
            }
            CHECK(synth_quantize_row(cases[c].type, x, b, N) == 0);
            CHECK(quant_dequant_row(cases[c].type, b, y, N) == 0);
            for (int i = 0; i < N; i++)
                se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            const double rel = sqrt(se / ss);
            /* An outlier coarsens its whole block (its sub-block in the K
             * types): looser there. */
            const double bound = cases[c].max_rel_rms * (shape == 1 ? 2.5 : 1.0);
            CHECK_MSG(rel <= bound, "%s shape %d: relative rms error %.4f",
                      quant_type_name(cases[c].type), shape, rel);
            if (shape == 0)
                printf("  synth %-5s round trip on uniform rows: rel L2 %.4f\n",
                       quant_type_name(cases[c].type), rel);
        }
        memset(x, 0, sizeof x);
        CHECK(synth_quantize_row(cases[c].type, x, b, N) == 0);
        CHECK(quant_dequant_row(cases[c].type, b, y, N) == 0);
        for (int i = 0; i < N; i++)
            CHECK(y[i] == 0.0f);
    }
}

int main(void)
{
    test_synth_quantizers();
    test_kv_quantize();
    test_asym_roundtrip();
    test_table();
    test_fp16();
    test_bf16();
    test_simple_blocks();
    test_k_blocks();
    test_golden();
    T_DONE("quant");
}
