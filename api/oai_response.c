/* oai_response.c: what the OpenAI endpoints send back: choices collected
 * from engine events, logprobs in each endpoint's shape, whole responses,
 * stream chunks and the usage object (with the dual path's figures). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "oai_private.h"
#include "sse.h"

/* ---- output ---- */

int oai_choice_append(dp_oai_choice *ch, const char *s, size_t n)
{
    if (ch->len + n + 1 > ch->cap) {
        size_t nc = ch->cap ? ch->cap : 256;
        while (nc < ch->len + n + 1)
            nc *= 2;
        char *np = realloc(ch->text, nc);
        if (!np)
            return DP_ENOMEM;
        ch->text = np;
        ch->cap = nc;
    }
    memcpy(ch->text + ch->len, s, n);
    ch->len += n;
    ch->text[ch->len] = 0;
    return 0;
}

void oai_choice_free(dp_oai_choice *ch)
{
    free(ch->text);
    cJSON_Delete(ch->logprobs);
    cJSON_Delete(ch->echo_lp);
    cJSON_Delete(ch->prompt_lp);
    memset(ch, 0, sizeof *ch);
}

const char *oai_finish_name(dp_finish f)
{
    switch (f) {
    case DP_FINISH_STOP: return "stop";
    case DP_FINISH_LENGTH: return "length";
    case DP_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

cJSON *oai_logprobs_new(dp_oai_kind kind)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (kind == DP_OAI_CHAT) {
        cJSON_AddArrayToObject(o, "content");
    } else {
        cJSON_AddArrayToObject(o, "tokens");
        cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON_AddArrayToObject(o, "top_logprobs");
        cJSON_AddArrayToObject(o, "text_offset");
    }
    return o;
}

/* The token's text for logprobs; bytes that are not valid UTF-8 by
 * themselves (a piece of a multi-byte character) are spelled "bytes:\xNN". */
static int token_str_as(const dp_tokenizer *tok, int32_t id, bool special, char *raw, size_t rawcap,
                        int *nraw, char *out, size_t outcap)
{
    int n = tokenizer_token_bytes(tok, id, special, raw, rawcap);
    if (n < 0)
        n = 0;
    if ((size_t)n > rawcap)
        n = (int)rawcap;
    *nraw = n;
    if (oai_utf8_valid(raw, (size_t)n)) {
        size_t k = (size_t)n < outcap - 1 ? (size_t)n : outcap - 1;
        memcpy(out, raw, k);
        out[k] = 0;
        return n;
    }
    size_t w = (size_t)snprintf(out, outcap, "bytes:");
    for (int i = 0; i < n && w + 5 < outcap; i++)
        w += (size_t)snprintf(out + w, outcap - w, "\\x%02x", (unsigned char)raw[i]);
    return n;
}

static int token_str(const dp_tokenizer *tok, int32_t id, char *raw, size_t rawcap, int *nraw,
                     char *out, size_t outcap)
{
    return token_str_as(tok, id, false, raw, rawcap, nraw, out, outcap);
}

static double finite_lp(float lp)
{
    return isfinite(lp) ? (lp > 0 ? 0.0 : (double)lp) : -9999.0;
}

static cJSON *bytes_array(const char *raw, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* One entry of a completion's logprobs: the token's text s (nraw bytes),
 * its logprob and top alternatives from ev, or nulls without ev (the
 * prompt's first token, which nothing predicts). */
static void completion_entry(cJSON *lp, const dp_tokenizer *tok, const char *s, int nraw,
                             const dp_event *ev, int ntop, size_t *text_offset)
{
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(s));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"),
                         ev ? cJSON_CreateNumber(finite_lp(ev->logprob)) : cJSON_CreateNull());
    cJSON *top = ev ? cJSON_CreateObject() : NULL;
    if (top) {
        if (ntop == 0)
            cJSON_AddNumberToObject(top, s, finite_lp(ev->logprob));
        for (int i = 0; i < ntop; i++) {
            char r2[256], s2[1100];
            int n2;
            token_str(tok, ev->top[i].token, r2, sizeof r2, &n2, s2, sizeof s2);
            if (!cJSON_GetObjectItemCaseSensitive(top, s2))
                cJSON_AddNumberToObject(top, s2, finite_lp(ev->top[i].logprob));
        }
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top ? top : cJSON_CreateNull());
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"),
                         cJSON_CreateNumber((double)(text_offset ? *text_offset : 0)));
    if (text_offset)
        *text_offset += (size_t)nraw;
}

