/* internal.h: the server's state, shared by server.c (start-up, the
 * transport's callbacks, draining), routes.c (dispatch and the small
 * endpoints) and jobs.c (completion requests and engine events). The
 * transport (http.h) sees none of it. Not public.
 *
 * Calls go one way: server.c -> routes.c -> jobs.c -> http.c. */
#ifndef DP_API_INTERNAL_H
#define DP_API_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>
#include <uv.h>

#include "errors.h"
#include "guard.h"
#include "http.h"
#include "metrics.h"
#include "openai.h"
#include "server.h"

typedef struct dp_job dp_job;

#define DP_SERVER_UNKNOWN_NAMES 64

/* One completion request: n_choices engine requests and their output. */
struct dp_job {
    dp_server *srv;
    int refs;                 /* hreq + stream response + each unfinished choice */
    dp_job *prev, *next;      /* the server's live list */
    struct MHD_Connection *conn; /* NULL once the HTTP request completed */
    bool suspended;
    dp_oai_req req;
    char id[48];
    long long created;
    int n_choices;
    dp_request **reqs;
    dp_oai_choice *choices;
    int n_done;
    bool finished;            /* every choice has its FINISH */
    char *error;              /* first engine error */
    bool cancelled;
    bool client_gone;         /* the peer hung up: generation cancelled, output unwanted */
    /* stream state */
    char *out;
    size_t out_len, out_off, out_cap;
    bool stream_ended;        /* [DONE] queued: the reader ends after out drains */
    double last_write;
    double t_first;           /* access log: earliest first token of any choice */
    double t_start;           /* the request's headers arrived (request_timeout) */
    bool timed_out;           /* cancelled by request_timeout */
    bool out_broken;          /* the stream could not grow: it ends with an error */
    size_t tail_off;          /* of that error ending, sent so far */
};

struct dp_server {
    uv_loop_t *loop;
    dp_server_opts opts;
    const dp_tokenizer *tok;
    const dp_chat_template *tmpl;
    dp_engine *engine;
    void (*lost_fn)(void *ud);  /* server_on_device_lost */
    void *lost_ud;
    bool lost_seen;
    char kernels[32];  /* the backend's kernels for build info: "avx512", "cuda" */
    char matmul[16];   /* "int8" or "exact" (CPU), "f32" elsewhere */
    char backend[16];  /* the backend the model runs on */
    dp_oai_ctx oai;
    dp_metrics metrics;
    dp_guard guard;           /* API keys and CORS origins */
    dp_http http;             /* the transport; calls back server.c */
    uv_timer_t ping;
    uv_timer_t drain_timer;
    uv_async_t async;
    bool timers_open, async_open;
    dp_job *jobs;             /* live jobs */
    int n_jobs;
    bool draining;
    bool drain_forced;        /* drain timeout: running requests were cancelled */
    bool drain_ending;        /* then their grace ran out too: connections end now */
    bool drain_done;
    void (*drain_cb)(void *ud);
    void *drain_ud;
    uint64_t id_counter;
    uint64_t id_salt;
    long long created;        /* start time, for /v1/models */
    char *model_name;
    char *model_alias;
    /* Unknown request field names already logged (each once). */
    char unknown_logged[DP_SERVER_UNKNOWN_NAMES][48];
    int n_unknown_logged;
    bool unknown_overflow;
};

/* routes.c */
/* At the headers, before any body byte: CORS preflights and the API key
 * check; sets h->answered when it queued a response. */
enum MHD_Result routes_early(dp_server *s, dp_hreq *h);
enum MHD_Result routes_handle(dp_server *s, dp_hreq *h);

/* jobs.c */
/* Seeds the request ids (unpredictable across restarts). */
void jobs_init(dp_server *s);
enum MHD_Result jobs_start(dp_server *s, dp_hreq *h, dp_oai_kind kind);
/* A job's request again, after its connection was resumed. */
enum MHD_Result jobs_continue(dp_server *s, dp_hreq *h);
/* The client of h hung up: its generation (if any) is cancelled and its
 * parked connection resumed so that MHD ends it. */
void jobs_client_gone(dp_server *s, dp_hreq *h);
/* h ended: its job loses the connection (and is cancelled if unfinished). */
void jobs_hreq_done(dp_server *s, dp_hreq *h, enum MHD_RequestTerminationCode toe);
/* Takes every engine event from the outbox and applies it. */
void jobs_drain_events(dp_server *s);
/* The ping timer: request_timeout, and SSE comments on quiet streams. */
void jobs_tick(dp_server *s, double now);
void job_cancel(dp_job *j);
/* Resumes j's parked connection, if any (the caller kicks the transport). */
void job_resume(dp_job *j);
void job_free(dp_job *j);

#endif
