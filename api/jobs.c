/* jobs.c: completion requests. A job is one HTTP request's n engine
 * requests and their output: it is parsed and submitted here, its engine
 * events (taken from the outbox on the loop thread) become SSE bytes or
 * choice text, and its parked connection is resumed when there is news.
 * Also request_timeout and the SSE pings that find dead clients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "access_log.h"
#include "common/dp.h"
#include "internal.h"
#include "sse.h"

/* ---- ids ---- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t next_rand(dp_server *s)
{
    return mix64(s->id_salt + ++s->id_counter);
}

void jobs_init(dp_server *s)
{
    s->id_salt = mix64(uv_hrtime() ^ ((uint64_t)getpid() << 32));
}

/* ---- jobs ---- */

void job_free(dp_job *j)
{
    dp_server *s = j->srv;
    if (j->prev)
        j->prev->next = j->next;
    else
        s->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    s->n_jobs--;
    for (int i = 0; i < j->n_choices; i++) {
        if (j->reqs && j->reqs[i]) {
            j->reqs[i]->user = NULL;
            request_unref(j->reqs[i]);
        }
        if (j->choices)
            oai_choice_free(&j->choices[i]);
    }
    free(j->reqs);
    free(j->choices);
    free(j->out);
    free(j->error);
    oai_req_free(&j->req);
    free(j);
}

static void job_unref(dp_job *j)
{
    if (--j->refs == 0)
        job_free(j);
}

/* A stream that cannot grow ends here rather than going on with a gap: what
 * is queued still goes out, then this event, then [DONE] (sse_reader). */
static const char broken_tail[] =
    SSE_FRAME("{\"error\":{\"message\":\"the server ran out of memory for this stream; it ends "
              "here\",\"type\":\"server_error\",\"param\":null,\"code\":null}}") SSE_DONE;

static void out_append(dp_job *j, const char *p, size_t n)
{
    if (!p || j->out_broken)
        return;
    if (j->out_off == j->out_len)
        j->out_off = j->out_len = 0;
    if (j->out_len + n > j->out_cap) {
        size_t nc = j->out_cap ? j->out_cap : 1024;
        while (nc < j->out_len + n)
            nc *= 2;
        char *np = realloc(j->out, nc);
        if (!np) {
            dp_log(DP_LOG_ERROR, "api: %s: out of memory for the stream; ending it", j->id);
            j->out_broken = true;
            j->stream_ended = true;
            job_cancel(j);
            return;
        }
        j->out = np;
        j->out_cap = nc;
    }
    memcpy(j->out + j->out_len, p, n);
    j->out_len += n;
}

/* Takes a malloc'd piece; its length is read only after it was built (the
 * builder writes *n), hence the pointer. */
static void out_take(dp_job *j, char *p, const size_t *n)
{
    if (p)
        out_append(j, p, *n);
    free(p);
}

static int choices_total(const dp_job *j)
{
    return j->n_choices;
}

void job_cancel(dp_job *j)
{
    dp_server *s = j->srv;
    for (int i = 0; i < j->n_choices; i++)
        if (j->reqs[i] && !j->choices[i].done && s->engine)
            engine_cancel(s->engine, j->reqs[i]);
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    dp_job *j = cls;
    if (j->out_off < j->out_len) {
        size_t n = j->out_len - j->out_off;
        if (n > max)
            n = max;
        memcpy(buf, j->out + j->out_off, n);
        j->out_off += n;
        j->last_write = dp_now();
        return (ssize_t)n;
    }
    if (j->out_broken) {
        size_t total = sizeof broken_tail - 1;
        if (j->tail_off >= total)
            return MHD_CONTENT_READER_END_OF_STREAM;
        size_t n = total - j->tail_off;
        if (n > max)
            n = max;
        memcpy(buf, broken_tail + j->tail_off, n);
        j->tail_off += n;
        return (ssize_t)n;
    }
    if (j->stream_ended)
        return MHD_CONTENT_READER_END_OF_STREAM;
    /* After a drain timeout's cancellation the stream still waits for its
     * FINISH event (an error event, then [DONE]); only past the grace that
     * follows does it end unfinished. */
    if (!j->conn || j->srv->drain_ending)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    /* Nothing to send: park the connection until the engine delivers. */
    j->suspended = true;
    http_suspend(j->conn);
    return 0;
}

