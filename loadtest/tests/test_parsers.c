/* test_parsers.c: dp-loadgen's HTTP response parser (status, headers, keep-alive,
 * chunked split at every byte), SSE parser (splits, CRLF, comments, multi-line), error bodies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/http_client.h"
#include "loadtest/sse.h"

static int g_fail;
#define CHECK(c)                                                                    \
    do {                                                                            \
        if (!(c)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);   \
            g_fail++;                                                               \
        }                                                                           \
    } while (0)

/* ---- HTTP ---- */

struct body {
    char buf[8192];
    size_t len;
    int headers;
};

static void on_body(void *ud, const char *d, size_t n)
{
    struct body *b = ud;
    if (b->len + n < sizeof b->buf) {
        memcpy(b->buf + b->len, d, n);
        b->len += n;
        b->buf[b->len] = '\0';
    }
}

static void on_headers(void *ud) { ((struct body *)ud)->headers++; }

/* Feeds msg in pieces split at `cuts` (sorted), returns the final parser result. */
static int feed_split(lg_http_parser *p, const char *msg, size_t len, const size_t *cuts, int ncuts,
                      size_t *total_used)
{
    size_t pos = 0;
    int rc = LG_HTTP_MORE;
    *total_used = 0;
    for (int i = 0; i <= ncuts && rc == LG_HTTP_MORE; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        size_t used = 0;
        rc = lg_http_parser_feed(p, msg + pos, end - pos, &used);
        *total_used += used;
        pos = end;
    }
    return rc;
}

static const char k_chunked[] =
    "HTTP/1.1 200 OK\r\n"
    "Content-Type: text/event-stream\r\n"
    "Transfer-Encoding: chunked\r\n"
    "\r\n"
    "7\r\ndata: a\r\n"
    "19;ext=1\r\n\n\ndata: {\"x\": 12345678}\n\n\r\n"
    "0\r\n"
    "X-Trailer: yes\r\n"
    "\r\n";
static const char k_chunked_body[] = "data: a\n\ndata: {\"x\": 12345678}\n\n";

static void test_chunked_every_split(void)
{
    size_t len = strlen(k_chunked);
    for (size_t cut = 0; cut <= len; cut++) {
        struct body b = {0};
        lg_http_parser p;
        lg_http_parser_init(&p, on_body, on_headers, &b);
        size_t used;
        int rc = feed_split(&p, k_chunked, len, &cut, 1, &used);
        CHECK(rc == LG_HTTP_COMPLETE);
        CHECK(used == len);
        CHECK(strcmp(b.buf, k_chunked_body) == 0);
        CHECK(b.headers == 1);
        CHECK(p.status == 200 && p.chunked && p.keep_alive);
        if (g_fail) {
            fprintf(stderr, "  split at %zu\n", cut);
            return;
        }
    }
    /* Byte by byte. */
    struct body b = {0};
    lg_http_parser p;
    lg_http_parser_init(&p, on_body, on_headers, &b);
    int rc = LG_HTTP_MORE;
    for (size_t i = 0; i < len; i++) {
        size_t used;
        rc = lg_http_parser_feed(&p, k_chunked + i, 1, &used);
        CHECK(used == 1);
        CHECK(i + 1 == len ? rc == LG_HTTP_COMPLETE : rc == LG_HTTP_MORE);
    }
    CHECK(strcmp(b.buf, k_chunked_body) == 0);
    CHECK(strstr(p.content_type, "event-stream") != NULL);
}

