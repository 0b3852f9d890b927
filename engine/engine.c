/* engine.c: the engine thread. Each loop iteration takes new requests and
 * cancellations from the inbox, plans a step (sched/), runs the forward pass
 * over it, samples, applies stop conditions, and queues token events for the
 * loop thread. Only this thread touches the model, the pool and sequences. */
#include "engine.h"

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
    int32_t tokens_kept, tokens_evicted;
    int64_t kv_bytes, kv_bytes_full; /* its prompt's KV after / before the migration */
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
    int32_t *b_capture;
    int32_t capture_cap;       /* llama_capture_capacity */
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
    /* Batch arrays (engine thread only). */
    int32_t *b_tokens, *b_pos, *b_seq, *b_slot, *b_out, *b_tables;
    /* Prompt-logprob rows of the step (after the sampled rows): the token
     * index of each, its sequence and position; score_rows at most. */
    int32_t score_rows;
    int32_t *sc_out, *sc_pos;
    struct eng_seq **sc_seq;
    dp_gvocab *gvocab;         /* the vocabulary's byte trie, built for the first grammar */
    uint8_t *b_store;
    int32_t *b_sealed, *b_roff; /* grouped decode types' (dp_batch seq_sealed, seq_roff) */
    /* The exempt layers' arrays of a step (dp_batch x_*). */
    int32_t *x_slot, *x_tables;
    size_t x_tables_cap;
    uint8_t *x_store;
    size_t b_tables_cap;
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

/* ---- outbox --------------------------------------------------------------- */

static dp_event *event_new(dp_engine *e, dp_request *req, dp_event_kind kind)
{
    dp_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return NULL;
    ev->kind = kind;
    ev->req = req;
    request_ref(req);
    return ev;
}

static void push_event(dp_engine *e, dp_event *ev)
{
    pthread_mutex_lock(&e->mu);
    if (e->out_tail)
        e->out_tail->next = ev;
    else
        e->out_head = ev;
    e->out_tail = ev;
    pthread_mutex_unlock(&e->mu);
    e->pushed = true;
}

dp_event *engine_take_events(dp_engine *e)
{
    pthread_mutex_lock(&e->mu);
    dp_event *h = e->out_head;
    e->out_head = e->out_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    return h;
}

/* ---- sequences ------------------------------------------------------------ */

/* Releases what the detokenizer and the stop matcher still hold: the end of
 * the text when generation ends for any reason but a stop string. */
static char *flush_text(eng_seq *es, size_t *len)
{
    char tail[64], *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int nt = detok_flush(&es->detok, tail, sizeof tail);
    int m = nt > 0 ? stop_push(&es->stop, tail, (size_t)nt, es->req->params.include_stop_str, &a, &na) : 0;
    if (m != 1)
        stop_flush(&es->stop, &b, &nb);
    char *t = malloc(na + nb + 1);
    if (t) {
        memcpy(t, a ? a : "", na);
        memcpy(t + na, b ? b : "", nb);
        t[na + nb] = 0;
        *len = na + nb;
    }
    free(a);
    free(b);
    return t;
}

/* The held token events go out in order (cut: the output's end, or -1 when
 * all of them are part of it). */
static void push_pending(dp_engine *e, eng_seq *es, int64_t cut)
{
    while (es->pend_head) {
        dp_event *p = es->pend_head;
        es->pend_head = p->next;
        p->next = NULL;
        p->past_end = cut >= 0 && p->text_start >= cut;
        push_event(e, p);
    }
    es->pend_tail = NULL;
}

/* Emits the FINISH event and frees the sequence. flush: release held text. */
static void finish_seq(dp_engine *e, eng_seq *es, dp_finish why, const char *error, bool flush)
{
    push_pending(e, es, -1); /* a stop string's cut marked them already */
    dp_event *ev = request_take_finish(es->req);
    if (ev) {
        size_t n = 0;
        ev->text = flush ? flush_text(es, &n) : NULL;
        ev->text_len = ev->text ? n : 0;
        if (!ev->text)
            ev->text = calloc(1, 1);
        ev->finish = why;
        ev->prompt_tokens = es->req->n_prompt;
        ev->completion_tokens = es->n_gen;
        ev->n_preemptions = es->seq->n_preemptions;
        ev->tokens_kept = es->tokens_kept;
        ev->tokens_evicted = es->tokens_evicted;
        ev->tokens_resumed = es->resumed ? es->seq->reused_tokens : 0;
        ev->kv_bytes = es->kv_bytes;
        ev->kv_bytes_full = es->kv_bytes_full;
        ev->t_first_token = es->t_first;
        ev->t_finish = dp_now();
        if (error)
            ev->error = strdup(error);
        push_event(e, ev);
    }
    if (!es->started)
        atomic_fetch_sub(&e->queued, 1);
    if (why == DP_FINISH_ERROR) /* a failed step may have left slots unwritten */
        kv_seq_forget_reply(&es->seq->kv);
    sched_remove(&e->sched, es->seq);
    /* Unlink from the live list. */
    for (eng_seq **pp = &e->live; *pp; pp = &(*pp)->next)
        if (*pp == es) {
            *pp = es->next;
            break;
        }
    e->st.requests_finished[why]++;
    seq_free(es->seq);
    free(es->prev_keep);
    gstate_free(es->gs);
    stop_destroy(&es->stop);
    free(es->bias_ids);
    free(es->bias_vals);
    request_unref(es->req);
    free(es);
}

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

/* ---- sampling and stop conditions ----------------------------------------- */

/* Candidates per row for device sampling. The tokens do not depend on it
 * (sched/sampler.h); it sets how often a row falls back to the download, and
 * what comes back each step: n x (2k + 2) words. 64 covers the nucleus of
 * nearly every step of a real model at the usual settings (measured with
 * dp-engine-bench: see kernels/cuda/README.md). */
#define ENGINE_TOPK 64

/* The request samples from its full row: it changes the logits first
 * (logit_bias, penalties) or reports log-probabilities over the vocabulary. */
static bool needs_full_row(const dp_request_params *p)
{
    return p->n_logit_bias > 0 || p->logprobs >= 0 || p->grammar || p->min_tokens > 0 ||
           (p->ignore_eos && p->n_stop_ids > 0) || sampling_needs_row(&p->sampling);
}

static bool is_stop_id(const dp_request_params *p, int32_t tok)
{
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == tok)
            return true;
    return false;
}

/* Constrained decoding: tokens that cannot continue the grammar's sentence
 * are masked out of the row (timed and counted for /metrics). */
static void constrain_row(dp_engine *e, eng_seq *es, float *row)
{
    double t0 = dp_now();
    int64_t c0, h0, c1, h1;
    gstate_mask_stats(es->gs, &c0, &h0);
    es->g_dead = gstate_mask_logits(es->gs, e->gvocab, row) == 0;
    gstate_mask_stats(es->gs, &c1, &h1);
    e->st.grammar_masks_computed += c1 - c0;
    e->st.grammar_masks_cached += h1 - h0;
    e->st.grammar_seconds += dp_now() - t0;
}

static bool is_stop_id(const dp_request_params *p, int32_t tok);

/* Whether the grammar's mask would allow tok (gstate_mask_logits' rule): an
 * end of generation where the text is a whole sentence, a token whose bytes
 * continue it; never a control token without bytes. */
static bool grammar_allows_token(const dp_engine *e, eng_seq *es, int32_t tok)
{
    if (tok < 0)
        return false;
    if (tokenizer_is_eog(e->tok, tok))
        return gstate_accepting(es->gs);
    char piece[512];
    const int nb = tokenizer_token_bytes(e->tok, tok, false, piece, sizeof piece);
    return nb > 0 && nb <= (int)sizeof piece && gstate_allows(es->gs, piece, (size_t)nb);
}

/* ignore_eos: no end-of-generation token is sampled, except one the request
 * names as a stop token (it asked to stop there). */
static void mask_eog(const dp_engine *e, const dp_request_params *p, float *row)
{
    for (int32_t i = 0; i < e->n_eog; i++)
        if (p->n_stop_ids == 0 || !is_stop_id(p, e->eog[i]))
            row[e->eog[i]] = -INFINITY;
}

