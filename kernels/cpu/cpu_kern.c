/* cpu_kern.c: the CPU backend's hot kernels, written once against vec.h and
 * compiled once per instruction-set level (kernels/meson.build passes the
 * level's -m flags and CPU_KERN_NAME); cpu_dispatch.c picks the level the
 * machine runs. Each build defines one table, cpu_kern_<level>.
 *
 *  - matmul, exact: weight blocks decoded to f32 in registers and reused for
 *    up to four activation rows (the weight bytes are the cost at small m);
 *  - matmul, integer (AVX2 and up): activations quantized per 32 values to
 *    int8 (as llama.cpp's CPU backend does), weight blocks of Q4_0/Q4_1/Q8_0
 *    multiplied as bytes (maddubs, or VNNI dpbusd where the level has it);
 *  - attention with an online softmax over the transposed K blocks, VW keys
 *    per vector instruction; the scorer's per-head scores and exp-sum;
 *  - the sampler's top-k, max and weight sum over a row of logits
 *    (kernels/topk_impl.h, bit-identical at every level). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/dp.h"
#include "cpu_internal.h"
#include "kernels/quant.h"
#include "kernels/topk_impl.h"
#include "vec.h"

/* kernels/meson.build names the level; a file compiled on its own (a syntax
 * check, an editor) gets the portable table's name. */
#ifndef CPU_KERN_NAME
#define CPU_KERN_NAME baseline
#endif
#define KERN_CAT2(a, b) a##b
#define KERN_CAT(a, b) KERN_CAT2(a, b)
#define KERN_TABLE KERN_CAT(cpu_kern_, CPU_KERN_NAME)
#define KERN_STR2(a) #a
#define KERN_STR(a) KERN_STR2(a)

#define NBV (32 / VW) /* vectors per 32-element block */

static float k_dot(const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
    vf acc0 = vf_zero(), acc1 = vf_zero();
    for (; i + 2 * VW <= n; i += 2 * VW) {
        acc0 = vf_fma(vf_load(a + i), vf_load(b + i), acc0);
        acc1 = vf_fma(vf_load(a + i + VW), vf_load(b + i + VW), acc1);
    }
    for (; i + VW <= n; i += VW)
        acc0 = vf_fma(vf_load(a + i), vf_load(b + i), acc0);
    float s = vf_hsum(vf_add(acc0, acc1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- Weight blocks decoded to f32 (the exact path). ---- */

static inline __attribute__((unused)) float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kv_h2f(h);
}

#if VEC_PORTABLE
/* One block through the reference dequantization. */
#define DEFINE_BLK(name, id)                                                         \
    static inline void blk_##name(const uint8_t *b, vf *w)                          \
    {                                                                               \
        float t[32];                                                                \
        quant_dequant_row(id, b, t, 32);                                            \
        for (int j = 0; j < NBV; j++)                                               \
            w[j] = vf_load(t + j * VW);                                             \
    }
DEFINE_BLK(q4_1, DP_TYPE_Q4_1)
DEFINE_BLK(q4_0, DP_TYPE_Q4_0)
DEFINE_BLK(q8_0, DP_TYPE_Q8_0)
#else
/* VW bytes widened to f32 lanes (unsigned or signed). */
#if VEC_AVX512
#define vf_u8(p128) _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(p128))
#define vf_i8(p128) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p128))
#else
#define vf_u8(p128) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p128))
#define vf_i8(p128) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p128))
#endif
/* The arithmetic is the reference dequantization's (d * q + m), so results
 * match quant_dequant_row up to fma contraction. Lanes: weights 0..15 are the
 * low nibbles of the 16 bytes, 16..31 the high ones. */
static inline void nibbles(const uint8_t *p, __m128i *lo, __m128i *hi)
{
    __m128i q = _mm_loadu_si128((const __m128i *)p);
    *lo = _mm_and_si128(q, _mm_set1_epi8(0x0f));
    *hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f));
}

static inline void nibbles_f32(const uint8_t *p, vf *w)
{
    __m128i lo, hi;
    nibbles(p, &lo, &hi);
#if VW == 16
    w[0] = vf_u8(lo);
    w[1] = vf_u8(hi);
#else
    w[0] = vf_u8(lo);
    w[1] = vf_u8(_mm_srli_si128(lo, 8));
    w[2] = vf_u8(hi);
    w[3] = vf_u8(_mm_srli_si128(hi, 8));
#endif
}

static inline __attribute__((always_inline)) void blk_q4_1(const uint8_t *b, vf *w)
{
    vf d = vf_set1(h2f(b)), m = vf_set1(h2f(b + 2));
    nibbles_f32(b + 4, w);
    for (int j = 0; j < NBV; j++)
        w[j] = vf_fma(w[j], d, m);
}

static inline __attribute__((always_inline)) void blk_q4_0(const uint8_t *b, vf *w)
{
    vf d = vf_set1(h2f(b)), eight = vf_set1(8.0f);
    nibbles_f32(b + 2, w);
    for (int j = 0; j < NBV; j++)
        w[j] = vf_mul(vf_sub(w[j], eight), d);
}

static inline __attribute__((always_inline)) void blk_q8_0(const uint8_t *b, vf *w)
{
    vf d = vf_set1(h2f(b));
    for (int j = 0; j < NBV; j++) {
        /* Exactly VW bytes: a wider load would read past the last block. */
#if VW == 16
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + 2 + j * VW));
#else
        const __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + j * VW));
#endif
        w[j] = vf_mul(vf_i8(q), d);
    }
}
#endif

typedef void (*blk_fn)(const uint8_t *b, vf *w);

/* x_i . W_r for M activation rows with a compile-time M, so the accumulators
 * stay in registers; two per row hide the fma latency at M = 1. */
