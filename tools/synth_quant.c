/* synth_quant.c: the synthetic models' quantizers (synth_quantize_row,
 * tools/synth_gguf.h): every block type synth writes, plainly (scales from
 * each block's range, no search), so that tests can hold each type the
 * kernels read. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "common/dp.h"
#include "synth_gguf.h"

static void put_h(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static void quant_q8_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        uint16_t dh = dp_f32_to_fp16(amax / 127.0f);
        float d = dp_fp16_to_f32(dh);
        float id = d != 0 ? 1.0f / d : 0.0f;
        put_h(b, dh);
        for (int j = 0; j < 32; j++) {
            float q = roundf(x[j] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            b[2 + j] = (uint8_t)(int8_t)q;
        }
    }
}

static void quant_q4_1(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 20) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; j++) {
            lo = fminf(lo, x[j]);
            hi = fmaxf(hi, x[j]);
        }
        /* Quantize against the stored (fp16-rounded) d and m so that the
         * rounding error is what a reader sees. */
        uint16_t mh = dp_f32_to_fp16(lo);
        uint16_t dh = dp_f32_to_fp16((hi - lo) / 15.0f);
        float m = dp_fp16_to_f32(mh), d = dp_fp16_to_f32(dh);
        float id = d != 0 ? 1.0f / d : 0.0f;
        put_h(b, dh);
        put_h(b + 2, mh);
        for (int j = 0; j < 16; j++) {
            float q0 = roundf((x[j] - m) * id), q1 = roundf((x[j + 16] - m) * id);
            int a0 = q0 < 0 ? 0 : q0 > 15 ? 15 : (int)q0;
            int a1 = q1 < 0 ? 0 : q1 > 15 ? 15 : (int)q1;
            b[4 + j] = (uint8_t)(a0 | (a1 << 4));
        }
    }
}

/* The remaining block types, plainly (no search for the best scales, as
 * llama-quantize does): what tests need is valid blocks whose values follow
 * the input, with every field of the format exercised. */
static float amax_of(const float *x, int n)
{
    float a = 0;
    for (int j = 0; j < n; j++)
        a = fmaxf(a, fabsf(x[j]));
    return a;
}

static int clampi(float q, int lo, int hi) { return q < (float)lo ? lo : q > (float)hi ? hi : (int)q; }

/* The smallest and largest of n values and zero (the K types' mins are
 * never above zero). */
static void range0(const float *x, int n, float *lo, float *hi)
{
    *lo = *hi = 0;
    for (int j = 0; j < n; j++) {
        *lo = fminf(*lo, x[j]);
        *hi = fmaxf(*hi, x[j]);
    }
}

static void quant_q4_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 18) {
        uint16_t dh = dp_f32_to_fp16(amax_of(x, 32) / 7.0f);
        float d = dp_fp16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
        put_h(b, dh);
        for (int j = 0; j < 16; j++)
            b[2 + j] = (uint8_t)(clampi(roundf(x[j] * id) + 8, 0, 15) |
                                 clampi(roundf(x[j + 16] * id) + 8, 0, 15) << 4);
    }
}

/* Q5_0 (d, qh, qs; (q - 16) d) and Q5_1 (d, m, qh, qs; q d + m). */
static void quant_q5(const float *x, uint8_t *b, int64_t nb, bool has_min)
{
    const int bb = has_min ? 24 : 22, off = has_min ? 4 : 2;
    for (int64_t i = 0; i < nb; i++, x += 32, b += bb) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; j++) {
            lo = fminf(lo, x[j]);
            hi = fmaxf(hi, x[j]);
        }
        uint16_t dh = dp_f32_to_fp16(has_min ? (hi - lo) / 31.0f : amax_of(x, 32) / 15.0f);
        uint16_t mh = dp_f32_to_fp16(lo);
        float d = dp_fp16_to_f32(dh), m = has_min ? dp_fp16_to_f32(mh) : 0.0f;
        float id = d != 0 ? 1.0f / d : 0.0f;
        put_h(b, dh);
        if (has_min)
            put_h(b + 2, mh);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = has_min ? clampi(roundf((x[j] - m) * id), 0, 31) : clampi(roundf(x[j] * id) + 16, 0, 31);
            int q1 = has_min ? clampi(roundf((x[j + 16] - m) * id), 0, 31)
                             : clampi(roundf(x[j + 16] * id) + 16, 0, 31);
            b[off + 4 + j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        for (int k = 0; k < 4; k++)
            b[off + k] = (uint8_t)(qh >> (8 * k));
    }
}

