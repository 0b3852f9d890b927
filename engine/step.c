/* step.c: one engine step: the scheduler's plan built into a batch, the
 * forward pass, the outputs taken (tokens emitted, prompts that end or
 * switch early) and the paths switched. */
#include "engine_private.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"

/* ---- one step ------------------------------------------------------------- */

/* *a grown to hold n entries (*cap: what it holds). */
static int grow_i32(int32_t **a, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    int32_t *t = realloc(*a, n * sizeof *t);
    if (!t)
        return DP_ENOMEM;
    *a = t;
    *cap = n;
    return 0;
}

/* Room for a step's block tables: n entries, and nx of exempt tables. */
static int ensure_tables(dp_engine *e, size_t n, size_t nx)
{
    return grow_i32(&e->b_tables, &e->b_tables_cap, n) ? DP_ENOMEM
                                                        : grow_i32(&e->x_tables, &e->x_tables_cap, nx);
}

void eng_fail_all(dp_engine *e, const char *why)
{
    while (e->live)
        eng_finish_seq(e, e->live, DP_FINISH_ERROR, why, false);
}

/* The backend said DP_EDEVICE: everything fails, now and from now on. */
static void lose_device(dp_engine *e)
{
    dp_log(DP_LOG_ERROR, "engine: the device is lost; failing every request");
    atomic_store(&e->device_lost, true);
    eng_fail_all(e, LOST_MSG);
}

/* A backend whose failures linger clears a survived one before a step's
 * work; a lost device stops everything. */
static bool device_ok(dp_engine *e)
{
    if (atomic_load(&e->device_lost))
        return false;
    if (!e->be->ops->recover || e->be->ops->recover(e->be) != DP_EDEVICE)
        return true;
    lose_device(e);
    return false;
}

/* A forward pass failed. A lost device (DP_EDEVICE: its context cannot be
 * used again) fails everything and every later request, and the server
 * exits so that it is restarted. Any other error (the backend is fine, this
 * step was not: an allocation that failed) fails the step's sequences only;
 * waiting ones run in later steps. */
static void step_failed(dp_engine *e, const dp_sched_plan *plan, int rc)
{
    if (rc == DP_EDEVICE) {
        lose_device(e);
        return;
    }
    /* Cleared now, not at the next step: with nothing left to run, a
     * recovery that finds the device lost would otherwise wait for a request. */
    if (!device_ok(e))
        return;
    dp_log(DP_LOG_ERROR, "engine: a forward pass failed (%s); failing its %d sequences",
           dp_strerror(rc), plan->n_items);
    e->st.failed_steps++;
    for (int32_t i = 0; i < plan->n_items; i++) {
        eng_seq *es = (eng_seq *)plan->items[i].seq->owner;
        if (es)
            eng_finish_seq(e, es, DP_FINISH_ERROR, "internal error in the forward pass", false);
    }
    /* An error the backend calls survivable that comes back step after step
     * (a launch refused for its configuration is a bug, not bad luck) would
     * fail every request for ever while /health says ok: taken as a lost
     * device instead, so that the daemon exits and is restarted. */
    if (++e->failed_streak >= DP_ENGINE_FAIL_STREAK) {
        dp_log(DP_LOG_ERROR, "engine: %d forward passes failed in a row (the last: %s)",
               e->failed_streak, dp_strerror(rc));
        lose_device(e);
    }
}


