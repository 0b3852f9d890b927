/* scheduler.c: queue management, admission and preemption for continuous
 * batching over one or two KV pools (blocks come from kvcache/manager). Owned by the
 * engine thread; no device work happens here, only bookkeeping, so a step's
 * planning costs microseconds.
 *
 * With a decode pool (dualpath), admission is compression-aware: a sequence
 * is admitted when the prefill pool holds its whole prompt and the decode
 * pool can promise its compressed size plus a little headroom, above a
 * watermark of free blocks. Its generation budget is not promised: decode
 * blocks are taken as tokens are produced and the newest sequence is
 * preempted when they run out (as vLLM does). Promising max_tokens up front
 * would let one chat request without max_tokens (the rest of the context)
 * block every other. */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

dp_seq *seq_new(uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t priority,
                const dp_kv_request *kr)
{
    dp_seq *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cap = n_prompt + 16;
    s->tokens = malloc((size_t)s->cap * sizeof *s->tokens);
    if (!s->tokens) {
        free(s);
        return NULL;
    }
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->n_tokens = s->n_prompt = n_prompt;
    s->id = id;
    s->priority = priority;
    kv_seq_init_request(&s->kv, kr);
    return s;
}

void seq_free(dp_seq *s)
{
    if (!s)
        return;
    kv_seq_destroy(&s->kv);
    free(s->tokens);
    free(s);
}

int seq_append(dp_seq *s, int32_t token)
{
    if (s->n_tokens == s->cap) {
        int32_t cap = s->cap * 2;
        int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
        if (!t)
            return DP_ENOMEM;
        s->tokens = t;
        s->cap = cap;
    }
    s->tokens[s->n_tokens++] = token;
    return 0;
}

int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_mgr *kv)
{
    memset(s, 0, sizeof *s);
    if (o->max_batched_tokens < 1 || o->max_seqs < 1 || !kv)
        return DP_EINVAL;
    s->opts = *o;
    s->kv = kv;
    s->items = calloc((size_t)o->max_seqs, sizeof *s->items);
    return s->items ? 0 : DP_ENOMEM;
}

void sched_destroy(dp_sched *s)
{
    free(s->items);
    memset(s, 0, sizeof *s);
}

/* ---- queues: doubly linked, kept sorted ---------------------------------- */

static void unlink_seq(dp_seq **head, dp_seq **tail, dp_seq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        *head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        *tail = q->prev;
    q->prev = q->next = NULL;
}

/* Waiting order: priority, then arrival, so a preempted sequence (old
 * arrival) goes back ahead of newer ones. */
static bool wait_before(const dp_seq *a, const dp_seq *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->order < b->order;
}

static void insert_sorted(dp_seq **head, dp_seq **tail, dp_seq *q, bool by_priority)
{
    dp_seq *at = *tail;
    /* Scan from the tail: new arrivals usually belong there. */
    while (at && (by_priority ? wait_before(q, at) : q->order < at->order))
        at = at->prev;
    q->prev = at;
    q->next = at ? at->next : *head;
    if (q->next)
        q->next->prev = q;
    else
        *tail = q;
    if (at)
        at->next = q;
    else
        *head = q;
}

void sched_add(dp_sched *s, dp_seq *seq)
{
    seq->order = s->next_order++;
    seq->state = DP_SEQ_WAITING;
    insert_sorted(&s->wait_head, &s->wait_tail, seq, true);
    s->n_waiting++;
}

void sched_remove(dp_sched *s, dp_seq *seq)
{
    if (seq->state == DP_SEQ_WAITING) {
        unlink_seq(&s->wait_head, &s->wait_tail, seq);
        s->n_waiting--;
    } else if (seq->state == DP_SEQ_RUNNING) {
        unlink_seq(&s->run_head, &s->run_tail, seq);
        s->n_running--;
    }
    /* The next turn continues its compact cache, or else takes its reply
     * back from the prefix cache. */
    if (seq->state == DP_SEQ_RUNNING && !kv_mgr_park(s->kv, &seq->kv, seq->tokens, seq->n_computed))
        kv_mgr_keep_reply(s->kv, &seq->kv, seq->tokens, seq->n_computed);
    kv_mgr_free(s->kv, &seq->kv);
    seq->state = DP_SEQ_FINISHED;
}

