"""Hardening: connection deadlines (headers, body, idle), the per-address
connection cap, request_timeout, API keys (reloaded on SIGHUP), CORS, unix
sockets, request framing (Content-Length), fields the server does not
implement, exact numeric bounds, and errors that are valid JSON whatever the
client sent. Verdicts wait on events (a close, a response, a log line); socket
timeouts only bound a hang."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import BIN, MODEL, Daemon, metrics, request

GOOD = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}


def wait_for(cond, what="condition"):
    deadline = time.time() + 120  # bounds a hang only
    while not cond():
        assert time.time() < deadline, f"{what} never held"
        time.sleep(0.05)


def closed_by_server(s, limit=60):
    """True once the server closes s (recv returns EOF or a reset)."""
    s.settimeout(limit)
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def raw(port, data, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not d:
                break
            out += d
            head, sep, rest = out.partition(b"\r\n\r\n")
            if sep:
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
        return out
    finally:
        s.close()


def body_of(resp):
    return resp.partition(b"\r\n\r\n")[2]


def error_of(st, body, status, param=None):
    assert st == status, body
    err = json.loads(body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


# ---- deadlines and the per-address cap --------------------------------------

@pytest.fixture(scope="module")
def strict():
    """Short deadlines, a small per-address cap and a short request_timeout."""
    d = Daemon(["--header-timeout", "1s", "--body-timeout", "1s", "--idle-timeout", "2s",
                "--max-connections", "64", "--max-connections-per-ip", "8",
                "--request-timeout", "1s"], log_name="dualpathd-strict")
    yield d
    assert d.stop() == 0


def test_header_deadline_closes_slow_headers(strict):
    before = metrics(strict.url)['dualpath_http_timeouts_total{kind="header"}']
    s = socket.create_connection(("127.0.0.1", strict.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
    for _ in range(3):
        try:
            s.sendall(b"X")  # a byte now and then resets no deadline
        except OSError:
            break
    assert closed_by_server(s)
    s.close()
    assert metrics(strict.url)['dualpath_http_timeouts_total{kind="header"}'] == before + 1
    assert request("GET", "/health", base=strict.url)[0] == 200


def test_body_trickle_is_closed(strict):
    """A byte now and then restarts no deadline past the minimum rate."""
    s = socket.create_connection(("127.0.0.1", strict.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    s.settimeout(60)
    closed = False
    for _ in range(600):  # bounds a hang: a byte per 0.2 s is far under 1 KiB/s
        try:
            s.sendall(b" ")
            if s.recv(1, socket.MSG_DONTWAIT) == b"":
                closed = True
                break
        except BlockingIOError:
            pass
        except OSError:
            closed = True
            break
        time.sleep(0.2)
    s.close()
    assert closed
    assert metrics(strict.url)['dualpath_http_timeouts_total{kind="body"}'] >= 1


def test_body_deadline_closes_stalled_body(strict):
    s = socket.create_connection(("127.0.0.1", strict.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    assert closed_by_server(s)
    s.close()
    assert request("GET", "/health", base=strict.url)[0] == 200


def test_idle_keepalive_is_closed(strict):
    s = socket.create_connection(("127.0.0.1", strict.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(30)
    assert s.recv(12).startswith(b"HTTP/1.1 200")
    assert closed_by_server(s)  # no next request
    s.close()


def from_addr(port, src):
    """A connection to the daemon from another loopback address."""
    c = socket.socket()
    c.settimeout(30)
    c.bind((src, 0))
    c.connect(("127.0.0.1", port))
    return c


def test_slowloris_200_connections(server):
    """200 connections trickling their headers (the shared daemon: default
    limits, 256 connections, 224 per address, header_timeout 10 s): healthy
    requests are served while they hang on, and each is closed at its header
    deadline."""
    port = int(server.rsplit(":", 1)[1])
    socks = []
    for _ in range(200):
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(c)
    for c in socks:
        c.sendall(b"X")  # all still open
    assert request("GET", "/health")[0] == 200
    st, _, body = request("POST", "/v1/completions", GOOD)
    assert st == 200, body
    for c in socks:
        assert closed_by_server(c)
        c.close()
    assert request("POST", "/v1/completions", GOOD)[0] == 200


def test_per_ip_cap(strict):
    # Closed connections leave the per-address count when MHD cleans them up,
    # so the scrape itself may be refused for a moment.
    def idle():
        try:
            return metrics(strict.url)["dualpath_http_connections"] == 1
        except OSError:
            return False
    wait_for(idle, "no open connections")
    held = []
    for _ in range(8):  # the cap: each one answered, then kept alive
        c = socket.create_connection(("127.0.0.1", strict.port), timeout=30)
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.recv(12).startswith(b"HTTP/1.1 200")
        held.append(c)
    extra = socket.create_connection(("127.0.0.1", strict.port), timeout=30)
    try:
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    except OSError:
        pass
    assert closed_by_server(extra)  # over the cap: closed without an answer
    extra.close()
    # Another client address still gets in.
    other = from_addr(strict.port, "127.0.0.2")
    other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert other.recv(12).startswith(b"HTTP/1.1 200")
    other.close()
    for c in held:
        c.close()
    wait_for(idle, "a slot")


def test_request_timeout_non_streamed(strict):
    # 8000 tokens cannot be generated within 1 s on any CPU.
    st, _, body = request("POST", "/v1/completions",
                          {"prompt": "Count:", "max_tokens": 8000, "ignore_eos": True},
                          base=strict.url)
    err = error_of(st, body, 504)
    assert err["code"] == "request_timeout"
    assert request("POST", "/v1/completions", GOOD, base=strict.url)[0] == 200


def test_request_timeout_streamed(strict):
    st, _, body = request("POST", "/v1/completions",
                          {"prompt": "Count:", "max_tokens": 8000, "ignore_eos": True,
                           "stream": True}, base=strict.url)
    assert st == 200
    events = [l[6:] for l in body.decode().split("\n") if l.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "request_timeout"
    wait_for(lambda: metrics(strict.url)["dualpath_requests_running"] == 0, "no request running")


def test_request_timeout_zero_is_never():
    d = Daemon(["--request-timeout", "0"], log_name="dualpathd-notimeout")
    try:
        st, _, body = request("POST", "/v1/completions",
                              {"prompt": "Count:", "max_tokens": 40, "ignore_eos": True},
                              base=d.url)
        assert st == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 40
    finally:
        assert d.stop() == 0


# ---- API keys ----------------------------------------------------------------

def test_api_keys_and_sighup_reload():
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write("# keys\nsk-first\n\n  sk-second  \n")
        path = f.name
    os.chmod(path, 0o600)
    d = Daemon(["--api-key-file", path, "--metrics-public=false"], log_name="dualpathd-keys")
    try:
        st, h, body = request("GET", "/v1/models", base=d.url)
        assert error_of(st, body, 401)["code"] == "invalid_api_key"
        assert h.get("WWW-Authenticate") == "Bearer"
        st, _, body = request("POST", "/v1/completions", GOOD, base=d.url,
                              headers={"Authorization": "Bearer sk-firsT"})
        error_of(st, body, 401)
        for key in ("sk-first", "sk-second"):
            st, _, body = request("POST", "/v1/completions", GOOD, base=d.url,
                                  headers={"Authorization": f"Bearer {key}"})
            assert st == 200, body
        assert request("GET", "/health", base=d.url)[0] == 200            # public
        assert request("GET", "/metrics", base=d.url)[0] == 401           # not public
        st, _, body = request("GET", "/metrics", base=d.url,
                              headers={"Authorization": "Bearer sk-first"})
        assert st == 200 and b"dualpath_http_auth_failures_total 3" in body
        # A 401 comes from the headers alone: a big body is never read.
        out = raw(d.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 401"), out[:100]
        # The official client sends the key as a bearer token.
        import openai
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="sk-second", max_retries=0)
        assert c.models.list().data
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=d.url + "/v1", api_key="wrong", max_retries=0).models.list()
        # SIGHUP reads the file again: the old keys stop working.
        with open(path, "w") as f:
            f.write("sk-third\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "1 API key(s) reloaded" in d.log_text(), "the reload")
        assert request("GET", "/v1/models", base=d.url,
                       headers={"Authorization": "Bearer sk-first"})[0] == 401
        assert request("GET", "/v1/models", base=d.url,
                       headers={"Authorization": "Bearer sk-third"})[0] == 200
        # A broken file on reload keeps the keys in use.
        with open(path, "w") as f:
            f.write("# nothing\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "key(s) in use stay" in d.log_text(), "the failed reload")
        assert request("GET", "/v1/models", base=d.url,
                       headers={"Authorization": "Bearer sk-third"})[0] == 200
    finally:
        assert d.stop() == 0
        os.unlink(path)


@pytest.mark.parametrize("content,why", [("", "has no keys"), ("bad key\n", "printable ASCII")])
def test_bad_key_file_refused_at_start(content, why):
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write(content)
        path = f.name
    try:
        for args in (["--check-config"], []):
            r = subprocess.run([BIN, "--config", "", "--model", MODEL, "--listen", "127.0.0.1:0",
                                "--api-key-file", path, *args], capture_output=True, text=True,
                               timeout=120)
            assert r.returncode != 0
            assert why in r.stderr, r.stderr
    finally:
        os.unlink(path)


# ---- CORS ----------------------------------------------------------------------

def test_cors():
    d = Daemon(["--cors-origins", "https://app.example, http://localhost:3000"],
               log_name="dualpathd-cors")
    try:
        st, h, _ = request("OPTIONS", "/v1/chat/completions", base=d.url,
                           headers={"Origin": "https://app.example",
                                    "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "authorization, content-type"})
        assert st == 204
        assert h["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in h["Access-Control-Allow-Methods"]
        assert h["Access-Control-Allow-Headers"] == "authorization, content-type"
        # On plain, error and streamed responses alike.
        for method, path, body in (("GET", "/v1/models", None), ("GET", "/nope", None),
                                   ("POST", "/v1/completions", dict(GOOD, stream=True)),
                                   ("POST", "/v1/completions", {"prompt": 3})):
            st, h, _ = request(method, path, body, base=d.url,
                               headers={"Origin": "http://localhost:3000"})
            assert h.get("Access-Control-Allow-Origin") == "http://localhost:3000", (path, st, h)
            assert h.get("Vary") == "Origin"
        st, h, _ = request("GET", "/v1/models", base=d.url, headers={"Origin": "https://evil.example"})
        assert st == 200 and "Access-Control-Allow-Origin" not in h
    finally:
        assert d.stop() == 0


def test_no_cors_by_default(server):
    st, h, _ = request("OPTIONS", "/v1/completions", headers={"Origin": "https://app.example"})
    assert st == 204 and "Access-Control-Allow-Origin" not in h
    assert h["Allow"] == "POST, OPTIONS"
    st, h, _ = request("GET", "/v1/models", headers={"Origin": "https://app.example"})
    assert "Access-Control-Allow-Origin" not in h


# ---- listening -----------------------------------------------------------------

def test_unix_socket():
    path = os.path.join(tempfile.mkdtemp(), "dualpathd.sock")
    d = Daemon(unix_path=path, log_name="dualpathd-unix")
    try:
        st, _, body = d.request("POST", "/v1/completions", GOOD)
        assert st == 200, body
        assert d.request("HEAD", "/health")[0] == 200
        # A second daemon on the same live socket is refused.
        r = subprocess.run([BIN, "--config", "", "--model", MODEL, "--listen", f"unix:{path}"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "in use" in r.stderr, r.stderr
    finally:
        assert d.stop() == 0
    assert not os.path.exists(path)  # removed on exit


def test_check_config_resolves_the_host():
    r = subprocess.run([BIN, "--config", "", "--listen", "no-such-host.invalid:8080",
                        "--check-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot be resolved" in r.stderr, r.stderr
    r = subprocess.run([BIN, "--config", "", "--listen", "localhost:8080", "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_head_health(server):
    st, h, body = request("HEAD", "/health")
    assert st == 200 and body == b""


# ---- framing -------------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    b"Content-Length: 2\r\nContent-Length: 3\r\n",
    b"Content-Length: 2\r\nContent-Length: 2\r\n",
    b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
])
def test_ambiguous_length_is_400(server, headers):
    port = int(server.rsplit(":", 1)[1])
    out = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n{}")
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert b"Connection: close" in out.partition(b"\r\n\r\n")[0]
    error_of(400, body_of(out), 400)
    assert request("POST", "/v1/completions", GOOD)[0] == 200


# ---- fields --------------------------------------------------------------------

# (Constrained decoding, the prompt's ending, min_tokens, stop_token_ids and
# tools are served now: tests/e2e/test_structured.py, test_prefill.py,
# test_sampling_fields.py, test_tools.py.)
@pytest.mark.parametrize("path,extra,param", [
    ("/v1/completions", {"bad_words": ["x"]}, "bad_words"),
    ("/v1/completions", {"allowed_token_ids": [2]}, "allowed_token_ids"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
])
def test_constraining_fields_refused(server, path, extra, param):
    base = GOOD if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2}
    st, _, body = request("POST", path, dict(base, **extra))
    err = error_of(st, body, 400, param)
    assert "not supported" in err["message"]


@pytest.mark.parametrize("extra", [{"min_tokens": 0}, {"stop_token_ids": []},
                                   {"guided_json": None}, {"modalities": ["text"]},
                                   {"add_generation_prompt": True}, {"metadata": {"k": "v"}},
                                   {"tool_choice": "none"}])
def test_inert_values_accepted(server, extra):
    body = dict({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, **extra)
    st, _, b = request("POST", "/v1/chat/completions", body)
    assert st == 200, b


def test_unknown_fields_logged_once():
    d = Daemon(log_name="dualpathd-unknown")
    try:
        for _ in range(3):
            st, _, body = request("POST", "/v1/completions", dict(GOOD, n_predict=5, zzz_field=1),
                                  base=d.url)
            assert st == 200, body
        log = d.log_text()
        assert log.count("unknown request field 'n_predict'") == 1, log
        assert log.count("unknown request field 'zzz_field'") == 1, log
    finally:
        assert d.stop() == 0


def test_nul_in_strings_refused(server):
    for path, body in (("/v1/completions", b'{"prompt": "Hello\\u0000 world"}'),
                       ("/v1/chat/completions",
                        b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}'),
                       ("/tokenize", b'{"content": "a\\u0000"}')):
        st, _, b = request("POST", path, body)
        assert "NUL" in error_of(st, b, 400)["message"]
    # An escaped backslash followed by "u0000" is text, not a NUL.
    st, _, b = request("POST", "/v1/completions", b'{"prompt": "a\\\\u0000", "max_tokens": 1}')
    assert st == 200, b


@pytest.mark.parametrize("seed,ok", [(2 ** 53 - 1, True), (-(2 ** 53 - 1), True), (2 ** 53, False),
                                     (2 ** 53 + 1, False), (2 ** 64, False), (1.5, False)])
def test_seed_bounds_exact(server, seed, ok):
    st, _, b = request("POST", "/v1/completions", dict(GOOD, seed=seed))
    if ok:
        assert st == 200, b
    else:
        error_of(st, b, 400, "seed")


def test_error_bodies_are_valid_utf8(server):
    """A client string cut inside a UTF-8 sequence, or invalid bytes, still
    give a body that strict JSON decoders accept."""
    for raw_model in (b"\xe2\x82", "é".encode() * 60, b"\xff\xfe", "€".encode() * 40 + b"\xe2"):
        body = b'{"model": "' + raw_model + b'", "prompt": "x"}'
        st, _, b = request("POST", "/v1/completions", body)
        assert st in (400, 404)
        json.loads(b.decode("utf-8", errors="strict"))
    st, _, b = request("GET", "/v1/models/" + "%E2%82" * 3)
    json.loads(b.decode("utf-8", errors="strict"))
    st, _, b = request("GET", "/" + "%C3%A9" * 150)
    assert st == 404
    json.loads(b.decode("utf-8", errors="strict"))


# ---- queue limits --------------------------------------------------------------

def test_max_queue_zero_means_no_limit():
    d = Daemon(["--max-queue", "0"], log_name="dualpathd-q0")
    try:
        st, _, b = request("POST", "/v1/completions", dict(GOOD, n=3), base=d.url)
        assert st == 200, b
    finally:
        assert d.stop() == 0


def test_more_choices_than_the_queue_is_400():
    d = Daemon(["--max-queue", "2"], log_name="dualpathd-q2")
    try:
        st, _, b = request("POST", "/v1/completions", dict(GOOD, n=3), base=d.url)
        assert "queues at most 2" in error_of(st, b, 400, "n")["message"]
        st, _, b = request("POST", "/v1/completions", dict(GOOD, n=2), base=d.url)
        assert st == 200, b
    finally:
        assert d.stop() == 0


def test_metrics_scrape_logged_as_200():
    d = Daemon(["--log-level", "debug"], log_name="dualpathd-accesslog")
    try:
        metrics(d.url)
        wait_for(lambda: "path=/metrics" in d.log_text(), "the access log line")
        line = [l for l in d.log_text().splitlines() if "path=/metrics" in l][-1]
        assert "status=200" in line, line
    finally:
        assert d.stop() == 0


def test_drain_does_not_wait_for_idle_clients():
    """SIGTERM with a client still sending its request body and a kept-alive
    idle one: neither holds the drain (the upload is closed at once, the idle
    one holds no request) until drain_timeout."""
    d = Daemon(["--drain-timeout", "300s", "--header-timeout", "0", "--body-timeout", "0",
                "--idle-timeout", "0"], log_name="dualpathd-drainidle")
    partial = socket.create_connection(("127.0.0.1", d.port))
    partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    kept = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(12).startswith(b"HTTP/1.1 200")
    rc = d.stop(timeout=120)  # bounds a hang; the drain itself ends at once
    assert rc == 0
    assert "drain timeout" not in d.log_text()
    assert closed_by_server(partial) and closed_by_server(kept)
