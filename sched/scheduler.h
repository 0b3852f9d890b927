/* scheduler.h: continuous batching. Sequences wait (by priority, then
 * arrival), run (prefilling in chunks, then decoding one token per step) and
 * finish. Each step gets a token budget and a sequence cap: running decodes
 * are served first, then unfinished prefills, then new admissions, which need
 * room for their whole prompt. When blocks run out, the newest running
 * sequence is preempted (a compact cache swapped out, any other freed and
 * recomputed later from its tokens). The scheduler decides; every block it
 * needs comes from the KV manager (kvcache/manager.h). */
#ifndef DP_SCHED_SCHEDULER_H
#define DP_SCHED_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/manager.h"

typedef enum dp_seq_state {
    DP_SEQ_WAITING = 0,  /* queued, or preempted and waiting for recompute */
    DP_SEQ_RUNNING,
    DP_SEQ_FINISHED,
} dp_seq_state;

typedef struct dp_seq {
    uint64_t id;
    int32_t priority;
    uint64_t order;           /* arrival order, set by sched_add */
    int32_t *tokens;          /* prompt followed by generated tokens */
    int32_t n_tokens;
    int32_t cap;
    int32_t n_prompt;
    int32_t tail_min;         /* the prompt's last tail_min tokens run in one step, never
                               * from the prefix cache (SnapKV captures their queries) */
    int32_t n_computed;       /* tokens whose K/V are in the cache */
    bool scores_prompt;       /* yields logits at every prompt position (prompt logprobs):
                               * never takes its prompt from the prefix cache, and a step
                               * holds at most opts.score_rows of those positions */
    dp_kv_seq kv;             /* its cache: path, block table, slots (kvcache/manager.h) */
    int32_t reused_tokens;    /* prompt tokens taken from the prefix cache at admission */
    dp_seq_state state;
    int32_t n_preemptions;
    bool scheduled;           /* in the current step's plan */
    void *owner;              /* the engine's context for this sequence */
    struct dp_seq *prev, *next; /* queue links */
} dp_seq;

/* Creates a sequence holding a copy of the prompt; its cache starts on the
 * prefill path, as kr asks (NULL: whole, never migrated). */
dp_seq *seq_new(uint64_t id, const int32_t *prompt, int32_t n_prompt, int32_t priority,
                const dp_kv_request *kr);
void seq_free(dp_seq *s);
/* Appends a sampled token (its K/V are computed by the next step). */
int seq_append(dp_seq *s, int32_t token);

/* Tokens [start, start + n) of seq run this step; when emits is set the step
 * yields logits at the last of them (the sequence is then fully computed and
 * samples its next token). */
typedef struct dp_sched_item {
    dp_seq *seq;
    int32_t start;           /* first token index (its RoPE position) */
    int32_t slot_start;      /* cache slot of that token */
    int32_t n;
    dp_path path;            /* the pool its K/V go to */
    bool decode_phase;       /* generating (one token), not processing a prompt */
    bool emits;
} dp_sched_item;

typedef struct dp_sched_plan {
    dp_sched_item *items;
    int32_t n_items;
    int32_t n_tokens;
    int32_t n_decode;        /* items in the generation phase */
    int32_t n_preempted;     /* preemptions made while planning this step */
    /* An empty plan with nothing running: the head of the queue, which can
     * then never fit (the caller fails it); NULL otherwise. */
    dp_seq *never_fits;
} dp_sched_plan;

typedef struct dp_sched_opts {
    int32_t max_batched_tokens;
    int32_t max_seqs;
    int32_t score_rows;       /* prompt positions with logits per step (scores_prompt) */
} dp_sched_opts;

typedef struct dp_sched {
    dp_sched_opts opts;
    dp_kv_mgr *kv;            /* the KV manager it asks (borrowed) */
    dp_seq *wait_head, *wait_tail;
    dp_seq *run_head, *run_tail;
    int32_t n_waiting, n_running;
    uint64_t next_order;
    int64_t n_preemptions;
    int32_t last_items;       /* sequences in the last step committed (a burst's trace) */
    dp_sched_item *items;     /* plan storage, max_seqs entries */
} dp_sched;

int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_mgr *kv);
void sched_destroy(dp_sched *s);
/* Queues a new sequence. */
void sched_add(dp_sched *s, dp_seq *seq);
/* Plans the next step (allocating the KV blocks it needs, preempting if it
 * must). The plan stays valid until sched_commit. */
void sched_schedule(dp_sched *s, dp_sched_plan *plan);
/* Of a chunk of n tokens from q->n_computed, the positions that yield a
 * prompt-logprob row (q->scores_prompt: every prompt position but the last). */
int32_t sched_score_rows(const dp_seq *q, int32_t n);
/* Frees a running sequence's blocks and queues it (at its arrival rank): a
 * decode-path sequence's compact cache is swapped out and restored as it was
 * at its next admission; any other sequence (or one the swap space cannot
 * take) is recomputed from its tokens. */
void sched_preempt(dp_sched *s, dp_seq *q);
/* Records that the plan ran: advances n_computed of each item's sequence. */
void sched_commit(dp_sched *s, const dp_sched_plan *plan);
/* The plan's step failed: nothing of it counts as computed (no block it
 * wrote is named in the prefix cache); its sequences are to be finished. */
void sched_abort(dp_sched *s, const dp_sched_plan *plan);
/* Removes a sequence from its queue and frees its blocks (finished or
 * cancelled). The caller then frees it. */
void sched_remove(dp_sched *s, dp_seq *seq);
static inline bool sched_idle(const dp_sched *s) { return !s->wait_head && !s->run_head; }

#endif
