/* test_engine_dualpath.c: the dual path through the engine: outputs with
 * and without it, preemption and swap under small pools, quantized and
 * grouped decode types, SnapKV capture, the early switch, exempt layers. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "engine/engine.h"
#include "engine_world.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "t.h"
#include "tools/synth_gguf.h"

void test_dualpath(world *w, req_spec *specs, int n, const char *what)
{
    static result off[MAXN], on[MAXN], offx[MAXN];
    dp_engine_opts o;
    engine_opts_default(&o);
    o.dualpath = false;
    o.n_blocks = 2048;
    dp_engine_stats st;
    run_with(w, &o, specs, n, off, &st, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(st.migrations, 0);
    /* keep_ratio 1.0: every token migrates, output is token-identical. The
     * decode path has another block geometry, so attention sums its keys in
     * other chunks: a last-bit difference that int8 activations (the CPU's
     * default matmul) can round either way. Both runs use the exact f32
     * matmul, so any difference here is the migration's. */
    bool exact = w->be->ops->get_exact && w->be->ops->get_exact(w->be);
    const result *ref = off;
    if (w->be->ops->set_exact) {
        w->be->ops->set_exact(w->be, true);
        run_with(w, &o, specs, n, offx, &st, DP_DUALPATH_DEFAULT);
        ref = offx;
    }
    o.dualpath = true;
    o.n_blocks = 1024;
    o.n_blocks_decode = 1024;
    o.decode_block_tokens = 8; /* a different geometry on the decode path */
    o.compress.keep_ratio = 1.0f;
    run_with(w, &o, specs, n, on, &st, DP_DUALPATH_DEFAULT);
    if (w->be->ops->set_exact)
        w->be->ops->set_exact(w->be, exact);
    int migrated = 0;
    for (int i = 0; i < n; i++) {
        CHECK_MSG(on[i].n == ref[i].n && memcmp(on[i].toks, ref[i].toks, (size_t)ref[i].n * 4) == 0,
                  "%s: keep_ratio 1.0 changed request %d", what, i);
        if (specs[i].max_tokens > 1 && ref[i].n > 1)
            migrated++;
    }
    CHECK(st.migrations >= migrated);
    CHECK_EQ_INT(st.tokens_evicted, 0);
    printf("%s: keep_ratio 1.0 identical to dualpath off (%lld migrations)\n", what,
           (long long)st.migrations);
    /* keep_ratio 0.5 (small sinks and window so that short prompts are
     * compressed too): runs, evicts, and every pool drains to zero. */
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    run_with(w, &o, specs, n, on, &st, DP_DUALPATH_DEFAULT);
    int64_t kept = 0, evicted = 0;
    for (int i = 0; i < n; i++) {
        CHECK(on[i].finish == DP_FINISH_LENGTH || on[i].finish == DP_FINISH_STOP);
        CHECK(on[i].n >= 1);
    }
    kept = st.tokens_kept;
    evicted = st.tokens_evicted;
    CHECK(st.migrations > 0);
    CHECK(evicted > 0);
    printf("%s: keep_ratio 0.5: %lld migrations, %lld tokens kept, %lld evicted\n", what,
           (long long)st.migrations, (long long)kept, (long long)evicted);
    /* Per request: dualpath off in a dual engine migrates nothing. */
    run_with(w, &o, specs, n, on, &st, DP_DUALPATH_OFF);
    CHECK_EQ_INT(st.migrations, 0);
    for (int i = 0; i < n; i++)
        CHECK(on[i].n == off[i].n && memcmp(on[i].toks, off[i].toks, (size_t)off[i].n * 4) == 0);
    /* A decode budget recompresses long generations and still drains. */
    o.decode_budget = 96;
    o.compress.window = 16;
    req_spec longgen[4];
    for (int i = 0; i < 4; i++) {
        longgen[i] = specs[i];
        if (longgen[i].n_prompt > 60)
            longgen[i].n_prompt = 60; /* the tiny model's context is 256 */
        longgen[i].max_tokens = 160;
        longgen[i].ignore_eos = true;
        longgen[i].stop = NULL;
    }
    run_with(w, &o, longgen, 4, on, &st, DP_DUALPATH_DEFAULT);
    CHECK(st.recompressions > 0);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(on[i].n, 160);
    /* SnapKV scored every recompression with the sequence's own decode
     * queries: none fell back to key norms, none went without a query. */
    CHECK_EQ_INT(st.recompressions_by_scorer[DP_SCORER_SNAPKV], st.recompressions);
    CHECK_EQ_INT(st.scorer_fallbacks[DP_COMPACT_RECOMPRESS], 0);
    CHECK_EQ_INT(st.decode_queries_missed, 0);
    printf("%s: decode budget 96: %lld recompressions, all scored by SnapKV over decode queries, "
           "all 4 x 160 tokens generated\n", what, (long long)st.recompressions);
    /* Key norms there instead: another selection, counted as such. */
    static result kn[4];
    o.compress.scorer = DP_SCORER_KNORM;
    run_with(w, &o, longgen, 4, kn, &st, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(st.recompressions_by_scorer[DP_SCORER_KNORM], st.recompressions);
    CHECK_EQ_INT(st.recompressions_by_scorer[DP_SCORER_SNAPKV], 0);
    o.compress.scorer = DP_SCORER_SNAPKV;
    /* dualpath requested on a server without it: refused. */
    o.dualpath = false;
    o.decode_budget = 0;
    next_opts = o;
    next_opts_set = true;
    dp_engine *e = start(w, 256, 8);
    next_opts_set = false;
    char err[DP_ERRLEN];
    static result r0;
    dp_request *r = make_req(&specs[0], &r0);
    r->params.dualpath_mode = DP_DUALPATH_ON;
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EINVAL);
    CHECK(strstr(err, "dualpath") != NULL);
    request_unref(r);
    engine_destroy(e);
}

