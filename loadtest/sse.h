/* sse.h: an incremental Server-Sent Events parser (text/event-stream) that
 * takes bytes in any split and hands out whole events. */
#ifndef DP_LOADTEST_SSE_H
#define DP_LOADTEST_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/dp.h"

/* data: the event's data lines joined by '\n' (NUL-terminated, len excludes it).
 * event: the "event:" field or "" (the spec's default "message"). */
typedef void (*lg_sse_event_cb)(void *ud, const char *event, const char *data, size_t len);

typedef struct lg_sse_parser {
    char *line;
    size_t line_len, line_cap;
    char *data;
    size_t data_len, data_cap;
    bool has_data;   /* a data field was seen (even empty) since the last dispatch */
    bool last_cr;    /* the previous byte ended a line with CR; a following LF is part of it */
    bool started;    /* the UTF-8 BOM check is done */
    unsigned bom_n;  /* BOM bytes matched so far (it may arrive split) */
    char event[64];
    size_t max_line; /* lines longer than this fail with DP_ERANGE */
    lg_sse_event_cb on_event;
    void *ud;
    unsigned long events, comments;
} lg_sse_parser;

void lg_sse_init(lg_sse_parser *p, lg_sse_event_cb cb, void *ud);
void lg_sse_destroy(lg_sse_parser *p);
/* Clears the state for a new stream (keeps buffers and callback). */
void lg_sse_reset(lg_sse_parser *p);
/* Returns 0, DP_ENOMEM, or DP_ERANGE (a line over max_line). */
int lg_sse_feed(lg_sse_parser *p, const char *buf, size_t len);

#endif
