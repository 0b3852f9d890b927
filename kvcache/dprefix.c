/* dprefix.c: prefixes shared in the decode pool's own blocks (dprefix.h). */
#include "dprefix.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int dprefix_init(dp_dprefix *d, dp_kv_pool *pool, int32_t block_tokens, int32_t max_entries)
{
    memset(d, 0, sizeof *d);
    if (!pool || block_tokens < 1 || max_entries < 1)
        return DP_EINVAL;
    d->pool = pool;
    d->block_tokens = block_tokens;
    d->max_entries = max_entries;
    d->e = calloc((size_t)max_entries, sizeof *d->e);
    if (!d->e || u64map_init(&d->map, (uint32_t)max_entries)) {
        free(d->e);
        d->e = NULL;
        return DP_ENOMEM;
    }
    d->key = hash_key_random();
    return 0;
}

static void entry_clear(dp_dprefix_entry *x)
{
    free(x->tokens);
    free(x->blocks);
    free(x->keep);
    memset(x, 0, sizeof *x);
}

void dprefix_destroy(dp_dprefix *d)
{
    /* The pool may be gone already (the manager tears down in its own
     * order): by then every sequence has left and no entry is live. */
    if (d->e)
        for (int32_t i = 0; i < d->max_entries; i++)
            entry_clear(&d->e[i]);
    free(d->e);
    u64map_destroy(&d->map);
    memset(d, 0, sizeof *d);
}

/* A prefix's name is its tokens' keyed hash; a kept share's mixes in its
 * tag, so the two kinds of one token run have different names. */
static uint64_t name_of(const dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag)
{
    uint64_t h = dp_siphash(&d->key, tokens, (size_t)n * sizeof *tokens);
    if (tag)
        h ^= dp_siphash(&d->key, &tag, sizeof tag);
    return h ? h : 1; /* 0 marks an empty slot of the map */
}

static int32_t find(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag)
{
    int32_t id = u64map_get(&d->map, name_of(d, tokens, n, tag));
    if (id < 0)
        return -1;
    const dp_dprefix_entry *x = &d->e[id];
    /* The name is keyed, but a hit is served only when the tokens agree. */
    if (x->tag != tag || x->n_tokens != n || memcmp(x->tokens, tokens, (size_t)n * sizeof *tokens))
        return -1;
    return id;
}

int32_t dprefix_find(dp_dprefix *d, const int32_t *tokens, int32_t n)
{
    if (!d->e || n < d->block_tokens || n % d->block_tokens)
        return -1;
    return find(d, tokens, n, 0);
}

int32_t dprefix_find_kept(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag)
{
    if (!d->e || n < 1 || !tag)
        return -1;
    return find(d, tokens, n, tag);
}

static int32_t add(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag,
                   const int32_t *blocks, int32_t n_slots, int32_t uncounted, int32_t rows,
                   int32_t cols)
{
    const uint64_t name = name_of(d, tokens, n, tag);
    if (u64map_get(&d->map, name) >= 0)
        return -1;
    int32_t id = -1;
    for (int32_t i = 0; i < d->max_entries && id < 0; i++)
        if (!d->e[i].name)
            id = i;
    if (id < 0)
        return -1;
    dp_dprefix_entry *x = &d->e[id];
    const int32_t nb = n_slots / d->block_tokens;
    x->tokens = malloc((size_t)n * sizeof *x->tokens);
    x->blocks = malloc((size_t)nb * sizeof *x->blocks);
    x->keep = tag ? malloc((size_t)rows * (size_t)cols * sizeof *x->keep) : NULL;
    if (!x->tokens || !x->blocks || (tag && !x->keep)) {
        entry_clear(x);
        return -1;
    }
    memcpy(x->tokens, tokens, (size_t)n * sizeof *tokens);
    memcpy(x->blocks, blocks, (size_t)nb * sizeof *blocks);
    for (int32_t b = 0; b < nb; b++)
        kv_pool_ref(d->pool, blocks[b]);
    x->name = name;
    x->tag = tag;
    x->n_tokens = n;
    x->n_slots = n_slots;
    x->cols = cols;
    x->uncounted = uncounted;
    x->users = 1;
    u64map_put(&d->map, name, id);
    d->live_blocks += nb - uncounted;
    return id;
}

int32_t dprefix_add(dp_dprefix *d, const int32_t *tokens, int32_t n, const int32_t *blocks)
{
    if (!d->e || n < d->block_tokens || n % d->block_tokens)
        return -1;
    return add(d, tokens, n, 0, blocks, n, 0, 0, 0);
}

int32_t dprefix_add_kept(dp_dprefix *d, const int32_t *tokens, int32_t n, uint64_t tag,
                         const int32_t *blocks, int32_t n_slots, int32_t uncounted, int32_t rows,
                         int32_t cols)
{
    if (!d->e || !tag || n < 1 || rows < 1 || n_slots < d->block_tokens || cols <= n_slots ||
        n_slots % d->block_tokens || uncounted < 0 || uncounted > n_slots / d->block_tokens)
        return -1;
    return add(d, tokens, n, tag, blocks, n_slots, uncounted, rows, cols);
}

int32_t dprefix_parked_blocks(const dp_dprefix *d)
{
    int32_t n = 0;
    for (int32_t i = 0; d->e && i < d->max_entries; i++) {
        const dp_dprefix_entry *x = &d->e[i];
        if (x->name && x->users > 0 && x->users == x->parked)
            n += x->n_slots / d->block_tokens - x->uncounted;
    }
    return n;
}

void dprefix_join(dp_dprefix *d, int32_t id)
{
    d->e[id].users++;
}

void dprefix_leave(dp_dprefix *d, int32_t id)
{
    dp_dprefix_entry *x = &d->e[id];
    if (x->users <= 0 || --x->users > 0)
        return;
    u64map_del(&d->map, x->name);
    const int32_t nb = x->n_slots / d->block_tokens;
    for (int32_t b = 0; b < nb; b++)
        kv_pool_unref(d->pool, x->blocks[b]);
    d->live_blocks -= nb - x->uncounted;
    entry_clear(x);
}
