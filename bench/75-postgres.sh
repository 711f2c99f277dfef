#!/usr/bin/env bash
# One server on SQLite against one server on PostgreSQL (API.md §10), in the same run, same flags:
#  (a) durable submissions per second (10-node jobs, each committed before its 201), with PostgreSQL's commits
#      per second over the same time (pg_stat_database.xact_commit);
#  (b) completed 10-node jobs per second (ten fetches each to the loopback fixture), 16 clients each submitting
#      a job and long-polling it until it settles.
# PostgreSQL is a throwaway cluster (scripts/pg-cluster.sh) with fsync on, on the same 2 cores as the server.
# Prints a markdown section on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

DURATION=${BENCH_DURATION:-10s}
COMPLETE_SECONDS=${COMPLETE_SECONDS:-10}

swift build -c release --product jobserver >&2
BIN=$(swift build -c release --show-bin-path)/jobserver

bench_setup
start_postgres

start_upstream

start_server() {
    local db=$1; shift
    server_port=$(free_port)
    "$BIN" serve --host 127.0.0.1 --port "$server_port" --db "$db" "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    wait_for "http://127.0.0.1:$server_port/healthz"
}

commits() { psql "$url" -qAtc "SELECT sum(xact_commit) FROM pg_stat_database"; }

python3 - "$tmp/hang.json" "$tmp/run.json" "$up_port" <<'PY'
import json, sys
port = sys.argv[3]
hang = [{"type": "fetch", "url": "http://127.0.0.1:%s/hang?step=%d" % (port, i)} for i in range(9)]
json.dump({"graph": {"type": "sequence", "children": hang}}, open(sys.argv[1], "w"))
run = [{"type": "fetch", "url": "http://127.0.0.1:%s/json?step=%d" % (port, i)} for i in range(9)]
json.dump({"graph": {"type": "list", "children": run}}, open(sys.argv[2], "w"))
PY
cat >"$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$tmp/hang.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA

# complete PORT SECONDS: completed jobs per second, 16 clients each submitting and long-polling one job at a time.
complete() {
    python3 - "$1" "$2" "$tmp/run.json" <<'PY'
import json, sys, threading, time, urllib.request
port, seconds, body = sys.argv[1], float(sys.argv[2]), open(sys.argv[3], "rb").read()
base = "http://127.0.0.1:%s" % port
done, failed, lock = [0], [0], threading.Lock()
end = time.monotonic() + seconds
def client():
    while time.monotonic() < end:
        req = urllib.request.Request(base + "/v1/jobs", data=body, headers={"Content-Type": "application/json"})
        job = json.load(urllib.request.urlopen(req, timeout=30))
        for _ in range(100):
            if job["state"] not in ("pending", "running"):
                break
            job = json.load(urllib.request.urlopen("%s/v1/jobs/%s?wait=10&since=%d" % (base, job["id"], job["version"]), timeout=30))
        with lock:
            if job["state"] == "succeeded": done[0] += 1
            else: failed[0] += 1
start = time.monotonic()
threads = [threading.Thread(target=client) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print("%.1f %d" % (done[0] / (time.monotonic() - start), failed[0]))
PY
}

declare -A submit complete_rps not_ok
for store in sqlite postgres; do
    db="$tmp/a.sqlite"
    [ "$store" = postgres ] && db="$url"
    start_server "$db" --max-active-jobs 1000000 --max-per-host 4096
    before=$(commits)
    out=$(wrk -t2 -c32 -d"$DURATION" -s "$tmp/post.lua" "http://127.0.0.1:$server_port/v1/jobs")
    after=$(commits)
    echo "$out" >&2
    submit[$store]=$(echo "$out" | rps)
    secs=$(echo "$out" | awk '/requests in/ {gsub("s,","",$4); print $4}')
    [ "$store" = postgres ] && pg_commits=$(python3 -c "print(round(($after - $before) / $secs, 1))")
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true
    # (b) on a fresh database: the hanging jobs of (a) would hold the fetch slots.
    if [ "$store" = postgres ]; then
        psql "$url" -qAtc "CREATE DATABASE complete" >/dev/null
        db="${url%/*}/complete"
    else
        db="$tmp/b.sqlite"
    fi
    start_server "$db" --max-active-jobs 1000000 --max-per-host 4096
    read -r complete_rps[$store] not_ok[$store] < <(complete "$server_port" "$COMPLETE_SECONDS")
    kill -TERM "$server_pid"; wait "$server_pid" 2>/dev/null || true
done

cat <<MD
## PostgreSQL store against SQLite (one server)

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

\`bench/75-postgres.sh\`: the release server on SQLite and on a throwaway PostgreSQL 15 cluster (fsync on) on the
same machine, one after the other with the same flags. (a) \`wrk -t2 -c32 -d$DURATION\` POSTs a 10-node job whose
fetches never answer (each job committed before its 201); (b) 16 clients each submit a job of ten loopback fetches
and long-poll it until it settles, for ${COMPLETE_SECONDS} s.

| measure | SQLite | PostgreSQL |
|---|---|---|
| (a) durable submissions / s | ${submit[sqlite]} | ${submit[postgres]} |
| (a) PostgreSQL commits / s meanwhile | – | ${pg_commits} |
| (b) completed 10-node jobs / s | ${complete_rps[sqlite]} | ${complete_rps[postgres]} |
| (b) jobs not succeeded | ${not_ok[sqlite]} | ${not_ok[postgres]} |

Both stores commit each batch of submissions in one transaction; PostgreSQL runs on the same two cores as the
server and the load generator, so its figures include its own CPU. Several servers on one PostgreSQL:
\`bench/76-scaleout.sh\`.
MD
