/* cpu_matmul.c: y = x . W^T over weights kept in their file type (Q4_1, Q8_0,
 * f16, ...). Rows of W are dequantized tile by tile into per-thread scratch, so
 * the quantized bytes are read once per step for the whole batch; small batches
 * then use fused AVX-512 dot products, large ones OpenBLAS sgemm on the tile. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "common/dp.h"
#include "cpu_internal.h"
#include "kernels/quant.h"

/* Batches up to this many rows use the dot-product path; above it, sgemm wins
 * (measured by tools/dp-bench: sgemm's packing overhead dominates below ~8). */
#define SMALL_M 16
#define TILE_SMALL 16
#define TILE_LARGE 64

int cpu_weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                    const void *src, char *err, size_t errsz)
{
    memset(w, 0, sizeof *w);
    if (!quant_type_supported(type))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "weight type %s is not supported",
                      quant_type_name(type));
    uint64_t row_bytes;
    int rc = quant_row_bytes(type, (uint64_t)cols, &row_bytes);
    if (rc)
        return dp_err(err, errsz, rc, "weight row of %lld %s elements has no valid size",
                      (long long)cols, quant_type_name(type));
    size_t nbytes = (size_t)row_bytes * (size_t)rows;
    size_t alloc = (nbytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, alloc ? alloc : 64);
    if (!p)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory for a %zu-byte weight", nbytes);
    memcpy(p, src, nbytes);
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->data = p;
    w->nbytes = nbytes;
    return 0;
}

void cpu_weight_free(dp_backend *be, dp_weight *w)
{
    free(w->data);
    memset(w, 0, sizeof *w);
}

static size_t weight_row_bytes(const dp_weight *w)
{
    return w->nbytes / (size_t)w->rows;
}

void cpu_weight_row(const dp_weight *w, int64_t r, float *dst)
{
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(w);
    if (w->type == DP_TYPE_F32)
        memcpy(dst, src, (size_t)w->cols * sizeof(float));
    else
        quant_dequant_row(w->type, src, dst, w->cols);
}

float cpu_dot(const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
    float part[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            part[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < 8; j++)
        s += part[j];
#endif
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Dot products of one weight row with up to 4 activation rows, sharing loads
 * of the weight row. */
static void dot_rows(const float *wr, const float *x, int64_t k, int32_t nx, float *out)
{
#ifdef __AVX512F__
    if (nx == 4 && k % 16 == 0) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < k; i += 16) {
            __m512 wv = _mm512_loadu_ps(wr + i);
            a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i), a0);
            a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + k + i), a1);
            a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 2 * k + i), a2);
            a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 3 * k + i), a3);
        }
        out[0] = _mm512_reduce_add_ps(a0);
        out[1] = _mm512_reduce_add_ps(a1);
        out[2] = _mm512_reduce_add_ps(a2);
        out[3] = _mm512_reduce_add_ps(a3);
        return;
    }
#endif
    for (int32_t j = 0; j < nx; j++)
        out[j] = cpu_dot(wr, x + (size_t)j * (size_t)k, k);
}

#ifdef __AVX512F__
/* AVX-512 decoding of one 32-element block into two vectors, for the types
 * real GGUF files use most. The arithmetic is the reference dequantization's
 * (d * q + m), so results match quant_dequant_row up to fma contraction. */
static inline float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __attribute__((always_inline)) void block_q4_1(const uint8_t *b, __m512 *w0, __m512 *w1)
{
    __m512 d = _mm512_set1_ps(h2f(b)), m = _mm512_set1_ps(h2f(b + 2));
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(0x0f));
    __m512i hi = _mm512_srli_epi32(q, 4);
    *w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m);
    *w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m);
}

static inline __attribute__((always_inline)) void block_q4_0(const uint8_t *b, __m512 *w0, __m512 *w1)
{
    __m512 d = _mm512_set1_ps(h2f(b));
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    __m512i eight = _mm512_set1_epi32(8);
    __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(0x0f)), eight);
    __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
}

