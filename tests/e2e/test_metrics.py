"""/metrics: the exposition format passes promtool, and a real Prometheus
server scrapes it."""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from conftest import HANG_S, free_port, metrics, request


def _ensure_prometheus():
    if shutil.which("promtool") and shutil.which("prometheus"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "prometheus"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return bool(shutil.which("promtool") and shutil.which("prometheus"))


def test_metrics_content(server):
    request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    st, h, body = request("GET", "/metrics")
    assert st == 200 and h["Content-Type"].startswith("text/plain; version=0.0.4")
    m = metrics()
    for k in ("dualpath_requests_running", "dualpath_requests_waiting",
              'dualpath_kv_blocks_used{pool="prefill"}', 'dualpath_kv_blocks_capacity{pool="prefill"}',
              "dualpath_prompt_tokens_total", "dualpath_generation_tokens_total",
              "dualpath_preemptions_total", "dualpath_time_to_first_token_seconds_count",
              "dualpath_inter_token_latency_seconds_count", "dualpath_e2e_request_latency_seconds_count",
              'dualpath_http_responses_total{code="200"}'):
        assert k in m, k
    assert m["dualpath_generation_tokens_total"] >= 2
    assert m["dualpath_e2e_request_latency_seconds_count"] >= 1
    # Build info names the backend the model runs on and the CPU kernels the
    # start-up dispatch chose (DP_CPU_LEVEL can force a lower level).
    info = [k for k in m if k.startswith("dualpath_build_info{")]
    assert len(info) == 1 and 'backend="cpu"' in info[0]
    want = os.environ.get("DP_CPU_LEVEL")
    assert re.search(r'kernels="(avx512|avx2|baseline)"', info[0]), info[0]
    if want in ("avx2", "baseline"):
        assert f'kernels="{want}"' in info[0], info[0]
    assert 'matmul="int8"' in info[0] or 'matmul="exact"' in info[0], info[0]
    assert not any('pool="kv"' in k for k in m)  # the single-pool label is gone
    # Every token of a finished request was sampled from one source (device
    # candidates on the CPU backend too; a request still running counts in
    # the sources only); CUDA graph counters exist and stay 0 on the CPU.
    src = [m['dualpath_engine_sampled_rows_total{source="%s"}' % s]
           for s in ("candidates", "fallback", "full_row")]
    assert sum(src) >= m["dualpath_generation_tokens_total"], src
    assert src[0] > 0
    for ev in ("recorded", "replayed", "abandoned"):
        assert m['dualpath_engine_graph_steps_total{event="%s"}' % ev] == 0
    # The decode pool is there exactly when the server runs the dual path.
    if 'dualpath_kv_blocks_capacity{pool="decode"}' in m:
        assert m['dualpath_kv_blocks_capacity{pool="decode"}'] > 0
        assert 'dualpath_kv_blocks_used{pool="decode"}' in m


def test_promtool_check_metrics(server):
    if not _ensure_prometheus():
        pytest.skip("promtool is not installed and the Debian package 'prometheus' "
                    "could not be installed")
    _, _, body = request("GET", "/metrics")
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    assert not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).decode()  # no lint warnings


def test_prometheus_scrape(server):
    if not _ensure_prometheus():
        pytest.skip("prometheus is not installed and the Debian package 'prometheus' "
                    "could not be installed")
    u = urllib.parse.urlparse(server)
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: dualpath\n    static_configs:\n"
                    f"      - targets: ['{u.hostname}:{u.port}']\n")
        log = open(os.path.join(d, "prom.log"), "w")
        p = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={d}/data",
                              f"--web.listen-address=127.0.0.1:{port}"],
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + HANG_S  # bounds a hang only
            value = None
            while time.time() < deadline and value is None:
                time.sleep(0.5)
                assert p.poll() is None, open(os.path.join(d, "prom.log")).read()[-2000:]
                try:
                    q = urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/api/v1/query?query=dualpath_requests_running",
                        timeout=5)
                    res = json.load(q)
                except OSError:
                    continue
                if res.get("status") == "success" and res["data"]["result"]:
                    value = res["data"]["result"][0]["value"][1]
            assert value is not None, "Prometheus never returned dualpath_requests_running"
            assert float(value) >= 0
            t = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5))
            health = [a["health"] for a in t["data"]["activeTargets"]]
            assert health == ["up"], t
        finally:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()
