#!/usr/bin/env python3
"""An OpenAI-shaped upstream that serves only N connections at a time.

Like a thread-per-connection server (llama.cpp's llama-server on
cpp-httplib, many Python servers): N threads, each accept()s one connection
and serves its keep-alive requests until the client closes it. A connection
beyond the N waits in the kernel's accept backlog, unread, while the others
are held open -- also while they sit idle between requests. Raw sockets, no
framework: a peer infergate did not write.

    fewconns_upstream.py [--host 127.0.0.1] [--port 0] [--threads N]
                         [--delay-ms MS] [--keepalive-s S] [--model m]
                         [--max-s S]

Prints "stats on HOST:PORT" (a separate listener with its own thread) and
then "listening on HOST:PORT". Routes on the main port:

  GET /health            {"status":"ok"}
  GET /v1/models         {"object":"list","data":[{"id":MODEL}]}
  POST /v1/completions   sleeps --delay-ms, then a whole completion
  anything else          404 (so /load marks it as no infergate peer)

GET / on the stats port answers {"open": connections being served now,
"max_open": the most at once, "accepted": connections accepted in all,
"served": completions answered, "closed": connections closed}.
--keepalive-s S closes a connection idle that long (0, the default: never,
the worst case). --max-s S exits after S seconds.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time

lock = threading.Lock()
stats = {"open": 0, "max_open": 0, "accepted": 0, "served": 0, "closed": 0}


def read_request(conn, buf):
    """One request off conn: (method, path, body, rest) or None at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split(" ")[:2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return method, path, rest[:length], rest[length:]


def answer(conn, status, doc):
    body = json.dumps(doc).encode()
    reason = {200: "OK", 404: "Not Found"}[status]
    conn.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (status, reason.encode(), len(body)) + body)


def serve_conn(conn, args):
    buf = b""
    if args.keepalive_s > 0:
        conn.settimeout(args.keepalive_s)
    while True:
        try:
            req = read_request(conn, buf)
        except (socket.timeout, OSError):
            return
        if req is None:
            return
        method, path, body, buf = req
        if method == "GET" and path == "/health":
            answer(conn, 200, {"status": "ok"})
        elif method == "GET" and path == "/v1/models":
            answer(conn, 200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
        elif method == "POST" and path == "/v1/completions":
            time.sleep(args.delay_ms / 1000.0)
            with lock:
                stats["served"] += 1
                n = stats["served"]
            answer(conn, 200, {"id": "cmpl-%d" % n, "object": "text_completion",
                               "model": args.model,
                               "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                         "total_tokens": 2}})
        else:
            answer(conn, 404, {"error": {"message": "no such route", "type": "not_found"}})


def worker(listener, args):
    while True:
        conn, _ = listener.accept()
        with lock:
            stats["accepted"] += 1
            stats["open"] += 1
            stats["max_open"] = max(stats["max_open"], stats["open"])
        try:
            serve_conn(conn, args)
        finally:
            conn.close()
            with lock:
                stats["open"] -= 1
                stats["closed"] += 1


def stats_server(listener):
    while True:
        conn, _ = listener.accept()
        try:
            req = read_request(conn, b"")
            if req is not None:
                with lock:
                    doc = dict(stats)
                answer(conn, 200, doc)
        except OSError:
            pass
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=50)
    ap.add_argument("--keepalive-s", type=float, default=0)
    ap.add_argument("--model", default="m")
    ap.add_argument("--max-s", type=float, default=300)
    args = ap.parse_args()

    st = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    st.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    st.bind((args.host, 0))
    st.listen(16)
    threading.Thread(target=stats_server, args=(st,), daemon=True).start()

    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((args.host, args.port))
    ls.listen(128)
    for _ in range(args.threads):
        threading.Thread(target=worker, args=(ls, args), daemon=True).start()
    print("stats on %s:%d" % (args.host, st.getsockname()[1]), flush=True)
    print("listening on %s:%d" % (args.host, ls.getsockname()[1]), flush=True)
    if args.max_s > 0:
        time.sleep(args.max_s)
        os._exit(0)
    threading.Event().wait()


if __name__ == "__main__":
    main()