bool oai_logprobs_takes(dp_oai_kind kind, const dp_tokenizer *tok, int32_t token)
{
    /* A completion's logprobs have an entry for every generated token, the
     * end-of-generation token included (its text is empty, so the tokens
     * still spell the text), as vLLM's do: lm-evaluation-harness scores
     * echo + max_tokens 1 as token_logprobs[ctxlen:-1], which drops the
     * generated token and would drop a real one without it. A chat's
     * content list ends with the content. */
    return kind != DP_OAI_CHAT || !tokenizer_is_eog(tok, token);
}

void oai_logprobs_add(cJSON *lp, dp_oai_kind kind, const dp_tokenizer *tok, const dp_event *ev,
                      size_t *text_offset)
{
    if (!lp || !oai_logprobs_takes(kind, tok, ev->token))
        return;
    char raw[256], s[1100];
    int nraw;
    token_str(tok, ev->token, raw, sizeof raw, &nraw, s, sizeof s);
    int ntop = ev->n_top < DP_MAX_TOP_LOGPROBS ? ev->n_top : DP_MAX_TOP_LOGPROBS;
    if (kind == DP_OAI_CHAT) {
        cJSON *e = cJSON_CreateObject();
        if (!e)
            return;
        cJSON_AddStringToObject(e, "token", s);
        cJSON_AddNumberToObject(e, "logprob", finite_lp(ev->logprob));
        cJSON_AddItemToObject(e, "bytes", bytes_array(raw, nraw));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; tops && i < ntop; i++) {
            char r2[256], s2[1100];
            int n2;
            token_str(tok, ev->top[i].token, r2, sizeof r2, &n2, s2, sizeof s2);
            cJSON *t = cJSON_CreateObject();
            if (!t)
                break;
            cJSON_AddStringToObject(t, "token", s2);
            cJSON_AddNumberToObject(t, "logprob", finite_lp(ev->top[i].logprob));
            cJSON_AddItemToObject(t, "bytes", bytes_array(r2, n2));
            cJSON_AddItemToArray(tops, t);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "content"), e);
        return;
    }
    completion_entry(lp, tok, s, nraw, ev, ntop, text_offset);
}

void oai_logprobs_add_prompt(cJSON *lp, const dp_tokenizer *tok, int32_t token, const dp_event *ev,
                             int k, size_t *text_offset)
{
    if (!lp)
        return;
    char raw[256], s[1100];
    int nraw;
    /* The prompt's text has its control tokens written out. */
    token_str_as(tok, token, true, raw, sizeof raw, &nraw, s, sizeof s);
    int ntop = ev ? (ev->n_top < k ? ev->n_top : k) : 0;
    completion_entry(lp, tok, s, nraw, ev, ntop, text_offset);
}

cJSON *oai_prompt_logprob_entry(const dp_tokenizer *tok, const dp_event *ev, int k)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    char raw[256], s[1100], key[16];
    int nraw;
    /* vLLM's shape: token id -> logprob, rank (1: the most likely) and text;
     * the prompt's own token first, then the top k (ranks 1..k). */
    token_str_as(tok, ev->token, true, raw, sizeof raw, &nraw, s, sizeof s);
    snprintf(key, sizeof key, "%d", (int)ev->token);
    cJSON *t = cJSON_AddObjectToObject(o, key);
    if (t) {
        cJSON_AddNumberToObject(t, "logprob", finite_lp(ev->logprob));
        cJSON_AddNumberToObject(t, "rank", ev->rank);
        cJSON_AddStringToObject(t, "decoded_token", s);
    }
    int ntop = ev->n_top < k ? ev->n_top : k;
    for (int i = 0; i < ntop; i++) {
        snprintf(key, sizeof key, "%d", (int)ev->top[i].token);
        if (cJSON_GetObjectItemCaseSensitive(o, key))
            continue;
        token_str_as(tok, ev->top[i].token, true, raw, sizeof raw, &nraw, s, sizeof s);
        t = cJSON_AddObjectToObject(o, key);
        if (!t)
            break;
        cJSON_AddNumberToObject(t, "logprob", finite_lp(ev->top[i].logprob));
        cJSON_AddNumberToObject(t, "rank", i + 1);
        cJSON_AddStringToObject(t, "decoded_token", s);
    }
    return o;
}

