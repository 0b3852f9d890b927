#!/usr/bin/env python3
"""systemd integration of dualpathd without systemd: the test owns the
$NOTIFY_SOCKET datagram socket and checks what the daemon sends on it.
  1. STATUS/EXTEND_TIMEOUT_USEC while loading, READY=1 once the socket listens,
     WATCHDOG=1 beats (WATCHDOG_USEC=500000, WATCHDOG_PID = the daemon),
     STOPPING=1 after SIGTERM, exit status 0 after draining.
  2. A stalled engine (test hook DUALPATHD_DEBUG_STALL_AFTER_S) stops the
     beats; the socket is in the abstract namespace ('@name') this time.
Python stdlib only.   usage: test_notify.py BINARY MODEL"""
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
WATCHDOG_USEC = 500000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", "/health")
        return c.getresponse().status
    finally:
        c.close()


class NotifySocket:
    """The service manager's end: records (time, fields) per datagram."""

    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.msgs = []

    def recv_until(self, pred, timeout):
        """Reads datagrams until pred(fields) is true for one; returns it or None."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                return None
            fields = dict(l.split("=", 1) for l in data.decode().split("\n") if "=" in l)
            self.msgs.append((time.monotonic(), fields))
            if pred(fields):
                return fields

    def collect(self, seconds):
        """Every datagram for the next `seconds`."""
        start = len(self.msgs)
        self.recv_until(lambda f: False, seconds)
        return self.msgs[start:]

    def close(self):
        self.sock.close()


def start(notify_addr, port, log, extra_env=None):
    env = dict(os.environ, NOTIFY_SOCKET=notify_addr, WATCHDOG_USEC=str(WATCHDOG_USEC))
    env.update(extra_env or {})
    # systemd sets WATCHDOG_PID to the main pid: a shell that execs keeps its pid.
    cmd = ["sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$0" "$@"', BIN,
           "--config", "", "--model", MODEL, "--listen", f"127.0.0.1:{port}"]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def beats(msgs):
    return [t for t, f in msgs if f.get("WATCHDOG") == "1"]


def fail(msg, logpath):
    print(f"FAIL: {msg}\n--- daemon log ({logpath}):", file=sys.stderr)
    with open(logpath) as f:
        sys.stderr.write(f.read()[-4000:])
    sys.exit(1)


def test_lifecycle(tmp):
    path = os.path.join(tmp, "notify.sock")
    ns = NotifySocket(path)
    port = free_port()
    logpath = os.path.join(tmp, "lifecycle.log")
    with open(logpath, "w") as log:
        p = start(path, port, log)
    try:
        ready = ns.recv_until(lambda f: "READY" in f, 180)
        if ready is None:
            fail(f"no READY=1 (exit status {p.poll()})", logpath)
        # READY=1 means the socket listens: /health answers right away.
        if health(port) != 200:
            fail("READY=1 came before /health answered 200", logpath)
        before = [f for _, f in ns.msgs[:-1]]
        statuses = [f["STATUS"] for f in before if "STATUS" in f]
        if not any(s.startswith("loading model") for s in statuses):
            fail(f"no 'STATUS=loading model' before READY=1: {statuses}", logpath)
        if not any("EXTEND_TIMEOUT_USEC" in f for f in before):
            fail("no EXTEND_TIMEOUT_USEC while loading", logpath)
        if not ready.get("STATUS", "").startswith("serving"):
            fail(f"READY=1 without a 'serving' STATUS: {ready}", logpath)
        got = beats(ns.collect(2.0))
        if len(got) < 3:
            fail(f"{len(got)} WATCHDOG=1 beats in 2 s (WATCHDOG_USEC={WATCHDOG_USEC})", logpath)
        gaps = [b - a for a, b in zip(got, got[1:])]
        print(f"lifecycle: READY=1, {len(got)} beats in 2 s, longest gap {max(gaps):.3f} s")
        p.send_signal(signal.SIGTERM)
        if ns.recv_until(lambda f: f.get("STOPPING") == "1", 30) is None:
            fail("no STOPPING=1 after SIGTERM", logpath)
        rc = p.wait(timeout=60)
        if rc != 0:
            fail(f"exit status {rc} after SIGTERM (expected 0)", logpath)
        print("lifecycle: STOPPING=1, exit 0: ok")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()


def test_stalled_engine(tmp):
    # The abstract namespace: '@' in NOTIFY_SOCKET, a leading NUL in Python.
    name = f"dualpath-ops-test-{os.getpid()}"
    ns = NotifySocket("\0" + name)
    port = free_port()
    logpath = os.path.join(tmp, "stall.log")
    stall_after = 1.5
    with open(logpath, "w") as log:
        p = start("@" + name, port, log, {"DUALPATHD_DEBUG_STALL_AFTER_S": str(stall_after)})
    try:
        if ns.recv_until(lambda f: "READY" in f, 180) is None:
            fail(f"no READY=1 on the abstract socket (exit status {p.poll()})", logpath)
        t_ready = ns.msgs[-1][0]
        msgs = ns.collect(stall_after + 3.5)
        got = beats(msgs)
        healthy = [t for t in got if t - t_ready < stall_after]
        # A beat may still come shortly after the stall (the last heartbeat,
        # one tick late): a second of grace, then none for 2.5 s.
        late = [t for t in got if t - t_ready > stall_after + 1.0]
        if len(healthy) < 2:
            fail(f"only {len(healthy)} beats before the stall", logpath)
        if late:
            fail(f"{len(late)} WATCHDOG=1 beats after the engine stalled", logpath)
        if not any(f.get("STATUS", "").startswith("engine stalled") for _, f in msgs):
            fail("no 'STATUS=engine stalled' after the stall", logpath)
        print(f"stall: {len(healthy)} beats before the stall, none from 1 s to 3.5 s "
              "after it: ok")
        # The stall hook lets engine_stop through, so the daemon still exits cleanly.
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        if rc != 0:
            fail(f"exit status {rc} after SIGTERM with a stalled engine", logpath)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()


def main():
    with tempfile.TemporaryDirectory(prefix="dualpath-ops-") as tmp:
        test_lifecycle(tmp)
        test_stalled_engine(tmp)
    print("notify: all tests passed")


if __name__ == "__main__":
    main()