#define FUSED_FIXED(M)                                                                        \
    static inline __attribute__((always_inline)) void fused_##M(                              \
        blk_fn fn, size_t bbytes, const uint8_t *wrow, int64_t k, const float *x, float *out) \
    {                                                                                         \
        vf acc[M][2];                                                                         \
        for (int i = 0; i < M; i++)                                                           \
            acc[i][0] = acc[i][1] = vf_zero();                                                \
        for (int64_t b = 0; b < k / 32; b++) {                                                \
            vf w[NBV];                                                                        \
            fn(wrow + (size_t)b * bbytes, w);                                                 \
            for (int i = 0; i < M; i++) {                                                     \
                const float *xi = x + (size_t)i * (size_t)k + b * 32;                         \
                for (int j = 0; j < NBV; j++)                                                 \
                    acc[i][j & 1] = vf_fma(w[j], vf_load(xi + j * VW), acc[i][j & 1]);        \
            }                                                                                 \
        }                                                                                     \
        for (int i = 0; i < M; i++)                                                           \
            out[i] = vf_hsum(vf_add(acc[i][0], acc[i][1]));                                   \
    }
FUSED_FIXED(1)
FUSED_FIXED(2)
FUSED_FIXED(3)
FUSED_FIXED(4)

static inline __attribute__((always_inline)) void fused_rows(blk_fn fn, size_t bbytes, const uint8_t *wrow,
                                                             int64_t k, const float *x, int32_t m,
                                                             float *out)
{
    switch (m) {
    case 1: fused_1(fn, bbytes, wrow, k, x, out); return;
    case 2: fused_2(fn, bbytes, wrow, k, x, out); return;
    case 3: fused_3(fn, bbytes, wrow, k, x, out); return;
    default: fused_4(fn, bbytes, wrow, k, x, out); return;
    }
}

/* One instance per type, so the block decoder inlines into the loops. */
#define FAST_TYPES(X) X(DP_TYPE_Q4_1, q4_1, 20) X(DP_TYPE_Q4_0, q4_0, 18) X(DP_TYPE_Q8_0, q8_0, 34)