static void sse_free(void *cls)
{
    job_unref(cls);
}

static const char *kind_prefix(dp_oai_kind k)
{
    return k == DP_OAI_CHAT ? "chatcmpl-" : "cmpl-";
}

static enum MHD_Result submit_fail(dp_server *s, dp_hreq *h, dp_job *j, int rc, const char *msg)
{
    dp_api_err e;
    if (rc == DP_EDEVICE)
        api_err_set(&e, 503, "server_error", "device_lost", NULL, "%s", msg);
    else if (rc == DP_ENOSPC)
        api_err_set(&e, 429, "rate_limit_error", "queue_full", NULL,
                    "the server's queue is full (%s); retry later", msg[0] ? msg : "too many requests");
    else if (rc == DP_EINVAL && j->req.params.dualpath_mode == DP_DUALPATH_ON &&
             strstr(msg, "dualpath"))
        api_err_invalid(&e, "dualpath.enabled", "%s", msg);
    else if (rc == DP_EINVAL)
        api_err_invalid(&e, j->req.kind == DP_OAI_CHAT ? "messages" : "prompt", "%s", msg);
    else
        api_err_set(&e, 500, "server_error", NULL, NULL, "the engine refused the request: %s",
                    msg[0] ? msg : dp_strerror(rc));
    j->cancelled = true;
    job_cancel(j);
    return http_send_error(h, &e);
}

/* A field the parser does not know is accepted (clients send many that do
 * not matter), but said once per field name, with the request that sent it
 * first, so that an operator can tell when a client expects something. */
static void log_unknown_fields(dp_server *s, const dp_job *j)
{
    for (int i = 0; i < j->req.n_unknown; i++) {
        const char *name = j->req.unknown[i];
        bool seen = false;
        for (int k = 0; k < s->n_unknown_logged && !seen; k++)
            seen = !strcmp(s->unknown_logged[k], name);
        if (seen)
            continue;
        if (s->n_unknown_logged == DP_SERVER_UNKNOWN_NAMES) {
            if (!s->unknown_overflow)
                dp_log(DP_LOG_WARN, "api: %s: more unknown request fields; no longer logged", j->id);
            s->unknown_overflow = true;
            return;
        }
        snprintf(s->unknown_logged[s->n_unknown_logged++], sizeof s->unknown_logged[0], "%s", name);
        dp_log(DP_LOG_WARN, "api: %s: ignoring unknown request field '%s' (logged once per name)",
               j->id, name);
    }
}

/* A job for h, in the server's live list and holding h's reference. */
static dp_job *job_new(dp_server *s, dp_hreq *h, dp_oai_kind kind)
{
    dp_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->srv = s;
    j->refs = 1; /* the hreq */
    j->conn = h->conn;
    j->t_start = h->t_start;
    j->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = j;
    s->jobs = j;
    s->n_jobs++;
    h->data = j;
    snprintf(j->id, sizeof j->id, "%s%016llx%08llx", kind_prefix(kind),
             (unsigned long long)next_rand(s), (unsigned long long)(next_rand(s) & 0xffffffffu));
    j->created = (long long)time(NULL);
    return j;
}

/* Choice k (copy i of prompt pr): its engine request and what its response
 * starts with (an echoed prompt, logprobs arrays). DP_ENOMEM. */