/* After logits_topk: decides every output row that the candidates can
 * decide (drawing its one uniform), then downloads the rows that are left,
 * a run of adjacent rows in one copy, or all rows at once when that is most
 * of them. The logits stay in backend memory until then. */
static int decide_rows(dp_engine *e, eng_seq **emitting, int32_t no)
{
    int32_t need = 0;
    for (int32_t o = 0; o < no; o++) {
        const dp_request_params *p = &emitting[o]->req->params;
        e->t_tok[o] = -1;
        if (needs_full_row(p)) {
            need++;
            continue;
        }
        const size_t at = (size_t)o * (size_t)e->topk_k;
        const int32_t tok = sampler_sample_candidates(&p->sampling, &emitting[o]->rng,
                                                      e->t_ids + at, e->t_vals + at, e->topk_k,
                                                      e->vocab, e->t_max[o], e->t_sum[o],
                                                      &e->t_pd[o]);
        if (tok != DP_SAMPLE_UNDECIDED)
            e->t_tok[o] = tok;
        else
            need++;
    }
    if (2 * need >= no)
        return need ? llama_download_logits(e->model, no, e->logits) : 0;
    for (int32_t o = 0; o < no;) {
        if (e->t_tok[o] >= 0) {
            o++;
            continue;
        }
        int32_t end = o + 1;
        while (end < no && e->t_tok[end] < 0)
            end++;
        int rc = llama_download_rows(e->model, o, end - o, e->logits + (size_t)o * e->vocab);
        if (rc)
            return rc;
        o = end;
    }
    return 0;
}

/* Samples output row o for es: the token decide_rows found, or from the row
 * (an undecided draw continues where the candidates left it; a request that
 * changes its logits or wants log-probabilities uses the row alone). */
static int32_t sample_row(dp_engine *e, eng_seq *es, int32_t o)
{
    const dp_request_params *p = &es->req->params;
    dp_seq *q = es->seq;
    float *row = e->logits + (size_t)o * (size_t)e->vocab;
    if (e->step_topk && !needs_full_row(p)) {
        if (e->t_tok[o] >= 0) {
            e->n_cand++;
            return e->t_tok[o];
        }
        e->n_fallback++; /* ignore_eos: logits_topk masked the row already */
        return sampler_sample_rest(&e->sampler, &p->sampling, &e->t_pd[o], row);
    }
    if (p->logprobs >= 0)
        memcpy(e->raw_row, row, (size_t)e->vocab * sizeof *row);
    if (p->n_logit_bias > 0)
        sampler_apply_bias(row, e->vocab, es->bias_ids, es->bias_vals, p->n_logit_bias);
    sampler_apply_penalties(&e->sampler, &p->sampling, row, q->tokens, q->n_prompt,
                            q->tokens + q->n_prompt, q->n_tokens - q->n_prompt);
    if (es->n_gen < p->min_tokens) { /* no end, nor a stop token, before min_tokens */
        for (int32_t i = 0; i < e->n_eog; i++)
            row[e->eog[i]] = -INFINITY;
        for (int32_t i = 0; i < p->n_stop_ids; i++)
            row[p->stop_ids[i]] = -INFINITY;
    } else if (p->ignore_eos) {
        mask_eog(e, p, row);
    }
    e->n_full++;
    if (es->gs) {
        /* Constrained decoding without a mask where it can: a token sampled
         * from the row as it is, when the grammar allows it, is drawn with
         * the masked row's probabilities (p(t) + (1 - Z) p(t) / Z = p(t) / Z,
         * Z the allowed tokens' mass; greedy: the allowed argmax). Only a
         * rejected draw computes the mask and draws again. Truncation (top_k,
         * top_p, min_p) over the masked row differs from it over the row, so
         * those requests mask first. */
        if (sampling_exact_unmasked(&p->sampling, e->vocab)) {
            const int32_t t = sampler_sample(&e->sampler, &p->sampling, &es->rng, row);
            if (grammar_allows_token(e, es, t)) {
                e->st.grammar_masks_skipped++;
                return t;
            }
        }
        constrain_row(e, es, row);
    }
    return sampler_sample(&e->sampler, &p->sampling, &es->rng, row);
}

static bool emit_token(dp_engine *e, eng_seq *es, int32_t o)
{
    const dp_request_params *p = &es->req->params;
    dp_seq *q = es->seq;
    int32_t tok = sample_row(e, es, o);
    es->n_gen++;
    if (es->n_gen == 1)
        es->t_first = dp_now();

    dp_event *ev = event_new(e, es->req, DP_EV_TOKEN);
    if (!ev) {
        finish_seq(e, es, DP_FINISH_ERROR, "out of memory", false);
        return false;
    }
    ev->token = tok;
    if (p->logprobs >= 0) {
        int32_t k = p->logprobs > DP_MAX_TOP_LOGPROBS ? DP_MAX_TOP_LOGPROBS : p->logprobs;
        int32_t ids[DP_MAX_TOP_LOGPROBS];
        float lps[DP_MAX_TOP_LOGPROBS];
        ev->logprob = sampler_logprobs(&e->sampler, e->raw_row, tok, k, ids, lps);
        ev->n_top = k;
        for (int32_t i = 0; i < k; i++)
            ev->top[i] = (dp_top_logprob){ids[i], lps[i]};
    }
    dp_finish why = DP_FINISH_NONE;
    /* A stop token id ends the output; a special one (an end-of-turn
     * marker) adds no text, like the model's own end of generation. */
    const bool stop_id = p->n_stop_ids > 0 && is_stop_id(p, tok);
    bool eog = (tokenizer_is_eog(e->tok, tok) && !p->ignore_eos) ||
               (stop_id && tokenizer_is_special(e->tok, tok));
    char piece[512];
    char *rel = NULL;
    size_t n_rel = 0;
    bool hit_stop = false; /* a stop string: the text ends at its match */
    if (es->gs && (es->g_dead || !eog)) {
        /* The mask allowed it, so it continues the sentence; a finished
         * sentence ends the generation as a stop would. A mask that allowed
         * nothing, or a parse past its limits, fails the request. */
        int nb = es->g_dead ? -1 : tokenizer_token_bytes(e->tok, tok, false, piece, sizeof piece);
        int grc = nb < 0 || nb > (int)sizeof piece ? DP_ENOSPC
                                                   : gstate_advance(es->gs, piece, (size_t)nb);
        if (grc) {
            event_free(ev);
            finish_seq(e, es, DP_FINISH_ERROR, grc == DP_ENOSPC
                       ? "constrained decoding: the grammar's parse outgrew its limits (too "
                         "ambiguous or too deeply nested)"
                       : "constrained decoding reached a token outside the grammar", false);
            return false;
        }
        if (gstate_done(es->gs))
            why = DP_FINISH_STOP;
    }
    size_t n_piece = 0;
    if (!eog) {
        int n = detok_push(&es->detok, e->tok, tok, piece, sizeof piece);
        n_piece = n > 0 ? (size_t)n : 0;
        es->stop.muted = es->n_gen < p->min_tokens;
        int m = stop_push(&es->stop, piece, n > 0 ? (size_t)n : 0, p->include_stop_str, &rel, &n_rel);
        if (m == 1) {
            why = DP_FINISH_STOP;
            hit_stop = true;
        } else if (stop_id) {
            why = DP_FINISH_STOP; /* its text is part of the output (held text flushed) */
        }
    } else {
        why = DP_FINISH_STOP;
    }
    ev->text = rel ? rel : calloc(1, 1);
    ev->text_len = n_rel;
    if (p->logprobs >= 0 && p->n_stops > 0 && !eog) {
        /* The token's text starts at gen_bytes; a stop string's match ends
         * the output at rel_bytes. */
        ev->text_start = es->gen_bytes;
        es->gen_bytes += (int64_t)n_piece;
        es->rel_bytes += (int64_t)n_rel;
        if (hit_stop) {
            push_pending(e, es, es->rel_bytes);
            ev->past_end = ev->text_start >= es->rel_bytes;
            push_event(e, ev);
        } else if (ev->text_start >= es->rel_bytes) {
            if (es->pend_tail) /* all of it held back: wait for the text */
                es->pend_tail->next = ev;
            else
                es->pend_head = ev;
            es->pend_tail = ev;
        } else {
            push_pending(e, es, -1);
            push_event(e, ev);
        }
    } else {
        push_event(e, ev);
    }
    if (why == DP_FINISH_NONE && (es->n_gen >= p->max_tokens || q->n_tokens + 1 >= e->ctx_len))
        why = DP_FINISH_LENGTH;
    if (why == DP_FINISH_NONE && seq_append(q, tok) != 0) {
        finish_seq(e, es, DP_FINISH_ERROR, "out of memory", false);
        return false;
    }
    if (why != DP_FINISH_NONE) { /* a stop string ends the text at the match */
        finish_seq(e, es, why, NULL, !hit_stop);
        return false;
    }
    return true;
}

