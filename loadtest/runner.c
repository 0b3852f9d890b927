/* runner.c: drives one dp-loadgen run on a libuv loop. It owns the connections
 * (reused with keep-alive), the in-flight requests, the arrival timer and the stop rules. */
#include "runner.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sse.h"

#define BODY_MAX (8u << 20) /* keep at most this much of a non-stream body */
#define TICK_MS 20

enum { PH_WARMUP, PH_MEASURE, PH_STOPPING };

struct runner;
struct conn;

struct req {
    struct runner *r;
    struct conn *conn;
    lg_work_item item;
    bool warmup;
    uint64_t id;
    char *wire;
    size_t wire_len;
    double t_send, t_first, t_last, deadline;
    double *itl;
    size_t n_itl, cap_itl;
    char *body;
    size_t blen, bcap;
    char *reply; /* generated text; kept only for chat sessions */
    size_t rlen, rcap;
    bool oom;
    lg_sse_parser sse;
    bool sse_mode, saw_done, saw_finish, bad_json;
    char stream_err[200];
    int prompt_tokens, completion_tokens, chunks;
    int retries;
    struct req *prev, *next;
};

struct conn {
    lg_conn c;
    struct runner *r;
    struct req *req;
    lg_http_parser parser;
    bool reused;
    char *wbuf;
    struct conn *next_idle;
};

struct pending {
    lg_work_item item;
    struct pending *next;
};

struct runner {
    uv_loop_t loop;
    uv_timer_t tick, arrival;
    uv_signal_t sigint;
    const lg_run_opts *o;
    lg_workload *w;
    lg_run_result *out;
    struct sockaddr_storage addr;
    dp_rng rng;
    int phase;
    double t_begin, t0, now;
    int inflight;
    int warm_issued, warm_done;
    int64_t new_issued, new_limit; /* new_limit < 0: unlimited */
    int64_t arrivals_due;
    bool arrivals_unlimited;
    double next_arrival;
    struct pending *pend_head, *pend_tail;
    struct req *active;
    struct conn *idle;
    uint64_t next_id;
    bool fatal;
    char fatal_msg[DP_ERRLEN];
    /* progress */
    bool show_progress, tty;
    double last_progress, rate_t;
    size_t done, failed, rate_done;
    double cur_rate;
};

static void pump(struct runner *r);
static void finish_run(struct runner *r);
static void assign_conn(struct req *q);

/* ---- results ---- */

int lg_result_output_tokens(const lg_result *r)
{
    return r->completion_tokens >= 0 ? r->completion_tokens : r->chunks;
}

int lg_result_input_tokens(const lg_result *r)
{
    return r->prompt_tokens >= 0 ? r->prompt_tokens : r->prompt_words;
}

void lg_run_result_destroy(lg_run_result *rr)
{
    for (size_t i = 0; i < rr->n; i++) {
        free(rr->res[i].error);
        free(rr->res[i].itl);
    }
    free(rr->res);
    memset(rr, 0, sizeof *rr);
}

static lg_result *result_slot(struct runner *r)
{
    lg_run_result *o = r->out;
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 256;
        lg_result *nr = realloc(o->res, nc * sizeof *nr);
        if (!nr)
            return NULL;
        o->res = nr;
        o->cap = nc;
    }
    lg_result *res = &o->res[o->n++];
    memset(res, 0, sizeof *res);
    return res;
}

static void record(struct req *q, bool ok, const char *reason, const char *msg)
{
    struct runner *r = q->r;
    lg_result *res = result_slot(r);
    if (!res) {
        r->fatal = true;
        snprintf(r->fatal_msg, sizeof r->fatal_msg, "out of memory for results");
        return;
    }
    double now = dp_now();
    res->id = q->id;
    res->warmup = q->warmup;
    res->ok = ok;
    res->status = q->conn ? q->conn->parser.status : 0;
    snprintf(res->reason, sizeof res->reason, "%s", ok ? "" : reason);
    res->error = (!ok && msg) ? strdup(msg) : NULL;
    res->start = q->t_send - r->t0;
    res->e2e = now - q->t_send;
    res->prompt_tokens = q->prompt_tokens;
    res->completion_tokens = q->completion_tokens;
    res->chunks = q->chunks;
    res->prompt_words = q->item.prompt_words;
    res->max_tokens = q->item.max_tokens;
    res->session = q->item.session_id;
    res->turn = q->item.turn;
    res->ttft = res->tpot = -1;
    if (q->sse_mode) {
        if (q->chunks > 0)
            res->ttft = q->t_first - q->t_send;
        int out = lg_result_output_tokens(res);
        if (res->ttft >= 0 && out > 1)
            res->tpot = (res->e2e - res->ttft) / (out - 1);
        res->itl = q->itl;
        res->n_itl = q->n_itl;
        q->itl = NULL;
    } else if (ok) {
        res->ttft = res->e2e; /* a non-stream reply arrives in one piece */
    }
    if (!q->warmup) {
        r->done++;
        if (!ok)
            r->failed++;
    }
}

