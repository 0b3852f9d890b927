/* prefix.c: naming, matching and spilling prefill blocks. The map holds only
 * names whose block still has those contents: a block loses its name the
 * moment the pool hands it out for something else (prefix_on_reuse). */
#include "prefix.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

static int32_t *tokens_of(const dp_prefix_cache *pc, int32_t block)
{
    return pc->block_tokens + (size_t)block * (size_t)pc->pool->block_tokens;
}

static void on_reuse(void *ud, int32_t block)
{
    dp_prefix_cache *pc = ud;
    uint64_t h = pc->block_hash[block];
    if (!h)
        return;
    if (pc->host) {
        void *buf = host_tier_put(pc->host, h);
        if (buf && pc->be->ops->kv_block_read(pc->be, pc->store, block, buf) == 0) {
            memcpy(host_tier_tag(pc->host, buf), tokens_of(pc, block),
                   (size_t)pc->pool->block_tokens * sizeof(int32_t));
            pc->spilled_blocks++;
        }
    }
    u64map_del(&pc->map, h);
    pc->block_hash[block] = 0;
}

int prefix_init(dp_prefix_cache *pc, dp_kv_pool *pool, dp_backend *be, dp_kv_store *store,
                dp_host_tier *host)
{
    memset(pc, 0, sizeof *pc);
    pc->pool = pool;
    pc->be = be;
    pc->store = store;
    pc->host = host;
    const size_t bt = (size_t)pool->block_tokens;
    if (host && host->tag_bytes < bt * sizeof(int32_t))
        return DP_EINVAL;
    pc->key = hash_key_random();
    pc->block_hash = calloc((size_t)pool->n_blocks, sizeof *pc->block_hash);
    pc->block_tokens = malloc((size_t)pool->n_blocks * bt * sizeof *pc->block_tokens);
    pc->hbuf = malloc(sizeof(uint64_t) + bt * sizeof(int32_t));
    if (!pc->block_hash || !pc->block_tokens || !pc->hbuf ||
        u64map_init(&pc->map, (uint32_t)pool->n_blocks)) {
        prefix_destroy(pc);
        return DP_ENOMEM;
    }
    /* Restores pass the host entry itself to kv_block_write (no staging
     * copy), see prefix_match. */
    pool->on_reuse = on_reuse;
    pool->reuse_ud = pc;
    return 0;
}

void prefix_destroy(dp_prefix_cache *pc)
{
    if (pc->pool && pc->pool->reuse_ud == pc) {
        pc->pool->on_reuse = NULL;
        pc->pool->reuse_ud = NULL;
    }
    free(pc->block_hash);
    free(pc->block_tokens);
    free(pc->hbuf);
    u64map_destroy(&pc->map);
    memset(pc, 0, sizeof *pc);
}

uint64_t prefix_chain(dp_prefix_cache *pc, uint64_t prev, const int32_t *tokens, int32_t n)
{
    memcpy(pc->hbuf, &prev, sizeof prev);
    memcpy(pc->hbuf + sizeof prev, tokens, (size_t)n * sizeof *tokens);
    uint64_t h = dp_siphash(&pc->key, pc->hbuf, sizeof prev + (size_t)n * sizeof *tokens);
    return h ? h : 1; /* 0 means "unnamed" */
}

void prefix_register(dp_prefix_cache *pc, int32_t block, uint64_t hash, const int32_t *tokens)
{
    if (pc->block_hash[block] || u64map_get(&pc->map, hash) >= 0)
        return;
    pc->block_hash[block] = hash;
    memcpy(tokens_of(pc, block), tokens, (size_t)pc->pool->block_tokens * sizeof *tokens);
    u64map_put(&pc->map, hash, block);
}

int32_t prefix_match(dp_prefix_cache *pc, const int32_t *tokens, int32_t max_tokens,
                     dp_block_table *t, int32_t *from_host, uint64_t *last_hash)
{
    const int32_t bt = pc->pool->block_tokens;
    uint64_t h = 0;
    *from_host = 0;
    *last_hash = 0;
    for (int32_t b = 0; (b + 1) * bt <= max_tokens; b++) {
        const int32_t *want = tokens + (size_t)b * bt;
        const size_t wbytes = (size_t)bt * sizeof *want;
        uint64_t nh = prefix_chain(pc, h, want, bt);
        if (kv_table_room(t, t->n_blocks + 1))
            break;
        int32_t blk = u64map_get(&pc->map, nh);
        if (blk >= 0) {
            /* A name is 64 bits: equal names with other tokens are refused,
             * never served (the chain before it was checked the same way). */
            if (memcmp(tokens_of(pc, blk), want, wbytes) != 0) {
                pc->refused++;
                break;
            }
            kv_pool_ref(pc->pool, blk); /* revives it if it was free */
            pc->hit_blocks++;
        } else {
            const void *src = pc->host ? host_tier_find(pc->host, nh) : NULL;
            if (!src)
                break;
            if (memcmp(host_tier_tag(pc->host, src), want, wbytes) != 0) {
                pc->refused++;
                break;
            }
            src = host_tier_get(pc->host, nh); /* now most recently used */
            if (kv_pool_alloc(pc->pool, &blk) != 0)
                break;
            /* Taking a block may have spilled another into the host tier,
             * evicting the least recently used entry: never this one (just
             * made most recent) unless the tier holds a single entry. */
            if (host_tier_find(pc->host, nh) != src) {
                kv_pool_unref(pc->pool, blk);
                break;
            }
            /* Straight from the entry: the host never reads the bytes, so a
             * spill copy still queued into it (kv_block_read on the backend's
             * stream) is ordered before this restore by the stream itself;
             * a later spill into the same entry is queued after it. */
            if (pc->be->ops->kv_block_write(pc->be, pc->store, blk, src) != 0) {
                kv_pool_unref(pc->pool, blk);
                break;
            }
            prefix_register(pc, blk, nh, want);
            pc->host_blocks++;
            (*from_host)++;
        }
        t->blocks[t->n_blocks++] = blk;
        h = nh;
    }
    *last_hash = h;
    return t->n_blocks * bt;
}
