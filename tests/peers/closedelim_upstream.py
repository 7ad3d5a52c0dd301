#!/usr/bin/env python3
"""An OpenAI-shaped upstream whose answers are close-delimited.

Every answer has neither Content-Length nor Transfer-Encoding: the body ends
when the server closes the connection (RFC 9112 section 6.3, item 8). That is
what HTTP/1.0 servers and simple scripts do, and what the gateway must read
exactly once. Built on python3's http.server, a peer infergate did not write.

    closedelim_upstream.py [--host 127.0.0.1] [--port 0] [--http 1.0|1.1]
                           [--bare] [--model tiny] [--tokens 4] [--token-delay-ms 20]
                           [--flap-s N] [--flap-mode refuse|503] [--max-s S]

Prints "listening on HOST:PORT" on stdout once it accepts connections (with
--port 0 the port is the kernel's choice). Routes:

  GET /health             {"status":"ok"}
  GET /v1/models          {"object":"list","data":[{"id":MODEL,...}]}
  POST /v1/completions    a completion; "stream": true gives SSE events and
  POST /v1/chat/completions                     data: [DONE], then the close
  anything else           404 (so /load marks it as no infergate peer)

--flap-s N toggles the server up and down every N seconds, starting up:
with --flap-mode refuse (the default) the listener is closed while down
(connections are refused), with 503 it answers 503 to everything. Each
change prints "up" or "down" on stdout. --max-s S exits after S seconds
(0: run until killed), so that a forgotten peer does not stay behind.
"""

import argparse
import http.server
import json
import socket
import sys
import threading
import time


class Peer:
    def __init__(self, args):
        self.args = args
        self.down = False  # 503 mode only: answering 503 now


def make_handler(peer):
    args = peer.args

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/%s" % args.http
        server_version = "closedelim/1"

        def log_message(self, fmt, *a):
            if args.verbose:
                sys.stderr.write("closedelim: " + (fmt % a) + "\n")

        def start(self, status, ctype):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if args.http == "1.1" and not args.bare:
                # HTTP/1.1 without a length must close (RFC 9112 6.3); --bare
                # leaves the header out, the close alone ends the body.
                self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def answer(self, status, doc):
            self.start(status, "application/json")
            self.wfile.write(json.dumps(doc).encode())
            self.wfile.flush()

        def do_GET(self):
            if peer.down:
                return self.answer(503, {"error": {"message": "down", "type": "unavailable"}})
            if self.path == "/health":
                return self.answer(200, {"status": "ok"})
            if self.path == "/v1/models":
                return self.answer(200, {"object": "list", "data": [
                    {"id": args.model, "object": "model", "owned_by": "closedelim"}]})
            return self.answer(404, {"error": {"message": "not found", "type": "not_found"}})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n > 0 else b""
            if peer.down:
                return self.answer(503, {"error": {"message": "down", "type": "unavailable"}})
            chat = self.path == "/v1/chat/completions"
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.answer(404, {"error": {"message": "not found", "type": "not_found"}})
            try:
                req = json.loads(raw or b"{}")
            except ValueError:
                return self.answer(400, {"error": {"message": "bad json", "type": "invalid"}})
            ntok = int(req.get("max_tokens") or args.tokens)
            ntok = max(1, min(ntok, args.tokens))
            words = ["tok%d " % i for i in range(ntok)]
            created = int(time.time())
            if req.get("stream"):
                self.start(200, "text/event-stream")
                if chat:
                    first = {"id": "cd-1", "object": "chat.completion.chunk", "created": created,
                             "model": args.model, "choices": [
                                 {"index": 0, "delta": {"role": "assistant"},
                                  "finish_reason": None}]}
                    self.wfile.write(b"data: " + json.dumps(first).encode() + b"\n\n")
                for i, w in enumerate(words):
                    last = i == len(words) - 1
                    if chat:
                        ch = {"index": 0, "delta": {"content": w},
                              "finish_reason": "length" if last else None}
                        ev = {"id": "cd-1", "object": "chat.completion.chunk",
                              "created": created, "model": args.model, "choices": [ch]}
                    else:
                        ch = {"index": 0, "text": w,
                              "finish_reason": "length" if last else None}
                        ev = {"id": "cd-1", "object": "text_completion", "created": created,
                              "model": args.model, "choices": [ch]}
                    self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(args.token_delay_ms / 1000.0)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                return
            text = "".join(words)
            usage = {"prompt_tokens": 1, "completion_tokens": ntok, "total_tokens": ntok + 1}
            if chat:
                doc = {"id": "cd-1", "object": "chat.completion", "created": created,
                       "model": args.model, "usage": usage, "choices": [
                           {"index": 0, "finish_reason": "length",
                            "message": {"role": "assistant", "content": text}}]}
            else:
                doc = {"id": "cd-1", "object": "text_completion", "created": created,
                       "model": args.model, "usage": usage, "choices": [
                           {"index": 0, "text": text, "finish_reason": "length"}]}
            self.answer(200, doc)

    return Handler


class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that goes away mid-answer (a cancel, a hedge loser) is
        # normal here; anything else is printed as usual.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(peer, port):
    """A started server on port (0: any); returns it and its thread."""
    srv = Server((peer.args.host, port), make_handler(peer))
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    return srv, th


def main():
    ap = argparse.ArgumentParser(description="close-delimited OpenAI-shaped upstream")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--http", choices=["1.0", "1.1"], default="1.1")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=4, help="tokens per answer at most")
    ap.add_argument("--token-delay-ms", type=float, default=20)
    ap.add_argument("--flap-s", type=float, default=0, help="toggle up/down every N s")
    ap.add_argument("--flap-mode", choices=["refuse", "503"], default="refuse")
    ap.add_argument("--max-s", type=float, default=0, help="exit after S s (0: never)")
    ap.add_argument("--bare", action="store_true",
                    help="HTTP/1.1 without a Connection: close header")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    peer = Peer(args)
    srv, th = serve(peer, args.port)
    port = srv.server_address[1]
    print("listening on %s:%d" % (args.host, port), flush=True)
    start = time.monotonic()
    deadline = start + args.max_s if args.max_s > 0 else None
    next_flip = start + args.flap_s if args.flap_s > 0 else None
    up = True
    try:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if next_flip is not None and now >= next_flip:
                next_flip += args.flap_s
                up = not up
                if args.flap_mode == "503":
                    peer.down = not up
                elif up:
                    # The port may be held for a moment by the old socket.
                    for _ in range(100):
                        try:
                            srv, th = serve(peer, port)
                            break
                        except OSError:
                            time.sleep(0.05)
                else:
                    srv.shutdown()
                    srv.server_close()
                print("up" if up else "down", flush=True)
            time.sleep(0.02)
    except KeyboardInterrupt:
        pass
    finally:
        if up or args.flap_mode == "503":
            srv.shutdown()
            srv.server_close()


if __name__ == "__main__":
    main()
