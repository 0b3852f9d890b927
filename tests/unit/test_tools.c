/* test_tools.c: tools / tool_choice -> grammar and system text, and replies
 * -> tool calls. The grammar must admit exactly the reply shapes of its mode
 * (the calls of the named or listed tools with schema-valid arguments, and
 * under auto the text answer), in compact JSON; a reply cut short keeps its
 * whole calls; calls in a conversation render as the model writes them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/tools.h"
#include "common/dp.h"
#include "sched/grammar.h"
#include "t.h"

#define TOOLS                                                                                   \
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "          \
    "\"description\": \"weather\", \"parameters\": {\"type\": \"object\", \"properties\": "    \
    "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], "                           \
    "\"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": {\"name\": "   \
    "\"now\"}}]"

static dp_grammar *parse_ok(const char *body, dp_tools *t, dp_tool_mode want)
{
    cJSON *root = cJSON_Parse(body);
    CHECK_MSG(root != NULL, "bad test JSON %s", body);
    dp_api_err e;
    CHECK_MSG(tools_parse(root, t, &e) == 0, "%s: %s", body, e.message);
    cJSON_Delete(root);
    CHECK_EQ_INT(t->mode, want);
    if (want == DP_TOOLS_OFF) {
        CHECK(t->gbnf == NULL && t->system_text == NULL);
        return NULL;
    }
    dp_grammar *g = NULL;
    char err[DP_ERRLEN];
    CHECK_MSG(grammar_compile(&g, t->gbnf, strlen(t->gbnf), err, sizeof err) == 0, "%s\n%s", err,
              t->gbnf);
    CHECK(strstr(t->system_text, "get_weather") || want == DP_TOOLS_NAMED);
    return g;
}

static void refused(const char *body, const char *param)
{
    cJSON *root = cJSON_Parse(body);
    CHECK_MSG(root != NULL, "bad test JSON %s", body);
    dp_tools t;
    dp_api_err e;
    CHECK_MSG(tools_parse(root, &t, &e) == -1, "accepted: %s", body);
    CHECK_EQ_INT(e.status, 400);
    CHECK_MSG(!strcmp(e.param, param), "param '%s', expected '%s' (%s)", e.param, param, e.message);
    cJSON_Delete(root);
}

#define M(g, s) CHECK_MSG(grammar_matches(g, s, strlen(s)), "should match: %s", s)
#define N(g, s) CHECK_MSG(!grammar_matches(g, s, strlen(s)), "should not match: %s", s)

int main(void)
{
    dp_tools t;
    /* required: calls of either tool, arguments held to the schema. */
    dp_grammar *g = parse_ok("{" TOOLS ", \"tool_choice\": \"required\"}", &t, DP_TOOLS_REQUIRED);
    M(g, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}");
    M(g, "{\"tool_calls\":[{\"name\":\"now\",\"arguments\":{}},{\"name\":\"now\",\"arguments\":{}}]}");
    N(g, "{\"tool_calls\": []}");
    N(g, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {}}]}"); /* city required */
    N(g, "{\"tool_calls\": [{\"name\": \"other\", \"arguments\": {}}]}");
    N(g, "{\"response\": \"hi\"}");
    /* Compact: no newline layout. */
    N(g, "{\n  \"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}]}");
    CHECK(strstr(t.system_text, "\"tool_calls\"") != NULL);
    grammar_unref(g);
    tools_free(&t);
    /* auto (the default with tools) admits the text answer too. */
    g = parse_ok("{" TOOLS "}", &t, DP_TOOLS_AUTO);
    M(g, "{\"response\": \"It is sunny.\"}");
    M(g, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}]}");
    CHECK(strstr(t.system_text, "\"response\"") != NULL);
    grammar_unref(g);
    tools_free(&t);
    /* A named function: that one, once; the prompt shows only it. */
    g = parse_ok("{" TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                 "\"now\"}}}", &t, DP_TOOLS_NAMED);
    M(g, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}]}");
    N(g, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", "
         "\"arguments\": {}}]}");
    N(g, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}]}");
    CHECK(strstr(t.system_text, "get_weather") == NULL && strstr(t.system_text, "\"now\""));
    grammar_unref(g);
    tools_free(&t);
    /* parallel_tool_calls false: one call. */
    g = parse_ok("{" TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false}", &t,
                 DP_TOOLS_REQUIRED);
    N(g, "{\"tool_calls\":[{\"name\":\"now\",\"arguments\":{}},{\"name\":\"now\",\"arguments\":{}}]}");
    grammar_unref(g);
    tools_free(&t);
    /* Nothing to do. */
    parse_ok("{" TOOLS ", \"tool_choice\": \"none\"}", &t, DP_TOOLS_OFF);
    parse_ok("{\"tools\": [], \"tool_choice\": \"auto\"}", &t, DP_TOOLS_OFF);
    parse_ok("{}", &t, DP_TOOLS_OFF);
    /* Bad input names its field. */
    refused("{\"tools\": 3}", "tools");
    refused("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}",
            "tools[0].function.name");
    refused("{" TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
            "\"x\"}}}", "tool_choice");
    refused("{\"tool_choice\": \"required\"}", "tool_choice");
    refused("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
            "{\"type\": \"integer\", \"multipleOf\": 2}}}]}", "tools[0].function.parameters.multipleOf");

    /* Replies: calls, a text answer, a reply cut short, not the JSON at all. */
    cJSON *calls;
    char *content;
    const char *whole = "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                        "\"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]}";
    CHECK_EQ_INT(tools_shape(whole, strlen(whole), "abc", &calls, &content), 1);
    CHECK(content == NULL && cJSON_GetArraySize(calls) == 2);
    cJSON *c0 = cJSON_GetArrayItem(calls, 0), *f0 = cJSON_GetObjectItem(c0, "function");
    CHECK(!strcmp(cJSON_GetObjectItem(c0, "id")->valuestring, "call_abc_0"));
    CHECK(!strcmp(cJSON_GetObjectItem(c0, "type")->valuestring, "function"));
    CHECK(!strcmp(cJSON_GetObjectItem(f0, "name")->valuestring, "get_weather"));
    CHECK(!strcmp(cJSON_GetObjectItem(f0, "arguments")->valuestring, "{\"city\":\"Paris\"}"));
    cJSON_Delete(calls);
    const char *cut = "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", "
                      "\"arguments\": {}}, {\"name\": \"get_weather\", \"argu";
    CHECK_EQ_INT(tools_shape(cut, strlen(cut), "x", &calls, &content), 1);
    CHECK_EQ_INT(cJSON_GetArraySize(calls), 2);
    cJSON_Delete(calls);
    const char *text = "{\"response\": \"It is sunny.\"}";
    CHECK_EQ_INT(tools_shape(text, strlen(text), "x", &calls, &content), 0);
    CHECK(calls == NULL && !strcmp(content, "It is sunny."));
    free(content);
    const char *junk = "{\"resp";
    CHECK_EQ_INT(tools_shape(junk, strlen(junk), "x", &calls, &content), 0);
    CHECK(!strcmp(content, junk));
    free(content);

    /* Calls in a conversation render as the model writes them. */
    cJSON *tc = cJSON_Parse("[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
                            "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}}]");
    dp_api_err e;
    char *r = tools_render_calls(tc, "", "messages[1].tool_calls", &e);
    CHECK(r && !strcmp(r, "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}]}"));
    free(r);
    r = tools_render_calls(tc, "Let me look.", "messages[1].tool_calls", &e);
    CHECK(r && !strncmp(r, "Let me look.\n{\"tool_calls\"", 26));
    free(r);
    cJSON_Delete(tc);
    tc = cJSON_Parse("[{\"id\": \"1\"}]");
    CHECK(tools_render_calls(tc, "", "messages[1].tool_calls", &e) == NULL);
    CHECK_EQ_INT(e.status, 400);
    cJSON_Delete(tc);
    T_DONE("tools");
}
