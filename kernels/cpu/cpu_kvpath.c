/* cpu_kvpath.c: the dual-path KV operations on the CPU: importance scores
 * (key norms, attention mass from captured queries) and kv_compact, the
 * per-head gather from prefill blocks into decode blocks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "cpu_internal.h"

typedef struct knorm_job {
    const dp_kv_store *kv;
    const int32_t *table;
    int32_t n_slots;
    float *out;
} knorm_job;

static void knorm_task(void *ctx, int64_t t, int thread)
{
    knorm_job *j = ctx;
    const dp_kv_layout *l = &j->kv->l;
    const int32_t layer = (int32_t)(t / l->n_kv_heads), h = (int32_t)(t % l->n_kv_heads);
    const int32_t hd = l->head_dim, bt = l->block_tokens;
    float *o = j->out + (size_t)t * (size_t)j->n_slots;
    if (j->kv->qtype) { /* quantized rows: each dequantized on its own */
        float row[1024];
        for (int32_t i = 0; i < j->n_slots; i++) {
            kv_kget(j->kv, layer, j->table[i / bt], h, i % bt, row);
            float ss = 0.0f;
            for (int32_t d = 0; d < hd; d++)
                ss += row[d] * row[d];
            o[i] = sqrtf(ss);
        }
        return;
    }
    /* Sum of squares over the transposed block: one pass over K, no gather. */
    for (int32_t base = 0; base < j->n_slots; base += bt) {
        const size_t ko = kv_head_off(j->kv, layer, j->table[base / bt], h);
        const int32_t nb = j->n_slots - base < bt ? j->n_slots - base : bt;
        for (int32_t tk = 0; tk < nb; tk++)
            o[base + tk] = 0.0f;
        for (int32_t d = 0; d < hd; d++)
            for (int32_t tk = 0; tk < nb; tk++) {
                float v = kv_elt(j->kv, j->kv->k, ko + (size_t)d * bt + (size_t)tk);
                o[base + tk] += v * v;
            }
        for (int32_t tk = 0; tk < nb; tk++)
            o[base + tk] = sqrtf(o[base + tk]);
    }
}

void cpu_kv_score_knorm(dp_backend *be, const dp_kv_store *kv, const int32_t *table, int32_t n_slots,
                        float *out)
{
    if (kv->kivi) { /* grouped stores are not scored (their residual is elsewhere): no information */
        memset(out, 0, (size_t)kv->l.n_layers * kv->l.n_kv_heads * n_slots * sizeof *out);
        return;
    }
    knorm_job j = {kv, table, n_slots, out};
    threadpool_run(cpu_of(be)->tp, knorm_task, &j, (int64_t)kv->l.n_layers * kv->l.n_kv_heads);
}

typedef struct sattn_job {
    cpu_backend *c;
    const dp_kv_store *kv;
    const int32_t *table;
    int32_t n_slots;
    const float *q;
    int64_t q_layer_stride;
    const int32_t *q_slot;
    int32_t n_q, n_heads;
    float scale;
    float *out;
} sattn_job;

/* Query heads scored together: the kernel reads each chunk of keys once for
 * all of them (cpu_kern.c's head_scores). */
#define SATTN_GROUP 8

/* One task per (layer, KV head): sums the softmax rows of every captured
 * query of every head in the group into that head's score row. The
 * (query, head) pairs go to the kernel SATTN_GROUP at a time, scored up to
 * the furthest of their causal limits; each row is then normalized over
 * its own limit only, so the sums are those of one pair at a time. */
