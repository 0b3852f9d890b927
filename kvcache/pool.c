/* pool.c: block allocation with reference counts and an LRU free list.
 * All operations are O(1) except table growth; the engine thread owns a pool. */
#include <assert.h>
#include "pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int kv_pool_init(dp_kv_pool *p, int32_t n_blocks, int32_t block_tokens)
{
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || block_tokens <= 0)
        return DP_EINVAL;
    p->refcnt = calloc((size_t)n_blocks, sizeof *p->refcnt);
    p->prev = malloc((size_t)n_blocks * sizeof *p->prev);
    p->next = malloc((size_t)n_blocks * sizeof *p->next);
    p->protect = calloc((size_t)n_blocks, sizeof *p->protect);
    p->in_warm = calloc((size_t)n_blocks, sizeof *p->in_warm);
    p->gen = calloc((size_t)n_blocks, sizeof *p->gen);
    if (!p->refcnt || !p->prev || !p->next || !p->protect || !p->in_warm || !p->gen) {
        kv_pool_destroy(p);
        return DP_ENOMEM;
    }
    p->n_blocks = n_blocks;
    p->block_tokens = block_tokens;
    for (int32_t i = 0; i < n_blocks; i++) {
        p->prev[i] = i - 1;
        p->next[i] = i + 1 < n_blocks ? i + 1 : -1;
    }
    p->head = 0;
    p->tail = n_blocks - 1;
    p->whead = p->wtail = -1;
    p->n_free = n_blocks;
    return 0;
}

void kv_pool_destroy(dp_kv_pool *p)
{
    free(p->refcnt);
    free(p->prev);
    free(p->next);
    free(p->protect);
    free(p->in_warm);
    free(p->gen);
    memset(p, 0, sizeof *p);
}

static void unlink_free(dp_kv_pool *p, int32_t b)
{
    int32_t *head = p->in_warm[b] ? &p->whead : &p->head;
    int32_t *tail = p->in_warm[b] ? &p->wtail : &p->tail;
    int32_t pr = p->prev[b], nx = p->next[b];
    if (pr >= 0)
        p->next[pr] = nx;
    else
        *head = nx;
    if (nx >= 0)
        p->prev[nx] = pr;
    else
        *tail = pr;
    p->prev[b] = p->next[b] = -1;
    p->n_warm -= p->in_warm[b];
    p->in_warm[b] = 0;
    p->n_free--;
}

/* Appends free block b to the tail of its list (protected or not). */
static void link_free(dp_kv_pool *p, int32_t b)
{
    bool warm = p->protect[b] > 0;
    int32_t *head = warm ? &p->whead : &p->head;
    int32_t *tail = warm ? &p->wtail : &p->tail;
    p->prev[b] = *tail;
    p->next[b] = -1;
    if (*tail >= 0)
        p->next[*tail] = b;
    else
        *head = b;
    *tail = b;
    p->in_warm[b] = warm;
    p->n_warm += warm;
    p->n_free++;
}

int kv_pool_alloc(dp_kv_pool *p, int32_t *block)
{
    int32_t b = p->head >= 0 ? p->head : p->whead;
    if (b < 0)
        return DP_ENOSPC;
    unlink_free(p, b);
    p->protect[b] = 0; /* new contents: the old protection is void */
    p->gen[b]++;
    p->refcnt[b] = 1;
    if (p->on_reuse)
        p->on_reuse(p->reuse_ud, b);
    *block = b;
    return 0;
}

void kv_pool_ref(dp_kv_pool *p, int32_t block)
{
    if (p->refcnt[block] == 0)
        unlink_free(p, block); /* revive a cached free block */
    p->refcnt[block]++;
}

void kv_pool_unref(dp_kv_pool *p, int32_t block)
{
    /* A reference nobody holds: the bookkeeping is wrong somewhere. A debug
     * build stops here, where it shows; a release build leaves the block
     * free rather than corrupt the free list. */
    assert(p->refcnt[block] > 0);
    if (p->refcnt[block] == 0 || --p->refcnt[block] > 0)
        return;
    link_free(p, block);
}

void kv_pool_protect(dp_kv_pool *p, int32_t block)
{
    if (p->protect[block] == UINT16_MAX)
        return; /* saturated: stays protected until the block is reused */
    p->protect[block]++;
    if (p->refcnt[block] == 0 && !p->in_warm[block]) {
        unlink_free(p, block);
        link_free(p, block);
    }
}

void kv_pool_unprotect(dp_kv_pool *p, int32_t block, uint32_t gen)
{
    if (p->gen[block] != gen || p->protect[block] == 0 || p->protect[block] == UINT16_MAX)
        return;
    if (--p->protect[block] == 0 && p->refcnt[block] == 0) {
        unlink_free(p, block);
        link_free(p, block);
    }
}

void kv_table_init(dp_block_table *t) { memset(t, 0, sizeof *t); }

int kv_table_reserve(dp_block_table *t, dp_kv_pool *p, int64_t n_tokens)
{
    return kv_table_reserve_bt(t, p, n_tokens, p->block_tokens);
}

int kv_ids_room(int32_t **ids, int32_t *cap, int32_t need)
{
    if (need <= *cap)
        return 0;
    int32_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    int32_t *nb = realloc(*ids, (size_t)c * sizeof *nb);
    if (!nb)
        return DP_ENOMEM;
    *ids = nb;
    *cap = c;
    return 0;
}

int kv_table_reserve_bt(dp_block_table *t, dp_kv_pool *p, int64_t n_tokens, int32_t block_tokens)
{
    int32_t need = (int32_t)((n_tokens + block_tokens - 1) / block_tokens);
    if (need <= t->n_blocks)
        return 0;
    if (need - t->n_blocks > p->n_free)
        return DP_ENOSPC;
    if (kv_table_room(t, need))
        return DP_ENOMEM;
    while (t->n_blocks < need) {
        int rc = kv_pool_alloc(p, &t->blocks[t->n_blocks]);
        if (rc)
            return rc; /* cannot happen: n_free was checked */
        t->n_blocks++;
    }
    return 0;
}

int kv_table_push(dp_block_table *t, dp_kv_pool *p, int32_t block)
{
    if (kv_table_room(t, t->n_blocks + 1))
        return DP_ENOMEM;
    kv_pool_ref(p, block);
    t->blocks[t->n_blocks++] = block;
    return 0;
}

void kv_table_release(dp_block_table *t, dp_kv_pool *p)
{
    /* Release newest first so the oldest (prefix) blocks are reused last. */
    for (int32_t i = t->n_blocks - 1; i >= 0; i--)
        kv_pool_unref(p, t->blocks[i]);
    t->n_blocks = 0;
}

void kv_table_destroy(dp_block_table *t, dp_kv_pool *p)
{
    kv_table_release(t, p);
    free(t->blocks);
    memset(t, 0, sizeof *t);
}
