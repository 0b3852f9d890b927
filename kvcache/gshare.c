/* gshare.c: the registry of shared sealed groups (gshare.h). */
#include "gshare.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* A name is hashed from at most this many source blocks (a group of 256
 * tokens over blocks of 1 token is the extreme; real ones span 4-5). */
#define GSHARE_MAX_SRC 258

int gshare_init(dp_gshare *s, dp_kv_pool *pool)
{
    memset(s, 0, sizeof *s);
    s->pool = pool;
    s->key = hash_key_random();
    /* One name per block at most (gshare_add drops a block's old name). */
    s->name = calloc((size_t)pool->n_blocks, sizeof *s->name);
    s->gen = calloc((size_t)pool->n_blocks, sizeof *s->gen);
    if (!s->name || !s->gen || u64map_init(&s->map, (uint32_t)pool->n_blocks)) {
        gshare_destroy(s);
        return DP_ENOMEM;
    }
    return 0;
}

void gshare_destroy(dp_gshare *s)
{
    free(s->name);
    free(s->gen);
    u64map_destroy(&s->map);
    memset(s, 0, sizeof *s);
}

uint64_t gshare_name(const dp_gshare *s, const uint64_t *src_names, int32_t n, int32_t roff,
                     int32_t g)
{
    if (!s->name || n < 1 || n > GSHARE_MAX_SRC)
        return 0;
    uint64_t buf[GSHARE_MAX_SRC + 1];
    for (int32_t i = 0; i < n; i++) {
        if (!src_names[i])
            return 0;
        buf[i] = src_names[i];
    }
    buf[n] = (uint64_t)(uint32_t)roff << 32 | (uint32_t)g;
    const uint64_t h = dp_siphash(&s->key, buf, (size_t)(n + 1) * sizeof *buf);
    return h ? h : 1;
}

int32_t gshare_find(const dp_gshare *s, uint64_t name)
{
    if (!name || !s->name)
        return -1;
    const int32_t b = u64map_get(&s->map, name);
    /* Still that allocation (freed and taken for other contents since: the
     * generation moved), and still held by a table. */
    if (b < 0 || s->name[b] != name || s->gen[b] != kv_pool_gen(s->pool, b) ||
        s->pool->refcnt[b] == 0)
        return -1;
    return b;
}

void gshare_add(dp_gshare *s, uint64_t name, int32_t block)
{
    if (!name || !s->name || block < 0 || block >= s->pool->n_blocks)
        return;
    const uint64_t old = s->name[block];
    if (old && u64map_get(&s->map, old) == block)
        u64map_del(&s->map, old);
    u64map_put(&s->map, name, block);
    s->name[block] = name;
    s->gen[block] = kv_pool_gen(s->pool, block);
}