static int add_choice(dp_server *s, dp_job *j, dp_oai_kind kind, const dp_oai_prompt *pr, int i,
                      int k)
{
    const dp_oai_req *r = &j->req;
    dp_request_params params;
    if (oai_params_clone(&params, &r->params))
        return DP_ENOMEM;
    params.max_tokens = pr->max_tokens;
    params.sampling.seed = r->has_seed ? r->params.sampling.seed + (uint64_t)i : next_rand(s);
    int32_t *ids = malloc((size_t)pr->n_ids * sizeof *ids);
    if (!ids) {
        request_params_free(&params);
        return DP_ENOMEM;
    }
    memcpy(ids, pr->ids, (size_t)pr->n_ids * sizeof *ids);
    /* request_new takes the prompt and the params' owned parts. */
    j->reqs[k] = request_new(ids, pr->n_ids, &params);
    if (!j->reqs[k]) {
        free(ids);
        request_params_free(&params);
        return DP_ENOMEM;
    }
    j->reqs[k]->user = j;
    dp_oai_choice *ch = &j->choices[k];
    if (r->echo) {
        if (!r->stream)
            oai_choice_append(ch, pr->text, strlen(pr->text));
        ch->text_offset = strlen(pr->text);
    }
    if (r->params.logprobs >= 0 && !r->stream && !(ch->logprobs = oai_logprobs_new(kind)))
        return DP_ENOMEM;
    /* Echo with logprobs: the prompt's tokens lead the logprobs, the first
     * with nulls; streamed, they go with the prompt's text before the first
     * token. */
    if (r->echo && r->params.logprobs >= 0) {
        if (r->stream && !(ch->echo_lp = oai_logprobs_new(kind)))
            return DP_ENOMEM;
        oai_logprobs_add_prompt(r->stream ? ch->echo_lp : ch->logprobs, s->tok, pr->ids[0], NULL,
                                0, &ch->prompt_offset);
    }
    if (r->prompt_lp >= 0) {
        if (!(ch->prompt_lp = cJSON_CreateArray()))
            return DP_ENOMEM;
        cJSON_AddItemToArray(ch->prompt_lp, cJSON_CreateNull());
    }
    return 0;
}

/* Every choice: n copies of each prompt. */
static int add_choices(dp_server *s, dp_job *j, dp_oai_kind kind)
{
    const dp_oai_req *r = &j->req;
    j->reqs = calloc((size_t)j->n_choices, sizeof *j->reqs);
    j->choices = calloc((size_t)j->n_choices, sizeof *j->choices);
    if (!j->reqs || !j->choices)
        return DP_ENOMEM;
    for (int p = 0, k = 0; p < r->n_prompts; p++)
        for (int i = 0; i < r->n; i++, k++)
            if (add_choice(s, j, kind, &r->prompts[p], i, k))
                return DP_ENOMEM;
    return 0;
}

/* A job that could not be built: nothing of it runs, h gets a 500. */
static enum MHD_Result job_oom(dp_hreq *h, dp_job *j)
{
    dp_api_err e;
    j->cancelled = true;
    for (int m = 0; m < j->n_choices && j->choices; m++)
        j->choices[m].done = true;
    j->n_done = j->n_choices;
    j->finished = true;
    api_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    return http_send_error(h, &e);
}

/* A stream's answer: the headers now, each choice's first chunk (the
 * assistant role; an echoed prompt), the rest as the engine delivers. */
