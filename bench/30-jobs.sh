#!/usr/bin/env bash
# The engine and the store, each against its reference in the same run:
#  (a) durable job submissions per second (10-node jobs, each persisted before
#      its 201) against the sqlite3 CLI inserting the same rows, one transaction per job;
#  (b) resident memory per pending node with one 50,000-node job;
#  (c) time to resume 10,000 unfinished jobs on start;
#  (d) time from cancelling the 50,000-node job to every node settled.
# Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${BENCH_DURATION:-10s}
REF_JOBS=${REF_JOBS:-2000}
BIG=${BIG_NODES:-50000}
RESUME=${RESUME_JOBS:-10000}

swift build -c release --product jobserver >&2
BIN=$(swift build -c release --show-bin-path)/jobserver

bench_setup

# A server that never answers: every fetch of the big job stays pending or in flight.
start_upstream
hang_port=$up_port

# start_server DB [flags…]: sets server_pid and server_port.
start_server() {
    local db=$1; shift
    server_port=$(free_port)
    "$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$db" "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    wait_for "http://127.0.0.1:$server_port/healthz"
}

# ---- (a) submissions per second vs the sqlite3 CLI
python3 - "$tmp/job10.json" "$hang_port" <<'PY'
import json, sys
# A sequence of nine fetches (10 nodes) to the server that never answers: the
# jobs are accepted, persisted and started, and then wait in the fetch queue,
# so the figure is about submitting, not about running fetches.
children = [{"type": "fetch", "url": "http://127.0.0.1:%s/hang?step=%d" % (sys.argv[2], i)} for i in range(9)]
json.dump({"name": "bench", "graph": {"type": "sequence", "children": children}}, open(sys.argv[1], "w"))
PY
cat >"$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$tmp/job10.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA
start_server "$tmp/a.sqlite" --max-active-jobs 1000000
submit_cmd="wrk -t2 -c32 -d$DURATION -s post.lua http://127.0.0.1:PORT/v1/jobs"
out=$(wrk -t2 -c32 -d"$DURATION" -s "$tmp/post.lua" "http://127.0.0.1:$server_port/v1/jobs")
echo "$out" >&2
total=$(echo "$out" | awk '/requests in/ {print $1}')
secs=$(echo "$out" | awk '/requests in/ {gsub("s,","",$4); print $4}')
non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
accepted_rps=$(python3 -c "print(round(($total - ${non2xx:-0}) / $secs, 1))")
stored=$(sqlite3 "$tmp/a.sqlite" "SELECT count(*) FROM jobs")
kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true

