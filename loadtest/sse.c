/* sse.c: the Server-Sent Events parser of dp-loadgen, per the WHATWG event-stream
 * rules (LF, CRLF or CR line ends, ':' comments, multi-line data, dispatch on a blank line). */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

void lg_sse_init(lg_sse_parser *p, lg_sse_event_cb cb, void *ud)
{
    memset(p, 0, sizeof *p);
    p->on_event = cb;
    p->ud = ud;
    p->max_line = 16u << 20;
}

void lg_sse_destroy(lg_sse_parser *p)
{
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
    p->line_cap = p->data_cap = 0;
}

void lg_sse_reset(lg_sse_parser *p)
{
    p->line_len = p->data_len = 0;
    p->has_data = p->last_cr = p->started = false;
    p->bom_n = 0;
    p->event[0] = '\0';
    p->events = p->comments = 0;
}

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    char *nb = realloc(*buf, nc);
    if (!nb)
        return DP_ENOMEM;
    *buf = nb;
    *cap = nc;
    return 0;
}

static int process_line(lg_sse_parser *p)
{
    char *line = p->line;
    size_t len = p->line_len;
    if (len == 0) {
        if (p->has_data) {
            if (grow(&p->data, &p->data_cap, p->data_len + 1))
                return DP_ENOMEM;
            p->data[p->data_len] = '\0';
            p->events++;
            p->on_event(p->ud, p->event, p->data, p->data_len);
        }
        p->data_len = 0;
        p->has_data = false;
        p->event[0] = '\0';
        return 0;
    }
    if (line[0] == ':') {
        p->comments++; /* keep-alive pings like ": ping" */
        return 0;
    }
    char *colon = memchr(line, ':', len);
    size_t nlen = colon ? (size_t)(colon - line) : len;
    const char *val = colon ? colon + 1 : line + len;
    size_t vlen = colon ? len - nlen - 1 : 0;
    if (vlen > 0 && *val == ' ') {
        val++;
        vlen--;
    }
    if (nlen == 4 && memcmp(line, "data", 4) == 0) {
        size_t need = p->data_len + (p->has_data ? 1 : 0) + vlen + 1;
        if (grow(&p->data, &p->data_cap, need))
            return DP_ENOMEM;
        if (p->has_data)
            p->data[p->data_len++] = '\n';
        memcpy(p->data + p->data_len, val, vlen);
        p->data_len += vlen;
        p->has_data = true;
    } else if (nlen == 5 && memcmp(line, "event", 5) == 0) {
        size_t n = vlen < sizeof p->event - 1 ? vlen : sizeof p->event - 1;
        memcpy(p->event, val, n);
        p->event[n] = '\0';
    }
    /* id, retry and unknown fields do not matter to a load generator. */
    return 0;
}

int lg_sse_feed(lg_sse_parser *p, const char *buf, size_t len)
{
    static const unsigned char bom[3] = {0xEF, 0xBB, 0xBF};
    size_t i = 0;
    /* A stream may start with a BOM, itself split across reads: match it a
     * byte at a time; bytes that turn out not to be one are line text. */
    while (!p->started && i < len) {
        if ((unsigned char)buf[i] == bom[p->bom_n]) {
            i++;
            if (++p->bom_n == 3)
                p->started = true;
            continue;
        }
        p->started = true;
        if (p->bom_n) {
            if (grow(&p->line, &p->line_cap, p->line_len + p->bom_n + 1))
                return DP_ENOMEM;
            memcpy(p->line + p->line_len, bom, p->bom_n);
            p->line_len += p->bom_n;
        }
    }
    while (i < len) {
        if (p->last_cr) {
            p->last_cr = false;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < len && buf[j] != '\n' && buf[j] != '\r')
            j++;
        size_t take = j - i;
        if (take) {
            if (p->line_len + take > p->max_line)
                return DP_ERANGE;
            if (grow(&p->line, &p->line_cap, p->line_len + take + 1))
                return DP_ENOMEM;
            memcpy(p->line + p->line_len, buf + i, take);
            p->line_len += take;
        }
        i = j;
        if (i == len)
            break;
        p->last_cr = buf[i] == '\r';
        i++;
        int rc = process_line(p);
        p->line_len = 0;
        if (rc)
            return rc;
    }
    return 0;
}
