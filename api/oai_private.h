/* oai_private.h: what the OpenAI JSON layer's files share (openai.c parses
 * a request; oai_chat.c, oai_constraint.c and oai_response.c each own a
 * part). Not public: api/openai.h is the layer's interface. */
#ifndef DP_API_OAI_PRIVATE_H
#define DP_API_OAI_PRIVATE_H

#include "openai.h"

/* ---- openai.c: reading fields ---- */

/* The member name of root, or NULL when absent or JSON null. */
cJSON *oai_field(const cJSON *root, const char *name);
/* Reads a boolean member (absent: *out unchanged); a 400 when not one. */
int oai_get_bool(const cJSON *root, const char *name, bool *out, dp_api_err *e);
/* Tokenizes a prompt's text (param names the field in errors). */
int oai_prompt_from_text(const dp_oai_ctx *c, dp_oai_prompt *pr, const char *s, size_t n,
                         const char *param, dp_api_err *e);

/* ---- oai_constraint.c: structured output ---- */

/* response_format, guided_* , json_schema or grammar: at most one, compiled
 * into p->grammar. */
int oai_parse_constraint(const dp_oai_ctx *c, const cJSON *root, dp_request_params *p,
                         dp_api_err *e);
/* A compiled grammar for GBNF text, from the cache or compiled now (a new
 * reference). */
int oai_grammar_get(dp_grammar_cache *c, const char *text, dp_grammar **out, char *err,
                    size_t errsz);

/* ---- oai_chat.c: messages to a prompt ---- */

/* tools and tool_choice (and the grammar a forced call needs). */
int oai_parse_tools(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e);
/* messages, through the chat template, to r's one prompt. */
int oai_parse_messages(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e);

#endif
