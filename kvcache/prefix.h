/* prefix.h: the prefix cache of the prefill pool. Every full prefill block is
 * named by a hash chained over the tokens from the start of its sequence,
 * keyed with a secret drawn at start-up (SipHash), so that no client can
 * craft a prompt whose name collides with another's; a hit is also checked
 * against the tokens the block holds before it is served;
 * a freed block keeps its name while it sits in the free list, so a later
 * request with the same prefix (the next turn of a conversation) takes it
 * back instead of recomputing. A block about to be reused for new contents
 * spills to the host tier first, when there is one. */
#ifndef DP_KVCACHE_PREFIX_H
#define DP_KVCACHE_PREFIX_H

#include <stdint.h>

#include "common/hash.h"
#include "host.h"
#include "kernels/backend.h"
#include "pool.h"
#include "u64map.h"

typedef struct dp_prefix_cache {
    dp_kv_pool *pool;
    dp_backend *be;
    dp_kv_store *store;
    dp_host_tier *host;     /* optional */
    uint64_t *block_hash;   /* [n_blocks], 0 = unnamed */
    int32_t *block_tokens;  /* [n_blocks][block_tokens]: what a named block holds */
    dp_u64map map;          /* hash -> block */
    dp_hash_key key;        /* the chain's secret */
    uint8_t *hbuf;          /* chain input scratch: prev + one block of tokens */
    int64_t refused;        /* name matches whose tokens did not: never served */
    int64_t hit_blocks;     /* taken back from the pool */
    int64_t host_blocks;    /* restored from the host tier */
    int64_t spilled_blocks; /* copied to the host tier */
} dp_prefix_cache;

/* Hooks itself into pool (pool->on_reuse). host may be NULL; when given, its
 * entries must have a tag of block_tokens ints (host_tier_init). */
int prefix_init(dp_prefix_cache *pc, dp_kv_pool *pool, dp_backend *be, dp_kv_store *store,
                dp_host_tier *host);
void prefix_destroy(dp_prefix_cache *pc);

/* The name of a block holding tokens[0..n) (n <= block_tokens) after a block
 * named prev (0 for the first block). */
uint64_t prefix_chain(dp_prefix_cache *pc, uint64_t prev, const int32_t *tokens, int32_t n);

/* Names a full block holding tokens[0..block_tokens) (no-op when the name is
 * already taken). */
void prefix_register(dp_prefix_cache *pc, int32_t block, uint64_t hash, const int32_t *tokens);

/* Appends to t (which must be empty) the longest run of cached blocks that
 * holds a prefix of tokens[0..max_tokens) (names and tokens both equal),
 * referencing each; blocks found
 * only in the host tier are restored into newly allocated blocks. Returns
 * the tokens covered; *from_host counts restored blocks, *last_hash the
 * chain value of the last matched block. */
int32_t prefix_match(dp_prefix_cache *pc, const int32_t *tokens, int32_t max_tokens,
                     dp_block_table *t, int32_t *from_host, uint64_t *last_hash);

#endif
