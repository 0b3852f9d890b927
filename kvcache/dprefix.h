/* dprefix.h: prefixes shared in the decode pool's own blocks. A prefix kept
 * whole at the migration (a chat's system prompt, dp_compress_opts.prefix)
 * is the same rows for every sequence that starts with it. Where the decode
 * path can hold the prefill path's blocks (one arena, one type) it keeps
 * them by reference; where it cannot (a quantized decode type, or pools of
 * different block sizes) the first sequence's copy of the prefix, in whole
 * decode blocks, is named here, and later sequences with the same first
 * tokens take those blocks instead of copying the prefix again.
 *
 * A second kind of entry names a whole compact cache (a "kept" share): the
 * first whole decode blocks of a migrated prompt's compaction, keyed by the
 * prompt's tokens and the selection's settings, with its kept lists. A
 * sequence with the same prompt (n > 1, identical requests) keeps the same
 * slots (a deterministic selection of the same K/V) without selecting again:
 * it takes those blocks and copies only the rest, its last partial block,
 * where the copies diverge.
 *
 * An entry lives while a sequence holds it (users > 0): the sequences whose
 * tables hold its blocks, and those admitted on the promise of taking them
 * at their migration. It holds a pool reference to each of its blocks of its
 * own, so they stay intact until the last user leaves. Names are keyed with a secret drawn at start-up (SipHash) and a hit
 * is checked against the entry's tokens, so no prompt can make another
 * request read rows that are not its own. */
#ifndef DP_KVCACHE_DPREFIX_H
#define DP_KVCACHE_DPREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "common/hash.h"
#include "pool.h"
#include "u64map.h"

/* A sequence's hold on an entry (a prefix copy or a kept share): one
 * handle type for both, distinct from an entry's id so that the two are
 * never mixed. The zero handle holds nothing, so a zeroed sequence holds
 * no share. */
typedef struct dp_share {
    int32_t h; /* the entry's id + 1; 0: none */
} dp_share;
static inline dp_share share_none(void) { return (dp_share){0}; }
static inline dp_share share_of(int32_t id) { return (dp_share){id + 1}; }
static inline bool share_held(dp_share s) { return s.h != 0; }
static inline int32_t share_id(dp_share s) { return s.h - 1; }
static inline bool share_eq(dp_share a, dp_share b) { return a.h == b.h; }

typedef struct dp_dprefix_entry {
    uint64_t name;       /* 0: a free entry */
    uint64_t tag;        /* 0: a prefix kept whole; else a kept share's selection settings */
    int32_t n_tokens;    /* the key's length (a prefix: a whole number of decode blocks) */
    int32_t n_slots;     /* slots its blocks hold (a prefix: n_tokens) */
    int32_t *tokens;     /* [n_tokens] */
    int32_t *blocks;     /* [n_slots / block_tokens] decode-pool block ids */
    int32_t *keep;       /* a kept share: its compaction's kept lists [rows][cols] */
    int32_t cols;        /* ... of its n_keep slots (n_slots of them in blocks) */
    int32_t scorer;      /* ... and the scorer that chose them (dp_scorer) */
    int32_t uncounted;   /* leading blocks live_blocks does not count (held elsewhere) */
    int32_t users;
    int32_t parked;      /* of users, parked turns (kvcache/manager.h kv_mgr_park) */
} dp_dprefix_entry;

typedef struct dp_dprefix {
    dp_kv_pool *pool;     /* the decode pool */
    int32_t block_tokens; /* of the decode pool */
    int32_t max_entries;
    dp_dprefix_entry *e;  /* [max_entries] */
    dp_u64map map;        /* name -> entry index */
    dp_hash_key key;
    int32_t live_blocks;  /* blocks of the entries now, each once */
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
/* The kept share named tokens[0..n) and tag, or -1. */
int32_t dprefix_find_kept(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag);
/* Names a kept share of tokens[0..n) under tag (nonzero): the first n_slots
 * (a whole number of blocks, fewer than cols) of a compaction to cols slots
 * in blocks[], of which the first `uncounted` are counted elsewhere (a
 * prefix's share, or prefill blocks held by reference), with one user. Its
 * kept lists ([rows][cols], dprefix_keep) and scorer are the caller's to
 * fill before anyone reads them. -1 as for dprefix_add. */
int32_t dprefix_add_kept(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag,
                         const int32_t *blocks, int32_t n_slots, int32_t uncounted, int32_t rows,
                         int32_t cols);
static inline int32_t *dprefix_keep(const dp_dprefix *d, int32_t id) { return d->e[id].keep; }
/* One more user of entry id. */
void dprefix_join(dp_dprefix *d, int32_t id);
/* One user fewer; the last one removes the entry and its references (a
 * block no table holds goes back to the pool). */
void dprefix_leave(dp_dprefix *d, int32_t id);
static inline const int32_t *dprefix_blocks(const dp_dprefix *d, int32_t id)
{
    return d->e[id].blocks;
}
/* One of entry id's users is parked (delta 1) or no longer (-1). */
static inline void dprefix_park(dp_dprefix *d, int32_t id, int32_t delta) { d->e[id].parked += delta; }
/* Blocks of the entries whose users are all parked turns (each once). */
int32_t dprefix_parked_blocks(const dp_dprefix *d);
/* Slots entry id's blocks hold. */
static inline int32_t dprefix_slots(const dp_dprefix *d, int32_t id)
{
    return d->e[id].n_slots;
}

#endif
