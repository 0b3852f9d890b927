/* http.c: libmicrohttpd in external epoll mode driven by libuv: a uv_poll_t
 * on MHD's epoll fd and one kick() (MHD_run + a timer re-armed from
 * MHD_get_timeout). Also connection deadlines, request bodies (capped),
 * responses and resumes. What a request means is the owner's (cb). */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/dp.h"
#include "http.h"

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

void http_kick(dp_http *s)
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
    if (s->cb.ran)
        s->cb.ran(s->cb.ud);
}

void http_suspend(struct MHD_Connection *conn)
{
    MHD_suspend_connection(conn);
}

void http_resume(dp_http *t, struct MHD_Connection *conn)
{
    MHD_resume_connection(conn);
}

enum MHD_Result http_queue(dp_hreq *h, unsigned status, struct MHD_Response *r)
{
    dp_http *t = h->http;
    if (h->close) /* the framing is in doubt: never read another request from it */
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (t->cb.respond)
        t->cb.respond(t->cb.ud, h, r, status);
    enum MHD_Result ret = MHD_queue_response(h->conn, status, r);
    h->answered = true;
    h->status = status;
    return ret;
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
    enum MHD_Result ret = http_queue(h, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result http_send(dp_hreq *h, unsigned status, const char *ctype, char *body, size_t len)
{
    return send_ex(h, status, ctype, body, len, NULL, NULL);
}

enum MHD_Result http_send_header(dp_hreq *h, unsigned status, const char *ctype, char *body,
                                 size_t len, const char *hname, const char *hval)
{
    return send_ex(h, status, ctype, body, len, hname, hval);
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
    } else if (e->status == 401) {
        hn = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
        hv = "Bearer";
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
 * stops sending is gone for HTTP/1.1 purposes (nginx treats it so too).
 *
 * Each connection also has a deadline, so that a client sending a byte now
 * and then cannot hold a slot for long (MHD's own timeout only measures
 * inactivity): its request headers must be complete header_timeout after it
 * connects, a body must not stall for body_timeout (nor average under
 * BODY_MIN_RATE after that long), and a kept-alive
 * connection must have its next request's headers in within idle_timeout.
 * While a request is being served (generation, a parked stream) no deadline
 * runs: request_timeout governs that. */
typedef enum conn_phase { PH_HEADERS, PH_BODY, PH_SERVING, PH_IDLE } conn_phase;

typedef struct dp_conn {
    uv_poll_t poll;
    uv_timer_t timer;
    int open_handles;         /* freed when both handles are closed */
    dp_http *srv;
    dp_hreq *hreq;            /* the request being served, if any */
    struct dp_conn *prev, *next; /* the server's open connections */
    int fd;
    bool watching;
    bool gone;                /* the peer hung up, or a deadline closed it */
    conn_phase phase;
    double t_body0;           /* PH_BODY: when the headers were in */
    size_t body_bytes;        /* PH_BODY: body bytes since */
} dp_conn;

static void conn_free(uv_handle_t *h)
{
    dp_conn *c = h->data;
    if (--c->open_handles == 0)
        free(c);
}

static void conn_unwatch(dp_conn *c)
{
    if (c->watching) {
        uv_poll_stop(&c->poll);
        c->watching = false;
    }
}

/* Ends the connection from our side: shutting the socket down wakes MHD's own
 * registration (it then reads end-of-file and closes); a suspended request is
 * cancelled, and the write that ends it fails. */
static void conn_end(dp_conn *c)
{
    dp_http *s = c->srv;
    conn_unwatch(c);
    uv_timer_stop(&c->timer);
    c->gone = true;
    shutdown(c->fd, SHUT_RDWR);
    if (c->hreq) {
        c->hreq->client_gone = true; /* for a request not yet handed on */
        if (s->cb.client_gone)
            s->cb.client_gone(s->cb.ud, c->hreq);
    }
}

static void on_hangup(uv_poll_t *p, int status, int events)
{
    dp_conn *c = p->data;
    conn_end(c);
    http_kick(c->srv);
}

static const char *const phase_what[] = {
    [PH_HEADERS] = "sent no complete request headers",
    [PH_BODY] = "sent no request body bytes",
    [PH_IDLE] = "sent no next request",
};

static dp_http_deadline deadline_of(conn_phase ph)
{
    return ph == PH_HEADERS ? DP_DEADLINE_HEADERS : ph == PH_BODY ? DP_DEADLINE_BODY
                                                                  : DP_DEADLINE_IDLE;
}

static void on_deadline(uv_timer_t *t)
{
    dp_conn *c = t->data;
    dp_http *s = c->srv;
    if (c->phase == PH_SERVING || c->gone)
        return;
    dp_http_deadline which = deadline_of(c->phase);
    double secs = s->opts.timeout_s[which];
    if (s->cb.deadline)
        s->cb.deadline(s->cb.ud, which);
    dp_log(DP_LOG_DEBUG, "http: closing a connection that %s in %.0f s", phase_what[c->phase], secs);
    conn_end(c);
    http_kick(s);
}

static void conn_phase_set(dp_conn *c, conn_phase ph)
{
    dp_http *s = c->srv;
    double secs = ph == PH_SERVING ? 0 : s->opts.timeout_s[deadline_of(ph)];
    c->phase = ph;
    if (ph == PH_BODY) {
        c->t_body0 = dp_now();
        c->body_bytes = 0;
    }
    if (c->gone)
        return;
    if (secs > 0)
        uv_timer_start(&c->timer, on_deadline, (uint64_t)(secs * 1000.0 + 0.5), 0);
    else
        uv_timer_stop(&c->timer);
}

/* Body bytes came: the stall deadline restarts, but never past what an
 * average of BODY_MIN_RATE bytes/s since the headers allows (after a first
 * body_timeout of grace), so a byte now and then cannot hold a slot. */
#define BODY_MIN_RATE 1024.0

static void conn_body_progress(dp_conn *c, size_t n)
{
    dp_http *s = c->srv;
    double secs = s->opts.timeout_s[DP_DEADLINE_BODY];
    c->body_bytes += n;
    if (c->gone || secs <= 0)
        return;
    double now = dp_now();
    double by_rate = c->t_body0 + secs + (double)c->body_bytes / BODY_MIN_RATE;
    double until = now + secs < by_rate ? now + secs : by_rate;
    if (until <= now) {
        on_deadline(&c->timer);
        return;
    }
    uv_timer_start(&c->timer, on_deadline, (uint64_t)((until - now) * 1000.0 + 0.5), 0);
}

static void conn_link(dp_http *s, dp_conn *c)
{
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
}

static void conn_unlink(dp_http *s, dp_conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    dp_http *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        s->n_conns++;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        dp_conn *c = ci ? calloc(1, sizeof *c) : NULL;
        if (!c)
            return; /* served, just not watched for hang-ups and deadlines */
        c->srv = s;
        c->fd = ci->connect_fd;
        if (uv_poll_init_socket(s->loop, &c->poll, c->fd) != 0) {
            free(c);
            return;
        }
        uv_timer_init(s->loop, &c->timer);
        c->poll.data = c->timer.data = c;
        c->open_handles = 2;
        c->watching = uv_poll_start(&c->poll, UV_DISCONNECT, on_hangup) == 0;
        conn_link(s, c);
        conn_phase_set(c, PH_HEADERS);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        s->n_conns--;
        s->conn_closed = true;
        dp_conn *c = *socket_context;
        if (c) {
            /* Before MHD closes the fd: its number may be reused at once. */
            conn_unwatch(c);
            uv_timer_stop(&c->timer);
            conn_unlink(s, c);
            uv_close((uv_handle_t *)&c->poll, conn_free);
            uv_close((uv_handle_t *)&c->timer, conn_free);
            *socket_context = NULL;
        }
    }
}

void http_end_uploads(dp_http *s)
{
    for (dp_conn *c = s->conns; c; c = c->next)
        if (c->phase == PH_BODY && !c->gone)
            conn_end(c);
}

static dp_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Request smuggling behind a proxy needs two readings of one message's
 * length: refuse repeated Content-Length headers and Content-Length together
 * with Transfer-Encoding (RFC 9112 6.3), before reading the body. */
typedef struct hdr_count {
    int content_length;
    int transfer_encoding;
    bool te_not_chunked;  /* a Transfer-Encoding other than exactly "chunked" */
} hdr_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    hdr_count *n = cls;
    if (key && !strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH))
        n->content_length++;
    else if (key && !strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        n->transfer_encoding++;
        if (!value || strcasecmp(value, "chunked"))
            n->te_not_chunked = true;
    }
    return MHD_YES;
}