static void test_content_length_and_keepalive(void)
{
    /* Two responses back to back on one connection: the parser stops after the first. */
    const char two[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello"
                       "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
    struct body b = {0};
    lg_http_parser p;
    lg_http_parser_init(&p, on_body, on_headers, &b);
    size_t used;
    int rc = lg_http_parser_feed(&p, two, strlen(two), &used);
    CHECK(rc == LG_HTTP_COMPLETE);
    CHECK(used == strlen(two) - strlen("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"));
    CHECK(strcmp(b.buf, "hello") == 0);
    CHECK(p.keep_alive);
    lg_http_parser_reset(&p);
    size_t used2;
    rc = lg_http_parser_feed(&p, two + used, strlen(two) - used, &used2);
    CHECK(rc == LG_HTTP_COMPLETE && p.status == 404 && used + used2 == strlen(two));
    CHECK(strcmp(p.reason, "Not Found") == 0);

    /* Connection: close, HTTP/1.0 default, and keep-alive on 1.0. */
    const char *cases[][2] = {
        {"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", "0"},
        {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", "0"},
        {"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", "1"},
        {"HTTP/1.1 200 OK\r\nConnection: upgrade, keep-alive\r\nContent-Length: 0\r\n\r\n", "1"},
        {"HTTP/1.1 204 No Content\r\n\r\n", "1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lg_http_parser_init(&p, NULL, NULL, NULL);
        rc = lg_http_parser_feed(&p, cases[i][0], strlen(cases[i][0]), &used);
        CHECK(rc == LG_HTTP_COMPLETE);
        CHECK(p.keep_alive == (cases[i][1][0] == '1'));
    }

    /* No framing: the body runs to EOF and the connection cannot be reused. */
    b.len = 0;
    b.buf[0] = '\0';
    lg_http_parser_init(&p, on_body, NULL, &b);
    const char eofmsg[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close";
    rc = lg_http_parser_feed(&p, eofmsg, strlen(eofmsg), &used);
    CHECK(rc == LG_HTTP_MORE);
    CHECK(lg_http_parser_eof(&p) == LG_HTTP_COMPLETE);
    CHECK(!p.keep_alive && strcmp(b.buf, "until close") == 0);

    /* 100 Continue is skipped. */
    lg_http_parser_init(&p, NULL, NULL, NULL);
    const char cont[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
    rc = lg_http_parser_feed(&p, cont, strlen(cont), &used);
    CHECK(rc == LG_HTTP_COMPLETE && p.status == 201);
}

static void test_http_errors(void)
{
    const char *bad[] = {
        "garbage that is not HTTP\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lg_http_parser p;
        lg_http_parser_init(&p, NULL, NULL, NULL);
        size_t used;
        int rc = lg_http_parser_feed(&p, bad[i], strlen(bad[i]), &used);
        CHECK(rc == DP_EFORMAT);
        CHECK(p.err[0] != '\0');
    }
    /* EOF in each phase. */
    struct {
        const char *msg;
        const char *want;
    } eofs[] = {
        {"", "before any response"},
        {"HTTP/1.1 200", "status line"},
        {"HTTP/1.1 200 OK\r\nContent-", "headers"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "mid-body"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "mid-body"},
    };
    for (size_t i = 0; i < sizeof eofs / sizeof eofs[0]; i++) {
        lg_http_parser p;
        lg_http_parser_init(&p, NULL, NULL, NULL);
        size_t used;
        lg_http_parser_feed(&p, eofs[i].msg, strlen(eofs[i].msg), &used);
        CHECK(lg_http_parser_eof(&p) == DP_EFORMAT);
        CHECK(strstr(p.err, eofs[i].want) != NULL);
    }
    /* A header line longer than the buffer fails instead of overflowing. */
    size_t n = LG_HTTP_LINE_MAX + 100;
    char *big = malloc(n + 1);
    CHECK(big != NULL);
    if (big) {
        memcpy(big, "HTTP/1.1 200 OK\r\nX: ", 20);
        memset(big + 20, 'a', n - 20);
        big[n] = '\0';
        lg_http_parser p;
        lg_http_parser_init(&p, NULL, NULL, NULL);
        size_t used;
        CHECK(lg_http_parser_feed(&p, big, n, &used) == DP_EFORMAT);
        free(big);
    }
}

static void test_error_bodies(void)
{
    char msg[128];
    const char *b1 = "{\"error\": {\"message\": \"Too many requests\", \"type\": \"rate_limit\", \"code\": 429}}";
    CHECK(lg_http_error_message(b1, strlen(b1), msg, sizeof msg) && strcmp(msg, "Too many requests") == 0);
    const char *b2 = "{\"error\": \"model not loaded\"}";
    CHECK(lg_http_error_message(b2, strlen(b2), msg, sizeof msg) && strcmp(msg, "model not loaded") == 0);
    const char *b3 = "{\"object\": \"error\", \"message\": \"bad max_tokens\", \"code\": 400}";
    CHECK(lg_http_error_message(b3, strlen(b3), msg, sizeof msg) && strcmp(msg, "bad max_tokens") == 0);
    const char *b4 = "<html>502 Bad Gateway</html>";
    CHECK(!lg_http_error_message(b4, strlen(b4), msg, sizeof msg));
    const char *b5 = "{\"error\": {\"code\": 5}}";
    CHECK(!lg_http_error_message(b5, strlen(b5), msg, sizeof msg));
    CHECK(!lg_http_error_message(NULL, 0, msg, sizeof msg));
}

static void test_url_and_request(void)
{
    lg_url u;
    char err[128];
    CHECK(lg_url_parse(&u, "http://127.0.0.1:8080", err, sizeof err) == 0);
    CHECK(strcmp(u.host, "127.0.0.1") == 0 && u.port == 8080 && u.prefix[0] == '\0');
    CHECK(lg_url_parse(&u, "http://localhost/v1/", err, sizeof err) == 0);
    CHECK(strcmp(u.host, "localhost") == 0 && u.port == 80 && strcmp(u.prefix, "/v1") == 0);
    CHECK(lg_url_parse(&u, "http://[::1]:9000/x", err, sizeof err) == 0);
    CHECK(strcmp(u.host, "::1") == 0 && u.port == 9000 && strcmp(u.prefix, "/x") == 0);
    CHECK(lg_url_parse(&u, "https://example.com", err, sizeof err) == DP_EUNSUPPORTED);
    CHECK(lg_url_parse(&u, "http://host:99999", err, sizeof err) == DP_EINVAL);
    CHECK(lg_url_parse(&u, "ftp://host", err, sizeof err) == DP_EINVAL);

    CHECK(lg_url_parse(&u, "http://127.0.0.1:8080/v1", err, sizeof err) == 0);
    char *req;
    size_t len;
    CHECK(lg_http_request_build(&req, &len, "POST", &u, "/completions", "Authorization: Bearer k\r\n",
                                "{}", 2) == 0);
    CHECK(strncmp(req, "POST /v1/completions HTTP/1.1\r\n", 31) == 0);
    CHECK(strstr(req, "\r\nHost: 127.0.0.1:8080\r\n") != NULL);
    CHECK(strstr(req, "\r\nContent-Length: 2\r\n") != NULL);
    CHECK(strstr(req, "\r\nAuthorization: Bearer k\r\n\r\n{}") != NULL);
    CHECK(len == strlen(req));
    free(req);
}

/* ---- SSE ---- */

struct events {
    char log[4096];
    int n;
};

static void on_event(void *ud, const char *event, const char *data, size_t len)
{
    struct events *e = ud;
    size_t l = strlen(e->log);
    snprintf(e->log + l, sizeof e->log - l, "[%s|%.*s]", event, (int)len, data);
    CHECK(data[len] == '\0');
    e->n++;
}

static const char k_sse[] =
    ": ping\r\n\r\n"
    "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
    "event: update\r\n"
    "data: line1\r\n"
    "data:line2\r\n"
    "data:  two spaces\r\n"
    "id: 7\r\n"
    "retry: 100\r\n\r\n"
    "data\n\n"
    "data: cr only\r\r"
    ":comment without blank\n"
    "data: [DONE]\n\n"
    "data: unterminated";
static const char k_sse_want[] =
    "[|{\"choices\":[{\"text\":\"a\"}]}][update|line1\nline2\n two spaces][|][|cr only][|[DONE]]";

static void test_sse_splits(void)
{
    size_t len = strlen(k_sse);
    for (size_t cut = 0; cut <= len; cut++) {
        struct events e = {{0}, 0};
        lg_sse_parser p;
        lg_sse_init(&p, on_event, &e);
        CHECK(lg_sse_feed(&p, k_sse, cut) == 0);
        CHECK(lg_sse_feed(&p, k_sse + cut, len - cut) == 0);
        CHECK(strcmp(e.log, k_sse_want) == 0);
        CHECK(p.comments == 2);
        lg_sse_destroy(&p);
        if (g_fail) {
            fprintf(stderr, "  SSE split at %zu: %s\n", cut, e.log);
            return;
        }
    }
    struct events e = {{0}, 0};
    lg_sse_parser p;
    lg_sse_init(&p, on_event, &e);
    for (size_t i = 0; i < len; i++)
        CHECK(lg_sse_feed(&p, k_sse + i, 1) == 0);
    CHECK(strcmp(e.log, k_sse_want) == 0);
    /* Reset drops the half-read event and starts clean. */
    lg_sse_reset(&p);
    e.log[0] = '\0';
    CHECK(lg_sse_feed(&p, "data: x\n\n", 9) == 0);
    CHECK(strcmp(e.log, "[|x]") == 0);
    /* Line limit. */
    p.max_line = 16;
    CHECK(lg_sse_feed(&p, "data: 0123456789abcdef\n", 23) == DP_ERANGE);
    lg_sse_destroy(&p);
}

/* Chunked framing around SSE, both split everywhere: the way the runner sees it. */
static void sse_from_body(void *ud, const char *d, size_t n) { lg_sse_feed(ud, d, n); }

static void test_chunked_sse_together(void)
{
    const char msg[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "c\r\n: ping\r\n\r\nda\r\n"
                       "c\r\nta: one\r\n\r\nd\r\n"
                       "c\r\nata: [DONE]\r\r\n"
                       "3\r\n\n\r\n\r\n0\r\n\r\n";
    size_t len = strlen(msg);
    for (size_t a = 0; a <= len; a += 3)
        for (size_t b2 = a; b2 <= len; b2 += 5) {
            struct events e = {{0}, 0};
            lg_sse_parser s;
            lg_sse_init(&s, on_event, &e);
            lg_http_parser p;
            lg_http_parser_init(&p, sse_from_body, NULL, &s);
            size_t cuts[2] = {a, b2}, used;
            CHECK(feed_split(&p, msg, len, cuts, 2, &used) == LG_HTTP_COMPLETE);
            CHECK(strcmp(e.log, "[|one][|[DONE]]") == 0);
            lg_sse_destroy(&s);
            if (g_fail)
                return;
        }
}

int main(void)
{
    test_chunked_every_split();
    test_content_length_and_keepalive();
    test_http_errors();
    test_error_bodies();
    test_url_and_request();
    test_sse_splits();
    test_chunked_sse_together();
    if (g_fail) {
        fprintf(stderr, "test_parsers: %d checks failed\n", g_fail);
        return 1;
    }
    printf("test_parsers: ok\n");
    return 0;
}
