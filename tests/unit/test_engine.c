/* test_engine.c: the engine thread end to end (no HTTP): many concurrent
 * requests give token-for-token what each gives alone (greedy and seeded
 * sampling), cancellation frees blocks within one step, stop strings and
 * max_tokens end requests with the right reason, and nothing leaks. Runs on
 * a synthetic model always and on the default model when it is present. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "engine/engine.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "t.h"
#include "tools/synth_gguf.h"

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

/* path: a GGUF file; NULL: the synthetic preset `shape` (tests/unit: tiny). */
static void world_open_shape(world *w, const char *path, const char *shape)
{
    char err[DP_ERRLEN];
    memset(w, 0, sizeof *w);
    if (path) {
        CHECK_MSG(gguf_open(&w->g, path, err, sizeof err) == 0, "%s", err);
    } else {
        dp_synth_shape sh;
        CHECK(synth_shape_preset(shape, &sh) == 0);
        gguf_writer gw;
        size_t size;
        CHECK(gguf_writer_init(&gw) == 0);
        CHECK(synth_llama_build(&gw, &sh, 3, DP_TYPE_Q8_0, err, sizeof err) == 0);
        CHECK(gguf_writer_finish_mem(&gw, &w->buf, &size) == 0);
        gguf_writer_destroy(&gw);
        CHECK_MSG(gguf_open_mem(&w->g, w->buf, size, err, sizeof err) == 0, "%s", err);
    }
    CHECK(backend_create(&w->be, "cpu", 2, err, sizeof err) == 0);
    CHECK_MSG(llama_init(&w->m, &w->g, w->be, 128, 32, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(tokenizer_init_gguf(&w->tok, &w->g, err, sizeof err) == 0, "%s", err);
    w->vocab = llama_hparams(w->m)->vocab;
}

static void world_open(world *w, const char *path) { world_open_shape(w, path, "tiny"); }

static void world_close(world *w)
{
    tokenizer_destroy(w->tok);
    llama_destroy(w->m);
    backend_destroy(w->be);
    gguf_close(&w->g);
    free(w->buf);
}

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

static dp_request *make_req(const req_spec *sp, result *res)
{
    int32_t *p = malloc((size_t)sp->n_prompt * sizeof *p);
    memcpy(p, sp->prompt, (size_t)sp->n_prompt * sizeof *p);
    dp_request_params prm;
    memset(&prm, 0, sizeof prm);
    prm.max_tokens = sp->max_tokens;
    sampling_default(&prm.sampling);
    prm.sampling.temperature = sp->temperature;
    prm.sampling.top_p = sp->top_p;
    prm.sampling.seed = sp->seed;
    prm.logprobs = sp->logprobs ? 3 : -1;
    prm.prompt_logprobs = sp->prompt_logprobs;
    prm.prompt_top = sp->prompt_logprobs ? 3 : 0;
    prm.ignore_eos = sp->ignore_eos;
    prm.keep_prefix = sp->keep_prefix;
    prm.exempt = sp->exempt;
    prm.kv_type = sp->kv_type;
    prm.sampling.top_k = sp->top_k;
    prm.sampling.min_p = sp->min_p;
    prm.sampling.presence_penalty = sp->presence_penalty;
    if (sp->bias != 0.0f) {
        prm.logit_bias = malloc(sizeof *prm.logit_bias);
        prm.logit_bias[0] = (dp_logit_bias){sp->bias_token, sp->bias};
        prm.n_logit_bias = 1;
    }
    if (sp->stop) {
        prm.stops[0] = strdup(sp->stop);
        prm.n_stops = 1;
    }
    if (sp->gbnf) {
        char err[DP_ERRLEN];
        CHECK_MSG(grammar_compile(&prm.grammar, sp->gbnf, strlen(sp->gbnf), err, sizeof err) == 0,
                  "%s", err);
    }
    dp_request *r = request_new(p, sp->n_prompt, &prm);
    r->user = res;
    return r;
}

/* The engine calls this after each iteration that queued events, once its
 * gauges are updated: tests wait on it instead of polling, so no verdict
 * depends on how fast the machine is. */
static pthread_mutex_t notify_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t notify_cv = PTHREAD_COND_INITIALIZER;
static uint64_t n_notify;

static void on_notify(void *ud)
{
    (void)ud;
    pthread_mutex_lock(&notify_mu);
    n_notify++;
    pthread_cond_broadcast(&notify_cv);
    pthread_mutex_unlock(&notify_mu);
}

static uint64_t notify_count(void)
{
    pthread_mutex_lock(&notify_mu);
    uint64_t n = n_notify;
    pthread_mutex_unlock(&notify_mu);
    return n;
}

/* Blocks until a notification after `seen`. */
static void wait_notify(uint64_t seen)
{
    pthread_mutex_lock(&notify_mu);
    while (n_notify <= seen)
        pthread_cond_wait(&notify_cv, &notify_mu);
    pthread_mutex_unlock(&notify_mu);
}

/* Events are taken after reading the count, so an event queued later is
 * always followed by a notification past it. */
static uint64_t last_take;

/* Appends one batch of events to the results; returns how many finished. */
static int absorb(dp_event *ev)
{
    int finished = 0;
    for (dp_event *x = ev; x; x = x->next) {
        result *r = x->req->user;
        CHECK(!r->done);
        CHECK(r->text_len + x->text_len < sizeof r->text);
        memcpy(r->text + r->text_len, x->text, x->text_len);
        r->text_len += x->text_len;
        if (x->kind == DP_EV_PROMPT_TOKEN) {
            CHECK(r->n == 0 && r->n_p < 512); /* before any generated token */
            r->p_pos[r->n_p] = x->pos;
            r->p_lp[r->n_p] = x->logprob;
            r->p_rank[r->n_p] = x->rank;
            r->p_top[r->n_p++] = x->n_top > 0 ? x->top[0].token : -1;
        } else if (x->kind == DP_EV_TOKEN) {
            CHECK(r->n < MAXTOK);
            r->logprob[r->n] = x->logprob;
            r->toks[r->n++] = x->token;
        } else {
            r->finish = x->finish;
            r->completion_tokens = x->completion_tokens;
            r->kv_bytes = x->usage.kv_bytes;
            r->done = true;
            finished++;
        }
    }
    event_free_list(ev);
    return finished;
}

/* Drains events into results until `want` requests have finished. */
static void collect(dp_engine *e, int want)
{
    int finished = 0;
    while (finished < want) {
        last_take = notify_count();
        dp_event *ev = engine_take_events(e);
        if (!ev) {
            wait_notify(last_take);
            continue;
        }
        finished += absorb(ev);
    }
}

/* Drains events until res has at least n tokens or has finished. */
static void collect_tokens(dp_engine *e, result *res, int32_t n)
{
    while (res->n < n && !res->done) {
        last_take = notify_count();
        dp_event *ev = engine_take_events(e);
        if (!ev) {
            wait_notify(last_take);
            continue;
        }
        absorb(ev);
    }
}

/* Stats once the engine has caught up with the events taken so far: the
 * notification that follows the last of them comes after its gauges. */
static void settled_stats(dp_engine *e, dp_engine_stats *st)
{
    engine_get_stats(e, st);
    if (st->running == 0 && st->waiting == 0 && st->kv.blocks_used == 0 && st->kv.decode_blocks_used == 0)
        return;
    wait_notify(last_take);
    engine_get_stats(e, st);
}

/* Engine options of the next start() (dualpath off unless a test sets it). */
static dp_engine_opts next_opts;
static bool next_opts_set;
/* Most checks compare outputs across batch compositions (together vs alone,
 * device sampling on vs off with other step groupings), which holds bit for
 * bit only where the forward pass is batch-invariant. The matmul is not
 * (fused dot products for a few rows, sgemm for more: other summation
 * orders), and an f16 cache turns a last-bit difference in K into a whole f16
 * step now and then, which can flip a token. So start() keeps the exact f32
 * cache; the checks that compare no outputs across batches (admission,
 * SnapKV capture) run on the default f16. */
static bool exact_kv = true;

/* With defer_start the next start() leaves the engine stopped until
 * run_requests has submitted everything: the first step then sees every
 * request, and the schedule (hence the preemption count) is the same on any
 * machine at any speed. */
static bool defer_start;
static dp_engine *pending_start;

static dp_engine *start(world *w, int32_t n_blocks, int32_t max_seqs)
{
    dp_engine_opts o;
    if (next_opts_set) {
        o = next_opts;
    } else {
        engine_opts_default(&o);
        o.dualpath = false;
    }
    o.max_batched_tokens = 128;
    o.max_seqs = max_seqs;
    o.n_blocks = n_blocks;
    if (exact_kv)
        o.kv_type = DP_KV_F32;
    dp_engine *e;
    char err[DP_ERRLEN];
    CHECK_MSG(engine_init(&e, w->m, w->tok, &o, on_notify, NULL, err, sizeof err) == 0, "%s", err);
    if (defer_start)
        pending_start = e; /* run_requests starts it once every request is in */
    else
        CHECK(engine_start(e) == 0);
    return e;
}

static void check_idle(dp_engine *e)
{
    dp_engine_stats st;
    settled_stats(e, &st);
    CHECK_EQ_INT(st.kv.blocks_used, 0);
    CHECK_EQ_INT(st.kv.decode_blocks_used, 0);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
}

/* Runs specs[0..n) on e into res: each alone (submitted once the previous
 * finished) or all together; mode is each request's dualpath setting. The
 * engine is then idle; *st (if given) holds its stats. */
static void run_requests(dp_engine *e, const req_spec *specs, int n, result *res, bool alone,
                         int8_t mode, dp_engine_stats *st)
{
    char err[DP_ERRLEN];
    memset(res, 0, (size_t)n * sizeof *res);
    for (int i = 0; i < n; i++) {
        dp_request *r = make_req(&specs[i], &res[i]);
        r->params.dualpath_mode = mode;
        CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
        request_unref(r);
        if (alone)
            collect(e, 1);
    }
    if (pending_start == e) {
        pending_start = NULL;
        CHECK(engine_start(e) == 0);
    }
    if (!alone)
        collect(e, n);
    check_idle(e);
    if (st)
        engine_get_stats(e, st);
}

/* n requests together vs each alone, on an engine with `n_blocks` blocks
 * (small pools force preemption). */
static void concurrent_equals_alone(world *w, req_spec *specs, int n, int32_t n_blocks,
                                    const char *what)
{
    static result alone[MAXN], together[MAXN];
    dp_engine *e = start(w, 1024, 32);
    run_requests(e, specs, n, alone, true, DP_DUALPATH_DEFAULT, NULL);
    engine_destroy(e);
    e = start(w, n_blocks, 32);
    dp_engine_stats st;
    run_requests(e, specs, n, together, false, DP_DUALPATH_DEFAULT, &st);
    engine_destroy(e);
    int total = 0;
    for (int i = 0; i < n; i++) {
        CHECK(alone[i].finish == DP_FINISH_STOP || alone[i].finish == DP_FINISH_LENGTH);
        CHECK_EQ_INT(together[i].n, alone[i].n);
        CHECK_MSG(memcmp(together[i].toks, alone[i].toks, (size_t)alone[i].n * sizeof(int32_t)) == 0,
                  "%s: request %d differs when run with others", what, i);
        CHECK(together[i].text_len == alone[i].text_len &&
              memcmp(together[i].text, alone[i].text, alone[i].text_len) == 0);
        CHECK_EQ_INT(together[i].finish, alone[i].finish);
        CHECK_EQ_INT(together[i].completion_tokens, alone[i].n);
        total += alone[i].n;
    }
    printf("%s: %d concurrent requests identical to alone (%d tokens, %lld preemptions)\n", what, n,
           total, (long long)st.preemptions);
}

static uint64_t rs = 11;
static int32_t urand(int32_t n)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((rs >> 33) % (uint64_t)n);
}

/* Whether two results hold the same tokens. */
static bool same_tokens(const result *a, const result *b)
{
    return a->n == b->n && memcmp(a->toks, b->toks, (size_t)b->n * sizeof(int32_t)) == 0;
}

/* n greedy requests of sys + tail random tokens whose first sys tokens are
 * the same (a system prompt, kept whole), from their own random stream
 * (seed), so the tests after them keep the prompts they were sized for. */
static void shared_prefix_specs(world *w, req_spec *sp, int n, int32_t sys, int32_t tail,
                                int32_t max_tokens, uint64_t seed)
{
    const uint64_t saved = rs;
    rs = seed;
    for (int i = 0; i < n; i++) {
        sp[i] = (req_spec){.n_prompt = sys + tail, .max_tokens = max_tokens, .ignore_eos = true,
                           .keep_prefix = sys};
        for (int32_t k = 0; k < sys + tail; k++)
            sp[i].prompt[k] = k < sys && i > 0 ? sp[0].prompt[k] : urand(w->vocab);
    }
    rs = saved;
}

static void encode(world *w, const char *text, req_spec *sp)
{
    int32_t *ids;
    size_t n;
    CHECK(tokenizer_encode(w->tok, text, strlen(text), false, true, &ids, &n) == 0);
    CHECK(n > 0 && n <= 512);
    memcpy(sp->prompt, ids, n * sizeof *ids);
    sp->n_prompt = (int32_t)n;
    free(ids);
}

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

/* Runs specs through one engine with options o; fills res, returns stats. */
static void run_engine_with(world *w, const dp_engine_opts *o, req_spec *specs, int n,
                            result *res, dp_engine_stats *st, int8_t mode, bool alone)
{
    next_opts = *o;
    next_opts_set = true;
    dp_engine *e = start(w, o->n_blocks, 32);
    next_opts_set = false;
    run_requests(e, specs, n, res, alone, mode, st);
    engine_destroy(e);
}

/* The requests together, on an engine with o. */
static void run_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
                     dp_engine_stats *st, int8_t mode)
{
    run_engine_with(w, o, specs, n, res, st, mode, false);
}

