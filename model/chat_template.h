/* chat_template.h: turns a list of chat messages into the prompt text a model
 * was trained on, by rendering the model's own Jinja chat template (jinja.h). */
#ifndef DP_MODEL_CHAT_TEMPLATE_H
#define DP_MODEL_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdbool.h>
#include <time.h>

#include "gguf.h"
#include "jinja.h"
#include "tokenizer.h"

/* The family a template was recognised as: a name for the logs only, the
 * rendering is always the template's own. */
typedef enum dp_chat_format {
    DP_CHAT_CHATML = 0,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
    DP_CHAT_LLAMA3 = 1,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    DP_CHAT_LLAMA2 = 2,  /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    DP_CHAT_OTHER = 3,   /* any other template */
} dp_chat_format;

typedef struct dp_chat_msg {
    const char *role;     /* "system" | "user" | "assistant" | "tool" (a tool's result) */
    const char *content;
} dp_chat_msg;

typedef struct dp_chat_template {
    dp_chat_format format;
    /* System message a ChatML template inserts when the conversation has
     * none (SmolLM2's "You are a helpful AI assistant named SmolLM..."), for
     * callers that add to it; NULL if none. Owned (malloc'd). */
    char *default_system;
    char *bos_text;  /* the tokenizer's BOS and EOS texts (bos_token, eos_token); "" if none */
    char *eos_text;
    char *src;       /* the template's text (what /tokenizer_info shows), NUL-terminated */
    jinja_tmpl *tmpl;
    time_t now;      /* strftime_now's time; 0: the clock */
    bool keep_bos;   /* leave a leading bos_text in the rendering: the tokenizer adds no BOS */
} dp_chat_template;

/* Compiles the template (NULL or empty: a plain ChatML one, logged). bos
 * and eos are the tokenizer's special token texts (NULL: ""). A template
 * the engine cannot parse is DP_EINVAL / DP_EUNSUPPORTED with err naming
 * the construct and its line. */
int chat_template_init(dp_chat_template *ct, const char *src, size_t len, const char *bos,
                       const char *eos, char *err, size_t errsz);
/* The same for a model: src (NULL: the GGUF's tokenizer.chat_template) with
 * the tokenizer's BOS and EOS texts; keep_bos where it adds no BOS. */
int chat_template_init_model(dp_chat_template *ct, const char *src, size_t len, const dp_gguf *g,
                             const dp_tokenizer *tok, char *err, size_t errsz);
void chat_template_destroy(dp_chat_template *ct);

/* How a rendering ends (false and true keep their old meaning). */
typedef enum dp_chat_end {
    DP_CHAT_END_NONE = 0,      /* add_generation_prompt=false */
    DP_CHAT_END_GENERATE = 1,  /* add_generation_prompt=true: the model answers */
    DP_CHAT_END_CONTINUE = 2,  /* the last message (the assistant's) is left open: the
                                * model continues it (assistant prefill) */
} dp_chat_end;

/* Renders messages. *out is malloc'd, NUL-terminated; a leading bos_text is
 * removed unless keep_bos (the tokenizer adds BOS; later ones stay, as
 * text). Returns 0 or
 * DP_EINVAL (with a message in err) for an unknown role, no messages,
 * DP_CHAT_END_CONTINUE after a message that is not the assistant's, or an
 * error the template raises (err: its message). */
int chat_template_apply(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                        dp_chat_end end, char **out, char *err, size_t errsz);
/* The same with chat_template_kwargs (a dict merged into the context, e.g.
 * enable_thinking; NULL: none). */
int chat_template_apply_kw(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                           dp_chat_end end, const jv *kwargs, char **out, char *err, size_t errsz);
/* The general form: messages is a list of dicts (role, content, and any
 * other field the template reads); tools, if not NULL, is the context's
 * `tools`, else it is left undefined. */
int chat_template_render(const dp_chat_template *ct, const jv *messages, dp_chat_end end,
                         const jv *kwargs, const jv *tools, char **out, char *err, size_t errsz);

const char *chat_format_name(dp_chat_format f);

#endif
