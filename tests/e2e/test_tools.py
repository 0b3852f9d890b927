"""Tool calling with the official openai client: tools + tool_choice
(required, a named function, auto), each call's arguments valid against its
tool's parameter schema (jsonschema), tool_calls whole and in streamed
deltas, a conversation that carries calls and tool results, and bad input
refused with a 400 naming the field."""
import json

import jsonschema
import pytest

from conftest import request

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"]}}}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls, names):
    assert calls, calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        assert c.function.name in names, c
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
    assert len({c.id for c in calls}) == len(calls)


def test_required_calls_a_tool(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=200,
                                       parallel_tool_calls=False)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    assert m.content is None
    assert len(m.tool_calls) == 1
    _check_calls(m.tool_calls, {"get_weather", "get_time"})


def test_named_function_is_the_one_called(client, model_id):
    for name in ("get_weather", "get_time"):
        r = client.chat.completions.create(
            model=model_id, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=200,
            tool_choice={"type": "function", "function": {"name": name}})
        assert r.choices[0].finish_reason == "tool_calls", r
        calls = r.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == [name]
        _check_calls(calls, {name})


def test_auto_answers_in_a_valid_shape(client, model_id):
    for q in ("What is the weather in Paris?", "Say hello."):
        r = client.chat.completions.create(model=model_id, tools=[WEATHER], temperature=0,
                                           max_tokens=200,
                                           messages=[{"role": "user", "content": q}])
        c = r.choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls" and c.message.content is None
            _check_calls(c.message.tool_calls, {"get_weather"})
        else:
            assert c.finish_reason in ("stop", "length") and isinstance(c.message.content, str)


def test_sampled_calls_always_validate(client, model_id):
    """Sampled at temperature 1 (n = 4): every call parses and validates."""
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=1.0, seed=3, n=4,
                                       max_tokens=200)
    done = [c for c in r.choices if c.finish_reason == "tool_calls"]
    assert done, r
    for c in done:
        _check_calls(c.message.tool_calls, {"get_weather", "get_time"})


def test_streamed_tool_calls(client, model_id):
    s = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=200,
                                       stream=True, parallel_tool_calls=False)
    calls, finish, role = {}, None, None
    for ch in s:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        role = role or d.role
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            e["name"] += tc.function.name or ""
            e["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert role == "assistant" and finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS["get_weather"])
    # The same call as the whole response.
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=200,
                                       parallel_tool_calls=False)
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == \
        json.loads(calls[0]["arguments"])


def test_conversation_with_calls_and_results(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=200)
    call = r.choices[0].message.tool_calls[0]
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    for choice in ("none", "auto"):
        r2 = client.chat.completions.create(model=model_id, messages=msgs, tools=[WEATHER],
                                            tool_choice=choice, temperature=0, max_tokens=40)
        c = r2.choices[0]
        if choice == "none":
            assert c.message.tool_calls is None and c.message.content
        assert c.finish_reason in ("stop", "length", "tool_calls")


def _post(body):
    st, _, raw = request("POST", "/v1/chat/completions", body)
    return st, json.loads(raw)


@pytest.mark.parametrize("extra,param", [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer", "multipleOf": 3}}}}}]},
     "tools[0].function.parameters.properties.n.multipleOf"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tools_are_400(extra, param):
    st, o = _post(dict({"messages": ASK, "max_tokens": 4}, **extra))
    assert st == 400, o
    assert o["error"]["param"] == param, o


@pytest.mark.parametrize("msg,param", [
    ({"role": "function", "name": "f", "content": "x"}, "messages[1].role"),
    ({"role": "assistant", "content": None, "function_call": {"name": "f"}},
     "messages[1].function_call"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
     "messages[1].tool_calls"),
    ({"role": "user", "content": "x", "tool_calls": []}, None),
])
def test_bad_tool_messages(msg, param):
    st, o = _post({"messages": ASK + [msg], "max_tokens": 4})
    if param is None:
        assert st == 200, o
        return
    assert st == 400, o
    assert o["error"]["param"] == param, o


def test_tools_on_completions_are_400():
    st, _, raw = request("POST", "/v1/completions",
                         {"prompt": "x", "max_tokens": 2, "tools": [WEATHER]})
    assert st == 400 and json.loads(raw)["error"]["param"] == "tools"