/* ---- request life ---- */

static void conn_release(struct conn *c, bool keep)
{
    struct runner *r = c->r;
    if (c->req)
        c->req->conn = NULL;
    c->req = NULL;
    if (keep && r->phase != PH_STOPPING && !c->c.closing) {
        c->reused = true;
        lg_http_parser_reset(&c->parser);
        c->next_idle = r->idle;
        r->idle = c;
    } else {
        lg_conn_close(&c->c);
    }
}

static void req_free(struct req *q)
{
    free(q->wire);
    free(q->body);
    free(q->reply);
    free(q->itl);
    lg_sse_destroy(&q->sse);
    lg_work_item_clear(&q->item);
    free(q);
}

static void active_remove(struct runner *r, struct req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        r->active = q->next;
    if (q->next)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void push_pending(struct runner *r, lg_work_item *it)
{
    struct pending *p = malloc(sizeof *p);
    if (!p) {
        lg_workload_session_end(r->w, it->session);
        lg_work_item_clear(it);
        return;
    }
    p->item = *it;
    p->next = NULL;
    if (r->pend_tail)
        r->pend_tail->next = p;
    else
        r->pend_head = p;
    r->pend_tail = p;
}

/* Ends a request that has been recorded: continues its chat session, frees it. */
static void req_done(struct req *q, bool ok)
{
    struct runner *r = q->r;
    active_remove(r, q);
    r->inflight--;
    if (q->warmup)
        r->warm_done++;
    lg_session *s = q->item.session;
    q->item.session = NULL;
    if (s) {
        if (ok && !q->warmup && r->phase == PH_MEASURE) {
            lg_work_item next;
            int rc = lg_workload_followup(r->w, s, q->reply, q->rlen, &next);
            if (rc == 0)
                push_pending(r, &next);
        } else {
            lg_workload_session_end(r->w, s);
        }
    }
    req_free(q);
    pump(r);
}

static void req_fail(struct req *q, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void req_fail(struct req *q, const char *reason, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    record(q, false, reason, msg);
    if (q->conn)
        conn_release(q->conn, false); /* the connection's state is unknown now */
    req_done(q, false);
}

static int append(char **buf, size_t *len, size_t *cap, const char *d, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 1024;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return DP_ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, d, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

static void read_usage(struct req *q, const cJSON *root)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
    if (!cJSON_IsObject(u))
        return;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (cJSON_IsNumber(pt))
        q->prompt_tokens = pt->valueint;
    if (cJSON_IsNumber(ct))
        q->completion_tokens = ct->valueint;
}

static const char *choice_text(const cJSON *choice, bool *finished)
{
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    if (cJSON_IsString(fr))
        *finished = true;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(choice, "text");
    if (cJSON_IsString(t))
        return t->valuestring;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(choice, "delta");
    if (!cJSON_IsObject(d))
        d = cJSON_GetObjectItemCaseSensitive(choice, "message");
    if (cJSON_IsObject(d)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "content");
        if (cJSON_IsString(c) && c->valuestring[0])
            return c->valuestring;
        c = cJSON_GetObjectItemCaseSensitive(d, "reasoning_content");
        if (cJSON_IsString(c))
            return c->valuestring;
    }
    return NULL;
}

static void on_sse_event(void *ud, const char *event, const char *data, size_t len)
{
    struct req *q = ud;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        q->saw_done = true;
        return;
    }
    cJSON *root = cJSON_ParseWithLength(data, len);
    if (!root) {
        q->bad_json = true;
        return;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (e && !cJSON_IsNull(e)) {
        const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        snprintf(q->stream_err, sizeof q->stream_err, "%s",
                 cJSON_IsString(m) ? m->valuestring : "error event in the stream");
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    const cJSON *ch;
    bool got_text = false;
    cJSON_ArrayForEach(ch, choices)
    {
        const char *t = choice_text(ch, &q->saw_finish);
        if (t && t[0]) {
            got_text = true;
            if (q->item.session && append(&q->reply, &q->rlen, &q->rcap, t, strlen(t)))
                q->oom = true;
        }
    }
    if (got_text) {
        double now = q->r->now;
        if (q->chunks == 0) {
            q->t_first = now;
        } else {
            if (q->n_itl == q->cap_itl) {
                size_t nc = q->cap_itl ? q->cap_itl * 2 : 64;
                double *ni = realloc(q->itl, nc * sizeof *ni);
                if (!ni)
                    q->oom = true;
                else {
                    q->itl = ni;
                    q->cap_itl = nc;
                }
            }
            if (q->n_itl < q->cap_itl)
                q->itl[q->n_itl++] = now - q->t_last;
        }
        q->t_last = now;
        q->chunks++;
    }
    read_usage(q, root);
    cJSON_Delete(root);
}

static void on_headers(void *ud)
{
    struct conn *c = ud;
    struct req *q = c->req;
    if (!q)
        return;
    q->sse_mode = c->parser.status == 200 && strstr(c->parser.content_type, "text/event-stream");
}

static void on_body(void *ud, const char *d, size_t n)
{
    struct conn *c = ud;
    struct req *q = c->req;
    if (!q)
        return;
    if (q->sse_mode) {
        int rc = lg_sse_feed(&q->sse, d, n);
        if (rc && !q->stream_err[0])
            snprintf(q->stream_err, sizeof q->stream_err, "event stream: %s", dp_strerror(rc));
        return;
    }
    size_t room = q->blen < BODY_MAX ? BODY_MAX - q->blen : 0;
    if (n > room)
        n = room;
    if (n && append(&q->body, &q->blen, &q->bcap, d, n))
        q->oom = true;
}

static void snippet(const char *s, size_t len, char *out, size_t outsz)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < outsz && i < 80; i++)
        out[n++] = (s[i] >= 32 && s[i] < 127) ? s[i] : '.';
    out[n] = '\0';
}

