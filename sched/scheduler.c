/* scheduler.c: queue management, block reservation, admission and
 * preemption for continuous batching. Owned by the engine thread; no device
 * work happens here, only bookkeeping, so a step's planning costs
 * microseconds. */
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

int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_pool *pool)
{
    memset(s, 0, sizeof *s);
    if (o->max_batched_tokens < 1 || o->max_seqs < 1)
        return DP_EINVAL;
    s->opts = *o;
    s->pool = pool;
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
    kv_table_release(&seq->table, s->pool);
    seq->state = DP_SEQ_FINISHED;
}

/* Frees the sequence's blocks and queues it for recomputation. */
static void preempt(dp_sched *s, dp_seq *q)
{
    unlink_seq(&s->run_head, &s->run_tail, q);
    s->n_running--;
    kv_table_release(&q->table, s->pool);
    q->n_computed = 0;
    q->n_preemptions++;
    q->state = DP_SEQ_WAITING;
    insert_sorted(&s->wait_head, &s->wait_tail, q, true);
    s->n_waiting++;
    s->n_preemptions++;
}

/* Newest running sequence not already in this step's plan. */
static dp_seq *pick_victim(dp_sched *s)
{
    for (dp_seq *q = s->run_tail; q; q = q->prev)
        if (!q->scheduled)
            return q;
    return NULL;
}

static void add_item(dp_sched *s, dp_sched_plan *p, dp_seq *q, int32_t n)
{
    dp_sched_item *it = &s->items[p->n_items++];
    it->seq = q;
    it->start = q->n_computed;
    it->n = n;
    it->emits = q->n_computed + n == q->n_tokens;
    /* One uncomputed token left means the sequence is generating. */
    it->path = q->n_tokens - q->n_computed == 1 ? DP_PATH_DECODE : DP_PATH_PREFILL;
    if (it->path == DP_PATH_DECODE)
        p->n_decode++;
    p->n_tokens += n;
    q->scheduled = true;
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
        if (q->n_tokens - q->n_computed != 1)
            continue;
        bool self_preempted = false;
        while (kv_table_reserve(&q->table, s->pool, (int64_t)q->n_computed + 1) == DP_ENOSPC) {
            dp_seq *v = pick_victim(s);
            if (!v || v == q) {
                /* Nothing newer to evict: this sequence yields its own blocks. */
                next = q->next;
                preempt(s, q);
                self_preempted = true;
                break;
            }
            if (v == next)
                next = v->next;
            preempt(s, v);
        }
        if (self_preempted)
            continue;
        add_item(s, p, q, 1);
        budget--;
    }

    /* 2. Running prefills (prompts already admitted, continued chunk by chunk). */
    for (dp_seq *q = s->run_head; q && budget > 0 && p->n_items < cap; q = q->next) {
        if (q->scheduled || q->n_tokens - q->n_computed <= 1)
            continue;
        int32_t n = q->n_tokens - q->n_computed;
        if (n > budget)
            n = budget;
        if (kv_table_reserve(&q->table, s->pool, (int64_t)q->n_computed + n) != 0)
            continue; /* blocks return when others finish; decodes go first */
        add_item(s, p, q, n);
        budget -= n;
    }

    /* 3. Admissions in queue order while the whole remaining sequence (plus
     *    its first generated token) fits in the free blocks. Strict FCFS: a
     *    large request at the head is not overtaken. */
    while (s->wait_head && budget > 0 && p->n_items < cap) {
        dp_seq *q = s->wait_head;
        int32_t need = kv_pool_blocks_for(s->pool, (int64_t)q->n_tokens + 1) - q->table.n_blocks;
        if (need > kv_pool_n_free(s->pool))
            break;
        int32_t n = q->n_tokens - q->n_computed;
        if (n > budget)
            n = budget;
        if (kv_table_reserve(&q->table, s->pool, (int64_t)q->n_computed + n) != 0)
            break;
        unlink_seq(&s->wait_head, &s->wait_tail, q);
        s->n_waiting--;
        q->state = DP_SEQ_RUNNING;
        insert_sorted(&s->run_head, &s->run_tail, q, false);
        s->n_running++;
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
        q->scheduled = false;
    }
}