static inline __attribute__((always_inline)) void block_q8_0(const uint8_t *b, __m512 *w0, __m512 *w1)
{
    __m512 d = _mm512_set1_ps(h2f(b));
    __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)));
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
}

typedef void (*block_fn)(const uint8_t *b, __m512 *w0, __m512 *w1);

/* y[i, r] for up to SMALL_M activation rows, decoding each weight block once
 * and reusing it for every row: the weight bytes are the cost at small m. */
/* The same for a compile-time number of rows M: the accumulators stay in
 * registers (with a runtime count they live in memory and every block pays
 * a load and a store per row). */
#define FUSED_FIXED(M)                                                                        \
    static inline __attribute__((always_inline)) void fused_rows_##M(                         \
        block_fn fn, size_t bbytes, const uint8_t *wrow, int64_t k, const float *x, float *out) \
    {                                                                                         \
        __m512 acc0[M], acc1[M];                                                              \
        for (int32_t i = 0; i < M; i++)                                                       \
            acc0[i] = acc1[i] = _mm512_setzero_ps();                                          \
        for (int64_t b = 0; b < k / 32; b++) {                                                \
            __m512 w0, w1;                                                                    \
            fn(wrow + (size_t)b * bbytes, &w0, &w1);                                          \
            for (int32_t i = 0; i < M; i++) {                                                 \
                const float *xi = x + (size_t)i * (size_t)k + b * 32;                         \
                acc0[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi), acc0[i]);                  \
                acc1[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), acc1[i]);             \
            }                                                                                 \
        }                                                                                     \
        for (int32_t i = 0; i < M; i++)                                                       \
            out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));                   \
    }
FUSED_FIXED(1)
FUSED_FIXED(2)
FUSED_FIXED(4)

static inline __attribute__((always_inline)) void fused_rows(block_fn fn, size_t bbytes, const uint8_t *wrow, int64_t k, const float *x,
                       int32_t m, float *out)
{
    switch (m) {
    case 1: fused_rows_1(fn, bbytes, wrow, k, x, out); return;
    case 2: fused_rows_2(fn, bbytes, wrow, k, x, out); return;
    case 4: fused_rows_4(fn, bbytes, wrow, k, x, out); return;
    default: break;
    }
    __m512 acc[SMALL_M];
    for (int32_t i = 0; i < m; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        __m512 w0, w1;
        fn(wrow + (size_t)b * bbytes, &w0, &w1);
        for (int32_t i = 0; i < m; i++) {
            const float *xi = x + (size_t)i * (size_t)k + b * 32;
            acc[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi), acc[i]);
            acc[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), acc[i]);
        }
    }
    for (int32_t i = 0; i < m; i++)
        out[i] = _mm512_reduce_add_ps(acc[i]);
}

static inline __attribute__((always_inline)) void decode_rows(block_fn fn, size_t bbytes, const uint8_t *w, int64_t nrows, int64_t k,
                        size_t row_bytes, float *dst)
{
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < k / 32; b++) {
            __m512 w0, w1;
            fn(w + (size_t)r * row_bytes + (size_t)b * bbytes, &w0, &w1);
            _mm512_storeu_ps(dst + (size_t)r * (size_t)k + b * 32, w0);
            _mm512_storeu_ps(dst + (size_t)r * (size_t)k + b * 32 + 16, w1);
        }
}

