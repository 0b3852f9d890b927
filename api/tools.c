/* tools.c: tools / tool_choice -> a system-prompt text and a reply grammar;
 * a finished reply -> OpenAI tool_calls. See tools.h for the format. */
#include "tools.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "schema.h"

static const cJSON *member(const cJSON *o, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

void tools_free(dp_tools *t)
{
    free(t->system_text);
    free(t->gbnf);
    memset(t, 0, sizeof *t);
}

/* {"type":"object","properties":{"name":{"const":N},"arguments":P},
 *  "required":["name","arguments"],"additionalProperties":false} */
static cJSON *call_schema(const char *name, const cJSON *params)
{
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *nm = cJSON_CreateObject();
    cJSON *args = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    const char *req[] = {"name", "arguments"};
    cJSON *required = cJSON_CreateStringArray(req, 2);
    if (!s || !props || !nm || !args || !required) {
        cJSON_Delete(s);
        cJSON_Delete(props);
        cJSON_Delete(nm);
        cJSON_Delete(args);
        cJSON_Delete(required);
        return NULL;
    }
    if (!params) { /* no parameters: an empty object */
        cJSON_AddStringToObject(args, "type", "object");
        cJSON_AddBoolToObject(args, "additionalProperties", false);
    }
    cJSON_AddStringToObject(nm, "const", name);
    cJSON_AddItemToObject(props, "name", nm);
    cJSON_AddItemToObject(props, "arguments", args);
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddItemToObject(s, "properties", props);
    cJSON_AddItemToObject(s, "required", required);
    cJSON_AddBoolToObject(s, "additionalProperties", false);
    return s;
}

/* {"type":"object","properties":{K: V},"required":[K],"additionalProperties":false} */
static cJSON *one_member(const char *k, cJSON *v)
{
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject();
    const char *req[] = {k};
    cJSON *required = cJSON_CreateStringArray(req, 1);
    if (!s || !props || !required || !v) {
        cJSON_Delete(s);
        cJSON_Delete(props);
        cJSON_Delete(required);
        cJSON_Delete(v);
        return NULL;
    }
    cJSON_AddItemToObject(props, k, v);
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddItemToObject(s, "properties", props);
    cJSON_AddItemToObject(s, "required", required);
    cJSON_AddBoolToObject(s, "additionalProperties", false);
    return s;
}

/* The reply's schema: the calls (of the tools named by use[]), and under
 * auto the text alternative. */
static cJSON *reply_schema(const cJSON *const *names, const cJSON *const *params, int n,
                           const bool *use, bool parallel, dp_tool_mode mode)
{
    cJSON *any = cJSON_CreateArray();
    for (int i = 0; any && i < n; i++)
        if (use[i]) {
            cJSON *c = call_schema(names[i]->valuestring, params[i]);
            if (!c) {
                cJSON_Delete(any);
                return NULL;
            }
            cJSON_AddItemToArray(any, c);
        }
    cJSON *items = cJSON_CreateObject(), *arr = cJSON_CreateObject();
    if (!any || !items || !arr) {
        cJSON_Delete(any);
        cJSON_Delete(items);
        cJSON_Delete(arr);
        return NULL;
    }
    cJSON_AddItemToObject(items, "anyOf", any);
    cJSON_AddStringToObject(arr, "type", "array");
    cJSON_AddItemToObject(arr, "items", items);
    cJSON_AddNumberToObject(arr, "minItems", 1);
    if (!parallel || mode == DP_TOOLS_NAMED)
        cJSON_AddNumberToObject(arr, "maxItems", 1);
    cJSON *calls = one_member("tool_calls", arr);
    if (!calls || mode != DP_TOOLS_AUTO)
        return calls;
    cJSON *str = cJSON_CreateObject();
    if (str)
        cJSON_AddStringToObject(str, "type", "string");
    cJSON *text = one_member("response", str);
    cJSON *alt = cJSON_CreateArray(), *root = cJSON_CreateObject();
    if (!text || !alt || !root) {
        cJSON_Delete(calls);
        cJSON_Delete(text);
        cJSON_Delete(alt);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToArray(alt, calls);
    cJSON_AddItemToArray(alt, text);
    cJSON_AddItemToObject(root, "anyOf", alt);
    return root;
}

/* The system prompt's part: each tool as compact JSON, then the format. */
static char *system_text(const cJSON *tools, const bool *use, dp_tool_mode mode,
                         const char *named)
{
    cJSON *list = cJSON_CreateArray();
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = member(t, "function");
        if (!use[i++])
            continue;
        cJSON *o = cJSON_CreateObject();
        if (!o || !list) {
            cJSON_Delete(o);
            break;
        }
        cJSON_AddStringToObject(o, "name", member(f, "name")->valuestring);
        const cJSON *d = member(f, "description");
        if (cJSON_IsString(d))
            cJSON_AddStringToObject(o, "description", d->valuestring);
        const cJSON *p = member(f, "parameters");
        if (p)
            cJSON_AddItemToObject(o, "parameters", cJSON_Duplicate(p, true));
        cJSON_AddItemToArray(list, o);
    }
    char *js = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(list);
    if (!js)
        return NULL;
    const char *how =
        mode == DP_TOOLS_AUTO
            ? "To call tools, reply with only a JSON object {\"tool_calls\": [{\"name\": "
              "\"<tool name>\", \"arguments\": {<its arguments>}}]}. To answer without a tool, "
              "reply with only {\"response\": \"<your answer>\"}."
            : "Reply with only a JSON object {\"tool_calls\": [{\"name\": \"<tool name>\", "
              "\"arguments\": {<its arguments>}}]}.";
    size_t n = strlen(js) + strlen(how) + (named ? strlen(named) : 0) + 160;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "You can call these tools (name, description, JSON Schema of the "
                 "arguments):\n%s\n%s%s%s%s", js, how, named ? " Call the tool \"" : "",
                 named ? named : "", named ? "\"." : "");
    free(js);
    return s;
}