# The same rows, inserted by the sqlite3 CLI one transaction per job, in a file with the same schema and settings.
python3 - "$tmp/a.sqlite" "$tmp/ref.sql" "$REF_JOBS" <<'PY'
import sqlite3, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = sqlite3.connect(src)
schema = [r[0] for r in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'")]
job = db.execute("SELECT * FROM jobs LIMIT 1").fetchone()
jcols = [d[1] for d in db.execute("PRAGMA table_info(jobs)")]
nodes = db.execute("SELECT * FROM nodes WHERE job_id = ?", (job[jcols.index("id")],)).fetchall()
ncols = [d[1] for d in db.execute("PRAGMA table_info(nodes)")]
def lit(v):
    if v is None: return "NULL"
    if isinstance(v, (int, float)): return repr(v)
    if isinstance(v, bytes): return "X'" + v.hex() + "'"
    return "'" + str(v).replace("'", "''") + "'"
with open(out, "w") as f:
    f.write("PRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\n")
    for s in schema: f.write(s + ";\n")
    for k in range(n):
        jid = "REF%023d" % k
        row = list(job); row[jcols.index("id")] = jid
        if "idempotency_key" in jcols: row[jcols.index("idempotency_key")] = None
        f.write("BEGIN;\nINSERT INTO jobs (%s) VALUES (%s);\n" % (",".join(jcols), ",".join(map(lit, row))))
        for node in nodes:
            r = list(node); r[ncols.index("job_id")] = jid
            f.write("INSERT INTO nodes (%s) VALUES (%s);\n" % (",".join(ncols), ",".join(map(lit, r))))
        f.write("COMMIT;\n")
PY
start=$(date +%s%N)
sqlite3 "$tmp/ref.sqlite" <"$tmp/ref.sql" >/dev/null
end=$(date +%s%N)
ref_rps=$(python3 -c "print(round($REF_JOBS / (($end - $start) / 1e9), 1))")
ratio_a=$(python3 -c "print(f'{$accepted_rps / $ref_rps:.2f}')")

# ---- (b) memory per pending node, (d) cancelling the big job
python3 - "$tmp/big.json" "$BIG" "$hang_port" <<'PY'
import json, sys
path, n, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
children = [{"type": "fetch", "url": "http://127.0.0.1:%s/hang" % port} for _ in range(n)]
json.dump({"graph": {"type": "list", "children": children}}, open(path, "w"))
PY
start_server "$tmp/b.sqlite" --max-nodes $((BIG + 10)) --max-request-bytes 67108864
sleep 1
rss_before=$(rss_kib "$server_pid")
big_id=$(curl -fsS -H 'Content-Type: application/json' --data-binary @"$tmp/big.json" "http://127.0.0.1:$server_port/v1/jobs" | jq -r .id)
sleep 3
rss_after=$(rss_kib "$server_pid")
pending=$(curl -fsS "http://127.0.0.1:$server_port/v1/jobs/$big_id" | jq .progress.pending)
per_node=$(python3 -c "print(round(($rss_after - $rss_before) * 1024 / $BIG))")
start=$(date +%s%N)
curl -fsS -o /dev/null -X POST "http://127.0.0.1:$server_port/v1/jobs/$big_id/cancel"
final=$(curl -fsS "http://127.0.0.1:$server_port/v1/jobs/$big_id?wait=60")
end=$(date +%s%N)
cancel_ms=$(python3 -c "print(round(($end - $start) / 1e6, 1))")
cancel_done=$(echo "$final" | jq '"\(.state), \(.progress.done) of \(.progress.total) settled"' -r)
kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true

# ---- (c) resuming 10,000 unfinished jobs
start_server "$tmp/c.sqlite" --max-active-jobs $((RESUME * 2))
python3 - "$server_port" "$hang_port" "$RESUME" <<'PY'
import http.client, json, sys
port, hang, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
body = json.dumps({"graph": {"type": "fetch", "url": "http://127.0.0.1:%s/hang" % hang}})
c = http.client.HTTPConnection("127.0.0.1", port)
for _ in range(n):
    c.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    r = c.getresponse(); r.read()
    assert r.status == 201, r.status
PY
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true
start=$(date +%s%N)
start_server "$tmp/c.sqlite" --max-active-jobs $((RESUME * 2))
end=$(date +%s%N)
resume_ms=$(python3 -c "print(round(($end - $start) / 1e6))")
active=$(curl -fsS "http://127.0.0.1:$server_port/metrics" | awk '/^jobserver_jobs_active / {print $2}')
kill -9 "$server_pid"; wait "$server_pid" 2>/dev/null || true

verdict() { python3 -c "print('met' if $1 else 'missed')"; }
cat <<MD
## Engine and store

The server runs with default flags and log level unless a part names a flag.

### (a) Durable submissions per second

10-node jobs (a sequence of nine fetches to an upstream that never answers, so they stay queued), each persisted (\`synchronous=FULL\`) before its \`201\`,
submitted by \`$submit_cmd\` for $DURATION; the reference is the sqlite3 CLI
($(sqlite3 --version | cut -d' ' -f1)) inserting the same job and node rows into a file with the same
schema (WAL, \`synchronous=FULL\`), one transaction per job, $REF_JOBS jobs.

| | jobs/s |
|---|---:|
| sqlite3 CLI, one transaction per job (ceiling) | $ref_rps |
| jobserver \`POST /v1/jobs\` (201s only; $stored jobs stored) | $accepted_rps |

Ratio: **$ratio_a** (target ≥ 0.5: $(verdict "$ratio_a >= 0.5")). Concurrent submissions share one commit and one fsync (group commit); each still waits for the commit that holds it.

### (b) Memory per pending node

One job of $BIG fetches to a server that never answers (so at most \`--max-per-host\` are in flight and
$pending were pending): resident memory $rss_before KiB before, $rss_after KiB 3 s after the \`201\`:
**$per_node bytes per node** (target ≤ 2048: $(verdict "$per_node <= 2048")).

### (c) Resuming unfinished jobs

$RESUME unfinished one-fetch jobs, \`kill -9\`, restart on the same file: **$resume_ms ms** from exec to the
first \`/healthz\` 200 (recovery runs before the server listens; $active jobs active afterwards)
(target ≤ 2000 ms: $(verdict "$resume_ms <= 2000")).

### (d) Cancelling the big job

\`POST /v1/jobs/{id}/cancel\` on the $BIG-node job, then \`GET /v1/jobs/{id}?wait=60\` until settled:
**$cancel_ms ms** ($cancel_done).
MD
