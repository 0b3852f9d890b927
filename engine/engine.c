/* engine.c: the engine thread. Each loop iteration takes new requests and
 * cancellations from the inbox, runs a step (step.c: plan, forward pass,
 * outputs, path switches), and publishes the statistics; the events it
 * queued (emit.c) go to the loop thread. Only this thread touches the
 * model, the pools and sequences. Here too: the public API, admission and
 * the submit check. */
#include "engine_private.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"
#include "kvcache/compress.h"
#include "kvcache/manager.h"
#include "sched/path.h"
#include "sched/sampler.h"
#include "sched/scheduler.h"
#include "sched/stop.h"

_Static_assert(DP_SCORER_RANDOM + 1 == DP_N_SCORERS, "DP_N_SCORERS counts dp_scorer");

const char *const dp_compaction_names[DP_N_COMPACTIONS] = {"migration", "early_switch",
                                                           "prompt_end", "recompression",
                                                           "early_signal"};

const double dp_migration_bucket_bounds[DP_MIGRATION_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005,
                                                                  0.01,   0.025, 0.05,   0.1};

void engine_opts_default(dp_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_batched_tokens = 512;
    o->max_seqs = 64;
    o->block_tokens = 16;
    o->kv_bytes = (int64_t)1 << 30;
    o->gpu_memory_fraction = 0.9;
    o->max_queue = 256;
    o->dualpath = true;
    o->prefill_fraction = 0.25;
    o->decode_block_tokens = 16;
    /* The defaults docs/dualpath.md's quality tables justify. */
    o->compress = (dp_compress_opts){.scorer = DP_SCORER_SNAPKV, .keep_ratio = 1.0f, .sinks = 4, .window = 32};
    o->prefix_cache = true;
    o->reuse_replies = true;
    o->resume_turns = true;
    o->device_sampling = true;
    /* As llama.cpp keeps it: half the bytes of f32 per token. */
    o->kv_type = DP_KV_F16;
    o->decode_kv_type = ENGINE_DECODE_KV_AUTO;
    o->swap_bytes = (int64_t)4 << 30;
}

int32_t engine_context_length(const dp_engine *e) { return e->ctx_len; }
int32_t engine_max_queue(const dp_engine *e) { return e->opts.max_queue; }

/* Whether a request's cache takes the decode path. A request that scores
 * its prompt runs whole: its logprobs are the full cache's. */
/* Whether a request's sequence migrates when its prompt ends. A chat turn
 * that continues a conversation (compress_turns, unless the request's
 * "dualpath" object says): its whole prompt stays in the prefix cache for
 * the next turn either way, so a compact copy beside it adds memory rather
 * than freeing any, and its reply must be copied back; it pays only when
 * memory binds, for the room it makes. Under auto it runs whole while the
 * arena holds it whole (kvcache/manager.h, whole_if_room; with parked turns
 * only while nothing else runs); never: always whole. Measured in
 * docs/dualpath.md (multi-turn sessions). */
static bool runs_dual(const dp_engine *e, const dp_request_params *p)
{
    if (p->conversation && p->dualpath_mode == DP_DUALPATH_DEFAULT &&
        e->opts.compress_turns == ENGINE_TURNS_NEVER)
        return false;
    return e->dual && p->dualpath_mode != DP_DUALPATH_OFF && !p->prompt_logprobs;
}

/* A request's compression: the server's options with its overrides. The
 * prefix it keeps whole is cut to the prompt and to whole prefill blocks,
 * the unit the prefix cache shares (the rest is compressed). */
static dp_compress_opts request_copts(const dp_engine *e, const dp_request *req)
{
    const dp_request_params *p = &req->params;
    dp_compress_opts co = e->opts.compress;
    if (p->scorer > 0)
        co.scorer = (dp_scorer)(p->scorer - 1);
    if (p->keep_ratio > 0.0f)
        co.keep_ratio = p->keep_ratio;
    co.seed = p->sampling.seed ^ req->id;
    const int32_t bt = kv_mgr_block_tokens(&e->kv);
    const int32_t pre = p->keep_prefix < req->n_prompt ? p->keep_prefix : req->n_prompt;
    co.prefix = pre > 0 ? pre / bt * bt : 0;
    return co;
}

/* The request's decode type (kv_mgr_dtype's index; check_request refused
 * one the server does not keep). */
