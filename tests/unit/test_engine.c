/* test_engine.c: the engine thread end to end (no HTTP): many concurrent
 * requests give token-for-token what each gives alone (greedy and seeded
 * sampling), cancellation frees blocks within one step, stop strings and
 * max_tokens end requests with the right reason, and nothing leaks. Runs on
 * a synthetic model always and on the default model when it is present.
 * The harness is engine_world.c; the dual path's tests and the chat tests
 * are in test_engine_dualpath.c and test_engine_turns.c. */
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

static void test_cancel(world *w)
{
    dp_engine *e = start(w, 1024, 8);
    static result res;
    req_spec sp = {.n_prompt = 40, .max_tokens = 200, .temperature = 0, .ignore_eos = true};
    for (int i = 0; i < 40; i++)
        sp.prompt[i] = urand(w->vocab);
    char err[DP_ERRLEN];
    dp_request *r = NULL;
    dp_engine_stats st;
    /* Catch the request while it decodes and holds blocks: after its fifth
     * token and before its last. On a fast machine it can finish before the
     * cancellation is seen; then it runs again (the checks below apply to the
     * attempt that was caught). */
    for (;;) {
        memset(&res, 0, sizeof res);
        r = make_req(&sp, &res);
        CHECK(engine_submit(e, r, err, sizeof err) == 0);
        collect_tokens(e, &res, 5);
        if (res.done) { /* finished before it was caught: try again */
            request_unref(r);
            continue;
        }
        /* Read after the cancellation is posted: at most the step already
         * under way when it arrived runs before it is handled. */
        engine_cancel(e, r);
        engine_get_stats(e, &st);
        int64_t steps_at_cancel = st.steps;
        collect(e, 1);
        if (res.finish == DP_FINISH_LENGTH) {
            request_unref(r);
            continue;
        }
        CHECK_EQ_INT(res.finish, DP_FINISH_CANCELLED);
        settled_stats(e, &st);
        CHECK_EQ_INT(st.kv.blocks_used + st.kv.decode_blocks_used, 0);
        /* The cancellation is handled before the next step runs. */
        CHECK_MSG(st.steps <= steps_at_cancel + 1, "blocks freed after %lld steps",
                  (long long)(st.steps - steps_at_cancel));
        printf("cancel: blocks freed within %lld step(s) of the cancellation\n",
               (long long)(st.steps - steps_at_cancel));
        break;
    }
    CHECK(res.n < 200);
    request_unref(r);
    engine_destroy(e);
}

static void test_limits(world *w)
{
    dp_engine *e = start(w, 64, 8);
    char err[DP_ERRLEN];
    static result res;
    req_spec sp = {.n_prompt = 10, .max_tokens = 5, .ignore_eos = true};
    /* max_tokens -> length, with exactly that many tokens. */
    memset(&res, 0, sizeof res);
    dp_request *r = make_req(&sp, &res);
    CHECK(engine_submit(e, r, err, sizeof err) == 0);
    request_unref(r);
    collect(e, 1);
    CHECK_EQ_INT(res.finish, DP_FINISH_LENGTH);
    CHECK_EQ_INT(res.n, 5);
    /* Over the context: refused with the counts in the message. */
    sp.max_tokens = engine_context_length(e);
    r = make_req(&sp, &res);
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EINVAL);
    CHECK(strstr(err, "context") != NULL);
    request_unref(r);
    /* More blocks than the pool has: refused. */
    sp.max_tokens = 64 * 16;
    r = make_req(&sp, &res);
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EINVAL);
    request_unref(r);
    /* Out-of-vocabulary prompt token: refused. */
    sp.max_tokens = 4;
    sp.prompt[3] = w->vocab + 5;
    r = make_req(&sp, &res);
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EINVAL);
    request_unref(r);
    check_idle(e);
    engine_destroy(e);
}

