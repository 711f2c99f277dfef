#!/usr/bin/env python3
"""Clients for bench/80-million.sh, one mode per process.

  million_load.py probe PORT SECONDS INTERVAL_MS OUT [NICE]
      One keep-alive connection sends GET /healthz every INTERVAL_MS (a fixed rate, so a stall shows in
      the samples after it instead of hiding them) and writes one latency per line, in ms, to OUT. Runs at
      the nice value NICE (default 0) where the system allows it, else at its own, and writes the value it
      ran at to OUT.nice; writes to OUT.late, one per probe, how late it sent although the answer before had
      come in time: its own wait for the CPU after its sleep, which the latency counts too.
  million_load.py loop PORT SECONDS OUT PATH...
      One keep-alive connection requests PATH after PATH, over and over, until SECONDS are up; writes
      "<requests> <bytes>" to OUT.
  million_load.py cursor PORT SECONDS OUT
      Follows next_cursor through GET /v1/jobs?limit=100 from the newest job to the oldest, over and over;
      writes "<pages> <bytes> <deepest page>" to OUT.
"""
import http.client
import json
import os
import sys
import time


def connect(port):
    return http.client.HTTPConnection("127.0.0.1", port, timeout=120)


def get(conn, path):
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"GET {path}: {response.status} {body[:200]!r}")
    return body


def probe(port, seconds, interval_ms, out, niceness):
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError:
        pass
    conn = connect(port)
    get(conn, "/healthz")
    samples = []
    lates = []
    answered = time.monotonic()
    interval = interval_ms / 1000.0
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if now < next_at:
            time.sleep(next_at - now)
        # Timed from when the request was due, not from when it went out: a stall delays the sends behind it
        # and each of those counts the wait.
        due = next_at
        sent = time.monotonic()
        lates.append((sent - max(due, answered)) * 1000.0)
        get(conn, "/healthz")
        answered = time.monotonic()
        samples.append((answered - due) * 1000.0)
        next_at = max(due + interval, time.monotonic() - interval)
    with open(out, "w") as f:
        f.write("\n".join(f"{s:.3f}" for s in samples) + "\n")
    with open(out + ".late", "w") as f:
        f.write("\n".join(f"{s:.3f}" for s in lates) + "\n")
    with open(out + ".nice", "w") as f:
        f.write(f"{os.getpriority(os.PRIO_PROCESS, 0)}\n")


def loop(port, seconds, out, paths):
    conn = connect(port)
    n = 0
    size = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in paths:
            size += len(get(conn, path))
            n += 1
    with open(out, "w") as f:
        f.write(f"{n} {size}\n")


def cursor(port, seconds, out):
    conn = connect(port)
    pages = 0
    size = 0
    deepest = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        path = "/v1/jobs?limit=100"
        depth = 0
        while path and time.monotonic() < end:
            body = get(conn, path)
            size += len(body)
            pages += 1
            depth += 1
            deepest = max(deepest, depth)
            nxt = json.loads(body).get("next_cursor")
            path = f"/v1/jobs?limit=100&cursor={nxt}" if nxt else None
    with open(out, "w") as f:
        f.write(f"{pages} {size} {deepest}\n")


def main():
    mode, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    if mode == "probe":
        probe(port, seconds, float(sys.argv[4]), sys.argv[5], int(sys.argv[6]) if len(sys.argv) > 6 else 0)
    elif mode == "loop":
        loop(port, seconds, sys.argv[4], sys.argv[5:])
    elif mode == "cursor":
        cursor(port, seconds, sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