void sched_preempt(dp_sched *s, dp_seq *q)
{
    unlink_seq(&s->run_head, &s->run_tail, q);
    s->n_running--;
    /* A swapped-out cache comes back whole (computed tokens stay); any other
     * is recomputed from the sequence's tokens. */
    if (kv_mgr_swap_out(s->kv, &q->kv) != 0)
        q->n_computed = 0;
    q->n_preemptions++;
    q->state = DP_SEQ_WAITING;
    insert_sorted(&s->wait_head, &s->wait_tail, q, true);
    s->n_waiting++;
    s->n_preemptions++;
}

/* The sequence that yields blocks to q: the newest running one not already
 * in this step's plan, on q's path; when both paths share one arena, the
 * newest decode-path one newer than q first (its compact cache is swapped
 * out and comes back as it was, while a prompt's blocks would be
 * recomputed), else the newest prompt newer than q. q itself when nothing
 * newer can yield. */
static dp_seq *pick_victim(dp_sched *s, dp_seq *q)
{
    if (!kv_mgr_shared(s->kv)) {
        for (dp_seq *x = s->run_tail; x; x = x->prev)
            if (!x->scheduled && x->kv.path == q->kv.path)
                return x;
        return NULL;
    }
    for (dp_seq *x = s->run_tail; x && x != q; x = x->prev)
        if (!x->scheduled && x->kv.path == DP_PATH_DECODE)
            return x;
    for (dp_seq *x = s->run_tail; x && x != q; x = x->prev)
        if (!x->scheduled)
            return x;
    return q;
}

static void add_item(dp_sched *s, dp_sched_plan *p, dp_seq *q, int32_t n)
{
    dp_sched_item *it = &s->items[p->n_items++];
    it->seq = q;
    it->start = q->n_computed;
    it->slot_start = q->kv.n_slots;
    it->n = n;
    it->emits = q->n_computed + n == q->n_tokens;
    it->path = q->kv.path;
    /* One uncomputed token left past the prompt means the sequence is generating. */
    it->decode_phase = q->n_tokens - q->n_computed == 1 && q->n_computed >= q->n_prompt;
    if (it->decode_phase)
        p->n_decode++;
    p->n_tokens += n;
    q->scheduled = true;
}

/* Tokens of q to run now, at most budget: a chunk never leaves fewer than
 * tail_min tokens for later, so that the last tail_min run in one step. 0
 * when the rest cannot be split that way and does not fit the budget (it
 * waits for a step with room). */
static int32_t chunk_len(const dp_seq *q, int32_t budget)
{
    int32_t n = q->n_tokens - q->n_computed;
    if (n <= budget)
        return n;
    if (n - budget < q->tail_min) {
        int32_t shorter = n - q->tail_min;
        return shorter > 0 ? shorter : 0;
    }
    return budget;
}

/* Positions of a chunk of n tokens from q->n_computed that yield a logits
 * row for its prompt logprobs: every prompt position but the last (whose
 * row is the first token's, counted among the step's outputs). */
int32_t sched_score_rows(const dp_seq *q, int32_t n)
{
    if (!q->scores_prompt)
        return 0;
    int32_t rows = q->n_prompt - 1 - q->n_computed;
    if (rows < 0)
        return 0;
    return rows < n ? rows : n;
}

/* A chunk cut to the step's room for scoring rows. A cut chunk ends inside
 * the prompt, where every position scores. */
static int32_t score_cut(const dp_seq *q, int32_t n, int32_t left)
{
    return sched_score_rows(q, n) > left ? left : n;
}