static void test_stop_string(world *w)
{
    /* Generate greedily, then pick a stop string from the middle of the
     * text: the rerun must end right before it, with finish "stop". */
    dp_engine *e = start(w, 256, 8);
    char err[DP_ERRLEN];
    static result full, cut;
    memset(&full, 0, sizeof full);
    memset(&cut, 0, sizeof cut);
    req_spec sp = {.max_tokens = 40, .ignore_eos = true};
    encode(w, "Once upon a time, in a small village", &sp);
    dp_request *r = make_req(&sp, &full);
    CHECK(engine_submit(e, r, err, sizeof err) == 0);
    request_unref(r);
    collect(e, 1);
    CHECK(full.text_len > 20);
    char stop[8];
    size_t at = full.text_len / 2;
    while (at < full.text_len && ((unsigned char)full.text[at] & 0xC0) == 0x80)
        at++;
    memcpy(stop, full.text + at, 3);
    stop[3] = 0;
    sp.stop = stop;
    r = make_req(&sp, &cut);
    CHECK(engine_submit(e, r, err, sizeof err) == 0);
    request_unref(r);
    collect(e, 1);
    CHECK_EQ_INT(cut.finish, DP_FINISH_STOP);
    const char *first = strstr(full.text, stop);
    CHECK(first != NULL);
    CHECK_EQ_INT(cut.text_len, (size_t)(first - full.text));
    CHECK(memcmp(cut.text, full.text, cut.text_len) == 0);
    check_idle(e);
    engine_destroy(e);
    printf("stop string '%s': text ends right before it, finish=stop\n", stop);
}

/* A backend whose steps #fault_at .. #fault_at + fault_n - 1 fail with
 * fault_rc (at batch_set, the start of every forward pass). */
static const dp_backend_ops *real_ops;
static int fault_at, fault_n = 1, fault_rc, n_steps_seen;

static int faulty_batch_set(dp_backend *be, const dp_batch *b)
{
    const int i = n_steps_seen++;
    if (i >= fault_at && i < fault_at + fault_n)
        return fault_rc;
    return real_ops->batch_set(be, b);
}

/* Runs specs (all submitted before the engine starts, so the schedule is
 * the same every run) with step fault_at failing with rc (0: none). */
static dp_engine *run_faulty(world *w, const req_spec *specs, int n, result *res, int at, int rc)
{
    static dp_backend_ops faulty;
    if (w->be->ops != &faulty) /* the first run: the backend's own */
        real_ops = w->be->ops;
    faulty = *real_ops;
    faulty.batch_set = faulty_batch_set;
    fault_at = rc ? at : -1;
    fault_rc = rc;
    n_steps_seen = 0;
    w->be->ops = &faulty;
    dp_engine_opts o;
    engine_opts_default(&o);
    o.dualpath = false;
    o.max_batched_tokens = 128;
    o.max_seqs = 2;
    o.n_blocks = 256;
    dp_engine *e;
    char err[DP_ERRLEN];
    CHECK_MSG(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == 0, "%s", err);
    memset(res, 0, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++) {
        dp_request *r = make_req(&specs[i], &res[i]);
        CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
        request_unref(r);
    }
    CHECK(engine_start(e) == 0);
    collect(e, n);
    return e;
}

/* A failed step fails its own sequences and nothing else: with two
 * running at a time, the second step (both decoding) fails; the two
 * waiting requests then run as in a clean run. A lost device (DP_EDEVICE)
 * fails everything, and every later request at submit. */
static void test_step_failure(world *w)
{
    enum { N = 4 };
    static req_spec sp[N];
    static result ref[N], res[N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 8 + i, .max_tokens = 6, .ignore_eos = true};
        for (int k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = (int32_t)((i * 31 + k * 7) % w->vocab);
    }
    dp_engine *e = run_faulty(w, sp, N, ref, 0, 0);
    engine_destroy(e);
    e = run_faulty(w, sp, N, res, 1, DP_EIO);
    dp_engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.failed_steps, 1);
    CHECK(!engine_device_lost(e));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(ref[i].finish, DP_FINISH_LENGTH);
        if (i < 2) {
            CHECK_MSG(res[i].finish == DP_FINISH_ERROR, "request %d: finish %d", i, res[i].finish);
        } else {
            CHECK_MSG(res[i].finish == DP_FINISH_LENGTH && same_tokens(&res[i], &ref[i]),
                      "request %d: changed by another's failed step", i);
        }
    }
    engine_destroy(e);
    e = run_faulty(w, sp, N, res, 1, DP_EDEVICE);
    CHECK(engine_device_lost(e));
    for (int i = 0; i < N; i++)
        CHECK_MSG(res[i].finish == DP_FINISH_ERROR, "request %d: finish %d", i, res[i].finish);
    result late;
    dp_request *r = make_req(&sp[0], &late);
    char err[DP_ERRLEN];
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EDEVICE);
    CHECK(strstr(err, "device is lost") != NULL);
    request_unref(r);
    engine_destroy(e);
    w->be->ops = real_ops;
    printf("step failure: a failed step failed its 2 sequences, the 2 waiting ran as in a clean "
           "run; a lost device failed all %d and refuses new requests\n", N);
}

