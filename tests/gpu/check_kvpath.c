/* check_kvpath.c: the GPU checks of the KV cache's ops: KV write and paged
 * attention (every store type, GQA, block boundaries), query capture, the
 * importance scorers, compaction and block copies between the backends. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "model/llama.h"

#include "check_common.h"

/* ---- KV write + attention ------------------------------------------------------------
 * Sequences on one or two stores (different block sizes), with fragmented
 * (shuffled) block tables. A first batch writes each sequence's history
 * (slots 0 .. hist-1, every layer); the checked batch then mixes prefill
 * chunks and decode tokens, writes its own K/V and attends. Attention reads
 * the KV the backend wrote, so kv_write is checked through it. */

typedef struct att_cfg {
    const char *name;
    int32_t n_layers, n_kv, hd, n_heads;
    int32_t bt[2], nb[2]; /* nb[1] == 0: one store */
    int32_t type1;        /* store 1's KV type: 0 the default (f32 / CUDA's f16), else
                           * dp_kv_type + 1 (the quantized decode path) */
    bool view1;           /* store 1 is a view of store 0 in type1 (kv_view: the decode
                           * path in one arena); the two share block ids */
    int32_t window;       /* > 0: a sliding-window layer's (the last window slots) */
} att_cfg;

typedef struct att_seq {
    int32_t store, hist, n_new;
} att_seq;

