#!/usr/bin/env python3
"""test_e2e.py: runs dp-loadgen against fake_openai.py and checks that its counts
equal the server's, that every misbehaviour is a failure with a reason, and that it
stops within its time limit. Usage: test_e2e.py DP_LOADGEN FAKE_SERVER"""
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time

# A cross build's tests run under an emulator (meson's exe_wrapper, which it
# exports as MESON_EXE_WRAPPER): dp-loadgen, started here, runs under it too.
LOADGEN = shlex.split(os.environ.get("MESON_EXE_WRAPPER", "")) + [sys.argv[1]]
FAKE = sys.argv[2]
TMP = tempfile.mkdtemp(prefix="dp_lg_e2e_")
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, flush=True)


class Fake:
    def __init__(self, *args):
        self.p = subprocess.Popen([sys.executable, FAKE, "--port", "0"] + list(args),
                                  stdout=subprocess.PIPE, text=True)
        self.port = int(self.p.stdout.readline())
        self.url = "http://127.0.0.1:%d" % self.port

    def close(self):
        self.p.kill()
        self.p.wait()


def run(url, *args, timeout=60):
    out = os.path.join(TMP, "r%d.json" % time.monotonic_ns())
    t0 = time.monotonic()
    p = subprocess.run(LOADGEN + ["--base-url", url, "--json", out, "--no-progress"] + list(args),
                       capture_output=True, text=True, timeout=timeout)
    el = time.monotonic() - t0
    # Every run must exit 0: failed requests are results; sanitizer reports make it non-zero.
    check(p.returncode == 0, "dp-loadgen %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr[-2000:]))
    res = None
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
    return p, res, el


def delta(res, name):
    d = res["metrics_scrape"]["delta"]
    return sum(v for k, v in d.items() if k.split("{")[0] == name)


def test_stream_counts():
    s = Fake("--delay-ms", "2")
    try:
        p, r, _ = run(s.url, "-n", "40", "-c", "8", "--warmup", "3", "--input-len", "16:48",
                      "--output-len", "8:24", "--ignore-eos", "--scrape-metrics", "--seed", "3")
        check(p.returncode == 0, "stream: exit 0 (%d: %s)" % (p.returncode, p.stderr))
        check(r["completed"] == 40 and r["failed"] == 0, "stream: 40 completed")
        check(r["token_source"] == "usage", "stream: usage tokens")
        allt = r["all_requests_totals"]
        check(allt["requests"] == 43 and allt["warmup_requests"] == 3, "stream: 43 requests incl. warm-up")
        check(allt["server_prompt_tokens"] == delta(r, "fake_prompt_tokens_total"),
              "stream: prompt tokens equal the server's counter")
        check(allt["server_completion_tokens"] == delta(r, "fake_generation_tokens_total"),
              "stream: completion tokens equal the server's counter")
        check(delta(r, "fake_requests_total") == 43, "stream: server saw 43 requests")
        meas = [q for q in r["requests"] if not q["warmup"]]
        check(r["total_output_tokens"] == sum(q["max_tokens"] for q in meas), "stream: ignore_eos lengths")
        check(r["total_input_tokens"] == sum(q["prompt_words"] for q in meas), "stream: N words = N tokens")
        check(all(q["chunks"] == q["completion_tokens"] for q in meas), "stream: one chunk per token")
        check(r["ttft_samples"] == 40 and r["itl_samples"] == sum(q["chunks"] - 1 for q in meas),
              "stream: TTFT and ITL samples")
        check(0 < r["median_ttft_ms"] < 1000 and r["p99_e2el_ms"] >= r["median_e2el_ms"], "stream: sane latencies")
        check(r["max_concurrency_seen"] == 8, "stream: concurrency 8 reached")
        check("fake_requests_total" in p.stdout and "Server /metrics deltas" in p.stdout, "stream: deltas printed")
        check("fake_uptime_seconds" not in p.stdout.split("deltas")[-1], "stream: only tokens/requests deltas")
    finally:
        s.close()


def test_nonstream_chat_and_sessions():
    s = Fake("--delay-ms", "1", "--crlf")
    try:
        p, r, _ = run(s.url, "--api", "chat", "--no-stream", "-n", "10", "-c", "3", "--input-len", "20",
                      "--output-len", "5", "--scrape-metrics")
        check(p.returncode == 0 and r["completed"] == 10, "nonstream chat: 10 completed")
        check(r["all_requests_totals"]["server_prompt_tokens"] == delta(r, "fake_prompt_tokens_total"),
              "nonstream chat: prompt tokens equal the server's")
        check(r["total_output_tokens"] == 50, "nonstream chat: 50 output tokens")
        check(all(abs(q["ttft_ms"] - q["e2el_ms"]) < 1e-6 for q in r["requests"]), "nonstream: TTFT = E2E")

        p, r, _ = run(s.url, "--api", "chat", "--workload", "chat", "--turns", "3", "-n", "12", "-c", "2",
                      "--input-len", "10", "--output-len", "4", "--ignore-eos", "--scrape-metrics")
        check(p.returncode == 0 and r["completed"] == 12 and r["failed"] == 0, "chat sessions: 12 turns")
        sessions = {}
        for q in r["requests"]:
            sessions.setdefault(q["session"], []).append((q["turn"], q["prompt_tokens"]))
        check(len(sessions) == 4, "chat sessions: 4 sessions of 3 turns")
        for turns in sessions.values():
            turns.sort()
            check([t for t, _ in turns] == [0, 1, 2], "chat sessions: turns 0..2")
            # Each turn resends the history: 10 user words + 4 reply words + 2 per message more.
            check([pt for _, pt in turns] == [12, 12 + 6 + 12, 12 + 2 * (6 + 12)],
                  "chat sessions: the conversation grows (%s)" % turns)
        check(r["all_requests_totals"]["server_prompt_tokens"] == delta(r, "fake_prompt_tokens_total"),
              "chat sessions: prompt tokens equal the server's")

        # Streaming completions on the CRLF server, and a completions-API chat workload.
        p, r, _ = run(s.url, "--workload", "chat", "--turns", "2", "-n", "4", "-c", "2", "--input-len", "5",
                      "--output-len", "3", "--ignore-eos")
        check(p.returncode == 0 and r["completed"] == 4, "chat on /v1/completions: 4 turns")
    finally:
        s.close()


def test_no_usage_and_workloads():
    s = Fake("--delay-ms", "1")
    try:
        p, r, _ = run(s.url, "--no-usage", "-n", "6", "-c", "2", "--input-len", "12", "--output-len", "7",
                      "--ignore-eos")
        check(r["completed"] == 6 and r["token_source"] == "chunks", "no usage: counted from chunks")
        check(r["total_output_tokens"] == 42 and r["total_input_tokens"] == 72, "no usage: 42 chunks, 72 words")
        check("NO server usage" in p.stdout, "no usage: the table says so")

        p, r, _ = run(s.url, "--workload", "prefix", "--prefix-len", "20", "--num-prefixes", "2",
                      "--input-len", "5", "-n", "6", "-c", "3", "--output-len", "2")
        check(r["completed"] == 6 and all(q["prompt_tokens"] == 25 for q in r["requests"]), "prefix: 20 + 5 words")
        # On the chat API the prefix is the system message: 2 more per message.
        p, r, _ = run(s.url, "--api", "chat", "--workload", "prefix", "--prefix-len", "20",
                      "--num-prefixes", "1", "--input-len", "5", "-n", "4", "-c", "2", "--output-len", "2")
        check(r["completed"] == 4 and all(q["prompt_tokens"] == 22 + 7 for q in r["requests"]),
              "prefix on chat: a 20-word system message and a 5-word user turn")

        path = os.path.join(TMP, "prompts.txt")
        with open(path, "w") as f:
            f.write("one two three\n\nfour five\nsix\n")
        p, r, _ = run(s.url, "--workload", "file", "--prompt-file", path, "-n", "3", "--output-len", "2")
        check(sorted(q["prompt_tokens"] for q in r["requests"]) == [1, 2, 3], "file: one prompt per line")
        p, r, _ = run(s.url, "--workload", "corpus", "--prompt-file", path, "-n", "3", "--input-len", "4",
                      "--output-len", "2")
        check(all(q["prompt_tokens"] == 4 for q in r["requests"]), "corpus: windows of 4 words")
        p, r, _ = run(s.url, "--workload", "corpus", "--prompt-file", path, "-n", "3", "--input-len", "4",
                      "--output-len", "2", "--question", "what is it?")
        check(all(q["prompt_tokens"] == 7 for q in r["requests"]), "corpus + question: 4 + 3 words")
        q = subprocess.run(LOADGEN + ["--base-url", s.url, "--workload", "chat", "--question", "x"],
                           capture_output=True, text=True, timeout=10)
        check(q.returncode != 0 and "--question" in q.stderr, "--question refused in chat sessions")

        p, r, el = run(s.url, "--rate", "100", "--burstiness", "0.5", "-n", "30", "--output-len", "2",
                       "--input-len", "4")
        check(r["completed"] == 30 and r["config"]["max_concurrency"] == 0, "rate: 30 completed, unlimited")
        check(0.05 < r["duration"] < 5, "rate: about 0.3 s of arrivals (%.2f)" % r["duration"])
        p, r, el = run(s.url, "-n", "0", "-t", "1.5", "-c", "2", "--output-len", "4", "--input-len", "4")
        check(r["time_limited"] and r["completed"] > 5 and el < 4, "unlimited -n 0 stops at -t")
    finally:
        s.close()


def test_misbehaviour():
    s = Fake("--delay-ms", "2", "--stall-s", "30",
             "--modes", "ok,429,500,nonjson,close_mid,stall,close_before,bad_http")
    try:
        p, r, el = run(s.url, "-n", "16", "-c", "1", "--timeout", "1.5", "-t", "25", "--output-len", "8",
                       "--input-len", "4", "--ignore-eos", "--scrape-metrics")
        check(p.returncode == 0, "misbehaviour: exit 0 (%s)" % p.stderr)
        want = {"http_429": 2, "http_500": 2, "bad_json": 2, "closed_mid_stream": 2, "timeout": 2,
                "closed_before_response": 2, "bad_http": 2}
        check(r["failures_by_reason"] == want, "misbehaviour: reasons %s" % r["failures_by_reason"])
        check(r["completed"] == 2 and r["failed"] == 14, "misbehaviour: 2 ok, 14 failed")
        check(r["completed"] == delta(r, "fake_requests_ok_total"), "misbehaviour: ok equals the server's")
        check(r["failures_by_status"].get("429") == 2 and r["failures_by_status"].get("500") == 2,
              "misbehaviour: by status")
        check("Too many requests" in r["failure_examples"]["http_429"], "misbehaviour: OpenAI error message")
        check(el < 25, "misbehaviour: within the time limit")
        check("Failures by reason" in p.stdout, "misbehaviour: table lists reasons")
    finally:
        s.close()
    # Nobody listening.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    p, r, el = run("http://127.0.0.1:%d" % port, "--model", "m", "-n", "5", "-c", "2", "-t", "10")
    check(p.returncode == 0 and r["failed"] == 5 and r["failures_by_reason"] == {"connect_ECONNREFUSED": 5},
          "refused: 5 connect failures (%s)" % (r and r["failures_by_reason"]))
    check(el < 5, "refused: quick")
    # A server that stalls everything: the time limit ends the run.
    s = Fake("--modes", "stall", "--stall-s", "30")
    try:
        p, r, el = run(s.url, "-n", "4", "-c", "4", "--timeout", "100", "-t", "2")
        check(r["time_limited"] and r["incomplete"] == 4 and r["completed"] == 0, "stall: 4 incomplete")
        check(el < 4.5, "stall: stopped at the time limit (%.1f s)" % el)
    finally:
        s.close()


def test_cli():
    p = subprocess.run(LOADGEN + ["--help"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 0 and "--slo-ttft-ms" in p.stdout and "default" in p.stdout, "--help")
    p = subprocess.run(LOADGEN + ["--rate", "x"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 2, "bad option: exit 2")
    p = subprocess.run(LOADGEN + ["--base-url", "https://x"], capture_output=True, text=True, timeout=10)
    check(p.returncode == 2 and "https" in p.stderr, "https refused")


for t in (test_cli, test_stream_counts, test_nonstream_chat_and_sessions, test_no_usage_and_workloads,
          test_misbehaviour):
    t0 = time.monotonic()
    try:
        t()
    except Exception as e:  # a crash of the test is a failure, with its reason
        check(False, "%s raised %r" % (t.__name__, e))
    print("%-32s %.1f s" % (t.__name__, time.monotonic() - t0), flush=True)

if FAILS:
    print("%d checks failed" % len(FAILS))
    sys.exit(1)
print("test_e2e: ok")