/* A whole response arrived on q's connection: judge it, record it, reuse the connection. */
static void req_complete(struct req *q, bool extra_bytes)
{
    struct conn *c = q->conn;
    int status = c->parser.status;
    char msg[300], snip[96];
    bool keep = c->parser.keep_alive && !extra_bytes;
    const char *reason = NULL;
    msg[0] = '\0';
    if (status < 200 || status >= 300) {
        char rb[32];
        snprintf(rb, sizeof rb, "http_%d", status);
        if (!lg_http_error_message(q->body, q->blen, msg, sizeof msg)) {
            snippet(q->body ? q->body : "", q->blen, snip, sizeof snip);
            snprintf(msg, sizeof msg, "HTTP %d %s%s%s", status, c->parser.reason,
                     snip[0] ? ": " : "", snip);
        }
        record(q, false, rb, msg);
        conn_release(c, keep);
        req_done(q, false);
        return;
    }
    if (q->oom) {
        reason = "internal";
        snprintf(msg, sizeof msg, "out of memory while reading the response");
    } else if (q->sse_mode) {
        if (q->stream_err[0]) {
            reason = "stream_error";
            snprintf(msg, sizeof msg, "%s", q->stream_err);
        } else if (q->bad_json) {
            reason = "bad_json";
            snprintf(msg, sizeof msg, "an event's data is not JSON");
        } else if (!q->saw_done && !q->saw_finish) {
            reason = "incomplete_stream";
            snprintf(msg, sizeof msg, "stream ended without [DONE] or a finish_reason");
        }
    } else {
        cJSON *root = cJSON_ParseWithLength(q->body ? q->body : "", q->blen);
        if (!root) {
            reason = "bad_json";
            snippet(q->body ? q->body : "", q->blen, snip, sizeof snip);
            snprintf(msg, sizeof msg, "response is not JSON: \"%s\"", snip);
        } else {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
            const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
            if (e && !cJSON_IsNull(e)) {
                reason = "api_error";
                if (!lg_http_error_message(q->body, q->blen, msg, sizeof msg))
                    snprintf(msg, sizeof msg, "error member in a 2xx reply");
            } else if (!cJSON_IsArray(choices) || cJSON_GetArraySize(choices) == 0) {
                reason = "bad_response";
                snprintf(msg, sizeof msg, "no choices in the reply");
            } else {
                bool fin = false;
                const char *t = choice_text(cJSON_GetArrayItem(choices, 0), &fin);
                if (t && t[0]) {
                    q->chunks = 1;
                    if (q->item.session && append(&q->reply, &q->rlen, &q->rcap, t, strlen(t)))
                        q->oom = true;
                }
                read_usage(q, root);
            }
            cJSON_Delete(root);
        }
    }
    record(q, reason == NULL, reason, msg);
    conn_release(c, keep && reason == NULL);
    req_done(q, reason == NULL);
}