void eng_run_step(dp_engine *e)
{
    double t0 = dp_now();
    if (!device_ok(e))
        return;
    eng_recompress_over_budget(e);
    dp_sched_plan plan;
    sched_schedule(&e->sched, &plan);
    /* The gauges describe the step now running: a step that prefills the
     * requests it just admitted can take most of a second on a CPU, and
     * until its end they would still read as waiting. */
    eng_publish_stats(e);
    if (plan.n_items == 0) {
        /* Nothing fits. If nothing runs either, the head of the queue can
         * never fit (submit checks against the pools, so this is a safety
         * net); otherwise free the newest running sequence so that the
         * others can finish. */
        if (!e->sched.run_head) {
            if (e->sched.wait_head)
                eng_finish_seq(e, (eng_seq *)e->sched.wait_head->owner, DP_FINISH_ERROR,
                           "the KV pool cannot hold this request", false);
            return;
        }
        sched_preempt(&e->sched, e->sched.run_tail);
        return;
    }
    int32_t max_blocks = 1, x_max = 1;
    for (int32_t i = 0; i < plan.n_items; i++) {
        const dp_kv_seq *kv = &plan.items[i].seq->kv;
        if (kv->table.n_blocks > max_blocks)
            max_blocks = kv->table.n_blocks;
        const int32_t xn = kv_seq_has_x(kv) ? kv_mgr_x_row(&e->kv, kv, NULL, 0) : 0;
        if (xn > x_max)
            x_max = xn;
    }
    /* Exempt layers: rows of the sequences without an exempt table repeat
     * their own. */
    const bool x = kv_mgr_exempt_layers(&e->kv) > 0;
    if (x && max_blocks > x_max)
        x_max = max_blocks;
    if (ensure_tables(e, (size_t)plan.n_items * (size_t)max_blocks,
                      x ? (size_t)plan.n_items * (size_t)x_max : 0)) {
        eng_fail_all(e, "out of memory");
        return;
    }
    int32_t nt = 0, no = 0, nc = 0, ns = 0;
    for (int32_t i = 0; i < plan.n_items; i++) {
        const dp_sched_item *it = &plan.items[i];
        dp_seq *q = it->seq;
        eng_seq *es = q->owner;
        if (!es->started) {
            es->started = true;
            atomic_fetch_sub(&e->queued, 1);
        }
        if (q->n_preemptions != es->seen_preemptions) {
            es->seen_preemptions = q->n_preemptions;
            path_set(&es->path, DP_PS_PREEMPTED);
            if (q->kv.path == DP_PATH_DECODE) {
                path_set(&es->path, DP_PS_DECODE); /* swapped back in as it was */
            } else {
                path_set(&es->path, DP_PS_WAITING);
                es->tail_on_decode = false;
                es->resumed = false; /* recomputed: decided again at its admission */
            }
        }
        if (es->path.state == DP_PS_WAITING)
            path_set(&es->path, DP_PS_PREFILL);
        /* Admitted on the decode path with prompt left: it continues its
         * conversation's parked turn (kv_mgr_park); the rest of its prompt
         * runs there, as after an early switch. */
        if (!it->decode_phase && it->path == DP_PATH_DECODE && it->start < q->n_prompt &&
            !es->tail_on_decode) {
            es->tail_on_decode = true;
            es->resumed = true;
            path_set(&es->path, DP_PS_DECODE);
        }
        /* Its prompt positions before the last yield prompt-logprob rows
         * (as many as the scheduler gave room for). */
        int32_t scored = it->decode_phase ? 0 : sched_score_rows(q, it->n);
        for (int32_t k = 0; k < it->n; k++) {
            if (k < scored) {
                e->sc_out[ns] = nt;
                e->sc_pos[ns] = it->start + k;
                e->sc_seq[ns++] = es;
            }
            e->b_tokens[nt] = q->tokens[it->start + k];
            e->b_pos[nt] = it->start + k;
            e->b_slot[nt] = it->slot_start + k;
            if (x) /* exempt layers: position p at x slot p */
                e->x_slot[nt] = kv_seq_has_x(&q->kv) ? q->kv.x_n + k : it->slot_start + k;
            e->b_seq[nt] = i;
            nt++;
        }
        /* The last queries of a prompt feed SnapKV scoring at the switch
         * (or, for a sequence that switched early, at its prompt's end), and
         * so do a chunk's where the path detector measures the kept set. */
        es->capture_at = -1;
        if (!it->decode_phase && q->kv.dual && es->capture_w > 0 &&
            (it->emits ? it->path == DP_PATH_PREFILL || es->tail_on_decode
                       : eng_may_switch_early(e, es, it) &&
                             path_wants_stability(&es->path, &e->popts, it->start + it->n,
                                                  es->seq->n_prompt))) {
            int32_t w = es->capture_w < it->n ? es->capture_w : it->n;
            if (w > e->capture_cap - nc)
                w = e->capture_cap - nc; /* cannot happen: capacity covers every window */
            if (w > 0) {
                es->capture_at = nc;
                es->n_capture = w;
                for (int32_t k = 0; k < w; k++)
                    e->b_capture[nc++] = nt - w + k;
            }
        }
        /* Under a decode budget SnapKV scores each recompression with the
         * sequence's last window of decode queries (kv_mgr_note_query). */
        es->dq_at = -1;
        if (it->decode_phase && it->n == 1 && kv_mgr_wants_query(&e->kv, &q->kv)) {
            if (nc < e->capture_cap) {
                es->dq_at = nc;
                es->dq_slot = it->slot_start;
                e->b_capture[nc++] = nt - 1;
            } else {
                e->dq_missed++; /* a step full of prompt windows: one query fewer */
            }
        }
        if (it->emits) {
            const dp_request_params *p = &es->req->params;
            e->t_temp[no] = p->sampling.temperature;
            e->t_mask[no] = p->ignore_eos && !eng_needs_full_row(p);
            e->t_seq[no] = es;
            e->b_out[no++] = nt - 1;
        }
        e->b_store[i] = kv_seq_store(&q->kv, it->path);
        e->b_sealed[i] = q->kv.sealed;
        e->b_roff[i] = q->kv.roff;
        int32_t *row = e->b_tables + (size_t)i * (size_t)max_blocks;
        memcpy(row, q->kv.table.blocks, (size_t)q->kv.table.n_blocks * sizeof *row);
        for (int32_t k = q->kv.table.n_blocks; k < max_blocks; k++)
            row[k] = 0;
        if (x) {
            int32_t *xr = e->x_tables + (size_t)i * (size_t)x_max, nx;
            if (kv_seq_has_x(&q->kv)) {
                nx = kv_mgr_x_row(&e->kv, &q->kv, xr, x_max);
                e->x_store[i] = kv_seq_xstore(&q->kv);
            } else {
                nx = q->kv.table.n_blocks;
                memcpy(xr, row, (size_t)nx * sizeof *xr);
                e->x_store[i] = e->b_store[i];
            }
            for (int32_t k = nx; k < x_max; k++)
                xr[k] = -1; /* never addressed: llama.c's check refuses a step that would */
        }
    }
    memcpy(e->b_out + no, e->sc_out, (size_t)ns * sizeof *e->sc_out);
    dp_batch b = {.n_tokens = nt, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq,
                  .slot = e->b_slot, .n_seqs = plan.n_items, .seq_store = e->b_store,
                  .block_tables = e->b_tables, .max_blocks = max_blocks, .n_out = no + ns,
                  .out_tokens = e->b_out, .n_capture = nc, .capture_tokens = e->b_capture,
                  .n_exempt = kv_mgr_exempt_layers(&e->kv), .x_slot = e->x_slot, .x_seq_store = e->x_store,
                  .x_block_tables = e->x_tables, .x_max_blocks = x_max,
                  .seq_sealed = e->b_sealed, .seq_roff = e->b_roff};
    dp_kv_store *stores[DP_KV_MAX_STORES];
    kv_mgr_stores(&e->kv, stores);
    double tf = dp_now();
    /* With device sampling the step ends in the candidates (the ignore_eos
     * rows masked on the device); the rows stay there for whoever needs
     * them. Each row's path depends only on its own request and logits. */
    /* Prompt logprobs need whole rows: such a step downloads them all. */
    e->step_topk = e->opts.device_sampling && e->be->ops->logits_topk && no > 0 && ns == 0;
    e->n_cand = e->n_fallback = e->n_full = 0;
    int rc;
    if (e->step_topk)
        rc = llama_forward_topk(e->model, &b, stores, e->topk_k, e->t_temp, e->eog, e->n_eog,
                                e->n_eog > 0 ? e->t_mask : NULL, e->t_ids, e->t_vals, e->t_max,
                                e->t_sum);
    else
        rc = llama_forward(e->model, &b, stores, e->logits);
    double tf_end = dp_now();
    if (rc == 0 && e->step_topk)
        rc = eng_decide_rows(e, e->t_seq, no);
    if (atomic_exchange(&e->debug_lose, false))
        rc = DP_EDEVICE;
    if (rc) {
        sched_abort(&e->sched, &plan);
        step_failed(e, &plan, rc);
        return;
    }
    sched_commit(&e->sched, &plan);
    e->failed_streak = 0;
    eng_note_decode_queries(e, &plan, nc);
    if (ns > 0)
        eng_emit_prompt_logprobs(e, no, ns);
    int64_t prompt_toks = 0, gen_toks = 0;
    eng_seq **migrate = e->lists[0], **early = e->lists[1], **tail_done = e->lists[2];
    int32_t n_migrate = 0, n_early = 0, n_tail = 0;
    const dp_hparams *hp = llama_hparams(e->model);
    const float *captured = llama_captured_queries(e->model);
    const int64_t q_stride = (int64_t)nc * hp->n_heads * hp->head_dim;
    for (int32_t i = 0, o = 0; i < plan.n_items; i++) {
        const dp_sched_item *it = &plan.items[i];
        if (!it->decode_phase)
            prompt_toks += it->n;
        if (((eng_seq *)it->seq->owner)->n_scored < 0) {
            o += it->emits;
            eng_finish_seq(e, it->seq->owner, DP_FINISH_ERROR, "out of memory", false);
            continue;
        }
        if (!it->emits) {
            /* A prompt chunk ended: the detector may switch the sequence
             * early (the kept set is measured only where it decides). */
            eng_seq *es = it->seq->owner;
            if (eng_may_switch_early(e, es, it) &&
                (!path_wants_stability(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) ||
                 eng_early_signal(e, es, captured, q_stride) == 0) &&
                path_decide(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) != DP_STAY &&
                kv_mgr_can_switch_early(&e->kv, &es->seq->kv))
                early[n_early++] = es;
            continue;
        }
        eng_seq *es = it->seq->owner;
        if (es->req->params.max_tokens == 0) { /* the prompt alone (scored) */
            o++;
            eng_finish_seq(e, es, DP_FINISH_LENGTH, NULL, false);
            continue;
        }
        gen_toks++;
        bool alive = eng_emit_token(e, es, o++);
        /* The prompt is done: the sequence switches to the decode path (or,
         * having switched early, compacts its uncompressed tail). */
        /* (A recompute whose prompt came back from the prefix cache whole
         * has only a generated token left: it migrates at that step.) */
        if (alive && it->path == DP_PATH_PREFILL && es->seq->kv.dual)
            migrate[n_migrate++] = es;
        if (alive && !it->decode_phase && it->path == DP_PATH_DECODE && es->tail_on_decode) {
            tail_done[n_tail++] = es;
            es->tail_on_decode = false;
        }
    }
    if (n_early > 0) {
        eng_compact_seqs(e, early, n_early, DP_COMPACT_EARLY, captured, q_stride);
        int32_t switched = 0;
        int64_t at = 0;
        for (int32_t i = 0; i < n_early; i++) {
            early[i]->tail_on_decode = early[i]->seq->kv.path == DP_PATH_DECODE;
            switched += early[i]->tail_on_decode;
            at += early[i]->tail_on_decode ? early[i]->seq->n_computed : 0;
        }
        e->st.early_switches += switched;
        e->st.early_switch_tokens += at;
    }
    if (n_tail > 0)
        eng_end_prompts_on_decode(e, tail_done, n_tail, captured, q_stride);
    if (n_migrate > 0)
        eng_compact_seqs(e, migrate, n_migrate, DP_COMPACT_MIGRATION, captured, q_stride);
    e->st.steps++;
    e->st.prompt_tokens += prompt_toks;
    e->st.generation_tokens += gen_toks;
    e->st.busy_seconds += dp_now() - t0;
    e->st.forward_seconds += tf_end - tf;
    e->st.sampled_candidates += e->n_cand;
    e->st.sampled_fallback += e->n_fallback;
    e->st.sampled_full_row += e->n_full;
    if (e->be->ops->step_graphs) {
        dp_graph_stats gs;
        e->be->ops->step_graphs(e->be, -1, &gs);
        e->st.graph_recorded = (int64_t)gs.recorded;
        e->st.graph_replayed = (int64_t)gs.replayed;
        e->st.graph_abandoned = (int64_t)gs.abandoned;
    }
}