static uint8_t request_dt(const dp_engine *e, const dp_request_params *p)
{
    int i = p->kv_type > 0 ? kv_mgr_dtype(&e->kv, (dp_kv_type)(p->kv_type - 1)) : 0;
    return i > 0 ? (uint8_t)i : 0;
}

/* What the request asks of the KV manager: the one constructor of its KV
 * state, for the submit check and admission alike. path: its path
 * detector, known at admission (NULL in the check: a predicted early
 * switch changes where the prompt switches, which admission plans, not
 * what kv_mgr_need counts). */
static dp_kv_request request_kv(const dp_engine *e, const dp_request *req,
                                const dp_path_detector *path)
{
    const dp_request_params *p = &req->params;
    dp_kv_request r = {.dual = runs_dual(e, p), .copts = request_copts(e, req)};
    r.exempt = p->exempt != 1;
    r.dt = request_dt(e, p);
    r.whole_if_room = r.dual && p->conversation && p->dualpath_mode == DP_DUALPATH_DEFAULT &&
                      e->opts.compress_turns == ENGINE_TURNS_AUTO;
    /* A repetitive prompt switches at its first chunk end past min_tokens:
     * admission holds prefill blocks up to there only (kvcache/manager.h). */
    if (r.dual && path && path_switches_at_min(path, &e->popts))
        r.early_end = req->n_prompt;
    return r;
}

static int admit_request(dp_engine *e, dp_request *req)
{
    eng_seq *es = calloc(1, sizeof *es);
    if (!es)
        return DP_ENOMEM;
    es->req = req; /* the inbox's reference moves here */
    const dp_request_params *p = &req->params;
    path_init(&es->path);
    if (runs_dual(e, p) && e->popts.early_switch)
        es->path.repetition = path_repetition(req->prompt, req->n_prompt, e->popts.ngram);
    const dp_kv_request kr = request_kv(e, req, &es->path);
    const dp_compress_opts co = kr.copts;
    es->seq = seq_new(req->id, req->prompt, req->n_prompt, p->priority, &kr);
    if (p->n_logit_bias > 0) {
        es->bias_ids = malloc((size_t)p->n_logit_bias * sizeof *es->bias_ids);
        es->bias_vals = malloc((size_t)p->n_logit_bias * sizeof *es->bias_vals);
    }
    if (!es->seq || (p->n_logit_bias > 0 && (!es->bias_ids || !es->bias_vals))) {
        seq_free(es->seq);
        free(es->bias_ids);
        free(es->bias_vals);
        free(es);
        return DP_ENOMEM;
    }
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        es->bias_ids[i] = p->logit_bias[i].token;
        es->bias_vals[i] = p->logit_bias[i].bias;
    }
    es->seq->owner = es;
    es->seq->scores_prompt = p->prompt_logprobs;
    if (p->grammar) {
        /* The trie is built once, for the first constrained request. */
        if (!e->gvocab)
            e->gvocab = gvocab_new(e->tok);
        es->gs = e->gvocab ? gstate_new(p->grammar) : NULL;
        if (!es->gs) {
            seq_free(es->seq);
            free(es->bias_ids);
            free(es->bias_vals);
            free(es);
            return DP_ENOMEM;
        }
    }
    es->capture_at = -1;
    /* SnapKV scores with the prompt's last window of queries: they run in
     * one step (the scheduler never splits them, nor takes them from the
     * prefix cache) so that they are captured together. A prompt that keeps
     * every token (keep_ratio 1, the default) is never scored, so its window
     * comes from the prefix cache like the rest (the path detector's
     * stability test still reads chunk ends under early_switch). */
    if (es->seq->kv.dual && co.scorer == DP_SCORER_SNAPKV &&
        (co.keep_ratio < 1.0f || e->popts.early_switch)) {
        int32_t w = co.window < DP_MAX_CAPTURE ? co.window : DP_MAX_CAPTURE;
        es->capture_w = w > 0 ? w : 0;
        /* A step always has room for the aligned tail beside a full batch of
         * decodes, or a prompt's last tokens could wait forever (a smaller
         * tail captures fewer queries, never none). */
        int32_t room = e->opts.max_batched_tokens - e->opts.max_seqs;
        if (w > room)
            w = room;
        es->seq->tail_min = w > 0 ? w : 0;
    }
    rng_seed(&es->rng, p->sampling.seed);
    detok_init(&es->detok, false);
    stop_init(&es->stop, (const char *const *)p->stops, p->n_stops);
    es->next = e->live;
    e->live = es;
    sched_add(&e->sched, es->seq);
    return 0;
}