/* ---- connections ---- */

static void send_req(struct conn *c)
{
    struct req *q = c->req;
    free(c->wbuf);
    c->wbuf = malloc(q->wire_len);
    if (!c->wbuf) {
        req_fail(q, "internal", "out of memory");
        return;
    }
    memcpy(c->wbuf, q->wire, q->wire_len);
    int rc = lg_conn_write(&c->c, c->wbuf, q->wire_len);
    if (rc)
        req_fail(q, "write_error", "write: %s", uv_strerror(rc));
}

static void c_on_connect(lg_conn *lc, int status)
{
    struct conn *c = lc->ud;
    if (!c->req) {
        lg_conn_close(lc);
        return;
    }
    if (status) {
        char reason[40];
        snprintf(reason, sizeof reason, "connect_%s", uv_err_name(status));
        req_fail(c->req, reason, "connect: %s", uv_strerror(status));
        return;
    }
    send_req(c);
}

static void c_on_write(lg_conn *lc, int status)
{
    struct conn *c = lc->ud;
    free(c->wbuf);
    c->wbuf = NULL;
    if (status && c->req)
        req_fail(c->req, "write_error", "write: %s", uv_strerror(status));
}

static void idle_remove(struct runner *r, struct conn *c)
{
    for (struct conn **pp = &r->idle; *pp; pp = &(*pp)->next_idle)
        if (*pp == c) {
            *pp = c->next_idle;
            c->next_idle = NULL;
            return;
        }
}

static void c_on_data(lg_conn *lc, const char *d, size_t n)
{
    struct conn *c = lc->ud;
    struct req *q = c->req;
    if (!q) {
        /* Bytes on an idle connection belong to no request: do not reuse it. */
        idle_remove(c->r, c);
        lg_conn_close(lc);
        return;
    }
    c->r->now = dp_now();
    size_t used = 0;
    int rc = lg_http_parser_feed(&c->parser, d, n, &used);
    if (rc == LG_HTTP_COMPLETE)
        req_complete(q, used < n);
    else if (rc < 0)
        req_fail(q, "bad_http", "malformed HTTP response: %s", c->parser.err);
}

static void c_on_eof(lg_conn *lc, int status)
{
    struct conn *c = lc->ud;
    struct runner *r = c->r;
    struct req *q = c->req;
    if (!q) {
        idle_remove(r, c);
        lg_conn_close(lc);
        return;
    }
    r->now = dp_now();
    bool got_any = c->parser.got_any;
    int state = c->parser.state;
    if (lg_http_parser_eof(&c->parser) == LG_HTTP_COMPLETE) {
        req_complete(q, false);
        return;
    }
    if (c->reused && !got_any && q->retries < 2) {
        /* The server closed a kept-alive connection as we reused it: retry fresh. */
        q->retries++;
        r->out->retries++;
        conn_release(c, false);
        assign_conn(q);
        return;
    }
    const char *how = status == UV_EOF ? "closed by the server" : uv_strerror(status);
    if (!got_any)
        req_fail(q, "closed_before_response", "connection %s before any response", how);
    else if (state == LG_HTTP_STATUS || state == LG_HTTP_HEADERS)
        req_fail(q, "closed_in_headers", "connection %s in the response headers", how);
    else if (q->sse_mode)
        req_fail(q, "closed_mid_stream", "connection %s mid-stream after %d chunks", how, q->chunks);
    else
        req_fail(q, "closed_mid_body", "connection %s mid-body (HTTP %d)", how, c->parser.status);
}