/* The step's prompt-logprob rows (after its no sampled rows): each prompt
 * token's logprob given the tokens before it, from the raw logits, reported
 * once per position (a recompute after preemption scores them again and
 * reports nothing new). */
static void emit_prompt_logprobs(dp_engine *e, int32_t no, int32_t ns)
{
    for (int32_t j = 0; j < ns; j++) {
        eng_seq *es = e->sc_seq[j];
        const int32_t pos = e->sc_pos[j] + 1; /* the token this row predicts */
        if (pos != es->n_scored + 1)
            continue;
        const dp_request_params *p = &es->req->params;
        const float *row = e->logits + (size_t)(no + j) * (size_t)e->vocab;
        dp_event *ev = event_new(e, es->req, DP_EV_PROMPT_TOKEN);
        if (!ev) {
            es->n_scored = -1; /* fails after the step: the plan still names it */
            continue;
        }
        const int32_t tok = es->seq->tokens[pos];
        int32_t k = p->prompt_top > DP_MAX_TOP_LOGPROBS ? DP_MAX_TOP_LOGPROBS : p->prompt_top;
        int32_t ids[DP_MAX_TOP_LOGPROBS];
        float lps[DP_MAX_TOP_LOGPROBS];
        ev->token = tok;
        ev->pos = pos;
        ev->logprob = sampler_logprobs(&e->sampler, row, tok, k, ids, lps);
        ev->n_top = k;
        for (int32_t i = 0; i < k; i++)
            ev->top[i] = (dp_top_logprob){ids[i], lps[i]};
        int32_t above = 0;
        for (int32_t v = 0; v < e->vocab; v++)
            above += row[v] > row[tok];
        ev->rank = above + 1;
        ev->text = calloc(1, 1);
        push_event(e, ev);
        es->n_scored = pos;
    }
}

/* ---- the dual path: migration and recompression --------------------------- */

static void record_migration(dp_engine *e, double dt, int32_t n_seqs, int64_t kept, int64_t evicted,
                             int64_t shared, bool recompress, const int64_t *by_scorer, int64_t fallbacks,
                             dp_compaction_kind kind)
{
    int64_t *counts = kind == DP_COMPACT_RECOMPRESS ? e->st.recompressions_by_scorer
                      : !recompress                 ? e->st.migrations_by_scorer
                                                    : NULL; /* a prompt's tail: counted at its switch */
    for (int i = 0; counts && i < DP_N_SCORERS; i++)
        counts[i] += by_scorer[i];
    e->st.scorer_fallbacks[kind] += fallbacks;
    if (recompress) {
        e->st.recompressions += n_seqs;
    } else {
        e->st.migrations += n_seqs;
        e->st.tokens_in_place += shared;
    }
    /* A prompt's kept and evicted tokens: at its migration, or for an early
     * switch at its prompt's end, where they are chosen. */
    e->st.tokens_kept += kept;
    e->st.tokens_evicted += evicted;
    e->st.migration_seconds += dt;
    e->st.migration_batches++;
    int b = 0;
    while (b < DP_MIGRATION_BUCKETS && dt > dp_migration_bucket_bounds[b])
        b++;
    e->st.migration_hist[b]++;
}

/* Slots kept by a compaction of the given kind. */
static int32_t compact_target(const dp_engine *e, const eng_seq *es, dp_compaction_kind kind)
{
    const dp_kv_seq *kv = &es->seq->kv;
    if (kind == DP_COMPACT_RECOMPRESS)
        return kv_mgr_budget_keep(&e->kv, kv);
    if (kind == DP_COMPACT_PROMPT_END)
        return kv_mgr_prompt_end_keep(&e->kv, kv, es->seq->n_prompt);
    if (kind == DP_COMPACT_MIGRATION)
        return kv_mgr_migration_keep(&e->kv, kv, kv->n_slots);
    /* An early switch moves the prompt so far to the decode path whole (in
     * the decode type); what it keeps is chosen at the prompt's end
     * (DP_COMPACT_PROMPT_END), where SnapKV's window is the prompt's last
     * tokens: the question a passage is kept for. Selected with the window
     * at the switch, mid-passage, a passkey lost its digits (0 of 4 found
     * where the switch at the prompt's end found 4: loadtest/early_switch.py). */
    return kv->n_slots;
}


/* usage.dualpath's bytes: the prompt's KV on the decode path (kept tokens
 * in the decode type, at the arena's bytes per decode token, and every
 * token of its exempt layers) against the same tokens whole on the
 * prefill path. */
static void note_kv_bytes(dp_engine *e, eng_seq *es)
{
    kv_mgr_seq_bytes(&e->kv, &es->seq->kv, es->tokens_kept, es->tokens_kept + es->tokens_evicted,
                     &es->kv_bytes, &es->kv_bytes_full);
}

/* Whether another live sequence with the same prompt is still on the
 * prefill path (n > 1 copies, identical requests): it may migrate while this
 * one decodes, so this one's compaction is named for it to share. */
static bool has_twin(dp_engine *e, const eng_seq *es)
{
    const dp_seq *s = es->seq;
    for (const eng_seq *o = e->live; o; o = o->next) {
        const dp_seq *t = o->seq;
        if (o != es && kv_seq_same_compaction(&t->kv, &s->kv) && t->kv.path == DP_PATH_PREFILL &&
            !t->kv.swapped.slots &&
            t->n_prompt == s->n_prompt &&
            memcmp(t->tokens, s->tokens, (size_t)s->n_prompt * sizeof *s->tokens) == 0)
            return true;
    }
    /* Identical requests may still be in the inbox. */
    bool twin = false;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->in_n && !twin; i++) {
        const dp_request *r = e->in_q[i];
        twin = r->n_prompt == s->n_prompt &&
               memcmp(r->prompt, s->tokens, (size_t)s->n_prompt * sizeof *s->tokens) == 0;
    }
    pthread_mutex_unlock(&e->mu);
    return twin;
}

/* Whether a compaction's kept lists are small enough to keep for any later
 * request with the same prompt (a retry, a common question), twin or not:
 * 4 bytes per layer, KV head and kept slot, 256 KiB at most (728 slots of
 * SmolLM2's 30 x 3 heads), held while the sequence decodes. */
static bool small_lists(const dp_engine *e, int32_t n_keep)
{
    const dp_hparams *hp = llama_hparams(e->model);
    return (int64_t)hp->n_layers * hp->n_kv_heads * n_keep * (int64_t)sizeof(int32_t) <= 256 * 1024;
}

/* A prompt's end on the decode path that keeps what it has (already at or
 * below its target, or no free blocks for its compaction): its usage. */
static void note_kept_as_is(dp_engine *e, eng_seq *es)
{
    es->tokens_kept = es->seq->kv.n_slots;
    es->tokens_evicted = es->seq->n_prompt - es->seq->kv.n_slots;
    note_kv_bytes(e, es);
    e->st.tokens_kept += es->tokens_kept;
    e->st.tokens_evicted += es->tokens_evicted;
}

