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
#include "kvcache/prefix.h"
#include "kvcache/swap.h"

typedef enum dp_seq_state {
    DP_SEQ_WAITING = 0,  /* queued, or preempted and waiting for recompute */
    DP_SEQ_RUNNING,
    DP_SEQ_FINISHED,
} dp_seq_state;

/* Which KV path (and pool) a sequence's cache is on. */
typedef enum dp_path { DP_PATH_PREFILL = 0, DP_PATH_DECODE = 1 } dp_path;

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
    int32_t n_slots;          /* cache entries in the current table (== n_computed on the
                               * prefill path; fewer once compacted on the decode path) */
    dp_path path;             /* which pool the table lives in */
    dp_block_table table;
    int32_t decode_reserve;   /* decode-pool blocks reserved at admission, not yet taken */
    int32_t hashed_blocks;    /* prefill blocks named in the prefix cache so far */
    uint64_t chain;           /* name of the last of them */
    int32_t reused_tokens;    /* prompt tokens taken from the prefix cache at admission */
    int32_t restored_blocks;  /* of which blocks restored from the host tier */
    dp_seq_state state;
    int32_t n_preemptions;
    dp_swapped swapped;       /* preempted on the decode path: its compact cache */
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
} dp_sched_plan;

/* Decode-pool slots a sequence needs at admission: its compressed cache and
 * a little headroom, from the engine's policy. Never its whole generation
 * budget: decode blocks are taken as tokens are produced, and the newest
 * sequence is preempted when they run out. */
typedef int32_t (*dp_decode_slots_fn)(void *ud, const dp_seq *q);

typedef struct dp_sched_opts {
    int32_t max_batched_tokens;
    int32_t max_seqs;
    dp_decode_slots_fn decode_slots;  /* with a decode pool: admission need */
    void *ud;
} dp_sched_opts;

typedef struct dp_sched {
    dp_sched_opts opts;
    dp_kv_pool *pool;         /* prefill pool (the only pool without dualpath), borrowed */
    dp_kv_pool *dpool;        /* decode pool, or NULL; borrowed */
    dp_prefix_cache *pc;      /* prefix cache over the prefill pool, or NULL; borrowed */
    dp_kv_swap *swap;         /* the decode pool's swap space, or NULL; borrowed */
    int64_t reused_tokens, restored_blocks, rebuilds;
    int32_t decode_reserved;  /* decode blocks promised to admitted sequences, not yet taken */
    dp_seq *wait_head, *wait_tail;
    dp_seq *run_head, *run_tail;
    int32_t n_waiting, n_running;
    uint64_t next_order;
    int64_t n_preemptions;
    int64_t n_recomputed_decode; /* decode-path preemptions recomputed (no swap room) */
    dp_sched_item *items;     /* plan storage, max_seqs entries */
} dp_sched;

/* dpool may be NULL: one pool, no compaction (dualpath off). pc may be NULL:
 * no prefix reuse. */
int sched_init(dp_sched *s, const dp_sched_opts *o, dp_kv_pool *pool, dp_kv_pool *dpool,
               dp_prefix_cache *pc);
static inline dp_kv_pool *sched_pool_of(const dp_sched *s, const dp_seq *q)
{
    return q->path == DP_PATH_DECODE ? s->dpool : s->pool;
}
/* Takes decode-pool blocks so that table t covers n_slots, drawing on q's
 * reservation first. All-or-nothing; DP_ENOSPC when the pool is short. */
int sched_decode_reserve(dp_sched *s, dp_seq *q, dp_block_table *t, int64_t n_slots);
/* Moves q onto the decode path with table t (already filled by a compaction)
 * holding n_slots entries; its prefill blocks are released. */
void sched_switch_to_decode(dp_sched *s, dp_seq *q, dp_block_table *t, int32_t n_slots);
/* Replaces q's decode table by t (a recompression), releasing the old one. */
void sched_replace_decode_table(dp_sched *s, dp_seq *q, dp_block_table *t, int32_t n_slots);
void sched_destroy(dp_sched *s);
/* Decode-pool blocks kept free at admission while sequences run. */
int32_t sched_decode_watermark(const dp_sched *s);
/* Queues a new sequence. */
void sched_add(dp_sched *s, dp_seq *seq);
/* Plans the next step (allocating the KV blocks it needs, preempting if it
 * must). The plan stays valid until sched_commit. */
void sched_schedule(dp_sched *s, dp_sched_plan *plan);
/* Gives the decode pool a swap space (before the first step). */
static inline void sched_set_swap(dp_sched *s, dp_kv_swap *swap) { s->swap = swap; }
/* Frees a running sequence's blocks and queues it (at its arrival rank): a
 * decode-path sequence's compact cache is swapped out and restored as it was
 * at its next admission; any other sequence (or one the swap space cannot
 * take) is recomputed from its tokens. */
void sched_preempt(dp_sched *s, dp_seq *q);
/* Records that the plan ran: advances n_computed of each item's sequence. */
void sched_commit(dp_sched *s, const dp_sched_plan *plan);
/* Removes a sequence from its queue and frees its blocks (finished or
 * cancelled). The caller then frees it. */
void sched_remove(dp_sched *s, dp_seq *seq);
static inline bool sched_idle(const dp_sched *s) { return !s->wait_head && !s->run_head; }

#endif