static void c_on_closed(lg_conn *lc)
{
    struct conn *c = lc->ud;
    free(c->wbuf);
    free(c);
}

static const lg_conn_ops conn_ops = {
    .on_connect = c_on_connect,
    .on_data = c_on_data,
    .on_eof = c_on_eof,
    .on_write = c_on_write,
    .on_closed = c_on_closed,
};

static void assign_conn(struct req *q)
{
    struct runner *r = q->r;
    struct conn *c = r->idle;
    if (c) {
        r->idle = c->next_idle;
        c->next_idle = NULL;
        c->req = q;
        q->conn = c;
        send_req(c);
        return;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        req_fail(q, "internal", "out of memory");
        return;
    }
    c->r = r;
    lg_http_parser_init(&c->parser, on_body, on_headers, c);
    int rc = lg_conn_open(&c->c, &r->loop, (const struct sockaddr *)&r->addr, &conn_ops, c);
    if (rc) {
        if (!c->c.closing)
            free(c); /* never opened; else c_on_closed frees it */
        char reason[40];
        snprintf(reason, sizeof reason, "connect_%s", uv_err_name(rc));
        req_fail(q, reason, "connect: %s", uv_strerror(rc));
        return;
    }
    c->req = q;
    q->conn = c;
}

static void start_req(struct runner *r, lg_work_item *it, bool warmup)
{
    struct req *q = calloc(1, sizeof *q);
    if (!q) {
        lg_workload_session_end(r->w, it->session);
        lg_work_item_clear(it);
        r->fatal = true;
        snprintf(r->fatal_msg, sizeof r->fatal_msg, "out of memory");
        return;
    }
    q->r = r;
    q->item = *it;
    memset(it, 0, sizeof *it);
    q->warmup = warmup;
    q->id = r->next_id++;
    q->prompt_tokens = q->completion_tokens = -1;
    lg_sse_init(&q->sse, on_sse_event, q);
    q->t_send = dp_now();
    q->deadline = q->t_send + r->o->timeout_s;
    q->next = r->active;
    if (r->active)
        r->active->prev = q;
    r->active = q;
    r->inflight++;
    if (r->inflight > r->out->concurrency_seen)
        r->out->concurrency_seen = r->inflight;
    if (lg_http_request_build(&q->wire, &q->wire_len, "POST", &r->o->url, r->o->path,
                              r->o->extra_headers, q->item.body, q->item.body_len)) {
        req_fail(q, "internal", "cannot build the request");
        return;
    }
    assign_conn(q);
}

/* ---- scheduling ---- */

static void on_arrival(uv_timer_t *t);

static void schedule_arrival(struct runner *r)
{
    if (r->new_limit >= 0 && r->new_issued + r->arrivals_due >= r->new_limit)
        return;
    r->next_arrival += lg_rng_interarrival(&r->rng, r->o->rate, r->o->burstiness);
    double wait = r->next_arrival - dp_now();
    uint64_t ms = wait > 0 ? (uint64_t)ceil(wait * 1000.0) : 0;
    uv_timer_start(&r->arrival, on_arrival, ms, 0);
}

static void on_arrival(uv_timer_t *t)
{
    struct runner *r = t->data;
    if (r->phase != PH_MEASURE)
        return;
    double now = dp_now();
    /* Timers are in whole ms: let every arrival that is due now in, then re-arm. */
    do {
        r->arrivals_due++;
        if (r->new_limit >= 0 && r->new_issued + r->arrivals_due >= r->new_limit)
            break;
        r->next_arrival += lg_rng_interarrival(&r->rng, r->o->rate, r->o->burstiness);
    } while (r->next_arrival <= now);
    if (!(r->new_limit >= 0 && r->new_issued + r->arrivals_due >= r->new_limit)) {
        double wait = r->next_arrival - now;
        uv_timer_start(&r->arrival, on_arrival, wait > 0 ? (uint64_t)ceil(wait * 1000.0) : 0, 0);
    }
    pump(r);
}

