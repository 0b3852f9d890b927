/* internal.h: the server's state shared by http.c (libmicrohttpd on libuv),
 * routes.c (dispatch) and server.c (jobs and engine events). Not public. */
#ifndef DP_API_INTERNAL_H
#define DP_API_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <microhttpd.h>
#include <uv.h>

#include "errors.h"
#include "guard.h"
#include "metrics.h"
#include "openai.h"
#include "server.h"

typedef struct dp_job dp_job;

#define DP_SERVER_UNKNOWN_NAMES 64

/* One HTTP request (MHD's per-request context). */
typedef struct dp_hreq {
    dp_server *srv;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    char *body;
    size_t len, cap;
    bool too_large;
    bool answered;   /* a response is queued */
    dp_job *job;     /* generation request, if any (holds a reference) */
    double t_start;  /* access log: dp_now() at the headers */
    unsigned status; /* access log: the queued HTTP status (0: none yet) */
    bool client_gone; /* the peer hung up before the request was parsed */
    bool close;       /* answer with Connection: close (the framing is in doubt) */
} dp_hreq;

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
    struct MHD_Daemon *mhd;
    struct dp_conn *conns;    /* open connections (http.c) */
    bool unix_bound;          /* the unix socket file is ours to unlink */
    struct stat unix_ident;   /* ... while it is still this file */
    uv_poll_t poll;
    uv_timer_t timer;
    uv_timer_t ping;
    uv_timer_t drain_timer;
    uv_async_t async;
    bool poll_open, timers_open, async_open;
    bool in_mhd;              /* inside MHD_run: never re-enter */
    unsigned n_conns;         /* open connections (MHD's connection notifications) */
    bool conn_closed;         /* one closed during the current MHD_run */
    int port;
    int listen_fd;            /* returned by quiesce; closed at stop */
    dp_job *jobs;             /* live jobs */
    int n_jobs;
    int n_hreqs;
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

/* http.c */
int http_open(dp_server *s, char *err, size_t errsz);
void http_kick(dp_server *s);
void http_quiesce(dp_server *s);
void http_close(dp_server *s);
/* Queues a response and counts its status; takes ownership of body (malloc'd). */
enum MHD_Result http_send(dp_hreq *h, unsigned status, const char *ctype, char *body, size_t len);
/* ... with one more header (hname: hval). */
enum MHD_Result http_send_header(dp_hreq *h, unsigned status, const char *ctype, char *body,
                                 size_t len, const char *hname, const char *hval);
enum MHD_Result http_send_error(dp_hreq *h, const dp_api_err *e);
void http_resume(dp_job *j);
/* Adds the CORS headers the request's Origin earns to r. */
void http_add_cors(dp_hreq *h, struct MHD_Response *r);
/* Draining: closes the connections still sending a request body (each
 * holds a request that would keep the drain waiting for its deadline; it
 * would only get a 503). Kept-alive ones stay: their /health says 503. */
void http_end_uploads(dp_server *s);

/* routes.c */
/* At the headers, before any body byte: CORS preflights and the API key
 * check; sets h->answered when it queued a response. */
enum MHD_Result routes_early(dp_server *s, dp_hreq *h);
enum MHD_Result routes_handle(dp_server *s, dp_hreq *h);

/* server.c */
enum MHD_Result server_start_job(dp_server *s, dp_hreq *h, dp_oai_kind kind);
enum MHD_Result server_continue_job(dp_server *s, dp_hreq *h);
void server_hreq_done(dp_server *s, dp_hreq *h, enum MHD_RequestTerminationCode toe);
/* The client of h hung up: its generation (if any) is cancelled and its
 * parked connection resumed so that MHD ends it. */
void server_client_gone(dp_server *s, dp_hreq *h);
void server_check_drain(dp_server *s);

#endif
