#!/usr/bin/env python3
"""Soak load for bench/soak.sh: mixed open-loop traffic through one gateway,
with client aborts, a slow-reading client and a fault schedule, and an
account of every request.

Every request is its own HTTP/1.1 connection over a raw socket (asyncio), so
nothing between this script and the gateway hides a broken answer. Each one
ends in exactly one of:

  completed  200 with a whole answer: a JSON body with choices, or an SSE
             stream that ends with `data: [DONE]`
  failed     an explicit error: a status >= 400 with an OpenAI-shaped error
             body, or an SSE `error` event before the stream ends
  aborted    this script closed the connection on purpose (a client abort)
  lost       the connection ended without either (reset, EOF mid-answer,
             unparsable bytes): the gateway dropped an accepted request
  hung       no end within --timeout seconds
  refused    the connection could not be opened (not accepted at all)

Faults (all on a schedule, from --seed):
  * every --kill-every s, SIGKILL of one worker process (a child of the
    gateway that runs `infergate worker`), alternating between them;
  * a slow-reading client that streams long answers and reads 64 bytes
    every 100 ms (--slow-readers of them at all times);
  * the site's own flapping and close-delimited answers are the site
    script's (tests/peers/closedelim_upstream.py), started by soak.sh.

RSS of the gateway and of each worker is sampled every second; the JSON
report holds the samples at the end of warm-up and at the end.

Exit status: 0 when the account balances (no lost, no hung, nothing refused),
1 otherwise, 2 on bad usage.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time

OUTCOMES = ("completed", "failed", "aborted", "lost", "hung", "refused")


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def children(pid):
    """Worker processes of the gateway: its children whose command line is
    `infergate worker ...`."""
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return out
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1] == b"worker":
            out.append(k)
    return sorted(out)


class Account:
    def __init__(self):
        self.counts = {k: 0 for k in OUTCOMES}
        self.by_kind = {}
        self.examples = {}
        self.statuses = {}
        self.upstreams = {}

    def add(self, kind, outcome, detail=""):
        self.counts[outcome] += 1
        k = self.by_kind.setdefault(kind, {o: 0 for o in OUTCOMES})
        k[outcome] += 1
        if outcome in ("lost", "hung", "refused") and len(
                self.examples.setdefault(outcome, [])) < 8:
            self.examples[outcome].append(f"{kind}: {detail}")

    def status(self, code, upstream):
        self.statuses[str(code)] = self.statuses.get(str(code), 0) + 1
        self.upstreams[upstream] = self.upstreams.get(upstream, 0) + 1


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0]!r}")
    status = int(parts[1])
    hdrs = {}
    for ln in lines[1:]:
        if not ln:
            continue
        name, _, value = ln.partition(":")
        hdrs[name.strip().lower()] = value.strip()
    return status, hdrs


async def body_chunks(reader, hdrs):
    """Yields the body's bytes as they arrive: chunked, Content-Length, or
    close-delimited. Raises on a framing error or EOF mid-body."""
    te = hdrs.get("transfer-encoding", "").lower()
    if te == "chunked":
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise ValueError("no CRLF after chunk data")
            yield data
    elif "content-length" in hdrs:
        n = int(hdrs["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def is_error_body(raw):
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    err = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str)


def request_bytes(host, port, kind, stream, max_tokens, prompt, model):
    if kind == "chat":
        path = "/v1/chat/completions"
        body = {"model": model, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": model, "max_tokens": max_tokens, "prompt": prompt}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            f"Connection: close\r\n\r\n")
    return head.encode() + raw


async def one_request(args, acct, rng, kind, stream, abort_after):
    label = f"{kind}{'-stream' if stream else ''}"
    words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega"))
                     for _ in range(rng.randint(4, 24)))
    max_tokens = rng.randint(4, args.max_tokens)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(args.host, args.port), 5)
    except (OSError, asyncio.TimeoutError) as e:
        acct.add(label, "refused", repr(e))
        return
    try:
        writer.write(request_bytes(args.host, args.port, kind, stream,
                                   max_tokens, words, args.model))
        limit = args.timeout if abort_after is None else abort_after
        try:
            outcome, detail = await asyncio.wait_for(
                read_answer(reader, stream, acct), limit)
        except asyncio.TimeoutError:
            if abort_after is None:
                raise
            outcome, detail = "aborted", ""
        acct.add(label, outcome, detail)
    except asyncio.TimeoutError:
        acct.add(label, "hung", f"no end after {args.timeout} s")
    except (OSError, ValueError, asyncio.IncompleteReadError,
            asyncio.LimitOverrunError) as e:
        acct.add(label, "lost", repr(e)[:200])
    finally:
        writer.close()


async def read_answer(reader, stream, acct):
    status, hdrs = await read_head(reader)
    acct.status(status, hdrs.get("x-infergate-upstream", "-"))
    buf = b""
    async for data in body_chunks(reader, hdrs):
        buf += data
        if len(buf) > 16 << 20:
            raise ValueError("answer over 16 MiB")
    if status >= 400:
        if is_error_body(buf):
            return "failed", ""
        return "lost", f"status {status} without an error body: {buf[:120]!r}"
    if status != 200:
        return "lost", f"status {status}"
    if not stream:
        try:
            doc = json.loads(buf)
        except ValueError:
            return "lost", f"unparsable body {buf[:120]!r}"
        if isinstance(doc, dict) and doc.get("choices"):
            return "completed", ""
        return "lost", f"no choices: {buf[:120]!r}"
    done = False
    for line in buf.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        try:
            ev = json.loads(data)
        except ValueError:
            return "lost", f"bad SSE event {data[:120]!r}"
        if isinstance(ev, dict) and "error" in ev:
            return "failed", ""
    if done:
        return "completed", ""
    return "lost", f"stream ended without [DONE]: {buf[-120:]!r}"


async def slow_reader(args, stop, acct):
    """Streams long answers and reads them slowly; an answer that ends with
    an error or is cut short is counted like any other request."""
    rng = random.Random(args.seed + 7)
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(args.host, args.port)
        except OSError as e:
            acct.add("slow-reader", "refused", repr(e))
            await asyncio.sleep(1)
            continue
        writer.write(request_bytes(args.host, args.port, "completions", True,
                                   args.slow_tokens, "slow " * 8, args.model))
        outcome, detail = "lost", "eof"
        try:
            t_end = time.monotonic() + args.timeout * 4
            buf = b""
            while time.monotonic() < t_end:
                data = await asyncio.wait_for(reader.read(64), args.timeout)
                if not data:
                    break
                buf += data
                await asyncio.sleep(0.1)
            else:
                outcome, detail = "hung", "slow reader never finished"
            if b"data: [DONE]" in buf:
                outcome = "completed"
            elif b'"error"' in buf:
                outcome = "failed"
            else:
                detail = f"eof: {buf[-120:]!r}"
        except asyncio.TimeoutError:
            outcome, detail = "hung", "no byte in timeout"
        except OSError as e:
            detail = repr(e)
        writer.close()
        acct.add("slow-reader", outcome, detail)
        await asyncio.sleep(rng.uniform(0, 1))


async def faults(args, stop, log):
    victim = 0
    t0 = time.monotonic()
    nxt = args.kill_every
    while not stop.is_set():
        await asyncio.sleep(0.5)
        if args.kill_every <= 0 or time.monotonic() - t0 < nxt:
            continue
        nxt += args.kill_every
        kids = children(args.gateway_pid)
        if not kids:
            log.append({"t": round(time.monotonic() - t0, 1),
                        "fault": "kill", "pid": None})
            continue
        pid = kids[victim % len(kids)]
        victim += 1
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        log.append({"t": round(time.monotonic() - t0, 1), "fault": "kill",
                    "pid": pid})
        print(f"soak: t={time.monotonic() - t0:.0f}s SIGKILL worker {pid}",
              flush=True)


async def sampler(args, stop, samples):
    t0 = time.monotonic()
    while not stop.is_set():
        kids = children(args.gateway_pid)
        samples.append({"t": round(time.monotonic() - t0, 1),
                        "gateway_kib": rss_kib(args.gateway_pid),
                        "workers_kib": [rss_kib(k) for k in kids],
                        "worker_pids": kids})
        await asyncio.sleep(1)


def sample_at(samples, t):
    best = None
    for s in samples:
        if s["t"] <= t:
            best = s
    return best or (samples[0] if samples else None)


async def main_async(args):
    acct = Account()
    stop = asyncio.Event()
    samples, fault_log = [], []
    rng = random.Random(args.seed)
    bg = [asyncio.create_task(sampler(args, stop, samples)),
          asyncio.create_task(faults(args, stop, fault_log))]
    bg += [asyncio.create_task(slow_reader(args, stop, acct))
           for _ in range(args.slow_readers)]
    inflight = set()
    t0 = time.monotonic()
    t_next = t0
    last_print = t0
    while True:
        t_next += rng.expovariate(args.rate)
        if t_next - t0 >= args.duration:
            break
        await asyncio.sleep(max(0.0, t_next - time.monotonic()))
        kind = "chat" if rng.random() < 0.5 else "completions"
        stream = rng.random() < 0.5
        abort_after = (10 ** rng.uniform(-3, -1) if rng.random() < args.abort_frac
                       else None)
        t = asyncio.create_task(one_request(args, acct, random.Random(
            rng.random()), kind, stream, abort_after))
        inflight.add(t)
        t.add_done_callback(inflight.discard)
        now = time.monotonic()
        if now - last_print >= 30:
            last_print = now
            s = samples[-1] if samples else {}
            print(f"soak: t={now - t0:.0f}s {json.dumps(acct.counts)} "
                  f"in flight {len(inflight)} gateway RSS "
                  f"{(s.get('gateway_kib') or 0) // 1024} MiB", flush=True)
    if inflight:
        await asyncio.wait(inflight, timeout=args.timeout + 5)
    stop.set()
    for t in bg:
        try:
            await asyncio.wait_for(t, args.timeout + 5)
        except asyncio.TimeoutError:
            t.cancel()
    for t in list(inflight):
        t.cancel()
        acct.add("unfinished", "hung", "task still running at the end")

    warm = sample_at(samples, args.warmup)
    end = samples[-1] if samples else None

    def total(s):
        return None if s is None else sum(k or 0 for k in s["workers_kib"])

    accepted = sum(acct.counts[k] for k in ("completed", "failed", "lost",
                                             "hung"))
    report = {
        "params": vars(args),
        "accepted": accepted,
        "counts": acct.counts,
        "by_kind": acct.by_kind,
        "statuses": acct.statuses,
        "upstreams": acct.upstreams,
        "examples": acct.examples,
        "faults": fault_log,
        "rss_kib": {
            "gateway_warm": warm and warm["gateway_kib"],
            "gateway_end": end and end["gateway_kib"],
            "workers_warm": total(warm), "workers_end": total(end),
            "worker_count_warm": warm and len(warm["workers_kib"]),
            "worker_count_end": end and len(end["workers_kib"]),
        },
        "rss_samples": samples[::10],
    }
    r = report["rss_kib"]
    growth = None
    if r["gateway_warm"] and r["gateway_end"]:
        growth = r["gateway_end"] / r["gateway_warm"] - 1
    report["gateway_rss_growth"] = growth
    c = acct.counts
    print(f"soak: accepted {accepted} = completed {c['completed']} + "
          f"failed-with-an-explicit-error {c['failed']} + lost {c['lost']} + "
          f"hung {c['hung']}; client aborts {c['aborted']}; refused "
          f"{c['refused']}")
    print(f"soak: by kind {json.dumps(acct.by_kind)}")
    print(f"soak: statuses {json.dumps(acct.statuses)}; answered by "
          f"{json.dumps(acct.upstreams)}")
    for o, ex in acct.examples.items():
        for e in ex:
            print(f"soak: {o}: {e}")
    print(f"soak: RSS gateway {r['gateway_warm']} KiB after warm-up "
          f"-> {r['gateway_end']} KiB at end"
          + (f" ({growth * 100:+.1f}%)" if growth is not None else ""))
    print(f"soak: RSS workers {r['workers_warm']} KiB "
          f"({r['worker_count_warm']} processes) after warm-up -> "
          f"{r['workers_end']} KiB ({r['worker_count_end']}) at end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = c["lost"] == 0 and c["hung"] == 0 and c["refused"] == 0
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gateway-pid", type=int, required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--warmup", type=float, default=60)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--abort-frac", type=float, default=0.1)
    ap.add_argument("--slow-readers", type=int, default=1)
    ap.add_argument("--slow-tokens", type=int, default=256)
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not (0 < args.duration <= 3600 and 0 < args.rate <= 1000):
        print("soak: --duration in (0, 3600] and --rate in (0, 1000]",
              file=sys.stderr)
        return 2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
