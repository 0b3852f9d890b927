/* mgr_parked.c: finished turns' compact caches kept for the conversation's
 * next turn (kv_mgr_park), found for a prompt that starts with what one
 * holds (park_find) and continued by its admission (mgr_park_resume), and
 * evicted, oldest first, when an allocation needs their blocks
 * (mgr_park_reclaim: spilled to the swap space, or dropped). */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- parked turns ----------------------------------------------------------- */

/* Whether a cache compacted under x serves a sequence compacting under y
 * (the random scorer's seed aside: its selection is as good as any draw). */
static bool same_settings(const dp_compress_opts *x, const dp_compress_opts *y)
{
    return x->scorer == y->scorer && x->keep_ratio == y->keep_ratio && x->sinks == y->sinks &&
           x->window == y->window && x->prefix == y->prefix;
}

/* Takes parked cache i out of the list (its blocks still held). */
static dp_kv_parked park_take(dp_kv_mgr *m, int32_t i)
{
    dp_kv_parked p = m->parked[i];
    m->parked[i] = m->parked[--m->n_parked];
    m->parked_blocks -= seq_dblocks(&p.kv) - p.kv.ref_blocks;
    if (share_held(p.kv.dshare))
        dprefix_park(&m->dpx, share_id(p.kv.dshare), -1);
    if (share_held(p.kv.kshare))
        dprefix_park(&m->dpx, share_id(p.kv.kshare), -1);
    return p;
}

/* Puts a cache park_take took back in the list. */
static void park_put(dp_kv_mgr *m, const dp_kv_parked *p)
{
    if (share_held(p->kv.dshare))
        dprefix_park(&m->dpx, share_id(p->kv.dshare), 1);
    if (share_held(p->kv.kshare))
        dprefix_park(&m->dpx, share_id(p->kv.kshare), 1);
    m->parked[m->n_parked++] = *p;
    m->parked_blocks += seq_dblocks(&p->kv) - p->kv.ref_blocks;
}

/* Drops parked cache i: its blocks go back to the pool (those a share holds
 * stay the share's). */
void mgr_park_drop(dp_kv_mgr *m, int32_t i)
{
    dp_kv_parked p = park_take(m, i);
    kv_mgr_free(m, &p.kv);
    kv_seq_destroy(&p.kv);
    free(p.tokens);
}

/* The oldest parked cache in device memory (spilled false) or in the swap
 * space (true), or -1. */
static int32_t park_oldest(const dp_kv_mgr *m, bool spilled)
{
    int32_t o = -1;
    for (int32_t i = 0; i < m->n_parked; i++)
        if ((m->parked[i].kv.swapped.slots != NULL) == spilled &&
            (o < 0 || m->parked[i].stamp < m->parked[o].stamp))
            o = i;
    return o;
}

size_t kv_mgr_parked_host_bytes(const dp_kv_mgr *m)
{
    size_t b = 0;
    for (int32_t i = 0; i < m->n_parked; i++)
        b += (size_t)m->parked[i].kv.swapped.n_blocks * m->swap.block_bytes;
    return b;
}

/* Whether a copy of n_blocks fits the swap space once every spilled parked
 * turn has given its host memory back (none is dropped for nothing). */
bool mgr_swap_can_take(const dp_kv_mgr *m, int32_t n_blocks)
{
    return m->swap.used_bytes - kv_mgr_parked_host_bytes(m) + (size_t)n_blocks * m->swap.block_bytes <=
           m->swap.cap_bytes;
}

/* Drops the oldest spilled parked cache: its host memory goes back to the
 * swap space. False when there is none. */
bool mgr_park_drop_spilled(dp_kv_mgr *m)
{
    const int32_t i = park_oldest(m, true);
    if (i < 0)
        return false;
    mgr_park_drop(m, i);
    m->park_evictions++;
    return true;
}

/* Parked cache i leaves device memory: copied to the swap space (host
 * memory, making room there by dropping older spilled ones) where there is
 * one, for its next turn to copy back, else dropped. */
static void park_spill(dp_kv_mgr *m, int32_t i)
{
    /* Out of the list while older spilled ones are dropped (which moves
     * entries in it), back in once it is in the swap space. */
    dp_kv_parked p = park_take(m, i);
    int rc = m->has_swap && mgr_swap_can_take(m, seq_dblocks(&p.kv)) ? DP_ENOSPC : DP_EUNSUPPORTED;
    while (rc == DP_ENOSPC && (rc = mgr_swap_out_seq(m, &p.kv)) == DP_ENOSPC)
        if (!mgr_park_drop_spilled(m))
            break;
    if (rc) {
        kv_mgr_free(m, &p.kv);
        kv_seq_destroy(&p.kv);
        free(p.tokens);
        m->park_evictions++;
        return;
    }
    /* Its blocks came back to the pool; shares it held are others' now (it
     * comes back in blocks of its own, as a swapped-in sequence does). */
    mgr_leave_share(m, &p.kv);
    mgr_leave_kept(m, &p.kv);
    p.kv.ref_blocks = 0;
    park_put(m, &p);
    m->park_spills++;
}

