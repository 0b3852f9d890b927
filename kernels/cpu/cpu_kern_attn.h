/* cpu_kern_attn.h: attention and the importance scorers over the paged KV
 * stores (f32 / f16 read in place with K transposed, q8_0 / q4_0 rows
 * dequantized a tile at a time).
 *
 * Not a header of its own: cpu_kern.c includes it once per instruction-set
 * level, so that these kernels compile at that level's flags, as
 * cpu_x8.h. */

/* ---- Attention and the scorer over paged, transposed K blocks. ---- */

/* n (<= VW) consecutive elements of K or V from element i of base (es bytes
 * each: 4 f32, 2 f16), as f32, zeros past n. */
static inline vf kv_loadv(const void *base, size_t es, size_t i, int32_t n)
{
    if (es == 4)
        return n == VW ? vf_load((const float *)base + i) : vf_loadn((const float *)base + i, n);
    const uint16_t *p = (const uint16_t *)base + i;
    if (n == VW)
        return vf_load_h(p);
    uint16_t tmp[VW] = {0};
    memcpy(tmp, p, (size_t)n * sizeof *p);
    return vf_load_h(tmp);
}

/* Where a chunk of at most VW keys of one head is read from: K transposed
 * (element (d, t) at k + d * kd + t) and V rows (element (t, d) at
 * v + t * hd + d), es bytes per element. An f32 / f16 store is read in
 * place. A quantized store's rows are quantized per token, so its K cannot
 * be read transposed: the chunk's K and V rows are dequantized into the
 * tile's buffers (rows: K as rows too, scored one token at a time). */
#define KV_TILE_HD 256 /* the widest head the tile holds */
typedef struct kv_chunk {
    const void *k, *v;
    size_t es, kd;
    bool rows; /* K rows at kr (quantized stores) */
    /* Quantized stores (head_dim <= KV_TILE_HD: kv_block_bytes) and f16
     * values widened for several heads (chunk_widen_values). */
    float kr[VW * KV_TILE_HD], vt[VW * KV_TILE_HD];
} kv_chunk;

/* One quantized row of head_dim values (q8_0 or q4_0 blocks) as f32. */
static inline void qrow_load(uint32_t qtype, const uint8_t *src, int32_t hd, float *dst)
{
    vf w[NBV];
    for (int32_t b = 0; b < hd / 32; b++) {
        if (qtype == DP_TYPE_Q8_0)
            blk_q8_0(src + (size_t)b * 34, w);
        else
            blk_q4_0(src + (size_t)b * 18, w);
        for (int j = 0; j < NBV; j++)
            vf_store(dst + (size_t)b * 32 + (size_t)j * VW, w[j]);
    }
}

static inline void chunk_load(kv_chunk *ch, const dp_kv_store *kv, int32_t layer, int32_t blk,
                              int32_t kvh, int32_t c0, int32_t nl)
{
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens;
    if (!kv->qtype) {
        const size_t ho = kv_head_off(kv, layer, blk, kvh);
        ch->k = (const uint8_t *)kv->k + (ho + (size_t)c0) * kv->es;
        ch->v = (const uint8_t *)kv->v + (ho + (size_t)c0 * (size_t)hd) * kv->es;
        ch->es = kv->es;
        ch->kd = (size_t)bt;
        ch->rows = false;
        return;
    }
    /* A head's rows of one block are consecutive (kv_qrow_off). */
    const size_t o = kv_qrow_off(kv, layer, blk, kvh, c0);
    const uint8_t *kq = (const uint8_t *)kv->k + o, *vq = (const uint8_t *)kv->v + o;
    for (int32_t t = 0; t < nl; t++) {
        qrow_load(kv->qtype, kq + (size_t)t * kv->row_bytes, hd, ch->kr + (size_t)t * (size_t)hd);
        qrow_load(kv->qtype, vq + (size_t)t * kv->row_bytes, hd, ch->vt + (size_t)t * (size_t)hd);
    }
    ch->k = ch->kr;
    ch->v = ch->vt;
    ch->es = 4;
    ch->kd = (size_t)hd;
    ch->rows = true;
}

