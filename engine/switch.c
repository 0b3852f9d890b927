/* switch.c: the dual path as the engine drives it: which sequences migrate
 * to the decode path and with which captured queries, the path detector's
 * early switch, a resumed turn's prompt end, and recompression under a
 * decode budget. The KV manager moves the blocks (kv_mgr_migrate); this
 * file decides when and records what it did. */
#include "engine_private.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"

/* ---- the dual path: migration and recompression --------------------------- */

static void record_migration(dp_engine *e, double dt, int32_t n_seqs, int64_t kept, int64_t evicted,
                             int64_t shared, bool recompress, const int64_t *by_scorer, int64_t fallbacks,
                             dp_compaction_kind kind)
{
    int64_t *counts = kind == DP_COMPACT_RECOMPRESS ? e->st.recompressions_by_scorer
                      : !recompress                 ? e->st.migrations_by_scorer
                                                    : NULL; /* a prompt's tail: counted at its switch */
    for (int i = 0; counts && i < DP_N_SCORERS; i++)
        counts[i] += by_scorer[i];
    e->st.scorer_fallbacks[kind] += fallbacks;
    if (recompress) {
        e->st.recompressions += n_seqs;
    } else {
        e->st.migrations += n_seqs;
        e->st.tokens_in_place += shared;
    }
    /* A prompt's kept and evicted tokens: at its migration, or for an early
     * switch at its prompt's end, where they are chosen. */
    e->st.tokens_kept += kept;
    e->st.tokens_evicted += evicted;
    e->st.migration_seconds += dt;
    e->st.migration_batches++;
    int b = 0;
    while (b < DP_MIGRATION_BUCKETS && dt > dp_migration_bucket_bounds[b])
        b++;
    e->st.migration_hist[b]++;
}

/* Slots kept by a compaction of the given kind. */
static int32_t compact_target(const dp_engine *e, const eng_seq *es, dp_compaction_kind kind)
{
    const dp_kv_seq *kv = &es->seq->kv;
    if (kind == DP_COMPACT_RECOMPRESS)
        return kv_mgr_budget_keep(&e->kv, kv);
    if (kind == DP_COMPACT_PROMPT_END)
        return kv_mgr_prompt_end_keep(&e->kv, kv, es->seq->n_prompt);
    if (kind == DP_COMPACT_MIGRATION)
        return kv_mgr_migration_keep(&e->kv, kv, kv->n_slots);
    /* An early switch moves the prompt so far to the decode path whole (in
     * the decode type); what it keeps is chosen at the prompt's end
     * (DP_COMPACT_PROMPT_END), where SnapKV's window is the prompt's last
     * tokens: the question a passage is kept for. Selected with the window
     * at the switch, mid-passage, a passkey lost its digits (0 of 4 found
     * where the switch at the prompt's end found 4: loadtest/early_switch.py). */
    return kv->n_slots;
}


/* usage.dualpath's bytes: the prompt's KV on the decode path (kept tokens
 * in the decode type, at the arena's bytes per decode token, and every
 * token of its exempt layers) against the same tokens whole on the
 * prefill path. */
static void note_kv_bytes(dp_engine *e, eng_seq *es)
{
    dp_kv_usage *u = &es->usage;
    kv_mgr_seq_bytes(&e->kv, &es->seq->kv, (int32_t)u->tokens_kept,
                     (int32_t)(u->tokens_kept + u->tokens_evicted), &u->kv_bytes, &u->kv_bytes_full);
}

/* Whether another live sequence with the same prompt is still on the
 * prefill path (n > 1 copies, identical requests): it may migrate while this
 * one decodes, so this one's compaction is named for it to share. */
static bool has_twin(dp_engine *e, const eng_seq *es)
{
    const dp_seq *s = es->seq;
    for (const eng_seq *o = e->live; o; o = o->next) {
        const dp_seq *t = o->seq;
        if (o != es && kv_seq_same_compaction(&t->kv, &s->kv) && t->kv.path == DP_PATH_PREFILL &&
            !t->kv.swapped.slots &&
            t->n_prompt == s->n_prompt &&
            memcmp(t->tokens, s->tokens, (size_t)s->n_prompt * sizeof *s->tokens) == 0)
            return true;
    }
    /* Identical requests may still be in the inbox. */
    bool twin = false;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->in_n && !twin; i++) {
        const dp_request *r = e->in_q[i];
        twin = r->n_prompt == s->n_prompt &&
               memcmp(r->prompt, s->tokens, (size_t)s->n_prompt * sizeof *s->tokens) == 0;
    }
    pthread_mutex_unlock(&e->mu);
    return twin;
}