/* Preemption keeps outputs with dualpath on: the same greedy requests run
 * together in a decode pool small enough to force preemptions give the
 * tokens each gives alone in a large one, because a preempted compact cache
 * is swapped out and restored as it was (recomputing it would choose its
 * kept set again, over its own output). usage's kept/evicted counts are the
 * same too. */
/* The keep ratio test_dualpath_preemption runs at, and the preemptions it
 * must see at least. */
float preempt_keep = 0.5f;
int preempt_min = 5;

void test_dualpath_preemption(world *w, req_spec *specs, int n, int32_t small_pool,
                              bool shared, int32_t decode_type, int32_t budget,
                              const char *what)
{
    static result alone[MAXN], together[MAXN];
    dp_engine_opts o;
    engine_opts_default(&o);
    o.decode_kv_type = decode_type;
    o.decode_budget = budget;
    o.compress.keep_ratio = preempt_keep;
    o.compress.sinks = 2;
    o.compress.window = 4; /* short prompts are compressed too */
    /* Split: a prefill pool of 1024 blocks and a small decode pool. Shared:
     * one small arena for both paths (prompts are preempted too). */
    o.n_blocks_decode = shared ? 0 : 1024;
    dp_engine_stats st_alone, st;
    next_opts = o;
    next_opts_set = true;
    dp_engine *e = start(w, 1024, 32);
    run_requests(e, specs, n, alone, true, DP_DUALPATH_DEFAULT, &st_alone);
    engine_destroy(e);
    next_opts.n_blocks_decode = shared ? 0 : small_pool;
    defer_start = true;
    e = start(w, shared ? small_pool : 1024, 32);
    defer_start = next_opts_set = false;
    run_requests(e, specs, n, together, false, DP_DUALPATH_DEFAULT, &st);
    engine_destroy(e);
    /* The portable kernels are not batch-invariant (alone and together a
     * step holds other rows: test_prompt_logprobs sees 7.6e-06 there, 0 at
     * the vector levels), and a last-bit difference can flip a near tie of
     * the logits: there the tokens are compared and reported, and the
     * preemption's own exactness is what the counts below check (every
     * compact cache swapped out and back, the same kept and evicted). */
    const char *lvl = w->be->ops->kernel_level ? w->be->ops->kernel_level(w->be) : "";
    const bool portable = !strcmp(lvl, "baseline");
    int differ = 0;
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(together[i].n, alone[i].n);
        bool same = same_tokens(&together[i], &alone[i]);
        differ += !same;
        CHECK_MSG(same || portable, "%s: request %d differs under memory pressure", what, i);
    }
    if (differ)
        printf("%s: at the %s level %d of %d requests differ from alone (kernels not "
               "batch-invariant there)\n", what, lvl, differ, n);
    CHECK_EQ_INT(st.migrations, st_alone.migrations);
    CHECK_EQ_INT(st.tokens_kept, st_alone.tokens_kept);
    CHECK_EQ_INT(st.tokens_evicted, st_alone.tokens_evicted);
    CHECK_MSG(st.preemptions >= preempt_min, "%s: only %lld preemptions", what,
              (long long)st.preemptions);
    CHECK_EQ_INT(st.kv.shared, shared);
    if (!shared) /* a shared arena also preempts prompts, which are recomputed */
        CHECK_EQ_INT(st.kv.swap_outs, st.preemptions);
    CHECK(st.kv.swap_outs > 0);
    CHECK_EQ_INT(st.kv.swap_ins, st.kv.swap_outs);
    CHECK_EQ_INT(st.kv.decode_recomputes, 0);
    CHECK_EQ_INT(st.kv.swap_bytes, 0);
    /* Under a budget the same recompressions ran, each scored by SnapKV
     * over the decode queries it had alone (the sums travel with a swap). */
    CHECK_EQ_INT(st.recompressions, st_alone.recompressions);
    CHECK_EQ_INT(st.recompressions_by_scorer[DP_SCORER_SNAPKV], st.recompressions);
    CHECK(budget == 0 || st.recompressions > 0);
    CHECK(budget == 0 || !shared || st.kv.recompressions_staged > 0); /* the arena ran dry */
    CHECK_EQ_INT(st_alone.kv.recompressions_staged, 0);
    /* A grouped type seals the same groups alone and under pressure (a
     * swapped-out cache comes back with its groups and residual as they were). */
    CHECK(!dp_kv_type_grouped(decode_type) || st_alone.kv.groups_sealed > 0);
    CHECK_EQ_INT(st.kv.groups_sealed, st_alone.kv.groups_sealed);
    printf("%s: %d requests in a %d-block %s identical to alone (%lld preemptions, %lld compact "
           "caches swapped out and back, %lld recompressions, %lld of them staged)\n",
           what, n, small_pool, shared ? "arena for both paths" : "decode pool",
           (long long)st.preemptions, (long long)st.kv.swap_outs, (long long)st.recompressions,
           (long long)st.kv.recompressions_staged);
}

