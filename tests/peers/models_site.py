#!/usr/bin/env python3
"""An OpenAI-compatible site whose model list can change while it runs.

Built on python3's http.server, a peer infergate did not write.

    models_site.py [--host 127.0.0.1] [--port 0] --models-file PATH [--max-s S]
                   [--require-key KEY] [--metrics-file PATH]

Prints "listening on HOST:PORT" on stdout once it accepts connections.
Routes:

  GET /health             {"status":"ok"}
  GET /v1/models          the ids of PATH, one a line, read at each request
  GET /metrics            with --metrics-file, that file as it is at each
                          request (Prometheus text, as vLLM publishes it)
  POST /v1/completions    a completion of the model asked for, if PATH lists
                          it (else 404 model_not_found); its text names it
  anything else           404 (so /load marks it as no infergate peer)

With --require-key, POST /v1/completions without "Authorization: Bearer KEY"
gets 401 invalid_api_key, as OpenAI's API answers; the answer with the key
says which key it saw.
"""

import argparse
import http.server
import json
import sys
import threading
import time


def make_handler(args):
    def models():
        with open(args.models_file) as f:
            return [line.strip() for line in f if line.strip()]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "models_site/1"

        def log_message(self, fmt, *a):
            pass

        def answer(self, status, obj):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self.answer(200, {"status": "ok"})
            elif self.path == "/metrics" and args.metrics_file:
                with open(args.metrics_file, "rb") as f:
                    body = f.read()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/v1/models":
                data = [{"id": m, "object": "model", "created": 0, "owned_by": "site"}
                        for m in models()]
                self.answer(200, {"object": "list", "data": data})
            else:
                self.answer(404, {"error": {"message": "not found", "type": "not_found"}})

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(n) or b"{}")
            if self.path != "/v1/completions":
                self.answer(404, {"error": {"message": "not found", "type": "not_found"}})
                return
            if args.require_key and \
                    self.headers.get("Authorization", "") != "Bearer " + args.require_key:
                self.answer(401, {"error": {"message": "Incorrect API key provided",
                                            "type": "invalid_request_error",
                                            "code": "invalid_api_key"}})
                return
            model = req.get("model", "")
            if model not in models():
                self.answer(404, {"error": {"message": "no model " + model,
                                            "type": "invalid_request_error",
                                            "code": "model_not_found"}})
                return
            self.answer(200, {
                "id": "cmpl-site", "object": "text_completion", "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": "from the site, " + model,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--models-file", required=True)
    ap.add_argument("--max-s", type=float, default=300)
    ap.add_argument("--require-key", default="")
    ap.add_argument("--metrics-file", default="")
    args = ap.parse_args()
    srv = http.server.ThreadingHTTPServer((args.host, args.port), make_handler(args))
    srv.daemon_threads = True
    print("listening on %s:%d" % srv.server_address[:2], flush=True)
    if args.max_s > 0:
        threading.Timer(args.max_s, srv.shutdown).start()
    srv.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
