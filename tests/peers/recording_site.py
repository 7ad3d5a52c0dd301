#!/usr/bin/env python3
"""A stand-in for a full OpenAI-compatible server (vLLM-class) that records
every request body it was sent, byte for byte.

Built on python3's http.server, a peer infergate did not write.

    recording_site.py [--host 127.0.0.1] [--port 0] [--max-s S]
                      [--models a,b] [--no-embeddings] [--no-responses]

Prints "listening on HOST:PORT" on stdout once it accepts connections.
Its answers are deterministic (fixed ids, created 0), so that an answer
through a gateway can be compared byte for byte with the same request
sent directly.

  GET  /health               {"status":"ok"}
  GET  /v1/models            the --models
  GET  /_recorded            [{"path","body"}] of every POST so far (body
                             as the exact text received); ?clear=1 empties it
  POST /v1/chat/completions  n choices; with tools, choice i calls tools[0]
                             with {"i": i} (finish_reason "tool_calls");
                             streamed as OpenAI streams (role, content or
                             tool_call deltas per choice index, a finish
                             per choice, usage once when asked)
  POST /v1/completions       n choices per prompt, "text <k>"; streamed too
  POST /v1/embeddings        one 4-float vector per input (404 with
                             --no-embeddings)
  POST /v1/responses         a Response with output text; streamed as the
                             Responses API streams (404 with --no-responses)
"""

import argparse
import http.server
import json
import sys
import threading
import time


def chat_answer(req):
    n = int(req.get("n") or 1)
    tools = req.get("tools") or []
    choices = []
    for i in range(n):
        if tools and req.get("tool_choice") != "none":
            name = tools[0].get("function", {}).get("name", "f")
            msg = {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_%d" % i, "type": "function",
                                   "function": {"name": name,
                                                "arguments": json.dumps({"i": i})}}]}
            finish = "tool_calls"
        else:
            msg = {"role": "assistant", "content": "choice %d says hi" % i}
            finish = "stop"
        choices.append({"index": i, "message": msg, "logprobs": None,
                        "finish_reason": finish})
    return {"id": "chatcmpl-site", "object": "chat.completion", "created": 0,
            "model": req.get("model"), "choices": choices,
            "usage": {"prompt_tokens": 7, "completion_tokens": 3 * n,
                      "total_tokens": 7 + 3 * n}}


def chat_chunks(req):
    """The events of a streamed chat answer, as OpenAI sends them."""
    whole = chat_answer(req)
    base = {"id": "chatcmpl-site", "object": "chat.completion.chunk", "created": 0,
            "model": req.get("model")}
    usage_on = (req.get("stream_options") or {}).get("include_usage")
    for c in whole["choices"]:
        i = c["index"]
        yield dict(base, choices=[{"index": i, "delta": {"role": "assistant", "content": ""},
                                   "logprobs": None, "finish_reason": None}])
        calls = c["message"].get("tool_calls")
        if calls:
            call = calls[0]
            yield dict(base, choices=[{"index": i, "delta": {"tool_calls": [{
                "index": 0, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}]},
                "logprobs": None, "finish_reason": None}])
            yield dict(base, choices=[{"index": i, "delta": {"tool_calls": [{
                "index": 0, "function": {"arguments": call["function"]["arguments"]}}]},
                "logprobs": None, "finish_reason": None}])
        else:
            for word in c["message"]["content"].split(" "):
                yield dict(base, choices=[{"index": i, "delta": {"content": word + " "},
                                           "logprobs": None, "finish_reason": None}])
        yield dict(base, choices=[{"index": i, "delta": {}, "logprobs": None,
                                   "finish_reason": c["finish_reason"]}])
    if usage_on:
        yield dict(base, choices=[], usage=whole["usage"])


def completion_answer(req):
    n = int(req.get("n") or 1)
    prompts = req.get("prompt")
    np = len(prompts) if isinstance(prompts, list) and prompts and \
        not isinstance(prompts[0], int) else 1
    choices = [{"index": k, "text": "text %d" % k, "logprobs": None, "finish_reason": "length"}
               for k in range(n * np)]
    return {"id": "cmpl-site", "object": "text_completion", "created": 0,
            "model": req.get("model"), "choices": choices,
            "usage": {"prompt_tokens": 5 * np, "completion_tokens": 2 * n * np,
                      "total_tokens": 5 * np + 2 * n * np}}


def embeddings_answer(req):
    inp = req.get("input")
    if isinstance(inp, str) or (isinstance(inp, list) and inp and isinstance(inp[0], int)):
        inp = [inp]
    data = [{"object": "embedding", "index": k,
             "embedding": [0.5 + k, -0.25, 0.125 * (k + 1), 1.0]} for k in range(len(inp))]
    return {"object": "list", "data": data, "model": req.get("model"),
            "usage": {"prompt_tokens": 3 * len(inp), "total_tokens": 3 * len(inp)}}


