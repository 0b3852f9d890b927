/* test_engine_turns.c: shared system prompts (kept whole on the decode
 * path, in every decode type) and multi-turn chats: the history rebuilt,
 * replies reused, parked turns resumed. */
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

/* n = 4 (four requests with one prompt, submitted together) prefills the
 * prompt once: the copies wait for its blocks to be named and take them by
 * reference. Each copy computes only what it cannot share: the last partial
 * block. The four greedy outputs are identical, and equal to the prompt's alone.
 * Computing each copy whole cost 4 x 150. With dualpath the copies share the
 * first one's compaction too (a kept share, kvcache/dprefix.h): they wait
 * for its migration, then of its 135 kept slots each takes the 128 in whole
 * decode blocks by reference and copies the last 7, selecting nothing, so
 * no SnapKV window of their own is computed either. */
void test_shared_prompt(world *w)
{
    enum { N = 4, P = 150 };
    static req_spec sp[N];
    static result res[N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = P, .max_tokens = 8, .ignore_eos = true};
        for (int k = 0; k < P; k++)
            sp[i].prompt[k] = i == 0 ? urand(w->vocab) : sp[0].prompt[k];
    }
    /* Dualpath off, split pools, one arena of one type. */
    static const char *const modes[] = {"off", "on", "on, one arena"};
    for (int mode = 0; mode < 3; mode++) {
        const bool on = mode > 0;
        dp_engine_opts o;
        engine_opts_default(&o);
        o.dualpath = on;
        o.n_blocks = 256;
        o.n_blocks_decode = mode == 1 ? 256 : 0;
        o.decode_kv_type = ENGINE_DECODE_KV_SAME;
        o.compress.keep_ratio = 0.9f; /* a compaction that evicts: 135 of 150 kept */
        dp_engine_stats st, one;
        static result alone[1];
        run_with(w, &o, sp, 1, alone, &one, DP_DUALPATH_DEFAULT);
        defer_start = true; /* all four queued before the first step */
        run_with(w, &o, sp, N, res, &st, DP_DUALPATH_DEFAULT);
        defer_start = false;
        for (int i = 0; i < N; i++)
            CHECK_MSG(same_tokens(&res[i], &alone[0]), "dualpath %s: copy %d differs from the "
                      "prompt alone", modes[mode], i);
        CHECK_EQ_INT(st.kv.kept_shares, on ? N - 1 : 0);
        CHECK_EQ_INT(st.tokens_in_place, on ? (N - 1) * 128 : 0);
        /* Per copy: below one block (16) of recompute. With SnapKV a copy
         * would compute its window (32) too, but it waits for the first's
         * migration and keeps its compaction without scoring. */
        const int64_t per_copy = 16;
        int64_t prompt = st.prompt_tokens;
        CHECK_MSG(prompt <= P + (N - 1) * per_copy, "dualpath %s: %lld prompt tokens computed for "
                  "n = %d copies of %d", modes[mode], (long long)prompt, N, P);
        printf("shared prompt (dualpath %s): n = %d copies of a %d-token prompt computed %lld "
               "prompt tokens (%d without sharing); %lld kept tokens by reference\n",
               modes[mode], N, P, (long long)prompt, N * P, (long long)st.tokens_in_place);
    }
}

/* A system prompt kept whole (keep_prefix) and shared: requests whose
 * prompts start with the same 100 tokens keep its 6 whole blocks (96 tokens)
 * on the decode path by reference to the prefill blocks the prefix cache
 * shares, in one arena, and compress only their own tails. With split pools
 * the first one's copy of the prefix is shared instead (kvcache/dprefix.h):
 * the same kept tokens, the same outputs. The
 * engine runs the same greedy requests under memory pressure (a shared
 * arena small enough to preempt) with the same outputs too. */
