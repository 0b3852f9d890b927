/* server.c: the API server's life: start-up, the transport's callbacks
 * (each hands a request to routes.c or jobs.c, counts a response, or checks
 * a drain), the engine's wake-up (one uv_async_t), the ping timer, draining
 * (graceful shutdown) and shutdown. */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dp.h"
#include "internal.h"

void server_opts_default(dp_server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->model_name = "dualpath";
    o->backend = "cpu";
    o->max_body = 1u << 20;
    o->conn_limit = 1024;
    o->header_timeout_s = 10;
    o->body_timeout_s = 10;
    o->idle_timeout_s = 60;
    o->request_timeout_s = 600;
    o->ping_interval_s = 1.0;
    o->health_public = true;
    o->metrics_public = true;
    o->cors_origins = "";
}

static void on_async(uv_async_t *a)
{
    dp_server *s = a->data;
    jobs_drain_events(s);
    http_kick(&s->http);
    /* The engine notifies after failing everything on a lost device. */
    if (s->engine && !s->lost_seen && engine_device_lost(s->engine)) {
        s->lost_seen = true;
        if (s->lost_fn)
            s->lost_fn(s->lost_ud);
    }
}

void server_on_device_lost(dp_server *s, void (*fn)(void *ud), void *ud)
{
    s->lost_fn = fn;
    s->lost_ud = ud;
}

void server_engine_notify(void *ud)
{
    dp_server *s = ud;
    uv_async_send(&s->async);
}

/* ---- the transport's callbacks ---- */

static enum MHD_Result on_headers(void *ud, dp_hreq *h)
{
    return routes_early(ud, h);
}

static enum MHD_Result on_request(void *ud, dp_hreq *h)
{
    return h->data ? jobs_continue(ud, h) : routes_handle(ud, h);
}

/* Every response: the CORS headers its Origin earns, and its status in the
 * responses counter. */
static void on_respond(void *ud, dp_hreq *h, struct MHD_Response *r, unsigned status)
{
    dp_server *s = ud;
    metrics_count_response(&s->metrics, (int)status);
    if (!guard_cors_on(&s->guard))
        return;
    /* The answer depends on Origin unless every origin is allowed: caches
     * must not serve one origin's response to another. */
    if (!s->guard.any_origin)
        MHD_add_response_header(r, "Vary", "Origin");
    const char *origin = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Origin");
    const char *allow = guard_cors_origin(&s->guard, origin);
    if (allow)
        MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
}

static void on_client_gone(void *ud, dp_hreq *h)
{
    jobs_client_gone(ud, h);
}

static void on_done(void *ud, dp_hreq *h, enum MHD_RequestTerminationCode toe)
{
    jobs_hreq_done(ud, h, toe);
}

static void on_deadline(void *ud, dp_http_deadline which)
{
    dp_server *s = ud;
    static const int kind[DP_DEADLINE_KINDS] = {[DP_DEADLINE_HEADERS] = DP_TIMEOUT_HEADER,
                                                [DP_DEADLINE_BODY] = DP_TIMEOUT_BODY,
                                                [DP_DEADLINE_IDLE] = DP_TIMEOUT_IDLE};
    s->metrics.conn_timeouts[kind[which]]++;
}

static void check_drain(dp_server *s);

static void on_ran(void *ud)
{
    check_drain(ud);
}

static void on_ping(uv_timer_t *t)
{
    jobs_tick(t->data, dp_now());
}

/* ---- lifecycle ---- */

int server_init(dp_server **out, uv_loop_t *loop, const dp_server_opts *o,
                const dp_tokenizer *tok, const dp_chat_template *tmpl, char *err, size_t errsz)
{
    dp_server *s = calloc(1, sizeof *s);
    if (!s)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    s->loop = loop;
    s->opts = *o;
    s->tok = tok;
    s->tmpl = tmpl;
    s->model_name = strdup(o->model_name ? o->model_name : "dualpath");
    s->model_alias = o->model_alias ? strdup(o->model_alias) : NULL;
    if (!s->model_name || (o->model_alias && !s->model_alias)) {
        free(s->model_name);
        free(s->model_alias);
        free(s);
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    }
    if (guard_init(&s->guard, o->api_key_file, o->cors_origins, err, errsz)) {
        free(s->model_name);
        free(s->model_alias);
        free(s);
        return DP_EINVAL;
    }
    if (guard_auth_on(&s->guard))
        dp_log(DP_LOG_INFO, "api: %d API key(s) from %s; /health %s, /metrics %s", s->guard.n_keys,
               o->api_key_file, o->health_public ? "public" : "needs a key",
               o->metrics_public ? "public" : "needs a key");
    s->opts.model_name = s->model_name;
    s->opts.model_alias = s->model_alias;
    s->oai.tok = tok;
    s->oai.tmpl = tmpl;
    s->oai.model_name = s->model_name;
    s->oai.model_alias = s->model_alias;
    s->oai.context_length = 2048;
    s->oai.default_max_tokens = o->default_max_tokens;
    s->oai.keep_system = o->keep_system;
    s->oai.grammars = grammar_cache_new(); /* NULL: no sharing, still correct */
    s->created = (long long)time(NULL);
    jobs_init(s);
    metrics_init(&s->metrics);
    uv_async_init(loop, &s->async, on_async);
    s->async.data = s;
    s->async_open = true;
    uv_timer_init(loop, &s->ping);
    uv_timer_init(loop, &s->drain_timer);
    s->ping.data = s->drain_timer.data = s;
    s->timers_open = true;
    dp_http_opts ho = {.host = o->host, .port = o->port, .unix_path = o->unix_path,
                       .max_body = o->max_body, .conn_limit = o->conn_limit,
                       .per_ip_limit = o->per_ip_limit,
                       .timeout_s = {[DP_DEADLINE_HEADERS] = o->header_timeout_s,
                                     [DP_DEADLINE_BODY] = o->body_timeout_s,
                                     [DP_DEADLINE_IDLE] = o->idle_timeout_s}};
    dp_http_cbs cb = {.ud = s, .headers = on_headers, .request = on_request,
                      .respond = on_respond, .client_gone = on_client_gone, .done = on_done,
                      .deadline = on_deadline, .ran = on_ran};
    http_init(&s->http, loop, &ho, &cb);
    *out = s;
    return 0;
}