/* Tool replies are compact JSON: the converter's whitespace (a newline and
 * indentation between tokens) lets a model spend its reply on layout, and a
 * call cut short by max_tokens is no call at all. The rule keeps its name
 * and one optional space. */
static void compact_ws(char *gbnf)
{
    static const char ws[] = "ws ::= ";
    char *p = strstr(gbnf, ws);
    if (!p || (p != gbnf && p[-1] != '\n'))
        return;
    char *body = p + sizeof ws - 1, *end = strchr(body, '\n');
    static const char one[] = "\" \"?";
    size_t n = end ? (size_t)(end - body) : strlen(body);
    if (n < sizeof one - 1)
        return;
    memcpy(body, one, sizeof one - 1);
    memmove(body + sizeof one - 1, body + n, strlen(body + n) + 1);
}

int tools_parse(const cJSON *root, dp_tools *t, dp_api_err *e)
{
    memset(t, 0, sizeof *t);
    const cJSON *tools = member(root, "tools");
    const cJSON *tc = member(root, "tool_choice");
    const cJSON *ptc = member(root, "parallel_tool_calls");
    int n = tools && !cJSON_IsNull(tools) ? (cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : -1)
                                          : 0;
    if (n < 0)
        return api_err_invalid(e, "tools", "'tools' must be an array of tools");
    if (n > DP_MAX_TOOLS)
        return api_err_invalid(e, "tools", "'tools' has %d entries; at most %d", n, DP_MAX_TOOLS);
    if (ptc && !cJSON_IsNull(ptc) && !cJSON_IsBool(ptc))
        return api_err_invalid(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const bool parallel = !cJSON_IsFalse(ptc);
    /* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}} */
    dp_tool_mode mode = n > 0 ? DP_TOOLS_AUTO : DP_TOOLS_OFF;
    const char *named = NULL;
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none"))
            mode = DP_TOOLS_OFF;
        else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto"))
            mode = n > 0 ? DP_TOOLS_AUTO : DP_TOOLS_OFF;
        else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required"))
            mode = DP_TOOLS_REQUIRED;
        else if (cJSON_IsObject(tc)) {
            const cJSON *ty = member(tc, "type"), *f = member(tc, "function");
            const cJSON *nm = cJSON_IsObject(f) ? member(f, "name") : NULL;
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
                return api_err_invalid(e, "tool_choice", "'tool_choice' must be \"none\", "
                                       "\"auto\", \"required\" or {\"type\": \"function\", "
                                       "\"function\": {\"name\": ...}}");
            mode = DP_TOOLS_NAMED;
            named = nm->valuestring;
        } else {
            return api_err_invalid(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", "
                                   "\"required\" or {\"type\": \"function\", \"function\": "
                                   "{\"name\": ...}}");
        }
        if (mode != DP_TOOLS_OFF && n == 0)
            return api_err_invalid(e, "tool_choice", "'tool_choice' asks for a tool call, but "
                                   "there are no 'tools'");
    }
    if (n == 0)
        return 0;
    const cJSON **names = calloc((size_t)n, sizeof *names), **params = calloc((size_t)n, sizeof *params);
    bool *use = calloc((size_t)n, sizeof *use);
    char param[192], err[DP_ERRLEN], path[256];
    int rc = -1, i = 0, found = 0;
    if (!names || !params || !use) {
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, tools) {
        snprintf(param, sizeof param, "tools[%d]", i);
        const cJSON *ty = cJSON_IsObject(it) ? member(it, "type") : NULL;
        const cJSON *f = cJSON_IsObject(it) ? member(it, "function") : NULL;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsObject(f)) {
            api_err_invalid(e, param, "'%s' must be {\"type\": \"function\", \"function\": "
                            "{\"name\": ..., \"parameters\": {...}}} (only function tools are "
                            "supported)", param);
            goto out;
        }
        const cJSON *nm = member(f, "name"), *d = member(f, "description");
        const cJSON *p = member(f, "parameters");
        snprintf(param, sizeof param, "tools[%d].function.name", i);
        if (!cJSON_IsString(nm) || !name_ok(nm->valuestring)) {
            api_err_invalid(e, param, "'%s' must be 1 to 64 letters, digits, '_' or '-'", param);
            goto out;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(names[k]->valuestring, nm->valuestring)) {
                api_err_invalid(e, param, "two tools are named '%s'", nm->valuestring);
                goto out;
            }
        if (d && !cJSON_IsNull(d) && !cJSON_IsString(d)) {
            snprintf(param, sizeof param, "tools[%d].function.description", i);
            api_err_invalid(e, param, "'%s' must be a string", param);
            goto out;
        }
        if (p && cJSON_IsNull(p))
            p = NULL;
        if (p) { /* its arguments must be expressible: a 400 naming the keyword if not */
            char *g = NULL;
            path[0] = 0;
            int src = cJSON_IsObject(p) ? schema_to_gbnf(p, &g, path, sizeof path, err, sizeof err)
                                        : DP_EINVAL;
            free(g);
            if (src == DP_ENOMEM) {
                api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
                goto out;
            }
            if (src) {
                snprintf(param, sizeof param, "tools[%d].function.parameters%s%.60s", i,
                         path[0] ? "." : "", path);
                api_err_invalid(e, param, "%s", cJSON_IsObject(p) ? err
                                : "'parameters' must be a JSON Schema object");
                goto out;
            }
        }
        names[i] = nm;
        params[i] = p;
        use[i] = mode != DP_TOOLS_NAMED || !strcmp(nm->valuestring, named);
        found += use[i];
        i++;
    }
    if (mode == DP_TOOLS_NAMED && !found) {
        api_err_invalid(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'",
                        named);
        goto out;
    }
    if (mode == DP_TOOLS_OFF) {
        rc = 0;
        goto out;
    }
    cJSON *schema = reply_schema(names, params, n, use, parallel, mode);
    int grc = schema ? schema_to_gbnf(schema, &t->gbnf, path, sizeof path, err, sizeof err)
                     : DP_ENOMEM;
    cJSON_Delete(schema);
    if (grc == 0)
        compact_ws(t->gbnf);
    /* In a named mode the prompt shows that tool only; otherwise all of them. */
    t->system_text = grc ? NULL : system_text(tools, use, mode, named);
    if (grc == DP_ENOMEM || (!grc && !t->system_text)) {
        tools_free(t);
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (grc) {
        tools_free(t);
        api_err_invalid(e, "tools", "%s", err);
        goto out;
    }
    t->mode = mode;
    rc = 0;
out:
    free(names);
    free(params);
    free(use);
    return rc;
}

