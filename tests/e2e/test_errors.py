"""Every error case over raw HTTP (http.client / sockets): the status, the
OpenAI error shape naming the parameter, and a successful request right after
to prove the daemon still serves."""
import json
import signal
import os
import socket
import threading
import time
import urllib.parse

import pytest

from conftest import HANG_S, Daemon, metrics, request

GOOD = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}


def still_serves(base=None):
    st, _, body = request("POST", "/v1/completions", GOOD, base=base)
    assert st == 200, body
    assert json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length")


def check_error(st, body, status, param=None, etype="invalid_request_error"):
    assert st == status, body
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["message"]
    if etype:
        assert err["type"] == etype
    if param is not None:
        assert err["param"] == param, err
    return err


def test_invalid_json(server):
    for path in ("/v1/completions", "/v1/chat/completions"):
        for body in ('{"prompt": "x",', "not json", "", "[1, 2]", '"str"', "{" * 5000):
            st, _, b = request("POST", path, body)
            check_error(st, b, 400)
            still_serves()


COMPLETION_BAD = [
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [10 ** 9]}, "prompt"),
    ({"prompt": [{"a": 1}]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "top_k": "a"}, "top_k"),
    ({"prompt": "x", "min_p": 2}, "min_p"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 9}, "n"),
    ({"prompt": "x", "n": "3"}, "n"),
    ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 20}, "stop"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "stream": 1}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 1000}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [1]}, "logit_bias"),
    ({"prompt": "x", "user": 5}, "user"),
    ({"max_tokens": 5}, "prompt"),
]

CHAT_BAD = [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": "text"},
     "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": None, "n": 100}, "n"),
]


@pytest.mark.parametrize("body,param", COMPLETION_BAD)
def test_completion_bad_field(server, body, param):
    st, _, b = request("POST", "/v1/completions", body)
    check_error(st, b, 400, param)
    still_serves()


@pytest.mark.parametrize("body,param", CHAT_BAD)
def test_chat_bad_field(server, body, param):
    st, _, b = request("POST", "/v1/chat/completions", body)
    err = check_error(st, b, 400, param)
    if param == "response_format" and isinstance(body["response_format"], dict):
        assert "not supported" in err["message"]
    still_serves()


def test_unknown_model(server):
    st, _, b = request("POST", "/v1/completions", {**GOOD, "model": "gpt-17"})
    check_error(st, b, 404, "model")
    still_serves()


def test_prompt_too_long(server):
    st, _, b = request("GET", "/v1/models")
    ctx = json.loads(b)["data"][0]["max_model_len"]
    # Over the context by itself.
    st, _, b = request("POST", "/v1/completions", {"prompt": [1] * (ctx + 5), "max_tokens": 1})
    err = check_error(st, b, 400, "prompt")
    assert str(ctx) in err["message"] and str(ctx + 5) in err["message"]
    still_serves()
    # Fits, but not with max_tokens.
    st, _, b = request("POST", "/v1/completions", {"prompt": [1] * 100, "max_tokens": ctx})
    err = check_error(st, b, 400, "max_tokens")
    assert str(ctx) in err["message"] and "100" in err["message"] and str(ctx + 100) in err["message"]
    still_serves()
    st, _, b = request("POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi " * (ctx + 10)}]})
    err = check_error(st, b, 400, "messages")
    assert str(ctx) in err["message"]
    still_serves()


def test_404(server):
    for m, p in (("GET", "/index.html"), ("GET", "/v2/models"), ("POST", "/v1/embeddings"),
                 ("GET", "/v1/completions/x")):
        st, _, b = request(m, p)
        check_error(st, b, 404)
        still_serves()


def test_405(server):
    P, G = "POST, OPTIONS", "GET, HEAD, OPTIONS"
    for m, p, allow in (("GET", "/v1/completions", P), ("PUT", "/v1/chat/completions", P),
                        ("POST", "/health", G), ("DELETE", "/v1/models", G),
                        ("POST", "/metrics", G)):
        st, h, b = request(m, p, body="{}" if m in ("POST", "PUT") else None)
        check_error(st, b, 405)
        assert h.get("Allow") == allow
        still_serves()