/* kv_mgr_stats' walk over the live sequences. */
static const dp_kv_seq *next_live_kv(void *it)
{
    eng_seq **cur = it;
    if (!*cur)
        return NULL;
    const dp_kv_seq *kv = &(*cur)->seq->kv;
    *cur = (*cur)->next;
    return kv;
}

/* The gauges, then everything the engine thread counted, published for
 * engine_get_stats: the one place the engine takes stats_mu. */
void eng_publish_stats(dp_engine *e)
{
    e->st.running = e->sched.n_running;
    if (e->st.running > e->st.running_peak)
        e->st.running_peak = e->st.running;
    e->st.waiting = e->sched.n_waiting + (int32_t)e->in_n;
    eng_seq *it = e->live;
    kv_mgr_stats(&e->kv, next_live_kv, &it, &e->st.kv);
    e->st.preemptions = e->sched.n_preemptions;
    e->st.heartbeat++;
    pthread_mutex_lock(&e->stats_mu);
    e->stats = e->st;
    pthread_mutex_unlock(&e->stats_mu);
}

/* TEST HOOK (engine_debug_stall): hang like a stuck kernel would, without
 * bumping the heartbeat, until engine_stop. */
static void debug_stall_wait(dp_engine *e)
{
    dp_log(DP_LOG_WARN, "engine: debug stall hook: the engine thread stops here");
    while (!atomic_load(&e->stopping)) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void *engine_main(void *arg)
{
    dp_engine *e = arg;
    int32_t cap = 0;
    dp_request **batch = NULL;
    for (;;) {
        if (atomic_load(&e->debug_stall))
            debug_stall_wait(e);
        /* Take the inbox; sleep when there is nothing at all to do. */
        pthread_mutex_lock(&e->mu);
        while (!e->in_n && !e->wake && !atomic_load(&e->stopping) && sched_idle(&e->sched)) {
            pthread_mutex_unlock(&e->mu);
            eng_publish_stats(e);
            pthread_mutex_lock(&e->mu);
            if (e->in_n || e->wake || atomic_load(&e->stopping))
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 250 * 1000000L;
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->cv, &e->mu, &ts); /* heartbeat while idle */
        }
        int32_t n = e->in_n;
        if (n > cap) {
            dp_request **nb = realloc(batch, (size_t)n * sizeof *nb);
            if (nb) {
                batch = nb;
                cap = n;
            } else {
                n = cap;
            }
        }
        if (n > 0) {
            memcpy(batch, e->in_q, (size_t)n * sizeof *batch);
            memmove(e->in_q, e->in_q + n, (size_t)(e->in_n - n) * sizeof *e->in_q);
            e->in_n -= n;
        }
        e->wake = false;
        bool stop = atomic_load(&e->stopping);
        pthread_mutex_unlock(&e->mu);

        for (int32_t i = 0; i < n; i++)
            if (admit_request(e, batch[i]) != 0) {
                dp_event *ev = request_take_finish(batch[i]);
                if (ev) {
                    ev->finish = DP_FINISH_ERROR;
                    ev->error = strdup("out of memory");
                    ev->text = calloc(1, 1);
                    ev->prompt_tokens = batch[i]->n_prompt;
                    eng_push_event(e, ev);
                }
                atomic_fetch_sub(&e->queued, 1);
                request_unref(batch[i]);
            }
        /* Cancellations (and everything, when stopping). */
        for (eng_seq *es = e->live, *nx; es; es = nx) {
            nx = es->next;
            if (stop || atomic_load(&es->req->cancelled))
                eng_finish_seq(e, es, DP_FINISH_CANCELLED, NULL, false);
        }
        if (stop)
            break;
        if (atomic_load(&e->device_lost))
            eng_fail_all(e, LOST_MSG); /* what the inbox brought since */
        else if (!sched_idle(&e->sched))
            eng_run_step(e);
        eng_publish_stats(e);
        /* After every iteration that produced events, even when the consumer
         * already took them (it may have, between a push and this point): the
         * notification then tells it that the gauges include them. */
        if (e->pushed && e->notify)
            e->notify(e->notify_ud);
        e->pushed = false;
    }
    eng_publish_stats(e);
    if (e->notify)
        e->notify(e->notify_ud);
    free(batch);
    return NULL;
}

