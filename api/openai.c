/* openai.c: request validation (types, ranges, context limits) and response
 * building for /v1/completions and /v1/chat/completions. Every value is type
 * checked before it is read; JSON null counts as absent. */
#include "openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "jv_json.h"
#include "kvcache/compress.h"
#include "schema.h"
#include "sse.h"

/* ---- small helpers ---- */

static cJSON *field(const cJSON *root, const char *name)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return (v && cJSON_IsNull(v)) ? NULL : v;
}

static int get_bool(const cJSON *root, const char *name, bool *out, dp_api_err *e)
{
    cJSON *v = field(root, name);
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
    cJSON *v = field(root, name);
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
    cJSON *v = field(root, name);
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
    cJSON *v = field(root, "stop");
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
    cJSON *v = field(root, "stop_token_ids");
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
    cJSON *v = field(root, "logit_bias");
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
    cJSON *d = field(root, "dualpath");
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
    cJSON *ks = field(d, "keep_system");
    if (ks) {
        if (!cJSON_IsBool(ks))
            return api_err_invalid(e, "dualpath.keep_system",
                                   "'dualpath.keep_system' must be a boolean");
        r->keep_system = cJSON_IsTrue(ks) ? 1 : 0;
    }
    cJSON *kp = field(d, "keep_prefix");
    if (kp) {
        if (!cJSON_IsNumber(kp) || !isfinite(kp->valuedouble) ||
            floor(kp->valuedouble) != kp->valuedouble || kp->valuedouble < 0 ||
            kp->valuedouble > (double)(1 << 30))
            return api_err_invalid(e, "dualpath.keep_prefix",
                                   "'dualpath.keep_prefix' must be a whole number of tokens >= 0");
        r->keep_prefix = (int32_t)kp->valuedouble;
    }
    /* The engine checks it against the server's (0 or that). */
    cJSON *ex = field(d, "exempt_layers");
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
    cJSON *kt = field(d, "decode_kv_type");
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
    cJSON *en = field(d, "enabled");
    if (en) {
        if (!cJSON_IsBool(en))
            return api_err_invalid(e, "dualpath.enabled", "'dualpath.enabled' must be a boolean");
        p->dualpath_mode = cJSON_IsTrue(en) ? DP_DUALPATH_ON : DP_DUALPATH_OFF;
    }
    cJSON *kr = field(d, "keep_ratio");
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
    cJSON *sc = field(d, "scorer");
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
static int parse_constraint(const dp_oai_ctx *c, const cJSON *root, dp_request_params *p,
                            dp_api_err *e);

static int parse_common(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    dp_request_params *p = &r->params;
    long long v;
    bool present;
    cJSON *m = field(root, "model");
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
    if (get_bool(root, "stream", &r->stream, e) || get_bool(root, "ignore_eos", &p->ignore_eos, e) ||
        get_bool(root, "include_stop_str_in_output", &p->include_stop_str, e))
        return -1;
    if (get_int(root, "min_tokens", 0, 1 << 30, &v, &present, e))
        return -1;
    p->min_tokens = present ? (int32_t)v : 0;
    if (parse_stop_ids(root, tokenizer_n_vocab(c->tok), p, e))
        return -1;
    cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return api_err_invalid(e, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return api_err_invalid(e, "stream_options",
                                   "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    cJSON *u = field(root, "user");
    if (u && !cJSON_IsString(u))
        return api_err_invalid(e, "user", "'user' must be a string");
    if (parse_stop(root, p, e) || parse_logit_bias(root, tokenizer_n_vocab(c->tok), p, e) ||
        parse_dualpath(root, r, e))
        return -1;
    return parse_constraint(c, root, p, e);
}

/* ---- structured output ----
 *
 * Every way clients ask for it becomes one grammar (sched/grammar.h),
 * compiled here so that a bad schema or grammar is a 400 naming the field:
 * OpenAI's response_format (json_object; json_schema with its schema, strict
 * or not: the grammar is exact either way), vLLM's guided_json,
 * guided_regex, guided_choice and guided_grammar, llama.cpp's json_schema and
 * grammar (GBNF). One request asks for one of them. */

/* The schema of a field that holds one: an object, a boolean, or (vLLM
 * accepts it) a JSON text. *own is set when it was parsed here. */
static const cJSON *schema_of(const cJSON *v, cJSON **own)
{
    *own = NULL;
    if (cJSON_IsString(v)) {
        *own = cJSON_Parse(v->valuestring);
        return *own;
    }
    return cJSON_IsObject(v) || cJSON_IsBool(v) ? v : NULL;
}

static int constraint_gbnf(const cJSON *root, const char *name, const cJSON *v, char **gbnf,
                           char *err, size_t errsz, char *where, size_t wsz)
{
    char path[256] = "";
    if (!strcmp(name, "response_format")) {
        const cJSON *t = cJSON_IsObject(v) ? field(v, "type") : NULL;
        if (!t || !cJSON_IsString(t))
            return dp_err(err, errsz, DP_EINVAL,
                          "'response_format' must be an object with a string 'type'");
        if (!strcmp(t->valuestring, "text"))
            return 0;
        if (!strcmp(t->valuestring, "json_object"))
            return schema_json_object_gbnf(gbnf, err, errsz);
        if (strcmp(t->valuestring, "json_schema"))
            return dp_err(err, errsz, DP_EINVAL, "response_format type '%.40s' is not supported "
                          "('text', 'json_object' or 'json_schema')", t->valuestring);
        const cJSON *js = field(v, "json_schema");
        const cJSON *sc = cJSON_IsObject(js) ? field(js, "schema") : NULL;
        if (!sc) /* OpenAI: json_schema.schema; some clients send it one level up */
            sc = field(v, "schema");
        if (!sc || !(cJSON_IsObject(sc) || cJSON_IsBool(sc))) {
            snprintf(where, wsz, "response_format.json_schema.schema");
            return dp_err(err, errsz, DP_EINVAL, "response_format json_schema needs "
                          "'json_schema': {'name': ..., 'schema': {...}}");
        }
        int rc = schema_to_gbnf(sc, gbnf, path, sizeof path, err, errsz);
        if (rc && path[0])
            snprintf(where, wsz, "response_format.json_schema.schema.%.200s", path);
        return rc;
    }
    if (!strcmp(name, "guided_json") || !strcmp(name, "json_schema")) {
        cJSON *own;
        const cJSON *sc = schema_of(v, &own);
        if (!sc)
            return dp_err(err, errsz, DP_EINVAL, "'%s' must be a JSON Schema (an object)", name);
        int rc = schema_to_gbnf(sc, gbnf, path, sizeof path, err, errsz);
        if (rc && path[0])
            snprintf(where, wsz, "%s.%.200s", name, path);
        cJSON_Delete(own);
        return rc;
    }
    if (!strcmp(name, "guided_regex")) {
        if (!cJSON_IsString(v))
            return dp_err(err, errsz, DP_EINVAL, "'guided_regex' must be a string");
        return regex_to_gbnf(v->valuestring, strlen(v->valuestring), gbnf, err, errsz);
    }
    if (!strcmp(name, "guided_choice")) {
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        if (n < 1 || n > 4096)
            return dp_err(err, errsz, DP_EINVAL, "'guided_choice' must be an array of 1 to 4096 "
                          "strings");
        const char **ch = calloc((size_t)n, sizeof *ch);
        if (!ch)
            return DP_ENOMEM;
        int i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (!cJSON_IsString(it)) {
                free(ch);
                return dp_err(err, errsz, DP_EINVAL, "'guided_choice' must hold strings only");
            }
            ch[i++] = it->valuestring;
        }
        int rc = choice_to_gbnf(ch, n, gbnf, err, errsz);
        free(ch);
        return rc;
    }
    /* guided_grammar, grammar: GBNF as given. */
    (void)root;
    if (!cJSON_IsString(v))
        return dp_err(err, errsz, DP_EINVAL, "'%s' must be a string (GBNF)", name);
    *gbnf = strdup(v->valuestring);
    return *gbnf ? 0 : DP_ENOMEM;
}

#define GRAMMAR_CACHE_SLOTS 32

struct dp_grammar_cache {
    struct gc_entry {
        char *text;
        dp_grammar *g;
        uint64_t used;
    } e[GRAMMAR_CACHE_SLOTS];
    uint64_t clock;
};

dp_grammar_cache *grammar_cache_new(void) { return calloc(1, sizeof(dp_grammar_cache)); }

void grammar_cache_free(dp_grammar_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < GRAMMAR_CACHE_SLOTS; i++) {
        free(c->e[i].text);
        grammar_unref(c->e[i].g);
    }
    free(c);
}

/* The grammar of a GBNF text: the cached one (a new reference), else
 * compiled and cached in the least recently used slot. */
static int grammar_get(dp_grammar_cache *c, const char *text, dp_grammar **out, char *err,
                       size_t errsz)
{
    if (c)
        for (int i = 0; i < GRAMMAR_CACHE_SLOTS; i++)
            if (c->e[i].text && !strcmp(c->e[i].text, text)) {
                c->e[i].used = ++c->clock;
                grammar_ref(c->e[i].g);
                *out = c->e[i].g;
                return 0;
            }
    int rc = grammar_compile(out, text, strlen(text), err, errsz);
    if (rc || !c)
        return rc;
    struct gc_entry *v = &c->e[0];
    for (int i = 1; i < GRAMMAR_CACHE_SLOTS; i++)
        if (c->e[i].used < v->used)
            v = &c->e[i];
    char *t = strdup(text);
    if (!t)
        return 0; /* uncached, still compiled */
    free(v->text);
    grammar_unref(v->g);
    grammar_ref(*out);
    *v = (struct gc_entry){t, *out, ++c->clock};
    return 0;
}

static int parse_constraint(const dp_oai_ctx *c, const cJSON *root, dp_request_params *p,
                            dp_api_err *e)
{
    static const char *const names[] = {"response_format", "guided_json", "guided_regex",
                                        "guided_choice", "guided_grammar", "json_schema",
                                        "grammar"};
    const char *name = NULL;
    const cJSON *v = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const cJSON *x = field(root, names[i]);
        if (!x)
            continue;
        if (name)
            return api_err_invalid(e, names[i], "'%s' and '%s' both constrain the output; send "
                                   "one", name, names[i]);
        name = names[i];
        v = x;
    }
    if (!name)
        return 0;
    char err[DP_ERRLEN] = "", where[320] = "";
    char *gbnf = NULL;
    int rc = constraint_gbnf(root, name, v, &gbnf, err, sizeof err, where, sizeof where);
    if (rc == 0 && gbnf)
        rc = grammar_get(c->grammars, gbnf, &p->grammar, err, sizeof err);
    free(gbnf);
    if (rc == DP_ENOMEM)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc)
        return api_err_invalid(e, where[0] ? where : name, "%s", err);
    return 0;
}