def _raw(base, data, read_timeout=30):
    u = urllib.parse.urlparse(base)
    s = socket.create_connection((u.hostname, u.port), timeout=read_timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (413) before the whole body went out
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not d:
                break
            out += d
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
        return out
    finally:
        s.close()


def test_413_content_length(server):
    # Declared size over the cap: answered from the header, body never sent.
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 104857600\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert b"request_too_large" in out
    still_serves()
    # A real oversized body (the server may answer before reading it all).
    body = json.dumps({"prompt": "a" * (2 << 20)}).encode()
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    still_serves()


def test_413_chunked(server):
    chunk = b"a" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(40)) + b"0\r\n\r\n"
    out = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    still_serves()


def test_garbage_request_line(server):
    out = _raw(server, b"\x00\x01\x02 garbage\r\n\r\n", read_timeout=2)
    assert out == b"" or out.startswith(b"HTTP/1.1 4")
    out = _raw(server, b"GET /health HTTP/1.1\r\n" + b"X: " + b"y" * 100000 + b"\r\n\r\n", read_timeout=5)
    assert out == b"" or out.startswith(b"HTTP/1.1 4")
    still_serves()


def _stream_open(base, body):
    """Starts a streaming request; returns the socket after the headers."""
    u = urllib.parse.urlparse(base)
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    buf = b""
    while b"data:" not in buf:
        d = s.recv(4096)
        assert d, buf
        buf += d
    assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
    return s


def test_429_queue_full():
    d = Daemon(["--max-queue", "1", "--max-seqs", "1"], log_name="dualpathd-429")
    try:
        long = {"prompt": "Count to one thousand:", "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        a = _stream_open(d.url, long)           # running
        u = urllib.parse.urlparse(d.url)
        b = socket.create_connection((u.hostname, u.port), timeout=60)
        data = json.dumps(long).encode()
        b.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(data), data))             # waits in the queue
        deadline = time.time() + HANG_S  # bounds a hang only
        while metrics(d.url)["dualpath_requests_waiting"] < 1:
            assert time.time() < deadline
            time.sleep(0.05)
        st, h, body = request("POST", "/v1/completions", GOOD, base=d.url)
        check_error(st, body, 429, etype=None)
        assert int(h["Retry-After"]) >= 1
        a.close()
        b.close()
        deadline = time.time() + HANG_S  # bounds a hang only
        while True:
            m = metrics(d.url)
            if m["dualpath_requests_running"] == 0 and m["dualpath_requests_waiting"] == 0:
                break
            assert time.time() < deadline, m
            time.sleep(0.1)
        still_serves(d.url)
    finally:
        assert d.stop() == 0


def test_503_while_draining():
    import http.client
    d = Daemon(["--drain-timeout", "300"], log_name="dualpathd-drain")
    try:
        u = urllib.parse.urlparse(d.url)
        keep = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        keep.request("GET", "/health")
        r = keep.getresponse()
        assert r.status == 200
        r.read()
        # Long enough that the drain outlasts the checks below (a short stream
        # could finish, and the daemon exit, before the 503 is observed).
        a = _stream_open(d.url, {"prompt": "Tell me a story", "max_tokens": 200, "stream": True,
                                 "ignore_eos": True})
        t0 = time.time()
        d.proc.send_signal(15)
        time.sleep(0.3)
        keep.request("GET", "/health")
        r = keep.getresponse()
        assert r.status == 503 and json.loads(r.read())["status"] == "draining"
        keep.request("POST", "/v1/completions", body=json.dumps(GOOD),
                     headers={"Content-Type": "application/json"})
        r = keep.getresponse()
        check_error(r.status, r.read(), 503, etype=None)
        assert r.getheader("Retry-After")
        # New connections are refused.
        with pytest.raises(OSError):
            socket.create_connection((u.hostname, u.port), timeout=2).recv(1)
        # The running stream still completes (the "successful request").
        buf = b""
        a.settimeout(30)
        while b"data: [DONE]" not in buf:
            chunk = a.recv(65536)
            assert chunk, buf[-300:]
            buf += chunk
        assert b'"finish_reason":"length"' in buf
        a.close()
        keep.close()
        assert d.proc.wait(timeout=60) == 0
        assert time.time() - t0 < 120
    finally:
        d.stop()


