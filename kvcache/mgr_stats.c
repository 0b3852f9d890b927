/* mgr_stats.c: the KV manager's gauges and counters, read in one call
 * (kv_mgr_stats) so that no one else reads its fields to report them. */
#include "mgr_private.h"

void kv_mgr_stats(dp_kv_mgr *m, const dp_kv_seq *(*next)(void *it), void *it, dp_kv_mgr_stats *s)
{
    memset(s, 0, sizeof *s);
    int32_t decode_held = 0;
    kv_mgr_held_begin(m);
    for (const dp_kv_seq *kv = next(it); kv; kv = next(it))
        if (kv->path == DP_PATH_DECODE && !kv->swapped.slots) {
            s->seqs_on_decode_path++;
            /* Blocks it holds by reference stay the prefill path's, or
             * are a decode-pool share's, counted once below. */
            decode_held += kv_mgr_held_blocks(m, kv);
            s->exempt_blocks += kv->xtable.n_blocks;
        }
    s->exempt_layers = m->n_exempt;
    /* Parked turns' blocks are counted apart: cached, taken back when needed. */
    const int32_t parked = m->dual ? kv_mgr_parked_blocks(m) : 0;
    if (m->dual && m->dpx.e)
        decode_held += m->dpx.live_blocks - dprefix_parked_blocks(&m->dpx);
    s->blocks_total = m->pool.n_blocks;
    s->blocks_used = kv_pool_n_used(&m->pool) - (m->shared ? decode_held + parked : 0);
    s->decode_blocks_total = m->dual ? m->dpool->n_blocks : 0;
    s->decode_blocks_used = !m->dual    ? 0
                            : m->shared ? decode_held
                                        : kv_pool_n_used(m->dpool) - parked;
    s->parked_blocks = parked;
    s->shared = m->shared;
    s->block_tokens = m->pool.block_tokens;
    s->decode_block_tokens = m->dual ? kv_mgr_decode_block_tokens(m) : 0;
    s->rebuilds = m->rebuilds;
    s->rebuild_prefix_tokens = m->reused_tokens - m->restored_blocks * m->pool.block_tokens;
    s->rebuild_host_tokens = m->restored_blocks * m->pool.block_tokens;
    s->reply_blocks_kept = m->reply_blocks;
    s->kept_shares = m->kept_shared;
    s->parked_turns = m->n_parked;
    s->turns_parked = m->parks;
    s->turns_resumed = m->resumes;
    s->resumed_tokens = m->resumed_tokens;
    s->parked_evictions = m->park_evictions;
    s->parked_spills = m->park_spills;
    s->parked_restores = m->park_restores;
    s->host_spilled_blocks = m->has_pc ? m->pc.spilled_blocks : 0;
    s->host_tier_blocks = m->has_host ? m->host.cap : 0;
    /* (Preempted sequences only: parked turns' spills are counted apart.) */
    s->swap_outs = m->has_swap ? m->swap.outs - m->park_spills : 0;
    s->swap_ins = m->has_swap ? m->swap.ins - m->park_restores : 0;
    s->parked_host_bytes = m->has_swap ? (int64_t)kv_mgr_parked_host_bytes(m) : 0;
    s->swap_bytes = m->has_swap ? (int64_t)m->swap.used_bytes - s->parked_host_bytes : 0;
    s->swap_space_bytes = m->has_swap ? (int64_t)m->swap.cap_bytes : 0;
    s->decode_recomputes = m->decode_recomputes;
    s->recompressions_staged = m->staged_recompressions;
    s->groups_sealed = m->sealed_groups;
    s->groups_shared = m->gs.hits;
    s->swa_blocks_total = m->has_swa ? m->swa.pool.n_blocks : 0;
    s->swa_blocks_used = m->has_swa ? kv_pool_n_used(&m->swa.pool) : 0;
}

void kv_mgr_seq_bytes(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t kept, int32_t all,
                      int64_t *bytes, int64_t *bytes_full)
{
    /* In one arena a decode block takes an arena block, whatever it uses of it. */
    const double dper = (double)(m->shared ? m->prefill_block_bytes : m->decode_block_bytes) /
                        m->dt[kv->dt].bt;
    const double pper = (double)m->prefill_block_bytes / m->pool.block_tokens;
    const double xtok = kv_seq_has_x(kv) ? (double)all * dper / m->xfold : 0.0;
    *bytes = (int64_t)((double)kept * dper + xtok + 0.5);
    const int32_t g = m->dt[kv->dt].group;
    if (g > 0) { /* the lead and whole groups an arena block each, the rest in the residual */
        const int32_t bt = m->dt[kv->dt].bt;
        const int32_t sealed = kv_mgr_group_sealed(bt, g, kept);
        *bytes = (int64_t)dp_kv_group_rstart(bt, g, sealed) * (int64_t)m->prefill_block_bytes +
                 (int64_t)((double)(kept - sealed) * pper + 0.5);
    }
    *bytes_full = (int64_t)((double)all * pper + 0.5);
    if (m->has_swa) { /* the sliding layers: their window, of every token */
        const double wper = (double)m->swa_block_bytes / m->swa.pool.block_tokens;
        const int32_t held = all < m->swa.window ? all : m->swa.window;
        *bytes += (int64_t)((double)held * wper + 0.5);
        *bytes_full += (int64_t)((double)all * wper + 0.5);
    }
}
