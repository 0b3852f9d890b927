/* engine_world.c: the engine tests' harness (engine_world.h). */
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

/* path: a GGUF file; NULL: the synthetic preset `shape` (tests/unit: tiny). */
void world_open_shape(world *w, const char *path, const char *shape)
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

void world_open(world *w, const char *path) { world_open_shape(w, path, "tiny"); }

void world_close(world *w)
{
    tokenizer_destroy(w->tok);
    llama_destroy(w->m);
    backend_destroy(w->be);
    gguf_close(&w->g);
    free(w->buf);
}

dp_request *make_req(const req_spec *sp, result *res)
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

void on_notify(void *ud)
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
void collect(dp_engine *e, int want)
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
void collect_tokens(dp_engine *e, result *res, int32_t n)
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
void settled_stats(dp_engine *e, dp_engine_stats *st)
{
    engine_get_stats(e, st);
    if (st->running == 0 && st->waiting == 0 && st->kv.blocks_used == 0 && st->kv.decode_blocks_used == 0)
        return;
    wait_notify(last_take);
    engine_get_stats(e, st);
}

/* Engine options of the next start() (dualpath off unless a test sets it). */
dp_engine_opts next_opts;
bool next_opts_set;
/* Most checks compare outputs across batch compositions (together vs alone,
 * device sampling on vs off with other step groupings), which holds bit for
 * bit only where the forward pass is batch-invariant. The matmul is not
 * (fused dot products for a few rows, sgemm for more: other summation
 * orders), and an f16 cache turns a last-bit difference in K into a whole f16
 * step now and then, which can flip a token. So start() keeps the exact f32
 * cache; the checks that compare no outputs across batches (admission,
 * SnapKV capture) run on the default f16. */
bool exact_kv = true;

/* With defer_start the next start() leaves the engine stopped until
 * run_requests has submitted everything: the first step then sees every
 * request, and the schedule (hence the preemption count) is the same on any
 * machine at any speed. */
bool defer_start;
static dp_engine *pending_start;

dp_engine *start(world *w, int32_t n_blocks, int32_t max_seqs)
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

void check_idle(dp_engine *e)
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
void run_requests(dp_engine *e, const req_spec *specs, int n, result *res, bool alone,
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
void concurrent_equals_alone(world *w, req_spec *specs, int n, int32_t n_blocks,
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
int32_t urand(int32_t n)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((rs >> 33) % (uint64_t)n);
}

/* Whether two results hold the same tokens. */
bool same_tokens(const result *a, const result *b)
{
    return a->n == b->n && memcmp(a->toks, b->toks, (size_t)b->n * sizeof(int32_t)) == 0;
}

/* n greedy requests of sys + tail random tokens whose first sys tokens are
 * the same (a system prompt, kept whole), from their own random stream
 * (seed), so the tests after them keep the prompts they were sized for. */
void shared_prefix_specs(world *w, req_spec *sp, int n, int32_t sys, int32_t tail,
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

void encode(world *w, const char *text, req_spec *sp)
{
    int32_t *ids;
    size_t n;
    CHECK(tokenizer_encode(w->tok, text, strlen(text), false, true, &ids, &n) == 0);
    CHECK(n > 0 && n <= 512);
    memcpy(sp->prompt, ids, n * sizeof *ids);
    sp->n_prompt = (int32_t)n;
    free(ids);
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
void run_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
              dp_engine_stats *st, int8_t mode)
{
    run_engine_with(w, o, specs, n, res, st, mode, false);
}

/* ... and each alone, one after the other, on one engine. */
void run_each_with(world *w, const dp_engine_opts *o, req_spec *specs, int n, result *res,
                   dp_engine_stats *st, int8_t mode)
{
    run_engine_with(w, o, specs, n, res, st, mode, true);
}

/* Conversations: new user text is n pseudo-random tokens (LCG state *x);
 * a turn sends the whole conversation, waits for the reply and appends it. */
void conv_add_text(const world *w, int32_t *conv, int32_t *n_conv, int32_t n, uint64_t *x)
{
    for (int32_t i = 0; i < n; i++) {
        *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
        conv[(*n_conv)++] = (int32_t)((*x >> 33) % (uint64_t)w->vocab);
    }
}

/* Where set, the decode type conversation turn i asks for (req_spec.kv_type). */
const int8_t *conv_kv_types;

void conv_turn(dp_engine *e, int32_t *conv, int32_t *n_conv, int32_t max_tokens,
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
void run_conversation(world *w, const dp_engine_opts *o, int n_turns, int32_t first,
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

void check_same_turns(const result *a, const result *b, int n_turns, const char *what)
{
    for (int turn = 0; turn < n_turns; turn++)
        CHECK_MSG(same_tokens(&a[turn], &b[turn]), "turn %d differs %s", turn, what);
}
