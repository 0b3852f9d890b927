/* pool.h: a KV block pool's bookkeeping (the memory itself is a backend KV
 * store): free blocks in LRU order, reference counts, and per-sequence block
 * tables. Freed blocks go to the tail so that recently used ones stay intact
 * longest (a later prefix cache can revive them). A free block that someone
 * expects to take back soon (the prompt of a conversation still decoding its
 * reply) can be protected: it waits in a second list that is reused only when
 * the first is empty. */
#ifndef DP_KVCACHE_POOL_H
#define DP_KVCACHE_POOL_H

#include <stdint.h>
#include <stdbool.h>

typedef struct dp_kv_pool {
    int32_t n_blocks;
    int32_t block_tokens;
    int32_t n_free;
    uint32_t *refcnt;   /* [n_blocks] 0 = free */
    int32_t *prev;      /* free-list links, -1 = none */
    int32_t *next;
    int32_t head;       /* least recently freed (allocated first) */
    int32_t tail;
    int32_t whead;      /* the protected free list: used when the other is empty */
    int32_t wtail;
    uint16_t *protect;  /* [n_blocks] protections held */
    uint8_t *in_warm;   /* [n_blocks] free and in the protected list */
    uint32_t *gen;      /* [n_blocks] bumped at every allocation */
    int32_t n_warm;     /* free blocks in the protected list (counted in n_free too) */
    /* Called when a free block is taken for new contents (the prefix cache
     * forgets, or spills, what the block held). */
    void (*on_reuse)(void *ud, int32_t block);
    void *reuse_ud;
} dp_kv_pool;

int kv_pool_init(dp_kv_pool *p, int32_t n_blocks, int32_t block_tokens);
void kv_pool_destroy(dp_kv_pool *p);

/* Takes the least recently freed block (refcount 1); DP_ENOSPC when none. */
int kv_pool_alloc(dp_kv_pool *p, int32_t *block);
void kv_pool_ref(dp_kv_pool *p, int32_t block);
/* Drops one reference; at zero the block returns to the free list's tail. */
void kv_pool_unref(dp_kv_pool *p, int32_t block);
static inline int32_t kv_pool_n_free(const dp_kv_pool *p) { return p->n_free; }
/* Protection of a block holding contents that will likely be asked for
 * again; it lasts until the block is allocated for something else (its
 * generation changes) or kv_pool_unprotect. Free blocks only move lists;
 * protection never makes a block less free. */
void kv_pool_protect(dp_kv_pool *p, int32_t block);
/* Drops a protection taken at generation gen (no-op if the block was reused
 * since); the block, if free, becomes the most recently freed. */
void kv_pool_unprotect(dp_kv_pool *p, int32_t block, uint32_t gen);
static inline uint32_t kv_pool_gen(const dp_kv_pool *p, int32_t block) { return p->gen[block]; }
static inline int32_t kv_pool_n_used(const dp_kv_pool *p) { return p->n_blocks - p->n_free; }
/* Blocks needed to hold n tokens. */
static inline int32_t kv_pool_blocks_for(const dp_kv_pool *p, int64_t n_tokens)
{
    return (int32_t)((n_tokens + p->block_tokens - 1) / p->block_tokens);
}

/* A sequence's block table on one pool. */
typedef struct dp_block_table {
    int32_t *blocks;
    int32_t n_blocks;
    int32_t cap;
} dp_block_table;

void kv_table_init(dp_block_table *t);
/* Grows the table so that it covers n_tokens slots, allocating from p.
 * On DP_ENOSPC nothing is allocated (all-or-nothing). */
int kv_table_reserve(dp_block_table *t, dp_kv_pool *p, int64_t n_tokens);
/* The same for a table whose blocks hold block_tokens tokens each (the
 * decode path's blocks in an arena shared with the prefill path: one block's
 * bytes hold more tokens of a quantized type). */
int kv_table_reserve_bt(dp_block_table *t, dp_kv_pool *p, int64_t n_tokens, int32_t block_tokens);
/* Room in an array of block ids (*ids, *cap entries) for need of them,
 * doubling; no block is taken. */
int kv_ids_room(int32_t **ids, int32_t *cap, int32_t need);
/* Room in t's array for need block ids (kv_ids_room). */
static inline int kv_table_room(dp_block_table *t, int32_t need)
{
    return kv_ids_room(&t->blocks, &t->cap, need);
}
/* Appends block (held by another table too) with one more reference. */
int kv_table_push(dp_block_table *t, dp_kv_pool *p, int32_t block);
/* Returns every block to p and empties the table. */
void kv_table_release(dp_block_table *t, dp_kv_pool *p);
void kv_table_destroy(dp_block_table *t, dp_kv_pool *p);

#endif
