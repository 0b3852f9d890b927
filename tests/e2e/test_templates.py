"""Chat templates a request brings: `chat_template` (a Jinja template compiled
for that request) and `chat_template_kwargs` (values the template reads, as
vLLM takes them). Each rendering is checked against a completion of the text
the template gives (greedy: the same tokens, the same prompt length); a
construct the engine lacks, a template's raise_exception and a malformed
field are 400s naming the problem, and the daemon keeps serving."""
from conftest import chat, complete_greedy

PLAIN = ("{% for m in messages %}{{ m.role | upper }}: {{ m.content | trim }}\n{% endfor %}"
         "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
KWARGS = ("{% if persona is defined %}[{{ persona }}]{% endif %}"
          "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% if not think | default(true) %}(no thinking){% endif %}"
          "{% endif %}")


def same_as_completion(body, text, n=8):
    st, got = chat({**body, "max_tokens": n, "temperature": 0})
    assert st == 200, got
    want = complete_greedy(text, n)
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["text"]


def test_request_template_renders_the_prompt():
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Name a colour."}]
    same_as_completion({"messages": msgs, "chat_template": PLAIN},
                       "SYSTEM: Be brief.\nUSER: Name a colour.\nASSISTANT:")


def test_kwargs_reach_the_template():
    msgs = [{"role": "user", "content": "Hi"}]
    same_as_completion({"messages": msgs, "chat_template": KWARGS,
                        "chat_template_kwargs": {"persona": "pirate", "think": False}},
                       "[pirate]<user>Hi<assistant>(no thinking)")
    # Without kwargs the same template takes its defaults.
    same_as_completion({"messages": msgs, "chat_template": KWARGS}, "<user>Hi<assistant>")


def test_kwargs_on_the_models_template():
    # SmolLM2's template reads no kwargs: an unknown one changes nothing.
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    st, a = chat({"messages": msgs, "max_tokens": 6, "temperature": 0})
    st2, b = chat({"messages": msgs, "max_tokens": 6, "temperature": 0,
                   "chat_template_kwargs": {"enable_thinking": False}})
    assert st == st2 == 200
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_bad_templates_are_400s_naming_the_problem():
    msgs = [{"role": "user", "content": "Hi"}]
    cases = [
        ({"chat_template": "line one\n{{ messages[0].content | wordwrap }}"}, ["wordwrap", "line 2"]),
        ({"chat_template": "{% for m in messages %}{{ m.content }}"}, ["for"]),
        ({"chat_template": "{{ raise_exception('only system messages, please') }}"},
         ["only system messages, please"]),
        ({"chat_template": ""}, ["chat_template"]),
        ({"chat_template": 5}, ["chat_template"]),
        ({"chat_template_kwargs": [1, 2]}, ["chat_template_kwargs"]),
        ({"chat_template_kwargs": "x"}, ["chat_template_kwargs"]),
    ]
    for extra, words in cases:
        st, body = chat({"messages": msgs, "max_tokens": 2, **extra})
        assert st == 400, (extra, body)
        msg = body["error"]["message"]
        for w in words:
            assert w in msg, (extra, msg)
    # The daemon keeps serving.
    st, body = chat({"messages": msgs, "max_tokens": 2})
    assert st == 200, body


def test_deep_kwargs_are_refused():
    deep = {}
    cur = deep
    for _ in range(200):
        cur["a"] = {}
        cur = cur["a"]
    st, body = chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                     "chat_template_kwargs": deep})
    assert st == 400, body
    assert "chat_template_kwargs" in body["error"]["message"]


def test_runaway_template_is_stopped():
    # A render that would grow without bound ends at the engine's limits
    # with a 400, and the next request is served.
    t = ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}{{ ns.s }}")
    st, body = chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                     "chat_template": t})
    assert st == 400, body
    st, body = chat({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert st == 200, body