/* Moves the oldest parked caches out of device memory (to the swap space,
 * or dropped) until the decode pool (the arena, when shared) has need
 * blocks beyond those promised; none when even all of them would not make
 * the room (a sequence that cannot fit now leaves the others' caches
 * alone). Whether the room is there. */
bool mgr_park_reclaim(dp_kv_mgr *m, int32_t need)
{
    int32_t have = kv_pool_n_free(m->dpool) - m->decode_reserved;
    if (have >= need || m->n_parked == 0 || (int64_t)have + kv_mgr_parked_blocks(m) < need)
        return have >= need;
    int32_t i;
    while (have < need && (i = park_oldest(m, false)) >= 0) {
        park_spill(m, i);
        have = kv_pool_n_free(m->dpool) - m->decode_reserved;
    }
    return have >= need;
}

/* Drops the oldest parked caches until the sliding-window layers' pool
 * (swa.h) has need blocks beyond those promised; none when even all of
 * them would not make the room. Whether the room is there. */
bool mgr_swa_reclaim(dp_kv_mgr *m, int32_t need)
{
    int32_t have = kv_pool_n_free(&m->swa.pool) - m->swa.reserved, parked = 0;
    for (int32_t i = 0; i < m->n_parked && have < need; i++)
        parked += swa_held(&m->parked[i].kv.w);
    if (have >= need || have + parked < need)
        return have >= need;
    while (have < need && m->n_parked > 0) {
        const int32_t i = park_oldest(m, false) >= 0 ? park_oldest(m, false) : park_oldest(m, true);
        mgr_park_drop(m, i);
        m->park_evictions++;
        have = kv_pool_n_free(&m->swa.pool) - m->swa.reserved;
    }
    return have >= need;
}

bool kv_mgr_park(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed)
{
    /* Past its compaction's prompt, slot mig_keep + i holds position
     * mig_pos + i in every head: a prefix of its tokens is a prefix of its
     * slots. */
    if (m->max_parked <= 0 || !m->dual || !kv->dual || kv->path != DP_PATH_DECODE ||
        kv->swapped.slots || kv->recompressed || kv->mig_pos <= 0 || !tokens ||
        n_computed < kv->mig_pos || kv->n_slots != kv->mig_keep + (n_computed - kv->mig_pos) ||
        (kv_seq_has_x(kv) && kv->x_n != n_computed) || (m->has_swa && kv->w.pos != n_computed))
        return false;
    int32_t *copy = malloc((size_t)n_computed * sizeof *copy);
    if (!copy)
        return false;
    memcpy(copy, tokens, (size_t)n_computed * sizeof *copy);
    if (m->n_parked == m->max_parked) {
        int32_t o = park_oldest(m, true);
        mgr_park_drop(m, o >= 0 ? o : park_oldest(m, false));
        m->park_evictions++;
    }
    /* Its prompt's whole blocks are no longer protected: the parked cache
     * stands for them (both would hold the history twice). */
    mgr_unprotect_prompt(m, kv);
    free(kv->warm);
    kv->warm = NULL;
    drop_promise(m, kv);
    if (m->has_swa)
        swa_settle(&m->swa, &kv->w);
    attn_acc_destroy(&kv->attn);
    park_put(m, &(dp_kv_parked){*kv, copy, n_computed, ++m->park_clock});
    m->parks++;
    const bool dual = kv->dual, exempt = kv->exempt;
    const uint8_t dt = kv->dt;
    const dp_compress_opts co = kv->copts;
    kv_seq_init(kv, dual, &co); /* the tables moved to the parked cache */
    kv->exempt = exempt;
    kv->dt = dt;
    return true;
}

/* The parked cache that tokens[0..n) continue furthest, or -1, and how far:
 * *len tokens, the whole of its last compaction's prompt at least, at most
 * n - tail where that leaves it (tail >= 1 tokens are left to compute, for
 * SnapKV's window; a new stretch shorter than that is scored with fewer
 * queries rather than computing the history again). */
static int32_t park_find(const dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                         int32_t tail, int32_t *len)
{
    int32_t best = -1, best_len = 0;
    const int32_t limit = n - (tail > 1 ? tail : 1);
    for (int32_t i = 0; i < m->n_parked; i++) {
        const dp_kv_parked *p = &m->parked[i];
        const int32_t lim = p->n < n - 1 ? p->n : n - 1;
        if (lim < p->kv.mig_pos || !same_settings(&p->kv.copts, &kv->copts) ||
            p->kv.dt != kv->dt || (m->n_exempt > 0 && p->kv.exempt != kv->exempt))
            continue;
        int32_t c = 0;
        while (c < lim && p->tokens[c] == tokens[c])
            c++;
        if (c < p->kv.mig_pos)
            continue;
        if (c > limit)
            c = limit > p->kv.mig_pos ? limit : p->kv.mig_pos;
        if (c > best_len) {
            best = i;
            best_len = c;
        }
    }
    *len = best_len;
    return best;
}

