/* cpu_attention.c: causal attention over paged KV for any mix of prefill and
 * decode tokens. One task per (tile, KV head): a tile is up to CPU_ATTN_TILE
 * consecutive tokens of one sequence (a prompt chunk; a decode token is a
 * tile of its own), so the group of query heads sharing that KV head (GQA)
 * and the tile's tokens read each key and value block once. The kernel
 * (cpu_kern.c, the dispatched level) scores a vector of keys at a time over
 * the transposed K block with an online softmax (one pass). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

typedef struct attn_job {
    cpu_backend *c;
    dp_kv_store *const *stores;
    const dp_batch *b; /* the layer's view of the batch (cpu_batch_at) */
    int32_t layer;     /* ... and its layer in that view's stores */
    float *out;
    const float *q;
    int32_t n_heads;
    float scale;
    int32_t window; /* > 0: a sliding-window layer's (backend.h attention) */
    int32_t n_kv;
    const int32_t *tiles; /* tile k: tokens [tiles[k], tiles[k + 1]) */
} attn_job;

#define MAX_GROUP 16

/* Token i (its own task) over its sequence's slots. */
static void attn_token(const attn_job *j, const dp_batch *b, int32_t i, int32_t kvh)
{
    const int32_t n_kv = j->n_kv;
    const int32_t s = b->seq[i];
    const dp_kv_store *kv = j->stores[b->seq_store[s]];
    const int32_t hd = kv->l.head_dim;
    const int32_t group = j->n_heads / n_kv;
    const int32_t *table = b->block_tables + (size_t)s * (size_t)b->max_blocks;
    const int32_t first = j->window > 0 && b->slot[i] + 1 > j->window ? b->slot[i] + 1 - j->window : 0;
    const float *qs[MAX_GROUP];
    float *outs[MAX_GROUP];
    /* Heads are handled MAX_GROUP at a time (real models have groups <= 8). */
    for (int32_t g0 = 0; g0 < group; g0 += MAX_GROUP) {
        int32_t ng = group - g0 < MAX_GROUP ? group - g0 : MAX_GROUP;
        for (int32_t g = 0; g < ng; g++) {
            int32_t h = kvh * group + g0 + g;
            qs[g] = j->q + ((size_t)i * (size_t)j->n_heads + (size_t)h) * (size_t)hd;
            outs[g] = j->out + ((size_t)i * (size_t)j->n_heads + (size_t)h) * (size_t)hd;
        }
        /* (A grouped store never serves a windowed layer: llama.c's
         * check_batch refuses it.) */
        if (kv->kivi) /* (no seq_sealed: every slot sealed) */
            j->c->k->attend_grouped(kv, j->layer, kvh, table, b->slot[i] + 1,
                                    b->seq_sealed ? b->seq_sealed[s] : INT32_MAX,
                                    b->seq_sealed ? b->seq_roff[s] : 0, qs, outs, ng, j->scale);
        else
            j->c->k->attend(kv, j->layer, kvh, table, first, b->slot[i] + 1, qs, outs, ng,
                            j->scale);
    }
}

static void attn_token_task(void *ctx, int64_t task, int thread)
{
    const attn_job *j = ctx;
    attn_token(j, j->b, (int32_t)(task / j->n_kv),
               (int32_t)(task % j->n_kv));
}

static void attn_task(void *ctx, int64_t task, int thread)
{
    attn_job *j = ctx;
    const dp_batch *b = j->b;
    const int32_t k = (int32_t)(task / j->n_kv), kvh = (int32_t)(task % j->n_kv);
    const int32_t i0 = j->tiles[k], nt = j->tiles[k + 1] - i0;
    const int32_t s = b->seq[i0];
    const dp_kv_store *kv = j->stores[b->seq_store[s]];
    const int32_t hd = kv->l.head_dim, group = j->n_heads / j->n_kv;
    /* A tile's tokens share their first slot: past a window's length each
     * token starts elsewhere, so one at a time. */
    const bool windowed = j->window > 0 && b->slot[i0 + nt - 1] + 1 > j->window;
    if (nt == 1 || kv->kivi || group > MAX_GROUP || windowed) {
        for (int32_t i = i0; i < i0 + nt; i++)
            attn_token(j, b, i, kvh);
        return;
    }
    const float *qs[CPU_ATTN_TILE * MAX_GROUP];
    float *outs[CPU_ATTN_TILE * MAX_GROUP];
    int32_t n_slots[CPU_ATTN_TILE];
    for (int32_t t = 0; t < nt; t++) {
        n_slots[t] = b->slot[i0 + t] + 1;
        for (int32_t g = 0; g < group; g++) {
            const size_t h = (size_t)(i0 + t) * (size_t)j->n_heads + (size_t)(kvh * group + g);
            qs[t * group + g] = j->q + h * (size_t)hd;
            outs[t * group + g] = j->out + h * (size_t)hd;
        }
    }
    j->c->k->attend_tile(kv, j->layer, kvh, b->block_tables + (size_t)s * (size_t)b->max_blocks,
                         n_slots, nt, qs, outs, group, j->scale);
}

/* Splits the batch's tokens into tiles: runs of consecutive tokens of one
 * sequence at consecutive slots, at most CPU_ATTN_TILE each. Returns the
 * number of tiles (c->attn_tiles: their bounds), or -1 without memory. */
static int32_t attn_tiles(cpu_backend *c, const dp_batch *b)
{
    const size_t need = (size_t)b->n_tokens + 1;
    if (need > c->attn_tiles_cap) {
        int32_t *p = realloc(c->attn_tiles, need * sizeof *p);
        if (!p)
            return -1;
        c->attn_tiles = p;
        c->attn_tiles_cap = need;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const int32_t start = n ? c->attn_tiles[n - 1] : 0;
        if (i == 0 || i - start >= CPU_ATTN_TILE || b->seq[i] != b->seq[i - 1] ||
            b->slot[i] != b->slot[i - 1] + 1)
            c->attn_tiles[n++] = i;
    }
    c->attn_tiles[n] = b->n_tokens;
    return n;
}

void cpu_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                   const float *q, int32_t n_heads, float scale, int32_t window)
{
    cpu_backend *c = cpu_of(be);
    /* Every store of a model has the same head geometry; take it from the
     * store of the first token's sequence. */
    int32_t kl;
    const dp_batch *b = cpu_batch_at(c, layer, &kl);
    const dp_kv_store *kv0 = stores[b->seq_store[b->seq[0]]];
    attn_job j = {c, stores, b, kl, out, q, n_heads, scale, window, kv0->l.n_kv_heads, NULL};
    const int32_t n_tiles = attn_tiles(c, b);
    if (n_tiles < 0) {
        /* Without memory for the tiles, one token a task (the same bits). */
        threadpool_run(c->tp, attn_token_task, &j, (int64_t)c->b.n_tokens * j.n_kv);
        return;
    }
    j.tiles = c->attn_tiles;
    threadpool_run(c->tp, attn_task, &j, (int64_t)n_tiles * j.n_kv);
}
