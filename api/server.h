/* server.h: the HTTP API server on the loop thread: libmicrohttpd driven by
 * libuv, the OpenAI routes, and the bridge from the engine's outbox (one
 * uv_async_t) to suspended connections. */
#ifndef DP_API_SERVER_H
#define DP_API_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "engine/engine.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

typedef struct dp_server dp_server;

typedef struct dp_server_opts {
    const char *host;         /* numeric IPv4/IPv6 address or "localhost" */
    int port;                 /* 0: any free port (see server_port) */
    const char *unix_path;    /* non-empty: listen on this unix socket instead */
    const char *model_name;   /* id served by /v1/models */
    const char *model_alias;  /* also accepted in "model"; may be NULL */
    const char *backend;      /* for build info */
    size_t max_body;          /* bytes; larger bodies get 413 */
    unsigned conn_limit;
    unsigned per_ip_limit;    /* connections from one address; 0: no such limit */
    /* Deadlines (seconds, 0: none): complete request headers after connecting,
     * a stalled body, and a kept-alive connection's next request (also MHD's
     * inactivity timeout, which bounds a client that stops reading). */
    double header_timeout_s;
    double body_timeout_s;
    double idle_timeout_s;
    double request_timeout_s; /* a generation running longer is cancelled; 0: never */
    double ping_interval_s;   /* SSE comment while a stream has nothing to send */
    int32_t default_max_tokens; /* a request without max_tokens; 0: the endpoint's default */
    bool keep_system;           /* a chat's system prompt stays whole on the decode path */
    const char *api_key_file; /* NULL or "": no authentication */
    bool health_public;       /* /health needs no key (default true) */
    bool metrics_public;      /* /metrics needs no key (default true) */
    const char *cors_origins; /* "" none, "*" any, or comma-separated origins */
} dp_server_opts;

void server_opts_default(dp_server_opts *o);

/* Creates the server and its async handle on loop; nothing listens yet. */
int server_init(dp_server **out, uv_loop_t *loop, const dp_server_opts *o,
                const dp_tokenizer *tok, const dp_chat_template *tmpl, char *err, size_t errsz);
/* The engine's notify callback (ud = the server); thread-safe. */
void server_engine_notify(void *ud);
/* fn(ud) runs on the loop, once, when the engine reports the device lost
 * (engine_device_lost): the daemon then exits to be restarted. */
void server_on_device_lost(dp_server *s, void (*fn)(void *ud), void *ud);
/* Attaches the engine (before server_listen). */
void server_set_engine(dp_server *s, dp_engine *e);
/* What the loaded model runs on, for dualpath_build_info: backend name, its
 * kernels (the CPU's instruction-set level) and matmul precision. */
void server_set_build_info(dp_server *s, const char *backend, const char *kernels, const char *matmul);
/* SIGHUP: reads the API key file again (the old keys stay on error). */
void server_reload(dp_server *s);
/* Starts listening. */
int server_listen(dp_server *s, char *err, size_t errsz);
int server_port(const dp_server *s);
/* Whether host:port can be listened on as far as names go (--check-config:
 * the same lookup serving does). */
int server_check_address(const char *host, int port, char *err, size_t errsz);

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
