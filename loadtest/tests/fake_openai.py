#!/usr/bin/env python3
"""fake_openai.py: a small OpenAI-compatible server for dp-loadgen's tests (standard
library only). It streams tokens with delays, counts usage, and misbehaves on request.

Misbehaviour: the request body's "fake_mode", or --modes (a comma list cycled over
requests): ok, stall, nonjson, close_mid, close_before, bad_http, 429, 500, nousage.
It prints its port on the first stdout line."""
import argparse
import json
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTERS = {"requests": 0, "ok": 0, "prompt_tokens": 0, "completion_tokens": 0}
CYCLE = {"i": 0, "modes": ["ok"]}
ARGS = None


def next_mode(body):
    if isinstance(body, dict) and isinstance(body.get("fake_mode"), str):
        return body["fake_mode"]
    with LOCK:
        m = CYCLE["modes"][CYCLE["i"] % len(CYCLE["modes"])]
        CYCLE["i"] += 1
    return m


def count_prompt(body, chat):
    if chat:
        # Every message's words plus 2 per message for the template, like a real server adds.
        return sum(len(str(m.get("content", "")).split()) + 2 for m in body.get("messages", []))
    return len(str(body.get("prompt", "")).split())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Without this, Nagle + delayed ACK add 40 ms to the first token.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *a):
        pass

    def send_json(self, code, obj, close=False):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.endswith("/models"):
            self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        elif self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/metrics":
            with LOCK:
                c = dict(COUNTERS)
            text = (
                "# HELP fake_requests_total Requests received.\n# TYPE fake_requests_total counter\n"
                f"fake_requests_total {c['requests']}\n"
                f"fake_requests_ok_total {c['ok']}\n"
                f'fake_prompt_tokens_total{{model="fake-model"}} {c["prompt_tokens"]}\n'
                f'fake_generation_tokens_total{{model="fake-model"}} {c["completion_tokens"]}\n'
                "fake_latency_seconds_bucket{le=\"+Inf\"} 0\nfake_uptime_seconds 12.5\n"
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(404, {"error": {"message": "no such path", "type": "not_found"}})

    def chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def sse(self, obj):
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self.chunk("data: " + text + ARGS.eol + ARGS.eol)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self.send_json(400, {"error": {"message": "bad JSON body", "type": "invalid_request_error"}})
            return
        chat = self.path.endswith("/chat/completions")
        if not chat and not self.path.endswith("/completions"):
            self.send_json(404, {"error": {"message": "no such path"}})
            return
        mode = next_mode(body)
        with LOCK:
            COUNTERS["requests"] += 1
        if mode == "429":
            self.send_json(429, {"error": {"message": "Too many requests, slow down", "type": "rate_limit"}})
            return
        if mode == "500":
            self.send_json(500, {"error": {"message": "internal engine failure", "type": "server_error"}})
            return
        if mode == "stall":
            time.sleep(ARGS.stall_s)
            self.close_connection = True
            return
        if mode == "close_before":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "bad_http":
            self.wfile.write(b"garbage that is not HTTP\r\n\r\n")
            self.close_connection = True
            return
        if mode == "nonjson":
            data = b"<html>upstream proxy error</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        ptoks = count_prompt(body, chat)
        ntok = int(body.get("max_tokens", 16))
        if not body.get("ignore_eos") and ARGS.eos_after:
            ntok = min(ntok, ARGS.eos_after)
        stream = bool(body.get("stream"))
        usage_ok = mode != "nousage"
        want_usage = usage_ok and (not stream or (body.get("stream_options") or {}).get("include_usage"))
        usage = {"prompt_tokens": ptoks, "completion_tokens": ntok, "total_tokens": ptoks + ntok}
        if not stream:
            time.sleep(ARGS.delay_ms * ntok / 1000.0)
            text = " ".join("tok%d" % i for i in range(ntok))
            choice = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            obj = {"id": "x", "object": "text_completion", "model": "fake-model", "choices": [choice]}
            if want_usage:
                obj["usage"] = usage
            with LOCK:
                COUNTERS["ok"] += 1
                COUNTERS["prompt_tokens"] += ptoks
                COUNTERS["completion_tokens"] += ntok
            self.send_json(200, obj)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.chunk(": ping" + ARGS.eol + ARGS.eol)
        for i in range(ntok):
            time.sleep(ARGS.delay_ms / 1000.0)
            if mode == "close_mid" and i == min(3, ntok - 1):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            piece = ("tok%d" % i) if i == 0 else (" tok%d" % i)
            last = i == ntok - 1
            if chat:
                ch = {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if last else None}
            else:
                ch = {"index": 0, "text": piece, "finish_reason": "length" if last else None}
            self.sse({"id": "x", "object": "chunk", "model": "fake-model", "choices": [ch]})
        # Counted before the stream ends: a client that scrapes /metrics as
        # soon as its last response is complete must see it.
        with LOCK:
            COUNTERS["ok"] += 1
            COUNTERS["prompt_tokens"] += ptoks
            COUNTERS["completion_tokens"] += ntok
        if want_usage:
            self.sse({"id": "x", "object": "chunk", "model": "fake-model", "choices": [], "usage": usage})
        self.sse("[DONE]")
        self.chunk(b"")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # clients that hang up (timeouts, the close_before mode) are expected here


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--modes", default="ok")
    ap.add_argument("--stall-s", type=float, default=60.0)
    ap.add_argument("--eos-after", type=int, default=0, help="stop early unless ignore_eos")
    ap.add_argument("--crlf", action="store_true", help="CRLF line ends in the event stream")
    ARGS = ap.parse_args()
    ARGS.eol = "\r\n" if ARGS.crlf else "\n"
    CYCLE["modes"] = ARGS.modes.split(",")
    srv = Server(("127.0.0.1", ARGS.port), Handler)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
