/* cpu_internal.h: state shared by the CPU backend's files (ops, matmul,
 * attention). Not part of any public surface. */
#ifndef DP_KERNELS_CPU_INTERNAL_H
#define DP_KERNELS_CPU_INTERNAL_H

#include <string.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "kernels/backend.h"
#include "kernels/quant.h"
#include "threadpool.h"

/* Within a block, K is stored transposed per head ([head_dim][token]) so
 * that attention computes 16 scores per vector instruction without
 * horizontal sums; V keeps rows ([token][head_dim]) for the weighted sum.
 * Elements are f32 or f16 (kv->es bytes); kernels read them through kv_elt
 * and kv_load16, which widen f16 to f32. */
struct dp_kv_store {
    dp_kv_layout l;
    size_t es;  /* bytes per element: 4 (f32) or 2 (f16) */
    void *k;    /* [layer][block][kv_head][head_dim][token] */
    void *v;    /* [layer][block][kv_head][token][head_dim] */
};

typedef struct cpu_backend {
    dp_backend base;
    dp_threadpool *tp;
    /* Per-thread scratch: a tile of dequantized weight rows, and attention scores. */
    float **wscratch;
    size_t wscratch_elems;
    float **sscratch;
    size_t sscratch_elems;
    /* The current batch (copied by batch_set). */
    dp_batch b;
    int32_t *arrays;       /* backing store of the batch's index arrays */
    size_t arrays_cap;
    uint8_t *seq_store;
    size_t seq_store_cap;
} cpu_backend;

static inline cpu_backend *cpu_of(dp_backend *be) { return (cpu_backend *)be; }

static inline float kv_h2f(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return dp_fp16_to_f32(h);
#endif
}

static inline uint16_t kv_f2h(float f)
{
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return dp_f32_to_fp16(f);
#endif
}

/* Element index of one head's data in one block (K: [head_dim][token], V:
 * [token][head_dim]); the same for K and V. */
static inline size_t kv_head_off(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head)
{
    const dp_kv_layout *l = &kv->l;
    size_t idx = (((size_t)layer * (size_t)l->n_blocks + (size_t)block) * (size_t)l->n_kv_heads +
                  (size_t)head);
    return idx * (size_t)l->block_tokens * (size_t)l->head_dim;
}

/* Element i of K or V (base = kv->k or kv->v), as f32. */
static inline float kv_elt(const dp_kv_store *kv, const void *base, size_t i)
{
    return kv->es == 2 ? kv_h2f(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline void kv_set(const dp_kv_store *kv, void *base, size_t i, float x)
{
    if (kv->es == 2)
        ((uint16_t *)base)[i] = kv_f2h(x);
    else
        ((float *)base)[i] = x;
}

#ifdef __AVX512F__
/* n (<= 16) consecutive elements from i, widened to f32, zeros past n. */
static inline __m512 kv_load16(const dp_kv_store *kv, const void *base, size_t i, int32_t n)
{
    if (kv->es == 4)
        return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), (const float *)base + i);
    const uint16_t *p = (const uint16_t *)base + i;
    if (n == 16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    uint16_t tmp[16] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tmp));
}
#endif

/* K of token `tok` gathered from (kv_kget) or scattered into (kv_kput) its
 * transposed block; V rows likewise. */
static inline void kv_kget(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, float *row)
{
    size_t o = kv_head_off(kv, layer, block, head) + (size_t)tok;
    const size_t bt = (size_t)kv->l.block_tokens;
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        row[d] = kv_elt(kv, kv->k, o + (size_t)d * bt);
}

static inline void kv_kput(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, const float *row)
{
    size_t o = kv_head_off(kv, layer, block, head) + (size_t)tok;
    const size_t bt = (size_t)kv->l.block_tokens;
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        kv_set(kv, kv->k, o + (size_t)d * bt, row[d]);
}

/* Element index of row `tok` of V. */
static inline size_t kv_vrow_off(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                                 int32_t tok)
{
    return kv_head_off(kv, layer, block, head) + (size_t)tok * (size_t)kv->l.head_dim;
}

static inline void kv_vput(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, const float *row)
{
    size_t o = kv_vrow_off(kv, layer, block, head, tok);
    if (kv->es == 4) {
        memcpy((float *)kv->v + o, row, (size_t)kv->l.head_dim * sizeof *row);
        return;
    }
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        ((uint16_t *)kv->v)[o + (size_t)d] = kv_f2h(row[d]);
}

static inline void kv_vget(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, float *row)
{
    size_t o = kv_vrow_off(kv, layer, block, head, tok);
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        row[d] = kv_elt(kv, kv->v, o + (size_t)d);
}

int cpu_weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                    const void *src, char *err, size_t errsz);
void cpu_weight_free(dp_backend *be, dp_weight *w);
void cpu_matmul(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m);
/* Row r of w as f32 into dst (cols elements). */
void cpu_weight_row(const dp_weight *w, int64_t r, float *dst);
void cpu_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                   const float *q, int32_t n_heads, float scale);
void cpu_kv_score_knorm(dp_backend *be, const dp_kv_store *kv, const int32_t *table, int32_t n_slots,
                        float *out);
void cpu_kv_score_attn(dp_backend *be, const dp_kv_store *kv, const int32_t *table, int32_t n_slots,
                       const float *q, int64_t q_layer_stride, const int32_t *q_slot, int32_t n_q,
                       int32_t n_heads, float scale, float *out);
int cpu_kv_compact(dp_backend *be, const dp_kv_store *src, dp_kv_store *dst,
                   const dp_compact_seq *seqs, int32_t n_seqs);
int cpu_kv_block_read(dp_backend *be, const dp_kv_store *kv, int32_t block, void *host);
int cpu_kv_block_write(dp_backend *be, dp_kv_store *kv, int32_t block, const void *host);
int cpu_scratch_reserve(cpu_backend *c, size_t wscratch_elems, size_t sscratch_elems);
float cpu_dot(const float *a, const float *b, int64_t n);

#endif