/* Whether a running sequence is still prefilling a prompt that q shares
 * beyond what the prefix cache names already (n > 1, identical requests, a
 * system prompt that arrives with several users at once). q then waits for
 * those blocks to be named and takes them by reference instead of computing
 * them a second time. With dualpath, an identical prompt waits for the
 * other's whole prompt: it migrates at its end, and q then keeps its
 * compaction (a kept share, kvcache/manager.h) and computes only its last
 * token, not a SnapKV window of its own. It waits in its turn: strict FCFS,
 * the queue behind it waits too, for at most that prompt's prefill. */
static bool shares_pending_prefix(const dp_sched *s, const dp_seq *q)
{
    const int32_t tail = q->tail_min > 1 ? q->tail_min : 1;
    if (!kv_mgr_prefix_cache(s->kv) || q->n_computed > 0 || q->scores_prompt ||
        kv_mgr_can_resume(s->kv, &q->kv, q->tokens, q->n_tokens, tail))
        return false; /* (a parked turn it continues holds its history) */
    const int32_t bt = kv_mgr_block_tokens(s->kv);
    const int32_t q_blocks = (q->n_tokens - tail) / bt; /* what q could take from the cache */
    for (const dp_seq *r = s->run_head; r; r = r->next) {
        if (r->kv.path != DP_PATH_PREFILL || r->n_computed >= r->n_tokens)
            continue;
        if (kv_mgr_dual(s->kv) && kv_seq_same_compaction(&q->kv, &r->kv) && q->n_tokens == r->n_tokens &&
            memcmp(q->tokens, r->tokens, (size_t)q->n_tokens * sizeof *q->tokens) == 0)
            return true;
        int32_t named = r->kv.hashed_blocks;
        int32_t r_blocks = r->n_tokens / bt; /* r names each full block it computes */
        int32_t upto = (q_blocks < r_blocks ? q_blocks : r_blocks) - named;
        if (upto <= 0)
            continue;
        /* Equal through r's next unnamed block: waiting gains at least that. */
        if (memcmp(q->tokens, r->tokens, (size_t)(named + 1) * (size_t)bt * sizeof *q->tokens) == 0)
            return true;
    }
    return false;
}

/* Admission of the head of the queue: a swapped-out sequence comes back as
 * it left; any other takes its cached prefix and the blocks for the rest of
 * its prompt. At least one token is left to run, for the logits (tail_min
 * for SnapKV's captured queries). */
static bool admit(dp_sched *s, dp_seq *q)
{
    /* Busy: others run now, wait behind q, or ran beside each other in the
     * last step. The last is a burst's trace: sessions whose turns ended
     * together send their next turns together, and the first of them to
     * arrive finds nothing running while the others are a few milliseconds
     * behind it. Taken for idle, it would recompute its history whole
     * (kvcache/manager.h, whole_if_room) while the rest of the burst waited
     * behind that prefill. A server used by one conversation at a time
     * runs one sequence per step and stays idle between its turns. */
    const bool busy = s->run_head != NULL || q->next != NULL || s->last_items > 1;
    if (q->kv.swapped.slots)
        return kv_mgr_swap_in(s->kv, &q->kv, busy) == 0;
    if (shares_pending_prefix(s, q))
        return false;
    int32_t reused = 0;
    /* A tail of the whole prompt: nothing comes from the prefix cache. */
    int32_t tail = q->scores_prompt ? q->n_tokens : q->tail_min;
    if (kv_mgr_admit(s->kv, &q->kv, q->tokens, q->n_tokens, tail, busy, &reused) != 0)
        return false;
    q->n_computed = reused;
    q->reused_tokens = reused;
    return true;
}