/* Queries scored together against one chunk of an f32 / f16 store's keys
 * (k_head_scores). */
#if VW == 16
#define HS_TILE 8 /* 32 vector registers: 16 sums, 2 K columns */
#else
#define HS_TILE 4 /* 16 registers: 8 sums, 2 K columns */
#endif

/* VW scores (scaled) of each of nt queries against a transposed K chunk's
 * first nl keys, into out[0, nt): the even and odd dimensions summed apart,
 * then added. One pair of K columns is loaded and widened for all nt
 * queries (nt is a constant at each call, so the sums stay in registers). */
static inline void chunk_scores_cols(const kv_chunk *ch, int32_t hd, int32_t nl,
                                     const float *const *q, int nt, float scale, vf *out)
{
    const float *qt[HS_TILE]; /* held in registers, not read through q each step */
    vf a0[HS_TILE], a1[HS_TILE];
    for (int t = 0; t < nt; t++) {
        qt[t] = q[t];
        a0[t] = vf_zero();
        a1[t] = vf_zero();
    }
    int32_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        const vf k0 = kv_loadv(ch->k, ch->es, (size_t)d * ch->kd, nl);
        const vf k1 = kv_loadv(ch->k, ch->es, (size_t)(d + 1) * ch->kd, nl);
        for (int t = 0; t < nt; t++) {
            a0[t] = vf_fma(vf_set1(qt[t][d]), k0, a0[t]);
            a1[t] = vf_fma(vf_set1(qt[t][d + 1]), k1, a1[t]);
        }
    }
    for (; d < hd; d++) {
        const vf k0 = kv_loadv(ch->k, ch->es, (size_t)d * ch->kd, nl);
        for (int t = 0; t < nt; t++)
            a0[t] = vf_fma(vf_set1(qt[t][d]), k0, a0[t]);
    }
    const vf vs = vf_set1(scale);
    for (int t = 0; t < nt; t++)
        out[t] = vf_mul(vf_add(a0[t], a1[t]), vs);
}

/* VW scores (scaled) of q against the chunk's first nl keys (lanes past nl:
 * unspecified, the callers mask them). */
static inline vf chunk_scores(const kv_chunk *ch, int32_t hd, int32_t nl, const float *q, float scale)
{
    if (ch->rows) {
        /* head_dim is a multiple of 32 here (the quantized row types'
         * blocks), hence of VW. */
        float sc[VW] = {0};
        for (int32_t t = 0; t < nl; t++) {
            const float *kr = ch->kr + (size_t)t * (size_t)hd;
            vf a0 = vf_zero(), a1 = vf_zero();
            for (int32_t d = 0; d < hd; d += 2 * VW) {
                a0 = vf_fma(vf_load(q + d), vf_load(kr + d), a0);
                a1 = vf_fma(vf_load(q + d + VW), vf_load(kr + d + VW), a1);
            }
            sc[t] = vf_hsum(vf_add(a0, a1));
        }
        return vf_mul(vf_load(sc), vf_set1(scale));
    }
    vf s;
    chunk_scores_cols(ch, hd, nl, &q, 1, scale, &s);
    return s;
}

/* The online softmax's state for a group of query heads (k_attend). */
typedef struct attend_state {
    float mx[16], sum[16]; /* group <= MAX_GROUP (16) */
} attend_state;

static inline void attend_begin(attend_state *st, int32_t hd, float *const *outs, int32_t group)
{
    for (int32_t g = 0; g < group; g++) {
        st->mx[g] = -INFINITY;
        st->sum[g] = 0.0f;
        memset(outs[g], 0, (size_t)hd * sizeof(float)); /* accumulated in place */
    }
}

/* nv (a constant where inlined) whole vectors of dimensions from d: the
 * chunk's keys in order, each key's weight broadcast once for all nv
 * sums. */
