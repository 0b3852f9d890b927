/* cuda_attention_plan.h: host-side shape of the attention launches: the
 * query tiles batch_set builds and the split-K plan of each call. */
#ifndef DP_KERNELS_CUDA_ATTENTION_PLAN_H
#define DP_KERNELS_CUDA_ATTENTION_PLAN_H

#include "cuda_internal.h"

#define ROWS CUDA_ATT_ROWS
#define KT CUDA_ATT_KT
#define NT CUDA_ATT_THREADS
#define N_WARPS (NT / 32)
/* No split shorter than this many keys: below it the merge costs more than
 * the parallelism brings. */
#define MIN_SPLIT 256
#define MAX_SPLITS 64
/* Cap on the partial buffer (floats): splits shrink before it grows past. */
#define MAX_PART_FLOATS ((size_t)64 << 20)
#define LOADS_IN_FLIGHT 4

/* Query tiles of a batch (host side, from batch_set): runs of consecutive
 * tokens of one sequence, cut at CUDA_QTILE. tile_start gets n_tiles + 1
 * entries (room for n + 1); returns n_tiles and the longest tile. */
static inline int32_t cuda_att_tiles(const int32_t *seq, int32_t n, int32_t *tile_start,
                                     int32_t *max_len)
{
    int32_t n_tiles = 0, len = 0, longest = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i == 0 || seq[i] != seq[i - 1] || len == CUDA_QTILE) {
            tile_start[n_tiles++] = i;
            len = 0;
        }
        len++;
        if (len > longest)
            longest = len;
    }
    tile_start[n_tiles] = n;
    *max_len = longest;
    return n_tiles;
}

/* The launch shape of one attention call. */
typedef struct cuda_att_plan {
    int32_t n_rchunks;  /* row chunks per (tile, KV head): grid.y = n_kv * n_rchunks */
    int32_t splits;     /* grid.z */
    int32_t split_len;  /* keys per split, a multiple of KT */
} cuda_att_plan;

/* Split only when the grid leaves SMs idle and the context is long; about
 * four resident blocks per SM is what the shared memory allows. */
static inline cuda_att_plan cuda_att_make_plan(int32_t n_tiles, int32_t max_tile_len,
                                               int32_t max_slots, int32_t n_tokens,
                                               int32_t n_heads, int32_t n_kv, int32_t hd,
                                               int32_t sm_count)
{
    cuda_att_plan p;
    const int32_t group = n_heads / n_kv;
    p.n_rchunks = (max_tile_len * group + ROWS - 1) / ROWS;
    const int64_t blocks = (int64_t)n_tiles * n_kv * p.n_rchunks;
    const size_t n_rows = (size_t)n_tokens * (size_t)n_heads;
    int64_t splits = 1;
    const int64_t target = 4 * (int64_t)sm_count;
    if (blocks < target && max_slots >= 2 * MIN_SPLIT) {
        splits = (target + blocks - 1) / blocks;
        if (splits > max_slots / MIN_SPLIT)
            splits = max_slots / MIN_SPLIT;
        if (splits > MAX_SPLITS)
            splits = MAX_SPLITS;
        while (splits > 1 && (size_t)splits * n_rows * (size_t)(hd + 2) > MAX_PART_FLOATS)
            splits--;
    }
    int32_t split_len = (int32_t)((max_slots + splits - 1) / splits);
    split_len = (split_len + KT - 1) / KT * KT;
    p.split_len = split_len;
    p.splits = (max_slots + split_len - 1) / split_len;
    return p;
}

/* Floats of the split-K partial buffer: acc [splits][n_rows][hd], then
 * (m, l) [splits][n_rows]. */
static inline size_t cuda_att_part_floats(const cuda_att_plan *p, int32_t n_tokens,
                                          int32_t n_heads, int32_t hd)
{
    return (size_t)p->splits * (size_t)n_tokens * (size_t)n_heads * (size_t)(hd + 2);
}

#endif