#define DEFINE_FUSED(id, name, bytes)                                                          \
    static void mmf_##name(const dp_weight *w, int64_t r0, int64_t nt, const float *x,         \
                           int32_t m, float *y)                                                \
    {                                                                                          \
        const int64_t k = w->cols, n = w->rows;                                                \
        const size_t rb = w->nbytes / (size_t)w->rows;                                         \
        float out[4];                                                                          \
        for (int32_t i0 = 0; i0 < m; i0 += 4) {                                                \
            const int32_t g = m - i0 < 4 ? m - i0 : 4;                                         \
            for (int64_t r = r0; r < r0 + nt; r++) {                                           \
                fused_rows(blk_##name, bytes, (const uint8_t *)w->data + (size_t)r * rb, k,    \
                           x + (size_t)i0 * (size_t)k, g, out);                                \
                for (int32_t i = 0; i < g; i++)                                                \
                    y[(size_t)(i0 + i) * (size_t)n + (size_t)r] = out[i];                      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static void dec_##name(const uint8_t *src, int64_t nrows, int64_t k, size_t rb, float *dst) \
    {                                                                                          \
        for (int64_t r = 0; r < nrows; r++)                                                    \
            for (int64_t b = 0; b < k / 32; b++) {                                             \
                vf wv[NBV];                                                                    \
                blk_##name(src + (size_t)r * rb + (size_t)b * bytes, wv);                      \
                for (int j = 0; j < NBV; j++)                                                  \
                    vf_store(dst + (size_t)r * (size_t)k + b * 32 + j * VW, wv[j]);            \
            }                                                                                  \
    }
FAST_TYPES(DEFINE_FUSED)

/* g activation rows' dots (x rows of k, results out[i * os]) with one
 * file-layout row decoded by the reference, in pieces of at most 8192
 * values whose dots are added in order. Both exact paths of the types
 * without a fused decoder go through here, so a row gives the same bits
 * whether its weight was repacked (mmf_x8) or not (mmf_generic). */
#define REF_PIECE 8192
static void ref_row_dots(uint32_t type, const uint8_t *src, int64_t k, const float *x, int32_t g,
                         float *out, size_t os)
{
    float row[REF_PIECE];
    const uint32_t be = quant_block_elems(type), bb = quant_block_bytes(type);
    for (int64_t c = 0; c < k; c += REF_PIECE) {
        const int64_t len = k - c < REF_PIECE ? k - c : REF_PIECE;
        quant_dequant_row(type, src + (size_t)(c / be) * bb, row, len);
        for (int32_t i = 0; i < g; i++) {
            const float d = k_dot(row, x + (size_t)i * (size_t)k + c, len);
            out[(size_t)i * os] = c ? out[(size_t)i * os] + d : d;
        }
    }
}

/* Any other type: each row decoded by the reference (F32 read in place). */
static void mmf_generic(const dp_weight *w, int64_t r0, int64_t nt, const float *x, int32_t m, float *y)
{
    const int64_t k = w->cols, n = w->rows;
    const size_t rb = w->nbytes / (size_t)w->rows;
    for (int64_t r = r0; r < r0 + nt; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r * rb;
        if (w->type == DP_TYPE_F32)
            for (int32_t i = 0; i < m; i++)
                y[(size_t)i * (size_t)n + (size_t)r] =
                    k_dot((const float *)src, x + (size_t)i * (size_t)k, k);
        else
            ref_row_dots(w->type, src, k, x, m, y + r, (size_t)n);
    }
}

/* A repacked weight (CPU_LAYOUT_X8) on the exact paths: each row back in
 * the file's layout first, so that the f32 results are those of the
 * unpacked weight, bit for bit. */
static void mmf_x8(const dp_weight *w, int64_t r0, int64_t nt, const float *x, int32_t m, float *y)
{
    const int64_t k = w->cols, n = w->rows;
    uint8_t row[CPU_X8_ROW_MAX];
    float out[4];
    for (int64_t r = r0; r < r0 + nt; r++) {
        cpu_x8_unpack_row(w, r, row);
        for (int32_t i0 = 0; i0 < m; i0 += 4) {
            const int32_t g = m - i0 < 4 ? m - i0 : 4;
            const float *xi = x + (size_t)i0 * (size_t)k;
            if (w->type == DP_TYPE_Q4_1)
                fused_rows(blk_q4_1, 20, row, k, xi, g, out);
            else if (w->type == DP_TYPE_Q4_0)
                fused_rows(blk_q4_0, 18, row, k, xi, g, out);
            else if (w->type == DP_TYPE_Q8_0)
                fused_rows(blk_q8_0, 34, row, k, xi, g, out);
            else /* Q5, K, IQ4: the reference's row, as mmf_generic reads the file's */
                ref_row_dots(w->type, row, k, xi, g, out, 1);
            for (int32_t i = 0; i < g; i++)
                y[(size_t)(i0 + i) * (size_t)n + (size_t)r] = out[i];
        }
    }
}

static void k_mm_f32(const dp_weight *w, int64_t r0, int64_t nt, const float *x, int32_t m, float *y)
{
    if (w->layout == CPU_LAYOUT_X8) {
        mmf_x8(w, r0, nt, x, m, y);
        return;
    }
    if (w->cols % 32 == 0)
        switch (w->type) {
#define CASE_F(id, name, bytes) \
    case id: mmf_##name(w, r0, nt, x, m, y); return;
            FAST_TYPES(CASE_F)
#undef CASE_F
        default: break;
        }
    mmf_generic(w, r0, nt, x, m, y);
}

static void k_decode_rows(const dp_weight *w, int64_t r0, int64_t nt, float *dst)
{
    const int64_t k = w->cols;
    if (w->layout == CPU_LAYOUT_X8) {
        uint8_t row[CPU_X8_ROW_MAX];
        for (int64_t r = 0; r < nt; r++) {
            float *d = dst + (size_t)r * (size_t)k;
            cpu_x8_unpack_row(w, r0 + r, row);
            if (w->type == DP_TYPE_Q4_1)
                dec_q4_1(row, 1, k, 20, d);
            else if (w->type == DP_TYPE_Q4_0)
                dec_q4_0(row, 1, k, 18, d);
            else if (w->type == DP_TYPE_Q8_0)
                dec_q8_0(row, 1, k, 34, d);
            else
                quant_dequant_row(w->type, row, d, k);
        }
        return;
    }
    const size_t rb = w->nbytes / (size_t)w->rows;
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * rb;
    if (k % 32 == 0)
        switch (w->type) {
#define CASE_D(id, name, bytes) \
    case id: dec_##name(src, nt, k, rb, dst); return;
            FAST_TYPES(CASE_D)
#undef CASE_D
        default: break;
        }
    for (int64_t r = 0; r < nt; r++) {
        if (w->type == DP_TYPE_F32)
            memcpy(dst + (size_t)r * (size_t)k, src + (size_t)r * rb, (size_t)k * sizeof(float));
        else
            quant_dequant_row(w->type, src + (size_t)r * rb, dst + (size_t)r * (size_t)k, k);
    }
}

/* ---- Activations quantized to int8 per 32 values; integer dot products. ---- */

static void k_quantize_q8(const float *x, int64_t k, cpu_q8 *out)
{
    for (int64_t b = 0; b < k / 32; b++) {
        const float *xb = x + b * 32;
        /* |x| as max(x, -x), VW lanes at a time (GCC leaves the scalar
         * max chain unvectorized: a quarter of the activations' cost). The
         * maximum is the same whatever the order. */
        vf m = vf_zero();
        for (int i = 0; i < 32; i += VW) {
            const vf v = vf_load(xb + i);
            m = vf_max(m, vf_max(v, vf_sub(vf_zero(), v)));
        }
        const float amax = vf_hmax(m);
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int half[2];
        for (int h = 0; h < 2; h++) { /* (two loops of 16 the compiler vectorizes) */
            int sum = 0;
            for (int i = 16 * h; i < 16 * h + 16; i++) {
                int q = (int)nearbyintf(xb[i] * id);
                out[b].q[i] = (int8_t)q;
                sum += q;
            }
            half[h] = sum; /* |sum| <= 16 * 127 */
        }
        out[b].d = d;
        out[b].s = d * (float)(half[0] + half[1]);
        out[b].h[0] = (int16_t)half[0];
        out[b].h[1] = (int16_t)half[1];
    }
}

#if VEC_PORTABLE
#define K_MM_Q8 NULL
#define K_Q8_SUPPORTS NULL
#define K_X8 false
#else
/* Sum of u[i] * s[i] (u unsigned bytes, s signed) in eight i32 lanes. */
static inline __m256i dot_u8s8(__m256i u, __m256i s)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    /* maddubs adds pairs into i16: 2 * 255 * 127 does not fit, but the
     * weights here are at most 15 (Q4) or |q| <= 128 with s's sign folded
     * in (Q8_0): 2 * 128 * 127 = 32512 does. */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

static inline __m256i q4_bytes(const uint8_t *p)
{
    __m128i lo, hi;
    nibbles(p, &lo, &hi);
    return _mm256_set_m128i(hi, lo);
}

/* One weight row against G quantized activation rows (row stride nb blocks).
 * Q4_1: w = d * u + m, so x . w = d * dx * (u . q) + m * s; Q4_0 is the same
 * with m = -8 d. Q8_0: signed bytes, the sign moved onto the activations so
 * that maddubs sees an unsigned operand. Even and odd blocks go to two
 * accumulators (the fma latency, not the port, bounds one), in the same
 * order for every G: a row's result does not depend on the batch it is in. */
/* Block b of the weight row into accumulator H of each row. */
#define Q8_STEP(G, b, H)                                                                        \
    do {                                                                                        \
        const uint8_t *p = wrow + (size_t)(b) * bb;                                             \
        _mm_prefetch((const char *)p + 512, _MM_HINT_T0);                                       \
        float dw = h2f(p), mw = 0.0f;                                                           \
        __m256i u;                                                                              \
        if (type == DP_TYPE_Q4_1) {                                                             \
            mw = h2f(p + 2);                                                                    \
            u = q4_bytes(p + 4);                                                                \
        } else if (type == DP_TYPE_Q4_0) {                                                      \
            mw = -8.0f * dw;                                                                    \
            u = q4_bytes(p + 2);                                                                \
        } else {                                                                                \
            u = _mm256_loadu_si256((const __m256i *)(p + 2));                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++) {                                                           \
            const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)(b);                       \
            __m256i s = _mm256_loadu_si256((const __m256i *)xb->q);                             \
            __m256i dp = type == DP_TYPE_Q8_0                                                   \
                             ? dot_u8s8(_mm256_sign_epi8(u, u), _mm256_sign_epi8(s, u))         \
                             : dot_u8s8(u, s);                                                  \
            acc##H[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(dw * xb->d),     \
                                        acc##H[i]);                                             \
            off##H[i] += mw * xb->s;                                                            \
        }                                                                                       \
    } while (0)

#define Q8_FIXED(G)                                                                            \
    static inline __attribute__((always_inline)) void q8row_##G(                              \
        uint32_t type, const uint8_t *wrow, int64_t nb, const cpu_q8 *xq, float *out)         \
    {                                                                                          \
        __m256 acc0[G], acc1[G];                                                               \
        float off0[G], off1[G];                                                                \
        for (int i = 0; i < G; i++) {                                                          \
            acc0[i] = acc1[i] = _mm256_setzero_ps();                                           \
            off0[i] = off1[i] = 0.0f;                                                          \
        }                                                                                      \
        const size_t bb = type == DP_TYPE_Q4_1 ? 20 : type == DP_TYPE_Q4_0 ? 18 : 34;          \
        int64_t b = 0;                                                                         \
        for (; b + 2 <= nb; b += 2) {                                                          \
            Q8_STEP(G, b, 0);                                                                  \
            Q8_STEP(G, b + 1, 1);                                                              \
        }                                                                                      \
        if (b < nb)                                                                            \
            Q8_STEP(G, b, 0);                                                                  \
        for (int i = 0; i < G; i++)                                                            \
            out[i] = hsum8(_mm256_add_ps(acc0[i], acc1[i])) + (off0[i] + off1[i]);             \
    }
Q8_FIXED(1)
Q8_FIXED(2)
Q8_FIXED(3)
Q8_FIXED(4)

/* Activation rows per pass over a weight row: as many as the registers hold
 * two accumulators for (32 vector registers with AVX-512, 16 with AVX2). */
#if VEC_AVX512
#define Q8_GROUP 4
#else
#define Q8_GROUP 3
#endif

/* One instance per weight type, so the type test folds away. */
#define DEFINE_Q8(id, name, bytes)                                                              \
    static void mmq_##name(const dp_weight *w, int64_t r0, int64_t nt, const cpu_q8 *xq,        \
                           int32_t m, float *y)                                                 \
    {                                                                                           \
        const int64_t nb = w->cols / 32, n = w->rows;                                           \
        const size_t rb = w->nbytes / (size_t)w->rows;                                          \
        float out[4];                                                                           \
        for (int32_t i0 = 0; i0 < m; i0 += Q8_GROUP) {                                          \
            const int32_t g = m - i0 < Q8_GROUP ? m - i0 : Q8_GROUP;                            \
            const cpu_q8 *xg = xq + (size_t)i0 * (size_t)nb;                                    \
            for (int64_t r = r0; r < r0 + nt; r++) {                                            \
                const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * rb;                  \
                switch (g) {                                                                    \
                case 1: q8row_1(id, wr, nb, xg, out); break;                                    \
                case 2: q8row_2(id, wr, nb, xg, out); break;                                    \
                case 3: q8row_3(id, wr, nb, xg, out); break;                                    \
                default: q8row_4(id, wr, nb, xg, out); break;                                   \
                }                                                                               \
                for (int32_t i = 0; i < g; i++)                                                 \
                    y[(size_t)(i0 + i) * (size_t)n + (size_t)r] = out[i];                       \
            }                                                                                   \
        }                                                                                       \
    }
