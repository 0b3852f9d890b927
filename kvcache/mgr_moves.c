/* mgr_moves.c: moves of a sequence's cache between the pools: migration to
 * the decode path at a prompt's end (compaction through the migrator, a
 * prefix kept whole held by reference or shared), recompression under a
 * decode budget (staged through scratch when no block is free), and a
 * finished reply written back as named prefill blocks. */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- moves ---------------------------------------------------------------- */

#define MIGRATE_BATCH 64

/* Room in a decode type's scratch store for n blocks of its layout. */
int mgr_scratch_reserve(dp_kv_mgr *m, dp_kv_dtype *d, int32_t n)
{
    if (n <= d->rscratch_blocks)
        return 0;
    /* The new store first: where it cannot be had, the one allocated at
     * start-up stays for the recompressions it holds. (A prefix copied
     * rather than held by reference makes a recompression keep more than
     * the budget: the scratch grows then, outside kv_memory.) */
    dp_kv_layout l = d->layout;
    l.n_blocks = n;
    dp_kv_store *s = NULL;
    int rc = m->be->ops->kv_create(m->be, &l, &s);
    if (rc)
        return rc;
    if (d->rscratch)
        m->be->ops->kv_destroy(m->be, d->rscratch);
    d->rscratch = s;
    d->rscratch_blocks = n;
    return 0;
}

/* What a decode-path compaction leaves: at a prompt's end (g->pos), its
 * kept slots stand for the prompt and the reply follows in order, as after
 * a migration; a recompression mixes the reply's positions too. */
static void note_compaction(dp_kv_seq *kv, const dp_kv_migration *g)
{
    if (g->pos > 0) {
        /* The window keeps its last slots whole; they are consecutive
         * positions only as far as the stretch computed since the last
         * compaction (a resumed turn's new text and the reply before it). */
        const int32_t stretch = kv->mig_pos > 0 ? g->pos - kv->mig_pos : g->pos;
        kv->exact_from = g->pos - (stretch < kv->copts.window ? stretch : kv->copts.window);
        kv->mig_pos = g->pos;
        kv->mig_keep = g->n_keep;
        kv->hist_slots = 0;
    } else {
        kv->recompressed = true;
    }
}

/* A recompression whose new table found no free blocks: the kept rows are
 * gathered into the scratch store, the old table is released and the new,
 * smaller one is taken from what it freed, then the rows are copied into it.
 * So a recompression never waits for memory, and a sequence never computes
 * a token over more than its budget: its output does not depend on the load.
 * The rows are the same bytes the direct path would have written. */
