"""dp_daemon.py: one dualpathd for a loadtest script (early_switch.py,
resume_quality.py): started on a free port with --config "" and the given
flags, waited for until /health answers, JSON posts and /metrics read."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_daemon(a, flags, log):
    """The daemon of one configuration row of a script whose arguments a
    hold bin, model, kv_mib and threads. FLAGS may start with @BINARY (another
    dualpathd, for an A/B of two builds). Returns (daemon, binary, the flags
    without it)."""
    binary = a.bin
    if flags and flags[0].startswith("@"):
        binary, flags = flags[0][1:], flags[1:]
    extra = ["--kv-memory", f"{a.kv_mib}MiB", "--threads", str(a.threads)] + flags
    return Daemon(binary, a.model, extra, log), binary, flags


class Daemon:
    def __init__(self, binary, model, extra, log):
        who = os.path.basename(sys.argv[0])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([binary, "--config", "", "--model", model, "--listen",
                                      f"127.0.0.1:{self.port}", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600  # a hang, not a verdict
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"{who}: the daemon exited; see {log}")
            if time.time() > deadline:
                self.proc.kill()
                sys.exit(f"{who}: the daemon never became healthy; see {log}")
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.2)

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def metrics(self):
        """Every sample of /metrics: {'name{labels}': value}."""
        out = {}
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
        return out

    def metric(self, name):
        """One unlabelled sample (0 when absent)."""
        return self.metrics().get(name, 0.0)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()