static inline __attribute__((always_inline)) void attend_values_nv(const kv_chunk *ch, int32_t hd,
                                                                   int32_t nl, const float *p,
                                                                   float *acc, int32_t d, int nv)
{
    vf a[8];
    for (int j = 0; j < nv; j++)
        a[j] = vf_load(acc + d + j * VW);
    for (int32_t t = 0; t < nl; t++) {
        const vf pt = vf_set1(p[t]);
        for (int j = 0; j < nv; j++)
            a[j] = vf_fma(pt, kv_loadv(ch->v, ch->es, (size_t)t * hd + (size_t)(d + j * VW), VW),
                          a[j]);
    }
    for (int j = 0; j < nv; j++)
        vf_store(acc + d + j * VW, a[j]);
}

/* acc += the chunk's value rows weighted by p. Up to 8 vectors of
 * dimensions are summed side by side, the keys in the outer loop: one
 * vector at a time made each a chain of nl dependent multiply-adds, and
 * the chains' latency bound the attention (nearly half its time at
 * decode batch 32). Each dimension's sum still runs over the keys in
 * order from acc: the same bits. */
static inline void attend_values(const kv_chunk *ch, int32_t hd, int32_t nl, const float *p,
                                 float *acc)
{
    int32_t d = 0;
    for (; d + 8 * VW <= hd; d += 8 * VW)
        attend_values_nv(ch, hd, nl, p, acc, d, 8);
    if (d + 4 * VW <= hd) {
        attend_values_nv(ch, hd, nl, p, acc, d, 4);
        d += 4 * VW;
    }
    for (; d < hd; d += VW) {
        const int32_t nd = hd - d < VW ? hd - d : VW;
        vf a = nd == VW ? vf_load(acc + d) : vf_loadn(acc + d, nd);
        for (int32_t t = 0; t < nl; t++)
            a = vf_fma(vf_set1(p[t]), kv_loadv(ch->v, ch->es, (size_t)t * hd + (size_t)d, nd), a);
        if (nd == VW)
            vf_store(acc + d, a);
        else
            vf_storen(acc + d, a, nd);
    }
}

/* One head's scores s (scaled) of a loaded chunk of nl keys into its
 * running sums: the online softmax, then the chunk's values weighted. */
static inline void attend_head(attend_state *st, const kv_chunk *ch, int32_t hd, int32_t nl, vf s,
                               int32_t g, float *acc)
{
    float p[VW];
    if (nl < VW) {
        /* Lanes past the last key take no part in max or sum. */
        vf_store(p, s);
        for (int32_t t = nl; t < VW; t++)
            p[t] = -INFINITY;
        s = vf_load(p);
    }
    const float bm = vf_hmax(s);
    if (bm > st->mx[g]) {
        /* A new maximum rescales what was accumulated so far. */
        const float r = st->mx[g] == -INFINITY ? 0.0f : expf(st->mx[g] - bm);
        st->sum[g] *= r;
        const vf vr = vf_set1(r);
        int32_t d = 0;
        for (; d + VW <= hd; d += VW)
            vf_store(acc + d, vf_mul(vf_load(acc + d), vr));
        for (; d < hd; d++)
            acc[d] *= r;
        st->mx[g] = bm;
    }
    const vf e = vf_exp_neg(vf_sub(s, vf_set1(st->mx[g])));
    vf_store(p, e);
    for (int32_t t = nl; t < VW; t++)
        p[t] = 0.0f;
    float es = 0.0f;
    for (int32_t t = 0; t < nl; t++)
        es += p[t];
    st->sum[g] += es;
    attend_values(ch, hd, nl, p, acc);
}

/* The scores of every query head of a group against a loaded chunk. From
 * an f32 / f16 store the heads are scored HS_TILE at a time: one load and
 * widening of each K column serves them all, and their independent sums
 * fill the multiply-add pipeline that one head's two chains leave idle (the
 * chunk was latency-bound: a third of the served step at 32 streams). Each
 * head's sums run in the order chunk_scores runs them: the same bits. */