static int recompress_staged(dp_kv_mgr *m, dp_kv_migration *g)
{
    dp_kv_seq *kv = g->kv;
    /* A prompt's end on the decode path (a resumed turn) already holds
     * every slot it would keep: without free blocks it keeps its new text
     * whole rather than stage a compaction as long as a context (the
     * scratch holds a decode budget's recompression only). */
    if (g->pos > 0)
        return DP_ENOSPC;
    dp_kv_dtype *d = &m->dt[kv->dt];
    const int32_t nref = mgr_ref_slots(m, kv, kv->n_slots, g->n_keep), nb = nref / d->bt;
    const int32_t n_rows = g->n_keep - nref, nblk = mgr_dblocks_for(m, kv, n_rows);
    /* Its kept share, if any, goes (its new table holds the front at
     * most): then the blocks it holds alone are what releasing its table
     * frees, and they must cover its new table (some may be held by a
     * kept share others still use). */
    mgr_leave_kept(m, kv);
    kv->ref_blocks = nb; /* (a kept share's blocks are its own now) */
    int32_t frees = 0, own;
    for (int32_t b = nb; b < kv->table.n_blocks; b++)
        frees += m->dpool->refcnt[kv->table.blocks[b]] == 1;
    if (nblk > frees && !mgr_decode_room(m, kv, nblk - frees, &own))
        return DP_ENOSPC; /* it decodes over its budget until there is room */
    int rc = mgr_scratch_reserve(m, d, nblk);
    int32_t *ids = rc ? NULL : malloc((size_t)nblk * sizeof *ids);
    if (!ids) {
        dp_log(DP_LOG_WARN, "kvcache: no memory to recompress a sequence; it decodes over its "
               "budget until there is");
        return rc ? rc : DP_ENOMEM;
    }
    for (int32_t b = 0; b < nblk; b++)
        ids[b] = b;
    const dp_compress_opts co = g->pos > 0 ? kv_seq_prompt_end_opts(kv) : kv->copts;
    dp_kv_move mv = {.co = &co, .src = kv->table.blocks, .n_src_blocks = kv->table.n_blocks,
                     .n_slots = kv->n_slots, .dst = ids, .n_dst_blocks = nblk, .n_keep = g->n_keep,
                     .q = g->q, .q_stride = g->q_stride, .n_q = g->n_q, .n_ref = nref,
                     .attn = &kv->attn};
    kv_migrator_set_exempt(&m->mig, NULL); /* (a recompression: no exempt layers move) */
    if ((rc = kv_migrate(&m->mig, d->store, d->rscratch, &mv, 1))) {
        free(ids);
        return rc;
    }
    /* The new table: the blocks held by reference, then what the old one frees. */
    dp_block_table t;
    kv_table_init(&t);
    for (int32_t b = 0; rc == 0 && b < nb; b++)
        rc = kv_table_push(&t, m->dpool, kv->table.blocks[b]);
    if (rc) {
        kv_table_destroy(&t, m->dpool);
        free(ids);
        return rc;
    }
    kv_table_release(&kv->table, m->dpool);
    free(kv->table.blocks);
    kv->table = t;
    kv->n_slots = nref;
    /* From the blocks it just freed, whatever others were promised (their
     * promises may exceed the free blocks while sequences grow past
     * theirs: the freed ones are its own). */
    if ((rc = kv_table_reserve_bt(&kv->table, m->dpool, g->n_keep, d->bt)) == 0) {
        const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
        int32_t *keep = kv_migrator_keep(&m->mig, rows * (size_t)n_rows);
        rc = keep ? 0 : DP_ENOMEM;
        for (size_t r = 0; keep && r < rows; r++)
            for (int32_t s = 0; s < n_rows; s++)
                keep[r * (size_t)n_rows + (size_t)s] = s;
        dp_compact_seq cs = {ids, nblk, kv->table.blocks + nb, kv->table.n_blocks - nb, n_rows,
                             keep};
        if (rc == 0)
            rc = m->be->ops->kv_compact(m->be, d->rscratch, d->store, &cs, 1);
    }
    free(ids);
    if (rc) {
        /* Cannot happen (it needs fewer blocks than it freed): its cache is
         * lost, and the step's owner fails it. */
        dp_log(DP_LOG_ERROR, "kvcache: a staged recompression failed (%s)", dp_strerror(rc));
        kv_table_release(&kv->table, m->dpool);
        mgr_leave_share(m, kv);
        mgr_leave_kept(m, kv);
        kv->ref_blocks = 0;
        kv->n_slots = 0;
        g->lost = true;
        return rc;
    }
    g->scorer = mv.scorer;
    g->n_ref = nref;
    if (nref == 0)
        mgr_leave_share(m, kv);
    note_compaction(kv, g);
    kv->n_slots = g->n_keep;
    kv->ref_blocks = nb;
    attn_acc_reset(&kv->attn);
    m->staged_recompressions++;
    return 0;
}

/* ---- a migration batch: plan, reserve, move, then commit or undo ---------- */

/* One sequence of a batch as planned: the new tables it takes, the slots
 * its new table holds by reference and whose, the shares it takes or
 * names, and its move. */
typedef struct mig_entry {
    dp_kv_migration *g;
    dp_block_table table;     /* its new compact table */
    int32_t took;             /* of its promise, what that table took */
    dp_block_table xt;        /* its new exempt table (exempt layers; else empty) */
    int32_t xtook;
    int32_t *xrow;            /* xt as a batch row */
    int32_t nref;             /* leading slots held by reference ... */
    const int32_t *refb;      /* ... these blocks */
    int32_t share;            /* the decode-pool share it holds once it moves (id + 1;
                               * -slots: one it names; 0: none) */
    int32_t held;             /* slots of its table a share holds */
    int32_t kslots;           /* slots a kept share can hold of its compaction */
    int32_t found;            /* the kept share it takes (-1: none) ... */
    uint64_t tag;             /* ... else the tag it names its own under (0: none) */
    const int32_t *keep_given; /* the taken kept share's lists */
    dp_share kid;             /* the kept share it holds once it moves */
    dp_compress_opts co;      /* its move's options (kv_seq_prompt_end_opts) */
} mig_entry;