static bool may_resume(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_tokens, int32_t tail)
{
    return m->n_parked > 0 && m->dual && kv->dual && kv->table.n_blocks == 0 &&
           !share_held(kv->dshare) && !share_held(kv->kshare) && tail < n_tokens;
}

/* Counts (tally false) or tallies and clears (true) the pool references
 * parked turns hold: their tables' and those of the shares only they hold.
 * A block is theirs alone when they hold all its references. */
static int32_t park_refs(dp_kv_mgr *m, bool tally)
{
    int32_t n = 0;
    /* Parked caches' compact tables, their exempt tables, then shares. */
    for (int32_t i = 0; i < 2 * m->n_parked + m->dpx.max_entries; i++) {
        const int32_t *b;
        int32_t nb;
        if (i < m->n_parked) {
            b = m->parked[i].kv.table.blocks;
            nb = m->parked[i].kv.table.n_blocks;
        } else if (i < 2 * m->n_parked) {
            b = m->parked[i - m->n_parked].kv.xtable.blocks;
            nb = m->parked[i - m->n_parked].kv.xtable.n_blocks;
        } else {
            const dp_dprefix_entry *x = &m->dpx.e[i - 2 * m->n_parked];
            if (!x->name || x->users <= 0 || x->users != x->parked)
                continue;
            b = x->blocks;
            nb = x->n_slots / m->dpx.block_tokens;
        }
        for (int32_t j = 0; j < nb; j++) {
            uint32_t *c = &m->park_cnt[b[j]];
            if (!tally)
                (*c)++;
            else if (*c)
                n += *c == m->dpool->refcnt[b[j]], *c = 0; /* counted once */
        }
    }
    return n;
}

int32_t kv_mgr_parked_blocks(dp_kv_mgr *m)
{
    if (m->n_parked == 0)
        return 0;
    park_refs(m, false);
    return park_refs(m, true);
}

/* Blocks the parked caches would give back, for admission's choice to run
 * a turn whole: the running tally, or where kivi4 groups may be shared
 * between tables (which the tally counts once per holder) the exact count,
 * so that a turn never chooses a room that reclaiming cannot make (it
 * would choose it again at every retry). */
int32_t mgr_parked_room(dp_kv_mgr *m)
{
    return m->gs.name ? kv_mgr_parked_blocks(m) : m->parked_blocks;
}

bool kv_mgr_can_resume(const dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                       int32_t tail)
{
    int32_t len;
    return may_resume(m, kv, n, tail) && park_find(m, kv, tokens, n, tail, &len) >= 0;
}

/* kv_mgr_admit for a sequence that continues a parked cache: 1 when none
 * matches (admitted as any other), 0 when it took the cache, DP_ENOSPC
 * when the rest of its prompt has no room now (the cache stays parked, cut
 * to what this sequence matched). */
