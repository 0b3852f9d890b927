/* backend.h: the one interface between the forward pass and the hardware.
 * model/llama.c calls only these operations; kernels/cpu and kernels/cuda
 * implement them and must produce the same tokens on the same model. */
#ifndef DP_KERNELS_BACKEND_H
#define DP_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>

#include "common/dp.h"

typedef struct dp_backend dp_backend;

/* A weight tensor resident on the backend. rows = output features (GGUF
 * ne[1]), cols = input features (ne[0], contiguous). A vector has rows = 1.
 * The backend picks the storage type (it may keep a quantized type as is). */
typedef struct dp_weight {
    uint32_t type;     /* dp_dtype of data */
    int64_t rows;
    int64_t cols;
    void *data;        /* backend memory */
    size_t nbytes;
    uint32_t layout;   /* backend-private: how data is arranged (0: the file's rows) */
} dp_weight;

/* The geometry of one KV store (one pool's memory). Each block holds, per
 * layer, K and V for block_tokens tokens of every KV head, laid out
 * [kv_head][token][head_dim] so that one head's rows of a block are
 * contiguous (the compaction copy moves rows per head). */
/* Element type of a KV store. f16 is what llama.cpp keeps by default and the
 * CUDA backend always keeps; f32 is the CPU's exact reference. q8_0 and
 * q4_0 (the GGML block formats, 32 values per f16 scale, as llama.cpp's
 * quantized KV types) quantize each token's row of head_dim values on its
 * own, so appending a token never changes another's bytes; stores of these
 * types keep K and V both as [kv_head][token][row]. */
/* kivi4 (kernels/quant.h) is the decode path's grouped type: a block is one
 * group of block_tokens tokens, written whole (kv_compact) once the group is
 * full; a sequence's newest tokens live in its residual until then (the
 * batch's seq_sealed, seq_roff). Only a view of an f32 / f16 arena holds it
 * (the residual's blocks are the arena's). */
typedef enum dp_kv_type {
    DP_KV_F32 = 0,
    DP_KV_F16 = 1,
    DP_KV_Q8_0 = 2,
    DP_KV_Q4_0 = 3,
    DP_KV_KIVI4 = 4
} dp_kv_type;
#define DP_KV_TYPE_COUNT 5

static inline const char *dp_kv_type_name(int t)
{
    static const char *const names[] = {"f32", "f16", "q8_0", "q4_0", "kivi4"};
    return t >= 0 && t < DP_KV_TYPE_COUNT ? names[t] : "unknown";
}
/* The type named name (dp_kv_type_name's spelling), or -1. */
static inline int dp_kv_type_parse(const char *name)
{
    for (int t = 0; t < DP_KV_TYPE_COUNT; t++)
        if (!strcmp(name, dp_kv_type_name(t)))
            return t;
    return -1;
}
static inline bool dp_kv_type_quantized(int t)
{
    return t == DP_KV_Q8_0 || t == DP_KV_Q4_0 || t == DP_KV_KIVI4;
}
/* Types whose blocks are written a whole group at a time. */
static inline bool dp_kv_type_grouped(int t) { return t == DP_KV_KIVI4; }

/* A grouped sequence's lead: its first block of the arena, kept whole once
 * groups follow it (sealed > 0). The first tokens are the attention sinks
 * and the start of the system prompt that every later token attends to;
 * quantizing them costs most of a 4-bit cache's error for one block of
 * bytes per sequence. */
static inline int32_t dp_kv_group_lead(int32_t base_tokens, int32_t sealed)
{
    return sealed > 0 ? base_tokens : 0;
}
/* The table index where the residual starts: after the lead and the groups. */
static inline int32_t dp_kv_group_rstart(int32_t base_tokens, int32_t group, int32_t sealed)
{
    return sealed > 0 ? 1 + (sealed - base_tokens) / group : 0;
}
/* Whether sealed is 0 or the lead and whole groups. */
static inline bool dp_kv_group_sealed_ok(int32_t base_tokens, int32_t group, int32_t sealed)
{
    return sealed == 0 || (sealed >= base_tokens && (sealed - base_tokens) % group == 0);
}

typedef struct dp_kv_layout {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_tokens;
    int32_t n_blocks;
    int32_t type;        /* dp_kv_type (CUDA: f32 is kept in f16) */
    int32_t base_tokens; /* a grouped type's view (kv_layout of it): the block_tokens of
                          * the arena it views, where its residual lives */
} dp_kv_layout;

