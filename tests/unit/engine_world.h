/* engine_world.h: the engine tests' harness (engine_world.c): a model to
 * run on (synthetic or the default GGUF), request specs, engines started
 * with the options a test sets, events collected into results (waiting on
 * the engine's notify, never on time), conversations; and the tests each
 * file holds, run in order by test_engine.c's main. */
#ifndef DP_TESTS_ENGINE_WORLD_H
#define DP_TESTS_ENGINE_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"

#define MAXN 64
#define MAXTOK 256

typedef struct result {
    int32_t toks[MAXTOK];
    int32_t n;
    char text[4096];
    size_t text_len;
    dp_finish finish;
    int32_t completion_tokens;
    int64_t kv_bytes;        /* usage.dualpath's */
    bool done;
    float logprob[MAXTOK];   /* each generated token's (logprobs on) */
    /* Prompt logprobs: events in arrival order (position, logprob, rank). */
    int32_t p_pos[512], p_rank[512], p_top[512];
    float p_lp[512];
    int32_t n_p;
} result;

typedef struct world {
    dp_gguf g;
    void *buf;
    dp_backend *be;
    dp_llama *m;
    dp_tokenizer *tok;
    int32_t vocab;
} world;

typedef struct req_spec {
    int32_t prompt[512];
    int32_t n_prompt;
    int32_t max_tokens;
    float temperature, top_p;
    uint64_t seed;
    const char *stop;
    bool ignore_eos;
    /* Zero: off. */
    int32_t top_k;
    float min_p, presence_penalty;
    bool logprobs;
    bool prompt_logprobs;
    const char *gbnf;     /* constrained decoding (NULL: free text) */
    int32_t bias_token;
    float bias;
    int32_t keep_prefix;  /* tokens kept whole on the decode path (a system prompt) */
    int16_t exempt;       /* dualpath.exempt_layers + 1 (0: the server's) */
    int8_t kv_type;       /* dualpath.decode_kv_type: dp_kv_type + 1 (0: the server's) */
} req_spec;

/* ---- the harness (engine_world.c) ---- */

/* path: a GGUF file; NULL: the synthetic preset `shape` (tests/unit: tiny). */
void world_open_shape(world *w, const char *path, const char *shape);
void world_open(world *w, const char *path);
void world_close(world *w);
dp_request *make_req(const req_spec *sp, result *res);
/* The engine's notify callback (tests wait on it). */
void on_notify(void *ud);
/* Drains events into results until `want` requests have finished. */
void collect(dp_engine *e, int want);
/* Drains events until res has at least n tokens or has finished. */
void collect_tokens(dp_engine *e, result *res, int32_t n);
/* Stats once the engine has caught up with the events taken so far. */
void settled_stats(dp_engine *e, dp_engine_stats *st);
/* Engine options of the next start() (dualpath off unless a test sets it). */
extern dp_engine_opts next_opts;
extern bool next_opts_set;
/* start() keeps an exact f32 cache unless a test clears this. */
extern bool exact_kv;
/* The next start() leaves the engine stopped until run_requests has
 * submitted everything. */
extern bool defer_start;
dp_engine *start(world *w, int32_t n_blocks, int32_t max_seqs);
/* Every block back, nothing running or waiting. */
void check_idle(dp_engine *e);
/* Runs specs[0..n) on e into res: each alone or all together; mode is each
 * request's dualpath setting; *st (if given) the stats once idle. */
void run_requests(dp_engine *e, const req_spec *specs, int n, result *res, bool alone,
                  int8_t mode, dp_engine_stats *st);
/* The requests together give token for token what each gives alone. */
void concurrent_equals_alone(world *w, req_spec *specs, int n, int32_t n_blocks,
                             const char *what);
/* The tests' one pseudo-random stream. */
int32_t urand(int32_t n);
bool same_tokens(const result *a, const result *b);
/* n greedy requests of sys + tail tokens sharing their first sys tokens,
 * from their own random stream (seed). */
void shared_prefix_specs(world *w, req_spec *sp, int n, int32_t sys, int32_t tail,
                         int32_t max_tokens, uint64_t seed);
void encode(world *w, const char *text, req_spec *sp);
/* The requests together (run_with) or each alone (run_each_with) on an
 * engine with options o. */
void run_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
              dp_engine_stats *st, int8_t mode);
void run_each_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
                   dp_engine_stats *st, int8_t mode);
/* Conversations: n pseudo-random tokens of user text (LCG state *x); a turn
 * sends the whole conversation and appends its reply. */
void conv_add_text(const world *w, int32_t *conv, int32_t *n_conv, int32_t n, uint64_t *x);
/* Where set, the decode type conversation turn i asks for. */
extern const int8_t *conv_kv_types;
void conv_turn(dp_engine *e, int32_t *conv, int32_t *n_conv, int32_t max_tokens,
               int8_t kv_type, result *res);
void run_conversation(world *w, const dp_engine_opts *o, int n_turns, int32_t first,
                      int32_t more, int32_t gen, uint64_t seed, result *res,
                      dp_engine_stats *st);
void check_same_turns(const result *a, const result *b, int n_turns, const char *what);

/* ---- the dual path, preemption, swap, decode types (test_engine_dualpath.c) ---- */

void test_dualpath(world *w, req_spec *specs, int n, const char *what);
void test_dualpath_preemption(world *w, req_spec *specs, int n, int32_t small_pool,
                              bool shared, int32_t decode_type, int32_t budget,
                              const char *what);
void test_swap_space(world *w, req_spec *specs, int n, int32_t small_pool);
void test_quantized_decode(world *w);
void test_quantized_whole_cache(world *w, req_spec *specs, int n);
void test_snapkv_every_time(world *w);
void test_early_switch(world *w);
void test_early_admission(world *w);
void test_exempt_layers(world *w);
void test_decode_types(world *w);
void test_decode_type_exact(world *w);
/* Preemption runs' keep ratio and least preemption count. */
extern float preempt_keep;
extern int preempt_min;

/* ---- system prompts and multi-turn chats (test_engine_turns.c) ---- */

void test_shared_prompt(world *w);
void test_system_prompt(world *w);
void test_system_prompt_typed(world *w);
void test_system_prompt_kivi(world *w);
void test_multiturn_rebuild(world *w, int32_t plen0);
void test_reply_reuse(world *w);
void test_resume_turns(world *w);

#endif