/* Compacts each sequence's cache into the decode pool through the KV
 * manager (one backend call per source pool), with the queries this step
 * captured where the kind scores with them, and records what happened. */
static void compact_seqs(dp_engine *e, eng_seq **list, int32_t n, dp_compaction_kind kind,
                         const float *q, int64_t q_stride)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const bool recompress = kind != DP_COMPACT_MIGRATION && kind != DP_COMPACT_EARLY;
    const size_t q_row = (size_t)hp->n_heads * (size_t)hp->head_dim;
    double t0 = dp_now();
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        dp_kv_migration *g = &e->mig[i];
        *g = (dp_kv_migration){.kv = &es->seq->kv, .tokens = es->seq->tokens,
                               .n_keep = compact_target(e, es, kind)};
        g->share_kept = kind == DP_COMPACT_MIGRATION && (small_lists(e, g->n_keep) || has_twin(e, es));
        g->pos = kind == DP_COMPACT_PROMPT_END ? es->seq->n_computed : 0;
        if (q && es->capture_at >= 0) {
            g->q = q + (size_t)es->capture_at * q_row;
            g->q_stride = q_stride;
            g->n_q = es->n_capture;
        }
    }
    int32_t moved = kv_mgr_migrate(&e->kv, e->mig, n);
    int64_t by_scorer[DP_N_SCORERS] = {0}, fallbacks = 0, kept = 0, evicted = 0, shared = 0;
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        const dp_kv_migration *g = &e->mig[i];
        if (g->lost)
            finish_seq(e, es, DP_FINISH_ERROR, "its KV cache was lost in a recompression", false);
        if (g->rc) {
            if (kind == DP_COMPACT_PROMPT_END && !g->lost)
                note_kept_as_is(e, es); /* no free blocks: its new text stays whole */
            continue;
        }
        if (g->scorer != g->kv->copts.scorer) {
            fallbacks++;
            dp_log(DP_LOG_DEBUG, "engine: request %llu: %s scored by %s (no captured queries)",
                   (unsigned long long)es->req->id, dp_compaction_names[kind],
                   scorer_name(g->scorer));
        }
        by_scorer[g->scorer]++;
        if (!recompress) {
            if (kind == DP_COMPACT_EARLY) {
                /* Nothing is evicted before the prompt's end chooses (a
                 * request that ends at its first token keeps it all). */
                es->tokens_kept = es->seq->n_prompt;
                es->tokens_evicted = 0;
            } else {
                es->tokens_kept = g->n_keep;
                es->tokens_evicted = es->seq->n_computed - g->n_keep;
                kept += es->tokens_kept;
                evicted += es->tokens_evicted;
            }
            note_kv_bytes(e, es);
            shared += g->n_ref;
            path_set(&es->path, DP_PS_DECODE);
        } else if (kind == DP_COMPACT_PROMPT_END) {
            es->tokens_evicted = es->seq->n_prompt - g->n_keep;
            es->tokens_kept = g->n_keep;
            note_kv_bytes(e, es);
            kept += es->tokens_kept;
            evicted += es->tokens_evicted;
        }
    }
    if (moved > 0)
        record_migration(e, dp_now() - t0, moved, kept, evicted, shared, recompress, by_scorer,
                         fallbacks, kind);
}

/* Prompts whose ends came on the decode path (an early switch, a resumed
 * turn) are compacted to their keep ratio there; one already at or below it
 * (a resumed turn whose history was compressed more) keeps what it has. */
static void end_prompts_on_decode(dp_engine *e, eng_seq **list, int32_t n, const float *q,
                                  int64_t q_stride)
{
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        eng_seq *es = list[i];
        if (compact_target(e, es, DP_COMPACT_PROMPT_END) < es->seq->kv.n_slots) {
            list[k++] = es;
            continue;
        }
        note_kept_as_is(e, es);
    }
    if (k > 0)
        compact_seqs(e, list, k, DP_COMPACT_PROMPT_END, q, q_stride);
}

/* A prompt chunk of a prefill-path sequence that the path detector may
 * switch early when it ends. */
static bool may_switch_early(const dp_engine *e, const eng_seq *es, const dp_sched_item *it)
{
    return es->seq->kv.dual && it->path == DP_PATH_PREFILL && !it->emits &&
           path_may_switch(&es->path, &e->popts, it->start + it->n, es->seq->n_prompt);
}

/* Updates the detector's kept-set change for a prefill-path sequence from the
 * selection its scorer makes over what has been computed so far (SnapKV
 * with the queries of the chunk's end, captured this step: q, q_stride). */
static int early_signal(dp_engine *e, eng_seq *es, const float *q, int64_t q_stride)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const dp_kv_seq *kv = &es->seq->kv;
    int32_t rows = hp->n_layers * hp->n_kv_heads;
    int32_t k = compress_n_keep(&kv->copts, kv->n_slots);
    int32_t *cur = malloc((size_t)rows * (size_t)k * sizeof *cur);
    if (!cur)
        return DP_ENOMEM;
    dp_compress_opts co = kv->copts;
    int32_t nq = 0, qslot[DP_MAX_CAPTURE];
    const float *qs = NULL;
    if (co.scorer == DP_SCORER_SNAPKV && es->capture_at >= 0) {
        nq = es->n_capture < DP_MAX_CAPTURE ? es->n_capture : DP_MAX_CAPTURE;
        if (nq > kv->n_slots)
            nq = kv->n_slots;
        qs = q + (size_t)(es->capture_at + es->n_capture - nq) * (size_t)hp->n_heads *
                     (size_t)hp->head_dim;
        for (int32_t j = 0; j < nq; j++)
            qslot[j] = kv->n_slots - nq + j;
    }
    e->st.early_signals++;
    if (co.scorer == DP_SCORER_SNAPKV && nq == 0)
        e->st.scorer_fallbacks[DP_COMPACT_EARLY_SIGNAL]++; /* scored by key norm */
    if (kv_mgr_select(&e->kv, kv, &co, qs, q_stride, nq ? qslot : NULL, nq, k, cur) != 0) {
        free(cur);
        return DP_ENOMEM;
    }
    if (es->prev_keep)
        es->path.last_change = path_kept_change(es->prev_keep, es->prev_k, cur, k, rows);
    free(es->prev_keep);
    es->prev_keep = cur;
    es->prev_k = k;
    return 0;
}

/* The decode queries this step captured are scored against their
 * sequences' caches (their K/V now written) for the next recompression. */
static void note_decode_queries(dp_engine *e, const dp_sched_plan *plan, int32_t nc)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const size_t q_row = (size_t)hp->n_heads * (size_t)hp->head_dim;
    const float *q = llama_captured_queries(e->model);
    const int64_t q_stride = (int64_t)nc * (int64_t)q_row;
    int64_t missed = 0;
    for (int32_t i = 0; i < plan->n_items; i++) {
        eng_seq *es = plan->items[i].seq->owner;
        if (es->dq_at < 0 || es->seq->state != DP_SEQ_RUNNING)
            continue;
        if (kv_mgr_note_query(&e->kv, &es->seq->kv, q + (size_t)es->dq_at * q_row, q_stride,
                              es->dq_slot))
            missed++; /* no memory for its sums: scored with fewer queries */
        es->dq_at = -1;
    }
    if (missed || e->dq_missed) {
        e->st.decode_queries_missed += missed + e->dq_missed;
        e->dq_missed = 0;
    }
}

/* Sequences over the decode budget are compressed back below it. */
static void recompress_over_budget(dp_engine *e)
{
    if (!e->dual || e->opts.decode_budget <= 0)
        return;
    eng_seq **list = e->lists[0];
    int32_t n = 0;
    for (eng_seq *es = e->live; es && n < e->opts.max_seqs; es = es->next) {
        const dp_seq *q = es->seq;
        if (q->state == DP_SEQ_RUNNING && kv_mgr_over_budget(&e->kv, &q->kv) &&
            q->n_computed == q->n_tokens - 1)
            list[n++] = es;
    }
    if (n > 0)
        compact_seqs(e, list, n, DP_COMPACT_RECOMPRESS, NULL, 0);
}

/* ---- one step ------------------------------------------------------------- */