/* swap_space: the default is allocated once at start-up (4 GiB in whole
 * blocks); with none, a preempted decode-path cache is recomputed from its
 * tokens, and every request still completes. */
void test_swap_space(world *w, req_spec *specs, int n, int32_t small_pool)
{
    static result res[MAXN];
    dp_engine_opts o;
    engine_opts_default(&o);
    CHECK_EQ_INT(o.swap_bytes, (int64_t)4 << 30);
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    o.n_blocks = 1024;
    o.n_blocks_decode = small_pool;
    dp_engine_stats st;
    for (int none = 0; none < 2; none++) {
        o.swap_bytes = none ? 0 : (int64_t)4 << 30;
        defer_start = true;
        run_with(w, &o, specs, n, res, &st, DP_DUALPATH_DEFAULT);
        defer_start = false;
        for (int i = 0; i < n; i++)
            CHECK_EQ_INT(res[i].n, specs[i].max_tokens);
        CHECK(st.preemptions >= 5);
        if (none) {
            CHECK_EQ_INT(st.kv.swap_space_bytes, 0);
            CHECK_EQ_INT(st.kv.swap_outs, 0);
            CHECK_EQ_INT(st.kv.decode_recomputes, st.preemptions);
        } else {
            CHECK(st.kv.swap_space_bytes > ((int64_t)4 << 30) - (1 << 20) &&
                  st.kv.swap_space_bytes <= (int64_t)4 << 30);
            CHECK_EQ_INT(st.kv.swap_outs, st.preemptions);
            CHECK_EQ_INT(st.kv.decode_recomputes, 0);
        }
    }
    printf("swap_space: %lld preemptions recomputed without a swap space\n",
           (long long)st.kv.decode_recomputes);
}

/* A quantized decode path in one arena with the prefill path: a block's
 * bytes hold 16 tokens in f16 on the prefill path, 30 in q8_0 and 56 in q4_0
 * on the decode path. Eight sequences whose prompts (40 tokens, kept to 20)
 * grow by 200 tokens each need 112 of the arena's 64 blocks in f16 at the
 * end, 64 in q8_0 and 32 in q4_0: with everything submitted before the
 * engine starts (the same schedule every run) f16 must preempt, q4_0 never
 * does. The kept sets are chosen on the prefill path's f16 cache, before
 * quantization, so each type keeps and evicts the same tokens. */
void test_quantized_decode(world *w)
{
    enum { N = 8, P = 40, GEN = 200 };
    static req_spec sp[N];
    static result res[3][N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = P, .max_tokens = GEN, .ignore_eos = true};
        for (int k = 0; k < P; k++)
            sp[i].prompt[k] = urand(w->vocab);
    }
    const int32_t types[3] = {-1, DP_KV_Q8_0, DP_KV_Q4_0};
    dp_engine_stats st[3];
    for (int t = 0; t < 3; t++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.max_batched_tokens = 128;
        o.max_seqs = 32;
        o.n_blocks = 64;
        o.decode_kv_type = types[t];
        o.compress.sinks = 2;
        o.compress.window = 4;
        char err[DP_ERRLEN];
        dp_engine *e;
        CHECK_MSG(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < N; i++) {
            memset(&res[t][i], 0, sizeof res[t][i]);
            dp_request *r = make_req(&sp[i], &res[t][i]);
            CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
            request_unref(r);
        }
        CHECK(engine_start(e) == 0);
        collect(e, N);
        check_idle(e);
        settled_stats(e, &st[t]);
        engine_destroy(e);
        for (int i = 0; i < N; i++)
            CHECK_EQ_INT(res[t][i].n, GEN);
        CHECK_EQ_INT(st[t].kv.shared, 1);
        CHECK_EQ_INT(st[t].migrations, N);
    }
    CHECK_EQ_INT(st[0].kv.decode_block_tokens, 16);
    CHECK_EQ_INT(st[1].kv.decode_block_tokens, 30);
    CHECK_EQ_INT(st[2].kv.decode_block_tokens, 56);
    CHECK(st[0].preemptions > 0);
    CHECK_EQ_INT(st[2].preemptions, 0);
    CHECK(st[1].preemptions <= st[0].preemptions);
    for (int t = 1; t < 3; t++) {
        CHECK_EQ_INT(st[t].tokens_kept, st[0].tokens_kept);
        CHECK_EQ_INT(st[t].tokens_evicted, st[0].tokens_evicted);
    }
    int same[3] = {N, 0, 0};
    for (int t = 1; t < 3; t++)
        for (int i = 0; i < N; i++)
            same[t] += memcmp(res[t][i].toks, res[0][i].toks, (size_t)GEN * sizeof(int32_t)) == 0;
    printf("quantized decode path: %d sequences of %d + %d tokens in a 64-block arena: f16 %lld "
           "preemptions (peak %d running), q8_0 %lld (peak %d), q4_0 %lld (peak %d); greedy "
           "outputs identical to f16's: q8_0 %d/%d, q4_0 %d/%d (random weights)\n",
           N, P, GEN, (long long)st[0].preemptions, st[0].running_peak,
           (long long)st[1].preemptions, st[1].running_peak, (long long)st[2].preemptions,
           st[2].running_peak, same[1], N, same[2], N);
}