/* ---- public API ----------------------------------------------------------- */

/* The options the engine refuses whatever the memory: a model sized for
 * fewer tokens or outputs per step, bad dual-path settings, a quantized
 * whole cache with the dual path. */
static int check_opts(const dp_engine *e, const dp_engine_opts *opts, char *err, size_t errsz)
{
    if (opts->max_batched_tokens > llama_max_tokens(e->model) ||
        opts->max_seqs > llama_max_out(e->model))
        return dp_err(err, errsz, DP_EINVAL,
                      "engine: model sized for %d tokens / %d outputs per step, engine wants %d / %d",
                      llama_max_tokens(e->model), llama_max_out(e->model),
                      opts->max_batched_tokens, opts->max_seqs);
    if (e->dual && (opts->compress.keep_ratio <= 0.0f || opts->compress.keep_ratio > 1.0f ||
                    opts->prefill_fraction <= 0.0 || opts->prefill_fraction >= 1.0))
        return dp_err(err, errsz, DP_EINVAL, "engine: bad dual-path settings (keep_ratio %g, "
                      "prefill fraction %g)", opts->compress.keep_ratio, opts->prefill_fraction);
    /* A sliding-window layer attends to its last slots, which are its
     * last positions only while nothing of the sequence was evicted
     * (backend.h attention): where such layers keep every token (swa_full)
     * in the main stores, the decode path keeps every token of such a
     * model, in a type that is not grouped. Apart (the default), they are
     * read by position and the decode path serves the global layers. */
    const dp_hparams *hp = llama_hparams(e->model);
    if (eng_swa_apart(e, opts) && e->dual && opts->exempt_layers > 0)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: exempt_layers %d: this model (%s) "
                      "keeps its sliding-window layers apart, at their window; exempt layers "
                      "need swa_full = true", opts->exempt_layers, hp->arch);
    const bool swa_whole = hp->swa_window > 0 && !eng_swa_apart(e, opts);
    if (e->dual && swa_whole && opts->compress.keep_ratio < 1.0f)
        return dp_err(err, errsz, DP_EINVAL, "engine: keep_ratio %g: this model (%s) has "
                      "sliding-window layers, whose cache the decode path keeps whole: keep_ratio "
                      "must be 1 with it", opts->compress.keep_ratio, hp->arch);
    if (e->dual && swa_whole && opts->decode_kv_type >= 0 &&
        dp_kv_type_grouped(opts->decode_kv_type))
        return dp_err(err, errsz, DP_EINVAL, "engine: decode_kv_type %s: this model (%s) has "
                      "sliding-window layers, which a grouped type cannot serve; use q8_0, q4_0, "
                      "f16 or auto", dp_kv_type_name(opts->decode_kv_type), hp->arch);
    /* A quantized whole cache is dualpath off's (llama.cpp's -ctk q8_0):
     * the prefill path keeps f16 or f32, and the decode path's type is
     * decode_kv_type. */
    if (e->dual && dp_kv_type_quantized(opts->kv_type))
        return dp_err(err, errsz, DP_EINVAL, "engine: kv_cache_type %s keeps the whole cache "
                      "quantized and needs dualpath = false; with the dual path the prefill path "
                      "keeps f16 or f32 and decode_kv_type sets the decode path's type",
                      dp_kv_type_name(opts->kv_type));
    return 0;
}

/* The step's arrays, sized for the largest step (tokens T, sequences S,
 * output rows R); false without memory. */
