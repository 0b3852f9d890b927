/* host.h: the host tier: a fixed arena of KV block copies in host memory,
 * keyed by prefix hash, evicted least recently used first. Prefill blocks
 * spill here when the device pool reuses them, and a later turn of the same
 * conversation restores them instead of recomputing. */
#ifndef DP_KVCACHE_HOST_H
#define DP_KVCACHE_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "u64map.h"

/* Where the arena comes from: a GPU backend hands out pinned memory, so that
 * its block copies to and from the arena are asynchronous DMA. The free must
 * wait for copies still queued on the arena. */
typedef struct dp_host_alloc {
    void *(*alloc)(void *ud, size_t bytes);
    void (*free)(void *ud, void *p);
    void *ud;
} dp_host_alloc;

typedef struct dp_host_tier {
    size_t block_bytes;
    size_t tag_bytes;     /* per entry, host-side only (host_tier_tag) */
    uint8_t *tags;
    int32_t cap;          /* entries */
    uint8_t *arena;
    dp_host_alloc alloc;  /* arena's allocator; alloc.free NULL: malloc'd */
    uint64_t *hash;       /* per entry, 0 = empty */
    int32_t *prev, *next; /* LRU links over used entries */
    int32_t head, tail;   /* least / most recently used */
    int32_t n_used;
    dp_u64map map;
    int64_t puts, hits, evictions;
} dp_host_tier;

/* capacity_bytes / block_bytes entries (at least one). The arena comes from
 * a (NULL: malloc; when a->alloc fails, malloc too, with a warning).
 *
 * The arena is filled and drained by a backend's kv_block_read/write, which
 * may still be running when they return (queued on a stream); this module
 * never touches entry bytes itself, and callers must not either: an entry is
 * only ever passed back to kv_block_write, which the backend orders after
 * the copy that filled it. */
int host_tier_init(dp_host_tier *h, size_t capacity_bytes, size_t block_bytes, size_t tag_bytes,
                   const dp_host_alloc *a);
void host_tier_destroy(dp_host_tier *h);
/* A buffer of block_bytes to fill for hash (the least recently used entry is
 * evicted when full); NULL when hash is already stored. */
void *host_tier_put(dp_host_tier *h, uint64_t hash);
/* The stored copy for hash (now most recently used), or NULL. */
const void *host_tier_get(dp_host_tier *h, uint64_t hash);
/* The same without touching the LRU order or the counters. */
const void *host_tier_find(const dp_host_tier *h, uint64_t hash);
/* tag_bytes of ordinary host memory that belong to an entry (what the owner
 * wants to know about its contents; the prefix cache keeps its tokens). */
void *host_tier_tag(const dp_host_tier *h, const void *entry);

#endif
