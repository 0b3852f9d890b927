/* routes.c: URL + method dispatch (404 for unknown paths, 405 with Allow for
 * a known path and the wrong method) and the small endpoints: /health,
 * /v1/models, /metrics, /tokenize, /detokenize, /tokenizer_info. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"
#include "chat_page.h"
#include "internal.h"

#define DP_VERSION_STR "0.1.0"

static enum MHD_Result send_json(dp_hreq *h, unsigned status, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return http_send(h, status, "application/json", s, s ? strlen(s) : 0);
}

/* 200 once the model is loaded and the engine runs; 503 while loading (the
 * socket opens before the weights load, so orchestrators can tell "starting"
 * from "dead") and while draining. */
static enum MHD_Result on_health(dp_server *s, dp_hreq *h)
{
    cJSON *o = cJSON_CreateObject();
    const bool lost = s->engine && engine_device_lost(s->engine);
    const char *st = lost ? "device lost" : s->draining ? "draining" : !s->engine ? "loading" : "ok";
    cJSON_AddStringToObject(o, "status", st);
    return send_json(h, lost || s->draining || !s->engine ? 503 : 200, o);
}

static cJSON *model_obj(dp_server *s)
{
    cJSON *m = cJSON_CreateObject();
    if (!m)
        return NULL;
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "dualpath");
    cJSON_AddNumberToObject(m, "max_model_len", s->oai.context_length);
    return m;
}

static enum MHD_Result on_models(dp_server *s, dp_hreq *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *a = cJSON_AddArrayToObject(o, "data");
    if (a)
        cJSON_AddItemToArray(a, model_obj(s));
    return send_json(h, 200, o);
}

static enum MHD_Result on_model(dp_server *s, dp_hreq *h, const char *id)
{
    if (strcmp(id, s->model_name) && !(s->model_alias && !strcmp(id, s->model_alias))) {
        dp_api_err e;
        api_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                    "The model '%.100s' does not exist", id);
        return http_send_error(h, &e);
    }
    return send_json(h, 200, model_obj(s));
}

/* /version: what vLLM answers ({"version"}), with what the model runs on. */
static enum MHD_Result on_version(dp_server *s, dp_hreq *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", DP_VERSION_STR);
    cJSON_AddStringToObject(o, "model", s->model_name);
    cJSON_AddStringToObject(o, "backend", s->backend[0] ? s->backend
                                          : s->opts.backend ? s->opts.backend : "unknown");
    cJSON_AddStringToObject(o, "kernels", s->kernels[0] ? s->kernels : "unknown");
    return send_json(h, 200, o);
}

/* The chat page (api/chat_page.c): everything it runs is in the document,
 * and it talks to this server only. */
static enum MHD_Result on_page(dp_server *s, dp_hreq *h)
{
    (void)s;
    char *body = malloc(dp_chat_page_len + 1);
    if (body)
        memcpy(body, dp_chat_page, dp_chat_page_len + 1);
    return http_send_header(h, 200, "text/html; charset=utf-8", body, dp_chat_page_len,
                            "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; base-uri 'none'; "
                            "form-action 'none'");
}