/* Q4_K and Q5_K: per 32 values a 6-bit scale and min under the block's f16
 * d and dmin, packed as kernels/quant.c's kq_scale_min reads them. */
static void quant_qk45(const float *x, uint8_t *b, int64_t nb, int bits)
{
    const int bb = bits == 4 ? 144 : 176, top = (1 << bits) - 1;
    for (int64_t i = 0; i < nb; i++, x += 256, b += bb) {
        float sc[8], mn[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            float lo, hi;
            range0(x + 32 * j, 32, &lo, &hi);
            sc[j] = (hi - lo) / (float)top;
            mn[j] = -lo;
            smax = fmaxf(smax, sc[j]);
            mmax = fmaxf(mmax, mn[j]);
        }
        uint16_t dh = dp_f32_to_fp16(smax / 63.0f), mh = dp_f32_to_fp16(mmax / 63.0f);
        float d = dp_fp16_to_f32(dh), dmin = dp_fp16_to_f32(mh);
        put_h(b, dh);
        put_h(b + 2, mh);
        uint8_t *s = b + 4, *qh = b + 16, *qs = b + (bits == 4 ? 16 : 48);
        memset(s, 0, 12);
        if (bits == 5)
            memset(qh, 0, 32);
        for (int j = 0; j < 8; j++) {
            int is = d != 0 ? clampi(roundf(sc[j] / d), 0, 63) : 0;
            int im = dmin != 0 ? clampi(roundf(mn[j] / dmin), 0, 63) : 0;
            if (j < 4) {
                s[j] |= (uint8_t)is;
                s[j + 4] |= (uint8_t)im;
            } else {
                s[j + 4] = (uint8_t)((is & 15) | (im & 15) << 4);
                s[j - 4] |= (uint8_t)((is >> 4) << 6);
                s[j] |= (uint8_t)((im >> 4) << 6);
            }
            /* What a reader computes: d * scale, dmin * min, each rounded. */
            float ds = d * (float)is, dm = dmin * (float)im;
            float ids = ds != 0 ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 32; l++) {
                int q = clampi(roundf((x[32 * j + l] + dm) * ids), 0, top);
                uint8_t *p = qs + 32 * (j / 2) + l;
                *p = (uint8_t)(j % 2 ? (*p & 15) | (q & 15) << 4 : (q & 15));
                if (bits == 5)
                    qh[l] |= (uint8_t)((q >> 4) << j);
            }
        }
    }
}

/* Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 values), d; value
 * d * scale * (q - 32), laid out as kernels/quant.c's deq_q6_k reads it. */
static void quant_q6_k(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 256, b += 210) {
        float sc[16], smax = 0;
        for (int s = 0; s < 16; s++) {
            sc[s] = amax_of(x + 16 * s, 16) / 31.0f;
            smax = fmaxf(smax, sc[s]);
        }
        uint16_t dh = dp_f32_to_fp16(smax / 127.0f);
        float d = dp_fp16_to_f32(dh);
        put_h(b + 208, dh);
        memset(b, 0, 192);
        for (int s = 0; s < 16; s++) {
            int is = d != 0 ? clampi(roundf(sc[s] / d), -128, 127) : 0;
            b[192 + s] = (uint8_t)(int8_t)is;
            float ds = d * (float)is, ids = ds != 0 ? 1.0f / ds : 0.0f;
            for (int e = 0; e < 16; e++) {
                const int k = 16 * s + e, h = k / 128, r = k % 128, kk = r / 32, l = r % 32;
                int q = clampi(roundf(x[k] * ids) + 32, 0, 63);
                uint8_t *ql = b + 64 * h + l + (kk & 1 ? 32 : 0);
                *ql |= (uint8_t)((q & 15) << (kk >= 2 ? 4 : 0));
                b[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * kk));
            }
        }
    }
}

/* Q2_K (scale/min bytes[16], qs[64], d, dmin) and Q3_K (hmask[32], qs[64],
 * 6-bit scales[12], d): per 16 values a 4-bit scale and min (Q2_K: 0..3
 * levels above -min) or a signed 6-bit scale (Q3_K: -4..3 levels); the
 * 2-bit values of element e at byte 32 (e / 128) + e % 32 of qs, bits
 * 2 ((e / 32) % 4); Q3_K's third bit (set: no -4) at hmask byte e % 32,
 * bit e / 32. */
