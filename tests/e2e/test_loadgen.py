"""dp-loadgen against the real daemon: a few seconds of load whose token
counts must equal the server's own (usage in every response, and the
/metrics counters scraped before and after)."""
import json
import os
import subprocess
import tempfile

import pytest

from conftest import BIN, Daemon

LOADGEN = os.environ.get(
    "DP_LOADGEN",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(BIN))), "loadtest", "dp-loadgen"))


def run_loadgen(url, *args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        p = subprocess.run([LOADGEN, "--base-url", url, "--json", out, "--scrape-metrics",
                            "--no-progress", "-t", "120", *args],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr + p.stdout
        with open(out) as f:
            return json.load(f), p.stdout
    finally:
        os.unlink(out)


def counter(scrape, name):
    return scrape["delta"].get(name, 0.0)


@pytest.mark.heavy
def test_loadgen_counts_match_server():
    assert os.access(LOADGEN, os.X_OK), f"{LOADGEN} is not built"
    d = Daemon(log_name="dualpathd-loadgen")
    try:
        for api, extra in (("completions", ["--stream"]), ("chat", ["--no-stream"])):
            rep, table = run_loadgen(d.url, "--api", api, "-n", "12", "-c", "4", "--warmup", "2",
                                     "--input-len", "64", "--output-len", "16", "--ignore-eos",
                                     *extra)
            print(table)
            assert rep["completed"] == 12 and rep["failed"] == 0, rep
            assert rep["token_source"] == "usage"
            assert rep["total_output_tokens"] == 12 * 16
            allr = rep["all_requests_totals"]
            assert allr["requests"] == 14  # warm-up included
            scrape = rep["metrics_scrape"]
            # The server's counters moved by exactly what its responses reported.
            assert counter(scrape, "dualpath_prompt_tokens_total") == allr["server_prompt_tokens"]
            assert counter(scrape, "dualpath_generation_tokens_total") == \
                allr["server_completion_tokens"]
            assert allr["server_completion_tokens"] == 14 * 16
    finally:
        assert d.stop() == 0