/* *a grown to hold n entries (*cap: what it holds). */
static int grow_i32(int32_t **a, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    int32_t *t = realloc(*a, n * sizeof *t);
    if (!t)
        return DP_ENOMEM;
    *a = t;
    *cap = n;
    return 0;
}

/* Room for a step's block tables: n entries, and nx of exempt tables. */
static int ensure_tables(dp_engine *e, size_t n, size_t nx)
{
    return grow_i32(&e->b_tables, &e->b_tables_cap, n) ? DP_ENOMEM
                                                        : grow_i32(&e->x_tables, &e->x_tables_cap, nx);
}

static void fail_all(dp_engine *e, const char *why)
{
    while (e->live)
        finish_seq(e, e->live, DP_FINISH_ERROR, why, false);
}

#define LOST_MSG "the device is lost; the server must be restarted"

/* The backend said DP_EDEVICE: everything fails, now and from now on. */
static void lose_device(dp_engine *e)
{
    dp_log(DP_LOG_ERROR, "engine: the device is lost; failing every request");
    atomic_store(&e->device_lost, true);
    fail_all(e, LOST_MSG);
}

/* A backend whose failures linger clears a survived one before a step's
 * work; a lost device stops everything. */
static bool device_ok(dp_engine *e)
{
    if (atomic_load(&e->device_lost))
        return false;
    if (!e->be->ops->recover || e->be->ops->recover(e->be) != DP_EDEVICE)
        return true;
    lose_device(e);
    return false;
}

/* A forward pass failed. A lost device (DP_EDEVICE: its context cannot be
 * used again) fails everything and every later request, and the server
 * exits so that it is restarted. Any other error (the backend is fine, this
 * step was not: an allocation that failed) fails the step's sequences only;
 * waiting ones run in later steps. */
static void step_failed(dp_engine *e, const dp_sched_plan *plan, int rc)
{
    if (rc == DP_EDEVICE) {
        lose_device(e);
        return;
    }
    /* Cleared now, not at the next step: with nothing left to run, a
     * recovery that finds the device lost would otherwise wait for a request. */
    if (!device_ok(e))
        return;
    dp_log(DP_LOG_ERROR, "engine: a forward pass failed (%s); failing its %d sequences",
           dp_strerror(rc), plan->n_items);
    e->st.failed_steps++;
    for (int32_t i = 0; i < plan->n_items; i++) {
        eng_seq *es = (eng_seq *)plan->items[i].seq->owner;
        if (es)
            finish_seq(e, es, DP_FINISH_ERROR, "internal error in the forward pass", false);
    }
    /* An error the backend calls survivable that comes back step after step
     * (a launch refused for its configuration is a bug, not bad luck) would
     * fail every request for ever while /health says ok: taken as a lost
     * device instead, so that the daemon exits and is restarted. */
    if (++e->failed_streak >= DP_ENGINE_FAIL_STREAK) {
        dp_log(DP_LOG_ERROR, "engine: %d forward passes failed in a row (the last: %s)",
               e->failed_streak, dp_strerror(rc));
        lose_device(e);
    }
}

static void publish_stats(dp_engine *e);

