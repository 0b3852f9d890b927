/* openai.c: request validation for /v1/completions and /v1/chat/completions:
 * types, ranges, the fields both share, prompts, the fields this server does
 * not implement, context limits. A chat's messages become its prompt in
 * oai_chat.c, structured output its grammar in oai_constraint.c; responses
 * are built in oai_response.c. Every value is type checked before it is
 * read; JSON null counts as absent. */
#include "openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kvcache/compress.h"
#include "oai_private.h"

/* ---- small helpers ---- */

cJSON *oai_field(const cJSON *root, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return (v && cJSON_IsNull(v)) ? NULL : v;
}

int oai_get_bool(const cJSON *root, const char *name, bool *out, dp_api_err *e)
{
    cJSON *v = oai_field(root, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return api_err_invalid(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A number in [lo, hi] (lo excluded when lo_open). */
static int get_num(const cJSON *root, const char *name, double lo, double hi, bool lo_open,
                   float *out, dp_api_err *e)
{
    cJSON *v = oai_field(root, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return api_err_invalid(e, name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (d > hi || d < lo || (lo_open && d == lo))
        return api_err_invalid(e, name, "'%s' must be %s %g and <= %g, got %g", name,
                               lo_open ? ">" : ">=", lo, hi, d);
    *out = (float)d;
    return 0;
}

/* An integer in [lo, hi]; *present tells whether it was given. */
static int get_int(const cJSON *root, const char *name, double lo, double hi, long long *out,
                   bool *present, dp_api_err *e)
{
    cJSON *v = oai_field(root, name);
    if (present)
        *present = false;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || floor(v->valuedouble) != v->valuedouble)
        return api_err_invalid(e, name, "'%s' must be an integer", name);
    double d = v->valuedouble;
    if (d < lo || d > hi)
        return api_err_invalid(e, name, "'%s' must be between %.0f and %.0f, got %g", name, lo,
                               hi, d);
    *out = (long long)d;
    if (present)
        *present = true;
    return 0;
}

bool oai_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t k;
        unsigned min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, min = 0x80, c &= 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, min = 0x800, c &= 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, min = 0x10000, c &= 0x07;
        } else {
            return false;
        }
        if (i + k >= n)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
            c = (c << 6) | (p[i + j] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

/* A copy of n bytes that is valid UTF-8 (bad bytes become U+FFFD). */
static char *utf8_clean(const char *s, size_t n)
{
    char *o = malloc(n * 3 + 1);
    if (!o)
        return NULL;
    size_t w = 0, i = 0;
    while (i < n) {
        size_t k = 1;
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            k = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
            if (!k || i + k > n || !oai_utf8_valid(s + i, k)) {
                memcpy(o + w, "\xef\xbf\xbd", 3);
                w += 3;
                i++;
                continue;
            }
        }
        memcpy(o + w, s + i, k);
        w += k;
        i += k;
    }
    o[w] = 0;
    return o;
}

/* ---- parameters ---- */

int oai_params_clone(dp_request_params *dst, const dp_request_params *src)
{
    *dst = *src;
    dst->logit_bias = NULL;
    memset(dst->stops, 0, sizeof dst->stops);
    if (dst->grammar)
        grammar_ref(dst->grammar);
    if (src->n_logit_bias) {
        dst->logit_bias = malloc((size_t)src->n_logit_bias * sizeof *dst->logit_bias);
        if (!dst->logit_bias)
            goto oom;
        memcpy(dst->logit_bias, src->logit_bias, (size_t)src->n_logit_bias * sizeof *dst->logit_bias);
    }
    for (int i = 0; i < src->n_stops; i++) {
        dst->stops[i] = strdup(src->stops[i]);
        if (!dst->stops[i])
            goto oom;
    }
    return 0;
oom:
    request_params_free(dst);
    return DP_ENOMEM;
}

static int parse_stop(const cJSON *root, dp_request_params *p, dp_api_err *e)
{
    cJSON *v = oai_field(root, "stop");
    if (!v)
        return 0;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0])
            return api_err_invalid(e, "stop", "'stop' must not be an empty string");
        p->stops[0] = strdup(v->valuestring);
        if (!p->stops[0])
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        p->n_stops = 1;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return api_err_invalid(e, "stop", "'stop' must be a string or an array of strings");
    int n = cJSON_GetArraySize(v);
    if (n > DP_MAX_STOPS)
        return api_err_invalid(e, "stop", "'stop' has %d entries; at most %d are allowed", n,
                               DP_MAX_STOPS);
    cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return api_err_invalid(e, "stop", "'stop' entries must be non-empty strings");
        p->stops[p->n_stops] = strdup(it->valuestring);
        if (!p->stops[p->n_stops])
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        p->n_stops++;
    }
    return 0;
}