/* One instance per type, so the block decoder inlines into the loops. */
#define FAST_TYPES(X) X(DP_TYPE_Q4_1, q4_1, 20) X(DP_TYPE_Q4_0, q4_0, 18) X(DP_TYPE_Q8_0, q8_0, 34)
#define DEFINE_FAST(id, name, bytes)                                                        \
    static void fused_##name(const uint8_t *wrow, int64_t k, const float *x, int32_t m,      \
                             float *out)                                                    \
    {                                                                                       \
        fused_rows(block_##name, bytes, wrow, k, x, m, out);                                \
    }                                                                                       \
    static void decode_##name(const uint8_t *w, int64_t nrows, int64_t k, size_t rb,        \
                              float *dst)                                                   \
    {                                                                                       \
        decode_rows(block_##name, bytes, w, nrows, k, rb, dst);                             \
    }
FAST_TYPES(DEFINE_FAST)

typedef void (*fused_fn)(const uint8_t *wrow, int64_t k, const float *x, int32_t m, float *out);
typedef void (*decode_fn)(const uint8_t *w, int64_t nrows, int64_t k, size_t rb, float *dst);

static bool fast_path(uint32_t type, fused_fn *f, decode_fn *d)
{
#define CASE_FAST(id, name, bytes) \
    case id: *f = fused_##name; *d = decode_##name; return true;
    switch (type) {
    FAST_TYPES(CASE_FAST)
    default: return false;
    }
#undef CASE_FAST
}
#endif

typedef struct mm_job {
    cpu_backend *c;
    float *y;
    const float *x;
    const dp_weight *w;
    int32_t m;
    int64_t tile;
} mm_job;

static void mm_task(void *ctx, int64_t t, int thread)
{
    mm_job *j = ctx;
    const dp_weight *w = j->w;
    const int64_t k = w->cols, n = w->rows;
    const int64_t r0 = t * j->tile;
    const int64_t nt = r0 + j->tile <= n ? j->tile : n - r0;
#ifdef __AVX512F__
    /* Declared inside the #ifdef: without AVX-512 nothing reads them, and an
     * unused variable is an error under -Werror. */
    const size_t rb = weight_row_bytes(w);
    fused_fn ff = NULL;
    decode_fn df = NULL;
    bool fast = k % 32 == 0 && fast_path(w->type, &ff, &df);
    if (fast && j->m <= SMALL_M) {
        float out[SMALL_M];
        for (int64_t r = 0; r < nt; r++) {
            ff((const uint8_t *)w->data + (size_t)(r0 + r) * rb, k, j->x, j->m, out);
            for (int32_t i = 0; i < j->m; i++)
                j->y[(size_t)i * (size_t)n + (size_t)(r0 + r)] = out[i];
        }
        return;
    }
#endif
    const float *wt;
    if (w->type == DP_TYPE_F32) {
        wt = (const float *)w->data + (size_t)r0 * (size_t)k;
    } else {
        float *s = j->c->wscratch[thread];
#ifdef __AVX512F__
        if (fast)
            df((const uint8_t *)w->data + (size_t)r0 * rb, nt, k, rb, s);
        else
#endif
            for (int64_t r = 0; r < nt; r++)
                cpu_weight_row(w, r0 + r, s + (size_t)r * (size_t)k);
        wt = s;
    }
    if (j->m > SMALL_M) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->m, (blasint)nt, (blasint)k, 1.0f,
                    j->x, (blasint)k, wt, (blasint)k, 0.0f, j->y + r0, (blasint)n);
        return;
    }
    float out[4];
    for (int64_t r = 0; r < nt; r++) {
        const float *wr = wt + (size_t)r * (size_t)k;
        for (int32_t i = 0; i < j->m; i += 4) {
            int32_t nx = j->m - i < 4 ? j->m - i : 4;
            dot_rows(wr, j->x + (size_t)i * (size_t)k, k, nx, out);
            for (int32_t q = 0; q < nx; q++)
                j->y[(size_t)(i + q) * (size_t)n + (size_t)(r0 + r)] = out[q];
        }
    }
}

void cpu_matmul(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m)
{
    cpu_backend *c = cpu_of(be);
    mm_job j = {c, y, x, w, m, m > SMALL_M ? TILE_LARGE : TILE_SMALL};
    /* At least four tiles per thread, so that the last tile to finish does
     * not leave the other threads idle for long (the K and V projections
     * have few rows). */
    int64_t want = (int64_t)threadpool_size(c->tp) * 4;
    while (j.tile > 16 && (w->rows + j.tile - 1) / j.tile < want)
        j.tile /= 2;
    /* Scratch was sized at weight load time for TILE_LARGE rows of the widest
     * weight, see cpu_scratch_reserve. */
    int64_t tiles = (w->rows + j.tile - 1) / j.tile;
    threadpool_run(c->tp, mm_task, &j, tiles);
}