static void run_step(dp_engine *e)
{
    double t0 = dp_now();
    if (!device_ok(e))
        return;
    recompress_over_budget(e);
    dp_sched_plan plan;
    sched_schedule(&e->sched, &plan);
    /* The gauges describe the step now running: a step that prefills the
     * requests it just admitted can take most of a second on a CPU, and
     * until its end they would still read as waiting. */
    publish_stats(e);
    if (plan.n_items == 0) {
        /* Nothing fits. If nothing runs either, the head of the queue can
         * never fit (submit checks against the pools, so this is a safety
         * net); otherwise free the newest running sequence so that the
         * others can finish. */
        if (!e->sched.run_head) {
            if (e->sched.wait_head)
                finish_seq(e, (eng_seq *)e->sched.wait_head->owner, DP_FINISH_ERROR,
                           "the KV pool cannot hold this request", false);
            return;
        }
        sched_preempt(&e->sched, e->sched.run_tail);
        return;
    }
    int32_t max_blocks = 1, x_max = 1;
    for (int32_t i = 0; i < plan.n_items; i++) {
        const dp_kv_seq *kv = &plan.items[i].seq->kv;
        if (kv->table.n_blocks > max_blocks)
            max_blocks = kv->table.n_blocks;
        const int32_t xn = kv_seq_has_x(kv) ? kv_mgr_x_row(&e->kv, kv, NULL, 0) : 0;
        if (xn > x_max)
            x_max = xn;
    }
    /* Exempt layers: rows of the sequences without an exempt table repeat
     * their own. */
    const bool x = kv_mgr_exempt_layers(&e->kv) > 0;
    if (x && max_blocks > x_max)
        x_max = max_blocks;
    if (ensure_tables(e, (size_t)plan.n_items * (size_t)max_blocks,
                      x ? (size_t)plan.n_items * (size_t)x_max : 0)) {
        fail_all(e, "out of memory");
        return;
    }
    int32_t nt = 0, no = 0, nc = 0, ns = 0;
    for (int32_t i = 0; i < plan.n_items; i++) {
        const dp_sched_item *it = &plan.items[i];
        dp_seq *q = it->seq;
        eng_seq *es = q->owner;
        if (!es->started) {
            es->started = true;
            atomic_fetch_sub(&e->queued, 1);
        }
        if (q->n_preemptions != es->seen_preemptions) {
            es->seen_preemptions = q->n_preemptions;
            path_set(&es->path, DP_PS_PREEMPTED);
            if (q->kv.path == DP_PATH_DECODE) {
                path_set(&es->path, DP_PS_DECODE); /* swapped back in as it was */
            } else {
                path_set(&es->path, DP_PS_WAITING);
                es->tail_on_decode = false;
                es->resumed = false; /* recomputed: decided again at its admission */
            }
        }
        if (es->path.state == DP_PS_WAITING)
            path_set(&es->path, DP_PS_PREFILL);
        /* Admitted on the decode path with prompt left: it continues its
         * conversation's parked turn (kv_mgr_park); the rest of its prompt
         * runs there, as after an early switch. */
        if (!it->decode_phase && it->path == DP_PATH_DECODE && it->start < q->n_prompt &&
            !es->tail_on_decode) {
            es->tail_on_decode = true;
            es->resumed = true;
            path_set(&es->path, DP_PS_DECODE);
        }
        /* Its prompt positions before the last yield prompt-logprob rows
         * (as many as the scheduler gave room for). */
        int32_t scored = it->decode_phase ? 0 : sched_score_rows(q, it->n);
        for (int32_t k = 0; k < it->n; k++) {
            if (k < scored) {
                e->sc_out[ns] = nt;
                e->sc_pos[ns] = it->start + k;
                e->sc_seq[ns++] = es;
            }
            e->b_tokens[nt] = q->tokens[it->start + k];
            e->b_pos[nt] = it->start + k;
            e->b_slot[nt] = it->slot_start + k;
            if (x) /* exempt layers: position p at x slot p */
                e->x_slot[nt] = kv_seq_has_x(&q->kv) ? q->kv.x_n + k : it->slot_start + k;
            e->b_seq[nt] = i;
            nt++;
        }
        /* The last queries of a prompt feed SnapKV scoring at the switch
         * (or, for a sequence that switched early, at its prompt's end), and
         * so do a chunk's where the path detector measures the kept set. */
        es->capture_at = -1;
        if (!it->decode_phase && q->kv.dual && es->capture_w > 0 &&
            (it->emits ? it->path == DP_PATH_PREFILL || es->tail_on_decode
                       : may_switch_early(e, es, it) &&
                             path_wants_stability(&es->path, &e->popts, it->start + it->n,
                                                  es->seq->n_prompt))) {
            int32_t w = es->capture_w < it->n ? es->capture_w : it->n;
            if (w > e->capture_cap - nc)
                w = e->capture_cap - nc; /* cannot happen: capacity covers every window */
            if (w > 0) {
                es->capture_at = nc;
                es->n_capture = w;
                for (int32_t k = 0; k < w; k++)
                    e->b_capture[nc++] = nt - w + k;
            }
        }
        /* Under a decode budget SnapKV scores each recompression with the
         * sequence's last window of decode queries (kv_mgr_note_query). */
        es->dq_at = -1;
        if (it->decode_phase && it->n == 1 && kv_mgr_wants_query(&e->kv, &q->kv)) {
            if (nc < e->capture_cap) {
                es->dq_at = nc;
                es->dq_slot = it->slot_start;
                e->b_capture[nc++] = nt - 1;
            } else {
                e->dq_missed++; /* a step full of prompt windows: one query fewer */
            }
        }
        if (it->emits) {
            const dp_request_params *p = &es->req->params;
            e->t_temp[no] = p->sampling.temperature;
            e->t_mask[no] = p->ignore_eos && !needs_full_row(p);
            e->t_seq[no] = es;
            e->b_out[no++] = nt - 1;
        }
        e->b_store[i] = kv_seq_store(&q->kv, it->path);
        e->b_sealed[i] = q->kv.sealed;
        e->b_roff[i] = q->kv.roff;
        int32_t *row = e->b_tables + (size_t)i * (size_t)max_blocks;
        memcpy(row, q->kv.table.blocks, (size_t)q->kv.table.n_blocks * sizeof *row);
        for (int32_t k = q->kv.table.n_blocks; k < max_blocks; k++)
            row[k] = 0;
        if (x) {
            int32_t *xr = e->x_tables + (size_t)i * (size_t)x_max, nx;
            if (kv_seq_has_x(&q->kv)) {
                nx = kv_mgr_x_row(&e->kv, &q->kv, xr, x_max);
                e->x_store[i] = kv_seq_xstore(&q->kv);
            } else {
                nx = q->kv.table.n_blocks;
                memcpy(xr, row, (size_t)nx * sizeof *xr);
                e->x_store[i] = e->b_store[i];
            }
            for (int32_t k = nx; k < x_max; k++)
                xr[k] = -1; /* never addressed: llama.c's check refuses a step that would */
        }
    }
    memcpy(e->b_out + no, e->sc_out, (size_t)ns * sizeof *e->sc_out);
    dp_batch b = {.n_tokens = nt, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq,
                  .slot = e->b_slot, .n_seqs = plan.n_items, .seq_store = e->b_store,
                  .block_tables = e->b_tables, .max_blocks = max_blocks, .n_out = no + ns,
                  .out_tokens = e->b_out, .n_capture = nc, .capture_tokens = e->b_capture,
                  .n_exempt = kv_mgr_exempt_layers(&e->kv), .x_slot = e->x_slot, .x_seq_store = e->x_store,
                  .x_block_tables = e->x_tables, .x_max_blocks = x_max,
                  .seq_sealed = e->b_sealed, .seq_roff = e->b_roff};
    dp_kv_store *stores[DP_KV_MAX_STORES];
    kv_mgr_stores(&e->kv, stores);
    double tf = dp_now();
    /* With device sampling the step ends in the candidates (the ignore_eos
     * rows masked on the device); the rows stay there for whoever needs
     * them. Each row's path depends only on its own request and logits. */
    /* Prompt logprobs need whole rows: such a step downloads them all. */
    e->step_topk = e->opts.device_sampling && e->be->ops->logits_topk && no > 0 && ns == 0;
    e->n_cand = e->n_fallback = e->n_full = 0;
    int rc;
    if (e->step_topk)
        rc = llama_forward_topk(e->model, &b, stores, e->topk_k, e->t_temp, e->eog, e->n_eog,
                                e->n_eog > 0 ? e->t_mask : NULL, e->t_ids, e->t_vals, e->t_max,
                                e->t_sum);
    else
        rc = llama_forward(e->model, &b, stores, e->logits);
    double tf_end = dp_now();
    if (rc == 0 && e->step_topk)
        rc = decide_rows(e, e->t_seq, no);
    if (atomic_exchange(&e->debug_lose, false))
        rc = DP_EDEVICE;
    if (rc) {
        sched_abort(&e->sched, &plan);
        step_failed(e, &plan, rc);
        return;
    }
    sched_commit(&e->sched, &plan);
    e->failed_streak = 0;
    note_decode_queries(e, &plan, nc);
    if (ns > 0)
        emit_prompt_logprobs(e, no, ns);
    int64_t prompt_toks = 0, gen_toks = 0;
    eng_seq **migrate = e->lists[0], **early = e->lists[1], **tail_done = e->lists[2];
    int32_t n_migrate = 0, n_early = 0, n_tail = 0;
    const dp_hparams *hp = llama_hparams(e->model);
    const float *captured = llama_captured_queries(e->model);
    const int64_t q_stride = (int64_t)nc * hp->n_heads * hp->head_dim;
    for (int32_t i = 0, o = 0; i < plan.n_items; i++) {
        const dp_sched_item *it = &plan.items[i];
        if (!it->decode_phase)
            prompt_toks += it->n;
        if (((eng_seq *)it->seq->owner)->n_scored < 0) {
            o += it->emits;
            finish_seq(e, it->seq->owner, DP_FINISH_ERROR, "out of memory", false);
            continue;
        }
        if (!it->emits) {
            /* A prompt chunk ended: the detector may switch the sequence
             * early (the kept set is measured only where it decides). */
            eng_seq *es = it->seq->owner;
            if (may_switch_early(e, es, it) &&
                (!path_wants_stability(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) ||
                 early_signal(e, es, captured, q_stride) == 0) &&
                path_decide(&es->path, &e->popts, it->seq->n_computed, it->seq->n_prompt) != DP_STAY &&
                kv_mgr_can_switch_early(&e->kv, &es->seq->kv))
                early[n_early++] = es;
            continue;
        }
        eng_seq *es = it->seq->owner;
        if (es->req->params.max_tokens == 0) { /* the prompt alone (scored) */
            o++;
            finish_seq(e, es, DP_FINISH_LENGTH, NULL, false);
            continue;
        }
        gen_toks++;
        bool alive = emit_token(e, es, o++);
        /* The prompt is done: the sequence switches to the decode path (or,
         * having switched early, compacts its uncompressed tail). */
        /* (A recompute whose prompt came back from the prefix cache whole
         * has only a generated token left: it migrates at that step.) */
        if (alive && it->path == DP_PATH_PREFILL && es->seq->kv.dual)
            migrate[n_migrate++] = es;
        if (alive && !it->decode_phase && it->path == DP_PATH_DECODE && es->tail_on_decode) {
            tail_done[n_tail++] = es;
            es->tail_on_decode = false;
        }
    }
    if (n_early > 0) {
        compact_seqs(e, early, n_early, DP_COMPACT_EARLY, captured, q_stride);
        int32_t switched = 0;
        int64_t at = 0;
        for (int32_t i = 0; i < n_early; i++) {
            early[i]->tail_on_decode = early[i]->seq->kv.path == DP_PATH_DECODE;
            switched += early[i]->tail_on_decode;
            at += early[i]->tail_on_decode ? early[i]->seq->n_computed : 0;
        }
        e->st.early_switches += switched;
        e->st.early_switch_tokens += at;
    }
    if (n_tail > 0)
        end_prompts_on_decode(e, tail_done, n_tail, captured, q_stride);
    if (n_migrate > 0)
        compact_seqs(e, migrate, n_migrate, DP_COMPACT_MIGRATION, captured, q_stride);
    e->st.steps++;
    e->st.prompt_tokens += prompt_toks;
    e->st.generation_tokens += gen_toks;
    e->st.busy_seconds += dp_now() - t0;
    e->st.forward_seconds += tf_end - tf;
    e->st.sampled_candidates += e->n_cand;
    e->st.sampled_fallback += e->n_fallback;
    e->st.sampled_full_row += e->n_full;
    if (e->be->ops->step_graphs) {
        dp_graph_stats gs;
        e->be->ops->step_graphs(e->be, -1, &gs);
        e->st.graph_recorded = (int64_t)gs.recorded;
        e->st.graph_replayed = (int64_t)gs.replayed;
        e->st.graph_abandoned = (int64_t)gs.abandoned;
    }
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
static void publish_stats(dp_engine *e)
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
            publish_stats(e);
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
                    push_event(e, ev);
                }
                atomic_fetch_sub(&e->queued, 1);
                request_unref(batch[i]);
            }
        /* Cancellations (and everything, when stopping). */
        for (eng_seq *es = e->live, *nx; es; es = nx) {
            nx = es->next;
            if (stop || atomic_load(&es->req->cancelled))
                finish_seq(e, es, DP_FINISH_CANCELLED, NULL, false);
        }
        if (stop)
            break;
        if (atomic_load(&e->device_lost))
            fail_all(e, LOST_MSG); /* what the inbox brought since */
        else if (!sched_idle(&e->sched))
            run_step(e);
        publish_stats(e);
        /* After every iteration that produced events, even when the consumer
         * already took them (it may have, between a push and this point): the
         * notification then tells it that the gauges include them. */
        if (e->pushed && e->notify)
            e->notify(e->notify_ud);
        e->pushed = false;
    }
    publish_stats(e);
    if (e->notify)
        e->notify(e->notify_ud);
    free(batch);
    return NULL;
}