typedef struct dp_kv_store dp_kv_store;

/* A step addresses at most this many stores (the prefill pool, for each
 * decode type, DP_KV_TYPE_COUNT at most, the decode pool and its exempt
 * layers, and the sliding-window layers' store); the stores[] argument of
 * the ops below always has this many entries, NULL where unused. */
#define DP_KV_MAX_STORES 10

/* A step's batch as the backend sees it: a flat list of tokens, each with its
 * sequence, its rotary position and its cache slot. A token's K/V go to slot
 * `slot` of its sequence's block table, and it attends to slots 0..slot of
 * the same sequence (keys carry their rotation, so slots need not equal
 * positions: a compacted sequence attends over its kept tokens). */
typedef struct dp_batch {
    int32_t n_tokens;
    const int32_t *tokens;       /* [n_tokens] */
    const int32_t *pos;          /* [n_tokens] rotary position */
    const int32_t *seq;          /* [n_tokens] index into the sequence arrays */
    const int32_t *slot;         /* [n_tokens] cache slot within the sequence */
    int32_t n_seqs;
    const uint8_t *seq_store;    /* [n_seqs] which KV store (index into stores[]) */
    const int32_t *block_tables; /* [n_seqs * max_blocks] block ids */
    int32_t max_blocks;          /* row stride of block_tables */
    int32_t n_out;               /* tokens whose logits are wanted */
    const int32_t *out_tokens;   /* [n_out] indices into the token list */
    int32_t n_capture;           /* tokens whose queries are kept for scoring */
    const int32_t *capture_tokens; /* [n_capture] indices into the token list */
    /* Exempt layers (a decode-path sequence keeps its first layers whole):
     * layers [0, n_exempt) read each token's keys and values through these
     * arrays instead of slot, seq_store and block_tables, and kv_write puts
     * the token there as well as at slot (the compact table stays complete
     * in every layer). 0: none; a sequence with no exempt table repeats its
     * own arrays here. */
    int32_t n_exempt;
    const int32_t *x_slot;          /* [n_tokens] */
    const uint8_t *x_seq_store;     /* [n_seqs] */
    const int32_t *x_block_tables;  /* [n_seqs * x_max_blocks] */
    int32_t x_max_blocks;
    /* Grouped stores (dp_kv_type_grouped): sealed is 0 (every slot in the
     * residual, from table[0]) or lead + k groups (dp_kv_group_*): slots
     * [0, lead) are its table's first block, one of the base (the arena
     * the store views) kept whole; slots [lead, sealed) the k whole groups
     * in the next k blocks; slot p >= sealed is its residual's entry
     * p - sealed + roff, in the base's blocks that follow in the table,
     * base block_tokens each. kv_write puts a token there. NULL when no
     * sequence of the step is on such a store (attention then reads every
     * slot as groups from table[0], with no lead). */
    const int32_t *seq_sealed;      /* [n_seqs] */
    const int32_t *seq_roff;        /* [n_seqs] */
    /* Sliding-window layers kept at their window, in a store of their own
     * (a model with such layers, dp_hparams.swa_window): layer_map[l] >= 0
     * makes layer l a global one, that layer of the stores above; < 0 a
     * sliding one, layer -1 - layer_map[l] of stores[w_store], read and
     * written through w_block_tables (w_max_blocks a row) at the token's
     * position as its slot. A sequence's entries there for blocks wholly
     * before its tokens' windows may be -1: they are never read. NULL: none
     * (layer l is layer l); no exempt layers with it. The array is the
     * model's and outlives the step (llama_kv_layer_map). */
    const int32_t *layer_map;
    int32_t w_store;
    const int32_t *w_block_tables;  /* [n_seqs * w_max_blocks] */
    int32_t w_max_blocks;
} dp_batch;

/* A decode step: one token per sequence (consecutive tokens belong to
 * different sequences) and no query capture. Such steps are the ones a
 * backend may pad and record (step_pad, step_begin). */
static inline bool dp_batch_is_decode(const dp_batch *b)
{
    if (b->n_capture > 0 || b->n_tokens != b->n_seqs)
        return false;
    for (int32_t i = 1; i < b->n_tokens; i++)
        if (b->seq[i] == b->seq[i - 1])
            return false;
    return true;
}

/* One sequence's migration for kv_compact: for every layer and KV head, the
 * source slots to keep, in order; kept slot s of head h lands in slot s of
 * the destination table (so one table serves every head). */
