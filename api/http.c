/* http.c: libmicrohttpd in external epoll mode driven by libuv: a uv_poll_t
 * on MHD's epoll fd and one kick() (MHD_run + a timer re-armed from
 * MHD_get_timeout). Also request bodies (capped), responses and resumes. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "internal.h"

static void on_timer(uv_timer_t *t)
{
    http_kick(t->data);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    http_kick(p->data);
}

/* While the connection limit is reached MHD keeps its listen socket out of
 * the epoll set; it puts it back at the next MHD_run after a slot frees. */
#define AT_LIMIT_TICK_MS 100

void http_kick(dp_server *s)
{
    if (!s->mhd || s->in_mhd)
        return;
    s->in_mhd = true;
    s->conn_closed = false;
    MHD_run(s->mhd);
    s->in_mhd = false;
    if (!s->mhd)
        return;
    MHD_UNSIGNED_LONG_LONG to = 0;
    uint64_t ms = UINT64_MAX;
    /* 0 ms is common (MHD keeps its own ready list): honour it. */
    if (MHD_get_timeout(s->mhd, &to) == MHD_YES)
        ms = to > 60000 ? 60000 : (uint64_t)to;
    /* A connection closed inside this run: MHD re-adds the listen socket only
     * at its next run, and when the server is idle nothing else would cause
     * one (no fd ready, no timeout), so accepting would stop for good. */
    if (s->conn_closed)
        ms = 0;
    else if (s->n_conns >= s->opts.conn_limit && ms > AT_LIMIT_TICK_MS)
        ms = AT_LIMIT_TICK_MS;
    if (ms != UINT64_MAX)
        uv_timer_start(&s->timer, on_timer, ms, 0);
    else
        uv_timer_stop(&s->timer);
    server_check_drain(s);
}

void http_resume(dp_job *j)
{
    if (j->conn && j->suspended) {
        j->suspended = false;
        MHD_resume_connection(j->conn);
    }
}

static void count(dp_server *s, unsigned status)
{
    metrics_count_response(&s->metrics, (int)status);
}

static enum MHD_Result send_ex(dp_hreq *h, unsigned status, const char *ctype, char *body,
                               size_t len, const char *hname, const char *hval)
{
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        status = 500;
        len = sizeof oom - 1;
        body = malloc(len + 1);
        if (!body)
            return MHD_NO;
        memcpy(body, oom, len + 1);
        ctype = "application/json";
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (hname)
        MHD_add_response_header(r, hname, hval);
    enum MHD_Result ret = MHD_queue_response(h->conn, status, r);
    MHD_destroy_response(r);
    h->answered = true;
    h->status = status;
    count(h->srv, status);
    return ret;
}

enum MHD_Result http_send(dp_hreq *h, unsigned status, const char *ctype, char *body, size_t len)
{
    return send_ex(h, status, ctype, body, len, NULL, NULL);
}

enum MHD_Result http_send_error(dp_hreq *h, const dp_api_err *e)
{
    size_t len = 0;
    char *body = api_err_body(e, &len);
    const char *hn = NULL, *hv = NULL;
    if (e->status == 429 || e->status == 503) {
        hn = MHD_HTTP_HEADER_RETRY_AFTER;
        hv = "1";
    } else if (e->status == 405) {
        hn = MHD_HTTP_HEADER_ALLOW;
        hv = e->allow ? e->allow : "GET";
    }
    if (e->status >= 500)
        dp_log(DP_LOG_WARN, "http: %s %s -> %d: %s", h->method, h->url, e->status, e->message);
    return send_ex(h, (unsigned)e->status, "application/json", body, len, hn, hv);
}

/* Each connection's socket is also watched by the loop for the peer's
 * hang-up (EPOLLRDHUP, level-triggered). MHD cannot see it in two cases: its
 * edge-triggered registration misses a FIN that arrived together with the
 * data it already read, and a suspended connection is out of its epoll set.
 * Either way the slot would be held until the idle timeout. A client that
 * stops sending is gone for HTTP/1.1 purposes (nginx treats it so too). */
typedef struct dp_conn {
    uv_poll_t poll;
    dp_server *srv;
    dp_hreq *hreq;            /* the request being served, if any */
    int fd;
    bool watching;
    bool gone;                /* the peer hung up */
} dp_conn;

static void conn_free(uv_handle_t *h)
{
    free(h->data);
}

static void conn_unwatch(dp_conn *c)
{
    if (c->watching) {
        uv_poll_stop(&c->poll);
        c->watching = false;
    }
}

static void on_hangup(uv_poll_t *p, int status, int events)
{
    dp_conn *c = p->data;
    dp_server *s = c->srv;
    conn_unwatch(c);
    c->gone = true;
    /* Shutting the socket down wakes MHD's own registration (it then reads
     * end-of-file and closes); a suspended request is cancelled, and the
     * write that ends it fails. */
    shutdown(c->fd, SHUT_RDWR);
    if (c->hreq) {
        c->hreq->client_gone = true; /* for a job not started yet */
        server_client_gone(s, c->hreq);
    }
    http_kick(s);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    dp_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        s->n_conns++;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        dp_conn *c = ci ? calloc(1, sizeof *c) : NULL;
        if (!c)
            return; /* served, just not watched for hang-ups */
        c->srv = s;
        c->fd = ci->connect_fd;
        if (uv_poll_init_socket(s->loop, &c->poll, c->fd) != 0) {
            free(c);
            return;
        }
        c->poll.data = c;
        c->watching = uv_poll_start(&c->poll, UV_DISCONNECT, on_hangup) == 0;
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        s->n_conns--;
        s->conn_closed = true;
        dp_conn *c = *socket_context;
        if (c) {
            /* Before MHD closes the fd: its number may be reused at once. */
            conn_unwatch(c);
            uv_close((uv_handle_t *)&c->poll, conn_free);
            *socket_context = NULL;
        }
    }
}

