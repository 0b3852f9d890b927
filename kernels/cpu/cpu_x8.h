/* cpu_x8.h: the integer matmul over weights repacked in groups of 8 rows
 * (CPU_LAYOUT_X8, cpu_internal.h): one kernel per block type, each for 1-4
 * activation rows, and mmq_x8, which runs them over a tile of rows.
 *
 * Not a header of its own: cpu_kern.c includes it once per instruction-set
 * level (AVX2, AVX-512), after its int8 activation code, so that the
 * kernels inline into mmq_x8 at that level's flags. */

/* ---- Weights repacked in groups of 8 rows (CPU_LAYOUT_X8): for each block,
 * 4 activation bytes broadcast against a vector of the 8 rows' bytes give
 * the 8 rows' products in its 8 lanes, and the 8 rows' scales are one
 * vector. Q4: maddubs pairs stay in i16 across the block's 8 chunks (at
 * most 8 * 2 * 15 * 127 = 30480), one madd sums them; per block and
 * activation row that is 8 broadcasts, 8 maddubs and 8 adds for 256
 * products. Q8_0: the weights' signs move onto the activations (maddubs
 * takes one unsigned operand) and each chunk's pairs go to i32 at once (2 *
 * 128 * 127 per pair leaves no room to add chunks in i16). Each activation
 * row's sums run in the same order whatever the batch: a row's result does
 * not depend on the rows beside it. With AVX-512 VNNI (256-bit, VL) one
 * dpbusd adds each 4-byte product group straight into i32: the same integer
 * sums (none of the i16 steps above saturates), so the AVX2 and AVX-512
 * levels give the same bits, in fewer instructions on the latter. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define X8_VNNI 1
#else
#define X8_VNNI 0
#endif
static inline __m256i bcast4(const int8_t *q)
{
    int32_t v;
    memcpy(&v, q, 4);
    return _mm256_set1_epi32(v);
}

/* The Q4 kernel's per-block sums: pairs in i16 then one madd (AVX2), or i32
 * lanes throughout (VNNI, where the final madd is not needed); the Q8_0
 * kernel's: each chunk into i32.
 *
 * Each accumulation passes through x8_keep, an empty asm that claims to
 * change its operand, so a block's sums are formed one product at a time in
 * the order written. Without it GCC re-associates a block's integer adds
 * into a tree that holds every product at once and, with 4 activation
 * rows, spills them and the float accumulators to the stack: the Q4_0,
 * Q4_1 and Q4_K kernels ran 1.27-1.29x faster with it (1536 x 1536, 32
 * activation rows, 1 thread, best of 6), Q8_0, Q5_0 and IQ4_NL 1.04-1.08x.
 * Q2_K and Q3_K (two sums a row, X8_ACC16_FREE) are faster without it. The
 * integer sums are exact, so the order changes no bit. */
static inline __m256i x8_keep(__m256i v)
{
    __asm__("" : "+x"(v));
    return v;
}
#if X8_VNNI
#define X8_ACC16(acc, u, s) x8_keep(_mm256_dpbusd_epi32((acc), (u), (s)))
#define X8_SUM16(acc, ones) ((void)(ones), (acc))
#define X8_ACC16_FREE(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define X8_ACC32(acc, u, s, ones) ((void)(ones), x8_keep(_mm256_dpbusd_epi32((acc), (u), (s))))
#define X8_ACC5(s, t, k, lo, alo, hi, ahi, ones)                                                \
    ((void)(t), (void)(ones),                                                                   \
     (s) = x8_keep(_mm256_dpbusd_epi32(_mm256_dpbusd_epi32((s), (lo), (alo)), (hi), (ahi))))
#else
#define X8_ACC16(acc, u, s) x8_keep(_mm256_add_epi16((acc), _mm256_maddubs_epi16((u), (s))))
#define X8_SUM16(acc, ones) _mm256_madd_epi16((acc), (ones))
#define X8_ACC16_FREE(acc, u, s) _mm256_add_epi16((acc), _mm256_maddubs_epi16((u), (s)))
#define X8_ACC32(acc, u, s, ones) \
    x8_keep(_mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), (ones))))
/* Q5's chunk k (its low and high nibbles): the pairs (at most 2 * 31 * 127)
 * of chunks 2h and 2h + 1 summed in i16 (at most 4 * 7874 = 31496), then
 * one madd into i32: the same integers as one madd per chunk. */