static enum MHD_Result stream_start(dp_server *s, dp_hreq *h, dp_job *j, dp_oai_kind kind)
{
    const dp_oai_req *r = &j->req;
    for (int k = 0; k < j->n_choices; k++) {
        size_t n = 0;
        int pidx = k / r->n;
        if (kind == DP_OAI_CHAT)
            out_take(j, oai_chunk(kind, j->id, j->created, s->model_name, k, "assistant", "", NULL,
                                  NULL, &n), &n);
        else if (r->echo && !j->choices[k].echo_lp)
            out_take(j, oai_chunk(kind, j->id, j->created, s->model_name, k, NULL,
                                  r->prompts[pidx].text, NULL, NULL, &n), &n);
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                  sse_reader, j, sse_free);
    if (!resp) {
        dp_api_err e;
        j->cancelled = true;
        job_cancel(j);
        api_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return http_send_error(h, &e);
    }
    j->refs++; /* the response */
    j->last_write = dp_now();
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = http_queue(h, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result jobs_start(dp_server *s, dp_hreq *h, dp_oai_kind kind)
{
    dp_api_err e;
    if (s->draining || !s->engine) {
        api_err_set(&e, 503, "service_unavailable", "draining", NULL,
                    s->draining ? "the server is shutting down" : "the server is not ready");
        return http_send_error(h, &e);
    }
    dp_job *j = job_new(s, h, kind);
    if (!j) {
        api_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return http_send_error(h, &e);
    }
    const bool hung_up = h->client_gone;
    if (oai_parse(&s->oai, kind, h->body, h->len, &j->req, &e)) {
        j->finished = true;
        return http_send_error(h, &e);
    }
    log_unknown_fields(s, j);
    j->n_choices = j->req.n_prompts * j->req.n;
    int max_queue = engine_max_queue(s->engine);
    if (max_queue > 0 && j->n_choices > max_queue) {
        /* It could never be queued whole: not a "retry later". */
        j->finished = true;
        api_err_invalid(&e, "n", "the request has %d choices (prompts x n) but the server queues "
                        "at most %d requests", j->n_choices, max_queue);
        return http_send_error(h, &e);
    }
    if (add_choices(s, j, kind))
        return job_oom(h, j);
    /* All choices at once: copies of one prompt are prefilled once and
     * share its compaction (engine_submit_all). */
    char err[DP_ERRLEN] = "";
    int rc = engine_submit_all(s->engine, j->reqs, j->n_choices, err, sizeof err);
    if (rc) {
        /* Choices not submitted never finish: mark them done. */
        for (int m = 0; m < j->n_choices; m++) {
            j->choices[m].done = true;
            j->n_done++;
        }
        if (j->n_done == choices_total(j))
            j->finished = true;
        return submit_fail(s, h, j, rc, err);
    }
    j->refs += j->n_choices; /* each until its FINISH */
    if (hung_up)
        jobs_client_gone(s, h); /* the hang-up came with the request */
    if (!j->req.stream) {
        j->suspended = true;
        http_suspend(h->conn);
        return MHD_YES;
    }
    return stream_start(s, h, j, kind);
}

/* Non-stream: called again after the job's connection was resumed. */
enum MHD_Result jobs_continue(dp_server *s, dp_hreq *h)
{
    dp_job *j = h->data;
    dp_api_err e;
    if (h->answered)
        return MHD_YES;
    if (!j->finished && !s->drain_ending) {
        j->suspended = true;
        http_suspend(h->conn);
        return MHD_YES;
    }
    if (j->client_gone)
        return MHD_NO; /* nobody to answer: the access log says 499 */
    if (j->error) {
        api_err_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", j->error);
        return http_send_error(h, &e);
    }
    if (j->timed_out) {
        api_err_set(&e, 504, "timeout_error", "request_timeout", NULL,
                    "the request ran longer than request_timeout (%g s) and was cancelled",
                    s->opts.request_timeout_s);
        return http_send_error(h, &e);
    }
    bool aborted = !j->finished;
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].finish == DP_FINISH_CANCELLED)
            aborted = true;
    if (aborted) {
        api_err_set(&e, 503, "service_unavailable", "draining", NULL,
                    "the request was cancelled because the server is shutting down");
        return http_send_error(h, &e);
    }
    size_t len = 0;
    char *body = oai_response(&j->req, j->id, j->created, s->model_name, j->choices, j->n_choices,
                              &len);
    return http_send(h, 200, "application/json", body, len);
}

void jobs_client_gone(dp_server *s, dp_hreq *h)
{
    dp_job *j = h->data;
    if (!j || j->finished || j->cancelled || j->client_gone)
        return;
    dp_log(DP_LOG_DEBUG, "api: %s: client hung up, cancelling", j->id);
    /* Not j->cancelled: the FINISH events still take their usual path (the
     * response, or the stream's last chunk and [DONE]), which resumes the
     * parked connection; that write then fails and MHD ends it. */
    j->client_gone = true;
    job_cancel(j);
}

