/* mgr_admit.c: the KV manager's accounting: what a sequence needs in each
 * pool (the one formula, kv_mgr_need), the decode blocks promised at
 * admission and taken as it grows, admission itself (kv_mgr_admit: a cached
 * prefix reused, or a parked turn taken back through mgr_parked.c) and
 * freeing. */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- needs and reservations ---------------------------------------------- */

/* Decode-path blocks that hold n tokens of the sequence's type. Grouped: at
 * most its lead, its whole groups, a residual of up to a group and the
 * recent window (sealed at the next growth) starting anywhere in its first
 * block, and the group being sealed. */
int32_t mgr_dblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t bt = seq_bt(m, kv), g = seq_group(m, kv);
    if (g > 0) {
        const int64_t w = (int64_t)g + kv_mgr_group_recent(bt), r = n < w ? n : w;
        return (int32_t)(1 + n / g + (bt - 1 + r + bt - 1) / bt + 1);
    }
    return (int32_t)((n + bt - 1) / bt);
}

/* The blocks a table of n slots has in the sequence's layout now: n / bt
 * rounded up, or, grouped on the decode path, its lead and sealed groups
 * and then its residual from roff (mgr_dblocks_for bounds what it may come to
 * need). */
int64_t mgr_table_blocks(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t bt = seq_bt(m, kv), g = seq_group(m, kv);
    if (g > 0 && kv->path == DP_PATH_DECODE) {
        const int64_t r = n - kv->sealed;
        return dp_kv_group_rstart(bt, g, kv->sealed) +
               (r > 0 ? (kv->roff + r + bt - 1) / bt : 0);
    }
    return (n + bt - 1) / bt;
}

/* Decode blocks an exempt table of n positions takes (0: the sequence keeps
 * none). */
int32_t mgr_xblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t xbt = m->dt[kv->dt].xbt;
    return m->n_exempt > 0 && kv->exempt && kv->dual && !seq_group(m, kv)
               ? (int32_t)((n + xbt - 1) / xbt)
               : 0;
}

/* An exempt table's batch row: entry i (xbt / xfold slots) of block
 * i / xfold, folded (backend.h kv_view). */
void mgr_x_ids(const dp_kv_mgr *m, const dp_block_table *t, int32_t *row, int32_t cap)
{
    const int32_t n = t->n_blocks * m->xfold, nb = m->dpool->n_blocks;
    for (int32_t i = 0; i < n && i < cap; i++)
        row[i] = t->blocks[i / m->xfold] + (i % m->xfold) * nb;
}

int32_t kv_mgr_x_row(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t *row, int32_t cap)
{
    mgr_x_ids(m, &kv->xtable, row, cap);
    return kv->xtable.n_blocks * m->xfold;
}

/* The whole decode blocks of a compaction's forced front (the prefix kept
 * whole), fewer than n_keep slots so that the copy is never empty. */
int32_t mgr_front_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_keep)
{
    int32_t f = compress_front(&kv->copts, n_keep);
    if (f > n_keep - 1)
        f = n_keep - 1;
    return f > 0 ? f / seq_bt(m, kv) * seq_bt(m, kv) : 0;
}

/* Leading slots of a compaction to n_keep of n_slots that the new table
 * holds by reference: in one arena of one type, the prefill blocks of its
 * front; elsewhere, on the decode path, the decode-pool share it holds (a
 * migration's share is found by kv_mgr_migrate from its tokens; before it,
 * the share admission found). */
int32_t mgr_ref_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_slots, int32_t n_keep)
{
    if (n_keep < 1 || n_keep > n_slots)
        return 0;
    /* A grouped type keeping a whole prompt takes its blocks as they are
     * (its groups are then sealed from them). */
    if (seq_group(m, kv) > 0 && n_keep == n_slots && kv->path == DP_PATH_PREFILL)
        return (n_keep - 1) / seq_bt(m, kv) * seq_bt(m, kv);
    if (m->dt[kv->dt].by_ref)
        return mgr_front_slots(m, kv, n_keep);
    if (!seq_shares(m, kv))
        return 0;
    if (!share_held(kv->dshare))
        return 0;
    const int32_t id = share_id(kv->dshare), r = dprefix_slots(&m->dpx, id);
    /* On the decode path its table starts with the share's blocks (or holds
     * a kept share's, which start with them). */
    if (kv->path == DP_PATH_DECODE &&
        (kv->ref_blocks * m->dbt < r ||
         memcmp(kv->table.blocks, dprefix_blocks(&m->dpx, id), (size_t)(r / m->dbt) * sizeof(int32_t))))
        return 0;
    return r < n_keep && r <= compress_front(&kv->copts, n_keep) ? r : 0;
}