static void sattn_task(void *ctx, int64_t t, int thread)
{
    sattn_job *j = ctx;
    const dp_kv_layout *l = &j->kv->l;
    const int32_t layer = (int32_t)(t / l->n_kv_heads), kvh = (int32_t)(t % l->n_kv_heads);
    const int32_t group = j->n_heads / l->n_kv_heads, hd = l->head_dim;
    float *o = j->out + (size_t)t * (size_t)j->n_slots;
    float *scratch = j->c->sscratch[thread];
    memset(o, 0, (size_t)j->n_slots * sizeof *o);
    const int32_t pairs = j->n_q * group;
    for (int32_t p0 = 0; p0 < pairs; p0 += SATTN_GROUP) {
        const int32_t np = pairs - p0 < SATTN_GROUP ? pairs - p0 : SATTN_GROUP;
        const float *qs[SATTN_GROUP];
        float *sc[SATTN_GROUP];
        int32_t lim[SATTN_GROUP], nmax = 0;
        for (int32_t k = 0; k < np; k++) {
            const int32_t i = (p0 + k) / group, g = (p0 + k) % group;
            lim[k] = j->q_slot[i] + 1 < j->n_slots ? j->q_slot[i] + 1 : j->n_slots;
            nmax = lim[k] > nmax ? lim[k] : nmax;
            qs[k] = j->q + (size_t)layer * (size_t)j->q_layer_stride +
                    ((size_t)i * (size_t)j->n_heads + (size_t)(kvh * group + g)) * (size_t)hd;
            sc[k] = scratch + (size_t)k * (size_t)j->n_slots;
        }
        j->c->k->head_scores(j->kv, layer, kvh, j->table, nmax, qs, np, j->scale, sc);
        for (int32_t k = 0; k < np; k++)
            j->c->k->softmax_add(sc[k], lim[k], o);
    }
}

void cpu_kv_score_attn(dp_backend *be, const dp_kv_store *kv, const int32_t *table, int32_t n_slots,
                       const float *q, int64_t q_layer_stride, const int32_t *q_slot, int32_t n_q,
                       int32_t n_heads, float scale, float *out)
{
    cpu_backend *c = cpu_of(be);
    if (kv->kivi || ((size_t)n_slots * SATTN_GROUP > c->sscratch_elems &&
        cpu_scratch_reserve(c, c->wscratch_elems, (size_t)n_slots * SATTN_GROUP))) {
        /* No scratch (or a grouped store, never scored): report "no
         * information" (zeros), callers keep sinks and the window regardless. */
        memset(out, 0, (size_t)kv->l.n_layers * kv->l.n_kv_heads * n_slots * sizeof *out);
        return;
    }
    sattn_job j = {c, kv, table, n_slots, q, q_layer_stride, q_slot, n_q, n_heads, scale, out};
    threadpool_run(c->tp, sattn_task, &j, (int64_t)kv->l.n_layers * kv->l.n_kv_heads);
}

typedef struct compact_job {
    const dp_kv_store *src;
    dp_kv_store *dst;
    const dp_compact_seq *seqs;
    int32_t n_seqs;
    int failed; /* a task could not allocate its tile */
} compact_job;

/* Elements of one block's widened rows (K and V each) that compact_task
 * keeps on its stack: 16 tokens of head_dim 256, or 64 of head_dim 64. */
#define COMPACT_TILE 4096

/* Quantized rows of one type move as bytes: a recompression on the decode
 * path keeps each row's scale and values exactly. */
static void compact_bytes(const dp_kv_store *src, dp_kv_store *dst, const dp_compact_seq *q, int32_t layer)
{
    const dp_kv_layout *ls = &src->l, *ld = &dst->l;
    const size_t rb = src->row_bytes;
    for (int32_t h = 0; h < ls->n_kv_heads; h++) {
        const int32_t *keep = q->keep + ((size_t)layer * (size_t)ls->n_kv_heads + (size_t)h) * (size_t)q->n_keep;
        for (int32_t s = 0; s < q->n_keep; s++) {
            const int32_t from = keep[s];
            const int32_t sb = q->src_table[from / ls->block_tokens], db = q->dst_table[s / ld->block_tokens];
            size_t so = kv_qrow_off(src, layer, sb, h, from % ls->block_tokens);
            size_t dof = kv_qrow_off(dst, layer, db, h, s % ld->block_tokens);
            memmove((uint8_t *)dst->k + dof, (const uint8_t *)src->k + so, rb);
            memmove((uint8_t *)dst->v + dof, (const uint8_t *)src->v + so, rb);
        }
    }
}

/* f32 to f32 or f16 to f16: elements move as they are (K one element per
 * dimension of the transposed block, V a row). */
