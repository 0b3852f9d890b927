/* swap.h: the decode pool's swap space. A preempted decode-path sequence's
 * compact cache is copied to host memory and its blocks freed; when it is
 * admitted again the copy goes back into new blocks, bit for bit. Recomputing
 * it instead would not give the same sequence: its kept set would be chosen
 * again over its own output, and the K/V of the tokens it generated were
 * computed over the compressed cache, not the whole one. */
#ifndef DP_KVCACHE_SWAP_H
#define DP_KVCACHE_SWAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "pool.h"

typedef struct dp_kv_swap {
    dp_backend *be;
    dp_kv_store *store;    /* the decode store */
    dp_kv_pool *pool;      /* the decode pool */
    int32_t block_tokens;  /* tokens per block of the decode store */
    size_t block_bytes;
    /* The swap space: one arena of whole block copies, allocated once at
     * start-up (pinned where the backend has it, so that the copies are DMA
     * on its stream), its slots handed out through a pool of their own. */
    size_t cap_bytes;      /* slots.n_blocks * block_bytes */
    uint8_t *arena;
    bool pinned;           /* from the backend's host_alloc (else malloc) */
    dp_kv_pool slots;
    size_t used_bytes;
    int64_t outs, ins;     /* sequences swapped out / back in */
} dp_kv_swap;

/* One sequence's copy (slots NULL: none). */
typedef struct dp_swapped {
    int32_t *slots;        /* [n_blocks] arena slots, in table order */
    int32_t n_blocks;
} dp_swapped;

/* A swap space of cap_bytes (whole blocks of the store's; DP_EINVAL when
 * that is not one block: no swap space). DP_ENOMEM when the arena cannot be
 * allocated. */
int kv_swap_init(dp_kv_swap *s, dp_backend *be, dp_kv_store *store, dp_kv_pool *pool,
                 size_t cap_bytes);
void kv_swap_destroy(dp_kv_swap *s);
/* Copies t's blocks into free slots and releases them (t is left empty).
 * DP_ENOSPC when the swap space has too few free slots, DP_ENOMEM or a
 * backend error: then nothing changed. */
int kv_swap_out(dp_kv_swap *s, dp_block_table *t, dp_swapped *out);
/* Fills the empty table t with new blocks covering n_slots (at least the
 * saved blocks), copies the saved blocks back and frees the copy's slots.
 * DP_ENOSPC when the pool is short: nothing changed. */
int kv_swap_in(dp_kv_swap *s, dp_swapped *sw, dp_block_table *t, int64_t n_slots);
/* Frees a copy that will not be restored (the sequence ended). */
void kv_swap_drop(dp_kv_swap *s, dp_swapped *sw);
/* Whether n more blocks fit beside what the swap space holds now. */
static inline bool kv_swap_has_room(const dp_kv_swap *s, int32_t n)
{
    return s->arena && kv_pool_n_free(&s->slots) >= n;
}

#endif
