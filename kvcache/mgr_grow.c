/* mgr_grow.c: tables that take blocks as tokens come (kv_mgr_grow), full
 * prefill blocks named in the prefix cache (kv_mgr_commit), and a grouped
 * decode type's whole groups sealed from its residual as they fill. */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- grouped decode types: whole groups sealed from the residual ---------- */

/* The name of the group of g rows from row roff of res[0..n_res) (gshare.h),
 * 0 where a block it reads is not a named prefill block. */
static uint64_t group_name(const dp_kv_mgr *m, const int32_t *res, int32_t n_res, int32_t roff,
                           int32_t g, int32_t bt)
{
    const int32_t n = (roff + g - 1) / bt + 1;
    uint64_t names[64];
    if (!m->has_pc || !m->gs.name || n > n_res || n > 64)
        return 0;
    for (int32_t i = 0; i < n; i++)
        names[i] = m->pc.block_hash[res[i]];
    return gshare_name(&m->gs, names, n, roff, g);
}

/* The block for the next group of kv's residual (its first g rows from
 * roff, in res[0..n_res)): another sequence's sealed from the same named
 * rows (one more reference), or a new one written by kv_compact (which
 * quantizes the group at once). -1 when there is no room or it failed. */
static int32_t seal_one(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *res, int32_t n_res,
                        uint64_t name)
{
    const dp_kv_dtype *d = &m->dt[kv->dt];
    const int32_t g = seq_group(m, kv);
    int32_t blk = gshare_find(&m->gs, name);
    if (blk >= 0) {
        /* No block taken: the one promised for it goes back. */
        const int32_t p = kv->decode_reserve > 0;
        kv->decode_reserve -= p;
        m->decode_reserved -= p;
        kv_pool_ref(m->dpool, blk);
        m->gs.hits++;
        return blk;
    }
    int32_t from_promise;
    if (!mgr_decode_room(m, kv, 1, &from_promise) && !mgr_park_reclaim(m, 1 - from_promise))
        return -1;
    const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
    int32_t *keep = kv_migrator_keep(&m->mig, rows * (size_t)g);
    if (!keep || kv_pool_alloc(m->dpool, &blk))
        return -1;
    for (size_t r = 0; r < rows; r++)
        for (int32_t t = 0; t < g; t++)
            keep[r * (size_t)g + (size_t)t] = kv->roff + t;
    const dp_compact_seq cs = {res, n_res, &blk, 1, g, keep};
    int rc = m->be->ops->kv_compact(m->be, m->store, d->store, &cs, 1);
    if (rc) {
        dp_log(DP_LOG_ERROR, "kvcache: sealing a %s group failed (%s); it stays in the "
               "residual", dp_kv_type_name(d->type), dp_strerror(rc));
        kv_pool_unref(m->dpool, blk);
        return -1;
    }
    kv->decode_reserve -= from_promise;
    m->decode_reserved -= from_promise;
    gshare_add(&m->gs, name, blk);
    return blk;
}

/* Writes each whole group at the front of a grouped sequence's residual
 * into a block of its type (seal_one), and gives back the residual blocks
 * that no longer hold anything. The lead (table[0], the first arena block)
 * stays as it is once the first group follows it (backend.h
 * dp_kv_group_lead). Best effort: a group that finds no block stays in the
 * residual, read there in the arena's type, until the next growth tries
 * again. */
void mgr_seal_groups(dp_kv_mgr *m, dp_kv_seq *kv)
{
    const int32_t g = seq_group(m, kv);
    if (g <= 0 || !m->be || kv->path != DP_PATH_DECODE)
        return;
    const int32_t bt = m->dt[kv->dt].bt;
    const int32_t w = g + kv_mgr_group_recent(bt); /* a group and the recent window */
    /* Nothing sealed: the residual starts at table[0] from roff 0, so the
     * lead is already in place. */
    if (kv->sealed == 0 && kv->roff == 0 && kv->n_slots >= bt + w)
        kv->sealed = bt;
    while (kv->sealed > 0 && kv->n_slots - kv->sealed >= w) {
        if (kv_table_room(&kv->table, kv->table.n_blocks + 1))
            return;
        const int32_t k = dp_kv_group_rstart(bt, g, kv->sealed), n_res = kv->table.n_blocks - k;
        int32_t *res = kv->table.blocks + k;
        const int32_t blk = seal_one(m, kv, res, n_res, group_name(m, res, n_res, kv->roff, g, bt));
        if (blk < 0)
            return;
        /* The residual blocks the group used up go; the group's block takes
         * the first place after the lead and the other groups. */
        /* (The recent window stays: the residual is never empty here.) */
        const int32_t used = (kv->roff + g) / bt;
        kv->roff = (kv->roff + g) % bt;
        kv->sealed += g;
        m->sealed_groups++;
        for (int32_t i = 0; i < used; i++)
            kv_pool_unref(m->dpool, res[i]);
        memmove(res + 1, res + used, (size_t)(n_res - used) * sizeof *res);
        res[0] = blk;
        kv->table.n_blocks = k + 1 + n_res - used;
        /* Blocks held by reference are the lead (when any is) and then the
         * residual's first ones. */
        const int32_t rref = kv->ref_blocks > 0 ? kv->ref_blocks - 1 : 0;
        kv->ref_blocks -= used < rref ? used : rref;
    }
}

