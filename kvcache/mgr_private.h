/* mgr_private.h: what the KV manager's files share and no one else sees:
 * the helpers of its accounting, growth, parked turns, swap and moves (see
 * manager.c for which file owns which concern). Include only from
 * kvcache/manager.c and kvcache/mgr_*.c. The functions below each section's
 * name are documented where that file defines them. */
#ifndef DP_KVCACHE_MGR_PRIVATE_H
#define DP_KVCACHE_MGR_PRIVATE_H

#include <string.h>

#include "manager.h"

/* ---- small helpers ------------------------------------------------------ */

/* Tokens per decode block of the sequence's decode type. */
static inline int32_t seq_bt(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->dt[kv->dt].bt;
}

/* Tokens per group of the sequence's decode type (0: not grouped). */
static inline int32_t seq_group(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return kv->dual ? m->dt[kv->dt].group : 0;
}

/* Whether the sequence may share a copy of its prefix in decode blocks
 * (dpx): those are in the server's decode type. */
static inline bool seq_shares(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->share_front && kv->dt == 0;
}

/* Whether it may take or name a kept share (dpx, in the server's type's
 * blocks; in any arena, unlike a prefix copy). */
static inline bool seq_keeps_shared(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->dpx.e && kv->dt == 0 && !seq_group(m, kv);
}

/* Its blocks in the decode pool (compact and exempt tables). */
static inline int32_t seq_dblocks(const dp_kv_seq *kv)
{
    return kv->table.n_blocks + kv->xtable.n_blocks;
}

/* Slots of a compaction to n_keep that a kept share can hold: its whole
 * decode blocks (of the server's type), fewer than n_keep (the copy is
 * never empty). */
static inline int32_t kept_slots(const dp_kv_mgr *m, int32_t n_keep)
{
    return n_keep > 0 ? (n_keep - 1) / m->dbt * m->dbt : 0;
}

static inline void drop_promise(dp_kv_mgr *m, dp_kv_seq *kv)
{
    m->decode_reserved -= kv->decode_reserve;
    kv->decode_reserve = 0;
}

/* ---- mgr_admit.c ---- */

int32_t mgr_dblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n);
int64_t mgr_table_blocks(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n);
int32_t mgr_xblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n);
void mgr_x_ids(const dp_kv_mgr *m, const dp_block_table *t, int32_t *row, int32_t cap);
int32_t mgr_front_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_keep);
int32_t mgr_ref_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_slots, int32_t n_keep);
void mgr_leave_share(dp_kv_mgr *m, dp_kv_seq *kv);
void mgr_leave_kept(dp_kv_mgr *m, dp_kv_seq *kv);
uint64_t mgr_kept_tag(const dp_compress_opts *co, int32_t n_keep);
bool mgr_whole_has_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_tokens, int32_t extra);
int32_t mgr_kept_find(dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                      int32_t n_keep);
bool mgr_decode_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t need, int32_t *from_promise);
int mgr_decode_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n_slots,
                       int32_t *took);
int mgr_x_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n, int32_t *took);
void mgr_undo_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int32_t took);
void mgr_protect_prompt(dp_kv_mgr *m, dp_kv_seq *kv);
void mgr_unprotect_prompt(dp_kv_mgr *m, dp_kv_seq *kv);
void mgr_release_all(dp_kv_mgr *m, dp_kv_seq *kv);

/* ---- mgr_grow.c ---- */

void mgr_seal_groups(dp_kv_mgr *m, dp_kv_seq *kv);
void mgr_name_next_block(dp_kv_mgr *m, dp_kv_seq *kv, int32_t block, const int32_t *tokens);

/* ---- mgr_parked.c ---- */

void mgr_park_drop(dp_kv_mgr *m, int32_t i);
bool mgr_swap_can_take(const dp_kv_mgr *m, int32_t n_blocks);
bool mgr_swa_reclaim(dp_kv_mgr *m, int32_t need);
bool mgr_park_drop_spilled(dp_kv_mgr *m);
bool mgr_park_reclaim(dp_kv_mgr *m, int32_t need);
int32_t mgr_parked_room(dp_kv_mgr *m);
int mgr_park_resume(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                    int32_t tail, bool busy, int32_t *reused);

/* ---- mgr_swap.c ---- */

int32_t mgr_own_dblocks(const dp_kv_mgr *m, const dp_kv_seq *kv);
int mgr_swap_out_seq(dp_kv_mgr *m, dp_kv_seq *kv);
int mgr_swap_in_seq(dp_kv_mgr *m, dp_kv_seq *kv, int64_t n_slots);

/* ---- mgr_moves.c ---- */

int mgr_scratch_reserve(dp_kv_mgr *m, dp_kv_dtype *d, int32_t n);

#endif
