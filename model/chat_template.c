/* chat_template.c: compiles a model's Jinja chat template once and renders
 * conversations with it, as Hugging Face's apply_chat_template does. */
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* The leading BOS a template spells (Llama-2/3's bos_token) is removed from
 * the rendering: the tokenizer adds it (tokenizer_add_bos), as llama.cpp
 * does, so it is never doubled. A BOS later in the text (Llama-2, before
 * each [INST] after the first) stays as text, which encoding with
 * parse_special maps to the BOS id: the token sequence is then exactly the
 * template's. */

/* What a model without a template gets (SmolLM2's format without its
 * default system prompt). */
static const char chatml_src[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Gemma's turn format, for its files that carry no template (the GGUF of
 * Gemma 3 270M on PyPI has none): the template Gemma 3's instruction-tuned
 * models are published with, text parts only. */
static const char gemma_src[] =
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    "{%- set role = \"model\" -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\n'}}"
    "{%- endif -%}";

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static bool contains(const char *src, size_t len, const char *needle)
{
    return len > 0 && memmem(src, len, needle, strlen(needle)) != NULL;
}

/* The default system message of a ChatML template: a string literal that
 * spells "<|im_start|>system\n...<|im_end|>" whole (SmolLM2's "You are a
 * helpful AI assistant named SmolLM..." in its loop.first branch). A literal
 * that is cut by a quote or an expression is the caller's system message, not
 * a default. Jinja escapes in the literal (\n, \', \", \\) are undone. */
static char *chatml_default_system(const char *src, size_t len)
{
    static const char head[] = "<|im_start|>system";
    const char *end = src + len;
    const char *p = src;
    while ((p = memmem(p, (size_t)(end - p), head, sizeof head - 1)) != NULL) {
        p += sizeof head - 1;
        const char *q = p;
        if (q < end && *q == '\n') q++;
        else if (end - q >= 2 && q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        sbuf b = {0};
        bool ok = false;
        while (q < end) {
            if ((size_t)(end - q) >= 10 && memcmp(q, "<|im_end|>", 10) == 0) {
                ok = true;
                break;
            }
            char c = *q;
            if (c == '\'' || c == '"' || c == '{' || c == '}') break;
            if (c == '\\' && end - q >= 2) {
                char e = q[1];
                char r = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
                sb_add(&b, &r, 1);
                q += 2;
                continue;
            }
            sb_add(&b, q, 1);
            q++;
        }
        if (ok && !b.oom && b.n > 0) return b.p;
        free(b.p);
        if (b.oom) return NULL;
    }
    return NULL;
}

int chat_template_init(dp_chat_template *ct, const char *src, size_t len, const char *bos,
                       const char *eos, char *err, size_t errsz)
{
    memset(ct, 0, sizeof *ct);
    if (!src || len == 0) {
        dp_log(DP_LOG_INFO, "no chat template in the model or the configuration: using ChatML");
        src = chatml_src;
        len = sizeof chatml_src - 1;
    }
    if (contains(src, len, "<|im_start|>")) ct->format = DP_CHAT_CHATML;
    else if (contains(src, len, "<|start_header_id|>")) ct->format = DP_CHAT_LLAMA3;
    else if (contains(src, len, "[INST]")) ct->format = DP_CHAT_LLAMA2;
    else ct->format = DP_CHAT_OTHER;
    ct->bos_text = strdup(bos ? bos : "");
    ct->eos_text = strdup(eos ? eos : "");
    ct->src = malloc(len + 1);
    if (ct->src) {
        memcpy(ct->src, src, len);
        ct->src[len] = '\0';
    }
    if (!ct->bos_text || !ct->eos_text || !ct->src) {
        chat_template_destroy(ct);
        return dp_err(err, errsz, DP_ENOMEM, "chat template: out of memory");
    }
    int rc = jinja_parse(src, len, &ct->tmpl, err, errsz);
    if (rc) {
        chat_template_destroy(ct);
        return rc;
    }
    if (ct->format == DP_CHAT_CHATML) ct->default_system = chatml_default_system(src, len);
    return 0;
}

/* A special token's text ("" if the vocabulary has none). */
static void token_text(const dp_tokenizer *tok, int32_t id, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (id < 0) return;
    int n = tokenizer_token_bytes(tok, id, true, buf, cap - 1);
    buf[n > 0 && (size_t)n < cap ? n : 0] = '\0';
}

int chat_template_init_model(dp_chat_template *ct, const char *src, size_t len, const dp_gguf *g,
                             const dp_tokenizer *tok, char *err, size_t errsz)
{
    char bos[256], eos[256];
    token_text(tok, tokenizer_bos(tok), bos, sizeof bos);
    token_text(tok, tokenizer_eos(tok), eos, sizeof eos);
    if (!src) {
        dp_gguf_str s = {0};
        gguf_get_str(g, "tokenizer.chat_template", &s);
        src = s.ptr;
        len = s.len;
    }
    /* A file without a template whose vocabulary has Gemma's turn tokens
     * is a Gemma: ChatML would be text it never saw. */
    if ((!src || len == 0) && tokenizer_find(tok, "<start_of_turn>") >= 0 &&
        tokenizer_find(tok, "<end_of_turn>") >= 0) {
        dp_log(DP_LOG_INFO, "no chat template in the model or the configuration: using Gemma's "
               "(the vocabulary has <start_of_turn>)");
        src = gemma_src;
        len = sizeof gemma_src - 1;
    }
    int rc = chat_template_init(ct, src, len, bos, eos, err, errsz);
    /* Only a BOS the tokenizer adds is taken out of the text: SmolLM2's BOS
     * is <|im_start|>, which its renderings begin with, and it adds none. */
    if (!rc) ct->keep_bos = !tokenizer_add_bos(tok);
    return rc;
}

void chat_template_destroy(dp_chat_template *ct)
{
    if (!ct) return;
    free(ct->default_system);
    free(ct->bos_text);
    free(ct->eos_text);
    free(ct->src);
    jinja_free(ct->tmpl);
    ct->default_system = ct->bos_text = ct->eos_text = ct->src = NULL;
    ct->tmpl = NULL;
}

const char *chat_format_name(dp_chat_format f)
{
    switch (f) {
    case DP_CHAT_CHATML: return "chatml";
    case DP_CHAT_LLAMA3: return "llama3";
    case DP_CHAT_LLAMA2: return "llama2";
    case DP_CHAT_OTHER: return "other";
    }
    return "unknown";
}

static int render_once(const dp_chat_template *ct, const jv *messages, bool agp, const jv *kwargs,
                       const jv *tools, char **out, size_t *out_len, char *err, size_t errsz)
{
    jv *ctx = jv_dict();
    int rc = ctx ? 0 : DP_ENOMEM;
    /* The caller's kwargs first: the names below are the renderer's own. */
    if (!rc && kwargs) rc = jv_dict_merge(ctx, kwargs);
    if (!rc) rc = jv_dict_set(ctx, "messages", jv_ref((jv *)messages));
    if (!rc) rc = jv_dict_set(ctx, "add_generation_prompt", jv_bool(agp));
    if (!rc) rc = jv_dict_set(ctx, "bos_token", jv_str(ct->bos_text));
    if (!rc) rc = jv_dict_set(ctx, "eos_token", jv_str(ct->eos_text));
    if (!rc && tools) rc = jv_dict_set(ctx, "tools", jv_ref((jv *)tools));
    if (rc) {
        jv_unref(ctx);
        return dp_err(err, errsz, rc, "chat template: out of memory");
    }
    /* Room for what the conversation brings, and a fixed margin for what
     * the template adds. */
    size_t in = jv_string_bytes(ctx);
    /* A template from a request renders on the HTTP thread: 2 s bounds what
     * the count limits do not (renderings of real templates take
     * microseconds). */
    jinja_opts o = {.max_output = ((size_t)1 << 20) + 4 * in, .now = ct->now, .max_ms = 2000};
    rc = jinja_render_opts(ct->tmpl, ctx, &o, out, out_len, err, errsz);
    jv_unref(ctx);
    return rc;
}

int chat_template_render(const dp_chat_template *ct, const jv *messages, dp_chat_end end,
                         const jv *kwargs, const jv *tools, char **out, char *err, size_t errsz)
{
    *out = NULL;
    if (!ct || !ct->tmpl) return dp_err(err, errsz, DP_EINVAL, "chat template: not initialised");
    if (jv_kind_of(messages) != JV_LIST) return dp_err(err, errsz, DP_EINVAL, "chat template: messages must be a list");
    if (kwargs && jv_kind_of(kwargs) != JV_DICT)
        return dp_err(err, errsz, DP_EINVAL, "chat template: chat_template_kwargs must be an object");
    size_t n = jv_len(messages), len = 0;
    char *text = NULL;
    int rc;
    if (end != DP_CHAT_END_CONTINUE) {
        rc = render_once(ct, messages, end == DP_CHAT_END_GENERATE, kwargs, tools, &text, &len, err, errsz);
    } else {
        /* Continue the final message: render it closed, then cut right after
         * its text, as transformers' continue_final_message does. */
        const jv *last = n ? jv_dict_get(jv_list_get(messages, n - 1), "content") : NULL;
        size_t cl = 0;
        const char *c = jv_string(last, &cl);
        if (!c) return dp_err(err, errsz, DP_EINVAL, "chat template: the final message has no text to continue");
        size_t s0 = 0, s1 = cl;
        while (s0 < cl && c[s0] && strchr(" \t\n\r\v\f", c[s0])) s0++;
        while (s1 > s0 && c[s1 - 1] && strchr(" \t\n\r\v\f", c[s1 - 1])) s1--;
        if (s1 == s0) {
            /* Nothing to find: an empty prefill is a new assistant turn. */
            jv *head = jv_list();
            rc = head ? 0 : DP_ENOMEM;
            for (size_t i = 0; !rc && i + 1 < n; i++) rc = jv_list_push(head, jv_ref(jv_list_get(messages, i)));
            if (rc) {
                jv_unref(head);
                return dp_err(err, errsz, rc, "chat template: out of memory");
            }
            rc = render_once(ct, head, true, kwargs, tools, &text, &len, err, errsz);
            jv_unref(head);
        } else {
            rc = render_once(ct, messages, false, kwargs, tools, &text, &len, err, errsz);
            if (!rc) {
                /* The whole text where the template keeps it as is; its
                 * stripped form where the template trims it. */
                const char *at = NULL;
                for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), c, cl)); p++) at = p;
                size_t keep = 0;
                if (at) {
                    keep = (size_t)(at - text) + cl;
                } else {
                    for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), c + s0, s1 - s0)); p++) at = p;
                    if (at) keep = (size_t)(at - text) + (s1 - s0);
                }
                if (!at) {
                    free(text);
                    return dp_err(err, errsz, DP_EINVAL, "chat template: the final message does not appear "
                                  "in the rendering, so it cannot be continued");
                }
                text[keep] = '\0';
                len = keep;
            }
        }
    }
    if (rc) return rc;
    size_t bl = strlen(ct->bos_text);
    if (!ct->keep_bos && bl && len >= bl && memcmp(text, ct->bos_text, bl) == 0) memmove(text, text + bl, len - bl + 1);
    *out = text;
    return 0;
}