/* ---- public API ----------------------------------------------------------- */

/* ---- start-up memory plan -------------------------------------------------
 * Device memory is planned once, in this order: the weights and the
 * activations for max_batched_tokens (both allocated by llama_init, before
 * the engine exists), then the two KV pools, which split what is left. With
 * kv_bytes 0 (auto) "what is left" is gpu_memory_fraction of the device's
 * total memory less everything in use now (this process's weights,
 * activations and context, and any other process), less a reserve for the
 * backend's scratch buffers that grow at first use (fp16 copies of
 * activations, attention partials, scoring rows, the BLAS workspace). */

#define ENGINE_KV_AUTO_HOST ((int64_t)1 << 30)
#define ENGINE_KV_RESERVE ((int64_t)256 << 20)
#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

static int plan_kv_bytes(dp_backend *be, double fraction, int64_t *out, char *err, size_t errsz)
{
    size_t free_b = 0, total_b = 0;
    if (!be->ops->mem_info || be->ops->mem_info(be, &free_b, &total_b) || total_b == 0) {
        *out = ENGINE_KV_AUTO_HOST;
        dp_log(DP_LOG_INFO, "engine: kv_memory auto: %s backend reports no device memory; "
               "using %.0f MiB", be->ops->name, MIB(*out));
        return 0;
    }
    if (fraction <= 0.0 || fraction > 1.0)
        return dp_err(err, errsz, DP_EINVAL, "engine: gpu_memory_fraction %g is not in (0, 1]",
                      fraction);
    const int64_t used = (int64_t)(total_b - (free_b < total_b ? free_b : total_b));
    const int64_t budget = (int64_t)(fraction * (double)total_b);
    const int64_t kv = budget - used - ENGINE_KV_RESERVE;
    dp_log(DP_LOG_INFO, "engine: kv_memory auto: %.0f MiB = %.2f x %.0f MiB total - %.0f MiB in "
           "use - %.0f MiB reserve", MIB(kv > 0 ? kv : 0), fraction, MIB(total_b), MIB(used),
           MIB(ENGINE_KV_RESERVE));
    if (kv <= 0)
        return dp_err(err, errsz, DP_ENOMEM,
                      "engine: no device memory left for the KV cache (%.0f MiB in use of %.0f "
                      "MiB, gpu_memory_fraction %g); raise gpu_memory_fraction or set kv_memory",
                      MIB(used), MIB(total_b), fraction);
    *out = kv;
    return 0;
}

/* The decode path's "auto" where the backend keeps quantized decode types
 * and they were measured there (kv_quant_default: the CPU's; CUDA's have not
 * run on a device yet), over an f16 cache: kivi4 (K per channel and V per
 * token in 4-bit groups, the lead and the newest tokens f16; 0.30-0.38 of the
 * f16 bytes at KL 0.007-0.008 nats/token, needles and multi-turn recall as
 * the whole cache: docs/dualpath.md), else q8_0 (0.53 at KL 0.0045); where
 * the manager refuses kivi4 with the other settings, engine_init takes q8_0
 * (decode_auto_fallback). An f32 cache asked for exactness and keeps its
 * type. */
static dp_kv_type decode_auto_type(dp_backend *be, const dp_kv_layout *l, const dp_engine_opts *o)
{
    if (o->kv_type != DP_KV_F16 || !be->ops->kv_view || !be->ops->kv_quant_default)
        return (dp_kv_type)o->kv_type;
    dp_kv_layout q = *l;
    q.n_blocks = 1;
    q.type = DP_KV_KIVI4;
    if (be->ops->kv_bytes_per_block(be, &q))
        return DP_KV_KIVI4;
    q.type = DP_KV_Q8_0;
    return be->ops->kv_bytes_per_block(be, &q) ? DP_KV_Q8_0 : (dp_kv_type)o->kv_type;
}

/* auto's kivi4 becomes q8_0 where the manager would refuse it (a decode
 * pool of its own, a decode budget, exempt layers, a block no group fits
 * in: kv_mgr_check_grouped) or the path detector may switch early (a
 * grouped prompt is compacted once, at its end): no combination of
 * settings keeps the daemon from starting. */
static void decode_auto_fallback(dp_backend *be, const dp_engine_opts *o, dp_kv_mgr_opts *ko)
{
    if (o->decode_kv_type != ENGINE_DECODE_KV_AUTO || !dp_kv_type_grouped(ko->decode.type))
        return;
    if (o->early_switch || kv_mgr_check_grouped(be, ko, NULL, 0))
        ko->decode.type = DP_KV_Q8_0;
}

/* The layout of a pool's store: the model's geometry, the configured type
 * (the decode path's auto: decode_auto_type). */
static dp_kv_layout kv_layout_of(dp_backend *be, const dp_llama *m, const dp_engine_opts *o,
                                 int32_t block_tokens, int32_t n_blocks, bool decode)
{
    dp_kv_layout l = llama_kv_layout(m, block_tokens, n_blocks);
    l.type = o->kv_type;
    if (decode && o->decode_kv_type >= 0)
        l.type = o->decode_kv_type;
    else if (decode && o->decode_kv_type == ENGINE_DECODE_KV_AUTO)
        l.type = decode_auto_type(be, &l, o);
    return l;
}

/* The context a request may use is what the KV memory can hold for one
 * sequence (as llama.cpp's -c and vLLM's max_model_len are): otherwise a chat
 * request without max_tokens (max_tokens = the rest of the context) could
 * never be admitted and would be refused, however short. The test is the
 * manager's need formula at both extremes: the longest prompt with one token
 * to generate, and a one-token prompt generating the rest (a sequence too
 * long to migrate runs whole, so dualpath never caps the context lower than
 * off in one arena). */