void jobs_hreq_done(dp_server *s, dp_hreq *h, enum MHD_RequestTerminationCode toe)
{
    dp_job *j = h->data;
    access_log_request(h, j, toe);
    if (j) {
        j->conn = NULL;
        j->suspended = false;
        if (!j->finished) {
            /* The client went away (or the daemon stops): free its blocks. */
            if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
                dp_log(DP_LOG_DEBUG, "api: %s: client gone (%d), cancelling", j->id, (int)toe);
            j->cancelled = true;
            job_cancel(j);
        }
        job_unref(j);
    }
}

/* ---- engine events ---- */

static void observe_finish(dp_server *s, const dp_event *ev)
{
    dp_metrics *m = &s->metrics;
    if ((int)ev->finish >= 0 && ev->finish < 5)
        m->finished[ev->finish]++;
    m->prompt_tokens += (uint64_t)(ev->prompt_tokens > 0 ? ev->prompt_tokens : 0);
    m->generation_tokens += (uint64_t)(ev->completion_tokens > 0 ? ev->completion_tokens : 0);
    double t0 = ev->req->t_arrival;
    if (ev->finish == DP_FINISH_STOP || ev->finish == DP_FINISH_LENGTH) {
        if (ev->t_first_token > 0)
            hist_observe(&m->ttft, ev->t_first_token - t0);
        hist_observe(&m->e2e, ev->t_finish - t0);
        if (ev->completion_tokens > 1 && ev->t_first_token > 0)
            hist_observe(&m->itl, (ev->t_finish - ev->t_first_token) / (ev->completion_tokens - 1));
    }
}

/* A streamed echo with logprobs: the prompt's text and its tokens'
 * logprobs, once all are in (before the first token or the finish). */
static void stream_echo(dp_server *s, dp_job *j, int k)
{
    dp_oai_choice *ch = &j->choices[k];
    if (!ch->echo_lp)
        return;
    size_t n = 0;
    cJSON *lp = ch->echo_lp;
    ch->echo_lp = NULL;
    out_take(j, oai_chunk(j->req.kind, j->id, j->created, s->model_name, k, NULL,
                          j->req.prompts[k / j->req.n].text, lp, NULL, &n), &n);
}

/* A PROMPT_TOKEN event: echo's logprobs and vLLM's prompt_logprobs. */
static void prompt_token(dp_server *s, dp_job *j, int k, const dp_event *ev)
{
    dp_oai_choice *ch = &j->choices[k];
    const dp_oai_req *r = &j->req;
    if (ch->prompt_lp)
        cJSON_AddItemToArray(ch->prompt_lp, oai_prompt_logprob_entry(s->tok, ev, r->prompt_lp));
    if (r->echo && r->params.logprobs >= 0)
        oai_logprobs_add_prompt(r->stream ? ch->echo_lp : ch->logprobs, s->tok, ev->token, ev,
                                r->params.logprobs, &ch->prompt_offset);
}

static void stream_token(dp_server *s, dp_job *j, int k, const dp_event *ev)
{
    dp_oai_kind kind = j->req.kind;
    cJSON *lp = NULL;
    if (j->req.params.logprobs >= 0 && oai_logprobs_takes(kind, s->tok, ev->token) &&
        !ev->past_end) {
        lp = oai_logprobs_new(kind);
        oai_logprobs_add(lp, kind, s->tok, ev, &j->choices[k].text_offset);
    }
    if (!lp && ev->text_len == 0)
        return;
    size_t n = 0;
    out_take(j, oai_chunk(kind, j->id, j->created, s->model_name, k, NULL, ev->text ? ev->text : "",
                          lp, NULL, &n), &n);
}

/* An error as one SSE event, appended whole (a failed append then leaves
 * no half-written event before the stream's error ending). */
static void stream_error(dp_job *j, const dp_api_err *e)
{
    size_t len = 0;
    char *ev = sse_frame_take(api_err_body(e, NULL), &len);
    if (ev)
        out_append(j, ev, len);
    free(ev);
}

