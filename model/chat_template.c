/* chat_template.c: recognises ChatML, Llama-3 and Llama-2 chat templates and
 * renders conversations exactly as their Jinja sources would. */
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "unicode.h"

/* The leading BOS a template spells (Llama-2/3's bos_token) is NOT rendered:
 * the tokenizer adds it (tokenizer_add_bos), as llama.cpp does, so it is never
 * doubled. A BOS later in the text (Llama-2, before each [INST] after the
 * first) is rendered as bos_text, which encoding with parse_special maps to
 * the BOS id: the token sequence is then exactly the template's. */

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

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* Python's str.isspace(), which Jinja's trim filter and .strip() use:
 * White_Space plus the information separators U+001C..U+001F. */
static bool py_space(uint32_t cp)
{
    return unicode_is_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

/* s with leading and trailing whitespace removed, as Python's strip(). */
static void sb_strip(sbuf *b, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), start = 0, end = 0, i = 0;
    bool seen = false;
    while (i < n) {
        uint32_t cp;
        size_t l = unicode_utf8_decode(u + i, n - i, &cp);
        if (DP_UNI_IS_INVALID(cp) || !py_space(cp)) {
            if (!seen) start = i;
            seen = true;
            end = i + l;
        }
        i += l;
    }
    if (seen) sb_add(b, s + start, end - start);
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

int chat_template_init(dp_chat_template *ct, const char *src, size_t len)
{
    memset(ct, 0, sizeof *ct);
    if (!src) len = 0;
    if (contains(src, len, "<|im_start|>")) {
        ct->format = DP_CHAT_CHATML;
        ct->default_system = chatml_default_system(src, len);
    } else if (contains(src, len, "<|start_header_id|>")) {
        ct->format = DP_CHAT_LLAMA3;
        ct->bos_text = strdup("<|begin_of_text|>");
        if (!ct->bos_text) return DP_ENOMEM;
    } else if (contains(src, len, "[INST]")) {
        ct->format = DP_CHAT_LLAMA2;
        ct->bos_text = strdup("<s>");
        if (!ct->bos_text) return DP_ENOMEM;
    } else {
        ct->format = DP_CHAT_CHATML;
        if (len > 0)
            dp_log(DP_LOG_WARN, "chat template not recognised (%zu bytes); falling back to ChatML", len);
    }
    return 0;
}

void chat_template_destroy(dp_chat_template *ct)
{
    if (!ct) return;
    free(ct->default_system);
    free(ct->bos_text);
    ct->default_system = NULL;
    ct->bos_text = NULL;
}

const char *chat_format_name(dp_chat_format f)
{
    switch (f) {
    case DP_CHAT_CHATML: return "chatml";
    case DP_CHAT_LLAMA3: return "llama3";
    case DP_CHAT_LLAMA2: return "llama2";
    }
    return "unknown";
}

static void render_chatml(const dp_chat_template *ct, const dp_chat_msg *m, size_t n,
                          dp_chat_end end, sbuf *b)
{
    if (ct->default_system && strcmp(m[0].role, "system") != 0) {
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, ct->default_system);
        sb_str(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|im_start|>");
        sb_str(b, m[i].role);
        sb_str(b, "\n");
        sb_str(b, m[i].content);
        if (i + 1 < n || end != DP_CHAT_END_CONTINUE)
            sb_str(b, "<|im_end|>\n");
    }
    if (end == DP_CHAT_END_GENERATE) sb_str(b, "<|im_start|>assistant\n");
}

/* Meta's Llama-3 Instruct template: header, trimmed content, <|eot_id|>. */
static void render_llama3(const dp_chat_msg *m, size_t n, dp_chat_end end, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|start_header_id|>");
        /* Llama 3.1 names a tool's result "ipython". */
        sb_str(b, strcmp(m[i].role, "tool") ? m[i].role : "ipython");
        sb_str(b, "<|end_header_id|>\n\n");
        sb_strip(b, m[i].content);
        if (i + 1 < n || end != DP_CHAT_END_CONTINUE)
            sb_str(b, "<|eot_id|>");
    }
    if (end == DP_CHAT_END_GENERATE) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Meta's Llama-2 chat template: an optional leading system message folds into
 * the first user turn; user and assistant must alternate, user first; the
 * prompt ends with [/INST], so there is no separate generation prompt. */
static int render_llama2(const dp_chat_template *ct, const dp_chat_msg *m, size_t n, dp_chat_end end,
                         sbuf *b, char *err, size_t errsz)
{
    const char *sys = NULL;
    size_t first = 0;
    if (strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        /* No tool role in Llama-2's format: a tool's result is a user turn. */
        bool user = strcmp(m[i].role, "user") == 0 || strcmp(m[i].role, "tool") == 0;
        if (user != ((i - first) % 2 == 0))
            return dp_err(err, errsz, DP_EINVAL,
                          "chat template: conversation roles must alternate user/assistant/user/...");
        if (user) {
            if (i > first) sb_str(b, ct->bos_text ? ct->bos_text : "<s>");
            sb_str(b, "[INST] ");
            if (i == first && sys) {
                sbuf c = {0};
                sb_str(&c, "<<SYS>>\n");
                sb_str(&c, sys);
                sb_str(&c, "\n<</SYS>>\n\n");
                sb_str(&c, m[i].content);
                if (c.oom) {
                    free(c.p);
                    b->oom = true;
                    break;
                }
                sb_strip(b, c.p);
                free(c.p);
            } else {
                sb_strip(b, m[i].content);
            }
            sb_str(b, " [/INST]");
        } else {
            sb_str(b, " ");
            sb_strip(b, m[i].content);
            if (i + 1 < n || end != DP_CHAT_END_CONTINUE)
                sb_str(b, " </s>");
        }
    }
    return 0;
}

int chat_template_apply(const dp_chat_template *ct, const dp_chat_msg *msgs, size_t n,
                        dp_chat_end end, char **out, char *err, size_t errsz)
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
    sbuf b = {0};
    sb_add(&b, "", 0);  /* an empty rendering is still a string */
    int rc = 0;
    switch (ct->format) {
    case DP_CHAT_LLAMA3: render_llama3(msgs, n, end, &b); break;
    case DP_CHAT_LLAMA2: rc = render_llama2(ct, msgs, n, end, &b, err, errsz); break;
    default: render_chatml(ct, msgs, n, end, &b); break;
    }
    if (rc == 0 && b.oom) rc = dp_err(err, errsz, DP_ENOMEM, "chat template: out of memory");
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}