static void cap_context(dp_engine *e)
{
    dp_kv_seq kv;
    kv_seq_init(&kv, e->dual, &e->opts.compress);
    int64_t c = e->ctx_len;
    while (c > 1 && !(kv_mgr_can_fit(&e->kv, &kv, c - 1, 1) && kv_mgr_can_fit(&e->kv, &kv, 1, c - 1)))
        c--;
    kv_seq_destroy(&kv);
    if (c < e->ctx_len) {
        dp_log(DP_LOG_WARN, "engine: context capped at %lld tokens (the model's is %d): that is what "
               "the KV memory holds for one sequence; give more kv_memory for longer ones",
               (long long)c, e->ctx_len);
        e->ctx_len = (int32_t)c;
    }
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
    int rc;
    if (opts->max_batched_tokens > llama_max_tokens(model) || opts->max_seqs > llama_max_out(model)) {
        rc = dp_err(err, errsz, DP_EINVAL,
                    "engine: model sized for %d tokens / %d outputs per step, engine wants %d / %d",
                    llama_max_tokens(model), llama_max_out(model), opts->max_batched_tokens,
                    opts->max_seqs);
        goto fail;
    }
    e->dual = opts->dualpath;
    if (e->dual && (opts->compress.keep_ratio <= 0.0f || opts->compress.keep_ratio > 1.0f ||
                    opts->prefill_fraction <= 0.0 || opts->prefill_fraction >= 1.0)) {
        rc = dp_err(err, errsz, DP_EINVAL, "engine: bad dual-path settings (keep_ratio %g, "
                    "prefill fraction %g)", opts->compress.keep_ratio, opts->prefill_fraction);
        goto fail;
    }
    /* A quantized whole cache is dualpath off's (llama.cpp's -ctk q8_0):
     * the prefill path keeps f16 or f32, and the decode path's type is
     * decode_kv_type. */
    if (e->dual && dp_kv_type_quantized(opts->kv_type)) {
        rc = dp_err(err, errsz, DP_EINVAL, "engine: kv_cache_type %s keeps the whole cache "
                    "quantized and needs dualpath = false; with the dual path the prefill path "
                    "keeps f16 or f32 and decode_kv_type sets the decode path's type",
                    dp_kv_type_name(opts->kv_type));
        goto fail;
    }
    /* The path detector's settings (the KV manager plans predicted early
     * switches with its min_tokens). */
    if (e->dual) {
        path_opts_default(&e->popts);
        e->popts.early_switch = opts->early_switch;
        if (opts->early_min_tokens > 0)
            e->popts.min_tokens = opts->early_min_tokens;
    }
    int64_t kv_bytes = opts->kv_bytes;
    if (kv_bytes <= 0 && (opts->n_blocks <= 0 || (e->dual && opts->n_blocks_decode <= 0)) &&
        (rc = plan_kv_bytes(e->be, opts->gpu_memory_fraction, &kv_bytes, err, errsz)))
        goto fail;
    int32_t dbt = opts->decode_block_tokens > 0 ? opts->decode_block_tokens : opts->block_tokens;
    dp_kv_mgr_opts ko = {
        .prefill = kv_layout_of(e->be, model, opts, opts->block_tokens, opts->n_blocks, false),
        .decode = kv_layout_of(e->be, model, opts, dbt, opts->n_blocks_decode, true),
        .kv_bytes = kv_bytes,
        .dual = e->dual,
        .prefill_fraction = opts->prefill_fraction,
        .ctx_len = e->ctx_len,
        .decode_budget = opts->decode_budget,
        .budget_floor = opts->compress.sinks + opts->compress.window,
        .prefix_cache = opts->prefix_cache,
        .host_tier_bytes = opts->host_tier_bytes,
        .swap_bytes = opts->swap_bytes,
        .reuse_replies = opts->reuse_replies,
        .n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .n_heads = hp->n_heads,
        .head_dim = hp->head_dim,
        .early_min = e->popts.min_tokens, .early_chunk = opts->max_batched_tokens,
        .max_parked = opts->resume_turns ? ENGINE_MAX_PARKED : 0,
        .exempt_layers = e->dual ? opts->exempt_layers : 0,
    };
    decode_auto_fallback(e->be, opts, &ko);
    /* A grouped type's prompt is compacted once, at its end, where its
     * groups are sealed: it never switches early. */
    if (e->dual && opts->early_switch && dp_kv_type_grouped(ko.decode.type)) {
        rc = dp_err(err, errsz, DP_EUNSUPPORTED, "engine: decode_kv_type %s compacts a prompt "
                    "once, at its end, and does not switch early: set early_switch = false or "
                    "another decode_kv_type", dp_kv_type_name(ko.decode.type));
        goto fail;
    }
    if ((rc = kv_mgr_init(&e->kv, e->be, &ko, err, errsz)))
        goto fail;
    if (kv_mgr_shared(&e->kv) && opts->prefill_fraction != 0.25)
        dp_log(DP_LOG_WARN, "engine: prefill_pool_fraction %g has no effect: both paths share one "
               "KV arena (it splits the memory only when decode_block_tokens differs from "
               "block_tokens with one KV type for both paths)", opts->prefill_fraction);
    const int32_t held = kv_mgr_decode_block_tokens(&e->kv);
    if (kv_mgr_shared(&e->kv) && ko.decode.type != ko.prefill.type && opts->decode_block_tokens != 16 &&
        opts->decode_block_tokens != held)
        dp_log(DP_LOG_WARN, "engine: decode_block_tokens %d has no effect: a %s decode path "
               "holds %d tokens in each block of the shared arena", opts->decode_block_tokens,
               dp_kv_type_name(ko.decode.type), held);
    kv_mgr_log_plan(&e->kv);
    cap_context(e);
    /* The model's logits rows beyond one per sequence score prompts. */
    e->score_rows = llama_max_out(model) - opts->max_seqs;
    dp_sched_opts so = {opts->max_batched_tokens, opts->max_seqs, e->score_rows};
    size_t T = (size_t)opts->max_batched_tokens, S = (size_t)opts->max_seqs;
    size_t R = (size_t)llama_max_out(model);
    e->logits = malloc(R * (size_t)e->vocab * sizeof(float));
    e->sc_out = malloc((e->score_rows > 0 ? (size_t)e->score_rows : 1) * sizeof(int32_t));
    e->sc_pos = malloc((e->score_rows > 0 ? (size_t)e->score_rows : 1) * sizeof(int32_t));
    e->sc_seq = malloc((e->score_rows > 0 ? (size_t)e->score_rows : 1) * sizeof *e->sc_seq);
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
        if (tokenizer_is_eog(tok, t))
            e->eog[e->n_eog++] = t;
    e->b_tokens = malloc(T * sizeof(int32_t));
    e->b_pos = malloc(T * sizeof(int32_t));
    e->b_seq = malloc(T * sizeof(int32_t));
    e->b_slot = malloc(T * sizeof(int32_t));
    e->b_out = malloc(R * sizeof(int32_t));
    e->b_store = calloc(S, 1);
    e->b_sealed = calloc(S, sizeof(int32_t));
    e->b_roff = calloc(S, sizeof(int32_t));
    e->x_store = calloc(S, 1);
    e->x_slot = malloc(T * sizeof(int32_t));
    e->capture_cap = llama_capture_capacity(model);
    e->b_capture = malloc((size_t)e->capture_cap * sizeof(int32_t));
    for (int i = 0; i < 3; i++)
        e->lists[i] = malloc(S * sizeof(eng_seq *));
    e->mig = malloc(S * sizeof *e->mig);
    e->in_cap = 64;
    e->in_q = malloc((size_t)e->in_cap * sizeof *e->in_q);
    if (sched_init(&e->sched, &so, &e->kv) ||
        sampler_init(&e->sampler, e->vocab) || !e->logits || !e->b_capture || !e->lists[0] ||
        !e->mig ||
        !e->lists[1] || !e->lists[2] ||
        !e->raw_row || !e->t_temp || !e->t_max || !e->t_sum || !e->t_mask || !e->t_ids ||
        !e->t_vals || !e->t_tok || !e->t_pd || !e->t_seq || !e->eog || !e->b_tokens ||
        !e->b_pos || !e->b_seq || !e->b_slot || !e->b_out || !e->b_store || !e->in_q ||
        !e->b_sealed || !e->b_roff ||
        !e->x_store || !e->x_slot ||
        !e->sc_out || !e->sc_pos || !e->sc_seq) {
        rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
        goto fail;
    }
    atomic_init(&e->queued, 0);
    publish_stats(e);
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
        finish_seq(e, e->live, DP_FINISH_CANCELLED, NULL, false);
    for (int32_t i = 0; i < e->in_n; i++)
        request_unref(e->in_q[i]);
    event_free_list(e->out_head);
    free(e->b_capture);
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
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_slot);
    free(e->b_out);
    free(e->sc_out);
    free(e->sc_pos);
    free(e->sc_seq);
    gvocab_free(e->gvocab);
    free(e->b_store);
    free(e->b_sealed);
    free(e->b_roff);
    free(e->b_tables);
    free(e->x_store);
    free(e->x_slot);
    free(e->x_tables);
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
