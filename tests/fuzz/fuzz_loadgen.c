/* fuzz_loadgen.c: dp-loadgen's HTTP response parser and SSE parser. The
 * first byte sets where the input is split (responses arrive in any pieces);
 * a split must never change what is parsed: the status, the body bytes and
 * the SSE events equal those of the input fed whole. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadtest/http_client.h"
#include "loadtest/sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    char body[1 << 16];
    size_t body_len;
    unsigned long events;
    uint64_t event_hash;
    lg_sse_parser sse;
    int sse_rc;
} sink;

static void on_event(void *ud, const char *event, const char *data, size_t len)
{
    sink *k = ud;
    k->events++;
    for (size_t i = 0; i < len; i++)
        k->event_hash = (k->event_hash ^ (unsigned char)data[i]) * 1099511628211ull;
    for (const char *p = event; *p; p++)
        k->event_hash = (k->event_hash ^ (unsigned char)*p) * 1099511628211ull;
    k->event_hash ^= k->events;
}

static void on_body(void *ud, const char *data, size_t len)
{
    sink *k = ud;
    size_t n = len < sizeof k->body - k->body_len ? len : sizeof k->body - k->body_len;
    memcpy(k->body + k->body_len, data, n);
    k->body_len += n;
    if (!k->sse_rc)
        k->sse_rc = lg_sse_feed(&k->sse, data, len);
}

typedef struct outcome {
    int rc, status;
    size_t body_len;
    unsigned long events;
    uint64_t event_hash;
} outcome;

/* Feeds data in pieces of at most step bytes (0: whole). */
static outcome run(const char *data, size_t size, size_t step, sink *k)
{
    memset(k, 0, offsetof(sink, sse));
    lg_sse_init(&k->sse, on_event, k);
    lg_http_parser *p = malloc(sizeof *p);
    if (!p)
        abort();
    lg_http_parser_init(p, on_body, NULL, k);
    outcome o = {LG_HTTP_MORE, 0, 0, 0, 0};
    size_t off = 0;
    while (off < size && o.rc == LG_HTTP_MORE) {
        size_t n = step && size - off > step ? step : size - off, used = 0;
        o.rc = lg_http_parser_feed(p, data + off, n, &used);
        if (used > n)
            abort();
        off += o.rc == LG_HTTP_MORE ? n : used;
    }
    if (o.rc == LG_HTTP_MORE)
        o.rc = lg_http_parser_eof(p);
    if (o.rc < 0 && (!p->err[0] || strlen(p->err) >= sizeof p->err))
        abort();
    o.status = p->status;
    o.body_len = k->body_len;
    o.events = k->events;
    o.event_hash = k->event_hash;
    free(p);
    lg_sse_destroy(&k->sse);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = 1 + data[0] % 64;
    static sink a, b;
    outcome whole = run((const char *)data + 1, size - 1, 0, &a);
    outcome split = run((const char *)data + 1, size - 1, step, &b);
    bool same = (whole.rc < 0) == (split.rc < 0) &&
                (whole.rc < 0 || (whole.status == split.status && whole.body_len == split.body_len &&
                                  !memcmp(a.body, b.body, a.body_len) &&
                                  whole.events == split.events &&
                                  whole.event_hash == split.event_hash));
    if (!same) {
        fprintf(stderr, "split %zu: rc %d/%d status %d/%d body %zu/%zu events %lu/%lu sse %d/%d\n",
                step, whole.rc, split.rc, whole.status, split.status, whole.body_len,
                split.body_len, whole.events, split.events, a.sse_rc, b.sse_rc);
        abort();
    }
    return 0;
}
