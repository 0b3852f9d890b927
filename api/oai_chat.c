/* oai_chat.c: a chat request's messages (and tools) become its prompt:
 * content parts to text, the request's own template and kwargs, the tools'
 * system text, then the model's chat template rendered and tokenized. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "oai_private.h"
#include "jv_json.h"

/* Text of a message's content: a string or a list of text parts. */
static int content_text(const cJSON *m, int idx, char **out, dp_api_err *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    cJSON *ct = oai_field(m, "content");
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
        cJSON *t = cJSON_IsObject(it) ? oai_field(it, "type") : NULL;
        cJSON *tx = cJSON_IsObject(it) ? oai_field(it, "text") : NULL;
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
        const char *tx = oai_field(it, "text")->valuestring;
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
 * any other) and the text the system prompt gains (oai_parse_messages). */
int oai_parse_tools(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
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
    int rc = oai_grammar_get(c->grammars, r->tools.gbnf, &r->params.grammar, err, sizeof err);
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
    const cJSON *kw = oai_field(root, "chat_template_kwargs");
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
    const cJSON *ts = oai_field(root, "chat_template");
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

int oai_parse_messages(const dp_oai_ctx *c, const cJSON *root, dp_oai_req *r, dp_api_err *e)
{
    dp_chat_template own = {0};
    const dp_chat_template *tmpl = c->tmpl;
    jv *kwargs = NULL;
    cJSON *ms = oai_field(root, "messages");
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
        cJSON *role = oai_field(m, "role");
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
        if (!strcmp(rs, "function") || oai_field(m, "function_call")) {
            snprintf(param, sizeof param, "messages[%d].%s", i,
                     strcmp(rs, "function") ? "function_call" : "role");
            api_err_invalid(e, param, "'%s': the legacy function-calling API is not supported "
                            "(use 'tools')", param);
            goto out;
        }
        const cJSON *tc = oai_field(m, "tool_calls");
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
        const cJSON *ct = oai_field(m, "content");
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
    bool agp = true, agp_set = oai_field(root, "add_generation_prompt") != NULL, cfm = false;
    bool cfm_set = oai_field(root, "continue_final_message") != NULL;
    if (oai_get_bool(root, "add_generation_prompt", &agp, e) ||
        oai_get_bool(root, "continue_final_message", &cfm, e))
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
    rc = oai_prompt_from_text(c, &r->prompts[0], prompt, strlen(prompt), "messages", e);
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
