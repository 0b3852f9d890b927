/* swap.h: the decode pool's swap space. A preempted decode-path sequence's
 * compact cache is copied to host memory and its blocks freed; when it is
 * admitted again the copy goes back into new blocks, bit for bit. Recomputing
 * it instead would not give the same sequence: its kept set would be chosen
 * again over its own output, and the K/V of the tokens it generated were
 * computed over the compressed cache, not the whole one. */
#ifndef DP_KVCACHE_SWAP_H
#define DP_KVCACHE_SWAP_H

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
    size_t cap_bytes;      /* host memory the swapped copies may take */
    size_t used_bytes;
    int64_t outs, ins;     /* sequences swapped out / back in */
} dp_kv_swap;

/* One sequence's copy (zero: none). */
typedef struct dp_swapped {
    void *buf;
    int32_t n_blocks;
} dp_swapped;

int kv_swap_init(dp_kv_swap *s, dp_backend *be, dp_kv_store *store, dp_kv_pool *pool,
                 size_t cap_bytes);
void kv_swap_destroy(dp_kv_swap *s);
/* Copies t's blocks to host memory and releases them (t is left empty).
 * DP_ENOSPC when the swap space is full, DP_ENOMEM or a backend error: then
 * nothing changed. */
int kv_swap_out(dp_kv_swap *s, dp_block_table *t, dp_swapped *out);
/* Fills the empty table t with new blocks covering n_slots (at least the
 * saved blocks), copies the saved blocks back and frees the copy. DP_ENOSPC
 * when the pool is short: nothing changed. */
int kv_swap_in(dp_kv_swap *s, dp_swapped *sw, dp_block_table *t, int64_t n_slots);
/* Frees a copy that will not be restored (the sequence ended). */
void kv_swap_drop(dp_kv_swap *s, dp_swapped *sw);

#endif