/* vLLM's stop_token_ids: token ids whose sampling ends the output. */
static int parse_stop_ids(const cJSON *root, int32_t n_vocab, dp_request_params *p, dp_api_err *e)
{
    cJSON *v = oai_field(root, "stop_token_ids");
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsArray(v))
        return api_err_invalid(e, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
    int n = cJSON_GetArraySize(v);
    if (n > DP_MAX_STOP_IDS)
        return api_err_invalid(e, "stop_token_ids", "'stop_token_ids' has %d entries; at most %d "
                               "are allowed", n, DP_MAX_STOP_IDS);
    cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble >= n_vocab)
            return api_err_invalid(e, "stop_token_ids", "'stop_token_ids' entries must be token "
                                   "ids in [0, %d)", n_vocab);
        p->stop_ids[p->n_stop_ids++] = (int32_t)it->valuedouble;
    }
    return 0;
}

static int parse_logit_bias(const cJSON *root, int32_t n_vocab, dp_request_params *p,
                            dp_api_err *e)
{
    cJSON *v = oai_field(root, "logit_bias");
    if (!v)
        return 0;
    if (!cJSON_IsObject(v))
        return api_err_invalid(e, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
    int n = cJSON_GetArraySize(v);
    if (n > 1024)
        return api_err_invalid(e, "logit_bias", "'logit_bias' has %d entries; at most 1024 are allowed", n);
    if (n == 0)
        return 0;
    p->logit_bias = calloc((size_t)n, sizeof *p->logit_bias);
    if (!p->logit_bias)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char *end;
        long id = strtol(it->string ? it->string : "", &end, 10);
        if (!it->string || !it->string[0] || *end || id < 0 || id >= n_vocab)
            return api_err_invalid(e, "logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %d)",
                                   it->string ? it->string : "", n_vocab);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100)
            return api_err_invalid(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        p->logit_bias[p->n_logit_bias].token = (int32_t)id;
        p->logit_bias[p->n_logit_bias].bias = (float)it->valuedouble;
        p->n_logit_bias++;
    }
    return 0;
}

/* A member name fit to quote in a message: printable ASCII, else a placeholder. */
static const char *quotable(const char *s)
{
    if (!s || !s[0] || strlen(s) > 40)
        return "(unnamed)";
    for (const char *q = s; *q; q++)
        if (*q < 0x20 || *q > 0x7e)
            return "(unprintable)";
    return s;
}

/* "dualpath": {"enabled", "keep_ratio", "scorer", "keep_system",
 * "keep_prefix", "exempt_layers", "decode_kv_type"}: the per-request
 * override of the server's dual-path defaults; every member is optional. */
#define DUALPATH_MEMBERS                                                                   \
    "'enabled', 'keep_ratio', 'scorer', 'keep_system', 'keep_prefix', 'exempt_layers' and " \
    "'decode_kv_type'"
