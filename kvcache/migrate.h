/* migrate.h: the migration itself (prefill -> decode, or a decode-path
 * recompression): score each sequence's cache, choose its kept slots, and
 * gather them into its destination table in one backend call. The KV manager
 * runs it for the daemon and tools/dp-eval runs the same function, so the
 * quality the evaluator measures is that of the code that serves. */
#ifndef DP_KVCACHE_MIGRATE_H
#define DP_KVCACHE_MIGRATE_H

#include <stddef.h>
#include <stdint.h>

#include "compress.h"
#include "kernels/backend.h"

/* One sequence of a migration. */
typedef struct dp_kv_move {
    const dp_compress_opts *co;  /* its scorer, keep ratio, sinks, window */
    const int32_t *src;          /* source table (block ids in the source store) */
    int32_t n_src_blocks;
    int32_t n_slots;             /* filled slots of the source */
    const int32_t *dst;          /* destination table, covering n_keep - n_ref slots */
    int32_t n_dst_blocks;
    int32_t n_keep;              /* slots kept (<= n_slots) */
    /* SnapKV: the post-RoPE queries of the last n_q slots (backend memory,
     * layer l's at q + l * q_stride, as llama_captured_queries lays them out).
     * Without them SnapKV scores by key norm (and says so in scorer). */
    const float *q;
    int64_t q_stride;
    int32_t n_q;
    dp_scorer scorer;            /* out: the scorer that ran */
    /* Leading slots the destination holds already, by reference: they are
     * selected as usual and not copied (a prefix kept whole,
     * compress_front; any leading run when every slot is kept; or a kept
     * share's slots, with keep_given). */
    int32_t n_ref;
    /* SnapKV on the decode path (a recompression): the attention its recent
     * decode queries gave each slot, used instead of q where it holds any. */
    const dp_attn_acc *attn;
    /* Where not NULL: the kept lists to use ([rows][n_keep]) instead of a
     * selection: a kept share's (kvcache/dprefix.h), the selection of the
     * same tokens by the same settings. May be an earlier move's keep_out. */
    const int32_t *keep_given;
    /* Where not NULL: receives the move's kept lists ([rows][n_keep]),
     * before any later move of the same call reads them. */
    int32_t *keep_out;
    /* Exempt layers (kv_migrator_set_exempt): where not NULL, the table in
     * the exempt store (its block ids, covering n_slots) that receives the
     * exempt layers' every slot, in order. */
    const int32_t *xdst;
    int32_t n_xdst_blocks;
} dp_kv_move;

/* Scratch kept between calls (the keep lists). */
typedef struct dp_kv_migrator {
    dp_compressor comp;
    dp_backend *be;
    int32_t *keep;
    size_t keep_cap;
    dp_kv_store *xstore;   /* the exempt layers' store (NULL: none) */
    int32_t *xkeep;        /* their keep lists (every slot) */
    size_t xkeep_cap;
} dp_kv_migrator;

int kv_migrator_init(dp_kv_migrator *m, dp_backend *be, int32_t n_layers, int32_t n_kv_heads,
                     int32_t n_heads, int32_t head_dim);
void kv_migrator_destroy(dp_kv_migrator *m);

/* Moves with an xdst also copy their exempt layers whole into xstore (a
 * store of the first layers only: backend.h kv_view, folded). */
static inline void kv_migrator_set_exempt(dp_kv_migrator *m, dp_kv_store *xstore)
{
    m->xstore = xstore;
}

/* The keep-list scratch, grown to n entries (NULL without memory). The
 * manager's reply write-back builds its plan here too. */
int32_t *kv_migrator_keep(dp_kv_migrator *m, size_t n);

/* Moves n sequences from src to dst in one kv_compact call, selecting in
 * order (a move's keep_given may be an earlier move's keep_out), and the
 * exempt layers of those with an xdst in a second. On an error no source
 * was changed (the destinations may have been written: free them). */
int kv_migrate(dp_kv_migrator *m, const dp_kv_store *src, dp_kv_store *dst, dp_kv_move *mv,
               int32_t n);

#endif