/* Errors the backend survives, step after step: DP_ENGINE_FAIL_STREAK - 1
 * failed steps in a row fail their sequences and the rest run; one more
 * and the device counts as lost (the daemon then exits to be restarted). */
static void test_failure_streak(world *w)
{
    enum { N = 2 * DP_ENGINE_FAIL_STREAK + 4 };
    static req_spec sp[N];
    static result res[N];
    for (int i = 0; i < N; i++) {
        sp[i] = (req_spec){.n_prompt = 6 + i % 5, .max_tokens = 4, .ignore_eos = true};
        for (int k = 0; k < sp[i].n_prompt; k++)
            sp[i].prompt[k] = (int32_t)((i * 17 + k * 5) % w->vocab);
    }
    for (int lose = 0; lose < 2; lose++) {
        fault_n = DP_ENGINE_FAIL_STREAK - 1 + lose;
        dp_engine *e = run_faulty(w, sp, N, res, 0, DP_EIO);
        dp_engine_stats st;
        engine_get_stats(e, &st);
        CHECK_EQ_INT(st.failed_steps, fault_n);
        CHECK(engine_device_lost(e) == (lose == 1));
        int failed = 0, done = 0;
        for (int i = 0; i < N; i++) {
            failed += res[i].finish == DP_FINISH_ERROR;
            done += res[i].finish == DP_FINISH_LENGTH;
        }
        /* max_seqs 2: each failed step failed the two it ran. */
        if (lose)
            CHECK_MSG(failed == N, "lost: %d of %d failed", failed, N);
        else
            CHECK_MSG(failed == 2 * fault_n && done == N - failed, "%d failed, %d done", failed, done);
        printf("failure streak: %d failed steps in a row: %d requests failed, %d done, device %s\n",
               fault_n, failed, done, engine_device_lost(e) ? "lost" : "kept");
        engine_destroy(e);
    }
    fault_n = 1;
    w->be->ops = real_ops;
}

/* Admission never costs concurrency: 8 requests whose max_tokens is the rest
 * of the context (what a chat request without max_tokens gets) all run at
 * once with dualpath on, in the same KV memory as dualpath off (a quarter of
 * the blocks for prefill, the rest for decode, as the daemon splits it).
 * Promising max_tokens in the decode pool at admission ran them 4 at a time
 * here (1 at a time in the daemon's default configuration). */
static void test_admission(world *w)
{
    enum { N = 8, PROMPT = 20 };
    const int32_t ctx = llama_hparams(w->m)->n_ctx_train;
    static req_spec specs[N];
    static result res[N];
    for (int i = 0; i < N; i++) {
        specs[i] = (req_spec){.n_prompt = PROMPT, .max_tokens = ctx - PROMPT, .ignore_eos = true};
        for (int k = 0; k < PROMPT; k++)
            specs[i].prompt[k] = urand(w->vocab);
    }
    const int32_t total = N * ctx / 16; /* blocks of 16 tokens: every sequence whole */
    dp_engine_opts o;
    engine_opts_default(&o);
    dp_engine_stats st[3];
    exact_kv = false; /* counts only: the default f16 cache */
    /* Off; on with the default one arena; on with a quarter split off for prompts. */
    for (int c = 0; c < 3; c++) {
        o.dualpath = c > 0;
        o.n_blocks = c == 2 ? total / 4 : total;
        o.n_blocks_decode = c == 2 ? total - total / 4 : 0;
        run_with(w, &o, specs, N, res, &st[c], DP_DUALPATH_DEFAULT);
        for (int i = 0; i < N; i++)
            CHECK_EQ_INT(res[i].n, ctx - PROMPT);
        CHECK_EQ_INT(st[c].kv.shared, c == 1);
    }
    exact_kv = true;
    CHECK_EQ_INT(st[0].running_peak, N);
    for (int c = 1; c < 3; c++) {
        CHECK_MSG(st[c].running_peak >= st[0].running_peak,
                  "dualpath on ran %d at once, off %d, in the same memory", st[c].running_peak,
                  st[0].running_peak);
        CHECK(st[c].migrations >= N);
    }
    printf("admission: %d requests of max_tokens = rest of context: %d at once with dualpath off, "
           "%d on (one arena, %lld preemptions), %d on (split pools, %lld preemptions)\n",
           N, st[0].running_peak, st[1].running_peak, (long long)st[1].preemptions,
           st[2].running_peak, (long long)st[2].preemptions);
}

