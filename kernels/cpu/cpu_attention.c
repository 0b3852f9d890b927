/* cpu_attention.c: causal attention over paged KV for any mix of prefill and
 * decode tokens. One task per (token, KV head) so the group of query heads
 * sharing that KV head (GQA) reads each key and value block once. With
 * AVX-512 the scores of 16 keys come from one vector accumulation over the
 * transposed K block, and softmax is online (one pass, no score buffer). */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "kernels/simd.h"

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

#ifdef __AVX512F__
/* Online softmax state of one query: running max, sum and weighted V. */
typedef struct qstate {
    float m, l;
} qstate;

static void attend_avx512(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                          int32_t n_slots, const float *const *qs, float *const *outs,
                          int32_t group, float scale)
{
    const dp_kv_layout *lay = &kv->l;
    const int32_t hd = lay->head_dim, bt = lay->block_tokens;
    qstate st[MAX_GROUP];
    float *acc[MAX_GROUP];
    for (int32_t g = 0; g < group; g++) {
        st[g] = (qstate){-INFINITY, 0.0f};
        acc[g] = outs[g]; /* accumulate in place, normalize at the end */
        memset(acc[g], 0, (size_t)hd * sizeof(float));
    }
    float p[16];
    for (int32_t base = 0; base < n_slots; base += bt) {
        const int32_t blk = table[base / bt];
        const size_t ho = kv_head_off(kv, layer, blk, kvh); /* K and V alike */
        const int32_t nb = n_slots - base < bt ? n_slots - base : bt;
        for (int32_t c0 = 0; c0 < nb; c0 += 16) {
            const int32_t nl = nb - c0 < 16 ? nb - c0 : 16;
            const __mmask16 mask = (__mmask16)((1u << nl) - 1u);
            for (int32_t g = 0; g < group; g++) {
                const float *q = qs[g];
                __m512 s = _mm512_setzero_ps();
                for (int32_t d = 0; d < hd; d++)
                    s = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                        kv_load16(kv, kv->k, ho + (size_t)d * bt + (size_t)c0, nl), s);
                s = _mm512_mask_blend_ps(mask, _mm512_set1_ps(-INFINITY),
                                         _mm512_mul_ps(s, _mm512_set1_ps(scale)));
                float bm = _mm512_reduce_max_ps(s);
                if (bm > st[g].m) {
                    /* A new maximum rescales what was accumulated so far. */
                    float r = st[g].m == -INFINITY ? 0.0f : expf(st[g].m - bm);
                    st[g].l *= r;
                    for (int32_t d = 0; d < hd; d += 16) {
                        __mmask16 dm = hd - d < 16 ? (__mmask16)((1u << (hd - d)) - 1u) : 0xffff;
                        _mm512_mask_storeu_ps(acc[g] + d, dm,
                                              _mm512_mul_ps(_mm512_maskz_loadu_ps(dm, acc[g] + d),
                                                            _mm512_set1_ps(r)));
                    }
                    st[g].m = bm;
                }
                __m512 e = _mm512_maskz_mov_ps(mask,
                                               simd_exp_neg(_mm512_sub_ps(s, _mm512_set1_ps(st[g].m))));
                st[g].l += _mm512_reduce_add_ps(e);
                _mm512_storeu_ps(p, e);
                for (int32_t d = 0; d < hd; d += 16) {
                    __mmask16 dm = hd - d < 16 ? (__mmask16)((1u << (hd - d)) - 1u) : 0xffff;
                    __m512 a = _mm512_maskz_loadu_ps(dm, acc[g] + d);
                    const int32_t nd = hd - d < 16 ? hd - d : 16;
                    for (int32_t t = 0; t < nl; t++)
                        a = _mm512_fmadd_ps(_mm512_set1_ps(p[t]),
                                            kv_load16(kv, kv->v, ho + (size_t)(c0 + t) * hd + (size_t)d, nd),
                                            a);
                    _mm512_mask_storeu_ps(acc[g] + d, dm, a);
                }
            }
        }
    }
    for (int32_t g = 0; g < group; g++) {
        const float inv = 1.0f / st[g].l;
        for (int32_t d = 0; d < hd; d++)
            acc[g][d] *= inv;
    }
}
#endif

#ifndef __AVX512F__
/* Portable two-pass version (scores in scratch). */
static void attend_scalar(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                          int32_t n_slots, const float *const *qs, float *const *outs,
                          int32_t group, float scale, float *sc)
{
    const dp_kv_layout *lay = &kv->l;
    const int32_t hd = lay->head_dim, bt = lay->block_tokens;
    for (int32_t g = 0; g < group; g++) {
        float mx = -INFINITY;
        for (int32_t p = 0; p < n_slots; p++) {
            const size_t ko = kv_head_off(kv, layer, table[p / bt], kvh) + (size_t)(p % bt);
            float d = 0.0f;
            for (int32_t e = 0; e < hd; e++)
                d += qs[g][e] * kv_elt(kv, kv->k, ko + (size_t)e * bt);
            sc[p] = d * scale;
            if (sc[p] > mx)
                mx = sc[p];
        }
        float sum = 0.0f;
        for (int32_t p = 0; p < n_slots; p++)
            sum += (sc[p] = expf(sc[p] - mx));
        float *o = outs[g];
        memset(o, 0, (size_t)hd * sizeof *o);
        for (int32_t p = 0; p < n_slots; p++) {
            const size_t vo = kv_vrow_off(kv, layer, table[p / bt], kvh, p % bt);
            const float w = sc[p] / sum;
            for (int32_t e = 0; e < hd; e++)
                o[e] += w * kv_elt(kv, kv->v, vo + (size_t)e);
        }
    }
}
#endif

static void attn_task(void *ctx, int64_t task, int thread)
{
    attn_job *j = ctx;
    const dp_batch *b = &j->c->b;
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
#ifdef __AVX512F__
        attend_avx512(kv, j->layer, kvh, table, b->slot[i] + 1, qs, outs, ng, j->scale);
        (void)thread;
#else
        attend_scalar(kv, j->layer, kvh, table, b->slot[i] + 1, qs, outs, ng, j->scale,
                      j->c->sscratch[thread]);
#endif
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
