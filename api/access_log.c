/* access_log.c: the per-request log line, logfmt style
 * ("request id=cmpl-... status=200 prompt_tokens=12 ... finish=stop"). */
#include "access_log.h"

#include <stdio.h>
#include <string.h>

#include "common/dp.h"

/* Copies s into out with spaces, quotes, backslashes and control bytes
 * escaped, so that a field never breaks the line or its key=value shape. */
static void put_escaped(char *out, size_t outsz, const char *s, size_t max_in)
{
    size_t o = 0;
    for (size_t i = 0; s && s[i] && i < max_in && o + 5 < outsz; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == ' ' || ch == '"' || ch == '\\' || ch == '=')
            o += (size_t)snprintf(out + o, outsz - o, "\\x%02x", ch);
        else
            out[o++] = (char)ch;
    }
    out[o] = 0;
}

static void fmt_ms(char *out, size_t outsz, double seconds)
{
    if (seconds < 0)
        snprintf(out, outsz, "-");
    else
        snprintf(out, outsz, "%.0f", seconds * 1000.0);
}

void access_log_request(const dp_hreq *h, const dp_job *j, enum MHD_RequestTerminationCode toe)
{
    double now = dp_now();
    /* No response queued: the client went away first (nginx's 499). */
    unsigned status = h->status ? h->status : 499;
    char path[160], dur[24];
    put_escaped(path, sizeof path, h->url, 120);
    fmt_ms(dur, sizeof dur, h->t_start > 0 ? now - h->t_start : -1);
    const char *gone = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " client_gone=1";

    if (!j) {
        /* Small endpoints log at debug when they succeed; /health also when it
         * answers 503 (loading or draining): probes poll it, and its state is
         * logged once by the daemon itself. */
        bool probe = h->url && strcmp(h->url, "/health") == 0 && status == 503;
        dp_log(status < 400 || probe ? DP_LOG_DEBUG : DP_LOG_INFO,
               "request method=%s path=%s status=%u duration_ms=%s%s", h->method ? h->method : "-",
               path, status, dur, gone);
        return;
    }
    long long pt = 0, ct = 0, kept = 0, evicted = 0;
    for (int i = 0; i < j->req.n_prompts; i++)
        pt += j->req.prompts[i].n_ids;
    char finish[96] = "-";
    size_t fo = 0;
    for (int i = 0; i < j->n_choices && j->choices; i++) {
        const dp_oai_choice *ch = &j->choices[i];
        ct += ch->completion_tokens;
        kept += ch->usage.tokens_kept;
        evicted += ch->usage.tokens_evicted;
        const char *f = ch->done ? finish_reason_name(ch->finish) : "cancelled";
        if (fo + strlen(f) + 2 < sizeof finish)
            fo += (size_t)snprintf(finish + fo, sizeof finish - fo, "%s%s", i ? "," : "", f);
    }
    char ttft[24], extra[96] = "";
    fmt_ms(ttft, sizeof ttft, j->t_first > 0 && h->t_start > 0 ? j->t_first - h->t_start : -1);
    if (evicted > 0)
        snprintf(extra, sizeof extra, " tokens_kept=%lld tokens_evicted=%lld", kept, evicted);
    dp_log(DP_LOG_INFO,
           "request id=%s method=%s path=%s status=%u prompt_tokens=%lld completion_tokens=%lld "
           "ttft_ms=%s duration_ms=%s finish=%s stream=%d n=%d%s%s",
           j->id[0] ? j->id : "-", h->method ? h->method : "-", path, status, pt, ct, ttft, dur,
           finish, j->req.stream ? 1 : 0, j->n_choices, extra, gone);
    if (dp_log_get_level() >= DP_LOG_DEBUG && j->req.n_prompts > 0 && j->req.prompts[0].text) {
        char text[1024];
        put_escaped(text, sizeof text, j->req.prompts[0].text, 200);
        dp_log(DP_LOG_DEBUG, "request id=%s prompt=\"%s\"", j->id[0] ? j->id : "-", text);
    }
}