char *tools_render_calls(const cJSON *tool_calls, const char *content, const char *param,
                         dp_api_err *e)
{
    cJSON *out = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!out || !arr) {
        cJSON_Delete(out);
        cJSON_Delete(arr);
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    cJSON_AddItemToObject(out, "tool_calls", arr);
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, tool_calls) {
        const cJSON *f = cJSON_IsObject(c) ? member(c, "function") : NULL;
        const cJSON *nm = cJSON_IsObject(f) ? member(f, "name") : NULL;
        const cJSON *a = cJSON_IsObject(f) ? member(f, "arguments") : NULL;
        if (!cJSON_IsString(nm) || (a && !cJSON_IsString(a) && !cJSON_IsObject(a))) {
            cJSON_Delete(out);
            api_err_invalid(e, param, "'%s[%d]' must be {\"id\": ..., \"type\": \"function\", "
                            "\"function\": {\"name\": string, \"arguments\": string}}", param, i);
            return NULL;
        }
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddStringToObject(o, "name", nm->valuestring);
        /* OpenAI sends the arguments as a JSON text; the model wrote them as JSON. */
        cJSON *args = cJSON_IsString(a) ? cJSON_Parse(a->valuestring)
                      : a                ? cJSON_Duplicate(a, true)
                                         : cJSON_CreateObject();
        if (!args && cJSON_IsString(a))
            args = cJSON_CreateString(a->valuestring);
        cJSON_AddItemToObject(o, "arguments", args);
        cJSON_AddItemToArray(arr, o);
        i++;
    }
    char *js = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (!js) {
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    if (!content || !content[0])
        return js;
    size_t n = strlen(content) + strlen(js) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s\n%s", content, js);
    else
        api_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    free(js);
    return s;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* A reply cut short (max_tokens) inside its list of calls: the calls that
 * are whole, as {"tool_calls": [...]}; NULL when there is none. */
static cJSON *salvage_calls(const char *text, size_t len)
{
    const char *end = text + len, *p = memmem(text, len, "\"tool_calls\"", 12);
    p = p ? memchr(p, '[', (size_t)(end - p)) : NULL;
    if (!p)
        return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (p++; arr && p < end;) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == ','))
            p++;
        if (p >= end || *p != '{')
            break;
        const char *stop = NULL;
        cJSON *it = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &stop, false);
        if (!it || !stop || stop <= p) {
            cJSON_Delete(it);
            break;
        }
        cJSON_AddItemToArray(arr, it);
        p = stop;
    }
    if (!arr || cJSON_GetArraySize(arr) == 0) {
        cJSON_Delete(arr);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddItemToObject(o, "tool_calls", arr);
    else
        cJSON_Delete(arr);
    return o;
}