/* Whether a compaction's kept lists are small enough to keep for any later
 * request with the same prompt (a retry, a common question), twin or not:
 * 4 bytes per layer, KV head and kept slot, 256 KiB at most (728 slots of
 * SmolLM2's 30 x 3 heads), held while the sequence decodes. */
static bool small_lists(const dp_engine *e, int32_t n_keep)
{
    const dp_hparams *hp = llama_hparams(e->model);
    return (int64_t)eng_kv_layers(e) * hp->n_kv_heads * n_keep * (int64_t)sizeof(int32_t) <=
           256 * 1024;
}

/* A prompt's end on the decode path that keeps what it has (already at or
 * below its target, or no free blocks for its compaction): its usage. */
static void note_kept_as_is(dp_engine *e, eng_seq *es)
{
    es->usage.tokens_kept = es->seq->kv.n_slots;
    es->usage.tokens_evicted = es->seq->n_prompt - es->seq->kv.n_slots;
    note_kv_bytes(e, es);
    e->st.tokens_kept += es->usage.tokens_kept;
    e->st.tokens_evicted += es->usage.tokens_evicted;
}

/* Compacts each sequence's cache into the decode pool through the KV
 * manager (one backend call per source pool), with the queries this step
 * captured where the kind scores with them, and records what happened. */
void eng_compact_seqs(dp_engine *e, eng_seq **list, int32_t n, dp_compaction_kind kind,
                      const float *q, int64_t q_stride)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const bool recompress = kind != DP_COMPACT_MIGRATION && kind != DP_COMPACT_EARLY;
    const size_t q_row = (size_t)hp->n_heads * (size_t)hp->head_dim;
    double t0 = dp_now();
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        dp_kv_migration *g = &e->mig[i];
        *g = (dp_kv_migration){.kv = &es->seq->kv, .tokens = es->seq->tokens,
                               .n_keep = compact_target(e, es, kind)};
        g->share_kept = kind == DP_COMPACT_MIGRATION && (small_lists(e, g->n_keep) || has_twin(e, es));
        g->pos = kind == DP_COMPACT_PROMPT_END ? es->seq->n_computed : 0;
        if (q && es->capture_at >= 0) {
            g->q = q + (size_t)es->capture_at * q_row;
            g->q_stride = q_stride;
            g->n_q = es->n_capture;
        }
    }
    int32_t moved = kv_mgr_migrate(&e->kv, e->mig, n);
    int64_t by_scorer[DP_N_SCORERS] = {0}, fallbacks = 0, kept = 0, evicted = 0, shared = 0;
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        const dp_kv_migration *g = &e->mig[i];
        if (g->lost)
            eng_finish_seq(e, es, DP_FINISH_ERROR, "its KV cache was lost in a recompression", false);
        if (g->rc) {
            if (kind == DP_COMPACT_PROMPT_END && !g->lost)
                note_kept_as_is(e, es); /* no free blocks: its new text stays whole */
            continue;
        }
        if (g->scorer != g->kv->copts.scorer) {
            fallbacks++;
            dp_log(DP_LOG_DEBUG, "engine: request %llu: %s scored by %s (no captured queries)",
                   (unsigned long long)es->req->id, dp_compaction_names[kind],
                   scorer_name(g->scorer));
        }
        by_scorer[g->scorer]++;
        if (!recompress) {
            if (kind == DP_COMPACT_EARLY) {
                /* Nothing is evicted before the prompt's end chooses (a
                 * request that ends at its first token keeps it all). */
                es->usage.tokens_kept = es->seq->n_prompt;
                es->usage.tokens_evicted = 0;
            } else {
                es->usage.tokens_kept = g->n_keep;
                es->usage.tokens_evicted = es->seq->n_computed - g->n_keep;
                kept += es->usage.tokens_kept;
                evicted += es->usage.tokens_evicted;
            }
            note_kv_bytes(e, es);
            shared += g->n_ref;
            path_set(&es->path, DP_PS_DECODE);
        } else if (kind == DP_COMPACT_PROMPT_END) {
            es->usage.tokens_evicted = es->seq->n_prompt - g->n_keep;
            es->usage.tokens_kept = g->n_keep;
            note_kv_bytes(e, es);
            kept += es->usage.tokens_kept;
            evicted += es->usage.tokens_evicted;
        }
    }
    if (moved > 0)
        record_migration(e, dp_now() - t0, moved, kept, evicted, shared, recompress, by_scorer,
                         fallbacks, kind);
}

/* Prompts whose ends came on the decode path (an early switch, a resumed
 * turn) are compacted to their keep ratio there; one already at or below it
 * (a resumed turn whose history was compressed more) keeps what it has. */