FAST_TYPES(DEFINE_Q8)

#include "cpu_x8.h"
#define K_X8 true

static bool k_q8_supports(const dp_weight *w)
{
    if (w->cols % 32)
        return false;
    if (w->layout == CPU_LAYOUT_X8)
        return true; /* (only cpu_x8_type weights load so) */
    switch (w->type) {
#define CASE_T(id, name, bytes) case id:
        FAST_TYPES(CASE_T)
#undef CASE_T
        return true;
    default: return false;
    }
}

static void k_mm_q8(const dp_weight *w, int64_t r0, int64_t nt, const cpu_q8 *xq, int32_t m, float *y)
{
    if (w->layout == CPU_LAYOUT_X8) {
        mmq_x8(w, r0, nt, xq, m, y);
        return;
    }
    switch (w->type) {
#define CASE_Q(id, name, bytes) \
    case id: mmq_##name(w, r0, nt, xq, m, y); return;
        FAST_TYPES(CASE_Q)
#undef CASE_Q
    default: return; /* not reached: the caller asked q8_supports */
    }
}
#define K_MM_Q8 k_mm_q8
#define K_Q8_SUPPORTS k_q8_supports
#endif

/* ---- Attention and the scorer over paged, transposed K blocks. ---- */

/* n (<= VW) consecutive elements of K or V from element i of base (es bytes
 * each: 4 f32, 2 f16), as f32, zeros past n. */
static inline vf kv_loadv(const void *base, size_t es, size_t i, int32_t n)
{
    if (es == 4)
        return n == VW ? vf_load((const float *)base + i) : vf_loadn((const float *)base + i, n);
    const uint16_t *p = (const uint16_t *)base + i;
    if (n == VW)
        return vf_load_h(p);
    uint16_t tmp[VW] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return vf_load_h(tmp);
}

/* Where a chunk of at most VW keys of one head is read from: K transposed
 * (element (d, t) at k + d * kd + t) and V rows (element (t, d) at
 * v + t * hd + d), es bytes per element. An f32 / f16 store is read in
 * place. A quantized store's rows are quantized per token, so its K cannot
 * be read transposed: the chunk's K and V rows are dequantized into the
 * tile's buffers (rows: K as rows too, scored one token at a time). */
typedef struct kv_chunk {
    const void *k, *v;
    size_t es, kd;
    bool rows;                        /* K rows at kr (quantized stores) */
    float kr[VW * 256], vt[VW * 256]; /* quantized stores: head_dim <= 256 */
} kv_chunk;

/* One quantized row of head_dim values (q8_0 or q4_0 blocks) as f32. */
static inline void qrow_load(uint32_t qtype, const uint8_t *src, int32_t hd, float *dst)
{
    vf w[NBV];
    for (int32_t b = 0; b < hd / 32; b++) {
        if (qtype == DP_TYPE_Q8_0)
            blk_q8_0(src + (size_t)b * 34, w);
        else
            blk_q4_0(src + (size_t)b * 18, w);
        for (int j = 0; j < NBV; j++)
            vf_store(dst + (size_t)b * 32 + (size_t)j * VW, w[j]);
    }
}