static int parse_dualpath(const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    static const char *const members[] = {"enabled",     "keep_ratio",    "scorer",
                                          "keep_system", "keep_prefix",   "exempt_layers",
                                          "decode_kv_type"};
    dp_request_params *p = &r->params;
    cJSON *d = oai_field(root, "dualpath");
    if (!d)
        return 0;
    if (!cJSON_IsObject(d))
        return api_err_invalid(e, "dualpath", "'dualpath' must be an object with optional members "
                                              DUALPATH_MEMBERS);
    cJSON *it;
    cJSON_ArrayForEach(it, d) {
        bool known = false;
        for (size_t i = 0; it->string && i < sizeof members / sizeof *members; i++)
            known = known || !strcmp(it->string, members[i]);
        if (!known)
            return api_err_invalid(e, "dualpath",
                                   "'dualpath' has an unknown member '%s' (allowed: "
                                   DUALPATH_MEMBERS ")", quotable(it->string));
    }
    cJSON *ks = oai_field(d, "keep_system");
    if (ks) {
        if (!cJSON_IsBool(ks))
            return api_err_invalid(e, "dualpath.keep_system",
                                   "'dualpath.keep_system' must be a boolean");
        r->keep_system = cJSON_IsTrue(ks) ? 1 : 0;
    }
    cJSON *kp = oai_field(d, "keep_prefix");
    if (kp) {
        if (!cJSON_IsNumber(kp) || !isfinite(kp->valuedouble) ||
            floor(kp->valuedouble) != kp->valuedouble || kp->valuedouble < 0 ||
            kp->valuedouble > (double)(1 << 30))
            return api_err_invalid(e, "dualpath.keep_prefix",
                                   "'dualpath.keep_prefix' must be a whole number of tokens >= 0");
        r->keep_prefix = (int32_t)kp->valuedouble;
    }
    /* The engine checks it against the server's (0 or that). */
    cJSON *ex = oai_field(d, "exempt_layers");
    if (ex) {
        if (!cJSON_IsNumber(ex) || !isfinite(ex->valuedouble) ||
            floor(ex->valuedouble) != ex->valuedouble || ex->valuedouble < 0 ||
            ex->valuedouble > 4096)
            return api_err_invalid(e, "dualpath.exempt_layers",
                                   "'dualpath.exempt_layers' must be a whole number of layers >= 0");
        p->exempt = (int16_t)(ex->valuedouble + 1);
    }
    /* The KV types' names (llama.cpp's); the engine checks that the server
     * keeps it. */
    cJSON *kt = oai_field(d, "decode_kv_type");
    if (kt) {
        int t = -1;
        for (int i = 0; cJSON_IsString(kt) && i < DP_KV_TYPE_COUNT; i++)
            if (!strcmp(kt->valuestring, dp_kv_type_name(i)))
                t = i;
        if (t < 0)
            return api_err_invalid(e, "dualpath.decode_kv_type",
                                   "'dualpath.decode_kv_type' must be one of 'f32', 'f16', 'q8_0', "
                                   "'q4_0' and 'kivi4'");
        p->kv_type = (int8_t)(t + 1);
    }
    cJSON *en = oai_field(d, "enabled");
    if (en) {
        if (!cJSON_IsBool(en))
            return api_err_invalid(e, "dualpath.enabled", "'dualpath.enabled' must be a boolean");
        p->dualpath_mode = cJSON_IsTrue(en) ? DP_DUALPATH_ON : DP_DUALPATH_OFF;
    }
    cJSON *kr = oai_field(d, "keep_ratio");
    if (kr) {
        if (!cJSON_IsNumber(kr) || !isfinite(kr->valuedouble))
            return api_err_invalid(e, "dualpath.keep_ratio", "'dualpath.keep_ratio' must be a number");
        /* (float) of a tiny positive double is 0, the "default" marker: refuse it too. */
        if (!(kr->valuedouble > 0 && kr->valuedouble <= 1) || (float)kr->valuedouble <= 0.0f)
            return api_err_invalid(e, "dualpath.keep_ratio",
                                   "'dualpath.keep_ratio' must be > 0 and <= 1, got %g",
                                   kr->valuedouble);
        p->keep_ratio = (float)kr->valuedouble;
    }
    cJSON *sc = oai_field(d, "scorer");
    if (sc) {
        dp_scorer v;
        if (!cJSON_IsString(sc))
            return api_err_invalid(e, "dualpath.scorer", "'dualpath.scorer' must be a string");
        if (scorer_parse(sc->valuestring, &v))
            return api_err_invalid(e, "dualpath.scorer",
                                   "'dualpath.scorer' must be one of knorm, knorm_high, snapkv, "
                                   "recent, random; got '%s'",
                                   quotable(sc->valuestring));
        p->scorer = (int8_t)(v + 1);
    }
    return 0;
}

