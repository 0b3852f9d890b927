"""Many concurrent streams on loopback; clients that vanish mid-stream must
free their sequences and KV blocks."""
import json
import socket
import threading
import time
import urllib.parse

import pytest

from conftest import HANG_S, metrics, request


def _stream(base, body, read_chunks=None):
    """Raw SSE client. read_chunks=None: read to the end and return the parsed
    events; else close the socket after that many data events."""
    u = urllib.parse.urlparse(base)
    s = socket.create_connection((u.hostname, u.port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        assert d
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"text/event-stream" in head
    chunked = b"transfer-encoding: chunked" in head.lower()
    raw = rest
    events = []
    while True:
        body_bytes = _dechunk(raw) if chunked else raw
        events = [e for e in body_bytes.split(b"\n\n") if e.startswith(b"data: ")]
        if read_chunks is not None and len(events) >= read_chunks:
            s.close()
            return None
        if b"data: [DONE]\n\n" in body_bytes:
            break
        d = s.recv(65536)
        assert d, "stream ended without [DONE]"
        raw += d
    s.close()
    return events


def _dechunk(raw):
    out, i = b"", 0
    while True:
        j = raw.find(b"\r\n", i)
        if j < 0:
            return out
        try:
            n = int(raw[i:j].split(b";")[0], 16)
        except ValueError:
            return out
        if n == 0 or len(raw) < j + 2 + n:
            return out
        out += raw[j + 2:j + 2 + n]
        i = j + 2 + n + 2


@pytest.mark.heavy
def test_64_concurrent_streams(server):
    results, errors = {}, []

    def run(i):
        try:
            results[i] = _stream(server, {"messages": [{"role": "user", "content": f"Say {i}"}],
                                          "max_tokens": 6, "stream": True, "seed": i,
                                          "stream_options": {"include_usage": True}})
        except Exception as e:  # noqa: BLE001
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:5]
    assert len(results) == 64
    for i, events in results.items():
        assert events[-1] == b"data: [DONE]", events[-3:]
        objs = [json.loads(e[6:]) for e in events[:-1]]
        assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
        ids = {o["id"] for o in objs}
        assert len(ids) == 1
        finishes = [o["choices"][0]["finish_reason"] for o in objs if o["choices"]]
        assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
        assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] <= 6
    assert len({r[0] for r in results.values()}) == 64  # distinct ids across streams


def kv_blocks(m, kind):
    """dualpath_kv_blocks_{kind} summed over the pools (prefill, and decode with dualpath)."""
    vals = [v for k, v in m.items() if k.startswith(f"dualpath_kv_blocks_{kind}{{pool=")]
    assert vals, f"no dualpath_kv_blocks_{kind} series"
    return sum(vals)


def wait_idle(base, timeout=HANG_S):  # the timeout bounds a hang only
    deadline = time.time() + timeout
    while True:
        m = metrics(base)
        if (m["dualpath_requests_running"] == 0 and m["dualpath_requests_waiting"] == 0
                and kv_blocks(m, "used") == 0):
            return m
        assert time.time() < deadline, {k: v for k, v in m.items() if "requests" in k or "kv" in k}
        time.sleep(0.1)


def test_16_disconnects_free_everything(server):
    wait_idle(server)
    before = metrics(server)
    errors = []

    def run(i):
        try:
            _stream(server, {"messages": [{"role": "user", "content": f"Write a long essay {i}"}],
                             "max_tokens": 500, "stream": True, "ignore_eos": True},
                    read_chunks=3)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    m = wait_idle(server)
    cancelled = (m['dualpath_requests_finished_total{reason="cancelled"}']
                 - before['dualpath_requests_finished_total{reason="cancelled"}'])
    assert cancelled == 16
    assert m['dualpath_kv_blocks_capacity{pool="prefill"}'] > 0
    assert kv_blocks(m, "capacity") >= m['dualpath_kv_blocks_capacity{pool="prefill"}']
    st, _, body = request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert st == 200
