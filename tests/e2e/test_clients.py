"""Client libraries used unmodified against the daemon: langchain-openai's
ChatOpenAI (plain chat, streaming, bind_tools, with_structured_output in
its three methods) and litellm's completion (chat, streaming, tools)."""
import json
import os

import jsonschema
import pytest

langchain_openai = pytest.importorskip("langchain_openai")
litellm = pytest.importorskip("litellm")

from pydantic import BaseModel, Field  # noqa: E402  (langchain-openai brings pydantic)


def base_url():
    return os.environ["DUALPATHD_URL"].rstrip("/") + "/v1"


@pytest.fixture(scope="module")
def llm(server, model_id):
    return langchain_openai.ChatOpenAI(base_url=base_url(), api_key="none", model=model_id,
                                       temperature=0, max_tokens=80)


def get_weather(city: str, unit: str) -> str:
    """The current weather in a city.

    Args:
        city: the city
        unit: celsius or fahrenheit
    """
    return f"18 degrees {unit} in {city}"


class Person(BaseModel):
    """A person."""
    name: str = Field(description="first name", max_length=20)
    age: int = Field(description="age in years")


def test_langchain_chat_and_stream(llm):
    out = llm.invoke("What is the capital of France?")
    assert isinstance(out.content, str) and out.content
    parts = [c.content for c in llm.stream("What is the capital of France?")]
    assert "".join(parts) == out.content


def test_langchain_bind_tools(llm):
    r = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    assert r.tool_calls, r
    call = r.tool_calls[0]
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}, call
    assert isinstance(call["args"]["city"], str)
    r2 = llm.bind_tools([get_weather], tool_choice="required").invoke("Weather in Rome?")
    assert r2.tool_calls and r2.tool_calls[0]["name"] == "get_weather"


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_with_structured_output(llm, method):
    prompt = "Alice is 30 years old. Extract the person."
    if method == "json_mode":
        prompt += " Answer in JSON with the keys name and age."
    p = llm.with_structured_output(Person, method=method).invoke(prompt)
    assert isinstance(p, Person), p
    jsonschema.validate(p.model_dump(), Person.model_json_schema())


def test_litellm_chat_stream_and_tools(server, model_id):
    kw = dict(model="openai/" + model_id, api_base=base_url(), api_key="none", temperature=0,
              max_tokens=60)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = litellm.completion(messages=msgs, **kw)
    text = r.choices[0].message.content
    assert isinstance(text, str) and text
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       litellm.completion(messages=msgs, stream=True, **kw))
    assert streamed == text
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                  "maxLength": 30}},
                       "required": ["city"]}}}]
    r = litellm.completion(messages=[{"role": "user", "content": "Weather in Paris?"}],
                           tools=tools, tool_choice="required", **dict(kw, max_tokens=120))
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)
