/* vec.h: the float vector the CPU kernels are written in, one definition per
 * instruction-set level. cpu_kern.c is compiled once per level (meson passes
 * the level's -m flags), so the same kernel source becomes an AVX-512, an
 * AVX2+FMA+F16C and a portable build; cpu_dispatch.c picks one at start-up.
 * Only cpu_kern.c includes this header (directly and through
 * kernels/topk_impl.h, which only it includes): nothing else may depend on
 * the level a translation unit happened to be compiled for.
 *
 *   VW                lanes per vector (16, 8, 4)
 *   vf_zero/set1/load/store, vf_loadn/storen (n <= VW lanes, zeros past n)
 *   vf_add/sub/mul/max, vf_fma(a, b, c) = a * b + c
 *   vf_hsum/hmax      horizontal sum and max
 *   vf_load_h(p)      VW f16 values widened to f32
 *   vf_load_nib(p)    VW 4-bit codes from VW / 2 bytes (low nibble first), as f32
 *   vf_exp_neg(x)     exp(x) for x <= 0 (clamped at -87), rel. error ~2e-7
 */
#ifndef DP_KERNELS_CPU_VEC_H
#define DP_KERNELS_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
/* The n bytes of w's 16-bit lanes (each < 256) split into their nibbles:
 * 2n bytes, each byte's low nibble first. */
static inline __m128i nib_bytes(__m128i w)
{
    const __m128i lo = _mm_and_si128(w, _mm_set1_epi16(15));
    return _mm_or_si128(lo, _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
}
/* Sum of eight f32 lanes (the AVX2 vf_hsum; the integer kernels of both x86
 * levels accumulate in 256-bit vectors). */
static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__F16C__) && \
    defined(__FMA__)