static enum MHD_Result on_metrics(dp_server *s, dp_hreq *h)
{
    dp_engine_stats st;
    memset(&st, 0, sizeof st);
    if (s->engine)
        engine_get_stats(s->engine, &st);
    dp_metrics_info info = {.version = DP_VERSION_STR, .model = s->model_name,
                            .backend = s->backend[0] ? s->backend
                                       : s->opts.backend ? s->opts.backend : "unknown",
                            .kernels = s->kernels[0] ? s->kernels : "unknown",
                            .matmul = s->matmul[0] ? s->matmul : "unknown",
                            .draining = s->draining, .connections = s->http.n_conns,
                            .answering = 200};
    size_t len = 0;
    char *body = metrics_render(&s->metrics, &st, &info, &len);
    struct MHD_Response *r = body ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
                                  : NULL;
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = http_queue(h, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static cJSON *parse_obj(dp_hreq *h, dp_api_err *e)
{
    if (oai_json_has_nul(h->body, h->len)) {
        api_err_invalid(e, NULL, "strings must not contain NUL characters (\\u0000)");
        return NULL;
    }
    size_t at = 0;
    cJSON *root = h->len ? oai_json_parse(h->body, h->len, &at) : NULL;
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        api_err_invalid(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static enum MHD_Result on_tokenize(dp_server *s, dp_hreq *h)
{
    dp_api_err e;
    cJSON *root = parse_obj(h, &e);
    if (!root)
        return http_send_error(h, &e);
    cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "content");
    const char *pname = "content";
    if (!c) {
        c = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        pname = "prompt";
    }
    /* llama.cpp names the flag add_special, vLLM add_special_tokens. */
    const char *aname = "add_special";
    cJSON *as = cJSON_GetObjectItemCaseSensitive(root, aname);
    if (!as) {
        aname = "add_special_tokens";
        as = cJSON_GetObjectItemCaseSensitive(root, aname);
    }
    if (!c || !cJSON_IsString(c) || (as && !cJSON_IsBool(as))) {
        cJSON_Delete(root);
        api_err_invalid(&e, c ? (as && !cJSON_IsBool(as) ? aname : pname) : "content",
                        "'content' (or 'prompt') must be a string and '%s' a boolean", aname);
        return http_send_error(h, &e);
    }
    bool add_bos = as ? cJSON_IsTrue(as) : tokenizer_add_bos(s->tok);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(s->tok, c->valuestring, strlen(c->valuestring), add_bos, true, &ids, &n);
    cJSON_Delete(root);
    if (rc) {
        api_err_set(&e, 500, "server_error", NULL, NULL, "tokenization failed");
        return http_send_error(h, &e);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", s->oai.context_length);
    free(ids);
    return send_json(h, 200, o);
}

static enum MHD_Result on_detokenize(dp_server *s, dp_hreq *h)
{
    dp_api_err e;
    cJSON *root = parse_obj(h, &e);
    if (!root)
        return http_send_error(h, &e);
    cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = t && cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    int32_t nv = tokenizer_n_vocab(s->tok);
    int k = 0;
    bool ok = n >= 0 && (n == 0 || ids);
    cJSON *it;
    if (ok)
        cJSON_ArrayForEach(it, t) {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= nv ||
                (double)(int32_t)it->valuedouble != it->valuedouble) {
                ok = false;
                break;
            }
            ids[k++] = (int32_t)it->valuedouble;
        }
    cJSON_Delete(root);
    if (!ok) {
        free(ids);
        api_err_invalid(&e, "tokens", "'tokens' must be an array of token ids in [0, %d)", nv);
        return http_send_error(h, &e);
    }
    char *text = NULL;
    size_t tl = 0;
    int rc = tokenizer_decode(s->tok, ids, (size_t)k, true, &text, &tl);
    free(ids);
    if (rc) {
        api_err_set(&e, 500, "server_error", NULL, NULL, "detokenization failed");
        return http_send_error(h, &e);
    }
    cJSON *o = cJSON_CreateObject();
    bool valid = oai_utf8_valid(text, tl);
    cJSON_AddStringToObject(o, "content", valid ? text : "\xef\xbf\xbd");
    cJSON_AddStringToObject(o, "prompt", valid ? text : "\xef\xbf\xbd");
    free(text);
    return send_json(h, 200, o);
}

/* A special token's text (the chat template's bos_text / eos_text, taken
 * from the tokenizer), or JSON null where the vocabulary has none. */
static void add_token_text(cJSON *o, const char *name, const char *text)
{
    if (text && *text && oai_utf8_valid(text, strlen(text)))
        cJSON_AddStringToObject(o, name, text);
    else
        cJSON_AddNullToObject(o, name);
}

/* /tokenizer_info: what vLLM answers there (the tokenizer's configuration,
 * with the chat template in use), so that clients which tokenize through the
 * server (lm-evaluation-harness's tokenizer_backend=remote) need no copy of
 * the model's tokenizer. The daemon's tokenizer has no pad token. */
static enum MHD_Result on_tokenizer_info(dp_server *s, dp_hreq *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tokenizer_class",
                            tokenizer_kind(s->tok) == DP_TOK_SPM ? "gguf-llama" : "gguf-gpt2");
    add_token_text(o, "bos_token", s->tmpl ? s->tmpl->bos_text : NULL);
    add_token_text(o, "eos_token", s->tmpl ? s->tmpl->eos_text : NULL);
    cJSON_AddNullToObject(o, "pad_token");
    cJSON_AddBoolToObject(o, "add_bos_token", tokenizer_add_bos(s->tok));
    cJSON_AddNumberToObject(o, "vocab_size", tokenizer_n_vocab(s->tok));
    cJSON_AddNumberToObject(o, "model_max_length", s->oai.context_length);
    if (s->tmpl && s->tmpl->src)
        cJSON_AddStringToObject(o, "chat_template", s->tmpl->src);
    return send_json(h, 200, o);
}

typedef enum route_kind { R_NONE, R_GET, R_POST } route_kind;

static route_kind route_of(const char *u)
{
    if (!strcmp(u, "/health") || !strcmp(u, "/v1/models") || !strcmp(u, "/metrics") ||
        !strcmp(u, "/version") || !strcmp(u, "/tokenizer_info") ||
        !strncmp(u, "/v1/models/", 11) || !strcmp(u, "/"))
        return R_GET;
    if (!strcmp(u, "/v1/completions") || !strcmp(u, "/v1/chat/completions") ||
        !strcmp(u, "/tokenize") || !strcmp(u, "/detokenize"))
        return R_POST;
    return R_NONE;
}

static const char *allow_of(route_kind k)
{
    return k == R_GET ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
}

/* OPTIONS: a CORS preflight gets the methods and headers it asks about when
 * its origin is allowed; any OPTIONS gets 204 and Allow. No key is needed:
 * browsers never send one with a preflight. */
static enum MHD_Result on_options(dp_server *s, dp_hreq *h, route_kind k)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow_of(k));
    const char *origin = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, "Origin");
    if (guard_cors_origin(&s->guard, origin)) {
        const char *rh = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND,
                                                     "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", allow_of(k));
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                rh && *rh ? rh : "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ret = http_queue(h, 204, r);
    MHD_destroy_response(r);
    return ret;
}