void test_system_prompt(world *w)
{
    enum { N = 12, SYS = 100, TAIL = 20 };
    static req_spec sp[N];
    static result ref[N], res[N];
    shared_prefix_specs(w, sp, N, SYS, TAIL, 120, 99);
    dp_engine_opts o;
    engine_opts_default(&o);
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    dp_engine_stats split, shared, small;
    o.n_blocks = 512;
    o.n_blocks_decode = 512;
    run_with(w, &o, sp, N, ref, &split, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(split.kv.shared, 0);
    /* Split pools: the first copies the prefix, the others take its copy. */
    CHECK_EQ_INT(split.tokens_in_place, (N - 1) * 96);
    /* Each keeps its 96 prefix tokens and 12 of its other 24. */
    CHECK_EQ_INT(split.tokens_kept, N * (96 + 12));
    o.n_blocks_decode = 0;
    run_with(w, &o, sp, N, res, &shared, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(shared.kv.shared, 1);
    CHECK_EQ_INT(shared.tokens_kept, split.tokens_kept);
    CHECK_EQ_INT(shared.tokens_in_place, N * 96);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]), "request %d: the shared prefix changed its output", i);
    /* At the end 12 x (12 kept + 120 generated) hold 108 decode blocks of
     * their own and the prefix's 6 once: 20 blocks preempt. One alone needs
     * its prompt's 8 blocks, 1 more at its migration and 8 as it grows. */
    o.n_blocks = 20;
    run_with(w, &o, sp, N, res, &small, DP_DUALPATH_DEFAULT);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]),
                  "request %d: preemption with a shared prefix changed its output", i);
    CHECK_MSG(small.preemptions >= 5, "%lld preemptions", (long long)small.preemptions);
    CHECK_EQ_INT(small.tokens_kept, split.tokens_kept);
    printf("system prompt kept whole: %d requests share its %d blocks on the decode path "
           "(%lld tokens by reference), outputs equal to copying it; in a %d-block arena %lld "
           "preemptions, the same outputs\n", N, 96 / 16, (long long)shared.tokens_in_place,
           o.n_blocks, (long long)small.preemptions);
}

/* A system prompt kept whole where the decode path cannot hold prefill
 * blocks (a q8_0 decode type in the one arena, whose blocks hold 60 tokens
 * here): the first request's migration copies the prefix's whole decode
 * blocks (120 of its 130 tokens) and names them (kvcache/dprefix.h); the
 * others take those blocks instead of copying the prefix again. Run one at a
 * time nobody shares (a share lives while a sequence holds it); run
 * together, 7 of 8 share, with the same outputs. */
void test_system_prompt_typed(world *w)
{
    enum { N = 8, SYS = 130, TAIL = 20 };
    static req_spec sp[N];
    static result ref[N], res[N];
    shared_prefix_specs(w, sp, N, SYS, TAIL, 60, 77);
    dp_engine_opts o;
    engine_opts_default(&o);
    o.decode_kv_type = DP_KV_Q8_0;
    o.compress.keep_ratio = 0.5f;
    o.compress.sinks = 2;
    o.compress.window = 4;
    o.n_blocks = 256;
    dp_engine_stats alone, together, parked;
    o.resume_turns = false;
    run_each_with(w, &o, sp, N, ref, &alone, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(alone.kv.shared, 1);
    CHECK_EQ_INT(alone.kv.decode_block_tokens, 60);
    CHECK_EQ_INT(alone.tokens_in_place, 0);
    /* A finished turn's parked cache holds the share (kv_mgr_park), so one
     * at a time they share too, with the same outputs. */
    o.resume_turns = true;
    run_each_with(w, &o, sp, N, res, &parked, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(parked.tokens_in_place, (N - 1) * 120);
    CHECK_EQ_INT(parked.kv.turns_resumed, 0);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]),
                  "request %d: the share a parked turn kept changed its output", i);
    defer_start = true;
    run_with(w, &o, sp, N, res, &together, DP_DUALPATH_DEFAULT);
    defer_start = false;
    CHECK_EQ_INT(together.tokens_kept, alone.tokens_kept);
    CHECK_EQ_INT(together.tokens_in_place, (N - 1) * 120);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]),
                  "request %d: the shared q8_0 prefix changed its output", i);
    printf("system prompt kept whole, q8_0 decode path: %d of %d requests take the first one's "
           "copy of its %d whole decode blocks (%lld tokens not copied; one at a time, kept by "
           "parked turns: %lld), the same outputs as each alone\n", N - 1, N, 120 / 60,
           (long long)together.tokens_in_place, (long long)parked.tokens_in_place);
}

/* A system prompt on the kivi4 decode path (tiny64 in the tests' f32 arena:
 * 112-token groups after a 16-token lead). Prompts are taken whole by
 * reference and their groups sealed as replies grow; a group whose rows all
 * lie in the prefix cache's named blocks of the shared prompt (the first,
 * tokens 16-127 of its 150) is sealed once and held by every request that
 * runs beside the first (kvcache/gshare.h). One at a time nobody shares (a
 * group lives while a table holds it); together 7 of 8 take it, and every
 * output equals its own alone. */