int tools_shape(const char *text, size_t len, const char *id_base, cJSON **calls, char **content)
{
    *calls = NULL;
    *content = NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j)
        j = salvage_calls(text, len);
    const cJSON *tc = cJSON_IsObject(j) ? member(j, "tool_calls") : NULL;
    const cJSON *resp = cJSON_IsObject(j) ? member(j, "response") : NULL;
    int rc = 0;
    if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) {
        cJSON *arr = cJSON_CreateArray();
        const cJSON *c;
        int i = 0;
        rc = arr ? 1 : DP_ENOMEM;
        cJSON_ArrayForEach(c, tc) {
            const cJSON *nm = member(c, "name"), *a = member(c, "arguments");
            cJSON *o = cJSON_CreateObject(), *f = cJSON_CreateObject();
            char *args = a ? cJSON_PrintUnformatted(a) : strdup("{}");
            char id[96];
            snprintf(id, sizeof id, "call_%.60s_%d", id_base, i++);
            if (!arr || !o || !f || !args || !cJSON_IsString(nm)) {
                cJSON_Delete(o);
                cJSON_Delete(f);
                free(args);
                rc = DP_ENOMEM;
                break;
            }
            cJSON_AddStringToObject(o, "id", id);
            cJSON_AddStringToObject(o, "type", "function");
            cJSON_AddStringToObject(f, "name", nm->valuestring);
            cJSON_AddStringToObject(f, "arguments", args);
            free(args);
            cJSON_AddItemToObject(o, "function", f);
            cJSON_AddItemToArray(arr, o);
        }
        if (rc == 1)
            *calls = arr;
        else
            cJSON_Delete(arr);
    } else if (cJSON_IsString(resp)) {
        *content = strdup(resp->valuestring);
        rc = *content ? 0 : DP_ENOMEM;
    } else {
        *content = dup_n(text, len); /* not the tool JSON: a reply cut short */
        rc = *content ? 0 : DP_ENOMEM;
    }
    cJSON_Delete(j);
    return rc;
}