void mgr_leave_share(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (share_held(kv->dshare))
        dprefix_leave(&m->dpx, share_id(kv->dshare));
    kv->dshare = share_none();
}

void mgr_leave_kept(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (share_held(kv->kshare))
        dprefix_leave(&m->dpx, share_id(kv->kshare));
    kv->kshare = share_none();
}

/* A kept share's tag: what chose its slots. Sequences with the same tokens
 * and the same tag have the same K/V and select the same slots, so a taker
 * keeps the share's lists instead of selecting again. The fields are those
 * kv_seq_same_compaction compares; 0 (no share) for the random scorer,
 * seeded per request. */
uint64_t mgr_kept_tag(const dp_compress_opts *co, int32_t n_keep)
{
    if (co->scorer == DP_SCORER_RANDOM)
        return 0;
    uint32_t ratio;
    memcpy(&ratio, &co->keep_ratio, sizeof ratio);
    const uint64_t w[] = {(uint64_t)co->scorer, ratio, (uint64_t)(uint32_t)co->sinks,
                          (uint64_t)(uint32_t)co->window, (uint64_t)(uint32_t)co->prefix,
                          (uint64_t)(uint32_t)n_keep};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        h = (h ^ w[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

/* Whether one arena holds kv whole (n_tokens and four blocks of reply, less
 * the blocks its table holds already) beside what others hold, were
 * promised and protect. */
bool mgr_whole_has_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_tokens, int32_t extra)
{
    dp_kv_seq whole = *kv;
    whole.dual = false;
    dp_kv_need wn = kv_mgr_need(m, &whole, n_tokens, 4 * (int64_t)m->pool.block_tokens);
    return wn.prefill - kv->table.n_blocks <=
           kv_pool_n_free(&m->pool) - m->pool.n_warm - m->decode_reserved + extra;
}

/* The kept share of tokens[0..n) compacted to n_keep by kv's settings, or -1. */
int32_t mgr_kept_find(dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                      int32_t n_keep)
{
    const int32_t ks = kept_slots(m, n_keep);
    if (!seq_keeps_shared(m, kv) || !tokens || ks < m->dbt)
        return -1;
    int32_t id = dprefix_find_kept(&m->dpx, tokens, n, mgr_kept_tag(&kv->copts, n_keep));
    return id >= 0 && dprefix_slots(&m->dpx, id) == ks && m->dpx.e[id].cols == n_keep ? id : -1;
}

/* Where a predicted early switch happens at the latest for a prompt of
 * n_tokens of which got came from the prefix cache: at the end of the chunk
 * that first passes early_min (0: not before the prompt's end). */
static int32_t early_point(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t got, int32_t n_tokens)
{
    if (kv->early_end <= 0 || m->early_min <= 0 || m->early_chunk <= 0 || seq_group(m, kv) > 0)
        return 0;
    int64_t s = (int64_t)(got > m->early_min - 1 ? got : m->early_min - 1) + m->early_chunk;
    /* Only while its prompt lasts (a recompute's tokens go on past it). */
    return s < n_tokens && s < kv->early_end ? (int32_t)s : 0;
}

/* A promise of decode blocks: never below 0, which would lower the
 * others' (m->decode_reserved). A grouped type's can come to fewer blocks
 * than the prompt's it holds by reference once its groups are sealed, but
 * each seal takes a block before it gives any back: 1 at least. */
static int32_t decode_promise(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t floor = seq_group(m, kv) > 0 ? 1 : 0;
    return n < floor ? floor : n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

dp_kv_need kv_mgr_need(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more)
{
    dp_kv_need n = {0, 0, 0};
    /* The sliding layers hold a window and a chunk at most, on either path. */
    if (m->has_swa)
        n.swa = swa_need(&m->swa, n_cached, n_more);
    if (!m->dual || !kv->dual) {
        n.prefill = kv_pool_blocks_for(&m->pool, n_cached + n_more);
        return n;
    }
    int32_t c = n_cached > INT32_MAX ? INT32_MAX : (int32_t)n_cached;
    if (kv->early_at > 0 && kv->early_at < c && kv->path == DP_PATH_PREFILL) {
        /* Switched early: the prefill path up to the switch, then the whole
         * prompt on the decode path until its end's compaction. */
        /* (What it holds by reference: its front at the earliest switch.) */
        const int32_t e0 = m->early_min < c ? m->early_min : c;
        n.prefill = kv_pool_blocks_for(&m->pool, kv->early_at);
        n.decode = decode_promise(m, kv,
                                  (int64_t)mgr_dblocks_for(m, kv, (int64_t)c + n_more) -
                                      mgr_ref_slots(m, kv, e0, e0) / seq_bt(m, kv) +
                                      mgr_xblocks_for(m, kv, (int64_t)c + n_more));
        return n;
    }
    n.prefill = kv_pool_blocks_for(&m->pool, n_cached);
    const int32_t keep = compress_n_keep(&kv->copts, c);
    int64_t d = (int64_t)keep + n_more;
    if (m->decode_budget > 0 && !seq_group(m, kv)) {
        /* Recompression holds it below the budget, whatever it generates
         * (while it runs, both tables: a copied prefix is in both). */
        int64_t cap = (int64_t)kv_seq_prefix(kv) * (m->dt[kv->dt].by_ref ? 1 : 2) + m->decode_budget +
                      m->budget_keep + 1;
        if (d > cap)
            d = cap;
    }
    /* Blocks it keeps by reference are counted on the prefill path, or
     * are a share's that others hold (a kept share it joined at admission
     * holds more of them than its front). */
    int32_t r = mgr_ref_slots(m, kv, c, keep);
    const int32_t kid = share_id(kv->kshare);
    if (share_held(kv->kshare) && kv->path == DP_PATH_PREFILL && dprefix_slots(&m->dpx, kid) > r &&
        m->dpx.e[kid].cols == keep)
        r = dprefix_slots(&m->dpx, kid);
    /* Exempt layers keep every token, whatever the budget. */
    n.decode = decode_promise(m, kv, (int64_t)mgr_dblocks_for(m, kv, d) - r / seq_bt(m, kv) +
                                         mgr_xblocks_for(m, kv, (int64_t)c + n_more));
    return n;
}

/* Whether need more decode blocks are there for kv: from its promise
 * (*from_promise of them), the rest from what no one else was promised. */
bool mgr_decode_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t need, int32_t *from_promise)
{
    *from_promise = need < kv->decode_reserve ? need : kv->decode_reserve;
    return kv_pool_n_free(m->dpool) - (m->decode_reserved - *from_promise) >= need;
}

bool kv_mgr_can_switch_early(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    /* (A grouped type's prompt is compacted once, at its end.) */
    if (!m->dual || !kv->dual || kv->path != DP_PATH_PREFILL || kv->n_slots < 1 ||
        seq_group(m, kv) > 0)
        return false;
    /* What mgr_decode_reserve takes for a table of n_slots (less the front it
     * holds by reference), as the migration will ask. */
    const int32_t need = mgr_dblocks_for(m, kv, kv->n_slots) -
                         mgr_ref_slots(m, kv, kv->n_slots, kv->n_slots) / seq_bt(m, kv) +
                         mgr_xblocks_for(m, kv, kv->n_slots);
    int32_t own;
    /* (Parked turns' blocks are room: the switch takes them back.) */
    return mgr_decode_room(m, kv, need, &own) ||
           kv_pool_n_free(m->dpool) - m->decode_reserved + m->parked_blocks >= need - own;
}

bool kv_mgr_can_fit(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more)
{
    if (kv_mgr_fits(m, kv_mgr_need(m, kv, n_cached, n_more)))
        return true;
    /* Whole only in one arena: there a compressed sequence never needs more
     * than it would whole. With split pools a request admitted compressed
     * might outgrow the decode pool, so it must fit compressed. */
    dp_kv_seq whole = *kv;
    whole.dual = false;
    return m->shared && kv->dual && kv_mgr_fits(m, kv_mgr_need(m, &whole, n_cached, n_more));
}

int32_t kv_mgr_watermark(const dp_kv_mgr *m)
{
    /* About 1 % of the decode pool stays free at admission (vLLM's default
     * watermark), so that sequences just admitted can grow for a while
     * before the pool runs out and someone must be preempted. */
    if (!m->dual)
        return 0;
    int32_t w = m->dpool->n_blocks / 100;
    return w > 0 ? w : 1;
}

/* Takes decode-pool blocks so that t covers n_slots, drawing on kv's promise
 * first (*took: how much of it, for mgr_undo_reserve); blocks promised to
 * others are off limits. All or nothing. */
static int decode_reserve_bt(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n_slots,
                             int32_t bt, int32_t *took)
{
    int32_t need = (int32_t)((n_slots + bt - 1) / bt) - t->n_blocks;
    if (took)
        *took = 0;
    if (need <= 0)
        return 0;
    int32_t from_promise;
    if (!mgr_decode_room(m, kv, need, &from_promise) && !mgr_park_reclaim(m, need - from_promise))
        return DP_ENOSPC;
    int rc = kv_table_reserve_bt(t, m->dpool, n_slots, bt);
    if (rc)
        return rc;
    kv->decode_reserve -= from_promise;
    m->decode_reserved -= from_promise;
    if (took)
        *took = from_promise;
    return 0;
}

/* A compact table (t) covering n_slots. */
int mgr_decode_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n_slots,
                       int32_t *took)
{
    /* A grouped sequence's table on the decode path counts its sealed
     * groups and residual (t is its own table then; a migration's new
     * table is all residual, from its start): reserved in blocks, one
     * "slot" each. */
    if (seq_group(m, kv) > 0 && t == &kv->table && kv->path == DP_PATH_DECODE)
        return decode_reserve_bt(m, kv, t, mgr_table_blocks(m, kv, n_slots), 1, took);
    return decode_reserve_bt(m, kv, t, n_slots, seq_bt(m, kv), took);
}

/* The sequence's exempt table covering n positions (none kept: nothing). */
int mgr_x_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n, int32_t *took)
{
    if (took)
        *took = 0;
    return mgr_xblocks_for(m, kv, n) > 0 ? decode_reserve_bt(m, kv, t, n, m->dt[kv->dt].xbt, took) : 0;
}

