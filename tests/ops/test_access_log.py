#!/usr/bin/env python3
"""The per-request log line: one line per request on stderr with its id,
HTTP status, prompt/completion tokens, TTFT and duration, and no prompt text
at log_level info (but at debug). Also, where the host has IPv6: serving on
[::1], and on [::] for IPv4 and IPv6 clients alike (dual stack).
Python stdlib only.   usage: test_access_log.py BINARY MODEL"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
SECRET = "zebra quartz marmalade 417"
LINE = re.compile(r"^dualpathd\[info\] request (.*)$")


def have_ipv6():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def free_port(family=socket.AF_INET, host="127.0.0.1"):
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, tmp, name, host, extra=()):
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host, self.port = host, free_port(fam, host)
        listen = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.logpath = os.path.join(tmp, name + ".log")
        # stderr alone: the access log goes there (journald reads it).
        self.log = open(self.logpath, "w")
        self.p = subprocess.Popen([BIN, "--config", "", "--model", MODEL, "--listen", listen,
                                   *extra], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                self.fail(f"exited with {self.p.returncode} during start-up")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        self.fail("no /health within 180 s")

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            hdr = {"Content-Type": "application/json"} if body is not None else {}
            c.request(method, path, body=body if isinstance(body, (str, bytes)) or body is None
                      else json.dumps(body), headers=hdr)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        self.log.close()
        if rc != 0:
            self.fail(f"exit status {rc} after SIGTERM")
        with open(self.logpath) as f:
            return f.read()

    def fail(self, msg):
        if self.p.poll() is None:
            self.p.kill()
        print(f"FAIL: {msg}\n--- daemon stderr ({self.logpath}):", file=sys.stderr)
        with open(self.logpath) as f:
            sys.stderr.write(f.read()[-4000:])
        sys.exit(1)


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def request_lines(log):
    return [fields(m.group(1)) for m in map(LINE.match, log.splitlines()) if m]


def check(cond, msg, log):
    if not cond:
        print(f"FAIL: {msg}\n--- daemon stderr:\n{log[-4000:]}", file=sys.stderr)
        sys.exit(1)


def run(tmp, host):
    d = Daemon(tmp, "info", host)
    st, body = d.request("POST", "/v1/completions",
                         {"prompt": f"Remember this: {SECRET}.", "max_tokens": 8,
                          "temperature": 0})
    if st != 200:
        d.fail(f"completion: HTTP {st}: {body[:200]!r}")
    cmpl = json.loads(body)
    st, body = d.request("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": f"Say {SECRET}"}],
                          "max_tokens": 4, "stream": True})
    if st != 200:
        d.fail(f"stream: HTTP {st}")
    chat_id = re.search(rb'"id":"(chatcmpl-[^"]+)"', body).group(1).decode()
    st, _ = d.request("POST", "/v1/completions", "{not json")
    if st != 400:
        d.fail(f"bad JSON: HTTP {st}, expected 400")
    d.request("GET", "/health")
    log = d.stop()

    lines = request_lines(log)
    by_id = {l.get("id"): l for l in lines}
    one = by_id.get(cmpl["id"])
    check(one is not None, f"no request line for {cmpl['id']}", log)
    check(sum(1 for l in lines if l.get("id") == cmpl["id"]) == 1, "more than one line", log)
    check(one["status"] == "200", f"status {one['status']}", log)
    check(int(one["prompt_tokens"]) == cmpl["usage"]["prompt_tokens"], "prompt_tokens", log)
    check(int(one["completion_tokens"]) == cmpl["usage"]["completion_tokens"],
          "completion_tokens", log)
    check(one["finish"] == cmpl["choices"][0]["finish_reason"], "finish", log)
    ttft, dur = int(one["ttft_ms"]), int(one["duration_ms"])
    check(0 <= ttft <= dur, f"ttft_ms={ttft} duration_ms={dur}", log)
    st_line = by_id.get(chat_id)
    check(st_line is not None and st_line["status"] == "200" and st_line["stream"] == "1"
          and int(st_line["completion_tokens"]) > 0 and st_line["ttft_ms"].isdigit(),
          f"stream line {st_line}", log)
    bad = [l for l in lines if l.get("status") == "400"]
    check(len(bad) == 1, f"{len(bad)} lines with status=400", log)
    check(not any(l.get("path") == "/health" for l in lines), "/health logged at info", log)
    # As a word: a random request id's hex may hold '417'
    # (chatcmpl-...caeca417 failed a run).
    for word in SECRET.split():
        check(not re.search(rf"(?<![0-9A-Za-z]){re.escape(word)}(?![0-9A-Za-z])", log),
              f"prompt text '{word}' in the log at info", log)
    print(f"access log ({host}): {len(lines)} request lines; e.g. request "
          + " ".join(f"{k}={v}" for k, v in one.items()))

    # At debug the prompt may appear (to debug a request), on its own line.
    d = Daemon(tmp, "debug", host, ["--log-level", "debug"])
    d.request("POST", "/v1/completions", {"prompt": f"Remember this: {SECRET}.",
                                          "max_tokens": 2})
    log = d.stop()
    check(re.search(r'^dualpathd\[debug\] request id=cmpl-\S+ prompt=".*marmalade', log, re.M),
          "no prompt line at debug", log)
    print("access log: prompt text only at debug: ok")


def dual_stack(tmp):
    """listen = [::]:PORT takes IPv4 clients as well as IPv6 ones."""
    port = free_port(socket.AF_INET6, "::")
    logpath = os.path.join(tmp, "any.log")
    with open(logpath, "w") as log:
        p = subprocess.Popen([BIN, "--config", "", "--model", MODEL, "--listen", f"[::]:{port}"],
                             stdout=subprocess.DEVNULL, stderr=log)
    try:
        for host in ("127.0.0.1", "::1"):
            deadline = time.monotonic() + 180
            while True:
                try:
                    c = http.client.HTTPConnection(host, port, timeout=5)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or p.poll() is not None:
                    print(f"FAIL: [::]:{port} does not answer on {host}", file=sys.stderr)
                    sys.exit(1)
                time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        if p.wait(timeout=60) != 0:
            print("FAIL: exit status after SIGTERM", file=sys.stderr)
            sys.exit(1)
    finally:
        if p.poll() is None:
            p.kill()
    print("listen [::]: answers on 127.0.0.1 and ::1: ok")


def main():
    host = "::1" if have_ipv6() else "127.0.0.1"
    if host == "127.0.0.1":
        print("access log: no IPv6 on this host; testing on 127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="dualpath-ops-") as tmp:
        run(tmp, host)
        if host == "::1":
            dual_stack(tmp)
    print("access log: all tests passed")


if __name__ == "__main__":
    main()
