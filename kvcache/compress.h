/* compress.h: importance scoring and migration plans for the decode path.
 * Scores are computed by the backend over a sequence's cache; selection
 * (sinks + recent window always kept, the rest by score) runs on the host and
 * yields, per layer and KV head, the same number of kept slots, each head with
 * its own set, so that one block table serves every head afterwards. */
#ifndef DP_KVCACHE_COMPRESS_H
#define DP_KVCACHE_COMPRESS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"

typedef enum dp_scorer {
    DP_SCORER_KNORM = 0,      /* keep the lowest key L2 norms */
    DP_SCORER_KNORM_HIGH = 1, /* keep the highest (a control) */
    DP_SCORER_SNAPKV = 2,     /* attention mass from the last prompt queries */
    DP_SCORER_RECENT = 3,     /* sinks + the most recent tokens */
    DP_SCORER_RANDOM = 4,     /* seeded random (a baseline) */
} dp_scorer;

const char *scorer_name(dp_scorer s);
/* Returns 0 and sets *out, or DP_EINVAL for an unknown name. */
int scorer_parse(const char *name, dp_scorer *out);

/* SnapKV's pooling radius: a token's score is the highest within this many
 * tokens either side. Measured with dp-eval's passkey task (docs/dualpath.md):
 * with radius 3 a key of 5-7 digit tokens lost digits to eviction (f16 at
 * keep 0.5: 1/10 keys at 512 tokens, 3/10 at 2048, where the whole cache
 * finds 10 and 8); with 6 every ratio down to 0.3 finds as many as the whole
 * cache, at KL within 0.005 nats/token of radius 3. */
#define DP_SNAPKV_POOL 6

typedef struct dp_compress_opts {
    dp_scorer scorer;
    float keep_ratio;   /* fraction of tokens kept, (0, 1] */
    int32_t sinks;      /* first tokens always kept */
    int32_t window;     /* last tokens always kept (and SnapKV's query window) */
    uint64_t seed;      /* for the random scorer */
    int32_t prefix;     /* first tokens kept whole (a chat's system prompt): the
                         * ratio applies to the rest. Requests that share them
                         * share their blocks on the decode path too (kvcache/manager.h) */
} dp_compress_opts;

/* Tokens kept whole at the start of n: the sinks, or the prefix where longer. */
static inline int32_t compress_front(const dp_compress_opts *o, int32_t n)
{
    int32_t f = o->prefix > o->sinks ? o->prefix : o->sinks;
    return f < n ? f : n;
}

/* n_keep = min(n, max(sinks + window, ceil(keep_ratio * n))); with a prefix
 * longer than the sinks, the prefix plus that of the rest (without sinks). */
int32_t compress_n_keep(const dp_compress_opts *o, int32_t n_slots);

/* A decode budget of `budget` slots (after a prefix kept whole) is
 * recompressed to this many: the budget less a quarter, so recompression runs
 * every budget/4 tokens rather than every token (which would compound the
 * loss geometrically), and never below floor (sinks + window). */
static inline int32_t compress_budget_keep(int32_t budget, int32_t floor)
{
    int32_t k = budget - budget / 4;
    return k > floor ? k : floor;
}

/* Scratch for scoring, sized for the model; grows with n_slots. */
typedef struct dp_compressor {
    dp_backend *be;
    int32_t n_layers, n_kv_heads, n_heads, head_dim;
    float *dev_scores;      /* backend memory */
    float *host_scores;
    size_t cap;             /* floats in both */
    struct score_ix *ix;    /* selection scratch */
    size_t ix_cap;
} dp_compressor;

int compressor_init(dp_compressor *c, dp_backend *be, int32_t n_layers, int32_t n_kv_heads,
                    int32_t n_heads, int32_t head_dim);
void compressor_destroy(dp_compressor *c);

/* Chooses n_keep slots of [0, n_slots) per layer and KV head and writes them,
 * ascending, to keep[n_layers][n_kv_heads][n_keep]. For SnapKV, q (backend
 * memory, layer l's queries at q + l * q_layer_stride), q_slot and n_q are
 * the captured queries (llama_captured_queries); with n_q == 0 SnapKV falls
 * back to key norms. */
int compressor_select(dp_compressor *c, const dp_compress_opts *o, const dp_kv_store *kv,
                      const int32_t *table, int32_t n_slots, const float *q,
                      int64_t q_layer_stride, const int32_t *q_slot, int32_t n_q, int32_t n_keep,
                      int32_t *keep);

/* SnapKV on the decode path: the attention that a sequence's recent decode
 * queries gave each of its slots, summed as each query is computed. A query
 * is scored once, at its own step, and never stored: 4 bytes per layer, KV
 * head and slot instead of a ring of whole queries (a query of every head of
 * every layer is 69 KiB for SmolLM2, three times a token's K and V). Summing
 * query by query gives what one kv_score_attn call over the same queries
 * would (each query attends causally to the slots before its own). */
typedef struct dp_attn_acc {
    float *sum;       /* [n_layers * n_kv_heads][cap] */
    int32_t cap;      /* slots per row */
    int32_t n_slots;  /* slots the sums cover (those after are unscored) */
    int32_t n_q;      /* queries summed since the last reset */
} dp_attn_acc;

static inline void attn_acc_init(dp_attn_acc *a) { *a = (dp_attn_acc){0}; }
void attn_acc_destroy(dp_attn_acc *a);
/* The slots were rearranged (a compaction, a release): the sums start over. */
static inline void attn_acc_reset(dp_attn_acc *a) { a->n_slots = a->n_q = 0; }

/* Adds the attention of one query (backend memory, layer l's at
 * q + l * q_layer_stride, all heads) sitting at slot q_slot, over slots
 * [0, q_slot] of the sequence's cache, to a's sums. */
int compressor_accumulate(dp_compressor *c, dp_attn_acc *a, const dp_kv_store *kv,
                          const int32_t *table, const float *q, int64_t q_layer_stride,
                          int32_t q_slot);

/* compressor_select with SnapKV's scores given (a's sums, host memory)
 * instead of computed from queries; slots past a->n_slots score 0 (the
 * window keeps them). */
int compressor_select_scored(dp_compressor *c, const dp_compress_opts *o, const dp_attn_acc *a,
                             int32_t n_slots, int32_t n_keep, int32_t *keep);

#endif
