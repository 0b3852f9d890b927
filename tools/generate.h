/* generate.h: static-batch generation: runs a fixed set of sequences to
 * completion over one paged KV pool, without the engine (tools and tests;
 * the daemon, one-shot mode included, runs the engine). Prompts are packed
 * into steps of at most the model's token budget, then all live sequences
 * decode together, one token each per step. */
#ifndef DP_TOOLS_GENERATE_H
#define DP_TOOLS_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/pool.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "sched/sampler.h"

typedef struct dp_gen_seq {
    const int32_t *prompt;
    int32_t n_prompt;
    int32_t max_new;
    dp_sampling sampling;
    bool stop_at_eog;          /* stop after an end-of-generation token */
    int32_t *out;              /* caller's buffer of max_new ids */
    int32_t n_out;             /* filled by gen_run */
    float *prompt_logits;      /* optional: vocab floats, logits at the last prompt position */
} dp_gen_seq;

typedef void (*dp_gen_token_cb)(void *ud, int32_t seq, int32_t token);

typedef struct dp_gen {
    dp_llama *model;
    dp_kv_pool pool;
    dp_kv_store *store;
    dp_sampler sampler;
    float *logits;
    /* Decode steps' candidates (backend.h logits_topk; NULL without it). */
    int32_t c_k;
    int32_t *c_ids;
    float *c_vals, *c_max, *c_sum, *c_temp;
    dp_sample_pending *c_pd;
    /* Sum over steps, for benchmarks. */
    double t_prefill, t_decode;
    int64_t n_prefill_tokens, n_decode_tokens;
} dp_gen;

/* A KV store of n_blocks blocks of block_tokens tokens in f32; gen_init_kv:
 * in kv_type (a DP_KV_* type the backend stores). */
int gen_init(dp_gen *g, dp_llama *m, int32_t block_tokens, int32_t n_blocks, char *err,
             size_t errsz);
int gen_init_kv(dp_gen *g, dp_llama *m, int32_t block_tokens, int32_t n_blocks, int32_t kv_type,
                char *err, size_t errsz);
void gen_destroy(dp_gen *g);

/* Runs every sequence to max_new tokens (or EOG). tok may be NULL when no
 * sequence stops at EOG. cb (may be NULL) sees each token as it is sampled. */
int gen_run(dp_gen *g, dp_gen_seq *seqs, int32_t n, const dp_tokenizer *tok, dp_gen_token_cb cb,
            void *ud, char *err, size_t errsz);

#endif