/* Fields both endpoints share. */
static int parse_common(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    dp_request_params *p = &r->params;
    long long v;
    bool present;
    cJSON *m = oai_field(root, "model");
    if (m) {
        if (!cJSON_IsString(m))
            return api_err_invalid(e, "model", "'model' must be a string");
        if (strcmp(m->valuestring, c->model_name) &&
            !(c->model_alias && !strcmp(m->valuestring, c->model_alias)))
            return api_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                               "The model '%.100s' does not exist; this server serves '%s'",
                               m->valuestring, c->model_name);
    }
    if (get_num(root, "temperature", 0, 2, false, &p->sampling.temperature, e) ||
        get_num(root, "top_p", 0, 1, true, &p->sampling.top_p, e) ||
        get_num(root, "min_p", 0, 1, false, &p->sampling.min_p, e) ||
        get_num(root, "presence_penalty", -2, 2, false, &p->sampling.presence_penalty, e) ||
        get_num(root, "frequency_penalty", -2, 2, false, &p->sampling.frequency_penalty, e) ||
        get_num(root, "repetition_penalty", 0, 2, true, &p->sampling.repetition_penalty, e))
        return -1;
    if (get_int(root, "top_k", -1, 1 << 30, &v, &present, e))
        return -1;
    if (present)
        p->sampling.top_k = (int32_t)(v < 0 ? 0 : v);
    /* JSON numbers arrive as doubles, exact only below 2^53 in magnitude: a
     * larger seed may have become a neighbouring one (2^53 + 1 reads as
     * 2^53), so 2^53 and beyond are refused. */
    if (get_int(root, "seed", -9007199254740991.0, 9007199254740991.0, &v, &present, e))
        return -1;
    if (present) {
        p->sampling.seed = (uint64_t)v; /* negative seeds wrap, as two's complement */
        r->has_seed = true;
    }
    r->n = 1;
    if (get_int(root, "n", 1, DP_OAI_MAX_N, &v, &present, e))
        return -1;
    if (present)
        r->n = (int)v;
    if (oai_get_bool(root, "stream", &r->stream, e) || oai_get_bool(root, "ignore_eos", &p->ignore_eos, e) ||
        oai_get_bool(root, "include_stop_str_in_output", &p->include_stop_str, e))
        return -1;
    if (get_int(root, "min_tokens", 0, 1 << 30, &v, &present, e))
        return -1;
    p->min_tokens = present ? (int32_t)v : 0;
    if (parse_stop_ids(root, tokenizer_n_vocab(c->tok), p, e))
        return -1;
    cJSON *so = oai_field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return api_err_invalid(e, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return api_err_invalid(e, "stream_options",
                                   "'stream_options' is only allowed when 'stream' is true");
        if (oai_get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    cJSON *u = oai_field(root, "user");
    if (u && !cJSON_IsString(u))
        return api_err_invalid(e, "user", "'user' must be a string");
    if (parse_stop(root, p, e) || parse_logit_bias(root, tokenizer_n_vocab(c->tok), p, e) ||
        parse_dualpath(root, r, e))
        return -1;
    return oai_parse_constraint(c, root, p, e);
}

int oai_prompt_from_text(const dp_oai_ctx *c, dp_oai_prompt *pr, const char *s, size_t n,
                         const char *param, dp_api_err *e)
{
    size_t nid = 0;
    if (tokenizer_encode(c->tok, s, n, tokenizer_add_bos(c->tok), true, &pr->ids, &nid))
        return api_err_set(e, 500, "server_error", NULL, NULL, "tokenization failed");
    pr->n_ids = (int32_t)nid;
    if (nid == 0)
        return api_err_invalid(e, param, "'%s' must not be empty", param);
    pr->text = utf8_clean(s, n);
    if (!pr->text)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static int prompt_from_ids(const dp_oai_ctx *c, dp_oai_prompt *pr, const cJSON *arr,
                           dp_api_err *e)
{
    int n = cJSON_GetArraySize(arr);
    int32_t nv = tokenizer_n_vocab(c->tok);
    if (n == 0)
        return api_err_invalid(e, "prompt", "'prompt' must not be empty");
    pr->ids = malloc((size_t)n * sizeof *pr->ids);
    if (!pr->ids)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || floor(it->valuedouble) != it->valuedouble ||
            it->valuedouble < 0 || it->valuedouble >= nv)
            return api_err_invalid(e, "prompt", "'prompt' token ids must be integers in [0, %d)", nv);
        pr->ids[pr->n_ids++] = (int32_t)it->valuedouble;
    }
    char *t = NULL;
    size_t tl = 0;
    if (tokenizer_decode(c->tok, pr->ids, (size_t)pr->n_ids, true, &t, &tl))
        return api_err_set(e, 500, "server_error", NULL, NULL, "detokenization failed");
    pr->text = utf8_clean(t, tl);
    free(t);
    if (!pr->text)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static int parse_prompts(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    cJSON *p = oai_field(root, "prompt");
    if (!p)
        return api_err_invalid(e, "prompt", "'prompt' is required");
    const char *bad = "'prompt' must be a string, an array of strings, an array of token ids "
                      "or an array of token-id arrays";
    int count = 1;
    bool ids_single = false;
    if (cJSON_IsArray(p)) {
        count = cJSON_GetArraySize(p);
        if (count == 0)
            return api_err_invalid(e, "prompt", "'prompt' must not be empty");
        cJSON *first = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsNumber(first)) {
            ids_single = true;
            count = 1;
        }
    } else if (!cJSON_IsString(p)) {
        return api_err_invalid(e, "prompt", "%s", bad);
    }
    if (count * r->n > DP_OAI_MAX_CHOICES)
        return api_err_invalid(e, "prompt", "%d prompts x n=%d exceeds %d choices per request",
                               count, r->n, DP_OAI_MAX_CHOICES);
    r->prompts = calloc((size_t)count, sizeof *r->prompts);
    if (!r->prompts)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    r->n_prompts = count;
    if (cJSON_IsString(p))
        return oai_prompt_from_text(c, &r->prompts[0], p->valuestring, strlen(p->valuestring),
                                "prompt", e);
    if (ids_single)
        return prompt_from_ids(c, &r->prompts[0], p, e);
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, p) {
        int rc;
        if (cJSON_IsString(it))
            rc = oai_prompt_from_text(c, &r->prompts[i], it->valuestring, strlen(it->valuestring),
                                  "prompt", e);
        else if (cJSON_IsArray(it))
            rc = prompt_from_ids(c, &r->prompts[i], it, e);
        else
            rc = api_err_invalid(e, "prompt", "%s", bad);
        if (rc)
            return rc;
        i++;
    }
    return 0;
}