void eng_end_prompts_on_decode(dp_engine *e, eng_seq **list, int32_t n, const float *q,
                               int64_t q_stride)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        if (compact_target(e, es, DP_COMPACT_PROMPT_END) < es->seq->kv.n_slots) {
            list[k++] = es;
            continue;
        }
        note_kept_as_is(e, es);
    }
    if (k > 0)
        eng_compact_seqs(e, list, k, DP_COMPACT_PROMPT_END, q, q_stride);
}

/* A prompt chunk of a prefill-path sequence that the path detector may
 * switch early when it ends. */
bool eng_may_switch_early(const dp_engine *e, const eng_seq *es, const dp_sched_item *it)
{
    return es->seq->kv.dual && it->path == DP_PATH_PREFILL && !it->emits &&
           path_may_switch(&es->path, &e->popts, it->start + it->n, es->seq->n_prompt);
}

/* Updates the detector's kept-set change for a prefill-path sequence from the
 * selection its scorer makes over what has been computed so far (SnapKV
 * with the queries of the chunk's end, captured this step: q, q_stride). */
int eng_early_signal(dp_engine *e, eng_seq *es, const float *q, int64_t q_stride)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const dp_kv_seq *kv = &es->seq->kv;
    int32_t rows = eng_kv_layers(e) * hp->n_kv_heads;
    int32_t k = compress_n_keep(&kv->copts, kv->n_slots);
    int32_t *cur = malloc((size_t)rows * (size_t)k * sizeof *cur);
    if (!cur)
        return DP_ENOMEM;
    dp_compress_opts co = kv->copts;
    int32_t nq = 0, qslot[DP_MAX_CAPTURE];
    const float *qs = NULL;
    if (co.scorer == DP_SCORER_SNAPKV && es->capture_at >= 0) {
        nq = es->n_capture < DP_MAX_CAPTURE ? es->n_capture : DP_MAX_CAPTURE;
        if (nq > kv->n_slots)
            nq = kv->n_slots;
        qs = q + (size_t)(es->capture_at + es->n_capture - nq) * (size_t)hp->n_heads *
                     (size_t)hp->head_dim;
        for (int32_t j = 0; j < nq; j++)
            qslot[j] = kv->n_slots - nq + j;
    }
    e->st.early_signals++;
    if (co.scorer == DP_SCORER_SNAPKV && nq == 0)
        e->st.scorer_fallbacks[DP_COMPACT_EARLY_SIGNAL]++; /* scored by key norm */
    if (kv_mgr_select(&e->kv, kv, &co, qs, q_stride, nq ? qslot : NULL, nq, k, cur) != 0) {
        free(cur);
        return DP_ENOMEM;
    }
    if (es->prev_keep)
        es->path.last_change = path_kept_change(es->prev_keep, es->prev_k, cur, k, rows);
    free(es->prev_keep);
    es->prev_keep = cur;
    es->prev_k = k;
    return 0;
}

/* The decode queries this step captured are scored against their
 * sequences' caches (their K/V now written) for the next recompression. */
void eng_note_decode_queries(dp_engine *e, const dp_sched_plan *plan, int32_t nc)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const size_t q_row = (size_t)hp->n_heads * (size_t)hp->head_dim;
    int64_t q_stride;
    const float *q = eng_kv_queries(e, nc, &q_stride);
    int64_t missed = 0;
    for (int32_t i = 0; i < plan->n_items; i++) {
        eng_seq *es = plan->items[i].seq->owner;
        if (es->dq_at < 0 || es->seq->state != DP_SEQ_RUNNING)
            continue;
        if (kv_mgr_note_query(&e->kv, &es->seq->kv, q + (size_t)es->dq_at * q_row, q_stride,
                              es->dq_slot))
            missed++; /* no memory for its sums: scored with fewer queries */
        es->dq_at = -1;
    }
    if (missed || e->dq_missed) {
        e->st.decode_queries_missed += missed + e->dq_missed;
        e->dq_missed = 0;
    }
}

/* Sequences over the decode budget are compressed back below it. */
void eng_recompress_over_budget(dp_engine *e)
{
    if (!e->dual || e->opts.decode_budget <= 0)
        return;
    eng_seq **list = e->lists[0];
    int32_t n = 0;
    for (eng_seq *es = e->live; es && n < e->opts.max_seqs; es = es->next) {
        const dp_seq *q = es->seq;
        if (q->state == DP_SEQ_RUNNING && kv_mgr_over_budget(&e->kv, &q->kv) &&
            q->n_computed == q->n_tokens - 1)
            list[n++] = es;
    }
    if (n > 0)
        eng_compact_seqs(e, list, n, DP_COMPACT_RECOMPRESS, NULL, 0);
}
