/* swap.c: copies of compact caches in host memory (pinned where the backend
 * has it, so that the copies are DMA on its stream). */
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
    s->cap_bytes = cap_bytes;
    return s->block_bytes ? 0 : DP_EINVAL;
}

void kv_swap_destroy(dp_kv_swap *s)
{
    memset(s, 0, sizeof *s);
}

static void *host_alloc(dp_kv_swap *s, size_t n)
{
    if (s->be->ops->host_alloc && s->be->ops->host_free)
        return s->be->ops->host_alloc(s->be, n);
    return malloc(n);
}

static void host_free(dp_kv_swap *s, void *p)
{
    /* The backend's free waits for copies still queued on p. */
    if (s->be->ops->host_alloc && s->be->ops->host_free)
        s->be->ops->host_free(s->be, p);
    else
        free(p);
}

int kv_swap_out(dp_kv_swap *s, dp_block_table *t, dp_swapped *out)
{
    memset(out, 0, sizeof *out);
    size_t bytes = (size_t)t->n_blocks * s->block_bytes;
    if (t->n_blocks == 0)
        return DP_EINVAL; /* nothing to keep: the caller recomputes */
    if (s->used_bytes + bytes > s->cap_bytes)
        return DP_ENOSPC;
    uint8_t *buf = host_alloc(s, bytes);
    if (!buf)
        return DP_ENOMEM;
    for (int32_t i = 0; i < t->n_blocks; i++) {
        int rc = s->be->ops->kv_block_read(s->be, s->store, t->blocks[i], buf + (size_t)i * s->block_bytes);
        if (rc) {
            host_free(s, buf);
            return rc;
        }
    }
    /* The blocks may be reused at once: the backend orders the reads first. */
    out->buf = buf;
    out->n_blocks = t->n_blocks;
    kv_table_release(t, s->pool);
    s->used_bytes += bytes;
    s->outs++;
    return 0;
}

int kv_swap_in(dp_kv_swap *s, dp_swapped *sw, dp_block_table *t, int64_t n_slots)
{
    int64_t want = (int64_t)sw->n_blocks * s->block_tokens;
    int rc = kv_table_reserve_bt(t, s->pool, n_slots > want ? n_slots : want, s->block_tokens);
    if (rc)
        return rc;
    const uint8_t *buf = sw->buf;
    for (int32_t i = 0; i < sw->n_blocks; i++) {
        rc = s->be->ops->kv_block_write(s->be, s->store, t->blocks[i], buf + (size_t)i * s->block_bytes);
        if (rc) {
            kv_table_release(t, s->pool);
            return rc;
        }
    }
    kv_swap_drop(s, sw);
    s->ins++;
    return 0;
}

void kv_swap_drop(dp_kv_swap *s, dp_swapped *sw)
{
    if (!sw->buf)
        return;
    host_free(s, sw->buf);
    s->used_bytes -= (size_t)sw->n_blocks * s->block_bytes;
    memset(sw, 0, sizeof *sw);
}