static inline void chunk_load(kv_chunk *ch, const dp_kv_store *kv, int32_t layer, int32_t blk,
                              int32_t kvh, int32_t c0, int32_t nl)
{
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens;
    if (!kv->qtype) {
        const size_t ho = kv_head_off(kv, layer, blk, kvh);
        ch->k = (const uint8_t *)kv->k + (ho + (size_t)c0) * kv->es;
        ch->v = (const uint8_t *)kv->v + (ho + (size_t)c0 * (size_t)hd) * kv->es;
        ch->es = kv->es;
        ch->kd = (size_t)bt;
        ch->rows = false;
        return;
    }
    /* A head's rows of one block are consecutive (kv_qrow_off). */
    const size_t o = kv_qrow_off(kv, layer, blk, kvh, c0);
    const uint8_t *kq = (const uint8_t *)kv->k + o, *vq = (const uint8_t *)kv->v + o;
    for (int32_t t = 0; t < nl; t++) {
        qrow_load(kv->qtype, kq + (size_t)t * kv->row_bytes, hd, ch->kr + (size_t)t * (size_t)hd);
        qrow_load(kv->qtype, vq + (size_t)t * kv->row_bytes, hd, ch->vt + (size_t)t * (size_t)hd);
    }
    ch->k = ch->kr;
    ch->v = ch->vt;
    ch->es = 4;
    ch->kd = (size_t)hd;
    ch->rows = true;
}

/* Queries scored together against one chunk of an f32 / f16 store's keys
 * (k_head_scores). */
#if VW == 16
#define HS_TILE 8 /* 32 vector registers: 16 sums, 2 K columns */
#else
#define HS_TILE 4 /* 16 registers: 8 sums, 2 K columns */
#endif

/* VW scores (scaled) of each of nt queries against a transposed K chunk's
 * first nl keys, into out[0, nt): the even and odd dimensions summed apart,
 * then added. One pair of K columns is loaded and widened for all nt
 * queries (nt is a constant at each call, so the sums stay in registers). */
static inline void chunk_scores_cols(const kv_chunk *ch, int32_t hd, int32_t nl,
                                     const float *const *q, int nt, float scale, vf *out)
{
    const float *qt[HS_TILE]; /* held in registers, not read through q each step */
    vf a0[HS_TILE], a1[HS_TILE];
    for (int t = 0; t < nt; t++) {
        qt[t] = q[t];
        a0[t] = vf_zero();
        a1[t] = vf_zero();
    }
    int32_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        const vf k0 = kv_loadv(ch->k, ch->es, (size_t)d * ch->kd, nl);
        const vf k1 = kv_loadv(ch->k, ch->es, (size_t)(d + 1) * ch->kd, nl);
        for (int t = 0; t < nt; t++) {
            a0[t] = vf_fma(vf_set1(qt[t][d]), k0, a0[t]);
            a1[t] = vf_fma(vf_set1(qt[t][d + 1]), k1, a1[t]);
        }
    }
    for (; d < hd; d++) {
        const vf k0 = kv_loadv(ch->k, ch->es, (size_t)d * ch->kd, nl);
        for (int t = 0; t < nt; t++)
            a0[t] = vf_fma(vf_set1(qt[t][d]), k0, a0[t]);
    }
    const vf vs = vf_set1(scale);
    for (int t = 0; t < nt; t++)
        out[t] = vf_mul(vf_add(a0[t], a1[t]), vs);
}

/* VW scores (scaled) of q against the chunk's first nl keys (lanes past nl:
 * unspecified, the callers mask them). */
static inline vf chunk_scores(const kv_chunk *ch, int32_t hd, int32_t nl, const float *q, float scale)
{
    if (ch->rows) {
        /* head_dim is a multiple of 32 here (the quantized row types'
         * blocks), hence of VW. */
        float sc[VW] = {0};
        for (int32_t t = 0; t < nl; t++) {
            const float *kr = ch->kr + (size_t)t * (size_t)hd;
            vf a0 = vf_zero(), a1 = vf_zero();
            for (int32_t d = 0; d < hd; d += 2 * VW) {
                a0 = vf_fma(vf_load(q + d), vf_load(kr + d), a0);
                a1 = vf_fma(vf_load(q + d + VW), vf_load(kr + d + VW), a1);
            }
            sc[t] = vf_hsum(vf_add(a0, a1));
        }
        return vf_mul(vf_load(sc), vf_set1(scale));
    }
    vf s;
    chunk_scores_cols(ch, hd, nl, &q, 1, scale, &s);
    return s;
}

/* The online softmax's state for a group of query heads (k_attend). */
typedef struct attend_state {
    float mx[16], sum[16]; /* group <= MAX_GROUP (16) */
} attend_state;

static inline void attend_begin(attend_state *st, int32_t hd, float *const *outs, int32_t group)
{
    for (int32_t g = 0; g < group; g++) {
        st->mx[g] = -INFINITY;
        st->sum[g] = 0.0f;
        memset(outs[g], 0, (size_t)hd * sizeof(float)); /* accumulated in place */
    }
}

/* One head's scores s (scaled) of a loaded chunk of nl keys into its
 * running sums: the online softmax, then the chunk's values weighted. */
static inline void attend_head(attend_state *st, const kv_chunk *ch, int32_t hd, int32_t nl, vf s,
                               int32_t g, float *acc)
{
    float p[VW];
    if (nl < VW) {
        /* Lanes past the last key take no part in max or sum. */
        vf_store(p, s);
        for (int32_t t = nl; t < VW; t++)
            p[t] = -INFINITY;
        s = vf_load(p);
    }
    const float bm = vf_hmax(s);
    if (bm > st->mx[g]) {
        /* A new maximum rescales what was accumulated so far. */
        const float r = st->mx[g] == -INFINITY ? 0.0f : expf(st->mx[g] - bm);
        st->sum[g] *= r;
        const vf vr = vf_set1(r);
        int32_t d = 0;
        for (; d + VW <= hd; d += VW)
            vf_store(acc + d, vf_mul(vf_load(acc + d), vr));
        for (; d < hd; d++)
            acc[d] *= r;
        st->mx[g] = bm;
    }
    const vf e = vf_exp_neg(vf_sub(s, vf_set1(st->mx[g])));
    vf_store(p, e);
    for (int32_t t = nl; t < VW; t++)
        p[t] = 0.0f;
    float es = 0.0f;
    for (int32_t t = 0; t < nl; t++)
        es += p[t];
    st->sum[g] += es;
    for (int32_t d = 0; d < hd; d += VW) {
        const int32_t nd = hd - d < VW ? hd - d : VW;
        vf a = nd == VW ? vf_load(acc + d) : vf_loadn(acc + d, nd);
        for (int32_t t = 0; t < nl; t++)
            a = vf_fma(vf_set1(p[t]), kv_loadv(ch->v, ch->es, (size_t)t * hd + (size_t)d, nd), a);
        if (nd == VW)
            vf_store(acc + d, a);
        else
            vf_storen(acc + d, a, nd);
    }
}

