/* tools.h: tool calling (OpenAI's tools / tool_choice) on top of constrained
 * decoding. The model is told about the tools in its system prompt and
 * answers in one JSON shape, which a grammar enforces:
 *     {"tool_calls": [{"name": "<tool>", "arguments": {...}}, ...]}
 * with each call's arguments constrained to that tool's parameter schema;
 * under tool_choice "auto" the alternative {"response": "<text>"} lets it
 * answer in words (llama.cpp's generic tool format, for templates without a
 * tool syntax of their own). The reply is then reshaped into OpenAI's
 * message.tool_calls (or content), whole or streamed. No I/O here. */
#ifndef DP_API_TOOLS_H
#define DP_API_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "errors.h"

typedef enum dp_tool_mode {
    DP_TOOLS_OFF = 0,      /* no tools, or tool_choice "none" */
    DP_TOOLS_AUTO,         /* a call or a text answer */
    DP_TOOLS_REQUIRED,     /* at least one call, of any tool */
    DP_TOOLS_NAMED,        /* one call of the named tool */
} dp_tool_mode;

#define DP_MAX_TOOLS 128

typedef struct dp_tools {
    dp_tool_mode mode;
    char *system_text;     /* what the system prompt gains (owned); NULL when off */
    char *gbnf;            /* the grammar of the reply (owned); NULL when off */
} dp_tools;

/* Reads tools, tool_choice and parallel_tool_calls of a chat request. On a
 * bad value fills e (400 naming the field) and returns -1; 0 otherwise (mode
 * OFF when there is nothing to do). */
int tools_parse(const cJSON *root, dp_tools *t, dp_api_err *e);
void tools_free(dp_tools *t);

/* The text an assistant message with tool_calls renders as in the prompt
 * (the JSON the model writes for them, after any content). malloc'd; NULL
 * and e filled when a call is malformed (param names it). */
char *tools_render_calls(const cJSON *tool_calls, const char *content, const char *param,
                         dp_api_err *e);

/* A finished reply's shape: the calls it makes (an array of OpenAI
 * tool_call objects, ids made from id_base and their index; of a reply cut
 * short, the calls that are whole) or its text answer. Returns 1 with
 * *calls set, 0 with *content set (malloc'd: the answer under "auto", else
 * the text itself when it holds no whole call), negative on allocation
 * failure. */
int tools_shape(const char *text, size_t len, const char *id_base, cJSON **calls,
                char **content);

#endif
