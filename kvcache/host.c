/* host.c: the host tier's arena and LRU order. On the CPU backend this is a
 * separate memory arena; a GPU backend fills and drains it by copies. */
#include "host.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int host_tier_init(dp_host_tier *h, size_t capacity_bytes, size_t block_bytes, size_t tag_bytes,
                   const dp_host_alloc *a)
{
    memset(h, 0, sizeof *h);
    if (block_bytes == 0)
        return DP_EINVAL;
    size_t cap = capacity_bytes / block_bytes;
    if (cap < 1)
        cap = 1;
    if (cap > (1u << 24))
        cap = 1u << 24;
    h->block_bytes = block_bytes;
    h->cap = (int32_t)cap;
    if (a && a->alloc) {
        h->arena = a->alloc(a->ud, cap * block_bytes);
        if (h->arena)
            h->alloc = *a;
        else
            dp_log(DP_LOG_WARN, "host tier: no pinned memory for %zu bytes; using pageable "
                   "memory (block copies will be synchronous)", cap * block_bytes);
    }
    if (!h->arena)
        h->arena = malloc(cap * block_bytes);
    h->tag_bytes = tag_bytes;
    h->tags = calloc(cap, tag_bytes ? tag_bytes : 1);
    h->hash = calloc(cap, sizeof *h->hash);
    h->prev = malloc(cap * sizeof *h->prev);
    h->next = malloc(cap * sizeof *h->next);
    if (!h->arena || !h->tags || !h->hash || !h->prev || !h->next || u64map_init(&h->map, (uint32_t)cap)) {
        host_tier_destroy(h);
        return DP_ENOMEM;
    }
    h->head = h->tail = -1;
    return 0;
}

void host_tier_destroy(dp_host_tier *h)
{
    if (h->alloc.free)
        h->alloc.free(h->alloc.ud, h->arena);
    else
        free(h->arena);
    free(h->tags);
    free(h->hash);
    free(h->prev);
    free(h->next);
    u64map_destroy(&h->map);
    memset(h, 0, sizeof *h);
}

static void unlink_e(dp_host_tier *h, int32_t e)
{
    if (h->prev[e] >= 0)
        h->next[h->prev[e]] = h->next[e];
    else
        h->head = h->next[e];
    if (h->next[e] >= 0)
        h->prev[h->next[e]] = h->prev[e];
    else
        h->tail = h->prev[e];
}

static void push_mru(dp_host_tier *h, int32_t e)
{
    h->prev[e] = h->tail;
    h->next[e] = -1;
    if (h->tail >= 0)
        h->next[h->tail] = e;
    else
        h->head = e;
    h->tail = e;
}

void *host_tier_put(dp_host_tier *h, uint64_t hash)
{
    if (!hash || u64map_get(&h->map, hash) >= 0)
        return NULL;
    int32_t e;
    if (h->n_used < h->cap) {
        e = h->n_used++;
    } else {
        e = h->head;
        unlink_e(h, e);
        u64map_del(&h->map, h->hash[e]);
        h->evictions++;
    }
    h->hash[e] = hash;
    u64map_put(&h->map, hash, e);
    push_mru(h, e);
    h->puts++;
    return h->arena + (size_t)e * h->block_bytes;
}

const void *host_tier_get(dp_host_tier *h, uint64_t hash)
{
    int32_t e = hash ? u64map_get(&h->map, hash) : -1;
    if (e < 0)
        return NULL;
    unlink_e(h, e);
    push_mru(h, e);
    h->hits++;
    return h->arena + (size_t)e * h->block_bytes;
}

const void *host_tier_find(const dp_host_tier *h, uint64_t hash)
{
    int32_t e = hash ? u64map_get(&h->map, hash) : -1;
    return e < 0 ? NULL : h->arena + (size_t)e * h->block_bytes;
}

void *host_tier_tag(const dp_host_tier *h, const void *entry)
{
    size_t i = (size_t)((const uint8_t *)entry - h->arena) / h->block_bytes;
    return h->tags + i * h->tag_bytes;
}