/* Prompt logprobs (echo + logprobs, vLLM's prompt_logprobs): every prompt
 * position but the first is reported once, in order, before any generated
 * token, also when the scheduler cuts the prompt into chunks to fit the
 * step's scoring rows, when preemption recomputes it, and when the prompt is
 * in the prefix cache (a scored prompt is computed whole). Each figure is
 * the one the same logits row gives a generated token: the last prompt
 * position, scored, equals the logprob of that token generated after the
 * rest (logit_bias forces it; logprobs are reported from the raw row). The
 * forward pass is not batch-invariant (module comment above start()), so
 * figures from other batch compositions agree to 1e-3, not bit for bit. */
static void test_prompt_logprobs(world *w)
{
    enum { N = 12 };
    static req_spec specs[N + 1];
    static result alone[N + 1], together[N + 1];
    char err[DP_ERRLEN];
    for (int i = 0; i < N; i++) {
        /* Even: scored (max_tokens 0, or a few tokens after); odd: plain,
         * with replies long enough to make the small pool below preempt. */
        int32_t mt = i % 4 == 0 ? 0 : i % 2 == 0 ? 1 + urand(30) : 60 + urand(60);
        specs[i] = (req_spec){.n_prompt = 40 + urand(80), .max_tokens = mt, .ignore_eos = true,
                              .prompt_logprobs = i % 2 == 0};
        for (int k = 0; k < specs[i].n_prompt; k++)
            specs[i].prompt[k] = urand(w->vocab);
    }
    /* max_seqs 8 leaves the model's 32 output rows 24 scoring rows a step:
     * a prompt of up to 120 tokens is cut into chunks for them. */
    dp_engine *e = start(w, 1024, 8);
    run_requests(e, specs, N, alone, true, DP_DUALPATH_DEFAULT, NULL);
    for (int i = 0; i < N; i++) {
        const result *r = &alone[i];
        CHECK_EQ_INT(r->n, specs[i].max_tokens);
        if (!specs[i].prompt_logprobs) {
            CHECK_EQ_INT(r->n_p, 0);
            continue;
        }
        CHECK_EQ_INT(r->n_p, specs[i].n_prompt - 1);
        for (int k = 0; k < r->n_p; k++) {
            CHECK_EQ_INT(r->p_pos[k], k + 1);
            CHECK(r->p_lp[k] <= 0.0f && isfinite(r->p_lp[k]));
            CHECK(r->p_rank[k] >= 1);
            /* Rank 1 exactly when the token is the top alternative. */
            CHECK((r->p_rank[k] == 1) == (r->p_top[k] == specs[i].prompt[k + 1]));
        }
        if (specs[i].max_tokens == 0)
            CHECK_EQ_INT(r->finish, DP_FINISH_LENGTH);
    }
    /* The same prompt again: its blocks are in the prefix cache, yet every
     * position is scored. */
    specs[N] = specs[0];
    run_requests(e, &specs[N], 1, &alone[N], true, DP_DUALPATH_DEFAULT, NULL);
    CHECK_EQ_INT(alone[N].n_p, alone[0].n_p);
    CHECK(memcmp(alone[N].p_lp, alone[0].p_lp, (size_t)alone[0].n_p * sizeof(float)) == 0);
    /* The last prompt position, generated: the prompt less its last token,
     * the last token forced. */
    req_spec g = specs[0];
    g.n_prompt--;
    g.max_tokens = 1;
    g.logprobs = true;
    g.prompt_logprobs = false;
    g.bias_token = specs[0].prompt[g.n_prompt];
    g.bias = 100.0f;
    result gr;
    run_requests(e, &g, 1, &gr, true, DP_DUALPATH_DEFAULT, NULL);
    CHECK_EQ_INT(gr.toks[0], g.bias_token);
    const float last = alone[0].p_lp[alone[0].n_p - 1];
    CHECK_MSG(fabsf(gr.logprob[0] - last) < 1e-3f, "scored %.6f, generated %.6f", last,
              gr.logprob[0]);
    engine_destroy(e);

    /* Together in a small pool: preemption recomputes scored prompts. */
    e = start(w, 24, 8);
    dp_engine_stats st;
    run_requests(e, specs, N, together, false, DP_DUALPATH_DEFAULT, &st);
    engine_destroy(e);
    float worst = 0.0f;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(together[i].n_p, alone[i].n_p);
        for (int k = 0; k < alone[i].n_p; k++) {
            CHECK_EQ_INT(together[i].p_pos[k], k + 1);
            float d = fabsf(together[i].p_lp[k] - alone[i].p_lp[k]);
            worst = d > worst ? d : worst;
        }
    }
    CHECK_MSG(worst < 1e-3f, "prompt logprobs differ by %g together", worst);
    CHECK(st.preemptions > 0);
    /* No scoring rows (a model with one output row per sequence): refused. */
    e = start(w, 1024, 32);
    dp_request *r = make_req(&specs[0], &alone[0]);
    CHECK(engine_submit(e, r, err, sizeof err) == DP_EINVAL);
    request_unref(r);
    engine_destroy(e);
    printf("prompt logprobs: %d scored prompts reported whole alone, from the prefix cache and "
           "together (%lld preemptions; worst difference %.2g); last position = generated "
           "(%.6f vs %.6f)\n", N / 2, (long long)st.preemptions, (double)worst, (double)last,
           (double)gr.logprob[0]);
}

