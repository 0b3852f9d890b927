/* topk_impl.h: the host side of logits_topk (topk.h): one row's candidates,
 * max and weight sum, and the weights of a whole row for the sampler's
 * fallback. Included by kernels/cpu/cpu_kern.c, so it is compiled once per
 * instruction-set level and dispatched with the other CPU kernels (topk.c
 * holds the public entry points). The AVX-512 and AVX2 paths compute exactly
 * what the scalar dp_topk_exp and dp_topk_weight compute (the same
 * operations lane by lane), so every level agrees bit for bit (tests/unit/test_sampler checks
 * the level it runs against the scalar definitions). */
#ifndef DP_KERNELS_TOPK_IMPL_H
#define DP_KERNELS_TOPK_IMPL_H
#include "topk.h"

#include <stdlib.h>

#include "kernels/backend.h"

/* The kernels' float vectors (cpu/vec.h: this file is part of cpu_kern.c's
 * translation unit, compiled once per level). vf_exp_neg is dp_topk_exp
 * lane by lane for -30 < t <= 0: the clamp at -87 does nothing there, its
 * round is rintf, fma(k, -c, x) is fmaf(-k, c, x), and its vf_pow2i
 * (scalef, or a multiply by 2^k made from k's bits) is ldexpf(p, k) for
 * these normal results. Dead lanes give garbage, masked by the callers. */
#include "kernels/cpu/vec.h"

#if defined(VEC_AVX512) && defined(__AVX512DQ__)
#define TOPK_SIMD 1

/* t = (x - m) * inv_t for 16 logits, and the lanes with a nonzero weight. */
static inline __m512 topk_t16(const float *x, __m512 vm, __m512 vinv, __mmask16 *live)
{
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x), vm), vinv);
    *live = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-DP_TOPK_TCUT), _CMP_GT_OQ);
    return t;
}

/* The weights of 16 lanes as two vectors of 8 (dead lanes 0). */
static inline void topk_w16(__m512 t, __mmask16 live, __m512i *lo, __m512i *hi)
{
    const __m512 e = _mm512_mul_ps(vf_exp_neg(t), _mm512_set1_ps(17592186044416.0f));
    *lo = _mm512_maskz_cvttps_epu64((__mmask8)live, _mm512_castps512_ps256(e));
    *hi = _mm512_maskz_cvttps_epu64((__mmask8)(live >> 8), _mm512_extractf32x8_ps(e, 1));
}
#elif defined(VEC_AVX2)
#define TOPK_AVX2 1

/* t = (x - m) * inv_t for 8 logits, and the lanes with a nonzero weight
 * (all ones; NaN compares false, as in dp_topk_weight). */
static inline __m256 topk_t8(const float *x, __m256 vm, __m256 vinv, __m256 *live)
{
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), vm), vinv);
    *live = _mm256_cmp_ps(t, _mm256_set1_ps(-DP_TOPK_TCUT), _CMP_GT_OQ);
    return t;
}

/* An integer-valued float below 2^52 (or +0) as a 64-bit integer: added
 * to 2^52 in double, exactly, its bits less 2^52's are the value. */
static inline __m256i topk_u64x4(__m128 v)
{
    const __m256d magic = _mm256_set1_pd(4503599627370496.0);
    return _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(_mm256_cvtps_pd(v), magic)),
                            _mm256_castpd_si256(magic));
}

/* The weights of 8 lanes as two vectors of 4 (dead lanes 0): truncated as
 * the scalar conversion to uint64_t truncates. */
static inline void topk_w8(__m256 t, __m256 live, __m256i *lo, __m256i *hi)
{
    const __m256 e = _mm256_round_ps(_mm256_mul_ps(vf_exp_neg(t), _mm256_set1_ps(17592186044416.0f)),
                                     _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 ez = _mm256_and_ps(e, live); /* dead lanes +0 */
    *lo = topk_u64x4(_mm256_castps256_ps128(ez));
    *hi = topk_u64x4(_mm256_extractf128_ps(ez, 1));
}
#endif

/* The row max over non-NaN logits, -0 read as +0 (so the reported max does
 * not depend on which zero a reduction met first). */
static float row_max(const float *x, int32_t n)
{
    int32_t i = 0;
    float m = -INFINITY;
#if TOPK_SIMD
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= n; i += 16)
        vm = _mm512_max_ps(_mm512_loadu_ps(x + i), vm); /* a NaN lane keeps vm */
    m = _mm512_reduce_max_ps(vm);
#elif TOPK_AVX2
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8)
        vm = _mm256_max_ps(_mm256_loadu_ps(x + i), vm); /* a NaN lane keeps vm */
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++)
        if (x[i] > m)
            m = x[i];
    return m + 0.0f;
}