void sched_schedule(dp_sched *s, dp_sched_plan *p)
{
    memset(p, 0, sizeof *p);
    p->items = s->items;
    int32_t budget = s->opts.max_batched_tokens;
    const int32_t cap = s->opts.max_seqs;
    int32_t score_left = s->opts.score_rows;
    int64_t preempted_before = s->n_preemptions;

    /* 1. Running decodes, oldest first: they hold memory already and each
     *    step they wait costs latency to a user watching tokens arrive. */
    dp_seq *next;
    for (dp_seq *q = s->run_head; q && budget > 0 && p->n_items < cap; q = next) {
        next = q->next;
        if (q->n_tokens - q->n_computed != 1 || q->n_computed < q->n_prompt)
            continue;
        bool self_preempted = false;
        while (kv_mgr_grow(s->kv, &q->kv, 1) == DP_ENOSPC) {
            dp_seq *v = pick_victim(s, q);
            if (!v || v == q) {
                /* Nothing newer to evict: this sequence yields its own blocks. */
                next = q->next;
                sched_preempt(s, q);
                self_preempted = true;
                break;
            }
            if (v == next)
                next = v->next;
            sched_preempt(s, v);
        }
        if (self_preempted)
            continue;
        add_item(s, p, q, 1);
        budget--;
    }

    /* 2. Running prompts (admitted, continued chunk by chunk). */
    for (dp_seq *q = s->run_head; q && budget > 0 && p->n_items < cap; q = q->next) {
        if (q->scheduled || q->n_computed >= q->n_tokens)
            continue;
        int32_t n = score_cut(q, chunk_len(q, budget), score_left);
        if (n == 0 || kv_mgr_grow(s->kv, &q->kv, n) != 0)
            continue; /* waits for a step with room, or for decode blocks */
        score_left -= sched_score_rows(q, n);
        add_item(s, p, q, n);
        budget -= n;
    }

    /* 3. Admissions in queue order. Strict FCFS: a large request at the head
     *    is not overtaken by smaller ones behind it. */
    while (s->wait_head && budget > 0 && p->n_items < cap && s->n_running < cap) {
        dp_seq *q = s->wait_head;
        bool swapped = q->kv.swapped.slots != NULL;
        if (!admit(s, q))
            break;
        unlink_seq(&s->wait_head, &s->wait_tail, q);
        s->n_waiting--;
        q->state = DP_SEQ_RUNNING;
        insert_sorted(&s->run_head, &s->run_tail, q, false);
        s->n_running++;
        int32_t n = score_cut(q, chunk_len(q, budget), score_left);
        /* A swapped-in sequence got its cache back plus one slot; a prompt
         * tail (an early switch) needs the rest now, like any decode-path
         * prompt (step 2). */
        if (n > 1 && swapped && kv_mgr_grow(s->kv, &q->kv, n) != 0)
            n = 1;
        if (n == 0)
            break; /* admitted; its first chunk waits for the next step */
        score_left -= sched_score_rows(q, n);
        add_item(s, p, q, n);
        budget -= n;
    }

    /* 4. Nothing fits. With sequences running, the newest yields its blocks
     *    so that the others can finish; with none, the head of the queue
     *    can never fit (submit checks against the pools, so this is a
     *    safety net). */
    if (p->n_items == 0 && s->run_head)
        sched_preempt(s, s->run_tail);
    else if (p->n_items == 0)
        p->never_fits = s->wait_head;
    p->n_preempted = (int32_t)(s->n_preemptions - preempted_before);
}

void sched_abort(dp_sched *s, const dp_sched_plan *p)
{
    (void)s;
    for (int32_t i = 0; i < p->n_items; i++)
        p->items[i].seq->scheduled = false;
}

void sched_commit(dp_sched *s, const dp_sched_plan *p)
{
    for (int32_t i = 0; i < p->n_items; i++) {
        dp_seq *q = p->items[i].seq;
        q->n_computed += p->items[i].n;
        kv_mgr_commit(s->kv, &q->kv, q->tokens, p->items[i].n);
        q->scheduled = false;
    }
    s->last_items = p->n_items;
}