static void stream_finish(dp_server *s, dp_job *j, int k, const dp_event *ev)
{
    size_t n = 0;
    if (ev->finish == DP_FINISH_ERROR) {
        dp_api_err e;
        api_err_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                    ev->error ? ev->error : "engine error");
        stream_error(j, &e);
        return;
    }
    if (ev->finish == DP_FINISH_CANCELLED) {
        /* OpenAI's finish reasons have no "cancelled": a stream cut by the
         * drain ends with the error a whole response gets (a timeout's
         * comes from stream_end; a client that hung up reads nothing). */
        if (!j->timed_out) {
            dp_api_err e;
            api_err_set(&e, 503, "service_unavailable", "draining", NULL,
                        "the request was cancelled because the server is shutting down");
            stream_error(j, &e);
        }
        return;
    }
    const char *text = ev->text ? ev->text : "";
    out_take(j, oai_chunk(j->req.kind, j->id, j->created, s->model_name, k, NULL,
                          j->req.kind == DP_OAI_CHAT && !ev->text_len ? NULL : text, NULL,
                          oai_finish_name(ev->finish), &n), &n);
}

/* A streamed reply of a request with tools, at its end: one delta with its
 * calls (or its text), then the finish chunk. */
static void stream_tool_finish(dp_server *s, dp_job *j, int k, const dp_event *ev)
{
    if (ev->finish != DP_FINISH_STOP && ev->finish != DP_FINISH_LENGTH) {
        stream_finish(s, j, k, ev); /* an error or a cancellation, as any stream */
        return;
    }
    cJSON *calls = NULL;
    char *content = NULL;
    const char *finish = NULL;
    size_t n = 0;
    if (oai_tool_shape(&j->req, &j->choices[k], j->id, k, &calls, &content, &finish)) {
        dp_api_err e;
        api_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        stream_error(j, &e);
        return;
    }
    out_take(j, oai_tool_chunk(j->id, j->created, s->model_name, k, calls, content, &n), &n);
    free(content);
    out_take(j, oai_chunk(DP_OAI_CHAT, j->id, j->created, s->model_name, k, NULL, NULL, NULL,
                          finish, &n), &n);
}

static void stream_end(dp_server *s, dp_job *j)
{
    if (j->timed_out) {
        dp_api_err e;
        api_err_set(&e, 504, "timeout_error", "request_timeout", NULL,
                    "the request ran longer than request_timeout (%g s) and was cancelled",
                    s->opts.request_timeout_s);
        stream_error(j, &e);
    }
    if (j->req.include_usage) {
        long long pt = 0, ct = 0;
        dp_kv_usage dp = {0};
        for (int i = 0; i < j->req.n_prompts; i++)
            pt += j->req.prompts[i].n_ids;
        for (int i = 0; i < j->n_choices; i++) {
            ct += j->choices[i].completion_tokens;
            dp_kv_usage_add(&dp, &j->choices[i].usage);
        }
        size_t n = 0;
        out_take(j, oai_usage_chunk(j->req.kind, j->id, j->created, s->model_name, pt, ct, &dp, &n),
                 &n);
    }
    static const char done[] = SSE_DONE;
    out_append(j, done, sizeof done - 1);
    j->stream_ended = true;
}

