/* swa.c: the sliding-window layers' cache (swa.h). */
#include "swa.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

int swa_init(dp_kv_swa *w, dp_backend *be, const dp_kv_layout *l, int32_t window, int32_t chunk)
{
    memset(w, 0, sizeof *w);
    w->window = window;
    w->chunk = chunk;
    int rc = kv_pool_init(&w->pool, l->n_blocks, l->block_tokens);
    if (!rc && be)
        rc = be->ops->kv_create(be, l, &w->store);
    if (rc)
        swa_destroy(w, be);
    return rc;
}

void swa_destroy(dp_kv_swa *w, dp_backend *be)
{
    if (w->store)
        be->ops->kv_destroy(be, w->store);
    kv_pool_destroy(&w->pool);
    memset(w, 0, sizeof *w);
}

static int32_t blocks_for(const dp_kv_swa *w, int64_t n)
{
    return (int32_t)((n + w->pool.block_tokens - 1) / w->pool.block_tokens);
}

/* What a prompt of n tokens holds at most while its chunks run. */
int32_t swa_prompt_need(const dp_kv_swa *w, int64_t n)
{
    const int32_t c = n < w->chunk ? (int32_t)n : w->chunk, b = blocks_for(w, n);
    return c < 1 ? 0 : swa_blocks_at(w, c) < b ? swa_blocks_at(w, c) : b;
}

int32_t swa_need(const dp_kv_swa *w, int64_t n_prompt, int64_t n_more)
{
    const int32_t p = swa_prompt_need(w, n_prompt), b = blocks_for(w, n_prompt + n_more);
    const int32_t d = swa_blocks_at(w, 1) < b ? swa_blocks_at(w, 1) : b;
    return p > d ? p : d;
}

int swa_admit(dp_kv_swa *w, dp_kv_wtab *t, int32_t n_prompt)
{
    const int32_t need = swa_prompt_need(w, n_prompt);
    if (need > w->pool.n_free - w->reserved)
        return DP_ENOSPC;
    t->n = t->lo = t->pos = 0;
    t->prompt = n_prompt;
    t->promise = t->peak = need;
    w->reserved += need;
    const int rc = swa_grow(w, t, n_prompt < w->chunk ? n_prompt : w->chunk);
    if (rc)
        swa_release(w, t);
    return rc;
}

int swa_grow(dp_kv_swa *w, dp_kv_wtab *t, int64_t end)
{
    const int32_t want = blocks_for(w, end);
    if (want <= t->n)
        return 0;
    const int32_t k = want - t->n, own = k < t->promise ? k : t->promise;
    if (k - own > w->pool.n_free - w->reserved)
        return DP_ENOSPC;
    if (kv_ids_room(&t->blocks, &t->cap, want))
        return DP_ENOMEM;
    t->promise -= own;
    w->reserved -= own;
    while (t->n < want)
        if (kv_pool_alloc(&w->pool, &t->blocks[t->n++]))
            return DP_ENOSPC; /* cannot happen: n_free was checked */
    return 0;
}

bool swa_can_resume(const dp_kv_swa *w, const dp_kv_wtab *t, int32_t c)
{
    const int64_t first = (int64_t)c + 1 - w->window;
    return c > 0 && c <= t->pos && (int64_t)t->lo * w->pool.block_tokens <= (first > 0 ? first : 0);
}

int32_t swa_resume_need(const dp_kv_swa *w, const dp_kv_wtab *t, int32_t c, int32_t n_prompt)
{
    /* It holds entries [lo, keep) up to c; its tail's chunks hold at most
     * a window and a chunk, and no more than its positions' entries. */
    const int32_t keep = blocks_for(w, c), tail = n_prompt - c;
    const int32_t cc = tail < w->chunk ? tail : w->chunk;
    int32_t most = cc > 0 ? swa_blocks_at(w, cc) : 0;
    if (most > blocks_for(w, n_prompt) - t->lo)
        most = blocks_for(w, n_prompt) - t->lo;
    return most > keep - t->lo ? most - (keep - t->lo) : 0;
}

void swa_cut(dp_kv_swa *w, dp_kv_wtab *t, int32_t c)
{
    const int32_t keep = blocks_for(w, c);
    for (int32_t j = t->n - 1; j >= keep && j >= t->lo; j--)
        kv_pool_unref(&w->pool, t->blocks[j]);
    if (t->n > keep)
        t->n = keep > t->lo ? keep : t->lo;
    if (t->pos > c)
        t->pos = c;
}

int swa_resume(dp_kv_swa *w, dp_kv_wtab *t, int32_t n_prompt)
{
    const int32_t c = t->pos, need = swa_resume_need(w, t, c, n_prompt);
    if (!swa_can_resume(w, t, c) || need > w->pool.n_free - w->reserved)
        return DP_ENOSPC;
    w->reserved -= t->promise;
    t->prompt = n_prompt;
    t->promise = need;
    t->peak = swa_held(t) + need;
    w->reserved += need;
    const int64_t end = (int64_t)c + w->chunk < n_prompt ? (int64_t)c + w->chunk : n_prompt;
    return swa_grow(w, t, end); /* (from the promise: cannot fail) */
}

void swa_settle(dp_kv_swa *w, dp_kv_wtab *t)
{
    w->reserved -= t->promise;
    t->promise = t->peak = 0;
}

void swa_commit(dp_kv_swa *w, dp_kv_wtab *t, int32_t n)
{
    t->pos += n;
    /* The next token (position pos) reads from pos + 1 - window on. */
    const int32_t bt = w->pool.block_tokens;
    while (t->lo < t->n && (int64_t)(t->lo + 1) * bt <= (int64_t)t->pos + 1 - w->window) {
        kv_pool_unref(&w->pool, t->blocks[t->lo]);
        t->blocks[t->lo++] = -1;
    }
    if (t->pos >= t->prompt) {
        swa_settle(w, t);
        return;
    }
    /* A prompt still running: what the window gave back is promised to it
     * again (it was free a moment ago), up to its peak. */
    const int32_t want = t->peak - swa_held(t);
    if (want > t->promise) {
        w->reserved += want - t->promise;
        t->promise = want;
    }
}

void swa_release(dp_kv_swa *w, dp_kv_wtab *t)
{
    for (int32_t j = t->n - 1; j >= t->lo; j--)
        kv_pool_unref(&w->pool, t->blocks[j]);
    w->reserved -= t->promise;
    t->n = t->lo = t->pos = t->prompt = t->promise = t->peak = 0;
}

void swa_tab_destroy(dp_kv_wtab *t)
{
    free(t->blocks);
    memset(t, 0, sizeof *t);
}
