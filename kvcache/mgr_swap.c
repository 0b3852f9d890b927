/* mgr_swap.c: a decode-path cache as one copy in the swap space (a
 * preempted sequence, a parked turn spilled for room), and the count of
 * decode blocks running sequences hold. */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- swap: a decode-path cache as one copy ------------------------------------- */

/* Blocks of kv's tables that dropping it gives back: those it does not hold
 * by reference, less its kivi4 groups that other tables hold too
 * (gshare.h: seq_dblocks - ref_blocks counts them as its own). */
int32_t mgr_own_dblocks(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    int32_t n = seq_dblocks(kv) - kv->ref_blocks;
    const int32_t g = seq_group(m, kv);
    if (!m->gs.name || g <= 0 || kv->sealed <= 0)
        return n;
    int32_t k = dp_kv_group_rstart(m->dt[kv->dt].bt, g, kv->sealed);
    k = k < kv->table.n_blocks ? k : kv->table.n_blocks;
    for (int32_t i = 1; i < k; i++) /* (table[0] is the lead) */
        n -= m->dpool->refcnt[kv->table.blocks[i]] > 1;
    return n;
}

void kv_mgr_held_begin(dp_kv_mgr *m)
{
    if (!m->held_stamp)
        return;
    if (++m->held_epoch == 0) { /* wrapped: old marks could match again */
        memset(m->held_stamp, 0, (size_t)m->dpool->n_blocks * sizeof *m->held_stamp);
        m->held_epoch = 1;
    }
}

int32_t kv_mgr_held_blocks(dp_kv_mgr *m, const dp_kv_seq *kv)
{
    int32_t n = seq_dblocks(kv) - kv->ref_blocks;
    const int32_t g = seq_group(m, kv);
    if (!m->held_stamp || g <= 0 || kv->sealed <= 0)
        return n;
    /* Its groups (table[1..k): table[0] is the lead): a shared one is
     * counted by the first of its holders only. */
    int32_t k = dp_kv_group_rstart(m->dt[kv->dt].bt, g, kv->sealed);
    k = k < kv->table.n_blocks ? k : kv->table.n_blocks;
    for (int32_t i = 1; i < k; i++) {
        const int32_t b = kv->table.blocks[i];
        if (m->dpool->refcnt[b] <= 1)
            continue;
        n -= m->held_stamp[b] == m->held_epoch;
        m->held_stamp[b] = m->held_epoch;
    }
    return n;
}

/* Copies a decode-path cache (its compact table, then its exempt table) to
 * the swap space and frees its blocks. */
int mgr_swap_out_seq(dp_kv_mgr *m, dp_kv_seq *kv)
{
    const int32_t nx = kv->xtable.n_blocks;
    if (nx == 0)
        return kv_swap_out(&m->swap, &kv->table, &kv->swapped);
    dp_block_table both;
    kv_table_init(&both);
    if (kv_table_room(&both, seq_dblocks(kv)))
        return DP_ENOMEM;
    memcpy(both.blocks, kv->table.blocks, (size_t)kv->table.n_blocks * sizeof(int32_t));
    memcpy(both.blocks + kv->table.n_blocks, kv->xtable.blocks, (size_t)nx * sizeof(int32_t));
    both.n_blocks = seq_dblocks(kv);
    int rc = kv_swap_out(&m->swap, &both, &kv->swapped);
    if (rc == 0) { /* both's release returned every block */
        kv->table.n_blocks = kv->xtable.n_blocks = 0;
        kv->swapped_x = nx;
    }
    free(both.blocks);
    return rc;
}

/* Brings a cache mgr_swap_out_seq saved back, bit for bit, into new blocks;
 * then (n_slots > 0) its compact table covers n_slots and its exempt table
 * x_n + 1, from blocks the caller made room for. (The swap space counts in
 * whole blocks; the tables in the sequence's decode type.) */
int mgr_swap_in_seq(dp_kv_mgr *m, dp_kv_seq *kv, int64_t n_slots)
{
    const int32_t nx = kv->swapped_x, nc = kv->swapped.n_blocks - nx;
    dp_block_table both;
    kv_table_init(&both);
    int rc = kv_table_room(&kv->table, nc);
    if (rc == 0)
        rc = kv_table_room(&kv->xtable, nx);
    if (rc == 0)
        rc = kv_swap_in(&m->swap, &kv->swapped, &both, 0);
    if (rc) {
        free(both.blocks);
        return rc;
    }
    memcpy(kv->table.blocks, both.blocks, (size_t)nc * sizeof(int32_t));
    if (nx > 0) /* (no exempt table: xtable.blocks may be NULL) */
        memcpy(kv->xtable.blocks, both.blocks + nc, (size_t)nx * sizeof(int32_t));
    kv->table.n_blocks = nc;
    kv->xtable.n_blocks = nx;
    kv->swapped_x = 0;
    free(both.blocks);
    if (n_slots > 0) {
        /* (Room made by the caller: cannot fail. Were it to, the next
         * step's growth asks again.) */
        if (kv_table_reserve_bt(&kv->table, m->dpool, mgr_table_blocks(m, kv, n_slots), 1) ||
            (nx > 0 && kv_table_reserve_bt(&kv->xtable, m->dpool, (int64_t)kv->x_n + 1,
                                           m->dt[kv->dt].xbt)))
            dp_log(DP_LOG_DEBUG, "kvcache: a swapped-in cache found no block for its next token");
    }
    return 0;
}


/* A running sequence's swap-out before parked turns' spills: they give up
 * their host memory (oldest first) when it is short. */
static int swap_out_running(dp_kv_mgr *m, dp_kv_seq *kv)
{
    int rc;
    while ((rc = mgr_swap_out_seq(m, kv)) == DP_ENOSPC)
        if (!mgr_swap_can_take(m, seq_dblocks(kv)) || !mgr_park_drop_spilled(m))
            break;
    return rc;
}

int kv_mgr_swap_out(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (kv->path == DP_PATH_DECODE && m->has_swap && swap_out_running(m, kv) == 0) {
        /* Path and slots stay: the cache comes back whole (its prefix in
         * blocks of its own). */
        drop_promise(m, kv);
        mgr_leave_share(m, kv);
        mgr_leave_kept(m, kv);
        kv->ref_blocks = 0;
        return 0;
    }
    if (kv->path == DP_PATH_DECODE) {
        m->decode_recomputes++;
        dp_log(DP_LOG_DEBUG, "kvcache: no swap space: a compact cache will be recomputed");
    }
    mgr_release_all(m, kv);
    if (kv->whole_if_room)
        kv->dual = true; /* a later turn: whole or not, decided again at its admission */
    return DP_ENOSPC;
}

int kv_mgr_swap_in(dp_kv_mgr *m, dp_kv_seq *kv, bool busy)
{
    if (!kv->swapped.slots)
        return DP_EINVAL;
    int64_t slots = (int64_t)kv->n_slots + 1;
    /* What the copy holds, or what the next token needs where that is more. */
    const int32_t nx = kv->swapped_x, nc = kv->swapped.n_blocks - nx;
    const int32_t want = (int32_t)mgr_table_blocks(m, kv, slots);
    int32_t need = want > nc ? want : nc;
    if (nx) {
        const int32_t x = mgr_xblocks_for(m, kv, (int64_t)kv->x_n + 1);
        need += x > nx ? x : nx;
    }
    int32_t wm = busy ? kv_mgr_watermark(m) : 0;
    if (!mgr_park_reclaim(m, need + wm))
        return DP_ENOSPC;
    return mgr_swap_in_seq(m, kv, slots);
}