static bool content_length_ok(const char *cl, unsigned long long *v)
{
    /* Digits only: strtoull would take "+5", " 5" and "-1". */
    if (!cl[0] || strlen(cl) > 19)
        return false;
    for (const char *p = cl; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    *v = strtoull(cl, NULL, 10);
    return true;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload, size_t *upload_size, void **con_cls)
{
    dp_http *s = cls;
    dp_hreq *h = *con_cls;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h)
            return MHD_NO;
        h->http = s;
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
            conn_phase_set(c, PH_BODY);
        }
        dp_api_err e;
        hdr_count hc = {0, 0, false};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &hc);
        const char *framing = hc.content_length > 1 ? "more than one Content-Length header"
                              : hc.content_length && hc.transfer_encoding
                                  ? "both Content-Length and Transfer-Encoding"
                              : hc.transfer_encoding > 1 ? "more than one Transfer-Encoding header"
                              : hc.te_not_chunked ? "a Transfer-Encoding other than chunked"
                                                  : NULL;
        if (framing) {
            api_err_invalid(&e, NULL, "the request has %s", framing);
            h->close = true;
            return http_send_error(h, &e);
        }
        /* Decide 413 from Content-Length before reading a byte of the body. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long v = 0;
        if (cl && !content_length_ok(cl, &v)) {
            api_err_invalid(&e, NULL, "the Content-Length header is not a decimal byte count");
            h->close = true;
            return http_send_error(h, &e);
        }
        /* Preflights and requests without a valid key are answered before
         * their bodies are read. */
        enum MHD_Result r = s->cb.headers ? s->cb.headers(s->cb.ud, h) : MHD_YES;
        if (h->answered)
            return r;
        if (cl && v > s->opts.max_body) {
            api_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                        "the request body exceeds %zu bytes", s->opts.max_body);
            return http_send_error(h, &e);
        }
        return MHD_YES;
    }
    dp_conn *c = conn_of(conn);
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c)
            conn_body_progress(c, n);
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
    if (c && c->phase == PH_BODY)
        conn_phase_set(c, PH_SERVING); /* the whole request is in */
    if (h->answered)
        return MHD_YES;
    if (h->too_large) {
        dp_api_err e;
        api_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                    "the request body exceeds %zu bytes", s->opts.max_body);
        return http_send_error(h, &e);
    }
    return s->cb.request(s->cb.ud, h);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    dp_http *s = cls;
    dp_hreq *h = *con_cls;
    *con_cls = NULL;
    dp_conn *c = conn_of(conn);
    if (c && c->hreq == h)
        c->hreq = NULL;
    if (c)
        conn_phase_set(c, PH_IDLE); /* kept alive: the next request must come */
    if (!h)
        return;
    if (s->cb.done)
        s->cb.done(s->cb.ud, h, toe);
    free(h->body);
    free(h);
    s->n_hreqs--;
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