static bool alloc_step_arrays(dp_engine *e, const dp_engine_opts *opts)
{
    size_t T = (size_t)opts->max_batched_tokens, S = (size_t)opts->max_seqs;
    size_t R = (size_t)llama_max_out(e->model);
    const size_t SC = e->score_rows > 0 ? (size_t)e->score_rows : 1;
    e->logits = malloc(R * (size_t)e->vocab * sizeof(float));
    e->sc_out = malloc(SC * sizeof(int32_t));
    e->sc_pos = malloc(SC * sizeof(int32_t));
    e->sc_seq = malloc(SC * sizeof *e->sc_seq);
    e->raw_row = malloc((size_t)e->vocab * sizeof(float));
    e->topk_k = e->vocab < ENGINE_TOPK ? e->vocab : ENGINE_TOPK;
    e->t_temp = malloc(S * sizeof(float));
    e->t_max = malloc(S * sizeof(float));
    e->t_sum = malloc(S * sizeof(float));
    e->t_mask = calloc(S, 1);
    e->t_ids = malloc(S * (size_t)e->topk_k * sizeof(int32_t));
    e->t_tok = malloc(S * sizeof(int32_t));
    e->t_pd = malloc(S * sizeof *e->t_pd);
    e->t_seq = malloc(S * sizeof *e->t_seq);
    e->t_vals = malloc(S * (size_t)e->topk_k * sizeof(float));
    e->eog = malloc((size_t)e->vocab * sizeof(int32_t));
    for (int32_t t = 0; e->eog && t < e->vocab; t++)
        if (tokenizer_is_eog(e->tok, t))
            e->eog[e->n_eog++] = t;
    bool bb_ok = batch_buf_init(&e->bb, (int32_t)T, (int32_t)R, (int32_t)S,
                                llama_capture_capacity(e->model)) == 0;
    for (int i = 0; i < 3; i++)
        e->lists[i] = malloc(S * sizeof(eng_seq *));
    e->mig = malloc(S * sizeof *e->mig);
    e->in_cap = 64;
    e->in_q = malloc((size_t)e->in_cap * sizeof *e->in_q);
    return bb_ok && e->logits && e->lists[0] && e->mig && e->lists[1] && e->lists[2] &&
           e->raw_row && e->t_temp && e->t_max && e->t_sum && e->t_mask && e->t_ids &&
           e->t_vals && e->t_tok && e->t_pd && e->t_seq && e->eog && e->in_q && e->sc_out &&
           e->sc_pos && e->sc_seq;
}

int engine_init(dp_engine **out, dp_llama *model, const dp_tokenizer *tok,
                const dp_engine_opts *opts, dp_engine_notify_fn notify, void *ud, char *err,
                size_t errsz)
{
    dp_engine *e = calloc(1, sizeof *e);
    if (!e)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    e->model = model;
    e->tok = tok;
    e->opts = *opts;
    e->notify = notify;
    e->notify_ud = ud;
    e->be = llama_backend(model);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    const dp_hparams *hp = llama_hparams(model);
    e->vocab = hp->vocab;
    e->ctx_len = opts->context_length > 0 && opts->context_length < hp->n_ctx_train
                     ? opts->context_length
                     : hp->n_ctx_train;
    e->dual = opts->dualpath;
    int rc;
    if ((rc = check_opts(e, opts, err, errsz)))
        goto fail;
    /* The path detector's settings (the KV manager plans predicted early
     * switches with its min_tokens). */
    if (e->dual) {
        path_opts_default(&e->popts);
        e->popts.early_switch = opts->early_switch;
        if (opts->early_min_tokens > 0)
            e->popts.min_tokens = opts->early_min_tokens;
    }
    if ((rc = eng_plan_memory(e, opts, err, errsz)))
        goto fail;
    /* LongRoPE's factors follow the context served (llama.cpp's by n_ctx). */
    llama_set_context(model, e->ctx_len);
    if (hp->longrope)
        dp_log(DP_LOG_INFO, "engine: LongRoPE: the %s factors (context %d, original %d)",
               e->ctx_len > hp->n_ctx_orig ? "long" : "short", e->ctx_len, hp->n_ctx_orig);
    /* The model's logits rows beyond one per sequence score prompts. */
    e->score_rows = llama_max_out(model) - opts->max_seqs;
    dp_sched_opts so = {opts->max_batched_tokens, opts->max_seqs, e->score_rows};
    if (sched_init(&e->sched, &so, &e->kv) || sampler_init(&e->sampler, e->vocab) ||
        !alloc_step_arrays(e, opts)) {
        rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
        goto fail;
    }
    atomic_init(&e->queued, 0);
    eng_publish_stats(e);
    *out = e;
    return 0;
fail:
    engine_destroy(e);
    return rc;
}

