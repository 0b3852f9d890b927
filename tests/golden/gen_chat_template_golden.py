#!/usr/bin/env python3
# gen_chat_template_golden.py: renders the conversations of test_chat_template.c
# with jinja2 from the real templates, printing the C string literals it checks.
"""Golden renderings for tests/unit/test_chat_template.c.

Templates: SmolLM2's (read from the GGUF), a plain ChatML one, and Meta's
published Llama-3 Instruct and Llama-2 chat templates. The C renderer leaves
the leading BOS to the tokenizer, so the template's leading bos_token is
removed from the jinja2 output here (later ones stay, spelled as text).

Usage: ~/.cache/dualpath/venv/bin/python tests/golden/gen_chat_template_golden.py
Needs: jinja2, gguf.
"""
import sys

import jinja2
from gguf import GGUFReader

from gen_jinja_golden import c_lit

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
PLAIN_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                "{% endif %}")

CONVS = {
    "A": ([("user", "Hello!")], True),
    "B": ([("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello."),
           ("user", "  What is 2+2?\n")], True),
    "C": ([("user", "a"), ("assistant", " b \t")], False),
    "D": ([("system", " S "), ("user", " u1 "), ("assistant", "a1"), ("user", "u2\u3000")], False),
}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    r = GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    smol = bytes(f.parts[f.data[0]]).decode()
    env = jinja2.Environment()

    def raise_exception(msg):
        raise jinja2.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    for name, src, bos, eos in (("smollm2", smol, "<|endoftext|>", "<|im_end|>"),
                                ("chatml", PLAIN_CHATML, "", ""),
                                ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
                                ("llama2", LLAMA2, "<s>", "</s>")):
        t = env.from_string(src)
        for key, (msgs, gen) in CONVS.items():
            try:
                s = t.render(messages=[{"role": r_, "content": c} for r_, c in msgs],
                             add_generation_prompt=gen, bos_token=bos, eos_token=eos)
            except jinja2.TemplateError as e:
                print("/* %s %s: error %s */" % (name, key, e))
                continue
            if bos and s.startswith(bos):
                s = s[len(bos):]
            print("/* %s %s */ %s," % (name, key, c_lit(s)))


if __name__ == "__main__":
    main()
