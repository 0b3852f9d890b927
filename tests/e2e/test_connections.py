"""Connection handling: the daemon keeps accepting after its connection limit
was reached and the slots freed (idle connections that closed, clients that
half-closed mid-body), and a client that hangs up on a non-streamed request
has its generation cancelled. Verdicts wait on events (a response, a metric),
never on elapsed time; the socket timeouts only bound a hang."""
import json
import socket
import time

from conftest import Daemon, metrics, request

LIMIT = 8


def limited_daemon():
    # Every test client is 127.0.0.1: the per-address cap must not be the limit here.
    return Daemon(extra=["--max-connections", str(LIMIT), "--max-connections-per-ip", str(LIMIT)],
                  log_name="dualpathd-connlimit")


def wait_for(cond):
    # Bounds a hang only; the condition is what decides.
    deadline = time.time() + 120
    while not cond():
        assert time.time() < deadline, "condition never held"
        time.sleep(0.05)


def health(d):
    # Before the fix this never answered: the listen socket stayed out of the
    # event loop. 30 s bounds the hang; the answer comes at once.
    st, _, _ = request("GET", "/health", base=d.url, timeout=30)
    return st


def test_accepts_after_idle_connections_close():
    d = limited_daemon()
    try:
        for _ in range(3):
            socks = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(LIMIT)]
            # A request on the last one proves all of them were accepted.
            socks[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            socks[-1].settimeout(30)
            assert socks[-1].recv(12).startswith(b"HTTP/1.1 200")
            for s in socks:
                s.close()
            assert health(d) == 200
    finally:
        assert d.stop() == 0


def test_accepts_after_half_close_burst():
    d = limited_daemon()
    body = b'{"prompt": "Hello", "max_tokens": 4}'
    part = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body[:7]
    try:
        socks = []
        for _ in range(600):
            s = socket.create_connection(("127.0.0.1", d.port))
            s.sendall(part)
            s.shutdown(socket.SHUT_WR)
            socks.append(s)
        assert health(d) == 200
        # Every half-closed request was closed by the server (EOF on our side).
        # Every half-closed request was closed by the server: reading reaches
        # end-of-file (a recv timeout would mean a slot still held).
        for s in socks:
            s.settimeout(30)
            while s.recv(4096):
                pass
            s.close()
        st, _, b = request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2},
                           base=d.url)
        assert st == 200, b
        assert health(d) == 200
    finally:
        # Nothing is left for the drain to wait on.
        assert d.stop() == 0


def test_hangup_cancels_non_streamed_request(server):
    before = metrics().get('dualpath_requests_finished_total{reason="cancelled"}', 0)
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 1000,
                       "ignore_eos": True, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", int(server.rsplit(":", 1)[1])))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    # Wait until it runs, then hang up without reading the answer.
    wait_for(lambda: metrics().get("dualpath_requests_running", 0) >= 1)
    s.close()
    wait_for(lambda: metrics().get('dualpath_requests_finished_total{reason="cancelled"}', 0) > before)
    m = metrics()
    assert m['dualpath_requests_finished_total{reason="cancelled"}'] == before + 1


def test_stream_hangups_free_their_slots():
    """A client that closes a stream mid-answer frees its connection slot:
    the generation is cancelled and the stream ends. With 2 slots, three
    abandoned streams and then /health prove none is left parked."""
    d = Daemon(extra=["--max-connections", "2"], log_name="dualpathd-stream-hangup")
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 500, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    try:
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", d.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            s.settimeout(30)
            got = b""
            while b"data: {" not in got:  # the first token arrived
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
            s.close()
        assert health(d) == 200
        wait_for(lambda: metrics(base=d.url)["dualpath_requests_running"] == 0)
        assert metrics(base=d.url)['dualpath_requests_finished_total{reason="cancelled"}'] == 3
    finally:
        assert d.stop() == 0
