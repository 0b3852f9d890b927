/* cuda_wquant.cu: weights kept on the device in the file's blocks.
 *
 * A 7B Q4_K_M model is 4.1 GB of blocks and 13.5 GB once expanded to fp16;
 * the difference is KV cache. So the block types below (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS) are uploaded as the
 * file has them (rows of row_bytes, GGML's layout, kernels/quant.c) and read
 * by three kernels:
 *
 *   - decode (m <= CUDA_WQ_GEMV_MAX rows of activations): a warp per weight
 *     row dequantizes it 32 values at a time into registers and takes the
 *     dot product with every activation row, so the weights are read once
 *     for the whole batch;
 *   - prefill and larger batches: a slab of weight rows is dequantized to
 *     fp16 (cuda_wq_half_kernel) and multiplied by cuBLAS on tensor cores,
 *     slab after slab into the same scratch (CUDA_WQ_SLAB_ELEMS: bounded
 *     whatever the model's largest matrix);
 *   - embedding lookups: the token's row, dequantized.
 *
 * Dequantization is kernels/quant.c's arithmetic operation for operation
 * (f16 scales widened, products and sums as single IEEE roundings:
 * __fmul_rn / __fadd_rn keep nvcc from fusing them), so an embedding row is
 * the CPU's bits and the fp16 slab is what the old load-time expansion made.
 * Blocks are 2-byte aligned at best (18-, 22-, 34-, 210-byte blocks), so
 * bytes are read one at a time and scales as halves. */
#include <string.h>

#include "cuda_internal.h"

/* ---- the block types ----------------------------------------------------------------
 * One tag type per block format; wq_chunk(tag, row, c, v) writes the 32
 * values of the row's chunk c (elements 32c .. 32c + 31) into v. */
struct wq_q4_0 {};
struct wq_q4_1 {};
struct wq_q5_0 {};
struct wq_q5_1 {};
struct wq_q8_0 {};
struct wq_q4_k {};
struct wq_q5_k {};
struct wq_q6_k {};
struct wq_q2_k {};
struct wq_q3_k {};
struct wq_iq4_nl {};
struct wq_iq4_xs {};

static __device__ __forceinline__ float wq_half(const uint8_t *p)
{
    CUDA_CHECK_ALIGN(p, 2);
    return __half2float(*(const __half *)p);
}

