/* emit.c: what the engine sends back: token and finish events through the
 * outbox, each output row's token (sampled on the device or from the row,
 * the grammar's mask, logit bias and penalties), stop conditions, logprobs
 * and prompt logprobs. Engine thread only. */
#include "engine_private.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"

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

void eng_push_event(dp_engine *e, dp_event *ev)
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
        eng_push_event(e, p);
    }
    es->pend_tail = NULL;
}

/* Emits the FINISH event and frees the sequence. flush: release held text. */
void eng_finish_seq(dp_engine *e, eng_seq *es, dp_finish why, const char *error, bool flush)
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
        ev->usage = es->usage;
        ev->usage.tokens_resumed = es->resumed ? es->seq->reused_tokens : 0;
        ev->t_first_token = es->t_first;
        ev->t_finish = dp_now();
        if (error)
            ev->error = strdup(error);
        eng_push_event(e, ev);
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

/* ---- sampling and stop conditions ----------------------------------------- */

/* The request samples from its full row: it changes the logits first
 * (logit_bias, penalties) or reports log-probabilities over the vocabulary. */
bool eng_needs_full_row(const dp_request_params *p)
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
int eng_decide_rows(dp_engine *e, eng_seq **emitting, int32_t no)
{
    int32_t need = 0;
    for (int32_t o = 0; o < no; o++) {
        const dp_request_params *p = &emitting[o]->req->params;
        e->t_tok[o] = -1;
        if (eng_needs_full_row(p)) {
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

/* Samples output row o for es: the token eng_decide_rows found, or from the row
 * (an undecided draw continues where the candidates left it; a request that
 * changes its logits or wants log-probabilities uses the row alone). */
static int32_t sample_row(dp_engine *e, eng_seq *es, int32_t o)
{
    const dp_request_params *p = &es->req->params;
    dp_seq *q = es->seq;
    float *row = e->logits + (size_t)o * (size_t)e->vocab;
    if (e->step_topk && !eng_needs_full_row(p)) {
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

bool eng_emit_token(dp_engine *e, eng_seq *es, int32_t o)
{
    const dp_request_params *p = &es->req->params;
    dp_seq *q = es->seq;
    int32_t tok = sample_row(e, es, o);
    es->n_gen++;
    if (es->n_gen == 1)
        es->t_first = dp_now();

    dp_event *ev = event_new(e, es->req, DP_EV_TOKEN);
    if (!ev) {
        eng_finish_seq(e, es, DP_FINISH_ERROR, "out of memory", false);
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
            eng_finish_seq(e, es, DP_FINISH_ERROR, grc == DP_ENOSPC
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
            eng_push_event(e, ev);
        } else if (ev->text_start >= es->rel_bytes) {
            if (es->pend_tail) /* all of it held back: wait for the text */
                es->pend_tail->next = ev;
            else
                es->pend_head = ev;
            es->pend_tail = ev;
        } else {
            push_pending(e, es, -1);
            eng_push_event(e, ev);
        }
    } else {
        eng_push_event(e, ev);
    }
    if (why == DP_FINISH_NONE && (es->n_gen >= p->max_tokens || q->n_tokens + 1 >= e->ctx_len))
        why = DP_FINISH_LENGTH;
    if (why == DP_FINISH_NONE && seq_append(q, tok) != 0) {
        eng_finish_seq(e, es, DP_FINISH_ERROR, "out of memory", false);
        return false;
    }
    if (why != DP_FINISH_NONE) { /* a stop string ends the text at the match */
        eng_finish_seq(e, es, why, NULL, !hit_stop);
        return false;
    }
    return true;
}

/* The step's prompt-logprob rows (after its no sampled rows): each prompt
 * token's logprob given the tokens before it, from the raw logits, reported
 * once per position (a recompute after preemption scores them again and
 * reports nothing new). */
void eng_emit_prompt_logprobs(dp_engine *e, int32_t no, int32_t ns)
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
        eng_push_event(e, ev);
        es->n_scored = pos;
    }
}