void test_system_prompt_kivi(world *w)
{
    enum { N = 8, SYS = 150, TAIL = 10 };
    static req_spec sp[N];
    static result ref[N], res[N];
    shared_prefix_specs(w, sp, N, SYS, TAIL, 90, 55);
    dp_engine_opts o;
    engine_opts_default(&o);
    o.decode_kv_type = DP_KV_KIVI4;
    o.n_blocks = 256;
    o.resume_turns = false;
    dp_engine_stats alone, together;
    run_each_with(w, &o, sp, N, ref, &alone, DP_DUALPATH_DEFAULT);
    CHECK_EQ_INT(alone.kv.groups_sealed, N);
    CHECK_EQ_INT(alone.kv.groups_shared, 0);
    defer_start = true;
    run_with(w, &o, sp, N, res, &together, DP_DUALPATH_DEFAULT);
    defer_start = false;
    CHECK_EQ_INT(together.kv.groups_sealed, N);
    CHECK_EQ_INT(together.kv.groups_shared, N - 1);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]),
                  "request %d: a shared kivi4 group changed its output", i);
    /* A prompt shared for 100 tokens only: the first group's rows end in
     * each request's own tokens, so nobody may take another's. */
    shared_prefix_specs(w, sp, N, 100, 60, 90, 56);
    run_each_with(w, &o, sp, N, ref, NULL, DP_DUALPATH_DEFAULT);
    dp_engine_stats apart;
    defer_start = true;
    run_with(w, &o, sp, N, res, &apart, DP_DUALPATH_DEFAULT);
    defer_start = false;
    CHECK_EQ_INT(apart.kv.groups_sealed, N);
    CHECK_EQ_INT(apart.kv.groups_shared, 0);
    for (int i = 0; i < N; i++)
        CHECK_MSG(same_tokens(&res[i], &ref[i]),
                  "request %d: a group of another's rows changed its output", i);
    printf("system prompt on the kivi4 decode path: %lld of %lld groups sealed by another "
           "request (the shared prompt's, for 7 of 8; none where the prompts part inside the "
           "group), the same outputs as each alone\n",
           (long long)together.kv.groups_shared, (long long)together.kv.groups_sealed);
}

/* A 5-turn conversation (each turn resends the whole conversation) with a
 * distractor request between turns that forces the prefill pool to reuse the
 * freed blocks: the earlier turns' blocks spill to the host tier and are
 * restored from it. Every answer must equal a full recompute's. */
void test_multiturn_rebuild(world *w, int32_t plen0)
{
    static int32_t conv[2][2048];
    static result res[2][5], dres;
    int32_t n_conv[2] = {0, 0};
    dp_engine_stats st[2];
    for (int mode = 0; mode < 2; mode++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.dualpath = true;
        o.compress.keep_ratio = 0.5f;
        o.compress.sinks = 2;
        o.compress.window = 8;
        o.prefix_cache = mode == 0;
        o.reuse_replies = false; /* exact: every reply recomputed over the whole prefix */
        o.resume_turns = false;  /* ... and every turn's prompt (test_resume_turns resumes) */
        o.host_tier_bytes = mode == 0 ? (int64_t)64 << 20 : 0;
        /* The prefill pool holds the longest turn, barely, so that the
         * distractor below must take the conversation's blocks. */
        const int32_t pool_blocks = (plen0 + 4 * 36 + 12 + 15) / 16 + 1;
        o.n_blocks = pool_blocks;
        o.n_blocks_decode = 256;
        next_opts = o;
        next_opts_set = true;
        dp_engine *e = start(w, o.n_blocks, 8);
        next_opts_set = false;
        char err[DP_ERRLEN];
        uint64_t x = 99;
        n_conv[mode] = 0;
        for (int turn = 0; turn < 5; turn++) {
            /* New user text: plen0 tokens on the first turn, 24 after. */
            conv_add_text(w, conv[mode], &n_conv[mode], turn == 0 ? plen0 : 24, &x);
            conv_turn(e, conv[mode], &n_conv[mode], 12, 0, &res[mode][turn]);
            /* A distractor with a different prompt of the same size takes the
             * prefill pool's free blocks, evicting the conversation's. */
            req_spec d = {.n_prompt = (pool_blocks - 1) * 16, .max_tokens = 2, .ignore_eos = true};
            for (int32_t i = 0; i < d.n_prompt; i++)
                d.prompt[i] = (int32_t)((i * 7919u + 13u * (unsigned)turn + 1u) % (unsigned)w->vocab);
            memset(&dres, 0, sizeof dres);
            dp_request *r = make_req(&d, &dres);
            CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
            request_unref(r);
            collect(e, 1);
        }
        check_idle(e);
        engine_get_stats(e, &st[mode]);
        engine_destroy(e);
    }
    check_same_turns(res[0], res[1], 5, "between rebuild and full recompute");
    CHECK(st[0].kv.rebuilds >= 4);
    CHECK(st[0].kv.rebuild_host_tokens > 0);
    CHECK(st[0].kv.host_spilled_blocks > 0);
    CHECK_EQ_INT(st[1].kv.rebuilds, 0);
    CHECK(st[0].prompt_tokens < st[1].prompt_tokens); /* less was recomputed */
    printf("multi-turn: 5 turns identical to full recompute; %lld rebuilds, %lld tokens from the "
           "pool, %lld from the host tier; prompt tokens computed %lld vs %lld\n",
           (long long)st[0].kv.rebuilds, (long long)st[0].kv.rebuild_prefix_tokens,
           (long long)st[0].kv.rebuild_host_tokens, (long long)st[0].prompt_tokens,
           (long long)st[1].prompt_tokens);
}