static __device__ __forceinline__ uint32_t wq_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static __device__ __forceinline__ void wq_chunk(wq_q4_0, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 18;
    const float d = wq_half(b);
    for (int j = 0; j < 16; j++) {
        v[j] = __fmul_rn((float)((int)(b[2 + j] & 0x0f) - 8), d);
        v[j + 16] = __fmul_rn((float)((int)(b[2 + j] >> 4) - 8), d);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q4_1, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 20;
    const float d = wq_half(b), m = wq_half(b + 2);
    for (int j = 0; j < 16; j++) {
        v[j] = __fadd_rn(__fmul_rn((float)(b[4 + j] & 0x0f), d), m);
        v[j + 16] = __fadd_rn(__fmul_rn((float)(b[4 + j] >> 4), d), m);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q5_0, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 22;
    const float d = wq_half(b);
    const uint32_t qh = wq_u32(b + 2);
    for (int j = 0; j < 16; j++) {
        const int lo = (int)((b[6 + j] & 0x0fu) | ((qh >> j) & 1u) << 4);
        const int hi = (int)((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
        v[j] = __fmul_rn((float)(lo - 16), d);
        v[j + 16] = __fmul_rn((float)(hi - 16), d);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q5_1, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 24;
    const float d = wq_half(b), m = wq_half(b + 2);
    const uint32_t qh = wq_u32(b + 4);
    for (int j = 0; j < 16; j++) {
        const uint32_t lo = (b[8 + j] & 0x0fu) | ((qh >> j) & 1u) << 4;
        const uint32_t hi = (uint32_t)(b[8 + j] >> 4) | ((qh >> (j + 16)) & 1u) << 4;
        v[j] = __fadd_rn(__fmul_rn((float)lo, d), m);
        v[j + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q8_0, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 34;
    const float d = wq_half(b);
    for (int j = 0; j < 32; j++)
        v[j] = __fmul_rn((float)(int8_t)b[2 + j], d);
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (kernels/quant.c's
 * kq_scale_min). */
static __device__ __forceinline__ void wq_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Chunk c of a 256-value super-block row is its sub-block c % 8: the low
 * (even) or high (odd) nibbles of the 32 bytes of pair c % 8 / 2. */
template <bool FIVE>
static __device__ __forceinline__ void wq_chunk_k45(const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)(c / 8) * (FIVE ? 176 : 144);
    const int j = c % 8;
    const float d = wq_half(b), dmin = wq_half(b + 2);
    int sc, mn;
    wq_scale_min(j, b + 4, &sc, &mn);
    const float dj = __fmul_rn(d, (float)sc), nj = __fmul_rn(dmin, (float)mn);
    const uint8_t *q = b + (FIVE ? 48 : 16) + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; l++) {
        int x = (q[l] >> shift) & 0x0f;
        if (FIVE)
            x |= ((b[16 + l] >> j) & 1) << 4;
        v[l] = __fadd_rn(__fmul_rn(dj, (float)x), -nj);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q4_k, const uint8_t *row, int32_t c, float *v)
{
    wq_chunk_k45<false>(row, c, v);
}

static __device__ __forceinline__ void wq_chunk(wq_q5_k, const uint8_t *row, int32_t c, float *v)
{
    wq_chunk_k45<true>(row, c, v);
}

/* Q6_K: chunk k of a half (128 values) takes the low (k < 2) or high
 * nibbles of ql bytes 0-31 (k even) or 32-63 (k odd), the 2-bit pair k of
 * the half's qh bytes, and two int8 scales of 16 values each. */
static __device__ __forceinline__ void wq_chunk(wq_q6_k, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)(c / 8) * 210;
    const int h = (c % 8) / 4, k = c % 4;
    const float d = wq_half(b + 208);
    const uint8_t *ql = b + 64 * h + (k & 1) * 32, *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * k;
    const int shift = k >= 2 ? 4 : 0;
    for (int l = 0; l < 32; l++) {
        const int q = (((ql[l] >> shift) & 0x0f) | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
        v[l] = __fmul_rn(__fmul_rn(d, (float)sc[l / 16]), (float)q);
    }
}

/* Q2_K (scale/min bytes[16], qs[64], d, dmin) and Q3_K (hmask[32], qs[64],
 * 6-bit scales[12], d): chunk c is sub-block c % 8 = 4 half + s of its
 * super-block, its values bits 2s of qs bytes 32 half .. + 31 (and Q3_K's
 * third bit, bit c % 8 of hmask bytes 0..31), two scales of 16 values. */
static __device__ __forceinline__ void wq_chunk(wq_q2_k, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)(c / 8) * 84;
    const int k = c % 8;
    const float d = wq_half(b + 80), dmin = wq_half(b + 82);
    const uint8_t *q = b + 16 + 32 * (k / 4);
    for (int g = 0; g < 2; g++) {
        const int scm = b[2 * k + g];
        const float dl = __fmul_rn(d, (float)(scm & 0x0f)), ml = __fmul_rn(dmin, (float)(scm >> 4));
        for (int l = 16 * g; l < 16 * g + 16; l++)
            v[l] = __fadd_rn(__fmul_rn(dl, (float)((q[l] >> (2 * (k % 4))) & 3)), -ml);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_q3_k, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)(c / 8) * 110;
    const int k = c % 8;
    const float d = wq_half(b + 108);
    const uint8_t *q = b + 32 + 32 * (k / 4), *sb = b + 96;
    for (int g = 0; g < 2; g++) {
        const int j = 2 * k + g;
        const int lo = j < 8 ? sb[j] & 0x0f : sb[j - 8] >> 4;
        const int hi = (sb[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        const float dl = __fmul_rn(d, (float)((lo | hi << 4) - 32));
        for (int l = 16 * g; l < 16 * g + 16; l++) {
            const int x = ((q[l] >> (2 * (k % 4))) & 3) - ((b[l] >> k) & 1 ? 0 : 4);
            v[l] = __fmul_rn(dl, (float)x);
        }
    }
}

/* IQ4_NL (d, 16 bytes) and IQ4_XS (d, 6-bit scales, 8 x 16 bytes): nibbles
 * index quant_iq4nl_levels (a copy in constant memory). */
__constant__ int8_t wq_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static __device__ __forceinline__ void wq_iq4(float d, const uint8_t *qs, float *v)
{
    for (int j = 0; j < 16; j++) {
        v[j] = __fmul_rn(d, (float)wq_iq4_levels[qs[j] & 0x0f]);
        v[j + 16] = __fmul_rn(d, (float)wq_iq4_levels[qs[j] >> 4]);
    }
}

static __device__ __forceinline__ void wq_chunk(wq_iq4_nl, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)c * 18;
    wq_iq4(wq_half(b), b + 2, v);
}

static __device__ __forceinline__ void wq_chunk(wq_iq4_xs, const uint8_t *row, int32_t c, float *v)
{
    const uint8_t *b = row + (size_t)(c / 8) * 136;
    const int s = c % 8;
    const uint32_t sh = (uint32_t)(b[2] | b[3] << 8);
    const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0x0f) | (int)(((sh >> (2 * s)) & 3) << 4);
    wq_iq4(__fmul_rn(wq_half(b), (float)(ls - 32)), b + 8 + 16 * s, v);
}

/* Calls F(tag) for the weight's type (which cuda_wq_supported admitted). */
#define WQ_DISPATCH(type, F)                                                                       \
    switch (type) {                                                                                \
    case DP_TYPE_Q4_0: F(wq_q4_0{}); break;                                                        \
    case DP_TYPE_Q4_1: F(wq_q4_1{}); break;                                                        \
    case DP_TYPE_Q5_0: F(wq_q5_0{}); break;                                                        \
    case DP_TYPE_Q5_1: F(wq_q5_1{}); break;                                                        \
    case DP_TYPE_Q8_0: F(wq_q8_0{}); break;                                                        \
    case DP_TYPE_Q4_K: F(wq_q4_k{}); break;                                                        \
    case DP_TYPE_Q5_K: F(wq_q5_k{}); break;                                                        \
    case DP_TYPE_Q6_K: F(wq_q6_k{}); break;                                                        \
    case DP_TYPE_Q2_K: F(wq_q2_k{}); break;                                                        \
    case DP_TYPE_Q3_K: F(wq_q3_k{}); break;                                                        \
    case DP_TYPE_IQ4_NL: F(wq_iq4_nl{}); break;                                                    \
    case DP_TYPE_IQ4_XS: F(wq_iq4_xs{}); break;                                                    \
    default: break;                                                                                \
    }

bool cuda_wq_supported(uint32_t type)
{
    /* The types WQ_DISPATCH names: one list. */
    bool known = false;
#define WQ_KNOWN(tag) known = true
    WQ_DISPATCH(type, WQ_KNOWN)
#undef WQ_KNOWN
    return known;
}

/* ---- decode: the weight row once for every activation row ----------------------------- */

#define WQ_WARPS 4 /* weight rows per block of the GEMV */

template <int N> struct wq_rows {};

/* y[t, r] = W[r] . x[t] for t < m <= NT: one warp per weight row r, each
 * lane a strided share of its 32-value chunks. */
template <typename Q, int NT>
__global__ void __launch_bounds__(WQ_WARPS * 32)
    cuda_wq_gemv_kernel(Q q, wq_rows<NT>, float *y, const float *x, const uint8_t *w,
                        size_t row_bytes, int32_t rows, int32_t cols, int32_t m)
{
    const int lane = threadIdx.x % 32;
    const int32_t r = (int32_t)blockIdx.x * WQ_WARPS + (int32_t)(threadIdx.x / 32);
    if (r >= rows) /* the whole warp: r is the warp's */
        return;
    const uint8_t *wr = w + (size_t)r * row_bytes;
    float acc[NT];
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int32_t c = lane; c < cols / 32; c += 32) {
        float v[32];
        wq_chunk(q, wr, c, v);
        for (int t = 0; t < NT; t++) {
            if (t >= m)
                break;
            const float *xt = x + (size_t)t * (size_t)cols + (size_t)c * 32;
            float s = 0.0f;
            for (int j = 0; j < 32; j++)
                s = fmaf(v[j], xt[j], s);
            acc[t] += s;
        }
    }
    /* The warp's sums through shared memory, lane t adding up row t: one
     * warp barrier where shuffles would take five per row. */
    __shared__ float red[WQ_WARPS][NT][33];
    float(*wred)[33] = red[threadIdx.x / 32];
    for (int t = 0; t < NT; t++)
        wred[t][lane] = acc[t];
    __syncwarp();
    if (lane < NT && lane < m) {
        float s = 0.0f;
        for (int i = 0; i < 32; i++)
            s += wred[lane][i];
        y[(size_t)lane * (size_t)rows + (size_t)r] = s;
    }
}

template <typename Q, int NT>
static void wq_gemv(cuda_backend *c, Q q, float *y, const float *x, const dp_weight *w, int32_t m,
                    size_t row_bytes)
{
    const unsigned grid = (unsigned)((w->rows + WQ_WARPS - 1) / WQ_WARPS);
    CUDA_LAUNCH(cuda_wq_gemv_kernel, grid, WQ_WARPS * 32, 0, c->stream, q, wq_rows<NT>{}, y, x,
                (const uint8_t *)w->data, row_bytes, (int32_t)w->rows, (int32_t)w->cols, m);
}

/* ---- prefill: fp16 slabs for the tensor-core GEMM -------------------------------------- */

#define WQ_THREADS 256

/* out[r, :] = fp16(W[r0 + r, :]) for the n_rows rows of a slab (w points at
 * row r0). A thread per 32-value chunk, grid-stride. */
template <typename Q>
__global__ void cuda_wq_half_kernel(Q q, __half *out, const uint8_t *w, size_t row_bytes,
                                    int32_t cols, int64_t n_chunks)
{
    const int32_t per_row = cols / 32;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_chunks;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / per_row;
        const int32_t ch = (int32_t)(i % per_row);
        float v[32];
        wq_chunk(q, w + (size_t)r * row_bytes, ch, v);
        __half *o = out + (size_t)r * (size_t)cols + (size_t)ch * 32;
        for (int j = 0; j < 32; j++)
            o[j] = __float2half_rn(v[j]);
    }
}

static unsigned wq_grid(const cuda_backend *c, int64_t n)
{
    int64_t want = (n + WQ_THREADS - 1) / WQ_THREADS, cap = (int64_t)c->sm_count * 32;
    want = want > cap ? cap : want;
    return (unsigned)(want < 1 ? 1 : want);
}

/* The slab scratch: 32 MiB of fp16, enough for 4096 rows of a 4096-wide
 * matrix (a 7B layer's q projection in one slab). */
#define CUDA_WQ_SLAB_ELEMS ((size_t)16 << 20)

static void wq_gemm(cuda_backend *c, float *y, const dp_weight *w, int32_t m, size_t row_bytes)
{
    const int rows = (int)w->rows, cols = (int)w->cols;
    int64_t slab = (int64_t)(CUDA_WQ_SLAB_ELEMS / (size_t)cols);
    slab = slab < 1 ? 1 : slab > rows ? rows : slab;
    if (cuda_scratch_grow(c, (void **)&c->wdq, &c->wdq_cap, (size_t)slab * (size_t)cols,
                          sizeof(__half)))
        return;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
        const int nr = (int)(rows - r0 < slab ? rows - r0 : slab);
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
        const int64_t n_chunks = (int64_t)nr * (cols / 32);
#define WQ_HALF(tag)                                                                               \
    CUDA_LAUNCH(cuda_wq_half_kernel, wq_grid(c, n_chunks), WQ_THREADS, 0, c->stream, tag, c->wdq, \
                wr, row_bytes, (int32_t)cols, n_chunks)
        WQ_DISPATCH(w->type, WQ_HALF)
#undef WQ_HALF
        cuda_check_launch(c, "weight dequantization");
        /* Rows r0 .. r0 + nr of y^T (column-major, ld rows): see cuda_matmul. */
        const cublasStatus_t s = cublasGemmEx(
            c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nr, m, cols, &one, c->wdq, CUDA_R_16F, cols, c->xh,
            CUDA_R_16F, cols, &zero, y + r0, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cuda_note_blas(c, "matmul", s);
            return;
        }
    }
}

void cuda_wq_matmul(cuda_backend *c, float *y, const float *x, const dp_weight *w, int32_t m)
{
    uint64_t rb;
    if (quant_row_bytes(w->type, (uint64_t)w->cols, &rb))
        return;
    if (m <= CUDA_WQ_GEMV_MAX) {
        /* y may be the buffer xh copies (the fp16 copy is not read here). */
        cuda_xh_forget(c);
#define WQ_GEMV(tag)                                                                               \
    do {                                                                                           \
        if (m == 1)                                                                                \
            wq_gemv<decltype(tag), 1>(c, tag, y, x, w, m, rb);                                     \
        else if (m <= 4)                                                                           \
            wq_gemv<decltype(tag), 4>(c, tag, y, x, w, m, rb);                                     \
        else                                                                                       \
            wq_gemv<decltype(tag), CUDA_WQ_GEMV_MAX>(c, tag, y, x, w, m, rb);                      \
    } while (0)
        WQ_DISPATCH(w->type, WQ_GEMV)
#undef WQ_GEMV
        cuda_check_launch(c, "quantized matmul");
        return;
    }
    if (cuda_x_half(c, x, (size_t)m * (size_t)w->cols))
        return;
    wq_gemm(c, y, w, m, rb);
}

/* ---- embedding ----------------------------------------------------------------------- */

template <typename Q>
__global__ void cuda_wq_embed_kernel(Q q, const uint8_t *table, size_t row_bytes,
                                     const int32_t *tokens, float *out, int32_t dim)
{
    const uint8_t *row = table + (size_t)tokens[blockIdx.x] * row_bytes;
    float *o = out + (size_t)blockIdx.x * (size_t)dim;
    for (int32_t ch = threadIdx.x; ch < dim / 32; ch += blockDim.x) {
        float v[32];
        wq_chunk(q, row, ch, v);
        for (int j = 0; j < 32; j++)
            o[(size_t)ch * 32 + j] = v[j];
    }
}

void cuda_wq_embed(cuda_backend *c, const dp_weight *table, float *out, int32_t n)
{
    uint64_t rb;
    if (quant_row_bytes(table->type, (uint64_t)table->cols, &rb))
        return;
#define WQ_EMBED(tag)                                                                              \
    CUDA_LAUNCH(cuda_wq_embed_kernel, n, 64, 0, c->stream, tag, (const uint8_t *)table->data, rb,  \
                c->bd.tokens, out, (int32_t)table->cols)
    WQ_DISPATCH(table->type, WQ_EMBED)
#undef WQ_EMBED
    /* (cuda_embed checks the launch.) */
}
