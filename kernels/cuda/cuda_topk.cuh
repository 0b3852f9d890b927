/* cuda_topk.cuh: logits_topk (backend.h): per row of logits, the top-k
 * candidates, the max and the weight sum at the row's temperature, so that
 * the host samples from k candidates instead of downloading the vocabulary.
 * Included by cuda_elementwise.cu (one translation unit, one build list). */
#ifndef DP_KERNELS_CUDA_TOPK_CUH
#define DP_KERNELS_CUDA_TOPK_CUH

#define TOPK_THREADS 256 /* = DP_TOPK_MAX: the final sort has one key per thread */
static_assert(TOPK_THREADS == DP_TOPK_MAX, "the sort holds one candidate per thread");

/* The total order and the weights are kernels/topk.h's, the very functions
 * the CPU backend and the sampler use (__host__ __device__ there): a key per
 * (logit, id), every key of a row distinct, so "the k largest keys" is one
 * well-defined set; fixed-point weights summed as integers, so the row sum is
 * exact in any order and equal to the CPU's. */
#include <math.h>
#include <stdint.h>
#include <string.h>
extern "C" { /* the project's headers are C */
#include "kernels/topk.h"
}

__device__ __forceinline__ unsigned long long cuda_topk_key(float v, int32_t id)
{
    return (unsigned long long)dp_topk_key(v, id);
}

__device__ float cuda_topk_block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* red may still be read by a previous reduction */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? red[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One block per row. Radix select finds the k-th largest key in 8 passes of
 * 8 bits (a 256-bin histogram of the keys that match the bits chosen so
 * far); the keys at or above it are exactly the k candidates, gathered in
 * any order and then sorted by a bitonic sort in shared memory.
 * in: inv_temp [n] (float bits) | mask flag [n] | mask ids [n_mask].
 * out: ids [n * k] | vals [n * k] | max [n] | sum [n], as 32-bit words. */
__global__ void __launch_bounds__(TOPK_THREADS)
cuda_topk_kernel(float *logits, int32_t n, int32_t vocab, int32_t k, int32_t n_mask,
                 const uint32_t *in, uint32_t *out)
{
    __shared__ float red[TOPK_THREADS / 32];
    __shared__ int32_t hist[256];
    __shared__ unsigned long long sel[TOPK_THREADS];
    __shared__ unsigned long long prefix, mask;
    __shared__ int32_t need, n_sel;
    const int32_t row = blockIdx.x, t = threadIdx.x;
    float *x = logits + (size_t)row * (size_t)vocab;
    float inv_temp;
    memcpy(&inv_temp, &in[row], sizeof inv_temp);

    /* ignore_eos: the masked ids become -inf, in place, before anything
     * reads the row (__syncthreads makes the block's writes visible). */
    if (in[n + row])
        for (int32_t j = t; j < n_mask; j += blockDim.x) {
            const int32_t id = (int32_t)in[2 * n + j];
            if (id >= 0 && id < vocab)
                x[id] = -INFINITY;
        }
    __syncthreads();

    /* Max (NaN: skipped; -0 read as +0 as on the CPU) and the exact weight
     * sum, reduced through sel (free until the gather). */
    float m = -INFINITY;
    for (int32_t i = t; i < vocab; i += blockDim.x) {
        const float v = x[i];
        if (v == v)
            m = fmaxf(m, v);
    }
    m = cuda_topk_block_max(m, red) + 0.0f;
    unsigned long long s = 0;
    if (isfinite(m))
        for (int32_t i = t; i < vocab; i += blockDim.x)
            s += dp_topk_weight((x[i] - m) * inv_temp);
    sel[t] = s;
    __syncthreads();
    for (int h = TOPK_THREADS / 2; h > 0; h >>= 1) {
        if (t < h)
            sel[t] += sel[t + h];
        __syncthreads();
    }
    s = sel[0];
    __syncthreads(); /* sel is reused by the gather */

    /* Radix select of the k-th largest key. */
    if (t == 0) {
        prefix = 0;
        mask = 0;
        need = k;
        n_sel = 0;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        hist[t] = 0; /* blockDim.x == 256 bins */
        __syncthreads();
        const unsigned long long p = prefix, mk = mask;
        for (int32_t i = t; i < vocab; i += blockDim.x) {
            const unsigned long long key = cuda_topk_key(x[i], i);
            if ((key & mk) == p)
                atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (t == 0) {
            int32_t acc = 0, b = 255;
            for (; b > 0; b--) {
                if (acc + hist[b] >= need)
                    break;
                acc += hist[b];
            }
            need -= acc;
            prefix |= (unsigned long long)b << shift;
            mask |= 255ull << shift;
        }
        __syncthreads();
    }
    /* prefix is now the k-th largest key: gather the k keys >= it. */
    const unsigned long long kth = prefix;
    sel[t] = 0; /* padding sorts last (no key is 0: ids are < 2^31) */
    __syncthreads();
    for (int32_t i = t; i < vocab; i += blockDim.x) {
        const unsigned long long key = cuda_topk_key(x[i], i);
        if (key >= kth)
            sel[atomicAdd(&n_sel, 1)] = key;
    }
    __syncthreads();
    /* Bitonic sort, descending, one key per thread. */
    for (int size = 2; size <= TOPK_THREADS; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            const int o = t ^ stride;
            if (o > t) {
                const unsigned long long a = sel[t], c = sel[o];
                const bool desc = (t & size) == 0;
                if (desc ? a < c : a > c) {
                    sel[t] = c;
                    sel[o] = a;
                }
            }
            __syncthreads();
        }
    if (t < k) {
        const int32_t id = (int32_t)~(uint32_t)(sel[t] & 0xffffffffu);
        float v = x[id];
        if (v != v)
            v = -INFINITY;
        union {
            float f;
            uint32_t u;
        } b;
        out[(size_t)row * k + t] = (uint32_t)id;
        b.f = v;
        out[(size_t)n * k + (size_t)row * k + t] = b.u;
    }
    if (t == 0) {
        union {
            float f;
            uint32_t u;
        } b;
        b.f = m;
        out[2 * (size_t)n * k + row] = b.u;
        b.f = isfinite(m) ? dp_topk_sum_float(s) : 0.0f;
        out[2 * (size_t)n * k + n + row] = b.u;
    }
}

#endif