static uint64_t row_weight_sum(const float *x, int32_t n, float m, float inv_t)
{
    int32_t i = 0;
    uint64_t s = 0;
#if TOPK_SIMD
    const __m512 vm = _mm512_set1_ps(m), vinv = _mm512_set1_ps(inv_t);
    __m512i acc = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
        __mmask16 live;
        const __m512 t = topk_t16(x + i, vm, vinv, &live);
        if (!live)
            continue; /* most of a peaked row: no exp at all */
        __m512i lo, hi;
        topk_w16(t, live, &lo, &hi);
        acc = _mm512_add_epi64(acc, _mm512_add_epi64(lo, hi));
    }
    s = (uint64_t)_mm512_reduce_add_epi64(acc);
#elif TOPK_AVX2
    const __m256 vm = _mm256_set1_ps(m), vinv = _mm256_set1_ps(inv_t);
    __m256i acc = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
        __m256 live;
        const __m256 t = topk_t8(x + i, vm, vinv, &live);
        if (!_mm256_movemask_ps(live))
            continue; /* most of a peaked row: no exp at all */
        __m256i lo, hi;
        topk_w8(t, live, &lo, &hi);
        acc = _mm256_add_epi64(acc, _mm256_add_epi64(lo, hi));
    }
    uint64_t a4[4];
    _mm256_storeu_si256((__m256i *)a4, acc);
    s = a4[0] + a4[1] + a4[2] + a4[3];
#endif
    for (; i < n; i++)
        s += dp_topk_weight((x[i] - m) * inv_t);
    return s;
}

/* Sifts the smallest key of a min-heap of n keys down from slot i. */
static void heap_sift(uint64_t *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (r < n && h[r] < h[m])
            m = r;
        if (m == i)
            return;
        uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int key_desc(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Offers x[i] to the heap. A logit below thr (the smallest key's logit)
 * cannot enter, and that one float compare rejects almost every element;
 * an equal one (a tie, or +0 against -0) is decided by the keys. */
static inline void heap_offer(uint64_t *heap, int32_t k, float *thr, const float *x, int32_t i)
{
    if (!(x[i] >= *thr))
        return;
    const uint64_t key = dp_topk_key(x[i], i);
    if (key <= heap[0])
        return;
    heap[0] = key;
    heap_sift(heap, k, 0);
    *thr = dp_topk_key_value(heap[0]);
}

static void topk_row_impl(const float *x, int32_t vocab, int32_t k, float inv_t, int32_t *ids,
                 float *vals, float *max, float *sum)
{
    const float m = row_max(x, vocab);
    *max = m;
    *sum = isfinite(m) ? dp_topk_sum_float(row_weight_sum(x, vocab, m, inv_t)) : 0.0f;
    uint64_t heap[DP_TOPK_MAX];
    for (int32_t i = 0; i < k; i++)
        heap[i] = dp_topk_key(x[i], i);
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        heap_sift(heap, k, i);
    float thr = dp_topk_key_value(heap[0]);
    int32_t i = k;
#if TOPK_SIMD
    for (; i < vocab && (i & 15); i++)
        heap_offer(heap, k, &thr, x, i);
    for (; i + 16 <= vocab; i += 16) {
        __mmask16 in = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_set1_ps(thr), _CMP_GE_OQ);
        while (in) {
            const int j = __builtin_ctz(in);
            in &= in - 1;
            heap_offer(heap, k, &thr, x, i + j); /* compares against the updated thr */
        }
    }
#elif TOPK_AVX2
    for (; i < vocab && (i & 7); i++)
        heap_offer(heap, k, &thr, x, i);
    for (; i + 8 <= vocab; i += 8) {
        int in = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(thr), _CMP_GE_OQ));
        while (in) {
            const int j = __builtin_ctz((unsigned)in);
            in &= in - 1;
            heap_offer(heap, k, &thr, x, i + j);
        }
    }
#endif
    for (; i < vocab; i++)
        heap_offer(heap, k, &thr, x, i);
    qsort(heap, (size_t)k, sizeof heap[0], key_desc);
    for (int32_t j = 0; j < k; j++) {
        ids[j] = dp_topk_key_id(heap[j]);
        vals[j] = dp_topk_key_value(heap[j]);
    }
}

