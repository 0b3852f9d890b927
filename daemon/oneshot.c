/* oneshot.c: the one-shot command: everything from GGUF to printed text in
 * one pass, through the engine the daemon serves with (its configuration:
 * the dual path, the prefix cache, the KV types), one request submitted
 * and its events printed as they come, as complete UTF-8 pieces. */
#include "oneshot.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/tokenizer.h"
#include "serve.h"

/* The engine thread says "events" (engine_take_events); this thread waits. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ready;
} waiter;

static void on_events(void *ud)
{
    waiter *w = ud;
    pthread_mutex_lock(&w->mu);
    w->ready = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Prints the request's text as it comes; returns its FINISH event (the
 * caller frees it). */
static dp_event *print_until_finish(dp_engine *e, waiter *w)
{
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->ready)
            pthread_cond_wait(&w->cv, &w->mu);
        w->ready = false;
        pthread_mutex_unlock(&w->mu);
        dp_event *fin = NULL;
        for (dp_event *ev = engine_take_events(e), *nx; ev; ev = nx) {
            nx = ev->next;
            ev->next = NULL;
            if (ev->text_len > 0) {
                fwrite(ev->text, 1, ev->text_len, stdout);
                fflush(stdout);
            }
            if (ev->kind == DP_EV_FINISH)
                fin = ev;
            else
                event_free(ev);
        }
        if (fin)
            return fin;
    }
}

int oneshot_run(const dp_oneshot_opts *o)
{
    char err[DP_ERRLEN];
    const dp_engine_opts *eo = o->engine;
    /* Rows beyond one per sequence: prompt logprobs (engine.h), as served. */
    int32_t max_out = eo->max_seqs + DP_ENGINE_SCORE_ROWS;
    if (max_out > eo->max_batched_tokens)
        max_out = eo->max_batched_tokens;
    const dp_model_open_opts mo = {.path = o->model, .device = o->device, .threads = o->threads,
                                   .max_tokens = eo->max_batched_tokens, .max_out = max_out,
                                   .tokenizer = true, .exact_matmul = o->exact_matmul,
                                   .no_graphs = !o->cuda_graphs, .drop_pages = true};
    dp_model_files mf;
    const double t0 = dp_now();
    if (model_open(&mf, &mo, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        return 1;
    }
    dp_engine *e = NULL;
    waiter w = {.ready = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status = 1;
    const char *prompt = o->prompt;
    if (o->chat) {
        dp_chat_template ct;
        if (serve_chat_template(&ct, o->chat_template, &mf.g, mf.tok, err, sizeof err)) {
            fprintf(stderr, "dualpathd: chat template: %s\n", err);
            goto done;
        }
        dp_chat_msg msg = {"user", o->prompt};
        int rc = chat_template_apply(&ct, &msg, 1, true, &text, err, sizeof err);
        chat_template_destroy(&ct);
        if (rc) {
            fprintf(stderr, "dualpathd: chat template: %s\n", err);
            goto done;
        }
        prompt = text;
    }
    if (tokenizer_encode(mf.tok, prompt, strlen(prompt), tokenizer_add_bos(mf.tok), o->chat, &ids,
                         &n_ids) || n_ids == 0) {
        fprintf(stderr, "dualpathd: the prompt encodes to no tokens\n");
        goto done;
    }
    if (engine_init(&e, mf.m, mf.tok, eo, on_events, &w, err, sizeof err) || engine_start(e)) {
        fprintf(stderr, "dualpathd: %s\n", e ? "cannot start the engine" : err);
        goto done;
    }
    if (o->verbose)
        fprintf(stderr, "dualpathd: %s backend, %d layers, %zu prompt tokens, loaded in %.2f s\n",
                mf.be->ops->name, llama_hparams(mf.m)->n_layers, n_ids, dp_now() - t0);
    dp_request_params p = {.max_tokens = o->max_tokens, .logprobs = -1};
    sampling_default(&p.sampling);
    p.sampling.temperature = o->temperature;
    p.sampling.top_k = o->top_k;
    p.sampling.top_p = o->top_p;
    p.sampling.min_p = o->min_p;
    p.sampling.seed = o->seed;
    dp_request *req = request_new(ids, (int32_t)n_ids, &p);
    if (!req) {
        fprintf(stderr, "dualpathd: out of memory\n");
        goto done;
    }
    ids = NULL; /* the request's now */
    int rc = engine_submit(e, req, err, sizeof err);
    request_unref(req);
    if (rc) {
        fprintf(stderr, "dualpathd: %s\n", err);
        goto done;
    }
    const double t_submit = dp_now();
    dp_event *fin = print_until_finish(e, &w);
    fputc('\n', stdout);
    if (fin->finish == DP_FINISH_ERROR) {
        fprintf(stderr, "dualpathd: %s\n", fin->error ? fin->error : "the request failed");
    } else {
        status = 0;
        if (o->verbose) {
            const double t_first = fin->t_first_token > 0 ? fin->t_first_token : fin->t_finish;
            const double dt = fin->t_finish - t_first;
            fprintf(stderr, "dualpathd: prompt %d tokens, first token after %.3f s, %d tokens in "
                    "%.3f s (%.1f tok/s); KV kept %lld of %lld prompt tokens\n",
                    fin->prompt_tokens, t_first - t_submit, fin->completion_tokens, dt,
                    dt > 0 ? (fin->completion_tokens - 1) / dt : 0.0,
                    (long long)fin->usage.tokens_kept,
                    (long long)(fin->usage.tokens_kept + fin->usage.tokens_evicted));
        }
    }
    event_free(fin);
done:
    if (e) {
        engine_stop(e);
        engine_destroy(e);
    }
    model_close(&mf);
    free(text);
    free(ids);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return status;
}
