/* swap.c: copies of compact caches in the swap space, an arena of host
 * memory allocated once (pinned where the backend has it, so that the copies
 * are DMA on its stream). */
#include "swap.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int kv_swap_init(dp_kv_swap *s, dp_backend *be, dp_kv_store *store, dp_kv_pool *pool,
                 size_t cap_bytes)
{
    memset(s, 0, sizeof *s);
    s->be = be;
    s->store = store;
    s->pool = pool;
    const dp_kv_layout *l = be->ops->kv_layout(be, store);
    s->block_bytes = be->ops->kv_bytes_per_block(be, l);
    s->block_tokens = l->block_tokens;
    size_t n = s->block_bytes ? cap_bytes / s->block_bytes : 0;
    if (n > INT32_MAX)
        n = INT32_MAX; /* the slot pool's limit */
    if (n == 0)
        return DP_EINVAL;
    s->cap_bytes = n * s->block_bytes;
    /* Pinned where the backend has it; where pinning so much fails, plain
     * memory still holds the copies (synchronously). */
    if (be->ops->host_alloc && be->ops->host_free &&
        (s->arena = be->ops->host_alloc(be, s->cap_bytes)) != NULL)
        s->pinned = true;
    else if (!(s->arena = malloc(s->cap_bytes)))
        return DP_ENOMEM;
    int rc = kv_pool_init(&s->slots, (int32_t)n, 1);
    if (rc) {
        kv_swap_destroy(s);
        return rc;
    }
    return 0;
}

void kv_swap_destroy(dp_kv_swap *s)
{
    /* The backend's free waits for copies still queued on the arena. */
    if (s->arena && s->pinned)
        s->be->ops->host_free(s->be, s->arena);
    else
        free(s->arena);
    if (s->slots.refcnt)
        kv_pool_destroy(&s->slots);
    memset(s, 0, sizeof *s);
}

static uint8_t *slot_at(const dp_kv_swap *s, int32_t slot)
{
    return s->arena + (size_t)slot * s->block_bytes;
}

int kv_swap_out(dp_kv_swap *s, dp_block_table *t, dp_swapped *out)
{
    memset(out, 0, sizeof *out);
    if (t->n_blocks == 0)
        return DP_EINVAL; /* nothing to keep: the caller recomputes */
    if (!kv_swap_has_room(s, t->n_blocks))
        return DP_ENOSPC;
    int32_t *slots = malloc((size_t)t->n_blocks * sizeof *slots);
    if (!slots)
        return DP_ENOMEM;
    int rc = 0;
    int32_t i = 0;
    for (; i < t->n_blocks && !rc; i++)
        if (!(rc = kv_pool_alloc(&s->slots, &slots[i])))
            rc = s->be->ops->kv_block_read(s->be, s->store, t->blocks[i], slot_at(s, slots[i]));
        else
            break;
    if (rc) {
        for (int32_t k = 0; k < i; k++)
            kv_pool_unref(&s->slots, slots[k]);
        free(slots);
        return rc;
    }
    /* The blocks may be reused at once: the backend orders the reads first. */
    out->slots = slots;
    out->n_blocks = t->n_blocks;
    kv_table_release(t, s->pool);
    s->used_bytes += (size_t)out->n_blocks * s->block_bytes;
    s->outs++;
    return 0;
}

int kv_swap_in(dp_kv_swap *s, dp_swapped *sw, dp_block_table *t, int64_t n_slots)
{
    int64_t want = (int64_t)sw->n_blocks * s->block_tokens;
    int rc = kv_table_reserve_bt(t, s->pool, n_slots > want ? n_slots : want, s->block_tokens);
    if (rc)
        return rc;
    for (int32_t i = 0; i < sw->n_blocks; i++) {
        rc = s->be->ops->kv_block_write(s->be, s->store, t->blocks[i], slot_at(s, sw->slots[i]));
        if (rc) {
            kv_table_release(t, s->pool);
            return rc;
        }
    }
    /* A slot freed here may take a later swap-out's read at once: the
     * backend runs its copies in the order they were queued. */
    kv_swap_drop(s, sw);
    s->ins++;
    return 0;
}

void kv_swap_drop(dp_kv_swap *s, dp_swapped *sw)
{
    if (!sw->slots)
        return;
    for (int32_t i = 0; i < sw->n_blocks; i++)
        kv_pool_unref(&s->slots, sw->slots[i]);
    free(sw->slots);
    s->used_bytes -= (size_t)sw->n_blocks * s->block_bytes;
    memset(sw, 0, sizeof *sw);
}