int engine_start(dp_engine *e)
{
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0)
        return DP_ENOMEM;
    e->started = true;
    return 0;
}

void engine_stop(dp_engine *e)
{
    if (!e->started)
        return;
    pthread_mutex_lock(&e->mu);
    atomic_store(&e->stopping, true);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->started = false;
}

bool engine_device_lost(const dp_engine *e) { return atomic_load(&e->device_lost); }

void engine_debug_device_lost(dp_engine *e)
{
    atomic_store(&e->debug_lose, true);
}

void engine_debug_stall(dp_engine *e)
{
    /* Wake it so that an idle engine leaves its wait and reaches the stall. */
    pthread_mutex_lock(&e->mu);
    atomic_store(&e->debug_stall, true);
    e->wake = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_destroy(dp_engine *e)
{
    if (!e)
        return;
    engine_stop(e);
    while (e->live)
        eng_finish_seq(e, e->live, DP_FINISH_CANCELLED, NULL, false);
    for (int32_t i = 0; i < e->in_n; i++)
        request_unref(e->in_q[i]);
    event_free_list(e->out_head);
    batch_buf_destroy(&e->bb);
    free(e->mig);
    for (int i = 0; i < 3; i++)
        free(e->lists[i]);
    sched_destroy(&e->sched);
    kv_mgr_destroy(&e->kv);
    sampler_destroy(&e->sampler);
    free(e->logits);
    free(e->raw_row);
    free(e->t_temp);
    free(e->t_max);
    free(e->t_sum);
    free(e->t_mask);
    free(e->t_ids);
    free(e->t_vals);
    free(e->t_tok);
    free(e->t_pd);
    free(e->t_seq);
    free(e->eog);
    free(e->sc_out);
    free(e->sc_pos);
    free(e->sc_seq);
    gvocab_free(e->gvocab);
    free(e->in_q);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->stats_mu);
    free(e);
}

