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

#endif