static void quant_q23_k(const float *x, uint8_t *b, int64_t nb, bool q3)
{
    const int bb = q3 ? 110 : 84;
    for (int64_t i = 0; i < nb; i++, x += 256, b += bb) {
        float sc[16], mn[16], smax = 0, mmax = 0;
        for (int g = 0; g < 16; g++) {
            float lo, hi;
            range0(x + 16 * g, 16, &lo, &hi);
            sc[g] = q3 ? amax_of(x + 16 * g, 16) / 4.0f : (hi - lo) / 3.0f;
            mn[g] = -lo;
            smax = fmaxf(smax, sc[g]);
            mmax = fmaxf(mmax, mn[g]);
        }
        memset(b, 0, (size_t)bb);
        uint8_t *qs = b + (q3 ? 32 : 16);
        const uint16_t dh = dp_f32_to_fp16(smax / (q3 ? 31.0f : 15.0f)), mh = dp_f32_to_fp16(mmax / 15.0f);
        const float d = dp_fp16_to_f32(dh), dmin = dp_fp16_to_f32(mh);
        put_h(b + (q3 ? 108 : 80), dh);
        if (!q3)
            put_h(b + 82, mh);
        for (int g = 0; g < 16; g++) {
            const int is = d != 0 ? clampi(roundf(sc[g] / d), q3 ? -32 : 0, q3 ? 31 : 15) : 0;
            const int im = !q3 && dmin != 0 ? clampi(roundf(mn[g] / dmin), 0, 15) : 0;
            if (q3) {
                const int v = is + 32;
                b[96 + (g < 8 ? g : g - 8)] |= (uint8_t)((v & 15) << (g < 8 ? 0 : 4));
                b[96 + 8 + (g & 3)] |= (uint8_t)((v >> 4) << (2 * (g >> 2)));
            } else {
                b[g] = (uint8_t)(is | im << 4);
            }
            const float ds = d * (float)is, dm = dmin * (float)im;
            const float ids = ds != 0 ? 1.0f / ds : 0.0f;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * g + l;
                const int u = q3 ? clampi(roundf(x[e] * ids), -4, 3) + 4 : clampi(roundf((x[e] + dm) * ids), 0, 3);
                qs[32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e / 32) % 4)));
                if (q3 && u >= 4)
                    b[e % 32] |= (uint8_t)(1u << (e / 32));
            }
        }
    }
}

int synth_quantize_row(uint32_t type, const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    switch (type) {
    case DP_TYPE_F32: memcpy(dst, x, (size_t)n * 4); return 0;
    case DP_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            put_h(b + 2 * i, dp_f32_to_fp16(x[i]));
        return 0;
    case DP_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            put_h(b + 2 * i, dp_f32_to_bf16(x[i]));
        return 0;
    case DP_TYPE_Q8_0:
        if (n % 32)
            return DP_EINVAL;
        quant_q8_0(x, b, n / 32);
        return 0;
    case DP_TYPE_Q4_1:
        if (n % 32)
            return DP_EINVAL;
        quant_q4_1(x, b, n / 32);
        return 0;
    case DP_TYPE_Q4_0:
    case DP_TYPE_Q5_0:
    case DP_TYPE_Q5_1:
        if (n % 32)
            return DP_EINVAL;
        if (type == DP_TYPE_Q4_0)
            quant_q4_0(x, b, n / 32);
        else
            quant_q5(x, b, n / 32, type == DP_TYPE_Q5_1);
        return 0;
    case DP_TYPE_Q2_K:
    case DP_TYPE_Q3_K:
    case DP_TYPE_Q4_K:
    case DP_TYPE_Q5_K:
    case DP_TYPE_Q6_K:
        if (n % 256)
            return DP_EINVAL;
        if (type == DP_TYPE_Q2_K || type == DP_TYPE_Q3_K)
            quant_q23_k(x, b, n / 256, type == DP_TYPE_Q3_K);
        else if (type == DP_TYPE_Q6_K)
            quant_q6_k(x, b, n / 256);
        else
            quant_qk45(x, b, n / 256, type == DP_TYPE_Q4_K ? 4 : 5);
        return 0;
    default: return DP_EUNSUPPORTED;
    }
}
