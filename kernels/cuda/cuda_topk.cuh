/* cuda_topk.cuh: logits_topk (backend.h): per row of logits, the top-k
 * candidates, the max and the log-sum-exp at a temperature, so that the host
 * samples from k candidates instead of downloading the whole vocabulary.
 * Included by cuda_elementwise.cu (one translation unit, one build list). */
#ifndef DP_KERNELS_CUDA_TOPK_CUH
#define DP_KERNELS_CUDA_TOPK_CUH

#define TOPK_THREADS 256 /* = DP_TOPK_MAX: the final sort has one key per thread */
static_assert(TOPK_THREADS == DP_TOPK_MAX, "the sort holds one candidate per thread");

/* A total order on (logit, id): the logit's bits made order-preserving as an
 * unsigned integer (NaN as -inf) above the complemented id, so a larger key
 * is a larger logit, then a lower id. Every key of a row is distinct, so
 * "the k largest keys" is one well-defined set, on the device and in the CPU
 * reference (kernels/cpu) alike. */
__device__ __forceinline__ unsigned long long cuda_topk_key(float v, int32_t id)
{
    if (v != v)
        v = -INFINITY;
    union {
        float f;
        uint32_t u;
    } b;
    b.f = v;
    const uint32_t o = (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
    return ((unsigned long long)o << 32) | (unsigned long long)(uint32_t)~(uint32_t)id;
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
 * out: ids [n * k] | vals [n * k] | max [n] | lse [n], as 32-bit words. */
__global__ void __launch_bounds__(TOPK_THREADS)
cuda_topk_kernel(const float *logits, int32_t n, int32_t vocab, int32_t k, float inv_temp,
                 uint32_t *out)
{
    __shared__ float red[TOPK_THREADS / 32];
    __shared__ int32_t hist[256];
    __shared__ unsigned long long sel[TOPK_THREADS];
    __shared__ unsigned long long prefix, mask;
    __shared__ int32_t need, n_sel;
    const int32_t row = blockIdx.x, t = threadIdx.x;
    const float *x = logits + (size_t)row * (size_t)vocab;

    /* Max and log-sum-exp (NaN: -inf, contributes nothing). */
    float m = -INFINITY;
    for (int32_t i = t; i < vocab; i += blockDim.x) {
        const float v = x[i];
        if (v == v)
            m = fmaxf(m, v);
    }
    m = cuda_topk_block_max(m, red);
    float s = 0.0f;
    if (m != -INFINITY)
        for (int32_t i = t; i < vocab; i += blockDim.x) {
            const float v = x[i];
            if (v == v)
                s += __expf((v - m) * inv_temp);
        }
    __syncthreads(); /* red is reused */
    s = cuda_block_sum(s, red);

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
        b.f = m == -INFINITY ? 0.0f : logf(s);
        out[2 * (size_t)n * k + n + row] = b.u;
    }
}

#endif
