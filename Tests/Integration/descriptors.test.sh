#!/usr/bin/env bash
# Out of file descriptors (issue: `ulimit -n 256` and 1,000 connections): the
# server's descriptor limit is lowered while it runs (prlimit), 1,000 clients
# connect at once and each asks for the job list and a job. Every answer is a
# 2xx or a 503 with Retry-After, never a 500, and the server serves normally
# once the clients are gone.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

command -v prlimit >/dev/null || { log "SKIP: prlimit (util-linux) is not installed"; exit 0; }

start_upstream
start_server
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
job="$JOB_ID"
wait_settled "$job" 20
expect_jq .state succeeded

step "lower the server's descriptor limit to what it has open plus 40"
open_fds=$(find "/proc/$SERVER_PID/fd" -mindepth 1 -maxdepth 1 | wc -l)
limit=$((open_fds + 40))
soft=$(prlimit --pid "$SERVER_PID" --nofile --noheadings --output SOFT)
prlimit --pid "$SERVER_PID" --nofile="$limit:" || fail "prlimit refused"
log "open: $open_fds, limit: $limit"

step "1,000 clients at once, each asking for the list and the job"
statuses="$(python3 - "$SERVER_PORT" "$job" <<'PY'
import collections, selectors, socket, sys, time
port, job = int(sys.argv[1]), sys.argv[2]
sel = selectors.DefaultSelector()
answers = collections.Counter()
bad = []
conns = []
for i in range(1000):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    path = "/v1/jobs?limit=5" if i % 2 == 0 else "/v1/jobs/" + job
    request = ("GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % path).encode()
    conns.append(s)
    sel.register(s, selectors.EVENT_WRITE, [request, b""])
# Connections the server could not accept wait in its backlog: give up on them after 10 s.
deadline = time.time() + 10
while sel.get_map() and time.time() < deadline:
    for key, events in sel.select(timeout=1):
        s, data = key.fileobj, key.data
        try:
            if events & selectors.EVENT_WRITE and data[0]:
                data[0] = data[0][s.send(data[0]):]
                if not data[0]:
                    sel.modify(s, selectors.EVENT_READ, data)
                continue
            chunk = s.recv(65536)
        except OSError:
            chunk = b""
        if chunk:
            data[1] += chunk
            continue
        sel.unregister(s)
        head = data[1].split(b"\r\n\r\n", 1)[0].decode("latin-1")
        if not head:
            answers["closed unanswered"] += 1
            continue
        status = head.split(" ")[1]
        answers[status] += 1
        if status.startswith("5") and (status != "503" or "retry-after:" not in head.lower()):
            bad.append(data[1][:300])
answers["not accepted in time"] = len(sel.get_map())
for s in conns:
    s.close()
print(dict(answers))
for b in bad[:3]:
    print("BAD", b)
PY
)"
log "answers: $statuses"
case "$statuses" in *BAD*) fail "an answer other than 2xx or 503 with Retry-After: $statuses" ;; esac
case "$statuses" in *"'200'"*|*"'503'"*) ;; *) fail "no client was answered: $statuses" ;; esac

step "with the clients gone, the server serves normally"
prlimit --pid "$SERVER_PID" --nofile="$soft:" || fail "prlimit could not restore the limit"
# A listener paused for lack of descriptors leaves the connection waiting to be accepted, which the request rides
# out; a store that could not write meanwhile is degraded (503) until it logs that its writes recovered.
healthy() { api GET /healthz; [ "$STATUS" = 200 ]; }
until_logged 'store writes recovered' 10 healthy || fail "/healthz is not 200 once the clients are gone"
api GET "/v1/jobs?limit=5"
expect_status 200
submit "{\"graph\":{\"type\":\"fetch\",\"url\":\"$UPSTREAM/json\"}}"
wait_settled "$JOB_ID" 20
expect_jq .state succeeded
log ok