#define X8_ACC5(s, t, k, lo, alo, hi, ahi, ones)                                                \
    do {                                                                                        \
        const __m256i pr_ = _mm256_add_epi16(_mm256_maddubs_epi16((lo), (alo)),                 \
                                             _mm256_maddubs_epi16((hi), (ahi)));                \
        if ((k) & 1)                                                                            \
            (s) = x8_keep(                                                                      \
                _mm256_add_epi32((s), _mm256_madd_epi16(_mm256_add_epi16((t), pr_), (ones))));  \
        else                                                                                    \
            (t) = x8_keep(pr_);                                                                 \
    } while (0)
#endif

/* Four mask bits of a lane (from bit `shift`) to bit 0 of its four bytes by
 * one multiply (bit k lands at 8k only: the four shifted copies do not
 * overlap): Q3_K's third bits. */
static inline __m256i x8_bits1(__m256i qh, int shift)
{
    const __m256i x = _mm256_and_si256(_mm256_srli_epi32(qh, shift), _mm256_set1_epi32(0xf));
    return _mm256_and_si256(_mm256_mullo_epi32(x, _mm256_set1_epi32(0x00204081)),
                            _mm256_set1_epi32(0x01010101));
}
/* The high bits packed beside the nibbles (Q5's fifth bits, Q6_K's top
 * two; cpu_internal.h): the field at bit b of every byte moved to bit 4,
 * a nibble's next bit, and kept by mask. A 16-bit shift by at most 4 moves
 * no kept bit between the two bytes of a lane. */
static inline __m256i x8_field4(__m256i h, int b, int mask)
{
    const __m256i v = b <= 4 ? _mm256_slli_epi16(h, 4 - b) : _mm256_srli_epi16(h, b - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8((char)mask));
}
/* Q5: bit 2 k of each byte is chunk k's low nibbles' fifth bit, 2 k + 1
 * its high ones'. */
static inline __m256i x8_bit5(__m256i h, int b) { return x8_field4(h, b, 0x10); }

/* 8 bytes (the 8 rows' scales) as floats. */
static inline __m256 x8_u8ps(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 x8_i8ps(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Q4_0 / Q4_1 (BITS 4) and Q5_0 / Q5_1 (BITS 5). MINS 1: 8 mins follow the
 * scales; MINS 0: m = -8 d (Q4_0) or -16 d (Q5_0). Q5 puts each nibble's
 * fifth bit back from the vector of fifth bits (x8_bit5). Q4's pairs stay
 * in i16 across the block (at most 8 * 2 * 15 * 127); Q5's reach 2 * 31 *
 * 127 per pair, so they go to i32 every two chunks (X8_ACC5). */
#define X8_Q45(G, BITS, MINS)                                                                   \
    static inline __attribute__((always_inline)) void x8q##BITS##_##MINS##_##G(                \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { Q5 = BITS == 5, QH = MINS ? 32 : 16, HEAD = QH + (Q5 ? 32 : 0), BLK = HEAD + 128 }; \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);               \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const uint8_t *p = gp + (size_t)b * BLK;                                            \
            _mm_prefetch((const char *)p + 4 * BLK, _MM_HINT_T0);                               \
            const __m256i qh =                                                                  \
                Q5 ? _mm256_loadu_si256((const __m256i *)(p + QH)) : _mm256_setzero_si256();    \
            __m256i s[G], t[G];                                                                 \
            for (int i = 0; i < G; i++)                                                         \
                s[i] = t[i] = _mm256_setzero_si256();                                           \
            for (int k = 0; k < 4; k++) {                                                       \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(p + HEAD + 32 * k));    \
                __m256i lo = _mm256_and_si256(v, low);                                          \
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                    \
                if (Q5) {                                                                       \
                    lo = _mm256_or_si256(lo, x8_bit5(qh, 2 * k));                               \
                    hi = _mm256_or_si256(hi, x8_bit5(qh, 2 * k + 1));                           \
                }                                                                               \
                for (int i = 0; i < G; i++) {                                                   \
                    const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;                 \
                    if (Q5) {                                                                   \
                        X8_ACC5(s[i], t[i], k, lo, bcast4(q + 4 * k), hi,                       \
                                bcast4(q + 16 + 4 * k), ones);                                  \
                    } else {                                                                    \
                        s[i] = X8_ACC16(s[i], lo, bcast4(q + 4 * k));                           \
                        s[i] = X8_ACC16(s[i], hi, bcast4(q + 16 + 4 * k));                      \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            const __m256 mv = MINS ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))) \
                                   : _mm256_mul_ps(dv, _mm256_set1_ps(Q5 ? -16.0f : -8.0f));    \
            for (int i = 0; i < G; i++) {                                                       \
                const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)b;                     \
                const __m256 dot = _mm256_cvtepi32_ps(Q5 ? s[i] : X8_SUM16(s[i], ones));        \
                acc[i] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(xb->d)), acc[i]); \
                acc[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xb->s), acc[i]);                    \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_Q45(1, 4, 1)
