/* server.h: the HTTP API server on the loop thread: libmicrohttpd driven by
 * libuv, the OpenAI routes, and the bridge from the engine's outbox (one
 * uv_async_t) to suspended connections. */
#ifndef DP_API_SERVER_H
#define DP_API_SERVER_H

#include <stdint.h>

#include <uv.h>

#include "engine/engine.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

typedef struct dp_server dp_server;

typedef struct dp_server_opts {
    const char *host;         /* numeric IPv4/IPv6 address or "localhost" */
    int port;                 /* 0: any free port (see server_port) */
    const char *model_name;   /* id served by /v1/models */
    const char *model_alias;  /* also accepted in "model"; may be NULL */
    const char *backend;      /* for build info */
    size_t max_body;          /* bytes; larger bodies get 413 */
    unsigned conn_limit;
    unsigned conn_timeout_s;  /* idle connections are closed after this */
    double ping_interval_s;   /* SSE comment while a stream has nothing to send */
    int32_t default_max_tokens; /* a request without max_tokens; 0: the endpoint's default */
} dp_server_opts;

void server_opts_default(dp_server_opts *o);

/* Creates the server and its async handle on loop; nothing listens yet. */
int server_init(dp_server **out, uv_loop_t *loop, const dp_server_opts *o,
                const dp_tokenizer *tok, const dp_chat_template *tmpl, char *err, size_t errsz);
/* The engine's notify callback (ud = the server); thread-safe. */
void server_engine_notify(void *ud);
/* Attaches the engine (before server_listen). */
void server_set_engine(dp_server *s, dp_engine *e);
/* What the loaded model runs on, for dualpath_build_info: backend name, its
 * kernels (the CPU's instruction-set level) and matmul precision. */
void server_set_build_info(dp_server *s, const char *backend, const char *kernels, const char *matmul);
/* Starts listening. */
int server_listen(dp_server *s, char *err, size_t errsz);
int server_port(const dp_server *s);

/* Stops accepting, answers 503 on /health and new requests, lets running
 * requests finish for up to timeout_s, then cancels what remains; done(ud)
 * runs on the loop once no request is left (then call server_close). */
void server_drain(dp_server *s, double timeout_s, void (*done)(void *ud), void *ud);
/* Stops HTTP (every connection closed). Call before engine_stop. */
void server_stop_http(dp_server *s);
/* After engine_stop: takes the last events and closes the loop handles. */
void server_close(dp_server *s);
/* After the loop has run the close callbacks. */
void server_destroy(dp_server *s);

#endif