static void check_attention_case(dp_backend *be[2], const att_cfg *cfg, const att_seq *seqs,
                                 int32_t n_seqs, const int32_t *order, float q_amp,
                                 const char *label)
{
    const int32_t n_stores = cfg->nb[1] ? 2 : 1;
    uint8_t *qimg[2] = {NULL, NULL};
    size_t qbytes = 0;
    int32_t q1 = -1; /* a sequence on store 1 */
    for (int32_t i = 0; i < n_seqs && q1 < 0; i++)
        if (seqs[i].store == 1 && seqs[i].hist > 0)
            q1 = i;
    if (cfg->type1 && q1 < 0)
        die(EXIT_SETUP, "%s", "attention case: a quantized store without history");
    /* Block tables: each store's block ids shuffled, handed out in turn. */
    int32_t *ids[2] = {NULL, NULL}, next[2] = {0, 0};
    for (int s = 0; s < n_stores; s++) {
        ids[s] = xmalloc((size_t)cfg->nb[s] * sizeof(int32_t));
        for (int32_t i = 0; i < cfg->nb[s]; i++)
            ids[s][i] = i;
        shuffle_ids(ids[s], cfg->nb[s]);
    }
    /* A view's blocks are its base's: one list of ids, one cursor. */
    int32_t *const next_of[2] = {&next[0], cfg->view1 ? &next[0] : &next[1]};
    int32_t max_blocks = 1, n_hist = 0, n_new = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t nb = (seqs[i].hist + seqs[i].n_new + cfg->bt[seqs[i].store] - 1) / cfg->bt[seqs[i].store];
        if (nb > max_blocks)
            max_blocks = nb;
        n_hist += seqs[i].hist;
        n_new += seqs[i].n_new;
    }
    int32_t *tables = calloc((size_t)n_seqs * (size_t)max_blocks, sizeof(int32_t));
    if (!tables)
        die(EXIT_SETUP, "%s", "out of host memory");
    for (int32_t i = 0; i < n_seqs; i++) {
        int s = seqs[i].store;
        int32_t nb = (seqs[i].hist + seqs[i].n_new + cfg->bt[s] - 1) / cfg->bt[s];
        const int32_t *from = ids[cfg->view1 ? 0 : s];
        if (*next_of[s] + nb > cfg->nb[s])
            die(EXIT_SETUP, "%s", "attention case: store too small");
        memcpy(tables + (size_t)i * max_blocks, from + *next_of[s], (size_t)nb * sizeof(int32_t));
        *next_of[s] += nb;
    }
    const size_t kvw = (size_t)cfg->n_kv * cfg->hd, qw = (size_t)cfg->n_heads * cfg->hd;

    /* History batch: every sequence's slots 0 .. hist-1, in sequence order. */
    hbatch hh = {0}, ht;
    if (n_hist > 0) {
        hbatch_alloc(&hh, n_hist, n_seqs, max_blocks);
        int32_t t = 0;
        for (int32_t i = 0; i < n_seqs; i++)
            for (int32_t p = 0; p < seqs[i].hist; p++, t++) {
                hh.seq[t] = i;
                hh.slot[t] = hh.pos[t] = p;
            }
    }
    /* Checked batch: sequences in the given order, each one's new tokens together. */
    hbatch_alloc(&ht, n_new, n_seqs, max_blocks);
    {
        int32_t t = 0;
        for (int32_t oi = 0; oi < n_seqs; oi++) {
            int32_t i = order[oi];
            for (int32_t p = 0; p < seqs[i].n_new; p++, t++) {
                ht.seq[t] = i;
                ht.slot[t] = ht.pos[t] = seqs[i].hist + p;
            }
        }
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        if (n_hist > 0)
            hh.seq_store[i] = (uint8_t)seqs[i].store;
        ht.seq_store[i] = (uint8_t)seqs[i].store;
    }
    if (hh.tables)
        memcpy(hh.tables, tables, (size_t)n_seqs * max_blocks * sizeof(int32_t));
    memcpy(ht.tables, tables, (size_t)n_seqs * max_blocks * sizeof(int32_t));

    const int32_t layer = cfg->n_layers - 1;
    size_t nh = (size_t)n_hist * kvw, nn = (size_t)n_new * kvw;
    float *hk = xmalloc((nh ? nh : 1) * cfg->n_layers * sizeof(float));
    float *hv = xmalloc((nh ? nh : 1) * cfg->n_layers * sizeof(float));
    float *nk = xmalloc(nn * sizeof(float)), *nv = xmalloc(nn * sizeof(float));
    float *q = xmalloc((size_t)n_new * qw * sizeof(float));
    fill(hk, nh * cfg->n_layers, 1.0f);
    fill(hv, nh * cfg->n_layers, 1.0f);
    fill(nk, nn, 1.0f);
    fill(nv, nn, 1.0f);
    fill(q, (size_t)n_new * qw, q_amp);
    const float scale = 1.0f / sqrtf((float)cfg->hd);

    float *o[2];
    for (int b = 0; b < 2; b++) {
        dp_kv_store *st[DP_KV_MAX_STORES] = {NULL, NULL};
        for (int s = 0; s < n_stores; s++) {
            /* (A view's base in f16 on both backends, as the arena is.) */
            dp_kv_layout l = {cfg->n_layers, cfg->n_kv, cfg->hd, cfg->bt[s], cfg->nb[s],
                              s == 1 && cfg->type1 ? (dp_kv_type)(cfg->type1 - 1)
                              : cfg->view1         ? DP_KV_F16
                                                   : DP_KV_F32, 0};
            int rc = s == 1 && cfg->view1 ? be[b]->ops->kv_view(be[b], st[0], &l, &st[1])
                                          : be[b]->ops->kv_create(be[b], &l, &st[s]);
            if (rc)
                die(EXIT_SETUP, "%s: kv_create / kv_view failed", be[b]->ops->name);
        }
        if (n_hist > 0) {
            hbatch_set(be[b], &hh);
            for (int32_t l = 0; l < cfg->n_layers; l++)
                kv_write_host(be[b], st, l, hk + nh * l, hv + nh * l, nh);
        }
        hbatch_set(be[b], &ht);
        kv_write_host(be[b], st, layer, nk, nv, nn);
        float *dq = dev_from(be[b], q, (size_t)n_new * qw);
        float *dout = dev_alloc(be[b], (size_t)n_new * qw);
        dev_poison(be[b], dout, (size_t)n_new * qw);
        be[b]->ops->attention(be[b], st, layer, dout, dq, cfg->n_heads, scale, cfg->window);
        o[b] = xmalloc((size_t)n_new * qw * sizeof(float));
        dev_get(be[b], o[b], dout, (size_t)n_new * qw);
        if (cfg->type1) {
            /* kv_write quantized the same values alike on both: the bytes
             * of store 1's first block of sequence 1 (written by the history
             * batch in every layer and by this one in the last). */
            qimg[b] = block_image(be[b], st[1], tables[(size_t)q1 * max_blocks], &qbytes);
        }
        be[b]->ops->free(be[b], dq);
        be[b]->ops->free(be[b], dout);
        for (int s = n_stores - 1; s >= 0; s--) /* a view before its base */
            be[b]->ops->kv_destroy(be[b], st[s]);
    }
    char what[128];
    snprintf(what, sizeof what, "%s %s: %d tokens", cfg->name, label, n_new);
    report("attention", what, o[0], o[1], (size_t)n_new * qw, TOL_ATT);
    if (cfg->type1) {
        snprintf(what, sizeof what, "%s bytes, %s", dp_kv_type_name(cfg->type1 - 1), label);
        report_same_bytes("kv_write", what, qimg[0], qimg[1], qbytes);
        free(qimg[0]);
        free(qimg[1]);
    }
    free(o[0]);
    free(o[1]);
    free(hk);
    free(hv);
    free(nk);
    free(nv);
    free(q);
    free(tables);
    free(ids[0]);
    free(ids[1]);
    if (n_hist > 0)
        hbatch_free(&hh);
    hbatch_free(&ht);
}