/* One loaded chunk of nl keys into every query head's running sums. */
static inline void attend_chunk(attend_state *st, const kv_chunk *ch, int32_t hd, int32_t nl,
                                const float *const *qs, float *const *outs, int32_t group,
                                float scale)
{
    for (int32_t g = 0; g < group; g++)
        attend_head(st, ch, hd, nl, chunk_scores(ch, hd, nl, qs[g], scale), g, outs[g]);
}

/* kivi4 groups: keys are never made floats. A score is
 * sum_c q[c] (m[c] + code[c] d[c]) = sum_c (q[c] d[c]) code[c] + sum_c q[c] m[c],
 * so per group each head's query is scaled by the channels' d (qd) and its
 * bias taken once, and a chunk's scores are qd's dot products with the
 * codes, each channel's codes converted once for every head of the group.
 * Values are made floats a row at a time into the chunk's tile. */
typedef struct kivi_q {
    float qd[16][256]; /* [group][head_dim] (group <= 16, head_dim <= 256) */
    float bias[16];
} kivi_q;

static inline void kivi_q_set(kivi_q *kq, const uint8_t *kb, int32_t hd, const float *const *qs,
                              int32_t group, float scale)
{
    const uint16_t *kd = (const uint16_t *)kb; /* d[hd], then m[hd] (hd: whole 64s) */
    const vf vs = vf_set1(scale);
    for (int32_t g = 0; g < group; g++) {
        vf b = vf_zero();
        for (int32_t c = 0; c < hd; c += VW) {
            const vf q = vf_load(qs[g] + c);
            vf_store(kq->qd[g] + c, vf_mul(vf_mul(q, vf_load_h(kd + c)), vs));
            b = vf_fma(q, vf_load_h(kd + hd + c), b);
        }
        kq->bias[g] = vf_hsum(b) * scale;
    }
}

/* The scores of heads h0 .. h0 + nh (nh <= 4, a constant where this is
 * inlined, so that the sums stay in registers) against a chunk of a group's
 * keys: each channel's codes converted once for all of them. */
static inline void kivi_scores(const kivi_q *kq, const uint8_t *kb, int32_t hd, int32_t g,
                               int32_t c0, int32_t nl, int32_t h0, int nh, vf *out)
{
    const uint8_t *codes = kb + (size_t)hd * 4;
    uint8_t part[VW / 2] = {0}; /* a short chunk's codes: no read past the group's */
    vf a[4];
    for (int h = 0; h < nh; h++)
        a[h] = vf_set1(kq->bias[h0 + h]);
    for (int32_t c = 0; c < hd; c++) {
        const uint8_t *row = codes + (size_t)c * (size_t)(g / 2) + c0 / 2;
        if (nl < VW) {
            memcpy(part, row, (size_t)(nl + 1) / 2);
            row = part;
        }
        const vf x = vf_load_nib(row);
        for (int h = 0; h < nh; h++)
            a[h] = vf_fma(vf_set1(kq->qd[h0 + h][c]), x, a[h]);
    }
    for (int h = 0; h < nh; h++)
        out[h] = a[h];
}

static inline void attend_kivi_chunk(attend_state *st, kv_chunk *ch, const kivi_q *kq,
                                     const dp_kv_store *kv, const uint8_t *kb, const uint8_t *vb,
                                     int32_t c0, int32_t nl, float *const *outs, int32_t group)
{
    const int32_t hd = kv->l.head_dim;
    vf s[16];
    for (int32_t h0 = 0; h0 < group; h0 += 4) {
        switch (group - h0 < 4 ? group - h0 : 4) {
        case 1: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 1, s + h0); break;
        case 2: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 2, s + h0); break;
        case 3: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 3, s + h0); break;
        default: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 4, s + h0); break;
        }
    }
    const size_t vrow = kivi_vrow_bytes(hd);
    for (int32_t t = 0; t < nl; t++) {
        const uint8_t *r = vb + (size_t)(c0 + t) * vrow;
        const uint16_t *sm = (const uint16_t *)r; /* d, m per KIVI_VGROUP channels */
        const uint8_t *vc = r + (size_t)hd / KIVI_VGROUP * 4;
        float *dst = ch->vt + (size_t)t * (size_t)hd;
        for (int32_t j = 0; j < hd / KIVI_VGROUP; j++) {
            const vf d = vf_set1(kv_h2f(sm[2 * j])), m = vf_set1(kv_h2f(sm[2 * j + 1]));
            for (int32_t c = j * KIVI_VGROUP; c < (j + 1) * KIVI_VGROUP; c += VW)
                vf_store(dst + c, vf_fma(vf_load_nib(vc + c / 2), d, m));
        }
    }
    ch->v = ch->vt;
    ch->es = 4;
    for (int32_t h = 0; h < group; h++)
        attend_head(st, ch, hd, nl, s[h], h, outs[h]);
}