/* The blocks of a mgr_decode_reserve go back (t destroyed) and its promise with them. */
void mgr_undo_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int32_t took)
{
    kv_table_destroy(t, m->dpool);
    kv->decode_reserve += took;
    m->decode_reserved += took;
}

/* Protects the named prompt blocks of a migrating sequence (best effort:
 * without memory for the list they are simply not protected). */
void mgr_protect_prompt(dp_kv_mgr *m, dp_kv_seq *kv)
{
    int32_t n = kv->hashed_blocks < kv->table.n_blocks ? kv->hashed_blocks : kv->table.n_blocks;
    if (n <= 0 || kv->n_warm > 0)
        return;
    struct dp_kv_warm *w = realloc(kv->warm, (size_t)n * sizeof *w);
    if (!w)
        return;
    kv->warm = w;
    for (int32_t i = 0; i < n; i++) {
        const int32_t b = kv->table.blocks[i];
        w[i] = (struct dp_kv_warm){b, kv_pool_gen(&m->pool, b)};
        kv_pool_protect(&m->pool, b);
    }
    kv->n_warm = n;
}

void mgr_unprotect_prompt(dp_kv_mgr *m, dp_kv_seq *kv)
{
    /* Oldest last: the most recently freed is the prompt's first block, the
     * last to be reused among them. */
    for (int32_t i = kv->n_warm - 1; i >= 0; i--)
        kv_pool_unprotect(&m->pool, kv->warm[i].block, kv->warm[i].gen);
    kv->n_warm = 0;
}