void check_attention(dp_backend *be[2])
{
    /* The quantized stores: both backends quantize the same K and V with
     * the same rounding (the bytes are compared in check_kvpath), and read
     * them back in attention. */
    const att_cfg cfgs[] = {
        {"hd64 gqa8/2 2 stores", 2, 2, 64, 8, {16, 8}, {64, 400}, 0, false, 0},
        {"hd128 mha4", 2, 4, 128, 4, {16, 0}, {256, 0}, 0, false, 0},
        {"hd256 gqa3/1", 1, 1, 256, 3, {32, 0}, {128, 0}, 0, false, 0},
        {"hd80 gqa12/2 2 stores", 2, 2, 80, 12, {16, 4}, {64, 800}, 0, false, 0},
        {"hd64 gqa8/2 q8_0 store", 2, 2, 64, 8, {16, 30}, {64, 400}, DP_KV_Q8_0 + 1, false, 0},
        {"hd128 gqa6/2 q4_0 store", 2, 2, 128, 6, {16, 56}, {64, 400}, DP_KV_Q4_0 + 1, false, 0},
        /* One arena: 16 f16 tokens' bytes hold 30 of q8_0. */
        {"hd64 gqa8/2 q8_0 view of the arena", 2, 2, 64, 8, {16, 30}, {400, 400},
         DP_KV_Q8_0 + 1, true, 0},
        /* Sliding-window layers: Gemma 3's geometry and window, and a
         * window no block or key tile divides, over two stores. */
        {"hd256 gqa4/1 window 512", 1, 1, 256, 4, {16, 0}, {256, 0}, 0, false, 512},
        {"hd64 gqa8/2 2 stores window 37", 2, 2, 64, 8, {16, 8}, {64, 400}, 0, false, 37},
        {"hd64 gqa8/2 q8_0 store window 37", 2, 2, 64, 8, {16, 30}, {64, 400}, DP_KV_Q8_0 + 1,
         false, 37},
    };
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const att_cfg *c = &cfgs[ci];
        const int32_t s1 = c->nb[1] ? 1 : 0;
        /* Long: a decode token over 3000 slots makes the kernel split over
         * the KV length; the prefill chunks cross block boundaries. */
        const att_seq lng[] = {{0, 100, 40}, {s1, 2999, 1}, {s1, 5, 1}, {0, 0, 21}, {0, 0, 1}};
        const int32_t lorder[] = {1, 0, 2, 3, 4};
        check_attention_case(be, c, lng, 5, lorder, 6.0f, "long ctx, prefill+decode");
        /* Short: every context under the split threshold (one pass). */
        const att_seq sht[] = {{0, 100, 40}, {s1, 200, 1}, {s1, 5, 1}, {0, 0, 21}, {0, 0, 1},
                               {0, 31, 1}, {s1, 16, 17}};
        const int32_t sorder[] = {1, 0, 2, 3, 4, 6, 5};
        check_attention_case(be, c, sht, 7, sorder, 2.0f, "short ctx, prefill+decode");
        /* Decode only, several sequences at mixed lengths (one long). */
        const att_seq dec[] = {{0, 7, 1}, {s1, 1500, 1}, {0, 64, 1}, {s1, 0, 1}, {0, 255, 1}};
        const int32_t dorder[] = {0, 1, 2, 3, 4};
        check_attention_case(be, c, dec, 5, dorder, 4.0f, "decode only");
    }
}

/* ---- KV-path ops: capture_rows, importance scores, compaction -------------------------
 * Two sequences' KV is written into a prefill-like store through kv_write
 * (every layer); the scores run over each sequence's slots; kv_compact moves
 * per-head kept rows into a decode-like store with smaller blocks (plus an
 * in-place compaction within the source store), and the result is read back
 * through attention over the destination, which touches every kept K and V. */

typedef struct kvp_seq {
    int32_t n_slots;
    int32_t *src_table, n_src;
    int32_t *dst_table, n_dst;
    int32_t n_keep;
    int32_t *keep; /* [n_layers][n_kv][n_keep] */
} kvp_seq;

void check_capture(dp_backend *be[2])
{
    const int32_t n = 40, dim = 96;
    hbatch hb;
    hbatch_alloc(&hb, n, 1, 1);
    int32_t n_capture = 11, cap[11];
    for (int32_t i = 0; i < n_capture; i++)
        cap[i] = (int32_t)(rnd64() % (uint64_t)n);
    float *x = xmalloc((size_t)n * dim * sizeof *x), *o[2];
    fill(x, (size_t)n * dim, 1.0f);
    for (int b = 0; b < 2; b++) {
        dp_batch bt = {.n_tokens = n, .tokens = hb.tokens, .pos = hb.pos, .seq = hb.seq,
                       .slot = hb.slot, .n_seqs = 1, .seq_store = hb.seq_store,
                       .block_tables = hb.tables, .max_blocks = 1, .n_out = 0,
                       .out_tokens = hb.out_tokens, .n_capture = n_capture, .capture_tokens = cap};
        if (be[b]->ops->batch_set(be[b], &bt))
            die(EXIT_SETUP, "%s: batch_set failed", be[b]->ops->name);
        float *dx = dev_from(be[b], x, (size_t)n * dim), *dout = dev_alloc(be[b], (size_t)n_capture * dim);
        dev_poison(be[b], dout, (size_t)n_capture * dim);
        be[b]->ops->capture_rows(be[b], dout, dx, dim);
        o[b] = xmalloc((size_t)n_capture * dim * sizeof(float));
        dev_get(be[b], o[b], dout, (size_t)n_capture * dim);
        be[b]->ops->free(be[b], dx);
        be[b]->ops->free(be[b], dout);
    }
    report("capture_rows", "n_capture=11 of 40, dim 96", o[0], o[1], (size_t)n_capture * dim, 0.0);
    free(o[0]);
    free(o[1]);
    free(x);
    hbatch_free(&hb);
}

