"""The OpenAI API as the official `openai` client sees it."""
import math

SHORT = 8


def test_models(client, model_id):
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == model_id


def test_completion(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is",
                                  max_tokens=SHORT, temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert r.model == model_id and r.created > 0
    c = r.choices[0]
    assert c.index == 0 and c.finish_reason in ("stop", "length") and c.text
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= SHORT
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=SHORT, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant" and m.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= SHORT


def test_chat_text_parts_and_completion_tokens_alias(client, model_id):
    r = client.chat.completions.create(
        model=model_id, max_completion_tokens=4, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                {"type": "text", "text": "there"}]}])
    assert r.usage.completion_tokens <= 4


def test_max_tokens_length(client, model_id):
    r = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=model_id, max_tokens=3, temperature=0,
                                       messages=[{"role": "user", "content": "Tell me a long story."}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_stream_completion_matches_non_stream(client, model_id):
    kw = dict(model=model_id, prompt="The quick brown fox", max_tokens=SHORT, temperature=0.8,
              seed=1234)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert all(c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == full.choices[0].finish_reason and all(f is None for f in finishes[:-1])


def test_stream_chat_include_usage(client, model_id):
    kw = dict(model=model_id, messages=[{"role": "user", "content": "Name a color."}],
              max_tokens=SHORT, temperature=0.7, seed=99)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert content[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert text == full.choices[0].message.content
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == full.usage.completion_tokens
    assert usage.usage.prompt_tokens == full.usage.prompt_tokens


def test_stream_without_usage_has_none(client, model_id):
    chunks = list(client.completions.create(model=model_id, prompt="Hi", max_tokens=3,
                                            stream=True))
    assert all(c.choices for c in chunks)


def test_n3(client, model_id):
    r = client.completions.create(model=model_id, prompt="My favourite animal is", n=3,
                                  max_tokens=6, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 18
    # Same seed -> same three choices, in order.
    r2 = client.completions.create(model=model_id, prompt="My favourite animal is", n=3,
                                   max_tokens=6, temperature=1.0, seed=7)
    assert [c.text for c in r.choices] == [c.text for c in r2.choices]
    # Choice i uses seed + i: choice 1 of seed 7 is choice 0 of seed 8.
    r3 = client.completions.create(model=model_id, prompt="My favourite animal is", n=1,
                                   max_tokens=6, temperature=1.0, seed=8)
    assert r3.choices[0].text == r.choices[1].text


def test_n3_chat_stream(client, model_id):
    chunks = list(client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=4,
        stream=True, seed=3))
    texts = {0: "", 1: "", 2: ""}
    finished = set()
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1, 2}


def test_stop(client, model_id):
    base = client.completions.create(model=model_id, prompt="1, 2, 3, 4, 5,", max_tokens=12,
                                     temperature=0)
    text = base.choices[0].text
    assert len(text) > 3
    stop = text[2:4]
    r = client.completions.create(model=model_id, prompt="1, 2, 3, 4, 5,", max_tokens=12,
                                  temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert text.startswith(r.choices[0].text)
    # Streaming obeys it as well.
    chunks = list(client.completions.create(model=model_id, prompt="1, 2, 3, 4, 5,",
                                            max_tokens=12, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_seed_reproducible(client, model_id):
    kw = dict(model=model_id, messages=[{"role": "user", "content": "Write a word."}],
              max_tokens=SHORT, temperature=1.0, seed=424242)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b
    outs = {client.chat.completions.create(**{**kw, "seed": s}).choices[0].message.content
            for s in range(5)}
    assert len(outs) > 1


def test_chat_logprobs(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Say something."}],
        max_tokens=SHORT, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True})
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == c.message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert bytes(t.bytes) == t.token.encode()
        assert all(a.logprob <= 0 for a in t.top_logprobs)
        # Greedy: the chosen token is the most likely one.
        assert abs(t.logprob - max(a.logprob for a in t.top_logprobs)) < 1e-4


def test_completion_logprobs(client, model_id):
    r = client.completions.create(model=model_id, prompt="The sky is", max_tokens=SHORT,
                                  temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) <= 2 and all(v <= 0 for v in t.values()) for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0
    for i in range(1, len(lp.tokens)):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1].encode())


def test_stream_logprobs(client, model_id):
    chunks = list(client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=1, stream=True,
        extra_body={"ignore_eos": True}))
    toks, text = [], ""
    for c in chunks:
        for ch in c.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                toks += ch.logprobs.content
    assert "".join(t.token for t in toks) == text
    assert all(t.logprob <= 0 for t in toks)


def test_echo(client, model_id):
    r = client.completions.create(model=model_id, prompt="Echo this:", max_tokens=3,
                                  temperature=0, echo=True)
    assert r.choices[0].text.startswith("Echo this:")


def test_token_prompt_and_batch(client, model_id):
    import json
    import urllib.request
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"content": "Hello world"}).encode(),
                                 headers={"Content-Type": "application/json"})
    toks = json.load(urllib.request.urlopen(req))["tokens"]
    assert toks
    a = client.completions.create(model=model_id, prompt=toks, max_tokens=4, temperature=0)
    b = client.completions.create(model=model_id, prompt="Hello world", max_tokens=4, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    r = client.completions.create(model=model_id, prompt=["Hello world", "Goodbye"], max_tokens=2,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == client.completions.create(
        model=model_id, prompt="Hello world", max_tokens=2, temperature=0).choices[0].text


def test_multi_turn_with_system(client, model_id):
    msgs = [{"role": "system", "content": "You are a terse assistant. Answer in one word."},
            {"role": "user", "content": "What color is the sky?"}]
    r1 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=SHORT,
                                        temperature=0)
    a1 = r1.choices[0].message.content
    msgs += [{"role": "assistant", "content": a1},
             {"role": "user", "content": "And the grass?"}]
    r2 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=SHORT,
                                        temperature=0)
    assert r2.choices[0].message.content
    # The second turn's prompt holds the first turn.
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens + r1.usage.completion_tokens
    # A system message changes the prompt (the template's default is replaced).
    r3 = client.chat.completions.create(model=model_id, messages=msgs[1:2], max_tokens=1,
                                        temperature=0)
    assert r3.usage.prompt_tokens != r1.usage.prompt_tokens


def test_penalties_and_bias_accepted(client, model_id):
    r = client.completions.create(model=model_id, prompt="a a a a", max_tokens=4,
                                  temperature=0, presence_penalty=1.5, frequency_penalty=1.0,
                                  logit_bias={"64": -100}, user="tester",
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_logit_bias_forces_token(client, model_id):
    import json
    import urllib.request
    base = str(client.base_url).rstrip("/").removesuffix("/v1")
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"content": " banana"}).encode(),
                                 headers={"Content-Type": "application/json"})
    tid = json.load(urllib.request.urlopen(req))["tokens"][-1]
    r = client.completions.create(model=model_id, prompt="I like", max_tokens=3, temperature=0,
                                  logit_bias={str(tid): 100})
    assert r.choices[0].text.startswith(" banana")
