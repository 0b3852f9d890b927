/* cpu_internal.h: state shared by the CPU backend's files (ops, matmul,
 * attention). Not part of any public surface. */
#ifndef DP_KERNELS_CPU_INTERNAL_H
#define DP_KERNELS_CPU_INTERNAL_H

#include "kernels/backend.h"
#include "threadpool.h"

/* Within a block, K is stored transposed per head ([head_dim][token]) so
 * that attention computes 16 scores per vector instruction without
 * horizontal sums; V keeps rows ([token][head_dim]) for the weighted sum. */
struct dp_kv_store {
    dp_kv_layout l;
    float *k;   /* [layer][block][kv_head][head_dim][token] */
    float *v;   /* [layer][block][kv_head][token][head_dim] */
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

/* Start of one head's data in one block (K: [head_dim][token], V: [token][head_dim]). */
static inline float *kv_head(const dp_kv_store *kv, float *base, int32_t layer, int32_t block,
                             int32_t head)
{
    const dp_kv_layout *l = &kv->l;
    size_t idx = (((size_t)layer * (size_t)l->n_blocks + (size_t)block) * (size_t)l->n_kv_heads +
                  (size_t)head);
    return base + idx * (size_t)l->block_tokens * (size_t)l->head_dim;
}

/* Row `tok` of V. */
static inline float *kv_vrow(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                             int32_t tok)
{
    return kv_head(kv, kv->v, layer, block, head) + (size_t)tok * (size_t)kv->l.head_dim;
}

/* K of token `tok` gathered from (to_row) or scattered into (from_row) its
 * transposed block. */
static inline void kv_kget(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, float *row)
{
    const float *k = kv_head(kv, kv->k, layer, block, head) + tok;
    const int32_t bt = kv->l.block_tokens;
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        row[d] = k[(size_t)d * (size_t)bt];
}

static inline void kv_kput(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, const float *row)
{
    float *k = kv_head(kv, kv->k, layer, block, head) + tok;
    const int32_t bt = kv->l.block_tokens;
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        k[(size_t)d * (size_t)bt] = row[d];
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