/* A whole cache in q8_0 or q4_0 with the dual path off (kv_cache_type, as
 * llama.cpp's -ctk/-ctv): the same bytes hold 1.88x / 3.56x the f16
 * blocks; requests together in a small pool (preempted and recomputed)
 * give the tokens each gives alone; with the dual path on the server
 * refuses the setting, naming it. */
void test_quantized_whole_cache(world *w, req_spec *specs, int n)
{
    const int32_t types[3] = {DP_KV_F16, DP_KV_Q8_0, DP_KV_Q4_0};
    int32_t blocks[3];
    for (int t = 0; t < 3; t++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.dualpath = false;
        o.kv_type = types[t];
        o.max_batched_tokens = 128;
        o.max_seqs = 32;
        o.kv_bytes = (int64_t)4 << 20;
        dp_engine *e;
        char err[DP_ERRLEN];
        CHECK_MSG(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == 0, "%s", err);
        dp_engine_stats st;
        engine_get_stats(e, &st);
        blocks[t] = st.kv.blocks_total;
        engine_destroy(e);
        if (t == 0)
            continue;
        /* 40 blocks of 16 tokens: the sequences preempt one another. */
        next_opts = o;
        next_opts.kv_bytes = 0;
        next_opts_set = true;
        char what[64];
        snprintf(what, sizeof what, "tiny32 %s whole cache, dualpath off, 40-block pool",
                 dp_kv_type_name(types[t]));
        concurrent_equals_alone(w, specs, n, 40, what);
        next_opts_set = false;
        o.dualpath = true;
        CHECK(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == DP_EINVAL);
        CHECK_MSG(strstr(err, "kv_cache_type") && strstr(err, "dualpath = false"), "%s", err);
    }
    /* Blocks of 16 tokens x 32 values: f16 64 bytes a row, q8_0 34, q4_0 18. */
    CHECK_EQ_INT(blocks[1], (int32_t)((int64_t)blocks[0] * 64 / 34));
    CHECK_EQ_INT(blocks[2], (int32_t)((int64_t)blocks[0] * 64 / 18));
    printf("quantized whole cache (dualpath off): 4 MiB hold %d blocks in f16, %d in q8_0, %d in "
           "q4_0; with dualpath on the setting is refused\n", blocks[0], blocks[1], blocks[2]);
}

/* SnapKV as configured, every time: 16 prompts of 30 tokens, submitted before
 * the engine starts so that four end in each 128-token step, all migrate with
 * SnapKV; so do 16 prompts of 150 tokens, chunked (the last chunk keeps the
 * whole window: 118 + 32, not 128 + 22), and the same prompts again, now
 * taken mostly from the prefix cache. The per-step capture of 64 queries
 * served two prompts of each step; the others fell back to key norms. */
void test_snapkv_every_time(world *w)
{
    enum { N = 16 };
    static req_spec specs[N];
    static result res[N];
    const int lens[2] = {30, 150};
    dp_engine_opts o;
    engine_opts_default(&o);
    o.max_batched_tokens = 128; /* the test model's activations */
    o.max_seqs = 32;
    o.n_blocks = 512;
    o.n_blocks_decode = 1024;
    char err[DP_ERRLEN];
    dp_engine *e;
    CHECK_MSG(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == 0, "%s", err);
    int64_t want = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            if (round < 2) {
                specs[i] = (req_spec){.n_prompt = lens[round], .max_tokens = 2, .ignore_eos = true};
                for (int k = 0; k < specs[i].n_prompt; k++)
                    specs[i].prompt[k] = urand(w->vocab);
            }
            memset(&res[i], 0, sizeof res[i]);
            dp_request *r = make_req(&specs[i], &res[i]);
            CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
            request_unref(r);
        }
        if (round == 0)
            CHECK(engine_start(e) == 0);
        collect(e, N);
        want += N;
        dp_engine_stats st;
        settled_stats(e, &st);
        CHECK_EQ_INT(st.migrations_by_scorer[DP_SCORER_SNAPKV], want);
        CHECK_EQ_INT(st.migrations, want);
        CHECK_EQ_INT(st.scorer_fallbacks[DP_COMPACT_MIGRATION], 0);
        if (round == 2)
            CHECK(st.kv.rebuild_prefix_tokens > 0);
        printf("snapkv: round %d (%s): %lld migrations, all with snapkv\n", round,
               round == 0 ? "4 prompts ending in each step" : round == 1 ? "chunked prompts"
                                                                         : "prefix-cache hits",
               (long long)st.migrations);
    }
    engine_destroy(e);
}

/* The path detector switches a highly repetitive long prompt early; the
 * request completes and every pool drains. */
