/* oai_constraint.c: structured output. Every way a request asks for it
 * becomes one grammar, compiled at parse time (a bad schema is a 400 naming
 * its field), and compiled grammars are shared between requests that send
 * the same text (a small LRU cache). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "oai_private.h"
#include "schema.h"

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
        const cJSON *t = cJSON_IsObject(v) ? oai_field(v, "type") : NULL;
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
        const cJSON *js = oai_field(v, "json_schema");
        const cJSON *sc = cJSON_IsObject(js) ? oai_field(js, "schema") : NULL;
        if (!sc) /* OpenAI: json_schema.schema; some clients send it one level up */
            sc = oai_field(v, "schema");
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
int oai_grammar_get(dp_grammar_cache *c, const char *text, dp_grammar **out, char *err,
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

int oai_parse_constraint(const dp_oai_ctx *c, const cJSON *root, dp_request_params *p,
                         dp_api_err *e)
{
    static const char *const names[] = {"response_format", "guided_json", "guided_regex",
                                        "guided_choice", "guided_grammar", "json_schema",
                                        "grammar"};
    const char *name = NULL;
    const cJSON *v = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const cJSON *x = oai_field(root, names[i]);
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
        rc = oai_grammar_get(c->grammars, gbnf, &p->grammar, err, sizeof err);
    free(gbnf);
    if (rc == DP_ENOMEM)
        return api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc)
        return api_err_invalid(e, where[0] ? where : name, "%s", err);
    return 0;
}
