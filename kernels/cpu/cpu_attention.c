/* cpu_attention.c: causal attention over paged KV for any mix of prefill and
 * decode tokens. One task per (token, KV head) so the group of query heads
 * sharing that KV head (GQA) reads each key and value row once. */
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

static void attn_task(void *ctx, int64_t task, int thread)
{
    attn_job *j = ctx;
    const dp_batch *b = &j->c->b;
    const int32_t n_kv = j->n_kv;
    const int32_t i = (int32_t)(task / n_kv);
    const int32_t kvh = (int32_t)(task % n_kv);
    const int32_t s = b->seq[i];
    const dp_kv_store *kv = j->stores[b->seq_store[s]];
    const dp_kv_layout *l = &kv->l;
    const int32_t hd = l->head_dim, bt = l->block_tokens;
    const int32_t n_slots = b->slot[i] + 1;
    const int32_t group = j->n_heads / n_kv;
    const int32_t *table = b->block_tables + (size_t)s * (size_t)b->max_blocks;
    float *sc = j->c->sscratch[thread];

    for (int32_t g = 0; g < group; g++) {
        const int32_t h = kvh * group + g;
        const float *qh = j->q + ((size_t)i * (size_t)j->n_heads + (size_t)h) * (size_t)hd;
        float *oh = j->out + ((size_t)i * (size_t)j->n_heads + (size_t)h) * (size_t)hd;
        float mx = -INFINITY;
        for (int32_t p = 0; p < n_slots; p++) {
            const float *kr = kv_row(kv, kv->k, j->layer, table[p / bt], kvh, p % bt);
            float d = cpu_dot(qh, kr, hd) * j->scale;
            sc[p] = d;
            if (d > mx)
                mx = d;
        }
        float sum = 0.0f;
        for (int32_t p = 0; p < n_slots; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        const float inv = 1.0f / sum;
        memset(oh, 0, (size_t)hd * sizeof *oh);
        for (int32_t p = 0; p < n_slots; p++) {
            const float *vr = kv_row(kv, kv->v, j->layer, table[p / bt], kvh, p % bt);
            const float wgt = sc[p] * inv;
            for (int32_t d = 0; d < hd; d++)
                oh[d] += wgt * vr[d];
        }
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
