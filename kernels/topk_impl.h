/* topk_impl.h: the host side of logits_topk (topk.h): one row's candidates,
 * max and weight sum, and the weights of a whole row for the sampler's
 * fallback. Included by kernels/cpu/cpu_kern.c, so it is compiled once per
 * instruction-set level and dispatched with the other CPU kernels (topk.c
 * holds the public entry points). The AVX-512 paths compute exactly what the
 * scalar dp_topk_exp and dp_topk_weight compute (the same operations lane by
 * lane), so every level agrees bit for bit (tests/unit/test_sampler checks
 * the level it runs against the scalar definitions). */
#ifndef DP_KERNELS_TOPK_IMPL_H
#define DP_KERNELS_TOPK_IMPL_H
#include "topk.h"

#include <stdlib.h>

#include "kernels/backend.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#define TOPK_SIMD 1

/* dp_topk_exp lane by lane: roundscale is rintf, fnmadd(k, c, x) is
 * fmaf(-k, c, x), scalef(p, k) is ldexpf(p, k) for these normal results. */
static inline __m512 topk_exp16(__m512 t)
{
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), t);
    f = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), f);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

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
    const __m512 e = _mm512_mul_ps(topk_exp16(t), _mm512_set1_ps(17592186044416.0f));
    *lo = _mm512_maskz_cvttps_epu64((__mmask8)live, _mm512_castps512_ps256(e));
    *hi = _mm512_maskz_cvttps_epu64((__mmask8)(live >> 8), _mm512_extractf32x8_ps(e, 1));
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
