/* scheduler.c: queue management, block reservation, admission and
 * preemption for continuous batching over one or two KV pools. Owned by the
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

dp_seq *seq_new(uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t priority)
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
    kv_table_init(&s->table);
    return s;
}

void seq_free(dp_seq *s)
{
    if (!s)
        return;
    free(s->table.blocks);
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

int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_pool *pool, dp_kv_pool *dpool,
               dp_prefix_cache *pc)
{
    memset(s, 0, sizeof *s);
    if (o->max_batched_tokens < 1 || o->max_seqs < 1 || (dpool && !o->decode_slots))
        return DP_EINVAL;
    s->opts = *o;
    s->pool = pool;
    s->dpool = dpool;
    s->pc = pc;
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

/* Frees every block the sequence holds or was promised. */
static void release_all(dp_sched *s, dp_seq *q)
{
    kv_table_release(&q->table, sched_pool_of(s, q));
    s->decode_reserved -= q->decode_reserve;
    q->decode_reserve = 0;
    q->path = DP_PATH_PREFILL;
    q->n_slots = 0;
    q->hashed_blocks = 0;
    q->chain = 0;
}

void sched_remove(dp_sched *s, dp_seq *seq)
{
    if (s->swap)
        kv_swap_drop(s->swap, &seq->swapped);
    if (seq->state == DP_SEQ_WAITING) {
        unlink_seq(&s->wait_head, &s->wait_tail, seq);
        s->n_waiting--;
    } else if (seq->state == DP_SEQ_RUNNING) {
        unlink_seq(&s->run_head, &s->run_tail, seq);
        s->n_running--;
    }
    release_all(s, seq);
    seq->state = DP_SEQ_FINISHED;
}

int sched_decode_reserve(dp_sched *s, dp_seq *q, dp_block_table *t, int64_t n_slots)
{
    int32_t need = kv_pool_blocks_for(s->dpool, n_slots) - t->n_blocks;
    if (need <= 0)
        return 0;
    /* Blocks promised to others are off limits; this sequence's own promise
     * is what it draws on first. */
    int32_t from_reserve = need < q->decode_reserve ? need : q->decode_reserve;
    if (kv_pool_n_free(s->dpool) - (s->decode_reserved - from_reserve) < need)
        return DP_ENOSPC;
    int rc = kv_table_reserve(t, s->dpool, n_slots);
    if (rc)
        return rc;
    q->decode_reserve -= from_reserve;
    s->decode_reserved -= from_reserve;
    return 0;
}

void sched_switch_to_decode(dp_sched *s, dp_seq *q, dp_block_table *t, int32_t n_slots)
{
    kv_table_release(&q->table, s->pool);
    free(q->table.blocks);
    q->table = *t;
    kv_table_init(t);
    q->path = DP_PATH_DECODE;
    q->n_slots = n_slots;
}

void sched_replace_decode_table(dp_sched *s, dp_seq *q, dp_block_table *t, int32_t n_slots)
{
    /* The freed blocks go back to the pool: the sequence grows into it again
     * a token at a time, like any other. */
    kv_table_release(&q->table, s->dpool);
    free(q->table.blocks);
    q->table = *t;
    kv_table_init(t);
    q->n_slots = n_slots;
}

int32_t sched_decode_watermark(const dp_sched *s)
{
    /* About 1 % of the decode pool stays free at admission (vLLM's default
     * watermark), so that sequences just admitted can grow for a while
     * before the pool runs out and someone must be preempted. */
    if (!s->dpool)
        return 0;
    int32_t w = s->dpool->n_blocks / 100;
    return w > 0 ? w : 1;
}

void sched_preempt(dp_sched *s, dp_seq *q)
{
    unlink_seq(&s->run_head, &s->run_tail, q);
    s->n_running--;
    if (q->path == DP_PATH_DECODE && s->swap && kv_swap_out(s->swap, &q->table, &q->swapped) == 0) {
        /* Path, slots and computed tokens stay: the cache comes back whole. */
        s->decode_reserved -= q->decode_reserve;
        q->decode_reserve = 0;
    } else {
        if (q->path == DP_PATH_DECODE) {
            s->n_recomputed_decode++;
            dp_log(DP_LOG_DEBUG, "sched: sequence %llu: no swap space, its compact cache will be "
                   "recomputed", (unsigned long long)q->id);
        }
        release_all(s, q);
        q->n_computed = 0;
    }
    q->n_preemptions++;
    q->state = DP_SEQ_WAITING;
    insert_sorted(&s->wait_head, &s->wait_tail, q, true);
    s->n_waiting++;
    s->n_preemptions++;
}