static void compact_same(const dp_kv_store *src, dp_kv_store *dst, const dp_compact_seq *q, int32_t layer)
{
    const dp_kv_layout *ls = &src->l, *ld = &dst->l;
    const int32_t hd = ls->head_dim;
    const size_t es = src->es, sbt = (size_t)ls->block_tokens, dbt = (size_t)ld->block_tokens;
    for (int32_t h = 0; h < ls->n_kv_heads; h++) {
        const int32_t *keep = q->keep + ((size_t)layer * (size_t)ls->n_kv_heads + (size_t)h) * (size_t)q->n_keep;
        for (int32_t s = 0; s < q->n_keep; s++) {
            const int32_t from = keep[s];
            const size_t so = kv_head_off(src, layer, q->src_table[from / ls->block_tokens], h);
            const size_t dof = kv_head_off(dst, layer, q->dst_table[s / ld->block_tokens], h);
            const size_t st = (size_t)(from % ls->block_tokens), dt = (size_t)(s % ld->block_tokens);
            /* Element by element (a recompression within one store may
             * copy a row onto itself). */
            if (es == 2) {
                const uint16_t *sk = (const uint16_t *)src->k + so + st;
                uint16_t *dk = (uint16_t *)dst->k + dof + dt;
                for (int32_t d = 0; d < hd; d++)
                    dk[(size_t)d * dbt] = sk[(size_t)d * sbt];
            } else {
                const float *sk = (const float *)src->k + so + st;
                float *dk = (float *)dst->k + dof + dt;
                for (int32_t d = 0; d < hd; d++)
                    dk[(size_t)d * dbt] = sk[(size_t)d * sbt];
            }
            memmove((uint8_t *)dst->v + (dof + dt * (size_t)hd) * es,
                    (const uint8_t *)src->v + (so + st * (size_t)hd) * es, (size_t)hd * es);
        }
    }
}

/* Any other pair of types: through f32 rows (exact when widening; quantized
 * on the way into a q8_0 / q4_0 store). A source block's rows are widened
 * once by the level's kernel, for every kept row it holds. */
static void compact_convert(const dp_kv_store *src, dp_kv_store *dst, const dp_compact_seq *q, int32_t layer)
{
    const dp_kv_layout *ls = &src->l, *ld = &dst->l;
    const int32_t hd = ls->head_dim, sbt = ls->block_tokens;
    const cpu_kern *kern = cpu_kern_get();
    const bool tile = (size_t)sbt * (size_t)hd <= COMPACT_TILE;
    float kt[COMPACT_TILE], vt[COMPACT_TILE];
    for (int32_t h = 0; h < ls->n_kv_heads; h++) {
        const int32_t *keep = q->keep + ((size_t)layer * (size_t)ls->n_kv_heads + (size_t)h) * (size_t)q->n_keep;
        int32_t cur = -1; /* the source block whose rows kt / vt hold */
        for (int32_t s = 0; s < q->n_keep; s++) {
            const int32_t from = keep[s];
            const int32_t sb = q->src_table[from / sbt], db = q->dst_table[s / ld->block_tokens];
            const int32_t st = from % sbt, dt = s % ld->block_tokens;
            const float *k = kt, *v = vt;
            if (tile) {
                if (from / sbt != cur) {
                    kern->kv_rows(src, layer, sb, h, sbt, kt, vt);
                    cur = from / sbt;
                }
                k = kt + (size_t)st * (size_t)hd;
                v = vt + (size_t)st * (size_t)hd;
            } else {
                kv_kget(src, layer, sb, h, st, kt);
                kv_vget(src, layer, sb, h, st, vt);
            }
            if (dst->qtype) {
                const size_t o = kv_qrow_off(dst, layer, db, h, dt);
                kern->kv_quant_row(dst->qtype, k, (uint8_t *)dst->k + o, hd);
                kern->kv_quant_row(dst->qtype, v, (uint8_t *)dst->v + o, hd);
            } else {
                kv_kput(dst, layer, db, h, dt, k);
                kv_vput(dst, layer, db, h, dt, v);
            }
        }
    }
}

/* Into a grouped (kivi4) store: each destination block takes n_keep's next
 * whole group of kept rows, gathered as f32 and quantized at once (keys per
 * channel over the group, values per row). Source blocks (f32 / f16 /
 * quantized rows) are widened once by the level's kernel. */
