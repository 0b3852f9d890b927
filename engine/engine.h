/* engine.h: the engine thread: owns the model, the backend, the KV pools and
 * the scheduler; takes requests and cancellations from an inbox and emits
 * token events to an outbox. It never blocks on the network: the consumer is
 * woken through a callback (the HTTP layer binds it to uv_async_send). */
#ifndef DP_ENGINE_ENGINE_H
#define DP_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/compress.h"
#include "kvcache/manager.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "sched/request.h"

typedef struct dp_engine dp_engine;

typedef struct dp_engine_opts {
    int32_t max_batched_tokens;  /* tokens per step */
    int32_t max_seqs;            /* sequences per step */
    int32_t block_tokens;        /* prefill-pool (or single-pool) block size */
    int32_t n_blocks;            /* prefill-pool (or single-pool) blocks; 0: from kv_bytes */
    int64_t kv_bytes;            /* KV memory for both pools when block counts are 0;
                                  * 0: auto, see gpu_memory_fraction */
    double gpu_memory_fraction;  /* kv_bytes 0 on a backend with mem_info: the KV
                                  * pools get this share of the device's total
                                  * memory less what is in use once the model is
                                  * loaded (less a reserve for scratch that grows
                                  * at first use); without mem_info (CPU): 1 GiB */
    int32_t context_length;      /* cap per sequence (0: the model's) */
    int32_t max_queue;           /* waiting requests before submit refuses; 0: no limit */
    /* Dual path. */
    bool dualpath;               /* a decode pool, and compaction at the switch */
    double prefill_fraction;     /* share of kv_bytes for the prefill pool */
    int32_t decode_block_tokens;
    int32_t n_blocks_decode;     /* 0: from kv_bytes */
    dp_compress_opts compress;   /* default scorer, keep ratio, sinks, window */
    int32_t decode_budget;       /* decode-path slots before recompression (0: off) */
    bool early_switch;           /* the path detector may switch before the prompt ends */
    int32_t early_min_tokens;    /* ... once this many prompt tokens are computed (0: 256) */
    bool reuse_replies;          /* a finished decode-path reply's K/V go to the prefix cache
                                  * for the next turn (kvcache/manager.h); default on */
    int32_t compress_turns;      /* a chat turn after an earlier reply: ENGINE_TURNS_* */
    bool resume_turns;           /* a finished decode-path turn's compact cache is kept for
                                  * the next turn, which continues it (kv_mgr_park); default on */
    int32_t exempt_layers;       /* the decode path keeps every token in its first layers
                                  * (kvcache/manager.h); 0: none */
    bool prefix_cache;           /* reuse prefill blocks of earlier prompts (default on) */
    bool swa_full;               /* a model's sliding-window layers keep every token (false,
                                  * the default: their window, in a store of their own,
                                  * kvcache/swa.h; the prefix cache and swap then go
                                  * without them) */
    int32_t kv_type;             /* dp_kv_type of both pools (default f16; CUDA keeps f32 in f16) */
    int32_t decode_kv_type;      /* the decode path's dp_kv_type, or ENGINE_DECODE_KV_SAME
                                  * (kv_type) or ENGINE_DECODE_KV_AUTO (the default: kivi4
                                  * over an f16 cache where the backend keeps it, q8_0
                                  * where kivi4 is refused) */
    int64_t host_tier_bytes;     /* host copies of evicted prefill blocks (0: none) */
    int64_t swap_bytes;          /* the swap space of preempted decode-path caches, allocated
                                  * at start-up (default 4 GiB, vLLM's swap_space; 0: none,
                                  * a preempted sequence is recomputed) */
    bool device_sampling;        /* sample from the backend's logits_topk candidates, the
                                  * full row only for the requests and draws that need
                                  * it (default on; same tokens either way) */
} dp_engine_opts;

#define ENGINE_DECODE_KV_SAME (-1)
#define ENGINE_DECODE_KV_AUTO (-2)
/* compress_turns: a chat turn after an earlier reply (its prompt, whole in
 * the prefix cache, is what the next turn asks for) is compressed only when
 * the arena cannot hold it whole beside the others, or, with parked turns,
 * when others run (auto), always, or never. */
enum { ENGINE_TURNS_AUTO = 0, ENGINE_TURNS_ALWAYS = 1, ENGINE_TURNS_NEVER = 2 };
/* Parked turns at most (each holds a decode block at least; the oldest go
 * first when memory is short, or when a newer one needs the place). */
#define ENGINE_MAX_PARKED 256

void engine_opts_default(dp_engine_opts *o);

/* Called on the engine thread after a step produced events, or when idle
 * work completes; must be cheap and thread-safe (uv_async_send is). */
typedef void (*dp_engine_notify_fn)(void *ud);

#define DP_N_SCORERS 5
/* Logits rows a step gives prompt logprobs: the model is built with this
 * many output rows beyond max_num_seqs (the engine uses whatever it has). */
#define DP_ENGINE_SCORE_ROWS 64
/* What a compaction is for (the fallback counters' label). */
typedef enum dp_compaction_kind {
    DP_COMPACT_MIGRATION = 0,  /* prompt done: prefill -> decode */
    DP_COMPACT_EARLY,          /* switch before the prompt's end (path detector) */
    DP_COMPACT_PROMPT_END,     /* an early-switched prompt's tail */
    DP_COMPACT_RECOMPRESS,     /* decode budget reached */
    DP_COMPACT_EARLY_SIGNAL,   /* the detector's kept-set estimate */
    DP_N_COMPACTIONS
} dp_compaction_kind;
extern const char *const dp_compaction_names[DP_N_COMPACTIONS];

