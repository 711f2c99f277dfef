"""A client already running, for bench/25-fanout.sh: times one job from sending its POST to its settled answer.

    python3 job_client.py HOST PORT JOB_FILE

For each line read on stdin it POSTs JOB_FILE to /v1/jobs, long-polls the job (`?wait=60`) until it is settled,
reading every answer whole, and prints one line: the milliseconds from the first byte of the POST to the last byte
of the settled answer, and the job's state. One keep-alive connection serves every job, as it would for a program
that drives the server; the process starts before any clock does.
"""
import http.client
import re
import sys
import time

host, port, job_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = open(job_file, "rb").read()
STATE = re.compile(rb'"state":"([a-z]+)"')
connection = http.client.HTTPConnection(host, port)

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
        settled = connection.getresponse().read()
        found = STATE.search(settled[:4096])
        state = found.group(1).decode() if found else "unknown"
        if state not in ("pending", "running"):
            break
    print("%.1f %s" % ((time.perf_counter() - start) * 1000, state), flush=True)