/* A host name is resolved once, at start-up, to its first address (numeric
 * addresses need no lookup); "::" also takes IPv4 (dual stack), other IPv6
 * addresses are v6-only. http_check_address is the same lookup for --check-config. */
static int resolve(const char *host, int port, struct sockaddr_storage *ss, unsigned *flags,
                   char *err, size_t errsz)
{
    if (port < 0 || port > 65535)
        return dp_err(err, errsz, DP_EINVAL, "port %d is out of range", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1"; /* not whichever of ::1 and 127.0.0.1 the resolver lists first */
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res)
        return dp_err(err, errsz, DP_EINVAL, "listen address '%s' cannot be resolved: %s", host,
                      rc ? gai_strerror(rc) : "no address");
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
        *flags |= IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    }
    return 0;
}

int http_check_address(const char *host, int port, char *err, size_t errsz)
{
    struct sockaddr_storage ss;
    unsigned flags = 0;
    return resolve(host, port, &ss, &flags, err, errsz);
}

/* listen = unix:/PATH. A stale socket file (nobody answers on it) is
 * replaced; a live one is an error, as a TCP port in use is. Returns 0 and
 * the listening socket in *out, or an error code. */
static int unix_listen(const char *path, int *out, struct stat *ident, char *err, size_t errsz)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path)
        return dp_err(err, errsz, DP_EINVAL, "unix socket path '%s' is too long", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return dp_err(err, errsz, DP_EINVAL, "unix socket path '%s' exists and is not a socket",
                          path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (probe >= 0)
            close(probe);
        if (live)
            return dp_err(err, errsz, DP_EIO, "unix socket '%s' is in use by another server", path);
        unlink(path); /* left by a daemon that died */
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dp_err(err, errsz, DP_EIO, "socket(AF_UNIX): %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0 ||
        lstat(path, &st) != 0) {
        int e = errno;
        close(fd);
        return dp_err(err, errsz, DP_EIO, "cannot listen on unix:%s: %s", path, strerror(e));
    }
    *out = fd;
    *ident = st;
    return 0;
}

/* Removes the socket file only while it is still the one we bound: a daemon
 * started during our drain may have replaced it with its own. */
static void unix_unlink(dp_http *s)
{
    struct stat st;
    if (lstat(s->opts.unix_path, &st) == 0 && st.st_dev == s->unix_ident.st_dev &&
        st.st_ino == s->unix_ident.st_ino)
        unlink(s->opts.unix_path);
    s->unix_bound = false;
}

int http_open(dp_http *s, char *err, size_t errsz)
{
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const char *host = s->opts.host && *s->opts.host ? s->opts.host : "127.0.0.1";
    bool on_unix = s->opts.unix_path && s->opts.unix_path[0];
    int ufd = -1;
    char where[300];
    if (on_unix) {
        int rc = unix_listen(s->opts.unix_path, &ufd, &s->unix_ident, err, errsz);
        if (rc)
            return rc;
        s->unix_bound = true;
        snprintf(where, sizeof where, "unix:%s", s->opts.unix_path);
    } else {
        int rc = resolve(host, s->opts.port, &ss, &flags, err, errsz);
        if (rc)
            return rc;
        snprintf(where, sizeof where, "%s:%d", host, s->opts.port);
    }
    /* MHD's inactivity timeout also bounds a client that stops reading a
     * response; whole seconds, at least one. */
    double idle = s->opts.timeout_s[DP_DEADLINE_IDLE];
    unsigned idle_s = idle > 0 ? (unsigned)(idle + 0.999) : 0;
    /* The address option has a different type per kind: through an array. */
    struct MHD_OptionItem addr_opt[2] = {
        on_unix ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, ufd, NULL}
                : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &ss},
        {MHD_OPTION_END, 0, NULL},
    };
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->opts.port, NULL, NULL, on_access, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_ARRAY, addr_opt,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opts.conn_limit,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)idle_s,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->opts.per_ip_limit,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_SIGPIPE_HANDLED_BY_APP, (int)1,
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                              MHD_OPTION_END);
    if (!s->mhd) {
        /* MHD closes a listen socket it was given on most of its failure
         * paths: closing it here too could close a reused descriptor. */
        if (ufd >= 0)
            unix_unlink(s);
        return dp_err(err, errsz, DP_EIO, "cannot listen on %s (address in use or not available)",
                      where);
    }
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

void http_quiesce(dp_http *s)
{
    if (!s->mhd || s->quiesced)
        return;
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    /* Close it now so new connections are refused rather than left in the
     * backlog; in external mode no MHD thread can still be using it. */
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    s->quiesced = true;
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

void http_close(dp_http *s)
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
    if (s->unix_bound)
        unix_unlink(s);
    uv_timer_stop(&s->timer);
}

void http_init(dp_http *t, uv_loop_t *loop, const dp_http_opts *o, const dp_http_cbs *cb)
{
    memset(t, 0, sizeof *t);
    t->loop = loop;
    t->opts = *o;
    t->cb = *cb;
    uv_timer_init(loop, &t->timer);
    t->timer.data = t;
    t->timer_open = true;
}

void http_release(dp_http *t)
{
    if (t->timer_open) {
        uv_close((uv_handle_t *)&t->timer, on_closed);
        t->timer_open = false;
    }
}
