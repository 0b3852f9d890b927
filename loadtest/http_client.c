/* http_client.c: URL parsing, request writing, the incremental HTTP/1.1 response
 * parser and the libuv TCP connection used by dp-loadgen. Nothing here knows OpenAI. */
#include "http_client.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netdb.h>

#include <cjson/cJSON.h>

int lg_url_parse(lg_url *u, const char *text, char *err, size_t errsz)
{
    memset(u, 0, sizeof *u);
    if (!text)
        return dp_err(err, errsz, DP_EINVAL, "no URL");
    if (strncasecmp(text, "https://", 8) == 0)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "https is not supported (no TLS); use http://");
    if (strncasecmp(text, "http://", 7) != 0)
        return dp_err(err, errsz, DP_EINVAL, "URL must start with http://: %s", text);
    const char *h = text + 7;
    const char *end = h + strcspn(h, "/");
    const char *host_end = end;
    u->port = 80;
    if (*h == '[') { /* IPv6 literal */
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (!rb)
            return dp_err(err, errsz, DP_EINVAL, "bad IPv6 host in %s", text);
        if ((size_t)(rb - h - 1) >= sizeof u->host)
            return dp_err(err, errsz, DP_EINVAL, "host too long");
        memcpy(u->host, h + 1, (size_t)(rb - h - 1));
        host_end = rb + 1;
        if (*host_end == ':')
            u->port = atoi(host_end + 1);
    } else {
        const char *colon = memchr(h, ':', (size_t)(end - h));
        if (colon) {
            host_end = colon;
            char *pe;
            long port = strtol(colon + 1, &pe, 10);
            if (pe != end || port <= 0 || port > 65535)
                return dp_err(err, errsz, DP_EINVAL, "bad port in %s", text);
            u->port = (int)port;
        }
        if ((size_t)(host_end - h) >= sizeof u->host || host_end == h)
            return dp_err(err, errsz, DP_EINVAL, "bad host in %s", text);
        memcpy(u->host, h, (size_t)(host_end - h));
    }
    if (u->port <= 0 || u->port > 65535)
        return dp_err(err, errsz, DP_EINVAL, "bad port in %s", text);
    size_t plen = strlen(end);
    while (plen > 0 && end[plen - 1] == '/')
        plen--;
    if (plen >= sizeof u->prefix)
        return dp_err(err, errsz, DP_EINVAL, "path too long");
    memcpy(u->prefix, end, plen);
    u->prefix[plen] = '\0';
    return 0;
}

int lg_http_request_build(char **out, size_t *out_len, const char *method, const lg_url *u,
                          const char *path, const char *extra_headers, const char *body,
                          size_t body_len)
{
    char head[2048];
    int n;
    /* IPv6 literals need their brackets back in the Host header. */
    bool v6 = strchr(u->host, ':') != NULL;
    if (body)
        n = snprintf(head, sizeof head,
                     "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%d\r\nUser-Agent: dp-loadgen\r\n"
                     "Accept: */*\r\nConnection: keep-alive\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
                     method, u->prefix, path, v6 ? "[" : "", u->host, v6 ? "]" : "", u->port,
                     body_len, extra_headers ? extra_headers : "");
    else
        n = snprintf(head, sizeof head,
                     "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%d\r\nUser-Agent: dp-loadgen\r\n"
                     "Accept: */*\r\nConnection: keep-alive\r\n%s\r\n",
                     method, u->prefix, path, v6 ? "[" : "", u->host, v6 ? "]" : "", u->port,
                     extra_headers ? extra_headers : "");
    if (n < 0 || (size_t)n >= sizeof head)
        return DP_EINVAL;
    size_t total = (size_t)n + (body ? body_len : 0);
    char *buf = malloc(total + 1);
    if (!buf)
        return DP_ENOMEM;
    memcpy(buf, head, (size_t)n);
    if (body)
        memcpy(buf + n, body, body_len);
    buf[total] = '\0';
    *out = buf;
    *out_len = total;
    return 0;
}

/* ---- response parser ---- */

void lg_http_parser_init(lg_http_parser *p, lg_http_body_cb on_body, lg_http_headers_cb on_headers,
                         void *ud)
{
    memset(p, 0, sizeof *p);
    p->on_body = on_body;
    p->on_headers = on_headers;
    p->ud = ud;
    lg_http_parser_reset(p);
}

