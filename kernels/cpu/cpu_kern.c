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

#include "cpu_kern_attn.h"

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
    .attend_tile = k_attend_tile,
    .attend_grouped = k_attend_grouped,
    .head_scores = k_head_scores,
    .softmax_add = k_softmax_add,
    .kv_rows = k_kv_rows,
    .kv_quant_row = k_kv_quant_row,
    .topk_row = topk_row_impl,
    .topk_argmax = topk_argmax_impl,
    .topk_weights = topk_weights_impl,
};
