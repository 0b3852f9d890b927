"""How a chat prompt ends: a last message from the assistant is continued
(assistant prefill, llama.cpp's default; vLLM's continue_final_message),
add_generation_prompt false ends the prompt after the last message, and an
explicit add_generation_prompt true opens a new assistant turn as before.
Each is checked against a completion of the prompt text the template gives
(SmolLM2's ChatML with its default system prompt). Also /version."""
import json

import pytest

from conftest import chat, complete_greedy, request

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(msgs, end):
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for i, (role, content) in enumerate(msgs):
        text += f"<|im_start|>{role}\n{content}"
        if not (end == "continue" and i == len(msgs) - 1):
            text += "<|im_end|>\n"
    if end == "generate":
        text += "<|im_start|>assistant\n"
    return text


MSGS = [("user", "What is the capital of France?"), ("assistant", "The capital of France is")]


@pytest.mark.parametrize("extra,end", [
    ({}, "continue"),                                    # llama.cpp's default
    ({"continue_final_message": True, "add_generation_prompt": False}, "continue"),
    ({"add_generation_prompt": True}, "generate"),       # a new turn, asked for
    ({"add_generation_prompt": False, "continue_final_message": False}, "none"),
])
def test_prompt_endings(extra, end):
    body = {"messages": [{"role": r, "content": c} for r, c in MSGS], "max_tokens": 8,
            "temperature": 0, **extra}
    st, d = chat(body)
    assert st == 200, d
    want = complete_greedy(chatml(MSGS, end), 8)
    assert d["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"], (end, d["usage"])
    assert d["choices"][0]["message"]["content"] == want["choices"][0]["text"]


def test_prefill_continues_the_text():
    st, d = chat({"messages": [{"role": "user", "content": "Count from one to five."},
                               {"role": "assistant", "content": "One, two,"}],
                  "max_tokens": 6, "temperature": 0})
    assert st == 200, d
    # The answer goes on from "two," -- no new turn, no repeated start.
    text = d["choices"][0]["message"]["content"]
    assert "three" in text.lower(), text
    assert not text.lower().lstrip().startswith("one"), text


def test_user_last_without_generation_prompt():
    msgs = [("user", "Hello")]
    st, d = chat({"messages": [{"role": r, "content": c} for r, c in msgs],
                  "add_generation_prompt": False, "max_tokens": 4, "temperature": 0})
    assert st == 200, d
    want = complete_greedy(chatml(msgs, "none"), 4)
    assert d["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]


@pytest.mark.parametrize("extra,param", [
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"continue_final_message": "yes"}, "continue_final_message"),
    ({"add_generation_prompt": 1}, "add_generation_prompt"),
])
def test_bad_endings(extra, param):
    st, d = chat({"messages": [{"role": r, "content": c} for r, c in MSGS], **extra})
    assert st == 400, d
    assert d["error"]["param"] == param


def test_continue_needs_an_assistant_message():
    st, d = chat({"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True})
    assert st == 400 and d["error"]["param"] == "continue_final_message", d


def test_version():
    st, _, raw = request("GET", "/version")
    assert st == 200
    d = json.loads(raw)
    assert d["version"] and d["backend"] and d["kernels"] and d["model"]
    st, _, raw = request("POST", "/version", {})
    assert st == 405