void lg_http_parser_reset(lg_http_parser *p)
{
    p->state = LG_HTTP_STATUS;
    p->status = 0;
    p->version_minor = 1;
    p->chunked = false;
    p->content_length = -1;
    p->remaining = 0;
    p->keep_alive = true;
    p->head_request = false;
    p->got_any = false;
    p->content_type[0] = '\0';
    p->reason[0] = '\0';
    p->line_len = 0;
    p->err[0] = '\0';
}

static int parser_fail(lg_http_parser *p, const char *msg)
{
    snprintf(p->err, sizeof p->err, "%s", msg);
    p->state = LG_HTTP_ERROR;
    return DP_EFORMAT;
}

static bool token_in_list(const char *value, const char *tok)
{
    /* Header values like "keep-alive, Upgrade" are comma-separated tokens. */
    size_t tl = strlen(tok);
    const char *s = value;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        size_t l = strcspn(s, ",");
        size_t t = l;
        while (t > 0 && (s[t - 1] == ' ' || s[t - 1] == '\t'))
            t--;
        if (t == tl && strncasecmp(s, tok, tl) == 0)
            return true;
        s += l;
    }
    return false;
}

static int parse_status_line(lg_http_parser *p, char *line)
{
    if (strncmp(line, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)line[7]) || line[8] != ' ')
        return parser_fail(p, "not an HTTP/1.x response");
    p->version_minor = line[7] - '0';
    const char *s = line + 9;
    if (!isdigit((unsigned char)s[0]) || !isdigit((unsigned char)s[1]) ||
        !isdigit((unsigned char)s[2]) || (s[3] != ' ' && s[3] != '\0'))
        return parser_fail(p, "bad HTTP status code");
    p->status = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
    if (p->status < 100)
        return parser_fail(p, "bad HTTP status code");
    snprintf(p->reason, sizeof p->reason, "%s", s[3] ? s + 4 : "");
    p->keep_alive = p->version_minor >= 1;
    p->state = LG_HTTP_HEADERS;
    return 0;
}

static int parse_header_line(lg_http_parser *p, char *line)
{
    char *colon = strchr(line, ':');
    if (!colon || colon == line)
        return parser_fail(p, "malformed header line");
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t vl = strlen(v);
    while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
        v[--vl] = '\0';
    if (strcasecmp(line, "Content-Length") == 0) {
        char *end;
        errno = 0;
        long long cl = strtoll(v, &end, 10);
        if (errno || end == v || *end || cl < 0)
            return parser_fail(p, "bad Content-Length");
        if (p->content_length >= 0 && p->content_length != cl)
            return parser_fail(p, "conflicting Content-Length headers");
        p->content_length = cl;
    } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
        if (token_in_list(v, "chunked"))
            p->chunked = true;
    } else if (strcasecmp(line, "Connection") == 0) {
        if (token_in_list(v, "close"))
            p->keep_alive = false;
        else if (token_in_list(v, "keep-alive"))
            p->keep_alive = true;
    } else if (strcasecmp(line, "Content-Type") == 0) {
        snprintf(p->content_type, sizeof p->content_type, "%s", v);
    }
    return 0;
}

static int headers_done(lg_http_parser *p)
{
    if (p->status >= 100 && p->status < 200) {
        /* Interim response (100 Continue): the real one follows. */
        lg_http_parser_reset(p);
        p->got_any = true;
        return 0;
    }
    if (p->on_headers)
        p->on_headers(p->ud);
    if (p->head_request || p->status == 204 || p->status == 304) {
        p->state = LG_HTTP_DONE;
    } else if (p->chunked) {
        p->state = LG_HTTP_CHUNK_SIZE; /* chunked wins over Content-Length (RFC 9112 6.3) */
    } else if (p->content_length >= 0) {
        p->remaining = p->content_length;
        p->state = p->remaining ? LG_HTTP_BODY_LENGTH : LG_HTTP_DONE;
    } else {
        /* No framing: the body ends when the server closes, so no reuse. */
        p->keep_alive = false;
        p->state = LG_HTTP_BODY_EOF;
    }
    return 0;
}

