/* topk.h: the arithmetic behind backend.h's logits_topk, shared by the CPU
 * backend, the CUDA kernel (cuda_topk.cuh) and the sampler (sched/sampler.c),
 * so that a token sampled from device candidates is the token the sampler
 * picks from the full row, bit for bit.
 *
 * Order: a 64-bit key per (logit, id): the logit's bits made order-preserving
 * (NaN as -inf) above the complemented id. A larger key is a larger logit,
 * then a lower id; every key of a row is distinct.
 *
 * Weights: for a logit l of a row with max m (NaN skipped, -0 read as +0) at
 * inverse temperature inv_t, t = (l - m) * inv_t <= 0 and
 *     w = t > -DP_TOPK_TCUT ? (uint64_t)(dp_topk_exp(t) * 2^DP_TOPK_WBITS) : 0
 * an integer (fixed point, the max weighs 2^44), so a sum of weights is exact
 * in any order: on the CPU, on the device and in the sampler's fallback alike.
 * dp_topk_exp is a degree-6 polynomial written with explicit fmaf, identical
 * in the scalar, AVX-512 and CUDA versions. The cut at t = -30 (a ratio of
 * 1e-13 to the max) drops what float sampling could not resolve anyway.
 *
 * Header-only helpers are __host__ __device__ under nvcc. */
#ifndef DP_KERNELS_TOPK_H
#define DP_KERNELS_TOPK_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DP_TOPK_HD __host__ __device__
#else
#define DP_TOPK_HD
#endif

#define DP_TOPK_TCUT 30.0f
#define DP_TOPK_WBITS 44

/* exp(t) for -30 < t <= 0: Cody-Waite reduction, degree-6 polynomial
 * (relative error about 2e-7). Every step is one IEEE operation. */
static inline DP_TOPK_HD float dp_topk_exp(float t)
{
    const float k = rintf(t * 1.44269504f);
    float f = fmaf(-k, 0.693359375f, t);
    f = fmaf(-k, -2.12194440e-4f, f);
    float p = 1.0f / 720;
    p = fmaf(p, f, 1.0f / 120);
    p = fmaf(p, f, 1.0f / 24);
    p = fmaf(p, f, 1.0f / 6);
    p = fmaf(p, f, 0.5f);
    p = fmaf(p, f, 1.0f);
    p = fmaf(p, f, 1.0f);
    return ldexpf(p, (int)k);
}

/* The weight of scaled logit t = (l - m) * inv_t (0 for NaN, -inf, and t at
 * or below the cut). */
static inline DP_TOPK_HD uint64_t dp_topk_weight(float t)
{
    return t > -DP_TOPK_TCUT ? (uint64_t)(dp_topk_exp(t) * 17592186044416.0f /* 2^44 */) : 0;
}

/* A row's weight sum as reported (backend.h row_sum): in units of the max's
 * weight, rounded to float; and back to weight units (exact: the float is an
 * integer multiple of 2^-44 times a power of two >= 1). */
static inline DP_TOPK_HD float dp_topk_sum_float(uint64_t s)
{
    return (float)((double)s * (1.0 / 17592186044416.0));
}
static inline DP_TOPK_HD uint64_t dp_topk_sum_units(float s)
{
    return s > 0.0f ? (uint64_t)((double)s * 17592186044416.0) : 0;
}

static inline DP_TOPK_HD uint64_t dp_topk_key(float v, int32_t id)
{
    if (v != v)
        v = -INFINITY;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint32_t)~(uint32_t)id;
}

static inline DP_TOPK_HD int32_t dp_topk_key_id(uint64_t key)
{
    return (int32_t)~(uint32_t)(key & 0xffffffffu);
}

/* The logit of a key (NaN comes back as -inf). */
static inline DP_TOPK_HD float dp_topk_key_value(uint64_t key)
{
    const uint32_t o = (uint32_t)(key >> 32);
    const uint32_t u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Host: one row of logits_topk. The k (1..DP_TOPK_MAX, <= vocab) largest
 * keys' ids and logits in descending order (NaN reported as -inf), the max
 * (-inf when every logit is NaN or -inf) and the weight sum at inv_t as a
 * float (0 when the max is not finite). Scans the row twice: the max, then
 * the weights (AVX-512 where built) and a min-heap of the k best keys, which
 * rejects almost every element with one float compare. */
void dp_topk_row(const float *x, int32_t vocab, int32_t k, float inv_t, int32_t *ids,
                 float *vals, float *max, float *sum);

/* Host: the id of the row's largest key (ids[0] of dp_topk_row), without
 * weights or a heap: the greedy token. */
int32_t dp_topk_argmax(const float *x, int32_t vocab);

/* Host: every token of the row with a nonzero weight at (m, inv_t): its id,
 * weight and scaled logit t, in id order. Returns how many (<= vocab). The
 * arrays need DP_TOPK_SLACK entries past vocab (whole vectors are stored). */
#define DP_TOPK_SLACK 16
int32_t dp_topk_weights(const float *x, int32_t vocab, float m, float inv_t, int32_t *ids,
                        uint64_t *w, float *t);

#endif