/* A batch: up to MIGRATE_BATCH sequences, all on path src, all of decode
 * type d. The moves are one array: kv_migrate runs them in one call. */
typedef struct mig_plan {
    dp_path src;
    dp_kv_dtype *d;
    int32_t rows;             /* layers x KV heads: a kept share's lists */
    int32_t k;                /* entries planned and reserved */
    mig_entry e[MIGRATE_BATCH];
    dp_kv_move mv[MIGRATE_BATCH];
    dp_kv_migration *staged[MIGRATE_BATCH]; /* recompressions without free blocks */
    int32_t n_staged;
    /* Shares found but not yet joined are pinned (one more user) while
     * blocks are taken: making room may drop parked turns, and with them a
     * share's last user. Unpinned at the end. */
    int32_t pins[2 * MIGRATE_BATCH], n_pins;
} mig_plan;

/* What x's new table starts with, held by reference: its own leading
 * blocks (in one arena of one type, the prefill blocks of its prefix; on
 * the decode path, a share it holds), or a decode-pool share of its prefix
 * that another sequence copied (x->share; -slots: it names one). */
static void plan_front_share(dp_kv_mgr *m, const mig_plan *p, mig_entry *x)
{
    const dp_kv_migration *g = x->g;
    dp_kv_seq *kv = g->kv;
    x->nref = mgr_ref_slots(m, kv, kv->n_slots, g->n_keep);
    x->refb = kv->table.blocks;
    x->share = 0;
    if (!seq_shares(m, kv) || p->src != DP_PATH_PREFILL)
        return;
    x->nref = 0;
    const int32_t s = g->tokens ? mgr_front_slots(m, kv, g->n_keep) : 0;
    /* The share admission joined, unless the front shrank since (an early
     * switch keeps fewer); else one another sequence holds. */
    int32_t id = share_held(kv->dshare) ? share_id(kv->dshare) : -1;
    if (id >= 0 && dprefix_slots(&m->dpx, id) > s) {
        mgr_leave_share(m, kv);
        id = -1;
    }
    if (id < 0 && s > 0)
        id = dprefix_find(&m->dpx, g->tokens, s);
    if (id >= 0) {
        x->nref = dprefix_slots(&m->dpx, id);
        x->refb = dprefix_blocks(&m->dpx, id);
        x->share = id + 1;
    } else if (s > 0) {
        x->share = -s;
    }
}

/* Its whole compaction, but for the last partial block, may be one that a
 * sequence with the same tokens made (a kept share): it keeps the same
 * slots and takes those blocks. Else, marked share_kept, it names its own
 * for the next (x->tag). */
static void plan_kept_share(dp_kv_mgr *m, const mig_plan *p, mig_entry *x)
{
    const dp_kv_migration *g = x->g;
    const dp_kv_seq *kv = g->kv;
    x->kslots = 0;
    x->found = -1;
    x->tag = 0;
    x->keep_given = NULL;
    if (p->src != DP_PATH_PREFILL || !g->tokens || g->n_keep <= 0 || !seq_keeps_shared(m, kv))
        return;
    /* The share admission joined is found again, unless its compaction
     * changed since (an early switch keeps fewer). */
    x->kslots = kept_slots(m, g->n_keep);
    x->tag = x->kslots > x->nref ? mgr_kept_tag(&kv->copts, g->n_keep) : 0;
    x->found = x->tag ? mgr_kept_find(m, kv, g->tokens, kv->n_slots, g->n_keep) : -1;
    if (x->found >= 0) {
        x->nref = x->kslots;
        x->refb = dprefix_blocks(&m->dpx, x->found);
        x->keep_given = dprefix_keep(&m->dpx, x->found);
        if (x->share < 0)
            x->share = 0; /* its front comes with the kept share's blocks */
    } else if (!g->share_kept) {
        x->tag = 0;
    }
}

