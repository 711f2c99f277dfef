#!/usr/bin/env bash
# BENCH_CLIENTS (default 1000) clients follow one job of BENCH_NODES nodes (default 1000: a sequence of a
# 3 s fetch, so that every client is following before the work starts, and a list of BENCH_NODES - 3 fetches
# of BENCH_DELAY_MS each, BENCH_CONCURRENCY at a time), first as Server-Sent Events streams
# (GET /v1/jobs/{id}/events), then as long-polls (GET /v1/jobs/{id}?wait=30&since=V in a loop), on a fresh
# job each. Measured: messages delivered per second (SSE events; long-poll answers), the server's CPU time
# over the run, and its threads while the clients follow. Prints a markdown section on stdout.
#
#   JOBSERVER_BIN   a server binary to use instead of a release build (e.g. .build/debug/jobserver)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

CLIENTS=${BENCH_CLIENTS:-1000}
NODES=${BENCH_NODES:-1000}
DELAY_MS=${BENCH_DELAY_MS:-20}
CONCURRENCY=${BENCH_CONCURRENCY:-50}
if [ -n "${JOBSERVER_BIN:-}" ]; then
    BIN=$JOBSERVER_BIN
else
    swift build -c release --product jobserver >&2
    BIN=$(swift build -c release --show-bin-path)/jobserver
fi

bench_setup
# Each client is a connection: the server's and the clients' descriptors.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

python3 Tests/Fixtures/upstream.py >"$tmp/upstream.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    upstream_port=$(awk '/^listening/ {print $2}' "$tmp/upstream.out")
    [ -n "$upstream_port" ] && break
    sleep 0.05
done
port=$(free_port)
"$BIN" serve --host 127.0.0.1 --port "$port" --db "$tmp/jobs.sqlite" \
    --max-per-host 4096 2>"$tmp/server.log" &
server=$!
pids+=("$server")
wait_for "http://127.0.0.1:$port/healthz"
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
threads() { awk '/^Threads:/ {print $2}' "/proc/$server/status"; }

body=$(python3 -c "
import json
children = [{'type': 'fetch', 'url': 'http://127.0.0.1:$upstream_port/delay/$DELAY_MS'} for _ in range($NODES - 3)]
print(json.dumps({'graph': {'type': 'sequence', 'children': [
    {'type': 'fetch', 'url': 'http://127.0.0.1:$upstream_port/delay/3000'},
    {'type': 'list', 'concurrency': $CONCURRENCY, 'children': children}]}}))")

idle_threads=$(threads)
rows=""
for mode in sse poll; do
    id=$(curl -fsS -H 'Content-Type: application/json' --data "$body" "http://127.0.0.1:$port/v1/jobs" | jq -r .id)
    python3 bench/events_clients.py "$mode" 127.0.0.1 "$port" "$id" "$CLIENTS" >"$tmp/$mode.out" 2>"$tmp/$mode.err" &
    clients_pid=$!
    pids+=("$clients_pid")
    for _ in $(seq 1 600); do
        grep -q '^ready' "$tmp/$mode.out" && break
        kill -0 "$clients_pid" 2>/dev/null || break
        sleep 0.05
    done
    grep -q '^ready' "$tmp/$mode.out" || { echo "$mode clients did not get ready: $(cat "$tmp/$mode.err")" >&2; exit 1; }
    before=$(cpu_ticks)
    following_threads=$(threads)
    wait "$clients_pid" || { echo "$mode clients failed: $(cat "$tmp/$mode.err")" >&2; exit 1; }
    after=$(cpu_ticks)
    result=$(tail -1 "$tmp/$mode.out")
    messages=$(jq .messages <<<"$result")
    seconds=$(jq .seconds <<<"$result")
    mib=$(jq '.bytes / 1048576 * 10 | round / 10' <<<"$result")
    cpu=$(awk -v t=$((after - before)) -v hz="$hz" 'BEGIN {printf "%.2f", t / hz}')
    rate=$(awk -v m="$messages" -v s="$seconds" 'BEGIN {printf "%.0f", m / s}')
    per=$(awk -v m="$messages" -v c="$cpu" 'BEGIN {printf "%.1f", (m > 0) ? c * 1000000 / m : 0}')
    label=$([ "$mode" = sse ] && echo "event streams" || echo "long-polls")
    echo "$mode: $result cpu ${cpu}s threads $following_threads" >&2
    rows+="| $label | $messages | $mib | $seconds | $rate | $cpu | $per | $following_threads |"$'\n'
done

cat <<MD
## Following one job: $CLIENTS event streams against $CLIENTS long-polls

Every jobserver here runs at the default log level (\`info\`, its log to a file), with the flags named below.

bench/65-events.sh: $CLIENTS clients follow one job of $NODES nodes ($((NODES - 3)) fetches of ${DELAY_MS} ms,
$CONCURRENCY at a time, after a 3 s fetch that lets every client connect), as Server-Sent Events streams, then
as long-polls (\`?wait=30&since=V\` in a loop) on a fresh job. A message is an SSE event (one per node state
change and per job state change) or a long-poll answer (the whole job, each answer covering whatever changed
since the last). CPU is the server's user + system time from the moment every client follows until the last
one is done; threads are the server's while they follow (idle: $idle_threads).

| clients follow by | messages | MiB | seconds | messages/s | server CPU s | CPU µs per message | server threads |
|---|---|---|---|---|---|---|---|
${rows}
MD