/* Gives each group of 32 values a scale of its own (a power of two from
 * 1/4 to 4), so that a group read with another's scale shows, or makes it
 * one of three edge cases: all zero; exact ties (a 127 sets q8_0's scale to
 * 1, then +-(j + 0.5): each rounds half away from zero); q4_0's clamp (a
 * -4 first sets its scale to 0.5, so every +4 maps to 8, clamped to 7). */
static void vary_groups(float *p, size_t n)
{
    for (size_t g = 0; g + 32 <= n; g += 32) {
        const int k = (int)(rnd64() % 8);
        for (size_t j = 0; j < 32; j++) {
            float *x = &p[g + j];
            if (k == 7)
                *x = 0.0f;
            else if (k == 6)
                *x = j == 0 ? 127.0f : (j % 2 ? -1.0f : 1.0f) * ((float)j + 0.5f);
            else if (k == 5)
                *x = j == 0 || j % 3 == 1 ? -4.0f : 4.0f;
            else
                *x *= ldexpf(1.0f, k - 2);
        }
    }
}

/* A host image of one block of an f16 or f32 store (bytes long) as floats,
 * [layer][K, V][head][token][dim]. A host image is its backend's own block
 * layout (it never crosses backends): the CPU keeps K transposed per head
 * ([head_dim][token], kernels/cpu/cpu_internal.h), so its K goes back to
 * row order ([token][head_dim]) for comparisons. */
static float *image_floats(dp_backend *be, const dp_kv_layout *l, const uint8_t *img, size_t bytes)
{
    const int32_t bt = l->block_tokens, hd = l->head_dim;
    const size_t per = (size_t)l->n_kv_heads * bt * hd, n = 2 * (size_t)l->n_layers * per;
    const size_t es = bytes / n;
    float *out = xmalloc(n * sizeof(float));
    for (size_t e = 0; e < n; e++) {
        uint16_t h;
        if (es == 4) {
            memcpy(&out[e], img + 4 * e, 4);
        } else {
            memcpy(&h, img + 2 * e, 2);
            out[e] = dp_fp16_to_f32(h);
        }
    }
    if (!strcmp(be->ops->name, "cpu")) {
        float *t = xmalloc(per * sizeof(float));
        for (int32_t L = 0; L < l->n_layers; L++) {
            float *k = out + (size_t)L * 2 * per;
            for (int32_t h = 0; h < l->n_kv_heads; h++)
                for (int32_t tk = 0; tk < bt; tk++)
                    for (int32_t d = 0; d < hd; d++)
                        t[((size_t)h * bt + tk) * hd + d] = k[((size_t)h * hd + d) * bt + tk];
            memcpy(k, t, per * sizeof(float));
        }
        free(t);
    }
    return out;
}

/* One block of an f16 or f32 store, read to the host, as image_floats. */
static float *block_floats(dp_backend *be, dp_kv_store *kv, int32_t block)
{
    dp_kv_layout one = *be->ops->kv_layout(be, kv);
    one.n_blocks = 1;
    size_t bytes;
    uint8_t *img = block_image(be, kv, block, &bytes);
    float *out = image_floats(be, &one, img, bytes);
    free(img);
    return out;
}

/* K and V beyond the f16 range: both backends store f16 rows saturated at
 * +-65504 (an inf kept in the cache makes its attention rows NaN on the
 * device while the CPU, in f32, would be fine), with the same bits. */
void check_kv_saturate(dp_backend *be[2])
{
    enum { NKV = 2, HD = 64, BT = 16 };
    const size_t nkv = (size_t)BT * NKV * HD;
    float *k = xmalloc(nkv * sizeof(float)), *v = xmalloc(nkv * sizeof(float));
    fill(k, nkv, 4.0f);
    fill(v, nkv, 4.0f);
    const float big[] = {65504.0f, 65519.0f, 65520.0f, 7e4f, 1e5f, 3e38f, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        k[i * 37 % nkv] = big[i];
        v[i * 53 % nkv] = -big[i];
        k[(i * 91 + 5) % nkv] = -big[i];
        v[(i * 29 + 7) % nkv] = big[i];
    }
    hbatch hb;
    hbatch_alloc(&hb, BT, 1, 1);
    for (int32_t i = 0; i < BT; i++)
        hb.pos[i] = hb.slot[i] = i;
    hb.tables[0] = 0;
    hb.n_out = 1;
    float *img[2];
    for (int b = 0; b < 2; b++) {
        dp_kv_layout l = {1, NKV, HD, BT, 1, DP_KV_F16, 0};
        dp_kv_store *kv;
        if (be[b]->ops->kv_create(be[b], &l, &kv))
            die(EXIT_SETUP, "%s: kv_create (f16) failed", be[b]->ops->name);
        dp_kv_store *st[DP_KV_MAX_STORES] = {kv, NULL};
        hbatch_set(be[b], &hb);
        kv_write_host(be[b], st, 0, k, v, nkv);
        img[b] = block_floats(be[b], kv, 0);
        be[b]->ops->kv_destroy(be[b], kv);
    }
    size_t n = 2 * nkv, nonfinite = 0, differ = 0, at_max = 0;
    for (size_t i = 0; i < n; i++) {
        nonfinite += !isfinite(img[0][i]) || !isfinite(img[1][i]);
        differ += memcmp(&img[0][i], &img[1][i], sizeof(float)) != 0;
        at_max += fabsf(img[1][i]) == 65504.0f;
    }
    const bool ok = nonfinite == 0 && differ == 0 && at_max == 4 * (sizeof big / sizeof big[0]);
    g_checks++;
    g_failed += !ok;
    printf("  %-12s %-46s %zu at +-65504, %zu not finite, %zu differ%s\n", "kv_write",
           "f16 store, K/V beyond the f16 range", at_max, nonfinite, differ, ok ? "  ok" : "  FAIL");
    free(img[0]);
    free(img[1]);
    free(k);
    free(v);
    hbatch_free(&hb);
}