/* Takes x's blocks: the ones it holds by reference (one more reference
 * each), decode blocks for the rest, and on the prefill path its exempt
 * table (the exempt layers keep every slot of the prompt). All or nothing:
 * on failure nothing is held but the pins. */
static int reserve_entry(dp_kv_mgr *m, mig_plan *p, mig_entry *x)
{
    const dp_kv_migration *g = x->g;
    dp_kv_seq *kv = g->kv;
    const int32_t nb = x->nref / p->d->bt;
    int rc = g->n_keep < 1 ? DP_EINVAL : 0;
    for (int32_t b = 0; rc == 0 && b < nb; b++)
        rc = kv_table_push(&x->table, m->dpool, x->refb[b]);
    if (x->share > 0)
        dprefix_join(&m->dpx, p->pins[p->n_pins++] = x->share - 1);
    if (x->found >= 0)
        dprefix_join(&m->dpx, p->pins[p->n_pins++] = x->found);
    if (rc == 0)
        rc = mgr_decode_reserve(m, kv, &x->table, g->n_keep, &x->took);
    if (rc) {
        kv_table_destroy(&x->table, m->dpool);
        return rc;
    }
    kv_table_init(&x->xt);
    x->xrow = NULL;
    x->xtook = 0;
    if (p->src == DP_PATH_PREFILL &&
        ((rc = mgr_x_reserve(m, kv, &x->xt, kv->n_slots, &x->xtook)) != 0 ||
         (x->xt.n_blocks > 0 &&
          !(x->xrow = malloc((size_t)x->xt.n_blocks * (size_t)m->xfold * sizeof(int32_t)))))) {
        mgr_undo_reserve(m, kv, &x->xt, x->xtook);
        mgr_undo_reserve(m, kv, &x->table, x->took);
        return rc ? rc : DP_ENOMEM;
    }
    if (x->xrow)
        mgr_x_ids(m, &x->xt, x->xrow, x->xt.n_blocks * m->xfold);
    return 0;
}

/* The shares x takes or names, named at once so that the others of this
 * batch take them too (the one backend call writes them): a copy of its
 * prefix, and a kept share, whose lists are this call's selection, written
 * before any later move of the call reads them. Then its move. */
static void name_shares(dp_kv_mgr *m, mig_plan *p, mig_entry *x)
{
    const dp_kv_migration *g = x->g;
    dp_kv_seq *kv = g->kv;
    const int32_t bt = p->d->bt;
    x->held = x->nref;
    if (x->share > 0) {
        if (!share_held(kv->dshare))
            dprefix_join(&m->dpx, x->share - 1);
        kv->dshare = share_of(x->share - 1);
    } else if (x->share < 0) {
        const int32_t id = dprefix_add(&m->dpx, g->tokens, -x->share, x->table.blocks);
        x->held = id >= 0 ? -x->share : 0;
        kv->dshare = id >= 0 ? share_of(id) : share_none();
    }
    int32_t *keep_out = NULL;
    x->kid = share_none();
    if (x->found >= 0) {
        if (!share_eq(kv->kshare, share_of(x->found)))
            dprefix_join(&m->dpx, x->found);
        x->kid = share_of(x->found);
    } else if (x->tag) {
        const int32_t id = dprefix_add_kept(&m->dpx, g->tokens, kv->n_slots, x->tag,
                                            x->table.blocks, x->kslots, x->held / bt, p->rows,
                                            g->n_keep);
        if (id >= 0) {
            x->kid = share_of(id);
            keep_out = dprefix_keep(&m->dpx, id);
            x->held = x->kslots;
        }
    }
    if (p->src == DP_PATH_PREFILL) { /* a recompression leaves its share once it succeeds */
        if (share_held(kv->kshare) && !share_eq(kv->kshare, x->kid))
            mgr_leave_kept(m, kv); /* joined at admission, not taken */
        kv->kshare = x->kid;
    }
    x->co = p->src == DP_PATH_DECODE && g->pos > 0 ? kv_seq_prompt_end_opts(kv) : kv->copts;
    const int32_t nb = x->nref / bt;
    p->mv[p->k] = (dp_kv_move){
        .co = &x->co, .src = kv->table.blocks, .n_src_blocks = kv->table.n_blocks,
        .n_slots = kv->n_slots, .dst = x->table.blocks + nb, .n_dst_blocks = x->table.n_blocks - nb,
        .n_keep = g->n_keep, .q = g->q, .q_stride = g->q_stride, .n_q = g->n_q, .n_ref = x->nref,
        .attn = p->src == DP_PATH_DECODE ? &kv->attn : NULL, .keep_given = x->keep_given,
        .keep_out = keep_out, .xdst = x->xrow, .n_xdst_blocks = x->xt.n_blocks * m->xfold};
}

