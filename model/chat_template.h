/* chat_template.h: turns a list of chat messages into the prompt text a model
 * was trained on. The format is recognised from tokenizer.chat_template; the
 * Jinja source itself is never executed. */
#ifndef DP_MODEL_CHAT_TEMPLATE_H
#define DP_MODEL_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdbool.h>

typedef enum dp_chat_format {
    DP_CHAT_CHATML = 0,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
    DP_CHAT_LLAMA3 = 1,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    DP_CHAT_LLAMA2 = 2,  /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
} dp_chat_format;

typedef struct dp_chat_msg {
    const char *role;     /* "system" | "user" | "assistant" | "tool" (a tool's result) */
    const char *content;
} dp_chat_msg;

typedef struct dp_chat_template {
    dp_chat_format format;
    /* System message the template inserts when the conversation has none
     * (SmolLM2's "You are a helpful AI assistant named SmolLM..."); NULL if
     * the template adds none. Owned (malloc'd). */
    char *default_system;
    char *bos_text;  /* text of BOS for formats that spell it, e.g. "<s>"; may be NULL */
} dp_chat_template;

/* Recognises the format from the template source (NULL or empty: ChatML).
 * An unrecognised template falls back to ChatML and logs a warning. */
int chat_template_init(dp_chat_template *ct, const char *src, size_t len);
void chat_template_destroy(dp_chat_template *ct);

/* How a rendering ends (false and true keep their old meaning). */
typedef enum dp_chat_end {
    DP_CHAT_END_NONE = 0,      /* after the last message, whole */
    DP_CHAT_END_GENERATE = 1,  /* the assistant header follows, so that the model answers */
    DP_CHAT_END_CONTINUE = 2,  /* the last message (the assistant's) is left open: the
                                * model continues it (assistant prefill) */
} dp_chat_end;

/* Renders messages. *out is malloc'd, NUL-terminated. Returns 0 or
 * DP_EINVAL (with a message in err) for an unknown role, no messages, or
 * DP_CHAT_END_CONTINUE after a message that is not the assistant's. */
int chat_template_apply(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                        dp_chat_end end, char **out, char *err, size_t errsz);

const char *chat_format_name(dp_chat_format f);

#endif
