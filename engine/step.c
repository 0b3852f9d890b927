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

/* Room for a step's block tables: n entries, and nx of exempt tables. */
static int ensure_tables(dp_engine *e, size_t n, size_t nx)
{
    return batch_buf_tables(&e->bb, n, nx);
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
    /* Published before its sequences end: whoever waits for them and then
     * reads the counters must find this step counted. */
    eng_publish_stats(e);
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

/* One step as it runs: the scheduler's plan, the batch built from it and
 * what its outputs asked for. */
typedef struct eng_step {
    dp_sched_plan plan;
    dp_batch b;
    int32_t nt, no, nc, ns;   /* tokens, sampled rows, captured queries, prompt-logprob rows */
    bool x;                   /* the model has exempt layers: the batch carries their tables */
    bool w;                   /* its sliding-window layers are apart: ... their tables, in
                               * the exempt tables' arrays (never both) */
    double t0, tf, tf_end;    /* the step's start, its forward pass's start and end */
    int64_t prompt_toks, gen_toks;
    /* Those whose outputs switch them: a prompt that ended (migrates), one
     * the path detector switches early, a tail on the decode path that ended. */
    eng_seq **migrate, **early, **tail_done;
    int32_t n_migrate, n_early, n_tail;
    const float *captured;    /* the step's captured queries (llama_captured_queries) */
    int64_t q_stride;
} eng_step;

/* The widest block table and exempt table of the plan, and room for them. */
static int size_tables(dp_engine *e, eng_step *st)
{
    int32_t max_blocks = 1, x_max = 1;
    for (int32_t i = 0; i < st->plan.n_items; i++) {
        const dp_kv_seq *kv = &st->plan.items[i].seq->kv;
        if (kv->table.n_blocks > max_blocks)
            max_blocks = kv->table.n_blocks;
        const int32_t xn = kv_seq_has_x(kv) ? kv_mgr_x_row(&e->kv, kv, NULL, 0) : 0;
        if (xn > x_max)
            x_max = xn;
    }
    /* Exempt layers: rows of the sequences without an exempt table repeat
     * their own. */
    st->x = kv_mgr_exempt_layers(&e->kv) > 0;
    if (st->x && max_blocks > x_max)
        x_max = max_blocks;
    st->w = kv_mgr_has_swa(&e->kv);
    for (int32_t i = 0; st->w && i < st->plan.n_items; i++)
        if (kv_seq_wtab(&st->plan.items[i].seq->kv)->n > x_max)
            x_max = kv_seq_wtab(&st->plan.items[i].seq->kv)->n;
    st->b.max_blocks = max_blocks;
    st->b.x_max_blocks = x_max;
    return ensure_tables(e, (size_t)st->plan.n_items * (size_t)max_blocks,
                         st->x || st->w ? (size_t)st->plan.n_items * (size_t)x_max : 0);
}

/* A sequence the plan runs: first admission, a preemption it came back
 * from, a parked turn it continues (the path detector's states). */
static void note_scheduled(dp_engine *e, const dp_sched_item *it, eng_seq *es)
{
    dp_seq *q = it->seq;
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
}

/* Item i's tokens, positions and slots, and its prompt-logprob rows. */
static void add_tokens(dp_engine *e, eng_step *st, int32_t i, eng_seq *es)
{
    const dp_sched_item *it = &st->plan.items[i];
    const dp_seq *q = it->seq;
    /* Its prompt positions before the last yield prompt-logprob rows (as
     * many as the scheduler gave room for). */
    const int32_t scored = it->decode_phase ? 0 : sched_score_rows(q, it->n);
    for (int32_t k = 0; k < it->n; k++) {
        if (k < scored) {
            e->sc_out[st->ns] = st->nt;
            e->sc_pos[st->ns] = it->start + k;
            e->sc_seq[st->ns++] = es;
        }
        e->bb.tokens[st->nt] = q->tokens[it->start + k];
        e->bb.pos[st->nt] = it->start + k;
        e->bb.slot[st->nt] = it->slot_start + k;
        if (st->x) /* exempt layers: position p at x slot p */
            e->bb.x_slot[st->nt] = kv_seq_has_x(&q->kv) ? q->kv.x_n + k : it->slot_start + k;
        e->bb.seq[st->nt] = i;
        st->nt++;
    }
}

/* The queries item i's step captures: a prompt's last ones feed SnapKV
 * scoring at the switch (or, for a sequence that switched early, at its
 * prompt's end), and so do a chunk's where the path detector measures the
 * kept set; under a decode budget, its decode query. */
static void add_captures(dp_engine *e, eng_step *st, const dp_sched_item *it, eng_seq *es)
{
    const dp_seq *q = it->seq;
    es->capture_at = -1;
    if (!it->decode_phase && q->kv.dual && es->capture_w > 0 &&
        (it->emits ? it->path == DP_PATH_PREFILL || es->tail_on_decode
                   : eng_may_switch_early(e, es, it) &&
                         path_wants_stability(&es->path, &e->popts, it->start + it->n,
                                              es->seq->n_prompt))) {
        int32_t w = es->capture_w < it->n ? es->capture_w : it->n;
        if (w > e->bb.max_capture - st->nc)
            w = e->bb.max_capture - st->nc; /* cannot happen: capacity covers every window */
        if (w > 0) {
            es->capture_at = st->nc;
            es->n_capture = w;
            for (int32_t k = 0; k < w; k++)
                e->bb.capture[st->nc++] = st->nt - w + k;
        }
    }
    /* Under a decode budget SnapKV scores each recompression with the
     * sequence's last window of decode queries (kv_mgr_note_query). */
    es->dq_at = -1;
    if (it->decode_phase && it->n == 1 && kv_mgr_wants_query(&e->kv, &q->kv)) {
        if (st->nc < e->bb.max_capture) {
            es->dq_at = st->nc;
            es->dq_slot = it->slot_start;
            e->bb.capture[st->nc++] = st->nt - 1;
        } else {
            e->dq_missed++; /* a step full of prompt windows: one query fewer */
        }
    }
}

/* Item i's block table (and exempt table), in the batch's rows. */
static void add_tables(dp_engine *e, eng_step *st, int32_t i, const dp_sched_item *it)
{
    const dp_seq *q = it->seq;
    const int32_t max_blocks = st->b.max_blocks, x_max = st->b.x_max_blocks;
    e->bb.store[i] = kv_seq_store(&q->kv, it->path);
    e->bb.sealed[i] = q->kv.sealed;
    e->bb.roff[i] = q->kv.roff;
    int32_t *row = e->bb.tables + (size_t)i * (size_t)max_blocks;
    memcpy(row, q->kv.table.blocks, (size_t)q->kv.table.n_blocks * sizeof *row);
    for (int32_t k = q->kv.table.n_blocks; k < max_blocks; k++)
        row[k] = 0;
    if (st->w) { /* the sliding layers' table by position, -1 where given back */
        const dp_kv_wtab *w = kv_seq_wtab(&q->kv);
        int32_t *wr = e->bb.x_tables + (size_t)i * (size_t)x_max;
        memcpy(wr, w->blocks, (size_t)w->n * sizeof *wr);
        for (int32_t k = w->n; k < x_max; k++)
            wr[k] = -1;
    }
    if (!st->x)
        return;
    int32_t *xr = e->bb.x_tables + (size_t)i * (size_t)x_max, nx;
    if (kv_seq_has_x(&q->kv)) {
        nx = kv_mgr_x_row(&e->kv, &q->kv, xr, x_max);
        e->bb.x_store[i] = kv_seq_xstore(&q->kv);
    } else {
        nx = q->kv.table.n_blocks;
        memcpy(xr, row, (size_t)nx * sizeof *xr);
        e->bb.x_store[i] = e->bb.store[i];
    }
    for (int32_t k = nx; k < x_max; k++)
        xr[k] = -1; /* never addressed: llama.c's check refuses a step that would */
}

/* The plan as a batch: every item's tokens, captures, output row and
 * tables. Fails every sequence when there is no memory for the tables. */
static int build_batch(dp_engine *e, eng_step *st)
{
    if (size_tables(e, st)) {
        eng_fail_all(e, "out of memory");
        return DP_ENOMEM;
    }
    for (int32_t i = 0; i < st->plan.n_items; i++) {
        const dp_sched_item *it = &st->plan.items[i];
        eng_seq *es = it->seq->owner;
        note_scheduled(e, it, es);
        add_tokens(e, st, i, es);
        add_captures(e, st, it, es);
        if (it->emits) {
            const dp_request_params *p = &es->req->params;
            e->t_temp[st->no] = p->sampling.temperature;
            e->t_mask[st->no] = p->ignore_eos && !eng_needs_full_row(p);
            e->t_seq[st->no] = es;
            e->bb.out[st->no++] = st->nt - 1;
        }
        add_tables(e, st, i, it);
    }
    /* Prompt-logprob rows come after the sampled ones. */
    memcpy(e->bb.out + st->no, e->sc_out, (size_t)st->ns * sizeof *e->sc_out);
    const int32_t max_blocks = st->b.max_blocks, x_max = st->b.x_max_blocks;
    st->b = batch_buf_view(&e->bb);
    st->b.n_tokens = st->nt;
    st->b.n_seqs = st->plan.n_items;
    st->b.max_blocks = max_blocks;
    st->b.n_out = st->no + st->ns;
    st->b.n_capture = st->nc;
    st->b.n_exempt = kv_mgr_exempt_layers(&e->kv);
    st->b.x_max_blocks = x_max;
    if (st->w) {
        st->b.layer_map = llama_kv_layer_map(e->model);
        st->b.w_store = DP_KV_STORE_SWA;
        st->b.w_block_tables = e->bb.x_tables;
        st->b.w_max_blocks = x_max;
    }
    return 0;
}

/* The forward pass, ending in each output row's decision. With device
 * sampling the step ends in the candidates (the ignore_eos rows masked on
 * the device); the rows stay there for whoever needs them. Each row's path
 * depends only on its own request and logits. Prompt logprobs need whole
 * rows: such a step downloads them all. */
static int forward(dp_engine *e, eng_step *st)
{
    dp_kv_store *stores[DP_KV_MAX_STORES];
    kv_mgr_stores(&e->kv, stores);
    st->tf = dp_now();
    e->step_topk = e->opts.device_sampling && e->be->ops->logits_topk && st->no > 0 && st->ns == 0;
    e->n_cand = e->n_fallback = e->n_full = 0;
    int rc;
    if (e->step_topk)
        rc = llama_forward_topk(e->model, &st->b, stores, e->topk_k, e->t_temp, e->eog, e->n_eog,
                                e->n_eog > 0 ? e->t_mask : NULL, e->t_ids, e->t_vals, e->t_max,
                                e->t_sum);
    else
        rc = llama_forward(e->model, &st->b, stores, e->logits);
    st->tf_end = dp_now();
    if (rc == 0 && e->step_topk)
        rc = eng_decide_rows(e, e->t_seq, st->no);
    if (atomic_exchange(&e->debug_lose, false))
        rc = DP_EDEVICE;
    return rc;
}

/* Item it's outputs, o its first output row: a prompt chunk's end (the
 * path detector may switch it early), or a token emitted, which may end
 * its prompt (it migrates, or compacts the tail it ran on the decode path). */
static void take_output(dp_engine *e, eng_step *st, const dp_sched_item *it, int32_t *o)
{
    eng_seq *es = it->seq->owner;
    if (!it->decode_phase)
        st->prompt_toks += it->n;
    if (es->n_scored < 0) {
        *o += it->emits;
        eng_finish_seq(e, es, DP_FINISH_ERROR, "out of memory", false);
        return;
    }
    if (!it->emits) {
        /* (The kept set is measured only where the detector decides.) */
        if (eng_may_switch_early(e, es, it) &&
            (!path_wants_stability(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) ||
             eng_early_signal(e, es, st->captured, st->q_stride) == 0) &&
            path_decide(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) != DP_STAY &&
            kv_mgr_can_switch_early(&e->kv, &es->seq->kv))
            st->early[st->n_early++] = es;
        return;
    }
    if (es->req->params.max_tokens == 0) { /* the prompt alone (scored) */
        (*o)++;
        eng_finish_seq(e, es, DP_FINISH_LENGTH, NULL, false);
        return;
    }
    st->gen_toks++;
    const bool alive = eng_emit_token(e, es, (*o)++);
    /* (A recompute whose prompt came back from the prefix cache whole has
     * only a generated token left: it migrates at that step.) */
    if (alive && it->path == DP_PATH_PREFILL && es->seq->kv.dual &&
        path_decide(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) ==
            DP_SWITCH_PROMPT_DONE)
        st->migrate[st->n_migrate++] = es;
    if (alive && !it->decode_phase && it->path == DP_PATH_DECODE && es->tail_on_decode) {
        st->tail_done[st->n_tail++] = es;
        es->tail_on_decode = false;
    }
}

static void take_outputs(dp_engine *e, eng_step *st)
{
    eng_note_decode_queries(e, &st->plan, st->nc);
    if (st->ns > 0)
        eng_emit_prompt_logprobs(e, st->no, st->ns);
    st->migrate = e->lists[0];
    st->early = e->lists[1];
    st->tail_done = e->lists[2];
    st->captured = eng_kv_queries(e, st->nc, &st->q_stride);
    for (int32_t i = 0, o = 0; i < st->plan.n_items; i++)
        take_output(e, st, &st->plan.items[i], &o);
}

/* The sequences the outputs switch: early switches, tails that ended on
 * the decode path, prompts that ended (migrations), each as one batch. */
static void switch_paths(dp_engine *e, eng_step *st)
{
    if (st->n_early > 0) {
        eng_compact_seqs(e, st->early, st->n_early, DP_COMPACT_EARLY, st->captured, st->q_stride);
        for (int32_t i = 0; i < st->n_early; i++) {
            eng_seq *es = st->early[i];
            es->tail_on_decode = es->seq->kv.path == DP_PATH_DECODE;
            e->st.early_switches += es->tail_on_decode;
            e->st.early_switch_tokens += es->tail_on_decode ? es->seq->n_computed : 0;
        }
    }
    if (st->n_tail > 0)
        eng_end_prompts_on_decode(e, st->tail_done, st->n_tail, st->captured, st->q_stride);
    if (st->n_migrate > 0)
        eng_compact_seqs(e, st->migrate, st->n_migrate, DP_COMPACT_MIGRATION, st->captured,
                         st->q_stride);
}

/* The step's counters (published with the next gauges). */
static void record_step(dp_engine *e, const eng_step *st)
{
    e->st.steps++;
    e->st.prompt_tokens += st->prompt_toks;
    e->st.generation_tokens += st->gen_toks;
    e->st.busy_seconds += dp_now() - st->t0;
    e->st.forward_seconds += st->tf_end - st->tf;
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

void eng_run_step(dp_engine *e)
{
    eng_step st = {.t0 = dp_now()};
    if (!device_ok(e))
        return;
    eng_recompress_over_budget(e);
    sched_schedule(&e->sched, &st.plan);
    /* The gauges describe the step now running: a step that prefills the
     * requests it just admitted can take most of a second on a CPU, and
     * until its end they would still read as waiting. */
    eng_publish_stats(e);
    if (st.plan.never_fits)
        eng_finish_seq(e, (eng_seq *)st.plan.never_fits->owner, DP_FINISH_ERROR,
                       "the KV pool cannot hold this request", false);
    if (st.plan.n_items == 0)
        return;
    if (build_batch(e, &st))
        return;
    const int rc = forward(e, &st);
    if (rc) {
        sched_abort(&e->sched, &st.plan);
        step_failed(e, &st.plan, rc);
        return;
    }
    sched_commit(&e->sched, &st.plan);
    e->failed_streak = 0;
    take_outputs(e, &st);
    switch_paths(e, &st);
    record_step(e, &st);
}