/* Constrained decoding in the engine: sampled text (random weights, so
 * anything the masks let through) is always a sentence of its grammar and
 * ends where the grammar does; unconstrained requests in the same batches
 * give what they give alone. */
static void test_constrained(world *w)
{
    enum { N = 15 };
    static req_spec specs[N];
    static result alone[N], together[N];
    /* The last allows nearly any short text: most tokens sampled from the
     * unmasked row pass it (no mask computed); the others reject most. */
    static const char *const gram[4] = {
        "root ::= (\"yes\" | \"no\" | \"maybe so\") \".\"",
        ("root ::= \"{\" pair (\", \" pair){0,3} \"}\"\n"
         "pair ::= \"\\\"\" [a-z]{1,8} \"\\\": \" ([0-9]{1,4} | \"true\" | \"null\")"),
        "root ::= [A-Z] [a-z ]{0,30} [.!?]",
        "root ::= [^\\x00]{1,24}",
    };
    for (int i = 0; i < N; i++) {
        specs[i] = (req_spec){.n_prompt = 5 + urand(30), .max_tokens = 200, .temperature = 0.9f,
                              .top_p = 1.0f, .seed = 40 + (uint64_t)i,
                              .gbnf = i % 5 == 4 ? NULL : gram[i % 5]};
        if (!specs[i].gbnf)
            specs[i].temperature = 0.0f;
        for (int k = 0; k < specs[i].n_prompt; k++)
            specs[i].prompt[k] = urand(w->vocab);
    }
    dp_engine *e = start(w, 1024, 16);
    run_requests(e, specs, N, alone, true, DP_DUALPATH_DEFAULT, NULL);
    run_requests(e, specs, N, together, false, DP_DUALPATH_DEFAULT, NULL);
    dp_engine_stats st;
    engine_get_stats(e, &st);
    engine_destroy(e);
    int sentences = 0;
    for (int i = 0; i < N; i++) {
        if (!specs[i].gbnf) {
            CHECK_EQ_INT(together[i].n, alone[i].n);
            CHECK(memcmp(together[i].toks, alone[i].toks, (size_t)alone[i].n * sizeof(int32_t)) == 0);
            continue;
        }
        dp_grammar *g;
        char err[DP_ERRLEN];
        CHECK(grammar_compile(&g, specs[i].gbnf, strlen(specs[i].gbnf), err, sizeof err) == 0);
        for (int r = 0; r < 2; r++) {
            const result *x = r ? &together[i] : &alone[i];
            CHECK_EQ_INT(x->finish, DP_FINISH_STOP);
            CHECK_MSG(grammar_matches(g, x->text, x->text_len), "request %d: '%.*s' is not a "
                      "sentence of %s", i, (int)x->text_len, x->text, specs[i].gbnf);
            sentences++;
        }
        /* Seeded: the same tokens together as alone. */
        CHECK(together[i].text_len == alone[i].text_len &&
              memcmp(together[i].text, alone[i].text, alone[i].text_len) == 0);
        grammar_unref(g);
    }
    /* Most steps take the token sampled from the unmasked row (the grammar
     * allowed it); a rejected draw computes the mask. */
    CHECK_MSG(st.grammar_masks_computed > 0 && st.grammar_seconds > 0.0 && st.grammar_masks_skipped > 0,
              "computed %lld skipped %lld seconds %g", (long long)st.grammar_masks_computed,
              (long long)st.grammar_masks_skipped, st.grammar_seconds);
    printf("constrained: %d outputs, every one a sentence of its grammar, the same alone and "
           "batched; %lld masks computed, %lld cached, %lld skipped (the sampled token allowed)\n",
           sentences, (long long)st.grammar_masks_computed, (long long)st.grammar_masks_cached,
           (long long)st.grammar_masks_skipped);
}