void test_early_switch(world *w)
{
    dp_engine_opts o;
    engine_opts_default(&o);
    o.n_blocks = 256;
    o.n_blocks_decode = 256;
    o.early_switch = true;
    /* At the default 0.9 nearly every token is kept, so even random text's
     * kept set is stable soon; at 0.5 only a repetitive one's is. */
    o.compress.keep_ratio = 0.5f;
    static req_spec sp[2];
    static result res[2];
    for (int k = 0; k < 2; k++) {
        sp[k] = (req_spec){.n_prompt = 500, .max_tokens = 8, .ignore_eos = true};
        for (int i = 0; i < 500; i++)
            sp[k].prompt[i] = k == 0 ? 100 + i % 8 : urand(w->vocab); /* a loop / random text */
    }
    dp_engine_stats st;
    /* Chunks of 128 tokens (the world's step): the detector may switch from
     * 256 computed tokens on (min_tokens). */
    run_with(w, &o, sp, 1, res, &st, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(st.early_switches, 1);
    CHECK_EQ_INT(res[0].n, 8);
    /* The switch moved its first 256 tokens whole; what is kept is chosen at
     * the prompt's end, over all 500. */
    CHECK(st.tokens_kept > 0 && st.tokens_kept < 500);
    CHECK_EQ_INT(st.tokens_kept + st.tokens_evicted, 500);
    /* The repetition decided: no kept set was measured, and the switch (and
     * the tail's compaction at the prompt's end) scored with SnapKV and the
     * chunk's own queries. */
    CHECK_EQ_INT(st.early_signals, 0);
    CHECK_EQ_INT(st.migrations_by_scorer[DP_SCORER_SNAPKV], 1);
    for (int k = 0; k < DP_N_COMPACTIONS; k++)
        CHECK_EQ_INT(st.scorer_fallbacks[k], 0);
    run_with(w, &o, sp + 1, 1, res + 1, &st, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(st.early_switches, 0); /* random text: neither repetitive nor (yet) stable */
    CHECK_EQ_INT(st.migrations, 1);
    /* The kept set was measured at the chunk ends from 256 on (256 and 384),
     * not before, and with SnapKV. */
    CHECK_EQ_INT(st.early_signals, 2);
    CHECK_EQ_INT(st.migrations_by_scorer[DP_SCORER_SNAPKV], 1);
    for (int k = 0; k < DP_N_COMPACTIONS; k++)
        CHECK_EQ_INT(st.scorer_fallbacks[k], 0);
    printf("early switch: a repetitive 500-token prompt switched early (no kept set measured), a "
           "random one at its end (2 measured); all scored with SnapKV\n");
}

/* An early switch counted at admission: a repetitive prompt switches at its
 * first chunk end past early_min_tokens (here 32, so at the end of its first
 * 128-token step), so admission holds prefill blocks up to there only and
 * promises the whole prompt on the decode path (kvcache/manager.h,
 * early_at). 240-token prompts in an arena of 30 blocks (tiny32: 16 f16 or
 * 60 q8_0 tokens each): switched at the prompt's end each needs 15 prefill
 * blocks and 5 decode blocks (20), switched early 10 and 5 (15), so two
 * run at once where one did. */
void test_early_admission(world *w)
{
    enum { N = 4, P = 240 };
    static req_spec sp[N];
    static result res[2][N];
    for (int k = 0; k < N; k++) {
        sp[k] = (req_spec){.n_prompt = P, .max_tokens = 4, .ignore_eos = true};
        for (int i = 0; i < P; i++)
            sp[k].prompt[i] = 10 + 10 * k + i % 8; /* a loop per request */
    }
    dp_engine_opts o;
    engine_opts_default(&o);
    o.n_blocks = 30;
    o.decode_kv_type = DP_KV_Q8_0;
    o.early_min_tokens = 32;
    exact_kv = false; /* the default f16 cache */
    dp_engine_stats st[2];
    for (int c = 0; c < 2; c++) {
        o.early_switch = c == 1;
        run_with(w, &o, sp, N, res[c], &st[c], DP_DUALPATH_DEFAULT);
        for (int k = 0; k < N; k++)
            CHECK_EQ_INT(res[c][k].n, 4);
    }
    exact_kv = true;
    CHECK_EQ_INT(st[0].early_switches, 0);
    CHECK_EQ_INT(st[1].early_switches, N);
    /* Each at its first chunk end past 32, within one step of it (a step's
     * 128 tokens are shared by the prompts in it). */
    CHECK(st[1].early_switch_tokens >= N * 32 && st[1].early_switch_tokens <= N * (31 + 128));
    CHECK_EQ_INT(st[0].running_peak, 1);
    CHECK_EQ_INT(st[1].running_peak, 2);
    CHECK_EQ_INT(st[0].preemptions + st[1].preemptions, 0);
    printf("early switch at admission: %d of %d repetitive %d-token prompts at once in %d blocks "
           "switching early, %d switching at their end\n", st[1].running_peak, N, P, o.n_blocks,
           st[0].running_peak);
}

/* Exempt layers. With every layer exempt (the tiny model's 2) attention
 * reads each token's whole history, in the prefill path's type and block
 * geometry: outputs equal dualpath off's bit for bit, through everything
 * that moves an exempt table: 16 requests in a 28-block arena (compact and
 * exempt tables swapped out and back together), a decode budget's
 * recompressions (which touch the compact table only), and a conversation
 * whose later turns continue their parked caches (the exempt table cut to
 * the matched history). With one layer exempt (two exempt blocks folded in
 * an arena block), keep 1.0 answers as dualpath off, and a request that
 * asks for none answers as on a server without exempt layers. */
void test_exempt_layers(world *w)
{
    enum { N = 16, TURNS = 4, FIRST = 40, NEW = 16, GEN = 24 };
    static req_spec sp[N];
    static result off[N], on[N], none[N], asked[N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 20 + urand(40), .max_tokens = 80, .ignore_eos = true};
        for (int k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = urand(w->vocab);
    }
    const char *lvl = w->be->ops->kernel_level ? w->be->ops->kernel_level(w->be) : "";
    const bool portable = !strcmp(lvl, "baseline");
    dp_engine_opts o;
    engine_opts_default(&o);
    o.dualpath = false;
    o.n_blocks = 1024;
    dp_engine_stats st;
    run_with(w, &o, sp, N, off, &st, DP_DUALPATH_DEFAULT);
    o.dualpath = true;
    o.decode_kv_type = ENGINE_DECODE_KV_SAME;
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    o.exempt_layers = 2;
    for (int budget = 0; budget <= 48; budget += 48) {
        o.decode_budget = budget;
        dp_engine_opts small = o; /* 28 blocks: preemptions */
        small.n_blocks = 28;
        defer_start = true;
        run_with(w, &small, sp, N, on, &st, DP_DUALPATH_DEFAULT);
        defer_start = false;
        int differ = 0;
        for (int i = 0; i < N; i++) {
            CHECK_EQ_INT(on[i].n, off[i].n);
            differ += !same_tokens(&on[i], &off[i]);
        }
        CHECK_MSG(differ == 0 || portable, "every layer exempt (budget %d): %d of %d requests "
                  "differ from dualpath off", budget, differ, N);
        CHECK_EQ_INT(st.kv.exempt_layers, 2);
        CHECK(st.migrations > 0);
        CHECK(st.tokens_evicted > 0);
        CHECK(st.kv.swap_outs > 0);
        CHECK_EQ_INT(st.kv.swap_ins, st.kv.swap_outs);
        CHECK_EQ_INT(st.kv.decode_recomputes, 0);
        CHECK(budget == 0 || st.recompressions > 0);
        printf("exempt layers: every layer exempt, keep 0.5, budget %d: %d requests in a 28-block "
               "arena (%lld preemptions, %lld swapped out and back) %s dualpath off's outputs\n",
               budget, N, (long long)st.preemptions, (long long)st.kv.swap_outs,
               differ ? "differ from (baseline kernels)" : "identical to");
    }
    o.decode_budget = 0;

    /* One of the two layers exempt: an arena block holds two exempt blocks
     * (the folded view), read at its own block geometry. At keep 1.0 every
     * layer still sees every token, so with the exact matmul (as in
     * test_dualpath) the outputs equal dualpath off's. */
    if (w->be->ops->set_exact) {
        static result offx[N], onx[N];
        const bool exact = w->be->ops->get_exact && w->be->ops->get_exact(w->be);
        w->be->ops->set_exact(w->be, true);
        dp_engine_opts fo = o;
        fo.dualpath = false;
        fo.n_blocks = 1024;
        run_with(w, &fo, sp, N, offx, &st, DP_DUALPATH_DEFAULT);
        fo = o;
        fo.dualpath = true;
        fo.exempt_layers = 1;
        fo.compress.keep_ratio = 1.0f;
        fo.n_blocks = 512;
        run_with(w, &fo, sp, N, onx, &st, DP_DUALPATH_DEFAULT);
        w->be->ops->set_exact(w->be, exact);
        for (int i = 0; i < N; i++)
            CHECK_MSG(same_tokens(&onx[i], &offx[i]), "one layer exempt, keep 1.0: request %d "
                      "differs from dualpath off", i);
        CHECK(st.migrations > 0);
        CHECK_EQ_INT(st.tokens_evicted, 0);
    }

    /* A conversation: later turns continue their parked caches. */
    static result conv_off[TURNS], conv_on[TURNS];
    dp_engine_stats cst[2];
    for (int mode = 0; mode < 2; mode++) {
        dp_engine_opts co = o;
        co.dualpath = mode == 1;
        co.reuse_replies = false;
        run_conversation(w, &co, TURNS, FIRST, NEW, GEN, 17, mode ? conv_on : conv_off, &cst[mode]);
    }
    CHECK_EQ_INT(cst[1].kv.turns_resumed, TURNS - 1);
    CHECK(cst[1].tokens_evicted > 0);
    check_same_turns(conv_off, conv_on, TURNS, "with every layer exempt, continued from parked turns");

    /* One layer exempt: a request that asks for none is served as without. */
    o.exempt_layers = 0;
    run_with(w, &o, sp, N, none, &st, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(st.kv.exempt_blocks, 0);
    o.exempt_layers = 1;
    for (int i = 0; i < N; i++)
        sp[i].exempt = 1;
    run_with(w, &o, sp, N, asked, &st, DP_DUALPATH_DEFAULT);
    for (int i = 0; i < N; i++)
        sp[i].exempt = 0;
    int differ = 0;
    for (int i = 0; i < N; i++)
        differ += !same_tokens(&asked[i], &none[i]);
    CHECK_MSG(differ == 0 || portable, "%d requests asking for no exempt layers differ", differ);
    /* Asking for another count than the server's is refused. */
    next_opts = o;
    next_opts_set = true;
    dp_engine *e = start(w, 64, 8);
    next_opts_set = false;
    req_spec bad = sp[0];
    bad.exempt = 3;
    result r;
    dp_request *req = make_req(&bad, &r);
    char err[DP_ERRLEN];
    CHECK(engine_submit(e, req, err, sizeof err) == DP_EINVAL);
    CHECK(strstr(err, "exempt_layers") != NULL);
    request_unref(req);
    engine_destroy(e);
    printf("exempt layers: a %d-turn conversation identical to dualpath off (%lld turns resumed); "
           "requests asking for none served as without\n", TURNS, (long long)cst[1].kv.turns_resumed);
}

/* Per-request decode types ("dualpath": {"decode_kv_type"}): each is
 * another view of the one arena, so requests of three types share one pool,
 * one batch and one swap space. A request's output depends on its own type
 * only: mixed in an arena small enough to swap, each gives the tokens of a
 * server whose decode_kv_type is that type (exact matmul: every batch
 * composition computes the same bits). Its usage.dualpath.kv_bytes is its
 * type's. */
void test_decode_types(world *w)
{
    enum { N = 12, T = 3, GEN = 200 };
    static req_spec sp[N], ref[N];
    static result mixed[N], pure[N];
    const int32_t types[T] = {DP_KV_F16, DP_KV_Q8_0, DP_KV_Q4_0};
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 20 + urand(30), .max_tokens = GEN, .ignore_eos = true};
        for (int k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = urand(w->vocab);
        /* Every third the server's (q8_0), asked for by name or not. */
        sp[i].kv_type = i % T == 1 && i % 2 ? 0 : (int8_t)(types[i % T] + 1);
    }
    const bool can_exact = w->be->ops->set_exact != NULL;
    const bool exact = can_exact && w->be->ops->get_exact && w->be->ops->get_exact(w->be);
    if (can_exact)
        w->be->ops->set_exact(w->be, true);
    dp_engine_opts o;
    engine_opts_default(&o);
    o.decode_kv_type = DP_KV_Q8_0;
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    dp_engine_stats st, rst;
    /* Under a decode budget each type recompresses in its own store. */
    for (int budget = 0; budget <= 64; budget += 64) {
        o.decode_budget = budget;
        o.n_blocks = 28;
        next_opts = o;
        next_opts_set = defer_start = true;
        dp_engine *e = start(w, o.n_blocks, 32);
        next_opts_set = defer_start = false;
        run_requests(e, sp, N, mixed, false, DP_DUALPATH_DEFAULT, &st);
        engine_destroy(e);
        CHECK(budget > 0 || st.kv.swap_outs >= 5); /* (recompression keeps them all in) */
        CHECK_EQ_INT(st.kv.swap_ins, st.kv.swap_outs);
        CHECK_EQ_INT(st.kv.decode_recomputes, 0);
        CHECK_EQ_INT(st.migrations, N);
        CHECK(budget == 0 || st.recompressions > 0);
        for (int t = 0; t < T; t++) {
            int n = 0;
            for (int i = t; i < N; i += T) {
                ref[n] = sp[i];
                ref[n++].kv_type = 0;
            }
            dp_engine_opts to = o;
            to.decode_kv_type = types[t];
            to.n_blocks = 1024;
            run_with(w, &to, ref, n, pure, &rst, DP_DUALPATH_DEFAULT);
            CHECK_EQ_INT(rst.migrations, n);
            for (int k = 0, i = t; i < N; i += T, k++) {
                CHECK_EQ_INT(mixed[i].n, GEN);
                CHECK_MSG(same_tokens(&mixed[i], &pure[k]), "decode type %s, budget %d: request "
                          "%d differs from a server of that type", dp_kv_type_name(types[t]),
                          budget, i);
                CHECK_EQ_INT(mixed[i].kv_bytes, pure[k].kv_bytes);
            }
        }
        printf("decode types: %d requests of f16, q8_0 and q4_0 in one %d-block arena, decode "
               "budget %d (%lld preemptions, %lld swapped out and back, %lld recompressions) "
               "identical to servers of each type\n", N, o.n_blocks, budget,
               (long long)st.preemptions, (long long)st.kv.swap_outs, (long long)st.recompressions);
    }
    /* A conversation in f16 on the q8_0 server continues its parked turns
     * as on an f16 server; in one that changes type every turn a parked
     * cache serves only a later turn of its own type. */
    enum { TURNS = 4 };
    static result ca[TURNS], cb[TURNS], cc[TURNS];
    dp_engine_stats cs[3];
    static const int8_t f16_turns[TURNS] = {DP_KV_F16 + 1, DP_KV_F16 + 1, DP_KV_F16 + 1,
                                            DP_KV_F16 + 1};
    static const int8_t mixed_turns[TURNS] = {DP_KV_F16 + 1, DP_KV_Q4_0 + 1, 0, DP_KV_F16 + 1};
    o.decode_budget = 0;
    o.reuse_replies = false;
    conv_kv_types = f16_turns;
    run_conversation(w, &o, TURNS, 40, 16, 24, 23, ca, &cs[0]);
    conv_kv_types = mixed_turns;
    run_conversation(w, &o, TURNS, 40, 16, 24, 23, cc, &cs[2]);
    conv_kv_types = NULL;
    dp_engine_opts fo = o;
    fo.decode_kv_type = DP_KV_F16;
    run_conversation(w, &fo, TURNS, 40, 16, 24, 23, cb, &cs[1]);
    CHECK_EQ_INT(cs[0].kv.turns_resumed, TURNS - 1);
    CHECK_EQ_INT(cs[1].kv.turns_resumed, TURNS - 1);
    check_same_turns(ca, cb, TURNS, "in f16 on a q8_0 server (against an f16 server)");
    /* (Only the last turn continues one: the first's, in its type.) */
    CHECK_EQ_INT(cs[2].kv.turns_resumed, 1);
    CHECK(same_tokens(&cc[0], &ca[0]));

    /* Replies are written back to the prefix cache (which every request
     * reads) in the server's type, not in a lossier one a request chose. */
    static result cr[TURNS];
    static const int8_t q4_turns[TURNS] = {DP_KV_Q4_0 + 1, DP_KV_Q4_0 + 1, DP_KV_Q4_0 + 1,
                                           DP_KV_Q4_0 + 1};
    dp_engine_opts ro = o;
    ro.reuse_replies = true;
    ro.resume_turns = false; /* (parked turns stand for the reply instead) */
    run_conversation(w, &ro, TURNS, 40, 16, 24, 29, cr, &cs[0]);
    conv_kv_types = q4_turns;
    run_conversation(w, &ro, TURNS, 40, 16, 24, 29, cr, &cs[1]);
    conv_kv_types = NULL;
    CHECK(cs[0].kv.reply_blocks_kept > 0);
    CHECK_EQ_INT(cs[1].kv.reply_blocks_kept, 0);

    /* The same prompt in each type: fewer bytes the smaller the type. */
    static req_spec one[T];
    static result r3[T];
    for (int t = 0; t < T; t++) {
        one[t] = sp[0];
        one[t].kv_type = (int8_t)(types[t] + 1);
    }
    o.decode_budget = 0;
    o.n_blocks = 1024;
    run_with(w, &o, one, T, r3, &rst, DP_DUALPATH_DEFAULT);
    CHECK(r3[0].kv_bytes > r3[1].kv_bytes && r3[1].kv_bytes > r3[2].kv_bytes);
    if (can_exact)
        w->be->ops->set_exact(w->be, exact);
    printf("decode types: usage.dualpath.kv_bytes of one prompt: f16 %lld, q8_0 %lld, q4_0 %lld\n",
           (long long)r3[0].kv_bytes, (long long)r3[1].kv_bytes, (long long)r3[2].kv_bytes);
}

/* The prefill type asked for at keep 1.0 on a server whose decode type is
 * q8_0 keeps the prompt's exact bytes: dualpath off's outputs (exact
 * matmul). A type the server cannot keep is refused by name. */
void test_decode_type_exact(world *w)
{
    enum { N = 8 };
    static req_spec sp[N];
    static result off[N], on[N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 20 + urand(40), .max_tokens = 60, .ignore_eos = true,
                           .kv_type = DP_KV_F16 + 1};
        for (int k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = urand(w->vocab);
    }
    const bool was_exact = exact_kv;
    exact_kv = false; /* the f16 arena */
    dp_engine_opts o;
    engine_opts_default(&o);
    o.dualpath = false;
    o.n_blocks = 1024;
    dp_engine_stats st;
    if (w->be->ops->set_exact) {
        const bool exact = w->be->ops->get_exact && w->be->ops->get_exact(w->be);
        w->be->ops->set_exact(w->be, true);
        for (int i = 0; i < N; i++)
            sp[i].kv_type = 0; /* (dualpath off: no decode path to name) */
        run_with(w, &o, sp, N, off, &st, DP_DUALPATH_DEFAULT);
        for (int i = 0; i < N; i++)
            sp[i].kv_type = DP_KV_F16 + 1;
        o.dualpath = true;
        o.decode_kv_type = DP_KV_Q8_0;
        o.compress.keep_ratio = 1.0f;
        run_with(w, &o, sp, N, on, &st, DP_DUALPATH_DEFAULT);
        w->be->ops->set_exact(w->be, exact);
        for (int i = 0; i < N; i++)
            CHECK_MSG(same_tokens(&on[i], &off[i]), "f16 asked for at keep 1.0: request %d "
                      "differs from dualpath off", i);
        CHECK_EQ_INT(st.migrations, N);
        CHECK_EQ_INT(st.tokens_evicted, 0);
    }
    /* f32 would hold a token in more bytes than the f16 prefill path. */
    o.dualpath = true;
    o.decode_kv_type = DP_KV_Q8_0;
    next_opts = o;
    next_opts_set = true;
    dp_engine *e = start(w, 64, 8);
    next_opts_set = false;
    req_spec bad = sp[0];
    bad.kv_type = DP_KV_F32 + 1;
    result r;
    dp_request *req = make_req(&bad, &r);
    char err[DP_ERRLEN];
    CHECK(engine_submit(e, req, err, sizeof err) == DP_EINVAL);
    CHECK_MSG(strstr(err, "decode_kv_type f32 is not available") && strstr(err, "q4_0"), "%s", err);
    request_unref(req);
    engine_destroy(e);
    /* Without dualpath there is no decode path to keep in a type. */
    o.dualpath = false;
    next_opts = o;
    next_opts_set = true;
    e = start(w, 64, 8);
    next_opts_set = false;
    bad.kv_type = DP_KV_Q8_0 + 1;
    req = make_req(&bad, &r);
    CHECK(engine_submit(e, req, err, sizeof err) == DP_EINVAL);
    CHECK_MSG(strstr(err, "dualpath is disabled") != NULL, "%s", err);
    request_unref(req);
    engine_destroy(e);
    exact_kv = was_exact;
    printf("decode types: f16 asked for at keep 1.0 on a q8_0 server identical to dualpath off; "
           "f32 refused (%s)\n", "larger than the prefill path's");
}