/* Slots [0, n) of a kivi4 store's groups, table[i] the i-th group. */
static void attend_groups(attend_state *st, kv_chunk *ch, kivi_q *kq, const dp_kv_store *kv,
                          int32_t layer, int32_t kvh, const int32_t *table, int32_t n,
                          const float *const *qs, float *const *outs, int32_t group, float scale)
{
    const int32_t hd = kv->l.head_dim, g = kv->l.block_tokens;
    for (int32_t done = 0; done < n;) {
        const size_t o = kv_kivi_off(kv, layer, table[done / g], kvh);
        const uint8_t *kb = (const uint8_t *)kv->k + o, *vb = (const uint8_t *)kv->v + o;
        kivi_q_set(kq, kb, hd, qs, group, scale);
        const int32_t end = done - done % g + g < n ? done - done % g + g : n;
        while (done < end) {
            const int32_t c0 = done % g, nl = end - done < VW ? end - done : VW;
            attend_kivi_chunk(st, ch, kq, kv, kb, vb, c0, nl, outs, group);
            done += nl;
        }
    }
}

static inline void attend_end(const attend_state *st, int32_t hd, float *const *outs, int32_t group)
{
    for (int32_t g = 0; g < group; g++) {
        const float inv = 1.0f / st->sum[g];
        for (int32_t d = 0; d < hd; d++)
            outs[g][d] *= inv;
    }
}

/* Slots [s0, s1) of a table whose blocks are consecutive runs of bt slots
 * of kv, from block index b0 on (slot s0 at token t0 of that block). */
static inline void attend_run(attend_state *st, kv_chunk *ch, const dp_kv_store *kv, int32_t layer,
                              int32_t kvh, const int32_t *table, int32_t t0, int32_t n,
                              const float *const *qs, float *const *outs, int32_t group, float scale)
{
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens;
    for (int32_t done = 0; done < n;) {
        const int32_t q = t0 + done, blk = table[q / bt], c0 = q % bt;
        int32_t nl = bt - c0 < VW ? bt - c0 : VW;
        nl = n - done < nl ? n - done : nl;
        chunk_load(ch, kv, layer, blk, kvh, c0, nl); /* once for the whole group */
        attend_chunk(st, ch, hd, nl, qs, outs, group, scale);
        done += nl;
    }
}

static void k_attend(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                     int32_t n_slots, const float *const *qs, float *const *outs, int32_t group,
                     float scale)
{
    attend_state st;
    kv_chunk ch;
    attend_begin(&st, kv->l.head_dim, outs, group);
    attend_run(&st, &ch, kv, layer, kvh, table, 0, n_slots, qs, outs, group, scale);
    attend_end(&st, kv->l.head_dim, outs, group);
}

/* A grouped store's sequence (backend.h seq_sealed): its lead in the
 * arena's block at table[0], its sealed groups, then its residual in the
 * arena's blocks that follow them in the table. sealed INT32_MAX: every
 * slot a group's, from table[0]. */
static void k_attend_grouped(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                             int32_t n_slots, int32_t sealed, int32_t roff, const float *const *qs,
                             float *const *outs, int32_t group, float scale)
{
    attend_state st;
    kv_chunk ch;
    const int32_t bbt = kv->base->l.block_tokens, G = kv->l.block_tokens;
    const int32_t lead = sealed == INT32_MAX ? 0 : dp_kv_group_lead(bbt, sealed);
    const int32_t ns = n_slots < sealed ? n_slots : sealed;
    attend_begin(&st, kv->l.head_dim, outs, group);
    if (lead > 0)
        attend_run(&st, &ch, kv->base, layer, kvh, table, 0, ns < lead ? ns : lead, qs, outs,
                   group, scale);
    kivi_q kq;
    attend_groups(&st, &ch, &kq, kv, layer, kvh, table + (lead > 0), ns - lead, qs, outs, group,
                  scale);
    if (n_slots > sealed)
        attend_run(&st, &ch, kv->base, layer, kvh, table + dp_kv_group_rstart(bbt, G, sealed),
                   roff, n_slots - sealed, qs, outs, group, scale);
    attend_end(&st, kv->l.head_dim, outs, group);
}

/* Scaled scores of nq queries against slots [0, n) of one head: row j into
 * sc[j], each the sums chunk_scores makes, in its order (so one query's
 * scores do not depend on the others). A chunk of keys is loaded once for
 * all of them and, from an f32 / f16 store, read HS_TILE queries at a time:
 * each widened pair of K columns feeds 2 x HS_TILE multiply-adds where one
 * query at a time paid a widening and a load per multiply-add. */
static void k_head_scores(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                          int32_t n, const float *const *qs, int32_t nq, float scale, float *const *sc)
{
    const dp_kv_layout *l = &kv->l;
    const int32_t hd = l->head_dim, bt = l->block_tokens;
    kv_chunk ch;
    for (int32_t base = 0; base < n; base += bt) {
        const int32_t blk = table[base / bt];
        const int32_t nb = n - base < bt ? n - base : bt;
        for (int32_t c0 = 0; c0 < nb; c0 += VW) {
            const int32_t nl = nb - c0 < VW ? nb - c0 : VW;
            const size_t at = (size_t)base + (size_t)c0;
            chunk_load(&ch, kv, layer, blk, kvh, c0, nl);
            int32_t j0 = 0;
            if (!ch.rows)
                for (; j0 + HS_TILE <= nq; j0 += HS_TILE) {
                    vf s[HS_TILE];
                    chunk_scores_cols(&ch, hd, nl, qs + j0, HS_TILE, scale, s);
                    for (int t = 0; t < HS_TILE; t++) {
                        if (nl == VW)
                            vf_store(sc[j0 + t] + at, s[t]);
                        else
                            vf_storen(sc[j0 + t] + at, s[t], nl);
                    }
                }
            for (int32_t j = j0; j < nq; j++) {
                const vf s = chunk_scores(&ch, hd, nl, qs[j], scale);
                if (nl == VW)
                    vf_store(sc[j] + at, s);
                else
                    vf_storen(sc[j] + at, s, nl);
            }
        }
    }
}

/* ---- The migration copy (kv_compact): rows out of one store, into another. ---- */

/* Rows [0, n) of one head of one block as f32 rows [n][head_dim], K and V:
 * the transposed K of an f32 / f16 store is widened a vector of tokens at a
 * time (the scalar gather converted one element per load). */
