#!/usr/bin/env bash
# Jobs that really run, sustained: wrk POSTs 10-node jobs (a list of ten fetches of a 1 KiB JSON file from nginx on
# loopback) for DURATION (default 60s) to a server with default flags and log level, RUNS times (default 5), each
# on a fresh SQLite file. Reported per run: jobs accepted (201) per second, jobs succeeded per second within the
# window (read from /metrics the moment wrk ends), the backlog then (accepted, not yet settled), and how long it
# took to drain; median and min–max. Target: >= 1,000 jobs/s completed for 60 s, every state change durable.
# Then the same with TUNED flags (default `--max-per-host 64 --max-active-jobs 500`), to show where the limit is.
# Prints a markdown section on stdout; progress goes to stderr. DURATION, RUNS, CONNECTIONS, TUNED may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${DURATION:-60s}
RUNS=${RUNS:-5}
CONNECTIONS=${CONNECTIONS:-32}
TUNED=${TUNED:---max-per-host 64 --max-active-jobs 500}

require wrk nginx curl python3
swift build -c release --product jobserver >&2
bin=$(swift build -c release --show-bin-path)/jobserver
bench_setup

mkdir -p "$tmp/www"
python3 -c 'import sys; open(sys.argv[1], "w").write("{\"data\":\"" + "x" * 1013 + "\"}")' "$tmp/www/data.json"
chmod 644 "$tmp/www/data.json"
start_nginx "$tmp/www"
wait_for "http://127.0.0.1:$nginx_port/data.json" || { tail -5 "$tmp/logs/error.log" >&2; exit 1; }

python3 - "$tmp/job.json" "$nginx_port" <<'PY'
import json, sys
children = [{"type": "fetch", "url": f"http://127.0.0.1:{sys.argv[2]}/data.json?i={i}"} for i in range(10)]
json.dump({"graph": {"type": "list", "children": children}}, open(sys.argv[1], "w"))
PY
cat >"$tmp/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$tmp/job.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA

# jobs STATE: the server's count of jobs in STATE, from /metrics.
jobs() { curl -sS "$base/metrics" | awk -v s="$1" -F'[ ]' '$1 == "jobserver_jobs{state=\""s"\"}" {print $2}'; }
secs_of() { awk -v d="$1" 'BEGIN{ if (d ~ /m$/) print d*60; else print d+0 }'; }
window=$(secs_of "$DURATION")

# measure FLAGS…: RUNS runs of a server with FLAGS; fills accepted, completed, backlog, drain, failed.
measure() {
  local run port server out ended done_now total non2xx ok drained bad
  accepted=(); completed=(); backlog=(); drain=(); failed=()
  for run in $(seq 1 "$RUNS"); do
    port=$(free_port)
    rm -rf "$tmp/db"
    "$bin" serve --host 127.0.0.1 --port "$port" --db "$tmp/db/jobs.sqlite" "$@" 2>"$tmp/server.log" &
    server=$!
    pids+=("$server")
    base="http://127.0.0.1:$port"
    wait_for "$base/healthz"
    out=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$tmp/post.lua" "$base/v1/jobs")
    ended=$(date +%s%N)
    done_now=$(jobs succeeded)
    total=$(echo "$out" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    ok=$(( total - ${non2xx:-0} ))
    # Bounded: at most 600 polls of 0.1 s.
    for _ in $(seq 1 600); do
      [ "$(jobs pending)" = 0 ] && [ "$(jobs running)" = 0 ] && break
      sleep 0.1
    done
    drained=$(awk -v a="$ended" -v b="$(date +%s%N)" 'BEGIN{printf "%.0f", (b-a)/1e6}')
    bad=$(jobs failed)
    accepted+=("$(awk -v n="$ok" -v s="$window" 'BEGIN{printf "%.1f", n/s}')")
    completed+=("$(awk -v n="$done_now" -v s="$window" 'BEGIN{printf "%.1f", n/s}')")
    backlog+=("$(( ok - done_now ))")
    drain+=("$drained")
    failed+=("$bad")
    echo "run $run ($*): accepted ${accepted[-1]}/s, succeeded in the window ${completed[-1]}/s, backlog ${backlog[-1]}, drained in ${drained} ms, failed $bad" >&2
    kill "$server"; wait "$server" 2>/dev/null || true
  done
}

row() { echo "$(printf '%s\n' "$@" | median) ($(printf '%s\n' "$@" | range))"; }

measure
done_ms=$(printf '%s\n' "${completed[@]}" | median)
verdict=$(awk -v r="$done_ms" 'BEGIN{print (r >= 1000) ? "met" : "missed"}')
d_accepted=$(row "${accepted[@]}"); d_completed=$(row "${completed[@]}"); d_backlog=$(row "${backlog[@]}")
d_drain=$(row "${drain[@]}"); d_failed=$(row "${failed[@]}")
# shellcheck disable=SC2086
measure $TUNED
t_accepted=$(row "${accepted[@]}"); t_completed=$(row "${completed[@]}"); t_backlog=$(row "${backlog[@]}")
t_drain=$(row "${drain[@]}"); t_failed=$(row "${failed[@]}")

cat <<MD
## Jobs that run, sustained for $DURATION

\`wrk -t2 -c$CONNECTIONS -d$DURATION\` POSTs one job over and over: a \`list\` of ten fetches of a 1 KiB JSON file from
nginx $(nginx_version) on 127.0.0.1. The server runs with default flags and log level on a fresh SQLite file each run
(every submission committed with \`synchronous=FULL\` before its 201, state changes in batches, at most one commit of them alone every 10 ms, with
\`synchronous=NORMAL\`), then, to show where the limit is, with \`$TUNED\`: all fetches go to one host, whose 16
transfers at a time (the default) bound the rate (the server hands libcurl up to 32, and it starts each one held the
moment a connection is free); and when submissions outrun the fetches, the backlog grows to 10,000 active jobs
(\`--max-active-jobs\`) and wrk's further submissions are refused with \`429\`, each sent 50 ms after its request. The store's writer runs ten nice steps below the rest of the server, so when the CPU is short the submissions, which wait for its commits, slow down rather than outrun the fetches. A backlog below 0 counts jobs created by the requests wrk sent last, whose answers it stopped waiting for. $RUNS runs each; median (min–max).

| figure | default flags | \`$TUNED\` |
|---|---|---|
| jobs accepted (201) per second | $d_accepted | $t_accepted |
| jobs succeeded per second within the window | **$d_completed** ($verdict; target ≥ 1,000) | $t_completed |
| backlog when wrk ended (accepted, not settled) | $d_backlog | $t_backlog |
| ms to settle the backlog | $d_drain | $t_drain |
| jobs failed | $d_failed | $t_failed |
MD