typedef struct dp_compact_seq {
    const int32_t *src_table;    /* host, block ids in the source store */
    int32_t n_src_blocks;
    const int32_t *dst_table;    /* host, block ids in the destination store */
    int32_t n_dst_blocks;
    int32_t n_keep;
    const int32_t *keep;         /* host, [n_layers][n_kv_heads][n_keep] source slots */
} dp_compact_seq;

/* kv_compact's arguments, checked alike by every backend before it copies
 * (the copy trusts every index): layouts src (ls) and dst (ld), dst with
 * as many layers as src or fewer (an exempt-layer view; a backend without
 * views never sees one), grouped types as each store is. A grouped source
 * is DP_EUNSUPPORTED: a compaction writes a grouped store, never reads one
 * (its keep lists could not name the residual's slots, which live in the
 * arena); a grouped destination keeps whole groups of its block tokens. */
static inline int kv_compact_check(const dp_kv_layout *ls, const dp_kv_layout *ld, bool src_grouped,
                                   bool dst_grouped, const dp_compact_seq *seqs, int32_t n_seqs)
{
    if (n_seqs < 0 || ls->n_layers < ld->n_layers || ls->n_kv_heads != ld->n_kv_heads ||
        ls->head_dim != ld->head_dim)
        return DP_EINVAL;
    if (src_grouped)
        return DP_EUNSUPPORTED;
    for (int32_t i = 0; i < n_seqs; i++) {
        const dp_compact_seq *q = &seqs[i];
        if (q->n_keep < 0 || q->n_src_blocks < 0 || q->n_dst_blocks < 0 ||
            (int64_t)q->n_keep > (int64_t)q->n_dst_blocks * ld->block_tokens ||
            (dst_grouped && q->n_keep % ld->block_tokens))
            return DP_EINVAL;
        for (int32_t b = 0; b < q->n_dst_blocks; b++)
            if (q->dst_table[b] < 0 || q->dst_table[b] >= ld->n_blocks)
                return DP_EINVAL;
        for (int32_t b = 0; b < q->n_src_blocks; b++)
            if (q->src_table[b] < 0 || q->src_table[b] >= ls->n_blocks)
                return DP_EINVAL;
        const int64_t n = (int64_t)ld->n_layers * ld->n_kv_heads * q->n_keep;
        const int64_t slots = (int64_t)q->n_src_blocks * ls->block_tokens;
        for (int64_t k = 0; k < n; k++)
            if (q->keep[k] < 0 || q->keep[k] >= slots)
                return DP_EINVAL;
    }
    return 0;
}

typedef struct dp_rope_params {
    int32_t n_rot;       /* rotated dims per head (<= head_dim) */
    float freq_base;
    float freq_scale;    /* 1 / linear scaling factor; 1 when unscaled */
    bool neox;           /* rotate halves (NeoX) instead of adjacent pairs (LLaMA GGUF: false) */
    const float *freq_factors; /* [n_rot / 2] backend memory: pair d's angle is divided by
                                  freq_factors[d] (Llama 3's rope_freqs, LongRoPE's short or
                                  long factors); NULL: none */
    float mscale;        /* cos and sin are multiplied by it (LongRoPE's attention factor,
                            YaRN's magnitude scale: llama.cpp's attn_factor); 1 without */
    /* YaRN (ext_factor 0: none): pair d's angle is theta_i (1 - m) + theta_e m, theta_e
     * the unscaled angle, theta_i = freq_scale theta_e, m = ext_factor times a ramp
     * from 1 at pair corr_lo to 0 at corr_hi, 1 - clamp((d - lo) / max(hi - lo,
     * 0.001), 0, 1). */
    float ext_factor, corr_lo, corr_hi;
} dp_rope_params;

/* step_begin's answers, and step_end's request to issue a step again. */
enum { DP_STEP_EAGER = 0, DP_STEP_RECORD = 1, DP_STEP_REPLAYED = 2, DP_STEP_RETRY = 3 };
/* Recording policies: off; record a shape the second time it is seen (the
 * first, eager, run grows every scratch buffer to its size); record at once
 * (tests: exercises the abandoned-recording path). */
enum { DP_GRAPHS_OFF = 0, DP_GRAPHS_ON = 1, DP_GRAPHS_EAGER_RECORD = 2 };
typedef struct dp_graph_stats {
    uint64_t recorded;  /* steps recorded and instantiated */
    uint64_t replayed;  /* steps served by a replay */
    uint64_t abandoned; /* recordings given up (issued again eagerly) */
    uint64_t evicted;   /* recorded steps dropped (cache full, or buffers changed) */
    int32_t cached;     /* recorded steps held now */
    int policy;
} dp_graph_stats;