X8_Q45(2, 4, 1)
X8_Q45(3, 4, 1)
X8_Q45(4, 4, 1)
X8_Q45(1, 4, 0)
X8_Q45(2, 4, 0)
X8_Q45(3, 4, 0)
X8_Q45(4, 4, 0)
X8_Q45(1, 5, 1)
X8_Q45(2, 5, 1)
X8_Q45(3, 5, 1)
X8_Q45(4, 5, 1)
X8_Q45(1, 5, 0)
X8_Q45(2, 5, 0)
X8_Q45(3, 5, 0)
X8_Q45(4, 5, 0)

/* Q4_K (Q5 0) and Q5_K (Q5 1) per super-block: each 32-column sub-block is
 * Q4_1's sum (Q5_1's with Q5_K's fifth bits) with the rows' scale d * sc
 * and min dmin * m, made from the bytes as a vector (exact in f32, as the
 * reference's products are). */
#define X8_QK(G, Q5)                                                                            \
    static inline __attribute__((always_inline)) void x8qk_##Q5##_##G(                         \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { QS = Q5 ? CPU_X8K_Q5_QS : CPU_X8K_Q4_QS, BLK = QS + 8 * 128 };                   \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);               \
        for (int64_t sb = 0; sb < nb / 8; sb++) {                                               \
            const uint8_t *p = gp + (size_t)sb * BLK;                                           \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));     \
            for (int s = 0; s < 8; s++) {                                                       \
                const uint8_t *qs = p + QS + 128 * s;                                           \
                const int64_t b = sb * 8 + s;                                                   \
                _mm_prefetch((const char *)qs + 512, _MM_HINT_T0);                              \
                const __m256i qh =                                                              \
                    Q5 ? _mm256_loadu_si256((const __m256i *)(p + CPU_X8K_Q4_QS + 32 * s))      \
                       : _mm256_setzero_si256();                                                \
                __m256i s16[G], t[G];                                                           \
                for (int i = 0; i < G; i++)                                                     \
                    s16[i] = t[i] = _mm256_setzero_si256();                                     \
                for (int k = 0; k < 4; k++) {                                                   \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));      \
                    __m256i lo = _mm256_and_si256(v, low);                                      \
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);                \
                    if (Q5) {                                                                   \
                        lo = _mm256_or_si256(lo, x8_bit5(qh, 2 * k));                           \
                        hi = _mm256_or_si256(hi, x8_bit5(qh, 2 * k + 1));                       \
                    }                                                                           \
                    for (int i = 0; i < G; i++) {                                               \
                        const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;             \
                        if (Q5) { /* (as Q5_0's: two chunks in i16, then i32) */                \
                            X8_ACC5(s16[i], t[i], k, lo, bcast4(q + 4 * k), hi,                 \
                                    bcast4(q + 16 + 4 * k), ones);                              \
                        } else {                                                                \
                            s16[i] = X8_ACC16(s16[i], lo, bcast4(q + 4 * k));                   \
                            s16[i] = X8_ACC16(s16[i], hi, bcast4(q + 16 + 4 * k));              \
                        }                                                                       \
                    }                                                                           \
                }                                                                               \
                const __m256 sv = _mm256_mul_ps(dv, x8_u8ps(p + 32 + 8 * s));                   \
                const __m256 mv = _mm256_mul_ps(dmv, x8_u8ps(p + 96 + 8 * s));                  \
                for (int i = 0; i < G; i++) {                                                   \
                    const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)b;                 \
                    const __m256 dot =                                                          \
                        _mm256_cvtepi32_ps(Q5 ? s16[i] : X8_SUM16(s16[i], ones));               \
                    acc[i] = _mm256_fmadd_ps(dot, _mm256_mul_ps(sv, _mm256_set1_ps(xb->d)), acc[i]); \
                    acc[i] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(xb->s), acc[i]);               \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_QK(1, 0)