static void begin_measure(struct runner *r)
{
    r->phase = PH_MEASURE;
    r->t0 = dp_now();
    r->rate_t = r->t0;
    if (r->o->rate > 0 && !isinf(r->o->rate)) {
        r->arrivals_unlimited = false;
        r->arrivals_due = 1; /* the first request goes at t0 */
        r->next_arrival = r->t0;
        schedule_arrival(r);
    } else {
        r->arrivals_unlimited = true;
    }
}

static void check_done(struct runner *r)
{
    if (r->phase == PH_WARMUP && r->warm_done >= r->o->warmup && r->inflight == 0) {
        begin_measure(r);
        pump(r);
        return;
    }
    if (r->phase == PH_MEASURE && r->inflight == 0 && !r->pend_head && r->new_limit >= 0 &&
        r->new_issued >= r->new_limit)
        finish_run(r);
}

static void pump(struct runner *r)
{
    while (r->phase != PH_STOPPING && !r->fatal) {
        if (r->o->concurrency > 0 && r->inflight >= r->o->concurrency)
            break;
        lg_work_item it;
        if (r->phase == PH_WARMUP) {
            if (r->warm_issued >= r->o->warmup)
                break;
            if (lg_workload_next(r->w, &it)) {
                r->fatal = true;
                snprintf(r->fatal_msg, sizeof r->fatal_msg, "cannot build a request (out of memory)");
                break;
            }
            r->warm_issued++;
            start_req(r, &it, true);
            continue;
        }
        if (r->pend_head) {
            struct pending *p = r->pend_head;
            r->pend_head = p->next;
            if (!r->pend_head)
                r->pend_tail = NULL;
            it = p->item;
            free(p);
            start_req(r, &it, false);
            continue;
        }
        if (r->new_limit >= 0 && r->new_issued >= r->new_limit)
            break;
        if (!r->arrivals_unlimited) {
            if (r->arrivals_due <= 0)
                break;
            r->arrivals_due--;
        }
        if (lg_workload_next(r->w, &it)) {
            r->fatal = true;
            snprintf(r->fatal_msg, sizeof r->fatal_msg, "cannot build a request (out of memory)");
            break;
        }
        r->new_issued++;
        start_req(r, &it, false);
    }
    if (r->fatal) {
        finish_run(r);
        return;
    }
    check_done(r);
}

static void print_progress(struct runner *r, bool final)
{
    double now = dp_now();
    if (now - r->rate_t >= 1.0) {
        r->cur_rate = (double)(r->done - r->rate_done) / (now - r->rate_t);
        r->rate_done = r->done;
        r->rate_t = now;
    }
    char total[32];
    if (r->new_limit >= 0 && r->o->turns > 1)
        snprintf(total, sizeof total, "~%lld", (long long)r->o->num_requests);
    else if (r->new_limit >= 0)
        snprintf(total, sizeof total, "%lld", (long long)r->o->num_requests);
    else
        snprintf(total, sizeof total, "?");
    const char *phase = r->phase == PH_WARMUP ? "warm-up " : "";
    fprintf(stderr, "%s[dp-loadgen] %s%zu/%s done, %d in flight, %.1f req/s, %zu errors, %.1f s%s",
            r->tty ? "\r\033[K" : "", phase, r->done, total, r->inflight, r->cur_rate, r->failed,
            now - r->t_begin, (r->tty && !final) ? "" : "\n");
    fflush(stderr);
}

static void on_tick(uv_timer_t *t)
{
    struct runner *r = t->data;
    double now = dp_now();
    r->now = now;
    if (r->o->duration_s > 0 && now - r->t_begin >= r->o->duration_s) {
        r->out->time_limited = true;
        finish_run(r);
        return;
    }
    struct req *q = r->active, *next;
    for (; q; q = next) {
        next = q->next;
        if (now >= q->deadline) {
            int st = q->conn ? q->conn->parser.status : 0;
            req_fail(q, "timeout", "no complete response after %.1f s (HTTP %d, %d chunks)",
                     r->o->timeout_s, st, q->chunks);
            if (r->phase == PH_STOPPING)
                return;
            next = r->active; /* the list may have changed; timed-out ones are gone */
        }
    }
    if (r->show_progress && now - r->last_progress >= (r->tty ? 0.5 : 5.0)) {
        r->last_progress = now;
        print_progress(r, false);
    }
}