/* Most candidates logits_topk returns per row. */
#define DP_TOPK_MAX 256
/* Most weights one matmul_shared call takes. */
#define DP_MATMUL_SHARED_MAX 4

typedef struct dp_backend_ops {
    const char *name;
    void (*destroy)(dp_backend *be);

    /* Memory for activations. */
    void *(*alloc)(dp_backend *be, size_t bytes);
    void (*free)(dp_backend *be, void *p);
    int (*upload)(dp_backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(dp_backend *be, void *dst, const void *src, size_t bytes);

    /* Weights: src is a GGUF tensor of the given type and shape (host memory). */
    int (*weight_load)(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                       const void *src, char *err, size_t errsz);
    void (*weight_free)(dp_backend *be, dp_weight *w);

    /* KV stores. */
    int (*kv_create)(dp_backend *be, const dp_kv_layout *layout, dp_kv_store **out);
    void (*kv_destroy)(dp_backend *be, dp_kv_store *kv);
    /* Bytes of one block of the layout: 0 when the backend cannot keep it
     * (a type it lacks, or a head_dim the type's blocks do not divide). */
    size_t (*kv_bytes_per_block)(dp_backend *be, const dp_kv_layout *layout);
    const dp_kv_layout *(*kv_layout)(dp_backend *be, const dp_kv_store *kv);

    /* The batch's index arrays, copied to the backend once per step. */
    int (*batch_set)(dp_backend *be, const dp_batch *b);
    /* Optional; the engine calls it before each step's work. Errors: an op
     * that fails returns (or, for void ops, the next download reports)
     * DP_EDEVICE when the device is lost for good (only a restart
     * recovers), any other code when the device survived and only that
     * work failed. recover clears such a survived failure and returns 0, or
     * returns DP_EDEVICE. NULL: a backend whose failures never linger. */
    int (*recover)(dp_backend *be);

    /* out[n, dim] = rows of the embedding table for the batch's tokens. */
    void (*embed)(dp_backend *be, const dp_weight *table, float *out, int32_t n);
    /* out[i] = x[i] / rms(x[i]) * w, per row of dim elements. */
    void (*rmsnorm)(dp_backend *be, float *out, const float *x, const dp_weight *w, int32_t n,
                    int32_t dim, float eps);
    /* y[m, rows] = x[m, cols] . W^T */
    void (*matmul)(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m);
    /* ys[i] = x . ws[i]^T for n <= DP_MATMUL_SHARED_MAX weights of the same
     * cols over one input (the Q, K and V projections; gate and up), each
     * y what matmul gives. Optional (NULL: matmul per weight): lets a
     * backend prepare the input once and run the weights together. */
    void (*matmul_shared)(dp_backend *be, float *const *ys, const float *x,
                          const dp_weight *const *ws, int32_t n, int32_t m);
    /* Rotates q[n, n_heads*head_dim] and k[n, n_kv_heads*head_dim] in place at the batch positions. */
    void (*rope)(dp_backend *be, float *q, float *k, int32_t n, int32_t n_heads,
                 int32_t n_kv_heads, int32_t head_dim, const dp_rope_params *rp);
    /* Writes k and v rows [n, n_kv_heads*head_dim] into the batch's slots. */
    void (*kv_write)(dp_backend *be, dp_kv_store *const *stores, int32_t layer, const float *k,
                     const float *v);
    /* out[n, n_heads*head_dim] = causal paged attention over each token's
     * slots 0..slot; window > 0 (a sliding-window layer): over its last
     * `window` slots only, slot - window < s <= slot (llama.cpp's standard
     * window), whose blocks alone are read. A window counts slots, which are
     * positions where nothing of the sequence was evicted (the model refuses
     * grouped stores on such layers). */
    void (*attention)(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                      const float *q, int32_t n_heads, float scale, int32_t window);
    /* x += y (n elements). */
    void (*add)(dp_backend *be, float *x, const float *y, int64_t n);
    /* y[n, cols] += b, each row (a projection's bias: b a vector weight of cols). */
    void (*add_bias)(dp_backend *be, float *y, const dp_weight *b, int32_t n, int32_t cols);
    /* out = silu(gate) * up (n elements). */
    void (*swiglu)(dp_backend *be, float *out, const float *gate, const float *up, int64_t n);
    /* out = gelu(gate) * up, GELU's tanh form (Gemma's gated FFN). */
    void (*geglu)(dp_backend *be, float *out, const float *gate, const float *up, int64_t n);
    /* x *= s (n elements; Gemma's embedding scale). */
    void (*scale)(dp_backend *be, float *x, float s, int64_t n);
    /* out[i] = x[batch.out_tokens[i]] rows of dim. */
    void (*gather_rows)(dp_backend *be, float *out, const float *x, int32_t dim);
    /* out[i] = x[batch.capture_tokens[i]] rows of dim (queries kept for scoring). */
    void (*capture_rows)(dp_backend *be, float *out, const float *x, int32_t dim);

    /* Importance scoring over slots [0, n_slots) of one sequence (table: host
     * block ids). Both write out[layer][kv_head][slot] in backend memory. */
    /* L2 norm of each key. */
    void (*kv_score_knorm)(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                           int32_t n_slots, float *out);
    /* Attention mass: q holds, per layer, n_q captured post-RoPE queries
     * (query i of layer l at q + l * q_layer_stride + i * n_heads * head_dim);
     * query i sits at slot q_slot[i] (host) and attends causally. out = the
     * attention probability each key receives, summed over the queries and
     * the query heads of its group. */
    void (*kv_score_attn)(dp_backend *be, const dp_kv_store *kv, const int32_t *table,
                          int32_t n_slots, const float *q, int64_t q_layer_stride,
                          const int32_t *q_slot, int32_t n_q, int32_t n_heads, float scale,
                          float *out);
    /* The path-aware copy: gathers each head's kept rows of K and V from src
     * into dst for n_seqs sequences at once. src and dst may be the same store
     * when the tables do not share blocks. dst may have fewer layers than
     * src (an exempt-layer view, kv_view): layers [0, dst's) are copied and
     * keep is [dst's n_layers][n_kv_heads][n_keep]. */
    int (*kv_compact)(dp_backend *be, const dp_kv_store *src, dp_kv_store *dst,
                      const dp_compact_seq *seqs, int32_t n_seqs);
    /* Copies one block (K and V of every layer, kv_bytes_per_block bytes)
     * between the store and host memory: the host tier's spill and restore.
     * Both may return before the copy is done (CUDA: queued on the stream):
     * they are ordered with each other and with every later op, so a
     * kv_block_write from a buffer that a kv_block_read filled is safe, and
     * the store block may be rewritten right away. Host code must not read
     * such a buffer, nor write one still being read, until a download (which
     * waits for the stream) or host_free. */
    int (*kv_block_read)(dp_backend *be, const dp_kv_store *kv, int32_t block, void *host);
    int (*kv_block_write)(dp_backend *be, dp_kv_store *kv, int32_t block, const void *host);

    /* ---- Optional ops: NULL where a backend has no such thing. ---- */

    /* A second store over base's memory, with its own layout: block b of
     * the view is block b of base, read as layout->block_tokens tokens of
     * layout->type (one arena whose blocks either path may hold: the decode
     * path's quantized blocks fit more tokens in a prefill block's bytes).
     * The layout must have base's geometry and block count, and a block
     * must fit in base's bytes per block. Or, folded (the decode path's
     * exempt layers): n_layers N below base's and n_blocks = base's x G with
     * G = base's n_layers / N; layer j's block b + s * (base's n_blocks)
     * is then base's layer j * G + s, block b: one base block holds G
     * blocks of the view's N layers. kv_destroy of a view frees only the
     * view; base must outlive it. */
    int (*kv_view)(dp_backend *be, dp_kv_store *base, const dp_kv_layout *layout,
                   dp_kv_store **out);
    /* Stores one step may address (batch seq_store / x_seq_store below
     * this); 0: DP_KV_MAX_STORES. */
    int32_t kv_max_stores;
    /* The decode path's "auto" type is q8_0 here (measured on this
     * backend); false: the prefill path's type. */
    bool kv_quant_default;

    /* Device memory: free and total bytes of the device (the start-up memory
     * plan sizes the KV pools from them when kv_memory is 0 = auto). NULL on
     * the CPU backend: the plan then falls back to a fixed size. */
    int (*mem_info)(dp_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* Bytes this backend holds for weights (weight_load) and for buffers
     * (alloc: the model's activations), for the start-up log. */
    void (*mem_usage)(dp_backend *be, size_t *weight_bytes, size_t *alloc_bytes);
    /* Host memory the backend copies to and from fastest (CUDA: pinned, so
     * kv_block_read/write run asynchronously on the stream). NULL: plain
     * malloc/free. host_free waits for queued copies that touch p. */
    void *(*host_alloc)(dp_backend *be, size_t bytes);
    void (*host_free)(dp_backend *be, void *p);
    /* Sampling inputs without downloading the vocabulary: for each of n rows
     * of logits (backend memory, [n, vocab]), the k (1..DP_TOPK_MAX, <= vocab)
     * largest logits in descending order (equal logits: lower id first; NaN
     * ranks as -inf and is reported as -inf) with their ids, the row's max m
     * (NaN skipped, -0 as +0; -inf when nothing else) and row_sum, the sum of
     * the row's weights at temperature[r] (kernels/topk.h: fixed-point
     * weights of (logit - m) / T, summed exactly, reported in units of the
     * max's weight; 0 when m is not finite). A sum rather than a log-sum-exp:
     * it is exact and the same on every backend, so the sampler's decisions
     * from it do not depend on where it was computed. temperature: host, n
     * entries; a value <= 0 (a greedy row) counts as 1. mask_rows (host, n
     * entries, or NULL): rows r with mask_rows[r] != 0 first get the logits of
     * the n_mask ids mask_ids set to -inf, in place (ignore_eos: a later
     * download sees the masked row). Results go to host arrays: ids and vals
     * [n * k], row_max and row_sum [n]. Waits for the stream like download,
     * and reports an earlier failed op the same way. */
    int (*logits_topk)(dp_backend *be, float *logits, int32_t n, int32_t vocab, int32_t k,
                       const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                       const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                       float *row_sum);
    /* Recording and replay of whole steps (CUDA graphs): the launches of a
     * decode step cost more than its small GEMMs at low batch, so a backend
     * may record a step's ops once and replay them for later steps of the
     * same shape. A step goes: batch_set, then step_begin, then the step's
     * ops (unless step_begin returned DP_STEP_REPLAYED: then the backend has
     * queued the recorded step, reading this step's batch arrays, and the
     * caller issues nothing), then step_end. step_end returns DP_STEP_RETRY
     * when a recording had to be abandoned (nothing ran): the caller issues
     * the ops again, from step_begin. owner identifies the caller's buffers
     * (the model), stores the KV stores of the step; a recorded step is only
     * replayed for the same owner and stores. NULL: every step is issued. */
    int (*step_begin)(dp_backend *be, const void *owner, dp_kv_store *const *stores);
    /* The size to pad a decode step of n tokens (one per sequence, nothing
     * captured) to, so that few recordings cover every batch size; n when
     * it is not padded. Padding tokens follow the real ones, one padding
     * sequence each, with slot -1: kv_write skips them and their attention
     * rows are zeros; their output rows come after the real ones. Only a
     * backend with step_pad is ever sent a slot of -1. */
    int32_t (*step_pad)(dp_backend *be, int32_t n_tokens);
    int (*step_end)(dp_backend *be);
    /* Sets the recording policy (DP_GRAPHS_*; a negative value leaves it) and
     * reads the counters (st may be NULL). */
    void (*step_graphs)(dp_backend *be, int policy, dp_graph_stats *st);
    /* The CPU backend's kernels: the instruction-set level they were chosen
     * for ("avx512", "avx2", "baseline"), and whether matmuls quantize the
     * activations to int8 per 32 values (the default, as llama.cpp does) or
     * run in f32 on the exactly dequantized weights (exact = true: the
     * reference path). */
    const char *(*kernel_level)(dp_backend *be);
    void (*set_exact)(dp_backend *be, bool exact);
    bool (*get_exact)(dp_backend *be);
} dp_backend_ops;

struct dp_backend {
    const dp_backend_ops *ops;
    int n_threads;
};

/* Creates a backend: "cpu", "cuda", "cuda:N" or "auto" (CUDA when a working
 * device exists, else the CPU with a log line). n_threads applies to the CPU
 * backend (0: all cores). */
int backend_create(dp_backend **out, const char *device, int n_threads, char *err, size_t errsz);
void backend_destroy(dp_backend *be);

int backend_cpu_create(dp_backend **out, int n_threads, char *err, size_t errsz);
#ifdef DP_HAVE_CUDA
int backend_cuda_create(dp_backend **out, int device_index, char *err, size_t errsz);
#endif

#endif