static int parse_chunk_size(lg_http_parser *p, const char *line)
{
    int64_t size = 0;
    const char *s = line;
    if (!isxdigit((unsigned char)*s))
        return parser_fail(p, "bad chunk size line");
    for (; isxdigit((unsigned char)*s); s++) {
        int d = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
        if (size > (INT64_MAX >> 4))
            return parser_fail(p, "chunk size too large");
        size = size * 16 + d;
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s != '\0' && *s != ';')
        return parser_fail(p, "bad chunk size line");
    if (size == 0) {
        p->state = LG_HTTP_TRAILERS;
    } else {
        p->remaining = size;
        p->state = LG_HTTP_CHUNK_DATA;
    }
    return 0;
}

static int handle_line(lg_http_parser *p, char *line)
{
    switch (p->state) {
    case LG_HTTP_STATUS:
        if (line[0] == '\0')
            return 0; /* tolerate stray CRLF between responses */
        return parse_status_line(p, line);
    case LG_HTTP_HEADERS:
        if (line[0] == '\0')
            return headers_done(p);
        return parse_header_line(p, line);
    case LG_HTTP_CHUNK_SIZE:
        return parse_chunk_size(p, line);
    case LG_HTTP_CHUNK_CRLF:
        if (line[0] != '\0')
            return parser_fail(p, "missing CRLF after chunk data");
        p->state = LG_HTTP_CHUNK_SIZE;
        return 0;
    case LG_HTTP_TRAILERS:
        if (line[0] == '\0')
            p->state = LG_HTTP_DONE;
        return 0;
    default:
        return parser_fail(p, "internal parser state");
    }
}

int lg_http_parser_feed(lg_http_parser *p, const char *data, size_t len, size_t *consumed)
{
    size_t i = 0;
    if (len)
        p->got_any = true;
    while (i < len && p->state != LG_HTTP_DONE) {
        switch (p->state) {
        case LG_HTTP_ERROR:
            *consumed = i;
            return DP_EFORMAT;
        case LG_HTTP_BODY_LENGTH:
        case LG_HTTP_CHUNK_DATA: {
            size_t n = len - i;
            if ((int64_t)n > p->remaining)
                n = (size_t)p->remaining;
            if (p->on_body && n)
                p->on_body(p->ud, data + i, n);
            i += n;
            p->remaining -= (int64_t)n;
            if (p->remaining == 0)
                p->state = p->state == LG_HTTP_BODY_LENGTH ? LG_HTTP_DONE : LG_HTTP_CHUNK_CRLF;
            break;
        }
        case LG_HTTP_BODY_EOF:
            if (p->on_body)
                p->on_body(p->ud, data + i, len - i);
            i = len;
            break;
        default: {
            /* Line-oriented states: collect up to LF, drop an optional CR. */
            const char *nl = memchr(data + i, '\n', len - i);
            size_t take = nl ? (size_t)(nl - (data + i)) : len - i;
            if (p->line_len + take >= sizeof p->line) {
                *consumed = i;
                return parser_fail(p, "header or chunk line too long");
            }
            memcpy(p->line + p->line_len, data + i, take);
            p->line_len += take;
            i += take;
            if (!nl)
                break;
            i++; /* the LF */
            if (p->line_len > 0 && p->line[p->line_len - 1] == '\r')
                p->line_len--;
            p->line[p->line_len] = '\0';
            p->line_len = 0;
            if (handle_line(p, p->line) < 0) {
                *consumed = i;
                return DP_EFORMAT;
            }
            break;
        }
        }
    }
    *consumed = i;
    if (p->state == LG_HTTP_ERROR)
        return DP_EFORMAT;
    return p->state == LG_HTTP_DONE ? LG_HTTP_COMPLETE : LG_HTTP_MORE;
}

int lg_http_parser_eof(lg_http_parser *p)
{
    switch (p->state) {
    case LG_HTTP_BODY_EOF:
        p->state = LG_HTTP_DONE;
        p->keep_alive = false;
        return LG_HTTP_COMPLETE;
    case LG_HTTP_DONE:
        return LG_HTTP_COMPLETE;
    case LG_HTTP_STATUS:
        if (!p->got_any && p->line_len == 0)
            return parser_fail(p, "connection closed before any response");
        return parser_fail(p, "connection closed in the status line");
    case LG_HTTP_HEADERS:
        return parser_fail(p, "connection closed in the headers");
    case LG_HTTP_ERROR:
        return DP_EFORMAT;
    default:
        return parser_fail(p, "connection closed mid-body");
    }
}