/* Plans and reserves g's move as p's next entry; one that cannot move gets
 * its rc (or, a recompression without free blocks, waits for the scratch). */
static void plan_entry(dp_kv_mgr *m, mig_plan *p, dp_kv_migration *g)
{
    dp_kv_seq *kv = g->kv;
    if (g->n_keep > kv->n_slots)
        g->n_keep = kv->n_slots;
    if (p->d->group && p->src == DP_PATH_DECODE) {
        /* A grouped cache is not compacted again (its groups are sealed):
         * a resumed turn's new text stays whole. */
        g->rc = DP_ENOSPC;
        return;
    }
    mig_entry *x = &p->e[p->k];
    x->g = g;
    kv_table_init(&x->table);
    plan_front_share(m, p, x);
    plan_kept_share(m, p, x);
    const int rc = reserve_entry(m, p, x);
    if (rc == DP_ENOSPC && p->src == DP_PATH_DECODE) {
        p->staged[p->n_staged++] = g; /* after the others, through the scratch */
        return;
    }
    if (rc) {
        g->rc = rc;
        return;
    }
    name_shares(m, p, x);
    g->n_ref = x->nref;
    p->k++;
}

/* The batch's move failed: x keeps its cache and gives back what it took. */
static void undo_entry(dp_kv_mgr *m, const mig_plan *p, mig_entry *x, int rc)
{
    dp_kv_seq *kv = x->g->kv;
    x->g->rc = rc;
    if (p->src == DP_PATH_PREFILL) { /* a recompression keeps its table */
        mgr_leave_kept(m, kv);
        mgr_leave_share(m, kv);
    }
    mgr_undo_reserve(m, kv, &x->xt, x->xtook);
    mgr_undo_reserve(m, kv, &x->table, x->took);
    free(x->xrow);
}

/* x moved (p->mv[i]): its new tables replace the old, whose blocks go back. */
static void commit_entry(dp_kv_mgr *m, const mig_plan *p, mig_entry *x, int32_t i)
{
    dp_kv_migration *g = x->g;
    dp_kv_seq *kv = g->kv;
    const dp_kv_move *mv = &p->mv[i];
    const int32_t bt = p->d->bt;
    free(x->xrow);
    if (x->xt.n_blocks > 0) {
        free(kv->xtable.blocks); /* (empty on the prefill path) */
        kv->xtable = x->xt;
        kv->x_n = kv->n_slots;
    }
    /* A kept share's scorer is the one that chose its slots (its namer's,
     * recorded here first when both are in this batch). */
    if (share_held(x->kid) && mv->keep_out)
        m->dpx.e[share_id(x->kid)].scorer = (int32_t)mv->scorer;
    g->scorer = share_held(x->kid) && mv->keep_given ? (dp_scorer)m->dpx.e[share_id(x->kid)].scorer
                                                     : mv->scorer;
    if (mv->keep_given)
        m->kept_shared++;
    if (p->src == DP_PATH_PREFILL) {
        if (m->has_pc)
            mgr_protect_prompt(m, kv);
        kv->mig_pos = kv->n_slots;
        kv->mig_keep = g->n_keep;
        kv->exact_from = kv->mig_pos - kv->copts.window;
        if (kv->early_at > 0 && g->n_keep < kv->n_slots) {
            /* Planned to switch early, compacted at its prompt's end
             * instead: the promise for its whole prompt on the decode path
             * is one block again, as any migration's (and its exempt
             * table's next block). */
            int32_t want = 1 + mgr_xblocks_for(m, kv, (int64_t)kv->n_slots + bt) -
                           kv->xtable.n_blocks;
            if (want < 1)
                want = 1;
            if (kv->decode_reserve > want) {
                m->decode_reserved -= kv->decode_reserve - want;
                kv->decode_reserve = want;
            }
        }
        if (g->n_keep < kv->n_slots)
            kv->early_at = 0;
    } else {
        note_compaction(kv, g);
        if (g->n_ref == 0)
            mgr_leave_share(m, kv); /* its new table holds none of the share's blocks */
        mgr_leave_kept(m, kv);
    }
    /* What it held goes back to its pool (named prefill blocks stay cached
     * for the next turn); a recompression's freed blocks are taken again a
     * token at a time, like any other. */
    kv_table_release(&kv->table, kv_mgr_pool_of(m, kv));
    free(kv->table.blocks);
    kv->table = x->table;
    kv->path = DP_PATH_DECODE;
    kv->n_slots = g->n_keep;
    kv->ref_blocks = x->held / bt;
    attn_acc_reset(&kv->attn); /* its slots were rearranged */
    kv->sealed = kv->roff = 0;
    mgr_seal_groups(m, kv);
}