/* ---- fields the parser does not read ----
 *
 * Every top-level member is one of: read by the parser above (IMPL), accepted
 * with no effect on the output (INERT: bookkeeping such as metadata), or a
 * request to constrain or change the output that this server does not
 * implement (REFUSE): that one is a 400 naming it unless its value asks for
 * nothing (null, false, 0, "", [] or {}, or the field's own default), since
 * silently ignoring it would hand back output the client did not ask for.
 * Anything else is unknown: accepted and reported in dp_oai_req.unknown for
 * the server to log. */
enum { F_IMPL, F_INERT, F_REFUSE };
enum { F_BOTH = 3, F_CMPL = 1, F_CHAT = 2 };

typedef struct field_rule {
    const char *name;
    unsigned char kind, where;
    const char *why;  /* F_REFUSE: what the client asked for */
} field_rule;

static const field_rule field_rules[] = {
    {"model", F_IMPL, F_BOTH, NULL},
    {"temperature", F_IMPL, F_BOTH, NULL},
    {"top_p", F_IMPL, F_BOTH, NULL},
    {"top_k", F_IMPL, F_BOTH, NULL},
    {"min_p", F_IMPL, F_BOTH, NULL},
    {"presence_penalty", F_IMPL, F_BOTH, NULL},
    {"frequency_penalty", F_IMPL, F_BOTH, NULL},
    {"repetition_penalty", F_IMPL, F_BOTH, NULL},
    {"seed", F_IMPL, F_BOTH, NULL},
    {"n", F_IMPL, F_BOTH, NULL},
    {"stream", F_IMPL, F_BOTH, NULL},
    {"stream_options", F_IMPL, F_BOTH, NULL},
    {"ignore_eos", F_IMPL, F_BOTH, NULL},
    {"include_stop_str_in_output", F_IMPL, F_BOTH, NULL},
    {"user", F_IMPL, F_BOTH, NULL},
    {"stop", F_IMPL, F_BOTH, NULL},
    {"logit_bias", F_IMPL, F_BOTH, NULL},
    {"dualpath", F_IMPL, F_BOTH, NULL},
    {"tools", F_IMPL, F_BOTH, NULL},
    {"response_format", F_IMPL, F_BOTH, NULL},
    {"max_tokens", F_IMPL, F_BOTH, NULL},
    {"logprobs", F_IMPL, F_BOTH, NULL},
    {"echo", F_IMPL, F_BOTH, NULL},
    {"messages", F_IMPL, F_CHAT, NULL},
    {"max_completion_tokens", F_IMPL, F_CHAT, NULL},
    {"top_logprobs", F_IMPL, F_CHAT, NULL},
    {"prompt", F_IMPL, F_CMPL, NULL},
    {"suffix", F_IMPL, F_CMPL, NULL},
    {"best_of", F_IMPL, F_CMPL, NULL},
    /* No effect on the tokens generated. */
    {"metadata", F_INERT, F_BOTH, NULL},
    {"store", F_INERT, F_BOTH, NULL},
    {"service_tier", F_INERT, F_BOTH, NULL},
    {"parallel_tool_calls", F_IMPL, F_BOTH, NULL},
    {"prediction", F_INERT, F_BOTH, NULL},
    {"request_id", F_INERT, F_BOTH, NULL},
    {"priority", F_INERT, F_BOTH, NULL},
    /* Constrained decoding (OpenAI, vLLM, llama.cpp spellings). */
    {"guided_json", F_IMPL, F_BOTH, NULL},
    {"guided_regex", F_IMPL, F_BOTH, NULL},
    {"guided_choice", F_IMPL, F_BOTH, NULL},
    {"guided_grammar", F_IMPL, F_BOTH, NULL},
    /* One backend (sched/grammar.c) whatever is named. */
    {"guided_decoding_backend", F_INERT, F_BOTH, NULL},
    {"guided_whitespace_pattern", F_REFUSE, F_BOTH, "constrained output"},
    {"structured_outputs", F_REFUSE, F_BOTH, "constrained output"},
    {"grammar", F_IMPL, F_BOTH, NULL},
    {"json_schema", F_IMPL, F_BOTH, NULL},
    {"tool_choice", F_IMPL, F_BOTH, NULL},
    {"functions", F_REFUSE, F_BOTH, "function calling"},
    {"function_call", F_REFUSE, F_BOTH, "a function call"},
    /* Token-level constraints. */
    {"min_tokens", F_IMPL, F_BOTH, NULL},
    {"stop_token_ids", F_IMPL, F_BOTH, NULL},
    {"bad_words", F_REFUSE, F_BOTH, "banned words"},
    {"allowed_token_ids", F_REFUSE, F_BOTH, "a restricted vocabulary"},
    {"logits_processors", F_REFUSE, F_BOTH, "custom logits processors"},
    {"truncate_prompt_tokens", F_REFUSE, F_BOTH, "prompt truncation"},
    {"prompt_logprobs", F_IMPL, F_BOTH, NULL},
    {"skip_special_tokens", F_REFUSE, F_BOTH, "special tokens in the text"},
    /* Output modalities and the chat template. */
    {"modalities", F_REFUSE, F_CHAT, "a non-text output modality"},
    {"audio", F_REFUSE, F_CHAT, "audio output"},
    {"web_search_options", F_REFUSE, F_CHAT, "web search"},
    {"add_generation_prompt", F_IMPL, F_CHAT, NULL},
    {"continue_final_message", F_IMPL, F_CHAT, NULL},
    {"chat_template", F_IMPL, F_CHAT, NULL},
    {"chat_template_kwargs", F_IMPL, F_CHAT, NULL},
};