static cJSON *envelope(dp_oai_kind kind, bool chunk, const char *id, long long created,
                       const char *model)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            kind == DP_OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

static void add_usage(cJSON *o, long long pt, long long ct, const dp_kv_usage *dp)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u)
        return;
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)pt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ct);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(pt + ct));
    cJSON *d = dp ? cJSON_AddObjectToObject(u, "dualpath") : NULL;
    if (d) {
        cJSON_AddNumberToObject(d, "tokens_kept", (double)dp->tokens_kept);
        cJSON_AddNumberToObject(d, "tokens_evicted", (double)dp->tokens_evicted);
        cJSON_AddNumberToObject(d, "tokens_resumed", (double)dp->tokens_resumed);
        cJSON_AddNumberToObject(d, "kv_bytes", (double)dp->kv_bytes);
        cJSON_AddNumberToObject(d, "kv_bytes_full", (double)dp->kv_bytes_full);
    }
}

static void add_finish(cJSON *c, const char *f)
{
    if (f)
        cJSON_AddStringToObject(c, "finish_reason", f);
    else
        cJSON_AddNullToObject(c, "finish_reason");
}

static char *print_owned(cJSON *o, size_t *len)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (s && len)
        *len = strlen(s);
    return s;
}

int oai_tool_shape(const dp_oai_req *r, const dp_oai_choice *ch, const char *id, int index,
                   cJSON **calls, char **content, const char **finish)
{
    char base[96];
    /* Call ids unique per response and choice: the response id's tail. */
    const char *tail = strchr(id, '-');
    snprintf(base, sizeof base, "%.48s%d", tail ? tail + 1 : id, index);
    int rc = tools_shape(ch->text ? ch->text : "", ch->len, base, calls, content);
    if (rc < 0)
        return DP_ENOMEM;
    *finish = oai_finish_name(ch->finish);
    /* A complete set of calls ends the turn as OpenAI says it: "tool_calls". */
    if (rc == 1 && ch->finish == DP_FINISH_STOP)
        *finish = "tool_calls";
    (void)r;
    return 0;
}

