/* dprefix.h: prefixes shared in the decode pool's own blocks. A prefix kept
 * whole at the migration (a chat's system prompt, dp_compress_opts.prefix)
 * is the same rows for every sequence that starts with it. Where the decode
 * path can hold the prefill path's blocks (one arena, one type) it keeps
 * them by reference; where it cannot (a quantized decode type, or pools of
 * different block sizes) the first sequence's copy of the prefix, in whole
 * decode blocks, is named here, and later sequences with the same first
 * tokens take those blocks instead of copying the prefix again.
 *
 * An entry lives while a sequence holds it (users > 0): the sequences whose
 * tables hold its blocks, and those admitted on the promise of taking them
 * at their migration. It holds a pool reference to each of its blocks of its
 * own, so they stay intact until the last user leaves. Names are keyed with a secret drawn at start-up (SipHash) and a hit
 * is checked against the entry's tokens, so no prompt can make another
 * request read rows that are not its own. */
#ifndef DP_KVCACHE_DPREFIX_H
#define DP_KVCACHE_DPREFIX_H

#include <stdint.h>

#include "common/hash.h"
#include "pool.h"
#include "u64map.h"

typedef struct dp_dprefix_entry {
    uint64_t name;       /* 0: a free entry */
    int32_t n_tokens;    /* the prefix's length: a whole number of decode blocks */
    int32_t *tokens;     /* [n_tokens] */
    int32_t *blocks;     /* [n_tokens / block_tokens] decode-pool block ids */
    int32_t users;
} dp_dprefix_entry;

typedef struct dp_dprefix {
    dp_kv_pool *pool;     /* the decode pool */
    int32_t block_tokens; /* of the decode pool */
    int32_t max_entries;
    dp_dprefix_entry *e;  /* [max_entries] */
    dp_u64map map;        /* name -> entry index */
    dp_hash_key key;
    int32_t live_blocks;  /* blocks of the entries now */
} dp_dprefix;

/* At most max_entries prefixes at once (the decode pool's block count
 * bounds it: each holds a block at least). */
int dprefix_init(dp_dprefix *d, dp_kv_pool *pool, int32_t block_tokens, int32_t max_entries);
void dprefix_destroy(dp_dprefix *d);

/* The entry holding exactly tokens[0..n) (n a multiple of block_tokens), or
 * -1. */
int32_t dprefix_find(dp_dprefix *d, const int32_t *tokens, int32_t n);
/* Names a new entry for tokens[0..n) held in blocks[0..n / block_tokens),
 * with one user. -1 (nothing named) when the name is taken, there is no
 * room or no memory: sharing is best effort. */
int32_t dprefix_add(dp_dprefix *d, const int32_t *tokens, int32_t n, const int32_t *blocks);
/* One more user of entry id. */
void dprefix_join(dp_dprefix *d, int32_t id);
/* One user fewer; the last one removes the entry and its references (a
 * block no table holds goes back to the pool). */
void dprefix_leave(dp_dprefix *d, int32_t id);
static inline const int32_t *dprefix_blocks(const dp_dprefix *d, int32_t id)
{
    return d->e[id].blocks;
}
static inline int32_t dprefix_tokens(const dp_dprefix *d, int32_t id)
{
    return d->e[id].n_tokens;
}

#endif