/* dtype: the destination store's type. DP_KV_F32: both stores in the
 * default type (f32 on the CPU, f16 on CUDA). Quantized: the source in f16
 * on both backends and the destination in dtype, so that both quantize the
 * same values: the compacted bytes must be identical, and are read back
 * by knorm over the quantized store and by a compaction back into f16. */
void check_kvpath(dp_backend *be[2], dp_kv_type dtype)
{
    const bool quant = dtype == DP_KV_Q8_0 || dtype == DP_KV_Q4_0;
    uint8_t *qimg[2] = {NULL, NULL};
    size_t qbytes = 0;
    float *qknorm[2] = {NULL, NULL}, *qattn[2] = {NULL, NULL}, *qback[2] = {NULL, NULL};
    const int32_t n_back = 100;
    const int32_t n_layers = 2, n_kv = 2, hd = 64, n_heads = 8, bt_src = 16, bt_dst = 8;
    const int32_t nb_src = 200, nb_dst = 200;
    const size_t kvw = (size_t)n_kv * hd, qw = (size_t)n_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    char what[96];
    /* Sequence 0 long, 1 short, 2 keeps nothing; block ids drawn shuffled. */
    kvp_seq sq[3] = {{.n_slots = 700}, {.n_slots = 45}, {.n_slots = 20}};
    const int32_t keeps[3] = {300, 45, 0};
    int32_t ids_src[200], ids_dst[200], ns = 0, nd = 0;
    for (int32_t i = 0; i < 200; i++)
        ids_src[i] = ids_dst[i] = i;
    shuffle_ids(ids_src, nb_src);
    shuffle_ids(ids_dst, nb_dst);
    int32_t n_hist = 0;
    for (int i = 0; i < 3; i++) {
        sq[i].n_src = (sq[i].n_slots + bt_src - 1) / bt_src;
        sq[i].src_table = ids_src + ns;
        ns += sq[i].n_src;
        sq[i].n_keep = keeps[i];
        sq[i].n_dst = (keeps[i] + bt_dst - 1) / bt_dst;
        sq[i].dst_table = ids_dst + nd;
        nd += sq[i].n_dst;
        n_hist += sq[i].n_slots;
        /* Per (layer, head): a random increasing subset of the slots. */
        sq[i].keep = xmalloc((size_t)n_layers * n_kv * (keeps[i] ? keeps[i] : 1) * sizeof(int32_t));
        for (int32_t lh = 0; lh < n_layers * n_kv; lh++) {
            int32_t need = keeps[i], k = 0;
            for (int32_t s = 0; s < sq[i].n_slots && k < need; s++)
                if ((int64_t)(rnd64() % (uint64_t)(sq[i].n_slots - s)) < need - k)
                    sq[i].keep[(size_t)lh * keeps[i] + k++] = s;
        }
    }
    int32_t max_blocks = 1;
    for (int i = 0; i < 3; i++)
        if (sq[i].n_src > max_blocks)
            max_blocks = sq[i].n_src;
    hbatch hh;
    hbatch_alloc(&hh, n_hist, 3, max_blocks);
    for (int32_t i = 0, t = 0; i < 3; i++) {
        memcpy(hh.tables + (size_t)i * max_blocks, sq[i].src_table, (size_t)sq[i].n_src * sizeof(int32_t));
        for (int32_t p = 0; p < sq[i].n_slots; p++, t++) {
            hh.seq[t] = i;
            hh.slot[t] = hh.pos[t] = p;
        }
    }
    const size_t nh = (size_t)n_hist * kvw;
    float *hk = xmalloc(nh * n_layers * sizeof(float)), *hv = xmalloc(nh * n_layers * sizeof(float));
    fill(hk, nh * n_layers, 1.0f);
    fill(hv, nh * n_layers, 1.0f);
    if (quant) {
        vary_groups(hk, nh * n_layers);
        vary_groups(hv, nh * n_layers);
    }
    /* Captured queries: n_q per layer, with a padded layer stride. */
    const int32_t n_q = 5;
    const int64_t q_stride = (int64_t)(n_q + 3) * (int64_t)qw;
    float *q = xmalloc((size_t)q_stride * n_layers * sizeof(float));
    fill(q, (size_t)q_stride * n_layers, 3.0f);
    int32_t q_slot[5];
    for (int32_t i = 0; i < n_q; i++)
        q_slot[i] = (int32_t)(rnd64() % (uint64_t)sq[0].n_slots);
    q_slot[n_q - 1] = sq[0].n_slots - 1;

    float *knorm[2][2], *sattn[2][2], *after[2], *inplace[2], *blk[2] = {NULL, NULL};
    bool roundtrip[2] = {false, false};
    const size_t blk_elems = 2 * (size_t)n_layers * n_kv * bt_src * hd;
    const size_t score_n[2] = {(size_t)n_layers * n_kv * sq[0].n_slots, (size_t)n_layers * n_kv * sq[1].n_slots};
    for (int b = 0; b < 2; b++) {
        dp_kv_store *src, *dst;
        dp_kv_layout ls = {n_layers, n_kv, hd, bt_src, nb_src, quant ? DP_KV_F16 : DP_KV_F32, 0},
                     ld = {n_layers, n_kv, hd, bt_dst, nb_dst, dtype, 0};
        if (be[b]->ops->kv_create(be[b], &ls, &src) || be[b]->ops->kv_create(be[b], &ld, &dst))
            die(EXIT_SETUP, "%s: kv_create failed", be[b]->ops->name);
        dp_kv_store *st[DP_KV_MAX_STORES] = {src, dst};
        hbatch_set(be[b], &hh);
        for (int32_t l = 0; l < n_layers; l++)
            kv_write_host(be[b], st, l, hk + nh * l, hv + nh * l, nh);
        /* Host tier: one block out (compared across backends as floats),
         * then into a spare block and out again (must round-trip exactly).
         * The buffers come from host_alloc where the backend has it (CUDA:
         * pinned, so the copies are asynchronous): the write from img is
         * ordered after the read into it by the stream alone, and the host
         * waits (a download) before it looks at the bytes. */
        if (be[b]->ops->kv_block_read && be[b]->ops->kv_block_write) {
            const size_t bbytes = be[b]->ops->kv_bytes_per_block(be[b], &ls);
            const size_t esize = bbytes / blk_elems;
            const bool pinned = be[b]->ops->host_alloc && be[b]->ops->host_free;
            uint8_t *img = pinned ? be[b]->ops->host_alloc(be[b], bbytes) : xmalloc(bbytes);
            uint8_t *img2 = pinned ? be[b]->ops->host_alloc(be[b], bbytes) : xmalloc(bbytes);
            if (!img || !img2)
                die(EXIT_SETUP, "%s: host_alloc failed", be[b]->ops->name);
            const int32_t spare = ids_src[ns + 10];
            if (be[b]->ops->kv_block_read(be[b], src, sq[0].src_table[3], img) ||
                be[b]->ops->kv_block_write(be[b], src, spare, img) ||
                be[b]->ops->kv_block_read(be[b], src, spare, img2))
                die(EXIT_CHECK, "%s: kv_block_read/write failed", be[b]->ops->name);
            dev_wait(be[b]);
            blk[b] = image_floats(be[b], &ls, img, bbytes);
            roundtrip[b] = memcmp(img, img2, bbytes) == 0 && (esize == 2 || esize == 4);
            if (pinned) {
                be[b]->ops->host_free(be[b], img);
                be[b]->ops->host_free(be[b], img2);
            } else {
                free(img);
                free(img2);
            }
        }
        /* Scores over sequences 0 and 1. */
        float *dq = dev_from(be[b], q, (size_t)q_stride * n_layers);
        for (int i = 0; i < 2; i++) {
            float *dout = dev_alloc(be[b], score_n[i]);
            dev_poison(be[b], dout, score_n[i]);
            be[b]->ops->kv_score_knorm(be[b], src, sq[i].src_table, sq[i].n_slots, dout);
            knorm[b][i] = xmalloc(score_n[i] * sizeof(float));
            dev_get(be[b], knorm[b][i], dout, score_n[i]);
            dev_poison(be[b], dout, score_n[i]);
            int32_t qs_i[5];
            for (int32_t k = 0; k < n_q; k++)
                qs_i[k] = q_slot[k] < sq[i].n_slots ? q_slot[k] : sq[i].n_slots - 1 - k;
            be[b]->ops->kv_score_attn(be[b], src, sq[i].src_table, sq[i].n_slots, dq, q_stride, qs_i,
                                      n_q, n_heads, scale, dout);
            sattn[b][i] = xmalloc(score_n[i] * sizeof(float));
            dev_get(be[b], sattn[b][i], dout, score_n[i]);
            be[b]->ops->free(be[b], dout);
        }
        be[b]->ops->free(be[b], dq);
        /* Compaction of all three sequences into dst, in one call. */
        dp_compact_seq cs[3];
        for (int i = 0; i < 3; i++)
            cs[i] = (dp_compact_seq){sq[i].src_table, sq[i].n_src, sq[i].dst_table, sq[i].n_dst,
                                     sq[i].n_keep, sq[i].keep};
        if (be[b]->ops->kv_compact(be[b], src, dst, cs, 3))
            die(EXIT_CHECK, "%s: kv_compact failed", be[b]->ops->name);
        /* In place: sequence 1's kept rows into fresh blocks of src. */
        int32_t fresh[8];
        for (int32_t k = 0; k < 8; k++)
            fresh[k] = ids_src[ns + k];
        dp_compact_seq in1 = {sq[1].src_table, sq[1].n_src, fresh, 3, sq[1].n_keep, sq[1].keep};
        if (be[b]->ops->kv_compact(be[b], src, src, &in1, 1))
            die(EXIT_CHECK, "%s: in-place kv_compact failed", be[b]->ops->name);
        /* Read back through attention: sequence 0 over dst (tokens at kept
         * slots 299, 150, 0) and sequence 1 over the in-place copy in src. */
        hbatch ha;
        hbatch_alloc(&ha, 6, 2, sq[0].n_dst > 3 ? sq[0].n_dst : 3);
        const int32_t slots[6] = {299, 150, 0, 44, 20, 1};
        for (int32_t t = 0; t < 6; t++) {
            ha.seq[t] = t < 3 ? 0 : 1;
            ha.slot[t] = ha.pos[t] = slots[t];
        }
        ha.seq_store[0] = 1;
        ha.seq_store[1] = 0;
        memcpy(ha.tables, sq[0].dst_table, (size_t)sq[0].n_dst * sizeof(int32_t));
        memcpy(ha.tables + ha.max_blocks, fresh, 3 * sizeof(int32_t));
        hbatch_set(be[b], &ha);
        float *qa = xmalloc(6 * qw * sizeof(float));
        uint64_t save = g_rs;
        fill(qa, 6 * qw, 3.0f);
        if (b == 0)
            g_rs = save; /* the same queries on both backends */
        float *dqa = dev_from(be[b], qa, 6 * qw), *dout = dev_alloc(be[b], 6 * qw);
        dev_poison(be[b], dout, 6 * qw);
        be[b]->ops->attention(be[b], st, n_layers - 1, dout, dqa, n_heads, scale, 0);
        after[b] = xmalloc(6 * qw * sizeof(float));
        dev_get(be[b], after[b], dout, 6 * qw);
        if (quant) {
            /* The quantized blocks' bytes (two of sequence 0's). */
            dp_kv_layout one = ld;
            one.n_blocks = 1;
            qbytes = be[b]->ops->kv_bytes_per_block(be[b], &one);
            qimg[b] = xmalloc(2 * qbytes);
            uint8_t *tmp = be[b]->ops->host_alloc ? be[b]->ops->host_alloc(be[b], qbytes) : NULL;
            for (int k = 0; k < 2; k++) {
                uint8_t *into = tmp ? tmp : qimg[b] + (size_t)k * qbytes;
                if (be[b]->ops->kv_block_read(be[b], dst, sq[0].dst_table[k ? sq[0].n_dst - 1 : 0],
                                              into))
                    die(EXIT_CHECK, "%s: kv_block_read of a quantized block failed",
                        be[b]->ops->name);
                dev_wait(be[b]);
                if (tmp)
                    memcpy(qimg[b] + (size_t)k * qbytes, tmp, qbytes);
            }
            if (tmp)
                be[b]->ops->host_free(be[b], tmp);
            /* Key norms read from the quantized store. */
            const size_t nk = (size_t)n_layers * n_kv * sq[0].n_keep;
            float *dk = dev_alloc(be[b], nk);
            be[b]->ops->kv_score_knorm(be[b], dst, sq[0].dst_table, sq[0].n_keep, dk);
            qknorm[b] = xmalloc(nk * sizeof(float));
            dev_get(be[b], qknorm[b], dk, nk);
            /* ... and the attention mass of captured queries over it. */
            float *dq2 = dev_from(be[b], q, (size_t)q_stride * n_layers);
            int32_t qk[5];
            for (int32_t k = 0; k < n_q; k++)
                qk[k] = q_slot[k] % sq[0].n_keep;
            be[b]->ops->kv_score_attn(be[b], dst, sq[0].dst_table, sq[0].n_keep, dq2, q_stride, qk,
                                      n_q, n_heads, scale, dk);
            qattn[b] = xmalloc(nk * sizeof(float));
            dev_get(be[b], qattn[b], dk, nk);
            be[b]->ops->free(be[b], dq2);
            be[b]->ops->free(be[b], dk);
            /* Its first n_back kept slots back into f16 blocks of src. */
            int32_t *keep = xmalloc((size_t)n_layers * n_kv * n_back * sizeof(int32_t));
            for (int32_t lh = 0; lh < n_layers * n_kv; lh++)
                for (int32_t k = 0; k < n_back; k++)
                    keep[(size_t)lh * n_back + k] = k;
            int32_t back[8];
            for (int32_t k = 0; k < 8; k++)
                back[k] = ids_src[ns + 20 + k];
            dp_compact_seq bk = {sq[0].dst_table, sq[0].n_dst, back, 7, n_back, keep};
            if (be[b]->ops->kv_compact(be[b], dst, src, &bk, 1))
                die(EXIT_CHECK, "%s: kv_compact out of a quantized store failed", be[b]->ops->name);
            /* Its f16 values, K and V, of the first and last block. */
            const size_t per_blk = 2 * (size_t)n_layers * n_kv * bt_src * hd;
            qback[b] = xmalloc(2 * per_blk * sizeof(float));
            for (int k = 0; k < 2; k++) {
                float *f = block_floats(be[b], src, back[k ? 6 : 0]);
                memcpy(qback[b] + (size_t)k * per_blk, f, per_blk * sizeof(float));
                free(f);
            }
            free(keep);
        }
        /* Layer 0 of the in-place copy, through knorm over the fresh table. */
        float *dn = dev_alloc(be[b], (size_t)n_layers * n_kv * sq[1].n_keep);
        be[b]->ops->kv_score_knorm(be[b], src, fresh, sq[1].n_keep, dn);
        inplace[b] = xmalloc((size_t)n_layers * n_kv * sq[1].n_keep * sizeof(float));
        dev_get(be[b], inplace[b], dn, (size_t)n_layers * n_kv * sq[1].n_keep);
        be[b]->ops->free(be[b], dn);
        be[b]->ops->free(be[b], dqa);
        be[b]->ops->free(be[b], dout);
        free(qa);
        hbatch_free(&ha);
        be[b]->ops->kv_destroy(be[b], src);
        be[b]->ops->kv_destroy(be[b], dst);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(what, sizeof what, "%d slots, %d layers x %d heads", sq[i].n_slots, n_layers, n_kv);
        report("kv_score_knorm", what, knorm[0][i], knorm[1][i], score_n[i], TOL_EW);
        snprintf(what, sizeof what, "%d slots, %d queries, gqa %d/%d", sq[i].n_slots, n_q, n_heads, n_kv);
        report("kv_score_attn", what, sattn[0][i], sattn[1][i], score_n[i], TOL_ATT);
        free(knorm[0][i]);
        free(knorm[1][i]);
        free(sattn[0][i]);
        free(sattn[1][i]);
    }
    snprintf(what, sizeof what, "3 seqs (keep 300/45/0) -> 8-token %s blocks",
             quant ? dp_kv_type_name(dtype) : "default");
    report("kv_compact", what, after[0], after[1], 6 * qw, TOL_ATT);
    if (quant) {
        const bool same = memcmp(qimg[0], qimg[1], 2 * qbytes) == 0;
        g_checks++;
        g_failed += !same;
        snprintf(what, sizeof what, "%s bytes of two compacted blocks", dp_kv_type_name(dtype));
        printf("  %-12s %-46s %s\n", "kv_compact", what, same ? "identical  ok" : "DIFFERENT  FAIL");
        snprintf(what, sizeof what, "knorm over the %s store", dp_kv_type_name(dtype));
        report("kv_compact", what, qknorm[0], qknorm[1], (size_t)n_layers * n_kv * sq[0].n_keep,
               TOL_EW);
        snprintf(what, sizeof what, "kv_score_attn over the %s store", dp_kv_type_name(dtype));
        report("kv_compact", what, qattn[0], qattn[1], (size_t)n_layers * n_kv * sq[0].n_keep,
               TOL_ATT);
        /* d * q rounded once to f16 on both: the same values exactly. */
        snprintf(what, sizeof what, "%s -> f16, K and V of two blocks", dp_kv_type_name(dtype));
        report("kv_compact", what, qback[0], qback[1], 4 * (size_t)n_layers * n_kv * bt_src * hd,
               0.0);
        for (int b = 0; b < 2; b++) {
            free(qimg[b]);
            free(qknorm[b]);
            free(qattn[b]);
            free(qback[b]);
        }
    }
    report("kv_compact", "in place, keys read back by knorm", inplace[0], inplace[1],
           (size_t)n_layers * n_kv * sq[1].n_keep, TOL_EW);
    if (blk[0] && blk[1]) {
        report("kv_block_read", "one block, K and V of every layer", blk[0], blk[1], blk_elems, TOL_EW);
        for (int b = 0; b < 2; b++) {
            g_checks++;
            g_failed += !roundtrip[b];
            printf("  %-12s %-46s %s\n", "kv_block_write",
                   b ? "cuda: read, write to a spare, read again" : "cpu: read, write to a spare, read again",
                   roundtrip[b] ? "identical  ok" : "DIFFERENT  FAIL");
        }
    } else {
        printf("  %-12s %s\n", "kv_block_read", "not in this build");
    }
    for (int b = 0; b < 2; b++) {
        free(after[b]);
        free(inplace[b]);
        free(blk[b]);
    }
    for (int i = 0; i < 3; i++)
        free(sq[i].keep);
    free(hk);
    free(hv);
    free(q);
    hbatch_free(&hh);
}

/* llama_forward_topk: the step ends in logits_topk instead of the logits
 * download. On each backend, one prefill step of two sequences is run both
 * ways, the rows at their own temperatures and the second with its best
 * token masked; the candidates must be the row's best logits of
 * llama_forward's output (less the mask), in order, with its max and exact
 * weight sum, and llama_download_logits must still give the full rows
 * afterwards, the masked one masked. */