/* Values that ask for nothing, per field. */
static bool field_inert(const char *name, const cJSON *v)
{
    if (!strcmp(name, "skip_special_tokens"))
        return cJSON_IsTrue(v);
    if (!strcmp(name, "tool_choice") || !strcmp(name, "function_call"))
        /* tools and functions themselves are refused unless empty */
        return cJSON_IsString(v) && (!strcmp(v->valuestring, "none") ||
                                     !strcmp(v->valuestring, "auto"));
    if (!strcmp(name, "modalities")) {
        if (!cJSON_IsArray(v))
            return false;
        const cJSON *it;
        cJSON_ArrayForEach(it, v) if (!cJSON_IsString(it) || strcmp(it->valuestring, "text"))
            return false;
        return true;
    }
    if (cJSON_IsFalse(v))
        return true;
    if (cJSON_IsNumber(v))
        return v->valuedouble == 0;
    if (cJSON_IsString(v))
        return !v->valuestring[0];
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child == NULL;
    return false;
}

static int check_fields(dp_oai_kind kind, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    unsigned where = kind == DP_OAI_CHAT ? F_CHAT : F_CMPL;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *name = it->string ? it->string : "";
        const field_rule *rule = NULL;
        for (size_t i = 0; i < sizeof field_rules / sizeof field_rules[0]; i++)
            if ((field_rules[i].where & where) && !strcmp(field_rules[i].name, name)) {
                rule = &field_rules[i];
                break;
            }
        if (rule && rule->kind == F_REFUSE && !cJSON_IsNull(it) && !field_inert(name, it))
            return api_err_invalid(e, name, "'%s' (%s) is not supported by this server", name,
                                   rule->why);
        if (!rule && r->n_unknown < DP_OAI_MAX_UNKNOWN)
            snprintf(r->unknown[r->n_unknown++], sizeof r->unknown[0], "%s", quotable(name));
    }
    return 0;
}