static int prompt_from_text(const dp_oai_ctx *c, dp_oai_prompt *pr, const char *s, size_t n,
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
    cJSON *p = field(root, "prompt");
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
        return prompt_from_text(c, &r->prompts[0], p->valuestring, strlen(p->valuestring),
                                "prompt", e);
    if (ids_single)
        return prompt_from_ids(c, &r->prompts[0], p, e);
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, p) {
        int rc;
        if (cJSON_IsString(it))
            rc = prompt_from_text(c, &r->prompts[i], it->valuestring, strlen(it->valuestring),
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

/* Text of a message's content: a string or a list of text parts. */
static int content_text(const cJSON *m, int idx, char **out, dp_api_err *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    cJSON *ct = field(m, "content");
    if (!ct)
        return api_err_invalid(e, param, "'%s' is required", param);
    if (cJSON_IsString(ct)) {
        *out = strdup(ct->valuestring);
        return *out ? 0 : api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!cJSON_IsArray(ct))
        return api_err_invalid(e, param, "'%s' must be a string or an array of text parts", param);
    size_t total = 1;
    cJSON *it;
    cJSON_ArrayForEach(it, ct) {
        cJSON *t = cJSON_IsObject(it) ? field(it, "type") : NULL;
        cJSON *tx = cJSON_IsObject(it) ? field(it, "text") : NULL;
        if (!t || !cJSON_IsString(t) || strcmp(t->valuestring, "text") || !tx || !cJSON_IsString(tx))
            return api_err_invalid(e, param, "'%s' parts must be {\"type\": \"text\", \"text\": string} "
                                   "(other part types are not supported)", param);
        total += strlen(tx->valuestring) + 1;
    }
    char *s = malloc(total);
    if (!s)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t w = 0;
    cJSON_ArrayForEach(it, ct) {
        const char *tx = field(it, "text")->valuestring;
        if (w)
            s[w++] = '\n';
        size_t l = strlen(tx);
        memcpy(s + w, tx, l);
        w += l;
    }
    s[w] = 0;
    *out = s;
    return 0;
}

/* The prompt's first tokens that render its leading system messages: the
 * longest common prefix of the prompt and those messages rendered alone (a
 * template that folds the system prompt into the first user turn shares
 * less, or nothing). */
static int system_tokens(const dp_oai_ctx *c, const dp_chat_template *tmpl, const jv *kwargs,
                         const dp_chat_msg *msgs, int n, const dp_oai_prompt *pr, int32_t *out,
                         dp_api_err *e)
{
    int n_sys = 0;
    while (n_sys < n && !strcmp(msgs[n_sys].role, "system"))
        n_sys++;
    *out = 0;
    if (n_sys == 0 || n_sys == n)
        return 0;
    char *text = NULL, err[DP_ERRLEN];
    int32_t *ids = NULL;
    size_t nid = 0;
    /* A template may refuse a conversation of system messages alone (no
     * user turn): then nothing is counted as shared. */
    int rc = chat_template_apply_kw(tmpl, msgs, (size_t)n_sys, DP_CHAT_END_NONE, kwargs, &text, err,
                                    sizeof err);
    if (rc == DP_EINVAL || rc == DP_ERANGE)
        return 0;
    if (rc ||
        tokenizer_encode(c->tok, text, strlen(text), tokenizer_add_bos(c->tok), true, &ids, &nid)) {
        free(text);
        return api_err_set(e, 500, "server_error", NULL, NULL, "cannot render the system prompt");
    }
    int32_t k = 0;
    while (k < (int32_t)nid && k < pr->n_ids && ids[k] == pr->ids[k])
        k++;
    *out = k;
    free(ids);
    free(text);
    return 0;
}

/* tools / tool_choice: the reply's grammar (shared through the cache like
 * any other) and the text the system prompt gains (parse_messages). */
static int parse_tools(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    if (tools_parse(root, &r->tools, e))
        return -1;
    if (r->tools.mode == DP_TOOLS_OFF)
        return 0;
    if (r->params.grammar)
        return api_err_invalid(e, "tool_choice", "tool calls and a constrained output format "
                               "('response_format', 'guided_*', 'grammar') cannot be combined; "
                               "set 'tool_choice' to \"none\" or drop the format");
    char err[DP_ERRLEN] = "";
    int rc = grammar_get(c->grammars, r->tools.gbnf, &r->params.grammar, err, sizeof err);
    if (rc == DP_ENOMEM)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc)
        return api_err_invalid(e, "tools", "%s", err);
    return 0;
}

/* The system message the tools are described in: the conversation's first
 * (the description appended), else a new one (after the template's default
 * system prompt, which it would otherwise replace). */
static int add_tools_system(const dp_chat_template *tmpl, const dp_oai_req *r, dp_chat_msg *msgs,
                            int *n, char **texts, dp_api_err *e)
{
    const char *sys = r->tools.system_text;
    bool first_sys = *n > 0 && !strcmp(msgs[0].role, "system");
    const char *base = first_sys ? msgs[0].content : tmpl->default_system;
    size_t len = (base ? strlen(base) + 2 : 0) + strlen(sys) + 1;
    char *t = malloc(len);
    if (!t)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    snprintf(t, len, "%s%s%s", base ? base : "", base ? "\n\n" : "", sys);
    if (!first_sys) {
        memmove(msgs + 1, msgs, (size_t)*n * sizeof *msgs);
        memmove(texts + 1, texts, (size_t)*n * sizeof *texts);
        (*n)++;
        texts[0] = NULL;
    }
    free(texts[0]);
    texts[0] = t;
    msgs[0] = (dp_chat_msg){"system", t};
    return 0;
}

/* chat_template (compiled for this request) and chat_template_kwargs. */
static int request_template(const dp_oai_ctx *c, const cJSON *root, dp_chat_template *own,
                            const dp_chat_template **tmpl, jv **kwargs, dp_api_err *e)
{
    *tmpl = c->tmpl;
    *kwargs = NULL;
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw))
            return api_err_invalid(e, "chat_template_kwargs", "'chat_template_kwargs' must be an "
                                   "object");
        /* Values are bounded: dicts are searched linearly, so 60000 keys in
         * one object (768 KB) took minutes to convert. */
        long left = 4096;
        if (!(*kwargs = jv_from_json(kw, 64, &left)))
            return api_err_invalid(e, "chat_template_kwargs", "'chat_template_kwargs' is nested "
                                   "deeper than 64 levels or has more than 4096 values");
    }
    const cJSON *ts = field(root, "chat_template");
    if (!ts || cJSON_IsNull(ts))
        return 0;
    if (!cJSON_IsString(ts) || !ts->valuestring[0]) {
        jv_unref(*kwargs);
        *kwargs = NULL;
        return api_err_invalid(e, "chat_template", "'chat_template' must be a non-empty string "
                               "(a Jinja template)");
    }
    char err[DP_ERRLEN];
    int rc = chat_template_init(own, ts->valuestring, strlen(ts->valuestring), c->tmpl->bos_text,
                                c->tmpl->eos_text, err, sizeof err);
    if (rc) {
        jv_unref(*kwargs);
        *kwargs = NULL;
        if (rc == DP_ENOMEM)
            return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return api_err_invalid(e, "chat_template", "'chat_template': %s", err);
    }
    own->keep_bos = c->tmpl->keep_bos; /* it depends on the tokenizer, not the template */
    *tmpl = own;
    return 0;
}

