/* cpu_internal.h: state shared by the CPU backend's files (ops, matmul,
 * attention). Not part of any public surface. */
#ifndef DP_KERNELS_CPU_INTERNAL_H
#define DP_KERNELS_CPU_INTERNAL_H

#include <math.h>
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
 * (and cpu_kern.c's vector loads), which widen f16 to f32. */
struct dp_kv_store {
    dp_kv_layout l;
    size_t es;        /* f32 / f16: bytes per element (4 or 2); 0 when quantized */
    uint32_t qtype;   /* q8_0 / q4_0: the GGML type of each row's blocks (else 0) */
    size_t row_bytes; /* quantized: bytes of one token's head_dim values */
    size_t blk_bytes; /* bytes of one (layer, block) of K, and of V: the block stride
                       * (a view's is its base's, which may exceed its own need) */
    bool view;        /* k and v belong to another store */
    bool kivi;        /* DP_KV_KIVI4: a block is one group per head (kernels/quant.h),
                       * a head's K and V each cpu_kivi_head_bytes apart */
    const struct dp_kv_store *base; /* a view's arena (kivi: where the residual lives) */
    void *k;          /* [layer][block][kv_head][head_dim][token]; quantized:
                       * [layer][block][kv_head][token][row] */
    void *v;          /* [layer][block][kv_head][token][head_dim] (or [row]) */
};

/* Bytes of one token's head_dim values of a KV type (0: head_dim does not
 * divide into the type's 32-value blocks, or an unknown type). */
static inline size_t cpu_kv_row_bytes(int32_t type, int32_t head_dim)
{
    switch (type) {
    case DP_KV_F32: return (size_t)head_dim * 4;
    case DP_KV_F16: return (size_t)head_dim * 2;
    case DP_KV_Q8_0: return head_dim % 32 ? 0 : (size_t)head_dim / 32 * 34;
    case DP_KV_Q4_0: return head_dim % 32 ? 0 : (size_t)head_dim / 32 * 18;
    default: return 0;
    }
}

/* kivi4: bytes of one head's K (and of its V: the larger of the two) in a
 * block of block_tokens tokens. */
static inline size_t cpu_kivi_head_bytes(const dp_kv_layout *l)
{
    const size_t k = kivi_k_bytes(l->head_dim, l->block_tokens);
    const size_t v = kivi_v_bytes(l->head_dim, l->block_tokens);
    return k > v ? k : v;
}

/* One activation block quantized for the integer dot products: 32 values as
 * d * q[i], s = d * sum(q) (what a weight type with an offset needs), and
 * the sums of q[0..15] and q[16..31] (the types with a scale or an offset
 * per 16 columns: Q2_K, Q3_K, Q6_K), h[0] | h[1] << 16 loaded as one i32. */
typedef struct cpu_q8 {
    float d, s;
    int16_t h[2];
    int8_t q[32];
} cpu_q8;

/* The hot kernels of one instruction-set level (cpu_kern.c, compiled once per
 * level; cpu_dispatch.c chooses). Each works on plain arrays and one task's
 * share of the work: the callers own the threading. */
/* Q4_1, Q4_0, Q8_0, Q5_0 and Q5_1 weights at a level whose mm_q8 reads them
 * so (cpu_kern.x8) are kept in groups of 8 rows (CPU_LAYOUT_X8). Per
 * 32-column block of the 8 rows: their 16-bit scalars, 8 of each kind in a
 * row (Q4_1: 8 d, then 8 m; Q5_0: 8 d, then 32 bytes of the 8 rows' fifth
 * bits; Q5_1: d, m, then the fifth bits; the others: 8 d), then their
 * quant bytes in vectors of 32 bytes, lane j (bytes 4j..4j+3) of vector c
 * holding bytes 4c..4c+3 of row j's block (Q4 and Q5: 4 vectors, columns
 * 4c.. in the low nibbles and 16+4c.. in the high ones; Q8_0: 8 vectors,
 * columns 4c..4c+3). The fifth bits are one vector laid out as the
 * nibbles: byte 4j + i (row j) holds in bit 2c the fifth bit of the low
 * nibble of byte 4j + i of vector c, in bit 2c + 1 that of its high
 * nibble, so a shift and a mask give each vector's. Broadcasting 4
 * activation bytes against a vector gives the 8 rows' products in its 8
 * lanes: no horizontal sums, no nibble unpack per row, and the scales load
 * as a vector. The same bytes as the file's layout, rearranged. */
enum { CPU_LAYOUT_ROWS = 0, CPU_LAYOUT_X8 = 1 };
/* Consecutive prompt tokens of one sequence attended in one task
 * (cpu_attention.c, attend_tile). */
#define CPU_ATTN_TILE 8
#define CPU_X8_MAX_COLS 16384 /* rows the exact paths unpack on the stack */
#define CPU_X8_ROW_MAX (CPU_X8_MAX_COLS / 32 * 34)
static inline bool cpu_x8_type(uint32_t t)
{
    return t == DP_TYPE_Q4_1 || t == DP_TYPE_Q4_0 || t == DP_TYPE_Q8_0 || t == DP_TYPE_Q5_0 ||
           t == DP_TYPE_Q5_1 || t == DP_TYPE_Q4_K || t == DP_TYPE_Q5_K || t == DP_TYPE_Q6_K ||
           t == DP_TYPE_IQ4_NL || t == DP_TYPE_IQ4_XS || t == DP_TYPE_Q2_K || t == DP_TYPE_Q3_K;
}
/* Q4_K, Q5_K and Q6_K are kept per super-block of 256 columns of the 8
 * rows, with their scales decoded at load (f32 products of them are exact,
 * as the reference's): Q4_K: 8 d, 8 dmin (f16), then per 32-column
 * sub-block the 8 rows' 6-bit scales (bytes), then their mins, then the
 * sub-blocks' nibbles as Q4_0's above (columns 0-15 low, 16-31 high).
 * Q5_K: the same with, before the nibbles, each sub-block's 8 rows' fifth
 * bits as Q5_0's vector of them. Q6_K: 8 d (f16), per 16
 * columns the 8 rows' int8 scales, then per 32-column block the low 4 bits
 * as Q4_0's nibbles and the 8 rows' top 2 bits as two vectors laid out as
 * the nibbles: vector k / 2 holds nibble vector k's, at bits 4 (k % 2) of
 * each byte for its low nibble and 4 (k % 2) + 2 for its high one (a shift
 * and a mask put them at bits 4-5).
 * IQ4_XS: 8
 * d (f16), per sub-block the 8 rows' scales minus 32 (int8), then the
 * nibbles as Q4_0's (IQ4_NL's are Q4_0's layout: its 16 levels in place of
 * q - 8).
 * Q2_K and Q3_K (16 columns a scale): Q2_K: 8 d, 8 dmin (f16), per 16
 * columns the 8 rows' file bytes (scale low nibble, min high nibble); Q3_K:
 * 8 d, per 16 columns the 8 rows' scales minus 32 (int8). Then per 32-column
 * sub-block the 2-bit values as two vectors: vector L, bits 2f of lane j's
 * byte i hold column 4 (4 L + f) + i of row j (shift and mask give the
 * 4-column groups in Q8_0's order); Q3_K adds the 8 rows' third bits as
 * Q5_0's 32-bit masks. */
static inline bool cpu_x8_kquant(uint32_t t)
{
    return t == DP_TYPE_Q4_K || t == DP_TYPE_Q5_K || t == DP_TYPE_Q6_K || t == DP_TYPE_IQ4_XS ||
           t == DP_TYPE_Q2_K || t == DP_TYPE_Q3_K;
}
/* Where the quants start (Q5_K's masks at CPU_X8K_Q4_QS). */
enum {
    CPU_X8K_Q4_QS = 160,
    CPU_X8K_Q5_QS = 160 + 256,
    CPU_X8K_Q6_QS = 144,
    CPU_X8K_IQ4_QS = 80,
    CPU_X8K_Q2_QS = 160,
    CPU_X8K_Q3_QS = 144
};
/* Columns of one packed block: 256 for the K types, else 32. */
static inline int64_t cpu_x8_cols(uint32_t t) { return cpu_x8_kquant(t) ? 256 : 32; }
/* 16-bit scalars per block: d (and m), and for Q5 the 32 high bits as two
 * halves, so that they too load as a vector of the 8 rows'. */
static inline int cpu_x8_scalars(uint32_t t)
{
    return t == DP_TYPE_Q4_1 ? 2 : t == DP_TYPE_Q5_0 ? 3 : t == DP_TYPE_Q5_1 ? 4 : 1;
}
static inline int cpu_x8_qbytes(uint32_t t) { return t == DP_TYPE_Q8_0 ? 32 : 16; }
/* Bytes of one packed block of 8 rows (8 times the file's block, the K
 * types' a little more). */
static inline size_t cpu_x8_block(uint32_t t)
{
    if (t == DP_TYPE_Q4_K)
        return CPU_X8K_Q4_QS + 8 * 128;
    if (t == DP_TYPE_Q5_K)
        return CPU_X8K_Q5_QS + 8 * 128;
    if (t == DP_TYPE_Q6_K)
        return CPU_X8K_Q6_QS + 8 * 192;
    if (t == DP_TYPE_IQ4_XS)
        return CPU_X8K_IQ4_QS + 8 * 128;
    if (t == DP_TYPE_Q2_K) /* the file's size: 8 x 84 */
        return CPU_X8K_Q2_QS + 8 * 64;
    if (t == DP_TYPE_Q3_K)
        return CPU_X8K_Q3_QS + 8 * 96;
    return 8 * (size_t)(2 * cpu_x8_scalars(t) + cpu_x8_qbytes(t));
}
static inline size_t cpu_x8_bytes(uint32_t t, int64_t rows, int64_t cols)
{
    return (size_t)(rows / 8) * (size_t)(cols / cpu_x8_cols(t)) * cpu_x8_block(t);
}
/* src: rows x cols in the file's layout (rows % 8 == 0, cols % cpu_x8_cols == 0). */
void cpu_x8_pack(uint32_t type, const uint8_t *src, int64_t rows, int64_t cols, uint8_t *dst);
/* Row r of a repacked weight in the file's layout. */
void cpu_x8_unpack_row(const dp_weight *w, int64_t r, uint8_t *dst);

typedef struct cpu_kern {
    const char *name; /* "avx512", "avx2", "baseline" */
    bool x8;          /* mm_q8 reads cpu_x8_type weights repacked (CPU_LAYOUT_X8): they load so */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* y[i * w->rows + r] = x_i . W_r for rows r in [r0, r0 + nt) and m
     * activation rows x (exact: W decoded to f32). */
    void (*mm_f32)(const dp_weight *w, int64_t r0, int64_t nt, const float *x, int32_t m, float *y);
    /* The same on activations quantized by quantize_q8 (k / 32 blocks per
     * row): integer dot products, for weights q8_supports accepts. Both NULL
     * at a level without them. */
    bool (*q8_supports)(const dp_weight *w);
    void (*mm_q8)(const dp_weight *w, int64_t r0, int64_t nt, const cpu_q8 *xq, int32_t m, float *y);
    void (*quantize_q8)(const float *x, int64_t k, cpu_q8 *out);
    /* Rows [r0, r0 + nt) of w as f32 into dst (for sgemm). */
    void (*decode_rows)(const dp_weight *w, int64_t r0, int64_t nt, float *dst);
    /* Attention of `group` query heads sharing KV head kvh over slots
     * [0, n_slots) of a sequence's table (online softmax, one pass). */
    void (*attend)(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                   int32_t first, int32_t n_slots, const float *const *qs, float *const *outs,
                   int32_t group, float scale);
    /* The same for nt <= CPU_ATTN_TILE consecutive tokens of one sequence
     * (token t over slots [0, n_slots[t]), n_slots rising by one; qs and
     * outs token-major), each output attend's bits; not grouped stores. */
    void (*attend_tile)(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                        const int32_t *n_slots, int32_t nt, const float *const *qs,
                        float *const *outs, int32_t group, float scale);
    /* The same over a grouped store's sequence (backend.h seq_sealed). */
    void (*attend_grouped)(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                           int32_t n_slots, int32_t sealed, int32_t roff, const float *const *qs,
                           float *const *outs, int32_t group, float scale);
    /* Scaled scores of nq queries against slots [0, n) of one head, query
     * j's into sc[j] (each independent of the others). */
    void (*head_scores)(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                        int32_t n, const float *const *qs, int32_t nq, float scale, float *const *sc);
    /* o[i] += softmax(sc[0, n))[i]; sc is overwritten. */
    void (*softmax_add)(float *sc, int32_t n, float *o);
    /* The migration copy: rows [0, n) of one head of one block as f32 rows
     * ([n][head_dim], K into kr and V into vr), and one f32 row into a
     * quantized store's row (bit-identical to quant_quantize_row). */
    void (*kv_rows)(const dp_kv_store *kv, int32_t layer, int32_t blk, int32_t head, int32_t n,
                    float *kr, float *vr);
    void (*kv_quant_row)(uint32_t qtype, const float *x, uint8_t *dst, int32_t n);
    /* kernels/topk.h's host functions (dp_topk_row, _argmax, _weights). */
    void (*topk_row)(const float *x, int32_t vocab, int32_t k, float inv_t, int32_t *ids,
                     float *vals, float *max, float *sum);
    int32_t (*topk_argmax)(const float *x, int32_t vocab);
    int32_t (*topk_weights)(const float *x, int32_t vocab, float m, float inv_t, int32_t *ids,
                            uint64_t *w, float *t);
} cpu_kern;

extern const cpu_kern cpu_kern_baseline;
#ifdef DP_CPU_X86_LEVELS
extern const cpu_kern cpu_kern_avx2, cpu_kern_avx512;
#endif

/* The level the process runs (chosen once, see cpu_dispatch.c). */
const cpu_kern *cpu_kern_get(void);
/* The level of that name where this build has it and this CPU runs it, else
 * NULL (tests compare levels on one machine). */
const cpu_kern *cpu_kern_level(const char *name);
/* True when matmuls use the exact f32 path (DP_CPU_EXACT or
 * backend_cpu_set_exact). */
bool cpu_exact_get(void);

typedef struct cpu_backend {
    dp_backend base;
    dp_threadpool *tp;
    /* Per-thread scratch: a tile of dequantized weight rows, and attention scores. */
    float **wscratch;
    size_t wscratch_elems;
    float **sscratch;
    size_t sscratch_elems;
    /* The current batch (copied by batch_set), its exempt layers' view
     * (bx: b with the x_ arrays as slot, seq_store and block_tables) and its
     * sliding-window layers' (bw: positions as slots, the w_ tables). */
    dp_batch b, bx, bw;
    int32_t *arrays;       /* backing store of the batch's index arrays */
    size_t arrays_cap;
    uint8_t *seq_store;
    size_t seq_store_cap;
    const cpu_kern *k;     /* the kernels of the chosen level */
    bool exact;            /* no activation quantization */
    cpu_q8 *xq;            /* a matmul's quantized activations */
    size_t xq_cap;         /* blocks */
    int32_t *attn_tiles;   /* an attention's tiles of tokens (cpu_attention.c) */
    size_t attn_tiles_cap;
} cpu_backend;

static inline cpu_backend *cpu_of(dp_backend *be) { return (cpu_backend *)be; }
/* Where a layer reads the batch's keys and values (backend.h n_exempt,
 * layer_map), and its layer in the stores of that view (*kl). */
static inline const dp_batch *cpu_batch_at(const cpu_backend *c, int32_t layer, int32_t *kl)
{
    if (c->b.layer_map) {
        const int32_t m = c->b.layer_map[layer];
        *kl = m >= 0 ? m : -1 - m;
        return m >= 0 ? &c->b : &c->bw;
    }
    *kl = layer;
    return layer < c->b.n_exempt ? &c->bx : &c->b;
}

static inline float kv_h2f(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return dp_fp16_to_f32(h);
#endif
}

/* f32 to an f16 K/V element, saturated at +-65504: an inf kept in the cache
 * would turn its attention rows into NaN. The CUDA backend's stores do the
 * same (cuda_sat_half); NaN stays NaN. */
static inline uint16_t kv_f2h(float f)
{
    if (fabsf(f) > 65504.0f)
        f = copysignf(65504.0f, f);
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return dp_f32_to_fp16(f);
#endif
}

/* f32 / f16 stores only (es > 0; quantized ones use kv_qrow_off): element
 * index of one head's data in one block (K: [head_dim][token], V:
 * [token][head_dim]); the same for K and V. */
static inline size_t kv_head_off(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head)
{
    const dp_kv_layout *l = &kv->l;
    size_t blk = ((size_t)layer * (size_t)l->n_blocks + (size_t)block) * (kv->blk_bytes / kv->es);
    return blk + (size_t)head * (size_t)l->block_tokens * (size_t)l->head_dim;
}

/* Quantized: byte offset of token tok's row of one head (K and V alike). */
static inline size_t kv_qrow_off(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                                 int32_t tok)
{
    const dp_kv_layout *l = &kv->l;
    return ((size_t)layer * (size_t)l->n_blocks + (size_t)block) * kv->blk_bytes +
           ((size_t)head * (size_t)l->block_tokens + (size_t)tok) * kv->row_bytes;
}

/* kivi4: byte offset of one head's K (in kv->k) and V (in kv->v) block. */
static inline size_t kv_kivi_off(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head)
{
    return ((size_t)layer * (size_t)kv->l.n_blocks + (size_t)block) * kv->blk_bytes +
           (size_t)head * cpu_kivi_head_bytes(&kv->l);
}

/* kivi4: where slot p of a sequence lives when it is in the residual
 * (p >= sealed): the block of the arena (kv->base) and the token in it. */
static inline void kv_kivi_residual(const dp_kv_store *kv, const int32_t *table, int32_t sealed,
                                    int32_t roff, int32_t p, int32_t *block, int32_t *tok)
{
    const int32_t bbt = kv->base->l.block_tokens, q = p - sealed + roff;
    *block = table[dp_kv_group_rstart(bbt, kv->l.block_tokens, sealed) + q / bbt];
    *tok = q % bbt;
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


/* K of token `tok` gathered from (kv_kget) or scattered into (kv_kput) its
 * transposed block; V rows likewise. */
static inline void kv_kget(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, float *row)
{
    if (kv->qtype) {
        quant_dequant_row(kv->qtype, (const uint8_t *)kv->k + kv_qrow_off(kv, layer, block, head, tok),
                          row, kv->l.head_dim);
        return;
    }
    size_t o = kv_head_off(kv, layer, block, head) + (size_t)tok;
    const size_t bt = (size_t)kv->l.block_tokens;
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        row[d] = kv_elt(kv, kv->k, o + (size_t)d * bt);
}

static inline void kv_kput(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head,
                           int32_t tok, const float *row)
{
    if (kv->qtype) {
        quant_quantize_row(kv->qtype, row, (uint8_t *)kv->k + kv_qrow_off(kv, layer, block, head, tok),
                           kv->l.head_dim);
        return;
    }
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
    if (kv->qtype) {
        quant_quantize_row(kv->qtype, row, (uint8_t *)kv->v + kv_qrow_off(kv, layer, block, head, tok),
                           kv->l.head_dim);
        return;
    }
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
    if (kv->qtype) {
        quant_dequant_row(kv->qtype, (const uint8_t *)kv->v + kv_qrow_off(kv, layer, block, head, tok),
                          row, kv->l.head_dim);
        return;
    }
    size_t o = kv_vrow_off(kv, layer, block, head, tok);
    for (int32_t d = 0; d < kv->l.head_dim; d++)
        row[d] = kv_elt(kv, kv->v, o + (size_t)d);
}

int cpu_weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                    const void *src, char *err, size_t errsz);
void cpu_weight_free(dp_backend *be, dp_weight *w);
void cpu_matmul(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m);
void cpu_matmul_shared(dp_backend *be, float *const *ys, const float *x,
                       const dp_weight *const *ws, int32_t n, int32_t m);
/* Row r of w as f32 into dst (cols elements). */
void cpu_weight_row(const dp_weight *w, int64_t r, float *dst);
void cpu_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                   const float *q, int32_t n_heads, float scale, int32_t window);
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

#endif