/* Whether a request can ever run here (the message says why not). */
static int check_request(dp_engine *e, const dp_request *req, char *err, size_t errsz)
{
    const dp_request_params *p = &req->params;
    if (req->n_prompt < 1)
        return dp_err(err, errsz, DP_EINVAL, "the prompt is empty");
    for (int32_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= e->vocab)
            return dp_err(err, errsz, DP_EINVAL, "prompt token %d is outside the vocabulary (0..%d)",
                          req->prompt[i], e->vocab - 1);
    if (p->max_tokens < 0)
        return dp_err(err, errsz, DP_EINVAL, "max_tokens must not be negative");
    if (p->prompt_logprobs && e->score_rows < 1)
        return dp_err(err, errsz, DP_EINVAL, "prompt logprobs are not available: the model has "
                      "no logits rows beyond max_num_seqs");
    if ((int64_t)req->n_prompt + p->max_tokens > e->ctx_len)
        return dp_err(err, errsz, DP_EINVAL,
                      "this model's maximum context length is %d tokens; the prompt has %d tokens "
                      "and max_tokens is %d (%lld in total)",
                      e->ctx_len, req->n_prompt, p->max_tokens,
                      (long long)req->n_prompt + p->max_tokens);
    if (p->dualpath_mode == DP_DUALPATH_ON && !e->dual)
        return dp_err(err, errsz, DP_EINVAL, "dualpath is disabled on this server");
    /* One exempt store serves every sequence: a request keeps the
     * server's exempt layers or none. */
    const int32_t n_exempt = kv_mgr_exempt_layers(&e->kv);
    if (p->exempt > 1 && p->exempt - 1 != n_exempt)
        return dp_err(err, errsz, DP_EINVAL, "dualpath.exempt_layers must be 0 or this server's "
                      "exempt_layers (%d), got %d", n_exempt, p->exempt - 1);
    /* A decode type other than the server's is another view of the arena
     * (kv_mgr_dtype): there where the backend has views. */
    if (p->kv_type > 0 && !e->dual)
        return dp_err(err, errsz, DP_EINVAL, "dualpath.decode_kv_type: dualpath is disabled on "
                      "this server");
    if (p->kv_type > 0 && kv_mgr_dtype(&e->kv, (dp_kv_type)(p->kv_type - 1)) < 0) {
        char have[64];
        kv_mgr_dtype_names(&e->kv, have, sizeof have);
        return dp_err(err, errsz, DP_EINVAL, "dualpath.decode_kv_type %s is not available on "
                      "this server (it keeps %s)", dp_kv_type_name(p->kv_type - 1), have);
    }
    /* (check_opts: a sliding-window model whose sliding layers keep every
     * token, swa_full, keeps every token on the decode path, in a type that
     * is not grouped.) */
    if (llama_hparams(e->model)->swa_window > 0 && !kv_mgr_has_swa(&e->kv) && e->dual &&
        runs_dual(e, p) &&
        ((p->keep_ratio > 0.0f && p->keep_ratio < 1.0f) ||
         (p->kv_type > 0 && dp_kv_type_grouped(p->kv_type - 1))))
        return dp_err(err, errsz, DP_EINVAL, "dualpath.%s: this model has sliding-window "
                      "layers, whose cache is kept whole (keep_ratio 1, a type that is not "
                      "grouped)", p->keep_ratio > 0.0f && p->keep_ratio < 1.0f ? "keep_ratio"
                                                                               : "decode_kv_type");
    /* A grouped type's sequences keep no exempt table. */
    if (p->kv_type > 0 && dp_kv_type_grouped(p->kv_type - 1) && n_exempt > 0 && p->exempt != 1)
        return dp_err(err, errsz, DP_EINVAL, "dualpath.decode_kv_type %s keeps no exempt layers: "
                      "ask for dualpath.exempt_layers 0 with it", dp_kv_type_name(p->kv_type - 1));
    /* Can it ever fit, alone in the pools? The manager's one formula. */
    const dp_kv_request kr = request_kv(e, req, NULL);
    dp_kv_seq kv;
    kv_seq_init_request(&kv, &kr);
    dp_kv_need need = kv_mgr_need(&e->kv, &kv, req->n_prompt, p->max_tokens);
    bool fits = kv_mgr_can_fit(&e->kv, &kv, req->n_prompt, p->max_tokens);
    kv_seq_destroy(&kv);
    if (!fits)
        return dp_err(err, errsz, DP_EINVAL,
                      "the request needs %d KV blocks for its prompt and %d for decoding; the KV "
                      "cache holds %d%s", need.prefill, need.decode, kv_mgr_blocks(&e->kv),
                      kv_mgr_shared(&e->kv) || !kv_mgr_dual(&e->kv) ? "" : " (prefill pool)");
    if (atomic_load(&e->device_lost))
        return dp_err(err, errsz, DP_EDEVICE, LOST_MSG);
    return 0;
}

int engine_submit_all(dp_engine *e, dp_request *const *reqs, int32_t n, char *err, size_t errsz)
{
    int rc;
    for (int32_t i = 0; i < n; i++)
        if ((rc = check_request(e, reqs[i], err, errsz)))
            return rc;
    pthread_mutex_lock(&e->mu);
    if (atomic_load(&e->stopping)) {
        pthread_mutex_unlock(&e->mu);
        return dp_err(err, errsz, DP_ENOSPC, "the engine is stopping");
    }
    if (e->opts.max_queue > 0 && atomic_load(&e->queued) + n > e->opts.max_queue) {
        pthread_mutex_unlock(&e->mu);
        return dp_err(err, errsz, DP_ENOSPC, "too many requests are waiting (%d)", e->opts.max_queue);
    }
    while (e->in_n + n > e->in_cap) {
        dp_request **nq = realloc(e->in_q, (size_t)e->in_cap * 2 * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&e->mu);
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        }
        e->in_q = nq;
        e->in_cap *= 2;
    }
    const double now = dp_now();
    for (int32_t i = 0; i < n; i++) {
        request_ref(reqs[i]);
        reqs[i]->t_arrival = now;
        e->in_q[e->in_n++] = reqs[i];
    }
    atomic_fetch_add(&e->queued, n);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int engine_submit(dp_engine *e, dp_request *req, char *err, size_t errsz)
{
    return engine_submit_all(e, &req, 1, err, errsz);
}

void engine_cancel(dp_engine *e, dp_request *req)
{
    atomic_store(&req->cancelled, true);
    pthread_mutex_lock(&e->mu);
    e->wake = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_get_stats(dp_engine *e, dp_engine_stats *s)
{
    pthread_mutex_lock(&e->stats_mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->stats_mu);
}