X8_QK(2, 0)
X8_QK(3, 0)
X8_QK(4, 0)
X8_QK(1, 1)
X8_QK(2, 1)
X8_QK(3, 1)
X8_QK(4, 1)

/* Q6_K's top 2 bits of nibble vector k (its low nibbles: hi 0, its high
 * ones: hi 1) from top-bit vector k / 2, at bit 4 (k % 2) + 2 hi, to bits
 * 4-5 of each byte. */
static inline __m256i x8_top2(__m256i h, int k, int hi)
{
    return x8_field4(h, 4 * (k % 2) + 2 * hi, 0x30);
}

/* The 8 rows' int8 scales sc0 (columns 0-15) and sc1 (16-31) as i16 pairs
 * of each lane: (sc0, sc0), (sc1, sc1) and (sc0, sc1). */
static inline void x8_sc16(const uint8_t *p, __m256i *s0, __m256i *s1, __m256i *s01)
{
    const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    const __m256i bs = _mm256_slli_epi32(b, 16);
    *s0 = _mm256_blend_epi16(a, _mm256_slli_epi32(a, 16), 0xaa);
    *s1 = _mm256_blend_epi16(b, bs, 0xaa);
    *s01 = _mm256_blend_epi16(a, bs, 0xaa);
}

/* Q6_K per super-block: each value's nibble and top 2 bits as an unsigned
 * 0..63, its pairs (at most 2 * 63 * 127) times the row's scale of its 16
 * columns by one madd into i32; the offset of 32 comes off once a block:
 * sum(sc (q - 32) x) = sum(sc q x) - 32 (sc0 h0 + sc1 h1), h the
 * activation block's half sums, sc0 h0 + sc1 h1 one more madd. The whole
 * block's sum is an exact integer (at most 32 * 128 * 63 * 127) times d
 * and the activation's scale. */
#define X8_Q6K(G)                                                                               \
    static inline __attribute__((always_inline)) void x8q6k_##G(                               \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { BLK = CPU_X8K_Q6_QS + 8 * 192 };                                                 \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i low = _mm256_set1_epi8(0x0f);                                             \
        for (int64_t sb = 0; sb < nb / 8; sb++) {                                               \
            const uint8_t *p = gp + (size_t)sb * BLK;                                           \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            for (int s = 0; s < 8; s++) {                                                       \
                const uint8_t *qs = p + CPU_X8K_Q6_QS + 192 * s;                                \
                const int64_t b = sb * 8 + s;                                                   \
                _mm_prefetch((const char *)qs + 768, _MM_HINT_T0);                              \
                _mm_prefetch((const char *)qs + 768 + 64, _MM_HINT_T0);                         \
                __m256i sc0, sc1, sc01;                                                         \
                x8_sc16(p + 16 + 16 * s, &sc0, &sc1, &sc01);                                    \
                __m256i s32[G];                                                                 \
                for (int i = 0; i < G; i++)                                                     \
                    s32[i] = _mm256_setzero_si256();                                            \
                for (int k = 0; k < 4; k++) {                                                   \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));      \
                    const __m256i h =                                                           \
                        _mm256_loadu_si256((const __m256i *)(qs + 128 + 32 * (k / 2)));         \
                    const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low), x8_top2(h, k, 0)); \
                    const __m256i hi = _mm256_or_si256(                                         \
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), low), x8_top2(h, k, 1));      \
                    for (int i = 0; i < G; i++) {                                               \
                        const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;             \
                        s32[i] = x8_keep(_mm256_add_epi32(                                      \
                            s32[i], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, bcast4(q + 4 * k)), \
                                                      sc0)));                                   \
                        s32[i] = x8_keep(_mm256_add_epi32(                                      \
                            s32[i],                                                             \
                            _mm256_madd_epi16(_mm256_maddubs_epi16(hi, bcast4(q + 16 + 4 * k)), \
                                              sc1)));                                           \
                    }                                                                           \
                }                                                                               \
                for (int i = 0; i < G; i++) {                                                   \
                    const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)b;                 \
                    const __m256i off = _mm256_madd_epi16(sc01, bcast4((const int8_t *)xb->h)); \
                    const __m256i t = _mm256_sub_epi32(s32[i], _mm256_slli_epi32(off, 5));      \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t),                             \
                                             _mm256_mul_ps(dv, _mm256_set1_ps(xb->d)), acc[i]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_Q6K(1)