static void on_sigint(uv_signal_t *s, int signum)
{
    struct runner *r = s->data;
    r->out->interrupted = true;
    finish_run(r);
}

static void finish_run(struct runner *r)
{
    if (r->phase == PH_STOPPING)
        return;
    int was = r->phase;
    r->phase = PH_STOPPING;
    double now = dp_now();
    r->out->duration = was == PH_MEASURE ? now - r->t0 : 0;
    uv_timer_stop(&r->tick);
    uv_timer_stop(&r->arrival);
    uv_close((uv_handle_t *)&r->tick, NULL);
    uv_close((uv_handle_t *)&r->arrival, NULL);
    uv_close((uv_handle_t *)&r->sigint, NULL);
    while (r->idle) {
        struct conn *c = r->idle;
        r->idle = c->next_idle;
        lg_conn_close(&c->c);
    }
    if (r->show_progress)
        print_progress(r, true); /* before the abort, so it shows what was in flight */
    while (r->active) {
        struct req *q = r->active;
        if (!q->warmup) {
            r->out->incomplete++;
            r->out->incomplete_chunks += (size_t)q->chunks;
        }
        if (q->conn)
            conn_release(q->conn, false);
        active_remove(r, q);
        r->inflight--;
        lg_workload_session_end(r->w, q->item.session);
        q->item.session = NULL;
        req_free(q);
    }
    while (r->pend_head) {
        struct pending *p = r->pend_head;
        r->pend_head = p->next;
        lg_workload_session_end(r->w, p->item.session);
        lg_work_item_clear(&p->item);
        free(p);
    }
    r->pend_tail = NULL;
}

int lg_run_execute(const lg_run_opts *o, lg_workload *w, lg_run_result *out, char *err,
                   size_t errsz)
{
    memset(out, 0, sizeof *out);
    struct runner *r = calloc(1, sizeof *r);
    if (!r)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    r->o = o;
    r->w = w;
    r->out = out;
    int rc = lg_url_resolve(&o->url, &r->addr, err, errsz);
    if (rc) {
        free(r);
        return rc;
    }
    rc = uv_loop_init(&r->loop);
    if (rc) {
        free(r);
        return dp_err(err, errsz, DP_EIO, "uv_loop_init: %s", uv_strerror(rc));
    }
    rng_seed(&r->rng, o->seed ^ 0xA5A5A5A5u);
    uv_timer_init(&r->loop, &r->tick);
    uv_timer_init(&r->loop, &r->arrival);
    uv_signal_init(&r->loop, &r->sigint);
    r->tick.data = r->arrival.data = r->sigint.data = r;
    uv_signal_start(&r->sigint, on_sigint, SIGINT);
    uv_unref((uv_handle_t *)&r->sigint);
    r->tty = isatty(2);
    r->show_progress = o->progress;
    if (o->num_requests > 0) {
        int turns = o->turns > 1 ? o->turns : 1;
        r->new_limit = (o->num_requests + turns - 1) / turns;
    } else {
        r->new_limit = -1;
        if (o->duration_s <= 0) {
            uv_loop_close(&r->loop);
            free(r);
            return dp_err(err, errsz, DP_EINVAL, "an unlimited number of requests needs a time limit");
        }
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out->wall_start = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    r->t_begin = r->t0 = r->last_progress = r->rate_t = dp_now();
    r->phase = o->warmup > 0 ? PH_WARMUP : PH_MEASURE;
    if (r->phase == PH_MEASURE)
        begin_measure(r);
    uv_timer_start(&r->tick, on_tick, TICK_MS, TICK_MS);
    pump(r);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    rc = 0;
    if (r->fatal)
        rc = dp_err(err, errsz, DP_ENOMEM, "%s", r->fatal_msg);
    if (uv_loop_close(&r->loop) != 0)
        dp_log(DP_LOG_WARN, "loadgen: libuv loop closed with handles open");
    free(r);
    return rc;
}
