"""Python shared by the benchmark scenarios' inline scripts (bench_init in
common.sh puts bench/lib on PYTHONPATH): the head every result file
(bench/results/NAME.json) starts with and the one way it is written, a GET
read to the end of a close-delimited answer, waiting for a condition, a
streamed completion timed to its first token, the workers' prefix-cache
counters, and TTFT percentiles."""
import http.client
import json
import threading
import time


def result(scenario, params, what=None, **fields):
    """A result: scenario, the UTC time, the command (bench/SCENARIO.sh),
    what (when given), params with the 1-minute load average of the run
    added last, then fields in the order given."""
    res = {
        "scenario": scenario,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "bench/%s.sh" % scenario,
    }
    if what is not None:
        res["what"] = what
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    res["params"] = dict(params, loadavg_1m=load)
    res.update(fields)
    return res


def write(path, res):
    """Writes res to path as indented JSON with a final newline."""
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")


def get_all(sock, path, host="b"):
    """Sends GET path with Connection: close on the connected socket sock
    and returns every byte of the answer, up to the server's close."""
    sock.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                  % (path, host)).encode())
    buf = b""
    while True:
        d = sock.recv(65536)
        if not d:
            return buf
        buf += d


def poll(ready, timeout_s, every_s=0.1):
    """Calls ready() every every_s seconds until it returns true (then True)
    or timeout_s have passed (then False); an exception from ready() counts
    as not ready yet."""
    end = time.time() + timeout_s
    while True:
        try:
            if ready():
                return True
        except Exception:
            pass
        if time.time() > end:
            return False
        time.sleep(every_s)


def http_get(host, port, path, timeout=10):
    """GET http://host:port/path: (status, body bytes)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def run_plan(plan, one, lead_s=0.2):
    """An open loop: one(*row, t0) for each row of plan, each in its own
    thread, t0 being lead_s from now (the row's send time counts from it);
    returns when every one has."""
    t0 = time.perf_counter() + lead_s
    ths = [threading.Thread(target=one, args=tuple(row) + (t0,)) for row in plan]
    for th in ths:
        th.start()
    for th in ths:
        th.join()


def stream_completion(port, body, headers, sched):
    """Waits until sched (a time.perf_counter() time), POSTs body, a streamed
    completion, to 127.0.0.1:port/v1/completions and reads the answer to its
    end. Returns (status, ttft_s, response): ttft_s from sched to the first
    data line with text (None without one); status -1 when the request
    failed; response None when no answer came (its headers stay readable)."""
    delay = sched - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    ttft, status, r = None, 0, None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body, headers)
        r = c.getresponse()
        status = r.status
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: ") and b'"text"' in line and ttft is None:
                ttft = time.perf_counter() - sched
        c.close()
    except Exception:
        status = -1
    return status, ttft, r


def prefix_cache_counts(metrics):
    """The workers' prefix-cache counters in a /metrics text: (queried
    tokens, hit tokens)."""
    q = h = 0.0
    for line in metrics.splitlines():
        if line.startswith("infergate_worker_prefix_cache_queries_total "):
            q += float(line.split()[-1])
        if line.startswith("infergate_worker_prefix_cache_hits_total "):
            h += float(line.split()[-1])
    return q, h


def pct(xs, p):
    """The p-th percentile of xs (the nearest rank), NaN when xs is empty."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def ratio_interval(a, b, p, draws=2000, seed=1):
    """A 95% bootstrap interval of pct(a, p) / pct(b, p): each draw resamples
    both with replacement. How far a ratio of tail percentiles over a few
    hundred requests can move by chance alone."""
    import random
    rng = random.Random(seed)
    if not a or not b:
        return float("nan"), float("nan")
    rs = []
    for _ in range(draws):
        ra = pct([rng.choice(a) for _ in a], p)
        rb = pct([rng.choice(b) for _ in b], p)
        if rb > 0:
            rs.append(ra / rb)
    rs.sort()
    return pct(rs, 2.5), pct(rs, 97.5)


def ttft_summary(results):
    """TTFT p50 and p99 in ms over the results (dicts with status and ttft_s)
    answered 200 with a first token, and how many were not."""
    ok = [x["ttft_s"] for x in results if x["status"] == 200 and x["ttft_s"] is not None]
    errors = sum(1 for x in results if x["status"] != 200 or x["ttft_s"] is None)
    return {"ttft_p50_ms": pct(ok, 50) * 1e3, "ttft_p99_ms": pct(ok, 99) * 1e3,
            "errors": errors}