static dp_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload, size_t *upload_size, void **con_cls)
{
    dp_server *s = cls;
    dp_hreq *h = *con_cls;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h)
            return MHD_NO;
        h->srv = s;
        h->conn = conn;
        h->method = method;
        h->url = url;
        h->t_start = dp_now();
        *con_cls = h;
        s->n_hreqs++;
        dp_conn *c = conn_of(conn);
        if (c) {
            c->hreq = h;
            /* MHD may still parse a request whose FIN came with it. */
            h->client_gone = c->gone;
        }
        /* Decide 413 from Content-Length before reading a byte of the body. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->opts.max_body) {
                dp_api_err e;
                api_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                            "the request body exceeds %zu bytes", s->opts.max_body);
                return http_send_error(h, &e);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (h->answered || h->too_large)
            return MHD_YES;
        if (h->len + n > s->opts.max_body) {
            /* Chunked upload over the cap: keep reading, answer at the end. */
            h->too_large = true;
            free(h->body);
            h->body = NULL;
            h->len = h->cap = 0;
            return MHD_YES;
        }
        if (h->len + n > h->cap) {
            size_t nc = h->cap ? h->cap : 4096;
            while (nc < h->len + n)
                nc *= 2;
            char *nb = realloc(h->body, nc);
            if (!nb)
                return MHD_NO;
            h->body = nb;
            h->cap = nc;
        }
        memcpy(h->body + h->len, upload, n);
        h->len += n;
        return MHD_YES;
    }
    if (h->answered)
        return MHD_YES;
    if (h->too_large) {
        dp_api_err e;
        api_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                    "the request body exceeds %zu bytes", s->opts.max_body);
        return http_send_error(h, &e);
    }
    return routes_handle(s, h);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    dp_server *s = cls;
    dp_hreq *h = *con_cls;
    *con_cls = NULL;
    dp_conn *c = conn_of(conn);
    if (c && c->hreq == h)
        c->hreq = NULL;
    if (h)
        server_hreq_done(s, h, toe);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = 0;
    dp_log(DP_LOG_DEBUG, "mhd: %s", buf);
}

int http_open(dp_server *s, char *err, size_t errsz)
{
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    const struct sockaddr *sa;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const char *host = s->opts.host && *s->opts.host ? s->opts.host : "127.0.0.1";
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (s->opts.port < 0 || s->opts.port > 65535)
        return dp_err(err, errsz, DP_EINVAL, "port %d is out of range", s->opts.port);
    if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)s->opts.port);
        sa = (const struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)s->opts.port);
        sa = (const struct sockaddr *)&a6;
        /* "::" (any address) takes IPv4 too; other IPv6 addresses are v6-only. */
        flags |= IN6_IS_ADDR_UNSPECIFIED(&a6.sin6_addr) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    } else {
        return dp_err(err, errsz, DP_EINVAL, "listen address '%s' is not a numeric IPv4/IPv6 address",
                      host);
    }
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->opts.port, NULL, NULL, on_access, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_SOCK_ADDR, sa,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opts.conn_limit,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opts.conn_timeout_s,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_SIGPIPE_HANDLED_BY_APP, (int)1,
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                              MHD_OPTION_END);
    if (!s->mhd)
        return dp_err(err, errsz, DP_EIO, "cannot listen on %s:%d (address in use or not available)",
                      host, s->opts.port);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = pi ? pi->port : s->opts.port;
    const union MHD_DaemonInfo *ei = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!ei || ei->epoll_fd < 0) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return dp_err(err, errsz, DP_EIO, "libmicrohttpd has no epoll fd");
    }
    int rc = uv_poll_init(s->loop, &s->poll, ei->epoll_fd);
    if (rc) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return dp_err(err, errsz, DP_EIO, "uv_poll_init: %s", uv_strerror(rc));
    }
    s->poll.data = s;
    s->poll_open = true;
    uv_poll_start(&s->poll, UV_READABLE, on_poll);
    http_kick(s);
    return 0;
}

void http_quiesce(dp_server *s)
{
    if (!s->mhd || s->listen_fd >= 0)
        return;
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    /* Close it now so new connections are refused rather than left in the
     * backlog; in external mode no MHD thread can still be using it. */
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    s->listen_fd = INT_MAX;
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

void http_close(dp_server *s)
{
    if (s->poll_open) {
        uv_poll_stop(&s->poll);
        uv_close((uv_handle_t *)&s->poll, on_closed);
        s->poll_open = false;
    }
    if (s->mhd) {
        struct MHD_Daemon *d = s->mhd;
        s->in_mhd = true;
        MHD_stop_daemon(d);
        s->in_mhd = false;
        s->mhd = NULL;
    }
    uv_timer_stop(&s->timer);
}
