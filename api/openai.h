/* openai.h: the OpenAI wire format: request JSON -> validated generation
 * parameters and prompt tokens (every bad field becomes a 400 naming it), and
 * choices -> response JSON or SSE chunks. No I/O here. */
#ifndef DP_API_OPENAI_H
#define DP_API_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "errors.h"
#include "tools.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "sched/request.h"

typedef enum dp_oai_kind { DP_OAI_COMPLETION = 1, DP_OAI_CHAT = 2 } dp_oai_kind;

#define DP_OAI_MAX_N 8          /* choices per prompt */
#define DP_OAI_MAX_CHOICES 64   /* prompts x n */
#define DP_OAI_MAX_UNKNOWN 8    /* unknown field names reported per request */

/* Compiled grammars by their text, so that requests with the same schema
 * share one grammar and with it its token-mask cache (sched/grammar.h).
 * The loop thread's; holds a reference to each. */
typedef struct dp_grammar_cache dp_grammar_cache;
dp_grammar_cache *grammar_cache_new(void);
void grammar_cache_free(dp_grammar_cache *c);

typedef struct dp_oai_ctx {
    const dp_tokenizer *tok;
    const dp_chat_template *tmpl;
    const char *model_name;    /* the id /v1/models lists */
    const char *model_alias;   /* also accepted (e.g. the file name); may be NULL */
    int32_t context_length;
    /* max_tokens of a request that gives none, capped by the context; 0: the
     * rest of the context for chat (as OpenAI and vLLM), 16 for completions
     * (OpenAI's legacy default). */
    int32_t default_max_tokens;
    /* A chat's leading system messages are kept whole on the decode path
     * (the keep_system_prompt setting; dualpath.keep_system per request). */
    bool keep_system;
    dp_grammar_cache *grammars; /* may be NULL: each request compiles its own */
} dp_oai_ctx;

typedef struct dp_oai_prompt {
    int32_t *ids;       /* owned */
    int32_t n_ids;
    char *text;         /* owned: the prompt as text (for echo) */
    int32_t max_tokens; /* resolved per prompt when the request gives none */
} dp_oai_prompt;

typedef struct dp_oai_req {
    dp_oai_kind kind;
    dp_oai_prompt *prompts;     /* owned */
    int n_prompts;
    int n;                      /* choices per prompt */
    bool stream;
    bool include_usage;
    bool echo;
    bool has_seed;
    int32_t prompt_lp;          /* vLLM prompt_logprobs: -1 off, else top k */
    dp_request_params params;   /* template for every choice (owned parts) */
    int32_t system_tokens;      /* chat: the prompt's first tokens, its system messages */
    int8_t keep_system;         /* dualpath.keep_system: -1 unset, 0, 1 */
    int32_t keep_prefix;        /* dualpath.keep_prefix: -1 unset, else tokens */
    dp_tools tools;             /* chat: tool calling (mode OFF: none) */
    /* Top-level members this server does not know (for the log; the first
     * DP_OAI_MAX_UNKNOWN, printable names only). */
    char unknown[DP_OAI_MAX_UNKNOWN][48];
    int n_unknown;
} dp_oai_req;

/* Parses and validates a request body; on failure fills e (status 400 or 404)
 * and returns -1, leaving nothing allocated in out. */
int oai_parse(const dp_oai_ctx *c, dp_oai_kind kind, const char *body, size_t len,
              dp_oai_req *out, dp_api_err *e);
void oai_req_free(dp_oai_req *r);
/* Deep copy (stops, logit_bias); 0 or DP_ENOMEM. */
int oai_params_clone(dp_request_params *dst, const dp_request_params *src);