#include <immintrin.h>
#define VEC_AVX512 1
#define VW 16
typedef __m512 vf;
#define vf_zero() _mm512_setzero_ps()
#define vf_set1(x) _mm512_set1_ps(x)
#define vf_load(p) _mm512_loadu_ps(p)
#define vf_store(p, v) _mm512_storeu_ps((p), (v))
#define vf_add(a, b) _mm512_add_ps((a), (b))
#define vf_sub(a, b) _mm512_sub_ps((a), (b))
#define vf_mul(a, b) _mm512_mul_ps((a), (b))
#define vf_max(a, b) _mm512_max_ps((a), (b))
#define vf_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define vf_hsum(v) _mm512_reduce_add_ps(v)
#define vf_hmax(v) _mm512_reduce_max_ps(v)
static inline __mmask16 vf_mask(int32_t n) { return (__mmask16)((1u << n) - 1u); }
static inline vf vf_loadn(const float *p, int32_t n) { return _mm512_maskz_loadu_ps(vf_mask(n), p); }
static inline void vf_storen(float *p, vf v, int32_t n) { _mm512_mask_storeu_ps(p, vf_mask(n), v); }
static inline vf vf_load_h(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline vf vf_load_nib(const uint8_t *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    const __m128i b = nib_bytes(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)x)));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}
static inline vf vf_pow2i(vf p, vf k) { return _mm512_scalef_ps(p, k); }
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT); }

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VEC_AVX2 1
#define VW 8
typedef __m256 vf;
#define vf_zero() _mm256_setzero_ps()
#define vf_set1(x) _mm256_set1_ps(x)
#define vf_load(p) _mm256_loadu_ps(p)
#define vf_store(p, v) _mm256_storeu_ps((p), (v))
#define vf_add(a, b) _mm256_add_ps((a), (b))
#define vf_sub(a, b) _mm256_sub_ps((a), (b))
#define vf_mul(a, b) _mm256_mul_ps((a), (b))
#define vf_max(a, b) _mm256_max_ps((a), (b))
#define vf_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define vf_hsum(v) hsum8(v)
static inline float vf_hmax(vf v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* Lane i is live when i < n (sign bit set: maskload/maskstore's rule). */
static inline __m256i vf_mask(int32_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_loadn(const float *p, int32_t n) { return _mm256_maskload_ps(p, vf_mask(n)); }
static inline void vf_storen(float *p, vf v, int32_t n) { _mm256_maskstore_ps(p, vf_mask(n), v); }
static inline vf vf_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vf_load_nib(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    const __m128i b = nib_bytes(_mm_cvtepu8_epi16(_mm_cvtsi32_si128((int)x)));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}
/* p * 2^k for integral k in [-126, 127] (what vf_exp_neg produces). */
static inline vf vf_pow2i(vf p, vf k)
{
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#else
/* Portable: four lanes in plain C (any architecture; the compiler
 * vectorizes what it can for the baseline ISA). */
#include "kernels/quant.h"
#define VEC_PORTABLE 1
#define VW 4
typedef struct vf {
    float v[4];
} vf;
#define VF_MAP(expr)                      \
    vf r_;                                \
    for (int i_ = 0; i_ < 4; i_++)        \
        r_.v[i_] = (expr);                \
    return r_
static inline vf vf_zero(void) { return (vf){{0, 0, 0, 0}}; }
static inline vf vf_set1(float x) { return (vf){{x, x, x, x}}; }
static inline vf vf_load(const float *p) { VF_MAP(p[i_]); }
static inline void vf_store(float *p, vf v) { memcpy(p, v.v, sizeof v.v); }
static inline vf vf_add(vf a, vf b) { VF_MAP(a.v[i_] + b.v[i_]); }
static inline vf vf_sub(vf a, vf b) { VF_MAP(a.v[i_] - b.v[i_]); }
static inline vf vf_mul(vf a, vf b) { VF_MAP(a.v[i_] * b.v[i_]); }
static inline vf vf_max(vf a, vf b) { VF_MAP(a.v[i_] > b.v[i_] ? a.v[i_] : b.v[i_]); }
static inline vf vf_fma(vf a, vf b, vf c) { VF_MAP(a.v[i_] * b.v[i_] + c.v[i_]); }
static inline float vf_hsum(vf v) { return (v.v[0] + v.v[1]) + (v.v[2] + v.v[3]); }
static inline float vf_hmax(vf v)
{
    float a = v.v[0] > v.v[1] ? v.v[0] : v.v[1], b = v.v[2] > v.v[3] ? v.v[2] : v.v[3];
    return a > b ? a : b;
}
static inline vf vf_loadn(const float *p, int32_t n) { VF_MAP(i_ < n ? p[i_] : 0.0f); }
static inline void vf_storen(float *p, vf v, int32_t n)
{
    for (int i = 0; i < n; i++)
        p[i] = v.v[i];
}
static inline vf vf_load_h(const uint16_t *p) { VF_MAP(dp_fp16_to_f32(p[i_])); }
static inline vf vf_load_nib(const uint8_t *p) { VF_MAP((float)(p[i_ / 2] >> (4 * (i_ & 1)) & 15)); }
static inline vf vf_pow2i(vf p, vf k) { VF_MAP(ldexpf(p.v[i_], (int)k.v[i_])); }
static inline vf vf_round(vf x) { VF_MAP(rintf(x.v[i_])); }
#endif

/* exp(x) for x <= 0 (clamped at -87): Cody-Waite reduction and a degree-6
 * polynomial. */
static inline vf vf_exp_neg(vf x)
{
    x = vf_max(x, vf_set1(-87.0f));
    vf k = vf_round(vf_mul(x, vf_set1(1.44269504f)));
    vf f = vf_fma(k, vf_set1(-0.693359375f), x);
    f = vf_fma(k, vf_set1(2.12194440e-4f), f);
    vf p = vf_set1(1.0f / 720);
    p = vf_fma(p, f, vf_set1(1.0f / 120));
    p = vf_fma(p, f, vf_set1(1.0f / 24));
    p = vf_fma(p, f, vf_set1(1.0f / 6));
    p = vf_fma(p, f, vf_set1(0.5f));
    p = vf_fma(p, f, vf_set1(1.0f));
    p = vf_fma(p, f, vf_set1(1.0f));
    return vf_pow2i(p, k);
}

#endif