void server_set_engine(dp_server *s, dp_engine *e)
{
    s->engine = e;
    if (e)
        s->oai.context_length = engine_context_length(e);
}

void server_set_build_info(dp_server *s, const char *backend, const char *kernels, const char *matmul)
{
    snprintf(s->backend, sizeof s->backend, "%s", backend);
    snprintf(s->kernels, sizeof s->kernels, "%s", kernels);
    snprintf(s->matmul, sizeof s->matmul, "%s", matmul);
}

int server_listen(dp_server *s, char *err, size_t errsz)
{
    int rc = http_open(&s->http, err, errsz);
    if (rc)
        return rc;
    uint64_t ms = (uint64_t)(s->opts.ping_interval_s * 1000.0 / 2);
    if (ms < 50)
        ms = 50;
    uv_timer_start(&s->ping, on_ping, ms, ms);
    return 0;
}

int server_port(const dp_server *s)
{
    return s->http.port;
}

int server_check_address(const char *host, int port, char *err, size_t errsz)
{
    return http_check_address(host, port, err, errsz);
}

static void check_drain(dp_server *s)
{
    if (!s->draining || s->drain_done || s->n_jobs || s->http.n_hreqs)
        return;
    s->drain_done = true;
    uv_timer_stop(&s->drain_timer);
    if (s->drain_cb)
        s->drain_cb(s->drain_ud);
}

static void on_drain_timeout(uv_timer_t *t)
{
    dp_server *s = t->data;
    if (!s->drain_forced) {
        /* Phase 1 over: cancel what still runs; give the cancellations a
         * moment to come back as FINISH events and end the streams. */
        dp_log(DP_LOG_WARN, "api: drain timeout: cancelling %d request(s)", s->n_jobs);
        for (dp_job *j = s->jobs; j; j = j->next)
            if (!j->finished)
                job_cancel(j);
        s->drain_forced = true;
        uv_timer_start(&s->drain_timer, on_drain_timeout, 3000, 0);
        return;
    }
    /* Phase 2: end every parked connection now. */
    s->drain_ending = true;
    for (dp_job *j = s->jobs; j; j = j->next)
        job_resume(j);
    http_kick(&s->http);
    if (!s->drain_done) {
        s->drain_done = true;
        if (s->drain_cb)
            s->drain_cb(s->drain_ud);
    }
}

void server_drain(dp_server *s, double timeout_s, void (*done)(void *ud), void *ud)
{
    if (s->draining)
        return;
    s->draining = true;
    s->drain_cb = done;
    s->drain_ud = ud;
    http_quiesce(&s->http);
    http_end_uploads(&s->http);
    dp_log(DP_LOG_INFO, "api: draining: %d request(s) in flight, timeout %.1f s", s->n_jobs,
           timeout_s);
    uv_timer_start(&s->drain_timer, on_drain_timeout,
                   (uint64_t)(timeout_s > 0 ? timeout_s * 1000.0 : 0), 0);
    http_kick(&s->http);
    check_drain(s);
}

void server_stop_http(dp_server *s)
{
    /* MHD_stop_daemon must not see suspended connections. */
    for (dp_job *j = s->jobs; j; j = j->next) {
        if (!j->finished) {
            j->cancelled = true;
            job_cancel(j);
        }
        job_resume(j);
    }
    s->drain_forced = true;
    s->drain_ending = true;
    http_close(&s->http);
    uv_timer_stop(&s->ping);
    uv_timer_stop(&s->drain_timer);
}

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

void server_close(dp_server *s)
{
    jobs_drain_events(s);
    /* Whatever the engine never finished (it was stopped) goes now. */
    while (s->jobs)
        job_free(s->jobs);
    if (s->async_open) {
        uv_close((uv_handle_t *)&s->async, on_handle_closed);
        s->async_open = false;
    }
    http_release(&s->http);
    if (s->timers_open) {
        uv_close((uv_handle_t *)&s->ping, on_handle_closed);
        uv_close((uv_handle_t *)&s->drain_timer, on_handle_closed);
        s->timers_open = false;
    }
}

void server_reload(dp_server *s)
{
    char err[DP_ERRLEN];
    if (!guard_auth_on(&s->guard))
        return;
    if (guard_reload(&s->guard, err, sizeof err))
        dp_log(DP_LOG_ERROR, "api: SIGHUP: %s; the %d key(s) in use stay", err, s->guard.n_keys);
    else
        dp_log(DP_LOG_INFO, "api: SIGHUP: %d API key(s) reloaded from %s", s->guard.n_keys,
               s->guard.key_path);
}

void server_destroy(dp_server *s)
{
    if (!s)
        return;
    guard_destroy(&s->guard);
    grammar_cache_free(s->oai.grammars);
    free(s->model_name);
    free(s->model_alias);
    free(s);
}