/* Up to MIGRATE_BATCH sequences, all on path src, all of decode type d:
 * planned and reserved one by one, moved in one backend call, then each
 * committed (or, the call failed, undone); staged recompressions last. */
static int32_t migrate_batch(dp_kv_mgr *m, dp_kv_migration **mg, int32_t n, dp_path src,
                             dp_kv_dtype *d)
{
    mig_plan plan, *p = &plan;
    p->src = src;
    p->d = d;
    p->rows = m->mig.comp.n_layers * m->mig.comp.n_kv_heads;
    p->k = p->n_staged = p->n_pins = 0;
    for (int32_t i = 0; i < n; i++)
        plan_entry(m, p, mg[i]);
    kv_migrator_set_exempt(&m->mig, d->xstore);
    /* (A grouped type's migration writes its residual: the arena's type.) */
    const int rc = p->k == 0 ? 0
                             : kv_migrate(&m->mig, src == DP_PATH_PREFILL ? m->store : d->store,
                                          d->group ? m->store : d->store, p->mv, p->k);
    if (rc)
        dp_log(DP_LOG_ERROR, "kvcache: migration of %d sequences failed (%s); they keep their "
               "caches", p->k, dp_strerror(rc));
    for (int32_t i = 0; i < p->k; i++) {
        if (rc)
            undo_entry(m, p, &p->e[i], rc);
        else
            commit_entry(m, p, &p->e[i], i);
    }
    for (int32_t i = 0; i < p->n_pins; i++)
        dprefix_leave(&m->dpx, p->pins[i]);
    int32_t moved = rc ? 0 : p->k;
    for (int32_t i = 0; i < p->n_staged; i++)
        if ((p->staged[i]->rc = recompress_staged(m, p->staged[i])) == 0)
            moved++;
    return moved;
}

int kv_mgr_note_query(dp_kv_mgr *m, dp_kv_seq *kv, const float *q, int64_t q_stride, int32_t slot)
{
    if (kv->path != DP_PATH_DECODE || slot < 0 || slot >= kv->n_slots)
        return DP_EINVAL;
    return compressor_accumulate(&m->mig.comp, &kv->attn, m->dt[kv->dt].store, kv->table.blocks, q, q_stride,
                                 slot);
}