/* /health and /metrics may be public (orchestrators and scrapers often have
 * no key); everything else needs one when keys are configured. */
static bool needs_key(const dp_server *s, const char *u)
{
    if (!guard_auth_on(&s->guard))
        return false;
    if (!strcmp(u, "/"))
        return false; /* a static page: its requests carry the key the user types in */
    if (!strcmp(u, "/health"))
        return !s->opts.health_public;
    if (!strcmp(u, "/metrics"))
        return !s->opts.metrics_public;
    return true;
}

enum MHD_Result routes_early(dp_server *s, dp_hreq *h)
{
    route_kind k = route_of(h->url);
    if (!strcmp(h->method, "OPTIONS") && k != R_NONE)
        return on_options(s, h, k);
    if (!needs_key(s, h->url))
        return MHD_YES;
    const char *auth = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    if (guard_check(&s->guard, auth))
        return MHD_YES;
    s->metrics.auth_failures++;
    dp_api_err e;
    if (!auth)
        api_err_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.");
    else
        api_err_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "Incorrect API key provided.");
    return http_send_error(h, &e);
}

enum MHD_Result routes_handle(dp_server *s, dp_hreq *h)
{
    const char *u = h->url;
    /* HEAD is GET without the body (MHD leaves the body out). */
    bool get = !strcmp(h->method, "GET") || !strcmp(h->method, "HEAD");
    bool post = !strcmp(h->method, "POST");
    dp_api_err e;
    route_kind kind = route_of(u);
    if (kind == R_GET && get) {
        if (!strcmp(u, "/health"))
            return on_health(s, h);
        if (!strcmp(u, "/metrics"))
            return on_metrics(s, h);
        if (!strcmp(u, "/v1/models"))
            return on_models(s, h);
        if (!strcmp(u, "/version"))
            return on_version(s, h);
        if (!strcmp(u, "/tokenizer_info"))
            return on_tokenizer_info(s, h);
        if (!strcmp(u, "/"))
            return on_page(s, h);
        return on_model(s, h, u + 11);
    }
    if (kind == R_POST && post) {
        if (!strcmp(u, "/tokenize"))
            return on_tokenize(s, h);
        if (!strcmp(u, "/detokenize"))
            return on_detokenize(s, h);
        return jobs_start(s, h, !strcmp(u, "/v1/completions") ? DP_OAI_COMPLETION : DP_OAI_CHAT);
    }
    if (kind == R_NONE) {
        api_err_set(&e, 404, "invalid_request_error", "not_found", NULL,
                    "Invalid URL (%.16s %.200s)", h->method, u);
        return http_send_error(h, &e);
    }
    api_err_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                "Method %.16s is not allowed for %.200s (use %s)", h->method, u,
                kind == R_GET ? "GET" : "POST");
    e.allow = allow_of(kind);
    return http_send_error(h, &e);
}