static inline void chunk_scores_group(const kv_chunk *ch, int32_t hd, int32_t nl,
                                      const float *const *qs, int32_t group, float scale, vf *s)
{
    if (ch->rows) {
        for (int32_t g = 0; g < group; g++)
            s[g] = chunk_scores(ch, hd, nl, qs[g], scale);
        return;
    }
    for (int32_t g0 = 0; g0 < group; g0 += HS_TILE) {
        switch (group - g0 < HS_TILE ? group - g0 : HS_TILE) {
        case 1: chunk_scores_cols(ch, hd, nl, qs + g0, 1, scale, s + g0); break;
        case 2: chunk_scores_cols(ch, hd, nl, qs + g0, 2, scale, s + g0); break;
        case 3: chunk_scores_cols(ch, hd, nl, qs + g0, 3, scale, s + g0); break;
#if HS_TILE == 8
        case 4: chunk_scores_cols(ch, hd, nl, qs + g0, 4, scale, s + g0); break;
        case 5: chunk_scores_cols(ch, hd, nl, qs + g0, 5, scale, s + g0); break;
        case 6: chunk_scores_cols(ch, hd, nl, qs + g0, 6, scale, s + g0); break;
        case 7: chunk_scores_cols(ch, hd, nl, qs + g0, 7, scale, s + g0); break;
#endif
        default: chunk_scores_cols(ch, hd, nl, qs + g0, HS_TILE, scale, s + g0); break;
        }
    }
}

/* An f16 chunk's values widened once into the tile, for the several heads
 * that read them (each head widened them again before): the same floats.
 * f16 heads wider than the tile (the store allows 1024) are read in
 * place. */
static inline void chunk_widen_values(kv_chunk *ch, int32_t hd, int32_t nl)
{
    if (ch->es != 2 || hd > KV_TILE_HD)
        return;
    const uint16_t *v = (const uint16_t *)ch->v;
    const int32_t n = nl * hd; /* the chunk's rows are consecutive */
    int32_t i = 0;
    for (; i + VW <= n; i += VW)
        vf_store(ch->vt + i, vf_load_h(v + i));
    for (; i < n; i++)
        ch->vt[i] = kv_h2f(v[i]);
    ch->v = ch->vt;
    ch->es = 4;
}

/* One loaded chunk of nl keys into every query head's running sums. */
static inline void attend_chunk(attend_state *st, kv_chunk *ch, int32_t hd, int32_t nl,
                                const float *const *qs, float *const *outs, int32_t group,
                                float scale)
{
    vf s[16]; /* group <= MAX_GROUP (16) */
    chunk_scores_group(ch, hd, nl, qs, group, scale, s);
    if (group > 1)
        chunk_widen_values(ch, hd, nl);
    for (int32_t g = 0; g < group; g++)
        attend_head(st, ch, hd, nl, s[g], g, outs[g]);
}

/* kivi4 groups: keys are never made floats. A score is
 * sum_c q[c] (m[c] + code[c] d[c]) = sum_c (q[c] d[c]) code[c] + sum_c q[c] m[c],
 * so per group each head's query is scaled by the channels' d (qd) and its
 * bias taken once, and a chunk's scores are qd's dot products with the
 * codes, each channel's codes converted once for every head of the group.
 * Values are made floats a row at a time into the chunk's tile. */
typedef struct kivi_q {
    float qd[16][256]; /* [group][head_dim] (group <= 16, head_dim <= 256) */
    float bias[16];
} kivi_q;

static inline void kivi_q_set(kivi_q *kq, const uint8_t *kb, int32_t hd, const float *const *qs,
                              int32_t group, float scale)
{
    const uint16_t *kd = (const uint16_t *)kb; /* d[hd], then m[hd] (hd: whole 64s) */
    const vf vs = vf_set1(scale);
    for (int32_t g = 0; g < group; g++) {
        vf b = vf_zero();
        for (int32_t c = 0; c < hd; c += VW) {
            const vf q = vf_load(qs[g] + c);
            vf_store(kq->qd[g] + c, vf_mul(vf_mul(q, vf_load_h(kd + c)), vs));
            b = vf_fma(q, vf_load_h(kd + hd + c), b);
        }
        kq->bias[g] = vf_hsum(b) * scale;
    }
}

