#!/usr/bin/env python3
# gen_jinja_golden.py: renders the small templates of test_jinja.c with jinja2
# as transformers configures it, printing the C table the test checks.
"""Golden renderings for tests/unit/test_jinja.c.

Every case is rendered with the same context (CTX, which test_jinja.c builds
alike) by ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with loopcontrols, transformers' tojson, raise_exception and strftime_now.

Usage: ~/.cache/dualpath/venv/bin/python tests/golden/gen_jinja_golden.py > /tmp/cases.h
Needs: jinja2.
"""
import os
import sys

import jinja2

# The environment the golden test of real templates renders with
# (transformers' settings, the same fixed strftime_now time).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
from test_templates import make_env  # noqa: E402

CTX = {
    "messages": [{"role": "system", "content": " Be brief. "},
                 {"role": "user", "content": "Hi <there> & 'you'"},
                 {"role": "assistant", "content": "Hello\nworld"},
                 {"role": "user", "content": "x\u00e9\u4e16"}],
    "n": 7, "f": 2.5, "s": "  Hello World  ", "t": True, "nothing": None, "lst": [3, 1, 2],
    "d": {"b": 1, "a": [1, 2], "c": {"x": "y"}},
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
    "words": "a b  c",
}

CASES = [
    # output, literals, arithmetic
    "{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.5 }}{{ true }}{{ True }}{{ none }}{{ None }}{{ undefined_var }}|",
    "{{ 'esc\\n\\t\\\\ \\' \\x41\\u00e9 \\U0001F680' }}",
    "{{ 1 + 2 }} {{ 7 - 10 }} {{ 2 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}",
    "{{ 1 + 1.5 }} {{ 10 / 5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3.0 * 2 }} {{ -f }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ 'x' + 'y' }}",
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 2 < 3 }} {{ 'a' < 'b' }} {{ 3 >= 3 }} {{ 1 <= 0 }} {{ true == 1 }}",
    "{{ 'a' in 'cat' }} {{ 2 in lst }} {{ 'a' in d }} {{ 'z' not in d }} {{ 5 in lst }}",
    "{{ t and n }} {{ nothing or 'dflt' }} {{ not t }} {{ not nothing and 1 }} {{ 0 or '' }}|",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if nothing else 'no' }} [{{ 'only' if nothing }}]",
    "{{ [1, 'a', none, true, 1.5] }} {{ d }} {{ ('a',) }} {{ (1, 2) }} {{ \"it's\" }} {{ ['it\\'s', 'q\"'] }}",
    # attribute / item access, slicing
    "{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} {{ d.c.x }} {{ d['a'][1] }} [{{ d.zz }}] [{{ messages[10] }}]",
    "{{ lst[::-1] }} {{ lst[1:] }} {{ lst[:-1] }} {{ lst[::2] }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'h\u00e9llo'[1] }} {{ lst[5:] }}",
    "{% for m in messages[::-1] %}{{ m.role }},{% endfor %}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}{% if nothing %}x{% elif 0 %}y{% endif %}",
    "{% for x in lst %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}{{ '^' if loop.first }}{{ '$' if loop.last }} {% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %} {% for c in 'ab\u00e9' %}[{{ c }}]{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in lst if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set x = 1 %}{% for i in lst %}{% set x = x + i %}{{ x }}{% endfor %} {{ x }}",
    "{% set ns = namespace(total=0, seen=false) %}{% for i in lst %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }} {{ ns.seen }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set block %}in {{ n }} block{% endset %}[{{ block }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}",
    "a{# comment #}b{#- trimmed -#}  c {% raw %}{{ not rendered }}{% endraw %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    # whitespace control, trim_blocks, lstrip_blocks
    "  {% if t %}\n    yes\n  {% endif %}\nend",
    "a  {%- if t -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e",
    "line1\n    {% for x in lst %}\n    {{ x }}\n    {% endfor %}\nline2\n",
    "x {%+ if t %}y{% endif +%}\nz",
    "  {{ n }}\n  {# c #}\n  q",
    # tests
    "{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ nothing is none }} {{ s is string }} {{ n is number }} {{ f is number }} {{ n is integer }} {{ f is integer }}",
    "{{ d is mapping }} {{ lst is iterable }} {{ s is iterable }} {{ lst is sequence }} {{ t is boolean }} {{ t is true }} {{ t is false }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is divisibleby(2) }}",
    "{{ 'a' is equalto 'a' }} {{ n is not none }} {{ n is not equalto 7 }} {{ tools is not defined }}",
    # filters
    "[{{ s | trim }}] [{{ 'xxhixx' | trim('x') }}] {{ s | length }} {{ lst | count }} {{ 'h\u00e9' | length }} {{ d | length }}",
    "{{ s | lower }}|{{ s | upper }}|{{ 'hello world' | capitalize }}|{{ 'hello wORLD' | title }}",
    "{{ zz | default('dv') }} {{ '' | default('dv') }} {{ '' | default('dv', true) }} {{ nothing | d('x', boolean=true) }}",
    "{{ lst | join(', ') }} {{ ['a', 'b'] | join }} {{ messages | map(attribute='role') | join('/') }}",
    "{{ 'aXbXc' | replace('X', '-') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ lst | first }} {{ lst | last }} {{ 'abc' | first }}",
    "{{ lst | list }} {{ 'ab' | list }} {{ lst | reverse | list }} {{ 'abc' | reverse }} {{ d | items | list }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('role', 'equalto', 'user') | list | length }}",
    "{{ lst | select('odd') | list }} {{ lst | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'B', 'A', 'b'] | unique | list }}",
    "{{ lst | sort }} {{ lst | sort(reverse=true) }} {{ messages | sort(attribute='role') | map(attribute='role') | list }} {{ ['b', 'A', 'c'] | sort }}",
    "{{ d | dictsort }} {{ 'x\ny\n\nz' | indent(2) }}|{{ 'x\ny' | indent(2, true) }}|{{ -3 | abs }} {{ 2.567 | round(1) }} {{ 2.5 | round }} {{ 3 | round }}",
    "{{ '42' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 7 | string }} {{ [1, 'a'] | string }} {{ 'x' | safe }}",
    "{{ d | tojson }} {{ messages[1] | tojson }} {{ 'h\u00e9\"\\\\\n<&>' | tojson }} {{ [1.5, none, true] | tojson }}",
    "{{ tools | tojson(indent=4) }}",
    "{{ d | tojson(indent=2, sort_keys=true) }} {{ [] | tojson(indent=2) }} {{ {} | tojson }}",
    "{{ lst | min }} {{ lst | max }} {{ lst | sum }} {{ messages | map('length') | list }}",
    # string and dict methods
    "[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ '\\n\\nx\\n'.lstrip('\\n') }}] [{{ 'xyhiyx'.strip('xy') }}]",
    "{{ words.split() }} {{ words.split(' ') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a<think>b</think>c'.split('</think>')[-1] }} {{ '  a  b '.split(None, 1) }}",
    "{{ s.startswith('  He') }} {{ s.endswith('x') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith(('bc',)) }}",
    "{{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'hi there'.title() }} {{ 'hI'.capitalize() }} {{ 'aXa'.replace('a', 'b') }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }}",
    "{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys() | list }} {{ d.values() | list | length }} {{ ', '.join(['a', 'b']) }}",
    # globals
    "{{ strftime_now('%Y-%m-%d %d %b %Y') }} {{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }}",
    "{% set x = namespace(a=[]) %}{{ x.a | length }}",
    # the real-template idioms
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}{{ ns.last_query_index }}",
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = '' %}\n{%- endif %}\n[{{ system_message }}]{{ loop_messages | length }}",
]


def c_lit(s):
    out = '"'
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch == "\n":
            out += "\\n"
        elif ch == "\t":
            out += "\\t"
        elif ch == '"':
            out += '\\"'
        elif ch == "\\":
            out += "\\\\"
        elif b >= 0x80 or b < 0x20:
            out += '\\x%02X" "' % b
        else:
            out += ch
    return out + '"'


def main():
    e = make_env()
    print("/* Generated by tests/golden/gen_jinja_golden.py (jinja2 %s). */" % jinja2.__version__)
    for src in CASES:
        out = e.from_string(src).render(**CTX)
        print("    {%s,\n     %s}," % (c_lit(src), c_lit(out)))


if __name__ == "__main__":
    main()