X8_Q6K(2)
X8_Q6K(3)
X8_Q6K(4)

/* IQ4_NL (XS 0: per 32 columns, d) and IQ4_XS (XS 1: per super-block, d
 * times each sub-block's scale): the nibbles index 16 int8 levels (one
 * shuffle per vector), summed as Q8_0's (signs moved onto the activations). */
#define X8_IQ4(G, XS)                                                                           \
    static inline __attribute__((always_inline)) void x8iq4_##XS##_##G(                        \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { HEAD = XS ? CPU_X8K_IQ4_QS : 16, BLK = XS ? HEAD + 8 * 128 : HEAD + 128,         \
               SUBS = XS ? 8 : 1 };                                                             \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);               \
        const __m256i lv = _mm256_broadcastsi128_si256(                                        \
            _mm_loadu_si128((const __m128i *)quant_iq4nl_levels));                              \
        for (int64_t sb = 0; sb < nb / SUBS; sb++) {                                            \
            const uint8_t *p = gp + (size_t)sb * BLK;                                           \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            for (int s = 0; s < SUBS; s++) {                                                    \
                const uint8_t *qs = p + HEAD + 128 * s;                                         \
                const int64_t b = sb * SUBS + s;                                                \
                _mm_prefetch((const char *)qs + 4 * 128, _MM_HINT_T0);                          \
                __m256i s32[G];                                                                 \
                for (int i = 0; i < G; i++)                                                     \
                    s32[i] = _mm256_setzero_si256();                                            \
                for (int k = 0; k < 4; k++) {                                                   \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * k));      \
                    const __m256i lo = _mm256_shuffle_epi8(lv, _mm256_and_si256(v, low));       \
                    const __m256i hi =                                                          \
                        _mm256_shuffle_epi8(lv, _mm256_and_si256(_mm256_srli_epi16(v, 4), low)); \
                    const __m256i ulo = _mm256_sign_epi8(lo, lo), uhi = _mm256_sign_epi8(hi, hi); \
                    for (int i = 0; i < G; i++) {                                               \
                        const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;             \
                        s32[i] = X8_ACC32(s32[i], ulo, _mm256_sign_epi8(bcast4(q + 4 * k), lo), \
                                          ones);                                                \
                        s32[i] = X8_ACC32(s32[i], uhi,                                          \
                                          _mm256_sign_epi8(bcast4(q + 16 + 4 * k), hi), ones);  \
                    }                                                                           \
                }                                                                               \
                const __m256 sv = XS ? _mm256_mul_ps(dv, x8_i8ps(p + 16 + 8 * s)) : dv;         \
                for (int i = 0; i < G; i++) {                                                   \
                    const __m256 xd = _mm256_set1_ps(xq[(size_t)i * (size_t)nb + (size_t)b].d); \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]), _mm256_mul_ps(sv, xd), \
                                             acc[i]);                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_IQ4(1, 0)
X8_IQ4(2, 0)
X8_IQ4(3, 0)
X8_IQ4(4, 0)
X8_IQ4(1, 1)
X8_IQ4(2, 1)
X8_IQ4(3, 1)
X8_IQ4(4, 1)

/* Q2_K (Q3 0) and Q3_K (Q3 1) per super-block: per 32-column sub-block two
 * vectors of 2-bit values (and Q3_K's third bits), summed as Q4_0's nibbles
 * into one accumulator per 16 columns (each with its own scale). Q2_K:
 * d * sc * sum(q x) - dmin * m * sum(x); Q3_K: d * sc * (sum(u x) - 4 sum(x))
 * with u = q + 4 in 0..7. Pairs reach 2 * 7 * 127, four of them fit i16. */
