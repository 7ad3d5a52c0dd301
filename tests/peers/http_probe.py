#!/usr/bin/env python3
"""Sends each raw request of tests/cases/http_probes/probes.tsv, alone on a
fresh connection, to nginx and to infergate, and prints both status codes
beside the ones the table records.

    tests/peers/http_probe.py --build build            # starts both itself
    tests/peers/http_probe.py --nginx-port 8080 --infergate-port 8081

With --build it starts `BUILD/infergate serve` and `nginx` (nginx-light is
enough) on free loopback ports, nginx in the foreground with a tiny config
whose location proxies to a second nginx server, so that nginx reads and
checks the whole body before it answers, as infergate does. Exit status 1
when infergate's answer differs from the table's infergate column, or (with
--strict-nginx) nginx's from the nginx column.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "..", "cases", "http_probes", "probes.tsv")

NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
error_log {dir}/error.log crit;
pid {dir}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  client_max_body_size 4m;
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://127.0.0.1:{port2}; }} }}
  server {{ listen 127.0.0.1:{port2}; location / {{ return 200 "ok\\n"; }} }}
}}
"""


def expand(text):
    """{N*text} repeats (innermost first), then the backslash escapes."""
    rep = re.compile(r"\{(\d+)\*([^{}]*)\}")
    while True:
        new = rep.sub(lambda m: m.group(2) * int(m.group(1)), text)
        if new == text:
            break
        text = new
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "r":
                out += b"\r"
            elif n == "n":
                out += b"\n"
            elif n == "t":
                out += b"\t"
            elif n == "\\":
                out += b"\\"
            elif n == "x":
                out.append(int(text[i + 2 : i + 4], 16))
                i += 2
            else:
                raise ValueError("bad escape \\" + n)
            i += 2
            continue
        out += c.encode("latin-1")
        i += 1
    return bytes(out)


def load():
    cases = []
    with open(TABLE, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            name, ours, theirs, raw = line.split("\t", 3)
            cases.append((name, int(ours), int(theirs), expand(raw)))
    return cases


def probe(port, raw, timeout=3.0):
    """The status of the first response, or 0 when the server closed (or
    went quiet) without one."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(raw)
        except OSError:
            pass  # the server may answer and close before reading it all
        data = b""
        deadline = time.monotonic() + timeout
        while b"\r\n" not in data and time.monotonic() < deadline:
            try:
                chunk = s.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        return int(m.group(1)) if m else 0
    finally:
        s.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on %d" % port)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", help="build folder with the infergate binary; starts both servers")
    ap.add_argument("--nginx-port", type=int)
    ap.add_argument("--infergate-port", type=int)
    ap.add_argument("--strict-nginx", action="store_true",
                    help="also fail when nginx differs from the recorded nginx column")
    args = ap.parse_args()
    procs = []
    tmp = tempfile.mkdtemp(prefix="igprobe.")
    try:
        if args.build:
            nginx = shutil.which("nginx") or "/usr/sbin/nginx"
            if os.path.exists(nginx) and args.nginx_port is None:
                args.nginx_port, port2 = free_port(), free_port()
                conf = os.path.join(tmp, "nginx.conf")
                with open(conf, "w") as f:
                    f.write(NGINX_CONF.format(dir=tmp, port=args.nginx_port, port2=port2))
                procs.append(subprocess.Popen([nginx, "-c", conf, "-p", tmp],
                                              stderr=subprocess.DEVNULL))
                wait_port(args.nginx_port, procs[-1])
            if args.infergate_port is None:
                args.infergate_port = free_port()
                conf = os.path.join(tmp, "infergate.json")
                with open(conf, "w") as f:
                    f.write('{"listen": "127.0.0.1:%d", "log": {"level": "error"}}'
                            % args.infergate_port)
                procs.append(subprocess.Popen(
                    [os.path.join(args.build, "infergate"), "serve", "--config", conf],
                    stderr=subprocess.DEVNULL))
                wait_port(args.infergate_port, procs[-1])
        failed = 0
        print("%-28s %9s %9s   %s" % ("probe", "infergate", "nginx", "recorded (ig/nginx)"))
        for name, ours, theirs, raw in load():
            ig = probe(args.infergate_port, raw) if args.infergate_port else None
            ng = probe(args.nginx_port, raw) if args.nginx_port else None
            marks = []
            if ig is not None and ig != ours:
                marks.append("INFERGATE CHANGED")
                failed = 1
            if ng is not None and ng != theirs:
                marks.append("nginx changed")
                if args.strict_nginx:
                    failed = 1
            if ig is not None and ng is not None and ig != ng:
                marks.append("differs")
            print("%-28s %9s %9s   %d/%d %s" % (name, "-" if ig is None else ig,
                                               "-" if ng is None else ng, ours, theirs,
                                               " ".join(marks)))
        return failed
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
