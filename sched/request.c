/* request.c: request and event lifetimes. A request is shared by the loop
 * thread (its HTTP connection) and the engine thread (its sequence), so its
 * count is atomic; events are handed from one thread to the other whole. */
#include "request.h"

#include <stdlib.h>
#include <string.h>

const char *finish_reason_name(dp_finish f)
{
    switch (f) {
    case DP_FINISH_STOP: return "stop";
    case DP_FINISH_LENGTH: return "length";
    case DP_FINISH_CANCELLED: return "cancelled";
    case DP_FINISH_ERROR: return "error";
    default: return "none";
    }
}

dp_request *request_new(int32_t *prompt, int32_t n_prompt, const dp_request_params *p)
{
    static atomic_uint_fast64_t next_id = 1;
    dp_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    /* The FINISH event exists before it can be needed: running out of memory
     * later must not leave a client waiting for an end that never comes. */
    r->finish_ev = calloc(1, sizeof *r->finish_ev);
    if (!r->finish_ev) {
        free(r);
        return NULL;
    }
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, false);
    r->id = atomic_fetch_add(&next_id, 1);
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    if (p)
        r->params = *p;
    return r;
}

void request_ref(dp_request *r) { atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); }

void request_params_free(dp_request_params *p)
{
    free(p->logit_bias);
    grammar_unref(p->grammar);
    for (int32_t i = 0; i < p->n_stops && i < DP_MAX_STOPS; i++)
        free(p->stops[i]);
    memset(p, 0, sizeof *p);
}

void request_unref(dp_request *r)
{
    if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    request_params_free(&r->params);
    free(r->prompt);
    free(r->finish_ev); /* never sent: it holds no reference */
    free(r);
}

void event_free(dp_event *ev)
{
    if (!ev)
        return;
    request_unref(ev->req);
    free(ev->text);
    free(ev->error);
    free(ev);
}

void event_free_list(dp_event *ev)
{
    while (ev) {
        dp_event *n = ev->next;
        event_free(ev);
        ev = n;
    }
}

dp_event *request_take_finish(dp_request *r)
{
    dp_event *ev = r->finish_ev;
    if (!ev)
        return NULL;
    r->finish_ev = NULL;
    memset(ev, 0, sizeof *ev);
    ev->kind = DP_EV_FINISH;
    ev->req = r;
    request_ref(r);
    return ev;
}
