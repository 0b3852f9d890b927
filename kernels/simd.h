/* simd.h: small AVX-512 helpers shared by the CPU kernels and the host-side
 * sampler (vector exp). Header-only; empty without AVX-512. */
#ifndef DP_KERNELS_SIMD_H
#define DP_KERNELS_SIMD_H

#ifdef __AVX512F__
#include <immintrin.h>

/* exp(x) for x <= 0 (clamped at -87): Cody-Waite reduction and a degree-6
 * polynomial, relative error about 2e-7. */
static inline __m512 simd_exp_neg(__m512 x)
{
    const __m512 log2e = _mm512_set1_ps(1.44269504f), ln2hi = _mm512_set1_ps(0.693359375f),
                 ln2lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT);
    __m512 f = _mm512_fnmadd_ps(k, ln2hi, x);
    f = _mm512_fnmadd_ps(k, ln2lo, f);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}
#endif

#endif
