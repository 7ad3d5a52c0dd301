"""Python shared by the benchmark scenarios' inline scripts (bench_init in
common.sh puts bench/lib on PYTHONPATH): the head every result file
(bench/results/NAME.json) starts with and the one way it is written, and a
GET read to the end of a close-delimited answer."""
import json
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
