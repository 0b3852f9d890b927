"""The bad-input matrix: hostile or broken requests at the HTTP and JSON
level, each sent while a healthy greedy stream runs on another connection.
Each case must get its clear answer (a status from an allowed set, with an
OpenAI error body when the daemon wrote it) or be closed; the stream must
finish with exactly the text it produces alone; and a normal request right
after must succeed. Field-by-field type errors are in test_errors.py; the
200-connection slowloris is in test_hardening.py."""
import json
import socket
import threading

import pytest

from conftest import request

STREAM = {"prompt": "The three primary colors are", "max_tokens": 24, "temperature": 0,
          "stream": True, "ignore_eos": True}
GOOD = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
CLOSED = "closed"


def port_of(server):
    return int(server.rsplit(":", 1)[1])


def stream_text(port, out):
    """Runs STREAM on its own connection; out[0] = the concatenated text."""
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    body = json.dumps(STREAM).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    text = ""
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {"):
            ch = json.loads(line[6:])["choices"]
            if ch:
                text += ch[0]["text"]
    out[0] = (buf.split(b"\r\n", 1)[0], text, b"data: [DONE]" in buf)


@pytest.fixture(scope="module")
def alone(server):
    out = [None]
    stream_text(port_of(server), out)
    assert out[0][0].startswith(b"HTTP/1.1 200") and out[0][2]
    return out[0][1]


def exchange(port, data, read_timeout=30):
    """Sends data (bytes, or a list of pieces) and reads until the server
    closes or a whole response is in; returns the bytes or CLOSED."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    out = b""
    try:
        for piece in data if isinstance(data, list) else [data]:
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # answered (and closed) before all of it went out
        while True:
            try:
                d = s.recv(65536)
            except ConnectionResetError:
                break
            if not d:
                break
            out += d
            head, sep, rest = out.partition(b"\r\n\r\n")
            if sep and b"\r\ncontent-length:" in head.lower():
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if len(rest) >= int(cl[0].split(b":")[1]):
                    break
    finally:
        s.close()
    return out or CLOSED


def post(path, body, extra=b"", version=b"HTTP/1.1"):
    if isinstance(body, str):
        body = body.encode()
    return (b"POST " + path.encode() + b" " + version + b"\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


def chunked(path, pieces):
    out = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    for p in pieces:
        out += b"%x\r\n%s\r\n" % (len(p), p)
    return out + b"0\r\n\r\n"


C, CH = "/v1/completions", "/v1/chat/completions"
BIG = b"a" * (10 << 20)
DEEP = b'{"prompt": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}"
DEEP_OBJ = b'{"prompt": "x", "x": ' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}"

# (name, bytes to send, allowed statuses (or CLOSED), MHD may answer itself)
CASES = [
    ("empty body", post(C, b""), {400}, False),
    ("truncated json", post(C, b'{"prompt": "Hel'), {400}, False),
    ("truncated json chat", post(CH, b'{"messages": [{"role": "user", "content"'), {400}, False),
    ("array body", post(C, b"[]"), {400}, False),
    ("string body", post(C, b'"prompt"'), {400}, False),
    ("number body", post(C, b"42"), {400}, False),
    ("null body", post(C, b"null"), {400}, False),
    ("true body", post(CH, b"true"), {400}, False),
    ("trailing garbage", post(C, b'{"prompt": "x"} xyz'), {400}, False),
    ("two objects", post(C, b'{"prompt": "x"}{"prompt": "y"}'), {400}, False),
    ("1000-deep arrays", post(C, DEEP), {400}, False),
    ("1000-deep objects", post(C, DEEP_OBJ), {400}, False),
    ("5000 open braces", post(C, b"{" * 5000), {400}, False),
    ("invalid utf-8 prompt", post(C, b'{"prompt": "\xff\xfe\xc0\xaf", "max_tokens": 2}'), {200}, False),
    ("split utf-8 prompt", post(C, b'{"prompt": "caf\xc3", "max_tokens": 2}'), {200}, False),
    ("lone high surrogate", post(C, b'{"prompt": "a\\ud800b", "max_tokens": 2}'), {400}, False),
    ("lone low surrogate", post(C, b'{"prompt": "a\\udc00b", "max_tokens": 2}'), {400}, False),
    ("nul escape", post(C, b'{"prompt": "a\\u0000b"}'), {400}, False),
    ("raw nul byte in body", post(C, b'{"prompt": "a\x00b"}'), {400}, False),
    ("invalid utf-8 model", post(C, b'{"model": "\xe2\x82", "prompt": "x"}'), {404}, False),
    ("token id too large", post(C, b'{"prompt": [999999]}'), {400}, False),
    ("token id negative", post(C, b'{"prompt": [-1]}'), {400}, False),
    ("token id fraction", post(C, b'{"prompt": [1.5]}'), {400}, False),
    ("token id huge float", post(C, b'{"prompt": [1e300]}'), {400}, False),
    ("logit_bias id out of range", post(C, b'{"prompt": "x", "logit_bias": {"999999": 1}}'),
     {400}, False),
    ("detokenize out of range", post("/detokenize", b'{"tokens": [999999]}'), {400}, False),
    ("max_tokens 2^64", post(C, b'{"prompt": "x", "max_tokens": 18446744073709551616}'),
     {400}, False),
    ("temperature nan literal", post(C, b'{"prompt": "x", "temperature": NaN}'), {400}, False),
    ("10 MB body with Content-Length", post(C, BIG), {413}, False),
    ("10 MB chunked upload", chunked(C, [BIG[i:i + 65536] for i in range(0, len(BIG), 65536)]),
     {413}, False),
    ("chunked upload ok", chunked(C, [b'{"prompt": ', b'"Hello", "max_tokens": 2}']), {200}, False),
    ("bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", {400, CLOSED}, True),
    ("body shorter than Content-Length",
     [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\""],
     {CLOSED}, False),  # then the client half-closes below
    ("two Content-Lengths", post(C, b"{}", extra=b"Content-Length: 9\r\n"), {400}, False),
    ("Content-Length and chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", {400}, False),
    ("malformed Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 12abc\r\n\r\n{}", {400, CLOSED}, True),
    ("negative Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: -5\r\n\r\n{}", {400, CLOSED}, True),
    ("1000 headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" +
     b"".join(b"X-H%d: v\r\n" % i for i in range(1000)) + b"\r\n", {200, 400, 413, 431, CLOSED}, True),
    ("100 KB header", b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 100000 + b"\r\n\r\n",
     {400, 413, 431, CLOSED}, True),
    ("100 KB url", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     {400, 404, 414, CLOSED}, True),
    ("garbage request line", b"\x00\x01\x02 garbage\r\n\r\n", {400, CLOSED}, True),
    ("no version", b"GET /health\r\n\r\n", {400, 505, CLOSED}, True),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400, 404, 405, 505, CLOSED}, True),
    ("HTTP/1.0 completion", post(C, json.dumps(GOOD), version=b"HTTP/1.0"), {200}, False),
    ("HTTP/1.0 health", b"GET /health HTTP/1.0\r\n\r\n", {200}, False),
    ("header without colon", b"GET /health HTTP/1.1\r\nHost: x\r\nbroken\r\n\r\n",
     {200, 400, CLOSED}, True),
    ("nul in header", b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", {200, 400, CLOSED}, True),
    ("expect 100-continue", post(C, json.dumps(GOOD),
                                 extra=b"Expect: 100-continue\r\nConnection: close\r\n"),
     {100, 200}, False),
    ("wrong content type", post(C, json.dumps(GOOD)).replace(b"application/json", b"text/plain"),
     {200}, False),
    ("tokenize non-object", post("/tokenize", b"[1]"), {400}, False),
    ("percent-encoded nul in url", b"GET /v1/models/%00x HTTP/1.1\r\nHost: x\r\n\r\n",
     {400, 404}, False),
]


def status_of(resp):
    if resp == CLOSED:
        return CLOSED
    line = resp.split(b"\r\n", 1)[0].split(b" ")
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else line


def check_answer(name, resp, allowed, mhd):
    st = status_of(resp)
    if st == 100:  # then the real answer
        resp = resp.split(b"\r\n\r\n", 1)[1]
        st = status_of(resp)
    assert st in allowed, (name, resp[:300] if resp != CLOSED else resp)
    if st != CLOSED and st >= 400:
        head, _, body = resp.partition(b"\r\n\r\n")
        if b"application/json" in head.lower():
            err = json.loads(body.decode("utf-8", errors="strict"))["error"]
            assert err["message"] and err["type"], (name, err)
        else:
            assert mhd, (name, resp[:300])  # only libmicrohttpd's own framing errors


@pytest.mark.parametrize("name,data,allowed,mhd", CASES, ids=[c[0] for c in CASES])
def test_bad_input_beside_a_stream(server, alone, name, data, allowed, mhd):
    port = port_of(server)
    out = [None]
    t = threading.Thread(target=stream_text, args=(port, out))
    t.start()
    if name == "body shorter than Content-Length":
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(data[0])
        s.shutdown(socket.SHUT_WR)  # the body never comes: the server must let go
        s.settimeout(60)
        try:
            got = s.recv(4096)
        except ConnectionResetError:
            got = b""
        s.close()
        resp = got or CLOSED
    else:
        resp = exchange(port, data)
    check_answer(name, resp, allowed, mhd)
    t.join(timeout=300)
    assert out[0] is not None, "the stream never ended"
    status, text, done = out[0]
    assert status.startswith(b"HTTP/1.1 200") and done, (name, out[0])
    assert text == alone, (name, text, alone)
    st, _, b = request("POST", "/v1/completions", GOOD)
    assert st == 200, (name, b)


def test_pipelined_requests(server):
    """Three requests in one write on one connection: three answers in order."""
    port = port_of(server)
    body = json.dumps(GOOD).encode()
    one = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    last = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(one + one + last)
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    assert buf.count(b"HTTP/1.1 200") == 3, buf[:500]
    assert buf.rindex(b'{"status":"ok"}') > buf.rindex(b'"text_completion"')


METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]
PATHS = ["/health", "/metrics", "/v1/models", "/v1/models/x", "/v1/completions",
         "/v1/chat/completions", "/tokenize", "/detokenize", "/", "/v1", "/nope"]


def test_every_method_on_every_path(server):
    """No combination crashes or gets a 5xx; known paths answer 405 with
    Allow for a method they do not take, unknown ones 404."""
    port = port_of(server)
    for m in METHODS:
        for p in PATHS:
            body = b"{}" if m in ("POST", "PUT", "PATCH") else b""
            data = (m.encode() + b" " + p.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            resp = exchange(port, data)
            assert resp != CLOSED, (m, p)
            st = status_of(resp)
            assert isinstance(st, int) and st < 500, (m, p, resp[:200])
            if st == 405:
                assert b"\r\nAllow: " in resp.partition(b"\r\n\r\n")[0], (m, p)
    assert request("POST", "/v1/completions", GOOD)[0] == 200