/* ... and each alone, one after the other, on one engine. */
static void run_each_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
                          dp_engine_stats *st, int8_t mode)
{
    run_engine_with(w, o, specs, n, res, st, mode, true);
}

static void test_dualpath(world *w, req_spec *specs, int n, const char *what)
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
static float preempt_keep = 0.5f;
static int preempt_min = 5;

static void test_dualpath_preemption(world *w, req_spec *specs, int n, int32_t small_pool,
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
static void test_swap_space(world *w, req_spec *specs, int n, int32_t small_pool)
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
static void test_quantized_decode(world *w)
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
static void test_quantized_whole_cache(world *w, req_spec *specs, int n)
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

/* n = 4 (four requests with one prompt, submitted together) prefills the
 * prompt once: the copies wait for its blocks to be named and take them by
 * reference. Each copy computes only what it cannot share: the last partial
 * block. The four greedy outputs are identical, and equal to the prompt's alone.
 * Computing each copy whole cost 4 x 150. With dualpath the copies share the
 * first one's compaction too (a kept share, kvcache/dprefix.h): they wait
 * for its migration, then of its 135 kept slots each takes the 128 in whole
 * decode blocks by reference and copies the last 7, selecting nothing, so
 * no SnapKV window of their own is computed either. */
static void test_shared_prompt(world *w)
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

/* A system prompt kept whole (keep_prefix) and shared: requests whose
 * prompts start with the same 100 tokens keep its 6 whole blocks (96 tokens)
 * on the decode path by reference to the prefill blocks the prefix cache
 * shares, in one arena, and compress only their own tails. With split pools
 * the first one's copy of the prefix is shared instead (kvcache/dprefix.h):
 * the same kept tokens, the same outputs. The
 * engine runs the same greedy requests under memory pressure (a shared
 * arena small enough to preempt) with the same outputs too. */
static void test_system_prompt(world *w)
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
static void test_system_prompt_typed(world *w)
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
static void test_system_prompt_kivi(world *w)
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

/* SnapKV as configured, every time: 16 prompts of 30 tokens, submitted before
 * the engine starts so that four end in each 128-token step, all migrate with
 * SnapKV; so do 16 prompts of 150 tokens, chunked (the last chunk keeps the
 * whole window: 118 + 32, not 128 + 22), and the same prompts again, now
 * taken mostly from the prefix cache. The per-step capture of 64 queries
 * served two prompts of each step; the others fell back to key norms. */
static void test_snapkv_every_time(world *w)
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

/* The path detector switches a highly repetitive long prompt early; the
 * request completes and every pool drains. */
static void test_early_switch(world *w)
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
static void test_early_admission(world *w)
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

/* Conversations: new user text is n pseudo-random tokens (LCG state *x);
 * a turn sends the whole conversation, waits for the reply and appends it. */
static void conv_add_text(const world *w, int32_t *conv, int32_t *n_conv, int32_t n, uint64_t *x)
{
    for (int32_t i = 0; i < n; i++) {
        *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
        conv[(*n_conv)++] = (int32_t)((*x >> 33) % (uint64_t)w->vocab);
    }
}

/* Where set, the decode type conversation turn i asks for (req_spec.kv_type). */
static const int8_t *conv_kv_types;

static void conv_turn(dp_engine *e, int32_t *conv, int32_t *n_conv, int32_t max_tokens,
                      int8_t kv_type, result *res)
{
    req_spec sp = {.n_prompt = *n_conv, .max_tokens = max_tokens, .ignore_eos = true,
                   .kv_type = kv_type};
    memcpy(sp.prompt, conv, (size_t)*n_conv * sizeof(int32_t));
    memset(res, 0, sizeof *res);
    dp_request *r = make_req(&sp, res);
    char err[DP_ERRLEN];
    CHECK_MSG(engine_submit(e, r, err, sizeof err) == 0, "%s", err);
    request_unref(r);
    collect(e, 1);
    for (int32_t i = 0; i < res->n; i++)
        conv[(*n_conv)++] = res->toks[i];
}

/* One conversation on an engine with options o (256 blocks, 8 sequences):
 * a first prompt of `first` tokens, then `more` new tokens a turn, each
 * turn resending the whole conversation with its gen-token replies;
 * res[turn], and the engine's stats once it is idle. */
static void run_conversation(world *w, const dp_engine_opts *o, int n_turns, int32_t first,
                             int32_t more, int32_t gen, uint64_t seed, result *res,
                             dp_engine_stats *st)
{
    next_opts = *o;
    next_opts_set = true;
    dp_engine *e = start(w, 256, 8);
    next_opts_set = false;
    static int32_t conv[2048];
    int32_t n_conv = 0;
    uint64_t x = seed;
    for (int turn = 0; turn < n_turns; turn++) {
        conv_add_text(w, conv, &n_conv, turn == 0 ? first : more, &x);
        conv_turn(e, conv, &n_conv, gen, conv_kv_types ? conv_kv_types[turn] : 0, &res[turn]);
    }
    check_idle(e);
    engine_get_stats(e, st);
    engine_destroy(e);
}

static void check_same_turns(const result *a, const result *b, int n_turns, const char *what)
{
    for (int turn = 0; turn < n_turns; turn++)
        CHECK_MSG(same_tokens(&a[turn], &b[turn]), "turn %d differs %s", turn, what);
}

/* A 5-turn conversation (each turn resends the whole conversation) with a
 * distractor request between turns that forces the prefill pool to reuse the
 * freed blocks: the earlier turns' blocks spill to the host tier and are
 * restored from it. Every answer must equal a full recompute's. */
static void test_multiturn_rebuild(world *w, int32_t plen0)
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
static void test_reply_reuse(world *w)
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
static void test_resume_turns(world *w)
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
static void test_exempt_layers(world *w)
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
static void test_decode_types(world *w)
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
static void test_decode_type_exact(world *w)
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