def response_answer(req):
    return {"id": "resp_site", "object": "response", "created_at": 0, "status": "completed",
            "model": req.get("model"), "error": None, "incomplete_details": None,
            "instructions": req.get("instructions"),
            "output": [{"type": "message", "id": "msg_site", "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "the site answers",
                                     "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 6, "output_tokens": 3, "total_tokens": 9,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def response_events(req):
    whole = response_answer(req)
    start = dict(whole, status="in_progress", output=[], usage=None)
    seq = 0

    def ev(obj):
        nonlocal seq
        obj["sequence_number"] = seq
        seq += 1
        return obj["type"], obj
    yield ev({"type": "response.created", "response": start})
    yield ev({"type": "response.in_progress", "response": start})
    item = {"type": "message", "id": "msg_site", "status": "in_progress", "role": "assistant",
            "content": []}
    yield ev({"type": "response.output_item.added", "output_index": 0, "item": item})
    yield ev({"type": "response.content_part.added", "item_id": "msg_site", "output_index": 0,
              "content_index": 0, "part": {"type": "output_text", "text": "",
                                           "annotations": []}})
    for word in ["the ", "site ", "answers"]:
        yield ev({"type": "response.output_text.delta", "item_id": "msg_site",
                  "output_index": 0, "content_index": 0, "delta": word})
    yield ev({"type": "response.output_text.done", "item_id": "msg_site", "output_index": 0,
              "content_index": 0, "text": "the site answers"})
    yield ev({"type": "response.output_item.done", "output_index": 0,
              "item": whole["output"][0]})
    yield ev({"type": "response.completed", "response": whole})


def make_handler(args, recorded, lock):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "recording_site/1"

        def log_message(self, fmt, *a):
            pass

        def answer(self, status, obj):
            body = json.dumps(obj, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def stream(self, events):
            """events: (name or None, object) pairs, then [DONE] unless named."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            named = False
            for name, obj in events:
                text = ""
                if name:
                    named = True
                    text = "event: %s\n" % name
                text += "data: %s\n\n" % json.dumps(obj, separators=(",", ":"))
                self.chunk(text.encode())
            if not named:
                self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def chunk(self, b):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            self.wfile.flush()

        def not_found(self):
            self.answer(404, {"error": {"message": "no route for %s" % self.path,
                                        "type": "not_found_error", "param": None,
                                        "code": None}})

        def do_GET(self):
            if self.path == "/health":
                self.answer(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.answer(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "site"}
                    for m in args.models.split(",")]})
            elif self.path.startswith("/_recorded"):
                with lock:
                    out = list(recorded)
                    if "clear=1" in self.path:
                        recorded.clear()
                self.answer(200, out)
            else:
                self.not_found()

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(n)
            with lock:
                recorded.append({"path": self.path, "body": raw.decode("utf-8", "replace")})
            try:
                req = json.loads(raw or b"{}")
            except ValueError:
                self.answer(400, {"error": {"message": "bad json",
                                            "type": "invalid_request_error"}})
                return
            stream = bool(req.get("stream"))
            if self.path == "/v1/chat/completions":
                if stream:
                    self.stream((None, c) for c in chat_chunks(req))
                else:
                    self.answer(200, chat_answer(req))
            elif self.path == "/v1/completions":
                whole = completion_answer(req)
                if stream:
                    evs = [dict(whole, choices=[c]) for c in whole["choices"]]
                    for e in evs:
                        del e["usage"]
                    self.stream((None, e) for e in evs)
                else:
                    self.answer(200, whole)
            elif self.path == "/v1/embeddings" and not args.no_embeddings:
                self.answer(200, embeddings_answer(req))
            elif self.path == "/v1/responses" and not args.no_responses:
                if stream:
                    self.stream(response_events(req))
                else:
                    self.answer(200, response_answer(req))
            else:
                self.not_found()

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-s", type=float, default=300)
    ap.add_argument("--models", default="m")
    ap.add_argument("--no-embeddings", action="store_true")
    ap.add_argument("--no-responses", action="store_true")
    args = ap.parse_args()
    recorded, lock = [], threading.Lock()
    srv = http.server.ThreadingHTTPServer((args.host, args.port),
                                          make_handler(args, recorded, lock))
    srv.daemon_threads = True
    print("listening on %s:%d" % srv.server_address[:2], flush=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    deadline = time.time() + args.max_s
    while time.time() < deadline:
        time.sleep(0.2)
    sys.exit(0)


if __name__ == "__main__":
    main()