/* One choice's output as it accumulates. */
typedef struct dp_oai_choice {
    char *text;
    size_t len, cap;
    cJSON *logprobs;     /* non-stream accumulation; NULL when logprobs are off */
    cJSON *echo_lp;      /* streamed echo with logprobs: the prompt's entries, sent with
                          * its text before the first token; NULL otherwise */
    cJSON *prompt_lp;    /* vLLM prompt_logprobs: [null, {id: {...}}, ...]; NULL when off */
    size_t prompt_offset; /* echo with logprobs: text offset of the next prompt token */
    size_t text_offset;  /* completions: offset of the next token in the text */
    dp_finish finish;
    int32_t completion_tokens;
    dp_kv_usage usage;   /* usage.dualpath of this choice (its finish event's) */
    bool done;
} dp_oai_choice;


int oai_choice_append(dp_oai_choice *ch, const char *s, size_t n);
void oai_choice_free(dp_oai_choice *ch);
/* An empty logprobs container of the kind's shape. */
cJSON *oai_logprobs_new(dp_oai_kind kind);
/* Whether a generated token has a logprobs entry: every one in a
 * completion (the end-of-generation token too, with empty text, as vLLM
 * gives it), all but end-of-generation in a chat. */
bool oai_logprobs_takes(dp_oai_kind kind, const dp_tokenizer *tok, int32_t token);
/* Adds one TOKEN event's entry where oai_logprobs_takes says so. */
void oai_logprobs_add(cJSON *lp, dp_oai_kind kind, const dp_tokenizer *tok, const dp_event *ev,
                      size_t *text_offset);
/* Completions with echo and logprobs: one prompt token's entry (ev NULL for
 * the first: null logprob and top, as OpenAI gives them), top k at most. */
void oai_logprobs_add_prompt(cJSON *lp, const dp_tokenizer *tok, int32_t token, const dp_event *ev,
                             int k, size_t *text_offset);
/* vLLM prompt_logprobs: one PROMPT_TOKEN event's entry, top k at most. */
cJSON *oai_prompt_logprob_entry(const dp_tokenizer *tok, const dp_event *ev, int k);
const char *oai_finish_name(dp_finish f);

/* A finished chat choice of a request with tools, reshaped: its calls
 * (OpenAI tool_call objects; *content NULL) or its text (*calls NULL), and
 * the finish reason that goes with it. 0 or DP_ENOMEM. */
int oai_tool_shape(const dp_oai_req *r, const dp_oai_choice *ch, const char *id, int index,
                   cJSON **calls, char **content, const char **finish);
/* One SSE chunk whose delta holds tool calls (consumed; each gains its
 * "index") or, with calls NULL, content text. malloc'd. */
char *oai_tool_chunk(const char *id, long long created, const char *model, int index,
                     cJSON *calls, const char *content, size_t *len);
/* Non-stream body: every choice, in order, and usage. malloc'd. */
char *oai_response(const dp_oai_req *r, const char *id, long long created, const char *model,
                   dp_oai_choice *choices, int n_choices, size_t *len);

/* One SSE event "data: {...}\n\n" for one choice. role (chat: the first chunk)
 * and finish may be NULL; lp is consumed (may be NULL). malloc'd. */
char *oai_chunk(dp_oai_kind kind, const char *id, long long created, const char *model, int index,
                const char *role, const char *text, cJSON *lp, const char *finish, size_t *len);
/* The usage chunk (empty choices) sent before [DONE] when include_usage; dp
 * (may be NULL) becomes usage.dualpath. */
char *oai_usage_chunk(dp_oai_kind kind, const char *id, long long created, const char *model,
                      long long prompt_tokens, long long completion_tokens,
                      const dp_kv_usage *dp, size_t *len);

/* True when n bytes are valid UTF-8. */
bool oai_utf8_valid(const char *s, size_t n);
/* One JSON value and nothing but whitespace after it; NULL with the byte
 * offset of the error otherwise. */
cJSON *oai_json_parse(const char *body, size_t len, size_t *err_at);
/* True when a JSON text has a \u0000 escape (which cJSON would cut at). */
bool oai_json_has_nul(const char *body, size_t len);

#endif