int32_t kv_mgr_migrate(dp_kv_mgr *m, dp_kv_migration *mg, int32_t n)
{
    if (!m->dual || !m->be)
        return 0;
    /* Each sequence's source is where it is now: a migrated one is not
     * taken again by the pass over the decode path. */
    for (int32_t i = 0; i < n; i++) {
        mg[i].rc = 1; /* not yet run */
        mg[i].n_ref = 0;
        mg[i].lost = false;
        mg[i].scorer = mg[i].kv->copts.scorer;
    }
    int32_t moved = 0;
    dp_kv_migration *batch[MIGRATE_BATCH];
    /* One backend call per source pool and decode type. */
    for (int src = DP_PATH_PREFILL; src <= DP_PATH_DECODE; src++)
        for (int t = 0; t < m->n_dt; t++) {
            int32_t k = 0;
            for (int32_t i = 0; i < n; i++) {
                if (mg[i].rc != 1 || mg[i].kv->path != (dp_path)src || mg[i].kv->dt != t)
                    continue;
                mg[i].rc = 0;
                batch[k++] = &mg[i];
                if (k == MIGRATE_BATCH) {
                    moved += migrate_batch(m, batch, k, (dp_path)src, &m->dt[t]);
                    k = 0;
                }
            }
            if (k > 0)
                moved += migrate_batch(m, batch, k, (dp_path)src, &m->dt[t]);
        }
    /* A prompt that could not move stays whole on the prefill path for good
     * (it no longer needs the decode pool's promise). */
    for (int32_t i = 0; i < n; i++)
        if (mg[i].rc && mg[i].kv->path == DP_PATH_PREFILL) {
            mg[i].kv->dual = false;
            drop_promise(m, mg[i].kv);
            mgr_leave_share(m, mg[i].kv);
            mgr_leave_kept(m, mg[i].kv);
        }
    return moved;
}

void kv_mgr_keep_reply(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed)
{
    if (!m->reuse_replies || !m->be || kv->path != DP_PATH_DECODE || kv->swapped.slots ||
        kv->recompressed || kv->mig_pos <= 0)
        return;
    /* A request's own decode type writes back only where it loses nothing
     * (the prefill type): the prefix cache serves every request, and one
     * that asked for f16 must not read another's q4_0 rows. */
    if ((kv->dt != 0 && !m->dt[kv->dt].by_ref) || seq_group(m, kv) > 0)
        return; /* (a grouped cache's rows are not where the window's mapping says) */
    /* From the window on, the compact cache holds every position whole, in
     * order: position p is at slot p + off in every head (the window's kept
     * slots are the last of the compaction, the reply's follow them). */
    const int32_t bt = m->pool.block_tokens;
    const int32_t off = kv->mig_keep - kv->mig_pos;
    const int32_t first = kv->hashed_blocks, whole_from = kv->exact_from;
    if (off != 0 && first * bt < whole_from)
        return;
    int32_t nb = n_computed / bt - first;
    /* Only blocks nobody protects or was promised: evicting a protected
     * prompt (this one's included) for a best-effort copy loses more. */
    int32_t avail = kv_pool_n_free(&m->pool) - m->pool.n_warm;
    if (m->shared && kv_pool_n_free(&m->pool) - m->decode_reserved < avail)
        avail = kv_pool_n_free(&m->pool) - m->decode_reserved;
    if (nb > avail)
        nb = avail;
    if (nb <= 0)
        return;
    const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
    const size_t n = (size_t)nb * (size_t)bt;
    int32_t *keep = kv_migrator_keep(&m->mig, rows * n);
    if (!keep)
        return;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++)
            keep[r * n + j] = (int32_t)((size_t)first * (size_t)bt + j) + off;
    dp_block_table t;
    kv_table_init(&t);
    if (kv_table_reserve(&t, &m->pool, (int64_t)n) != 0) {
        kv_table_destroy(&t, &m->pool);
        return;
    }
    dp_compact_seq cs = {kv->table.blocks, kv->table.n_blocks, t.blocks, t.n_blocks, (int32_t)n,
                         keep};
    if (m->be->ops->kv_compact(m->be, m->dt[kv->dt].store, m->store, &cs, 1) == 0) {
        for (int32_t i = 0; i < nb; i++)
            mgr_name_next_block(m, kv, t.blocks[i], tokens);
        m->reply_blocks += nb;
    }
    kv_table_destroy(&t, &m->pool); /* free and named: cached for the next turn */
}

int kv_mgr_select(dp_kv_mgr *m, const dp_kv_seq *kv, const dp_compress_opts *co, const float *q,
                  int64_t q_stride, const int32_t *q_slot, int32_t n_q, int32_t k, int32_t *keep)
{
    return compressor_select(&m->mig.comp, co, m->store, kv->table.blocks, kv->n_slots, q, q_stride,
                             q_slot, n_q, k, keep);
}