#define X8_Q23(G, Q3)                                                                           \
    static inline __attribute__((always_inline)) void x8q23_##Q3##_##G(                        \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { QS = Q3 ? CPU_X8K_Q3_QS : CPU_X8K_Q2_QS, SUB = Q3 ? 96 : 64, BLK = QS + 8 * SUB }; \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);                   \
        for (int64_t sb = 0; sb < nb / 8; sb++) {                                               \
            const uint8_t *p = gp + (size_t)sb * BLK;                                           \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            const __m256 dmv = Q3 ? dv : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))); \
            for (int s = 0; s < 8; s++) {                                                       \
                const uint8_t *qs = p + QS + SUB * s;                                           \
                const int64_t b = sb * 8 + s;                                                   \
                _mm_prefetch((const char *)qs + 4 * SUB, _MM_HINT_T0);                          \
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)qs);                     \
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 32));              \
                const __m256i hm = Q3 ? _mm256_loadu_si256((const __m256i *)(qs + 64))          \
                                      : _mm256_setzero_si256();                                 \
                __m256i s0[G], s1[G];                                                           \
                for (int i = 0; i < G; i++)                                                     \
                    s0[i] = s1[i] = _mm256_setzero_si256();                                     \
                for (int f = 0; f < 4; f++) {                                                   \
                    __m256i q0 = _mm256_and_si256(_mm256_srli_epi16(v0, 2 * f), m3);            \
                    __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(v1, 2 * f), m3);            \
                    if (Q3) {                                                                   \
                        q0 = _mm256_or_si256(q0, _mm256_slli_epi32(x8_bits1(hm, 4 * f), 2));    \
                        q1 = _mm256_or_si256(q1, _mm256_slli_epi32(x8_bits1(hm, 16 + 4 * f), 2)); \
                    }                                                                           \
                    for (int i = 0; i < G; i++) {                                               \
                        const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;             \
                        s0[i] = X8_ACC16_FREE(s0[i], q0, bcast4(q + 4 * f));                    \
                        s1[i] = X8_ACC16_FREE(s1[i], q1, bcast4(q + 16 + 4 * f));               \
                    }                                                                           \
                }                                                                               \
                const uint8_t *sc = p + (Q3 ? 16 : 32) + 16 * s;                                \
                __m256 sv0, sv1, mv0 = _mm256_setzero_ps(), mv1 = _mm256_setzero_ps();         \
                if (Q3) {                                                                       \
                    sv0 = _mm256_mul_ps(dv, x8_i8ps(sc));                                       \
                    sv1 = _mm256_mul_ps(dv, x8_i8ps(sc + 8));                                   \
                } else {                                                                        \
                    const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)); \
                    const __m256i c1 =                                                          \
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)));       \
                    const __m256i lo4 = _mm256_set1_epi32(0x0f);                                \
                    sv0 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_and_si256(c0, lo4)));     \
                    sv1 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_and_si256(c1, lo4)));     \
                    mv0 = _mm256_mul_ps(dmv, _mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4)));     \
                    mv1 = _mm256_mul_ps(dmv, _mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4)));     \
                }                                                                               \
                for (int i = 0; i < G; i++) {                                                   \
                    const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)b;                 \
                    const int32_t h0 = xb->h[0], h1 = xb->h[1];                                 \
                    const __m256 xd = _mm256_set1_ps(xb->d);                                    \
                    __m256i d0 = X8_SUM16(s0[i], ones), d1 = X8_SUM16(s1[i], ones);             \
                    if (Q3) {                                                                   \
                        d0 = _mm256_sub_epi32(d0, _mm256_set1_epi32(4 * h0));                   \
                        d1 = _mm256_sub_epi32(d1, _mm256_set1_epi32(4 * h1));                   \
                    }                                                                           \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(sv0, xd), acc[i]); \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(sv1, xd), acc[i]); \
                    if (!Q3) {                                                                  \
                        acc[i] = _mm256_fnmadd_ps(mv0, _mm256_set1_ps(xb->d * (float)h0), acc[i]); \
                        acc[i] = _mm256_fnmadd_ps(mv1, _mm256_set1_ps(xb->d * (float)h1), acc[i]); \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_Q23(1, 0)
X8_Q23(2, 0)
X8_Q23(3, 0)
X8_Q23(4, 0)
X8_Q23(1, 1)
X8_Q23(2, 1)
X8_Q23(3, 1)
X8_Q23(4, 1)

#define X8_Q8(G)                                                                                \
    static inline __attribute__((always_inline)) void x8q8_##G(                                \
        const uint8_t *gp, int64_t nb, const cpu_q8 *xq, float *y, int64_t n)                  \
    {                                                                                           \
        enum { BLK = 16 + 256 };                                                                \
        __m256 acc[G];                                                                          \
        for (int i = 0; i < G; i++)                                                             \
            acc[i] = _mm256_setzero_ps();                                                       \
        const __m256i ones = _mm256_set1_epi16(1);                                              \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const uint8_t *p = gp + (size_t)b * BLK;                                            \
            _mm_prefetch((const char *)p + 2 * BLK, _MM_HINT_T0);                               \
            _mm_prefetch((const char *)p + 2 * BLK + 64, _MM_HINT_T0);                          \
            __m256i s32[G];                                                                     \
            for (int i = 0; i < G; i++)                                                         \
                s32[i] = _mm256_setzero_si256();                                                \
            for (int k = 0; k < 8; k++) {                                                       \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * k));      \
                const __m256i u = _mm256_sign_epi8(v, v);                                       \
                for (int i = 0; i < G; i++) {                                                   \
                    const int8_t *q = xq[(size_t)i * (size_t)nb + (size_t)b].q;                 \
                    const __m256i a = _mm256_sign_epi8(bcast4(q + 4 * k), v);                   \
                    s32[i] = X8_ACC32(s32[i], u, a, ones);                                      \
                }                                                                               \
            }                                                                                   \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));             \
            for (int i = 0; i < G; i++) {                                                       \
                const cpu_q8 *xb = xq + (size_t)i * (size_t)nb + (size_t)b;                     \
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]),                            \
                                         _mm256_mul_ps(dv, _mm256_set1_ps(xb->d)), acc[i]);     \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < G; i++)                                                             \
            _mm256_storeu_ps(y + (size_t)i * (size_t)n, acc[i]);                                \
    }
