/* http.h: the HTTP transport: libmicrohttpd in external epoll mode driven by
 * libuv, each connection watched for hang-ups and held to its deadlines,
 * request bodies read (capped) and responses queued. It knows nothing of
 * routes, jobs or the engine: its owner fills a dp_http_cbs table, as a
 * libuv handle's owner fills its callbacks, and the transport calls them. */
#ifndef DP_API_HTTP_H
#define DP_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include <microhttpd.h>
#include <uv.h>

#include "errors.h"

typedef struct dp_http dp_http;

/* One HTTP request (MHD's per-request context), made by the transport at
 * the request's headers and freed after cb.done. */
typedef struct dp_hreq {
    /* read-only for the owner */
    dp_http *http;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    char *body;       /* the whole body once cb.request runs */
    size_t len;
    double t_start;   /* dp_now() at the headers */
    unsigned status;  /* the queued HTTP status (0: none yet) */
    bool answered;    /* a response is queued */
    bool client_gone; /* the peer hung up before the request was parsed */
    /* the owner's */
    void *data;       /* what the owner attached (a generation job) */
    bool close;       /* answer with Connection: close (the framing is in doubt) */
    /* private */
    size_t cap;
    bool too_large;
} dp_hreq;

/* The deadlines a connection is held to (see http.c). */
typedef enum dp_http_deadline {
    DP_DEADLINE_HEADERS, /* complete request headers after connecting */
    DP_DEADLINE_BODY,    /* a stalled request body */
    DP_DEADLINE_IDLE,    /* a kept-alive connection's next request */
    DP_DEADLINE_KINDS
} dp_http_deadline;

typedef struct dp_http_opts {
    const char *host;      /* numeric address or "localhost"; NULL or "": 127.0.0.1 */
    int port;              /* 0: any free port (http.port after http_open) */
    const char *unix_path; /* non-empty: listen on this unix socket instead */
    size_t max_body;       /* bytes; larger bodies get 413 */
    unsigned conn_limit;
    unsigned per_ip_limit; /* 0: none */
    double timeout_s[DP_DEADLINE_KINDS]; /* seconds, 0: none */
} dp_http_opts;

/* What the transport calls, each with ud. */
typedef struct dp_http_cbs {
    void *ud;
    /* At a request's headers, before any body byte (framing and size are
     * checked first): may answer it (API keys, CORS preflights). */
    enum MHD_Result (*headers)(void *ud, dp_hreq *h);
    /* The whole request is in; called again after a resume of its
     * connection (http_resume) while h is unanswered. */
    enum MHD_Result (*request)(void *ud, dp_hreq *h);
    /* Each response, before it is queued: add headers, count the status. */
    void (*respond)(void *ud, dp_hreq *h, struct MHD_Response *r, unsigned status);
    /* The peer hung up, or a deadline ended its connection, while h was
     * being served. */
    void (*client_gone)(void *ud, dp_hreq *h);
    /* The request ended (answered or not); h is freed after this. */
    void (*done)(void *ud, dp_hreq *h, enum MHD_RequestTerminationCode toe);
    /* A deadline closed a connection. */
    void (*deadline)(void *ud, dp_http_deadline which);
    /* After every run of MHD (the owner checks whether a drain is over). */
    void (*ran)(void *ud);
} dp_http_cbs;

struct dp_http {
    /* read-only */
    int port;              /* bound port, after http_open */
    unsigned n_conns;      /* open connections */
    int n_hreqs;           /* requests not yet done */
    /* private */
    uv_loop_t *loop;
    dp_http_opts opts;
    dp_http_cbs cb;
    struct MHD_Daemon *mhd;
    struct dp_conn *conns; /* open connections, watched */
    bool unix_bound;       /* the unix socket file is ours to unlink */
    struct stat unix_ident; /* ... while it is still this file */
    uv_poll_t poll;        /* MHD's epoll fd */
    uv_timer_t timer;      /* MHD's next timeout */
    bool poll_open, timer_open;
    bool in_mhd;           /* inside MHD_run: never re-enter */
    bool conn_closed;      /* one closed during the current MHD_run */
    bool quiesced;         /* the listen socket is closed */
};

/* ---- lifecycle ---- */

/* Copies o and cb (o's strings must outlive t); nothing listens yet. */
void http_init(dp_http *t, uv_loop_t *loop, const dp_http_opts *o, const dp_http_cbs *cb);
int http_open(dp_http *t, char *err, size_t errsz);
/* Stops accepting (the listen socket closes: new connections are refused). */
void http_quiesce(dp_http *t);
/* Draining: closes the connections still sending a request body (each holds
 * a request that would keep a drain waiting for its deadline; it would only
 * get a 503). Kept-alive ones stay. */
void http_end_uploads(dp_http *t);
/* Stops MHD (every connection closed) and unlinks the unix socket. */
void http_close(dp_http *t);
/* Closes the loop handles; the loop must run their close callbacks before
 * t's memory goes. */
void http_release(dp_http *t);

/* Whether host:port can be listened on as far as names go (the lookup
 * http_open does). */
int http_check_address(const char *host, int port, char *err, size_t errsz);

/* ---- serving ---- */

/* Runs MHD now (after a resume, or when the owner has news). */
void http_kick(dp_http *t);
/* Parks h's connection until http_resume (a response still being made). */
void http_suspend(struct MHD_Connection *conn);
void http_resume(dp_http *t, struct MHD_Connection *conn);

/* Queues r with status and marks h answered (cb.respond adds its headers;
 * Connection: close where the framing is in doubt). */
enum MHD_Result http_queue(dp_hreq *h, unsigned status, struct MHD_Response *r);
/* Queues a buffer; takes ownership of body (malloc'd; NULL: a 500 "out of
 * memory"). */
enum MHD_Result http_send(dp_hreq *h, unsigned status, const char *ctype, char *body, size_t len);
/* ... with one more header (hname: hval). */
enum MHD_Result http_send_header(dp_hreq *h, unsigned status, const char *ctype, char *body,
                                 size_t len, const char *hname, const char *hval);
/* An OpenAI-style error, with Retry-After, Allow or WWW-Authenticate as its
 * status asks. */
enum MHD_Result http_send_error(dp_hreq *h, const dp_api_err *e);

#endif