static int compact_group(const dp_kv_store *src, dp_kv_store *dst, const dp_compact_seq *q,
                         int32_t layer)
{
    const dp_kv_layout *ls = &src->l;
    const int32_t hd = ls->head_dim, sbt = ls->block_tokens, g = dst->l.block_tokens;
    const cpu_kern *kern = cpu_kern_get();
    const size_t vrow = kivi_vrow_bytes(hd);
    float *tk = malloc(sizeof(float) * (size_t)hd * (size_t)(2 * sbt + 2 * g));
    if (!tk)
        return DP_ENOMEM;
    float *tv = tk + (size_t)sbt * hd, *gk = tv + (size_t)sbt * hd, *gv = gk + (size_t)g * hd;
    for (int32_t h = 0; h < ls->n_kv_heads; h++) {
        const int32_t *keep = q->keep + ((size_t)layer * (size_t)ls->n_kv_heads + (size_t)h) * (size_t)q->n_keep;
        int32_t cur = -1;
        for (int32_t s0 = 0; s0 < q->n_keep; s0 += g) {
            for (int32_t s = 0; s < g; s++) {
                const int32_t from = keep[s0 + s];
                if (from / sbt != cur) {
                    cur = from / sbt;
                    kern->kv_rows(src, layer, q->src_table[cur], h, sbt, tk, tv);
                }
                memcpy(gk + (size_t)s * hd, tk + (size_t)(from % sbt) * hd, (size_t)hd * sizeof(float));
                memcpy(gv + (size_t)s * hd, tv + (size_t)(from % sbt) * hd, (size_t)hd * sizeof(float));
            }
            const size_t o = kv_kivi_off(dst, layer, q->dst_table[s0 / g], h);
            kivi_quant_k(gk, g, hd, (uint8_t *)dst->k + o);
            for (int32_t t = 0; t < g; t++)
                kivi_quant_vrow(gv + (size_t)t * hd, hd, (uint8_t *)dst->v + o + (size_t)t * vrow);
        }
    }
    free(tk);
    return 0;
}

/* One task per (sequence, layer): copies each head's kept rows. */
static void compact_task(void *ctx, int64_t t, int thread)
{
    (void)thread;
    compact_job *j = ctx;
    const dp_compact_seq *q = &j->seqs[t / j->dst->l.n_layers];
    const int32_t layer = (int32_t)(t % j->dst->l.n_layers);
    if (j->dst->kivi) {
        if (compact_group(j->src, j->dst, q, layer))
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    } else if (j->src->qtype && j->src->qtype == j->dst->qtype) {
        compact_bytes(j->src, j->dst, q, layer);
    } else if (!j->src->qtype && !j->dst->qtype && j->src->es == j->dst->es) {
        compact_same(j->src, j->dst, q, layer);
    } else {
        compact_convert(j->src, j->dst, q, layer);
    }
}

int cpu_kv_compact(dp_backend *be, const dp_kv_store *src, dp_kv_store *dst,
                   const dp_compact_seq *seqs, int32_t n_seqs)
{
    const dp_kv_layout *ld = &dst->l;
    const int rc = kv_compact_check(&src->l, ld, src->kivi, dst->kivi, seqs, n_seqs);
    if (rc)
        return rc;
    compact_job j = {src, dst, seqs, n_seqs, 0};
    threadpool_run(cpu_of(be)->tp, compact_task, &j, (int64_t)n_seqs * ld->n_layers);
    return j.failed ? DP_ENOMEM : 0;
}

/* Host copies of one block: per layer, K then V ([kv_head][token][dim]). */
static int block_copy(const dp_kv_store *kv, int32_t block, void *host, const void *from_host)
{
    const dp_kv_layout *l = &kv->l;
    if (block < 0 || block >= l->n_blocks)
        return DP_EINVAL;
    /* The block's own bytes (a view's blocks may use less than their stride). */
    size_t per = kv->kivi ? (size_t)l->n_kv_heads * cpu_kivi_head_bytes(l)
                          : (size_t)l->n_kv_heads * (size_t)l->block_tokens * kv->row_bytes;
    for (int32_t layer = 0; layer < l->n_layers; layer++) {
        size_t o = ((size_t)layer * (size_t)l->n_blocks + (size_t)block) * kv->blk_bytes;
        uint8_t *k = (uint8_t *)kv->k + o, *v = (uint8_t *)kv->v + o;
        uint8_t *h = (uint8_t *)(from_host ? (void *)(uintptr_t)from_host : host) + (size_t)layer * 2 * per;
        if (from_host) {
            memcpy(k, h, per);
            memcpy(v, h + per, per);
        } else {
            memcpy(h, k, per);
            memcpy(h + per, v, per);
        }
    }
    return 0;
}

int cpu_kv_block_read(dp_backend *be, const dp_kv_store *kv, int32_t block, void *host)
{
    return block_copy(kv, block, host, NULL);
}

int cpu_kv_block_write(dp_backend *be, dp_kv_store *kv, int32_t block, const void *host)
{
    return block_copy(kv, block, NULL, host);
}