void mgr_release_all(dp_kv_mgr *m, dp_kv_seq *kv)
{
    mgr_unprotect_prompt(m, kv);
    mgr_leave_share(m, kv);
    mgr_leave_kept(m, kv);
    kv->mig_pos = kv->mig_keep = kv->exact_from = 0;
    kv->ref_blocks = 0;
    kv->sealed = kv->roff = 0;
    kv->recompressed = false;
    attn_acc_reset(&kv->attn);
    kv_table_release(&kv->table, kv_mgr_pool_of(m, kv));
    kv_table_release(&kv->xtable, m->dpool);
    kv->x_n = 0;
    kv->swapped_x = 0;
    drop_promise(m, kv);
    kv->path = DP_PATH_PREFILL;
    kv->n_slots = 0;
    kv->hashed_blocks = 0;
    kv->chain = 0;
    kv->early_at = 0;
    if (m->has_swa)
        swa_release(&m->swa, &kv->w);
}

int kv_mgr_admit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                 int32_t tail, bool busy, int32_t *reused)
{
    /* A swapped-out cache comes back through kv_mgr_swap_in, as it left:
     * admitted from its tokens, its copy would be lost. */
    if (kv->swapped.slots)
        return DP_EINVAL;
    /* The next turn of a conversation whose previous turn's compact cache
     * is parked continues it: nothing of its history is computed again. */
    int rc = mgr_park_resume(m, kv, tokens, n_tokens, tail, busy, reused);
    if (rc <= 0)
        return rc;
    /* A prompt that extends an earlier one (the next turn of a conversation,
     * or a recompute after preemption) takes the cached prefix back: from the
     * pool where its blocks are intact, from the host tier where they were
     * spilled; only the rest is computed. */
    int32_t got = 0, from_host = 0;
    /* A later chat turn keeps its prompt whole in the prefix cache for the
     * next turn anyway: a compact copy beside it adds memory, so it runs
     * whole, its reply in place, while the arena has room for that without
     * taking protected blocks or others' promises (four blocks of reply
     * included); only when memory binds does it migrate, for the room.
     * Decided before the prefix match (nothing of it counted as cached), so
     * that a whole turn takes its last window from the cache too; decided
     * again after it, with its cached blocks. Where finished turns park
     * (resume_turns), only while nothing else runs: under load a turn
     * whose parked cache is gone is compressed and parks again, where
     * whole it would hold its whole history, in the prefill type, while
     * the others' turns wait (measured in docs/dualpath.md: a 20-turn run
     * at 64 MiB fell to one sequence running whole beside seven waiting). */
    const bool may_whole = kv->whole_if_room && kv->dual && m->shared &&
                           (!busy || m->max_parked == 0);
    bool went_whole = false;
    if (may_whole && kv->table.n_blocks == 0 &&
        mgr_whole_has_room(m, kv, n_tokens, mgr_parked_room(m))) {
        kv->dual = false;
        went_whole = true;
        if (tail < n_tokens) /* not a prompt scored whole */
            tail = 1;
    }
    /* The compaction of the same prompt that a running sequence made (n > 1,
     * identical requests): it will keep those slots without selecting, so
     * no window of its own must run for SnapKV (only its last token), and
     * it holds the share from now until it migrates. */
    if (m->dual && kv->dual && !share_held(kv->kshare) && kv->table.n_blocks == 0) {
        int32_t id = mgr_kept_find(m, kv, tokens, n_tokens, kv_mgr_migration_keep(m, kv, n_tokens));
        if (id >= 0) {
            dprefix_join(&m->dpx, id);
            kv->kshare = share_of(id);
            if (tail < n_tokens) /* not a prompt scored whole */
                tail = 1;
        }
    }
    if (m->has_pc && kv->table.n_blocks == 0) {
        uint64_t last = 0;
        int32_t limit = n_tokens - (tail > 1 ? tail : 1);
        got = limit > 0 ? prefix_match(&m->pc, tokens, limit, &kv->table, &from_host, &last) : 0;
        kv->hashed_blocks = kv->table.n_blocks;
        kv->chain = last;
    }
    /* A share of its prefix that others hold now is blocks it will not take:
     * it becomes one of the share's users (left again if not admitted, or
     * if it runs whole), so the share outlives whoever holds it now until
     * this sequence migrates. */
    if (seq_shares(m, kv) && kv->dual && !share_held(kv->dshare)) {
        int32_t s = mgr_front_slots(m, kv, compress_n_keep(&kv->copts, n_tokens));
        int32_t share = s > 0 ? dprefix_find(&m->dpx, tokens, s) : -1;
        if (share >= 0) {
            dprefix_join(&m->dpx, share);
            kv->dshare = share_of(share);
        }
    }
    if (may_whole && kv->dual && mgr_whole_has_room(m, kv, n_tokens, mgr_parked_room(m))) {
        kv->dual = false;
        went_whole = true;
        mgr_leave_share(m, kv);
        mgr_leave_kept(m, kv);
    }
    /* The prompt (or, after a recompute, prompt + output so far) goes to the
     * prefill pool whole, so a running prefill never waits for blocks; with
     * dualpath the decode pool promises its compressed size and a block. */
    if (m->shared && kv->dual &&
        !kv_mgr_fits(m, kv_mgr_need(m, kv, n_tokens, seq_bt(m, kv)))) {
        /* Its prompt and its compressed copy never fit at once: it runs
         * whole, as with dualpath off (kv_mgr_can_fit). */
        kv->dual = false;
        mgr_leave_share(m, kv);
        mgr_leave_kept(m, kv);
        dp_log(DP_LOG_DEBUG, "kvcache: a %d-token sequence runs whole: too long to migrate in "
               "this memory", n_tokens);
    }
    const bool dual = m->dual && kv->dual;
    dp_kv_need need = kv_mgr_need(m, kv, n_tokens, dual ? seq_bt(m, kv) : 1);
    /* A predicted early switch is planned when it needs less than the
     * switch at the prompt's end (with a quantized decode path it does) and
     * fits at all. */
    kv->early_at = dual && !share_held(kv->kshare) ? early_point(m, kv, got, n_tokens) : 0;
    if (kv->early_at > 0) {
        dp_kv_need en = kv_mgr_need(m, kv, n_tokens, seq_bt(m, kv));
        if (en.prefill + en.decode < need.prefill + need.decode && kv_mgr_fits(m, en))
            need = en;
        else
            kv->early_at = 0;
    }
    int64_t slots = !dual ? (int64_t)n_tokens + 1 : kv->early_at > 0 ? kv->early_at : n_tokens;
    /* The watermark only applies while others run: an idle server admits
     * anything that fits at all. */
    int32_t wm = dual && busy && need.decode > 0 ? kv_mgr_watermark(m) : 0;
    int32_t need_p = need.prefill - kv->table.n_blocks;
    bool ok;
    if (m->shared) /* one arena: the prompt, its promise and the others' promises */
        ok = mgr_park_reclaim(m, need_p + (dual ? need.decode + wm : 0));
    else
        ok = need_p <= kv_pool_n_free(&m->pool) && (!dual || mgr_park_reclaim(m, need.decode + wm));
    /* The sliding-window layers' blocks for the prompt's window and chunk. */
    if (ok && m->has_swa && (!mgr_swa_reclaim(m, swa_prompt_need(&m->swa, n_tokens)) ||
                             swa_admit(&m->swa, &kv->w, n_tokens) != 0))
        ok = false;
    if (!ok || kv_table_reserve(&kv->table, &m->pool, slots) != 0) {
        /* Not now: the matched blocks go back, still named, for the retry. */
        if (m->has_swa)
            swa_release(&m->swa, &kv->w);
        kv_table_release(&kv->table, &m->pool);
        kv->hashed_blocks = 0;
        kv->chain = 0;
        mgr_leave_share(m, kv);
        mgr_leave_kept(m, kv);
        if (went_whole)
            kv->dual = true; /* decided again at the next try */
        kv->early_at = 0;
        return DP_ENOSPC;
    }
    kv->path = DP_PATH_PREFILL;
    kv->n_slots = got;
    if (got > 0) {
        m->rebuilds++;
        m->reused_tokens += got;
        m->restored_blocks += from_host;
    }
    kv->decode_reserve = dual ? need.decode : 0;
    m->decode_reserved += kv->decode_reserve;
    *reused = got;
    return 0;
}

void kv_mgr_free(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (m->has_swap)
        kv_swap_drop(&m->swap, &kv->swapped);
    mgr_release_all(m, kv);
}