bool lg_http_error_message(const char *body, size_t len, char *msg, size_t msgsz)
{
    if (!body || !len || !msgsz)
        return false;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return false;
    bool found = false;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *m = NULL;
    if (cJSON_IsObject(e))
        m = cJSON_GetObjectItemCaseSensitive(e, "message");
    else if (cJSON_IsString(e))
        m = e;
    else if (cJSON_IsObject(root))
        m = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (cJSON_IsString(m) && m->valuestring) {
        snprintf(msg, msgsz, "%s", m->valuestring);
        found = true;
    }
    cJSON_Delete(root);
    return found;
}

/* ---- libuv connection ---- */

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    lg_conn *c = h->data;
    buf->base = c->rbuf;
    buf->len = sizeof c->rbuf;
}

static void conn_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    lg_conn *c = s->data;
    if (c->closing)
        return;
    if (nread > 0) {
        c->ops->on_data(c, buf->base, (size_t)nread);
    } else if (nread < 0) {
        uv_read_stop(s);
        c->ops->on_eof(c, (int)nread);
    }
}

static void conn_connected(uv_connect_t *req, int status)
{
    lg_conn *c = req->handle->data;
    if (c->closing)
        return; /* closed while connecting: on_closed tells the owner */
    if (status == 0) {
        c->connected = true;
        int rc = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
        if (rc)
            status = rc;
    }
    c->ops->on_connect(c, status);
}

int lg_conn_open(lg_conn *c, uv_loop_t *loop, const struct sockaddr *addr, const lg_conn_ops *ops,
                 void *ud)
{
    c->ops = ops;
    c->ud = ud;
    c->connected = c->closing = c->writing = false;
    int rc = uv_tcp_init(loop, &c->tcp);
    if (rc)
        return rc;
    c->tcp.data = c;
    /* Token streams are many tiny writes from the server; our requests are one write. */
    uv_tcp_nodelay(&c->tcp, 1);
    rc = uv_tcp_connect(&c->connect_req, &c->tcp, addr, conn_connected);
    if (rc) {
        lg_conn_close(c);
        return rc;
    }
    return 0;
}

static void conn_written(uv_write_t *req, int status)
{
    lg_conn *c = req->handle->data;
    c->writing = false;
    if (c->closing)
        return;
    c->ops->on_write(c, status);
}

int lg_conn_write(lg_conn *c, const char *buf, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, conn_written);
    if (rc == 0)
        c->writing = true;
    return rc;
}

static void conn_closed(uv_handle_t *h)
{
    lg_conn *c = h->data;
    c->ops->on_closed(c);
}