int mgr_park_resume(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                    int32_t tail, bool busy, int32_t *reused)
{
    int32_t c;
    const int32_t i = may_resume(m, kv, n_tokens, tail) ? park_find(m, kv, tokens, n_tokens, tail, &c)
                                                         : -1;
    if (i < 0)
        return 1;
    /* A later chat turn under compress_turns = auto that arrives while
     * nothing else runs (busy: the scheduler's, a burst included), with
     * room for it whole in blocks no one holds (its own parked cache's
     * included), runs whole: the exact history, as with dualpath off; its
     * parked cache is dropped. Under load it continues
     * the compact cache: computing the history again would cost every
     * running sequence its share of the steps, and holding it whole the
     * memory others need (measured in docs/dualpath.md: a rule on memory
     * alone ran nearly every turn whole at 64 MiB, at dualpath off's
     * speed). */
    const dp_kv_seq *pk = &m->parked[i].kv;
    if (kv->whole_if_room && !busy && m->shared &&
        mgr_whole_has_room(m, kv, n_tokens, mgr_own_dblocks(m, pk))) {
        mgr_park_drop(m, i);
        return 1;
    }
    /* Out of the list first, so that making room never drops it; what it
     * holds past the match (a reply the client did not send back as it
     * was generated) goes back to the pool. */
    dp_kv_parked p = park_take(m, i);
    int32_t slots = p.kv.mig_keep + (c - p.kv.mig_pos);
    const int32_t g = seq_group(m, &p.kv);
    if (g > 0 && slots <= p.kv.sealed) {
        /* A grouped cache keeps whole groups: a match that ends inside one
         * keeps the lead and the groups before it and computes the rest
         * again (and no resume where that reaches back into the
         * compaction's slots). A match inside the lead keeps it as a
         * residual (nothing sealed). */
        const int32_t bt = seq_bt(m, &p.kv);
        const int32_t back = slots < bt ? 0 : (slots - bt) % g;
        if (slots - back < p.kv.mig_keep || c - back <= 0) {
            park_put(m, &p);
            return 1;
        }
        slots -= back;
        c -= back;
        p.kv.sealed = slots < bt ? 0 : slots;
        p.kv.roff = 0;
    }
    /* Its sliding-window layers must still hold the window of position c
     * (else its history is computed again), and find the blocks the rest
     * of the prompt needs beside those (dropping older parked turns). */
    if (m->has_swa && !swa_can_resume(&m->swa, &p.kv.w, c)) {
        park_put(m, &p);
        return 1;
    }
    const int32_t keep_b = (int32_t)mgr_table_blocks(m, &p.kv, slots);
    /* (Its exempt layers hold positions 0..c.) */
    const int32_t keep_x = mgr_xblocks_for(m, &p.kv, c);
    /* The rest of the prompt and the first generated token, on the decode
     * path; a spilled cache first comes back whole from the swap space. */
    const int32_t total = mgr_dblocks_for(m, &p.kv, (int64_t)slots + (n_tokens - c) + 1) +
                          mgr_xblocks_for(m, &p.kv, (int64_t)n_tokens + 1);
    const int32_t wm = busy ? kv_mgr_watermark(m) : 0;
    const int32_t spilled = p.kv.swapped.slots ? p.kv.swapped.n_blocks : 0;
    int rc = 0;
    if ((spilled > total ? spilled : total) > m->dpool->n_blocks) {
        /* Its new text does not fit the decode path beside its history:
         * admitted as any other (its prompt whole on the prefill path). */
        park_put(m, &p);
        return 1;
    }
    if (spilled && !mgr_park_reclaim(m, (spilled > total ? spilled : total) + wm)) {
        park_put(m, &p); /* not now: it waits in the swap space */
        return DP_ENOSPC;
    }
    if (spilled && (rc = mgr_swap_in_seq(m, &p.kv, 0)) != 0) {
        /* (Not for want of room: made above.) Its history is computed again. */
        kv_mgr_free(m, &p.kv);
        kv_seq_destroy(&p.kv);
        free(p.tokens);
        m->park_evictions++;
        return 1;
    }
    if (spilled)
        m->park_restores++;
    for (int32_t b = keep_b; b < p.kv.table.n_blocks; b++)
        kv_pool_unref(m->dpool, p.kv.table.blocks[b]);
    if (p.kv.table.n_blocks > keep_b)
        p.kv.table.n_blocks = keep_b;
    for (int32_t b = keep_x; b < p.kv.xtable.n_blocks; b++)
        kv_pool_unref(m->dpool, p.kv.xtable.blocks[b]);
    if (p.kv.xtable.n_blocks > keep_x)
        p.kv.xtable.n_blocks = keep_x;
    p.kv.n_slots = slots;
    p.kv.x_n = p.kv.xtable.n_blocks > 0 ? c : 0;
    p.n = c;
    if (m->has_swa)
        swa_cut(&m->swa, &p.kv.w, c);
    const int32_t need = total - keep_b - p.kv.xtable.n_blocks;
    if (!mgr_park_reclaim(m, need + wm) ||
        (m->has_swa && !mgr_swa_reclaim(m, swa_resume_need(&m->swa, &p.kv.w, c, n_tokens)))) {
        park_put(m, &p);
        return DP_ENOSPC;
    }
    const dp_compress_opts co = kv->copts;
    const bool wir = kv->whole_if_room;
    kv_seq_destroy(kv);
    *kv = p.kv;
    kv->copts = co;
    kv->whole_if_room = wir;
    kv->early_end = kv->early_at = 0;
    kv->hist_slots = slots;
    kv->decode_reserve = need > 0 ? need : 0;
    m->decode_reserved += kv->decode_reserve;
    /* Its tables cover the rest of the prompt now, as an admitted prompt's
     * do (from the promise: cannot fail). */
    if (mgr_decode_reserve(m, kv, &kv->table, (int64_t)slots + (n_tokens - c), NULL) != 0 ||
        (kv_seq_has_x(kv) && mgr_x_reserve(m, kv, &kv->xtable, n_tokens, NULL) != 0) ||
        (m->has_swa && swa_resume(&m->swa, &kv->w, n_tokens) != 0)) {
        mgr_release_all(m, kv);
        free(p.tokens);
        return DP_ENOSPC;
    }
    free(p.tokens);
    m->resumes++;
    m->resumed_tokens += c;
    *reused = c;
    return 0;
}
