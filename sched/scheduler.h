/* scheduler.h: continuous batching. Sequences wait (by priority, then
 * arrival), run (prefilling in chunks, then decoding one token per step) and
 * finish. Each step gets a token budget and a sequence cap: running decodes
 * are served first, then unfinished prefills, then new admissions, which need
 * free KV blocks for their whole prompt. When blocks run out, the newest
 * running sequence is preempted: its blocks are freed and it is recomputed
 * later from its tokens (prompt + what it generated so far). */
#ifndef DP_SCHED_SCHEDULER_H
#define DP_SCHED_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/pool.h"

typedef enum dp_seq_state {
    DP_SEQ_WAITING = 0,  /* queued, or preempted and waiting for recompute */
    DP_SEQ_RUNNING,
    DP_SEQ_FINISHED,
} dp_seq_state;

/* Which KV path a step's tokens run on. */
typedef enum dp_path { DP_PATH_PREFILL = 0, DP_PATH_DECODE = 1 } dp_path;

typedef struct dp_seq {
    uint64_t id;
    int32_t priority;
    uint64_t order;           /* arrival order, set by sched_add */
    int32_t *tokens;          /* prompt followed by generated tokens */
    int32_t n_tokens;
    int32_t cap;
    int32_t n_prompt;
    int32_t n_computed;       /* tokens whose K/V are in the cache */
    dp_block_table table;
    dp_seq_state state;
    int32_t n_preemptions;
    bool scheduled;           /* in the current step's plan */
    void *owner;              /* the engine's context for this sequence */
    struct dp_seq *prev, *next; /* queue links */
} dp_seq;

/* Creates a sequence holding a copy of the prompt. */
dp_seq *seq_new(uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t priority);
void seq_free(dp_seq *s);
/* Appends a sampled token (its K/V are computed by the next step). */
int seq_append(dp_seq *s, int32_t token);

/* Tokens [start, start + n) of seq run this step; when emits is set the step
 * yields logits at the last of them (the sequence is then fully computed and
 * samples its next token). */
typedef struct dp_sched_item {
    dp_seq *seq;
    int32_t start;
    int32_t n;
    dp_path path;
    bool emits;
} dp_sched_item;

typedef struct dp_sched_plan {
    dp_sched_item *items;
    int32_t n_items;
    int32_t n_tokens;
    int32_t n_decode;        /* items on the decode path */
    int32_t n_preempted;     /* preemptions made while planning this step */
} dp_sched_plan;

typedef struct dp_sched_opts {
    int32_t max_batched_tokens;
    int32_t max_seqs;
} dp_sched_opts;

typedef struct dp_sched {
    dp_sched_opts opts;
    dp_kv_pool *pool;         /* borrowed */
    dp_seq *wait_head, *wait_tail;
    dp_seq *run_head, *run_tail;
    int32_t n_waiting, n_running;
    uint64_t next_order;
    int64_t n_preemptions;
    dp_sched_item *items;     /* plan storage, max_seqs entries */
} dp_sched;

int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_pool *pool);
void sched_destroy(dp_sched *s);
/* Queues a new sequence. */
void sched_add(dp_sched *s, dp_seq *seq);
/* Plans the next step (allocating the KV blocks it needs, preempting if it
 * must). The plan stays valid until sched_commit. */
void sched_schedule(dp_sched *s, dp_sched_plan *plan);
/* Records that the plan ran: advances n_computed of each item's sequence. */
void sched_commit(dp_sched *s, const dp_sched_plan *plan);
/* Removes a sequence from its queue and frees its blocks (finished or
 * cancelled). The caller then frees it. */
void sched_remove(dp_sched *s, dp_seq *seq);
static inline bool sched_idle(const dp_sched *s) { return !s->wait_head && !s->run_head; }

#endif