/* cJSON ends every string at its first NUL, so "a\u0000b" (or a raw NUL
 * byte) would silently become "a": such a body is refused before parsing.
 * Backslashes occur only inside strings, so a scan of escapes is exact. */
bool oai_json_has_nul(const char *body, size_t len)
{
    if (!len)
        return false;
    if (memchr(body, 0, len)) /* never valid in JSON text; cJSON would stop at it */
        return true;
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\')
            continue;
        if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4))
            return true;
        i++; /* the escaped character */
    }
    return false;
}

static int parse_body(const dp_oai_ctx *c, dp_oai_kind kind, const cJSON *root, dp_oai_req *r,
                      dp_api_err *e)
{
    dp_request_params *p = &r->params;
    long long v;
    bool present, mt_present = false;
    long long max_tokens = 0;
    const char *mt_name = "max_tokens";
    if (!cJSON_IsObject(root))
        return api_err_invalid(e, NULL, "the request body must be a JSON object");
    if (check_fields(kind, root, r, e) || parse_common(c, root, r, e))
        return -1;
    if (get_int(root, "max_tokens", 0, 1 << 30, &max_tokens, &mt_present, e))
        return -1;
    /* vLLM's prompt_logprobs: each prompt token's logprob plus the top k
     * (null: none). Whole responses only, as vLLM. */
    r->prompt_lp = -1;
    cJSON *plp = oai_field(root, "prompt_logprobs");
    if (plp && !cJSON_IsNull(plp)) {
        if (get_int(root, "prompt_logprobs", 0, DP_MAX_TOP_LOGPROBS, &v, &present, e))
            return -1;
        if (r->stream)
            return api_err_invalid(e, "prompt_logprobs",
                                   "'prompt_logprobs' is not supported with 'stream'");
        r->prompt_lp = (int32_t)v;
    }
    if (kind == DP_OAI_CHAT) {
        if (get_int(root, "max_completion_tokens", 0, 1 << 30, &v, &present, e))
            return -1;
        if (present) {
            max_tokens = v;
            mt_present = true;
            mt_name = "max_completion_tokens";
        }
        bool lp = false;
        if (oai_get_bool(root, "logprobs", &lp, e))
            return -1;
        if (get_int(root, "top_logprobs", 0, DP_MAX_TOP_LOGPROBS, &v, &present, e))
            return -1;
        if (present && !lp)
            return api_err_invalid(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
        p->logprobs = lp ? (present ? (int32_t)v : 0) : -1;
        cJSON *ev = oai_field(root, "echo");
        if (ev && !cJSON_IsFalse(ev))
            return api_err_invalid(e, "echo", "'echo' is not supported for chat completions");
        if (oai_parse_tools(c, root, r, e) || oai_parse_messages(c, root, r, e))
            return -1;
    } else {
        cJSON *lpv = oai_field(root, "logprobs");
        if (lpv && cJSON_IsBool(lpv))
            return api_err_invalid(e, "logprobs", "'logprobs' must be an integer in [0, %d] for completions",
                                   DP_MAX_TOP_LOGPROBS);
        if (get_int(root, "logprobs", 0, DP_MAX_TOP_LOGPROBS, &v, &present, e))
            return -1;
        p->logprobs = present ? (int32_t)v : -1;
        if (oai_get_bool(root, "echo", &r->echo, e))
            return -1;
        /* echo with logprobs scores the prompt too (the legacy API's way,
         * which lm-evaluation-harness uses for loglikelihoods). */
        if (r->echo && p->logprobs >= 0) {
            p->prompt_logprobs = true;
            p->prompt_top = p->logprobs;
        }
        cJSON *tl = oai_field(root, "tools");
        if (tl && !cJSON_IsNull(tl) && !(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == 0))
            return api_err_invalid(e, "tools", "'tools' are for chat completions "
                                   "(/v1/chat/completions)");
        cJSON *tch = oai_field(root, "tool_choice");
        if (tch && !cJSON_IsNull(tch) &&
            !(cJSON_IsString(tch) && (!strcmp(tch->valuestring, "none") ||
                                      !strcmp(tch->valuestring, "auto"))))
            return api_err_invalid(e, "tool_choice", "'tool_choice' is for chat completions "
                                   "(/v1/chat/completions)");
        cJSON *sfx = oai_field(root, "suffix");
        if (sfx)
            return api_err_invalid(e, "suffix", "'suffix' is not supported");
        cJSON *bo = oai_field(root, "best_of");
        if (bo && !(cJSON_IsNumber(bo) && bo->valuedouble == r->n))
            return api_err_invalid(e, "best_of", "'best_of' other than n is not supported");
        if (parse_prompts(c, root, r, e))
            return -1;
    }
    if (r->prompt_lp >= 0) {
        p->prompt_logprobs = true;
        if (r->prompt_lp > p->prompt_top)
            p->prompt_top = r->prompt_lp;
    }
    if (mt_present && p->min_tokens > max_tokens)
        return api_err_invalid(e, "min_tokens", "'min_tokens' (%d) must not exceed '%s' (%lld)",
                               p->min_tokens, mt_name, max_tokens);
    /* max_tokens 0: the prompt alone, which is only worth its logprobs. */
    if (mt_present && max_tokens == 0 && !p->prompt_logprobs)
        return api_err_invalid(e, mt_name, "'%s' must be at least 1 (0 only with 'echo' and "
                               "'logprobs', or 'prompt_logprobs')", mt_name);
    /* The prefix kept whole: as asked, else the system prompt where kept
     * (oai_parse_messages counts it only then). */
    p->keep_prefix = r->keep_prefix >= 0 ? r->keep_prefix : r->system_tokens;
    const char *pname = kind == DP_OAI_CHAT ? "messages" : "prompt";
    int32_t ctx = c->context_length;
    for (int i = 0; i < r->n_prompts; i++) {
        dp_oai_prompt *pr = &r->prompts[i];
        if (pr->n_ids >= ctx + (mt_present && max_tokens == 0))
            return api_err_invalid(e, pname,
                                   "This model's maximum context length is %d tokens, but the %s "
                                   "has %d tokens (at least 1 token must be left to generate)",
                                   ctx, pname,
                                   pr->n_ids);
        if (mt_present) {
            if ((long long)pr->n_ids + max_tokens > ctx)
                return api_err_invalid(e, mt_name,
                                       "This model's maximum context length is %d tokens. However, "
                                       "you requested %lld tokens (%d in the %s, %lld for the "
                                       "completion). Reduce the %s or '%s'.",
                                       ctx, (long long)pr->n_ids + max_tokens, pr->n_ids, pname,
                                       max_tokens, pname, mt_name);
            pr->max_tokens = (int32_t)max_tokens;
        } else {
            int32_t room = ctx - pr->n_ids;
            int32_t want = c->default_max_tokens > 0 ? c->default_max_tokens
                           : kind == DP_OAI_CHAT   ? room
                                                   : 16;
            pr->max_tokens = want < room ? want : room;
        }
    }
    return 0;
}

cJSON *oai_json_parse(const char *body, size_t len, size_t *err_at)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        const char *ep = cJSON_GetErrorPtr();
        *err_at = ep && ep >= body && ep <= body + len ? (size_t)(ep - body) : 0;
        return NULL;
    }
    /* cJSON stops after the first value; anything but whitespace after it
     * (a second object, garbage) makes the body invalid. */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            *err_at = (size_t)(p - body);
            cJSON_Delete(root);
            return NULL;
        }
    return root;
}