/* The scores of heads h0 .. h0 + nh (nh <= 4, a constant where this is
 * inlined, so that the sums stay in registers) against a chunk of a group's
 * keys: each channel's codes converted once for all of them. */
static inline void kivi_scores(const kivi_q *kq, const uint8_t *kb, int32_t hd, int32_t g,
                               int32_t c0, int32_t nl, int32_t h0, int nh, vf *out)
{
    const uint8_t *codes = kb + (size_t)hd * 4;
    uint8_t part[VW / 2] = {0}; /* a short chunk's codes: no read past the group's */
    vf a[4];
    for (int h = 0; h < nh; h++)
        a[h] = vf_set1(kq->bias[h0 + h]);
    for (int32_t c = 0; c < hd; c++) {
        const uint8_t *row = codes + (size_t)c * (size_t)(g / 2) + c0 / 2;
        if (nl < VW) {
            memcpy(part, row, (size_t)(nl + 1) / 2);
            row = part;
        }
        const vf x = vf_load_nib(row);
        for (int h = 0; h < nh; h++)
            a[h] = vf_fma(vf_set1(kq->qd[h0 + h][c]), x, a[h]);
    }
    for (int h = 0; h < nh; h++)
        out[h] = a[h];
}

static inline void attend_kivi_chunk(attend_state *st, kv_chunk *ch, const kivi_q *kq,
                                     const dp_kv_store *kv, const uint8_t *kb, const uint8_t *vb,
                                     int32_t c0, int32_t nl, float *const *outs, int32_t group)
{
    const int32_t hd = kv->l.head_dim;
    vf s[16];
    for (int32_t h0 = 0; h0 < group; h0 += 4) {
        switch (group - h0 < 4 ? group - h0 : 4) {
        case 1: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 1, s + h0); break;
        case 2: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 2, s + h0); break;
        case 3: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 3, s + h0); break;
        default: kivi_scores(kq, kb, hd, kv->l.block_tokens, c0, nl, h0, 4, s + h0); break;
        }
    }
    const size_t vrow = kivi_vrow_bytes(hd);
    for (int32_t t = 0; t < nl; t++) {
        const uint8_t *r = vb + (size_t)(c0 + t) * vrow;
        const uint16_t *sm = (const uint16_t *)r; /* d, m per KIVI_VGROUP channels */
        const uint8_t *vc = r + (size_t)hd / KIVI_VGROUP * 4;
        float *dst = ch->vt + (size_t)t * (size_t)hd;
        for (int32_t j = 0; j < hd / KIVI_VGROUP; j++) {
            const vf d = vf_set1(kv_h2f(sm[2 * j])), m = vf_set1(kv_h2f(sm[2 * j + 1]));
            for (int32_t c = j * KIVI_VGROUP; c < (j + 1) * KIVI_VGROUP; c += VW)
                vf_store(dst + c, vf_fma(vf_load_nib(vc + c / 2), d, m));
        }
    }
    ch->v = ch->vt;
    ch->es = 4;
    for (int32_t h = 0; h < group; h++)
        attend_head(st, ch, hd, nl, s[h], h, outs[h]);
}

/* Slots [0, n) of a kivi4 store's groups, table[i] the i-th group. */
static void attend_groups(attend_state *st, kv_chunk *ch, kivi_q *kq, const dp_kv_store *kv,
                          int32_t layer, int32_t kvh, const int32_t *table, int32_t n,
                          const float *const *qs, float *const *outs, int32_t group, float scale)
{
    const int32_t hd = kv->l.head_dim, g = kv->l.block_tokens;
    for (int32_t done = 0; done < n;) {
        const size_t o = kv_kivi_off(kv, layer, table[done / g], kvh);
        const uint8_t *kb = (const uint8_t *)kv->k + o, *vb = (const uint8_t *)kv->v + o;
        kivi_q_set(kq, kb, hd, qs, group, scale);
        const int32_t end = done - done % g + g < n ? done - done % g + g : n;
        while (done < end) {
            const int32_t c0 = done % g, nl = end - done < VW ? end - done : VW;
            attend_kivi_chunk(st, ch, kq, kv, kb, vb, c0, nl, outs, group);
            done += nl;
        }
    }
}