char *oai_response(const dp_oai_req *r, const char *id, long long created, const char *model,
                   dp_oai_choice *choices, int n_choices, size_t *len)
{
    cJSON *o = envelope(r->kind, false, id, created, model);
    if (!o)
        return NULL;
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    long long pt = 0, ct = 0;
    dp_kv_usage dp = {0};
    for (int i = 0; i < r->n_prompts; i++)
        pt += r->prompts[i].n_ids;
    for (int i = 0; i < n_choices; i++)
        dp_kv_usage_add(&dp, &choices[i].usage);
    for (int i = 0; arr && i < n_choices; i++) {
        dp_oai_choice *ch = &choices[i];
        ct += ch->completion_tokens;
        cJSON *c = cJSON_CreateObject();
        if (!c)
            break;
        cJSON_AddNumberToObject(c, "index", i);
        const char *finish = oai_finish_name(ch->finish);
        if (r->kind == DP_OAI_CHAT && r->tools.mode != DP_TOOLS_OFF) {
            cJSON *calls = NULL, *m = cJSON_AddObjectToObject(c, "message");
            char *content = NULL;
            if (oai_tool_shape(r, ch, id, i, &calls, &content, &finish) == 0 && m) {
                cJSON_AddStringToObject(m, "role", "assistant");
                if (calls) {
                    cJSON_AddNullToObject(m, "content");
                    cJSON_AddItemToObject(m, "tool_calls", calls);
                } else {
                    cJSON_AddStringToObject(m, "content", content ? content : "");
                }
            } else {
                cJSON_Delete(calls);
            }
            free(content);
        } else if (r->kind == DP_OAI_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            if (m) {
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddStringToObject(m, "content", ch->text ? ch->text : "");
            }
        } else {
            cJSON_AddStringToObject(c, "text", ch->text ? ch->text : "");
        }
        if (ch->logprobs) {
            cJSON_AddItemToObject(c, "logprobs", ch->logprobs);
            ch->logprobs = NULL;
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        add_finish(c, finish);
        /* vLLM's prompt_logprobs: per choice for completions; once, at the
         * top, for chat (every choice has the same prompt). */
        if (ch->prompt_lp && r->kind == DP_OAI_COMPLETION) {
            cJSON_AddItemToObject(c, "prompt_logprobs", ch->prompt_lp);
            ch->prompt_lp = NULL;
        }
        cJSON_AddItemToArray(arr, c);
    }
    if (r->kind == DP_OAI_CHAT && n_choices > 0 && choices[0].prompt_lp) {
        cJSON_AddItemToObject(o, "prompt_logprobs", choices[0].prompt_lp);
        choices[0].prompt_lp = NULL;
    }
    add_usage(o, pt, ct, &dp);
    return print_owned(o, len);
}

char *oai_tool_chunk(const char *id, long long created, const char *model, int index,
                     cJSON *calls, const char *content, size_t *len)
{
    cJSON *o = envelope(DP_OAI_CHAT, true, id, created, model);
    cJSON *arr = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *c = arr ? cJSON_CreateObject() : NULL;
    if (!c) {
        cJSON_Delete(o);
        cJSON_Delete(calls);
        return NULL;
    }
    cJSON_AddItemToArray(arr, c);
    cJSON_AddNumberToObject(c, "index", index);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (d && calls) {
        int k = 0;
        cJSON *it;
        cJSON_ArrayForEach(it, calls) {
            /* A streamed call names its place in the list first. */
            cJSON *ix = cJSON_CreateNumber(k++);
            if (ix && !cJSON_AddItemToObject(it, "index", ix))
                cJSON_Delete(ix);
        }
        cJSON_AddItemToObject(d, "tool_calls", calls);
        calls = NULL;
    } else if (d) {
        cJSON_AddStringToObject(d, "content", content ? content : "");
    }
    cJSON_Delete(calls);
    cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, NULL);
    size_t l;
    return sse_frame_take(print_owned(o, &l), len);
}

char *oai_chunk(dp_oai_kind kind, const char *id, long long created, const char *model, int index,
                const char *role, const char *text, cJSON *lp, const char *finish, size_t *len)
{
    cJSON *o = envelope(kind, true, id, created, model);
    cJSON *arr = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *c = arr ? cJSON_CreateObject() : NULL;
    if (!c) {
        cJSON_Delete(o);
        cJSON_Delete(lp);
        return NULL;
    }
    cJSON_AddItemToArray(arr, c);
    cJSON_AddNumberToObject(c, "index", index);
    if (kind == DP_OAI_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (d && role)
            cJSON_AddStringToObject(d, "role", role);
        if (d && text)
            cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, finish);
    size_t l;
    char *s = sse_frame_take(print_owned(o, &l), len);
    return s;
}

char *oai_usage_chunk(dp_oai_kind kind, const char *id, long long created, const char *model,
                      long long prompt_tokens, long long completion_tokens,
                      const dp_kv_usage *dp, size_t *len)
{
    cJSON *o = envelope(kind, true, id, created, model);
    if (!o)
        return NULL;
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, prompt_tokens, completion_tokens, dp);
    size_t l;
    return sse_frame_take(print_owned(o, &l), len);
}
