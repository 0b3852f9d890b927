/* test_chat_template.c: templates compiled and rendered through model/jinja.c,
 * compared with what jinja2 renders from the real templates; BOS, continue. */
#include "t.h"

#include "common/dp.h"
#include "model/chat_template.h"

/* SmolLM2-135M-Instruct's tokenizer.chat_template, verbatim. */
static const char smollm2_src[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
/* ChatML without a default system message. */
static const char chatml_src[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
/* Meta's published Llama-3 Instruct and Llama-2 chat templates. */
static const char llama3_src[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
static const char llama2_src[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* The conversations of tests/golden/gen_chat_template_golden.py. */
static const dp_chat_msg conv_a[] = {{"user", "Hello!"}};
static const dp_chat_msg conv_b[] = {{"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."},
                                     {"user", "  What is 2+2?\n"}};
static const dp_chat_msg conv_c[] = {{"user", "a"}, {"assistant", " b \t"}};
static const dp_chat_msg conv_d[] = {{"system", " S "}, {"user", " u1 "}, {"assistant", "a1"},
                                     {"user", "u2\xE3\x80\x80"}};
static const struct {
    const dp_chat_msg *m;
    size_t n;
    bool gen;
} convs[4] = {{conv_a, 1, true}, {conv_b, 4, true}, {conv_c, 2, false}, {conv_d, 4, false}};

/* Rendered by jinja2 from the templates above (the leading bos_token, which
 * the tokenizer adds, removed). */
static const char *const want_smollm2[4] = {
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n  What is 2+2?\n<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n b \t<|im_end|>\n",
    /* Two literals: the hex escape would otherwise take the '<' after it. */
    ("<|im_start|>system\n S <|im_end|>\n<|im_start|>user\n u1 <|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nu2\xE3\x80\x80" "<|im_end|>\n"),
};
static const char *const want_chatml[4] = {
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n  What is 2+2?\n<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n b \t<|im_end|>\n",
    /* Two literals: the hex escape would otherwise take the '<' after it. */
    ("<|im_start|>system\n S <|im_end|>\n<|im_start|>user\n u1 <|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nu2\xE3\x80\x80" "<|im_end|>\n"),
};
static const char *const want_llama3[4] = {
    "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nb<|eot_id|>",
    "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\na1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nu2<|eot_id|>",
};
static const char *const want_llama2[4] = {
    "[INST] Hello! [/INST]",
    "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]",
    "[INST] a [/INST] b </s>",
    "[INST] <<SYS>>\n S \n<</SYS>>\n\n u1 [/INST] a1 </s><s>[INST] u2 [/INST]",
};

static void check_renders(const char *src, const char *bos, const char *eos, dp_chat_format fmt,
                          const char *const want[4])
{
    dp_chat_template ct;
    char err[DP_ERRLEN] = "";
    CHECK_MSG(chat_template_init(&ct, src, strlen(src), bos, eos, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(ct.format, fmt);
    for (int i = 0; i < 4; i++) {
        char *out = NULL;
        int rc = chat_template_apply(&ct, convs[i].m, convs[i].n, convs[i].gen, &out, err, sizeof err);
        CHECK_MSG(rc == 0, "%s conv %d: %s", chat_format_name(fmt), i, err);
        CHECK_MSG(strcmp(out, want[i]) == 0, "%s conv %d:\n got: %s\nwant: %s", chat_format_name(fmt), i, out,
                  want[i]);
        free(out);
    }
    chat_template_destroy(&ct);
}

static char *render(const dp_chat_template *ct, const dp_chat_msg *m, size_t n, dp_chat_end end)
{
    char *out = NULL, err[DP_ERRLEN] = "";
    int rc = chat_template_apply(ct, m, n, end, &out, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    return out;
}

int main(void)
{
    dp_log_set_level(DP_LOG_ERROR);  /* the info line of the ChatML default is expected below */

    dp_chat_template ct;
    char *out = NULL, err[DP_ERRLEN];
    CHECK(chat_template_init(&ct, smollm2_src, strlen(smollm2_src), "<|endoftext|>", "<|im_end|>", err,
                             sizeof err) == 0);
    CHECK(ct.format == DP_CHAT_CHATML && strcmp(ct.bos_text, "<|endoftext|>") == 0 &&
          strcmp(ct.eos_text, "<|im_end|>") == 0);
    CHECK(ct.default_system != NULL &&
          strcmp(ct.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face") == 0);
    chat_template_destroy(&ct);
    chat_template_destroy(&ct);  /* idempotent */

    check_renders(smollm2_src, "<|endoftext|>", "<|im_end|>", DP_CHAT_CHATML, want_smollm2);
    check_renders(chatml_src, "", "", DP_CHAT_CHATML, want_chatml);
    check_renders(llama3_src, "<|begin_of_text|>", "<|eot_id|>", DP_CHAT_LLAMA3, want_llama3);
    check_renders(llama2_src, "<s>", "</s>", DP_CHAT_LLAMA2, want_llama2);

    CHECK(chat_template_init(&ct, llama3_src, strlen(llama3_src), "<|begin_of_text|>", "<|eot_id|>", err,
                             sizeof err) == 0);
    CHECK(ct.default_system == NULL);
    /* The leading BOS goes (the tokenizer adds it), unless kept. */
    out = render(&ct, conv_a, 1, DP_CHAT_END_GENERATE);
    CHECK(strncmp(out, "<|start_header_id|>", 19) == 0);
    free(out);
    ct.keep_bos = true;
    out = render(&ct, conv_a, 1, DP_CHAT_END_GENERATE);
    CHECK(strncmp(out, "<|begin_of_text|><|start_header_id|>", 36) == 0);
    free(out);
    ct.keep_bos = false;
    /* Continuing the assistant: cut after its (trimmed) text. */
    out = render(&ct, conv_c, 2, DP_CHAT_END_CONTINUE);
    CHECK_MSG(strcmp(out, "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|><|start_header_id|>assistant"
                          "<|end_header_id|>\n\nb") == 0, "%s", out);
    free(out);
    chat_template_destroy(&ct);

    CHECK(chat_template_init(&ct, llama2_src, strlen(llama2_src), "<s>", "</s>", err, sizeof err) == 0);
    CHECK(ct.bos_text && strcmp(ct.bos_text, "<s>") == 0);
    /* Llama-2 insists on user/assistant alternation: the template's own message. */
    static const dp_chat_msg uu[] = {{"user", "a"}, {"user", "b"}};
    CHECK(chat_template_apply(&ct, uu, 2, true, &out, err, sizeof err) == DP_EINVAL && out == NULL);
    CHECK(strcmp(err, "Conversation roles must alternate user/assistant/user/assistant/...") == 0);
    static const dp_chat_msg au[] = {{"assistant", "a"}};
    CHECK(chat_template_apply(&ct, au, 1, true, &out, err, sizeof err) == DP_EINVAL);
    out = render(&ct, conv_c, 2, DP_CHAT_END_CONTINUE);
    CHECK_MSG(strcmp(out, "[INST] a [/INST] b") == 0, "%s", out);
    free(out);
    chat_template_destroy(&ct);

    /* A default system prompt in an escaped literal is found as well. */
    static const char esc_src[] = "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe "
                                  "\\'nice\\'.<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' }}";
    CHECK(chat_template_init(&ct, esc_src, strlen(esc_src), NULL, NULL, err, sizeof err) == 0);
    CHECK(ct.default_system && strcmp(ct.default_system, "Be 'nice'.") == 0);
    chat_template_destroy(&ct);
    /* A system header followed by the caller's content is no default. */
    static const char var_src[] = "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>' }}";
    CHECK(chat_template_init(&ct, var_src, strlen(var_src), NULL, NULL, err, sizeof err) == 0);
    CHECK(ct.default_system == NULL);
    chat_template_destroy(&ct);

    /* Any other template renders as written: no more ChatML fallback. */
    static const char odd_src[] = "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}";
    CHECK(chat_template_init(&ct, odd_src, strlen(odd_src), NULL, NULL, err, sizeof err) == 0);
    CHECK(ct.format == DP_CHAT_OTHER);
    out = render(&ct, conv_a, 1, DP_CHAT_END_GENERATE);
    CHECK(strcmp(out, "user: Hello!") == 0);
    free(out);
    chat_template_destroy(&ct);
    /* No template: ChatML, no default system message. */
    const char *fallbacks[2] = {"", NULL};
    for (int i = 0; i < 2; i++) {
        const char *s = fallbacks[i];
        CHECK(chat_template_init(&ct, s, s ? strlen(s) : 0, "<s>", "</s>", err, sizeof err) == 0);
        CHECK(ct.format == DP_CHAT_CHATML && ct.default_system == NULL);
        out = render(&ct, conv_a, 1, DP_CHAT_END_GENERATE);
        CHECK(strcmp(out, want_chatml[0]) == 0);
        free(out);
        chat_template_destroy(&ct);
    }
    /* A template the engine cannot run is refused at start-up, named. */
    static const char bad_src[] = "{% for m in messages %}\n{{ m.content | wordwrap(10) }}{% endfor %}";
    CHECK(chat_template_init(&ct, bad_src, strlen(bad_src), NULL, NULL, err, sizeof err) == DP_EUNSUPPORTED);
    CHECK_MSG(strcmp(err, "jinja: line 2: unknown filter 'wordwrap'") == 0, "%s", err);
    CHECK(ct.tmpl == NULL && ct.bos_text == NULL);
    chat_template_destroy(&ct);

    /* chat_template_kwargs reach the template. */
    static const char kw_src[] = "{{ 'think' if enable_thinking is not defined or enable_thinking else 'quiet' }}";
    CHECK(chat_template_init(&ct, kw_src, strlen(kw_src), NULL, NULL, err, sizeof err) == 0);
    out = render(&ct, conv_a, 1, DP_CHAT_END_GENERATE);
    CHECK(strcmp(out, "think") == 0);
    free(out);
    jv *kw = jv_dict();
    CHECK(jv_dict_set(kw, "enable_thinking", jv_bool(false)) == 0);
    CHECK(chat_template_apply_kw(&ct, conv_a, 1, DP_CHAT_END_GENERATE, kw, &out, err, sizeof err) == 0);
    CHECK(strcmp(out, "quiet") == 0);
    free(out);
    jv_unref(kw);
    chat_template_destroy(&ct);

    /* Errors: unknown roles, missing content, no messages. */
    CHECK(chat_template_init(&ct, smollm2_src, strlen(smollm2_src), "<|endoftext|>", "<|im_end|>", err,
                             sizeof err) == 0);
    static const dp_chat_msg bad_role[] = {{"user", "a"}, {"robot", "b"}};
    out = NULL;
    CHECK(chat_template_apply(&ct, bad_role, 2, true, &out, err, sizeof err) == DP_EINVAL && out == NULL);
    CHECK(strstr(err, "robot") != NULL);
    /* A tool's result: its own role in ChatML (the template writes any role). */
    static const dp_chat_msg with_tool[] = {{"user", "a"}, {"assistant", "{}"}, {"tool", "b"}};
    CHECK(chat_template_apply(&ct, with_tool, 3, true, &out, err, sizeof err) == 0);
    CHECK(strstr(out, "<|im_start|>tool\nb<|im_end|>\n<|im_start|>assistant\n") != NULL);
    free(out);
    static const dp_chat_msg null_role[] = {{NULL, "a"}};
    CHECK(chat_template_apply(&ct, null_role, 1, true, &out, err, sizeof err) == DP_EINVAL);
    static const dp_chat_msg null_content[] = {{"user", NULL}};
    CHECK(chat_template_apply(&ct, null_content, 1, true, &out, err, sizeof err) == DP_EINVAL);
    CHECK(chat_template_apply(&ct, conv_a, 0, true, &out, err, sizeof err) == DP_EINVAL);
    /* Without the generation prompt the assistant header is absent. */
    CHECK(chat_template_apply(&ct, conv_b, 4, false, &out, err, sizeof err) == 0);
    size_t l = strlen(out);
    CHECK(l > 11 && strcmp(out + l - 11, "<|im_end|>\n") == 0);
    free(out);
    /* Continue: the assistant's text whole, left open; an empty one is a new turn. */
    out = render(&ct, conv_c, 2, DP_CHAT_END_CONTINUE);
    CHECK_MSG(strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                          "Face<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n b \t") == 0,
              "%s", out);
    free(out);
    static const dp_chat_msg empty_asst[] = {{"user", "a"}, {"assistant", ""}};
    out = render(&ct, empty_asst, 2, DP_CHAT_END_CONTINUE);
    CHECK(l > 0 && strcmp(out + strlen(out) - 22, "<|im_start|>assistant\n") == 0);
    free(out);
    CHECK(chat_template_apply(&ct, conv_a, 1, DP_CHAT_END_CONTINUE, &out, err, sizeof err) == DP_EINVAL);
    chat_template_destroy(&ct);

    CHECK(strcmp(chat_format_name(DP_CHAT_CHATML), "chatml") == 0);
    CHECK(strcmp(chat_format_name(DP_CHAT_LLAMA3), "llama3") == 0);
    CHECK(strcmp(chat_format_name(DP_CHAT_LLAMA2), "llama2") == 0);
    T_DONE("chat_template");
}
