/* engine_private.h: the engine's state and what its files share; no one
 * outside engine/ includes it. The engine thread alone touches a
 * dp_engine's fields, but for the inbox and outbox (mu) and the published
 * statistics (stats_mu). Its files, by concern: engine.c (the thread, the
 * public API, admission), step.c (one step), emit.c (events, sampling,
 * stop conditions), switch.c (the dual path's moves as the engine drives
 * them), plan.c (the start-up memory plan). The functions below each
 * file's name are documented where that file defines them. */
#ifndef DP_ENGINE_PRIVATE_H
#define DP_ENGINE_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine.h"
#include "kernels/batch.h"
#include "kvcache/manager.h"
#include "sched/path.h"
#include "sched/sampler.h"
#include "sched/scheduler.h"
#include "sched/stop.h"

/* Candidates per row for device sampling. The tokens do not depend on it
 * (sched/sampler.h); it sets how often a row falls back to the download, and
 * what comes back each step: n x (2k + 2) words. 64 covers the nucleus of
 * nearly every step of a real model at the usual settings (measured with
 * dp-engine-bench: see kernels/cuda/README.md). */
#define ENGINE_TOPK 64

#define LOST_MSG "the device is lost; the server must be restarted"

/* The engine's state for one sequence (dp_seq.owner). */
typedef struct eng_seq {
    dp_request *req;
    dp_seq *seq;
    dp_rng rng;
    dp_detok detok;
    dp_stop stop;
    int32_t n_gen;
    bool started;          /* admitted at least once (no longer counts as queued) */
    int32_t capture_w;     /* SnapKV: queries captured at the prompt's end (0: none) */
    int32_t capture_at;    /* this step: first captured query index, or -1 */
    int32_t n_capture;
    int32_t dq_at, dq_slot; /* this step: its decode query's capture index (-1: none) and slot */
    dp_kv_usage usage;     /* its prompt's at the migration (tokens_resumed: at its finish) */
    dp_path_detector path; /* the path detector's state */
    int32_t *prev_keep;    /* early switch: kept set after the previous chunk */
    int32_t prev_k;
    bool tail_on_decode;   /* its prompt's rest runs on the decode path (it switched early,
                            * or continues a parked turn) and its end compacts it there */
    bool resumed;          /* admitted onto a parked turn's compact cache */
    int32_t seen_preemptions;
    int32_t n_scored;      /* prompt_logprobs: prompt tokens 1..n_scored reported (-1: failed) */
    /* Logprobs with stop strings: the events of tokens whose text is all
     * held back wait here, so that those a stop string then cuts off are
     * marked past the end before anything of theirs is sent. */
    dp_event *pend_head, *pend_tail;
    int64_t gen_bytes, rel_bytes; /* text generated / released so far */
    dp_gstate *gs;         /* constrained decoding: the grammar's state after the output */
    bool g_dead;           /* its mask allowed nothing (a parse past the limits) */
    double t_first;
    int32_t *bias_ids;
    float *bias_vals;
    struct eng_seq *next;  /* all live sequences */
} eng_seq;

