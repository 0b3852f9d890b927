/* check_kivi.c: the GPU checks of the kivi4 decode path (backend.h: grouped
 * stores, a view of the f16 arena): kv_compact into whole groups (both
 * backends must write the same bytes), kv_write into a sequence's residual
 * and attention over its lead, sealed groups and residual, beside f16
 * sequences of the same arena, against the CPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"

#include "check_common.h"

typedef struct kivi_cfg {
    const char *name;
    int32_t n_layers, n_kv, hd, n_heads;
    int32_t bbt, g; /* the arena's block_tokens, the group's tokens */
} kivi_cfg;

/* A sequence of the case. kivi: its prompt (src slots, lead included) is
 * written to arena blocks, its first bbt slots kept as the lead (the
 * prompt's first block, by reference) and `groups` whole groups of its
 * other slots (a random increasing subset: eviction) compacted into the
 * view; `resid` slots then fill its residual's first entries from roff
 * (written as arena rows), and n_new tokens are written through the view
 * and checked. Not kivi: an f16 sequence of the arena with hist slots. */
typedef struct kivi_seq {
    bool kivi;
    int32_t groups, resid, roff; /* kivi */
    int32_t hist;                /* f16 */
    int32_t n_new;
    /* derived */
    int32_t src_slots, sealed, n_src, n_tab;
    int32_t *src_table, *table, *keep;
} kivi_seq;

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* Block ids for every sequence from one shuffled list (the view's blocks
 * are the arena's): returns the arena's size. */
static int32_t kivi_layout(const kivi_cfg *c, kivi_seq *sq, int32_t n, int32_t **ids_out)
{
    int32_t need = 0;
    for (int32_t i = 0; i < n; i++) {
        kivi_seq *s = &sq[i];
        if (s->kivi) {
            s->sealed = s->groups ? c->bbt + s->groups * c->g : 0;
            s->src_slots = s->groups ? s->sealed + 23 : 0; /* 23 evicted */
            s->n_src = ceil_div(s->src_slots, c->bbt);
            s->n_tab = (s->groups ? 1 + s->groups : 0) +
                       ceil_div(s->roff + s->resid + s->n_new, c->bbt);
            need += s->n_src + s->groups + s->n_tab;
        } else {
            s->n_tab = ceil_div(s->hist + s->n_new, c->bbt);
            need += s->n_tab;
        }
    }
    const int32_t nb = need + 7;
    int32_t *ids = xmalloc((size_t)nb * sizeof *ids), next = 0;
    for (int32_t i = 0; i < nb; i++)
        ids[i] = i;
    shuffle_ids(ids, nb);
    for (int32_t i = 0; i < n; i++) {
        kivi_seq *s = &sq[i];
        s->table = xmalloc((size_t)(s->n_tab + 1) * sizeof(int32_t));
        s->src_table = xmalloc((size_t)(s->n_src + 1) * sizeof(int32_t));
        memcpy(s->src_table, ids + next, (size_t)s->n_src * sizeof(int32_t));
        next += s->n_src;
        int32_t t = 0;
        if (s->kivi && s->groups)
            s->table[t++] = s->src_table[0]; /* the lead: the prompt's first block */
        for (; t < s->n_tab; t++)
            s->table[t] = ids[next++];
        /* Kept slots per (layer, head): all groups' worth from [bbt, src_slots). */
        const int32_t nk = s->groups * c->g, span = s->src_slots - c->bbt;
        s->keep = xmalloc((size_t)c->n_layers * c->n_kv * (nk ? nk : 1) * sizeof(int32_t));
        for (int32_t lh = 0; lh < c->n_layers * c->n_kv; lh++)
            for (int32_t p = 0, k = 0; p < span && k < nk; p++)
                if ((int64_t)(rnd64() % (uint64_t)(span - p)) < nk - k)
                    s->keep[(size_t)lh * nk + k++] = c->bbt + p;
    }
    *ids_out = ids;
    return nb;
}

/* Which table and store a batch writes through: a kivi sequence's prompt
 * (its source blocks in the arena), its residual's first tokens as the
 * arena's own rows (written before the groups before them were sealed, as
 * the manager leaves them: the residual's blocks, from entry roff), or the
 * view (lead, groups and residual). f16 sequences always use the arena. */
enum { KB_PROMPT, KB_RESIDUAL, KB_VIEW };

/* A batch of each sequence's tokens from slot `from` (count of them), in
 * sequence order. */
static int32_t kivi_batch(hbatch *hb, const kivi_seq *sq, int32_t n, const int32_t *from,
                          const int32_t *count, int mode, int32_t max_blocks)
{
    int32_t nt = 0;
    for (int32_t i = 0; i < n; i++)
        nt += count[i];
    if (nt == 0)
        return 0;
    hbatch_alloc(hb, nt, n, max_blocks);
    hb->seq_sealed = xmalloc((size_t)n * sizeof(int32_t));
    hb->seq_roff = xmalloc((size_t)n * sizeof(int32_t));
    for (int32_t i = 0, t = 0; i < n; i++) {
        const kivi_seq *s = &sq[i];
        const bool on_view = s->kivi && mode == KB_VIEW;
        const int32_t rstart = s->groups ? 1 + s->groups : 0;
        const int32_t *tab = !s->kivi ? s->table
                             : mode == KB_PROMPT ? s->src_table
                             : mode == KB_RESIDUAL ? s->table + rstart
                                                   : s->table;
        const int32_t n_tab = !s->kivi ? s->n_tab
                              : mode == KB_PROMPT ? s->n_src
                              : mode == KB_RESIDUAL ? s->n_tab - rstart
                                                    : s->n_tab;
        hb->seq_store[i] = on_view ? 1 : 0;
        hb->seq_sealed[i] = on_view ? s->sealed : 0;
        hb->seq_roff[i] = on_view ? s->roff : 0;
        memcpy(hb->tables + (size_t)i * max_blocks, tab, (size_t)n_tab * sizeof(int32_t));
        for (int32_t p = 0; p < count[i]; p++, t++) {
            hb->seq[t] = i;
            hb->slot[t] = s->kivi && mode == KB_RESIDUAL ? s->roff + p : from[i] + p;
            hb->pos[t] = from[i] + p + 3; /* (rotary positions are the model's) */
        }
    }
    hb->n_out = 0;
    return nt;
}

static void kivi_batch_free(hbatch *hb)
{
    free(hb->seq_sealed);
    free(hb->seq_roff);
    hb->seq_sealed = hb->seq_roff = NULL;
    hbatch_free(hb);
}

/* Writes a batch's K and V (random, the same on both backends: drawn once
 * into k and v, one layer after another) into every layer, or only into the
 * last one (k and v then hold one layer). */
static void kivi_write(dp_backend *be, dp_kv_store *const *st, const hbatch *hb, const kivi_cfg *c,
                       const float *k, const float *v, bool last_only)
{
    const size_t n = (size_t)hb->n_tokens * c->n_kv * c->hd;
    hbatch_set(be, hb);
    for (int32_t l = last_only ? c->n_layers - 1 : 0, i = 0; l < c->n_layers; l++, i++)
        kv_write_host(be, st, l, k + n * i, v + n * i, n);
}

static void check_kivi_case(dp_backend *be[2], const kivi_cfg *c, kivi_seq *sq, int32_t n,
                            const char *label)
{
    int32_t *ids, max_blocks = 1;
    const int32_t nb = kivi_layout(c, sq, n, &ids);
    for (int32_t i = 0; i < n; i++) {
        max_blocks = sq[i].n_tab > max_blocks ? sq[i].n_tab : max_blocks;
        max_blocks = sq[i].n_src > max_blocks ? sq[i].n_src : max_blocks;
    }
    /* The three batches: prompts (kivi ones on their source tables, f16
     * ones their history), residuals, and the checked tokens. */
    int32_t from[16] = {0}, cnt[16];
    hbatch h1 = {0}, h2 = {0}, h3 = {0};
    for (int32_t i = 0; i < n; i++)
        cnt[i] = sq[i].kivi ? sq[i].src_slots : sq[i].hist;
    const int32_t n1 = kivi_batch(&h1, sq, n, from, cnt, KB_PROMPT, max_blocks);
    for (int32_t i = 0; i < n; i++) {
        from[i] = sq[i].sealed;
        cnt[i] = sq[i].kivi ? sq[i].resid : 0;
    }
    const int32_t n2 = kivi_batch(&h2, sq, n, from, cnt, KB_RESIDUAL, max_blocks);
    for (int32_t i = 0; i < n; i++) {
        from[i] = sq[i].kivi ? sq[i].sealed + sq[i].resid : sq[i].hist;
        cnt[i] = sq[i].n_new;
    }
    const int32_t n3 = kivi_batch(&h3, sq, n, from, cnt, KB_VIEW, max_blocks);
    const size_t kvw = (size_t)c->n_kv * c->hd, qw = (size_t)c->n_heads * c->hd;
    const size_t n1f = (size_t)n1 * kvw * c->n_layers, n2f = (size_t)n2 * kvw * c->n_layers;
    float *k1 = xmalloc((n1f + 1) * sizeof(float)), *v1 = xmalloc((n1f + 1) * sizeof(float));
    float *k2 = xmalloc((n2f + 1) * sizeof(float)), *v2 = xmalloc((n2f + 1) * sizeof(float));
    float *k3 = xmalloc((size_t)n3 * kvw * sizeof(float));
    float *v3 = xmalloc((size_t)n3 * kvw * sizeof(float));
    float *q = xmalloc((size_t)n3 * qw * sizeof(float));
    fill(k1, n1f, 1.0f);
    fill(v1, n1f, 1.0f);
    /* Keys with outlier channels (why keys are quantized per channel). */
    for (size_t e = 0; e < n1f; e++)
        k1[e] *= 1.0f + (float)((e % (size_t)c->hd) % 5) * 1.5f;
    fill(k2, n2f, 1.0f);
    fill(v2, n2f, 1.0f);
    fill(k3, (size_t)n3 * kvw, 1.0f);
    fill(v3, (size_t)n3 * kvw, 1.0f);
    fill(q, (size_t)n3 * qw, 4.0f);
    const float scale = 1.0f / sqrtf((float)c->hd);

    /* The groups compacted: every kivi sequence with groups. */
    dp_compact_seq cs[16];
    int32_t n_cs = 0, probe = -1;
    for (int32_t i = 0; i < n; i++)
        if (sq[i].kivi && sq[i].groups) {
            cs[n_cs++] = (dp_compact_seq){.src_table = sq[i].src_table,
                                          .n_src_blocks = sq[i].n_src,
                                          .dst_table = sq[i].table + 1,
                                          .n_dst_blocks = sq[i].groups,
                                          .keep = sq[i].keep,
                                          .n_keep = sq[i].groups * c->g};
            if (probe < 0)
                probe = i;
        }
    float *o[2];
    uint8_t *img[2] = {NULL, NULL};
    size_t img_bytes = 0;
    for (int b = 0; b < 2; b++) {
        dp_backend *e = be[b];
        dp_kv_store *st[DP_KV_MAX_STORES] = {NULL};
        dp_kv_layout la = {c->n_layers, c->n_kv, c->hd, c->bbt, nb, DP_KV_F16, 0};
        dp_kv_layout lv = {c->n_layers, c->n_kv, c->hd, c->g, nb, DP_KV_KIVI4, 0};
        if (e->ops->kv_create(e, &la, &st[0]) || e->ops->kv_view(e, st[0], &lv, &st[1]))
            die(EXIT_SETUP, "%s: the arena or its kivi4 view was refused", e->ops->name);
        if (n1)
            kivi_write(e, st, &h1, c, k1, v1, false);
        if (n_cs && e->ops->kv_compact(e, st[0], st[1], cs, n_cs))
            die(EXIT_CHECK, "%s: kv_compact into kivi4 failed", e->ops->name);
        if (n2)
            kivi_write(e, st, &h2, c, k2, v2, false);
        kivi_write(e, st, &h3, c, k3, v3, true);
        float *dq = dev_from(e, q, (size_t)n3 * qw), *dout = dev_alloc(e, (size_t)n3 * qw);
        dev_poison(e, dout, (size_t)n3 * qw);
        e->ops->attention(e, st, c->n_layers - 1, dout, dq, c->n_heads, scale, 0);
        o[b] = xmalloc((size_t)n3 * qw * sizeof(float));
        dev_get(e, o[b], dout, (size_t)n3 * qw);
        if (probe >= 0) /* the first group's bytes, every layer */
            img[b] = block_image(e, st[1], sq[probe].table[1], &img_bytes);
        e->ops->free(e, dq);
        e->ops->free(e, dout);
        e->ops->kv_destroy(e, st[1]);
        e->ops->kv_destroy(e, st[0]);
    }
    char what[128];
    snprintf(what, sizeof what, "kivi4 %s %s: %d tokens", c->name, label, n3);
    report("attention", what, o[0], o[1], (size_t)n3 * qw, TOL_ATT);
    if (probe >= 0) {
        snprintf(what, sizeof what, "kivi4 group bytes, %s %s", c->name, label);
        report_same_bytes("kv_compact", what, img[0], img[1], img_bytes);
    }
    free(img[0]);
    free(img[1]);
    free(o[0]);
    free(o[1]);
    free(k1);
    free(v1);
    free(k2);
    free(v2);
    free(k3);
    free(v3);
    free(q);
    kivi_batch_free(&h3);
    if (n2)
        kivi_batch_free(&h2);
    if (n1)
        kivi_batch_free(&h1);
    for (int32_t i = 0; i < n; i++) {
        free(sq[i].table);
        free(sq[i].src_table);
        free(sq[i].keep);
    }
    free(ids);
}

void check_kivi(dp_backend *be[2])
{
    const kivi_cfg cfgs[] = {
        /* The default model's shape: 16-token arena blocks, 56-token groups
         * (a group's bytes fill the block they take). */
        {"hd64 gqa8/2 g56", 2, 2, 64, 8, 16, 56},
        {"hd128 gqa6/2 g56", 2, 2, 128, 6, 16, 56},
        {"hd64 mha2 base32 g32", 1, 2, 64, 2, 32, 32},
        /* Six query heads a KV head: the CPU scores them four, then two. */
        {"hd64 gqa12/2 g56", 1, 2, 64, 12, 16, 56},
    };
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        /* Decode over lead + groups + residual (one long enough for the
         * attention kernel to split), a prefill chunk on a sealed sequence,
         * a sequence with no group yet (residual from table[0] at an
         * offset), and f16 sequences of the arena in the same batch. */
        kivi_seq mixed[] = {
            {.kivi = true, .groups = 3, .resid = 30, .roff = 0, .n_new = 1},
            {.kivi = true, .groups = 1, .resid = 0, .roff = 7, .n_new = 20},
            {.kivi = false, .hist = 50, .n_new = 17},
            {.kivi = true, .groups = 0, .resid = 10, .roff = 3, .n_new = 1},
            {.kivi = true, .groups = 40, .resid = 9, .roff = 5, .n_new = 1},
            {.kivi = false, .hist = 0, .n_new = 5},
        };
        check_kivi_case(be, &cfgs[ci], mixed, (int32_t)(sizeof mixed / sizeof mixed[0]),
                        "mixed batch");
        kivi_seq dec[] = {
            {.kivi = true, .groups = 2, .resid = 1, .roff = 15, .n_new = 1},
            {.kivi = true, .groups = 5, .resid = 55, .roff = 2, .n_new = 1},
        };
        check_kivi_case(be, &cfgs[ci], dec, 2, "decode only");
    }
}