static int parse_messages(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    dp_chat_template own = {0};
    const dp_chat_template *tmpl = c->tmpl;
    jv *kwargs = NULL;
    cJSON *ms = field(root, "messages");
    if (!ms)
        return api_err_invalid(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(ms))
        return api_err_invalid(e, "messages", "'messages' must be an array of message objects");
    int n = cJSON_GetArraySize(ms);
    if (n == 0)
        return api_err_invalid(e, "messages", "'messages' must not be empty");
    if (n > 4096)
        return api_err_invalid(e, "messages", "'messages' has %d entries; at most 4096", n);
    /* One more: the system message tools may add. */
    dp_chat_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
    char **texts = calloc((size_t)n + 1, sizeof *texts);
    int rc = -1, i = 0;
    char *prompt = NULL;
    if (!msgs || !texts) {
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (request_template(c, root, &own, &tmpl, &kwargs, e))
        goto out;
    cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            api_err_invalid(e, param, "'%s' must be an object", param);
            goto out;
        }
        cJSON *role = field(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!role || !cJSON_IsString(role)) {
            api_err_invalid(e, param, "'%s' must be a string", param);
            goto out;
        }
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer"))
            rs = "system";
        /* The legacy function-calling API is not implemented: its messages
         * are refused as such, not for their missing content. */
        if (!strcmp(rs, "function") || field(m, "function_call")) {
            snprintf(param, sizeof param, "messages[%d].%s", i,
                     strcmp(rs, "function") ? "function_call" : "role");
            api_err_invalid(e, param, "'%s': the legacy function-calling API is not supported "
                            "(use 'tools')", param);
            goto out;
        }
        const cJSON *tc = field(m, "tool_calls");
        if (tc && (cJSON_IsNull(tc) || (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0)))
            tc = NULL; /* null or an empty list asks for nothing */
        if (tc && !(cJSON_IsArray(tc) && !strcmp(rs, "assistant"))) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            api_err_invalid(e, param, "'%s' must be an array, on an assistant message", param);
            goto out;
        }
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool")) {
            api_err_invalid(e, param, "'%s' must be 'system', 'user', 'assistant' or 'tool', got "
                            "'%.40s'", param, role->valuestring);
            goto out;
        }
        const cJSON *ct = field(m, "content");
        if (tc && (!ct || cJSON_IsNull(ct))) {
            texts[i] = strdup(""); /* the calls are its content */
            if (!texts[i]) {
                api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
                goto out;
            }
        } else if (content_text(m, i, &texts[i], e)) {
            goto out;
        }
        if (tc) { /* the calls as the model writes them (api/tools.h) */
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            char *t = tools_render_calls(tc, texts[i], param, e);
            if (!t)
                goto out;
            free(texts[i]);
            texts[i] = t;
        }
        msgs[i].role = rs;
        msgs[i].content = texts[i];
        /* An earlier reply: this turn continues a conversation, whose next
         * turn will ask for this one's prompt and reply again. */
        if (i < n - 1 && (!strcmp(rs, "assistant") || !strcmp(rs, "tool")))
            r->params.conversation = true;
        i++;
    }
    if (r->tools.mode != DP_TOOLS_OFF && add_tools_system(tmpl, r, msgs, &n, texts, e))
        goto out;
    /* How the prompt ends. A last message from the assistant is continued
     * (assistant prefill, llama.cpp's default) unless add_generation_prompt
     * asks for a new turn; vLLM's continue_final_message says so outright. */
    bool agp = true, agp_set = field(root, "add_generation_prompt") != NULL, cfm = false;
    bool cfm_set = field(root, "continue_final_message") != NULL;
    if (get_bool(root, "add_generation_prompt", &agp, e) ||
        get_bool(root, "continue_final_message", &cfm, e))
        goto out;
    bool last_assistant = !strcmp(msgs[n - 1].role, "assistant");
    if (cfm && agp_set && agp) {
        api_err_invalid(e, "continue_final_message", "'continue_final_message' and "
                        "'add_generation_prompt' cannot both be true");
        goto out;
    }
    if (cfm && !last_assistant) {
        api_err_invalid(e, "continue_final_message", "'continue_final_message' needs the last "
                        "message to be the assistant's");
        goto out;
    }
    dp_chat_end end = cfm || (!cfm_set && !agp_set && last_assistant) ? DP_CHAT_END_CONTINUE
                      : agp                                            ? DP_CHAT_END_GENERATE
                                                                       : DP_CHAT_END_NONE;
    char err[DP_ERRLEN];
    int trc = chat_template_apply_kw(tmpl, msgs, (size_t)n, end, kwargs, &prompt, err, sizeof err);
    if (trc) {
        /* The template's own error (raise_exception, a limit) is the client's
         * 400; running out of memory is the server's. */
        if (trc == DP_ENOMEM)
            api_err_set(e, 500, "server_error", NULL, NULL, "out of memory rendering the chat template");
        else
            api_err_invalid(e, "messages", "%s", err);
        goto out;
    }
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) {
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    r->n_prompts = 1;
    rc = prompt_from_text(c, &r->prompts[0], prompt, strlen(prompt), "messages", e);
    /* Counted only where it is kept (an explicit keep_prefix wins). */
    bool keep_sys = r->keep_system >= 0 ? r->keep_system : c->keep_system;
    if (rc == 0 && keep_sys && r->keep_prefix < 0)
        rc = system_tokens(c, tmpl, kwargs, msgs, n, &r->prompts[0], &r->system_tokens, e);
out:
    chat_template_destroy(&own);
    jv_unref(kwargs);
    for (int k = 0; texts && k < n; k++)
        free(texts[k]);
    free(texts);
    free(msgs);
    free(prompt);
    return rc;
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
    cJSON *plp = field(root, "prompt_logprobs");
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
        if (get_bool(root, "logprobs", &lp, e))
            return -1;
        if (get_int(root, "top_logprobs", 0, DP_MAX_TOP_LOGPROBS, &v, &present, e))
            return -1;
        if (present && !lp)
            return api_err_invalid(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
        p->logprobs = lp ? (present ? (int32_t)v : 0) : -1;
        cJSON *ev = field(root, "echo");
        if (ev && !cJSON_IsFalse(ev))
            return api_err_invalid(e, "echo", "'echo' is not supported for chat completions");
        if (parse_tools(c, root, r, e) || parse_messages(c, root, r, e))
            return -1;
    } else {
        cJSON *lpv = field(root, "logprobs");
        if (lpv && cJSON_IsBool(lpv))
            return api_err_invalid(e, "logprobs", "'logprobs' must be an integer in [0, %d] for completions",
                                   DP_MAX_TOP_LOGPROBS);
        if (get_int(root, "logprobs", 0, DP_MAX_TOP_LOGPROBS, &v, &present, e))
            return -1;
        p->logprobs = present ? (int32_t)v : -1;
        if (get_bool(root, "echo", &r->echo, e))
            return -1;
        /* echo with logprobs scores the prompt too (the legacy API's way,
         * which lm-evaluation-harness uses for loglikelihoods). */
        if (r->echo && p->logprobs >= 0) {
            p->prompt_logprobs = true;
            p->prompt_top = p->logprobs;
        }
        cJSON *tl = field(root, "tools");
        if (tl && !cJSON_IsNull(tl) && !(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == 0))
            return api_err_invalid(e, "tools", "'tools' are for chat completions "
                                   "(/v1/chat/completions)");
        cJSON *tch = field(root, "tool_choice");
        if (tch && !cJSON_IsNull(tch) &&
            !(cJSON_IsString(tch) && (!strcmp(tch->valuestring, "none") ||
                                      !strcmp(tch->valuestring, "auto"))))
            return api_err_invalid(e, "tool_choice", "'tool_choice' is for chat completions "
                                   "(/v1/chat/completions)");
        cJSON *sfx = field(root, "suffix");
        if (sfx)
            return api_err_invalid(e, "suffix", "'suffix' is not supported");
        cJSON *bo = field(root, "best_of");
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
     * (parse_messages counts it only then). */
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
