"""A client already running, for bench/25-fanout.sh: times one job from sending its POST to its settled answer.

    python3 job_client.py HOST PORT JOB_FILE

For each line read on stdin it POSTs JOB_FILE to /v1/jobs, long-polls the job (`?wait=60`) until it is settled,
reading every answer whole, and prints one line: the milliseconds from the first byte of the POST to the last byte
of the settled answer, and the job's state. One keep-alive connection serves every job, as it would for a program
that drives the server; the process starts before any clock does.

Answers are read through one buffer, reused, and only their first 4 KiB kept (for the state), as curl's side of the
bench writes every body to /dev/null: read into a new object each time, the 142 MB answer of 100,000 fetches cost
this client 60-450 ms of fresh pages on the 2-core machine, the receiving program's work and not the server's.
"""
import http.client
import re
import sys
import time

host, port, job_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = open(job_file, "rb").read()
STATE = re.compile(rb'"state":"([a-z]+)"')
connection = http.client.HTTPConnection(host, port)
buffer = memoryview(bytearray(1 << 20))


def drain(answer):
    """Reads `answer`'s body whole through `buffer`; its first 4 KiB."""
    head = b""
    while True:
        n = answer.readinto(buffer)
        if not n:
            return head
        if len(head) < 4096:
            head += bytes(buffer[:min(n, 4096 - len(head))])


for _ in sys.stdin:
    start = time.perf_counter()
    connection.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    location = answer.getheader("Location", "")
    path = location[location.index("/v1/"):] if "/v1/" in location else ""
    state = "unsubmitted (%d)" % answer.status
    # Bounded: each long-poll waits at most 60 s.
    for _ in range(10 if answer.status == 201 else 0):
        connection.request("GET", path + "?wait=60")
        found = STATE.search(drain(connection.getresponse()))
        state = found.group(1).decode() if found else "unknown"
        if state not in ("pending", "running"):
            break
    print("%.1f %s" % ((time.perf_counter() - start) * 1000, state), flush=True)
