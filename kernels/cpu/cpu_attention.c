/* cpu_attention.c: causal attention over paged KV for any mix of prefill and
 * decode tokens. One task per (token, KV head) so the group of query heads
 * sharing that KV head (GQA) reads each key and value block once. The kernel
 * (cpu_kern.c, the dispatched level) scores a vector of keys at a time over
 * the transposed K block with an online softmax (one pass). */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef struct attn_job {
    cpu_backend *c;
    dp_kv_store *const *stores;
    int32_t layer;
    float *out;
    const float *q;
    int32_t n_heads;
    float scale;
    int32_t n_kv;
} attn_job;

#define MAX_GROUP 16

static void attn_task(void *ctx, int64_t task, int thread)
{
    attn_job *j = ctx;
    const dp_batch *b = cpu_batch_at(j->c, j->layer);
    const int32_t n_kv = j->n_kv;
    const int32_t i = (int32_t)(task / n_kv);
    const int32_t kvh = (int32_t)(task % n_kv);
    const int32_t s = b->seq[i];
    const dp_kv_store *kv = j->stores[b->seq_store[s]];
    const int32_t hd = kv->l.head_dim;
    const int32_t group = j->n_heads / n_kv;
    const int32_t *table = b->block_tables + (size_t)s * (size_t)b->max_blocks;
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
        if (kv->kivi) /* (no seq_sealed: every slot sealed) */
            j->c->k->attend_grouped(kv, j->layer, kvh, table, b->slot[i] + 1,
                                    b->seq_sealed ? b->seq_sealed[s] : INT32_MAX,
                                    b->seq_sealed ? b->seq_roff[s] : 0, qs, outs, ng, j->scale);
        else
            j->c->k->attend(kv, j->layer, kvh, table, b->slot[i] + 1, qs, outs, ng, j->scale);
    }
}

void cpu_attention(dp_backend *be, dp_kv_store *const *stores, int32_t layer, float *out,
                   const float *q, int32_t n_heads, float scale)
{
    cpu_backend *c = cpu_of(be);
    /* Every store of a model has the same head geometry; take it from the
     * store of the first token's sequence. */
    const dp_kv_store *kv0 = stores[c->b.seq_store[c->b.seq[0]]];
    attn_job j = {c, stores, layer, out, q, n_heads, scale, kv0->l.n_kv_heads};
    threadpool_run(c->tp, attn_task, &j, (int64_t)c->b.n_tokens * j.n_kv);
}