static inline void attend_end(const attend_state *st, int32_t hd, float *const *outs, int32_t group)
{
    for (int32_t g = 0; g < group; g++) {
        const float inv = 1.0f / st->sum[g];
        for (int32_t d = 0; d < hd; d++)
            outs[g][d] *= inv;
    }
}

/* Slots [s0, s1) of a table whose blocks are consecutive runs of bt slots
 * of kv, from block index b0 on (slot s0 at token t0 of that block). */
static inline void attend_run(attend_state *st, kv_chunk *ch, const dp_kv_store *kv, int32_t layer,
                              int32_t kvh, const int32_t *table, int32_t t0, int32_t n,
                              const float *const *qs, float *const *outs, int32_t group, float scale)
{
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens;
    for (int32_t done = 0; done < n;) {
        const int32_t q = t0 + done, blk = table[q / bt], c0 = q % bt;
        int32_t nl = bt - c0 < VW ? bt - c0 : VW;
        nl = n - done < nl ? n - done : nl;
        chunk_load(ch, kv, layer, blk, kvh, c0, nl); /* once for the whole group */
        attend_chunk(st, ch, hd, nl, qs, outs, group, scale);
        done += nl;
    }
}

/* Slots [first, n_slots) (first > 0: a sliding window's; the blocks
 * before it are not read). */
static void k_attend(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                     int32_t first, int32_t n_slots, const float *const *qs, float *const *outs,
                     int32_t group, float scale)
{
    attend_state st;
    kv_chunk ch;
    attend_begin(&st, kv->l.head_dim, outs, group);
    attend_run(&st, &ch, kv, layer, kvh, table, first, n_slots - first, qs, outs, group, scale);
    attend_end(&st, kv->l.head_dim, outs, group);
}

/* nt consecutive tokens of one sequence (a prompt chunk: token t sees
 * slots [0, n_slots[t]), n_slots increasing by one), each with `group`
 * query heads (qs and outs: token-major), against an f32 / f16 / q8_0 /
 * q4_0 store. Each chunk of keys is loaded, dequantized or widened once
 * for every token that sees it, and their heads are scored together (one
 * token at a time loaded and widened every chunk again for each token of
 * a prompt). Each token's chunks are those k_attend would take (they
 * start at the same slots; its last one ends at its own length), each
 * head's scores run in chunk_scores' order, and lanes past a token's
 * length are masked as in k_attend: every output has k_attend's bits. */
static void k_attend_tile(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                          const int32_t *n_slots, int32_t nt, const float *const *qs,
                          float *const *outs, int32_t group, float scale)
{
    attend_state st[CPU_ATTN_TILE];
    kv_chunk ch;
    vf s[CPU_ATTN_TILE * 16];
    const int32_t hd = kv->l.head_dim, bt = kv->l.block_tokens, n = n_slots[nt - 1];
    for (int32_t t = 0; t < nt; t++)
        attend_begin(&st[t], hd, outs + (size_t)t * (size_t)group, group);
    int32_t t0 = 0; /* the first token that sees the chunk */
    for (int32_t done = 0; done < n;) {
        const int32_t blk = table[done / bt], c0 = done % bt;
        int32_t nl = bt - c0 < VW ? bt - c0 : VW;
        nl = n - done < nl ? n - done : nl;
        while (n_slots[t0] <= done)
            t0++;
        chunk_load(&ch, kv, layer, blk, kvh, c0, nl);
        chunk_scores_group(&ch, hd, nl, qs + (size_t)t0 * (size_t)group, (nt - t0) * group, scale,
                           s);
        chunk_widen_values(&ch, hd, nl);
        for (int32_t t = t0; t < nt; t++) {
            const int32_t nlt = n_slots[t] - done < nl ? n_slots[t] - done : nl;
            for (int32_t g = 0; g < group; g++)
                attend_head(&st[t], &ch, hd, nlt, s[(t - t0) * group + g], g,
                            outs[(size_t)t * (size_t)group + (size_t)g]);
        }
        done += nl;
    }
    for (int32_t t = 0; t < nt; t++)
        attend_end(&st[t], hd, outs + (size_t)t * (size_t)group, group);
}