static void handle_event(dp_server *s, dp_event *ev)
{
    dp_job *j = ev->req ? ev->req->user : NULL;
    if (!j)
        return;
    int k = 0;
    while (k < j->n_choices && j->reqs[k] != ev->req)
        k++;
    if (k == j->n_choices || j->choices[k].done)
        return;
    dp_oai_choice *ch = &j->choices[k];
    bool live = !j->cancelled && j->conn;
    if (ev->kind == DP_EV_PROMPT_TOKEN) {
        if (live)
            prompt_token(s, j, k, ev);
    } else if (ev->kind == DP_EV_TOKEN) {
        ch->completion_tokens++;
        if (!live)
            return;
        if (j->req.stream && j->req.tools.mode == DP_TOOLS_OFF) {
            stream_echo(s, j, k);
            stream_token(s, j, k, ev);
        } else if (j->req.stream) {
            /* Tool calls stream whole once the reply is in: its JSON is
             * only known to be calls (or text) at its end. */
            if (ev->text_len)
                oai_choice_append(ch, ev->text, ev->text_len);
        } else {
            if (ev->text_len)
                oai_choice_append(ch, ev->text, ev->text_len);
            if (!ev->past_end) /* logprobs end where the text ends */
                oai_logprobs_add(ch->logprobs, j->req.kind, s->tok, ev, &ch->text_offset);
        }
    } else if (ev->kind == DP_EV_FINISH) {
        observe_finish(s, ev);
        if (ev->t_first_token > 0 && (j->t_first == 0 || ev->t_first_token < j->t_first))
            j->t_first = ev->t_first_token;
        ch->done = true;
        ch->finish = ev->finish;
        ch->completion_tokens = ev->completion_tokens;
        ch->usage = ev->usage;
        if (ev->finish == DP_FINISH_ERROR && !j->error)
            j->error = strdup(ev->error ? ev->error : "engine error");
        if (live) {
            if (j->req.stream && j->req.tools.mode != DP_TOOLS_OFF) {
                if (ev->text_len)
                    oai_choice_append(ch, ev->text, ev->text_len);
                stream_tool_finish(s, j, k, ev);
            } else if (j->req.stream) {
                if (ev->finish != DP_FINISH_ERROR)
                    stream_echo(s, j, k);
                stream_finish(s, j, k, ev);
            }
            else if (ev->text_len)
                oai_choice_append(ch, ev->text, ev->text_len);
        }
        if (++j->n_done == j->n_choices) {
            j->finished = true;
            if (live && j->req.stream)
                stream_end(s, j);
        }
    }
    if (j->req.stream ? j->out_off < j->out_len || j->stream_ended : j->finished)
        job_resume(j);
    if (ev->kind == DP_EV_FINISH)
        job_unref(j);
}

void job_resume(dp_job *j)
{
    if (j->conn && j->suspended) {
        j->suspended = false;
        http_resume(&j->srv->http, j->conn);
    }
}

void jobs_drain_events(dp_server *s)
{
    if (!s->engine)
        return;
    dp_event *ev = engine_take_events(s->engine);
    while (ev) {
        dp_event *next = ev->next;
        ev->next = NULL;
        handle_event(s, ev);
        event_free(ev);
        ev = next;
    }
}

/* Streams with nothing to say for a while get an SSE comment: writing is the
 * only way to notice a client that went away while its connection is parked. */
/* request_timeout: a completion still generating after it is cancelled; its
 * FINISH events then end it with 504 (or an error event when streaming). */
static void check_request_timeouts(dp_server *s, double now)
{
    double limit = s->opts.request_timeout_s;
    if (limit <= 0)
        return;
    for (dp_job *j = s->jobs; j; j = j->next) {
        if (j->finished || j->cancelled || j->client_gone || j->timed_out || !j->conn)
            continue;
        if (now - j->t_start < limit)
            continue;
        j->timed_out = true;
        s->metrics.request_timeouts++;
        dp_log(DP_LOG_INFO, "api: %s: running for %.1f s, over request_timeout: cancelling", j->id,
               now - j->t_start);
        job_cancel(j);
    }
}

void jobs_tick(dp_server *s, double now)
{
    bool any = false;
    static const char ping[] = ": ping\n\n";
    check_request_timeouts(s, now);
    for (dp_job *j = s->jobs; j; j = j->next) {
        if (!j->req.stream || !j->conn || j->stream_ended || j->cancelled || j->finished)
            continue;
        if (now - j->last_write < s->opts.ping_interval_s || j->out_off < j->out_len)
            continue;
        out_append(j, ping, sizeof ping - 1);
        j->last_write = now;
        if (j->suspended) {
            job_resume(j);
            any = true;
        }
    }
    if (any)
        http_kick(&s->http);
}