/* Device sampling on and off: the same seeded requests, with every kind of
 * sampling setting at once in one batch, give the same tokens, whether a row
 * was decided by the backend's candidates, fell back to its downloaded row,
 * or (logit_bias, penalties, logprobs) used the row alone. */
static void test_device_sampling(world *w, const req_spec *base, int n_base, const char *what)
{
    enum { N = 12 };
    static req_spec sp[N];
    static result off[N], on[N];
    for (int i = 0; i < N; i++) {
        sp[i] = base[i % n_base];
        sp[i].max_tokens = 24 + 2 * i;
        sp[i].ignore_eos = i != 7;
        sp[i].top_p = 1.0f;
        sp[i].seed = 900 + (uint64_t)i;
    }
    sp[0].temperature = 0.0f;                       /* greedy */
    sp[1].temperature = 0.8f, sp[1].top_p = 0.9f;
    sp[2].temperature = 1.0f;                       /* temperature alone */
    sp[3].temperature = 1.0f, sp[3].top_k = 40;
    sp[4].temperature = 0.9f, sp[4].min_p = 0.05f;
    sp[5].temperature = 0.8f, sp[5].top_p = 0.9f, sp[5].bias_token = 17, sp[5].bias = 4.0f;
    sp[6].temperature = 0.7f, sp[6].logprobs = true;
    sp[7].temperature = 1.5f, sp[7].top_p = 0.95f; /* may stop at an end token */
    sp[8].temperature = 1.2f, sp[8].top_k = 100, sp[8].top_p = 0.95f, sp[8].min_p = 0.02f;
    sp[9].temperature = 0.0f, sp[9].presence_penalty = 0.5f;
    sp[10].temperature = 2.0f;                      /* flat: draws past the candidates */
    sp[11].temperature = 1.0f, sp[11].top_p = 0.99f;
    dp_engine_opts o;
    engine_opts_default(&o);
    o.dualpath = false;
    o.n_blocks = 1024;
    dp_engine_stats st_off, st_on;
    o.device_sampling = false;
    run_with(w, &o, sp, N, off, &st_off, DP_DUALPATH_DEFAULT);
    o.device_sampling = true;
    run_with(w, &o, sp, N, on, &st_on, DP_DUALPATH_DEFAULT);
    int total = 0;
    for (int i = 0; i < N; i++) {
        CHECK(off[i].finish == DP_FINISH_STOP || off[i].finish == DP_FINISH_LENGTH);
        CHECK_MSG(on[i].n == off[i].n &&
                      memcmp(on[i].toks, off[i].toks, (size_t)off[i].n * sizeof(int32_t)) == 0,
                  "%s: request %d differs with device sampling", what, i);
        CHECK(on[i].text_len == off[i].text_len &&
              memcmp(on[i].text, off[i].text, off[i].text_len) == 0);
        CHECK_EQ_INT(on[i].finish, off[i].finish);
        total += off[i].n;
    }
    CHECK_EQ_INT(st_off.sampled_candidates + st_off.sampled_fallback, 0);
    CHECK_EQ_INT(st_off.sampled_full_row, total);
    CHECK_EQ_INT(st_on.sampled_candidates + st_on.sampled_fallback + st_on.sampled_full_row, total);
    CHECK(st_on.sampled_candidates > 0);
    CHECK(st_on.sampled_full_row >= on[5].n + on[6].n + on[9].n);
    printf("%s: device sampling on = off for %d requests, %d tokens (%lld from candidates, %lld "
           "fell back to the row, %lld full row)\n",
           what, N, total, (long long)st_on.sampled_candidates, (long long)st_on.sampled_fallback,
           (long long)st_on.sampled_full_row);
}