/* A grouped store's sequence (backend.h seq_sealed): its lead in the
 * arena's block at table[0], its sealed groups, then its residual in the
 * arena's blocks that follow them in the table. sealed INT32_MAX: every
 * slot a group's, from table[0]. */
static void k_attend_grouped(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                             int32_t n_slots, int32_t sealed, int32_t roff, const float *const *qs,
                             float *const *outs, int32_t group, float scale)
{
    attend_state st;
    kv_chunk ch;
    const int32_t bbt = kv->base->l.block_tokens, G = kv->l.block_tokens;
    const int32_t lead = sealed == INT32_MAX ? 0 : dp_kv_group_lead(bbt, sealed);
    const int32_t ns = n_slots < sealed ? n_slots : sealed;
    attend_begin(&st, kv->l.head_dim, outs, group);
    if (lead > 0)
        attend_run(&st, &ch, kv->base, layer, kvh, table, 0, ns < lead ? ns : lead, qs, outs,
                   group, scale);
    kivi_q kq;
    attend_groups(&st, &ch, &kq, kv, layer, kvh, table + (lead > 0), ns - lead, qs, outs, group,
                  scale);
    if (n_slots > sealed)
        attend_run(&st, &ch, kv->base, layer, kvh, table + dp_kv_group_rstart(bbt, G, sealed),
                   roff, n_slots - sealed, qs, outs, group, scale);
    attend_end(&st, kv->l.head_dim, outs, group);
}

/* Scaled scores of nq queries against slots [0, n) of one head: row j into
 * sc[j], each the sums chunk_scores makes, in its order (so one query's
 * scores do not depend on the others). A chunk of keys is loaded once for
 * all of them and, from an f32 / f16 store, read HS_TILE queries at a time:
 * each widened pair of K columns feeds 2 x HS_TILE multiply-adds where one
 * query at a time paid a widening and a load per multiply-add. */
static void k_head_scores(const dp_kv_store *kv, int32_t layer, int32_t kvh, const int32_t *table,
                          int32_t n, const float *const *qs, int32_t nq, float scale, float *const *sc)
{
    const dp_kv_layout *l = &kv->l;
    const int32_t hd = l->head_dim, bt = l->block_tokens;
    kv_chunk ch;
    for (int32_t base = 0; base < n; base += bt) {
        const int32_t blk = table[base / bt];
        const int32_t nb = n - base < bt ? n - base : bt;
        for (int32_t c0 = 0; c0 < nb; c0 += VW) {
            const int32_t nl = nb - c0 < VW ? nb - c0 : VW;
            const size_t at = (size_t)base + (size_t)c0;
            chunk_load(&ch, kv, layer, blk, kvh, c0, nl);
            int32_t j0 = 0;
            if (!ch.rows)
                for (; j0 + HS_TILE <= nq; j0 += HS_TILE) {
                    vf s[HS_TILE];
                    chunk_scores_cols(&ch, hd, nl, qs + j0, HS_TILE, scale, s);
                    for (int t = 0; t < HS_TILE; t++) {
                        if (nl == VW)
                            vf_store(sc[j0 + t] + at, s[t]);
                        else
                            vf_storen(sc[j0 + t] + at, s[t], nl);
                    }
                }
            for (int32_t j = j0; j < nq; j++) {
                const vf s = chunk_scores(&ch, hd, nl, qs[j], scale);
                if (nl == VW)
                    vf_store(sc[j] + at, s);
                else
                    vf_storen(sc[j] + at, s, nl);
            }
        }
    }
}