int oai_parse(const dp_oai_ctx *c, dp_oai_kind kind, const char *body, size_t len,
              dp_oai_req *out, dp_api_err *e)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    sampling_default(&out->params.sampling);
    out->params.logprobs = -1;
    out->keep_system = -1;
    out->keep_prefix = -1;
    if (!body || len == 0) {
        api_err_invalid(e, NULL, "the request body is empty; a JSON object is required");
        return -1;
    }
    if (oai_json_has_nul(body, len)) {
        api_err_invalid(e, NULL, "strings must not contain NUL characters (\\u0000)");
        return -1;
    }
    size_t at = 0;
    cJSON *root = oai_json_parse(body, len, &at);
    if (!root) {
        api_err_invalid(e, NULL, "the request body is not valid JSON (error near byte %zu)", at);
        return -1;
    }
    int rc = parse_body(c, kind, root, out, e);
    cJSON_Delete(root);
    if (rc)
        oai_req_free(out);
    return rc;
}

void oai_req_free(dp_oai_req *r)
{
    for (int i = 0; r->prompts && i < r->n_prompts; i++) {
        free(r->prompts[i].ids);
        free(r->prompts[i].text);
    }
    free(r->prompts);
    r->prompts = NULL;
    r->n_prompts = 0;
    request_params_free(&r->params);
    tools_free(&r->tools);
}