struct dp_engine {
    dp_llama *model;
    const dp_tokenizer *tok;
    dp_engine_opts opts;
    int32_t ctx_len;
    int32_t vocab;
    dp_backend *be;
    dp_kv_mgr kv;              /* both pools, prefix cache, host tier, swap space */
    bool dual;
    dp_path_opts popts;
    eng_seq **lists[3];        /* per-step scratch lists, max_seqs entries each */
    dp_kv_migration *mig;      /* migration scratch, max_seqs entries */
    dp_batch_buf bb;           /* the step's batch arrays (engine thread only); captures:
                                  llama_capture_capacity */
    int64_t dq_missed;         /* decode queries this step had no capture room for */
    dp_sched sched;
    dp_sampler sampler;
    float *logits;
    float *raw_row;        /* copy of a logits row before processing, for logprobs */
    /* Device sampling (logits_topk): per output row of the step, the
     * request's temperature and ignore_eos mask flag going in, candidates,
     * max and weight sum coming back; the end-of-generation ids to mask. */
    int32_t topk_k;
    float *t_temp, *t_max, *t_sum, *t_vals;
    uint8_t *t_mask;
    int32_t *t_ids;
    int32_t *eog;
    int32_t n_eog;
    bool step_topk;        /* this step ended in logits_topk */
    /* Each output row's decision, taken before anything is emitted so that
     * only the rows that need their logits are downloaded: the token, or -1
     * (the row is in e->logits, and for an undecided draw t_pd holds it). */
    int32_t *t_tok;
    dp_sample_pending *t_pd;
    struct eng_seq **t_seq; /* the sequence of each output row */
    int64_t n_cand, n_fallback, n_full; /* rows sampled this step, by source */
    /* Prompt-logprob rows of the step (after the sampled rows): the token
     * index of each, its sequence and position; score_rows at most. */
    int32_t score_rows;
    int32_t *sc_out, *sc_pos;
    struct eng_seq **sc_seq;
    dp_gvocab *gvocab;         /* the vocabulary's byte trie, built for the first grammar */
    eng_seq *live;
    /* Inbox and outbox. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dp_request **in_q;
    int32_t in_n, in_cap;
    bool wake;             /* a cancellation or a stop asks for attention */
    dp_event *out_head, *out_tail;
    bool pushed;           /* engine thread: events pushed since the last notification */
    atomic_int queued;     /* submitted, not yet admitted or finished */
    atomic_bool stopping;
    atomic_bool debug_stall;   /* TEST HOOK: engine_debug_stall() */
    atomic_bool debug_lose;    /* TEST HOOK: engine_debug_device_lost() */
    atomic_bool device_lost;   /* the backend said DP_EDEVICE: nothing runs any more */
    int32_t failed_streak;     /* forward passes failed in a row (engine thread) */
    pthread_t thread;
    bool started;
    dp_engine_notify_fn notify;
    void *notify_ud;
    /* Stats: st is the engine thread's own, updated where things happen
     * without a lock; publish_stats copies it to stats, under stats_mu,
     * once per loop iteration (and as a step starts), which is what
     * engine_get_stats reads. */
    dp_engine_stats st;
    pthread_mutex_t stats_mu;
    dp_engine_stats stats;
};

/* ---- engine.c ---- */

void eng_publish_stats(dp_engine *e);

/* ---- emit.c ---- */

void eng_push_event(dp_engine *e, dp_event *ev);
void eng_finish_seq(dp_engine *e, eng_seq *es, dp_finish why, const char *error, bool flush);
bool eng_needs_full_row(const dp_request_params *p);
int eng_decide_rows(dp_engine *e, eng_seq **emitting, int32_t no);
bool eng_emit_token(dp_engine *e, eng_seq *es, int32_t o);
void eng_emit_prompt_logprobs(dp_engine *e, int32_t no, int32_t ns);

/* ---- switch.c ---- */

void eng_compact_seqs(dp_engine *e, eng_seq **list, int32_t n, dp_compaction_kind kind,
                      const float *q, int64_t q_stride);
void eng_end_prompts_on_decode(dp_engine *e, eng_seq **list, int32_t n, const float *q,
                               int64_t q_stride);
bool eng_may_switch_early(const dp_engine *e, const eng_seq *es, const dp_sched_item *it);
int eng_early_signal(dp_engine *e, eng_seq *es, const float *q, int64_t q_stride);
void eng_note_decode_queries(dp_engine *e, const dp_sched_plan *plan, int32_t nc);
void eng_recompress_over_budget(dp_engine *e);

/* ---- step.c ---- */

void eng_fail_all(dp_engine *e, const char *why);
void eng_run_step(dp_engine *e);

/* ---- plan.c ---- */

/* The KV manager as the options and the device's memory allow (kv_bytes
 * planned where not given, the decode type's auto fallback), its plan
 * logged, the context capped to what it can hold. */
int eng_plan_memory(dp_engine *e, const dp_engine_opts *opts, char *err, size_t errsz);
/* Whether the model's sliding-window layers are kept apart, at their
 * window (kvcache/swa.h): it has them and a global layer, and swa_full is
 * off. */
bool eng_swa_apart(const dp_engine *e, const dp_engine_opts *o);
/* The layers of the main KV stores: the model's, less its sliding-window
 * layers where the manager keeps those apart (kvcache/swa.h). */
int32_t eng_kv_layers(const dp_engine *e);
/* A step's nc captured queries as the main stores' layers see them (what
 * scoring reads): every layer's, or only the global layers' where the
 * sliding ones are apart. *layer_stride: floats from one such layer's
 * queries to the next's. */
const float *eng_kv_queries(const dp_engine *e, int32_t nc, int64_t *layer_stride);

#endif