def test_drain_timeout_cancels():
    """Past --drain-timeout, running streams end with an error event (the
    503 a whole response gets; OpenAI's finish reasons have no "cancelled"),
    then [DONE], and the daemon still exits 0."""
    d = Daemon(["--drain-timeout", "0.5"], log_name="dualpathd-drain-timeout")
    try:
        a = _stream_open(d.url, {"prompt": "Tell me a story", "max_tokens": 4000, "stream": True,
                                 "ignore_eos": True})
        d.proc.send_signal(15)
        buf = b""
        a.settimeout(30)
        while b"data: [DONE]" not in buf:
            chunk = a.recv(65536)
            assert chunk, buf[-300:]
            buf += chunk
        assert b'"finish_reason":"abort"' not in buf
        events = [json.loads(line[6:]) for line in buf.split(b"\n")
                  if line.startswith(b"data: {")]
        assert events[-1]["error"]["type"] == "service_unavailable", events[-1]
        assert "shutting down" in events[-1]["error"]["message"]
        for ev in events[:-1]:
            for c in ev.get("choices", []):
                assert c.get("finish_reason") in (None, "stop", "length"), ev
        a.close()
        assert d.proc.wait(timeout=30) == 0
    finally:
        d.stop()


def _start_loading_daemon():
    """A daemon held in its model load while the file `hold` exists
    (DUALPATHD_DEBUG_LOAD_HOLD): (proc, base URL, hold, and the status and
    body of its first /health answer)."""
    import subprocess
    import tempfile
    from conftest import BIN, MODEL, listening_url
    logdir = os.environ.get("DUALPATHD_LOGDIR", "/tmp")
    fd, hold = tempfile.mkstemp(prefix="dualpathd-hold-", dir=logdir)
    os.close(fd)
    env = dict(os.environ, DUALPATHD_DEBUG_LOAD_HOLD=hold)
    log = tempfile.NamedTemporaryFile("w+", prefix="dualpathd-loading-", suffix=".log",
                                      dir=logdir, delete=False)
    proc = subprocess.Popen([BIN, "--config", "", "--model", MODEL, "--listen", "127.0.0.1:0"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    base = listening_url(proc, log.name)
    st, _, body = request("GET", "/health", base=base, timeout=HANG_S)
    return proc, base, hold, st, body


def test_503_while_loading():
    """The socket opens before the weights load: /health says 503 "loading",
    requests get 503, then the daemon becomes ready and serves."""
    proc, base, hold, st, body = _start_loading_daemon()
    try:
        assert st == 503 and json.loads(body)["status"] == "loading"
        st, _, body = request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, base=base)
        assert st == 503
        assert json.loads(body)["error"]["message"]
        os.unlink(hold)  # loading goes on
        while st != 200:
            st, _, _ = request("GET", "/health", base=base)
            assert st in (200, 503)
            time.sleep(0.1)
        st, _, body = request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, base=base)
        assert st == 200
    finally:
        if os.path.exists(hold):
            os.unlink(hold)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0


def test_sigterm_while_loading():
    proc, base, hold, st, _ = _start_loading_daemon()
    try:
        assert st == 503
        proc.send_signal(signal.SIGTERM)
    finally:
        os.unlink(hold)
    assert proc.wait(timeout=HANG_S) == 0


def test_device_lost_exits_to_be_restarted(monkeypatch):
    """A lost device (test hook DUALPATHD_DEBUG_DEVICE_LOST: the first step
    fails as it does after a sticky CUDA error such as an illegal address):
    the request in it gets a clear error, /health answers 503 "device lost"
    for as long as the daemon is up, and the daemon, with nothing left that
    it can run, exits with status 1 so that systemd (Restart=on-failure)
    starts a fresh one."""
    from conftest import Daemon
    monkeypatch.setenv("DUALPATHD_DEBUG_DEVICE_LOST", "1")
    d = Daemon(log_name="dualpathd-lost")
    try:
        st, _, raw = d.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        o = json.loads(raw)
        assert st >= 500, o
        assert "device is lost" in o["error"]["message"], o
        try:
            st, _, body = d.request("GET", "/health", timeout=5)
            assert st == 503 and json.loads(body)["status"] in ("device lost", "draining"), body
        except OSError:
            pass  # already gone
        assert d.proc.wait(timeout=60) == 1
        log = d.log_text()
        assert "the device is lost" in log and "exiting with status 1" in log, log[-2000:]
    finally:
        d.stop()