/* A reply's K/V serve the next turn: a conversation of 5 turns computes
 * fewer prompt tokens with reuse_replies than without, and at keep_ratio 1.0
 * (the compact cache is the whole cache) the turns are identical either way,
 * so the reused blocks hold exactly the reply's K/V at the right positions. */
void test_reply_reuse(world *w)
{
    static result res[2][5];
    dp_engine_stats st[2];
    for (int mode = 0; mode < 2; mode++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.compress.keep_ratio = 1.0f;
        o.compress.sinks = 2;
        o.compress.window = 16;
        o.reuse_replies = mode == 0;
        o.resume_turns = false; /* the reply through the prefix cache */
        run_conversation(w, &o, 5, 40, 16, 24, 7, res[mode], &st[mode]);
    }
    check_same_turns(res[0], res[1], 5, "with the reply reused");
    CHECK(st[0].kv.reply_blocks_kept >= 4);
    CHECK_EQ_INT(st[1].kv.reply_blocks_kept, 0);
    CHECK(st[0].prompt_tokens + 4 * 16 <= st[1].prompt_tokens);
    printf("reply reuse: 5 turns identical at keep 1.0; %lld reply blocks kept; prompt tokens "
           "computed %lld vs %lld without\n",
           (long long)st[0].kv.reply_blocks_kept, (long long)st[0].prompt_tokens,
           (long long)st[1].prompt_tokens);
}

/* A finished turn's compact cache is parked and the next turn continues it
 * (kv_mgr_park): a 5-turn conversation computes only each turn's new text
 * (and the reply's last token, never fed), not its history. At keep 1.0 in
 * the prefill path's type the compact cache is the whole cache, so every
 * turn equals a full recompute's. At keep 0.5 the resumed prompt's new
 * text is compacted at its end, its parked history kept as it was (the e2e
 * tests resume over the real model's q8_0 decode path). Parked
 * caches never cost an admission: in a small arena the oldest move to the
 * swap space, and nobody is preempted for them. */