void lg_conn_close(lg_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

int lg_url_resolve(const lg_url *u, struct sockaddr_storage *out, char *err, size_t errsz)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", u->port);
    int rc = getaddrinfo(u->host, port, &hints, &res);
    if (rc || !res)
        return dp_err(err, errsz, DP_ENOTFOUND, "cannot resolve %s: %s", u->host,
                      rc ? gai_strerror(rc) : "no address");
    memset(out, 0, sizeof *out);
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* State of one lg_http_fetch. */
struct fetch {
    lg_conn conn;
    uv_timer_t timer;
    lg_http_parser parser;
    char *wire;
    size_t wire_len;
    char *body;
    size_t len, cap;
    int rc;
    bool done, oom, conn_opened;
    char err[DP_ERRLEN];
    int handles_open;
};

static void fetch_body(void *ud, const char *d, size_t n)
{
    struct fetch *f = ud;
    if (f->oom)
        return;
    if (f->len + n + 1 > f->cap) {
        size_t nc = f->cap ? f->cap : 4096;
        while (nc < f->len + n + 1)
            nc *= 2;
        char *nb = realloc(f->body, nc);
        if (!nb) {
            f->oom = true;
            return;
        }
        f->body = nb;
        f->cap = nc;
    }
    memcpy(f->body + f->len, d, n);
    f->len += n;
    f->body[f->len] = '\0';
}

static void fetch_handle_closed(uv_handle_t *h)
{
    struct fetch *f = h->data;
    f->handles_open--;
}

static void fetch_conn_closed(lg_conn *c)
{
    struct fetch *f = c->ud;
    f->handles_open--;
}

static void fetch_finish(struct fetch *f, int rc, const char *msg)
{
    if (f->done)
        return;
    f->done = true;
    f->rc = rc;
    if (msg)
        snprintf(f->err, sizeof f->err, "%s", msg);
    if (f->conn_opened)
        lg_conn_close(&f->conn);
    uv_close((uv_handle_t *)&f->timer, fetch_handle_closed);
}

static void fetch_on_connect(lg_conn *c, int status)
{
    struct fetch *f = c->ud;
    char msg[128];
    if (status) {
        snprintf(msg, sizeof msg, "connect: %s", uv_strerror(status));
        fetch_finish(f, DP_EIO, msg);
        return;
    }
    int rc = lg_conn_write(c, f->wire, f->wire_len);
    if (rc) {
        snprintf(msg, sizeof msg, "write: %s", uv_strerror(rc));
        fetch_finish(f, DP_EIO, msg);
    }
}

static void fetch_on_write(lg_conn *c, int status)
{
    if (status)
        fetch_finish(c->ud, DP_EIO, "write failed");
}

static void fetch_on_data(lg_conn *c, const char *d, size_t n)
{
    struct fetch *f = c->ud;
    size_t used;
    int rc = lg_http_parser_feed(&f->parser, d, n, &used);
    if (rc == LG_HTTP_COMPLETE)
        fetch_finish(f, f->oom ? DP_ENOMEM : 0, f->oom ? "out of memory" : NULL);
    else if (rc < 0)
        fetch_finish(f, DP_EFORMAT, f->parser.err);
}

static void fetch_on_eof(lg_conn *c, int status)
{
    struct fetch *f = c->ud;
    int rc = lg_http_parser_eof(&f->parser);
    if (rc == LG_HTTP_COMPLETE)
        fetch_finish(f, f->oom ? DP_ENOMEM : 0, f->oom ? "out of memory" : NULL);
    else
        fetch_finish(f, DP_EIO, f->parser.err);
}

static void fetch_on_timeout(uv_timer_t *t)
{
    fetch_finish(t->data, DP_EIO, "timed out");
}

static const lg_conn_ops fetch_ops = {
    .on_connect = fetch_on_connect,
    .on_data = fetch_on_data,
    .on_eof = fetch_on_eof,
    .on_write = fetch_on_write,
    .on_closed = fetch_conn_closed,
};

int lg_http_fetch(const lg_url *u, const char *path, const char *extra_headers, double timeout_s,
                  int *status, char **body, size_t *body_len, char *err, size_t errsz)
{
    struct sockaddr_storage addr;
    int rc = lg_url_resolve(u, &addr, err, errsz);
    if (rc)
        return rc;
    struct fetch *f = calloc(1, sizeof *f);
    if (!f)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    uv_loop_t loop;
    rc = uv_loop_init(&loop);
    if (rc) {
        free(f);
        return dp_err(err, errsz, DP_EIO, "uv_loop_init: %s", uv_strerror(rc));
    }
    lg_http_parser_init(&f->parser, fetch_body, NULL, f);
    rc = lg_http_request_build(&f->wire, &f->wire_len, "GET", u, path, extra_headers, NULL, 0);
    if (rc == 0) {
        uv_timer_init(&loop, &f->timer);
        f->timer.data = f;
        f->handles_open = 1;
        uv_timer_start(&f->timer, fetch_on_timeout, (uint64_t)(timeout_s * 1000) + 1, 0);
        int urc = lg_conn_open(&f->conn, &loop, (struct sockaddr *)&addr, &fetch_ops, f);
        f->conn_opened = urc == 0 || f->conn.closing;
        if (f->conn_opened)
            f->handles_open++;
        if (urc) {
            char msg[128];
            snprintf(msg, sizeof msg, "connect: %s", uv_strerror(urc));
            fetch_finish(f, DP_EIO, msg);
        }
        uv_run(&loop, UV_RUN_DEFAULT);
        rc = f->rc;
    } else {
        snprintf(f->err, sizeof f->err, "cannot build request");
    }
    uv_loop_close(&loop);
    if (rc == 0) {
        *status = f->parser.status;
        if (!f->body) {
            f->body = malloc(1);
            if (!f->body) {
                free(f->wire);
                free(f);
                return dp_err(err, errsz, DP_ENOMEM, "out of memory");
            }
            f->body[0] = '\0';
        }
        *body = f->body;
        if (body_len)
            *body_len = f->len;
    } else {
        dp_err(err, errsz, rc, "GET %s%s: %s", u->prefix, path, f->err);
        free(f->body);
    }
    free(f->wire);
    free(f);
    return rc;
}