/* Newest running sequence on the given path not already in this step's plan
 * (its blocks are the ones that help). */
static dp_seq *pick_victim(dp_sched *s, dp_path path)
{
    for (dp_seq *q = s->run_tail; q; q = q->prev)
        if (!q->scheduled && q->path == path)
            return q;
    return NULL;
}

static void add_item(dp_sched *s, dp_sched_plan *p, dp_seq *q, int32_t n)
{
    dp_sched_item *it = &s->items[p->n_items++];
    it->seq = q;
    it->start = q->n_computed;
    it->slot_start = q->n_slots;
    it->n = n;
    it->emits = q->n_computed + n == q->n_tokens;
    it->path = q->path;
    /* One uncomputed token left past the prompt means the sequence is generating. */
    it->decode_phase = q->n_tokens - q->n_computed == 1 && q->n_computed >= q->n_prompt;
    if (it->decode_phase)
        p->n_decode++;
    p->n_tokens += n;
    q->scheduled = true;
}

/* Grows q's table by n slots in its pool. */
static int grow(dp_sched *s, dp_seq *q, int32_t n)
{
    if (q->path == DP_PATH_DECODE)
        return sched_decode_reserve(s, q, &q->table, (int64_t)q->n_slots + n);
    return kv_table_reserve(&q->table, s->pool, (int64_t)q->n_slots + n);
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

/* Admission test and allocation for the head of the queue. */
/* A swapped-out sequence comes back into the decode pool as it left it,
 * with room for its next token. */
static bool admit_swapped(dp_sched *s, dp_seq *q)
{
    int64_t slots = (int64_t)q->n_slots + 1;
    int32_t need = kv_pool_blocks_for(s->dpool, slots);
    int32_t wm = s->run_head ? sched_decode_watermark(s) : 0;
    if (need + wm > kv_pool_n_free(s->dpool) - s->decode_reserved)
        return false;
    return kv_swap_in(s->swap, &q->swapped, &q->table, slots) == 0;
}

/* Whether a running sequence is still prefilling a prompt that q shares
 * beyond what the prefix cache names already (n > 1, identical requests, a
 * system prompt that arrives with several users at once). q then waits for
 * those blocks to be named and takes them by reference instead of computing
 * them a second time. It waits in its turn: strict FCFS, the queue behind it
 * waits too, for at most that prompt's prefill. */
static bool shares_pending_prefix(const dp_sched *s, const dp_seq *q)
{
    if (!s->pc || q->n_computed > 0)
        return false;
    const int32_t bt = s->pool->block_tokens;
    const int32_t tail = q->tail_min > 1 ? q->tail_min : 1;
    const int32_t q_blocks = (q->n_tokens - tail) / bt; /* what q could take from the cache */
    for (const dp_seq *r = s->run_head; r; r = r->next) {
        if (r->path != DP_PATH_PREFILL || r->n_computed >= r->n_tokens)
            continue;
        int32_t named = r->hashed_blocks;
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

static bool admit(dp_sched *s, dp_seq *q)
{
    if (q->swapped.buf)
        return admit_swapped(s, q);
    if (shares_pending_prefix(s, q))
        return false;
    /* A prompt that extends an earlier one (the next turn of a conversation,
     * or a recompute after preemption) takes the cached prefix back: from the
     * pool where its blocks are intact, from the host tier where they were
     * spilled; only the rest is computed. At least one token is left to run,
     * for the logits. */
    int32_t reused = 0, from_host = 0;
    if (s->pc && q->n_computed == 0 && q->table.n_blocks == 0) {
        uint64_t last;
        int32_t tail = q->tail_min > 1 ? q->tail_min : 1;
        int32_t limit = q->n_tokens - tail;
        reused = limit > 0 ? prefix_match(s->pc, q->tokens, limit, &q->table, &from_host, &last) : 0;
        q->hashed_blocks = q->table.n_blocks;
        q->chain = last;
    }
    /* The prompt (or, after a preemption, prompt + output so far) goes to the
     * prefill pool whole, so a running prefill never waits for blocks; one
     * more slot when decoding will continue there. */
    int64_t slots = s->dpool ? q->n_tokens : (int64_t)q->n_tokens + 1;
    int32_t need_p = kv_pool_blocks_for(s->pool, slots) - q->table.n_blocks;
    int32_t need_d = 0;
    bool ok = need_p <= kv_pool_n_free(s->pool);
    if (ok && s->dpool) {
        int32_t d = s->opts.decode_slots(s->opts.ud, q);
        need_d = d > 0 ? kv_pool_blocks_for(s->dpool, d) : 0;
        /* The watermark only applies while others run: an idle server
         * admits anything that fits at all. */
        int32_t wm = s->run_head && need_d > 0 ? sched_decode_watermark(s) : 0;
        ok = need_d + wm <= kv_pool_n_free(s->dpool) - s->decode_reserved;
    }
    if (!ok || kv_table_reserve(&q->table, s->pool, slots) != 0) {
        /* Not now: the matched blocks go back, still named, for the retry. */
        kv_table_release(&q->table, s->pool);
        q->hashed_blocks = 0;
        q->chain = 0;
        return false;
    }
    q->n_computed = q->n_slots = reused;
    q->reused_tokens = reused;
    q->restored_blocks = from_host;
    if (reused > 0) {
        s->rebuilds++;
        s->reused_tokens += reused;
        s->restored_blocks += from_host;
    }
    q->decode_reserve = need_d;
    s->decode_reserved += need_d;
    return true;
}

void sched_schedule(dp_sched *s, dp_sched_plan *p)
{
    memset(p, 0, sizeof *p);
    p->items = s->items;
    int32_t budget = s->opts.max_batched_tokens;
    const int32_t cap = s->opts.max_seqs;
    int64_t preempted_before = s->n_preemptions;

    /* 1. Running decodes, oldest first: they hold memory already and each
     *    step they wait costs latency to a user watching tokens arrive. */
    dp_seq *next;
    for (dp_seq *q = s->run_head; q && budget > 0 && p->n_items < cap; q = next) {
        next = q->next;
        if (q->n_tokens - q->n_computed != 1 || q->n_computed < q->n_prompt)
            continue;
        bool self_preempted = false;
        while (grow(s, q, 1) == DP_ENOSPC) {
            dp_seq *v = pick_victim(s, q->path);
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
        int32_t n = chunk_len(q, budget);
        if (n == 0 || grow(s, q, n) != 0)
            continue; /* waits for a step with room, or for decode blocks */
        add_item(s, p, q, n);
        budget -= n;
    }

    /* 3. Admissions in queue order. Strict FCFS: a large request at the head
     *    is not overtaken by smaller ones behind it. */
    while (s->wait_head && budget > 0 && p->n_items < cap && s->n_running < cap) {
        dp_seq *q = s->wait_head;
        bool swapped = q->swapped.buf != NULL;
        if (!admit(s, q))
            break;
        unlink_seq(&s->wait_head, &s->wait_tail, q);
        s->n_waiting--;
        q->state = DP_SEQ_RUNNING;
        insert_sorted(&s->run_head, &s->run_tail, q, false);
        s->n_running++;
        int32_t n = chunk_len(q, budget);
        /* A swapped-in sequence got its cache back plus one slot; a prompt
         * tail (an early switch) needs the rest now, like any decode-path
         * prompt (step 2). */
        if (n > 1 && swapped && grow(s, q, n) != 0)
            n = 1;
        if (n == 0)
            break; /* admitted; its first chunk waits for the next step */
        add_item(s, p, q, n);
        budget -= n;
    }
    p->n_preempted = (int32_t)(s->n_preemptions - preempted_before);
}

void sched_commit(dp_sched *s, const dp_sched_plan *p)
{
    for (int32_t i = 0; i < p->n_items; i++) {
        dp_seq *q = p->items[i].seq;
        q->n_computed += p->items[i].n;
        q->n_slots += p->items[i].n;
        q->scheduled = false;
        /* Name the prefill blocks this step filled (slot == position there). */
        if (s->pc && q->path == DP_PATH_PREFILL) {
            const int32_t bt = s->pool->block_tokens;
            while ((q->hashed_blocks + 1) * bt <= q->n_slots && q->hashed_blocks < q->table.n_blocks) {
                const int32_t *bt_tokens = q->tokens + (size_t)q->hashed_blocks * bt;
                q->chain = prefix_chain(s->pc, q->chain, bt_tokens, bt);
                prefix_register(s->pc, q->table.blocks[q->hashed_blocks], q->chain, bt_tokens);
                q->hashed_blocks++;
            }
        }
    }
}