void test_resume_turns(world *w)
{
    enum { TURNS = 5, FIRST = 40, NEW = 16, GEN = 24 };
    static result res[3][TURNS];
    dp_engine_stats st[3];
    for (int mode = 0; mode < 3; mode++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.compress.keep_ratio = mode == 2 ? 0.5f : 1.0f;
        o.compress.sinks = 2;
        o.compress.window = 16;
        o.decode_kv_type = ENGINE_DECODE_KV_SAME;
        o.resume_turns = mode != 1;
        o.reuse_replies = false; /* mode 1: every turn computed from its tokens */
        run_conversation(w, &o, TURNS, FIRST, NEW, GEN, 11, res[mode], &st[mode]);
        for (int turn = 0; turn < TURNS; turn++)
            CHECK_EQ_INT(res[mode][turn].n, GEN);
    }
    check_same_turns(res[0], res[1], TURNS, "when continued from the parked turn");
    for (int mode = 0; mode < 3; mode += 2) {
        CHECK_EQ_INT(st[mode].kv.turns_resumed, TURNS - 1);
        /* Each later turn computes its new text and the reply's last token. */
        CHECK_EQ_INT(st[mode].prompt_tokens, FIRST + (TURNS - 1) * (NEW + 1));
        CHECK_EQ_INT(st[mode].kv.turns_parked, TURNS);
        CHECK_EQ_INT(st[mode].kv.parked_turns, 1); /* each turn took the one before */
    }
    CHECK_EQ_INT(st[1].kv.turns_resumed, 0);
    CHECK(st[1].prompt_tokens > st[0].prompt_tokens);
    CHECK_EQ_INT(st[0].tokens_evicted, 0);
    /* keep 0.5: the first migration keeps half its prompt (sinks and
     * window included); each later prompt end keeps the parked history it
     * continued as it was (the last kept slots and the reply but its last
     * token) and compacts only its new text (that token and NEW more), as
     * a prompt of its own. Compacting the whole again (the rule before)
     * kept 5 x half of each prompt. */
    int64_t want = 0, keep = 0;
    for (int turn = 0; turn < TURNS; turn++) {
        dp_compress_opts co = {.scorer = DP_SCORER_SNAPKV, .keep_ratio = 0.5f, .sinks = 2,
                               .window = 16};
        if (turn == 0) {
            keep = compress_n_keep(&co, FIRST);
        } else {
            co.prefix = (int32_t)keep + GEN - 1;
            keep = compress_n_keep(&co, co.prefix + NEW + 1);
        }
        want += keep;
    }
    CHECK_EQ_INT(st[2].tokens_kept, want);
    printf("resumed turns: %d turns, %d continued from the parked turn; prompt tokens computed "
           "%lld vs %lld from the tokens; identical at keep 1.0; keep 0.5: %lld kept\n",
           TURNS, (int)st[0].kv.turns_resumed, (long long)st[0].prompt_tokens,
           (long long)st[1].prompt_tokens, (long long)st[2].tokens_kept);

    /* 12 unrelated requests one after the other in a 48-block arena: each
     * parks ~9 blocks, so later ones need the parked blocks back; the
     * oldest go to the swap space. Then the first request's conversation
     * goes on: its turn copies its cache back from there, bit for bit, and
     * answers as it does where nothing was spilled (a 1024-block arena). */
    enum { N = 12 };
    static req_spec sp[N];
    static result a[3][N], t2[3];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 120, .max_tokens = 16, .ignore_eos = true};
        for (int32_t k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = (int32_t)((k * 131u + 977u * (unsigned)i + 5u) % (unsigned)w->vocab);
    }
    dp_engine_stats ps[3];
    for (int mode = 0; mode < 3; mode++) {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.compress.keep_ratio = 0.5f;
        o.resume_turns = mode != 1;
        next_opts = o;
        next_opts_set = true;
        dp_engine *e = start(w, mode == 2 ? 1024 : 48, 8);
        next_opts_set = false;
        run_requests(e, sp, N, a[mode], true, DP_DUALPATH_DEFAULT, NULL);
        static int32_t conv[512];
        int32_t n_conv = sp[0].n_prompt;
        memcpy(conv, sp[0].prompt, (size_t)n_conv * sizeof *conv);
        for (int32_t k = 0; k < a[mode][0].n; k++)
            conv[n_conv++] = a[mode][0].toks[k];
        uint64_t x = 5;
        conv_add_text(w, conv, &n_conv, NEW, &x);
        conv_turn(e, conv, &n_conv, GEN, 0, &t2[mode]);
        check_idle(e);
        engine_get_stats(e, &ps[mode]);
        engine_destroy(e);
    }
    for (int i = 0; i < N; i++) {
        CHECK_MSG(same_tokens(&a[0][i], &a[1][i]), "request %d: parked turns changed its output", i);
        CHECK_MSG(same_tokens(&a[0][i], &a[2][i]), "request %d: spills changed its output", i);
    }
    CHECK_MSG(same_tokens(&t2[0], &t2[2]), "a turn resumed from the swap space answers otherwise");
    CHECK(ps[0].kv.parked_spills > 0);
    CHECK_EQ_INT(ps[0].kv.parked_restores, 1);
    CHECK_EQ_INT(ps[0].kv.turns_resumed, 1);
    CHECK_EQ_INT(ps[2].kv.parked_spills, 0);
    CHECK_EQ_INT(ps[2].kv.turns_resumed, 1);
    CHECK_EQ_INT(ps[1].kv.turns_resumed, 0);
    CHECK_EQ_INT(ps[0].preemptions, 0);
    CHECK_EQ_INT(ps[0].kv.swap_outs, 0); /* (spills are counted apart) */
    CHECK_EQ_INT(ps[0].kv.swap_bytes, 0);
    CHECK(ps[0].kv.parked_host_bytes > 0);
    /* compress_turns = auto: a chat turn continuing a conversation
     * (params.conversation) whose previous turn is parked runs whole on an
     * idle engine with room (its parked cache dropped), and continues the
     * parked cache when it arrives with another sequence (submitted
     * together: the other is admitted first), or alone right after a burst
     * (its first turn ran beside another conversation's, both ending in
     * the same step: the burst's next turns are on their way). */
    {
        dp_engine_opts o;
        engine_opts_default(&o);
        o.compress.keep_ratio = 0.5f;
        next_opts = o;
        next_opts_set = true;
        dp_engine *e = start(w, 256, 8);
        next_opts_set = false;
        char err[DP_ERRLEN];
        dp_engine_stats g[3];
        for (int mode = 0; mode < 3; mode++) { /* idle, busy, after a burst */
            static int32_t conv[512];
            static result r1, r2, rd, rb;
            int32_t n = 0;
            uint64_t x = 21 + (uint64_t)mode;
            conv_add_text(w, conv, &n, 60, &x);
            if (mode == 2) {
                /* A first turn and another conversation's, together. */
                static req_spec s1, sb;
                s1 = (req_spec){.n_prompt = n, .max_tokens = 12, .ignore_eos = true};
                memcpy(s1.prompt, conv, (size_t)n * sizeof *conv);
                sb = s1;
                for (int32_t k = 0; k < sb.n_prompt; k++)
                    sb.prompt[k] = (int32_t)((k * 53u + 7u) % (unsigned)w->vocab);
                memset(&r1, 0, sizeof r1);
                memset(&rb, 0, sizeof rb);
                dp_request *rq[2] = {make_req(&s1, &r1), make_req(&sb, &rb)};
                CHECK_MSG(engine_submit_all(e, rq, 2, err, sizeof err) == 0, "%s", err);
                request_unref(rq[0]);
                request_unref(rq[1]);
                collect(e, 2);
                CHECK_EQ_INT(r1.n, 12);
                for (int32_t i = 0; i < r1.n; i++)
                    conv[n++] = r1.toks[i];
            } else {
                conv_turn(e, conv, &n, 12, 0, &r1); /* a first turn: migrates and parks */
            }
            conv_add_text(w, conv, &n, 16, &x);
            static req_spec s2, sd;
            s2 = (req_spec){.n_prompt = n, .max_tokens = 12, .ignore_eos = true};
            memcpy(s2.prompt, conv, (size_t)n * sizeof *conv);
            sd = (req_spec){.n_prompt = 40, .max_tokens = 24, .ignore_eos = true};
            for (int32_t k = 0; k < sd.n_prompt; k++)
                sd.prompt[k] = (int32_t)((k * 37u + 11u) % (unsigned)w->vocab);
            memset(&r2, 0, sizeof r2);
            memset(&rd, 0, sizeof rd);
            dp_request *rq[2] = {make_req(&sd, &rd), make_req(&s2, &r2)};
            rq[1]->params.conversation = true;
            if (mode == 1)
                CHECK_MSG(engine_submit_all(e, rq, 2, err, sizeof err) == 0, "%s", err);
            else
                CHECK_MSG(engine_submit(e, rq[1], err, sizeof err) == 0, "%s", err);
            request_unref(rq[0]);
            request_unref(rq[1]);
            collect(e, mode == 1 ? 2 : 1);
            CHECK_EQ_INT(r2.n, 12);
            engine_get_stats(e, &g[mode]);
        }
        check_idle(e);
        engine_destroy(e);
        CHECK_EQ_INT(g[0].kv.turns_resumed, 0);
        CHECK_EQ_INT(g[1].kv.turns_resumed, 1);
        CHECK_EQ_INT(g[2].kv.turns_resumed, 2);
    }
    printf("parked turns in a 48-block arena: %lld moved to the swap space for room (%lld dropped), "
           "0 preemptions, outputs as without them; a later turn copied its cache back and "
           "answered as where nothing was spilled; a chat turn alone ran whole, one beside another "
           "request or right after a burst continued its parked turn\n", (long long)ps[0].kv.parked_spills,
           (long long)ps[0].kv.parked_evictions);
}