/* A consistent snapshot of counters for /metrics and tests. */
#define DP_MIGRATION_BUCKETS 8
extern const double dp_migration_bucket_bounds[DP_MIGRATION_BUCKETS]; /* seconds */

typedef struct dp_engine_stats {
    int32_t running;          /* sequences being prefilled or decoded */
    int32_t running_peak;     /* most sequences running at once since start */
    int32_t waiting;          /* queued or preempted */
    dp_kv_mgr_stats kv;       /* the KV manager's gauges and counters (kv_mgr_stats) */
    int64_t migrations;       /* sequences moved prefill -> decode */
    int64_t migrations_by_scorer[DP_N_SCORERS]; /* by the scorer actually used */
    /* Compactions that wanted SnapKV but had no captured queries and scored
     * by key norm instead, by kind (dp_compaction_kind). */
    int64_t scorer_fallbacks[DP_N_COMPACTIONS];
    int64_t tokens_kept;
    int64_t tokens_evicted;
    int64_t tokens_in_place;  /* of tokens_kept, taken by reference: a prefix kept whole,
                               * or a kept share (the same prompt's compaction) */
    int64_t recompressions;   /* decode-budget compressions */
    int64_t recompressions_by_scorer[DP_N_SCORERS];
    int64_t decode_queries_missed; /* SnapKV decode queries a recompression went without */
    int64_t early_switches;   /* switches before the prompt's end (path detector) */
    int64_t early_signals;    /* kept-set selections the path detector's stable signal made */
    int64_t early_switch_tokens; /* prompt tokens computed at those switches (sum) */
    double migration_seconds; /* sum over migration batches */
    int64_t migration_batches;
    int64_t migration_hist[DP_MIGRATION_BUCKETS + 1]; /* cumulative-free counts per bucket, last = +Inf */
    int64_t steps;
    int64_t prompt_tokens;    /* prefilled (recomputation included) */
    int64_t generation_tokens;
    int64_t preemptions;
    int64_t failed_steps;     /* forward passes that failed (their sequences with them) */
    /* Constrained decoding: token masks computed (a walk of the vocabulary
     * trie) and served from a state's cache, and the time spent on both. */
    int64_t grammar_masks_computed, grammar_masks_cached;
    int64_t grammar_masks_skipped; /* the token sampled from the unmasked row was allowed */
    double grammar_seconds;
    int64_t requests_finished[5]; /* indexed by dp_finish */
    double busy_seconds;      /* time inside steps */
    double forward_seconds;   /* of which in the forward pass */
    /* Sampled rows by source: decided by the device's candidates, candidates
     * then the downloaded row (undecided), the row alone (device sampling
     * off or unavailable, logit_bias, penalties, logprobs). */
    int64_t sampled_candidates, sampled_fallback, sampled_full_row;
    /* Recorded steps (backend.h step_graphs; zeros on the CPU). */
    int64_t graph_recorded, graph_replayed, graph_abandoned;
    uint64_t heartbeat;       /* bumped every loop iteration, idle or not */
} dp_engine_stats;

/* The engine borrows model and tokenizer (they must outlive it). */
int engine_init(dp_engine **out, dp_llama *model, const dp_tokenizer *tok,
                const dp_engine_opts *opts, dp_engine_notify_fn notify, void *ud, char *err,
                size_t errsz);
int engine_start(dp_engine *e);
/* Stops the thread (finishing every request as cancelled) and joins it. */
void engine_stop(dp_engine *e);
void engine_destroy(dp_engine *e);

/* Thread-safe. Takes a reference on req. Returns DP_ENOSPC when max_queue
 * requests are already waiting, DP_EINVAL when the prompt cannot fit the
 * context (the message says why). */
int engine_submit(dp_engine *e, dp_request *req, char *err, size_t errsz);
/* Submits n requests at once (all or none): the choices of one request with
 * n > 1, which the engine then sees together (they share their prompt's
 * blocks and its compaction). */
int engine_submit_all(dp_engine *e, dp_request *const *reqs, int32_t n, char *err, size_t errsz);
/* Thread-safe: marks req cancelled and wakes the engine. */
void engine_cancel(dp_engine *e, dp_request *req);
/* Thread-safe: takes every pending event (in order) and returns the list. */
dp_event *engine_take_events(dp_engine *e);
void engine_get_stats(dp_engine *e, dp_engine_stats *s);
int32_t engine_context_length(const dp_engine *e);
int32_t engine_max_queue(const dp_engine *e); /* 0: no limit */
/* Thread-safe: the backend reported the device lost (DP_EDEVICE), or
 * DP_ENGINE_FAIL_STREAK forward passes failed in a row. Every
 * request then fails (engine_submit with DP_EDEVICE) and the server should
 * exit non-zero so that it is restarted. The engine notifies when it happens. */
bool engine_device_lost(const dp_engine *e);
/* Forward passes failing in a row (each with an error the backend survives)
 * after which the device counts as lost all the same. */
#define DP_ENGINE_FAIL_STREAK 8
/* TEST HOOK only (DUALPATHD_DEBUG_DEVICE_LOST): the next step fails as if
 * the backend had lost the device. Thread-safe. */
void engine_debug_device_lost(dp_engine *e);
/* TEST HOOK only (DUALPATHD_DEBUG_STALL_AFTER_S): the engine thread stops
 * making progress (its heartbeat freezes) until engine_stop, so that tests can
 * see the systemd watchdog beats stop. Thread-safe. */
void engine_debug_stall(dp_engine *e);

#endif
