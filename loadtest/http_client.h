/* http_client.h: the load generator's HTTP/1.1 client: URL parsing, request
 * writing, an incremental response parser (chunked, keep-alive) and a libuv connection. */
#ifndef DP_LOADTEST_HTTP_CLIENT_H
#define DP_LOADTEST_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "common/dp.h"

/* ---- URL ---- */

typedef struct lg_url {
    char host[256];
    int port;
    char prefix[512]; /* path before the endpoint, no trailing '/' ("" or "/v1") */
} lg_url;

/* Accepts http://host[:port][/prefix]; https is refused (no TLS here). */
int lg_url_parse(lg_url *u, const char *text, char *err, size_t errsz);

/* ---- request writer ---- */

/* Builds a complete request (headers + body) into a malloc'ed buffer.
 * body may be NULL for GET. extra_headers: "Name: value\r\n"... or NULL. */
int lg_http_request_build(char **out, size_t *out_len, const char *method, const lg_url *u,
                          const char *path, const char *extra_headers, const char *body,
                          size_t body_len);

/* ---- response parser ---- */

enum lg_http_state {
    LG_HTTP_STATUS = 0,
    LG_HTTP_HEADERS,
    LG_HTTP_BODY_LENGTH,
    LG_HTTP_CHUNK_SIZE,
    LG_HTTP_CHUNK_DATA,
    LG_HTTP_CHUNK_CRLF,
    LG_HTTP_TRAILERS,
    LG_HTTP_BODY_EOF,
    LG_HTTP_DONE,
    LG_HTTP_ERROR,
};

/* Returned by lg_http_parser_feed. */
enum { LG_HTTP_MORE = 0, LG_HTTP_COMPLETE = 1 };

typedef void (*lg_http_body_cb)(void *ud, const char *data, size_t len);
typedef void (*lg_http_headers_cb)(void *ud);

#define LG_HTTP_LINE_MAX 8192

typedef struct lg_http_parser {
    int state;
    int status;          /* e.g. 200 */
    int version_minor;   /* HTTP/1.x */
    bool chunked;
    int64_t content_length; /* -1 when absent */
    int64_t remaining;      /* bytes left in the body or the current chunk */
    bool keep_alive;        /* after this response, the connection may be reused */
    bool head_request;      /* no body expected (HEAD) */
    bool got_any;           /* at least one byte of this response arrived */
    char content_type[128];
    char reason[128];
    char line[LG_HTTP_LINE_MAX];
    size_t line_len;
    char err[128];
    lg_http_body_cb on_body;
    lg_http_headers_cb on_headers;
    void *ud;
} lg_http_parser;

void lg_http_parser_init(lg_http_parser *p, lg_http_body_cb on_body, lg_http_headers_cb on_headers,
                         void *ud);
/* Prepares for the next response on the same connection (keeps callbacks). */
void lg_http_parser_reset(lg_http_parser *p);
/* Feeds bytes. Returns LG_HTTP_MORE, LG_HTTP_COMPLETE (with *consumed bytes used,
 * the rest belongs to the next response), or DP_EFORMAT (message in p->err). */
int lg_http_parser_feed(lg_http_parser *p, const char *data, size_t len, size_t *consumed);
/* The peer closed the connection: completes a read-until-close body, else
 * returns DP_EFORMAT with the reason in p->err. */
int lg_http_parser_eof(lg_http_parser *p);

/* Extracts the message of an OpenAI error body ({"error": {"message": ...}},
 * or {"error": "text"}, or {"message": ...}) into msg. Returns true when found. */
bool lg_http_error_message(const char *body, size_t len, char *msg, size_t msgsz);

/* ---- libuv connection ---- */

typedef struct lg_conn lg_conn;

/* Events of a connection; exactly one of on_error/on_close ends its life. */
typedef struct lg_conn_ops {
    void (*on_connect)(lg_conn *c, int status);      /* status: 0 or a uv error */
    void (*on_data)(lg_conn *c, const char *d, size_t n);
    void (*on_eof)(lg_conn *c, int status);          /* UV_EOF or a uv error */
    void (*on_write)(lg_conn *c, int status);
    void (*on_closed)(lg_conn *c);                   /* memory may be freed now */
} lg_conn_ops;

struct lg_conn {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t write_req;
    const lg_conn_ops *ops;
    void *ud;
    bool connected, closing, writing;
    char rbuf[65536];
};

/* Starts connecting to addr; the callbacks arrive on loop. On failure returns a uv
 * error; then on_closed follows when c->closing is set, else c was never opened. */
int lg_conn_open(lg_conn *c, uv_loop_t *loop, const struct sockaddr *addr, const lg_conn_ops *ops,
                 void *ud);
/* Writes buf (which must stay valid until on_write). */
int lg_conn_write(lg_conn *c, const char *buf, size_t len);
/* Closes; on_closed follows. Safe to call twice. */
void lg_conn_close(lg_conn *c);

/* ---- helpers built on the pieces above ---- */

/* Resolves u->host (blocking getaddrinfo; done once before a run). */
int lg_url_resolve(const lg_url *u, struct sockaddr_storage *out, char *err, size_t errsz);

/* One GET on its own short-lived loop (for /metrics and /v1/models). On success
 * *status is the HTTP status and *body a malloc'ed NUL-terminated body. */
int lg_http_fetch(const lg_url *u, const char *path, const char *extra_headers, double timeout_s,
                  int *status, char **body, size_t *body_len, char *err, size_t errsz);
#endif
