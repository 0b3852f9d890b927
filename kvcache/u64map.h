/* u64map.h: an open-addressing map from nonzero 64-bit hashes to int32
 * values (linear probing, backward-shift deletion, so no tombstones). Used by
 * the prefix cache and the host tier. */
#ifndef DP_KVCACHE_U64MAP_H
#define DP_KVCACHE_U64MAP_H

#include <stdint.h>

typedef struct dp_u64map {
    uint64_t *keys;  /* 0 = empty */
    int32_t *vals;
    uint32_t mask;   /* capacity - 1 */
    uint32_t n;
} dp_u64map;

/* Capacity for at least max_items at a load under one half. */
int u64map_init(dp_u64map *m, uint32_t max_items);
void u64map_destroy(dp_u64map *m);
/* Value for key, or -1. */
int32_t u64map_get(const dp_u64map *m, uint64_t key);
/* Inserts or overwrites; the caller keeps n under the capacity it asked for. */
void u64map_put(dp_u64map *m, uint64_t key, int32_t val);
void u64map_del(dp_u64map *m, uint64_t key);

#endif