static void k_kv_rows(const dp_kv_store *kv, int32_t layer, int32_t blk, int32_t head, int32_t n,
                      float *kr, float *vr)
{
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens;
    if (kv->qtype) {
        const uint8_t *k = (const uint8_t *)kv->k + kv_qrow_off(kv, layer, blk, head, 0);
        const uint8_t *v = (const uint8_t *)kv->v + kv_qrow_off(kv, layer, blk, head, 0);
        for (int32_t t = 0; t < n; t++) {
            qrow_load(kv->qtype, k + (size_t)t * kv->row_bytes, hd, kr + (size_t)t * (size_t)hd);
            qrow_load(kv->qtype, v + (size_t)t * kv->row_bytes, hd, vr + (size_t)t * (size_t)hd);
        }
        return;
    }
    const size_t ho = kv_head_off(kv, layer, blk, head);
    const uint8_t *kb = (const uint8_t *)kv->k + ho * kv->es, *vb = (const uint8_t *)kv->v + ho * kv->es;
    float lanes[VW];
    for (int32_t t0 = 0; t0 < n; t0 += VW) {
        const int32_t nl = n - t0 < VW ? n - t0 : VW;
        for (int32_t d = 0; d < hd; d++) {
            vf_store(lanes, kv_loadv(kb, kv->es, (size_t)d * (size_t)bt + (size_t)t0, nl));
            for (int32_t t = 0; t < nl; t++)
                kr[(size_t)(t0 + t) * (size_t)hd + (size_t)d] = lanes[t];
        }
    }
    for (int32_t t = 0; t < n; t++)
        for (int32_t d = 0; d < hd; d += VW) {
            const int32_t nd = hd - d < VW ? hd - d : VW;
            const vf x = kv_loadv(vb, kv->es, (size_t)t * (size_t)hd + (size_t)d, nd);
            if (nd == VW)
                vf_store(vr + (size_t)t * (size_t)hd + (size_t)d, x);
            else
                vf_storen(vr + (size_t)t * (size_t)hd + (size_t)d, x, nd);
        }
}

#if defined(__AVX2__) && defined(__F16C__)
/* One q8_0 block of 32 values, bit-identical to kernels/quant.c's scalar
 * quantizer: the same IEEE operations in lanes (|x| maximum ignoring NaN,
 * d through f16, x * (1 / d) clamped to +-127, rounded half away from zero
 * by adding +-0.5 and truncating, NaN to 0). The decode path's rows are
 * then the same bytes at every level. */
static void q8_0_block(const float *x, uint8_t *b)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), m); /* a NaN lane keeps m */
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const uint16_t dh = dp_f32_to_fp16(_mm_cvtss_f32(h) / 127.0f);
    b[0] = (uint8_t)(dh & 0xff);
    b[1] = (uint8_t)(dh >> 8);
    const float d = _cvtsh_ss(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 zero = _mm256_setzero_ps(), half = _mm256_set1_ps(0.5f), nhalf = _mm256_set1_ps(-0.5f);
    int32_t q[32];
    for (int j = 0; j < 4; j++) {
        const __m256 p = _mm256_mul_ps(v[j], vid);
        const __m256 num = _mm256_cmp_ps(p, p, _CMP_ORD_Q);
        const __m256 c = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
        const __m256 r = _mm256_add_ps(c, _mm256_blendv_ps(half, nhalf, _mm256_cmp_ps(c, zero, _CMP_LT_OQ)));
        _mm256_storeu_si256((__m256i *)(q + 8 * j),
                            _mm256_and_si256(_mm256_cvttps_epi32(r), _mm256_castps_si256(num)));
    }
    int8_t *qs = (int8_t *)(b + 2);
    for (int j = 0; j < 32; j++)
        qs[j] = (int8_t)q[j];
}
#endif

/* One row of n values into a quantized store's row (q8_0 in lanes where the
 * level has them; otherwise, and for q4_0, kernels/quant.c's quantizer). */
static void k_kv_quant_row(uint32_t qtype, const float *x, uint8_t *dst, int32_t n)
{
#if defined(__AVX2__) && defined(__F16C__)
    if (qtype == DP_TYPE_Q8_0) {
        for (int32_t b = 0; b < n / 32; b++)
            q8_0_block(x + (size_t)b * 32, dst + (size_t)b * 34);
        return;
    }
#endif
    quant_quantize_row(qtype, x, dst, n);
}

static double k_exp_sum(float *sc, int32_t n, float mx)
{
    int32_t i = 0;
    vf vs = vf_zero();
    const vf vm = vf_set1(mx);
    for (; i + VW <= n; i += VW) {
        vf e = vf_exp_neg(vf_sub(vf_load(sc + i), vm));
        vf_store(sc + i, e);
        vs = vf_add(vs, e);
    }
    double sum = vf_hsum(vs);
    for (; i < n; i++)
        sum += (sc[i] = expf(sc[i] - mx));
    return sum;
}

/* o[i] += softmax(sc[0, n))[i], sc overwritten with its exponentials: one
 * query head's attention row added to a score row, at the level's width. */
static void k_softmax_add(float *sc, int32_t n, float *o)
{
    int32_t i = 0;
    vf vm = vf_set1(-INFINITY);
    for (; i + VW <= n; i += VW)
        vm = vf_max(vf_load(sc + i), vm); /* a NaN score is passed over, as below */
    float mx = vf_hmax(vm);
    for (; i < n; i++)
        mx = sc[i] > mx ? sc[i] : mx;
    const float inv = (float)(1.0 / k_exp_sum(sc, n, mx));
    const vf vi = vf_set1(inv);
    for (i = 0; i + VW <= n; i += VW)
        vf_store(o + i, vf_add(vf_load(o + i), vf_mul(vf_load(sc + i), vi)));
    for (; i < n; i++)
        o[i] += sc[i] * inv;
}

const cpu_kern KERN_TABLE = {
    .name = KERN_STR(CPU_KERN_NAME),
    .dot = k_dot,
    .mm_f32 = k_mm_f32,
    .x8 = K_X8,
    .q8_supports = K_Q8_SUPPORTS,
    .mm_q8 = K_MM_Q8,
    .quantize_q8 = k_quantize_q8,
    .decode_rows = k_decode_rows,
    .attend = k_attend,
    .attend_grouped = k_attend_grouped,
    .head_scores = k_head_scores,
    .softmax_add = k_softmax_add,
    .kv_rows = k_kv_rows,
    .kv_quant_row = k_kv_quant_row,
    .topk_row = topk_row_impl,
    .topk_argmax = topk_argmax_impl,
    .topk_weights = topk_weights_impl,
};