X8_Q8(1)
X8_Q8(2)
X8_Q8(3)
X8_Q8(4)

/* One function per weight type over rows [r0, r0 + nt) (multiples of 8:
 * tiles are, and so are the rows): each type's loops are compiled on their
 * own, so a change to one kernel cannot move another's code. */
#define X8_MM(kind)                                                                             \
    static void mmq_##kind(const dp_weight *w, int64_t r0, int64_t nt, const cpu_q8 *xq,       \
                           int32_t m, float *y)                                                 \
    {                                                                                           \
        const int64_t nb = w->cols / 32, n = w->rows;                                           \
        const size_t gb = cpu_x8_bytes(w->type, 8, w->cols); /* one group of 8 rows */         \
        for (int32_t i0 = 0; i0 < m; i0 += 4) {                                                 \
            const int32_t g = m - i0 < 4 ? m - i0 : 4;                                          \
            const cpu_q8 *xg = xq + (size_t)i0 * (size_t)nb;                                    \
            for (int64_t r = r0; r < r0 + nt; r += 8) {                                         \
                const uint8_t *gp = (const uint8_t *)w->data + (size_t)(r / 8) * gb;            \
                float *yo = y + (size_t)i0 * (size_t)n + (size_t)r;                             \
                switch (g) {                                                                    \
                case 1: kind##_1(gp, nb, xg, yo, n); break;                                     \
                case 2: kind##_2(gp, nb, xg, yo, n); break;                                     \
                case 3: kind##_3(gp, nb, xg, yo, n); break;                                     \
                default: kind##_4(gp, nb, xg, yo, n); break;                                    \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }
X8_MM(x8q4_1)
X8_MM(x8q4_0)
X8_MM(x8q5_0)
X8_MM(x8q5_1)
X8_MM(x8qk_0)
X8_MM(x8qk_1)
X8_MM(x8q6k)
X8_MM(x8iq4_0)
X8_MM(x8iq4_1)
X8_MM(x8q23_0)
X8_MM(x8q23_1)
X8_MM(x8q8)

static void mmq_x8(const dp_weight *w, int64_t r0, int64_t nt, const cpu_q8 *xq, int32_t m,
                   float *y)
{
    switch (w->type) {
    case DP_TYPE_Q4_1: mmq_x8q4_1(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q4_0: mmq_x8q4_0(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q5_0: mmq_x8q5_0(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q5_1: mmq_x8q5_1(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q4_K: mmq_x8qk_0(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q5_K: mmq_x8qk_1(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q6_K: mmq_x8q6k(w, r0, nt, xq, m, y); break;
    case DP_TYPE_IQ4_NL: mmq_x8iq4_0(w, r0, nt, xq, m, y); break;
    case DP_TYPE_IQ4_XS: mmq_x8iq4_1(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q2_K: mmq_x8q23_0(w, r0, nt, xq, m, y); break;
    case DP_TYPE_Q3_K: mmq_x8q23_1(w, r0, nt, xq, m, y); break;
    default: mmq_x8q8(w, r0, nt, xq, m, y); break; /* Q8_0 (cpu_x8_type) */
    }
}