static int32_t topk_argmax_impl(const float *x, int32_t vocab)
{
    const float m = row_max(x, vocab);
    int32_t i = 0;
    if (m == 0.0f) {
        /* +0 ranks above -0: the first +0, else the first -0. */
        for (i = 0; i < vocab; i++)
            if (x[i] == 0.0f && !signbit(x[i]))
                return i;
        for (i = 0; i < vocab; i++)
            if (x[i] == 0.0f)
                return i;
    }
    if (m == -INFINITY) {
        for (i = 0; i < vocab; i++)
            if (!(x[i] > -INFINITY))
                return i; /* -inf or NaN: equal in the order */
        return 0;
    }
#if TOPK_SIMD
    const __m512 vm = _mm512_set1_ps(m);
    for (; i + 16 <= vocab; i += 16) {
        const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vm, _CMP_EQ_OQ);
        if (eq)
            return i + __builtin_ctz(eq);
    }
#elif TOPK_AVX2
    const __m256 vm = _mm256_set1_ps(m);
    for (; i + 8 <= vocab; i += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
        if (eq)
            return i + __builtin_ctz((unsigned)eq);
    }
#endif
    for (; i < vocab; i++)
        if (x[i] == m)
            return i;
    return 0;
}

static int32_t topk_weights_impl(const float *x, int32_t vocab, float m, float inv_t, int32_t *ids,
                                 uint64_t *w, float *t)
{
    int32_t i = 0, n = 0;
#if TOPK_SIMD
    const __m512 vm = _mm512_set1_ps(m), vinv = _mm512_set1_ps(inv_t);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= vocab; i += 16) {
        __mmask16 live;
        const __m512 vt = topk_t16(x + i, vm, vinv, &live);
        if (!live)
            continue;
        __m512i lo, hi;
        topk_w16(vt, live, &lo, &hi);
        /* Compress in registers and store whole vectors (the slack past n
         * is overwritten later): compress-to-memory is slow on Intel. */
        _mm512_storeu_si512(ids + n, _mm512_maskz_compress_epi32(
                                         live, _mm512_add_epi32(lane, _mm512_set1_epi32(i))));
        _mm512_storeu_ps(t + n, _mm512_maskz_compress_ps(live, vt));
        const int n_lo = __builtin_popcount(live & 0xff);
        _mm512_storeu_si512(w + n, _mm512_maskz_compress_epi64((__mmask8)live, lo));
        _mm512_storeu_si512(w + n + n_lo, _mm512_maskz_compress_epi64((__mmask8)(live >> 8), hi));
        n += __builtin_popcount(live);
    }
#elif TOPK_AVX2
    const __m256 vm = _mm256_set1_ps(m), vinv = _mm256_set1_ps(inv_t);
    for (; i + 8 <= vocab; i += 8) {
        __m256 live;
        const __m256 vt = topk_t8(x + i, vm, vinv, &live);
        int mk = _mm256_movemask_ps(live);
        if (!mk)
            continue;
        __m256i lo, hi;
        topk_w8(vt, live, &lo, &hi);
        uint64_t wb[8];
        float tb[8];
        _mm256_storeu_si256((__m256i *)wb, lo);
        _mm256_storeu_si256((__m256i *)(wb + 4), hi);
        _mm256_storeu_ps(tb, vt);
        while (mk) {
            const int j = __builtin_ctz((unsigned)mk);
            mk &= mk - 1;
            ids[n] = i + j;
            w[n] = wb[j];
            t[n++] = tb[j];
        }
    }
#endif
    for (; i < vocab; i++) {
        const float ti = (x[i] - m) * inv_t;
        if (ti > -DP_TOPK_TCUT) {
            ids[n] = i;
            w[n] = dp_topk_weight(ti);
            t[n++] = ti;
        }
    }
    return n;
}

#endif
