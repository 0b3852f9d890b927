/* gshare.h: sealed groups of a grouped decode type (kivi4) shared between
 * the sequences that seal the same rows. A group is quantized from rows of
 * the arena's blocks (kvcache/manager.c seal_groups); where every block it
 * reads is a named prefill block (the prefix cache's name fixes the K/V it
 * holds), the group's bytes follow from those names and the group's offset
 * in them. So requests that start alike (a shared system prompt, n > 1)
 * hold one copy of the groups of their common prefix, as q8_0 shares one
 * copy of a prefix (dprefix.h), instead of one each.
 *
 * The registry holds no reference: a group lives while a table holds it,
 * and a hit is served only while its block is still the allocation it was
 * registered at (the pool's generation) and still in use. Names are keyed
 * with a secret drawn at start-up (SipHash), as the prefix cache's. */
#ifndef DP_KVCACHE_GSHARE_H
#define DP_KVCACHE_GSHARE_H

#include <stdint.h>

#include "common/hash.h"
#include "pool.h"
#include "u64map.h"

typedef struct dp_gshare {
    dp_kv_pool *pool;  /* the arena's (groups and their source blocks alike) */
    dp_u64map map;     /* group name -> block */
    uint64_t *name;    /* [n_blocks] the name a block was registered under (0: none) */
    uint32_t *gen;     /* [n_blocks] ... at this allocation of it */
    dp_hash_key key;
    int64_t hits;      /* groups taken from another sequence */
} dp_gshare;

int gshare_init(dp_gshare *s, dp_kv_pool *pool);
void gshare_destroy(dp_gshare *s);

/* The name of a group of g rows from row roff of the blocks named
 * src_names[0..n), or 0 where one of them is unnamed (its rows are a
 * sequence's own: nothing to share). */
uint64_t gshare_name(const dp_gshare *s, const uint64_t *src_names, int32_t n, int32_t roff,
                     int32_t g);
/* The live block holding the group named `name`, or -1. */
int32_t gshare_find(const dp_gshare *s, uint64_t name);
/* Names block (just sealed) as the group `name`. */
void gshare_add(dp_gshare *s, uint64_t name, int32_t block);

#endif
