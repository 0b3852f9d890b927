"""Fixtures for the end-to-end tests: a running dualpathd (started by run.sh
and named by DUALPATHD_URL, or started here), and a way to start extra
daemons with other flags (429 and drain tests)."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse

import pytest

# A bound on a hang, never a verdict on speed: under ASan on a busy 2-core
# machine one long request can take minutes.
HANG_S = 900

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DUALPATHD_BIN", os.path.join(ROOT, "build", "daemon", "dualpathd"))
MODEL = os.environ.get("DUALPATHD_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def listening_url(proc, log_path):
    """The URL a daemon started with --listen 127.0.0.1:0 logs once it
    listens (the kernel picked the port: no other process can take it
    between a pick and the bind)."""
    deadline = time.time() + HANG_S  # bounds a hang only
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dualpathd exited with {proc.returncode}; see {log_path}")
        with open(log_path, errors="replace") as f:
            m = re.search(r"serve: listening on (http://127\.0\.0\.1:\d+)", f.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"dualpathd never said where it listens; see {log_path}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (listen = unix:/PATH)."""

    def __init__(self, path, timeout=HANG_S):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Daemon:
    """A dualpathd of its own (model: another GGUF than the default); unix_path:
    listen there instead of TCP. The health probe sends health_headers (an
    API key when /health needs one)."""

    def __init__(self, extra=(), log_name="dualpathd", unix_path=None, health_headers=None,
                 model=None):
        # TCP on port 0 (listening_url): test.sh runs two suites at once.
        self.unix_path = unix_path
        self.port = None
        self.url = None
        fd, self.log_path = tempfile.mkstemp(prefix=f"{log_name}-", suffix=".log",
                                             dir=os.environ.get("DUALPATHD_LOGDIR", "/tmp"))
        self.log = os.fdopen(fd, "w")
        listen = f"unix:{unix_path}" if unix_path else "127.0.0.1:0"
        self.proc = subprocess.Popen(
            [BIN, "--config", "", "--model", model or MODEL, "--listen", listen, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        if not unix_path:
            self.url = listening_url(self.proc, self.log_path)
            self.port = int(self.url.rsplit(":", 1)[1])
        deadline = time.time() + HANG_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dualpathd exited with {self.proc.returncode}; see {self.log_path}")
            try:
                st, _, _ = self.request("GET", "/health", headers=health_headers, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError("dualpathd did not become healthy")

    def request(self, method, path, body=None, headers=None, timeout=HANG_S):
        if not self.unix_path:
            return request(method, path, body, headers, base=self.url, timeout=timeout)
        return exchange(UnixHTTPConnection(self.unix_path, timeout=timeout), method, path, body,
                        headers)

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        return rc


def request(method, path, body=None, headers=None, base=None, timeout=HANG_S):
    """One HTTP request on a fresh connection; returns (status, headers, body bytes)."""
    u = urllib.parse.urlparse(base or os.environ["DUALPATHD_URL"])
    return exchange(http.client.HTTPConnection(u.hostname, u.port, timeout=timeout), method, path,
                    body, headers)


def exchange(c, method, path, body=None, headers=None):
    """One request on connection c (closed after); (status, headers, body bytes)."""
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def hold_stream(path, body, base=None):
    """Starts a streamed request and returns its connection once its first
    token has arrived (for a dual-path request: once it has migrated); the
    request runs until the caller closes the connection."""
    u = urllib.parse.urlparse(base or os.environ["DUALPATHD_URL"])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    c.request("POST", path, json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    while True:
        line = r.readline()
        assert line, "the stream ended early"
        if line.startswith(b"data: ") and (b'"content"' in line or b'"text"' in line):
            return c


def parallel(fn, n):
    """fn(0) .. fn(n - 1), each in its own thread, all at once; their results
    in order. An exception in any of them is raised here."""
    out, errors = [None] * n, []

    def run(i):
        try:
            out[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return out


def metrics(base=None):
    st, _, body = request("GET", "/metrics", base=base)
    assert st == 200
    out = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def chat(body):
    """POST /v1/chat/completions on the shared daemon: (status, decoded body)."""
    st, _, raw = request("POST", "/v1/chat/completions", body)
    return st, json.loads(raw)


def complete_greedy(prompt, n):
    """A greedy completion of n tokens of prompt (must succeed), decoded."""
    st, _, raw = request("POST", "/v1/completions",
                         {"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert st == 200, raw
    return json.loads(raw)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "heavy: many or long requests; run against the release daemon only "
        "(test.sh deselects them for the ASan daemon, whose unit tests cover the same engine paths)")


@pytest.fixture(scope="session")
def server():
    """Base URL of the shared daemon."""
    if os.environ.get("DUALPATHD_URL"):
        yield os.environ["DUALPATHD_URL"]
        return
    d = Daemon()
    os.environ["DUALPATHD_URL"] = d.url
    yield d.url
    assert d.stop() == 0


@pytest.fixture(scope="session")
def q8_server():
    """Base URL of a daemon whose decode path is q8_0 (the CPU's default is
    kivi4): its compactions are copies in decode blocks of 30 tokens, shared
    as kept shares and system-prompt shares."""
    d = Daemon(extra=["--decode-kv-type", "q8_0"], log_name="dualpathd-q8_0")
    yield d.url
    assert d.stop() == 0


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=HANG_S)


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id