/* The main tables' growth (kv_mgr_grow). */
static int grow_tables(dp_kv_mgr *m, dp_kv_seq *kv, int32_t n)
{
    const int64_t slots = (int64_t)kv->n_slots + n;
    if (kv->path == DP_PATH_DECODE) {
        mgr_seal_groups(m, kv); /* (its residual's whole groups first: fewer blocks to take) */
        /* Both tables or neither: a compact table grown alone would hold
         * blocks no need counts (a later swap-in would not make room for
         * them). */
        const bool x = kv_seq_has_x(kv);
        int32_t need = (int32_t)mgr_table_blocks(m, kv, slots) - kv->table.n_blocks, from_promise;
        if (need < 0)
            need = 0;
        if (x && mgr_xblocks_for(m, kv, (int64_t)kv->x_n + n) > kv->xtable.n_blocks)
            need += mgr_xblocks_for(m, kv, (int64_t)kv->x_n + n) - kv->xtable.n_blocks;
        if (need > 0 && !mgr_decode_room(m, kv, need, &from_promise) &&
            !mgr_park_reclaim(m, need - from_promise))
            return DP_ENOSPC;
        const int32_t had = kv->table.n_blocks;
        int32_t took;
        int rc = mgr_decode_reserve(m, kv, &kv->table, slots, &took);
        if (rc == 0 && x && (rc = mgr_x_reserve(m, kv, &kv->xtable, (int64_t)kv->x_n + n, NULL))) {
            for (int32_t b = had; b < kv->table.n_blocks; b++)
                kv_pool_unref(m->dpool, kv->table.blocks[b]);
            kv->table.n_blocks = had;
            kv->decode_reserve += took;
            m->decode_reserved += took;
        }
        return rc;
    }
    /* In a shared arena the blocks promised to decode paths are not free. */
    if (m->shared && !mgr_park_reclaim(m, kv_pool_blocks_for(&m->pool, slots) - kv->table.n_blocks))
        return DP_ENOSPC;
    return kv_table_reserve(&kv->table, &m->pool, slots);
}

int kv_mgr_grow(dp_kv_mgr *m, dp_kv_seq *kv, int32_t n)
{
    int rc = grow_tables(m, kv, n);
    /* The sliding layers by position: n more, on either path, parked
     * turns dropped for room. (A failure here leaves the main growth
     * taken: the retry finds it done.) */
    if (!rc && m->has_swa &&
        (rc = swa_grow(&m->swa, &kv->w, (int64_t)kv->w.pos + n)) == DP_ENOSPC) {
        const int32_t bt = m->swa.pool.block_tokens;
        const int32_t more = (int32_t)(((int64_t)kv->w.pos + n + bt - 1) / bt) - kv->w.n;
        if (mgr_swa_reclaim(m, more - kv->w.promise))
            rc = swa_grow(&m->swa, &kv->w, (int64_t)kv->w.pos + n);
    }
    return rc;
}

/* Names block as the one holding the sequence's next unnamed block of
 * tokens (tokens: the sequence's, from the start), chaining its name. */
void mgr_name_next_block(dp_kv_mgr *m, dp_kv_seq *kv, int32_t block, const int32_t *tokens)
{
    const int32_t bt = m->pool.block_tokens;
    const int32_t *blk = tokens + (size_t)kv->hashed_blocks * bt;
    kv->chain = prefix_chain(&m->pc, kv->chain, blk, bt);
    prefix_register(&m->pc, block, kv->chain, blk);
    kv->hashed_blocks++;
}

void kv_mgr_commit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n)
{
    kv->n_slots += n;
    if (kv_seq_has_x(kv))
        kv->x_n += n;
    if (m->has_swa)
        swa_commit(&m->swa, &kv->w, n);
    if (!m->has_pc || kv->path != DP_PATH_PREFILL)
        return;
    /* Name the prefill blocks filled so far (slot == position there). */
    const int32_t bt = m->pool.block_tokens;
    while ((kv->hashed_blocks + 1) * bt <= kv->n_slots && kv->hashed_blocks < kv->table.n_blocks)
        mgr_name_next_block(m, kv, kv->table.blocks[kv->hashed_blocks], tokens);
}