int main(void)
{
    world w;
    static req_spec specs[MAXN];

    /* Synthetic model: quick, always runs. */
    world_open(&w, NULL);
    for (int i = 0; i < 16; i++) {
        specs[i] = (req_spec){.n_prompt = 1 + urand(100), .max_tokens = 1 + urand(40),
                              .ignore_eos = true};
        for (int k = 0; k < specs[i].n_prompt; k++)
            specs[i].prompt[k] = urand(w.vocab);
    }
    concurrent_equals_alone(&w, specs, 16, 1024, "tiny greedy");
    concurrent_equals_alone(&w, specs, 16, 40, "tiny greedy, 40-block pool (preemption)");
    for (int i = 0; i < 8; i++) {
        specs[i].temperature = 0.8f;
        specs[i].top_p = 0.9f;
        specs[i].seed = 1000 + (uint64_t)i;
    }
    concurrent_equals_alone(&w, specs, 8, 1024, "tiny sampled");
    test_cancel(&w);
    test_limits(&w);
    test_step_failure(&w);
    test_failure_streak(&w);
    test_prompt_logprobs(&w);
    test_constrained(&w);
    test_device_sampling(&w, specs, 16, "tiny");
    for (int i = 0; i < 16; i++)
        specs[i].temperature = 0;
    test_dualpath(&w, specs, 16, "tiny dualpath");
    test_admission(&w);
    {
        static req_spec pre[16];
        for (int i = 0; i < 16; i++) {
            pre[i] = (req_spec){.n_prompt = 20 + urand(40), .max_tokens = 60, .ignore_eos = true};
            for (int k = 0; k < pre[i].n_prompt; k++)
                pre[i].prompt[k] = urand(w.vocab);
        }
        test_dualpath_preemption(&w, pre, 16, 12, false, -1, 0, "tiny dualpath preemption");
        test_swap_space(&w, pre, 16, 12);
        for (int i = 0; i < 16; i++)
            pre[i].max_tokens = 120; /* more growth after the prompts: more pressure */
        test_dualpath_preemption(&w, pre, 16, 32, true, -1, 0, "tiny dualpath preemption (shared)");
        test_dualpath_preemption(&w, pre, 16, 20, true, -1, 96,
                                 "tiny dualpath preemption (shared, decode budget 96)");
    }
    test_snapkv_every_time(&w);
    test_shared_prompt(&w);
    test_system_prompt(&w);
    test_multiturn_rebuild(&w, 64);
    test_reply_reuse(&w);
    test_resume_turns(&w);
    test_exempt_layers(&w);
    world_close(&w);

    /* Heads of 32 values: the quantized decode path. */
    world_open_shape(&w, NULL, "tiny32");
    {
        static req_spec pre[16];
        for (int i = 0; i < 16; i++) {
            /* Short prompts, long replies: the pressure is on growth, where
             * a decode block holds 60 (q8_0) or 113 (q4_0) tokens. */
            pre[i] = (req_spec){.n_prompt = 8 + urand(12), .max_tokens = 200, .ignore_eos = true};
            for (int k = 0; k < pre[i].n_prompt; k++)
                pre[i].prompt[k] = urand(w.vocab);
        }
        test_dualpath_preemption(&w, pre, 16, 16, true, DP_KV_Q8_0, 0,
                                 "tiny32 q8_0 decode path preemption (shared)");
        test_dualpath_preemption(&w, pre, 16, 14, true, DP_KV_Q8_0, 150,
                                 "tiny32 q8_0 decode path preemption (shared, decode budget 150)");
        test_dualpath_preemption(&w, pre, 16, 24, false, DP_KV_Q4_0, 0,
                                 "tiny32 q4_0 decode pool preemption (split)");
    }
    test_quantized_decode(&w);
    {
        static req_spec q[12];
        for (int i = 0; i < 12; i++) {
            /* Short prompts, long replies: growth runs out of blocks. */
            q[i] = (req_spec){.n_prompt = 8 + urand(12), .max_tokens = 80 + urand(40),
                              .ignore_eos = true};
            for (int k = 0; k < q[i].n_prompt; k++)
                q[i].prompt[k] = urand(w.vocab);
        }
        test_quantized_whole_cache(&w, q, 12);
    }
    test_decode_types(&w);
    test_decode_type_exact(&w);
    test_system_prompt_typed(&w);
    test_early_admission(&w);
    world_close(&w);

    /* A head of 64 values: kivi4, whose groups (56 tokens here) are sealed
     * from the residual as prompts migrate and replies grow; whole prompts
     * (keep 1) are taken by reference, halved ones copied first. */
    world_open_shape(&w, NULL, "tiny64");
    {
        static req_spec g[12];
        for (int i = 0; i < 12; i++) {
            g[i] = (req_spec){.n_prompt = 40 + urand(60), .max_tokens = 150, .ignore_eos = true};
            for (int k = 0; k < g[i].n_prompt; k++)
                g[i].prompt[k] = urand(w.vocab);
        }
        for (int k = 0; k < 2; k++) {
            /* (Halved prompts leave room: fewer preemptions.) */
            preempt_keep = k ? 0.5f : 1.0f;
            preempt_min = k ? 2 : 5;
            test_dualpath_preemption(&w, g, 12, k ? 30 : 34, true, DP_KV_KIVI4, 0,
                                     k ? "tiny64 kivi4 decode path preemption (keep 0.5)"
                                       : "tiny64 kivi4 decode path preemption (keep 1)");
        }
        preempt_keep = 0.5f;
        preempt_min = 5;
    }
    test_system_prompt_kivi(&w);
    world_close(&w);

    const char *real = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(real, R_OK) != 0 || getenv("DP_TEST_SYNTHETIC_ONLY")) {
        printf("note: %s absent or DP_TEST_SYNTHETIC_ONLY set, real-model checks skipped\n", real);
        T_DONE("engine");
    }
    world_open(&w, real);
    static const char *texts[] = {
        "The capital of France is", "def fibonacci(n):", "Once upon a time",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "The three primary colors are", "In 1969, astronauts", "import numpy as np\n",
        "The quick brown fox", "Water boils at", "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n",
        "My favourite book is", "The sun is a", "SELECT * FROM", "Dear Sir or Madam,",
        "The mitochondria is", "1, 2, 3, 4,",
    };
    for (int i = 0; i < 16; i++) {
        memset(&specs[i], 0, sizeof specs[i]);
        encode(&w, texts[i], &specs[i]);
        specs[i].max_tokens = 4 + 3 * i;
        specs[i].temperature = 0;
    }
    concurrent_equals_alone(&w, specs, 16, 1024, "SmolLM2 greedy");
    for (int i = 0; i < 8; i++) {
        specs[i].temperature = 0.8f;
        specs[i].top_p = 0.9f;
        specs[i].seed = 7 + (uint64_t)i;
        specs[i].max_tokens = 24;
    }
    concurrent_equals_alone(&w, specs, 8, 1024, "SmolLM2 sampled (T=0.8, top_p=0.9)");
    test_stop_string(&w);
    test_cancel(&w);
    test_device_sampling(&w, specs, 16, "SmolLM2");
    for (int i = 0; i < 8; i++) {
        specs[i].temperature = 0;
        specs[i].max_tokens = 16;
    }
    test_dualpath(&w, specs, 8, "SmolLM2 dualpath");
    test_early_switch(&w);
    test_multiturn_rebuild(&w, 200);
    world_close(&w);
    T_DONE("engine");
}