int chat_template_apply_kw(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                           dp_chat_end end, const jv *kwargs, char **out, char *err, size_t errsz)
{
    *out = NULL;
    if (n == 0 || !msgs) return dp_err(err, errsz, DP_EINVAL, "chat template: no messages");
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 &&
                   strcmp(r, "assistant") != 0 && strcmp(r, "tool") != 0))
            return dp_err(err, errsz, DP_EINVAL, "chat template: unknown role '%.32s' in message %zu",
                          r ? r : "(null)", i);
        if (!msgs[i].content)
            return dp_err(err, errsz, DP_EINVAL, "chat template: message %zu has no content", i);
    }
    if (end == DP_CHAT_END_CONTINUE && strcmp(msgs[n - 1].role, "assistant") != 0)
        return dp_err(err, errsz, DP_EINVAL, "chat template: only an assistant message can be "
                      "continued (the last message is the %s's)", msgs[n - 1].role);
    jv *list = jv_list();
    int rc = list ? 0 : DP_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        jv *m = jv_dict();
        rc = m ? 0 : DP_ENOMEM;
        if (!rc) rc = jv_dict_set(m, "role", jv_str(msgs[i].role));
        if (!rc) rc = jv_dict_set(m, "content", jv_str(msgs[i].content));
        if (rc) jv_unref(m);
        else rc = jv_list_push(list, m);
    }
    if (rc) {
        jv_unref(list);
        return dp_err(err, errsz, DP_ENOMEM, "chat template: out of memory");
    }
    rc = chat_template_render(ct, list, end, kwargs, NULL, out, err, errsz);
    jv_unref(list);
    return rc;
}

int chat_template_apply(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                        dp_chat_end end, char **out, char *err, size_t errsz)
{
    return chat_template_apply_kw(ct, msgs, n, end, NULL, out, err, errsz);
}
